"""Scopes and filters (memento.bank.where): the parser, and the one verdict its three compilations give (Python,
SQLite and Milvus: one suite of cases and filters through all three, the Milvus one on a Milvus Lite collection;
tests/unit/test_bank_scopes.py runs searches on every bank back end)."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memento.bank.where import (
    MAX_FILTER_TERMS,
    TIME_COLUMNS,
    Scope,
    Where,
    as_scope,
    milvus_attrs,
    parse_filter,
)
from memento.errors import DataFormatError
from memento.types import SCOPE_FIELDS, Case
from tests.fuzzing import FUZZ, examples, record


def test_forms_parse_to_one_tree() -> None:
    assert parse_filter(None) is None and parse_filter({}) is None
    eq = parse_filter({"topic": "geo"})
    assert eq == Where("in", key="meta.topic", values=("geo",))
    assert parse_filter({"topic": {"eq": "geo"}}) == eq == parse_filter({"meta.topic": "geo"})
    both = parse_filter({"topic": "geo", "level": 2})
    assert both is not None and both.op == "and" and len(both.parts) == 2
    any_of = parse_filter({"OR": [{"topic": {"in": ["geo", "sci"]}}, {"done": True}]})
    assert any_of is not None and any_of.op == "or"
    assert parse_filter(any_of.to_json()) == any_of  # JSON round trip
    assert parse_filter({"OR": [{}, {"a": 1}]}) is None  # an empty filter in an OR holds for every case
    assert parse_filter({"AND": [{}, {"a": 1}]}) == Where("in", key="meta.a", values=(1,))
    ranged = parse_filter({"level": {"gte": 2, "lt": 5}})
    assert ranged == Where("and", parts=(Where("gte", key="meta.level", values=(2,)),
                                         Where("lt", key="meta.level", values=(5,))))
    # NOT is pushed to the leaves (negation normal form): NOT (a AND b) is (NOT a) OR (NOT b)
    negated = parse_filter({"NOT": {"topic": "geo", "level": {"gt": 1}}})
    assert negated == Where("or", parts=(Where("in", key="meta.topic", values=("geo",), negated=True),
                                         Where("gt", key="meta.level", values=(1,), negated=True)))
    assert parse_filter({"NOT": {"NOT": {"topic": "geo"}}}) == eq
    assert parse_filter({"topic": {"ne": "geo"}}) == parse_filter({"NOT": {"topic": "geo"}})
    assert parse_filter({"topic": {"nin": ["a", "b"]}}) == parse_filter({"NOT": {"topic": {"in": ["a", "b"]}}})


def test_scope_and_time_fields_and_the_meta_prefix() -> None:
    assert parse_filter({"user": "alice"}) == Where("in", key="user", values=("alice",))
    for alias, name in (("user_id", "user"), ("agent_id", "agent"), ("run_id", "session")):
        assert parse_filter({alias: "x"}) == parse_filter({name: "x"})
    assert parse_filter({"meta.user": "alice"}) == Where("in", key="meta.user", values=("alice",))
    assert parse_filter({"meta.user": "alice"}).to_json() == {"meta.user": "alice"}  # kept apart from the scope
    assert parse_filter({"meta.AND": 1}).to_json() == {"meta.AND": 1}
    iso = parse_filter({"created": {"gte": "2024-05-01T00:00:00Z"}})
    assert iso == Where("gte", key="created", values=(1714521600.0,))
    assert parse_filter({"created": {"gte": "2024-05-01T02:00:00+02:00"}}) == iso
    assert parse_filter({"created": {"gte": "2024-05-01"}}) == iso  # no zone: UTC
    assert parse_filter({"created": {"gte": 1714521600}}) == iso
    for tree in (iso, parse_filter({"user_id": {"nin": ["a", "b"]}, "meta.user": {"contains": "x"}})):
        assert parse_filter(tree.to_json()) == tree


def test_updated_is_a_time_field_the_banks_store() -> None:
    assert TIME_COLUMNS["updated"] == "updated"
    assert parse_filter({"updated": {"gt": "2024-05-01"}}) == Where("gt", key="updated", values=(1714521600.0,))
    condition, _ = parse_filter({"updated": {"gt": 0}}).sql()
    assert "COALESCE(updated, created)" in condition  # never updated: its created time
    assert "COALESCE" not in parse_filter({"updated": {"gt": 0}}).sql(versioned=False)[0]  # no column yet
    assert "created" in parse_filter({"updated": {"gt": 0}}).milvus(versioned=False)


@pytest.mark.parametrize("bad,needle", [
    ([1], "must be an object"),
    ({"1x": "a"}, "a filter key"),
    ({"a b": "a"}, "a filter key"),
    ({"meta.1x": "a"}, "a filter key"),
    ({"user.name": "a"}, "a filter key"),
    ({"a": None}, "got null"),
    ({"a": [1, 2]}, "a string, a number or a boolean"),
    ({"a": {"like": 1}}, "unknown operator"),
    ({"a": {}}, "operator object"),
    ({"a": {"in": []}}, "non-empty list"),
    ({"a": {"in": "xy"}}, "non-empty list"),
    ({"a": {"nin": [None]}}, "got null"),
    ({"a": {"contains": 1}}, "takes a string"),
    ({"a": {"contains": ["x"]}}, "takes a string"),
    ({"a": {"gt": True}}, "a number or a string"),
    ({"a": float("nan")}, "finite"),
    ({"a": 2 ** 60}, "2**53"),
    ({"a": 10 ** 400}, "2**53"),
    ({"user": None}, "an id"),
    ({"user_id": 3}, "an id"),
    ({"user": {"gt": "a"}}, "a scope field takes"),
    ({"session": {"contains": "a"}}, "a scope field takes"),
    ({"created": "yesterday"}, "ISO-8601"),
    ({"created": True}, "ISO-8601"),
    ({"created": {"contains": "2024"}}, "a time field takes"),
    ({"AND": {}}, "non-empty list"),
    ({"OR": []}, "non-empty list"),
    ({"NOT": []}, "one non-empty filter"),
    ({"NOT": {}}, "one non-empty filter"),
    ({"a": "x" * 300}, "256 characters"),
    ({"a": {"in": list(range(300))}}, "at most 256"),
    ({"OR": [{f"k{i}": i for i in range(40)}, {f"k{i}": i for i in range(40)}]}, f"at most {MAX_FILTER_TERMS}"),
])
def test_bad_filters_are_one_line(bad, needle) -> None:
    with pytest.raises(DataFormatError, match=re.escape(needle)) as info:
        parse_filter(bad)
    assert "\n" not in str(info.value) and len(str(info.value)) < 400


def test_deep_nesting_is_refused() -> None:
    deep: dict = {"a": 1}
    for _ in range(20):
        deep = {"NOT": {"AND": [deep]}}
    with pytest.raises(DataFormatError, match="nest"):
        parse_filter(deep)


def test_scope() -> None:
    assert as_scope(None) is None and as_scope({}) is None
    scope = as_scope({"user": "alice", "session": "s1"})
    assert scope == Scope(user="alice", session="s1") and scope.to_json() == {"user": "alice", "session": "s1"}
    assert scope.matches(Case(state="s", action="a", reward=1.0, user="alice", session="s1", agent="x"))
    assert not scope.matches(Case(state="s", action="a", reward=1.0, user="alice"))
    with pytest.raises(DataFormatError, match="unknown scope field"):
        as_scope({"team": "alice"})
    with pytest.raises(DataFormatError, match="beside the scope"):
        as_scope({"user": "alice", "include_global": True})
    with pytest.raises(DataFormatError, match="scope.user"):
        as_scope({"user": "a\x00b"})


def test_mem0_names_are_aliases_and_a_null_field_is_refused() -> None:
    assert as_scope({"user_id": "alice", "agent_id": "p", "run_id": "r"}) == Scope(user="alice", agent="p",
                                                                                   session="r")
    assert as_scope({"user_id": "alice", "user": "alice"}) == Scope(user="alice")  # the same value twice: fine
    with pytest.raises(DataFormatError, match="user and user_id name the same field and differ") as info:
        as_scope({"user": "alice", "user_id": "bob"})
    assert "\n" not in str(info.value)
    for null in ({"user": None}, {"user_id": None}, {"user": "alice", "session": None}):
        with pytest.raises(DataFormatError, match="is null: a scope field's value is an id"):
            as_scope(null)  # before: no restriction, every user's cases
    with pytest.raises(DataFormatError, match="include_global must be true or false"):
        as_scope({"user": "alice"}, include_global="yes")


def test_include_global_keeps_the_cases_without_an_owner() -> None:
    owned = Case(state="s", action="a", reward=1.0, user="alice")
    other = Case(state="s", action="a", reward=1.0, user="bob")
    shared = Case(state="s", action="a", reward=1.0)
    agent_only = Case(state="s", action="a", reward=1.0, agent="planner")  # owned (by an agent): not global
    scope = as_scope({"user": "alice"}, include_global=True)
    assert scope == Scope(user="alice", include_global=True) and scope.to_json() == {"user": "alice"}
    assert [scope.matches(c) for c in (owned, other, shared, agent_only)] == [True, False, True, False]
    assert as_scope(Scope(user="alice"), include_global=True) == scope
    assert as_scope(None, include_global=True) is None and as_scope({}, include_global=True) is None  # all cases


def test_scope_is_part_of_a_case_identity_only_when_set() -> None:
    plain = Case(state="s", action="a", reward=1.0)
    assert plain.content_hash == Case(state="s", action="a", reward=0.0).content_hash
    alice, bob = (Case(state="s", action="a", reward=1.0, user=u) for u in ("alice", "bob"))
    assert len({plain.content_hash, alice.content_hash, bob.content_hash}) == 3
    assert alice.to_json()["user"] == "alice" and "user" not in plain.to_json()


# ---------------------------------------------------------------- one verdict: Python, SQLite and Milvus

_keys = st.sampled_from(["a", "b", "topic"])
_values = st.one_of(st.sampled_from(["x", "y", "geo", "1", "true", "Geo", "geology"]), st.integers(-3, 3),
                    st.sampled_from([0.5, 2.0, -1.0]), st.booleans())
_metas = st.dictionaries(st.sampled_from(["a", "b", "topic", "user"]),
                         st.one_of(_values, st.lists(st.integers(0, 2), max_size=2), st.none()), max_size=3)
_owners = st.sampled_from([None, "alice", "bob"])
_times = [100.0, 200.0, 200.5, 1714521600.0]
_cases = st.builds(lambda meta, user, agent, session, created: Case(
    state="s", action="a", reward=1.0, meta=meta, user=user, agent=agent, session=session, created=created),
    _metas, _owners, _owners, _owners, st.sampled_from(_times))
_ordered = st.one_of(st.sampled_from(["g", "geo", "x", "1"]), st.integers(-3, 3), st.sampled_from([0.5, 2.0]))
_meta_leaf = st.one_of(
    st.builds(lambda k, v: {k: v}, _keys, _values),
    st.builds(lambda k, op, vs: {k: {op: vs}}, _keys, st.sampled_from(["in", "nin"]),
              st.lists(_values, min_size=1, max_size=3)),
    st.builds(lambda k, op, v: {k: {op: v}}, _keys, st.sampled_from(["eq", "ne"]), _values),
    st.builds(lambda k, ops: {k: ops}, _keys, st.dictionaries(st.sampled_from(["gt", "gte", "lt", "lte"]), _ordered,
                                                             min_size=1, max_size=2)),
    st.builds(lambda k, v: {k: {"contains": v}}, _keys, st.sampled_from(["e", "geo", "x", "G", "1", "ru"])),
    st.builds(lambda v: {"meta.user": v}, _values),
)
_scope_leaf = st.builds(lambda k, op, v: {k: {op: v}}, st.sampled_from(["user", "agent", "session", "user_id",
                                                                        "run_id"]),
                        st.sampled_from(["eq", "ne"]), st.sampled_from(["alice", "bob", "carol"])) | st.builds(
    lambda k, op, vs: {k: {op: vs}}, st.sampled_from(["user", "agent_id"]), st.sampled_from(["in", "nin"]),
    st.lists(st.sampled_from(["alice", "bob", "carol"]), min_size=1, max_size=2))
_time_leaf = st.builds(lambda op, v: {"created": {op: v}}, st.sampled_from(["eq", "ne", "gt", "gte", "lt", "lte"]),
                       st.sampled_from([*_times, 150, "1970-01-01T00:03:20Z", "2024-05-01"])) | st.builds(
    lambda op, vs: {"created": {op: vs}}, st.sampled_from(["in", "nin"]),
    st.lists(st.sampled_from(_times), min_size=1, max_size=2))
_leaf = _meta_leaf | _scope_leaf | _time_leaf
_filters = st.recursive(_leaf, lambda inner: st.one_of(
    st.builds(lambda op, parts: {op: parts}, st.sampled_from(["AND", "OR"]), st.lists(inner, min_size=1, max_size=3)),
    st.builds(lambda part: {"NOT": part}, inner)), max_leaves=6)
_scopes = st.one_of(st.none(), st.builds(lambda fields, wide: (fields, wide), st.dictionaries(
    st.sampled_from(list(SCOPE_FIELDS)), st.sampled_from(["alice", "bob"]), min_size=1, max_size=2), st.booleans()))


def _sqlite_matches(cases: list[Case], where: Where | None, scope: Scope | None = None, *,
                    scoped: bool = True) -> list[bool]:
    conn = sqlite3.connect(":memory:")
    columns = ", scope_user TEXT, scope_agent TEXT, scope_session TEXT" if scoped else ""
    conn.execute(f"CREATE TABLE cases (pos INTEGER PRIMARY KEY, meta TEXT NOT NULL, created REAL NOT NULL{columns})")
    conn.executemany(f"INSERT INTO cases VALUES (?, ?, ?{', ?, ?, ?' if scoped else ''})",
                     [(i, json.dumps(c.meta), c.created, *(c.scope if scoped else ())) for i, c in enumerate(cases)])
    clauses, params = ["1"], []
    for part in (scope, where):
        if part is not None:
            sql, extra = part.sql(scoped=scoped)
            clauses.append(sql)
            params += extra
    found = {row[0] for row in conn.execute(f"SELECT pos FROM cases WHERE {' AND '.join(clauses)}", params)}
    return [i in found for i in range(len(cases))]


def _reference(cases: list[Case], where: Where | None, scope: Scope | None = None) -> list[bool]:
    return [(scope is None or scope.matches(c)) and (where is None or where.matches(c)) for c in cases]


@settings(FUZZ, max_examples=examples(200))
@given(cases=st.lists(_cases, min_size=1, max_size=8), raw=_filters, scope=_scopes)
def test_sqlite_compilation_agrees_with_the_reference(cases, raw, scope) -> None:
    record(__name__, "inputs")
    where = parse_filter(raw)
    owner = None if scope is None else as_scope(scope[0], include_global=scope[1])
    assert _sqlite_matches(cases, where, owner) == _reference(cases, where, owner)
    if where is not None:  # NOT is the complement, whatever a case lacks
        assert _sqlite_matches(cases, where.negate()) == [not held for held in _reference(cases, where)]


@settings(FUZZ, max_examples=examples(50))
@given(metas=st.lists(_metas, min_size=1, max_size=6), raw=_filters, scope=_scopes)
def test_a_bank_without_scope_columns_has_no_owners(metas, raw, scope) -> None:
    cases = [Case(state="s", action="a", reward=1.0, meta=m, created=100.0) for m in metas]
    where = parse_filter(raw)
    owner = None if scope is None else as_scope(scope[0], include_global=scope[1])
    assert _sqlite_matches(cases, where, owner, scoped=False) == _reference(cases, where, owner)


def test_types_do_not_mix() -> None:
    cases = [Case(state="s", action="a", reward=1.0, meta=m, created=0.0)
             for m in [{"a": True}, {"a": 1}, {"a": 1.0}, {"a": "1"}, {"a": "true"}, {}]]
    for raw, expected in [({"a": True}, [True, False, False, False, False, False]),
                          ({"a": 1}, [False, True, True, False, False, False]),
                          ({"a": "1"}, [False, False, False, True, False, False]),
                          ({"a": {"gte": 1}}, [False, True, True, False, False, False]),
                          ({"a": {"gte": "1"}}, [False, False, False, True, True, False]),
                          ({"a": {"ne": 1}}, [True, False, False, True, True, True]),
                          ({"a": {"contains": "1"}}, [False, False, False, True, False, False])]:
        where = parse_filter(raw)
        assert [where.matches(c) for c in cases] == expected, raw
        assert _sqlite_matches(cases, where) == expected, raw


def test_a_meta_mapping_is_matched_as_a_case_without_scope_or_times() -> None:
    where = parse_filter({"topic": "geo"})
    assert where.matches({"topic": "geo"}) and not where.matches({})
    assert not parse_filter({"user": "alice"}).matches({"user": "alice"})  # the scope field, not the meta key
    assert parse_filter({"meta.user": "alice"}).matches({"user": "alice"})


def test_milvus_attrs_keep_types_apart() -> None:
    assert milvus_attrs({"a": True, "b": 1, "c": "x", "d": [1], "e": {"f": 1}, "g": None}) == {
        "b:a": True, "n:b": 1, "s:c": "x"}
    where = parse_filter({"OR": [{"a": True}, {"b": {"in": [1, "x"]}}]})
    assert where.milvus("attrs") == '((attrs["b:a"] == true) or (attrs["n:b"] == 1 or attrs["s:b"] == "x"))'
    assert parse_filter({"user": {"ne": "a"}}).milvus() == '(scope_user is null or not (scope_user == "a"))'
    assert parse_filter({"NOT": {"a": 1}}).milvus() == '((not exists attrs["n:a"] or not (attrs["n:a"] == 1)))'


@pytest.mark.parametrize("value", ["50%", "a_b", "back\\slash"])
def test_milvus_refuses_a_contains_it_cannot_match_literally(value) -> None:
    where = parse_filter({"title": {"contains": value}})
    assert where.matches({"title": f"x{value}y"})  # fine in Python and SQLite
    with pytest.raises(DataFormatError, match="a Milvus bank cannot match") as info:
        where.milvus()
    assert "\n" not in str(info.value)


MILVUS_CASES = [
    Case(state=f"s{i}", action="a", reward=1.0, meta=meta, user=user, agent=agent, session=session, created=created)
    for i, (meta, user, agent, session, created) in enumerate([
        ({"topic": "geo", "level": 2, "done": True}, "alice", None, None, 100.0),
        ({"topic": "geology", "level": 2.5, "user": "bob"}, None, None, None, 200.0),
        ({"topic": "Geo", "level": "2", "a": None}, "bob", "planner", "s1", 200.5),
        ({"topic": ["geo"], "level": [1], "done": 1}, None, "planner", None, 1714521600.0),
        ({}, "alice", None, "s1", 150.0),
        ({"a": "x", "b": -1, "done": False, "user": "alice"}, None, None, None, 100.0),
        ({"a": 1, "b": 0.5, "topic": "sci"}, "carol", None, None, 300.0),
        ({"a": True, "b": "y", "topic": "1"}, None, None, "s2", 200.0),
    ])]

MILVUS_SUITE = [
    {"level": {"gte": 2, "lt": 3}}, {"level": {"gt": "1"}}, {"topic": {"contains": "eo"}}, {"topic": {"gt": "g"}},
    {"NOT": {"topic": {"contains": "eo"}}}, {"user": "alice"}, {"user_id": {"ne": "alice"}},
    {"agent": {"nin": ["planner"]}}, {"session": {"in": ["s1", "s2"]}}, {"meta.user": "alice"},
    {"created": {"gte": "1970-01-01T00:02:30Z", "lt": 300}}, {"created": {"ne": 200.0}},
    {"NOT": {"OR": [{"user": "alice"}, {"done": True}]}}, {"done": {"ne": True}}, {"a": {"nin": [1, "x"]}},
    {"AND": [{"topic": {"in": ["geo", "sci"]}}, {"NOT": {"created": {"gt": 150}}}]},
]


@pytest.fixture(scope="module")
def milvus_bank(tmp_path_factory: pytest.TempPathFactory):
    from memento.bank import create_bank
    from tests.conftest import unit_vectors

    bank = create_bank(f"milvus:{Path(tmp_path_factory.mktemp('where')) / 'w.db'}#where", 4)
    bank.add(MILVUS_CASES, unit_vectors(np.random.default_rng(0), len(MILVUS_CASES), 4))
    yield bank
    bank.close()


def _milvus_matches(bank, where: Where | None, scope: Scope | None = None) -> list[bool]:
    from memento.bank.front import Filter

    expression = bank._index._filter(Filter(scope=scope, meta=where))  # what a search of this bank sends
    rows = bank._rows.client.query(bank._rows.collection, filter=expression, output_fields=["pos"])
    found = {int(row["pos"]) for row in rows}
    return [i in found for i in range(len(bank))]


@pytest.mark.parametrize("raw", MILVUS_SUITE)
def test_one_suite_through_all_three(milvus_bank, raw) -> None:
    where = parse_filter(raw)
    expected = _reference(MILVUS_CASES, where)
    assert any(expected) and not all(expected), raw  # the suite tells cases apart
    assert _sqlite_matches(MILVUS_CASES, where) == expected
    assert _milvus_matches(milvus_bank, where) == expected
    assert _milvus_matches(milvus_bank, where.negate()) == [not held for held in expected]


@settings(FUZZ, max_examples=examples(60))
@given(raw=_filters, scope=_scopes)
def test_milvus_compilation_agrees_with_the_reference(milvus_bank, raw, scope) -> None:
    record(__name__, "inputs")
    where = parse_filter(raw)
    owner = None if scope is None else as_scope(scope[0], include_global=scope[1])
    expected = _reference(MILVUS_CASES, where, owner)
    assert _milvus_matches(milvus_bank, where, owner) == expected
    assert _sqlite_matches(MILVUS_CASES, where, owner) == expected


def test_a_vector_beyond_float32_is_one_line_without_a_numpy_warning() -> None:
    import warnings

    import numpy as np

    from memento.bank.front import validate_query

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's overflow RuntimeWarning would fail here
        with pytest.raises(DataFormatError, match="beyond float32"):
            validate_query(np.array([1e39, 0.0]), 2)
        with pytest.raises(DataFormatError, match="NaN or inf"):
            validate_query(np.array([np.inf, 0.0]), 2)
        assert validate_query(np.array([3.0, 4.0]), 2).tolist() == [[0.6000000238418579, 0.800000011920929]]
