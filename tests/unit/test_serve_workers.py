"""``memento serve --workers N`` pieces in one process: the read-only bank and its refresh, the shared pending
store, publishing and loading the learner's weights, and writes forwarded by a worker's app to the learner."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from memento.bank import CaseBank
from memento.errors import BankError, CheckpointError, MementoError, UnknownSelectionError
from memento.selector.pending import PendingSelection, PendingStore
from memento.types import Case

TOKEN = "test-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
DIM = 16


def _unit(rng: np.random.Generator, n: int) -> np.ndarray:
    v = rng.normal(size=(n, DIM)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def _cases(start: int, n: int) -> list[Case]:
    return [Case(state=f"state {i}", action=f"action {i}", reward=float(i % 2)) for i in range(start, start + n)]


# ---------------------------------------------------------------- the bank


def test_read_only_bank_refresh_takes_in_rows_another_connection_added(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    with CaseBank.create(tmp_path / "bank", DIM, index="Flat") as writer:
        writer.add(_cases(0, 10), _unit(rng, 10))
        writer.flush()
        stale = tmp_path / "bank" / ".index.faiss.tmp-999999"
        stale.write_bytes(b"the writer's temporary")
        index_mtime = (tmp_path / "bank" / "index.faiss").stat().st_mtime_ns
        reader = CaseBank.open(tmp_path / "bank", read_only=True)
        assert stale.exists()  # a reader never cleans the writer's temporaries
        assert len(reader) == 10 and reader.refresh() == 0
        new_ND = _unit(rng, 3)
        ids = writer.add(_cases(10, 3), new_ND)
        assert reader.rows_on_disk() == 13 and len(reader) == 10
        assert reader.refresh() == 3 and len(reader) == 13
        _, found = reader.search(new_ND[1], 1)
        assert list(found) == [ids[1]]
        assert reader.get(ids[2]).state == "state 12"
        with pytest.raises(BankError, match="read-only"):
            reader.add(_cases(20, 1), _unit(rng, 1))
        with pytest.raises(BankError, match="read-only"):
            reader.update_reward(ids[0], 0.5)
        reader.close()
        assert (tmp_path / "bank" / "index.faiss").stat().st_mtime_ns == index_mtime  # close wrote nothing


def test_refresh_of_a_trained_index_and_of_an_unloaded_mirror(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    with CaseBank.create(tmp_path / "bank", DIM, index="HNSW8,Flat") as writer:
        writer.add(_cases(0, 40), _unit(rng, 40))
        reader = CaseBank.open(tmp_path / "bank", read_only=True)
        try:
            new_ND = _unit(rng, 5)
            ids = writer.add(_cases(40, 5), new_ND)
            assert reader.refresh() == 5
            assert reader.search(new_ND[4], 1)[1].tolist() == [ids[4]]
            assert reader.ids_at([44]) == [ids[4]]
        finally:
            reader.close()


# ---------------------------------------------------------------- the pending store


def _pending(rng: np.random.Generator) -> PendingSelection:
    return PendingSelection(state_D=_unit(rng, 1)[0], ids=["a"], cases_KD=_unit(rng, 1), probs=[1.0], set_prob=1.0,
                            mode="greedy", policy_version=0, env=None)


@pytest.mark.parametrize("shared", [False, True])
def test_shared_pending_store_never_drops_what_another_process_took(tmp_path: Path, shared: bool) -> None:
    """A worker's store puts, the learner's takes: the worker does not see the deletes. Unshared, its count
    only grows and it drops live selections it believes are beyond the cap; shared, it counts the file."""
    rng = np.random.default_rng(2)
    path = tmp_path / ".pending.sqlite"
    worker = PendingStore.open(path, dim=DIM, shared=shared)
    learner = PendingStore.open(path, dim=DIM, shared=True)
    try:
        for i in range(3):
            worker.put(f"s{i}", _pending(rng), max_pending=3, ttl_s=None)
        for i in range(3):
            assert learner.take(f"s{i}", ttl_s=None) is not None
        learner.take("flush the claimed rows", ttl_s=None)
        worker.put("s3", _pending(rng), max_pending=3, ttl_s=None)
        got = learner.take("s3", ttl_s=None)
        if shared:
            assert got is not None and worker.dropped == 0
        else:
            assert got is None and worker.dropped == 1  # the defect a shared store fixes
    finally:
        worker.close()
        learner.close()


def test_shared_pending_store_enforces_the_cap_over_all_processes(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    path = tmp_path / ".pending.sqlite"
    a = PendingStore.open(path, dim=DIM, shared=True)
    b = PendingStore.open(path, dim=DIM, shared=True)
    try:
        for i in range(4):
            a.put(f"a{i}", _pending(rng), max_pending=6, ttl_s=None)
            b.put(f"b{i}", _pending(rng), max_pending=6, ttl_s=None)
        assert len(a) == len(b) == 8  # neither put near the cap by its own count: none counted the file yet
        for i in range(4, 6):
            a.put(f"a{i}", _pending(rng), max_pending=6, ttl_s=None)
        assert len(a) == len(b) == 6 and a.dropped == 4  # the true count, then the oldest four of both
        assert a.take("a1", ttl_s=None) is None and a.take("b1", ttl_s=None) is None
        assert a.take("b2", ttl_s=None) is not None and a.take("a5", ttl_s=None) is not None
    finally:
        a.close()
        b.close()


# ---------------------------------------------------------------- selectors: publish, sync, cross-process feedback


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from memento.config import QNetConfig
    from memento.selector.export import create_selector

    root = tmp_path_factory.mktemp("workers")
    rng = np.random.default_rng(4)
    with CaseBank.create(root / "bank", DIM, index="Flat") as bank:
        bank.add(_cases(0, 30), _unit(rng, 30))
    return create_selector(root / "bank", root / "selector", k=3, warmup=1, qnet=QNetConfig(dim=DIM, hidden=32))


@pytest.fixture
def pair(artifact: Path, tmp_path: Path):
    """A learner (shared) and a read-only selector over one copy of the artifact."""
    from memento.selector.runtime import Selector

    path = Path(shutil.copytree(artifact, tmp_path / "selector"))
    learner = Selector.load(path, learn=True, seed=0, shared=True)
    learner.publish_policy()
    reader = Selector.load(path, learn=False, seed=1, verify=False, read_only=True)
    try:
        yield learner, reader
    finally:
        reader.close()
        learner.close()


def _q(selector: Any, _: Any) -> torch.Tensor:
    """The Q-network's weights, flat."""
    return torch.cat([p.detach().flatten() for p in selector.learner.qnet.parameters()])


