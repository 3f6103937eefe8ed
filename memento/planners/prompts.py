"""Prompt templates: how a task and the chosen cases become the text a frozen LLM reads.

A template is a typed, frozen, JSON-serialisable :class:`PromptConfig` (it is saved in a run's
``config.json``); :func:`render_prompt` turns ``(config, task, cases)`` into one string (for
completion-style models: transformers causal LMs, ``/v1/completions``) and
:func:`render_messages` into chat messages (for ``/v1/chat/completions``). Two styles:

- ``few_shot``: the cases as question/answer demonstrations, then the task, for a small *base*
  model to continue with a short answer (stop at the end of the line)::

      Question: What is the capital of France?
      Answer: Paris
      Question: What is the capital of Italy?
      Answer:

  Whitespace inside a case or the question is collapsed to single spaces so every
  demonstration stays two lines and the stop string ``"\\n"`` ends the answer.
- ``memento_plan``: Memento's planner format: the task, then the positive examples
  (``reward >= positive_min_reward``) and the negative ones, each a question and its plan, and a
  request for a plan as JSON ``{"plan": [{"id": 1, "description": "..."}]}``. A case whose action
  is such a JSON plan is shown as numbered steps; any other action is shown as it is.

Cases are shown in the order given (the policy's draw order), each state and action cut to
``max_case_chars`` characters. The task text is never cut. Items of another kind than ``"case"`` (focus
points, tips, skills: :mod:`memento.systems`) are not demonstrations: they are shown as labelled notes, one a
line (``"Tip: answer with the name alone"``, :func:`memento.systems.items.split_notes`), before the
demonstrations in ``few_shot`` and after the task in ``memento_plan``, each line cut to ``max_case_chars``.

:func:`render_answer` gives the text that follows the prompt when the planner answers with a
given text, formatted as a demonstration's answer is (``" Paris"`` after ``"Answer:"`` in
``few_shot``; ``"\n"`` and the plan's numbered steps after ``"Plan:"`` in ``memento_plan``):
``render_prompt(...) + render_answer(...)`` is the text a planner scores (never cut).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any, Literal

from memento.config import check, check_choice, check_int
from memento.errors import DataFormatError
from memento.systems.items import split_notes
from memento.types import Case, Task

__all__ = [
    "DEFAULT_INSTRUCTIONS",
    "DEFAULT_STOP",
    "PromptConfig",
    "PromptStyle",
    "format_plan",
    "render_answer",
    "render_messages",
    "render_prompt",
]

PromptStyle = Literal["few_shot", "memento_plan"]

DEFAULT_INSTRUCTIONS: dict[str, str] = {
    # A base model continues text; an instruction line mostly costs tokens, so none by default.
    "few_shot": "",
    "memento_plan": (
        "You are the planner of an agent. Break the task into a minimal sequence of executable steps. "
        'Reply only with JSON of the form {"plan": [{"id": 1, "description": "..."}]}.'
    ),
}

DEFAULT_STOP: dict[str, tuple[str, ...]] = {
    "few_shot": ("\n",),
    # The template's own section starts: a model that echoes the template stops there. At most 4 (OpenAI's limit).
    "memento_plan": ("\nTask:", "\nQuestion:", "\nExample ", "\nBased on the examples"),
}

_ELLIPSIS = "..."


@dataclasses.dataclass(frozen=True, kw_only=True)
class PromptConfig:
    """A prompt template.

    - ``style``: ``"few_shot"`` (question/answer demonstrations for a base model) or
      ``"memento_plan"`` (Memento's planning prompt, positive and negative examples, JSON plan);
    - ``instruction``: text put first (the system message in chat mode); ``None`` takes the
      style's default (:data:`DEFAULT_INSTRUCTIONS`), ``""`` puts none;
    - ``max_case_chars``: each case's state and action are cut to this many characters;
    - ``positive_min_reward``: in ``memento_plan``, a case with at least this reward is a positive
      example, any other a negative one.

    :attr:`stop` gives the stop strings that suit the style (:data:`DEFAULT_STOP`).
    """

    style: PromptStyle = "few_shot"
    instruction: str | None = None
    max_case_chars: int = 1000
    positive_min_reward: float = 0.5

    def __post_init__(self) -> None:
        check_choice(self, "style", PromptStyle)
        check(self.instruction is None or isinstance(self.instruction, str), type(self), "instruction",
               self.instruction, "must be a string or None")
        check_int(self, "max_case_chars", 16)
        value = self.positive_min_reward
        check(isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
               and abs(value) != float("inf"), type(self), "positive_min_reward", value, "must be a finite number")
        object.__setattr__(self, "positive_min_reward", float(value))

    @property
    def resolved_instruction(self) -> str:
        """The instruction actually used: the style's default when ``instruction`` is None."""
        return DEFAULT_INSTRUCTIONS[self.style] if self.instruction is None else self.instruction

    @property
    def stop(self) -> tuple[str, ...]:
        """Stop strings that end an answer in this style."""
        return DEFAULT_STOP[self.style]


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - len(_ELLIPSIS)] + _ELLIPSIS


