"""Planner-scored labels: dense, per-candidate supervision for a case selector, offline (EPR / LLM-R style).

For each training task whose gold answer is known, the frozen planner scores demonstrations without
generating (docs/training.md, "From planner-scored labels"): the question is encoded, the top-``C`` cases by cosine
similarity are taken from the bank, and the log-likelihood of the gold answer (``task.answers[0]``) is
computed for the prompt with each candidate as the only demonstration (and, when ``k > 1``, for ``sets``
random K-sets of those candidates, drawn with a seeded ``numpy.random.Generator``). The scores are written
as JSONL, one self-describing row per task (no header line), and ``memento train --from-labels`` trains a
Q-network towards them (:mod:`memento.learn.listwise`).

Row format (docs/training.md, "From planner-scored labels")::

    {"task_id": "facts-real-capital-BY", "state": "What is the capital of Belarus?", "answer": "Minsk",
     "candidate_ids": ["c1", "c2", ...],          # the C cosine candidates, best cosine first
     "logprob": [-3.1, -0.4, ...],                # log p(answer | prompt with that one case), natural log
     "mean_logprob": [-1.55, -0.2, ...],          # logprob / n_tokens (what training ranks by)
     "n_tokens": [2, 2, ...],                     # the answer's tokens
     "cosine": [0.83, 0.79, ...],                 # optional: the candidates' cosine similarity
     "prompt_tokens": [41, 38, ...],              # optional: prompt tokens read before the answer
     "sets": [["c2", "c7", "c1", "c4"], ...],     # only when k > 1: the sampled K-sets, in prompt order
     "set_logprob": [-0.3, ...],                  # only when k > 1: log p(answer | prompt with that set)
     "planner": "HFPlanner(model=...)", "prompt": "few_shot"}

The labelling cost (scored prompts = forward passes of one sequence, and wall time) is returned by
:func:`label_tasks` and written beside the labels as ``<labels stem>.summary.json`` (:func:`summary_path`).

- :class:`LabelConfig` -- candidates ``C``, the planner spec, max tasks, seed, ``k`` and ``sets``, batch size;
- :func:`score_candidates` -- the rows, lazily (``LabelCost`` counts what they cost);
- :func:`write_labels` (atomic) / :func:`read_labels` / :func:`iter_labels` -- the JSONL file, every
  problem a one-line ``DataFormatError`` naming ``file:line``;
- :func:`label_tasks` -- score, write the labels and the summary, return the summary;
- :func:`read_label_tasks` -- a task file where tasks without answers are skipped and counted.
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
from memento.formats import iter_jsonl, write_jsonl
from memento.io import atomic_write_text, finite_float
from memento.planners.base import PlannerError
from memento.types import Case, Task, check_id, check_text, shown

__all__ = ["COSINE_SLACK", "LABELS_SUMMARY_FORMAT", "LabelConfig", "LabelCost", "LabelRow", "iter_labels",
           "label_tasks", "prompt_name", "read_label_tasks", "read_labels", "score_candidates", "summary_path",
           "write_labels"]

logger = logging.getLogger(__name__)

LABELS_SUMMARY_FORMAT = "memento-labels-summary"
_REQUIRED = ("task_id", "state", "answer", "candidate_ids", "logprob", "mean_logprob", "n_tokens", "planner",
             "prompt")
_OPTIONAL = ("cosine", "prompt_tokens", "sets", "set_logprob")
_KEYS = set(_REQUIRED) | set(_OPTIONAL)
_MAX_COUNT = 2 ** 31 - 1  # the largest token count a row may hold
COSINE_SLACK = 0.05
"""How far beyond [-1, 1] a row's ``cosine`` may lie: an approximate (compressed) index scores a candidate with its
quantised vector, a little off the exact cosine."""


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


def _finite_list(row: dict[str, Any], name: str, n: int, *, integer: bool = False, low: float | None = None,
                 high: float | None = None, what: str = "candidate(s)", meaning: str = "") -> tuple[Any, ...]:
    """``row[name]``: a list of ``n`` finite numbers (integers when ``integer``) in ``[low, high]`` (either bound
    optional; ``meaning`` says what the range is, for the error)."""
    value = row.get(name)
    if not isinstance(value, (list, tuple)):
        raise DataFormatError(f"missing field {name!r}" if value is None else
                              f"field {name!r} must be a list of numbers, got {type(value).__name__}")
    if len(value) != n:
        raise DataFormatError(f"field {name!r} has {len(value)} value(s) for {n} {what}")
    out = []
    for i, item in enumerate(value):
        if isinstance(item, bool) or not isinstance(item, (int, float)):
            raise DataFormatError(f"field {name!r}[{i}] must be a number, got {shown(item)}")
        number = finite_float(item)  # None for NaN, infinity and integers past float range (never raises)
        if integer and (not isinstance(item, int) or (low is not None and item < low)
                        or (high is not None and item > high)):
            bounds = f">= {low}" if high is None else f"in [{low}, {high}]"
            raise DataFormatError(f"field {name!r}[{i}] must be an integer {bounds}{meaning}, got {shown(item)}")
        if number is None:
            raise DataFormatError(f"field {name!r}[{i}] is {shown(item)}: scores must be finite")
        if (low is not None and number < low) or (high is not None and number > high):
            bounds = f"<= {high:g}" if low is None else f">= {low:g}" if high is None else f"in [{low:g}, {high:g}]"
            raise DataFormatError(f"field {name!r}[{i}] is {shown(item)}: must be {bounds}{meaning}")
        out.append(int(item) if integer else number)
    return tuple(out)


def _text(row: dict[str, Any], name: str, *, is_id: bool = False) -> str:
    """``row[name]``: a text (1 to MAX_TEXT_CHARS characters, not blank, no NUL) or, ``is_id``, an id (at most
    MAX_ID_CHARS, no control character), as every record's field is checked (:mod:`memento.types`)."""
    value = row.get(name)
    if value is None:
        raise DataFormatError(f"missing field {name!r}")
    return (check_id if is_id else check_text)(value, f"field {name!r}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LabelRow:
    """One task's labels (one JSONL row; see the module docstring). Lists are tuples; every score is finite."""

    task_id: str
    state: str
    answer: str
    candidate_ids: tuple[str, ...]
    logprob: tuple[float, ...]
    mean_logprob: tuple[float, ...]
    n_tokens: tuple[int, ...]
    planner: str
    prompt: str
    cosine: tuple[float, ...] | None = None
    prompt_tokens: tuple[int, ...] | None = None
    sets: tuple[tuple[str, ...], ...] | None = None
    set_logprob: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        # one validator for rows built in Python and rows read back: the JSON form's
        raw = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}
        for name, value in _parse_row(raw).items():
            object.__setattr__(self, name, value)

    @property
    def n_candidates(self) -> int:
        return len(self.candidate_ids)

    @property
    def best(self) -> int:
        """The index of the candidate with the highest ``mean_logprob`` (the first on ties)."""
        return int(np.argmax(np.asarray(self.mean_logprob)))

    def to_json(self) -> dict[str, Any]:
        row: dict[str, Any] = {"task_id": self.task_id, "state": self.state, "answer": self.answer,
                               "candidate_ids": list(self.candidate_ids), "logprob": list(self.logprob),
                               "mean_logprob": list(self.mean_logprob), "n_tokens": list(self.n_tokens)}
        if self.cosine is not None:
            row["cosine"] = list(self.cosine)
        if self.prompt_tokens is not None:
            row["prompt_tokens"] = list(self.prompt_tokens)
        if self.sets is not None:
            row["sets"] = [list(s) for s in self.sets]
        if self.set_logprob is not None:
            row["set_logprob"] = list(self.set_logprob)
        row["planner"] = self.planner
        row["prompt"] = self.prompt
        return row

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> LabelRow:
        """A row from its parsed JSON; anything missing, mistyped, non-finite or of the wrong length raises
        :class:`DataFormatError` (one line, without the file: :func:`iter_labels` adds it)."""
        return cls(**_parse_row(row))


