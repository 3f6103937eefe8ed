"""CFGM (Coarse-to-Fine Grounded Memory, EMNLP 2025): the memory-building procedures over the bank's items.

Every LLM call goes through :meth:`memento.systems.llm.MemoryLLM.ask` with one of the
:class:`~memento.systems.llm.BuilderTemplates`; every item is made with :func:`memento.systems.items.make_item`
(``system="cfgm"``), so its provenance (``meta.sources``) links it to the bank entries it was made from.

**Focus points** (:func:`focus_point`, coarse grain). Before an environment's first training episode, template
``focus`` reads its description and a few examples of play (one a line, ``"- "`` prefixed) and writes at most
``focus_max`` guidance points (paper: 5). The result is ONE ``focus`` item: ``state = "<env>: <description>"``
(just ``<env>`` for an empty description), ``action`` the points one a line (``"- "`` prefixed), ``env`` the
environment, no sources (it is made from the description, not from a trajectory), ``meta.points`` the list.
*Fallback*: a reply with no point gives no item (``None``, a warning); the caller may ask again later.

**Hybrid-grained tips** (:func:`build_tips`, fine grain). Tips are built only for a task with at least one
success (a task with none gives ``[]`` and no call: there is nothing to ground a tip in). With a failure, one
``tips_contrast`` call compares the best success (highest reward, the first among ties) with the first failure
and gives at most ``tips_contrast_max`` tips (paper: 5), each linked to both (``meta.source_kind =
"contrast"``); then one ``tips_success`` call on the success alone gives at most ``tips_success_max`` (paper: 3),
linked to the success (``"success"``). So at most 5 + 3 tips; a tip the second call repeats (case-insensitive,
whitespace collapsed) is kept once. A trajectory given to a prompt is its ``action`` text, cut to its first
``trajectory_max_chars`` characters. Each tip is one ``tip`` item: ``state`` the task text, ``action`` the tip,
``reward`` 0, ``meta.task`` the caller's task key (or the task text). *Fallback*: a call whose reply has no item
contributes no tip (a warning); the other call still counts. A call whose budget is 0 is not made.

**Key-information reflection** (:class:`KeyInfoReflection`, KIR). At every step an anomaly detector (any callable
``observation -> bool``; the default :class:`PatternDetector` matches TextWorld/ALFWorld refusals such as
"Nothing happens", "You can't ...", "is locked") reads the latest observation. Only when it fires are the key
facts (:func:`key_facts`: goal, progress, the last distinct commands attempted, the latest error, the open
candidate commands) given to the ``reflect`` template, a self-question whose answer's first line (whitespace
collapsed, cut to ``reflect_max_chars``) is the correction shown at the next step. Otherwise no call is made.
:func:`retry_reflection` is the same reflection on a failed training attempt before it is played again (up to
``retries`` times, paper: 3; the retries themselves are run by the caller): it always fires. *Fallback* (both):
a reply that is empty or has no letter gives a deterministic correction from the facts,
``"The last action (<cmd>) failed: <error>. Try another action, e.g. <candidate>."`` (without the ``e.g.`` part
when no candidate is open), cut the same way.

**Defaults** are the paper's settings: 5 focus points, 5 + 3 tips, 3 reflection retries; the dual-channel top-k
retrieval (k = 2 trajectories and their tips) is the policy ``memento.policies.cfgm``
(:class:`memento.policies.cfgm.CFGMRetrievalConfig`), not built here.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from memento.config import check_ints, from_dict
from memento.errors import ConfigError, DataFormatError, ProvenanceError, ReplyFormatError
from memento.systems.items import make_item
from memento.systems.llm import collapse as _collapse
from memento.systems.llm import cut as _cut
from memento.systems.llm import parse_items
from memento.types import Case

__all__ = [
    "DEFAULT_ANOMALY_PATTERNS",
    "AnomalyDetector",
    "CFGMConfig",
    "KeyFacts",
    "KeyInfoReflection",
    "PatternDetector",
    "build_tips",
    "focus_point",
    "key_facts",
    "retry_reflection",
]

logger = logging.getLogger(__name__)

SYSTEM = "cfgm"
ERROR_MAX_CHARS = 200


@dataclasses.dataclass(frozen=True, kw_only=True)
class CFGMConfig:
    """CFGM's builder settings (see the module docstring; the defaults are the paper's)."""

    focus_max: int = 5
    tips_contrast_max: int = 5
    tips_success_max: int = 3
    retries: int = 3
    reflect_max_chars: int = 200
    trajectory_max_chars: int = 1200

    def __post_init__(self) -> None:
        check_ints(self, focus_max=1, tips_contrast_max=0, tips_success_max=0, retries=0, reflect_max_chars=1,
                         trajectory_max_chars=1)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CFGMConfig:
        """From a dict (missing fields keep their defaults; an unknown field or a bad value: ConfigError)."""
        return from_dict(cls, data)


# ---------------------------------------------------------------------- helpers


def _text(value: Any, what: str, *, allow_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise DataFormatError(f"cfgm: {what} must be a string, got {type(value).__name__}")
    if not allow_empty and not value.strip():
        raise DataFormatError(f"cfgm: {what} is empty")
    return value


def _config(config: CFGMConfig | None) -> CFGMConfig:
    if config is None:
        return CFGMConfig()
    if not isinstance(config, CFGMConfig):
        raise ConfigError(f"cfgm: config must be a CFGMConfig, got {type(config).__name__}")
    return config


# ---------------------------------------------------------------------- focus points


def focus_point(llm: Any, env: str, description: str, examples: Sequence[str],
                config: CFGMConfig | None = None) -> Case | None:
    """The environment's ``focus`` item (see the module docstring); ``None`` when the reply has no point."""
    config = _config(config)
    env = _text(env, "env")
    description = _collapse(_text(description, "description", allow_empty=True))
    lines = [_collapse(str(example)) for example in examples]
    lines = [line for line in lines if line]
    reply = llm.ask("focus", env=env, description=description,
                    examples="\n".join(f"- {line}" for line in lines) if lines else "- (none)",
                    max_items=config.focus_max)
    try:
        points = parse_items(reply, config.focus_max, what="focus points")
    except ReplyFormatError as error:
        logger.warning("cfgm focus %s: %s; no focus point", env, error)
        return None
    state = f"{env}: {description}" if description else env
    item = make_item("focus", state, "\n".join(f"- {point}" for point in points), system=SYSTEM, sources=[],
                     env=env, points=list(points))
    llm.count_items("focus", 1)
    return item


