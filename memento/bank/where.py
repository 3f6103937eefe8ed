"""Which cases a search may return: a *scope* (user, agent, session) and a *filter*.

A case may carry scope fields (``Case.user``, ``Case.agent``, ``Case.session``: who it belongs to, as mem0's
``user_id``/``agent_id``/``run_id``), a creation time (``Case.created``, Unix seconds) and ``meta`` (any JSON
object). A search, a selection, ``bank search``, ``/v1/select`` and the MCP tools take

- a **scope**, ``{"user": "alice", "agent": "planner"}``: every field given must equal the case's (a case without
  that field is outside the scope); a field left out does not restrict. mem0's names ``user_id``, ``agent_id`` and
  ``run_id`` are aliases of ``user``, ``agent`` and ``session`` (both given with different values is an error). A
  field's value is an id: ``{"user": null}`` is refused, not read as "any user" (leave the field out for that), and
  so is a key that is not a scope field. Beside a scope, ``include_global=True`` also keeps the cases that have no
  owner at all (no user, agent or session): a shared pool plus the scope's own cases in one search;
- a **filter**, as JSON:

  ==================================================  ===========================================================
  ``{"topic": "geo"}``                                 ``meta["topic"]`` equals ``"geo"`` (``{"eq": "geo"}`` too)
  ``{"topic": {"ne": "geo"}}``                         not equal (a case without the key matches)
  ``{"topic": {"in": ["geo", "sci"]}}``                one of the values (``nin``: none of them)
  ``{"level": {"gte": 2, "lt": 5}}``                   a range (``gt``, ``gte``, ``lt``, ``lte``; several operators
                                                       in one object are ANDed)
  ``{"title": {"contains": "Peru"}}``                  a string value holding that substring (case-sensitive)
  ``{"topic": "geo", "level": 2}``                     both (several keys in one object are ANDed)
  ``{"AND": [F, ...]}``, ``{"OR": [F, ...]}``           every / at least one filter ``F`` holds
  ``{"NOT": F}``                                       ``F`` does not hold
  ``{"user": "alice"}``                                the scope field ``user`` (also ``agent``, ``session`` and
                                                       the aliases ``user_id``, ``agent_id``, ``run_id``): ``eq``,
                                                       ``ne``, ``in``, ``nin`` on ids; a case without it has none
  ``{"created": {"gte": "2024-05-01T00:00:00Z"}}``     the creation time: ISO-8601 text (no zone: UTC) or Unix
                                                       seconds; ``eq ne gt gte lt lte in nin``
  ``{"meta.user": "x"}``                               the meta key ``user``: ``meta.KEY`` reaches any meta key,
                                                       and is the only way to reach one named like a scope or time
                                                       field (``user``, ``user_id``, ``created``, ``updated``, ...)
                                                       or ``AND``/``OR``/``NOT``
  ==================================================  ===========================================================

  A bare key that is not a scope or time field is a top-level key of ``meta``. Values are strings, finite numbers
  (``|x| <= 2**53``) or booleans. A boolean matches only a boolean and a number only a number (``2`` matches
  ``2.0``; ``true`` does not match ``1``); numbers compare only with numbers and strings only with strings (by code
  point), so ``{"level": {"gt": "1"}}`` never matches a number. ``eq``, ``in``, the ranges and ``contains`` need
  the key, with a value of a matching type; ``ne``, ``nin`` and ``NOT`` are their complements, so they hold for a
  case without it. ``contains`` takes a string and matches string values only: lists in ``meta`` are not
  filterable (a Milvus bank does not store them in its filter field, :func:`milvus_attrs`); a Milvus bank refuses
  a ``contains`` value holding ``%``, ``_`` or ``\\`` (its ``like`` cannot match them literally). ``updated`` is
  a time field too (a case never updated: its ``created``). An unknown operator, a key that is
  neither, a ``null`` value: one ``DataFormatError`` naming the part.

Both are pushed down into the bank's search, so the top-k is the top-k *of the matching cases* (not a top-k
filtered afterwards): a directory bank turns them into one SQLite query for the matching positions (cached until
the bank changes) and hands faiss that mask; a Milvus bank into a filter expression on its ``scope_*`` and
``created`` fields and its ``attrs`` JSON field. A scope or filter that matches nothing gives an empty result, not
an error. The three compilations (:meth:`Where.matches`, :meth:`Where.sql`, :meth:`Where.milvus`, and the same
three of :class:`Scope`) give the same verdicts (``tests/unit/test_where.py`` runs one suite of cases and filters
through all three). Each leaf compiles to a two-valued condition (SQL's ``NULL`` and Milvus's missing JSON keys
and null fields are made explicit), so ``NOT`` is the complement on every back end.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import numbers
import re
from collections.abc import Mapping
from typing import Any

from memento.errors import DataFormatError
from memento.types import SCOPE_FIELDS, Case, check_id, shown

__all__ = ["MAX_FILTER_TERMS", "MAX_IN_VALUES", "OPERATORS", "SCOPE_ALIASES", "TIME_COLUMNS", "TIME_FIELDS", "Scope",
           "Where", "as_scope", "milvus_attrs", "parse_filter"]

MAX_FILTER_TERMS = 64
"""The most comparisons one filter may hold (each becomes a clause of a SQL query or a Milvus expression)."""
MAX_IN_VALUES = 256
"""The most values one ``in`` list may hold."""
MAX_FILTER_DEPTH = 8
"""How deep ``AND``/``OR``/``NOT`` may nest."""
SCOPE_ALIASES: dict[str, str] = {"user_id": "user", "agent_id": "agent", "run_id": "session"}
"""mem0's names of the scope fields."""
TIME_FIELDS = ("created", "updated")
"""The time fields a filter names."""
TIME_COLUMNS: dict[str, str] = {"created": "created", "updated": "updated"}
"""The time fields the banks store, by the SQLite column and the Milvus field that hold them (Unix seconds). A case
never updated has ``updated`` = ``created``: a bank whose cases were never updated has no ``updated`` column (the
first update in place adds it), so ``updated`` reads ``created`` there (``versioned=False``)."""
OPERATORS = ("eq", "ne", "gt", "gte", "lt", "lte", "in", "nin", "contains")
_RANGES = ("gt", "gte", "lt", "lte")
_OPS_OF = {"meta": OPERATORS, "scope": ("eq", "ne", "in", "nin"), "time": ("eq", "ne", *_RANGES, "in", "nin")}
_COMBINATORS = ("AND", "OR", "NOT")
_RESERVED = frozenset((*SCOPE_FIELDS, *SCOPE_ALIASES, *TIME_FIELDS, *_COMBINATORS))  # bare keys that are not meta
_META = "meta."
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")
_EXACT = 2 ** 53  # numbers beyond are not exact as doubles (SQLite and Milvus compare them as doubles)
_LIKE_SPECIAL = ("%", "_", "\\")  # what Milvus's like cannot match literally

