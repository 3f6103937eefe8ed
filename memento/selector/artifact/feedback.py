"""``feedback.sqlite``, the feedback log: one row per :meth:`memento.Selector.feedback`, committed before it returns
(a *live* file: it grows between saves, and the manifest records its row count and a chained row digest)."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from memento import sqlite
from memento.errors import CheckpointError, DataFormatError
from memento.io import loads_json
from memento.selector.artifact.layout import FEEDBACK_FORMAT, FEEDBACK_FORMAT_VERSION, FEEDBACK_NAME

__all__ = ["FeedbackLog", "FeedbackRow", "check_feedback_file", "count_feedback_rows", "feedback_rows_digest",
           "feedback_with_case"]

def feedback_rows_digest(db: Path | sqlite3.Connection, stop: int, *, start: int = 0,
                         previous: str | None = None) -> str:
    """Chained sha256 (:func:`memento.sqlite.chain_digest`) of feedback rows ``start < seq <= stop`` (seq counts
    from 1); the bank's rows are digested by :func:`memento.bank.bankfile.digest`."""
    conn = db if isinstance(db, sqlite3.Connection) else sqlite.connect(db)
    try:
        rows = conn.execute(f"SELECT {_FEEDBACK_COLUMNS} FROM feedback WHERE seq > ? AND seq <= ? ORDER BY seq",
                            (start, stop))
        return sqlite.chain_digest(rows, previous)
    finally:
        if not isinstance(db, sqlite3.Connection):
            conn.close()

# ---------------------------------------------------------------- the feedback log

_FEEDBACK_SCHEMA = sqlite.META_SCHEMA + """
CREATE TABLE IF NOT EXISTS feedback (
    seq INTEGER PRIMARY KEY,
    selection_id TEXT NOT NULL UNIQUE,
    reward REAL NOT NULL,
    time REAL NOT NULL,
    mode TEXT NOT NULL,
    policy_version INTEGER NOT NULL,
    env TEXT,
    ids TEXT NOT NULL,
    probs TEXT NOT NULL,
    set_prob REAL NOT NULL,
    learned INTEGER NOT NULL,
    state BLOB
);
"""
_FEEDBACK_COLUMNS = "seq, selection_id, reward, time, mode, policy_version, env, ids, probs, set_prob, learned, state"


@dataclasses.dataclass(frozen=True, kw_only=True)
class FeedbackRow:
    """One recorded feedback: the selection it rewards (state vector, chosen ids, propensities) and the reward.

    ``learned`` says whether the selector that recorded it was learning (``learn=True``): replaying the
    row after a restart then repeats the gradient steps it triggered.
    """

    seq: int
    selection_id: str
    reward: float
    time: float
    mode: str
    policy_version: int
    env: str | None
    ids: list[str]
    probs: list[float]
    set_prob: float
    learned: bool
    state: bytes | None


class FeedbackLog:
    """``feedback.sqlite`` (WAL): each :meth:`append` is committed before it returns."""

    def __init__(self, path: Path, conn: sqlite3.Connection):
        self.path = path
        self._conn = conn
        self._count = int(conn.execute("SELECT COUNT(*) FROM feedback").fetchone()[0])

    @classmethod
    def create(cls, path: str | Path) -> FeedbackLog:
        path = Path(path)
        if path.exists():
            raise CheckpointError(f"{path}: a feedback log already exists here")
        sqlite.create(path, _FEEDBACK_SCHEMA,
                      {"format": FEEDBACK_FORMAT, "format_version": str(FEEDBACK_FORMAT_VERSION)})
        return cls.open(path)

    @classmethod
    def open(cls, path: str | Path) -> FeedbackLog:
        path = Path(path)
        if not path.is_file():
            raise CheckpointError(f"{path}: missing feedback log")
        conn, _ = sqlite.open_store(path, format=FEEDBACK_FORMAT, version=FEEDBACK_FORMAT_VERSION, what="feedback log")
        try:
            return cls(path, conn)
        except BaseException:
            conn.close()
            raise

    def __len__(self) -> int:
        return self._count

    @property
    def connection(self) -> sqlite3.Connection:
        return self._conn

    def append(self, *, selection_id: str, reward: float, mode: str, policy_version: int, env: str | None,
               ids: list[str], probs: list[float], set_prob: float, learned: bool, state: bytes | None) -> int:
        """Commit one feedback row; returns its ``seq`` (1, 2, ...)."""
        seq = self._count + 1
        try:
            with self._conn:
                self._conn.execute(
                    f"INSERT INTO feedback ({_FEEDBACK_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (seq, selection_id, float(reward), time.time(), mode, int(policy_version), env,
                     json.dumps(ids), json.dumps(probs), float(set_prob), int(learned), state))
        except sqlite3.IntegrityError as error:
            raise CheckpointError(f"{self.path}: cannot record feedback for {selection_id!r} ({error})") from None
        self._count = seq
        return seq

    def rows(self, after: int = 0) -> Iterator[FeedbackRow]:
        """Rows with ``seq > after``, in order."""
        for row in self._conn.execute(f"SELECT {_FEEDBACK_COLUMNS} FROM feedback WHERE seq > ? ORDER BY seq",
                                      (after,)).fetchall():
            yield _feedback_row(row)

    def checkpoint(self) -> None:
        """Move the WAL into the main file (so its bytes are what a checksum sees)."""
        self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def close(self) -> None:
        self._conn.close()