# ---------------------------------------------------------------------- tips


def _with_ids(cases: Sequence[Case], what: str) -> list[Case]:
    out = list(cases)
    for i, case in enumerate(out):
        if not isinstance(case, Case):
            raise DataFormatError(f"cfgm tips: {what}[{i}] is {type(case).__name__}, expected memento.Case")
        if not case.id:
            raise ProvenanceError(f"cfgm tips: {what}[{i}] has no id (add it to the bank before building tips)")
    return out


def _tip_call(llm: Any, template: str, task: str, max_items: int, **fields: str) -> list[str]:
    if max_items <= 0:
        return []
    reply = llm.ask(template, task=task, max_items=max_items, **fields)
    try:
        return parse_items(reply, max_items, what=f"{template} tips")
    except ReplyFormatError as error:
        logger.warning("cfgm %s for %r: %s; no tip from this call", template, task[:60], error)
        return []


def build_tips(llm: Any, task: str, env: str | None, successes: Sequence[Case], failures: Sequence[Case],
               config: CFGMConfig | None = None, *, task_key: str | None = None) -> list[Case]:
    """The ``tip`` items of one task (see the module docstring); ``[]`` when the task has no success."""
    config = _config(config)
    task = _text(task, "task")
    successes = _with_ids(successes, "successes")
    failures = _with_ids(failures, "failures")
    if not successes:
        logger.debug("cfgm tips for %r: no success, no tips", task[:60])
        return []
    best = max(successes, key=lambda case: case.reward)  # the first among ties
    limit = config.trajectory_max_chars
    groups: list[tuple[list[str], list[str], str]] = []
    if failures:
        failure = failures[0]
        tips = _tip_call(llm, "tips_contrast", task, config.tips_contrast_max,
                         success=_cut(best.action, limit), failure=_cut(failure.action, limit))
        groups.append((tips, [best.id or "", failure.id or ""], "contrast"))
    tips = _tip_call(llm, "tips_success", task, config.tips_success_max, success=_cut(best.action, limit))
    groups.append((tips, [best.id or ""], "success"))
    key = task_key if task_key is not None else task
    out: list[Case] = []
    seen: set[str] = set()
    for tips, sources, source_kind in groups:
        for tip in tips:
            norm = _collapse(tip).lower()
            if norm in seen:
                continue
            seen.add(norm)
            out.append(make_item("tip", task, tip, system=SYSTEM, sources=sources, env=env, reward=0.0,
                                 task=key, source_kind=source_kind))
    if out:
        llm.count_items("tip", len(out))
    return out


