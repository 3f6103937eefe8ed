"""``memento bench``: benchmarks that write JSON results, one suite per subcommand (bank, select, train, online,
games, stream, serve). The games and stream suites import the games extra only when they run."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable
from typing import Any, get_args

from memento.bench.bank import BankBenchConfig, format_table, run_bank_bench
from memento.bench.ingest import IngestBenchConfig, run_ingest_bench
from memento.bench.ingest import format_table as format_import
from memento.bench.online import BenchPolicy, OnlineBenchConfig, format_online_table, run_online_bench
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
from memento.config import QNetArch, field_default
from memento.errors import ConfigError
from memento.flags import check_device, config_option, int_arg

_ARCHS = list(get_args(QNetArch))
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
    bb.add_argument("--sizes", type=int_arg, nargs="+", default=[10_000, 100_000],
                    help="bank sizes (default: 10000 100000)")
    bb.add_argument("--factories", nargs="+", default=["Flat", "HNSW32,Flat", "IVF{nlist},Flat"],
                    help='faiss factory strings (default: Flat "HNSW32,Flat" "IVF{nlist},Flat")')
    bb.add_argument("--dim", type=int_arg, default=384, help="vector dimension (default: 384)")
    bb.add_argument("--queries", type=int_arg, default=200, help="timed single queries per setting (default: 200)")
    bb.add_argument("-k", type=int_arg, default=10, help="k for search and recall@k (default: 10)")
    bb.add_argument("--data", choices=["uniform", "clustered"], default="uniform",
                    help="uniform random unit vectors, or a mixture of clusters like real embeddings")
    bb.add_argument("--ef-search", type=int_arg, nargs="+", default=[64, 128, 256], help="HNSW efSearch values")
    bb.add_argument("--nprobe", type=int_arg, nargs="+", default=[16, 64, 256], help="IVF nprobe values")
    bb.add_argument("--backends", type=_backends, default=("dir",), metavar="LIST",
                    help="comma-separated bank backends: dir (SQLite + faiss), milvus (a Milvus Lite file; the "
                         "'milvus' extra), e.g. dir,milvus (default: dir)")
    bb.add_argument("--op", choices=["search", "candidates"], default="search",
                    help="what is timed: search_positions, or candidates (ids + stored vectors) (default: search)")
    add_seed(bb)
    add_workdir(bb)
    add_results_file(bb)


def _run_bank(args: argparse.Namespace) -> int:
    config = BankBenchConfig(sizes=tuple(args.sizes), factories=tuple(args.factories), dim=args.dim,
                             queries=args.queries, k=args.k, data=args.data, ef_search=tuple(args.ef_search),
                             nprobe=tuple(args.nprobe), backends=args.backends, op=args.op, seed=args.seed)
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
    bi.add_argument("--sizes", type=int_arg, nargs="+", default=list(field_default(IngestBenchConfig, "sizes")),
                    help="cases per import (default: 100000 1000000)")
    bi.add_argument("--factory", default=field_default(IngestBenchConfig, "factory"),
                    help="the new bank's faiss index (default: IVF1024,PQ32x4fs)")
    bi.add_argument("--refine", type=int_arg, default=field_default(IngestBenchConfig, "refine"),
                    help="the bank's refine setting (default: 4)")
    bi.add_argument("--chunk", type=int_arg, default=field_default(IngestBenchConfig, "chunk"),
                    help="the import's --chunk, cases per transaction (default: 50000)")
    bi.add_argument("--dim", type=int_arg, default=field_default(IngestBenchConfig, "dim"),
                    help="vector dimension (default: 384)")
    bi.add_argument("--data", choices=["clustered", "uniform"], default="clustered",
                    help="clustered vectors like real embeddings (default), or uniform on the sphere")
    bi.add_argument("--again", action="store_true", help="time a second run of the same import")
    bi.add_argument("--keep", default=None, metavar="DIR",
                    help="leave the generated files and the bank in DIR/import-N (default: a temporary directory)")
    add_seed(bi)
    add_workdir(bi)
    add_results_file(bi)


def _run_import(args: argparse.Namespace) -> int:
    config = IngestBenchConfig(sizes=tuple(args.sizes), factory=args.factory, refine=args.refine, chunk=args.chunk,
                               dim=args.dim, data=args.data, again=args.again, keep=args.keep, seed=args.seed)
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
    bs.add_argument("--sizes", type=int_arg, nargs="+", default=[1_000, 10_000, 100_000, 1_000_000],
                    help="bank sizes (default: 1000 10000 100000 1000000)")
    bs.add_argument("--k", type=int_arg, default=4, help="cases selected per query (default: 4)")
    bs.add_argument("--candidates", type=int_arg, default=64, help="candidate set size C (default: 64)")
    bs.add_argument("--factory", default="HNSW32,Flat",
                    help='faiss factory for banks above --exact-max (default: "HNSW32,Flat")')
    bs.add_argument("--exact-max", type=int_arg, default=20_000,
                    help="largest bank that uses Flat, exact search (default: 20000)")
    bs.add_argument("--ef-search", type=int_arg, nargs="+", default=[64], help="HNSW efSearch values (default: 64)")
    bs.add_argument("--nprobe", type=int_arg, nargs="+", default=[32], help="IVF nprobe values (default: 32)")
    bs.add_argument("--vectors", choices=["ram", "disk"], nargs="+", default=["ram"],
                    help="where the banks keep their float32 vectors: in RAM, or in a memory-mapped file read by "
                         "position; one bank per value and size (default: ram)")
    bs.add_argument("--refine", type=int_arg, nargs="+", default=[1],
                    help="re-rank REFINE x C index hits by their exact vectors, one setting per value, at the sizes "
                         "above --exact-max (default: 1, the index's own order)")
    bs.add_argument("--archs", nargs="+", choices=_ARCHS, default=_ARCHS,
                    help="Q-network architectures for the soft-Q policy (default: all)")
    bs.add_argument("--data", choices=["clustered", "uniform"], default="clustered",
                    help="clustered vectors like real embeddings (default), or uniform on the sphere")
    bs.add_argument("--dim", type=int_arg, default=384, help="vector dimension (default: 384)")
    bs.add_argument("--queries", type=int_arg, default=200, help="timed single queries per setting (default: 200)")
    bs.add_argument("--chunk", type=int_arg, default=100_000,
                    help="vectors drawn and added per chunk, the most the bench holds at once (default: 100000)")
    bs.add_argument("--recall-queries", type=int_arg, default=100,
                    help="queries whose exact top-C is streamed over the chunks for the recall (default: 100)")
    bs.add_argument("--reference-size", type=int_arg, default=1_000,
                    help="cases scored by the Memento-style reference (default: 1000; 0 skips it)")
    bs.add_argument("--reference-queries", type=int_arg, default=5, help="queries timed for the reference (default: 5)")
    add_torch_threads(bs, 1, "torch threads while selections are timed (default: 1; 0: torch's default)")
    bs.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="where the Q-networks score and, with faiss-gpu, where the banks search (default: cpu)")
    bs.add_argument("--bank", default=None,
                    help="measure this existing directory bank instead of building banks (opened read-only; "
                         "--sizes, --factory and --vectors are then unused): e.g. a 10M bank built once with "
                         "memento bank import")
    bs.add_argument("--cold", action="store_true",
                    help="time each setting twice: first after evicting the bank's vectors.f32 from the page "
                         "cache (cold), then warm")
    add_seed(bs)
    add_workdir(bs)
    add_results_file(bs)


def _run_select(args: argparse.Namespace) -> int:
    check_device(args.device)  # cuda without a CUDA device: one line, before any work
    config = SelectBenchConfig(
        sizes=tuple(args.sizes), k=args.k, candidates=args.candidates, factory=args.factory,
        exact_max=args.exact_max, ef_search=tuple(args.ef_search), nprobe=tuple(args.nprobe),
        vectors=tuple(args.vectors), refine=tuple(args.refine), archs=tuple(args.archs),
        data=args.data, dim=args.dim, queries=args.queries, chunk=args.chunk, recall_queries=args.recall_queries,
        reference_size=args.reference_size, reference_queries=args.reference_queries,
        torch_threads=args.torch_threads, device=args.device, seed=args.seed, bank=args.bank, cold=args.cold)
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
    bt.add_argument("--archs", nargs="+", choices=_ARCHS, default=_ARCHS, help="Q-network architectures (default: all)")
    bt.add_argument("--batch-size", type=int_arg, default=256, help="decisions per update (default: 256)")
    bt.add_argument("--k", type=int_arg, default=4, help="cases per decision (default: 4)")
    bt.add_argument("--steps", type=int_arg, default=200, help="timed updates per architecture (default: 200)")
    bt.add_argument("--dim", type=int_arg, default=384, help="embedding dimension (default: 384)")
    bt.add_argument("--buffer-size", type=int_arg, default=100_000,
                    help="decisions in the replay buffer (default: 100000)")
    bt.add_argument("--bank-cases", type=int_arg, default=10_000,
                    help="a second buffer draws its cases from a bank of this many vectors (default: 10000)")
    bt.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                    help="where to train (default: auto, CUDA when present)")
    add_torch_threads(bt, 0, "torch threads (default: 0, torch's default)")
    add_seed(bt)
    bt.add_argument("--lightning", action="store_true",
                    help="also time the Lightning trainer of `memento train` beside the plain loop, per architecture")
    add_results_file(bt)


def _run_train(args: argparse.Namespace) -> int:
    check_device(args.device)
    config = TrainBenchConfig(
        archs=tuple(args.archs), batch_size=args.batch_size, k=args.k, steps=args.steps, dim=args.dim,
        buffer_size=args.buffer_size, bank_cases=args.bank_cases, device=args.device,
        torch_threads=args.torch_threads, seed=args.seed)
    if args.lightning:
        from memento.training.bench import run_train_bench_lightning

        return _printed(format_train(run_train_bench_lightning(config, out=args.json)), args)
    return _printed(format_train(run_train_bench(config, out=args.json)), args)


# ---------------------------------------------------------------- online


_ONLINE_FIELDS = {  # OnlineBenchConfig field -> the help of its flag
    "steps": "tasks per policy and seed in the real part", "suite": "shipped suite", "split": "split of the suite",
    "late_steps": "the 'late' window", "synthetic_steps": "bandit steps per policy",
    "overhead_bank": "bank size for the overhead part", "overhead_steps": "steps per policy in the overhead part",
    "workers_steps": "workers part: tasks per throughput run",
    "workers_latency_ms": "workers part: the fixed planner latency",
    "workers_curve_steps": "workers part: transitions per learning-curve run on the synthetic bandit",
    "window": "the 'early' window of the real part",
    "best_of_c": "real part: the nearest rewarded cases the best_of_c upper bound scores per task",
    "ope_bootstrap": "real part: bootstrap resamples of the off-policy estimates' intervals (0: none)",
}


def _add_online(suites: Any) -> None:
    bo = add_command(
        suites, "online", "the online loop: real planner on a shipped suite, synthetic regret, loop overhead",
        raw=False,
        description="Three parts: (real) the policies on a shipped suite's test split with a real planner "
                    "(Gemma by default; about 0.8 s per step on 2 cores), success per window and the late gap "
                    "soft-Q minus similarity; (synthetic) mean per-step regret on the synthetic bandit; "
                    "(overhead) the loop's ms per step excluding the planner and judge, on a bank of "
                    "--overhead-bank cases.")
    for name, text in _ONLINE_FIELDS.items():
        config_option(bo, OnlineBenchConfig, name, text, **({"choices": ["train", "test", "all"]}
                                                            if name == "split" else {}))
    add_planner_option(bo, OnlineBenchConfig)
    bo.add_argument("--policies", default="soft_q,similarity",
                    help=f"comma-separated, from {', '.join(get_args(BenchPolicy))} (default: soft_q,similarity)")
    bo.add_argument("--parts", default="real,synthetic,overhead",
                    help="comma-separated parts to run: real, synthetic, overhead, workers (Ray rollout workers: "
                         "tasks/s with a fixed-latency planner, and the synthetic learning curve, per --workers count)")
    bo.add_argument("--workers", default=None, metavar="N[,N...]",
                    help="workers part: the worker counts, side by side in one run (default: 1,2,4)")
    add_workdir(bo, "keep the run directories here (default: a temporary one)")
    add_torch_threads(bo, 1, "torch threads (default: 1)")
    seeds = bo.add_mutually_exclusive_group()
    seeds.add_argument("--seeds", type=int_arg, nargs="+", default=None, metavar="S",
                       help="seeds of the real part, one run per policy each (default: 0)")
    add_seed(seeds, "one seed (the same as --seeds S)", default=None)
    bo.add_argument("--retain-judge", choices=JUDGES, default=None,
                    help="real part: the judge of a retained case's stored reward (default: exact, as the reward)")
    bo.add_argument("--soft-q-candidates", choices=["all", "positive"], default="all",
                    help="real part: soft_q chooses among all candidates or only rewarded ones (default: all)")
    bo.add_argument("--init-qnet", metavar="DIR", default=None,
                    help="real part: the trained Q-network of soft_q_pretrained and soft_q_pretrained_frozen "
                         "(a `memento train` run directory, e.g. --from-labels on the suite's train split)")
    bo.add_argument("--resume", action="store_true",
                    help="real part: keep the finished runs in --workdir (resume unfinished ones) instead of "
                         "refusing a non-empty run directory; lets policies be added to a benchmark later")
    bo.add_argument("--no-ope", dest="ope", action="store_false",
                    help="real part: skip the off-policy estimates (memento evaluate, from each seed's soft_q log) of "
                         "the greedy learned selector and of similarity next to the measured figures")
    add_results_file(bo)


def _run_online(args: argparse.Namespace) -> int:
    names = (*_ONLINE_FIELDS, "planner")
    given = {name: getattr(args, name) for name in names if getattr(args, name) is not None}
    if args.workers is not None:
        try:
            given["workers"] = tuple(int(n) for n in args.workers.split(",") if n.strip())
        except ValueError:
            raise ConfigError(f"--workers {args.workers!r}: expected worker counts such as 1,2,4") from None
    if args.seeds or args.seed is not None:
        given["seeds"] = tuple(args.seeds) if args.seeds else (args.seed,)
    config = OnlineBenchConfig(
        policies=comma_list(args.policies), parts=comma_list(args.parts),  # type: ignore[arg-type]
        soft_q_candidates=args.soft_q_candidates, retain_judge=args.retain_judge, init_qnet=args.init_qnet,
        resume=args.resume, ope=args.ope, **given)
    set_torch_threads(args.torch_threads)
    return _printed(format_online_table(run_online_bench(config, out=args.json, workdir=args.workdir)), args)


# ---------------------------------------------------------------- games and stream (the games extra)


def _add_game_fields(parser: Any, cls: type, fields: dict[str, str]) -> None:
    """The fields of a games/stream bench config: comma-separated lists for tuple-of-string fields, ``--seeds``
    as numbers."""
    for name, text in fields.items():
        default = field_default(cls, name)
        if isinstance(default, tuple) and name != "seeds":
            config_option(parser, cls, name, text, nargs=None, shown_default=",".join(default))
        else:
            config_option(parser, cls, name, text)
    add_planner_option(parser, cls)
    add_workdir(parser, _KEEP_RUNS)
    parser.add_argument("--resume", action="store_true", help="reuse finished runs in --workdir")
    add_torch_threads(parser, 0, _TORCH)
    add_results_file(parser)


_GAMES_FIELDS = {"suite": "shipped suite", "arms": "comma-separated arms", "seeds": "seeds",
                 "train_episodes": "episodes of the train phase", "eval_repeats": "evaluation episodes per game",
                 "case_weight": "the actor's probability mass on the chosen cases' proposals",
                 "splits": "evaluation splits", "max_steps": "step limit", "k": "cases per decision",
                 "candidates": "candidate set size"}


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
    bg.add_argument("--continual", action="store_true",
                    help="evaluate as the online loop runs: retain the evaluation episodes and keep learning "
                         "(results keyed <split>-continual; with --resume the train runs in --workdir are reused)")
    _add_game_fields(bg, GamesBenchConfig, _GAMES_FIELDS)


def _add_stream(suites: Any) -> None:
    from memento.bench.stream import EXTRA_ARMS, STREAM_ARMS, StreamBenchConfig

    bs = add_command(
        suites, "stream", "lifelong evaluation of memory systems over a stream of environments (OP, BwT)", raw=False,
        description="Per seed, stream order (grouped, random) and arm (" + ", ".join(STREAM_ARMS) + "): "
                    "play the suite's train games as one stream (retaining, building memory items, learning), "
                    "evaluate each environment's test games at its learned point (its last training game) and "
                    "after the stream, frozen (on a question suite such as facts-real its question families are "
                    "the environments, answered by the online loop from the suite's seed bank, scored by exact "
                    "match); report OP (mean final score), BwT (relative change from the learned point), final "
                    "success and the builders' LLM calls and items per kind.")
    config_option(bs, StreamBenchConfig, "envs", "question suites: the families in the stream", nargs=None,
                  metavar="F[,F...]", shown_default="every family of the suite")
    bs.add_argument("--no-seed-bank", action="store_true",
                    help="question suites: start every memory arm from an empty bank (default: the suite's seed "
                         "cases, retained answers stored with the lenient contains judge)")
    _add_game_fields(bs, StreamBenchConfig, {
        "suite": "shipped suite", "arms": f"comma-separated arms (also {', '.join(EXTRA_ARMS)}, only when named)",
        "orders": "grouped, random", "seeds": "seeds", "eval_repeats": "evaluation episodes per test game",
        "max_steps": "step limit", "k": "items per decision, the prompt budget", "candidates": "candidate set size",
        "train_per_env": "question suites: train questions per family",
        "test_per_env": "question suites: test questions per family"})


def _bench_fields(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    """The fields of ``cls`` given on the command line (comma-separated lists as tuples)."""
    given: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        value = getattr(args, field.name, None)
        if value is None or field.name in ("resume", "continual", "seed_bank"):
            continue
        if isinstance(value, list):
            value = tuple(value)
        elif isinstance(field.default, tuple):
            if not value:
                continue
            value = comma_list(value)
        given[field.name] = value
    return given


def _run_bench(args: argparse.Namespace, run: Callable[..., Any], config: Any, table: Callable[[Any], str]) -> int:
    set_torch_threads(args.torch_threads)
    results = run(config, out=args.json, workdir=args.workdir, progress=sys.stderr.isatty())
    return _printed(table(results), args)


def _run_games(args: argparse.Namespace) -> int:
    from memento.bench.games import GamesBenchConfig, format_games_table, run_games_bench

    config = GamesBenchConfig(resume=args.resume, continual=args.continual, **_bench_fields(args, GamesBenchConfig))
    return _run_bench(args, run_games_bench, config, format_games_table)


def _run_stream(args: argparse.Namespace) -> int:
    from memento.bench.stream import StreamBenchConfig, format_stream_table, run_stream_bench

    given = _bench_fields(args, StreamBenchConfig)
    if args.no_seed_bank:
        given["seed_bank"] = False
    config = StreamBenchConfig(resume=args.resume, **given)
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
    bsv.add_argument("--size", type=int_arg, default=100_000, help="cases in the bank (default: 100000)")
    bsv.add_argument("--factory", default="HNSW32,Flat", help='faiss index of the bank (default: "HNSW32,Flat")')
    bsv.add_argument("--data", choices=["clustered", "uniform"], default="clustered",
                     help="clustered vectors like real embeddings (default), or uniform on the sphere")
    bsv.add_argument("--k", type=int_arg, default=4, help="cases per select (default: 4)")
    bsv.add_argument("--clients", type=int_arg, nargs="+", default=[1, 16],
                     help="concurrent client threads (default: 1 16)")
    bsv.add_argument("--selects", type=int_arg, default=1000, help="timed selects by embedding per client count "
                                                               "(default: 1000)")
    bsv.add_argument("--text-selects", type=int_arg, default=200,
                     help="timed selects by text per client count (default: 200; 0 skips)")
    bsv.add_argument("--feedbacks", type=int_arg, default=1000, help="timed feedbacks per client count (default: 1000)")
    bsv.add_argument("--no-learn", action="store_true", help="skip the run with a learning server (--learn)")
    bsv.add_argument("--threads", type=int_arg, default=1, help="the server's --threads (default: 1)")
    bsv.add_argument("--batch-max-texts", type=int_arg, default=None, metavar="N",
                     help="the server's --batch-max-texts (default: the server's default)")
    bsv.add_argument("--batch-wait-ms", type=float, default=None, metavar="MS",
                     help="the server's --batch-wait-ms (default: the server's default)")
    bsv.add_argument("--warmup", type=int_arg, default=20, help="untimed requests before each phase (default: 20)")
    bsv.add_argument("--workers", type=int_arg, nargs="+", default=[1], metavar="N",
                     help="the server's --workers, one run of the select and feedback phases per value, recorded "
                          "side by side (default: 1), e.g. --workers 1 2")
    add_seed(bsv)
    bsv.add_argument("--artifact", metavar="DIR", default=None,
                     help="reuse the selector here, or build it here and keep it (default: a temporary one)")
    add_workdir(bsv, "where temporary files go (default: system temp)")
    add_results_file(bsv)


def _run_serve(args: argparse.Namespace) -> int:
    config = ServeBenchConfig(
        size=args.size, data=args.data, factory=args.factory, k=args.k, clients=tuple(args.clients),
        selects=args.selects, text_selects=args.text_selects, feedbacks=args.feedbacks, learn=not args.no_learn,
        server_threads=args.threads, batch_max_texts=args.batch_max_texts, batch_wait_ms=args.batch_wait_ms,
        warmup=args.warmup, seed=args.seed, workers=tuple(args.workers))
    return _printed(format_serve_table(run_serve_bench(config, out=args.json, artifact=args.artifact,
                                                       workdir=args.workdir)), args)


_SUITES: dict[str, Callable[[argparse.Namespace], int]] = {
    "bank": _run_bank, "import": _run_import, "select": _run_select, "train": _run_train, "online": _run_online,
    "games": _run_games,
    "stream": _run_stream, "serve": _run_serve}
