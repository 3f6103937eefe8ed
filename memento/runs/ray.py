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

The halves are the in-process loop's own: a worker's plan -> judge -> credit is :func:`memento.runs.qa.rollout`, the
driver's encode -> candidates is ``OnlineLoop._prepare`` and its commit is ``OnlineLoop._commit`` (given the worker's
result as the loop's act); the run around them (run directory, checkpoints, resume, summary) is
:class:`memento.runs.base.Run`'s. Only the schedule below is the driver's own.

The driver sends the candidate set *with* the task rather than giving workers a view of the bank: the bank (an
SQLite file and an in-memory faiss index that the driver appends to every step) then has one reader and one
writer, workers need no encoder, no index and no shared file system, and a task's inputs are a plain value that
can be sent again, unchanged, when its worker dies. A work unit is one batch of the loop (``LoopConfig.batch_size``
tasks, planned with one ``plan_many`` call; one task by default).

**Snapshots.** A soft-Q snapshot is the Q-network's weights (``state_dict`` on the CPU), its config, the soft-max
temperature and the policy version (learner updates so far). The driver puts one in Ray's object store when the
learner has made ``sync_every`` updates since the last one (and at the first dispatch after each checkpoint);
each unit carries a reference to the current snapshot, and a worker fetches it only when its version changed. A
worker chooses exactly as :class:`~memento.policies.SoftQAgent.select` does (it builds one around the snapshot, with
the unit's stored rewards for positive-only pools and its case vectors). Random and similarity policies have no
parameters: a worker builds them once. Policies that learn outside a Q-network (LinUCB) and the memory systems
(CFGM, LifeMem, PlugMem) run in-process only, and are refused here with one line.

**What a transition carries.** Each transition keeps the id it has in the task stream (its step), the candidate
ids, the policy's distribution over them (``candidate_probs``), the chosen ids with their first-draw propensities
and the set's Plackett-Luce probability, all *of the snapshot that chose*, and ``policy_version`` = that
snapshot's version, so ``steps.jsonl`` stays a correct log for off-policy evaluation. ``workers.jsonl`` has one
line per transition: the worker, the attempt, the snapshot version and the learner's version when it was
committed; their difference is the transition's staleness (also on TensorBoard as ``workers/staleness`` and in
``summary.json``). ``summary.json``'s ``workers`` figures cover the whole run (a resumed run adds its own to the
checkpoint's), except ``tasks_per_s``: the steady rate of the last driver process, the transitions it committed
after its first commit (``process_transitions`` in all) over the time to its last.

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

``ray`` is an optional extra (``pip install -e '.[ray]'``), imported only when a run starts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import logging
import math
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from memento.bank import Candidates
from memento.bank.protocol import Bank
from memento.config import MAX_WORKERS, QNetConfig, ReplayConfig, check, check_float, check_int, check_ints, to_dict
from memento.errors import ConfigError, DataFormatError, MementoError, WorkerError
from memento.extras import missing_extra, require
from memento.io import loads_json, parse_json
from memento.learn.learner import SoftQLearner
from memento.learn.policy import Policy, PolicyContext, PolicyFactory
from memento.learn.qnet import build_qnet
from memento.learn.replay import ReplayBuffer
from memento.policies import SoftQAgent, SoftQConfig
from memento.runs.base import crossed, timed
from memento.runs.qa import Acted, LoopConfig, OnlineLoop, rollout
from memento.systems.items import memory_tokens
from memento.types import Case, Selection, Task

__all__ = ["MAX_WORKERS", "WORKERS_LOG", "WORKER_KINDS", "PolicySnapshot", "RayOnlineLoop", "RolloutWorker",
           "UnitResult", "WorkUnit", "WorkerError", "WorkerSetup", "WorkersConfig", "import_ray", "ray_runtime",
           "read_workers_log", "require_ray", "steady_rate", "worker_loop_class"]

logger = logging.getLogger(__name__)

WORKER_KINDS = ("random", "similarity", "soft_q")
"""Policy kinds the workers can run (their choice depends only on a snapshot and the candidates)."""

