"""Which cases a search may return: a *scope* (user, agent, session) and a *metadata filter*.

A case may carry scope fields (``Case.user``, ``Case.agent``, ``Case.session``: who it belongs to, as mem0's
``user_id``/``agent_id``/``run_id``) and ``meta`` (any JSON object). A search, a selection, ``bank search``,
``/v1/select`` and the MCP tools take

- a **scope**, ``{"user": "alice", "agent": "planner"}``: every field given must equal the case's (a case without
  that field is outside the scope); a field left out does not restrict;
- a **filter** over the top-level keys of ``meta``, as JSON:

  =====================================  ==========================================================
  ``{"topic": "geo"}``                    ``meta["topic"]`` equals ``"geo"``
  ``{"topic": {"in": ["geo", "sci"]}}``   ``meta["topic"]`` is one of the values
  ``{"topic": "geo", "level": 2}``        both (several keys in one object are ANDed)
  ``{"AND": [F, ...]}``                   every filter ``F`` holds
  ``{"OR": [F, ...]}``                    at least one filter ``F`` holds
  =====================================  ==========================================================

  Values are strings, finite numbers (``|x| <= 2**53``) or booleans. A boolean matches only a boolean and a number
  only a number (``2`` matches ``2.0``; ``true`` does not match ``1``); a case without the key does not match.

Both are pushed down into the bank's search, so the top-k is the top-k *of the matching cases* (not a top-k
filtered afterwards): a directory bank turns them into one SQLite query for the matching positions (cached until
the bank changes) and hands faiss that mask; a Milvus bank into a filter expression on its ``scope_*`` fields and
its ``attrs`` JSON field. A scope or filter that matches nothing gives an empty result, not an error. The three
compilations (:meth:`Where.matches`, :meth:`Where.sql`, :meth:`Where.milvus`) give the same verdicts
(``tests/unit/test_where.py`` runs one suite of cases and filters through all three).
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
import re
from collections.abc import Mapping
from typing import Any

from memento.errors import DataFormatError
from memento.types import SCOPE_FIELDS, Case, check_id, shown

__all__ = ["MAX_FILTER_TERMS", "MAX_IN_VALUES", "Scope", "Where", "as_scope", "milvus_attrs", "parse_filter"]

MAX_FILTER_TERMS = 64
"""The most comparisons one filter may hold (each becomes a clause of a SQL query or a Milvus expression)."""
MAX_IN_VALUES = 256
"""The most values one ``in`` list may hold."""
MAX_FILTER_DEPTH = 8
"""How deep ``AND``/``OR`` may nest."""
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")
_EXACT = 2 ** 53  # numbers beyond are not exact as doubles (SQLite and Milvus compare them as doubles)

Value = str | int | float | bool


@dataclasses.dataclass(frozen=True)
class Scope:
    """Who cases belong to: each field given must equal the case's (``None``: not restricted)."""

    user: str | None = None
    agent: str | None = None
    session: str | None = None

    def __post_init__(self) -> None:
        for name in SCOPE_FIELDS:
            value = getattr(self, name)
            if value is not None:
                check_id(value, f"scope.{name}")

    def items(self) -> list[tuple[str, str]]:
        """The fields given, as ``(name, value)``."""
        return [(name, getattr(self, name)) for name in SCOPE_FIELDS if getattr(self, name) is not None]

    def __bool__(self) -> bool:
        return bool(self.items())

    def matches(self, case: Case) -> bool:
        return all(getattr(case, name) == value for name, value in self.items())

    def to_json(self) -> dict[str, str]:
        return dict(self.items())


def as_scope(value: Scope | Mapping[str, Any] | None) -> Scope | None:
    """A :class:`Scope` from a mapping (``{"user": ..., "agent": ..., "session": ...}``), or ``None`` when empty."""
    if value is None or isinstance(value, Scope):
        return value or None
    if not isinstance(value, Mapping):
        raise DataFormatError(f"a scope must be an object with keys {list(SCOPE_FIELDS)}, got {shown(value)}")
    unknown = sorted(str(key) for key in value if key not in SCOPE_FIELDS)
    if unknown:
        raise DataFormatError(f"unknown scope field(s) {unknown}; a scope has {list(SCOPE_FIELDS)}")
    return Scope(**{key: value[key] for key in value if value[key] is not None}) or None


