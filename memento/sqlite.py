"""The SQLite plumbing memento's stores share: connecting, WAL, the ``meta`` table and its format check.

Four stores are single SQLite files: the case bank (``cases.sqlite``, :mod:`memento.bank.local`), a
selector's feedback log (``feedback.sqlite``, :mod:`memento.selector.artifact`), its pending selections
(``.pending.sqlite``, :mod:`memento.selector.pending`) and the embedding cache (:mod:`memento.encoders`).
Each versioned one keeps ``format`` and ``format_version`` (a decimal string) in a key/value ``meta``
table; :func:`check_format` reads them back with the file named in every error.

- :func:`connect`: a connection (``check_same_thread=False`` by default: the stores lock themselves);
  ``read_only`` opens it with ``mode=ro`` so nothing, not even a journal-mode switch, is written.
- :func:`use_wal`: ``journal_mode=WAL`` and ``synchronous=NORMAL`` (commits are not fsynced one by one;
  a checkpoint is).
- :data:`META_SCHEMA`: the ``meta`` table's statement, which opens each store's schema.
- :func:`create`: a new file with its schema and meta rows, written aside (``<name>.creating``) and renamed
  into place, so a store appears whole or not at all.
- :func:`read_meta`, :func:`write_meta`, :func:`format_version`, :func:`check_format`, and :func:`open_store`
  which does connect, read, check and WAL in one go.
- :func:`checkpoint`: the WAL moved into the main file; :func:`chain_digest`: the chained sha256 of rows a
  selector's manifest records for its live files.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from memento.errors import CheckpointError, MementoError

__all__ = ["META_SCHEMA", "chain_digest", "check_format", "checkpoint", "connect", "create", "format_version",
           "open_store", "read_meta", "use_wal", "write_meta"]

_GENESIS = hashlib.sha256(b"memento-rows").hexdigest()

META_SCHEMA = "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);\n"
"""The key/value ``meta`` table every versioned store's schema starts with."""


def connect(path: str | Path, *, timeout: float = 30.0, read_only: bool = False, check_same_thread: bool = False,
            autocommit: bool = False, error: type[MementoError] = CheckpointError) -> sqlite3.Connection:
    """A connection to ``path``. ``read_only``: opened ``mode=ro`` (the file must exist). ``autocommit``:
    ``isolation_level=None`` (the caller issues ``BEGIN``). A failure raises ``error`` naming the file."""
    kwargs: dict[str, Any] = {"timeout": timeout, "check_same_thread": check_same_thread}
    if autocommit:
        kwargs["isolation_level"] = None
    try:
        if read_only:
            return sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True, **kwargs)
        return sqlite3.connect(path, **kwargs)
    except sqlite3.Error as failure:
        raise error(f"{path}: cannot open ({failure})") from None


def use_wal(conn: sqlite3.Connection) -> None:
    """Write-ahead logging with ``synchronous=NORMAL`` (what every memento store that writes uses)."""
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")


def write_meta(conn: sqlite3.Connection, items: Mapping[str, str]) -> None:
    """Set meta rows (in the caller's transaction)."""
    conn.executemany("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", list(items.items()))


def read_meta(conn: sqlite3.Connection, path: str | Path, *, what: str,
              error: type[MementoError] = CheckpointError) -> dict[str, str]:
    """The meta table as a dict; a file without one (or not a database) raises ``error``:
    ``"<path>: not a <what> (<file name>: <reason>)"``."""
    try:
        return dict(conn.execute("SELECT key, value FROM meta").fetchall())
    except sqlite3.DatabaseError as failure:
        raise error(f"{path}: not a {what} ({Path(path).name}: {failure})") from None


def format_version(meta: Mapping[str, Any], path: str | Path, *, what: str,
                   error: type[MementoError] = CheckpointError) -> int:
    """The ``format_version`` of a meta table (a decimal string; absent reads as 0); anything else raises."""
    raw = meta.get("format_version", "0")
    if not isinstance(raw, str) or not raw.isascii() or not raw.isdigit():
        raise error(f"{path}: {what} format_version {raw!r} is not a version number")
    return int(raw)


def check_format(meta: Mapping[str, Any], path: str | Path, *, format: str, version: int, what: str,
                 error: type[MementoError] = CheckpointError, exact: bool = False, hint: str = "") -> int:
    """Check a meta table's ``format`` and ``format_version`` and return the version.

    A version newer than ``version`` is refused (with ``exact``: any other version); ``hint`` is appended
    to those two messages (``"; upgrade memento"``).
    """
    if meta.get("format") != format:
        raise error(f"{path}: not a {what} ({Path(path).name} has format {meta.get('format')!r}){hint}")
    found = format_version(meta, path, what=what, error=error)
    if found > version or (exact and found != version):
        relation = "is not the one" if exact else "is newer than"
        raise error(f"{path}: {what} format version {found} {relation} this memento reads ({version}){hint}")
    return found


def open_store(path: str | Path, *, format: str, version: int, what: str, error: type[MementoError] = CheckpointError,
               timeout: float = 30.0, wal: bool = True, read_only: bool = False,
               ) -> tuple[sqlite3.Connection, dict[str, str]]:
    """Connect to an existing store, check its meta table (read before any journal-mode switch, so a
    foreign file is left as it was), then switch it to WAL when ``wal``. Returns the connection and meta."""
    conn = connect(path, timeout=timeout, read_only=read_only, error=error)
    try:
        meta = read_meta(conn, path, what=what, error=error)
        check_format(meta, path, format=format, version=version, what=what, error=error)
        if wal:
            use_wal(conn)
    except BaseException:
        conn.close()
        raise
    return conn, meta


def create(path: str | Path, schema: str, meta: Mapping[str, str]) -> None:
    """Create a store at ``path`` with ``schema`` (which must create ``meta``) and ``meta`` rows: written
    as ``<name>.creating`` (a leftover of a killed create is replaced) and renamed into place."""
    path = Path(path)
    tmp = path.with_name(path.name + ".creating")
    tmp.unlink(missing_ok=True)
    conn = sqlite3.connect(tmp)
    try:
        conn.executescript(schema)
        with conn:
            write_meta(conn, meta)
    finally:
        conn.close()
    os.replace(tmp, path)


def checkpoint(path: str | Path) -> None:
    """``PRAGMA wal_checkpoint(TRUNCATE)`` on a SQLite file another connection of this process writes."""
    conn = connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


def chain_digest(rows: Iterable[tuple[Any, ...]], previous: str | None = None) -> str:
    """Extend a chained digest (from the genesis ``sha256(b"memento-rows")`` when ``previous`` is None):
    ``h = sha256(h || sha256(json(row[:-1]) || 0x00 || row[-1]))`` per row; a row's last column is raw bytes."""
    h = bytes.fromhex(previous or _GENESIS)
    for row in rows:
        head, blob = row[:-1], row[-1]
        body = json.dumps(list(head), ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        row_digest = hashlib.sha256(body + b"\x00" + (blob or b"")).digest()
        h = hashlib.sha256(h + row_digest).digest()
    return h.hex()