def test_publish_and_sync_carry_weights_cases_and_policy_version(pair: Any) -> None:
    learner, reader = pair
    rng = np.random.default_rng(5)
    assert reader.read_only and reader.sync() == {"policy": 1, "cases": 0, "feedbacks": 0}
    assert reader.policy_version == learner.policy_version == 0
    for _ in range(4):
        result = reader.select(_unit(rng, 1)[0], k=3)
        learner.feedback(result.selection_id, 1.0)  # a selection made by the reader, answered by the learner
    assert learner.policy_version > 0
    assert reader.sync()["feedbacks"] == 4 and reader.policy_version == 0  # not published yet: old weights
    assert not torch.equal(_q(reader, None), _q(learner, None))
    version = learner.publish_policy()
    case_id = learner.add_case("a new case", "its action", 1.0, embedding=_unit(rng, 1)[0])
    taken = reader.sync()
    assert taken["policy"] == 1 and taken["cases"] == 1
    assert reader.policy_version == version == learner.policy_version
    assert torch.equal(_q(reader, None), _q(learner, None))
    assert reader.learner.alpha == learner.learner.alpha
    assert reader.get_case(case_id).state == "a new case"
    vector_D = reader.bank.embeddings([case_id])[0]
    assert reader.bank.search(vector_D, 1)[1].tolist() == [case_id]  # in the reader's index too
    assert reader.select(vector_D, k=3).policy_version == version
    assert reader.sync() == {"policy": 0, "cases": 0, "feedbacks": 0}
    stats = reader.stats()
    assert stats["read_only"] and stats["feedbacks"] == 4 and stats["cases"] == 31


def test_read_only_selector_refuses_writes_and_feedback_is_answered_once(pair: Any) -> None:
    learner, reader = pair
    rng = np.random.default_rng(6)
    result = reader.select(_unit(rng, 1)[0], k=3)
    with pytest.raises(MementoError, match="read-only"):
        reader.feedback(result.selection_id, 1.0)
    with pytest.raises(MementoError, match="read-only"):
        reader.add_case("s", "a", 1.0, embedding=_unit(rng, 1)[0])
    with pytest.raises(MementoError, match="read-only"):
        reader.save()
    with pytest.raises(MementoError, match="read-only"):
        reader.publish_policy()
    assert learner.feedback(result.selection_id, 0.0)["recorded"]
    with pytest.raises(UnknownSelectionError):
        learner.feedback(result.selection_id, 0.0)


