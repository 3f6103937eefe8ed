"""``memento bench select``: end-to-end case selection latency per bank size, next to raw faiss and a Memento reference.

For each bank size N a fresh bank is filled with N random unit vectors (``make_vectors`` of
``memento bench bank``; clustered by default, since real sentence embeddings have a low
intrinsic dimension). The bench never holds the whole base set: the vectors are drawn chunk by
chunk (``vector_chunks``, ``chunk`` rows each, every chunk from its own generator seeded by
(seed, N, chunk index)) and added to the bank chunk by chunk; the exact top-C of a sample of
``recall_queries`` queries is then streamed over the same chunks drawn again (a running top-C per
query). The index follows one explicit rule: exact ``Flat`` while ``N <= exact_max``, the
approximate ``factory`` above it, searched with each ``ef_search`` (HNSW) or ``nprobe`` (IVF)
value. Then, one query state at a time (the online loop's access pattern, state embedding
given), the selection of K cases is timed end to end::
    candidates = bank.candidates(state_D, C)                 # faiss top-C + their stored vectors
    selection = policy.select(state_D, candidates, K, rng=rng)

for ``similarity`` (cosine top-K) and for ``soft_q`` with each Q-network architecture
(untrained networks from ``build_qnet``: the latency does not depend on the weights), with the
breakdown into candidate search and policy time, and soft-Q's p50 over similarity's. Its peer in
the same run: the same faiss index searched directly (``faiss.Index.search(q_1D, C)``, one query
at a time, same knobs), timed interleaved with ``bank.candidates(q_D, C)`` alone, and the bank's
overhead as their p50 and p99 ratios (a ratio holds across noisy machines where milliseconds do
not). The recall of the exact top-C is reported for each index setting. Per size the results
record the build (add) time, the index training time, and the process's resident memory
(``VmRSS``) after the build and after the timed selects, with its peak so far (``VmHWM``: the
process's high-water mark since it started, so it covers the sizes before too).

The Memento-style reference scores a query the way the reference implementation's parametric
memory does: a transformer pass over every (query, case) pair. The query text (repeated N times)
and the N case texts are encoded with the real encoder (all-MiniLM-L6-v2, no embedding cache,
no de-duplication: ~2N sequences), the pooled vectors are concatenated and a 2-layer MLP head
(2D -> 512 -> 2) gives P(helpful); the top-K are chosen. The reference implementation uses
RoBERTa-base (~5x the compute of MiniLM-L6 per token), so the ratio reported here understates
the gap.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np

from memento.bank import CaseBank
from memento.bank.index import FaissIndex, use_gpu_for
from memento.bench.common import (
    distinct_choices,
    exact_topk_chunks,
    finish,
    memory_mib,
    timestamp,
    vector_chunks,
    write_results,
)
from memento.config import (
    MAX_BENCH_BYTES,
    MAX_BENCH_ITEMS,
    MAX_BENCH_VECTORS,
    MAX_CANDIDATES,
    MAX_DIM,
    MAX_EF_SEARCH,
    MAX_HIDDEN,
    MAX_K,
    MAX_NLIST,
    MAX_REFINE,
    MAX_SEED,
    MAX_THREADS,
    IndexConfig,
    QNetArch,
    QNetConfig,
    VectorStore,
    check,
    check_factory,
    check_int_tuple,
    check_ints,
)
from memento.encoders import Encoder
from memento.learn.qnet import build_qnet
from memento.policies import SimilarityPolicy, SoftQPolicy  # the benchmarks are a composition root, like the CLI
from memento.types import Case

__all__ = ["ReferenceScorer", "SelectBenchConfig", "format_table", "faiss_torch_environment", "reference_texts",
           "run_select_bench"]

logger = logging.getLogger(__name__)

_ADD_CHUNK = 10_000
_WARMUP = 5


@dataclasses.dataclass(frozen=True, kw_only=True)
class SelectBenchConfig:
    """What ``memento bench select`` measures.

    - ``sizes``: bank sizes N; ``dim``: vector dimension; ``data``: ``"clustered"`` or ``"uniform"``;
    - index rule: ``Flat`` (exact) when ``N <= exact_max``, else ``factory`` searched with each
      ``ef_search`` (HNSW) value;
    - ``k``: cases selected; ``candidates``: C, the candidate set the policy scores;
    - ``archs``: Q-network architectures for the soft-Q policy (``hidden`` units, temperature ``alpha``);
    - ``queries``: timed single queries per (size, setting, policy), after 5 warm-up queries: a first pass
      (``first_pass_p50_ms``: soft-Q computes each case's first-layer half the first time the case is a
      candidate, :class:`memento.learn.qnet.MLPQNetwork`'s case cache) then the same queries again, the steady
      state of a served selector between two publishes of its weights (``p50_ms``, ``p99_ms``);
    - ``nprobe``: the IVF ``nprobe`` values searched (an IVF factory), one setting each;
    - ``vectors``: where the banks keep their float32 vectors (``BankConfig.vectors``: ``ram``, ``disk``), one bank
      of each size per value, built and measured one after the other;
    - ``refine``: the ``IndexConfig.refine`` values (re-rank ``refine * C`` index hits by their exact vectors)
      searched with each ``ef_search``/``nprobe`` value at the approximate sizes, one setting each;
    - ``chunk``: vectors drawn and added per chunk (the most the bench itself holds at once);
    - ``recall_queries``: the first queries whose exact top-C is streamed over the chunks for the recall;
    - ``torch_threads``: torch intra-op threads, and numpy's BLAS threads, while selections are timed (0: the
      libraries' defaults, one
      per core). One query scores only C candidates: ops too small to gain from threads, and on a
      2-core machine with any other load, 2 threads make each op wait for a descheduled thread
      (20-40x slower in our runs). The reference always runs with torch's default;
    - ``device``: where the Q-networks score and, with faiss-gpu, where the banks search (``use_gpu_for``);
    - ``bank``: measure this existing directory bank (opened read-only; its size is its case count, its index its
      own; ``sizes``, ``factory`` and ``vectors`` are not used), e.g. a 10M bank built once by ``memento bank
      import`` (docs/benchmarks.md); the exact top-C of the recall is streamed over its own vectors;
    - ``cold``: time each setting twice, first after evicting the bank's ``vectors.f32`` from the kernel's page
      cache (``posix_fadvise(DONTNEED)``: the re-ranking and candidates' rows then come from the disk), then warm;
    - ``reference_size``: cases scored by the Memento-style reference (0: skip it), timed over
      ``reference_queries`` queries; the soft-Q latency it is compared with is measured at the same
      size (added to the sizes if missing).
    """

    sizes: tuple[int, ...] = dataclasses.field(default=(1_000, 10_000, 100_000, 1_000_000), metadata={"help": (
        "bank sizes")})
    k: int = dataclasses.field(default=4, metadata={"help": "cases selected per query"})
    candidates: int = dataclasses.field(default=64, metadata={"help": "candidate set size C"})
    factory: str = dataclasses.field(default="HNSW32,Flat", metadata={"help": (
        "faiss factory for banks above --exact-max")})
    exact_max: int = dataclasses.field(default=20_000, metadata={"help": "largest bank that uses Flat, exact search"})
    ef_search: tuple[int, ...] = dataclasses.field(default=(64,), metadata={"help": "HNSW efSearch values"})
    nprobe: tuple[int, ...] = dataclasses.field(default=(32,), metadata={"help": "IVF nprobe values"})
    vectors: tuple[VectorStore, ...] = dataclasses.field(default=("ram",), metadata={"help": (
        "where the banks keep their float32 vectors: in RAM, or in a memory-mapped file read by position; one bank "
        "per value and size")})
    refine: tuple[int, ...] = dataclasses.field(default=(1,), metadata={"help": (
        "re-rank REFINE x C index hits by their exact vectors, one setting per value, at the sizes above "
        "--exact-max (1: the index's own order)")})
    archs: tuple[QNetArch, ...] = dataclasses.field(default=("mlp", "mlp_interact", "two_tower"), metadata={"help": (
        "Q-network architectures for the soft-Q policy")})
    hidden: int = 512
    alpha: float = 1.0
    dim: int = dataclasses.field(default=384, metadata={"help": "vector dimension"})
    data: Literal["clustered", "uniform"] = dataclasses.field(default="clustered", metadata={"help": (
        "clustered vectors like real embeddings, or uniform on the sphere")})
    queries: int = dataclasses.field(default=200, metadata={"help": "timed single queries per setting"})
    chunk: int = dataclasses.field(default=100_000, metadata={"help": (
        "vectors drawn and added per chunk, the most the bench holds at once")})
    recall_queries: int = dataclasses.field(default=100, metadata={"help": (
        "queries whose exact top-C is streamed over the chunks for the recall")})
    reference_size: int = dataclasses.field(default=1_000, metadata={"help": (
        "cases scored by the Memento-style reference (0 skips it)")})
    reference_queries: int = dataclasses.field(default=5, metadata={"help": "queries timed for the reference"})
    torch_threads: int = dataclasses.field(default=1, metadata={"help": (
        "torch threads while selections are timed (0: torch's default)")})
    device: Literal["cpu", "cuda"] = dataclasses.field(default="cpu", metadata={"help": (
        "where the Q-networks score and, with faiss-gpu, where the banks search")})
    seed: int = dataclasses.field(default=0, metadata={"help": "random seed"})
    bank: str | None = dataclasses.field(default=None, metadata={"help": (
        "measure this existing directory bank instead of building banks (opened read-only; --sizes, --factory and "
        "--vectors are then unused): e.g. a 10M bank built once with memento bank import")})
    cold: bool = dataclasses.field(default=False, metadata={"help": (
        "time each setting twice: first after evicting the bank's vectors.f32 from the page cache (cold), then warm")})

    def __post_init__(self) -> None:
        cls = type(self)
        check(self.bank is None or (isinstance(self.bank, str) and self.bank != ""), cls, "bank", self.bank,
              "must name a directory bank")
        check(isinstance(self.cold, bool), cls, "cold", self.cold, "must be true or false")
        check_int_tuple(self, "sizes", 1, MAX_BENCH_VECTORS)
        check_ints(self, k=(1, MAX_K), candidates=(1, MAX_CANDIDATES), dim=(1, MAX_DIM), queries=(1, MAX_BENCH_ITEMS),
                   hidden=(1, MAX_HIDDEN), reference_queries=(1, MAX_BENCH_ITEMS), chunk=(1, MAX_BENCH_VECTORS),
                   recall_queries=(1, MAX_BENCH_ITEMS))
        check_ints(self, exact_max=(0, MAX_BENCH_VECTORS), reference_size=(0, MAX_BENCH_VECTORS),
                   torch_threads=(0, MAX_THREADS), seed=(0, MAX_SEED))
        check(max(self.sizes) * self.dim * 4 <= MAX_BENCH_BYTES, cls, "sizes", self.sizes,
              f"a bank of {max(self.sizes)} x dim={self.dim} float32 vectors is over {MAX_BENCH_BYTES // 2**30} GiB")
        check(self.candidates >= self.k, cls, "candidates", self.candidates, f"must be >= k={self.k}")
        check_factory(self, "factory")
        check_int_tuple(self, "ef_search", 1, MAX_EF_SEARCH)
        check_int_tuple(self, "nprobe", 1, MAX_NLIST)
        check_int_tuple(self, "refine", 1, MAX_REFINE)
        check(distinct_choices(self.vectors, VectorStore), cls, "vectors", self.vectors,
              f"need distinct values from {get_args(VectorStore)}")
        check(distinct_choices(self.archs, QNetArch), cls, "archs", self.archs,
              f"need distinct values from {get_args(QNetArch)}")
        check(self.data in ("uniform", "clustered"), cls, "data", self.data, "must be 'uniform' or 'clustered'")
        check(self.device in ("cpu", "cuda"), cls, "device", self.device, "must be 'cpu' or 'cuda'")
        alpha = self.alpha
        check(isinstance(alpha, (int, float)) and not isinstance(alpha, bool) and bool(np.isfinite(alpha))
              and alpha > 0, cls, "alpha", alpha, "must be a finite number > 0")

    def factory_for(self, n: int) -> str:
        """The index of a bank of ``n`` cases: exact up to ``exact_max``, the approximate factory above."""
        return "Flat" if n <= self.exact_max else self.factory

    @property
    def measured_sizes(self) -> tuple[int, ...]:
        """``sizes``, plus ``reference_size`` when the reference runs and that size is not already there."""
        if self.reference_size and self.reference_size not in self.sizes:
            return (*self.sizes, self.reference_size)
        return self.sizes


# ---------------------------------------------------------------- the Memento-style reference


def reference_texts(n: int) -> list[str]:
    """``n`` short, distinct case texts (real words, so tokenisation is realistic)."""
    return [f"synthetic case {i}: what is the capital of region {i}?" for i in range(n)]


class ReferenceScorer:
    """Memento's parametric-memory retrieval, for timing: a transformer pass over every (query, case) pair.

    For each batch of pairs, the repeated query and the cases are tokenised and encoded (two
    forward passes), pooled with the encoder's pooling, concatenated, and a head
    ``Linear(2D, hidden) -> ReLU -> Linear(hidden, 2)`` gives ``P(helpful)``; the top-K pairs win.
    The head is untrained (random, seeded): only the cost matters here.
    """

    def __init__(self, encoder: Any, *, hidden: int = 512, batch_size: int = 64, seed: int = 0):
        import torch
        from torch import nn

        self.encoder = encoder
        self.batch_size = batch_size
        generator = torch.Generator().manual_seed(seed)
        d = encoder.dim
        self.head = nn.Sequential(nn.Linear(2 * d, hidden), nn.ReLU(), nn.Linear(hidden, 2)).eval()
        with torch.no_grad():
            for p in self.head.parameters():
                p.copy_(torch.empty(p.shape).uniform_(-0.05, 0.05, generator=generator))
        self.head.to(encoder.device)

    def _encode(self, texts: list[str]) -> Any:
        enc = self.encoder
        batch = enc.tokenizer(texts, padding=True, truncation=True, max_length=enc.config.max_length,
                              return_tensors="pt").to(enc.device)
        return enc.pool(enc.model(**batch), batch["attention_mask"])

    def scores(self, query: str, case_texts: list[str]) -> np.ndarray:
        """``P(helpful | query, case)`` for every case (float64 ``[N]``)."""
        import torch

        out: list[np.ndarray] = []
        with torch.inference_mode():
            for start in range(0, len(case_texts), self.batch_size):
                chunk = case_texts[start:start + self.batch_size]
                q_BD = self._encode([query] * len(chunk))
                c_BD = self._encode(chunk)
                logits_B2 = self.head(torch.cat([q_BD, c_BD], dim=-1))
                out.append(torch.softmax(logits_B2, dim=-1)[:, 1].double().cpu().numpy())
        return np.concatenate(out) if out else np.zeros(0)

    def top_k(self, query: str, case_texts: list[str], k: int) -> np.ndarray:
        """Indices of the ``k`` highest-scoring cases, best first."""
        scores_N = self.scores(query, case_texts)
        return np.argsort(-scores_N, kind="stable")[:k]


def _time_reference(config: SelectBenchConfig) -> dict[str, Any]:
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    t0 = time.perf_counter()
    encoder = Encoder.from_pretrained(use_cache=False, device="cpu")
    load_s = time.perf_counter() - t0
    scorer = ReferenceScorer(encoder, hidden=config.hidden, seed=config.seed)
    n = config.reference_size
    cases = reference_texts(n)
    queries = [f"new task {q}: which region has the capital named city {q}?" for q in range(config.reference_queries)]
    scorer.top_k("warm-up query", cases[:scorer.batch_size], config.k)  # load kernels
    latencies = []
    for query in queries:
        t0 = time.perf_counter()
        scorer.top_k(query, cases, config.k)
        latencies.append(time.perf_counter() - t0)
    encode_ms = []
    for i in range(max(20, config.reference_queries)):  # what memento adds when the state is text: one pass
        t0 = time.perf_counter()
        encoder.encode(f"new task {i}: which region has the capital named city {i}?")
        encode_ms.append((time.perf_counter() - t0) * 1e3)
    ms = np.array(latencies) * 1e3
    return {"n": n, "model": encoder.model_id, "device": encoder.device, "pooling": encoder.pooling,
            "torch_threads": torch.get_num_threads(), "queries": len(queries), "sequences_per_query": 2 * n,
            "encoder_load_s": load_s, "p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)),
            "mean_ms": float(ms.mean()), "query_encode_p50_ms": float(np.percentile(encode_ms, 50))}


# ---------------------------------------------------------------- selection timing


def _make_policies(config: SelectBenchConfig) -> list[tuple[str, str | None, Any]]:
    """``(policy, arch, Policy)``: similarity, then soft-Q per architecture, its Q-network on ``config.device``."""

    out: list[tuple[str, str | None, Any]] = [("similarity", None, SimilarityPolicy())]
    for arch in config.archs:
        qnet = build_qnet(QNetConfig(arch=arch, dim=config.dim, hidden=config.hidden, seed=config.seed)).eval()
        out.append(("soft_q", arch, SoftQPolicy(qnet.to(config.device), alpha=config.alpha, device=config.device)))
    return out


def _percentiles(ms: np.ndarray) -> dict[str, float]:
    return {"p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)), "mean_ms": float(ms.mean())}


def _time_policy(bank: Any, policy: Any, queries_QD: np.ndarray, config: SelectBenchConfig,
                 rng: np.random.Generator) -> tuple[dict[str, Any], np.ndarray]:
    c, k = config.candidates, config.k
    for q in queries_QD[:_WARMUP]:
        policy.select(q, bank.candidates(q, c), k, rng=rng)
    first_s = np.empty(len(queries_QD))  # the first pass: soft-Q computes each case's first-layer half once
    for i, q in enumerate(queries_QD):
        t0 = time.perf_counter()
        policy.select(q, bank.candidates(q, c), k, rng=rng)
        first_s[i] = time.perf_counter() - t0
    cand_s = np.empty(len(queries_QD))
    pol_s = np.empty(len(queries_QD))
    found = np.full((len(queries_QD), c), -1, dtype=np.int64)
    for i, q in enumerate(queries_QD):
        t0 = time.perf_counter()
        candidates = bank.candidates(q, c)
        t1 = time.perf_counter()
        policy.select(q, candidates, k, rng=rng)
        t2 = time.perf_counter()
        cand_s[i], pol_s[i] = t1 - t0, t2 - t1
        found[i, :len(candidates)] = candidates.positions_C
    total = _percentiles((cand_s + pol_s) * 1e3)
    first = _percentiles(first_s * 1e3)
    return {**total, "first_pass_p50_ms": first["p50_ms"], "first_pass_p99_ms": first["p99_ms"],
            "candidates_p50_ms": float(np.percentile(cand_s * 1e3, 50)),
            "candidates_p99_ms": float(np.percentile(cand_s * 1e3, 99)),
            "policy_p50_ms": float(np.percentile(pol_s * 1e3, 50)),
            "policy_p99_ms": float(np.percentile(pol_s * 1e3, 99))}, found


def _recall(found_QC: np.ndarray, truth_QC: np.ndarray) -> float:
    hits = sum(len(set(f[f >= 0].tolist()) & set(t.tolist())) for f, t in zip(found_QC, truth_QC))
    return hits / truth_QC.size


def faiss_torch_environment() -> dict[str, Any]:
    """The results document's ``environment`` of the selection benchmark: Python, the machine, its CPUs, faiss,
    numpy and torch with their thread counts, and the load average at the start (``memento bench serve`` adds
    its own)."""
    import faiss
    import torch

    return {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
            "faiss": faiss.__version__, "numpy": np.__version__, "torch": torch.__version__,
            "faiss_omp_threads": faiss.omp_get_max_threads(), "torch_default_threads": torch.get_num_threads(),
            "loadavg_start": list(os.getloadavg())}


def _faiss_of(bank: Any) -> FaissIndex | None:
    """The bank's :class:`FaissIndex` (its vector index's ``_index``), or None where its back end has none."""
    index = getattr(getattr(bank, "_index", None), "_index", None)
    return index if isinstance(index, FaissIndex) else None


def _time_peers(bank: Any, faiss_index: Any, queries_QD: np.ndarray, c: int,
                recall_q: int) -> tuple[dict[str, Any], np.ndarray]:
    """``faiss_index.search(q_1D, c)`` alone and ``bank.candidates(q_D, c)`` alone, interleaved one query at a
    time (so load on the machine hits both alike): percentiles, their ratios, and the raw labels of the first
    ``recall_q`` queries."""
    for q in queries_QD[:_WARMUP]:
        faiss_index.search(q[None], c)
        bank.candidates(q, c)
    raw_s = np.empty(len(queries_QD))
    bank_s = np.empty(len(queries_QD))
    labels = np.full((recall_q, c), -1, dtype=np.int64)
    for i in range(len(queries_QD)):
        q_1D = queries_QD[i:i + 1]
        t0 = time.perf_counter()
        _, labels_1C = faiss_index.search(q_1D, c)
        t1 = time.perf_counter()
        bank.candidates(q_1D[0], c)
        t2 = time.perf_counter()
        raw_s[i], bank_s[i] = t1 - t0, t2 - t1
        if i < recall_q:
            labels[i] = labels_1C[0]
    raw, cand = _percentiles(raw_s * 1e3), _percentiles(bank_s * 1e3)
    return {"faiss_alone": raw, "bank_candidates": cand,
            "candidates_over_faiss_p50": cand["p50_ms"] / raw["p50_ms"],
            "candidates_over_faiss_p99": cand["p99_ms"] / raw["p99_ms"]}, labels


def _time_vector_reads(bank: Any, n: int, c: int, reads: int, rng: np.random.Generator) -> dict[str, Any] | None:
    """A disk bank's two ways to read the exact vectors of ``c`` random positions, timed interleaved ``reads``
    times: through its memory map (what the bank does) and from SQLite (``SELECT embedding ... WHERE pos IN``)."""
    vectors, conn = bank._index, bank._rows.conn  # noqa: SLF001 - the bench compares the bank's own parts
    if bank._rows.store is not None:  # noqa: SLF001 - vectors stored once, in vectors.f32: SQLite holds none
        return None
    map_s, sql_s = np.empty(reads), np.empty(reads)
    marks = ", ".join("?" * c)
    for i in range(reads):
        positions = np.sort(rng.choice(n, size=c, replace=False))
        t0 = time.perf_counter()
        from_map = vectors._take(positions)  # noqa: SLF001
        t1 = time.perf_counter()
        rows = conn.execute(f"SELECT pos, embedding FROM cases WHERE pos IN ({marks})", positions.tolist()).fetchall()
        from_sql = np.frombuffer(b"".join(blob for _, blob in sorted(rows)), dtype=np.float32).reshape(c, -1)
        t2 = time.perf_counter()
        if i == 0 and not np.array_equal(from_map, from_sql):
            raise AssertionError("vectors.f32 and SQLite disagree")  # never: the file is SQLite's copy
        map_s[i], sql_s[i] = t1 - t0, t2 - t1
    mapped, sql = _percentiles(map_s * 1e3), _percentiles(sql_s * 1e3)
    return {"rows": c, "map": mapped, "sqlite": sql, "sqlite_over_map_p50": sql["p50_ms"] / mapped["p50_ms"]}


def _add_chunks(bank: Any, n: int, config: SelectBenchConfig) -> float:
    """Add the ``n`` base vectors chunk by chunk (``_ADD_CHUNK`` cases per ``bank.add``); returns the seconds spent
    in ``bank.add`` (drawing the vectors is not timed)."""
    spent = 0.0
    for start, vectors_MD in vector_chunks(config.seed, 0, n, config.dim, config.data, config.chunk):
        for offset in range(0, len(vectors_MD), _ADD_CHUNK):
            stop = min(offset + _ADD_CHUNK, len(vectors_MD))
            cases = [Case(state=f"synthetic state {i}", action=f"synthetic action {i}", reward=float(i % 2))
                     for i in range(start + offset, start + stop)]
            t0 = time.perf_counter()
            bank.add(cases, vectors_MD[offset:stop])
            spent += time.perf_counter() - t0
    return spent


def _timed_training(faiss_index: FaissIndex | None, spent: list[float]) -> None:
    """Record the seconds of each ``faiss_index.train`` call (the bank trains its index during an add) in
    ``spent``, by wrapping that one object's method."""
    if faiss_index is None:
        return
    train = faiss_index.train

    def timed(*args: Any, **kwargs: Any) -> None:
        t0 = time.perf_counter()
        try:
            train(*args, **kwargs)
        finally:
            spent.append(time.perf_counter() - t0)

    faiss_index.train = timed  # type: ignore[method-assign]


