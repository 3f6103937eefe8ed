"""The directory bank: cases in one SQLite file (WAL), vectors in a faiss index beside it.

A bank is a directory::
    cases.sqlite   cases (id, state, action, reward, env, kind, meta JSON, created, content hash,
                   float32 embedding; scope_user/_agent/_session with the first scoped case, version and updated
                   with the first update in place) and a meta table (format, uid, BankConfig JSON)
    index.faiss    the faiss index over the embeddings (position p = case at position p)
    index.json     which bank and how many positions the index file covers

:class:`CaseBank` is the bank front (:class:`memento.bank.front.BankFront`: ids, de-duplication, validation,
tombstones, import/export) over three parts defined here: :class:`SqliteRows` (the ``cases`` and ``deleted``
tables), :class:`FaissVectors` (the faiss index over an in-memory mirror of the vectors) and
:class:`SqliteFeatures` (the case features' tables).

Two optional tables serve the Q-network's case features (:mod:`memento.learn.features`), created on first
write, so a bank that never uses them is left byte for byte as it was:

- ``usage (step, pos, reward)``: one row per time a case was shown (``record_usage``), so the usage
  statistics (times shown, reward when shown) are an aggregate of an append-only log; a resumed run
  rolls it back to its checkpoint with ``truncate_usage(step)``, exactly;
- ``action_embeddings (pos, embedding)``: the encoder's vector of each case's action (answer),
  computed once per case (``set_action_embeddings``);
- ``evidence (step, pos, weight, value)``: one row per time a case was labelled by the planner
  (``record_evidence``: its label advantage over its look-alike rivals, :mod:`memento.learn.evidence`), the
  soft-Q agent's per-case memory; rolled back with the usage log by ``truncate_usage(step)``;
- ``history (seq, pos, event, time, version, fields, link, old_*/new_* of action, reward, meta)``: the cases'
  stored events (``update``, and the ``add`` of a case a ``replace`` stored; :mod:`memento.bank.history`),
  created by the first; a deletion erases its cases' values there unless the bank was opened with ``audit=True``.

SQLite is the source of truth. Writes commit to SQLite first, then reach the in-memory
index; the index file is written on ``flush()``/``close()``. Opening a bank compares the
index file with SQLite: missing rows (a crash between the commit and the index write)
are added from SQLite, and an index from another bank, another factory or with more
rows than SQLite is rebuilt. Positions are dense: a case's row is never removed (except by ``truncate``).

**Forgetting.** :meth:`CaseBank.delete` and :meth:`CaseBank.replace` do not remove rows: they add a
tombstone to a ``deleted (pos, id, time, replaced_by)`` table (created on the first deletion), and every
search, candidate set and listing (``iter_cases``, ``export_jsonl``) leaves tombstoned positions out (the faiss
index keeps their vectors and is searched with a filter). So positions stay dense, the index file and the
artifact's append-only row digests (:mod:`memento.selector.artifact`) stay valid, and logged decisions that chose a
deleted case can still be replayed (``embeddings``/``positions_of``/``get(..., include_deleted=True)`` still read
its row; a plain ``get`` raises ``UnknownCaseError``). The row's text stays in ``cases.sqlite``; its usage rows and
action vector are removed, and so are the values in its history (unless ``audit=True``). A deleted case's id is
never reused: ``replace`` stores the new content under a new id.

**Updates in place.** ``update`` rewrites a case's action, reward and meta (and content hash) in its row, adds the
``version``/``updated`` columns on the first one (a bank without them reads version 1, updated = created) and an
``update`` event to ``history``, in one transaction.

One process writes a bank at a time. Other processes may follow it: ``CaseBank.open(path, read_only=True)``
never writes the SQLite file, the index files or temporaries (``flush``/``close`` write nothing; the write
methods raise ``BankError``), and :meth:`CaseBank.refresh` appends the rows another process committed since
to its in-memory mirror and faiss index (``memento serve --workers``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from memento import sqlite
from memento.bank.front import BankFront, Filter, NewRow, case_meta_json, stack_vectors
from memento.bank.history import EventRow
from memento.bank.index import FaissIndex, exact_topk
from memento.bank.vectorfile import (
    VECTORS_META_NAME,
    VECTORS_NAME,
    VECTORS_STORE_KEY,
    VectorFile,
    read_block_sums,
)
from memento.bank.where import Scope, Where
from memento.config import BankConfig, EncoderConfig, IndexConfig, VectorStore, from_dict, to_dict
from memento.errors import BankError, DataFormatError, DimensionError, NotABankError
from memento.io import atomic_write, atomic_write_text, remove_stale_temporaries
from memento.types import SCOPE_FIELDS, Case, shown

__all__ = ["BANK_FORMAT", "BANK_FORMAT_VERSION", "DERIVED_NAMES", "CaseBank", "FaissVectors", "SqliteFeatures",
           "SqliteRows", "VectorFile"]

logger = logging.getLogger(__name__)

BANK_FORMAT = "memento-bank"
BANK_FORMAT_VERSION = 1
DB_NAME = "cases.sqlite"
INDEX_NAME = "index.faiss"
INDEX_META_NAME = "index.json"
DERIVED_NAMES = (INDEX_NAME, INDEX_META_NAME, VECTORS_NAME, VECTORS_META_NAME)
"""The files beside cases.sqlite (a copy of a bank copies those that exist): the bank rebuilds the index files from
it; ``vectors.f32`` is the vectors' store of a disk bank (a cache of SQLite's copy in a disk bank made before issue
41), see :mod:`memento.bank.vectorfile`."""
_FILL_CHUNK = 32_768  # rows per pass over a bank's vectors (filling the index, loading the codes)
_CHUNK = 900  # below SQLite's bound on host parameters

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS cases (
    pos INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    state TEXT NOT NULL,
    action TEXT NOT NULL,
    reward REAL NOT NULL,
    env TEXT,
    kind TEXT NOT NULL,
    meta TEXT NOT NULL,
    created REAL NOT NULL,
    hash TEXT NOT NULL,
    embedding BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS cases_hash ON cases(hash);
"""

_FEATURE_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS usage (step INTEGER NOT NULL, pos INTEGER NOT NULL, reward REAL NOT NULL)",
    "CREATE INDEX IF NOT EXISTS usage_step ON usage(step)",
    "CREATE TABLE IF NOT EXISTS action_embeddings (pos INTEGER PRIMARY KEY, embedding BLOB NOT NULL)",
    "CREATE TABLE IF NOT EXISTS evidence (step INTEGER NOT NULL, pos INTEGER NOT NULL, weight REAL NOT NULL, "
    "value REAL NOT NULL)",
    "CREATE INDEX IF NOT EXISTS evidence_step ON evidence(step)",
)

_VECTOR_BLOCKS_SCHEMA = ("CREATE TABLE IF NOT EXISTS vector_blocks (block INTEGER PRIMARY KEY, rows INTEGER NOT NULL, "
                         "hash TEXT NOT NULL)")
"""A disk bank's checksum of each block of vectors.f32 (:mod:`memento.bank.vectorfile`)."""

_DELETED_SCHEMA = ("CREATE TABLE IF NOT EXISTS deleted (pos INTEGER PRIMARY KEY, id TEXT NOT NULL, time REAL NOT NULL, "
                   "replaced_by TEXT)")

