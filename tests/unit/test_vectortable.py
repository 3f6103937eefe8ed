"""The vector table under the replay buffer: each distinct vector once, exact under hash collisions,
compaction that keeps what live rows refer to; and the buffer built on it: shared cases stored once, a
long ring run equal to a one-vector-per-slot reference, version-1 saves still loading."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from memento.config import ReplayConfig, to_dict
from memento.errors import CheckpointError
from memento.learn.replay import ReplayBuffer
from memento.learn.vectortable import VectorTable

CPU = torch.device("cpu")


def test_intern_stores_each_distinct_vector_once() -> None:
    table = VectorTable(3, torch.float32, CPU, initial_rows=1)
    ix = table.intern(np.array([[1, 2, 3], [4, 5, 6], [1, 2, 3]], dtype=np.float32))
    assert ix.tolist() == [0, 1, 0] and len(table) == 2
    assert table.intern(np.array([[4, 5, 6], [7, 8, 9]], dtype=np.float32)).tolist() == [1, 2]
    assert torch.equal(table.rows(), torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9]], dtype=torch.float32))


def test_hash_collisions_cost_a_row_never_a_wrong_vector(monkeypatch) -> None:
    table = VectorTable(2, torch.float32, CPU)
    monkeypatch.setattr(table, "_hashes", lambda rows: np.zeros(rows.shape[0], dtype=np.int64))  # every hash equal
    vectors = np.array([[1, 0], [0, 1], [1, 0], [2, 2]], dtype=np.float32)
    ix = table.intern(vectors)
    assert torch.equal(table.data[ix], torch.as_tensor(vectors))


def test_half_precision_rows_are_compared_as_stored() -> None:
    table = VectorTable(2, torch.float16, CPU)
    ix = table.intern(np.array([[0.1, 0.2], [0.1000001, 0.2]], dtype=np.float32))  # equal once in float16
    assert ix.tolist() == [0, 0] and table.rows().dtype == torch.float16


def test_compaction_keeps_the_live_rows_in_order() -> None:
    table = VectorTable(1, torch.float32, CPU)
    table.intern(np.arange(5, dtype=np.float32)[:, None])
    rows, remap = table.compacted(torch.tensor([3, 1, 3]))
    assert rows[:, 0].tolist() == [1.0, 3.0] and remap[:5].tolist() == [-1, 0, -1, 1, -1]
    old = table.data
    table.replace(rows)
    assert table.data is not old and len(table) == 2
    assert table.intern(np.array([[3.0], [9.0]], dtype=np.float32)).tolist() == [1, 2]


def _dense_reference(config: ReplayConfig, steps: int, seed: int) -> tuple[ReplayBuffer, list[dict]]:
    """A buffer fed ``steps`` decisions whose cases come from a small bank, and the rows a dense buffer holds."""
    rng = np.random.default_rng(seed)
    bank = rng.normal(size=(6, config.dim)).astype(np.float32)
    buffer = ReplayBuffer(config, device="cpu")
    rows: list[dict] = []
    for step in range(steps):
        b = int(rng.integers(1, 4))
        k = int(rng.integers(1, config.k_max + 1))
        state = rng.normal(size=(b, config.dim)).astype(np.float32)
        cases = bank[rng.integers(0, len(bank), size=(b, k))]
        reward = rng.random(b).astype(np.float32)
        buffer.add_batch(state_BD=state, cases_BKD=cases, reward_B=reward, step_B=np.full(b, step))
        for i in range(b):
            padded = np.zeros((config.k_max, config.dim), dtype=np.float32)
            padded[:k] = cases[i]
            rows.append({"state": state[i], "cases": padded, "reward": reward[i]})
    return buffer, rows[-config.capacity:]


def test_a_long_ring_run_equals_one_vector_per_slot() -> None:
    config = ReplayConfig(capacity=8, dim=3, k_max=3)
    buffer, expected = _dense_reference(config, steps=400, seed=1)  # wraps ~100 times: compacts many times
    assert buffer.table_rows()["cases"] <= 6 + 1  # the bank's cases and the zero padding
    batch = buffer.gather(torch.arange(len(buffer)))
    order = sorted(range(len(buffer)), key=lambda r: (r - buffer._ptr) % buffer.capacity)  # oldest first
    for n, row in enumerate(order):
        assert torch.equal(batch.state_BD[row], torch.as_tensor(expected[n]["state"]))
        assert torch.equal(batch.cases_BKD[row], torch.as_tensor(expected[n]["cases"]))
        assert float(batch.reward_B[row]) == pytest.approx(float(expected[n]["reward"]))


def test_unique_states_are_compacted_within_bounds() -> None:
    config = ReplayConfig(capacity=16, dim=2, k_max=1)
    buffer, expected = _dense_reference(config, steps=2000, seed=2)  # every state distinct: ~4,000 of them
    limit = 16 + 1024  # the worst case (16 rows, 1 state each) plus the slack
    assert buffer.table_rows()["states"] <= limit and buffer._tables["states"].data.shape[0] <= limit
    states = buffer.gather(torch.arange(len(buffer))).state_BD
    assert {tuple(row["state"].tolist()) for row in expected} == {tuple(s.tolist()) for s in states}


def test_a_sampled_batch_stays_valid_while_the_buffer_changes() -> None:
    config = ReplayConfig(capacity=4, dim=2, k_max=1)
    buffer, _ = _dense_reference(config, steps=5, seed=3)
    batch = buffer.gather(torch.arange(len(buffer)))  # vectors not gathered yet
    expected = buffer.gather(torch.arange(len(buffer))).state_BD.clone()
    rng = np.random.default_rng(4)
    for _ in range(3000):  # grows and compacts the tables under the batch
        buffer.add_batch(state_BD=rng.normal(size=(1, 2)).astype(np.float32),
                         cases_BKD=np.ones((1, 1, 2), dtype=np.float32), reward_B=np.ones(1, dtype=np.float32))
    assert torch.equal(batch.state_BD, expected)


def test_a_version_1_save_loads(tmp_path) -> None:
    config = ReplayConfig(capacity=4, dim=2, k_max=2)
    n = 3
    tensors = {"state_ND": torch.arange(n * 2, dtype=torch.float32).reshape(n, 2),
               "cases_NKD": torch.ones(n, 2, 2), "mask_NK": torch.tensor([[True, True], [True, False], [True, True]]),
               "reward_N": torch.tensor([1.0, 0.0, 1.0]), "propensity_NK": torch.full((n, 2), 0.5),
               "done_N": torch.ones(n, dtype=torch.bool), "step_N": torch.arange(n),
               "policy_version_N": torch.zeros(n, dtype=torch.int64)}
    tensors["cases_NKD"][1, 1] = 0.0  # a padded slot, as version 1 wrote it
    directory = tmp_path / "replay"
    directory.mkdir()
    save_file(tensors, str(directory / "replay.safetensors"), metadata={"format": "memento-replay", "uid": "u"})
    (directory / "replay.json").write_text(json.dumps({"format": "memento-replay", "format_version": 1, "uid": "u",
                                                        "config": to_dict(config), "ptr": 3, "size": 3, "added": 3}))
    buffer = ReplayBuffer.load(directory, device="cpu")
    batch = buffer.gather(torch.arange(3))
    assert torch.equal(batch.state_BD, tensors["state_ND"]) and torch.equal(batch.cases_BKD, tensors["cases_NKD"])
    assert torch.equal(batch.mask_BK, tensors["mask_NK"]) and buffer.table_rows()["cases"] == 2


def test_row_indices_outside_the_tables_are_refused() -> None:
    config = ReplayConfig(capacity=4, dim=2, k_max=1)
    buffer, _ = _dense_reference(config, steps=3, seed=5)
    state = buffer.state_dict()
    state["tensors"]["cases_ix_NK"] = state["tensors"]["cases_ix_NK"] + 100
    with pytest.raises(CheckpointError, match="cases_ix_NK refers to vector rows outside"):
        ReplayBuffer(config, device="cpu").load_state_dict(state)


def test_forget_masks_every_slot_of_a_case_and_nothing_else() -> None:
    config = ReplayConfig(capacity=32, dim=3, k_max=2, store_next=True, c_max=2)
    buffer = ReplayBuffer(config, device="cpu")
    a, b, c = (np.eye(3, dtype=np.float32)[i] for i in range(3))
    for step in range(6):
        buffer.add_batch(state_BD=np.ones((1, 3), np.float32), cases_BKD=np.stack([[a, b], [c, a]][step % 2])[None],
                         reward_B=np.ones(1, np.float32), next_state_BD=np.ones((1, 3), np.float32),
                         next_cands_BCD=np.stack([a, c])[None])
    before = buffer.gather(torch.arange(len(buffer)))
    assert buffer.forget(a[None, :2]) == 6 + 6  # a chosen in every decision, and a next candidate in each
    after = buffer.gather(torch.arange(len(buffer)))
    is_a = (after.cases_BKD == torch.as_tensor(a)).all(-1)
    assert not (after.mask_BK & is_a).any() and (after.mask_BK == (before.mask_BK & ~is_a)).all()
    assert after.next_mask_BC.tolist() == [[False, True]] * 6
    assert buffer.forget(np.array([[0.5, 0.5, 0.5]], np.float32)) == 0
    state = buffer.state_dict()  # the masks persist
    again = ReplayBuffer(config, device="cpu")
    again.load_state_dict(state)
    assert torch.equal(again.gather(torch.arange(6)).mask_BK, after.mask_BK)
