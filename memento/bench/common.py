"""What the benchmarks share: the results document's file and timestamps, the machine, random unit vectors, exact top-k.

Every ``memento bench ...`` writes one JSON document (:func:`write_results`, rewritten as it goes) with
``started``/``finished`` timestamps (:func:`timestamp`, :func:`finish`) and an ``environment`` describing the
machine (:func:`environment`). The vector benchmarks draw their bank and query vectors with
:func:`make_vectors` and measure recall against :func:`exact_topk`; a benchmark that must not hold its whole base
set draws it chunk by chunk with :func:`vector_chunks` (each chunk from its own generator, :func:`chunk_rng`, so
any chunk can be drawn again) and streams the exact top-k over the chunks with :func:`exact_topk_chunks`. The
LLM benchmarks take their encoder and planner from :func:`default_models`.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, get_args

import numpy as np

from memento.io import atomic_write_text

__all__ = ["chunk_rng", "default_models", "distinct_choices", "environment", "exact_topk", "exact_topk_chunks",
           "finish", "make_vectors", "memory_mib", "timestamp", "vector_chunks", "write_results"]


def timestamp() -> str:
    """The local time as the results documents record it (``2024-01-31T12:00:00``)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S")


def write_results(path: str | Path, results: dict[str, Any]) -> None:
    """Write the results document (indented JSON) atomically."""
    atomic_write_text(path, json.dumps(results, indent=2) + "\n")


def finish(results: dict[str, Any], out: str | Path | None) -> dict[str, Any]:
    """Stamp ``finished`` (and ``loadavg_end`` where the environment recorded ``loadavg_start``), write the
    document to ``out`` when given; returns ``results``."""
    results["finished"] = timestamp()
    if "loadavg_start" in results.get("environment", {}):
        results["environment"]["loadavg_end"] = list(os.getloadavg())
    if out is not None:
        write_results(out, results)
    return results


def environment() -> dict[str, Any]:
    """Python, the machine, its CPUs, and the faiss and numpy versions with faiss's thread count."""
    import faiss

    return {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
            "faiss": faiss.__version__, "numpy": np.__version__, "faiss_omp_threads": faiss.omp_get_max_threads()}


def distinct_choices(values: tuple[Any, ...], choices: Any) -> bool:
    """``values`` is non-empty, without repeats, each one of the ``Literal`` type ``choices`` (a config's list of
    architectures, trainers, ...)."""
    return bool(values) and all(v in get_args(choices) for v in values) and len(set(values)) == len(values)


