"""``memento serve``: an HTTP service around a loaded :class:`~memento.selector.Selector`.

Endpoints (JSON; every one but ``/healthz`` and the OpenAPI spec needs ``Authorization: Bearer TOKEN``)::

    POST /v1/select     {query | embedding, k, mode, env}            -> the selection (ids, cases, probs, selection_id)
    POST /v1/feedback   {selection_id, reward}                       -> {selection_id, reward, recorded, updates}
    POST /v1/cases      {state, action, reward, env?, meta?, embedding?} -> {id}
    GET  /v1/cases/{id}                                              -> the case (404 when unknown)
    GET  /v1/stats                                                   -> selector counts + server counters
    GET  /healthz                                                    -> {"status": "ok"} (no auth)
    GET  /openapi.json                                               -> the OpenAPI spec (no auth)

Concurrency and durability. Selections run concurrently in the server's thread pool (the
Selector serialises on its own lock). Writes - feedback and new cases - go through one bounded
queue to a single writer thread, which is also the only thread that makes the learner update
(inside ``Selector.feedback`` when the selector was loaded with ``learn=True``). A write is answered
only after the writer's ``Selector.feedback``/``add_case`` returned, i.e. after the fact was
committed to the artifact's SQLite: an acknowledged write survives a crash. The writer also
checkpoints (``Selector.save()``, atomic) every ``save_every_s`` seconds or ``save_every_n``
writes, whichever comes first, and once more on shutdown. SIGTERM or SIGINT stops accepting
connections, lets in-flight requests finish, drains the queue, saves, and exits with status 0.

FastAPI and uvicorn (the ``serve`` extra) are imported only when an app is built or served;
this module itself imports without them.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import hmac
import ipaddress
import logging
import math
import os
import queue
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

from memento.errors import ConfigError, MementoError

__all__ = [
    "TOKEN_ENV",
    "ServeConfig",
    "ServerUnavailableError",
    "Writer",
    "check_host",
    "create_app",
    "is_loopback",
    "require_extra",
    "resolve_token",
    "serve",
    "thread_limiter",
]

logger = logging.getLogger(__name__)

TOKEN_ENV = "MEMENTO_SERVE_TOKEN"
MIN_TOKEN_CHARS = 16


class ServerUnavailableError(MementoError):
    """The writer cannot take a write now: its queue is full or it is shutting down (HTTP 503)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServeConfig:
    """How the service runs (the token is a secret and is passed separately, never stored here).

    - ``max_body_bytes``: larger request bodies are refused with 413 before they are parsed;
    - ``max_k``: the largest ``k`` a select may ask for; ``max_text_chars``: the longest query, state or
      action text; ``max_embedding_dim``: the longest embedding accepted (the selector checks the exact dim);
    - ``queue_size``: writes waiting for the writer before new ones get 503;
    - ``save_every_s`` / ``save_every_n``: checkpoint when this many seconds passed, or this many writes
      arrived, since the last save (0 disables that trigger); always once more on shutdown;
    - ``graceful_timeout_s``: how long shutdown waits for in-flight requests before cancelling them;
    - ``threads``: OpenMP threads faiss may use in each request thread and in the writer (0: faiss's
      default, one per core). One request searches for one query: nothing to share out, and on a small
      machine the idle OpenMP threads of every request thread spin against each other (a 100-case
      select measured 14 ms instead of 1 ms on 2 busy cores). torch's thread count is process-wide and
      left to the caller (the CLI sets it from ``--threads``).
    """

    max_body_bytes: int = 1 << 20
    max_k: int = 64
    max_text_chars: int = 32_768
    max_embedding_dim: int = 8192
    queue_size: int = 10_000
    save_every_s: float = 60.0
    save_every_n: int = 1000
    graceful_timeout_s: float = 30.0
    threads: int = 1

    def __post_init__(self) -> None:
        from memento.config import check_float, check_int

        for name in ("max_body_bytes", "max_k", "max_text_chars", "max_embedding_dim", "queue_size"):
            check_int(self, name, 1)
        check_int(self, "save_every_n", 0)
        check_int(self, "threads", 0)
        check_float(self, "save_every_s", low=0.0)
        check_float(self, "graceful_timeout_s", low=0.0)


