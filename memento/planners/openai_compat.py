"""A planner behind any OpenAI-compatible HTTP server (vLLM, Ollama, llama.cpp server, OpenAI).

``mode="chat"`` (the default) posts messages to ``<base_url>/chat/completions``, where the server
applies the model's chat template; a base model without one (e.g. the bundled Gemma 3 270M served by
llama-cpp-python) needs ``mode="completions"``, the rendered prompt posted to
``<base_url>/completions`` (on the CLI: ``--planner 'openai:MODEL@URL?mode=completions'``, see
:mod:`memento.planners.spec`). No server says whether a model has a chat template, so the mode is not guessed;
instead the first empty answer in chat mode logs one warning naming the fix (``?mode=completions``).

Requests go through one pooled ``httpx`` client per planner (keep-alive: calls reuse their
connections; up to ``concurrency`` of them), created at the first call and closed by :meth:`close`. Its
transport is a custom ``httpx.BaseTransport`` over an ``httpcore`` connection pool given a network backend that
enforces the deadline below (public APIs of both: httpx's custom transports, httpcore's ``network_backend``
parameter and ``NetworkBackend``/``NetworkStream`` interface; an environment proxy, ``http(s)_proxy`` /
``all_proxy`` less ``no_proxy``, is used as httpx would);
``httpx`` (or its successor ``httpx2``) comes with the extra ``memento-mdp[openai]`` and is imported
only when a planner is built. The API key is read from an environment variable at every call
(optional: local servers need none). ``seed``, ``top_p`` and ``extra_body`` (merged into the body last)
are sent when set. Connection errors, timeouts, HTTP 429 and 5xx are retried (by ``tenacity``, in the
same extra) with exponential backoff (``backoff_s * 2**i``, or the server's ``Retry-After`` -- seconds or
an HTTP date -- when longer, capped at 60 s); httpx's own ``retries`` covers connection failures only, so
it is not used; other 4xx
answers, a body that is not JSON, or one without ``choices`` raise :class:`PlannerError` at once.
Every error is one line naming the method, the URL and what went wrong, e.g.
``POST http://127.0.0.1:8000/v1/chat/completions: HTTP 500 after 4 attempts: <body excerpt>``
(``max_retries=3`` means up to 4 attempts).

The server is a network peer: its replies are input, checked before anything is used.

- **Time.** ``timeout_s`` is the deadline of a whole generation attempt (connecting, sending, the headers
  and the last byte of the body), not of one socket read: a server that drips a byte a second, headers or
  body, is cut off at ``timeout_s`` (every socket operation of the attempt waits at most what is left
  of it) and the attempt counts as timed out (retried). A scoring attempt's deadline is ``score_timeout_s``
  when set; by default it grows with the prompt, ``timeout_s + SCORE_S_PER_CHAR * chars`` (1 s per character),
  where ``chars`` counts the request's prompt and, when ``concurrency > 1``, the ``concurrency - 1`` longest other
  prompts of the same ``score_many`` call (a server that scores one request at a time makes each wait for those
  ahead of it): llama-cpp-python costs 0.6-1.7 s per echoed prompt token, so a label prompt of 150 characters
  takes 30-75 s, past a flat 30 s (:data:`SCORE_S_PER_CHAR`).
- **Size.** A reply body may hold at most :data:`MAX_REPLY_BYTES` (16 MiB) on the wire and once
  decompressed (``gzip``/``deflate``; other content codings are refused): a larger
  ``Content-Length`` is refused before reading, a longer body (or a gzip bomb) as soon as it passes
  the cap. Only the first 64 KiB of an error (non-2xx) body is read, for its excerpt.
- **Retried** (transient): no connection, a timeout, a connection dropped or an HTTP protocol error
  before the reply was complete (a body cut short of its ``Content-Length`` included), HTTP 429 and
  5xx. **Not retried** (one line, the server answered deliberately): other 4xx, a redirect (3xx:
  never followed, the message names its ``Location``; give the final URL), a 2xx whose
  ``Content-Type`` is present and not JSON, a complete 2xx body that is empty, not UTF-8, not JSON
  or not a JSON object, a JSON document nested deeper than 100 levels, holding an integer of more
  than 4300 digits, ``NaN``/``Infinity`` (or a float beyond range) or a lone surrogate, a 2xx
  carrying ``{"error": ...}`` instead of ``choices``, and any reply without what the call needs.
- **Nothing nonsensical is used.** ``plan()``: ``choices[0].message.content`` (chat; ``null`` is the
  empty answer) or ``choices[0].text`` (completions) must be a string without NUL characters and of
  at most ``64 * max_tokens`` characters (what ``max_tokens`` tokens can hold); ``usage``, when
  present and not ``null``, must be an object whose ``prompt_tokens``/``completion_tokens`` are
  absent, ``null`` or integers in [0, 2**31). ``score()``: every ``token_logprobs`` entry is
  ``null`` or a finite number <= 0 (a log-probability), the answer's are all numbers, ``tokens``
  are strings and ``text_offset`` non-negative and non-decreasing.

Error messages quote what the server sent as an excerpt of at most 200 characters on one line.

Scoring (``score()`` / ``score_many()``, the :class:`~memento.planners.base.ScoringPlanner`
protocol) asks the completions endpoint (``<base_url>/completions``, whatever ``mode`` is) for the
log-probabilities of the prompt itself, as vLLM offers: ``prompt`` is ``render_prompt(...) +
render_answer(...)`` (the completion-style prompt; a chat-mode planner's chat template is not
applied), with ``max_tokens: 1``, ``echo: true``, ``logprobs: 1`` and ``temperature: 0``. Never
``max_tokens: 0``: some servers (llama-cpp-python) read it as *no limit* and generate until the
context is full. The one generated token is counted out: the answer's tokens are the echoed prompt
tokens that hold any character of the continuation, counted back from the end of the prompt's
tokens (all but the generated ones, the echo's last ``usage.completion_tokens`` entries; without it,
``usage.prompt_tokens`` of them, else all but ``max_tokens``) with ``logprobs.text_offset``, so a server
whose offsets include a ``<bos>`` string still lines up, and so does one whose ``usage.prompt_tokens``
counts a ``<bos>`` its lists leave out (llama-cpp-python: counting with it took the generated token as
the answer's last). Their ``token_logprobs`` are summed. A server that gives no prompt
log-probabilities (no ``logprobs``, null ``token_logprobs``, no echo of the prompt, or no more
tokens than it generated) is one :class:`PlannerError` line naming the URL and saying so
(:data:`NO_PROMPT_LOGPROBS`); lists that do not line up are one line naming what is malformed.
"""

