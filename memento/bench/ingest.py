"""``memento bench import``: bulk import of precomputed vectors, end to end, as a user runs it.

For each size N, the bench writes N synthetic cases (``cases.jsonl``: short texts, rewards 0/1) and their vectors
(``vectors.npy``, the clustered unit vectors of :func:`memento.bench.common.vector_chunks`, the base set of
``memento bench select``) into its work directory, a chunk at a time, then runs ``memento bank import FILE
--embeddings VECS --bank BANK --index FACTORY --vectors disk`` as a child process and records its wall time,
cases per second and peak resident memory (the child's ``VmHWM``, read every 50 ms while it runs). With ``again``
it runs the same import a second time (every case already stored: read, check, hash, look up, write nothing). The
generated files are removed after each size unless ``keep`` names a directory to leave them (and the bank) in,
e.g. for ``memento bench select --bank``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Literal

import numpy as np

from memento.bench.common import environment, finish, memory_mib, timestamp, vector_chunks, write_results
from memento.config import (
    MAX_BENCH_BYTES,
    MAX_BENCH_VECTORS,
    MAX_DIM,
    MAX_SEED,
    check,
    check_factory,
    check_int_tuple,
    check_ints,
)

__all__ = ["IngestBenchConfig", "format_table", "run_ingest_bench", "write_case_data"]

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, kw_only=True)
class IngestBenchConfig:
    """``sizes``: cases per import; ``factory``: the new bank's index (``IVF1024,PQ32x4fs``: 16 bytes of 4-bit
    fast-scan codes per case, re-ranked by the exact vectors with ``refine``); ``chunk``: the import's ``--chunk``
    (cases per transaction); ``dim``, ``data``, ``seed``: the vectors (:func:`memento.bench.common.vector_chunks`);
    ``again``: time a second run of the same import; ``keep``: leave the files and the bank there."""

    sizes: tuple[int, ...] = dataclasses.field(default=(100_000, 1_000_000), metadata={"help": "cases per import"})
    factory: str = dataclasses.field(default="IVF1024,PQ32x4fs", metadata={"help": "the new bank's faiss index"})
    refine: int = dataclasses.field(default=4, metadata={"help": "the bank's refine setting"})
    chunk: int = dataclasses.field(default=50_000, metadata={"help": "the import's --chunk, cases per transaction"})
    dim: int = dataclasses.field(default=384, metadata={"help": "vector dimension"})
    data: Literal["clustered", "uniform"] = dataclasses.field(default="clustered", metadata={"help": (
        "clustered vectors like real embeddings, or uniform on the sphere")})
    again: bool = dataclasses.field(default=False, metadata={"help": "time a second run of the same import"})
    keep: str | None = dataclasses.field(default=None, metadata={"help": (
        "leave the generated files and the bank in DIR/import-N")})
    seed: int = dataclasses.field(default=0, metadata={"help": "random seed"})

    def __post_init__(self) -> None:
        cls = type(self)
        check_int_tuple(self, "sizes", 1, MAX_BENCH_VECTORS)
        check_ints(self, chunk=(1, 10_000_000), dim=(1, MAX_DIM), seed=(0, MAX_SEED), refine=(1, 64))
        check(max(self.sizes) * self.dim * 4 <= MAX_BENCH_BYTES, cls, "sizes", self.sizes,
              f"{max(self.sizes)} x dim={self.dim} float32 vectors are over {MAX_BENCH_BYTES // 2**30} GiB")
        check_factory(self, "factory")
        check(self.data in ("uniform", "clustered"), cls, "data", self.data, "must be 'uniform' or 'clustered'")
        check(isinstance(self.again, bool), cls, "again", self.again, "must be true or false")
        check(self.keep is None or (isinstance(self.keep, str) and self.keep != ""), cls, "keep", self.keep,
              "must name a directory")


def write_case_data(directory: Path, n: int, *, dim: int = 384, data: str = "clustered", seed: int = 0,
                    chunk: int = 100_000) -> tuple[Path, Path]:
    """``cases.jsonl`` and ``vectors.npy`` of ``n`` synthetic cases in ``directory``, written a chunk at a time;
    returns their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    cases, vectors = directory / "cases.jsonl", directory / "vectors.npy"
    array = np.lib.format.open_memmap(vectors, mode="w+", dtype=np.float32, shape=(n, dim))
    with cases.open("w", encoding="utf-8") as out:
        for start, chunk_MD in vector_chunks(seed, 0, n, dim, data, chunk):
            array[start:start + len(chunk_MD)] = chunk_MD
            out.write("".join(f'{{"state": "synthetic state {i}", "action": "synthetic action {i}", '
                              f'"reward": {i % 2}}}\n' for i in range(start, start + len(chunk_MD))))
    array.flush()
    del array
    return cases, vectors


