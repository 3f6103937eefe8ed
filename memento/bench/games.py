"""``memento bench games``: multi-step agents on generated TextWorld games with a real frozen LLM.

For each seed and each **arm** (what the frozen actor sees):

- ``none``: no memory (the actor alone: its own likelihoods, sampled, no repeated command in a state);
- ``similarity``: the K nearest cases with a stored return > 0 (Memento's non-parametric retrieval);
- ``soft_q``: soft-Q over the same pool, ``gamma = 0`` (cross-entropy on each step's own reward);
- ``soft_q-g<gamma>``: soft-Q with the soft TD target and the target network, ``gamma > 0``;
- ``random``: K uniform cases of the pool, as a floor for a choice;

the arm first **trains** on the suite's train split (``train_episodes`` episodes from an empty bank:
retaining step and episode cases, the policy learning after each episode; the ``none`` arm skips it), then
is **evaluated** on each of ``splits`` (the test split: new games of the same kinds; ``ood``: larger or
held-out kinds), ``eval_repeats`` episodes per game (in list order), with the train run's bank and Q-network
frozen (no retention, no learning, the actor still sampling); with ``continual`` the evaluation instead goes on
as the online loop does (Memento's continual setting): the bank retains the evaluation episodes and soft-Q keeps
learning (from the trained Q-network, with a fresh optimiser and replay buffer), so a later attempt at a game can
use the cases of an earlier one (``eval_repeats`` >= 2), and the results are keyed ``<split>-continual``.
Every arm of a seed plays the same game order.
Reported per arm and split: success rate (won), normalised score and steps per episode, as the mean over seeds
with a 95% t-interval over seeds, the per-seed paired difference to ``none`` and to ``similarity`` (mean and
t-interval), and wall seconds per episode; for the train phase, the success rate by window (which learner learns
faster).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from memento.bench.common import default_models, environment, finish, timestamp, write_results
from memento.config import MAX_BENCH_ITEMS, MAX_CANDIDATES, MAX_K, MAX_STEPS, check, check_ints
from memento.errors import ConfigError
from memento.policies import SoftQConfig

__all__ = ["GamesBenchConfig", "arm_config", "format_games_table", "frozen_policy", "run_games_bench", "t_interval"]

logger = logging.getLogger(__name__)

_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
         12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}


def t_interval(x: Any) -> dict[str, float]:
    """Mean and the half-width of its two-sided 95% t-interval (0 for fewer than two values)."""
    x = np.asarray(x, dtype=np.float64)
    n = x.size
    if n == 0:
        return {"mean": 0.0, "ci95": 0.0, "n": 0}
    if n < 2:
        return {"mean": float(x.mean()), "ci95": 0.0, "n": 1}
    df = n - 1
    t = _T975.get(df) or next((v for k, v in sorted(_T975.items()) if k >= df), 1.96)
    return {"mean": float(x.mean()), "ci95": float(t * x.std(ddof=1) / math.sqrt(n)), "n": int(n)}


@dataclasses.dataclass(frozen=True, kw_only=True)
class GamesBenchConfig:
    """One benchmark run (see the module docstring)."""

    suite: str = dataclasses.field(default="tw-small", metadata={"help": "shipped suite"})
    arms: tuple[str, ...] = dataclasses.field(
        default=("none", "similarity", "soft_q", "soft_q-g0.9"), metadata={"help": (
            "comma-separated arms")})
    seeds: tuple[int, ...] = dataclasses.field(default=(0, 1, 2), metadata={"help": "seeds"})
    train_episodes: int = dataclasses.field(default=16, metadata={"help": "episodes of the train phase"})
    splits: tuple[str, ...] = dataclasses.field(default=("test", "ood"), metadata={"help": "evaluation splits"})
    eval_repeats: int = dataclasses.field(default=2, metadata={"help": "evaluation episodes per game"})
    continual: bool = dataclasses.field(default=False, metadata={"help": (
        "evaluate as the online loop runs: retain the evaluation episodes and keep learning (results keyed "
        "<split>-continual; with --resume the train runs in --workdir are reused)")})
    case_weight: float = dataclasses.field(default=0.5, metadata={"help": (
        "the actor's probability mass on the chosen cases' proposals")})
    max_steps: int = dataclasses.field(default=15, metadata={"help": "step limit"})
    k: int = dataclasses.field(default=2, metadata={"help": "cases per decision"})
    candidates: int = dataclasses.field(default=16, metadata={"help": "candidate set size"})
    planner: str = dataclasses.field(default="gemma", metadata={"help": (
        "the planner spec (gemma, hf:PATH, hf://ORG/NAME[@REV], openai:MODEL@URL[?...])")})
    resume: bool = dataclasses.field(default=False, metadata={"help": "reuse finished runs in --workdir"})

    def __post_init__(self) -> None:
        cls = type(self)
        check(bool(self.arms), cls, "arms", self.arms, "must name at least one arm")
        for arm in self.arms:
            arm_config(arm)  # a one-line ConfigError for an unknown arm
        check(bool(self.seeds) and all(isinstance(s, int) and s >= 0 for s in self.seeds), cls, "seeds",
              self.seeds, "must be non-negative integers")
        check_ints(self, train_episodes=(1, MAX_STEPS), eval_repeats=(1, MAX_BENCH_ITEMS))
        check(isinstance(self.case_weight, (int, float)) and 0.0 <= self.case_weight <= 1.0, cls, "case_weight",
              self.case_weight, "must be in [0, 1]")
        check_ints(self, max_steps=(1, 100_000), k=(1, MAX_K), candidates=(1, MAX_CANDIDATES))


def arm_config(arm: str) -> tuple[bool, Any]:
    """``(memory, policy config)`` of an arm name (``none``, ``similarity``, ``random``, ``linucb``, ``soft_q``,
    ``soft_q-g<gamma>``)."""
    from memento.policies import loop_policy

    if arm == "none":
        return False, loop_policy("random")
    if arm in ("similarity", "random", "linucb", "soft_q"):
        return True, loop_policy(arm)  # type: ignore[arg-type]
    if arm.startswith("soft_q-g"):
        try:
            gamma = float(arm[len("soft_q-g"):])
        except ValueError:
            gamma = -1.0
        if 0.0 < gamma < 1.0:
            return True, loop_policy("soft_q", gamma=gamma)
    raise ConfigError(f"arm {arm!r}: choose none, similarity, random, linucb, soft_q or soft_q-g<gamma> with "
                      "0 < gamma < 1 (e.g. soft_q-g0.9)")


def frozen_policy(policy: Any, selector: Path) -> Any:
    """The evaluation copy of a trained policy config: soft-Q starts from the train run's Q-network."""
    if isinstance(policy, SoftQConfig) and (selector / "learner.json").is_file():
        return dataclasses.replace(policy, init_qnet=str(selector))
    return policy


