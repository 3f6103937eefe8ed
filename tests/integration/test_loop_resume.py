"""A real crash: SIGKILL an online run after its second checkpoint, resume it, and compare with a clean run.

The runs are subprocesses of the driver in ``tests/loop_env.py`` (the SYNTHETIC text environment, a
hashing encoder, the format-copying ``CallablePlanner``, exact-match judging) with the soft-Q policy,
dropout on (so the learner's generator state matters), TensorBoard on and a checkpoint every 20 steps.
The killed run's planner sleeps 30 ms a call so the kill lands between the second checkpoint and the
end. The resumed run must end exactly where the uninterrupted run ends: the same bank (ids, rewards,
actions, order), the same per-step rewards and chosen cases in steps.jsonl, the same Q-network weights.
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
CONFIG = {"steps": 100, "checkpoint_every": 20, "seed": 7, "tensorboard": True,
          "policy": {"kind": "soft_q", "warmup": 8, "qnet": {"hidden": 128, "embed_dim": 64, "dropout": 0.1}}}


def _driver(out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "tests.loop_env", str(out), json.dumps(CONFIG), *extra]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _checkpoint_step(out: Path) -> int:
    try:
        return int(json.loads((out / "checkpoint" / "state.json").read_text())["step"])
    except (OSError, ValueError, KeyError):
        return -1


def _final_state(out: Path) -> dict:
    records = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    with CaseBank.open(out / "bank") as bank:
        cases = [(c.id, c.reward, c.action, c.state) for c in bank.iter_cases()]
    tensors = load_file(str(out / "selector" / "learner.safetensors"))
    return {"rewards": [r["reward"] for r in records], "chosen": [r["chosen_ids"] for r in records],
            "steps": [r["step"] for r in records], "bank": cases, "tensors": tensors}


@pytest.mark.probe
def test_sigkill_then_resume_equals_an_uninterrupted_run(tmp_path):
    env = _env()
    ref_out, run_out = tmp_path / "ref", tmp_path / "run"
    reference = subprocess.Popen(_driver(ref_out), cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    victim = subprocess.Popen(_driver(run_out, "--delay", "0.03"), cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    try:
        while _checkpoint_step(run_out) < 40:
            if victim.poll() is not None:
                pytest.fail(f"the run ended before its second checkpoint: {victim.stderr.read().decode()[-2000:]}")
            if time.monotonic() > deadline:
                pytest.fail("no second checkpoint within 120 s")
            time.sleep(0.01)
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=30)
    finally:
        if victim.poll() is None:
            victim.kill()
    assert victim.returncode == -signal.SIGKILL
    record(__name__, "kills")
    killed_at = _checkpoint_step(run_out)
    assert 40 <= killed_at < 100 and not (run_out / "summary.json").exists(), "the kill came too late"
    lines_at_kill = len((run_out / "steps.jsonl").read_text().splitlines())

    resumed = subprocess.run(_driver(run_out, "--resume"), cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    _, ref_err = reference.communicate(timeout=300)
    assert reference.returncode == 0, ref_err.decode()[-3000:]

    summary = json.loads((run_out / "summary.json").read_text())
    assert summary["resumed_from"] == killed_at and summary["steps"] == summary["llm_calls"] == 100
    assert lines_at_kill >= killed_at  # the log had run past the checkpoint and was rolled back
    a, b = _final_state(ref_out), _final_state(run_out)
    assert b["steps"] == list(range(100))
    assert a["rewards"] == b["rewards"]
    assert a["chosen"] == b["chosen"]
    assert a["bank"] == b["bank"]
    assert set(a["tensors"]) == set(b["tensors"])
    for name, tensor in a["tensors"].items():
        assert torch.equal(tensor, b["tensors"][name]), name
    ref_summary = json.loads((ref_out / "summary.json").read_text())
    for key in ("success_rate", "cumulative_reward", "bank_size_start", "bank_size_end", "retained", "updates"):
        assert summary[key] == ref_summary[key], key
    assert not (run_out / "checkpoint.tmp").exists() and not (run_out / "checkpoint.old").exists()
    assert len(list((run_out / "tb").glob("events.out.tfevents.*"))) >= 2  # one file per process
