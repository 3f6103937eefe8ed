"""Judges: turn a planner's output for a task into a reward in [0, 1] (the ``judge`` arrow of README, "Concepts").

Every judge is a callable ``judge(task, output) -> JudgeResult`` (the :class:`Judge` protocol);
``JudgeResult.reason`` is one short line saying why (``"exact match with 'Paris'"``).

String judges compare against *any* of ``task.answers`` after :func:`normalize_answer`, a
SQuAD-style normalisation with two documented additions:

1. Unicode NFKD, combining marks dropped (``"Bogotá"`` == ``"Bogota"``);
2. lower case;
3. hyphens, dashes, slashes and underscores become spaces (``"forty-seven"`` == ``"forty seven"``);
4. every other punctuation character is removed (ASCII ``string.punctuation`` and Unicode
   categories P*: ``"U.S."`` -> ``"us"``, ``"1,347"`` -> ``"1347"``, ``"+51"`` -> ``"51"``);
5. the articles ``a``, ``an``, ``the`` are removed as words;
6. whitespace is collapsed.

By default (``first_line=True``) a string judge looks only at the first non-empty line of the
output: a base LLM that answers and then goes on writing (another question, an explanation on
the next line) is judged on its answer. A leading explanation on the first line is not an
answer and fails exact match; that strictness is deliberate (see ``data/facts/CARD.md``).

- :class:`ExactMatchJudge`: 1 when the normalised first line equals a normalised answer.
- :class:`TokenF1Judge`: the SQuAD token F1 (bag of normalised tokens), max over answers.
- :class:`ContainsJudge`: 1 when a normalised answer occurs in the normalised output as a whole
  word sequence (``"pe"`` is not contained in ``"peru"``).
- :class:`NumericJudge`: the first number in the output (thousands commas allowed, optional sign,
  decimals, exponents) against the numeric answers, within ``rel_tol``/``abs_tol``
  (:func:`math.isclose`); with ``words=True`` an output without digits is also read as English
  number words (``"three hundred and forty-seven"``, up to the billions, no fractions).
- :class:`LLMJudge`: asks any planner (a frozen LLM or a :class:`~memento.planners.base.CallablePlanner`)
  whether the output matches the ground truth; reward 1 on "yes".
- :class:`CallableJudge`: any function ``fn(task, output)`` returning a ``JudgeResult``, a bool,
  a number in [0, 1] or a ``(reward, reason)`` pair.

:func:`make_judge` is the explicit factory for the closed set of string judges (``JudgeKind``).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import re
import string
import unicodedata
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol, get_args, runtime_checkable

import numpy as np

from memento.errors import ConfigError, DataFormatError
from memento.types import Task

if TYPE_CHECKING:  # the judges module is imported by the loop; planners stay out of selector-only processes
    from memento.planners.base import Planner

__all__ = [
    "DEFAULT_LLM_JUDGE_PROMPT",
    "CallableJudge",
    "ContainsJudge",
    "ExactMatchJudge",
    "Judge",
    "JudgeKind",
    "JudgeResult",
    "LLMJudge",
    "NumericJudge",
    "TokenF1Judge",
    "first_line",
    "judge_many",
    "make_judge",
    "normalize_answer",
    "parse_number",
]

JudgeKind = Literal["exact", "f1", "contains", "numeric"]

_REASON_CHARS = 60
_SHOWN_ANSWERS = 5


@dataclasses.dataclass(frozen=True)
class JudgeResult:
    """A reward in [0, 1] and one short line saying why."""

    reward: float
    reason: str

    def __post_init__(self) -> None:
        if isinstance(self.reward, bool) or not isinstance(self.reward, numbers.Real):
            raise DataFormatError(f"JudgeResult.reward must be a number in [0, 1], got {self.reward!r}")
        if not math.isfinite(self.reward) or not 0.0 <= self.reward <= 1.0:
            raise DataFormatError(f"JudgeResult.reward must be in [0, 1], got {self.reward!r}")
        if not isinstance(self.reason, str):
            raise DataFormatError(f"JudgeResult.reason must be a string, got {type(self.reason).__name__}")
        object.__setattr__(self, "reward", float(self.reward))


@runtime_checkable
class Judge(Protocol):
    """Anything that scores a planner's output for a task."""

    def __call__(self, task: Task, output: str) -> JudgeResult: ...