def _blas_threads(threads: int) -> Any:
    """numpy's BLAS (it runs the MLP Q-network's products on the CPU) held to ``threads`` while selections are timed,
    as torch is (``torch_threads``; 0 leaves it as it is)."""
    if not threads:
        return contextlib.nullcontext()
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=threads, user_api="blas")


def _measure_setting(bank: Any, knob: str | None, value: int | None, refine: int, n: int, c: int, recall_q: int,
                     queries_QD: np.ndarray, truth_QC: np.ndarray, config: SelectBenchConfig,
                     rng: np.random.Generator, policies: list[tuple[str, str | None, Any]]) -> dict[str, Any]:
    """One search setting of a built bank: raw faiss next to the bank's candidates, then every policy."""
    bank.set_search_params(refine=refine, **({knob: value} if knob else {}))
    setting: dict[str, Any] = {"param": knob, "value": value, "refine": refine, "policies": []}
    faiss_index = _faiss_of(bank)
    if faiss_index is not None and faiss_index.is_trained and faiss_index.ntotal == n:
        peers, labels = _time_peers(bank, faiss_index.index, queries_QD, c, recall_q)
        setting.update(peers, faiss_recall_at_c=_recall(labels, truth_QC))
    else:  # an index still untrained (too few vectors): the bank searches exactly, faiss has no peer
        setting.update(faiss_alone=None, bank_candidates=None, candidates_over_faiss_p50=None,
                       candidates_over_faiss_p99=None, faiss_recall_at_c=None)
    recall = None
    for name, arch, policy in policies:
        timing, found = _time_policy(bank, policy, queries_QD, config, rng)
        if recall is None:
            recall = _recall(found[:recall_q], truth_QC)
        setting["policies"].append({"policy": name, "arch": arch, **timing})
    setting["recall_at_c"] = recall
    similarity = next(p["p50_ms"] for p in setting["policies"] if p["policy"] == "similarity")
    setting["softq_over_similarity_p50"] = {p["arch"]: p["p50_ms"] / similarity
                                            for p in setting["policies"] if p["policy"] == "soft_q"}
    first = next(p["first_pass_p50_ms"] for p in setting["policies"] if p["policy"] == "similarity")
    setting["softq_over_similarity_first_pass_p50"] = {p["arch"]: p["first_pass_p50_ms"] / first
                                                       for p in setting["policies"] if p["policy"] == "soft_q"}
    logger.info("bench select: n=%d %s", n, setting)
    return setting


