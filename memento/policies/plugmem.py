"""PlugMem's retrieval as a policy: seed items most similar to the state, routed through their concepts and
intents, pruned to a token budget.

Over an expanded candidate set (:class:`memento.systems.expand.ItemCandidates`: the bank's nearest raw cases,
the propositions and prescriptions made from them, the plugmem items nearest to the state and those sharing a
concept or an intent with one in the set; each row carries its high-level ``nodes`` and the ``tokens_C`` of its
shown text) the policy takes

1. the ``seeds`` propositions/prescriptions most similar to the state (cosine, ties to the earlier row);
2. with ``route``, the other proposition/prescription rows that share a node (``"concept:..."``,
   ``"intent:..."``) with a seed, most similar first: routing through the high-level nodes, with the seeds'
   own concepts and intents as the abstract queries;
3. those rows pruned to ``budget_tokens`` (:func:`memento.systems.plugmem.prune_to_budget`: first fit in that
   order, a token being a whitespace-separated word of the item's shown text);
4. then ``cases`` raw cases (most similar with stored reward > 0; 0 by default: episodic sources are
   provenance, not retrieval targets), not counted in the budget;

cut to the decision's K items. Without any plugmem row (a plain candidate set, or none built yet), or when no
item fits the budget, it takes the most similar candidates (as every item policy does). Deterministic
(``greedy``, ``set_prob`` 1); it does not learn.

**The split with the prompt side.** A policy chooses rows of the candidate set and cannot call the LLM inside
``select``. PlugMem's LLM steps, abstract queries generated from the task (matched to nodes exactly or by
embedding) and the compression of what was retrieved into a short task-aligned note, are
:func:`memento.systems.plugmem.retrieve` (and :meth:`memento.systems.runtime.MemorySystems.plugmem_note`), which
the loops do not call: with this policy the planner sees the chosen items as ``Fact:`` / ``Procedure:`` notes,
uncompressed. The policy is the paper's retrieval with its documented fallback for step 2 and without step 5.

The module is the whole policy: its config (:class:`PlugMemRetrievalConfig`), the policy (:class:`PlugMemPolicy`),
its factory entry (:func:`build`) and its run defaults (the class's own defaults in every run), declared in
:data:`SPEC`.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import numpy as np

from memento.bank import Candidates
from memento.config import MAX_K, MAX_TOKENS, check_bools, check_choice, check_int, check_ints
from memento.learn.policy import PolicyContext, RewardFn
from memento.policies.cfgm import ItemRetrievalPolicy, base_rows, ranked_rows
from memento.policies.spec import PolicySpec
from memento.systems.plugmem import PLUG_KINDS, first_fit

__all__ = ["SPEC", "PlugMemPolicy", "PlugMemRetrievalConfig", "budget_rows", "build"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlugMemRetrievalConfig:
    """PlugMem's retrieval as a policy (``memento.policies.plugmem``), over the expanded candidates: the ``seeds``
    propositions/prescriptions most similar to the state, then (``route``) the other candidate items that share a
    concept or an intent with a seed, most similar first, pruned to ``budget_tokens`` words of shown text (first
    fit, in that order); then ``cases`` raw cases (most similar with reward > 0; 0: none, PlugMem retrieves
    knowledge, not episodes); at most the decision's K items in all. The LLM's abstract queries and compression
    are prompt-side (``memento.systems.plugmem.retrieve``), not part of the policy."""

    kind: Literal["plugmem"] = dataclasses.field(default="plugmem", metadata={"help": (
        "the policy: PlugMem's retrieval (propositions and prescriptions routed through their concepts and "
        "intents, pruned to a token budget)")})
    seeds: int = dataclasses.field(default=3, metadata={"help": (
        "the propositions/prescriptions most similar to the state that seed the retrieval")})
    route: bool = dataclasses.field(default=True, metadata={"help": (
        "also take the other items that share a concept or an intent with a seed, most similar first")})
    budget_tokens: int = dataclasses.field(default=256, metadata={"help": (
        "words of shown text the knowledge items are pruned to (first fit, in that order)")})
    cases: int = dataclasses.field(default=0, metadata={"help": (
        "raw cases shown besides (the most similar with stored reward > 0; 0: none)")})

    def __post_init__(self) -> None:
        check_choice(self, "kind", Literal["plugmem"])
        check_int(self, "seeds", 1, MAX_K)
        check_bools(self, "route")
        check_ints(self, budget_tokens=(1, MAX_TOKENS), cases=(0, MAX_K))


def budget_rows(rows: list[int], tokens_C: np.ndarray, budget: int) -> list[int]:
    """``rows`` kept within ``budget`` tokens (``tokens_C`` per candidate row): first fit in the order given."""
    return [rows[i] for i in first_fit([int(tokens_C[row]) for row in rows], budget)]


class PlugMemPolicy(ItemRetrievalPolicy):
    """Seeds, routing through their concepts and intents, token budget (see the module docstring)."""

    def __init__(self, config: PlugMemRetrievalConfig | None = None, *, reward_of: RewardFn | None = None):
        super().__init__(config if config is not None else PlugMemRetrievalConfig(), reward_of=reward_of)

    def _take(self, state_D: np.ndarray, candidates: Candidates) -> list[int]:
        cfg = self.config
        n = len(candidates)
        kinds = getattr(candidates, "kinds", None) or ["case"] * n
        nodes = getattr(candidates, "nodes", None) or [()] * n
        tokens_C = getattr(candidates, "tokens_C", None)
        tokens_C = np.zeros(n, dtype=np.int64) if tokens_C is None else np.asarray(tokens_C)
        ranked = ranked_rows(state_D, candidates, [i for i, kind in enumerate(kinds) if kind in PLUG_KINDS])
        if not ranked:
            return []
        seeds = ranked[:cfg.seeds]
        routed: list[int] = []
        if cfg.route:
            wanted = {node for row in seeds for node in nodes[row]}
            routed = [row for row in ranked[cfg.seeds:] if wanted.intersection(nodes[row])]
        memory = budget_rows([*seeds, *routed], tokens_C, cfg.budget_tokens)
        if not memory:
            return []
        cases = base_rows(state_D, candidates, cfg.cases, self.reward_of) if cfg.cases else []
        return [*memory, *cases]


def build(config: PlugMemRetrievalConfig, context: PolicyContext) -> PlugMemPolicy:
    """The factory entry: a :class:`PlugMemPolicy` (``context.reward_of`` for the raw cases)."""
    return PlugMemPolicy(config, reward_of=context.reward_of)


SPEC = PolicySpec(kind="plugmem", config=PlugMemRetrievalConfig, build=build,
                  loop_default=lambda gamma: PlugMemRetrievalConfig(), regret_default=PlugMemRetrievalConfig)
