"""The memory builders' LLM calls: replaceable templates, a reply cache, call accounting, tolerant parsing.

Every builder (focus points, tips, reflections, clusters, skills, PlugMem's structuring, knowledge, abstract queries
and notes) asks the run's frozen planner through the planner protocol only: a template is filled, sent as the
question of a :class:`memento.types.Task` with no cases (``planner.plan(task, [])``), and the reply text comes back.
So Gemma 3 270M, any transformers model or any OpenAI-compatible server can build memory. A base model answering a
few-shot prompt stops at the end of the line (``"\\n"``), so every template asks for its answer on one line, with
items separated by ``;``.

**Templates** (:class:`BuilderTemplates`) are ``str.format`` strings with named fields; replace any of them with
a JSON file (``BuilderTemplates.from_json``: an object of template name -> string; a name that is not a template
or a template that uses a field its builder does not give is a :class:`~memento.errors.ConfigError`).

**Cache.** :class:`MemoryLLM` keeps every reply in a JSON-lines file (``cache_path``: one
``{"key", "template", "reply"}`` object a line, appended and flushed per call) keyed by the sha256 of the
planner's name and the filled prompt, so a resumed run, or a second run over the same trajectories, does not pay
for a call twice. A torn last line (a crash mid-write) is ignored on load; any other malformed line names the
file and line. The planner must be deterministic (greedy) for the cache to be exact.

**Accounting.** :meth:`MemoryLLM.stats` gives calls made, replies served from the cache, the wall time spent in
the planner, and the same per template (this process), and ``run_calls`` / ``run_wall_s``: every call the run
directory's cache file records, earlier processes of a resumed run included (each row keeps its seconds);
builders add the number of items each call produced, so ``calls / items`` and ``seconds / item`` are reported
per item kind.

**Parsing.** :func:`parse_items` reads a list from a reply written as ``a; b; c``, one item a line, numbered
(``1. a 2) b``) or bulleted (``- a``, ``* a``); it strips quotes and trailing punctuation, drops empty and
duplicate items, and keeps at most ``max_items``. A reply with no item raises
:class:`~memento.errors.ReplyFormatError`; each builder documents its fallback.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import re
import string
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from memento.errors import ConfigError, DataFormatError, ReplyFormatError
from memento.io import parse_json, read_json
from memento.types import Task, shown

__all__ = ["BuilderTemplates", "MemoryLLM", "collapse", "cut", "parse_choice", "parse_items", "TEMPLATE_FIELDS"]

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class BuilderTemplates:
    """The prompt of every builder call (``str.format`` with the fields in :data:`TEMPLATE_FIELDS`)."""

    focus: str = ("Environment: {env}. {description}\nExamples of play:\n{examples}\n"
                  "Write at most {max_items} short guidance points for playing this environment: what to look at, "
                  "the command syntax, common risks. Answer on one line, points separated by ';'.")
    tips_contrast: str = ("Task: {task}\nA successful attempt:\n{success}\nA failed attempt:\n{failure}\n"
                          "Compare them. Write at most {max_items} short tips that explain why the first succeeded "
                          "and the second failed. Answer on one line, tips separated by ';'.")
    tips_success: str = ("Task: {task}\nA successful attempt:\n{success}\n"
                         "Write at most {max_items} short tips a player should follow to succeed again. "
                         "Answer on one line, tips separated by ';'.")
    reflect: str = ("Goal: {goal}\nProgress: {progress}\nAttempted actions: {attempted}\nLatest error: {error}\n"
                    "Open candidates: {candidates}\nQuestion: what went wrong and what should be done next? "
                    "Answer in one short sentence.")
    cluster_init: str = ("Trajectories:\n{trajectories}\nGroup these trajectories by the workflow they follow (not by "
                         "topic). Answer on one line as groups separated by ';', each 'numbers: description', "
                         "for example '1,3: pick up then open; 2: walk east'.")
    cluster_assign: str = ("New trajectory:\n{trajectory}\nExisting workflow clusters:\n{clusters}\n"
                           "Does the new trajectory follow one of these workflows? Answer with the cluster number "
                           "(ADD n) or NEW.")
    cluster_describe: str = ("Trajectories of one workflow:\n{trajectories}\nDescribe their shared workflow in one "
                             "short sentence.")
    cluster_split: str = ("Trajectories of one large workflow cluster:\n{trajectories}\nSplit them into {min_parts} "
                          "to {max_parts} sub-workflows. Answer on one line as groups separated by ';', each "
                          "'numbers: description'.")
    skills: str = ("Workflow: {description}\nTrajectories:\n{trajectories}\nWrite {min_items} to {max_items} rules "
                   "for this workflow (constraints, dependencies, execution principles). Answer on one line, rules "
                   "separated by ';'.")
    plug_structure: str = ("Task: {task}\nEarlier actions: {history}\nObservation: {observation}\nAction: {action}\n"
                           "Outcome of the whole attempt: {outcome}\nInfer the state after this action, the subgoal "
                           "it serves and its reward (a number from 0 to 1). Answer on one line as "
                           "'state | subgoal | reward'.")
    plug_facts: str = ("Task: {task}\nSubgoal: {subgoal}\nSteps:\n{steps}\nWrite at most {max_items} atomic facts "
                       "these steps show, each followed by its concepts in brackets, for example 'Lima is the "
                       "capital of Peru [capital cities, Peru]'. Answer on one line, facts separated by ';'.")
    plug_procedure: str = ("Task: {task}\nSubgoal: {subgoal}\nSteps:\n{steps}\nOutcome: {outcome}\nWhat intent do "
                           "these steps serve, and how should it be achieved? Answer on one line as "
                           "'intent => prescription'.")
    plug_abstract: str = ("Query: {query}\nRelated memory: {hints}\nWrite at most {max_items} abstract queries for "
                          "this query: the general concepts it is about or the intents it serves. Answer on one "
                          "line, separated by ';'.")
    plug_compress: str = ("Task: {query}\nRetrieved memory:\n{memory}\nCompress the memory into one short note of "
                          "at most {max_tokens} words that keeps only what helps this task. Answer on one line.")

    def __post_init__(self) -> None:
        for name, allowed in TEMPLATE_FIELDS.items():
            template = getattr(self, name)
            if not isinstance(template, str) or not template.strip():
                raise ConfigError(f"BuilderTemplates.{name} must be a non-empty string")
            try:
                template.encode("utf-8")
            except UnicodeEncodeError as error:
                raise ConfigError(f"BuilderTemplates.{name}: holds a lone surrogate "
                                  f"({template[error.start]!r}), which is not text") from None
            try:
                parsed = list(string.Formatter().parse(template))
            except ValueError as error:
                raise ConfigError(f"BuilderTemplates.{name}: not a format string ({error})") from None
            used = {field for _, field, _, _ in parsed if field is not None}
            for _, field, spec, conversion in parsed:
                if field is not None and (spec or conversion):  # '{task:999999999}' would allocate a GB
                    raise ConfigError(f"BuilderTemplates.{name}: write fields as {{name}}, without a conversion "
                                      f"or format spec (field {shown(field, 40)})")
            unknown = sorted(used - set(allowed))
            if unknown:
                raise ConfigError(f"BuilderTemplates.{name} uses field(s) {unknown}; it may use {sorted(allowed)}")

    def to_json(self) -> dict[str, str]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any] | str | Path) -> BuilderTemplates:
        """Templates from a dict or a JSON file; missing names keep their defaults."""
        source = None
        if isinstance(data, (str, Path)):
            source = Path(data)
            if not source.exists():
                raise ConfigError(f"{source}: no such templates file")
            data = read_json(source, error=ConfigError, what="JSON templates file", encoding="utf-8-sig")
        where = source or "templates"
        if not isinstance(data, dict):
            raise ConfigError(f"{where}: expected an object of template name -> string, got {type(data).__name__}")
        unknown = sorted(set(data) - set(TEMPLATE_FIELDS))
        if unknown:
            names = [shown(name, 40) for name in unknown[:5]] + (["..."] if len(unknown) > 5 else [])
            raise ConfigError(f"{where}: unknown template(s) [{', '.join(names)}]; known: {sorted(TEMPLATE_FIELDS)}")
        for name, value in data.items():
            if not isinstance(value, str):
                raise ConfigError(f"{where}: template {name!r} must be a string, got {type(value).__name__}")
        try:
            return cls(**data)
        except ConfigError as error:
            if source is None:
                raise
            raise ConfigError(f"{source}: {error}") from None


TEMPLATE_FIELDS: dict[str, tuple[str, ...]] = {
    "focus": ("env", "description", "examples", "max_items"),
    "tips_contrast": ("task", "success", "failure", "max_items"),
    "tips_success": ("task", "success", "max_items"),
    "reflect": ("goal", "progress", "attempted", "error", "candidates"),
    "cluster_init": ("trajectories",),
    "cluster_assign": ("trajectory", "clusters"),
    "cluster_describe": ("trajectories",),
    "cluster_split": ("trajectories", "min_parts", "max_parts"),
    "skills": ("description", "trajectories", "min_items", "max_items"),
    "plug_structure": ("task", "history", "observation", "action", "outcome"),
    "plug_facts": ("task", "subgoal", "steps", "max_items"),
    "plug_procedure": ("task", "subgoal", "steps", "outcome"),
    "plug_abstract": ("query", "hints", "max_items"),
    "plug_compress": ("query", "memory", "max_tokens"),
}
"""The fields each template may use."""


class MemoryLLM:
    """The builders' access to a frozen planner (see the module docstring)."""

    def __init__(self, planner: Any, *, templates: BuilderTemplates | None = None,
                 cache_path: str | Path | None = None, name: str | None = None):
        if not hasattr(planner, "plan"):
            raise ConfigError(f"MemoryLLM: {type(planner).__name__} has no plan(task, cases) method")
        self.planner = planner
        self.templates = templates if templates is not None else BuilderTemplates()
        self.name = name if name is not None else str(getattr(planner, "name", None) or type(planner).__name__)
        self.cache_path = None if cache_path is None else Path(cache_path)
        self._cache: dict[str, str] = {}
        self.calls: dict[str, int] = defaultdict(int)
        self.cached: dict[str, int] = defaultdict(int)
        self.wall_s: dict[str, float] = defaultdict(float)
        self.items: dict[str, int] = defaultdict(int)
        self.paid_before = 0  # calls paid by earlier processes of this run (rows of the cache file)
        self.paid_before_s = 0.0  # their seconds (rows that record them)
        if self.cache_path is not None and self.cache_path.exists():
            self._load()

    def _load(self) -> None:
        path = self.cache_path
        assert path is not None
        lines = path.read_bytes().split(b"\n")
        for number, raw in enumerate(lines, start=1):
            if not raw.strip():
                continue
            try:
                row = parse_json(raw, where="row", error=DataFormatError)
                key, reply = row["key"], row["reply"]
                if not isinstance(key, str) or not isinstance(reply, str):
                    raise TypeError("key and reply must be strings")
            except (ValueError, KeyError, TypeError) as error:  # DataFormatError is a ValueError
                if number == len(lines):  # a torn last line (no newline after it): the crash it survived
                    logger.warning("%s:%d: ignoring a torn last line", path, number)
                    break
                raise DataFormatError(f"not a reply-cache row ({error})", path=path, line=number) from None
            self._cache[key] = reply
            self.paid_before += 1
            seconds = row.get("wall_s")
            if isinstance(seconds, (int, float)) and not isinstance(seconds, bool):
                self.paid_before_s += float(seconds)

    def key(self, prompt: str) -> str:
        return hashlib.sha256(f"{self.name}\n{prompt}".encode()).hexdigest()

    def render(self, template: str, **fields: Any) -> str:
        """The filled prompt of ``template`` (a field it needs that is not given: ConfigError)."""
        text = getattr(self.templates, template, None)
        if template not in TEMPLATE_FIELDS or text is None:
            raise ConfigError(f"unknown builder template {template!r}; known: {sorted(TEMPLATE_FIELDS)}")
        try:
            return text.format(**fields)
        except KeyError as error:
            raise ConfigError(f"builder template {template!r} needs field {error.args[0]!r}") from None

    def ask(self, template: str, **fields: Any) -> str:
        """The planner's reply to the filled ``template`` (from the cache when this prompt was asked before)."""
        prompt = self.render(template, **fields)
        key = self.key(prompt)
        if key in self._cache:
            self.cached[template] += 1
            return self._cache[key]
        start = time.perf_counter()
        task = Task(id=f"memory:{template}", question=prompt, answers=("-",))
        out = self.planner.plan(task, [])
        reply = str(getattr(out, "text", out))
        self.wall_s[template] += time.perf_counter() - start
        self.calls[template] += 1
        self._cache[key] = reply
        if self.cache_path is not None:
            self.cache_path.parent.mkdir(parents=True, exist_ok=True)
            with self.cache_path.open("a", encoding="utf-8") as handle:
                handle.write(json.dumps({"key": key, "template": template, "reply": reply,
                                         "wall_s": round(time.perf_counter() - start, 4)}) + "\n")
                handle.flush()
        logger.debug("memory llm %s: %d chars of prompt -> %r", template, len(prompt), reply[:120])
        return reply

    def count_items(self, kind: str, n: int) -> None:
        """Record that ``n`` items of ``kind`` were built (for calls and seconds per item)."""
        self.items[kind] += int(n)

    def stats(self) -> dict[str, Any]:
        """Calls, cache hits, wall seconds (in total and per template) and items built per kind."""
        calls = sum(self.calls.values())
        items = sum(self.items.values())
        wall = sum(self.wall_s.values())
        return {
            "calls": calls, "cached": sum(self.cached.values()), "wall_s": round(wall, 3), "items": items,
            "run_calls": self.paid_before + calls, "run_wall_s": round(self.paid_before_s + wall, 3),
            "calls_per_item": round(calls / items, 3) if items else None,
            "s_per_item": round(wall / items, 3) if items else None,
            "by_template": {name: {"calls": self.calls.get(name, 0), "cached": self.cached.get(name, 0),
                                   "wall_s": round(self.wall_s.get(name, 0.0), 3)}
                            for name in sorted(set(self.calls) | set(self.cached))},
            "items_by_kind": dict(sorted(self.items.items())),
        }


