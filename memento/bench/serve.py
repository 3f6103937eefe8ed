"""``memento bench serve``: the HTTP service at a large bank: select latency and feedback throughput.

A selector artifact with a bank of ``size`` cases is built once (random unit vectors, not encoded
texts: ``make_vectors`` of ``memento bench bank``, clustered by default; the bank records the real
encoder, all-MiniLM-L6-v2, and the index is ``factory``; ``memento.selector.export.create_selector`` adds a freshly
initialised Q-network, since latency does not depend on the weights), or reused from ``--artifact``.
Then a real ``memento serve`` runs in a subprocess (uvicorn on 127.0.0.1, bearer token) and client
threads in this process (one keep-alive ``http.client`` connection per thread) measure, end to end
over HTTP:

- ``POST /v1/select`` latency p50/p99 with 1 and 16 concurrent clients, by embedding (the JSON body
  carries a 384-float state) and by text (the server encodes the query with the real encoder; the texts
  are new to its persistent embedding cache, so each one is encoded);
- ``POST /v1/feedback`` throughput (acknowledged feedbacks/s, each committed by the single writer
  before its answer) with 1 and 16 clients, on the selection ids of the select phases; the server's
  recorded count is checked against the acknowledgements;
- optionally (``learn``) the same feedback throughput with a server started with ``--learn``, where
  the writer also makes the soft-Q learner's updates;
- the server's start (load + verify) and shutdown (drain + save) times.

Clients and server share the machine: on a 2-core box 16 client threads compete with the server for
CPU, so the 16-client latencies include queueing on both sides.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import logging
import os
import queue
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from memento.bank import CaseBank
from memento.bench.common import finish, make_vectors, timestamp, write_results
from memento.bench.select import faiss_torch_environment as base
from memento.config import (
    MAX_BATCH,
    MAX_BENCH_ITEMS,
    MAX_BENCH_VECTORS,
    MAX_K,
    MAX_SEED,
    MAX_THREADS,
    EncoderConfig,
    check,
    check_factory,
    check_float,
    check_int,
    check_int_tuple,
    check_ints,
)
from memento.selector.artifact.manifest import manifest_path
from memento.selector.export import create_selector
from memento.serve.app import TOKEN_ENV, require_extra
from memento.types import Case

__all__ = ["HttpClient", "ServeBenchConfig", "ServerProcess", "build_random_artifact", "format_serve_table",
           "run_clients", "run_serve_bench"]

logger = logging.getLogger(__name__)

_ADD_CHUNK = 10_000
_READY = re.compile(r"^memento serve: .* on (http://\S+) ")


# ---------------------------------------------------------------- the server subprocess


class ServerProcess:
    """``memento serve ARTIFACT`` in a subprocess on 127.0.0.1 and a free port.

    ``start()`` returns once the server printed its address (its socket listens); ``stop()`` sends
    SIGTERM (graceful: drain, save, exit 0) and returns the exit status. The server's stderr goes to
    ``log_path`` (read it with :meth:`log` when something fails).
    """

    def __init__(self, artifact: str | Path, *, token: str | None, args: Sequence[str] = (),
                 log_path: str | Path | None = None, env: dict[str, str] | None = None):
        self.artifact = Path(artifact)
        self.token = token
        self.args = list(args)
        self.log_path = Path(log_path) if log_path is not None else Path(tempfile.mkstemp(suffix=".log")[1])
        self.env = env
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""
        self.start_s = float("nan")

    @property
    def headers(self) -> dict[str, str]:
        return {} if self.token is None else {"Authorization": f"Bearer {self.token}"}

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def start(self, timeout: float = 180.0) -> ServerProcess:
        env = {**os.environ, **(self.env or {})}
        env.pop(TOKEN_ENV, None)
        auth = ["--no-auth"]
        if self.token is not None:
            env[TOKEN_ENV] = self.token
            auth = []
        cmd = [sys.executable, "-m", "memento.cli.entry", "serve", str(self.artifact), "--host", "127.0.0.1",
               "--port", "0", *auth, *self.args]
        t0 = time.perf_counter()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, env=env, text=True, bufsize=1)
        lines: queue.Queue[str | None] = queue.Queue()

        def pump() -> None:
            assert self.proc is not None and self.proc.stdout is not None
            for line in self.proc.stdout:
                lines.put(line)
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.kill()
                raise RuntimeError(f"memento serve did not start within {timeout:.0f} s; log:\n{self.log()}") from None
            if line is None:
                code = self.proc.wait()
                raise RuntimeError(f"memento serve exited with status {code} before listening; log:\n{self.log()}")
            match = _READY.match(line)
            if match:
                self.url = match.group(1)
                break
        self._wait_ready(deadline)
        self.start_s = time.perf_counter() - t0
        return self

    def _wait_ready(self, deadline: float) -> None:
        while True:
            try:
                with HttpClient(self.url, timeout=5) as client:
                    if client.request("GET", "/readyz")[0] == 200:  # warmed up: nothing timed waits for it
                        return
            except (OSError, http.client.HTTPException):
                pass
            if time.monotonic() > deadline or (self.proc is not None and self.proc.poll() is not None):
                raise RuntimeError(f"memento serve at {self.url} is not ready; log:\n{self.log()}")
            time.sleep(0.05)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 120.0) -> int:
        """Send ``sig`` and wait for the exit status."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise RuntimeError(f"memento serve did not stop within {timeout:.0f} s; log:\n{self.log()}") from None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.stop()
            except RuntimeError:
                logger.warning("memento serve had to be killed")


