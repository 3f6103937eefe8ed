"""PlugMem (task-agnostic plugin memory): structured steps, propositions and prescriptions, a concept/intent graph.

Every LLM call goes through :meth:`memento.systems.llm.MemoryLLM.ask` with one of the ``plug_*``
:class:`~memento.systems.llm.BuilderTemplates`; every item is made with :func:`memento.systems.items.make_item`
(``system="plugmem"``) and written with ``bank.add(..., allow_duplicates=True)``.

**Structuring** (:meth:`PlugMemBuilder.structure`). A trajectory is a raw bank entry
(:func:`memento.systems.lifemem.is_trajectory`). Its raw steps (:func:`raw_steps`) are ``(observation, action)``
pairs: a game episode case (``meta.granularity == "episode"``) has one step per line of its ``action`` (the
``"> "`` prefix removed; the observation of the first step is the case's ``state``, later observations are not
stored in the bank and read ``"(not recorded)"``); any other trajectory (a question-answering case) is one step,
question -> answer. At most ``max_steps`` steps are structured (the first ones). Each step is one
``plug_structure`` call (the task: the first line of the case's ``state``; the last ``history_steps`` actions;
the observation cut to ``step_max_chars``; the action; the trajectory's outcome) answered ``"state | subgoal |
reward"`` (:func:`parse_structure`), giving a :class:`Step` ``(observation, state, action, reward, subgoal)``;
the reward is read as a number and clipped to [0, 1].

**Segmentation** (:func:`segment_steps`, pure). The subgoals are embedded with the run's ``encode``; a new segment
starts at step ``t`` when the cosine of subgoals ``t - 1`` and ``t`` is *below* ``segment_threshold`` (default
0.5; equal stays in the segment). A segment's **return** is the sum of its steps' rewards; its subgoal is the
subgoal of its first step.

**Knowledge** (per segment, two calls). ``plug_facts`` asks for at most ``facts_max`` atomic facts, each tagged
with concepts in brackets, ``"Lima is the capital of Peru [capital cities, peru]; ..."``
(:func:`parse_facts`: at most ``concepts_max`` concepts each, normalised: lower case, whitespace collapsed, outer
punctuation stripped). Each becomes a ``proposition`` item: ``state`` = ``action`` = the fact, ``meta.concepts``
the concepts. ``plug_procedure`` asks for ``"intent => prescription"`` (:func:`parse_procedure`; ``->`` or the
first ``:`` also separate). It becomes a ``prescription`` item: ``state`` the intent (what a query is matched
with), ``action`` ``"<intent>: <prescription>"`` (what the prompt shows), ``meta.intent``,
``meta.prescription`` and ``meta.return`` the segment's return. Both have ``meta.sources`` = the raw case(s) they
come from (episodic sources are provenance, never retrieval targets), ``meta.subgoal``, ``meta.support`` (how
many segments gave them), ``reward`` 0 (an item has no outcome of its own), the source's ``env``, and the vector
of their ``state``.

**Merging with versioned groups.** The same knowledge found again (same kind, env and normalised text; for a
prescription, intent and prescription) is never edited in place and never a second live copy: it is a new
version of the group ``"plugmem:<kind>:<hash>"`` (:mod:`memento.systems.items`) whose sources are the earlier
version's plus the new trajectory, whose concepts are the union, whose ``support`` grows by one and whose
``return`` is the mean return over its supports. Only the highest version is active, so
:class:`~memento.systems.items.ItemGraph` and the candidate expansion see one entry linked to every trajectory it
came from. Knowledge a trajectory repeats within itself is written once.

**Graph** (:class:`PlugMemGraph`). Concept nodes <- propositions, intent nodes <- prescriptions, and both ->
their episodic sources. The nodes are *derived* from the active items' ``meta.concepts`` / ``meta.intent``
when the graph is read, not stored as entries: the items and their meta are SQLite rows of the bank
(append-only), so truncating the bank to a checkpoint restores the graph exactly, and no new kind outside
:data:`memento.config.CASE_KINDS` is needed. Node keys are ``"concept:<name>"`` and ``"intent:<name>"``
(normalised).

**Retrieval** (:func:`retrieve`, the prompt side). (1) the ``seed_k`` active propositions/prescriptions most
similar to the query vector (:meth:`PlugMemGraph.nearest`); (2) one ``plug_abstract`` call gives at most
``abstract_max`` abstract queries (concepts or intents); (3) each is routed to the high-level nodes it matches,
exactly (normalised name) or by embedding (cosine >= ``match_threshold``), and from each node to its
``route_per_node`` items most similar to the query; (4) seeds then routed items are pruned to ``budget_tokens``
(:func:`prune_to_budget`: first fit in that order; a token is a whitespace-separated word of the item's shown
text, :func:`count_tokens`, so the count does not depend on a tokenizer); (5) one ``plug_compress`` call writes
a short task-aligned note (first line, cut to ``note_max_tokens`` words). :class:`PlugMemRetrieval` reports the
memory tokens of the note (what the prompt would carry) and the calls made.

The *policy* ``memento.policies.plugmem`` cannot call the LLM inside ``select``: it picks, among the expanded candidates
(:func:`memento.systems.expand.expand_candidates`, which adds the nearest plugmem items and the items sharing a
node with a candidate item), the most similar items as seeds, routes through the seeds' own concepts/intents
(the fallback of step 2), and prunes to its token budget, deterministically. The loops then do step 5 on what
it chose: with ``PlugMemConfig.show = "note"`` (the default) the chosen items reach the prompt as one note
(:func:`compress`, :meth:`memento.systems.runtime.MemorySystems.prompt_cases`), labelled ``Memory:``. The whole
prompt-side retrieval with the LLM's abstract queries (step 2) is :func:`retrieve`
(:meth:`memento.systems.runtime.MemorySystems.plugmem_note`).

**Fallbacks** (each logs; a bad reply never crashes and never writes a malformed item):

- ``plug_structure`` without a part: the state is the observation's first line (``"after <action>"`` when not
  recorded), the subgoal the previous step's (the first step: the task), the reward 0, except at the last step,
  where it is the trajectory's stored reward;
- ``plug_facts`` with no ``fact [concepts]`` item: no proposition from that segment (a fact without concept tags
  is dropped: an untagged proposition would be unreachable through the graph);
- ``plug_procedure`` without ``intent => prescription``: no prescription from that segment;
- ``plug_abstract`` with no item (or no LLM): the seeds' own concepts and intents;
- ``plug_compress`` with no line (or no LLM): the pruned items' texts joined with ``"; "``.

**Rebuild rule.** The bank is the only state: a trajectory that already has a plugmem item (any version) is not
structured again; ``PlugMemBuilder`` over a reopened or truncated bank continues exactly as the original would,
given the same replies (a deterministic planner, or the reply cache). A trajectory whose replies all failed has
no item and would be asked again (from the cache). The procedure and the retrieval order follow the paper's
description; every number in :class:`PlugMemConfig` (the 0.5 segmentation threshold included) is this project's
choice for small planners, not a value taken from the paper.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import logging
import re
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np

from memento.config import check_choice, check_float, check_ints, from_dict
from memento.errors import ConfigError, DataFormatError, ReplyFormatError
from memento.systems.items import ItemGraph, make_item
from memento.systems.lifemem import is_trajectory
from memento.systems.llm import collapse as _collapse
from memento.systems.llm import cut as _cut
from memento.systems.llm import parse_items
from memento.types import Case

__all__ = [
    "NOTE_KIND",
    "PLUG_KINDS",
    "PlugMemBuilder",
    "PlugMemConfig",
    "PlugMemGraph",
    "PlugMemRetrieval",
    "Step",
    "compress",
    "count_tokens",
    "item_nodes",
    "normalise",
    "parse_facts",
    "parse_procedure",
    "parse_structure",
    "first_fit",
    "prune_to_budget",
    "raw_steps",
    "retrieve",
    "segment_steps",
]

logger = logging.getLogger(__name__)

SYSTEM = "plugmem"
PLUG_KINDS = ("proposition", "prescription")
"""The low-level item kinds PlugMem builds (retrieval targets)."""
TEXT_MAX_CHARS = 300
"""A fact, an intent, a prescription, a state or a subgoal is cut to this many characters."""
ROUTE_SCAN = 256
"""At most this many (most recent) items of one node are ranked when routing through it."""
NOT_RECORDED = "(not recorded)"
PromptShow = Literal["note", "items"]
"""How a loop's prompt shows the chosen PlugMem items (:attr:`PlugMemConfig.show`)."""
NOTE_KIND = "memory"
"""The kind of the transient entry that carries a compressed note to the planner (never stored in a bank)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlugMemConfig:
    """PlugMem's settings: structuring and knowledge (the builder), the candidate expansion (``seed_k``,
    ``route_per_node``) and the prompt-side retrieval (see the module docstring). ``show``: how a loop's prompt
    shows the PlugMem items a policy chose: ``"note"`` (default) compresses them into one task-aligned note
    (:func:`compress`, one ``plug_compress`` call per prompt, labelled ``Memory:``), ``"items"`` shows one line
    each (``Fact:``, ``Procedure:``)."""

    segment_threshold: float = 0.5
    max_steps: int = 50
    history_steps: int = 5
    step_max_chars: int = 300
    facts_max: int = 5
    concepts_max: int = 3
    seed_k: int = 3
    route_per_node: int = 3
    abstract_max: int = 3
    match_threshold: float = 0.8
    budget_tokens: int = 256
    note_max_tokens: int = 96
    show: PromptShow = "note"

    def __post_init__(self) -> None:
        check_float(self, "segment_threshold", low=-1.0, high=1.0)
        check_ints(self, max_steps=1, history_steps=0, step_max_chars=1, facts_max=0, concepts_max=1, seed_k=0,
                         route_per_node=0, abstract_max=1)
        check_float(self, "match_threshold", low=-1.0, high=1.0)
        check_ints(self, budget_tokens=1, note_max_tokens=1)
        check_choice(self, "show", PromptShow)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PlugMemConfig:
        """From a dict (missing fields keep their defaults; an unknown field or a bad value: ConfigError)."""
        return from_dict(cls, data)


def _config(config: PlugMemConfig | None) -> PlugMemConfig:
    if config is None:
        return PlugMemConfig()
    if not isinstance(config, PlugMemConfig):
        raise ConfigError(f"plugmem: config must be a PlugMemConfig, got {type(config).__name__}")
    return config


# ---------------------------------------------------------------------- text


def _clean(text: str) -> str:
    return _cut(_collapse(text).strip(" \"'`").rstrip(",.;").strip(" \"'`").strip(), TEXT_MAX_CHARS)


def _usable(text: str | None) -> bool:
    return text is not None and len(text) >= 3 and any(ch.isalpha() for ch in text)


def normalise(text: str) -> str:
    """A node name: lower case, whitespace collapsed, outer quotes and punctuation stripped."""
    return _collapse(text).lower().strip(" \"'`.,;:!?()[]")


def count_tokens(text: str) -> int:
    """Memory tokens of a text: its whitespace-separated words (a tokenizer-free count; a subword tokenizer gives
    more, roughly 1.3 per English word)."""
    return len(str(text).split())


def prune_to_budget(texts: Sequence[str], budget: int) -> list[int]:
    """The indices of ``texts`` kept within ``budget`` tokens: first fit in the order given (a text that does not
    fit is skipped and later, shorter ones are still tried); the kept texts' tokens sum to at most ``budget``."""
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
        raise ConfigError(f"prune_to_budget: budget must be an integer >= 0, got {budget!r}")
    return first_fit([count_tokens(text) for text in texts], budget)


