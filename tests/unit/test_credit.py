"""Leave-one-out credit (LoopConfig.credit) against a known answer: one harmful case among the K shown.

A SYNTHETIC text environment: the bank holds four demonstrations and every task shows all four (C = K = 4),
so there is no choice to learn from and every task fails (the harmful case is always shown): the shared
task reward is 0 for every case and cannot tell them apart. The planner's scores know better: the gold
answer's log-likelihood rises by 1 nat with each helpful case and falls by 3 with the harmful one, so leaving
a helpful case out lowers it (target sigmoid(1) = 0.73) and leaving the harmful one out raises it (target
sigmoid(-3) = 0.05). Per-case credit must single the harmful case out; shared credit gives every case the
same target.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
import torch

from memento.errors import ConfigError
from memento.planners.base import CallablePlanner, PlannerError
from memento.policies import SoftQConfig, make_policy
from memento.runs.qa import LoopConfig, OnlineLoop
from memento.types import Case, Task
from tests.loop_env import ExactJudge, HashingEncoder

HARMFUL = "Which colour is a lemon? (a trick)"
SEEDS = [Case(state="Which colour is a banana?", action="yellow", reward=1.0),
         Case(state="Which colour is grass?", action="green", reward=1.0),
         Case(state="Which colour is the sky?", action="blue", reward=1.0),
         Case(state=HARMFUL, action="The answer is: purple, obviously.", reward=1.0)]
TASKS = [Task(id=f"t{i}", question=f"Which colour is fruit number {i}?", answers=("red",)) for i in range(12)]


def _plan(task: Task, cases: Sequence[Case]) -> str:
    return "The answer is red." if any(c.state == HARMFUL for c in cases) else task.answers[0]


def _score(task: Task, cases: Sequence[Case], answer: str) -> float:
    return -5.0 + sum(-3.0 if c.state == HARMFUL else 1.0 for c in cases)


def _run(tmp_path, credit: str) -> OnlineLoop:
    torch.set_num_threads(1)
    config = LoopConfig(steps=40, k=4, candidates=4, retain=False, tensorboard=False, checkpoint_every=0,
                        credit=credit, policy=SoftQConfig(warmup=4, updates_per_step=4))  # type: ignore[arg-type]
    loop = OnlineLoop(config, make_policy=make_policy, encoder=HashingEncoder(), judge=ExactJudge(),
                      planner=CallablePlanner(_plan, score_fn=_score), tasks=TASKS, seed_cases=SEEDS,
                      out_dir=tmp_path / credit)
    loop.run()
    return loop


def _q_by_state(loop: OnlineLoop) -> dict[str, float]:
    encoder = HashingEncoder()
    state_D = encoder.encode([TASKS[0].question])[0]
    from memento.bank import CaseBank

    with CaseBank.open(loop.run_dir.bank) as bank:
        cands = bank.candidates(state_D, 4)
        states = {case.id: case.state for case in bank.get(list(cands.ids))}
        q_C = loop.policy.q_values(state_D, cands)  # type: ignore[attr-defined]
    return {states[cid]: float(q) for cid, q in zip(cands.ids, q_C)}


def test_leave_one_out_credit_singles_out_the_harmful_case(tmp_path) -> None:
    loop = _run(tmp_path, "leave_one_out")
    assert loop.successes == [False] * 40  # the harmful case is always shown: every task fails
    q = _q_by_state(loop)
    others = [v for s, v in q.items() if s != HARMFUL]
    assert q[HARMFUL] < min(others) - 1.0, q
    assert loop.counters["score_calls"] == 40 * 5  # K + 1 scored prompts per task


def test_shared_credit_gives_every_case_the_same_target(tmp_path) -> None:
    loop = _run(tmp_path, "shared")
    replay = loop.policy.buffer  # type: ignore[attr-defined]
    batch = replay.sample(len(replay), torch.Generator().manual_seed(0))
    assert torch.all(batch.reward_B == 0.0)  # nothing tells the four cases apart
    records = (loop.run_dir.steps.read_text(encoding="utf-8")).splitlines()
    assert all('"case_credit"' not in line for line in records)


class _PlanOnly:
    def plan(self, task: Task, cases: Sequence[Case]) -> str:
        return _plan(task, cases)

    def plan_many(self, tasks: Sequence[Task], cases: Sequence[Sequence[Case]]) -> list[str]:
        return [_plan(t, c) for t, c in zip(tasks, cases)]


def test_leave_one_out_needs_a_scoring_planner(tmp_path) -> None:
    config = LoopConfig(steps=2, k=4, candidates=4, credit="leave_one_out", tensorboard=False)
    with pytest.raises(ConfigError, match="scores answers"):
        OnlineLoop(config, make_policy=make_policy, encoder=HashingEncoder(), judge=ExactJudge(),
                   planner=_PlanOnly(), tasks=TASKS, seed_cases=SEEDS, out_dir=tmp_path / "x")  # type: ignore[arg-type]
    loop = OnlineLoop(config, make_policy=make_policy, encoder=HashingEncoder(), judge=ExactJudge(),
                      planner=CallablePlanner(_plan), tasks=TASKS, seed_cases=SEEDS, out_dir=tmp_path / "y")
    with pytest.raises(PlannerError, match="cannot score") as error:  # a planner that says it cannot: one line
        loop.run()
    assert "\n" not in str(error.value)
    with pytest.raises(ConfigError, match="credit"):
        LoopConfig(credit="per_token")  # type: ignore[arg-type]


def test_leave_one_out_targets_are_logged_per_case(tmp_path) -> None:
    import json

    loop = _run(tmp_path, "leave_one_out")
    first = json.loads(loop.run_dir.steps.read_text(encoding="utf-8").splitlines()[0])
    credit = dict(zip(first["chosen_ids"], first["case_credit"]))
    assert len(credit) == 4
    np.testing.assert_allclose(sorted(credit.values()), sorted([1 / (1 + np.exp(3.0))] + [1 / (1 + np.exp(-1.0))] * 3),
                               rtol=1e-9)
