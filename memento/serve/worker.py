"""A worker process of ``memento serve --workers N`` (started by :mod:`memento.serve.app`; not a public entry point).

``python -m memento.serve.worker`` reads one JSON line from stdin (the artifact, its seed and index, the
inherited listening socket's fd, the learner's Unix socket, the token, the ServeConfig), loads the artifact
read-only, writes ``ready`` on stdout and serves on the inherited socket until SIGTERM/SIGINT or until its
stdin reaches end-of-file: the learner holds the other end, so the worker exits when the learner dies (and then
removes the learner's private socket directory). It exits within a fraction of a second: after closing its
selector it leaves with ``os._exit`` (the interpreter's own teardown took 6-7 s on 2 busy cores).
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import socket
import sys
import threading
import time
from typing import Any

logger = logging.getLogger("memento.serve.app")


def _watch_parent(server: Any, learner_socket: str, learner_pid: int | None) -> None:
    """Block until stdin closes (the learner exited, however it exited), then stop the server; when the learner
    died (it is no longer this process's parent), remove its private socket directory, which it could not."""
    try:  # the raw fd, not sys.stdin: a daemon thread blocked in a buffered read aborts the interpreter's exit
        while os.read(0, 65536):
            pass
    except OSError:
        pass
    directory = os.path.dirname(learner_socket)
    if learner_pid is not None and os.path.basename(directory).startswith(f"memento-serve-{learner_pid}-"):
        # a dying process closes its files before its children are handed to another parent: wait for that
        deadline = time.monotonic() + 1.0
        while os.getppid() == learner_pid and time.monotonic() < deadline:
            time.sleep(0.02)
        if os.getppid() != learner_pid:  # the learner died: remove its directory (before stopping: os._exit)
            shutil.rmtree(directory, ignore_errors=True)
    if not server.should_exit:
        logger.warning("worker %d: the learner process is gone; stopping", os.getpid())
        server.should_exit = True


def main() -> int:
    line = b""
    while not line.endswith(b"\n"):  # read byte-wise from the raw fd: nothing past the line is buffered
        chunk = os.read(0, 1)
        if not chunk:
            return 1
        line += chunk
    spec = json.loads(line)
    logging.basicConfig(level=spec["log_level"].upper(), stream=sys.stderr,
                        format=f"%(asctime)s memento serve worker {spec['index']}: %(levelname)s %(message)s")
    import torch
    import uvicorn

    from memento.selector.runtime import Selector
    from memento.serve.app import quiet_signals
    from memento.serve.common import LearnerLink, ServeConfig, redact_server_logs
    from memento.serve.http import build_app

    if spec.get("torch_threads"):
        torch.set_num_threads(int(spec["torch_threads"]))
    config = ServeConfig(**spec["config"])
    t0 = time.perf_counter()
    # the learner verified the artifact and recovered any interrupted save; it publishes the weights
    selector = Selector.load(spec["path"], spec["device"], learn=False, seed=int(spec["seed"]), verify=False,
                             read_only=True)
    try:
        selector.sync()
        logger.info("loaded %s read-only in %.2f s (policy version %d)", spec["path"], time.perf_counter() - t0,
                    selector.policy_version)
        link = LearnerLink(spec["learner_socket"], selector, index=int(spec["index"]), workers=config.workers)
        app = build_app(selector, token=spec["token"], config=config, writer=None, link=link)
        sock = socket.socket(fileno=int(spec["listen_fd"]))
        uv_config = uvicorn.Config(app, log_level=spec["log_level"], access_log=bool(spec["access_log"]),
                                   lifespan="on", timeout_graceful_shutdown=math.ceil(config.graceful_timeout_s),
                                   server_header=False)
        redact_server_logs()
        server = uvicorn.Server(uv_config)
        server.capture_signals = lambda: quiet_signals(server)  # type: ignore[method-assign]
        learner_pid = spec.get("learner_pid")
        threading.Thread(target=_watch_parent, args=(server, spec["learner_socket"], learner_pid),
                         name="memento-watch-learner", daemon=True).start()
        os.write(1, b"ready\n")
        os.dup2(2, 1)  # nothing else goes to the learner's pipe
        try:
            server.run(sockets=[sock])
        finally:
            sock.close()
    finally:
        selector.close()
    return 0


def _exit_now(code: int) -> None:
    """Leave without the interpreter's slow teardown (torch, faiss and the request threads took 6-7 s of it on 2
    busy cores): the selector is closed and a worker holds nothing to save. Logs and pipes are flushed first."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


if __name__ == "__main__":
    try:
        status = main()
    except SystemExit as stop:
        status = stop.code if isinstance(stop.code, int) else 1
    except BaseException:
        logger.exception("worker %d failed", os.getpid())
        status = 1
    _exit_now(status)
