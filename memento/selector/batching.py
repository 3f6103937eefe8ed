"""Concurrency helpers of a served :class:`~memento.selector.runtime.Selector`: a dynamic batcher for text encoding,
a reader-writer lock, and thread-safe fronts for an encoder and a numpy generator.

**Dynamic batching.** :class:`EncodeBatcher` runs one background thread. Callers submit texts
(``submit`` returns a ``concurrent.futures.Future``, ``encode`` waits for it); the thread takes the
first request, waits until ``max_texts`` texts are queued or ``wait_ms`` milliseconds have passed since
that request arrived, and encodes everything collected in one ``encode(texts)`` call, one forward
pass instead of one per caller. Each caller gets its own rows. When a batched call fails, each request
of the batch is encoded again on its own, so an error reaches only the caller whose texts caused it.
Under load the wait costs nothing: requests that queued while the previous batch ran are taken at once.

**Reads in parallel, one writer.** :class:`ReadWriteLock` lets any number of readers in at once and a
writer alone; a waiting writer stops new readers (writers are not starved by a stream of selects).
Both sides are re-entrant in the thread that holds them, and a thread holding the write side may take
the read side; taking the write side while holding only the read side raises (it would deadlock).
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from memento.errors import ConfigError, DataFormatError, DimensionError, MementoError

__all__ = ["BatchedEncoder", "BatcherClosedError", "EncodeBatcher", "LockedGenerator", "ReadWriteLock",
           "SerialEncoder"]

logger = logging.getLogger(__name__)


class BatcherClosedError(MementoError):
    """The batcher was closed: no more texts are encoded (a server shutting down answers 503)."""


# ---------------------------------------------------------------- reader-writer lock


class _WriteSide:
    """``with lock.write_lock:``: the exclusive side as a plain context manager (what an RLock offered)."""

    def __init__(self, lock: ReadWriteLock):
        self._lock = lock

    def acquire(self) -> bool:
        self._lock.acquire_write()
        return True

    def release(self) -> None:
        self._lock.release_write()

    def __enter__(self) -> None:
        self._lock.acquire_write()

    def __exit__(self, *exc: object) -> None:
        self._lock.release_write()


class ReadWriteLock:
    """Many readers or one writer (see the module docstring); writer-preferring, re-entrant per thread."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0  # threads holding the read side (counted once each)
        self._writer: int | None = None  # ident of the thread holding the write side
        self._write_depth = 0
        self._writers_waiting = 0
        self._local = threading.local()
        self.write_lock = _WriteSide(self)

    def _depth(self) -> int:
        return int(getattr(self._local, "reads", 0))

    def acquire_read(self) -> None:
        depth = self._depth()
        if depth:  # already reading: no new count, and never wait behind a waiting writer
            self._local.reads = depth + 1
            return
        if self._writer == threading.get_ident():  # the writer reads: it is alone already
            self._local.reads, self._local.counted = 1, False
            return
        with self._cond:
            while self._writer is not None or self._writers_waiting:
                self._cond.wait()
            self._readers += 1
        self._local.reads, self._local.counted = 1, True

    def release_read(self) -> None:
        depth = self._depth()
        if depth <= 0:
            raise RuntimeError("ReadWriteLock: release_read without acquire_read")
        self._local.reads = depth - 1
        if depth == 1 and getattr(self._local, "counted", False):
            self._local.counted = False
            with self._cond:
                self._readers -= 1
                if not self._readers:
                    self._cond.notify_all()

    def acquire_write(self) -> None:
        me = threading.get_ident()
        with self._cond:
            if self._writer == me:
                self._write_depth += 1
                return
            if self._depth():
                raise RuntimeError("ReadWriteLock: this thread holds the read side; taking the write side "
                                   "would wait for itself")
            self._writers_waiting += 1
            try:
                while self._writer is not None or self._readers:
                    self._cond.wait()
            finally:
                self._writers_waiting -= 1
            self._writer, self._write_depth = me, 1

    def release_write(self) -> None:
        with self._cond:
            if self._writer != threading.get_ident():
                raise RuntimeError("ReadWriteLock: release_write by a thread that does not hold it")
            self._write_depth -= 1
            if not self._write_depth:
                self._writer = None
                self._cond.notify_all()

    @contextlib.contextmanager
    def read(self) -> Iterator[None]:
        self.acquire_read()
        try:
            yield
        finally:
            self.release_read()

    @contextlib.contextmanager
    def write(self) -> Iterator[None]:
        self.acquire_write()
        try:
            yield
        finally:
            self.release_write()


