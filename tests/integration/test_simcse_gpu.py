"""SimCSE fine-tuning on a CUDA GPU (bf16-mixed by default there). Skipped where no GPU is present."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from memento.encoders import Encoder
from memento.training.simcse import SimCSEConfig, train_encoder

pytestmark = pytest.mark.gpu

SIMCSE = Path(__file__).resolve().parents[1] / "fixtures" / "simcse"


@pytest.mark.parametrize("mode, data", [("unsup", ("cases.jsonl", "tasks.jsonl")), ("sup", ("pairs.jsonl",))])
def test_simcse_on_cuda_bf16(tmp_path: Path, mode: str, data: tuple[str, ...]) -> None:
    config = SimCSEConfig(mode=mode, data=tuple(str(SIMCSE / d) for d in data), max_length=32, batch_size=16,
                          max_steps=8, epochs=50, lr=2e-4, eval_size=16)
    result = train_encoder(config, tmp_path / mode)
    assert result.device.startswith("cuda") and result.precision == "bf16-mixed"
    assert result.loss_after < result.loss_before
    assert result.reload_max_abs_diff is not None and result.reload_max_abs_diff < 1e-3
    texts = ["What is the capital of Peru?", "Write 347 in words."]
    gpu = Encoder.from_pretrained(result.encoder_dir, device="cuda", use_cache=False).encode(texts)
    cpu = Encoder.from_pretrained(result.encoder_dir, device="cpu", use_cache=False).encode(texts)
    np.testing.assert_allclose(gpu, cpu, atol=1e-4)
    print(f"\n{mode} on {result.device} ({result.precision}): loss {result.loss_before:.4f} -> "
          f"{result.loss_after:.4f}, {result.seconds_per_step * 1000:.1f} ms/step")
