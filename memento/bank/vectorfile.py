"""``vectors.f32``: the float32 vectors of a ``vectors="disk"`` directory bank, row ``p`` = position ``p``.

Two roles, by the bank's age:

- **the store** (banks created since issue 41: the SQLite meta key ``vectors_store`` is ``"file"``). The vector
  is kept once, here; SQLite keeps the texts and metadata, with an empty ``embedding`` column. A write appends
  its rows to the file and fsyncs it **before** the SQLite transaction that names them commits, with the
  xxh3-64 checksum of every block of :data:`block_rows` rows it touched in the same transaction (table
  ``vector_blocks``). So the committed rows are always in the file; a write killed before its commit leaves a
  surplus tail, which the next writer cuts. Every open checks every block of the committed rows against its
  checksum (plain reads of one block at a time: memory bounded by a block's bytes), and so does
  ``memento verify`` (:func:`check_store`); a changed, shifted, zeroed or missing row is one ``BankError`` line
  naming the rows.
- **a cache** (older disk banks, whose vectors are also in SQLite's ``embedding`` column): derived like the
  faiss index, cut or caught up from SQLite on open.

Either way the file must be a regular file: a symlink, a FIFO, a directory or a device named ``vectors.f32`` is
refused in one line, never followed, read or written (files are opened with ``O_NOFOLLOW | O_NONBLOCK``).
Rows are read by position with one ``pread`` each (:meth:`VectorFile.take`: a candidate set's rows, the
re-ranked hits), whole ranges by plain reads into a fresh buffer (:meth:`VectorFile.read`), so neither leaves
anything mapped; an exact search over the whole bank (a small or untrained one) maps the file (:meth:`view`).
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import sqlite3
import stat
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from memento.errors import BankError
from memento.io import atomic_write_text

__all__ = ["BLOCK_BYTES", "VECTORS_META_NAME", "VECTORS_NAME", "VECTORS_STORE_KEY", "BlockSums", "VectorFile",
           "block_rows_for", "check_store", "hash_block", "iter_rows", "read_block_sums"]

logger = logging.getLogger(__name__)

VECTORS_NAME = "vectors.f32"
VECTORS_META_NAME = "vectors.json"
VECTORS_STORE_KEY = "vectors_store"
"""The bank meta key that says the file is the vectors' store (value ``"file"``)."""
BLOCK_BYTES = 4 << 20
"""A checksum block holds as many whole rows as fit in 4 MiB (at least one)."""
_MAX_META_BYTES = 1 << 16
_O_SAFE = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)

BlockSums = Mapping[int, tuple[int, str]]
"""``{block: (rows, xxh3-64 hex)}`` as the ``vector_blocks`` table holds them."""