def first_fit(tokens: Sequence[int], budget: int) -> list[int]:
    """The indices kept within ``budget`` when item ``i`` costs ``tokens[i]``: first fit in the order given."""
    kept, used = [], 0
    for i, n in enumerate(tokens):
        if used + int(n) <= budget:
            kept.append(i)
            used += int(n)
    return kept


# ---------------------------------------------------------------------- replies

_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)")
_TAGGED = re.compile(r"^(?P<text>.*?)\s*[\[(](?P<tags>[^\[\]()]*)[\])]\s*[.;,]?\s*$", re.DOTALL)
_SEPARATORS = ("=>", "->", ":")


def parse_structure(text: Any) -> tuple[str | None, str | None, float | None]:
    """``(state, subgoal, reward)`` of a ``"state | subgoal | reward"`` reply (``;`` also separates); a part that
    is missing or has no letter (the reward: no number) is ``None``. Never raises."""
    if not isinstance(text, str):
        return None, None, None
    line = next((ln for ln in text.splitlines() if ln.strip()), "")
    parts = line.split("|") if "|" in line else line.split(";")
    parts = [_clean(part) for part in parts]
    state = parts[0] if parts and _usable(parts[0]) else None
    subgoal = parts[1] if len(parts) > 1 and _usable(parts[1]) else None
    reward = None
    if len(parts) > 2:
        match = _NUMBER.search(parts[2])
        if match is not None:
            reward = min(1.0, max(0.0, float(match.group(0))))
    return state, subgoal, reward


