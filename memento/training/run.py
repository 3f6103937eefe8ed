"""One offline training run: a :class:`~memento.training.config.TrainConfig` in, a run directory out.

Run directory (``out_dir``)::

    config.json      the TrainConfig (memento.training.config.load_train_config reads it back)
    data.json        what the data held: rows, pairs, states, states with mixed labels, per split
    tb/              TensorBoard event files (Lightning's TensorBoardLogger; hparams.yaml beside them)
    checkpoints/     Lightning checkpoints: last.ckpt (for --resume) and best-*.ckpt (lowest val/loss)
    selector/        the best checkpoint as SoftQLearner.save writes it (learner.safetensors,
                     learner.json, config.json): SoftQLearner.load(out_dir / "selector") reads it
    summary.json     the best checkpoint's validation metrics, steps, epochs, device, precision, time

:func:`train_q` runs it: ``lightning.Trainer(**trainer_kwargs(config.trainer.lightning), max_epochs,
max_steps)`` with ``EarlyStopping`` and ``ModelCheckpoint`` on ``val/loss``; then the
best checkpoint is validated once more (its metrics go into ``summary.json``) and written as the
selector directory. ``resume=True`` continues from ``checkpoints/last.ckpt``. Lightning checkpoints
are loaded with ``weights_only=True`` (the module's hyperparameters are plain JSON values).
"""

from __future__ import annotations

import logging
import math
import os
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from memento.errors import CheckpointError, ConfigError
from memento.io import write_json
from memento.training.config import LightningConfig, TrainConfig, save_train_config

__all__ = ["launched_rank_zero", "resolve_precision", "train_q", "trainer_kwargs"]

logger = logging.getLogger(__name__)

CHECKPOINT_DIR = "checkpoints"
LAST_CHECKPOINT = "last.ckpt"


