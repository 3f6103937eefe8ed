"""The run skeleton (memento.runs.base.Run): a toy run kind that writes only its act and commit hooks gets the seeds,
the run directory, checkpoints, resume (an interrupted and resumed run equals an uninterrupted one) and a summary."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from memento.bank import CaseBank
from memento.learn.policy import Observation
from memento.policies import loop_policy, make_policy
from memento.runs.base import Run, RunConfig, RunSpec, Step, timed
from memento.runs.rundir import RunDir
from memento.types import Case
from tests.loop_env import HashingEncoder

QUESTIONS = [f"what is {a} plus {b}" for a in range(3) for b in range(3)]


# ---------------------------------------------------------------- the toy run kind (its whole definition)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ToyConfig(RunConfig):
    steps: int = 14


class ToyRun(Run):
    """Answers sums: shown a stored case of the same question the planner copies its answer, else it guesses."""

    SPEC = RunSpec(name="toy", config=ToyConfig, length="steps", components=("act", "commit"))

    def _stream(self) -> tuple[int, str]:
        return len(QUESTIONS), hashlib.sha256("\n".join(QUESTIONS).encode()).hexdigest()

    def _act(self, bank: CaseBank, unit: Step) -> tuple[Case, Any, Observation | None]:
        with timed(self.ms_totals, "act"):
            question = QUESTIONS[int(self.order[unit.start_step])]
            state_D = self._encode([question])[0]
            cands = bank.candidates(state_D, self.config.candidates)
            sel = self.policy.select(state_D, cands, self.config.k, rng=self.policy_rng) if len(cands) else None
            answer = self.planner(question, bank.get(list(sel.ids)) if sel is not None else [])
            a, b = (int(w) for w in question.split()[2::2])
        case = Case(state=question, action=answer, reward=float(answer == str(a + b)))
        return case, state_D, None if sel is None else Observation(
            state_D=state_D, candidates=cands, selection=sel, reward=case.reward, step=unit.start_step,
            policy_version=self.policy.version)

    def _commit(self, bank: CaseBank, acted: tuple[Case, Any, Observation | None]) -> None:
        case, state_D, seen = acted
        with timed(self.ms_totals, "commit"):
            bank.add([case], state_D[None])
            if seen is not None:
                self.policy.observe([seen])
            row = {"step": self.step, "chosen": [] if seen is None else list(seen.selection.ids),
                   "answer": case.action, "reward": case.reward}
            self.handles[self.run_dir.steps].write(json.dumps(row) + "\n")
            self.step += 1

    def _summary(self, bank: CaseBank) -> dict[str, Any]:
        rewards = [json.loads(line)["reward"] for line in self.run_dir.steps.read_text().splitlines()]
        return {"steps": len(rewards), "success_rate": sum(rewards) / len(rewards), "ms_per_step": self._ms_per_step(1)}


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
