"""The game loop (memento.runs.games) on real tiny TextWorld games with a scripted planner and a hashing encoder."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from memento.bank import CaseBank
from memento.config import from_dict, to_dict
from memento.errors import CheckpointError, ConfigError, GameError
from memento.learn.replay import ReplayBuffer
from memento.policies import SimilarityConfig, loop_policy, make_policy
from memento.runs.games import GameLoop, GameLoopConfig, discounted_returns, run_games
from tests.game_env import HashingEncoder, ScriptedPlanner, walkthrough_commands


@pytest.fixture(scope="module")
def games(tiny_games: dict[str, list[Path]]) -> list[Path]:
    return tiny_games["train"]


@pytest.fixture(scope="module")
def preferred(games: list[Path]) -> list[str]:
    return walkthrough_commands(games)


def _soft_q(gamma: float = 0.9) -> object:
    policy = loop_policy("soft_q", gamma=gamma)
    return dataclasses.replace(policy, warmup=2)


def _run(out: Path, games: list[Path], preferred: list[str], config: GameLoopConfig, **kwargs) -> dict:
    planner = kwargs.pop("planner", None) or ScriptedPlanner(preferred)
    return run_games(config, make_policy=make_policy, encoder=HashingEncoder(), planner=planner, games=games,
                     out_dir=out, **kwargs)


def _state(out: Path) -> dict:
    steps = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    episodes = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    with CaseBank.open(out / "bank") as bank:
        cases = [(c.id, c.state, c.action, c.reward, c.env, c.meta.get("granularity")) for c in bank.iter_cases()]
    tensors = load_file(str(out / "selector" / "learner.safetensors")) if (out / "selector").is_dir() else {}
    return {"commands": [s["output"] for s in steps], "rewards": [s["reward"] for s in steps],
            "chosen": [s["chosen_ids"] for s in steps], "steps": [s["step"] for s in steps],
            "episodes": [(e["game"], e["won"], e["steps"], e["commands"]) for e in episodes], "bank": cases,
            "tensors": tensors}


def test_discounted_returns() -> None:
    np.testing.assert_allclose(discounted_returns([0.0, 0.5, 0.5], 0.5), [0.375, 0.75, 0.5])
    np.testing.assert_allclose(discounted_returns([1.0], 0.9), [1.0])
    assert discounted_returns([], 0.9).shape == (0,)


def test_soft_td_run_end_to_end(tmp_path: Path, games: list[Path], preferred: list[str]) -> None:
    config = GameLoopConfig(episodes=6, policy=_soft_q(0.9), checkpoint_every=4, game=dataclasses.replace(
        GameLoopConfig().game, max_steps=6))
    summary = _run(tmp_path / "run", games, preferred, config)
    assert summary["episodes"] == 6 and summary["steps"] == sum(1 for _ in (tmp_path / "run/steps.jsonl").open())
    assert 0.0 < summary["success_rate"] <= 1.0 and summary["updates"] > 0
    assert summary["bank_size_end"] > 0 and summary["retained"] == summary["bank_size_end"]
    state = _state(tmp_path / "run")
    kinds = {granularity for *_, granularity in state["bank"]}
    assert kinds == {"step", "episode"}
    for _, _, action, reward, env, granularity in state["bank"]:
        assert env == "custom" and 0.0 <= reward <= 1.0
        if granularity == "episode":
            assert action.startswith("> ")
    # the replay buffer of a gamma > 0 run keeps next states and their candidates, and terminal flags
    buffer = ReplayBuffer.load(tmp_path / "run" / "checkpoint" / "replay")
    assert buffer.config.store_next and len(buffer) == summary["decisions"]
    batch = buffer.sample(len(buffer), torch.Generator().manual_seed(0))
    assert batch.next_state_BD is not None and bool(batch.done_B.any())
    assert list((tmp_path / "run" / "tb").glob("events.out.tfevents.*"))
    for name in ("config.json", "run.json", "summary.json", "episodes.jsonl", "selector/learner.json"):
        assert (tmp_path / "run" / name).is_file(), name
    saved = from_dict(GameLoopConfig, json.loads((tmp_path / "run" / "config.json").read_text()))
    assert saved == config


def test_seeded_runs_are_identical(tmp_path: Path, games: list[Path], preferred: list[str]) -> None:
    config = GameLoopConfig(episodes=4, policy=_soft_q(0.9), seed=3, tensorboard=False)
    _run(tmp_path / "a", games, preferred, config)
    _run(tmp_path / "b", games, preferred, config)
    a, b = _state(tmp_path / "a"), _state(tmp_path / "b")
    assert a["commands"] == b["commands"] and a["chosen"] == b["chosen"] and a["bank"] == b["bank"]
    for name, tensor in a["tensors"].items():
        assert torch.equal(tensor, b["tensors"][name]), name


@pytest.mark.parametrize("gamma", [0.0, 0.9])
def test_crash_mid_episode_then_resume_equals_uninterrupted(tmp_path: Path, games: list[Path],
                                                            preferred: list[str], gamma: float,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The planner raises on its first call after the first mid-episode checkpoint; the resumed run replays the
    game to the checkpoint's step and ends where an uninterrupted run ends."""
    config = GameLoopConfig(episodes=6, policy=_soft_q(gamma), checkpoint_every=3, seed=5, tensorboard=False,
                            game=dataclasses.replace(GameLoopConfig().game, max_steps=5))
    _run(tmp_path / "ref", games, preferred, config)
    crashing = ScriptedPlanner(preferred)
    original = GameLoop._checkpoint

    def checkpoint_then_arm(self, bank):  # noqa: ANN001, ANN202
        original(self, bank)
        if self._episode is not None and crashing.fail_after is None:  # a mid-episode checkpoint
            crashing.fail_after = crashing.calls
    monkeypatch.setattr(GameLoop, "_checkpoint", checkpoint_then_arm)
    with pytest.raises(RuntimeError, match="scripted crash"):
        _run(tmp_path / "run", games, preferred, config, planner=crashing)
    monkeypatch.undo()
    saved = json.loads((tmp_path / "run" / "checkpoint" / "state.json").read_text())
    assert saved["in_progress"] is not None and saved["in_progress"]["steps"], "the crash was not mid-episode"
    summary = _run(tmp_path / "run", games, preferred, config, resume=True)
    assert summary["resumed_from"] == saved["step"]
    a, b = _state(tmp_path / "ref"), _state(tmp_path / "run")
    assert b["steps"] == list(range(len(b["steps"])))
    for key in ("commands", "rewards", "chosen", "episodes", "bank"):
        assert a[key] == b[key], key
    for name, tensor in a["tensors"].items():
        assert torch.equal(tensor, b["tensors"][name]), name