class HttpClient:
    """A minimal JSON client over one keep-alive ``http.client`` connection (stdlib only; one per thread).

    ``request`` returns ``(status, body)`` with the body parsed as JSON when it is JSON. A kept-alive
    connection that the server closed while idle is replaced and the request sent again (once).
    """

    def __init__(self, url: str, headers: dict[str, str] | None = None, timeout: float = 120.0):
        parts = urllib.parse.urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.headers = {"Content-Type": "application/json", **(headers or {})}
        self.timeout = timeout
        self._conn: http.client.HTTPConnection | None = None

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        payload = None if body is None else json.dumps(body).encode("utf-8")
        reused = self._conn is not None
        try:
            response, raw = self._send(method, path, payload)
        except (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected):
            if not reused:
                raise
            # a kept-alive connection the server closed while idle (uvicorn's keep-alive timeout):
            # the request never reached the application, so it is sent once more on a new connection
            response, raw = self._send(method, path, payload)
        if response.getheader("connection", "").lower() == "close":
            self.close()
        try:
            return response.status, json.loads(raw) if raw else None
        except ValueError:
            return response.status, raw.decode("utf-8", "replace")

    def _send(self, method: str, path: str, payload: bytes | None) -> tuple[http.client.HTTPResponse, bytes]:
        if self._conn is None:
            self._conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            self._conn.request(method, path, body=payload, headers=self.headers)
            response = self._conn.getresponse()
            return response, response.read()
        except (OSError, http.client.HTTPException):
            self.close()
            raise

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> HttpClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_clients(url: str, headers: dict[str, str], n_clients: int, requests: Sequence[tuple[str, str, Any]],
                *, on_response: Callable[[int, int, Any], None] | None = None) -> dict[str, Any]:
    """Send ``requests`` ((method, path, json) each) from ``n_clients`` threads, request ``i`` from thread
    ``i % n_clients``; returns per-request latencies (s), status codes and the wall time.

    ``on_response(i, status, body)`` is called in the client thread after each answer. A transport
    error (refused, reset) is recorded as status 0 and the thread goes on with its next request.
    """
    n = len(requests)
    latency_s = np.full(n, np.nan)
    status = np.zeros(n, dtype=np.int64)
    barrier = threading.Barrier(n_clients + 1)

    def client(c: int) -> None:
        with HttpClient(url, headers) as http_:
            barrier.wait()
            for i in range(c, n, n_clients):
                method, path, body = requests[i]
                t0 = time.perf_counter()
                try:
                    code, answer = http_.request(method, path, body)
                except (OSError, http.client.HTTPException):
                    continue
                latency_s[i] = time.perf_counter() - t0
                status[i] = code
                if on_response is not None:
                    on_response(i, code, answer)

    threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(n_clients)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return {"latency_s": latency_s, "status": status, "wall_s": time.perf_counter() - t0}


