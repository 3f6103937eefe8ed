"""The planner protocol: a frozen LLM that reads a task and the chosen cases and acts.

Every planner implements ``plan(task, cases) -> PlanOutput`` and ``plan_many(tasks, cases_per_task)``
(batched where the backend can batch, a loop otherwise). The planner never sees the Q-network or
the policy: it gets the task and the cases the policy chose, nothing else (README, "Concepts").

Scoring (:class:`ScoringPlanner`; docs/training.md, "From planner-scored labels"): a planner that can also score
demonstrations without generating, as EPR (Rubin et al. 2022) and LLM-R (Wang et al. 2024) label
candidates, implements ``score(task, case_sets, answer=None) -> list[AnswerScore]`` and
``score_many``. The score of a case set is the log-likelihood of the answer (``task.answers[0]``
by default) given the prompt the planner would send with that case set:

    text   = render_prompt(prompt, task, cases) + render_answer(prompt, answer)
    logprob = sum over the answer's tokens t of log p(t | every token before t)

``render_answer`` formats the answer exactly as a demonstration's answer follows its question
(``few_shot``: a space and the answer on one line after the final ``"Answer:"``), so the scored
continuation is the one the planner's own generation would produce to give that answer. Only the
answer's tokens are summed: not the prompt's, and no stop string is appended (the answer is not
required to end). ``mean_logprob`` is ``logprob / n_tokens`` (length-normalised; compare answers
of different lengths with it). Natural logarithms throughout.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from memento.errors import DataFormatError, MementoError
from memento.types import Case, Task

__all__ = [
    "AnswerScore",
    "CallablePlanner",
    "PlanOutput",
    "Planner",
    "PlannerError",
    "ScoreRequest",
    "ScoringPlanner",
    "ScoreFn",
    "can_score",
    "check_score",
    "group_scores",
    "score_requests",
]


class PlannerError(MementoError):
    """A planner cannot produce an output: missing model, unreachable server, bad response."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlanOutput:
    """What a planner produced for one task."""

    text: str
    prompt_tokens: int = 0
    output_tokens: int = 0
    latency_s: float = 0.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class AnswerScore:
    """How likely a planner finds an answer after one prompt (see the module docstring).

    - ``logprob``: the sum of the natural-log probabilities of the answer's tokens;
    - ``n_tokens``: how many tokens the answer took (>= 1);
    - ``prompt_tokens``: the prompt tokens the model read before the answer (0 when unknown);
    - ``truncated_tokens``: prompt tokens dropped from the left to fit the model's length limit;
    - ``latency_s``: this score's share of the wall time.

    ``mean_logprob`` is ``logprob / n_tokens``.
    """

    logprob: float
    n_tokens: int
    prompt_tokens: int = 0
    truncated_tokens: int = 0
    latency_s: float = 0.0

    def __post_init__(self) -> None:
        value = self.logprob
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise DataFormatError(f"AnswerScore.logprob must be a finite number, got {value!r}")
        object.__setattr__(self, "logprob", float(value))
        for field, low in (("n_tokens", 1), ("prompt_tokens", 0), ("truncated_tokens", 0)):
            count = getattr(self, field)
            if isinstance(count, bool) or not isinstance(count, int) or count < low:
                raise DataFormatError(f"AnswerScore.{field} must be an integer >= {low}, got {count!r}")

    @property
    def mean_logprob(self) -> float:
        """The length-normalised log-likelihood: ``logprob / n_tokens``."""
        return self.logprob / self.n_tokens

    def to_json(self) -> dict[str, Any]:
        return {"logprob": self.logprob, "n_tokens": self.n_tokens, "mean_logprob": self.mean_logprob,
                "prompt_tokens": self.prompt_tokens, "truncated_tokens": self.truncated_tokens}


@runtime_checkable
class Planner(Protocol):
    """A frozen LLM (or any agent) behind one interface."""

    def plan(self, task: Task, cases: Sequence[Case]) -> PlanOutput: ...

    def plan_many(self, tasks: Sequence[Task], cases: Sequence[Sequence[Case]]) -> list[PlanOutput]: ...


