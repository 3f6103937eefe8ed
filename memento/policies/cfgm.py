"""CFGM's dual-channel retrieval: similar successful trajectories and their tips, after the focus point.

Over an expanded candidate set (:class:`memento.systems.expand.ItemCandidates`: the bank's nearest entries
plus the tips, skills and focus points linked to them), the policy takes

1. the environment's **focus point** (``CFGMRetrievalConfig.focus``; the first ``focus`` row);
2. the ``k_tasks`` raw cases (``kind == "case"``) with stored reward > 0 that are most similar to the state
   (cosine, ties to the earlier row): the successful trajectories of the most similar tasks; when none has a
   reward > 0, the most similar raw cases;
3. with ``tips``, the tips linked to those trajectories, in candidate order;

cut to the decision's K items (the prompt budget), in that order. A plain candidate set (no item kinds) is
treated as raw cases. The choice is deterministic: ``Selection.greedy`` is True and ``set_prob`` 1; ``probs``
puts equal mass on the rows this choice would take (for the logs). The policy does not learn.

The module is the whole policy: its config (:class:`CFGMRetrievalConfig`), the policy (:class:`CFGMPolicy`), its
factory entry (:func:`build`) and its run defaults (the class's own defaults in every run), declared in :data:`SPEC`;
it also holds the part every seed system's retrieval shares (:class:`ItemRetrievalPolicy`).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Literal

import numpy as np

from memento.bank import Candidates
from memento.config import MAX_K, check_bools, check_choice, check_int
from memento.learn.policy import PolicyContext, RewardFn, StaticPolicy, check_candidates, check_k, make_selection
from memento.policies.spec import PolicySpec
from memento.types import Selection

__all__ = ["SPEC", "CFGMPolicy", "CFGMRetrievalConfig", "ItemRetrievalPolicy", "build", "ranked_rows"]

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, kw_only=True)
class CFGMRetrievalConfig:
    """CFGM's dual-channel retrieval (``memento.policies.cfgm``): the ``k_tasks`` most similar successful trajectories
    (paper: k = 2) and, with ``tips``, the tips made from them, after the environment's focus point with
    ``focus``; at most the decision's K items in all (the prompt budget)."""

    kind: Literal["cfgm"] = dataclasses.field(default="cfgm", metadata={"help": (
        "the policy: CFGM's dual-channel retrieval (the focus point, similar successful trajectories, their tips)")})
    k_tasks: int = dataclasses.field(default=2, metadata={"help": (
        "the most similar successful trajectories taken (paper: k = 2)")})
    tips: bool = dataclasses.field(default=True, metadata={"help": "also take the tips made from those trajectories"})
    focus: bool = dataclasses.field(default=True, metadata={"help": "take the environment's focus point first"})

    def __post_init__(self) -> None:
        check_choice(self, "kind", Literal["cfgm"])
        check_int(self, "k_tasks", 1, MAX_K)
        check_bools(self, "tips", "focus")


def ranked_rows(state_D: np.ndarray, candidates: Candidates, rows: list[int]) -> list[int]:
    """``rows`` sorted by cosine to the state, highest first (ties: the earlier row)."""
    if not rows:
        return []
    emb = np.asarray(candidates.embeddings_CD, dtype=np.float64)[rows]
    norms = np.maximum(np.linalg.norm(emb, axis=1), np.finfo(np.float64).tiny)
    cos = emb @ np.asarray(state_D, dtype=np.float64) / norms
    order = np.argsort(-cos, kind="stable")
    return [rows[i] for i in order]


def _rewards(candidates: Candidates, reward_of: RewardFn | None) -> np.ndarray:
    rewards = getattr(candidates, "rewards_C", None)
    if rewards is None:
        rewards = reward_of(list(candidates.ids)) if reward_of is not None else np.ones(len(candidates))
    return np.asarray(rewards, dtype=np.float64)