# ---------------------------------------------------------------------- key-information reflection


@runtime_checkable
class AnomalyDetector(Protocol):
    """Whether an observation is anomalous (an error, a refusal): any callable ``observation -> bool``."""

    def __call__(self, observation: str) -> bool: ...


_APOSTROPHE = "['\u2019]"

DEFAULT_ANOMALY_PATTERNS: tuple[str, ...] = (
    r"nothing happens",
    rf"you can{_APOSTROPHE}t",
    r"you cannot",
    rf"i don{_APOSTROPHE}t understand",
    rf"that{_APOSTROPHE}s not a verb",
    r"not something you can",
    r"is closed",
    r"is locked",
    r"you need",
    r"there is no",
    rf"you don{_APOSTROPHE}t see",
    rf"you aren{_APOSTROPHE}t",
    r"invalid action",
    rf"i didn{_APOSTROPHE}t understand",
    rf"that doesn{_APOSTROPHE}t",
    r"not admissible",
)
"""Case-insensitive regexes of TextWorld / ALFWorld refusal messages (either apostrophe)."""


class PatternDetector:
    """An :class:`AnomalyDetector` that fires when any of ``patterns`` (case-insensitive regexes) matches."""

    def __init__(self, patterns: Sequence[str] = DEFAULT_ANOMALY_PATTERNS):
        if isinstance(patterns, str):
            raise ConfigError("PatternDetector: patterns must be a list of regexes, not one string")
        compiled = []
        for pattern in patterns:
            if not isinstance(pattern, str) or not pattern:
                raise ConfigError(f"PatternDetector: a pattern must be a non-empty string, got {pattern!r}")
            try:
                compiled.append(re.compile(pattern, re.IGNORECASE))
            except re.error as error:
                raise ConfigError(f"PatternDetector: bad regex {pattern!r} ({error})") from None
        self.patterns = tuple(patterns)
        self._compiled = tuple(compiled)

    def __call__(self, observation: str) -> bool:
        if not isinstance(observation, str) or not observation.strip():
            return False
        return any(regex.search(observation) for regex in self._compiled)

    def __repr__(self) -> str:
        return f"PatternDetector({len(self.patterns)} patterns)"


@dataclasses.dataclass(frozen=True)
class KeyFacts:
    """What a reflection is asked about (the ``reflect`` template's fields)."""

    goal: str
    progress: str
    attempted: tuple[str, ...]
    error: str
    candidates: tuple[str, ...]

    def to_fields(self) -> dict[str, str]:
        """The ``reflect`` template's fields, as strings (an empty list or text reads ``"none"``)."""
        return {"goal": self.goal or "none", "progress": self.progress or "none",
                "attempted": ", ".join(self.attempted) or "none", "error": self.error or "none",
                "candidates": ", ".join(self.candidates) or "none"}


