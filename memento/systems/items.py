"""Items: bank entries of a kind other than ``"case"``, with provenance links to what they were made from.

An item is a :class:`memento.types.Case` whose ``kind`` is one of :data:`memento.config.CASE_KINDS` and whose
``meta`` holds

- ``sources``: the ids of the bank entries it was made from (trajectories for a tip or a cluster, a cluster for a
  skill; empty for a focus point, which is made from the environment's description);
- ``system``: the memory system that built it (``"cfgm"``, ``"lifemem"``);
- optionally ``group`` and ``version``: an item that a later build supersedes (a cluster whose members or
  description changed, the skills of a cluster distilled again) is never edited in place: the new version is a
  new entry of the same ``group`` with a higher ``version``, and only the entries of the highest version of a
  group are **active** (retrieved and expanded; one version may hold several entries, e.g. a cluster's 3-5
  skills). The bank stays append-only, so truncating it back to a checkpoint
  restores every earlier version exactly.

``state`` is the text retrieval keys on (the task a tip is about, a cluster's description, the environment of a
focus point) and ``action`` the content shown to the planner (the tip, the rule, the guidance).

:class:`ItemGraph` reads the links of a bank (or of a list of cases): children of an entry (``kind`` optional),
the sources of an item, every raw case an item traces back to, the active versions; :meth:`ItemGraph.check`
raises :class:`~memento.errors.ProvenanceError` for a link to an id the bank does not hold and for a cycle.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from memento.errors import ProvenanceError
from memento.types import Case

__all__ = ["NOTE_LABELS", "ItemGraph", "make_item", "memory_tokens", "sources_of", "split_notes"]

logger = logging.getLogger(__name__)

NOTE_LABELS = {"focus": "Guidance", "tip": "Tip", "skill": "Rule", "proposition": "Fact",
               "prescription": "Procedure"}
"""How an item of each kind is labelled when shown to a planner (other kinds: the kind, capitalised)."""


INDEXED_META = ("task_id", "game", "task")
"""The meta fields :meth:`ItemGraph.with_meta` finds entries by: a retained answer's question id, an episode's
game, a tip's question or game."""


def split_notes(cases: Sequence[Case]) -> tuple[list[Case], list[str]]:
    """The raw cases (demonstrations, proposals) and the notes (focus points, tips, skills: one line each, labelled
    by kind, ``"Tip: ..."``) of a selection, each in the order given."""
    raw, notes = [], []
    for case in cases:
        if case.kind == "case":
            raw.append(case)
        else:
            label = NOTE_LABELS.get(case.kind, case.kind.capitalize())
            lines = [line.strip().lstrip("-").strip() for line in case.action.splitlines() if line.strip()]
            notes.extend(f"{label}: {line}" for line in lines)
    return raw, notes


def memory_tokens(cases: Sequence[Case]) -> int:
    """The memory tokens a prompt carries for ``cases``: the whitespace-separated words of each raw case's state
    and action and of each note line (:func:`split_notes`, labels excluded); a tokenizer-free count, the same as
    :func:`memento.systems.plugmem.count_tokens`."""
    raw, notes = split_notes(cases)
    words = sum(len(c.state.split()) + len(c.action.split()) for c in raw)
    return words + sum(len(note.split(": ", 1)[-1].split()) for note in notes)


def make_item(kind: str, state: str, action: str, *, system: str, sources: Sequence[str] = (),
              env: str | None = None, reward: float = 0.0, group: str | None = None, version: int | None = None,
              **meta: Any) -> Case:
    """An item of ``kind`` with its provenance (see the module docstring)."""
    if kind == "case":
        raise ProvenanceError("an item's kind must not be 'case' (raw cases are not built)")
    sources = list(dict.fromkeys(str(s) for s in sources))
    data: dict[str, Any] = {"sources": sources, "system": system, **meta}
    if group is not None:
        data["group"] = group
        data["version"] = int(version or 0)
    return Case(state=state, action=action, reward=float(reward), env=env, kind=kind, meta=data)


def sources_of(case: Case) -> list[str]:
    """The ids an item was made from (``meta.sources``; none for a raw case)."""
    sources = case.meta.get("sources", [])
    if not isinstance(sources, list) or not all(isinstance(s, str) for s in sources):
        raise ProvenanceError(f"case {case.id}: meta.sources must be a list of case ids, got {sources!r}")
    return list(sources)


