"""The case bank: cases in one SQLite file (WAL), vectors in a faiss index beside it.

A bank is a directory::
    cases.sqlite   cases (id, state, action, reward, env, kind, meta JSON, created, content hash,
                   float32 embedding) and a meta table (format, uid, BankConfig JSON)
    index.faiss    the faiss index over the embeddings (position p = case at position p)
    index.json     which bank and how many positions the index file covers

Two optional tables serve the Q-network's case features (:mod:`memento.learn.features`), created on first
write, so a bank that never uses them is left byte for byte as it was:

- ``usage (step, pos, reward)``: one row per time a case was shown (``record_usage``), so the usage
  statistics (times shown, reward when shown) are an aggregate of an append-only log; a resumed run
  rolls it back to its checkpoint with ``truncate_usage(step)``, exactly;
- ``action_embeddings (pos, embedding)``: the encoder's vector of each case's action (answer),
  computed once per case (``set_action_embeddings``).

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
deleted case can still be replayed (``embeddings``/``positions_of``/``get`` still read its row). The row's
text stays in ``cases.sqlite``; its usage rows and action vector are removed. A deleted case's id is never
reused: ``replace`` stores the new content under a new id.

One process writes a bank at a time. Other processes may follow it: ``CaseBank.open(path, read_only=True)``
never writes the SQLite file, the index files or temporaries (``flush``/``close`` write nothing; the write
methods raise ``BankError``), and :meth:`CaseBank.refresh` appends the rows another process committed since
to its in-memory mirror and faiss index (``memento serve --workers``).
"""

from __future__ import annotations

import json
import logging
import math
import numbers
import os
import sqlite3
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload

import numpy as np

from memento.config import BankConfig, EncoderConfig, IndexConfig, from_dict, to_dict
from memento.errors import BankError, DataFormatError, DimensionError, NotABankError, UnknownCaseError
from memento.formats import read_case_file, write_jsonl
from memento.io import atomic_write, atomic_write_text, remove_stale_temporaries
from memento.memory.index import FaissIndex, exact_topk
from memento.types import Case

__all__ = ["BANK_FORMAT", "BANK_FORMAT_VERSION", "CaseBank", "Candidates"]

logger = logging.getLogger(__name__)

BANK_FORMAT = "memento-bank"
BANK_FORMAT_VERSION = 1
DB_NAME = "cases.sqlite"
INDEX_NAME = "index.faiss"
INDEX_META_NAME = "index.json"
_NORM_TOLERANCE = 1e-3
_CHUNK = 900  # below SQLite's bound on host parameters
_MAX_PADDED = 1 << 24  # a batch search result padded past the bank's size holds at most this many entries

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

_FEATURE_SCHEMA = """
CREATE TABLE IF NOT EXISTS usage (step INTEGER NOT NULL, pos INTEGER NOT NULL, reward REAL NOT NULL);
CREATE INDEX IF NOT EXISTS usage_step ON usage(step);
CREATE TABLE IF NOT EXISTS action_embeddings (pos INTEGER PRIMARY KEY, embedding BLOB NOT NULL);
"""

_DELETED_SCHEMA = """
CREATE TABLE IF NOT EXISTS deleted (pos INTEGER PRIMARY KEY, id TEXT NOT NULL, time REAL NOT NULL, replaced_by TEXT);
"""


@dataclass(frozen=True)
class Candidates:
    """A candidate set for one state: ``C`` case ids, their bank positions, similarity scores and vectors."""

    ids: list[str]
    positions_C: np.ndarray
    scores_C: np.ndarray
    embeddings_CD: np.ndarray

    def __len__(self) -> int:
        return len(self.ids)

    def subset(self, keep_C: np.ndarray) -> Candidates:
        """The candidates where the boolean ``keep_C`` (shape ``(C,)``) is true, in the same order."""
        keep_C = np.asarray(keep_C, dtype=bool)
        if keep_C.shape != (len(self.ids),):
            raise DimensionError(f"Candidates.subset: keep_C.shape={keep_C.shape} for {len(self.ids)} candidates")
        return self.take(np.flatnonzero(keep_C))

    def take(self, rows: np.ndarray) -> Candidates:
        """The candidates at ``rows`` (indices into this set), in that order."""
        index = np.asarray(rows, dtype=np.int64)
        return Candidates(ids=[self.ids[i] for i in index], positions_C=self.positions_C[index],
                          scores_C=self.scores_C[index], embeddings_CD=self.embeddings_CD[index])

    def rows_of(self, ids: Sequence[str]) -> np.ndarray:
        """Indices into this set of the cases ``ids`` (in that order); an id not in the set raises
        ``DataFormatError``."""
        row_of = {case_id: i for i, case_id in enumerate(self.ids)}
        missing = [case_id for case_id in ids if case_id not in row_of]
        if missing:
            raise DataFormatError(f"case id(s) {missing[:3]} are not among the {len(self.ids)} candidate(s)")
        return np.asarray([row_of[case_id] for case_id in ids], dtype=np.int64)

    def positive(self, rewards_C: np.ndarray) -> Candidates:
        """Only the candidates whose stored reward is > 0; all of them when none is (Memento's positive-only
        retrieval, as :class:`policies.similarity.SimilarityPolicy` with ``positive_only=True`` applies it)."""
        keep_C = np.asarray(rewards_C, dtype=np.float64) > 0
        return self if keep_C.all() or not keep_C.any() else self.subset(keep_C)


def _chunks(seq: Sequence[Any], size: int = _CHUNK) -> Iterator[Sequence[Any]]:
    for start in range(0, len(seq), size):
        yield seq[start:start + size]


