"""The online continual-learning loop: Memento's Algorithm 1 on real tasks, a real bank and a frozen planner.

One **step** is one task (one LLM call)::

    task -> encoder.encode(task.question)                 state_D (the encoder's cache makes repeats free)
         -> bank.candidates(state_D, C)                   top-C cases by cosine, with their vectors
         -> policy.select(state_D, candidates, K, rng)    Selection (ids, per-case and set propensities)
         -> planner.plan(task, bank.get(selection.ids))   frozen LLM output text
         -> judge(task, output.text)                      reward (+ reason)
         -> bank.add(Case(task.question, output, reward)) Retain: M_{t+1} = M_t ∪ {(s_t, a_t, r_t)}
         -> planner.score_many(task, top-m alone)        per-candidate labels, when the soft-Q config asks
                                                          (``SoftQConfig.labels``; ``labels.jsonl``)
         -> policy.observe([Observation(...)])            learn: soft_q's replay + updates after warm-up,
                                                          LinUCB's ridge regression
         -> TensorBoard scalars, steps.jsonl record, checkpoint every N steps

The policy is whatever ``make_policy(config.policy, context)`` builds (the composition root passes
``policies.make_policy``); the loop calls only its ``select`` and ``observe``. ``soft_q`` records each
decision in its replay buffer and takes its gradient steps after warm-up; ``linucb`` updates its ridge
regression with the set's reward; ``random`` and ``similarity`` do not learn (similarity sees the growing
bank, and with ``positive_only=True`` only its successful cases: Memento's non-parametric client).

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

**Run directory** (``out_dir``): laid out by :class:`memento.runs.rundir.RunDir` (config, run info, bank,
``steps.jsonl``, TensorBoard, checkpoint, summary, ``selector/``). A ``steps.jsonl`` line is a
:class:`memento.formats.StepRecord`: the transition log of DESIGN §6.

**Checkpoints** are written into ``checkpoint.tmp`` and swapped in for ``checkpoint`` (``RunDir``); one
holds ``state.json`` (step, counters, millisecond totals, the bank's length and uid, the policy RNG's
``bit_generator.state``, the task-stream fingerprint; written last), ``config.json``, ``steps.jsonl`` (a
copy of the log so far) and the policy's own state (``policy.checkpoint``: ``learner/`` + ``replay/`` for
soft_q, with ``labels/`` when it learns from online labels; ``linucb.safetensors`` + ``linucb.json`` for
LinUCB) and ``labels.jsonl`` (a copy of the online labels so far, when the run makes them). The bank stays
in ``out_dir/bank``;
``bank.flush()`` precedes the checkpoint and ``resume`` rolls it back with ``bank.truncate(saved_len)``. A
resumed run ends in the same state as an uninterrupted run with the same seed (bank contents, Q-network
weights, per-step rewards), exactly on the CPU, provided the planner and the judge are deterministic. A
finished run can be extended (resume with a larger ``steps``); it continues the same task stream, and
equals a longer run outright when the old ``steps`` was a multiple of ``batch_size`` (otherwise its last
round was shorter).

**Threads.** The library never calls ``torch.set_num_threads`` (global state); the ``memento online``
command has ``--torch-threads`` for that.
"""

from __future__ import annotations

import contextlib
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
from typing import TYPE_CHECKING, Any, Literal, get_args

import numpy as np
import torch

from memento.config import (
    CFGMRetrievalConfig,
    LifeMemRetrievalConfig,
    LinUCBConfig,
    PlugMemRetrievalConfig,
    PolicyConfig,
    PolicyKind,
    RandomConfig,
    SimilarityConfig,
    SoftQConfig,
    check,
    check_choice,
    check_float,
    check_int,
    check_policy,
    to_dict,
)
from memento.errors import CheckpointError, ConfigError, DataFormatError, DimensionError
from memento.formats import StepRecord, read_steps_jsonl
from memento.io import atomic_write
from memento.judges import first_line
from memento.learn.features import CaseFeaturizer
from memento.learn.policy import CandidateLabels, Observation, Policy, PolicyContext, PolicyFactory
from memento.memory import Candidates, CaseBank
from memento.memory.index import use_gpu_for
from memento.memory.uri import bank_name, open_bank
from memento.plots import moving_average
from memento.runs.rundir import CHECKPOINT_FORMAT, CHECKPOINT_FORMAT_VERSION, RunDir, check_saved_config, write_json
from memento.systems.items import ItemGraph, memory_tokens
from memento.systems.runtime import MemorySystems, SystemsConfig
from memento.types import Case, Selection, Task

if TYPE_CHECKING:  # the planners package (LLM clients) is imported only when a run plans
    from memento.planners.base import Planner, PlanOutput

__all__ = [
    "COMPONENTS",
    "LoopConfig",
    "check_seed_bank",
    "encode_checked",
    "leave_one_out_credit",
    "OnlineLoop",
    "loop_policy",
    "restore_bank",
    "run_bank",
    "run_online",
    "success_by_window",
    "task_env",
    "task_order",
    "tasks_fingerprint",
]

logger = logging.getLogger(__name__)

Credit = Literal["shared", "leave_one_out"]
"""How a task's reward is credited to the K shown cases (``LoopConfig.credit``)."""

COMPONENTS = ("encode", "candidates", "select", "plan", "judge", "credit", "label", "retain", "learn", "usage",
              "log", "checkpoint")
"""Where a step's time goes; ``summary.json`` reports the mean milliseconds per step of each."""

RESUMABLE_CHANGES = ("steps", "checkpoint_every", "tensorboard")
"""LoopConfig fields a resumed run may change; any other difference is refused."""