def parse_facts(text: Any, max_items: int, concepts_max: int = 3) -> list[tuple[str, list[str]]]:
    """The ``(fact, concepts)`` pairs of a ``"fact [concept, concept]; fact [concept]"`` reply (separated as
    :func:`~memento.systems.llm.parse_items` reads lists; tags in ``[]`` or ``()``, split on ``,`` or ``/``).
    A fact without a usable concept is dropped; duplicates (normalised) are kept once; at most ``max_items``.
    None left: :class:`~memento.errors.ReplyFormatError`."""
    pieces = parse_items(text, 1000, what="plugmem facts")
    out: list[tuple[str, list[str]]] = []
    seen: set[str] = set()
    for piece in pieces:
        match = _TAGGED.match(piece)
        if match is None:
            continue
        fact = _clean(match.group("text"))
        tags = (normalise(tag) for tag in re.split(r"[,/]", match.group("tags")))
        concepts = list(dict.fromkeys(c for c in tags if len(c) >= 2 and any(ch.isalpha() for ch in c)))
        if not _usable(fact) or not concepts or normalise(fact) in seen:
            continue
        seen.add(normalise(fact))
        out.append((fact, [_cut(c, 60) for c in concepts[:concepts_max]]))
        if len(out) >= max_items:
            break
    if not out:
        raise ReplyFormatError(f"plugmem facts: no 'fact [concepts]' item in the reply {str(text)[:80]!r}")
    return out