Value = str | int | float | bool


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


_MISSING: Any = _Missing()


# ---------------------------------------------------------------- scopes


@dataclasses.dataclass(frozen=True)
class Scope:
    """Who cases belong to: each field given must equal the case's (``None``: not restricted). With
    ``include_global``, the cases without any owner (no user, agent nor session) are kept as well."""

    user: str | None = None
    agent: str | None = None
    session: str | None = None
    include_global: bool = False

    def __post_init__(self) -> None:
        for name in SCOPE_FIELDS:
            value = getattr(self, name)
            if value is not None:
                check_id(value, f"scope.{name}")
        if not isinstance(self.include_global, bool):
            raise DataFormatError(f"include_global must be true or false, got {shown(self.include_global)}")

    def items(self) -> list[tuple[str, str]]:
        """The fields given, as ``(name, value)``."""
        return [(name, getattr(self, name)) for name in SCOPE_FIELDS if getattr(self, name) is not None]

    def __bool__(self) -> bool:
        return bool(self.items())

    def matches(self, case: Case) -> bool:
        """The reference verdict for one case."""
        if all(getattr(case, name) == value for name, value in self.items()):
            return True
        return self.include_global and all(getattr(case, name) is None for name in SCOPE_FIELDS)

    def sql(self, *, scoped: bool = True) -> tuple[str, list[Any]]:
        """A SQLite condition over the ``scope_*`` columns and its parameters (``scoped=False``: the bank has no such
        columns yet, so no case has an owner)."""
        if not scoped:
            return ("1" if self.include_global or not self else "0"), []
        owned = " AND ".join(f"scope_{name} = ?" for name, _ in self.items()) or "1"
        params: list[Any] = [value for _, value in self.items()]
        if self.include_global:
            owned = f"({owned}) OR ({' AND '.join(f'scope_{name} IS NULL' for name in SCOPE_FIELDS)})"
        return f"({owned})", params

    def milvus(self) -> str:
        """A Milvus filter expression over the ``scope_*`` fields."""
        owned = " and ".join(f"scope_{name} == {_literal(value)}" for name, value in self.items()) or "true"
        if self.include_global:
            owned = f"({owned}) or ({' and '.join(f'scope_{name} is null' for name in SCOPE_FIELDS)})"
        return f"({owned})"

    def to_json(self) -> dict[str, str]:
        """The fields given (``include_global`` is an argument beside a scope, not part of it)."""
        return dict(self.items())