def test_episode_retrieval_keeps_one_choice_per_episode(tmp_path: Path, games: list[Path],
                                                        preferred: list[str]) -> None:
    config = GameLoopConfig(episodes=5, retrieval="episode", policy=SimilarityConfig(positive_only=True),
                            tensorboard=False, game=dataclasses.replace(GameLoopConfig().game, max_steps=4))
    _run(tmp_path / "run", games, preferred, config)
    steps = [json.loads(line) for line in (tmp_path / "run" / "steps.jsonl").read_text().splitlines()]
    by_episode: dict[str, set] = {}
    for s in steps:
        by_episode.setdefault(s["task_id"], set()).add(tuple(s["chosen_ids"]))
    assert all(len(choices) == 1 for choices in by_episode.values())
    assert any(s["chosen_ids"] for s in steps)


def test_no_memory_sees_no_case(tmp_path: Path, games: list[Path], preferred: list[str]) -> None:
    config = GameLoopConfig(episodes=3, memory=False, cases="none", policy=loop_policy("random"), tensorboard=False)
    summary = _run(tmp_path / "run", games, preferred, config)
    steps = [json.loads(line) for line in (tmp_path / "run" / "steps.jsonl").read_text().splitlines()]
    assert all(not s["chosen_ids"] for s in steps) and summary["bank_size_end"] == 0
    assert summary["arm"] == "none" and summary["from_case_share"] == 0.0