def _parse_row(row: dict[str, Any]) -> dict[str, Any]:
    """The checked, normalised field values of a label row (lists as tuples, numbers as float / int).

    Every field is checked for what it means: ids are ids and texts texts (:mod:`memento.types`: bounded, no NUL,
    not blank); ``logprob``, ``mean_logprob`` and ``set_logprob`` are log-probabilities (finite, <= 0) and
    ``mean_logprob`` is ``logprob / n_tokens`` (within 1e-3); ``n_tokens`` is a token count in [1, 2**31 - 1] and
    ``prompt_tokens`` in [0, 2**31 - 1]; ``cosine`` is a cosine similarity (in [-1, 1], with
    :data:`COSINE_SLACK` for an approximate index's scores); at most :data:`~memento.config.MAX_CANDIDATES`
    candidates, each once; at most :data:`~memento.config.MAX_K_SETS` sets of 1 to
    :data:`~memento.config.MAX_K` candidates, each case once in a set and no set listed twice."""
    if not isinstance(row, dict):
        raise DataFormatError(f"a label row must be an object, got {type(row).__name__}")
    unknown = sorted(set(row) - _KEYS)
    if unknown:
        raise DataFormatError(f"unknown field(s) {shown(unknown)} in a label row; known: {sorted(_KEYS)}")
    task_id = _text(row, "task_id", is_id=True)
    state, answer = _text(row, "state"), _text(row, "answer")
    ids = row.get("candidate_ids")
    if ids is None:
        raise DataFormatError("missing field 'candidate_ids'")
    if not isinstance(ids, (list, tuple)) or not ids:
        raise DataFormatError(f"field 'candidate_ids' must be a non-empty list of case ids, got {shown(ids)}")
    if len(ids) > MAX_CANDIDATES:
        raise DataFormatError(f"field 'candidate_ids' lists {len(ids)} candidates, more than {MAX_CANDIDATES}")
    for i, case_id in enumerate(ids):
        check_id(case_id, f"field 'candidate_ids'[{i}]")
    if len(set(ids)) != len(ids):
        raise DataFormatError(f"field 'candidate_ids' lists a case twice: {shown(list(ids))}")
    n = len(ids)
    logprob = _finite_list(row, "logprob", n, high=0.0, meaning=" (a log-probability)")
    mean = _finite_list(row, "mean_logprob", n, high=0.0, meaning=" (a log-probability per token)")
    n_tokens = _finite_list(row, "n_tokens", n, integer=True, low=1, high=_MAX_COUNT, meaning=" (a token count)")
    for i, (total, per_token, count) in enumerate(zip(logprob, mean, n_tokens)):
        if not math.isclose(per_token, total / count, rel_tol=1e-3, abs_tol=1e-3):
            raise DataFormatError(f"field 'mean_logprob'[{i}] is {shown(per_token)}, but logprob / n_tokens is "
                                  f"{shown(total)} / {count} = {shown(total / count)}")
    values: dict[str, Any] = {
        "task_id": task_id, "state": state, "answer": answer, "candidate_ids": tuple(ids),
        "logprob": logprob, "mean_logprob": mean, "n_tokens": n_tokens,
        "planner": _text(row, "planner"), "prompt": _text(row, "prompt", is_id=True)}
    if row.get("cosine") is not None:
        values["cosine"] = _finite_list(row, "cosine", n, low=-1.0 - COSINE_SLACK, high=1.0 + COSINE_SLACK,
                                        meaning=" (a cosine similarity)")
    if row.get("prompt_tokens") is not None:
        values["prompt_tokens"] = _finite_list(row, "prompt_tokens", n, integer=True, low=0, high=_MAX_COUNT,
                                               meaning=" (a token count)")
    has_sets, has_scores = row.get("sets") is not None, row.get("set_logprob") is not None
    if has_sets != has_scores:
        raise DataFormatError("fields 'sets' and 'set_logprob' go together: one of them is missing")
    if has_sets:
        sets = row["sets"]
        if not isinstance(sets, (list, tuple)):
            raise DataFormatError(f"field 'sets' must be a list of case-id lists, got {type(sets).__name__}")
        if len(sets) > MAX_K_SETS:
            raise DataFormatError(f"field 'sets' lists {len(sets)} sets, more than {MAX_K_SETS}")
        known = set(ids)
        parsed: list[tuple[str, ...]] = []
        for j, case_set in enumerate(sets):
            if (not isinstance(case_set, (list, tuple)) or not case_set
                    or not all(isinstance(i, str) and i for i in case_set)):
                raise DataFormatError(f"field 'sets'[{j}] must be a non-empty list of case ids, "
                                      f"got {shown(case_set)}")
            if len(case_set) > MAX_K:
                raise DataFormatError(f"field 'sets'[{j}] holds {len(case_set)} cases, more than {MAX_K}")
            outside = [i for i in case_set if i not in known]
            if outside:
                raise DataFormatError(f"field 'sets'[{j}] holds {shown(outside[0])}, which is not a candidate")
            if len(set(case_set)) != len(case_set):
                raise DataFormatError(f"field 'sets'[{j}] holds a case twice: {shown(list(case_set))}")
            if tuple(case_set) in parsed:
                raise DataFormatError(f"field 'sets'[{j}] repeats 'sets'[{parsed.index(tuple(case_set))}]: "
                                      f"{shown(list(case_set))}")
            parsed.append(tuple(case_set))
        values["sets"] = tuple(parsed)
        values["set_logprob"] = _finite_list(row, "set_logprob", len(parsed), high=0.0, what="set(s)",
                                             meaning=" (a log-probability)")
    return values


def iter_labels(path: str | Path) -> Iterator[tuple[int, LabelRow]]:
    """``(line, row)`` for each row of a labels file; a bad row raises ``DataFormatError`` as ``file:line: reason``."""
    for number, raw in iter_jsonl(path):
        try:
            yield number, LabelRow.from_json(raw)
        except DataFormatError as error:
            raise DataFormatError(error.reason, path=path, line=number) from None


def read_labels(path: str | Path) -> list[LabelRow]:
    """Every row of a labels file (the whole file is checked before anything is returned)."""
    return [row for _, row in iter_labels(path)]


def write_labels(path: str | Path, rows: Iterable[LabelRow]) -> int:
    """Write rows as JSONL atomically (a temporary file renamed into place); returns the number written."""
    return write_jsonl(path, (row.to_json() for row in rows))


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
