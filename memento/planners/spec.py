r"""Planner specs: the ``--planner`` values of the CLI (``gemma``, ``hf:PATH`` for a local directory,
``hf://ORG/NAME[@REV]`` for a Hugging Face Hub id, ``openai:MODEL@URL[?KEY=VALUE&...]``).

A Hub id is always explicit (:mod:`memento.hub`): ``hf:org/name`` is the local path ``org/name``, refused when
it does not exist; ``hf:hf://org/name`` is read as ``hf://org/name``.

An ``openai:`` spec may end in a query string of planner options (the keys of :data:`OPENAI_OPTIONS`), e.g.
``openai:gemma@http://127.0.0.1:8080/v1?mode=completions&max_tokens=32&stop=%0A&api_key_env=MY_KEY``:

- ``mode``: ``chat`` (the default: ``/chat/completions``; the server applies the model's chat template) or
  ``completions`` (``/completions`` with the rendered prompt: what a base model without a chat template needs);
- ``max_tokens`` (1..1048576), ``temperature`` (>= 0), ``top_p`` (in (0, 1]), ``seed`` (an integer),
  ``timeout_s`` (> 0, the deadline of a generation attempt, 30 s by default), ``score_timeout_s`` (> 0, the
  deadline of a scoring attempt; by default 30 s plus 1 s per prompt character queued), ``max_retries``
  (0..100), ``concurrency`` (1..256): as in :class:`~memento.planners.openai_compat.OpenAICompatConfig`;
- ``stop``: a stop string, repeatable (``stop=a&stop=b``); ``stop=`` alone sends none; without it, the prompt
  style's stop strings;
- ``api_key_env``: the environment variable holding the API key (default ``OPENAI_API_KEY``); ``none`` never
  sends a key. The key itself never goes into a spec.

Values are percent-decoded (``%0A`` is a newline, ``%26`` an ``&``); in ``stop`` the escapes ``\n``, ``\t`` and
``\\`` also read as a newline, a tab and a backslash. An unknown or repeated key, a value out of range, or a spec
of more than :data:`MAX_SPEC_CHARS` characters is a one-line ``ConfigError`` naming the key and the (shortened)
value. ``str(spec)`` writes the options back, so they are saved with a run's config.

The mode is never guessed (there is no ``mode=auto``): OpenAI-compatible servers do not say whether a model has a
chat template. llama-cpp-python's server (0.3.36) answers ``/v1/models`` with ``id``, ``object``, ``owned_by`` and
``permissions`` only, has no ``/props`` (llama.cpp's own ``llama-server`` does), and none of its endpoints
(``/v1/completions``, ``/v1/chat/completions``, ``/v1/embeddings``, ``/v1/models``, ``/extras/tokenize``,
``/extras/tokenize/count``, ``/extras/detokenize``) exposes the GGUF's ``tokenizer.chat_template``; serving a
base model without one, its ``/chat/completions`` falls back to a llama-2 ``[INST]`` format and the bundled Gemma
answers ``""`` (``--chat_format gemma`` makes it echo the question). So a base model needs ``mode=completions``,
and the planner's first empty answer in chat mode logs one warning saying so (whatever the server).

:func:`parse_planner_spec` turns a string into a :class:`PlannerSpec` (a bad one is a one-line
``ConfigError``), :func:`check_planner_spec` makes the cheap checks before anything loads, and
:func:`build_planner` builds the planner (its module, and its heavy imports, only then).
"""

from __future__ import annotations

import dataclasses
import re
import urllib.parse
from pathlib import Path
from typing import Any, Literal

from memento.errors import ConfigError
from memento.hub import HUB_PREFIX, local_or_hub
from memento.io import shorten
from memento.planners.base import Planner, PlannerError
from memento.planners.hf import HFPlanner
from memento.planners.openai_compat import OpenAICompatConfig, OpenAICompatPlanner

__all__ = ["MAX_SPEC_CHARS", "OPENAI_OPTIONS", "PlannerSpec", "build_planner", "check_planner_spec",
           "parse_planner_spec"]

MAX_SPEC_CHARS = 4096
"""The longest ``--planner`` value read."""

OPENAI_OPTIONS = ("mode", "max_tokens", "temperature", "stop", "api_key_env", "timeout_s", "score_timeout_s",
                  "max_retries", "concurrency", "top_p", "seed")
"""The keys an ``openai:MODEL@URL?...`` query string may set (each once, but ``stop`` repeats)."""