from __future__ import annotations

import copy
import dataclasses
import email.utils
import json
import logging
import os
import threading
import time
import zlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

from memento.config import check, check_choice, check_int
from memento.extras import install_hint
from memento.io import finite_float, parse_json, shorten
from memento.planners.base import (
    AnswerScore,
    PlannerError,
    PlanOutput,
    ScoreRequest,
    check_score,
    group_scores,
    score_requests,
)
from memento.planners.prompts import PromptConfig, render_answer, render_messages, render_prompt
from memento.types import Case, Task

__all__ = ["ApiMode", "OpenAICompatConfig", "OpenAICompatPlanner"]

logger = logging.getLogger(__name__)

ApiMode = Literal["chat", "completions"]

_EXCERPT_CHARS = 200
_MAX_BACKOFF_S = 60.0

MAX_REPLY_BYTES = 16 * 2 ** 20
"""The most bytes a reply body may hold, on the wire and decompressed (16 MiB)."""
MAX_TOKENS = 2 ** 20
"""The most tokens ``max_tokens`` may ask for (1048576)."""
MAX_TIMEOUT_S = 86400.0
"""The longest ``timeout_s`` (a day; a socket cannot wait for ever)."""
SCORE_S_PER_CHAR = 1.0
"""Seconds a scoring attempt may take per prompt character it waits for, beyond ``timeout_s``, when
``score_timeout_s`` is not set. Derived from llama-cpp-python 0.3.36 serving the bundled Gemma 3 270M on 2 cores,
the slowest server scoring was measured on: it sorts the 262k-token vocabulary in Python for every echoed prompt
token, 0.6-0.7 s per token (0.2 s per character) with the machine's load at 3 and up to 1.7 s per token (about
0.5 s per character) at 5-7; 1.0 is twice the worst. A fast server (vLLM) answers long before; a hung one is
cut off later."""
MAX_RETRIES = 100
"""The most retries ``max_retries`` may ask for."""
MAX_CONCURRENCY = 256
"""The most requests in flight (and pooled connections) ``concurrency`` may ask for."""
_ERROR_BODY_BYTES = 64 * 2 ** 10  # what is read of a non-2xx body, for its excerpt
NO_PROMPT_LOGPROBS = ("the server returns no prompt log-probabilities: it does not support echo=true with logprobs=1 "
                      "on /completions, which scoring needs (vLLM's /v1/completions does)")
"""What a scoring error says when a server gives no log-probabilities for the prompt's tokens."""
_CHARS_PER_TOKEN = 64  # an answer longer than this many characters per max_tokens is refused
_MAX_COUNT = 2 ** 31  # a usage token count must be below this


def _httpx() -> Any:
    """The ``httpx`` module (or ``httpx2``, its successor with the same API); a one-line error naming the extra."""
    try:
        import httpx
    except ImportError:
        try:
            import httpx2 as httpx
        except ImportError:
            raise PlannerError(f"OpenAICompatPlanner needs the httpx package: {install_hint('openai')}") from None
    return httpx


def _tenacity() -> Any:
    """The ``tenacity`` module (the retry loop); a one-line error naming the extra when it is missing."""
    try:
        import tenacity
    except ImportError:
        raise PlannerError(f"OpenAICompatPlanner needs the tenacity package: {install_hint('openai')}") from None
    return tenacity


def _retry_after(header: str | None) -> float | None:
    """A ``Retry-After`` header in seconds: a number of seconds or an HTTP date; ``None`` when absent or bad."""
    if header is None:
        return None
    try:
        seconds = float(header)
    except ValueError:
        pass
    else:
        return max(0.0, seconds) if seconds == seconds else None  # inf is capped by the caller; NaN is unreadable
    try:
        when = email.utils.parsedate_to_datetime(header)
        return max(0.0, when.timestamp() - time.time())
    except (TypeError, ValueError, OverflowError, IndexError):
        return None


def _finite(value: Any, low: float, *, low_open: bool = False) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or abs(value) == float("inf"):
        return False
    return value > low if low_open else value >= low


class _DeadlineStream:
    """A network stream whose every operation waits at most what is left of the calling thread's attempt."""

    def __init__(self, stream: Any, backend: _DeadlineBackend):
        self._stream = stream
        self._backend = backend

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, self._backend.left(timeout, "ReadTimeout"))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._stream.write(buffer, self._backend.left(timeout, "WriteTimeout"))

    def close(self) -> None:
        self._stream.close()

    def start_tls(self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None) -> Any:
        stream = self._stream.start_tls(ssl_context, server_hostname, self._backend.left(timeout, "ConnectTimeout"))
        return _DeadlineStream(stream, self._backend)

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class _DeadlineBackend:
    """Wraps an ``httpcore`` network backend so that connecting, reading and writing never outlast the deadline
    the calling thread set in ``deadline.end`` (``time.monotonic()`` seconds; ``None``: no deadline)."""

    def __init__(self, backend: Any, httpcore: Any, deadline: threading.local):
        self._backend = backend
        self._httpcore = httpcore
        self._deadline = deadline

    def left(self, timeout: float | None, kind: str) -> float | None:
        end = getattr(self._deadline, "end", None)
        if end is None:
            return timeout
        left = end - time.monotonic()
        if left <= 0:
            raise getattr(self._httpcore, kind)("the attempt's deadline has passed")
        return left if timeout is None else min(timeout, left)

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Any = None) -> _DeadlineStream:
        stream = self._backend.connect_tcp(host, port, timeout=self.left(timeout, "ConnectTimeout"),
                                           local_address=local_address, socket_options=socket_options)
        return _DeadlineStream(stream, self)

    def connect_unix_socket(self, path: str, timeout: float | None = None, socket_options: Any = None) -> Any:
        stream = self._backend.connect_unix_socket(path, timeout=self.left(timeout, "ConnectTimeout"),
                                                   socket_options=socket_options)
        return _DeadlineStream(stream, self)

    def sleep(self, seconds: float) -> None:
        self._backend.sleep(seconds)


