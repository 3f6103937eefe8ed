"""What ``memento serve`` (:mod:`memento.serve.app`), its FastAPI layer (:mod:`memento.serve.http`), the read-only
worker processes (:mod:`memento.serve.worker`) and the MCP tools share: the service config (:class:`ServeConfig`,
:data:`MAX_SERVE_WORKERS`), the single writer thread (:class:`Writer`), the learner's link to the workers
(:class:`LearnerLink`), token redaction in logs and the request-time helpers (:func:`token_matches`,
:func:`case_record`, :func:`json_safe`, :func:`thread_limiter`).

This module sits below all of them (``app``, ``http``, ``worker`` and ``schema`` import it; it imports none of them)
and imports nothing optional. :mod:`memento.serve.app` re-exports the names callers use. Its records go to the
``memento.serve.app`` logger, as they did before this module was split off."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hmac
import logging
import math
import queue
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from memento.config import check, check_float, check_int, check_ints
from memento.errors import MementoError

__all__ = ["MAX_SERVE_WORKERS", "LearnerLink", "ServeConfig", "ServerUnavailableError", "TokenRedactor", "Writer",
           "case_record", "json_safe", "redact", "redact_server_logs", "thread_limiter", "token_matches"]

logger = logging.getLogger("memento.serve.app")


MAX_SERVE_WORKERS = 64
"""The most server processes ``memento serve --workers N`` may run on one machine (``ServeConfig.workers``)."""


class ServerUnavailableError(MementoError):
    """The writer cannot take a write now: its queue is full or it is shutting down (HTTP 503)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServeConfig:
    """How the service runs (the token is a secret and is passed separately, never stored here).

    - ``max_body_bytes``: larger request bodies are refused with 413 before they are parsed;
    - ``max_k``: the largest ``k`` a select may ask for; ``max_text_chars``: the longest query, state or
      action text; ``max_embedding_dim``: the longest embedding accepted (the selector checks the exact dim);
    - ``queue_size``: writes waiting for the writer before new ones get 503;
    - ``save_every_s`` / ``save_every_n``: checkpoint when this many seconds passed, or this many writes
      arrived, since the last save (0 disables that trigger); always once more on shutdown;
    - ``graceful_timeout_s``: how long shutdown waits for in-flight requests before cancelling them;
    - ``threads``: OpenMP threads faiss may use in each request thread and in the writer (0: faiss's
      default, one per core). One request searches for one query: nothing to share out, and on a small
      machine the idle OpenMP threads of every request thread spin against each other (a 100-case
      select measured 14 ms instead of 1 ms on 2 busy cores). torch's thread count is process-wide and
      left to the caller (the CLI sets it from ``--threads``);
    - ``batch_max_texts`` / ``batch_wait_ms``: text encoding (queries, new cases' states) goes through one
      dynamic batcher (:class:`memento.selector.batching.EncodeBatcher`): concurrent texts are encoded together, up to
      ``batch_max_texts`` in one forward pass, the first waiting at most ``batch_wait_ms`` ms for others
      (0 ms: only those already queued). ``batch_max_texts=0`` switches batching off (each request thread
      encodes its own text, one at a time);
    - ``workers``: server processes accepting on the one listening socket (``memento serve --workers N``): the
      learner (this process: feedback, new cases, learning, checkpoints) and ``workers - 1`` read-only
      worker processes that answer selects and reads and forward writes to the learner (1: one process);
    - ``publish_every_s``: with several workers, the learner publishes its Q-network for them at most this
      often after it changed (0: after every update), and at every checkpoint;
    - ``warmup``: on start, one untracked greedy select (nothing written) loads and runs the encoder and the
      Q-network in the background; ``GET /readyz`` answers 503 until it returned, then 200 (``/healthz`` is
      liveness: 200 as soon as the server answers). ``False`` (``memento serve --no-warmup``): ready at once,
      and the first select pays the loading.
    """

    max_body_bytes: int = dataclasses.field(default=1 << 20, metadata={"help": (
        "largest request body accepted; larger ones get 413")})
    max_k: int = 64
    max_text_chars: int = 32_768
    max_embedding_dim: int = 8192
    queue_size: int = 10_000
    save_every_s: float = dataclasses.field(default=60.0, metadata={"help": (
        "checkpoint when S seconds passed since the last one and something changed (0: off)")})
    save_every_n: int = dataclasses.field(default=1000, metadata={"help": (
        "checkpoint after N writes (feedback + cases) (0: off)")})
    graceful_timeout_s: float = 30.0
    threads: int = dataclasses.field(default=1, metadata={"help": (
        "torch threads (torch.set_num_threads) and faiss OpenMP threads per request thread (1: a request scores a "
        "few dozen candidates, and idle threads of concurrent requests spin against each other; 0: the libraries' "
        "defaults)")})
    batch_max_texts: int = dataclasses.field(default=32, metadata={"help": (
        "dynamic batching of text encoding: concurrent query texts are encoded together, up to N in one forward "
        "pass (0: off, each request encodes its own text, one at a time)")})
    batch_wait_ms: float = dataclasses.field(default=2.0, metadata={"help": (
        "how long the first text of a batch waits for others, in ms (0: only the texts already queued; under load "
        "the queue fills while a batch runs)")})
    workers: int = dataclasses.field(default=1, metadata={"help": (
        "server processes accepting on the port: this one, which records feedback and new cases, learns and saves, "
        "and N-1 read-only workers that answer selects and reads and forward writes to it (each worker loads its "
        "own copy of the bank's vectors, index and encoder)")})
    publish_every_s: float = dataclasses.field(default=1.0, metadata={"help": (
        "with --workers > 1: publish the learner's Q-network to the workers at most every S seconds after it "
        "changed, and at every checkpoint (0: after every update)")})
    warmup: bool = dataclasses.field(default=True, metadata={"help": (
        "warm up in the background on start (/readyz answers 503 until done); --no-warmup: skip the start-up "
        "warm-up select, /readyz answers 200 at once and the first select loads the encoder")})

    def __post_init__(self) -> None:
        check_ints(self, max_body_bytes=1, max_k=1, max_text_chars=1, max_embedding_dim=1, queue_size=1,
                   save_every_n=0, threads=0, batch_max_texts=0)
        check_float(self, "batch_wait_ms", low=0.0, high=1000.0)
        check_float(self, "save_every_s", low=0.0)
        check_float(self, "graceful_timeout_s", low=0.0)
        check_int(self, "workers", 1)
        check(self.workers <= MAX_SERVE_WORKERS, type(self), "workers", self.workers, f"must be <= {MAX_SERVE_WORKERS}")
        check_float(self, "publish_every_s", low=0.0)
        check(isinstance(self.warmup, bool), type(self), "warmup", self.warmup, "must be true or false")


