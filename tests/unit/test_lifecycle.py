"""A case's lifecycle through the selector (issue 40): replace keeps the owner, deleted cases are never read
again, add with new meta updates in place, update_case / history / count / delete_all, over a small real
selector (hashing encoder). The same verbs over HTTP and MCP, and across two tenants, are in
tests/integration/test_cross_tenant.py; over both bank back ends in tests/unit/test_bank_conformance.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from memento.errors import DataFormatError, UnknownCaseError
from memento.selector.export import load_selector, verify
from tests.loop_env import HashingEncoder, make_env, small_selector

pytestmark = pytest.mark.usefixtures("one_torch_thread")
QUESTION = make_env().tasks[0].question


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return small_selector(tmp_path_factory.mktemp("lifecycle"))


@pytest.fixture
def path(artifact: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(artifact, tmp_path / "selector"))


@pytest.fixture
def selector(path: Path):
    with load_selector(path, learn=True, encoder=HashingEncoder()) as sel:
        yield sel


def test_replace_keeps_the_owner_and_meta_unless_given(selector) -> None:
    old = selector.add_case(QUESTION, "an answer", 1.0, meta={"topic": "geo"},
                            scope={"user": "alice", "session": "s1"})
    new = selector.replace_case(old, QUESTION + " (again)", "a better answer", 1.0)
    case = selector.get_case(new)
    assert (case.user, case.session, case.meta) == ("alice", "s1", {"topic": "geo"})  # not made global
    assert selector.list_cases(scope={"user": "alice"})[-1].id == new
    assert selector.select(QUESTION, k=4, mode="greedy", scope={"user": "alice"}, track=False).ids == (new,)
    other = selector.replace_case(new, QUESTION + " (third)", "x", 0.0, meta={"topic": "sci"}, scope={"user": "bob"})
    assert (selector.get_case(other).user, selector.get_case(other).session) == ("bob", None)
    assert selector.get_case(other).meta == {"topic": "sci"}
    last = selector.replace_case(other, QUESTION + " (fourth)", "y", 0.0, meta={}, scope={})
    assert selector.get_case(last).scope == (None, None, None) and selector.get_case(last).meta == {}


def test_deleted_and_replaced_cases_are_never_read_again(selector) -> None:
    gone = selector.add_case("a stale fact", "stale", 1.0)
    old = selector.add_case("an old fact", "old", 1.0)
    selector.delete_case(gone)
    new = selector.replace_case(old, "a new fact", "new", 1.0)
    for case_id in (gone, old):
        with pytest.raises(UnknownCaseError, match="was deleted"):
            selector.get_case(case_id)
        assert case_id not in {case.id for case in selector.list_cases(limit=10_000)}
        assert case_id not in {case.id for case, _ in selector.search_cases("a stale fact", k=50)}
    assert selector.get_case(new).action == "new"


def test_adding_stored_content_with_new_meta_updates_it(selector) -> None:
    first = selector.add_case(QUESTION, "meta answer", 1.0, meta={"topic": "geo"}, scope={"user": "alice"})
    again = selector.add_case(QUESTION, "meta answer", 1.0, meta={"topic": "sci", "source": "wiki"},
                              scope={"user": "alice"})
    assert again == first
    case = selector.get_case(first)
    assert case.meta == {"topic": "sci", "source": "wiki"} and case.version == 2
    assert [event.event for event in selector.history(first)] == ["add", "update"]


def test_update_case_in_place_and_its_history(selector, path: Path) -> None:
    case_id = selector.add_case(QUESTION, "first answer", 0.0, meta={"n": 1}, scope={"user": "alice"})
    result = selector.select(QUESTION, k=1, mode="greedy", scope={"user": "alice"})
    selector.feedback(result.selection_id, 1.0)
    case = selector.update_case(case_id, action="second answer", reward=1.0)
    assert (case.id, case.version, case.action, case.reward, case.meta) == (case_id, 2, "second answer", 1.0, {"n": 1})
    assert selector.get_case(case_id).version == 2 and selector.get_case(case_id).user == "alice"
    assert selector.select(QUESTION, k=1, mode="greedy", scope={"user": "alice"}, track=False).cases[0].action == \
        "second answer"
    with pytest.raises(DataFormatError, match="replace"):
        selector.update_case(case_id, state="another question")
    events = [event.to_json() for event in selector.history(case_id)]
    assert [event["event"] for event in events] == ["add", "feedback", "update"]
    assert events[1]["reward"] == 1.0 and events[1]["selection_id"] == result.selection_id
    assert events[2]["old"] == {"action": "first answer", "reward": 0.0}
    selector.delete_case(case_id)
    erased = [event.to_json() for event in selector.history(case_id)]
    assert [event["event"] for event in erased] == ["add", "feedback", "update", "delete"]
    assert all(not {"old", "new", "reward", "selection_id"} & set(event) for event in erased)
    assert erased[2]["fields"] == ["action", "reward"]
    with pytest.raises(UnknownCaseError):
        selector.update_case(case_id, reward=0.5)
    with pytest.raises(UnknownCaseError):
        selector.history("never-stored")


def test_count_and_delete_all_by_scope(selector) -> None:
    for i, user in enumerate(["alice", "alice", "bob"]):
        selector.add_case(f"{QUESTION} {i}", f"answer {i}", 1.0, meta={"topic": ("geo", "sci")[i % 2]},
                          scope={"user": user})
    total = selector.count()
    assert selector.count(scope={"user": "alice"}) == 2 and selector.count(scope={"user": "alice"},
                                                                           filter={"topic": "sci"}) == 1
    with pytest.raises(DataFormatError, match="needs a scope"):
        selector.delete_all()
    result = selector.select(QUESTION, k=2, mode="greedy", scope={"user": "alice"})
    selector.feedback(result.selection_id, 1.0)
    report = selector.delete_all(scope={"user": "alice"})
    assert report == {"deleted": 2, "replay_slots_masked": 2}
    assert selector.count(scope={"user": "alice"}) == 0 and selector.count(scope={"user": "bob"}) == 1
    assert selector.count() == total - 2
    assert selector.delete_all(scope={"user": "carol"}) == {"deleted": 0, "replay_slots_masked": 0}


def test_an_update_not_yet_saved_leaves_a_loadable_artifact(path: Path) -> None:
    with load_selector(path, encoder=HashingEncoder()) as selector:
        case_id = selector.list_cases(limit=1)[0].id
        selector.update_case(case_id, action="changed in place")  # committed; the process dies before a save
    verify(path)  # the saved rows changed, but only as the history records: accepted
    with load_selector(path, encoder=HashingEncoder()) as again:
        assert again.get_case(case_id).action == "changed in place" and again.get_case(case_id).version == 2
        again.add_case("one more", "row", 1.0)
        again.save()
    verify(path)


def test_an_audited_selector_keeps_a_deleted_cases_values(path: Path) -> None:
    with load_selector(path, encoder=HashingEncoder(), audit=True) as selector:
        case_id = selector.add_case("an audited fact", "v1", 1.0)
        selector.update_case(case_id, action="v2")
        selector.delete_case(case_id)
        events = selector.history(case_id)
        assert [event.event for event in events] == ["add", "update", "delete"]
        assert events[0].new["action"] == "v1" and events[1].new == {"action": "v2"}


def test_http_replace_keeps_the_owner_and_deleted_cases_are_404(selector) -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from memento.serve.app import create_app

    auth = {"Authorization": "Bearer t0k"}
    with TestClient(create_app(selector, token="t0k")) as client:
        added = client.post("/v1/cases", json={"state": QUESTION, "action": "a", "reward": 1.0, "user": "alice",
                                               "meta": {"topic": "geo"}}, headers=auth).json()["id"]
        put = client.put(f"/v1/cases/{added}", json={"state": QUESTION + "?", "action": "b", "reward": 1.0},
                         headers=auth)
        assert put.status_code == 200
        new = client.get(f"/v1/cases/{put.json()['id']}", headers=auth).json()
        assert (new["user"], new["meta"], new["version"]) == ("alice", {"topic": "geo"}, 1)
        assert new["created"] == new["updated"]
        gone = client.get(f"/v1/cases/{added}", headers=auth)
        assert gone.status_code == 404 and "was deleted" in gone.json()["detail"]
        history = client.get(f"/v1/cases/{added}/history", headers=auth).json()["events"]
        assert [e["event"] for e in history] == ["add", "replace"] and history[1]["replaced_by"] == put.json()["id"]
        assert client.get("/v1/cases/nope/history", headers=auth).status_code == 404
        patched = client.patch(f"/v1/cases/{new['id']}", json={"meta": {"topic": "sci"}}, headers=auth)
        assert patched.status_code == 200 and patched.json()["version"] == 2 and patched.json()["meta"] == {
            "topic": "sci"}
        for body in ({}, {"reward": True}, {"reward": 2.0}, {"nope": 1}, {"state": "another question"}):
            response = client.patch(f"/v1/cases/{new['id']}", json=body, headers=auth)
            assert response.status_code == 422, body
        assert client.patch(f"/v1/cases/{added}", json={"reward": 0.0}, headers=auth).status_code == 404
        assert client.delete("/v1/cases", headers=auth).status_code == 422  # no scope, no filter
        assert client.get("/v1/cases/count", params={"filter": "{not json"}, headers=auth).status_code == 422
        assert client.get("/v1/cases/count", params={"user": "alice"}, headers=auth).json() == {"count": 1}
        assert client.delete("/v1/cases", params={"user": "alice", "filter": '{"topic": "sci"}'},
                             headers=auth).json()["deleted"] == 1
        assert client.get("/v1/cases/count", params={"user": "alice"}, headers=auth).json() == {"count": 0}


def test_content_an_update_moved_away_from_can_be_added_again(selector) -> None:
    """An id derived from a case's first content stays with that case when an update changes it: adding that first
    content again is a new case with an id of its own (it used to be refused: 'id ... is already used')."""
    first = selector.add_case(QUESTION, "Room 4", 1.0, scope={"user": "alice"})
    selector.update_case(first, action="Room 5")
    again = selector.add_case(QUESTION, "Room 4", 1.0, scope={"user": "alice"})
    assert again != first and selector.get_case(again).action == "Room 4"
    assert selector.get_case(first).action == "Room 5"
    gone = selector.add_case(QUESTION, "Room 9", 1.0, scope={"user": "bob"})
    selector.delete_case(gone)
    back = selector.add_case(QUESTION, "Room 9", 1.0, scope={"user": "bob"})
    assert back != gone and selector.get_case(back).action == "Room 9"
    with pytest.raises(DataFormatError, match="would then hold the content of case"):
        selector.update_case(again, action="Room 5")  # two live cases of one content: refused, nothing changes
    assert selector.get_case(again).action == "Room 4"
