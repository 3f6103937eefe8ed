"""memento.selector.batching: the dynamic text-encoding batcher, the reader-writer lock and the thread-safe fronts."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from memento.errors import ConfigError, DataFormatError
from memento.selector.batching import (
    BatchedEncoder,
    BatcherClosedError,
    EncodeBatcher,
    LockedGenerator,
    ReadWriteLock,
    SerialEncoder,
)
from tests.loop_env import HashingEncoder


class CountingEncoder:
    """HashingEncoder that records each forward's texts (and can be slow, or refuse texts with 'bad')."""

    def __init__(self, delay_s: float = 0.0):
        self.inner = HashingEncoder(dim=16)
        self.dim = 16
        self.forwards: list[list[str]] = []
        self.delay_s = delay_s

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        self.forwards.append(list(texts))
        if self.delay_s:
            time.sleep(self.delay_s)
        bad = [t for t in texts if "bad" in t]
        if bad:
            raise DataFormatError(f"cannot encode {bad[0]!r}")
        return self.inner.encode(list(texts))


def _concurrently(n: int, fn: Any) -> list[Any]:
    """Run ``fn(i)`` in ``n`` threads released together; returns results (or the exceptions) in order."""
    barrier = threading.Barrier(n)
    out: list[Any] = [None] * n

    def run(i: int) -> None:
        barrier.wait()
        try:
            out[i] = fn(i)
        except BaseException as error:  # noqa: BLE001 - returned to the test
            out[i] = error

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    return out


def test_concurrent_calls_share_one_forward_and_each_gets_its_own_vector() -> None:
    encoder = CountingEncoder()
    texts = [f"task number {i} about topic {i * 7}" for i in range(8)]
    with EncodeBatcher(encoder.encode, max_texts=8, wait_ms=2000) as batcher:
        t0 = time.perf_counter()
        got = _concurrently(8, lambda i: batcher.encode([texts[i]]))
        waited = time.perf_counter() - t0
        stats = batcher.stats()
    assert len(encoder.forwards) == 1 and sorted(encoder.forwards[0]) == sorted(texts)
    assert waited < 1.5  # a full batch goes at once, it does not wait out wait_ms
    for i, vec in enumerate(got):
        assert vec.shape == (1, 16)
        np.testing.assert_allclose(vec[0], HashingEncoder(dim=16).encode(texts[i]), atol=1e-6)
    assert stats["batches"] == 1 and stats["texts"] == 8 and stats["requests"] == 8 and stats["max_batch_texts"] == 8


def test_a_batch_holds_at_most_max_texts_and_a_large_request_goes_alone() -> None:
    encoder = CountingEncoder(delay_s=0.05)
    with EncodeBatcher(encoder.encode, max_texts=4, wait_ms=50) as batcher:
        futures = [batcher.submit([f"text {i}"]) for i in range(10)]
        big = batcher.submit([f"big {i}" for i in range(6)])
        results = [f.result(5) for f in futures]
        assert big.result(5).shape == (6, 16)
    assert all(r.shape == (1, 16) for r in results)
    sizes = [len(f) for f in encoder.forwards]
    assert sum(sizes) == 16 and 6 in sizes and all(s <= 4 for s in sizes if s != 6)
    assert len(encoder.forwards) < 11  # grouped, not one forward per request


def test_the_first_request_waits_at_most_wait_ms() -> None:
    encoder = CountingEncoder()
    with EncodeBatcher(encoder.encode, max_texts=32, wait_ms=30) as batcher:
        t0 = time.perf_counter()
        batcher.encode(["alone"])
        alone_s = time.perf_counter() - t0
    assert 0.025 <= alone_s < 1.0
    with EncodeBatcher(encoder.encode, max_texts=32, wait_ms=0) as batcher:
        t0 = time.perf_counter()
        batcher.encode(["alone again"])
        assert time.perf_counter() - t0 < 0.5


def test_errors_reach_the_right_caller() -> None:
    encoder = CountingEncoder()
    texts = ["good one", "a bad one", "good two", "good three"]
    with EncodeBatcher(encoder.encode, max_texts=4, wait_ms=2000) as batcher:
        got = _concurrently(4, lambda i: batcher.encode([texts[i]]))
        stats = batcher.stats()
    assert isinstance(got[1], DataFormatError) and "a bad one" in str(got[1])
    for i in (0, 2, 3):
        np.testing.assert_allclose(got[i][0], HashingEncoder(dim=16).encode(texts[i]), atol=1e-6)
    assert len(encoder.forwards[0]) == 4 and stats["retried_batches"] == 1  # the batch, then each alone
    with EncodeBatcher(lambda texts: np.zeros((1, 3)), max_texts=4, wait_ms=0) as batcher:
        with pytest.raises(Exception, match="shape"):  # rows that do not match the texts are an error, not a guess
            batcher.encode(["x", "y"])


