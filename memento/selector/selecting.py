"""Selecting: a query's candidates from the bank and the soft-Q policy's draw among them.

:class:`CaseSelecting` is the concern of :class:`memento.selector.runtime.Selector` that answers ``select`` and
``select_many``: the query is encoded outside the lock (:mod:`memento.selector.encoding`), the bank returns the
top-C cosine candidates under the read lock, and the agent draws k of them (``mode="sample"``: Gumbel-top-k from
``softmax(Q / alpha)`` with the exact Plackett-Luce probability of the ordered set; ``"greedy"``: the top k by Q).
Draws come from one seeded ``numpy.random.Generator``, taken one call at a time under its own lock. A tracked
selection is handed to :class:`memento.selector.feedback.FeedbackLearning` to wait for its reward.
"""

from __future__ import annotations

import dataclasses
import numbers
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from memento.bank import Candidates
from memento.bank.where import Scope, Where, as_scope, parse_filter
from memento.errors import DataFormatError
from memento.selector.batching import LockedGenerator
from memento.selector.core import SelectorCore
from memento.selector.pending import PendingSelection
from memento.types import Case, check_id, shown

__all__ = ["CaseSelecting", "SelectionMode", "SelectionResult", "check_select_args"]

SelectionMode = Literal["sample", "greedy"]
_MODES = ("sample", "greedy")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SelectionResult:
    """What :meth:`Selector.select` chose.

    - ``selection_id``: a uuid4 hex string; pass it to :meth:`Selector.feedback` with the reward (``None`` for
      a selection made with ``track=False``: nothing was recorded, there is nothing to give feedback on);
    - ``ids`` / ``cases``: the chosen cases in draw order (k of them, or fewer if fewer match);
    - ``probs``: each case's first-draw probability under the policy (1.0 for greedy): how likely the draw
      was, not how relevant the case is;
    - ``scores``: each case's relevance as the policy scored it, ``Q(s, c)`` (a logit: ``sigmoid(Q)``
      estimates the probability that the task succeeds with this case); greedy picks the top k by it;
    - ``similarities``: each case's cosine similarity to the query, as the bank's search returned it;
    - ``set_prob``: the Plackett-Luce probability of drawing exactly this ordered set (1.0 for greedy);
    - ``mode``: ``"sample"`` or ``"greedy"``; ``policy_version``: learner updates made before this choice;
    - ``policy_probs``: each case's probability under the policy, ``softmax(Q / alpha)`` over the candidate set
      (its first-draw probability: ``probs`` of a sampled choice, kept for a greedy one too, whose ``probs``
      are 1.0); in (0, 1], at most 1 summed over the chosen cases, higher for a higher Q.
    """

    selection_id: str | None
    ids: tuple[str, ...]
    cases: tuple[Case, ...]
    probs: tuple[float, ...]
    set_prob: float
    mode: SelectionMode
    policy_version: int
    scores: tuple[float, ...] = ()
    similarities: tuple[float, ...] = ()
    policy_probs: tuple[float, ...] = ()

    def __len__(self) -> int:
        return len(self.ids)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``selection_id``, ``mode``, ``policy_version``, ``set_prob`` and
        ``cases: [{id, state, action, reward, env, prob, score, similarity, meta?, user?, agent?, session?}]``
        (``score``: the Q-network's logit of success, ``similarity``: the cosine to the query; see
        :attr:`scores`)."""
        cases = []
        for i, (case, prob) in enumerate(zip(self.cases, self.probs)):
            row = {"id": case.id, "state": case.state, "action": case.action, "reward": case.reward,
                   "env": case.env, "prob": prob,
                   "score": self.scores[i] if i < len(self.scores) else None,
                   "similarity": self.similarities[i] if i < len(self.similarities) else None}
            row.update(_scope_and_meta(case))
            cases.append(row)
        return {"selection_id": self.selection_id, "mode": self.mode, "policy_version": self.policy_version,
                "set_prob": self.set_prob, "cases": cases}


def _scope_and_meta(case: Case) -> dict[str, Any]:
    """A case's scope fields and meta, those that are set (for JSON answers)."""
    row: dict[str, Any] = {name: value for name, value in zip(("user", "agent", "session"), case.scope)
                           if value is not None}
    if case.meta:
        row["meta"] = case.meta
    return row


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Pending(PendingSelection):
    """A selection waiting for its reward, as ``select`` makes it; the :class:`~memento.selector.pending.PendingStore`
    keeps its :class:`~memento.selector.pending.PendingSelection` fields on disk (``created``: wall clock, from which
    it expires) and hands back a ``PendingSelection``. ``born`` (``time.monotonic()`` at select) is not
    stored: monotonic time does not survive a restart."""

    born: float


