"""Pending selections on disk (memento.selector.pending.PendingStore) and a Selector answering them after a restart.

The store: exact round trips (arrays bit for bit), expiry on an injected clock, the cap, concurrent puts,
take-once and put-back, the crash reconciliation with the feedback log, refused links and foreign files,
the cost of a put. The Selector: select, close, load again, feedback -- the feedback row and the learner
update are those of the same feedback without the restart; answered ids stay answered across a restart
(also after a crash, simulated by copying the live directory); expired ones are refused; the store is not
in the manifest and not copied by save(path).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sqlite3
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from memento.errors import CheckpointError, UnknownSelectionError
from memento.policies import SoftQConfig, make_policy
from memento.runs.qa import LoopConfig, run_online
from memento.selector.artifact import FEEDBACK_NAME, FeedbackLog
from memento.selector.export import export_selector, load_selector, verify
from memento.selector.pending import PENDING_NAME, PendingSelection, PendingStore, answered_in
from tests.loop_env import ExactJudge, HashingEncoder, make_env

pytestmark = pytest.mark.usefixtures("one_torch_thread")

DIM = 16


class Clock:
    def __init__(self, now: float = 1_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def _record(rng: np.random.Generator, k: int = 3, *, created: float = 1_000.0, dim: int = DIM,
            env: str | None = "facts", mode: str = "sample") -> PendingSelection:
    bits = rng.integers(0, 2**32, size=dim + k * dim, dtype=np.uint64).astype(np.uint32)
    values = bits.view(np.float32)  # arbitrary bit patterns: -0.0, subnormals, NaNs, infinities
    return PendingSelection(state_D=values[:dim].copy(), ids=[f"case-{i}-é" for i in range(k)],
                            cases_KD=values[dim:].reshape(k, dim).copy(),
                            probs=[0.1 + 0.2, 5e-324, 1.0 / 3.0][:k] + [0.25] * max(0, k - 3),
                            set_prob=1e-300, mode=mode, policy_version=7, env=env, created=created)


def _same(a: PendingSelection, b: PendingSelection) -> None:
    assert a.state_D.dtype == b.state_D.dtype == np.float32 and a.state_D.tobytes() == b.state_D.tobytes()
    assert a.cases_KD.dtype == np.float32 and a.cases_KD.shape == b.cases_KD.shape
    assert a.cases_KD.tobytes() == b.cases_KD.tobytes()
    assert (a.ids, a.probs, a.set_prob, a.mode, a.policy_version, a.env, a.created) == (
        b.ids, b.probs, b.set_prob, b.mode, b.policy_version, b.env, b.created)


def _put(store: PendingStore, sid: str, record: PendingSelection, *, max_pending: int = 1000,
         ttl_s: float | None = None) -> None:
    store.put(sid, record, max_pending=max_pending, ttl_s=ttl_s)


# ---------------------------------------------------------------- the store


def test_round_trip_is_exact_across_a_reopen(tmp_path: Path, rng: np.random.Generator) -> None:
    path = tmp_path / PENDING_NAME
    records = {"a": _record(rng), "b": _record(rng, k=5, env=None, mode="greedy"), "empty": _record(rng, k=0)}
    store = PendingStore.open(path, dim=DIM)
    assert not path.exists()  # created by the first put, not by opening
    for sid, record in records.items():
        _put(store, sid, record)
    assert len(store) == 3 and path.stat().st_mode & 0o777 == 0o600
    store.close()
    again = PendingStore.open(path, dim=DIM)
    assert len(again) == 3
    for sid, record in records.items():
        back = again.take(sid, ttl_s=None)
        assert back is not None
        _same(back, record)
    assert again.take("a", ttl_s=None) is None  # handed out once
    again.close()
    assert len(PendingStore.open(path, dim=DIM)) == 0  # taken rows leave the file on close


def test_expiry_follows_the_injected_wall_clock(tmp_path: Path, rng: np.random.Generator) -> None:
    clock = Clock(1_000.0)
    store = PendingStore.open(tmp_path / PENDING_NAME, dim=DIM, clock=clock)
    _put(store, "old", _record(rng, created=1_000.0), ttl_s=100.0)
    _put(store, "new", _record(rng, created=1_050.0), ttl_s=100.0)
    clock.now = 1_100.0
    assert store.purge(100.0) == 0 and len(store) == 2  # exactly ttl old: still answerable
    clock.now = 1_120.0
    assert store.take("old", ttl_s=100.0) is None and store.expired == 1 and len(store) == 1
    store.close()
    later = PendingStore.open(tmp_path / PENDING_NAME, dim=DIM, clock=Clock(1_149.0))  # the time survives a reopen
    assert later.take("new", ttl_s=100.0) is not None
    _put(later, "late", _record(rng, created=1_000.0), ttl_s=100.0)  # put back after it expired: not kept
    assert len(later) == 0 and later.expired == 1
    assert later.purge(None) == 0


def test_the_cap_drops_the_oldest(tmp_path: Path, rng: np.random.Generator) -> None:
    store = PendingStore.open(tmp_path / PENDING_NAME, dim=DIM)
    for i in range(5):
        _put(store, f"s{i}", _record(rng, created=2_000.0 - i), max_pending=3)  # issue order, not created, counts
    assert len(store) == 3 and store.dropped == 2 and store.expired == 0
    assert store.take("s0", ttl_s=None) is None and store.take("s1", ttl_s=None) is None
    store.close()
    again = PendingStore.open(tmp_path / PENDING_NAME, dim=DIM)
    assert len(again) == 3 and all(again.take(f"s{i}", ttl_s=None) is not None for i in (2, 3, 4))


def test_concurrent_puts_and_takes_from_threads(tmp_path: Path, rng: np.random.Generator) -> None:
    store = PendingStore.open(tmp_path / PENDING_NAME, dim=DIM)
    record = _record(rng)
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            for i in range(200):
                _put(store, f"{t}-{i}", record)
                if i % 2:
                    assert store.take(f"{t}-{i}", ttl_s=None) is not None
        except BaseException as error:  # pragma: no cover - reported below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert len(store) == 800
    store.close()
    again = PendingStore.open(tmp_path / PENDING_NAME, dim=DIM)
    assert len(again) == 800
    assert all(again.take(f"{t}-{i}", ttl_s=None) is not None for t in range(8) for i in range(0, 200, 2))
    capped = PendingStore.open(tmp_path / "capped.sqlite", dim=DIM)
    threads = [threading.Thread(target=lambda t=t: [_put(capped, f"{t}-{i}", record, max_pending=500)
                                                    for i in range(100)]) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(capped) == 500 and capped.dropped == 300


def test_a_taken_selection_can_be_put_back(tmp_path: Path, rng: np.random.Generator) -> None:
    store = PendingStore.open(tmp_path / PENDING_NAME, dim=DIM, clock=Clock(10_000.0))
    record = _record(rng, created=1_234.5)
    _put(store, "x", record)
    taken = store.take("x", ttl_s=None)
    assert taken is not None and len(store) == 0
    for i in range(3):  # selects in other threads meanwhile: neither expire nor drop the taken one
        _put(store, f"other-{i}", _record(rng, created=9_999.0), max_pending=2, ttl_s=1.0)
    assert len(store) == 2 and store.dropped == 1 and store.expired == 0
    _put(store, "x", taken, max_pending=3)  # the failed feedback puts it back, with its creation time
    assert len(store) == 3 and store.dropped == 1
    back = store.take("x", ttl_s=None)
    assert back is not None
    _same(back, record)


def test_a_crash_between_take_and_feedback_loses_nothing(tmp_path: Path, rng: np.random.Generator) -> None:
    """The taken row stays in the file until the next take: after a crash it is answerable again, unless the
    feedback log holds its id (the feedback was committed before the crash)."""
    store = PendingStore.open(tmp_path / PENDING_NAME, dim=DIM)
    for sid in ("a", "b"):
        _put(store, sid, _record(rng))
    assert store.take("a", ttl_s=None) is not None
    for case in ("committed", "not-committed"):  # the files as a SIGKILL leaves them (the store is not closed)
        (tmp_path / case).mkdir()
        for name in os.listdir(tmp_path):
            if name.startswith(PENDING_NAME):
                shutil.copy2(tmp_path / name, tmp_path / case / name)
    log = FeedbackLog.create(tmp_path / FEEDBACK_NAME)
    log.append(selection_id="a", reward=1.0, mode="sample", policy_version=0, env=None, ids=[], probs=[],
               set_prob=1.0, learned=False, state=None)
    after = PendingStore.open(tmp_path / "committed" / PENDING_NAME, dim=DIM, answered=answered_in(log))
    assert len(after) == 1 and after.take("a", ttl_s=None) is None and after.take("b", ttl_s=None) is not None
    log.close()
    retry = PendingStore.open(tmp_path / "not-committed" / PENDING_NAME, dim=DIM, answered=lambda ids: set())
    assert len(retry) == 2 and retry.take("a", ttl_s=None) is not None  # the unacknowledged feedback can be retried


def test_links_and_foreign_files_are_refused(tmp_path: Path, rng: np.random.Generator) -> None:
    target = tmp_path / "elsewhere.sqlite"
    _put(PendingStore.open(target, dim=DIM), "a", _record(rng))
    link_dir = tmp_path / "link"
    link_dir.mkdir()
    (link_dir / PENDING_NAME).symlink_to(target)
    with pytest.raises(CheckpointError, match="symbolic link"):
        PendingStore.open(link_dir / PENDING_NAME, dim=DIM)
    dangling = tmp_path / "dangling"
    dangling.mkdir()
    (dangling / PENDING_NAME).symlink_to(tmp_path / "nothing-here")
    with pytest.raises(CheckpointError, match="symbolic link"):
        PendingStore.open(dangling / PENDING_NAME, dim=DIM)
    assert not (tmp_path / "nothing-here").exists()  # never created through the link
    sidecar = tmp_path / "sidecar"
    sidecar.mkdir()
    (sidecar / f"{PENDING_NAME}-wal").symlink_to(tmp_path / "wal-elsewhere")
    store = PendingStore.open(sidecar / PENDING_NAME, dim=DIM)  # nothing to open yet; the put opens
    with pytest.raises(CheckpointError, match="symbolic link"):
        _put(store, "a", _record(rng))
    directory = tmp_path / "dir"
    (directory / PENDING_NAME).mkdir(parents=True)
    with pytest.raises(CheckpointError, match="regular file"):
        PendingStore.open(directory / PENDING_NAME, dim=DIM)
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / PENDING_NAME).write_bytes(b"not a database at all" * 100)
    with pytest.raises(CheckpointError, match="not a pending-selection store"):
        PendingStore.open(garbage / PENDING_NAME, dim=DIM)
    other = tmp_path / "other"
    other.mkdir()
    with sqlite3.connect(other / PENDING_NAME) as conn:
        conn.execute("CREATE TABLE cases (id TEXT)")
    with pytest.raises(CheckpointError, match="not a pending-selection store"):
        PendingStore.open(other / PENDING_NAME, dim=DIM)


def test_rows_of_another_dim_are_dropped_on_open(tmp_path: Path, rng: np.random.Generator) -> None:
    path = tmp_path / PENDING_NAME
    store = PendingStore.open(path, dim=DIM)
    _put(store, "a", _record(rng))
    store.close()
    wider = PendingStore.open(path, dim=2 * DIM)
    assert len(wider) == 0 and wider.take("a", ttl_s=None) is None


def test_a_put_costs_well_under_a_millisecond(tmp_path: Path, rng: np.random.Generator) -> None:
    """One INSERT per put, committed in WAL mode without an fsync (384-d state, 4 cases, realistic sizes)."""
    dim = 384
    record = _record(rng, k=4, dim=dim)
    store = PendingStore.open(tmp_path / PENDING_NAME, dim=dim)
    _put(store, "warm", record, ttl_s=3600.0)
    times = []
    for i in range(2000):
        t0 = time.perf_counter()
        _put(store, f"s{i}", record, max_pending=1000, ttl_s=3600.0)
        times.append(time.perf_counter() - t0)
    median = float(np.median(times))
    assert median < 1e-3, f"median put {median * 1e6:.0f} us"


# ---------------------------------------------------------------- a Selector across a restart


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 24-step soft-Q run on the synthetic environment (hashing encoder), exported."""
    out = tmp_path_factory.mktemp("pending")
    env = make_env()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run_online(LoopConfig(steps=24, checkpoint_every=0, tensorboard=False, policy=SoftQConfig(warmup=4)),
                   make_policy=make_policy, encoder=HashingEncoder(), planner=env.planner(), judge=ExactJudge(),
                   tasks=env.tasks, seed_cases=env.seed_cases, out_dir=out / "run")
    finally:
        torch.set_num_threads(threads)
    return export_selector(out / "run", out / "selector")