SELECTION_STREAM = 4
"""``SeedSequence(seed, spawn_key=(SELECTION_STREAM, step))`` draws transition ``step``'s cases (the loop's own
streams are spawn keys 0-3)."""

WORKERS_LOG = "workers.jsonl"
"""One line per committed transition in the run directory: worker, attempt, snapshot and learner versions."""

_WORKERS = "running rollout workers (--workers N > 1)"

LOOPBACK = "127.0.0.1"

_SUMMED_STATS = ("restarts", "resubmitted", "dropped_duplicates", "snapshots", "staleness_sum", "transitions")
"""Worker figures a resumed run adds to its checkpoint's (``staleness_max`` takes the larger)."""

RESTART_POLL_S = 0.25
"""Seconds between two questions to a restarting worker whether it is back."""


def require_ray() -> None:
    """One :class:`ConfigError` line naming the extra when Ray is not installed (without importing it: a local Ray
    started later by :func:`ray_runtime` can still turn on Ray's token authentication, which Ray reads when it is
    first imported)."""
    require("ray", what=_WORKERS)


def import_ray() -> Any:
    """The ``ray`` module, or one :class:`ConfigError` line naming the extra."""
    try:
        import ray
    except ImportError:
        raise missing_extra("ray", "ray", what=_WORKERS) from None
    return ray


@dataclasses.dataclass(frozen=True, kw_only=True)
class WorkersConfig:
    """The rollout workers of one run (see the module docstring).

    - ``workers``: Ray actors, each with its own planner and judge (1 to :data:`memento.config.MAX_WORKERS`, the
      bound ``--workers`` has too; the CLI uses this class for N >= 2);
    - ``sync_every``: learner updates between two policy snapshots sent to the workers (1: every update);
    - ``address``: a Ray cluster to join (``ray.init(address=...)``, e.g. ``"auto"`` or ``"ray://host:10001"``);
      ``None`` starts a local Ray with ``max(cpu count, workers * worker_cpus)`` logical CPUs (see
      :func:`ray_runtime` for how it is confined to this machine and ended with the driver);
    - ``worker_cpus`` / ``worker_gpus``: resources each actor asks for (a local transformers planner on a GPU
      wants ``worker_gpus=1``; an HTTP planner needs little);
    - ``max_restarts``: how often Ray restarts a dead worker (its unfinished unit is sent again each time);
    - ``ready_timeout_s``: seconds to wait for the workers to build their planners.
    """

    workers: int = 2
    sync_every: int = dataclasses.field(default=1, metadata={"help": (
        "learner updates between two policy snapshots sent to the workers")})
    address: str | None = dataclasses.field(default=None, metadata={"help": (
        "join this Ray cluster (e.g. auto, ray://HOST:10001)")})
    worker_cpus: float = 1.0
    worker_gpus: float = 0.0
    max_restarts: int = 3
    ready_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        cls = type(self)
        check_ints(self, workers=1, sync_every=1)
        check(self.workers <= MAX_WORKERS, cls, "workers", self.workers, f"must be <= {MAX_WORKERS}")
        check(self.address is None or (isinstance(self.address, str) and bool(self.address.strip())), cls,
              "address", self.address, "must be null (a local Ray) or a Ray address")
        check_float(self, "worker_cpus", low=0.0)
        check_float(self, "worker_gpus", low=0.0)
        check_int(self, "max_restarts", 0)
        check_float(self, "ready_timeout_s", low=0.0, low_open=True)


def _token_auth() -> bool:
    """Turn on Ray's token authentication (``RAY_AUTH_MODE=token`` with a fresh random ``RAY_AUTH_TOKEN``) for the
    local Ray about to start, when this Ray has it, the user chose no mode and Ray is not imported yet (Ray reads
    the mode once, at import). The variables stay set in this process (a later local Ray in it uses the same
    mode). Returns whether the Ray about to start requires the token."""
    if os.environ.get("RAY_AUTH_MODE"):
        return os.environ["RAY_AUTH_MODE"] == "token"
    if "ray" in sys.modules:
        return False
    spec = importlib.util.find_spec("ray")
    origin = getattr(spec, "origin", None)
    if origin is None or not (Path(origin).parent / "_private" / "authentication").is_dir():
        return False  # a Ray without token authentication (before 2.52)
    os.environ["RAY_AUTH_TOKEN"] = secrets.token_urlsafe(32)
    os.environ["RAY_AUTH_MODE"] = "token"
    logging.getLogger("ray._private.authentication").setLevel(logging.ERROR)  # not its "token auth is on" line
    return True