class CaseBank:
    """Cases, their embeddings and a faiss index; see the module docstring for the layout.

    Use :meth:`create` or :meth:`open`, and ``close()`` (or a ``with`` block) when done.
    """

    def __init__(self, path: Path, conn: sqlite3.Connection, config: BankConfig, uid: str,
                 *, use_gpu: bool, seed: int, read_only: bool = False):
        self.path = path
        self.read_only = read_only
        self._conn = conn
        self.config = config
        self.uid = uid
        self._rng = np.random.default_rng(seed)
        self._use_gpu = use_gpu
        self._count = int(conn.execute("SELECT COUNT(*) FROM cases").fetchone()[0])
        # in-memory mirrors, loaded on first need
        self._emb_ND = np.zeros((0, config.dim), dtype=np.float32)
        self._ids: list[str] = []
        self._env_codes_N = np.zeros(0, dtype=np.int32)
        self._kind_codes_N = np.zeros(0, dtype=np.int32)
        self._env_vocab: dict[str | None, int] = {}
        self._kind_vocab: dict[str, int] = {}
        self._loaded = self._count == 0  # an empty bank's mirror is complete: adds extend it in memory
        self._index = FaissIndex(config.index, config.dim, use_gpu=use_gpu)
        self._index_dirty = False
        self._closed = False
        self._usage: tuple[np.ndarray, np.ndarray] | None = None  # (shown_N, reward_sum_N), loaded on first need
        self._deleted_pos: np.ndarray | None = None  # tombstoned positions (sorted int64), loaded on first need
        self._deleted_key: int = -1  # MAX(rowid) of the deleted table when loaded (a reader re-checks it)
        self._live_N: np.ndarray | None = None  # cached ~deleted mask over positions 0..count-1

    # ------------------------------------------------------------------ create / open

    @classmethod
    def create(cls, path: str | Path, dim: int, index: str | IndexConfig = "Flat", *,
               encoder: EncoderConfig | None = None, exist_ok: bool = False,
               use_gpu: bool | None = None, seed: int = 0) -> CaseBank:
        """Create an empty bank directory for ``dim``-dimensional unit vectors.

        ``index`` is a faiss factory string or an :class:`IndexConfig`; ``encoder`` records
        which encoder fills the bank (the CLI uses it to encode queries).
        """
        path = Path(path)
        index_config = IndexConfig(factory=index) if isinstance(index, str) else index
        config = BankConfig(dim=dim, index=index_config, encoder=encoder)
        FaissIndex(config.index, dim)  # fail on a bad factory string before touching the disk
        if (path / DB_NAME).exists():
            if exist_ok:
                return cls.open(path, dim=dim, use_gpu=use_gpu, seed=seed)
            raise BankError(f"{path}: a case bank already exists here")
        if path.exists() and not path.is_dir():
            raise BankError(f"{path}: exists and is not a directory")
        path.mkdir(parents=True, exist_ok=True)
        tmp = path / (DB_NAME + ".creating")
        tmp.unlink(missing_ok=True)
        conn = sqlite3.connect(tmp)
        try:
            conn.executescript(_SCHEMA)
            uid = uuid.uuid4().hex
            rows = {"format": BANK_FORMAT, "format_version": str(BANK_FORMAT_VERSION), "uid": uid,
                    "config": json.dumps(to_dict(config), sort_keys=True), "created": repr(time.time())}
            with conn:
                conn.executemany("INSERT INTO meta (key, value) VALUES (?, ?)", rows.items())
        finally:
            conn.close()
        os.replace(tmp, path / DB_NAME)  # a bank appears whole or not at all
        logger.info("created case bank %s (dim=%d, index=%s)", path, dim, index_config.factory)
        return cls.open(path, dim=dim, use_gpu=use_gpu, seed=seed)

    @classmethod
    def open(cls, path: str | Path, *, dim: int | None = None, use_gpu: bool | None = None,
             seed: int = 0, index: IndexConfig | None = None, read_only: bool = False) -> CaseBank:
        """Open an existing bank; ``dim``, when given, must match the bank's dimension.

        ``read_only``: this process never writes the bank (another one does; see :meth:`refresh`): no
        journal-mode switch, no cleaning of temporaries, no index file written, write methods refused.

        ``index`` overrides the search knobs (``ef_search``, ``nprobe``) for this session;
        its factory must be the bank's. ``use_gpu=None`` searches on a GPU when faiss-gpu
        sees one.
        """
        path = Path(path)
        db = path / DB_NAME
        if not path.is_dir() or not db.is_file():
            raise NotABankError(f"{path}: not a case bank (no {DB_NAME} in a directory)")
        conn = sqlite3.connect(db, timeout=30.0, check_same_thread=False)
        try:
            try:  # read before switching to WAL, so a foreign SQLite file is left as it was
                meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
            except sqlite3.DatabaseError as error:
                raise NotABankError(f"{path}: not a case bank ({DB_NAME}: {error})") from None
            if meta.get("format") != BANK_FORMAT:
                raise NotABankError(f"{path}: not a case bank ({DB_NAME} has format {meta.get('format')!r})")
            version = int(meta.get("format_version", "0"))
            if version > BANK_FORMAT_VERSION:
                raise BankError(f"{path}: bank format version {version} is newer than this memento "
                                f"reads ({BANK_FORMAT_VERSION}); upgrade memento")
            if "config" not in meta or "uid" not in meta:
                raise BankError(f"{path}: damaged bank: {DB_NAME} has no config or uid in its meta table")
            config = from_dict(BankConfig, json.loads(meta["config"]))
            if dim is not None and dim != config.dim:
                raise DimensionError(f"{path}: bank holds dim={config.dim} vectors, but dim={dim} was expected "
                                     "(was it made with another encoder?)")
            if index is not None:
                if index.factory != config.index.factory:
                    raise BankError(f"{path}: bank index is {config.index.factory!r}, not {index.factory!r}")
                config = BankConfig(dim=config.dim, index=index, encoder=config.encoder)
            if not read_only:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
        except BaseException:
            conn.close()
            raise
        gpu = use_gpu if use_gpu is not None else True
        if not read_only:  # a reader must not delete the writer's temporaries while it writes them
            remove_stale_temporaries(path, (INDEX_NAME, INDEX_META_NAME))  # left by a killed write of the index
        bank = cls(path, conn, config, meta["uid"], use_gpu=gpu, seed=seed, read_only=read_only)
        bank._open_index()
        return bank

    def _open_index(self) -> None:
        """Load index.faiss if it belongs to this bank; catch up or rebuild from SQLite otherwise."""
        index_path, meta_path = self.path / INDEX_NAME, self.path / INDEX_META_NAME
        stored = None
        if index_path.exists() and meta_path.exists():
            try:
                info = json.loads(meta_path.read_text(encoding="utf-8"))
                if (info.get("uid") == self.uid and info.get("factory") == self.config.index.factory
                        and info.get("dim") == self.config.dim):
                    stored = FaissIndex.read(str(index_path))
                    if stored.ntotal != info.get("ntotal") or stored.d != self.config.dim:
                        stored = None
            except (OSError, ValueError, RuntimeError) as error:
                logger.warning("%s: unreadable index (%s); rebuilding from SQLite", self.path, error)
                stored = None
        if stored is not None and stored.ntotal <= self._count:
            self._index = FaissIndex.from_faiss(stored, self.config.index, use_gpu=self._use_gpu)
            missing = self._count - stored.ntotal
            if missing:
                logger.warning("%s: index is %d case(s) behind SQLite; adding them", self.path, missing)
                self._index.add(self._read_embeddings(stored.ntotal, self._count))
                self._index_dirty = True
            return
        if self._count:
            logger.warning("%s: index missing or stale; rebuilding from %d cases", self.path, self._count)
        self._index = FaissIndex(self.config.index, self.config.dim, use_gpu=self._use_gpu)
        self._index_dirty = True
        if self._count:
            self._ensure_loaded()
            self._maybe_train_and_fill(0)

    # ------------------------------------------------------------------ internals

    def _check_open(self) -> None:
        if self._closed:
            raise BankError(f"{self.path}: bank is closed")

    def _check_writable(self) -> None:
        self._check_open()
        if self.read_only:
            raise BankError(f"{self.path}: bank is open read-only (another process writes it)")

    def _read_embeddings(self, start: int, stop: int) -> np.ndarray:
        rows = self._conn.execute("SELECT embedding FROM cases WHERE pos >= ? AND pos < ? ORDER BY pos",
                                  (start, stop)).fetchall()
        if not rows:
            return np.zeros((0, self.config.dim), dtype=np.float32)
        return np.frombuffer(b"".join(r[0] for r in rows), dtype=np.float32).reshape(len(rows), self.config.dim)

    def _code(self, vocab: dict[Any, int], value: Any) -> int:
        if value not in vocab:
            vocab[value] = len(vocab)
        return vocab[value]

    def _append_mirror(self, ids: list[str], envs: list[str | None], kinds: list[str], emb_ND: np.ndarray) -> None:
        n_old, n_new = len(self._ids), len(ids)
        if n_old + n_new > self._emb_ND.shape[0]:
            capacity = max(1024, 2 * (n_old + n_new))
            grown = np.zeros((capacity, self.config.dim), dtype=np.float32)
            grown[:n_old] = self._emb_ND[:n_old]
            self._emb_ND = grown
            self._env_codes_N = np.resize(self._env_codes_N, capacity)
            self._kind_codes_N = np.resize(self._kind_codes_N, capacity)
        self._emb_ND[n_old:n_old + n_new] = emb_ND
        self._env_codes_N[n_old:n_old + n_new] = [self._code(self._env_vocab, e) for e in envs]
        self._kind_codes_N[n_old:n_old + n_new] = [self._code(self._kind_vocab, k) for k in kinds]
        self._ids.extend(ids)

    def _ensure_loaded(self) -> None:
        if self._loaded:
            return
        ids: list[str] = []
        envs: list[str | None] = []
        kinds: list[str] = []
        blobs: list[bytes] = []
        for pos, case_id, env, kind, blob in self._conn.execute(
                "SELECT pos, id, env, kind, embedding FROM cases ORDER BY pos"):
            if pos != len(ids):
                raise BankError(f"{self.path}: case positions are not dense (found {pos} at row {len(ids)})")
            ids.append(case_id)
            envs.append(env)
            kinds.append(kind)
            blobs.append(blob)
        emb_ND = (np.frombuffer(b"".join(blobs), dtype=np.float32).reshape(len(ids), self.config.dim)
                  if ids else np.zeros((0, self.config.dim), dtype=np.float32))
        self._ids = []
        self._append_mirror(ids, envs, kinds, emb_ND)
        self._loaded = True

    @property
    def _embeddings_ND(self) -> np.ndarray:
        self._ensure_loaded()
        return self._emb_ND[:self._count]

    def _maybe_train_and_fill(self, first_new: int) -> None:
        """Add positions ``first_new..`` to the index, training it first once there are enough vectors."""
        if self._index.is_trained:
            self._index.add(self._embeddings_ND[first_new:])
            return
        if self._count >= self._index.min_train:
            self._index.train(self._embeddings_ND, self._rng)
            self._index.add(self._embeddings_ND)

    def _validate_embeddings(self, embeddings: Any, n: int) -> np.ndarray:
        emb = np.asarray(embeddings)
        if emb.ndim == 1 and n == 1:
            emb = emb[None, :]
        if emb.ndim != 2 or emb.shape != (n, self.config.dim):
            raise DimensionError(f"embeddings have shape {tuple(emb.shape)}, expected ({n}, {self.config.dim}) "
                                 f"for {n} case(s) in a dim={self.config.dim} bank")
        if not np.issubdtype(emb.dtype, np.floating):
            raise DataFormatError(f"embeddings must be floating point, got dtype {emb.dtype}")
        emb = np.ascontiguousarray(emb, dtype=np.float32)
        bad = np.flatnonzero(~np.isfinite(emb).all(axis=1))
        if bad.size:
            raise DataFormatError(f"embedding row {int(bad[0])} contains NaN or inf")
        norms = np.linalg.norm(emb, axis=1)
        off = np.flatnonzero(np.abs(norms - 1.0) > _NORM_TOLERANCE)
        if off.size:
            raise DataFormatError(f"embedding row {int(off[0])} has norm {norms[off[0]]:.4f}; bank vectors must be "
                                  "unit-norm (encode with normalize=True)")
        return emb

    def _validate_query(self, query: Any) -> tuple[np.ndarray, bool]:
        q = np.asarray(query)
        single = q.ndim == 1
        q_BD = q[None, :] if single else q
        if q_BD.ndim != 2 or q_BD.shape[1] != self.config.dim:
            raise DimensionError(f"query has shape {tuple(q.shape)}, expected ({self.config.dim},) or "
                                 f"(B, {self.config.dim}) for this dim={self.config.dim} bank")
        if not np.issubdtype(q_BD.dtype, np.floating):
            raise DataFormatError(f"query must be floating point, got dtype {q_BD.dtype}")
        q_BD = q_BD.astype(np.float32)
        if not np.isfinite(q_BD).all():
            raise DataFormatError("query contains NaN or inf")
        norms_B1 = np.linalg.norm(q_BD, axis=1, keepdims=True)
        if (norms_B1 == 0).any():
            raise DataFormatError("query has zero norm")
        return np.ascontiguousarray(q_BD / norms_B1), single

    def _positions(self, ids: Sequence[str]) -> np.ndarray:
        ids = list(ids)
        found: dict[str, int] = {}
        for chunk in _chunks(ids):
            marks = ",".join("?" * len(chunk))
            found.update(self._conn.execute(f"SELECT id, pos FROM cases WHERE id IN ({marks})", list(chunk)))
        missing = [i for i in ids if i not in found]
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise UnknownCaseError(f"{self.path}: unknown case id {missing[0]!r}{more}")
        return np.array([found[i] for i in ids], dtype=np.int64)

    # ------------------------------------------------------------------ public API

    @property
    def dim(self) -> int:
        return self.config.dim

    def __len__(self) -> int:
        return self._count

    def __enter__(self) -> CaseBank:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add(self, cases: Sequence[Case], embeddings: Any, *, allow_duplicates: bool = False) -> list[str]:
        """Store cases and their unit-norm embeddings ``[N, D]`` in one transaction.

        Returns one id per input case. A case whose content (state, action, env, kind) is
        already stored, or repeats an earlier case of the same call, is skipped and its
        stored id returned, unless ``allow_duplicates``. Ids left ``None`` are derived from
        the content hash. Nothing is written if any case or embedding is invalid.
        """
        self._check_writable()
        cases = list(cases)
        for i, case in enumerate(cases):
            if not isinstance(case, Case):
                raise DataFormatError(f"item {i} is {type(case).__name__}, expected memento.Case")
        if not cases:
            if np.asarray(embeddings).size:
                raise DimensionError(f"embeddings have shape {np.asarray(embeddings).shape} for 0 cases")
            return []
        emb_ND = self._validate_embeddings(embeddings, len(cases))
        hashes = [c.content_hash for c in cases]
        conn = self._conn
        try:
            conn.execute("BEGIN IMMEDIATE")
            out, planned = self._plan_ids(cases, hashes, allow_duplicates=allow_duplicates, warn=True)
            new_rows = self._insert_planned(cases, hashes, emb_ND, planned)
            conn.commit()
        except sqlite3.IntegrityError as error:
            conn.rollback()
            raise DataFormatError(f"{self.path}: cases violate the bank's constraints ({error})") from None
        except BaseException:
            conn.rollback()
            raise
        self._extend_memory(new_rows, emb_ND[[i for i, _ in planned]])
        skipped = len(cases) - len(new_rows)
        if skipped:
            logger.debug("%s: skipped %d duplicate case(s)", self.path, skipped)
        return out

    def _insert_planned(self, cases: Sequence[Case], hashes: Sequence[str], emb_ND: np.ndarray,
                        planned: Sequence[tuple[int, str]]) -> list[tuple[Any, ...]]:
        """INSERT the planned cases (``(input index, id)`` from :meth:`_plan_ids`) at the next positions, inside
        the caller's transaction; returns the rows written."""
        now = time.time()
        new_rows = [(pos, case_id, cases[i].state, cases[i].action, cases[i].reward, cases[i].env, cases[i].kind,
                     json.dumps(cases[i].meta, ensure_ascii=False, sort_keys=True),
                     cases[i].created if cases[i].created is not None else now, hashes[i], emb_ND[i].tobytes())
                    for pos, (i, case_id) in enumerate(planned, start=self._count)]
        self._conn.executemany("INSERT INTO cases (pos, id, state, action, reward, env, kind, meta, created, hash, "
                               "embedding) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", new_rows)
        return new_rows

    def _extend_memory(self, new_rows: Sequence[tuple[Any, ...]], emb_MD: np.ndarray) -> None:
        """After the commit of :meth:`_insert_planned`'s rows: the count, the in-memory mirror and the index."""
        if not new_rows:
            return
        first_new = self._count
        self._count += len(new_rows)
        if self._loaded:
            self._append_mirror([r[1] for r in new_rows], [r[5] for r in new_rows], [r[6] for r in new_rows], emb_MD)
        if self._index.is_trained:
            self._index.add(emb_MD)
        else:
            self._maybe_train_and_fill(first_new)
        self._index_dirty = True

    def _plan_ids(self, cases: Sequence[Case], hashes: Sequence[str], *, allow_duplicates: bool,
                  warn: bool) -> tuple[list[str], list[tuple[int, str]]]:
        """The id each case gets and the ``(input index, id)`` of those to insert (the others repeat stored
        content); an id used twice, or already used by another stored case, raises ``DataFormatError``."""
        conn = self._conn
        out: list[str] = [""] * len(cases)
        existing: dict[str, str] = {}
        tombstones = self._has_deleted_table()
        live = " AND pos NOT IN (SELECT pos FROM deleted)" if tombstones else ""  # a deleted case is no duplicate
        if not allow_duplicates:
            for chunk in _chunks(list(dict.fromkeys(hashes))):
                marks = ",".join("?" * len(chunk))
                existing.update(conn.execute(
                    f"SELECT hash, MIN(id) FROM cases WHERE hash IN ({marks}){live} GROUP BY hash", list(chunk)))
        planned: list[tuple[int, str]] = []  # (input index, id) of the cases to insert
        for i, (case, digest) in enumerate(zip(cases, hashes)):
            if not allow_duplicates and digest in existing:
                out[i] = existing[digest]
                if warn and case.id is not None and case.id != existing[digest]:
                    logger.warning("%s: case %r duplicates stored case %r; kept the stored one",
                                   self.path, case.id, existing[digest])
                continue
            case_id = case.id if case.id is not None else (
                f"c{digest[:16]}" if not allow_duplicates else f"c{digest[:16]}-{self._count + len(planned)}")
            if case.id is None and tombstones and conn.execute(
                    "SELECT 1 FROM deleted WHERE id = ?", (case_id,)).fetchone() is not None:
                case_id = f"c{digest[:16]}-{self._count + len(planned)}"  # a deleted case's id is never reused
            existing[digest] = case_id
            out[i] = case_id
            planned.append((i, case_id))
        seen: set[str] = set()
        for i, case_id in planned:
            if case_id in seen:
                raise DataFormatError(f"case {i}: id {case_id!r} is used twice in this call")
            seen.add(case_id)
        for chunk in _chunks([case_id for _, case_id in planned]):
            marks = ",".join("?" * len(chunk))
            row = conn.execute(f"SELECT id FROM cases WHERE id IN ({marks}) LIMIT 1", list(chunk)).fetchone()
            if row is not None:
                index_of = next(i for i, case_id in planned if case_id == row[0])
                raise DataFormatError(f"case {index_of}: id {row[0]!r} is already used by another case")
        return out, planned

    def check_ids(self, cases: Sequence[Case], *, allow_duplicates: bool = False) -> None:
        """Raise the ``DataFormatError`` that :meth:`add` would raise for these cases' ids (one used twice, or
        used by another stored case), before any work is spent on their embeddings; writes nothing."""
        self._check_open()
        cases = list(cases)
        self._plan_ids(cases, [c.content_hash for c in cases], allow_duplicates=allow_duplicates, warn=False)

    @overload
    def get(self, ids: str) -> Case: ...

    @overload
    def get(self, ids: Sequence[str]) -> list[Case]: ...

    def get(self, ids: str | Sequence[str]) -> Case | list[Case]:
        """The stored case(s), in the order asked; an unknown id raises ``UnknownCaseError``."""
        self._check_open()
        single = isinstance(ids, str)
        wanted = [ids] if single else list(ids)  # type: ignore[list-item]
        rows: dict[str, Case] = {}
        for chunk in _chunks(list(dict.fromkeys(wanted))):
            marks = ",".join("?" * len(chunk))
            for row in self._conn.execute(
                    f"SELECT id, state, action, reward, env, kind, meta, created FROM cases WHERE id IN ({marks})",
                    list(chunk)):
                rows[row[0]] = self._row_to_case(row)
        missing = [i for i in wanted if i not in rows]
        if missing:
            raise UnknownCaseError(f"{self.path}: unknown case id {missing[0]!r}")
        result = [rows[i] for i in wanted]
        return result[0] if single else result

    def rewards(self, ids: Sequence[str]) -> np.ndarray:
        """The stored rewards ``[N]`` (float64) of the given case ids, in the order asked."""
        return np.array([case.reward for case in self.get(list(ids))], dtype=np.float64)

    def _row_to_case(self, row: tuple[Any, ...]) -> Case:
        case_id, state, action, reward, env, kind, meta, created = row
        try:
            data = json.loads(meta)
        except (TypeError, ValueError) as error:
            raise BankError(f"{self.path}: damaged bank ({DB_NAME}: the meta of case {case_id!r} is not JSON: "
                            f"{error})") from None
        return Case(id=case_id, state=state, action=action, reward=reward, env=env, kind=kind, meta=data,
                    created=created)

    def embeddings(self, ids: Sequence[str]) -> np.ndarray:
        """Stored unit vectors ``[N, D]`` of the given case ids."""
        self._check_open()
        return self._embeddings_ND[self._positions(ids)].copy()

    def embeddings_at(self, positions: Sequence[int] | np.ndarray) -> np.ndarray:
        """Stored unit vectors ``[N, D]`` at bank positions (the faiss labels)."""
        self._check_open()
        positions_N = np.asarray(positions, dtype=np.int64).reshape(-1)
        if positions_N.size and (positions_N.min() < 0 or positions_N.max() >= self._count):
            raise UnknownCaseError(f"{self.path}: positions must lie in [0, {self._count}); "
                                   f"got min={int(positions_N.min())}, max={int(positions_N.max())}")
        return self._embeddings_ND[positions_N].copy()

    def ids_at(self, positions: Sequence[int] | np.ndarray) -> list[str]:
        """Case ids at bank positions (the faiss labels)."""
        self._check_open()
        self._ensure_loaded()
        return [self._ids[int(p)] for p in positions]

    def _allowed(self, env: str | None, kind: str | None, positive: bool = False) -> np.ndarray | None:
        live = self._live_mask()
        if env is None and kind is None and not positive:
            return live
        self._ensure_loaded()
        mask = np.ones(self._count, dtype=bool) if live is None else live.copy()
        if env is not None:
            mask &= self._env_codes_N[:self._count] == self._env_vocab.get(env, -1)
        if kind is not None:
            mask &= self._kind_codes_N[:self._count] == self._kind_vocab.get(kind, -1)
        if positive:  # read now: rewards change (update_reward, another process) and are not kept in memory
            rows = self._conn.execute("SELECT pos FROM cases WHERE reward > 0 AND pos < ?", (self._count,))
            rewarded = np.zeros(self._count, dtype=bool)
            rewarded[np.fromiter((row[0] for row in rows), dtype=np.int64)] = True
            mask &= rewarded
        return mask

    def search_positions(self, query: Any, k: int, *, env: str | None = None, kind: str | None = None,
                         positive: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Top-k by inner product: ``(scores_BK, positions_BK)``, -inf / -1 where fewer than k match.
        ``positive``: only cases whose stored reward is > 0."""
        return self._search_positions(query, k, env=env, kind=kind, positive=positive, pad=True)

    def _search_positions(self, query: Any, k: int, *, env: str | None, kind: str | None,
                          pad: bool, positive: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`search_positions`; without ``pad``, the result is at most the bank's size wide (a search for
        more cases than the bank holds finds them all, whatever ``k``)."""
        self._check_open()
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise DataFormatError(f"k must be a positive integer, got {k!r}")
        q_BD, _ = self._validate_query(query)
        width = int(k) if pad else min(int(k), max(self._count, 1))  # no more cases are searched for
        if len(q_BD) * width > _MAX_PADDED and width > self._count:
            raise DataFormatError(f"k={width} for {len(q_BD)} queries: the padded result would hold "
                                  f"{len(q_BD) * width} entries, but the bank holds {self._count} cases; "
                                  f"ask for k <= {max(self._count, 1)}")
        k = min(width, self._count)
        allowed = self._allowed(env, kind, positive)
        if self._count == 0 or (allowed is not None and not allowed.any()):
            return (np.full((len(q_BD), width), -np.inf, dtype=np.float32),
                    np.full((len(q_BD), width), -1, dtype=np.int64))
        result = None
        if self._index.is_trained and self._index.ntotal == self._count:
            result = self._index.search(q_BD, k, allowed)
        if result is None:  # untrained index, or a filter this index cannot apply: exact search
            if allowed is None:
                result = exact_topk(self._embeddings_ND, q_BD, k)
            else:
                positions = np.flatnonzero(allowed)
                result = exact_topk(self._embeddings_ND[positions], q_BD, k, positions)
        scores_BK, labels_BK = result
        scores_BK = np.where(labels_BK < 0, -np.inf, scores_BK).astype(np.float32)
        # equal scores (cases with the same question, hence the same vector) in position order: faiss leaves the
        # order of ties to its kernels, which differ between CPUs, and a seeded run must not
        order_BK = np.lexsort((np.where(labels_BK < 0, np.iinfo(np.int64).max, labels_BK), -scores_BK), axis=1)
        scores_BK = np.take_along_axis(scores_BK, order_BK, axis=1)
        labels_BK = np.take_along_axis(labels_BK, order_BK, axis=1)
        if width > k:  # pad to the width asked for
            extra = ((0, 0), (0, width - k))
            scores_BK, labels_BK = (np.pad(scores_BK, extra, constant_values=-np.inf),
                                    np.pad(labels_BK, extra, constant_values=-1))
        return scores_BK, labels_BK.astype(np.int64)

    def search(self, query: Any, k: int, *, env: str | None = None, kind: str | None = None,
               positive: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Nearest cases to ``query_D`` or ``query_BD`` by cosine (queries are normalised).

        For one query ``[D]``: ``(scores_K, ids_K)``, trimmed to the cases found. For a batch
        ``[B, D]``: ``(scores_BK, ids_BK)``, padded with ``-inf`` and ``None``. ``ids`` is a
        numpy object array of case-id strings. ``env``/``kind`` restrict the search; ``positive`` keeps the
        cases whose stored reward is > 0.
        """
        scores_BK, labels_BK = self._search_positions(query, k, env=env, kind=kind, positive=positive,
                                                      pad=np.asarray(query).ndim != 1)
        self._ensure_loaded()
        ids_BK = np.empty(labels_BK.shape, dtype=object)
        for b, row in enumerate(labels_BK):
            for j, p in enumerate(row):
                ids_BK[b, j] = self._ids[p] if p >= 0 else None
        if np.asarray(query).ndim == 1:
            valid = labels_BK[0] >= 0
            return scores_BK[0][valid], ids_BK[0][valid]
        return scores_BK, ids_BK

    def candidates(self, query_D: Any, c: int, *, env: str | None = None, kind: str | None = None,
                   positive: bool = False) -> Candidates:
        """The top-``c`` cases for one state with their stored vectors (the policy's candidate set);
        ``positive``: among the cases whose stored reward is > 0 only (the top-C of those, not a filtered top-C)."""
        scores_BK, labels_BK = self._search_positions(np.asarray(query_D)[None, :] if np.asarray(query_D).ndim == 1
                                                      else query_D, c, env=env, kind=kind, positive=positive,
                                                      pad=False)
        if labels_BK.shape[0] != 1:
            raise DimensionError(f"candidates takes one state [D], got shape {np.asarray(query_D).shape}")
        valid = labels_BK[0] >= 0
        positions_C = labels_BK[0][valid]
        return Candidates(ids=self.ids_at(positions_C), positions_C=positions_C, scores_C=scores_BK[0][valid],
                          embeddings_CD=self._embeddings_ND[positions_C].copy())

    def set_search_params(self, *, ef_search: int | None = None, nprobe: int | None = None) -> None:
        """Change the HNSW ``ef_search`` / IVF ``nprobe`` used by later searches (not saved)."""
        current = self.config.index
        index = IndexConfig(factory=current.factory, ef_search=current.ef_search if ef_search is None else ef_search,
                            nprobe=current.nprobe if nprobe is None else nprobe)
        self.config = BankConfig(dim=self.config.dim, index=index, encoder=self.config.encoder)
        self._index.set_search_params(index)

    def truncate(self, n: int) -> int:
        """Remove every case at position ``>= n`` (the newest ones); returns how many were removed.

        Used to roll a bank back to a checkpoint: cases retained after it are dropped, so a
        resumed run sees exactly the bank it saved. The index is rebuilt from SQLite.
        """
        self._check_writable()
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 0 <= n <= self._count:
            raise DataFormatError(f"truncate: n must be an integer in [0, {self._count}], got {n!r}")
        removed = self._count - int(n)
        if removed == 0:
            return 0
        with self._conn:
            self._conn.execute("DELETE FROM cases WHERE pos >= ?", (int(n),))
            if self._has_feature_tables():
                self._conn.execute("DELETE FROM usage WHERE pos >= ?", (int(n),))
                self._conn.execute("DELETE FROM action_embeddings WHERE pos >= ?", (int(n),))
            if self._has_deleted_table():
                self._conn.execute("DELETE FROM deleted WHERE pos >= ?", (int(n),))
        self._usage = None
        self._forget_deleted_cache()
        self._count = int(n)
        self._loaded = False
        self._ids, self._env_vocab, self._kind_vocab = [], {}, {}
        self._emb_ND = np.zeros((0, self.config.dim), dtype=np.float32)
        self._env_codes_N = np.zeros(0, dtype=np.int32)
        self._kind_codes_N = np.zeros(0, dtype=np.int32)
        self._ensure_loaded()
        self._index = FaissIndex(self.config.index, self.config.dim, use_gpu=self._use_gpu)
        self._maybe_train_and_fill(0)
        self._index_dirty = True
        logger.info("%s: truncated to %d case(s) (%d removed)", self.path, n, removed)
        return removed

    # ------------------------------------------------------------------ usage statistics and action vectors

    def _has_feature_tables(self) -> bool:
        row = self._conn.execute("SELECT COUNT(*) FROM sqlite_master WHERE type='table' AND name='usage'").fetchone()
        return bool(row[0])

    def _ensure_feature_tables(self) -> None:
        if not self._has_feature_tables():
            self._conn.executescript(_FEATURE_SCHEMA)

    def _load_usage(self) -> tuple[np.ndarray, np.ndarray]:
        if self._usage is not None and self._usage[0].shape[0] < self._count:  # cases added since: never shown
            grow = self._count - self._usage[0].shape[0]
            self._usage = (np.concatenate([self._usage[0], np.zeros(grow, dtype=np.int64)]),
                           np.concatenate([self._usage[1], np.zeros(grow, dtype=np.float64)]))
        if self._usage is None:
            shown_N = np.zeros(self._count, dtype=np.int64)
            reward_N = np.zeros(self._count, dtype=np.float64)
            if self._has_feature_tables():
                for pos, count, total in self._conn.execute(
                        "SELECT pos, COUNT(*), SUM(reward) FROM usage WHERE pos < ? GROUP BY pos", (self._count,)):
                    shown_N[pos], reward_N[pos] = int(count), float(total)
            self._usage = (shown_N, reward_N)
        return self._usage

    def record_usage(self, step: int, ids: Sequence[str], reward: float) -> None:
        """Log that the cases ``ids`` were shown at ``step`` and the decision earned ``reward`` (committed)."""
        self._check_writable()
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise DataFormatError(f"record_usage: step must be an integer >= 0, got {step!r}")
        if isinstance(reward, (bool, np.bool_)) or not isinstance(reward, numbers.Real) or not math.isfinite(reward):
            raise DataFormatError(f"record_usage: reward must be a finite number, got {reward!r}")
        positions_K = self._positions(list(ids))
        shown_N, reward_N = self._load_usage()
        self._ensure_feature_tables()
        with self._conn:
            self._conn.executemany("INSERT INTO usage (step, pos, reward) VALUES (?, ?, ?)",
                                   [(int(step), int(p), float(reward)) for p in positions_K])
        np.add.at(shown_N, positions_K, 1)
        np.add.at(reward_N, positions_K, float(reward))

    def positions_of(self, ids: Sequence[str]) -> np.ndarray:
        """Bank positions (int64) of the case ids, in the order asked; an unknown id raises ``UnknownCaseError``."""
        self._check_open()
        return self._positions(list(ids))

    def usage_at(self, positions: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(shown_C, reward_sum_C)``: how often the cases at ``positions`` were shown and their summed reward."""
        self._check_open()
        positions_C = np.asarray(positions, dtype=np.int64).reshape(-1)
        if positions_C.size and (positions_C.min() < 0 or positions_C.max() >= self._count):
            raise UnknownCaseError(f"{self.path}: positions must lie in [0, {self._count}); "
                                   f"got min={int(positions_C.min())}, max={int(positions_C.max())}")
        shown_N, reward_N = self._load_usage()
        return shown_N[positions_C].copy(), reward_N[positions_C].copy()

    def truncate_usage(self, step: int) -> int:
        """Forget every usage row logged at ``step`` or later (a resume to a checkpoint at ``step``); returns
        how many were removed."""
        self._check_writable()
        if not self._has_feature_tables():
            return 0
        with self._conn:
            removed = self._conn.execute("DELETE FROM usage WHERE step >= ?", (int(step),)).rowcount
        self._usage = None
        return int(removed)

    def action_embeddings_at(self, positions: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(emb_CD, have_C)``: the stored action vectors at ``positions`` (zeros where ``have_C`` is False)."""
        self._check_open()
        positions_C = np.asarray(positions, dtype=np.int64).reshape(-1)
        emb_CD = np.zeros((positions_C.size, self.config.dim), dtype=np.float32)
        have_C = np.zeros(positions_C.size, dtype=bool)
        if not positions_C.size or not self._has_feature_tables():
            return emb_CD, have_C
        for chunk in _chunks(np.unique(positions_C).tolist()):
            marks = ",".join("?" * len(chunk))
            for pos, blob in self._conn.execute(
                    f"SELECT pos, embedding FROM action_embeddings WHERE pos IN ({marks})", list(chunk)):
                rows = positions_C == pos
                emb_CD[rows], have_C[rows] = np.frombuffer(blob, dtype=np.float32), True
        return emb_CD, have_C

    def set_action_embeddings(self, positions: Sequence[int] | np.ndarray, embeddings: Any) -> None:
        """Store the action vectors of the cases at ``positions`` (``(C, D)`` float32, committed)."""
        self._check_writable()
        positions_C = np.asarray(positions, dtype=np.int64).reshape(-1)
        emb_CD = self._validate_embeddings(embeddings, positions_C.size)
        if positions_C.size and (positions_C.min() < 0 or positions_C.max() >= self._count):
            raise UnknownCaseError(f"{self.path}: positions must lie in [0, {self._count})")
        self._ensure_feature_tables()
        with self._conn:
            self._conn.executemany("INSERT OR REPLACE INTO action_embeddings (pos, embedding) VALUES (?, ?)",
                                   [(int(p), np.ascontiguousarray(v, dtype=np.float32).tobytes())
                                    for p, v in zip(positions_C, emb_CD)])

    def update_reward(self, case_id: str, reward: float) -> None:
        """Set the reward of a stored case."""
        self._check_writable()
        if isinstance(reward, (bool, np.bool_)) or not isinstance(reward, numbers.Real) or not math.isfinite(reward):
            raise DataFormatError(f"reward must be a finite number, got {reward!r}")
        with self._conn:
            cursor = self._conn.execute("UPDATE cases SET reward = ? WHERE id = ?", (float(reward), case_id))
        if cursor.rowcount == 0:
            raise UnknownCaseError(f"{self.path}: unknown case id {case_id!r}")

    # ------------------------------------------------------------------ forgetting (tombstones)

    def _has_deleted_table(self) -> bool:
        row = self._conn.execute(
            "SELECT COUNT(*) FROM sqlite_master WHERE type='table' AND name='deleted'").fetchone()
        return bool(row[0])

    def _ensure_deleted_table(self) -> None:
        if not self._has_deleted_table():
            self._conn.executescript(_DELETED_SCHEMA)  # its own transaction, before the deletion's

    def _forget_deleted_cache(self) -> None:
        self._deleted_pos, self._deleted_key, self._live_N = None, -1, None

    def _deleted_positions(self) -> np.ndarray:
        """The tombstoned positions (sorted int64); a read-only bank re-reads them when another process added
        some (one indexed read per call)."""
        if self._deleted_pos is not None and not self.read_only:
            return self._deleted_pos
        if not self._has_deleted_table():
            self._deleted_pos, self._deleted_key = np.zeros(0, dtype=np.int64), 0
            return self._deleted_pos
        (key,) = self._conn.execute("SELECT COALESCE(MAX(rowid), 0) FROM deleted").fetchone()
        if self._deleted_pos is None or int(key) != self._deleted_key:
            rows = self._conn.execute("SELECT pos FROM deleted ORDER BY pos").fetchall()
            self._deleted_pos = np.asarray([r[0] for r in rows], dtype=np.int64)
            self._deleted_key, self._live_N = int(key), None
        return self._deleted_pos

    def _live_mask(self) -> np.ndarray | None:
        """``~deleted`` over positions ``0..count-1``, or None when no case was deleted."""
        dead = self._deleted_positions()
        if not dead.size:
            return None
        if self._live_N is None or self._live_N.shape[0] != self._count:
            live_N = np.ones(self._count, dtype=bool)
            live_N[dead[dead < self._count]] = False
            self._live_N = live_N
        return self._live_N

    @property
    def num_deleted(self) -> int:
        """How many cases were deleted (tombstoned); ``len(bank) - num_deleted`` cases can be found."""
        self._check_open()
        return int(self._deleted_positions().size)

    def deleted_ids(self) -> list[str]:
        """The ids of the deleted cases, in position order."""
        self._check_open()
        if not self._has_deleted_table():
            return []
        return [r[0] for r in self._conn.execute("SELECT id FROM deleted ORDER BY pos")]

    def is_deleted(self, ids: Sequence[str]) -> list[bool]:
        """Whether each stored case id was deleted; an id never stored raises ``UnknownCaseError``."""
        self._check_open()
        positions = self._positions(list(ids))
        dead = self._deleted_positions()
        return [bool(x) for x in np.isin(positions, dead)]

    def _live_positions(self, ids: Sequence[str], what: str) -> np.ndarray:
        ids = list(ids)
        for i, case_id in enumerate(ids):
            if not isinstance(case_id, str) or not case_id:
                raise DataFormatError(f"{what}: case id {i} must be a non-empty string, got {case_id!r}")
        if len(set(ids)) != len(ids):
            raise DataFormatError(f"{what}: a case id is given twice")
        positions_M = self._positions(ids)
        gone = np.isin(positions_M, self._deleted_positions())
        if gone.any():
            raise UnknownCaseError(f"{self.path}: case {ids[int(np.flatnonzero(gone)[0])]!r} was already deleted")
        return positions_M

    def _tombstone(self, positions_M: np.ndarray, ids: Sequence[str], replaced_by: str | None) -> None:
        """In the caller's transaction: the tombstones, and the usage rows and action vectors of those cases."""
        now = time.time()
        self._conn.executemany("INSERT INTO deleted (pos, id, time, replaced_by) VALUES (?, ?, ?, ?)",
                               [(int(p), case_id, now, replaced_by) for p, case_id in zip(positions_M, ids)])
        if self._has_feature_tables():
            for chunk in _chunks([int(p) for p in positions_M]):
                marks = ",".join("?" * len(chunk))
                self._conn.execute(f"DELETE FROM usage WHERE pos IN ({marks})", list(chunk))
                self._conn.execute(f"DELETE FROM action_embeddings WHERE pos IN ({marks})", list(chunk))

    def _after_tombstone(self, positions_M: np.ndarray) -> None:
        self._forget_deleted_cache()
        if self._usage is not None:  # a deleted case was never shown, as far as the statistics go
            self._load_usage()  # grown to the cases added since
            self._usage[0][positions_M] = 0
            self._usage[1][positions_M] = 0.0

    def delete(self, ids: str | Sequence[str]) -> int:
        """Forget the cases ``ids`` (committed before this returns): they are never found, listed or chosen
        again; returns how many were deleted. An unknown or already deleted id raises ``UnknownCaseError`` and
        nothing is deleted. Rows stay (a tombstone; see the module docstring)."""
        self._check_writable()
        wanted = [ids] if isinstance(ids, str) else list(ids)
        if not wanted:
            return 0
        positions_M = self._live_positions(wanted, "delete")
        self._ensure_deleted_table()
        conn = self._conn
        try:
            conn.execute("BEGIN IMMEDIATE")
            self._tombstone(positions_M, wanted, None)
            conn.commit()
        except BaseException:
            conn.rollback()
            raise
        self._after_tombstone(positions_M)
        logger.info("%s: deleted %d case(s)", self.path, len(wanted))
        return len(wanted)

    def replace(self, case_id: str, case: Case, embedding: Any) -> str:
        """Supersede the case ``case_id`` by ``case`` (its unit-norm state vector ``embedding``, ``[D]``), in one
        transaction: the old case is deleted (:meth:`delete`) and the new one added; returns the new case's id.

        Ids are never reused, so the new case gets a new id (``case.id``, or one derived from its content;
        the tombstone records which id replaced the old one). If its content is already stored as another
        live case, that case's id is returned and nothing is added."""
        self._check_writable()
        if not isinstance(case, Case):
            raise DataFormatError(f"replace: expected a memento.Case, got {type(case).__name__}")
        emb_1D = self._validate_embeddings(embedding, 1)
        positions_M = self._live_positions([case_id], "replace")
        self._ensure_deleted_table()
        digest = case.content_hash
        conn = self._conn
        try:
            conn.execute("BEGIN IMMEDIATE")
            self._tombstone(positions_M, [case_id], None)
            out, planned = self._plan_ids([case], [digest], allow_duplicates=False, warn=True)
            new_id = out[0]
            new_rows = self._insert_planned([case], [digest], emb_1D, planned)
            conn.execute("UPDATE deleted SET replaced_by = ? WHERE pos = ?", (new_id, int(positions_M[0])))
            conn.commit()
        except sqlite3.IntegrityError as error:
            conn.rollback()
            raise DataFormatError(f"{self.path}: the new case violates the bank's constraints ({error})") from None
        except BaseException:
            conn.rollback()
            raise
        self._extend_memory(new_rows, emb_1D[[i for i, _ in planned]])
        self._after_tombstone(positions_M)
        logger.info("%s: replaced case %r by %r", self.path, case_id, new_id)
        return new_id

    def iter_cases(self, batch_size: int = 1000) -> Iterator[Case]:
        """All cases in insertion order, read in batches."""
        self._check_open()
        start = 0
        dead = set(self._deleted_positions().tolist())  # tombstoned cases are left out
        while True:
            try:
                rows = self._conn.execute(
                    "SELECT id, state, action, reward, env, kind, meta, created, pos FROM cases "
                    "WHERE pos >= ? ORDER BY pos LIMIT ?", (start, batch_size)).fetchall()
            except sqlite3.DatabaseError as error:
                raise BankError(f"{self.path}: damaged bank ({DB_NAME}: {error})") from None
            if not rows:
                return
            for row in rows:
                if row[8] not in dead:
                    yield self._row_to_case(row[:8])
            start = rows[-1][8] + 1

    def import_jsonl(self, path: str | Path, encoder: Any, *, format: str = "case",
                     allow_duplicates: bool = False, show_progress_bar: bool | None = None) -> list[str]:
        """Read a case file (any :data:`memento.formats.CaseFormat`), encode states, add all in one transaction.

        The whole file is validated before anything is written.
        """

        cases = read_case_file(path, format)  # type: ignore[arg-type]
        if encoder.dim != self.dim:
            raise DimensionError(f"encoder {encoder.model_id} gives dim={encoder.dim} vectors, "
                                 f"bank {self.path} holds dim={self.dim}")
        try:
            self.check_ids(cases, allow_duplicates=allow_duplicates)
        except DataFormatError as error:  # before the encoder runs
            raise DataFormatError(f"{error} (bank {self.path})", path=path) from None
        emb_ND = encoder.encode([c.state for c in cases], show_progress_bar=show_progress_bar, normalize=True)
        return self.add(cases, emb_ND.reshape(len(cases), self.dim), allow_duplicates=allow_duplicates)

    def export_jsonl(self, path: str | Path) -> int:
        """Write every case as Case JSONL (atomically); returns the number written."""

        return write_jsonl(path, (case.to_json() for case in self.iter_cases()))

    def stats(self) -> dict[str, Any]:
        """Counts, reward summary, index state and file sizes."""
        self._check_open()
        conn = self._conn
        n, mean_reward, positives = conn.execute(
            "SELECT COUNT(*), AVG(reward), SUM(reward > 0) FROM cases").fetchone()
        by_kind = dict(conn.execute("SELECT kind, COUNT(*) FROM cases GROUP BY kind ORDER BY kind").fetchall())
        by_env = dict(conn.execute("SELECT env, COUNT(*) FROM cases GROUP BY env ORDER BY env").fetchall())
        sizes = {p.name: p.stat().st_size for p in sorted(self.path.iterdir()) if p.is_file()}
        return {"path": str(self.path), "cases": int(n), "dim": self.dim, "index": self.config.index.factory,
                "index_trained": self._index.is_trained, "index_ntotal": self._index.ntotal,
                "reward_mean": None if mean_reward is None else float(mean_reward),
                "reward_positive": int(positives or 0), "by_kind": by_kind, "by_env": by_env,
                "deleted": self.num_deleted,
                "encoder": None if self.config.encoder is None else to_dict(self.config.encoder),
                "files": sizes}

    def rows_on_disk(self) -> int:
        """How many cases the SQLite file holds now (another process may have added some since open)."""
        self._check_open()
        return int(self._conn.execute("SELECT COALESCE(MAX(pos) + 1, 0) FROM cases").fetchone()[0])

    def refresh(self) -> int:
        """Take in the cases another process committed since this bank was opened (or last refreshed): they
        are appended to the in-memory mirror and the faiss index (in memory; a read-only bank never writes
        its index file). Returns how many were added. Rows are never removed, so positions stay dense; the
        deletions another process made are seen by the next search (tombstones, re-read when they changed)."""
        self._check_open()
        top = self.rows_on_disk()
        if top <= self._count:
            return 0
        first_new = self._count
        rows = self._conn.execute("SELECT pos, id, env, kind, embedding FROM cases WHERE pos >= ? AND pos < ? "
                                  "ORDER BY pos", (first_new, top)).fetchall()
        if [r[0] for r in rows] != list(range(first_new, top)):
            raise BankError(f"{self.path}: case positions {first_new}..{top - 1} are not dense")
        emb_ND = np.frombuffer(b"".join(r[4] for r in rows), dtype=np.float32).reshape(len(rows), self.config.dim)
        self._count = top
        if self._loaded:  # a mirror loaded lazily may already hold some of them
            have = len(self._ids) - first_new
            self._append_mirror([r[1] for r in rows[have:]], [r[2] for r in rows[have:]],
                                [r[3] for r in rows[have:]], emb_ND[have:])
        if self._index.is_trained:
            self._index.add(emb_ND)
        else:
            self._maybe_train_and_fill(first_new)
        self._index_dirty = not self.read_only
        logger.debug("%s: took in %d case(s) added by another process", self.path, len(rows))
        return len(rows)

    def flush(self) -> None:
        """Write the faiss index file if it changed (atomically, then its index.json); read-only: nothing."""
        self._check_open()
        if not self._index_dirty or self.read_only:
            return
        index_path, meta_path = self.path / INDEX_NAME, self.path / INDEX_META_NAME
        if not self._index.is_trained:
            index_path.unlink(missing_ok=True)
            meta_path.unlink(missing_ok=True)
            self._index_dirty = False
            return
        atomic_write(index_path, lambda tmp: self._index.write(str(tmp)))
        atomic_write_text(meta_path, json.dumps({"uid": self.uid, "factory": self.config.index.factory,
                                                  "dim": self.dim, "ntotal": self._index.ntotal}, indent=2) + "\n")
        self._index_dirty = False

    def close(self) -> None:
        """Flush the index and close SQLite. Safe to call twice."""
        if self._closed:
            return
        try:
            self.flush()
        finally:
            self._conn.close()
            self._closed = True

    def __repr__(self) -> str:
        return f"CaseBank({str(self.path)!r}, cases={self._count}, dim={self.dim}, index={self.config.index.factory!r})"