def _history(history: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    out = []
    for i, pair in enumerate(history):
        if isinstance(pair, str) or not isinstance(pair, Sequence) or len(pair) != 2:
            raise DataFormatError(f"cfgm reflection: history[{i}] must be a (command, observation) pair, "
                                  f"got {pair!r:.80}")
        command, observation = pair
        out.append((_collapse(str(command)), str(observation)))
    return out


def key_facts(goal: str, history: Sequence[tuple[str, str]], candidates: Sequence[str], *,
              score: float | None = None, max_items: int = 8) -> KeyFacts:
    """The key facts of a step (see the module docstring): ``history`` is the (command, observation) pairs so far,
    most recent last; ``attempted`` the last ``max_items`` distinct commands (oldest first); ``candidates`` the
    first ``max_items`` candidate commands not attempted yet."""
    if isinstance(max_items, bool) or not isinstance(max_items, int) or max_items < 1:
        raise ConfigError(f"key_facts: max_items={max_items!r}: must be an integer >= 1")
    pairs = _history(history)
    progress = f"{len(pairs)} steps taken" + (f", score {score:g}" if score is not None else "")
    recent: list[str] = []
    tried: set[str] = set()
    for command, _ in reversed(pairs):
        norm = command.lower()
        if not norm or norm in tried:
            continue
        tried.add(norm)
        if len(recent) < max_items:
            recent.append(command)
    error = _cut(_collapse(pairs[-1][1]), ERROR_MAX_CHARS) if pairs else ""
    open_: list[str] = []
    for candidate in candidates:
        command = _collapse(str(candidate))
        norm = command.lower()
        if not norm or norm in tried:
            continue
        tried.add(norm)  # also drops repeated candidates
        open_.append(command)
        if len(open_) >= max_items:
            break
    return KeyFacts(goal=_collapse(str(goal)), progress=progress, attempted=tuple(reversed(recent)), error=error,
                    candidates=tuple(open_))


def _fallback(facts: KeyFacts, last_command: str | None) -> str:
    error = facts.error.rstrip(" .!") or "no result"
    text = f"The last action ({last_command or 'none'}) failed: {error}."
    if facts.candidates:
        return f"{text} Try another action, e.g. {facts.candidates[0]}."
    return f"{text} Try another action."


def _correction(reply: Any) -> str | None:
    if not isinstance(reply, str):
        return None
    for line in reply.splitlines():
        line = _collapse(line).strip("\"'`")
        if line and any(ch.isalpha() for ch in line):
            return line
    return None


def _reflect(llm: Any, facts: KeyFacts, last_command: str | None, config: CFGMConfig, what: str) -> str:
    reply = llm.ask("reflect", **facts.to_fields())
    text = _correction(reply)
    if text is None:
        logger.warning("cfgm %s: no correction in the reply %r; using the key facts", what, str(reply)[:80])
        text = _fallback(facts, last_command)
    llm.count_items("reflection", 1)
    return _cut(text, config.reflect_max_chars)


class KeyInfoReflection:
    """Key-information reflection at anomalous steps (see the module docstring).

    ``fired`` counts the steps the detector fired on, ``calls`` the reflections asked of the LLM."""

    def __init__(self, llm: Any, detector: AnomalyDetector | None = None, config: CFGMConfig | None = None):
        if detector is not None and not callable(detector):
            raise ConfigError(f"KeyInfoReflection: detector must be callable, got {type(detector).__name__}")
        self.llm = llm
        self.detector = detector if detector is not None else PatternDetector()
        self.config = _config(config)
        self.fired = 0
        self.calls = 0

    def reflect(self, goal: str, history: Sequence[tuple[str, str]], candidates: Sequence[str], *,
                score: float | None = None) -> str | None:
        """A correction when the latest observation of ``history`` is anomalous; ``None`` (no call) otherwise."""
        pairs = _history(history)
        if not pairs or not bool(self.detector(pairs[-1][1])):
            return None
        self.fired += 1
        facts = key_facts(goal, pairs, candidates, score=score)
        self.calls += 1
        return _reflect(self.llm, facts, pairs[-1][0], self.config, "reflection")


def retry_reflection(llm: Any, goal: str, history: Sequence[tuple[str, str]], candidates: Sequence[str],
                     config: CFGMConfig | None = None) -> str:
    """The reflection on a failed training attempt (always asked; the same fallback as
    :meth:`KeyInfoReflection.reflect`)."""
    config = _config(config)
    pairs = _history(history)
    facts = key_facts(goal, pairs, candidates)
    return _reflect(llm, facts, pairs[-1][0] if pairs else None, config, "retry reflection")
