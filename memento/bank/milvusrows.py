"""The row store of a Milvus bank (:mod:`memento.bank.milvus`, whose docstring describes the collection's fields
and its transactions): :class:`MilvusRows`, the cases' rows by position in one collection, their tombstones, the
committed-rows watermark and the recovery of a write that did not commit; the collection's field names, and
:func:`filter_expression`, a search's or count's :class:`memento.bank.parts.Filter` as a Milvus filter.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from memento.bank.milvusconn import MilvusOptions, disconnect, milvus_message
from memento.bank.parts import Filter, NewRow, case_meta_json
from memento.bank.where import milvus_attrs
from memento.errors import BankError, DataFormatError, MementoError
from memento.io import parse_json
from memento.types import SCOPE_FIELDS, Case, shown

__all__ = ["DEFAULT_COLLECTION", "MilvusRows", "filter_expression"]

logger = logging.getLogger("memento.bank.milvus")  # a Milvus bank's log lines, wherever its code lives

DEFAULT_COLLECTION = "memento_cases"
USAGE_SUFFIX = "__usage"  # the side collections of the case features
EVIDENCE_SUFFIX = "__evidence"
ACTIONS_SUFFIX = "__actions"
HISTORY_SUFFIX = "__history"  # the cases' history log (memento.bank.history)
MAX_TEXT_BYTES = 65_535  # bytes in a Milvus VARCHAR
MAX_ID_BYTES = 512
MAX_TOPK = 16_384  # Milvus' limit on a search's top-k and on nq
READ_CHUNK = 1_000  # primary keys per read
PROPERTY_PREFIX = "memento."
_FIELDS = ("pos", "id", "hash", "state", "action", "reward", "env", "kind", "meta", "created", "deleted",
           "deleted_at", "replaced_by", "vector")
_CASE_FIELDS = ["pos", "id", "state", "action", "reward", "env", "kind", "meta", "created"]
SCOPE_COLUMNS = [f"scope_{name}" for name in SCOPE_FIELDS]
ATTRS_FIELD = "attrs"  # the meta as a JSON field (what metadata filters read)
_VERSION_FIELDS = ["version", "updated"]  # collections made before updates in place have neither
HISTORY_FIELDS = ("seq", "pos", "event", "time", "version", "fields", "link", "old_action", "old_reward", "old_meta",
                   "new_action", "new_reward", "new_meta")



def _quote(value: str) -> str:
    """A string literal for a Milvus filter expression."""
    return json.dumps(value, ensure_ascii=False)


def utf8_len(text: str) -> int:
    return len(text.encode("utf-8"))


@dataclasses.dataclass
class _Transaction:
    """One write in progress: the committed count it started from, and the tombstones (``(positions,
    replaced_by, deleted_at)``) and side-collection rows to forget that it applies after its commit point."""

    start: int
    tombstones: list[tuple[list[int], str, float]] = dataclasses.field(default_factory=list)
    forget: list[int] = dataclasses.field(default_factory=list)


class MilvusRows:
    """The row store of a Milvus bank: the bank's collection (one row per case, see :mod:`memento.bank.milvus`).

    A write is all-or-nothing through the collection property ``memento.committed`` (see "Transactions" in
    :mod:`memento.bank.milvus`): rows inserted by a :meth:`transaction` are invisible (to :meth:`count`, reads and
    searches) until it moves that watermark past them. The ids, content hashes and tombstone flags of all rows
    are mirrored in memory (loaded on first need)."""

    def __init__(self, client: Any, *, uri: str, collection: str, name: str, lite_dir: Path | None,
                 options: MilvusOptions):
        self.client = client
        self.uri = uri
        self.collection = collection
        self.name = name
        self.lite_dir = lite_dir
        self.options = options
        self.read_only = False  # set by MilvusBank: a read-only open refuses to repair index files
        self._flush_rows = options.flush_rows if options.flush_rows is not None else (256 if lite_dir else 0)
        self.unflushed = 0
        self.twice = 0  # rows Milvus Lite holds twice after a crash (see count): searches fetch more
        self._tx: _Transaction | None = None
        self._pending: dict[str, Any] | None = None  # a committed write's tombstones not yet applied (count)
        self._watermark: int | None = None  # memento.committed as last read or written (None: an older bank)
        described = self.call("open", self.client.describe_collection, self.collection)
        names = {str(field.get("name")) for field in described.get("fields") or []}
        self.scoped = ATTRS_FIELD in names and set(SCOPE_COLUMNS) <= names  # created with scopes (memento >= 0.33)
        self.versioned = set(_VERSION_FIELDS) <= names  # created with case versions
        self.rows = self.count()
        self.committed = self.rows  # what readers and searches see (rows past it: a write in progress)
        self._forget_hook: Any = None  # MilvusFeatures' removal of side rows (set by it)
        self._ids: list[str] = []
        self._pos_of: dict[str, int] = {}
        self._hashes: list[str] = []
        self._live_hash: dict[str, str] = {}  # content hash -> smallest live id
        self._deleted: set[int] = set()
        self._deleted_N: np.ndarray | None = None  # sorted, cached
        self._loaded = self.rows == 0

    def call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except MementoError:
            raise
        except Exception as error:
            raise BankError(f"{self.name}: {what} failed: {milvus_message(error)}") from None

    def _properties(self) -> dict[str, str]:
        described = self.call("count", self.client.describe_collection, self.collection)
        return {str(k): str(v) for k, v in (described.get("properties") or {}).items()}

    def _set_properties(self, what: str, values: dict[str, str]) -> None:
        self.call(what, self.client.alter_collection_properties, self.collection, properties=values)

    def count(self) -> int:
        """The number of committed positions (rows are dense, ``0..n-1``): the watermark ``memento.committed``.

        Rows at or past it were inserted by a write that did not commit (in progress in another process, or
        killed): they are not counted, and :meth:`recover` removes them. Rows below it must all be there; when
        the last one is missing (Milvus Lite lost the tail of its unsynced log in a machine crash), the bank is
        the dense prefix that is left (one warning line). A bank written before the watermark existed has no
        such property: then :meth:`_dense_count`."""
        props = self._properties()
        committed = props.get(f"{PROPERTY_PREFIX}committed")
        pending = props.get(f"{PROPERTY_PREFIX}pending")
        self._pending = json.loads(pending) if pending else None
        if committed is None:
            self._watermark = None
            return self._dense_count()
        n = int(committed)
        self._watermark = n
        rows = self.call("count", self.client.query, self.collection, filter="", output_fields=["count(*)"])
        upper = int(rows[0]["count(*)"]) if rows else 0
        if n and not self._exists(n - 1):
            lo, hi = 0, n - 1  # exists(lo - 1) or lo == 0; not exists(hi)
            while lo < hi:
                mid = (lo + hi) // 2
                lo, hi = (mid + 1, hi) if self._exists(mid) else (lo, mid)
            logger.warning("%s: %d committed case(s) are missing (a machine crash lost them); %d cases", self.name,
                           n - lo, lo)
            n = lo
        self.twice = max(0, upper - n)  # held twice, or uncommitted: searches fetch this many more
        return n

    def _dense_count(self) -> int:
        """The number of positions of a bank without a watermark (rows are dense, ``0..n-1``).

        Not ``count(*)`` alone: Milvus Lite 3.2 can hold two copies of a row after a kill during a flush (its
        write-ahead log replayed over the segment the flush had written), and counts both. So ``count(*)``
        bounds the search for the first missing position, found by primary-key reads (log2 n of them)."""
        rows = self.call("count", self.client.query, self.collection, filter="", output_fields=["count(*)"])
        upper = int(rows[0]["count(*)"]) if rows else 0
        if upper and not self._exists(upper - 1):
            lo, hi = 0, upper - 1  # exists(lo - 1) or lo == 0; not exists(hi)
            while lo < hi:
                mid = (lo + hi) // 2
                lo, hi = (mid + 1, hi) if self._exists(mid) else (lo, mid)
            logger.warning("%s: %d row(s) counted twice (a crash during a flush); %d cases", self.name,
                           upper - lo, lo)
            self.twice = upper - lo
            upper = lo
        if upper or rows:  # positions are dense: no row at or past the count
            beyond = self.call("count", self.client.query, self.collection, filter=f"pos >= {upper}",
                               output_fields=["pos"], limit=1)
            if beyond:
                raise BankError(f"{self.name}: damaged bank: {upper} rows but a row at position {beyond[0]['pos']}")
        return upper

    def _exists(self, position: int) -> bool:
        return bool(self.call("count", self.client.get, self.collection, ids=[int(position)], output_fields=["pos"]))

    def read(self, positions: Sequence[int], fields: Sequence[str]) -> dict[int, dict[str, Any]]:
        """Rows by primary key (position)."""
        out: dict[int, dict[str, Any]] = {}
        unique = sorted(set(int(p) for p in positions))
        for start in range(0, len(unique), READ_CHUNK):
            chunk = unique[start:start + READ_CHUNK]
            for row in self.call("read", self.client.get, self.collection, ids=chunk, output_fields=list(fields)):
                out[int(row["pos"])] = row
        return out

    def _scan(self, fields: Sequence[str], batch: int = 4096) -> Iterator[dict[str, Any]]:
        """All rows in position order."""
        for lo in range(0, self.rows, batch):
            hi = min(self.rows, lo + batch)
            found = self.call("scan", self.client.query, self.collection, filter=f"pos >= {lo} and pos < {hi}",
                              output_fields=list(fields), limit=min(MAX_TOPK, 4 * (hi - lo)))
            rows = sorted({int(r["pos"]): r for r in found}.values(), key=lambda r: int(r["pos"]))  # see count
            if len(rows) != hi - lo or (rows and int(rows[0]["pos"]) != lo):
                raise BankError(f"{self.name}: damaged bank: positions {lo}..{hi - 1} are not all there")
            yield from rows

    def _ensure_loaded(self) -> None:
        if self._loaded:
            return
        self._ids, self._hashes, self._pos_of, self._live_hash, self._deleted = [], [], {}, {}, set()
        self._deleted_N = None
        self._mirror(self._scan(["pos", "id", "hash", "deleted"]))
        self._loaded = True

    def _mirror(self, rows: Any) -> None:
        for row in rows:
            pos, case_id, digest = int(row["pos"]), str(row["id"]), str(row["hash"])
            if pos != len(self._ids):
                raise BankError(f"{self.name}: case positions are not dense (found {pos} at row {len(self._ids)})")
            self._ids.append(case_id)
            self._hashes.append(digest)
            self._pos_of[case_id] = pos
            if row["deleted"]:
                self._deleted.add(pos)
            elif digest not in self._live_hash or case_id < self._live_hash[digest]:
                self._live_hash[digest] = case_id

    def took_in(self, top: int) -> None:
        """Rows up to ``top`` were added by another process; the mirror is re-read on next need (tombstones
        may have changed too)."""
        self.rows = self.committed = top
        self._loaded = False

    def recover(self) -> int:
        """Before the first write of a process: finish what a killed write left. Rows at or past the watermark
        (a write that never committed) are deleted, with their side-collection rows; the tombstones of a write
        that committed but did not apply them all are applied. Returns how many rows were rolled back (one
        warning line when any)."""
        if self._watermark is None:
            return 0
        n = self.rows
        rows = self.call("count", self.client.query, self.collection, filter="", output_fields=["count(*)"])
        upper = int(rows[0]["count(*)"]) if rows else 0
        beyond = self.call("count", self.client.query, self.collection, filter=f"pos >= {n}",
                           output_fields=["pos"], limit=1) if upper > n else []
        rolled = 0
        if beyond:
            found = self.call("count", self.client.query, self.collection, filter=f"pos >= {n}",
                              output_fields=["count(*)"])
            rolled = int(found[0]["count(*)"]) if found else 0
            self.call("recover", self.client.delete, self.collection, filter=f"pos >= {n}")
            self.unflushed += 1
            logger.warning("%s: rolled back %d row(s) of a write that did not commit (killed?); %d cases",
                           self.name, rolled, n)
        if self._forget_hook is not None:
            self._forget_hook(None, n)  # side rows of uncommitted positions
        if self._watermark != n:
            self._set_properties("recover", {f"{PROPERTY_PREFIX}committed": str(n)})
            self._watermark = n
        if self._pending:
            self._apply(self._pending)
            self._loaded = False
            logger.warning("%s: completed the deletions of a write killed after its commit", self.name)
        if beyond:
            rows = self.call("count", self.client.query, self.collection, filter="", output_fields=["count(*)"])
            self.twice = max(0, (int(rows[0]["count(*)"]) if rows else 0) - n)
        return rolled

    @contextmanager
    def transaction(self, what: str) -> Iterator[None]:
        """One all-or-nothing write: rows inserted in it stay past the watermark, and tombstones and side-row
        removals wait, until it ends; then one property update (the commit point) moves the watermark and
        records those tombstones, which are applied after it (a crash before they are all applied: the next
        writer applies them, :meth:`recover`). On an error, the rows it inserted are deleted (or left past the
        watermark for the next writer to remove, when Milvus is gone) and the error propagates."""
        if self._tx is not None:
            yield
            return
        self._tx = _Transaction(start=self.rows)
        try:
            yield
        except BaseException:
            tx, self._tx = self._tx, None
            self._abort(tx)
            raise
        tx, self._tx = self._tx, None
        self._commit(tx)

    def _abort(self, tx: _Transaction) -> None:
        if self.rows > tx.start:
            try:
                self.call("rollback", self.client.delete, self.collection, filter=f"pos >= {tx.start}")
                self.unflushed += 1
            except MementoError as error:  # invisible past the watermark; the next writer removes them
                logger.warning("%s: %s", self.name, error)
        if self.rows != self.committed or tx.tombstones or tx.forget:
            self._loaded = False  # the mirror followed the inserts and tombstones: read it again on need
        self.rows = self.committed

    def _commit(self, tx: _Transaction) -> None:
        pending = {"tombstones": tx.tombstones, "forget": sorted(set(tx.forget))} \
            if tx.tombstones or tx.forget else None
        if self.rows == self.committed and self._watermark is not None and pending is None:
            return  # nothing was written (an add of stored cases, a reward update)
        values = {f"{PROPERTY_PREFIX}committed": str(self.rows)}
        if pending is not None:
            values[f"{PROPERTY_PREFIX}pending"] = json.dumps(pending, separators=(",", ":"))
        self._set_properties("commit", values)  # the commit point
        self._watermark = self.committed = self.rows
        if pending is not None:
            self._apply(pending)

    def _apply(self, pending: dict[str, Any]) -> None:
        """Apply a committed write's tombstones and side-row removals (again, after a crash: idempotent), then
        drop them from the properties."""
        for positions, replaced_by, deleted_at in pending.get("tombstones", []):
            rows = self.read([p for p in positions if p < self.rows], self.all_fields())
            if rows:
                self._upsert("delete", rows, deleted=True, deleted_at=float(deleted_at), replaced_by=replaced_by)
        if pending.get("forget") and self._forget_hook is not None:
            self._forget_hook(pending["forget"], None)
        self.call("commit", self.client.drop_collection_properties, self.collection,
                  property_keys=[f"{PROPERTY_PREFIX}pending"])
        self._pending = None

    def find(self, ids: Sequence[str]) -> dict[str, int]:
        self._ensure_loaded()
        return {i: self._pos_of[i] for i in ids if i in self._pos_of}

    def _smallest_live(self, digest: str, dead: int | None) -> str | None:
        stored = self._live_hash.get(digest)
        if stored is None or self._pos_of[stored] != dead:
            return stored
        others = [self._ids[p] for p, h in enumerate(self._hashes) if h == digest and p != dead
                  and p not in self._deleted]
        return min(others) if others else None

    def live_by_hash(self, hashes: Sequence[str], dead: int | None) -> dict[str, str]:
        self._ensure_loaded()
        found = {digest: self._smallest_live(digest, dead) for digest in hashes}
        return {digest: case_id for digest, case_id in found.items() if case_id is not None}

    def insert(self, rows: Sequence[NewRow]) -> None:
        """Insert rows at the next positions, batch by batch; the mirror and count follow each batch."""
        self._ensure_loaded()
        data = [{"pos": r.pos, "id": r.id, "hash": r.hash, "state": r.case.state, "action": r.case.action,
                 "reward": float(r.case.reward), "env": r.case.env, "kind": r.case.kind, "meta": r.meta,
                 "created": r.created, "deleted": False, "deleted_at": 0.0, "replaced_by": "", "vector": r.vector_D}
                for r in rows]
        if self.scoped:
            for row, r in zip(data, rows):
                row[ATTRS_FIELD] = milvus_attrs(r.case.meta)
                row.update(zip(SCOPE_COLUMNS, r.case.scope))
        elif any(value is not None for r in rows for value in r.case.scope):
            raise BankError(f"{self.name}: this collection was created before cases had scopes (user, agent, "
                            "session); export it (bank export) and import it into a new collection to store scoped "
                            "cases")
        if self.versioned:
            for row, r in zip(data, rows):
                row["version"] = int(r.case.version)
                row["updated"] = float(r.created if r.case.updated is None else r.case.updated)
        step = self.options.insert_batch
        for start in range(0, len(data), step):
            batch = data[start:start + step]
            self.call("insert", self.client.insert, self.collection, batch)
            self.rows += len(batch)
            self.unflushed += len(batch)
            self._mirror(batch)
        if self._flush_rows and self.unflushed >= self._flush_rows:
            self.seal()

    def seal(self) -> None:
        """Seal the rows written since the last flush into an indexed segment."""
        if self.unflushed:
            self.call("flush", self.client.flush, self.collection)
            self.unflushed = 0

    def _upsert(self, what: str, rows: dict[int, dict[str, Any]], **changes: Any) -> None:
        """Rewrite whole rows with ``changes`` (any Milvus version takes a whole row), batch by batch."""
        batch = []
        for row in rows.values():
            row.update(changes)
            row["vector"] = np.asarray(row["vector"], dtype=np.float32)
            batch.append(row)
        for start in range(0, len(batch), self.options.insert_batch):
            self.call(what, self.client.upsert, self.collection, batch[start:start + self.options.insert_batch])
        self.unflushed += len(batch)

    def set_reward(self, position: int, reward: float) -> None:
        self._upsert("upsert", self.read([position], self.all_fields()), reward=reward)

    def update(self, position: int, case: Case, digest: str) -> None:
        """Rewrite the row at ``position`` with ``case``'s action, reward and meta, its content hash and (in a
        collection made with them) its version and update time; the mirror of hashes follows."""
        changes: dict[str, Any] = {"action": case.action, "reward": float(case.reward), "meta": case_meta_json(case),
                                   "hash": digest}
        if self.scoped:
            changes[ATTRS_FIELD] = milvus_attrs(case.meta)
        if self.versioned:
            changes.update(version=int(case.version), updated=float(case.updated or 0.0))
        else:
            logger.warning("%s: this collection was created before case versions: case %r was updated, but its "
                           "version reads 1 (its history records the update)", self.name, case.id)
        self._upsert("update", self.read([position], self.all_fields()), **changes)
        self._ensure_loaded()
        old = self._hashes[position]
        if old != digest:
            self._hashes[position] = digest
            if self._live_hash.get(old) == case.id:
                del self._live_hash[old]
                others = [self._ids[p] for p, h in enumerate(self._hashes) if h == old and p not in self._deleted]
                if others:
                    self._live_hash[old] = min(others)
            if digest not in self._live_hash or str(case.id) < self._live_hash[digest]:
                self._live_hash[digest] = str(case.id)

    def live_positions(self, where: Filter, count: int) -> np.ndarray:
        """The live positions below ``count`` that ``where`` keeps, sorted (one filtered scan)."""
        expression = f"{filter_expression(self, where)} and pos < {int(count)}"
        found: set[int] = set()
        batches = self.call("read", self.client.query_iterator, self.collection, batch_size=4096, filter=expression,
                            output_fields=["pos"])
        try:
            while batch := self.call("read", batches.next):
                found.update(int(r["pos"]) for r in batch)
        finally:
            batches.close()
        return np.asarray(sorted(found), dtype=np.int64)

    def tombstones_at(self, positions: Sequence[int]) -> dict[int, tuple[float, str | None]]:
        """``{pos: (time, replaced_by)}`` of those ``positions`` that are tombstoned."""
        self._ensure_loaded()
        dead = [int(p) for p in positions if int(p) in self._deleted]
        rows = self.read(dead, ["pos", "deleted_at", "replaced_by"]) if dead else {}
        return {p: (float(row["deleted_at"]), row.get("replaced_by") or None) for p, row in rows.items()}

    def tombstone(self, positions: Sequence[int], ids: Sequence[str], replaced_by: str | None) -> None:
        """Flag rows deleted: in a transaction, after its commit point (the mirror follows at once)."""
        if self._tx is not None:
            self._tx.tombstones.append(([int(p) for p in positions], replaced_by or "", time.time()))
        else:
            self._upsert("delete", self.read(positions, self.all_fields()), deleted=True, deleted_at=time.time(),
                         replaced_by=replaced_by or "")
        self._forget(positions)

    def defer_forget(self, positions: Sequence[int]) -> bool:
        """In a transaction: remember to remove the side rows of ``positions`` after its commit point (True)."""
        if self._tx is None:
            return False
        self._tx.forget.extend(int(p) for p in positions)
        return True

    def _forget(self, positions: Sequence[int]) -> None:
        """The mirror after tombstoning ``positions`` (one pass over the hashes when a live hash lost its id)."""
        orphaned = set()
        for pos in positions:
            self._deleted.add(int(pos))
            digest, case_id = self._hashes[pos], self._ids[pos]
            if self._live_hash.get(digest) == case_id:
                del self._live_hash[digest]
                orphaned.add(digest)
        self._deleted_N = None
        if orphaned:  # another live copy of that content (a bank filled with allow_duplicates) takes over
            for pos, digest in enumerate(self._hashes):
                if digest in orphaned and pos not in self._deleted:
                    case_id = self._ids[pos]
                    if digest not in self._live_hash or case_id < self._live_hash[digest]:
                        self._live_hash[digest] = case_id

    def deleted_positions(self) -> np.ndarray:
        self._ensure_loaded()
        if self._deleted_N is None:
            self._deleted_N = np.asarray(sorted(self._deleted), dtype=np.int64)
        return self._deleted_N

    def deleted_ids(self) -> list[str]:
        self._ensure_loaded()
        return [self._ids[p] for p in sorted(self._deleted)]

    def ids_at(self, positions: Sequence[int]) -> list[str]:
        self._ensure_loaded()
        return [self._ids[p] for p in positions]

    def all_fields(self) -> list[str]:
        """Every field of a row (what an upsert rewrites)."""
        fields = [*_FIELDS, ATTRS_FIELD, *SCOPE_COLUMNS] if self.scoped else list(_FIELDS)
        return fields + _VERSION_FIELDS if self.versioned else fields

    def case_fields(self) -> list[str]:
        fields = _CASE_FIELDS + SCOPE_COLUMNS if self.scoped else _CASE_FIELDS
        return fields + _VERSION_FIELDS if self.versioned else fields

    def _case(self, row: dict[str, Any]) -> Case:
        try:
            meta = parse_json(row["meta"], where="meta", error=DataFormatError)
            created = float(row["created"])
            updated = row.get("updated")
            return Case(id=row["id"], state=row["state"], action=row["action"], reward=float(row["reward"]),
                        env=row.get("env"), kind=row["kind"], meta=meta, created=created,
                        version=int(row.get("version") or 1), updated=created if updated is None else float(updated),
                        **{name: row.get(field) for name, field in zip(SCOPE_FIELDS, SCOPE_COLUMNS)})
        except DataFormatError as error:  # a row written outside memento, or before a field's range was decided
            raise BankError(f"{self.name}: case {shown(row.get('id'))} is out of range: {error}") from None

    def cases_at(self, positions: Sequence[int]) -> list[Case]:
        rows = self.read(positions, self.case_fields())
        return [self._case(rows[p]) for p in positions]

    def rewards_at(self, positions: Sequence[int]) -> np.ndarray:
        rows = self.read(positions, ["pos", "reward"])
        return np.array([rows[p]["reward"] for p in positions], dtype=np.float64)

    def vectors_at(self, positions_N: np.ndarray, dim: int) -> np.ndarray:
        rows = self.read(positions_N.tolist(), ["pos", "vector"])
        out_ND = np.zeros((positions_N.size, dim), dtype=np.float32)
        for i, p in enumerate(positions_N.tolist()):
            out_ND[i] = np.asarray(rows[p]["vector"], dtype=np.float32)
        return out_ND

    def scan(self, batch_size: int) -> Iterator[Case]:
        for row in self._scan(self.case_fields() + ["deleted"], batch=batch_size):
            if not row["deleted"]:
                yield self._case(row)

    def truncate(self, n: int) -> None:
        """Lower the watermark to ``n`` first (the commit point: a crash after it leaves ``n`` cases, the rest
        removed by the next writer), then delete the rows past it."""
        self._set_properties("truncate", {f"{PROPERTY_PREFIX}committed": str(n)})
        self._watermark = self.committed = n
        if self._tx is not None:
            self._tx.start = min(self._tx.start, n)
        self.call("truncate", self.client.delete, self.collection, filter=f"pos >= {n}")
        self.unflushed += 1
        self.rows = n
        self._loaded = False
        self._ensure_loaded()

    def summary(self) -> dict[str, Any]:
        total, positives, n = 0.0, 0, 0
        by_kind: dict[str, int] = {}
        by_env: dict[str | None, int] = {}
        for row in self._scan(["pos", "reward", "kind", "env"]):
            n += 1
            total += float(row["reward"])
            positives += float(row["reward"]) > 0
            by_kind[row["kind"]] = by_kind.get(row["kind"], 0) + 1
            by_env[row.get("env")] = by_env.get(row.get("env"), 0) + 1
        files: dict[str, int] = {}
        if self.lite_dir is not None and self.lite_dir.exists():
            files[self.lite_dir.name] = sum(p.stat().st_size for p in self.lite_dir.rglob("*") if p.is_file())
        return {"backend": "milvus", "uri": self.uri, "collection": self.collection, "cases": n,
                "reward_mean": total / n if n else None, "reward_positive": positives,
                "by_kind": dict(sorted(by_kind.items())),
                "by_env": dict(sorted(by_env.items(), key=lambda kv: (kv[0] is not None, kv[0] or ""))),
                "files": files}

    def close(self) -> None:
        disconnect(self.client, self.lite_dir)


def filter_expression(rows: MilvusRows, where: Filter) -> str:
    """The Milvus filter expression of ``where`` over the live committed rows of a bank's collection."""
    parts = [f"pos < {rows.committed}", "deleted == false"]  # rows past it: a write in progress
    if where.env is not None:
        parts.append(f"env == {_quote(where.env)}")
    if where.kind is not None:
        parts.append(f"kind == {_quote(where.kind)}")
    if where.positive:
        parts.append("reward > 0")
    if where.scope is not None:
        if rows.scoped:
            parts.append(where.scope.milvus())
        elif not where.scope.include_global:
            return "pos < 0"  # no case of a collection made before scopes has one: nothing matches
    if where.meta is not None:
        if not rows.scoped:
            raise BankError(f"{rows.name}: this collection was created before metadata filters; export "
                            "it (bank export) and import it into a new collection to filter on metadata")
        parts.append(where.meta.milvus(ATTRS_FIELD, versioned=rows.versioned))
    return " and ".join(parts)