def thread_limiter(threads: int) -> Callable[[], None]:
    """A function to call at the start of work in any thread: the first call in each thread sets faiss's
    OpenMP thread count there to ``threads`` (OpenMP settings are per calling thread; 0 does nothing)."""
    local = threading.local()

    def limit() -> None:
        if threads and not getattr(local, "done", False):
            local.done = True
            try:
                import faiss
            except ImportError:  # pragma: no cover - faiss is a core dependency
                return
            faiss.omp_set_num_threads(threads)

    return limit


# ---------------------------------------------------------------- the single writer


_JobKind = Literal["feedback", "case", "delete", "replace", "update", "delete_all"]


@dataclasses.dataclass
class _Job:
    kind: _JobKind
    args: dict[str, Any]
    future: concurrent.futures.Future[Any]


class Writer:
    """The one thread that writes to the selector: feedback, new cases, and checkpoints.

    ``submit_*`` enqueue a write and return a ``concurrent.futures.Future`` that resolves after the
    selector recorded it (or holds the selector's error). ``stop()`` refuses new writes, drains the
    queue, saves once more, and joins the thread; it is idempotent.
    """

    def __init__(self, selector: Any, config: ServeConfig | None = None, *,
                 clock: Callable[[], float] = time.monotonic, publish: bool = False):
        self.selector = selector
        self.config = config or ServeConfig()
        self._clock = clock
        self._queue: queue.Queue[_Job | None] = queue.Queue(maxsize=self.config.queue_size)
        self._accepting = True
        self._submit_lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memento-writer", daemon=True)
        self._unsaved = 0
        self._last_save = clock()
        self.counts = {"feedback": 0, "cases": 0, "errors": 0, "saves": 0, "save_errors": 0}
        self.last_save_error: str | None = None
        self.last_save_time: float | None = None
        # publish the policy for worker processes (``selector.publish_policy``), the version already out
        self._publish = publish
        self._published = int(selector.policy_version) if publish else None
        self._last_publish = clock()
        self.counts.update({"publishes": 0, "publish_errors": 0} if publish else {})

    def start(self) -> Writer:
        self._thread.start()
        return self

    @property
    def queued(self) -> int:
        return self._queue.qsize()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def _submit(self, kind: _JobKind, args: dict[str, Any]) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._submit_lock:  # no write slips in after stop() closed the door
            if not self._accepting or not self._thread.is_alive():
                raise ServerUnavailableError("the server is shutting down; the write was not recorded")
            try:
                self._queue.put_nowait(_Job(kind, args, future))
            except queue.Full:
                raise ServerUnavailableError(f"the write queue is full ({self.config.queue_size} writes waiting); "
                                             "retry later") from None
        return future

    def submit_feedback(self, selection_id: str, reward: float) -> concurrent.futures.Future[Any]:
        return self._submit("feedback", {"selection_id": selection_id, "reward": reward})

    def submit_case(self, state: str, action: str, reward: float, env: str | None = None,
                    meta: dict[str, Any] | None = None, embedding: Any = None,
                    scope: dict[str, Any] | None = None) -> concurrent.futures.Future[Any]:
        args = {"state": state, "action": action, "reward": reward, "env": env, "meta": meta, "scope": scope}
        if embedding is not None:  # else the selector encodes the state
            args["embedding"] = embedding
        return self._submit("case", args)

    def submit_delete(self, case_id: str) -> concurrent.futures.Future[Any]:
        """Delete a case (``Selector.delete_case``: committed and checkpointed when the future resolves)."""
        return self._submit("delete", {"case_id": case_id})

    def submit_replace(self, case_id: str, state: str, action: str, reward: float, env: str | None = None,
                       meta: dict[str, Any] | None = None, embedding: Any = None,
                       scope: dict[str, Any] | None = None) -> concurrent.futures.Future[Any]:
        """Supersede a case by a new one (``Selector.replace_case``); the future holds the new id."""
        args = {"case_id": case_id, "state": state, "action": action, "reward": reward, "env": env, "meta": meta,
                "scope": scope}
        if embedding is not None:
            args["embedding"] = embedding
        return self._submit("replace", args)

    def submit_update(self, case_id: str, *, action: str | None = None, reward: float | None = None,
                      meta: dict[str, Any] | None = None, state: str | None = None) -> concurrent.futures.Future[Any]:
        """Change a case in place (``Selector.update_case``); the future holds the case as stored now."""
        return self._submit("update", {"case_id": case_id, "action": action, "reward": reward, "meta": meta,
                                       "state": state})

    def submit_delete_all(self, *, env: str | None = None, scope: dict[str, Any] | None = None,
                          filter: dict[str, Any] | None = None, all: bool = False) -> concurrent.futures.Future[Any]:
        """Delete the cases of a scope or filter (``Selector.delete_all``: committed and checkpointed when the future
        resolves); the future holds ``{"deleted", "replay_slots_masked"}``."""
        return self._submit("delete_all", {"env": env, "scope": scope, "filter": filter, "all": all})

    def _run(self) -> None:
        thread_limiter(self.config.threads)()
        poll = 0.5
        if self.config.save_every_s:
            poll = min(poll, self.config.save_every_s)
        if self._publish and self.config.publish_every_s:
            poll = min(poll, self.config.publish_every_s)
        while True:
            try:
                job = self._queue.get(timeout=poll)
            except queue.Empty:
                self._maybe_save()
                self._maybe_publish()
                continue
            if job is None:  # stop(): everything queued before the sentinel is done
                break
            self._do(job)
            self._maybe_save()
            self._maybe_publish()
        self._save("shutdown")
        self._stopped.set()

    def _do(self, job: _Job) -> None:
        if not job.future.set_running_or_notify_cancel():
            return
        try:
            if job.kind == "feedback":
                result = self.selector.feedback(job.args["selection_id"], job.args["reward"])
                self.counts["feedback"] += 1
            elif job.kind == "delete":
                result = self.selector.delete_case(job.args["case_id"])
                self.counts["deleted"] = self.counts.get("deleted", 0) + 1
            elif job.kind == "replace":
                result = self.selector.replace_case(**job.args)
                self.counts["replaced"] = self.counts.get("replaced", 0) + 1
            elif job.kind == "update":
                case_id = job.args["case_id"]
                result = self.selector.update_case(case_id, **{k: v for k, v in job.args.items() if k != "case_id"})
                self.counts["updated"] = self.counts.get("updated", 0) + 1
            elif job.kind == "delete_all":
                result = self.selector.delete_all(**job.args)
                self.counts["deleted"] = self.counts.get("deleted", 0) + int(result.get("deleted", 0))
            else:
                result = self.selector.add_case(**job.args)
                self.counts["cases"] += 1
        except BaseException as error:  # noqa: BLE001 - handed to the waiting request, never lost
            self.counts["errors"] += 1
            job.future.set_exception(error)
            return
        self._unsaved += 1
        job.future.set_result(result)

    def _maybe_save(self) -> None:
        if not self._unsaved:
            return
        c = self.config
        due_n = c.save_every_n and self._unsaved >= c.save_every_n
        due_s = c.save_every_s and self._clock() - self._last_save >= c.save_every_s
        if due_n or due_s:
            self._save("periodic")

    def _save(self, why: str) -> None:
        if not self._unsaved:  # nothing written since the last checkpoint (a large bank is not rewritten for nothing)
            return
        t0 = time.perf_counter()
        try:
            path = self.selector.save()
        except Exception as error:  # a failed checkpoint must not stop the writes; the facts are in SQLite
            self.counts["save_errors"] += 1
            self.last_save_error = f"{type(error).__name__}: {error}"
            logger.exception("checkpoint (%s) failed", why)
            return
        self.counts["saves"] += 1
        self._unsaved = 0
        self._last_save = self._clock()
        self.last_save_time = time.time()
        self.last_save_error = None
        logger.info("checkpoint (%s) saved to %s in %.2f s", why, path, time.perf_counter() - t0)
        self._maybe_publish(force=True)

    def _maybe_publish(self, *, force: bool = False) -> None:
        """Publish the policy for the workers when it changed, at most every ``publish_every_s`` (``force``:
        now, at a checkpoint)."""
        if not self._publish:
            return
        version = int(self.selector.policy_version)
        if version == self._published:
            return
        if not force and self._clock() - self._last_publish < self.config.publish_every_s:
            return
        self._last_publish = self._clock()
        try:
            self.selector.publish_policy()
        except Exception:  # the workers keep the previous weights; the facts are in SQLite
            self.counts["publish_errors"] += 1
            logger.exception("publishing the policy (version %d) for the workers failed", version)
            return
        self._published = version
        self.counts["publishes"] += 1

    def stop(self, timeout: float | None = None) -> None:
        """Refuse new writes, finish the queued ones, save, and join the thread."""
        with self._submit_lock:
            first = self._accepting
            self._accepting = False
        if first and self._thread.is_alive():
            self._queue.put(None)  # blocks only while the queue is full, i.e. until the writer makes room
        if self._thread.is_alive():
            self._thread.join(timeout)

    def stats(self) -> dict[str, Any]:
        return {"queued": self.queued, "recorded_feedback": self.counts["feedback"],
                "recorded_cases": self.counts["cases"], "write_errors": self.counts["errors"],
                "saves": self.counts["saves"], "save_errors": self.counts["save_errors"],
                "unsaved_writes": self._unsaved, "last_save_time": self.last_save_time,
                "last_save_error": self.last_save_error, "accepting": self._accepting and self.running,
                **({"published_policy_version": self._published, "publishes": self.counts["publishes"],
                    "publish_errors": self.counts["publish_errors"]} if self._publish else {})}


