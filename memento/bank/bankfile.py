"""Queries on a case bank's SQLite file (``cases.sqlite``) for code that holds the file, not a :class:`CaseBank`.

The bank's tables are :mod:`memento.bank.local`'s to define; the selector artifact (its checks, row digests,
exports) and the inspector (filter menus, pages of cases) read them through these functions only. Every
function takes the path of the file and opens a connection of its own for the call; all but :func:`vacuum`
only read.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memento import sqlite
from memento.bank.vectorfile import VECTORS_STORE_KEY, check_store, iter_rows, read_block_sums

__all__ = ["BankFileFacts", "block_sums", "check_vectors", "count", "digest", "distinct", "facts", "has_tombstones",
           "has_updates", "page", "vacuum"]

_DIGEST_COLUMNS = "pos, id, state, action, reward, env, kind, meta, created, hash, embedding"
_STABLE_COLUMNS = "pos, id, state, env, kind, created, embedding"  # what no write changes once a case is stored
_PAGE_COLUMNS = ("pos", "id", "state", "action", "reward", "env", "kind")
_FILTER_COLUMNS = ("env", "kind")


@contextmanager
def _open(db: Path, *, read_only: bool = False, timeout: float = 30.0) -> Iterator[sqlite3.Connection]:
    conn = sqlite.connect(db, timeout=timeout, read_only=read_only)
    try:
        yield conn
    finally:
        conn.close()


def count(db: Path) -> int:
    """How many cases the file holds (deleted ones included: their rows stay)."""
    with _open(db) as conn:
        return int(conn.execute("SELECT COUNT(*) FROM cases").fetchone()[0])


def digest(db: Path, stop: int, *, start: int = 0, previous: str | None = None, stable: bool = False) -> str:
    """Chained sha256 (:func:`memento.sqlite.chain_digest`) of the cases at positions ``start <= pos < stop``
    (content and embedding), extending ``previous``. ``stable``: of the columns no write changes once a case is
    stored (position, id, state, env, kind, creation time, embedding; ``update`` changes the action, reward and
    meta in place)."""
    with _open(db) as conn:
        rows = conn.execute(f"SELECT {_STABLE_COLUMNS if stable else _DIGEST_COLUMNS} FROM cases WHERE pos >= ? "
                            "AND pos < ? ORDER BY pos", (start, stop))
        meta = dict(conn.execute("SELECT key, value FROM meta WHERE key IN (?, 'config')", (VECTORS_STORE_KEY,)))
        if meta.get(VECTORS_STORE_KEY) == "file":  # the vectors are stored in vectors.f32: digested from there
            dim = int(json.loads(meta["config"])["dim"])
            vectors = iter_rows(Path(db).parent, dim, start, stop)
            return sqlite.chain_digest(((*row[:-1], next(vectors)) for row in rows), previous)
        return sqlite.chain_digest(rows, previous)


def block_sums(db: Path) -> dict[int, tuple[int, str]]:
    """The checksum of each block of a disk bank's ``vectors.f32`` (empty for a bank that keeps none)."""
    with _open(db) as conn:
        if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'vector_blocks'").fetchone() \
                is None:
            return {}
        return read_block_sums(conn, db)


def check_vectors(db: Path, uid: str, dim: int, cases: int) -> None:
    """A disk bank's ``vectors.f32`` holds its ``cases`` vectors, each block matching its checksum (``BankError``
    otherwise); read block by block, nothing written."""
    check_store(Path(db).parent, uid, dim, cases, block_sums(db))


def has_updates(db: Path) -> bool:
    """The bank records updates in place (``CaseBank.update``: an ``update`` event in its history log): its saved
    rows may change without new rows."""
    try:
        with _open(db) as conn:
            if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'history'").fetchone() is None:
                return False
            return conn.execute("SELECT 1 FROM history WHERE event = 'update' LIMIT 1").fetchone() is not None
    except sqlite3.Error:
        return False