def loop_policy(kind: PolicyKind) -> PolicyConfig:
    """The online loop's default config of each policy (similarity: successful cases only, as Memento's
    non-parametric client retrieves them; soft_q: among the same successful cases, with a Q-network anchored on
    cosine similarity that sees the case features (``anchor="cosine"``, ``features="case"``): the
    configuration measured best on ``facts-real`` (docs/benchmarks.md); :class:`~memento.config.SoftQConfig`'s
    own defaults stay the plain Memento Q-network, which needs no bank to build)."""
    match kind:
        case "random":
            return RandomConfig()
        case "similarity":
            return SimilarityConfig(positive_only=True)
        case "soft_q":
            soft_q = SoftQConfig(positive_only=True)
            return dataclasses.replace(soft_q, qnet=dataclasses.replace(soft_q.qnet, anchor="cosine", features="case"))
        case "linucb":
            return LinUCBConfig()
        case "cfgm":
            return CFGMRetrievalConfig()
        case "lifemem":
            return LifeMemRetrievalConfig()
        case "plugmem":
            return PlugMemRetrievalConfig()
    raise ConfigError(f"policy kind {kind!r}: must be one of {get_args(PolicyKind)}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoopConfig:
    """One online run (see the module docstring for the step and batch semantics).

    - ``steps``: tasks (= LLM calls) to run; ``k``: cases shown per task; ``candidates``: C, the size
      of the cosine pre-selection the policy chooses from (``k <= C``);
    - ``policy``: the policy's config (:data:`memento.config.PolicyConfig`: ``loop_policy("soft_q")`` (default),
      ``SimilarityConfig``, ``RandomConfig`` or ``LinUCBConfig``; :func:`loop_policy` gives the loop's
      default of each kind). A ``SoftQConfig`` must have ``learner.gamma = 0``: the loop is single-step;
    - ``batch_size``: B tasks selected with the same policy parameters and planned together with
      ``plan_many``, then all retained and learned from (default 1: Algorithm 1 as written);
    - ``seed``: every random stream of the run; ``shuffle``: the task stream is a fresh permutation per
      pass (else file order, cycled);
    - ``retain``: add each (question, output, reward) to the bank (Algorithm 1's Retain; duplicates of a
      stored (state, action) are skipped); ``index``: the faiss factory of a bank made from seed cases;
    - ``success_threshold``: a step succeeds when its reward is >= this (the moving success rate);
      ``window``: steps per moving-average window and per ``success_by_window`` entry;
    - ``checkpoint_every``: steps between checkpoints (0: only at the end); ``tensorboard``: write
      event files under ``out_dir/tb``;
    - ``credit``: how the task's outcome is shared among the K shown cases. ``"shared"``: every shown case
      gets the task's reward (Memento's task-level label). ``"leave_one_out"``: the planner scores the gold
      answer (``task.answers[0]``) after the prompt with all K cases and after each prompt with one case left
      out (``planner.score_many``: K + 1 forward passes, no generation); case ``i``'s target is
      ``sigmoid((logp(all) - logp(all but i)) / credit_temperature)``, above 0.5 when the case raised the
      answer's likelihood. Tasks without a gold answer keep shared credit;
    - ``learn``: the policy learns from each round (``False``: a frozen evaluation; the policy still chooses and
      the usage statistics are still logged);
    - ``systems``: the memory systems built and shown (:class:`~memento.systems.runtime.SystemsConfig`; default:
      none, the plain loop). In question answering a question's **environment** is its ``family`` (its ``env``
      when it has none): CFGM writes one focus point per environment before its first question (from the
      environment's name and the first questions of that family in the task list, never their answers) and the
      tips of a question once it has a success (contrasted with a failure of the same question when the bank
      holds one, e.g. from an earlier pass); LifeMem puts every retained answer (question -> answer: a one-step
      trajectory) into a workflow cluster and distils skills; with ``items="all"`` the candidates are the C
      nearest raw cases expanded with their tips, skills and the environment's focus point, and the items
      chosen are shown as notes (:mod:`memento.planners.prompts`). ``reflect`` and ``retries`` are for
      multi-step games (a question has no observation to reflect on) and are refused here.
    """

    steps: int = 500
    k: int = 4
    candidates: int = 32
    policy: PolicyConfig = dataclasses.field(default_factory=lambda: loop_policy("soft_q"))
    batch_size: int = 1
    seed: int = 0
    shuffle: bool = True
    retain: bool = True
    index: str = "Flat"
    success_threshold: float = 0.5
    window: int = 50
    checkpoint_every: int = 100
    tensorboard: bool = True
    credit: Credit = "shared"
    credit_temperature: float = 1.0
    learn: bool = True
    systems: SystemsConfig = dataclasses.field(default_factory=SystemsConfig)

    def __post_init__(self) -> None:
        cls = type(self)
        check_int(self, "steps", 1)
        check_int(self, "k", 1)
        check_int(self, "candidates", 1)
        check(self.k <= self.candidates, cls, "k", self.k, f"must be <= candidates={self.candidates}")
        check_policy(self)
        if isinstance(self.policy, SoftQConfig):
            check(self.policy.learner.gamma == 0.0, cls, "policy", f"learner.gamma={self.policy.learner.gamma}",
                  "the online loop is single-step: learner.gamma must be 0")
        check_int(self, "batch_size", 1)
        check_int(self, "seed", 0)
        for field in ("shuffle", "retain", "tensorboard", "learn"):
            check(isinstance(getattr(self, field), bool), cls, field, getattr(self, field), "must be true or false")
        check(isinstance(self.index, str) and bool(self.index.strip()), cls, "index", self.index,
              "must be a non-empty faiss factory string")
        check_float(self, "success_threshold")
        check_int(self, "window", 1)
        check_int(self, "checkpoint_every", 0)
        check_choice(self, "credit", Credit)
        check_float(self, "credit_temperature", low=0.0, low_open=True)
        check(isinstance(self.systems, SystemsConfig), cls, "systems", self.systems, "must be a SystemsConfig")
        check(not self.systems.reflect and self.systems.retries == 0, cls, "systems",
              f"reflect={self.systems.reflect}, retries={self.systems.retries}",
              "key-information reflection and retries are for multi-step games (memento play); a question has "
              "no observation to reflect on")

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


def tasks_fingerprint(tasks: Sequence[Task]) -> str:
    """sha256 of the tasks' ids, questions and answers, in order (a resumed run must see the same stream)."""
    digest = hashlib.sha256()
    for task in tasks:
        digest.update(json.dumps([task.id, task.question, list(task.answers)], ensure_ascii=False).encode("utf-8"))
        digest.update(b"\n")
    return digest.hexdigest()


FOCUS_EXAMPLES = 3
"""Questions of an environment shown to CFGM's focus-point builder (questions only, never their answers)."""


def task_env(task: Task) -> str:
    """A question's environment for the memory systems: its ``family``, else its ``env``, else ``"default"``."""
    return task.family or task.env or "default"


def own_answer(case: Case) -> bool:
    """An answer this loop retained with the memory systems on (it carries the judge's verdict,
    ``meta.success``): what LifeMem clusters in question answering (a seed bank's cases are not clustered)."""
    return "success" in case.meta and "task_id" in case.meta


def torch_seed(seq: np.random.SeedSequence) -> int:
    """A non-negative int64 torch seed drawn from a ``SeedSequence``."""
    return int(seq.generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))


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