# ------------------------------------------------------------------ normalisation

_DASHES = re.compile(r"[-\u2010-\u2015\u2212/_]")
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_ASCII_PUNCT = frozenset(string.punctuation)


def _is_punct(char: str) -> bool:
    return char in _ASCII_PUNCT or unicodedata.category(char).startswith("P")


def normalize_answer(text: str) -> str:
    """SQuAD-style normalisation plus accent folding and dash splitting (see the module docstring)."""
    text = unicodedata.normalize("NFKD", text)
    text = "".join(ch for ch in text if not unicodedata.combining(ch)).lower()
    text = _DASHES.sub(" ", text)
    text = "".join(ch for ch in text if not _is_punct(ch))
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def first_line(output: str) -> str:
    """The first line of ``output`` that is not blank (``""`` when there is none)."""
    for line in output.splitlines():
        if line.strip():
            return line.strip()
    return ""


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _REASON_CHARS else text[: _REASON_CHARS - 3] + "..."


def _expected(answers: Sequence[str]) -> str:
    shown = [_short(a) for a in answers[:_SHOWN_ANSWERS]]
    more = f" (+{len(answers) - _SHOWN_ANSWERS} more)" if len(answers) > _SHOWN_ANSWERS else ""
    return f"{shown}{more}"


def _check_output(output: Any) -> str:
    if not isinstance(output, str):
        raise DataFormatError(f"judge output must be a string, got {type(output).__name__}")
    return output


