"""``memento train`` end to end with the real all-MiniLM-L6-v2 encoder (shared with the other tests).

- the Memento reference samples: the mixed-label warning with its count, held-out AUC, the run files;
- a Case JSONL bank plus a rewards file, then --resume for more epochs;
- the acceptance test: a transition log of the random policy on the synthetic text environment
  (tests/loop_env.py), `memento train --from-log` on it, and the trained Q-network's greedy policy
  against similarity retrieval on tasks the log never saw.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from memento.bank import CaseBank
from memento.cli.entry import main
from memento.learn.learner import SoftQLearner
from memento.policies import (
    RandomConfig,
    SimilarityConfig,
    SimilarityPolicy,
    SoftQConfig,
    SoftQPolicy,
    bank_rewards,
    make_policy,
)
from memento.runs.qa import LoopConfig, run_online
from memento.selector.export import load_selector
from tests.loop_env import ExactJudge, make_env

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "memento"

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _shared_encoder(encoder, monkeypatch) -> Iterator[None]:
    """`memento train` uses the session's encoder instead of loading its own (same model, same cache)."""
    monkeypatch.setattr("memento.training.cli.load_encoder", lambda config: encoder)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _event_files(run: Path) -> list[Path]:
    return list((run / "tb").glob("events.out.tfevents.*"))


def test_memento_samples(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--from-memento", str(FIXTURES / "training_data.jsonl"), "--memory",
                 str(FIXTURES / "memory.jsonl"), "--max-epochs", "2", "--out", str(out), "--no-progress"]) == 0
    captured = capsys.readouterr()
    assert "labels: 0 states with mixed labels, 8 all rewarded, 42 all unrewarded" in captured.out
    assert "memento: warning: no state has mixed labels: all 50 states" in captured.err
    assert "held-out AUC 0." in captured.out or "held-out AUC 1." in captured.out
    assert "ranking: no held-out state has mixed labels" in captured.out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["epochs"] == 2 and 0.0 <= summary["metrics"]["val/auc"] <= 1.0
    assert summary["data"]["all"]["mixed"] == 0 and summary["data"]["val"]["states"] == 10
    config = json.loads((out / "config.json").read_text())
    assert config["data"]["source"] == "memento" and config["qnet"]["dim"] == 384
    assert config["trainer"]["max_epochs"] == 2
    assert _event_files(out)
    learner = SoftQLearner.load(out / "selector")
    assert learner.qnet.config.dim == 384 and 0 < learner.updates <= summary["global_step"]


def test_cases_and_rewards_then_resume(tmp_path, capsys):
    env = make_env()
    cases = tmp_path / "cases.jsonl"
    cases.write_text("".join(json.dumps({**c.to_json(), "id": f"seed-{i}"}) + "\n"
                             for i, c in enumerate(env.seed_cases)), encoding="utf-8")
    family_of, bare = env.family_of, {f"seed-{i}": not c.action.startswith("The answer is")
                                      for i, c in enumerate(env.seed_cases)}
    rows = [{"state": task.question, "case_id": f"seed-{i}",
             "reward": float(family_of[case.state] == task.family and bare[f"seed-{i}"])}
            for task in env.tasks for i, case in enumerate(env.seed_cases)]
    rewards = tmp_path / "rewards.jsonl"
    rewards.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    out = tmp_path / "run"
    argv = ["train", "--cases", str(cases), "--rewards", str(rewards), "--out", str(out), "--no-progress",
            "--arch", "mlp_interact", "--hidden", "64", "--batch-size", "64", "--patience", "0"]
    assert main([*argv, "--max-epochs", "2"]) == 0
    first = capsys.readouterr().out
    assert "labels: 24 states with mixed labels" in first and "hit@1" in first
    assert main(["train", "--resume", "--out", str(out), "--max-epochs", "4", "--no-progress"]) == 0
    assert "4 epochs" in capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed"] and summary["epochs"] == 4 and summary["metrics"]["val/hit@4"] >= 0.0
    assert json.loads((out / "config.json").read_text())["trainer"]["max_epochs"] == 4


def _evaluate(policy, tasks, bank, encoder, env) -> list[float]:
    planner, judge = env.planner(), ExactJudge()
    rewards = []
    for task in tasks:
        state = encoder.encode(task.question)
        selection = policy.select(state, bank.candidates(state, 32), 4, rng=np.random.default_rng(0), greedy=True)
        rewards.append(judge(task, planner.plan(task, bank.get(list(selection.ids))).text).reward)
    return rewards


