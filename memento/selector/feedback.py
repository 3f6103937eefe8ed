"""Feedback and learning: the selections waiting for their reward, the feedback log, and the soft-Q learner's
updates.

:class:`FeedbackLearning` is the concern of :class:`memento.selector.runtime.Selector` that answers ``feedback``.
A tracked selection waits in the artifact's pending store (:class:`memento.selector.pending.PendingStore`,
``.pending.sqlite``); its feedback takes it out, commits one row to ``feedback.sqlite`` (under the write lock,
before anything is learned) and hands the decision (state vector, chosen case vectors, propensities, reward) to
the agent: into its replay buffer, then, with ``learn=True``, ``config.updates_per_step`` gradient steps once
``config.warmup`` decisions are in. On load, the feedback recorded after the last save is replayed the same
way, in order. With case features, the usage of the cases shown (times shown, reward summed) since the saved
bank is counted here from the feedback log.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from memento.bank import Candidates
from memento.errors import CheckpointError, DimensionError, MementoError, UnknownSelectionError
from memento.learn.policy import Observation
from memento.selector.artifact import FEEDBACK_NAME, FeedbackRow
from memento.selector.core import SelectorCore
from memento.selector.pending import PendingSelection, PendingStore
from memento.types import Selection, check_id, check_reward

__all__ = ["FeedbackLearning"]

logger = logging.getLogger("memento.selector.runtime")  # the Selector's log: one name for all its concerns


class FeedbackLearning(SelectorCore):
    """``feedback`` and the learning behind it, for a :class:`~memento.selector.runtime.Selector` (a mixin over
    :class:`~memento.selector.core.SelectorCore`; see the module docstring). Owns the pending store and the
    usage counts of the feedback since the saved bank."""

    _pending: PendingStore  # selections waiting for their reward (.pending.sqlite)
    _fb_shown: dict[int, int]  # usage since the saved bank, by bank position: from the feedback log
    _fb_reward: dict[int, float]

    def feedback(self, selection_id: str | None, reward: float) -> dict[str, Any]:
        """Record the reward of a selection (committed before this returns) and learn from it when ``learn``.

        Returns ``{"selection_id", "reward", "recorded": True, "updates"}`` (``updates``: learner updates
        done so far). Raises ``UnknownSelectionError`` for an unknown, already answered or expired id and
        ``DataFormatError`` for a reward outside [0, 1].
        """
        reward = check_reward(reward, "reward")
        if selection_id is None:
            raise UnknownSelectionError("selection_id is None: the selection was made with track=False (nothing "
                                        "was recorded); select with track=True to give feedback")
        check_id(selection_id, "selection_id")
        self._check_writable()
        with self._lock:
            self._check_open()
            pending = self._take_pending(selection_id)
            if pending is None:
                raise UnknownSelectionError(f"unknown selection id {selection_id!r}: never issued by this artifact's "
                                            "service, already answered, or expired (pending_ttl_s="
                                            f"{self.config.pending_ttl_s})")
            try:
                seq = self._feedback.append(selection_id=selection_id, reward=reward, mode=pending.mode,
                                            policy_version=pending.policy_version, env=pending.env, ids=pending.ids,
                                            probs=pending.probs, set_prob=pending.set_prob, learned=self.learn,
                                            state=pending.state_D.tobytes())
            except BaseException:
                self._remember(selection_id, pending)  # not recorded: the caller may retry
                raise
            if pending.ids:
                self._learn(pending.state_D, pending.ids, pending.cases_KD, pending.probs, pending.set_prob, reward,
                            seq, pending.policy_version, self.learn)
                self._count_usage(pending.ids, reward)
            return {"selection_id": selection_id, "reward": reward, "recorded": True,
                    "updates": int(self.learner.updates)}

    def _remember(self, selection_id: str, pending: PendingSelection) -> None:
        """Keep a selection until its feedback: committed to the pending store (one SQLite transaction; the
        expired ones and the oldest beyond ``max_pending`` are dropped). A selection ``_take_pending`` handed
        out is put back (its feedback was not recorded)."""
        self._pending.put(selection_id, pending, max_pending=self.config.max_pending,
                          ttl_s=self.config.pending_ttl_s)

    def _take_pending(self, selection_id: str) -> PendingSelection | None:
        """The selection waiting under ``selection_id``, handed out once (``None`` when unknown, answered or
        expired); its row leaves the store after the feedback was committed (see :mod:`memento.selector.pending`)."""
        self._purge_expired()
        return self._pending.take(selection_id, ttl_s=self.config.pending_ttl_s)

    def _purge_expired(self) -> None:
        self._pending.purge(self.config.pending_ttl_s)

    def _usage_at(self, positions_C: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Usage statistics: the saved bank's log plus the feedbacks this artifact recorded."""
        shown_C, reward_C = self._bank.usage_at(positions_C)
        for i, pos in enumerate(np.asarray(positions_C).tolist()):
            shown_C[i] += self._fb_shown.get(pos, 0)
            reward_C[i] += self._fb_reward.get(pos, 0.0)
        return shown_C, reward_C

    def _count_usage(self, ids: Sequence[str], reward: float) -> None:
        if not self._featured or not ids:
            return
        for pos in self._bank.positions_of(list(ids)).tolist():
            self._fb_shown[pos] = self._fb_shown.get(pos, 0) + 1
            self._fb_reward[pos] = self._fb_reward.get(pos, 0.0) + float(reward)

    def _replay_unsaved_feedback(self) -> None:
        """Feed the rows recorded after the last save into the replay buffer (and learner) again, in order."""
        saved = self._saved_rows(FEEDBACK_NAME)
        if self._featured:  # the usage statistics of the saved feedbacks (not in the saved bank's log)
            for row in self._feedback.rows(after=0):
                if row.seq > saved:
                    break
                self._count_usage(list(row.ids), row.reward)
        replayed = 0
        for row in self._feedback.rows(after=saved):
            if not self.read_only:  # a read-only selector takes the learner's published weights instead (sync)
                self._learn_from_row(row)
            self._count_usage(list(row.ids), row.reward)
            self._feedback_seen = max(self._feedback_seen, row.seq)
            replayed += 1
        if replayed:
            logger.info("%s: replayed %d feedback(s) recorded after the last save (%d learner updates now)",
                        self.path, replayed, self.learner.updates)

    def _learn_from_row(self, row: FeedbackRow) -> None:
        if not row.ids:
            return
        if row.state is None:
            raise CheckpointError(f"{self.path / FEEDBACK_NAME}: feedback {row.seq} has no state vector")
        state_D = np.frombuffer(row.state, dtype=np.float32).copy()
        if state_D.shape != (self.dim,):
            raise DimensionError(f"{self.path / FEEDBACK_NAME}: feedback {row.seq} has a state of shape "
                                 f"{state_D.shape}, the selector has dim={self.dim}")
        try:
            cases_KD = self._bank.embeddings(row.ids)
        except MementoError as error:
            raise CheckpointError(f"{self.path / FEEDBACK_NAME}: feedback {row.seq}: {error}") from None
        self._learn(state_D, list(row.ids), cases_KD, row.probs, row.set_prob, row.reward, row.seq,
                    row.policy_version, row.learned)

    def _learn(self, state_D: np.ndarray, ids: list[str], cases_KD: np.ndarray, probs: list[float], set_prob: float,
               reward: float, seq: int, version: int, learned: bool) -> None:
        """One decision, as logged (propensities 1.0 for a greedy choice), to the agent: into its replay buffer
        (as several rows when it holds more than ``k_max`` cases), then its gradient steps when ``learned``.
        Cases deleted since the selection are left out (a decision of deleted cases only is not learned from)."""
        gone = self._bank.is_deleted(list(ids))
        if any(gone):
            keep = [i for i, deleted in enumerate(gone) if not deleted]
            if not keep:
                return
            ids, cases_KD, probs = [ids[i] for i in keep], np.asarray(cases_KD)[keep], [probs[i] for i in keep]
        k = len(ids)
        probs_K = np.asarray(probs, dtype=np.float64)
        positions_K = self._bank.positions_of(list(ids))  # case features and per-case evidence read by position
        candidates = Candidates(ids=list(ids), positions_C=positions_K, scores_C=np.zeros(k),
                                embeddings_CD=np.asarray(cases_KD))
        selection = Selection(ids=list(ids), positions_K=np.arange(k), probs_K=probs_K, set_prob=float(set_prob),
                              candidate_ids=list(ids), probs_C=probs_K, greedy=False)
        self._agent.observe([Observation(state_D=state_D, candidates=candidates, selection=selection, reward=reward,
                                         step=seq, policy_version=version)], learn=learned)

