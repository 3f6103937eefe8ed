"""The bank front, written once for every backend: ids, de-duplication, validation, tombstones, search results,
usage statistics and JSONL import/export, over three narrow parts a backend supplies (as TorchRL composes a
replay buffer from a storage, a sampler and a writer; their protocols are in :mod:`memento.bank.parts`):

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

Each operation is documented once, in :class:`memento.bank.protocol.Bank`. :class:`BankFront` holds the reads,
searches, usage statistics and lifetime; its writes and its state are in :mod:`memento.bank.edits`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, overload

import numpy as np

from memento.bank.edits import FrontCore, FrontEdits
from memento.bank.history import UPDATABLE, CaseEvent
from memento.bank.parts import (
    MAX_PADDED,
    TIE_TOLERANCE,
    Candidates,
    FeatureStore,
    Filter,
    NewRow,
    RowStore,
    VectorIndex,
    case_meta_json,
    check_embedding_shape,
    check_unit_rows,
    finite_float32,
    order_ties,
    stack_vectors,
    tie_tolerance,
    validate_embeddings,
    validate_query,
)
from memento.bank.where import Scope, Where
from memento.config import to_dict
from memento.errors import DataFormatError, DimensionError, UnknownCaseError
from memento.formats import read_case_file, write_jsonl
from memento.types import Case, check_reward, shown

__all__ = ["TIE_TOLERANCE", "BankFront", "Candidates", "FeatureStore", "Filter", "FrontCore", "FrontEdits", "NewRow",
           "RowStore", "VectorIndex", "case_meta_json", "check_embedding_shape", "check_unit_rows", "finite_float32",
           "stack_vectors", "validate_embeddings", "validate_query"]

logger = logging.getLogger(__name__)


class BankFront(FrontEdits):
    """A case bank over a :class:`RowStore`, a :class:`VectorIndex` and a :class:`FeatureStore` (see the module
    docstring): :class:`memento.bank.protocol.Bank`, where each operation is documented. The writes are in
    :class:`memento.bank.edits.FrontEdits`, the reads, searches, usage statistics and lifetime here. Backends
    subclass it and build the parts in their ``create``/``open``."""

    # ------------------------------------------------------------------ forgetting (tombstones)

    @property
    def num_deleted(self) -> int:
        self._check_open()
        return int(self._rows.deleted_positions().size)

    def deleted_ids(self) -> list[str]:
        self._check_open()
        return self._rows.deleted_ids()

    def is_deleted(self, ids: Sequence[str]) -> list[bool]:
        self._check_open()
        positions = self._positions(list(ids))
        return [bool(x) for x in np.isin(positions, self._rows.deleted_positions())]


    # ------------------------------------------------------------------ reads

    @overload
    def get(self, ids: str, *, include_deleted: bool = False) -> Case: ...  # type: ignore[overload-overlap]

    @overload
    def get(self, ids: Sequence[str], *, include_deleted: bool = False) -> list[Case]: ...

    def get(self, ids: str | Sequence[str], *, include_deleted: bool = False) -> Case | list[Case]:
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

    def rewards(self, ids: Sequence[str]) -> np.ndarray:
        self._check_open()
        return self._rows.rewards_at(self._positions(list(ids)).tolist())

    def embeddings(self, ids: Sequence[str]) -> np.ndarray:
        self._check_open()
        return self._index.vectors_at(self._positions(list(ids)))

    def embeddings_at(self, positions: Sequence[int] | np.ndarray) -> np.ndarray:
        self._check_open()
        return self._index.vectors_at(self._check_positions(positions))

    def ids_at(self, positions: Sequence[int] | np.ndarray) -> list[str]:
        self._check_open()
        return self._rows.ids_at([int(p) for p in positions])

    def positions_of(self, ids: Sequence[str]) -> np.ndarray:
        self._check_open()
        return self._positions(list(ids))

    def iter_cases(self, batch_size: int = 1000) -> Iterator[Case]:
        self._check_open()
        yield from self._rows.scan(max(1, int(batch_size)))

    def import_jsonl(self, path: str | Path, encoder: Any, *, format: str = "case",
                     allow_duplicates: bool = False, show_progress_bar: bool | None = None) -> list[str]:
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
        return write_jsonl(path, (case.to_json() for case in self.iter_cases()))

    def stats(self) -> dict[str, Any]:
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
        :data:`TIE_TOLERANCE` of their neighbour are one score (see :func:`order_ties`)."""
        self._check_open()
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise DataFormatError(f"k must be a positive integer, got {k!r}")
        q_BD = validate_query(query, self.dim)
        width = int(k) if pad else min(int(k), max(self._count, 1))  # no more cases are searched for
        if len(q_BD) * width > MAX_PADDED and width > self._count:
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
            spaced = bool(np.all(scores_BK[:, :-1] - scores_BK[:, 1:] > tie_tolerance(scores_BK[:, :-1])))
        if not spaced:  # ties or padding: the order is ours to set
            scores_BK, labels_BK, vectors_BKD = order_ties(scores_BK, labels_BK, vectors_BKD)
        labels_BK = labels_BK.astype(np.int64, copy=False)
        if width > k:  # pad to the width asked for
            extra = ((0, 0), (0, width - k))
            scores_BK, labels_BK = (np.pad(scores_BK, extra, constant_values=-np.inf),
                                    np.pad(labels_BK, extra, constant_values=-1))
        return scores_BK, labels_BK, vectors_BKD

    def search(self, query: Any, k: int, *, env: str | None = None, kind: str | None = None,
               positive: bool = False, scope: Scope | Mapping[str, Any] | None = None,
               filter: Where | Mapping[str, Any] | None = None) -> tuple[np.ndarray, np.ndarray]:
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
        changes = {name: value for name, value in (("ef_search", ef_search), ("nprobe", nprobe), ("refine", refine))
                   if value is not None}
        index = dataclasses.replace(self.config.index, **changes)
        self.config = dataclasses.replace(self.config, index=index)
        self._index.set_search_params(index)

    # ------------------------------------------------------------------ usage statistics and action vectors

    def record_evidence(self, step: int, ids: Sequence[str], weight: Any, value: Any) -> None:
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
        self._check_open()
        positions_C = self._check_positions(positions)
        return tuple(column_N[positions_C].copy() for column_N in self._load_evidence())  # type: ignore[return-value]

    def record_usage(self, step: int, ids: Sequence[str], reward: float) -> None:
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
        self._check_open()
        positions_C = self._check_positions(positions)
        shown_N, reward_N = self._load_usage()
        return shown_N[positions_C].copy(), reward_N[positions_C].copy()

    def truncate_usage(self, step: int) -> int:
        self._check_writable()
        removed = self._features.truncate_steps(int(step))
        self._usage = self._evidence = None
        return int(removed)

    def action_embeddings_at(self, positions: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        self._check_open()
        return self._features.actions_at(np.asarray(positions, dtype=np.int64).reshape(-1))

    def set_action_embeddings(self, positions: Sequence[int] | np.ndarray, embeddings: Any) -> None:
        self._check_writable()
        positions_C = np.asarray(positions, dtype=np.int64).reshape(-1)
        emb_CD = validate_embeddings(embeddings, positions_C.size, self.dim)
        if positions_C.size and (positions_C.min() < 0 or positions_C.max() >= self._count):
            raise UnknownCaseError(f"{self.path}: positions must lie in [0, {self._count})")
        self._features.set_actions(positions_C, emb_CD)

    # ------------------------------------------------------------------ followers and lifetime

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def rows_on_disk(self) -> int:
        self._check_open()
        return self._rows.count()

    def refresh(self) -> int:
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
        self._check_open()
        if not self.read_only:
            self._index.flush()

    def close(self) -> None:
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
