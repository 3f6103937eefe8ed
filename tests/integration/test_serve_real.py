"""``memento serve`` for real: a uvicorn subprocess on 127.0.0.1 serving a real exported selector.

- requests without the token (or with a wrong one) get 401, with it 200;
- 16 client threads send 1,000 feedbacks (on the ids of 1,000 earlier selects): every one is answered 200
  and recorded (the selector's counts grow by exactly 1,000), and after a restart the bank, the feedback
  log and the replay buffer hold the same counts;
- SIGTERM (graceful) and SIGKILL (a crash) sent while 16 clients send feedback lose no acknowledged
  feedback: after a restart (loading the artifact again) the recorded feedback is >= the 200 answers the
  clients got.

Clients: stdlib ``http.client`` with keep-alive, one connection per thread (memento.bench.serve).
"""

from __future__ import annotations

import secrets
import shutil
import signal
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from memento import load_selector
from memento.bench.serve import HttpClient, ServerProcess, run_clients
from tests.fuzzing import record, scale
from tests.integration.serve_helpers import QUESTION, make_real_artifact

pytestmark = [pytest.mark.slow, pytest.mark.probe]

TOKEN = secrets.token_urlsafe(24)
N = 1000 * scale()  # feedback requests of the concurrent test (`make probe` sends more)
CLIENTS = 16


