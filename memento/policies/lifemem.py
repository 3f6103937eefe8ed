"""LifeMem's environment-aligned retrieval: similar trajectories of the same environment and their skills.

Over an expanded candidate set (:class:`memento.systems.expand.ItemCandidates`; the game loop gives candidates
of the state's own environment, ``GameLoopConfig.same_env``, so the format and command syntax stay valid) the
policy takes the ``k_trajectories`` most similar raw cases with stored reward > 0 (all raw cases when none is)
and, with ``skills``, the skills of their clusters (each once: skills of a cluster two trajectories share are
shown once), cut to the decision's K items. Deterministic (``greedy``, ``set_prob`` 1); it does not learn.

The module is the whole policy: its config (:class:`LifeMemRetrievalConfig`), the policy (:class:`LifeMemPolicy`),
its factory entry (:func:`build`) and its run defaults (the class's own defaults in every run), declared in
:data:`SPEC`.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import numpy as np

from memento.bank import Candidates
from memento.config import MAX_K, check_bools, check_choice, check_int
from memento.learn.policy import PolicyContext, RewardFn
from memento.policies.cfgm import ItemRetrievalPolicy, base_rows, linked_rows
from memento.policies.spec import PolicySpec

__all__ = ["SPEC", "LifeMemPolicy", "LifeMemRetrievalConfig", "build"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class LifeMemRetrievalConfig:
    """LifeMem's environment-aligned retrieval (``memento.policies.lifemem``): the ``k_trajectories`` most similar
    trajectories (the loop gives candidates of the same environment) and, with ``skills``, the deduplicated
    skills of their clusters; at most the decision's K items in all."""

    kind: Literal["lifemem"] = dataclasses.field(default="lifemem", metadata={"help": (
        "the policy: LifeMem's environment-aligned retrieval (similar trajectories and their clusters' skills)")})
    k_trajectories: int = dataclasses.field(default=2, metadata={"help": "the most similar trajectories taken"})
    skills: bool = dataclasses.field(default=True, metadata={"help": (
        "also take the skills of their clusters (each once)")})

    def __post_init__(self) -> None:
        check_choice(self, "kind", Literal["lifemem"])
        check_int(self, "k_trajectories", 1, MAX_K)
        check_bools(self, "skills")


class LifeMemPolicy(ItemRetrievalPolicy):
    """Same-environment trajectories and their clusters' skills (see the module docstring)."""

    def __init__(self, config: LifeMemRetrievalConfig | None = None, *, reward_of: RewardFn | None = None):
        super().__init__(config if config is not None else LifeMemRetrievalConfig(), reward_of=reward_of)

    def _take(self, state_D: np.ndarray, candidates: Candidates) -> list[int]:
        cfg = self.config
        trajectories = base_rows(state_D, candidates, cfg.k_trajectories, self.reward_of)
        skills = linked_rows(candidates, "skill", trajectories) if cfg.skills else []
        return [*trajectories, *skills]


def build(config: LifeMemRetrievalConfig, context: PolicyContext) -> LifeMemPolicy:
    """The factory entry: a :class:`LifeMemPolicy` (``context.reward_of`` for the successful trajectories)."""
    return LifeMemPolicy(config, reward_of=context.reward_of)


SPEC = PolicySpec(kind="lifemem", config=LifeMemRetrievalConfig, build=build,
                  loop_default=lambda gamma: LifeMemRetrievalConfig(), regret_default=LifeMemRetrievalConfig)
