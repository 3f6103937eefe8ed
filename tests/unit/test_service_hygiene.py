"""Service hygiene of the processes memento starts: the local Ray of ``memento online --workers N``
(:func:`memento.runs.ray.ray_runtime`: confined to this machine, ended with its driver, even a SIGKILLed one).

The Ray tests run a driver in a fresh interpreter (``python -m tests.unit.test_service_hygiene ray READY``: Ray
reads its authentication mode when it is first imported) and read its processes from ``/proc``.
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from memento.runs.ray_watchdog import descendants
from tests.fuzzing import record

ROOT = Path(__file__).resolve().parents[2]
linux = pytest.mark.skipif(not os.path.isdir("/proc/net"), reason="reads /proc (Linux)")


# ---------------------------------------------------------------- /proc helpers


def _listening() -> dict[int, tuple[str, int]]:
    """``{socket inode: (ip, port)}`` of every listening TCP socket of this machine's network namespace."""
    found = {}
    for name, width in (("tcp", 4), ("tcp6", 16)):
        try:
            lines = Path(f"/proc/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] != "0A":  # LISTEN
                continue
            hex_ip, hex_port = fields[1].split(":")
            raw = bytes.fromhex(hex_ip)
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, width, 4))  # host-order 32-bit words
            found[int(fields[9])] = (str(ipaddress.ip_address(raw)), int(hex_port, 16))
    return found


def _sockets_of(pid: int) -> set[int]:
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    except OSError:
        pass
    return inodes


def _alive(pids: dict[int, int]) -> list[int]:
    """The processes of ``pids`` still running (a zombie has exited: only its parent has not collected it)."""
    return [pid for pid, start in pids.items() if _start_time(pid) == start]


def _start_time(pid: int) -> int | None:
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2:].split()
    return None if fields[0] in (b"Z", b"X") else int(fields[19])


# ---------------------------------------------------------------- the local Ray


def _ray_driver(ready: str) -> int:
    """Start a local Ray as ``memento online --workers 2`` does, with one actor, write ``ready`` and wait."""
    from memento.runs.ray import WorkersConfig, ray_runtime

    with ray_runtime(WorkersConfig(workers=2)) as ray:
        @ray.remote(num_cpus=0)
        class Probe:
            def pid(self) -> int:
                return os.getpid()

        probe = Probe.remote()
        actor_pid = ray.get(probe.pid.remote(), timeout=120)
        Path(ready).write_text(json.dumps({"auth": os.environ.get("RAY_AUTH_MODE"), "actor": actor_pid,
                                           "gcs": ray.get_runtime_context().gcs_address}))
        time.sleep(300)
    return 0


