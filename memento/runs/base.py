"""The run skeleton the question-answering loop, the game loop and the Ray driver share.

A run kind declares a :class:`RunSpec` once (its name, config class and length field, its unit, stream, counters,
time components, logs...) and writes its step, split in two hooks (as Stable-Baselines3 writes its collect loop
once), with :meth:`Run._stream` (the stream's length and fingerprint):

- :meth:`Run._act`: one unit of work (a round of B tasks, a game's command) from the current bank and policy:
  candidates -> select -> plan / act -> judge -> credit; it writes nothing;
- :meth:`Run._commit`: everything the unit changes, in order: labels -> retain -> observe -> usage -> log (the step
  counters advance).

The few other hooks are optional and narrow (:meth:`Run._next_unit`, :meth:`Run._begin`: what a unit needs in the
bank before it acts, :meth:`Run._checkpoint_due`, :meth:`Run._summary`, ...). :class:`Run` owns the rest: the seeds
(``numpy.random.SeedSequence(seed).spawn``: stream 0 the task or game order, 1 the policy's draws, 2 and 3 the
Q-network and learner seeds, 4 a run kind's own, e.g. the game actor's draws), the run directory
(:class:`~memento.runs.rundir.RunDir`), the bank, the policy, the counters and millisecond totals, checkpoints
(``state.json`` with the common state plus :meth:`Run._checkpoint_state`, copies of the run's logs, the policy's
own state; one after each unit when due) and resume (bank rolled back, logs restored, RNG states and counters
reloaded), TensorBoard, the progress bar and the summary (the common entries, then :meth:`Run._summary`'s). The
memory systems (:class:`~memento.systems.runtime.MemorySystems`) are built for every run: with none configured
each of their hooks does nothing.

The runs' default config of each policy kind comes from the policy registry (:func:`memento.policies.loop_policy`).
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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import numpy as np
import torch

from memento.bank import CaseBank
from memento.bank.index import use_gpu_for
from memento.bank.protocol import Bank
from memento.bank.uri import bank_name, open_bank
from memento.config import (
    MAX_CANDIDATES,
    MAX_K,
    MAX_SEED,
    MAX_STEPS,
    check,
    check_factory,
    check_int,
    to_dict,
)
from memento.errors import CheckpointError, ConfigError, DataFormatError, DimensionError
from memento.extras import install_hint
from memento.io import atomic_write
from memento.learn.features import CaseFeaturizer
from memento.learn.policy import Policy, PolicyContext, PolicyFactory
from memento.policies import PolicyConfig, check_policy, loop_policy
from memento.runs.rundir import (
    CHECKPOINT_FORMAT,
    CHECKPOINT_FORMAT_VERSION,
    CHECKPOINT_KINDS,
    RunDir,
    check_saved_config,
    write_json,
)
from memento.systems.runtime import MemorySystems, SystemsConfig
from memento.types import Selection

__all__ = ["COMMON_COUNTERS", "TASKS", "Run", "RunConfig", "RunSpec", "Step", "Stream", "TaskOrder", "crossed",
           "encode_checked", "restore_bank", "run_bank", "selection_fields", "task_order", "timed", "torch_seed"]

logger = logging.getLogger(__name__)

SEED_STREAMS = 5
"""Streams spawned from a run's seed (``SeedSequence.spawn`` children do not depend on how many are spawned)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunConfig:
    """The fields every run kind has (:class:`~memento.runs.qa.LoopConfig`, :class:`~memento.runs.games.GameLoopConfig`
    extend it; each documents them for its run):

    - ``k``: cases shown per decision; ``candidates``: C, the cosine pre-selection the policy chooses from (``k <= C``);
    - ``policy``: :data:`memento.policies.PolicyConfig` (default: :func:`memento.policies.loop_policy`'s soft-Q);
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
             device: torch.device) -> Bank:
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


def restore_bank(ckpt: Path, state: dict[str, Any], bank: Bank) -> None:
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


@dataclasses.dataclass(frozen=True, kw_only=True)
class Stream:
    """What a run's order draws from, as its files name it: ``noun`` in messages (``55 tasks``), ``changed`` when a
    resume finds another one (``saved for another task list``), and the keys of its fingerprint (``state.json``,
    ``run.json``) and of its length (``state.json``)."""

    noun: str
    changed: str
    fingerprint_key: str
    size_key: str


TASKS = Stream(noun="tasks", changed="another task list", fingerprint_key="tasks_fingerprint", size_key="n_tasks")
"""A stream of tasks (the question-answering loop's, and the default)."""

COMMON_COUNTERS = ("retained", "duplicates", "memory_tokens")
"""Counters every run has (the common summary reports them); a spec's own come first, in its order."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunSpec:
    """What a run kind declares once (``SPEC``), and :class:`Run` reads:

    - ``name``: the run in messages (``a game run's checkpoint``); ``config``: its config class (a
      :class:`RunConfig`); ``length``: the config field holding the run's length, in units (``steps``);
    - ``unit``: what the progress counts, in log lines and as the ``state.json`` key of a checkpoint's position
      (``step``, or ``episode`` written by the kind's :meth:`Run._checkpoint_state`); ``bar_unit``: the progress
      bar's unit; ``rate``: the moving rate the bar shows;
    - ``stream``: what the order draws from (:class:`Stream`);
    - ``counters``: the kind's counters (``state.json``, the summary), the :data:`COMMON_COUNTERS` added after
      them; ``components``: where a step's time goes (``ms_totals``, ``ms_per_step``; ``checkpoint`` added last);
    - ``resumable``: the config fields a resume may change; ``rngs``: the generators the run draws from, by name
      and seed stream (``policy_rng`` is the policy's); ``logs``: the run files a checkpoint copies;
    - ``checkpoint_kind``: ``state.json``'s ``kind`` (none: untagged); ``final_checkpoint``: a checkpoint at the
      end even when the last unit wrote none (a resumed finished run too); ``trajectory``: which cases the memory
      systems read as the run's own trajectories (:class:`~memento.systems.runtime.MemorySystems`).
    """

    name: str
    config: type[RunConfig]
    length: str
    unit: str = "step"
    bar_unit: str = "task"
    rate: str = "success"
    stream: Stream = TASKS
    counters: tuple[str, ...] = ()
    components: tuple[str, ...] = ()
    resumable: tuple[str, ...] = ()
    rngs: tuple[tuple[str, int], ...] = (("policy_rng", 1),)
    logs: tuple[str, ...] = (RunDir.STEPS,)
    checkpoint_kind: str | None = None
    final_checkpoint: bool = False
    trajectory: Callable[[Any], bool] | None = None

    def __post_init__(self) -> None:
        fields = {f.name for f in dataclasses.fields(self.config)} if dataclasses.is_dataclass(self.config) else set()
        if self.length not in fields:
            raise ConfigError(f"RunSpec {self.name!r}: length={self.length!r} is not a field of "
                              f"{getattr(self.config, '__name__', self.config)!r}")
        if not any(name == "policy_rng" for name, _ in self.rngs):
            raise ConfigError(f"RunSpec {self.name!r}: rngs={self.rngs!r} has no policy_rng")
        if any(not 0 <= index < SEED_STREAMS for _, index in self.rngs):
            raise ConfigError(f"RunSpec {self.name!r}: rngs={self.rngs!r}: streams are 0..{SEED_STREAMS - 1}")

    @property
    def all_counters(self) -> tuple[str, ...]:
        """``counters`` with the :data:`COMMON_COUNTERS` it lacks."""
        return self.counters + tuple(c for c in COMMON_COUNTERS if c not in self.counters)

    @property
    def all_components(self) -> tuple[str, ...]:
        """``components`` with ``checkpoint`` when it lacks it."""
        return self.components + (() if "checkpoint" in self.components else ("checkpoint",))


class Step(NamedTuple):
    """The default unit: the one step at ``start_step``."""

    start_step: int


class Run:
    """One run over a stream of units (see the module docstring). A run kind declares its :class:`RunSpec`
    (``SPEC``) and writes :meth:`_stream`, :meth:`_act` and :meth:`_commit`; :meth:`run` does the rest. The other
    hooks below are optional: a unit is one step (:meth:`_next_unit`), the progress is the step
    (:meth:`_done`), the kind adds nothing to the summary (:meth:`_summary`) or to a checkpoint
    (:meth:`_checkpoint_state`), has no state of its own to reset or restore (:meth:`_reset`, :meth:`_resumed`), and
    needs nothing written before a unit acts (:meth:`_begin`). A unit has a ``start_step``.
    """

    SPEC: ClassVar[RunSpec]

    def __init__(self, config: RunConfig, *, make_policy: PolicyFactory, encoder: Any, planner: Any,
                 out_dir: str | Path, bank_dir: str | Path | None = None, device: str | torch.device = "cpu",
                 resume: bool = False, progress: bool = False):
        name = type(self).__name__
        if not isinstance(config, self.SPEC.config):
            raise ConfigError(f"{name}: config={type(config).__name__}: must be a {self.SPEC.config.__name__}")
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

    # ------------------------------------------------------------------ hooks: a run kind writes the first three

    def _stream(self) -> tuple[int, str]:
        """The stream the order draws from: its length and its fingerprint (a resume must see the same)."""
        raise NotImplementedError

    def _act(self, bank: Bank, unit: Any) -> Any:
        """One unit of work from the current bank and policy (candidates -> select -> plan / act -> judge ->
        credit): what it chose and what came of it, with nothing written (bank, learner, run files)."""
        raise NotImplementedError

    def _commit(self, bank: Bank, acted: Any) -> Any:
        """What the unit changes (retain -> observe -> usage -> labels and logs), in the order it is written; the
        step advances here."""
        raise NotImplementedError

    def _next_unit(self) -> Any:
        """The next unit of work (default: the one step at ``self.step``)."""
        return Step(self.step)

    def _begin(self, bank: Bank, unit: Any) -> None:
        """What a unit needs in the bank before it acts (default: nothing; a memory system's items that the unit
        retrieves, e.g. CFGM's focus point of a new environment)."""

    def _done(self) -> int:
        """Units done so far (the progress bar's position; default: the step)."""
        return self.step

    def _checkpoint_due(self, unit: Any) -> bool:
        """A checkpoint after ``unit`` (default: at the end, and after a unit whose steps crossed a multiple of
        ``checkpoint_every``)."""
        return self._done() == self._total() or crossed(unit.start_step, self.step, self.config.checkpoint_every)

    def _reset(self) -> None:
        """The kind's own state at the start of :meth:`run` (before a resume restores it)."""

    def _resumed(self, ckpt: Path, state: dict[str, Any]) -> None:
        """Resume: the kind's own state from the checkpoint (its logs are already restored)."""

    def _checkpoint_state(self) -> dict[str, Any]:
        """The kind's own entries of ``state.json``."""
        return {}

    def _logs(self) -> list[Path]:
        """The run's logs a checkpoint copies (open for appending while the run drives)."""
        return [self.out_dir / name for name in self.SPEC.logs]

    def _recent(self) -> deque[float]:
        """The last ``window`` outcomes, as the progress bar's moving rate starts (default: none yet)."""
        return deque(maxlen=self.config.window)

    def _desc(self) -> str:
        return f"online {self.config.policy_kind}"

    def _summary(self, bank: Bank) -> dict[str, Any]:
        """The kind's entries of the summary, after the common ones (default: none)."""
        return {}

    def _log_summary(self, summary: dict[str, Any]) -> None:
        logger.info("%s: %d steps, success %.3f, bank %d -> %d", self._desc(), summary["steps"],
                    summary["success_rate"], summary["bank_size_start"], summary["bank_size_end"])

    # ------------------------------------------------------------------ setup

    def _total(self) -> int:
        return int(getattr(self.config, self.SPEC.length))

    def _encode(self, texts: list[str]) -> np.ndarray:
        return encode_checked(self.encoder, self.dim, texts)

    def _make_bank(self) -> Bank:
        """A fresh ``out_dir/bank``: a copy of ``bank_dir``, or empty."""
        from memento.config import EncoderConfig

        encoder_config = getattr(self.encoder, "config", None)
        return run_bank(self.run_dir.bank, self.dim, bank_dir=self.bank_dir, index=self.config.index,
                        encoder_config=encoder_config if isinstance(encoder_config, EncoderConfig) else None,
                        device=self.device)

    def _build_policy(self, seeds: list[np.random.SeedSequence], bank: Bank, **context: Any) -> Policy:
        ctx = PolicyContext(dim=self.dim, k_max=self.config.k, device=self.device, qnet_seed=torch_seed(seeds[2]),
                            learner_seed=torch_seed(seeds[3]), reward_of=bank.rewards,
                            featurizer=CaseFeaturizer(bank, self._encode), evidence_of=bank.evidence_at, **context)
        return self.make_policy(self.config.policy, ctx)

    def _run_info(self) -> dict[str, Any]:
        """``run.json``: what the run used besides its config."""
        describe = getattr(self.encoder, "describe", None)
        return {"policy": self.config.policy_kind, "device": str(self.device),
                "encoder": describe() if callable(describe) else repr(self.encoder), "planner": repr(self.planner),
                self.SPEC.stream.fingerprint_key: self.fingerprint,
                "seed_bank": None if self.bank_dir is None else str(self.bank_dir),
                "torch": torch.__version__, "numpy": np.__version__}

    # ------------------------------------------------------------------ checkpoints

    def _timed_checkpoint(self, bank: Bank) -> None:
        t0 = time.perf_counter()
        self._checkpoint(bank)
        self.ms_totals["checkpoint"] += (time.perf_counter() - t0) * 1000.0
        self._checkpointed_at_end = self._done() == self._total()

    def _checkpoint(self, bank: Bank) -> None:
        """Write a complete checkpoint into checkpoint.tmp, then swap it in for checkpoint."""
        cfg, spec = self.config, self.SPEC
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
                 spec.stream.fingerprint_key: self.fingerprint, spec.stream.size_key: self.stream_size,
                 **self._checkpoint_state(), "time": time.time()}
        write_json(tmp / RunDir.STATE, state)  # last: its presence marks the checkpoint complete
        final = self.run_dir.commit_checkpoint(tmp)
        logger.info("checkpoint at step %d, %s %d (%d cases in the bank) in %s", self.step, spec.unit, self._done(),
                    len(bank), final)

    def _check_checkpoint(self, ckpt: Path, state: dict[str, Any]) -> None:
        """A checkpoint of this kind of run, config (but for the resumable fields), stream and length."""
        spec = self.SPEC
        kind = state.get("kind")
        if kind != spec.checkpoint_kind:
            other = CHECKPOINT_KINDS.get(kind, repr(kind))
            raise CheckpointError(f"{ckpt}: a {other} run's checkpoint, not a {spec.name} run's")
        check_saved_config(ckpt, spec.config, self.config, spec.resumable)
        stream, key, n = spec.stream.noun, spec.stream.fingerprint_key, spec.stream.size_key
        if state[key] != self.fingerprint:
            raise CheckpointError(f"{ckpt}: saved for {spec.stream.changed} ({state[n]} {stream}, fingerprint "
                                  f"{state[key][:12]}); now {self.stream_size} {stream}, fingerprint "
                                  f"{self.fingerprint[:12]}")
        position = int(state[spec.unit])
        if position > self._total():
            raise CheckpointError(f"{ckpt}: the checkpoint is at {spec.unit} {position}, beyond "
                                  f"{spec.length}={self._total()}")

    def _restore(self, ckpt: Path, bank: Bank) -> None:
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
        logger.info("resumed %s at step %d, %s %d of %d (%d cases in the bank)", self._desc(), self.step,
                    self.SPEC.unit,
                    self._done(), self._total(), len(bank))

    # ------------------------------------------------------------------ the run

    def run(self) -> dict[str, Any]:
        """Run (or finish) the stream; returns the summary (also written to ``out_dir/summary.json``)."""
        cfg, spec = self.config, self.SPEC
        started = time.perf_counter()
        self.stream_size, self.fingerprint = self._stream()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        ckpt = self.run_dir.start(self.resume)
        seeds = np.random.SeedSequence(cfg.seed).spawn(SEED_STREAMS)
        self.order = TaskOrder(self.stream_size, self._total(), seeds[0], shuffle=cfg.shuffle)
        self.rngs = {name: np.random.Generator(np.random.PCG64(seeds[i])) for name, i in spec.rngs}
        self.policy_rng = self.rngs["policy_rng"]
        self.step = 0
        self.counters: dict[str, Any] = dict.fromkeys(spec.all_counters, 0)
        self.ms_totals: dict[str, float] = dict.fromkeys(spec.all_components, 0.0)
        self._checkpointed_at_end = False
        self._reset()
        bank = self._make_bank() if ckpt is None else CaseBank.open(self.run_dir.bank, dim=self.dim,
                                                                   use_gpu=use_gpu_for(self.device))
        try:
            self.systems = MemorySystems(cfg.systems, planner=self.planner, encode=self._encode,
                                         cache_path=self.out_dir / "memory_calls.jsonl", trajectory=spec.trajectory)
            self.policy = self._build_policy(seeds, bank)
            if ckpt is None:
                self.bank_size_start = len(bank)
                write_json(self.run_dir.config_path, to_dict(cfg))
                for name in spec.logs:
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

    def _loop(self, bank: Bank, started: float) -> dict[str, Any]:
        from tqdm.auto import tqdm

        self.writer = self._tensorboard()
        self.recent = self._recent()
        self.bar = tqdm(total=self._total(), initial=self._done(), desc=self._desc(), unit=self.SPEC.bar_unit,
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
        summary = {**self._common_summary(bank, time.perf_counter() - started, self.resumed_from, has_model),
                   **self._summary(bank)}
        write_json(self.run_dir.summary_path, summary)
        self._log_summary(summary)
        return summary

    def _drive(self, bank: Bank) -> None:
        """Act and commit one unit after the other, with a checkpoint when one is due."""
        while self._done() < self._total():
            unit = self._next_unit()
            before = self._done()
            self._begin(bank, unit)
            self._commit(bank, self._act(bank, unit))
            self._advanced(bank, self._done() - before)
            if self._checkpoint_due(unit):
                self._timed_checkpoint(bank)
        if self.SPEC.final_checkpoint and self._done() == self._total() and not self._checkpointed_at_end:
            self._timed_checkpoint(bank)

    def _advanced(self, bank: Bank, units: int) -> None:
        if units:  # a unit that finished none (a game's command before the episode's last) leaves the bar as it is
            self.bar.update(units)
            rate = {self.SPEC.rate: f"{np.mean(self.recent):.2f}"} if self.recent else {}  # none yet: no rate
            self.bar.set_postfix(**rate, bank=len(bank))

    # ------------------------------------------------------------------ summary

    def _ms_per_step(self, steps: int) -> dict[str, float]:
        ms = {name: self.ms_totals[name] / max(1, steps) for name in self.SPEC.all_components}
        ms["total"] = sum(ms.values())
        return ms

    def _common_summary(self, bank: Bank, wall_s: float, resumed_from: int | None,
                        has_model: bool) -> dict[str, Any]:
        """The summary entries every run kind reports."""
        cfg = self.config
        return {"policy": cfg.policy_kind, "window": cfg.window, "memory_tokens": int(self.counters["memory_tokens"]),
                "bank_size_start": int(self.bank_size_start), "bank_size_end": len(bank),
                "retained": int(self.counters["retained"]), "duplicates": int(self.counters["duplicates"]),
                "updates": int(self.policy.version), "final_alpha": self.policy.alpha, "seed": cfg.seed, "k": cfg.k,
                "candidates": cfg.candidates, "resumed_from": resumed_from, "wall_s": wall_s,
                "selector": RunDir.SELECTOR if has_model else None, **self.systems.summary()}
