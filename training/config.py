"""The typed run configuration of ``memento train`` (offline Q-network training with Lightning).

One frozen :class:`TrainConfig` per run, composed of sub-configs:

- ``data``: :class:`DataConfig` -- where the (state, case, reward) data comes from, how texts are
  encoded (:class:`~memento.config.EncoderConfig`) and how train/validation is split;
- ``qnet``: :class:`~memento.config.QNetConfig` -- the Q-network (its ``dim`` is the encoder's);
- ``learner``: :class:`~memento.config.LearnerConfig` -- the loss and the optimiser (the same
  settings the online learner takes; ``batch_size`` is the training mini-batch);
- ``trainer``: :class:`TrainerConfig` -- the Lightning ``Trainer``: devices, precision, epochs,
  early stopping, checkpointing, metrics.

It is saved as ``config.json`` in the run directory (:func:`save_train_config`) and read back with
:func:`load_train_config`; a config file may leave out ``qnet.dim``, which then comes from the encoder.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any, Literal

from memento.config import (
    EncoderConfig,
    LearnerConfig,
    QNetConfig,
    check,
    check_choice,
    check_float,
    check_int,
    from_dict,
    read_config_json,
    save_json,
)
from memento.errors import ConfigError

__all__ = ["Accelerator", "DataConfig", "DataSource", "MementoLabel", "Precision", "TrainConfig", "TrainerConfig",
           "load_train_config", "save_train_config", "train_config_from_dict"]

DataSource = Literal["log", "memento", "cases"]
MementoLabel = Literal["truth_label"]
Precision = Literal["auto", "32-true", "bf16-mixed", "16-mixed", "bf16-true", "64-true"]
Accelerator = Literal["auto", "cpu", "gpu", "cuda", "mps"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataConfig:
    """What the Q-network learns from (see :mod:`training.data` for the formats).

    - ``source``: ``"log"`` -- an online-loop transition log (``log`` is a run directory or its
      ``steps.jsonl``; case texts come from ``bank``, default the run's ``bank/``);
      ``"memento"`` -- Memento reference retriever pairs (``memento_pairs``) with the case memory
      they refer to (``memento_memory``); the pair's label is its task-level ``truth_label``;
      ``"cases"`` -- a Case JSONL bank (``cases``) plus a rewards file (``rewards``);
    - ``encoder``: how state and case texts become vectors (the cached encoder; each text is encoded
      once per machine);
    - ``val_fraction``: the share of *states* held out for validation (no state text is in both
      splits); the split is stratified by the states' labels and seeded by ``split_seed``;
    - ``label_threshold``: a (state, case) pair counts as rewarded when its reward is >= this (for
      AUC, calibration and ranking metrics, and for counting states with mixed labels);
    - ``num_workers``: DataLoader worker processes (0: load in the training process; the data are
      in-memory tensors, so 0 is usually fastest).
    """

    source: DataSource
    log: str | None = None
    bank: str | None = None
    memento_pairs: str | None = None
    memento_memory: str | None = None
    cases: str | None = None
    rewards: str | None = None
    encoder: EncoderConfig = dataclasses.field(default_factory=EncoderConfig)
    val_fraction: float = 0.2
    split_seed: int = 0
    label_threshold: float = 0.5
    num_workers: int = 0

    def __post_init__(self) -> None:
        cls = type(self)
        check_choice(self, "source", DataSource)
        for field in ("log", "bank", "memento_pairs", "memento_memory", "cases", "rewards"):
            value = getattr(self, field)
            check(value is None or (isinstance(value, str) and bool(value.strip())), cls, field, value,
                   "must be None or a non-empty path")
        needs = {"log": ("log",), "memento": ("memento_pairs", "memento_memory"), "cases": ("cases", "rewards")}
        for field in needs[self.source]:
            check(getattr(self, field) is not None, cls, field, None, f"is required for source={self.source!r}")
        for source, fields in needs.items():
            if source != self.source:
                for field in fields:
                    check(getattr(self, field) is None, cls, field, getattr(self, field),
                           f"belongs to source={source!r}, not source={self.source!r}")
        check(self.bank is None or self.source == "log", cls, "bank", self.bank, "is only used with source='log'")
        check(isinstance(self.encoder, EncoderConfig), cls, "encoder", self.encoder, "must be an EncoderConfig")
        check_float(self, "val_fraction", low=0.0, high=1.0, low_open=True, high_open=True)
        check_int(self, "split_seed", 0)
        check_float(self, "label_threshold")
        check_int(self, "num_workers", 0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainerConfig:
    """The Lightning ``Trainer`` and what it logs.

    - ``accelerator``, ``devices``, ``num_nodes``, ``strategy``: passed to Lightning as they are
      (``devices``: ``"auto"``, a count, ``-1`` for all, or ``"0,1"``; ``strategy``: ``"auto"``,
      ``"ddp"``, ``"ddp_spawn"``, ``"fsdp"``...: multi-GPU and multi-node training is Lightning's);
    - ``precision``: ``"auto"`` is ``"bf16-mixed"`` on a CUDA GPU that supports bfloat16, else
      ``"32-true"``; any other value is passed to Lightning;
    - ``max_epochs``, ``max_steps`` (``-1``: no step limit): when to stop at the latest;
    - ``patience``: early stopping after this many validation epochs without the validation loss
      improving by ``min_delta`` (0: off);
    - ``save_top_k``: best checkpoints kept by validation loss (``last.ckpt`` is always kept);
    - ``log_every_n_steps``: TensorBoard step scalars every n optimiser steps;
    - ``hit_k``: the K of the per-state ranking metrics ``hit@K``; ``ece_bins``: bins of the
      expected calibration error;
    - ``progress_bar``: Lightning's progress bar.
    """

    accelerator: Accelerator = "auto"
    devices: int | str = "auto"
    num_nodes: int = 1
    strategy: str = "auto"
    precision: Precision = "auto"
    max_epochs: int = 20
    max_steps: int = -1
    patience: int = 5
    min_delta: float = 0.0
    save_top_k: int = 1
    log_every_n_steps: int = 10
    hit_k: tuple[int, ...] = (1, 4)
    ece_bins: int = 10
    progress_bar: bool = True

    def __post_init__(self) -> None:
        cls = type(self)
        check_choice(self, "accelerator", Accelerator)
        devices = self.devices
        if isinstance(devices, str) and devices.strip().lstrip("-").isdigit():
            object.__setattr__(self, "devices", int(devices))
            devices = self.devices
        ok = (isinstance(devices, int) and not isinstance(devices, bool) and (devices >= 1 or devices == -1)) or (
            isinstance(devices, str) and (devices == "auto" or all(p.strip().isdigit() for p in devices.split(","))))
        check(ok, cls, "devices", devices, "must be 'auto', a count >= 1, -1 (all) or a list like '0,1'")
        check_int(self, "num_nodes", 1)
        check(isinstance(self.strategy, str) and bool(self.strategy.strip()), cls, "strategy", self.strategy,
               "must be a Lightning strategy name such as 'auto' or 'ddp'")
        check_choice(self, "precision", Precision)
        check_int(self, "max_epochs", 1)
        check(isinstance(self.max_steps, int) and not isinstance(self.max_steps, bool)
               and (self.max_steps == -1 or self.max_steps >= 1), cls, "max_steps", self.max_steps,
               "must be -1 (no limit) or an integer >= 1")
        check_int(self, "patience", 0)
        check_float(self, "min_delta", low=0.0)
        check_int(self, "save_top_k", 1)
        check_int(self, "log_every_n_steps", 1)
        hit_k = tuple(self.hit_k) if isinstance(self.hit_k, (list, tuple)) else self.hit_k
        check(isinstance(hit_k, tuple) and len(hit_k) >= 1 and len(set(hit_k)) == len(hit_k)
               and all(isinstance(k, int) and not isinstance(k, bool) and k >= 1 for k in hit_k),
               cls, "hit_k", self.hit_k, "must be distinct integers >= 1")
        object.__setattr__(self, "hit_k", tuple(sorted(hit_k)))
        check_int(self, "ece_bins", 1)
        check(isinstance(self.progress_bar, bool), cls, "progress_bar", self.progress_bar, "must be true or false")


RESUMABLE_CHANGES = tuple(f.name for f in dataclasses.fields(TrainerConfig))
"""A resumed run may change any trainer field (e.g. more epochs); data, Q-network and learner must match."""


def _default_learner() -> LearnerConfig:
    return LearnerConfig()


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """One offline training run (see the module docstring)."""

    data: DataConfig
    qnet: QNetConfig
    learner: LearnerConfig = dataclasses.field(default_factory=_default_learner)
    trainer: TrainerConfig = dataclasses.field(default_factory=TrainerConfig)

    def __post_init__(self) -> None:
        cls = type(self)
        for field, kind in (("data", DataConfig), ("qnet", QNetConfig), ("learner", LearnerConfig),
                            ("trainer", TrainerConfig)):
            check(isinstance(getattr(self, field), kind), cls, field, getattr(self, field),
                   f"must be a {kind.__name__}")
        check(self.learner.gamma == 0.0 or self.data.source == "log", cls, "learner",
               f"gamma={self.learner.gamma}", "gamma > 0 (soft TD) needs next states: only transition logs "
               "(source='log') carry them")


def train_config_from_dict(data: dict[str, Any], *, dim: int | None = None) -> TrainConfig:
    """A :class:`TrainConfig` from plain JSON; ``dim`` fills (or must equal) ``qnet.dim``."""
    if not isinstance(data, dict):
        raise ConfigError(f"TrainConfig: expected an object, got {type(data).__name__}")
    data = copy.deepcopy(data)
    qnet = data.setdefault("qnet", {})
    if not isinstance(qnet, dict):
        raise ConfigError(f"TrainConfig.qnet={qnet!r}: expected an object for QNetConfig")
    if dim is not None:
        given = qnet.setdefault("dim", dim)
        if given != dim:
            raise ConfigError(f"TrainConfig.qnet.dim={given!r}: the encoder gives dim={dim}")
    elif "dim" not in qnet:
        raise ConfigError("TrainConfig.qnet.dim: missing (it comes from the encoder when one is loaded)")
    return from_dict(TrainConfig, data)


def load_train_config(path: str | Path, *, dim: int | None = None) -> TrainConfig:
    """Read a :class:`TrainConfig` JSON file (``qnet.dim`` may be left out when ``dim`` is given)."""
    path = Path(path)
    data = read_config_json(path)
    try:
        return train_config_from_dict(data, dim=dim)
    except ConfigError as error:
        raise ConfigError(f"{path}: {error}") from None


def save_train_config(config: TrainConfig, path: str | Path) -> None:
    """Write ``config`` as indented JSON, atomically."""
    save_json(config, path)
