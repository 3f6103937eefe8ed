"""``memento bench online``: the online loop with the real planner, the synthetic bandit, and loop overhead.

Three parts, each written into one JSON document:

1. **real**: :func:`memento.runs.compare.run_comparison` on a shipped suite's split with the seed case
   bank and a real planner (Gemma 3 270M by default), once per seed of ``seeds``: per policy the success
   rate overall, early (the first ``window`` steps) and late (the last ``late_steps``), as the mean over
   seeds, and its difference to similarity with a 95% confidence interval (a paired bootstrap over the
   steps of each window, resampled within each seed: every policy sees the same task stream per seed);
   also LLM calls and wall milliseconds per task, so the comparison is fair on cost; and, unless ``ope`` is
   off, off-policy estimates (:func:`memento.ope.evaluate.evaluate_run`) from each seed's soft_q log of the greedy
   learned selector and of similarity, next to the measured success of the soft_q and similarity runs
   (:func:`ope_from_soft_q_run`, :func:`summarize_ope`): how far OPE can be trusted on this domain;
2. **synthetic**: :func:`memento.runs.regret.run_regret` for each policy on the synthetic bandit with
   a known oracle: mean per-step regret in the first and last fifth of the run;
3. **overhead**: the loop's milliseconds per step *excluding* the planner and judge calls, on a bank
   of ``overhead_bank`` cases (clustered random vectors, HNSW32), with a planner that answers
   instantly: encode + candidates + select + retain + learn + log;
4. **workers** (not in the default parts): the online loop with Ray rollout workers
   (:mod:`memento.runs.ray`), for each count in ``workers``. (a) Throughput: ``workers_steps`` tasks of the suite
   with the loop's soft-Q policy, the real encoder on the driver and an OpenAI-compatible planner that answers
   every request after ``workers_latency_ms`` (:func:`fixed_latency_openai`: a loopback HTTP server in its own
   process; each worker sends its requests through its own ``openai:`` planner); tasks/s in steady state (from
   the committed transitions' times) and end to end, against the in-process loop (``--workers 1``) and one Ray
   worker. (b) Learning: the synthetic bandit (:class:`SyntheticTextEnv`: its cases in the bank, its oracle
   behind a planner that runs in the workers) for ``workers_curve_steps`` transitions per seed of
   ``workers_curve_seeds``, in-process and with each worker count: the oracle's success probability of the
   chosen cases per window, and whether the last fifth with N workers is within noise of one worker (the
   paired difference over seeds within two standard errors).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import multiprocessing
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np

from memento.bank import CaseBank
from memento.bench.common import environment, make_vectors, write_results
from memento.config import (
    MAX_BENCH_ITEMS,
    MAX_BENCH_VECTORS,
    MAX_CANDIDATES,
    MAX_STEPS,
    MAX_WORKERS,
    OnlineLabelsConfig,
    check,
    check_choice,
    check_int,
    check_int_tuple,
)
from memento.encoders import Encoder
from memento.envs.synthetic import SyntheticBandit, SyntheticBanditConfig
from memento.envs.tasks import load_suite, seed_cases
from memento.errors import ConfigError, MementoError
from memento.formats import read_steps_jsonl
from memento.judges import make_judge
from memento.ope.evaluate import TargetSpec, evaluate_run
from memento.planners.base import CallablePlanner
from memento.planners.spec import build_planner, parse_planner_spec
from memento.policies import (
    PolicyConfig,
    PolicyKind,
    RandomConfig,
    SimilarityConfig,
    SoftQConfig,
    loop_policy,
    make_policy,
    regret_policy,
)
from memento.policies.soft_q import anchored
from memento.runs.compare import run_comparison
from memento.runs.qa import LoopConfig, OnlineLoop, qa_policy
from memento.runs.regret import RegretConfig, run_regret
from memento.runs.rundir import RunDir
from memento.runs.spans import LATE_STEPS, success_spans
from memento.types import Case, Task

__all__ = ["OnlineBenchConfig", "SyntheticTextEnv", "fixed_latency_openai", "format_online_table",
           "ope_from_soft_q_run", "run_online_bench", "summarize_ope"]

logger = logging.getLogger(__name__)


SoftQCandidates = Literal["all", "positive"]
BenchPolicy = Literal["similarity", "similarity_k1", "random", "uniform_positive", "soft_q", "soft_q_anchored",
                      "soft_q_features", "soft_q_labels", "soft_q_labels_relation", "soft_q_hindsight",
                      "soft_q_hindsight_relation", "soft_q_default", "soft_q_default_k1", "soft_q_default_hindsight",
                      "soft_q_pretrained", "soft_q_pretrained_frozen", "linucb", "best_of_c"]
"""The policies the benchmark compares: the four kinds, plus ``uniform_positive`` (uniform among the rewarded
candidates: the floor for a choice within similarity's pool), ``soft_q_anchored`` (soft-Q whose Q-network
is anchored on cosine similarity, ``QNetConfig.anchor="cosine"``), ``soft_q_features`` (anchored, and the
Q-network sees the case features: ``QNetConfig.features="case"``), ``soft_q_labels`` (``soft_q_features`` that
also learns from per-candidate planner labels online against the gold answer, :data:`BENCH_LABELS`),
``soft_q_hindsight`` (the same with hindsight targets only: the planner's own rewarded outputs, never the gold
answer), ``soft_q_labels_relation`` / ``soft_q_hindsight_relation`` (either with the Q-network's bilinear
relation term, ``QNetConfig.relation_rank`` = :data:`BENCH_RELATION_RANK`), ``soft_q_pretrained`` (soft-Q starting from
the trained Q-network ``OnlineBenchConfig.init_qnet``, e.g. ``memento train --from-labels`` on the train split,
learning on), ``soft_q_pretrained_frozen`` (the same without online updates), ``soft_q_default`` (the QA loop's
default soft-Q, :func:`memento.runs.qa.qa_policy`: per-case evidence, the learned set, online labels on the
informative steps), ``soft_q_default_hindsight`` (the same with hindsight targets only), ``similarity_k1`` and
``soft_q_default_k1`` (similarity and the default shown at most one case: K = 1) and ``best_of_c`` (not a
policy: an upper bound that scores the ``best_of_c`` positive-only nearest cases one by one with the planner's
likelihood of the *gold* answer and shows the best K)."""

_PRETRAINED = ("soft_q_pretrained", "soft_q_pretrained_frozen")
BENCH_LABELS = OnlineLabelsConfig(m=8, when="always")
"""The online labels of the ``soft_q_labels*`` / ``soft_q_hindsight*`` arms (issue 29's: every step; their ``target``
set per arm)."""
BENCH_RELATION_RANK = 16
"""The bilinear relation term's rank in the ``*_relation`` arms."""


