"""memento.sqlite: the connection, WAL, meta-table and format-version helpers the SQLite stores share."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from memento import sqlite
from memento.errors import BankError, CheckpointError

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS rows (x INTEGER);
"""


def _store(tmp_path: Path, version: str = "1") -> Path:
    path = tmp_path / "store.sqlite"
    sqlite.create(path, SCHEMA, {"format": "memento-test", "format_version": version})
    return path


def test_create_writes_schema_and_meta_atomically(tmp_path: Path) -> None:
    (tmp_path / "store.sqlite.creating").write_bytes(b"left by a killed create")
    path = _store(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store.sqlite"]
    conn = sqlite.connect(path)
    assert sqlite.read_meta(conn, path, what="test store") == {"format": "memento-test", "format_version": "1"}
    conn.close()


def test_open_store_checks_then_switches_to_wal(tmp_path: Path) -> None:
    path = _store(tmp_path)
    conn, meta = sqlite.open_store(path, format="memento-test", version=1, what="test store")
    assert meta["format"] == "memento-test"
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
    conn.close()


def test_a_foreign_file_is_refused_and_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "foreign.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE foo (x INTEGER)")
    conn.close()
    with pytest.raises(BankError, match=r"foreign\.sqlite: not a case bank \(foreign\.sqlite: no such table: meta"):
        sqlite.open_store(path, format="memento-bank", version=1, what="case bank", error=BankError)
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    conn.close()
    garbage = tmp_path / "garbage.sqlite"
    garbage.write_bytes(b"not a database at all " * 100)
    with pytest.raises(CheckpointError, match=r"not a test store \(garbage\.sqlite: "):
        sqlite.open_store(garbage, format="memento-test", version=1, what="test store")


def test_format_and_version_checks_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "f.sqlite"
    check = {"path": path, "format": "memento-test", "version": 1, "what": "test store"}
    assert sqlite.check_format({"format": "memento-test"}, **check) == 0
    assert sqlite.check_format({"format": "memento-test", "format_version": "1"}, **check) == 1
    with pytest.raises(CheckpointError, match=r"f\.sqlite: not a test store \(f\.sqlite has format 'other'\)"):
        sqlite.check_format({"format": "other", "format_version": "1"}, **check)
    with pytest.raises(CheckpointError, match="test store format version 2 is newer than this memento reads "
                                              r"\(1\); upgrade"):
        sqlite.check_format({"format": "memento-test", "format_version": "2"}, **check, hint="; upgrade")
    with pytest.raises(CheckpointError, match="format version 0 is not the one this memento reads"):
        sqlite.check_format({"format": "memento-test", "format_version": "0"}, **check, exact=True)
    for raw in ("abc", "-1", "1.5", "", "١"):
        with pytest.raises(CheckpointError, match="is not a version number"):
            sqlite.check_format({"format": "memento-test", "format_version": raw}, **check)


def test_write_meta_replaces_and_read_only_writes_nothing(tmp_path: Path) -> None:
    path = _store(tmp_path)
    conn = sqlite.connect(path)
    with conn:
        sqlite.write_meta(conn, {"dim": "4", "format_version": "1"})
    conn.close()
    reader = sqlite.connect(path, read_only=True)
    assert sqlite.read_meta(reader, path, what="test store")["dim"] == "4"
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        reader.execute("INSERT INTO rows VALUES (1)")
    reader.close()
    with pytest.raises(CheckpointError, match="cannot open"):
        sqlite.connect(tmp_path / "missing" / "x.sqlite")
    autocommit = sqlite.connect(path, autocommit=True)
    assert autocommit.isolation_level is None
    autocommit.close()