def _knob(factory: str, config: SelectBenchConfig) -> tuple[str | None, tuple[int | None, ...]]:
    """The search knob of ``factory`` and the values to measure: ``nprobe`` for an IVF index (its coarse quantizer
    may be an HNSW), ``ef_search`` for an HNSW graph, none for a flat index."""
    if "IVF" in factory:
        return "nprobe", config.nprobe
    if "HNSW" in factory:
        return "ef_search", config.ef_search
    return None, (None,)


def _after_select() -> dict[str, float | None]:
    """A row's resident memory after its selections (:func:`memento.bench.common.memory_mib`)."""
    memory = memory_mib()
    return {"rss_after_select_mib": memory["rss_mib"], "rss_after_select_anon_mib": memory["rss_anon_mib"],
            "rss_after_select_file_mib": memory["rss_file_mib"], "peak_rss_mib": memory["peak_rss_mib"]}


def _evict(bank: Any) -> None:
    """Drop the bank's ``vectors.f32`` from the kernel's page cache (and its map), so the next reads are cold."""
    path = Path(bank.path) / "vectors.f32"
    if not path.is_file() or not hasattr(os, "posix_fadvise"):
        return
    bank._index._file.close()  # noqa: SLF001 - the bench measures the bank's own parts
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _bank_chunks(bank: Any, n: int, chunk: int) -> Any:
    for start in range(0, n, chunk):
        yield start, bank.embeddings_at(np.arange(start, min(n, start + chunk)))


