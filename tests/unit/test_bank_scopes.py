"""Scopes and metadata filters on every bank backend (the directory bank, Milvus Lite, a Milvus server): the top-k
of the matching cases equals exact search over the cases the reference verdict (Where.matches / Scope.matches)
keeps, for one suite of scopes and filters."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest

from memento.bank import CaseBank, create_bank, open_bank
from memento.bank.where import as_scope, parse_filter
from memento.config import EncoderConfig
from memento.errors import BankError, DataFormatError
from memento.types import Case
from tests.conftest import unit_vectors
from tests.unit.test_bank_conformance import bank_uri, lite_file, server_url  # noqa: F401 - fixtures

DIM = 16
USERS = ("alice", "bob", None)


def scoped_cases(n: int) -> list[Case]:
    return [Case(state=f"state {i}", action=f"action {i}", reward=(0.0, 1.0, 0.5)[i % 3],
                 env=("e1", "e2")[i % 2], user=USERS[i % 3], agent="planner" if i % 4 == 0 else None,
                 session=f"s{i % 5}" if i % 2 else None,
                 meta={"topic": ("geo", "sci", "art")[i % 3], "level": i % 4, "done": i % 2 == 0,
                       "tags": ["x"]} if i % 7 else {})
            for i in range(n)]


SUITE = [
    ({"user": "alice"}, None),
    ({"user": "bob", "session": "s1"}, None),
    ({"agent": "planner"}, {"topic": "geo"}),
    (None, {"topic": {"in": ["geo", "art"]}}),
    (None, {"level": 2}),
    (None, {"level": 2.0, "done": True}),
    (None, {"done": False}),
    (None, {"OR": [{"topic": "sci"}, {"level": {"in": [0, 3]}}]}),
    ({"user": "alice"}, {"AND": [{"done": True}, {"OR": [{"topic": "geo"}, {"level": 1}]}]}),
    ({"user": "nobody"}, None),
    (None, {"topic": "nothing"}),
    (None, {"tags": "x"}),  # a list is not a scalar: never equal to one
    (None, {"level": {"gte": 1, "lt": 3}}),
    (None, {"topic": {"contains": "e"}, "NOT": {"level": {"in": [0, 1]}}}),
    (None, {"user_id": {"ne": "alice"}, "session": {"nin": ["s1", "s3"]}}),
    ({"user_id": "bob"}, {"OR": [{"agent": "planner"}, {"NOT": {"done": True}}]}),
    (None, {"meta.user": "alice"}),  # no case has that meta key
    ({"user": "alice", "include_global": True}, None),
    ({"agent_id": "planner", "include_global": True}, {"topic": {"ne": "geo"}}),
]


@pytest.fixture
def scoped(bank_uri, rng):  # noqa: F811 - the fixture imported above
    bank = create_bank(bank_uri, DIM, encoder=EncoderConfig())
    cases = scoped_cases(40)
    emb = unit_vectors(rng, len(cases), DIM)
    ids = bank.add(cases, emb)
    yield bank, cases, ids, emb
    bank.close()


def _exact(emb, keep, q, k) -> list[int]:
    positions = np.flatnonzero(keep)
    order = np.argsort(-(emb[positions] @ q), kind="stable")
    return positions[order][:k].tolist()


@pytest.mark.parametrize("scope,raw", SUITE)
def test_top_k_of_the_matching_cases(scoped, scope, raw) -> None:
    bank, cases, ids, emb = scoped
    if scope is not None and "include_global" in scope:  # an argument beside the scope: here, a Scope
        scope = as_scope({k: v for k, v in scope.items() if k != "include_global"}, include_global=True)
    parsed_scope, where = as_scope(scope), parse_filter(raw)
    keep = np.array([(parsed_scope is None or parsed_scope.matches(c)) and (where is None or where.matches(c))
                     for c in cases])
    assert keep.any() or raw in ({"topic": "nothing"}, {"tags": "x"}, {"meta.user": "alice"}) or scope == {
        "user": "nobody"}
    q = emb[7]
    cands = bank.candidates(q, 6, scope=scope, filter=raw)
    assert cands.positions_C.tolist() == _exact(emb, keep, q, 6)
    assert np.array_equal(cands.embeddings_CD, emb[cands.positions_C])
    scores, found = bank.search(q, 6, scope=scope, filter=raw, env="e1")
    keep_e1 = keep & np.array([c.env == "e1" for c in cases])
    assert list(found) == [ids[p] for p in _exact(emb, keep_e1, q, 6)]
    scores_BK, positions_BK = bank.search_positions(emb[:3], 4, scope=scope, filter=raw)
    for b in range(3):
        expected = _exact(emb, keep, emb[b], 4)
        assert positions_BK[b][positions_BK[b] >= 0].tolist() == expected


def test_scope_survives_reads_reopen_and_export(scoped, bank_uri, tmp_path) -> None:  # noqa: F811
    bank, cases, ids, emb = scoped
    got = bank.get(ids[1])
    assert (got.user, got.agent, got.session) == (cases[1].user, cases[1].agent, cases[1].session)
    out = tmp_path / "cases.jsonl"
    assert bank.export_jsonl(out) == len(cases)
    bank.close()
    again = open_bank(bank_uri)
    try:
        assert [c.scope for c in again.iter_cases()] == [c.scope for c in cases]
        found = again.candidates(emb[3], 40, scope={"user": "bob"})
        assert {again.get(i).user for i in found.ids} == {"bob"}
    finally:
        again.close()


def test_the_same_experience_of_two_users_is_two_cases(bank_uri, rng) -> None:  # noqa: F811
    bank = create_bank(bank_uri, DIM, encoder=EncoderConfig())
    try:
        same = [Case(state="s", action="a", reward=1.0, user=u) for u in ("alice", "bob", "alice")]
        ids = bank.add(same, unit_vectors(rng, 3, DIM))
        assert ids[0] != ids[1] and ids[0] == ids[2]  # alice's second copy is a duplicate of her first
    finally:
        bank.close()


def test_filter_changes_follow_writes(scoped, rng) -> None:
    bank, cases, ids, emb = scoped
    q = emb[0]
    before = bank.candidates(q, 40, scope={"user": "alice"}).ids
    new = bank.add([Case(state="new", action="a", reward=1.0, user="alice", meta={"topic": "geo"})],
                   unit_vectors(rng, 1, DIM))
    assert set(bank.candidates(q, 40, scope={"user": "alice"}).ids) == set(before) | set(new)
    bank.delete(new)
    assert set(bank.candidates(q, 40, scope={"user": "alice"}).ids) == set(before)


def test_bad_filter_is_one_line_before_any_search(scoped) -> None:
    bank, cases, ids, emb = scoped
    with pytest.raises(DataFormatError, match="filter key"):
        bank.candidates(emb[0], 4, filter={"bad key": 1})
    with pytest.raises(DataFormatError, match="unknown scope field"):
        bank.search(emb[0], 4, scope={"team": "x"})
    with pytest.raises(DataFormatError, match="scope.user is null"):
        bank.search(emb[0], 4, scope={"user": None})  # not "every user"


def test_a_time_range_on_created(bank_uri, rng) -> None:  # noqa: F811
    bank = create_bank(bank_uri, DIM, encoder=EncoderConfig())
    try:
        times = [1714521600.0 + 86400 * day for day in range(5)]  # 2024-05-01 .. 2024-05-05, midnight UTC
        ids = bank.add([Case(state=f"s{i}", action="a", reward=1.0, created=t) for i, t in enumerate(times)],
                       unit_vectors(rng, 5, DIM))
        q = unit_vectors(rng, 1, DIM)[0]
        found = bank.search(q, 10, filter={"created": {"gte": "2024-05-02", "lt": "2024-05-04T00:00:00+00:00"}})[1]
        assert sorted(found) == sorted(ids[1:3])
        assert sorted(bank.search(q, 10, filter={"created": {"gt": times[3]}})[1]) == [ids[4]]
        assert sorted(bank.search(q, 10, filter={"NOT": {"created": {"in": times[:4]}}})[1]) == [ids[4]]
    finally:
        bank.close()


def test_a_time_range_on_updated(bank_uri, rng) -> None:  # noqa: F811
    """``updated`` is ``created`` until a case is updated in place, then the update's time, on every back end
    (a directory bank gains its updated column with its first update)."""
    bank = create_bank(bank_uri, DIM, encoder=EncoderConfig())
    try:
        times = [1714521600.0 + 86400 * day for day in range(3)]  # 2024-05-01 .. 2024-05-03
        ids = bank.add([Case(state=f"s{i}", action="a", reward=1.0, created=t) for i, t in enumerate(times)],
                       unit_vectors(rng, 3, DIM))
        q = unit_vectors(rng, 1, DIM)[0]
        assert sorted(bank.search(q, 10, filter={"updated": {"gte": "2024-05-02"}})[1]) == sorted(ids[1:])
        bank.update(ids[0], action="b")  # now
        assert sorted(bank.search(q, 10, filter={"updated": {"gte": "2025-01-01"}})[1]) == [ids[0]]
        assert sorted(bank.search(q, 10, filter={"updated": {"lt": "2025-01-01"}})[1]) == sorted(ids[1:])
        assert sorted(bank.search(q, 10, filter={"created": {"lt": "2024-05-02"}})[1]) == [ids[0]]
    finally:
        bank.close()


def test_a_directory_bank_made_before_scopes_gains_them_on_the_first_scoped_case(tmp_path, rng) -> None:
    bank = CaseBank.create(tmp_path / "old", DIM)
    bank.add([Case(state="plain", action="a", reward=1.0)], unit_vectors(rng, 1, DIM))
    bank.close()
    with sqlite3.connect(tmp_path / "old" / "cases.sqlite") as conn:
        assert "scope_user" not in {row[1] for row in conn.execute("PRAGMA table_info(cases)")}
    follower = CaseBank.open(tmp_path / "old", read_only=True)
    assert follower.search(unit_vectors(rng, 1, DIM)[0], 5, scope={"user": "alice"})[1].size == 0
    bank = CaseBank.open(tmp_path / "old")
    bank.add([Case(state="scoped", action="a", reward=1.0, user="alice")], unit_vectors(rng, 1, DIM))
    assert [c.user for c in bank.iter_cases()] == [None, "alice"]
    follower.refresh()
    assert len(follower.search(unit_vectors(rng, 1, DIM)[0], 5, scope={"user": "alice"})[1]) == 1
    follower.close()
    bank.close()


def test_a_milvus_collection_made_before_scopes_says_so(tmp_path, rng, monkeypatch) -> None:
    from memento.bank import milvus

    bank = create_bank(f"milvus:{tmp_path / 'm.db'}#c", DIM)
    bank.add([Case(state="plain", action="a", reward=1.0)], unit_vectors(rng, 1, DIM))
    monkeypatch.setattr(bank._rows, "scoped", False)  # as a collection created before the scope fields
    q = unit_vectors(rng, 1, DIM)[0]
    assert bank.search(q, 5, scope={"user": "alice"})[1].size == 0
    with pytest.raises(BankError, match="export it"):
        bank.search(q, 5, filter={"topic": "geo"})
    with pytest.raises(BankError, match="before cases had scopes"):
        bank.add([Case(state="s", action="a", reward=1.0, user="alice")], unit_vectors(rng, 1, DIM))
    assert len(bank) == 1
    bank.close()
    assert milvus  # imported for the monkeypatch target's module


def test_scoped_case_jsonl_round_trip(tmp_path: Path) -> None:
    from memento.formats import read_cases_jsonl

    path = tmp_path / "c.jsonl"
    path.write_text('{"state": "s", "action": "a", "reward": 1, "user": "alice", "session": "x"}\n')
    (case,) = read_cases_jsonl(path)
    assert (case.user, case.agent, case.session) == ("alice", None, "x")
    path.write_text('{"state": "s", "action": "a", "reward": 1, "user": 3}\n')
    with pytest.raises(DataFormatError, match="user"):
        read_cases_jsonl(path)
