"""``memento bench stream``: lifelong evaluation of memory systems over a stream of environments.

For each seed, each stream **order** (``grouped``, ``random``: :func:`memento.runs.lifelong.stream_order` over the
suite's train games grouped by environment, the game type) and each **arm**:

- ``none``: no memory;
- ``similarity``: the K nearest raw cases with a stored return > 0 (Memento's non-parametric retrieval);
- ``cfgm``: CFGM's builders (focus point per environment, contrastive tips per game, key-information reflection
  at anomalous steps) and its dual-channel retrieval (``memento.policies.cfgm``);
- ``lifemem``: LifeMem's builders (workflow clusters with adaptive split, skills) and its environment-aligned
  retrieval (``memento.policies.lifemem``);
- ``soft_q-all``: both systems' builders and soft-Q (``gamma = 0``) choosing among every kind (raw cases, focus
  points, tips, skills: the Q-network sees the kind);
- only when named in ``arms``: ``plugmem``, PlugMem's builders and retrieval (``memento.policies.plugmem``; the chosen
  items are compressed into one note per prompt, ``PlugMemConfig.show``); ``plugmem-lean``, the same builders
  with a small budget: the nearest positive raw case plus knowledge pruned to 48 words, compressed into a note of
  at most 24 words (an attempt at PlugMem's claim, fewer memory tokens at equal success, with a planner whose
  knowledge items are weak); and ``soft_q-every``, the builders of all three systems and soft-Q choosing among
  every kind, PlugMem's propositions and prescriptions included;

the arm **trains** on the stream: one game run (:class:`memento.runs.games.GameLoop`) that plays the stream's
games in order, one episode each, retaining, building and learning; at each environment's **learned point** (its
last training game) the run pauses (it is resumed afterwards with the same run directory, exactly) and the
environment's test games are **evaluated** with the bank and policy of that moment, frozen (no retention, no
building, no learning; the actor still samples); after the stream, every environment's test games are evaluated
again. Each arm shows at most K items per decision (the prompt budget), each cut to the same characters.
Reported per arm and order: OP (mean final normalised score over environments) and BwT (relative change from the
learned point to the end; :func:`memento.runs.lifelong.lifelong_metrics`), the final success rate, the memory tokens
per planner call of the final evaluations (words of the cases and notes shown,
:func:`memento.systems.items.memory_tokens`), the memory builders' LLM calls, seconds and items per kind, as the
mean over seeds with a 95% t-interval, and the random minus grouped difference (the effect of stream order).

On a question suite (a shipped one such as ``facts-real``, or a suite directory) the environments are its
question families and the online loop answers them (:mod:`memento.bench.stream_qa`). What the two share, the arms
and the protocol of one arm, is :mod:`memento.bench.stream_arms`.

CFGM's exploration retries are off in the stream (every arm plays each training game once, so the arms see the
same tasks for the same budget); ``memento play`` runs them (``SystemsConfig.retries``).
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from memento.bench.common import default_models, environment, finish, timestamp, write_results
from memento.bench.games import frozen_policy, t_interval
from memento.bench.stream_arms import (
    EXTRA_ARMS,
    LEAN_BUDGET,
    LEAN_NOTE,
    STREAM_ARMS,
    finished_or_cleared,
    learned_and_final,
    per_call,
    stream_arm,
)
from memento.bench.stream_qa import qa_seed_cases, qa_stream_tasks, run_qa_arm
from memento.config import MAX_BENCH_ITEMS, MAX_CANDIDATES, MAX_K, MAX_STEPS, check, check_bools, check_ints
from memento.errors import ConfigError
from memento.runs.lifelong import learned_points, lifelong_metrics, stream_order

__all__ = ["EXTRA_ARMS", "LEAN_BUDGET", "LEAN_NOTE", "STREAM_ARMS", "StreamBenchConfig", "format_stream_table",
           "game_env", "run_stream_bench", "stream_arm", "summarize_stream"]

logger = logging.getLogger(__name__)

def game_env(path: Path) -> str:
    """A suite game's environment (its game type: the file name's first part, ``coin-l5-s401.z8`` -> coin)."""
    return path.name.split("-", 1)[0]


@dataclasses.dataclass(frozen=True, kw_only=True)
class StreamBenchConfig:
    """One stream benchmark (see the module docstring)."""

    suite: str = dataclasses.field(default="tw-stream", metadata={"help": "shipped suite"})
    arms: tuple[str, ...] = dataclasses.field(default=STREAM_ARMS, metadata={"help": (
        f"comma-separated arms (also {', '.join(EXTRA_ARMS)}, only when named)")})
    orders: tuple[str, ...] = dataclasses.field(default=("grouped", "random"), metadata={"help": "grouped, random"})
    seeds: tuple[int, ...] = dataclasses.field(default=(0,), metadata={"help": "seeds"})
    eval_repeats: int = dataclasses.field(default=1, metadata={"help": "evaluation episodes per test game"})
    max_steps: int = dataclasses.field(default=15, metadata={"help": "step limit"})
    k: int = dataclasses.field(default=4, metadata={"help": "items per decision, the prompt budget"})
    candidates: int = dataclasses.field(default=16, metadata={"help": "candidate set size"})
    case_weight: float = dataclasses.field(default=0.5, metadata={"help": (
        "the actor's probability mass on the chosen cases' proposals")})
    planner: str = dataclasses.field(default="gemma", metadata={"help": (
        "the planner spec (gemma, hf:PATH, hf://ORG/NAME[@REV], openai:MODEL@URL[?...])")})
    envs: tuple[str, ...] = dataclasses.field(default=(), metadata={"help": (
        "question suites: the families in the stream")})
    train_per_env: int = dataclasses.field(default=10, metadata={"help": "question suites: train questions per family"})
    test_per_env: int = dataclasses.field(default=8, metadata={"help": "question suites: test questions per family"})
    seed_bank: bool = dataclasses.field(default=True, metadata={"help": (
        "question suites: every memory arm starts from the suite's seed cases (retained answers stored with the "
        "lenient contains judge); --no-seed-bank: from an empty bank")})
    resume: bool = dataclasses.field(default=False, metadata={"help": "reuse finished runs in --workdir"})

    def __post_init__(self) -> None:
        cls = type(self)
        object.__setattr__(self, "envs", tuple(self.envs))
        check(all(isinstance(e, str) and e for e in self.envs), cls, "envs", self.envs,
              "must be question family names")
        check_ints(self, train_per_env=(1, MAX_STEPS), test_per_env=(1, MAX_STEPS))
        check_bools(self, "seed_bank")
        check(bool(self.arms), cls, "arms", self.arms, "must name at least one arm")
        for arm in self.arms:
            stream_arm(arm)
        check(bool(self.orders) and all(o in ("grouped", "random") for o in self.orders), cls, "orders",
              self.orders, "must be grouped and/or random")
        check(bool(self.seeds) and all(isinstance(s, int) and s >= 0 for s in self.seeds), cls, "seeds",
              self.seeds, "must be non-negative integers")
        check_ints(self, eval_repeats=(1, MAX_BENCH_ITEMS), max_steps=(1, 100_000), k=(1, MAX_K),
                   candidates=(1, MAX_CANDIDATES))
        check(isinstance(self.case_weight, (int, float)) and 0.0 <= self.case_weight <= 1.0, cls, "case_weight",
              self.case_weight, "must be in [0, 1]")


def run_stream_bench(config: StreamBenchConfig, *, out: str | Path, workdir: str | Path | None = None,
                     planner: Any | None = None, encoder: Any | None = None, progress: bool = False,
                     games: dict[str, list[Path]] | None = None) -> dict[str, Any]:
    """Run the benchmark; the JSON at ``out`` is rewritten after every arm. ``games``: split -> game files
    (default: the suite's, generated on first use)."""
    from memento.envs.tasks import suite_names
    from memento.envs.textworld import SUITES, TextWorldConfig, build_suite
    from memento.planners.actor import ActorConfig
    from memento.policies import make_policy
    from memento.runs.games import GameLoopConfig, run_games

    if games is None and (config.suite in suite_names() or (Path(config.suite) / "train.jsonl").is_file()):
        return _run_qa_stream(config, out=out, workdir=workdir, planner=planner, encoder=encoder, progress=progress)
    if games is None:
        if config.suite not in SUITES:
            raise ConfigError(f"suite {config.suite!r}: unknown; games: {', '.join(sorted(SUITES))}; question "
                              f"suites: {', '.join(suite_names())}")
        games = build_suite(config.suite, splits=("train", "test"), progress=progress)
    for split in ("train", "test"):
        if not games.get(split):
            raise ConfigError(f"the stream needs {split} games")
    train_by_env: dict[str, list[Path]] = {}
    for path in games["train"]:
        train_by_env.setdefault(game_env(Path(path)), []).append(Path(path))
    test_by_env: dict[str, list[Path]] = {}
    for path in games["test"]:
        test_by_env.setdefault(game_env(Path(path)), []).append(Path(path))
    missing = sorted(set(train_by_env) - set(test_by_env))
    if missing:
        raise ConfigError(f"environment(s) {missing} have train games but no test game")
    encoder, planner = default_models(config.planner, encoder, planner)
    root = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="memento-bench-stream-"))
    root.mkdir(parents=True, exist_ok=True)
    results = _header(config, planner, {e: len(v) for e, v in train_by_env.items()})
    results["domain"] = "games"
    game = TextWorldConfig(max_steps=config.max_steps)
    common = dict(make_policy=make_policy, encoder=encoder, planner=planner, progress=progress)

    def one_arm(seed: int, order: str, arm: str, stream: list[tuple[str, Any]], points: dict[str, int],
                run_root: Path) -> dict[str, Any]:
        memory, policy, systems = stream_arm(arm)
        base = GameLoopConfig(k=config.k, candidates=config.candidates, policy=policy, memory=memory, game=game,
                              seed=seed, checkpoint_every=0, tensorboard=False, systems=systems,
                              actor=ActorConfig(case_weight=float(config.case_weight)))
        return _arm(config, base, run_root, stream, points, [path for _, path in stream], test_by_env, run_games,
                    common)

    return _each_arm(config, train_by_env, one_arm, results, root=root, out=out, keep=workdir is not None)


