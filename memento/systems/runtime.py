"""The memory systems inside a run: which builders run when, over the run's bank, with the run's planner.

:class:`SystemsConfig` (``GameLoopConfig.systems``) says what a run builds and shows:

- ``build``: the builders that run (``"cfgm"``: a focus point per environment before its first episode and the
  tips of each game after its attempts, the first time it has a success; ``"lifemem"``: each new episode
  trajectory joins a workflow cluster, clusters split and distil skills; ``"plugmem"``: each new trajectory is
  structured into steps, segmented by subgoal and distilled into propositions and prescriptions,
  :mod:`memento.systems.plugmem`); ``()`` builds nothing;
- ``items``: the candidates a policy chooses from: ``"cases"``, the raw cases only (every earlier run's
  behaviour); ``"all"``, the C nearest raw cases expanded with their linked items
  (:func:`memento.systems.expand.expand_candidates`: items are reached through the trajectories they were made
  from, so superseded cluster and skill versions never crowd raw cases out of the top C; when the bank holds
  plugmem items, also the ``plugmem.seed_k`` most similar of them and the items sharing a concept or intent with
  one in the set, ``plugmem.route_per_node`` per node);
- ``reflect``: CFGM's key-information reflection at every step whose observation is anomalous (the correction
  is shown at the next step);
- ``retries``: CFGM's exploration: a lost or unfinished episode of a game is played again, up to ``retries``
  more times, with a reflection on the failed attempt shown at every step (each attempt is one episode of the
  run);
- ``cfgm`` / ``lifemem`` / ``plugmem``: the builders' settings (``plugmem`` also sets the expansion above, the
  prompt-side retrieval of :meth:`MemorySystems.plugmem_note` and how a prompt shows the chosen PlugMem items:
  compressed into one note by default, :meth:`MemorySystems.prompt_cases`); ``templates``: a JSON file
  replacing builder prompts (:class:`memento.systems.llm.BuilderTemplates`); ``max_new_tokens``: the reply
  length a builder asks of a transformers planner (its own answer length is usually a few tokens).

:class:`MemorySystems` holds the builders and the provenance graph of one open bank; the LLM's replies are cached
in the run directory (``memory_calls.jsonl``) so a resumed run does not pay for them twice, and
:meth:`MemorySystems.stats` reports calls, cache hits, seconds and items built per kind (in ``summary.json``).

Every run builds a :class:`MemorySystems`; with nothing configured (``SystemsConfig.active`` false) each of its hooks
does nothing and the candidates are the bank's own top C, so the loops call them unconditionally.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np

from memento.bank import Candidates
from memento.bank.protocol import Bank
from memento.config import MAX_RETRIES, check, check_int
from memento.errors import ConfigError, ReplyFormatError
from memento.systems.cfgm import CFGMConfig, KeyInfoReflection, build_tips, focus_point, retry_reflection
from memento.systems.expand import expand_candidates
from memento.systems.items import ItemGraph, split_notes
from memento.systems.lifemem import LifeMemConfig, WorkflowClusters
from memento.systems.llm import BuilderTemplates, MemoryLLM, collapse
from memento.systems.plugmem import (
    NOTE_KIND,
    PLUG_KINDS,
    PlugMemBuilder,
    PlugMemConfig,
    PlugMemGraph,
    PlugMemRetrieval,
    compress,
    count_tokens,
    retrieve,
)
from memento.types import Case

__all__ = ["Builder", "ItemsChoice", "MemorySystems", "SystemsConfig", "split_notes"]

logger = logging.getLogger(__name__)

Builder = Literal["cfgm", "lifemem", "plugmem"]
ItemsChoice = Literal["cases", "all"]

@dataclasses.dataclass(frozen=True, kw_only=True)
class SystemsConfig:
    """What a run builds and shows (see the module docstring)."""

    build: tuple[Builder, ...] = dataclasses.field(default=(), metadata={"help": (
        "memory systems that build items: comma-separated cfgm, lifemem, plugmem")})
    items: ItemsChoice = dataclasses.field(default="cases", metadata={"help": (
        "candidates: raw cases only, or with their linked tips, skills and focus points")})
    reflect: bool = dataclasses.field(default=False, metadata={"help": (
        "CFGM's key-information reflection at steps with an anomalous observation")})
    retries: int = dataclasses.field(default=0, metadata={"help": (
        "CFGM's exploration: replay a failed game up to N more times with a reflection")})
    cfgm: CFGMConfig = dataclasses.field(default_factory=CFGMConfig)
    lifemem: LifeMemConfig = dataclasses.field(default_factory=LifeMemConfig)
    plugmem: PlugMemConfig = dataclasses.field(default_factory=PlugMemConfig)
    templates: str | None = dataclasses.field(default=None, metadata={"help": (
        "a JSON file replacing builder prompt templates (memento.systems.llm.BuilderTemplates)")})
    max_new_tokens: int = 64

    def __post_init__(self) -> None:
        cls = type(self)
        build = tuple(self.build) if isinstance(self.build, (list, tuple)) else self.build
        check(isinstance(build, tuple) and all(b in get_args(Builder) for b in build), cls, "build", self.build,
              f"must be a list of {get_args(Builder)}")
        object.__setattr__(self, "build", tuple(dict.fromkeys(build)))
        check(self.items in get_args(ItemsChoice), cls, "items", self.items, f"must be one of {get_args(ItemsChoice)}")
        check(isinstance(self.reflect, bool), cls, "reflect", self.reflect, "must be true or false")
        check_int(self, "retries", 0, MAX_RETRIES)
        check_int(self, "max_new_tokens", 1)
        check(isinstance(self.cfgm, CFGMConfig), cls, "cfgm", self.cfgm, "must be a CFGMConfig")
        check(isinstance(self.lifemem, LifeMemConfig), cls, "lifemem", self.lifemem, "must be a LifeMemConfig")
        check(isinstance(self.plugmem, PlugMemConfig), cls, "plugmem", self.plugmem, "must be a PlugMemConfig")
        check(self.templates is None or (isinstance(self.templates, str) and bool(self.templates.strip())), cls,
              "templates", self.templates, "must be a JSON file path or null")

    @property
    def active(self) -> bool:
        """Anything to do beyond the plain loop."""
        return bool(self.build) or self.items != "cases" or self.reflect or self.retries > 0

    @property
    def needs_llm(self) -> bool:
        """Builders, reflections, retries, or PlugMem items that a prompt shows as a compressed note (a frozen
        evaluation builds nothing but still compresses what its policy chose)."""
        notes = self.items == "all" and self.plugmem.show == "note"
        return bool(self.build) or self.reflect or self.retries > 0 or notes


def builder_planner(planner: Any, max_new_tokens: int) -> Any:
    """The planner a builder asks: a transformers planner with a longer answer; any other planner as it is."""
    replace = getattr(planner, "replace", None)
    if callable(replace) and hasattr(planner, "config") and hasattr(planner.config, "max_new_tokens"):
        try:
            return replace(max_new_tokens=max(max_new_tokens, planner.config.max_new_tokens))
        except (TypeError, ConfigError):
            return planner
    return planner


class MemorySystems:
    """The builders, the LLM and the provenance graph of one run (see the module docstring)."""

    def __init__(self, config: SystemsConfig, *, planner: Any, encode: Callable[[list[str]], np.ndarray],
                 cache_path: str | Path | None, trajectory: Callable[[Case], bool] | None = None):
        self.config = config
        self.trajectory = trajectory  # which raw cases LifeMem and PlugMem take (None: every trajectory of the bank)
        self.encode = encode
        templates = BuilderTemplates() if config.templates is None else BuilderTemplates.from_json(config.templates)
        self.llm = MemoryLLM(builder_planner(planner, config.max_new_tokens), templates=templates,
                             cache_path=cache_path) if config.needs_llm else None
        self.graph = ItemGraph()
        self.plug = PlugMemGraph(self.graph)
        self.clusters: WorkflowClusters | None = None
        self.plugmem: PlugMemBuilder | None = None
        self._notes = {"notes": 0, "memory_tokens": 0, "memory_tokens_max": 0, "calls": 0}
        self.kir = KeyInfoReflection(self.llm, config=config.cfgm) if config.reflect and self.llm else None

    @property
    def active(self) -> bool:
        """Anything configured (``SystemsConfig.active``); otherwise every hook is a no-op."""
        return self.config.active

    def summary(self) -> dict[str, Any]:
        """``{"systems": stats()}`` for a run's summary when any system is configured, else nothing."""
        return {"systems": self.stats()} if self.active else {}

    def answer_meta(self, *, success: bool, family: str) -> dict[str, Any]:
        """What a retained answer carries for the builders in question answering (the judge's verdict and the
        environment; :meth:`after_answer` reads them), nothing when no system runs."""
        return {"success": success, "family": family} if self.active else {}

    def open(self, bank: Bank) -> None:
        """(Re)read the bank's links (after it was opened, created or truncated back to a checkpoint)."""
        if not self.active:
            return
        self.graph = ItemGraph.from_bank(bank)
        self.graph.check()
        self.plug = PlugMemGraph(self.graph)
        if "lifemem" in self.config.build and self.llm is not None:
            self.clusters = WorkflowClusters(self.llm, bank, self.config.lifemem, graph=self.graph,
                                             accepts=self.trajectory)
        if "plugmem" in self.config.build and self.llm is not None:
            self.plugmem = PlugMemBuilder(self.llm, bank, self.config.plugmem, encode=self.encode, graph=self.plug,
                                          accepts=self.trajectory)

    def added(self, cases: Sequence[Case], ids: Sequence[str]) -> None:
        """Record cases the loop added to the bank (the ids ``bank.add`` returned)."""
        if not self.active:
            return
        for case, case_id in zip(cases, ids):
            if case_id not in self.graph:
                self.graph.add(dataclasses.replace(case, id=case_id))

    def _add_items(self, bank: Bank, items: list[Case], vectors_ND: np.ndarray | None = None) -> list[str]:
        if not items:
            return []
        if vectors_ND is None:
            vectors_ND = self.encode([item.state for item in items])
        ids = bank.add(items, vectors_ND, update_meta=False)  # a repeated item keeps the stored one (resume)
        self.added(items, ids)
        return ids

    # ------------------------------------------------------------------ candidates

    def candidates(self, bank: Bank, state_D: np.ndarray, c: int, *, env: str | None,
                   same_env: bool = True) -> Candidates:
        """The candidates a policy chooses from (raw cases, or expanded with items): the C nearest raw cases (of
        ``env`` only when ``same_env``), and with ``items="all"`` their linked items and ``env``'s focus point (and
        the nearest plugmem items and those routed through their concepts and intents, when the bank holds some).
        With no system configured: the bank's top C (of ``env`` only when ``same_env``), whatever their kind."""
        if not self.active:
            return bank.candidates(state_D, c, env=env if same_env else None)
        base = bank.candidates(state_D, c, env=env if same_env else None, kind="case")
        if self.config.items == "cases":
            return base
        plug = self.config.plugmem
        return expand_candidates(bank, self.graph, state_D, base, env=env, plug=self.plug, seeds=plug.seed_k,
                                 route=plug.route_per_node, seed_env=env if same_env else None)

    # ------------------------------------------------------------------ hooks

    def before_episode(self, bank: Bank, env: str, objective: str, admissible: Sequence[str]) -> None:
        """CFGM: the environment's focus point, once, before its first episode."""
        self.ensure_focus(bank, env, objective, [f"> {c}" for c in list(admissible)[:8]])

    def ensure_focus(self, bank: Bank, env: str, description: str, examples: Sequence[str]) -> None:
        """CFGM: the focus point of ``env``, written once (asked again while a reply gave none)."""
        if "cfgm" not in self.config.build or self.llm is None or self.graph.active("focus", env=env):
            return
        item = focus_point(self.llm, env, description, examples, self.config.cfgm)
        if item is not None:
            self._add_items(bank, [item])

    def reflect_step(self, goal: str, history: Sequence[tuple[str, str]], candidates: Sequence[str],
                     score: float | None = None) -> str | None:
        """CFGM's key-information reflection: a correction when the latest observation is anomalous."""
        if self.kir is None:
            return None
        return self.kir.reflect(goal, history, candidates, score=score)

    def retry_note(self, goal: str, history: Sequence[tuple[str, str]], candidates: Sequence[str]) -> str:
        """The reflection on a failed attempt, shown while the game is played again."""
        assert self.llm is not None
        return retry_reflection(self.llm, goal, history, candidates, self.config.cfgm)

    def after_attempts(self, bank: Bank, *, game: str, env: str, task: str) -> None:
        """CFGM: the tips of ``game`` from its episode cases, once it has a success (first time only)."""
        if "cfgm" not in self.config.build or self.llm is None:
            return
        episodes = [c for c in self.graph.with_meta("game", game, "case")
                    if c.env == env and c.meta.get("granularity") == "episode"]
        self._tips(bank, key=game, env=env, task=task, attempts=episodes, won=lambda c: bool(c.meta.get("won")))

    def after_answer(self, bank: Bank, *, task_id: str, env: str, question: str) -> None:
        """CFGM in question answering: the tips of question ``task_id`` from its retained answers (``meta.task_id``;
        a success is ``meta.success``), once it has a success (first time only)."""
        if "cfgm" not in self.config.build or self.llm is None:
            return
        answers = [c for c in self.graph.with_meta("task_id", task_id, "case") if "success" in c.meta]
        self._tips(bank, key=task_id, env=env, task=question, attempts=answers,
                   won=lambda c: bool(c.meta.get("success")))

    def _tips(self, bank: Bank, *, key: str, env: str, task: str, attempts: Sequence[Case],
              won: Callable[[Case], bool]) -> None:
        if any(tip.env == env for tip in self.graph.with_meta("task", key, "tip")):
            return
        successes = [c for c in attempts if won(c)]
        failures = [c for c in attempts if not won(c)]
        if not successes:
            return
        tips = build_tips(self.llm, task, env, successes, failures, self.config.cfgm, task_key=key)
        if tips:
            self._add_items(bank, tips, np.repeat(bank.embeddings([successes[0].id or ""]), len(tips), axis=0))

    def after_episode(self, bank: Bank, episode_case_id: str | None) -> None:
        """A new trajectory: LifeMem adds it to (or founds) a workflow cluster, then PlugMem structures it into
        propositions and prescriptions."""
        if episode_case_id is None:
            return
        if self.clusters is not None:
            try:
                self.clusters.add_trajectory(episode_case_id)
            except ReplyFormatError as error:  # every builder has its own fallback; this is the last guard
                logger.warning("lifemem: %s", error)
        if self.plugmem is not None:
            try:
                self.plugmem.add_trajectory(episode_case_id)
            except ReplyFormatError as error:
                logger.warning("plugmem: %s", error)

    def prompt_cases(self, query: str, cases: Sequence[Case]) -> list[Case]:
        """What the planner is shown for ``cases`` (a policy's choice, in order): with PlugMem's ``show="note"``
        the PlugMem items among them become one transient ``memory`` entry at the first one's place, their
        texts compressed for ``query`` (:func:`memento.systems.plugmem.compress`, the run's LLM when it has one,
        else the fallback); every other entry as it is. The notes are counted in :meth:`stats`."""
        plug = [c for c in cases if c.kind in PLUG_KINDS] if self.active else []
        if not plug or self.config.plugmem.show != "note":
            return list(cases)
        note, calls, _ = compress(query, [collapse(c.action) for c in plug], llm=self.llm, config=self.config.plugmem)
        self._count_note(count_tokens(note), calls)
        entry = Case(state=query, action=note, reward=0.0, kind=NOTE_KIND, meta={"sources": [c.id for c in plug]})
        out: list[Case] = []
        for case in cases:
            if case.kind not in PLUG_KINDS:
                out.append(case)
            elif case is plug[0]:
                out.append(entry)
        return out

    def _count_note(self, tokens: int, calls: int) -> None:
        notes = self._notes
        notes["notes"] += 1
        notes["memory_tokens"] += tokens
        notes["memory_tokens_max"] = max(notes["memory_tokens_max"], tokens)
        notes["calls"] += calls

    def plugmem_note(self, bank: Bank, query: str, state_D: np.ndarray, *,
                     env: str | None = None) -> PlugMemRetrieval:
        """PlugMem's prompt-side retrieval for ``query`` (:func:`memento.systems.plugmem.retrieve`: abstract
        queries and compression with the run's LLM when it has one, else their fallbacks); its memory tokens
        are counted in :meth:`stats` (``plugmem_notes``). The loops do not call it: they show the items a policy
        chose (:meth:`prompt_cases`)."""
        result = retrieve(query, state_D, bank=bank, graph=self.plug, config=self.config.plugmem, llm=self.llm,
                          encode=self.encode, env=env)
        self._count_note(result.memory_tokens, result.calls)
        return result

    def stats(self) -> dict[str, Any]:
        """The builders' LLM accounting, the items they built per kind (what each builder counted: reflections are
        not bank items; skills carried forward to a new cluster version cost no call and are not counted), and the
        bank's active entries per kind."""
        out: dict[str, Any] = {"items_built": {}}
        if self.llm is not None:
            out["llm"] = self.llm.stats()
            out["items_built"] = {k: v for k, v in out["llm"]["items_by_kind"].items() if k != "reflection"}
        if self.kir is not None:
            out["reflection"] = {"fired": int(getattr(self.kir, "fired", 0)),
                                 "calls": int(getattr(self.kir, "calls", 0))}
        kinds: dict[str, int] = {}
        for case in self.graph.cases.values():
            if self.graph.is_active(case.id or ""):
                kinds[case.kind] = kinds.get(case.kind, 0) + 1
        out["active_by_kind"] = dict(sorted(kinds.items()))
        if self._notes["notes"]:
            n = self._notes["notes"]
            out["plugmem_notes"] = {"notes": n, "calls": self._notes["calls"],
                                    "memory_tokens_mean": round(self._notes["memory_tokens"] / n, 2),
                                    "memory_tokens_max": self._notes["memory_tokens_max"]}
        return out