def _one_line(text: str) -> str:
    return " ".join(text.split())


def format_plan(action: str) -> str:
    """A Memento JSON plan as numbered steps (``"1. ...\\n2. ..."``); any other text unchanged."""
    try:
        data: Any = json.loads(action)
    except (ValueError, RecursionError, TypeError):  # not JSON, too many digits, nested too deeply: plain text
        return action
    steps = data.get("plan") if isinstance(data, dict) else None
    if not isinstance(steps, list) or not steps:
        return action
    lines = []
    for number, step in enumerate(steps, 1):
        if not isinstance(step, dict) or not isinstance(step.get("description"), str):
            return action
        step_id = step.get("id", number)
        lines.append(f"{step_id}. {step['description']}")
    return "\n".join(lines)


def _few_shot_answer(text: str) -> str:
    """A few_shot answer as it follows ``"Answer:"``: a space, then the text on one line."""
    return " " + _one_line(text)


def _plan_answer(text: str) -> str:
    """A memento_plan answer as it follows ``"Plan:"``: a line break, then the plan's steps."""
    return "\n" + format_plan(text)


def _notes(config: PromptConfig, notes: list[str]) -> str:
    return "".join(f"{_cut(_one_line(note), config.max_case_chars)}\n" for note in notes)


def _few_shot_body(config: PromptConfig, task: Task, cases: Sequence[Case]) -> str:
    limit = config.max_case_chars
    cases, notes = split_notes(cases)
    parts = [_notes(config, notes)] if notes else []
    parts += [f"Question: {_cut(_one_line(c.state), limit)}\n"
             f"Answer:{_few_shot_answer(_cut(_one_line(c.action), limit))}\n" for c in cases]
    parts.append(f"Question: {_one_line(task.question)}\nAnswer:")
    return "".join(parts)


def _plan_examples(cases: Sequence[Case], limit: int) -> str:
    return "\n".join(
        f"Example {i}:\nQuestion: {_cut(c.state, limit)}\nPlan:{_plan_answer(_cut(c.action, limit))}\n"
        for i, c in enumerate(cases, 1)
    )


def _memento_body(config: PromptConfig, task: Task, cases: Sequence[Case]) -> str:
    threshold = config.positive_min_reward
    cases, notes = split_notes(cases)
    positive = [c for c in cases if c.reward >= threshold]
    negative = [c for c in cases if c.reward < threshold]
    parts = [f"Task: {task.question}\n"]
    if notes:
        parts.append(f"Notes:\n{_notes(config, notes)}")
    if positive:
        parts.append(f"Positive examples (reward >= {threshold:g}):\n{_plan_examples(positive, config.max_case_chars)}")
    if negative:
        parts.append(f"Negative examples (reward < {threshold:g}):\n{_plan_examples(negative, config.max_case_chars)}")
    if cases or notes:
        parts.append("Based on the examples above, write a plan for the task. Follow the positive examples and "
                     "avoid the patterns of the negative ones.\n")
    else:
        parts.append("Write a plan for the task.\n")
    parts.append("Plan:")
    return "\n".join(parts)


def _body(config: PromptConfig, task: Task, cases: Sequence[Case]) -> str:
    if config.style == "few_shot":
        return _few_shot_body(config, task, cases)
    return _memento_body(config, task, cases)


def render_prompt(config: PromptConfig, task: Task, cases: Sequence[Case]) -> str:
    """The whole prompt as one string: the instruction (if any), a blank line, then the body."""
    instruction = config.resolved_instruction
    body = _body(config, task, cases)
    return f"{instruction}\n\n{body}" if instruction else body


def render_messages(config: PromptConfig, task: Task, cases: Sequence[Case]) -> list[dict[str, str]]:
    """Chat messages: the instruction as the system message (if any), the body as the user message."""
    instruction = config.resolved_instruction
    messages = [{"role": "system", "content": instruction}] if instruction else []
    messages.append({"role": "user", "content": _body(config, task, cases)})
    return messages


def render_answer(config: PromptConfig, answer: str) -> str:
    """The text that follows :func:`render_prompt` when the planner answers ``answer``.

    It is formatted exactly as a demonstration's answer follows its question, so that a scored
    answer reads like the answers shown: ``few_shot`` gives ``" " + answer`` on one line
    (whitespace collapsed, as in a demonstration), ``memento_plan`` gives ``"\\n"`` and the answer
    (a JSON plan shown as numbered steps, see :func:`format_plan`). The answer is never cut
    (``max_case_chars`` applies to demonstrations only) and no stop string is appended.
    An answer that is empty after that formatting raises :class:`~memento.errors.DataFormatError`.
    """
    if not isinstance(answer, str):
        raise DataFormatError(f"answer must be a string, got {type(answer).__name__}")
    if not answer.strip():
        raise DataFormatError(f"answer {answer!r} is empty: there is nothing to score")
    return _few_shot_answer(answer) if config.style == "few_shot" else _plan_answer(answer)
