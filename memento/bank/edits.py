"""The bank front's writes (:class:`FrontEdits`, a base of :class:`memento.bank.front.BankFront`): ``add`` with its
ids and de-duplication, ``update``/``update_reward``, the tombstones of ``delete``/``replace``/``delete_all``,
``truncate``, and the scope and metadata-filter queries (``count``, ``ids_where``) those deletions use; over
:class:`FrontCore`, the state and checks every operation shares. Each operation is documented once, in
:class:`memento.bank.protocol.Bank`.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from memento.bank.history import UPDATABLE, EventRow
from memento.bank.parts import (
    FeatureStore,
    Filter,
    NewRow,
    RowStore,
    VectorIndex,
    case_meta_json,
    meta_text,
    validate_embeddings,
)
from memento.bank.where import Scope, Where
from memento.config import BankConfig
from memento.errors import BankError, DataFormatError, DimensionError, UnknownCaseError
from memento.types import Case, check_reward, check_text, shown

__all__ = ["FrontCore", "FrontEdits"]

logger = logging.getLogger("memento.bank.front")  # the front's log lines, wherever its code lives


class FrontCore:
    """The bank front's state (its three parts, its open/read-only state, the usage and evidence totals loaded
    so far) and the checks every operation shares."""

    def __init__(self, rows: RowStore, index: VectorIndex, features: FeatureStore, *, config: BankConfig,
                 uid: str, read_only: bool = False, audit: bool = False):
        if not isinstance(audit, bool):
            raise DataFormatError(f"audit must be true or false, got {shown(audit)}")
        self._rows = rows
        self._index = index
        self._features = features
        self.config = config
        self.uid = uid
        self.read_only = read_only
        self.audit = audit  # a deleted case's history keeps its values (off: only kinds, times and field names)
        self.updates_made = 0  # updates in place by this process (update, add with new meta)
        features.keep_values = audit
        self._count = rows.count()
        self._closed = False
        self._usage: tuple[np.ndarray, np.ndarray] | None = None  # (shown_N, reward_sum_N), loaded on first need
        self._evidence: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # (count_N, weight_N, value_N)

    # ------------------------------------------------------------------ basics

    @property
    def path(self) -> Any:
        return self._rows.name

    @property
    def dim(self) -> int:
        return self.config.dim

    def __len__(self) -> int:
        return self._count

    def _check_open(self) -> None:
        if self._closed:
            raise BankError(f"{self.path}: bank is closed")

    def _check_writable(self) -> None:
        self._check_open()
        if self.read_only:
            raise BankError(f"{self.path}: bank is open read-only (another process writes it)")

    def _positions(self, ids: Sequence[str]) -> np.ndarray:
        ids = list(ids)
        found = self._rows.find(ids)
        missing = [i for i in ids if i not in found]
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise UnknownCaseError(f"{self.path}: unknown case id {missing[0]!r}{more}")
        return np.array([found[i] for i in ids], dtype=np.int64)

    def _check_positions(self, positions: Sequence[int] | np.ndarray) -> np.ndarray:
        positions_N = np.asarray(positions, dtype=np.int64).reshape(-1)
        if positions_N.size and (positions_N.min() < 0 or positions_N.max() >= self._count):
            raise UnknownCaseError(f"{self.path}: positions must lie in [0, {self._count}); "
                                   f"got min={int(positions_N.min())}, max={int(positions_N.max())}")
        return positions_N

    def _check_text(self, case: Case, i: int) -> None:
        """A backend's limits on a case's fields (none by default)."""


    def _grown(self, columns: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
        """Per-position totals grown with zeros to the bank's size (the cases added since were never shown or
        labelled)."""
        grow = self._count - columns[0].shape[0]
        return columns if grow <= 0 else tuple(np.concatenate([c, np.zeros(grow, dtype=c.dtype)]) for c in columns)

    def _load_usage(self) -> tuple[np.ndarray, np.ndarray]:
        if self._usage is None:
            self._usage = self._features.totals(self._count)
        self._usage = self._grown(self._usage)  # type: ignore[assignment]
        return self._usage

    def _load_evidence(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._evidence is None:
            self._evidence = self._features.evidence_totals(self._count)
        self._evidence = self._grown(self._evidence)  # type: ignore[assignment]
        return self._evidence


class FrontEdits(FrontCore):
    """The writes of the bank front (see the module docstring)."""

    # ------------------------------------------------------------------ writes

    def add(self, cases: Sequence[Case], embeddings: Any, *, allow_duplicates: bool = False,
            update_meta: bool = True) -> list[str]:
        self._check_writable()
        cases = list(cases)
        for i, case in enumerate(cases):
            if not isinstance(case, Case):
                raise DataFormatError(f"item {i} is {type(case).__name__}, expected memento.Case")
        if not cases:
            if np.asarray(embeddings).size:
                raise DimensionError(f"embeddings have shape {np.asarray(embeddings).shape} for 0 cases")
            return []
        emb_ND = validate_embeddings(embeddings, len(cases), self.dim)
        for i, case in enumerate(cases):
            self._check_text(case, i)
        hashes = [c.content_hash for c in cases]
        with self._rows.transaction("cases violate"):
            out, planned = self._plan_ids(cases, hashes, allow_duplicates=allow_duplicates, warn=True)
            new_rows = self._new_rows(cases, hashes, emb_ND, planned)
            self._rows.insert(new_rows)
            updated = self._take_new_meta(cases, out, planned) if update_meta and not allow_duplicates else 0
        self._stored(new_rows)
        skipped = len(cases) - len(new_rows)
        if skipped:
            logger.debug("%s: skipped %d duplicate case(s)%s", self.path, skipped,
                         f", {updated} of them with new meta (updated in place)" if updated else "")
        return out

    def _take_new_meta(self, cases: Sequence[Case], out: Sequence[str], planned: Sequence[tuple[int, str]]) -> int:
        """The stored cases that ``cases`` repeat with other, non-empty meta take it (in the caller's transaction;
        the last of a call wins); returns how many were updated."""
        new_ids = {case_id for _, case_id in planned}
        wanted: dict[str, dict[str, Any]] = {}
        for case, case_id in zip(cases, out):
            if case.meta and case_id not in new_ids:
                wanted[case_id] = case.meta
        if not wanted:
            return 0
        found = self._rows.find(list(wanted))
        stored = self._rows.cases_at([found[case_id] for case_id in wanted])
        now = time.time()
        updated = 0
        for case_id, old in zip(wanted, stored):
            if meta_text(wanted[case_id]) != meta_text(old.meta):
                self._apply_update(found[case_id], old, {"meta": wanted[case_id]}, now)
                updated += 1
        return updated

    def _apply_update(self, position: int, old: Case, changes: dict[str, Any], now: float) -> Case:
        """Write ``changes`` (of :data:`memento.bank.history.UPDATABLE` fields) to the case ``old`` at
        ``position`` with its version bumped and an ``update`` event, in the caller's transaction; returns the new
        case. Content that another live case holds already is refused (``DataFormatError``)."""
        names = tuple(name for name in UPDATABLE if name in changes)
        new = dataclasses.replace(old, **{name: changes[name] for name in names}, version=old.version + 1,
                                  updated=now)
        self._check_text(new, 0)
        digest = new.content_hash
        if digest != old.content_hash:
            clash = self._rows.live_by_hash([digest], None).get(digest)
            if clash is not None and clash != old.id:
                raise DataFormatError(f"update: case {old.id!r} would then hold the content of case {clash!r}; "
                                      "delete one of them instead")
        self._rows.update(position, new, digest)
        self.updates_made += 1
        self._features.record_events([EventRow(pos=position, event="update", time=now, version=new.version,
                                               fields=names, old={name: getattr(old, name) for name in names},
                                               new={name: getattr(new, name) for name in names})])
        if "action" in names:  # the action's vector (a case feature) is computed again on need
            self._features.drop_actions([position])
        return new

    def _new_rows(self, cases: Sequence[Case], hashes: Sequence[str], emb_ND: np.ndarray,
                  planned: Sequence[tuple[int, str]]) -> list[NewRow]:
        now = time.time()
        emb_MD = emb_ND[[i for i, _ in planned]]  # one block: stack_vectors hands it on without copying the rows
        return [NewRow(pos=pos, id=case_id, hash=hashes[i], case=cases[i], meta=case_meta_json(cases[i]),
                       created=now if cases[i].created is None else float(cases[i].created), vector_D=emb_MD[row])
                for row, (pos, (i, case_id)) in enumerate(enumerate(planned, start=self._count))]

    def _stored(self, new_rows: Sequence[NewRow]) -> None:
        """After the rows were stored: the count and the index."""
        if new_rows:
            self._count += len(new_rows)
            self._index.added(new_rows)

    def _plan_ids(self, cases: Sequence[Case], hashes: Sequence[str], *, allow_duplicates: bool, warn: bool,
                  dead: int | None = None) -> tuple[list[str], list[tuple[int, str]]]:
        """The id each case gets and the ``(input index, id)`` of those to insert (the others repeat stored
        content); an id used twice, or already used by another stored case, raises ``DataFormatError``.
        ``dead``: a position that counts as deleted (``replace`` plans before it tombstones)."""
        out: list[str] = [""] * len(cases)
        existing = {} if allow_duplicates else self._rows.live_by_hash(list(dict.fromkeys(hashes)), dead)
        derived = {f"c{digest[:16]}" for case, digest in zip(cases, hashes) if case.id is None}
        # a derived id already stored is a deleted case's (never reused) or one whose content an update changed
        # (its id names its first content): content that reaches it anew gets an id of its own
        gone = set(self._rows.find(sorted(derived)))
        planned: list[tuple[int, str]] = []
        for i, (case, digest) in enumerate(zip(cases, hashes)):
            if not allow_duplicates and digest in existing:
                out[i] = existing[digest]
                if warn and case.id is not None and case.id != existing[digest]:
                    logger.warning("%s: case %r duplicates stored case %r; kept the stored one",
                                   self.path, case.id, existing[digest])
                continue
            position = self._count + len(planned)
            case_id = case.id if case.id is not None else (
                f"c{digest[:16]}" if not allow_duplicates else f"c{digest[:16]}-{position}")
            if case.id is None and case_id in gone:
                case_id = f"c{digest[:16]}-{position}"  # a deleted or updated case's id is never reused
            existing[digest] = case_id
            out[i] = case_id
            planned.append((i, case_id))
        self._check_planned(planned, free=derived - gone)
        return out, planned

    def _check_planned(self, planned: Sequence[tuple[int, str]], free: set[str] | frozenset[str] = frozenset()) -> None:
        """``free``: ids looked up already in this transaction and not stored (not looked up again)."""
        seen: set[str] = set()
        for i, case_id in planned:
            if case_id in seen:
                raise DataFormatError(f"case {i}: id {case_id!r} is used twice in this call")
            seen.add(case_id)
        taken = self._rows.find([case_id for _, case_id in planned if case_id not in free])
        for i, case_id in planned:
            if case_id in taken:
                raise DataFormatError(f"case {i}: id {case_id!r} is already used by another case")

    def check_ids(self, cases: Sequence[Case], *, allow_duplicates: bool = False) -> None:
        self._check_open()
        cases = list(cases)
        self._plan_ids(cases, [c.content_hash for c in cases], allow_duplicates=allow_duplicates, warn=False)

    def update_reward(self, case_id: str, reward: float) -> None:
        self.update(case_id, reward=check_reward(reward, "reward"))

    def update(self, case_id: str, *, action: str | None = None, reward: float | None = None,
               meta: dict[str, Any] | None = None, state: str | None = None) -> Case:
        self._check_writable()
        if action is None and reward is None and meta is None and state is None:
            raise DataFormatError("update: give at least one of action, reward or meta")
        (position,) = self._live_positions([case_id], "update").tolist()
        old = self._rows.cases_at([position])[0]
        if state is not None and state != old.state:
            raise DataFormatError(f"update cannot change the state of case {case_id!r} (its vector would change): "
                                  "replace the case instead (replace_case, PUT /v1/cases/{id})")
        changes: dict[str, Any] = {}
        if action is not None and check_text(action, "action") != old.action:
            changes["action"] = action
        if reward is not None and check_reward(reward, "reward") != old.reward:
            changes["reward"] = check_reward(reward, "reward")
        if meta is not None:
            dataclasses.replace(old, meta=meta)  # checked as a case's meta is
            if meta_text(meta) != meta_text(old.meta):
                changes["meta"] = meta
        if not changes:
            return old
        with self._rows.transaction("the update violates"):
            new = self._apply_update(position, old, changes, time.time())
        logger.info("%s: updated case %r (%s; version %d)", self.path, case_id, ", ".join(changes), new.version)
        return new

    # ------------------------------------------------------------------ forgetting (tombstones)

    def _live_positions(self, ids: Sequence[str], what: str) -> np.ndarray:
        ids = list(ids)
        for i, case_id in enumerate(ids):
            if not isinstance(case_id, str) or not case_id:
                raise DataFormatError(f"{what}: case id {i} must be a non-empty string, got {case_id!r}")
        if len(set(ids)) != len(ids):
            raise DataFormatError(f"{what}: a case id is given twice")
        positions_M = self._positions(ids)
        gone = np.isin(positions_M, self._rows.deleted_positions())
        if gone.any():
            raise UnknownCaseError(f"{self.path}: case {ids[int(np.flatnonzero(gone)[0])]!r} was already deleted")
        return positions_M

    def _after_tombstone(self, positions_M: np.ndarray) -> None:
        # a deleted case was never shown nor labelled, as far as the statistics go
        for loaded, load in ((self._usage, self._load_usage), (self._evidence, self._load_evidence)):
            if loaded is not None:
                for column_N in load():  # grown to the cases added since
                    column_N[positions_M] = 0

    def delete(self, ids: str | Sequence[str]) -> int:
        self._check_writable()
        wanted = [ids] if isinstance(ids, str) else list(ids)
        if not wanted:
            return 0
        positions_M = self._live_positions(wanted, "delete")
        with self._rows.transaction("the deletion violates"):
            self._rows.tombstone(positions_M.tolist(), wanted, None)
            self._features.forget(positions_M.tolist())
        self._after_tombstone(positions_M)
        logger.info("%s: deleted %d case(s)", self.path, len(wanted))
        return len(wanted)

    def replace(self, case_id: str, case: Case, embedding: Any) -> str:
        self._check_writable()
        if not isinstance(case, Case):
            raise DataFormatError(f"replace: expected a memento.Case, got {type(case).__name__}")
        emb_1D = validate_embeddings(embedding, 1, self.dim)
        self._check_text(case, 0)
        positions_M = self._live_positions([case_id], "replace")
        digest = case.content_hash
        with self._rows.transaction("the new case violates"):
            out, planned = self._plan_ids([case], [digest], allow_duplicates=False, warn=True,
                                          dead=int(positions_M[0]))
            new_rows = self._new_rows([case], [digest], emb_1D, planned)
            self._rows.insert(new_rows)
            self._features.record_events([EventRow(pos=row.pos, event="add", time=row.created, version=1,
                                                   fields=(), link=case_id) for row in new_rows])
            self._rows.tombstone(positions_M.tolist(), [case_id], out[0])
            self._features.forget(positions_M.tolist())
        self._stored(new_rows)
        self._after_tombstone(positions_M)
        logger.info("%s: replaced case %r by %r", self.path, case_id, out[0])
        return out[0]

    def truncate(self, n: int) -> int:
        self._check_writable()
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 0 <= n <= self._count:
            raise DataFormatError(f"truncate: n must be an integer in [0, {self._count}], got {n!r}")
        removed = self._count - int(n)
        if removed == 0:
            return 0
        with self._rows.transaction("the truncation violates"):
            self._rows.truncate(int(n))
            self._features.truncate(int(n))
        self._usage = self._evidence = None
        self._count = int(n)
        self._index.truncate(int(n))
        logger.info("%s: truncated to %d case(s) (%d removed)", self.path, n, removed)
        return removed

    # ------------------------------------------------------------------ scopes and metadata filters

    def count(self, *, env: str | None = None, kind: str | None = None,
              scope: Scope | Mapping[str, Any] | None = None, filter: Where | Mapping[str, Any] | None = None) -> int:
        self._check_open()
        return int(self._rows.live_positions(Filter.of(env, kind, False, scope, filter), self._count).size)

    def ids_where(self, *, env: str | None = None, kind: str | None = None,
                  scope: Scope | Mapping[str, Any] | None = None,
                  filter: Where | Mapping[str, Any] | None = None) -> list[str]:
        self._check_open()
        return self._rows.ids_at(self._rows.live_positions(Filter.of(env, kind, False, scope, filter),
                                                           self._count).tolist())

    def delete_where(self, *, env: str | None = None, scope: Scope | Mapping[str, Any] | None = None,
                     filter: Where | Mapping[str, Any] | None = None, all: bool = False) -> list[str]:
        self._check_writable()
        if not isinstance(all, (bool, np.bool_)):
            raise DataFormatError(f"delete_all: all must be true or false, got {shown(all)}")
        where = Filter.of(env, None, False, scope, filter)
        if where.scope is None and where.meta is None and not all:
            raise DataFormatError("delete_all needs a scope (user, agent, session) or a metadata filter, so that no "
                                  "one deletes every tenant's cases by accident; pass all=True to delete every case")
        ids = self.ids_where(env=env, scope=where.scope, filter=where.meta)
        if ids:
            self.delete(ids)
        return ids

    def delete_all(self, *, env: str | None = None, scope: Scope | Mapping[str, Any] | None = None,
                   filter: Where | Mapping[str, Any] | None = None, all: bool = False) -> int:
        return len(self.delete_where(env=env, scope=scope, filter=filter, all=all))
