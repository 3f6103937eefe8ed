"""The online continual-learning loop: Memento's Algorithm 1 on real tasks, a real bank and a frozen planner.

One **step** is one task (one LLM call)::

    task -> encoder.encode(task.question)                 state_D (the encoder's cache makes repeats free)
         -> bank.candidates(state_D, C)                   top-C cases by cosine, with their vectors
         -> policy.select(state_D, candidates, K, rng)    Selection (ids, per-case and set propensities)
         -> planner.plan(task, bank.get(selection.ids))   frozen LLM output text
         -> judge(task, output.text)                      reward (+ reason)
         -> bank.add(Case(task.question, output, reward)) Retain: M_{t+1} = M_t ∪ {(s_t, a_t, r_t)}
         -> replay.add(Transition(...))                   (soft_q) state, chosen case vectors, propensities
         -> learner.update(replay.sample(...))            (soft_q, after warm-up; the target update is inside)
         -> TensorBoard scalars, steps.jsonl record, checkpoint every N steps

``linucb`` updates its ridge regression with the set's reward instead of the learner (its
``update_selection``); ``random`` and ``similarity`` do not learn (similarity sees the growing bank,
and with ``positive_only=True`` only its successful cases: Memento's non-parametric client).

**Batches** (``LoopConfig.batch_size = B``, default 1). B consecutive tasks of the stream make one
policy update round: all B are encoded, get candidates and are selected with the *same* policy
parameters (in stream order, drawing from one RNG), are planned with one ``planner.plan_many`` call
(B = 1 calls ``planner.plan``), judged, and then all B are retained (one ``bank.add``: a task sees
none of the cases retained in its own batch), added to the replay buffer, and learned from:
``B * updates_per_step`` gradient steps once ``warmup`` decisions are logged (so the number of
updates per task does not depend on B). A step is still one task: ``steps``, ``checkpoint_every``,
``window`` and every per-step record count tasks; checkpoints fall on batch boundaries.

**The task stream.** ``steps`` tasks drawn from ``tasks``: with ``shuffle=True`` one fresh permutation
of all tasks per pass (epoch), else the file order, cycled. The order depends only on the seed and
the number of tasks, so every policy of a comparison sees the same stream and a resumed run the
same continuation.

**Randomness.** ``numpy.random.SeedSequence(seed)`` spawns the streams: task order, the policy's
draws (a ``numpy.random.Generator``), the Q-network initialisation and the learner's generator
(dropout masks and replay mini-batches). Seeded runs are reproducible on one device.

**Run directory** (``out_dir``)::

    config.json      the LoopConfig (memento.config.load_json(LoopConfig, ...) reads it back)
    run.json         what else the run used: encoder, planner, judge, task count and fingerprint, device
    bank/            the case bank (SQLite commits every step)
    steps.jsonl      one record per step: the transition log of DESIGN §6 (see below)
    tb/              TensorBoard event files
    checkpoint/      the last complete checkpoint (see below)
    summary.json     written at the end
    selector/        (soft_q) the trained Q-network, via SoftQLearner.save

A ``steps.jsonl`` record holds ``step``, ``task_id``, ``family``, ``state`` (the question),
``candidate_ids``, ``chosen_ids``, ``propensities`` (each chosen case's first-draw probability),
``set_propensity`` (Plackett-Luce probability of the ordered set; 1.0 for a deterministic choice),
``greedy``, ``output``, ``reward``, ``success``, ``reason``, ``done`` (always true: single-step),
``retained_id``, ``duplicate``, ``policy``, ``policy_version`` (learner updates / LinUCB updates made
before the choice), ``bank_size`` (the bank the choice was made from), ``entropy`` (of the policy over
the candidates), ``alpha`` (soft_q), ``time`` (Unix seconds) and ``ms`` per component.

**Checkpoints** are written into ``out_dir/checkpoint.tmp`` and then renamed over
``out_dir/checkpoint`` (the previous one is moved to ``checkpoint.old`` for the instant of the swap;
``state.json`` is written last, so a directory with it is complete and resume takes the newest complete
one). A checkpoint holds ``state.json`` (step, counters, millisecond totals, the bank's length and uid,
the policy RNG's ``bit_generator.state``, the task-stream fingerprint), ``config.json``, ``steps.jsonl``
(a copy of the log so far), and per policy ``learner/`` + ``replay/`` (soft_q) or ``linucb.safetensors`` +
``linucb.json`` (the LinUCB observations, replayed in order on resume). The bank stays in
``out_dir/bank``; ``bank.flush()`` precedes the checkpoint and ``resume`` rolls it back with
``bank.truncate(saved_len)``. A resumed run ends in the same state as an uninterrupted run with the
same seed (bank contents, Q-network weights, per-step rewards), exactly on the CPU, provided the
planner and the judge are deterministic. A finished run can be extended (resume with a larger
``steps``); it continues the same task stream, and equals a longer run outright when the old
``steps`` was a multiple of ``batch_size`` (otherwise its last round was shorter).

**Threads.** The library never calls ``torch.set_num_threads`` (global state); the ``memento online``
command has ``--torch-threads`` for that.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import numbers
import os
import shutil
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch

from memento.config import (
    LearnerConfig,
    QNetArch,
    QNetConfig,
    ReplayConfig,
    check,
    check_choice,
    check_float,
    check_int,
    from_dict,
    to_dict,
)
from memento.errors import CheckpointError, ConfigError, DataFormatError, DimensionError
from memento.io import atomic_write, atomic_write_text, fsync_dir
from memento.memory import Candidates, CaseBank
from memento.plots import moving_average
from memento.types import Case, Task

if TYPE_CHECKING:
    from memento.learner import SoftQLearner
    from memento.planners.base import Planner, PlanOutput
    from memento.replay import ReplayBuffer

__all__ = [
    "COMPONENTS",
    "LoopConfig",
    "LoopPolicyKind",
    "OnlineLoop",
    "PlannerSpec",
    "build_planner",
    "comparison_table",
    "parse_planner_spec",
    "run_comparison",
    "run_online",
    "task_order",
    "tasks_fingerprint",
]

logger = logging.getLogger(__name__)

LoopPolicyKind = Literal["random", "similarity", "soft_q", "linucb"]
"""The policies the loop runs (the names of ``policies.PolicyKind``)."""

COMPONENTS = ("encode", "candidates", "select", "plan", "judge", "retain", "learn", "log", "checkpoint")
"""Where a step's time goes; ``summary.json`` reports the mean milliseconds per step of each."""

CHECKPOINT_FORMAT = "memento-online-checkpoint"
CHECKPOINT_FORMAT_VERSION = 1
RESUMABLE_CHANGES = ("steps", "checkpoint_every", "tensorboard")
"""LoopConfig fields a resumed run may change; any other difference is refused."""


