"""Rollout workers for the online loop: ``memento online --workers N`` plans with N Ray actors.

**Who does what.** The *driver* (:class:`RayOnlineLoop`, an :class:`~memento.runs.qa.OnlineLoop`) keeps everything
that holds state: the case bank, the policy with its learner and replay buffer, the run directory, the logs and
the checkpoints. Each *worker* (:class:`RolloutWorker`, one Ray actor) holds its own planner and judge and a
read-only **snapshot** of the policy, and does the slow part of a step::

    driver, at dispatch:  encode the task -> bank.candidates(state, C) -> the candidates' cases, stored rewards
                          and (Q-network with case features) case vectors            = a WorkUnit
    worker:               policy snapshot .select(...) -> planner.plan(task, cases) -> judge(task, output)
                          (-> leave-one-out credit when configured)                   = a UnitResult
    driver, at commit:    retain -> policy.observe (replay + learner updates) -> usage -> steps.jsonl, TensorBoard
                          -> checkpoint every N steps

The driver sends the candidate set *with* the task rather than giving workers a view of the bank: the bank (an
SQLite file and an in-memory faiss index that the driver appends to every step) then has one reader and one
writer, workers need no encoder, no index and no shared file system, and a task's inputs are a plain value that
can be sent again, unchanged, when its worker dies. A work unit is one batch of the loop (``LoopConfig.batch_size``
tasks, planned with one ``plan_many`` call; one task by default).

**Snapshots.** A soft-Q snapshot is the Q-network's weights (``state_dict`` on the CPU), its config, the soft-max
temperature and the policy version (learner updates so far). The driver puts one in Ray's object store when the
learner has made ``sync_every`` updates since the last one (and at the first dispatch after each checkpoint);
each unit carries a reference to the current snapshot, and a worker fetches it only when its version changed. A
worker chooses exactly as :class:`~memento.learn.agent.SoftQAgent.select` does (it builds one around the snapshot, with
the unit's stored rewards for positive-only pools and its case vectors). Random and similarity policies have no
parameters: a worker builds them once. Policies that learn outside a Q-network (LinUCB) and the memory systems
(CFGM, LifeMem, PlugMem) run in-process only, and are refused here with one line.

**What a transition carries.** Each transition keeps the id it has in the task stream (its step), the candidate
ids, the policy's distribution over them (``candidate_probs``), the chosen ids with their first-draw propensities
and the set's Plackett-Luce probability, all *of the snapshot that chose*, and ``policy_version`` = that
snapshot's version, so ``steps.jsonl`` stays a correct log for off-policy evaluation. ``workers.jsonl`` has one
line per transition: the worker, the attempt, the snapshot version and the learner's version when it was
committed; their difference is the transition's staleness (also on TensorBoard as ``workers/staleness`` and in
``summary.json``).

**The schedule (commit order, and why it is deterministic).** Units are committed in stream order. Unit ``u`` is
dispatched right after the driver committed unit ``d(u) - 1``, where ``d(u) = max(u - N + 1, s(u))`` and ``s(u)``
is the first unit after the last checkpoint before ``u``: at most N units are in flight (one per worker, unit
``u`` on worker ``u mod N``), and no unit is dispatched across a checkpoint (the pipeline drains there, once every
``checkpoint_every`` steps). A unit therefore sees the bank and the policy exactly as they were after its
``d(u)`` predecessors were committed, whatever the timing, and each transition draws its cases from its own RNG
(``SeedSequence(seed, spawn_key=(4, step))``). A result that arrives out of order waits until its predecessors
are committed; a result for a unit already committed is dropped (counted, never logged twice).

**Faults.** Workers are actors with ``max_restarts``: a worker killed (SIGKILL, a lost node) is restarted by
Ray, its planner rebuilt, and the unit it held is sent again, unchanged, to the restarted worker; as its inputs
and its RNG are the unit's own, the transition it returns is the one the dead worker would have returned (with
a deterministic planner and judge). A driver killed with SIGKILL resumes with ``--resume`` from its last
checkpoint with :class:`~memento.runs.qa.OnlineLoop`'s own machinery (bank truncated to the checkpoint, policy,
replay buffer and ``steps.jsonl`` restored): a transition is *committed* once a checkpoint holds it; the ones
logged after the last checkpoint are run again and, because the schedule restarts at a checkpoint boundary,
come out the same.

**What is bit-exact.** With the same seed, the same worker count, a deterministic planner and judge, and the
CPU: the set of transitions (chosen ids, propensities, outputs, rewards, policy versions), the bank and the
Q-network are identical run to run, with a worker killed or not, and with a resumed driver. Not reproduced: the
timings (``time``, ``ms``), which worker ran a unit, and the attempt counts. Another worker count is another
schedule (other staleness), so other transitions; and a Ray run is not the in-process run (``--workers 1``),
which draws its selections from one RNG in stream order and always chooses with the newest policy.

``ray`` is an optional extra (``pip install 'memento-mdp[ray]'``), imported only when a run starts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from memento.config import QNetConfig, ReplayConfig, SoftQConfig, check, check_float, check_int, to_dict
from memento.errors import ConfigError, DataFormatError, MementoError, WorkerError
from memento.learn.agent import SoftQAgent
from memento.learn.learner import SoftQLearner
from memento.learn.policy import Observation, Policy, PolicyContext, PolicyFactory
from memento.learn.qnet import build_qnet
from memento.learn.replay import ReplayBuffer
from memento.memory import Candidates, CaseBank
from memento.runs.qa import LoopConfig, OnlineLoop, _judge_reward, leave_one_out_credit
from memento.runs.rundir import write_json
from memento.types import Case, Selection, Task

if TYPE_CHECKING:
    from memento.planners.base import PlanOutput

__all__ = ["WORKERS_LOG", "WORKER_KINDS", "PolicySnapshot", "RayOnlineLoop", "RolloutWorker", "UnitResult",
           "WorkUnit", "WorkerError", "WorkerSetup", "WorkersConfig", "import_ray", "ray_runtime", "read_workers_log",
           "worker_loop_class"]

logger = logging.getLogger(__name__)

WORKER_KINDS = ("random", "similarity", "soft_q")
"""Policy kinds the workers can run (their choice depends only on a snapshot and the candidates)."""

SELECTION_STREAM = 4
"""``SeedSequence(seed, spawn_key=(SELECTION_STREAM, step))`` draws transition ``step``'s cases (the loop's own
streams are spawn keys 0-3)."""

WORKERS_LOG = "workers.jsonl"
"""One line per committed transition in the run directory: worker, attempt, snapshot and learner versions."""

RAY_EXTRA = "pip install 'memento-mdp[ray]'"

RESTART_POLL_S = 0.25
"""Seconds between two questions to a restarting worker whether it is back."""


def import_ray() -> Any:
    """The ``ray`` module, or one :class:`ConfigError` line naming the extra."""
    try:
        import ray
    except ImportError:
        raise ConfigError(f"rollout workers (--workers N > 1) need Ray: {RAY_EXTRA}") from None
    return ray


@dataclasses.dataclass(frozen=True, kw_only=True)
class WorkersConfig:
    """The rollout workers of one run (see the module docstring).

    - ``workers``: Ray actors, each with its own planner and judge (>= 1; the CLI uses this class for N >= 2);
    - ``sync_every``: learner updates between two policy snapshots sent to the workers (1: every update);
    - ``address``: a Ray cluster to join (``ray.init(address=...)``, e.g. ``"auto"`` or ``"ray://host:10001"``);
      ``None`` starts a local Ray with ``max(cpu count, workers * worker_cpus)`` logical CPUs;
    - ``worker_cpus`` / ``worker_gpus``: resources each actor asks for (a local transformers planner on a GPU
      wants ``worker_gpus=1``; an HTTP planner needs little);
    - ``max_restarts``: how often Ray restarts a dead worker (its unfinished unit is sent again each time);
    - ``ready_timeout_s``: seconds to wait for the workers to build their planners.
    """

    workers: int = 2
    sync_every: int = 1
    address: str | None = None
    worker_cpus: float = 1.0
    worker_gpus: float = 0.0
    max_restarts: int = 3
    ready_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        cls = type(self)
        check_int(self, "workers", 1)
        check_int(self, "sync_every", 1)
        check(self.address is None or (isinstance(self.address, str) and bool(self.address.strip())), cls,
              "address", self.address, "must be null (a local Ray) or a Ray address")
        check_float(self, "worker_cpus", low=0.0)
        check_float(self, "worker_gpus", low=0.0)
        check_int(self, "max_restarts", 0)
        check_float(self, "ready_timeout_s", low=0.0, low_open=True)


@contextlib.contextmanager
def ray_runtime(config: WorkersConfig) -> Iterator[Any]:
    """Ray for the duration of the block: joined at ``config.address``, or a local one started (and shut down at
    the end); an already initialised Ray is used as it is and left running."""
    ray = import_ray()
    if ray.is_initialized():
        yield ray
        return
    if config.address is not None:
        ray.init(address=config.address, logging_level=logging.WARNING)
    else:
        cpus = max(os.cpu_count() or 1, math.ceil(config.workers * config.worker_cpus))
        ray.init(num_cpus=cpus, include_dashboard=False, logging_level=logging.WARNING)
    try:
        yield ray
    finally:
        ray.shutdown()


# ---------------------------------------------------------------- messages


PlannerSource = Any
"""What a worker builds its planner from: a :class:`~memento.planners.spec.PlannerSpec` (built inside the actor
with :func:`~memento.planners.spec.build_planner`), a planner object (sent to the actor as it is: any object with
``plan`` and ``plan_many``), or a zero-argument callable returning a planner (called inside the actor)."""


@dataclasses.dataclass(frozen=True)
class PolicySnapshot:
    """What a worker chooses with: a soft-Q network's weights and temperature (``None`` for a policy without
    parameters) and the policy version they are from."""

    version: int
    alpha: float | None = None
    qnet_config: QNetConfig | None = None
    state: dict[str, torch.Tensor] | None = None


@dataclasses.dataclass(frozen=True)
class WorkerSetup:
    """Everything a worker needs besides the units (sent once, when the actor starts)."""

    planner: PlannerSource
    judge: Callable[[Task, str], Any]
    policy: Any
    make_policy: PolicyFactory
    dim: int
    k: int
    seed: int
    credit: str
    credit_temperature: float


@dataclasses.dataclass(frozen=True)
class WorkUnit:
    """One unit of work: the tasks of one batch with their candidate sets as the bank gave them at dispatch.

    ``cases[b]``, ``rewards_C[b]`` and ``vectors_CE[b]`` are in ``candidates[b]`` order; ``vectors_CE[b]`` is
    ``None`` unless the Q-network sees case features."""

    unit: int
    steps: list[int]
    tasks: list[Task]
    states_BD: np.ndarray
    candidates: list[Candidates]
    cases: list[list[Case]]
    rewards_C: list[np.ndarray]
    vectors_CE: list[np.ndarray | None]
    snapshot_version: int
    bank_size: int


@dataclasses.dataclass(frozen=True)
class UnitResult:
    """What a worker returns for a :class:`WorkUnit`: per task the selection, the planner's output, the judged
    ``(reward, reason)`` and the leave-one-out credit (``None`` for shared credit), and the snapshot used."""

    unit: int
    steps: list[int]
    selections: list[Selection | None]
    outputs: list[Any]
    judged: list[tuple[float, str]]
    credit: list[np.ndarray | None]
    score_calls: int
    policy_version: int
    alpha: float | None
    worker: int
    pid: int
    ms: dict[str, float]


class _UnitView:
    """The stored rewards and case vectors of the candidates of the task being chosen for (a worker's stand-in
    for the bank: ``reward_of`` and the featurizer of the policy it builds)."""

    def __init__(self) -> None:
        self._rewards: dict[str, float] = {}
        self._rows: dict[str, int] = {}
        self._vectors_CE: np.ndarray | None = None

    def set(self, candidates: Candidates, rewards_C: np.ndarray, vectors_CE: np.ndarray | None) -> None:
        self._rewards = {case_id: float(r) for case_id, r in zip(candidates.ids, rewards_C)}
        self._rows = {case_id: i for i, case_id in enumerate(candidates.ids)}
        self._vectors_CE = vectors_CE

    def rewards(self, ids: Sequence[str]) -> np.ndarray:
        return np.asarray([self._rewards[i] for i in ids], dtype=np.float64)

    def case_vectors(self, candidates: Candidates) -> np.ndarray:
        if self._vectors_CE is None:
            raise DataFormatError("worker: the unit carries no case vectors for a Q-network with case features")
        return self._vectors_CE[[self._rows[i] for i in candidates.ids]]


def _writable(candidates: Candidates) -> Candidates:
    return Candidates(ids=list(candidates.ids), positions_C=np.array(candidates.positions_C),
                      scores_C=np.array(candidates.scores_C), embeddings_CD=np.array(candidates.embeddings_CD))


def _build_planner(source: PlannerSource) -> Any:
    from memento.planners.spec import PlannerSpec, build_planner

    if isinstance(source, PlannerSpec):
        return build_planner(source)
    if callable(getattr(source, "plan", None)) and callable(getattr(source, "plan_many", None)):
        return source
    if callable(source):
        return source()
    raise ConfigError(f"worker planner {source!r}: give a PlannerSpec, a planner or a callable returning one")


def _as_outputs(planner: Any, raw: Sequence[Any], n: int) -> list[PlanOutput]:
    from memento.planners.base import PlannerError, PlanOutput

    if len(raw) != n:
        raise PlannerError(f"planner {planner!r} returned {len(raw)} outputs for {n} tasks")
    outputs = []
    for out in raw:
        if isinstance(out, str):
            out = PlanOutput(text=out)
        if not isinstance(getattr(out, "text", None), str):
            raise PlannerError(f"planner {planner!r} returned {type(out).__name__}, expected PlanOutput")
        outputs.append(out)
    return outputs


class RolloutWorker:
    """One Ray actor: a planner, a judge and a policy snapshot (see the module docstring). Plain Python: the driver
    wraps it with ``ray.remote`` when it starts the workers."""

    def __init__(self, index: int, setup: WorkerSetup):
        self.index = index
        self.setup = setup
        self.planner = _build_planner(setup.planner)
        self.view = _UnitView()
        self.policy: Policy | None = None
        self.version: int | None = None
        self.alpha: float | None = None
        self._qnet_config: QNetConfig | None = None

    def ready(self) -> dict[str, Any]:
        """The worker's pid and planner (the driver waits for this before dispatching)."""
        return {"index": self.index, "pid": os.getpid(), "planner": repr(self.planner)}

    def _adopt(self, snapshot: PolicySnapshot) -> None:
        """Choose with ``snapshot`` from now on."""
        setup = self.setup
        if snapshot.state is None:  # no parameters: random, similarity
            if self.policy is None:
                context = PolicyContext(dim=setup.dim, k_max=setup.k, reward_of=self.view.rewards)
                self.policy = setup.make_policy(setup.policy, context)
        else:
            config: SoftQConfig = dataclasses.replace(setup.policy, init_qnet=None)
            qnet_config = snapshot.qnet_config
            assert qnet_config is not None
            if self.policy is None or self._qnet_config != qnet_config:
                qnet = build_qnet(qnet_config, torch.Generator().manual_seed(0))
                learner = SoftQLearner(qnet, config.learner, device="cpu", generator=torch.Generator().manual_seed(0))
                case_dim = qnet.config.case_dim
                buffer = ReplayBuffer(ReplayConfig(capacity=1, dim=setup.dim, k_max=setup.k,
                                                   case_dim=None if case_dim == setup.dim else case_dim), device="cpu")
                featurizer = self.view if qnet.config.features != "none" else None
                self.policy = SoftQAgent(config, learner=learner, buffer=buffer, reward_of=self.view.rewards,
                                         featurizer=featurizer)
                self._qnet_config = qnet_config
            assert isinstance(self.policy, SoftQAgent)
            self.policy.learner.qnet.load_state_dict(snapshot.state)
            self.policy.fixed_alpha = snapshot.alpha
        self.version, self.alpha = snapshot.version, snapshot.alpha

    def run(self, unit: WorkUnit, snapshot_box: list[Any]) -> UnitResult:
        """Select, plan and judge the unit's tasks with the snapshot of version ``unit.snapshot_version``
        (``snapshot_box[0]``: a Ray object reference, fetched only when this worker holds another version)."""
        import ray

        clock = time.perf_counter
        ms: dict[str, float] = {}
        if self.version != unit.snapshot_version or self.policy is None:
            self._adopt(ray.get(snapshot_box[0]))
        assert self.policy is not None
        setup = self.setup

        t0 = clock()
        selections: list[Selection | None] = []
        shown: list[list[Case]] = []
        for b, step in enumerate(unit.steps):
            candidates = _writable(unit.candidates[b])  # Ray hands arrays over read-only (zero copy)
            if not len(candidates):
                selections.append(None)
                shown.append([])
                continue
            self.view.set(candidates, unit.rewards_C[b], unit.vectors_CE[b])
            rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(setup.seed,
                                                                             spawn_key=(SELECTION_STREAM, step))))
            sel = self.policy.select(np.array(unit.states_BD[b]), candidates, setup.k, rng=rng)
            by_id = dict(zip(candidates.ids, unit.cases[b]))
            selections.append(sel)
            shown.append([by_id[case_id] for case_id in sel.ids])
        ms["select"] = clock() - t0

        t0 = clock()
        tasks = unit.tasks
        raw = [self.planner.plan(tasks[0], shown[0])] if len(tasks) == 1 else list(self.planner.plan_many(tasks,
                                                                                                          shown))
        outputs = _as_outputs(self.planner, raw, len(tasks))
        ms["plan"] = clock() - t0

        t0 = clock()
        judged = [_judge_reward(setup.judge(task, out.text), setup.judge) for task, out in zip(tasks, outputs)]
        ms["judge"] = clock() - t0

        t0 = clock()
        credit: list[np.ndarray | None] = [None] * len(tasks)
        score_calls = 0
        if setup.credit == "leave_one_out":
            credit, score_calls = leave_one_out_credit(self.planner, tasks, shown, setup.credit_temperature)
        ms["credit"] = clock() - t0
        return UnitResult(unit=unit.unit, steps=list(unit.steps), selections=selections, outputs=outputs,
                          judged=judged, credit=credit, score_calls=score_calls, policy_version=int(self.version or 0),
                          alpha=self.alpha, worker=self.index, pid=os.getpid(), ms=ms)