# ---------------------------------------------------------------- the artifact


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServeBenchConfig:
    """What ``memento bench serve`` measures.

    - ``size``: cases in the bank (random unit vectors of the real encoder's dim, 384); ``data``:
      ``"clustered"`` (like real embeddings) or ``"uniform"``; ``factory``: its faiss index;
    - ``k``: cases per select; ``clients``: concurrency levels for selects and feedback;
    - ``selects``: timed selects by embedding per concurrency level; ``text_selects``: by text (0 skips);
    - ``feedbacks``: timed feedbacks per concurrency level (needs that many selection ids from the
      select phases; more selects are made if needed, untimed);
    - ``learn``: also time feedback on a server started with ``--learn``;
    - ``server_threads``: ``--threads`` of the server (torch threads, and faiss OpenMP threads per
      request thread; 1: one request's search and scoring are too small to share out);
    - ``batch_max_texts`` / ``batch_wait_ms``: the server's ``--batch-max-texts`` / ``--batch-wait-ms``
      (``None``: its defaults);
    - ``warmup``: untimed requests before each timed phase;
    - ``workers``: the server's ``--workers`` for the select and record-only feedback phases, one run per
      value (the first is the main record; the learning run uses it too).
    """

    size: int = dataclasses.field(default=100_000, metadata={"help": "cases in the bank"})
    data: Literal["clustered", "uniform"] = dataclasses.field(default="clustered", metadata={"help": (
        "clustered vectors like real embeddings, or uniform on the sphere")})
    factory: str = dataclasses.field(default="HNSW32,Flat", metadata={"help": "faiss index of the bank"})
    k: int = dataclasses.field(default=4, metadata={"help": "cases per select"})
    clients: tuple[int, ...] = dataclasses.field(default=(1, 16), metadata={"help": "concurrent client threads"})
    selects: int = dataclasses.field(default=1000, metadata={"help": "timed selects by embedding per client count"})
    text_selects: int = dataclasses.field(default=200, metadata={"help": (
        "timed selects by text per client count (0 skips)")})
    feedbacks: int = dataclasses.field(default=1000, metadata={"help": "timed feedbacks per client count"})
    learn: bool = dataclasses.field(default=True, metadata={"help": (
        "also time the feedback of a learning server (memento serve --learn); --no-learn skips that run")})
    server_threads: int = dataclasses.field(default=1, metadata={"help": "the server's --threads"})
    batch_max_texts: int | None = dataclasses.field(default=None, metadata={"help": "the server's --batch-max-texts"})
    batch_wait_ms: float | None = dataclasses.field(default=None, metadata={"help": "the server's --batch-wait-ms"})
    warmup: int = dataclasses.field(default=20, metadata={"help": "untimed requests before each phase"})
    seed: int = dataclasses.field(default=0, metadata={"help": "random seed"})
    workers: tuple[int, ...] = dataclasses.field(default=(1,), metadata={"help": (
        "the server's --workers, one run of the select and feedback phases per value, recorded side by side, e.g. "
        "--workers 1 2")})

    def __post_init__(self) -> None:
        check_ints(self, size=(1, MAX_BENCH_VECTORS), k=(1, MAX_K), selects=(1, MAX_BENCH_ITEMS),
                   feedbacks=(1, MAX_BENCH_ITEMS), server_threads=(1, MAX_THREADS))
        check_ints(self, text_selects=(0, MAX_BENCH_ITEMS), warmup=(0, MAX_BENCH_ITEMS), seed=(0, MAX_SEED))
        check_int_tuple(self, "clients", 1, 1024)
        check_factory(self, "factory")
        check(bool(self.workers) and all(isinstance(w, int) and not isinstance(w, bool) and 1 <= w <= 64
                                          for w in self.workers), type(self), "workers", self.workers,
              "need integers in [1, 64]")
        check(self.data in ("uniform", "clustered"), type(self), "data", self.data, "must be uniform or clustered")
        check(self.k <= self.size, type(self), "k", self.k, f"must be <= size={self.size}")
        if self.batch_max_texts is not None:
            check_int(self, "batch_max_texts", 0, MAX_BATCH)
        if self.batch_wait_ms is not None:
            check_float(self, "batch_wait_ms", low=0.0, high=1000.0)


