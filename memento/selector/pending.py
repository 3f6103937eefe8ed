"""Pending selections on disk: what :meth:`memento.Selector.select` issued and ``feedback`` has not answered yet.

A selection waits for its reward in a :class:`PendingStore`, a small SQLite file inside the artifact
directory, ``.pending.sqlite`` (:data:`PENDING_NAME`), beside ``feedback.sqlite``. Agents often call
back minutes later, after a deploy: feedback for a selection made before a restart of the process
(``memento serve`` stopped with SIGTERM, or killed) is accepted as if the process had kept running.

**What a row holds**: exactly what the selector needs to learn from the reward, as it was at select
time: the state vector (float32 bytes), the chosen ids in draw order, the chosen case vectors
(float32 bytes and their shape ``[K, D]``), the per-case and set propensities, the mode, the policy
version, the env, and the wall-clock creation time (``time.time()``: monotonic time does not survive
a restart). Arrays come back bit-identical, floats exactly (JSON and SQLite REAL keep every bit of a
float64).

**Durability.** Every :meth:`PendingStore.put` is one SQLite transaction (WAL, ``synchronous=NORMAL``,
no fsync per commit: a median of 60-100 us measured at D=64-768; the automatic WAL checkpoint, once per
about 1000 pages written, fsyncs and takes a few ms): once ``select`` returned, its selection survives
the process being killed (SIGKILL, OOM killer, a crash). It does not survive an operating-system crash or a power
cut: the last commits may be lost (the WAL is fsynced only at checkpoints); feedback for those is then
refused with ``UnknownSelectionError``.

**Taking** a selection for its feedback claims it in memory; its row is deleted by the next
:meth:`PendingStore.take` (or on close), i.e. after this feedback was committed to ``feedback.sqlite``
(the selector records feedback one at a time; a failed one puts the selection back). A process killed
in between loses nothing: on open, rows whose selection id the feedback log already holds are deleted
(``answered``), the others can still be answered. An id is therefore never answered twice, across
restarts included (the feedback log's unique ``selection_id`` backs this up).

**Expiry and the cap.** A selection older than ``ttl_s`` (``SelectorConfig.pending_ttl_s``) is
dropped and counted in :attr:`PendingStore.expired`; beyond ``max_pending`` rows the oldest (in order
of issue) are dropped and counted in :attr:`PendingStore.dropped` (both counts since open). The wall
clock may jump: a selection made before the clock was set back lives longer by the jump.

**Policy changes.** A selection answered after the learner updated (or after a restart with other
weights) is learned from as it was issued: with its logged propensities and ``policy_version``, as
off-policy data, like every row of the replay buffer. Rows of another dimension (a file copied from
another artifact) are dropped on open.

**Volatile state.** The file belongs to the running service, not to the artifact: its name starts with
a dot, so the manifest does not list or hash it (:func:`memento.selector.artifact.listed_files` skips dot-named
files), ``verify`` ignores it, and ``Selector.save(path)`` does not copy it to a new artifact (``cp -r``
would). It is created on the first ``put`` (loading an artifact to inspect it writes nothing), readable
by its owner only; a symbolic link, or anything but a regular file, in its place (or in place of its
``-wal``/``-shm`` sidecars) is refused with ``CheckpointError``: it is never followed.

**Threads.** The store has its own lock; ``put``/``take``/``purge`` may be called from any thread.

**Processes** (``memento serve --workers``): several processes may ``put`` into one file (``shared=True``;
SQLite serialises the write transactions, each waiting up to 30 s for the lock); only one of them, the
learner, may ``take``. ``take`` reads the row from the file, so a selection another process put is found.
A shared store does not trust its own row count (others insert and delete): it counts the rows in the file
before dropping any beyond ``max_pending``, and at least every 256 puts, so the cap holds within a few
hundred rows and a selection is never dropped while fewer than ``max_pending`` are waiting.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import logging
import os
import sqlite3
import stat
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from memento import sqlite
from memento.errors import CheckpointError, MementoError
from memento.io import loads_json

__all__ = ["PENDING_FORMAT", "PENDING_FORMAT_VERSION", "PENDING_NAME", "PendingSelection", "PendingStore",
           "answered_in"]

logger = logging.getLogger(__name__)

PENDING_NAME = ".pending.sqlite"
"""The store's file name inside an artifact (dot-named: volatile, never listed in the manifest)."""
PENDING_FORMAT = "memento-pending"
PENDING_FORMAT_VERSION = 1

