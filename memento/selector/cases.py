"""Editing the bank: a selector's cases, added, updated, replaced, deleted, listed, searched, counted, and their
history.

:class:`BankEditing` is the concern of :class:`memento.selector.runtime.Selector` behind mem0's verbs over the
bank's (:mod:`memento.bank.history`). ``add_case`` of stored content (same state, action, env and scope) with
other meta updates the stored case's meta in place; ``update_case`` changes a case's action, reward or meta in
place (same id, ``version`` bumped); ``replace_case`` supersedes a case by new content under a new id, keeping
the old case's scope and meta unless given; ``delete_case`` and ``delete_all`` (which needs a scope or filter)
forget cases: they are never selected, listed, searched or read again, and the replay slots that held them, by
their bank positions, are masked. Writes run under the selector's write lock, reads under its read lock; states
are encoded before either is taken. A deletion or replacement is checkpointed by a save in place before it
returns (:class:`memento.selector.persistence.ArtifactPersistence`).
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from memento.bank.history import CaseEvent
from memento.bank.where import Scope, Where, as_scope, parse_filter
from memento.errors import DataFormatError
from memento.selector.artifact import BANK_DB, FEEDBACK_NAME, feedback_with_case
from memento.selector.core import SelectorCore
from memento.selector.selecting import check_select_args
from memento.types import Case, check_id, check_reward, shown

__all__ = ["BankEditing"]


class BankEditing(SelectorCore):
    """The case verbs of a :class:`~memento.selector.runtime.Selector` (a mixin over
    :class:`~memento.selector.core.SelectorCore`; see the module docstring). Holds no state of its own: the
    bank is the selector's."""

    def add_case(self, state: str, action: str, reward: float, env: str | None = None,
                 meta: dict[str, Any] | None = None, *, embedding: np.ndarray | None = None,
                 scope: Scope | Mapping[str, Any] | None = None) -> str:
        """Add a case to the bank (committed before this returns); returns its id.

        ``state`` is encoded with the artifact's encoder unless ``embedding`` (``[D]``) is given. A case
        whose (state, action, env, scope) is already stored is not added again: the stored id is returned, and
        when ``meta`` is given and differs from the stored case's, the stored case takes it in place (its version
        goes up by one, as :meth:`update_case` does).
        ``scope``: whose case it is (``{"user": ..., "agent": ..., "session": ...}``).
        """
        case, state_D = self._new_case(state, action, reward, env, meta, embedding, scope)
        with self._lock:
            self._check_open()
            updates = self._bank.updates_made
            case_id = self._bank.add([case], state_D[None, :])[0]
            if self._bank.updates_made != updates:  # stored content with new meta: updated in place
                self._saved_rows_changed()
            return case_id

    def _new_case(self, state: str, action: str, reward: float, env: str | None, meta: dict[str, Any] | None,
                  embedding: np.ndarray | None, scope: Scope | Mapping[str, Any] | None = None
                  ) -> tuple[Case, np.ndarray]:
        """A case to write and its state vector (``state`` encoded unless ``embedding``), checked and encoded
        outside the lock."""
        owner = as_scope(scope) or Scope()
        case = Case(state=state, action=action, reward=check_reward(reward, "reward"), env=env,
                    meta={} if meta is None else meta, user=owner.user, agent=owner.agent, session=owner.session)
        self._check_writable()
        return case, self._state(state if embedding is None else embedding, "case state")

    def search_cases(self, query: str | np.ndarray, k: int = 10, *, env: str | None = None,
                     scope: Scope | Mapping[str, Any] | None = None,
                     filter: Where | Mapping[str, Any] | None = None,
                     include_global: bool = False) -> list[tuple[Case, float]]:
        """The ``k`` cases nearest to a task text or state vector by cosine, with their similarity (a plain search:
        no policy, no draw, nothing recorded), among the cases of ``scope`` (and, with ``include_global``, those
        without any owner) that match ``filter``."""
        k = check_select_args(k, "greedy", env, False)
        scope, filter = as_scope(scope, include_global=include_global), parse_filter(filter)
        self._check_open()
        state_D = self._state(query)
        with self._rw.read():
            self._check_open()
            found = self._bank.candidates(state_D, k, env=env, scope=scope, filter=filter)
            return list(zip(self._bank.get(found.ids), (float(s) for s in found.scores_C))) if found.ids else []

    def list_cases(self, *, env: str | None = None, scope: Scope | Mapping[str, Any] | None = None,
                   filter: Where | Mapping[str, Any] | None = None, limit: int = 100, offset: int = 0,
                   include_global: bool = False) -> list[Case]:
        """Live cases in position order (deleted ones left out), those of ``env`` and ``scope`` (and, with
        ``include_global``, those without any owner) that match ``filter``, from the ``offset``-th match, at most
        ``limit`` (1..10,000)."""
        if env is not None:
            check_id(env, "env")
        scope, filter = as_scope(scope, include_global=include_global), parse_filter(filter)
        for name, value, top in (("limit", limit, 10_000), ("offset", offset, 2 ** 62)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not (
                    (1 if name == "limit" else 0) <= value <= top):
                raise DataFormatError(f"{name} must be an integer in [{1 if name == 'limit' else 0}, {top}], "
                                      f"got {shown(value)}")
        out: list[Case] = []
        seen = 0
        with self._rw.read():
            self._check_open()
            for case in self._bank.iter_cases():
                if (env is not None and case.env != env) or (scope is not None and not scope.matches(case)) or (
                        filter is not None and not filter.matches(case)):
                    continue
                seen += 1
                if seen > offset:
                    out.append(case)
                    if len(out) >= limit:
                        break
        return out

    def get_case(self, case_id: str) -> Case:
        """The stored case; an unknown id raises ``UnknownCaseError``."""
        if not isinstance(case_id, str) or not case_id:
            raise DataFormatError(f"case id must be a non-empty string, got {case_id!r}")
        with self._rw.read():
            self._check_open()
            return self._bank.get(case_id)

    def _forget_deleted(self, ids: Sequence[str] | None = None) -> int:
        """Mask the replay slots of the deleted cases ``ids`` (all deleted cases when None) by their bank positions
        (:meth:`memento.learn.replay.ReplayBuffer.forget_cases`): never the slots of another case that shares a
        deleted case's text. Slots saved without positions (an older replay save) are matched by the deleted
        cases' state vectors, the first ``D`` columns of the case vectors the buffer stores."""
        ids = self._bank.deleted_ids() if ids is None else list(ids)
        if not ids or not len(self.replay):
            return 0
        return int(self.replay.forget_cases(self._bank.positions_of(ids), self._bank.embeddings(ids)))

    def delete_case(self, case_id: str) -> dict[str, Any]:
        """Forget a case: it is never selected again (committed to the bank, then checkpointed with a save in
        place before this returns, so a restart finds it deleted and ``memento verify`` passes); the replay
        slots holding it are masked. Returns ``{"id", "deleted": True, "replay_slots_masked"}``; an unknown or
        already deleted id raises ``UnknownCaseError``."""
        check_id(case_id, "case id")
        self._check_writable()
        with self._lock:
            self._check_open()
            self._bank.delete([case_id])
            masked = self._forget_deleted([case_id])
            self._save_in_place()
        return {"id": case_id, "deleted": True, "replay_slots_masked": masked}

    def replace_case(self, case_id: str, state: str, action: str, reward: float, env: str | None = None,
                     meta: dict[str, Any] | None = None, *, embedding: np.ndarray | None = None,
                     scope: Scope | Mapping[str, Any] | None = None) -> str:
        """Supersede a case by a new one (one bank transaction, then a save in place, as :meth:`delete_case`):
        the old case is never selected again, the new one can be; returns the new case's id (ids are never
        reused; see :meth:`memento.bank.CaseBank.replace`). ``state`` is encoded unless ``embedding`` is given.
        The new case keeps the old one's owner (``user``/``agent``/``session``) and ``meta`` unless ``scope`` or
        ``meta`` is given (``scope={}``: no owner, ``meta={}``: no meta)."""
        check_id(case_id, "case id")
        self._check_open()
        with self._rw.read():
            old = self._bank.get(case_id)  # unknown or deleted: UnknownCaseError
        if scope is None:
            scope = Scope(user=old.user, agent=old.agent, session=old.session)
        case, state_D = self._new_case(state, action, reward, env, old.meta if meta is None else meta, embedding,
                                       scope)
        with self._lock:
            self._check_open()
            new_id = self._bank.replace(case_id, case, state_D)
            self._forget_deleted([case_id])
            self._save_in_place()
        return new_id

    def update_case(self, case_id: str, *, action: str | None = None, reward: float | None = None,
                    meta: dict[str, Any] | None = None, state: str | None = None) -> Case:
        """Change a case in place (mem0's ``update``; committed before this returns): its ``action``, ``reward``
        and/or ``meta`` (replaced whole). The id, the vector, the scope and the usage stay; ``version`` goes up by
        one and ``updated`` is now (:meth:`memento.bank.CaseBank.update`). A new ``state`` would need a new
        vector: it is refused (use :meth:`replace_case`). Returns the case as stored now; an unknown or deleted id
        raises ``UnknownCaseError``."""
        check_id(case_id, "case id")
        self._check_writable()
        with self._lock:
            self._check_open()
            before = self._bank.get(case_id)
            case = self._bank.update(case_id, action=action, reward=reward, meta=meta, state=state)
            if case.action != before.action and self._agent.featurizer is not None:
                self._agent.featurizer.forget_actions(self._bank.positions_of([case_id]))
            if case.version != before.version:
                self._saved_rows_changed()
        return case

    def _saved_rows_changed(self) -> None:
        """After an update in place: an artifact saved before updates existed (no ``stable_digest`` for its bank in
        the manifest) is saved now, so that a restart before the next save still verifies (see
        :mod:`memento.selector.artifact`, "Checksums")."""
        if "stable_digest" not in self._manifest["live"][BANK_DB]:
            self._save_in_place()

    def history(self, case_id: str) -> list[CaseEvent]:
        """A case's events, oldest first: ``add``, ``update`` (the fields, their old and new values), ``replace``,
        ``delete`` (:meth:`memento.bank.CaseBank.history`) and ``feedback``: each reward reported on a selection
        that showed it (from ``feedback.sqlite``; a selection is logged once its reward is). A deleted or replaced
        case's events keep only their kind, time, version and field names (no values, no rewards) unless the bank
        audits (``load(..., audit=True)``). An unknown id raises ``UnknownCaseError``."""
        check_id(case_id, "case id")
        self._check_open()
        with self._rw.read():
            self._check_open()
            events = self._bank.history(case_id)
            _, rows = feedback_with_case(self.path / FEEDBACK_NAME, case_id)
        erase = events[-1].event in ("delete", "replace") and not self._bank.audit
        shown = [CaseEvent(event="feedback", time=float(row.time), case_id=case_id, reward=float(row.reward),
                           selection_id=row.selection_id) for row in rows]
        if erase:
            shown = [event.erased() for event in shown]
        return sorted(events + shown, key=lambda event: event.time)

    def count(self, *, env: str | None = None, scope: Scope | Mapping[str, Any] | None = None,
              filter: Where | Mapping[str, Any] | None = None, include_global: bool = False) -> int:
        """How many live cases there are of ``env``, in ``scope`` (and, with ``include_global``, without any owner)
        that match ``filter``; all live cases when none is given."""
        if env is not None:
            check_id(env, "env")
        scope, filter = as_scope(scope, include_global=include_global), parse_filter(filter)
        with self._rw.read():
            self._check_open()
            return self._bank.count(env=env, scope=scope, filter=filter)

    def delete_all(self, *, env: str | None = None, scope: Scope | Mapping[str, Any] | None = None,
                   filter: Where | Mapping[str, Any] | None = None, all: bool = False) -> dict[str, Any]:
        """Forget every live case of ``scope`` whose meta match ``filter`` (and of ``env`` when given), as
        :meth:`delete_case` forgets one (one bank transaction, replay slots masked by position, a save in place).
        A scope or a filter is required, so that no one deletes every tenant's cases by accident: ``all=True``
        goes without. Returns ``{"deleted": n, "replay_slots_masked": m}``."""
        if env is not None:
            check_id(env, "env")
        scope, filter = as_scope(scope), parse_filter(filter)
        self._check_writable()
        with self._lock:
            self._check_open()
            ids = self._bank.delete_where(env=env, scope=scope, filter=filter, all=all)
            masked = self._forget_deleted(ids) if ids else 0
            if ids:
                self._save_in_place()
        return {"deleted": len(ids), "replay_slots_masked": masked}
