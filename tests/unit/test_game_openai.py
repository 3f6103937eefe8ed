"""The game loop with an OpenAI-compatible planner: a loopback chat server plays a tiny game by a script."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from memento.envs.textworld import TextWorldEnv
from memento.planners.actor import ActorConfig
from memento.planners.openai_compat import OpenAICompatPlanner
from memento.policies import loop_policy, make_policy
from memento.runs.games import GameLoopConfig, run_games
from tests.game_env import HashingEncoder
from tests.unit.test_openai_compat import FakeServer, chat_reply


def _config(**changes: Any) -> GameLoopConfig:
    return GameLoopConfig(episodes=1, memory=False, cases="none", policy=loop_policy("random"), tensorboard=False,
                          actor=ActorConfig(mode="generate", case_weight=0.0), **changes)


def _play(tmp_path: Path, game: Path, replies: list[str], config: GameLoopConfig) -> tuple[dict, list[dict], list]:
    server = FakeServer()
    sent: list[dict] = []

    def answer(body: dict[str, Any]) -> dict[str, Any]:
        sent.append(body)
        return chat_reply(replies[min(len(sent), len(replies)) - 1])

    server.reset(("fn", answer))
    try:
        planner = OpenAICompatPlanner("scripted", server.base_url, api_key_env=None, timeout_s=5.0, max_retries=0)
        summary = run_games(config, make_policy=make_policy, encoder=HashingEncoder(), planner=planner, games=[game],
                            out_dir=tmp_path / "run")
    finally:
        server.close()
    episodes = [json.loads(line) for line in (tmp_path / "run" / "episodes.jsonl").read_text().splitlines()]
    return summary, episodes, sent


def test_a_loopback_server_wins_a_tiny_game_by_its_script(tmp_path: Path, tiny_games) -> None:
    game = tiny_games["train"][0]
    with TextWorldEnv(game) as env:
        env.reset()
        walkthrough = list(env.walkthrough)
    summary, episodes, sent = _play(tmp_path, game, walkthrough, _config())
    assert summary["success_rate"] == 1.0 and summary["unusable"] == 0
    assert episodes[0]["commands"] == walkthrough and len(sent) == len(walkthrough)
    prompt = sent[0]["messages"][-1]["content"]
    assert "Goal:" in prompt and "Now:" in prompt  # the state text reached the server


def test_a_server_that_answers_nothing_usable_gets_the_documented_fallback(tmp_path: Path, tiny_games) -> None:
    config = _config(game=GameLoopConfig().game.__class__(max_steps=3))
    summary, episodes, sent = _play(tmp_path, tiny_games["train"][1], ["zzzz qqqq"], config)
    assert episodes[0]["steps"] <= 3 and len(sent) == episodes[0]["steps"]
    assert summary["unusable"] == episodes[0]["steps"]  # every step fell back to a uniform admissible command
    steps = [json.loads(line) for line in (tmp_path / "run" / "steps.jsonl").read_text().splitlines()]
    assert all(s["reason"].startswith("fallback") for s in steps)