def test_step_limit_is_truncation_not_termination(tmp_path: Path, games: list[Path]) -> None:
    """A planner that never plays the walkthrough hits the step limit: those last decisions bootstrap (done=False)."""
    config = GameLoopConfig(episodes=3, policy=_soft_q(0.9), tensorboard=False,
                            game=dataclasses.replace(GameLoopConfig().game, max_steps=2))
    summary = _run(tmp_path / "run", games, [], config, planner=ScriptedPlanner(["nothing admissible"]))
    episodes = [json.loads(line) for line in (tmp_path / "run" / "episodes.jsonl").read_text().splitlines()]
    assert all(e["steps"] <= 2 for e in episodes)
    if summary["decisions"]:
        buffer = ReplayBuffer.load(tmp_path / "run" / "checkpoint" / "replay")
        batch = buffer.sample(len(buffer), torch.Generator().manual_seed(0))
        cut = [not e["won"] and not e["lost"] for e in episodes]
        if all(cut):
            assert not bool(batch.done_B.any())


def test_bad_input_is_one_line(tmp_path: Path, games: list[Path], preferred: list[str]) -> None:
    with pytest.raises(GameError, match="game file not found"):
        _run(tmp_path / "x", [tmp_path / "missing.z8"], preferred, GameLoopConfig(episodes=1))
    with pytest.raises(ConfigError, match="retrieval"):
        GameLoopConfig(retrieval="episode", policy=loop_policy("soft_q", gamma=0.9))
    with pytest.raises(ConfigError):
        GameLoopConfig(case_gamma=1.5)
    with pytest.raises(ConfigError):
        from_dict(GameLoopConfig, {"retrieval": "sometimes"})
    config = GameLoopConfig(episodes=2, policy=loop_policy("similarity"), tensorboard=False)
    _run(tmp_path / "run", games, preferred, config)
    with pytest.raises(ConfigError, match="already holds a run"):
        _run(tmp_path / "run", games, preferred, config)
    with pytest.raises(CheckpointError, match="differing field"):
        _run(tmp_path / "run", games, preferred, dataclasses.replace(config, k=1), resume=True)
    with pytest.raises(CheckpointError, match="other games"):
        _run(tmp_path / "run", games[:1], preferred, config, resume=True)


def test_config_round_trips_through_json() -> None:
    config = GameLoopConfig(policy=loop_policy("soft_q", gamma=0.8), retrieval="step", cases="step")
    assert from_dict(GameLoopConfig, json.loads(json.dumps(to_dict(config)))) == config
    assert config.arm == "soft_q-g0.8" and GameLoopConfig(memory=False).arm == "none"


def test_planner_executor_split_plans_once_per_episode(tmp_path: Path, games: list[Path],
                                                      preferred: list[str]) -> None:
    class Recording(ScriptedPlanner):
        def __init__(self, *args, **kwargs):  # noqa: ANN002, ANN003
            super().__init__(*args, **kwargs)
            self.plans, self.questions = 0, []

        def plan(self, task, cases):  # noqa: ANN001, ANN201
            self.plans += 1
            return super().plan(task, cases)

        def score_many(self, tasks, case_sets_per_task, answers=None):  # noqa: ANN001, ANN201
            self.questions.append(tasks[0].question)
            return super().score_many(tasks, case_sets_per_task, answers)

    planner = Recording(preferred)
    config = GameLoopConfig(episodes=3, plan=True, policy=loop_policy("similarity"), tensorboard=False)
    summary = _run(tmp_path / "run", games, preferred, config, planner=planner)
    assert planner.plans == summary["episodes"] == 3
    assert planner.questions and all(q.startswith("Plan: ") for q in planner.questions)
    steps = [json.loads(line) for line in (tmp_path / "run" / "steps.jsonl").read_text().splitlines()]
    assert not any(s["state"].startswith("Plan:") for s in steps)  # the encoded state has no plan