def _feedback_row(row: tuple[Any, ...]) -> FeedbackRow:
    seq, sid, reward, when, mode, version, env, ids, probs, set_prob, learned, state = row
    return FeedbackRow(seq=seq, selection_id=sid, reward=reward, time=when, mode=mode, policy_version=version, env=env,
                       ids=_row_json(ids, seq, "ids"), probs=_row_json(probs, seq, "probs"), set_prob=set_prob,
                       learned=bool(learned), state=state)


def _row_json(text: Any, seq: Any, column: str) -> Any:
    """A feedback row's JSON column parsed; bad JSON (nested too deeply for Python, say, which SQLite's
    ``json_valid`` accepts) is a one-line ``CheckpointError``."""
    try:
        return loads_json(text if isinstance(text, (str, bytes)) else str(text))
    except DataFormatError as error:
        raise CheckpointError(f"{FEEDBACK_NAME}: feedback row {seq}: {column} is not readable JSON "
                              f"({error.reason})") from None


def feedback_with_case(path: Path, case_id: str) -> tuple[int, list[FeedbackRow]]:
    """The row count of the feedback log at ``path`` and its rows whose selection held ``case_id``, in order;
    read-only (a server may be writing the log). An unreadable file is a ``DataFormatError`` naming it."""
    conn = sqlite.connect(path, read_only=True, timeout=10.0, error=DataFormatError)
    try:
        total = int(conn.execute("SELECT COUNT(*) FROM feedback").fetchone()[0])
        rows = conn.execute(f"SELECT {_FEEDBACK_COLUMNS} FROM feedback WHERE EXISTS (SELECT 1 FROM "
                            "json_each(feedback.ids) WHERE json_each.value = ?) ORDER BY seq", (case_id,)).fetchall()
    except sqlite3.DatabaseError as error:
        raise DataFormatError(f"{path}: unreadable feedback log ({error})") from None
    finally:
        conn.close()
    return total, [_feedback_row(row) for row in rows]


def check_feedback_file(path: Path, dim: int) -> int:
    """``feedback.sqlite`` as the loader replays it: a feedback log of a readable version whose rows hold
    ``dim``-float state vectors and JSON lists of ids and probabilities. Returns its row count."""
    log = FeedbackLog.open(path)
    try:
        (bad,) = log.connection.execute(
            "SELECT COUNT(*) FROM feedback"
            " WHERE (state IS NOT NULL AND (typeof(state) != 'blob' OR length(state) != ?))"
            " OR CASE WHEN json_valid(ids) THEN json_type(ids) != 'array' ELSE 1 END"
            " OR CASE WHEN json_valid(probs) THEN json_type(probs) != 'array' ELSE 1 END", (4 * dim,)).fetchone()
        if bad:
            raise CheckpointError(f"{path}: {bad} feedback row(s) do not hold a {dim}-float state vector and JSON "
                                  "lists of ids and probabilities")
        return len(log)
    except sqlite3.Error as error:
        raise CheckpointError(f"{path}: unreadable feedback log ({error})") from None
    finally:
        log.close()



def count_feedback_rows(path: Path) -> int:
    """The rows of the feedback log at ``path`` (a one-line ``CheckpointError`` for an unreadable file)."""
    try:
        conn = sqlite.connect(path)
        try:
            return int(conn.execute("SELECT COUNT(*) FROM feedback").fetchone()[0])
        finally:
            conn.close()
    except sqlite3.Error as error:
        raise CheckpointError(f"{path}: unreadable SQLite file ({error})") from None