def _copy(exported: Path, to: Path) -> Path:
    return Path(shutil.copytree(exported, to, ignore=shutil.ignore_patterns(f"{PENDING_NAME}*")))


def _query(i: int = 0) -> np.ndarray:
    return HashingEncoder().encode([task.question for task in make_env().tasks[i:i + 1]])[0]


def _row(path: Path) -> tuple:
    with sqlite3.connect(path / FEEDBACK_NAME) as conn:
        return conn.execute("SELECT seq, reward, mode, policy_version, env, ids, probs, set_prob, learned, state "
                            "FROM feedback ORDER BY seq DESC LIMIT 1").fetchone()


def test_feedback_after_a_restart_is_identical_to_feedback_without_one(exported: Path, tmp_path: Path) -> None:
    restarted, straight = _copy(exported, tmp_path / "restarted"), _copy(exported, tmp_path / "straight")
    with load_selector(restarted, learn=True, seed=3) as selector:
        chosen = selector.select(_query(), k=4)
        before = selector.stats()
    assert (restarted / PENDING_NAME).is_file()
    with load_selector(restarted, learn=True, seed=3) as selector:
        assert selector.stats()["pending"] == 1
        answer = selector.feedback(chosen.selection_id, 1.0)
        after_restart = selector.stats()
        weights_restart = {k: v.clone() for k, v in selector.learner.qnet.state_dict().items()}
        assert selector.stats()["pending"] == 0
    with load_selector(straight, learn=True, seed=3) as selector:
        same = selector.select(_query(), k=4)
        assert (same.ids, same.probs, same.set_prob) == (chosen.ids, chosen.probs, chosen.set_prob)
        expected = selector.feedback(same.selection_id, 1.0)
        after_straight = selector.stats()
        weights_straight = selector.learner.qnet.state_dict()
    assert answer["updates"] == expected["updates"] > before["updates"]  # the learner took its step
    for key in ("feedbacks", "updates", "replay", "replay_added"):
        assert after_restart[key] == after_straight[key], key
    assert _row(restarted) == _row(straight)  # the same feedback row, state vector bytes included
    assert all(torch.equal(weights_restart[k], weights_straight[k]) for k in weights_straight)