def build_random_artifact(out: str | Path, *, size: int, factory: str = "HNSW32,Flat",
                          data: str = "clustered", seed: int = 0, workdir: str | Path | None = None) -> Path:
    """An exported selector over a bank of ``size`` random unit vectors, with a fresh Q-network.

    The bank records the real encoder (all-MiniLM-L6-v2, dim 384), so text queries are encoded for
    real; its cases are ``make_vectors`` rows with short synthetic texts (encoding 100k texts would
    take minutes and change nothing the service measures). :func:`memento.selector.export.create_selector`
    makes the artifact (the latency does not depend on the Q-network's weights).
    """

    dim = 384  # all-MiniLM-L6-v2
    root = Path(tempfile.mkdtemp(prefix="memento-serve-artifact-", dir=workdir))
    try:
        rng = np.random.default_rng(seed)
        t0 = time.perf_counter()
        with CaseBank.create(root / "bank", dim, index=factory, encoder=EncoderConfig(), seed=seed) as bank:
            for start in range(0, size, _ADD_CHUNK):
                stop = min(size, start + _ADD_CHUNK)
                cases = [Case(state=f"synthetic case {i}: what is the capital of region {i}?",
                              action=f"answer {i}", reward=float(i % 2)) for i in range(start, stop)]
                bank.add(cases, make_vectors(rng, stop - start, dim, data))
        logger.info("bench serve: built a %d-case bank in %.1f s", size, time.perf_counter() - t0)
        return create_selector(root / "bank", out)
    finally:
        shutil.rmtree(root, ignore_errors=True)


# ---------------------------------------------------------------- timing


def _summary(run: dict[str, Any], *, ok: int = 200) -> dict[str, Any]:
    good = run["status"] == ok
    ms = run["latency_s"][good] * 1e3
    n = int(good.sum())
    out: dict[str, Any] = {"requests": int(len(run["status"])), "ok": n,
                           "errors": int(len(run["status"]) - n), "wall_s": run["wall_s"],
                           "per_s": n / run["wall_s"] if run["wall_s"] > 0 else float("nan")}
    if n:
        out.update({"p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)),
                    "mean_ms": float(ms.mean()), "max_ms": float(ms.max())})
    return out


def _texts(n: int, nonce: str) -> list[str]:
    """``n`` distinct task texts, new to the encoder's persistent embedding cache (``nonce`` differs per run),
    so every select by text runs the encoder."""
    return [f"new task {i} ({nonce}): which region has the capital named city {i}?" for i in range(n)]


def _select_phase(server: ServerProcess, clients: int, bodies: list[dict[str, Any]], warmup: int,
                  ids: list[str]) -> dict[str, Any]:
    if warmup:
        run_clients(server.url, server.headers, clients, [("POST", "/v1/select", b) for b in bodies[:warmup]],
                    on_response=lambda i, code, body: ids.append(body["selection_id"]) if code == 200 else None)
    got: list[str | None] = [None] * len(bodies)

    def keep(i: int, code: int, body: Any) -> None:
        if code == 200:
            got[i] = body["selection_id"]

    requests = [("POST", "/v1/select", b) for b in bodies]
    run = run_clients(server.url, server.headers, clients, requests, on_response=keep)
    ids.extend(i for i in got if i is not None)
    return _summary(run)


def _feedback_phase(server: ServerProcess, clients: int, ids: list[str], n: int, rng: np.random.Generator
                    ) -> dict[str, Any]:
    take, ids[:] = ids[:n], ids[n:]
    rewards = rng.integers(0, 2, size=len(take)).astype(float)
    requests = [("POST", "/v1/feedback", {"selection_id": s, "reward": r}) for s, r in zip(take, rewards)]
    return _summary(run_clients(server.url, server.headers, clients, requests))