_CASE_COLUMNS = "id, state, action, reward, env, kind, meta, created"
_SCOPE_COLUMNS = tuple(f"scope_{name}" for name in SCOPE_FIELDS)
_VERSION_COLUMNS = ("version", "updated")  # added by the first update in place (NULL: version 1, updated = created)
_HISTORY_COLUMNS = ("pos", "event", "time", "version", "fields", "link", "old_action", "old_reward", "old_meta",
                    "new_action", "new_reward", "new_meta")
_HISTORY_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS history (seq INTEGER PRIMARY KEY, pos INTEGER NOT NULL, event TEXT NOT NULL, "
    "time REAL NOT NULL, version INTEGER NOT NULL, fields TEXT NOT NULL, link TEXT, old_action TEXT, "
    "old_reward REAL, old_meta TEXT, new_action TEXT, new_reward REAL, new_meta TEXT)",
    "CREATE INDEX IF NOT EXISTS history_pos ON history(pos)",
)
_MATCH_CACHE = 32  # filter masks kept per bank (each is one bool per case)


def _chunks(seq: Sequence[Any], size: int = _CHUNK) -> Iterator[Sequence[Any]]:
    for start in range(0, len(seq), size):
        yield seq[start:start + size]


def _marks(chunk: Sequence[Any]) -> str:
    return ",".join("?" * len(chunk))


