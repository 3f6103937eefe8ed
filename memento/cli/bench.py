"""``memento bench``: benchmarks that write JSON results, one suite per subcommand (bank, select, train, online,
games, stream, serve). The games and stream suites import the games extra only when they run."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from memento.bench.bank import BankBenchConfig, format_table, run_bank_bench
from memento.bench.ingest import IngestBenchConfig, run_ingest_bench
from memento.bench.ingest import format_table as format_import
from memento.bench.online import OnlineBenchConfig, format_online_table, run_online_bench
from memento.bench.select import SelectBenchConfig, run_select_bench
from memento.bench.select import format_table as format_select
from memento.bench.serve import ServeBenchConfig, format_serve_table, run_serve_bench
from memento.bench.train import TrainBenchConfig, run_train_bench
from memento.bench.train import format_table as format_train
from memento.cli.options import (
    EXIT_OK,
    JUDGES,
    add_command,
    add_planner_option,
    add_results_file,
    add_seed,
    add_torch_threads,
    add_workdir,
    comma_list,
    set_torch_threads,
)
from memento.config import MAX_THREADS, field_default
from memento.errors import ConfigError
from memento.flags import HIDDEN, check_device, config_option, config_options, config_switch, field_type, given_fields

_KEEP_RUNS = "keep the run directories here (default: a temporary one)"
_TORCH = "torch.set_num_threads (default: torch's)"


def add_parser(commands: Any) -> None:
    bench = add_command(commands, "bench", "benchmarks that write JSON results", raw=False,
                        description="Benchmarks. Each writes a JSON file of results; compare figures from one run "
                                    "(these machines are noisy).")
    suites = bench.add_subparsers(dest="bench_command", metavar="SUITE", required=True)
    for add in (_add_bank, _add_import, _add_select, _add_train, _add_online, _add_games, _add_stream, _add_serve):
        add(suites)


def run(args: argparse.Namespace) -> int:
    return _SUITES[args.bench_command](args)


def _printed(table: str, args: argparse.Namespace) -> int:
    print(table)
    print(f"results written to {args.json}")
    return EXIT_OK


def _comma(cls: type, name: str, **kwargs: Any) -> dict[str, Any]:
    """:func:`config_option`'s arguments for a tuple field given as one comma-separated ``--flag a,b`` (``type``:
    how the text is read, :func:`comma_list` unless given; the default shown with commas)."""
    default = ",".join(str(item) for item in field_default(cls, name))
    return {"type": comma_list, "nargs": None, "metavar": "LIST", "shown_default": default, **kwargs}


# ---------------------------------------------------------------- bank


def _backends(text: str) -> tuple[str, ...]:
    """``--backends dir,milvus``."""
    names = comma_list(text)
    if not names or any(name not in ("dir", "milvus") for name in names):
        raise argparse.ArgumentTypeError(f"{text!r}: a comma-separated list of dir, milvus")
    return names


def _add_bank(suites: Any) -> None:
    bb = add_command(suites, "bank", "case bank add throughput, search latency and recall per index", raw=False,
                     description="Fill banks with random unit vectors and measure CaseBank.add throughput (SQLite + "
                                 "index), single-query search latency (p50/p99) and recall@k against exact search, "
                                 "for each index factory and size. '{nlist}' in a factory is replaced by a "
                                 "size-dependent IVF list count.")
    config_options(bb, BankBenchConfig, {
        "sizes": {}, "factories": {}, "dim": {}, "queries": {}, "k": {"flag": "-k"}, "data": {}, "ef_search": {},
        "nprobe": {}, "backends": _comma(BankBenchConfig, "backends", type=_backends), "op": {}, "seed": {}})
    add_workdir(bb)
    add_results_file(bb)


def _run_bank(args: argparse.Namespace) -> int:
    config = BankBenchConfig(**given_fields(args, BankBenchConfig))
    return _printed(format_table(run_bank_bench(config, out=args.json, workdir=args.workdir)), args)


# ---------------------------------------------------------------- import


def _add_import(suites: Any) -> None:
    bi = add_command(
        suites, "import", "bulk import of precomputed vectors: cases/s and peak memory of memento bank import",
        raw=False,
        description="Write N synthetic cases (cases.jsonl) and their clustered unit vectors (vectors.npy) a chunk at "
                    "a time, then run `memento bank import cases.jsonl --embeddings vectors.npy --index FACTORY "
                    "--vectors disk` as a child process: wall time, cases per second and the child's peak resident "
                    "memory. --again times the same import a second time (everything already stored).")
    config_options(bi, IngestBenchConfig, {
        "sizes": {}, "factory": {}, "refine": {}, "chunk": {}, "dim": {}, "data": {}, "again": {},
        "keep": {"metavar": "DIR", "shown_default": "a temporary directory"}, "seed": {}})
    add_workdir(bi)
    add_results_file(bi)


def _run_import(args: argparse.Namespace) -> int:
    config = IngestBenchConfig(**given_fields(args, IngestBenchConfig))
    return _printed(format_import(run_ingest_bench(config, out=args.json, workdir=args.workdir)), args)


# ---------------------------------------------------------------- select


def _add_select(suites: Any) -> None:
    bs = add_command(
        suites, "select", "end-to-end selection latency (candidates + policy) per bank size, vs a Memento reference",
        raw=False,
        description="Fill banks with random unit vectors and time, one query state at a time, "
                    "bank.candidates(state, C) + policy.select(state, candidates, K) for the similarity policy and "
                    "the soft-Q policy with each Q-network architecture (p50/p99 and the split between search and "
                    "policy), with the recall of the exact top-C. Next to it, the same faiss index searched directly "
                    "(the bank's overhead over raw faiss as a ratio), the build and training times and the process's "
                    "resident memory. Vectors are drawn and added --chunk at a time; the bench never holds the whole "
                    "base set. Banks of up to --exact-max cases use Flat (exact), "
                    "larger ones --factory. The Memento-style reference encodes every (query, case) pair with the "
                    "real encoder at --reference-size cases (0 skips it).")
    config_options(bs, SelectBenchConfig, (
        "sizes", "k", "candidates", "factory", "exact_max", "ef_search", "nprobe", "vectors", "refine", "archs",
        "data", "dim", "queries", "chunk", "recall_queries", "reference_size", "reference_queries"))
    config_options(bs, SelectBenchConfig, {"torch_threads": {"metavar": f"0..{MAX_THREADS}"}, "device": {},
                                           "bank": {"shown_default": HIDDEN}, "cold": {}, "seed": {}})
    add_workdir(bs)
    add_results_file(bs)


def _run_select(args: argparse.Namespace) -> int:
    check_device(args.device)  # cuda without a CUDA device: one line, before any work
    config = SelectBenchConfig(**given_fields(args, SelectBenchConfig))
    return _printed(format_select(run_select_bench(config, out=args.json, workdir=args.workdir)), args)


# ---------------------------------------------------------------- train


def _add_train(suites: Any) -> None:
    bt = add_command(
        suites, "train", "soft-Q learner throughput with cached embeddings, and replay-buffer latency", raw=False,
        description="Fill a replay buffer with random decisions and time buffer.sample(B) + learner.update(batch) "
                    "for each Q-network architecture, in (state, case, reward) samples/s (B x K per update); then "
                    "time replay add (one transition), add_batch(B) and sample(B) (indices only, and with the vectors "
                    "gathered; also on a buffer whose cases come from a bank of --bank-cases), beside the replay "
                    "buffers of Stable-Baselines3 and TorchRL when they are installed. Runs on CUDA when present "
                    "(--device auto).")
    config_options(bt, TrainBenchConfig, ("archs", "batch_size", "k", "steps", "dim", "buffer_size", "bank_cases",
                                           "device"))
    config_options(bt, TrainBenchConfig, {"torch_threads": {"metavar": f"0..{MAX_THREADS}"}, "seed": {}})
    bt.add_argument("--lightning", action="store_true",
                    help="also time the Lightning trainer of `memento train` beside the plain loop, per architecture")
    add_results_file(bt)


def _run_train(args: argparse.Namespace) -> int:
    check_device(args.device)
    config = TrainBenchConfig(**given_fields(args, TrainBenchConfig))
    if args.lightning:
        from memento.training.bench import run_train_bench_lightning

        return _printed(format_train(run_train_bench_lightning(config, out=args.json)), args)
    return _printed(format_train(run_train_bench(config, out=args.json)), args)


# ---------------------------------------------------------------- online


def _add_online(suites: Any) -> None:
    bo = add_command(
        suites, "online", "the online loop: real planner on a shipped suite, synthetic regret, loop overhead",
        raw=False,
        description="Three parts: (real) the policies on a shipped suite's test split with a real planner "
                    "(Gemma by default; about 0.8 s per step on 2 cores), success per window and the late gap "
                    "soft-Q minus similarity; (synthetic) mean per-step regret on the synthetic bandit; "
                    "(overhead) the loop's ms per step excluding the planner and judge, on a bank of "
                    "--overhead-bank cases.")
    config_options(bo, OnlineBenchConfig, {
        "steps": {}, "suite": {}, "split": {"choices": ["train", "test", "all"]}, "late_steps": {},
        "synthetic_steps": {}, "overhead_bank": {}, "overhead_steps": {}, "workers_steps": {},
        "workers_latency_ms": {}, "workers_curve_steps": {}, "window": {}, "best_of_c": {}, "ope_bootstrap": {}})
    add_planner_option(bo, OnlineBenchConfig)
    config_options(bo, OnlineBenchConfig, {
        "policies": _comma(OnlineBenchConfig, "policies", metavar=None),
        "parts": _comma(OnlineBenchConfig, "parts", metavar=None),
        "workers": _comma(OnlineBenchConfig, "workers", type=str, metavar="N[,N...]")})
    add_workdir(bo, "keep the run directories here (default: a temporary one)")
    add_torch_threads(bo, 1, "torch threads (default: 1)")
    seeds = bo.add_mutually_exclusive_group()
    config_option(seeds, OnlineBenchConfig, "seeds", metavar="S")
    add_seed(seeds, "one seed (the same as --seeds S)", default=None)
    config_options(bo, OnlineBenchConfig, {
        "retain_judge": {"choices": JUDGES, "shown_default": "exact, as the reward"}, "soft_q_candidates": {},
        "init_qnet": {"metavar": "DIR", "shown_default": HIDDEN}, "resume": {}, "ope": {}})
    add_results_file(bo)


def _run_online(args: argparse.Namespace) -> int:
    given = given_fields(args, OnlineBenchConfig)
    if args.workers is not None:
        try:
            given["workers"] = tuple(int(n) for n in args.workers.split(",") if n.strip())
        except ValueError:
            raise ConfigError(f"--workers {args.workers!r}: expected worker counts such as 1,2,4") from None
    if args.seeds or args.seed is not None:
        given["seeds"] = tuple(args.seeds) if args.seeds else (args.seed,)
    config = OnlineBenchConfig(**given)
    set_torch_threads(args.torch_threads)
    return _printed(format_online_table(run_online_bench(config, out=args.json, workdir=args.workdir)), args)


# ---------------------------------------------------------------- games and stream (the games extra)


def _add_game_fields(parser: Any, cls: type, fields: tuple[str, ...]) -> None:
    """The fields of a games/stream bench config: comma-separated lists for tuple-of-string fields, ``--seeds``
    as numbers."""
    config_options(parser, cls, {name: _comma(cls, name, metavar=None) if field_type(cls, name) == tuple[str, ...]
                                 else {} for name in fields})
    add_planner_option(parser, cls)
    add_workdir(parser, _KEEP_RUNS)
    config_switch(parser, cls, "resume")
    add_torch_threads(parser, 0, _TORCH)
    add_results_file(parser)


def _add_games(suites: Any) -> None:
    from memento.bench.games import GamesBenchConfig

    bg = add_command(
        suites, "games", "multi-step agents on TextWorld games: no memory, similarity, soft-Q (gamma 0 and > 0)",
        raw=False,
        description="Per seed and arm: train on the suite's train split from an empty bank (the policy learns "
                    "after each episode), then evaluate on each --splits split with the bank and Q-network "
                    "frozen, --eval-repeats episodes per game. Success rate, normalised score and steps per "
                    "episode, mean and 95%% t-interval over seeds, paired differences to none and similarity, "
                    "and the train phase's success by window. With Gemma 3 270M on 2 cores: ~0.5-1 s a step.")
    config_switch(bg, GamesBenchConfig, "continual")
    _add_game_fields(bg, GamesBenchConfig, ("suite", "arms", "seeds", "train_episodes", "eval_repeats",
                                            "case_weight", "splits", "max_steps", "k", "candidates"))


def _add_stream(suites: Any) -> None:
    from memento.bench.stream import STREAM_ARMS, StreamBenchConfig

    bs = add_command(
        suites, "stream", "lifelong evaluation of memory systems over a stream of environments (OP, BwT)", raw=False,
        description="Per seed, stream order (grouped, random) and arm (" + ", ".join(STREAM_ARMS) + "): "
                    "play the suite's train games as one stream (retaining, building memory items, learning), "
                    "evaluate each environment's test games at its learned point (its last training game) and "
                    "after the stream, frozen (on a question suite such as facts-real its question families are "
                    "the environments, answered by the online loop from the suite's seed bank, scored by exact "
                    "match); report OP (mean final score), BwT (relative change from the learned point), final "
                    "success and the builders' LLM calls and items per kind.")
    config_option(bs, StreamBenchConfig, "envs", **_comma(StreamBenchConfig, "envs", metavar="F[,F...]",
                                                          shown_default="every family of the suite"))
    config_switch(bs, StreamBenchConfig, "seed_bank")
    _add_game_fields(bs, StreamBenchConfig, ("suite", "arms", "orders", "seeds", "eval_repeats", "max_steps", "k",
                                             "candidates", "train_per_env", "test_per_env"))


def _bench_fields(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    """The fields of ``cls`` given on the command line; an empty comma-separated list keeps the default."""
    return {name: value for name, value in given_fields(args, cls).items() if value != ()}


def _run_bench(args: argparse.Namespace, run: Callable[..., Any], config: Any, table: Callable[[Any], str]) -> int:
    set_torch_threads(args.torch_threads)
    results = run(config, out=args.json, workdir=args.workdir, progress=sys.stderr.isatty())
    return _printed(table(results), args)


def _run_games(args: argparse.Namespace) -> int:
    from memento.bench.games import GamesBenchConfig, format_games_table, run_games_bench

    config = GamesBenchConfig(**_bench_fields(args, GamesBenchConfig))
    return _run_bench(args, run_games_bench, config, format_games_table)


def _run_stream(args: argparse.Namespace) -> int:
    from memento.bench.stream import StreamBenchConfig, format_stream_table, run_stream_bench

    config = StreamBenchConfig(**_bench_fields(args, StreamBenchConfig))
    return _run_bench(args, run_stream_bench, config, format_stream_table)


# ---------------------------------------------------------------- serve


def _add_serve(suites: Any) -> None:
    bsv = add_command(
        suites, "serve", "memento serve over HTTP at a large bank: select p50/p99 and throughput at 1 and 16 clients "
                         "(and their ratio), feedback/s", raw=False,
        description="Build (or reuse, --artifact) an exported selector over a bank of --size random unit vectors "
                    "(the real encoder's dim, recorded in the bank; a fresh Q-network), start a real "
                    "`memento serve` on 127.0.0.1 and time from client threads, over HTTP: POST /v1/select by "
                    "embedding and by text (encoded by the server's real encoder) with each --clients count, "
                    "and POST /v1/feedback throughput, recording only and (unless --no-learn) with --learn. "
                    "Needs the 'serve' extra.")
    config_options(bsv, ServeBenchConfig, {
        "size": {}, "factory": {}, "data": {}, "k": {}, "clients": {}, "selects": {}, "text_selects": {},
        "feedbacks": {}, "learn": {}, "server_threads": {"flag": "--threads", "metavar": "THREADS"},
        "batch_max_texts": {"metavar": "N", "shown_default": "the server's default"},
        "batch_wait_ms": {"metavar": "MS", "shown_default": "the server's default"}, "warmup": {},
        "workers": {"metavar": "N"}, "seed": {}})
    bsv.add_argument("--artifact", metavar="DIR", default=None,
                     help="reuse the selector here, or build it here and keep it (default: a temporary one)")
    add_workdir(bsv, "where temporary files go (default: system temp)")
    add_results_file(bsv)


def _run_serve(args: argparse.Namespace) -> int:
    config = ServeBenchConfig(**given_fields(args, ServeBenchConfig))
    return _printed(format_serve_table(run_serve_bench(config, out=args.json, artifact=args.artifact,
                                                       workdir=args.workdir)), args)


_SUITES: dict[str, Callable[[argparse.Namespace], int]] = {
    "bank": _run_bank, "import": _run_import, "select": _run_select, "train": _run_train, "online": _run_online,
    "games": _run_games,
    "stream": _run_stream, "serve": _run_serve}