def _default_learner() -> LearnerConfig:
    return LearnerConfig(gamma=0.0, lr=3e-3, weight_decay=0.0, batch_size=64, alpha=0.2)


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoopConfig:
    """One online run (see the module docstring for the step and batch semantics).

    Experiment:

    - ``steps``: tasks (= LLM calls) to run; ``k``: cases shown per task; ``candidates``: C, the size
      of the cosine pre-selection the policy chooses from (``k <= C``);
    - ``policy``: ``"soft_q"``, ``"similarity"``, ``"random"`` or ``"linucb"``;
    - ``batch_size``: B tasks selected with the same policy parameters and planned together with
      ``plan_many``, then all retained and learned from (default 1: Algorithm 1 as written);
    - ``seed``: every random stream of the run; ``shuffle``: the task stream is a fresh permutation per
      pass (else file order, cycled);
    - ``retain``: add each (question, output, reward) to the bank (Algorithm 1's Retain; duplicates of a
      stored (state, action) are skipped); ``index``: the faiss factory of a bank made from seed cases;
    - ``success_threshold``: a step succeeds when its reward is >= this (the moving success rate);
      ``window``: steps per moving-average window and per ``success_by_window`` entry;
    - ``checkpoint_every``: steps between checkpoints (0: only at the end); ``tensorboard``: write
      event files under ``out_dir/tb``.

    Soft-Q: the Q-network ``qnet_arch``, ``hidden``, ``n_layers``, ``dropout``, ``embed_dim``
    (:class:`~memento.config.QNetConfig`; ``dim`` comes from the encoder); ``learner``
    (:class:`~memento.config.LearnerConfig`; ``gamma`` must be 0: the loop is single-step, and
    ``learner.batch_size`` is the replay mini-batch, not ``batch_size``); ``alpha``: when given, the
    temperature of ``softmax(Q / alpha)``, overriding ``learner.alpha`` (the stored ``learner`` then
    carries it); ``replay_capacity``: decisions the buffer keeps; ``warmup``: decisions logged before the
    first update; ``updates_per_step``: gradient steps per task after warm-up; ``init_qnet``: a trained
    selector directory (what ``SoftQLearner.save`` writes, e.g. ``memento train``'s ``OUT/selector``, or
    that run directory itself) whose Q-network, architecture included, the run starts from instead of a
    fresh one (the optimiser starts fresh with ``learner``; the ``qnet_*`` fields are then unused);
    ``soft_q_positive_only``: soft-Q chooses among the candidates with stored reward > 0 only (all of them
    when none is), the pool Memento's non-parametric retrieval uses: the Q-network then learns which
    successful cases help, instead of also having to tell successes from failures it sees only through
    the embedding of their questions.

    Similarity: ``positive_only`` (default True) keeps only successful cases (reward > 0), like
    Memento's non-parametric client; it falls back to all candidates when none is positive.

    LinUCB: ``linucb_exploration``, ``linucb_ridge`` (shared model, ``product_concat`` features).
    """

    steps: int = 500
    k: int = 4
    candidates: int = 32
    policy: LoopPolicyKind = "soft_q"
    batch_size: int = 1
    seed: int = 0
    shuffle: bool = True
    retain: bool = True
    index: str = "Flat"
    success_threshold: float = 0.5
    window: int = 50
    checkpoint_every: int = 100
    tensorboard: bool = True
    # soft-Q
    qnet_arch: QNetArch = "mlp"
    hidden: int = 128
    n_layers: int = 1
    dropout: float = 0.0
    embed_dim: int = 64
    learner: LearnerConfig = dataclasses.field(default_factory=_default_learner)
    alpha: float | None = None
    replay_capacity: int = 10_000
    warmup: int = 16
    updates_per_step: int = 1
    init_qnet: str | None = None
    soft_q_positive_only: bool = False
    # similarity
    positive_only: bool = True
    # LinUCB
    linucb_exploration: float = 1.0
    linucb_ridge: float = 1.0

    def __post_init__(self) -> None:
        cls = type(self)
        check_int(self, "steps", 1)
        check_int(self, "k", 1)
        check_int(self, "candidates", 1)
        check(self.k <= self.candidates, cls, "k", self.k, f"must be <= candidates={self.candidates}")
        check_choice(self, "policy", LoopPolicyKind)
        check_int(self, "batch_size", 1)
        check_int(self, "seed", 0)
        for field in ("shuffle", "retain", "tensorboard", "positive_only", "soft_q_positive_only"):
            check(isinstance(getattr(self, field), bool), cls, field, getattr(self, field), "must be true or false")
        check(isinstance(self.index, str) and bool(self.index.strip()), cls, "index", self.index,
               "must be a non-empty faiss factory string")
        check_float(self, "success_threshold")
        check_int(self, "window", 1)
        check_int(self, "checkpoint_every", 0)
        check_choice(self, "qnet_arch", QNetArch)
        check_int(self, "hidden", 1)
        check_int(self, "n_layers", 1)
        check_float(self, "dropout", low=0.0, high=1.0, high_open=True)
        check_int(self, "embed_dim", 1)
        check(isinstance(self.learner, LearnerConfig), cls, "learner", self.learner, "must be a LearnerConfig")
        check(self.learner.gamma == 0.0, cls, "learner", f"gamma={self.learner.gamma}",
               "the online loop is single-step: learner.gamma must be 0")
        if self.alpha is not None:
            check_float(self, "alpha", low=0.0, low_open=True)
            if self.learner.alpha != self.alpha:
                object.__setattr__(self, "learner", dataclasses.replace(self.learner, alpha=self.alpha))
        check_int(self, "replay_capacity", 1)
        check_int(self, "warmup", 0)
        check_int(self, "updates_per_step", 0)
        check(self.init_qnet is None or (isinstance(self.init_qnet, str) and bool(self.init_qnet.strip())), cls,
               "init_qnet", self.init_qnet, "must be a selector directory path or null")
        check_float(self, "linucb_exploration", low=0.0)
        check_float(self, "linucb_ridge", low=0.0, low_open=True)

    def qnet_config(self, dim: int, seed: int = 0) -> QNetConfig:
        """The soft-Q Q-network over ``dim``-dimensional vectors."""
        return QNetConfig(arch=self.qnet_arch, dim=dim, hidden=self.hidden, n_layers=self.n_layers,
                          dropout=self.dropout, embed_dim=self.embed_dim, seed=seed)


# ---------------------------------------------------------------- planner specs (CLI)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlannerSpec:
    """A parsed ``--planner`` value: ``gemma``, ``hf:PATH`` or ``openai:MODEL@URL``."""

    kind: Literal["gemma", "hf", "openai"]
    path: str | None = None
    model: str | None = None
    base_url: str | None = None

    def __str__(self) -> str:
        match self.kind:
            case "gemma":
                return "gemma"
            case "hf":
                return f"hf:{self.path}"
            case _:
                return f"openai:{self.model}@{self.base_url}"