def collapse(text: str) -> str:
    """``text`` with every run of whitespace one space, ends stripped."""
    return " ".join(str(text).split())


def cut(text: str, limit: int) -> str:
    """``text`` cut to its first ``limit`` characters (trailing whitespace of the cut dropped)."""
    return text if len(text) <= limit else text[:limit].rstrip()


_NUMBERED = re.compile(r"(?:^|\s)(?:\d{1,2}[.)]|[-*\u2022])\s+")


def parse_items(text: str, max_items: int, *, what: str = "items") -> list[str]:
    """The list items of a reply (see the module docstring); none: :class:`ReplyFormatError`."""
    if not isinstance(text, str):
        raise ReplyFormatError(f"{what}: the reply is not text ({type(text).__name__})")
    pieces: list[str] = []
    for line in text.replace("|", ";").splitlines():
        for part in line.split(";"):
            pieces.extend(_NUMBERED.split(" " + part))
    out: list[str] = []
    seen: set[str] = set()
    for piece in pieces:
        item = " ".join(piece.split()).strip(" \"'`").rstrip(",.").strip()
        if len(item) < 3 or not any(ch.isalpha() for ch in item):
            continue
        norm = item.lower()
        if norm in seen:
            continue
        seen.add(norm)
        out.append(item)
        if len(out) >= max_items:
            break
    if not out:
        raise ReplyFormatError(f"{what}: no item in the reply {text[:80]!r}")
    return out


_ADD = re.compile(r"\bADD\b\D{0,12}(\d+)", re.IGNORECASE)
_NEW = re.compile(r"\bNEW\b", re.IGNORECASE)
_NUMBER = re.compile(r"\b(\d+)\b")


def parse_choice(text: str, n_options: int) -> int | None:
    """An ``ADD n`` / ``NEW`` decision: the 0-based option ``n - 1``, or ``None`` for NEW.

    ``ADD n`` wins over ``NEW`` when both appear; a bare number in range counts as ``ADD``; anything else (no
    decision, a number out of range) raises :class:`ReplyFormatError`."""
    text = text if isinstance(text, str) else ""
    match = _ADD.search(text)
    if match is None and not _NEW.search(text):
        match = _NUMBER.search(text)
    if match is not None:
        number = int(match.group(1))
        if 1 <= number <= n_options:
            return number - 1
        raise ReplyFormatError(f"cluster decision: option {number} is not one of 1..{n_options} in {text[:80]!r}")
    if _NEW.search(text):
        return None
    raise ReplyFormatError(f"cluster decision: neither 'ADD n' nor 'NEW' in {text[:80]!r}")