def _measure_bank(config: SelectBenchConfig, policies: list[tuple[str, str | None, Any]],
                  rng: np.random.Generator) -> dict[str, Any]:
    """One existing bank (``config.bank``), each setting warm, or cold then warm with ``config.cold``."""
    bank = CaseBank.open(config.bank, read_only=True, use_gpu=use_gpu_for(config.device))
    try:
        n, factory = len(bank), bank.config.index.factory
        [(_, queries_QD)] = vector_chunks(config.seed, 1, config.queries, bank.dim, config.data, config.queries)
        c = min(config.candidates, n)
        recall_q = min(config.recall_queries, config.queries)
        t0 = time.perf_counter()
        truth_QC = exact_topk_chunks(_bank_chunks(bank, n, config.chunk), queries_QD[:recall_q], c)
        row: dict[str, Any] = {"n": n, "factory": factory, "exact": factory == "Flat", "candidates": c,
                               "vectors": bank.config.vectors, "bank": str(config.bank), "recall_queries": recall_q,
                               "exact_topk_s": time.perf_counter() - t0, "settings": []}
        knob, values = _knob(factory, config)
        with _blas_threads(config.torch_threads):
            for value in values:
                for refine in config.refine:
                    for phase in ("cold", "warm") if config.cold else ("warm",):
                        if phase == "cold":
                            _evict(bank)
                        setting = _measure_setting(bank, knob, value, refine, n, c, recall_q, queries_QD, truth_QC,
                                                   config, rng, policies)
                        setting["pass"] = phase
                        setting.update({f"{key}_after": value for key, value in memory_mib().items()})
                        row["settings"].append(setting)
        row.update(_after_select())
    finally:
        bank.close()
    return row


