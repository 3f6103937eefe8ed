"""memento.training.config and .data: the typed run config, the three readers, the split by state, the batches.

Texts are encoded with the hashing encoder of tests/loop_env.py (no model to load); the real MiniLM runs in
tests/integration/test_train_cli.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from memento.config import EncoderConfig, LearnerConfig, QNetConfig, to_dict
from memento.errors import ConfigError, DataFormatError
from memento.learn.replay import ReplayBatch
from memento.policies import RandomConfig, make_policy
from memento.runs.qa import LoopConfig, run_online
from memento.training.config import (
    DataConfig,
    LightningConfig,
    TrainConfig,
    TrainerConfig,
    load_train_config,
    save_train_config,
    train_config_from_dict,
)
from memento.training.data import (
    EpochSampler,
    QDataModule,
    RankingBatch,
    TrainingData,
    label_warning,
    load_cases_rewards,
    load_memento_pairs,
    load_transition_log,
    split_by_state,
)
from tests.loop_env import ExactJudge, HashingEncoder, make_env

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "memento"
PAIRS, MEMORY = FIXTURES / "training_data.jsonl", FIXTURES / "memory.jsonl"


def synthetic_data(n_states: int = 30, n_cases: int = 40, dim: int = 8, rows: int = 300, k: int = 2,
                   seed: int = 0, mixed: bool = True) -> TrainingData:
    """Random unit vectors; the reward depends on the first chosen case (mixed labels) or only on the state."""
    rng = np.random.default_rng(seed)

    def unit(n: int) -> np.ndarray:
        x = rng.normal(size=(n, dim)).astype(np.float32)
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    states, cases = unit(n_states), unit(n_cases)
    state_n = rng.integers(0, n_states, rows)
    cases_nk = rng.integers(0, n_cases, (rows, k))
    reward = (states[state_n] * cases[cases_nk[:, 0]]).sum(1) > 0 if mixed else state_n % 2 == 0
    return TrainingData(states_SD=states, cases_MD=cases, state_texts=[f"state {i}" for i in range(n_states)],
                        case_keys=[f"c{i}" for i in range(n_cases)], state_N=state_n, cases_NK=cases_nk,
                        mask_NK=np.ones((rows, k), dtype=bool), reward_N=reward.astype(np.float32),
                        propensity_NK=rng.uniform(0.1, 1.0, (rows, k)).astype(np.float32),
                        done_N=np.ones(rows, dtype=bool), origins=[f"synthetic:{i + 1}" for i in range(rows)],
                        source="cases")


# ---------------------------------------------------------------- config


def _config(lightning: LightningConfig | None = None, **trainer) -> TrainConfig:
    return TrainConfig(data=DataConfig(source="memento", memento_pairs=str(PAIRS), memento_memory=str(MEMORY)),
                       qnet=QNetConfig(dim=384), learner=LearnerConfig(batch_size=64),
                       trainer=TrainerConfig(lightning=lightning or LightningConfig(), **trainer))


def test_config_round_trip(tmp_path):
    config = _config(LightningConfig(devices="0,1", precision="bf16-mixed"), hit_k=(4, 1))
    config = TrainConfig(data=DataConfig(source="log", log="run", encoder=EncoderConfig(pooling="cls")),
                         qnet=config.qnet, learner=config.learner, trainer=config.trainer)
    assert config.trainer.hit_k == (1, 4)
    save_train_config(config, tmp_path / "config.json")
    assert load_train_config(tmp_path / "config.json") == config
    raw = json.loads((tmp_path / "config.json").read_text())
    assert set(raw) == {"data", "qnet", "learner", "trainer"} and raw["trainer"]["hit_k"] == [1, 4]
    assert raw["trainer"]["lightning"] == {"accelerator": "auto", "devices": "0,1", "num_nodes": 1, "strategy": "auto",
                                           "precision": "bf16-mixed", "log_every_n_steps": 10}
    assert LightningConfig(devices="2").devices == 2 and LightningConfig(devices=-1).devices == -1


def test_config_written_before_the_nesting_still_loads(tmp_path):
    """A config.json with the trainer's Lightning fields flat (as runs wrote them before) reads as the nested form."""
    config = _config(LightningConfig(accelerator="cpu", devices=2, precision="32-true", log_every_n_steps=3),
                     max_epochs=7)
    raw = to_dict(config)
    raw["trainer"].update(raw["trainer"].pop("lightning"))
    (tmp_path / "config.json").write_text(json.dumps(raw))
    assert load_train_config(tmp_path / "config.json") == config
    raw["trainer"]["lightning"] = {"devices": 1}
    with pytest.raises(ConfigError, match="'devices' is given twice, flat and as lightning.devices"):
        train_config_from_dict(raw)


