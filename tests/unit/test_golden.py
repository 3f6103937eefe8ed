"""Seeded runs give the same numbers as before the structural step (issue 10).

``tests/golden/golden.json`` was written by ``python -m tests.golden.capture`` at commit 86025c1, before the
learning step, the policy construction and the run directory were given one owner each. Every seeded
online run (soft-Q, soft-Q among rewarded candidates with batches, similarity, random, LinUCB), every
regret run and a served selector's choices and learning must stay exactly as they were: same steps.jsonl
records, same checkpoint tensors, same regret per step, same artifact files.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tests.golden.capture import capture

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "golden.json"


def test_seeded_runs_equal_the_recorded_ones() -> None:
    threads = torch.get_num_threads()
    try:
        now = json.loads(json.dumps(capture(), sort_keys=True))
    finally:
        torch.set_num_threads(threads)
    before = json.loads(GOLDEN.read_text(encoding="utf-8"))
    assert sorted(now) == sorted(before)
    for part in before:
        for name in before[part]:
            if part == "online":
                for key in ("summary", "tensors"):
                    assert now[part][name][key] == before[part][name][key], (part, name, key)
                for i, (a, b) in enumerate(zip(now[part][name]["steps"], before[part][name]["steps"], strict=True)):
                    assert a == b, (name, i)
            else:
                assert now[part][name] == before[part][name], (part, name)