_INTS = {"max_tokens", "max_retries", "concurrency", "seed"}
_FLOATS = {"temperature", "timeout_s", "score_timeout_s", "top_p"}
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NUMBER_CHARS = 40  # a number written with more characters than this is refused before it is converted
_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\"}

Options = tuple[tuple[str, Any], ...]


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlannerSpec:
    """A parsed ``--planner`` value: ``gemma``, ``hf:PATH``, ``hf://ORG/NAME[@REV]`` (``path`` keeps the
    ``hf://`` prefix) or ``openai:MODEL@URL`` with its query-string ``options`` (``(key, value)`` pairs, the
    keyword arguments of :class:`~memento.planners.openai_compat.OpenAICompatPlanner`; ``stop`` a tuple)."""

    kind: Literal["gemma", "hf", "openai"]
    path: str | None = None
    model: str | None = None
    base_url: str | None = None
    options: Options = ()

    def __str__(self) -> str:
        match self.kind:
            case "gemma":
                return "gemma"
            case "hf":
                return str(self.path) if str(self.path).startswith(HUB_PREFIX) else f"hf:{self.path}"
            case _:
                query = _query(self.options)
                return f"openai:{self.model}@{self.base_url}" + (f"?{query}" if query else "")


_SPEC_HELP = "expected gemma, hf:PATH, hf://ORG/NAME or openai:MODEL@URL[?KEY=VALUE&...]"
_URL = re.compile(r"(?P<model>.+?)@(?P<url>https?://[^?]*)(?:\?(?P<query>.*))?", re.DOTALL)


def _query(options: Options) -> str:
    """The query string of ``options`` (values percent-encoded; ``stop=`` alone for no stop strings)."""
    items: list[str] = []
    for key, value in options:
        if key == "stop":
            stops = [urllib.parse.quote(stop.replace("\\", "\\\\"), safe="") for stop in value]
            items += [f"stop={stop}" for stop in stops] or ["stop="]
        elif key == "api_key_env":
            items.append(f"api_key_env={'none' if value is None else value}")
        else:
            items.append(f"{key}={urllib.parse.quote(str(value), safe='.+-')}")
    return "&".join(items)


def _unescape(text: str, where: str) -> str:
    r"""``\n``, ``\t`` and ``\\`` in a stop string as a newline, a tab and a backslash."""
    out: list[str] = []
    chars = iter(text)
    for char in chars:
        if char != "\\":
            out.append(char)
            continue
        following = next(chars, "")
        if following not in _ESCAPES:
            raise ConfigError(f"{where}: stop={shorten(text)}: unknown escape \\{following} (\\n, \\t or \\\\; "
                              "or percent-encode it)")
        out.append(_ESCAPES[following])
    return "".join(out)


def _option(key: str, raw: str, where: str) -> Any:
    """The value of one query-string option, converted (its bounds are :class:`OpenAICompatConfig`'s)."""
    if key == "mode":
        if raw not in ("chat", "completions"):
            raise ConfigError(f"{where}: mode={shorten(raw)}: expected chat or completions")
        return raw
    if key == "api_key_env":
        if raw.lower() == "none":
            return None
        if not _ENV_NAME.fullmatch(raw):
            raise ConfigError(f"{where}: api_key_env={shorten(raw)}: expected an environment variable name "
                              "(letters, digits, _) or none")
        return raw
    if key in _INTS:
        if len(raw) > _NUMBER_CHARS or not re.fullmatch(r"[+-]?[0-9]+", raw):
            raise ConfigError(f"{where}: {key}={shorten(raw)}: expected an integer")
        return int(raw)
    if key in _FLOATS:
        try:
            if len(raw) > _NUMBER_CHARS:
                raise ValueError
            return float(raw)
        except ValueError:
            raise ConfigError(f"{where}: {key}={shorten(raw)}: expected a number") from None
    raise AssertionError(key)  # pragma: no cover - every key of OPENAI_OPTIONS is handled