class _Watchdog:
    """The process that ends a local Ray when its driver dies (:mod:`memento.runs.ray_watchdog`)."""

    def __init__(self) -> None:
        script = Path(__file__).with_name("ray_watchdog.py")  # run as a file: importing memento would take seconds
        self.proc = subprocess.Popen([sys.executable, "-I", str(script), str(os.getpid())],
                                     stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, start_new_session=True,
                                     close_fds=True)

    def stop(self) -> None:
        """The driver shuts Ray down itself: the watchdog leaves without ending anything."""
        assert self.proc.stdin is not None
        with contextlib.suppress(OSError):
            self.proc.stdin.write(b"stop\n")
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@contextlib.contextmanager
def ray_runtime(config: WorkersConfig) -> Iterator[Any]:
    """Ray for the duration of the block: joined at ``config.address``, or a local one started (and shut down at
    the end); an already initialised Ray is used as it is and left running.

    A local Ray is confined to this machine as far as Ray allows: no dashboard, its node address is
    ``127.0.0.1``, and (Ray >= 2.52) token authentication with a fresh random token, so that the gRPC ports Ray
    opens on every interface (Ray has no setting to bind them to loopback) refuse whoever does not hold the token.
    A watchdog process ends every Ray process the run started within about a second when the driver dies,
    SIGKILL included (:mod:`memento.runs.ray_watchdog`)."""
    started_here = config.address is None and not ("ray" in sys.modules and sys.modules["ray"].is_initialized())
    auth = _token_auth() if started_here else False
    ray = import_ray()
    if ray.is_initialized():
        yield ray
        return
    watchdog: _Watchdog | None = None
    if config.address is not None:
        ray.init(address=config.address, logging_level=logging.WARNING)
    else:
        cpus = max(os.cpu_count() or 1, math.ceil(config.workers * config.worker_cpus))
        watchdog = _Watchdog()  # first: it ends the processes started after it (a failed init's too)
        try:
            ray.init(num_cpus=cpus, include_dashboard=False, dashboard_host=LOOPBACK, _node_ip_address=LOOPBACK,
                     logging_level=logging.WARNING)
        except BaseException:
            watchdog.stop()
            raise
        logger.info("started a local Ray (%d CPUs, token authentication %s)", cpus, "on" if auth else "off")
    try:
        yield ray
    finally:
        try:
            ray.shutdown()
        finally:
            if watchdog is not None:
                watchdog.stop()


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

    def _select(self, unit: WorkUnit) -> tuple[list[Selection | None], list[list[Case]]]:
        """The snapshot's choice for each task of the unit (from the transition's own RNG) and the cases shown."""
        assert self.policy is not None
        selections: list[Selection | None] = []
        shown: list[list[Case]] = []
        for b, step in enumerate(unit.steps):
            candidates = _writable(unit.candidates[b])  # Ray hands arrays over read-only (zero copy)
            if not len(candidates):
                selections.append(None)
                shown.append([])
                continue
            self.view.set(candidates, unit.rewards_C[b], unit.vectors_CE[b])
            rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(self.setup.seed,
                                                                             spawn_key=(SELECTION_STREAM, step))))
            sel = self.policy.select(np.array(unit.states_BD[b]), candidates, self.setup.k, rng=rng)
            by_id = dict(zip(candidates.ids, unit.cases[b]))
            selections.append(sel)
            shown.append([by_id[case_id] for case_id in sel.ids])
        return selections, shown

    def run(self, unit: WorkUnit, snapshot_box: list[Any]) -> UnitResult:
        """Select, plan and judge the unit's tasks with the snapshot of version ``unit.snapshot_version``
        (``snapshot_box[0]``: a Ray object reference, fetched only when this worker holds another version)."""
        import ray

        ms: dict[str, float] = {}
        if self.version != unit.snapshot_version or self.policy is None:
            self._adopt(ray.get(snapshot_box[0]))
        assert self.policy is not None
        setup = self.setup

        with timed(ms, "select"):
            selections, shown = self._select(unit)
        outputs, judged, credit, score_calls = rollout(self.planner, setup.judge, unit.tasks, shown, shown,
                                                       credit=setup.credit, temperature=setup.credit_temperature,
                                                       ms=ms)
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