class ItemGraph:
    """The provenance links among a bank's entries (see the module docstring)."""

    def __init__(self, cases: Iterable[Case] = ()):
        self.cases: dict[str, Case] = {}
        self._children: dict[str, list[str]] = defaultdict(list)
        self._latest: dict[str, tuple[int, list[str]]] = {}
        self._by_meta: dict[tuple[str, str], list[str]] = defaultdict(list)
        for case in cases:
            self.add(case)

    @classmethod
    def from_bank(cls, bank: Any) -> ItemGraph:
        return cls(bank.iter_cases())

    def __len__(self) -> int:
        return len(self.cases)

    def __contains__(self, case_id: object) -> bool:
        return case_id in self.cases

    def add(self, case: Case) -> None:
        """Record a case the bank now holds (its id must be set)."""
        if case.id is None:
            raise ProvenanceError("ItemGraph.add: the case has no id (add it to the bank first)")
        if case.id in self.cases:
            return
        self.cases[case.id] = case
        for source in sources_of(case):
            self._children[source].append(case.id)
        for key in INDEXED_META:
            value = case.meta.get(key)
            if isinstance(value, str):
                self._by_meta[(key, value)].append(case.id)
        group = case.meta.get("group")
        if isinstance(group, str):
            version = int(case.meta.get("version", 0))
            current = self._latest.get(group)
            if current is None or version > current[0]:
                self._latest[group] = (version, [case.id])
            elif version == current[0]:
                current[1].append(case.id)

    def is_active(self, case_id: str) -> bool:
        """False only for an item superseded by a later version of its group."""
        case = self.cases.get(case_id)
        if case is None:
            return False
        group = case.meta.get("group")
        return not isinstance(group, str) or case_id in self._latest[group][1]

    def active(self, kind: str | None = None, *, env: str | None = None) -> list[Case]:
        """The active entries (of ``kind``, of ``env``), in insertion order."""
        return [c for c in self.cases.values() if (kind is None or c.kind == kind)
                and (env is None or c.env == env) and self.is_active(c.id or "")]

    def with_meta(self, key: str, value: str, kind: str | None = None) -> list[Case]:
        """The active entries (of ``kind``) whose ``meta[key] == value``, in insertion order; ``key`` one of
        :data:`INDEXED_META` (an index, not a scan of the graph)."""
        if key not in INDEXED_META:
            raise ProvenanceError(f"ItemGraph.with_meta: {key!r} is not indexed (one of {INDEXED_META})")
        return [self.cases[i] for i in self._by_meta.get((key, value), [])
                if (kind is None or self.cases[i].kind == kind) and self.is_active(i)]

    def latest(self, group: str) -> list[Case]:
        """The entries of the active version of ``group`` (empty: no such group)."""
        entry = self._latest.get(group)
        return [] if entry is None else [self.cases[i] for i in entry[1]]

    def version(self, group: str) -> int:
        """The active version of ``group`` (-1: no such group)."""
        entry = self._latest.get(group)
        return -1 if entry is None else entry[0]

    def children(self, case_id: str, kind: str | None = None, *, active_only: bool = True) -> list[Case]:
        """The entries made from ``case_id`` (of ``kind``; active versions only by default)."""
        out = []
        for child_id in self._children.get(case_id, []):
            child = self.cases[child_id]
            if (kind is None or child.kind == kind) and (not active_only or self.is_active(child_id)):
                out.append(child)
        return out

    def sources(self, case_id: str) -> list[Case]:
        """The entries ``case_id`` was made from (those the graph holds)."""
        case = self.cases.get(case_id)
        if case is None:
            return []
        return [self.cases[s] for s in sources_of(case) if s in self.cases]

    def trace(self, case_id: str) -> list[str]:
        """Every raw case (``kind == "case"``) that ``case_id`` was made from, directly or through other items."""
        out: list[str] = []
        seen: set[str] = set()
        stack = [case_id]
        while stack:
            current = stack.pop()
            if current in seen:
                continue
            seen.add(current)
            case = self.cases.get(current)
            if case is None:
                continue
            if case.kind == "case" and current != case_id:
                out.append(current)
            stack.extend(reversed(sources_of(case)))
        return out

    def check(self) -> None:
        """Raise :class:`ProvenanceError` for a missing source or a cycle (named by the ids on it)."""
        for case_id, case in self.cases.items():
            missing = [s for s in sources_of(case) if s not in self.cases]
            if missing:
                raise ProvenanceError(f"item {case_id} ({case.kind}) links to {missing[:3]}, which the bank does "
                                      "not hold")
        white, grey, black = 0, 1, 2
        colour = dict.fromkeys(self.cases, white)
        for root in self.cases:
            if colour[root] != white:
                continue
            stack: list[tuple[str, int]] = [(root, 0)]
            path: list[str] = []
            while stack:
                node, index = stack.pop()
                if index == 0:
                    colour[node] = grey
                    path.append(node)
                srcs = sources_of(self.cases[node])
                if index < len(srcs):
                    stack.append((node, index + 1))
                    nxt = srcs[index]
                    if colour[nxt] == grey:
                        cycle = path[path.index(nxt):] + [nxt]
                        raise ProvenanceError(f"provenance cycle: {' -> '.join(cycle)}")
                    if colour[nxt] == white:
                        stack.append((nxt, 0))
                else:
                    colour[node] = black
                    path.pop()
