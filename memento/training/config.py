"""The typed run configurations of offline training, and the Lightning part they share.

- :class:`LightningConfig` -- the devices and numerics of a ``lightning.Trainer`` (accelerator,
  devices, nodes, strategy, precision, logging interval), nested as ``lightning`` in every config
  below; :func:`memento.training.run.trainer_kwargs` turns it into the ``Trainer``'s keyword arguments;
- :class:`TrainConfig` -- one ``memento train`` run (offline Q-network training), composed of
  sub-configs:

  - ``data``: :class:`DataConfig` -- where the (state, case, reward) data comes from, how texts are
    encoded (:class:`~memento.config.EncoderConfig`) and how train/validation is split;
  - ``qnet``: :class:`~memento.config.QNetConfig` -- the Q-network (its ``dim`` is the encoder's);
  - ``learner``: :class:`~memento.config.LearnerConfig` -- the loss and the optimiser (the same
    settings the online learner takes; ``batch_size`` is the training mini-batch);
  - ``trainer``: :class:`TrainerConfig` -- the Lightning ``Trainer`` (its ``lightning`` part), epochs,
    early stopping, checkpointing, metrics;

- :class:`SimCSEConfig` -- one ``memento train-encoder`` run (:mod:`memento.training.simcse`);
- :class:`JointConfig` -- joint encoder + Q-head training (:mod:`memento.training.joint`; ``qnet`` and
  ``learner`` are the same sub-configs as in :class:`TrainConfig`).

Each is saved as ``config.json`` in its run directory. A ``TrainConfig`` is read back with
:func:`load_train_config` (a config file may leave out ``qnet.dim``, which then comes from the
encoder), the others with :func:`simcse_config_from_dict` and :func:`joint_config_from_dict`.
Files written before the Lightning fields were nested (flat ``accelerator``, ``devices``, ...; for
``JointConfig`` also ``qnet_arch``, ``hidden``, ``n_layers``, ``qnet_dropout``) are read too: the
readers move the flat keys into the nested form (:func:`nest_flat_lightning`).

This module imports only the standard library and :mod:`memento.config`.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any, Literal

from memento.config import (
    EncoderConfig,
    LearnerConfig,
    Pooling,
    QNetConfig,
    check,
    check_bools,
    check_choice,
    check_float,
    check_int,
    check_ints,
    from_dict,
    read_config_json,
    save_json,
)
from memento.errors import ConfigError
from memento.types import shown

__all__ = ["Accelerator", "DataConfig", "DataSource", "JointConfig", "LightningConfig", "MementoLabel", "Precision",
           "SimCSEConfig", "SimCSEMode", "TrainConfig", "TrainerConfig", "joint_config_from_dict",
           "load_train_config", "nest_flat_lightning", "save_train_config", "simcse_config_from_dict",
           "train_config_from_dict"]

DataSource = Literal["log", "memento", "cases", "labels"]
MementoLabel = Literal["truth_label"]
Precision = Literal["auto", "32-true", "bf16-mixed", "16-mixed", "bf16-true", "64-true"]
Accelerator = Literal["auto", "cpu", "gpu", "cuda", "mps"]
SimCSEMode = Literal["unsup", "sup"]


# ---------------------------------------------------------------- the shared Lightning part


@dataclasses.dataclass(frozen=True, kw_only=True)
class LightningConfig:
    """The devices and numerics of a ``lightning.Trainer`` (the part every training run shares).

    - ``accelerator``, ``devices``, ``num_nodes``, ``strategy``: passed to Lightning as they are
      (``devices``: ``"auto"``, a count, ``-1`` for all, or a list like ``"0,1"``; a count given as a
      string, ``"2"`` or ``"-1"``, is stored as an integer; ``strategy``: ``"auto"``, ``"ddp"``,
      ``"ddp_spawn"``, ``"fsdp"``...: multi-GPU and multi-node training is Lightning's);
    - ``precision``: ``"auto"`` is ``"bf16-mixed"`` on a CUDA GPU that supports bfloat16, else
      ``"32-true"``; any other value is passed to Lightning;
    - ``log_every_n_steps``: TensorBoard step scalars every n optimiser steps.

    :func:`memento.training.run.trainer_kwargs` turns it into ``lightning.Trainer`` keyword arguments.
    """

    accelerator: Accelerator = dataclasses.field(default="auto", metadata={"help": (
        "Lightning accelerator: auto | cpu | gpu | cuda | mps (auto: a GPU when present)")})
    devices: int | str = dataclasses.field(default="auto", metadata={"help": (
        "auto, a device count (-1: all) or a list of indices like 0,1")})
    num_nodes: int = dataclasses.field(default=1, metadata={"help": "machines for multi-node DDP"})
    strategy: str = dataclasses.field(default="auto", metadata={"help": "auto, ddp, ddp_spawn, fsdp, ..."})
    precision: Precision = dataclasses.field(default="auto", metadata={"help": (
        "auto: bf16-mixed on a CUDA GPU that supports it, else 32-true")})
    log_every_n_steps: int = dataclasses.field(default=10, metadata={"help": (
        "TensorBoard step scalars every N optimiser steps")})

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
        check_int(self, "log_every_n_steps", 1)


_LIGHTNING_FIELDS = tuple(f.name for f in dataclasses.fields(LightningConfig))


def _check_lightning(obj: Any) -> None:
    check(isinstance(obj.lightning, LightningConfig), type(obj), "lightning", obj.lightning,
           "must be a LightningConfig")


# ---------------------------------------------------------------- memento train


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataConfig:
    """What the Q-network learns from (see :mod:`memento.training.data` for the formats).

    - ``source``: ``"log"`` -- an online-loop transition log (``log`` is a run directory or its
      ``steps.jsonl``; case texts come from ``bank``, default the run's ``bank/``);
      ``"memento"`` -- Memento reference retriever pairs (``memento_pairs``) with the case memory
      they refer to (``memento_memory``); the pair's label is its task-level ``truth_label``;
      ``"cases"`` -- a Case JSONL bank (``cases``) plus a rewards file (``rewards``);
      ``"labels"`` -- planner-scored labels (``labels``, written by ``memento score``; :mod:`memento.learn.labels`)
      with the case bank their candidate ids refer to (``bank``, required: the cases' stored embeddings);
      trained with the listwise loss of :mod:`memento.learn.listwise` instead of BCE;
    - ``encoder``: how state and case texts become vectors (the cached encoder; each text is encoded
      once per machine);
    - ``val_fraction``: the share of *states* held out for validation (no state text is in both
      splits); the split is stratified by the states' labels and seeded by ``split_seed``;
    - ``label_threshold``: a (state, case) pair counts as rewarded when its reward is >= this (for
      AUC, calibration and ranking metrics, and for counting states with mixed labels);
    - ``num_workers``: DataLoader worker processes (0: load in the training process; the data are
      in-memory tensors, so 0 is usually fastest);
    - ``tau``: ``source="labels"`` only: the temperature of the target distribution ``softmax(score / tau)``
      over each task's candidates (score = the planner's ``mean_logprob``; smaller is sharper).
    """

    source: DataSource
    log: str | None = dataclasses.field(default=None, metadata={"help": (
        "online-loop run directory or its steps.jsonl transition log")})
    bank: str | None = None
    memento_pairs: str | None = dataclasses.field(default=None, metadata={"help": (
        "Memento retriever training pairs (training_data.jsonl); label: truth_label")})
    memento_memory: str | None = dataclasses.field(default=None, metadata={"help": (
        "the Memento case memory the pairs refer to (memory.jsonl); needed with --from-memento")})
    cases: str | None = dataclasses.field(default=None, metadata={"help": "Case JSONL bank (every case with an id)"})
    rewards: str | None = dataclasses.field(default=None, metadata={"help": (
        "rewards JSONL {\"state\", \"case_id\", \"reward\", \"propensity\"?}; needed with --cases")})
    labels: str | None = dataclasses.field(default=None, metadata={"help": (
        "planner-scored labels (memento score --out FILE); needs --bank")})
    encoder: EncoderConfig = dataclasses.field(default_factory=EncoderConfig)
    val_fraction: float = dataclasses.field(default=0.2, metadata={"help": (
        "share of the states held out for validation")})
    split_seed: int = 0
    label_threshold: float = dataclasses.field(default=0.5, metadata={"help": (
        "reward from which a (state, case) pair counts as rewarded")})
    num_workers: int = dataclasses.field(default=0, metadata={"help": "DataLoader workers"})
    tau: float = dataclasses.field(default=1.0, metadata={"help": (
        "with --from-labels: temperature of the targets softmax(mean_logprob / tau)")})

    def __post_init__(self) -> None:
        cls = type(self)
        check_choice(self, "source", DataSource)
        for field in ("log", "bank", "memento_pairs", "memento_memory", "cases", "rewards", "labels"):
            value = getattr(self, field)
            check(value is None or (isinstance(value, str) and bool(value.strip())), cls, field, value,
                   "must be None or a non-empty path")
        needs = {"log": ("log",), "memento": ("memento_pairs", "memento_memory"), "cases": ("cases", "rewards"),
                 "labels": ("labels",)}
        for field in needs[self.source]:
            check(getattr(self, field) is not None, cls, field, None, f"is required for source={self.source!r}")
        for source, fields in needs.items():
            if source != self.source:
                for field in fields:
                    check(getattr(self, field) is None, cls, field, getattr(self, field),
                           f"belongs to source={source!r}, not source={self.source!r}")
        check(self.bank is None or self.source in ("log", "labels"), cls, "bank", self.bank,
              "is only used with source='log' or source='labels'")
        check(self.bank is not None or self.source != "labels", cls, "bank", None,
              "is required for source='labels' (the case bank the labels' candidate ids refer to)")
        check(isinstance(self.encoder, EncoderConfig), cls, "encoder", self.encoder, "must be an EncoderConfig")
        check_float(self, "val_fraction", low=0.0, high=1.0, low_open=True, high_open=True)
        check_int(self, "split_seed", 0)
        check_float(self, "label_threshold")
        check_int(self, "num_workers", 0)
        check_float(self, "tau", low=0.0, low_open=True)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainerConfig:
    """The Lightning ``Trainer`` and what it logs.

    - ``lightning``: :class:`LightningConfig` -- accelerator, devices, nodes, strategy, precision and
      the TensorBoard logging interval;
    - ``max_epochs``, ``max_steps`` (``-1``: no step limit): when to stop at the latest;
    - ``patience``: early stopping after this many validation epochs without the validation loss
      improving by ``min_delta`` (0: off);
    - ``save_top_k``: best checkpoints kept by validation loss (``last.ckpt`` is always kept);
    - ``hit_k``: the K of the per-state ranking metrics ``hit@K``; ``ece_bins``: bins of the
      expected calibration error;
    - ``progress_bar``: Lightning's progress bar.
    """

    lightning: LightningConfig = dataclasses.field(default_factory=LightningConfig)
    max_epochs: int = dataclasses.field(default=20, metadata={"help": "epochs at most"})
    max_steps: int = dataclasses.field(default=-1, metadata={"help": "optimiser steps at most (-1: no limit)"})
    patience: int = dataclasses.field(default=5, metadata={"help": (
        "early stopping: validation epochs without improvement (0: off)")})
    min_delta: float = 0.0
    save_top_k: int = 1
    hit_k: tuple[int, ...] = dataclasses.field(default=(1, 4), metadata={"help": "K of the hit@K metrics"})
    ece_bins: int = 10
    progress_bar: bool = True

    def __post_init__(self) -> None:
        cls = type(self)
        _check_lightning(self)
        check_int(self, "max_epochs", 1)
        check(isinstance(self.max_steps, int) and not isinstance(self.max_steps, bool)
               and (self.max_steps == -1 or self.max_steps >= 1), cls, "max_steps", self.max_steps,
               "must be -1 (no limit) or an integer >= 1")
        check_int(self, "patience", 0)
        check_float(self, "min_delta", low=0.0)
        check_int(self, "save_top_k", 1)
        hit_k = tuple(self.hit_k) if isinstance(self.hit_k, (list, tuple)) else self.hit_k
        check(isinstance(hit_k, tuple) and len(hit_k) >= 1 and len(set(hit_k)) == len(hit_k)
               and all(isinstance(k, int) and not isinstance(k, bool) and k >= 1 for k in hit_k),
               cls, "hit_k", self.hit_k, "must be distinct integers >= 1")
        object.__setattr__(self, "hit_k", tuple(sorted(hit_k)))
        check_int(self, "ece_bins", 1)
        check_bools(self, "progress_bar")


RESUMABLE_CHANGES = tuple(f"lightning.{name}" for name in _LIGHTNING_FIELDS) + tuple(
    f.name for f in dataclasses.fields(TrainerConfig) if f.name != "lightning")
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
        check(self.data.source != "labels" or self.learner.alpha_schedule != "target_entropy", cls, "learner",
              f"alpha_schedule={self.learner.alpha_schedule!r}", "the listwise loss of source='labels' fits "
              "softmax(Q / alpha) to the labels; a tuned alpha would trade off against the scale of Q (use 'fixed' "
              "or 'linear')")


# ---------------------------------------------------------------- memento train-encoder and joint training


@dataclasses.dataclass(frozen=True, kw_only=True)
class SimCSEConfig:
    """One SimCSE fine-tuning run (:mod:`memento.training.simcse`; saved as ``config.json`` in the output directory).

    - ``mode``: ``"unsup"`` (dropout noise, texts only) or ``"sup"`` (rewarded (state, case) pairs);
    - ``data``: input files (JSONL, format detected from the first row) or bank directories;
    - ``model``: a local transformers encoder directory, ``None`` for the bundled all-MiniLM-L6-v2;
    - ``pooling``: SimCSE's ``avg`` / ``cls`` / ``cls_before_pooler`` (as :class:`~memento.encoders.Encoder`);
    - ``max_length``: token limit per text during training;
    - ``temperature``: tau of InfoNCE; ``lr``, ``weight_decay``: AdamW; ``warmup_ratio``: linear
      warm-up share of the steps, then linear decay to 0;
    - ``batch_size``: texts (unsup) or anchors (sup) per step and device; ``epochs``; ``max_steps``
      (``None``: no limit; when set, training stops there even mid-epoch);
    - ``dropout``: overrides the model's hidden and attention dropout (SimCSE's noise; ``None`` keeps
      the model's, 0.1 for MiniLM);
    - ``include_actions``: unsup also trains on case actions, not only states;
    - ``positive_threshold``: sup; a pair with ``reward >= threshold`` is a positive, below a negative;
    - ``hard_negatives``: sup; put reward-0 cases of the anchor's state in the denominator;
    - ``eval_size``: texts (or anchors) of the fixed batch whose loss is measured before and after;
    - ``seed``: data order, hard-negative assignment, dropout masks;
    - ``lightning``: :class:`LightningConfig` -- accelerator, devices, nodes, strategy, precision and
      the TensorBoard logging interval of the ``lightning.Trainer``.
    """

    mode: SimCSEMode = dataclasses.field(default="unsup", metadata={"help": "SimCSE objective"})
    data: tuple[str, ...] = dataclasses.field(default=(), metadata={"help": (
        "input file or bank directory; repeat for several (required unless --config lists them)")})
    model: str | None = dataclasses.field(default=None, metadata={"help": (
        "local transformers encoder directory to start from")})
    pooling: Pooling = dataclasses.field(default="avg", metadata={"help": (
        "SimCSE pooling, as the encoder uses it (MiniLM's)")})
    max_length: int = dataclasses.field(default=64, metadata={"help": "token limit per text in training"})
    temperature: float = dataclasses.field(default=0.05, metadata={"help": "InfoNCE temperature tau"})
    lr: float = dataclasses.field(default=3e-5, metadata={"help": "AdamW learning rate"})
    weight_decay: float = dataclasses.field(default=0.0, metadata={"help": "AdamW weight decay"})
    warmup_ratio: float = dataclasses.field(default=0.0, metadata={"help": (
        "share of the steps with a linear warm-up; then linear decay to 0")})
    batch_size: int = dataclasses.field(default=64, metadata={"help": (
        "texts (unsup) or anchors (sup) per step and device; the in-batch negatives")})
    epochs: int = dataclasses.field(default=1, metadata={"help": "passes over the data"})
    max_steps: int | None = dataclasses.field(default=None, metadata={"help": (
        "stop after this many optimiser steps, even mid-epoch")})
    dropout: float | None = dataclasses.field(default=None, metadata={"help": (
        "hidden and attention dropout during training, SimCSE's noise")})
    include_actions: bool = dataclasses.field(default=True, metadata={"help": (
        "unsup: train on case states and their actions; --no-actions: on case states only")})
    positive_threshold: float = dataclasses.field(default=0.5, metadata={"help": (
        "sup: a pair with reward >= this is a positive, below a negative")})
    hard_negatives: bool = dataclasses.field(default=True, metadata={"help": (
        "sup: the state's reward-0 cases are hard negatives in the denominator; --no-hard-negatives: in-batch "
        "negatives only")})
    eval_size: int = dataclasses.field(default=64, metadata={"help": (
        "size of the fixed batch whose loss is reported before and after")})
    seed: int = dataclasses.field(default=0, metadata={"help": "data order, hard negatives, dropout masks"})
    lightning: LightningConfig = dataclasses.field(default_factory=LightningConfig)

    def __post_init__(self) -> None:
        cls = type(self)
        check_choice(self, "mode", SimCSEMode)
        _check_paths(self)
        check(self.model is None or (isinstance(self.model, str) and bool(self.model.strip())), cls, "model",
               self.model, "must be None or a non-empty path")
        check_choice(self, "pooling", Pooling)
        check_int(self, "max_length", 8)
        check_float(self, "temperature", low=0.0, low_open=True)
        check_float(self, "lr", low=0.0, low_open=True)
        check_float(self, "weight_decay", low=0.0)
        check_float(self, "warmup_ratio", low=0.0, high=1.0, high_open=True)
        check_ints(self, batch_size=2, epochs=1)
        if self.max_steps is not None:
            check_int(self, "max_steps", 1)
        if self.dropout is not None:
            check_float(self, "dropout", low=0.0, high=1.0, high_open=True)
        check_bools(self, "include_actions")
        check_float(self, "positive_threshold", low=0.0, low_open=True)
        check_bools(self, "hard_negatives")
        check_ints(self, eval_size=2, seed=0)
        _check_lightning(self)


def _check_paths(obj: Any) -> None:
    """``obj.data`` is a list of non-blank paths, stored as a tuple."""
    check(isinstance(obj.data, (tuple, list)) and all(isinstance(d, str) and d.strip() for d in obj.data),
           type(obj), "data", obj.data, "must be a list of paths")
    object.__setattr__(obj, "data", tuple(obj.data))


def _joint_qnet() -> QNetConfig:
    return QNetConfig(arch="mlp", hidden=256, n_layers=1, dropout=0.1)


@dataclasses.dataclass(frozen=True, kw_only=True)
class JointConfig:
    """Joint encoder + Q-head training (:mod:`memento.training.joint`; saved as ``config.json``).

    - ``data``: rewarded pairs files (as :func:`memento.training.simcse.load_pairs` reads them);
    - ``model``/``pooling``/``max_length``: the encoder, as in :class:`SimCSEConfig`;
    - ``qnet``: the Q head (:class:`~memento.config.QNetConfig`; here a 256-wide one-layer MLP by
      default); its ``dim`` is the encoder's (``None``, or it must equal it) and its initialisation
      is seeded by ``seed`` (which replaces ``qnet.seed``);
    - ``learner``: the soft-Q loss settings (``gamma`` must be 0; ``learner.lr`` is the head's
      learning rate, ``encoder_lr`` the encoder's; ``max_grad_norm`` clips both);
    - ``batch_size``: pairs per step; ``epochs``; ``max_steps`` (``None``: no limit);
    - ``positive_threshold``: rewards at or above count 1, below 0;
    - ``seed``: the pair order, the dropout masks and the Q head's initialisation;
    - ``lightning``: :class:`LightningConfig` -- accelerator, devices, nodes, strategy, precision and
      the TensorBoard logging interval of the ``lightning.Trainer``.
    """

    data: tuple[str, ...] = ()
    model: str | None = None
    pooling: Pooling = "avg"
    max_length: int = 64
    qnet: QNetConfig = dataclasses.field(default_factory=_joint_qnet)
    learner: LearnerConfig = dataclasses.field(default_factory=_default_learner)
    encoder_lr: float = 2e-5
    batch_size: int = 32
    epochs: int = 1
    max_steps: int | None = None
    positive_threshold: float = 0.5
    seed: int = 0
    lightning: LightningConfig = dataclasses.field(default_factory=LightningConfig)

    def __post_init__(self) -> None:
        cls = type(self)
        _check_paths(self)
        check_choice(self, "pooling", Pooling)
        check_int(self, "max_length", 8)
        check(isinstance(self.qnet, QNetConfig), cls, "qnet", self.qnet, "must be a QNetConfig")
        check(isinstance(self.learner, LearnerConfig) and self.learner.gamma == 0.0, cls, "learner",
               self.learner, "must be a LearnerConfig with gamma=0 (pairs have no next state)")
        check_float(self, "encoder_lr", low=0.0)
        check_ints(self, batch_size=1, epochs=1)
        if self.max_steps is not None:
            check_int(self, "max_steps", 1)
        check_float(self, "positive_threshold", low=0.0, low_open=True)
        check_int(self, "seed", 0)
        _check_lightning(self)


# ---------------------------------------------------------------- reading configs back (old flat files too)


def _object(data: Any, where: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected an object, got {type(data).__name__}")
    return data


def nest_flat_lightning(data: dict[str, Any], *, where: str = "config") -> dict[str, Any]:
    """A copy of the config dict ``data`` with the :class:`LightningConfig` fields found at its top level
    (as files written before the nesting have them) moved into ``data["lightning"]``."""
    data = copy.deepcopy(_object(data, where))
    flat = {name: data.pop(name) for name in _LIGHTNING_FIELDS if name in data}
    if flat:
        nested = _object(data.setdefault("lightning", {}), f"{where}.lightning")
        for name, value in flat.items():
            if name in nested:
                raise ConfigError(f"{where}: {name!r} is given twice, flat and as lightning.{name}")
            nested[name] = value
    return data


def _nested_train_dict(data: Any) -> dict[str, Any]:
    data = copy.deepcopy(_object(data, "TrainConfig"))
    if "trainer" in data:
        data["trainer"] = nest_flat_lightning(data["trainer"], where="TrainConfig.trainer")
    return data


def train_config_from_dict(data: dict[str, Any], *, dim: int | None = None) -> TrainConfig:
    """A :class:`TrainConfig` from plain JSON; ``dim`` fills (or must equal) ``qnet.dim``.

    The trainer's Lightning fields may be flat in ``trainer`` (files written before they were nested).
    """
    data = _nested_train_dict(data)
    qnet = data.setdefault("qnet", {})
    if not isinstance(qnet, dict):
        raise ConfigError(f"TrainConfig.qnet={shown(qnet)}: expected an object for QNetConfig")
    if dim is not None:
        given = qnet.setdefault("dim", dim)
        if given != dim:
            raise ConfigError(f"TrainConfig.qnet.dim={shown(given)}: the encoder gives dim={dim}")
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


def simcse_config_from_dict(data: dict[str, Any]) -> SimCSEConfig:
    """A :class:`SimCSEConfig` from plain JSON (the Lightning fields may be flat, as in older files)."""
    return from_dict(SimCSEConfig, nest_flat_lightning(data, where="SimCSEConfig"))


_JOINT_QNET_KEYS = {"qnet_arch": "arch", "hidden": "hidden", "n_layers": "n_layers", "qnet_dropout": "dropout"}


def joint_config_from_dict(data: dict[str, Any]) -> JointConfig:
    """A :class:`JointConfig` from plain JSON; older files' flat ``qnet_arch``/``hidden``/``n_layers``/
    ``qnet_dropout`` and Lightning fields are moved into ``qnet`` and ``lightning``.

    A flat field an older file leaves out takes the value it defaulted to then, which is the default
    ``qnet`` of :class:`JointConfig`.
    """
    data = nest_flat_lightning(data, where="JointConfig")
    flat = {new: data.pop(old) for old, new in _JOINT_QNET_KEYS.items() if old in data}
    if flat:
        if "qnet" in data:
            raise ConfigError(f"JointConfig: give the Q head either as qnet or in the old flat form "
                              f"({', '.join(_JOINT_QNET_KEYS)}), not both")
        defaults = _joint_qnet()
        data["qnet"] = {**{name: getattr(defaults, name) for name in _JOINT_QNET_KEYS.values()}, **flat}
    return from_dict(JointConfig, data)