_SIDECARS = ("-wal", "-shm", "-journal")
_WHAT = "pending-selection store"
_REMOVE_IT = "; remove it to start with no pending selections"
_SCHEMA = sqlite.META_SCHEMA + """
CREATE TABLE IF NOT EXISTS pending (
    seq INTEGER PRIMARY KEY,
    selection_id TEXT NOT NULL UNIQUE,
    created REAL NOT NULL,
    mode TEXT NOT NULL,
    policy_version INTEGER NOT NULL,
    env TEXT,
    ids TEXT NOT NULL,
    probs TEXT NOT NULL,
    set_prob REAL NOT NULL,
    state BLOB NOT NULL,
    cases BLOB NOT NULL,
    k INTEGER NOT NULL,
    d INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS pending_created ON pending (created);
"""
_COLUMNS = "selection_id, created, mode, policy_version, env, ids, probs, set_prob, state, cases, k, d"
_BATCH = 500
_CHECKPOINT_S = 0.5
_AUTOCHECKPOINT_PAGES = 1000  # SQLite's default, when the checkpoint thread is not running
_RECOUNT_EVERY = 256  # a shared store counts its rows in the file at least this often


@dataclasses.dataclass(frozen=True, kw_only=True)
class PendingSelection:
    """A selection waiting for its reward.

    ``state_D`` (float32 ``[D]``), ``ids`` (draw order), ``cases_KD`` (float32 ``[K, D]``), ``probs``
    (first-draw propensities, 1.0 for greedy), ``set_prob``, ``mode``, ``policy_version``, ``env``;
    ``created``: wall-clock seconds (``time.time()``) when it was issued.
    """

    state_D: np.ndarray
    ids: list[str]
    cases_KD: np.ndarray
    probs: list[float]
    set_prob: float
    mode: str
    policy_version: int
    env: str | None
    created: float = dataclasses.field(default_factory=time.time)


def answered_in(feedback: Any) -> Callable[[Sequence[str]], set[str]]:
    """The ``answered`` check of :meth:`PendingStore.open` over a :class:`memento.selector.artifact.FeedbackLog`
    (its ``connection``): which of the given selection ids the feedback log holds."""

    def answered(ids: Sequence[str]) -> set[str]:
        found: set[str] = set()
        for start in range(0, len(ids), _BATCH):
            chunk = list(ids[start:start + _BATCH])
            marks = ", ".join("?" * len(chunk))
            found.update(row[0] for row in feedback.connection.execute(
                f"SELECT selection_id FROM feedback WHERE selection_id IN ({marks})", chunk))
        return found

    return answered


