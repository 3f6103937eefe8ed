"""``memento serve``: an HTTP service around a loaded :class:`~memento.selector.runtime.Selector`.

Endpoints (JSON; every one but ``/healthz`` and the OpenAPI spec needs ``Authorization: Bearer TOKEN``)::

    POST /v1/select     {query | embedding, k, mode, env}            -> the selection (ids, cases, probs, selection_id)
    POST /v1/feedback   {selection_id, reward}                       -> {selection_id, reward, recorded, updates}
    POST /v1/cases      {state, action, reward, env?, meta?, embedding?, user?, agent?, session?} -> {id}
                        (stored content with other meta: that case's meta is updated in place, same id)
    GET  /v1/cases?env&user&agent&session&filter&limit&offset        -> {cases, limit, offset} (live cases only)
    GET  /v1/cases/count?env&user&agent&session&filter               -> {count}
    GET  /v1/cases/{id}                                              -> the case with its version, created and
                                                                        updated (404 when unknown, deleted or replaced)
    GET  /v1/cases/{id}/history                                      -> {id, events: [{event, time, ...}]}: add,
                                                                        update, replace, delete, feedback
    PATCH /v1/cases/{id} {action?, reward?, meta?}                   -> the case, changed in place (same id,
                                                                        version + 1; a new state is refused: PUT)
    PUT  /v1/cases/{id} {state, action, reward, env?, meta?, embedding?, user?, agent?, session?}
                                                                     -> {id (new), replaced}; the new case keeps the
                                                                        old one's user/agent/session and meta unless
                                                                        given
    DELETE /v1/cases/{id}                                            -> {id, deleted, replay_slots_masked}
    DELETE /v1/cases?env&user&agent&session&filter&all               -> {deleted, replay_slots_masked}: the cases of a
                                                                        scope or filter (one is required, or all=true)
    GET  /v1/stats                                                   -> selector counts + server counters
    GET  /healthz                                                    -> {"status": "ok"} (no auth): liveness
    GET  /readyz                                                     -> 200 once warmed up, 503 before (no auth)
    GET  /openapi.json                                               -> the OpenAPI spec (no auth: no data in it)
    GET  /docs                                                       -> Swagger UI, only with --no-auth

A scope in a query string is ``user``, ``agent``, ``session`` or mem0's ``user_id``, ``agent_id``, ``run_id``;
``GET /v1/cases`` and ``GET /v1/cases/count`` also take ``include_global=true`` (the cases without any owner too).
``/docs`` is not served when a token is set (Swagger UI loads its scripts from a CDN and takes the token in a
form); the spec it shows is ``/openapi.json``, public because it holds the API's shape and no data. The
inspector under ``/inspect`` takes the same token. No verbosity logs a token: ``?token=`` values in logged URLs
are written ``?token=<redacted>`` (:class:`memento.serve.common.TokenRedactor`).

Readiness and the access log. On start the app runs one untracked greedy select in the background
(``ServeConfig.warmup``; nothing is written): it loads and runs the encoder, the index and the Q-network, so
the first real select is not the slow one. ``/healthz`` (liveness) answers 200 at once; ``/readyz`` answers 503
(``Retry-After: 1``) until the warm-up select returned, then 200 (``memento serve --no-warmup``: at once).
Every request is logged once answered, at INFO on the logger ``memento.serve.access`` (``memento -v serve``):
``METHOD PATH STATUS DURATION ms``, with ``?token=`` redacted.

Concurrency and durability. Selections run in parallel in the server's thread pool (the Selector's
reads share its reader-writer lock; a write holds it alone). Query texts are encoded outside that lock
by one dynamic batcher, which groups the texts of concurrent requests into one forward pass
(``ServeConfig.batch_max_texts`` / ``batch_wait_ms``; :mod:`memento.selector.batching`). Writes - feedback and
new cases - go through one bounded queue to a single writer thread, which is also the only thread that
makes the learner update (inside ``Selector.feedback`` when the selector was loaded with ``learn=True``;
selects wait while it writes, then see the new weights). A write is answered
only after the writer's ``Selector.feedback``/``add_case`` returned, i.e. after the fact was
committed to the artifact's SQLite: an acknowledged write survives a crash. The writer also
checkpoints (``Selector.save()``, atomic) every ``save_every_s`` seconds or ``save_every_n``
writes, whichever comes first, and once more on shutdown. SIGTERM or SIGINT stops accepting
connections, lets in-flight requests finish, drains the queue, saves, and exits with status 0.

Several processes (``workers`` > 1, ``memento serve --workers N``). This process stays the learner and
serves as above; it binds the listening socket once and starts ``workers - 1`` worker processes
(``python -m memento.serve.worker``, not forked) that accept on the same socket. A worker loads the artifact
read-only (``Selector.load(read_only=True)``, seed ``seed + index``), answers selects and reads itself, and
forwards feedback and new cases to the learner over a private Unix socket (a 0700 temporary directory),
answering with the learner's status and body: the single writer, "answered once committed" and the feedback
log are unchanged. Its selections go to the shared ``.pending.sqlite``, where the learner's feedback finds
them. The learner publishes its Q-network (``.policy.safetensors``) at most every ``publish_every_s`` after
it changed and at every checkpoint; a worker loads it, and the cases added since, at its next select.
A worker exits when the learner's pipe to it closes (the learner died, SIGKILL included: measured 0.2-0.4 s),
and then removes the learner's private directory; a learner starting later also removes the directories
(``memento-serve-<pid>-*``) of learners no longer running. SIGTERM/SIGINT of the learner stops the workers
first (their forwarded writes still reach it; each exits within about a second), then the learner drains,
saves and exits. A worker that dies while serving is noticed within 0.2 s: one ERROR line, and a new worker
takes its place (``MAX_WORKER_RESTARTS`` = 3 within ``RESTART_WINDOW_S`` = 300 s); one more death stops the
server (an ERROR line, exit status 1).

FastAPI and uvicorn (the ``serve`` extra) are imported only when an app is built or served;
this module itself imports without them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import json
import logging
import math
import os
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

from memento.errors import ConfigError, MementoError
from memento.extras import require

# The config, the writer and the helpers the FastAPI layer shares live one module below both (no import circle);
# they are public here, as before.
from memento.serve.common import (
    LearnerLink,
    ServeConfig,
    ServerUnavailableError,
    Writer,
    redact_server_logs,
    thread_limiter,
)
from memento.serve.common import token_matches as token_matches

__all__ = [
    "TOKEN_ENV",
    "LearnerLink",
    "ServeConfig",
    "ServerUnavailableError",
    "Writer",
    "check_host",
    "create_app",
    "is_loopback",
    "quiet_signals",
    "require_extra",
    "resolve_token",
    "serve",
    "thread_limiter",
]

logger = logging.getLogger(__name__)

TOKEN_ENV = "MEMENTO_SERVE_TOKEN"
MIN_TOKEN_CHARS = 16


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


def require_extra(extra: Literal["serve", "mcp"], command: str | None = None) -> None:
    """:func:`memento.extras.require` for the command ``memento COMMAND`` (default: ``extra``)."""
    require(extra, what=f"memento {command or extra}")


# ---------------------------------------------------------------- app and server


def create_app(selector: Any, *, token: str | None, max_body_bytes: int | None = None,
               config: ServeConfig | None = None, writer: Writer | None = None,
               process: dict[str, Any] | None = None) -> Any:
    """The FastAPI app serving ``selector``; ``token=None`` disables auth.

    When no ``writer`` is given the app starts its own on startup and stops it (drain + save) on
    shutdown; a given writer is left to its owner.
    """
    require_extra("serve")
    from memento.serve.http import build_app

    config = config or ServeConfig()
    if max_body_bytes is not None:
        config = dataclasses.replace(config, max_body_bytes=max_body_bytes)
    return build_app(selector, token=token, config=config, writer=writer, process=process)


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
def quiet_signals(server: Any, pool: _WorkerPool | None = None) -> Iterator[None]:
    """uvicorn's signal capture, without re-raising the signal after the graceful shutdown (we exit 0).

    With worker processes (``pool``) the first signal stops them first, in a thread, while this process
    still answers (the writes they forward in their last requests reach the writer), then the server."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    handled = (signal.SIGINT, signal.SIGTERM)
    handler = server.handle_exit
    if pool is not None:
        def handler(sig: int, frame: Any) -> None:
            if pool.stopping:
                server.handle_exit(sig, frame)
                return
            threading.Thread(target=lambda: (pool.stop(), server.handle_exit(sig, None)),
                             name="memento-stop-workers", daemon=True).start()
    original = {sig: signal.signal(sig, handler) for sig in handled}
    try:
        yield
    finally:
        for sig, handler in original.items():
            signal.signal(sig, handler)