# ---------------------------------------------------------------- a worker's link to the learner


class LearnerLink:
    """What a worker process of ``memento serve --workers N`` knows of the learner: the Unix socket of its
    private channel (in a directory only this user can enter), over which the worker forwards writes as
    HTTP requests with the client's own ``Authorization`` header, one connection per request (a write is
    never re-sent: a connection broken after the request went out is answered 502, since the learner may
    have recorded it), and :meth:`sync`, throttled to ``sync_every_s``, which keeps the worker's selector
    up to date with the learner's published weights, cases and feedback."""

    def __init__(self, socket_path: str, selector: Any, *, index: int, workers: int, timeout_s: float = 120.0,
                 sync_every_s: float = 0.0, clock: Callable[[], float] = time.monotonic):
        self.socket_path = socket_path
        self.selector = selector
        self.process = {"role": "worker", "index": index, "workers": workers}
        self.timeout_s = timeout_s
        self.sync_every_s = sync_every_s
        self._clock = clock
        self._last_sync = -math.inf
        self._warned: str | None = None
        self.counts = {"forwarded": 0, "forward_errors": 0, "syncs": 0, "sync_errors": 0}

    def sync(self) -> None:
        """``selector.sync()`` unless it ran less than ``sync_every_s`` ago; an error is logged (once per kind)
        and the selector keeps what it has."""
        now = self._clock()
        if now - self._last_sync < self.sync_every_s:
            return
        self._last_sync = now
        try:
            taken = self.selector.sync()
        except Exception as error:  # noqa: BLE001 - a select never fails for it: it goes on with what it has
            self.counts["sync_errors"] += 1
            if str(error) != self._warned:
                self._warned = str(error)
                logger.warning("worker %d: could not follow the learner (%s)", self.process["index"], error)
            return
        if any(taken.values()):
            self.counts["syncs"] += 1

    def forward(self, method: str, path: str, body: bytes, authorization: str | None
                ) -> tuple[int, dict[str, str], bytes]:
        """Send one request to the learner; ``(status, headers (lower-case names), body)``. An unreachable
        learner is a 503 (nothing was sent), a broken answer a 502."""
        import http.client
        import json
        import socket

        class _UnixConnection(http.client.HTTPConnection):
            def connect(inner) -> None:  # noqa: N805 - the connection, not the link
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(self.timeout_s)
                try:
                    sock.connect(self.socket_path)
                except OSError:
                    sock.close()
                    raise
                inner.sock = sock

        headers = {"Content-Type": "application/json", "Connection": "close"}
        if authorization is not None:
            headers["Authorization"] = authorization
        conn = _UnixConnection("learner", timeout=self.timeout_s)
        try:
            try:
                conn.connect()
            except OSError as error:
                self.counts["forward_errors"] += 1
                detail = json.dumps({"detail": f"the learner process is not reachable ({error.strerror or error}); "
                                               "the write was not recorded"}).encode()
                return 503, {"retry-after": "1", "content-type": "application/json"}, detail
            try:
                conn.request(method, path, body=body, headers=headers)
                response = conn.getresponse()
                content = response.read()
            except (OSError, http.client.HTTPException) as error:
                self.counts["forward_errors"] += 1
                detail = json.dumps({"detail": f"the learner process did not answer ({error}); the write may or "
                                               "may not have been recorded"}).encode()
                return 502, {"content-type": "application/json"}, detail
            self.counts["forwarded"] += 1
            return response.status, {k.lower(): v for k, v in response.getheaders()}, content
        finally:
            conn.close()

    def stats(self) -> dict[str, Any]:
        return dict(self.counts)