@runtime_checkable
class ScoringPlanner(Planner, Protocol):
    """A planner that can also score answers without generating (see the module docstring).

    ``score(task, case_sets, answer)`` gives one :class:`AnswerScore` per case set, in order;
    ``answer=None`` scores ``task.answers[0]``. ``score_many(tasks, case_sets_per_task, answers)``
    does the same for several tasks at once (one list of scores per task; ``answers=None`` scores
    each task's first answer) and batches where the backend can. An object with these methods that
    cannot score (a :class:`CallablePlanner` built without ``score_fn``) raises :class:`PlannerError`.
    """

    def score(self, task: Task, case_sets: Sequence[Sequence[Case]], answer: str | None = None) -> list[AnswerScore]:
        ...

    def score_many(self, tasks: Sequence[Task], case_sets_per_task: Sequence[Sequence[Sequence[Case]]],
                   answers: Sequence[str | None] | None = None) -> list[list[AnswerScore]]: ...


def can_score(planner: object) -> bool:
    """Whether ``planner`` can score answers (``score_many``), as far as can be told without a call: a
    :class:`CallablePlanner` only with a ``score_fn``. (A server that returns no log-probabilities is found at
    its first scoring call: a :class:`PlannerError`.)"""
    if not callable(getattr(planner, "score_many", None)):
        return False
    return not (isinstance(planner, CallablePlanner) and planner.score_fn is None)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScoreRequest:
    """One (task, case set, answer) to score: ``task_index`` and ``set_index`` locate it in the call."""

    task_index: int
    set_index: int
    task: Task
    cases: tuple[Case, ...]
    answer: str


def score_requests(tasks: Sequence[Task], case_sets_per_task: Sequence[Sequence[Sequence[Case]]],
                   answers: Sequence[str | None] | None = None) -> list[ScoreRequest]:
    """Check the arguments of ``score_many`` and flatten them, task by task, set by set.

    Raises :class:`~memento.errors.DataFormatError` (one line) for mismatched lengths, a task with
    no case set (an empty *set* is fine: it scores the zero-shot prompt), a case set that is not a
    sequence of :class:`Case`, or an empty answer.
    """
    if isinstance(tasks, Task) or not isinstance(tasks, Sequence):
        raise DataFormatError(f"score_many: tasks must be a list of Task, got {type(tasks).__name__}")
    if len(tasks) != len(case_sets_per_task):
        raise DataFormatError(f"score_many got {len(tasks)} tasks but {len(case_sets_per_task)} lists of case sets")
    if answers is not None and len(answers) != len(tasks):
        raise DataFormatError(f"score_many got {len(tasks)} tasks but {len(answers)} answers")
    requests = []
    for t, (task, case_sets) in enumerate(zip(tasks, case_sets_per_task)):
        if not isinstance(task, Task):
            raise DataFormatError(f"score: task {t} is {type(task).__name__}, expected memento.Task")
        where = f"score: task {task.id!r}"
        if isinstance(case_sets, (Case, str)) or not isinstance(case_sets, Sequence):
            raise DataFormatError(f"{where}: case_sets must be a list of case lists (e.g. [[case]]), "
                                  f"got {type(case_sets).__name__}")
        if not case_sets:
            raise DataFormatError(f"{where}: no case sets to score (pass [[]] to score the prompt without cases)")
        answer = task.answers[0] if answers is None or answers[t] is None else answers[t]
        if not isinstance(answer, str) or not answer.strip():
            raise DataFormatError(f"{where}: the answer {answer!r} is empty: there is nothing to score")
        for k, cases in enumerate(case_sets):
            if isinstance(cases, (Case, str)) or not isinstance(cases, Sequence):
                raise DataFormatError(f"{where}: case set {k} is a {type(cases).__name__}, expected a list of Case "
                                      "(case_sets is a list of case lists, e.g. [[case_a], [case_b]])")
            for case in cases:
                if not isinstance(case, Case):
                    raise DataFormatError(f"{where}: case set {k} holds a {type(case).__name__}, expected Case")
            requests.append(ScoreRequest(task_index=t, set_index=k, task=task, cases=tuple(cases), answer=answer))
    return requests