def test_config_dim_comes_from_the_encoder(tmp_path):
    raw = to_dict(_config())
    del raw["qnet"]["dim"]
    assert train_config_from_dict(raw, dim=16).qnet.dim == 16
    with pytest.raises(ConfigError, match="qnet.dim: missing"):
        train_config_from_dict(raw)
    raw["qnet"]["dim"] = 384
    with pytest.raises(ConfigError, match="qnet.dim=384: the encoder gives dim=16"):
        train_config_from_dict(raw, dim=16)
    (tmp_path / "bad.json").write_text('{"data": {"source": "log", "log": "x"}, "qnet": {"dim": 8},\n "oops": 1}')
    with pytest.raises(ConfigError, match=r"bad.json: TrainConfig: unknown field\(s\) \['oops'\]"):
        load_train_config(tmp_path / "bad.json")
    (tmp_path / "broken.json").write_text('{\n"data": }')
    with pytest.raises(ConfigError, match="broken.json:2: invalid JSON"):
        load_train_config(tmp_path / "broken.json")


@pytest.mark.parametrize("make, message", [
    (lambda: DataConfig(source="log"), "DataConfig.log=None: is required for source='log'"),
    (lambda: DataConfig(source="memento", memento_pairs="p"), "memento_memory=None: is required"),
    (lambda: DataConfig(source="log", log="x", rewards="r"), "rewards='r': belongs to source='cases'"),
    (lambda: DataConfig(source="cases", cases="c", rewards="r", bank="b"), "bank='b': is only used with"),
    (lambda: DataConfig(source="log", log="x", val_fraction=1.0), "val_fraction=1.0"),
    (lambda: DataConfig(source="sql", log="x"), "DataConfig.source='sql'"),
    (lambda: LightningConfig(devices=0), "LightningConfig.devices=0"),
    (lambda: LightningConfig(devices="gpu0"), "LightningConfig.devices='gpu0'"),
    (lambda: TrainerConfig(max_steps=0), "TrainerConfig.max_steps=0"),
    (lambda: LightningConfig(precision="fp8"), "LightningConfig.precision='fp8'"),
    (lambda: TrainerConfig(hit_k=(1, 1)), "TrainerConfig.hit_k"),
    (lambda: LightningConfig(strategy=" "), "LightningConfig.strategy"),
    (lambda: LightningConfig(accelerator="tpu"), "LightningConfig.accelerator='tpu'"),
    (lambda: TrainerConfig(lightning={"devices": 1}), "TrainerConfig.lightning=.*must be a LightningConfig"),
    (lambda: TrainConfig(data=DataConfig(source="memento", memento_pairs="p", memento_memory="m"),
                         qnet=QNetConfig(dim=4), learner=LearnerConfig(gamma=0.9)), "gamma > 0 .* needs next states"),
])
def test_config_rejects_bad_values(make, message):
    with pytest.raises(ConfigError, match=message):
        make()


# ---------------------------------------------------------------- readers


def test_memento_pairs_have_no_mixed_labels():
    data = load_memento_pairs(PAIRS, MEMORY, HashingEncoder(dim=32))
    assert (data.n_rows, data.k_max, data.dim, data.source) == (400, 1, 32, "memento")
    stats = data.label_stats(0.5)
    assert stats == {"rows": 400, "pairs": 400, "states": 50, "mixed": 0, "all_rewarded": 8, "all_unrewarded": 42}
    assert data.notes["cases_not_in_memory"] == 97 and data.notes["memory_cases"] == 200
    assert data.origins[0] == f"{PAIRS}:1" and set(data.reward_N.tolist()) == {0.0, 1.0}
    np.testing.assert_allclose(np.linalg.norm(data.states_SD, axis=1), 1.0, rtol=1e-5)
    warning = label_warning(stats)
    assert warning is not None and "no state has mixed labels" in warning and "all 50 states" in warning
    assert "only 10 of 50 states" in str(label_warning({**stats, "mixed": 10}))
    assert label_warning({**stats, "mixed": 40}) is None