def check_seed_bank(path: str | Path) -> None:
    """Read a seed bank whole, as a run will (every case and its provenance links), so that a damaged bank is a
    one-line :class:`~memento.errors.MementoError` before a command writes anything."""
    with open_bank(path, read_only=True) as bank:
        ItemGraph(bank.iter_cases()).check()


def run_bank(target: Path, dim: int, *, bank_dir: Path | str | None, index: str, encoder_config: Any,
             device: torch.device) -> CaseBank:
    """A run's fresh bank at ``target``: a copy of the bank named ``bank_dir`` (a directory or ``milvus:URI``,
    :func:`memento.memory.uri.open_bank`; read only, not changed; its index factory and encoder win), or an empty
    one with ``index``. A seed bank of another dimension is a :class:`DimensionError` naming both."""
    if bank_dir is None:
        return CaseBank.create(target, dim, index=index, encoder=encoder_config, use_gpu=use_gpu_for(device))
    with open_bank(bank_dir, read_only=True) as seed:
        if seed.dim != dim:
            raise DimensionError(f"{bank_dir}: the seed bank holds dim={seed.dim} vectors, the encoder gives dim={dim}")
        bank = CaseBank.create(target, dim, index=seed.config.index, encoder=seed.config.encoder or encoder_config,
                               use_gpu=use_gpu_for(device))
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


def leave_one_out_credit(planner: Any, tasks: Sequence[Task], shown: Sequence[Sequence[Case]],
                         temperature: float) -> tuple[list[np.ndarray | None], int]:
    """``LoopConfig.credit="leave_one_out"``: per task with shown cases and a gold answer, each shown case's target
    ``sigmoid((logp(all) - logp(all but i)) / temperature)`` (``planner.score_many``: K + 1 scored prompts), ``None``
    for the others; also the number of prompts scored. Used by :class:`OnlineLoop` and by the rollout workers."""
    credit: list[np.ndarray | None] = [None] * len(tasks)
    rows = [b for b, cases in enumerate(shown) if cases and tasks[b].answers]
    if not rows:
        return credit, 0
    case_sets = [[list(shown[b])] + [list(shown[b][:i]) + list(shown[b][i + 1:]) for i in range(len(shown[b]))]
                 for b in rows]
    scores = planner.score_many([tasks[b] for b in rows], case_sets)
    for b, task_scores in zip(rows, scores):
        full = task_scores[0].logprob
        drop_K = np.asarray([full - s.logprob for s in task_scores[1:]], dtype=np.float64)
        credit[b] = 1.0 / (1.0 + np.exp(-np.clip(drop_K / temperature, -50.0, 50.0)))
    return credit, sum(len(sets) for sets in case_sets)


def labels_config(config: LoopConfig) -> Any:
    """The run's :class:`~memento.config.OnlineLabelsConfig` when its policy learns from online labels, else None."""
    policy = config.policy
    return policy.labels if isinstance(policy, SoftQConfig) and policy.labels.active else None


def _entropy(p_C: np.ndarray) -> float:
    p = np.asarray(p_C, dtype=np.float64)
    p = p[p > 0]
    return float(-(p * np.log(p)).sum()) if p.size else 0.0


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


# ---------------------------------------------------------------- the loop