def _env_proxy(url: str) -> str | None:
    """The proxy the environment names for ``url``, read as ``httpx`` reads it: ``urllib.request.getproxies()``
    (``http_proxy``, ``https_proxy``, ``all_proxy``), less the hosts of ``no_proxy`` (``*``; a host, ``localhost``
    or an IP address exactly; ``example.com`` for it and its subdomains, ``.example.com`` for its subdomains only;
    an IP network ``10.0.0.0/8``); None when no proxy applies."""
    import ipaddress
    import urllib.parse
    import urllib.request

    parts = urllib.parse.urlsplit(url)
    proxies = urllib.request.getproxies()
    proxy = proxies.get(parts.scheme) or proxies.get("all")
    if not proxy:
        return None
    host = (parts.hostname or "").lower()
    for entry in (item.strip().lower() for item in proxies.get("no", "").split(",")):
        if "://" in entry:
            entry = urllib.parse.urlsplit(entry).hostname or ""
        if not entry:
            continue
        if entry == "*" or entry.strip("[]") == host:
            return None
        try:
            if host and ipaddress.ip_address(host) in ipaddress.ip_network(entry, strict=False):
                return None
            continue  # an IP address or network that does not hold the host
        except ValueError:
            pass
        if host.endswith(entry if entry.startswith(".") else f".{entry}"):
            return None
    return proxy if "://" in proxy else f"http://{proxy}"


def _deadline_transport(httpx: Any, deadline: threading.local, base_url: str, connections: int) -> Any:
    """An ``httpx`` transport whose connections run on a :class:`_DeadlineBackend`, built only from the public
    APIs of ``httpx`` (a custom ``BaseTransport``, ``Proxy``, ``create_ssl_context``) and ``httpcore`` (a
    ``ConnectionPool``, ``HTTPProxy`` or ``SOCKSProxy`` given a ``network_backend``, its ``Request``/``URL``
    models and exceptions), as ``httpx.HTTPTransport`` builds its own; an environment proxy for ``base_url`` is
    used as ``httpx`` would. None when this ``httpx`` lacks those names (the deadline is then checked between the
    body's chunks only)."""
    try:
        import httpcore

        base, stream_base = httpx.BaseTransport, httpx.SyncByteStream
        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
        ssl_context = httpx.create_ssl_context()
        backend = _DeadlineBackend(httpcore.SyncBackend(), httpcore, deadline)
        common = dict(ssl_context=ssl_context, max_connections=connections, max_keepalive_connections=connections,
                      keepalive_expiry=limits.keepalive_expiry, network_backend=backend)
        proxy_url = _env_proxy(base_url)
        if proxy_url is None:
            pool = httpcore.ConnectionPool(**common)
        else:
            proxy = httpx.Proxy(url=proxy_url)
            target = httpcore.URL(scheme=proxy.url.raw_scheme, host=proxy.url.raw_host, port=proxy.url.port,
                                  target=proxy.url.raw_path)
            if proxy.url.scheme in ("http", "https"):
                pool = httpcore.HTTPProxy(proxy_url=target, proxy_auth=proxy.raw_auth, proxy_headers=proxy.headers.raw,
                                          proxy_ssl_context=proxy.ssl_context, **common)
            else:  # socks5 / socks5h (httpcore needs socksio for it, as httpx does)
                pool = httpcore.SOCKSProxy(proxy_url=target, proxy_auth=proxy.raw_auth, **common)
    except (ImportError, AttributeError, TypeError, ValueError) as error:
        logger.debug("no deadline transport (%s: %s): the deadline is checked between reads", type(error).__name__,
                     error)
        return None

    def mapped(error: Exception) -> Exception | None:
        """An ``httpcore`` exception as the ``httpx`` exception of the same name (both export one set)."""
        for kind in type(error).__mro__:
            target = getattr(httpx, kind.__name__, None) if kind.__module__ == "httpcore" else None
            if isinstance(target, type) and issubclass(target, Exception):
                return target(str(error))
        return None

    class Stream(stream_base):  # type: ignore[misc, valid-type]
        def __init__(self, stream: Any) -> None:
            self._stream = stream

        def __iter__(self) -> Any:
            try:
                yield from self._stream
            except Exception as error:  # noqa: BLE001 - re-raised as httpx's own, or as it is
                translated = mapped(error)
                if translated is None:
                    raise
                raise translated from error

        def close(self) -> None:
            self._stream.close()

    class DeadlineTransport(base):  # type: ignore[misc, valid-type]
        def handle_request(self, request: Any) -> Any:
            url = request.url
            core = httpcore.Request(method=request.method, url=httpcore.URL(
                scheme=url.raw_scheme, host=url.raw_host, port=url.port, target=url.raw_path),
                headers=request.headers.raw, content=request.stream, extensions=request.extensions)
            try:
                response = pool.handle_request(core)
            except Exception as error:  # noqa: BLE001 - re-raised as httpx's own, or as it is
                translated = mapped(error)
                if translated is None:
                    raise
                raise translated from error
            return httpx.Response(status_code=response.status, headers=response.headers,
                                  stream=Stream(response.stream), extensions=response.extensions)

        def close(self) -> None:
            pool.close()

    return DeadlineTransport()


