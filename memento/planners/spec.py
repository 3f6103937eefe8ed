"""Planner specs: the ``--planner`` values of the CLI (``gemma``, ``hf:PATH`` for a local directory,
``hf://ORG/NAME[@REV]`` for a Hugging Face Hub id, ``openai:MODEL@URL``).

A Hub id is always explicit (:mod:`memento.hub`): ``hf:org/name`` is the local path ``org/name``, refused when
it does not exist; ``hf:hf://org/name`` is read as ``hf://org/name``.

:func:`parse_planner_spec` turns a string into a :class:`PlannerSpec` (a bad one is a one-line
``ConfigError``), :func:`check_planner_spec` makes the cheap checks before anything loads, and
:func:`build_planner` builds the planner (its module, and its heavy imports, only then).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Literal

from memento.errors import ConfigError
from memento.hub import HUB_PREFIX, local_or_hub
from memento.planners.base import Planner, PlannerError
from memento.planners.hf import HFPlanner
from memento.planners.openai_compat import OpenAICompatPlanner

__all__ = ["PlannerSpec", "build_planner", "check_planner_spec", "parse_planner_spec"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlannerSpec:
    """A parsed ``--planner`` value: ``gemma``, ``hf:PATH``, ``hf://ORG/NAME[@REV]`` (``path`` keeps the
    ``hf://`` prefix) or ``openai:MODEL@URL``."""

    kind: Literal["gemma", "hf", "openai"]
    path: str | None = None
    model: str | None = None
    base_url: str | None = None

    def __str__(self) -> str:
        match self.kind:
            case "gemma":
                return "gemma"
            case "hf":
                return str(self.path) if str(self.path).startswith(HUB_PREFIX) else f"hf:{self.path}"
            case _:
                return f"openai:{self.model}@{self.base_url}"


_SPEC_HELP = "expected gemma, hf:PATH, hf://ORG/NAME or openai:MODEL@URL"


def parse_planner_spec(spec: str) -> PlannerSpec:
    """Parse ``gemma`` | ``hf:PATH`` | ``hf://ORG/NAME[@REV]`` | ``openai:MODEL@URL``; a bad spec raises
    ``ConfigError`` (one line)."""
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"planner spec {spec!r}: empty; {_SPEC_HELP}")
    spec = spec.strip()
    if spec == "gemma":
        return PlannerSpec(kind="gemma")
    kind, sep, rest = spec.partition(":")
    if not sep:
        raise ConfigError(f"planner spec {spec!r}: unknown planner; {_SPEC_HELP}")
    if kind == "hf":
        if not rest.strip() or rest.strip() == "//":
            raise ConfigError(f"planner spec {spec!r}: hf: needs a model directory or Hub id (hf:PATH, "
                              f"{HUB_PREFIX}ORG/NAME)")
        return PlannerSpec(kind="hf", path=spec if spec.startswith(HUB_PREFIX) else rest)
    if kind == "openai":
        model, at, url = rest.rpartition("@")
        if not at or not model.strip() or not url.strip():
            raise ConfigError(f"planner spec {spec!r}: openai: needs a model and a server URL (openai:MODEL@URL)")
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"planner spec {spec!r}: the server URL {url!r} must start with http:// or https://")
        return PlannerSpec(kind="openai", model=model, base_url=url)
    raise ConfigError(f"planner spec {spec!r}: unknown planner {kind!r}; {_SPEC_HELP}")


def check_planner_spec(spec: PlannerSpec) -> None:
    """Cheap checks before anything is loaded: an ``hf:`` model is an existing directory or an explicit Hub id
    (``hf://org/name``); a missing directory is a one-line :class:`PlannerError`, never a Hub lookup."""
    if spec.kind == "hf":
        where = local_or_hub(str(spec.path), what=f"planner {spec}: model", error=PlannerError)
        if isinstance(where, Path) and not where.is_dir():
            raise PlannerError(f"planner {spec}: {spec.path!r} is not a transformers causal-LM directory")


def build_planner(spec: PlannerSpec, **kwargs: Any) -> Planner:
    """The planner a spec names (its module is imported only here); ``kwargs`` go to its constructor."""
    check_planner_spec(spec)
    match spec.kind:
        case "gemma":
            return HFPlanner.default(**kwargs)
        case "hf":
            hub = str(spec.path).startswith(HUB_PREFIX)  # a Hub id is no path to expand
            return HFPlanner(str(spec.path) if hub else str(Path(str(spec.path)).expanduser()), **kwargs)
        case "openai":
            return OpenAICompatPlanner(str(spec.model), str(spec.base_url), **kwargs)
    raise ConfigError(f"planner spec {spec}: unknown kind")  # pragma: no cover
