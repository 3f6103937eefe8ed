"""Scoring candidates with the frozen planner: ``memento score``'s labels (EPR / LLM-R style), offline.

For each training task whose gold answer is known, the frozen planner scores demonstrations without
generating (docs/training.md, "From planner-scored labels"): the question is encoded, the top-``C`` cases by cosine
similarity are taken from the bank, and the log-likelihood of the gold answer (``task.answers[0]``) is
computed for the prompt with each candidate as the only demonstration (and, when ``k > 1``, for ``sets``
random K-sets of those candidates, drawn with a seeded ``numpy.random.Generator``). The scores are written
as JSONL, one :class:`~memento.learn.labels.LabelRow` per task (the row format is in :mod:`memento.learn.labels`,
which reads and writes the file and holds nothing of the planner), and ``memento train --from-labels`` trains a
Q-network towards them (:mod:`memento.learn.listwise`).

The labelling cost (scored prompts = forward passes of one sequence, and wall time) is returned by
:func:`label_tasks` and written beside the labels as ``<labels stem>.summary.json`` (:func:`summary_path`).

- :class:`LabelConfig` -- candidates ``C``, the planner spec, max tasks, seed, ``k`` and ``sets``, batch size;
- :func:`score_candidates` -- the rows, lazily (``LabelCost`` counts what they cost);
- :func:`label_tasks` -- score, write the labels and the summary, return the summary;
- :func:`read_label_tasks` -- a task file where tasks without answers are skipped and counted;
- :func:`prompt_name` -- the planner's prompt template name, a row's ``prompt`` (online labels write it too).

This module sits above both :mod:`memento.planners` (it calls ``score_many``) and :mod:`memento.learn` (it builds
the rows); ``memento.learn`` imports nothing of the planners.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from memento.config import (
    MAX_BATCH,
    MAX_CANDIDATES,
    MAX_K,
    MAX_K_SETS,
    MAX_SEED,
    MAX_STEPS,
    check,
    check_bools,
    check_int,
    check_ints,
    to_dict,
)
from memento.errors import DataFormatError, DimensionError
from memento.formats import iter_jsonl
from memento.io import atomic_write_text
from memento.learn.labels import LabelRow, write_labels
from memento.planners.base import PlannerError
from memento.types import Case, Task, shown

__all__ = ["LABELS_SUMMARY_FORMAT", "LabelConfig", "LabelCost", "label_tasks", "prompt_name", "read_label_tasks",
           "score_candidates", "summary_path"]

logger = logging.getLogger(__name__)

LABELS_SUMMARY_FORMAT = "memento-labels-summary"


@dataclasses.dataclass(frozen=True, kw_only=True)
class LabelConfig:
    """How tasks are labelled (saved in the summary).

    - ``candidates``: C, the cosine top-C of the bank scored per task;
    - ``planner``: the planner spec (``gemma``, ``hf:PATH``, ``openai:MODEL@URL``; the CLI builds it);
    - ``max_tasks``: score at most this many tasks (the first ones with an answer, in file order; ``None``: all);
    - ``seed``: seeds the ``numpy.random.Generator`` that draws the K-sets;
    - ``k``: 1 scores single-case demonstrations only; ``k > 1`` also scores ``sets`` random K-sets of the
      task's candidates (distinct as sets, in the order drawn);
    - ``sets``: random K-sets per task when ``k > 1`` (ignored when ``k == 1``);
    - ``batch_size``: tasks whose prompts go to one ``planner.score_many`` call (the planner batches
      sequences itself, e.g. ``HFPlanner.batch_size``);
    - ``exclude_self``: leave out candidates whose state is the task's own question (a case retained from
      the same task would show the planner its own answer).
    """

    candidates: int = dataclasses.field(default=16, metadata={"help": "cosine candidates C scored per task"})
    planner: str = dataclasses.field(default="gemma", metadata={"help": (
        "the planner spec (gemma, hf:PATH, hf://ORG/NAME[@REV], openai:MODEL@URL[?...])")})
    max_tasks: int | None = dataclasses.field(default=None, metadata={"help": (
        "score at most N tasks (the first with answers)")})
    seed: int = dataclasses.field(default=0, metadata={"help": "seed of the K-set draws"})
    k: int = dataclasses.field(default=1, metadata={"help": "1: single-case demonstrations; K > 1: also random K-sets"})
    sets: int = dataclasses.field(default=8, metadata={"help": "random K-sets scored per task when --k > 1"})
    batch_size: int = dataclasses.field(default=8, metadata={"help": "tasks per planner.score_many call"})
    exclude_self: bool = dataclasses.field(default=True, metadata={"help": (
        "leave out candidates whose state is the task's own question; --keep-self: keep them")})

    def __post_init__(self) -> None:
        cls = type(self)
        check_int(self, "candidates", 1, MAX_CANDIDATES)
        check(isinstance(self.planner, str) and bool(self.planner.strip()), cls, "planner", self.planner,
              "must be a planner spec such as 'gemma', 'hf:PATH' or 'openai:MODEL@URL'")
        if self.max_tasks is not None:
            check_int(self, "max_tasks", 1, MAX_STEPS)
        check_ints(self, seed=(0, MAX_SEED), k=(1, MAX_K))
        check(self.k <= self.candidates, cls, "k", self.k, f"must be <= candidates={self.candidates}")
        check_ints(self, sets=(0, MAX_K_SETS), batch_size=(1, MAX_BATCH))
        check_bools(self, "exclude_self")

    @property
    def sets_per_task(self) -> int:
        """The K-sets drawn per task: ``sets`` when ``k > 1``, else 0."""
        return self.sets if self.k > 1 else 0

def summary_path(path: str | Path) -> Path:
    """Where the summary of a labels file goes: ``labels.jsonl`` -> ``labels.summary.json`` (same directory)."""
    path = Path(path)
    stem = path.name[:-len(".jsonl")] if path.name.endswith(".jsonl") else path.name
    return path.with_name(f"{stem}.summary.json")


# ---------------------------------------------------------------- reading tasks


def read_label_tasks(path: str | Path) -> tuple[list[Task], int]:
    """Tasks of a Task JSONL file for labelling, and how many were skipped for having no answer.

    A row whose ``answers`` is missing, ``null``, empty or only blank strings is skipped and counted
    (there is no gold answer to score); any other problem is a ``DataFormatError`` naming ``file:line``.
    """
    tasks: list[Task] = []
    skipped = 0
    for number, row in iter_jsonl(path):
        answers = row.get("answers")
        if answers is None or (isinstance(answers, list) and not any(isinstance(a, str) and a.strip()
                                                                     for a in answers)):
            skipped += 1
            continue
        try:
            if not isinstance(answers, list):
                raise DataFormatError(f"field 'answers' must be a list, got {type(answers).__name__}")
            task_id = row.get("id")
            if isinstance(task_id, bool) or not isinstance(task_id, (str, int)):
                raise DataFormatError("missing field 'id'" if task_id is None else
                                      f"field 'id' must be a string, got {shown(task_id)}")
            question = row.get("question")
            if not isinstance(question, str):
                raise DataFormatError("missing field 'question'" if question is None else
                                      f"field 'question' must be a string, got {type(question).__name__}")
            meta = row.get("meta") or {}
            tasks.append(Task(id=str(task_id), question=question,
                              answers=tuple(a for a in answers if isinstance(a, str) and a.strip()),
                              family=row.get("family"), env=row.get("env"), meta=meta))
        except DataFormatError as error:
            raise DataFormatError(error.reason, path=path, line=number) from None
    return tasks, skipped


# ---------------------------------------------------------------- scoring


@dataclasses.dataclass(kw_only=True)
class LabelCost:
    """What labelling cost and skipped, filled in by :func:`score_candidates` as it goes.

    ``forward_passes`` counts scored prompts (one (prompt, answer) sequence each: ``single_passes``, one per
    candidate, plus ``set_passes``); ``score_s`` is the time spent inside ``planner.score_many``, ``wall_s``
    the whole run (encoding and retrieval included).
    """

    tasks: int = 0
    skipped_no_answer: int = 0
    skipped_no_candidates: int = 0
    short_tasks: int = 0
    excluded_self: int = 0
    single_passes: int = 0
    set_passes: int = 0
    score_calls: int = 0
    score_s: float = 0.0
    wall_s: float = 0.0
    prompt_tokens: int = 0
    truncated_prompts: int = 0

    @property
    def forward_passes(self) -> int:
        return self.single_passes + self.set_passes

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        passes = self.forward_passes
        out["forward_passes"] = passes
        out["s_per_forward"] = self.score_s / passes if passes else None
        out["wall_s_per_task"] = self.wall_s / self.tasks if self.tasks else None
        out["prompt_tokens_mean"] = self.prompt_tokens / passes if passes else None
        return out


def _same_text(a: str, b: str) -> bool:
    return " ".join(a.split()).casefold() == " ".join(b.split()).casefold()


def prompt_name(planner: Any) -> str:
    """The planner's prompt template name (``PromptConfig.style``), or ``"custom"`` for a planner without one."""
    style = getattr(getattr(planner, "prompt", None), "style", None)
    return style if isinstance(style, str) and style else "custom"