@dataclasses.dataclass
class _Pipeline:
    """The driver's schedule while the workers run: the units left (``(start, stop, checkpoint after)``), the
    first unit of each one's checkpoint segment, the worker handles, the current snapshot (and its object-store
    box), and the units in flight, restarting, done (waiting for their predecessors) and committed."""

    units: list[tuple[int, int, bool]]
    handles: list[Any]
    first_of_segment: list[int] = dataclasses.field(default_factory=list)
    snapshot: PolicySnapshot | None = None
    box: list[Any] = dataclasses.field(default_factory=list)
    flights: dict[int, _Flight] = dataclasses.field(default_factory=dict)
    restarting: dict[int, _Flight] = dataclasses.field(default_factory=dict)
    done: dict[int, tuple[_Flight, UnitResult]] = dataclasses.field(default_factory=dict)
    committed: set[int] = dataclasses.field(default_factory=set)
    next_dispatch: int = 0
    next_commit: int = 0

    def __post_init__(self) -> None:
        segment = 0
        for i, (_, _, ckpt_after) in enumerate(self.units):
            self.first_of_segment.append(segment)
            if ckpt_after:
                segment = i + 1

    def submit(self, i: int, flight: _Flight) -> None:
        """Send unit ``i`` to its worker."""
        flight.ref = self.handles[flight.worker].run.remote(flight.message, flight.box)
        self.flights[i] = flight