def has_tombstones(db: Path) -> bool:
    """The bank records deleted cases (``CaseBank.delete``): its file changes without new rows."""
    try:
        with _open(db) as conn:
            return _has_deleted_table(conn) and conn.execute("SELECT 1 FROM deleted LIMIT 1").fetchone() is not None
    except sqlite3.Error:
        return False


def _has_deleted_table(conn: sqlite3.Connection) -> bool:
    return conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'deleted'").fetchone() is not None


@dataclass(frozen=True)
class BankFileFacts:
    """What a check of a bank file needs: its meta table, the case count, the range of positions, the
    shortest and longest embedding (bytes) and how many embeddings are blobs (None bounds when empty);
    ``stored``: the vectors are in ``vectors.f32`` (SQLite's embeddings are empty)."""

    meta: dict[str, str]
    cases: int
    low: int | None
    high: int | None
    shortest: int | None
    longest: int | None
    blobs: int | None

    @property
    def stored(self) -> bool:
        return self.meta.get(VECTORS_STORE_KEY) == "file"


def facts(db: Path) -> BankFileFacts:
    """:class:`BankFileFacts` of ``db``, read without changing it; ``sqlite3.Error`` when it is no bank."""
    with _open(db) as conn:
        meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
        n, low, high, short, long, blobs = conn.execute(
            "SELECT COUNT(*), MIN(pos), MAX(pos), MIN(length(embedding)), MAX(length(embedding)), "
            "SUM(typeof(embedding) = 'blob') FROM cases").fetchone()
    return BankFileFacts(meta=meta, cases=int(n), low=low, high=high, shortest=short, longest=long, blobs=blobs)


def distinct(db: Path, column: str, *, timeout: float = 10.0) -> list[Any]:
    """The sorted distinct non-null values of ``column`` (``env`` or ``kind``), read-only."""
    if column not in _FILTER_COLUMNS:
        raise ValueError(f"distinct: {column!r} is not one of {_FILTER_COLUMNS}")
    with _open(db, read_only=True, timeout=timeout) as conn:
        return [r[0] for r in conn.execute(f"SELECT DISTINCT {column} FROM cases WHERE {column} IS NOT NULL "
                                           f"ORDER BY {column}")]


def page(db: Path, *, env: str | None = None, kind: str | None = None, reward: str | None = None, offset: int,
         limit: int, timeout: float = 10.0) -> tuple[list[dict[str, Any]], int]:
    """Up to ``limit`` live cases from ``offset`` in bank order (``pos``, ``id``, ``state``, ``action``,
    ``reward``, ``env``, ``kind``) under the filters, and how many match; read-only. ``reward``:
    ``"positive"`` (> 0), ``"zero"`` (<= 0) or None. Deleted cases (``CaseBank.delete``) are left out."""
    where, params = [], []
    for column, value in (("env", env), ("kind", kind)):
        if value:
            where.append(f"{column} = ?")
            params.append(value)
    if reward == "positive":
        where.append("reward > 0")
    elif reward == "zero":
        where.append("reward <= 0")
    with _open(db, read_only=True, timeout=timeout) as conn:
        if _has_deleted_table(conn):
            where.append("pos NOT IN (SELECT pos FROM deleted)")
        clause = (" WHERE " + " AND ".join(where)) if where else ""
        total = int(conn.execute(f"SELECT COUNT(*) FROM cases{clause}", params).fetchone()[0])
        rows = conn.execute(f"SELECT {', '.join(_PAGE_COLUMNS)} FROM cases{clause} ORDER BY pos LIMIT ? OFFSET ?",
                            [*params, limit, offset]).fetchall()
    return [dict(zip(_PAGE_COLUMNS, row)) for row in rows], total


def vacuum(db: Path) -> None:
    """Rewrite a bank copy no one else has open without its free pages (removed cases then do not linger
    in the file), and move the WAL into it."""
    with _open(db) as conn:
        conn.execute("VACUUM")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
