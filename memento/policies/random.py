"""The uniform policy: every candidate equally likely, ``k`` drawn without replacement.

The floor any learned selector must beat. A uniform policy has no arg-max, so ``greedy=True``
still samples (the returned ``Selection.greedy`` is False and ``set_prob`` is the exact
probability of the ordered draw, ``(C - K)! / C!``).
"""

from __future__ import annotations

import numpy as np

from memento.bank import Candidates
from memento.errors import ConfigError
from memento.learn.policy import (
    RewardFn,
    StaticPolicy,
    check_candidates,
    check_k,
    gumbel_top_k,
    make_selection,
    positive_pool,
)
from memento.types import Selection

__all__ = ["RandomPolicy"]


class RandomPolicy(StaticPolicy):
    """Uniform over the candidate set (see the module docstring); with ``positive_only``, uniform over the
    candidates whose stored reward (``reward_of(ids)``) is > 0, all of them when none is."""

    def __init__(self, *, positive_only: bool = False, reward_of: RewardFn | None = None):
        if positive_only and reward_of is None:
            raise ConfigError("RandomConfig.positive_only=True needs the bank's rewards (PolicyContext.reward_of)")
        self.positive_only = positive_only
        self.reward_of = reward_of


    def probs(self, state_D: np.ndarray, candidates: Candidates) -> np.ndarray:
        check_candidates(state_D, candidates)
        n = len(candidates)
        return np.full(n, 1.0 / n, dtype=np.float64)

    def select(self, state_D: np.ndarray, candidates: Candidates, k: int, *, rng: np.random.Generator,
               greedy: bool = False) -> Selection:
        if self.positive_only:
            candidates = positive_pool(candidates, self.reward_of)
        probs_C = self.probs(state_D, candidates)
        k = check_k(k, len(candidates))
        order_K = gumbel_top_k(np.zeros(len(candidates)), k, rng)
        return make_selection(candidates, probs_C, order_K, greedy=False)

    def __repr__(self) -> str:
        return f"RandomPolicy(positive_only={self.positive_only})" if self.positive_only else "RandomPolicy()"