def thread_limiter(threads: int) -> Callable[[], None]:
    """A function to call at the start of work in any thread: the first call in each thread sets faiss's
    OpenMP thread count there to ``threads`` (OpenMP settings are per calling thread; 0 does nothing)."""
    local = threading.local()

    def limit() -> None:
        if threads and not getattr(local, "done", False):
            local.done = True
            try:
                import faiss
            except ImportError:  # pragma: no cover - faiss is a core dependency
                return
            faiss.omp_set_num_threads(threads)

    return limit


# ---------------------------------------------------------------- the single writer


@dataclasses.dataclass
class _Job:
    kind: Literal["feedback", "case"]
    args: dict[str, Any]
    future: concurrent.futures.Future[Any]


class Writer:
    """The one thread that writes to the selector: feedback, new cases, and checkpoints.

    ``submit_*`` enqueue a write and return a ``concurrent.futures.Future`` that resolves after the
    selector recorded it (or holds the selector's error). ``stop()`` refuses new writes, drains the
    queue, saves once more, and joins the thread; it is idempotent.
    """

    def __init__(self, selector: Any, config: ServeConfig | None = None, *,
                 clock: Callable[[], float] = time.monotonic):
        self.selector = selector
        self.config = config or ServeConfig()
        self._clock = clock
        self._queue: queue.Queue[_Job | None] = queue.Queue(maxsize=self.config.queue_size)
        self._accepting = True
        self._submit_lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memento-writer", daemon=True)
        self._unsaved = 0
        self._last_save = clock()
        self.counts = {"feedback": 0, "cases": 0, "errors": 0, "saves": 0, "save_errors": 0}
        self.last_save_error: str | None = None
        self.last_save_time: float | None = None

    def start(self) -> Writer:
        self._thread.start()
        return self

    @property
    def queued(self) -> int:
        return self._queue.qsize()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def _submit(self, kind: Literal["feedback", "case"], args: dict[str, Any]) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._submit_lock:  # no write slips in after stop() closed the door
            if not self._accepting or not self._thread.is_alive():
                raise ServerUnavailableError("the server is shutting down; the write was not recorded")
            try:
                self._queue.put_nowait(_Job(kind, args, future))
            except queue.Full:
                raise ServerUnavailableError(f"the write queue is full ({self.config.queue_size} writes waiting); "
                                             "retry later") from None
        return future

    def submit_feedback(self, selection_id: str, reward: float) -> concurrent.futures.Future[Any]:
        return self._submit("feedback", {"selection_id": selection_id, "reward": reward})

    def submit_case(self, state: str, action: str, reward: float, env: str | None = None,
                    meta: dict[str, Any] | None = None, embedding: Any = None) -> concurrent.futures.Future[Any]:
        args = {"state": state, "action": action, "reward": reward, "env": env, "meta": meta}
        if embedding is not None:  # else the selector encodes the state
            args["embedding"] = embedding
        return self._submit("case", args)

    def _run(self) -> None:
        thread_limiter(self.config.threads)()
        poll = 0.5
        if self.config.save_every_s:
            poll = min(poll, self.config.save_every_s)
        while True:
            try:
                job = self._queue.get(timeout=poll)
            except queue.Empty:
                self._maybe_save()
                continue
            if job is None:  # stop(): everything queued before the sentinel is done
                break
            self._do(job)
            self._maybe_save()
        self._save("shutdown")
        self._stopped.set()

    def _do(self, job: _Job) -> None:
        if not job.future.set_running_or_notify_cancel():
            return
        try:
            if job.kind == "feedback":
                result = self.selector.feedback(job.args["selection_id"], job.args["reward"])
                self.counts["feedback"] += 1
            else:
                result = self.selector.add_case(**job.args)
                self.counts["cases"] += 1
        except BaseException as error:  # noqa: BLE001 - handed to the waiting request, never lost
            self.counts["errors"] += 1
            job.future.set_exception(error)
            return
        self._unsaved += 1
        job.future.set_result(result)

    def _maybe_save(self) -> None:
        if not self._unsaved:
            return
        c = self.config
        due_n = c.save_every_n and self._unsaved >= c.save_every_n
        due_s = c.save_every_s and self._clock() - self._last_save >= c.save_every_s
        if due_n or due_s:
            self._save("periodic")

    def _save(self, why: str) -> None:
        if not self._unsaved:  # nothing written since the last checkpoint (a large bank is not rewritten for nothing)
            return
        t0 = time.perf_counter()
        try:
            path = self.selector.save()
        except Exception as error:  # a failed checkpoint must not stop the writes; the facts are in SQLite
            self.counts["save_errors"] += 1
            self.last_save_error = f"{type(error).__name__}: {error}"
            logger.exception("checkpoint (%s) failed", why)
            return
        self.counts["saves"] += 1
        self._unsaved = 0
        self._last_save = self._clock()
        self.last_save_time = time.time()
        self.last_save_error = None
        logger.info("checkpoint (%s) saved to %s in %.2f s", why, path, time.perf_counter() - t0)

    def stop(self, timeout: float | None = None) -> None:
        """Refuse new writes, finish the queued ones, save, and join the thread."""
        with self._submit_lock:
            first = self._accepting
            self._accepting = False
        if first and self._thread.is_alive():
            self._queue.put(None)  # blocks only while the queue is full, i.e. until the writer makes room
        if self._thread.is_alive():
            self._thread.join(timeout)

    def stats(self) -> dict[str, Any]:
        return {"queued": self.queued, "recorded_feedback": self.counts["feedback"],
                "recorded_cases": self.counts["cases"], "write_errors": self.counts["errors"],
                "saves": self.counts["saves"], "save_errors": self.counts["save_errors"],
                "unsaved_writes": self._unsaved, "last_save_time": self.last_save_time,
                "last_save_error": self.last_save_error, "accepting": self._accepting and self.running}