def _each_arm(config: StreamBenchConfig, train_by_env: dict[str, list[Any]], one_arm: Any, results: dict[str, Any],
              *, root: Path, out: str | Path, keep: bool) -> dict[str, Any]:
    """Every seed, order and arm: ``one_arm(seed, order, arm, stream, learned points, run root) -> entry``; the
    results are summarised and written after every arm."""
    try:
        for seed in config.seeds:
            for order in config.orders:
                stream = stream_order(train_by_env, order, np.random.default_rng([seed, 7]))  # type: ignore[arg-type]
                points = learned_points(stream)
                for arm in config.arms:
                    entry = one_arm(seed, order, arm, stream, points, root / f"seed-{seed}" / order / arm)
                    results["runs"].setdefault(str(seed), {}).setdefault(order, {})[arm] = entry
                    results["summary"] = summarize_stream(results["runs"], config)
                    write_results(out, results)
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    results["summary"] = summarize_stream(results["runs"], config)
    return finish(results, out)


def _run_qa_stream(config: StreamBenchConfig, *, out: str | Path, workdir: str | Path | None, planner: Any | None,
                   encoder: Any | None, progress: bool) -> dict[str, Any]:
    """The stream over a question suite's families (:mod:`memento.bench.stream_qa`)."""
    from memento.judges import make_judge
    from memento.policies import make_policy

    train_by_env, test_by_env = qa_stream_tasks(config.suite, config.envs, config.train_per_env,
                                                config.test_per_env)
    encoder, planner = default_models(config.planner, encoder, planner)
    root = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="memento-bench-stream-"))
    root.mkdir(parents=True, exist_ok=True)
    results = _header(config, planner, {e: len(v) for e, v in train_by_env.items()})
    results["domain"] = "questions"
    results["test_per_env"] = {e: len(v) for e, v in test_by_env.items()}
    common = dict(make_policy=make_policy, encoder=encoder, planner=planner, judge=make_judge("exact"),
                  progress=progress)
    seeds_cases = qa_seed_cases(config.suite) if config.seed_bank else None
    if seeds_cases:  # a realistic bank: each stored reward is its answer's own outcome under a lenient judge
        common["retain_judge"] = make_judge("contains")
    results["seed_bank"] = len(seeds_cases or [])

    def one_arm(seed: int, order: str, arm: str, stream: list[tuple[str, Any]], points: dict[str, int],
                run_root: Path) -> dict[str, Any]:
        return run_qa_arm(config, arm, seed, run_root, stream, points, test_by_env, common, seed_cases=seeds_cases)

    return _each_arm(config, train_by_env, one_arm, results, root=root, out=out, keep=workdir is not None)