@dataclasses.dataclass(frozen=True, kw_only=True)
class OpenAICompatConfig:
    """An OpenAI-compatible planner, as saved in a run's config.

    - ``model``: the model name the server knows; ``base_url``: up to and including ``/v1``;
    - ``api_key_env``: the environment variable holding the key (``None``: never send one);
    - ``mode``: ``"chat"`` (``/chat/completions``, messages) or ``"completions"`` (``/completions``,
      one prompt string; what a base model wants);
    - ``timeout_s``: the deadline of one generation attempt; ``score_timeout_s``: the deadline of one scoring
      attempt (``None``, the default: derived per request, :meth:`score_deadline_s`); ``max_retries``:
      retries after the first attempt; ``backoff_s``: the first retry's delay, doubled each retry;
    - ``max_tokens``, ``temperature``, ``stop`` (``None``: the prompt style's stop strings):
      sent with every request;
    - ``concurrency``: requests in flight at once in ``plan_many`` (and pooled connections kept alive);
    - ``seed``, ``top_p``: sent with every generation request when set (``None``: not sent);
    - ``extra_body``: more JSON fields merged into every generation request's body last (e.g. vLLM's
      ``{"top_k": 1}`` or ``{"chat_template_kwargs": {...}}``); ``None``: none.
    """

    model: str
    base_url: str
    api_key_env: str | None = "OPENAI_API_KEY"
    mode: ApiMode = "chat"
    timeout_s: float = 30.0
    max_retries: int = 3
    backoff_s: float = 0.5
    max_tokens: int = 64
    temperature: float = 0.0
    stop: tuple[str, ...] | None = None
    concurrency: int = 1
    prompt: PromptConfig = dataclasses.field(default_factory=PromptConfig)
    score_timeout_s: float | None = None
    seed: int | None = None
    top_p: float | None = None
    extra_body: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        cls = type(self)
        check(isinstance(self.model, str) and bool(self.model.strip()), cls, "model", self.model,
               "must be a non-empty model name")
        check(isinstance(self.base_url, str) and self.base_url.startswith(("http://", "https://")), cls,
               "base_url", self.base_url, "must be an http:// or https:// URL (e.g. http://127.0.0.1:8000/v1)")
        check(self.api_key_env is None or (isinstance(self.api_key_env, str) and bool(self.api_key_env.strip())),
               cls, "api_key_env", self.api_key_env, "must be None or an environment variable name")
        check_choice(self, "mode", ApiMode)
        check(_finite(self.timeout_s, 0.0, low_open=True) and self.timeout_s <= MAX_TIMEOUT_S, cls, "timeout_s",
               self.timeout_s, f"must be a number > 0 and <= {MAX_TIMEOUT_S:g} (a day)")
        if self.score_timeout_s is not None:
            check(_finite(self.score_timeout_s, 0.0, low_open=True) and self.score_timeout_s <= MAX_TIMEOUT_S, cls,
                   "score_timeout_s", self.score_timeout_s,
                   f"must be None or a number > 0 and <= {MAX_TIMEOUT_S:g} (a day)")
            object.__setattr__(self, "score_timeout_s", float(self.score_timeout_s))
        check_int(self, "max_retries", 0, MAX_RETRIES)
        check(_finite(self.backoff_s, 0.0), cls, "backoff_s", self.backoff_s, "must be a number >= 0")
        check_int(self, "max_tokens", 1, MAX_TOKENS)
        check(_finite(self.temperature, 0.0), cls, "temperature", self.temperature, "must be a number >= 0")
        if self.stop is not None:
            check(not isinstance(self.stop, str) and isinstance(self.stop, (list, tuple))
                   and all(isinstance(s, str) and s for s in self.stop), cls, "stop", self.stop,
                   "must be None or a list of non-empty strings")
            object.__setattr__(self, "stop", tuple(self.stop))
        check_int(self, "concurrency", 1, MAX_CONCURRENCY)
        check(isinstance(self.prompt, PromptConfig), cls, "prompt", self.prompt, "must be a PromptConfig")
        check(self.seed is None or (isinstance(self.seed, int) and not isinstance(self.seed, bool)), cls, "seed",
               self.seed, "must be None or an integer")
        if self.top_p is not None:
            check(_finite(self.top_p, 0.0, low_open=True) and self.top_p <= 1.0, cls, "top_p", self.top_p,
                   "must be None or a number in (0, 1]")
            object.__setattr__(self, "top_p", float(self.top_p))
        if self.extra_body is not None:
            check(isinstance(self.extra_body, dict) and all(isinstance(k, str) for k in self.extra_body), cls,
                   "extra_body", self.extra_body, "must be None or a JSON object (a dict with string keys)")
            try:
                json.dumps(self.extra_body, allow_nan=False)
            except (TypeError, ValueError) as error:
                check(False, cls, "extra_body", self.extra_body, f"must be JSON-serialisable ({error})")
        for field in ("timeout_s", "backoff_s", "temperature"):
            object.__setattr__(self, field, float(getattr(self, field)))

    @property
    def stop_strings(self) -> tuple[str, ...]:
        return self.prompt.stop if self.stop is None else self.stop

    @property
    def url(self) -> str:
        return self.base_url.rstrip("/") + ("/chat/completions" if self.mode == "chat" else "/completions")

    def score_deadline_s(self, queued_chars: int) -> float:
        """The deadline of one scoring attempt whose prompt, with those it may wait behind, holds ``queued_chars``
        characters: ``score_timeout_s`` when set, else ``timeout_s + SCORE_S_PER_CHAR * queued_chars`` (at most
        :data:`MAX_TIMEOUT_S`)."""
        if self.score_timeout_s is not None:
            return self.score_timeout_s
        return min(MAX_TIMEOUT_S, self.timeout_s + SCORE_S_PER_CHAR * max(0, queued_chars))


def _excerpt(text: str) -> str:
    text = " ".join(text[:_EXCERPT_CHARS * 4].split())
    return text if len(text) <= _EXCERPT_CHARS else text[:_EXCERPT_CHARS] + "..."


