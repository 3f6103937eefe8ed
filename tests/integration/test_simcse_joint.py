"""Joint mode: one Lightning step through memento.learn.learner.soft_q_loss updates the real encoder and the Q head."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import memento.training.joint
from memento.config import QNetConfig
from memento.encoders import Encoder
from memento.learn.learner import SoftQLearner
from memento.learn.qnet import build_qnet
from memento.training.config import LightningConfig
from memento.training.joint import JointConfig, train_joint
from memento.training.simcse import load_pairs

pytestmark = pytest.mark.slow

PAIRS = Path(__file__).resolve().parents[1] / "fixtures" / "simcse" / "pairs.jsonl"


def test_one_step_updates_encoder_and_q_head(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real_loss = memento.training.joint.soft_q_loss

    def spy(qnet, target, batch, config, alpha, **kwargs):
        calls.append((batch.state_BD.requires_grad, tuple(batch.cases_BKD.shape)))
        return real_loss(qnet, target, batch, config, alpha, **kwargs)

    monkeypatch.setattr(memento.training.joint, "soft_q_loss", spy)
    config = JointConfig(data=(str(PAIRS),), max_length=32, batch_size=8, max_steps=1, qnet=QNetConfig(hidden=32),
                         encoder_lr=1e-4, lightning=LightningConfig(accelerator="cpu", devices="1"))
    encoder = Encoder.from_pretrained(max_length=32, device="cpu", use_cache=False)
    before_encoder = {k: v.detach().clone() for k, v in encoder.model.state_dict().items()}
    initial_head = build_qnet(QNetConfig(dim=384, hidden=32, seed=0), generator=torch.Generator().manual_seed(0))

    result = train_joint(config, tmp_path / "joint", encoder=encoder)

    assert result.steps == 1 and calls == [(True, (8, 1, 384))]  # the one loss, on pooled vectors with gradients
    changed = [k for k, v in encoder.model.state_dict().items() if not torch.equal(v, before_encoder[k])]
    assert any("encoder.layer" in k for k in changed), "the transformer did not move"
    learner = SoftQLearner.load(result.selector_dir, device="cpu")
    head_changed = [k for k, v in learner.qnet.state_dict().items() if not torch.equal(v, initial_head.state_dict()[k])]
    assert head_changed, "the Q head did not move"

    # the saved pair works together: vectors from the saved encoder, scored by the saved head
    tuned = Encoder.from_pretrained(result.encoder_dir, device="cpu", use_cache=False)
    pairs = load_pairs([PAIRS])
    state_1D = torch.from_numpy(tuned.encode([pairs.states[0]]))
    cases_1CD = torch.from_numpy(tuned.encode(pairs.cases[:5]))[None]
    learner.qnet.eval()
    with torch.no_grad():
        q_1C = learner.qnet(state_1D, cases_1CD)
    assert q_1C.shape == (1, 5) and np.isfinite(q_1C.numpy()).all()