def bench_policy(name: BenchPolicy, *, soft_q_positive_only: bool = False, init_qnet: str | None = None
                 ) -> PolicyConfig:
    """The loop config of a benchmark policy (soft-Q variants choose among rewarded candidates when asked)."""
    soft_q = SoftQConfig(positive_only=soft_q_positive_only)
    match name:
        case "uniform_positive":
            return RandomConfig(positive_only=True)
        case "soft_q":
            return soft_q
        case "soft_q_anchored":
            return dataclasses.replace(soft_q, qnet=dataclasses.replace(soft_q.qnet, anchor="cosine"))
        case "soft_q_features":
            return anchored(soft_q)
        case "soft_q_labels" | "soft_q_labels_relation" | "soft_q_hindsight" | "soft_q_hindsight_relation":
            rank = BENCH_RELATION_RANK if name.endswith("_relation") else 0
            target = "hindsight" if name.startswith("soft_q_hindsight") else "gold"
            return dataclasses.replace(anchored(soft_q, relation_rank=rank),
                                       labels=dataclasses.replace(BENCH_LABELS, target=target))
        case "soft_q_pretrained" | "soft_q_pretrained_frozen":
            if init_qnet is None:
                raise ConfigError(f"bench policy {name!r} needs a trained Q-network (--init-qnet DIR)")
            return dataclasses.replace(soft_q, init_qnet=str(init_qnet),
                                       updates_per_step=0 if name == "soft_q_pretrained_frozen" else 1)
        case "soft_q_default" | "soft_q_default_k1" | "soft_q_default_hindsight":
            default = qa_policy("soft_q")
            assert isinstance(default, SoftQConfig)
            target = "hindsight" if name.endswith("_hindsight") else "gold"
            return dataclasses.replace(default, labels=dataclasses.replace(default.labels, target=target))
        case "best_of_c" | "similarity_k1":
            return SimilarityConfig(positive_only=True)
        case _:
            return loop_policy(name)  # type: ignore[arg-type]


def _kind(name: str) -> PolicyKind:
    if name.startswith("soft_q"):
        return "soft_q"
    return {"uniform_positive": "random", "best_of_c": "similarity",  # type: ignore[return-value]
            "similarity_k1": "similarity"}.get(name, name)


def bench_k(name: str, k: int) -> int:
    """The cases a benchmark policy shows: 1 for the ``*_k1`` arms, else ``k``."""
    return 1 if name.endswith("_k1") else k


class BestOfCPlanner:
    """The ``best_of_c`` upper bound: of the cases it is shown (the ``C`` nearest rewarded ones), it scores each
    alone with the planner's log-likelihood of the task's gold answer (length-normalised), keeps the ``k`` best
    (best first) and plans with them: ``C`` scored prompts + 1 generation per task, and it reads the answer."""

    def __init__(self, planner: Any, k: int):
        if not callable(getattr(planner, "score_many", None)):
            raise ConfigError(f"best_of_c needs a planner that scores answers; {planner!r} does not")
        self.planner = planner
        self.k = k
        self.score_passes = 0

    def plan(self, task: Task, cases: Any) -> Any:
        return self.plan_many([task], [cases])[0]

    def plan_many(self, tasks: Any, cases: Any) -> list[Any]:
        chosen = [list(c) for c in cases]
        rows = [b for b, task in enumerate(tasks) if task.answers and len(chosen[b]) > self.k]
        if rows:
            scores = self.planner.score_many([tasks[b] for b in rows], [[[c] for c in chosen[b]] for b in rows])
            for b, task_scores in zip(rows, scores):
                mean_C = np.asarray([s.logprob / max(1, s.n_tokens) for s in task_scores], dtype=np.float64)
                chosen[b] = [chosen[b][j] for j in np.argsort(-mean_C, kind="stable")[:self.k]]
                self.score_passes += len(task_scores)
        return list(self.planner.plan_many(tasks, chosen))

    def __repr__(self) -> str:
        return f"BestOfCPlanner({self.planner!r}, k={self.k})"