def _measure_size(n: int, vectors: VectorStore, config: SelectBenchConfig, rng: np.random.Generator, root: Path,
                  policies: list[tuple[str, str | None, Any]]) -> dict[str, Any]:
    [(_, queries_QD)] = vector_chunks(config.seed, 1, config.queries, config.dim, config.data, config.queries)
    c = min(config.candidates, n)
    recall_q = min(config.recall_queries, config.queries)
    t0 = time.perf_counter()
    truth_QC = exact_topk_chunks(vector_chunks(config.seed, 0, n, config.dim, config.data, config.chunk),
                                 queries_QD[:recall_q], c)
    exact_s = time.perf_counter() - t0
    factory = config.factory_for(n)
    path = root / f"bank-{n}-{vectors}"
    logger.info("bench select: n=%d factory=%s: building", n, factory)
    bank = CaseBank.create(path, config.dim, index=factory, seed=config.seed, vectors=vectors,
                           use_gpu=use_gpu_for(config.device))
    try:
        train_spent: list[float] = []
        _timed_training(_faiss_of(bank), train_spent)
        build_s = _add_chunks(bank, n, config)
        t0 = time.perf_counter()
        bank.candidates(queries_QD[0], c)  # in ram mode the first call loads the bank's vectors from SQLite
        first_query_s = time.perf_counter() - t0
        after_build = memory_mib()
        row: dict[str, Any] = {"n": n, "factory": factory, "exact": factory == "Flat", "candidates": c,
                               "vectors": vectors,
                               "build_s": build_s, "add_per_s": n / build_s, "first_query_s": first_query_s,
                               "train_s": sum(train_spent) if train_spent else None, "chunk": config.chunk,
                               "recall_queries": recall_q, "exact_topk_s": exact_s,
                               "rss_after_build_mib": after_build["rss_mib"], "settings": []}
        knob, values = _knob(factory, config)
        refines = config.refine if factory != "Flat" else (1,)
        with _blas_threads(config.torch_threads):
            row["settings"] = [_measure_setting(bank, knob, value, refine, n, c, recall_q, queries_QD, truth_QC,
                                                config, rng, policies)
                               for value in values for refine in refines]
            if vectors == "disk":
                row["vector_reads"] = _time_vector_reads(bank, n, c, config.queries,
                                                         np.random.default_rng((config.seed, n, 7)))
        row.update(_after_select())
    finally:
        bank.close()
        shutil.rmtree(path, ignore_errors=True)
    return row


