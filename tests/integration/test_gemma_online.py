"""20 steps of the online loop end to end with the real Gemma 3 270M planner (slow; CI runs it)."""

from __future__ import annotations

import json

import pytest

from memento.cli.entry import main
from memento.envs.tasks import suite_dir

pytestmark = pytest.mark.slow


def test_online_with_real_gemma_twenty_steps(tmp_path, capsys):
    facts = suite_dir("facts")
    out = tmp_path / "run"
    argv = ["online", "--tasks", str(facts / "test.jsonl"), "--cases", str(facts / "cases.jsonl"), "--planner",
            "gemma", "--policy", "soft_q,similarity", "--steps", "20", "--warmup", "4", "--window", "10",
            "--late-steps", "10", "--checkpoint-every", "10", "--out", str(out), "--torch-threads", "1"]
    assert main(argv) == 0, capsys.readouterr().err
    assert "soft_q" in capsys.readouterr().out
    for policy in ("soft_q", "similarity"):
        summary = json.loads((out / policy / "summary.json").read_text())
        assert summary["llm_calls"] == 20 and summary["bank_size_start"] == 156
        assert summary["bank_size_end"] >= summary["bank_size_start"]
        steps = [json.loads(line) for line in (out / policy / "steps.jsonl").read_text().splitlines()]
        assert len(steps) == 20 and all(isinstance(s["output"], str) for s in steps)
        assert summary["ms_per_step"]["plan"] > 0
    # Gemma answers some of these facts: the stream is not all failures
    rewards = [json.loads(line)["reward"] for p in ("soft_q", "similarity")
               for line in (out / p / "steps.jsonl").read_text().splitlines()]
    assert 0 < sum(rewards) < len(rewards)
