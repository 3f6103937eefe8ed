"""Candidate sets over items of every kind: the bank's nearest entries plus the items linked to them.

A state's top-C entries by cosine (:meth:`memento.bank.CaseBank.candidates`) are **expanded** with the active
items linked to them (:class:`memento.systems.items.ItemGraph`):

- the **tips** made from a candidate trajectory (CFGM: a task's tips come with its trajectories);
- the **skills** of the clusters a candidate trajectory belongs to (LifeMem), deduplicated;
- the **focus point** of the state's environment (CFGM), when ``env`` is given;
- the **propositions and prescriptions** made from a candidate trajectory (PlugMem), and, with a
  :class:`~memento.systems.plugmem.PlugMemGraph` (``plug``), the ``seeds`` active plugmem items most similar to
  the state (of ``seed_env`` when given) and, through each high-level node (concept, intent) of a plugmem item in
  the set, its ``route`` items most similar to the state (linked to the item they were routed from);

each once, after the base candidates, in the order met. Items that are themselves among the base candidates
stay where they are; superseded item versions and emptied clusters are dropped; cluster entries are not shown
(they are bookkeeping: their skills are). The result is an :class:`ItemCandidates`: a
:class:`~memento.bank.Candidates` that also carries each row's ``kind``, its ``links`` (the rows it was
expanded from: a tip's trajectory, a skill's member trajectories among the candidates, a routed item's item),
stored ``rewards_C``, its high-level ``nodes`` (:func:`memento.systems.plugmem.item_nodes`: ``()`` but for
plugmem items) and ``tokens_C`` (the words of its ``action``, what the prompt shows:
:func:`memento.systems.plugmem.count_tokens`).

Every policy chooses from the same expanded set, so "similarity over raw cases", the seed systems' own retrieval
(``memento.policies.cfgm``, ``memento.policies.lifemem``, ``memento.policies.plugmem``)
and soft-Q over all kinds see the same items; a
Q-network with case features sees each row's kind (:mod:`memento.learn.features`). For Memento's positive-only pool an
item counts as positive (an item has no outcome of its own: its stored reward is 0).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from memento.bank import Candidates
from memento.errors import DimensionError
from memento.systems.items import ItemGraph
from memento.systems.plugmem import PLUG_KINDS, PlugMemGraph, count_tokens, item_nodes

__all__ = ["ItemCandidates", "expand_candidates", "EXPANDED_KINDS"]

EXPANDED_KINDS = ("tip", "skill", "focus", "proposition", "prescription")


@dataclasses.dataclass(frozen=True)
class ItemCandidates(Candidates):
    """Candidates with each row's ``kinds``, ``links`` (row indices it was expanded from), ``rewards_C``, and
    optionally its high-level ``nodes`` and ``tokens_C`` (default: none, and 0)."""

    kinds: list[str]
    links: list[tuple[int, ...]]
    rewards_C: np.ndarray
    nodes: list[tuple[str, ...]] | None = None
    tokens_C: np.ndarray | None = None

    def __post_init__(self) -> None:
        n = len(self.ids)
        if self.nodes is None:
            object.__setattr__(self, "nodes", [()] * n)
        if self.tokens_C is None:
            object.__setattr__(self, "tokens_C", np.zeros(n, dtype=np.int64))
        nodes, tokens_C = self.nodes or [], np.asarray(self.tokens_C)
        if len(self.kinds) != n or len(self.links) != n or np.asarray(self.rewards_C).shape != (n,) \
                or len(nodes) != n or tokens_C.shape != (n,):
            raise DimensionError(f"ItemCandidates: {n} ids but {len(self.kinds)} kinds, {len(self.links)} links, "
                                 f"rewards of shape {np.asarray(self.rewards_C).shape}, {len(nodes)} nodes, tokens "
                                 f"of shape {tokens_C.shape}")

    def take(self, rows: np.ndarray) -> ItemCandidates:
        index = np.asarray(rows, dtype=np.int64)
        new_row = {int(old): new for new, old in enumerate(index)}
        return ItemCandidates(ids=[self.ids[i] for i in index], positions_C=self.positions_C[index],
                              scores_C=self.scores_C[index], embeddings_CD=self.embeddings_CD[index],
                              kinds=[self.kinds[i] for i in index],
                              links=[tuple(new_row[r] for r in self.links[i] if r in new_row) for i in index],
                              rewards_C=np.asarray(self.rewards_C)[index],
                              nodes=[(self.nodes or [])[i] for i in index],
                              tokens_C=np.asarray(self.tokens_C)[index])

    def positive(self, rewards_C: np.ndarray) -> Candidates:
        """As :meth:`Candidates.positive`, with every item (kind other than ``"case"``) counted as positive."""
        rewards = np.asarray(rewards_C, dtype=np.float64).copy()
        rewards[[i for i, kind in enumerate(self.kinds) if kind != "case"]] = 1.0
        return super().positive(rewards)

    def rows_of_kind(self, kind: str) -> list[int]:
        return [i for i, k in enumerate(self.kinds) if k == kind]


def expand_candidates(bank: Any, graph: ItemGraph, state_D: np.ndarray, base: Candidates, *,
                      env: str | None = None, kinds: Sequence[str] = EXPANDED_KINDS,
                      plug: PlugMemGraph | None = None, seeds: int = 0, route: int = 0,
                      seed_env: str | None = None) -> ItemCandidates:
    """``base`` expanded with the linked items of ``kinds`` (see the module docstring)."""
    ids: list[str] = []
    links: list[list[int]] = []
    row_of: dict[str, int] = {}

    def put(case_id: str, link: int | None) -> None:
        row = row_of.get(case_id)
        if row is None:
            row_of[case_id] = row = len(ids)
            ids.append(case_id)
            links.append([])
        if link is not None and link != row and link not in links[row]:
            links[row].append(link)

    for case_id in base.ids:
        case = graph.cases.get(case_id)
        if case is not None and (case.kind == "cluster" or not graph.is_active(case_id)):
            continue  # bookkeeping or superseded
        put(case_id, None)
    if env is not None and "focus" in kinds:
        for focus in graph.active("focus", env=env):
            put(focus.id or "", None)
    for row, case_id in enumerate(list(ids)):
        if "tip" in kinds:
            for tip in graph.children(case_id, "tip"):
                put(tip.id or "", row)
        if "skill" in kinds:
            for cluster in graph.children(case_id, "cluster"):
                if not cluster.meta.get("members"):
                    continue
                for skill in graph.children(cluster.id or "", "skill"):
                    put(skill.id or "", row)
        for kind in PLUG_KINDS:
            if kind in kinds:
                for item in graph.children(case_id, kind):
                    put(item.id or "", row)
    plug_kinds = [kind for kind in PLUG_KINDS if kind in kinds]
    if plug is not None and plug_kinds and (seeds > 0 or route > 0) and plug.has_items():
        state_D = np.asarray(state_D)
        for item in plug.nearest(bank, state_D, seeds, env=seed_env):
            if item.kind in plug_kinds:
                put(item.id or "", None)
        for row, case_id in enumerate(list(ids)):
            case = graph.cases.get(case_id)
            if case is None or case.kind not in plug_kinds:
                continue
            for node in item_nodes(case):
                for other in plug.routes(bank, state_D, node, route, exclude=[case_id]):
                    if plug.graph.cases[other].kind in plug_kinds:
                        put(other, row)
    positions_C = bank.positions_of(ids) if ids else np.zeros(0, dtype=np.int64)
    embeddings_CD = bank.embeddings_at(positions_C) if ids else np.zeros((0, bank.dim), dtype=np.float32)
    state = np.asarray(state_D, dtype=np.float32)
    scores_C = (embeddings_CD @ state).astype(np.float32) if ids else np.zeros(0, dtype=np.float32)
    kinds_out = [graph.cases[i].kind if i in graph.cases else "case" for i in ids]
    rewards_C = bank.rewards(ids) if ids else np.zeros(0)
    cases = [graph.cases.get(i) for i in ids]
    nodes = [item_nodes(c) if c is not None else () for c in cases]
    tokens_C = np.asarray([count_tokens(c.action) if c is not None else 0 for c in cases], dtype=np.int64)
    return ItemCandidates(ids=ids, positions_C=np.asarray(positions_C, dtype=np.int64), scores_C=scores_C,
                          embeddings_CD=np.asarray(embeddings_CD, dtype=np.float32), kinds=kinds_out,
                          links=[tuple(x) for x in links], rewards_C=np.asarray(rewards_C, dtype=np.float64),
                          nodes=nodes, tokens_C=tokens_C)
