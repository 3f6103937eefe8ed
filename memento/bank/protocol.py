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

from memento.bank.history import CaseEvent
from memento.bank.parts import Candidates
from memento.bank.where import Scope, Where
from memento.config import BankConfig
from memento.types import Case

__all__ = ["Bank"]


@runtime_checkable
class Bank(Protocol):
    """A case bank: cases, their unit-norm state vectors, nearest-neighbour search over them.

    This is the one description of the bank's operations: :class:`memento.bank.front.BankFront` implements every
    member for both back ends and does not restate it (``tests/unit/test_bank_conformance.py`` checks that the
    front and each back end have every member, with the same parameters)."""

    uid: str  # the bank's identity, kept in its metadata
    config: BankConfig  # dim, index, encoder; ``set_search_params`` replaces its search fields
    read_only: bool  # opened read-only: every write raises ``BankError``
    audit: bool  # a deleted case's history keeps its values (off: only kinds, times and field names)
    updates_made: int  # updates in place by this process (update, add with new meta)

    @property
    def path(self) -> Path | str:
        """Where the bank lives: a directory, or the ``milvus:`` URI it was opened with."""
        ...

    @property
    def dim(self) -> int:
        """The width ``D`` of the stored vectors."""
        ...

    @property
    def num_deleted(self) -> int:
        """How many cases were deleted (tombstoned); ``len(bank) - num_deleted`` cases can be found."""
        ...

    def __len__(self) -> int:
        """Rows stored, deleted ones included (positions are ``0..len-1``)."""
        ...

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc: object) -> None: ...

    # ---- writes
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
        ...

    def check_ids(self, cases: Sequence[Case], *, allow_duplicates: bool = False) -> None:
        """Raise the ``DataFormatError`` that :meth:`add` would raise for these cases' ids (one used twice, or
        used by another stored case), before any work is spent on their embeddings; writes nothing."""
        ...

    def update_reward(self, case_id: str, reward: float) -> None:
        """Set the reward of a stored case: a number in [0, 1] (:func:`memento.types.check_reward`, as every entry
        point checks it); anything else raises ``DataFormatError`` and changes nothing. ``update(case_id,
        reward=reward)``: a change is an update in place (version, history)."""
        ...

    def update(self, case_id: str, *, action: str | None = None, reward: float | None = None,
               meta: dict[str, Any] | None = None, state: str | None = None) -> Case:
        """Change a live case in place (mem0's ``update``): its ``action``, ``reward`` and/or ``meta`` (replaced
        whole), keeping its id, vector, scope and usage; its ``version`` goes up by one, ``updated`` is now, and
        its history gets an ``update`` event with the old and new values. Returns the case as stored now (as it
        was, with no version bump, when nothing given differs). ``state`` may only repeat the stored state: a new
        state would need a new vector, so :meth:`replace` the case instead. An unknown or deleted id raises
        ``UnknownCaseError``; a bad value ``DataFormatError``, and nothing changes."""
        ...

    def delete(self, ids: str | Sequence[str]) -> int:
        """Forget the cases ``ids`` (stored before this returns): they are never found, listed or chosen again;
        returns how many were deleted. An unknown or already deleted id raises ``UnknownCaseError`` and nothing
        is deleted. Rows stay (a tombstone; their usage rows and action vector go)."""
        ...

    def delete_all(self, *, env: str | None = None, scope: Scope | Mapping[str, Any] | None = None,
                   filter: Where | Mapping[str, Any] | None = None, all: bool = False) -> int:
        """Delete every live case of ``scope`` whose meta match ``filter`` (and of ``env`` when given), as
        :meth:`delete` does (one transaction); returns how many. A scope or a filter is required, so that no one
        wipes every tenant's cases by accident: ``all=True`` deletes every (matching) case without one."""
        ...

    def delete_where(self, *, env: str | None = None, scope: Scope | Mapping[str, Any] | None = None,
                     filter: Where | Mapping[str, Any] | None = None, all: bool = False) -> list[str]:
        """:meth:`delete_all`, returning the ids it deleted (in position order)."""
        ...

    def replace(self, case_id: str, case: Case, embedding: Any) -> str:
        """Supersede the case ``case_id`` by ``case`` (its unit-norm state vector ``embedding``, ``[D]``): the old
        case is deleted (:meth:`delete`) and the new one added; returns the new case's id.

        Ids are never reused, so the new case gets a new id (``case.id``, or one derived from its content; the
        tombstone records which id replaced the old one). If its content is already stored as another live case,
        that case's id is returned and nothing is added. Both back ends do both in one transaction (a Milvus
        bank through its watermark: a crash leaves the old case, or the new one with the old one deleted)."""
        ...

    def truncate(self, n: int) -> int:
        """Remove every case at position ``>= n`` (the newest ones), with their usage rows, action vectors and
        tombstones; returns how many were removed. Used to roll a bank back to a checkpoint."""
        ...

    def import_jsonl(self, path: str | Path, encoder: Any, *, format: str = "case",
                     allow_duplicates: bool = False, show_progress_bar: bool | None = None) -> list[str]:
        """Read a case file (any :data:`memento.formats.CaseFormat`), encode states, add all.

        The whole file is validated before anything is written.
        """
        ...

    # ---- reads
    def get(self, ids: Any, *, include_deleted: bool = False) -> Any:
        """``get(id) -> Case``, ``get([ids]) -> list[Case]``: the stored case(s), in the order asked; an unknown or
        deleted (or replaced) id raises ``UnknownCaseError``. ``include_deleted``: read deleted cases' rows too (for
        the internal readers of logged decisions: the inspector, off-policy evaluation, a bank copy; never an answer
        to a user's read)."""
        ...

    def history(self, case_id: str) -> list[CaseEvent]:
        """The events of a stored case, oldest first (:mod:`memento.bank.history`): its ``add``, its ``update``
        events with the fields changed and their old and new values, and its ``replace`` or ``delete``. A deleted
        or replaced case's history keeps only the events' kinds, times, versions and field names, unless the bank
        was opened with ``audit=True``. An unknown id raises ``UnknownCaseError``."""
        ...

    def count(self, *, env: str | None = None, kind: str | None = None, scope: Scope | Mapping[str, Any] | None = None,
              filter: Where | Mapping[str, Any] | None = None) -> int:
        """How many live cases there are of ``env``/``kind``, in ``scope``, whose meta match ``filter``
        (:mod:`memento.bank.where`); all live cases when none is given."""
        ...

    def ids_where(self, *, env: str | None = None, kind: str | None = None,
                  scope: Scope | Mapping[str, Any] | None = None,
                  filter: Where | Mapping[str, Any] | None = None) -> list[str]:
        """The ids of the live cases :meth:`count` counts, in position order."""
        ...

    def rewards(self, ids: Sequence[str]) -> np.ndarray:
        """The stored rewards ``[N]`` (float64) of the given case ids, in the order asked."""
        ...

    def embeddings(self, ids: Sequence[str]) -> np.ndarray:
        """Stored unit vectors ``[N, D]`` of the given case ids."""
        ...

    def embeddings_at(self, positions: Sequence[int] | np.ndarray) -> np.ndarray:
        """Stored unit vectors ``[N, D]`` at bank positions."""
        ...

    def ids_at(self, positions: Sequence[int] | np.ndarray) -> list[str]:
        """Case ids at bank positions."""
        ...

    def positions_of(self, ids: Sequence[str]) -> np.ndarray:
        """Bank positions (int64) of the case ids, in the order asked; an unknown id raises ``UnknownCaseError``."""
        ...

    def is_deleted(self, ids: Sequence[str]) -> list[bool]:
        """Whether each stored case id was deleted; an id never stored raises ``UnknownCaseError``."""
        ...

    def deleted_ids(self) -> list[str]:
        """The ids of the deleted cases, in position order."""
        ...

    def iter_cases(self, batch_size: int = 1000) -> Iterator[Case]:
        """All live cases in insertion order, read in batches."""
        ...

    def export_jsonl(self, path: str | Path) -> int:
        """Write every live case as Case JSONL (atomically); returns the number written."""
        ...

    def stats(self) -> dict[str, Any]:
        """Counts, reward summary, index state and storage sizes (a backend's own keys after ``path``)."""
        ...

    # ---- search
    def search(self, query: Any, k: int, *, env: str | None = None, kind: str | None = None,
               positive: bool = False, scope: Scope | Mapping[str, Any] | None = None,
               filter: Where | Mapping[str, Any] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Nearest cases to ``query_D`` or ``query_BD`` by cosine (queries are normalised).

        For one query ``[D]``: ``(scores_K, ids_K)``, trimmed to the cases found. For a batch ``[B, D]``:
        ``(scores_BK, ids_BK)``, padded with ``-inf`` and ``None``. ``ids`` is a numpy object array of case-id
        strings. ``env``/``kind`` restrict the search; ``positive`` keeps the cases whose stored reward is > 0;
        ``scope``/``filter`` keep the cases of a scope whose metadata match (:mod:`memento.bank.where`).
        """
        ...

    def search_positions(self, query: Any, k: int, *, env: str | None = None, kind: str | None = None,
                         positive: bool = False, scope: Scope | Mapping[str, Any] | None = None,
                         filter: Where | Mapping[str, Any] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Top-k by inner product: ``(scores_BK, positions_BK)``, -inf / -1 where fewer than k match.
        ``positive``: only cases whose stored reward is > 0; ``scope``/``filter``: see :mod:`memento.bank.where`."""
        ...

    def candidates(self, query_D: Any, c: int, *, env: str | None = None, kind: str | None = None,
                   positive: bool = False, scope: Scope | Mapping[str, Any] | None = None,
                   filter: Where | Mapping[str, Any] | None = None) -> Candidates:
        """The top-``c`` cases for one state with their stored vectors (the policy's candidate set);
        ``positive``: among the cases whose stored reward is > 0 only (the top-C of those, not a filtered top-C);
        ``scope``/``filter``: among the cases of a scope whose metadata match, likewise."""
        ...

    def set_search_params(self, *, ef_search: int | None = None, nprobe: int | None = None,
                          refine: int | None = None) -> None:
        """Change the HNSW ``ef_search`` / IVF ``nprobe`` / exact re-ranking ``refine`` used by later searches
        (not saved)."""
        ...

    # ---- usage statistics and action vectors (the Q-network's case features)
    def record_usage(self, step: int, ids: Sequence[str], reward: float) -> None:
        """Log that the cases ``ids`` were shown at ``step`` and the decision earned ``reward`` (in [0, 1];
        stored)."""
        ...

    def usage_at(self, positions: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(shown_C, reward_sum_C)``: how often the cases at ``positions`` were shown and their summed reward."""
        ...

    def truncate_usage(self, step: int) -> int:
        """Forget every usage and evidence row logged at ``step`` or later (a resume to a checkpoint at ``step``);
        returns how many were removed."""
        ...

    def record_evidence(self, step: int, ids: Sequence[str], weight: Any, value: Any) -> None:
        """Log what the planner's labels at ``step`` said of the cases ``ids`` (the soft-Q agent's per-case memory,
        :mod:`memento.learn.evidence`): per case a finite ``weight >= 0`` (how much look-alike rivalry the label
        had) and a finite ``value`` (its weighted label advantage over them)."""
        ...

    def evidence_at(self, positions: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(count_C, weight_C, value_C)``: how often the cases at ``positions`` were labelled, and the sums of
        their evidence weights and values (:meth:`record_evidence`)."""
        ...

    def action_embeddings_at(self, positions: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(emb_CD, have_C)``: the stored action vectors at ``positions`` (zeros where ``have_C`` is False)."""
        ...

    def set_action_embeddings(self, positions: Sequence[int] | np.ndarray, embeddings: Any) -> None:
        """Store the action vectors of the cases at ``positions`` (``(C, D)`` float32)."""
        ...

    # ---- followers and lifetime
    def rows_on_disk(self) -> int:
        """How many rows the store holds now (another process may have added some since open)."""
        ...

    def refresh(self) -> int:
        """Take in the cases another process stored since this bank was opened (or last refreshed); returns how
        many. Rows are never removed, so positions stay dense; the deletions another process made are seen by
        the next search."""
        ...

    def flush(self) -> None:
        """Make what was written durable in the backend's own form (read-only: nothing)."""
        ...

    def close(self) -> None:
        """Flush and close. Safe to call twice."""
        ...
