"""``memento train`` on CUDA: the same code with accelerator auto picks the GPU and bf16-mixed. Skipped without CUDA."""

from __future__ import annotations

import json

import pytest
import torch

from memento.learn.learner import SoftQLearner
from memento.training.run import resolve_precision, train_q
from tests.unit.test_training_data import synthetic_data
from tests.unit.test_training_module import _config

pytestmark = pytest.mark.gpu


def test_precision_auto_is_bf16_on_a_gpu():
    if torch.cuda.is_bf16_supported():
        assert resolve_precision("auto", "auto") == "bf16-mixed"
    assert resolve_precision("auto", "cpu") == "32-true"


def test_fit_on_cuda_in_bf16(tmp_path):
    data = synthetic_data(rows=2000)
    summary = train_q(_config(data, max_epochs=3, accelerator="auto", precision="auto"), tmp_path, data=data)
    assert summary["accelerator"] == "CUDAAccelerator" and summary["precision"] == "bf16-mixed"
    assert summary["device"].startswith("cuda") and summary["global_step"] > 0
    assert 0.0 <= summary["metrics"]["val/auc"] <= 1.0
    learner = SoftQLearner.load(tmp_path / "selector", device="cpu")  # the selector is saved in float32 on the CPU
    assert all(p.dtype == torch.float32 for p in learner.qnet.parameters())
    assert json.loads((tmp_path / "config.json").read_text())["trainer"]["lightning"]["precision"] == "auto"


def test_cuda_resume_continues(tmp_path):
    data = synthetic_data(rows=400)
    train_q(_config(data, max_epochs=1, accelerator="gpu", devices=1), tmp_path, data=data)
    summary = train_q(_config(data, max_epochs=2, accelerator="gpu", devices=1), tmp_path, data=data, resume=True)
    assert summary["epochs"] == 2 and summary["resumed"]
