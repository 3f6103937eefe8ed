"""The typed records that flow between components.

``Case`` is one item of the case bank (Case JSONL, docs/formats.md); ``Task`` is one task
of a suite (Task JSONL, docs/formats.md). Both are frozen; both validate their fields so a
malformed record cannot reach the bank or the planner.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import numbers
import re
from typing import Any

import numpy as np
import orjson

from memento.errors import DataFormatError

__all__ = ["MAX_ID_CHARS", "MAX_TEXT_CHARS", "SCOPE_FIELDS", "Case", "Selection", "Task", "check_id", "check_reward",
           "check_text", "content_hash", "finite_float", "is_id", "is_text", "json_value_problem", "shown"]

# ---------------------------------------------------------------- the range of each field, decided once
#
# Every entry point that takes a case, a reward, an id or a text (the Case and Task records, the JSONL readers,
# the bank, the selector, the HTTP and MCP request schema, the CLI) checks it with these functions, so the same
# value gets the same verdict everywhere:
#
# - a reward is a finite real number in [0, 1] (a bool, a string, NaN, an infinity, an integer beyond float range
#   are refused): a judge's score, a game's normalised score, the soft-Q learner's P(success);
# - a text (a case's state and action, a task's question and answers, a query) holds 1 to MAX_TEXT_CHARS
#   characters, not all whitespace, no NUL and no lone surrogate (neither can be stored as UTF-8 text);
# - an id (a case id, a task id, an env, a kind, a family, a selection id) holds 1 to MAX_ID_CHARS characters,
#   not all whitespace, no control character (C0, DEL, C1) and no lone surrogate.

MAX_TEXT_CHARS = 1_000_000
"""The longest text a case or a task may hold (characters); the serving transports may set a lower limit."""
MAX_ID_CHARS = 256
"""The longest id, env, kind or family (characters)."""
REWARD_LOW, REWARD_HIGH = 0.0, 1.0
SCOPE_FIELDS = ("user", "agent", "session")
"""The scope fields a case may carry (who it belongs to; :mod:`memento.bank.where`)."""

_NOT_TEXT = re.compile("[\x00\ud800-\udfff]")
_NOT_ID = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_MAX_INT_DIGITS = 4300  # Python's default int <-> str limit: a longer integer cannot be written as JSON
_LINE_BREAK = re.compile(r"\s*[\r\n]\s*")


def shown(value: Any, limit: int = 80) -> str:
    """``repr(value)`` for an error message: one line of at most ``limit`` characters (a longer one keeps its head
    and tail and says its length), never raising. An integer of more than 256 bits, or one whose repr is longer
    than ``limit``, is described by its number of digits (its repr could be thousands of characters, or more than
    Python converts); a value whose repr fails is described by its type."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value.bit_length() > 3 * _MAX_INT_DIGITS:  # beyond what str() converts (3 bits < 1 digit)
            return f"an integer of about {int(value.bit_length() * math.log10(2)) + 1} digits"
        digits = len(str(abs(value)))
        if value.bit_length() > 256 or digits + (value < 0) > limit:
            return f"an integer of {digits} digits"
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a value whose repr fails (or nests too deeply) is described by its type
        return f"a {type(value).__name__}"
    text = _LINE_BREAK.sub(" ", text)  # a multi-line repr (an array, an object's own) on one line
    if len(text) <= limit:
        return text
    note = f" ({len(text)} chars)" if limit >= 40 else ""
    tail = min(12, max(limit - len(note) - 3, 0) // 4)
    head = max(limit - len(note) - 3 - tail, 0)
    return f"{text[:head]}...{text[len(text) - tail:] if tail else ''}{note}"


def finite_float(value: Any) -> float | None:
    """``value`` as a finite float when it is a real number (an int, a float, a numpy number; never a bool), else
    None.

    Never raises: an integer beyond float range (``10 ** 400``) is None, where ``float()`` and ``math.isfinite``
    would raise OverflowError."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):  # numpy's bool is not a numbers.Real
        return None
    try:
        number = float(value)
    except (OverflowError, ValueError, TypeError):  # an integer beyond float range
        return None
    return number if math.isfinite(number) else None


def check_reward(value: Any, what: str = "reward") -> float:
    """A reward as a float: a finite real number in [0, 1]; anything else raises ``DataFormatError`` naming ``what``
    and the value."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise DataFormatError(f"{what} must be a number in [0, 1], got {shown(value)}")
    number = finite_float(value)
    if number is None and isinstance(value, numbers.Integral):  # an integer beyond float range
        raise DataFormatError(f"{what} must be finite, got {shown(value)} (a reward is a number in [0, 1])")
    if number is None or not REWARD_LOW <= number <= REWARD_HIGH:
        raise DataFormatError(f"{what} must be a number in [0, 1], got {shown(value)}")
    return number


def _check_string(value: Any, what: str, max_chars: int, bad: re.Pattern[str], kind: str) -> str:
    if not isinstance(value, str):
        raise DataFormatError(f"{what} must be a string, got {type(value).__name__}")
    if len(value) > max_chars:
        raise DataFormatError(f"{what} is {len(value)} characters long; {kind} holds at most {max_chars}")
    found = bad.search(value)
    if found is not None:
        char = found.group()
        name = ("a NUL character" if char == "\x00" else "a lone surrogate" if "\ud800" <= char <= "\udfff"
                else "a control character")
        raise DataFormatError(f"{what} holds {name} ({char!r} at index {found.start()}), which is not allowed "
                              f"in {kind}")
    if not value.strip():
        raise DataFormatError(f"{what} is empty")  # or only whitespace
    return value


def is_text(value: Any) -> bool:
    """Whether :func:`check_text` takes ``value`` (with its default bound), without building an error."""
    return type(value) is str and 0 < len(value) <= MAX_TEXT_CHARS and _NOT_TEXT.search(value) is None \
        and not value.isspace()


def is_id(value: Any) -> bool:
    """Whether :func:`check_id` takes ``value`` (with its default bound), without building an error."""
    return type(value) is str and 0 < len(value) <= MAX_ID_CHARS and _NOT_ID.search(value) is None \
        and not value.isspace()


def check_text(value: Any, what: str, *, max_chars: int = MAX_TEXT_CHARS) -> str:
    """A text (state, action, question, answer, query): a string of 1 to ``max_chars`` characters, not all
    whitespace, without NUL or lone surrogates; anything else raises ``DataFormatError``."""
    return _check_string(value, what, max_chars, _NOT_TEXT, "a text")


def check_id(value: Any, what: str, *, max_chars: int = MAX_ID_CHARS) -> str:
    """An id (case id, task id, selection id, env, kind, family): a string of 1 to ``max_chars`` characters, not
    all whitespace, without control characters or lone surrogates; anything else raises ``DataFormatError``."""
    return _check_string(value, what, max_chars, _NOT_ID, "an id")


_MAX_DEPTH = 100


def json_value_problem(value: Any, *, finite: bool = False) -> str | None:
    """Why a JSON-like value cannot be stored and written back as UTF-8 JSON, or None: nesting deeper than 100
    levels, a string holding a lone surrogate (``"\\ud800"``), an object key that is not a string, a value that
    is not JSON (a set, a numpy integer...), an integer of more than 4300 digits, with ``finite`` a NaN or an
    infinity.

    Iterative, so a deep value cannot exhaust the stack."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            found = _SURROGATE.search(item)
            if found is not None:
                return f"a string holds a lone surrogate ({found.group()!r}), which is not text"
        elif isinstance(item, float):
            if finite and not math.isfinite(item):
                return f"{item!r} is not a JSON number"
        elif isinstance(item, bool) or item is None:
            continue
        elif isinstance(item, int):
            if item.bit_length() > _MAX_INT_DIGITS * 3:  # ~ 900 digits short of the limit: cheap and safe
                return f"{shown(item)} is too long to write as JSON"
        elif isinstance(item, (dict, list, tuple)):
            if depth >= _MAX_DEPTH:
                return f"nested deeper than {_MAX_DEPTH} levels"
            if isinstance(item, dict):
                for key in item:
                    if not isinstance(key, str):
                        return f"an object key is {shown(key)}, not a string"
                children: Any = [*item.keys(), *item.values()]
            else:
                children = item
            stack.extend((child, depth + 1) for child in children)
        else:
            return f"{type(item).__name__} is not a JSON value"
    return None


def content_hash(state: str, action: str, env: str | None, kind: str,
                 scope: tuple[str | None, ...] = (None, None, None)) -> str:
    """sha256 of what makes two cases the same experience: state, action, env, kind and, when any is set, the
    scope (user, agent, session: the same experience of two users is two cases).

    The reward is an outcome, not content: the same (state, action) seen again is a
    duplicate even if its reward differs (use ``update_reward`` to change it). An unscoped case hashes as it
    did before scopes existed, so ids of existing banks are unchanged.
    """
    fields: list[Any] = [state, action, env, kind]
    if any(value is not None for value in scope):
        fields.append(list(scope))
    return hashlib.sha256(orjson.dumps(fields)).hexdigest()  # json.dumps(fields, ensure_ascii=False,
    # separators=(",", ":")) byte for byte (tests/unit/test_ingest.py), about 5x faster


def _meta(value: Any, owner: str) -> None:
    if not isinstance(value, dict):
        raise DataFormatError(f"{owner}.meta must be an object, got {type(value).__name__}")
    problem = json_value_problem(value, finite=True)
    if problem is not None:
        raise DataFormatError(f"{owner}.meta: {problem}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Case:
    """One experience: a state (task text), the action taken (answer, plan, tip), and its reward.

    ``id`` is assigned by the bank when left ``None``. ``kind`` separates raw cases from
    derived items (tips, skills, propositions) that later policies put in the same bank.
    ``user``/``agent``/``session`` scope the case (who it belongs to): a search with a scope finds only the
    cases of that scope (:mod:`memento.bank.where`). ``version`` counts the changes made to the stored case in
    place (1 when added; each ``update`` adds one) and ``updated`` is the time of the last one (a bank reads it
    as ``created`` until the case is first updated); neither is part of the Case JSONL row.
    """

    state: str
    action: str
    reward: float
    id: str | None = None
    env: str | None = None
    kind: str = "case"
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)
    created: float | None = None
    user: str | None = None
    agent: str | None = None
    session: str | None = None
    version: int = 1
    updated: float | None = None

    def __post_init__(self) -> None:
        check_text(self.state, "Case.state")
        check_text(self.action, "Case.action")
        check_id(self.kind, "Case.kind")
        if self.id is not None:
            check_id(self.id, "Case.id")
        if self.env is not None:
            check_id(self.env, "Case.env")
        for name in SCOPE_FIELDS:
            if getattr(self, name) is not None:
                check_id(getattr(self, name), f"Case.{name}")
        object.__setattr__(self, "reward", check_reward(self.reward, "Case.reward"))
        _meta(self.meta, "Case")
        if self.created is not None and finite_float(self.created) is None:  # not a number, NaN, inf, 10 ** 400
            raise DataFormatError(f"Case.created must be a finite number (Unix seconds), got {shown(self.created)}")
        if isinstance(self.version, bool) or not isinstance(self.version, numbers.Integral) or self.version < 1:
            raise DataFormatError(f"Case.version must be an integer >= 1, got {shown(self.version)}")
        object.__setattr__(self, "version", int(self.version))
        if self.updated is not None and finite_float(self.updated) is None:
            raise DataFormatError(f"Case.updated must be a finite number (Unix seconds), got {shown(self.updated)}")

    @functools.cached_property
    def content_hash(self) -> str:
        """:func:`content_hash` of this case, computed once (the fields it reads are frozen)."""
        return content_hash(self.state, self.action, self.env, self.kind, self.scope)

    @property
    def scope(self) -> tuple[str | None, str | None, str | None]:
        """``(user, agent, session)``."""
        return (self.user, self.agent, self.session)

    def to_json(self) -> dict[str, Any]:
        """The Case JSONL row of docs/formats.md."""
        row: dict[str, Any] = {"id": self.id, "state": self.state, "action": self.action,
                               "reward": self.reward, "kind": self.kind}
        for name in ("env", *SCOPE_FIELDS):
            if getattr(self, name) is not None:
                row[name] = getattr(self, name)
        if self.meta:
            row["meta"] = self.meta
        return row


@dataclasses.dataclass(frozen=True, kw_only=True)
class Task:
    """One task: a question, its accepted answers, and where it comes from."""

    id: str
    question: str
    answers: tuple[str, ...]
    family: str | None = None
    env: str | None = None
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        check_id(self.id, "Task.id")
        check_text(self.question, "Task.question")
        if isinstance(self.answers, str) or not isinstance(self.answers, (list, tuple)):
            raise DataFormatError(f"Task.answers must be a list of strings, got {shown(self.answers)}")
        answers = tuple(self.answers)
        if not answers:
            raise DataFormatError("Task.answers is empty")
        for answer in answers:
            check_text(answer, "Task.answers[]")
        object.__setattr__(self, "answers", answers)
        for field in ("family", "env"):
            value = getattr(self, field)
            if value is not None:
                check_id(value, f"Task.{field}")
        _meta(self.meta, "Task")

    def to_json(self) -> dict[str, Any]:
        """The Task JSONL row of docs/formats.md."""
        row: dict[str, Any] = {"id": self.id, "question": self.question, "answers": list(self.answers)}
        for field in ("family", "env"):
            if getattr(self, field) is not None:
                row[field] = getattr(self, field)
        if self.meta:
            row["meta"] = self.meta
        return row


@dataclasses.dataclass(frozen=True, kw_only=True)
class Selection:
    """K cases chosen from a candidate set of C, with what off-policy evaluation needs.

    - ``ids``: the chosen case ids, in the order they were drawn;
    - ``positions_K``: their indices into the candidate set (``ids[i] == candidate_ids[positions_K[i]]``);
      a case's bank position is ``candidates.positions_C[positions_K[i]]``;
    - ``probs_C``: the policy's distribution over all candidates (sums to 1);
    - ``probs_K``: ``probs_C`` at the chosen cases (each case's first-draw propensity);
    - ``set_prob``: the Plackett-Luce probability of drawing exactly this ordered set without
      replacement, ``prod_k p_k / (1 - sum_{j<k} p_j)`` (1.0 for a greedy choice);
    - ``candidate_ids``: the candidate set the choice was made from;
    - ``greedy``: True for an arg-max (evaluation) choice, False for a sampled one.
    """

    ids: list[str]
    positions_K: np.ndarray
    probs_K: np.ndarray
    set_prob: float
    candidate_ids: list[str]
    probs_C: np.ndarray
    greedy: bool

    def __len__(self) -> int:
        return len(self.ids)