def parse_procedure(text: Any) -> tuple[str, str]:
    """The ``(intent, prescription)`` of an ``"intent => prescription"`` reply: the first line holding a
    separator (``=>``, else ``->``, else the first ``:``) with a usable text on both sides; none:
    :class:`~memento.errors.ReplyFormatError`."""
    if isinstance(text, str):
        for line in text.splitlines():
            for sep in _SEPARATORS:
                if sep in line:
                    head, _, tail = line.partition(sep)
                    intent, prescription = _clean(re.sub(r"^\s*(?:intent\s*:?)", "", head, flags=re.IGNORECASE)),\
                        _clean(tail)
                    if _usable(intent) and _usable(prescription):
                        return intent, prescription
                    break
    raise ReplyFormatError(f"plugmem procedure: no 'intent => prescription' in the reply {str(text)[:80]!r}")


def _first_line(text: Any) -> str | None:
    if not isinstance(text, str):
        return None
    for line in text.splitlines():
        line = _collapse(line).strip(" \"'`")
        if _usable(line):
            return line
    return None


# ---------------------------------------------------------------------- structuring and segmentation


@dataclasses.dataclass(frozen=True)
class Step:
    """One structured step: what was seen, the inferred state after the action, the action, the inferred reward
    and the subgoal it serves."""

    observation: str
    state: str
    action: str
    reward: float
    subgoal: str

    def text(self, limit: int) -> str:
        parts = ([f"observation: {_cut(_collapse(self.observation), limit)}"] if self.observation else [])
        parts += [f"state: {self.state}", f"action: {_cut(_collapse(self.action), limit)}",
                  f"subgoal: {self.subgoal}", f"reward: {self.reward:g}"]
        return " | ".join(parts)


def raw_steps(case: Case) -> list[tuple[str, str]]:
    """The ``(observation, action)`` steps of a trajectory (see the module docstring; ``""``: not recorded)."""
    if case.meta.get("granularity") == "episode":
        out: list[tuple[str, str]] = []
        for line in case.action.splitlines():
            line = line.strip()
            command = line[1:].strip() if line.startswith(">") else line
            if command:
                out.append((case.state if not out else "", command))
        return out
    return [(case.state, case.action)] if case.action.strip() else []


def segment_steps(subgoals_TD: Any, threshold: float) -> list[list[int]]:
    """Segments of consecutive steps (lists of step indices): a new one starts at ``t`` when the cosine of
    subgoal vectors ``t - 1`` and ``t`` is below ``threshold``. Zero rows or a non-[T, D] array:
    :class:`~memento.errors.DataFormatError`; no step: no segment."""
    x = np.asarray(subgoals_TD, dtype=np.float64)
    if x.ndim != 2 or (x.shape[0] and x.shape[1] == 0):
        raise DataFormatError(f"segment_steps: expected a [T, D] array, got shape {x.shape}")
    if x.shape[0] == 0:
        return []
    if not np.all(np.isfinite(x)):
        raise DataFormatError("segment_steps: the subgoal vectors are not all finite")
    norms_T = np.linalg.norm(x, axis=1)
    if np.any(norms_T == 0.0):
        raise DataFormatError(f"segment_steps: subgoal vector {int(np.argmin(norms_T))} is zero")
    unit_TD = x / norms_T[:, None]
    cos_T1 = np.sum(unit_TD[1:] * unit_TD[:-1], axis=1)
    segments = [[0]]
    for t, cos in enumerate(cos_T1.tolist(), start=1):
        if cos < threshold:
            segments.append([t])
        else:
            segments[-1].append(t)
    return segments


def _task(case: Case) -> str:
    line = next((ln for ln in case.state.splitlines() if ln.strip()), case.state)
    return _cut(_collapse(line), TEXT_MAX_CHARS) or "(none)"


def _outcome(case: Case) -> str:
    verdict = case.meta.get("won", case.meta.get("success"))
    tail = "" if not isinstance(verdict, bool) else (" (success)" if verdict else " (failure)")
    return f"reward {case.reward:g}{tail}"


# ---------------------------------------------------------------------- the graph


def item_nodes(case: Case) -> tuple[str, ...]:
    """The high-level node keys of a plugmem item (``"concept:<name>"`` for each concept of a proposition,
    ``"intent:<name>"`` for a prescription); ``()`` for any other entry."""
    if case.kind == "proposition":
        concepts = case.meta.get("concepts")
        if isinstance(concepts, list):
            return tuple(dict.fromkeys(f"concept:{normalise(c)}" for c in concepts if isinstance(c, str)
                                       and normalise(c)))
    elif case.kind == "prescription":
        intent = case.meta.get("intent")
        if isinstance(intent, str) and normalise(intent):
            return (f"intent:{normalise(intent)}",)
    return ()


