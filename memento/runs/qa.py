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
``memento.policies.make_policy``); the loop calls only its ``select`` and ``observe``. ``soft_q`` records each
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
:class:`memento.formats.StepRecord`: the transition log of docs/formats.md.

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

**Structure.** The run (seeds, run directory, bank, policy, checkpoints, resume, TensorBoard, progress, summary)
is :class:`memento.runs.base.Run`'s; :class:`OnlineLoop` declares its ``RunSpec`` and writes a round's two halves:
``_act`` (encode -> candidates -> select -> plan -> judge -> credit -> labels scored, the planner's part being
:func:`rollout`, which the Ray rollout workers call too; it writes nothing) and ``_commit`` (labels written ->
retain -> observe -> usage -> log, which the Ray driver calls with a worker's result); CFGM's focus point of a new
environment goes into the bank before the round acts (``_begin``).

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
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import numpy as np
import torch

from memento.bank import Candidates
from memento.bank.protocol import Bank
from memento.bank.uri import open_bank
from memento.config import (
    MAX_BATCH,
    MAX_STEPS,
    EvidenceConfig,
    OnlineLabelsConfig,
    SetChoiceConfig,
    check,
    check_choice,
    check_float,
    check_int,
)
from memento.errors import CheckpointError, ConfigError, DataFormatError
from memento.formats import StepRecord, read_steps_jsonl
from memento.judges import first_line
from memento.learn.evidence import lookalike_advantage
from memento.learn.policy import CandidateLabels, Observation, PolicyFactory
from memento.policies import PolicyConfig, PolicyKind, SoftQConfig, loop_policy
from memento.runs.base import (
    Run,
    RunConfig,
    RunSpec,
    encode_checked,
    restore_bank,
    run_bank,
    selection_fields,
    task_order,
    timed,
    torch_seed,
)
from memento.runs.rundir import RunDir
from memento.systems.items import ItemGraph, memory_tokens
from memento.types import Case, Selection, Task

if TYPE_CHECKING:  # the planners package (LLM clients) is imported only when a run plans
    from memento.planners.base import Planner, PlanOutput

__all__ = ["COMPONENTS", "Acted", "LoopConfig", "OnlineLoop", "check_seed_bank", "encode_checked",
           "leave_one_out_credit", "plan_outputs", "restore_bank", "rollout", "run_bank", "run_online",
           "qa_policy", "success_by_window", "task_env", "task_order", "tasks_fingerprint", "torch_seed",
           "without_labels"]

logger = logging.getLogger(__name__)

Credit = Literal["shared", "leave_one_out"]
"""How a task's reward is credited to the K shown cases (``LoopConfig.credit``)."""

COMPONENTS = ("encode", "candidates", "select", "plan", "judge", "credit", "label", "retain", "learn", "usage",
              "log", "checkpoint")
"""Where a step's time goes; ``summary.json`` reports the mean milliseconds per step of each."""

RESUMABLE_CHANGES = ("steps", "checkpoint_every", "tensorboard")
"""LoopConfig fields a resumed run may change; any other difference is refused."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoopConfig(RunConfig):
    """One online run (see the module docstring for the step and batch semantics).

    - ``steps``: tasks (= LLM calls) to run; ``k``: cases shown per task; ``candidates``: C, the size
      of the cosine pre-selection the policy chooses from (``k <= C``);
    - ``policy``: the policy's config (:data:`memento.policies.PolicyConfig`: ``qa_policy("soft_q")`` (default),
      ``SimilarityConfig``, ``RandomConfig`` or ``LinUCBConfig``; :func:`qa_policy` gives the loop's
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

    The fields shared with the game loop (``k``, ``candidates``, ``policy``, ``seed``, ``shuffle``, ``index``,
    ``window``, ``checkpoint_every``, ``tensorboard``, ``learn``, ``systems``) and their checks are
    :class:`~memento.runs.base.RunConfig`'s.
    """

    policy: PolicyConfig = dataclasses.field(default_factory=lambda: qa_policy("soft_q"))
    steps: int = dataclasses.field(default=500, metadata={"help": "tasks (LLM calls) per policy"})
    batch_size: int = dataclasses.field(default=1, metadata={"help": (
        "tasks selected with the same policy parameters and planned together")})
    retain: bool = True
    success_threshold: float = 0.5
    credit: Credit = dataclasses.field(default="shared", metadata={"help": (
        "how a task's reward reaches the K shown cases: shared (each gets it), or leave_one_out (the planner scores "
        "the gold answer with each case left out: K + 1 forward passes; needs a scoring planner)")})
    credit_temperature: float = 1.0

    def __post_init__(self) -> None:
        cls = type(self)
        check_int(self, "steps", 1, MAX_STEPS)
        super().__post_init__()
        if isinstance(self.policy, SoftQConfig):
            check(self.policy.learner.gamma == 0.0, cls, "policy", f"learner.gamma={self.policy.learner.gamma}",
                  "the online loop is single-step: learner.gamma must be 0")
        check_int(self, "batch_size", 1, MAX_BATCH)
        check(isinstance(self.retain, bool), cls, "retain", self.retain, "must be true or false")
        check_float(self, "success_threshold")
        check_choice(self, "credit", Credit)
        check_float(self, "credit_temperature", low=0.0, low_open=True)
        check(not self.systems.reflect and self.systems.retries == 0, cls, "systems",
              f"reflect={self.systems.reflect}, retries={self.systems.retries}",
              "key-information reflection and retries are for multi-step games (memento play); a question has "
              "no observation to reflect on")


# ---------------------------------------------------------------- helpers


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



def check_seed_bank(path: str | Path) -> None:
    """Read a seed bank whole, as a run will (every case and its provenance links), so that a damaged bank is a
    one-line :class:`~memento.errors.MementoError` before a command writes anything."""
    with open_bank(path, read_only=True) as bank:
        ItemGraph(bank.iter_cases()).check()



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


DEFAULT_LABELS = 8
"""Candidates the QA loop's default soft-Q labels per labelled step (``OnlineLabelsConfig.m``)."""


def qa_policy(kind: PolicyKind) -> PolicyConfig:
    """The QA loop's default config of each policy kind: :func:`loop_policy`'s, and for soft-Q also per-case
    evidence (:class:`~memento.config.EvidenceConfig`), look-alikes kept apart once the evidence tells them apart
    (:class:`~memento.config.SetChoiceConfig`, ``redundancy``; K cases: the learned size, ``sizes="reward"``, cost
    ``elements-real`` 8 points late, docs/benchmarks.md, issue 39) and online labels of its top
    :data:`DEFAULT_LABELS` candidates on the informative steps (:class:`~memento.config.OnlineLabelsConfig`; a run
    whose planner cannot score turns them off and says so)."""
    policy = loop_policy(kind)
    if not isinstance(policy, SoftQConfig):
        return policy
    return dataclasses.replace(policy, labels=OnlineLabelsConfig(m=DEFAULT_LABELS), evidence=EvidenceConfig(),
                               sets=SetChoiceConfig())


def without_labels(policy: Any) -> Any:
    """A soft-Q policy config with its online labels off (``labels.m = 0``); any other policy config as it is."""
    if not isinstance(policy, SoftQConfig):
        return policy
    return dataclasses.replace(policy, labels=dataclasses.replace(policy.labels, m=0))


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



def plan_outputs(planner: Any, tasks: Sequence[Task], shown: Sequence[Sequence[Case]]) -> list[PlanOutput]:
    """The planner's outputs for ``tasks`` (``plan`` for one task, one ``plan_many`` call for more), a plain string
    taken as its text; a wrong count or type is a :class:`~memento.planners.base.PlannerError`."""
    from memento.planners.base import PlannerError, PlanOutput  # not at import: loading a selector needs none

    raw = [planner.plan(tasks[0], shown[0])] if len(tasks) == 1 else list(planner.plan_many(tasks, shown))
    if len(raw) != len(tasks):
        raise PlannerError(f"planner {planner!r} returned {len(raw)} outputs for {len(tasks)} tasks")
    outputs = []
    for out in raw:
        if isinstance(out, str):
            out = PlanOutput(text=out)
        if not isinstance(getattr(out, "text", None), str):
            raise PlannerError(f"planner {planner!r} returned {type(out).__name__}, expected PlanOutput")
        outputs.append(out)
    return outputs


def rollout(planner: Any, judge: Callable[[Task, str], Any], tasks: Sequence[Task],
            prompts: Sequence[Sequence[Case]], shown: Sequence[Sequence[Case]], *, credit: Credit,
            temperature: float, ms: dict[str, float]) -> tuple[list[PlanOutput], list[tuple[float, str]],
                                                                list[np.ndarray | None], int]:
    """The planner's half of a round's act, in the loop and in a rollout worker alike: plan each task with its
    ``prompts`` -> judge each output -> (``credit="leave_one_out"``) the credit of each ``shown`` case; returns the
    outputs, the judged ``(reward, reason)``, the credit (``None`` per task for shared credit) and the prompts
    scored for it; the seconds go to ``ms["plan"]``, ``ms["judge"]``, ``ms["credit"]``."""
    with timed(ms, "plan"):
        outputs = plan_outputs(planner, tasks, prompts)
    with timed(ms, "judge"):
        judged = [_judge_reward(judge(task, out.text), judge) for task, out in zip(tasks, outputs)]
    with timed(ms, "credit"):
        if credit != "leave_one_out":
            return outputs, judged, [None] * len(tasks), 0
        case_credit, score_calls = leave_one_out_credit(planner, tasks, shown, temperature)
    return outputs, judged, case_credit, score_calls



# ---------------------------------------------------------------- the loop


class Round(NamedTuple):
    """One policy-update round: the tasks of stream positions ``start_step`` to ``stop - 1`` (``tasks``, once the
    order was read)."""

    start_step: int
    stop: int
    tasks: tuple[Task, ...] = ()


class LabelWrite(NamedTuple):
    """A ``labels.jsonl`` row the round's act scored and its commit writes: the row, its target (``gold`` or
    ``hindsight``) and the prompts scored for it."""

    row: dict[str, Any]
    target: str
    passes: int


@dataclasses.dataclass
class Acted:
    """What a round's act gave its commit: per task its state vector, candidates, the policy's selection (``None``
    without candidates), the cases shown, the planner's output, the judged ``(reward, reason)``, the leave-one-out
    credit and the online labels (``None`` when there are none); the policy version and temperature that chose,
    the bank's size then, the seconds per component so far, the prompts scored, the memory tokens shown and the
    ``labels.jsonl`` rows to write."""

    tasks: list[Task]
    first_step: int
    state_BD: np.ndarray
    candidates: list[Candidates]
    selections: list[Selection | None]
    outputs: list[Any]
    judged: list[tuple[float, str]]
    credit: list[np.ndarray | None]
    labels: list[CandidateLabels | None]
    version: int
    alpha: float | None
    bank_size: int
    ms: dict[str, float]
    score_calls: int = 0
    memory_tokens: int = 0
    label_rows: list[LabelWrite] = dataclasses.field(default_factory=list)


class OnlineLoop(Run):
    """Memento's Algorithm 1 over a task stream (see the module docstring).

    - ``make_policy``: ``(policy config, PolicyContext) -> Policy``, e.g. ``memento.policies.make_policy``;
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

    The run itself (seeds, run directory, checkpoints, resume, TensorBoard, summary) is
    :class:`~memento.runs.base.Run`'s; this class writes a round's :meth:`_act` and :meth:`_commit`.
    """

    SPEC = RunSpec(name="question-answering", config=LoopConfig, length="steps", components=COMPONENTS,
                   counters=("llm_calls", "score_calls", "retained", "duplicates", "not_retained", "prompt_tokens",
                             "output_tokens", "memory_tokens", "labelled", "labelled_gold", "labelled_hindsight",
                             "label_passes"),
                   resumable=RESUMABLE_CHANGES, logs=(RunDir.STEPS, RunDir.LABELS), trajectory=own_answer)

    def __init__(self, config: LoopConfig, *, make_policy: PolicyFactory, encoder: Any, planner: Planner,
                 judge: Callable[[Task, str], Any], tasks: Sequence[Task], out_dir: str | Path,
                 bank_dir: str | Path | None = None, seed_cases: Sequence[Case] | None = None,
                 device: str | torch.device = "cpu", resume: bool = False, progress: bool = False,
                 retain_judge: Callable[[Task, str], Any] | None = None):
        if isinstance(config, LoopConfig) and labels_config(config) is not None:
            from memento.planners.base import can_score

            if not can_score(planner):  # labels are on by default: a planner without log-probabilities runs without
                logger.warning("online labels off: the planner %r gives no log-probabilities (score_many); soft_q "
                               "learns from the rewards alone", planner)
                config = dataclasses.replace(config, policy=without_labels(config.policy))
        super().__init__(config, make_policy=make_policy, encoder=encoder, planner=planner, out_dir=out_dir,
                         bank_dir=bank_dir, device=device, resume=resume, progress=progress)
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
        self.judge = judge
        self.retain_judge = retain_judge
        self.tasks = tasks
        self.seed_cases = None if seed_cases is None else list(seed_cases)

    # ------------------------------------------------------------------ the skeleton's hooks

    def _stream(self) -> tuple[int, str]:
        return len(self.tasks), tasks_fingerprint(self.tasks)

    def _reset(self) -> None:
        self.rewards: list[float] = []
        self.successes: list[bool] = []
        self._focus_asked: set[str] = set()
        self._listwise: float | None = None  # the last round's listwise loss (online labels)

    def _logs(self) -> list[Path]:
        return [self.run_dir.steps] + ([self.run_dir.labels] if labels_config(self.config) is not None else [])

    def _make_bank(self) -> Bank:
        """A fresh ``out_dir/bank``: a copy of ``bank_dir``, the encoded seed cases, or empty."""
        bank = super()._make_bank()
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

    def _resumed(self, ckpt: Path, state: dict[str, Any]) -> None:
        records = read_steps_jsonl(self.run_dir.steps)
        self.rewards = [float(record.reward) for record in records]
        self.successes = [bool(record.success) for record in records]
        if len(self.rewards) != self.step:
            raise CheckpointError(f"{ckpt}: steps.jsonl holds {len(self.rewards)} records for step {self.step}")

    def _run_info(self) -> dict[str, Any]:
        return {**super()._run_info(), "judge": repr(self.judge),
                "retain_judge": None if self.retain_judge is None else repr(self.retain_judge),
                "n_tasks": len(self.tasks), "seed_cases": None if self.seed_cases is None else len(self.seed_cases)}

    def _recent(self) -> deque[float]:
        return deque(self.successes[-self.config.window:], maxlen=self.config.window)

    def _round(self, start: int) -> Round:
        """The round starting at ``start``: a batch never crosses a multiple of ``batch_size``, so a resumed run
        batches the same way."""
        cfg = self.config
        return Round(start, min(cfg.steps, (start // cfg.batch_size + 1) * cfg.batch_size))

    def _next_unit(self) -> Round:
        unit = self._round(self.step)
        return unit._replace(tasks=tuple(self.tasks[i] for i in self.order[unit.start_step:unit.stop]))

    def _begin(self, bank: Bank, unit: Round) -> None:
        """CFGM: the focus point of each new environment of the round, before its tasks retrieve (nothing without
        the memory systems)."""
        t0 = time.perf_counter()
        for task in unit.tasks:
            self._ensure_focus(bank, task)
        self.ms_totals["candidates"] += (time.perf_counter() - t0) * 1000.0

    # ------------------------------------------------------------------ act: a round's choices and outcomes

    def _act(self, bank: Bank, unit: Round) -> Acted:
        """One policy-update round over the tasks of ``unit`` (B >= 1): encode -> candidates -> select -> plan ->
        judge -> credit -> online labels (scored, not yet written)."""
        tasks = list(unit.tasks)
        ms: dict[str, float] = {}
        state_BD, cands, bank_size = self._prepare(bank, tasks, ms)
        with timed(ms, "select"):
            version, alpha = self.policy.version, self.policy.alpha
            selections = self._select(state_BD, cands)
        with timed(ms, "plan"):
            shown = [bank.get(list(sel.ids)) if sel is not None else [] for sel in selections]
            prompts = [self.systems.prompt_cases(task.question, cases) for task, cases in zip(tasks, shown)]
        cfg = self.config
        outputs, judged, credit, score_calls = rollout(self.planner, self.judge, tasks, prompts, shown,
                                                       credit=cfg.credit, temperature=cfg.credit_temperature, ms=ms)
        self._check_rewards(tasks, judged)
        with timed(ms, "label"):
            labels, label_rows = self._labels(bank, tasks, cands, selections, outputs, judged, unit.start_step)
        return Acted(tasks=tasks, first_step=unit.start_step, state_BD=state_BD, candidates=cands,
                     selections=selections, outputs=outputs, judged=judged, credit=credit, labels=labels,
                     label_rows=label_rows,
                     version=version, alpha=alpha, bank_size=bank_size, ms=ms, score_calls=score_calls,
                     memory_tokens=sum(memory_tokens(cases) for cases in prompts))

    def _prepare(self, bank: Bank, tasks: list[Task], ms: dict[str, float]
                 ) -> tuple[np.ndarray, list[Candidates], int]:
        """The tasks' state vectors, their candidates (CFGM's focus points are in the bank already:
        :meth:`_begin`) and the bank's size."""
        with timed(ms, "encode"):
            state_BD = self._encode([task.question for task in tasks])
        with timed(ms, "candidates"):
            bank_size = len(bank)
            cands = [self.systems.candidates(bank, state_BD[b], self.config.candidates, env=task_env(task),
                                             same_env=False) for b, task in enumerate(tasks)]
        return state_BD, cands, bank_size

    def _ensure_focus(self, bank: Bank, task: Task) -> None:
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

    def _check_rewards(self, tasks: Sequence[Task], judged: Sequence[tuple[float, str]]) -> None:
        """Every reward within the range the policy learns from (``policy.reward_range``; ``None``: any)."""
        bounds = self.policy.reward_range
        if bounds is None:
            return
        for task, (reward, _) in zip(tasks, judged):
            if not bounds[0] <= reward <= bounds[1]:
                raise DataFormatError(f"judge {self.judge!r} gave reward {reward} for task {task.id!r}; the "
                                      f"{self.config.policy_kind} policy learns from rewards in "
                                      f"[{bounds[0]:g}, {bounds[1]:g}] (single-step, cross-entropy)")

    def _labels(self, bank: Bank, tasks: list[Task], cands: list[Candidates], selections: list[Selection | None],
                outputs: list[PlanOutput], judged: list[tuple[float, str]], first_step: int
                ) -> tuple[list[CandidateLabels | None], list[LabelWrite]]:
        """Online labels (``SoftQConfig.labels``): for each task of the round on a labelled step (every
        ``labels.every``-th, and an informative one, :meth:`_label_rows`) with a target (the gold answer, or the
        planner's own rewarded output), the candidates the policy ranked highest, each scored alone, and the
        policy's ranked prefixes of a few set sizes (set-level labels, ``SoftQConfig.sets``), with the planner in
        one ``score_many`` call; also the rows the commit writes to ``labels.jsonl`` (the format of ``memento
        score``, :meth:`_write_labels`)."""
        lcfg = labels_config(self.config)
        out: list[CandidateLabels | None] = [None] * len(tasks)
        written_rows: list[LabelWrite] = []
        if lcfg is None:
            return out, written_rows
        from memento.learn.labels import LabelRow
        from memento.runs.labels import prompt_name  # not at import: it reaches the planners package
        rows, case_sets, answers, kinds, picked, set_rows = [], [], [], [], [], []
        label_sets = getattr(self.policy, "label_sets", None)
        passes = int(self.counters.get("label_passes", 0))  # the budget's count, with this round's planned ones
        for b, (task, sel) in enumerate(zip(tasks, selections)):
            if sel is None or (first_step + b) % lcfg.every:
                continue
            if lcfg.target == "gold" and task.answers:
                answer, kind = None, "gold"
            elif judged[b][0] >= self.config.success_threshold and first_line(outputs[b].text):
                answer, kind = first_line(outputs[b].text), "hindsight"  # what the judges read
            else:
                continue
            rows_M = self._label_rows(bank, cands[b], sel, judged[b], lcfg)
            if rows_M is None:
                continue
            # set-level labels: the policy's ranked prefixes of a few sizes (size 1, its top case, is scored already)
            sets = [prefix for prefix in (label_sets(sel, cands[b], self.config.k) if label_sets else [])
                    if len(prefix) > 1]
            if lcfg.budget is not None and passes + len(rows_M) + len(sets) > lcfg.budget * (first_step + b + 1):
                continue
            passes += len(rows_M) + len(sets)
            rows.append(b)
            picked.append(rows_M)
            set_rows.append(sets)
            singles = [[case] for case in bank.get([cands[b].ids[i] for i in rows_M])]
            case_sets.append(singles + [bank.get([cands[b].ids[i] for i in prefix]) for prefix in sets])
            answers.append(answer)
            kinds.append(kind)
        if not rows:
            return out, written_rows
        scores = self.planner.score_many([tasks[b] for b in rows], case_sets, answers)
        planner_name, prompt = repr(self.planner), prompt_name(self.planner)
        for b, rows_M, all_scores, sets, answer, kind in zip(rows, picked, scores, set_rows, answers, kinds):
            per_token = [s.logprob / max(1, s.n_tokens) for s in all_scores]
            task_scores = all_scores[:len(rows_M)]
            score_M = np.asarray(per_token[:len(rows_M)], dtype=np.float64)
            label_sets_S = [(int(rows_M[0]),)] + [tuple(prefix) for prefix in sets] if sets else []
            set_score_S = np.asarray(per_token[:1] + per_token[len(rows_M):], dtype=np.float64) \
                if sets else None
            out[b] = CandidateLabels(rows_M=rows_M, score_M=score_M, sets=tuple(label_sets_S), set_score_S=set_score_S)
            # the row format keeps the sets whose cases are all among the row's candidates (memento score's)
            written = [i for i, rows_S in enumerate(label_sets_S) if set(rows_S) <= set(rows_M.tolist())]
            row = LabelRow(task_id=tasks[b].id, state=tasks[b].question,
                           answer=tasks[b].answers[0] if answer is None else answer,
                           candidate_ids=tuple(cands[b].ids[i] for i in rows_M),
                           logprob=tuple(float(s.logprob) for s in task_scores),
                           mean_logprob=tuple(float(x) for x in score_M),
                           n_tokens=tuple(int(s.n_tokens) for s in task_scores), planner=planner_name, prompt=prompt,
                           cosine=tuple(float(cands[b].scores_C[i]) for i in rows_M),
                           prompt_tokens=tuple(int(s.prompt_tokens) for s in task_scores),
                           **({"sets": tuple(tuple(cands[b].ids[i] for i in label_sets_S[j]) for j in written),
                               "set_logprob": tuple(float(all_scores[0].logprob) if j == 0 else
                                                    float(all_scores[len(rows_M) + j - 1].logprob)
                                                    for j in written)} if len(written) > 1 else {}))
            written_rows.append(LabelWrite(row=row.to_json(), target=kind, passes=len(all_scores)))
        return out, written_rows

    def _write_labels(self, rows: Sequence[LabelWrite]) -> None:
        """A round's online labels into ``labels.jsonl``, with their counts."""
        if not rows:
            return
        labels_handle = self.handles[self.run_dir.labels]
        for label in rows:
            labels_handle.write(json.dumps(label.row, ensure_ascii=False) + "\n")
            self.counters["labelled"] += 1
            self.counters["labelled_gold" if label.target == "gold" else "labelled_hindsight"] += 1
            self.counters["label_passes"] += label.passes
            self.counters["score_calls"] += label.passes
        labels_handle.flush()

    def _label_rows(self, bank: Bank, candidates: Candidates, selection: Selection, judged: tuple[float, str],
                    lcfg: OnlineLabelsConfig) -> np.ndarray | None:
        """The candidates (rows) a step's labels score, best-ranked first, or ``None`` for an unlabelled step.

        The ``m`` candidates the policy ranked highest over the pool it chose from; with ``when="always"`` all of
        them. With ``"informative"`` only where a label can teach something: the step failed or showed a case never
        labelled, and among the ``m`` some were never labelled; then those are scored, beside the top-ranked one
        (a reference, scored either way) and, with per-case evidence, their look-alikes among the ``m`` (cosine >=
        ``1 - 2 * bandwidth``: what their advantage is measured against)."""
        pool_rows_P = candidates.rows_of(list(selection.candidate_ids))
        order_P = np.argsort(-np.asarray(selection.probs_C, dtype=np.float64), kind="stable")[:lcfg.m]
        rows_M = pool_rows_P[order_P]
        if lcfg.when == "informative" and rows_M.size >= 2:
            count_M, _, _ = bank.evidence_at(candidates.positions_C[rows_M])
            count_K, _, _ = bank.evidence_at(candidates.positions_C[candidates.rows_of(list(selection.ids))])
            failed = judged[0] < self.config.success_threshold
            if not (count_M == 0).any() or not (failed or (count_K == 0).any()):
                return None
            keep_M = count_M == 0
            keep_M[0] = True
            policy = self.config.policy
            if isinstance(policy, SoftQConfig) and policy.evidence.active:  # and the look-alikes of the new ones
                emb_MD = np.asarray(candidates.embeddings_CD, dtype=np.float64)[rows_M]
                near_MM = emb_MD @ emb_MD.T >= 1.0 - 2.0 * policy.evidence.bandwidth
                keep_M |= near_MM[:, count_M == 0].any(axis=1)
            rows_M = rows_M[keep_M]
        return rows_M if rows_M.size >= 2 else None

    # ------------------------------------------------------------------ commit: what a round changes

    def _commit(self, bank: Bank, acted: Acted) -> list[StepRecord]:
        """Labels -> retain -> observe -> usage -> log, in stream order; the records of the round (also in
        ``steps.jsonl`` and on TensorBoard). Also the commit of a rollout worker's round (:mod:`memento.runs.ray`)."""
        ms, first_step, tasks = acted.ms, acted.first_step, acted.tasks
        with timed(ms, "label"):
            self._write_labels(acted.label_rows)
        with timed(ms, "retain"):
            retained = self._retain(bank, tasks, acted.outputs, acted.judged, acted.state_BD, first_step)
        with timed(ms, "learn"):
            observations = [Observation(state_D=acted.state_BD[b], candidates=acted.candidates[b], selection=sel,
                                        reward=acted.judged[b][0], step=first_step + b, policy_version=acted.version,
                                        case_rewards_K=acted.credit[b], labels=acted.labels[b])
                            for b, sel in enumerate(acted.selections) if sel is not None]
            learned = self.policy.observe(observations) if self.config.learn else {}
            loss, self._listwise = learned.get("loss"), learned.get("listwise")
        with timed(ms, "usage"):
            for obs in observations:  # the usage statistics of the case features, after the policy saw the round
                bank.record_usage(obs.step, list(obs.selection.ids), obs.reward)
            self._record_evidence(bank, observations)
        self.counters["llm_calls"] += len(tasks)
        self.counters["score_calls"] += acted.score_calls
        self.counters["memory_tokens"] += acted.memory_tokens
        for name, seconds in ms.items():
            self.ms_totals[name] += seconds * 1000.0
        per_task_ms = {name: round(seconds * 1000.0 / len(tasks), 4) for name, seconds in ms.items()}
        records = [self._record(b, acted, retained[b], loss, per_task_ms) for b in range(len(tasks))]
        self._log(records)
        self.step = first_step + len(tasks)
        return records

    def _record_evidence(self, bank: Bank, observations: Sequence[Observation]) -> None:
        """Per-case evidence (``SoftQConfig.evidence``): each labelled case's label advantage over its look-alike
        rivals (:func:`memento.learn.evidence.lookalike_advantage`) into the bank, after the policy saw the round
        (so a label is read as evidence from the next round on)."""
        policy = self.config.policy
        if not isinstance(policy, SoftQConfig) or not policy.evidence.active:
            return
        for obs in observations:
            if obs.labels is None or len(obs.labels.rows_M) < 2:
                continue
            rows_M = np.asarray(obs.labels.rows_M, dtype=np.int64)
            emb_MD = np.asarray(obs.candidates.embeddings_CD)[rows_M]
            weight_M, value_M = lookalike_advantage(obs.labels.score_M, emb_MD, policy.evidence.bandwidth)
            bank.record_evidence(obs.step, [obs.candidates.ids[i] for i in rows_M], weight_M, value_M)

    def _log(self, records: list[StepRecord]) -> None:
        """The round's records into ``steps.jsonl`` and onto TensorBoard."""
        t0 = time.perf_counter()
        steps_handle = self.handles[self.run_dir.steps]
        for record in records:
            steps_handle.write(json.dumps(record.to_json(), ensure_ascii=False) + "\n")
            self.recent.append(record.success)
            if self.writer is not None:
                self._log_scalars(self.writer, record, float(np.mean(self.recent)))
        steps_handle.flush()
        self.ms_totals["log"] += (time.perf_counter() - t0) * 1000.0

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

    def _retain(self, bank: Bank, tasks: list[Task], outputs: list[PlanOutput], judged: list[tuple[float, str]],
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
            meta.update(self.systems.answer_meta(success=bool(judged[b][0] >= self.config.success_threshold),
                                                 family=task_env(task)))
            new_cases.append(Case(state=task.question, action=out.text, reward=reward, env=task.env, meta=meta))
            rows.append(b)
        if new_cases:
            before = len(bank)
            ids = bank.add(new_cases, state_BD[rows], update_meta=False)  # a repeat keeps the stored case (resume)
            fresh = set(bank.ids_at(range(before, len(bank))))
            new_ids = set(fresh)  # the loop below empties fresh
            for b, case_id in zip(rows, ids):
                retained[b] = (case_id, case_id not in fresh)
                fresh.discard(case_id)  # a repeat within the batch is a duplicate too
            self.counters["retained"] += len(bank) - before
            self.counters["duplicates"] += len(new_cases) - (len(bank) - before)
            self._build(bank, [tasks[b] for b in rows], new_cases, ids, new_ids)
        return retained

    def _build(self, bank: Bank, tasks: list[Task], cases: list[Case], ids: list[str], fresh: set[str]) -> None:
        """The memory systems after a round's answers were retained: each new answer joins a workflow cluster
        (LifeMem), each question with a success gets its tips (CFGM); nothing without them."""
        self.systems.added(cases, ids)
        for task, case_id in zip(tasks, ids):
            if case_id in fresh:
                fresh.discard(case_id)
                self.systems.after_episode(bank, case_id)
            self.systems.after_answer(bank, task_id=task.id, env=task_env(task), question=task.question)

    def _record(self, b: int, acted: Acted, retained: tuple[str | None, bool], loss: float | None,
                ms: dict[str, float]) -> StepRecord:
        """Task ``b`` of the round as a ``steps.jsonl`` record (and its reward in the run's success curve)."""
        task, out, (reward, reason), credit = acted.tasks[b], acted.outputs[b], acted.judged[b], acted.credit[b]
        self.counters["prompt_tokens"] += int(getattr(out, "prompt_tokens", 0) or 0)
        self.counters["output_tokens"] += int(getattr(out, "output_tokens", 0) or 0)
        success = reward >= self.config.success_threshold
        self.rewards.append(reward)
        self.successes.append(success)
        return StepRecord(
            step=acted.first_step + b, task_id=task.id, family=task.family, state=task.question,
            **selection_fields(acted.selections[b]), output=out.text, reward=reward, success=bool(success),
            reason=reason, done=True, retained_id=retained[0], duplicate=retained[1], policy=self.config.policy_kind,
            policy_version=acted.version, bank_size=acted.bank_size, alpha=acted.alpha, loss=loss, time=time.time(),
            ms=ms, case_credit=None if credit is None else [float(c) for c in credit])

    # ------------------------------------------------------------------ summary

    def _summary(self, bank: Bank) -> dict[str, Any]:
        cfg = self.config
        steps = len(self.rewards)
        success_T = np.asarray(self.successes, dtype=np.float64)
        ms = self._ms_per_step(steps)
        ms["overhead"] = ms["total"] - ms["plan"] - ms["judge"]
        return {
            "steps": steps, "llm_calls": int(self.counters["llm_calls"]),
            "score_calls": int(self.counters["score_calls"]),
            "success_rate": float(success_T.mean()) if steps else 0.0,
            "success_by_window": success_by_window(success_T, cfg.window),
            "moving_success_rate": float(success_T[-cfg.window:].mean()) if steps else 0.0,
            "cumulative_reward": float(np.sum(self.rewards)), "not_retained": int(self.counters["not_retained"]),
            "prompt_tokens": int(self.counters["prompt_tokens"]), "output_tokens": int(self.counters["output_tokens"]),
            **({"labels": self._label_summary(steps, ms)} if labels_config(cfg) is not None else {}),
            "ms_per_step": ms, "batch_size": cfg.batch_size,
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
