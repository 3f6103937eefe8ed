"""memento.training.q_module and memento.training.run: Lightning fits on the CPU with synthetic encoded data.

The module must compute what SoftQLearner.update computes (same loss function, optimiser, clipping,
Polyak target, temperature), resume bit for bit from a Lightning checkpoint, and leave a selector
directory that SoftQLearner.load reads.
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch

from memento.config import LearnerConfig, QNetConfig, to_dict
from memento.errors import CheckpointError
from memento.learn.learner import SoftQLearner
from memento.learn.qnet import build_qnet
from memento.learn.replay import ReplayBatch
from memento.training.config import DataConfig, LightningConfig, TrainConfig, TrainerConfig
from memento.training.data import TrainingData
from memento.training.q_module import QModule
from memento.training.run import resolve_precision, train_q, trainer_kwargs
from tests.unit.test_training_data import synthetic_data

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _config(data: TrainingData, **trainer) -> TrainConfig:
    """A small run; ``trainer`` holds TrainerConfig fields and LightningConfig ones (those go to its ``lightning``)."""
    fields = {"max_epochs": 3, "progress_bar": False, "patience": 0, **trainer}
    names = {f.name for f in dataclasses.fields(LightningConfig)}
    lightning = LightningConfig(**{k: v for k, v in fields.items() if k in names})
    trainer = TrainerConfig(lightning=lightning, **{k: v for k, v in fields.items() if k not in names})
    return TrainConfig(data=DataConfig(source="cases", cases="unused", rewards="unused"),
                       qnet=QNetConfig(dim=data.dim, hidden=32, dropout=0.1),
                       learner=LearnerConfig(batch_size=16, lr=3e-3), trainer=trainer)


class LossRecorder(L.Callback):
    """The training loss of every optimiser step, as floats."""

    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        self.losses.append(float(outputs["loss"]))


def test_twenty_step_fit_on_cpu(tmp_path):
    data = synthetic_data()
    recorder = LossRecorder()
    summary = train_q(_config(data, max_epochs=100, max_steps=20), tmp_path, data=data, callbacks=[recorder])
    assert summary["global_step"] == 20 and len(recorder.losses) == 20
    assert summary["precision"] == "32-true" and summary["device"] == "cpu"
    metrics = summary["metrics"]
    assert {"val/loss", "val/auc", "val/ece", "val/hit@1", "val/hit@1_random", "val/hit@4"} <= set(metrics)
    assert 0.0 <= metrics["val/auc"] <= 1.0 and metrics["val/ranking_states"] > 0
    assert json.loads((tmp_path / "summary.json").read_text())["global_step"] == 20
    assert json.loads((tmp_path / "config.json").read_text())["qnet"]["dim"] == 8
    events = list((tmp_path / "tb").glob("events.out.tfevents.*"))
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags: set[str] = set()
    for path in events:
        accumulator = EventAccumulator(str(path))
        accumulator.Reload()
        tags |= set(accumulator.Tags()["scalars"])
    assert {"train/loss_step", "train/loss_epoch", "train/auc", "train/ece", "val/loss", "val/auc", "val/ece",
            "val/hit@1", "val/hit@4_random", "val/ranking_states"} <= tags
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file() and (tmp_path / summary["best_checkpoint"]).is_file()
    # the selector directory is SoftQLearner.save output holding the best checkpoint's networks
    learner = SoftQLearner.load(tmp_path / "selector")
    best = torch.load(tmp_path / summary["best_checkpoint"], map_location="cpu", weights_only=True)
    for name, value in learner.qnet.state_dict().items():
        assert torch.equal(value, best["state_dict"][f"qnet.{name}"])
    for name, value in learner.target.state_dict().items():
        assert torch.equal(value, best["state_dict"][f"target.{name}"])
    assert learner.updates == best["global_step"] and learner.qnet.config.hidden == 32
    assert sorted(p.name for p in (tmp_path / "selector").iterdir()) == ["config.json", "learner.json",
                                                                         "learner.safetensors"]
    # hyperparameters are plain JSON: the checkpoint loads with weights_only=True (done above) and round-trips
    assert json.loads(json.dumps(best["hyper_parameters"])) == best["hyper_parameters"]


def _batches(data: TrainingData, n: int, batch_size: int, seed: int) -> list[ReplayBatch]:
    from memento.training.data import _Tensors

    tensors = _Tensors(data)
    generator = torch.Generator().manual_seed(seed)
    return [tensors.batch(torch.randint(0, data.n_rows, (batch_size,), generator=generator)) for _ in range(n)]


@pytest.mark.parametrize("learner", [
    LearnerConfig(batch_size=16, lr=3e-3),
    LearnerConfig(batch_size=16, lr=3e-3, target_every=2, target_beta=0.5, importance_weights="inverse_propensity",
                  max_grad_norm=0.05),
    LearnerConfig(batch_size=16, lr=3e-3, alpha_schedule="target_entropy", alpha=0.5, alpha_lr=0.05),
], ids=["bce", "ips-polyak-clip", "target-entropy"])
def test_module_steps_equal_softq_learner_updates(learner):
    """The same batches through QModule under a Trainer and through SoftQLearner.update: same networks after."""
    data = synthetic_data(k=3)
    qnet_config = QNetConfig(dim=data.dim, hidden=16, dropout=0.2, seed=1)
    batches = _batches(data, 6, 16, seed=0)
    reference = SoftQLearner(build_qnet(qnet_config), learner, device="cpu")
    for batch in batches:
        reference.update(batch)
    module = QModule(qnet=to_dict(qnet_config), learner=to_dict(learner))
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=len(batches), logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, train_dataloaders=torch.utils.data.DataLoader(batches, batch_size=None,
                                                                          collate_fn=lambda batch: batch))
    assert trainer.global_step == len(batches)
    for name, value in reference.qnet.state_dict().items():
        torch.testing.assert_close(module.qnet.state_dict()[name], value, rtol=1e-5, atol=1e-6)
    for name, value in reference.target.state_dict().items():
        torch.testing.assert_close(module.target.state_dict()[name], value, rtol=1e-5, atol=1e-6)
    assert module.alpha == pytest.approx(reference.alpha, rel=1e-5)
    assert torch.equal(module._generator.get_state(), reference.generator.get_state())  # same dropout draws
    exported = module.to_learner()
    assert exported.updates == len(batches) and exported.alpha == pytest.approx(reference.alpha, rel=1e-5)


def _with_next_states(data: TrainingData) -> TrainingData:
    rng = np.random.default_rng(1)
    n, m = data.n_rows, data.cases_MD.shape[0]
    next_state = rng.integers(0, data.states_SD.shape[0], n)
    next_state[::4] = -1  # every fourth decision ends the episode
    done = next_state < 0
    mask = np.ones((n, 5), dtype=bool)
    mask[done] = False
    return dataclasses.replace(data, done_N=done, next_state_N=next_state, next_cands_NC=rng.integers(0, m, (n, 5)),
                               next_mask_NC=mask)


def test_soft_td_with_next_states(tmp_path):
    data = _with_next_states(synthetic_data())
    config = _config(data, max_epochs=2)
    config = dataclasses.replace(config, data=DataConfig(source="log", log="unused"),
                                 learner=LearnerConfig(batch_size=32, gamma=0.9, alpha=0.5, target_every=2))
    summary = train_q(config, tmp_path, data=data)
    assert summary["global_step"] > 0 and "val/ece" not in summary["metrics"]  # Q is not a probability here
    assert SoftQLearner.load(tmp_path / "selector").config.gamma == 0.9


def test_resume_continues_with_identical_losses(tmp_path):
    """4 epochs in one go == 2 epochs, then --resume to 4 (seeded; dropout on; CPU)."""
    data = synthetic_data(rows=160)
    whole, first, second = LossRecorder(), LossRecorder(), LossRecorder()
    train_q(_config(data, max_epochs=4), tmp_path / "whole", data=data, callbacks=[whole])
    train_q(_config(data, max_epochs=2), tmp_path / "split", data=data, callbacks=[first])
    summary = train_q(_config(data, max_epochs=4), tmp_path / "split", data=data, resume=True, callbacks=[second])
    assert len(first.losses) == len(second.losses) == len(whole.losses) // 2 > 0
    assert first.losses + second.losses == whole.losses  # exactly, not approximately
    assert summary["resumed"] and summary["epochs"] == 4
    a = torch.load(tmp_path / "whole" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    b = torch.load(tmp_path / "split" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    for name, value in a["state_dict"].items():
        assert torch.equal(value, b["state_dict"][name]), name


def test_resume_needs_a_checkpoint(tmp_path):
    data = synthetic_data()
    with pytest.raises(CheckpointError, match="last.ckpt: no Lightning checkpoint to resume from"):
        train_q(_config(data), tmp_path, data=data, resume=True)


def test_precision_auto_is_32_on_the_cpu():
    assert resolve_precision("auto", "cpu") == "32-true"
    assert resolve_precision("16-mixed", "cpu") == "16-mixed"
    if not torch.cuda.is_available():
        assert resolve_precision("auto", "auto") == "32-true"


def test_trainer_kwargs_are_the_lightning_config_with_precision_resolved():
    kwargs = trainer_kwargs(LightningConfig(accelerator="cpu", devices="2", strategy="ddp", log_every_n_steps=3))
    assert kwargs == {"accelerator": "cpu", "devices": 2, "num_nodes": 1, "strategy": "ddp", "precision": "32-true",
                      "log_every_n_steps": 3}
    assert trainer_kwargs(LightningConfig(precision="bf16-mixed"))["precision"] == "bf16-mixed"


def test_hyperparameters_are_saved_as_plain_json():
    module = QModule(qnet=to_dict(QNetConfig(dim=4)), learner=to_dict(LearnerConfig()), hit_k=[1, 2])
    assert dict(module.hparams) == json.loads(json.dumps(dict(module.hparams)))
    assert module.hparams["hit_k"] == [1, 2] and module.target.training is False
    module.train()
    assert module.qnet.training and not module.target.training  # the target never drops out


def test_dim_mismatch_is_refused(tmp_path):
    data = synthetic_data()
    config = dataclasses.replace(_config(data), qnet=QNetConfig(dim=16))
    from memento.errors import ConfigError

    with pytest.raises(ConfigError, match="qnet.dim=16: the data's vectors have dim=8"):
        train_q(config, tmp_path, data=data)
    assert not (tmp_path / "checkpoints").exists()
    assert Path(tmp_path / "config.json").exists()