def _stats(server: ServerProcess) -> dict[str, Any]:
    """The learner's /v1/stats (with ``--workers`` > 1 any process may answer: asked again until the learner
    does; its writer counts are the server's)."""
    for _ in range(200):
        with HttpClient(server.url, server.headers) as client:
            code, body = client.request("GET", "/v1/stats")
        if code != 200:
            raise RuntimeError(f"GET /v1/stats answered {code}: {body}")
        if body["server"].get("process", {}).get("role", "learner") == "learner":
            return body
    raise RuntimeError("GET /v1/stats: the learner process never answered")


def _ensure_ids(server: ServerProcess, ids: list[str], need: int, queries_QD: np.ndarray, k: int) -> None:
    """Untimed selects until ``need`` selection ids are pending."""
    missing = need - len(ids)
    if missing <= 0:
        return
    bodies = [{"embedding": queries_QD[i % len(queries_QD)].tolist(), "k": k} for i in range(missing)]
    _select_phase(server, 4, bodies, 0, ids)


def _serve_run(config: ServeBenchConfig, artifact: Path, queries_QD: np.ndarray, *, learn: bool, token: str,
               log_path: Path, rng: np.random.Generator, workers: int = 1) -> dict[str, Any]:
    args = ["--threads", str(config.server_threads), "--save-every-s", "0", "--save-every-n", "0",
            "--workers", str(workers)]
    if config.batch_max_texts is not None:
        args += ["--batch-max-texts", str(config.batch_max_texts)]
    if config.batch_wait_ms is not None:
        args += ["--batch-wait-ms", repr(config.batch_wait_ms)]
    if learn:
        args.append("--learn")
    server = ServerProcess(artifact, token=token, args=args, log_path=log_path)
    out: dict[str, Any] = {"learn": learn, "workers": workers}
    server.start()
    try:
        out["start_s"] = server.start_s
        ids: list[str] = []
        if not learn:
            out["select_embedding"], out["select_text"] = {}, {}
            for clients in config.clients:
                bodies = [{"embedding": q.tolist(), "k": config.k} for q in queries_QD[:config.selects]]
                out["select_embedding"][str(clients)] = _select_phase(server, clients, bodies, config.warmup, ids)
                logger.info("bench serve: select by embedding, %d client(s): %s", clients,
                            out["select_embedding"][str(clients)])
                if config.text_selects:
                    texts = _texts(config.text_selects, f"{secrets.token_hex(4)}-{clients}")
                    bodies = [{"query": t, "k": config.k} for t in texts]
                    one = workers == 1  # several processes batch apart: the learner's counts are not the phase's
                    before = _stats(server)["server"].get("encode_batching") if one else None
                    phase = _select_phase(server, clients, bodies, config.warmup, ids)
                    after = _stats(server)["server"].get("encode_batching") if one else None
                    if before is not None and after is not None:  # forwards of this phase (warm-up included)
                        forwards = after["batches"] - before["batches"]
                        phase["forwards"] = forwards
                        phase["texts_per_forward"] = (after["texts"] - before["texts"]) / forwards if forwards else 0.0
                    out["select_text"][str(clients)] = phase
                    logger.info("bench serve: select by text, %d client(s): %s", clients,
                                out["select_text"][str(clients)])
        out["feedback"] = {}
        before = _stats(server)
        acknowledged = 0
        for clients in config.clients:
            _ensure_ids(server, ids, config.feedbacks, queries_QD, config.k)
            phase = _feedback_phase(server, clients, ids, config.feedbacks, rng)
            acknowledged += phase["ok"]
            out["feedback"][str(clients)] = phase
            logger.info("bench serve: feedback (learn=%s), %d client(s): %s", learn, clients, phase)
        after = _stats(server)
        out["recorded_feedback"] = after["server"]["recorded_feedback"] - before["server"]["recorded_feedback"]
        out["acknowledged_feedback"] = acknowledged
        out["selector_stats"] = {k: v for k, v in after.items() if k != "server"}
        if "encode_batching" in after["server"] and workers == 1:
            out["encode_batching"] = after["server"]["encode_batching"]
    finally:
        t0 = time.perf_counter()
        code = server.stop()
        out["shutdown_s"] = time.perf_counter() - t0
        out["exit_status"] = code
    return out


