"""A case's history: what happened to it, oldest first (mem0's ``history``), as both bank back ends keep it.

Events (:class:`CaseEvent`, ``event`` is one of :data:`EVENTS`):

- ``add``: the case was stored (its ``created`` time; ``replaces``: the case it superseded, when a ``replace``
  stored it);
- ``update``: fields changed in place (``fields``: which; ``old``/``new``: their values; ``version``: the case's
  version after it). ``update`` (``action``, ``reward``, ``meta``) and an ``add`` of stored content with new meta
  make them;
- ``replace``: the case was superseded by ``replaced_by`` (and deleted);
- ``delete``: the case was deleted;
- ``feedback``: a reward reported for a selection that showed the case (``reward``, ``selection_id``). Only a
  selector has them (from its feedback log, ``feedback.sqlite``): a bank's usage log holds no times, so
  ``bank.history`` lists no feedback.

What is stored: the ``add``, ``replace`` and ``delete`` events are read from the case's row and its tombstone
(so banks written before histories existed have them too); ``update`` events, and the ``add`` of a case a
``replace`` stored, are rows of the bank's history log (:class:`EventRow`; a ``history`` table in
``cases.sqlite``, a ``<collection>__history`` side collection in Milvus, created on the first event). Deleting or
replacing a case erases the values (state, action, reward, meta) from its history unless the bank was opened
with ``audit=True``: the events then keep only their kind, time, version and the names of the fields changed.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

__all__ = ["EVENTS", "UPDATABLE", "CaseEvent", "EventRow"]


def _meta(text: Any, row: dict[str, Any]) -> Any:
    """A stored event's meta parsed; bad JSON of any kind (nested too deeply, say) is a one-line ``BankError``."""
    from memento.errors import BankError, DataFormatError
    from memento.io import loads_json

    try:
        return loads_json(text if isinstance(text, (str, bytes)) else str(text))
    except DataFormatError as error:
        raise BankError(f"damaged history: the meta of the event at position {row.get('pos')} is not readable "
                        f"JSON ({error.reason})") from None

EVENTS = ("add", "update", "replace", "delete", "feedback")
UPDATABLE = ("action", "reward", "meta")
"""The fields ``update`` changes in place (the state would change the case's vector: ``replace`` it instead)."""


@dataclasses.dataclass(frozen=True)
class EventRow:
    """One stored event of a case at bank position ``pos``: ``event`` (``update``, or ``add`` for a case that a
    replace stored, ``link`` then naming the case it replaced), its time, the case's version after it, the fields
    changed and their old and new values (``None`` once erased, or for a field not changed)."""

    pos: int
    event: str
    time: float
    version: int
    fields: tuple[str, ...]
    link: str | None = None
    old: dict[str, Any] | None = None
    new: dict[str, Any] | None = None

    def columns(self) -> dict[str, Any]:
        """The stored columns: ``fields`` comma-joined, one ``old_*``/``new_*`` column per updatable field (the meta
        as JSON text), ``None`` where a value is not stored."""
        out: dict[str, Any] = {"pos": self.pos, "event": self.event, "time": self.time, "version": self.version,
                               "fields": ",".join(self.fields), "link": self.link}
        for side, values in (("old", self.old), ("new", self.new)):
            for name in UPDATABLE:
                value = None if values is None else values.get(name)
                if name == "meta" and value is not None:
                    value = json.dumps(value, ensure_ascii=False, sort_keys=True)
                out[f"{side}_{name}"] = value
        return out

    @classmethod
    def from_columns(cls, row: dict[str, Any]) -> EventRow:
        """The row :meth:`columns` wrote."""
        values: dict[str, dict[str, Any]] = {"old": {}, "new": {}}
        for side in values:
            for name in UPDATABLE:
                value = row.get(f"{side}_{name}")
                if value is not None:
                    values[side][name] = _meta(value, row) if name == "meta" else value
        fields = tuple(name for name in str(row.get("fields") or "").split(",") if name)
        return cls(pos=int(row["pos"]), event=str(row["event"]), time=float(row["time"]),
                   version=int(row["version"]), fields=fields, link=row.get("link") or None,
                   old=values["old"] or None, new=values["new"] or None)


@dataclasses.dataclass(frozen=True, kw_only=True)
class CaseEvent:
    """One event of a case's history (see the module docstring): ``event``, ``time`` (Unix seconds), the
    ``case_id``, the case's ``version`` after it, the ``fields`` it set or changed and, while the case is live (or
    the bank audits), their ``old`` and ``new`` values; ``replaced_by``/``replaces`` link a replace's two cases;
    a ``feedback`` event carries the ``reward`` and the ``selection_id``."""

    event: str
    time: float
    case_id: str
    version: int | None = None
    fields: tuple[str, ...] = ()
    old: dict[str, Any] | None = None
    new: dict[str, Any] | None = None
    replaced_by: str | None = None
    replaces: str | None = None
    reward: float | None = None
    selection_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        """JSON-ready: ``event``, ``time``, ``case_id`` and the other fields that are set."""
        row: dict[str, Any] = {"event": self.event, "time": self.time, "case_id": self.case_id}
        for name in ("version", "fields", "old", "new", "replaced_by", "replaces", "reward", "selection_id"):
            value = getattr(self, name)
            if value is not None and value != ():
                row[name] = list(value) if isinstance(value, tuple) else value
        return row

    def erased(self) -> CaseEvent:
        """The event without values: its kind, time, version, the fields' names and the links (what a deleted
        case's history keeps when the bank does not audit)."""
        return dataclasses.replace(self, old=None, new=None, reward=None, selection_id=None)
