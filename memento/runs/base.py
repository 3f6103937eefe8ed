"""The run skeleton the question-answering loop, the game loop and the Ray driver share.

A run kind writes only its step, split in two hooks (as Stable-Baselines3 writes its collect loop once):

- :meth:`Run._act`: one unit of work (a round of B tasks, an episode) from the current bank and policy:
  candidates -> select -> plan / act -> judge -> credit;
- :meth:`Run._commit`: what the unit changes: retain -> observe -> usage -> log (the step counters advance).

:class:`Run` owns the rest: the seeds (``numpy.random.SeedSequence(seed).spawn``: stream 0 the task or game order,
1 the policy's draws, 2 and 3 the Q-network and learner seeds, 4 a run kind's own, e.g. the game actor's draws), the
run directory (:class:`~memento.runs.rundir.RunDir`), the bank, the policy, the counters and millisecond totals,
checkpoints (``state.json`` with the common state plus :meth:`Run._checkpoint_state`, copies of the run's logs, the
policy's own state) and resume (bank rolled back, logs restored, RNG states and counters reloaded), TensorBoard,
the progress bar and the summary. The memory systems (:class:`~memento.systems.runtime.MemorySystems`) are built for
every run: with none configured each of their hooks does nothing.

:func:`loop_policy` is the one place that maps a policy kind to the runs' default config.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar, get_args

import numpy as np
import torch

from memento.bank import CaseBank
from memento.bank.index import use_gpu_for
from memento.bank.uri import bank_name, open_bank
from memento.config import (
    MAX_CANDIDATES,
    MAX_K,
    MAX_SEED,
    MAX_STEPS,
    POLICY_CONFIGS,
    PolicyConfig,
    PolicyKind,
    SimilarityConfig,
    SoftQConfig,
    check,
    check_factory,
    check_int,
    check_policy,
    to_dict,
)
from memento.errors import CheckpointError, ConfigError, DataFormatError, DimensionError
from memento.extras import install_hint
from memento.io import atomic_write
from memento.learn.features import CaseFeaturizer
from memento.learn.policy import Policy, PolicyContext, PolicyFactory
from memento.runs.rundir import CHECKPOINT_FORMAT, CHECKPOINT_FORMAT_VERSION, RunDir, check_saved_config, write_json
from memento.systems.runtime import MemorySystems, SystemsConfig
from memento.types import Selection

__all__ = ["Run", "RunConfig", "TaskOrder", "anchored", "crossed", "encode_checked", "loop_policy", "restore_bank",
           "run_bank", "selection_fields", "task_order", "timed", "torch_seed"]

logger = logging.getLogger(__name__)

SEED_STREAMS = 5
"""Streams spawned from a run's seed (``SeedSequence.spawn`` children do not depend on how many are spawned)."""


def anchored(soft_q: SoftQConfig, **qnet: Any) -> SoftQConfig:
    """``soft_q`` with its Q-network anchored on cosine similarity and seeing the case features (``anchor="cosine"``,
    ``features="case"``), with ``qnet``'s further changes."""
    return dataclasses.replace(soft_q, qnet=dataclasses.replace(soft_q.qnet, anchor="cosine", features="case", **qnet))