def _header(config: StreamBenchConfig, planner: Any, envs: dict[str, int]) -> dict[str, Any]:
    return {"benchmark": "stream", "config": dataclasses.asdict(config), "environment": environment(),
            "planner": repr(planner), "envs": envs, "started": timestamp(), "runs": {}}


def _eval(config: StreamBenchConfig, base: Any, out_dir: Path, tests: list[Path], bank_dir: Path | None,
          selector: Path | None, run_games: Any, common: dict[str, Any]) -> dict[str, Any]:
    finished = finished_or_cleared(out_dir, resume=config.resume)
    if finished is not None:
        return finished
    policy = frozen_policy(base.policy, selector) if selector else base.policy
    eval_cfg = dataclasses.replace(base, episodes=config.eval_repeats * len(tests), shuffle=False, learn=False,
                                   cases="none", policy=policy)
    return run_games(eval_cfg, out_dir=out_dir, games=tests, bank_dir=bank_dir, **common)


def _arm(config: StreamBenchConfig, base: Any, run_root: Path, stream: list[tuple[str, Path]],
         points: dict[str, int], stream_games: list[Path], test_by_env: dict[str, list[Path]], run_games: Any,
         common: dict[str, Any]) -> dict[str, Any]:
    def train(end: int, train_dir: Path, resume: bool) -> dict[str, Any]:
        return run_games(dataclasses.replace(base, episodes=end + 1, shuffle=False), out_dir=train_dir,
                         games=stream_games, resume=resume, **common)

    def evaluate(out_dir: Path, tests: list[Path], bank_dir: Path | None, selector: Path | None) -> dict[str, Any]:
        return _eval(config, base, out_dir, tests, bank_dir, selector, run_games, common)

    learned_s, final_s, train_summary = learned_and_final(run_root, points, test_by_env, resume=config.resume,
                                                          memory=base.memory, train=train, evaluate=evaluate)
    metrics = lifelong_metrics({e: s["mean_score"] for e, s in learned_s.items()},
                               {e: s["mean_score"] for e, s in final_s.items()})
    entry = {"op": metrics["op"], "bwt": metrics["bwt"], "bwt_abs": metrics["bwt_abs"],
             "n_undefined": metrics["n_undefined"], "per_env": metrics["per_env"],
             "final_success": float(np.mean([s["success_rate"] for s in final_s.values()])),
             "learned_success": float(np.mean([s["success_rate"] for s in learned_s.values()])),
             "stream": [f"{env}:{path.stem}" for env, path in stream],
             # memory tokens the final evaluations' prompts carried per action (cases and notes, words)
             "memory_tokens_per_call": per_call(final_s, "memory_tokens", "steps")}
    if train_summary is not None:
        entry["train"] = {k: train_summary.get(k) for k in ("success_rate", "mean_score", "bank_size_end",
                                                               "s_per_episode", "wall_s", "systems")}
    return entry