def run_select_bench(config: SelectBenchConfig, *, out: str | Path | None = None,
                     workdir: str | Path | None = None) -> dict[str, Any]:
    """Run the benchmark; returns (and writes to ``out`` as it goes) the results document."""
    import torch

    FaissIndex(IndexConfig(factory=config.factory), config.dim)  # a bad factory fails before any work
    if config.bank is not None:  # the policies score the bank's vectors: its dimension
        with CaseBank.open(config.bank, read_only=True, use_gpu=False) as bank:
            config = dataclasses.replace(config, dim=bank.dim)
    rng = np.random.default_rng(config.seed)
    results: dict[str, Any] = {
        "benchmark": "select", "config": dataclasses.asdict(config), "environment": faiss_torch_environment(),
        "index_rule": f"Flat (exact) for N <= {config.exact_max:,}, else {config.factory}",
        "started": timestamp(), "results": [], "reference": None}
    policies = _make_policies(config)
    root = Path(tempfile.mkdtemp(prefix="memento-bench-", dir=workdir))
    default_threads = torch.get_num_threads()
    results["environment"]["select_torch_threads"] = config.torch_threads or default_threads
    results["environment"]["policy_device"] = config.device
    results["environment"]["faiss_gpu"] = use_gpu_for(config.device)
    try:
        if config.torch_threads:
            torch.set_num_threads(config.torch_threads)
        if config.bank is not None:
            results["results"].append(_measure_bank(config, policies, rng))
        for n in () if config.bank is not None else config.measured_sizes:
            for vectors in config.vectors:
                results["results"].append(_measure_size(n, vectors, config, rng, root, policies))
            if out is not None:
                write_results(out, results)
    finally:
        torch.set_num_threads(default_threads)
        shutil.rmtree(root, ignore_errors=True)
    if config.reference_size and config.bank is None:
        logger.info("bench select: reference at n=%d", config.reference_size)
        reference = _time_reference(config)
        row = next(r for r in results["results"] if r["n"] == config.reference_size)  # the first store's
        soft_q = {p["arch"]: p["p50_ms"] for p in row["settings"][0]["policies"] if p["policy"] == "soft_q"}
        reference["soft_q_p50_ms"] = soft_q
        reference["ratio"] = {arch: reference["p50_ms"] / ms for arch, ms in soft_q.items()}
        results["reference"] = reference
    return finish(results, out)