SOCKET_DIR_PREFIX = "memento-serve-"
"""The learner's private directory is ``$TMPDIR/memento-serve-<learner pid>-<random>`` (mode 0700)."""

WORKER_WATCH_S = 0.2
"""Seconds between two checks of the learner that its workers still run."""

MAX_WORKER_RESTARTS = 3
"""Worker deaths tolerated within :data:`RESTART_WINDOW_S` (each restarted); one more stops the server with status 1."""

RESTART_WINDOW_S = 300.0


def _pid_gone(pid: int) -> bool:
    """Whether no process ``pid`` runs (a zombie has exited too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # another user's process: it runs
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state in (b"Z", b"X")


def sweep_socket_dirs(tmpdir: str | Path | None = None) -> list[Path]:
    """Remove the private directories of learners that died without removing theirs (SIGKILL, a crash): this
    user's ``memento-serve-<pid>-*`` directories whose learner ``pid`` no longer runs. Returns those removed."""
    root = Path(tmpdir if tmpdir is not None else tempfile.gettempdir())
    removed: list[Path] = []
    try:
        entries = list(root.iterdir())
    except OSError:
        return removed
    uid = os.getuid() if hasattr(os, "getuid") else None
    for entry in entries:
        name = entry.name
        if not name.startswith(SOCKET_DIR_PREFIX):
            continue
        pid_text = name[len(SOCKET_DIR_PREFIX):].split("-", 1)[0]
        if not pid_text.isdigit() or int(pid_text) == os.getpid():
            continue
        try:
            info = entry.lstat()
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode) or (uid is not None and info.st_uid != uid):
            continue  # never follow a link, never touch another user's directory
        if _pid_gone(int(pid_text)):
            shutil.rmtree(entry, ignore_errors=True)
            if not entry.exists():
                removed.append(entry)
                logger.info("removed %s (its learner, pid %s, is gone)", entry, pid_text)
    return removed