class SqliteRows:
    """The row store of a directory bank: the ``cases`` table and the ``deleted`` tombstones of ``cases.sqlite``.

    Writes run in :meth:`transaction` (``BEGIN IMMEDIATE`` .. ``COMMIT``, rolled back on any error). The ids are
    mirrored in memory on first need (``ids_at``); the tombstoned positions too, re-read by a read-only bank when
    another process added some (one indexed read per call)."""

    def __init__(self, path: Path, conn: sqlite3.Connection, *, read_only: bool, store: VectorFile | None = None):
        self.name = path
        self.conn = conn
        self.read_only = read_only
        self.store = store  # a disk bank's vectors.f32, where its vectors are stored (SQLite keeps none)
        self._ids: list[str] = []
        self._mirror_lock = threading.Lock()
        self._deleted_pos: np.ndarray | None = None
        self._deleted_key = -1  # MAX(rowid) of the deleted table when loaded
        self._scoped = False  # the scope columns exist (added on the first scoped case)
        self._versioned = False  # the version columns exist (added on the first update in place)
        self._matches: dict[tuple[str, int, int], np.ndarray] = {}  # filter masks by (filter, count, generation)
        self.generation = 0  # bumped by every write that can change what a filter matches

    def _has_table(self, name: str) -> bool:
        row = self.conn.execute("SELECT COUNT(*) FROM sqlite_master WHERE type='table' AND name=?", (name,)).fetchone()
        return bool(row[0])

    def has_scope_columns(self) -> bool:
        """Whether the ``scope_*`` columns exist (a bank gets them with its first scoped case; re-read until then,
        as another process may add them)."""
        if not self._scoped:
            columns = {row[1] for row in self.conn.execute("PRAGMA table_info(cases)")}
            self._scoped = set(_SCOPE_COLUMNS) <= columns
        return self._scoped

    def has_version_columns(self) -> bool:
        """Whether the ``version``/``updated`` columns exist (a bank gets them with its first update in place)."""
        if not self._versioned:
            columns = {row[1] for row in self.conn.execute("PRAGMA table_info(cases)")}
            self._versioned = set(_VERSION_COLUMNS) <= columns
        return self._versioned

    def _add_version_columns(self) -> None:
        """Inside a write's transaction (a rollback takes them back: re-read after it)."""
        if not self.has_version_columns():
            self.conn.execute("ALTER TABLE cases ADD COLUMN version INTEGER")
            self.conn.execute("ALTER TABLE cases ADD COLUMN updated REAL")
        self._versioned = False

    def _case_columns(self) -> str:
        scope = ", ".join(_SCOPE_COLUMNS) if self.has_scope_columns() else "NULL, NULL, NULL"
        version = "COALESCE(version, 1), COALESCE(updated, created)" if self.has_version_columns() else "1, created"
        return f"{_CASE_COLUMNS}, {scope}, {version}"

    def matching(self, scope: Scope | None, meta: Where | None, count: int) -> np.ndarray:
        """A bool mask over positions ``0..count-1``: the cases in ``scope`` that match the filter ``meta`` (one
        SQLite query, kept until the bank changes)."""
        key = (json.dumps([None if scope is None else [scope.to_json(), scope.include_global],
                           None if meta is None else meta.to_json()], sort_keys=True), count, self.generation)
        mask = self._matches.get(key)
        if mask is not None:
            return mask
        clauses, params = ["pos < ?"], [count]
        scoped = self.has_scope_columns()  # without the columns, no case carries a scope yet
        for part in (scope, meta):
            if part is not None:
                sql, extra = (part.sql(scoped=scoped) if part is scope else
                              part.sql(scoped=scoped, versioned=self.has_version_columns()))
                clauses.append(sql)
                params += extra
        mask = np.zeros(count, dtype=bool)
        try:
            rows = self.conn.execute(f"SELECT pos FROM cases WHERE {' AND '.join(clauses)}", params)
            mask[np.fromiter((row[0] for row in rows), dtype=np.int64)] = True
        except sqlite3.DatabaseError as error:
            raise BankError(f"{self.name}: damaged bank ({DB_NAME}: {error})") from None
        if len(self._matches) >= _MATCH_CACHE:
            self._matches.pop(next(iter(self._matches)))
        self._matches[key] = mask
        return mask

    def _changed(self) -> None:
        self.generation += 1
        self._matches.clear()

    def count(self) -> int:
        return int(self.conn.execute("SELECT COALESCE(MAX(pos) + 1, 0) FROM cases").fetchone()[0])

    @contextmanager
    def transaction(self, what: str) -> Iterator[None]:
        conn = self.conn
        try:
            conn.execute("BEGIN IMMEDIATE")
            yield
            conn.commit()
        except sqlite3.IntegrityError as error:
            self._rolled_back()
            raise DataFormatError(f"{self.name}: {what} the bank's constraints ({error})") from None
        except BaseException:
            self._rolled_back()
            raise
        if self.store is not None:
            self.store.committed()

    def _rolled_back(self) -> None:
        self.conn.rollback()
        self._scoped = self._versioned = False  # columns added in it are gone
        if self.store is not None:
            self.store.rolled_back()  # rows it appended to vectors.f32 are cut again

    def block_sums(self) -> dict[int, tuple[int, str]]:
        """The ``vector_blocks`` table: ``{block: (rows, checksum)}``."""
        return read_block_sums(self.conn, f"{self.name}: {DB_NAME}")

    def _put_block_sums(self, sums: Sequence[tuple[int, int, str]]) -> None:
        self.conn.executemany("INSERT OR REPLACE INTO vector_blocks (block, rows, hash) VALUES (?, ?, ?)", sums)

    def find(self, ids: Sequence[str]) -> dict[str, int]:
        found: dict[str, int] = {}
        for chunk in _chunks(list(ids)):
            found.update(self.conn.execute(f"SELECT id, pos FROM cases WHERE id IN ({_marks(chunk)})", list(chunk)))
        return found

    def live_by_hash(self, hashes: Sequence[str], dead: int | None) -> dict[str, str]:
        live = " AND pos NOT IN (SELECT pos FROM deleted)" if self._has_table("deleted") else ""
        if dead is not None:
            live += f" AND pos != {int(dead)}"
        existing: dict[str, str] = {}
        for chunk in _chunks(list(hashes)):
            existing.update(self.conn.execute(
                f"SELECT hash, MIN(id) FROM cases WHERE hash IN ({_marks(chunk)}){live} GROUP BY hash", list(chunk)))
        return existing

    def insert(self, rows: Sequence[NewRow]) -> None:
        self._changed()
        if not self.has_scope_columns() and any(value is not None for r in rows for value in r.case.scope):
            for column in _SCOPE_COLUMNS:  # inside the write's transaction: the columns come with the rows
                self.conn.execute(f"ALTER TABLE cases ADD COLUMN {column} TEXT")
                self.conn.execute(f"CREATE INDEX IF NOT EXISTS cases_{column} ON cases({column})")
            self._scoped = False
        versioned = any(r.case.version != 1 or r.case.updated is not None for r in rows)  # a copied bank's cases
        if versioned:
            self._add_version_columns()
        columns = ["pos", "id", "state", "action", "reward", "env", "kind", "meta", "created", "hash", "embedding"]
        stored = self.store is not None
        try:
            scoped = self.has_scope_columns()
            if scoped:
                columns += _SCOPE_COLUMNS
            if versioned:
                columns += _VERSION_COLUMNS
            self.conn.executemany(
                f"INSERT INTO cases ({', '.join(columns)}) VALUES ({_marks(columns)})",
                [(r.pos, r.id, r.case.state, r.case.action, r.case.reward, r.case.env, r.case.kind, r.meta, r.created,
                  r.hash, b"" if stored else r.vector_D.tobytes(), *(r.case.scope if scoped else ()),
                  *((r.case.version, r.case.updated) if versioned else ())) for r in rows])
            if self.store is not None and rows:  # the vectors reach the disk before the commit that names them
                self._put_block_sums(self.store.stage(stack_vectors(rows), rows[0].pos))
        finally:
            self._scoped = self._versioned = False  # re-read after the transaction (a rollback takes new columns back)

    def update(self, position: int, case: Case, digest: str) -> None:
        """Rewrite the updatable fields of the row at ``position`` (action, reward, meta), its content hash, version
        and update time from ``case``, in the caller's transaction."""
        self._add_version_columns()
        self.conn.execute("UPDATE cases SET action = ?, reward = ?, meta = ?, hash = ?, version = ?, updated = ? "
                          "WHERE pos = ?", (case.action, case.reward, case_meta_json(case), digest, case.version,
                                            case.updated, position))
        self._changed()

    def live_positions(self, where: Filter, count: int) -> np.ndarray:
        """The live positions below ``count`` that ``where`` keeps (env, kind, positive, scope, meta), sorted."""
        clauses, params = ["pos < ?"], [count]
        for column, value in (("env", where.env), ("kind", where.kind)):
            if value is not None:
                clauses.append(f"{column} = ?")
                params.append(value)
        if where.positive:
            clauses.append("reward > 0")
        scoped = self.has_scope_columns()  # without the columns, no case carries a scope yet
        for part in (where.scope, where.meta):
            if part is not None:
                sql, extra = (part.sql(scoped=scoped) if part is where.scope else
                              part.sql(scoped=scoped, versioned=self.has_version_columns()))
                clauses.append(sql)
                params += extra
        if self._has_table("deleted"):
            clauses.append("pos NOT IN (SELECT pos FROM deleted)")
        try:
            rows = self.conn.execute(f"SELECT pos FROM cases WHERE {' AND '.join(clauses)} ORDER BY pos", params)
            return np.fromiter((row[0] for row in rows), dtype=np.int64)
        except sqlite3.DatabaseError as error:
            raise BankError(f"{self.name}: damaged bank ({DB_NAME}: {error})") from None

    def tombstones_at(self, positions: Sequence[int]) -> dict[int, tuple[float, str | None]]:
        """``{pos: (time, replaced_by)}`` of those ``positions`` that are tombstoned."""
        if not self._has_table("deleted"):
            return {}
        out: dict[int, tuple[float, str | None]] = {}
        for chunk in _chunks(sorted({int(p) for p in positions})):
            for pos, when, replaced_by in self.conn.execute(
                    f"SELECT pos, time, replaced_by FROM deleted WHERE pos IN ({_marks(chunk)})", list(chunk)):
                out[int(pos)] = (float(when), replaced_by or None)
        return out

    def tombstone(self, positions: Sequence[int], ids: Sequence[str], replaced_by: str | None) -> None:
        self.conn.execute(_DELETED_SCHEMA)
        now = time.time()
        self.conn.executemany("INSERT INTO deleted (pos, id, time, replaced_by) VALUES (?, ?, ?, ?)",
                              [(int(p), case_id, now, replaced_by) for p, case_id in zip(positions, ids)])
        self._deleted_pos, self._deleted_key = None, -1
        self._changed()

    def deleted_positions(self) -> np.ndarray:
        if self._deleted_pos is not None and not self.read_only:
            return self._deleted_pos
        if not self._has_table("deleted"):
            self._deleted_pos, self._deleted_key = np.zeros(0, dtype=np.int64), 0
            return self._deleted_pos
        (key,) = self.conn.execute("SELECT COALESCE(MAX(rowid), 0) FROM deleted").fetchone()
        if self._deleted_pos is None or int(key) != self._deleted_key:
            rows = self.conn.execute("SELECT pos FROM deleted ORDER BY pos").fetchall()
            self._deleted_pos = np.asarray([r[0] for r in rows], dtype=np.int64)
            self._deleted_key = int(key)
        return self._deleted_pos

    def deleted_ids(self) -> list[str]:
        if not self._has_table("deleted"):
            return []
        return [r[0] for r in self.conn.execute("SELECT id FROM deleted ORDER BY pos")]

    def ids_at(self, positions: Sequence[int]) -> list[str]:
        top = max(positions, default=-1)
        if top >= len(self._ids):  # read the ids up to there (rows added since, by this or another process)
            with self._mirror_lock:  # readers search in parallel (memento.selector.runtime)
                have = len(self._ids)
                rows = self.conn.execute("SELECT pos, id FROM cases WHERE pos >= ? AND pos <= ? ORDER BY pos",
                                         (have, top)).fetchall()
                if [r[0] for r in rows] != list(range(have, max(have, top + 1))):
                    raise BankError(f"{self.name}: case positions {have}..{top} are not dense")
                self._ids.extend(r[1] for r in rows)
        return [self._ids[p] for p in positions]

    def _case(self, row: tuple[Any, ...]) -> Case:
        case_id, state, action, reward, env, kind, meta, created, user, agent, session, version, updated = row
        try:
            data = json.loads(meta)
        except (TypeError, ValueError, RecursionError) as error:
            raise BankError(f"{self.name}: damaged bank ({DB_NAME}: the meta of case {case_id!r} is not JSON: "
                            f"{error})") from None
        try:
            return Case(id=case_id, state=state, action=action, reward=reward, env=env, kind=kind, meta=data,
                        created=created, user=user, agent=agent, session=session, version=version, updated=updated)
        except DataFormatError as error:  # a row written outside memento, or before a field's range was decided
            raise BankError(f"{self.name}: case {shown(case_id)} in {DB_NAME} is out of range: {error}") from None

    def _by_position(self, columns: str, positions: Sequence[int]) -> dict[int, tuple[Any, ...]]:
        rows: dict[int, tuple[Any, ...]] = {}
        for chunk in _chunks(sorted(set(positions))):
            for row in self.conn.execute(f"SELECT pos, {columns} FROM cases WHERE pos IN ({_marks(chunk)})",
                                         list(chunk)):
                rows[row[0]] = row[1:]
        return rows

    def cases_at(self, positions: Sequence[int]) -> list[Case]:
        rows = self._by_position(self._case_columns(), positions)
        return [self._case(rows[p]) for p in positions]

    def rewards_at(self, positions: Sequence[int]) -> np.ndarray:
        rows = self._by_position("reward", positions)
        return np.array([rows[p][0] for p in positions], dtype=np.float64)

    def set_reward(self, position: int, reward: float) -> None:
        self.conn.execute("UPDATE cases SET reward = ? WHERE pos = ?", (reward, position))

    def rewarded(self, count: int) -> np.ndarray:
        """The positions below ``count`` whose stored reward is > 0 (read now: rewards change)."""
        rows = self.conn.execute("SELECT pos FROM cases WHERE reward > 0 AND pos < ?", (count,))
        return np.fromiter((row[0] for row in rows), dtype=np.int64)

    def scan(self, batch_size: int) -> Iterator[Case]:
        start = 0
        dead = set(self.deleted_positions().tolist())  # tombstoned cases are left out
        while True:
            try:
                rows = self.conn.execute(f"SELECT {self._case_columns()}, pos FROM cases WHERE pos >= ? ORDER BY pos "
                                         "LIMIT ?", (start, batch_size)).fetchall()
            except sqlite3.DatabaseError as error:
                raise BankError(f"{self.name}: damaged bank ({DB_NAME}: {error})") from None
            if not rows:
                return
            for row in rows:
                if row[-1] not in dead:
                    yield self._case(row[:-1])
            start = rows[-1][-1] + 1

    def mirror(self, start: int, stop: int | None = None) -> tuple[list[str | None], list[str], np.ndarray, int]:
        """``(envs, kinds, emb_ND, dim)`` of the rows ``start..stop-1`` (all from ``start`` when None), checked
        dense."""
        top = self.count() if stop is None else stop
        if self.store is not None:
            envs, kinds = self.labels(start, top)
            return envs, kinds, self.store.read(start, top).reshape(-1), top - start
        rows = self.conn.execute("SELECT pos, env, kind, embedding FROM cases WHERE pos >= ? AND pos < ? "
                                 "ORDER BY pos", (start, top)).fetchall()
        if [r[0] for r in rows] != list(range(start, top)):
            raise BankError(f"{self.name}: case positions {start}..{top - 1} are not dense")
        blobs = b"".join(r[3] for r in rows)
        return [r[1] for r in rows], [r[2] for r in rows], np.frombuffer(blobs, dtype=np.float32), len(rows)

    def labels(self, start: int, stop: int) -> tuple[list[str | None], list[str]]:
        """``(envs, kinds)`` of the rows ``start..stop-1`` (no vectors), checked dense."""
        rows = self.conn.execute("SELECT pos, env, kind FROM cases WHERE pos >= ? AND pos < ? ORDER BY pos",
                                 (start, stop)).fetchall()
        if len(rows) != stop - start or (rows and (rows[0][0] != start or rows[-1][0] != stop - 1)):
            raise BankError(f"{self.name}: case positions {start}..{stop - 1} are not dense")
        return [r[1] for r in rows], [r[2] for r in rows]

    def truncate(self, n: int) -> None:
        if self.store is not None:  # the file is cut after the commit (FaissVectors.truncate)
            drop_from, partial = self.store.truncation(n)
            self.conn.execute("DELETE FROM vector_blocks WHERE block >= ?", (drop_from,))
            if partial is not None:
                self._put_block_sums([partial])
        self.conn.execute("DELETE FROM cases WHERE pos >= ?", (n,))
        if self._has_table("deleted"):
            self.conn.execute("DELETE FROM deleted WHERE pos >= ?", (n,))
        self._ids = self._ids[:n]
        self._deleted_pos, self._deleted_key = None, -1
        self._changed()

    def summary(self) -> dict[str, Any]:
        conn = self.conn
        n, mean_reward, positives = conn.execute(
            "SELECT COUNT(*), AVG(reward), SUM(reward > 0) FROM cases").fetchone()
        by_kind = dict(conn.execute("SELECT kind, COUNT(*) FROM cases GROUP BY kind ORDER BY kind").fetchall())
        by_env = dict(conn.execute("SELECT env, COUNT(*) FROM cases GROUP BY env ORDER BY env").fetchall())
        sizes = {p.name: p.stat().st_size for p in sorted(self.name.iterdir()) if p.is_file()}
        return {"cases": int(n), "reward_mean": None if mean_reward is None else float(mean_reward),
                "reward_positive": int(positives or 0), "by_kind": by_kind, "by_env": by_env, "files": sizes}

    def close(self) -> None:
        self.conn.close()


