"""``memento bench bank``: case-bank add throughput, search latency and recall per backend and index.

For each size N, backend (``dir``: SQLite + faiss; ``milvus``: a Milvus Lite file, in-process) and factory
string, a fresh bank is filled with N random unit vectors through ``add`` in chunks (SQLite insert + index add,
IVF training included; for Milvus the inserts and the flush that seals each chunk into an indexed segment),
then timed with single-vector queries (the online loop's access pattern): ``search_positions`` (``op="search"``)
or ``candidates`` (``op="candidates"``: ids, scores and the stored vectors the Q-network needs). Recall@k is
measured against exact inner-product search over the same vectors. Everything of one size runs in one process,
so the figures compare side by side.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Literal

import numpy as np

from memento.bank import CaseBank, create_bank, open_bank
from memento.bench.common import environment, exact_topk, finish, make_vectors, timestamp, write_results
from memento.config import (
    MAX_BENCH_BYTES,
    MAX_BENCH_ITEMS,
    MAX_BENCH_VECTORS,
    MAX_CANDIDATES,
    MAX_DIM,
    MAX_EF_SEARCH,
    MAX_NLIST,
    MAX_SEED,
    check,
    check_int_tuple,
    check_ints,
)
from memento.errors import ConfigError
from memento.types import Case

__all__ = ["BankBenchConfig", "format_table", "ivf_nlist", "run_bank_bench"]

logger = logging.getLogger(__name__)

_ADD_CHUNK = 10_000


@dataclasses.dataclass(frozen=True, kw_only=True)
class BankBenchConfig:
    sizes: tuple[int, ...] = dataclasses.field(default=(10_000, 100_000), metadata={"help": "bank sizes"})
    factories: tuple[str, ...] = dataclasses.field(
        default=("Flat", "HNSW32,Flat", "IVF{nlist},Flat"), metadata={"help": (
            "faiss factory strings ('{nlist}' becomes a size-dependent IVF list count)")})
    dim: int = dataclasses.field(default=384, metadata={"help": "vector dimension"})
    queries: int = dataclasses.field(default=200, metadata={"help": "timed single queries per setting"})
    k: int = dataclasses.field(default=10, metadata={"help": "k for search and recall@k"})
    data: Literal["uniform", "clustered"] = dataclasses.field(default="uniform", metadata={"help": (
        "uniform random unit vectors, or a mixture of clusters like real embeddings")})
    ef_search: tuple[int, ...] = dataclasses.field(default=(64, 128, 256), metadata={"help": "HNSW efSearch values"})
    nprobe: tuple[int, ...] = dataclasses.field(default=(16, 64, 256), metadata={"help": "IVF nprobe values"})
    backends: tuple[Literal["dir", "milvus"], ...] = dataclasses.field(default=("dir",), metadata={"help": (
        "comma-separated bank backends: dir (SQLite + faiss), milvus (a Milvus Lite file; the 'milvus' extra), e.g. "
        "dir,milvus")})
    op: Literal["search", "candidates"] = dataclasses.field(default="search", metadata={"help": (
        "what is timed: search_positions, or candidates (ids + stored vectors)")})
    seed: int = dataclasses.field(default=0, metadata={"help": "random seed"})

    def __post_init__(self) -> None:
        check_int_tuple(self, "sizes", 1, MAX_BENCH_VECTORS)
        check_ints(self, dim=(1, MAX_DIM), queries=(1, MAX_BENCH_ITEMS), k=(1, MAX_CANDIDATES), seed=(0, MAX_SEED))
        check(max(self.sizes) * self.dim * 4 <= MAX_BENCH_BYTES, type(self), "sizes", self.sizes,
              f"a bank of {max(self.sizes)} x dim={self.dim} float32 vectors is over {MAX_BENCH_BYTES // 2**30} GiB")
        check_int_tuple(self, "ef_search", 1, MAX_EF_SEARCH)
        check_int_tuple(self, "nprobe", 1, MAX_NLIST)
        if not self.factories:
            raise ConfigError(f"BankBenchConfig.factories={self.factories!r}: need at least one")
        for name in ("dim", "queries", "k"):
            if getattr(self, name) < 1:
                raise ConfigError(f"BankBenchConfig.{name}={getattr(self, name)!r}: must be >= 1")
        if self.data not in ("uniform", "clustered"):
            raise ConfigError(f"BankBenchConfig.data={self.data!r}: must be 'uniform' or 'clustered'")
        if not self.backends or any(b not in ("dir", "milvus") for b in self.backends):
            raise ConfigError(f"BankBenchConfig.backends={self.backends!r}: need one or more of 'dir', 'milvus'")
        if self.op not in ("search", "candidates"):
            raise ConfigError(f"BankBenchConfig.op={self.op!r}: must be 'search' or 'candidates'")


def ivf_nlist(n: int) -> int:
    """A power of two near 4 * sqrt(n), small enough that the index trains (39 points per list)."""
    nlist = 2 ** max(2, round(math.log2(4 * math.sqrt(n))))
    while nlist > 4 and 39 * nlist > n:
        nlist //= 2
    return nlist


def _time_queries(bank: Any, queries_QD: np.ndarray, k: int,
                  op: str = "search") -> tuple[dict[str, float], np.ndarray]:
    def positions_of(q: np.ndarray) -> np.ndarray:
        if op == "candidates":
            found_C = bank.candidates(q, k).positions_C
            return np.pad(found_C, (0, k - len(found_C)), constant_values=-1)
        return bank.search_positions(q, k)[1][0]

    for q in queries_QD[:5]:  # warm-up
        positions_of(q)
    latencies = np.empty(len(queries_QD))
    found = np.empty((len(queries_QD), k), dtype=np.int64)
    for i, q in enumerate(queries_QD):
        t0 = time.perf_counter()
        found[i] = positions_of(q)
        latencies[i] = time.perf_counter() - t0
    ms = latencies * 1e3
    return {"p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)),
            "mean_ms": float(ms.mean())}, found


def _recall(found_QK: np.ndarray, truth_QK: np.ndarray) -> float:
    hits = sum(len(set(f.tolist()) & set(t.tolist())) for f, t in zip(found_QK, truth_QK))
    return hits / truth_QK.size


def _environment(backends: tuple[str, ...]) -> dict[str, Any]:
    env = environment()
    if "milvus" in backends:
        from importlib import metadata

        for name in ("pymilvus", "milvus-lite"):
            try:
                env[name] = metadata.version(name)
            except metadata.PackageNotFoundError:
                env[name] = None
    return env


def _milvus_can(factory: str) -> bool:
    from memento.bank.milvus import milvus_index

    try:
        milvus_index(factory)
    except ConfigError:
        return False
    return True


def run_bank_bench(config: BankBenchConfig, *, out: str | Path | None = None,
                   workdir: str | Path | None = None) -> dict[str, Any]:
    """Run the benchmark; returns (and writes to ``out`` as it goes) the results document."""

    rng = np.random.default_rng(config.seed)
    results: dict[str, Any] = {"benchmark": "bank", "config": dataclasses.asdict(config),
                               "environment": _environment(config.backends),
                               "started": timestamp(),
                               "results": []}
    root = Path(tempfile.mkdtemp(prefix="memento-bench-", dir=workdir))
    try:
        for n in config.sizes:
            base_ND = make_vectors(rng, n, config.dim, config.data)
            queries_QD = make_vectors(rng, config.queries, config.dim, config.data)
            truth_QK = exact_topk(base_ND, queries_QD, min(config.k, n))
            k = min(config.k, n)
            cases = [Case(state=f"synthetic state {i}", action=f"synthetic action {i}", reward=float(i % 2))
                     for i in range(n)]
            for backend, template in [(b, t) for b in config.backends for t in config.factories]:
                factory = template.replace("{nlist}", str(ivf_nlist(n)))
                if backend == "milvus" and not _milvus_can(factory):
                    logger.warning("bench bank: Milvus has no index for %s; skipped", factory)
                    continue
                path = root / f"bank-{n}-{factory.replace(',', '_')}"
                where = str(path) if backend == "dir" else f"milvus:{path}.db#bench"
                logger.info("bench bank: n=%d backend=%s factory=%s", n, backend, factory)
                bank = (CaseBank.create(path, config.dim, index=factory, seed=config.seed) if backend == "dir"
                        else create_bank(where, config.dim, index=factory))
                t0 = time.perf_counter()
                for start in range(0, n, _ADD_CHUNK):
                    bank.add(cases[start:start + _ADD_CHUNK], base_ND[start:start + _ADD_CHUNK])
                add_s = time.perf_counter() - t0
                t0 = time.perf_counter()
                bank.flush()
                flush_s = time.perf_counter() - t0
                row: dict[str, Any] = {"n": n, "backend": backend, "factory": factory, "add_s": add_s,
                                       "add_per_s": n / add_s,
                                       "flush_s": flush_s, "trained": bank.stats()["index_trained"],
                                       "search": []}
                knob = "ef_search" if "HNSW" in factory else "nprobe" if "IVF" in factory else None
                values = (config.ef_search if knob == "ef_search" else config.nprobe if knob == "nprobe"
                          else (None,))
                for value in values:
                    if knob is not None:
                        bank.set_search_params(**{knob: value})
                    timing, found = _time_queries(bank, queries_QD, k, config.op)
                    row["search"].append({"param": knob, "value": value, **timing,
                                          f"recall@{k}": _recall(found, truth_QK)})
                bank.close()
                t0 = time.perf_counter()
                open_bank(where).close()
                row["open_s"] = time.perf_counter() - t0
                row["bytes"] = _size(path if backend == "dir" else Path(f"{path}.db"))
                shutil.rmtree(path if backend == "dir" else Path(f"{path}.db"), ignore_errors=True)
                results["results"].append(row)
                logger.info("bench bank: %s", row)
                if out is not None:
                    write_results(out, results)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return finish(results, out)


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def format_table(results: dict[str, Any]) -> str:
    """A Markdown table of the results (the form docs/benchmarks.md records)."""
    k = results["config"]["k"]
    op = results["config"].get("op", "search")
    lines = [f"| N | factory | backend | add (cases/s) | param | {op} p50 (ms) | p99 (ms) | recall@{k} |",
             "|---:|---|---|---:|---|---:|---:|---:|"]
    for row in results["results"]:
        for s in row["search"]:
            param = "" if s["param"] is None else f"{s['param']}={s['value']}"
            recall = next(v for key, v in s.items() if key.startswith("recall@"))
            lines.append(f"| {row['n']:,} | {row['factory']} | {row.get('backend', 'dir')} | {row['add_per_s']:,.0f} | "
                         f"{param} | {s['p50_ms']:.3f} | {s['p99_ms']:.3f} | {recall:.3f} |")
    return "\n".join(lines)
