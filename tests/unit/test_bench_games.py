"""``memento bench games`` on the tiny suite with the scripted planner: the protocol, the statistics, the JSON."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from memento.bench.games import GamesBenchConfig, arm_config, format_games_table, run_games_bench, t_interval
from memento.errors import ConfigError
from memento.policies import SoftQConfig
from tests.game_env import HashingEncoder, ScriptedPlanner, walkthrough_commands


def test_t_interval() -> None:
    out = t_interval([0.5, 0.7, 0.6])
    assert out["mean"] == pytest.approx(0.6) and out["n"] == 3
    assert out["ci95"] == pytest.approx(4.303 * np.std([0.5, 0.7, 0.6], ddof=1) / np.sqrt(3))
    assert t_interval([0.4]) == {"mean": 0.4, "ci95": 0.0, "n": 1}


def test_arms() -> None:
    assert arm_config("none")[0] is False
    memory, policy = arm_config("soft_q-g0.9")
    assert memory and isinstance(policy, SoftQConfig) and policy.learner.gamma == 0.9
    for bad in ("soft_q-g1.5", "soft_q-gx", "oracle"):
        with pytest.raises(ConfigError, match="arm"):
            arm_config(bad)


def test_bench_on_the_tiny_suite(tmp_path: Path, tiny_games) -> None:
    planner = ScriptedPlanner(walkthrough_commands(tiny_games["train"] + tiny_games["test"] + tiny_games["ood"]))
    config = GamesBenchConfig(suite="tw-tiny", arms=("none", "similarity", "soft_q-g0.9"), seeds=(0, 1),
                              train_episodes=3, eval_repeats=2, max_steps=4)
    results = run_games_bench(config, out=tmp_path / "r.json", workdir=tmp_path / "w", planner=planner,
                              encoder=HashingEncoder())
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["summary"] == results["summary"] and "finished" in saved
    for split, n_games in (("test", 2), ("ood", 1)):
        for arm in config.arms:
            run = results["runs"]["0"][arm][split]
            assert run["episodes"] == 2 * n_games
            row = results["summary"][split][arm]
            assert row["success_rate"]["n"] == 2 and 0.0 <= row["success_rate"]["mean"] <= 1.0
        assert "success_minus_none" in results["summary"][split]["similarity"]
    assert results["runs"]["0"]["none"]["train"] is None
    assert results["runs"]["0"]["similarity"]["train"]["episodes"] == 3
    assert set(results["summary"]["train"]) == {"similarity", "soft_q-g0.9"}
    assert "test:" in format_games_table(results)
    # continual evaluation reuses the train runs and keeps retaining and learning on the evaluation stream
    continual = GamesBenchConfig(**{**config.__dict__, "continual": True, "resume": True, "splits": ("test",)})
    more = run_games_bench(continual, out=tmp_path / "c.json", workdir=tmp_path / "w", planner=planner,
                           encoder=HashingEncoder())
    assert set(more["summary"]) == {"test-continual", "train"}
    assert more["runs"]["0"]["similarity"]["train"] == results["runs"]["0"]["similarity"]["train"]
    assert more["runs"]["0"]["similarity"]["test-continual"]["bank_size_end"] \
        > results["runs"]["0"]["similarity"]["test"]["bank_size_end"]
