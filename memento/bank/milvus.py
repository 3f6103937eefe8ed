"""A case bank in one Milvus collection (``pymilvus``): Milvus Lite in a local file, or a Milvus server.

Named ``milvus:URI[#collection]`` wherever a bank is accepted (:mod:`memento.bank.uri`); it implements
:class:`memento.bank.protocol.Bank` (that module's table says which operations, and what a crash loses).

One collection per bank, one row per case::

    pos      INT64 primary key   the case's position (dense, 0..n-1: insertion order, as in a directory bank)
    id       VARCHAR             the case id (the same ids a directory bank assigns)
    hash     VARCHAR             memento.types.content_hash of (state, action, env, kind): de-duplication
    state, action, kind, meta    VARCHAR (meta is JSON text, keys sorted); env VARCHAR, nullable
    reward, created              DOUBLE
    deleted  BOOL                a tombstone (delete/replace); deleted_at DOUBLE, replaced_by VARCHAR
    version  INT64, updated DOUBLE   changes in place (``update``) and the time of the last one (collections
                                 made before them read version 1, updated = created)
    vector   FLOAT_VECTOR(dim)   the unit-norm state vector, inner-product metric

The case features (the Q-network's usage statistics and action vectors, :mod:`memento.learn.features`) live
in two side collections, created on first write: ``<collection>__usage`` (one row per time a case was shown:
``step``, ``pos``, ``reward``; an auto-id key, and a constant 2-d vector since Milvus wants one in every
collection), ``<collection>__actions`` (``pos`` primary key, the action's ``vector``) and ``<collection>__evidence``
(one row per time a case was labelled: ``step``, ``pos``, ``weight``, ``value``, as the usage log). ``delete`` and
``truncate`` remove a case's rows there too. The cases' history (:mod:`memento.bank.history`) is a fourth,
``<collection>__history`` (one row per stored event, an auto-id key; a delete erases its cases' values there unless
the bank was opened with ``audit=True``).

The bank's identity lives in the collection's properties: ``memento.format``, ``memento.format_version``,
``memento.uid`` and ``memento.config`` (the :class:`BankConfig` JSON: dim, index, encoder), written by the one
``create_collection`` call that makes the collection (a bank appears whole or not at all). Opening compares
the dimension and the encoder asked for with them.

**Transactions.** A write that spans rows (``add``/``import_jsonl``, ``delete``, ``replace``, ``truncate``) is
all-or-nothing through a watermark, the collection property ``memento.committed`` (the number of committed
positions; written by ``create_collection`` as 0). Rows are inserted past it; one property update after the last
insert batch -- the commit point -- moves it past them and records the write's tombstones and side-row removals
(``memento.pending``), which are written after it and then dropped. ``count()``, reads and searches (a
``pos < committed`` filter) see only rows below it. A writer's open (:meth:`MilvusRows.recover`) deletes the rows
at or past it and their side rows (a write that never committed: one warning line) and writes a committed
write's pending tombstones. ``truncate`` lowers the watermark first, then deletes. A write that fails deletes
what it inserted and raises. Cost: one property update (Milvus Lite rewrites and fsyncs the collection's schema
file, 4-13 ms) per write; the insert path is unchanged. A bank made before the watermark has no such property
(its count is the dense prefix) until its first write.

**Torn index files.** milvus-lite writes a sealed segment's index file in place (a kill leaves it torn, and the
collection then fails to load on every open). Loading a Milvus Lite collection (:func:`_load_collection`) first
removes its index files that are torn (one warning line naming them; never a data, manifest, log or schema file),
and milvus-lite rebuilds them from the segments' data; a read-only open refuses with one line instead.

**Index and flush.** The faiss factory string of the bank's :class:`IndexConfig` names the Milvus index: ``Flat`` ->
FLAT (exact), ``IVF<n>,Flat`` -> IVF_FLAT (nlist n; ``nprobe`` at search time), ``IVF<n>,SQ8`` -> IVF_SQ8 (8-bit
scalar codes; Milvus Lite has no IVF_PQ), ``HNSW<M>[,Flat]`` -> HNSW (``ef`` = ``ef_search``). The index is declared
when the collection is created; Milvus builds it per sealed segment. Milvus Lite answers from unsealed (unflushed)
rows by brute force in Python: measured on 2 cores with 384-dim vectors, a search over 20,000 unflushed rows takes
~520 ms, ~9 ms once flushed with IVF_FLAT; 100 unflushed rows add ~4 ms to every search and 1,000 add ~30 ms, and a
flush costs ~11 ms + 0.1 ms per row. So a Milvus Lite bank flushes when ``MilvusOptions.flush_rows`` (256) rows are
unflushed -- after an ``add`` that brings them there, so a bulk import seals once at its end and the online loop's
one case per step seals every 256 steps -- and on ``flush()``/``close()``. A server seals segments itself (its
growing segments are indexed in memory), so ``flush_rows`` is 0 there by default: no flush from memento.

**What stays in this process.** Like a directory bank's mirror of ids, the bank keeps the ids, content hashes
and tombstone flags of all rows in memory (loaded on first need: Milvus Lite answers a scalar filter such as
``id in [...]`` by scanning every row, ~130 ms at 100,000 cases, against ~5 ms for a primary-key read), so
``get``/``positions_of``/de-duplication are primary-key reads. One process writes a bank at a time.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from memento.bank.front import BankFront, Filter, NewRow, case_meta_json
from memento.bank.history import UPDATABLE, EventRow
from memento.bank.local import BANK_FORMAT, BANK_FORMAT_VERSION
from memento.bank.where import milvus_attrs
from memento.config import BankConfig, EncoderConfig, IndexConfig, from_dict, to_dict
from memento.errors import (
    BankError,
    ConfigError,
    DataFormatError,
    DimensionError,
    MementoError,
    NotABankError,
)
from memento.extras import install_hint
from memento.io import parse_json
from memento.types import SCOPE_FIELDS, Case, shown

__all__ = ["ACTIONS_SUFFIX", "DEFAULT_COLLECTION", "EVIDENCE_SUFFIX", "HISTORY_SUFFIX", "USAGE_SUFFIX", "MilvusBank",
           "MilvusFeatures",
           "MilvusOptions", "MilvusRows", "MilvusVectors", "milvus_index"]

logger = logging.getLogger(__name__)

DEFAULT_COLLECTION = "memento_cases"
USAGE_SUFFIX = "__usage"  # the side collections of the case features
EVIDENCE_SUFFIX = "__evidence"
ACTIONS_SUFFIX = "__actions"
HISTORY_SUFFIX = "__history"  # the cases' history log (memento.bank.history)
_MAX_TEXT = 65_535  # bytes in a Milvus VARCHAR
_MAX_ID = 512
_MAX_TOPK = 16_384  # Milvus' limit on a search's top-k and on nq
_READ_CHUNK = 1_000  # primary keys per read
_PROP = "memento."
_FIELDS = ("pos", "id", "hash", "state", "action", "reward", "env", "kind", "meta", "created", "deleted",
           "deleted_at", "replaced_by", "vector")
_CASE_FIELDS = ["pos", "id", "state", "action", "reward", "env", "kind", "meta", "created"]
_SCOPE_FIELDS = [f"scope_{name}" for name in SCOPE_FIELDS]
_ATTRS = "attrs"  # the meta as a JSON field (what metadata filters read)
_VERSION_FIELDS = ["version", "updated"]  # collections made before updates in place have neither
_HISTORY_FIELDS = ("seq", "pos", "event", "time", "version", "fields", "link", "old_action", "old_reward", "old_meta",
                   "new_action", "new_reward", "new_meta")


@dataclasses.dataclass(frozen=True, kw_only=True)
class MilvusOptions:
    """How a Milvus bank connects and writes.

    ``connect_timeout_s``: give up connecting to a server after this long (one line, exit 2 in the CLI).
    ``flush_rows``: seal the rows added since the last flush once there are this many (0: only on
    ``flush()``/``close()``; None: 256 for Milvus Lite, 0 for a server). ``insert_batch``: rows per insert
    request (a Milvus Lite insert is one write-ahead-log batch).
    """

    connect_timeout_s: float = dataclasses.field(default=5.0, metadata={"help": (
        "give up connecting to a Milvus server after S seconds")})
    flush_rows: int | None = None
    insert_batch: int = 1000

    def __post_init__(self) -> None:
        if isinstance(self.connect_timeout_s, bool) or not isinstance(self.connect_timeout_s, (int, float)) \
                or not 0 < self.connect_timeout_s <= 3600:
            raise ConfigError(f"MilvusOptions.connect_timeout_s={self.connect_timeout_s!r}: must be in (0, 3600]")
        if self.flush_rows is not None and (isinstance(self.flush_rows, bool) or not isinstance(self.flush_rows, int)
                                            or self.flush_rows < 0):
            raise ConfigError(f"MilvusOptions.flush_rows={self.flush_rows!r}: must be None or an integer >= 0")
        if isinstance(self.insert_batch, bool) or not isinstance(self.insert_batch, int) or self.insert_batch < 1:
            raise ConfigError(f"MilvusOptions.insert_batch={self.insert_batch!r}: must be an integer >= 1")


def milvus_index(factory: str) -> tuple[str, dict[str, Any]]:
    """The Milvus index type and build parameters for a faiss factory string (see the module docstring)."""
    text = factory.replace(" ", "")
    if text == "Flat":
        return "FLAT", {}
    match = re.fullmatch(r"IVF(\d+),Flat", text)
    if match:
        return "IVF_FLAT", {"nlist": int(match.group(1))}
    match = re.fullmatch(r"IVF(\d+),SQ8", text)  # 8-bit scalar codes: Milvus Lite's compressed index
    if match:
        return "IVF_SQ8", {"nlist": int(match.group(1))}
    match = re.fullmatch(r"HNSW(\d+)(,Flat)?", text)
    if match:
        return "HNSW", {"M": int(match.group(1)), "efConstruction": 200}
    raise ConfigError(f"IndexConfig.factory={factory!r}: a Milvus bank takes 'Flat', 'IVF<nlist>,Flat', "
                      "'IVF<nlist>,SQ8' or 'HNSW<M>,Flat'")


def _pymilvus() -> Any:
    try:
        import pymilvus
    except ImportError:
        raise BankError(f"a Milvus bank needs the 'milvus' extra: {install_hint('milvus')}") from None
    return pymilvus


def _one_line(error: BaseException) -> str:
    message = getattr(error, "message", None) or str(error)
    return " ".join(str(message).split())[:400]


def _quote(value: str) -> str:
    """A string literal for a Milvus filter expression."""
    return json.dumps(value, ensure_ascii=False)


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8"))


@dataclasses.dataclass
class _Transaction:
    """One write in progress: the committed count it started from, and the tombstones (``(positions,
    replaced_by, deleted_at)``) and side-collection rows to forget that it applies after its commit point."""

    start: int
    tombstones: list[tuple[list[int], str, float]] = dataclasses.field(default_factory=list)
    forget: list[int] = dataclasses.field(default_factory=list)


class MilvusRows:
    """The row store of a Milvus bank: the bank's collection (one row per case, see the module docstring).

    A write is all-or-nothing through the collection property ``memento.committed`` (see "Transactions" in the
    module docstring): rows inserted by a :meth:`transaction` are invisible (to :meth:`count`, reads and
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
        self.scoped = _ATTRS in names and set(_SCOPE_FIELDS) <= names  # created with scopes (memento >= 0.33)
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
            raise BankError(f"{self.name}: {what} failed: {_one_line(error)}") from None

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
        committed = props.get(f"{_PROP}committed")
        pending = props.get(f"{_PROP}pending")
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
        for start in range(0, len(unique), _READ_CHUNK):
            chunk = unique[start:start + _READ_CHUNK]
            for row in self.call("read", self.client.get, self.collection, ids=chunk, output_fields=list(fields)):
                out[int(row["pos"])] = row
        return out

    def _scan(self, fields: Sequence[str], batch: int = 4096) -> Iterator[dict[str, Any]]:
        """All rows in position order."""
        for lo in range(0, self.rows, batch):
            hi = min(self.rows, lo + batch)
            found = self.call("scan", self.client.query, self.collection, filter=f"pos >= {lo} and pos < {hi}",
                              output_fields=list(fields), limit=min(_MAX_TOPK, 4 * (hi - lo)))
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
            self._set_properties("recover", {f"{_PROP}committed": str(n)})
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
        values = {f"{_PROP}committed": str(self.rows)}
        if pending is not None:
            values[f"{_PROP}pending"] = json.dumps(pending, separators=(",", ":"))
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
                  property_keys=[f"{_PROP}pending"])
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
                row[_ATTRS] = milvus_attrs(r.case.meta)
                row.update(zip(_SCOPE_FIELDS, r.case.scope))
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
            changes[_ATTRS] = milvus_attrs(case.meta)
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
        expression = f"{_filter_expression(self, where)} and pos < {int(count)}"
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
        fields = [*_FIELDS, _ATTRS, *_SCOPE_FIELDS] if self.scoped else list(_FIELDS)
        return fields + _VERSION_FIELDS if self.versioned else fields

    def case_fields(self) -> list[str]:
        fields = _CASE_FIELDS + _SCOPE_FIELDS if self.scoped else _CASE_FIELDS
        return fields + _VERSION_FIELDS if self.versioned else fields

    def _case(self, row: dict[str, Any]) -> Case:
        try:
            meta = parse_json(row["meta"], where="meta", error=DataFormatError)
            created = float(row["created"])
            updated = row.get("updated")
            return Case(id=row["id"], state=row["state"], action=row["action"], reward=float(row["reward"]),
                        env=row.get("env"), kind=row["kind"], meta=meta, created=created,
                        version=int(row.get("version") or 1), updated=created if updated is None else float(updated),
                        **{name: row.get(field) for name, field in zip(SCOPE_FIELDS, _SCOPE_FIELDS)})
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
        self._set_properties("truncate", {f"{_PROP}committed": str(n)})
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


