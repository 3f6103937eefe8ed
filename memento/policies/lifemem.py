"""LifeMem's environment-aligned retrieval: similar trajectories of the same environment and their skills.

Over an expanded candidate set (:class:`memento.systems.expand.ItemCandidates`; the game loop gives candidates
of the state's own environment, ``GameLoopConfig.same_env``, so the format and command syntax stay valid) the
policy takes the ``k_trajectories`` most similar raw cases with stored reward > 0 (all raw cases when none is)
and, with ``skills``, the skills of their clusters (each once: skills of a cluster two trajectories share are
shown once), cut to the decision's K items. Deterministic (``greedy``, ``set_prob`` 1); it does not learn.
"""

from __future__ import annotations

import numpy as np

from memento.bank import Candidates
from memento.config import LifeMemRetrievalConfig
from memento.learn.policy import RewardFn
from memento.policies.cfgm import ItemRetrievalPolicy, base_rows, linked_rows

__all__ = ["LifeMemPolicy", "LifeMemRetrievalConfig"]


class LifeMemPolicy(ItemRetrievalPolicy):
    """Same-environment trajectories and their clusters' skills (see the module docstring)."""

    def __init__(self, config: LifeMemRetrievalConfig | None = None, *, reward_of: RewardFn | None = None):
        super().__init__(config if config is not None else LifeMemRetrievalConfig(), reward_of=reward_of)

    def _take(self, state_D: np.ndarray, candidates: Candidates) -> list[int]:
        cfg = self.config
        trajectories = base_rows(state_D, candidates, cfg.k_trajectories, self.reward_of)
        skills = linked_rows(candidates, "skill", trajectories) if cfg.skills else []
        return [*trajectories, *skills]
