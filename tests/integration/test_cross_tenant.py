"""Two tenants, alice and bob, share one memory and store overlapping content (the same question and answer):
every verb -- add, get, list, search, select + feedback, update, add with new meta, replace, delete, delete_all,
count, history -- through every surface (the Python bank on a directory bank, Milvus Lite and a Milvus server when
one can be started; the Python Selector; HTTP; MCP), and nothing of one tenant is read, changed or forgotten by the
other (issue 40).

The selector surfaces run one scenario (:func:`_scenario`) through one small adapter each; they stand on a
directory bank (a selector artifact holds one). A real selector with the hashing encoder: no model is loaded.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from memento.bank import create_bank, open_bank
from memento.errors import DataFormatError, UnknownCaseError
from memento.selector.export import load_selector, verify
from memento.types import Case
from tests.loop_env import HashingEncoder, small_selector

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

QUESTION = "what is the capital of peru"
TOKEN = "cross-tenant-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


# ---------------------------------------------------------------- the bank, on every back end


@pytest.fixture(scope="module")
def milvus_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Milvus server (``milvus-lite server`` in a child process); the tests that need it skip when it cannot
    be started or reached."""
    from tests.unit.test_bank_conformance import _free_port, start_milvus_server

    try:
        pytest.importorskip("milvus_lite")
        port = _free_port()
        child = start_milvus_server(tmp_path_factory.mktemp("milvus-server"), port)
    except (RuntimeError, OSError) as error:
        pytest.skip(f"no Milvus server could be started: {error}")
    yield f"http://127.0.0.1:{port}"
    child.terminate()
    child.wait(timeout=20)