def test_answered_ids_stay_answered_across_restarts_and_crashes(exported: Path, tmp_path: Path) -> None:
    artifact = _copy(exported, tmp_path / "selector")
    with load_selector(artifact) as selector:
        first, second, third = (selector.select(_query(i), k=2) for i in range(3))
        selector.feedback(first.selection_id, 1.0)
        selector.feedback(second.selection_id, 0.0)  # its row is still in the file: deleted by the next write
        crashed = Path(shutil.copytree(artifact, tmp_path / "crashed"))  # the live files, as after a SIGKILL
    with load_selector(artifact) as selector:
        for answered in (first, second):
            with pytest.raises(UnknownSelectionError, match="already answered"):
                selector.feedback(answered.selection_id, 1.0)
        assert selector.stats()["pending"] == 1
    with load_selector(crashed) as selector:
        assert selector.stats()["pending"] == 1 and selector.stats()["feedbacks"] == 2
        for answered in (first, second):
            with pytest.raises(UnknownSelectionError):
                selector.feedback(answered.selection_id, 1.0)
        assert selector.feedback(third.selection_id, 1.0)["recorded"] is True


def test_expired_selections_are_refused_after_a_restart(exported: Path, tmp_path: Path) -> None:
    artifact = _copy(exported, tmp_path / "selector")
    with load_selector(artifact) as selector:
        chosen = selector.select(_query(), k=2)
    with load_selector(artifact) as selector:
        selector.config = dataclasses.replace(selector.config, pending_ttl_s=1e-6)
        with pytest.raises(UnknownSelectionError, match="expired"):
            selector.feedback(chosen.selection_id, 1.0)
        assert selector.stats()["expired"] == 1 and selector.stats()["pending"] == 0