_SPEC_HELP = "expected gemma, hf:PATH or openai:MODEL@URL"


def parse_planner_spec(spec: str) -> PlannerSpec:
    """Parse ``gemma`` | ``hf:PATH`` | ``openai:MODEL@URL``; a bad spec raises ``ConfigError`` (one line)."""
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"planner spec {spec!r}: empty; {_SPEC_HELP}")
    spec = spec.strip()
    if spec == "gemma":
        return PlannerSpec(kind="gemma")
    kind, sep, rest = spec.partition(":")
    if not sep:
        raise ConfigError(f"planner spec {spec!r}: unknown planner; {_SPEC_HELP}")
    if kind == "hf":
        if not rest.strip():
            raise ConfigError(f"planner spec {spec!r}: hf: needs a model directory (hf:PATH)")
        return PlannerSpec(kind="hf", path=rest)
    if kind == "openai":
        model, at, url = rest.rpartition("@")
        if not at or not model.strip() or not url.strip():
            raise ConfigError(f"planner spec {spec!r}: openai: needs a model and a server URL (openai:MODEL@URL)")
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"planner spec {spec!r}: the server URL {url!r} must start with http:// or https://")
        return PlannerSpec(kind="openai", model=model, base_url=url)
    raise ConfigError(f"planner spec {spec!r}: unknown planner {kind!r}; {_SPEC_HELP}")


def check_planner_spec(spec: PlannerSpec) -> None:
    """Cheap checks before anything is loaded: an ``hf:`` model directory must exist."""
    from memento.planners.base import PlannerError

    if spec.kind == "hf":
        path = Path(str(spec.path)).expanduser()
        if not path.is_dir():
            raise PlannerError(f"hf:{spec.path}: model directory not found (models are never downloaded; "
                               "pass a local transformers causal-LM directory)")


def build_planner(spec: PlannerSpec, **kwargs: Any) -> Planner:
    """The planner a spec names (its module is imported only here); ``kwargs`` go to its constructor."""
    check_planner_spec(spec)
    match spec.kind:
        case "gemma":
            from memento.planners.hf import HFPlanner

            return HFPlanner.default(**kwargs)
        case "hf":
            from memento.planners.hf import HFPlanner

            return HFPlanner(str(Path(str(spec.path)).expanduser()), **kwargs)
        case "openai":
            from memento.planners.openai_compat import OpenAICompatPlanner

            return OpenAICompatPlanner(str(spec.model), str(spec.base_url), **kwargs)
    raise ConfigError(f"planner spec {spec}: unknown kind")  # pragma: no cover


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


def tasks_fingerprint(tasks: Sequence[Task]) -> str:
    """sha256 of the tasks' ids, questions and answers, in order (a resumed run must see the same stream)."""
    digest = hashlib.sha256()
    for task in tasks:
        digest.update(json.dumps([task.id, task.question, list(task.answers)], ensure_ascii=False).encode("utf-8"))
        digest.update(b"\n")
    return digest.hexdigest()


def load_trained_learner(path: str | Path, dim: int) -> Any:
    """The :class:`~memento.learner.SoftQLearner` of a trained selector directory (``SoftQLearner.save``), or of
    a run holding one in ``selector/`` (``memento train``), on the CPU.

    Raises :class:`~memento.errors.DimensionError` when its Q-network scores ``dim'``-dimensional vectors and
    the caller's encoder or bank gives ``dim``, and :class:`~memento.errors.CheckpointError` when ``path``
    holds no selector.
    """
    from memento.learner import SoftQLearner

    path = Path(path)
    if not (path / "learner.json").is_file() and (path / "selector" / "learner.json").is_file():
        path = path / "selector"
    if not (path / "learner.json").is_file():
        raise CheckpointError(f"{path}: not a trained selector directory (no learner.json; expected what "
                              "SoftQLearner.save or `memento train` writes)")
    learner = SoftQLearner.load(path, device="cpu")
    if learner.qnet.config.dim != dim:
        raise DimensionError(f"{path}: the Q-network takes dim={learner.qnet.config.dim}, the encoder gives "
                             f"dim={dim}")
    logger.info("trained Q-network from %s (arch=%s)", path, learner.qnet.config.arch)
    return learner


def _torch_seed(seq: np.random.SeedSequence) -> int:
    return int(seq.generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))


def _entropy(p_C: np.ndarray) -> float:
    p = np.asarray(p_C, dtype=np.float64)
    p = p[p > 0]
    return float(-(p * np.log(p)).sum()) if p.size else 0.0