def summarize_stream(runs: dict[str, dict[str, dict[str, Any]]], config: StreamBenchConfig) -> dict[str, Any]:
    """Per order and arm: OP, BwT, final success (mean and 95% t-interval over seeds); random minus grouped."""
    seeds = sorted(runs, key=int)
    out: dict[str, Any] = {}
    for order in config.orders:
        table: dict[str, Any] = {}
        for arm in config.arms:
            rows = [runs[s][order][arm] for s in seeds if arm in runs[s].get(order, {})]
            if not rows:
                continue
            table[arm] = {m: t_interval([r[m] for r in rows if r[m] is not None])
                          for m in ("op", "bwt", "bwt_abs", "final_success", "learned_success")}
            for name in ("prompt_tokens_per_call", "memory_tokens_per_call"):
                tokens = [r[name] for r in rows if r.get(name) is not None]
                if tokens:
                    table[arm][name] = float(np.mean(tokens))
            calls = [r.get("train", {}).get("systems", {}) or {} for r in rows]
            llm = [c.get("llm", {}) for c in calls if c.get("llm")]
            if llm:
                # the whole train run's calls (a stream's run is resumed at every learned point)
                table[arm]["llm_calls"] = float(np.mean([x.get("run_calls", x["calls"]) for x in llm]))
                table[arm]["llm_s"] = float(np.mean([x.get("run_wall_s", x["wall_s"]) for x in llm]))
                table[arm]["items"] = calls[0].get("active_by_kind", {})
        out[order] = table
    if {"grouped", "random"} <= set(config.orders):
        diff: dict[str, Any] = {}
        for arm in config.arms:
            paired = [runs[s]["random"][arm]["op"] - runs[s]["grouped"][arm]["op"] for s in seeds
                      if arm in runs[s].get("random", {}) and arm in runs[s].get("grouped", {})]
            if paired:
                diff[arm] = t_interval(paired)
        out["random_minus_grouped_op"] = diff
    return out


