"""Replay buffer: checked transitions, padding, ring overwrite, uniform sampling, bit-exact persistence."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from memento.config import ReplayConfig, from_dict, to_dict
from memento.errors import CheckpointError, ConfigError, DataFormatError, DimensionError, MementoError
from memento.learn.replay import ReplayBatch, ReplayBuffer, Transition

D = 4


def _transition(i: int, k: int = 2, *, next_c: int | None = None, reward: float = 1.0) -> Transition:
    """A transition whose every value encodes ``i`` (so rows can be recognised after sampling)."""
    nexts = {}
    if next_c is not None:
        nexts = {"next_state_D": np.full(D, -i, np.float32),
                 "next_cands_CD": np.arange(next_c * D, dtype=np.float32).reshape(next_c, D) + 100 * i}
    return Transition(state_D=np.full(D, i, np.float32), cases_KD=np.full((k, D), i + 0.5, np.float32),
                      reward=reward, propensity_K=np.full(k, 1.0 / (k + 1)), done=i % 2 == 0, step=i,
                      policy_version=10 * i, **nexts)


def _fill(buffer: ReplayBuffer, n: int, start: int = 0, **kwargs) -> None:
    for i in range(start, start + n):
        buffer.add(_transition(i, **kwargs))


def _all_rows(buffer: ReplayBuffer) -> ReplayBatch:
    return buffer.gather(torch.arange(len(buffer)))


# ---------------------------------------------------------------- transitions


def test_transition_converts_to_float32_and_checks_shapes() -> None:
    t = Transition(state_D=[1, 2, 3], cases_KD=[[1, 2, 3]], reward=1, propensity_K=[0.5])
    assert t.state_D.dtype == np.float32 and t.cases_KD.shape == (1, 3)
    assert t.reward == 1.0 and isinstance(t.reward, float) and t.done is True
    with pytest.raises(DimensionError, match=r"cases of 3 numbers; got state_D.shape=\(3,\), cases_KD.shape=\(2, 4\)"):
        ReplayBuffer(ReplayConfig(capacity=2, dim=3, k_max=2), device="cpu").add(
            Transition(state_D=np.zeros(3), cases_KD=np.zeros((2, 4)), reward=0.0, propensity_K=np.ones(2)))
    with pytest.raises(DimensionError, match=r"propensity_K.shape=\(3,\), cases_KD.shape=\(2, 3\)"):
        Transition(state_D=np.zeros(3), cases_KD=np.zeros((2, 3)), reward=0.0, propensity_K=np.ones(3))
    with pytest.raises(DimensionError, match=r"cases_KD.shape=\(0, 3\)"):
        Transition(state_D=np.zeros(3), cases_KD=np.zeros((0, 3)), reward=0.0, propensity_K=np.ones(0))
    with pytest.raises(DimensionError, match=r"cases_KD.shape=\(3,\)"):
        Transition(state_D=np.zeros(3), cases_KD=np.zeros(3), reward=0.0, propensity_K=np.ones(1))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"propensity_K": np.array([0.0])}, "propensity_K must lie in"),
        ({"propensity_K": np.array([1.5])}, "propensity_K must lie in"),
        ({"reward": float("nan")}, "reward must be a finite number"),
        ({"reward": True}, "reward must be a finite number"),
        ({"state_D": np.array([0.0, np.inf, 0.0])}, "state_D holds NaN"),
        ({"next_state_D": np.zeros(3)}, "both next_state_D and next_cands_CD"),
        ({"step": 1.5}, "step must be an integer"),
    ],
)
def test_transition_rejects_bad_values(kwargs: dict, match: str) -> None:
    base = {"state_D": np.zeros(3), "cases_KD": np.zeros((1, 3)), "reward": 0.0, "propensity_K": np.ones(1)}
    with pytest.raises(DataFormatError, match=match):
        Transition(**{**base, **kwargs})


def test_transition_next_fields_checked() -> None:
    base = {"state_D": np.zeros(3), "cases_KD": np.zeros((1, 3)), "reward": 0.0, "propensity_K": np.ones(1)}
    t = Transition(**base, next_state_D=np.zeros(3), next_cands_CD=np.zeros((0,)))
    assert t.next_cands_CD.shape == (0, 3)
    with pytest.raises(DimensionError, match=r"next_cands_CD.shape=\(2, 4\)"):
        Transition(**base, next_state_D=np.zeros(3), next_cands_CD=np.zeros((2, 4)))


# ---------------------------------------------------------------- adding and reading back


def test_add_pads_and_masks_and_keeps_every_field() -> None:
    buffer = ReplayBuffer(ReplayConfig(capacity=8, dim=D, k_max=3), device="cpu")
    buffer.add(_transition(1, k=1))
    buffer.add(_transition(2, k=3, reward=0.0))
    batch = _all_rows(buffer)
    assert len(buffer) == 2 and buffer.added == 2
    assert batch.state_BD.tolist() == [[1.0] * D, [2.0] * D]
    assert batch.mask_BK.tolist() == [[True, False, False], [True, True, True]]
    assert batch.cases_BKD[0, 0].tolist() == [1.5] * D and batch.cases_BKD[0, 1:].abs().sum() == 0
    assert batch.cases_BKD[1].tolist() == [[2.5] * D] * 3
    np.testing.assert_allclose(batch.propensity_BK.numpy(), [[0.5, 1, 1], [0.25, 0.25, 0.25]])
    assert batch.reward_B.tolist() == [1.0, 0.0]
    assert batch.done_B.tolist() == [0.0, 1.0] and batch.done_B.dtype == torch.float32
    assert batch.step_B.tolist() == [1, 2] and batch.policy_version_B.tolist() == [10, 20]
    assert batch.step_B.dtype == torch.int64
    assert batch.next_state_BD is None and not batch.has_next


def test_add_rejects_wrong_dimensions() -> None:
    buffer = ReplayBuffer(ReplayConfig(capacity=8, dim=D, k_max=2), device="cpu")
    with pytest.raises(DimensionError, match=r"state_D.shape=\(5,\)"):
        buffer.add(Transition(state_D=np.zeros(5), cases_KD=np.zeros((1, 5)), reward=0.0, propensity_K=np.ones(1)))
    with pytest.raises(DimensionError, match=r"cases_KD.shape=\(3, 4\)"):
        buffer.add(_transition(0, k=3))
    with pytest.raises(DimensionError, match=r"cases_BKD.shape=\(2, 1, 3\)"):
        buffer.add_batch(state_BD=np.zeros((2, D)), cases_BKD=np.zeros((2, 1, 3)), reward_B=np.zeros(2))
    with pytest.raises(DimensionError, match=r"reward_N has shape \(3,\), expected \(2,\)"):
        buffer.add_batch(state_BD=np.zeros((2, D)), cases_BKD=np.zeros((2, 1, D)), reward_B=np.zeros(3))
    assert len(buffer) == 0


def test_store_next_pads_next_candidates() -> None:
    buffer = ReplayBuffer(ReplayConfig(capacity=4, dim=D, k_max=2, store_next=True, c_max=3), device="cpu")
    buffer.add(_transition(1, k=1, next_c=2))
    buffer.add(_transition(2, k=2, next_c=0))
    batch = _all_rows(buffer)
    assert batch.has_next
    assert batch.next_state_BD.tolist() == [[-1.0] * D, [-2.0] * D]
    assert batch.next_mask_BC.tolist() == [[True, True, False], [False, False, False]]
    expected = np.zeros((3, D), np.float32)
    expected[:2] = np.arange(2 * D).reshape(2, D) + 100
    np.testing.assert_array_equal(batch.next_cands_BCD[0].numpy(), expected)
    with pytest.raises(DataFormatError, match="store_next=True"):
        buffer.add(_transition(3))
    with pytest.raises(DimensionError, match=r"next_cands_CD.shape=\(4, 4\)"):
        buffer.add(_transition(3, next_c=4))


def test_next_fields_take_no_memory_without_store_next() -> None:
    buffer = ReplayBuffer(ReplayConfig(capacity=4, dim=D), device="cpu")
    assert not any(name.startswith("next") for name in buffer.state_dict()["tensors"])


# ---------------------------------------------------------------- ring overwrite


def test_ring_overwrites_the_oldest() -> None:
    buffer = ReplayBuffer(ReplayConfig(capacity=5, dim=D, k_max=2), device="cpu")
    _fill(buffer, 8)
    assert len(buffer) == 5 and buffer.added == 8
    # rows 5, 6, 7 overwrote positions 0, 1, 2; rows 3, 4 are still at 3, 4
    assert _all_rows(buffer).step_B.tolist() == [5, 6, 7, 3, 4]
    assert _all_rows(buffer).state_BD[:, 0].tolist() == [5, 6, 7, 3, 4]


def test_add_batch_wraps_and_keeps_the_newest_when_larger_than_capacity() -> None:
    buffer = ReplayBuffer(ReplayConfig(capacity=5, dim=D, k_max=2), device="cpu")
    _fill(buffer, 3)

    def rows(start: int, n: int) -> dict:
        ids = np.arange(start, start + n)
        return {"state_BD": np.repeat(ids[:, None], D, 1).astype(np.float32),
                "cases_BKD": np.zeros((n, 1, D), np.float32), "reward_B": np.ones(n), "step_B": ids}

    buffer.add_batch(**rows(3, 4))  # positions 3, 4, 0, 1
    assert _all_rows(buffer).step_B.tolist() == [5, 6, 2, 3, 4]
    assert _all_rows(buffer).mask_BK[:, 1].tolist() == [False, False, True, False, False]
    buffer.add_batch(**rows(7, 12))  # only 14..18 survive, written as if one at a time
    assert len(buffer) == 5 and buffer.added == 19
    reference = ReplayBuffer(ReplayConfig(capacity=5, dim=D, k_max=2), device="cpu")
    _fill(reference, 3)
    for i in range(3, 19):
        reference.add_batch(**rows(i, 1))
    assert _all_rows(buffer).step_B.tolist() == _all_rows(reference).step_B.tolist() == [15, 16, 17, 18, 14]


# ---------------------------------------------------------------- sampling


def test_sampling_is_uniform_chi_square() -> None:
    buffer = ReplayBuffer(ReplayConfig(capacity=16, dim=D, k_max=1), device="cpu")
    _fill(buffer, 10, k=1)  # only the 10 filled rows may come out
    generator = torch.Generator().manual_seed(2024)
    steps = torch.cat([buffer.sample(1000, generator).step_B for _ in range(40)])
    counts = np.bincount(steps.numpy(), minlength=16)
    assert counts[10:].sum() == 0
    expected = len(steps) / 10
    chi2 = float(((counts[:10] - expected) ** 2 / expected).sum())
    assert chi2 < 27.88, (chi2, counts)  # 0.999 quantile of chi-square with 9 degrees of freedom


def test_sampling_is_seeded() -> None:
    buffer = ReplayBuffer(ReplayConfig(capacity=50, dim=D), device="cpu")
    _fill(buffer, 50)
    a = buffer.sample(32, torch.Generator().manual_seed(5))
    b = buffer.sample(32, torch.Generator().manual_seed(5))
    c = buffer.sample(32, torch.Generator().manual_seed(6))
    assert torch.equal(a.step_B, b.step_B) and torch.equal(a.cases_BKD, b.cases_BKD)
    assert not torch.equal(a.step_B, c.step_B)


def test_sampled_rows_are_consistent() -> None:
    buffer = ReplayBuffer(ReplayConfig(capacity=30, dim=D, k_max=3, store_next=True, c_max=2), device="cpu")
    _fill(buffer, 30, k=2, next_c=1)
    batch = buffer.sample(64, torch.Generator().manual_seed(0))
    i = batch.step_B.float()
    assert torch.equal(batch.state_BD[:, 0], i) and torch.equal(batch.next_state_BD[:, 0], -i)
    assert torch.equal(batch.cases_BKD[:, 0, 0], i + 0.5) and torch.equal(batch.policy_version_B, 10 * batch.step_B)
    assert batch.mask_BK.sum(1).tolist() == [2] * 64 and batch.next_mask_BC.sum(1).tolist() == [1] * 64


def test_sampling_an_empty_buffer_fails() -> None:
    with pytest.raises(MementoError, match="empty"):
        ReplayBuffer(ReplayConfig(capacity=3, dim=D), device="cpu").sample(4, torch.Generator())


def test_half_precision_storage_returns_float32() -> None:
    buffer = ReplayBuffer(ReplayConfig(capacity=4, dim=D, storage_dtype="float16"), device="cpu")
    _fill(buffer, 2)
    assert buffer.state_dict()["tensors"]["cases_VE"].dtype == torch.float16
    batch = _all_rows(buffer)
    assert batch.cases_BKD.dtype == torch.float32 and batch.cases_BKD[1, 0, 0] == 1.5


def test_replay_batch_checks_shapes() -> None:
    buffer = ReplayBuffer(ReplayConfig(capacity=4, dim=D, k_max=2), device="cpu")
    _fill(buffer, 3)
    fields = {name: getattr(_all_rows(buffer), name) for name in
              ("state_BD", "cases_BKD", "reward_B", "propensity_BK", "mask_BK", "done_B", "step_B", "policy_version_B")}
    with pytest.raises(DimensionError, match=r"mask_BK.shape=\(3, 3\) does not match state_BD.shape=\(3, 4\)"):
        ReplayBatch(**{**fields, "mask_BK": torch.ones(3, 3, dtype=torch.bool)})
    with pytest.raises(DataFormatError, match="come together"):
        ReplayBatch(**fields, next_state_BD=fields["state_BD"])


# ---------------------------------------------------------------- state and persistence


def _only_plain(value) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, dict):
        return all(isinstance(k, str) and _only_plain(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_only_plain(v) for v in value)
    return type(value) in (int, float, str, bool) or value is None


def test_state_dict_holds_only_tensors_and_plain_values() -> None:
    buffer = ReplayBuffer(ReplayConfig(capacity=6, dim=D, store_next=True, c_max=2), device="cpu")
    _fill(buffer, 4, next_c=2)
    state = buffer.state_dict()
    assert _only_plain(state)
    assert {type(state[k]) for k in ("ptr", "size", "added")} == {int}
    assert state["tensors"]["state_ix_N"].shape == (4,)  # only the filled rows


@pytest.mark.parametrize("storage_dtype", ["float32", "bfloat16"])
def test_save_load_round_trip_is_bit_exact(tmp_path, storage_dtype: str) -> None:
    config = ReplayConfig(capacity=7, dim=D, k_max=3, store_next=True, c_max=2, storage_dtype=storage_dtype)
    buffer = ReplayBuffer(config, device="cpu")
    rng = np.random.default_rng(0)
    for i in range(11):  # wraps around
        k, c = int(rng.integers(1, 4)), int(rng.integers(0, 3))
        buffer.add(Transition(state_D=rng.normal(size=D), cases_KD=rng.normal(size=(k, D)), reward=float(rng.random()),
                              propensity_K=rng.uniform(0.1, 1, size=k), done=bool(rng.random() < 0.5),
                              next_state_D=rng.normal(size=D), next_cands_CD=rng.normal(size=(c, D)),
                              step=i, policy_version=i // 3))
    buffer.save(tmp_path / "replay")
    assert sorted(p.name for p in (tmp_path / "replay").iterdir()) == ["replay.json", "replay.safetensors"]
    loaded = ReplayBuffer.load(tmp_path / "replay", device="cpu")
    assert loaded.config == config
    a, b = buffer.state_dict(), loaded.state_dict()
    plain = ("ptr", "size", "added", "config")
    assert {k: a[k] for k in plain} == {k: b[k] for k in plain}
    for name, tensor in a["tensors"].items():
        assert tensor.dtype == b["tensors"][name].dtype and torch.equal(tensor, b["tensors"][name]), name
    # continuing after the load behaves exactly as continuing the original
    for buf in (buffer, loaded):
        buf.add(_transition(99, k=1, next_c=1))
    x = buffer.sample(20, torch.Generator().manual_seed(1))
    y = loaded.sample(20, torch.Generator().manual_seed(1))
    for name in ("state_BD", "cases_BKD", "reward_B", "propensity_BK", "mask_BK", "done_B", "next_cands_BCD"):
        assert torch.equal(getattr(x, name), getattr(y, name)), name


def test_load_state_dict_rejects_another_config() -> None:
    a = ReplayBuffer(ReplayConfig(capacity=4, dim=D), device="cpu")
    b = ReplayBuffer(ReplayConfig(capacity=5, dim=D), device="cpu")
    with pytest.raises(CheckpointError, match="config"):
        b.load_state_dict(a.state_dict())


def test_load_detects_missing_and_torn_saves(tmp_path) -> None:
    with pytest.raises(CheckpointError, match="not a saved replay buffer"):
        ReplayBuffer.load(tmp_path / "nothing")
    buffer = ReplayBuffer(ReplayConfig(capacity=4, dim=D), device="cpu")
    _fill(buffer, 2)
    buffer.save(tmp_path / "a")
    first_meta = (tmp_path / "a" / "replay.json").read_text()
    _fill(buffer, 1)
    buffer.save(tmp_path / "a")
    (tmp_path / "a" / "replay.json").write_text(first_meta)  # a json from another save
    with pytest.raises(CheckpointError, match="different saves"):
        ReplayBuffer.load(tmp_path / "a", device="cpu")
    meta = json.loads(first_meta)
    meta["format"] = "something-else"
    (tmp_path / "a" / "replay.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="not a replay buffer file"):
        ReplayBuffer.load(tmp_path / "a", device="cpu")
    assert not list((tmp_path / "a").glob("*.tmp"))


# ---------------------------------------------------------------- config


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"dim": 0}, "ReplayConfig.dim=0"),
        ({"dim": 4, "capacity": 0}, "ReplayConfig.capacity=0"),
        ({"dim": 4, "k_max": 0}, "ReplayConfig.k_max=0"),
        ({"dim": 4, "c_max": 0}, "ReplayConfig.c_max=0"),
        ({"dim": 4, "store_next": 1}, "ReplayConfig.store_next=1"),
        ({"dim": 4, "storage_dtype": "int8"}, "ReplayConfig.storage_dtype='int8'"),
    ],
)
def test_config_validation(kwargs: dict, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        ReplayConfig(**kwargs)
    assert str(info.value).startswith(expected + ":"), str(info.value)


def test_config_round_trip() -> None:
    cfg = ReplayConfig(capacity=10, dim=3, k_max=2, store_next=True, c_max=5, storage_dtype="float16")
    assert from_dict(ReplayConfig, to_dict(cfg)) == cfg


# ---------------------------------------------------------------- GPU


@pytest.mark.gpu
def test_buffer_on_cuda_samples_on_cuda(tmp_path) -> None:
    buffer = ReplayBuffer(ReplayConfig(capacity=64, dim=D, k_max=2, store_next=True, c_max=3), device="cuda")
    _fill(buffer, 40, next_c=2)
    with pytest.raises(MementoError, match="generator"):
        buffer.sample(8, torch.Generator())
    batch = buffer.sample(32, torch.Generator(device="cuda").manual_seed(0))
    assert batch.state_BD.device.type == "cuda" and batch.next_cands_BCD.device.type == "cuda"
    assert torch.equal(batch.state_BD[:, 0], batch.step_B.float())
    buffer.save(tmp_path / "r")
    cpu = ReplayBuffer.load(tmp_path / "r", device="cpu")
    for name, tensor in buffer.state_dict()["tensors"].items():
        assert torch.equal(tensor.cpu(), cpu.state_dict()["tensors"][name]), name


def test_transition_keeps_underflowing_propensities_positive():
    from memento.learn.replay import Transition

    t = Transition(state_D=np.ones(4), cases_KD=np.ones((2, 4)), reward=1.0, propensity_K=np.array([0.5, 1e-60]))
    assert t.propensity_K.dtype == np.float32 and (t.propensity_K > 0).all()
    with pytest.raises(DataFormatError, match="must lie in"):
        Transition(state_D=np.ones(4), cases_KD=np.ones((2, 4)), reward=1.0, propensity_K=np.array([0.5, 0.0]))