def run_games_bench(config: GamesBenchConfig, *, out: str | Path, workdir: str | Path | None = None,
                    planner: Any | None = None, encoder: Any | None = None, progress: bool = False) -> dict[str, Any]:
    """Run the benchmark; the JSON at ``out`` is rewritten after every run (a long benchmark shows progress)."""
    from memento.envs.textworld import SUITES, TextWorldConfig, build_suite
    from memento.planners.actor import ActorConfig
    from memento.policies import make_policy
    from memento.runs.games import GameLoopConfig, run_games

    if config.suite not in SUITES:
        raise ConfigError(f"suite {config.suite!r}: unknown; known: {', '.join(sorted(SUITES))}")
    for split in ("train", *config.splits):
        if split not in SUITES[config.suite].splits:
            raise ConfigError(f"suite {config.suite!r} has no split {split!r} "
                              f"(it has {', '.join(SUITES[config.suite].splits)})")
    encoder, planner = default_models(config.planner, encoder, planner)
    games = build_suite(config.suite, splits=("train", *config.splits), progress=progress)
    root = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="memento-bench-games-"))
    root.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"benchmark": "games", "config": dataclasses.asdict(config),
                               "environment": environment(), "planner": repr(planner),
                               "started": timestamp(), "runs": {}}
    game = TextWorldConfig(max_steps=config.max_steps)
    try:
        for seed in config.seeds:
            for arm in config.arms:
                memory, policy = arm_config(arm)
                base = GameLoopConfig(k=config.k, candidates=config.candidates, policy=policy, memory=memory,
                                      game=game, seed=seed, checkpoint_every=0, tensorboard=False,
                                      actor=ActorConfig(case_weight=float(config.case_weight)))
                run_root = root / f"seed-{seed}" / arm
                train_summary, bank_dir, selector = None, None, None
                if memory:
                    train_dir = run_root / "train"
                    train_cfg = dataclasses.replace(base, episodes=config.train_episodes)
                    train_summary = _run(run_games, train_cfg, train_dir, config.resume, make_policy=make_policy,
                                         encoder=encoder, planner=planner, games=games["train"], progress=progress)
                    bank_dir, selector = train_dir / "bank", train_dir / "selector"
                entry: dict[str, Any] = {"train": train_summary}
                for split in config.splits:
                    name = eval_name(split, config)
                    eval_cfg = dataclasses.replace(base, episodes=config.eval_repeats * len(games[split]),
                                                   shuffle=False, learn=config.continual,
                                                   cases="both" if config.continual else "none",
                                                   policy=frozen_policy(policy, selector) if selector else policy)
                    entry[name] = _run(run_games, eval_cfg, run_root / name, config.resume, make_policy=make_policy,
                                       encoder=encoder, planner=planner, games=games[split], bank_dir=bank_dir,
                                       progress=progress)
                results["runs"].setdefault(str(seed), {})[arm] = entry
                results["summary"] = summarize_games(results["runs"], config)
                write_results(out, results)
    finally:
        if workdir is None:
            shutil.rmtree(root, ignore_errors=True)
    results["summary"] = summarize_games(results["runs"], config)
    return finish(results, out)