def _check_bool(owner: str, field: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ConfigError(f"{owner}.{field}={value!r}: must be true or false")


# ------------------------------------------------------------------ string judges


class ExactMatchJudge:
    """Reward 1 when the normalised output (first non-empty line) equals a normalised answer."""

    def __init__(self, *, first_line: bool = True):
        _check_bool("ExactMatchJudge", "first_line", first_line)
        self.first_line = first_line

    def __call__(self, task: Task, output: str) -> JudgeResult:
        text = _check_output(output)
        text = first_line(text) if self.first_line else text
        got = normalize_answer(text)
        for answer in task.answers:
            if got and got == normalize_answer(answer):
                return JudgeResult(1.0, f"exact match with {_short(answer)!r}")
        return JudgeResult(0.0, f"no answer matched; expected one of {_expected(task.answers)}, got {_short(text)!r}")

    def __repr__(self) -> str:
        return f"ExactMatchJudge(first_line={self.first_line})"


def _token_f1(prediction: list[str], truth: list[str]) -> float:
    if not prediction or not truth:
        return float(prediction == truth)
    common = sum((Counter(prediction) & Counter(truth)).values())
    if common == 0:
        return 0.0
    precision = common / len(prediction)
    recall = common / len(truth)
    return 2 * precision * recall / (precision + recall)


class TokenF1Judge:
    """Reward = the best SQuAD token F1 between the normalised output and any answer."""

    def __init__(self, *, first_line: bool = True):
        _check_bool("TokenF1Judge", "first_line", first_line)
        self.first_line = first_line

    def __call__(self, task: Task, output: str) -> JudgeResult:
        text = _check_output(output)
        text = first_line(text) if self.first_line else text
        tokens = normalize_answer(text).split()
        best, best_answer = -1.0, task.answers[0]
        for answer in task.answers:
            score = _token_f1(tokens, normalize_answer(answer).split())
            if score > best:
                best, best_answer = score, answer
        if best == 0.0:
            return JudgeResult(0.0, f"no token overlap; expected one of {_expected(task.answers)}, "
                                    f"got {_short(text)!r}")
        return JudgeResult(best, f"token F1 {best:.2f} with {_short(best_answer)!r}")

    def __repr__(self) -> str:
        return f"TokenF1Judge(first_line={self.first_line})"


class ContainsJudge:
    """Reward 1 when a normalised answer occurs as whole words in the normalised output."""

    def __init__(self, *, first_line: bool = True):
        _check_bool("ContainsJudge", "first_line", first_line)
        self.first_line = first_line

    def __call__(self, task: Task, output: str) -> JudgeResult:
        text = _check_output(output)
        text = first_line(text) if self.first_line else text
        padded = f" {normalize_answer(text)} "
        for answer in task.answers:
            norm = normalize_answer(answer)
            if norm and f" {norm} " in padded:
                return JudgeResult(1.0, f"output contains {_short(answer)!r}")
        return JudgeResult(0.0, f"no answer contained; expected one of {_expected(task.answers)}, "
                                f"got {_short(text)!r}")

    def __repr__(self) -> str:
        return f"ContainsJudge(first_line={self.first_line})"


# ------------------------------------------------------------------ numbers

_NUMBER = re.compile(r"(?<![\w.])[-+\u2212]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?|"
                     r"(?<![\w.])[-+\u2212]?\.\d+(?:[eE][-+]?\d+)?")

_UNITS = {word: value for value, word in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen".split())}
_TENS = {word: 10 * (i + 2) for i, word in enumerate("twenty thirty forty fifty sixty seventy eighty ninety".split())}
_SCALES = {"thousand": 10**3, "million": 10**6, "billion": 10**9}
_NUMBER_WORDS = frozenset(_UNITS) | frozenset(_TENS) | frozenset(_SCALES) | {"hundred", "and", "minus", "negative"}


def _parse_number_words(text: str) -> float | None:
    """The first run of English number words in ``text`` as a number, or None.

    Handles "zero" to "nine hundred and ninety-nine billion ..." with hyphens, commas and "and";
    "a hundred" / "a thousand" count as one; a leading "minus"/"negative" makes it negative.
    No fractions, no ordinals, no "a dozen".
    """
    words = [w.strip(string.punctuation) for w in re.sub(r"[-,]", " ", text.lower()).split()]
    for start, word in enumerate(words):
        if word in _NUMBER_WORDS and word != "and":
            value = _words_value(words[start:])
            if value is not None:
                return value
    return None


def _words_value(words: list[str]) -> float | None:
    sign, total, current, seen = 1, 0, 0, False
    for i, word in enumerate(words):
        if word in ("minus", "negative") and i == 0:
            sign = -1
        elif word in _UNITS:
            current += _UNITS[word]
            seen = True
        elif word in _TENS:
            current += _TENS[word]
            seen = True
        elif word == "hundred":
            current = max(current, 1) * 100
            seen = True
        elif word in _SCALES:
            total += max(current, 1) * _SCALES[word]
            current, seen = 0, True
        elif word == "and" and seen:
            continue
        else:
            break
    return float(sign * (total + current)) if seen else None


def parse_number(text: str, *, words: bool = False) -> float | None:
    """The first number in ``text`` (``"1,347.5"``, ``"-3e2"``, ``"+51"``), or None when there is none.

    With ``words=True`` and no digits in ``text``, English number words are read instead.
    """
    match = _NUMBER.search(text)
    if match:
        return float(match.group(0).replace(",", "").replace("\u2212", "-"))
    return _parse_number_words(text) if words else None


class NumericJudge:
    """Reward 1 when the first number in the output is close to a numeric answer.

    ``math.isclose(got, expected, rel_tol=rel_tol, abs_tol=abs_tol)``; answers that are not
    numbers are skipped, and a task none of whose answers is a number raises ``DataFormatError``
    (the judge does not fit the task).
    """

    def __init__(self, *, rel_tol: float = 1e-9, abs_tol: float = 0.0, words: bool = False, first_line: bool = True):
        for field, value in (("rel_tol", rel_tol), ("abs_tol", abs_tol)):
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value < 0:
                raise ConfigError(f"NumericJudge.{field}={value!r}: must be a finite number >= 0")
        _check_bool("NumericJudge", "words", words)
        _check_bool("NumericJudge", "first_line", first_line)
        self.rel_tol = float(rel_tol)
        self.abs_tol = float(abs_tol)
        self.words = words
        self.first_line = first_line

    def __call__(self, task: Task, output: str) -> JudgeResult:
        text = _check_output(output)
        text = first_line(text) if self.first_line else text
        expected = [(a, v) for a in task.answers if (v := parse_number(a, words=self.words)) is not None]
        if not expected:
            raise DataFormatError(f"NumericJudge: task {task.id!r} has no numeric answer in {list(task.answers)!r}")
        got = parse_number(text, words=self.words)
        if got is None:
            return JudgeResult(0.0, f"no number in output; expected {_expected([a for a, _ in expected])}, "
                                    f"got {_short(text)!r}")
        for answer, value in expected:
            if math.isclose(got, value, rel_tol=self.rel_tol, abs_tol=self.abs_tol):
                return JudgeResult(1.0, f"number {got:g} matches {_short(answer)!r}")
        return JudgeResult(0.0, f"number {got:g} matches none of {_expected([a for a, _ in expected])}")

    def __repr__(self) -> str:
        return f"NumericJudge(rel_tol={self.rel_tol}, abs_tol={self.abs_tol}, words={self.words})"


# ------------------------------------------------------------------ LLM and callables

DEFAULT_LLM_JUDGE_PROMPT = (
    "You are grading an answer against the ground truth.\n"
    "Question: {question}\n"
    "Ground truth (any of): {answers}\n"
    "Answer to grade: {output}\n"
    "Does the answer match the ground truth? Reply with yes or no only."
)
_PROMPT_FIELDS = ("question", "answers", "output")
_YES = frozenset({"yes", "y", "true", "correct"})
_NO = frozenset({"no", "n", "false", "incorrect", "wrong"})


class LLMJudge:
    """Asks a planner whether the output matches the ground truth; reward 1 on yes, 0 on no.

    ``prompt_template`` is a ``str.format`` template with the fields ``{question}``,
    ``{answers}`` (joined with " | ") and ``{output}`` (literal braces doubled). The prompt goes to
    ``planner.plan`` as the question of a judge task (``id = "judge:<task id>"``) with no cases.
    The reply is read from its first non-empty line: its first word decides when it is yes/no
    (or true/false, correct/incorrect); otherwise the first such word anywhere in the reply;
    a reply with neither scores 0 with the reason saying so.
    """

    def __init__(self, planner: Planner, prompt_template: str = DEFAULT_LLM_JUDGE_PROMPT):
        if not callable(getattr(planner, "plan", None)):
            raise ConfigError(f"LLMJudge.planner={planner!r}: must implement plan(task, cases)")
        if not isinstance(prompt_template, str):
            raise ConfigError(f"LLMJudge.prompt_template={prompt_template!r}: must be a string")
        fields = {name for _, name, _, _ in string.Formatter().parse(prompt_template) if name is not None}
        missing = [name for name in _PROMPT_FIELDS if name not in fields]
        unknown = sorted(fields - set(_PROMPT_FIELDS))
        if missing or unknown:
            raise ConfigError(f"LLMJudge.prompt_template: needs the fields {list(_PROMPT_FIELDS)}; "
                              f"missing {missing}, unknown {unknown}")
        self.planner = planner
        self.prompt_template = prompt_template

    def prompt(self, task: Task, output: str) -> str:
        return self.prompt_template.format(question=task.question, answers=" | ".join(task.answers),
                                           output=_check_output(output).strip())

    def judge_task(self, task: Task, output: str) -> Task:
        """The task handed to the planner: the grading prompt as its question."""
        return Task(id=f"judge:{task.id}", question=self.prompt(task, output), answers=("yes",),
                    family="judge", env=task.env, meta={"judged_task": task.id})

    @staticmethod
    def parse_reply(reply: str) -> JudgeResult:
        words = normalize_answer(first_line(reply)).split()
        if words and words[0] in _YES:
            return JudgeResult(1.0, f"LLM judge said {words[0]!r}")
        if words and words[0] in _NO:
            return JudgeResult(0.0, f"LLM judge said {words[0]!r}")
        for word in normalize_answer(reply).split():
            if word in _YES or word in _NO:
                return JudgeResult(1.0 if word in _YES else 0.0, f"LLM judge said {word!r} (not first)")
        return JudgeResult(0.0, f"LLM judge reply is not yes/no: {_short(reply)!r}")

    def __call__(self, task: Task, output: str) -> JudgeResult:
        reply = self.planner.plan(self.judge_task(task, output), [])
        return self.parse_reply(reply.text)

    def judge_many(self, tasks: Sequence[Task], outputs: Sequence[str]) -> list[JudgeResult]:
        """One batched ``planner.plan_many`` call for many (task, output) pairs."""
        if len(tasks) != len(outputs):
            raise DataFormatError(f"judge_many got {len(tasks)} tasks but {len(outputs)} outputs")
        judge_tasks = [self.judge_task(task, output) for task, output in zip(tasks, outputs)]
        replies = self.planner.plan_many(judge_tasks, [[] for _ in judge_tasks])
        return [self.parse_reply(reply.text) for reply in replies]

    def __repr__(self) -> str:
        return f"LLMJudge(planner={self.planner!r})"


class CallableJudge:
    """Wraps ``fn(task, output)`` returning a JudgeResult, a bool, a number in [0, 1] or ``(reward, reason)``."""

    def __init__(self, fn: Callable[[Task, str], Any], *, name: str | None = None):
        if not callable(fn):
            raise ConfigError(f"CallableJudge.fn={fn!r}: must be callable")
        self.fn = fn
        self.name = name or getattr(fn, "__name__", "callable")

    def __call__(self, task: Task, output: str) -> JudgeResult:
        out = self.fn(task, _check_output(output))
        if isinstance(out, JudgeResult):
            return out
        if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], str):
            return JudgeResult(self._reward(out[0]), out[1])
        reward = self._reward(out)
        return JudgeResult(reward, f"{self.name}: reward {reward:g}")

    def _reward(self, value: Any) -> float:
        if isinstance(value, (bool, np.bool_)):
            return float(value)
        if isinstance(value, numbers.Real):
            return float(value)
        raise DataFormatError(f"judge {self.name!r} returned {value!r}; expected a JudgeResult, a bool, "
                              "a number in [0, 1] or (reward, reason)")

    def __repr__(self) -> str:
        return f"CallableJudge(name={self.name!r})"