class _RemotePlanner:
    """The driver's stand-in for the planner (planning happens in the workers): it names them in ``run.json``."""

    def __init__(self, source: PlannerSource, workers: int):
        self.source = source
        self.workers = workers

    def plan(self, task: Task, cases: Sequence[Case]) -> Any:
        from memento.planners.base import PlannerError

        raise PlannerError("RayOnlineLoop: planning happens in the rollout workers, not in the driver")

    def plan_many(self, tasks: Sequence[Task], cases: Sequence[Sequence[Case]]) -> list[Any]:
        return [self.plan(task, c) for task, c in zip(tasks, cases)]

    def score_many(self, tasks: Sequence[Task], case_sets: Any) -> list[Any]:
        return [self.plan(task, []) for task in tasks]

    def __repr__(self) -> str:
        return f"RayWorkers({self.workers} x {self.source!r})"


# ---------------------------------------------------------------- the driver


@dataclasses.dataclass
class _Flight:
    """A dispatched unit: its message, the snapshot reference it carries, the worker and the attempt."""

    message: WorkUnit
    box: list[Any]
    worker: int
    attempt: int
    ref: Any = None
    retry_at: float = 0.0


class RayOnlineLoop(OnlineLoop):
    """:class:`~memento.runs.qa.OnlineLoop` with its selection, planning and judging done by Ray actors (see the
    module docstring). Takes :class:`~memento.runs.qa.OnlineLoop`'s arguments, with ``planner`` a
    :data:`PlannerSource` (each worker builds or receives its own) and ``workers`` a :class:`WorkersConfig`.
    Ray is joined or started when the run starts (:func:`ray_runtime`), unless it is already initialised.
    """

    def __init__(self, config: LoopConfig, *, workers: WorkersConfig, planner: PlannerSource,
                 judge: Callable[[Task, str], Any], **kwargs: Any):
        if not isinstance(workers, WorkersConfig):
            raise ConfigError(f"RayOnlineLoop: workers={type(workers).__name__}: must be a WorkersConfig")
        if isinstance(config, LoopConfig):
            if config.policy_kind not in WORKER_KINDS:
                raise ConfigError(f"--workers: policy {config.policy_kind!r} runs in-process only (the workers run "
                                  f"{', '.join(WORKER_KINDS)}); use --workers 1 for it")
            if config.systems.active:
                raise ConfigError("--workers: the memory systems (CFGM, LifeMem, PlugMem) run in-process only; "
                                  "use --workers 1 with them")
            if isinstance(config.policy, SoftQConfig) and config.policy.labels.active:
                raise ConfigError("--workers: online labels (--labels) run in-process only; use --workers 1 with "
                                  "them")
        import_ray()  # one line naming the extra before anything is written
        self.workers_config = workers
        self.planner_source = planner
        super().__init__(config, planner=_RemotePlanner(planner, workers.workers), judge=judge,  # type: ignore[arg-type]
                         **kwargs)

    # ------------------------------------------------------------------ run info and the workers log

    def _write_run_info(self) -> None:
        super()._write_run_info()
        info = json.loads(self.run_dir.run_info_path.read_text(encoding="utf-8"))
        info["workers"] = to_dict(self.workers_config)
        write_json(self.run_dir.run_info_path, info)

    def _open_workers_log(self, resumed: bool) -> Any:
        """``workers.jsonl``, cut back to the committed steps on resume (rows beyond the checkpoint are rerun)."""
        path = self.out_dir / WORKERS_LOG
        kept: list[str] = []
        if resumed and path.is_file():
            for line in path.read_text(encoding="utf-8").splitlines():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut by a killed driver
                if isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] < self.step:
                    kept.append(line + "\n")
        path.write_text("".join(kept), encoding="utf-8")
        return path.open("a", encoding="utf-8")

    # ------------------------------------------------------------------ dispatch

    def _snapshot(self) -> PolicySnapshot:
        """The policy as the workers choose with it now (soft-Q: the Q-network's weights on the CPU)."""
        policy = self.policy
        version = int(policy.version)
        if isinstance(policy, SoftQAgent):
            qnet = policy.learner.qnet
            state = {name: t.detach().to("cpu").clone() for name, t in qnet.state_dict().items()}
            return PolicySnapshot(version=version, alpha=float(policy.alpha), qnet_config=qnet.config, state=state)
        return PolicySnapshot(version=version, alpha=policy.alpha)

    def _message(self, bank: CaseBank, unit: int, start: int, stop: int, order_T: np.ndarray,
                 snapshot_version: int) -> WorkUnit:
        """The unit's tasks with their candidates as the bank gives them now (encode -> candidates)."""
        clock = time.perf_counter
        tasks = [self.tasks[i] for i in order_T[start:stop]]
        t0 = clock()
        state_BD = self._encode([task.question for task in tasks])
        self.ms_totals["encode"] += (clock() - t0) * 1000.0
        t0 = clock()
        bank_size = len(bank)
        cands = [self._candidates(bank, state_BD[b], task) for b, task in enumerate(tasks)]
        featurizer = getattr(self.policy, "featurizer", None)
        cases, rewards, vectors = [], [], []
        for c in cands:
            ids = list(c.ids)
            cases.append(bank.get(ids) if ids else [])
            rewards.append(np.asarray(bank.rewards(ids), dtype=np.float64) if ids else np.zeros(0))
            vectors.append(featurizer.case_vectors(c) if featurizer is not None and ids else None)
        self.ms_totals["candidates"] += (clock() - t0) * 1000.0
        return WorkUnit(unit=unit, steps=list(range(start, stop)), tasks=tasks, states_BD=state_BD, candidates=cands,
                        cases=cases, rewards_C=rewards, vectors_CE=vectors, snapshot_version=snapshot_version,
                        bank_size=bank_size)

    # ------------------------------------------------------------------ commit

    def _commit(self, bank: CaseBank, message: WorkUnit, result: UnitResult) -> tuple[list[Any], int]:
        """Retain, learn and record one unit (in stream order); returns its records and the learner's version
        before the unit's updates (against which the unit's staleness is counted)."""
        cfg = self.config
        clock = time.perf_counter
        tasks, outputs, judged = message.tasks, result.outputs, result.judged
        bounds = self.policy.reward_range
        if bounds is not None:
            for task, (reward, _) in zip(tasks, judged):
                if not bounds[0] <= reward <= bounds[1]:
                    raise DataFormatError(f"judge {self.judge!r} gave reward {reward} for task {task.id!r}; the "
                                          f"{cfg.policy_kind} policy learns from rewards in "
                                          f"[{bounds[0]:g}, {bounds[1]:g}] (single-step, cross-entropy)")
        ms: dict[str, float] = {name: seconds for name, seconds in result.ms.items()}
        first = message.steps[0]
        self.counters["llm_calls"] += len(tasks)
        self.counters["score_calls"] += result.score_calls
        shown = [[] if sel is None else [dict(zip(c.ids, cs))[case_id] for case_id in sel.ids]
                 for c, cs, sel in zip(message.candidates, message.cases, result.selections)]
        if "memory_tokens" in self.counters:
            from memento.systems.items import memory_tokens

            self.counters["memory_tokens"] += sum(memory_tokens(cases) for cases in shown)

        t0 = clock()
        retained = self._retain(bank, tasks, outputs, judged, message.states_BD, first)
        ms["retain"] = clock() - t0

        t0 = clock()
        learner_version = int(self.policy.version)
        observations = [Observation(state_D=message.states_BD[b], candidates=message.candidates[b], selection=sel,
                                    reward=judged[b][0], step=first + b, policy_version=result.policy_version,
                                    case_rewards_K=result.credit[b])
                        for b, sel in enumerate(result.selections) if sel is not None]
        loss = self.policy.observe(observations).get("loss") if cfg.learn else None
        ms["learn"] = clock() - t0

        t0 = clock()
        for obs in observations:
            bank.record_usage(obs.step, list(obs.selection.ids), obs.reward)
        ms["usage"] = clock() - t0

        for name, seconds in ms.items():
            self.ms_totals[name] += seconds * 1000.0
        per_task = {name: round(seconds * 1000.0 / len(tasks), 4) for name, seconds in ms.items()}
        records = [self._record(b, task, out, judged[b], sel, retained[b], first_step=first,
                                version=result.policy_version, bank_size=message.bank_size, alpha=result.alpha,
                                loss=loss, ms=per_task, credit=result.credit[b])
                   for b, (task, out, sel) in enumerate(zip(tasks, outputs, result.selections))]
        return records, learner_version

    # ------------------------------------------------------------------ the run

    def _units(self) -> list[tuple[int, int, bool]]:
        """``(start, stop, checkpoint after)`` of the units left, as the in-process loop batches and checkpoints."""
        cfg = self.config
        units = []
        start = self.step
        while start < cfg.steps:
            stop = min(cfg.steps, (start // cfg.batch_size + 1) * cfg.batch_size)
            every = cfg.checkpoint_every
            units.append((start, stop, stop == cfg.steps or bool(every and stop // every > start // every)))
            start = stop
        return units

    def _loop(self, bank: CaseBank, order_T: np.ndarray, started: float, resumed_from: int | None) -> dict[str, Any]:
        cfg = self.config
        self.worker_stats: dict[str, Any] = {"workers": self.workers_config.workers,
                                             "sync_every": self.workers_config.sync_every, "restarts": 0,
                                             "resubmitted": 0, "dropped_duplicates": 0, "snapshots": 0,
                                             "staleness_sum": 0, "staleness_max": 0, "transitions": 0,
                                             "worker_pids": []}
        self._commit_times: list[float] = []  # perf_counter at the first and the latest commit
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
        loop_s = 0.0
        try:
            with self.run_dir.steps.open("a", encoding="utf-8") as steps_handle, \
                    self._open_workers_log(resumed_from is not None) as workers_handle:
                if self.step < cfg.steps:
                    with ray_runtime(self.workers_config) as ray:
                        t0 = time.perf_counter()
                        self._drive(ray, bank, order_T, steps_handle, workers_handle, writer)
                        loop_s = time.perf_counter() - t0
        finally:
            if writer is not None:
                writer.close()
        has_model = self.policy.save_model(self.run_dir.selector)
        summary = self._summary(bank, time.perf_counter() - started, resumed_from, has_model)
        stats = dict(self.worker_stats)
        n = max(1, stats.pop("transitions"))
        stats["staleness_mean"] = stats.pop("staleness_sum") / n
        stats["loop_s"] = loop_s  # from starting the workers to the last commit
        times = self._commit_times
        stats["tasks_per_s"] = (n - 1) / (times[1] - times[0]) if n > 1 and len(times) == 2 and times[1] > times[0] \
            else None  # steady state: between the first and the last committed transition
        summary["workers"] = stats
        write_json(self.run_dir.summary_path, summary)
        logger.info("online %s with %d workers: %d steps, success %.3f, bank %d -> %d, %d restart(s)",
                    cfg.policy_kind, self.workers_config.workers, summary["steps"], summary["success_rate"],
                    summary["bank_size_start"], summary["bank_size_end"], stats["restarts"])
        return summary

    def _start_workers(self, ray: Any) -> list[Any]:
        wc = self.workers_config
        setup = WorkerSetup(planner=self.planner_source, judge=self.judge, policy=self.config.policy,
                            make_policy=self.make_policy, dim=self.dim, k=self.config.k, seed=self.config.seed,
                            credit=self.config.credit, credit_temperature=self.config.credit_temperature)
        actor = ray.remote(num_cpus=wc.worker_cpus, num_gpus=wc.worker_gpus, max_restarts=wc.max_restarts,
                           max_task_retries=0)(RolloutWorker)
        handles = [actor.remote(i, setup) for i in range(wc.workers)]  # by value: a restart needs it again
        try:
            infos = ray.get([h.ready.remote() for h in handles], timeout=wc.ready_timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise WorkerError(f"the {wc.workers} rollout workers were not ready after {wc.ready_timeout_s:g} s "
                              "(does the cluster have the resources they ask for?)") from None
        except ray.exceptions.RayError as error:
            raise WorkerError(f"a rollout worker failed to start: {_cause(error)}") from None
        self.worker_stats["worker_pids"] = [info["pid"] for info in infos]
        logger.info("%d rollout workers ready (pids %s): %s", wc.workers, self.worker_stats["worker_pids"],
                    infos[0]["planner"])
        return handles

    def _drive(self, ray: Any, bank: CaseBank, order_T: np.ndarray, steps_handle: Any, workers_handle: Any,
               writer: Any) -> None:
        """Dispatch, collect and commit every unit left (the schedule of the module docstring)."""
        from tqdm.auto import tqdm

        cfg, wc = self.config, self.workers_config
        n_workers = wc.workers
        units = self._units()
        first_of_segment: list[int] = []
        segment = 0
        for i, (_, _, ckpt_after) in enumerate(units):
            first_of_segment.append(segment)
            if ckpt_after:
                segment = i + 1
        handles = self._start_workers(ray)
        self.worker_handles = handles
        snapshot: PolicySnapshot | None = None
        box: list[Any] = []
        flights: dict[int, _Flight] = {}  # dispatched, no result yet
        restarting: dict[int, _Flight] = {}  # their worker died: sent again once it is back
        done: dict[int, tuple[_Flight, UnitResult]] = {}  # a result, waiting for its predecessors
        committed: set[int] = set()
        next_dispatch = next_commit = 0
        recent: deque[bool] = deque(self.successes[-cfg.window:], maxlen=cfg.window)
        bar = tqdm(total=cfg.steps, initial=self.step, desc=f"online {cfg.policy_kind} x{n_workers}", unit="task",
                   disable=not self.progress, dynamic_ncols=True)

        def submit(i: int, flight: _Flight) -> None:
            flight.ref = handles[flight.worker].run.remote(flight.message, flight.box)
            flights[i] = flight

        def dispatch_ready() -> None:
            nonlocal next_dispatch, snapshot, box
            while next_dispatch < len(units) and next_commit >= max(next_dispatch - n_workers + 1,
                                                                    first_of_segment[next_dispatch]):
                i = next_dispatch
                version = int(self.policy.version)
                if snapshot is None or (version != snapshot.version and (
                        i == first_of_segment[i] or version - snapshot.version >= wc.sync_every)):
                    snapshot = self._snapshot()
                    box = [ray.put(snapshot)]
                    self.worker_stats["snapshots"] += 1
                start, stop, _ = units[i]
                message = self._message(bank, i, start, stop, order_T, snapshot.version)
                submit(i, _Flight(message=message, box=box, worker=i % n_workers, attempt=1))
                next_dispatch += 1

        try:
            dispatch_ready()
            while next_commit < len(units):
                now = time.monotonic()
                for flight in restarting.values():  # ask a restarting worker again whether it is back
                    if flight.ref is None and now >= flight.retry_at:
                        flight.ref = handles[flight.worker].ready.remote()
                waiting = {f.ref: (i, False) for i, f in flights.items()}
                waiting.update({f.ref: (i, True) for i, f in restarting.items() if f.ref is not None})
                if not waiting:
                    time.sleep(RESTART_POLL_S)
                    continue
                ready, _ = ray.wait(list(waiting), num_returns=1, timeout=RESTART_POLL_S if restarting else 1.0)
                for ref in ready:
                    i, is_restart = waiting[ref]
                    if is_restart:
                        self._restarted(ray, i, restarting, submit)
                        continue
                    flight = flights.pop(i)
                    try:
                        result = ray.get(ref)
                    except ray.exceptions.RayActorError as error:  # the worker died holding unit i
                        self._lost(i, flight, error, restarting)
                        continue
                    except ray.exceptions.RayTaskError as error:
                        cause = error.cause if isinstance(getattr(error, "cause", None), BaseException) else None
                        if isinstance(cause, MementoError):
                            raise cause from None
                        raise WorkerError(f"rollout worker {flight.worker} failed on steps "
                                          f"{flight.message.steps[0]}-{flight.message.steps[-1]}: "
                                          f"{_cause(error)}") from None
                    if i in committed or i in done:  # never counted twice
                        self.worker_stats["dropped_duplicates"] += 1
                        continue
                    done[i] = (flight, result)
                while next_commit in done:
                    i = next_commit
                    flight, result = done.pop(i)
                    self._commit_unit(bank, flight, result, units[i], steps_handle, workers_handle, writer, recent)
                    committed.add(i)
                    bar.update(len(result.steps))
                    bar.set_postfix(success=f"{np.mean(recent):.2f}", bank=len(bank))
                    next_commit += 1
                    dispatch_ready()
        finally:
            bar.close()
            for handle in handles:
                with contextlib.suppress(Exception):
                    ray.kill(handle)

    def _lost(self, i: int, flight: _Flight, error: Exception, restarting: dict[int, _Flight]) -> None:
        """A worker died holding unit ``i``: Ray restarts it; the unit waits until the worker answers again."""
        wc = self.workers_config
        if flight.attempt > wc.max_restarts:
            raise WorkerError(f"rollout worker {flight.worker} died {flight.attempt} times on steps "
                              f"{flight.message.steps[0]}-{flight.message.steps[-1]} (max_restarts="
                              f"{wc.max_restarts}): {_cause(error)}")
        logger.warning("rollout worker %d died on steps %d-%d (%s); they will run again when it is restarted",
                       flight.worker, flight.message.steps[0], flight.message.steps[-1], type(error).__name__)
        self.worker_stats["restarts"] += 1
        self.worker_stats["resubmitted"] += len(flight.message.steps)
        restarting[i] = dataclasses.replace(flight, attempt=flight.attempt + 1, ref=None, retry_at=0.0)

    def _restarted(self, ray: Any, i: int, restarting: dict[int, _Flight],
                   submit: Callable[[int, _Flight], None]) -> None:
        """A restarting worker answered: send it unit ``i`` again, unchanged (or ask again later)."""
        flight = restarting[i]
        try:
            info = ray.get(flight.ref)
        except ray.exceptions.ActorDiedError as error:  # beyond max_restarts, or its planner no longer builds
            raise WorkerError(f"rollout worker {flight.worker} could not be restarted: {_cause(error)}") from None
        except ray.exceptions.RayActorError:  # still restarting
            flight.ref, flight.retry_at = None, time.monotonic() + RESTART_POLL_S
            return
        del restarting[i]
        self.worker_stats["worker_pids"][flight.worker] = info["pid"]
        logger.info("rollout worker %d is back (pid %d): steps %d-%d again (attempt %d)", flight.worker, info["pid"],
                    flight.message.steps[0], flight.message.steps[-1], flight.attempt)
        submit(i, dataclasses.replace(flight, ref=None))

    def _commit_unit(self, bank: CaseBank, flight: _Flight, result: UnitResult, unit: tuple[int, int, bool],
                     steps_handle: Any, workers_handle: Any, writer: Any, recent: deque[bool]) -> None:
        start, stop, ckpt_after = unit
        records, learner_version = self._commit(bank, flight.message, result)
        t0 = time.perf_counter()
        staleness = learner_version - result.policy_version
        for record in records:
            steps_handle.write(json.dumps(record.to_json(), ensure_ascii=False) + "\n")
            workers_handle.write(json.dumps({"step": record.step, "worker": result.worker, "pid": result.pid,
                                             "attempt": flight.attempt, "policy_version": result.policy_version,
                                             "learner_version": learner_version, "staleness": staleness}) + "\n")
            recent.append(record.success)
            if writer is not None:
                self._log_scalars(writer, record, float(np.mean(recent)))
                writer.add_scalar("workers/staleness", staleness, record.step)
        steps_handle.flush()
        workers_handle.flush()
        now = time.perf_counter()
        self._commit_times = [self._commit_times[0] if self._commit_times else now, now]
        stats = self.worker_stats
        stats["transitions"] += len(records)
        stats["staleness_sum"] += staleness * len(records)
        stats["staleness_max"] = max(stats["staleness_max"], staleness)
        self.ms_totals["log"] += (time.perf_counter() - t0) * 1000.0
        self.step = stop
        if ckpt_after:
            t0 = time.perf_counter()
            self._checkpoint(bank, steps_handle)
            self.ms_totals["checkpoint"] += (time.perf_counter() - t0) * 1000.0


def _cause(error: BaseException) -> str:
    """One line of what went wrong in a worker."""
    cause = getattr(error, "cause", None)
    text = str(cause if isinstance(cause, BaseException) else error)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else type(error).__name__


def worker_loop_class(workers: WorkersConfig, planner: PlannerSource) -> Callable[..., OnlineLoop]:
    """A ``loop_class`` for :func:`memento.runs.compare.run_comparison`: builds :class:`RayOnlineLoop` runs with these
    workers, each worker building its planner from ``planner`` (the ``planner`` argument the comparison passes,
    if any, is the driver's and is not used)."""

    def build(config: LoopConfig, **kwargs: Any) -> OnlineLoop:
        kwargs.pop("planner", None)
        return RayOnlineLoop(config, workers=workers, planner=planner, **kwargs)

    return build


def read_workers_log(run_dir: str | Path) -> list[dict[str, Any]]:
    """The rows of a run's ``workers.jsonl`` (see :data:`WORKERS_LOG`)."""
    path = Path(run_dir) / WORKERS_LOG
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