def scope_fields(value: Mapping[str, Any], what: str = "scope") -> dict[str, Any]:
    """The scope fields of a mapping that may use mem0's names (``user_id``, ``agent_id``, ``run_id``), under their
    own names; a name and its alias with different values raise ``DataFormatError``. Other keys are kept as they
    are (the caller says what else it takes)."""
    out: dict[str, Any] = {}
    for key, item in value.items():
        name = SCOPE_ALIASES.get(key, key) if isinstance(key, str) else key
        if name in out and out[name] != item:
            alias = next(a for a, n in SCOPE_ALIASES.items() if n == name)
            raise DataFormatError(f"{what}: {name} and {alias} name the same field and differ "
                                  f"({shown(out[name])} and {shown(item)}); give one")
        out[name] = item
    return out


def as_scope(value: Scope | Mapping[str, Any] | None, *, include_global: bool = False) -> Scope | None:
    """A :class:`Scope` from a mapping (``{"user": ..., "agent": ..., "session": ...}``, or mem0's ``user_id``,
    ``agent_id``, ``run_id``), or ``None`` when it restricts nothing. A field's value is an id: ``None`` is refused
    (leave the field out instead), and so is an unknown key. ``include_global``: also keep the cases without an
    owner (see :class:`Scope`)."""
    if not isinstance(include_global, bool):
        raise DataFormatError(f"include_global must be true or false, got {shown(include_global)}")
    if value is None:
        return None
    if isinstance(value, Scope):
        scope = dataclasses.replace(value, include_global=True) if include_global else value
        return scope or None
    if not isinstance(value, Mapping):
        raise DataFormatError(f"a scope must be an object with keys {list(SCOPE_FIELDS)}, got {shown(value)}")
    fields = scope_fields(value)
    unknown = sorted(str(key) for key in fields if key not in SCOPE_FIELDS)
    if unknown:
        hint = "; give include_global beside the scope, not in it" if "include_global" in unknown else ""
        raise DataFormatError(f"unknown scope field(s) {unknown}; a scope has {list(SCOPE_FIELDS)} (or mem0's "
                              f"{list(SCOPE_ALIASES)}){hint}")
    for name, item in fields.items():
        if item is None:
            raise DataFormatError(f"scope.{name} is null: a scope field's value is an id (leave the field out to "
                                  "not restrict it)")
    return Scope(**fields, include_global=include_global) or None


# ---------------------------------------------------------------- filters


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
    if value is None:
        raise DataFormatError(f"{where}: a filter value is a string, a number or a boolean, got null (a case "
                              "without the key: use {\"ne\": ...} or NOT)")
    raise DataFormatError(f"{where}: a filter value is a string, a number or a boolean, got {shown(value)}")


def _too_long(value: str, where: str) -> str:
    raise DataFormatError(f"{where}: a filter value holds at most 256 characters, got {shown(value)}")


def _time(value: Any, where: str) -> float:
    """A time in a filter: ISO-8601 text (no zone: UTC) or Unix seconds, as Unix seconds."""
    if isinstance(value, str):
        try:
            when = datetime.datetime.fromisoformat(value.strip())
        except ValueError:
            raise DataFormatError(f"{where}: a time is ISO-8601 text (\"2024-05-01T12:00:00Z\") or Unix seconds, "
                                  f"got {shown(value)}") from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=datetime.timezone.utc)
        return when.timestamp()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise DataFormatError(f"{where}: a time is ISO-8601 text (\"2024-05-01T12:00:00Z\") or Unix seconds, "
                              f"got {shown(value)}")
    return float(_value(value, where))


