"""Feedback after a restart, through the real server: ``memento serve`` in a subprocess (tests/integration/
serve_helpers.py's artifact, built with the hashing encoder: selects go by embedding, no model to load).

Selections are made over HTTP, one of them answered, then the server is stopped with SIGTERM (graceful:
drain, save) or SIGKILL (a crash, right after the answers came back). A new server on the same artifact
accepts the feedback for every other selection (200, recorded, learned from with ``--learn``), refuses
the answered one (404), and its pending count is what was left.
"""

from __future__ import annotations

import secrets
import shutil
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from memento.bench.serve import HttpClient, ServerProcess
from memento.selector.pending import PENDING_NAME
from tests.fuzzing import record
from tests.integration.serve_helpers import make_real_artifact
from tests.loop_env import HashingEncoder

pytestmark = pytest.mark.slow

TOKEN = secrets.token_urlsafe(24)
N = 12


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_real_artifact(tmp_path_factory.mktemp("serve-restart"), HashingEncoder())


def _server(artifact: Path, tmp_path: Path, name: str) -> ServerProcess:
    return ServerProcess(artifact, token=TOKEN, args=["--learn"], log_path=tmp_path / f"{name}.log").start()


def _stats(client: HttpClient) -> dict[str, Any]:
    code, body = client.request("GET", "/v1/stats")
    assert code == 200, body
    return body


def _stopped_by(sig: int, code: int | None, server: ServerProcess) -> None:
    """The server ended as ``sig`` makes it end (SIGTERM: drained, exit 0), counted for ``make probe``."""
    assert code == (0 if sig == signal.SIGTERM else -signal.SIGKILL), server.log()
    record(__name__, "kills", int(sig == signal.SIGKILL))


@pytest.mark.probe
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_feedback_for_selections_made_before_a_restart(exported: Path, tmp_path: Path, sig: int) -> None:
    artifact = Path(shutil.copytree(exported, tmp_path / "selector"))
    server = _server(artifact, tmp_path, "before")
    try:
        client = HttpClient(server.url, server.headers)
        before = _stats(client)
        rng = np.random.default_rng(0)
        states = rng.standard_normal((N, before["dim"])).astype(np.float32)
        states /= np.linalg.norm(states, axis=1, keepdims=True)
        chosen = []
        for state in states:
            code, body = client.request("POST", "/v1/select", {"embedding": state.tolist(), "k": 4})
            assert code == 200, body
            chosen.append(body)
        code, body = client.request("POST", "/v1/feedback", {"selection_id": chosen[0]["selection_id"], "reward": 1})
        assert code == 200 and body["recorded"], body
        assert _stats(client)["pending"] == N - 1
        client.close()
        code = server.stop(sig)
    finally:
        server.kill()
    _stopped_by(sig, code, server)
    assert (artifact / PENDING_NAME).is_file()

    again = _server(artifact, tmp_path, "after")
    try:
        client = HttpClient(again.url, again.headers)
        restarted = _stats(client)
        assert restarted["pending"] == N - 1 and restarted["feedbacks"] == before["feedbacks"] + 1
        code, body = client.request("POST", "/v1/feedback", {"selection_id": chosen[0]["selection_id"], "reward": 1})
        assert code == 404, body  # answered before the restart: never twice
        for i, selection in enumerate(chosen[1:]):
            code, body = client.request("POST", "/v1/feedback",
                                        {"selection_id": selection["selection_id"], "reward": float(i % 2)})
            assert code == 200 and body["recorded"], body
        after = _stats(client)
        assert after["pending"] == 0 and after["feedbacks"] == before["feedbacks"] + N
        assert after["replay_added"] == before["replay_added"] + N
        assert after["updates"] > restarted["updates"]  # --learn: learned from the selections made before
        client.close()
    finally:
        assert again.stop() == 0, again.log()


@pytest.mark.probe
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_lifecycle_writes_answered_before_a_kill_survive_it(exported: Path, tmp_path: Path, sig: int) -> None:
    """Two tenants' cases, an update in place, a delete by scope: each answered, then the server is stopped or
    killed. A new server finds every answered write: the update (same id, version 2), bob's cases gone (404, a
    count of 0), alice's untouched, their history, and an artifact that verifies."""
    from memento.selector.export import verify

    artifact = Path(shutil.copytree(exported, tmp_path / "selector"))
    server = _server(artifact, tmp_path, "before")
    try:
        client = HttpClient(server.url, server.headers)
        dim = _stats(client)["dim"]
        rng = np.random.default_rng(1)
        ids: dict[str, list[str]] = {"alice": [], "bob": []}
        for i in range(6):
            user = "alice" if i % 2 == 0 else "bob"
            vector = rng.standard_normal(dim)
            code, body = client.request("POST", "/v1/cases", {
                "state": f"the same question {i // 2}", "action": f"{user}'s answer", "reward": 1,
                "embedding": (vector / np.linalg.norm(vector)).tolist(), "user_id": user, "meta": {"n": i}})
            assert code == 200, body
            ids[user].append(body["id"])
        code, body = client.request("PATCH", f"/v1/cases/{ids['alice'][0]}", {"action": "alice's new answer"})
        assert code == 200 and body["version"] == 2, body
        code, body = client.request("DELETE", "/v1/cases?user=bob")
        assert code == 200 and body["deleted"] == 3, body
        client.close()
        code = server.stop(sig)
    finally:
        server.kill()
    _stopped_by(sig, code, server)

    again = _server(artifact, tmp_path, "after")
    try:
        client = HttpClient(again.url, again.headers)
        code, body = client.request("GET", f"/v1/cases/{ids['alice'][0]}")
        assert code == 200 and body["action"] == "alice's new answer" and body["version"] == 2, body
        for case_id in ids["alice"][1:]:
            code, body = client.request("GET", f"/v1/cases/{case_id}")
            assert code == 200 and body["action"] == "alice's answer" and body["user"] == "alice", body
        for case_id in ids["bob"]:
            assert client.request("GET", f"/v1/cases/{case_id}")[0] == 404
        assert client.request("GET", "/v1/cases/count?user=bob") == (200, {"count": 0})
        assert client.request("GET", "/v1/cases/count?user_id=alice") == (200, {"count": 3})
        code, body = client.request("GET", f"/v1/cases/{ids['alice'][0]}/history")
        assert code == 200 and [e["event"] for e in body["events"]] == ["add", "update"], body
        client.close()
    finally:
        assert again.stop() == 0, again.log()
    assert verify(artifact)["cases"] >= 6  # raises a one-line CheckpointError if anything is damaged
