"""Planner-scored labels: the label file a case selector learns from (EPR / LLM-R style), and its rows.

``memento score`` (:mod:`memento.runs.labels`) has the frozen planner score demonstrations without generating
(docs/training.md, "From planner-scored labels"): for each training task whose gold answer is known, the top-``C``
cases by cosine similarity are taken from the bank, and the log-likelihood of the gold answer is computed for the
prompt with each candidate as the only demonstration (and, when ``k > 1``, for random K-sets of those
candidates). The scores are written as JSONL, one self-describing row per task (no header line), and
``memento train --from-labels`` trains a Q-network towards them (:mod:`memento.learn.listwise`). Online runs
write rows of the same format (``labels.jsonl`` of a run directory).

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

- :class:`LabelRow` -- one row, checked field by field whether built in Python or read back;
- :func:`write_labels` (atomic) / :func:`read_labels` / :func:`iter_labels` -- the JSONL file, every
  problem a one-line ``DataFormatError`` naming ``file:line``.

Nothing here calls a planner: scoring candidates with one (:class:`~memento.runs.labels.LabelConfig`,
:func:`~memento.runs.labels.score_candidates`, :func:`~memento.runs.labels.label_tasks`) is
:mod:`memento.runs.labels`, above both the planners and this package.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from memento.config import MAX_CANDIDATES, MAX_K, MAX_K_SETS
from memento.errors import DataFormatError
from memento.formats import iter_jsonl, write_jsonl
from memento.io import finite_float
from memento.types import check_id, check_text, shown

__all__ = ["COSINE_SLACK", "LabelRow", "iter_labels", "read_labels", "write_labels"]

_REQUIRED = ("task_id", "state", "answer", "candidate_ids", "logprob", "mean_logprob", "n_tokens", "planner",
             "prompt")
_OPTIONAL = ("cosine", "prompt_tokens", "sets", "set_logprob")
_KEYS = set(_REQUIRED) | set(_OPTIONAL)
_MAX_COUNT = 2 ** 31 - 1  # the largest token count a row may hold
COSINE_SLACK = 0.05
"""How far beyond [-1, 1] a row's ``cosine`` may lie: an approximate (compressed) index scores a candidate with its
quantised vector, a little off the exact cosine."""


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