# ---------------------------------------------------------------- auth and host checks


def is_loopback(host: str) -> bool:
    """Whether ``host`` names the loopback interface (127.0.0.0/8, ::1 or ``localhost``)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_host(host: str, *, no_auth: bool) -> None:
    """``--no-auth`` is allowed only on a loopback host."""
    if no_auth and not is_loopback(host):
        raise ConfigError(f"--no-auth is only allowed on a loopback host (127.0.0.1, ::1, localhost), "
                          f"not --host {host}; set {TOKEN_ENV} or pass --token-file")


def resolve_token(*, token_file: str | Path | None = None, no_auth: bool = False,
                  environ: Mapping[str, str] | None = None) -> str | None:
    """The bearer token: from ``token_file`` when given, else ``$MEMENTO_SERVE_TOKEN``; ``None`` with ``no_auth``.

    The token must be at least 16 characters (surrounding whitespace, e.g. the file's newline, is
    stripped). Without a token and without ``no_auth`` this raises a ConfigError saying how to give one.
    """
    env: Mapping[str, str] = os.environ if environ is None else environ
    if no_auth:
        if token_file is not None:
            raise ConfigError("--no-auth and --token-file exclude each other")
        if env.get(TOKEN_ENV):
            logger.warning("--no-auth: ignoring $%s", TOKEN_ENV)
        return None
    if token_file is not None:
        path = Path(token_file)
        try:
            token = path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as error:
            raise ConfigError(f"--token-file {path}: cannot read it ({error.__class__.__name__}: {error})") from None
        where = f"--token-file {path}"
        with contextlib.suppress(OSError):
            if path.stat().st_mode & 0o077:
                logger.warning("%s is readable by other users (chmod 600 it)", path)
    elif env.get(TOKEN_ENV) is not None:
        token, where = env[TOKEN_ENV].strip(), f"${TOKEN_ENV}"
    else:
        raise ConfigError(f"no token: set {TOKEN_ENV} or pass --token-file FILE "
                          "(or --no-auth, allowed on a loopback host only)")
    if len(token) < MIN_TOKEN_CHARS or any(c.isspace() for c in token):
        raise ConfigError(f"{where}: the token must be at least {MIN_TOKEN_CHARS} characters without whitespace "
                          f"(got {len(token)}); e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))'")
    return token


def token_matches(header: str | None, token: str) -> bool:
    """Constant-time check of an ``Authorization: Bearer ...`` header against the token."""
    if not header:
        return False
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.strip().encode("utf-8"), token.encode("utf-8"))


def require_extra(extra: Literal["serve", "mcp"]) -> None:
    """Raise a one-line MementoError naming the pip command when an optional extra is missing."""
    modules = {"serve": ("fastapi", "uvicorn"), "mcp": ("mcp",)}[extra]
    for name in modules:
        try:
            __import__(name)
        except ImportError:
            raise MementoError(f"memento {extra} needs the '{extra}' extra ({name} is not installed): "
                               f"pip install 'memento[{extra}]'") from None


# ---------------------------------------------------------------- app and server


def create_app(selector: Any, *, token: str | None, max_body_bytes: int | None = None,
               config: ServeConfig | None = None, writer: Writer | None = None) -> Any:
    """The FastAPI app serving ``selector``; ``token=None`` disables auth.

    When no ``writer`` is given the app starts its own on startup and stops it (drain + save) on
    shutdown; a given writer is left to its owner.
    """
    require_extra("serve")
    from memento._serve_http import build_app

    config = config or ServeConfig()
    if max_body_bytes is not None:
        config = dataclasses.replace(config, max_body_bytes=max_body_bytes)
    return build_app(selector, token=token, config=config, writer=writer)


def _json_safe(value: Any) -> Any:
    """``value`` with numpy scalars/arrays, tuples and paths turned into plain JSON types (NaN -> None)."""
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "tolist"):  # numpy scalar or array
        return _json_safe(value.tolist())
    return str(value)


def _bind(host: str, port: int) -> socket.socket:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, socktype, proto, _, address = infos[0]
    sock = socket.socket(family, socktype, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as error:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None
    sock.set_inheritable(True)
    return sock


@contextlib.contextmanager
def _quiet_signals(server: Any) -> Iterator[None]:
    """uvicorn's signal capture, without re-raising the signal after the graceful shutdown (we exit 0)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    handled = (signal.SIGINT, signal.SIGTERM)
    original = {sig: signal.signal(sig, server.handle_exit) for sig in handled}
    try:
        yield
    finally:
        for sig, handler in original.items():
            signal.signal(sig, handler)


