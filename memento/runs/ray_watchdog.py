"""The watchdog of a local Ray started by :func:`memento.runs.ray.ray_runtime` (``python -I .../ray_watchdog.py
DRIVER_PID``, run as a file so that it starts without importing memento; not a public entry point).

A driver killed with SIGKILL cannot shut its Ray down, and Ray's own processes notice a dead driver late (its
agents outlived one by 15 s and more). The watchdog, started in its own session right after ``ray.init``, reads
its stdin, whose other end only the driver holds, and every :data:`POLL_S` seconds notes the driver's descendants
started since the watchdog itself (the Ray processes: GCS, raylet, agents, workers; each by pid *and* start
time, so a reused pid is never hit). When stdin reaches end-of-file without the word ``stop`` first (the driver
died, however it died), it sends SIGTERM to every process it noted, SIGKILL after :data:`GRACE_S` to what is
left, and exits. A driver that shuts Ray down itself writes ``stop`` first. Linux (``/proc``) only; elsewhere
the watchdog only waits for its stdin to close. Only the standard library: it starts in a fraction of a second.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time

POLL_S = 0.2
"""Seconds between two scans of the driver's descendants."""

GRACE_S = 0.5
"""Seconds between SIGTERM and SIGKILL of the processes left."""


def _stat(pid: int) -> tuple[int, int] | None:
    """``(parent pid, start time in clock ticks)`` of ``pid``, or ``None`` when it is gone (or a zombie: it has
    exited, its new parent has not collected it yet)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2:].split()  # the name, in parentheses, may hold spaces
    if fields[0] in (b"Z", b"X"):
        return None
    return int(fields[1]), int(fields[19])


def descendants(root: int, *, since: int = 0) -> dict[int, int]:
    """``{pid: start time}`` of the processes below ``root`` started at or after ``since`` (clock ticks)."""
    parents: dict[int, list[int]] = {}
    starts: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            stat = _stat(int(name))
            if stat is not None:
                parents.setdefault(stat[0], []).append(int(name))
                starts[int(name)] = stat[1]
    found: dict[int, int] = {}
    todo = list(parents.get(root, []))
    while todo:
        pid = todo.pop()
        if pid in found:
            continue
        found[pid] = starts.get(pid, 0)
        todo.extend(parents.get(pid, []))
    return {pid: start for pid, start in found.items() if start >= since}


def _alive(noted: dict[int, int]) -> dict[int, int]:
    alive = {}
    for pid, start in noted.items():
        stat = _stat(pid)
        if stat is not None and stat[1] == start:
            alive[pid] = start
    return alive


def _signal(noted: dict[int, int], sig: int) -> None:
    for pid in _alive(noted):
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def end(noted: dict[int, int], grace_s: float = GRACE_S) -> None:
    """SIGTERM the noted processes still alive, SIGKILL what is left after ``grace_s``."""
    _signal(noted, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while _alive(noted) and time.monotonic() < deadline:
        time.sleep(0.05)
    _signal(noted, signal.SIGKILL)


def main(argv: list[str]) -> int:
    driver = int(argv[0])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C of the driver's terminal is the driver's to handle
    proc = os.path.isdir("/proc")
    own = _stat(os.getpid()) if proc else None
    since = own[1] if own is not None else 0
    noted: dict[int, int] = {}
    received = b""
    while True:
        ready, _, _ = select.select([0], [], [], POLL_S)
        if proc:
            noted.update({pid: start for pid, start in descendants(driver, since=since).items()
                          if pid != os.getpid()})
        if not ready:
            continue
        chunk = os.read(0, 4096)
        if chunk:
            received += chunk
            continue
        if b"stop" in received:
            return 0
        end(noted)
        return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
