"""Readers and writers for the JSONL formats of docs/formats.md.

Every reader validates the whole file before returning anything, and every error
names the file and the 1-based line (``path:line: reason``), so an import either
takes the whole file or changes nothing. Writers go through a temporary file and a
rename, so a crash never leaves half a file behind.

Formats:
- Case JSONL ``{"id", "state", "action", "reward", "env"?, "kind"?, "meta"?, "user"?, "agent"?, "session"?}``;
- Task JSONL ``{"id", "question", "answers", "family"?, "env"?, "meta"?}``;
- the Memento reference files: case memory ``{"case", "plan", "case_label"}``,
  non-parametric memory ``{"question", "plan", "reward"}``, retriever training pairs
  ``{"query", "case", "case_label", "plan", "truth_label"}`` and tasks
  ``{"question", "ground_truth": "a<|answer_split|>b", "data_source"}``;
- the online loop's transition log ``steps.jsonl``: one :class:`StepRecord` a line
  (:func:`read_steps_jsonl`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args

from memento.errors import DataFormatError
from memento.io import atomic_write, loads_json, parse_json
from memento.types import SCOPE_FIELDS, Case, Task, check_reward, check_text, json_value_problem, shown

__all__ = [
    "ANSWER_SPLIT",
    "CaseFormat",
    "MementoPair",
    "StepRecord",
    "iter_jsonl",
    "json_value_problem",
    "loads_text",
    "parse_case",
    "read_case_file",
    "read_cases_jsonl",
    "read_memento_memory",
    "read_memento_np_memory",
    "read_memento_tasks",
    "read_memento_training_pairs",
    "read_steps_jsonl",
    "read_tasks_jsonl",
    "write_jsonl",
]

T = TypeVar("T")
ANSWER_SPLIT = "<|answer_split|>"

CaseFormat = Literal["case", "memento-memory", "memento-np-memory", "memento-training"]


def _blank(raw: bytes) -> bool:
    try:
        return not raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        return False


def iter_jsonl(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line_number, object)`` for each non-blank line; bad JSON names file and line.

    A UTF-8 byte-order mark before the first line and CRLF line ends are accepted. Refused, as
    ``DataFormatError``: a file that cannot be read, bytes that are not UTF-8, a line that is not a JSON
    object, an integer too long for Python, nesting deeper than 100 levels, a lone surrogate escape.
    """
    path = Path(path)
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        raise DataFormatError("file not found", path=path) from None
    except IsADirectoryError:
        raise DataFormatError("is a directory, expected a JSONL file", path=path) from None
    except OSError as error:  # permission denied, a name too long...
        raise DataFormatError(f"cannot read: {error.strerror or error}", path=path) from None
    with handle:
        number = 0
        while True:
            try:
                raw = handle.readline()
            except OSError as error:
                raise DataFormatError(f"cannot read: {error.strerror or error}", path=path, line=number + 1) from None
            if not raw:
                return
            number += 1
            if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            if not raw.strip():
                continue
            try:
                row = loads_json(raw.rstrip(b"\r\n"))  # one line: the error's column is the line's
            except DataFormatError as error:
                if _blank(raw):  # a line of other Unicode whitespace
                    continue
                raise DataFormatError(error.reason, path=path, line=number) from None
            if not isinstance(row, dict):
                raise DataFormatError(f"expected a JSON object, got {type(row).__name__}", path=path, line=number)
            yield number, row


def _read(path: str | Path, parse: Callable[[dict[str, Any]], T]) -> list[T]:
    """Parse every row of a JSONL file; a field error is reported as ``path:line: reason``."""
    out: list[T] = []
    for number, row in iter_jsonl(path):
        try:
            out.append(parse(row))
        except DataFormatError as error:
            raise DataFormatError(error.reason, path=path, line=number) from None
    return out


def _field(row: dict[str, Any], name: str, kind: type | tuple[type, ...], *, required: bool = True) -> Any:
    if name not in row or row[name] is None:
        if required:
            raise DataFormatError(f"missing field {name!r}")
        return None
    value = row[name]
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise DataFormatError(f"field {name!r} must be {_kind_name(kind)}, got {value!r}")
    if not isinstance(value, kind):
        raise DataFormatError(f"field {name!r} must be {_kind_name(kind)}, got {type(value).__name__}")
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {str: "a string", int: "a number", float: "a number", bool: "true or false",
             dict: "an object", list: "a list"}
    return " or ".join(dict.fromkeys(names.get(k, k.__name__) for k in kinds))


def _reward(row: dict[str, Any], name: str = "reward") -> float:
    """A reward field: a finite number in [0, 1] (:func:`memento.types.check_reward`, the range of every entry
    point)."""
    return check_reward(_field(row, name, (int, float)), f"field {name!r}")


def loads_text(text: str, what: str) -> Any:
    """``text`` parsed as JSON by :func:`memento.io.parse_json`: every way it can fail (bad JSON, an integer of more
    digits than Python converts, nesting too deep, a lone surrogate) raises ``DataFormatError`` naming ``what``."""
    return parse_json(text, where=what, error=DataFormatError)


