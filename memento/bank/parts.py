"""The narrow parts a bank back end supplies to the bank front (:mod:`memento.bank.front`), as protocols, and the
values passed between the front and them: a :class:`RowStore` (the cases' rows by position and their
tombstones), a :class:`VectorIndex` (top-k by inner product over the positions, and the stored vectors), a
:class:`FeatureStore` (usage statistics, evidence, action vectors, the cases' history); the :class:`NewRow` the
front hands them, the :class:`Filter` of a search or count, the :class:`Candidates` a search returns, and the
checks on embeddings and queries every entry point shares (:func:`validate_embeddings`, :func:`validate_query`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from memento.bank.history import EventRow
from memento.bank.where import Scope, Where, as_scope, parse_filter
from memento.config import IndexConfig
from memento.errors import DataFormatError, DimensionError
from memento.types import Case

__all__ = ["Candidates", "FeatureStore", "Filter", "NewRow", "RowStore", "VectorIndex", "case_meta_json",
           "check_embedding_shape", "check_unit_rows", "finite_float32", "stack_vectors", "validate_embeddings",
           "validate_query"]

_NORM_TOLERANCE = 1e-3
MAX_PADDED = 1 << 24  # a batch search result padded past the bank's size holds at most this many entries


TIE_TOLERANCE = 1e-6  # relative: scores this close are one score (equal vectors, scored by other SIMD lanes)


def tie_tolerance(scores: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return TIE_TOLERANCE * np.maximum(1.0, np.abs(scores))


def order_ties(scores_BK: np.ndarray, labels_BK: np.ndarray,
                vectors_BKD: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Each row best first, runs of scores within :data:`TIE_TOLERANCE` of their neighbour one tie given the
    run's first score, ties in position order, padding (label -1) last."""
    rows_B1 = np.arange(len(scores_BK))[:, None]
    order_BK = np.argsort(-scores_BK, axis=1, kind="stable")
    scores_BK, labels_BK = scores_BK[rows_B1, order_BK], labels_BK[rows_B1, order_BK]
    with np.errstate(invalid="ignore"):  # -inf - -inf: padding stays one run
        gap_BK = scores_BK[:, :-1] - scores_BK[:, 1:] > tie_tolerance(scores_BK[:, :-1])
    run_BK = np.concatenate([np.zeros((len(scores_BK), 1), dtype=np.int64), np.cumsum(gap_BK, axis=1)], axis=1)
    position_BK = np.where(labels_BK < 0, np.iinfo(np.int64).max, labels_BK)
    tie_order_BK = np.lexsort((position_BK, run_BK), axis=1)
    labels_BK, run_BK = labels_BK[rows_B1, tie_order_BK], run_BK[rows_B1, tie_order_BK]
    first_BK = np.concatenate([np.ones((len(scores_BK), 1), dtype=bool), run_BK[:, 1:] != run_BK[:, :-1]], axis=1)
    scores_BK = np.take_along_axis(scores_BK, np.maximum.accumulate(
        np.where(first_BK, np.arange(scores_BK.shape[1])[None, :], 0), axis=1), axis=1)
    if vectors_BKD is not None:
        vectors_BKD = vectors_BKD[rows_B1, order_BK][rows_B1, tie_order_BK]
    return scores_BK, labels_BK, vectors_BKD


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
        retrieval, as :class:`memento.policies.similarity.SimilarityPolicy` with ``positive_only=True`` applies it)."""
        keep_C = np.asarray(rewards_C, dtype=np.float64) > 0
        return self if keep_C.all() or not keep_C.any() else self.subset(keep_C)


def stack_vectors(rows: Sequence[NewRow]) -> np.ndarray:
    """The rows' vectors as one ``[M, D]`` array: the block they are views of when they are its rows in order (as
    :meth:`BankFront._new_rows` makes them), else a stacked copy."""
    if not rows:
        return np.zeros((0, 0), dtype=np.float32)
    base = rows[0].vector_D.base
    if isinstance(base, np.ndarray) and base.ndim == 2 and base.shape[0] == len(rows) and base.flags.c_contiguous \
            and all(r.vector_D.base is base for r in rows) and rows[0].vector_D.ctypes.data == base.ctypes.data \
            and rows[-1].vector_D.ctypes.data == base.ctypes.data + (len(rows) - 1) * base.strides[0]:
        return base
    return np.stack([r.vector_D for r in rows])


@dataclass(frozen=True)
class NewRow:
    """A case about to be stored at ``pos``: its id, content hash, creation time, meta JSON and unit vector."""

    pos: int
    id: str
    hash: str
    case: Case
    created: float
    meta: str
    vector_D: np.ndarray


@dataclass(frozen=True)
class Filter:
    """What a search keeps: live cases, of ``env``/``kind`` when given, with a stored reward > 0 if ``positive``,
    in ``scope`` and matching the metadata filter ``meta`` when given (:mod:`memento.bank.where`)."""

    env: str | None = None
    kind: str | None = None
    positive: bool = False
    scope: Scope | None = None
    meta: Where | None = None

    @classmethod
    def of(cls, env: str | None = None, kind: str | None = None, positive: bool = False,
           scope: Scope | Mapping[str, Any] | None = None, filter: Where | Mapping[str, Any] | None = None) -> Filter:
        """A filter from the search methods' arguments (``scope``/``filter`` as JSON objects or parsed)."""
        return cls(env, kind, positive, as_scope(scope), parse_filter(filter))