def loop_policy(kind: PolicyKind, *, gamma: float = 0.0, rewarded_only: bool = True,
                soft_q: SoftQConfig | None = None) -> PolicyConfig:
    """The runs' default config of each policy kind: the config class's own defaults, except

    - similarity: among the successful cases only (``rewarded_only``), as Memento's non-parametric client
      retrieves them;
    - soft_q: ``soft_q`` when given, else among the same successful cases with a Q-network anchored on cosine
      similarity that sees the case features (:func:`anchored`): the configuration measured best on ``facts-real``
      (docs/benchmarks.md; :class:`~memento.config.SoftQConfig`'s own defaults stay the plain Memento Q-network,
      which needs no bank to build); its ``learner.gamma`` set to ``gamma`` (0: cross-entropy on each step's own
      reward; > 0: soft TD with the target network, for the game loop).

    The QA loop takes the defaults, the game loop passes its ``gamma``, the regret run
    (:func:`memento.runs.regret.regret_policy`) its plain similarity and its own soft-Q."""
    if kind not in POLICY_CONFIGS:
        raise ConfigError(f"policy kind {kind!r}: must be one of {get_args(PolicyKind)}")
    if kind == "similarity":
        return SimilarityConfig(positive_only=rewarded_only)
    if kind == "soft_q":
        base = soft_q if soft_q is not None else anchored(SoftQConfig(positive_only=rewarded_only))
        return dataclasses.replace(base, learner=dataclasses.replace(base.learner, gamma=float(gamma)))
    return POLICY_CONFIGS[kind]()


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunConfig:
    """The fields every run kind has (:class:`~memento.runs.qa.LoopConfig`, :class:`~memento.runs.games.GameLoopConfig`
    extend it; each documents them for its run):

    - ``k``: cases shown per decision; ``candidates``: C, the cosine pre-selection the policy chooses from (``k <= C``);
    - ``policy``: :data:`memento.config.PolicyConfig` (default: :func:`loop_policy`'s soft-Q);
    - ``seed``: every random stream of the run; ``shuffle``: the order is a fresh permutation per pass (else the list
      order, cycled); ``index``: the faiss factory of a new bank;
    - ``window``: units per moving-average window; ``checkpoint_every``: steps between checkpoints (0: only at the
      end); ``tensorboard``: event files under ``out_dir/tb``;
    - ``learn``: let the policy learn (``False``: a frozen evaluation); ``systems``: the memory systems built and
      shown (:class:`~memento.systems.runtime.SystemsConfig`; default: none).
    """

    k: int = dataclasses.field(default=4, metadata={"help": "cases shown per task"})
    candidates: int = dataclasses.field(default=32, metadata={"help": "candidate set size C"})
    policy: PolicyConfig = dataclasses.field(default_factory=lambda: loop_policy("soft_q"))
    seed: int = dataclasses.field(default=0, metadata={"help": "seed of every random stream of the run"})
    shuffle: bool = True
    index: str = dataclasses.field(default="Flat", metadata={"help": "faiss factory of a new bank"})
    window: int = dataclasses.field(default=50, metadata={"help": "steps per success-rate window"})
    checkpoint_every: int = dataclasses.field(default=100, metadata={"help": (
        "steps between checkpoints; 0: only at the end")})
    tensorboard: bool = dataclasses.field(default=True, metadata={"help": (
        "write TensorBoard event files (the run's tb/); --no-tensorboard: none, needed without TensorBoard "
        "installed (the 'train' extra)")})
    learn: bool = dataclasses.field(default=True, metadata={"help": (
        "the policy learns; --no-learn: it does not (an evaluation)")})
    systems: SystemsConfig = dataclasses.field(default_factory=SystemsConfig)

    def __post_init__(self) -> None:
        cls = type(self)
        check_int(self, "k", 1, MAX_K)
        check_int(self, "candidates", 1, MAX_CANDIDATES)
        check(self.k <= self.candidates, cls, "k", self.k, f"must be <= candidates={self.candidates}")
        check_policy(self)
        check_int(self, "seed", 0, MAX_SEED)
        for field in ("shuffle", "tensorboard", "learn"):
            check(isinstance(getattr(self, field), bool), cls, field, getattr(self, field), "must be true or false")
        check_factory(self, "index")
        check_int(self, "window", 1, MAX_STEPS)
        check_int(self, "checkpoint_every", 0, MAX_STEPS)
        check(isinstance(self.systems, SystemsConfig), cls, "systems", self.systems, "must be a SystemsConfig")

    @property
    def policy_kind(self) -> str:
        """The policy's name (``config.policy.kind``)."""
        return str(self.policy.kind)


# ---------------------------------------------------------------- helpers