def base_rows(state_D: np.ndarray, candidates: Candidates, k: int, reward_of: RewardFn | None) -> list[int]:
    """The ``k`` most similar raw cases with reward > 0 (all raw cases when none is)."""
    kinds = getattr(candidates, "kinds", None) or ["case"] * len(candidates)
    raw = [i for i, kind in enumerate(kinds) if kind == "case"]
    rewards = _rewards(candidates, reward_of)
    good = [i for i in raw if rewards[i] > 0]
    return ranked_rows(state_D, candidates, good or raw)[:k]


def linked_rows(candidates: Candidates, kind: str, to: list[int]) -> list[int]:
    """Rows of ``kind`` linked to any of the rows ``to``, in candidate order."""
    kinds = getattr(candidates, "kinds", None)
    links = getattr(candidates, "links", None)
    if kinds is None or links is None:
        return []
    targets = set(to)
    return [i for i, k in enumerate(kinds) if k == kind and targets.intersection(links[i])]


def deterministic_selection(candidates: Candidates, rows: list[int], k: int) -> Selection:
    """The greedy selection of ``rows`` (deduplicated, cut to ``k``), with ``probs`` uniform over them."""
    rows = list(dict.fromkeys(rows))[:k]
    probs_C = np.zeros(len(candidates))
    probs_C[rows] = 1.0 / len(rows)
    return make_selection(candidates, probs_C, np.asarray(rows, dtype=np.int64), True)


class ItemRetrievalPolicy(StaticPolicy):
    """The common part of a seed system's deterministic retrieval: a subclass names the rows it takes
    (:meth:`_take`); with none (only items and no raw case), the most similar candidates; cut to K."""

    def __init__(self, config: Any, *, reward_of: RewardFn | None = None):
        self.config = config
        self.reward_of = reward_of

    def _take(self, state_D: np.ndarray, candidates: Candidates) -> list[int]:
        raise NotImplementedError

    def _rows(self, state_D: np.ndarray, candidates: Candidates, k: int) -> list[int]:
        rows = self._take(state_D, candidates)
        if not rows:
            rows = ranked_rows(state_D, candidates, list(range(len(candidates))))
        return rows[:k]

    def probs(self, state_D: np.ndarray, candidates: Candidates) -> np.ndarray:
        state_D = check_candidates(state_D, candidates)
        return deterministic_selection(candidates, self._rows(state_D, candidates, len(candidates)),
                                       len(candidates)).probs_C

    def select(self, state_D: np.ndarray, candidates: Candidates, k: int, *, rng: np.random.Generator,
               greedy: bool = False) -> Selection:
        state_D = check_candidates(state_D, candidates)
        k = check_k(k, len(candidates))
        return deterministic_selection(candidates, self._rows(state_D, candidates, k), k)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.config})"


class CFGMPolicy(ItemRetrievalPolicy):
    """Focus point, similar successful trajectories and their tips (see the module docstring)."""

    def __init__(self, config: CFGMRetrievalConfig | None = None, *, reward_of: RewardFn | None = None):
        super().__init__(config if config is not None else CFGMRetrievalConfig(), reward_of=reward_of)

    def _take(self, state_D: np.ndarray, candidates: Candidates) -> list[int]:
        cfg = self.config
        kinds = getattr(candidates, "kinds", None) or []
        focus = [i for i, kind in enumerate(kinds) if kind == "focus"][:1] if cfg.focus else []
        trajectories = base_rows(state_D, candidates, cfg.k_tasks, self.reward_of)
        tips = linked_rows(candidates, "tip", trajectories) if cfg.tips else []
        return [*focus, *trajectories, *tips]


def build(config: CFGMRetrievalConfig, context: PolicyContext) -> CFGMPolicy:
    """The factory entry: a :class:`CFGMPolicy` (``context.reward_of`` for the successful trajectories)."""
    return CFGMPolicy(config, reward_of=context.reward_of)


SPEC = PolicySpec(kind="cfgm", config=CFGMRetrievalConfig, build=build,
                  loop_default=lambda gamma: CFGMRetrievalConfig(), regret_default=CFGMRetrievalConfig)
