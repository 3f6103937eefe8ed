"""The directory bank: cases in one SQLite file (WAL), vectors in a faiss index beside it.

A bank is a directory::
    cases.sqlite   cases (id, state, action, reward, env, kind, meta JSON, created, content hash,
                   float32 embedding; scope_user/_agent/_session with the first scoped case, version and updated
                   with the first update in place) and a meta table (format, uid, BankConfig JSON)
    index.faiss    the faiss index over the embeddings (position p = case at position p)
    index.json     which bank and how many positions the index file covers

:class:`CaseBank` is the bank front (:class:`memento.bank.front.BankFront`: ids, de-duplication, validation,
tombstones, import/export) over three parts: :class:`memento.bank.sqliterows.SqliteRows` (the ``cases`` and
``deleted`` tables), :class:`memento.bank.faissvectors.FaissVectors` (the faiss index over an in-memory mirror of
the vectors) and :class:`memento.bank.sqliterows.SqliteFeatures` (the case features' tables).

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
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from memento import sqlite
from memento.bank.faissvectors import INDEX_META_NAME, INDEX_NAME, FaissVectors
from memento.bank.front import BankFront
from memento.bank.index import FaissIndex
from memento.bank.sqliterows import DB_NAME, SQLITE_SCHEMA, VECTOR_BLOCKS_SCHEMA, SqliteFeatures, SqliteRows
from memento.bank.vectorfile import VECTORS_META_NAME, VECTORS_NAME, VECTORS_STORE_KEY, VectorFile
from memento.config import BankConfig, EncoderConfig, IndexConfig, VectorStore, from_dict, to_dict
from memento.errors import BankError, DimensionError, NotABankError
from memento.io import remove_stale_temporaries

__all__ = ["BANK_FORMAT", "BANK_FORMAT_VERSION", "DERIVED_NAMES", "CaseBank", "FaissVectors", "SqliteFeatures",
           "SqliteRows", "VectorFile"]

logger = logging.getLogger(__name__)

BANK_FORMAT = "memento-bank"
BANK_FORMAT_VERSION = 1
DERIVED_NAMES = (INDEX_NAME, INDEX_META_NAME, VECTORS_NAME, VECTORS_META_NAME)
"""The files beside cases.sqlite (a copy of a bank copies those that exist): the bank rebuilds the index files from
it; ``vectors.f32`` is the vectors' store of a disk bank (a cache of SQLite's copy in a disk bank made before issue
41), see :mod:`memento.bank.vectorfile`."""


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
        schema = SQLITE_SCHEMA
        if vectors == "disk":  # vectors.f32 is where the vectors are stored (SQLite keeps none)
            meta[VECTORS_STORE_KEY] = "file"
            schema += VECTOR_BLOCKS_SCHEMA + ";\n"
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
