"""``memento bench online``: the online loop with the real planner, the synthetic bandit, and loop overhead.

Three parts, each written into one JSON document:

1. **real**: :func:`memento.loop.run_comparison` on a shipped suite's test split with the seed case
   bank and a real planner (Gemma 3 270M by default): success rate per window for each policy and the
   gap soft-Q minus similarity over the last ``late_steps`` steps;
2. **synthetic**: :func:`memento.envs.regret.run_regret` for each policy on the synthetic bandit with
   a known oracle: mean per-step regret in the first and last fifth of the run;
3. **overhead**: the loop's milliseconds per step *excluding* the planner and judge calls, on a bank
   of ``overhead_bank`` cases (clustered random vectors, HNSW32), with a planner that answers
   instantly: encode + candidates + select + retain + learn + log.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np

from memento.bench.bank import _environment, _write, make_vectors
from memento.compare import run_comparison
from memento.config import PolicyConfig, PolicyKind, SoftQConfig, check, check_choice, check_int
from memento.encoders import Encoder
from memento.envs.regret import RegretConfig, regret_policy, run_regret
from memento.envs.synthetic import SyntheticBandit, SyntheticBanditConfig
from memento.envs.tasks import load_suite, seed_cases
from memento.judges import make_judge
from memento.loop import LoopConfig, OnlineLoop, loop_policy
from memento.memory import CaseBank
from memento.planners.base import CallablePlanner
from memento.planners.spec import build_planner, parse_planner_spec
from memento.types import Case
from policies import make_policy

__all__ = ["OnlineBenchConfig", "format_online_table", "run_online_bench"]

logger = logging.getLogger(__name__)


SoftQCandidates = Literal["all", "positive"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class OnlineBenchConfig:
    steps: int = 600
    policies: tuple[PolicyKind, ...] = ("soft_q", "similarity")
    suite: str = "facts"
    split: str = "test"
    planner: str = "gemma"
    late_steps: int = 200
    synthetic_steps: int = 1500
    overhead_bank: int = 100_000
    overhead_steps: int = 200
    parts: tuple[str, ...] = ("real", "synthetic", "overhead")
    seed: int = 0
    soft_q_candidates: SoftQCandidates = "all"

    def __post_init__(self) -> None:
        for name in ("steps", "late_steps", "synthetic_steps", "overhead_bank", "overhead_steps"):
            check_int(self, name, 1)
        known = get_args(PolicyKind)
        check(bool(self.policies) and all(p in known for p in self.policies), type(self), "policies",
               self.policies, f"must be a non-empty subset of {known}")
        check(all(p in ("real", "synthetic", "overhead") for p in self.parts), type(self), "parts", self.parts,
               "must be a subset of ('real', 'synthetic', 'overhead')")
        check_choice(self, "soft_q_candidates", SoftQCandidates)


def _loop_policies(config: OnlineBenchConfig) -> list[PolicyConfig]:
    soft_q = SoftQConfig(positive_only=config.soft_q_candidates == "positive")
    return [soft_q if kind == "soft_q" else loop_policy(kind) for kind in config.policies]


def _real(config: OnlineBenchConfig, encoder: Any, workdir: Path) -> dict[str, Any]:
    planner = build_planner(parse_planner_spec(config.planner))
    loop_config = LoopConfig(steps=config.steps, seed=config.seed, checkpoint_every=0, tensorboard=False)
    comparison = run_comparison(_loop_policies(config), config=loop_config, out_dir=workdir / "real",
                                make_policy=make_policy, late_steps=config.late_steps, encoder=encoder, planner=planner,
                                judge=make_judge("exact"), tasks=load_suite(config.suite, config.split),
                                seed_cases=seed_cases(config.suite))
    windows = {}
    for policy in config.policies:
        summary = json.loads((workdir / "real" / policy / "summary.json").read_text())
        windows[policy] = summary["success_by_window"]
    result = {"planner": config.planner, "suite": config.suite, "split": config.split, "comparison": comparison,
              "success_by_window": windows}
    policies = comparison["policies"]
    if "soft_q" in policies and "similarity" in policies:
        result["late_gap_soft_q_minus_similarity"] = (policies["soft_q"]["success_late"]
                                                     - policies["similarity"]["success_late"])
    return result


def _synthetic(config: OnlineBenchConfig, workdir: Path) -> dict[str, Any]:
    out = {}
    for policy in config.policies:
        result = run_regret(SyntheticBandit(SyntheticBanditConfig(seed=config.seed)),
                            RegretConfig(steps=config.synthetic_steps, policy=regret_policy(policy), seed=config.seed),
                            make_policy=make_policy, workdir=workdir / "synthetic" / policy)
        out[policy] = result.summary()
    return out


def _overhead(config: OnlineBenchConfig, encoder: Any, workdir: Path) -> dict[str, Any]:
    rng = np.random.default_rng(config.seed)
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
    for policy in config.policies:
        loop_config = LoopConfig(steps=config.overhead_steps, seed=config.seed, policy=loop_policy(policy),
                                 checkpoint_every=0, tensorboard=False)
        loop = OnlineLoop(loop_config, make_policy=make_policy, encoder=encoder, planner=planner,
                          judge=make_judge("exact"),
                          tasks=load_suite(config.suite, config.split), out_dir=workdir / "overhead" / policy,
                          bank_dir=bank_dir)
        summary = loop.run()
        out["policies"][policy] = summary["ms_per_step"]
    return out


def run_online_bench(config: OnlineBenchConfig, *, out: str | Path, workdir: str | Path | None = None
                     ) -> dict[str, Any]:
    """Run the selected parts; the JSON at ``out`` is rewritten after each part."""

    results: dict[str, Any] = {"benchmark": "online", "config": dataclasses.asdict(config),
                               "environment": _environment(), "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
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
            else:
                results["overhead"] = _overhead(config, encoder, root)
            results.setdefault("part_s", {})[part] = time.perf_counter() - t0
            _write(out, results)
    finally:
        if workdir is None:
            shutil.rmtree(root, ignore_errors=True)
    results["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    _write(out, results)
    return results


def format_online_table(results: dict[str, Any]) -> str:
    """Markdown tables of the three parts (those present)."""
    lines: list[str] = []
    if "real" in results:
        real = results["real"]
        lines += [f"real planner `{real['planner']}` on `{real['suite']}/{real['split']}`:", "",
                  "| policy | success | early | late | LLM calls | ms/step | overhead ms/step |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for policy, r in real["comparison"]["policies"].items():
            lines.append(f"| {policy} | {r['success_rate']:.3f} | {r['success_early']:.3f} | {r['success_late']:.3f} "
                         f"| {r['llm_calls']} | {r['ms_per_step']['total']:.1f} | {r['ms_per_step']['overhead']:.1f} |")
        if "late_gap_soft_q_minus_similarity" in real:
            lines += ["", f"late gap soft_q - similarity: {real['late_gap_soft_q_minus_similarity']:+.3f}"]
        lines.append("")
    if "synthetic" in results:
        lines += ["synthetic bandit (mean per-step regret):", "",
                  "| policy | first window | last window | total regret | success rate |", "|---|---:|---:|---:|---:|"]
        for policy, s in results["synthetic"].items():
            lines.append(f"| {policy} | {s['first_window_regret']:.3f} | {s['last_window_regret']:.3f} | "
                         f"{s['total_regret']:.1f} | {s['success_rate']:.3f} |")
        lines.append("")
    if "overhead" in results:
        o = results["overhead"]
        lines += [f"loop overhead at {o['bank_cases']:,} cases ({o['bank_index']}), ms per step:", "",
                  "| policy | encode | candidates | select | retain | learn | log | overhead total |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for policy, ms in o["policies"].items():
            lines.append(f"| {policy} | " + " | ".join(f"{ms.get(k, 0.0):.2f}" for k in
                         ("encode", "candidates", "select", "retain", "learn", "log", "overhead")) + " |")
    return "\n".join(lines)