def _value(value: Any, where: str) -> Value:
    if isinstance(value, str):
        return check_id(value, where) if len(value) <= 256 else _too_long(value, where)
    if isinstance(value, bool):
        return value
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        try:
            number = float(value)
        except (OverflowError, ValueError, TypeError):
            number = math.inf
        if not math.isfinite(number) or abs(number) > _EXACT:
            raise DataFormatError(f"{where}: a number in a filter must be finite and at most 2**53 in size, "
                                  f"got {shown(value)}")
        return int(value) if isinstance(value, numbers.Integral) else number
    raise DataFormatError(f"{where}: a filter value is a string, a number or a boolean, got {shown(value)}")


def _too_long(value: str, where: str) -> str:
    raise DataFormatError(f"{where}: a filter value holds at most 256 characters, got {shown(value)}")


def _same(stored: Any, value: Value) -> bool:
    """The one equality every compilation implements: booleans only equal booleans, numbers only numbers."""
    if isinstance(value, bool):
        return isinstance(stored, bool) and stored == value
    if isinstance(value, (int, float)):
        return isinstance(stored, numbers.Real) and not isinstance(stored, bool) and stored == value
    return isinstance(stored, str) and stored == value


@dataclasses.dataclass(frozen=True)
class Where:
    """A parsed metadata filter: ``op`` is ``"in"`` (``key`` in ``values``; one value is equality), ``"and"`` or
    ``"or"`` (over ``parts``). Build it with :func:`parse_filter`."""

    op: str
    key: str = ""
    values: tuple[Value, ...] = ()
    parts: tuple[Where, ...] = ()

    def matches(self, meta: Mapping[str, Any]) -> bool:
        """The reference verdict for one case's ``meta``."""
        if self.op == "in":
            return self.key in meta and any(_same(meta[self.key], v) for v in self.values)
        verdicts = (part.matches(meta) for part in self.parts)
        return all(verdicts) if self.op == "and" else any(verdicts)

    def sql(self, column: str = "meta") -> tuple[str, list[Any]]:
        """A SQLite condition over the JSON text in ``column``, and its parameters."""
        if self.op == "in":
            path = f'$."{self.key}"'
            clauses, params = [], []
            for value in self.values:
                if isinstance(value, bool):
                    clauses.append(f"json_type({column}, ?) = ?")
                    params += [path, "true" if value else "false"]
                elif isinstance(value, (int, float)):
                    clauses.append(f"(json_type({column}, ?) IN ('integer', 'real') AND json_extract({column}, ?) = ?)")
                    params += [path, path, value]
                else:
                    clauses.append(f"(json_type({column}, ?) = 'text' AND json_extract({column}, ?) = ?)")
                    params += [path, path, value]
            return "(" + " OR ".join(clauses) + ")", params
        compiled = [part.sql(column) for part in self.parts]
        joiner = " AND " if self.op == "and" else " OR "
        return "(" + joiner.join(c for c, _ in compiled) + ")", [p for _, ps in compiled for p in ps]

    def milvus(self, field: str = "attrs") -> str:
        """A Milvus filter expression over the JSON field ``field`` written by :func:`milvus_attrs` (Milvus Lite
        takes no ``in`` on a JSON path, so a list becomes ORed equalities; Milvus compares ``true`` equal to ``1``,
        so each value is looked up under its type's key)."""
        if self.op == "in":
            return "(" + " or ".join(f"{field}[{json.dumps(_typed_key(self.key, v))}] == {_literal(v)}"
                                     for v in self.values) + ")"
        joiner = " and " if self.op == "and" else " or "
        return "(" + joiner.join(part.milvus(field) for part in self.parts) + ")"

    def to_json(self) -> Any:
        """The filter as JSON again (canonical: a cache key, and what logs and pending rows record)."""
        if self.op == "in":
            return {self.key: self.values[0]} if len(self.values) == 1 else {self.key: {"in": list(self.values)}}
        return {self.op.upper(): [part.to_json() for part in self.parts]}

    def key_text(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True, ensure_ascii=False)

    def terms(self) -> int:
        return len(self.values) if self.op == "in" else sum(part.terms() for part in self.parts)