def _write(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def test_cases_and_rewards(tmp_path):
    cases = _write(tmp_path / "cases.jsonl", [
        {"id": "a", "state": "capital of France?", "action": "Paris", "reward": 1},
        {"id": "b", "state": "colour of a lime?", "action": "green", "reward": 1}])
    rewards = _write(tmp_path / "rewards.jsonl", [
        {"state": "capital of Spain?", "case_id": "a", "reward": 1.0},
        {"state": "capital of Spain?", "case_id": "b", "reward": 0.0, "propensity": 0.5},
        "",
        {"state": "colour of a plum?", "case_id": "b", "reward": 1.0}])
    data = load_cases_rewards(cases, rewards, HashingEncoder(dim=16))
    assert data.n_rows == 3 and data.case_keys == ["a", "b"] and data.state_texts[1] == "colour of a plum?"
    assert data.propensity_NK[:, 0].tolist() == [1.0, 0.5, 1.0] and data.origins[2] == f"{rewards}:4"
    assert data.label_stats(0.5)["mixed"] == 1


@pytest.mark.parametrize("row, message", [
    ({"state": "q", "case_id": "zzz", "reward": 1.0}, "rewards.jsonl:2: case id 'zzz' is not in"),
    ({"state": "q", "case_id": "a", "reward": "yes"}, r"rewards.jsonl:2: field 'reward' must be a number in \[0, 1\]"),
    ({"state": "q", "case_id": "a", "reward": -1}, r"rewards.jsonl:2: field 'reward' must be a number in \[0, 1\]"),
    ({"state": "q", "case_id": "a", "reward": 1e39}, r"rewards.jsonl:2: field 'reward' must be a number in \[0, 1\]"),
    ({"state": "", "case_id": "a", "reward": 1.0}, "rewards.jsonl:2: field 'state' must be a non-empty string"),
    ({"state": "q", "case_id": "a", "reward": 1.0, "propensity": 0}, "rewards.jsonl:2: field 'propensity' must be"),
    ({"state": "q", "case": "a", "reward": 1.0}, r"rewards.jsonl:2: unknown field\(s\) \['case'\]"),
    ("{not json", "rewards.jsonl:2: invalid JSON"),
])
def test_bad_reward_rows_name_file_and_line(tmp_path, row, message):
    cases = _write(tmp_path / "cases.jsonl", [{"id": "a", "state": "s", "action": "x", "reward": 1}])
    rewards = _write(tmp_path / "rewards.jsonl", [{"state": "q", "case_id": "a", "reward": 0.0}, row])
    with pytest.raises(DataFormatError, match=message):
        load_cases_rewards(cases, rewards, HashingEncoder(dim=8))


def test_cases_without_ids_are_refused(tmp_path):
    cases = _write(tmp_path / "cases.jsonl", [{"id": "a", "state": "s", "action": "x", "reward": 1},
                                              {"state": "t", "action": "y", "reward": 0}])
    rewards = _write(tmp_path / "rewards.jsonl", [{"state": "q", "case_id": "a", "reward": 0.0}])
    with pytest.raises(DataFormatError, match="cases.jsonl:2: the case has no 'id'"):
        load_cases_rewards(cases, rewards, HashingEncoder(dim=8))


@pytest.fixture(scope="module")
def log_run(tmp_path_factory) -> Path:
    """40 online steps of the random policy on the synthetic text environment (hashing encoder: instant)."""
    env = make_env()
    out = tmp_path_factory.mktemp("log") / "run"
    run_online(LoopConfig(steps=40, policy=RandomConfig(), checkpoint_every=0, tensorboard=False),
               make_policy=make_policy, encoder=HashingEncoder(), planner=env.planner(), judge=ExactJudge(),
               tasks=env.tasks, seed_cases=env.seed_cases, out_dir=out)
    return out


def test_transition_log(log_run):
    records = [json.loads(line) for line in (log_run / "steps.jsonl").read_text().splitlines()]
    data = load_transition_log(log_run, HashingEncoder())
    assert data.n_rows == 40 and data.k_max == 4 and not data.has_next
    assert data.state_texts[0] == records[0]["state"] and data.reward_N.tolist() == [r["reward"] for r in records]
    np.testing.assert_allclose(data.propensity_NK[0], records[0]["propensities"], rtol=1e-6)
    assert [data.case_keys[i] for i in data.cases_NK[0]] == records[0]["chosen_ids"]
    assert data.notes["bank"] == str(log_run / "bank") and data.origins[3] == f"{log_run / 'steps.jsonl'}:4"
    assert load_transition_log(log_run / "steps.jsonl", HashingEncoder()).n_rows == 40


def test_transition_log_errors_and_next_states(log_run, tmp_path):
    lines = (log_run / "steps.jsonl").read_text().splitlines()
    bad = json.loads(lines[2])
    bad["chosen_ids"][1] = "no-such-case"
    steps = _write(tmp_path / "steps.jsonl", [lines[0], lines[1], json.dumps(bad)])
    with pytest.raises(DataFormatError, match=r"steps.jsonl:3: case id 'no-such-case' is not in the bank"):
        load_transition_log(steps, HashingEncoder(), bank=log_run / "bank")
    short = {**json.loads(lines[0]), "propensities": [0.5]}
    with pytest.raises(DataFormatError, match="steps.jsonl:1: field 'propensities' must be a list of 4"):
        load_transition_log(_write(tmp_path / "steps.jsonl", [json.dumps(short)]), HashingEncoder(),
                            bank=log_run / "bank")
    with pytest.raises(DataFormatError, match="transition log not found"):
        load_transition_log(tmp_path / "nowhere", HashingEncoder())
    with pytest.raises(DataFormatError, match=r"a comparison directory .*pass one of them: .*log"):
        load_transition_log(log_run.parent, HashingEncoder())
    first, second = json.loads(lines[0]), json.loads(lines[1])
    first.update(done=False, next_state=second["state"], next_candidate_ids=second["candidate_ids"][:5])
    data = load_transition_log(_write(tmp_path / "steps.jsonl", [json.dumps(first), lines[1]]), HashingEncoder(),
                               bank=log_run / "bank")
    assert data.has_next and data.next_state_N.tolist()[1] == -1 and data.next_mask_NC.sum(1).tolist() == [5, 0]
    assert data.done_N.tolist() == [False, True]


# ---------------------------------------------------------------- split


@pytest.mark.parametrize("seed", range(5))
def test_split_by_state_has_no_leakage(seed):
    data = synthetic_data(seed=seed)
    train, val = split_by_state(data, 0.25, seed)
    assert len(train) + len(val) == data.n_rows and not set(train.tolist()) & set(val.tolist())
    train_states, val_states = set(data.state_N[train].tolist()), set(data.state_N[val].tolist())
    assert not train_states & val_states
    assert {data.state_texts[s] for s in train_states}.isdisjoint(data.state_texts[s] for s in val_states)
    assert len(val_states) == pytest.approx(0.25 * len(train_states | val_states), abs=2)
    again = split_by_state(data, 0.25, seed)
    assert np.array_equal(again[1], val)  # seeded


def test_split_is_stratified_by_state_kind():
    data = synthetic_data(n_states=20, mixed=False)  # even states all rewarded, odd all unrewarded
    _, val = split_by_state(data, 0.2, 0)
    kinds = data.state_kinds(0.5, val)
    assert sorted(kinds.values()) == ["rewarded", "rewarded", "unrewarded", "unrewarded"]
    one_state = synthetic_data(n_states=1)
    with pytest.raises(DataFormatError, match="1 distinct state"):
        split_by_state(one_state, 0.2, 0)
    train, val = split_by_state(synthetic_data(n_states=2, rows=20), 0.2, 0)  # tiny: one state each
    assert len(train) and len(val)


# ---------------------------------------------------------------- the DataModule


def test_datamodule_serves_replay_batches_and_ranking_groups():
    data = synthetic_data()
    config = DataConfig(source="cases", cases="unused", rewards="unused", val_fraction=0.3)
    dm = QDataModule(config, batch_size=16, data=data)
    dm.prepare_data()
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert isinstance(batch, ReplayBatch) and batch.state_BD.shape == (16, 8) and batch.cases_BKD.shape == (16, 2, 8)
    rows = batch.step_B.numpy()  # step_B carries the row index
    np.testing.assert_array_equal(batch.state_BD.numpy(), data.states_SD[data.state_N[rows]])
    np.testing.assert_array_equal(batch.reward_B.numpy(), data.reward_N[rows])
    assert set(rows.tolist()) <= set(dm.train_rows.tolist())
    val_loader, ranking_loader = dm.val_dataloader()
    assert sum(b.batch_size for b in val_loader) == len(dm.val_rows)
    groups = next(iter(ranking_loader))
    assert isinstance(groups, RankingBatch) and groups.label_GC.shape == groups.mask_GC.shape
    assert ((groups.label_GC * groups.mask_GC).sum(1) > 0).all()  # each group has a rewarded case ...
    assert (((1 - groups.label_GC) * groups.mask_GC).sum(1) > 0).all()  # ... and an unrewarded one
    stats = dm.stats()
    assert stats["val"]["states"] + stats["train"]["states"] == stats["all"]["states"] == 30


def test_datamodule_checks_rewards_and_next_states():
    data = synthetic_data()
    data.reward_N[5] = 2.0
    dm = QDataModule(DataConfig(source="cases", cases="c", rewards="r"), batch_size=8, data=data)
    with pytest.raises(DataFormatError, match=r"synthetic:6: reward 2.0 is outside \[0, 1\]"):
        dm.setup("fit")
    dm = QDataModule(DataConfig(source="log", log="x"), batch_size=8, data=synthetic_data(), gamma=0.9)
    with pytest.raises(DataFormatError, match="needs next states"):
        dm.setup("fit")


def test_epoch_sampler_is_a_seeded_permutation_per_epoch():
    sampler = EpochSampler(10, seed=3)
    first = list(sampler)
    assert sorted(first) == list(range(10)) and list(sampler) == first
    sampler.set_epoch(1)
    assert list(sampler) != first
    sampler.set_epoch(0)
    assert list(sampler) == first
    assert list(EpochSampler(10, seed=4)) != first

