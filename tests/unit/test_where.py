"""Scopes and metadata filters (memento.memory.where): the parser, and the one verdict its three compilations give
(Python, SQLite, Milvus; the Milvus one runs in tests/unit/test_bank_scopes.py on real collections)."""

from __future__ import annotations

import json
import re
import sqlite3

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memento.errors import DataFormatError
from memento.memory.where import MAX_FILTER_TERMS, Scope, Where, as_scope, milvus_attrs, parse_filter
from memento.types import Case
from tests.fuzzing import FUZZ, examples, record


def test_forms_parse_to_one_tree() -> None:
    assert parse_filter(None) is None and parse_filter({}) is None
    eq = parse_filter({"topic": "geo"})
    assert eq == Where("in", key="topic", values=("geo",))
    both = parse_filter({"topic": "geo", "level": 2})
    assert both is not None and both.op == "and" and len(both.parts) == 2
    any_of = parse_filter({"OR": [{"topic": {"in": ["geo", "sci"]}}, {"done": True}]})
    assert any_of is not None and any_of.op == "or"
    assert parse_filter(any_of.to_json()) == any_of  # JSON round trip
    assert parse_filter({"OR": [{}, {"a": 1}]}) is None  # an empty filter in an OR holds for every case
    assert parse_filter({"AND": [{}, {"a": 1}]}) == Where("in", key="a", values=(1,))


@pytest.mark.parametrize("bad,needle", [
    ([1], "must be an object"),
    ({"1x": "a"}, "a filter key"),
    ({"a b": "a"}, "a filter key"),
    ({"a": None}, "a string, a number or a boolean"),
    ({"a": [1, 2]}, "a string, a number or a boolean"),
    ({"a": {"eq": 1}}, "operator object"),
    ({"a": {"in": []}}, "non-empty list"),
    ({"a": {"in": "xy"}}, "non-empty list"),
    ({"a": float("nan")}, "finite"),
    ({"a": 2 ** 60}, "2**53"),
    ({"a": 10 ** 400}, "2**53"),
    ({"AND": {}}, "non-empty list"),
    ({"OR": []}, "non-empty list"),
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
        deep = {"AND": [deep]}
    with pytest.raises(DataFormatError, match="nest"):
        parse_filter(deep)


def test_scope() -> None:
    assert as_scope(None) is None and as_scope({}) is None and as_scope({"user": None}) is None
    scope = as_scope({"user": "alice", "session": "s1"})
    assert scope == Scope(user="alice", session="s1") and scope.to_json() == {"user": "alice", "session": "s1"}
    assert scope.matches(Case(state="s", action="a", reward=1.0, user="alice", session="s1", agent="x"))
    assert not scope.matches(Case(state="s", action="a", reward=1.0, user="alice"))
    with pytest.raises(DataFormatError, match="unknown scope field"):
        as_scope({"user_id": "alice"})
    with pytest.raises(DataFormatError, match="scope.user"):
        as_scope({"user": "a\x00b"})


def test_scope_is_part_of_a_case_identity_only_when_set() -> None:
    plain = Case(state="s", action="a", reward=1.0)
    assert plain.content_hash == Case(state="s", action="a", reward=0.0).content_hash
    alice, bob = (Case(state="s", action="a", reward=1.0, user=u) for u in ("alice", "bob"))
    assert len({plain.content_hash, alice.content_hash, bob.content_hash}) == 3
    assert alice.to_json()["user"] == "alice" and "user" not in plain.to_json()


# ---------------------------------------------------------------- one verdict: Python and SQLite

_keys = st.sampled_from(["a", "b", "topic"])
_values = st.one_of(st.sampled_from(["x", "y", "geo", "1", "true"]), st.integers(-3, 3),
                    st.sampled_from([0.5, 2.0, -1.0]), st.booleans())
_metas = st.dictionaries(_keys, st.one_of(_values, st.lists(st.integers(0, 2), max_size=2), st.none()), max_size=3)
_leaf = st.builds(lambda k, v: {k: v}, _keys, _values) | st.builds(
    lambda k, vs: {k: {"in": vs}}, _keys, st.lists(_values, min_size=1, max_size=3))
_filters = st.recursive(_leaf, lambda inner: st.builds(lambda op, parts: {op: parts}, st.sampled_from(["AND", "OR"]),
                                                        st.lists(inner, min_size=1, max_size=3)), max_leaves=6)


def _sqlite_matches(metas: list[dict], where: Where) -> list[bool]:
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE cases (pos INTEGER PRIMARY KEY, meta TEXT NOT NULL)")
    conn.executemany("INSERT INTO cases VALUES (?, ?)", [(i, json.dumps(m)) for i, m in enumerate(metas)])
    sql, params = where.sql("meta")
    found = {row[0] for row in conn.execute(f"SELECT pos FROM cases WHERE {sql}", params)}
    return [i in found for i in range(len(metas))]


@settings(FUZZ, max_examples=examples(150))
@given(metas=st.lists(_metas, min_size=1, max_size=8), raw=_filters)
def test_sqlite_compilation_agrees_with_the_reference(metas, raw) -> None:
    record(__name__, "inputs")
    where = parse_filter(raw)
    assert where is not None
    assert _sqlite_matches(metas, where) == [where.matches(m) for m in metas]


def test_types_do_not_mix() -> None:
    metas = [{"a": True}, {"a": 1}, {"a": 1.0}, {"a": "1"}, {"a": "true"}, {}]
    for value, expected in [(True, [True, False, False, False, False, False]),
                            (1, [False, True, True, False, False, False]),
                            ("1", [False, False, False, True, False, False])]:
        where = parse_filter({"a": value})
        assert [where.matches(m) for m in metas] == expected
        assert _sqlite_matches(metas, where) == expected


def test_milvus_attrs_keep_types_apart() -> None:
    assert milvus_attrs({"a": True, "b": 1, "c": "x", "d": [1], "e": {"f": 1}, "g": None}) == {
        "b:a": True, "n:b": 1, "s:c": "x"}
    where = parse_filter({"OR": [{"a": True}, {"b": {"in": [1, "x"]}}]})
    assert where.milvus("attrs") == '((attrs["b:a"] == true) or (attrs["n:b"] == 1 or attrs["s:b"] == "x"))'


def test_a_vector_beyond_float32_is_one_line_without_a_numpy_warning() -> None:
    import warnings

    import numpy as np

    from memento.memory.front import validate_query

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's overflow RuntimeWarning would fail here
        with pytest.raises(DataFormatError, match="beyond float32"):
            validate_query(np.array([1e39, 0.0]), 2)
        with pytest.raises(DataFormatError, match="NaN or inf"):
            validate_query(np.array([np.inf, 0.0]), 2)
        assert validate_query(np.array([3.0, 4.0]), 2).tolist() == [[0.6000000238418579, 0.800000011920929]]