def _cell(row: dict[str, Any], metric: str) -> str:
    v = row.get(metric)
    return f"{v['mean']:.3f}+-{v['ci95']:.3f}" if v and v.get("n") else "-"


def format_stream_table(results: dict[str, Any]) -> str:
    """A plain-text table of the summary (the JSON holds everything)."""
    summary = results.get("summary", {})
    lines = []
    for order, table in summary.items():
        if order == "random_minus_grouped_op" or not isinstance(table, dict):
            continue
        lines.append(f"{order}:")
        lines.append(f"  {'arm':<12} {'OP':>14} {'BwT':>14} {'final won':>14} {'LLM calls':>10} {'tokens/call':>11} "
                     f"{'memory/call':>11}")
        for arm, row in table.items():
            numbers = [row.get(name) for name in ("llm_calls", "prompt_tokens_per_call", "memory_tokens_per_call")]
            cells = ["-" if v is None else f"{v:.0f}" for v in numbers]
            lines.append(f"  {arm:<12} {_cell(row, 'op'):>14} {_cell(row, 'bwt'):>14} "
                         f"{_cell(row, 'final_success'):>14} {cells[0]:>10} {cells[1]:>11} {cells[2]:>11}")
    diff = summary.get("random_minus_grouped_op")
    if diff:
        lines.append("random - grouped OP: " + ", ".join(f"{a} {v['mean']:+.3f}" for a, v in diff.items()))
    return "\n".join(lines)