class _WorkerPool:
    """The worker processes of ``memento serve --workers N`` (see the module docstring)."""

    def __init__(self, path: Path, *, config: ServeConfig, token: str | None, device: str | None, seed: int,
                 log_level: str, access_log: bool, on_failure: Callable[[], None] | None = None):
        self.path, self.config, self.token, self.device, self.seed = path, config, token, device, seed
        self.log_level, self.access_log = log_level, access_log
        self.procs: list[subprocess.Popen[bytes]] = []
        self.stopping = False
        self.failure: str | None = None
        self.restarts = 0
        self._deaths: list[float] = []
        self._on_failure = on_failure
        self._dir: str | None = None
        self._fd: int | None = None
        self._ready_timeout_s = 600.0
        self._lock = threading.Lock()

    def listen(self) -> socket.socket:
        """The learner's private channel: a Unix socket in a new directory only this user can enter (named after
        this process, so that the next learner removes it if this one dies without doing so)."""
        sweep_socket_dirs()
        self._dir = tempfile.mkdtemp(prefix=f"{SOCKET_DIR_PREFIX}{os.getpid()}-")  # mode 0700
        self.socket_path = os.path.join(self._dir, "learner.sock")
        usock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        usock.bind(self.socket_path)
        usock.listen(512)
        return usock

    def _spawn(self, index: int) -> subprocess.Popen[bytes]:
        assert self._fd is not None
        spec = {"path": str(self.path), "device": self.device, "seed": self.seed + index, "index": index,
                "listen_fd": self._fd, "learner_socket": self.socket_path, "token": self.token,
                "config": dataclasses.asdict(self.config), "log_level": self.log_level,
                "access_log": self.access_log, "torch_threads": _torch_threads(), "learner_pid": os.getpid()}
        proc = subprocess.Popen([sys.executable, "-m", "memento.serve.worker"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, pass_fds=(self._fd,), close_fds=True)
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(spec).encode() + b"\n")  # the token travels here, never in argv or env
        proc.stdin.flush()  # stdin stays open: the worker exits when it closes (this process ended)
        return proc

    @staticmethod
    def _ready(proc: subprocess.Popen[bytes], deadline: float) -> bool:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
        line = proc.stdout.readline() if ready else b""
        proc.stdout.close()
        return line.strip() == b"ready"

    def start(self, sock: socket.socket, timeout_s: float = 600.0) -> None:
        """Start the workers on the listening ``sock``, wait until each loaded the artifact, then watch them."""
        self._fd, self._ready_timeout_s = sock.fileno(), timeout_s
        for index in range(1, self.config.workers):
            self.procs.append(self._spawn(index))
        deadline = time.monotonic() + timeout_s
        for index, proc in enumerate(self.procs, start=1):
            if not self._ready(proc, deadline):
                self.stop(timeout_s=5.0)
                raise MementoError(f"memento serve: worker {index} did not start (exit status {proc.poll()}; "
                                   "see its log above)")
        logger.info("started %d worker process(es): pids %s", len(self.procs), [p.pid for p in self.procs])
        threading.Thread(target=self._watch, name="memento-watch-workers", daemon=True).start()

    def _watch(self) -> None:
        """Notice a worker that died while serving (within :data:`WORKER_WATCH_S`): one ERROR line, and a new
        worker in its place; the (:data:`MAX_WORKER_RESTARTS` + 1)-th death within :data:`RESTART_WINDOW_S` stops
        the server (``on_failure``), which then exits with status 1."""
        while not self.stopping:
            time.sleep(WORKER_WATCH_S)
            for slot in range(len(self.procs)):
                replaced = self._replace_if_dead(slot)
                if replaced is None:
                    continue
                if not self._ready(replaced, time.monotonic() + self._ready_timeout_s) and not self.stopping:
                    self._fail(f"worker {slot + 1} could not be restarted (exit status {replaced.poll()}; see its log "
                               "above); stopping the server")
                    return
                if self.failure is not None:
                    return
                logger.info("worker %d is back (pid %d)", slot + 1, replaced.pid)
            if self.failure is not None:
                return

    def _replace_if_dead(self, slot: int) -> subprocess.Popen[bytes] | None:
        with self._lock:
            proc = self.procs[slot]
            if self.stopping or self.failure is not None or proc.poll() is None:
                return None
            if proc.stdin is not None and not proc.stdin.closed:
                with contextlib.suppress(OSError):
                    proc.stdin.close()
            now = time.monotonic()
            self._deaths = [t for t in self._deaths if now - t < RESTART_WINDOW_S] + [now]
            if len(self._deaths) > MAX_WORKER_RESTARTS:
                self._fail(f"worker {slot + 1} (pid {proc.pid}) exited with status {proc.returncode}, the "
                           f"{len(self._deaths)}th worker death within {RESTART_WINDOW_S:.0f} s; stopping the server")
                return None
            logger.error("worker %d (pid %d) exited with status %s while serving; restarting it (restart %d of at "
                         "most %d within %.0f s)", slot + 1, proc.pid, proc.returncode, len(self._deaths),
                         MAX_WORKER_RESTARTS, RESTART_WINDOW_S)
            self.restarts += 1
            self.procs[slot] = self._spawn(slot + 1)
            return self.procs[slot]

    def _fail(self, message: str) -> None:
        self.failure = message
        logger.error("%s", message)
        if self._on_failure is not None:
            self._on_failure()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def stop(self, timeout_s: float | None = None) -> None:
        """SIGTERM every worker (graceful: in-flight requests finish), wait, SIGKILL what is left."""
        with self._lock:
            self.stopping = True
            for proc in self.procs:
                if proc.poll() is None:
                    with contextlib.suppress(OSError):
                        proc.send_signal(signal.SIGTERM)
            wait = self.config.graceful_timeout_s + 10.0 if timeout_s is None else timeout_s
            deadline = time.monotonic() + wait
            for proc in self.procs:
                try:
                    proc.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    logger.warning("worker pid %d did not stop within %.0f s; killing it", proc.pid, wait)
                    proc.kill()
                    proc.wait()
                if proc.stdin is not None and not proc.stdin.closed:
                    with contextlib.suppress(OSError):
                        proc.stdin.close()
                    if proc.returncode not in (0, None):
                        logger.warning("worker pid %d exited with status %s", proc.pid, proc.returncode)

    def close(self) -> None:
        self.stop(timeout_s=5.0)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)