def launched_rank_zero() -> bool:
    """False in the processes a distributed launcher started for ranks other than 0 (Lightning's DDP
    re-runs the command with ``LOCAL_RANK`` set; SLURM and torchrun set ``RANK`` / ``NODE_RANK``)."""
    return all(os.environ.get(name, "0") == "0" for name in ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID"))


def _uses_cuda(accelerator: str) -> bool:
    return accelerator in ("auto", "gpu", "cuda") and torch.cuda.is_available()


def resolve_precision(precision: str, accelerator: str) -> str:
    """``"auto"``: ``"bf16-mixed"`` on a CUDA GPU with bfloat16 support, else ``"32-true"``; others unchanged."""
    if precision != "auto":
        return precision
    return "bf16-mixed" if _uses_cuda(accelerator) and torch.cuda.is_bf16_supported() else "32-true"


def trainer_kwargs(config: LightningConfig) -> dict[str, Any]:
    """The ``lightning.Trainer`` keyword arguments of ``config``: ``accelerator``, ``devices``, ``num_nodes``,
    ``strategy``, ``precision`` (``"auto"`` resolved by :func:`resolve_precision`) and ``log_every_n_steps``."""
    return {"accelerator": config.accelerator, "devices": config.devices, "num_nodes": config.num_nodes,
            "strategy": config.strategy, "precision": resolve_precision(config.precision, config.accelerator),
            "log_every_n_steps": config.log_every_n_steps}


def _floats(metrics: Mapping[str, Any]) -> dict[str, float]:
    out = {}
    for name, value in metrics.items():
        value = float(value.item() if isinstance(value, torch.Tensor) else value)
        if math.isfinite(value):
            out[name] = value
    return out


_IGNORED_WARNINGS = (
    r".*does not have many workers.*", r".*Checkpoint directory .* exists and is not empty.*",
    r".*module\(s\) in eval mode.*",  # the target network, on purpose
    r".*overridden `transfer_batch_to_device`.*",  # ours moves ReplayBatch / RankingBatch
    r".*LeafSpec.*",  # Lightning's own use of a deprecated torch API
    r".*smaller than the logging interval.*",  # short epochs (per process under DDP)
    # DDP: train/loss per epoch is each process's mean (no collective per step), and the final
    # validate() may repeat a few held-out rows to give every process the same count
    r".*recommended to use `self.log\('train/loss'.*sync_dist=True.*",
    r".*Using `DistributedSampler` with the dataloaders. During `trainer.validate\(\)`.*",
)
"""Lightning warnings :func:`train_q` silences: expected in these runs, not a sign of trouble."""


def _data_module(config: TrainConfig, out: Path, encoder: Any, data: Any) -> tuple[Any, dict[str, Any]]:
    """The fitted-for ``QDataModule`` and its statistics (written to ``out/data.json`` by rank zero)."""
    from memento.training.data import QDataModule

    dm = QDataModule(config.data, batch_size=config.learner.batch_size, encoder=encoder, data=data,
                     seed=config.learner.seed, gamma=config.learner.gamma, features=config.qnet.features)
    dm.prepare_data()
    dm.setup("fit")
    stats = dm.stats()
    if launched_rank_zero():
        write_json(out / "data.json", stats)
    if stats["dim"] != config.qnet.dim:
        raise ConfigError(f"TrainConfig.qnet.dim={config.qnet.dim}: the data's vectors have dim={stats['dim']}")
    return dm, stats


def _trainer(config: TrainConfig, out: Path, lightning: dict[str, Any], train_rows: int,
             callbacks: list[Any] | None) -> tuple[Any, Any, list[Any]]:
    """The ``lightning.Trainer`` (``lightning``: :func:`trainer_kwargs`), its best-checkpoint callback and every
    callback (early stopping included)."""
    import lightning as L
    from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
    from lightning.pytorch.loggers import TensorBoardLogger

    tc = config.trainer
    checkpoint = ModelCheckpoint(dirpath=out / CHECKPOINT_DIR, filename="best-{epoch:03d}-{step}", monitor="val/loss",
                                 mode="min", save_top_k=tc.save_top_k, save_last=True, auto_insert_metric_name=False)
    all_callbacks: list[Any] = [checkpoint, *(callbacks or [])]
    if tc.patience > 0:
        all_callbacks.append(EarlyStopping(monitor="val/loss", mode="min", patience=tc.patience,
                                           min_delta=tc.min_delta))
    steps_per_epoch = max(1, -(-train_rows // config.learner.batch_size))
    trainer = L.Trainer(
        **{**lightning, "log_every_n_steps": min(lightning["log_every_n_steps"], steps_per_epoch)},
        max_epochs=tc.max_epochs, max_steps=tc.max_steps, callbacks=all_callbacks,
        logger=TensorBoardLogger(save_dir=str(out), name="tb", version="", default_hp_metric=False),
        default_root_dir=str(out), enable_progress_bar=tc.progress_bar, enable_model_summary=False,
        num_sanity_val_steps=0)
    return trainer, checkpoint, all_callbacks


def train_q(config: TrainConfig, out_dir: str | Path, *, encoder: Any = None, data: Any = None,
            resume: bool = False, callbacks: list[Any] | None = None) -> dict[str, Any]:
    """Train a Q-network offline as ``config`` says; returns the summary (also ``out_dir/summary.json``).

    ``encoder``: the text encoder (default: ``config.data.encoder`` is loaded); ``data``: a ready
    :class:`~memento.training.data.TrainingData` (skips the files); ``resume``: continue from
    ``out_dir/checkpoints/last.ckpt``; ``callbacks``: extra Lightning callbacks.
    """
    from lightning.pytorch.callbacks import EarlyStopping

    from memento.training.q_module import QModule

    out = Path(out_dir)
    last = out / CHECKPOINT_DIR / LAST_CHECKPOINT
    if resume and not last.is_file():
        raise CheckpointError(f"{last}: no Lightning checkpoint to resume from")
    out.mkdir(parents=True, exist_ok=True)
    if launched_rank_zero():
        save_train_config(config, out / "config.json")

    dm, stats = _data_module(config, out, encoder, data)
    module = QModule.from_config(config)
    lightning = trainer_kwargs(config.trainer.lightning)
    precision = lightning["precision"]
    trainer, checkpoint, all_callbacks = _trainer(config, out, lightning, len(dm.train_rows), callbacks)
    started = time.perf_counter()
    with warnings.catch_warnings():
        for message in _IGNORED_WARNINGS:
            warnings.filterwarnings("ignore", message=message)
        trainer.fit(module, datamodule=dm, ckpt_path=str(last) if resume else None, weights_only=True)
        fit_s = time.perf_counter() - started
        best = checkpoint.best_model_path or str(last)
        if trainer.global_step == 0:
            raise ConfigError("training made no optimiser step (max_steps/max_epochs already reached on resume?)")
        results = trainer.validate(module, datamodule=dm, ckpt_path=best, weights_only=True, verbose=False)
    best_metrics = _floats(results[0] if results else {})
    selector = None
    if trainer.is_global_zero:
        best_state = torch.load(best, map_location="cpu", weights_only=True)
        module.load_state_dict(best_state["state_dict"])
        learner = module.to_learner()
        learner.updates = int(best_state.get("global_step", trainer.global_step))
        selector = learner.save(out / "selector")
    summary = {
        "best_checkpoint": str(Path(best).relative_to(out)) if Path(best).is_relative_to(out) else best,
        "best_val_loss": best_metrics.get("val/loss"), "metrics": best_metrics,
        "epochs": int(trainer.current_epoch), "global_step": int(trainer.global_step),
        "stopped_early": bool(any(isinstance(c, EarlyStopping) and c.stopped_epoch > 0 for c in all_callbacks)),
        "precision": precision, "accelerator": type(trainer.accelerator).__name__,
        "device": str(module.device), "devices": trainer.num_devices, "num_nodes": trainer.num_nodes,
        "fit_s": fit_s, "resumed": resume, "data": stats,
        "selector": None if selector is None else "selector", "tensorboard": "tb",
    }
    if trainer.is_global_zero:
        write_json(out / "summary.json", summary)
    logger.info("trained %d steps (%d epochs) in %.1f s; best val/loss %s", summary["global_step"],
                summary["epochs"], fit_s, summary["best_val_loss"])
    return summary