def _plan(row: dict[str, Any]) -> str:
    """Memento's ``plan``: a JSON string ``{"plan": [{"id", "description"}, ...]}``, kept verbatim."""
    plan = check_text(_field(row, "plan", str), "field 'plan'")
    parsed = loads_text(plan, "field 'plan'")
    if not isinstance(parsed, dict) or not isinstance(parsed.get("plan"), list):
        raise DataFormatError("field 'plan' must encode an object {\"plan\": [...]}")
    return plan


_CASE_KEYS = {"id", "state", "action", "reward", "env", "kind", "meta", *SCOPE_FIELDS}


def parse_case(row: dict[str, Any]) -> Case:
    """The :class:`Case` of one parsed Case JSONL row, every field checked (the reference checks, which
    :mod:`memento.bank.ingest` applies to what its fast path does not accept); a problem is a one-line
    ``DataFormatError`` without the file (the readers add ``file:line``)."""
    unknown = sorted(set(row) - _CASE_KEYS)
    if unknown:
        raise DataFormatError(f"unknown field(s) {unknown} for a Case JSONL row")
    case_id = _field(row, "id", (str, int), required=False)
    kind = _field(row, "kind", str, required=False)
    meta = _meta(row)
    return Case(id=None if case_id is None else str(case_id), state=_field(row, "state", str),
                action=_field(row, "action", str), reward=_reward(row),
                env=_field(row, "env", str, required=False), kind="case" if kind is None else kind,
                meta={} if meta is None else meta,
                **{name: _field(row, name, str, required=False) for name in SCOPE_FIELDS})


def _meta(row: dict[str, Any]) -> dict[str, Any] | None:
    """The optional ``meta`` object, which must hold only finite numbers (it is stored and exported as JSON)."""
    meta = _field(row, "meta", dict, required=False)
    problem = None if meta is None else json_value_problem(meta, finite=True)
    if problem is not None:
        raise DataFormatError(f"field 'meta': {problem}")
    return meta


def read_cases_jsonl(path: str | Path) -> list[Case]:
    """Case JSONL (docs/formats.md); an id given on two lines is refused, naming both."""
    out: list[Case] = []
    first_line: dict[str, int] = {}
    for number, row in iter_jsonl(path):
        try:
            case = parse_case(row)
        except DataFormatError as error:
            raise DataFormatError(error.reason, path=path, line=number) from None
        if case.id is not None:
            if case.id in first_line:
                raise DataFormatError(f"id {case.id!r} is used twice (first on line {first_line[case.id]})",
                                      path=path, line=number)
            first_line[case.id] = number
        out.append(case)
    return out


def _parse_task(row: dict[str, Any]) -> Task:
    answers = _field(row, "answers", list)
    return Task(id=str(_field(row, "id", (str, int))), question=_field(row, "question", str),
                answers=tuple(answers), family=_field(row, "family", str, required=False),
                env=_field(row, "env", str, required=False), meta=_meta(row) or {})


def read_tasks_jsonl(path: str | Path) -> list[Task]:
    """Task JSONL (docs/formats.md)."""
    return _read(path, _parse_task)


_LABELS = {"positive": 1.0, "negative": 0.0}


def _label(row: dict[str, Any], name: str) -> float:
    label = _field(row, name, str)
    if label not in _LABELS:
        raise DataFormatError(f"field {name!r} must be 'positive' or 'negative', got {label!r}")
    return _LABELS[label]


def read_memento_memory(path: str | Path) -> list[Case]:
    """Memento case memory ``{"case", "plan", "case_label"}``: positive -> reward 1, negative -> 0."""
    def parse(row: dict[str, Any]) -> Case:
        return Case(state=_field(row, "case", str), action=_plan(row), reward=_label(row, "case_label"),
                    meta={"source": "memento-memory"})
    return _read(path, parse)


def read_memento_np_memory(path: str | Path) -> list[Case]:
    """Memento non-parametric memory ``{"question", "plan", "reward": 0|1}`` (any other reward is refused)."""
    def parse(row: dict[str, Any]) -> Case:
        value = _field(row, "reward", (int, float))
        if value not in (0, 1):
            raise DataFormatError(f"field 'reward' must be 0 or 1 in Memento's memory, got {shown(value)}")
        reward = check_reward(value, "field 'reward'")
        return Case(state=_field(row, "question", str), action=_plan(row), reward=reward,
                    meta={"source": "memento-np-memory"})
    return _read(path, parse)


@dataclasses.dataclass(frozen=True, kw_only=True)
class MementoPair:
    """One row of Memento's retriever training data: was showing ``case`` for ``query`` followed by success?

    ``case_reward`` is the case's own label (positive/negative example); ``truth_label``
    is the task-level outcome of the query, shared by every case retrieved for it.
    """

    query: str
    case: str
    plan: str
    case_reward: float
    truth_label: bool

    def as_case(self) -> Case:
        return Case(state=self.case, action=self.plan, reward=self.case_reward,
                    meta={"source": "memento-training"})