def _type_tag(value: Any) -> str | None:
    if isinstance(value, bool):
        return "b"
    if isinstance(value, (int, float)):
        return "n"
    return "s" if isinstance(value, str) else None


def _typed_key(key: str, value: Any) -> str:
    return f"{_type_tag(value)}:{key}"


def milvus_attrs(meta: Mapping[str, Any]) -> dict[str, Any]:
    """What a Milvus bank stores in its ``attrs`` JSON field for a case's ``meta``: each top-level scalar under a key
    that names its type (``"s:topic"``, ``"n:level"``, ``"b:done"``), so a filter on ``true`` cannot match ``1``.
    Lists and objects are not filterable and are left out (the ``meta`` field keeps the whole object)."""
    return {_typed_key(key, value): value for key, value in meta.items() if _type_tag(value) is not None}


def _literal(value: Value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value, ensure_ascii=False)


def parse_filter(value: Where | Mapping[str, Any] | None, *, what: str = "filter") -> Where | None:
    """A :class:`Where` from filter JSON (see the module docstring), or ``None`` for ``None``/``{}``. Anything
    else gives one ``DataFormatError`` naming the part at fault."""
    if value is None or isinstance(value, Where):
        return value
    where = _parse(value, what, 0)
    if where is not None and where.terms() > MAX_FILTER_TERMS:
        raise DataFormatError(f"{what}: {where.terms()} comparisons; a filter holds at most {MAX_FILTER_TERMS}")
    return where


def _parse(value: Any, what: str, depth: int) -> Where | None:
    if depth > MAX_FILTER_DEPTH:
        raise DataFormatError(f"{what}: AND/OR nest at most {MAX_FILTER_DEPTH} levels deep")
    if not isinstance(value, Mapping):
        raise DataFormatError(f"{what} must be an object such as {{\"topic\": \"geo\"}}, got {shown(value)}")
    parts: list[Where] = []
    for key, item in value.items():
        here = f"{what}.{key}" if isinstance(key, str) else what
        if key in ("AND", "OR"):
            if not isinstance(item, list) or not item:
                raise DataFormatError(f"{here} takes a non-empty list of filters, got {shown(item)}")
            subs = [_parse(sub, f"{here}[{i}]", depth + 1) for i, sub in enumerate(item)]
            kept = tuple(sub for sub in subs if sub is not None)
            if len(kept) < len(subs) and key == "OR":
                continue  # an empty filter holds for every case: so does the OR
            if kept:
                parts.append(kept[0] if len(kept) == 1 else Where(key.lower(), parts=kept))
            continue
        if not isinstance(key, str) or not _KEY.fullmatch(key):
            raise DataFormatError(f"{what}: a filter key is a meta key of 1-64 letters, digits, '_' or '-' "
                                  f"(not starting with a digit or '-'), or AND/OR; got {shown(key)}")
        if isinstance(item, Mapping):
            if set(item) != {"in"}:
                raise DataFormatError(f"{here}: an operator object is {{\"in\": [values]}}, got {shown(item)}")
            values = item["in"]
            if not isinstance(values, list) or not values:
                raise DataFormatError(f"{here}.in takes a non-empty list of values, got {shown(values)}")
            if len(values) > MAX_IN_VALUES:
                raise DataFormatError(f"{here}.in holds {len(values)} values; at most {MAX_IN_VALUES}")
            parts.append(Where("in", key=key, values=tuple(_value(v, f"{here}.in") for v in values)))
        else:
            parts.append(Where("in", key=key, values=(_value(item, here),)))
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else Where("and", parts=tuple(parts))
