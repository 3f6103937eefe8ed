"""A selector and the online loop on ``cuda`` search their bank on the GPU when faiss-gpu is installed
(``make install-gpu``), and choose what the CPU chooses. Skipped where no GPU is present."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import unit_vectors

pytestmark = pytest.mark.gpu


def _needs_faiss_gpu() -> None:
    from memento.bank.index import gpu_available

    if not gpu_available():
        pytest.skip("faiss has no GPU support here (make install-gpu: faiss-gpu in place of faiss-cpu)")


def test_selector_on_cuda_searches_on_the_gpu(tmp_path: Path) -> None:
    from memento.bank import CaseBank
    from memento.selector.export import create_selector
    from memento.selector.runtime import Selector
    from memento.types import Case

    _needs_faiss_gpu()
    rng = np.random.default_rng(0)
    x_ND = unit_vectors(rng, 2000, 32)
    with CaseBank.create(tmp_path / "bank", 32, index="Flat") as bank:
        bank.add([Case(state=f"s{i}", action="a", reward=1.0) for i in range(len(x_ND))], x_ND)
    out = create_selector(tmp_path / "bank", tmp_path / "selector")
    with Selector.load(out, "cuda") as gpu, Selector.load(out, "cpu") as cpu:
        assert gpu.bank._index._index._use_gpu and not cpu.bank._index._index._use_gpu
        for q_D in x_ND[:10]:
            assert gpu.select(q_D, k=4, mode="greedy").ids == cpu.select(q_D, k=4, mode="greedy").ids
        assert gpu.bank._index._index._gpu_index is not None  # the searches ran on the GPU copy


def test_the_loop_on_cuda_searches_on_the_gpu(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from memento.policies import make_policy
    from memento.runs.qa import LoopConfig, OnlineLoop
    from tests.loop_env import ExactJudge, HashingEncoder, make_env

    _needs_faiss_gpu()
    env = make_env()
    loop = OnlineLoop(LoopConfig(steps=6, tensorboard=False), make_policy=make_policy, encoder=HashingEncoder(),
                      planner=env.planner(), judge=ExactJudge(), tasks=env.tasks, seed_cases=env.seed_cases,
                      out_dir=tmp_path / "run", device="cuda")
    with caplog.at_level(logging.INFO, logger="memento.bank.index"):
        summary = loop.run()
    assert summary["steps"] == 6
    assert not [r for r in caplog.records if "stays on the CPU" in r.getMessage()]
