"""The ``memento`` command.

Every subcommand validates its input before writing anything; a ``MementoError`` is
printed as one line (``memento: error: ...``) with exit code 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any, get_args

from memento._version import __version__
from memento.bench.bank import BankBenchConfig, format_table, run_bank_bench
from memento.bench.online import BenchPolicy, OnlineBenchConfig, format_online_table, run_online_bench
from memento.bench.select import SelectBenchConfig, run_select_bench
from memento.bench.select import format_table as format_select
from memento.bench.serve import ServeBenchConfig, format_serve_table, run_serve_bench
from memento.bench.train import TrainBenchConfig, run_train_bench
from memento.bench.train import format_table as format_train
from memento.cli.evaluate import add_evaluate_parser, cmd_evaluate
from memento.cli.games import (
    add_bench_games_parser,
    add_bench_stream_parser,
    add_play_parser,
    add_systems_flags,
    cmd_bench_games,
    cmd_bench_stream,
    cmd_play,
    systems_from_args,
)
from memento.config import (
    EncoderConfig,
    IndexConfig,
    LabelTarget,
    OnlineLabelsConfig,
    PolicyKind,
    QNetAnchor,
    QNetArch,
    QNetConfig,
    QNetFeatures,
    SoftQConfig,
    field_default,
)
from memento.encoders import Encoder, saved_pooling
from memento.envs.tasks import suite_dir
from memento.errors import ConfigError, DataFormatError, DimensionError, EncoderError, MementoError
from memento.formats import CaseFormat, read_case_file, read_tasks_jsonl
from memento.learn.labels import LabelConfig, label_tasks, read_label_tasks, summary_path
from memento.memory import CaseBank, MilvusOptions, bank_exists, copy_bank, create_bank, open_bank, parse_bank_uri
from memento.memory.uri import bank_name
from memento.planners.base import PlannerError
from memento.planners.spec import build_planner, check_planner_spec, parse_planner_spec
from memento.runs.compare import comparison_table, run_comparison
from memento.runs.qa import Credit, LoopConfig, check_seed_bank, loop_policy
from memento.runs.ray import WorkersConfig
from memento.selector.export import create_selector, export_selector, verify
from memento.serve.app import ServeConfig, check_host, require_extra, resolve_token, serve
from memento.serve.mcp import run_mcp
from policies import make_policy

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

_CASE_FORMAT_HELP = """\
case               Case JSONL {"id", "state", "action", "reward", "env"?, "kind"?, "meta"?}
memento-memory     Memento case memory {"case", "plan", "case_label": positive|negative}
memento-np-memory  Memento non-parametric memory {"question", "plan", "reward": 0|1}
memento-training   Memento retriever pairs {"query", "case", "case_label", "plan", "truth_label"}
                   (imports the unique cases they mention)"""


_PLANNER_SPECS = "gemma | hf:PATH_OR_HUB_ID[@REV] | openai:MODEL@URL"

def _add_encoder_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("encoder (used when the bank is created)")
    group.add_argument("--encoder", metavar="PATH", default=None,
                       help="local transformers encoder directory (default: bundled all-MiniLM-L6-v2)")
    group.add_argument("--pooling", choices=["avg", "cls", "cls_before_pooler"], default=None,
                       help="SimCSE pooling (default: the one a fine-tuned --encoder records, else avg)")
    _option(group, "--max-length", EncoderConfig, "max_length", "token limit per text", type=int)
    _option(group, "--index", IndexConfig, "factory", 'faiss index factory string, e.g. "Flat", "HNSW32,Flat", '
            '"IVF1024,Flat"', dest="index")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="memento",
        description="Learn which past cases a frozen LLM should see. Manage case banks and run benchmarks.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Errors in input print one line and exit with status 2. Run 'memento COMMAND --help' for details.")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log more (-v info, -vv debug)")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    bank = commands.add_parser("bank", help="create, fill, search, copy and inspect case banks",
                               description="A case bank is a directory: cases.sqlite (cases + embeddings) "
                                           "and index.faiss beside it; or a Milvus collection (the 'milvus' "
                                           "extra): --bank milvus:FILE.db is Milvus Lite in a local file, --bank "
                                           "milvus:http://host:19530 a server, each with an optional #collection "
                                           "(default memento_cases).")
    bank_cmds = bank.add_subparsers(dest="bank_command", metavar="ACTION", required=True)

    create = bank_cmds.add_parser("create", help="create an empty bank",
                                  description="Create an empty case bank. Its dimension comes from the encoder, "
                                              "or from --dim for a bank filled with your own vectors.")
    create.add_argument("--bank", required=True, metavar="BANK", help="bank to create (a directory or milvus:URI)")
    create.add_argument("--dim", type=int, default=None,
                        help="vector dimension without an encoder (then text search is unavailable)")
    _add_encoder_options(create)

    imp = bank_cmds.add_parser(
        "import", help="import cases from a JSONL file", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Read a case file, encode the states and add every case in one transaction.\n"
                    "The whole file is checked first: a bad line prints FILE:LINE: reason, exits 2,\n"
                    "and leaves the bank unchanged. A missing bank is created (encoder options below).\n\n"
                    "formats:\n" + _CASE_FORMAT_HELP)
    imp.add_argument("file", metavar="FILE", help="JSONL file to import")
    imp.add_argument("--bank", required=True, metavar="BANK", help="bank (a directory or milvus:URI; created if "
                     "missing)")

    imp.add_argument("--format", choices=list(get_args(CaseFormat)), default="case",
                     help="input format (default: case)")
    imp.add_argument("--allow-duplicates", action="store_true",
                     help="store cases whose content is already in the bank")
    _add_encoder_options(imp)

    exp = bank_cmds.add_parser("export", help="write every case as Case JSONL")
    exp.add_argument("out", metavar="OUT", help="output JSONL file (written atomically)")
    exp.add_argument("--bank", required=True, metavar="BANK", help="a directory or milvus:URI[#collection]")

    search = bank_cmds.add_parser("search", help="nearest cases to a text",
                                  description="Encode TEXT with the bank's encoder and print the k nearest cases "
                                              "by cosine similarity.")
    search.add_argument("text", metavar="TEXT")
    search.add_argument("--bank", required=True, metavar="BANK", help="a directory or milvus:URI[#collection]")
    search.add_argument("-k", type=int, default=4, help="number of cases (default: 4)")
    search.add_argument("--env", default=None, help="only cases of this env")
    search.add_argument("--kind", default=None, help="only cases of this kind")
    search.add_argument("--json", action="store_true", help="print JSON instead of text")

    stats = bank_cmds.add_parser("stats", help="counts, rewards, index and file sizes")
    stats.add_argument("--bank", required=True, metavar="BANK", help="a directory or milvus:URI[#collection]")
    stats.add_argument("--json", action="store_true", help="print JSON instead of text")

    copy = bank_cmds.add_parser(
        "copy", help="copy a bank to a new one (directory <-> Milvus)",
        description="Copy every case of --bank SRC to a new bank DST, keeping positions, ids, rewards, kinds, "
                    "meta and embeddings exactly (deleted cases stay deleted). Either side is a directory or "
                    "milvus:URI[#collection]. DST must not hold a bank; a failed copy leaves nothing at DST.")
    copy.add_argument("dst", metavar="DST", help="the new bank")
    copy.add_argument("--bank", required=True, metavar="SRC", help="the bank to copy")
    copy.add_argument("--index", default=None,
                      help="DST's index factory (default: SRC's; Milvus takes Flat, IVF<n>,Flat, HNSW<M>,Flat)")
    copy.add_argument("--connect-timeout", type=float, default=None, metavar="S",
                      help="give up connecting to a Milvus server after S seconds (default: 5)")
    for sub in (create, imp, exp, search, stats):
        sub.add_argument("--connect-timeout", type=float, default=None, metavar="S",
                         help="give up connecting to a Milvus server after S seconds (default: 5)")

    bench = commands.add_parser("bench", help="benchmarks that write JSON results",
                                description="Benchmarks. Each writes a JSON file of results; compare figures "
                                            "from one run (these machines are noisy).")
    bench_cmds = bench.add_subparsers(dest="bench_command", metavar="SUITE", required=True)
    bb = bench_cmds.add_parser(
        "bank", help="case bank add throughput, search latency and recall per index",
        description="Fill banks with random unit vectors and measure CaseBank.add throughput (SQLite + index), "
                    "single-query search latency (p50/p99) and recall@k against exact search, for each index "
                    "factory and size. '{nlist}' in a factory is replaced by a size-dependent IVF list count.")
    bb.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000],
                    help="bank sizes (default: 10000 100000)")
    bb.add_argument("--factories", nargs="+", default=["Flat", "HNSW32,Flat", "IVF{nlist},Flat"],
                    help='faiss factory strings (default: Flat "HNSW32,Flat" "IVF{nlist},Flat")')
    bb.add_argument("--dim", type=int, default=384, help="vector dimension (default: 384)")
    bb.add_argument("--queries", type=int, default=200, help="timed single queries per setting (default: 200)")
    bb.add_argument("-k", type=int, default=10, help="k for search and recall@k (default: 10)")
    bb.add_argument("--data", choices=["uniform", "clustered"], default="uniform",
                    help="uniform random unit vectors, or a mixture of clusters like real embeddings")
    bb.add_argument("--ef-search", type=int, nargs="+", default=[64, 128, 256], help="HNSW efSearch values")
    bb.add_argument("--nprobe", type=int, nargs="+", default=[16, 64, 256], help="IVF nprobe values")
    bb.add_argument("--backends", type=_backends, default=("dir",), metavar="LIST",
                    help="comma-separated bank backends: dir (SQLite + faiss), milvus (a Milvus Lite file; the "
                         "'milvus' extra), e.g. dir,milvus (default: dir)")
    bb.add_argument("--op", choices=["search", "candidates"], default="search",
                    help="what is timed: search_positions, or candidates (ids + stored vectors) (default: search)")
    bb.add_argument("--seed", type=int, default=0)
    bb.add_argument("--workdir", default=None, help="where the temporary banks go (default: system temp)")
    bb.add_argument("--json", required=True, metavar="OUT", help="results file")

    archs = list(get_args(QNetArch))
    bs = bench_cmds.add_parser(
        "select", help="end-to-end selection latency (candidates + policy) per bank size, vs a Memento reference",
        description="Fill banks with random unit vectors and time, one query state at a time, "
                    "bank.candidates(state, C) + policy.select(state, candidates, K) for the similarity policy and "
                    "the soft-Q policy with each Q-network architecture (p50/p99 and the split between search and "
                    "policy), with the recall of the exact top-C. Banks of up to --exact-max cases use Flat (exact), "
                    "larger ones --factory. The Memento-style reference encodes every (query, case) pair with the "
                    "real encoder at --reference-size cases (0 skips it).")
    bs.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000, 1_000_000],
                    help="bank sizes (default: 1000 10000 100000 1000000)")
    bs.add_argument("--k", type=int, default=4, help="cases selected per query (default: 4)")
    bs.add_argument("--candidates", type=int, default=64, help="candidate set size C (default: 64)")
    bs.add_argument("--factory", default="HNSW32,Flat",
                    help='faiss factory for banks above --exact-max (default: "HNSW32,Flat")')
    bs.add_argument("--exact-max", type=int, default=20_000,
                    help="largest bank that uses Flat, exact search (default: 20000)")
    bs.add_argument("--ef-search", type=int, nargs="+", default=[64], help="HNSW efSearch values (default: 64)")
    bs.add_argument("--archs", nargs="+", choices=archs, default=archs,
                    help="Q-network architectures for the soft-Q policy (default: all)")
    bs.add_argument("--data", choices=["clustered", "uniform"], default="clustered",
                    help="clustered vectors like real embeddings (default), or uniform on the sphere")
    bs.add_argument("--dim", type=int, default=384, help="vector dimension (default: 384)")
    bs.add_argument("--queries", type=int, default=200, help="timed single queries per setting (default: 200)")
    bs.add_argument("--reference-size", type=int, default=1_000,
                    help="cases scored by the Memento-style reference (default: 1000; 0 skips it)")
    bs.add_argument("--reference-queries", type=int, default=5, help="queries timed for the reference (default: 5)")
    bs.add_argument("--torch-threads", type=int, default=1,
                    help="torch threads while selections are timed (default: 1; 0: torch's default)")
    bs.add_argument("--seed", type=int, default=0)
    bs.add_argument("--workdir", default=None, help="where the temporary banks go (default: system temp)")
    bs.add_argument("--json", required=True, metavar="OUT", help="results file")

    bt = bench_cmds.add_parser(
        "train", help="soft-Q learner throughput with cached embeddings, and replay-buffer latency",
        description="Fill a replay buffer with random decisions and time buffer.sample(B) + learner.update(batch) "
                    "for each Q-network architecture, in (state, case, reward) samples/s (B x K per update); then "
                    "time replay add (one transition), add_batch(B) and sample(B) (indices only, and with the vectors "
                    "gathered; also on a buffer whose cases come from a bank of --bank-cases), beside the replay "
                    "buffers of Stable-Baselines3 and TorchRL when they are installed. Runs on CUDA when present "
                    "(--device auto).")
    bt.add_argument("--archs", nargs="+", choices=archs, default=archs, help="Q-network architectures (default: all)")
    bt.add_argument("--batch-size", type=int, default=256, help="decisions per update (default: 256)")
    bt.add_argument("--k", type=int, default=4, help="cases per decision (default: 4)")
    bt.add_argument("--steps", type=int, default=200, help="timed updates per architecture (default: 200)")
    bt.add_argument("--dim", type=int, default=384, help="embedding dimension (default: 384)")
    bt.add_argument("--buffer-size", type=int, default=100_000, help="decisions in the replay buffer (default: 100000)")
    bt.add_argument("--bank-cases", type=int, default=10_000,
                    help="a second buffer draws its cases from a bank of this many vectors (default: 10000)")
    bt.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                    help="where to train (default: auto, CUDA when present)")
    bt.add_argument("--torch-threads", type=int, default=0, help="torch threads (default: 0, torch's default)")
    bt.add_argument("--seed", type=int, default=0)
    bt.add_argument("--lightning", action="store_true",
                    help="also time the Lightning trainer of `memento train` beside the plain loop, per architecture")
    bt.add_argument("--json", required=True, metavar="OUT", help="results file")

    bo = bench_cmds.add_parser(
        "online", help="the online loop: real planner on a shipped suite, synthetic regret, loop overhead",
        description="Three parts: (real) the policies on a shipped suite's test split with a real planner "
                    "(Gemma by default; about 0.8 s per step on 2 cores), success per window and the late gap "
                    "soft-Q minus similarity; (synthetic) mean per-step regret on the synthetic bandit; "
                    "(overhead) the loop's ms per step excluding the planner and judge, on a bank of "
                    "--overhead-bank cases.")
    _option(bo, "--steps", OnlineBenchConfig, "steps", "tasks per policy and seed in the real part", type=int)
    bo.add_argument("--policies", default="soft_q,similarity",
                    help=f"comma-separated, from {', '.join(get_args(BenchPolicy))} (default: soft_q,similarity)")
    _option(bo, "--suite", OnlineBenchConfig, "suite", "shipped suite")
    _option(bo, "--split", OnlineBenchConfig, "split", "split of the suite", choices=["train", "test", "all"])
    _option(bo, "--planner", OnlineBenchConfig, "planner", _PLANNER_SPECS, metavar="SPEC")
    _option(bo, "--late-steps", OnlineBenchConfig, "late_steps", "the 'late' window", type=int)
    _option(bo, "--synthetic-steps", OnlineBenchConfig, "synthetic_steps", "bandit steps per policy", type=int)
    _option(bo, "--overhead-bank", OnlineBenchConfig, "overhead_bank", "bank size for the overhead part", type=int)
    _option(bo, "--overhead-steps", OnlineBenchConfig, "overhead_steps", "steps per policy in the overhead part",
            type=int)
    bo.add_argument("--parts", default="real,synthetic,overhead",
                    help="comma-separated parts to run: real, synthetic, overhead, workers (Ray rollout workers: "
                         "tasks/s with a fixed-latency planner, and the synthetic learning curve, per --workers count)")
    bo.add_argument("--workers", default=None, metavar="N[,N...]",
                    help="workers part: the worker counts, side by side in one run (default: 1,2,4)")
    _option(bo, "--workers-steps", OnlineBenchConfig, "workers_steps", "workers part: tasks per throughput run",
            type=int)
    _option(bo, "--workers-latency-ms", OnlineBenchConfig, "workers_latency_ms",
            "workers part: the fixed planner latency", type=float)
    _option(bo, "--workers-curve-steps", OnlineBenchConfig, "workers_curve_steps",
            "workers part: transitions per learning-curve run on the synthetic bandit", type=int)
    bo.add_argument("--workdir", default=None, help="keep the run directories here (default: a temporary one)")
    bo.add_argument("--torch-threads", type=int, default=1, help="torch threads (default: 1)")
    bo_seeds = bo.add_mutually_exclusive_group()
    bo_seeds.add_argument("--seeds", type=int, nargs="+", default=None, metavar="S",
                          help="seeds of the real part, one run per policy each (default: 0)")
    bo_seeds.add_argument("--seed", type=int, default=None, help="one seed (the same as --seeds S)")
    _option(bo, "--window", OnlineBenchConfig, "window", "the 'early' window of the real part", type=int)
    bo.add_argument("--retain-judge", choices=["exact", "f1", "contains", "numeric"], default=None,
                    help="real part: the judge of a retained case's stored reward (default: exact, as the reward)")
    bo.add_argument("--soft-q-candidates", choices=["all", "positive"], default="all",
                    help="real part: soft_q chooses among all candidates or only rewarded ones (default: all)")
    bo.add_argument("--init-qnet", metavar="DIR", default=None,
                    help="real part: the trained Q-network of soft_q_pretrained and soft_q_pretrained_frozen "
                         "(a `memento train` run directory, e.g. --from-labels on the suite's train split)")
    _option(bo, "--best-of-c", OnlineBenchConfig, "best_of_c",
            "real part: the nearest rewarded cases the best_of_c upper bound scores per task", type=int)
    bo.add_argument("--resume", action="store_true",
                    help="real part: keep the finished runs in --workdir (resume unfinished ones) instead of "
                         "refusing a non-empty run directory; lets policies be added to a benchmark later")
    bo.add_argument("--no-ope", dest="ope", action="store_false",
                    help="real part: skip the off-policy estimates (memento evaluate, from each seed's soft_q log) of "
                         "the greedy learned selector and of similarity next to the measured figures")
    _option(bo, "--ope-bootstrap", OnlineBenchConfig, "ope_bootstrap",
            "real part: bootstrap resamples of the off-policy estimates' intervals (0: none)", type=int)
    bo.add_argument("--json", required=True, metavar="OUT", help="results file")

    add_bench_games_parser(bench_cmds)
    add_bench_stream_parser(bench_cmds)

    bsv = bench_cmds.add_parser(
        "serve", help="memento serve over HTTP at a large bank: select p50/p99 and throughput at 1 and 16 clients "
                      "(and their ratio), feedback/s",
        description="Build (or reuse, --artifact) an exported selector over a bank of --size random unit vectors "
                    "(the real encoder's dim, recorded in the bank; a fresh Q-network), start a real "
                    "`memento serve` on 127.0.0.1 and time from client threads, over HTTP: POST /v1/select by "
                    "embedding and by text (encoded by the server's real encoder) with each --clients count, "
                    "and POST /v1/feedback throughput, recording only and (unless --no-learn) with --learn. "
                    "Needs the 'serve' extra.")
    bsv.add_argument("--size", type=int, default=100_000, help="cases in the bank (default: 100000)")
    bsv.add_argument("--factory", default="HNSW32,Flat", help='faiss index of the bank (default: "HNSW32,Flat")')
    bsv.add_argument("--data", choices=["clustered", "uniform"], default="clustered",
                     help="clustered vectors like real embeddings (default), or uniform on the sphere")
    bsv.add_argument("--k", type=int, default=4, help="cases per select (default: 4)")
    bsv.add_argument("--clients", type=int, nargs="+", default=[1, 16],
                     help="concurrent client threads (default: 1 16)")
    bsv.add_argument("--selects", type=int, default=1000, help="timed selects by embedding per client count "
                                                               "(default: 1000)")
    bsv.add_argument("--text-selects", type=int, default=200,
                     help="timed selects by text per client count (default: 200; 0 skips)")
    bsv.add_argument("--feedbacks", type=int, default=1000, help="timed feedbacks per client count (default: 1000)")
    bsv.add_argument("--no-learn", action="store_true", help="skip the run with a learning server (--learn)")
    bsv.add_argument("--threads", type=int, default=1, help="the server's --threads (default: 1)")
    bsv.add_argument("--batch-max-texts", type=int, default=None, metavar="N",
                     help="the server's --batch-max-texts (default: the server's default)")
    bsv.add_argument("--batch-wait-ms", type=float, default=None, metavar="MS",
                     help="the server's --batch-wait-ms (default: the server's default)")
    bsv.add_argument("--warmup", type=int, default=20, help="untimed requests before each phase (default: 20)")
    bsv.add_argument("--workers", type=int, nargs="+", default=[1], metavar="N",
                     help="the server's --workers, one run of the select and feedback phases per value, recorded "
                          "side by side (default: 1), e.g. --workers 1 2")
    bsv.add_argument("--seed", type=int, default=0)
    bsv.add_argument("--artifact", metavar="DIR", default=None,
                     help="reuse the selector here, or build it here and keep it (default: a temporary one)")
    bsv.add_argument("--workdir", default=None, help="where temporary files go (default: system temp)")
    bsv.add_argument("--json", required=True, metavar="OUT", help="results file")
    _add_demo_parser(commands)
    _add_online_parser(commands)
    add_play_parser(commands)
    add_evaluate_parser(commands)
    _add_export_parsers(commands)
    _add_serve_parsers(commands)
    _add_inspect_parser(commands)
    _add_score_parser(commands)
    from training.simcse_cli import add_parser as add_train_encoder_parser  # argparse only: no torch, no Lightning

    add_train_encoder_parser(commands)
    from training.cli import add_train_parser  # argparse only: Lightning is imported when a run starts

    add_train_parser(commands)
    return parser


_ONLINE_DESCRIPTION = """\
Run the online continual-learning loop (Memento's Algorithm 1): for each task, choose K cases
from the bank with a policy, let the frozen planner answer with them, judge the answer, retain
(question, answer, reward) in the bank, and learn. Each policy runs on the same task stream (same
seed, same order) from a copy of the same seed bank, in OUT/<policy>/; then OUT/comparison.json and
OUT/learning_curves.png are written and a table is printed.

planners:
  gemma              Gemma 3 270M (the bundled GGUF, converted once to a cached transformers model)
  hf:PATH            any local transformers causal-LM directory, or a Hub id (org/name[@revision]) from the
                     local Hugging Face cache (downloaded when online)
  openai:MODEL@URL   an OpenAI-compatible server (vLLM, Ollama, llama.cpp server, OpenAI)

Interrupted runs continue with --resume (from each policy's last checkpoint; the result equals an
uninterrupted run with the same seed on the CPU)."""


_DEMO_DESCRIPTION = """\
The main job on its embedded defaults (what `make demo` runs): the online loop on the realistic
facts-real suite (data/facts-real: test split, its seed case bank, whose stored rewards are each case's
own outcome under a lenient judge, so misleading-format demonstrations carry reward 1) with the real
Gemma 3 270M planner and the exact-match judge; retained cases are stored with their own lenient
outcome (--retain-judge contains), as the seed bank's are. Two policies on the same task stream, both
choosing among the cases with reward > 0:

  soft_q      the learned selector, STARTING FROM the selector shipped in data/facts-real/selector/:
              pre-trained offline on planner-scored labels of the facts-real TRAIN split (memento score
              + memento train --from-labels --anchor cosine --features case; the test split was never
              scored), then learning online from the rewards;
  similarity  Memento's non-parametric retrieval: the K nearest rewarded cases.

It prints a table (success rate early vs late, LLM calls, ms per step) and leaves, under --out, one
directory per policy (TensorBoard events in tb/, summary.json, steps.jsonl, the trained selector in
soft_q/selector/), comparison.json and learning_curves.png. Running it again continues or re-reports
the same run (--fresh starts over); --from-scratch starts soft_q from a fresh (similarity-anchored)
Q-network instead. Any option of `memento online` can be changed with `memento online`."""

DEMO_SELECTOR = "selector"
"""The pre-trained selector's directory inside the facts-real suite (data/facts-real/selector/)."""


def _add_demo_parser(commands: Any) -> None:
    demo = commands.add_parser("demo", help="the main job on its defaults: soft-Q vs similarity with Gemma",
                               description=_DEMO_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    demo.add_argument("--steps", type=int, default=250, help="tasks (LLM calls) per policy (default: 250)")
    demo.add_argument("--out", default="checkpoints/demo", metavar="DIR", help="output (default: checkpoints/demo)")
    demo.add_argument("--planner", default="gemma", metavar="SPEC", help="planner spec (default: gemma)")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--fresh", action="store_true", help="delete --out first and start over")
    demo.add_argument("--from-scratch", action="store_true",
                      help="soft_q starts from a fresh Q-network, not from the shipped pre-trained selector")


def _cmd_demo(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    import shutil

    suite = suite_dir("facts-real")
    out = Path(args.out)
    if args.fresh and out.exists():
        shutil.rmtree(out)
    argv = ["online", "--tasks", str(suite / "test.jsonl"), "--cases", str(suite / "cases.jsonl"),
            "--planner", args.planner, "--policy", "soft_q,similarity", "--judge", "exact",
            "--retain-judge", "contains", "--soft-q-candidates", "positive",
            "--steps", str(args.steps), "--seed", str(args.seed), "--out", str(out), "--torch-threads", "1",
            "--late-steps", str(min(200, max(1, args.steps // 2)))]
    if not args.from_scratch:
        selector = suite / DEMO_SELECTOR
        argv += ["--init-qnet", str(selector)]
        print(f"soft_q starts from the selector pre-trained on planner-scored labels of facts-real/train "
              f"({selector}; see its README.md); similarity is positive-only cosine retrieval. "
              f"Test split, {args.steps} tasks per policy.")
    else:
        print(f"soft_q starts from a fresh similarity-anchored Q-network with case features; "
              f"test split, {args.steps} tasks per policy.")
    if out.exists() and any(out.iterdir()):
        argv.append("--resume")
        print(f"continuing the demo run in {out} (use --fresh to start over)")
    return _cmd_online(parser.parse_args(argv))


def _option(parser: Any, flag: str, cls: type, field: str, help: str, **kwargs: Any) -> None:
    """``--flag`` for ``cls.field``: no argparse default (an unset flag keeps the dataclass's), and the help
    shows the dataclass's default, so every default is written once, in the config."""
    default = field_default(cls, field)
    shown = kwargs.pop("shown", default)
    parser.add_argument(flag, default=None, dest=kwargs.pop("dest", field), help=f"{help} (default: {shown})",
                        **kwargs)


_ONLINE_SOFT_Q = loop_policy("soft_q")
"""The soft_q config `memento online` starts from (the loop's default; flags override its fields)."""
_LOOP_FLAGS = ("steps", "k", "candidates", "batch_size", "checkpoint_every", "window", "seed", "index", "credit")
_SOFT_Q_FLAGS = ("alpha", "warmup", "init_qnet", "updates_per_step")


def _loop_config(args: argparse.Namespace, **fixed: Any) -> LoopConfig:
    """The LoopConfig the flags describe (unset flags keep LoopConfig's defaults)."""
    given = {name: getattr(args, name) for name in _LOOP_FLAGS if getattr(args, name, None) is not None}
    return LoopConfig(**{**given, **fixed})


def _soft_q_config(args: argparse.Namespace) -> SoftQConfig:
    """The SoftQConfig the soft-Q flags describe (unset flags keep SoftQConfig's defaults)."""
    given: dict[str, Any] = {name: getattr(args, name) for name in _SOFT_Q_FLAGS if getattr(args, name) is not None}
    if args.soft_q_candidates is not None:
        given["positive_only"] = args.soft_q_candidates == "positive"
    config = dataclasses.replace(_ONLINE_SOFT_Q, **given)
    if args.anchor is not None:
        config = dataclasses.replace(config, qnet=dataclasses.replace(config.qnet, anchor=args.anchor))
    if args.features is not None:
        config = dataclasses.replace(config, qnet=dataclasses.replace(config.qnet, features=args.features))
    if args.relation_rank is not None:
        config = dataclasses.replace(config, qnet=dataclasses.replace(config.qnet, relation_rank=args.relation_rank))
    labels = {name: getattr(args, f"labels_{name}") for name in ("m", "every", "target")
              if getattr(args, f"labels_{name}", None) is not None}
    if labels:
        config = dataclasses.replace(config, labels=dataclasses.replace(config.labels, **labels))
    return config


def _add_online_parser(commands: Any) -> None:
    online = commands.add_parser("online", help="run the online learning loop for one or more policies",
                                 description=_ONLINE_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    online.add_argument("--tasks", required=True, metavar="FILE", help="Task JSONL {id, question, answers, ...}")
    seed = online.add_mutually_exclusive_group()
    seed.add_argument("--cases", metavar="FILE", default=None, help="seed cases for the bank (JSONL)")
    seed.add_argument("--bank", metavar="BANK", default=None,
                      help="a seed bank to copy into the run (a directory or milvus:URI[#collection]; instead of "
                           "--cases)")

    online.add_argument("--cases-format", choices=list(get_args(CaseFormat)), default="case",
                        help="format of --cases (default: case)")
    online.add_argument("--planner", required=True, metavar="SPEC", help=_PLANNER_SPECS)
    online.add_argument("--policy", default="soft_q,similarity", metavar="P[,P...]",
                        help=f"comma-separated policies: {', '.join(get_args(PolicyKind))} "
                             "(default: soft_q,similarity)")
    online.add_argument("--judge", choices=["exact", "f1", "contains", "numeric"], default="exact",
                        help="how an answer is scored: the reward the policy learns from (default: exact)")
    online.add_argument("--retain-judge", choices=["exact", "f1", "contains", "numeric"], default=None,
                        help="how a retained case's stored reward is judged (default: as --judge); a lenient judge "
                             "(contains, f1) stores each case's own outcome as a real bank does (facts-real)")
    _option(online, "--steps", LoopConfig, "steps", "tasks (LLM calls) per policy", type=int)
    _option(online, "--k", LoopConfig, "k", "cases shown per task", type=int)
    _option(online, "--candidates", LoopConfig, "candidates", "candidate set size C", type=int)
    _option(online, "--batch-size", LoopConfig, "batch_size",
            "tasks selected with the same policy parameters and planned together", type=int)
    _option(online, "--checkpoint-every", LoopConfig, "checkpoint_every",
            "steps between checkpoints; 0: only at the end", type=int)
    _option(online, "--window", LoopConfig, "window", "steps per success-rate window", type=int)
    online.add_argument("--late-steps", type=int, default=200,
                        help="the last steps that make the 'late' success rate (default: 200)")
    _option(online, "--alpha", SoftQConfig, "alpha", "soft-Q temperature", type=float,
            shown=field_default(SoftQConfig, "learner").alpha)
    _option(online, "--warmup", SoftQConfig, "warmup", "decisions before the first soft-Q update", type=int)
    _option(online, "--updates-per-step", SoftQConfig, "updates_per_step",
            "soft-Q gradient steps per decision after warm-up (0: the Q-network is not updated online, e.g. a "
            "selector pre-trained with --init-qnet used as it is)", type=int)
    _option(online, "--soft-q-candidates", SoftQConfig, "positive_only",
            "the candidates soft_q chooses from: all C, or only those with stored reward > 0 (the pool of "
            "similarity's positive-only retrieval; all when none is)", choices=["all", "positive"],
            dest="soft_q_candidates", shown="positive" if _ONLINE_SOFT_Q.positive_only else "all")
    _option(online, "--anchor", QNetConfig, "anchor",
            "soft_q's Q-network: none, or cosine (Q = a*cos + b + a residual that starts at 0, so a fresh selector "
            "ranks like similarity)", choices=list(get_args(QNetAnchor)), shown=_ONLINE_SOFT_Q.qnet.anchor)
    _option(online, "--features", QNetConfig, "features",
            "soft_q's Q-network: none (a case is its question's embedding), or case (also its answer's embedding, "
            "stored reward, usage statistics from the bank, and kind)", choices=list(get_args(QNetFeatures)),
            shown=_ONLINE_SOFT_Q.qnet.features)
    _option(online, "--relation-rank", QNetConfig, "relation_rank",
            "soft_q's Q-network: the rank of a bilinear term (U s).(V c) between the question and a case's "
            "question (0: none; it starts at 0, so a fresh selector still ranks like similarity)", type=int,
            shown=_ONLINE_SOFT_Q.qnet.relation_rank)
    _option(online, "--labels", OnlineLabelsConfig, "m",
            "per-candidate planner labels online: after each task, score soft_q's top-M candidates each alone (the "
            "likelihood of --labels-target) and learn from them with the listwise loss of `memento train "
            "--from-labels` beside the reward; M forward passes per labelled task, written to labels.jsonl; "
            "needs a planner that gives log-probabilities; 0: off", type=int, dest="labels_m",
            shown=_ONLINE_SOFT_Q.labels.m)
    _option(online, "--labels-every", OnlineLabelsConfig, "every", "label every N-th task only", type=int,
            dest="labels_every")
    _option(online, "--labels-target", OnlineLabelsConfig, "target",
            "what the labels score: gold (the task's gold answer; the planner's own output when the judge rewarded "
            "it where a task has none) or hindsight (only the rewarded outputs: no gold answer used)",
            choices=list(get_args(LabelTarget)), dest="labels_target")
    _option(online, "--credit", LoopConfig, "credit",
            "how a task's reward reaches the K shown cases: shared (each gets it), or leave_one_out (the planner "
            "scores the gold answer with each case left out: K + 1 forward passes; needs a scoring planner)",
            choices=list(get_args(Credit)))
    online.add_argument("--init-qnet", metavar="DIR", default=None,
                        help="soft_q starts from this trained Q-network (a `memento train` run directory or its "
                             "selector/ subdirectory) instead of a fresh one")
    _option(online, "--seed", LoopConfig, "seed", "seed of every random stream of the run", type=int)
    group = online.add_argument_group("memory systems (CFGM, LifeMem; a question's environment is its family)")
    add_systems_flags(group, games=False)
    online.add_argument("--out", required=True, metavar="DIR", help="output directory")
    online.add_argument("--resume", action="store_true", help="continue the runs in --out from their checkpoints")
    online.add_argument("--device", choices=["cpu", "cuda", "auto"], default="cpu",
                        help="where the Q-network learns (default: cpu; exact resume holds on the CPU)")
    online.add_argument("--torch-threads", type=int, default=0,
                        help="torch.set_num_threads for this process (default: 0, torch's default)")
    online.add_argument("--no-progress", action="store_true",
                        help="no progress bar (there is none either when stderr is not a terminal)")
    group = online.add_argument_group("rollout workers (Ray; the 'ray' extra)")
    group.add_argument("--workers", type=int, default=1, metavar="N",
                       help="N > 1: N Ray actors, each with its own planner and judge, select (with a snapshot of the "
                            "policy), plan and judge; this process keeps the bank, the learner and the logs "
                            "(default: 1, everything in this process)")
    group.add_argument("--ray-address", default=None, metavar="ADDR",
                       help="join this Ray cluster (e.g. auto, ray://HOST:10001; default: start a local Ray)")
    _option(group, "--sync-every", WorkersConfig, "sync_every",
            "learner updates between two policy snapshots sent to the workers", type=int)
    group = online.add_argument_group("encoder")
    group.add_argument("--encoder", metavar="PATH", default=None,
                       help="local transformers encoder directory (default: bundled all-MiniLM-L6-v2)")
    group.add_argument("--pooling", choices=["avg", "cls", "cls_before_pooler"], default=None,
                       help="SimCSE pooling (default: the one a fine-tuned --encoder records, else avg)")
    _option(group, "--max-length", EncoderConfig, "max_length", "token limit per text", type=int)
    _option(group, "--index", LoopConfig, "index", "faiss factory of the bank made from --cases")


def _workers_config(args: argparse.Namespace) -> WorkersConfig | None:
    """The rollout workers ``--workers N`` (N > 1) asks for, checked (and Ray found) before anything loads; ``None``
    for the in-process loop."""
    if args.workers < 1:
        raise ConfigError(f"--workers={args.workers}: must be >= 1")
    if args.workers == 1:
        for flag, value in (("--ray-address", args.ray_address), ("--sync-every", args.sync_every)):
            if value is not None:
                raise ConfigError(f"{flag} is for rollout workers: add --workers N with N >= 2")
        return None
    from memento.runs.ray import WORKER_KINDS, import_ray

    kinds = [p.strip() for p in args.policy.split(",") if p.strip()]
    refused = [kind for kind in kinds if kind not in WORKER_KINDS]
    if refused:
        raise ConfigError(f"--workers {args.workers}: policy {refused[0]!r} runs in-process only (workers run "
                          f"{', '.join(WORKER_KINDS)}); use --workers 1 for it")
    import_ray()
    given = {"sync_every": args.sync_every} if args.sync_every is not None else {}
    return WorkersConfig(workers=args.workers, address=args.ray_address, **given)


def _cmd_online(args: argparse.Namespace) -> int:
    # everything cheap is checked before a model is loaded or a file written
    policies = [p.strip() for p in args.policy.split(",") if p.strip()]
    known = get_args(PolicyKind)
    unknown = [p for p in policies if p not in known]
    if not policies or unknown:
        raise ConfigError(f"--policy {args.policy!r}: unknown policy {unknown[0] if unknown else ''!r}; "
                          f"choose from {', '.join(known)}")
    if len(set(policies)) != len(policies):
        raise ConfigError(f"--policy {args.policy!r}: a policy is listed twice")
    spec = parse_planner_spec(args.planner)
    check_planner_spec(spec)
    if args.torch_threads < 0:
        raise ConfigError(f"--torch-threads={args.torch_threads}: must be >= 0")
    tasks = read_tasks_jsonl(args.tasks)
    if not tasks:
        raise DataFormatError("no tasks in the file", path=args.tasks)
    seed_cases = read_case_file(args.cases, args.cases_format) if args.cases else None
    if args.bank is not None:
        check_seed_bank(args.bank)  # read whole: a damaged bank fails before --out is made
    soft_q = _soft_q_config(args)
    configs = [soft_q if kind == "soft_q" else loop_policy(kind) for kind in policies]  # type: ignore[arg-type]
    config = _loop_config(args, policy=configs[0])
    systems = systems_from_args(args, config.systems)
    if systems is not None:
        config = dataclasses.replace(config, systems=systems)
    if args.late_steps < 1:
        raise ConfigError(f"--late-steps={args.late_steps}: must be >= 1")
    workers = _workers_config(args)
    out = Path(args.out)
    if not args.resume:
        used = [p for p in policies if (out / p).is_dir() and any((out / p).iterdir())]
        if used:
            raise ConfigError(f"{out / used[0]}: already holds a run; pass --resume or choose another --out")
    if args.torch_threads:
        import torch

        torch.set_num_threads(args.torch_threads)  # process-wide, on purpose: the library never does this
    device = args.device
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        from memento.judges import make_judge
    except ImportError as error:
        raise ConfigError(f"--judge {args.judge}: judges are not available ({error})") from None
    judge = make_judge(args.judge)
    retain_judge = None if args.retain_judge is None else make_judge(args.retain_judge)
    encoder = _load_encoder(_encoder_config(args))
    common: dict[str, Any] = dict(make_policy=make_policy, encoder=encoder, judge=judge, tasks=tasks,
                                  seed_cases=seed_cases, bank_dir=args.bank, device=device, resume=args.resume,
                                  retain_judge=retain_judge, progress=not args.no_progress and sys.stderr.isatty())
    if workers is not None:  # each worker builds its own planner from the spec; the driver loads none
        from memento.runs.ray import ray_runtime, worker_loop_class

        with ray_runtime(workers):
            comparison = run_comparison(configs, config=config, out_dir=out, late_steps=args.late_steps,
                                        loop_class=worker_loop_class(workers, spec), **common)
    else:
        try:
            planner = build_planner(spec)
        except ImportError as error:
            raise PlannerError(f"planner {spec}: not available ({error})") from None
        if any(isinstance(c, SoftQConfig) and c.labels.active for c in configs):
            _check_label_scoring(planner, tasks)  # before --out is written: one line, exit 2
        comparison = run_comparison(configs, config=config, out_dir=out, late_steps=args.late_steps,
                                    planner=planner, **common)
    print(comparison_table(comparison))
    print(f"results in {out} (comparison.json, learning_curves.png, <policy>/summary.json)")
    return EXIT_OK


def _check_label_scoring(planner: Any, tasks: list[Any]) -> None:
    """``--labels``: the planner must give log-probabilities; one scored prompt (the first task with an answer,
    no case) finds out before anything is written (a server without echo/logprobs answers a PlannerError)."""
    from memento.planners.base import can_score

    if not can_score(planner):
        raise ConfigError(f"--labels needs a planner that gives log-probabilities; {planner!r} cannot score")
    task = next((t for t in tasks if t.answers), None)
    if task is not None:
        try:
            planner.score_many([task], [[[]]])
        except PlannerError as error:
            raise PlannerError(f"--labels needs a planner that gives log-probabilities: {_one_line(error)}") from None


_EXPORT_DESCRIPTION = """\
Export the selector a soft-Q run trained as a self-describing directory that any Python process can
load (memento.load_selector), `memento serve` serves over HTTP and `memento mcp` as MCP tools.

SRC is a run directory (e.g. checkpoints/demo/soft_q), a comparison directory holding a soft_q run
(e.g. checkpoints/demo, what `make demo` writes), one checkpoint directory of a run, or an exported
selector (copied with a fresh manifest). From a run, its newest complete checkpoint gives the
Q-network, learner and replay state, and the case bank is copied as it was at that checkpoint.

OUT gets: manifest.json (format version, library versions, sha256 of every file, the source run),
config.json (selector, Q-network, learner, replay and index configs; the run's full config),
encoder.json, qnet.safetensors, learner/, replay/, bank/ (cases.sqlite + index.faiss),
feedback.sqlite (empty) and a README.md model card with the run's success rates.
OUT is assembled beside itself and renamed into place when complete.

With --bank BANK, SRC is instead a selector trained offline (a `memento train` run directory or its
selector/ subdirectory): OUT pairs its Q-network and learner settings with a copy of the case bank
BANK (a bank directory, e.g. RUN/bank of the online run whose log it was trained on); the replay
buffer starts empty."""

_VERIFY_DESCRIPTION = """\
Check an exported selector without loading it: every file against the sha256 and size in its
manifest, the format versions, and that the encoder, bank, Q-network and replay buffer agree on the
embedding dimension. Cases and feedback appended since the last save are accepted when the saved
rows are intact. Prints a summary (or JSON); a damaged artifact prints one line naming the file and
exits 2."""


def _add_export_parsers(commands: Any) -> None:
    export = commands.add_parser("export", help="export a trained soft-Q selector as a directory (see serve, mcp)",
                                 description=_EXPORT_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    export.add_argument("source", metavar="SRC", help="run, comparison or checkpoint directory (or a selector)")
    export.add_argument("out", metavar="OUT", help="the selector directory to write")
    export.add_argument("--force", action="store_true",
                        help="replace OUT if it is already an exported selector (anything else is never replaced)")
    export.add_argument("--bank", metavar="BANK", default=None,
                        help="SRC is an offline-trained selector (memento train); serve it over this case bank, a "
                             "directory or milvus:URI[#collection] (copied into OUT's own directory bank)")
    export.add_argument("--connect-timeout", type=float, default=None, metavar="S",
                        help="with a milvus:http://... --bank: give up on the server after S seconds (default: 5)")
    export.add_argument("--k", type=int, default=4, help="with --bank: cases shown per task (default: 4)")
    export.add_argument("--candidates", type=int, default=32,
                        help="with --bank: the cosine pre-selection the policy chooses from (default: 32)")
    verify = commands.add_parser("verify", help="check an exported selector's checksums and dimensions",
                                 description=_VERIFY_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    verify.add_argument("dir", metavar="DIR", help="the exported selector directory")
    verify.add_argument("--json", action="store_true", help="print the report (with the manifest) as JSON")


def _cmd_export(args: argparse.Namespace) -> int:
    src = Path(args.source)
    if args.bank is not None:
        out = create_selector(args.bank, args.out, trained=src, k=args.k, candidates=args.candidates,
                              overwrite=args.force, bank_options=_bank_options(args))
    elif (src / "selector" / "learner.json").is_file() and not (src / "bank").is_dir():
        raise ConfigError(f"{src}: an offline-trained selector (memento train) has no case bank of its own; "
                          "pass --bank BANK (a directory or milvus:URI)")
    else:
        out = export_selector(args.source, args.out, overwrite=args.force)
    report = verify(out)
    manifest = report["manifest"]
    source = manifest.get("source") or {}
    summary = source.get("summary") or {}
    trained = (f"trained {source.get('step')} step(s), success rate {summary['success_rate']:.3f}"
               if summary.get("success_rate") is not None else "")
    print(f"exported {args.source} -> {out}: {report['cases']} case(s), dim {report['dim']}, "
          f"{manifest.get('learner_updates')} learner update(s)" + (f"; {trained}" if trained else ""))
    print(f"load it:   python -c \"import memento; print(memento.load_selector({str(out)!r}).select('...', k=4))\"")
    print(f"serve it:  memento serve {out}    (or: memento mcp {out})")
    return EXIT_OK


def _cmd_verify(args: argparse.Namespace) -> int:
    report = verify(args.dir)
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
        return EXIT_OK
    manifest = report["manifest"]
    print(f"{args.dir}: ok ({report['files']} files match the manifest; format {manifest['format']} "
          f"v{manifest['format_version']}, dim {report['dim']})")
    print(f"  {report['cases']} case(s), {report['feedbacks']} feedback(s); since the last save "
          f"({manifest.get('saved')}): +{report['cases_since_save']} case(s), "
          f"+{report['feedbacks_since_save']} feedback(s)")
    return EXIT_OK


_SERVE_DESCRIPTION = """\
Serve an exported selector (a directory written by `memento export`) over HTTP with FastAPI and
uvicorn. Needs the 'serve' extra: pip install 'memento-mdp[serve]'.

endpoints (JSON; every /v1 endpoint needs the header 'Authorization: Bearer TOKEN'):
  POST /v1/select     {"query": TEXT | "embedding": [floats], "k": 4, "mode": "sample"|"greedy", "env": null}
                      -> {"selection_id", "cases": [{"id", "state", "action", "reward", "prob"}, ...], ...}
  POST /v1/feedback   {"selection_id": ID, "reward": 0..1}  (answered once committed to disk)
  POST /v1/cases      {"state", "action", "reward", "env"?, "meta"?} -> {"id"}  (answered once committed)
  GET  /v1/cases/ID   GET /v1/stats   GET /healthz (no auth)   GET /openapi.json (the spec, no auth)
Invalid requests get 422 naming the field; bodies over --max-body-bytes get 413.

auth: the bearer token is read from --token-file FILE, else from the environment variable
MEMENTO_SERVE_TOKEN (at least 16 characters, e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))').
--no-auth serves without a token and is refused unless --host is a loopback address.

Selects run in parallel; one writer thread records feedback and new cases (and, with --learn, makes
the learner's updates), alone while it writes. Query texts of concurrent selects are encoded together
in one forward pass (--batch-max-texts, --batch-wait-ms). The artifact is checkpointed atomically
every --save-every-s seconds or --save-every-n writes.
--workers N runs N processes on the one port: this one (the learner: writes, learning, checkpoints)
and N-1 read-only workers that answer selects and reads and forward feedback and new cases to it;
the learner publishes its Q-network to them at most every --publish-every-s seconds.
SIGTERM or Ctrl-C stops accepting connections, finishes the requests in flight, drains the writes,
saves, and exits 0. Once listening, one line 'memento serve: DIR on http://HOST:PORT ...' is printed."""

_MCP_DESCRIPTION = """\
Serve an exported selector (a directory written by `memento export`) as MCP tools over stdio, for
agent frameworks that speak the Model Context Protocol. Needs the 'mcp' extra: pip install 'memento-mdp[mcp]'.

tools:
  select_cases(task, k=4)              choose k past cases for the task -> {selection_id, cases: [...]}
  record_outcome(selection_id, reward) the reward in [0, 1] of the task solved with them (committed when answered)
  add_case(state, action, reward)      store a new case -> {id}

client configuration, e.g.:
  {"mcpServers": {"memento": {"command": "memento", "args": ["mcp", "/path/to/selector"]}}}
The server runs until the client closes stdin; then pending writes are drained and the artifact saved."""


def _add_serve_parsers(commands: Any) -> None:
    serve = commands.add_parser("serve", help="serve an exported selector over HTTP (FastAPI + uvicorn)",
                                description=_SERVE_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    serve.add_argument("dir", metavar="DIR", help="the exported selector directory (memento export)")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, loopback)")
    serve.add_argument("--port", type=int, default=8080, help="port (default: 8080; 0 picks a free port)")
    auth = serve.add_mutually_exclusive_group()
    auth.add_argument("--token-file", metavar="FILE", default=None,
                      help="file holding the bearer token (default: the MEMENTO_SERVE_TOKEN environment variable)")
    auth.add_argument("--no-auth", action="store_true",
                      help="serve without a token (only allowed when --host is loopback)")
    serve.add_argument("--learn", action="store_true",
                       help="keep learning from feedback (soft-Q updates in the writer thread); "
                            "default: record feedback only")
    serve.add_argument("--save-every-s", type=float, default=60.0, metavar="S",
                       help="checkpoint when S seconds passed since the last one and something changed "
                            "(default: 60; 0: off)")
    serve.add_argument("--save-every-n", type=int, default=1000, metavar="N",
                       help="checkpoint after N writes (feedback + cases) (default: 1000; 0: off)")
    serve.add_argument("--device", default=None, metavar="D",
                       help="torch device of the Q-network and encoder, e.g. cpu, cuda, cuda:1 (default: cpu)")
    serve.add_argument("--max-body-bytes", type=int, default=1 << 20, metavar="B",
                       help="largest request body accepted; larger ones get 413 (default: 1048576)")
    serve.add_argument("--seed", type=int, default=0, help="seed of the sampling RNG (default: 0)")
    serve.add_argument("--threads", type=int, default=1, metavar="N",
                       help="torch threads (torch.set_num_threads) and faiss OpenMP threads per request thread "
                            "(default: 1: a request scores a few dozen candidates, and idle threads of concurrent "
                            "requests spin against each other; 0: the libraries' defaults)")
    serve.add_argument("--batch-max-texts", type=int, default=32, metavar="N",
                       help="dynamic batching of text encoding: concurrent query texts are encoded together, up "
                            "to N in one forward pass (default: 32; 0: off, each request encodes its own text, "
                            "one at a time)")
    serve.add_argument("--batch-wait-ms", type=float, default=2.0, metavar="MS",
                       help="how long the first text of a batch waits for others, in ms (default: 2; 0: only "
                            "the texts already queued; under load the queue fills while a batch runs)")
    serve.add_argument("--workers", type=int, default=1, metavar="N",
                       help="server processes accepting on the port: this one, which records feedback and new "
                            "cases, learns and saves, and N-1 read-only workers that answer selects and reads "
                            "and forward writes to it (default: 1; each worker loads its own copy of the "
                            "bank's vectors, index and encoder)")
    serve.add_argument("--publish-every-s", type=float, default=1.0, metavar="S",
                       help="with --workers > 1: publish the learner's Q-network to the workers at most every S "
                            "seconds after it changed, and at every checkpoint (default: 1; 0: after every "
                            "update)")

    mcp = commands.add_parser("mcp", help="serve an exported selector as MCP tools over stdio",
                              description=_MCP_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    mcp.add_argument("dir", metavar="DIR", help="the exported selector directory (memento export)")
    mcp.add_argument("--learn", action="store_true", help="keep learning from record_outcome (default: record only)")
    mcp.add_argument("--save-every-n", type=int, default=100, metavar="N",
                     help="checkpoint after N writes (default: 100; 0: only at exit)")
    mcp.add_argument("--device", default=None, metavar="D", help="torch device, e.g. cpu or cuda (default: cpu)")
    mcp.add_argument("--seed", type=int, default=0, help="seed of the sampling RNG (default: 0)")


def _cmd_serve(args: argparse.Namespace) -> int:
    require_extra("serve")  # before anything is loaded: a missing extra is one line
    check_host(args.host, no_auth=args.no_auth)
    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port {args.port}: must be in [0, 65535]")
    token = resolve_token(token_file=args.token_file, no_auth=args.no_auth)
    if args.threads < 0:
        raise ConfigError(f"--threads={args.threads}: must be >= 0")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)  # process-wide, on purpose: the library never does this
    config = ServeConfig(save_every_s=args.save_every_s, save_every_n=args.save_every_n,
                         max_body_bytes=args.max_body_bytes, threads=args.threads,
                         batch_max_texts=args.batch_max_texts, batch_wait_ms=args.batch_wait_ms,
                         workers=args.workers, publish_every_s=args.publish_every_s)

    def ready(host: str, port: int) -> None:
        shown = f"[{host}]" if ":" in host else host
        workers = f"; workers: {args.workers}" if args.workers > 1 else ""
        print(f"memento serve: {args.dir} on http://{shown}:{port} (auth: {'bearer token' if token else 'none'}; "
              f"learn: {'on' if args.learn else 'off'}{workers}); SIGTERM or Ctrl-C saves and stops", flush=True)

    return serve(args.dir, host=args.host, port=args.port, token=token, no_auth=args.no_auth, learn=args.learn,
                 device=args.device, config=config, seed=args.seed,
                 log_level="info" if args.verbose else "warning", access_log=args.verbose >= 2, on_ready=ready)


def _add_inspect_parser(commands: Any) -> None:
    inspect = commands.add_parser(
        "inspect", help="browse a run or a selector in the browser: bank search, steps, learning curves",
        description="Serve HTML pages (no build step, no script) over a run directory (memento online), a "
                    "comparison or bench directory holding runs, or an exported selector: the bank (search by "
                    "text with the run's encoder, filters, a case's usage), each step (candidates, probabilities, "
                    "chosen cases, answer, reward) and the learning curves. Needs the 'serve' extra. `memento "
                    "serve` shows the same pages under /inspect.")
    inspect.add_argument("path", metavar="RUN_OR_ARTIFACT", help="a run, comparison or selector directory")
    inspect.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    inspect.add_argument("--port", type=int, default=8090, help="port (default: 8090; 0 picks a free port)")
    inspect.add_argument("--token-file", metavar="FILE", default=None,
                         help="require this bearer token (needed off loopback; default there: "
                              "$MEMENTO_SERVE_TOKEN); the browser gives it once as ?token= or in the login form")


def _cmd_inspect(args: argparse.Namespace) -> int:
    from memento.serve.app import is_loopback
    from memento.serve.inspector import serve_inspector

    require_extra("serve")
    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port {args.port}: must be in [0, 65535]")
    loopback = is_loopback(args.host)
    token = resolve_token(token_file=args.token_file) if args.token_file or not loopback else None

    def ready(host: str, port: int) -> None:
        shown = f"[{host}]" if ":" in host else host
        print(f"memento inspect: {args.path} on http://{shown}:{port}/ (auth: {'token' if token else 'none'}); "
              "Ctrl-C stops", flush=True)

    serve_inspector(args.path, host=args.host, port=args.port, token=token, ready=ready)
    return EXIT_OK


def _cmd_mcp(args: argparse.Namespace) -> int:
    require_extra("mcp")
    return run_mcp(args.dir, learn=args.learn, device=args.device, seed=args.seed,
                   config=ServeConfig(save_every_n=args.save_every_n, save_every_s=0))


_SCORE_DESCRIPTION = """\
Label training tasks with the frozen planner (DESIGN §2 "Credit and labels", EPR / LLM-R style): for each
task with a known answer, encode the question, take the bank's top --candidates cases by cosine, and score
the log-likelihood of the gold answer (answers[0]) with each candidate as the only demonstration (--k > 1:
also --sets random K-sets of them). Nothing is generated. Tasks without answers are skipped and counted.

The labels go to --out (JSONL, one self-describing row per task: task_id, state, answer, candidate_ids,
logprob, mean_logprob, n_tokens, cosine, prompt_tokens, sets / set_logprob when k > 1, planner, prompt)
and the cost (forward passes = scored prompts, wall time, seconds per scored candidate) to
<out stem>.summary.json beside it. A bank built from --cases (or a suite's seed cases) is kept in
--save-bank (default <out stem>.bank/): train from the labels with
  memento train --from-labels OUT --bank BANK --out RUN"""


def _add_score_parser(commands: Any) -> None:
    score = commands.add_parser("score", help="label tasks' candidate cases with the planner's answer likelihood",
                                description=_SCORE_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = score.add_mutually_exclusive_group(required=True)
    source.add_argument("--suite", metavar="NAME|DIR", default=None,
                        help="a shipped suite (facts, facts-real, arith-real, elements-real) or a suite directory")
    source.add_argument("--tasks", metavar="FILE", default=None, help="Task JSONL {id, question, answers, ...}")
    score.add_argument("--split", choices=["train", "test", "all"], default=None,
                       help="split of --suite (default: train)")
    bank = score.add_mutually_exclusive_group()
    bank.add_argument("--bank", metavar="BANK", default=None,
                      help="the case bank to take candidates from (a directory or milvus:URI[#collection])")
    bank.add_argument("--cases", metavar="FILE", default=None,
                      help="cases to build the bank from (default with --suite: the suite's seed cases)")
    score.add_argument("--cases-format", choices=list(get_args(CaseFormat)), default="case",
                       help="format of --cases (default: case)")
    score.add_argument("--save-bank", metavar="DIR", default=None,
                       help="where a bank built from --cases or the suite's seed cases goes "
                            "(default: <out stem>.bank next to --out)")
    _option(score, "--planner", LabelConfig, "planner", _PLANNER_SPECS, metavar="SPEC")
    _option(score, "--candidates", LabelConfig, "candidates", "cosine candidates C scored per task", type=int)
    _option(score, "--max-tasks", LabelConfig, "max_tasks", "score at most N tasks (the first with answers)",
            type=int, metavar="N", shown="all")
    _option(score, "--k", LabelConfig, "k", "1: single-case demonstrations; K > 1: also random K-sets", type=int)
    _option(score, "--sets", LabelConfig, "sets", "random K-sets scored per task when --k > 1", type=int)
    _option(score, "--seed", LabelConfig, "seed", "seed of the K-set draws", type=int)
    _option(score, "--batch-size", LabelConfig, "batch_size", "tasks per planner.score_many call", type=int)
    score.add_argument("--keep-self", action="store_true",
                       help="keep candidates whose state is the task's own question (default: left out)")
    score.add_argument("--out", required=True, metavar="FILE", help="the labels JSONL file (written atomically)")
    score.add_argument("--torch-threads", type=int, default=0,
                       help="torch.set_num_threads for this process (default: 0, torch's default)")
    score.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_encoder_options(score)


def _cmd_score(args: argparse.Namespace) -> int:
    import os
    import shutil

    from memento.envs.tasks import seed_cases

    # everything cheap is checked before a model is loaded or a file written
    given = {name: getattr(args, name) for name in ("planner", "candidates", "max_tasks", "k", "sets", "seed",
                                                     "batch_size") if getattr(args, name) is not None}
    config = LabelConfig(exclude_self=not args.keep_self, **given)
    spec = parse_planner_spec(config.planner)
    check_planner_spec(spec)
    if args.torch_threads < 0:
        raise ConfigError(f"--torch-threads={args.torch_threads}: must be >= 0")
    if args.tasks is not None and args.split is not None:
        raise ConfigError("--split goes with --suite (a --tasks file is one split)")
    if args.suite is None and args.bank is None and args.cases is None:
        raise ConfigError("no cases to choose from: give --bank DIR or --cases FILE "
                          "(or --suite NAME for its seed cases)")
    split = args.split or "train"
    if args.suite is not None:
        directory = suite_dir(args.suite)  # an unknown suite is one line
        files = [directory / f"{part}.jsonl" for part in (("train", "test") if split == "all" else (split,))]
    else:
        files = [Path(args.tasks)]
    tasks, skipped = [], 0
    for file in files:
        part, part_skipped = read_label_tasks(file)
        tasks.extend(part)
        skipped += part_skipped
    if not tasks:
        raise DataFormatError(f"no task with an answer to score ({skipped} task(s) without answers skipped)",
                              path=files[0] if len(files) == 1 else None)
    out = Path(args.out)
    if out.is_dir():
        raise ConfigError(f"--out {out}: is a directory; give the labels file to write")
    cases = None
    save_bank = None
    if args.bank is not None:
        open_bank(args.bank, read_only=True).close()  # fails early on a name that is not a bank
    else:
        cases = read_case_file(args.cases, args.cases_format) if args.cases else seed_cases(args.suite)
        if not cases:
            raise DataFormatError("no cases to build the bank from", path=args.cases)
        stem = out.name[:-len(".jsonl")] if out.name.endswith(".jsonl") else out.name
        save_bank = Path(args.save_bank) if args.save_bank else out.with_name(f"{stem}.bank")
        if save_bank.exists():
            raise ConfigError(f"--save-bank {save_bank}: already exists; pass --bank {save_bank} to reuse it, "
                              "or remove it")
    if args.torch_threads:
        import torch

        torch.set_num_threads(args.torch_threads)  # process-wide, on purpose: the library never does this

    if args.bank is not None:
        bank = open_bank(args.bank, read_only=True)
        recorded = bank.config.encoder
        encoder_config = _encoder_config(args) if args.encoder or recorded is None else recorded
        bank_dir = bank_name(args.bank)
    else:
        encoder_config = _encoder_config(args)
        bank = None
        bank_dir = save_bank
    try:
        encoder = _load_encoder(encoder_config)
        try:
            planner = build_planner(spec)
        except ImportError as error:
            raise PlannerError(f"planner {spec}: not available ({error})") from None
        if bank is None:
            assert cases is not None and save_bank is not None
            work = save_bank.with_name(f".{save_bank.name}.tmp-{os.getpid()}")
            shutil.rmtree(work, ignore_errors=True)
            try:
                with CaseBank.create(work, encoder.dim, index=args.index or field_default(IndexConfig, "factory"),
                                     encoder=encoder_config) as building:
                    vectors = encoder.encode([c.state for c in cases], normalize=True)
                    building.add(cases, vectors.reshape(len(cases), building.dim))
                os.replace(work, save_bank)
            finally:
                shutil.rmtree(work, ignore_errors=True)
            print(f"built bank {save_bank} from {len(cases)} case(s)"
                  f"{' of ' + str(args.cases) if args.cases else ' (the seed cases of ' + str(args.suite) + ')'}")
            bank = CaseBank.open(save_bank)
        if len(bank) == 0:
            raise DataFormatError("the bank holds no case to choose from", path=bank.path)
        meta = {"tasks_source": str(args.suite if args.suite is not None else args.tasks),
                "split": split if args.suite is not None else None, "skipped_no_answer": skipped,
                "tasks_read": len(tasks)}
        summary = label_tasks(tasks, bank, encoder, planner, config, out,
                              progress=not args.no_progress and sys.stderr.isatty(), meta=meta)
    finally:
        if bank is not None:
            bank.close()
    sets = f" + {summary['set_passes']} set(s)" if summary["set_passes"] else ""
    per = summary["s_per_forward"]
    print(f"scored {summary['rows']} task(s) x up to {config.candidates} candidate(s){sets}: "
          f"{summary['forward_passes']} forward pass(es) (scored prompts) in {summary['wall_s']:.1f} s wall, "
          f"{summary['score_s']:.1f} s scoring" + (f", {per:.3f} s per scored candidate" if per is not None else ""))
    print(f"skipped: {summary['skipped_no_answer']} task(s) without answers, {summary['skipped_no_candidates']} "
          f"without candidates; {summary['excluded_self']} candidate(s) that were the task's own question left out")
    print(f"planner {summary['planner']} (prompt {summary['prompt']})")
    print(f"labels in {out} ({summary['rows']} rows), cost in {summary_path(out)}")
    print(f"train on them: memento train --from-labels {out} --bank {bank_dir} --out RUN")
    return EXIT_OK


def _configure_logging(verbosity: int) -> None:
    level = logging.WARNING if verbosity == 0 else logging.INFO if verbosity == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)


def _load_encoder(config: Any) -> Any:
    """The encoder, without transformers' per-load progress bar (the CLI shows its own output)."""
    from transformers.utils import logging as hf_logging

    if logging.getLogger().level > logging.INFO:
        hf_logging.disable_progress_bar()
    return Encoder.from_config(config)


def _encoder_config(args: argparse.Namespace) -> Any:
    pooling = args.pooling or (saved_pooling(args.encoder) if args.encoder else None) or field_default(
        EncoderConfig, "pooling")
    given = {} if args.max_length is None else {"max_length": args.max_length}
    return EncoderConfig(model=args.encoder, pooling=pooling, **given)


def _backends(text: str) -> tuple[str, ...]:
    """``--backends dir,milvus``."""
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    if not names or any(name not in ("dir", "milvus") for name in names):
        raise argparse.ArgumentTypeError(f"{text!r}: a comma-separated list of dir, milvus")
    return names


def _bank_options(args: argparse.Namespace) -> Any:
    timeout = getattr(args, "connect_timeout", None)
    return MilvusOptions() if timeout is None else MilvusOptions(connect_timeout_s=timeout)


def _create_bank(args: argparse.Namespace, dim: int | None = None) -> Any:
    where = parse_bank_uri(args.bank)  # a malformed or unknown bank name: one line, before the encoder loads
    if dim is not None:
        return create_bank(where, dim, index=args.index or field_default(IndexConfig, "factory"),
                           options=_bank_options(args)), None
    config = _encoder_config(args)
    encoder = _load_encoder(config)
    return create_bank(where, encoder.dim, index=args.index or field_default(IndexConfig, "factory"),
                       encoder=config, options=_bank_options(args)), encoder


def _bank_encoder(bank: Any) -> Any:
    if bank.config.encoder is None:
        raise EncoderError(f"{bank.path}: this bank records no encoder (created with --dim); "
                           "it can only be searched with vectors from Python")
    encoder = _load_encoder(bank.config.encoder)
    if encoder.dim != bank.dim:
        raise DimensionError(f"encoder {encoder.model_id} gives dim={encoder.dim}, "
                             f"bank {bank.path} holds dim={bank.dim}")
    return encoder


def _cmd_bank(args: argparse.Namespace) -> int:
    if args.bank_command == "create":
        bank, _ = _create_bank(args, args.dim)
        with bank:
            print(f"created {bank.path} (dim={bank.dim}, index={bank.config.index.factory})")
        return EXIT_OK

    if args.bank_command == "copy":
        n = copy_bank(args.bank, args.dst, index=args.index, options=_bank_options(args))
        print(f"copied {n} case(s) from {args.bank} to {args.dst}")
        return EXIT_OK

    if args.bank_command == "import":
        cases = read_case_file(args.file, args.format)  # validate the whole file before creating anything
        if bank_exists(args.bank, options=_bank_options(args)):
            bank, encoder = open_bank(args.bank, options=_bank_options(args)), None
        else:
            bank, encoder = _create_bank(args)
            print(f"created {bank.path} (dim={bank.dim}, index={bank.config.index.factory})")
        with bank:
            try:  # ids used by other cases of the bank: refused before the encoder runs
                bank.check_ids(cases, allow_duplicates=args.allow_duplicates)
            except DataFormatError as error:
                raise DataFormatError(f"{error} (bank {bank.path})", path=args.file) from None
            encoder = encoder or _bank_encoder(bank)
            before = len(bank)
            vectors = encoder.encode([c.state for c in cases], normalize=True).reshape(len(cases), bank.dim)
            bank.add(cases, vectors, allow_duplicates=args.allow_duplicates)
            added = len(bank) - before
            print(f"imported {added} case(s) from {args.file} into {bank.path} "
                  f"({len(cases) - added} duplicate(s) skipped; {len(bank)} in the bank)")
        return EXIT_OK

    with open_bank(args.bank, options=_bank_options(args)) as bank:
        if args.bank_command == "export":
            n = bank.export_jsonl(args.out)
            print(f"exported {n} case(s) to {args.out}")
        elif args.bank_command == "search":
            if args.k < 1:
                raise DataFormatError(f"-k must be a positive integer, got {args.k}")
            encoder = _bank_encoder(bank)
            k = min(args.k, max(len(bank), 1))  # more than the bank holds finds them all
            scores, ids = bank.search(encoder.encode(args.text), k, env=args.env, kind=args.kind)
            cases = bank.get(list(ids))
            if args.json:
                print(json.dumps([{"score": float(s), **c.to_json()} for s, c in zip(scores, cases)],
                                 ensure_ascii=False, indent=2))
            else:
                if not cases:
                    print("no cases found")
                for rank, (score, case) in enumerate(zip(scores, cases), start=1):
                    print(f"{rank}. [{score:.4f}] {case.id}  reward={case.reward:g}  kind={case.kind}"
                          + (f"  env={case.env}" if case.env else ""))
                    print(textwrap.indent(textwrap.shorten(case.state, 200), "   state:  "))
                    print(textwrap.indent(textwrap.shorten(case.action, 200), "   action: "))
        elif args.bank_command == "stats":
            stats = bank.stats()
            if args.json:
                print(json.dumps(stats, indent=2))
            else:
                for key, value in stats.items():
                    print(f"{key:>16}: {value}")
    return EXIT_OK


def _cmd_bench(args: argparse.Namespace) -> int:
    if args.bench_command == "bank":
        config = BankBenchConfig(sizes=tuple(args.sizes), factories=tuple(args.factories), dim=args.dim,
                                 queries=args.queries, k=args.k, data=args.data, ef_search=tuple(args.ef_search),
                                 nprobe=tuple(args.nprobe), backends=args.backends, op=args.op, seed=args.seed)
        results = run_bank_bench(config, out=args.json, workdir=args.workdir)

        print(format_table(results))
        print(f"results written to {args.json}")
    elif args.bench_command == "select":
        select_config = SelectBenchConfig(
            sizes=tuple(args.sizes), k=args.k, candidates=args.candidates, factory=args.factory,
            exact_max=args.exact_max, ef_search=tuple(args.ef_search), archs=tuple(args.archs), data=args.data,
            dim=args.dim, queries=args.queries, reference_size=args.reference_size,
            reference_queries=args.reference_queries, torch_threads=args.torch_threads, seed=args.seed)
        print(format_select(run_select_bench(select_config, out=args.json, workdir=args.workdir)))
        print(f"results written to {args.json}")
    elif args.bench_command == "train":
        train_config = TrainBenchConfig(
            archs=tuple(args.archs), batch_size=args.batch_size, k=args.k, steps=args.steps, dim=args.dim,
            buffer_size=args.buffer_size, bank_cases=args.bank_cases, device=args.device,
            torch_threads=args.torch_threads, seed=args.seed)
        if args.lightning:
            from training.bench import run_train_bench_lightning

            print(format_train(run_train_bench_lightning(train_config, out=args.json)))
        else:
            print(format_train(run_train_bench(train_config, out=args.json)))
        print(f"results written to {args.json}")
    elif args.bench_command == "online":
        given = {name: getattr(args, name) for name in ("steps", "suite", "split", "planner", "late_steps", "window",
                                                         "synthetic_steps", "overhead_bank", "overhead_steps",
                                                         "best_of_c", "ope_bootstrap", "workers_steps",
                                                         "workers_latency_ms", "workers_curve_steps")
                 if getattr(args, name) is not None}
        if args.workers is not None:
            try:
                given["workers"] = tuple(int(n) for n in args.workers.split(",") if n.strip())
            except ValueError:
                raise ConfigError(f"--workers {args.workers!r}: expected worker counts such as 1,2,4") from None
        if args.seeds or args.seed is not None:
            given["seeds"] = tuple(args.seeds) if args.seeds else (args.seed,)
        online_config = OnlineBenchConfig(
            policies=tuple(p.strip() for p in args.policies.split(",") if p.strip()),  # type: ignore[arg-type]
            parts=tuple(p.strip() for p in args.parts.split(",") if p.strip()),
            soft_q_candidates=args.soft_q_candidates, retain_judge=args.retain_judge, init_qnet=args.init_qnet,
            resume=args.resume, ope=args.ope, **given)
        if args.torch_threads:
            import torch

            torch.set_num_threads(args.torch_threads)  # process-wide, on purpose: the library never does this
        print(format_online_table(run_online_bench(online_config, out=args.json, workdir=args.workdir)))
        print(f"results written to {args.json}")
    elif args.bench_command == "games":
        return cmd_bench_games(args)
    elif args.bench_command == "stream":
        return cmd_bench_stream(args)
    elif args.bench_command == "serve":
        serve_config = ServeBenchConfig(
            size=args.size, data=args.data, factory=args.factory, k=args.k, clients=tuple(args.clients),
            selects=args.selects, text_selects=args.text_selects, feedbacks=args.feedbacks, learn=not args.no_learn,
            server_threads=args.threads, batch_max_texts=args.batch_max_texts, batch_wait_ms=args.batch_wait_ms,
            warmup=args.warmup, seed=args.seed, workers=tuple(args.workers))
        print(format_serve_table(run_serve_bench(serve_config, out=args.json, artifact=args.artifact,
                                                 workdir=args.workdir)))
        print(f"results written to {args.json}")
    return EXIT_OK


def _one_line(message: object) -> str:
    """An error message on one line (a message with line breaks would read as several errors)."""
    return " ".join(str(message).splitlines())


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        print(f"memento {__version__}")
        return EXIT_OK
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    _configure_logging(args.verbose)
    try:
        if args.command == "bank":
            return _cmd_bank(args)
        if args.command == "bench":
            return _cmd_bench(args)
        if args.command == "online":
            return _cmd_online(args)
        if args.command == "play":
            return cmd_play(args)
        if args.command == "evaluate":
            return cmd_evaluate(args, make_policy=make_policy)
        if args.command == "demo":
            return _cmd_demo(args, parser)
        if args.command == "train":
            from training.cli import run_train

            return run_train(args)
        if args.command == "train-encoder":
            from training.simcse_cli import run as run_train_encoder

            return run_train_encoder(args)
        if args.command == "export":
            return _cmd_export(args)
        if args.command == "verify":
            return _cmd_verify(args)
        if args.command == "serve":
            return _cmd_serve(args)
        if args.command == "mcp":
            return _cmd_mcp(args)
        if args.command == "inspect":
            return _cmd_inspect(args)
        if args.command == "score":
            return _cmd_score(args)
    except MementoError as error:
        print(f"memento: error: {_one_line(error)}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as error:  # a file the command needs cannot be read or written: no traceback either
        where = f"{error.filename}: " if error.filename else ""
        print(f"memento: error: {where}{_one_line(error.strerror or error)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("memento: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    parser.error(f"unknown command {args.command!r}")
    return EXIT_USAGE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
