"""Case features: what a Q-network with ``QNetConfig.features="case"`` sees of a case besides its state.

A case vector is ``[state embedding (D) | action embedding (D) | scalars (CASE_SCALARS)]`` (``case_dim`` =
2D + CASE_SCALARS numbers), where the scalars are

- the case's **stored reward** (the outcome of its own task: not the same as its use as a demonstration);
- its **usage**: the posterior mean of the reward it earned when shown, ``(reward_sum + 1) / (shown + 2)`` (a
  Beta(1, 1) prior for 0/1 rewards) minus its prior mean 0.5, and ``log(1 + shown)``, from the bank's usage log
  (updated every step: :meth:`memento.bank.Bank.record_usage`). Both are 0 for a case never shown, and
  the Q-network's weights on them start at 0, so a network trained offline (where no case has been shown)
  keeps them at 0 and its ranking does not drift as the usage statistics grow, until online learning uses them;
- its **kind**, one-hot over :data:`memento.config.CASE_KINDS` and "other".

The cosine similarity to the state is not part of the vector (it depends on the state); the Q-network computes
it from the first D numbers. The vector of a case depends only on the bank, so the replay buffer stores it as
it was when the case was chosen.

The action embedding is the encoder's vector of ``case.action``, computed once per case and stored in the bank
(:meth:`memento.bank.Bank.set_action_embeddings`), so an exported selector carries it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import numpy as np

from memento.bank import Candidates
from memento.bank.protocol import Bank
from memento.config import CASE_KINDS, CASE_SCALARS
from memento.errors import DimensionError

__all__ = ["CaseFeaturizer", "case_scalars"]

logger = logging.getLogger(__name__)

Encode = Callable[[list[str]], np.ndarray]
"""``encode(texts) -> (N, D)`` float32 unit vectors (the run's encoder)."""

_KIND_INDEX = {kind: i for i, kind in enumerate(CASE_KINDS)}


def case_scalars(rewards_C: np.ndarray, shown_C: np.ndarray, reward_sum_C: np.ndarray, kinds: list[str]) -> np.ndarray:
    """The ``(C, CASE_SCALARS)`` float32 scalars of C cases (see the module docstring)."""
    c = len(kinds)
    out_CS = np.zeros((c, CASE_SCALARS), dtype=np.float32)
    out_CS[:, 0] = np.asarray(rewards_C, dtype=np.float64)
    shown_C = np.asarray(shown_C, dtype=np.float64)
    out_CS[:, 1] = (np.asarray(reward_sum_C, dtype=np.float64) + 1.0) / (shown_C + 2.0) - 0.5
    out_CS[:, 2] = np.log1p(shown_C)
    for i, kind in enumerate(kinds):
        out_CS[i, 3 + _KIND_INDEX.get(kind, len(CASE_KINDS))] = 1.0
    return out_CS


UsageFn = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]
"""``usage_at(positions_C) -> (shown_C, reward_sum_C)``."""


class CaseFeaturizer:
    """Case vectors for the Q-network from a bank (and the encoder, for action embeddings not stored yet).

    ``usage_at`` replaces the bank's usage log as the source of the usage statistics, and ``store=False``
    keeps newly encoded action vectors in memory instead of writing them to the bank: a served selector
    uses both, so its checksummed bank file is only ever appended to (its usage comes from the saved bank
    plus its own feedback log).
    """

    def __init__(self, bank: Bank, encode: Encode, *, usage_at: UsageFn | None = None, store: bool = True):
        self.bank = bank
        self.encode = encode
        self.usage_at = usage_at if usage_at is not None else bank.usage_at
        self.store = store
        self._memory: dict[int, np.ndarray] = {}

    @property
    def case_dim(self) -> int:
        return 2 * self.bank.dim + CASE_SCALARS

    def action_embeddings(self, positions_C: np.ndarray, actions: list[str]) -> np.ndarray:
        """The action vectors at bank ``positions_C``; missing ones are encoded and stored in the bank."""
        emb_CD, have_C = self.bank.action_embeddings_at(positions_C)
        for i in np.flatnonzero(~have_C):
            vector = self._memory.get(int(positions_C[i]))
            if vector is not None:
                emb_CD[i], have_C[i] = vector, True
        missing = np.flatnonzero(~have_C)
        if missing.size:
            unique, first, inverse = np.unique(positions_C[missing], return_index=True, return_inverse=True)
            new_ND = np.asarray(self.encode([actions[missing[j]] for j in first]), dtype=np.float32)
            if new_ND.shape != (len(unique), self.bank.dim):
                raise DimensionError(f"case features: the encoder gave action vectors of shape {new_ND.shape}, "
                                     f"expected ({len(unique)}, {self.bank.dim})")
            norms_N1 = np.linalg.norm(new_ND, axis=1, keepdims=True)
            new_ND = new_ND / np.where(norms_N1 > 0, norms_N1, 1.0)
            if self.store:
                self.bank.set_action_embeddings(unique, new_ND)
            else:
                self._memory.update({int(p): new_ND[j].copy() for j, p in enumerate(unique)})
            emb_CD[missing] = new_ND[inverse.reshape(-1)]
            logger.debug("case features: encoded %d action(s)", len(unique))
        return emb_CD

    def forget_actions(self, positions_C: np.ndarray) -> None:
        """Drop the action vectors kept in memory for ``positions_C`` (their action changed: encoded again on need;
        the bank drops the ones it stores itself)."""
        for pos in np.asarray(positions_C, dtype=np.int64).reshape(-1).tolist():
            self._memory.pop(int(pos), None)

    def case_vectors(self, candidates: Candidates) -> np.ndarray:
        """``(C, 2D + CASE_SCALARS)`` float32: each candidate's state embedding, action embedding and scalars."""
        if not len(candidates):
            return np.zeros((0, self.case_dim), dtype=np.float32)
        cases = self.bank.get(list(candidates.ids))
        positions_C = np.asarray(candidates.positions_C, dtype=np.int64)
        action_CD = self.action_embeddings(positions_C, [case.action for case in cases])
        shown_C, reward_sum_C = self.usage_at(positions_C)
        rewards_C = np.asarray([case.reward if math.isfinite(case.reward) else 0.0 for case in cases])
        scalars_CS = case_scalars(rewards_C, shown_C, reward_sum_C, [case.kind for case in cases])
        emb_CD = np.asarray(candidates.embeddings_CD, dtype=np.float32)
        return np.ascontiguousarray(np.concatenate([emb_CD, action_CD, scalars_CS], axis=1), dtype=np.float32)