def _run_import(cases: Path, vectors: Path, bank: Path, config: IngestBenchConfig) -> dict[str, Any]:
    command = [sys.executable, "-m", "memento", "bank", "import", str(cases), "--embeddings", str(vectors),
               "--bank", str(bank), "--index", config.factory, "--vectors", "disk", "--refine", str(config.refine),
               "--chunk", str(config.chunk)]
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        child = subprocess.Popen(command, stdout=out, stderr=err, text=True)
        peak_mib = 0.0
        while True:  # the child's own high-water mark (VmHWM is its address space's, from its exec on; ru_maxrss
            # would count this process's pages, which the child shared until its exec)
            peak_mib = max(peak_mib, memory_mib(child.pid)["peak_rss_mib"] or 0.0)
            pid, status = os.waitpid(child.pid, os.WNOHANG)
            if pid:
                break
            time.sleep(0.05)
        wall = time.perf_counter() - t0
        child.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        output, errors = out.read(), err.read()
    if child.returncode != 0:
        raise RuntimeError(f"memento bank import exited {child.returncode}: {errors.strip()[-500:]}")
    return {"wall_s": wall, "peak_rss_mib": peak_mib, "output": output.strip().splitlines()[-1:],
            "command": " ".join(command[1:])}


def run_ingest_bench(config: IngestBenchConfig, *, out: str | Path | None = None,
                     workdir: str | Path | None = None) -> dict[str, Any]:
    """Run the benchmark; returns (and writes to ``out`` as it goes) the results document."""
    results: dict[str, Any] = {"benchmark": "import", "config": dataclasses.asdict(config),
                               "environment": environment(), "started": timestamp(), "results": []}
    for n in config.sizes:
        root = Path(config.keep) / f"import-{n}" if config.keep else Path(tempfile.mkdtemp(prefix="memento-bench-",
                                                                                           dir=workdir))
        try:
            t0 = time.perf_counter()
            cases, vectors = write_case_data(root, n, dim=config.dim, data=config.data, seed=config.seed)
            row: dict[str, Any] = {"n": n, "factory": config.factory, "data_s": time.perf_counter() - t0,
                                   "jsonl_bytes": cases.stat().st_size, "npy_bytes": vectors.stat().st_size}
            shutil.rmtree(root / "bank", ignore_errors=True)
            first = _run_import(cases, vectors, root / "bank", config)
            row.update(first, cases_per_s=n / first["wall_s"])
            bank_files = {p.name: p.stat().st_size for p in sorted((root / "bank").iterdir()) if p.is_file()}
            row["bank_bytes"] = bank_files
            if config.again:
                second = _run_import(cases, vectors, root / "bank", config)
                row["again"] = {**second, "cases_per_s": n / second["wall_s"]}
            logger.info("bench import: n=%d %s", n, row)
            results["results"].append(row)
            if out is not None:
                write_results(out, results)
        finally:
            if not config.keep:
                shutil.rmtree(root, ignore_errors=True)
    return finish(results, out)


def format_table(results: dict[str, Any]) -> str:
    """A markdown table of the results (the form docs/benchmarks.md records)."""
    lines = ["| N | index | import wall (s) | cases/s | peak RSS (MiB) | again (s) | again cases/s | "
             "vectors.f32 (MB) | cases.sqlite (MB) |", "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for row in results["results"]:
        again = row.get("again") or {}
        files = row.get("bank_bytes", {})
        lines.append(f"| {row['n']:,} | {row['factory']} | {row['wall_s']:.1f} | {row['cases_per_s']:,.0f} | "
                     f"{row['peak_rss_mib']:,.0f} | {again.get('wall_s', float('nan')):.1f} | "
                     f"{again.get('cases_per_s', float('nan')):,.0f} | {files.get('vectors.f32', 0) / 1e6:,.0f} | "
                     f"{files.get('cases.sqlite', 0) / 1e6:,.0f} |")
    return "\n".join(lines)
