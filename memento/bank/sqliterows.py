"""The SQLite parts of a directory bank (:mod:`memento.bank.local`), both in its ``cases.sqlite`` (WAL):
:class:`SqliteRows`, the row store (the ``cases`` table and the ``deleted`` tombstones), and
:class:`SqliteFeatures`, the feature store (the optional ``usage``, ``action_embeddings``, ``evidence`` and
``history`` tables, created on first write); the schema :class:`memento.bank.local.CaseBank` creates. The layout
and what a crash leaves are in :mod:`memento.bank.local`.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from memento.bank.history import EventRow
from memento.bank.parts import Filter, NewRow, case_meta_json, stack_vectors
from memento.bank.vectorfile import VectorFile, read_block_sums
from memento.bank.where import Scope, Where
from memento.errors import BankError, DataFormatError
from memento.types import SCOPE_FIELDS, Case, shown

__all__ = ["DB_NAME", "SqliteFeatures", "SqliteRows"]

DB_NAME = "cases.sqlite"
_CHUNK = 900  # below SQLite's bound on host parameters

SQLITE_SCHEMA = """
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

VECTOR_BLOCKS_SCHEMA = ("CREATE TABLE IF NOT EXISTS vector_blocks (block INTEGER PRIMARY KEY, rows INTEGER NOT NULL, "
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