def task_order(n_tasks: int, steps: int, seed: np.random.SeedSequence | int, *, shuffle: bool = True) -> np.ndarray:
    """Indices of the ``steps`` tasks of the stream (a prefix of a longer run's stream with the same seed)."""
    if n_tasks < 1:
        raise DataFormatError("the task list is empty")
    if not shuffle:
        return np.arange(steps, dtype=np.int64) % n_tasks
    rng = np.random.default_rng(seed)
    passes = -(-steps // n_tasks)
    return np.concatenate([rng.permutation(n_tasks) for _ in range(passes)])[:steps].astype(np.int64)


class TaskOrder:
    """The same indices as :func:`task_order`, drawn one pass at a time: memory holds one pass (``n_tasks``
    indices), never ``steps`` of them, so a run's length costs no memory. Indexing by a step or a slice of steps
    (forward, as a run reads it; an earlier pass is drawn again from the seed)."""

    def __init__(self, n_tasks: int, steps: int, seed: np.random.SeedSequence | int, *, shuffle: bool = True):
        if n_tasks < 1:
            raise DataFormatError("the task list is empty")
        self.n_tasks, self.steps, self.shuffle = n_tasks, steps, shuffle
        self._seed = seed
        self._rng = np.random.default_rng(seed)
        self._pass = -1  # the pass self._perm holds
        self._perm = np.arange(n_tasks, dtype=np.int64)

    def __len__(self) -> int:
        return self.steps

    def _permutation(self, index: int) -> np.ndarray:
        if not self.shuffle:
            return self._perm
        if index < self._pass:  # backwards: draw the passes again from the start
            self._rng, self._pass = np.random.default_rng(self._seed), -1
        while self._pass < index:
            self._perm = self._rng.permutation(self.n_tasks).astype(np.int64)
            self._pass += 1
        return self._perm

    def _at(self, step: int) -> int:
        if not 0 <= step < self.steps:
            raise IndexError(f"step {step} outside 0..{self.steps - 1}")
        return int(self._permutation(step // self.n_tasks)[step % self.n_tasks])

    def __getitem__(self, key: int | slice) -> Any:
        if isinstance(key, slice):
            start, stop, stride = key.indices(self.steps)
            return np.array([self._at(i) for i in range(start, stop, stride)], dtype=np.int64)
        return self._at(int(key) + self.steps if int(key) < 0 else int(key))


def torch_seed(seq: np.random.SeedSequence) -> int:
    """A non-negative int64 torch seed drawn from a ``SeedSequence``."""
    return int(seq.generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))


def entropy(p_C: np.ndarray) -> float:
    """The entropy (nats) of a distribution over candidates."""
    p = np.asarray(p_C, dtype=np.float64)
    p = p[p > 0]
    return float(-(p * np.log(p)).sum()) if p.size else 0.0


def selection_fields(sel: Selection | None) -> dict[str, Any]:
    """A :class:`~memento.formats.StepRecord`'s fields of the policy's choice (empty ones when it made none)."""
    return {"candidate_ids": [] if sel is None else list(sel.candidate_ids),
            "chosen_ids": [] if sel is None else list(sel.ids),
            "propensities": [] if sel is None else [float(p) for p in sel.probs_K],
            "set_propensity": None if sel is None else float(sel.set_prob),
            "greedy": None if sel is None else bool(sel.greedy),
            "entropy": 0.0 if sel is None else entropy(sel.probs_C),
            "candidate_probs": None if sel is None else [float(p) for p in sel.probs_C]}


def crossed(start: int, stop: int, every: int) -> bool:
    """Whether steps ``start -> stop`` crossed a multiple of ``every`` (0: never)."""
    return bool(every and stop // every > start // every)


@contextlib.contextmanager
def timed(ms: dict[str, float], name: str) -> Iterator[None]:
    """Add the block's wall seconds to ``ms[name]``."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        ms[name] = ms.get(name, 0.0) + time.perf_counter() - t0


def encode_checked(encoder: Any, dim: int, texts: list[str]) -> np.ndarray:
    """``encoder.encode(texts)`` as contiguous float32 unit vectors ``(N, dim)``; a wrong shape is a
    :class:`DimensionError` naming both, NaN/inf/zero vectors a :class:`DataFormatError`."""
    out = np.asarray(encoder.encode(texts), dtype=np.float32)
    out_ND = out.reshape(len(texts), -1)
    if out_ND.shape[1] != dim:
        raise DimensionError(f"encoder returned vectors of shape {out.shape} for {len(texts)} text(s); "
                             f"expected dim={dim}")
    norms_N1 = np.linalg.norm(out_ND, axis=1, keepdims=True)
    if not np.isfinite(out_ND).all() or (norms_N1 == 0).any():
        raise DataFormatError("encoder returned NaN, inf or zero vectors")
    if (np.abs(norms_N1 - 1.0) > 1e-4).any():
        out_ND = out_ND / norms_N1
    return np.ascontiguousarray(out_ND, dtype=np.float32)


def run_bank(target: Path, dim: int, *, bank_dir: Path | str | None, index: str, encoder_config: Any,
             device: torch.device) -> CaseBank:
    """A run's fresh bank at ``target``: a copy of the bank named ``bank_dir`` (a directory or ``milvus:URI``,
    :func:`memento.bank.uri.open_bank`; read only, not changed; its index factory and encoder win), or an empty
    one with ``index``. A seed bank of another dimension is a :class:`DimensionError` naming both. The copy keeps
    where the seed keeps its vectors (``BankConfig.vectors``)."""
    if bank_dir is None:
        return CaseBank.create(target, dim, index=index, encoder=encoder_config, use_gpu=use_gpu_for(device))
    with open_bank(bank_dir, read_only=True) as seed:
        if seed.dim != dim:
            raise DimensionError(f"{bank_dir}: the seed bank holds dim={seed.dim} vectors, the encoder gives dim={dim}")
        bank = CaseBank.create(target, dim, index=seed.config.index, encoder=seed.config.encoder or encoder_config,
                               use_gpu=use_gpu_for(device), vectors=seed.config.vectors)
        try:
            cases = list(seed.iter_cases())
            if cases:
                bank.add(cases, seed.embeddings([c.id or "" for c in cases]), allow_duplicates=True)  # live ones
        except BaseException:
            bank.close()
            raise
    return bank


def restore_bank(ckpt: Path, state: dict[str, Any], bank: CaseBank) -> None:
    """Roll the run's bank back to a checkpoint: the same bank (uid), at least as long, truncated to the saved
    length, and its usage log to the saved step."""
    if state["bank_uid"] != bank.uid:
        raise CheckpointError(f"{ckpt}: saved for bank uid {state['bank_uid']}, {bank.path} has uid {bank.uid}")
    saved_len = int(state["bank_size"])
    if len(bank) < saved_len:
        raise CheckpointError(f"{ckpt}: saved with {saved_len} cases in the bank, {bank.path} holds {len(bank)}")
    removed = bank.truncate(saved_len)
    if removed:
        logger.info("resume: dropped %d case(s) retained after the checkpoint", removed)
    dropped = bank.truncate_usage(int(state["step"]))
    if dropped:
        logger.info("resume: dropped %d usage row(s) logged after the checkpoint", dropped)


# ---------------------------------------------------------------- the skeleton


class Run:
    """One run over a stream of units (see the module docstring). A run kind sets the class attributes, implements
    :meth:`_act` and :meth:`_commit` and the small hooks below (``_fingerprint``, ``_done``, ``_next_unit``,
    ``_summary``...); :meth:`run` does the rest.

    ``UNIT`` names the progress unit: the config's ``<UNIT>s`` field is the run's length and ``state.json``'s
    ``<UNIT>`` key its position; ``STREAM`` names what the order draws from (``<STREAM>_fingerprint`` and
    ``n_<STREAM>`` in ``state.json``); a unit returned by :meth:`_next_unit` has a ``start_step``.
    """

    config_class: ClassVar[type[RunConfig]] = RunConfig
    COMPONENTS: ClassVar[tuple[str, ...]] = ()
    RESUMABLE: ClassVar[tuple[str, ...]] = ()
    COUNTERS: ClassVar[tuple[str, ...]] = ()
    RNGS: ClassVar[dict[str, int]] = {"policy_rng": 1}
    LOGS: ClassVar[tuple[str, ...]] = (RunDir.STEPS,)
    UNIT: ClassVar[str] = "step"
    STREAM: ClassVar[str] = "tasks"
    STREAM_CHANGED: ClassVar[str] = "another task list"
    KIND: ClassVar[str | None] = None
    KIND_NAME: ClassVar[str] = "question-answering"
    BAR_UNIT: ClassVar[str] = "task"
    RATE_NAME: ClassVar[str] = "success"
    FINAL_CHECKPOINT: ClassVar[bool] = False
    TRAJECTORY: ClassVar[Any] = None

    def __init__(self, config: RunConfig, *, make_policy: PolicyFactory, encoder: Any, planner: Any,
                 out_dir: str | Path, bank_dir: str | Path | None = None, device: str | torch.device = "cpu",
                 resume: bool = False, progress: bool = False):
        name = type(self).__name__
        if not isinstance(config, self.config_class):
            raise ConfigError(f"{name}: config={type(config).__name__}: must be a {self.config_class.__name__}")
        if not callable(make_policy):
            raise ConfigError(f"{name}: make_policy={make_policy!r} is not callable (config, context) -> Policy "
                              "(pass memento.policies.make_policy)")
        dim = getattr(encoder, "dim", None)
        if not callable(getattr(encoder, "encode", None)) or not isinstance(dim, int):
            raise ConfigError(f"{name}: encoder {encoder!r} needs encode(texts) and an integer dim")
        self.config = config
        self.make_policy = make_policy
        self.encoder = encoder
        self.planner = planner
        self.run_dir = RunDir(out_dir)
        self.out_dir = self.run_dir.path
        self.bank_dir = None if bank_dir is None else bank_name(bank_dir)  # a directory or milvus:URI
        self.device = torch.device(device)
        self.resume = resume
        self.progress = progress
        self.dim = dim
        self.handles: dict[Path, Any] = {}

    # ------------------------------------------------------------------ hooks (a run kind implements these)

    def _fingerprint(self) -> str:
        raise NotImplementedError

    def _stream_length(self) -> int:
        raise NotImplementedError

    def _done(self) -> int:
        """Units done so far (the progress bar's position)."""
        return self.step

    def _reset(self) -> None:
        """The kind's own state at the start of :meth:`run` (before a resume restores it)."""

    def _resumed(self, ckpt: Path, state: dict[str, Any]) -> None:
        """Resume: the kind's own state from the checkpoint (its logs are already restored)."""

    def _checkpoint_state(self, in_progress: Any) -> dict[str, Any]:
        """The kind's own entries of ``state.json``."""
        return {}

    def _logs(self) -> list[Path]:
        """The run's logs a checkpoint copies (open for appending while the run drives)."""
        return [self.out_dir / name for name in self.LOGS]

    def _recent(self) -> deque[float]:
        raise NotImplementedError

    def _desc(self) -> str:
        return f"online {self.config.policy_kind}"

    def _next_unit(self) -> Any:
        raise NotImplementedError

    def _act(self, bank: CaseBank, unit: Any) -> Any:
        raise NotImplementedError

    def _commit(self, bank: CaseBank, acted: Any) -> Any:
        raise NotImplementedError

    def _summary(self, bank: CaseBank, wall_s: float, resumed_from: int | None, has_model: bool) -> dict[str, Any]:
        raise NotImplementedError

    def _log_summary(self, summary: dict[str, Any]) -> None:
        logger.info("%s: %d steps, success %.3f, bank %d -> %d", self._desc(), summary["steps"],
                    summary["success_rate"], summary["bank_size_start"], summary["bank_size_end"])

    # ------------------------------------------------------------------ setup

    def _total(self) -> int:
        return int(getattr(self.config, self.UNIT + "s"))

    def _encode(self, texts: list[str]) -> np.ndarray:
        return encode_checked(self.encoder, self.dim, texts)

    def _make_bank(self) -> CaseBank:
        """A fresh ``out_dir/bank``: a copy of ``bank_dir``, or empty."""
        from memento.config import EncoderConfig

        encoder_config = getattr(self.encoder, "config", None)
        return run_bank(self.run_dir.bank, self.dim, bank_dir=self.bank_dir, index=self.config.index,
                        encoder_config=encoder_config if isinstance(encoder_config, EncoderConfig) else None,
                        device=self.device)

    def _build_policy(self, seeds: list[np.random.SeedSequence], bank: CaseBank, **context: Any) -> Policy:
        ctx = PolicyContext(dim=self.dim, k_max=self.config.k, device=self.device, qnet_seed=torch_seed(seeds[2]),
                            learner_seed=torch_seed(seeds[3]), reward_of=bank.rewards,
                            featurizer=CaseFeaturizer(bank, self._encode), evidence_of=bank.evidence_at, **context)
        return self.make_policy(self.config.policy, ctx)

    def _run_info(self) -> dict[str, Any]:
        """``run.json``: what the run used besides its config."""
        describe = getattr(self.encoder, "describe", None)
        return {"policy": self.config.policy_kind, "device": str(self.device),
                "encoder": describe() if callable(describe) else repr(self.encoder), "planner": repr(self.planner),
                f"{self.STREAM}_fingerprint": self.fingerprint,
                "seed_bank": None if self.bank_dir is None else str(self.bank_dir),
                "torch": torch.__version__, "numpy": np.__version__}

    # ------------------------------------------------------------------ checkpoints

    def _timed_checkpoint(self, bank: CaseBank, in_progress: Any = None) -> None:
        t0 = time.perf_counter()
        self._checkpoint(bank, in_progress)
        self.ms_totals["checkpoint"] += (time.perf_counter() - t0) * 1000.0
        self._checkpointed_at_end = in_progress is None and self._done() == self._total()

    def _checkpoint(self, bank: CaseBank, in_progress: Any = None) -> None:
        """Write a complete checkpoint into checkpoint.tmp, then swap it in for checkpoint."""
        cfg = self.config
        tmp = self.run_dir.begin_checkpoint()
        bank.flush()
        for path, handle in self.handles.items():
            handle.flush()
            os.fsync(handle.fileno())
            atomic_write(tmp / path.name, lambda dst, src=path: shutil.copyfile(src, dst))
        self.policy.checkpoint(tmp)
        write_json(tmp / RunDir.CONFIG, to_dict(cfg))
        state = {"format": CHECKPOINT_FORMAT, "format_version": CHECKPOINT_FORMAT_VERSION, "step": self.step,
                 "policy": cfg.policy_kind, "bank_size": len(bank), "bank_uid": bank.uid,
                 "bank_size_start": self.bank_size_start, "counters": dict(self.counters),
                 "ms_totals": dict(self.ms_totals),
                 **{name: rng.bit_generator.state for name, rng in self.rngs.items()},
                 f"{self.STREAM}_fingerprint": self.fingerprint, f"n_{self.STREAM}": self._stream_length(),
                 **self._checkpoint_state(in_progress), "time": time.time()}
        write_json(tmp / RunDir.STATE, state)  # last: its presence marks the checkpoint complete
        final = self.run_dir.commit_checkpoint(tmp)
        logger.info("checkpoint at step %d, %s %d (%d cases in the bank) in %s", self.step, self.UNIT, self._done(),
                    len(bank), final)

    def _check_checkpoint(self, ckpt: Path, state: dict[str, Any]) -> None:
        """A checkpoint of this kind of run, config (but for the resumable fields), stream and length."""
        if state.get("kind") != self.KIND:
            other = "question-answering" if state.get("kind") is None else "game"
            raise CheckpointError(f"{ckpt}: a {other} run's checkpoint, not a {self.KIND_NAME} run's")
        check_saved_config(ckpt, self.config_class, self.config, self.RESUMABLE)
        key, n = f"{self.STREAM}_fingerprint", f"n_{self.STREAM}"
        if state[key] != self.fingerprint:
            raise CheckpointError(f"{ckpt}: saved for {self.STREAM_CHANGED} ({state[n]} {self.STREAM}, fingerprint "
                                  f"{state[key][:12]}); now {self._stream_length()} {self.STREAM}, fingerprint "
                                  f"{self.fingerprint[:12]}")
        position = int(state[self.UNIT])
        if position > self._total():
            raise CheckpointError(f"{ckpt}: the checkpoint is at {self.UNIT} {position}, beyond "
                                  f"{self.UNIT}s={self._total()}")

    def _restore(self, ckpt: Path, bank: CaseBank) -> None:
        state = RunDir.read_state(ckpt)
        self._check_checkpoint(ckpt, state)
        restore_bank(ckpt, state, bank)
        self.step = int(state["step"])
        self.bank_size_start = int(state["bank_size_start"])
        self.counters.update({k: int(v) if isinstance(v, int) else v for k, v in state["counters"].items()})
        self.ms_totals.update({k: float(v) for k, v in state["ms_totals"].items()})
        for name, rng in self.rngs.items():
            rng.bit_generator.state = state[name]
        self.policy.restore(ckpt)
        for path in self._logs():  # the logs: exactly the checkpoint's copies
            if not (ckpt / path.name).is_file():
                raise CheckpointError(f"{ckpt}: no {path.name} in the checkpoint of a run that writes it")
            atomic_write(path, lambda dst, src=ckpt / path.name: shutil.copyfile(src, dst))
        self._resumed(ckpt, state)
        self.run_dir.adopt_checkpoint(ckpt)
        logger.info("resumed %s at step %d, %s %d of %d (%d cases in the bank)", self._desc(), self.step, self.UNIT,
                    self._done(), self._total(), len(bank))

    # ------------------------------------------------------------------ the run

    def run(self) -> dict[str, Any]:
        """Run (or finish) the stream; returns the summary (also written to ``out_dir/summary.json``)."""
        cfg = self.config
        started = time.perf_counter()
        self.fingerprint = self._fingerprint()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        ckpt = self.run_dir.start(self.resume)
        seeds = np.random.SeedSequence(cfg.seed).spawn(SEED_STREAMS)
        self.order = TaskOrder(self._stream_length(), self._total(), seeds[0], shuffle=cfg.shuffle)
        self.rngs = {name: np.random.Generator(np.random.PCG64(seeds[i])) for name, i in self.RNGS.items()}
        self.policy_rng = self.rngs["policy_rng"]
        self.step = 0
        self.counters: dict[str, Any] = dict.fromkeys(self.COUNTERS, 0)
        self.ms_totals: dict[str, float] = dict.fromkeys(self.COMPONENTS, 0.0)
        self._checkpointed_at_end = False
        self._reset()
        bank = self._make_bank() if ckpt is None else CaseBank.open(self.run_dir.bank, dim=self.dim,
                                                                   use_gpu=use_gpu_for(self.device))
        try:
            self.systems = MemorySystems(cfg.systems, planner=self.planner, encode=self._encode,
                                         cache_path=self.out_dir / "memory_calls.jsonl", trajectory=self.TRAJECTORY)
            self.policy = self._build_policy(seeds, bank)
            if ckpt is None:
                self.bank_size_start = len(bank)
                write_json(self.run_dir.config_path, to_dict(cfg))
                for name in self.LOGS:
                    (self.out_dir / name).write_bytes(b"")
            else:
                self._restore(ckpt, bank)
            self.systems.open(bank)  # after the bank was rolled back to the checkpoint
            self.resumed_from = None if ckpt is None else self.step
            write_json(self.run_dir.run_info_path, self._run_info())
            return self._loop(bank, started)
        finally:
            bank.close()

    def _tensorboard(self) -> Any:
        """The run's TensorBoard writer (``None`` when the config turns it off)."""
        cfg = self.config
        if not cfg.tensorboard:
            return None
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            name = type(cfg).__name__
            raise ConfigError(f"{name}.tensorboard=True needs TensorBoard: {install_hint('train')} "
                              f"(or pass --no-tensorboard to memento online, or set \"tensorboard\": false in the "
                              f"{name})") from None
        writer = SummaryWriter(str(self.run_dir.tensorboard),
                               purge_step=self.step if self.resumed_from is not None else None)
        if self.resumed_from is None:
            writer.add_text("config", "```\n" + json.dumps(to_dict(cfg), indent=2) + "\n```", 0)
        return writer

    def _loop(self, bank: CaseBank, started: float) -> dict[str, Any]:
        from tqdm.auto import tqdm

        self.writer = self._tensorboard()
        self.recent = self._recent()
        self.bar = tqdm(total=self._total(), initial=self._done(), desc=self._desc(), unit=self.BAR_UNIT,
                        disable=not self.progress, dynamic_ncols=True)
        try:
            with contextlib.ExitStack() as stack:
                self.handles = {path: stack.enter_context(path.open("a", encoding="utf-8")) for path in self._logs()}
                self._drive(bank)
        finally:
            self.handles = {}
            self.bar.close()
            if self.writer is not None:
                self.writer.close()
        has_model = self.policy.save_model(self.run_dir.selector)
        summary = self._summary(bank, time.perf_counter() - started, self.resumed_from, has_model)
        write_json(self.run_dir.summary_path, summary)
        self._log_summary(summary)
        return summary

    def _drive(self, bank: CaseBank) -> None:
        """Act and commit one unit after the other, with a checkpoint when one is due."""
        while self._done() < self._total():
            unit = self._next_unit()
            before = self._done()
            self._commit(bank, self._act(bank, unit))
            self._advanced(bank, self._done() - before)
            self._checkpoint_if_due(bank, unit.start_step)
        if self.FINAL_CHECKPOINT and self._done() == self._total() and not self._checkpointed_at_end:
            self._timed_checkpoint(bank)

    def _advanced(self, bank: CaseBank, units: int) -> None:
        self.bar.update(units)
        self.bar.set_postfix(**{self.RATE_NAME: f"{np.mean(self.recent):.2f}"}, bank=len(bank))

    def _checkpoint_if_due(self, bank: CaseBank, start_step: int) -> None:
        """A checkpoint at the end, and after a unit whose steps crossed a multiple of ``checkpoint_every``."""
        if self._done() == self._total() or crossed(start_step, self.step, self.config.checkpoint_every):
            self._timed_checkpoint(bank)

    # ------------------------------------------------------------------ summary

    def _ms_per_step(self, steps: int) -> dict[str, float]:
        ms = {name: self.ms_totals[name] / max(1, steps) for name in self.COMPONENTS}
        ms["total"] = sum(ms.values())
        return ms

    def _common_summary(self, bank: CaseBank, wall_s: float, resumed_from: int | None,
                        has_model: bool) -> dict[str, Any]:
        """The summary entries every run kind reports."""
        cfg = self.config
        return {"policy": cfg.policy_kind, "window": cfg.window, "memory_tokens": int(self.counters["memory_tokens"]),
                "bank_size_start": int(self.bank_size_start), "bank_size_end": len(bank),
                "retained": int(self.counters["retained"]), "duplicates": int(self.counters["duplicates"]),
                "updates": int(self.policy.version), "final_alpha": self.policy.alpha, "seed": cfg.seed, "k": cfg.k,
                "candidates": cfg.candidates, "resumed_from": resumed_from, "wall_s": wall_s,
                "selector": RunDir.SELECTOR if has_model else None, **self.systems.summary()}