def _json_excerpt(value: Any) -> str:
    """A parsed JSON value as a quoted one-line excerpt."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except ValueError:  # pragma: no cover - parse_json refused what could not be written back
        text = shorten(value, _EXCERPT_CHARS)
    return repr(_excerpt(text))


def _decode(raw: bytes, coding: str, cap: int) -> bytes:
    """A body undone from its ``Content-Encoding`` (identity, gzip or deflate), at most ``cap + 1`` bytes of it;
    ``ValueError`` naming what is wrong."""
    coding = coding.strip().lower()
    if coding in ("", "identity"):
        return raw
    if coding in ("gzip", "x-gzip"):
        decompressor = zlib.decompressobj(16 + zlib.MAX_WBITS)
    elif coding == "deflate":
        decompressor = zlib.decompressobj(zlib.MAX_WBITS if raw[:1] == b"\x78" else -zlib.MAX_WBITS)
    else:
        raise ValueError(f"Content-Encoding {_excerpt(coding)!r} is not supported (identity, gzip or deflate)")
    try:
        return decompressor.decompress(raw, cap + 1)
    except zlib.error as error:
        raise ValueError(f"the body is not valid {coding} data ({error})") from None


class _Refused(PlannerError):
    """An HTTP 4xx answer (not 429): not retried; ``code`` is the status."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < _MAX_COUNT else None


def _state(container: dict[str, Any], key: str) -> str:
    """How a JSON field looks, for an error message: missing, null, or its type."""
    if key not in container:
        return "missing"
    value = container[key]
    return "null" if value is None else type(value).__name__


class _Retryable(Exception):
    """One failed attempt that may succeed when tried again."""

    def __init__(self, reason: str, detail: str = "", retry_after: float | None = None):
        super().__init__(reason)
        self.reason = reason
        self.detail = detail
        self.retry_after = retry_after