class PlugMemGraph:
    """Concept and intent nodes over the active plugmem items of a bank (see the module docstring).

    It reads (and, through :meth:`add`, extends) an :class:`~memento.systems.items.ItemGraph`; the node index is
    brought up to date with the item graph whenever it is read, so entries added to the item graph directly are
    seen too."""

    def __init__(self, graph: ItemGraph | None = None):
        self.graph = graph if graph is not None else ItemGraph()
        self._nodes: dict[str, list[str]] = {}
        self._seen = 0
        self._positions: dict[str, int] = {}

    @classmethod
    def from_bank(cls, bank: Any) -> PlugMemGraph:
        return cls(ItemGraph.from_bank(bank))

    def add(self, case: Case) -> None:
        """Record an entry the bank now holds (its id must be set)."""
        self.graph.add(case)

    def _sync(self) -> None:
        n = len(self.graph.cases)
        if n == self._seen:
            return
        for case in itertools.islice(self.graph.cases.values(), self._seen, None):
            for node in item_nodes(case):
                self._nodes.setdefault(node, []).append(case.id or "")
        self._seen = n

    def _active(self, ids: Sequence[str]) -> list[Case]:
        return [self.graph.cases[i] for i in ids if self.graph.is_active(i)]

    def _names(self, prefix: str) -> list[str]:
        self._sync()
        return [key[len(prefix):] for key, ids in self._nodes.items()
                if key.startswith(prefix) and any(self.graph.is_active(i) for i in ids)]

    def concepts(self) -> list[str]:
        """The concept nodes with at least one active proposition, in order of first appearance."""
        return self._names("concept:")

    def intents(self) -> list[str]:
        """The intent nodes with at least one active prescription, in order of first appearance."""
        return self._names("intent:")

    def nodes(self) -> list[str]:
        """Every node key (``"concept:..."``, ``"intent:..."``) with an active item."""
        return [f"concept:{c}" for c in self.concepts()] + [f"intent:{i}" for i in self.intents()]

    def items_of(self, node: str) -> list[Case]:
        """The active items of a node key, in order of writing."""
        self._sync()
        return self._active(self._nodes.get(node, []))

    def propositions_of(self, concept: str) -> list[Case]:
        """The active propositions tagged with ``concept`` (any spelling that normalises to it)."""
        return self.items_of(f"concept:{normalise(concept)}")

    def prescriptions_of(self, intent: str) -> list[Case]:
        """The active prescriptions of ``intent`` (any spelling that normalises to it)."""
        return self.items_of(f"intent:{normalise(intent)}")

    def sources_of(self, item: str | Case) -> list[Case]:
        """The episodic sources (entries of ``meta.sources``) of a plugmem item, as the graph holds them."""
        case_id = item.id if isinstance(item, Case) else item
        return self.graph.sources(case_id or "")

    def items(self) -> list[Case]:
        """The active propositions and prescriptions, in order of writing."""
        return [c for c in self.graph.cases.values() if c.kind in PLUG_KINDS and self.graph.is_active(c.id or "")]

    def has_items(self) -> bool:
        self._sync()
        return bool(self._nodes)

    # ------------------------------------------------------------------ vectors

    def _vectors(self, bank: Any, ids: Sequence[str]) -> np.ndarray:
        missing = [i for i in ids if i not in self._positions]
        if missing:
            self._positions.update(zip(missing, (int(p) for p in bank.positions_of(missing))))
        positions = np.asarray([self._positions[i] for i in ids], dtype=np.int64)
        return np.asarray(bank.embeddings_at(positions), dtype=np.float64)

    def rank(self, bank: Any, query_D: np.ndarray, ids: Sequence[str]) -> list[tuple[str, float]]:
        """``ids`` by cosine to ``query_D`` (bank vectors are unit), highest first, ties to the earlier id."""
        ids = list(ids)
        if not ids:
            return []
        scores_N = self._vectors(bank, ids) @ np.asarray(query_D, dtype=np.float64)
        order = np.argsort(-scores_N, kind="stable")
        return [(ids[i], float(scores_N[i])) for i in order]

    def nearest(self, bank: Any, query_D: np.ndarray, k: int, *, env: str | None = None) -> list[Case]:
        """At most ``k`` active plugmem items most similar to ``query_D`` (of ``env`` when given): a search of the
        bank per kind, a superseded version standing for its group's active version."""
        if k <= 0 or not self.has_items():
            return []
        found: dict[str, float] = {}
        for kind in PLUG_KINDS:
            scores, ids = bank.search(np.asarray(query_D, dtype=np.float32), 4 * k, env=env, kind=kind)
            for score, case_id in zip(np.asarray(scores).tolist(), list(ids)):
                case = self.graph.cases.get(case_id)
                if case is None:
                    continue
                if not self.graph.is_active(case_id):
                    latest = self.graph.latest(str(case.meta.get("group")))
                    if not latest:
                        continue
                    case = latest[0]
                key = case.id or ""
                found[key] = max(found.get(key, -np.inf), float(score))
        ranked = sorted(found.items(), key=lambda kv: -kv[1])  # stable: the first found among ties
        return [self.graph.cases[i] for i, _ in ranked[:k]]

    def routes(self, bank: Any, query_D: np.ndarray, node: str, limit: int, *,
               exclude: Sequence[str] = ()) -> list[str]:
        """The ``limit`` active items of ``node`` most similar to ``query_D`` (among its ``ROUTE_SCAN`` most
        recent), without ``exclude``."""
        if limit <= 0:
            return []
        skip = set(exclude)
        members = [c.id or "" for c in self.items_of(node)[-ROUTE_SCAN:] if c.id not in skip]
        return [i for i, _ in self.rank(bank, query_D, members)[:limit]]


