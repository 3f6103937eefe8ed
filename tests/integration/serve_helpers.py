"""Shared by the serve and MCP integration tests: a small real exported selector.

A 24-step soft-Q run of the online loop with the real all-MiniLM-L6-v2 encoder on the synthetic text
environment of tests/loop_env.py (a format-copying planner, no LLM), exported with
``memento.export_selector``: a real artifact (real encoder, bank, Q-network, learner and replay state).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from memento.policies import SoftQConfig, make_policy
from memento.runs.qa import LoopConfig, run_online
from memento.selector.export import export_selector
from tests.loop_env import ExactJudge, make_env

QUESTION = "What is the capital of Peru?"


def make_real_artifact(out: Path, encoder: Any, *, steps: int = 24) -> Path:
    """Run the loop for ``steps`` tasks in ``out/run`` and export the selector to ``out/selector``."""
    env = make_env()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run_online(LoopConfig(steps=steps, checkpoint_every=0, tensorboard=False, policy=SoftQConfig(warmup=4)),
                   make_policy=make_policy, encoder=encoder,
                   planner=env.planner(), judge=ExactJudge(), tasks=env.tasks, seed_cases=env.seed_cases,
                   out_dir=out / "run")
    finally:
        torch.set_num_threads(threads)
    return export_selector(out / "run", out / "selector")