def test_shutdown_drains_then_refuses_and_idle_threads_end() -> None:
    encoder = CountingEncoder(delay_s=0.05)
    batcher = EncodeBatcher(encoder.encode, max_texts=2, wait_ms=0)
    futures = [batcher.submit([f"queued {i}"]) for i in range(5)]
    batcher.close()
    assert all(f.result(0).shape == (1, 16) for f in futures)  # drained before close returned
    with pytest.raises(BatcherClosedError):
        batcher.submit(["late"])
    batcher.close()  # idempotent
    assert not any(t.name == "memento-encode-batcher" and t.is_alive() for t in threading.enumerate())

    idle = EncodeBatcher(encoder.encode, max_texts=2, wait_ms=0, idle_s=0.05, name="memento-idle-test")
    idle.encode(["one"])
    time.sleep(0.3)
    assert not any(t.name == "memento-idle-test" for t in threading.enumerate())
    assert idle.encode(["two"]).shape == (1, 16)  # a new thread starts on demand
    idle.close()


def test_batcher_validation() -> None:
    for kwargs in ({"max_texts": 0}, {"max_texts": True}, {"wait_ms": -1}, {"wait_ms": float("nan")},
                   {"idle_s": 0}):
        with pytest.raises(ConfigError):
            EncodeBatcher(lambda t: np.zeros((len(t), 2)), **kwargs)
    with EncodeBatcher(lambda t: np.zeros((len(t), 2)), wait_ms=0) as batcher:
        with pytest.raises(DataFormatError):
            batcher.submit("not a list")  # type: ignore[arg-type]
        with pytest.raises(DataFormatError):
            batcher.submit([1])  # type: ignore[list-item]


def test_fronts_encode_like_the_encoder() -> None:
    encoder = HashingEncoder(dim=16)
    with EncodeBatcher(encoder.encode, wait_ms=0) as batcher:
        for front in (SerialEncoder(encoder), BatchedEncoder(encoder, batcher)):
            assert front.dim == 16 and front.encoder is encoder and repr(front.encoder) == repr(encoder)
            np.testing.assert_array_equal(front.encode("one text"), encoder.encode("one text"))
            np.testing.assert_array_equal(front.encode(["a b", "c d"]), encoder.encode(["a b", "c d"]))
            assert front.encode([]).shape == (0, 16)


def test_locked_generator_draws_the_same_numbers() -> None:
    a, b = np.random.default_rng(5), LockedGenerator(np.random.default_rng(5))
    np.testing.assert_array_equal(a.gumbel(size=7), b.gumbel(size=7))
    assert a.integers(100) == b.integers(100) and b.bit_generator is not None
    shared = LockedGenerator(np.random.default_rng(1))
    draws = _concurrently(8, lambda i: [shared.gumbel(size=64) for _ in range(50)])
    flat = np.concatenate([d for per in draws for d in per])
    assert flat.size == 8 * 50 * 64 and len(np.unique(flat)) == flat.size


def test_rw_lock_lets_readers_in_together_and_writers_alone() -> None:
    lock = ReadWriteLock()
    inside, most, log = [0], [0], []
    guard = threading.Lock()

    def reader(i: int) -> None:
        with lock.read():
            with guard:
                inside[0] += 1
                most[0] = max(most[0], inside[0])
            time.sleep(0.05)
            with guard:
                inside[0] -= 1

    _concurrently(4, reader)
    assert most[0] == 4  # all four read at once

    def mixed(i: int) -> None:
        if i % 2:
            with lock.write():
                with guard:
                    log.append(("w", inside[0]))
                time.sleep(0.01)
        else:
            reader(i)

    _concurrently(8, mixed)
    assert [entry for entry in log if entry[1] != 0] == []  # no reader inside while a writer writes


def test_rw_lock_prefers_a_waiting_writer_and_is_reentrant() -> None:
    lock = ReadWriteLock()
    order: list[str] = []
    lock.acquire_read()
    writer = threading.Thread(target=lambda: (lock.acquire_write(), order.append("w"), lock.release_write()))
    writer.start()
    time.sleep(0.05)  # the writer waits for the reader
    late = threading.Thread(target=lambda: (lock.acquire_read(), order.append("r"), lock.release_read()))
    late.start()
    time.sleep(0.05)
    assert order == []  # the late reader waits behind the waiting writer
    with lock.read():  # re-entrant: the first reader is not stopped by the waiting writer
        pass
    with pytest.raises(RuntimeError, match="read side"):
        lock.acquire_write()  # an upgrade would wait for itself
    lock.release_read()
    writer.join(2)
    late.join(2)
    assert order == ["w", "r"]
    with lock.write_lock, lock.write_lock, lock.read():  # the writer may re-enter and read
        pass
    with pytest.raises(RuntimeError):
        lock.release_write()


@pytest.mark.slow
def test_batched_real_encoder_vectors_equal_unbatched_ones() -> None:
    """The real MiniLM, without its embedding cache: texts of different lengths padded into one batch give
    the vectors each gives alone (within 1e-6)."""
    from memento.encoders import Encoder

    encoder = Encoder.from_pretrained(device="cpu", use_cache=False)
    texts = ["short", "a somewhat longer question about the capital of Peru?",
             "what is 12 plus 30, and why does the answer matter for this very long task description here?",
             "blue", "the quick brown fox jumps over the lazy dog"]
    alone = np.stack([encoder.encode([t])[0] for t in texts])
    with EncodeBatcher(encoder.encode, max_texts=len(texts), wait_ms=2000) as batcher:
        got = _concurrently(len(texts), lambda i: batcher.encode([texts[i]]))
        assert batcher.stats()["batches"] == 1
    np.testing.assert_allclose(np.concatenate(got), alone, atol=1e-6)