def _environment() -> dict[str, Any]:
    import fastapi
    import uvicorn

    return {**base(), "fastapi": fastapi.__version__, "uvicorn": uvicorn.__version__,
            "server": "memento serve subprocess (uvicorn; --workers processes on one socket) on 127.0.0.1; "
                      "clients: threads in the bench process, one keep-alive http.client connection each"}


def run_serve_bench(config: ServeBenchConfig, *, out: str | Path | None = None, artifact: str | Path | None = None,
                    workdir: str | Path | None = None) -> dict[str, Any]:
    """Run the benchmark; returns (and writes to ``out`` as it goes) the results document.

    ``artifact``: an exported selector to reuse, or where to build one (kept); ``None`` builds one in a
    temporary directory that is removed afterwards.
    """

    require_extra("serve")
    rng = np.random.default_rng(config.seed)
    results: dict[str, Any] = {"benchmark": "serve", "config": dataclasses.asdict(config),
                               "environment": _environment(), "started": timestamp()}
    root = Path(tempfile.mkdtemp(prefix="memento-bench-serve-", dir=workdir))
    try:
        path = Path(artifact) if artifact is not None else root / "artifact"
        if manifest_path(path).exists():
            results["artifact"] = {"path": str(path), "reused": True}
        else:
            t0 = time.perf_counter()
            build_random_artifact(path, size=config.size, factory=config.factory, data=config.data,
                                  seed=config.seed, workdir=root)
            results["artifact"] = {"path": str(path), "reused": False, "build_s": time.perf_counter() - t0}
        results["artifact"]["bytes"] = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        dim = 384
        queries_QD = make_vectors(rng, max(config.selects, config.feedbacks) + config.warmup, dim, config.data)
        token = secrets.token_urlsafe(32)
        first, *others = config.workers
        results["record"] = _serve_run(config, path, queries_QD, learn=False, token=token,
                                       log_path=root / "serve.log", rng=rng, workers=first)
        results["scaling"] = scaling(results["record"], config.clients)
        if out is not None:
            write_results(out, results)
        if others:  # the same runs with other --workers counts
            results["by_workers"] = {str(first): {"record": results["record"], "scaling": results["scaling"]}}
            for workers in others:
                run = _serve_run(config, path, queries_QD, learn=False, token=token,
                                 log_path=root / f"serve-{workers}.log", rng=rng, workers=workers)
                results["by_workers"][str(workers)] = {"record": run, "scaling": scaling(run, config.clients)}
                if out is not None:
                    write_results(out, results)
        if config.learn:
            results["learn"] = _serve_run(config, path, queries_QD, learn=True, token=token,
                                          log_path=root / "serve-learn.log", rng=rng, workers=first)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return finish(results, out)


SCALING_TARGETS = {"select_text": 3.0, "select_embedding": 1.5}
"""Throughput with the most clients over throughput with the fewest that the service should reach
(the project's target: 16 vs 1 client on 2 cores)."""


def scaling(record: dict[str, Any], clients: Sequence[int]) -> dict[str, Any]:
    """Per select kind: throughput and p50/p99 at the fewest and the most clients, their throughput ratio,
    and whether it reaches :data:`SCALING_TARGETS` (only when those are 1 and 16 clients)."""
    lo, hi = str(min(clients)), str(max(clients))
    out: dict[str, Any] = {}
    for kind, target in SCALING_TARGETS.items():
        phases = record.get(kind, {})
        if lo == hi or lo not in phases or hi not in phases:
            continue
        a, b = phases[lo], phases[hi]
        ratio = b["per_s"] / a["per_s"] if a["per_s"] > 0 else float("nan")
        out[kind] = {"clients": [int(lo), int(hi)], "per_s": [a["per_s"], b["per_s"]],
                     "p50_ms": [a.get("p50_ms"), b.get("p50_ms")], "p99_ms": [a.get("p99_ms"), b.get("p99_ms")],
                     "ratio": ratio, "target": target if (lo, hi) == ("1", "16") else None,
                     "meets_target": bool(ratio >= target) if (lo, hi) == ("1", "16") else None}
    return out