def _draw_sets(n: int, k: int, count: int, rng: np.random.Generator) -> list[tuple[int, ...]]:
    """Up to ``count`` K-subsets of ``range(n)`` distinct as sets, each in the order drawn."""
    if count == 0 or n < k:
        return []
    total = math.comb(n, k)
    target = min(count, total)
    seen: set[frozenset[int]] = set()
    out: list[tuple[int, ...]] = []
    attempts = 0
    while len(out) < target and attempts < 50 * target:
        attempts += 1
        draw = tuple(int(i) for i in rng.choice(n, size=k, replace=False))
        key = frozenset(draw)
        if key not in seen:
            seen.add(key)
            out.append(draw)
    return out


def _encode(encoder: Any, texts: list[str], dim: int) -> np.ndarray:
    out = np.asarray(encoder.encode(texts), dtype=np.float32).reshape(len(texts), -1)
    if out.shape[1] != dim:
        raise DimensionError(f"encoder returned vectors of shape {out.shape}; the bank holds dim={dim}")
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    if not np.isfinite(out).all() or (norms == 0).any():
        raise DataFormatError("encoder returned NaN, inf or zero vectors for the task questions")
    return out / norms


@dataclasses.dataclass
class _Pending:
    task: Task
    ids: list[str]
    cases: list[Case]
    cosine: list[float]
    sets: list[tuple[int, ...]]