@dataclasses.dataclass(frozen=True, kw_only=True)
class OnlineBenchConfig:
    """``memento bench online``: ``steps`` tasks per policy and seed in the real part (``late_steps`` make the
    late window, ``window`` the early one), for each of ``seeds``; ``policies`` (:data:`BenchPolicy`); the
    suite, split and planner of the real part; ``synthetic_steps`` bandit steps per policy; ``overhead_bank``
    cases and ``overhead_steps`` steps for the overhead part; ``parts``; ``soft_q_candidates``: soft-Q variants
    choose among all candidates or the rewarded ones only; ``bootstrap``: resamples of the confidence
    intervals; ``retain_judge``: the judge of a retained case's stored reward (default: exact, as the step's
    reward; ``contains`` keeps a ``*-real`` suite's bank as lenient as its seed bank); ``ope``: after each seed's
    comparison, estimate off-policy from the soft_q run's log the greedy learned selector and similarity
    (:func:`ope_from_soft_q_run`), with ``ope_bootstrap`` resamples for their intervals (0: none)."""

    steps: int = dataclasses.field(default=600, metadata={"help": "tasks per policy and seed in the real part"})
    policies: tuple[BenchPolicy, ...] = dataclasses.field(default=("soft_q", "similarity"), metadata={
        "help": f"comma-separated, from {', '.join(get_args(BenchPolicy))}"})
    suite: str = dataclasses.field(default="facts", metadata={"help": "shipped suite"})
    split: str = dataclasses.field(default="test", metadata={"help": "split of the suite"})
    planner: str = dataclasses.field(default="gemma", metadata={"help": "the planner of the real part"})
    late_steps: int = dataclasses.field(default=LATE_STEPS, metadata={"help": "the 'late' window"})
    window: int = dataclasses.field(default=50, metadata={"help": "the 'early' window of the real part"})
    synthetic_steps: int = dataclasses.field(default=1500, metadata={"help": "bandit steps per policy"})
    overhead_bank: int = dataclasses.field(default=100_000, metadata={"help": "bank size for the overhead part"})
    overhead_steps: int = dataclasses.field(default=200, metadata={"help": "steps per policy in the overhead part"})
    parts: tuple[str, ...] = dataclasses.field(default=("real", "synthetic", "overhead"), metadata={"help": (
        "comma-separated parts to run: real, synthetic, overhead, workers (Ray rollout workers: tasks/s with a "
        "fixed-latency planner, and the synthetic learning curve, per --workers count)")})
    seeds: tuple[int, ...] = dataclasses.field(default=(0,), metadata={"help": (
        "seeds of the real part, one run per policy each")})
    soft_q_candidates: SoftQCandidates = dataclasses.field(default="all", metadata={"help": (
        "real part: soft_q chooses among all candidates or only rewarded ones")})
    bootstrap: int = 2000
    retain_judge: str | None = dataclasses.field(default=None, metadata={"help": (
        "real part: the judge of a retained case's stored reward")})
    init_qnet: str | None = dataclasses.field(default=None, metadata={"help": (
        "real part: the trained Q-network of soft_q_pretrained and soft_q_pretrained_frozen (a `memento train` run "
        "directory, e.g. --from-labels on the suite's train split)")})
    best_of_c: int = dataclasses.field(default=16, metadata={"help": (
        "real part: the nearest rewarded cases the best_of_c upper bound scores per task")})
    resume: bool = dataclasses.field(default=False, metadata={"help": (
        "real part: keep the finished runs in --workdir (resume unfinished ones) instead of refusing a non-empty "
        "run directory; lets policies be added to a benchmark later")})
    ope: bool = dataclasses.field(default=True, metadata={"help": (
        "real part: the off-policy estimates (memento evaluate, from each seed's soft_q log) of the greedy learned "
        "selector and of similarity next to the measured figures (--no-ope skips them)")})
    ope_bootstrap: int = dataclasses.field(default=200, metadata={"help": (
        "real part: bootstrap resamples of the off-policy estimates' intervals (0: none)")})
    workers: tuple[int, ...] = dataclasses.field(default=(1, 2, 4), metadata={"help": (
        "workers part: the worker counts, side by side in one run")})
    workers_steps: int = dataclasses.field(default=120, metadata={"help": "workers part: tasks per throughput run"})
    workers_latency_ms: float = dataclasses.field(default=200.0, metadata={"help": (
        "workers part: the fixed planner latency")})
    workers_curve_steps: int = dataclasses.field(default=1000, metadata={"help": (
        "workers part: transitions per learning-curve run on the synthetic bandit")})
    workers_curve_seeds: tuple[int, ...] = (0, 1, 2)

    def __post_init__(self) -> None:
        for name in ("steps", "late_steps", "window", "synthetic_steps", "overhead_steps", "workers_steps",
                     "workers_curve_steps"):
            check_int(self, name, 1, MAX_STEPS)
        check_int(self, "overhead_bank", 1, MAX_BENCH_VECTORS)
        check_int(self, "bootstrap", 1, MAX_BENCH_ITEMS)
        check_int_tuple(self, "workers", 1, MAX_WORKERS, distinct=True)
        check(isinstance(self.workers_latency_ms, (int, float)) and not isinstance(self.workers_latency_ms, bool)
              and 0 <= self.workers_latency_ms < 60_000, type(self), "workers_latency_ms", self.workers_latency_ms,
              "must be a number of milliseconds in [0, 60000)")
        check(bool(self.workers_curve_seeds) and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0
                                                     for x in self.workers_curve_seeds)
              and len(set(self.workers_curve_seeds)) == len(self.workers_curve_seeds), type(self),
              "workers_curve_seeds", self.workers_curve_seeds, "must be distinct integers >= 0")
        known = get_args(BenchPolicy)
        check(bool(self.policies) and all(p in known for p in self.policies)
              and len(set(self.policies)) == len(self.policies), type(self), "policies", self.policies,
              f"must be distinct names from {known}")
        check(all(p in ("real", "synthetic", "overhead", "workers") for p in self.parts), type(self), "parts",
              self.parts, "must be a subset of ('real', 'synthetic', 'overhead', 'workers')")
        check(bool(self.seeds) and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in self.seeds)
              and len(set(self.seeds)) == len(self.seeds), type(self), "seeds", self.seeds,
              "must be distinct integers >= 0")
        check_choice(self, "soft_q_candidates", SoftQCandidates)
        check(self.retain_judge in (None, "exact", "f1", "contains", "numeric"), type(self), "retain_judge",
              self.retain_judge, "must be null or one of exact, f1, contains, numeric")
        check_int(self, "best_of_c", 1, MAX_CANDIDATES)
        check(isinstance(self.resume, bool), type(self), "resume", self.resume, "must be true or false")
        check(isinstance(self.ope, bool), type(self), "ope", self.ope, "must be true or false")
        check_int(self, "ope_bootstrap", 0, MAX_BENCH_ITEMS)
        check(self.init_qnet is not None or not any(p in _PRETRAINED for p in self.policies), type(self),
              "init_qnet", self.init_qnet, f"policies {_PRETRAINED} need a trained Q-network directory")

    def loop_policies(self) -> dict[str, PolicyConfig]:
        """Every policy's loop config (``best_of_c``: the positive-only similarity that feeds its C cases)."""
        positive = self.soft_q_candidates == "positive"
        return {name: bench_policy(name, soft_q_positive_only=positive, init_qnet=self.init_qnet)
                for name in self.policies}


def paired_difference(x_SW: np.ndarray, y_SW: np.ndarray, *, resamples: int, rng: np.random.Generator
                      ) -> dict[str, Any]:
    """Mean of ``x - y`` over seeds and steps (``S`` seeds by ``W`` steps of one window, 0/1 successes, paired
    by step: the same task) and its 95% percentile-bootstrap interval, resampling steps within each seed."""
    d_SW = np.asarray(x_SW, dtype=np.float64) - np.asarray(y_SW, dtype=np.float64)
    if d_SW.ndim != 2 or d_SW.shape[1] == 0:
        raise ConfigError(f"paired_difference: expected (seeds, steps) of a non-empty window, got {d_SW.shape}")
    s, w = d_SW.shape
    means_R = np.empty(resamples)
    for r in range(resamples):
        index_SW = rng.integers(0, w, size=(s, w))
        means_R[r] = np.take_along_axis(d_SW, index_SW, axis=1).mean()
    low, high = np.percentile(means_R, [2.5, 97.5])
    return {"mean": float(d_SW.mean()), "ci95": [float(low), float(high)], "seeds": int(s), "steps": int(w)}


def summarize_real(successes: dict[str, list[np.ndarray]], *, window: int, late_steps: int, resamples: int,
                   baseline: str = "similarity", seed: int = 0) -> dict[str, Any]:
    """Per policy: success overall / early / late as the mean over seeds (and per seed), and the difference
    to ``baseline`` with its bootstrap interval (:func:`paired_difference`)."""
    rng = np.random.default_rng(seed)
    out: dict[str, Any] = {}
    for name, runs in successes.items():
        steps = min(len(r) for r in runs)
        spans = success_spans(steps, window=window, late_steps=late_steps)
        entry: dict[str, Any] = {"steps": steps, "seeds": len(runs), "windows": {k: list(v) for k, v in spans.items()}}
        for span, (a, b) in spans.items():
            per_seed = [float(np.mean(r[a:b])) for r in runs]
            entry[span] = float(np.mean(per_seed))
            entry[f"{span}_per_seed"] = per_seed
            if baseline in successes and name != baseline:
                x_SW = np.stack([r[a:b] for r in runs])
                y_SW = np.stack([r[a:b] for r in successes[baseline]])
                entry[f"{span}_minus_{baseline}"] = paired_difference(x_SW, y_SW, resamples=resamples, rng=rng)
        out[name] = entry
    return out