def _write_json(path: Path, payload: Any) -> None:
    atomic_write_text(path, json.dumps(payload, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{path}: unreadable ({error})") from None


def _judge_reward(result: Any, judge: Any) -> tuple[float, str]:
    reward = getattr(result, "reward", None)
    if isinstance(reward, (bool, np.bool_)) or not isinstance(reward, numbers.Real) or not math.isfinite(reward):
        raise DataFormatError(f"judge {judge!r} returned reward {reward!r}; expected a finite number "
                              "(an object with .reward and .reason)")
    reason = getattr(result, "reason", "")
    return float(reward), reason if isinstance(reason, str) else str(reason)


def success_by_window(success_T: Sequence[float] | np.ndarray, window: int) -> list[dict[str, Any]]:
    """``[{"start", "end", "rate"}]`` over consecutive windows of ``window`` steps (the last may be shorter)."""
    x = np.asarray(success_T, dtype=np.float64)
    return [{"start": start, "end": min(start + window, x.size), "rate": float(x[start:start + window].mean())}
            for start in range(0, x.size, window)]


class _LinUCBLog:
    """The observations a LinUCB policy was updated with, so a resumed run can replay them in order."""

    def __init__(self, dim: int):
        self.dim = dim
        self.states: list[np.ndarray] = []
        self.cases: list[np.ndarray] = []
        self.rewards: list[float] = []
        self.ids: list[str] = []

    def append(self, state_D: np.ndarray, case_D: np.ndarray, reward: float, case_id: str) -> None:
        self.states.append(np.asarray(state_D, dtype=np.float32))
        self.cases.append(np.asarray(case_D, dtype=np.float32))
        self.rewards.append(float(reward))
        self.ids.append(case_id)

    def save(self, directory: Path) -> None:
        from safetensors.numpy import save_file

        n = len(self.ids)
        arrays = {"state_ND": np.stack(self.states) if n else np.zeros((0, self.dim), np.float32),
                  "case_ND": np.stack(self.cases) if n else np.zeros((0, self.dim), np.float32),
                  "reward_N": np.asarray(self.rewards, dtype=np.float64)}
        atomic_write(directory / "linucb.safetensors", lambda tmp: save_file(arrays, str(tmp)))
        _write_json(directory / "linucb.json", {"n": n, "ids": self.ids})

    def load(self, directory: Path) -> None:
        from safetensors.numpy import load_file

        meta = _read_json(directory / "linucb.json")
        try:
            arrays = load_file(str(directory / "linucb.safetensors"))
        except Exception as error:  # safetensors raises its own error types
            raise CheckpointError(f"{directory / 'linucb.safetensors'}: unreadable ({error})") from None
        n = int(meta["n"])
        if arrays["state_ND"].shape != (n, self.dim) or len(meta["ids"]) != n:
            raise CheckpointError(f"{directory}: LinUCB log holds {arrays['state_ND'].shape} states for {n} ids")
        self.states = list(arrays["state_ND"])
        self.cases = list(arrays["case_ND"])
        self.rewards = [float(r) for r in arrays["reward_N"]]
        self.ids = list(meta["ids"])


# ---------------------------------------------------------------- the loop


class OnlineLoop:
    """Memento's Algorithm 1 over a task stream (see the module docstring).

    - ``encoder``: ``encode(texts) -> [N, D]`` unit vectors and ``dim`` (a :class:`memento.Encoder`);
    - ``planner``: a :class:`memento.planners.Planner` (``plan`` / ``plan_many``);
    - ``judge``: ``judge(task, output_text) -> object with .reward (float) and .reason (str)``;
    - ``tasks``: the task list the stream draws from;
    - ``out_dir``: the run directory;
    - the starting bank: ``bank_dir`` (an existing bank, copied into ``out_dir/bank``; the original is
      not changed), or ``seed_cases`` (encoded and added to a new bank), or neither (an empty bank);
    - ``device``: where the Q-network, learner and replay buffer live (soft_q);
    - ``resume``: continue from ``out_dir``'s checkpoint (a run without one starts afresh, clearing the
      run files); without it, an ``out_dir`` that already holds a run is refused.
    """

    def __init__(self, config: LoopConfig, *, encoder: Any, planner: Planner,
                 judge: Callable[[Task, str], Any], tasks: Sequence[Task], out_dir: str | Path,
                 bank_dir: str | Path | None = None, seed_cases: Sequence[Case] | None = None,
                 device: str | torch.device = "cpu", resume: bool = False, progress: bool = False):
        if not isinstance(config, LoopConfig):
            raise ConfigError(f"OnlineLoop: config={type(config).__name__}: must be a LoopConfig")
        tasks = list(tasks)
        if not tasks:
            raise DataFormatError("OnlineLoop: the task list is empty")
        for i, task in enumerate(tasks):
            if not isinstance(task, Task):
                raise DataFormatError(f"OnlineLoop: task {i} is {type(task).__name__}, expected memento.Task")
        if bank_dir is not None and seed_cases is not None:
            raise ConfigError("OnlineLoop: give bank_dir or seed_cases, not both")
        if not callable(judge):
            raise ConfigError(f"OnlineLoop: judge={judge!r} is not callable (task, output) -> result")
        for method in ("plan", "plan_many"):
            if not callable(getattr(planner, method, None)):
                raise ConfigError(f"OnlineLoop: planner {planner!r} has no {method}() (see memento.planners.Planner)")
        dim = getattr(encoder, "dim", None)
        if not callable(getattr(encoder, "encode", None)) or not isinstance(dim, int):
            raise ConfigError(f"OnlineLoop: encoder {encoder!r} needs encode(texts) and an integer dim")
        self.config = config
        self.encoder = encoder
        self.planner = planner
        self.judge = judge
        self.tasks = tasks
        self.out_dir = Path(out_dir)
        self.bank_dir = None if bank_dir is None else Path(bank_dir)
        self.seed_cases = None if seed_cases is None else list(seed_cases)
        self.device = torch.device(device)
        self.resume = resume
        self.progress = progress
        self.dim = dim

    # ------------------------------------------------------------------ paths

    @property
    def bank_path(self) -> Path:
        return self.out_dir / "bank"

    @property
    def checkpoint_path(self) -> Path:
        return self.out_dir / "checkpoint"

    @property
    def steps_path(self) -> Path:
        return self.out_dir / "steps.jsonl"

    def _run_files(self) -> list[Path]:
        names = ("bank", "steps.jsonl", "tb", "checkpoint", "checkpoint.tmp", "checkpoint.old", "summary.json",
                 "selector", "config.json", "run.json")
        return [self.out_dir / name for name in names if (self.out_dir / name).exists()]

    # ------------------------------------------------------------------ setup

    def _encode(self, texts: list[str]) -> np.ndarray:
        out = np.asarray(self.encoder.encode(texts), dtype=np.float32)
        out_ND = out.reshape(len(texts), -1)
        if out_ND.shape[1] != self.dim:
            raise DimensionError(f"encoder returned vectors of shape {out.shape} for {len(texts)} text(s); "
                                 f"expected dim={self.dim}")
        norms_N1 = np.linalg.norm(out_ND, axis=1, keepdims=True)
        if not np.isfinite(out_ND).all() or (norms_N1 == 0).any():
            raise DataFormatError("encoder returned NaN, inf or zero vectors")
        if (np.abs(norms_N1 - 1.0) > 1e-4).any():
            out_ND = out_ND / norms_N1
        return np.ascontiguousarray(out_ND, dtype=np.float32)

    def _encoder_config(self) -> Any:
        from memento.config import EncoderConfig

        config = getattr(self.encoder, "config", None)
        return config if isinstance(config, EncoderConfig) else None

    def _make_bank(self) -> CaseBank:
        """A fresh ``out_dir/bank``: a copy of ``bank_dir``, the encoded seed cases, or empty."""
        if self.bank_dir is not None:
            with CaseBank.open(self.bank_dir) as seed:
                if seed.dim != self.dim:
                    raise DimensionError(f"{self.bank_dir}: the seed bank holds dim={seed.dim} vectors, the encoder "
                                         f"gives dim={self.dim}")
                bank = CaseBank.create(self.bank_path, self.dim, index=seed.config.index,
                                       encoder=seed.config.encoder or self._encoder_config(), use_gpu=False)
                try:
                    cases = list(seed.iter_cases())
                    if cases:
                        bank.add(cases, seed.embeddings_at(np.arange(len(cases))), allow_duplicates=True)
                except BaseException:
                    bank.close()
                    raise
            return bank
        bank = CaseBank.create(self.bank_path, self.dim, index=self.config.index, encoder=self._encoder_config(),
                               use_gpu=False)
        try:
            if self.seed_cases:
                emb_ND = self._encode([case.state for case in self.seed_cases])
                bank.add(self.seed_cases, emb_ND)
        except BaseException:
            bank.close()
            raise
        return bank

    def _build_policy(self, seeds: list[np.random.SeedSequence], bank: CaseBank) -> None:
        from policies import LinUCBConfig, LinUCBPolicy, RandomPolicy, SimilarityConfig, SimilarityPolicy, SoftQPolicy
        from policies.similarity import bank_rewards

        cfg = self.config
        self.learner: SoftQLearner | None = None
        self.buffer: ReplayBuffer | None = None
        self.soft_q: Any = None
        self.linucb: Any = None
        self.linucb_log: _LinUCBLog | None = None
        match cfg.policy:
            case "random":
                self.policy: Any = RandomPolicy()
            case "similarity":
                self.policy = SimilarityPolicy(SimilarityConfig(positive_only=cfg.positive_only),
                                               reward_of=bank_rewards(bank))
            case "soft_q":
                from memento.learner import SoftQLearner
                from memento.qnet import build_qnet
                from memento.replay import ReplayBuffer

                qnet_seed, learner_seed = _torch_seed(seeds[2]), _torch_seed(seeds[3])
                if cfg.init_qnet is not None:
                    qnet = load_trained_learner(cfg.init_qnet, self.dim).qnet
                else:
                    qnet = build_qnet(cfg.qnet_config(self.dim, seed=qnet_seed),
                                      torch.Generator().manual_seed(qnet_seed))
                self.learner = SoftQLearner(qnet, dataclasses.replace(cfg.learner, seed=learner_seed),
                                            device=self.device,
                                            generator=torch.Generator(device=self.device).manual_seed(learner_seed))
                self.buffer = ReplayBuffer(ReplayConfig(capacity=cfg.replay_capacity, dim=self.dim, k_max=cfg.k),
                                           device=self.device)
                self.policy = self.soft_q = SoftQPolicy(self.learner.qnet, alpha=self.learner.alpha)
            case "linucb":
                self.policy = self.linucb = LinUCBPolicy(LinUCBConfig(dim=self.dim, exploration=cfg.linucb_exploration,
                                                                      ridge=cfg.linucb_ridge))
                self.linucb_log = _LinUCBLog(self.dim)
            case _:  # pragma: no cover - LoopConfig rejects other values
                raise ConfigError(f"LoopConfig.policy={cfg.policy!r}")

    # ------------------------------------------------------------------ checkpoints

    def _find_checkpoint(self) -> Path | None:
        best: tuple[int, Path] | None = None
        for name in ("checkpoint", "checkpoint.tmp", "checkpoint.old"):
            path = self.out_dir / name
            state = path / "state.json"
            if not state.is_file():
                continue
            try:
                step = int(_read_json(state)["step"])
            except (CheckpointError, KeyError, TypeError, ValueError):
                logger.warning("%s: unreadable checkpoint state; ignoring it", path)
                continue
            if best is None or step > best[0]:
                best = (step, path)
        return None if best is None else best[1]

    def _checkpoint(self, bank: CaseBank, steps_handle: Any) -> None:
        """Write a complete checkpoint into checkpoint.tmp, then swap it in for checkpoint."""
        cfg = self.config
        tmp = self.out_dir / "checkpoint.tmp"
        final, old = self.checkpoint_path, self.out_dir / "checkpoint.old"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        bank.flush()
        steps_handle.flush()
        os.fsync(steps_handle.fileno())
        atomic_write(tmp / "steps.jsonl", lambda dst: shutil.copyfile(self.steps_path, dst))
        if self.learner is not None and self.buffer is not None:
            self.learner.save(tmp / "learner")
            self.buffer.save(tmp / "replay")
        if self.linucb_log is not None:
            self.linucb_log.save(tmp)
        _write_json(tmp / "config.json", to_dict(cfg))
        state = {"format": CHECKPOINT_FORMAT, "format_version": CHECKPOINT_FORMAT_VERSION, "step": self.step,
                 "policy": cfg.policy, "bank_size": len(bank), "bank_uid": bank.uid,
                 "bank_size_start": self.bank_size_start, "counters": dict(self.counters),
                 "ms_totals": dict(self.ms_totals), "policy_rng": self.policy_rng.bit_generator.state,
                 "tasks_fingerprint": self.fingerprint, "n_tasks": len(self.tasks), "time": time.time()}
        _write_json(tmp / "state.json", state)  # last: its presence marks the checkpoint complete
        fsync_dir(tmp)
        if old.exists():
            shutil.rmtree(old)
        if final.exists():
            os.replace(final, old)
        os.replace(tmp, final)
        fsync_dir(self.out_dir)
        shutil.rmtree(old, ignore_errors=True)
        logger.info("checkpoint at step %d (%d cases in the bank) in %s", self.step, len(bank), final)

    def _restore(self, ckpt: Path, bank: CaseBank) -> None:
        cfg = self.config
        state = _read_json(ckpt / "state.json")
        if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
            raise CheckpointError(f"{ckpt}: not an online-loop checkpoint")
        if int(state.get("format_version", 0)) > CHECKPOINT_FORMAT_VERSION:
            raise CheckpointError(f"{ckpt}: checkpoint format {state['format_version']} is newer than this memento "
                                  f"reads ({CHECKPOINT_FORMAT_VERSION})")
        saved = from_dict(LoopConfig, _read_json(ckpt / "config.json"))
        ours, theirs = to_dict(cfg), to_dict(saved)
        changed = sorted(f for f in ours if ours[f] != theirs[f] and f not in RESUMABLE_CHANGES)
        if changed:
            raise CheckpointError(f"{ckpt}: saved with another configuration; differing field(s): "
                                  + ", ".join(f"{f}={theirs[f]!r} (now {ours[f]!r})" for f in changed))
        if state["tasks_fingerprint"] != self.fingerprint:
            raise CheckpointError(f"{ckpt}: saved for another task list ({state['n_tasks']} tasks, fingerprint "
                                  f"{state['tasks_fingerprint'][:12]}); now {len(self.tasks)} tasks, "
                                  f"fingerprint {self.fingerprint[:12]}")
        step = int(state["step"])
        if step > cfg.steps:
            raise CheckpointError(f"{ckpt}: the checkpoint is at step {step}, beyond steps={cfg.steps}")
        if state["bank_uid"] != bank.uid:
            raise CheckpointError(f"{ckpt}: saved for bank uid {state['bank_uid']}, {bank.path} has uid {bank.uid}")
        saved_len = int(state["bank_size"])
        if len(bank) < saved_len:
            raise CheckpointError(f"{ckpt}: saved with {saved_len} cases in the bank, {bank.path} holds {len(bank)}")
        removed = bank.truncate(saved_len)
        if removed:
            logger.info("resume: dropped %d case(s) retained after the checkpoint", removed)
        self.step = step
        self.bank_size_start = int(state["bank_size_start"])
        self.counters.update({k: int(v) if isinstance(v, int) else v for k, v in state["counters"].items()})
        self.ms_totals.update({k: float(v) for k, v in state["ms_totals"].items()})
        self.policy_rng.bit_generator.state = state["policy_rng"]
        if self.learner is not None:
            from memento.learner import SoftQLearner
            from memento.replay import ReplayBuffer

            self.learner = SoftQLearner.load(ckpt / "learner", device=self.device)
            self.buffer = ReplayBuffer.load(ckpt / "replay", device=self.device)
            self.soft_q.qnet = self.learner.qnet
            self.soft_q.alpha = self.learner.alpha
        if self.linucb_log is not None:
            self.linucb_log.load(ckpt)
            for s, c, r, case_id in zip(self.linucb_log.states, self.linucb_log.cases, self.linucb_log.rewards,
                                        self.linucb_log.ids):
                self.linucb.update(s, c, r, case_id=case_id)
        # the per-step log: exactly the checkpoint's copy
        atomic_write(self.steps_path, lambda dst: shutil.copyfile(ckpt / "steps.jsonl", dst))
        self.rewards.clear()
        self.successes.clear()
        with self.steps_path.open(encoding="utf-8") as handle:
            for line in handle:
                record = json.loads(line)
                self.rewards.append(float(record["reward"]))
                self.successes.append(bool(record["success"]))
        if len(self.rewards) != step:
            raise CheckpointError(f"{ckpt}: steps.jsonl holds {len(self.rewards)} records for step {step}")
        if ckpt != self.checkpoint_path:  # a swap was interrupted: make it the checkpoint
            if self.checkpoint_path.exists():
                shutil.rmtree(self.checkpoint_path)
            os.replace(ckpt, self.checkpoint_path)
        for stale in ("checkpoint.tmp", "checkpoint.old"):
            shutil.rmtree(self.out_dir / stale, ignore_errors=True)
        logger.info("resumed %s at step %d of %d (%d cases in the bank)", cfg.policy, step, cfg.steps, len(bank))

    # ------------------------------------------------------------------ the run

    def run(self) -> dict[str, Any]:
        """Run (or finish) the stream; returns the summary (also written to ``out_dir/summary.json``)."""
        cfg = self.config
        started = time.perf_counter()
        self.fingerprint = tasks_fingerprint(self.tasks)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        ckpt = self._find_checkpoint() if self.resume else None
        if ckpt is None:
            existing = self._run_files()
            if existing and not self.resume:
                raise ConfigError(f"{self.out_dir}: already holds a run ({', '.join(p.name for p in existing)}); "
                                  "resume it or choose another output directory")
            for path in existing:  # resume without a checkpoint: start afresh
                shutil.rmtree(path) if path.is_dir() else path.unlink()

        seeds = np.random.SeedSequence(cfg.seed).spawn(4)
        order_T = task_order(len(self.tasks), cfg.steps, seeds[0], shuffle=cfg.shuffle)
        self.policy_rng = np.random.Generator(np.random.PCG64(seeds[1]))
        self.step = 0
        self.counters: dict[str, Any] = {"llm_calls": 0, "retained": 0, "duplicates": 0, "not_retained": 0,
                                         "prompt_tokens": 0, "output_tokens": 0}
        self.ms_totals: dict[str, float] = {c: 0.0 for c in COMPONENTS}
        self.rewards: list[float] = []
        self.successes: list[bool] = []

        if ckpt is None:
            bank = self._make_bank()
        else:
            bank = CaseBank.open(self.bank_path, dim=self.dim, use_gpu=False)
        try:
            self._build_policy(seeds, bank)
            if ckpt is None:
                self.bank_size_start = len(bank)
                _write_json(self.out_dir / "config.json", to_dict(cfg))
                self.steps_path.write_bytes(b"")
            else:
                self._restore(ckpt, bank)
            self._write_run_info()
            return self._loop(bank, order_T, started, resumed_from=None if ckpt is None else self.step)
        finally:
            bank.close()

    def _write_run_info(self) -> None:
        describe = getattr(self.encoder, "describe", None)
        info = {"policy": self.config.policy, "device": str(self.device),
                "encoder": describe() if callable(describe) else repr(self.encoder),
                "planner": repr(self.planner), "judge": repr(self.judge), "n_tasks": len(self.tasks),
                "tasks_fingerprint": self.fingerprint,
                "seed_bank": None if self.bank_dir is None else str(self.bank_dir),
                "seed_cases": None if self.seed_cases is None else len(self.seed_cases),
                "torch": torch.__version__, "numpy": np.__version__}
        _write_json(self.out_dir / "run.json", info)

    def _loop(self, bank: CaseBank, order_T: np.ndarray, started: float, resumed_from: int | None) -> dict[str, Any]:
        cfg = self.config
        writer = None
        if cfg.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            writer = SummaryWriter(str(self.out_dir / "tb"), purge_step=self.step if resumed_from is not None else None)
            if resumed_from is None:
                writer.add_text("config", "```\n" + json.dumps(to_dict(cfg), indent=2) + "\n```", 0)
        from tqdm.auto import tqdm

        recent: deque[bool] = deque(self.successes[-cfg.window:], maxlen=cfg.window)
        bar = tqdm(total=cfg.steps, initial=self.step, desc=f"online {cfg.policy}", unit="task",
                   disable=not self.progress, dynamic_ncols=True)
        try:
            with self.steps_path.open("a", encoding="utf-8") as steps_handle:
                while self.step < cfg.steps:
                    # a batch never crosses a multiple of batch_size, so a resumed run batches the same way
                    start = self.step
                    stop = min(cfg.steps, (start // cfg.batch_size + 1) * cfg.batch_size)
                    records = self._batch(bank, [self.tasks[i] for i in order_T[start:stop]], start)
                    t0 = time.perf_counter()
                    for record in records:
                        steps_handle.write(json.dumps(record, ensure_ascii=False) + "\n")
                        recent.append(record["success"])
                        if writer is not None:
                            self._log_scalars(writer, record, float(np.mean(recent)))
                    steps_handle.flush()
                    log_ms = (time.perf_counter() - t0) * 1000.0
                    self.ms_totals["log"] += log_ms
                    self.step = stop
                    bar.update(len(records))
                    bar.set_postfix(success=f"{np.mean(recent):.2f}", bank=len(bank))
                    every = cfg.checkpoint_every
                    if self.step == cfg.steps or (every and stop // every > start // every):
                        t0 = time.perf_counter()
                        self._checkpoint(bank, steps_handle)
                        self.ms_totals["checkpoint"] += (time.perf_counter() - t0) * 1000.0
        finally:
            bar.close()
            if writer is not None:
                writer.close()
        summary = self._summary(bank, time.perf_counter() - started, resumed_from)
        if self.learner is not None:
            self.learner.save(self.out_dir / "selector")
        _write_json(self.out_dir / "summary.json", summary)
        logger.info("online %s: %d steps, success %.3f, bank %d -> %d", cfg.policy, summary["steps"],
                    summary["success_rate"], summary["bank_size_start"], summary["bank_size_end"])
        return summary

    def _log_scalars(self, writer: Any, record: dict[str, Any], moving: float) -> None:
        step = record["step"]
        writer.add_scalar("reward", record["reward"], step)
        writer.add_scalar("success_rate", moving, step)
        writer.add_scalar("bank_size", record["bank_size"], step)
        writer.add_scalar("policy/entropy", record["entropy"], step)
        if record.get("alpha") is not None:
            writer.add_scalar("policy/alpha", record["alpha"], step)
        if record.get("loss") is not None:
            writer.add_scalar("learner/loss", record["loss"], step)
        for name, value in record["ms"].items():
            writer.add_scalar(f"ms/{name}", value, step)

    def _batch(self, bank: CaseBank, tasks: list[Task], first_step: int) -> list[dict[str, Any]]:
        """One policy-update round over ``tasks`` (B >= 1); returns one record per task."""
        cfg = self.config
        n = len(tasks)
        ms: dict[str, float] = {}
        clock = time.perf_counter

        t0 = clock()
        state_BD = self._encode([task.question for task in tasks])
        ms["encode"] = clock() - t0

        bank_size = len(bank)
        cands: list[Candidates] = []
        t0 = clock()
        for b in range(n):
            candidates = bank.candidates(state_BD[b], cfg.candidates)
            if self.soft_q is not None and cfg.soft_q_positive_only and len(candidates):
                candidates = candidates.positive(bank.rewards(candidates.ids))
            cands.append(candidates)
        ms["candidates"] = clock() - t0

        t0 = clock()
        version = self.learner.updates if self.learner is not None else (
            self.linucb.n_updates if self.linucb is not None else 0)
        alpha = None
        if self.soft_q is not None and self.learner is not None:
            alpha = self.soft_q.alpha = self.learner.alpha
        selections = [self.policy.select(state_BD[b], cands[b], cfg.k, rng=self.policy_rng) if len(cands[b]) else None
                      for b in range(n)]
        ms["select"] = clock() - t0

        t0 = clock()
        shown = [bank.get(list(sel.ids)) if sel is not None else [] for sel in selections]
        raw = [self.planner.plan(tasks[0], shown[0])] if n == 1 else list(self.planner.plan_many(tasks, shown))
        outputs = self._outputs(raw, n)
        self.counters["llm_calls"] += n
        ms["plan"] = clock() - t0

        t0 = clock()
        judged = [_judge_reward(self.judge(task, out.text), self.judge) for task, out in zip(tasks, outputs)]
        if self.learner is not None:
            for task, (reward, _) in zip(tasks, judged):
                if not 0.0 <= reward <= 1.0:
                    raise DataFormatError(f"judge {self.judge!r} gave reward {reward} for task {task.id!r}; the "
                                          "soft-Q learner (single-step, cross-entropy) needs rewards in [0, 1]")
        ms["judge"] = clock() - t0

        t0 = clock()
        retained_ids: list[str | None] = [None] * n
        duplicate = [False] * n
        if cfg.retain:
            new_cases, rows = [], []
            for b, (task, out, (reward, _)) in enumerate(zip(tasks, outputs, judged)):
                if not out.text.strip():
                    self.counters["not_retained"] += 1
                    continue
                new_cases.append(Case(state=task.question, action=out.text, reward=reward, env=task.env,
                                      meta={"task_id": task.id, "step": first_step + b, "policy": cfg.policy}))
                rows.append(b)
            if new_cases:
                before = len(bank)
                ids = bank.add(new_cases, state_BD[rows])
                fresh = set(bank.ids_at(range(before, len(bank))))
                for b, case_id in zip(rows, ids):
                    retained_ids[b] = case_id
                    duplicate[b] = case_id not in fresh
                    fresh.discard(case_id)  # a repeat within the batch is a duplicate too
                self.counters["retained"] += len(bank) - before
                self.counters["duplicates"] += len(new_cases) - (len(bank) - before)
        ms["retain"] = clock() - t0

        t0 = clock()
        losses: list[float] = []
        if self.learner is not None and self.buffer is not None:
            from memento.replay import Transition

            tiny = np.finfo(np.float32).tiny
            for b, sel in enumerate(selections):
                if sel is None:
                    continue
                self.buffer.add(Transition(state_D=state_BD[b], cases_KD=cands[b].embeddings_CD[sel.positions_K],
                                           reward=judged[b][0], propensity_K=np.maximum(sel.probs_K, tiny),
                                           step=first_step + b, policy_version=version))
            if self.buffer.added >= max(1, cfg.warmup):
                for _ in range(cfg.updates_per_step * n):
                    metrics = self.learner.update(self.buffer.sample(self.learner.config.batch_size,
                                                                     self.learner.generator))
                    losses.append(metrics["loss"])
        elif self.linucb is not None and self.linucb_log is not None:
            for b, sel in enumerate(selections):
                if sel is None:
                    continue
                self.linucb.update_selection(state_BD[b], cands[b], sel, judged[b][0])
                for p in sel.positions_K:
                    self.linucb_log.append(state_BD[b], cands[b].embeddings_CD[int(p)], judged[b][0],
                                           cands[b].ids[int(p)])
        ms["learn"] = clock() - t0

        for name, seconds in ms.items():
            self.ms_totals[name] += seconds * 1000.0
        per_task_ms = {name: round(seconds * 1000.0 / n, 4) for name, seconds in ms.items()}
        loss = float(np.mean(losses)) if losses else None
        now = time.time()
        records = []
        for b, (task, out, (reward, reason), sel) in enumerate(zip(tasks, outputs, judged, selections)):
            self.counters["prompt_tokens"] += int(getattr(out, "prompt_tokens", 0) or 0)
            self.counters["output_tokens"] += int(getattr(out, "output_tokens", 0) or 0)
            success = reward >= cfg.success_threshold
            self.rewards.append(reward)
            self.successes.append(success)
            records.append({
                "step": first_step + b, "task_id": task.id, "family": task.family, "state": task.question,
                "candidate_ids": list(cands[b].ids), "chosen_ids": [] if sel is None else list(sel.ids),
                "propensities": [] if sel is None else [float(p) for p in sel.probs_K],
                "set_propensity": None if sel is None else float(sel.set_prob),
                "greedy": None if sel is None else bool(sel.greedy),
                "output": out.text, "reward": reward, "success": bool(success), "reason": reason, "done": True,
                "retained_id": retained_ids[b], "duplicate": duplicate[b], "policy": cfg.policy,
                "policy_version": version, "bank_size": bank_size,
                "entropy": 0.0 if sel is None else _entropy(sel.probs_C), "alpha": alpha, "loss": loss,
                "time": now, "ms": per_task_ms})
        return records

    def _outputs(self, raw: list[Any], n: int) -> list[PlanOutput]:
        from memento.planners.base import PlannerError, PlanOutput

        if len(raw) != n:
            raise PlannerError(f"planner {self.planner!r} returned {len(raw)} outputs for {n} tasks")
        outputs = []
        for out in raw:
            if isinstance(out, str):
                out = PlanOutput(text=out)
            if not isinstance(getattr(out, "text", None), str):
                raise PlannerError(f"planner {self.planner!r} returned {type(out).__name__}, expected PlanOutput")
            outputs.append(out)
        return outputs

    # ------------------------------------------------------------------ summary

    def _summary(self, bank: CaseBank, wall_s: float, resumed_from: int | None) -> dict[str, Any]:
        cfg = self.config
        steps = len(self.rewards)
        success_T = np.asarray(self.successes, dtype=np.float64)
        ms = {name: self.ms_totals[name] / max(1, steps) for name in COMPONENTS}
        ms["total"] = sum(ms.values())
        ms["overhead"] = ms["total"] - ms["plan"] - ms["judge"]
        updates = self.learner.updates if self.learner is not None else (
            self.linucb.n_updates if self.linucb is not None else 0)
        return {
            "policy": cfg.policy, "steps": steps, "llm_calls": int(self.counters["llm_calls"]),
            "success_rate": float(success_T.mean()) if steps else 0.0,
            "success_by_window": success_by_window(success_T, cfg.window),
            "moving_success_rate": float(moving_average(success_T, cfg.window)[-1]) if steps else 0.0,
            "window": cfg.window, "cumulative_reward": float(np.sum(self.rewards)),
            "bank_size_start": int(self.bank_size_start), "bank_size_end": len(bank),
            "retained": int(self.counters["retained"]), "duplicates": int(self.counters["duplicates"]),
            "not_retained": int(self.counters["not_retained"]),
            "prompt_tokens": int(self.counters["prompt_tokens"]),
            "output_tokens": int(self.counters["output_tokens"]),
            "ms_per_step": ms, "updates": int(updates),
            "final_alpha": self.learner.alpha if self.learner is not None else None,
            "seed": cfg.seed, "batch_size": cfg.batch_size, "k": cfg.k, "candidates": cfg.candidates,
            "resumed_from": resumed_from, "wall_s": wall_s,
            "selector": "selector" if self.learner is not None else None,
        }


def run_online(config: LoopConfig, **kwargs: Any) -> dict[str, Any]:
    """``OnlineLoop(config, **kwargs).run()``: run one policy over the stream; returns the summary."""
    return OnlineLoop(config, **kwargs).run()


# ---------------------------------------------------------------- several policies on one stream


def run_comparison(policies: Sequence[LoopPolicyKind], *, config: LoopConfig, out_dir: str | Path,
                   late_steps: int = 200, **kwargs: Any) -> dict[str, Any]:
    """Run each policy on the same task stream (same seed, same task order) in ``out_dir/<policy>/``.

    Each policy starts from its own copy of the same starting bank (``bank_dir`` or ``seed_cases`` in
    ``kwargs``, as for :class:`OnlineLoop`). Writes ``out_dir/comparison.json`` (per policy: overall
    success, early success over the first ``config.window`` steps, late success over the last
    ``late_steps`` steps, LLM calls, milliseconds per step by component) and
    ``out_dir/learning_curves.png`` (the moving success rate per policy against the step).
    """
    from typing import get_args

    policies = list(policies)
    if not policies:
        raise ConfigError("run_comparison: no policies given")
    for policy in policies:
        if policy not in get_args(LoopPolicyKind):
            raise ConfigError(f"run_comparison: unknown policy {policy!r}; choose from {get_args(LoopPolicyKind)}")
    if len(set(policies)) != len(policies):
        raise ConfigError(f"run_comparison: policies repeat: {policies}")
    if isinstance(late_steps, bool) or not isinstance(late_steps, int) or late_steps < 1:
        raise ConfigError(f"run_comparison: late_steps={late_steps!r}: must be an integer >= 1")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    curves: dict[str, list[bool]] = {}
    results: dict[str, Any] = {}
    for policy in policies:
        loop = OnlineLoop(dataclasses.replace(config, policy=policy), out_dir=out_dir / policy, **kwargs)
        summary = loop.run()
        success_T = np.asarray(loop.successes, dtype=np.float64)
        curves[policy] = list(loop.successes)
        late = min(late_steps, success_T.size)
        results[policy] = {
            "success_rate": summary["success_rate"],
            "success_early": float(success_T[:config.window].mean()), "early_steps": [0, min(config.window,
                                                                                               success_T.size)],
            "success_late": float(success_T[success_T.size - late:].mean()),
            "late_steps": [int(success_T.size - late), int(success_T.size)],
            "llm_calls": summary["llm_calls"], "cumulative_reward": summary["cumulative_reward"],
            "bank_size_start": summary["bank_size_start"], "bank_size_end": summary["bank_size_end"],
            "ms_per_step": summary["ms_per_step"], "updates": summary["updates"], "dir": policy,
        }
    from memento.plots import plot_learning_curves

    plot_learning_curves(curves, out_dir / "learning_curves.png", window=config.window,
                         title=f"moving success rate ({config.window} steps), seed {config.seed}")
    comparison = {"steps": config.steps, "seed": config.seed, "window": config.window, "late_steps": late_steps,
                  "policies": results, "order": policies, "learning_curves": "learning_curves.png"}
    _write_json(out_dir / "comparison.json", comparison)
    return comparison


def comparison_table(comparison: dict[str, Any]) -> str:
    """A plain-text table of a comparison: success early vs late, LLM calls, milliseconds per step."""
    head = ("policy", "early", "late", "overall", "LLM calls", "ms/step", "overhead ms")
    rows = [head]
    for policy in comparison["order"]:
        r = comparison["policies"][policy]
        rows.append((policy, f"{r['success_early']:.3f}", f"{r['success_late']:.3f}", f"{r['success_rate']:.3f}",
                     str(r["llm_calls"]), f"{r['ms_per_step']['total']:.1f}", f"{r['ms_per_step']['overhead']:.1f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    early = f"first {comparison['window']}"
    return "\n".join(lines) + f"\n(early: {early} steps; late: last {comparison['late_steps']} steps)"
