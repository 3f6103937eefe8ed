"""A real crash in a game run: SIGKILL it right after a mid-episode checkpoint, resume, compare with a clean run.

The runs are subprocesses of the driver in ``tests/game_env.py`` (real tiny TextWorld games, the hashing encoder,
the scripted planner sleeping 50 ms a call) with soft-Q at gamma = 0.9 and TensorBoard on. The resumed run
re-creates the game's state by replaying the episode's commands and must end exactly where the uninterrupted
run ends: the same commands, rewards and chosen cases per step, the same bank, the same Q-network weights.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from memento.bank import CaseBank
from tests.fuzzing import record

ROOT = Path(__file__).resolve().parents[2]
CONFIG = {"episodes": 10, "checkpoint_every": 3, "seed": 11, "tensorboard": True, "game": {"max_steps": 5},
          "policy": {"kind": "soft_q", "warmup": 2, "positive_only": True,
                     "learner": {"gamma": 0.9}, "qnet": {"anchor": "cosine", "features": "case"}}}


def _driver(out: Path, games: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "tests.game_env", str(out), str(games), json.dumps(CONFIG), *extra]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _mid_episode_step(out: Path) -> int | None:
    try:
        state = json.loads((out / "checkpoint" / "state.json").read_text())
    except (OSError, ValueError):
        return None
    return int(state["step"]) if state.get("in_progress") else None


def _final(out: Path) -> dict:
    steps = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    with CaseBank.open(out / "bank") as bank:
        cases = [(c.id, c.state, c.action, c.reward) for c in bank.iter_cases()]
    return {"commands": [s["output"] for s in steps], "rewards": [s["reward"] for s in steps],
            "chosen": [s["chosen_ids"] for s in steps], "steps": [s["step"] for s in steps], "bank": cases,
            "tensors": load_file(str(out / "selector" / "learner.safetensors"))}


@pytest.mark.probe
def test_sigkill_mid_episode_then_resume_equals_an_uninterrupted_run(tmp_path: Path, tiny_games) -> None:
    games = tiny_games["train"][0].parent
    env = _env()
    ref_out, run_out = tmp_path / "ref", tmp_path / "run"
    reference = subprocess.Popen(_driver(ref_out, games), cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE)
    victim = subprocess.Popen(_driver(run_out, games, "--delay", "0.05"), cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 180
    try:
        while _mid_episode_step(run_out) is None:
            if victim.poll() is not None:
                pytest.fail(f"the run ended before a mid-episode checkpoint: {victim.stderr.read().decode()[-2000:]}")
            if time.monotonic() > deadline:
                pytest.fail("no mid-episode checkpoint within 180 s")
            time.sleep(0.005)
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=30)
    finally:
        if victim.poll() is None:
            victim.kill()
    assert victim.returncode == -signal.SIGKILL
    record(__name__, "kills")
    killed_at = _mid_episode_step(run_out)
    assert killed_at is not None and not (run_out / "summary.json").exists()

    resumed = subprocess.run(_driver(run_out, games, "--resume"), cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    _, ref_err = reference.communicate(timeout=300)
    assert reference.returncode == 0, ref_err.decode()[-3000:]
    summary = json.loads((run_out / "summary.json").read_text())
    assert summary["resumed_from"] == killed_at and summary["episodes"] == CONFIG["episodes"]
    a, b = _final(ref_out), _final(run_out)
    assert b["steps"] == list(range(len(b["steps"])))
    for key in ("commands", "rewards", "chosen", "bank"):
        assert a[key] == b[key], key
    for name, tensor in a["tensors"].items():
        assert torch.equal(tensor, b["tensors"][name]), name
    assert not (run_out / "checkpoint.tmp").exists() and not (run_out / "checkpoint.old").exists()
    assert len(list((run_out / "tb").glob("events.out.tfevents.*"))) >= 2