def format_serve_table(results: dict[str, Any]) -> str:
    """Markdown tables (the form docs/benchmarks.md records): select latency, then feedback throughput."""
    c = results["config"]
    rec = results["record"]
    lines = [f"bank of {c['size']:,} cases ({c['factory']}), K={c['k']}, over HTTP on 127.0.0.1:", "",
             "| request | clients | p50 (ms) | p99 (ms) | requests/s | errors |", "|---|---:|---:|---:|---:|---:|"]
    for kind, label in (("select_embedding", "select by embedding"), ("select_text", "select by text")):
        for clients, s in rec.get(kind, {}).items():
            lines.append(f"| {label} | {clients} | {s.get('p50_ms', float('nan')):.2f} | "
                         f"{s.get('p99_ms', float('nan')):.2f} | {s['per_s']:,.0f} | {s['errors']} |")
    for run in ("record", "learn"):
        if run not in results:
            continue
        label = "feedback (learn)" if run == "learn" else "feedback (record)"
        for clients, s in results[run]["feedback"].items():
            lines.append(f"| {label} | {clients} | {s.get('p50_ms', float('nan')):.2f} | "
                         f"{s.get('p99_ms', float('nan')):.2f} | {s['per_s']:,.0f} | {s['errors']} |")
    if results.get("scaling"):
        lines += ["", "| select | clients | requests/s | p50 (ms) | p99 (ms) | throughput ratio | target |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for kind, label in (("select_text", "by text"), ("select_embedding", "by embedding")):
            sc = results["scaling"].get(kind)
            if sc is None:
                continue
            met = "met" if sc["meets_target"] else "missed"
            target = "" if sc["target"] is None else f">= {sc['target']:g}x ({met})"
            lines.append(f"| {label} | {sc['clients'][0]} -> {sc['clients'][1]} | {sc['per_s'][0]:,.0f} -> "
                         f"{sc['per_s'][1]:,.0f} | {_ms(sc['p50_ms'][0])} -> {_ms(sc['p50_ms'][1])} | "
                         f"{_ms(sc['p99_ms'][0])} -> {_ms(sc['p99_ms'][1])} | {sc['ratio']:.2f}x | {target} |")
        batching = rec.get("encode_batching")
        if batching:
            per = ", ".join(f"{s['texts_per_forward']:.1f} with {c} client(s)"
                            for c, s in rec.get("select_text", {}).items() if "texts_per_forward" in s)
            lines.append(f"\ntext encoding: {batching['texts']} text(s) in {batching['batches']} forward pass(es) "
                         f"(texts per forward: {per or '-'}; largest {batching['max_batch_texts']}; "
                         f"--batch-max-texts {batching['max_texts']}, --batch-wait-ms {batching['wait_ms']:g})")
    if results.get("by_workers"):
        lo, hi = min(c["clients"]), max(c["clients"])
        lines += ["", f"| --workers | select | requests/s at {lo} -> {hi} clients | p50 (ms) | p99 (ms) | ratio | "
                      "feedback/s (record) |", "|---:|---|---:|---:|---:|---:|---:|"]
        for workers, run in results["by_workers"].items():
            fb = run["record"].get("feedback", {}).get(str(hi), {})
            for kind, label in (("select_text", "by text"), ("select_embedding", "by embedding")):
                sc = run["scaling"].get(kind)
                if sc is None:
                    continue
                lines.append(f"| {workers} | {label} | {sc['per_s'][0]:,.0f} -> {sc['per_s'][1]:,.0f} | "
                             f"{_ms(sc['p50_ms'][0])} -> {_ms(sc['p50_ms'][1])} | {_ms(sc['p99_ms'][0])} -> "
                             f"{_ms(sc['p99_ms'][1])} | {sc['ratio']:.2f}x | {fb.get('per_s', float('nan')):,.0f} |")
    lines += ["", "| server | start (load + verify) s | shutdown (drain + save) s | acknowledged | recorded |",
              "|---|---:|---:|---:|---:|"]
    for run in ("record", "learn"):
        if run in results:
            r = results[run]
            lines.append(f"| {'--learn' if r['learn'] else 'record only'} | {r['start_s']:.1f} | {r['shutdown_s']:.1f} "
                         f"| {r['acknowledged_feedback']} | {r['recorded_feedback']} |")
    return "\n".join(lines)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"
