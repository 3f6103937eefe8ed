"""The planner protocol: a frozen LLM that reads a task and the chosen cases and acts.

Every planner implements ``plan(task, cases) -> PlanOutput`` and ``plan_many(tasks, cases_per_task)``
(batched where the backend can batch, a loop otherwise). The planner never sees the Q-network or
the policy: it gets the task and the cases the policy chose, nothing else (DESIGN §4).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from memento.errors import MementoError
from memento.types import Case, Task

__all__ = ["CallablePlanner", "PlanOutput", "Planner", "PlannerError"]


class PlannerError(MementoError):
    """A planner cannot produce an output: missing model, unreachable server, bad response."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlanOutput:
    """What a planner produced for one task."""

    text: str
    prompt_tokens: int = 0
    output_tokens: int = 0
    latency_s: float = 0.0


@runtime_checkable
class Planner(Protocol):
    """A frozen LLM (or any agent) behind one interface."""

    def plan(self, task: Task, cases: Sequence[Case]) -> PlanOutput: ...

    def plan_many(self, tasks: Sequence[Task], cases: Sequence[Sequence[Case]]) -> list[PlanOutput]: ...


class CallablePlanner:
    """Wraps any function or agent ``fn(task, cases) -> str | PlanOutput`` as a planner."""

    def __init__(self, fn: Callable[[Task, Sequence[Case]], str | PlanOutput], *, name: str = "callable"):
        self.fn = fn
        self.name = name

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

    def __repr__(self) -> str:
        return f"CallablePlanner(name={self.name!r})"