class LockedGenerator:
    """A ``numpy.random.Generator`` whose calls run one at a time under ``lock`` (draws from threads that
    share one generator never interleave inside a call). The same calls give the same numbers as the
    generator itself."""

    def __init__(self, rng: np.random.Generator, lock: threading.Lock | None = None):
        self._rng = rng
        self._lock = lock if lock is not None else threading.Lock()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._rng, name)
        if not callable(attr):
            return attr

        def locked(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                return attr(*args, **kwargs)

        return locked


# ---------------------------------------------------------------- the batcher


@dataclasses.dataclass
class _Request:
    texts: list[str]
    future: concurrent.futures.Future[np.ndarray]
    born: float


class EncodeBatcher:
    """Groups concurrent ``encode`` calls into batched forwards (see the module docstring).

    ``encode_fn(texts) -> [N, D]`` is called in the batcher's thread only (so the encoder is never used
    from two threads at once). ``max_texts``: the most texts in one forward (a single request with more is
    encoded alone); ``wait_ms``: how long the first request of a batch waits for company (0: take what is
    queued). The thread starts on the first request and ends after ``idle_s`` seconds without work (a
    later request starts a new one) or on :meth:`close`, which encodes what is queued and then refuses
    new requests with :class:`BatcherClosedError`.
    """

    def __init__(self, encode_fn: Callable[[list[str]], Any], *, max_texts: int = 32, wait_ms: float = 2.0,
                 idle_s: float = 30.0, name: str = "memento-encode-batcher",
                 clock: Callable[[], float] = time.monotonic):
        if isinstance(max_texts, bool) or not isinstance(max_texts, int) or max_texts < 1:
            raise ConfigError(f"EncodeBatcher: max_texts={max_texts!r}: must be an integer >= 1")
        if isinstance(wait_ms, bool) or not isinstance(wait_ms, (int, float)) or not 0.0 <= wait_ms < float("inf"):
            raise ConfigError(f"EncodeBatcher: wait_ms={wait_ms!r}: must be a finite number >= 0")
        if isinstance(idle_s, bool) or not isinstance(idle_s, (int, float)) or not idle_s > 0:
            raise ConfigError(f"EncodeBatcher: idle_s={idle_s!r}: must be a number > 0")
        self._encode_fn = encode_fn
        self.max_texts = max_texts
        self.wait_ms = float(wait_ms)
        self._idle_s = float(idle_s)
        self._name = name
        self._clock = clock
        self._cond = threading.Condition(threading.Lock())
        self._queue: collections.deque[_Request] = collections.deque()
        self._queued_texts = 0
        self._thread: threading.Thread | None = None
        self._closed = False
        self.counts = {"requests": 0, "texts": 0, "batches": 0, "max_batch_texts": 0, "retried_batches": 0}

    # ------------------------------------------------------------------ callers

    def submit(self, texts: Sequence[str]) -> concurrent.futures.Future[np.ndarray]:
        """Queue ``texts`` (a list of non-empty strings); the future resolves to their vectors ``[N, D]``."""
        if isinstance(texts, str) or not isinstance(texts, Sequence):
            raise DataFormatError(f"EncodeBatcher.submit takes a list of texts, got {type(texts).__name__}")
        items = list(texts)
        for i, text in enumerate(items):
            if not isinstance(text, str):
                raise DataFormatError(f"text {i} is {type(text).__name__}, expected a string")
        future: concurrent.futures.Future[np.ndarray] = concurrent.futures.Future()
        if not items:
            future.set_result(np.zeros((0, 0), dtype=np.float32))
            return future
        with self._cond:
            if self._closed:
                raise BatcherClosedError("the text encoder is shut down (the server is stopping); nothing was encoded")
            self._queue.append(_Request(items, future, self._clock()))
            self._queued_texts += len(items)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify()
        return future

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """``[N, D]`` float32 vectors of ``texts``, encoded in a batch with other callers' texts."""
        return self.submit(texts).result()

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self, timeout: float | None = None) -> None:
        """Encode what is queued, then stop the thread; later requests raise BatcherClosedError. Idempotent."""
        with self._cond:
            self._closed = True
            thread = self._thread
            self._cond.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def stats(self) -> dict[str, Any]:
        """Counters: requests, texts, batches (forwards), the largest batch, batches retried one by one,
        the mean texts per batch, and the settings."""
        with self._cond:
            counts = dict(self.counts)
            queued = self._queued_texts
        counts["mean_batch_texts"] = counts["texts"] / counts["batches"] if counts["batches"] else 0.0
        return {**counts, "queued_texts": queued, "max_texts": self.max_texts, "wait_ms": self.wait_ms}

    def __enter__(self) -> EncodeBatcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ the thread

    def _take(self) -> list[_Request] | None:
        """The next batch (None: the thread ends). Called with the condition held."""
        while not self._queue:
            if self._closed:
                self._thread = None
                return None
            if not self._cond.wait(timeout=self._idle_s) and not self._queue:
                self._thread = None  # idle: a later submit starts a new thread (under this same lock)
                return None
        deadline = self._queue[0].born + self.wait_ms / 1e3
        while not self._closed and self._queued_texts < self.max_texts:
            left = deadline - self._clock()
            if left <= 0:
                break
            self._cond.wait(timeout=left)
        batch = [self._queue.popleft()]
        total = len(batch[0].texts)
        while self._queue and total + len(self._queue[0].texts) <= self.max_texts:
            total += len(self._queue[0].texts)
            batch.append(self._queue.popleft())
        self._queued_texts -= total
        return batch

    def _run(self) -> None:
        while True:
            with self._cond:
                batch = self._take()
            if batch is None:
                return
            live = [r for r in batch if r.future.set_running_or_notify_cancel()]
            if live:
                self._encode(live, retry=True)

    def _encode(self, batch: list[_Request], *, retry: bool) -> None:
        texts = [text for request in batch for text in request.texts]
        try:
            out_ND = np.asarray(self._encode_fn(texts), dtype=np.float32)
            if out_ND.ndim != 2 or out_ND.shape[0] != len(texts):
                raise DimensionError(f"the encoder returned shape {tuple(out_ND.shape)} for {len(texts)} texts, "
                                     f"expected ({len(texts)}, D)")
        except BaseException as error:  # noqa: BLE001 - handed to the callers, never lost
            if retry and len(batch) > 1:  # one request may be at fault: each alone, each gets its own answer
                logger.debug("encode batch of %d requests failed (%s); encoding them one by one", len(batch), error)
                with self._cond:
                    self.counts["retried_batches"] += 1
                for request in batch:
                    self._encode([request], retry=False)
                return
            for request in batch:
                request.future.set_exception(error)
            return
        with self._cond:
            self.counts["requests"] += len(batch)
            self.counts["texts"] += len(texts)
            self.counts["batches"] += 1
            self.counts["max_batch_texts"] = max(self.counts["max_batch_texts"], len(texts))
        start = 0
        for request in batch:
            stop = start + len(request.texts)
            request.future.set_result(out_ND[start:stop].copy())
            start = stop


# ---------------------------------------------------------------- encoder fronts


class SerialEncoder:
    """An encoder whose ``encode`` runs one call at a time (safe to share between threads); every other
    attribute is the encoder's own."""

    def __init__(self, encoder: Any):
        self.encoder = encoder
        self._lock = threading.Lock()

    @property
    def dim(self) -> int:
        return int(self.encoder.dim)

    def encode(self, texts: str | Sequence[str]) -> np.ndarray:
        with self._lock:
            return self.encoder.encode(texts)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.encoder, name)


class BatchedEncoder:
    """An encoder whose ``encode`` goes through an :class:`EncodeBatcher` (a string gives ``[D]``, a list
    ``[N, D]``); every other attribute is the encoder's own."""

    def __init__(self, encoder: Any, batcher: EncodeBatcher):
        self.encoder = encoder
        self.batcher = batcher

    @property
    def dim(self) -> int:
        return int(self.encoder.dim)

    def encode(self, texts: str | Sequence[str]) -> np.ndarray:
        if isinstance(texts, str):
            return self.batcher.encode([texts])[0]
        items = list(texts)
        if not items:
            return np.zeros((0, self.dim), dtype=np.float32)
        return self.batcher.encode(items)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.encoder, name)
