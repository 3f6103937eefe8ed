"""``memento bench train --lightning``: the Lightning trainer beside the plain loop, in one run and one table.

:func:`run_train_bench_lightning` runs :func:`memento.bench.train.run_train_bench`'s measurement with a
second trainer: for each Q-network architecture, on the same filled replay buffer, first the plain
loop (``buffer.sample`` + ``SoftQLearner.update``), then a ``lightning.Trainer`` fitting
:class:`~memento.training.q_module.QModule` on batches drawn with ``buffer.sample`` (the same batch size, the
same loss function, optimiser, clipping and target update; ``precision="32-true"``, no logger, no
checkpoints, no progress bar, so what differs is the trainer's own per-step work: hooks, ``self.log``,
the closure). Samples/s count (state, case, reward) pairs, B x K per step, as in the plain rows.

The Lightning row's ``sample p50`` is the time from the end of one training step to the start of the
next (drawing the batch plus Lightning's loop between steps); ``update p50`` is ``training_step``,
backward, clipping, the optimiser step and the target update (``on_train_batch_start`` to
``on_train_batch_end``).
"""

from __future__ import annotations

import dataclasses
import logging
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from memento.bench.common import finish, timestamp, write_results
from memento.bench.train import (
    TrainBenchConfig,
    filled_buffer,
    percentiles_ms,
    resolve_device,
    sync_device,
    time_replay,
    time_training,
    torch_environment,
)
from memento.config import QNetArch

__all__ = ["run_train_bench_lightning", "time_lightning"]

logger = logging.getLogger(__name__)


def time_lightning(arch: QNetArch, buffer: Any, config: TrainBenchConfig, device: Any) -> dict[str, Any]:
    """``lightning.Trainer.fit`` of a :class:`QModule` on ``buffer.sample`` batches: the plain rows' fields."""
    import lightning as L
    import torch

    from memento.config import LearnerConfig, QNetConfig, to_dict
    from memento.training.q_module import QModule

    module = QModule(qnet=to_dict(QNetConfig(arch=arch, dim=config.dim, hidden=config.hidden, seed=config.seed)),
                     learner=to_dict(LearnerConfig(batch_size=config.batch_size, seed=config.seed)))
    generator = torch.Generator(device=device).manual_seed(config.seed)

    class Batches(torch.utils.data.IterableDataset):  # an endless stream of replay samples
        def __iter__(self):  # type: ignore[no-untyped-def]
            while True:
                yield buffer.sample(config.batch_size, generator)

    total = config.warmup_steps + config.steps
    marks: dict[str, list[float]] = {"start": [], "end": []}
    losses: list[float] = []

    class Clock(L.Callback):
        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            sync_device(device)
            marks["start"].append(time.perf_counter())

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            sync_device(device)
            marks["end"].append(time.perf_counter())
            if batch_idx == total - 1:
                losses.append(float(outputs["loss"]))

    trainer = L.Trainer(accelerator=device.type, devices=1, precision="32-true", max_steps=total, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[Clock()], limit_val_batches=0)
    loader = torch.utils.data.DataLoader(Batches(), batch_size=None, collate_fn=_identity)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, train_dataloaders=loader)
    start, end = marks["start"][config.warmup_steps:], marks["end"][config.warmup_steps:]
    seconds = end[-1] - marks["end"][config.warmup_steps - 1] if config.warmup_steps else end[-1] - start[0]
    fetch = [s - e for s, e in zip(start[1:], end[:-1])]
    update, gaps = percentiles_ms([e - s for s, e in zip(start, end)]), percentiles_ms(fetch or [0.0])
    pairs = config.steps * config.batch_size * config.k
    return {"params": sum(p.numel() for p in module.qnet.parameters()), "seconds": seconds, "samples": pairs,
            "samples_per_s": pairs / seconds, "decisions_per_s": config.steps * config.batch_size / seconds,
            "sample_p50_ms": gaps["p50_ms"], "update_p50_ms": update["p50_ms"], "update_p99_ms": update["p99_ms"],
            "final_loss": losses[-1] if losses else None}


def _identity(batch: Any) -> Any:
    return batch


def run_train_bench_lightning(config: TrainBenchConfig, *, out: str | Path | None = None) -> dict[str, Any]:
    """The plain loop and Lightning per architecture on one buffer, then the replay timings (the document of
    :func:`memento.bench.train.run_train_bench`, with ``trainer`` "plain" and "lightning" rows)."""
    import torch

    device = resolve_device(config)
    default_threads = torch.get_num_threads()
    quiet = [logging.getLogger(f"lightning.{part}.utilities.rank_zero") for part in ("pytorch", "fabric")]
    levels = [q.level for q in quiet]
    try:
        for q in quiet:  # Lightning's "GPU available" and tips, once per architecture: noise in a benchmark
            q.setLevel(logging.WARNING)
        if config.torch_threads:
            torch.set_num_threads(config.torch_threads)
        rng = np.random.default_rng(config.seed)
        results: dict[str, Any] = {"benchmark": "train", "trainers": ["plain", "lightning"],
                                   "config": dataclasses.asdict(config), "environment": torch_environment(device),
                                   "started": timestamp(), "results": [], "replay": None}
        import lightning

        results["environment"]["lightning"] = lightning.__version__
        buffer, fill_s = filled_buffer(config, device, rng)
        results["buffer"] = {"decisions": len(buffer), "fill_s": fill_s, "fill_per_s": len(buffer) / fill_s}
        for arch in config.archs:
            logger.info("bench train: plain and lightning %s on %s", arch, device)
            results["results"].append(time_training("plain", arch, buffer, config, device))
            timing = time_lightning(arch, buffer, config, device)
            results["results"].append({"trainer": "lightning", "arch": arch, "device": str(device),
                                       "batch_size": config.batch_size, "k": config.k, "steps": config.steps,
                                       **timing})
            if out is not None:
                write_results(out, results)
        results["replay"] = time_replay(buffer, config, device, rng)
    finally:
        torch.set_num_threads(default_threads)
        for q, level in zip(quiet, levels):
            q.setLevel(level)
    return finish(results, out)