OPE_LOGGER = "soft_q"
"""The run whose log the real part's off-policy estimates read."""
OPE_LEVEL = 0.95
"""The confidence level of the off-policy estimates' bootstrap intervals."""
OPE_TARGETS = {"greedy_soft_q": "soft_q", "similarity": "similarity"}
"""Each off-policy target and the run whose measured success it is shown next to."""
OPE_NOTE = ("Off-policy estimates (memento evaluate, greedy targets) from the soft_q run's own log: its candidate "
            "sets, logging probabilities and rewards. greedy_soft_q is the run's final selector/ taking its "
            "arg-max K cases on every logged step; it neither samples nor learns, whereas the measured soft_q figure "
            "is the online policy that sampled from softmax(Q / alpha) and learned as it went, so that gap mixes OPE "
            "error with the difference between the two policies. similarity is the bench's similarity policy "
            "(deterministic), measured in its own run, whose bank grew with its own successes: its gap is the "
            "cleaner check of OPE on this domain. With K > 1 the K = 1 estimators (ips, snips, dm, dr) value a "
            "hybrid policy (first case from the target, the rest from the logger); read the slate estimators "
            "(inclusion_ips, pi, pi_set), which assume an additive slate reward. Values are mean rewards, which "
            "are success rates under the exact judge.")


def ope_from_soft_q_run(run_dir: str | Path, *, encoder: Any, similarity: PolicyConfig,
                        measured: dict[str, float | None], bootstrap: int, seed: int) -> dict[str, Any]:
    """Off-policy estimates from one soft_q run directory (``steps.jsonl``, ``bank/``, ``selector/``) of the
    greedy learned selector (``greedy_soft_q``) and of ``similarity`` (the benchmark's similarity config), each
    next to the ``measured`` overall success of the run it corresponds to (:data:`OPE_TARGETS`; ``None`` when
    that run was not made) and the gap estimate - measured. ``encoder`` must be the one the runs used."""
    run_dir = Path(run_dir)
    targets = [TargetSpec(name="greedy_soft_q", kind="selector", path=run_dir / RunDir.SELECTOR),
               TargetSpec(name="similarity", kind="similarity", policy=similarity)]
    t0 = time.perf_counter()
    evaluation = evaluate_run(run_dir, targets, make_policy=make_policy, encoder=encoder, greedy=True,
                              n_boot=bootstrap, level=OPE_LEVEL, seed=seed)
    out: dict[str, Any] = {"logged_by": OPE_LOGGER, "rounds": evaluation.rounds, "skipped": evaluation.skipped,
                           "k_max": evaluation.k_max, "observed_mean_reward": evaluation.observed_mean_reward,
                           "bootstrap": bootstrap, "level": evaluation.config.level, "targets": {}}
    for name, results in evaluation.estimates.items():
        policy = OPE_TARGETS[name]
        value = measured.get(policy)
        estimates = {}
        for r in results:
            entry = r.to_json()
            entry["minus_measured"] = None if value is None or entry["value"] is None else entry["value"] - value
            estimates[r.estimator] = entry
        out["targets"][name] = {"measured_policy": policy, "measured_overall": value, "estimates": estimates}
    out["ope_s"] = time.perf_counter() - t0
    return out


def _mean(values: list[Any]) -> float | None:
    return None if not values or any(v is None for v in values) else float(np.mean(values))