def _param(setting: dict[str, Any]) -> str:
    """A setting's search knobs as the tables show them: ``nprobe=32``, ``nprobe=32, refine=4``."""
    knobs = [] if setting["param"] is None else [f"{setting['param']}={setting['value']}"]
    if setting.get("refine", 1) > 1:
        knobs.append(f"refine={setting['refine']}")
    if "pass" in setting:
        knobs.append(setting["pass"])
    return ", ".join(knobs)


def _index(row: dict[str, Any]) -> str:
    """A size's index as the tables show it, with ``(disk)`` for a bank whose vectors are on disk."""
    return row["factory"] + (" (disk)" if row.get("vectors") == "disk" else "")


def format_table(results: dict[str, Any]) -> str:
    """Markdown tables of the results (the form docs/benchmarks.md records): selection; raw faiss next to the bank's
    candidates, with the build, training and memory figures; then the reference."""
    c = results["config"]["candidates"]
    k = results["config"]["k"]
    lines = [f"| N | index | param | recall@{c} | policy | select K={k} p50 (ms) | p99 (ms) | "
             "candidates p50 (ms) | policy p50 (ms) |",
             "|---:|---|---|---:|---|---:|---:|---:|---:|"]
    for row in results["results"]:
        for s in row["settings"]:
            param = _param(s)
            for p in s["policies"]:
                name = p["policy"] if p["arch"] is None else f"{p['policy']} ({p['arch']})"
                lines.append(f"| {row['n']:,} | {_index(row)} | {param} | {s['recall_at_c']:.3f} | {name} | "
                             f"{p['p50_ms']:.3f} | {p['p99_ms']:.3f} | {p['candidates_p50_ms']:.3f} | "
                             f"{p['policy_p50_ms']:.3f} |")
    lines += ["", "| N | index | param | faiss alone p50 (ms) | p99 (ms) | bank candidates p50 (ms) | p99 (ms) | "
              "candidates / faiss p50 | p99 | soft-Q / similarity p50 | build (s) | train (s) | RSS built (MiB) | "
              "RSS end (MiB) | peak RSS (MiB) |",
              "|---:|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|"]

    def num(value: float | None, form: str = ".3f") -> str:
        return "" if value is None else format(value, form)

    for row in results["results"]:
        for s in row["settings"]:
            param = _param(s)
            raw, cand = s.get("faiss_alone") or {}, s.get("bank_candidates") or {}
            first = s.get("softq_over_similarity_first_pass_p50", {})
            ratios = ", ".join(f"{arch}: {r:.2f}x" + (f" (first pass {first[arch]:.2f}x)" if arch in first else "")
                               for arch, r in s.get("softq_over_similarity_p50", {}).items())
            over50, over99 = s.get("candidates_over_faiss_p50"), s.get("candidates_over_faiss_p99")
            lines.append(f"| {row['n']:,} | {_index(row)} | {param} | {num(raw.get('p50_ms'))} | "
                         f"{num(raw.get('p99_ms'))} | {num(cand.get('p50_ms'))} | {num(cand.get('p99_ms'))} | "
                         f"{num(over50, '.2f')}{'x' * (over50 is not None)} | "
                         f"{num(over99, '.2f')}{'x' * (over99 is not None)} | {ratios} | "
                         f"{num(row.get('build_s'), '.1f')} | {num(row.get('train_s'), '.1f')} | "
                         f"{num(row.get('rss_after_build_mib'), ',.0f')} | "
                         f"{num(row.get('rss_after_select_mib'), ',.0f')} | {num(row.get('peak_rss_mib'), ',.0f')} |")
    reads = [row for row in results["results"] if row.get("vector_reads")]
    if reads:
        lines += ["", f"| N | index | read {c} vectors: map p50 (ms) | p99 (ms) | SQLite p50 (ms) | p99 (ms) | "
                  "SQLite / map p50 |", "|---:|---|---:|---:|---:|---:|---:|"]
        for row in reads:
            r, mapped, sql = row["vector_reads"], row["vector_reads"]["map"], row["vector_reads"]["sqlite"]
            lines.append(f"| {row['n']:,} | {_index(row)} | {mapped['p50_ms']:.3f} | {mapped['p99_ms']:.3f} | "
                         f"{sql['p50_ms']:.3f} | {sql['p99_ms']:.3f} | {r['sqlite_over_map_p50']:.1f}x |")
    ref = results.get("reference")
    if ref:
        lines += ["", "| N | reference p50 (ms) | p99 (ms) | soft-Q arch | soft-Q p50 (ms) | ratio |",
                  "|---:|---:|---:|---|---:|---:|"]
        for arch, ms in ref["soft_q_p50_ms"].items():
            lines.append(f"| {ref['n']:,} | {ref['p50_ms']:,.1f} | {ref['p99_ms']:,.1f} | {arch} | {ms:.3f} | "
                         f"{ref['ratio'][arch]:,.0f}x |")
    return "\n".join(lines)