# ---------------------------------------------------------------------- the builder


class PlugMemBuilder:
    """Structuring, segmentation and knowledge of each new trajectory (see the module docstring).

    ``encode(texts) -> [N, D]`` unit vectors (the run's encoder); ``graph``: the run's :class:`PlugMemGraph`
    (updated with every entry written here; by default read from the bank); ``accepts``: which trajectories are
    structured (default: all)."""

    def __init__(self, llm: Any, bank: Any, config: PlugMemConfig | None = None, *,
                 encode: Callable[[list[str]], np.ndarray], graph: PlugMemGraph | None = None,
                 accepts: Callable[[Case], bool] | None = None):
        if not callable(encode):
            raise ConfigError("plugmem: encode must be a callable texts -> [N, D] vectors")
        self.llm = llm
        self.bank = bank
        self.config = _config(config)
        self.encode = encode
        self.graph = graph if graph is not None else PlugMemGraph.from_bank(bank)
        self.accepts = accepts

    def _case(self, case_id: str) -> Case:
        graph = self.graph.graph
        case = graph.cases.get(case_id)
        if case is None:  # written to the bank behind the graph's back: read what it lacks, in bank order
            for stored in self.bank.iter_cases():
                if stored.id not in graph:
                    graph.add(stored)
            case = graph.cases.get(case_id)
            if case is None:
                raise DataFormatError(f"plugmem: the bank holds no case {case_id!r}")
        return case

    def _encode(self, texts: list[str]) -> np.ndarray:
        out = np.asarray(self.encode(texts), dtype=np.float32)
        if out.ndim != 2 or out.shape[0] != len(texts):
            raise DataFormatError(f"plugmem: encode gave shape {out.shape} for {len(texts)} text(s)")
        return out

    def structure(self, case: Case) -> list[Step]:
        """The structured steps of a trajectory (one ``plug_structure`` call each; fallbacks per part)."""
        cfg = self.config
        steps = raw_steps(case)[:cfg.max_steps]
        task, outcome = _task(case), _outcome(case)
        out: list[Step] = []
        for t, (observation, action) in enumerate(steps):
            earlier = [a for _, a in steps[max(0, t - cfg.history_steps):t]] if cfg.history_steps else []
            shown = _cut(_collapse(observation), cfg.step_max_chars) if observation else NOT_RECORDED
            reply = self.llm.ask("plug_structure", task=task, history=", ".join(earlier) or "none",
                                 observation=shown, action=_cut(_collapse(action), cfg.step_max_chars),
                                 outcome=outcome)
            state, subgoal, reward = parse_structure(reply)
            if state is None or subgoal is None or reward is None:
                logger.info("plugmem structure of %s step %d: reply %r lacks a part; fallback used", case.id, t,
                            str(reply)[:80])
            if state is None:
                first = _first_line(observation)
                state = _cut(first, TEXT_MAX_CHARS) if first else _cut(f"after {_collapse(action)}", TEXT_MAX_CHARS)
            if subgoal is None:
                subgoal = out[-1].subgoal if out else task
            if reward is None:
                reward = float(case.reward) if t == len(steps) - 1 else 0.0
            out.append(Step(observation=observation, state=state, action=action, reward=reward, subgoal=subgoal))
        return out

    def add_trajectory(self, case_id: str) -> list[Case]:
        """Structure, segment and distil the bank's trajectory ``case_id``; the new bank entries written."""
        if not isinstance(case_id, str) or not case_id:
            raise DataFormatError(f"plugmem: a trajectory id must be a non-empty string, got {case_id!r}")
        case = self._case(case_id)
        if not is_trajectory(case):
            raise DataFormatError(f"plugmem: {case_id} is not a trajectory (kind {case.kind!r}, granularity "
                                  f"{case.meta.get('granularity')!r})")
        if self.accepts is not None and not self.accepts(case):
            return []
        if any(c.meta.get("system") == SYSTEM for c in self.graph.graph.children(case_id, active_only=False)):
            return []  # structured before
        steps = self.structure(case)
        if not steps:
            return []
        segments = segment_steps(self._encode([s.subgoal for s in steps]), self.config.segment_threshold)
        pending: dict[str, Case] = {}
        for index, rows in enumerate(segments):
            self._segment(case, index, [steps[t] for t in rows], pending)
        return self._write(list(pending.values()))

    def _segment(self, case: Case, index: int, steps: list[Step], pending: dict[str, Case]) -> None:
        cfg = self.config
        task, subgoal = _task(case), steps[0].subgoal
        ret = float(sum(s.reward for s in steps))
        listing = "\n".join(f"{i}. {s.text(cfg.step_max_chars)}" for i, s in enumerate(steps, start=1))
        if cfg.facts_max > 0:
            reply = self.llm.ask("plug_facts", task=task, subgoal=subgoal, steps=listing, max_items=cfg.facts_max)
            try:
                facts = parse_facts(reply, cfg.facts_max, cfg.concepts_max)
            except ReplyFormatError as error:
                logger.warning("plugmem facts of %s segment %d: %s; no proposition", case.id, index, error)
                facts = []
            for fact, concepts in facts:
                self._merge(pending, case, "proposition", fact, fact, key=normalise(fact), subgoal=subgoal,
                            concepts=concepts)
        reply = self.llm.ask("plug_procedure", task=task, subgoal=subgoal, steps=listing,
                             outcome=f"return {ret:g} of these steps; the attempt's {_outcome(case)}")
        try:
            intent, prescription = parse_procedure(reply)
        except ReplyFormatError as error:
            logger.warning("plugmem procedure of %s segment %d: %s; no prescription", case.id, index, error)
            return
        self._merge(pending, case, "prescription", intent, f"{intent}: {prescription}",
                    key=f"{normalise(intent)} => {normalise(prescription)}", subgoal=subgoal, intent=intent,
                    prescription=prescription, ret=ret)

    def _merge(self, pending: dict[str, Case], case: Case, kind: str, state: str, action: str, *, key: str,
               subgoal: str, concepts: list[str] | None = None, intent: str | None = None,
               prescription: str | None = None, ret: float = 0.0) -> None:
        """Add knowledge to ``pending`` (group -> the item to write): a new group, a new version of an active one
        (sources, concepts, support and mean return merged), or nothing when this trajectory already gave it."""
        digest = hashlib.sha256(json.dumps([kind, case.env, key], ensure_ascii=False).encode()).hexdigest()[:16]
        group = f"{SYSTEM}:{kind}:{digest}"
        if group in pending:  # the same knowledge twice in this trajectory: written once, a fact's concepts join
            if concepts:
                prior = pending[group]
                merged = list(dict.fromkeys([*prior.meta.get("concepts", []), *concepts]))
                pending[group] = dataclasses.replace(prior, meta={**prior.meta, "concepts": merged})
            return
        source = case.id or ""
        latest = self.graph.graph.latest(group)
        previous = latest[0] if latest else None
        if previous is not None and source in previous.meta.get("sources", []):
            return
        version = 0 if previous is None else int(previous.meta.get("version", 0)) + 1
        sources = [*(previous.meta.get("sources", []) if previous else []), source]
        support = (int(previous.meta.get("support", 1)) if previous else 0) + 1
        meta: dict[str, Any] = {"subgoal": previous.meta.get("subgoal", subgoal) if previous else subgoal,
                                "support": support}
        if kind == "proposition":
            meta["concepts"] = list(dict.fromkeys([*(previous.meta.get("concepts", []) if previous else []),
                                                   *(concepts or [])]))
        else:
            old = float(previous.meta.get("return", 0.0)) if previous else 0.0
            meta.update(intent=intent, prescription=prescription,
                        **{"return": (old * (support - 1) + ret) / support})
        pending[group] = make_item(kind, state, action, system=SYSTEM, sources=sources, env=case.env, reward=0.0,
                                   group=group, version=version, **meta)

    def _write(self, items: list[Case]) -> list[Case]:
        if not items:
            return []
        vectors_ND = self._encode([item.state for item in items])
        ids = self.bank.add(items, vectors_ND, allow_duplicates=True)
        out = [dataclasses.replace(item, id=case_id) for item, case_id in zip(items, ids)]
        for item in out:
            self.graph.add(item)
        for kind in PLUG_KINDS:
            n = sum(item.kind == kind for item in out)
            if n:
                self.llm.count_items(kind, n)
        return out