def _torch_threads() -> int:
    import torch

    return int(torch.get_num_threads())


def serve(path: str | Path, *, host: str = "127.0.0.1", port: int = 8080, token: str | None = None,
          no_auth: bool = False, learn: bool = False, device: str | None = None, config: ServeConfig | None = None,
          seed: int = 0, log_level: str = "warning", access_log: bool = False,
          on_ready: Callable[[str, int], None] | None = None) -> int:
    """Load the selector at ``path`` and serve it until SIGTERM/SIGINT; returns the exit status (0).

    ``token`` is required unless ``no_auth`` (loopback hosts only). ``port=0`` picks a free port;
    ``on_ready(host, port)`` is called once the socket listens (the CLI prints the address); with
    ``config.workers`` > 1, once every worker process loaded the artifact too.
    """
    require_extra("serve")
    check_host(host, no_auth=no_auth)
    if token is None and not no_auth:
        raise ConfigError(f"no token: set {TOKEN_ENV} or pass --token-file FILE")
    if no_auth:
        token = None
    config = config or ServeConfig()
    import uvicorn

    from memento.selector.runtime import Selector

    t0 = time.perf_counter()
    multi = config.workers > 1  # the learner of several processes shares its pending store with the workers
    selector = Selector.load(path, device, learn=learn, seed=seed, shared=multi)
    logger.info("loaded the selector %s in %.2f s", path, time.perf_counter() - t0)
    pool: _WorkerPool | None = None
    if multi:
        selector.publish_policy()  # before any worker loads: never a stale file from an earlier run
    writer = Writer(selector, config, publish=multi).start()
    try:
        sock = _bind(host, port)
        bound_port = sock.getsockname()[1]
        sockets = [sock]
        process = None
        if multi:
            pool = _WorkerPool(selector.path, config=config, token=token, device=device, seed=seed,
                               log_level=log_level, access_log=access_log,
                               on_failure=lambda: setattr(server, "should_exit", True))
            sockets.append(pool.listen())
            process = {"role": "learner", "index": 0, "workers": config.workers}
        app = create_app(selector, token=token, config=config, writer=writer, process=process)
        uv_config = uvicorn.Config(app, log_level=log_level, access_log=access_log, lifespan="on",
                                   timeout_graceful_shutdown=math.ceil(config.graceful_timeout_s),
                                   server_header=False)
        redact_server_logs()  # after uvicorn configured its loggers: never a ?token= in the access log
        server = uvicorn.Server(uv_config)
        server.capture_signals = lambda: quiet_signals(server, pool)  # type: ignore[method-assign]
        try:
            if pool is not None:
                pool.start(sock)
            if on_ready is not None:
                on_ready(host, bound_port)
            server.run(sockets=sockets)
        finally:
            if pool is not None:
                pool.stop()  # a no-op when a signal already stopped them
            for s in sockets:
                s.close()
        if server._captured_signals:  # noqa: SLF001 - uvicorn keeps no public record of the signal
            names = ", ".join(signal.Signals(s).name for s in server._captured_signals)  # noqa: SLF001
            logger.info("stopped by %s", names)
    finally:
        try:
            writer.stop()  # drain + save (again a no-op when the app's shutdown already did it)
        finally:
            if pool is not None:
                pool.close()
            selector.close()
    if pool is not None and pool.failure is not None:
        return 1  # the ERROR line is logged
    stats = writer.stats()
    if stats["save_errors"] and stats["last_save_error"]:
        print(f"memento serve: the last checkpoint failed: {stats['last_save_error']}", file=sys.stderr)
        return 1
    return 0
