"""A planner behind any OpenAI-compatible HTTP server (vLLM, Ollama, llama.cpp server, OpenAI).

Standard library only (``urllib.request`` and ``json``): no client package is needed. The API
key is read from an environment variable at every call (optional: local servers need none).
Connection errors, timeouts, HTTP 429 and 5xx are retried with exponential backoff
(``backoff_s * 2**i``, or the server's ``Retry-After`` when longer, capped at 60 s); other 4xx
answers, a body that is not JSON, or one without ``choices`` raise :class:`PlannerError` at once.
Every error is one line naming the method, the URL and what went wrong, e.g.
``POST http://127.0.0.1:8000/v1/chat/completions: HTTP 500 after 4 attempts: <body excerpt>``
(``max_retries=3`` means up to 4 attempts).
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import logging
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal, get_args

from memento.config import check, check_int
from memento.planners.base import PlannerError, PlanOutput
from memento.planners.prompts import PromptConfig, render_messages, render_prompt
from memento.types import Case, Task

__all__ = ["ApiMode", "OpenAICompatConfig", "OpenAICompatPlanner"]

logger = logging.getLogger(__name__)

ApiMode = Literal["chat", "completions"]

_EXCERPT_CHARS = 200
_MAX_BACKOFF_S = 60.0


def _finite(value: Any, low: float, *, low_open: bool = False) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or abs(value) == float("inf"):
        return False
    return value > low if low_open else value >= low


@dataclasses.dataclass(frozen=True, kw_only=True)
class OpenAICompatConfig:
    """An OpenAI-compatible planner, as saved in a run's config.

    - ``model``: the model name the server knows; ``base_url``: up to and including ``/v1``;
    - ``api_key_env``: the environment variable holding the key (``None``: never send one);
    - ``mode``: ``"chat"`` (``/chat/completions``, messages) or ``"completions"`` (``/completions``,
      one prompt string; what a base model wants);
    - ``timeout_s``: per attempt; ``max_retries``: retries after the first attempt;
      ``backoff_s``: the first retry's delay, doubled each retry;
    - ``max_tokens``, ``temperature``, ``stop`` (``None``: the prompt style's stop strings):
      sent with every request;
    - ``concurrency``: requests in flight at once in ``plan_many``.
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

    def __post_init__(self) -> None:
        cls = type(self)
        check(isinstance(self.model, str) and bool(self.model.strip()), cls, "model", self.model,
               "must be a non-empty model name")
        check(isinstance(self.base_url, str) and self.base_url.startswith(("http://", "https://")), cls,
               "base_url", self.base_url, "must be an http:// or https:// URL (e.g. http://127.0.0.1:8000/v1)")
        check(self.api_key_env is None or (isinstance(self.api_key_env, str) and bool(self.api_key_env.strip())),
               cls, "api_key_env", self.api_key_env, "must be None or an environment variable name")
        check(self.mode in get_args(ApiMode), cls, "mode", self.mode, f"must be one of {get_args(ApiMode)}")
        check(_finite(self.timeout_s, 0.0, low_open=True), cls, "timeout_s", self.timeout_s,
               "must be a number > 0")
        check_int(self, "max_retries", 0)
        check(_finite(self.backoff_s, 0.0), cls, "backoff_s", self.backoff_s, "must be a number >= 0")
        check_int(self, "max_tokens", 1)
        check(_finite(self.temperature, 0.0), cls, "temperature", self.temperature, "must be a number >= 0")
        if self.stop is not None:
            check(not isinstance(self.stop, str) and isinstance(self.stop, (list, tuple))
                   and all(isinstance(s, str) and s for s in self.stop), cls, "stop", self.stop,
                   "must be None or a list of non-empty strings")
            object.__setattr__(self, "stop", tuple(self.stop))
        check_int(self, "concurrency", 1)
        check(isinstance(self.prompt, PromptConfig), cls, "prompt", self.prompt, "must be a PromptConfig")
        for field in ("timeout_s", "backoff_s", "temperature"):
            object.__setattr__(self, field, float(getattr(self, field)))

    @property
    def stop_strings(self) -> tuple[str, ...]:
        return self.prompt.stop if self.stop is None else self.stop

    @property
    def url(self) -> str:
        return self.base_url.rstrip("/") + ("/chat/completions" if self.mode == "chat" else "/completions")


def _excerpt(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _EXCERPT_CHARS else text[:_EXCERPT_CHARS] + "..."


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
    ):
        self.config = OpenAICompatConfig(
            model=model, base_url=base_url, api_key_env=api_key_env, mode=mode, timeout_s=timeout_s,
            max_retries=max_retries, backoff_s=backoff_s, max_tokens=max_tokens, temperature=temperature,
            stop=stop if stop is None or isinstance(stop, str) else tuple(stop), concurrency=concurrency,
            prompt=prompt or PromptConfig())
        self.url = self.config.url
        self.stop = self.config.stop_strings
        self.attempts = 0
        self._lock = threading.Lock()

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
        return body

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        env = self.config.api_key_env
        key = os.environ.get(env, "").strip() if env else ""
        if key:
            headers["Authorization"] = f"Bearer {key}"
        return headers

    def _attempt(self, data: bytes) -> bytes:
        request = urllib.request.Request(self.url, data=data, headers=self._headers(), method="POST")
        with self._lock:
            self.attempts += 1
        try:
            with urllib.request.urlopen(request, timeout=self.config.timeout_s) as response:
                return response.read()
        except urllib.error.HTTPError as error:
            try:
                body = error.read().decode("utf-8", errors="replace")
            except (OSError, http.client.HTTPException):
                body = ""
            finally:
                error.close()
            detail = _excerpt(body)
            if error.code == 429 or error.code >= 500:
                retry_after = None
                header = error.headers.get("Retry-After") if error.headers else None
                if header is not None:
                    try:
                        retry_after = float(header)
                    except ValueError:
                        retry_after = None
                raise _Retryable(f"HTTP {error.code}", detail, retry_after) from None
            raise PlannerError(f"POST {self.url}: HTTP {error.code}" + (f": {detail}" if detail else "")) from None
        except TimeoutError:
            raise _Retryable(f"timed out (timeout_s={self.config.timeout_s:g})") from None
        except urllib.error.URLError as error:
            if isinstance(error.reason, TimeoutError):
                raise _Retryable(f"timed out (timeout_s={self.config.timeout_s:g})") from None
            raise _Retryable("cannot connect", _excerpt(str(error.reason))) from None
        except (ConnectionError, http.client.HTTPException) as error:
            raise _Retryable("connection failed", _excerpt(f"{type(error).__name__}: {error}")) from None

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        data = json.dumps(body, ensure_ascii=False).encode("utf-8")
        total = self.config.max_retries + 1
        for attempt in range(1, total + 1):
            try:
                raw = self._attempt(data)
                break
            except _Retryable as error:
                if attempt == total:
                    attempts = f"{total} attempt{'s' if total > 1 else ''}"
                    detail = f": {error.detail}" if error.detail else ""
                    raise PlannerError(f"POST {self.url}: {error.reason} after {attempts}{detail}") from None
                delay = self.config.backoff_s * 2 ** (attempt - 1)
                if error.retry_after is not None:
                    delay = max(delay, error.retry_after)
                delay = min(delay, _MAX_BACKOFF_S)
                logger.info("POST %s: %s%s (attempt %d of %d); retrying in %.2f s", self.url, error.reason,
                               f": {error.detail}" if error.detail else "", attempt, total, delay)
                time.sleep(delay)
        text = raw.decode("utf-8", errors="replace")
        try:
            response = json.loads(text)
        except json.JSONDecodeError:
            raise PlannerError(f"POST {self.url}: response is not JSON: {_excerpt(text)!r}") from None
        if not isinstance(response, dict):
            raise PlannerError(f"POST {self.url}: response is not a JSON object: {_excerpt(text)!r}")
        return response

    def _parse(self, response: dict[str, Any]) -> tuple[str, int, int]:
        choices = response.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise PlannerError(f"POST {self.url}: response has no choices: {_excerpt(json.dumps(response))!r}")
        choice = choices[0]
        if self.config.mode == "chat":
            message = choice.get("message")
            if not isinstance(message, dict) or not isinstance(message.get("content", ""), (str, type(None))):
                raise PlannerError(f"POST {self.url}: choices[0] has no message: {_excerpt(json.dumps(choice))!r}")
            text = message.get("content") or ""
        else:
            text = choice.get("text")
            if not isinstance(text, str):
                raise PlannerError(f"POST {self.url}: choices[0] has no text: {_excerpt(json.dumps(choice))!r}")
        usage = response.get("usage")
        usage = usage if isinstance(usage, dict) else {}
        counts = []
        for key in ("prompt_tokens", "completion_tokens"):
            value = usage.get(key)
            counts.append(value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0)
        return text, counts[0], counts[1]

    # ------------------------------------------------------------------ the protocol

    def plan(self, task: Task, cases: Sequence[Case]) -> PlanOutput:
        start = time.perf_counter()
        text, prompt_tokens, output_tokens = self._parse(self._post(self.request_body(task, cases)))
        cuts = [i for i in (text.find(s) for s in self.stop) if i >= 0]
        if cuts:
            text = text[:min(cuts)]
        return PlanOutput(text=text.strip(), prompt_tokens=prompt_tokens, output_tokens=output_tokens,
                          latency_s=time.perf_counter() - start)

    def plan_many(self, tasks: Sequence[Task], cases: Sequence[Sequence[Case]]) -> list[PlanOutput]:
        if len(tasks) != len(cases):
            raise PlannerError(f"plan_many got {len(tasks)} tasks but {len(cases)} case lists")
        if self.config.concurrency == 1 or len(tasks) <= 1:
            return [self.plan(task, task_cases) for task, task_cases in zip(tasks, cases)]
        with ThreadPoolExecutor(max_workers=min(self.config.concurrency, len(tasks))) as pool:
            return list(pool.map(self.plan, tasks, cases))

    def __repr__(self) -> str:
        return f"OpenAICompatPlanner(model={self.config.model!r}, url={self.url!r}, mode={self.config.mode!r})"