def block_rows_for(dim: int) -> int:
    """Rows per checksum block for ``dim``-dimensional float32 vectors."""
    return max(1, BLOCK_BYTES // (4 * dim))


def hash_block(data: bytes | memoryview) -> str:
    import xxhash

    return xxhash.xxh3_64_hexdigest(data)


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a device or special file"


def _not_regular(path: Path, mode: int) -> BankError:
    return BankError(f"{path}: is {_kind(mode)}, not a regular file; memento neither follows nor writes it "
                     "(move it away)")


def _regular(path: Path) -> bool:
    """Whether ``path`` exists as a regular file (not followed); a link or special file there is a ``BankError``."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return False
    except OSError as error:
        raise BankError(f"{path}: unreadable ({error.strerror})") from None
    if not stat.S_ISREG(mode):
        raise _not_regular(path, mode)
    return True


def _open(path: Path, flags: int) -> int:
    """A descriptor of the regular file ``path`` (never through a link, never blocking on a FIFO)."""
    try:
        fd = os.open(path, flags | _O_SAFE, 0o666)
    except OSError as error:
        _regular(path)  # a link or a special file there is named as such
        raise BankError(f"{path}: cannot open ({error.strerror})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise _not_regular(path, mode)
    if flags & getattr(os, "O_NONBLOCK", 0) == 0 and hasattr(os, "set_blocking"):
        os.set_blocking(fd, True)
    return fd


def _read_meta(path: Path) -> dict[str, Any] | None:
    """``vectors.json`` as a dict, or None when it is missing, unreadable, too large or not a JSON object
    (a deeply nested file included: it names the bank the file belongs to, nothing more)."""
    try:
        if not _regular(path):
            return None
        fd = _open(path, os.O_RDONLY)
        with os.fdopen(fd, "rb") as handle:
            raw = handle.read(_MAX_META_BYTES + 1)
        if len(raw) > _MAX_META_BYTES:
            return None
        info = json.loads(raw.decode("utf-8"))
    except (OSError, ValueError, RecursionError, BankError):
        return None
    return info if isinstance(info, dict) else None


class VectorFile:
    """``vectors.f32`` and ``vectors.json`` of one bank (see the module docstring); ``stored``: the file is the
    store (checked by block checksums), else a cache of SQLite's ``embedding`` column."""

    def __init__(self, directory: Path, uid: str, dim: int, *, stored: bool = False):
        self.path, self._meta = directory / VECTORS_NAME, directory / VECTORS_META_NAME
        self._uid, self._dim = uid, dim
        self.stored = stored
        self._row_bytes = 4 * dim
        self.block_rows = block_rows_for(dim)
        self._map: np.ndarray | None = None
        self._mmap: mmap.mmap | None = None
        self._fd: int | None = None  # the descriptor the reads use
        self._fd_lock = threading.Lock()
        self._tail = b""  # the store's last, partial block (the writer's, after check())
        self._staged: tuple[int, bytes, bool] | None = None  # a write in flight: rows before, new tail, cut on rollback

    # ------------------------------------------------------------------ ownership, size

    def _owned(self) -> bool:
        info = _read_meta(self._meta)
        return info is not None and info.get("uid") == self._uid and info.get("dim") == self._dim \
            and _regular(self.path)

    def _write_meta(self) -> None:
        _regular(self._meta)  # a link or a special file there is refused, never replaced
        info = {"uid": self._uid, "dim": self._dim, "dtype": "float32"}
        if self.stored:
            info.update(store=True, block_rows=self.block_rows, checksum="xxh3-64")
        atomic_write_text(self._meta, json.dumps(info, indent=2) + "\n")

    def _size(self) -> int:
        return os.lstat(self.path).st_size if _regular(self.path) else 0

    def rows(self) -> int:
        """Whole rows in the file (0 when it is missing or, for a cache, belongs to another bank)."""
        if self.stored:
            return self._size() // self._row_bytes
        return self._size() // self._row_bytes if self._owned() else 0

    def _create_empty(self) -> None:
        os.close(_open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC))

    def _truncate_file(self, n: int) -> None:
        fd = _open(self.path, os.O_WRONLY)
        try:
            os.ftruncate(fd, n * self._row_bytes)
            os.fsync(fd)
        finally:
            os.close(fd)

    # ------------------------------------------------------------------ the store: check, stage, truncate

    def check(self, count: int, sums: BlockSums, *, writer: bool) -> None:
        """The store holds the vectors of positions ``0..count-1`` and every block of them matches its checksum;
        the writer cuts a surplus tail (a write killed before its commit) and (re)writes ``vectors.json`` when it
        is missing or unreadable. ``BankError`` in one line otherwise."""
        if not _regular(self.path):
            if count:
                raise BankError(f"{self.path}: missing; it holds the vectors of this bank's {count} case(s) "
                                "(restore it from a copy of the bank)")
            if writer:
                self._create_empty()
        have = self._size() // self._row_bytes
        if have < count:
            raise BankError(f"{self.path}: holds {have} vector(s), the bank {count}: the vectors of positions "
                            f"{have}..{count - 1} are lost (restore the file from a copy of the bank)")
        if writer:
            if self._size() != count * self._row_bytes:  # a write killed before its commit, or a torn row
                logger.warning("%s: cutting %d byte(s) beyond the bank's %d committed row(s) (a write that did not "
                               "commit)", self.path, self._size() - count * self._row_bytes, count)
                self._truncate_file(count)
            if not self._owned():
                self._write_meta()
        self._verify(count, sums)
        self._map = self._mmap = None

    def _verify(self, count: int, sums: BlockSums) -> None:
        blocks = -(-count // self.block_rows)
        fd, have = self._reader(), self._size() // self._row_bytes
        self._tail = b""
        for block in range(blocks):
            first = block * self.block_rows
            rows = min(self.block_rows, count - first)
            expected = sums.get(block)
            if expected is None or expected[0] < rows:
                raise BankError(f"{self.path.parent}: damaged bank: no checksum for rows {first}.."
                                f"{first + rows - 1} of {VECTORS_NAME}")
            rows = expected[0] if first + expected[0] <= have else rows
            data = os.pread(fd, rows * self._row_bytes, first * self._row_bytes)
            if len(data) != rows * self._row_bytes or hash_block(data) != expected[1]:
                raise BankError(f"{self.path}: rows {first}..{first + rows - 1} do not match their checksum "
                                "(the file was changed outside memento; restore it from a copy of the bank)")
            if block == blocks - 1 and rows < self.block_rows:
                self._tail = data[:(count - first) * self._row_bytes]

    def stage(self, emb_ND: np.ndarray, before: int) -> list[tuple[int, int, str]]:
        """Append the rows ``before..`` and fsync them (before the caller's SQLite commit); returns the
        ``(block, rows, checksum)`` of every block they touch, for that transaction. :meth:`committed` or
        :meth:`rolled_back` follows."""
        data = memoryview(np.ascontiguousarray(emb_ND, dtype="<f4")).cast("B")  # type: ignore[arg-type]  # no copy
        fd = _open(self.path, os.O_WRONLY)
        try:
            if os.fstat(fd).st_size != before * self._row_bytes:  # a surplus left by a failed write
                os.ftruncate(fd, before * self._row_bytes)
            written = 0
            while written < len(data):
                written += os.pwrite(fd, data[written:], before * self._row_bytes + written)
            os.fsync(fd)
        finally:
            os.close(fd)
        self._map = self._mmap = None
        block = self.block_rows * self._row_bytes
        first_block = before // self.block_rows
        head = bytes(self._tail) + bytes(data[:block - len(self._tail)])  # the first block touched, from its start
        sums = [(first_block, len(head) // self._row_bytes, hash_block(head))]
        last: bytes | memoryview = head
        for offset in range(block - len(self._tail), len(data), block):
            last = data[offset:offset + block]
            sums.append((first_block + len(sums), len(last) // self._row_bytes, hash_block(last)))
        self._staged = (before, bytes(last) if len(last) < block else b"", True)
        return sums

    def truncation(self, n: int) -> tuple[int, tuple[int, int, str] | None]:
        """For a truncation to ``n`` rows in the caller's transaction: the first block to drop from the checksum
        table and the new checksum of the block left partial (None when ``n`` ends a block)."""
        first = (n // self.block_rows) * self.block_rows
        keep = n - first
        if keep == 0:
            self._staged = (n, b"", False)
            return n // self.block_rows, None
        data = os.pread(self._reader(), keep * self._row_bytes, first * self._row_bytes)
        if len(data) != keep * self._row_bytes:
            raise BankError(f"{self.path}: holds fewer than {n} rows; cannot truncate the bank to {n} case(s)")
        self._staged = (n, data, False)
        return n // self.block_rows + 1, (n // self.block_rows, keep, hash_block(data))

    def committed(self) -> None:
        if self._staged is not None:
            self._tail = self._staged[1]
            self._staged = None

    def rolled_back(self) -> None:
        """The transaction that staged rows did not commit: they are cut from the file again."""
        if self._staged is None:
            return
        before, _, cut = self._staged
        self._staged = None
        if not cut:
            return
        try:
            if self._size() > before * self._row_bytes:
                self._truncate_file(before)
        except (OSError, BankError) as error:  # the next writer's open cuts them
            logger.warning("%s: could not cut the rows of a failed write (%s)", self.path, error)
        self._map = self._mmap = None

    # ------------------------------------------------------------------ the cache

    def repair(self, rows: Any, count: int) -> None:
        """A cache: make the file hold exactly SQLite's first ``count`` rows (the writer, on open)."""
        if not self._owned():
            if _regular(self.path) or not self.path.exists():
                self._create_empty()
            self._write_meta()
        have = min(self.rows(), count)
        if self._size() != have * self._row_bytes:  # a torn row, or rows SQLite took back
            self._truncate_file(have)
        if have < count:
            logger.warning("%s: %s is %d case(s) behind SQLite; adding them", self.path.parent, VECTORS_NAME,
                           count - have)
            for start in range(have, count, 32_768):
                _, _, emb, _ = rows.mirror(start, min(count, start + 32_768))
                self.append(emb)
        self._map = self._mmap = None

    def append(self, emb_ND: np.ndarray) -> None:
        """A cache: append rows after SQLite committed them."""
        fd = _open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            data = np.ascontiguousarray(emb_ND, dtype="<f4").tobytes()
            written = 0
            while written < len(data):
                written += os.write(fd, memoryview(data)[written:])
        finally:
            os.close(fd)

    def truncate(self, n: int) -> None:
        self._truncate_file(n)
        self._map = self._mmap = None

    # ------------------------------------------------------------------ reads

    def view(self, n: int) -> np.ndarray:
        """Rows ``0..n-1`` memory-mapped (read-only; a plain array over the map, faster to index than np.memmap)."""
        if n == 0:
            return np.zeros((0, self._dim), dtype=np.float32)
        if self._map is None or self._map.shape[0] < n:
            fd = _open(self.path, os.O_RDONLY)
            try:
                rows = os.fstat(fd).st_size // self._row_bytes
                if rows < n:
                    raise BankError(f"{self.path}: holds {rows} row(s), {n} expected (changed outside memento?)")
                self._mmap = mmap.mmap(fd, rows * self._row_bytes, access=mmap.ACCESS_READ)
            finally:
                os.close(fd)
            self._map = np.frombuffer(self._mmap, dtype="<f4").reshape(rows, self._dim)
        return self._map[:n]

    def take(self, positions: np.ndarray, n: int) -> np.ndarray:
        """The rows at ``positions`` (any shape, all in ``0..n-1``) as a new array, one ``pread`` per row on a
        descriptor kept open (:meth:`_reader`): nothing is mapped, so the process's resident memory does not grow
        however many queries a large bank answers (the kernel's page cache keeps the rows read). Measured against
        fancy-indexing the map and dropping its pages every 64 MiB, on a million-case file in the page cache: 0.18 ms
        against 0.49 for 64 rows, 2.2 against 11.5 ms for 1,024 (docs/benchmarks.md)."""
        pos = np.asarray(positions, dtype=np.int64)
        flat = pos.reshape(-1)
        if flat.size and (int(flat.min()) < 0 or int(flat.max()) >= n):
            raise IndexError(f"{self.path}: positions {int(flat.min())}..{int(flat.max())} outside 0..{n - 1}")
        out = np.empty((flat.size, self._dim), dtype=np.float32)
        buffer = memoryview(out).cast("B")
        fd, size = self._reader(), self._row_bytes
        for i, position in enumerate(flat.tolist()):
            if os.preadv(fd, [buffer[i * size:(i + 1) * size]], position * size) != size:
                raise BankError(f"{self.path}: holds fewer than {position + 1} row(s) (changed outside memento?)")
        return out.reshape(*pos.shape, self._dim)

    def _reader(self) -> int:
        """A read-only descriptor of the file, opened once (a write, a cut or a repair keeps the same file) and
        shared by every read: :meth:`take`, :meth:`read`, the checks."""
        with self._fd_lock:  # readers search in parallel (memento.selector.runtime)
            if self._fd is None:
                self._fd = _open(self.path, os.O_RDONLY)
            return self._fd

    def read(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start..stop-1`` read into memory (not mapped)."""
        data = os.pread(self._reader(), (stop - start) * self._row_bytes, start * self._row_bytes)
        if len(data) != (stop - start) * self._row_bytes:
            raise BankError(f"{self.path}: holds fewer than {stop} row(s) (changed outside memento?)")
        return np.frombuffer(data, dtype="<f4").reshape(stop - start, self._dim).astype(np.float32, copy=False)

    def close(self) -> None:
        self._map = self._mmap = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def iter_rows(directory: Path, dim: int, start: int, stop: int, chunk: int = 4096) -> Iterator[bytes]:
    """The bytes of each row ``start..stop-1`` of a store's ``vectors.f32``, read a chunk at a time (for digests
    and exports that read the file without a bank)."""
    store = VectorFile(directory, "", dim, stored=True)
    try:
        for first in range(start, stop, chunk):
            yield from (row.tobytes() for row in store.read(first, min(stop, first + chunk)))
    finally:
        store.close()


def check_store(directory: Path, uid: str, dim: int, count: int, sums: BlockSums) -> None:
    """``memento verify``'s check of a store without opening the bank: as the open's (nothing written)."""
    store = VectorFile(directory, uid, dim, stored=True)
    try:
        store.check(count, sums, writer=False)
    finally:
        store.close()


def read_block_sums(conn: sqlite3.Connection, where: object) -> dict[int, tuple[int, str]]:
    """The ``vector_blocks`` table of a bank's SQLite connection as :data:`BlockSums`; a row written outside
    memento is a ``BankError`` naming ``where``."""
    try:
        return {int(b): (int(n), str(h)) for b, n, h in conn.execute("SELECT block, rows, hash FROM vector_blocks")}
    except (TypeError, ValueError) as error:
        raise BankError(f"{where}: damaged bank (vector_blocks: {error})") from None