class _Scorer:
    """One labelling run's two steps per batch: the candidates and K-sets of each task, then their scores."""

    def __init__(self, bank: Any, encoder: Any, planner: Any, config: LabelConfig, cost: LabelCost):
        self.bank, self.encoder, self.planner, self.config, self.cost = bank, encoder, planner, config, cost
        self.rng = np.random.default_rng(config.seed)
        self.planner_name, self.prompt = repr(planner), prompt_name(planner)
        self.fetch = config.candidates * 2 if config.exclude_self else config.candidates

    def candidates_of(self, batch: list[Task]) -> list[_Pending]:
        """Each task's candidates (itself excluded when configured) and K-sets; a task without any is skipped."""
        config, cost = self.config, self.cost
        state_BD = _encode(self.encoder, [task.question for task in batch], self.bank.dim)
        pending = []
        for task, state_D in zip(batch, state_BD):
            found = self.bank.candidates(state_D, self.fetch)
            keep = list(range(len(found.ids)))
            cases = self.bank.get(found.ids) if found.ids else []
            if config.exclude_self:
                keep = [i for i in keep if not _same_text(cases[i].state, task.question)]
                cost.excluded_self += len(found.ids) - len(keep)
            keep = keep[:config.candidates]
            if not keep:
                cost.skipped_no_candidates += 1
                continue
            if len(keep) < config.candidates:
                cost.short_tasks += 1
            sets = _draw_sets(len(keep), config.k, config.sets_per_task, self.rng)
            pending.append(_Pending(task=task, ids=[found.ids[i] for i in keep], cases=[cases[i] for i in keep],
                                    cosine=[float(found.scores_C[i]) for i in keep], sets=sets))
        return pending

    def score(self, pending: list[_Pending]) -> list[LabelRow]:
        """One ``score_many`` call over every pending task's single cases and K-sets; a row per task."""
        case_sets = [[[case] for case in p.cases] + [[p.cases[i] for i in s] for s in p.sets] for p in pending]
        t0 = time.perf_counter()
        scores = self.planner.score_many([p.task for p in pending], case_sets)
        self.cost.score_s += time.perf_counter() - t0
        self.cost.score_calls += 1
        if len(scores) != len(pending):
            raise PlannerError(f"planner {self.planner_name}: score_many returned {len(scores)} lists for "
                               f"{len(pending)} tasks")
        return [self._row(p, task_scores) for p, task_scores in zip(pending, scores)]

    def _row(self, p: _Pending, task_scores: Sequence[Any]) -> LabelRow:
        cost = self.cost
        n = len(p.cases)
        if len(task_scores) != n + len(p.sets):
            raise PlannerError(f"planner {self.planner_name}: task {p.task.id!r}: {len(task_scores)} scores for "
                               f"{n + len(p.sets)} case sets")
        single, multi = task_scores[:n], task_scores[n:]
        cost.single_passes += n
        cost.set_passes += len(multi)
        cost.prompt_tokens += sum(s.prompt_tokens for s in task_scores)
        cost.truncated_prompts += sum(1 for s in task_scores if s.truncated_tokens)
        extra: dict[str, Any] = {}
        if self.config.k > 1:
            extra = {"sets": tuple(tuple(p.ids[i] for i in s) for s in p.sets),
                     "set_logprob": tuple(s.logprob for s in multi)}
        row = LabelRow(task_id=p.task.id, state=p.task.question, answer=p.task.answers[0],
                       candidate_ids=tuple(p.ids), logprob=tuple(s.logprob for s in single),
                       mean_logprob=tuple(s.mean_logprob for s in single),
                       n_tokens=tuple(s.n_tokens for s in single), cosine=tuple(p.cosine),
                       prompt_tokens=tuple(s.prompt_tokens for s in single), planner=self.planner_name,
                       prompt=self.prompt, **extra)
        cost.tasks += 1
        return row