def _filter_expression(rows: MilvusRows, where: Filter) -> str:
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
        parts.append(where.meta.milvus(_ATTRS, versioned=rows.versioned))
    return " and ".join(parts)


class MilvusVectors:
    """The vector index of a Milvus bank: the collection's ``vector`` field and its Milvus index; filters become
    a Milvus filter expression (``deleted == false and env == ... and reward > 0``)."""

    def __init__(self, rows: MilvusRows, config: BankConfig):
        self._rows = rows
        self.config = config

    def added(self, rows: Sequence[NewRow]) -> None:
        """Nothing: the row store's insert wrote the vectors."""

    def _filter(self, where: Filter) -> str:
        return _filter_expression(self._rows, where)

    def _search_params(self, k: int) -> dict[str, Any]:
        index_type, _ = milvus_index(self.config.index.factory)
        params: dict[str, Any] = {}
        if index_type == "IVF_FLAT":
            params["nprobe"] = self.config.index.nprobe
        elif index_type == "HNSW":
            params["ef"] = max(self.config.index.ef_search, k)
        return {"metric_type": "IP", "params": params}

    def topk(self, q_BD: np.ndarray, k: int, where: Filter, dead_N: np.ndarray,
             with_vectors: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        if k > _MAX_TOPK or len(q_BD) > _MAX_TOPK:
            raise DataFormatError(f"k={k} for {len(q_BD)} queries: a Milvus search returns at most "
                                  f"{_MAX_TOPK} cases for at most {_MAX_TOPK} queries")
        scores_BK = np.full((len(q_BD), k), -np.inf, dtype=np.float32)
        positions_BK = np.full((len(q_BD), k), -1, dtype=np.int64)
        vectors_BKD = np.zeros((len(q_BD), k, self.config.dim), dtype=np.float32) if with_vectors else None
        fetch = min(_MAX_TOPK, k + self._rows.twice)
        fields = ["vector"] if with_vectors else []
        hits = self._rows.call("search", self._rows.client.search, self._rows.collection, data=list(q_BD),
                               limit=fetch, filter=self._filter(where), output_fields=fields,
                               search_params=self._search_params(fetch))
        for b, found in enumerate(hits):
            seen: set[int] = set()
            for hit in found:
                if int(hit["pos"]) in seen or len(seen) >= k:  # a row held twice (see MilvusRows.count)
                    continue
                j = len(seen)
                seen.add(int(hit["pos"]))
                positions_BK[b, j], scores_BK[b, j] = int(hit["pos"]), float(hit["distance"])
                if vectors_BKD is not None:
                    vectors_BKD[b, j] = np.asarray(hit["entity"]["vector"], dtype=np.float32)
        return scores_BK, positions_BK, vectors_BKD

    def vectors_at(self, positions_N: np.ndarray) -> np.ndarray:
        return self._rows.vectors_at(positions_N, self.config.dim)

    def refresh(self, first_new: int, top: int) -> None:
        self._rows.took_in(top)

    def truncate(self, n: int) -> None:
        """Nothing: the row store's truncate removed the vectors with the rows."""

    def set_search_params(self, config: IndexConfig) -> None:
        self.config = dataclasses.replace(self.config, index=config)

    def summary(self, count: int) -> dict[str, Any]:
        index_type, build = milvus_index(self.config.index.factory)
        return {"milvus_index": {"type": index_type, **build}, "index_trained": True, "index_ntotal": count}

    def flush(self) -> None:
        self._rows.seal()


class MilvusFeatures:
    """The case features of a Milvus bank, in two side collections created on first write (so a bank that
    never uses them is left as it was): ``<collection>__usage`` (an auto-id row per showing: ``step``, ``pos``,
    ``reward``, and a constant 2-d vector, as Milvus wants one in every collection) and
    ``<collection>__actions`` (primary key ``pos``, the action ``vector``)."""

    def __init__(self, rows: MilvusRows, dim: int):
        self._rows = rows
        self._dim = dim
        self.usage = f"{rows.collection}{USAGE_SUFFIX}"
        self.actions = f"{rows.collection}{ACTIONS_SUFFIX}"
        self.evidence = f"{rows.collection}{EVIDENCE_SUFFIX}"
        self.history = f"{rows.collection}{HISTORY_SUFFIX}"
        self.keep_values = False  # a forgotten case's history keeps its values (a bank opened with audit=True)
        self._have: dict[str, bool] = {}
        rows._forget_hook = self._remove

    def _remove(self, positions: Sequence[int] | None, beyond: int | None) -> None:
        """Delete the side rows of ``positions`` (and erase the values of their history unless ``keep_values``), or
        of every position ``>= beyond``."""
        listed = f"pos >= {int(beyond)}" if positions is None else \
            f"pos in [{', '.join(str(int(p)) for p in positions)}]"
        for name in (self.usage, self.actions, self.evidence):
            self._delete(name, listed)
        if positions is None:
            self._delete(self.history, listed)
        elif not self.keep_values:
            self._erase(listed)

    def _erase(self, expression: str) -> None:
        """Rewrite the history rows matching ``expression`` without their values (deleted, then inserted again:
        an auto-id collection takes no upsert; the order is by time)."""
        if not self._exists(self.history):
            return
        rows = self._rows.call("read", self._rows.client.query, self.history, filter=expression,
                               output_fields=list(_HISTORY_FIELDS))
        values = [f"{side}_{name}" for side in ("old", "new") for name in UPDATABLE]
        kept = [{**{name: row.get(name) for name in _HISTORY_FIELDS}, **dict.fromkeys(values), "vector": [1.0, 0.0]}
                for row in rows if any(row.get(name) is not None for name in values)]
        if not kept:
            return
        self._rows.call("delete", self._rows.client.delete, self.history,
                        filter=f"seq in [{', '.join(str(int(row['seq'])) for row in rows)}]")
        for row in kept:
            row.pop("seq", None)
        self._rows.call("insert", self._rows.client.insert, self.history, kept)

    def record_events(self, events: Sequence[EventRow]) -> None:
        if not events:
            return
        self._ensure(self.history)
        rows = [{**event.columns(), "vector": [1.0, 0.0]} for event in events]
        for row in rows:
            row["link"] = row["link"] or ""
        self._rows.call("insert", self._rows.client.insert, self.history, rows)

    def events_at(self, position: int) -> list[EventRow]:
        if not self._exists(self.history):
            return []
        rows = self._rows.call("read", self._rows.client.query, self.history, filter=f"pos == {int(position)}",
                               output_fields=list(_HISTORY_FIELDS))
        rows.sort(key=lambda row: (float(row["time"]), int(row["seq"])))
        return [EventRow.from_columns(row) for row in rows]

    def drop_actions(self, positions: Sequence[int]) -> None:
        self._delete(self.actions, f"pos in [{', '.join(str(int(p)) for p in positions)}]")

    def _exists(self, name: str) -> bool:
        """Whether the side collection ``name`` exists (then loaded: a collection is searched once loaded)."""
        if not self._have.get(name):
            client = self._rows.client
            self._have[name] = bool(self._rows.call("read", client.has_collection, name))
            if self._have[name]:
                self._rows.call("load", _declare_index, client, name, "FLAT", {}, lite_dir=self._rows.lite_dir,
                                label=f"{self._rows.name} ({name})", repair=not self._rows.read_only)
        return self._have[name]

    def _ensure(self, name: str) -> None:
        if self._exists(name):
            return
        pymilvus = _pymilvus()  # created once, with its index, then loaded
        DataType = pymilvus.DataType
        usage = name in (self.usage, self.evidence)  # the per-step logs: an auto-id row each
        schema = pymilvus.MilvusClient.create_schema(auto_id=usage or name == self.history, enable_dynamic_field=False)
        if name == self.history:  # one auto-id row per event; values nullable (erased after a delete)
            schema.add_field("seq", DataType.INT64, is_primary=True)
            schema.add_field("pos", DataType.INT64)
            schema.add_field("event", DataType.VARCHAR, max_length=16)
            schema.add_field("time", DataType.DOUBLE)
            schema.add_field("version", DataType.INT64)
            schema.add_field("fields", DataType.VARCHAR, max_length=256)
            schema.add_field("link", DataType.VARCHAR, max_length=_MAX_ID)
            for side in ("old", "new"):
                schema.add_field(f"{side}_action", DataType.VARCHAR, max_length=_MAX_TEXT, nullable=True)
                schema.add_field(f"{side}_reward", DataType.DOUBLE, nullable=True)
                schema.add_field(f"{side}_meta", DataType.VARCHAR, max_length=_MAX_TEXT, nullable=True)
        elif usage:
            schema.add_field("seq", DataType.INT64, is_primary=True)
            schema.add_field("step", DataType.INT64)
            schema.add_field("pos", DataType.INT64)
            for column in (("reward",) if name == self.usage else ("weight", "value")):
                schema.add_field(column, DataType.DOUBLE)
        else:
            schema.add_field("pos", DataType.INT64, is_primary=True)
        schema.add_field("vector", DataType.FLOAT_VECTOR, dim=2 if usage or name == self.history else self._dim)
        client = self._rows.client
        self._rows.call("create", client.create_collection, name, schema=schema, consistency_level="Strong")
        self._rows.call("create", _declare_index, client, name, "FLAT", {})
        self._have[name] = True

    def record(self, step: int, positions_K: np.ndarray, reward: float) -> None:
        self._ensure(self.usage)
        rows = [{"step": step, "pos": int(p), "reward": reward, "vector": [1.0, 0.0]} for p in positions_K]
        self._rows.call("insert", self._rows.client.insert, self.usage, rows)

    def totals(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        shown_N = np.zeros(n, dtype=np.int64)
        reward_N = np.zeros(n, dtype=np.float64)
        if not self._exists(self.usage):
            return shown_N, reward_N
        batches = self._rows.call("read", self._rows.client.query_iterator, self.usage, batch_size=4096,
                                  filter=f"pos < {n}", output_fields=["pos", "reward"])
        try:
            while batch := self._rows.call("read", batches.next):
                positions = np.asarray([int(r["pos"]) for r in batch], dtype=np.int64)
                np.add.at(shown_N, positions, 1)
                np.add.at(reward_N, positions, np.asarray([float(r["reward"]) for r in batch]))
        finally:
            batches.close()
        return shown_N, reward_N

    def record_evidence(self, step: int, positions_M: np.ndarray, weight_M: np.ndarray, value_M: np.ndarray) -> None:
        self._ensure(self.evidence)
        rows = [{"step": step, "pos": int(p), "weight": float(w), "value": float(v), "vector": [1.0, 0.0]}
                for p, w, v in zip(positions_M, weight_M, value_M)]
        self._rows.call("insert", self._rows.client.insert, self.evidence, rows)

    def evidence_totals(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        count_N, weight_N, value_N = np.zeros(n, dtype=np.int64), np.zeros(n), np.zeros(n)
        if not self._exists(self.evidence):
            return count_N, weight_N, value_N
        batches = self._rows.call("read", self._rows.client.query_iterator, self.evidence, batch_size=4096,
                                  filter=f"pos < {n}", output_fields=["pos", "weight", "value"])
        try:
            while batch := self._rows.call("read", batches.next):
                positions = np.asarray([int(r["pos"]) for r in batch], dtype=np.int64)
                np.add.at(count_N, positions, 1)
                np.add.at(weight_N, positions, np.asarray([float(r["weight"]) for r in batch]))
                np.add.at(value_N, positions, np.asarray([float(r["value"]) for r in batch]))
        finally:
            batches.close()
        return count_N, weight_N, value_N

    def _delete(self, name: str, expression: str) -> int:
        """Delete the rows of a side collection matching ``expression``; returns how many there were."""
        if not self._exists(name):
            return 0
        client = self._rows.client
        found = self._rows.call("count", client.query, name, filter=expression, output_fields=["count(*)"])
        count = int(found[0]["count(*)"]) if found else 0
        if count:
            self._rows.call("delete", client.delete, name, filter=expression)
        return count

    def truncate_steps(self, step: int) -> int:
        return sum(self._delete(name, f"step >= {int(step)}") for name in (self.usage, self.evidence))

    def forget(self, positions: Sequence[int]) -> None:
        """In a transaction, after its commit point (see :meth:`MilvusRows.transaction`)."""
        if not self._rows.defer_forget(positions):
            self._remove(positions, None)

    def truncate(self, n: int) -> None:
        for name in (self.usage, self.actions, self.evidence, self.history):
            self._delete(name, f"pos >= {n}")

    def actions_at(self, positions_C: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        emb_CD = np.zeros((positions_C.size, self._dim), dtype=np.float32)
        have_C = np.zeros(positions_C.size, dtype=bool)
        if not positions_C.size or not self._exists(self.actions):
            return emb_CD, have_C
        unique = np.unique(positions_C).tolist()
        for start in range(0, len(unique), _READ_CHUNK):
            for row in self._rows.call("read", self._rows.client.get, self.actions,
                                       ids=unique[start:start + _READ_CHUNK], output_fields=["pos", "vector"]):
                rows = positions_C == int(row["pos"])
                emb_CD[rows], have_C[rows] = np.asarray(row["vector"], dtype=np.float32), True
        return emb_CD, have_C

    def set_actions(self, positions_C: np.ndarray, emb_CD: np.ndarray) -> None:
        self._ensure(self.actions)
        rows = [{"pos": int(p), "vector": np.ascontiguousarray(v, dtype=np.float32)}
                for p, v in zip(positions_C, emb_CD)]
        self._rows.call("upsert", self._rows.client.upsert, self.actions, rows)


class MilvusBank(BankFront):
    """Cases and their vectors in one Milvus collection (and the case features in two side collections); see
    the module docstring. The bank front (:class:`memento.bank.front.BankFront`) over :class:`MilvusRows`,
    :class:`MilvusVectors` and :class:`MilvusFeatures`.

    Use :meth:`create` or :meth:`open` (or :func:`memento.bank.uri.open_bank`), and ``close()`` when done.
    """

    def __init__(self, client: Any, *, uri: str, collection: str, name: str, config: BankConfig, uid: str,
                 lite_dir: Path | None, options: MilvusOptions, read_only: bool = False, audit: bool = False):
        rows = MilvusRows(client, uri=uri, collection=collection, name=name, lite_dir=lite_dir, options=options)
        rows.read_only = read_only
        features = MilvusFeatures(rows, config.dim)
        if not read_only:
            try:
                rows.recover()
            except MementoError:
                disconnect(client, lite_dir)
                raise
        super().__init__(rows, MilvusVectors(rows, config), features, config=config, uid=uid, read_only=read_only,
                         audit=audit)
        self.uri = uri
        self.collection = collection
        self.options = options

    def _check_text(self, case: Case, i: int) -> None:
        for field in ("state", "action"):
            if _utf8_len(getattr(case, field)) > _MAX_TEXT:
                raise DataFormatError(f"case {i}: {field} is {_utf8_len(getattr(case, field))} bytes; a Milvus bank "
                                      f"holds at most {_MAX_TEXT}")
        for field in ("env", "kind", *SCOPE_FIELDS):
            value = getattr(case, field)
            if value is not None and _utf8_len(value) > _MAX_ID:
                raise DataFormatError(f"case {i}: {field} is longer than {_MAX_ID} bytes")
        if case.id is not None and _utf8_len(case.id) > _MAX_ID:
            raise DataFormatError(f"case {i}: id is longer than {_MAX_ID} bytes")
        if _utf8_len(case_meta_json(case)) > _MAX_TEXT:
            raise DataFormatError(f"case {i}: meta is more than {_MAX_TEXT} bytes of JSON")

    @staticmethod
    def connect(uri: str, *, options: MilvusOptions, must_exist: bool) -> tuple[Any, Path | None]:
        """A ``MilvusClient`` for ``uri`` (a Milvus Lite file ``*.db`` or a server URL) and the Lite directory.

        ``must_exist``: a Milvus Lite file that does not exist is a ``NotABankError`` (nothing is created)."""
        pymilvus = _pymilvus()
        lite_dir = None
        if uri.endswith(".db") and "://" not in uri:
            lite_dir = Path(uri).expanduser().resolve()
            if must_exist and not lite_dir.exists():
                raise NotABankError(f"milvus:{uri}: no Milvus Lite file here")
            if not lite_dir.parent.is_dir():
                raise BankError(f"milvus:{uri}: the directory {lite_dir.parent} does not exist")
            try:
                import milvus_lite  # noqa: F401
            except ImportError:
                raise BankError("a Milvus Lite bank needs the 'milvus' extra (milvus-lite): "
                                + install_hint("milvus")) from None
        try:
            client = pymilvus.MilvusClient(uri=str(lite_dir) if lite_dir else uri,
                                           timeout=options.connect_timeout_s)
            _lite_opened(lite_dir)
        except Exception as error:  # pymilvus raises MilvusException and grpc errors alike
            where = "cannot open the Milvus Lite file" if lite_dir else \
                f"cannot reach the Milvus server (gave up after {options.connect_timeout_s:g} s)"
            raise BankError(f"milvus:{uri}: {where}: {_one_line(error)}") from None
        return client, lite_dir

    @classmethod
    def create(cls, uri: str, dim: int, index: str | IndexConfig = "Flat", *, collection: str = DEFAULT_COLLECTION,
               encoder: EncoderConfig | None = None, exist_ok: bool = False,
               options: MilvusOptions | None = None, audit: bool = False) -> MilvusBank:
        """Create an empty bank: the collection ``collection`` at ``uri`` for ``dim``-dimensional unit vectors."""
        options = options or MilvusOptions()
        index_config = IndexConfig(factory=index) if isinstance(index, str) else index
        config = BankConfig(dim=dim, index=index_config, encoder=encoder)
        index_type = milvus_index(index_config.factory)[0]  # fail on a bad factory before touching anything
        name = f"milvus:{uri}#{collection}"
        lite_new = uri.endswith(".db") and "://" not in uri and not Path(uri).expanduser().exists()
        client, lite_dir = cls.connect(uri, options=options, must_exist=False)
        try:
            if client.has_collection(collection):
                disconnect(client, lite_dir)
                if exist_ok:
                    return cls.open(uri, collection=collection, dim=dim, options=options, audit=audit)
                raise BankError(f"{name}: a collection of that name already exists")
            pymilvus = _pymilvus()
            DataType = pymilvus.DataType
            schema = pymilvus.MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
            schema.add_field("pos", DataType.INT64, is_primary=True)
            schema.add_field("id", DataType.VARCHAR, max_length=_MAX_ID)
            schema.add_field("hash", DataType.VARCHAR, max_length=64)
            schema.add_field("state", DataType.VARCHAR, max_length=_MAX_TEXT)
            schema.add_field("action", DataType.VARCHAR, max_length=_MAX_TEXT)
            schema.add_field("reward", DataType.DOUBLE)
            schema.add_field("env", DataType.VARCHAR, max_length=_MAX_ID, nullable=True)
            schema.add_field("kind", DataType.VARCHAR, max_length=_MAX_ID)
            schema.add_field("meta", DataType.VARCHAR, max_length=_MAX_TEXT)
            schema.add_field(_ATTRS, DataType.JSON)
            for field in _SCOPE_FIELDS:
                schema.add_field(field, DataType.VARCHAR, max_length=_MAX_ID, nullable=True)
            schema.add_field("created", DataType.DOUBLE)
            schema.add_field("deleted", DataType.BOOL)
            schema.add_field("deleted_at", DataType.DOUBLE)
            schema.add_field("replaced_by", DataType.VARCHAR, max_length=_MAX_ID)
            schema.add_field("version", DataType.INT64, nullable=True)  # null: 1
            schema.add_field("updated", DataType.DOUBLE, nullable=True)  # null: created
            schema.add_field("vector", DataType.FLOAT_VECTOR, dim=dim)
            uid = uuid.uuid4().hex
            properties = {f"{_PROP}format": BANK_FORMAT, f"{_PROP}format_version": str(BANK_FORMAT_VERSION),
                          f"{_PROP}uid": uid, f"{_PROP}config": json.dumps(to_dict(config), sort_keys=True),
                          f"{_PROP}created": repr(time.time()), f"{_PROP}committed": "0"}
            client.create_collection(collection, schema=schema, consistency_level="Strong", properties=properties)
            _ensure_index(client, collection, config)
        except BankError:
            raise
        except Exception as error:
            disconnect(client, lite_dir)
            if lite_new and lite_dir is not None:
                _remove_tree(lite_dir)
            raise BankError(f"{name}: cannot create the collection: {_one_line(error)}") from None
        logger.info("created Milvus case bank %s (dim=%d, index=%s)", name, dim, index_type)
        return cls(client, uri=uri, collection=collection, name=name, config=config, uid=uid, lite_dir=lite_dir,
                   options=options, audit=audit)

    @classmethod
    def open(cls, uri: str, *, collection: str = DEFAULT_COLLECTION, dim: int | None = None,
             encoder: EncoderConfig | None = None, index: IndexConfig | None = None, read_only: bool = False,
             options: MilvusOptions | None = None, audit: bool = False) -> MilvusBank:
        """Open an existing bank; ``dim``/``encoder``, when given, must be the bank's (one-line errors). ``audit``:
        a deleted case's history keeps its values (:mod:`memento.bank.history`)."""
        options = options or MilvusOptions()
        name = f"milvus:{uri}#{collection}"
        client, lite_dir = cls.connect(uri, options=options, must_exist=True)
        try:
            if not client.has_collection(collection):
                raise NotABankError(f"{name}: not a case bank (no collection {collection!r})")
            described = client.describe_collection(collection)
            props = {str(k): str(v) for k, v in (described.get("properties") or {}).items()}
            if props.get(f"{_PROP}format") != BANK_FORMAT:
                raise NotABankError(f"{name}: not a case bank (the collection has no memento properties)")
            version = int(props.get(f"{_PROP}format_version", "0"))
            if version > BANK_FORMAT_VERSION:
                raise BankError(f"{name}: bank format version {version} is newer than this memento reads "
                                f"({BANK_FORMAT_VERSION}); upgrade memento")
            config = from_dict(BankConfig, json.loads(props[f"{_PROP}config"]))
            if dim is not None and dim != config.dim:
                raise DimensionError(f"{name}: bank holds dim={config.dim} vectors, but dim={dim} was expected "
                                     "(was it made with another encoder?)")
            if encoder is not None and config.encoder is not None and _encoder_id(encoder) != _encoder_id(
                    config.encoder):
                raise BankError(f"{name}: bank was filled by encoder {_encoder_id(config.encoder)}, not "
                                f"{_encoder_id(encoder)}")
            if index is not None:
                if index.factory != config.index.factory:
                    raise BankError(f"{name}: bank index is {config.index.factory!r}, not {index.factory!r}")
                config = dataclasses.replace(config, index=index)
            _ensure_index(client, collection, config, lite_dir=lite_dir, name=name, repair=not read_only)
        except MementoError:
            disconnect(client, lite_dir)
            raise
        except Exception as error:
            disconnect(client, lite_dir)
            raise BankError(f"{name}: cannot open: {_one_line(error)}") from None
        bank = cls(client, uri=uri, collection=collection, name=name, config=config, uid=props[f"{_PROP}uid"],
                   lite_dir=lite_dir, options=options, read_only=read_only, audit=audit)
        return bank


def _declare_index(client: Any, collection: str, index_type: str, build: dict[str, Any],
                   field: str = "vector", *, lite_dir: Path | None = None, label: str = "",
                   repair: bool = True) -> None:
    """Declare the vector index (when a crash after ``create_collection`` left none) and load the collection
    (:func:`_load_collection`: a Milvus Lite collection's torn index files are repaired first).

    ``sync=False``: pymilvus would otherwise poll the index state with a timestamp call Milvus Lite lacks."""
    if not client.list_indexes(collection):
        index_params = client.prepare_index_params()
        index_params.add_index(field_name=field, index_type=index_type, metric_type="IP", params=build)
        client.create_index(collection, index_params, sync=False)
    _load_collection(client, collection, lite_dir=lite_dir, label=label or collection, repair=repair)


def _ensure_index(client: Any, collection: str, config: BankConfig, *, lite_dir: Path | None = None,
                  name: str = "", repair: bool = True) -> None:
    """The bank collection's vector index (:func:`milvus_index` of its factory), declared if missing, and loaded."""
    _declare_index(client, collection, *milvus_index(config.index.factory), lite_dir=lite_dir, label=name,
                   repair=repair)


# Torn index files (Milvus Lite). milvus-lite (3.2) builds a vector index per sealed segment in a background thread
# after a flush and writes it in place, not through a temporary file and a rename, to
# <lite dir>/collections/<collection>/partitions/<partition>/indexes/<segment stem>.<field>.<type>.idx (.sidx: a
# scalar index). A process killed while it writes one leaves a prefix of the file; loading the collection then
# fails (FLAT: "Failed to read all data for array ... (file seems not fully written?)"), on every open. The
# segment's data (data/<stem>.parquet, committed by milvus-lite's atomic manifest) is whole, and milvus-lite
# builds an index that is missing from it on load. So a writer's open removes the damaged index files (derived
# data only: never a data, delta, WAL, manifest or schema file) and loads again.

_NPY_INDEXES = ("flat", "brute_force")  # numpy .npy files: header (dtype, shape) + the vectors
_FAISS_INDEXES = ("hnsw", "hnsw_sq", "ivf_flat", "ivf_sq8", "ivf_pq")  # faiss.write_index files


def _index_files(lite_dir: Path, collection: str) -> list[Path]:
    """The index sidecar files of a Milvus Lite collection (all partitions)."""
    root = lite_dir / "collections" / collection / "partitions"
    if not root.is_dir():
        return []
    return sorted(path for path in root.glob("*/indexes/*") if path.name.endswith((".idx", ".sidx"))
                  and path.is_file())


def _segment_rows(index_file: Path, stem: str) -> int | None:
    """The row count of the data file an index file belongs to (its Parquet footer), or None when unreadable."""
    try:
        import pyarrow.parquet as pq

        return int(pq.read_metadata(index_file.parent.parent / "data" / f"{stem}.parquet").num_rows)
    except Exception:
        return None


def _npy_damage(path: Path, size: int, rows: int | None) -> str | None:
    from numpy.lib import format as npy

    try:
        with path.open("rb") as stream:
            version = npy.read_magic(stream)
            reader = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
            shape, _, dtype = reader(stream)
            header = stream.tell()
    except Exception:
        return f"no whole .npy header ({size} bytes)"
    expected = header + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if size != expected:
        return f"{size} of {expected} bytes"
    if len(shape) != 2:
        return f"an array of shape {shape}, not (rows, dim)"
    if rows is not None and shape[0] != rows:
        return f"{shape[0]} vectors for a segment of {rows} rows"
    return None


def _faiss_damage(path: Path, rows: int | None) -> str | None:
    try:
        import faiss

        index = faiss.read_index(str(path))
    except ImportError:
        return None
    except Exception as error:
        return f"unreadable by faiss ({_one_line(error)[:120]})"
    if rows is not None and int(index.ntotal) != rows:
        return f"{int(index.ntotal)} vectors for a segment of {rows} rows"
    return None


def _index_damage(path: Path, *, deep: bool) -> str | None:
    """Why the index file ``path`` is torn or incomplete, or None when it looks whole.

    Cheap checks always (a .npy file's size against its header, a Parquet file's closing magic); with ``deep``,
    a faiss index file is read whole (faiss fails on a prefix) and its vector count compared with its segment's."""
    from milvus_lite.index.files import parse_index_sidecar_name

    sidecar = parse_index_sidecar_name(path.name)
    if sidecar is None:
        return None
    try:
        size = path.stat().st_size
        with path.open("rb") as stream:
            head = stream.read(6)
            stream.seek(max(0, size - 4))
            tail = stream.read(4)
    except OSError as error:
        return f"unreadable ({_one_line(error)[:120]})"
    if size == 0:
        return "empty"
    kind = sidecar.index_type.lower()
    if sidecar.extension == ".sidx":  # a Parquet file
        whole = size >= 12 and head[:4] == b"PAR1" and tail == b"PAR1"
        return None if whole else f"no whole Parquet file ({size} bytes)"
    if kind in _NPY_INDEXES or (kind == "autoindex" and head == b"\x93NUMPY"):
        return _npy_damage(path, size, _segment_rows(path, sidecar.source_stem))
    if deep and (kind in _FAISS_INDEXES or kind == "autoindex"):
        return _faiss_damage(path, _segment_rows(path, sidecar.source_stem))
    return None


def _repair_index_files(lite_dir: Path, collection: str, label: str, *, deep: bool, repair: bool) -> list[str]:
    """Remove the torn index files of a Milvus Lite collection (:func:`_index_damage`; one warning line naming
    them) so that its next load rebuilds them from the segments' data; returns their names. ``repair=False`` (a
    read-only open): a ``BankError`` naming them instead, when there are any."""
    damaged = [(path, why) for path in _index_files(lite_dir, collection)
               if (why := _index_damage(path, deep=deep)) is not None]
    if not damaged:
        return []
    names = "; ".join(f"{path} ({why})" for path, why in damaged)
    if not repair:
        raise BankError(f"{label}: torn Milvus Lite index file(s), a crash while they were written: {names}; "
                        "open the bank once for writing to rebuild them from the cases (which are whole)")
    for path, _ in damaged:
        path.unlink(missing_ok=True)
    logger.warning("%s: removed %d torn index file(s) (a crash while Milvus Lite wrote them; rebuilt from the "
                   "segments' data on load): %s", label, len(damaged), names)
    return [str(path) for path, _ in damaged]


def _load_collection(client: Any, collection: str, *, lite_dir: Path | None, label: str, repair: bool) -> None:
    """Load a collection; in Milvus Lite, first remove its index files that are torn (:func:`_repair_index_files`,
    cheap checks), and when the load fails anyway, check them all (faiss files read whole), remove the damaged
    ones and load once more (a second failure propagates)."""
    if lite_dir is None:
        client.load_collection(collection)
        return
    _repair_index_files(lite_dir, collection, label, deep=False, repair=repair)
    with _quiet_load_errors():
        try:
            client.load_collection(collection)
            return
        except Exception as error:
            if not _repair_index_files(lite_dir, collection, label, deep=True, repair=repair):
                raise error from None
        client.load_collection(collection)


class _LoadErrorFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return "load_collection" not in message and "LoadCollection" not in message


@contextmanager
def _quiet_load_errors() -> Iterator[None]:
    """Drop pymilvus' and milvus-lite's own ERROR records (each with a traceback) of a failed load while this
    module loads a Milvus Lite collection: the failure is repaired, or raised as one ``BankError`` line."""
    quiet = _LoadErrorFilter()
    loggers = [logging.getLogger(name) for name in ("pymilvus.decorators", "milvus_lite.adapter.grpc.servicer")]
    for each in loggers:
        each.addFilter(quiet)
    try:
        yield
    finally:
        for each in loggers:
            each.removeFilter(quiet)


def _encoder_id(config: EncoderConfig) -> str:
    model = config.model if config.model is not None else "all-MiniLM-L6-v2 (bundled)"
    return f"{model} (pooling {config.pooling})"


class _LiteUsers:
    """How many clients of this process use each Milvus Lite file. pymilvus starts one in-process server per file
    and keeps it (and the file's lock) until the process exits; the last close here stops it, so another process
    can open the file. (Process-wide state, as the server it counts is.)"""

    lock = threading.Lock()
    count: dict[Path, int] = {}  # noqa: RUF012


def disconnect(client: Any, lite_dir: Path | None) -> None:
    """Close a client of :meth:`MilvusBank.connect` (the last one of a Milvus Lite file stops its server)."""
    try:
        client.close()
    finally:
        _lite_closed(lite_dir)


def _lite_opened(lite_dir: Path | None) -> None:
    if lite_dir is not None:
        with _LiteUsers.lock:
            _LiteUsers.count[lite_dir] = _LiteUsers.count.get(lite_dir, 0) + 1


def _lite_closed(lite_dir: Path | None) -> None:
    if lite_dir is None:
        return
    with _LiteUsers.lock:
        left = _LiteUsers.count.get(lite_dir, 0) - 1
        if left > 0:
            _LiteUsers.count[lite_dir] = left
            return
        _LiteUsers.count.pop(lite_dir, None)
        _release_lite(lite_dir)


def _release_lite(lite_dir: Path) -> None:
    """Stop this process's Milvus Lite server for ``lite_dir`` (it holds the file's lock until then)."""
    try:
        from milvus_lite.server_manager import server_manager_instance
    except ImportError:
        return
    server_manager_instance.release_server(str(lite_dir))


def _remove_tree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def drop_milvus_bank(uri: str, collection: str, *, options: MilvusOptions | None = None,
                     remove_lite_file: bool = False) -> None:
    """Drop a bank's collection and its side collections (a failed copy's destination); with
    ``remove_lite_file``, also the Milvus Lite file when it holds no other collection."""
    options = options or MilvusOptions()
    client, lite_dir = MilvusBank.connect(uri, options=options, must_exist=False)
    try:
        for name in (collection, *(collection + suffix for suffix in (USAGE_SUFFIX, ACTIONS_SUFFIX, EVIDENCE_SUFFIX,
                                                                     HISTORY_SUFFIX))):
            if client.has_collection(name):
                client.drop_collection(name)
        others = client.list_collections()
    finally:
        disconnect(client, lite_dir)
    if remove_lite_file and lite_dir is not None and not others and lite_dir not in _LiteUsers.count:
        _remove_tree(lite_dir)


def lite_dir_of(uri: str) -> Path | None:
    """The Milvus Lite directory a ``milvus:`` URI names, or None for a server."""
    return Path(uri).expanduser().resolve() if uri.endswith(".db") and "://" not in uri else None