def summarize_ope(per_seed: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per target and estimator, over the seeds of :func:`ope_from_soft_q_run`: the mean estimate, the mean
    measured figure and their gap (estimate - measured, of the means), with the per-seed values and intervals
    (``None`` where a seed has no number)."""
    out: dict[str, Any] = {}
    seeds = list(per_seed)
    for name in per_seed[seeds[0]]["targets"]:
        entries = [per_seed[s]["targets"][name] for s in seeds]
        measured_S = [e["measured_overall"] for e in entries]
        measured = _mean(measured_S)
        estimators = [k for k in entries[0]["estimates"] if all(k in e["estimates"] for e in entries)]
        estimates = {}
        for estimator in estimators:
            results = [e["estimates"][estimator] for e in entries]
            value = _mean([r["value"] for r in results])
            ess_S = [r["ess"] for r in results]
            estimates[estimator] = {
                "value": value, "minus_measured": None if value is None or measured is None else value - measured,
                "value_per_seed": [r["value"] for r in results],
                "ci_per_seed": [[r["ci_low"], r["ci_high"]] for r in results],
                "ess": _mean(ess_S), "warnings": sorted({w for r in results for w in r["warnings"]})}
        out[name] = {"measured_policy": entries[0]["measured_policy"], "measured_overall": measured,
                     "measured_per_seed": measured_S, "estimates": estimates}
    return out


def _real_ope(config: OnlineBenchConfig, encoder: Any, out: Path, seed: int,
              successes: dict[str, list[np.ndarray]]) -> dict[str, Any]:
    """One seed's off-policy estimates (:func:`ope_from_soft_q_run`) from ``out/soft_q``; a failure is recorded
    (``{"error": ...}``), not raised, so the measured figures of a long run are kept."""
    measured = {policy: float(np.mean(successes[policy][-1])) if policy in successes else None
                for policy in set(OPE_TARGETS.values())}
    try:
        return ope_from_soft_q_run(out / OPE_LOGGER, encoder=encoder, similarity=bench_policy("similarity"),
                                   measured=measured, bootstrap=config.ope_bootstrap, seed=seed)
    except MementoError as error:
        logger.warning("bench online: off-policy estimates of seed %d failed: %s", seed, error)
        return {"error": str(error)}


def _real(config: OnlineBenchConfig, encoder: Any, workdir: Path) -> dict[str, Any]:
    from memento.envs.tasks import load_suite
    from memento.judges import make_judge

    planner = build_planner(parse_planner_spec(config.planner))
    tasks, cases = load_suite(config.suite, config.split), seed_cases(config.suite)
    per_seed: dict[str, Any] = {}
    ope_per_seed: dict[str, Any] = {}
    successes: dict[str, list[np.ndarray]] = {name: [] for name in config.policies}
    cost: dict[str, dict[str, list[float]]] = {name: {"llm_calls_per_task": [], "forward_passes_per_task": [],
                                                      "ms_per_task": [], "memory_tokens_per_task": [],
                                                      "cases_per_task": []} for name in config.policies}
    for seed in config.seeds:
        loop_config = LoopConfig(steps=config.steps, seed=seed, checkpoint_every=0, tensorboard=False,
                                 window=config.window)
        out = workdir / "real" / f"seed-{seed}"
        common = dict(make_policy=make_policy, late_steps=config.late_steps, encoder=encoder,
                      judge=make_judge("exact"), tasks=tasks, seed_cases=cases, resume=config.resume,
                      retain_judge=None if config.retain_judge is None else make_judge(config.retain_judge))
        learned = {name: c for name, c in config.loop_policies().items() if name != "best_of_c"}
        comparison: dict[str, Any] = {"policies": {}}
        for k in sorted({bench_k(name, loop_config.k) for name in learned}, reverse=True):  # one stream per K
            arms = {name: c for name, c in learned.items() if bench_k(name, loop_config.k) == k}
            part = run_comparison(arms, config=dataclasses.replace(loop_config, k=k),
                                  out_dir=out / ("" if k == loop_config.k else f"k{k}"), planner=planner, **common)
            comparison = {**part, "policies": {**comparison["policies"], **part["policies"]}} \
                if comparison["policies"] else part
        passes: dict[str, float] = {name: comparison["policies"][name]["llm_calls"]
                                    + comparison["policies"][name].get("score_calls", 0) for name in learned}
        if "best_of_c" in config.policies:  # the upper bound: C cases reach the planner wrapper, which keeps K
            upper = run_comparison({"best_of_c": bench_policy("best_of_c")},
                                   config=dataclasses.replace(loop_config, k=config.best_of_c), out_dir=out / "upper",
                                   planner=BestOfCPlanner(planner, loop_config.k), **common)
            comparison["policies"]["best_of_c"] = upper["policies"]["best_of_c"]
            shown = read_steps_jsonl(out / "upper" / "best_of_c" / "steps.jsonl")
            passes["best_of_c"] = upper["policies"]["best_of_c"]["llm_calls"] + sum(
                len(r.chosen_ids) for r in shown if len(r.chosen_ids) > loop_config.k)
        per_seed[str(seed)] = comparison
        for name in config.policies:
            sub = "upper" if name == "best_of_c" else "" if bench_k(name, loop_config.k) == loop_config.k else "k1"
            records = read_steps_jsonl(out / sub / name / "steps.jsonl")
            successes[name].append(np.asarray([r.success for r in records], dtype=np.float64))
            run = comparison["policies"][name]
            cost[name]["llm_calls_per_task"].append(run["llm_calls"] / max(1, config.steps))
            cost[name]["forward_passes_per_task"].append(passes[name] / max(1, config.steps))
            cost[name]["ms_per_task"].append(run["ms_per_step"]["total"])
            cost[name]["memory_tokens_per_task"].append(run.get("memory_tokens", 0) / max(1, len(records)))
            cost[name]["cases_per_task"].append(float(np.mean([len(r.chosen_ids) for r in records])) if records else 0.)
        if config.ope and OPE_LOGGER in config.policies:
            ope_per_seed[str(seed)] = _real_ope(config, encoder, out, seed, successes)
    summary = summarize_real(successes, window=config.window, late_steps=config.late_steps,
                             resamples=config.bootstrap)
    for name in config.policies:
        summary[name].update({k: float(np.mean(v)) for k, v in cost[name].items()})
    result = {"planner": config.planner, "suite": config.suite, "split": config.split, "seeds": list(config.seeds),
              "retain_judge": config.retain_judge or "exact",
              "steps": config.steps, "window": config.window, "late_steps": config.late_steps,
              "policies": {name: dataclasses.asdict(c) for name, c in config.loop_policies().items()},
              "summary": summary, "per_seed": per_seed}
    if "soft_q" in summary and "similarity" in summary:
        result["late_gap_soft_q_minus_similarity"] = summary["soft_q"]["late"] - summary["similarity"]["late"]
    if config.ope:
        result["ope"] = _ope_result(config, ope_per_seed)
    return result


def _ope_result(config: OnlineBenchConfig, per_seed: dict[str, Any]) -> dict[str, Any]:
    head: dict[str, Any] = {"logged_by": OPE_LOGGER, "greedy_targets": True, "bootstrap": config.ope_bootstrap,
                            "level": OPE_LEVEL, "note": OPE_NOTE}
    if OPE_LOGGER not in config.policies:
        return {**head, "skipped": f"no {OPE_LOGGER} run to read a log from (policies {list(config.policies)})"}
    done = {seed: r for seed, r in per_seed.items() if "error" not in r}
    out = {**head, "seeds": [int(seed) for seed in done], "per_seed": per_seed}
    if done:
        out["summary"] = summarize_ope(done)
    return out


def _synthetic(config: OnlineBenchConfig, workdir: Path) -> dict[str, Any]:
    out = {}
    seed = config.seeds[0]
    for policy in config.policies:
        regret_config = regret_policy(_kind(policy))
        if policy == "soft_q_anchored":
            assert isinstance(regret_config, SoftQConfig)
            regret_config = dataclasses.replace(regret_config,
                                                qnet=dataclasses.replace(regret_config.qnet, anchor="cosine"))
        result = run_regret(SyntheticBandit(SyntheticBanditConfig(seed=seed)),
                            RegretConfig(steps=config.synthetic_steps, policy=regret_config, seed=seed),
                            make_policy=make_policy, workdir=workdir / "synthetic" / policy)
        out[policy] = result.summary()
    return out


def _overhead(config: OnlineBenchConfig, encoder: Any, workdir: Path) -> dict[str, Any]:
    rng = np.random.default_rng(config.seeds[0])
    n = config.overhead_bank
    bank_dir = workdir / "overhead-seed-bank"
    t0 = time.perf_counter()
    with CaseBank.create(bank_dir, encoder.dim, index="HNSW32,Flat") as bank:
        vectors = make_vectors(rng, n, encoder.dim, "clustered")
        for start in range(0, n, 10_000):
            stop = min(n, start + 10_000)
            bank.add([Case(state=f"synthetic case {i}", action=f"answer {i}", reward=float(i % 2))
                      for i in range(start, stop)], vectors[start:stop])
    build_s = time.perf_counter() - t0
    planner = CallablePlanner(lambda task, cases: task.answers[0] if len(task.question) % 2 else "wrong",
                              name="instant")
    out = {"bank_cases": n, "bank_index": "HNSW32,Flat", "bank_build_s": build_s, "policies": {}}
    for policy, policy_config in config.loop_policies().items():
        loop_config = LoopConfig(steps=config.overhead_steps, seed=config.seeds[0], policy=policy_config,
                                 checkpoint_every=0, tensorboard=False)
        loop = OnlineLoop(loop_config, make_policy=make_policy, encoder=encoder, planner=planner,
                          judge=make_judge("exact"),
                          tasks=load_suite(config.suite, config.split), out_dir=workdir / "overhead" / policy,
                          bank_dir=bank_dir)
        summary = loop.run()
        out["policies"][policy] = summary["ms_per_step"]
    return out


# ---------------------------------------------------------------- the workers part


def _chat_reply(text: str) -> dict[str, Any]:
    return {"id": "fixed", "object": "chat.completion", "model": "fixed-latency",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "text": text,
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 0, "completion_tokens": 1}}


def _fixed_latency_server(latency_ms: float, reply: str) -> ThreadingHTTPServer:
    """An OpenAI-compatible server on 127.0.0.1 (a free port): every POST (``/chat/completions`` or
    ``/completions``) is answered with ``reply`` after ``latency_ms``, concurrently (one thread per request)."""
    delay_s = latency_ms / 1000.0
    body = json.dumps(_chat_reply(reply)).encode("utf-8")

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as a real server

        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            time.sleep(delay_s)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    return server


def _serve_fixed_latency(latency_ms: float, reply: str, port_queue: Any) -> None:
    """The server process: report the port, serve until terminated."""
    server = _fixed_latency_server(latency_ms, reply)
    port_queue.put(server.server_address[1])
    server.serve_forever(poll_interval=0.1)


@contextlib.contextmanager
def fixed_latency_openai(latency_ms: float, *, reply: str = "I do not know.", process: bool = True
                         ) -> Iterator[str]:
    """A planner of fixed latency for the benchmark and the tests: an OpenAI-compatible server on 127.0.0.1 that
    answers every request with ``reply`` after ``latency_ms``; yields its base URL (``http://127.0.0.1:PORT/v1``,
    for ``--planner openai:MODEL@URL``). ``process=True`` runs it in its own process (so it never competes with
    the caller for the GIL), else in a thread of this one."""
    if not process:
        server = _fixed_latency_server(latency_ms, reply)
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}/v1"
        finally:
            server.shutdown()
            server.server_close()
        return
    context = multiprocessing.get_context("spawn")
    ports = context.Queue()
    child = context.Process(target=_serve_fixed_latency, args=(latency_ms, reply, ports), daemon=True)
    child.start()
    try:
        port = ports.get(timeout=120)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        child.terminate()
        child.join(timeout=10)


class _LookupEncoder:
    """Texts -> the synthetic world's vectors (tasks and cases are named by their texts): no model."""

    def __init__(self, vectors: dict[str, np.ndarray], dim: int):
        self.vectors = vectors
        self.dim = dim

    def encode(self, texts: str | Sequence[str], **_: Any) -> np.ndarray:
        if isinstance(texts, str):
            return self.vectors[texts].copy()
        return np.stack([self.vectors[t] for t in texts]) if len(texts) else np.zeros((0, self.dim), np.float32)

    def __repr__(self) -> str:
        return f"LookupEncoder({len(self.vectors)} texts, dim={self.dim})"


class SyntheticPlanner:
    """The bandit's oracle as a planner: answers ``"1"`` when one uniform draw, fixed by the task (its ``meta``
    ``draw``), falls below the success probability of the cases shown, else ``"0"``; the exact judge turns it into
    the reward. It rebuilds the (seeded) world where it runs, so a Ray worker needs only its config."""

    def __init__(self, config: SyntheticBanditConfig, latency_ms: float = 0.0):
        self.config = config
        self.latency_ms = latency_ms
        self._env: SyntheticBandit | None = None

    @property
    def env(self) -> SyntheticBandit:
        if self._env is None:
            self._env = SyntheticBandit(self.config)
        return self._env

    def __getstate__(self) -> dict[str, Any]:
        return {"config": self.config, "latency_ms": self.latency_ms, "_env": None}

    def plan(self, task: Task, cases: Sequence[Case]) -> Any:
        from memento.planners.base import PlanOutput

        if self.latency_ms:
            time.sleep(self.latency_ms / 1000.0)
        p = self.env.success_prob(task, self.env.positions([str(c.id) for c in cases]))
        return PlanOutput(text="1" if float(task.meta["draw"]) < p else "0")

    def plan_many(self, tasks: Sequence[Task], cases: Sequence[Sequence[Case]]) -> list[Any]:
        return [self.plan(task, c) for task, c in zip(tasks, cases)]

    def __repr__(self) -> str:
        return f"SyntheticPlanner(seed={self.config.seed}, latency_ms={self.latency_ms:g})"


@dataclasses.dataclass
class SyntheticTextEnv:
    """The synthetic bandit (:class:`~memento.envs.synthetic.SyntheticBandit`) as an online-loop environment:
    ``tasks`` (each with its type and its reward draw in ``meta``), the world's cases as seed cases (a bank holds
    them at the bandit's positions), a lookup ``encoder`` and the oracle ``planner``. The world is
    ``SyntheticBanditConfig(seed=0)``; ``seed`` draws the tasks and their draws."""

    env: SyntheticBandit
    tasks: list[Task]
    seed_cases: list[Case]
    encoder: _LookupEncoder
    planner: SyntheticPlanner

    @classmethod
    def create(cls, n_tasks: int, seed: int, *, latency_ms: float = 0.0,
               world: SyntheticBanditConfig | None = None) -> SyntheticTextEnv:
        world = world if world is not None else SyntheticBanditConfig(seed=0)
        env = SyntheticBandit(world)
        rng = np.random.default_rng(seed)
        cases, emb_ND = env.cases()
        vectors = {case.state: emb_ND[i] for i, case in enumerate(cases)}
        tasks = []
        for i in range(n_tasks):
            sampled, state_D = env.sample_task(rng)
            t = env.task_type(sampled)
            question = f"synthetic task {i} of type {t}"
            vectors[question] = state_D
            tasks.append(Task(id=f"syn-task-{i:06d}", question=question, answers=("1",), family=f"type-{t}",
                              meta={"task_type": t, "draw": float(rng.uniform())}))
        return cls(env=env, tasks=tasks, seed_cases=cases, encoder=_LookupEncoder(vectors, world.dim),
                   planner=SyntheticPlanner(world, latency_ms))

    def success_probs(self, steps_path: Path) -> np.ndarray:
        """The oracle's success probability of each logged step's chosen cases (in step order)."""
        by_id = {task.id: task for task in self.tasks}
        records = read_steps_jsonl(steps_path)
        return np.asarray([self.env.success_prob(by_id[r.task_id], self.env.positions(r.chosen_ids))
                           for r in records], dtype=np.float64)


def _steady_rate(steps_path: Path) -> float | None:
    """Tasks per second between the first and the last committed transition (startup excluded)."""
    times = [r.time for r in read_steps_jsonl(steps_path)]
    return (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 and times[-1] > times[0] else None


def _run_loop(loop_config: LoopConfig, workers: int | None, out: Path, *, planner: Any, encoder: Any,
              tasks: list[Task], seed_cases: list[Case], sync_every: int = 1) -> dict[str, Any]:
    """One run in-process (``workers=None``) or with Ray workers; its summary."""
    from memento.runs.ray import RayOnlineLoop, WorkersConfig

    common: dict[str, Any] = dict(make_policy=make_policy, encoder=encoder, judge=make_judge("exact"), tasks=tasks,
                                  seed_cases=seed_cases, out_dir=out)
    if workers is None:
        return OnlineLoop(loop_config, planner=planner, **common).run()
    return RayOnlineLoop(loop_config, workers=WorkersConfig(workers=workers, sync_every=sync_every),
                         planner=planner, **common).run()


def _workers(config: OnlineBenchConfig, encoder: Any, workdir: Path, *, out: str | Path,
             partial: dict[str, Any]) -> dict[str, Any]:
    from memento.runs.ray import WorkersConfig, ray_runtime

    counts = sorted(config.workers)
    result: dict[str, Any] = {"counts": counts, "latency_ms": config.workers_latency_ms,
                              "steps": config.workers_steps, "suite": config.suite, "split": config.split}
    tasks, cases = load_suite(config.suite, config.split), seed_cases(config.suite)
    with ray_runtime(WorkersConfig(workers=max(counts))) as ray, \
            fixed_latency_openai(config.workers_latency_ms) as url:
        result["ray"] = {"version": ray.__version__, "cpus": ray.cluster_resources().get("CPU")}
        spec = parse_planner_spec(f"openai:fixed-latency@{url}")
        loop_config = LoopConfig(steps=config.workers_steps, seed=config.seeds[0], tensorboard=False)
        runs: dict[str, Any] = {}
        for label, n in [("in_process", None)] + [(f"ray_{c}", c) for c in counts]:
            t0 = time.perf_counter()
            planner = build_planner(spec) if n is None else spec
            summary = _run_loop(loop_config, n, workdir / "workers" / "throughput" / label, planner=planner,
                                encoder=encoder, tasks=tasks, seed_cases=cases)
            wall = time.perf_counter() - t0
            rate = _steady_rate(workdir / "workers" / "throughput" / label / RunDir.STEPS)
            runs[label] = {"workers": n, "tasks_per_s": rate, "end_to_end_tasks_per_s": config.workers_steps / wall,
                           "wall_s": wall, "ms_per_step": summary["ms_per_step"],
                           **({"staleness_mean": summary["workers"]["staleness_mean"],
                               "staleness_max": summary["workers"]["staleness_max"],
                               "snapshots": summary["workers"]["snapshots"]} if n is not None else {})}
            logger.info("bench online workers: %s %.2f tasks/s", label, rate or float("nan"))
        base = runs["in_process"]["tasks_per_s"]
        base_ray = runs["ray_1"]["tasks_per_s"] if 1 in counts else None
        for run in runs.values():
            rate = run["tasks_per_s"]
            run["speedup_vs_in_process"] = rate / base if rate and base else None
            run["speedup_vs_ray_1"] = rate / base_ray if rate and base_ray else None
        result["throughput"] = runs
        write_results(out, {**partial, "workers": result})

        result["learning"] = _workers_learning(config, counts, workdir / "workers" / "learning")
    return result


def _workers_learning(config: OnlineBenchConfig, counts: list[int], workdir: Path) -> dict[str, Any]:
    """The synthetic bandit's learning curve in-process and with each worker count, for the same transitions."""
    from memento.runs.regret import RegretConfig

    regret = RegretConfig()
    steps = config.workers_curve_steps
    window = max(1, steps // 10)
    late = max(1, steps // 5)
    curves: dict[str, list[np.ndarray]] = {}
    for seed in config.workers_curve_seeds:
        env = SyntheticTextEnv.create(steps, seed)
        loop_config = LoopConfig(steps=steps, k=regret.k, candidates=regret.candidates, policy=regret_policy("soft_q"),
                                 seed=seed, shuffle=False, retain=False, checkpoint_every=0, tensorboard=False,
                                 window=window)
        for label, n in [("in_process", None)] + [(f"ray_{c}", c) for c in counts]:
            out = workdir / f"seed-{seed}" / label
            _run_loop(loop_config, n, out, planner=env.planner, encoder=env.encoder, tasks=env.tasks,
                      seed_cases=env.seed_cases)
            curves.setdefault(label, []).append(env.success_probs(out / RunDir.STEPS))
    reference = "ray_1" if 1 in counts else "in_process"
    out_curves: dict[str, Any] = {}
    for label, runs in curves.items():
        p_ST = np.stack(runs)
        windows = [float(p_ST[:, a:a + window].mean()) for a in range(0, steps, window)]
        late_S = p_ST[:, steps - late:].mean(axis=1)
        entry: dict[str, Any] = {"success_prob_by_window": windows, "late_per_seed": late_S.tolist(),
                                 "late": float(late_S.mean()), "overall": float(p_ST.mean())}
        if label != reference:
            d_S = late_S - np.stack(curves[reference])[:, steps - late:].mean(axis=1)
            se = float(d_S.std(ddof=1) / math.sqrt(d_S.size)) if d_S.size > 1 else None
            entry[f"late_minus_{reference}"] = {"mean": float(d_S.mean()), "per_seed": d_S.tolist(), "se": se,
                                                "within_noise": None if se is None else
                                                bool(abs(d_S.mean()) <= 2 * se + 1e-12)}
        out_curves[label] = entry
    return {"env": "SyntheticBandit(seed=0), regret soft_q config", "steps": steps, "window": window,
            "late_steps": late, "seeds": list(config.workers_curve_seeds), "reference": reference,
            "measure": "oracle success probability of the chosen cases", "curves": out_curves}


def run_online_bench(config: OnlineBenchConfig, *, out: str | Path, workdir: str | Path | None = None
                     ) -> dict[str, Any]:
    """Run the selected parts; the JSON at ``out`` is rewritten after each part."""

    results: dict[str, Any] = {"benchmark": "online", "config": dataclasses.asdict(config),
                               "environment": environment(), "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
    root = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="memento-bench-online-"))
    root.mkdir(parents=True, exist_ok=True)
    encoder = Encoder.from_pretrained()

    try:
        for part in config.parts:
            t0 = time.perf_counter()
            logger.info("bench online: %s", part)
            if part == "real":
                results["real"] = _real(config, encoder, root)
            elif part == "synthetic":
                results["synthetic"] = _synthetic(config, root)
            elif part == "workers":
                results["workers"] = _workers(config, encoder, root, out=out, partial=results)
            else:
                results["overhead"] = _overhead(config, encoder, root)
            results.setdefault("part_s", {})[part] = time.perf_counter() - t0
            write_results(out, results)
    finally:
        if workdir is None:
            shutil.rmtree(root, ignore_errors=True)
    results["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    write_results(out, results)
    return results


def _number(x: float | None, fmt: str = ".3f") -> str:
    return "—" if x is None else format(x, fmt)


def _ope_table(ope: dict[str, Any]) -> list[str]:
    if "skipped" in ope:
        return [f"off-policy estimates: skipped ({ope['skipped']})", ""]
    errors = [f"off-policy estimates of seed {seed} failed: {r['error']}" for seed, r in ope["per_seed"].items()
              if "error" in r]
    if "summary" not in ope:
        return errors + [""]
    seeds = ", ".join(str(s) for s in ope["seeds"])
    lines = [f"off-policy estimates from the {ope['logged_by']} run's log (greedy targets; mean over seeds {seeds}; "
             f"{round(ope['level'] * 100)}% bootstrap interval per seed, {ope['bootstrap']} resamples) next to the "
             "measured overall success:", "",
             "| target | estimator | OPE estimate | CI per seed | ESS | measured (run) | estimate - measured |",
             "|---|---|---:|---|---:|---:|---:|"]
    for target, t in ope["summary"].items():
        measured = f"{_number(t['measured_overall'])} ({t['measured_policy']})"
        for estimator, e in t["estimates"].items():
            cis = "; ".join("—" if lo is None else f"[{lo:.3f}, {hi:.3f}]" for lo, hi in e["ci_per_seed"])
            gap = "—" if e["minus_measured"] is None else f"{e['minus_measured']:+.3f}"
            lines.append(f"| {target} | {estimator} | {_number(e['value'])} | {cis} | {_number(e['ess'], '.1f')} | "
                         f"{measured} | {gap} |")
    return lines + ["", *errors, "note: greedy_soft_q is the final selector choosing greedily; the measured soft_q "
                    "run sampled and learned online. With K > 1 read the slate estimators (inclusion_ips, pi, "
                    "pi_set).", ""]


def _workers_table(w: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    if "throughput" in w:
        lines += [f"rollout workers: `{w['suite']}/{w['split']}`, {w['steps']} tasks per run, soft_q, a planner that "
                  f"answers after {w['latency_ms']:g} ms (OpenAI-compatible loopback server); tasks/s between the "
                  "first and the last committed transition:", "",
                  "| run | tasks/s | x in-process | x 1 Ray worker | end-to-end tasks/s | staleness mean / max |",
                  "|---|---:|---:|---:|---:|---:|"]
        for label, r in w["throughput"].items():
            stale = "—" if "staleness_mean" not in r else f"{r['staleness_mean']:.2f} / {r['staleness_max']}"
            lines.append(f"| {label} | {_number(r['tasks_per_s'], '.2f')} | "
                         f"{_number(r['speedup_vs_in_process'], '.2f')} | {_number(r['speedup_vs_ray_1'], '.2f')} | "
                         f"{r['end_to_end_tasks_per_s']:.2f} | {stale} |")
        lines.append("")
    if "learning" in w:
        lw = w["learning"]
        ref = lw["reference"]
        lines += [f"rollout workers, learning: synthetic bandit, {lw['steps']} transitions, seeds "
                  f"{', '.join(str(x) for x in lw['seeds'])}; {lw['measure']} (mean over seeds):", "",
                  f"| run | first {lw['window']} | last {lw['late_steps']} | overall | last - {ref} (± 1 s.e.) "
                  "| within noise |", "|---|---:|---:|---:|---:|---|"]
        for label, c in lw["curves"].items():
            d = c.get(f"late_minus_{ref}")
            diff = "—" if d is None else (f"{d['mean']:+.3f}" + ("" if d["se"] is None else f" ± {d['se']:.3f}"))
            noise = "—" if d is None or d["within_noise"] is None else ("yes" if d["within_noise"] else "no")
            lines.append(f"| {label} | {c['success_prob_by_window'][0]:.3f} | {c['late']:.3f} | {c['overall']:.3f} | "
                         f"{diff} | {noise} |")
        lines.append("")
    return lines


def format_online_table(results: dict[str, Any]) -> str:
    """Markdown tables of the three parts (those present)."""
    lines: list[str] = []
    if "real" in results:
        real = results["real"]
        seeds = ", ".join(str(x) for x in real["seeds"])
        lines += [f"real planner `{real['planner']}` on `{real['suite']}/{real['split']}`, {real['steps']} tasks per "
                  f"policy, seeds {seeds} (mean over seeds; early: first {real['window']}, late: last "
                  f"{real['late_steps']}; difference to similarity with a 95% paired-bootstrap interval):", "",
                  "| policy | overall | early | late | late - similarity [95% CI] | early - similarity [95% CI] "
                  "| LLM calls/task | forward passes/task | ms/task | cases shown | memory tokens/call |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]

        def gap(entry: dict[str, Any], span: str) -> str:
            d = entry.get(f"{span}_minus_similarity")
            return "—" if d is None else f"{d['mean']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]"

        for policy, r in real["summary"].items():
            lines.append(f"| {policy} | {r['overall']:.3f} | {r['early']:.3f} | {r['late']:.3f} | {gap(r, 'late')} | "
                         f"{gap(r, 'early')} | {r['llm_calls_per_task']:.2f} | "
                         f"{r.get('forward_passes_per_task', r['llm_calls_per_task']):.2f} | {r['ms_per_task']:.0f} | "
                         f"{r.get('cases_per_task', math.nan):.2f} | {r.get('memory_tokens_per_task', math.nan):.0f} |")
        lines.append("")
        if "ope" in real:
            lines += _ope_table(real["ope"])
    if "synthetic" in results:
        lines += ["synthetic bandit (mean per-step regret):", "",
                  "| policy | first window | last window | total regret | success rate |", "|---|---:|---:|---:|---:|"]
        for policy, s in results["synthetic"].items():
            lines.append(f"| {policy} | {s['first_window_regret']:.3f} | {s['last_window_regret']:.3f} | "
                         f"{s['total_regret']:.1f} | {s['success_rate']:.3f} |")
        lines.append("")
    if "workers" in results:
        lines += _workers_table(results["workers"])
    if "overhead" in results:
        o = results["overhead"]
        lines += [f"loop overhead at {o['bank_cases']:,} cases ({o['bank_index']}), ms per step:", "",
                  "| policy | encode | candidates | select | retain | learn | usage | log | overhead total |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for policy, ms in o["policies"].items():
            lines.append(f"| {policy} | " + " | ".join(f"{ms.get(k, 0.0):.2f}" for k in
                         ("encode", "candidates", "select", "retain", "learn", "usage", "log", "overhead"))
                         + " |")
    return "\n".join(lines)