def test_learner_save_keeps_the_readers_files_valid_and_verify_ignores_the_policy(pair: Any) -> None:
    from memento.selector.export import verify

    learner, reader = pair
    rng = np.random.default_rng(7)
    learner.add_case("before the save", "x", 1.0, embedding=_unit(rng, 1)[0])
    learner.save()
    case_id = learner.add_case("after the save", "y", 1.0, embedding=_unit(rng, 1)[0])
    assert reader.sync()["cases"] == 2
    assert reader.get_case(case_id).state == "after the save"
    assert reader.stats()["saves"] == learner.stats()["saves"]  # the new manifest was read
    assert (learner.path / ".policy.safetensors").is_file()
    verify(learner.path)  # the dot-named policy file is volatile: not listed, not a problem


def test_a_symlinked_or_damaged_policy_is_refused(pair: Any, tmp_path: Path) -> None:
    learner, reader = pair
    reader.sync()
    policy = learner.path / ".policy.safetensors"
    target = tmp_path / "elsewhere.safetensors"
    shutil.copy(policy, target)
    policy.unlink()
    policy.symlink_to(target)
    with pytest.raises(CheckpointError, match="symbolic link"):
        reader.sync()
    policy.unlink()
    policy.write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match="policy|safetensors"):
        reader.sync()


# ---------------------------------------------------------------- forwarding through a worker's app


