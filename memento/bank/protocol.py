"""The operations the loop, the selector, the service and the tools use on a case bank, as one protocol.

Two backends implement :class:`Bank`, both the one bank front :class:`memento.bank.front.BankFront` (ids,
de-duplication, validation, tombstones, import/export, written once) over their own row store, vector index
and feature store:

- :class:`memento.bank.local.CaseBank`, a directory (SQLite in WAL mode + a faiss index), the default;
- :class:`memento.bank.milvus.MilvusBank`, one Milvus collection (``pymilvus``; Milvus Lite in a local
  file, or a server), named ``milvus:URI[#collection]`` (:func:`memento.bank.uri.parse_bank_uri`).

Both keep the same case ids (content-hash ids ``c<sha256[:16]>`` unless the case brings its own), the same
dense positions (a case's position is its insertion index; the faiss label in a directory bank, the primary key
in a Milvus collection), the same de-duplication (by :func:`memento.types.content_hash` among live cases; an
``add`` of stored content with new meta updates the stored case's meta in place), the same forgetting
(``delete``/``replace``/``delete_all`` tombstone a case: it is never found, listed, chosen or read by ``get`` again,
but ``get(..., include_deleted=True)`` and ``embeddings_at``/``positions_of`` still read its row, so logged
decisions can be replayed) and the same case lifecycle (``update`` in place with a ``version``, ``history``;
:mod:`memento.bank.history`).

Operations, and what a Milvus bank does with each:

================================  =======================================================================
operation                          Milvus bank
================================  =======================================================================
``add`` / ``check_ids``            yes; de-duplication by content hash (an in-memory map of the live
                                   hashes, loaded on first need); inserted in batches of
                                   ``MilvusOptions.insert_batch`` rows, all-or-nothing (see *crash* below)
``get`` / ``rewards``              yes (primary-key reads)
``embeddings`` / ``embeddings_at``  yes, float32 exactly as added
``ids_at`` / ``positions_of``      yes
``search`` / ``search_positions``  yes; ``env``/``kind``/``positive``, the scope and the metadata filter
                                   (:mod:`memento.bank.where`) become a Milvus filter expression
``candidates``                     yes; the vectors come back with the hits (``output_fields``)
``update_reward``                  yes (the row is rewritten with ``upsert``)
``update``                         yes (the row is rewritten with ``upsert``; a collection made before case
                                   versions stores no version: it reads 1, the history has the update)
``history``                        yes (events in a side collection ``<collection>__history``)
``count`` / ``ids_where``          yes (a filtered query over the live committed rows)
``delete`` / ``replace`` /         yes (a ``deleted`` flag on the row; searches filter on it); whole
``delete_all``
``is_deleted`` / ``deleted_ids``    yes
``iter_cases`` / ``export_jsonl``  yes (position order; deleted cases left out)
``import_jsonl``                   yes
``stats``                          yes (the same keys; ``files`` is the Milvus Lite directory's size)
``truncate``                       yes (the watermark lowered, then a delete by ``pos >= n``)
``set_search_params``              yes (``nprobe`` for IVF_FLAT, ``ef`` for HNSW)
``refresh`` / ``rows_on_disk``     yes (a re-count; a Milvus Lite file is locked to one process at a time)
``flush`` / ``close``              yes (``flush`` seals the rows added since into an indexed segment)
``record_usage`` / ``usage_at`` /  yes: usage statistics, action vectors and per-case evidence (the Q-network's
``truncate_usage`` /               ``usage`` and ``action`` case features, the agent's per-case memory) in three
``action_embeddings_at`` /         side collections, ``<collection>__usage``, ``<collection>__actions`` and
``set_action_embeddings`` /        ``<collection>__evidence``, created on first write
``record_evidence`` /
``evidence_at``
================================  =======================================================================

``positive=True`` on ``search``, ``search_positions`` and ``candidates`` is the top-k among the cases whose stored
reward is > 0 (a pre-filter, not a filtered top-k): a Milvus bank pushes it down as ``reward > 0``; a directory
bank reads the rewarded positions from SQLite at each call (rewards change, and are not kept in memory) and
hands faiss that mask with the env/kind/deleted ones. (:meth:`memento.bank.front.Candidates.positive`, which
similarity's ``positive_only`` uses, is different: it filters a top-C already found.)

*Crash.* A directory bank commits an ``add`` in one SQLite transaction: after ``kill -9`` all of the call's
cases are there or none. So does a Milvus bank, through a committed-rows watermark (the collection property
``memento.committed``, moved once after the last insert batch; :mod:`memento.bank.milvus`, "Transactions"):
rows past it are never counted, read or found, and the next writer deletes them, so after ``kill -9`` an
``add``/``import_jsonl`` left all of its cases or none (tested with SIGKILL at 10 points of a 2,000-case
import), and ``delete``/``replace``/``truncate`` are whole too (their tombstones are recorded at the commit
point and completed by the next writer). Milvus Lite writes its log to the OS without fsync: a machine crash
may lose committed cases at the end (the bank is then the prefix left, with a warning). A Milvus server's
guarantees are the server's (an acknowledged insert is in its log).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from memento.bank.front import Candidates
from memento.bank.history import CaseEvent
from memento.bank.where import Scope, Where
from memento.config import BankConfig
from memento.types import Case

__all__ = ["Bank"]


@runtime_checkable
class Bank(Protocol):
    """A case bank: cases, their unit-norm state vectors, nearest-neighbour search over them."""

    uid: str
    config: BankConfig
    read_only: bool
    audit: bool
    updates_made: int  # updates in place by this process (update, add with new meta)

    @property
    def path(self) -> Path | str:
        """Where the bank lives: a directory, or the ``milvus:`` URI it was opened with."""
        ...

    @property
    def dim(self) -> int: ...

    @property
    def num_deleted(self) -> int: ...

    def __len__(self) -> int:
        """Rows stored, deleted ones included (positions are ``0..len-1``)."""
        ...

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc: object) -> None: ...

    # ---- writes
    def add(self, cases: Sequence[Case], embeddings: Any, *, allow_duplicates: bool = False,
            update_meta: bool = True) -> list[str]: ...

    def check_ids(self, cases: Sequence[Case], *, allow_duplicates: bool = False) -> None: ...

    def update_reward(self, case_id: str, reward: float) -> None: ...

    def update(self, case_id: str, *, action: str | None = None, reward: float | None = None,
               meta: dict[str, Any] | None = None, state: str | None = None) -> Case: ...

    def delete(self, ids: str | Sequence[str]) -> int: ...

    def delete_all(self, *, env: str | None = None, scope: Scope | Mapping[str, Any] | None = None,
                   filter: Where | Mapping[str, Any] | None = None, all: bool = False) -> int: ...

    def delete_where(self, *, env: str | None = None, scope: Scope | Mapping[str, Any] | None = None,
                     filter: Where | Mapping[str, Any] | None = None, all: bool = False) -> list[str]: ...

    def replace(self, case_id: str, case: Case, embedding: Any) -> str: ...

    def truncate(self, n: int) -> int: ...

    def import_jsonl(self, path: str | Path, encoder: Any, *, format: str = "case",
                     allow_duplicates: bool = False, show_progress_bar: bool | None = None) -> list[str]: ...

    # ---- reads
    def get(self, ids: Any, *, include_deleted: bool = False) -> Any:
        """``get(id) -> Case``, ``get([ids]) -> list[Case]``; an unknown or deleted id raises ``UnknownCaseError``
        (``include_deleted``: deleted rows too, for the readers of logged decisions)."""
        ...

    def history(self, case_id: str) -> list[CaseEvent]: ...

    def count(self, *, env: str | None = None, kind: str | None = None, scope: Scope | Mapping[str, Any] | None = None,
              filter: Where | Mapping[str, Any] | None = None) -> int: ...

    def ids_where(self, *, env: str | None = None, kind: str | None = None,
                  scope: Scope | Mapping[str, Any] | None = None,
                  filter: Where | Mapping[str, Any] | None = None) -> list[str]: ...

    def rewards(self, ids: Sequence[str]) -> np.ndarray: ...

    def embeddings(self, ids: Sequence[str]) -> np.ndarray: ...

    def embeddings_at(self, positions: Sequence[int] | np.ndarray) -> np.ndarray: ...

    def ids_at(self, positions: Sequence[int] | np.ndarray) -> list[str]: ...

    def positions_of(self, ids: Sequence[str]) -> np.ndarray: ...

    def is_deleted(self, ids: Sequence[str]) -> list[bool]: ...

    def deleted_ids(self) -> list[str]: ...

    def iter_cases(self, batch_size: int = 1000) -> Iterator[Case]: ...

    def export_jsonl(self, path: str | Path) -> int: ...

    def stats(self) -> dict[str, Any]: ...

    # ---- search
    def search(self, query: Any, k: int, *, env: str | None = None, kind: str | None = None,
               positive: bool = False, scope: Scope | Mapping[str, Any] | None = None,
               filter: Where | Mapping[str, Any] | None = None) -> tuple[np.ndarray, np.ndarray]: ...

    def search_positions(self, query: Any, k: int, *, env: str | None = None, kind: str | None = None,
                         positive: bool = False, scope: Scope | Mapping[str, Any] | None = None,
                         filter: Where | Mapping[str, Any] | None = None) -> tuple[np.ndarray, np.ndarray]: ...

    def candidates(self, query_D: Any, c: int, *, env: str | None = None, kind: str | None = None,
                   positive: bool = False, scope: Scope | Mapping[str, Any] | None = None,
                   filter: Where | Mapping[str, Any] | None = None) -> Candidates: ...

    def set_search_params(self, *, ef_search: int | None = None, nprobe: int | None = None) -> None: ...

    # ---- usage statistics and action vectors (the Q-network's case features)
    def record_usage(self, step: int, ids: Sequence[str], reward: float) -> None: ...

    def usage_at(self, positions: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...

    def truncate_usage(self, step: int) -> int: ...

    def record_evidence(self, step: int, ids: Sequence[str], weight: Any, value: Any) -> None: ...

    def evidence_at(self, positions: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...

    def action_embeddings_at(self, positions: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...

    def set_action_embeddings(self, positions: Sequence[int] | np.ndarray, embeddings: Any) -> None: ...

    # ---- followers and lifetime
    def rows_on_disk(self) -> int: ...

    def refresh(self) -> int: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...