class OnlineLoop:
    """Memento's Algorithm 1 over a task stream (see the module docstring).

    - ``make_policy``: ``(policy config, PolicyContext) -> Policy``, e.g. ``policies.make_policy``;
    - ``encoder``: ``encode(texts) -> [N, D]`` unit vectors and ``dim`` (a :class:`memento.Encoder`);
    - ``planner``: a :class:`memento.planners.Planner` (``plan`` / ``plan_many``);
    - ``judge``: ``judge(task, output_text) -> object with .reward (float) and .reason (str)``: the step's
      reward, which the policy learns from;
    - ``retain_judge``: the judge of the reward *stored* with a retained case (default: ``judge``). A real bank
      stores the outcome of a case's own task, often judged leniently (``contains``, token F1, an LLM judge),
      not its usefulness as a demonstration under the task's own (strict) judge: pass the lenient judge here
      to keep a run's bank as realistic as its seed bank (the ``facts-real`` suite);
    - ``tasks``: the task list the stream draws from;
    - ``out_dir``: the run directory;
    - the starting bank: ``bank_dir`` (an existing bank, copied into ``out_dir/bank``; the original is
      not changed), or ``seed_cases`` (encoded and added to a new bank), or neither (an empty bank);
    - ``device``: where the policy's Q-network, learner and replay buffer live (soft_q);
    - ``resume``: continue from ``out_dir``'s checkpoint (a run without one starts afresh, clearing the
      run files); without it, an ``out_dir`` that already holds a run is refused.
    """

    def __init__(self, config: LoopConfig, *, make_policy: PolicyFactory, encoder: Any, planner: Planner,
                 judge: Callable[[Task, str], Any], tasks: Sequence[Task], out_dir: str | Path,
                 bank_dir: str | Path | None = None, seed_cases: Sequence[Case] | None = None,
                 device: str | torch.device = "cpu", resume: bool = False, progress: bool = False,
                 retain_judge: Callable[[Task, str], Any] | None = None):
        if not isinstance(config, LoopConfig):
            raise ConfigError(f"OnlineLoop: config={type(config).__name__}: must be a LoopConfig")
        if not callable(make_policy):
            raise ConfigError(f"OnlineLoop: make_policy={make_policy!r} is not callable (config, context) -> Policy "
                              "(pass policies.make_policy)")
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
        if retain_judge is not None and not callable(retain_judge):
            raise ConfigError(f"OnlineLoop: retain_judge={retain_judge!r} is not callable (task, output) -> result")
        for method in ("plan", "plan_many"):
            if not callable(getattr(planner, method, None)):
                raise ConfigError(f"OnlineLoop: planner {planner!r} has no {method}() (see memento.planners.Planner)")
        if config.credit == "leave_one_out" and not callable(getattr(planner, "score_many", None)):
            raise ConfigError(f"LoopConfig.credit='leave_one_out' needs a planner that scores answers "
                              f"(score_many); {planner!r} has none")
        if labels_config(config) is not None:
            from memento.planners.base import can_score

            if not can_score(planner):
                raise ConfigError(f"online labels (SoftQConfig.labels.m={config.policy.labels.m}) need a planner "
                                  f"that gives log-probabilities (score_many); {planner!r} cannot score")
        dim = getattr(encoder, "dim", None)
        if not callable(getattr(encoder, "encode", None)) or not isinstance(dim, int):
            raise ConfigError(f"OnlineLoop: encoder {encoder!r} needs encode(texts) and an integer dim")
        self.config = config
        self.make_policy = make_policy
        self.encoder = encoder
        self.planner = planner
        self.judge = judge
        self.retain_judge = retain_judge
        self.tasks = tasks
        self.run_dir = RunDir(out_dir)
        self.out_dir = self.run_dir.path
        self.bank_dir = None if bank_dir is None else bank_name(bank_dir)  # a directory or milvus:URI
        self.seed_cases = None if seed_cases is None else list(seed_cases)
        self.device = torch.device(device)
        self.resume = resume
        self.progress = progress
        self.dim = dim

    # ------------------------------------------------------------------ setup

    def _encode(self, texts: list[str]) -> np.ndarray:
        return encode_checked(self.encoder, self.dim, texts)

    def _encoder_config(self) -> Any:
        from memento.config import EncoderConfig

        config = getattr(self.encoder, "config", None)
        return config if isinstance(config, EncoderConfig) else None

    def _make_bank(self) -> CaseBank:
        """A fresh ``out_dir/bank``: a copy of ``bank_dir``, the encoded seed cases, or empty."""
        bank = run_bank(self.run_dir.bank, self.dim, bank_dir=self.bank_dir, index=self.config.index,
                        encoder_config=self._encoder_config(), device=self.device)
        if self.bank_dir is not None:
            return bank
        try:
            if self.seed_cases:
                emb_ND = self._encode([case.state for case in self.seed_cases])
                bank.add(self.seed_cases, emb_ND)
        except BaseException:
            bank.close()
            raise
        return bank

    def _build_policy(self, seeds: list[np.random.SeedSequence], bank: CaseBank) -> Policy:
        context = PolicyContext(dim=self.dim, k_max=self.config.k, device=self.device,
                                qnet_seed=torch_seed(seeds[2]), learner_seed=torch_seed(seeds[3]),
                                reward_of=bank.rewards, featurizer=CaseFeaturizer(bank, self._encode))
        return self.make_policy(self.config.policy, context)

    # ------------------------------------------------------------------ checkpoints

    def _checkpoint(self, bank: CaseBank, steps_handle: Any, labels_handle: Any = None) -> None:
        """Write a complete checkpoint into checkpoint.tmp, then swap it in for checkpoint."""
        cfg = self.config
        tmp = self.run_dir.begin_checkpoint()
        bank.flush()
        steps_handle.flush()
        os.fsync(steps_handle.fileno())
        atomic_write(tmp / RunDir.STEPS, lambda dst: shutil.copyfile(self.run_dir.steps, dst))
        if labels_handle is not None:
            labels_handle.flush()
            os.fsync(labels_handle.fileno())
            atomic_write(tmp / RunDir.LABELS, lambda dst: shutil.copyfile(self.run_dir.labels, dst))
        self.policy.checkpoint(tmp)
        write_json(tmp / RunDir.CONFIG, to_dict(cfg))
        state = {"format": CHECKPOINT_FORMAT, "format_version": CHECKPOINT_FORMAT_VERSION, "step": self.step,
                 "policy": cfg.policy_kind, "bank_size": len(bank), "bank_uid": bank.uid,
                 "bank_size_start": self.bank_size_start, "counters": dict(self.counters),
                 "ms_totals": dict(self.ms_totals), "policy_rng": self.policy_rng.bit_generator.state,
                 "tasks_fingerprint": self.fingerprint, "n_tasks": len(self.tasks), "time": time.time()}
        write_json(tmp / RunDir.STATE, state)  # last: its presence marks the checkpoint complete
        final = self.run_dir.commit_checkpoint(tmp)
        logger.info("checkpoint at step %d (%d cases in the bank) in %s", self.step, len(bank), final)

    def _restore(self, ckpt: Path, bank: CaseBank) -> None:
        cfg = self.config
        state = RunDir.read_state(ckpt)
        check_saved_config(ckpt, LoopConfig, cfg, RESUMABLE_CHANGES)
        if state["tasks_fingerprint"] != self.fingerprint:
            raise CheckpointError(f"{ckpt}: saved for another task list ({state['n_tasks']} tasks, fingerprint "
                                  f"{state['tasks_fingerprint'][:12]}); now {len(self.tasks)} tasks, "
                                  f"fingerprint {self.fingerprint[:12]}")
        step = int(state["step"])
        if step > cfg.steps:
            raise CheckpointError(f"{ckpt}: the checkpoint is at step {step}, beyond steps={cfg.steps}")
        restore_bank(ckpt, state, bank)
        self.step = step
        self.bank_size_start = int(state["bank_size_start"])
        self.counters.update({k: int(v) if isinstance(v, int) else v for k, v in state["counters"].items()})
        self.ms_totals.update({k: float(v) for k, v in state["ms_totals"].items()})
        self.policy_rng.bit_generator.state = state["policy_rng"]
        self.policy.restore(ckpt)
        # the per-step log: exactly the checkpoint's copy
        atomic_write(self.run_dir.steps, lambda dst: shutil.copyfile(ckpt / RunDir.STEPS, dst))
        if labels_config(cfg) is not None:  # and the online labels: exactly the checkpoint's copy
            if not (ckpt / RunDir.LABELS).is_file():
                raise CheckpointError(f"{ckpt}: no {RunDir.LABELS} in a checkpoint of a run with online labels")
            atomic_write(self.run_dir.labels, lambda dst: shutil.copyfile(ckpt / RunDir.LABELS, dst))
        records = read_steps_jsonl(self.run_dir.steps)
        self.rewards = [float(record.reward) for record in records]
        self.successes = [bool(record.success) for record in records]
        if len(self.rewards) != step:
            raise CheckpointError(f"{ckpt}: steps.jsonl holds {len(self.rewards)} records for step {step}")
        self.run_dir.adopt_checkpoint(ckpt)
        logger.info("resumed %s at step %d of %d (%d cases in the bank)", cfg.policy_kind, step, cfg.steps, len(bank))

    # ------------------------------------------------------------------ the run

    def run(self) -> dict[str, Any]:
        """Run (or finish) the stream; returns the summary (also written to ``out_dir/summary.json``)."""
        cfg = self.config
        started = time.perf_counter()
        self.fingerprint = tasks_fingerprint(self.tasks)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        ckpt = self.run_dir.start(self.resume)

        seeds = np.random.SeedSequence(cfg.seed).spawn(4)
        order_T = task_order(len(self.tasks), cfg.steps, seeds[0], shuffle=cfg.shuffle)
        self.policy_rng = np.random.Generator(np.random.PCG64(seeds[1]))
        self.step = 0
        self.counters: dict[str, Any] = {"llm_calls": 0, "score_calls": 0, "retained": 0, "duplicates": 0,
                                         "not_retained": 0, "prompt_tokens": 0, "output_tokens": 0,
                                         "memory_tokens": 0, "labelled": 0, "labelled_gold": 0,
                                         "labelled_hindsight": 0, "label_passes": 0}
        self.ms_totals: dict[str, float] = {c: 0.0 for c in COMPONENTS}
        self.rewards: list[float] = []
        self.successes: list[bool] = []
        self._focus_asked: set[str] = set()
        self._listwise: float | None = None  # the last round's listwise loss (online labels)
        self._labels_handle: Any = None

        if ckpt is None:
            bank = self._make_bank()
        else:
            bank = CaseBank.open(self.run_dir.bank, dim=self.dim, use_gpu=use_gpu_for(self.device))
        try:
            self.systems = MemorySystems(cfg.systems, planner=self.planner, encode=self._encode,
                                         cache_path=self.out_dir / "memory_calls.jsonl", trajectory=own_answer)
            self.policy = self._build_policy(seeds, bank)
            if ckpt is None:
                self.bank_size_start = len(bank)
                write_json(self.run_dir.config_path, to_dict(cfg))
                self.run_dir.steps.write_bytes(b"")
                self.run_dir.labels.write_bytes(b"")
            else:
                self._restore(ckpt, bank)
            if cfg.systems.active:
                self.systems.open(bank)  # after the bank was rolled back to the checkpoint
            self._write_run_info()
            return self._loop(bank, order_T, started, resumed_from=None if ckpt is None else self.step)
        finally:
            bank.close()

    def _write_run_info(self) -> None:
        describe = getattr(self.encoder, "describe", None)
        info = {"policy": self.config.policy_kind, "device": str(self.device),
                "encoder": describe() if callable(describe) else repr(self.encoder),
                "planner": repr(self.planner), "judge": repr(self.judge),
                "retain_judge": None if self.retain_judge is None else repr(self.retain_judge),
                "n_tasks": len(self.tasks),
                "tasks_fingerprint": self.fingerprint,
                "seed_bank": None if self.bank_dir is None else str(self.bank_dir),
                "seed_cases": None if self.seed_cases is None else len(self.seed_cases),
                "torch": torch.__version__, "numpy": np.__version__}
        write_json(self.run_dir.run_info_path, info)

    def _loop(self, bank: CaseBank, order_T: np.ndarray, started: float, resumed_from: int | None) -> dict[str, Any]:
        cfg = self.config
        writer = None
        if cfg.tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise ConfigError("LoopConfig.tensorboard=True needs TensorBoard: pip install 'memento-mdp[train]' "
                                  "(or set \"tensorboard\": false in the LoopConfig)") from None

            writer = SummaryWriter(str(self.run_dir.tensorboard),
                                   purge_step=self.step if resumed_from is not None else None)
            if resumed_from is None:
                writer.add_text("config", "```\n" + json.dumps(to_dict(cfg), indent=2) + "\n```", 0)
        from tqdm.auto import tqdm

        recent: deque[bool] = deque(self.successes[-cfg.window:], maxlen=cfg.window)
        bar = tqdm(total=cfg.steps, initial=self.step, desc=f"online {cfg.policy_kind}", unit="task",
                   disable=not self.progress, dynamic_ncols=True)
        try:
            labels_on = labels_config(cfg) is not None
            with self.run_dir.steps.open("a", encoding="utf-8") as steps_handle, \
                    (self.run_dir.labels.open("a", encoding="utf-8") if labels_on
                     else contextlib.nullcontext()) as labels_handle:
                self._labels_handle = labels_handle
                while self.step < cfg.steps:
                    # a batch never crosses a multiple of batch_size, so a resumed run batches the same way
                    start = self.step
                    stop = min(cfg.steps, (start // cfg.batch_size + 1) * cfg.batch_size)
                    records = self._batch(bank, [self.tasks[i] for i in order_T[start:stop]], start)
                    t0 = time.perf_counter()
                    for record in records:
                        steps_handle.write(json.dumps(record.to_json(), ensure_ascii=False) + "\n")
                        recent.append(record.success)
                        if writer is not None:
                            self._log_scalars(writer, record, float(np.mean(recent)))
                    steps_handle.flush()
                    self.ms_totals["log"] += (time.perf_counter() - t0) * 1000.0
                    self.step = stop
                    bar.update(len(records))
                    bar.set_postfix(success=f"{np.mean(recent):.2f}", bank=len(bank))
                    every = cfg.checkpoint_every
                    if self.step == cfg.steps or (every and stop // every > start // every):
                        t0 = time.perf_counter()
                        self._checkpoint(bank, steps_handle, labels_handle)
                        self.ms_totals["checkpoint"] += (time.perf_counter() - t0) * 1000.0
        finally:
            bar.close()
            if writer is not None:
                writer.close()
        has_model = self.policy.save_model(self.run_dir.selector)
        summary = self._summary(bank, time.perf_counter() - started, resumed_from, has_model)
        write_json(self.run_dir.summary_path, summary)
        logger.info("online %s: %d steps, success %.3f, bank %d -> %d", cfg.policy_kind, summary["steps"],
                    summary["success_rate"], summary["bank_size_start"], summary["bank_size_end"])
        return summary

    def _log_scalars(self, writer: Any, record: StepRecord, moving: float) -> None:
        step = record.step
        writer.add_scalar("reward", record.reward, step)
        writer.add_scalar("success_rate", moving, step)
        writer.add_scalar("bank_size", record.bank_size, step)
        writer.add_scalar("policy/entropy", record.entropy, step)
        if record.alpha is not None:
            writer.add_scalar("policy/alpha", record.alpha, step)
        if record.loss is not None:
            writer.add_scalar("learner/loss", record.loss, step)
        if self._listwise is not None:
            writer.add_scalar("learner/listwise", self._listwise, step)
        for name, value in record.ms.items():
            writer.add_scalar(f"ms/{name}", value, step)

    # ------------------------------------------------------------------ one round

    def _batch(self, bank: CaseBank, tasks: list[Task], first_step: int) -> list[StepRecord]:
        """One policy-update round over ``tasks`` (B >= 1): encode -> candidates -> select -> plan -> judge ->
        retain -> observe; returns one record per task."""
        ms: dict[str, float] = {}
        clock = time.perf_counter

        t0 = clock()
        state_BD = self._encode([task.question for task in tasks])
        ms["encode"] = clock() - t0

        t0 = clock()
        if self.config.systems.active:
            for task in tasks:
                self._ensure_focus(bank, task)
        bank_size = len(bank)
        cands = [self._candidates(bank, state_BD[b], task) for b, task in enumerate(tasks)]
        ms["candidates"] = clock() - t0

        t0 = clock()
        version, alpha = self.policy.version, self.policy.alpha
        selections = self._select(state_BD, cands)
        ms["select"] = clock() - t0

        t0 = clock()
        shown = [bank.get(list(sel.ids)) if sel is not None else [] for sel in selections]
        prompts = [self.systems.prompt_cases(task.question, cases) for task, cases in zip(tasks, shown)] \
            if self.config.systems.active else shown
        self.counters["memory_tokens"] += sum(memory_tokens(cases) for cases in prompts)
        outputs = self._plan(tasks, prompts)
        ms["plan"] = clock() - t0

        t0 = clock()
        judged = self._judge(tasks, outputs)
        ms["judge"] = clock() - t0

        t0 = clock()
        credit = self._credit(tasks, shown)
        ms["credit"] = clock() - t0

        t0 = clock()
        labels = self._labels(bank, tasks, cands, selections, outputs, judged, first_step)
        ms["label"] = clock() - t0

        t0 = clock()
        retained = self._retain(bank, tasks, outputs, judged, state_BD, first_step)
        ms["retain"] = clock() - t0

        t0 = clock()
        observations = [Observation(state_D=state_BD[b], candidates=cands[b], selection=sel, reward=judged[b][0],
                                    step=first_step + b, policy_version=version, case_rewards_K=credit[b],
                                    labels=labels[b])
                        for b, sel in enumerate(selections) if sel is not None]
        learned = self.policy.observe(observations) if self.config.learn else {}
        loss, self._listwise = learned.get("loss"), learned.get("listwise")
        ms["learn"] = clock() - t0

        t0 = clock()
        for obs in observations:  # the usage statistics of the case features, after the policy saw the round
            bank.record_usage(obs.step, list(obs.selection.ids), obs.reward)
        ms["usage"] = clock() - t0

        for name, seconds in ms.items():
            self.ms_totals[name] += seconds * 1000.0
        per_task_ms = {name: round(seconds * 1000.0 / len(tasks), 4) for name, seconds in ms.items()}
        return [self._record(b, task, out, judged[b], sel, retained[b], first_step=first_step, version=version,
                             bank_size=bank_size, alpha=alpha, loss=loss, ms=per_task_ms, credit=credit[b])
                for b, (task, out, sel) in enumerate(zip(tasks, outputs, selections))]

    def _candidates(self, bank: CaseBank, state_D: np.ndarray, task: Task) -> Candidates:
        """The bank's top-C cases, or (memory systems) the top-C raw cases expanded with their items."""
        if not self.config.systems.active:
            return bank.candidates(state_D, self.config.candidates)
        return self.systems.candidates(bank, state_D, self.config.candidates, env=task_env(task), same_env=False)

    def _ensure_focus(self, bank: CaseBank, task: Task) -> None:
        """CFGM: the focus point of the task's environment, from its name and its first questions in the list."""
        env = task_env(task)
        if env in self._focus_asked:  # asked once per family: the same prompt again would be the same reply
            return
        self._focus_asked.add(env)
        examples = [t.question for t in self.tasks if task_env(t) == env][:FOCUS_EXAMPLES]
        self.systems.ensure_focus(bank, env, f"Short-answer questions of the kind '{env}'.", examples)

    def _select(self, state_BD: np.ndarray, cands: list[Candidates]) -> list[Selection | None]:
        """Every task of the round chooses with the same parameters, in stream order, from one RNG."""
        return [self.policy.select(state_BD[b], candidates, self.config.k, rng=self.policy_rng)
                if len(candidates) else None for b, candidates in enumerate(cands)]

    def _plan(self, tasks: list[Task], shown: list[list[Case]]) -> list[PlanOutput]:
        from memento.planners.base import PlannerError, PlanOutput  # not at import: loading a selector needs none

        raw = [self.planner.plan(tasks[0], shown[0])] if len(tasks) == 1 else list(self.planner.plan_many(tasks,
                                                                                                          shown))
        self.counters["llm_calls"] += len(tasks)
        if len(raw) != len(tasks):
            raise PlannerError(f"planner {self.planner!r} returned {len(raw)} outputs for {len(tasks)} tasks")
        outputs = []
        for out in raw:
            if isinstance(out, str):
                out = PlanOutput(text=out)
            if not isinstance(getattr(out, "text", None), str):
                raise PlannerError(f"planner {self.planner!r} returned {type(out).__name__}, expected PlanOutput")
            outputs.append(out)
        return outputs

    def _judge(self, tasks: list[Task], outputs: list[PlanOutput]) -> list[tuple[float, str]]:
        judged = [_judge_reward(self.judge(task, out.text), self.judge) for task, out in zip(tasks, outputs)]
        bounds = self.policy.reward_range
        if bounds is not None:
            for task, (reward, _) in zip(tasks, judged):
                if not bounds[0] <= reward <= bounds[1]:
                    raise DataFormatError(f"judge {self.judge!r} gave reward {reward} for task {task.id!r}; the "
                                          f"{self.config.policy_kind} policy learns from rewards in "
                                          f"[{bounds[0]:g}, {bounds[1]:g}] (single-step, cross-entropy)")
        return judged

    def _credit(self, tasks: list[Task], shown: list[list[Case]]) -> list[np.ndarray | None]:
        """Leave-one-out credit per shown case (``LoopConfig.credit``), ``None`` for shared credit."""
        if self.config.credit != "leave_one_out":
            return [None] * len(tasks)
        credit, score_calls = leave_one_out_credit(self.planner, tasks, shown, self.config.credit_temperature)
        self.counters["score_calls"] += score_calls
        return credit

    def _labels(self, bank: CaseBank, tasks: list[Task], cands: list[Candidates], selections: list[Selection | None],
                outputs: list[PlanOutput], judged: list[tuple[float, str]], first_step: int
                ) -> list[CandidateLabels | None]:
        """Online labels (``SoftQConfig.labels``): for each task of the round on a labelled step (every
        ``labels.every``-th) with a target (the gold answer, or the planner's own rewarded output), the ``m``
        candidates the policy ranked highest, each scored alone with the planner in one ``score_many`` call;
        the rows go to ``labels.jsonl`` (the format of ``memento score``)."""
        lcfg = labels_config(self.config)
        out: list[CandidateLabels | None] = [None] * len(tasks)
        if lcfg is None:
            return out
        from memento.learn.labels import LabelRow, prompt_name  # not at import: it reaches the planners package
        rows, case_sets, answers, kinds, picked = [], [], [], [], []
        for b, (task, sel) in enumerate(zip(tasks, selections)):
            if sel is None or (first_step + b) % lcfg.every:
                continue
            if lcfg.target == "gold" and task.answers:
                answer, kind = None, "gold"
            elif judged[b][0] >= self.config.success_threshold and first_line(outputs[b].text):
                answer, kind = first_line(outputs[b].text), "hindsight"  # what the judges read
            else:
                continue
            pool_rows_P = cands[b].rows_of(list(sel.candidate_ids))
            order_P = np.argsort(-np.asarray(sel.probs_C, dtype=np.float64), kind="stable")[:lcfg.m]
            if order_P.size < 2:
                continue
            rows_M = pool_rows_P[order_P]
            rows.append(b)
            picked.append(rows_M)
            case_sets.append([[case] for case in bank.get([cands[b].ids[i] for i in rows_M])])
            answers.append(answer)
            kinds.append(kind)
        if not rows:
            return out
        scores = self.planner.score_many([tasks[b] for b in rows], case_sets, answers)
        planner_name, prompt = repr(self.planner), prompt_name(self.planner)
        for b, rows_M, task_scores, answer, kind in zip(rows, picked, scores, answers, kinds):
            score_M = np.asarray([s.logprob / max(1, s.n_tokens) for s in task_scores], dtype=np.float64)
            out[b] = CandidateLabels(rows_M=rows_M, score_M=score_M)
            row = LabelRow(task_id=tasks[b].id, state=tasks[b].question,
                           answer=tasks[b].answers[0] if answer is None else answer,
                           candidate_ids=tuple(cands[b].ids[i] for i in rows_M),
                           logprob=tuple(float(s.logprob) for s in task_scores),
                           mean_logprob=tuple(float(x) for x in score_M),
                           n_tokens=tuple(int(s.n_tokens) for s in task_scores), planner=planner_name, prompt=prompt,
                           cosine=tuple(float(cands[b].scores_C[i]) for i in rows_M),
                           prompt_tokens=tuple(int(s.prompt_tokens) for s in task_scores))
            self._labels_handle.write(json.dumps(row.to_json(), ensure_ascii=False) + "\n")
            self.counters["labelled"] += 1
            self.counters[f"labelled_{kind}"] += 1
            self.counters["label_passes"] += len(task_scores)
            self.counters["score_calls"] += len(task_scores)
        self._labels_handle.flush()
        return out

    def _retain(self, bank: CaseBank, tasks: list[Task], outputs: list[PlanOutput], judged: list[tuple[float, str]],
                state_BD: np.ndarray, first_step: int) -> list[tuple[str | None, bool]]:
        """Retain: add each (question, output, reward) to the bank; ``(case id, duplicate)`` per task."""
        retained: list[tuple[str | None, bool]] = [(None, False)] * len(tasks)
        if not self.config.retain:
            return retained
        new_cases, rows = [], []
        for b, (task, out, (reward, _)) in enumerate(zip(tasks, outputs, judged)):
            if not out.text.strip():
                self.counters["not_retained"] += 1
                continue
            if self.retain_judge is not None:
                reward, _ = _judge_reward(self.retain_judge(task, out.text), self.retain_judge)
            meta: dict[str, Any] = {"task_id": task.id, "step": first_step + b, "policy": self.config.policy_kind}
            if self.config.systems.active:  # the builders' view: the judge's verdict and the environment
                meta.update(success=bool(judged[b][0] >= self.config.success_threshold), family=task_env(task))
            new_cases.append(Case(state=task.question, action=out.text, reward=reward, env=task.env, meta=meta))
            rows.append(b)
        if new_cases:
            before = len(bank)
            ids = bank.add(new_cases, state_BD[rows])
            fresh = set(bank.ids_at(range(before, len(bank))))
            new_ids = set(fresh)  # the loop below empties fresh
            for b, case_id in zip(rows, ids):
                retained[b] = (case_id, case_id not in fresh)
                fresh.discard(case_id)  # a repeat within the batch is a duplicate too
            self.counters["retained"] += len(bank) - before
            self.counters["duplicates"] += len(new_cases) - (len(bank) - before)
            if self.config.systems.active:
                self._build(bank, [tasks[b] for b in rows], new_cases, ids, new_ids)
        return retained

    def _build(self, bank: CaseBank, tasks: list[Task], cases: list[Case], ids: list[str], fresh: set[str]) -> None:
        """The memory systems after a round's answers were retained: each new answer joins a workflow cluster
        (LifeMem), each question with a success gets its tips (CFGM)."""
        self.systems.added(cases, ids)
        for task, case_id in zip(tasks, ids):
            if case_id in fresh:
                fresh.discard(case_id)
                self.systems.after_episode(bank, case_id)
            self.systems.after_answer(bank, task_id=task.id, env=task_env(task), question=task.question)

    def _record(self, b: int, task: Task, out: PlanOutput, judged: tuple[float, str], sel: Selection | None,
                retained: tuple[str | None, bool], *, first_step: int, version: int, bank_size: int,
                alpha: float | None, loss: float | None, ms: dict[str, float],
                credit: np.ndarray | None = None) -> StepRecord:
        reward, reason = judged
        self.counters["prompt_tokens"] += int(getattr(out, "prompt_tokens", 0) or 0)
        self.counters["output_tokens"] += int(getattr(out, "output_tokens", 0) or 0)
        success = reward >= self.config.success_threshold
        self.rewards.append(reward)
        self.successes.append(success)
        return StepRecord(
            step=first_step + b, task_id=task.id, family=task.family, state=task.question,
            candidate_ids=[] if sel is None else list(sel.candidate_ids),
            chosen_ids=[] if sel is None else list(sel.ids),
            propensities=[] if sel is None else [float(p) for p in sel.probs_K],
            set_propensity=None if sel is None else float(sel.set_prob),
            greedy=None if sel is None else bool(sel.greedy),
            output=out.text, reward=reward, success=bool(success), reason=reason, done=True, retained_id=retained[0],
            duplicate=retained[1], policy=self.config.policy_kind, policy_version=version, bank_size=bank_size,
            entropy=0.0 if sel is None else _entropy(sel.probs_C), alpha=alpha, loss=loss, time=time.time(), ms=ms,
            case_credit=None if credit is None else [float(c) for c in credit],
            candidate_probs=None if sel is None else [float(p) for p in sel.probs_C])

    # ------------------------------------------------------------------ summary

    def _summary(self, bank: CaseBank, wall_s: float, resumed_from: int | None, has_model: bool) -> dict[str, Any]:
        cfg = self.config
        steps = len(self.rewards)
        success_T = np.asarray(self.successes, dtype=np.float64)
        ms = {name: self.ms_totals[name] / max(1, steps) for name in COMPONENTS}
        ms["total"] = sum(ms.values())
        ms["overhead"] = ms["total"] - ms["plan"] - ms["judge"]
        return {
            "policy": cfg.policy_kind, "steps": steps, "llm_calls": int(self.counters["llm_calls"]),
            "score_calls": int(self.counters.get("score_calls", 0)),
            "success_rate": float(success_T.mean()) if steps else 0.0,
            "success_by_window": success_by_window(success_T, cfg.window),
            "moving_success_rate": float(moving_average(success_T, cfg.window)[-1]) if steps else 0.0,
            "window": cfg.window, "cumulative_reward": float(np.sum(self.rewards)),
            "bank_size_start": int(self.bank_size_start), "bank_size_end": len(bank),
            "retained": int(self.counters["retained"]), "duplicates": int(self.counters["duplicates"]),
            "not_retained": int(self.counters["not_retained"]),
            "prompt_tokens": int(self.counters["prompt_tokens"]),
            "output_tokens": int(self.counters["output_tokens"]),
            "memory_tokens": int(self.counters.get("memory_tokens", 0)),
            **({"labels": self._label_summary(steps, ms)} if labels_config(cfg) is not None else {}),
            "ms_per_step": ms, "updates": int(self.policy.version), "final_alpha": self.policy.alpha,
            "seed": cfg.seed, "batch_size": cfg.batch_size, "k": cfg.k, "candidates": cfg.candidates,
            "resumed_from": resumed_from, "wall_s": wall_s,
            "selector": RunDir.SELECTOR if has_model else None,
            **({"systems": self.systems.stats()} if cfg.systems.active else {}),
        }


    def _label_summary(self, steps: int, ms: dict[str, float]) -> dict[str, Any]:
        """What the online labels cost: tasks labelled (by target), scored prompts (forward passes of one
        sequence) per task, label milliseconds per task and their ratio to a step's planner call."""
        passes = int(self.counters.get("label_passes", 0))
        return {"file": RunDir.LABELS, "labelled": int(self.counters.get("labelled", 0)),
                "gold": int(self.counters.get("labelled_gold", 0)),
                "hindsight": int(self.counters.get("labelled_hindsight", 0)),
                "forward_passes": passes, "forward_passes_per_task": passes / max(1, steps),
                "ms_per_task": ms["label"], "label_over_plan": ms["label"] / ms["plan"] if ms["plan"] > 0 else None}


def run_online(config: LoopConfig, **kwargs: Any) -> dict[str, Any]:
    """``OnlineLoop(config, **kwargs).run()``: run one policy over the stream; returns the summary."""
    return OnlineLoop(config, **kwargs).run()