# ---------------------------------------------------------------------- retrieval (prompt side)


@dataclasses.dataclass(frozen=True)
class PlugMemRetrieval:
    """What :func:`retrieve` did: the seed items, the abstract queries, the matched nodes, the items routed
    through them, the items kept within the budget (ids and texts), the note, its memory tokens, the LLM calls
    made and the fallbacks used (``"abstract"``, ``"compress"``)."""

    seeds: list[str]
    queries: list[str]
    nodes: list[str]
    routed: list[str]
    kept: list[str]
    texts: list[str]
    note: str
    memory_tokens: int
    calls: int
    fallbacks: tuple[str, ...]


def _match(queries: Sequence[str], names: Sequence[str], threshold: float,
           encode: Callable[[list[str]], np.ndarray] | None) -> list[str]:
    """The node keys ``queries`` match: exactly (normalised name), else by cosine >= ``threshold``."""
    keys = list(names)
    bare = [key.split(":", 1)[1] for key in keys]
    out: list[str] = []
    vectors_QD = vectors_ND = None
    if encode is not None and keys:
        both = np.asarray(encode([*queries, *bare]), dtype=np.float64)
        both = both / np.maximum(np.linalg.norm(both, axis=1, keepdims=True), np.finfo(np.float64).tiny)
        vectors_QD, vectors_ND = both[:len(queries)], both[len(queries):]
    for q, query in enumerate(queries):
        name = normalise(query)
        exact = [key for key, b in zip(keys, bare) if b == name]
        if exact:
            out.extend(exact)
        elif vectors_QD is not None and vectors_ND is not None:
            sims_N = vectors_ND @ vectors_QD[q]
            order = np.argsort(-sims_N, kind="stable")
            out.extend(keys[i] for i in order if sims_N[i] >= threshold)
    return list(dict.fromkeys(out))


