"""Scopes and metadata filters through the selector (select, select_many, search_cases, list_cases, add/replace)
over a small real selector (hashing encoder)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from memento.errors import DataFormatError
from memento.selector.export import load_selector
from tests.loop_env import HashingEncoder, make_env, small_selector

pytestmark = pytest.mark.usefixtures("one_torch_thread")
QUESTION = make_env().tasks[0].question


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return small_selector(tmp_path_factory.mktemp("scopes"))


@pytest.fixture
def selector(artifact: Path, tmp_path: Path):
    path = Path(shutil.copytree(artifact, tmp_path / "selector"))
    with load_selector(path, learn=True, encoder=HashingEncoder()) as sel:
        for i, user in enumerate(["alice", "alice", "bob"]):
            sel.add_case(f"{QUESTION} variant {i}", f"answer {i}", 1.0, meta={"topic": ("geo", "sci")[i % 2]},
                         scope={"user": user, "session": f"s{i}"})
        yield sel


def test_select_within_a_scope_and_filter(selector) -> None:
    alice = selector.select(QUESTION, k=4, mode="greedy", scope={"user": "alice"})
    assert len(alice) == 2 and {c.user for c in alice.cases} == {"alice"}
    geo = selector.select(QUESTION, k=4, mode="greedy", scope={"user": "alice"}, filter={"topic": "geo"})
    assert [c.meta["topic"] for c in geo.cases] == ["geo"]
    both = selector.select(QUESTION, k=4, scope={"user": "alice"},
                           filter={"OR": [{"topic": "sci"}, {"topic": {"in": ["geo"]}}]}, track=False)
    assert set(both.ids) == set(alice.ids)
    nobody = selector.select(QUESTION, k=4, scope={"user": "carol"})
    assert len(nobody) == 0 and nobody.ids == ()  # an empty result, not an error
    row = alice.to_dict()["cases"][0]
    assert row["user"] == "alice" and row["meta"]["topic"] in ("geo", "sci") and row["score"] is not None
    assert selector.feedback(alice.selection_id, 1.0)["recorded"]


def test_select_many_applies_the_scope_to_every_query(selector) -> None:
    results = selector.select_many([QUESTION, "another task"], k=3, mode="greedy", scope={"user": "bob"})
    assert all({c.user for c in r.cases} == {"bob"} for r in results)
    singles = [selector.select(q, k=3, mode="greedy", scope={"user": "bob"}, track=False).ids
               for q in [QUESTION, "another task"]]
    assert [r.ids for r in results] == singles


def test_search_and_list(selector) -> None:
    found = selector.search_cases(QUESTION, k=10, scope={"session": "s2"})
    assert [c.user for c, _ in found] == ["bob"] and -1.0 <= found[0][1] <= 1.0
    listed = selector.list_cases(scope={"user": "alice"})
    assert [c.state for c in listed] == [f"{QUESTION} variant 0", f"{QUESTION} variant 1"]
    assert selector.list_cases(scope={"user": "alice"}, limit=1, offset=1) == listed[1:]
    assert [c.meta for c in selector.list_cases(filter={"topic": "sci"})] == [{"topic": "sci"}]
    unscoped = selector.list_cases(limit=10_000)
    assert len(unscoped) == len(selector.list_cases(limit=10_000, filter=None))
    with pytest.raises(DataFormatError, match="limit"):
        selector.list_cases(limit=0)
    with pytest.raises(DataFormatError, match="filter key"):
        selector.search_cases(QUESTION, filter={"no spaces": 1})


def test_replace_keeps_the_scope_it_is_given(selector) -> None:
    old = selector.list_cases(scope={"user": "bob"})[0]
    new_id = selector.replace_case(old.id, old.state, "better", 1.0, scope={"user": "bob", "session": "s9"})
    assert selector.get_case(new_id).session == "s9"
    assert [c.id for c in selector.list_cases(scope={"user": "bob"})] == [new_id]


def test_scopes_and_filters_over_http(selector) -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from memento.serve.app import create_app

    auth = {"Authorization": "Bearer scopes-token-0123456789"}
    with TestClient(create_app(selector, token="scopes-token-0123456789")) as client:
        added = client.post("/v1/cases", headers=auth, json={"state": f"{QUESTION} carol", "action": "x",
                                                             "reward": 1, "user": "carol", "meta": {"topic": "geo"}})
        assert added.status_code == 200, added.text
        assert client.get(f"/v1/cases/{added.json()['id']}", headers=auth).json()["user"] == "carol"
        chosen = client.post("/v1/select", headers=auth, json={"query": QUESTION, "k": 4, "mode": "greedy",
                                                               "scope": {"user": "alice"}, "filter": {"topic": "geo"}})
        assert chosen.status_code == 200, chosen.text
        rows = chosen.json()["cases"]
        assert [(r["user"], r["meta"]["topic"]) for r in rows] == [("alice", "geo")]
        assert rows[0]["score"] is not None and -1 <= rows[0]["similarity"] <= 1
        empty = client.post("/v1/select", headers=auth, json={"query": QUESTION, "scope": {"user": "nobody"}})
        assert empty.status_code == 200 and empty.json()["cases"] == []
        bad = client.post("/v1/select", headers=auth, json={"query": QUESTION, "filter": {"a b": 1}})
        assert bad.status_code == 422 and "filter key" in bad.text
        bad_scope = client.post("/v1/select", headers=auth, json={"query": QUESTION, "scope": {"team": "x"}})
        assert bad_scope.status_code == 422 and "unknown scope field" in bad_scope.text
        found = client.post("/v1/search", headers=auth, json={"query": QUESTION, "k": 10, "scope": {"user": "carol"}})
        assert found.status_code == 200 and [c["user"] for c in found.json()["cases"]] == ["carol"]
        listed = client.get("/v1/cases", headers=auth, params={"user": "alice", "filter": '{"topic": "sci"}'})
        assert listed.status_code == 200, listed.text
        assert [(c["user"], c["meta"]["topic"]) for c in listed.json()["cases"]] == [("alice", "sci")]
        mem0 = client.get("/v1/cases", headers=auth, params={"user_id": "alice"})  # was: every tenant's cases
        assert mem0.status_code == 200 and {c["user"] for c in mem0.json()["cases"]} == {"alice"}
        assert client.get("/v1/cases", headers=auth, params={"owner": "alice"}).status_code == 422
        assert client.get("/v1/cases", headers=auth, params={"filter": "{not json"}).status_code == 422
        assert client.get("/v1/cases", headers=auth, params={"limit": 0}).status_code == 422
        assert client.get("/v1/cases", params={"user": "alice"}).status_code == 401


def test_scores_are_the_q_values_that_made_the_choice(selector) -> None:
    import numpy as np

    result = selector.select(QUESTION, k=3, mode="sample", track=False)
    state_D = selector._state(QUESTION)
    found = selector._bank.candidates(state_D, 64)
    chosen = found.take(found.rows_of(list(result.ids)))
    again = selector._agent.q_values(state_D, chosen)  # a second, separate forward pass over the chosen cases
    assert np.allclose(result.scores, again, atol=1e-5)
    assert np.allclose(result.similarities, chosen.embeddings_CD @ state_D, atol=1e-5)


def test_include_global_adds_the_cases_without_an_owner(selector) -> None:
    shared = selector.add_case(f"{QUESTION} shared", "shared answer", 1.0)  # no user, agent nor session
    unowned = {c.id for c in selector.list_cases(limit=10_000) if c.scope == (None, None, None)}
    alice = {c.id for c in selector.list_cases(scope={"user": "alice"})}
    assert shared in unowned and len(alice) == 2
    both = selector.list_cases(scope={"user": "alice"}, include_global=True, limit=10_000)
    assert {c.id for c in both} == alice | unowned and all(c.user in ("alice", None) for c in both)
    wide = selector.config.candidates + 10
    found = selector.search_cases(QUESTION, k=wide, scope={"user_id": "alice"}, include_global=True)
    assert {c.id for c, _ in found} == alice | unowned
    chosen = selector.select(QUESTION, k=4, mode="greedy", scope={"user": "alice"}, include_global=True, track=False)
    assert set(chosen.ids) <= alice | unowned and set(chosen.ids) & unowned  # the shared pool competes
    many = selector.select_many([QUESTION], k=4, mode="greedy", scope={"user": "alice"}, include_global=True,
                                track=False)
    assert many[0].ids == chosen.ids
    bob_only = selector.select(QUESTION, k=4, mode="greedy", scope={"user": "bob"}, track=False)
    assert {c.user for c in bob_only.cases} == {"bob"}  # without it, still only the scope's own


def test_scope_fields_and_times_in_filters(selector) -> None:
    alice = [c.id for c in selector.list_cases(scope={"user": "alice"})]
    # filter={"user": ...} was read as a meta key "user" and silently matched nothing
    assert [c.id for c in selector.list_cases(filter={"user": "alice"})] == alice
    assert [c.id for c in selector.list_cases(filter={"user_id": "alice", "topic": {"ne": "sci"}})] == alice[:1]
    assert selector.list_cases(filter={"meta.user": "alice"}) == []  # the meta key, which no case has
    found = selector.search_cases(QUESTION, k=10, filter={"NOT": {"user": {"in": ["alice", "bob"]}}})
    assert all(c.user is None for c, _ in found) and found
    created = sorted(c.created for c in selector.list_cases(limit=10_000))
    newest = selector.list_cases(filter={"created": {"gte": created[-1]}}, limit=10_000)
    assert newest and all(c.created == created[-1] for c in newest)
    assert selector.list_cases(filter={"created": {"lt": "1970-01-02"}}) == []


def test_a_null_scope_field_and_unknown_arguments_are_refused(selector) -> None:
    calls = (lambda scope: selector.select(QUESTION, scope=scope), lambda scope: selector.list_cases(scope=scope),
             lambda scope: selector.search_cases(QUESTION, scope=scope),
             lambda scope: selector.select_many([QUESTION], scope=scope))
    for scope in ({"user": None}, {"user_id": None}, {"user": "alice", "session": None}):
        for call in calls:
            with pytest.raises(DataFormatError, match="is null"):  # it meant every user's cases
                call(scope)
    with pytest.raises(DataFormatError, match="differ"):
        selector.list_cases(scope={"user": "alice", "user_id": "bob"})
    with pytest.raises(DataFormatError, match="unknown scope field"):
        selector.list_cases(scope={"owner": "alice"})
    with pytest.raises(TypeError):
        selector.list_cases(user_id="alice")  # type: ignore[call-arg]
    with pytest.raises(DataFormatError, match="include_global"):
        selector.list_cases(scope={"user": "alice"}, include_global="yes")  # type: ignore[arg-type]
    assert selector.list_cases(scope={"user_id": "alice"}) == selector.list_cases(scope={"user": "alice"})
    new_id = selector.add_case("run case", "a", 1.0, scope={"run_id": "r1", "agent_id": "p"})
    assert selector.get_case(new_id).scope == (None, "p", "r1")