def _refuse_non_regular(path: Path) -> None:
    """A symbolic link (or a directory, fifo, device) at ``path`` is refused; a missing path is fine."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(info.st_mode):
        what = "a symbolic link" if stat.S_ISLNK(info.st_mode) else "not a regular file"
        raise CheckpointError(f"{path}: {what}; the pending-selection store opens only a regular file "
                              "(remove it to start with no pending selections)")


class PendingStore:
    """The pending selections of one selector (see the module docstring). Build it with :meth:`open`."""

    def __init__(self, path: Path, *, dim: int, clock: Callable[[], float] = time.time,
                 answered: Callable[[Sequence[str]], set[str]] | None = None, shared: bool = False):
        self.path = path
        self.shared = shared
        self._puts = 0
        self.dim = int(dim)
        self._clock = clock
        self._answered = answered
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._rows = 0  # rows in the table, the claimed ones included
        self._claimed: set[str] = set()  # taken for a feedback; deleted by the next write
        self._closed = False
        self._inode: tuple[int, int] | None = None
        self._stop = threading.Event()
        self._checkpointer: threading.Thread | None = None
        self.expired = 0
        self.dropped = 0

    @classmethod
    def open(cls, path: str | Path, *, dim: int, clock: Callable[[], float] = time.time,
             answered: Callable[[Sequence[str]], set[str]] | None = None, shared: bool = False) -> PendingStore:
        """The store at ``path``: an existing file is opened and checked now (rows the ``answered`` check
        finds in the feedback log are deleted, rows of another ``dim`` dropped); a missing one is created
        by the first :meth:`put`. ``clock``: wall-clock seconds (tests inject one). ``shared``: other
        processes put into the same file (see the module docstring)."""
        store = cls(Path(path), dim=dim, clock=clock, answered=answered, shared=shared)
        if os.path.lexists(store.path):
            store._connection()
        return store

    # ------------------------------------------------------------------ opening

    def _connection(self) -> sqlite3.Connection:
        if self._closed:
            raise MementoError(f"{self.path}: the pending-selection store is closed")
        if self._conn is None:
            self._conn = self._open()
            self._checkpointer = threading.Thread(target=self._checkpoint_loop, name="memento-pending-checkpoint",
                                                  daemon=True)
            self._checkpointer.start()
        return self._conn

    def _checkpoint_loop(self) -> None:
        """Move the WAL into the file every ``_CHECKPOINT_S`` seconds, on a connection of its own (a passive
        checkpoint does not block the puts): the fsync it costs never lands on a ``select``."""
        conn: sqlite3.Connection | None = None
        try:
            while not self._stop.wait(_CHECKPOINT_S):
                if conn is None:
                    conn = sqlite.connect(self.path, timeout=0.0, autocommit=True)
                    now = os.lstat(self.path)
                    if (now.st_dev, now.st_ino) != self._inode:
                        raise CheckpointError(f"{self.path}: replaced since it was opened")
                conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        except (OSError, sqlite3.Error, CheckpointError) as error:
            logger.warning("%s: background checkpoints stopped (%s); the puts checkpoint now", self.path, error)
            with self._lock:
                if self._conn is not None:
                    self._conn.execute(f"PRAGMA wal_autocheckpoint={_AUTOCHECKPOINT_PAGES}")
        finally:
            if conn is not None:
                conn.close()

    def _open(self) -> sqlite3.Connection:
        path = self.path
        for name in (path, *(path.with_name(path.name + s) for s in _SIDECARS)):
            _refuse_non_regular(name)
        flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(path, flags, 0o600)
        except OSError as error:
            if error.errno == errno.ELOOP:
                raise CheckpointError(f"{path}: a symbolic link; the pending-selection store opens only a regular "
                                      "file (remove it to start with no pending selections)") from None
            raise CheckpointError(f"{path}: cannot open the pending-selection store ({error.strerror})") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise CheckpointError(f"{path}: not a regular file; the pending-selection store opens only a "
                                      "regular file")
            conn = sqlite.connect(path, timeout=30.0, autocommit=True)
            now = os.lstat(path)
            if (now.st_dev, now.st_ino) != (info.st_dev, info.st_ino):  # swapped between the check and the open
                conn.close()
                raise CheckpointError(f"{path}: replaced while it was being opened; refusing it")
            self._inode = (info.st_dev, info.st_ino)
        finally:
            os.close(fd)
        try:
            self._prepare(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def _prepare(self, conn: sqlite3.Connection) -> None:
        path = self.path
        try:
            tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if tables - {"meta", "pending"}:
                raise CheckpointError(f"{path}: not a pending-selection store (tables {sorted(tables)}); remove it "
                                      "to start with no pending selections")
            sqlite.use_wal(conn)
            conn.execute("PRAGMA wal_autocheckpoint=0")  # the checkpoint thread does it (see _checkpoint_loop)
            conn.executescript(_SCHEMA)
            meta = sqlite.read_meta(conn, path, what=_WHAT)
            if not meta:
                meta = {"format": PENDING_FORMAT, "format_version": str(PENDING_FORMAT_VERSION), "dim": str(self.dim)}
                sqlite.write_meta(conn, meta)
            sqlite.check_format(meta, path, format=PENDING_FORMAT, version=PENDING_FORMAT_VERSION, what=_WHAT,
                                exact=True, hint=_REMOVE_IT)
            if meta.get("dim") != str(self.dim):
                dropped = conn.execute("DELETE FROM pending").rowcount
                sqlite.write_meta(conn, {"dim": str(self.dim)})
                logger.warning("%s: dropped %d pending selection(s) of dim %s (this selector has dim %d)", path,
                               dropped, meta.get("dim"), self.dim)
            self._rows = int(conn.execute("SELECT COUNT(*) FROM pending").fetchone()[0])
            if self._rows and self._answered is not None:
                ids = [row[0] for row in conn.execute("SELECT selection_id FROM pending")]
                done = sorted(self._answered(ids))
                if done:
                    conn.execute("BEGIN IMMEDIATE")
                    conn.executemany("DELETE FROM pending WHERE selection_id = ?", [(sid,) for sid in done])
                    conn.execute("COMMIT")
                    self._rows -= len(done)
                    logger.info("%s: %d pending selection(s) were answered before the restart", path, len(done))
        except sqlite3.DatabaseError as error:
            raise CheckpointError(f"{path}: not a {_WHAT} ({error}){_REMOVE_IT}") from None
        if self._rows:
            logger.info("%s: %d pending selection(s) from before the restart", path, self._rows)

    # ------------------------------------------------------------------ the API

    def __len__(self) -> int:
        """Selections waiting (taken ones not included); a shared store counts the rows in the file."""
        with self._lock:
            if self.shared and self._conn is not None and not self._closed:
                with contextlib.suppress(sqlite3.Error):
                    self._rows = self._count(self._conn)
            return max(0, self._rows - len(self._claimed))

    @staticmethod
    def _count(conn: sqlite3.Connection) -> int:
        return int(conn.execute("SELECT COUNT(*) FROM pending").fetchone()[0])

    def put(self, selection_id: str, pending: PendingSelection, *, max_pending: int, ttl_s: float | None) -> None:
        """Commit ``pending`` under ``selection_id`` (one transaction), after dropping what expired and before
        dropping the oldest beyond ``max_pending``. Putting back a selection :meth:`take` handed out (its
        feedback failed) makes it answerable again, with its creation time."""
        state_D = np.ascontiguousarray(pending.state_D, dtype=np.float32).reshape(-1)
        cases_KD = np.ascontiguousarray(pending.cases_KD, dtype=np.float32)
        if state_D.shape != (self.dim,) or cases_KD.ndim != 2 or (cases_KD.shape[0] and cases_KD.shape[1] != self.dim):
            raise MementoError(f"{self.path}: pending selection {selection_id!r}: state {state_D.shape}, cases "
                               f"{cases_KD.shape}, the store holds dim {self.dim}")
        row = (selection_id, float(pending.created), str(pending.mode), int(pending.policy_version), pending.env,
               json.dumps(list(pending.ids)), json.dumps([float(p) for p in pending.probs]), float(pending.set_prob),
               state_D.tobytes(), cases_KD.tobytes(), int(cases_KD.shape[0]), int(cases_KD.shape[1]))
        with self._lock:
            conn = self._connection()
            now = self._clock()
            cutoff = None if ttl_s is None else now - ttl_s
            try:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    expired = self._delete_expired(conn, cutoff, self._claimed | {selection_id})
                    self._puts += 1
                    if self.shared and (self._puts % _RECOUNT_EVERY == 0 or self._rows - expired >= max_pending):
                        self._rows = self._count(conn) + expired  # other processes put and take too
                    rows = self._rows - expired
                    if cutoff is not None and row[1] < cutoff:  # put back after it expired: not kept
                        rows -= conn.execute("DELETE FROM pending WHERE selection_id = ?", (selection_id,)).rowcount
                        expired += 1
                    else:
                        rows += conn.execute(f"INSERT INTO pending ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, "
                                             "?, ?) ON CONFLICT (selection_id) DO NOTHING", row).rowcount
                    claimed = self._claimed - {selection_id}  # in flight or answered: neither expired nor dropped
                    dropped = 0
                    if self.shared and rows - len(claimed) > max_pending:
                        rows = self._count(conn)  # the true count, before anything is dropped
                    if rows - len(claimed) > max_pending:
                        marks = ", ".join("?" * len(claimed))
                        dropped = conn.execute(f"DELETE FROM pending WHERE seq IN (SELECT seq FROM pending WHERE "
                                               f"selection_id NOT IN ({marks}) ORDER BY seq LIMIT ?)",
                                               (*claimed, rows - len(claimed) - max_pending)).rowcount
                    conn.execute("COMMIT")
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
            except sqlite3.Error as error:
                raise CheckpointError(f"{self.path}: cannot record pending selection {selection_id!r} "
                                      f"({error})") from None
            self._claimed.discard(selection_id)
            self._rows = rows - dropped
            self.expired += expired
            self.dropped += dropped

    def take(self, selection_id: str, *, ttl_s: float | None) -> PendingSelection | None:
        """The selection waiting under ``selection_id``, handed out once (``None`` when unknown, already taken,
        or older than ``ttl_s``). Its row stays in the file until the next ``take`` (or :meth:`close`): call
        this once the previous selection's feedback was committed; :meth:`put` puts a taken selection back."""
        with self._lock:
            if self._closed:
                raise MementoError(f"{self.path}: the pending-selection store is closed")
            if self._conn is None and self.shared and os.path.lexists(self.path):
                self._connection()  # another process created the file after this store was opened
            if selection_id in self._claimed or self._conn is None:
                return None
            conn = self._conn
            try:
                if self._claimed:  # the previous feedbacks were committed (or put their selection back)
                    conn.execute("BEGIN IMMEDIATE")
                    try:
                        self._rows -= self._flush_claimed(conn)
                        conn.execute("COMMIT")
                    except BaseException:
                        conn.execute("ROLLBACK")
                        raise
                    self._claimed.clear()
                found = conn.execute(f"SELECT {_COLUMNS} FROM pending WHERE selection_id = ?",
                                     (selection_id,)).fetchone()
            except sqlite3.Error as error:
                raise CheckpointError(f"{self.path}: cannot take pending selection {selection_id!r} "
                                      f"({error})") from None
            if found is None:
                return None
            if ttl_s is not None and found[1] < self._clock() - ttl_s:
                self._purge_locked(ttl_s)
                return None
            try:
                pending = self._decode(found)
            except (ValueError, TypeError, json.JSONDecodeError) as error:
                logger.warning("%s: dropping damaged pending selection %r (%s)", self.path, selection_id, error)
                self._claimed.add(selection_id)  # deleted by the next take
                return None
            self._claimed.add(selection_id)
            return pending

    def purge(self, ttl_s: float | None) -> int:
        """Delete the selections older than ``ttl_s``; returns how many expired."""
        with self._lock:
            if self._closed or self._conn is None:
                return 0
            return self._purge_locked(ttl_s)

    def close(self) -> None:
        """Delete the rows of taken selections and close the file. Safe to call twice."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._stop.set()
            conn, self._conn = self._conn, None
        if self._checkpointer is not None:
            self._checkpointer.join()
        with self._lock:
            if conn is None:
                return
            try:
                if self._claimed:
                    conn.execute("BEGIN IMMEDIATE")
                    self._flush_claimed(conn)
                    conn.execute("COMMIT")
            except sqlite3.Error as error:
                logger.warning("%s: could not delete answered pending selections (%s); the next open does", self.path,
                               error)
            finally:
                conn.close()

    # ------------------------------------------------------------------ helpers (the lock held)

    def _purge_locked(self, ttl_s: float | None) -> int:
        conn = self._conn
        assert conn is not None
        if ttl_s is None:
            return 0
        cutoff = self._clock() - ttl_s
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                expired = self._delete_expired(conn, cutoff, self._claimed)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        except sqlite3.Error as error:
            raise CheckpointError(f"{self.path}: cannot drop expired pending selections ({error})") from None
        self._rows -= expired
        self.expired += expired
        return expired

    def _flush_claimed(self, conn: sqlite3.Connection) -> int:
        """Delete the rows of the taken selections; returns how many rows went."""
        return sum(conn.execute("DELETE FROM pending WHERE selection_id = ?", (sid,)).rowcount
                   for sid in sorted(self._claimed))

    @staticmethod
    def _delete_expired(conn: sqlite3.Connection, cutoff: float | None, keep: set[str]) -> int:
        """Delete the rows created before ``cutoff``, but those of the taken selections ``keep``."""
        if cutoff is None:
            return 0
        marks = ", ".join("?" * len(keep))
        return conn.execute(f"DELETE FROM pending WHERE created < ? AND selection_id NOT IN ({marks})",
                            (cutoff, *sorted(keep))).rowcount

    def _decode(self, row: tuple[Any, ...]) -> PendingSelection:
        _, created, mode, version, env, ids, probs, set_prob, state, cases, k, d = row
        ids_list, probs_list = loads_json(ids), loads_json(probs)  # bad JSON of any kind: a DataFormatError
        if (not isinstance(ids_list, list) or not all(isinstance(i, str) for i in ids_list)
                or not isinstance(probs_list, list) or len(probs_list) != len(ids_list) or k != len(ids_list)):
            raise ValueError(f"ids {ids!r} / probs {probs!r} / k={k} disagree")
        if len(state) != 4 * self.dim or (k and d != self.dim) or len(cases) != 4 * k * d:
            raise ValueError(f"state of {len(state)} bytes, cases {k}x{d} of {len(cases)} bytes, dim {self.dim}")
        return PendingSelection(state_D=np.frombuffer(state, dtype=np.float32).copy(), ids=ids_list,
                                cases_KD=np.frombuffer(cases, dtype=np.float32).reshape(k, d).copy(),
                                probs=[float(p) for p in probs_list], set_prob=float(set_prob), mode=str(mode),
                                policy_version=int(version), env=env, created=float(created))