def compress(query: str, texts: Sequence[str], *, llm: Any = None,
             config: PlugMemConfig | None = None) -> tuple[str, int, bool]:
    """Step 5: one ``plug_compress`` call writes a short note for ``query`` from ``texts`` (its first line, cut to
    ``note_max_tokens`` words). Returns the note, the calls made (0 or 1) and whether the fallback was used (no
    LLM, or no usable line: the texts joined with ``"; "``); no texts: ``("", 0, False)``."""
    cfg = _config(config)
    if not texts:
        return "", 0, False
    line, calls = None, 0
    if llm is not None:
        reply = llm.ask("plug_compress", query=_collapse(query), memory="\n".join(f"- {t}" for t in texts),
                        max_tokens=cfg.note_max_tokens)
        calls = 1
        line = _first_line(reply)
    if line is None:
        return "; ".join(texts), calls, True
    return " ".join(line.split()[:cfg.note_max_tokens]), calls, False


def retrieve(query: str, query_D: np.ndarray, *, bank: Any, graph: PlugMemGraph, config: PlugMemConfig | None = None,
             llm: Any = None, encode: Callable[[list[str]], np.ndarray] | None = None,
             env: str | None = None) -> PlugMemRetrieval:
    """PlugMem's retrieval with abstraction routing and compression (see the module docstring). ``llm=None``: no
    call, the fallbacks; ``encode=None``: abstract queries match nodes exactly only."""
    cfg = _config(config)
    calls, fallbacks = 0, []
    seeds = graph.nearest(bank, query_D, cfg.seed_k, env=env)
    seed_nodes = list(dict.fromkeys(node for c in seeds for node in item_nodes(c)))
    queries: list[str] = []
    if llm is not None and seeds:
        hints = "; ".join(node.split(":", 1)[1] for node in seed_nodes) or "none"
        reply = llm.ask("plug_abstract", query=_collapse(query), hints=hints, max_items=cfg.abstract_max)
        calls += 1
        try:
            queries = parse_items(reply, cfg.abstract_max, what="plugmem abstract queries")
        except ReplyFormatError as error:
            logger.info("plugmem abstract queries: %s; the seeds' concepts and intents instead", error)
    if not queries:
        fallbacks.append("abstract")
        queries = [node.split(":", 1)[1] for node in seed_nodes]
    nodes = _match(queries, graph.nodes(), cfg.match_threshold, encode) if queries else []
    chosen = [c.id or "" for c in seeds]
    routed: list[str] = []
    for node in nodes:
        for item_id in graph.routes(bank, query_D, node, cfg.route_per_node, exclude=[*chosen, *routed]):
            routed.append(item_id)
    ordered = [*chosen, *routed]
    all_texts = [_collapse(graph.graph.cases[i].action) for i in ordered]
    keep = prune_to_budget(all_texts, cfg.budget_tokens)
    kept, texts = [ordered[i] for i in keep], [all_texts[i] for i in keep]
    note, compress_calls, fell_back = compress(query, texts, llm=llm, config=cfg)
    calls += compress_calls
    if fell_back:
        fallbacks.append("compress")
    tokens = count_tokens(note)
    logger.debug("plugmem retrieval: %d seeds, %d nodes, %d routed, %d kept, %d memory tokens", len(seeds),
                 len(nodes), len(routed), len(kept), tokens)
    return PlugMemRetrieval(seeds=chosen, queries=list(queries), nodes=nodes, routed=routed, kept=kept, texts=texts,
                            note=note, memory_tokens=tokens, calls=calls, fallbacks=tuple(fallbacks))
