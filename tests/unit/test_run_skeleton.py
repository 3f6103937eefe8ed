"""The run skeleton (memento.runs.base.Run): a toy run kind that writes only its act and commit hooks gets the seeds,
the run directory, checkpoints, resume (an interrupted and resumed run equals an uninterrupted one) and a summary."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections import deque
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch
from safetensors.torch import load_file

from memento.bank import CaseBank
from memento.policies import loop_policy, make_policy
from memento.runs.base import Run, RunConfig, timed
from memento.runs.rundir import RunDir
from memento.types import Case
from tests.loop_env import HashingEncoder

QUESTIONS = [f"what is {a} plus {b}" for a in range(3) for b in range(3)]


# ---------------------------------------------------------------- the toy run kind (its whole definition)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ToyConfig(RunConfig):
    steps: int = 14


class Unit(NamedTuple):
    start_step: int


class ToyRun(Run):
    """Answers sums: shown a stored case of the same question the planner copies its answer, else it guesses."""

    config_class = ToyConfig
    COMPONENTS = ("act", "commit", "checkpoint")
    COUNTERS = ("retained", "duplicates", "memory_tokens")

    def _fingerprint(self) -> str:
        return hashlib.sha256("\n".join(QUESTIONS).encode()).hexdigest()

    def _stream_length(self) -> int:
        return len(QUESTIONS)

    def _reset(self) -> None:
        self.rewards: list[float] = []

    def _resumed(self, ckpt: Path, state: dict[str, Any]) -> None:
        self.rewards = [json.loads(line)["reward"] for line in self.run_dir.steps.read_text().splitlines()]

    def _recent(self) -> deque[float]:
        return deque(self.rewards[-self.config.window:], maxlen=self.config.window)

    def _next_unit(self) -> Unit:
        return Unit(self.step)

    def _act(self, bank: CaseBank, unit: Unit) -> dict[str, Any]:
        with timed(self.ms_totals, "act"):
            question = QUESTIONS[int(self.order[unit.start_step])]
            state_D = self._encode([question])[0]
            cands = bank.candidates(state_D, self.config.candidates)
            sel = self.policy.select(state_D, cands, self.config.k, rng=self.policy_rng) if len(cands) else None
            answer = self.planner(question, bank.get(list(sel.ids)) if sel is not None else [])
            a, b = (int(w) for w in question.split()[2::2])
        return {"question": question, "state_D": state_D, "cands": cands, "sel": sel, "answer": answer,
                "reward": float(answer == str(a + b))}

    def _commit(self, bank: CaseBank, acted: dict[str, Any]) -> None:
        from memento.learn.policy import Observation

        with timed(self.ms_totals, "commit"):
            bank.add([Case(state=acted["question"], action=acted["answer"], reward=acted["reward"])],
                     acted["state_D"][None])
            if acted["sel"] is not None:
                self.policy.observe([Observation(state_D=acted["state_D"], candidates=acted["cands"],
                                                 selection=acted["sel"], reward=acted["reward"], step=self.step,
                                                 policy_version=self.policy.version)])
            row = {"step": self.step, "chosen": [] if acted["sel"] is None else list(acted["sel"].ids),
                   "answer": acted["answer"], "reward": acted["reward"]}
            self.handles[self.run_dir.steps].write(json.dumps(row) + "\n")
            self.rewards.append(acted["reward"])
            self.recent.append(acted["reward"])
            self.step += 1

    def _summary(self, bank: CaseBank, wall_s: float, resumed_from: int | None, has_model: bool) -> dict[str, Any]:
        return {**self._common_summary(bank, wall_s, resumed_from, has_model), "steps": len(self.rewards),
                "success_rate": sum(self.rewards) / max(1, len(self.rewards)), "ms_per_step": self._ms_per_step(1)}


# ---------------------------------------------------------------- the tests


def planner(question: str, cases: list[Case]) -> str:
    return next((c.action for c in cases if c.state == question), str(len(question) % 5))


class Crash(RuntimeError):
    pass


def crashing(after: int) -> Any:
    calls = [0]

    def plan(question: str, cases: list[Case]) -> str:
        calls[0] += 1
        if calls[0] > after:
            raise Crash("scripted crash")
        return planner(question, cases)
    return plan


def _run(out: Path, plan: Any = planner, resume: bool = False) -> dict[str, Any]:
    soft_q = dataclasses.replace(loop_policy("soft_q"), warmup=2)
    config = ToyConfig(k=2, candidates=4, policy=soft_q, checkpoint_every=5, seed=3, tensorboard=False)
    return ToyRun(config, make_policy=make_policy, encoder=HashingEncoder(32), planner=plan, out_dir=out,
                  resume=resume).run()


def _state(out: Path) -> tuple[str, list[tuple[str, str, float]], dict[str, torch.Tensor]]:
    with CaseBank.open(out / RunDir.BANK) as bank:
        cases = [(c.state, c.action, c.reward) for c in bank.iter_cases()]
    tensors = {f"{p.relative_to(out).as_posix()}:{name}": t
               for p in sorted((out / "checkpoint").rglob("*.safetensors")) for name, t in load_file(p).items()}
    return (out / RunDir.STEPS).read_text(), cases, tensors


def test_a_toy_run_gets_checkpoints_resume_and_a_summary(tmp_path: Path) -> None:
    summary = _run(tmp_path / "ref")
    assert summary["steps"] == 14 and summary["resumed_from"] is None and 0 < summary["bank_size_end"] <= 14
    assert summary["updates"] > 0 and 0.0 < summary["success_rate"] <= 1.0
    assert json.loads((tmp_path / "ref" / RunDir.SUMMARY).read_text())["steps"] == 14
    assert json.loads((tmp_path / "ref" / RunDir.CONFIG).read_text())["steps"] == 14
    state = json.loads((tmp_path / "ref" / "checkpoint" / RunDir.STATE).read_text())
    assert state["step"] == 14 and state["n_tasks"] == len(QUESTIONS)

    with pytest.raises(Crash):
        _run(tmp_path / "run", crashing(after=7))
    assert json.loads((tmp_path / "run" / "checkpoint" / RunDir.STATE).read_text())["step"] == 5
    resumed = _run(tmp_path / "run", resume=True)
    assert resumed["resumed_from"] == 5 and resumed["steps"] == 14
    steps_a, bank_a, tensors_a = _state(tmp_path / "ref")
    steps_b, bank_b, tensors_b = _state(tmp_path / "run")
    assert steps_a == steps_b and bank_a == bank_b and tensors_a.keys() == tensors_b.keys() and tensors_a
    for name, tensor in tensors_a.items():
        assert torch.equal(tensor, tensors_b[name]), name