class OpenAICompatPlanner:
    """A frozen LLM served over the OpenAI API; see the module docstring for retries and errors.

    ``plan()`` returns the message content (chat) or text (completions), cut at the first stop
    string and stripped, with ``usage.prompt_tokens`` / ``usage.completion_tokens`` when the
    server reports them (0 otherwise). ``attempts`` counts HTTP attempts since construction.
    The planner holds a pooled HTTP client: :meth:`close` it (or use it as a context manager) when done.
    """

    def __init__(
        self,
        model: str,
        base_url: str,
        *,
        api_key_env: str | None = "OPENAI_API_KEY",
        mode: ApiMode = "chat",
        timeout_s: float = 30.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        max_tokens: int = 64,
        temperature: float = 0.0,
        stop: Sequence[str] | None = None,
        prompt: PromptConfig | None = None,
        concurrency: int = 1,
        seed: int | None = None,
        top_p: float | None = None,
        extra_body: dict[str, Any] | None = None,
        score_timeout_s: float | None = None,
    ):
        self.config = OpenAICompatConfig(
            model=model, base_url=base_url, api_key_env=api_key_env, mode=mode, timeout_s=timeout_s,
            max_retries=max_retries, backoff_s=backoff_s, max_tokens=max_tokens, temperature=temperature,
            stop=stop if stop is None or isinstance(stop, str) else tuple(stop), concurrency=concurrency,
            prompt=prompt or PromptConfig(), seed=seed, top_p=top_p,
            extra_body=dict(extra_body) if isinstance(extra_body, dict) else extra_body,
            score_timeout_s=score_timeout_s)
        self._httpx = _httpx()
        self._client: Any = None
        self.url = self.config.url
        self.completions_url = self.config.base_url.rstrip("/") + "/completions"
        self.stop = self.config.stop_strings
        self.attempts = 0
        self._lock = threading.Lock()
        self._deadline = threading.local()  # .end: the monotonic deadline of this thread's attempt
        self._empty_chat_warned = False

    def _http(self) -> Any:
        """The pooled client (created at the first request; thread-safe, shared by ``plan_many``'s threads)."""
        with self._lock:
            if self._client is None:
                httpx = self._httpx
                n = self.config.concurrency
                transport = _deadline_transport(httpx, self._deadline, self.config.base_url, n)
                self._client = httpx.Client(timeout=httpx.Timeout(self.config.timeout_s),
                                            limits=httpx.Limits(max_connections=n, max_keepalive_connections=n),
                                            follow_redirects=False, transport=transport)
            return self._client

    def close(self) -> None:
        """Close the pooled connections (a later call opens new ones)."""
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    def __enter__(self) -> OpenAICompatPlanner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @classmethod
    def from_config(cls, config: OpenAICompatConfig) -> OpenAICompatPlanner:
        """Build the planner a saved config describes."""
        return cls(**{field.name: getattr(config, field.name) for field in dataclasses.fields(config)})

    # ------------------------------------------------------------------ requests

    def request_body(self, task: Task, cases: Sequence[Case]) -> dict[str, Any]:
        """The JSON body sent for ``task`` with ``cases``."""
        config = self.config
        body: dict[str, Any] = {"model": config.model}
        if config.mode == "chat":
            body["messages"] = render_messages(config.prompt, task, cases)
        else:
            body["prompt"] = render_prompt(config.prompt, task, cases)
        body["max_tokens"] = config.max_tokens
        body["temperature"] = config.temperature
        if self.stop:
            body["stop"] = list(self.stop)
        if config.top_p is not None:
            body["top_p"] = config.top_p
        if config.seed is not None:
            body["seed"] = config.seed
        if config.extra_body:
            body.update(copy.deepcopy(config.extra_body))
        return body

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "application/json",
                   "Accept-Encoding": "gzip, deflate"}
        env = self.config.api_key_env
        key = os.environ.get(env, "").strip() if env else ""
        if key:
            headers["Authorization"] = f"Bearer {key}"
        return headers

    def _attempt(self, data: bytes, url: str, deadline_s: float, why: str) -> bytes:
        """One POST within ``deadline_s`` in all (``why``: how that deadline was set, for the error): the body of
        a 2xx reply, or :class:`_Retryable` / a :class:`PlannerError` (:class:`_Refused` for a 4xx)."""
        httpx = self._httpx
        client = self._http()
        with self._lock:
            self.attempts += 1
        self._deadline.end = end = time.monotonic() + deadline_s
        try:
            request = client.build_request("POST", url, content=data, headers=self._headers(),
                                           timeout=httpx.Timeout(deadline_s))
            response = client.send(request, stream=True)
            try:
                return self._read(response, url, end)
            finally:
                response.close()
        except httpx.TimeoutException:
            raise _Retryable(f"timed out ({why} for the whole attempt)") from None
        except httpx.ConnectError as error:
            raise _Retryable("cannot connect", _excerpt(str(error) or type(error).__name__)) from None
        except httpx.TransportError as error:  # the connection dropped, a reply cut short, a protocol error
            raise _Retryable("connection failed", _excerpt(f"{type(error).__name__}: {error}")) from None
        except httpx.HTTPError as error:  # anything else the client refuses in a reply
            raise PlannerError(f"POST {url}: the reply cannot be read: "
                               f"{_excerpt(f'{type(error).__name__}: {error}')}") from None
        finally:
            self._deadline.end = None

    def _read(self, response: Any, url: str, end: float) -> bytes:
        """The body of ``response`` (bounded in bytes and by the deadline ``end``), or the error it means."""
        code = response.status_code
        headers = response.headers
        cap = MAX_REPLY_BYTES if code < 300 else _ERROR_BODY_BYTES
        length = (headers.get("Content-Length") or "").strip()
        if code < 300 and length.isdigit() and (len(length) > 12 or int(length) > cap):
            size = length if len(length) <= 20 else f"{length[:12]}... ({len(length)} digits)"
            raise PlannerError(f"POST {url}: HTTP {code} announces a body of {size} bytes, more than the {cap} "
                               "bytes a reply may hold")
        chunks: list[bytes] = []
        size = 0
        for chunk in response.iter_raw():
            if time.monotonic() > end:
                raise self._httpx.ReadTimeout("the attempt's deadline passed while reading the body")
            chunks.append(chunk)
            size += len(chunk)
            if size > cap:
                if code < 300:
                    raise PlannerError(f"POST {url}: HTTP {code} with a body of more than {cap} bytes "
                                       "(the most a reply may hold)")
                break
        raw = b"".join(chunks)
        try:
            body = _decode(raw, headers.get("Content-Encoding") or "", cap)
        except ValueError as error:
            if code < 300:
                raise PlannerError(f"POST {url}: HTTP {code}: {error}") from None
            body = b""
        if len(body) > cap:
            if code < 300:
                raise PlannerError(f"POST {url}: HTTP {code} with a body that decompresses to more than {cap} bytes "
                                   "(the most a reply may hold)")
            body = body[:cap]
        if code < 300:
            kind = headers.get("Content-Type")
            mime = (kind or "").split(";")[0].strip().lower()
            if kind is not None and mime != "application/json" and not mime.endswith("+json"):
                raise PlannerError(f"POST {url}: HTTP {code} with Content-Type {_excerpt(kind)!r}, expected "
                                   f"application/json: {_excerpt(body.decode('utf-8', errors='replace'))!r}")
            return body
        detail = _excerpt(body.decode("utf-8", errors="replace"))
        if code == 429 or code >= 500:
            raise _Retryable(f"HTTP {code}", detail, _retry_after(headers.get("Retry-After")))
        if 300 <= code < 400:
            where = headers.get("Location")
            to = f" to {_excerpt(where)!r}" if where else ""
            raise _Refused(f"POST {url}: HTTP {code} redirect{to}: redirects are not followed "
                           "(give the server's final URL, up to and including /v1)", code)
        raise _Refused(f"POST {url}: HTTP {code}" + (f": {detail}" if detail else ""), code)

    def _retrying(self, url: str, total: int) -> Any:
        """tenacity's retry loop for one POST: :class:`_Retryable` failures are retried up to ``total`` attempts
        in all, after ``backoff_s * 2**i`` seconds or the server's ``Retry-After`` when longer (capped at 60 s),
        each retry logged; the last failure is re-raised as it is."""
        tenacity = _tenacity()
        backoff = tenacity.wait_exponential(multiplier=self.config.backoff_s, max=_MAX_BACKOFF_S)

        def wait(state: Any) -> float:
            after = getattr(state.outcome.exception(), "retry_after", None)
            return min(max(backoff(state), after or 0.0), _MAX_BACKOFF_S)

        def log(state: Any) -> None:
            error = state.outcome.exception()
            logger.info("POST %s: %s%s (attempt %d of %d); retrying in %.2f s", url, error.reason,
                        f": {error.detail}" if error.detail else "", state.attempt_number, total,
                        state.next_action.sleep)

        return tenacity.Retrying(retry=tenacity.retry_if_exception_type(_Retryable),
                                 stop=tenacity.stop_after_attempt(total), wait=wait, before_sleep=log,
                                 sleep=lambda seconds: time.sleep(seconds), reraise=True)

    def _post(self, body: dict[str, Any], url: str | None = None, deadline: tuple[float, str] | None = None
              ) -> dict[str, Any]:
        """The JSON object a POST of ``body`` answers, after the retries (a 4xx: a :class:`PlannerError` at once);
        ``deadline``: ``(seconds, how they were set)`` of each attempt (default: ``timeout_s``)."""
        url = url or self.url
        data = json.dumps(body, ensure_ascii=False).encode("utf-8")
        total = self.config.max_retries + 1
        deadline_s, why = deadline or (self.config.timeout_s, f"timeout_s={self.config.timeout_s:g}")
        try:
            raw = self._retrying(url, total)(self._attempt, data, url, deadline_s, why)
        except _Refused as error:
            raise PlannerError(str(error)) from None
        except _Retryable as error:
            attempts = f"{total} attempt{'s' if total > 1 else ''}"
            detail = f": {error.detail}" if error.detail else ""
            raise PlannerError(f"POST {url}: {error.reason} after {attempts}{detail}") from None
        where = f"POST {url}"
        try:
            response = parse_json(raw, where="", error=PlannerError, finite=True)
        except PlannerError as error:
            excerpt = _excerpt(raw[:_EXCERPT_CHARS * 4].decode("utf-8", errors="replace"))
            why = str(error).lstrip(":0123456789 ")
            raise PlannerError(f"{where}: response is not JSON: {excerpt!r} ({why})") from None
        if not isinstance(response, dict):
            raise PlannerError(f"{where}: response is not a JSON object (a {type(response).__name__}): "
                               f"{_json_excerpt(response)}")
        if "choices" not in response and "error" in response:
            raise PlannerError(f"{where}: the server answered with an error: {_json_excerpt(response['error'])}")
        return response

    def _parse(self, response: dict[str, Any]) -> tuple[str, int, int]:
        where = f"POST {self.url}"
        choices = response.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise PlannerError(f"{where}: response has no choices: {_json_excerpt(response)}")
        choice = choices[0]
        if self.config.mode == "chat":
            message = choice.get("message")
            if not isinstance(message, dict) or not isinstance(message.get("content", ""), (str, type(None))):
                raise PlannerError(f"{where}: choices[0] has no message: {_json_excerpt(choice)}")
            text, field = message.get("content") or "", "choices[0].message.content"
        else:
            text, field = choice.get("text"), "choices[0].text"
            if not isinstance(text, str):
                raise PlannerError(f"{where}: choices[0] has no text: {_json_excerpt(choice)}")
        if "\x00" in text:
            raise PlannerError(f"{where}: {field} holds a NUL character, which an answer cannot: {_excerpt(text)!r}")
        limit = _CHARS_PER_TOKEN * self.config.max_tokens
        if len(text) > limit:
            raise PlannerError(f"{where}: {field} is {len(text)} characters, more than max_tokens="
                               f"{self.config.max_tokens} tokens can hold ({limit}): {_excerpt(text)!r}")
        return text, *self._usage(where, response)

    @staticmethod
    def _usage(where: str, response: dict[str, Any]) -> tuple[int, int]:
        """``usage.prompt_tokens`` and ``usage.completion_tokens`` (0 when absent or null); nonsense is refused."""
        usage = response.get("usage")
        if usage is None:
            return 0, 0
        if not isinstance(usage, dict):
            raise PlannerError(f"{where}: usage is a {type(usage).__name__}, expected an object: "
                               f"{_json_excerpt(usage)}")
        counts = []
        for key in ("prompt_tokens", "completion_tokens"):
            value = usage.get(key)
            if value is not None and _count(value) is None:
                raise PlannerError(f"{where}: usage.{key} is {shorten(value)}, expected a token count "
                                   f"(an integer from 0 to {_MAX_COUNT - 1})")
            counts.append(value or 0)
        return counts[0], counts[1]

    # ------------------------------------------------------------------ the protocol

    def plan(self, task: Task, cases: Sequence[Case]) -> PlanOutput:
        start = time.perf_counter()
        text, prompt_tokens, output_tokens = self._parse(self._post(self.request_body(task, cases)))
        cuts = [i for i in (text.find(s) for s in self.stop) if i >= 0]
        if cuts:
            text = text[:min(cuts)]
        if self.config.mode == "chat" and not text.strip():
            self._warn_empty_chat()
        return PlanOutput(text=text.strip(), prompt_tokens=prompt_tokens, output_tokens=output_tokens,
                          latency_s=time.perf_counter() - start)

    def _warn_empty_chat(self) -> None:
        """The first empty answer in chat mode: one warning (per planner) naming the fix, ``mode=completions``.
        A base model without a chat template answers nothing in chat mode (llama-cpp-python falls back to a
        llama-2 template and the bundled Gemma 3 270M answers ``""``), and no server says whether a model has one."""
        with self._lock:
            if self._empty_chat_warned:
                return
            self._empty_chat_warned = True
        logger.warning("planner %s: chat mode got an empty answer from model %r; a base model without a chat "
                       "template (such as the bundled Gemma 3 270M) answers nothing in chat mode: add "
                       "?mode=completions to the planner spec (warned once)", self.url, self.config.model)

    def plan_many(self, tasks: Sequence[Task], cases: Sequence[Sequence[Case]]) -> list[PlanOutput]:
        if len(tasks) != len(cases):
            raise PlannerError(f"plan_many got {len(tasks)} tasks but {len(cases)} case lists")
        if self.config.concurrency == 1 or len(tasks) <= 1:
            return [self.plan(task, task_cases) for task, task_cases in zip(tasks, cases)]
        with ThreadPoolExecutor(max_workers=min(self.config.concurrency, len(tasks))) as pool:
            return list(pool.map(self.plan, tasks, cases))

    # ------------------------------------------------------------------ scoring

    def score_request_body(self, task: Task, cases: Sequence[Case], answer: str | None = None) -> dict[str, Any]:
        """The JSON body sent to ``completions_url`` to score ``answer`` (default ``task.answers[0]``)."""
        answer = task.answers[0] if answer is None else answer
        prompt = self.config.prompt
        text = render_prompt(prompt, task, cases) + render_answer(prompt, answer)
        return {"model": self.config.model, "prompt": text, "max_tokens": 1, "temperature": 0.0, "echo": True,
                "logprobs": 1}

    def score(self, task: Task, case_sets: Sequence[Sequence[Case]], answer: str | None = None) -> list[AnswerScore]:
        """The log-likelihood of ``answer`` (default ``task.answers[0]``) after each case set's prompt."""
        return self.score_many([task], [case_sets], None if answer is None else [answer])[0]

    def score_many(self, tasks: Sequence[Task], case_sets_per_task: Sequence[Sequence[Sequence[Case]]],
                   answers: Sequence[str | None] | None = None) -> list[list[AnswerScore]]:
        """:meth:`score` for several tasks; ``concurrency`` requests in flight (one per case set)."""
        requests = score_requests(tasks, case_sets_per_task, answers)
        bodies = [self.score_request_body(r.task, r.cases, r.answer) for r in requests]
        deadlines = self._score_deadlines([len(body["prompt"]) for body in bodies])
        if self.config.concurrency == 1 or len(requests) <= 1:
            scores = [self._score_one(*item) for item in zip(requests, bodies, deadlines)]
        else:
            with ThreadPoolExecutor(max_workers=min(self.config.concurrency, len(requests))) as pool:
                scores = list(pool.map(self._score_one, requests, bodies, deadlines))
        return group_scores(requests, scores, len(tasks))

    def _score_deadlines(self, chars: list[int]) -> list[tuple[float, str]]:
        """Each scoring request's ``(deadline seconds, how they were set)``. With ``score_timeout_s`` unset, a server
        that scores one request at a time (llama-cpp-python) makes a request wait for the ones ahead of it: the
        deadline counts the request's own prompt and the ``concurrency - 1`` longest others of the same call."""
        config = self.config
        if config.score_timeout_s is not None:
            return [(config.score_timeout_s, f"score_timeout_s={config.score_timeout_s:g}")] * len(chars)
        width = min(config.concurrency, len(chars))
        longest = sorted(chars, reverse=True)[:width]
        out = []
        for n in chars:
            queued = sum(longest) if n in longest else n + sum(longest[:width - 1])
            seconds = config.score_deadline_s(queued)
            out.append((seconds, f"{seconds:.4g} s: timeout_s={config.timeout_s:g} + {SCORE_S_PER_CHAR:g} s per "
                                 f"prompt character, {queued} queued; or set score_timeout_s"))
        return out

    def _score_one(self, request: ScoreRequest, body: dict[str, Any], deadline: tuple[float, str]) -> AnswerScore:
        start = time.perf_counter()
        response = self._post(body, self.completions_url, deadline)
        continuation = render_answer(self.config.prompt, request.answer)
        logprob, n_tokens, prompt_tokens = self._parse_score(response, body, continuation)
        check_score(f"POST {self.completions_url}", request, logprob, n_tokens)
        return AnswerScore(logprob=logprob, n_tokens=n_tokens, prompt_tokens=prompt_tokens,
                           latency_s=time.perf_counter() - start)

    def _parse_score(self, response: dict[str, Any], body: dict[str, Any], continuation: str) -> tuple[float, int, int]:
        """(sum of the answer's token logprobs, its token count, the prompt tokens before it)."""
        where = f"POST {self.completions_url}"
        choices = response.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise PlannerError(f"{where}: response has no choices: {_json_excerpt(response)}")
        choice = choices[0]
        need = NO_PROMPT_LOGPROBS
        logprobs = choice.get("logprobs")
        if not isinstance(logprobs, dict):
            raise PlannerError(f"{where}: {need} (choices[0].logprobs is {_state(choice, 'logprobs')})")
        token_logprobs = logprobs.get("token_logprobs")
        if not isinstance(token_logprobs, list) or all(value is None for value in token_logprobs):
            state = "all null" if isinstance(token_logprobs, list) else _state(logprobs, "token_logprobs")
            raise PlannerError(f"{where}: {need} (choices[0].logprobs.token_logprobs is {state})")
        bad = next((i for i, value in enumerate(token_logprobs) if value is not None and not (
            (number := finite_float(value)) is not None and number <= 0.0)), None)
        if bad is not None:
            raise PlannerError(f"{where}: choices[0].logprobs.token_logprobs[{bad}] is "
                               f"{shorten(token_logprobs[bad])}, not a log-probability (null or a finite number <= 0)")
        tokens, offsets = logprobs.get("tokens"), logprobs.get("text_offset")
        if (not isinstance(tokens, list) or not isinstance(offsets, list)
                or not len(tokens) == len(offsets) == len(token_logprobs)
                or not all(isinstance(t, str) for t in tokens) or not all(_count(o) is not None for o in offsets)
                or any(b < a for a, b in zip(offsets, offsets[1:]))):
            got = {key: len(value) if isinstance(value, list) else _state(logprobs, key)
                   for key, value in (("tokens", tokens), ("token_logprobs", token_logprobs), ("text_offset", offsets))}
            raise PlannerError(f"{where}: malformed logprobs: tokens, token_logprobs and text_offset must be lists "
                               f"of one length (strings, numbers, non-decreasing offsets); got lengths {got}")
        text = choice.get("text")
        if text is not None and not isinstance(text, str):
            raise PlannerError(f"{where}: choices[0].text is a {type(text).__name__}, expected the echoed prompt: "
                               f"{_json_excerpt(text)}")
        if isinstance(text, str) and not text.startswith(body["prompt"]):
            raise PlannerError(f"{where}: {need} (it did not echo the prompt: choices[0].text does not start with "
                               f"it: {_excerpt(text)!r})")
        n_total = len(tokens)
        reported_prompt, generated = self._usage(where, response)
        usage = response.get("usage") or {}
        # The generated tokens are the echo's last entries: count them out. usage.prompt_tokens may count a
        # <bos> the lists leave out (llama-cpp-python does), so it only decides when completion_tokens is absent.
        if usage.get("completion_tokens") is not None:
            n_prompt = n_total - generated
        elif usage.get("prompt_tokens") is not None and 1 <= reported_prompt <= n_total:
            n_prompt = reported_prompt
        else:
            n_prompt = n_total - body["max_tokens"]
        ends = [offsets[i + 1] if i + 1 < n_total else offsets[i] + len(tokens[i]) for i in range(n_total)]
        if n_prompt < 1:
            raise PlannerError(f"{where}: {need} (choices[0].logprobs holds {n_total} tokens, no more than "
                               "it generated)")
        answer_start = ends[n_prompt - 1] - len(continuation)
        first = next((i for i in range(n_prompt) if ends[i] > answer_start), n_prompt)
        if answer_start < offsets[0] or first >= n_prompt:
            raise PlannerError(f"{where}: malformed logprobs: the echoed prompt tokens (text_offset up to "
                               f"{ends[n_prompt - 1]}) cannot hold the answer's {len(continuation)} characters")
        values = token_logprobs[first:n_prompt]
        for i, value in enumerate(values, first):
            if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
                raise PlannerError(f"{where}: the server returned no log-probability for answer token {i} "
                                   f"(choices[0].logprobs.token_logprobs[{i}] is {value!r}); scoring needs them all")
        unlisted = max(0, reported_prompt - n_prompt)  # a <bos> the server counted but did not list
        return sum(float(value) for value in values), len(values), first + unlisted  # -inf past float range: refused

    def __repr__(self) -> str:
        return f"OpenAICompatPlanner(model={self.config.model!r}, url={self.url!r}, mode={self.config.mode!r})"