@pytest.fixture(scope="module")
def exported(encoder: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_real_artifact(tmp_path_factory.mktemp("serve-real"), encoder)


@pytest.fixture
def artifact(exported: Path, tmp_path: Path) -> Path:
    """A private copy: the server writes to it."""
    return Path(shutil.copytree(exported, tmp_path / "selector"))


def _server(artifact: Path, tmp_path: Path, *args: str, name: str = "serve") -> ServerProcess:
    return ServerProcess(artifact, token=TOKEN, args=[*args],
                         log_path=tmp_path / f"{name}.log")


def _stats(server: ServerProcess) -> dict[str, Any]:
    code, body = HttpClient(server.url, server.headers).request("GET", "/v1/stats")
    assert code == 200, body
    return body


def _select_ids(server: ServerProcess, n: int, dim: int) -> list[str]:
    """``n`` selects by embedding from 16 threads; their selection ids."""
    rng = np.random.default_rng(0)
    states = rng.standard_normal((n, dim)).astype(np.float32)
    states /= np.linalg.norm(states, axis=1, keepdims=True)
    ids: list[str | None] = [None] * n

    def keep(i: int, code: int, body: Any) -> None:
        if code == 200:
            ids[i] = body["selection_id"]

    run = run_clients(server.url, server.headers, CLIENTS,
                      [("POST", "/v1/select", {"embedding": s.tolist(), "k": 4}) for s in states], on_response=keep)
    assert (run["status"] == 200).all(), np.unique(run["status"], return_counts=True)
    assert len(set(ids)) == n
    return [i for i in ids if i is not None]


def _feedback_requests(ids: list[str]) -> list[tuple[str, str, Any]]:
    return [("POST", "/v1/feedback", {"selection_id": s, "reward": float(i % 2)}) for i, s in enumerate(ids)]


def test_token_concurrent_feedback_and_restart(artifact: Path, tmp_path: Path) -> None:
    server = _server(artifact, tmp_path).start()
    try:
        anonymous = HttpClient(server.url)
        assert anonymous.request("GET", "/healthz")[0] == 200
        assert "/v1/select" in anonymous.request("GET", "/openapi.json")[1]["paths"]
        for client in (anonymous, HttpClient(server.url, {"Authorization": f"Bearer {secrets.token_urlsafe(24)}"})):
            assert client.request("POST", "/v1/select", {"query": QUESTION})[0] == 401
            assert client.request("POST", "/v1/feedback", {"selection_id": "x", "reward": 1})[0] == 401
            assert client.request("GET", "/v1/stats")[0] == 401
        client = HttpClient(server.url, server.headers)
        code, chosen = client.request("POST", "/v1/select", {"query": QUESTION, "k": 4})
        assert code == 200, chosen
        assert len(chosen["cases"]) == 4 and all(0.0 < c["prob"] <= 1.0 for c in chosen["cases"])
        assert client.request("POST", "/v1/select", {"query": QUESTION, "k": 0})[0] == 422

        before = _stats(server)
        ids = _select_ids(server, N, before["dim"])
        run = run_clients(server.url, server.headers, CLIENTS, _feedback_requests(ids))
        record(__name__, "requests", len(run["status"]))
        assert (run["status"] == 200).all(), np.unique(run["status"], return_counts=True)
        after = _stats(server)
        assert after["feedbacks"] - before["feedbacks"] == N
        assert after["replay_added"] - before["replay_added"] == N
        assert after["server"]["recorded_feedback"] == N and after["server"]["write_errors"] == 0
        assert client.request("POST", "/v1/feedback", {"selection_id": ids[0], "reward": 1})[0] == 404

        code, added = client.request("POST", "/v1/cases", {"state": "What is the capital of Bolivia?",
                                                           "action": "Sucre", "reward": 1.0, "env": "facts"})
        assert code == 200, added
        code, case = client.request("GET", f"/v1/cases/{added['id']}")
        assert code == 200 and (case["state"], case["action"], case["env"]) == (
            "What is the capital of Bolivia?", "Sucre", "facts")
        assert client.request("GET", "/v1/cases/no-such-case")[0] == 404
        final = _stats(server)
        assert final["cases"] == before["cases"] + 1
    finally:
        code = server.stop()
    assert code == 0, server.log()

    again = _server(artifact, tmp_path, name="restart").start()
    try:
        restarted = _stats(again)
        for key in ("cases", "feedbacks", "replay", "replay_added", "updates"):
            assert restarted[key] == final[key], (key, restarted[key], final[key])
        assert restarted["feedbacks_since_save"] == 0 and restarted["cases_since_save"] == 0  # saved on SIGTERM
        assert HttpClient(again.url, again.headers).request("GET", f"/v1/cases/{added['id']}")[0] == 200
    finally:
        assert again.stop() == 0, again.log()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_a_signal_mid_load_loses_no_acknowledged_feedback(artifact: Path, tmp_path: Path, sig: int) -> None:
    n, kill_after = 400 * scale(), 100 * scale()
    args = ["--save-every-n", "100"] + (["--learn"] if sig == signal.SIGTERM else [])
    server = _server(artifact, tmp_path, *args).start()
    try:
        baseline = _stats(server)
        ids = _select_ids(server, n, baseline["dim"])
        acknowledged = [0]
        lock = threading.Lock()
        sent = threading.Event()

        def count(i: int, code: int, body: Any) -> None:
            with lock:
                acknowledged[0] += code == 200
                if acknowledged[0] >= kill_after and not sent.is_set():
                    sent.set()
                    server.proc.send_signal(sig)  # type: ignore[union-attr]

        run = run_clients(server.url, server.headers, CLIENTS, _feedback_requests(ids), on_response=count)
        code = server.proc.wait(120)  # type: ignore[union-attr]
    finally:
        server.kill()
    statuses = set(np.unique(run["status"]).tolist())
    acked = int((run["status"] == 200).sum())
    assert statuses <= {0, 200, 503}, statuses  # answered, refused while stopping, or never connected
    assert kill_after <= acked < n, acked  # the signal came mid-load
    assert code == (0 if sig == signal.SIGTERM else -signal.SIGKILL), server.log()

    with load_selector(artifact) as selector:  # the restart: load, verify, replay what came after the last save
        after = selector.stats()
    recorded = after["feedbacks"] - baseline["feedbacks"]
    record(__name__, "requests", len(run["status"]))
    record(__name__, "kills", int(sig == signal.SIGKILL))
    record(__name__, "lost", max(0, acked - recorded))
    assert acked <= recorded <= n, (acked, recorded)
    assert after["replay_added"] - baseline["replay_added"] == recorded  # replayed into the buffer on load
    if sig == signal.SIGTERM:
        assert after["feedbacks_since_save"] == 0  # drained and saved on the way out
        assert after["updates"] > baseline["updates"]  # --learn: the writer thread learned
