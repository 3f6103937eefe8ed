"""A case bank in one Milvus collection (``pymilvus``): Milvus Lite in a local file, or a Milvus server.

Named ``milvus:URI[#collection]`` wherever a bank is accepted (:mod:`memento.memory.uri`); it implements
:class:`memento.memory.protocol.Bank` (that module's table says which operations, and what a crash loses).

One collection per bank, one row per case::

    pos      INT64 primary key   the case's position (dense, 0..n-1: insertion order, as in a directory bank)
    id       VARCHAR             the case id (the same ids a directory bank assigns)
    hash     VARCHAR             memento.types.content_hash of (state, action, env, kind): de-duplication
    state, action, kind, meta    VARCHAR (meta is JSON text, keys sorted); env VARCHAR, nullable
    reward, created              DOUBLE
    deleted  BOOL                a tombstone (delete/replace); deleted_at DOUBLE, replaced_by VARCHAR
    vector   FLOAT_VECTOR(dim)   the unit-norm state vector, inner-product metric

The bank's identity lives in the collection's properties: ``memento.format``, ``memento.format_version``,
``memento.uid`` and ``memento.config`` (the :class:`BankConfig` JSON: dim, index, encoder), written by the one
``create_collection`` call that makes the collection (a bank appears whole or not at all). Opening compares
the dimension and the encoder asked for with them.

**Index and flush.** The faiss factory string of the bank's :class:`IndexConfig` names the Milvus index:
``Flat`` -> FLAT (exact), ``IVF<n>,Flat`` -> IVF_FLAT (nlist n; ``nprobe`` at search time), ``HNSW<M>[,Flat]``
-> HNSW (``ef`` = ``ef_search``). The index is declared when the collection is created; Milvus builds it per
sealed segment. Milvus Lite answers from unsealed (unflushed) rows by brute force in Python: measured on 2
cores with 384-dim vectors, a search over 20,000 unflushed rows takes ~520 ms, ~9 ms once flushed with
IVF_FLAT; 100 unflushed rows add ~4 ms to every search and 1,000 add ~30 ms, and a flush costs ~11 ms + 0.1 ms
per row. So a Milvus Lite bank flushes when ``MilvusOptions.flush_rows`` (256) rows are unflushed -- after
an ``add`` that brings them there, so a bulk import seals once at its end and the online loop's one case per
step seals every 256 steps -- and on ``flush()``/``close()``. A server seals segments itself (its growing
segments are indexed in memory), so ``flush_rows`` is 0 there by default: no flush from memento.

**What stays in this process.** Like a directory bank's mirror of ids, the bank keeps the ids, content hashes
and tombstone flags of all rows in memory (loaded on first need: Milvus Lite answers a scalar filter such as
``id in [...]`` by scanning every row, ~130 ms at 100,000 cases, against ~5 ms for a primary-key read), so
``get``/``positions_of``/de-duplication are primary-key reads. One process writes a bank at a time.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import numbers
import re
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, overload

import numpy as np

from memento.config import BankConfig, EncoderConfig, IndexConfig, from_dict, to_dict
from memento.errors import (
    BankError,
    ConfigError,
    DataFormatError,
    DimensionError,
    MementoError,
    NotABankError,
    UnknownCaseError,
)
from memento.formats import read_case_file, write_jsonl
from memento.memory.bank import BANK_FORMAT, BANK_FORMAT_VERSION, Candidates
from memento.types import Case

__all__ = ["DEFAULT_COLLECTION", "MilvusBank", "MilvusOptions", "milvus_index"]

logger = logging.getLogger(__name__)

DEFAULT_COLLECTION = "memento_cases"
_MAX_TEXT = 65_535  # bytes in a Milvus VARCHAR
_MAX_ID = 512
_MAX_TOPK = 16_384  # Milvus' limit on a search's top-k and on nq
_NORM_TOLERANCE = 1e-3
_READ_CHUNK = 1_000  # primary keys per read
_PROP = "memento."
_FIELDS = ("pos", "id", "hash", "state", "action", "reward", "env", "kind", "meta", "created", "deleted",
           "deleted_at", "replaced_by", "vector")
_CASE_FIELDS = ["pos", "id", "state", "action", "reward", "env", "kind", "meta", "created"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class MilvusOptions:
    """How a Milvus bank connects and writes.

    ``connect_timeout_s``: give up connecting to a server after this long (one line, exit 2 in the CLI).
    ``flush_rows``: seal the rows added since the last flush once there are this many (0: only on
    ``flush()``/``close()``; None: 256 for Milvus Lite, 0 for a server). ``insert_batch``: rows per insert
    request (a Milvus Lite insert is one write-ahead-log batch).
    """

    connect_timeout_s: float = 5.0
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
    match = re.fullmatch(r"HNSW(\d+)(,Flat)?", text)
    if match:
        return "HNSW", {"M": int(match.group(1)), "efConstruction": 200}
    raise ConfigError(f"IndexConfig.factory={factory!r}: a Milvus bank takes 'Flat', 'IVF<nlist>,Flat' or "
                      "'HNSW<M>,Flat'")


def _pymilvus() -> Any:
    try:
        import pymilvus
    except ImportError:
        raise BankError("a Milvus bank needs the 'milvus' extra: pip install 'memento-mdp[milvus]'") from None
    return pymilvus


def _one_line(error: BaseException) -> str:
    message = getattr(error, "message", None) or str(error)
    return " ".join(str(message).split())[:400]


def _quote(value: str) -> str:
    """A string literal for a Milvus filter expression."""
    return json.dumps(value, ensure_ascii=False)


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8"))


def _created(case: Case, now: float) -> float:
    created = case.created
    return now if created is None else float(created)


def _check_real(value: Any, what: str) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise DataFormatError(f"{what} must be a finite number, got {value!r}")
    return float(value)


class MilvusBank:
    """Cases and their vectors in one Milvus collection; see the module docstring.

    Use :meth:`create` or :meth:`open` (or :func:`memento.memory.uri.open_bank`), and ``close()`` when done.
    """

    def __init__(self, client: Any, *, uri: str, collection: str, name: str, config: BankConfig, uid: str,
                 lite_dir: Path | None, options: MilvusOptions, read_only: bool = False):
        self._client = client
        self.uri = uri
        self.collection = collection
        self._name = name
        self.config = config
        self.uid = uid
        self.read_only = read_only
        self._lite_dir = lite_dir
        self.options = options
        self._flush_rows = options.flush_rows if options.flush_rows is not None else (256 if lite_dir else 0)
        self._unflushed = 0
        self._closed = False
        self._twice = 0  # rows Milvus Lite holds twice after a crash (see _count_rows): searches fetch more
        self._count = self._count_rows()
        # the mirror of ids, content hashes and tombstones (loaded on first need)
        self._ids: list[str] = []
        self._pos_of: dict[str, int] = {}
        self._hashes: list[str] = []
        self._live_hash: dict[str, str] = {}  # content hash -> smallest live id
        self._deleted: set[int] = set()
        self._loaded = self._count == 0

    # ------------------------------------------------------------------ connect / create / open

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
                                "pip install 'memento-mdp[milvus]'") from None
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
               options: MilvusOptions | None = None) -> MilvusBank:
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
                    return cls.open(uri, collection=collection, dim=dim, options=options)
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
            schema.add_field("created", DataType.DOUBLE)
            schema.add_field("deleted", DataType.BOOL)
            schema.add_field("deleted_at", DataType.DOUBLE)
            schema.add_field("replaced_by", DataType.VARCHAR, max_length=_MAX_ID)
            schema.add_field("vector", DataType.FLOAT_VECTOR, dim=dim)
            uid = uuid.uuid4().hex
            properties = {f"{_PROP}format": BANK_FORMAT, f"{_PROP}format_version": str(BANK_FORMAT_VERSION),
                          f"{_PROP}uid": uid, f"{_PROP}config": json.dumps(to_dict(config), sort_keys=True),
                          f"{_PROP}created": repr(time.time())}
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
                   options=options)

    @classmethod
    def open(cls, uri: str, *, collection: str = DEFAULT_COLLECTION, dim: int | None = None,
             encoder: EncoderConfig | None = None, index: IndexConfig | None = None, read_only: bool = False,
             options: MilvusOptions | None = None) -> MilvusBank:
        """Open an existing bank; ``dim``/``encoder``, when given, must be the bank's (one-line errors)."""
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
                config = BankConfig(dim=config.dim, index=index, encoder=config.encoder)
            _ensure_index(client, collection, config)
        except MementoError:
            disconnect(client, lite_dir)
            raise
        except Exception as error:
            disconnect(client, lite_dir)
            raise BankError(f"{name}: cannot open: {_one_line(error)}") from None
        bank = cls(client, uri=uri, collection=collection, name=name, config=config, uid=props[f"{_PROP}uid"],
                   lite_dir=lite_dir, options=options, read_only=read_only)
        return bank

    # ------------------------------------------------------------------ internals

    @property
    def path(self) -> str:
        """The bank's name: ``milvus:URI#collection``."""
        return self._name

    @property
    def dim(self) -> int:
        return self.config.dim

    def __len__(self) -> int:
        return self._count

    def __enter__(self) -> MilvusBank:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"MilvusBank({self._name!r}, cases={self._count}, dim={self.dim}, index={self.config.index.factory!r})"

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as error:
            raise BankError(f"{self._name}: {what} failed: {_one_line(error)}") from None

    def _check_open(self) -> None:
        if self._closed:
            raise BankError(f"{self._name}: bank is closed")

    def _check_writable(self) -> None:
        self._check_open()
        if self.read_only:
            raise BankError(f"{self._name}: bank is open read-only")

    def _count_rows(self) -> int:
        """The number of positions (rows are dense, ``0..n-1``).

        Not ``count(*)`` alone: Milvus Lite 3.2 can hold two copies of a row after a kill during a flush (its
        write-ahead log replayed over the segment the flush had written), and counts both. So ``count(*)``
        bounds the search for the first missing position, found by primary-key reads (log2 n of them)."""
        rows = self._call("count", self._client.query, self.collection, filter="", output_fields=["count(*)"])
        upper = int(rows[0]["count(*)"]) if rows else 0
        if upper and not self._exists(upper - 1):
            lo, hi = 0, upper - 1  # exists(lo - 1) or lo == 0; not exists(hi)
            while lo < hi:
                mid = (lo + hi) // 2
                lo, hi = (mid + 1, hi) if self._exists(mid) else (lo, mid)
            logger.warning("%s: %d row(s) counted twice (a crash during a flush); %d cases", self._name,
                           upper - lo, lo)
            self._twice = upper - lo
            upper = lo
        if upper or rows:  # positions are dense: no row at or past the count
            beyond = self._call("count", self._client.query, self.collection, filter=f"pos >= {upper}",
                                output_fields=["pos"], limit=1)
            if beyond:
                raise BankError(f"{self._name}: damaged bank: {upper} rows but a row at position {beyond[0]['pos']}")
        return upper

    def _exists(self, position: int) -> bool:
        return bool(self._call("count", self._client.get, self.collection, ids=[int(position)], output_fields=["pos"]))

    def _read(self, positions: Sequence[int], fields: Sequence[str]) -> dict[int, dict[str, Any]]:
        """Rows by primary key (position)."""
        out: dict[int, dict[str, Any]] = {}
        unique = sorted(set(int(p) for p in positions))
        for start in range(0, len(unique), _READ_CHUNK):
            chunk = unique[start:start + _READ_CHUNK]
            for row in self._call("read", self._client.get, self.collection, ids=chunk, output_fields=list(fields)):
                out[int(row["pos"])] = row
        return out

    def _scan(self, fields: Sequence[str], start: int = 0, stop: int | None = None,
              batch: int = 4096) -> Iterator[dict[str, Any]]:
        """Rows with ``start <= pos < stop`` in position order."""
        stop = self._count if stop is None else stop
        for lo in range(start, stop, batch):
            hi = min(stop, lo + batch)
            found = self._call("scan", self._client.query, self.collection, filter=f"pos >= {lo} and pos < {hi}",
                               output_fields=list(fields), limit=min(_MAX_TOPK, 4 * (hi - lo)))
            rows = sorted({int(r["pos"]): r for r in found}.values(), key=lambda r: int(r["pos"]))  # see _count_rows
            if len(rows) != hi - lo or (rows and int(rows[0]["pos"]) != lo):
                raise BankError(f"{self._name}: damaged bank: positions {lo}..{hi - 1} are not all there")
            yield from rows

    def _ensure_loaded(self) -> None:
        if self._loaded:
            return
        self._ids, self._hashes, self._pos_of, self._live_hash, self._deleted = [], [], {}, {}, set()
        self._mirror(self._scan(["pos", "id", "hash", "deleted"]))
        self._loaded = True

    def _mirror(self, rows: Any) -> None:
        for row in rows:
            pos, case_id, digest = int(row["pos"]), str(row["id"]), str(row["hash"])
            if pos != len(self._ids):
                raise BankError(f"{self._name}: case positions are not dense (found {pos} at row {len(self._ids)})")
            self._ids.append(case_id)
            self._hashes.append(digest)
            self._pos_of[case_id] = pos
            if row["deleted"]:
                self._deleted.add(pos)
            elif digest not in self._live_hash or case_id < self._live_hash[digest]:
                self._live_hash[digest] = case_id

    def _validate_embeddings(self, embeddings: Any, n: int) -> np.ndarray:
        emb = np.asarray(embeddings)
        if emb.ndim == 1 and n == 1:
            emb = emb[None, :]
        if emb.ndim != 2 or emb.shape != (n, self.dim):
            raise DimensionError(f"embeddings have shape {tuple(emb.shape)}, expected ({n}, {self.dim}) "
                                 f"for {n} case(s) in a dim={self.dim} bank")
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

    def _validate_query(self, query: Any) -> np.ndarray:
        q = np.asarray(query)
        q_BD = q[None, :] if q.ndim == 1 else q
        if q_BD.ndim != 2 or q_BD.shape[1] != self.dim:
            raise DimensionError(f"query has shape {tuple(q.shape)}, expected ({self.dim},) or "
                                 f"(B, {self.dim}) for this dim={self.dim} bank")
        if not np.issubdtype(q_BD.dtype, np.floating):
            raise DataFormatError(f"query must be floating point, got dtype {q_BD.dtype}")
        q_BD = q_BD.astype(np.float32)
        if not np.isfinite(q_BD).all():
            raise DataFormatError("query contains NaN or inf")
        norms_B1 = np.linalg.norm(q_BD, axis=1, keepdims=True)
        if (norms_B1 == 0).any():
            raise DataFormatError("query has zero norm")
        return np.ascontiguousarray(q_BD / norms_B1)

    def _positions(self, ids: Sequence[str]) -> np.ndarray:
        self._ensure_loaded()
        missing = [i for i in ids if i not in self._pos_of]
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise UnknownCaseError(f"{self._name}: unknown case id {missing[0]!r}{more}")
        return np.array([self._pos_of[i] for i in ids], dtype=np.int64)

    def _check_positions(self, positions: Sequence[int] | np.ndarray) -> np.ndarray:
        positions_N = np.asarray(positions, dtype=np.int64).reshape(-1)
        if positions_N.size and (positions_N.min() < 0 or positions_N.max() >= self._count):
            raise UnknownCaseError(f"{self._name}: positions must lie in [0, {self._count}); "
                                   f"got min={int(positions_N.min())}, max={int(positions_N.max())}")
        return positions_N

    @staticmethod
    def _row_to_case(row: dict[str, Any]) -> Case:
        return Case(id=row["id"], state=row["state"], action=row["action"], reward=float(row["reward"]),
                    env=row.get("env"), kind=row["kind"], meta=json.loads(row["meta"]), created=float(row["created"]))

    def _check_text(self, case: Case, i: int) -> None:
        for field in ("state", "action"):
            if _utf8_len(getattr(case, field)) > _MAX_TEXT:
                raise DataFormatError(f"case {i}: {field} is {_utf8_len(getattr(case, field))} bytes; a Milvus bank "
                                      f"holds at most {_MAX_TEXT}")
        for field in ("env", "kind"):
            value = getattr(case, field)
            if value is not None and _utf8_len(value) > _MAX_ID:
                raise DataFormatError(f"case {i}: {field} is longer than {_MAX_ID} bytes")
        if case.id is not None and _utf8_len(case.id) > _MAX_ID:
            raise DataFormatError(f"case {i}: id is longer than {_MAX_ID} bytes")
        if _utf8_len(json.dumps(case.meta, ensure_ascii=False, sort_keys=True)) > _MAX_TEXT:
            raise DataFormatError(f"case {i}: meta is more than {_MAX_TEXT} bytes of JSON")

    def _plan_ids(self, cases: Sequence[Case], hashes: Sequence[str], *, allow_duplicates: bool,
                  warn: bool, dead: int | None = None) -> tuple[list[str], list[tuple[int, str]]]:
        """As :meth:`CaseBank._plan_ids`: the id of each case and the ``(input index, id)`` of those to insert.

        ``dead``: a position that counts as deleted for this plan (``replace`` plans before it writes)."""
        self._ensure_loaded()
        out: list[str] = [""] * len(cases)
        existing: dict[str, str] = {}
        if not allow_duplicates:
            for digest in dict.fromkeys(hashes):
                stored = self._live_hash.get(digest)
                if stored is not None and self._pos_of[stored] != dead:
                    existing[digest] = stored
        planned: list[tuple[int, str]] = []
        for i, (case, digest) in enumerate(zip(cases, hashes)):
            if not allow_duplicates and digest in existing:
                out[i] = existing[digest]
                if warn and case.id is not None and case.id != existing[digest]:
                    logger.warning("%s: case %r duplicates stored case %r; kept the stored one",
                                   self._name, case.id, existing[digest])
                continue
            position = self._count + len(planned)
            case_id = case.id if case.id is not None else (
                f"c{digest[:16]}" if not allow_duplicates else f"c{digest[:16]}-{position}")
            if case.id is None and case_id in self._pos_of and (
                    self._pos_of[case_id] in self._deleted or self._pos_of[case_id] == dead):
                case_id = f"c{digest[:16]}-{position}"  # a deleted case's id is never reused
            existing[digest] = case_id
            out[i] = case_id
            planned.append((i, case_id))
        seen: set[str] = set()
        for i, case_id in planned:
            if case_id in seen:
                raise DataFormatError(f"case {i}: id {case_id!r} is used twice in this call")
            seen.add(case_id)
        for i, case_id in planned:
            if case_id in self._pos_of:
                raise DataFormatError(f"case {i}: id {case_id!r} is already used by another case")
        return out, planned

    def _rows(self, cases: Sequence[Case], hashes: Sequence[str], emb_ND: np.ndarray,
              planned: Sequence[tuple[int, str]]) -> list[dict[str, Any]]:
        now = time.time()
        return [{"pos": pos, "id": case_id, "hash": hashes[i], "state": cases[i].state, "action": cases[i].action,
                 "reward": float(cases[i].reward), "env": cases[i].env, "kind": cases[i].kind,
                 "meta": json.dumps(cases[i].meta, ensure_ascii=False, sort_keys=True),
                 "created": _created(cases[i], now),
                 "deleted": False, "deleted_at": 0.0, "replaced_by": "", "vector": emb_ND[i]}
                for pos, (i, case_id) in enumerate(planned, start=self._count)]

    def _insert(self, rows: list[dict[str, Any]]) -> None:
        """Insert rows at the next positions, batch by batch; the mirror and count follow each batch."""
        step = self.options.insert_batch
        for start in range(0, len(rows), step):
            batch = rows[start:start + step]
            self._call("insert", self._client.insert, self.collection, batch)
            self._count += len(batch)
            self._unflushed += len(batch)
            self._mirror(batch)
        if self._flush_rows and self._unflushed >= self._flush_rows:
            self._seal()

    def _seal(self) -> None:
        if self._unflushed:
            self._call("flush", self._client.flush, self.collection)
            self._unflushed = 0

    def _filter(self, env: str | None, kind: str | None, positive: bool) -> str:
        parts = ["deleted == false"]
        if env is not None:
            parts.append(f"env == {_quote(env)}")
        if kind is not None:
            parts.append(f"kind == {_quote(kind)}")
        if positive:
            parts.append("reward > 0")
        return " and ".join(parts)

    def _search_params(self, k: int) -> dict[str, Any]:
        index_type, _ = milvus_index(self.config.index.factory)
        params: dict[str, Any] = {}
        if index_type == "IVF_FLAT":
            params["nprobe"] = self.config.index.nprobe
        elif index_type == "HNSW":
            params["ef"] = max(self.config.index.ef_search, k)
        return {"metric_type": "IP", "params": params}

    def _hits(self, q_BD: np.ndarray, k: int, *, env: str | None, kind: str | None, positive: bool,
              with_vectors: bool) -> list[list[dict[str, Any]]]:
        fields = ["vector"] if with_vectors else []
        return self._call("search", self._client.search, self.collection, data=[q for q in q_BD], limit=k,
                          filter=self._filter(env, kind, positive), output_fields=fields,
                          search_params=self._search_params(k))

    # ------------------------------------------------------------------ writes

    def add(self, cases: Sequence[Case], embeddings: Any, *, allow_duplicates: bool = False) -> list[str]:
        """Store cases and their unit-norm embeddings ``[N, D]`` (as :meth:`CaseBank.add`); a crash during the
        call may leave a prefix of its insert batches (see :mod:`memento.memory.protocol`)."""
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
        for i, case in enumerate(cases):
            self._check_text(case, i)
        hashes = [c.content_hash for c in cases]
        out, planned = self._plan_ids(cases, hashes, allow_duplicates=allow_duplicates, warn=True)
        self._insert(self._rows(cases, hashes, emb_ND, planned))
        skipped = len(cases) - len(planned)
        if skipped:
            logger.debug("%s: skipped %d duplicate case(s)", self._name, skipped)
        return out

    def check_ids(self, cases: Sequence[Case], *, allow_duplicates: bool = False) -> None:
        """Raise the ``DataFormatError`` :meth:`add` would raise for these cases' ids; writes nothing."""
        self._check_open()
        cases = list(cases)
        self._plan_ids(cases, [c.content_hash for c in cases], allow_duplicates=allow_duplicates, warn=False)

    def _rewrite(self, position: int, **changes: Any) -> None:
        """Upsert the row at ``position`` with ``changes`` (a whole row: any Milvus version takes it)."""
        row = self._read([position], _FIELDS)[position]
        row.update(changes)
        row["vector"] = np.asarray(row["vector"], dtype=np.float32)
        self._call("upsert", self._client.upsert, self.collection, [row])
        self._unflushed += 1

    def update_reward(self, case_id: str, reward: float) -> None:
        """Set the reward of a stored case."""
        self._check_writable()
        value = _check_real(reward, "reward")
        (position,) = self._positions([case_id]).tolist()
        self._rewrite(position, reward=value)

    def _live_positions(self, ids: Sequence[str], what: str) -> np.ndarray:
        ids = list(ids)
        for i, case_id in enumerate(ids):
            if not isinstance(case_id, str) or not case_id:
                raise DataFormatError(f"{what}: case id {i} must be a non-empty string, got {case_id!r}")
        if len(set(ids)) != len(ids):
            raise DataFormatError(f"{what}: a case id is given twice")
        positions_M = self._positions(ids)
        for case_id, pos in zip(ids, positions_M.tolist()):
            if pos in self._deleted:
                raise UnknownCaseError(f"{self._name}: case {case_id!r} was already deleted")
        return positions_M

    def _forget(self, positions: Sequence[int]) -> None:
        """The mirror after tombstoning ``positions`` (one pass over the hashes when a live hash lost its id)."""
        orphaned = set()
        for pos in positions:
            self._deleted.add(int(pos))
            digest, case_id = self._hashes[pos], self._ids[pos]
            if self._live_hash.get(digest) == case_id:
                del self._live_hash[digest]
                orphaned.add(digest)
        if orphaned:  # another live copy of that content (a bank filled with allow_duplicates) takes over
            for pos, digest in enumerate(self._hashes):
                if digest in orphaned and pos not in self._deleted:
                    case_id = self._ids[pos]
                    if digest not in self._live_hash or case_id < self._live_hash[digest]:
                        self._live_hash[digest] = case_id

    def delete(self, ids: str | Sequence[str]) -> int:
        """Forget the cases ``ids`` (tombstones; see :meth:`CaseBank.delete`); returns how many."""
        self._check_writable()
        wanted = [ids] if isinstance(ids, str) else list(ids)
        if not wanted:
            return 0
        positions_M = self._live_positions(wanted, "delete")
        now = time.time()
        rows = self._read(positions_M.tolist(), _FIELDS)
        batch = []
        for pos in positions_M.tolist():
            row = rows[pos]
            row.update(deleted=True, deleted_at=now, replaced_by="")
            row["vector"] = np.asarray(row["vector"], dtype=np.float32)
            batch.append(row)
        for start in range(0, len(batch), self.options.insert_batch):
            self._call("delete", self._client.upsert, self.collection, batch[start:start + self.options.insert_batch])
        self._unflushed += len(batch)
        self._forget(positions_M.tolist())
        logger.info("%s: deleted %d case(s)", self._name, len(wanted))
        return len(wanted)

    def replace(self, case_id: str, case: Case, embedding: Any) -> str:
        """Supersede ``case_id`` by ``case`` (see :meth:`CaseBank.replace`); returns the new case's id.

        Two writes: the new row first, then the old row's tombstone (naming the new id). A crash between them
        leaves both cases live (nothing lost)."""
        self._check_writable()
        if not isinstance(case, Case):
            raise DataFormatError(f"replace: expected a memento.Case, got {type(case).__name__}")
        emb_1D = self._validate_embeddings(embedding, 1)
        self._check_text(case, 0)
        (old,) = self._live_positions([case_id], "replace").tolist()
        digest = case.content_hash
        out, planned = self._plan_ids([case], [digest], allow_duplicates=False, warn=True, dead=old)
        new_id = out[0]
        if planned:
            self._insert(self._rows([case], [digest], emb_1D, planned))
        self._rewrite(old, deleted=True, deleted_at=time.time(), replaced_by=new_id)
        self._forget([old])
        logger.info("%s: replaced case %r by %r", self._name, case_id, new_id)
        return new_id

    def truncate(self, n: int) -> int:
        """Remove every case at position ``>= n``; returns how many were removed."""
        self._check_writable()
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 0 <= n <= self._count:
            raise DataFormatError(f"truncate: n must be an integer in [0, {self._count}], got {n!r}")
        removed = self._count - int(n)
        if removed == 0:
            return 0
        self._call("truncate", self._client.delete, self.collection, filter=f"pos >= {int(n)}")
        self._unflushed += 1
        self._count = int(n)
        self._loaded = False
        self._ensure_loaded()
        logger.info("%s: truncated to %d case(s) (%d removed)", self._name, n, removed)
        return removed

    def import_jsonl(self, path: str | Path, encoder: Any, *, format: str = "case",
                     allow_duplicates: bool = False, show_progress_bar: bool | None = None) -> list[str]:
        """Read a case file, encode the states, add all (as :meth:`CaseBank.import_jsonl`)."""
        cases = read_case_file(path, format)  # type: ignore[arg-type]
        if encoder.dim != self.dim:
            raise DimensionError(f"encoder {encoder.model_id} gives dim={encoder.dim} vectors, "
                                 f"bank {self._name} holds dim={self.dim}")
        try:
            self.check_ids(cases, allow_duplicates=allow_duplicates)
        except DataFormatError as error:
            raise DataFormatError(f"{error} (bank {self._name})", path=path) from None
        emb_ND = encoder.encode([c.state for c in cases], show_progress_bar=show_progress_bar, normalize=True)
        return self.add(cases, emb_ND.reshape(len(cases), self.dim), allow_duplicates=allow_duplicates)

    # ------------------------------------------------------------------ reads

    @overload
    def get(self, ids: str) -> Case: ...  # type: ignore[overload-overlap]

    @overload
    def get(self, ids: Sequence[str]) -> list[Case]: ...

    def get(self, ids: str | Sequence[str]) -> Case | list[Case]:
        """The stored case(s), in the order asked; an unknown id raises ``UnknownCaseError``."""
        self._check_open()
        single = isinstance(ids, str)
        wanted: list[str] = [ids] if isinstance(ids, str) else list(ids)
        positions = self._positions(wanted).tolist()
        rows = self._read(positions, _CASE_FIELDS)
        result = [self._row_to_case(rows[p]) for p in positions]
        return result[0] if single else result

    def rewards(self, ids: Sequence[str]) -> np.ndarray:
        """The stored rewards ``[N]`` (float64) of the given case ids, in the order asked."""
        self._check_open()
        positions = self._positions(list(ids)).tolist()
        rows = self._read(positions, ["pos", "reward"])
        return np.array([rows[p]["reward"] for p in positions], dtype=np.float64)

    def embeddings(self, ids: Sequence[str]) -> np.ndarray:
        """Stored unit vectors ``[N, D]`` of the given case ids."""
        self._check_open()
        return self._vectors(self._positions(list(ids)))

    def embeddings_at(self, positions: Sequence[int] | np.ndarray) -> np.ndarray:
        """Stored unit vectors ``[N, D]`` at bank positions."""
        self._check_open()
        return self._vectors(self._check_positions(positions))

    def _vectors(self, positions_N: np.ndarray) -> np.ndarray:
        rows = self._read(positions_N.tolist(), ["pos", "vector"])
        out_ND = np.zeros((positions_N.size, self.dim), dtype=np.float32)
        for i, p in enumerate(positions_N.tolist()):
            out_ND[i] = np.asarray(rows[p]["vector"], dtype=np.float32)
        return out_ND

    def ids_at(self, positions: Sequence[int] | np.ndarray) -> list[str]:
        """Case ids at bank positions."""
        self._check_open()
        self._ensure_loaded()
        return [self._ids[int(p)] for p in self._check_positions(positions)]

    def positions_of(self, ids: Sequence[str]) -> np.ndarray:
        """Bank positions (int64) of the case ids; an unknown id raises ``UnknownCaseError``."""
        self._check_open()
        return self._positions(list(ids))

    @property
    def num_deleted(self) -> int:
        self._check_open()
        self._ensure_loaded()
        return len(self._deleted)

    def deleted_ids(self) -> list[str]:
        """The ids of the deleted cases, in position order."""
        self._check_open()
        self._ensure_loaded()
        return [self._ids[p] for p in sorted(self._deleted)]

    def is_deleted(self, ids: Sequence[str]) -> list[bool]:
        """Whether each stored case id was deleted; an id never stored raises ``UnknownCaseError``."""
        self._check_open()
        return [p in self._deleted for p in self._positions(list(ids)).tolist()]

    def iter_cases(self, batch_size: int = 1000) -> Iterator[Case]:
        """All live cases in insertion order."""
        self._check_open()
        for row in self._scan(_CASE_FIELDS + ["deleted"], batch=max(1, int(batch_size))):
            if not row["deleted"]:
                yield self._row_to_case(row)

    def export_jsonl(self, path: str | Path) -> int:
        """Write every case as Case JSONL (atomically); returns the number written."""
        return write_jsonl(path, (case.to_json() for case in self.iter_cases()))

    def stats(self) -> dict[str, Any]:
        """Counts, reward summary, index and storage (the keys of :meth:`CaseBank.stats`, plus backend ones)."""
        self._check_open()
        total, positives, n = 0.0, 0, 0
        by_kind: dict[str, int] = {}
        by_env: dict[str | None, int] = {}
        for row in self._scan(["pos", "reward", "kind", "env"]):
            n += 1
            total += float(row["reward"])
            positives += float(row["reward"]) > 0
            by_kind[row["kind"]] = by_kind.get(row["kind"], 0) + 1
            by_env[row.get("env")] = by_env.get(row.get("env"), 0) + 1
        index_type, build = milvus_index(self.config.index.factory)
        files: dict[str, int] = {}
        if self._lite_dir is not None and self._lite_dir.exists():
            files[self._lite_dir.name] = sum(p.stat().st_size for p in self._lite_dir.rglob("*") if p.is_file())
        return {"path": self._name, "backend": "milvus", "uri": self.uri, "collection": self.collection,
                "cases": n, "dim": self.dim, "index": self.config.index.factory,
                "milvus_index": {"type": index_type, **build}, "index_trained": True, "index_ntotal": n,
                "reward_mean": total / n if n else None, "reward_positive": positives,
                "by_kind": dict(sorted(by_kind.items())),
                "by_env": dict(sorted(by_env.items(), key=lambda kv: (kv[0] is not None, kv[0] or ""))),
                "deleted": self.num_deleted,
                "encoder": None if self.config.encoder is None else to_dict(self.config.encoder), "files": files}

    # ------------------------------------------------------------------ search

    def search_positions(self, query: Any, k: int, *, env: str | None = None, kind: str | None = None,
                         positive: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Top-k by inner product: ``(scores_BK, positions_BK)``, -inf / -1 where fewer than k match."""
        scores_BK, positions_BK, _ = self._search(query, k, env=env, kind=kind, positive=positive, pad=True,
                                                  with_vectors=False)
        return scores_BK, positions_BK

    def _search(self, query: Any, k: int, *, env: str | None, kind: str | None, positive: bool, pad: bool,
                with_vectors: bool) -> tuple[np.ndarray, np.ndarray, list[list[Any]]]:
        self._check_open()
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise DataFormatError(f"k must be a positive integer, got {k!r}")
        q_BD = self._validate_query(query)
        width = int(k) if pad else min(int(k), max(self._count, 1))
        limit = min(width, self._count)
        if limit > _MAX_TOPK or len(q_BD) > _MAX_TOPK:
            raise DataFormatError(f"k={limit} for {len(q_BD)} queries: a Milvus search returns at most "
                                  f"{_MAX_TOPK} cases for at most {_MAX_TOPK} queries")
        scores_BK = np.full((len(q_BD), width), -np.inf, dtype=np.float32)
        positions_BK = np.full((len(q_BD), width), -1, dtype=np.int64)
        vectors: list[list[Any]] = [[] for _ in range(len(q_BD))]
        if limit == 0:
            return scores_BK, positions_BK, vectors
        for b, hits in enumerate(self._hits(q_BD, min(_MAX_TOPK, limit + self._twice), env=env, kind=kind,
                                            positive=positive, with_vectors=with_vectors)):
            seen: set[int] = set()
            j = 0
            for hit in hits:
                if int(hit["pos"]) in seen or j >= limit:  # a row held twice (see _count_rows)
                    continue
                seen.add(int(hit["pos"]))
                positions_BK[b, j] = int(hit["pos"])
                scores_BK[b, j] = float(hit["distance"])
                if with_vectors:
                    vectors[b].append(hit["entity"]["vector"])
                j += 1
        return scores_BK, positions_BK, vectors

    def search(self, query: Any, k: int, *, env: str | None = None, kind: str | None = None,
               positive: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Nearest cases by cosine, as :meth:`CaseBank.search`: ``(scores_K, ids_K)`` for one query (trimmed),
        ``(scores_BK, ids_BK)`` for a batch (padded with -inf and None)."""
        single = np.asarray(query).ndim == 1
        scores_BK, labels_BK, _ = self._search(query, k, env=env, kind=kind, positive=positive, pad=not single,
                                               with_vectors=False)
        self._ensure_loaded()
        ids_BK = np.empty(labels_BK.shape, dtype=object)
        for b, row in enumerate(labels_BK):
            for j, p in enumerate(row):
                ids_BK[b, j] = self._ids[p] if p >= 0 else None
        if single:
            valid = labels_BK[0] >= 0
            return scores_BK[0][valid], ids_BK[0][valid]
        return scores_BK, ids_BK

    def candidates(self, query_D: Any, c: int, *, env: str | None = None, kind: str | None = None,
                   positive: bool = False) -> Candidates:
        """The top-``c`` cases for one state with their stored vectors (returned by the search itself).

        ``positive``: only cases whose stored reward is > 0 (pushed down as ``reward > 0``)."""
        q = np.asarray(query_D)
        if q.ndim == 2 and q.shape[0] != 1 or q.ndim not in (1, 2):
            raise DimensionError(f"candidates takes one state [D], got shape {q.shape}")
        scores_BK, labels_BK, vectors = self._search(q.reshape(1, -1) if q.ndim == 1 else q, c, env=env, kind=kind,
                                                     positive=positive, pad=False, with_vectors=True)
        valid = labels_BK[0] >= 0
        positions_C = labels_BK[0][valid]
        embeddings_CD = (np.asarray(vectors[0], dtype=np.float32).reshape(len(positions_C), self.dim)
                         if len(positions_C) else np.zeros((0, self.dim), dtype=np.float32))
        return Candidates(ids=self.ids_at(positions_C), positions_C=positions_C, scores_C=scores_BK[0][valid],
                          embeddings_CD=embeddings_CD)

    def set_search_params(self, *, ef_search: int | None = None, nprobe: int | None = None) -> None:
        """Change the HNSW ``ef`` / IVF ``nprobe`` used by later searches (not saved)."""
        current = self.config.index
        index = IndexConfig(factory=current.factory, ef_search=current.ef_search if ef_search is None else ef_search,
                            nprobe=current.nprobe if nprobe is None else nprobe)
        self.config = BankConfig(dim=self.config.dim, index=index, encoder=self.config.encoder)

    # ------------------------------------------------------------------ refused: usage statistics, action vectors

    def _refuse(self, what: str) -> BankError:
        return BankError(f"{self._name}: a Milvus bank keeps no {what} (the Q-network's 'usage' and 'action' case "
                         "features need a directory bank)")

    def record_usage(self, step: int, ids: Sequence[str], reward: float) -> None:
        raise self._refuse("usage statistics")

    def usage_at(self, positions: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        raise self._refuse("usage statistics")

    def truncate_usage(self, step: int) -> int:
        raise self._refuse("usage statistics")

    def action_embeddings_at(self, positions: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        raise self._refuse("action vectors")

    def set_action_embeddings(self, positions: Sequence[int] | np.ndarray, embeddings: Any) -> None:
        raise self._refuse("action vectors")

    # ------------------------------------------------------------------ followers and lifetime

    def rows_on_disk(self) -> int:
        """How many rows the collection holds now."""
        self._check_open()
        return self._count_rows()

    def refresh(self) -> int:
        """Take in rows another process added since; returns how many (deletions are re-read)."""
        self._check_open()
        top = self.rows_on_disk()
        if top <= self._count:
            return 0
        added = top - self._count
        self._count = top
        self._loaded = False  # tombstones may have changed too
        return added

    def flush(self) -> None:
        """Seal the rows written since the last flush into an indexed segment (read-only: nothing)."""
        self._check_open()
        if not self.read_only:
            self._seal()

    def close(self) -> None:
        """Flush and disconnect. Safe to call twice."""
        if self._closed:
            return
        try:
            self.flush()
        finally:
            self._closed = True
            disconnect(self._client, self._lite_dir)


def _ensure_index(client: Any, collection: str, config: BankConfig) -> None:
    """Declare the vector index (when a crash after ``create_collection`` left none) and load the collection.

    ``sync=False``: pymilvus would otherwise poll the index state with a timestamp call Milvus Lite lacks."""
    if not client.list_indexes(collection):
        index_type, build = milvus_index(config.index.factory)
        index_params = client.prepare_index_params()
        index_params.add_index(field_name="vector", index_type=index_type, metric_type="IP", params=build)
        client.create_index(collection, index_params, sync=False)
    client.load_collection(collection)


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
    """Drop a bank's collection (a failed copy's destination); with ``remove_lite_file``, also the Milvus Lite
    file when it holds no other collection."""
    options = options or MilvusOptions()
    client, lite_dir = MilvusBank.connect(uri, options=options, must_exist=False)
    try:
        if client.has_collection(collection):
            client.drop_collection(collection)
        others = client.list_collections()
    finally:
        disconnect(client, lite_dir)
    if remove_lite_file and lite_dir is not None and not others and lite_dir not in _LiteUsers.count:
        _remove_tree(lite_dir)


def lite_dir_of(uri: str) -> Path | None:
    """The Milvus Lite directory a ``milvus:`` URI names, or None for a server."""
    return Path(uri).expanduser().resolve() if uri.endswith(".db") and "://" not in uri else None