def _run(run_games: Any, config: Any, out_dir: Path, resume: bool, **kwargs: Any) -> dict[str, Any]:
    if resume and (out_dir / "summary.json").is_file():  # a finished run of this benchmark: reuse it
        from memento.runs.rundir import read_json

        summary = read_json(out_dir / "summary.json")
    else:
        if out_dir.exists() and not resume:
            shutil.rmtree(out_dir)
        summary = run_games(config, out_dir=out_dir, resume=resume, **kwargs)
    keep = ("arm", "episodes", "steps", "success_rate", "mean_score", "mean_steps", "success_by_window",
            "score_by_window", "by_env", "from_case_share", "invalid", "unusable", "bank_size_end", "updates",
            "s_per_episode", "wall_s", "final_alpha")
    return {k: summary[k] for k in keep if k in summary}


def eval_name(split: str, config: GamesBenchConfig) -> str:
    """The result key and run directory of an evaluation: the split, ``<split>-continual`` with ``continual``."""
    return f"{split}-continual" if config.continual else split


def summarize_games(runs: dict[str, dict[str, Any]], config: GamesBenchConfig) -> dict[str, Any]:
    """Per split and arm: mean and 95% t-interval over seeds, and the paired differences to none/similarity."""
    seeds = sorted(runs, key=int)
    out: dict[str, Any] = {}
    for split in (eval_name(s, config) for s in config.splits):
        table: dict[str, Any] = {}
        for arm in config.arms:
            rows = [runs[s][arm][split] for s in seeds if arm in runs[s]]
            if not rows:
                continue
            table[arm] = {metric: t_interval([r[metric] for r in rows])
                          for metric in ("success_rate", "mean_score", "mean_steps", "s_per_episode")}
            for ref in ("none", "similarity"):
                paired = [runs[s][arm][split]["success_rate"] - runs[s][ref][split]["success_rate"]
                          for s in seeds if arm in runs[s] and ref in runs[s] and ref != arm]
                if paired:
                    table[arm][f"success_minus_{ref}"] = t_interval(paired)
        out[split] = table
    train: dict[str, Any] = {}
    for arm in config.arms:
        rows = [runs[s][arm]["train"] for s in seeds if arm in runs[s] and runs[s][arm]["train"]]
        if rows:
            windows = [[w["rate"] for w in r["success_by_window"]] for r in rows]
            width = min(len(w) for w in windows)
            train[arm] = {"success_rate": t_interval([r["success_rate"] for r in rows]),
                          "success_by_window": [float(np.mean([w[i] for w in windows])) for i in range(width)],
                          "s_per_episode": t_interval([r["s_per_episode"] for r in rows])}
    out["train"] = train
    return out


def format_games_table(results: dict[str, Any]) -> str:
    """A plain-text table of the summary (the JSON holds everything)."""
    summary = results.get("summary", {})
    lines = []
    for split, table in summary.items():
        if split == "train":
            continue
        lines.append(f"{split}: arm, success (95% CI over seeds), normalised score, steps/episode, s/episode, "
                     "success - none")
        for arm, row in table.items():
            diff = row.get("success_minus_none")
            lines.append(f"  {arm:14s} {row['success_rate']['mean']:.3f} +- {row['success_rate']['ci95']:.3f}   "
                         f"{row['mean_score']['mean']:.3f}   {row['mean_steps']['mean']:.1f}   "
                         f"{row['s_per_episode']['mean']:.1f}   "
                         + ("" if diff is None else f"{diff['mean']:+.3f} +- {diff['ci95']:.3f}"))
    if summary.get("train"):
        lines.append("train: arm, success, success by window")
        for arm, row in summary["train"].items():
            lines.append(f"  {arm:14s} {row['success_rate']['mean']:.3f}   "
                         + " ".join(f"{r:.2f}" for r in row["success_by_window"]))
    return "\n".join(lines)