def _start_driver(tmp_path: Path) -> tuple[subprocess.Popen[bytes], dict]:
    ready = tmp_path / "ready.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    driver = subprocess.Popen([sys.executable, "-m", "tests.unit.test_service_hygiene", "ray", str(ready)], cwd=ROOT,
                              env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not ready.is_file() or not ready.read_text():
        if driver.poll() is not None or time.monotonic() > deadline:
            driver.kill()
            pytest.fail(f"the Ray driver did not start: {driver.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
        time.sleep(0.1)
    return driver, json.loads(ready.read_text())


def _end(driver: subprocess.Popen[bytes], pids: dict[int, int]) -> None:
    """Clean up whatever a failing test left behind (only the processes it started)."""
    for pid in [driver.pid, *_alive(pids)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    driver.wait(timeout=30)


@linux
@pytest.mark.slow
def test_a_local_ray_listens_on_loopback_or_refuses_who_lacks_its_token(tmp_path):
    driver, info = _start_driver(tmp_path)
    ray_pids = descendants(driver.pid)
    try:
        listening = _listening()
        ports = {pid: [listening[i] for i in _sockets_of(pid) if i in listening] for pid in ray_pids}
        assert any(ports.values())  # Ray does listen (GCS, raylet, workers)
        exposed = [(pid, ip, port) for pid, addrs in ports.items() for ip, port in addrs
                   if not ipaddress.ip_address(ip).is_loopback]
        if exposed:  # Ray's gRPC servers bind every interface (no setting binds them to loopback): a token guards them
            assert info["auth"] == "token", exposed
            host, port = info["gcs"].rsplit(":", 1)
            env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
            env.update(HOME=str(tmp_path), RAY_py_gcs_connect_timeout_s="5", RAY_gcs_rpc_server_connect_timeout_s="5")
            joined = subprocess.run([sys.executable, "-c", "import ray, sys; ray.init(address=sys.argv[1]); "
                                     "print('JOINED')", info["gcs"]], env=env, capture_output=True, timeout=120,
                                    text=True)
            assert "JOINED" not in joined.stdout and joined.returncode != 0, joined.stderr[-2000:]
            assert "Authentication token" in joined.stderr or "auth" in joined.stderr.lower(), joined.stderr[-2000:]
    finally:
        _end(driver, ray_pids)


@linux
@pytest.mark.slow
@pytest.mark.probe
def test_the_processes_of_a_local_ray_end_promptly_when_its_driver_is_killed(tmp_path):
    driver, info = _start_driver(tmp_path)
    ray_pids = descendants(driver.pid)
    try:
        assert info["actor"] in ray_pids and len(ray_pids) >= 4  # the watchdog, GCS, raylet, the actor, ...
        os.kill(driver.pid, signal.SIGKILL)
        record(__name__, "kills")
        driver.wait(timeout=30)
        killed = time.monotonic()
        while _alive(ray_pids) and time.monotonic() - killed < 30:
            time.sleep(0.05)
        survived = time.monotonic() - killed
        left = _alive(ray_pids)
        print(f"the Ray processes outlived their driver by {survived:.2f} s")
        assert not left and survived < 3.0, (survived, [Path(f"/proc/{p}/cmdline").read_bytes()[:80] for p in left])
    finally:
        _end(driver, ray_pids)


# ---------------------------------------------------------------- memento serve: logs, /docs


def test_the_access_log_never_prints_a_token(capsys):
    pytest.importorskip("uvicorn")
    import logging

    import uvicorn

    from memento.serve.common import redact, redact_server_logs

    secret = "s3cret-token-0123456789"
    assert redact(f"/inspect/?token={secret}") == "/inspect/?token=<redacted>"
    assert redact(f"/inspect/bank?q=x&TOKEN={secret}&page=2") == "/inspect/bank?q=x&TOKEN=<redacted>&page=2"
    assert redact("/v1/select?tokens=3") == "/v1/select?tokens=3" and redact("/healthz") == "/healthz"
    uvicorn.Config(lambda scope, receive, send: None, log_level="debug", access_log=True)  # as `serve -vv` does
    redact_server_logs()
    redact_server_logs()  # once is enough: installed a single time
    access = logging.getLogger("uvicorn.access")
    assert sum(type(f).__name__ == "TokenRedactor" for f in access.filters) == 1
    # uvicorn's own access line: the path with its query is an argument of the record
    access.info('%s - "%s %s HTTP/%s" %d', "127.0.0.1:5555", "GET", f"/inspect/?token={secret}", "1.1", 200)
    logging.getLogger("uvicorn.error").debug("scope /inspect/?token=%s", secret)
    out = capsys.readouterr()
    assert secret not in out.out + out.err
    assert "/inspect/?token=<redacted>" in out.out


def test_docs_are_served_only_without_auth():
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from memento.serve.app import create_app
    from tests.unit.test_serve import TOKEN, FakeSelector

    with TestClient(create_app(FakeSelector(), token=TOKEN)) as c:
        for path in ("/docs", "/redoc", "/docs/oauth2-redirect"):
            assert c.get(path).status_code == 404, path
            assert c.get(path, headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 404, path
        assert "/v1/select" in c.get("/openapi.json").json()["paths"]  # the spec: public, no data in it
    with TestClient(create_app(FakeSelector(), token=None)) as c:  # --no-auth: loopback only, all open anyway
        assert c.get("/docs").status_code == 200


# ---------------------------------------------------------------- memento serve: socket directories


def test_the_next_learner_removes_the_socket_directories_of_dead_learners_only(tmp_path):
    from memento.serve.app import sweep_socket_dirs

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f"memento-serve-{dead.pid}-abc"
    (stale / "sub").mkdir(parents=True)
    (stale / "learner.sock").write_text("")
    live = tmp_path / f"memento-serve-{os.getppid()}-def"  # a running process's (this test's parent)
    mine = tmp_path / f"memento-serve-{os.getpid()}-ghi"
    legacy = tmp_path / "memento-serve-k2j4h5"  # no pid in the name: never guessed at
    other = tmp_path / "unrelated-123-x"
    for path in (live, mine, legacy, other):
        path.mkdir()
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "keep").write_text("x")
    link = tmp_path / f"memento-serve-{dead.pid}-link"
    link.symlink_to(target)  # a link is never followed
    assert sweep_socket_dirs(tmp_path) == [stale]
    assert not stale.exists()
    assert all(p.exists() for p in (live, mine, legacy, other, link)) and (target / "keep").exists()
    assert sweep_socket_dirs(tmp_path / "missing") == []


if __name__ == "__main__":
    if sys.argv[1] == "ray":
        sys.exit(_ray_driver(sys.argv[2]))