class RowStore(Protocol):
    """The cases' rows by position, and their tombstones. Writes happen inside :meth:`transaction`."""

    name: str

    def count(self) -> int:
        """Rows stored now (positions ``0..count-1``; another process may have added some)."""
        ...

    def transaction(self, what: str) -> AbstractContextManager[None]: ...

    def find(self, ids: Sequence[str]) -> dict[str, int]:
        """The positions of those ``ids`` that are stored (deleted ones included)."""
        ...

    def live_by_hash(self, hashes: Sequence[str], dead: int | None) -> dict[str, str]:
        """For each content hash stored in a live case (``dead`` counting as deleted): the smallest such id."""
        ...

    def insert(self, rows: Sequence[NewRow]) -> None: ...

    def tombstone(self, positions: Sequence[int], ids: Sequence[str], replaced_by: str | None) -> None: ...

    def deleted_positions(self) -> np.ndarray:
        """The tombstoned positions, sorted int64."""
        ...

    def deleted_ids(self) -> list[str]: ...

    def ids_at(self, positions: Sequence[int]) -> list[str]: ...

    def cases_at(self, positions: Sequence[int]) -> list[Case]: ...

    def rewards_at(self, positions: Sequence[int]) -> np.ndarray: ...

    def set_reward(self, position: int, reward: float) -> None: ...

    def update(self, position: int, case: Case, digest: str) -> None:
        """Rewrite the row at ``position`` with ``case``'s action, reward, meta, version and update time and the
        content hash ``digest`` (in :meth:`transaction`)."""
        ...

    def live_positions(self, where: Filter, count: int) -> np.ndarray:
        """The live positions below ``count`` that ``where`` keeps, sorted int64."""
        ...

    def tombstones_at(self, positions: Sequence[int]) -> dict[int, tuple[float, str | None]]:
        """``{pos: (time, replaced_by)}`` of those ``positions`` that are tombstoned."""
        ...

    def scan(self, batch_size: int) -> Iterator[Case]:
        """The live cases in position order."""
        ...

    def truncate(self, n: int) -> None: ...

    def summary(self) -> dict[str, Any]:
        """A backend's own keys, then ``cases``, ``reward_mean``, ``reward_positive``, ``by_kind``, ``by_env``,
        ``files``."""
        ...

    def close(self) -> None: ...