def read_memento_training_pairs(path: str | Path) -> list[MementoPair]:
    """Memento retriever training pairs ``{"query", "case", "case_label", "plan", "truth_label"}``."""
    def parse(row: dict[str, Any]) -> MementoPair:
        query = check_text(_field(row, "query", str), "field 'query'")
        case = check_text(_field(row, "case", str), "field 'case'")
        return MementoPair(query=query, case=case, plan=_plan(row), case_reward=_label(row, "case_label"),
                           truth_label=_field(row, "truth_label", bool))
    return _read(path, parse)


def read_memento_tasks(path: str | Path) -> list[Task]:
    """Memento task files ``{"question", "ground_truth", "data_source"}``; ids are ``source-line``."""
    out: list[Task] = []
    for number, row in iter_jsonl(path):
        try:
            truth = _field(row, "ground_truth", str)
            answers = tuple(a.strip() for a in truth.split(ANSWER_SPLIT) if a.strip())
            source = _field(row, "data_source", str, required=False) or "memento"
            out.append(Task(id=f"{source}-{number}", question=_field(row, "question", str), answers=answers,
                            family=source, meta={"data_source": source}))
        except DataFormatError as error:
            raise DataFormatError(error.reason, path=path, line=number) from None
    return out


def read_case_file(path: str | Path, format: CaseFormat) -> list[Case]:
    """Cases from any supported file format (the unique cases, for ``memento-training``)."""
    if format not in get_args(CaseFormat):
        raise DataFormatError(f"unknown case format {format!r}; choose from {get_args(CaseFormat)}")
    if format == "case":
        return read_cases_jsonl(path)
    if format == "memento-memory":
        return read_memento_memory(path)
    if format == "memento-np-memory":
        return read_memento_np_memory(path)
    unique = {(p.case, p.plan, p.case_reward): p.as_case() for p in read_memento_training_pairs(path)}
    return list(unique.values())


def write_jsonl(path: str | Path, rows: Iterable[dict[str, Any]]) -> int:
    """Write rows as JSONL atomically (temporary file, fsync, rename); returns the row count."""
    count = 0

    def write(tmp: Path) -> None:
        nonlocal count
        with tmp.open("w", encoding="utf-8") as handle:
            for row in rows:
                handle.write(json.dumps(row, ensure_ascii=False) + "\n")
                count += 1

    atomic_write(path, write)
    return count


# ---------------------------------------------------------------- the online loop's transition log


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepRecord:
    """One step of the online loop, one line of ``steps.jsonl`` (the transition log of docs/formats.md).

    ``step``, ``task_id``, ``family``, ``state`` (the question); ``candidate_ids`` (the set the policy chose
    from), ``chosen_ids`` (in draw order), ``propensities`` (each chosen case's first-draw probability),
    ``set_propensity`` (Plackett-Luce probability of the ordered set; 1.0 for a deterministic choice;
    ``None`` when nothing could be chosen), ``greedy``; ``output``, ``reward``, ``success``, ``reason``;
    ``done`` (true for a single-step task); ``retained_id`` and ``duplicate`` (the case the step added
    to the bank, or found there already); ``policy``, ``policy_version`` (updates made before the choice),
    ``bank_size`` (the bank the choice was made from), ``entropy`` (of the policy over the candidates),
    ``alpha`` (the soft-max temperature, ``None`` for a policy without one), ``loss`` (mean learner loss
    of the step's update round, ``None`` when none ran); ``time`` (Unix seconds) and ``ms`` per component;
    ``case_credit``: with leave-one-out credit, each chosen case's target (left out of the line otherwise);
    ``candidate_probs``: the first-draw probability of every candidate, in ``candidate_ids`` order.
    """

    step: int
    task_id: str
    family: str | None
    state: str
    candidate_ids: list[str]
    chosen_ids: list[str]
    propensities: list[float]
    set_propensity: float | None
    greedy: bool | None
    output: str
    reward: float
    success: bool
    reason: str
    done: bool
    retained_id: str | None
    duplicate: bool
    policy: str
    policy_version: int
    bank_size: int
    entropy: float
    alpha: float | None
    loss: float | None
    time: float
    ms: dict[str, float]
    case_credit: list[float] | None = None
    candidate_probs: list[float] | None = None

    _OPTIONAL = ("case_credit", "candidate_probs")

    def to_json(self) -> dict[str, Any]:
        """The record as a JSON-ready dict, keys in field order (optional fields only when set)."""
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)
                if field.name not in self._OPTIONAL or getattr(self, field.name) is not None}

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> StepRecord:
        """A record from a parsed line; a missing or mistyped field raises ``DataFormatError``."""
        names = [field.name for field in dataclasses.fields(cls)]
        missing = [name for name in names if name not in row and name not in cls._OPTIONAL]
        if missing:
            raise DataFormatError(f"step record lacks {missing}")
        for name, kind in (("step", int), ("reward", (int, float)), ("success", bool), ("state", str),
                           ("chosen_ids", list), ("candidate_ids", list)):
            _field(row, name, kind)
        return cls(**{name: row[name] for name in names if name in row})


def read_steps_jsonl(path: str | Path) -> list[StepRecord]:
    """Every record of a ``steps.jsonl`` transition log (errors name the file and line)."""
    return _read(path, StepRecord.from_json)