# ---------------------------------------------------------------- request helpers


_TOKEN_IN_URL = re.compile(r"(?i)([?&;](?:token|access_token)=)[^&;#\s\"']*")
REDACTED = "<redacted>"


def redact(text: str) -> str:
    """``text`` with the value of every ``token=`` / ``access_token=`` URL parameter replaced by ``<redacted>``."""
    return _TOKEN_IN_URL.sub(lambda m: m.group(1) + REDACTED, text) if "token=" in text.lower() else text


class TokenRedactor(logging.Filter):
    """A logging filter that redacts ``?token=...`` in a record's message and arguments (uvicorn's access log
    line is ``'%s - "%s %s HTTP/%s" %d'`` with the path and query as an argument)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):  # the arguments one by one: the access formatter unpacks them
            record.args = tuple(redact(a) if isinstance(a, str) else a for a in record.args)
        elif isinstance(record.args, dict):
            record.args = {k: redact(v) if isinstance(v, str) else v for k, v in record.args.items()}
        try:
            message = record.getMessage()
        except (TypeError, ValueError):
            return True
        if redact(message) != message:  # a token split between the format and its arguments
            record.msg, record.args = redact(message), ()
        return True


def redact_server_logs() -> None:
    """Install :class:`TokenRedactor` on uvicorn's loggers (once; call it after ``uvicorn.Config`` configured
    them): no verbosity prints a token given in a URL (the inspector's ``/inspect/?token=...``)."""
    for name in ("uvicorn.access", "uvicorn.error", "uvicorn"):
        target = logging.getLogger(name)
        if not any(isinstance(f, TokenRedactor) for f in target.filters):
            target.addFilter(TokenRedactor())


def token_matches(header: str | None, token: str) -> bool:
    """Constant-time check of an ``Authorization: Bearer ...`` header against the token."""
    if not header:
        return False
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.strip().encode("utf-8"), token.encode("utf-8"))


def case_record(case: Any) -> dict[str, Any]:
    """A stored case as the services answer a read of it: its Case JSONL row with its ``version``, ``created``
    and ``updated`` times (Unix seconds)."""
    return {**case.to_json(), "version": case.version, "created": case.created, "updated": case.updated}


def json_safe(value: Any) -> Any:
    """``value`` with numpy scalars/arrays, tuples and paths turned into plain JSON types (NaN -> None)."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "tolist"):  # numpy scalar or array
        return json_safe(value.tolist())
    return str(value)