class VectorIndex(Protocol):
    """Top-k by inner product over the positions; the stored vectors."""

    def added(self, rows: Sequence[NewRow]) -> None:
        """The rows a committed :meth:`RowStore.insert` stored (a mirror or an index takes them in)."""
        ...

    def topk(self, q_BD: np.ndarray, k: int, where: Filter, dead_N: np.ndarray,
             with_vectors: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """``(scores_BK, positions_BK, vectors_BKD | None)``, -inf / -1 padded, ``1 <= k <= count``; the
        positions in ``dead_N`` are never returned."""
        ...

    def vectors_at(self, positions_N: np.ndarray) -> np.ndarray: ...

    def refresh(self, first_new: int, top: int) -> None:
        """Take in the rows ``first_new..top-1`` another process stored."""
        ...

    def truncate(self, n: int) -> None: ...

    def set_search_params(self, config: IndexConfig) -> None: ...

    def summary(self, count: int) -> dict[str, Any]:
        """``index_trained``, ``index_ntotal`` (and a backend's own keys before them) for ``count`` rows."""
        ...

    def flush(self) -> None: ...


class FeatureStore(Protocol):
    """The case features' storage: a usage log ``(step, pos, reward)``, an evidence log ``(step, pos, weight,
    value)`` and one action vector per position."""

    def record(self, step: int, positions_K: np.ndarray, reward: float) -> None: ...

    def totals(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``(shown_N, reward_sum_N)`` over positions ``0..n-1``."""
        ...

    def truncate_steps(self, step: int) -> int:
        """Drop the usage and evidence rows logged at ``step`` or later; returns how many."""
        ...

    def record_evidence(self, step: int, positions_M: np.ndarray, weight_M: np.ndarray, value_M: np.ndarray) -> None:
        """Append one evidence row per labelled position (the soft-Q agent's per-case memory)."""
        ...

    def evidence_totals(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(count_N, weight_sum_N, value_sum_N)`` over positions ``0..n-1``."""
        ...

    def forget(self, positions: Sequence[int]) -> None:
        """Drop the usage rows and action vectors of those positions (tombstoned: in the same transaction), and
        erase the values of their history unless ``keep_values``."""
        ...

    keep_values: bool  # a forgotten case's history keeps its values (a bank opened with audit=True)

    def drop_actions(self, positions: Sequence[int]) -> None:
        """Drop the action vectors of those positions (their action changed)."""
        ...

    def record_events(self, events: Sequence[EventRow]) -> None:
        """Append events to the cases' history log (:mod:`memento.bank.history`)."""
        ...

    def events_at(self, position: int) -> list[EventRow]:
        """The stored events of the case at ``position``, oldest first."""
        ...

    def truncate(self, n: int) -> None: ...

    def actions_at(self, positions_C: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...

    def set_actions(self, positions_C: np.ndarray, emb_CD: np.ndarray) -> None: ...


def check_embedding_shape(shape: tuple[int, ...], n: int, dim: int) -> None:
    """Embeddings of ``shape`` are ``[n, dim]``; one ``DimensionError`` naming both shapes otherwise."""
    if tuple(shape) != (n, dim):
        raise DimensionError(f"embeddings have shape {tuple(shape)}, expected ({n}, {dim}) "
                             f"for {n} case(s) in a dim={dim} bank")


def check_unit_rows(emb_ND: np.ndarray, *, start: int = 0) -> None:
    """Every row of ``emb_ND`` finite and unit-norm; one ``DataFormatError`` naming the first bad row (rows
    numbered from ``start``) otherwise."""
    with np.errstate(over="ignore", invalid="ignore"):
        squares = np.einsum("ij,ij->i", emb_ND, emb_ND)  # NaN or inf in a row make its sum so (one pass)
    if not np.isfinite(squares).all():
        bad = np.flatnonzero(~np.isfinite(emb_ND).all(axis=1))
        if bad.size:
            raise DataFormatError(f"embedding row {start + int(bad[0])} contains NaN or inf")
    norms = np.sqrt(squares)
    off = np.flatnonzero(np.abs(norms - 1.0) > _NORM_TOLERANCE)
    if off.size:
        raise DataFormatError(f"embedding row {start + int(off[0])} has norm {norms[off[0]]:.4f}; bank vectors "
                              "must be unit-norm (encode with normalize=True)")


def validate_embeddings(embeddings: Any, n: int, dim: int) -> np.ndarray:
    """``n`` unit-norm float vectors ``[n, dim]`` (one ``[dim]`` vector when ``n == 1``), as float32."""
    emb = np.asarray(embeddings)
    if emb.ndim == 1 and n == 1:
        emb = emb[None, :]
    check_embedding_shape(emb.shape, n, dim)
    if not np.issubdtype(emb.dtype, np.floating):
        raise DataFormatError(f"embeddings must be floating point, got dtype {emb.dtype}")
    emb = np.ascontiguousarray(emb, dtype=np.float32)
    check_unit_rows(emb)
    return emb


_FLOAT32_MAX = float(np.finfo(np.float32).max)


def finite_float32(values: np.ndarray, what: str) -> np.ndarray:
    """``values`` as float32 once checked finite and within float32's range in their own precision (a float64 1e39
    would become inf in the cast, with numpy's overflow warning); otherwise one ``DataFormatError``."""
    if values.dtype != np.float32:
        with np.errstate(invalid="ignore", over="ignore"):
            finite = np.isfinite(values)
            if not finite.all():
                raise DataFormatError(f"{what} contains NaN or inf")
            if values.size and float(np.max(np.abs(values))) > _FLOAT32_MAX:
                raise DataFormatError(f"{what} holds a number beyond float32's range (|x| > 3.4e38)")
        values = values.astype(np.float32)
    elif not np.isfinite(values).all():
        raise DataFormatError(f"{what} contains NaN or inf")
    return values


def validate_query(query: Any, dim: int) -> np.ndarray:
    """Queries ``[D]`` or ``[B, D]`` as normalised float32 ``[B, D]``."""
    q = np.asarray(query)
    q_BD = q[None, :] if q.ndim == 1 else q
    if q_BD.ndim != 2 or q_BD.shape[1] != dim:
        raise DimensionError(f"query has shape {tuple(q.shape)}, expected ({dim},) or "
                             f"(B, {dim}) for this dim={dim} bank")
    if not np.issubdtype(q_BD.dtype, np.floating):
        raise DataFormatError(f"query must be floating point, got dtype {q_BD.dtype}")
    q_BD = finite_float32(q_BD, "query")
    norms_B1 = np.linalg.norm(q_BD, axis=1, keepdims=True)
    if (norms_B1 == 0).any():
        raise DataFormatError("query has zero norm")
    return np.ascontiguousarray(q_BD / norms_B1)


def case_meta_json(case: Case) -> str:
    """A case's meta as the banks store it (JSON, keys sorted, UTF-8 kept)."""
    return meta_text(case.meta)


def meta_text(meta: Mapping[str, Any]) -> str:
    return json.dumps(meta, ensure_ascii=False, sort_keys=True) if meta else "{}"