def test_trained_qnet_beats_similarity_on_fresh_tasks(encoder, tmp_path, capsys):
    """Acceptance: log the random policy on 4 tasks per family, train offline, evaluate on the other 2 per family."""
    env = make_env()
    families: dict[str, list] = {}
    for task in env.tasks:
        families.setdefault(task.family, []).append(task)
    seen = [t for tasks in families.values() for t in tasks[:4]]
    fresh = [t for tasks in families.values() for t in tasks[4:]]
    log = tmp_path / "log"
    run_online(LoopConfig(steps=1500, policy=RandomConfig(), seed=0, checkpoint_every=0, tensorboard=False),
               make_policy=make_policy,
               encoder=encoder, planner=env.planner(), judge=ExactJudge(), tasks=seen, seed_cases=env.seed_cases,
               out_dir=log)
    out = tmp_path / "train"
    assert main(["train", "--from-log", str(log), "--out", str(out), "--no-progress", "--arch", "mlp_interact",
                 "--hidden", "128", "--dropout", "0", "--lr", "3e-3", "--batch-size", "64", "--max-epochs", "20",
                 "--patience", "0", "--seed", "0"]) == 0
    printed = capsys.readouterr().out
    assert "data (log): 1500 decisions, 6000 (state, case) pairs, 16 states" in printed

    bank = CaseBank.create(tmp_path / "eval-bank", encoder.dim)  # the seed cases only: no retained answers
    bank.add(env.seed_cases, encoder.encode([c.state for c in env.seed_cases]))
    learner = SoftQLearner.load(out / "selector")
    soft_q = _evaluate(SoftQPolicy(learner.qnet, alpha=0.2), fresh, bank, encoder, env)
    similarity = _evaluate(SimilarityPolicy(SimilarityConfig(positive_only=True), reward_of=bank_rewards(bank)),
                           fresh, bank, encoder, env)
    bank.close()
    trap = [i for i, t in enumerate(fresh) if t.family in env.trap_families]
    assert np.mean(similarity) == 0.5 and not any(similarity[i] for i in trap)  # similarity fails every trap task
    assert all(soft_q[i] == 1.0 for i in trap)  # the trained Q-network finds the bare cases for them
    assert np.mean(soft_q) >= 0.75 > np.mean(similarity)

    # the offline-trained selector is usable downstream: exported over a bank, and as the loop's start
    exported = tmp_path / "exported"
    assert main(["export", str(out), str(exported), "--bank", str(tmp_path / "eval-bank")]) == 0
    with load_selector(exported, encoder=encoder) as selector:
        with CaseBank.open(tmp_path / "eval-bank") as bank:
            for task in fresh:
                state = encoder.encode(task.question)
                expected = SoftQPolicy(learner.qnet, alpha=0.2).select(
                    state, bank.candidates(state, 32), 4, rng=np.random.default_rng(0), greedy=True)
                assert selector.select(state, k=4, mode="greedy").ids == tuple(expected.ids)
    assert main(["export", str(out), str(tmp_path / "no-bank")]) == 2
    assert "pass --bank" in capsys.readouterr().err
    run_online(LoopConfig(steps=1, policy=SoftQConfig(init_qnet=str(out)), checkpoint_every=0, tensorboard=False),
               make_policy=make_policy,
               encoder=encoder, planner=env.planner(), judge=ExactJudge(), tasks=fresh, seed_cases=env.seed_cases,
               out_dir=tmp_path / "warm")  # one step < warm-up: no update, the run's Q-network is the trained one
    trained_state = learner.qnet.state_dict()
    warm_state = SoftQLearner.load(tmp_path / "warm" / "selector").qnet.state_dict()
    assert trained_state.keys() == warm_state.keys()
    assert all(torch.equal(warm_state[k].cpu(), v.cpu()) for k, v in trained_state.items())


def test_ddp_on_two_cpu_processes(tmp_path):
    """`--strategy ddp --devices 2` on the CPU (gloo): Lightning re-runs the command for rank 1, which must not
    refuse the run directory rank 0 has just written, and only rank 0 reports."""
    import os
    import subprocess
    import sys

    out = tmp_path / "run"
    root = Path(__file__).resolve().parents[2]
    command = [sys.executable, "-m", "memento", "train", "--from-memento", str(FIXTURES / "training_data.jsonl"),
               "--memory", str(FIXTURES / "memory.jsonl"), "--out", str(out), "--max-epochs", "2", "--batch-size",
               "64", "--accelerator", "cpu", "--devices", "2", "--strategy", "ddp", "--no-progress"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    result = subprocess.run(command, capture_output=True, text=True, cwd=root, env=env, timeout=600, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("trained ") == 1 and "2 epochs" in result.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["devices"] == 2 and summary["global_step"] == 2 * 3  # 320 rows / 2 processes / 64 per batch
    assert SoftQLearner.load(out / "selector").updates > 0