def _openai_options(query: str, where: str) -> Options:
    """The options of an ``openai:`` spec's query string, in the order given (``stop`` gathered at its first)."""
    options: dict[str, Any] = {}
    empty_stop = False
    for item in query.split("&"):
        key, eq, raw = item.partition("=")
        if not eq or not key:
            raise ConfigError(f"{where}: option {shorten(item)} is not KEY=VALUE (keys: {', '.join(OPENAI_OPTIONS)})")
        if key not in OPENAI_OPTIONS:
            raise ConfigError(f"{where}: unknown option {shorten(key)} (keys: {', '.join(OPENAI_OPTIONS)})")
        try:
            value = urllib.parse.unquote(raw, errors="strict")
        except UnicodeDecodeError:
            raise ConfigError(f"{where}: {key}={shorten(raw)}: the percent-encoded bytes are not UTF-8") from None
        if key == "stop":
            stops = options.setdefault("stop", [])
            if value:
                stops.append(_unescape(value, where))
            else:
                empty_stop = True
            if empty_stop and stops:
                raise ConfigError(f"{where}: an empty stop= (no stop strings) cannot go with other stop= options")
            continue
        if key in options:
            raise ConfigError(f"{where}: option {key} given twice")
        options[key] = _option(key, value, where)
    return tuple((key, tuple(value) if key == "stop" else value) for key, value in options.items())


def parse_planner_spec(spec: str) -> PlannerSpec:
    """Parse ``gemma`` | ``hf:PATH`` | ``hf://ORG/NAME[@REV]`` | ``openai:MODEL@URL[?KEY=VALUE&...]``; a bad spec
    raises ``ConfigError`` (one line, the spec shortened)."""
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"planner spec {shorten(spec)}: empty; {_SPEC_HELP}")
    if len(spec) > MAX_SPEC_CHARS:
        raise ConfigError(f"planner spec {shorten(spec)}: {len(spec)} characters, more than the {MAX_SPEC_CHARS} "
                          "a spec may hold")
    spec = spec.strip()
    where = f"planner spec {shorten(spec)}"
    if spec == "gemma":
        return PlannerSpec(kind="gemma")
    kind, sep, rest = spec.partition(":")
    if not sep:
        raise ConfigError(f"{where}: unknown planner; {_SPEC_HELP}")
    if kind == "hf":
        if not rest.strip() or rest.strip() == "//":
            raise ConfigError(f"{where}: hf: needs a model directory or Hub id (hf:PATH, {HUB_PREFIX}ORG/NAME)")
        return PlannerSpec(kind="hf", path=spec if spec.startswith(HUB_PREFIX) else rest)
    if kind == "openai":
        match = _URL.fullmatch(rest)
        if match is None:
            model, at, url = rest.rpartition("@")
            if not at or not model.strip() or not url.strip():
                raise ConfigError(f"{where}: openai: needs a model and a server URL (openai:MODEL@URL)")
            raise ConfigError(f"{where}: the server URL {shorten(url)} must start with http:// or https://")
        model, url, query = match["model"], match["url"], match["query"]
        if not model.strip() or url in ("http://", "https://"):
            raise ConfigError(f"{where}: openai: needs a model and a server URL (openai:MODEL@URL)")
        options = _openai_options(query, where) if query is not None else ()
        try:  # the bounds, now: a bad value is refused before anything runs
            OpenAICompatConfig(model=model, base_url=url, **dict(options))
        except ConfigError as error:
            raise ConfigError(f"{where}: {error}") from None
        return PlannerSpec(kind="openai", model=model, base_url=url, options=options)
    raise ConfigError(f"{where}: unknown planner {shorten(kind)}; {_SPEC_HELP}")


def check_planner_spec(spec: PlannerSpec) -> None:
    """Cheap checks before anything is loaded: an ``hf:`` model is an existing directory or an explicit Hub id
    (``hf://org/name``); a missing directory is a one-line :class:`PlannerError`, never a Hub lookup."""
    if spec.kind == "hf":
        where = local_or_hub(str(spec.path), what=f"planner {spec}: model", error=PlannerError)
        if isinstance(where, Path) and not where.is_dir():
            raise PlannerError(f"planner {spec}: {spec.path!r} is not a transformers causal-LM directory")


def build_planner(spec: PlannerSpec, **kwargs: Any) -> Planner:
    """The planner a spec names (its module is imported only here); ``kwargs`` go to its constructor (for an
    ``openai:`` spec, over the spec's options)."""
    check_planner_spec(spec)
    match spec.kind:
        case "gemma":
            return HFPlanner.default(**kwargs)
        case "hf":
            hub = str(spec.path).startswith(HUB_PREFIX)  # a Hub id is no path to expand
            return HFPlanner(str(spec.path) if hub else str(Path(str(spec.path)).expanduser()), **kwargs)
        case "openai":
            return OpenAICompatPlanner(str(spec.model), str(spec.base_url), **{**dict(spec.options), **kwargs})
    raise ConfigError(f"planner spec {spec}: unknown kind")  # pragma: no cover