def check_score(planner: str, request: ScoreRequest, logprob: float, n_tokens: int) -> None:
    """Raise :class:`PlannerError` (one line) unless a computed score is usable."""
    where = f"{planner}: task {request.task.id!r}, case set {request.set_index}"
    if n_tokens < 1:
        raise PlannerError(f"{where}: the answer {request.answer!r} took no tokens")
    if not math.isfinite(logprob):
        raise PlannerError(f"{where}: the log-likelihood of the answer is {logprob} (not finite)")
    if logprob > 0.0:
        raise PlannerError(f"{where}: the log-likelihood of the answer is {logprob}, above 0 (a log-probability "
                           "is <= 0)")


def group_scores(requests: Sequence[ScoreRequest], scores: Sequence[AnswerScore],
                 n_tasks: int) -> list[list[AnswerScore]]:
    """Flat scores (in the order of ``requests``) back into one list per task."""
    grouped: list[list[AnswerScore]] = [[] for _ in range(n_tasks)]
    for request, score in zip(requests, scores, strict=True):
        grouped[request.task_index].append(score)
    return grouped


ScoreFn = Callable[[Task, Sequence[Case], str], float | AnswerScore]


class CallablePlanner:
    """Wraps any function or agent ``fn(task, cases) -> str | PlanOutput`` as a planner.

    It can score only when given ``score_fn(task, cases, answer) -> float | AnswerScore`` (a float
    is taken as the answer's log-likelihood over one token); without one, ``score`` raises
    :class:`PlannerError`.
    """

    def __init__(self, fn: Callable[[Task, Sequence[Case]], str | PlanOutput], *, name: str = "callable",
                 score_fn: ScoreFn | None = None):
        self.fn = fn
        self.name = name
        self.score_fn = score_fn

    def plan(self, task: Task, cases: Sequence[Case]) -> PlanOutput:
        start = time.perf_counter()
        out = self.fn(task, list(cases))
        if isinstance(out, PlanOutput):
            return out
        if not isinstance(out, str):
            raise PlannerError(f"planner {self.name!r} returned {type(out).__name__}, expected str or PlanOutput")
        return PlanOutput(text=out, latency_s=time.perf_counter() - start)

    def plan_many(self, tasks: Sequence[Task], cases: Sequence[Sequence[Case]]) -> list[PlanOutput]:
        if len(tasks) != len(cases):
            raise PlannerError(f"plan_many got {len(tasks)} tasks but {len(cases)} case lists")
        return [self.plan(task, task_cases) for task, task_cases in zip(tasks, cases)]

    def score(self, task: Task, case_sets: Sequence[Sequence[Case]], answer: str | None = None) -> list[AnswerScore]:
        return self.score_many([task], [case_sets], None if answer is None else [answer])[0]

    def score_many(self, tasks: Sequence[Task], case_sets_per_task: Sequence[Sequence[Sequence[Case]]],
                   answers: Sequence[str | None] | None = None) -> list[list[AnswerScore]]:
        if self.score_fn is None:
            raise PlannerError(f"planner {self.name!r} cannot score answers: build it as "
                               "CallablePlanner(fn, score_fn=...) to give it a scoring function")
        requests = score_requests(tasks, case_sets_per_task, answers)
        scores = []
        for request in requests:
            start = time.perf_counter()
            out = self.score_fn(request.task, list(request.cases), request.answer)
            if isinstance(out, AnswerScore):
                check_score(f"planner {self.name!r}", request, out.logprob, out.n_tokens)
                scores.append(out)
                continue
            if isinstance(out, bool) or not isinstance(out, (int, float)):
                raise PlannerError(f"planner {self.name!r}: score_fn returned {type(out).__name__}, "
                                   "expected float or AnswerScore")
            check_score(f"planner {self.name!r}", request, float(out), 1)
            scores.append(AnswerScore(logprob=float(out), n_tokens=1, latency_s=time.perf_counter() - start))
        return group_scores(requests, scores, len(tasks))

    def __repr__(self) -> str:
        return f"CallablePlanner(name={self.name!r})"