class RayOnlineLoop(OnlineLoop):
    """:class:`~memento.runs.qa.OnlineLoop` with its selection, planning and judging done by Ray actors (see the
    module docstring). Takes :class:`~memento.runs.qa.OnlineLoop`'s arguments, with ``planner`` a
    :data:`PlannerSource` (each worker builds or receives its own) and ``workers`` a :class:`WorkersConfig`.
    Ray is joined or started when the run starts (:func:`ray_runtime`), unless it is already initialised.
    """

    _loop_t0: float | None = None  # perf_counter when this process started its workers (None: not driving)

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
        require_ray()  # one line naming the extra before anything is written (Ray is imported when it starts)
        self.workers_config = workers
        self.planner_source = planner
        super().__init__(config, planner=_RemotePlanner(planner, workers.workers), judge=judge,  # type: ignore[arg-type]
                         **kwargs)

    # ------------------------------------------------------------------ run info and the workers log

    def _run_info(self) -> dict[str, Any]:
        return {**super()._run_info(), "workers": to_dict(self.workers_config)}

    def _desc(self) -> str:
        return f"online {self.config.policy_kind} x{self.workers_config.workers}"

    def _open_workers_log(self, resumed: bool) -> Any:
        """``workers.jsonl``, cut back to the committed steps on resume (rows beyond the checkpoint are rerun)."""
        path = self.out_dir / WORKERS_LOG
        kept: list[str] = []
        if resumed and path.is_file():
            for line in path.read_bytes().splitlines():
                try:
                    row = loads_json(line)
                except DataFormatError:
                    continue  # a line cut by a killed driver
                if isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] < self.step:
                    kept.append(line.decode("utf-8") + "\n")
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

    def _message(self, bank: Bank, unit: int, start: int, stop: int, snapshot_version: int) -> WorkUnit:
        """The unit's tasks with their candidates as the bank gives them now (the loop's encode -> candidates),
        with the candidates' cases, stored rewards and (Q-network with case features) vectors."""
        tasks = [self.tasks[i] for i in self.order[start:stop]]
        ms: dict[str, float] = {}
        state_BD, cands, bank_size = self._prepare(bank, tasks, ms)
        with timed(ms, "candidates"):
            featurizer = getattr(self.policy, "featurizer", None)
            cases, rewards, vectors = [], [], []
            for c in cands:
                ids = list(c.ids)
                cases.append(bank.get(ids) if ids else [])
                rewards.append(np.asarray(bank.rewards(ids), dtype=np.float64) if ids else np.zeros(0))
                vectors.append(featurizer.case_vectors(c) if featurizer is not None and ids else None)
        for name, seconds in ms.items():
            self.ms_totals[name] += seconds * 1000.0
        return WorkUnit(unit=unit, steps=list(range(start, stop)), tasks=tasks, states_BD=state_BD, candidates=cands,
                        cases=cases, rewards_C=rewards, vectors_CE=vectors, snapshot_version=snapshot_version,
                        bank_size=bank_size)

    # ------------------------------------------------------------------ commit

    def _acted(self, message: WorkUnit, result: UnitResult) -> Acted:
        """A worker's result as the loop's act of the unit (what :meth:`OnlineLoop._commit` takes)."""
        self._check_rewards(message.tasks, result.judged)
        shown = [[] if sel is None else [dict(zip(c.ids, cs))[case_id] for case_id in sel.ids]
                 for c, cs, sel in zip(message.candidates, message.cases, result.selections)]
        return Acted(tasks=message.tasks, first_step=message.steps[0], state_BD=message.states_BD,
                     candidates=message.candidates, selections=result.selections, outputs=result.outputs,
                     judged=result.judged, credit=result.credit, labels=[None] * len(message.tasks),
                     version=result.policy_version, alpha=result.alpha, bank_size=message.bank_size,
                     ms=dict(result.ms), score_calls=result.score_calls,
                     memory_tokens=sum(memory_tokens(cases) for cases in shown))

    def _commit_unit(self, bank: Bank, flight: _Flight, result: UnitResult, unit: tuple[int, int, bool]) -> None:
        """Commit one unit in stream order (the loop's retain -> observe -> usage -> log), its ``workers.jsonl``
        rows, and the checkpoint after it when one is due."""
        learner_version = int(self.policy.version)  # the unit's staleness is counted against it
        records = self._commit(bank, self._acted(flight.message, result))
        t0 = time.perf_counter()
        staleness = learner_version - result.policy_version
        for record in records:
            self.workers_handle.write(json.dumps({"step": record.step, "worker": result.worker, "pid": result.pid,
                                                  "attempt": flight.attempt, "policy_version": result.policy_version,
                                                  "learner_version": learner_version, "staleness": staleness}) + "\n")
            if self.writer is not None:
                self.writer.add_scalar("workers/staleness", staleness, record.step)
        self.workers_handle.flush()
        now = time.perf_counter()
        if not self._commit_times:
            self._first_commit_transitions = len(records)
        self._commit_times = [self._commit_times[0] if self._commit_times else now, now]
        self._process_transitions += len(records)
        stats = self.worker_stats
        stats["transitions"] += len(records)
        stats["staleness_sum"] += staleness * len(records)
        stats["staleness_max"] = max(stats["staleness_max"], staleness)
        self.ms_totals["log"] += (time.perf_counter() - t0) * 1000.0
        if unit[2]:
            self._timed_checkpoint(bank)

    # ------------------------------------------------------------------ the run

    def _units(self) -> list[tuple[int, int, bool]]:
        """``(start, stop, checkpoint after)`` of the units left, as the in-process loop batches and checkpoints."""
        cfg = self.config
        units = []
        start = self.step
        while start < cfg.steps:
            stop = self._round(start).stop
            units.append((start, stop, stop == cfg.steps or crossed(start, stop, cfg.checkpoint_every)))
            start = stop
        return units

    def _drive(self, bank: Bank) -> None:
        """The units left, dispatched to the workers and committed in stream order (the module docstring's
        schedule), between starting Ray and stopping it."""
        self._commit_times: list[float] = []  # perf_counter at the first and the latest commit of this process
        self._process_transitions = 0  # the transitions this process committed (a resumed run's share)
        self._first_commit_transitions = 0  # ... of which its first commit held
        self.loop_s = 0.0
        with self._open_workers_log(self.resumed_from is not None) as self.workers_handle:
            if self.step < self.config.steps:
                with ray_runtime(self.workers_config) as ray:
                    self._loop_t0 = time.perf_counter()
                    self._pipeline(ray, bank, _Pipeline(units=self._units(), handles=self._start_workers(ray)))
                    self.loop_s = time.perf_counter() - self._loop_t0
                    self._loop_t0 = None

    def _reset(self) -> None:
        super()._reset()
        self.worker_stats: dict[str, Any] = {"workers": self.workers_config.workers,
                                             "sync_every": self.workers_config.sync_every, "restarts": 0,
                                             "resubmitted": 0, "dropped_duplicates": 0, "snapshots": 0,
                                             "staleness_sum": 0, "staleness_max": 0, "transitions": 0,
                                             "worker_pids": []}
        self.loop_s_before = 0.0  # the loop seconds of the driver processes before a resume
        self.processes = 1
        self._loop_t0 = None

    def _checkpoint_state(self) -> dict[str, Any]:
        """The worker figures so far (a resumed run adds its own to them: ``summary.json`` covers the whole run)."""
        elapsed = time.perf_counter() - self._loop_t0 if self._loop_t0 is not None else 0.0
        counted = {k: v for k, v in self.worker_stats.items() if k in _SUMMED_STATS or k == "staleness_max"}
        return {**super()._checkpoint_state(),
                "workers": {**counted, "loop_s": self.loop_s_before + elapsed, "processes": self.processes}}

    def _resumed(self, ckpt: Path, state: dict[str, Any]) -> None:
        super()._resumed(ckpt, state)
        saved = state.get("workers")
        if not isinstance(saved, dict):  # a checkpoint written before the figures were kept
            return
        for key in (*_SUMMED_STATS, "staleness_max"):
            value = saved.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                self.worker_stats[key] = value
        loop_s = saved.get("loop_s")
        self.loop_s_before = float(loop_s) if isinstance(loop_s, (int, float)) and math.isfinite(loop_s) else 0.0
        processes = saved.get("processes")
        self.processes = (int(processes) if isinstance(processes, int) and processes >= 1 else 1) + 1

    def _summary(self, bank: Bank) -> dict[str, Any]:
        summary = super()._summary(bank)
        stats = dict(self.worker_stats)
        n = max(1, stats["transitions"])
        stats["staleness_mean"] = stats.pop("staleness_sum") / n
        # over every driver process of the run (a resumed run adds its figures to the checkpoint's)
        stats["loop_s"] = self.loop_s_before + self.loop_s  # from starting the workers to the last commit
        stats["processes"] = self.processes
        # steady state, of this process only (a resumed run's checkpoint holds no commit times of the earlier
        # processes): the transitions it committed after its first commit, over the time to its last commit
        stats["process_transitions"] = getattr(self, "_process_transitions", 0)
        stats["tasks_per_s"] = steady_rate(stats["process_transitions"], getattr(self, "_first_commit_transitions", 0),
                                           getattr(self, "_commit_times", []))
        summary["workers"] = stats
        return summary

    def _log_summary(self, summary: dict[str, Any]) -> None:
        logger.info("online %s with %d workers: %d steps, success %.3f, bank %d -> %d, %d restart(s)",
                    self.config.policy_kind, self.workers_config.workers, summary["steps"], summary["success_rate"],
                    summary["bank_size_start"], summary["bank_size_end"], summary["workers"]["restarts"])

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
        self.worker_handles = handles
        return handles

    def _pipeline(self, ray: Any, bank: Bank, p: _Pipeline) -> None:
        """Dispatch, collect and commit every unit left (the schedule of the module docstring)."""
        try:
            self._dispatch_ready(ray, bank, p)
            while p.next_commit < len(p.units):
                now = time.monotonic()
                for flight in p.restarting.values():  # ask a restarting worker again whether it is back
                    if flight.ref is None and now >= flight.retry_at:
                        flight.ref = p.handles[flight.worker].ready.remote()
                waiting = {f.ref: (i, False) for i, f in p.flights.items()}
                waiting.update({f.ref: (i, True) for i, f in p.restarting.items() if f.ref is not None})
                if not waiting:
                    time.sleep(RESTART_POLL_S)
                    continue
                ready, _ = ray.wait(list(waiting), num_returns=1, timeout=RESTART_POLL_S if p.restarting else 1.0)
                for ref in ready:
                    i, is_restart = waiting[ref]
                    if is_restart:
                        self._restarted(ray, i, p)
                    else:
                        self._collect(ray, i, ref, p)
                while p.next_commit in p.done:
                    i = p.next_commit
                    flight, result = p.done.pop(i)
                    self._commit_unit(bank, flight, result, p.units[i])
                    p.committed.add(i)
                    self._advanced(bank, len(result.steps))
                    p.next_commit += 1
                    self._dispatch_ready(ray, bank, p)
        finally:
            for handle in p.handles:
                with contextlib.suppress(Exception):
                    ray.kill(handle)

    def _dispatch_ready(self, ray: Any, bank: Bank, p: _Pipeline) -> None:
        """Send every unit whose predecessors (up to N - 1 in flight, none across a checkpoint) are committed."""
        wc = self.workers_config
        while p.next_dispatch < len(p.units) and p.next_commit >= max(p.next_dispatch - wc.workers + 1,
                                                                      p.first_of_segment[p.next_dispatch]):
            i = p.next_dispatch
            version = int(self.policy.version)
            if p.snapshot is None or (version != p.snapshot.version and (
                    i == p.first_of_segment[i] or version - p.snapshot.version >= wc.sync_every)):
                p.snapshot = self._snapshot()
                p.box = [ray.put(p.snapshot)]
                self.worker_stats["snapshots"] += 1
            start, stop, _ = p.units[i]
            message = self._message(bank, i, start, stop, p.snapshot.version)
            p.submit(i, _Flight(message=message, box=p.box, worker=i % wc.workers, attempt=1))
            p.next_dispatch += 1

    def _collect(self, ray: Any, i: int, ref: Any, p: _Pipeline) -> None:
        """Unit ``i``'s result: kept until its predecessors are committed (a worker that died is restarted)."""
        flight = p.flights.pop(i)
        try:
            result = ray.get(ref)
        except ray.exceptions.RayActorError as error:  # the worker died holding unit i
            self._lost(i, flight, error, p.restarting)
            return
        except ray.exceptions.RayTaskError as error:
            cause = error.cause if isinstance(getattr(error, "cause", None), BaseException) else None
            if isinstance(cause, MementoError):
                raise cause from None
            raise WorkerError(f"rollout worker {flight.worker} failed on steps {flight.message.steps[0]}-"
                              f"{flight.message.steps[-1]}: {_cause(error)}") from None
        if i in p.committed or i in p.done:  # never counted twice
            self.worker_stats["dropped_duplicates"] += 1
            return
        p.done[i] = (flight, result)

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

    def _restarted(self, ray: Any, i: int, p: _Pipeline) -> None:
        """A restarting worker answered: send it unit ``i`` again, unchanged (or ask again later)."""
        flight = p.restarting[i]
        try:
            info = ray.get(flight.ref)
        except ray.exceptions.ActorDiedError as error:  # beyond max_restarts, or its planner no longer builds
            raise WorkerError(f"rollout worker {flight.worker} could not be restarted: {_cause(error)}") from None
        except ray.exceptions.RayActorError:  # still restarting
            flight.ref, flight.retry_at = None, time.monotonic() + RESTART_POLL_S
            return
        del p.restarting[i]
        self.worker_stats["worker_pids"][flight.worker] = info["pid"]
        logger.info("rollout worker %d is back (pid %d): steps %d-%d again (attempt %d)", flight.worker, info["pid"],
                    flight.message.steps[0], flight.message.steps[-1], flight.attempt)
        p.submit(i, dataclasses.replace(flight, ref=None))


def steady_rate(transitions: int, first: int, times: Sequence[float]) -> float | None:
    """Transitions per second between a process's first and last commit: the ``transitions - first`` committed
    after the first commit (which held ``first``) over ``times[1] - times[0]``; None without two commits apart."""
    if len(times) != 2 or not times[1] > times[0] or transitions <= first:
        return None
    return (transitions - first) / (times[1] - times[0])


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
    return [parse_json(line, where=f"{path}:{number}", error=DataFormatError)
            for number, line in enumerate(path.read_bytes().splitlines(), start=1) if line.strip()]