def serve(path: str | Path, *, host: str = "127.0.0.1", port: int = 8080, token: str | None = None,
          no_auth: bool = False, learn: bool = False, device: str | None = None, config: ServeConfig | None = None,
          seed: int = 0, log_level: str = "warning", access_log: bool = False,
          on_ready: Callable[[str, int], None] | None = None) -> int:
    """Load the selector at ``path`` and serve it until SIGTERM/SIGINT; returns the exit status (0).

    ``token`` is required unless ``no_auth`` (loopback hosts only). ``port=0`` picks a free port;
    ``on_ready(host, port)`` is called once the socket listens (the CLI prints the address).
    """
    require_extra("serve")
    check_host(host, no_auth=no_auth)
    if token is None and not no_auth:
        raise ConfigError(f"no token: set {TOKEN_ENV} or pass --token-file FILE")
    if no_auth:
        token = None
    config = config or ServeConfig()
    import uvicorn

    from memento import load_selector

    t0 = time.perf_counter()
    selector = load_selector(path, device=device, learn=learn, seed=seed)
    logger.info("loaded the selector %s in %.2f s", path, time.perf_counter() - t0)
    writer = Writer(selector, config).start()
    try:
        app = create_app(selector, token=token, config=config, writer=writer)
        sock = _bind(host, port)
        bound_port = sock.getsockname()[1]
        uv_config = uvicorn.Config(app, log_level=log_level, access_log=access_log, lifespan="on",
                                   timeout_graceful_shutdown=math.ceil(config.graceful_timeout_s),
                                   server_header=False)
        server = uvicorn.Server(uv_config)
        server.capture_signals = lambda: _quiet_signals(server)  # type: ignore[method-assign]
        if on_ready is not None:
            on_ready(host, bound_port)
        try:
            server.run(sockets=[sock])
        finally:
            sock.close()
        if server._captured_signals:  # noqa: SLF001 - uvicorn keeps no public record of the signal
            names = ", ".join(signal.Signals(s).name for s in server._captured_signals)  # noqa: SLF001
            logger.info("stopped by %s", names)
    finally:
        writer.stop()  # drain + save (again a no-op when the app's shutdown already did it)
        selector.close()
    stats = writer.stats()
    if stats["save_errors"] and stats["last_save_error"]:
        print(f"memento serve: the last checkpoint failed: {stats['last_save_error']}", file=sys.stderr)
        return 1
    return 0
