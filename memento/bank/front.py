"""The bank front, written once for every backend: ids, de-duplication, validation, tombstones, search results,
usage statistics and JSONL import/export, over three narrow parts a backend supplies (as TorchRL composes a
replay buffer from a storage, a sampler and a writer):

- a :class:`RowStore`: the cases' rows by position (SQLite table | Milvus collection) and their tombstones;
- a :class:`VectorIndex`: top-k by inner product over the positions, with the env/kind/positive/deleted
  filters, and the stored vectors (faiss over an in-memory mirror | the Milvus collection's vector field);
- a :class:`FeatureStore`: the Q-network's case features, an append-only usage log ``(step, pos, reward)``
  and one action vector per position (SQLite tables | Milvus side collections).

:class:`memento.bank.local.CaseBank` and :class:`memento.bank.milvus.MilvusBank` are this front with their
parts (their ``create``/``open`` build the parts). Positions are dense (a case's position is its insertion
index); a tombstoned (deleted or replaced) case is never found, listed, chosen or read again (``get`` raises
``UnknownCaseError`` for it), but the internal readers of logged decisions (``get(..., include_deleted=True)``,
``embeddings``/``embeddings_at``/``positions_of``) still read its row (see :mod:`memento.bank.protocol`).

The lifecycle verbs (mem0's): ``update`` changes a case's action, reward or meta in place (same id, ``version``
bumped, ``updated`` set, an ``update`` event in its history); ``add`` of content already stored with other meta
updates the stored case's meta the same way; ``history`` lists a case's events (:mod:`memento.bank.history`);
``count`` and ``delete_all`` act on the live cases of a scope or metadata filter.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, overload

import numpy as np

from memento.bank.history import UPDATABLE, CaseEvent, EventRow
from memento.bank.where import Scope, Where, as_scope, parse_filter
from memento.config import BankConfig, IndexConfig, to_dict
from memento.errors import BankError, DataFormatError, DimensionError, UnknownCaseError
from memento.formats import read_case_file, write_jsonl
from memento.types import Case, check_reward, check_text, shown

__all__ = ["BankFront", "Candidates", "FeatureStore", "Filter", "NewRow", "RowStore", "VectorIndex", "stack_vectors"]

logger = logging.getLogger(__name__)

_NORM_TOLERANCE = 1e-3
_MAX_PADDED = 1 << 24  # a batch search result padded past the bank's size holds at most this many entries


TIE_TOLERANCE = 1e-6  # relative: scores this close are one score (equal vectors, scored by other SIMD lanes)


def _tie_tolerance(scores: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return TIE_TOLERANCE * np.maximum(1.0, np.abs(scores))


def _order_ties(scores_BK: np.ndarray, labels_BK: np.ndarray,
                vectors_BKD: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Each row best first, runs of scores within :data:`TIE_TOLERANCE` of their neighbour one tie given the
    run's first score, ties in position order, padding (label -1) last."""
    rows_B1 = np.arange(len(scores_BK))[:, None]
    order_BK = np.argsort(-scores_BK, axis=1, kind="stable")
    scores_BK, labels_BK = scores_BK[rows_B1, order_BK], labels_BK[rows_B1, order_BK]
    with np.errstate(invalid="ignore"):  # -inf - -inf: padding stays one run
        gap_BK = scores_BK[:, :-1] - scores_BK[:, 1:] > _tie_tolerance(scores_BK[:, :-1])
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
    return _meta_text(case.meta)


def _meta_text(meta: Mapping[str, Any]) -> str:
    return json.dumps(meta, ensure_ascii=False, sort_keys=True) if meta else "{}"


