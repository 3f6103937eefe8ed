"""The vector index of a directory bank (:mod:`memento.bank.local`): :class:`FaissVectors`, a faiss index over
the bank's vectors (an in-memory mirror of SQLite's copy, or a disk bank's ``vectors.f32``) with the env and kind
codes its filters use, written to ``index.faiss`` + ``index.json`` on ``flush``, checked and repaired from SQLite
on open.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from memento.bank.index import FaissIndex, exact_topk
from memento.bank.mapped import gather_rows, release_pages
from memento.bank.parts import Filter, NewRow, stack_vectors
from memento.bank.sqliterows import SqliteRows
from memento.bank.vectorfile import VectorFile
from memento.config import BankConfig, IndexConfig
from memento.io import atomic_write, atomic_write_text

__all__ = ["INDEX_META_NAME", "INDEX_NAME", "FaissVectors"]

logger = logging.getLogger("memento.bank.local")  # the directory bank's log lines, wherever its code lives

INDEX_NAME = "index.faiss"
INDEX_META_NAME = "index.json"
_FILL_CHUNK = 32_768  # rows per pass over a bank's vectors (filling the index, loading the codes)


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

