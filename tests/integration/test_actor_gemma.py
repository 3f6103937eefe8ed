"""HFPlanner.score_options and the command actor on the real Gemma 3 270M base (slow: loads the model).

score_options shares one cached prompt pass among the options; it must give score_continuations' numbers,
also for a prompt longer than Gemma 3's 512-token sliding window.
"""

from __future__ import annotations

import numpy as np
import pytest

from memento.planners import HFPlanner
from memento.planners.actor import ActorConfig, CommandActor
from memento.types import Case, Task

pytestmark = pytest.mark.slow

STATE = ("-= Kitchen =-\nYou are in a kitchen. A closed wooden chest stands in the corner. On the table you see a "
         "rusty key and an apple. There is an open door leading north and a closed door leading east.\n"
         "Inventory: you are carrying a lamp.")
COMMANDS = ["go north", "go east", "open chest", "take rusty key", "take apple", "eat apple", "drop lamp",
            "examine table", "unlock chest with rusty key", "inventory", "look", "close door"]
CASES = [
    Case(state="-= Hall =-\nYou are in a hall. There is a brass key on the floor and a locked box.",
         action="take brass key", reward=1.0, meta={"granularity": "step"}),
    Case(state="-= Cellar =-\nA locked cabinet. A small key lies on a shelf.",
         action="> take small key\nYou pick up the small key.\n> unlock cabinet with small key\n> open cabinet",
         reward=1.0, meta={"granularity": "episode"}),
]


@pytest.fixture(scope="module")
def gemma() -> HFPlanner:
    return HFPlanner.default(device="cpu")


@pytest.mark.parametrize("repeats", [4, 12])  # ~290 tokens; ~700 tokens, past the sliding window
def test_score_options_equals_score_continuations(gemma, repeats):
    task = Task(id="kitchen", question="\n".join([STATE] * repeats), answers=("look",))
    prompt = gemma.render(task, CASES)
    n_prompt = len(gemma._tokenizer(prompt)["input_ids"])
    assert (n_prompt > 512) == (repeats > 4)
    options = [gemma.render_continuation(c) for c in (COMMANDS if repeats == 4 else COMMANDS[:6])]
    ref = gemma.score_continuations([prompt] * len(options), options)
    got = gemma.score_options(prompt, options)
    assert len(got) == len(options)
    for a, b in zip(got, ref):
        assert a.logprob == pytest.approx(b.logprob, abs=1e-3)
        assert (a.n_tokens, a.prompt_tokens, a.truncated_tokens) == (b.n_tokens, b.prompt_tokens, b.truncated_tokens)
    assert len({round(s.logprob, 2) for s in ref}) > 1
    assert gemma.score_options(prompt, []) == []


@pytest.mark.parametrize("mode", ["score", "generate"])
def test_actor_picks_an_admissible_command(gemma, mode):
    actor = CommandActor(gemma, ActorConfig(mode=mode, temperature=0.0, case_weight=0.0))
    choice = actor.act(STATE, COMMANDS, CASES, rng=np.random.default_rng(0), tried=["look"])
    assert choice.command in COMMANDS and choice.command != "look"
    assert set(choice.commands) == set(COMMANDS) and choice.probs_A.sum() == pytest.approx(1.0)
    assert choice.probs_A[choice.commands.index("look")] == 0.0
    if mode == "score":
        assert choice.source == "planner" and choice.probs_A.max() == 1.0
    again = actor.act(STATE, COMMANDS, CASES, rng=np.random.default_rng(0), tried=["look"])
    assert again.command == choice.command  # a frozen greedy planner and the same rng state


def test_gemma_plays_a_tiny_game_with_per_step_cases_and_soft_td(gemma, encoder, tiny_games, tmp_path):
    """The game loop end to end with the real planner and encoder: a few episodes, soft TD (gamma 0.9)."""
    import dataclasses
    import json

    from memento.policies import loop_policy, make_policy
    from memento.runs.games import GameLoopConfig, run_games

    policy = dataclasses.replace(loop_policy("soft_q", gamma=0.9), warmup=2)
    config = GameLoopConfig(episodes=3, policy=policy, tensorboard=False,
                            game=dataclasses.replace(GameLoopConfig().game, max_steps=4))
    summary = run_games(config, make_policy=make_policy, encoder=encoder, planner=gemma,
                        games=tiny_games["train"], out_dir=tmp_path / "run")
    steps = [json.loads(line) for line in (tmp_path / "run" / "steps.jsonl").read_text().splitlines()]
    assert summary["episodes"] == 3 and len(steps) == summary["steps"] and summary["invalid"] == 0
    assert summary["bank_size_end"] > 0 and 0.0 <= summary["success_rate"] <= 1.0
    assert any(s["chosen_ids"] for s in steps)  # later episodes saw cases retained by earlier ones