class BankFront:
    """A case bank over a :class:`RowStore`, a :class:`VectorIndex` and a :class:`FeatureStore` (see the module
    docstring). Backends subclass it and build the parts in their ``create``/``open``."""

    def __init__(self, rows: RowStore, index: VectorIndex, features: FeatureStore, *, config: BankConfig,
                 uid: str, read_only: bool = False, audit: bool = False):
        if not isinstance(audit, bool):
            raise DataFormatError(f"audit must be true or false, got {shown(audit)}")
        self._rows = rows
        self._index = index
        self._features = features
        self.config = config
        self.uid = uid
        self.read_only = read_only
        self.audit = audit  # a deleted case's history keeps its values (off: only kinds, times and field names)
        self.updates_made = 0  # updates in place by this process (update, add with new meta)
        features.keep_values = audit
        self._count = rows.count()
        self._closed = False
        self._usage: tuple[np.ndarray, np.ndarray] | None = None  # (shown_N, reward_sum_N), loaded on first need
        self._evidence: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # (count_N, weight_N, value_N)

    # ------------------------------------------------------------------ basics

    @property
    def path(self) -> Any:
        """Where the bank lives (a directory, or the ``milvus:`` name)."""
        return self._rows.name

    @property
    def dim(self) -> int:
        return self.config.dim

    def __len__(self) -> int:
        return self._count

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise BankError(f"{self.path}: bank is closed")

    def _check_writable(self) -> None:
        self._check_open()
        if self.read_only:
            raise BankError(f"{self.path}: bank is open read-only (another process writes it)")

    def _positions(self, ids: Sequence[str]) -> np.ndarray:
        ids = list(ids)
        found = self._rows.find(ids)
        missing = [i for i in ids if i not in found]
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise UnknownCaseError(f"{self.path}: unknown case id {missing[0]!r}{more}")
        return np.array([found[i] for i in ids], dtype=np.int64)

    def _check_positions(self, positions: Sequence[int] | np.ndarray) -> np.ndarray:
        positions_N = np.asarray(positions, dtype=np.int64).reshape(-1)
        if positions_N.size and (positions_N.min() < 0 or positions_N.max() >= self._count):
            raise UnknownCaseError(f"{self.path}: positions must lie in [0, {self._count}); "
                                   f"got min={int(positions_N.min())}, max={int(positions_N.max())}")
        return positions_N

    def _check_text(self, case: Case, i: int) -> None:
        """A backend's limits on a case's fields (none by default)."""

    # ------------------------------------------------------------------ writes

    def add(self, cases: Sequence[Case], embeddings: Any, *, allow_duplicates: bool = False,
            update_meta: bool = True) -> list[str]:
        """Store cases and their unit-norm embeddings ``[N, D]``.

        Returns one id per input case. A case whose content (state, action, env, kind, scope) is already stored,
        or repeats an earlier case of the same call, is skipped and its stored id returned, unless
        ``allow_duplicates``; when it brings meta other than the stored case's (a non-empty ``meta``), the stored
        case takes that meta in place, as :meth:`update` does (its version bumped, an ``update`` event in its
        history; mem0's ``add``), unless ``update_meta=False`` (the online loops' retention: a resumed run adds again
        what it re-plays, and :meth:`truncate` would not roll an update in place back). Ids left ``None`` are
        derived from the content hash. Nothing is written if any case or embedding is invalid. (What a crash during
        the call leaves: :mod:`memento.bank.protocol`.)
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
        emb_ND = validate_embeddings(embeddings, len(cases), self.dim)
        for i, case in enumerate(cases):
            self._check_text(case, i)
        hashes = [c.content_hash for c in cases]
        with self._rows.transaction("cases violate"):
            out, planned = self._plan_ids(cases, hashes, allow_duplicates=allow_duplicates, warn=True)
            new_rows = self._new_rows(cases, hashes, emb_ND, planned)
            self._rows.insert(new_rows)
            updated = self._take_new_meta(cases, out, planned) if update_meta and not allow_duplicates else 0
        self._stored(new_rows)
        skipped = len(cases) - len(new_rows)
        if skipped:
            logger.debug("%s: skipped %d duplicate case(s)%s", self.path, skipped,
                         f", {updated} of them with new meta (updated in place)" if updated else "")
        return out

    def _take_new_meta(self, cases: Sequence[Case], out: Sequence[str], planned: Sequence[tuple[int, str]]) -> int:
        """The stored cases that ``cases`` repeat with other, non-empty meta take it (in the caller's transaction;
        the last of a call wins); returns how many were updated."""
        new_ids = {case_id for _, case_id in planned}
        wanted: dict[str, dict[str, Any]] = {}
        for case, case_id in zip(cases, out):
            if case.meta and case_id not in new_ids:
                wanted[case_id] = case.meta
        if not wanted:
            return 0
        found = self._rows.find(list(wanted))
        stored = self._rows.cases_at([found[case_id] for case_id in wanted])
        now = time.time()
        updated = 0
        for case_id, old in zip(wanted, stored):
            if _meta_text(wanted[case_id]) != _meta_text(old.meta):
                self._apply_update(found[case_id], old, {"meta": wanted[case_id]}, now)
                updated += 1
        return updated

    def _apply_update(self, position: int, old: Case, changes: dict[str, Any], now: float) -> Case:
        """Write ``changes`` (of :data:`memento.bank.history.UPDATABLE` fields) to the case ``old`` at
        ``position`` with its version bumped and an ``update`` event, in the caller's transaction; returns the new
        case. Content that another live case holds already is refused (``DataFormatError``)."""
        names = tuple(name for name in UPDATABLE if name in changes)
        new = dataclasses.replace(old, **{name: changes[name] for name in names}, version=old.version + 1,
                                  updated=now)
        self._check_text(new, 0)
        digest = new.content_hash
        if digest != old.content_hash:
            clash = self._rows.live_by_hash([digest], None).get(digest)
            if clash is not None and clash != old.id:
                raise DataFormatError(f"update: case {old.id!r} would then hold the content of case {clash!r}; "
                                      "delete one of them instead")
        self._rows.update(position, new, digest)
        self.updates_made += 1
        self._features.record_events([EventRow(pos=position, event="update", time=now, version=new.version,
                                               fields=names, old={name: getattr(old, name) for name in names},
                                               new={name: getattr(new, name) for name in names})])
        if "action" in names:  # the action's vector (a case feature) is computed again on need
            self._features.drop_actions([position])
        return new

    def _new_rows(self, cases: Sequence[Case], hashes: Sequence[str], emb_ND: np.ndarray,
                  planned: Sequence[tuple[int, str]]) -> list[NewRow]:
        now = time.time()
        emb_MD = emb_ND[[i for i, _ in planned]]  # one block: stack_vectors hands it on without copying the rows
        return [NewRow(pos=pos, id=case_id, hash=hashes[i], case=cases[i], meta=case_meta_json(cases[i]),
                       created=now if cases[i].created is None else float(cases[i].created), vector_D=emb_MD[row])
                for row, (pos, (i, case_id)) in enumerate(enumerate(planned, start=self._count))]

    def _stored(self, new_rows: Sequence[NewRow]) -> None:
        """After the rows were stored: the count and the index."""
        if new_rows:
            self._count += len(new_rows)
            self._index.added(new_rows)

    def _plan_ids(self, cases: Sequence[Case], hashes: Sequence[str], *, allow_duplicates: bool, warn: bool,
                  dead: int | None = None) -> tuple[list[str], list[tuple[int, str]]]:
        """The id each case gets and the ``(input index, id)`` of those to insert (the others repeat stored
        content); an id used twice, or already used by another stored case, raises ``DataFormatError``.
        ``dead``: a position that counts as deleted (``replace`` plans before it tombstones)."""
        out: list[str] = [""] * len(cases)
        existing = {} if allow_duplicates else self._rows.live_by_hash(list(dict.fromkeys(hashes)), dead)
        derived = {f"c{digest[:16]}" for case, digest in zip(cases, hashes) if case.id is None}
        # a derived id already stored is a deleted case's (never reused) or one whose content an update changed
        # (its id names its first content): content that reaches it anew gets an id of its own
        gone = set(self._rows.find(sorted(derived)))
        planned: list[tuple[int, str]] = []
        for i, (case, digest) in enumerate(zip(cases, hashes)):
            if not allow_duplicates and digest in existing:
                out[i] = existing[digest]
                if warn and case.id is not None and case.id != existing[digest]:
                    logger.warning("%s: case %r duplicates stored case %r; kept the stored one",
                                   self.path, case.id, existing[digest])
                continue
            position = self._count + len(planned)
            case_id = case.id if case.id is not None else (
                f"c{digest[:16]}" if not allow_duplicates else f"c{digest[:16]}-{position}")
            if case.id is None and case_id in gone:
                case_id = f"c{digest[:16]}-{position}"  # a deleted or updated case's id is never reused
            existing[digest] = case_id
            out[i] = case_id
            planned.append((i, case_id))
        self._check_planned(planned, free=derived - gone)
        return out, planned

    def _check_planned(self, planned: Sequence[tuple[int, str]], free: set[str] | frozenset[str] = frozenset()) -> None:
        """``free``: ids looked up already in this transaction and not stored (not looked up again)."""
        seen: set[str] = set()
        for i, case_id in planned:
            if case_id in seen:
                raise DataFormatError(f"case {i}: id {case_id!r} is used twice in this call")
            seen.add(case_id)
        taken = self._rows.find([case_id for _, case_id in planned if case_id not in free])
        for i, case_id in planned:
            if case_id in taken:
                raise DataFormatError(f"case {i}: id {case_id!r} is already used by another case")

    def check_ids(self, cases: Sequence[Case], *, allow_duplicates: bool = False) -> None:
        """Raise the ``DataFormatError`` that :meth:`add` would raise for these cases' ids (one used twice, or
        used by another stored case), before any work is spent on their embeddings; writes nothing."""
        self._check_open()
        cases = list(cases)
        self._plan_ids(cases, [c.content_hash for c in cases], allow_duplicates=allow_duplicates, warn=False)

    def update_reward(self, case_id: str, reward: float) -> None:
        """Set the reward of a stored case: a number in [0, 1] (:func:`memento.types.check_reward`, as every entry
        point checks it); anything else raises ``DataFormatError`` and changes nothing. ``update(case_id,
        reward=reward)``: a change is an update in place (version, history)."""
        self.update(case_id, reward=check_reward(reward, "reward"))

    def update(self, case_id: str, *, action: str | None = None, reward: float | None = None,
               meta: dict[str, Any] | None = None, state: str | None = None) -> Case:
        """Change a live case in place (mem0's ``update``): its ``action``, ``reward`` and/or ``meta`` (replaced
        whole), keeping its id, vector, scope and usage; its ``version`` goes up by one, ``updated`` is now, and
        its history gets an ``update`` event with the old and new values. Returns the case as stored now (as it
        was, with no version bump, when nothing given differs). ``state`` may only repeat the stored state: a new
        state would need a new vector, so :meth:`replace` the case instead. An unknown or deleted id raises
        ``UnknownCaseError``; a bad value ``DataFormatError``, and nothing changes."""
        self._check_writable()
        if action is None and reward is None and meta is None and state is None:
            raise DataFormatError("update: give at least one of action, reward or meta")
        (position,) = self._live_positions([case_id], "update").tolist()
        old = self._rows.cases_at([position])[0]
        if state is not None and state != old.state:
            raise DataFormatError(f"update cannot change the state of case {case_id!r} (its vector would change): "
                                  "replace the case instead (replace_case, PUT /v1/cases/{id})")
        changes: dict[str, Any] = {}
        if action is not None and check_text(action, "action") != old.action:
            changes["action"] = action
        if reward is not None and check_reward(reward, "reward") != old.reward:
            changes["reward"] = check_reward(reward, "reward")
        if meta is not None:
            dataclasses.replace(old, meta=meta)  # checked as a case's meta is
            if _meta_text(meta) != _meta_text(old.meta):
                changes["meta"] = meta
        if not changes:
            return old
        with self._rows.transaction("the update violates"):
            new = self._apply_update(position, old, changes, time.time())
        logger.info("%s: updated case %r (%s; version %d)", self.path, case_id, ", ".join(changes), new.version)
        return new

    # ------------------------------------------------------------------ forgetting (tombstones)

    @property
    def num_deleted(self) -> int:
        """How many cases were deleted (tombstoned); ``len(bank) - num_deleted`` cases can be found."""
        self._check_open()
        return int(self._rows.deleted_positions().size)

    def deleted_ids(self) -> list[str]:
        """The ids of the deleted cases, in position order."""
        self._check_open()
        return self._rows.deleted_ids()

    def is_deleted(self, ids: Sequence[str]) -> list[bool]:
        """Whether each stored case id was deleted; an id never stored raises ``UnknownCaseError``."""
        self._check_open()
        positions = self._positions(list(ids))
        return [bool(x) for x in np.isin(positions, self._rows.deleted_positions())]

    def _live_positions(self, ids: Sequence[str], what: str) -> np.ndarray:
        ids = list(ids)
        for i, case_id in enumerate(ids):
            if not isinstance(case_id, str) or not case_id:
                raise DataFormatError(f"{what}: case id {i} must be a non-empty string, got {case_id!r}")
        if len(set(ids)) != len(ids):
            raise DataFormatError(f"{what}: a case id is given twice")
        positions_M = self._positions(ids)
        gone = np.isin(positions_M, self._rows.deleted_positions())
        if gone.any():
            raise UnknownCaseError(f"{self.path}: case {ids[int(np.flatnonzero(gone)[0])]!r} was already deleted")
        return positions_M

    def _after_tombstone(self, positions_M: np.ndarray) -> None:
        # a deleted case was never shown nor labelled, as far as the statistics go
        for loaded, load in ((self._usage, self._load_usage), (self._evidence, self._load_evidence)):
            if loaded is not None:
                for column_N in load():  # grown to the cases added since
                    column_N[positions_M] = 0

    def delete(self, ids: str | Sequence[str]) -> int:
        """Forget the cases ``ids`` (stored before this returns): they are never found, listed or chosen again;
        returns how many were deleted. An unknown or already deleted id raises ``UnknownCaseError`` and nothing
        is deleted. Rows stay (a tombstone; their usage rows and action vector go)."""
        self._check_writable()
        wanted = [ids] if isinstance(ids, str) else list(ids)
        if not wanted:
            return 0
        positions_M = self._live_positions(wanted, "delete")
        with self._rows.transaction("the deletion violates"):
            self._rows.tombstone(positions_M.tolist(), wanted, None)
            self._features.forget(positions_M.tolist())
        self._after_tombstone(positions_M)
        logger.info("%s: deleted %d case(s)", self.path, len(wanted))
        return len(wanted)

    def replace(self, case_id: str, case: Case, embedding: Any) -> str:
        """Supersede the case ``case_id`` by ``case`` (its unit-norm state vector ``embedding``, ``[D]``): the old
        case is deleted (:meth:`delete`) and the new one added; returns the new case's id.

        Ids are never reused, so the new case gets a new id (``case.id``, or one derived from its content; the
        tombstone records which id replaced the old one). If its content is already stored as another live case,
        that case's id is returned and nothing is added. Both back ends do both in one transaction (a Milvus
        bank through its watermark: a crash leaves the old case, or the new one with the old one deleted)."""
        self._check_writable()
        if not isinstance(case, Case):
            raise DataFormatError(f"replace: expected a memento.Case, got {type(case).__name__}")
        emb_1D = validate_embeddings(embedding, 1, self.dim)
        self._check_text(case, 0)
        positions_M = self._live_positions([case_id], "replace")
        digest = case.content_hash
        with self._rows.transaction("the new case violates"):
            out, planned = self._plan_ids([case], [digest], allow_duplicates=False, warn=True,
                                          dead=int(positions_M[0]))
            new_rows = self._new_rows([case], [digest], emb_1D, planned)
            self._rows.insert(new_rows)
            self._features.record_events([EventRow(pos=row.pos, event="add", time=row.created, version=1,
                                                   fields=(), link=case_id) for row in new_rows])
            self._rows.tombstone(positions_M.tolist(), [case_id], out[0])
            self._features.forget(positions_M.tolist())
        self._stored(new_rows)
        self._after_tombstone(positions_M)
        logger.info("%s: replaced case %r by %r", self.path, case_id, out[0])
        return out[0]

    def truncate(self, n: int) -> int:
        """Remove every case at position ``>= n`` (the newest ones), with their usage rows, action vectors and
        tombstones; returns how many were removed. Used to roll a bank back to a checkpoint."""
        self._check_writable()
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 0 <= n <= self._count:
            raise DataFormatError(f"truncate: n must be an integer in [0, {self._count}], got {n!r}")
        removed = self._count - int(n)
        if removed == 0:
            return 0
        with self._rows.transaction("the truncation violates"):
            self._rows.truncate(int(n))
            self._features.truncate(int(n))
        self._usage = self._evidence = None
        self._count = int(n)
        self._index.truncate(int(n))
        logger.info("%s: truncated to %d case(s) (%d removed)", self.path, n, removed)
        return removed

    # ------------------------------------------------------------------ reads

    @overload
    def get(self, ids: str) -> Case: ...  # type: ignore[overload-overlap]

    @overload
    def get(self, ids: Sequence[str]) -> list[Case]: ...

    def get(self, ids: str | Sequence[str], *, include_deleted: bool = False) -> Case | list[Case]:
        """The stored case(s), in the order asked; an unknown or deleted (or replaced) id raises
        ``UnknownCaseError``. ``include_deleted``: read deleted cases' rows too (for the internal readers of logged
        decisions: the inspector, off-policy evaluation, a bank copy; never an answer to a user's read)."""
        self._check_open()
        single = isinstance(ids, str)
        wanted: list[str] = [ids] if isinstance(ids, str) else list(ids)
        positions = self._positions(wanted)
        if not include_deleted:
            gone = np.flatnonzero(np.isin(positions, self._rows.deleted_positions()))
            if gone.size:
                raise UnknownCaseError(f"{self.path}: case {wanted[int(gone[0])]!r} was deleted")
        result = self._rows.cases_at(positions.tolist())
        return result[0] if single else result

    def history(self, case_id: str) -> list[CaseEvent]:
        """The events of a stored case, oldest first (:mod:`memento.bank.history`): its ``add``, its ``update``
        events with the fields changed and their old and new values, and its ``replace`` or ``delete``. A deleted
        or replaced case's history keeps only the events' kinds, times, versions and field names, unless the bank
        was opened with ``audit=True``. An unknown id raises ``UnknownCaseError``."""
        self._check_open()
        if not isinstance(case_id, str) or not case_id:
            raise DataFormatError(f"history: case id must be a non-empty string, got {shown(case_id)}")
        (position,) = self._positions([case_id]).tolist()
        case = self._rows.cases_at([position])[0]
        tomb = self._rows.tombstones_at([position]).get(position)
        values = tomb is None or self.audit
        stored = self._features.events_at(position)
        updates = [event for event in stored if event.event == "update"]
        replaces = next((event.link for event in stored if event.event == "add"), None)
        first = {name: getattr(case, name) for name in UPDATABLE}
        for event in reversed(updates):  # the values it was added with: the oldest update's old values
            first.update(event.old or {name: None for name in event.fields})  # None: erased, not known
        added = {**{key: value for key, value in case.to_json().items() if key != "id"}, **first}
        if not added.get("meta"):  # no meta (or none known)
            added.pop("meta", None)
        events = [CaseEvent(event="add", time=float(case.created or 0.0), case_id=case_id, version=1,
                            fields=tuple(added), new=added if values else None, replaces=replaces)]
        events += [CaseEvent(event="update", time=event.time, case_id=case_id, version=event.version,
                             fields=event.fields, old=event.old if values else None,
                             new=event.new if values else None) for event in updates]
        if tomb is not None:
            when, replaced_by = tomb
            events.append(CaseEvent(event="replace" if replaced_by else "delete", time=when, case_id=case_id,
                                    version=case.version, replaced_by=replaced_by))
        return events

    def count(self, *, env: str | None = None, kind: str | None = None,
              scope: Scope | Mapping[str, Any] | None = None, filter: Where | Mapping[str, Any] | None = None) -> int:
        """How many live cases there are of ``env``/``kind``, in ``scope``, whose meta match ``filter``
        (:mod:`memento.bank.where`); all live cases when none is given."""
        self._check_open()
        return int(self._rows.live_positions(Filter.of(env, kind, False, scope, filter), self._count).size)

    def ids_where(self, *, env: str | None = None, kind: str | None = None,
                  scope: Scope | Mapping[str, Any] | None = None,
                  filter: Where | Mapping[str, Any] | None = None) -> list[str]:
        """The ids of the live cases :meth:`count` counts, in position order."""
        self._check_open()
        return self._rows.ids_at(self._rows.live_positions(Filter.of(env, kind, False, scope, filter),
                                                           self._count).tolist())

    def delete_where(self, *, env: str | None = None, scope: Scope | Mapping[str, Any] | None = None,
                     filter: Where | Mapping[str, Any] | None = None, all: bool = False) -> list[str]:
        """:meth:`delete_all`, returning the ids it deleted (in position order)."""
        self._check_writable()
        if not isinstance(all, (bool, np.bool_)):
            raise DataFormatError(f"delete_all: all must be true or false, got {shown(all)}")
        where = Filter.of(env, None, False, scope, filter)
        if where.scope is None and where.meta is None and not all:
            raise DataFormatError("delete_all needs a scope (user, agent, session) or a metadata filter, so that no "
                                  "one deletes every tenant's cases by accident; pass all=True to delete every case")
        ids = self.ids_where(env=env, scope=where.scope, filter=where.meta)
        if ids:
            self.delete(ids)
        return ids

    def delete_all(self, *, env: str | None = None, scope: Scope | Mapping[str, Any] | None = None,
                   filter: Where | Mapping[str, Any] | None = None, all: bool = False) -> int:
        """Delete every live case of ``scope`` whose meta match ``filter`` (and of ``env`` when given), as
        :meth:`delete` does (one transaction); returns how many. A scope or a filter is required, so that no one
        wipes every tenant's cases by accident: ``all=True`` deletes every (matching) case without one."""
        return len(self.delete_where(env=env, scope=scope, filter=filter, all=all))

    def rewards(self, ids: Sequence[str]) -> np.ndarray:
        """The stored rewards ``[N]`` (float64) of the given case ids, in the order asked."""
        self._check_open()
        return self._rows.rewards_at(self._positions(list(ids)).tolist())

    def embeddings(self, ids: Sequence[str]) -> np.ndarray:
        """Stored unit vectors ``[N, D]`` of the given case ids."""
        self._check_open()
        return self._index.vectors_at(self._positions(list(ids)))

    def embeddings_at(self, positions: Sequence[int] | np.ndarray) -> np.ndarray:
        """Stored unit vectors ``[N, D]`` at bank positions."""
        self._check_open()
        return self._index.vectors_at(self._check_positions(positions))

    def ids_at(self, positions: Sequence[int] | np.ndarray) -> list[str]:
        """Case ids at bank positions."""
        self._check_open()
        return self._rows.ids_at([int(p) for p in positions])

    def positions_of(self, ids: Sequence[str]) -> np.ndarray:
        """Bank positions (int64) of the case ids, in the order asked; an unknown id raises ``UnknownCaseError``."""
        self._check_open()
        return self._positions(list(ids))

    def iter_cases(self, batch_size: int = 1000) -> Iterator[Case]:
        """All live cases in insertion order, read in batches."""
        self._check_open()
        yield from self._rows.scan(max(1, int(batch_size)))

    def import_jsonl(self, path: str | Path, encoder: Any, *, format: str = "case",
                     allow_duplicates: bool = False, show_progress_bar: bool | None = None) -> list[str]:
        """Read a case file (any :data:`memento.formats.CaseFormat`), encode states, add all.

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
        """Write every live case as Case JSONL (atomically); returns the number written."""
        return write_jsonl(path, (case.to_json() for case in self.iter_cases()))

    def stats(self) -> dict[str, Any]:
        """Counts, reward summary, index state and storage sizes (a backend's own keys after ``path``)."""
        self._check_open()
        rows = self._rows.summary()
        tail = {key: rows.pop(key) for key in ("reward_mean", "reward_positive", "by_kind", "by_env", "files")}
        files = tail.pop("files")
        return {"path": str(self.path), **rows, "dim": self.dim, "index": self.config.index.factory,
                **self._index.summary(self._count), **tail, "deleted": self.num_deleted,
                "encoder": None if self.config.encoder is None else to_dict(self.config.encoder), "files": files}

    # ------------------------------------------------------------------ search

    def search_positions(self, query: Any, k: int, *, env: str | None = None, kind: str | None = None,
                         positive: bool = False, scope: Scope | Mapping[str, Any] | None = None,
                         filter: Where | Mapping[str, Any] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Top-k by inner product: ``(scores_BK, positions_BK)``, -inf / -1 where fewer than k match.
        ``positive``: only cases whose stored reward is > 0; ``scope``/``filter``: see :mod:`memento.bank.where`."""
        where = Filter.of(env, kind, positive, scope, filter)
        scores_BK, positions_BK, _ = self._search(query, k, where, pad=True)
        return scores_BK, positions_BK

    def _search(self, query: Any, k: int, where: Filter, *, pad: bool,
                with_vectors: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """:meth:`search_positions`; without ``pad``, the result is at most the bank's size wide (a search for
        more cases than the bank holds finds them all, whatever ``k``). Equal scores (cases with the same
        question, hence the same vector) come in position order: an index leaves the order of ties to its
        kernels, which differ between CPUs, and a seeded run must not. Its kernels may even score two equal
        vectors a few units in the last place apart (seen on an AMD EPYC), so scores within
        :data:`TIE_TOLERANCE` of their neighbour are one score (see :func:`_order_ties`)."""
        self._check_open()
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise DataFormatError(f"k must be a positive integer, got {k!r}")
        q_BD = validate_query(query, self.dim)
        width = int(k) if pad else min(int(k), max(self._count, 1))  # no more cases are searched for
        if len(q_BD) * width > _MAX_PADDED and width > self._count:
            raise DataFormatError(f"k={width} for {len(q_BD)} queries: the padded result would hold "
                                  f"{len(q_BD) * width} entries, but the bank holds {self._count} cases; "
                                  f"ask for k <= {max(self._count, 1)}")
        k = min(width, self._count)
        if k == 0:
            empty = np.zeros((len(q_BD), width, self.dim), dtype=np.float32) if with_vectors else None
            return (np.full((len(q_BD), width), -np.inf, dtype=np.float32),
                    np.full((len(q_BD), width), -1, dtype=np.int64), empty)
        scores_BK, labels_BK, vectors_BKD = self._index.topk(q_BD, k, where, self._rows.deleted_positions(),
                                                             with_vectors)
        scores_BK = np.where(labels_BK < 0, -np.inf, scores_BK).astype(np.float32)
        with np.errstate(invalid="ignore"):  # -inf - -inf (padding) is nan: not a gap, so ordered below
            spaced = bool(np.all(scores_BK[:, :-1] - scores_BK[:, 1:] > _tie_tolerance(scores_BK[:, :-1])))
        if not spaced:  # ties or padding: the order is ours to set
            scores_BK, labels_BK, vectors_BKD = _order_ties(scores_BK, labels_BK, vectors_BKD)
        labels_BK = labels_BK.astype(np.int64, copy=False)
        if width > k:  # pad to the width asked for
            extra = ((0, 0), (0, width - k))
            scores_BK, labels_BK = (np.pad(scores_BK, extra, constant_values=-np.inf),
                                    np.pad(labels_BK, extra, constant_values=-1))
        return scores_BK, labels_BK, vectors_BKD

    def search(self, query: Any, k: int, *, env: str | None = None, kind: str | None = None,
               positive: bool = False, scope: Scope | Mapping[str, Any] | None = None,
               filter: Where | Mapping[str, Any] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Nearest cases to ``query_D`` or ``query_BD`` by cosine (queries are normalised).

        For one query ``[D]``: ``(scores_K, ids_K)``, trimmed to the cases found. For a batch ``[B, D]``:
        ``(scores_BK, ids_BK)``, padded with ``-inf`` and ``None``. ``ids`` is a numpy object array of case-id
        strings. ``env``/``kind`` restrict the search; ``positive`` keeps the cases whose stored reward is > 0;
        ``scope``/``filter`` keep the cases of a scope whose metadata match (:mod:`memento.bank.where`).
        """
        single = np.asarray(query).ndim == 1
        where = Filter.of(env, kind, positive, scope, filter)
        scores_BK, labels_BK, _ = self._search(query, k, where, pad=not single)
        positions = sorted({int(p) for p in labels_BK[labels_BK >= 0]})
        id_of = dict(zip(positions, self._rows.ids_at(positions)))
        ids_BK = np.empty(labels_BK.shape, dtype=object)
        for b, row in enumerate(labels_BK):
            for j, p in enumerate(row):
                ids_BK[b, j] = id_of[int(p)] if p >= 0 else None
        if single:
            valid = labels_BK[0] >= 0
            return scores_BK[0][valid], ids_BK[0][valid]
        return scores_BK, ids_BK

    def candidates(self, query_D: Any, c: int, *, env: str | None = None, kind: str | None = None,
                   positive: bool = False, scope: Scope | Mapping[str, Any] | None = None,
                   filter: Where | Mapping[str, Any] | None = None) -> Candidates:
        """The top-``c`` cases for one state with their stored vectors (the policy's candidate set);
        ``positive``: among the cases whose stored reward is > 0 only (the top-C of those, not a filtered top-C);
        ``scope``/``filter``: among the cases of a scope whose metadata match, likewise."""
        q = np.asarray(query_D)
        if q.ndim not in (1, 2) or q.ndim == 2 and q.shape[0] != 1:
            raise DimensionError(f"candidates takes one state [D], got shape {q.shape}")
        scores_BK, labels_BK, vectors_BKD = self._search(q.reshape(1, -1) if q.ndim == 1 else q, c,
                                                         Filter.of(env, kind, positive, scope, filter), pad=False,
                                                         with_vectors=True)
        valid = labels_BK[0] >= 0
        positions_C = labels_BK[0][valid]
        assert vectors_BKD is not None
        return Candidates(ids=self._rows.ids_at(positions_C.tolist()), positions_C=positions_C,
                          scores_C=scores_BK[0][valid],
                          embeddings_CD=np.ascontiguousarray(vectors_BKD[0][valid], dtype=np.float32))

    def set_search_params(self, *, ef_search: int | None = None, nprobe: int | None = None,
                          refine: int | None = None) -> None:
        """Change the HNSW ``ef_search`` / IVF ``nprobe`` / exact re-ranking ``refine`` used by later searches
        (not saved)."""
        changes = {name: value for name, value in (("ef_search", ef_search), ("nprobe", nprobe), ("refine", refine))
                   if value is not None}
        index = dataclasses.replace(self.config.index, **changes)
        self.config = dataclasses.replace(self.config, index=index)
        self._index.set_search_params(index)

    # ------------------------------------------------------------------ usage statistics and action vectors

    def _grown(self, columns: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
        """Per-position totals grown with zeros to the bank's size (the cases added since were never shown or
        labelled)."""
        grow = self._count - columns[0].shape[0]
        return columns if grow <= 0 else tuple(np.concatenate([c, np.zeros(grow, dtype=c.dtype)]) for c in columns)

    def _load_usage(self) -> tuple[np.ndarray, np.ndarray]:
        if self._usage is None:
            self._usage = self._features.totals(self._count)
        self._usage = self._grown(self._usage)  # type: ignore[assignment]
        return self._usage

    def _load_evidence(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._evidence is None:
            self._evidence = self._features.evidence_totals(self._count)
        self._evidence = self._grown(self._evidence)  # type: ignore[assignment]
        return self._evidence

    def record_evidence(self, step: int, ids: Sequence[str], weight: Any, value: Any) -> None:
        """Log what the planner's labels at ``step`` said of the cases ``ids`` (the soft-Q agent's per-case memory,
        :mod:`memento.learn.evidence`): per case a finite ``weight >= 0`` (how much look-alike rivalry the label
        had) and a finite ``value`` (its weighted label advantage over them)."""
        self._check_writable()
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise DataFormatError(f"record_evidence: step must be an integer >= 0, got {step!r}")
        positions_M = self._positions(list(ids))
        weight_M = np.asarray(weight, dtype=np.float64).reshape(-1)
        value_M = np.asarray(value, dtype=np.float64).reshape(-1)
        if weight_M.shape != positions_M.shape or value_M.shape != positions_M.shape:
            raise DimensionError(f"record_evidence: {len(positions_M)} id(s), weight.shape={weight_M.shape}, "
                                 f"value.shape={value_M.shape}")
        if not (np.isfinite(weight_M).all() and np.isfinite(value_M).all() and (weight_M >= 0).all()):
            raise DataFormatError("record_evidence: weights must be finite and >= 0, values finite")
        count_N, weight_N, value_N = self._load_evidence()
        self._features.record_evidence(int(step), positions_M, weight_M, value_M)
        np.add.at(count_N, positions_M, 1)
        np.add.at(weight_N, positions_M, weight_M)
        np.add.at(value_N, positions_M, value_M)

    def evidence_at(self, positions: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(count_C, weight_C, value_C)``: how often the cases at ``positions`` were labelled, and the sums of
        their evidence weights and values (:meth:`record_evidence`)."""
        self._check_open()
        positions_C = self._check_positions(positions)
        return tuple(column_N[positions_C].copy() for column_N in self._load_evidence())  # type: ignore[return-value]

    def record_usage(self, step: int, ids: Sequence[str], reward: float) -> None:
        """Log that the cases ``ids`` were shown at ``step`` and the decision earned ``reward`` (in [0, 1];
        stored)."""
        self._check_writable()
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise DataFormatError(f"record_usage: step must be an integer >= 0, got {step!r}")
        value = check_reward(reward, "record_usage: reward")
        positions_K = self._positions(list(ids))
        shown_N, reward_N = self._load_usage()
        self._features.record(int(step), positions_K, value)
        np.add.at(shown_N, positions_K, 1)
        np.add.at(reward_N, positions_K, value)

    def usage_at(self, positions: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(shown_C, reward_sum_C)``: how often the cases at ``positions`` were shown and their summed reward."""
        self._check_open()
        positions_C = self._check_positions(positions)
        shown_N, reward_N = self._load_usage()
        return shown_N[positions_C].copy(), reward_N[positions_C].copy()

    def truncate_usage(self, step: int) -> int:
        """Forget every usage and evidence row logged at ``step`` or later (a resume to a checkpoint at ``step``);
        returns how many were removed."""
        self._check_writable()
        removed = self._features.truncate_steps(int(step))
        self._usage = self._evidence = None
        return int(removed)

    def action_embeddings_at(self, positions: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(emb_CD, have_C)``: the stored action vectors at ``positions`` (zeros where ``have_C`` is False)."""
        self._check_open()
        return self._features.actions_at(np.asarray(positions, dtype=np.int64).reshape(-1))

    def set_action_embeddings(self, positions: Sequence[int] | np.ndarray, embeddings: Any) -> None:
        """Store the action vectors of the cases at ``positions`` (``(C, D)`` float32)."""
        self._check_writable()
        positions_C = np.asarray(positions, dtype=np.int64).reshape(-1)
        emb_CD = validate_embeddings(embeddings, positions_C.size, self.dim)
        if positions_C.size and (positions_C.min() < 0 or positions_C.max() >= self._count):
            raise UnknownCaseError(f"{self.path}: positions must lie in [0, {self._count})")
        self._features.set_actions(positions_C, emb_CD)

    # ------------------------------------------------------------------ followers and lifetime

    def rows_on_disk(self) -> int:
        """How many rows the store holds now (another process may have added some since open)."""
        self._check_open()
        return self._rows.count()

    def refresh(self) -> int:
        """Take in the cases another process stored since this bank was opened (or last refreshed); returns how
        many. Rows are never removed, so positions stay dense; the deletions another process made are seen by
        the next search."""
        self._check_open()
        top = self.rows_on_disk()
        if top <= self._count:
            return 0
        first_new = self._count
        self._index.refresh(first_new, top)
        self._count = top
        logger.debug("%s: took in %d case(s) added by another process", self.path, top - first_new)
        return top - first_new

    def flush(self) -> None:
        """Make what was written durable in the backend's own form (read-only: nothing)."""
        self._check_open()
        if not self.read_only:
            self._index.flush()

    def close(self) -> None:
        """Flush and close. Safe to call twice."""
        if self._closed:
            return
        try:
            self.flush()
        finally:
            self._closed = True
            self._rows.close()

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({str(self.path)!r}, cases={self._count}, dim={self.dim}, "
                f"index={self.config.index.factory!r})")