def test_the_store_is_volatile_not_part_of_the_artifact(exported: Path, tmp_path: Path) -> None:
    artifact = _copy(exported, tmp_path / "selector")
    with load_selector(artifact) as selector:
        chosen = selector.select(_query(), k=2)
        selector.save()
        manifest = selector.manifest
        selector.select(_query(1), k=2)  # the store changes after the save: verify does not care
        copy = selector.save(tmp_path / "copy")
    assert not any(name.startswith(PENDING_NAME) for name in manifest["files"])
    verify(artifact)
    assert not any(p.name.startswith(PENDING_NAME) for p in copy.iterdir())  # pending belongs to the service
    with load_selector(copy) as selector:
        with pytest.raises(UnknownSelectionError):
            selector.feedback(chosen.selection_id, 1.0)
    with load_selector(artifact) as selector:
        assert selector.feedback(chosen.selection_id, 1.0)["recorded"] is True


def test_a_link_in_place_of_the_store_is_refused_on_load(exported: Path, tmp_path: Path) -> None:
    artifact = _copy(exported, tmp_path / "selector")
    (artifact / PENDING_NAME).symlink_to(tmp_path / "elsewhere.sqlite")
    with pytest.raises(CheckpointError, match="symbolic link"):
        load_selector(artifact)
    assert not (tmp_path / "elsewhere.sqlite").exists()


def test_the_wal_is_checkpointed_in_the_background(tmp_path: Path, rng: np.random.Generator) -> None:
    """Puts never checkpoint (no fsync on a select); a thread of the store moves the WAL into the file."""
    path = tmp_path / PENDING_NAME
    store = PendingStore.open(path, dim=384)
    for i in range(50):
        _put(store, f"s{i}", _record(rng, k=4, dim=384))  # about 8 KB each
    deadline = time.monotonic() + 10.0
    while path.stat().st_size < 300_000 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert path.stat().st_size >= 300_000
    store.close()
    assert not store._checkpointer.is_alive()  # noqa: SLF001 - stopped by close