@pytest.fixture
def served(pair: Any):
    """The learner's app on a Unix socket (real uvicorn, in a thread) and two worker apps (TestClient)."""
    import uvicorn
    from fastapi.testclient import TestClient

    from memento.selector.runtime import Selector
    from memento.serve.app import LearnerLink, ServeConfig, Writer, create_app

    learner, reader = pair
    config = ServeConfig(publish_every_s=0.0, workers=3)
    writer = Writer(learner, config, publish=True).start()
    directory = tempfile.mkdtemp(prefix="memento-test-")
    socket_path = os.path.join(directory, "learner.sock")
    app = create_app(learner, token=TOKEN, config=config, writer=writer,
                     process={"role": "learner", "index": 0, "workers": 3})
    server = uvicorn.Server(uvicorn.Config(app, uds=socket_path, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    other = Selector.load(learner.path, learn=False, seed=2, verify=False, read_only=True)
    from memento.serve.http import build_app

    workers = [TestClient(build_app(sel, token=TOKEN, config=config, writer=None,
                                    link=LearnerLink(socket_path, sel, index=i + 1, workers=3)))
               for i, sel in enumerate((reader, other))]
    try:
        for w in workers:
            w.__enter__()
        yield learner, workers, socket_path
    finally:
        for w in workers:
            w.__exit__(None, None, None)
        server.should_exit = True
        thread.join(10)
        writer.stop()
        other.close()
        shutil.rmtree(directory, ignore_errors=True)


def test_writes_through_a_worker_reach_the_learner(served: Any) -> None:
    learner, (w1, w2), _ = served
    rng = np.random.default_rng(8)
    answered = []
    for i in range(6):
        select = w1.post("/v1/select", json={"embedding": _unit(rng, 1)[0].tolist(), "k": 3}, headers=AUTH)
        assert select.status_code == 200
        sid = select.json()["selection_id"]
        via = (w1, w2)[i % 2]  # feedback to the worker that selected, or to another one
        response = via.post("/v1/feedback", json={"selection_id": sid, "reward": 1.0}, headers=AUTH)
        assert response.status_code == 200, response.text
        assert response.json()["recorded"] is True
        answered.append(sid)
    again = w2.post("/v1/feedback", json={"selection_id": answered[0], "reward": 1.0}, headers=AUTH)
    assert again.status_code == 404 and "unknown selection id" in again.json()["detail"]  # the learner's answer
    logged = {row.selection_id for row in learner._feedback.rows()}  # noqa: SLF001
    assert set(answered) <= logged
    added = w2.post("/v1/cases", json={"state": "via a worker", "action": "a", "reward": 1.0,
                                       "embedding": _unit(rng, 1)[0].tolist()}, headers=AUTH)
    assert added.status_code == 200
    assert w2.get(f"/v1/cases/{added.json()['id']}", headers=AUTH).status_code == 200  # synced after the write
    assert learner.get_case(added.json()["id"]).state == "via a worker"
    deadline = time.monotonic() + 10
    while True:  # published after each update (publish_every_s=0), taken in at the worker's next select
        select = w1.post("/v1/select", json={"embedding": _unit(rng, 1)[0].tolist(), "k": 3}, headers=AUTH)
        if select.json()["policy_version"] == learner.policy_version or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert select.json()["policy_version"] == learner.policy_version == 6
    stats = w1.get("/v1/stats", headers=AUTH).json()
    assert stats["server"]["process"]["role"] == "worker" and stats["server"]["process"]["index"] == 1
    assert stats["policy_version"] == 6 and stats["feedbacks"] == 6
    assert w1.post("/v1/feedback", json={"selection_id": "x", "reward": 2.0}, headers=AUTH).status_code == 422
    assert w1.post("/v1/feedback", json={"selection_id": "x", "reward": 1.0}).status_code == 401


def test_case_lifecycle_through_a_worker(served: Any) -> None:
    """PATCH, PUT, DELETE /v1/cases?user= are forwarded to the learner (with their query); history, count and get
    are answered by the worker from the shared bank, deleted and replaced cases with 404."""
    learner, (w1, w2), _ = served
    rng = np.random.default_rng(9)
    added = w1.post("/v1/cases", json={"state": "a tenant's case", "action": "a", "reward": 1.0, "user": "alice",
                                       "meta": {"t": 1}, "embedding": _unit(rng, 1)[0].tolist()}, headers=AUTH)
    case_id = added.json()["id"]
    patched = w2.patch(f"/v1/cases/{case_id}", json={"action": "b"}, headers=AUTH)
    assert patched.status_code == 200 and (patched.json()["version"], patched.json()["action"]) == (2, "b")
    assert w2.patch(f"/v1/cases/{case_id}", json={"state": "other"}, headers=AUTH).status_code == 422
    assert learner.get_case(case_id).action == "b"
    assert w1.get(f"/v1/cases/{case_id}", headers=AUTH).json()["version"] == 2
    events = w1.get(f"/v1/cases/{case_id}/history", headers=AUTH).json()["events"]
    assert [event["event"] for event in events] == ["add", "update"]
    assert w2.get("/v1/cases/count", params={"user": "alice"}, headers=AUTH).json() == {"count": 1}
    put = w1.put(f"/v1/cases/{case_id}", json={"state": "its replacement", "action": "c", "reward": 1.0,
                                               "embedding": _unit(rng, 1)[0].tolist()}, headers=AUTH)
    assert put.status_code == 200, put.text
    new_id = put.json()["id"]
    assert w2.get(f"/v1/cases/{new_id}", headers=AUTH).json()["user"] == "alice"  # the owner kept
    assert w2.get(f"/v1/cases/{case_id}", headers=AUTH).status_code == 404
    refused = w1.delete("/v1/cases", headers=AUTH)
    assert refused.status_code == 422 and "needs a scope" in str(refused.json()["detail"])  # the learner's answer
    deleted = w2.delete("/v1/cases", params={"user": "alice"}, headers=AUTH)
    assert deleted.status_code == 200 and deleted.json()["deleted"] == 1
    assert w1.get("/v1/cases/count", params={"user": "alice"}, headers=AUTH).json() == {"count": 0}
    assert w1.get(f"/v1/cases/{new_id}", headers=AUTH).status_code == 404


def test_an_unreachable_learner_is_503(served: Any) -> None:
    _, (w1, _), socket_path = served
    os.unlink(socket_path)
    response = w1.post("/v1/feedback", json={"selection_id": "x", "reward": 1.0}, headers=AUTH)
    assert response.status_code == 503 and response.headers["retry-after"] == "1"
    assert "not reachable" in response.json()["detail"]


# ---------------------------------------------------------------- config and CLI


def test_serve_config_workers_and_publish_interval_are_validated() -> None:
    from memento.errors import ConfigError
    from memento.serve.app import ServeConfig

    assert ServeConfig().workers == 1 and ServeConfig().publish_every_s == 1.0
    assert ServeConfig(workers=4, publish_every_s=0.0).workers == 4
    for bad in ({"workers": 0}, {"workers": 65}, {"workers": True}, {"publish_every_s": -1.0}):
        with pytest.raises(ConfigError):
            ServeConfig(**bad)


def test_cli_serve_help_documents_workers(capsys: pytest.CaptureFixture[str]) -> None:
    from memento.cli.entry import main

    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--workers N" in text and "read-only workers" in text and "--publish-every-s" in text
