"""Offline training with PyTorch Lightning (see docs/training.md).

Q-network training from logs (``memento train``):

- :mod:`memento.training.config` -- ``TrainConfig`` (data, Q-network, learner, trainer sub-configs), saved as
  ``config.json`` in every run;
- :mod:`memento.training.data` -- readers of transition logs, Memento training pairs and Case JSONL + rewards
  files, encoded once, split by state; ``QDataModule`` serves ``memento.learn.replay.ReplayBatch`` batches;
- :mod:`memento.training.q_module` -- ``QModule``, the ``LightningModule`` around ``memento.learn.learner.soft_q_loss``;
- :mod:`memento.training.metrics` -- AUC, expected calibration error, per-state hit@K;
- :mod:`memento.training.run` -- ``train_q``: one run (Trainer, early stopping, checkpoints, TensorBoard, the
  selector directory); :mod:`memento.training.cli` -- the ``memento train`` command;
- :mod:`memento.training.bench` -- ``memento bench train --lightning``.

Encoder fine-tuning (``memento train-encoder``): :mod:`memento.training.simcse`, :mod:`memento.training.simcse_cli`.

``memento`` never imports this package at module level, and nothing here imports Lightning at package
import: the CLI modules are argparse-only.
"""