class SqliteFeatures:
    """The case features of a directory bank: the ``usage`` and ``action_embeddings`` tables of ``cases.sqlite``
    (created on first write), and the cases' ``history`` log (:mod:`memento.bank.history`, created on the first
    event). ``forget``/``truncate``/``record_events`` run in the row store's transaction. ``keep_values``: a
    forgotten case's history keeps its values (a bank opened with ``audit=True``)."""

    def __init__(self, rows: SqliteRows, dim: int):
        self._rows = rows
        self._dim = dim
        self.keep_values = False

    @property
    def _conn(self) -> sqlite3.Connection:
        return self._rows.conn

    def _has_tables(self) -> bool:
        return self._rows._has_table("usage")

    def _has_evidence(self) -> bool:
        return self._rows._has_table("evidence")  # a bank written before the evidence log has usage without it

    def _ensure_tables(self) -> None:
        if not self._has_tables() or not self._has_evidence():
            with self._conn:
                for statement in _FEATURE_SCHEMA:
                    self._conn.execute(statement)

    def record(self, step: int, positions_K: np.ndarray, reward: float) -> None:
        self._ensure_tables()
        with self._conn:
            self._conn.executemany("INSERT INTO usage (step, pos, reward) VALUES (?, ?, ?)",
                                   [(step, int(p), reward) for p in positions_K])

    def totals(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        shown_N = np.zeros(n, dtype=np.int64)
        reward_N = np.zeros(n, dtype=np.float64)
        if self._has_tables():
            for pos, count, total in self._conn.execute(
                    "SELECT pos, COUNT(*), SUM(reward) FROM usage WHERE pos < ? GROUP BY pos", (n,)):
                shown_N[pos], reward_N[pos] = int(count), float(total)
        return shown_N, reward_N

    def record_evidence(self, step: int, positions_M: np.ndarray, weight_M: np.ndarray, value_M: np.ndarray) -> None:
        self._ensure_tables()
        with self._conn:
            self._conn.executemany("INSERT INTO evidence (step, pos, weight, value) VALUES (?, ?, ?, ?)",
                                   [(step, int(p), float(w), float(v))
                                    for p, w, v in zip(positions_M, weight_M, value_M)])

    def evidence_totals(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        count_N, weight_N, value_N = np.zeros(n, dtype=np.int64), np.zeros(n), np.zeros(n)
        if self._has_evidence():
            for pos, count, weight, value in self._conn.execute(
                    "SELECT pos, COUNT(*), SUM(weight), SUM(value) FROM evidence WHERE pos < ? GROUP BY pos", (n,)):
                count_N[pos], weight_N[pos], value_N[pos] = int(count), float(weight), float(value)
        return count_N, weight_N, value_N

    def _logs(self) -> tuple[str, ...]:
        """The per-step logs that exist: ``usage`` and ``evidence``."""
        return tuple(name for name, have in (("usage", self._has_tables()), ("evidence", self._has_evidence()))
                     if have)

    def truncate_steps(self, step: int) -> int:
        logs = self._logs()
        with self._conn:
            return sum(int(self._conn.execute(f"DELETE FROM {name} WHERE step >= ?", (step,)).rowcount)
                       for name in logs)

    def forget(self, positions: Sequence[int]) -> None:
        tables = (*self._logs(), "action_embeddings") if self._has_tables() else ()
        erase = not self.keep_values and self._rows._has_table("history")
        for chunk in _chunks([int(p) for p in positions]):
            for name in tables:
                self._conn.execute(f"DELETE FROM {name} WHERE pos IN ({_marks(chunk)})", list(chunk))
            if erase:  # the values go; kind, time, version and the fields' names stay
                self._conn.execute("UPDATE history SET old_action = NULL, old_reward = NULL, old_meta = NULL, "
                                   "new_action = NULL, new_reward = NULL, new_meta = NULL "
                                   f"WHERE pos IN ({_marks(chunk)})", list(chunk))

    def truncate(self, n: int) -> None:
        if self._has_tables():
            for name in (*self._logs(), "action_embeddings"):
                self._conn.execute(f"DELETE FROM {name} WHERE pos >= ?", (n,))
        if self._rows._has_table("history"):
            self._conn.execute("DELETE FROM history WHERE pos >= ?", (n,))

    def drop_actions(self, positions: Sequence[int]) -> None:
        """Remove the stored action vectors of ``positions`` (their action changed), in the caller's transaction."""
        if self._has_tables():
            for chunk in _chunks([int(p) for p in positions]):
                self._conn.execute(f"DELETE FROM action_embeddings WHERE pos IN ({_marks(chunk)})", list(chunk))

    def record_events(self, events: Sequence[EventRow]) -> None:
        """Append events to the history log, in the caller's transaction (the table is created by the first)."""
        if not events:
            return
        for statement in _HISTORY_SCHEMA:
            self._conn.execute(statement)
        self._conn.executemany(f"INSERT INTO history ({', '.join(_HISTORY_COLUMNS)}) VALUES "
                               f"({_marks(_HISTORY_COLUMNS)})",
                               [tuple(e.columns()[name] for name in _HISTORY_COLUMNS) for e in events])

    def events_at(self, position: int) -> list[EventRow]:
        """The stored events of the case at ``position``, oldest first."""
        if not self._rows._has_table("history"):
            return []
        rows = self._conn.execute(f"SELECT {', '.join(_HISTORY_COLUMNS)} FROM history WHERE pos = ? ORDER BY seq",
                                  (int(position),)).fetchall()
        return [EventRow.from_columns(dict(zip(_HISTORY_COLUMNS, row))) for row in rows]

    def actions_at(self, positions_C: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        emb_CD = np.zeros((positions_C.size, self._dim), dtype=np.float32)
        have_C = np.zeros(positions_C.size, dtype=bool)
        if not positions_C.size or not self._has_tables():
            return emb_CD, have_C
        for chunk in _chunks(np.unique(positions_C).tolist()):
            for pos, blob in self._conn.execute(
                    f"SELECT pos, embedding FROM action_embeddings WHERE pos IN ({_marks(chunk)})", list(chunk)):
                rows = positions_C == pos
                emb_CD[rows], have_C[rows] = np.frombuffer(blob, dtype=np.float32), True
        return emb_CD, have_C

    def set_actions(self, positions_C: np.ndarray, emb_CD: np.ndarray) -> None:
        self._ensure_tables()
        with self._conn:
            self._conn.executemany("INSERT OR REPLACE INTO action_embeddings (pos, embedding) VALUES (?, ?)",
                                   [(int(p), np.ascontiguousarray(v, dtype=np.float32).tobytes())
                                    for p, v in zip(positions_C, emb_CD)])


class FaissVectors:
    """The vector index of a directory bank: a faiss index over the vectors, with env and kind codes for the
    filters. ``BankConfig.vectors="ram"`` keeps every vector in an in-memory mirror loaded from SQLite on first
    need; ``"disk"`` reads them from a :class:`VectorFile` (the index, which may be compressed, and the
    candidates' rows are all that is in memory). The index file is written on :meth:`flush`."""

    def __init__(self, rows: SqliteRows, config: BankConfig, uid: str, count: int, *, use_gpu: bool, seed: int,
                 read_only: bool):
        self._rows = rows
        self._dir = rows.name
        self.config = config
        self._uid = uid
        self._count = count
        self._rng = np.random.default_rng(seed)
        self._use_gpu = use_gpu
        self._read_only = read_only
        self._emb_ND = np.zeros((0, config.dim), dtype=np.float32)
        self._n = 0  # rows in the mirror (ram) / in the env and kind codes (disk)
        self._env_codes_N = np.zeros(0, dtype=np.int32)
        self._kind_codes_N = np.zeros(0, dtype=np.int32)
        self._env_vocab: dict[str | None, int] = {}
        self._kind_vocab: dict[str, int] = {}
        self._loaded = count == 0  # an empty bank's mirror is complete: adds extend it in memory
        self._load_lock = threading.Lock()
        self._file: VectorFile | None = None
        self._file_rows = 0  # disk: positions read from the file; the rest (a follower's) are in _tail_ND
        self._tail_ND = np.zeros((0, config.dim), dtype=np.float32)
        if rows.store is not None:  # the file is the store: checked block by block against SQLite's checksums
            self._file = rows.store
            self._file.check(count, rows.block_sums(), writer=not read_only)
            self._file_rows = count
        elif config.vectors == "disk":  # a bank made before issue 41: the file caches SQLite's vectors
            self._file = VectorFile(self._dir, uid, config.dim)
            if read_only:
                self._file_rows = min(self._file.rows(), count)
                if self._file_rows < count:
                    _, _, emb, n = rows.mirror(self._file_rows, count)
                    self._tail_ND = emb.reshape(n, config.dim)
            else:
                self._file.repair(rows, count)
                self._file_rows = count
        self._index = FaissIndex(config.index, config.dim, use_gpu=use_gpu)
        self._dirty = False
        self._live: tuple[np.ndarray, np.ndarray] | None = None  # (the store's deleted positions, ~deleted mask)
        self._open_index()

    def _open_index(self) -> None:
        """Load index.faiss if it belongs to this bank; catch up or rebuild from SQLite otherwise."""
        stored = self._stored_index()
        if stored is not None and stored.ntotal <= self._count:
            self._index = FaissIndex.from_faiss(stored, self.config.index, use_gpu=self._use_gpu)
            missing = self._count - stored.ntotal
            if missing:
                logger.warning("%s: index is %d case(s) behind SQLite; adding them", self._dir, missing)
                self._fill(stored.ntotal)
                self._dirty = True
            return
        if self._count:
            logger.warning("%s: index missing or stale; rebuilding from %d cases", self._dir, self._count)
        self._index = FaissIndex(self.config.index, self.config.dim, use_gpu=self._use_gpu)
        self._dirty = True
        if self._count:
            self._train_and_fill(0)

    def _stored_index(self) -> Any:
        index_path, meta_path = self._dir / INDEX_NAME, self._dir / INDEX_META_NAME
        for path in (index_path, meta_path):  # a link or a special file is never followed (a FIFO would hang)
            if path.is_symlink() or (path.exists() and not path.is_file()):
                logger.warning("%s: not a regular file; rebuilding the index from SQLite", path)
                return None
        if not (index_path.exists() and meta_path.exists()):
            return None
        try:
            if meta_path.stat().st_size > 1 << 16:
                raise ValueError(f"{meta_path.stat().st_size} bytes")
            info = json.loads(meta_path.read_text(encoding="utf-8"))
            if not isinstance(info, dict):  # "[]", "null": as unreadable as bad JSON
                raise ValueError(f"expected a JSON object, got {type(info).__name__}")
            if (info.get("uid") != self._uid or info.get("factory") != self.config.index.factory
                    or info.get("dim") != self.config.dim):
                return None
            stored = FaissIndex.read(str(index_path))
            return stored if stored.ntotal == info.get("ntotal") and stored.d == self.config.dim else None
        except (OSError, ValueError, RuntimeError, RecursionError) as error:
            logger.warning("%s: unreadable index (%s); rebuilding from SQLite", self._dir,
                           str(error).splitlines()[0][:160] if str(error) else type(error).__name__)
            return None

    @staticmethod
    def _code(vocab: dict[Any, int], value: Any) -> int:
        if value not in vocab:
            vocab[value] = len(vocab)
        return vocab[value]

    def _append_mirror(self, envs: Sequence[str | None], kinds: Sequence[str], emb_ND: np.ndarray | None) -> None:
        """Extend the env and kind codes, and in ram mode the mirror of the vectors."""
        n_old, n_new = self._n, len(envs)
        if n_old + n_new > self._env_codes_N.shape[0]:
            capacity = max(1024, 2 * (n_old + n_new))
            if self._file is None:
                grown = np.zeros((capacity, self.config.dim), dtype=np.float32)
                grown[:n_old] = self._emb_ND[:n_old]
                self._emb_ND = grown
            self._env_codes_N = np.resize(self._env_codes_N, capacity)
            self._kind_codes_N = np.resize(self._kind_codes_N, capacity)
        if self._file is None:
            self._emb_ND[n_old:n_old + n_new] = emb_ND
        self._env_codes_N[n_old:n_old + n_new] = [self._code(self._env_vocab, e) for e in envs]
        self._kind_codes_N[n_old:n_old + n_new] = [self._code(self._kind_vocab, k) for k in kinds]
        self._n += n_new

    def _load(self) -> None:
        """The mirror (ram) or the env and kind codes (disk) of every position, once."""
        if self._loaded:
            return
        with self._load_lock:  # readers search in parallel (memento.selector.runtime)
            if self._loaded:
                return
            self._n, self._env_vocab, self._kind_vocab = 0, {}, {}
            if self._file is None:
                envs, kinds, emb, n = self._rows.mirror(0, self._count)
                self._append_mirror(envs, kinds, emb.reshape(n, self.config.dim))
            else:
                for start in range(0, self._count, _FILL_CHUNK):
                    self._append_mirror(*self._rows.labels(start, min(self._count, start + _FILL_CHUNK)), None)
            self._loaded = True

    def _embeddings_ND(self) -> np.ndarray:
        """Every position's vector: the mirror (ram), the mapped file (disk; with a follower's rows from SQLite
        the whole bank is read into memory, which only small banks and exact searches ask for)."""
        if self._file is None:
            self._load()
            return self._emb_ND[:self._count]
        if not len(self._tail_ND):
            return self._file.view(self._count)
        return np.concatenate([self._file.view(self._file_rows), self._tail_ND])

    def _take(self, positions: np.ndarray) -> np.ndarray:
        """The vectors at ``positions`` (any shape), read from the mirror or by position from the file."""
        if self._file is None:
            return self._embeddings_ND()[positions]
        if not len(self._tail_ND):
            return self._file.take(positions, self._count)
        out = np.empty((*np.shape(positions), self.config.dim), dtype=np.float32)
        in_file = positions < self._file_rows
        out[in_file] = self._file.take(positions[in_file], self._file_rows)
        out[~in_file] = self._tail_ND[positions[~in_file] - self._file_rows]
        return out

    def _rows_ND(self, start: int, stop: int) -> np.ndarray:
        """Positions ``start..stop-1`` as one in-memory array (a chunk of a pass over the bank)."""
        if self._file is None:
            return self._embeddings_ND()[start:stop]
        if stop <= self._file_rows:
            return self._file.read(start, stop)
        return self._take(np.arange(start, stop))

    def _fill(self, first_new: int) -> None:
        """Add positions ``first_new..`` to the (trained) index, a chunk at a time."""
        for start in range(first_new, self._count, _FILL_CHUNK):
            self._index.add(self._rows_ND(start, min(self._count, start + _FILL_CHUNK)))

    def _train_and_fill(self, first_new: int) -> None:
        """Add positions ``first_new..`` to the index, training it first once there are enough vectors."""
        if self._index.is_trained:
            self._fill(first_new)
            return
        if self._count >= self._index.min_train:
            sample = self._index.train_sample(self._count, self._rng)
            self._index.train(self._take(sample) if sample is not None else self._embeddings_ND(), self._rng)
            self._fill(0)

    def train_on(self, vectors_ND: np.ndarray) -> bool:
        """Train the untrained index on a sample of ``vectors_ND`` (any array, e.g. a memory map: only the sample
        is read) and add the bank's rows to it; False when the index is trained already, needs no training, or
        ``vectors_ND`` and the bank together are fewer than it trains on."""
        if self._index.is_trained or self._count + len(vectors_ND) < self._index.min_train:
            return False
        from memento.bank.bulk import gather_rows, release_pages

        positions = self._index.train_sample(len(vectors_ND), self._rng)
        sample = np.asarray(vectors_ND, dtype=np.float32) if positions is None else gather_rows(vectors_ND, positions)
        release_pages(vectors_ND)
        self._index.train(sample, self._rng)
        self._fill(0)
        self._dirty = True
        return True

    def added(self, rows: Sequence[NewRow]) -> None:
        emb_MD = stack_vectors(rows)
        first_new = self._count
        if self._file is not None:
            if not self._file.stored:  # a store has them already (written before the commit)
                self._file.append(emb_MD)
            self._file_rows += len(rows)
        self._count += len(rows)
        if self._loaded:
            self._append_mirror([r.case.env for r in rows], [r.case.kind for r in rows], emb_MD)
        if self._index.is_trained:
            self._index.add(emb_MD)
        else:
            self._train_and_fill(first_new)
        self._dirty = True

    def refresh(self, first_new: int, top: int) -> None:
        envs, kinds, emb, n = self._rows.mirror(first_new, top)
        emb_ND = emb.reshape(n, self.config.dim)
        self._count = top
        if self._loaded:  # a mirror loaded lazily may already hold some of them
            have = self._n - first_new
            self._append_mirror(envs[have:], kinds[have:], emb_ND[have:])
        if self._file is not None:  # the rows the writer has appended to the file since are read from it
            tail_ND = np.concatenate([self._tail_ND, emb_ND])  # positions _file_rows..top-1
            file_rows = max(self._file_rows, min(self._file.rows(), top))
            self._tail_ND = tail_ND[file_rows - self._file_rows:]
            self._file_rows = file_rows
        if self._index.is_trained:
            self._index.add(emb_ND)
        else:
            self._train_and_fill(first_new)
        self._dirty = not self._read_only

    def truncate(self, n: int) -> None:
        self._count = n
        self._loaded = False
        self._emb_ND = np.zeros((0, self.config.dim), dtype=np.float32)
        self._env_codes_N = np.zeros(0, dtype=np.int32)
        self._kind_codes_N = np.zeros(0, dtype=np.int32)
        if self._file is not None:
            self._file.truncate(n)
            self._file_rows = n
        self._dirty = True
        if self._index.is_trained and self._index.truncate(n):
            return  # trained as before: a resumed run searches the codes the uninterrupted one did
        self._index = FaissIndex(self.config.index, self.config.dim, use_gpu=self._use_gpu)
        self._train_and_fill(0)

    def _live_mask(self, dead_N: np.ndarray) -> np.ndarray | None:
        """``~deleted`` over positions ``0..count-1`` (cached while the store hands the same array), or None."""
        if not dead_N.size:
            return None
        if self._live is None or self._live[0] is not dead_N or self._live[1].shape[0] != self._count:
            live_N = np.ones(self._count, dtype=bool)
            live_N[dead_N[dead_N < self._count]] = False
            self._live = (dead_N, live_N)
        return self._live[1]

    def _allowed(self, where: Filter, dead_N: np.ndarray) -> np.ndarray | None:
        live = self._live_mask(dead_N)
        if where.env is None and where.kind is None and not where.positive and where.scope is None \
                and where.meta is None:
            return live
        mask = np.ones(self._count, dtype=bool) if live is None else live.copy()
        if where.env is not None or where.kind is not None:
            self._load()
        if where.env is not None:
            mask &= self._env_codes_N[:self._count] == self._env_vocab.get(where.env, -1)
        if where.kind is not None:
            mask &= self._kind_codes_N[:self._count] == self._kind_vocab.get(where.kind, -1)
        if where.positive:
            rewarded = np.zeros(self._count, dtype=bool)
            rewarded[self._rows.rewarded(self._count)] = True
            mask &= rewarded
        if where.scope is not None or where.meta is not None:
            mask &= self._rows.matching(where.scope, where.meta, self._count)
        return mask

    def topk(self, q_BD: np.ndarray, k: int, where: Filter, dead_N: np.ndarray,
             with_vectors: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        allowed = self._allowed(where, dead_N)
        vectors_BKD = None
        if allowed is not None and not allowed.any():
            scores_BK, labels_BK = (np.full((len(q_BD), k), -np.inf, dtype=np.float32),
                                    np.full((len(q_BD), k), -1, dtype=np.int64))
        else:
            result = None
            if self._index.is_trained and self._index.ntotal == self._count:
                wide = min(k * self.config.index.refine, self._count)
                result = self._index.search(q_BD, wide, allowed)
                if result is not None and wide > k:
                    result, vectors_BKD = self._refine(q_BD, k, *result)
            if result is None:  # untrained index, or a filter this index cannot apply: exact search
                if allowed is None:
                    result = exact_topk(self._embeddings_ND(), q_BD, k)
                else:
                    positions = np.flatnonzero(allowed)
                    result = exact_topk(self._take(positions), q_BD, k, positions)
            scores_BK, labels_BK = result
        if with_vectors and vectors_BKD is None:
            vectors_BKD = self._take(np.maximum(labels_BK, 0))
        return scores_BK, labels_BK, vectors_BKD if with_vectors else None

    def _refine(self, q_BD: np.ndarray, k: int, scores_BW: np.ndarray,
                labels_BW: np.ndarray) -> tuple[tuple[np.ndarray, np.ndarray], np.ndarray]:
        """The ``k`` of the index's ``W`` hits per query whose exact vectors score best, with those vectors."""
        vectors_BWD = self._take(np.maximum(labels_BW, 0))
        exact_BW = np.matmul(vectors_BWD, np.asarray(q_BD, dtype=np.float32)[:, :, None])[:, :, 0]
        exact_BW = np.where(labels_BW < 0, -np.inf, exact_BW).astype(np.float32)
        top_BK = np.argsort(-exact_BW, axis=1, kind="stable")[:, :k]
        rows_B1 = np.arange(len(top_BK))[:, None]  # plain fancy indexing: take_along_axis over [B, K, D] is ~10x slower
        return (exact_BW[rows_B1, top_BK], labels_BW[rows_B1, top_BK]), vectors_BWD[rows_B1, top_BK]

    def vectors_at(self, positions_N: np.ndarray) -> np.ndarray:
        return np.array(self._take(positions_N), dtype=np.float32)

    def set_search_params(self, config: IndexConfig) -> None:
        self.config = dataclasses.replace(self.config, index=config)
        self._index.set_search_params(config)

    def rebuild(self, config: IndexConfig) -> None:
        """A new index of ``config`` over every position, trained on a sample and filled a chunk at a time from the
        vectors (the file of a disk bank), in memory; written by :meth:`flush`."""
        index = FaissIndex(config, self.config.dim, use_gpu=self._use_gpu)
        old, self._index = self._index, index
        self.config = dataclasses.replace(self.config, index=config)
        try:
            self._train_and_fill(0)
        except BaseException:
            self._index, self.config = old, dataclasses.replace(self.config, index=old.config)
            raise
        self._dirty = True

    def summary(self, count: int) -> dict[str, Any]:
        return {"index_trained": self._index.is_trained, "index_ntotal": self._index.ntotal,
                "vectors": self.config.vectors}

    def flush(self) -> None:
        """Write the faiss index file if it changed (atomically, then its index.json)."""
        if not self._dirty or self._read_only:
            return
        index_path, meta_path = self._dir / INDEX_NAME, self._dir / INDEX_META_NAME
        if not self._index.is_trained:
            index_path.unlink(missing_ok=True)
            meta_path.unlink(missing_ok=True)
            self._dirty = False
            return
        atomic_write(index_path, lambda tmp: self._index.write(str(tmp)))
        atomic_write_text(meta_path, json.dumps({"uid": self._uid, "factory": self.config.index.factory,
                                                  "dim": self.config.dim, "ntotal": self._index.ntotal},
                                                 indent=2) + "\n")
        self._dirty = False


class CaseBank(BankFront):
    """Cases, their embeddings and a faiss index in a directory; see the module docstring for the layout.

    Use :meth:`create` or :meth:`open`, and ``close()`` (or a ``with`` block) when done.
    """

    @classmethod
    def create(cls, path: str | Path, dim: int, index: str | IndexConfig = "Flat", *,
               encoder: EncoderConfig | None = None, exist_ok: bool = False,
               use_gpu: bool | None = None, seed: int = 0, vectors: VectorStore = "ram",
               audit: bool = False) -> CaseBank:
        """Create an empty bank directory for ``dim``-dimensional unit vectors.

        ``index`` is a faiss factory string or an :class:`IndexConfig`; ``encoder`` records
        which encoder fills the bank (the CLI uses it to encode queries); ``vectors`` where the
        float32 vectors are read from (:data:`memento.config.VectorStore`); ``audit``: as :meth:`open`.
        """
        path = Path(path)
        index_config = IndexConfig(factory=index) if isinstance(index, str) else index
        config = BankConfig(dim=dim, index=index_config, encoder=encoder, vectors=vectors)
        FaissIndex(config.index, dim)  # fail on a bad factory string before touching the disk
        if (path / DB_NAME).exists():
            if exist_ok:
                return cls.open(path, dim=dim, use_gpu=use_gpu, seed=seed, audit=audit)
            raise BankError(f"{path}: a case bank already exists here")
        if path.exists() and not path.is_dir():
            raise BankError(f"{path}: exists and is not a directory")
        path.mkdir(parents=True, exist_ok=True)
        meta = {"format": BANK_FORMAT, "format_version": str(BANK_FORMAT_VERSION), "uid": uuid.uuid4().hex,
                "config": json.dumps(to_dict(config), sort_keys=True), "created": repr(time.time())}
        schema = _SCHEMA
        if vectors == "disk":  # vectors.f32 is where the vectors are stored (SQLite keeps none)
            meta[VECTORS_STORE_KEY] = "file"
            schema += _VECTOR_BLOCKS_SCHEMA + ";\n"
        sqlite.create(path / DB_NAME, schema, meta)
        logger.info("created case bank %s (dim=%d, index=%s)", path, dim, index_config.factory)
        return cls.open(path, dim=dim, use_gpu=use_gpu, seed=seed, audit=audit)

    @classmethod
    def open(cls, path: str | Path, *, dim: int | None = None, use_gpu: bool | None = None,
             seed: int = 0, index: IndexConfig | None = None, read_only: bool = False,
             audit: bool = False) -> CaseBank:
        """Open an existing bank; ``dim``, when given, must match the bank's dimension.

        ``read_only``: this process never writes the bank (another one does; see :meth:`refresh`): no
        journal-mode switch, no cleaning of temporaries, no index file written, write methods refused.

        ``index`` overrides the search knobs (``ef_search``, ``nprobe``) for this session;
        its factory must be the bank's. ``use_gpu=None`` searches on a GPU when faiss-gpu
        sees one. ``audit``: a deleted (or replaced) case's history keeps its values (old and new field values);
        by default a deletion erases them, and the history keeps only its events' kinds, times and field names
        (:mod:`memento.bank.history`).
        """
        path = Path(path)
        db = path / DB_NAME
        if not path.is_dir() or not db.is_file():
            raise NotABankError(f"{path}: not a case bank (no {DB_NAME} in a directory)")
        conn = sqlite.connect(db, error=NotABankError)
        try:  # read before switching to WAL, so a foreign SQLite file is left as it was
            config, uid, stored = _read_meta(path, conn, dim=dim, index=index)
            if not read_only:
                sqlite.use_wal(conn)
        except BaseException:
            conn.close()
            raise
        if not read_only:  # a reader must not delete the writer's temporaries while it writes them
            remove_stale_temporaries(path, (INDEX_NAME, INDEX_META_NAME))  # left by a killed write of the index
        store = VectorFile(path, uid, config.dim, stored=True) if stored else None
        rows = SqliteRows(path, conn, read_only=read_only, store=store)
        try:
            vectors = FaissVectors(rows, config, uid, rows.count(), use_gpu=use_gpu if use_gpu is not None else True,
                                   seed=seed, read_only=read_only)
        except sqlite3.DatabaseError as error:  # a damaged cases page: one line, as iter_cases says it
            conn.close()
            raise BankError(f"{path}: damaged bank ({DB_NAME}: {error})") from None
        except BaseException:
            conn.close()
            raise
        return cls(rows, vectors, SqliteFeatures(rows, config.dim), config=config, uid=uid, read_only=read_only,
                   audit=audit)


    def reindex(self, index: str | IndexConfig) -> None:
        """Build a new faiss index of ``index`` (a factory string or an :class:`IndexConfig`) over the bank's
        vectors and make it the bank's: trained on a sample, filled a chunk at a time from the vectors (a disk
        bank's file; nothing else is read or written), then the bank's config is committed and the index file
        written. The cases, ids and positions are unchanged. A kill before the config commit leaves the old index;
        after it, the next open rebuilds the new one from the vectors (its index file names the old factory)."""
        self._check_writable()
        config = IndexConfig(factory=index) if isinstance(index, str) else index
        FaissIndex(config, self.dim)  # a bad factory fails before any work
        assert isinstance(self._index, FaissVectors)
        t0 = time.perf_counter()
        self._index.rebuild(config)
        new = dataclasses.replace(self.config, index=config)
        with self._rows.transaction("reindexing violates"):
            sqlite.write_meta(self._rows.conn, {"config": json.dumps(to_dict(new), sort_keys=True)})
        self.config = new
        self._index.flush()
        logger.info("%s: reindexed %d case(s) with %s in %.1f s", self.path, len(self), config.factory,
                    time.perf_counter() - t0)

    @contextmanager
    def bulk(self, cache_mib: int = 256) -> Iterator[None]:
        """A bulk write (``memento bank import``): SQLite's page cache raised to ``cache_mib`` MiB meanwhile (the id
        and content-hash indexes take random keys: with SQLite's default 2 MiB, inserting 400,000 cases took 2.5x
        as long)."""
        conn = self._rows.conn
        before = conn.execute("PRAGMA cache_size").fetchone()[0]
        conn.execute(f"PRAGMA cache_size = {-int(cache_mib) * 1024}")
        try:
            yield
        finally:
            conn.execute(f"PRAGMA cache_size = {int(before)}")

    def train_index(self, vectors_ND: Any) -> bool:
        """Train this bank's index (IVF, PQ...) on a sample of ``vectors_ND`` ``[N, D]``, unit-norm vectors like
        those about to be added, before adding them (``memento bank import --embeddings``): the adds then only
        encode. False (nothing done) when the index is trained already, needs no training, or the bank and
        ``vectors_ND`` together are fewer vectors than it needs; the bank otherwise trains on its own rows
        once it holds enough."""
        self._check_writable()
        shape = np.shape(vectors_ND)
        if len(shape) != 2 or shape[1] != self.dim:
            raise DimensionError(f"train_index takes [N, {self.dim}] vectors, got shape {tuple(shape)}")
        assert isinstance(self._index, FaissVectors)
        return self._index.train_on(vectors_ND)


def _read_meta(path: Path, conn: sqlite3.Connection, *, dim: int | None,
               index: IndexConfig | None) -> tuple[BankConfig, str, bool]:
    """The bank's config (search knobs from ``index`` when given), uid, and whether vectors.f32 is its vectors'
    store, from its meta table, checked."""
    db = path / DB_NAME
    meta = sqlite.read_meta(conn, db, what="case bank", error=NotABankError)
    if meta.get("format") != BANK_FORMAT:
        raise NotABankError(f"{path}: not a case bank ({DB_NAME} has format {meta.get('format')!r})")
    sqlite.check_format(meta, db, format=BANK_FORMAT, version=BANK_FORMAT_VERSION, what="case bank",
                        error=BankError, hint="; upgrade memento")
    if "config" not in meta or "uid" not in meta:
        raise BankError(f"{path}: damaged bank: {DB_NAME} has no config or uid in its meta table")
    try:
        config = from_dict(BankConfig, json.loads(meta["config"]))
    except (ValueError, RecursionError) as error:
        raise BankError(f"{path}: damaged bank: unreadable config in {DB_NAME} "
                        f"({str(error).splitlines()[0][:120] or type(error).__name__})") from None
    if dim is not None and dim != config.dim:
        raise DimensionError(f"{path}: bank holds dim={config.dim} vectors, but dim={dim} was expected "
                             "(was it made with another encoder?)")
    if index is not None:
        if index.factory != config.index.factory:
            raise BankError(f"{path}: bank index is {config.index.factory!r}, not {index.factory!r}")
        config = dataclasses.replace(config, index=index)
    stored = meta.get(VECTORS_STORE_KEY) == "file"
    if stored and config.vectors != "disk":
        raise BankError(f"{path}: damaged bank: its vectors are stored in {VECTORS_NAME} but its config says "
                        f"vectors={config.vectors!r}")
    return config, meta["uid"], stored