class CaseSelecting(SelectorCore):
    """``select`` and ``select_many`` of a :class:`~memento.selector.runtime.Selector` (a mixin over
    :class:`~memento.selector.core.SelectorCore`; see the module docstring). Owns the seeded generator."""

    _rng: np.random.Generator  # every draw of the policy, seeded with the selector's seed
    _rng_lock: threading.Lock  # draws from _rng, one call at a time

    def select(self, query: str | np.ndarray, k: int = 4, mode: SelectionMode = "sample",
               env: str | None = None, *, track: bool = True, scope: Scope | Mapping[str, Any] | None = None,
               filter: Where | Mapping[str, Any] | None = None, include_global: bool = False) -> SelectionResult:
        """Choose ``k`` cases for a task text or state vector (see the module docstring).

        ``track=False`` retrieves only: no pending selection is written (nothing on disk changes) and the
        result's ``selection_id`` is ``None``, so no feedback can follow. The cases chosen, and the draws
        taken from the seeded generator, are the same either way. ``scope`` (``{"user": ..., "agent": ...,
        "session": ...}``) and ``filter`` (on the cases' meta: ``{"topic": {"in": ["geo", "sci"]}}``, AND/OR;
        :mod:`memento.bank.where`) restrict the candidates; one that matches nothing gives an empty result.
        ``include_global``: beside a scope, the cases without any owner (no user, agent, session) are candidates too."""
        k = check_select_args(k, mode, env, track)
        scope, filter = as_scope(scope, include_global=include_global), parse_filter(filter)
        self._check_open()
        state_D = self._state(query)  # text is encoded outside the lock (batched with other callers' when on)
        with self._rw.read():
            self._check_open()
            # parallel readers must see the network in eval mode: q_values puts back the training flag it found,
            # and a learner update leaves it in training mode (dropout), so set it before any reader scores
            if self.learner.qnet.training:
                self.learner.qnet.eval()
            candidates = self._bank.candidates(state_D, max(self.config.candidates, k), env=env, scope=scope,
                                               filter=filter)
            return self._choose(state_D, candidates, k, mode, env, track)

    def select_many(self, queries: Sequence[str] | np.ndarray, k: int = 4, mode: SelectionMode = "sample",
                    env: str | None = None, *, track: bool = True, scope: Scope | Mapping[str, Any] | None = None,
                    filter: Where | Mapping[str, Any] | None = None,
                    include_global: bool = False) -> list[SelectionResult]:
        """:meth:`select` for several tasks: the texts are encoded in one ``encode`` call and the candidates of
        all of them found in one bank search; each result has its own pending selection id (feedback each
        one). Greedy results equal ``select`` called on each query in turn; sampled ones draw from the same
        generator in query order. ``queries``: texts, or a ``[B, D]`` array of state vectors. ``track``, ``scope``,
        ``filter``, ``include_global``: as for :meth:`select`."""
        k = check_select_args(k, mode, env, track)
        scope, filter = as_scope(scope, include_global=include_global), parse_filter(filter)
        if isinstance(queries, str):
            raise DataFormatError("select_many takes a list of queries; for one text use select()")
        self._check_open()
        states_BD = self._states(queries)
        if not len(states_BD):
            return []
        with self._rw.read():
            self._check_open()
            if self.learner.qnet.training:
                self.learner.qnet.eval()
            width = max(self.config.candidates, k)
            scores_BC, positions_BC = self._bank.search_positions(states_BD, width, env=env, scope=scope,
                                                                  filter=filter)
            results = []
            for b, state_D in enumerate(states_BD):
                valid = positions_BC[b] >= 0
                positions_C = positions_BC[b][valid]
                candidates = Candidates(ids=self._bank.ids_at(positions_C), positions_C=positions_C,
                                        scores_C=scores_BC[b][valid],
                                        embeddings_CD=self._bank.embeddings_at(positions_C))
                results.append(self._choose(state_D, candidates, k, mode, env, track))
            return results

    def _choose(self, state_D: np.ndarray, candidates: Candidates, k: int, mode: SelectionMode,
                env: str | None, track: bool = True) -> SelectionResult:
        """One selection over a candidate set, remembered as pending when ``track`` (for :meth:`select` and
        :meth:`select_many`; the caller holds the read lock and has put the Q-network in eval mode)."""
        version = self._agent.version
        scores: tuple[float, ...] = ()
        similarities: tuple[float, ...] = ()
        policy_probs: tuple[float, ...] = ()
        if len(candidates) == 0:
            ids: list[str] = []
            probs: list[float] = []
            set_prob = 1.0
            cases_KD = np.zeros((0, self.dim), dtype=np.float32)
        else:
            rng: Any = LockedGenerator(self._rng, self._rng_lock)  # the same draws, one call at a time
            selection, q_K = self._agent.select_scored(state_D, candidates, k, rng=rng, greedy=mode == "greedy")
            ids = list(selection.ids)
            policy_probs = tuple(float(p) for p in selection.probs_K)  # softmax(Q / alpha) over the candidates
            probs = [1.0] * len(ids) if mode == "greedy" else list(policy_probs)
            set_prob = float(selection.set_prob)
            rows_K = candidates.rows_of(ids)
            cases_KD = candidates.embeddings_CD[rows_K]
            scores = tuple(float(q) for q in q_K)  # Q of the forward pass that chose them
            similarities = tuple(float(c) for c in np.asarray(candidates.scores_C, dtype=np.float64)[rows_K])
        cases = tuple(self._bank.get(ids)) if ids else ()
        selection_id = uuid.uuid4().hex if track else None
        if selection_id is not None:
            self._remember(selection_id, _Pending(state_D=state_D, ids=ids, cases_KD=cases_KD, probs=probs,
                                                  set_prob=set_prob, mode=mode, policy_version=version, env=env,
                                                  born=time.monotonic()))
        return SelectionResult(selection_id=selection_id, ids=tuple(ids), cases=cases, probs=tuple(probs),
                               set_prob=set_prob, mode=mode, policy_version=version, scores=scores,
                               similarities=similarities, policy_probs=policy_probs)


def check_select_args(k: Any, mode: Any, env: Any, track: Any) -> int:
    """The arguments :meth:`Selector.select` and :meth:`Selector.select_many` share, checked; returns ``k``."""
    if isinstance(k, (bool, np.bool_)) or not isinstance(k, numbers.Integral) or k < 1:
        raise DataFormatError(f"k must be a positive integer, got {shown(k)}")
    if mode not in _MODES:
        raise DataFormatError(f"mode must be one of {_MODES}, got {shown(mode)}")
    if env is not None:
        check_id(env, "env")
    if not isinstance(track, (bool, np.bool_)):
        raise DataFormatError(f"track must be true or false, got {type(track).__name__}")
    return int(k)