@pytest.fixture(params=["dir", "milvus", "server"])
def bank_uri(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "dir":
        return str(tmp_path / "bank")
    pytest.importorskip("pymilvus")
    if request.param == "server":
        return f"milvus:{request.getfixturevalue('milvus_server')}#t{uuid.uuid4().hex[:12]}"
    return f"milvus:{tmp_path / 'm.db'}#t{uuid.uuid4().hex[:12]}"


def test_the_bank_keeps_two_tenants_apart(bank_uri: str) -> None:
    encoder = HashingEncoder()

    def vec(text: str) -> np.ndarray:
        return np.asarray(encoder.encode([text]), dtype=np.float32)

    with create_bank(bank_uri, encoder.dim) as bank:
        shared = {user: bank.add([Case(state=QUESTION, action="Lima", reward=1.0, user=user, meta={"topic": "geo"})],
                                 vec(QUESTION))[0] for user in ("alice", "bob")}
        own = {user: bank.add([Case(state=f"{user}'s question", action=f"{user}'s answer", reward=1.0, user=user)],
                              vec(f"{user}'s question"))[0] for user in ("alice", "bob")}
        assert shared["alice"] != shared["bob"]
        mine = {user: {shared[user], own[user]} for user in ("alice", "bob")}
        for user in ("alice", "bob"):  # get, list, search, count
            assert bank.get(shared[user]).user == user
            assert set(bank.ids_where(scope={"user": user})) == mine[user] and bank.count(scope={"user": user}) == 2
            assert set(bank.search(vec(QUESTION)[0], 10, scope={"user": user})[1]) == mine[user]
            assert set(bank.candidates(vec(QUESTION)[0], 10, scope={"user": user}).ids) == mine[user]
        bank.update(shared["alice"], action="Lima, Peru", meta={"topic": "capitals"})  # update: alice's only
        assert (bank.get(shared["bob"]).action, bank.get(shared["bob"]).meta, bank.get(shared["bob"]).version) == (
            "Lima", {"topic": "geo"}, 1)
        assert bank.add([Case(state=QUESTION, action="Lima", reward=1.0, user="bob", meta={"topic": "sa"})],
                        vec(QUESTION)) == [shared["bob"]]  # add with new meta: bob's case, in place
        assert bank.get(shared["alice"]).meta == {"topic": "capitals"} and bank.get(shared["bob"]).meta == {
            "topic": "sa"}
        assert [e.event for e in bank.history(shared["alice"])] == ["add", "update"]  # each its own events
        assert [e.event for e in bank.history(shared["bob"])] == ["add", "update"]
        assert bank.history(shared["bob"])[1].new == {"meta": {"topic": "sa"}}
        new = bank.replace(own["alice"], Case(state="alice's new question", action="new", reward=1.0, user="alice"),
                           vec("alice's new question")[0])
        mine["alice"] = {shared["alice"], new}
        assert bank.get(own["bob"]).action == "bob's answer"  # replace: alice's only
        assert bank.delete(shared["bob"]) == 1  # delete: bob's, never alice's case of the same text
        with pytest.raises(UnknownCaseError):
            bank.get(shared["bob"])
        assert bank.get(shared["alice"]).action == "Lima, Peru"
        assert set(bank.search(vec(QUESTION)[0], 10, scope={"user": "alice"})[1]) == mine["alice"]
        with pytest.raises(DataFormatError, match="needs a scope"):
            bank.delete_all()
        assert bank.delete_all(scope={"user": "bob"}) == 1  # delete_all: bob's own case, none of alice's
        assert bank.count(scope={"user": "bob"}) == 0 and bank.count(scope={"user": "alice"}) == 2
        assert all(e.new is None and e.old is None for e in bank.history(shared["bob"]))  # bob's values erased
        assert bank.history(shared["alice"])[1].new == {"action": "Lima, Peru", "meta": {"topic": "capitals"}}
    with open_bank(bank_uri) as again:  # as stored
        assert set(again.ids_where(scope={"user": "alice"})) == mine["alice"]
        assert again.count(scope={"user": "bob"}) == 0


# ---------------------------------------------------------------- the selector's surfaces


class _Python:
    """The scenario's verbs on a loaded Selector."""

    name = "python"

    def __init__(self, selector: Any) -> None:
        self.s = selector

    def add(self, user: str, state: str, action: str, meta: dict[str, Any]) -> str:
        return self.s.add_case(state, action, 1.0, meta=meta, scope={"user": user})

    def get(self, case_id: str) -> dict[str, Any] | None:
        try:
            case = self.s.get_case(case_id)
        except UnknownCaseError:
            return None
        return {**case.to_json(), "version": case.version}

    def list(self, user: str) -> set[str]:
        return {case.id for case in self.s.list_cases(scope={"user": user})}

    def search(self, user: str, query: str) -> set[str]:
        return {case.id for case, _ in self.s.search_cases(query, k=10, scope={"user": user})}

    def select(self, user: str, query: str) -> tuple[str, set[str]]:
        result = self.s.select(query, k=4, mode="greedy", scope={"user": user})
        return result.selection_id, set(result.ids)

    def feedback(self, selection_id: str, reward: float) -> None:
        self.s.feedback(selection_id, reward)

    def update(self, case_id: str, **changes: Any) -> dict[str, Any]:
        case = self.s.update_case(case_id, **changes)
        return {**case.to_json(), "version": case.version}

    def replace(self, case_id: str, state: str, action: str) -> str | None:
        return self.s.replace_case(case_id, state, action, 1.0)

    def delete(self, case_id: str) -> dict[str, Any]:
        return self.s.delete_case(case_id)

    def delete_all(self, user: str | None) -> dict[str, Any]:
        return self.s.delete_all(scope=None if user is None else {"user": user})

    def count(self, user: str) -> int:
        return self.s.count(scope={"user": user})

    def history(self, case_id: str) -> list[dict[str, Any]]:
        return [event.to_json() for event in self.s.history(case_id)]


class _Http:
    """The scenario's verbs over HTTP (FastAPI's TestClient on the app ``memento serve`` runs)."""

    name = "http"

    def __init__(self, client: Any) -> None:
        self.c = client

    def _ok(self, response: Any) -> Any:
        assert response.status_code == 200, response.text
        return response.json()

    def add(self, user: str, state: str, action: str, meta: dict[str, Any]) -> str:
        return self._ok(self.c.post("/v1/cases", json={"state": state, "action": action, "reward": 1.0, "meta": meta,
                                                       "user": user}, headers=AUTH))["id"]

    def get(self, case_id: str) -> dict[str, Any] | None:
        response = self.c.get(f"/v1/cases/{case_id}", headers=AUTH)
        if response.status_code == 404:
            return None
        return self._ok(response)

    def list(self, user: str) -> set[str]:
        return {c["id"] for c in self._ok(self.c.get("/v1/cases", params={"user": user}, headers=AUTH))["cases"]}

    def search(self, user: str, query: str) -> set[str]:
        body = {"query": query, "k": 10, "scope": {"user": user}}
        return {c["id"] for c in self._ok(self.c.post("/v1/search", json=body, headers=AUTH))["cases"]}

    def select(self, user: str, query: str) -> tuple[str, set[str]]:
        body = self._ok(self.c.post("/v1/select", json={"query": query, "k": 4, "mode": "greedy",
                                                        "scope": {"user": user}}, headers=AUTH))
        return body["selection_id"], {c["id"] for c in body["cases"]}

    def feedback(self, selection_id: str, reward: float) -> None:
        self._ok(self.c.post("/v1/feedback", json={"selection_id": selection_id, "reward": reward}, headers=AUTH))

    def update(self, case_id: str, **changes: Any) -> dict[str, Any]:
        response = self.c.patch(f"/v1/cases/{case_id}", json=changes, headers=AUTH)
        if response.status_code == 422:
            raise DataFormatError(str(response.json()["detail"]))
        return self._ok(response)

    def replace(self, case_id: str, state: str, action: str) -> str | None:
        body = self._ok(self.c.put(f"/v1/cases/{case_id}", json={"state": state, "action": action, "reward": 1.0},
                                   headers=AUTH))
        assert body["replaced"] == case_id
        return body["id"]

    def delete(self, case_id: str) -> dict[str, Any]:
        return self._ok(self.c.delete(f"/v1/cases/{case_id}", headers=AUTH))

    def delete_all(self, user: str | None) -> dict[str, Any]:
        response = self.c.delete("/v1/cases", params={} if user is None else {"user": user}, headers=AUTH)
        if response.status_code == 422:
            raise DataFormatError(str(response.json()["detail"]))
        return self._ok(response)

    def count(self, user: str) -> int:
        return self._ok(self.c.get("/v1/cases/count", params={"user": user}, headers=AUTH))["count"]

    def history(self, case_id: str) -> list[dict[str, Any]]:
        return self._ok(self.c.get(f"/v1/cases/{case_id}/history", headers=AUTH))["events"]


class _Mcp:
    """The scenario's verbs as MCP tool calls (the official SDK's in-process client; MCP has no replace tool)."""

    name = "mcp"

    def __init__(self, portal: Any, client: Any) -> None:
        self.portal, self.client = portal, client

    def call(self, tool: str, arguments: dict[str, Any], *, error: bool = False) -> Any:
        result = self.portal.call(self.client.call_tool, tool, arguments)
        if result.is_error:
            text = result.content[0].text
            if error:
                return text
            if "needs a scope" in text or "replace" in text:
                raise DataFormatError(text)
            raise AssertionError(f"{tool}: {text}")
        return result.structured_content

    def add(self, user: str, state: str, action: str, meta: dict[str, Any]) -> str:
        body = {"state": state, "action": action, "reward": 1.0, "meta": meta, "user": user}
        return self.call("add_case", body)["id"]

    def get(self, case_id: str) -> dict[str, Any] | None:
        result = self.portal.call(self.client.call_tool, "get_case", {"case_id": case_id})
        if result.is_error:
            assert "was deleted" in result.content[0].text or "unknown" in result.content[0].text
            return None
        return result.structured_content

    def list(self, user: str) -> set[str]:
        return {c["id"] for c in self.call("list_cases", {"scope": {"user": user}})["cases"]}

    def search(self, user: str, query: str) -> set[str]:
        return {c["id"] for c in self.call("search_cases", {"query": query, "k": 10, "scope": {"user": user}})["cases"]}

    def select(self, user: str, query: str) -> tuple[str, set[str]]:
        body = self.call("select_cases", {"task": query, "k": 4, "scope": {"user": user}})
        return body["selection_id"], {c["id"] for c in body["cases"]}

    def feedback(self, selection_id: str, reward: float) -> None:
        self.call("record_outcome", {"selection_id": selection_id, "reward": reward})

    def update(self, case_id: str, **changes: Any) -> dict[str, Any]:
        return self.call("update_case", {"case_id": case_id, **changes})

    def replace(self, case_id: str, state: str, action: str) -> str | None:
        return None  # no such tool

    def delete(self, case_id: str) -> dict[str, Any]:
        return self.call("delete_case", {"case_id": case_id})

    def delete_all(self, user: str | None) -> dict[str, Any]:
        return self.call("delete_all_cases", {} if user is None else {"scope": {"user": user}})

    def count(self, user: str) -> int:
        return self.call("count_cases", {"scope": {"user": user}})["count"]

    def history(self, case_id: str) -> list[dict[str, Any]]:
        return self.call("case_history", {"case_id": case_id})["events"]


def _scenario(s: Any) -> None:
    """alice and bob store the same question and answer, and one case each of their own; every verb of one leaves
    the other's cases as they were."""
    shared = {user: s.add(user, QUESTION, "Lima", {"topic": "geo"}) for user in ("alice", "bob")}
    own = {user: s.add(user, f"{user}'s private question", f"{user}'s answer", {"topic": "private"})
           for user in ("alice", "bob")}
    assert shared["alice"] != shared["bob"]
    mine = {user: {shared[user], own[user]} for user in ("alice", "bob")}
    for user in ("alice", "bob"):  # get, list, search, count, select + feedback: one's own cases only
        assert s.get(shared[user])["user"] == user
        assert s.list(user) == mine[user] and s.count(user) == 2
        assert s.search(user, QUESTION) == mine[user]
        selection_id, chosen = s.select(user, QUESTION)
        assert chosen == mine[user]
        s.feedback(selection_id, 1.0 if user == "alice" else 0.0)
    for user, reward in (("alice", 1.0), ("bob", 0.0)):  # history: each case its own feedback
        events = s.history(shared[user])
        assert [e["event"] for e in events] == ["add", "feedback"] and events[1]["reward"] == reward
    updated = s.update(shared["alice"], action="Lima, Peru", reward=0.5)  # update: alice's case only
    assert (updated["id"], updated["version"], updated["action"]) == (shared["alice"], 2, "Lima, Peru")
    assert (s.get(shared["bob"])["action"], s.get(shared["bob"])["version"]) == ("Lima", 1)
    with pytest.raises(DataFormatError, match="replace"):
        s.update(shared["alice"], state="another question")
    assert s.add("bob", QUESTION, "Lima", {"topic": "south america"}) == shared["bob"]  # add, new meta: in place
    assert s.get(shared["bob"])["meta"] == {"topic": "south america"} and s.get(shared["alice"])["meta"] == {
        "topic": "geo"}
    assert [e["event"] for e in s.history(shared["alice"])] == ["add", "feedback", "update"]
    assert s.history(shared["alice"])[2]["new"] == {"action": "Lima, Peru", "reward": 0.5}
    new = s.replace(own["alice"], "alice's new private question", "a new answer")  # replace: alice keeps it
    if new is not None:
        assert s.get(new)["user"] == "alice" and s.get(new)["meta"] == {"topic": "private"}
        assert s.get(own["alice"]) is None and s.list("alice") == {shared["alice"], new}
        assert s.get(own["bob"])["action"] == "bob's answer"
        mine["alice"] = {shared["alice"], new}
    report = s.delete(shared["bob"])  # delete: bob's case and bob's replay slot, never alice's
    assert report["deleted"] is True and report["replay_slots_masked"] == 1
    assert s.get(shared["bob"]) is None and s.get(shared["alice"])["action"] == "Lima, Peru"
    assert s.search("alice", QUESTION) == mine["alice"] and s.select("alice", QUESTION)[1] == mine["alice"]
    assert s.search("bob", QUESTION) == {own["bob"]}
    with pytest.raises(DataFormatError, match="needs a scope"):
        s.delete_all(None)
    assert s.delete_all("bob")["deleted"] == 1  # delete_all: bob's remaining case, none of alice's
    assert s.count("bob") == 0 and s.list("bob") == set() and s.count("alice") == 2 and s.list("alice") == mine["alice"]
    gone = s.history(shared["bob"])
    assert [e["event"] for e in gone] == ["add", "feedback", "update", "delete"]
    assert all(not {"old", "new", "reward", "selection_id"} & set(e) for e in gone)  # bob's values erased
    assert s.history(shared["alice"])[1]["reward"] == 1.0  # alice's kept


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return small_selector(tmp_path_factory.mktemp("tenants"))


@pytest.fixture
def path(artifact: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(artifact, tmp_path / "selector"))


def test_python_selector_keeps_two_tenants_apart(path: Path) -> None:
    with load_selector(path, learn=True, encoder=HashingEncoder()) as selector:
        _scenario(_Python(selector))
    verify(path)


def test_http_keeps_two_tenants_apart(path: Path) -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from memento.serve.app import create_app

    with load_selector(path, learn=True, encoder=HashingEncoder()) as selector:
        with TestClient(create_app(selector, token=TOKEN)) as client:
            assert client.get("/v1/cases/count", params={"user": "alice"}).status_code == 401
            _scenario(_Http(client))
    verify(path)


def test_mcp_keeps_two_tenants_apart(path: Path) -> None:
    pytest.importorskip("mcp")
    import anyio.from_thread
    from mcp import Client

    from memento.serve.app import Writer
    from memento.serve.mcp import build_mcp_server

    with load_selector(path, learn=True, encoder=HashingEncoder()) as selector:
        writer = Writer(selector).start()
        try:
            with anyio.from_thread.start_blocking_portal() as portal, \
                    portal.wrap_async_context_manager(Client(build_mcp_server(selector, writer))) as client:
                _scenario(_Mcp(portal, client))
        finally:
            writer.stop()
    verify(path)