def judge_many(judge: Judge, tasks: Sequence[Task], outputs: Sequence[str]) -> list[JudgeResult]:
    """Judge many (task, output) pairs; batched when the judge has ``judge_many`` (the LLM judge)."""
    if len(tasks) != len(outputs):
        raise DataFormatError(f"judge_many got {len(tasks)} tasks but {len(outputs)} outputs")
    batched = getattr(judge, "judge_many", None)
    if callable(batched):
        return list(batched(tasks, outputs))
    return [judge(task, output) for task, output in zip(tasks, outputs)]


def make_judge(kind: JudgeKind, **kwargs: Any) -> Judge:
    """The string judge of a given kind: ``"exact"``, ``"f1"``, ``"contains"`` or ``"numeric"``.

    ``kwargs`` go to the judge's constructor (``first_line`` for all; ``rel_tol``, ``abs_tol``,
    ``words`` for ``"numeric"``). The LLM and callable judges take objects, so they are built directly.
    """
    try:
        match kind:
            case "exact":
                return ExactMatchJudge(**kwargs)
            case "f1":
                return TokenF1Judge(**kwargs)
            case "contains":
                return ContainsJudge(**kwargs)
            case "numeric":
                return NumericJudge(**kwargs)
            case _:
                raise ConfigError(f"judge kind={kind!r}: must be one of {get_args(JudgeKind)}")
    except TypeError as error:
        raise ConfigError(f"judge kind={kind!r}: bad arguments {sorted(kwargs)}: {error}") from None
