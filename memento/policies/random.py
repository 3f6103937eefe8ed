"""The uniform policy: every candidate equally likely, ``k`` drawn without replacement.

The floor any learned selector must beat. A uniform policy has no arg-max, so ``greedy=True``
still samples (the returned ``Selection.greedy`` is False and ``set_prob`` is the exact
probability of the ordered draw, ``(C - K)! / C!``).

The module is the whole policy: its config (:class:`RandomConfig`), the policy (:class:`RandomPolicy`), its factory
entry (:func:`build`) and its run defaults (the class's own defaults in every run), declared in :data:`SPEC`.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import numpy as np

from memento.bank import Candidates
from memento.config import check_bools, check_choice
from memento.errors import ConfigError
from memento.learn.policy import (
    PolicyContext,
    RewardFn,
    StaticPolicy,
    check_candidates,
    check_k,
    gumbel_top_k,
    make_selection,
    positive_pool,
)
from memento.policies.spec import PolicySpec
from memento.types import Selection

__all__ = ["SPEC", "RandomConfig", "RandomPolicy", "build"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class RandomConfig:
    """The uniform policy. ``positive_only``: uniform among the candidates with stored reward > 0 only (all of
    them when none is): the floor for a learned choice within the pool of Memento's positive-only retrieval."""

    kind: Literal["random"] = dataclasses.field(default="random", metadata={"help": (
        "the policy: uniform over the candidates")})
    positive_only: bool = dataclasses.field(default=False, metadata={"help": (
        "uniform among the candidates with stored reward > 0 only (all of them when none is)")})

    def __post_init__(self) -> None:
        check_choice(self, "kind", Literal["random"])
        check_bools(self, "positive_only")


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


def build(config: RandomConfig, context: PolicyContext) -> RandomPolicy:
    """The factory entry: a :class:`RandomPolicy` (``context.reward_of`` gives the stored rewards ``positive_only``
    needs)."""
    return RandomPolicy(positive_only=config.positive_only, reward_of=context.reward_of)


SPEC = PolicySpec(kind="random", config=RandomConfig, build=build, loop_default=lambda gamma: RandomConfig(),
                  regret_default=RandomConfig)
