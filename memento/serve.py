"""``memento serve``: an HTTP service around a loaded :class:`~memento.selector.Selector`.

Endpoints (JSON; every one but ``/healthz`` and the OpenAPI spec needs ``Authorization: Bearer TOKEN``)::

    POST /v1/select     {query | embedding, k, mode, env}            -> the selection (ids, cases, probs, selection_id)
    POST /v1/feedback   {selection_id, reward}                       -> {selection_id, reward, recorded, updates}
    POST /v1/cases      {state, action, reward, env?, meta?, embedding?} -> {id}
    GET  /v1/cases/{id}                                              -> the case (404 when unknown)
    GET  /v1/stats                                                   -> selector counts + server counters
    GET  /healthz                                                    -> {"status": "ok"} (no auth)
    GET  /openapi.json                                               -> the OpenAPI spec (no auth)

Concurrency and durability. Selections run in parallel in the server's thread pool (the Selector's
reads share its reader-writer lock; a write holds it alone). Query texts are encoded outside that lock
by one dynamic batcher, which groups the texts of concurrent requests into one forward pass
(``ServeConfig.batch_max_texts`` / ``batch_wait_ms``; :mod:`memento.batching`). Writes - feedback and
new cases - go through one bounded queue to a single writer thread, which is also the only thread that
makes the learner update (inside ``Selector.feedback`` when the selector was loaded with ``learn=True``;
selects wait while it writes, then see the new weights). A write is answered
only after the writer's ``Selector.feedback``/``add_case`` returned, i.e. after the fact was
committed to the artifact's SQLite: an acknowledged write survives a crash. The writer also
checkpoints (``Selector.save()``, atomic) every ``save_every_s`` seconds or ``save_every_n``
writes, whichever comes first, and once more on shutdown. SIGTERM or SIGINT stops accepting
connections, lets in-flight requests finish, drains the queue, saves, and exits with status 0.

FastAPI and uvicorn (the ``serve`` extra) are imported only when an app is built or served;
this module itself imports without them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import logging
import math
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

# The config, the writer and the helpers the FastAPI layer shares live one module below both (no import circle);
# they are public here, as before.
from memento._serve_common import ServeConfig, ServerUnavailableError, Writer, thread_limiter
from memento._serve_common import json_safe as _json_safe  # noqa: F401 - memento.mcp_server imports it from here
from memento._serve_common import token_matches as token_matches
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
