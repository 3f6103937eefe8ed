"""The typed records that flow between components.

``Case`` is one item of the case bank (Case JSONL, docs/formats.md); ``Task`` is one task
of a suite (Task JSONL, docs/formats.md). Both are frozen; both validate their fields so a
malformed record cannot reach the bank or the planner.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import numbers
from typing import Any

import numpy as np

from memento.errors import DataFormatError

__all__ = ["Case", "Selection", "Task", "content_hash"]


def content_hash(state: str, action: str, env: str | None, kind: str) -> str:
    """sha256 of what makes two cases the same experience: state, action, env and kind.

    The reward is an outcome, not content: the same (state, action) seen again is a
    duplicate even if its reward differs (use ``update_reward`` to change it).
    """
    payload = json.dumps([state, action, env, kind], ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def _require_text(value: Any, field: str, owner: str, *, allow_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise DataFormatError(f"{owner}.{field} must be a string, got {type(value).__name__}")
    if not allow_empty and not value.strip():
        raise DataFormatError(f"{owner}.{field} is empty")
    return value


@dataclasses.dataclass(frozen=True, kw_only=True)
class Case:
    """One experience: a state (task text), the action taken (answer, plan, tip), and its reward.

    ``id`` is assigned by the bank when left ``None``. ``kind`` separates raw cases from
    derived items (tips, skills, propositions) that later policies put in the same bank.
    """

    state: str
    action: str
    reward: float
    id: str | None = None
    env: str | None = None
    kind: str = "case"
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)
    created: float | None = None

    def __post_init__(self) -> None:
        _require_text(self.state, "state", "Case")
        _require_text(self.action, "action", "Case")
        _require_text(self.kind, "kind", "Case")
        if self.id is not None:
            _require_text(self.id, "id", "Case")
        if self.env is not None:
            _require_text(self.env, "env", "Case")
        if isinstance(self.reward, (bool, np.bool_)) or not isinstance(self.reward, numbers.Real):
            raise DataFormatError(f"Case.reward must be a number, got {self.reward!r}")
        if not math.isfinite(self.reward):
            raise DataFormatError(f"Case.reward must be finite, got {self.reward!r}")
        object.__setattr__(self, "reward", float(self.reward))
        if not isinstance(self.meta, dict):
            raise DataFormatError(f"Case.meta must be an object, got {type(self.meta).__name__}")

    @property
    def content_hash(self) -> str:
        return content_hash(self.state, self.action, self.env, self.kind)

    def to_json(self) -> dict[str, Any]:
        """The Case JSONL row of docs/formats.md."""
        row: dict[str, Any] = {"id": self.id, "state": self.state, "action": self.action,
                               "reward": self.reward, "kind": self.kind}
        if self.env is not None:
            row["env"] = self.env
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
        _require_text(self.id, "id", "Task")
        _require_text(self.question, "question", "Task")
        if isinstance(self.answers, str) or not isinstance(self.answers, (list, tuple)):
            raise DataFormatError(f"Task.answers must be a list of strings, got {self.answers!r}")
        answers = tuple(self.answers)
        if not answers:
            raise DataFormatError("Task.answers is empty")
        for answer in answers:
            _require_text(answer, "answers[]", "Task")
        object.__setattr__(self, "answers", answers)
        for field in ("family", "env"):
            value = getattr(self, field)
            if value is not None:
                _require_text(value, field, "Task")
        if not isinstance(self.meta, dict):
            raise DataFormatError(f"Task.meta must be an object, got {type(self.meta).__name__}")

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