def make_vectors(rng: np.random.Generator, n: int, dim: int, data: str) -> np.ndarray:
    """``n`` unit vectors, seeded by ``rng``.

    ``uniform``: uniform on the sphere, the worst case for any approximate index (no structure).
    ``clustered``: like real sentence embeddings, low intrinsic dimension: 1,000 clusters in a
    32-dimensional latent space, spread within each cluster, mapped into ``dim`` dimensions by a
    fixed random rotation, plus a little ambient noise. The rotation and centres are drawn from
    a generator seeded with 0, so base vectors and queries share them.
    """
    if data == "uniform":
        x = rng.standard_normal((n, dim), dtype=np.float32)
    else:
        latent = min(32, dim)
        shared = np.random.default_rng(0)
        basis, _ = np.linalg.qr(shared.standard_normal((dim, latent)))
        centers = shared.standard_normal((1000, latent)).astype(np.float32)
        z = centers[rng.integers(0, len(centers), size=n)] + 0.5 * rng.standard_normal((n, latent), dtype=np.float32)
        x = z @ basis.T.astype(np.float32) + 0.02 * rng.standard_normal((n, dim), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x.astype(np.float32, copy=False)


def chunk_rng(seed: int, stream: int, n: int, index: int) -> np.random.Generator:
    """The generator of chunk ``index`` of a set of ``n`` vectors in ``stream`` (say 0: base set, 1: queries), from
    ``seed``: a function of these four integers only, so a chunk can be drawn again without the chunks before it."""
    return np.random.default_rng([seed, stream, n, index])


def vector_chunks(seed: int, stream: int, n: int, dim: int, data: str, chunk: int) -> Iterator[tuple[int, np.ndarray]]:
    """``n`` unit vectors as ``(start, vectors_MD)`` chunks of at most ``chunk`` rows, positions ``start..start+M-1``.

    Chunk ``i`` is :func:`make_vectors` (same ``uniform`` / ``clustered`` distributions) of ``min(chunk, n - start)``
    rows drawn from its own generator, :func:`chunk_rng` ``(seed, stream, n, i)``; only one chunk exists at a time.
    The vectors are a function of ``(seed, stream, n, dim, data, chunk)``: two iterations give identical chunks, and
    so does drawing chunk ``i`` alone. They are not the rows a single :func:`make_vectors` call of ``n`` would draw
    (that one draws all ``n`` cluster indices with ``rng.integers`` first, then the noise, from one generator), nor
    is the set of size ``n`` a prefix of a larger one (``n`` seeds the generators).
    """
    for index, start in enumerate(range(0, n, chunk)):
        yield start, make_vectors(chunk_rng(seed, stream, n, index), min(chunk, n - start), dim, data)


def exact_topk_chunks(chunks: Iterable[tuple[int, np.ndarray]], queries_QD: np.ndarray, k: int) -> np.ndarray:
    """:func:`exact_topk` streamed over ``(start, vectors_MD)`` chunks (as :func:`vector_chunks` yields them): a
    running top-``k`` per query, so only one chunk and ``Q x (chunk + 2k)`` scores exist at a time. Returns the
    positions of each query's ``min(k, total)`` highest inner products, best first (ties: the lower position)."""
    q = len(queries_QD)
    best_s = np.full((q, 0), -np.inf, dtype=np.float32)
    best_p = np.zeros((q, 0), dtype=np.int64)
    for start, chunk_MD in chunks:
        m = len(chunk_MD)
        if m == 0:
            continue
        kk = min(k, m)
        top_s = np.empty((q, kk), dtype=np.float32)
        top_p = np.empty((q, kk), dtype=np.int64)
        for b in range(0, q, 64):  # at most 64 x chunk scores at once
            sims = queries_QD[b:b + 64] @ chunk_MD.T
            top = np.argpartition(-sims, kk - 1, axis=1)[:, :kk] if kk < m else np.tile(np.arange(m), (len(sims), 1))
            top_s[b:b + 64] = np.take_along_axis(sims, top, axis=1)
            top_p[b:b + 64] = top + start
        all_s = np.concatenate([best_s, top_s], axis=1)
        all_p = np.concatenate([best_p, top_p], axis=1)
        order = np.lexsort((all_p, -all_s), axis=1)[:, :k]  # by score, then by position
        best_s = np.take_along_axis(all_s, order, axis=1)
        best_p = np.take_along_axis(all_p, order, axis=1)
    return best_p


def exact_topk(base_ND: np.ndarray, queries_QD: np.ndarray, k: int) -> np.ndarray:
    """The positions of each query's ``k`` highest inner products in ``base_ND``, best first (Q x k)."""
    out = np.empty((len(queries_QD), k), dtype=np.int64)
    for start in range(0, len(queries_QD), 64):
        sims = queries_QD[start:start + 64] @ base_ND.T
        top = np.argpartition(-sims, k - 1, axis=1)[:, :k]
        order = np.argsort(-np.take_along_axis(sims, top, axis=1), axis=1)
        out[start:start + 64] = np.take_along_axis(top, order, axis=1)
    return out


def default_models(planner_spec: str, encoder: Any | None, planner: Any | None) -> tuple[Any, Any]:
    """The encoder and planner of a benchmark: the default encoder when ``encoder`` is ``None``, the planner of
    ``planner_spec`` when ``planner`` is ``None``."""
    if encoder is None:
        from memento.encoders import Encoder

        encoder = Encoder.from_pretrained()
    if planner is None:
        from memento.planners.spec import build_planner, parse_planner_spec

        planner = build_planner(parse_planner_spec(planner_spec))
    return encoder, planner


def memory_mib(pid: int | str = "self") -> dict[str, float | None]:
    """Process ``pid``'s resident memory now (``VmRSS``; its anonymous and file-backed parts ``RssAnon``,
    ``RssFile``) and its peak so far (``VmHWM``, counted from its last exec) in MiB, from ``/proc/PID/status``
    (None where there is none, or the process is gone)."""
    found: dict[str, float | None] = {"VmRSS": None, "VmHWM": None, "RssAnon": None, "RssFile": None}
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as status:
            for line in status:
                key, _, value = line.partition(":")
                if key in found and value.strip().endswith("kB"):
                    found[key] = int(value.split()[0]) / 1024
    except (OSError, ValueError):
        pass
    return {"rss_mib": found["VmRSS"], "peak_rss_mib": found["VmHWM"], "rss_anon_mib": found["RssAnon"],
            "rss_file_mib": found["RssFile"]}