def _scope_id(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise DataFormatError(f"{where}: a scope field's value is an id (a string), got {shown(value)}")
    return check_id(value, where)


def _same(stored: Any, value: Value) -> bool:
    """The one equality every compilation implements: booleans only equal booleans, numbers only numbers."""
    if isinstance(value, bool):
        return isinstance(stored, bool) and stored == value
    if isinstance(value, (int, float)):
        return isinstance(stored, numbers.Real) and not isinstance(stored, bool) and stored == value
    return isinstance(stored, str) and stored == value


def _ordered(stored: Any, op: str, value: Value) -> bool:
    """The one range comparison: numbers with numbers, strings with strings (code points), nothing else."""
    if isinstance(value, str):
        if not isinstance(stored, str):
            return False
    elif not isinstance(stored, numbers.Real) or isinstance(stored, bool):
        return False
    if op == "gt":
        return bool(stored > value)
    if op == "gte":
        return bool(stored >= value)
    if op == "lt":
        return bool(stored < value)
    return bool(stored <= value)


_SQL_OP = {"gt": ">", "gte": ">=", "lt": "<", "lte": "<="}


@dataclasses.dataclass(frozen=True)
class Where:
    """A parsed filter, in negation normal form: ``op`` is ``"and"`` or ``"or"`` (over ``parts``), or a comparison of
    the field ``key`` (``"meta.<key>"``, a scope field ``"user"``/``"agent"``/``"session"``, or a time field) with
    ``values``: ``"in"`` (one of them; one value is equality), ``"gt"``, ``"gte"``, ``"lt"``, ``"lte"`` or
    ``"contains"``; ``negated`` holds where the comparison does not (a case without the field included). Build it
    with :func:`parse_filter`."""

    op: str
    key: str = ""
    values: tuple[Value, ...] = ()
    parts: tuple[Where, ...] = ()
    negated: bool = False

    @property
    def kind(self) -> str:
        """``"meta"``, ``"scope"`` or ``"time"`` (what the comparison reads)."""
        if self.key.startswith(_META):
            return "meta"
        return "scope" if self.key in SCOPE_FIELDS else "time"

    # ------------------------------------------------------------ Python

    def matches(self, case: Case | Mapping[str, Any]) -> bool:
        """The reference verdict for one case (a mapping is read as a case's ``meta``, without scope or times)."""
        if self.op == "and":
            return all(part.matches(case) for part in self.parts)
        if self.op == "or":
            return any(part.matches(case) for part in self.parts)
        stored = self._stored(case)
        if stored is _MISSING:
            held = False
        elif self.op == "in":
            held = any(_same(stored, value) for value in self.values)
        elif self.op == "contains":
            held = isinstance(stored, str) and str(self.values[0]) in stored
        else:
            held = _ordered(stored, self.op, self.values[0])
        return held != self.negated

    def _stored(self, case: Case | Mapping[str, Any]) -> Any:
        if isinstance(case, Mapping):
            return case.get(self.key[len(_META):], _MISSING) if self.kind == "meta" else _MISSING
        if self.kind == "meta":
            return case.meta.get(self.key[len(_META):], _MISSING)
        stored = getattr(case, self.key, None)
        return _MISSING if stored is None else stored

    # ------------------------------------------------------------ SQLite

    def sql(self, column: str = "meta", *, scoped: bool = True, versioned: bool = True) -> tuple[str, list[Any]]:
        """A SQLite condition and its parameters: meta keys read the JSON text in ``column``, scope fields the
        ``scope_*`` columns (``scoped=False``: the bank has none yet, every case is without), time fields their
        :data:`TIME_COLUMNS` (``versioned=False``: the bank has no ``updated`` column yet, every case reads its
        ``created``). Every comparison is two-valued (``IFNULL(..., 0)``), so a ``NOT`` is the complement."""
        if self.op in ("and", "or"):
            compiled = [part.sql(column, scoped=scoped, versioned=versioned) for part in self.parts]
            joiner = " AND " if self.op == "and" else " OR "
            return "(" + joiner.join(c for c, _ in compiled) + ")", [p for _, ps in compiled for p in ps]
        condition, params = self._sql_leaf(column, scoped, versioned)
        condition = f"IFNULL({condition}, 0)"
        return (f"(NOT {condition})" if self.negated else condition), params

    def _sql_leaf(self, column: str, scoped: bool, versioned: bool) -> tuple[str, list[Any]]:
        if self.kind != "meta":
            field = _sql_time(self.key, versioned) if self.kind == "time" else (
                f"scope_{self.key}" if scoped else "NULL")
            if self.op == "in":
                return f"{field} IN ({', '.join('?' for _ in self.values)})", list(self.values)
            return f"{field} {_SQL_OP[self.op]} ?", [self.values[0]]
        path = f'$."{self.key[len(_META):]}"'
        if self.op == "contains":
            return (f"(json_type({column}, ?) = 'text' AND instr(json_extract({column}, ?), ?) > 0)",
                    [path, path, self.values[0]])
        if self.op in _SQL_OP:
            value = self.values[0]
            types = "= 'text'" if isinstance(value, str) else "IN ('integer', 'real')"
            return (f"(json_type({column}, ?) {types} AND json_extract({column}, ?) {_SQL_OP[self.op]} ?)",
                    [path, path, value])
        clauses: list[str] = []
        params: list[Any] = []
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

    # ------------------------------------------------------------ Milvus

    def milvus(self, field: str = "attrs", *, versioned: bool = True) -> str:
        """A Milvus filter expression: meta keys read the JSON field ``field`` written by :func:`milvus_attrs`
        (Milvus Lite takes no ``in`` on a JSON path, so a list becomes ORed equalities; Milvus compares ``true``
        equal to ``1``, so each value is looked up under its type's key), scope fields the ``scope_*`` fields, time
        fields their :data:`TIME_COLUMNS`. Milvus's ``not`` leaves out a null field or a missing JSON key, so a
        negated comparison says ``is null`` / ``not exists`` itself."""
        if self.op in ("and", "or"):
            joiner = " and " if self.op == "and" else " or "
            return "(" + joiner.join(part.milvus(field, versioned=versioned) for part in self.parts) + ")"
        if self.kind != "meta":
            column = f"scope_{self.key}"
            if self.kind == "time":  # a collection made before case versions has no updated field: its created
                column = TIME_COLUMNS[self.key] if versioned or self.key != "updated" else "created"
            if self.op == "in":
                held = (f"{column} == {_literal(self.values[0])}" if len(self.values) == 1
                        else f"{column} in [{', '.join(_literal(v) for v in self.values)}]")
            else:
                held = f"{column} {_SQL_OP[self.op]} {_literal(self.values[0])}"
            return f"({column} is null or not ({held}))" if self.negated else f"({held})"
        key = self.key[len(_META):]
        pieces = []  # (the typed JSON path, the comparison on it)
        for value in self.values:
            path = f"{field}[{json.dumps(_typed_key(key, value))}]"
            if self.op == "in":
                pieces.append((path, f"{path} == {_literal(value)}"))
            elif self.op == "contains":
                text = str(value)
                if any(c in text for c in _LIKE_SPECIAL):
                    raise DataFormatError(f"filter.{key}.contains: a Milvus bank cannot match '%', '_' or '\\' "
                                          f"literally (its like has no escape), got {shown(text)}")
                pieces.append((path, f"{path} like {_literal('%' + text + '%')}"))
            else:
                pieces.append((path, f"{path} {_SQL_OP[self.op]} {_literal(value)}"))
        if self.negated:
            return "(" + " and ".join(f"(not exists {path} or not ({held}))" for path, held in pieces) + ")"
        return "(" + " or ".join(held for _, held in pieces) + ")"

    # ------------------------------------------------------------ JSON

    def to_json(self) -> Any:
        """The filter as JSON again (canonical: a cache key, and what logs and pending rows record)."""
        if self.op in ("and", "or"):
            return {self.op.upper(): [part.to_json() for part in self.parts]}
        key = self.key
        if key.startswith(_META) and key[len(_META):] not in _RESERVED:
            key = key[len(_META):]
        if self.op == "in":
            if len(self.values) == 1:
                return {key: {"ne": self.values[0]} if self.negated else self.values[0]}
            return {key: {"nin" if self.negated else "in": list(self.values)}}
        leaf = {key: {self.op: self.values[0]}}
        return {"NOT": leaf} if self.negated else leaf

    def key_text(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True, ensure_ascii=False)

    def terms(self) -> int:
        return sum(part.terms() for part in self.parts) if self.op in ("and", "or") else len(self.values)

    def negate(self) -> Where:
        """The filter that holds exactly where this one does not (still in negation normal form)."""
        if self.op in ("and", "or"):
            return Where("or" if self.op == "and" else "and", parts=tuple(part.negate() for part in self.parts))
        return dataclasses.replace(self, negated=not self.negated)


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


def _sql_time(key: str, versioned: bool) -> str:
    """The SQLite expression of a time field: ``updated`` is ``NULL`` until a case is updated (or the column is
    absent until a bank's first update), and then reads ``created``."""
    if key == "updated":
        return "COALESCE(updated, created)" if versioned else "created"
    return TIME_COLUMNS[key]


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


def _field(key: Any, what: str) -> str:
    """The canonical field a filter key names (``"meta.<key>"``, a scope field or a time field)."""
    if isinstance(key, str):
        if key in SCOPE_FIELDS or key in SCOPE_ALIASES:
            return SCOPE_ALIASES.get(key, key)
        if key in TIME_FIELDS:
            if key not in TIME_COLUMNS:
                raise DataFormatError(f"{what}.{key}: the banks do not store an {key!r} time yet; filter on "
                                      f"{sorted(TIME_COLUMNS)}")
            return key
        name = key[len(_META):] if key.startswith(_META) else key
        if _KEY.fullmatch(name):
            return _META + name
    raise DataFormatError(f"{what}: a filter key is a meta key of 1-64 letters, digits, '_' or '-' (not starting "
                          f"with a digit or '-'; meta.KEY for any), a scope field {list(SCOPE_FIELDS)} (or "
                          f"{list(SCOPE_ALIASES)}), a time field {list(TIME_COLUMNS)}, or AND/OR/NOT; "
                          f"got {shown(key)}")


def _operand(kind: str, value: Any, where: str) -> Value:
    if kind == "scope":
        return _scope_id(value, where)
    if kind == "time":
        return _time(value, where)
    return _value(value, where)


def _leaves(key: str, item: Any, here: str) -> list[Where]:
    kind = Where("in", key=key).kind
    if not isinstance(item, Mapping):
        return [Where("in", key=key, values=(_operand(kind, item, here),))]
    if not item:
        raise DataFormatError(f"{here}: an operator object holds at least one of {list(_OPS_OF[kind])}")
    leaves = []
    for op, arg in item.items():
        at = f"{here}.{op}"
        if op not in OPERATORS:
            raise DataFormatError(f"{here}: unknown operator {shown(op)}; the operators are {list(OPERATORS)}")
        if op not in _OPS_OF[kind]:
            what = {"scope": "a scope field", "time": "a time field"}[kind]
            raise DataFormatError(f"{at}: {what} takes {list(_OPS_OF[kind])}")
        if op in ("in", "nin"):
            if not isinstance(arg, list) or not arg:
                raise DataFormatError(f"{at} takes a non-empty list of values, got {shown(arg)}")
            if len(arg) > MAX_IN_VALUES:
                raise DataFormatError(f"{at} holds {len(arg)} values; at most {MAX_IN_VALUES}")
            values = tuple(_operand(kind, v, at) for v in arg)
            leaves.append(Where("in", key=key, values=values, negated=op == "nin"))
        elif op in ("eq", "ne"):
            leaves.append(Where("in", key=key, values=(_operand(kind, arg, at),), negated=op == "ne"))
        elif op == "contains":
            if not isinstance(arg, str):
                raise DataFormatError(f"{at} takes a string (a substring of a string value; lists in meta are not "
                                      f"filterable), got {shown(arg)}")
            leaves.append(Where("contains", key=key, values=(_value(arg, at),)))
        else:
            value = _operand(kind, arg, at)
            if isinstance(value, bool):
                raise DataFormatError(f"{at} takes a number or a string, got {shown(arg)}")
            leaves.append(Where(op, key=key, values=(value,)))
    return leaves


def _parse(value: Any, what: str, depth: int) -> Where | None:
    if depth > MAX_FILTER_DEPTH:
        raise DataFormatError(f"{what}: AND/OR/NOT nest at most {MAX_FILTER_DEPTH} levels deep")
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
        if key == "NOT":
            sub = _parse(item, here, depth + 1) if isinstance(item, Mapping) else None
            if sub is None:
                raise DataFormatError(f"{here} takes one non-empty filter object, got {shown(item)}")
            parts.append(sub.negate())
            continue
        parts += _leaves(_field(key, what), item, here)
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else Where("and", parts=tuple(parts))