def _task_batches(tasks: Iterable[Task], config: LabelConfig, cost: LabelCost) -> Iterator[list[Task]]:
    """The tasks with a known answer (at most ``config.max_tasks``), in batches of ``config.batch_size``."""
    batch: list[Task] = []
    taken = 0
    for task in tasks:
        if config.max_tasks is not None and taken >= config.max_tasks:
            break
        if not task.answers or not task.answers[0].strip():
            cost.skipped_no_answer += 1
            continue
        batch.append(task)
        taken += 1
        if len(batch) == config.batch_size:
            yield batch
            batch = []
    if batch:
        yield batch


def score_candidates(tasks: Iterable[Task], bank: Any, encoder: Any, planner: Any, config: LabelConfig,
                     progress: bool = False, *, cost: LabelCost | None = None) -> Iterator[LabelRow]:
    """Label each task with a known answer (see the module docstring); rows come in task order, lazily.

    ``bank`` is a :class:`~memento.bank.CaseBank`; ``encoder`` has ``encode(texts)`` and ``dim`` (the bank's);
    ``planner`` implements ``score_many`` (:class:`~memento.planners.base.ScoringPlanner`; one that cannot score
    raises its one-line :class:`PlannerError`). ``cost``, when given, is filled in as rows are produced.
    The K-sets are drawn from one ``numpy.random.default_rng(config.seed)`` in task order, so a run is
    reproducible (and independent of ``batch_size``).
    """
    if not isinstance(config, LabelConfig):
        raise DataFormatError(f"score_candidates: config must be a LabelConfig, got {type(config).__name__}")
    if not callable(getattr(planner, "score_many", None)):
        raise PlannerError(f"planner {planner!r} cannot score answers (it has no score_many; "
                           "labels need a ScoringPlanner such as HFPlanner)")
    dim = getattr(encoder, "dim", None)
    if dim != bank.dim:
        raise DimensionError(f"encoder {encoder!r} gives dim={dim} vectors, the bank {bank.path} holds dim={bank.dim}")
    cost = cost if cost is not None else LabelCost()
    scorer = _Scorer(bank, encoder, planner, config, cost)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        total = None
        if isinstance(tasks, Sequence):
            total = len(tasks) if config.max_tasks is None else min(config.max_tasks, len(tasks))
        bar = tqdm(total=total, desc="score", unit="task")
    started = time.perf_counter()
    try:
        for batch in _task_batches(tasks, config, cost):
            pending = scorer.candidates_of(batch)
            rows = scorer.score(pending) if pending else []
            if bar is not None:
                bar.update(len(batch))
            cost.wall_s = time.perf_counter() - started
            yield from rows
    finally:
        cost.wall_s = time.perf_counter() - started
        if bar is not None:
            bar.close()


def label_tasks(tasks: Iterable[Task], bank: Any, encoder: Any, planner: Any, config: LabelConfig,
                out: str | Path, *, progress: bool = False, meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """Score ``tasks`` (:func:`score_candidates`), write the labels to ``out`` and the summary beside it
    (:func:`summary_path`), both atomically; return the summary.

    The summary holds the cost (``forward_passes``, ``single_passes``, ``set_passes``, ``wall_s``, ``score_s``,
    ``s_per_forward``, prompt tokens), the skipped counts, the config, the planner, the prompt, the bank and
    ``meta`` (e.g. where the tasks came from and how many were skipped for having no answer).
    """
    out = Path(out)
    cost = LabelCost()
    rows = write_labels(out, score_candidates(tasks, bank, encoder, planner, config, progress, cost=cost))
    summary: dict[str, Any] = {
        "format": LABELS_SUMMARY_FORMAT, "format_version": 1, "labels": str(out), "rows": rows,
        **cost.to_json(), "planner": repr(planner), "prompt": prompt_name(planner),
        "bank": str(getattr(bank, "path", "")), "bank_cases": len(bank), "encoder": repr(encoder),
        "config": to_dict(config), "time": time.time(), **(meta or {})}
    if meta and "skipped_no_answer" in meta:
        summary["skipped_no_answer"] = cost.skipped_no_answer + int(meta["skipped_no_answer"])
    atomic_write_text(summary_path(out), json.dumps(summary, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    logger.info("labelled %d task(s): %d forward passes in %.1f s (%.3f s of scoring each)", rows,
                cost.forward_passes, cost.wall_s, summary["s_per_forward"] or 0.0)
    return summary
