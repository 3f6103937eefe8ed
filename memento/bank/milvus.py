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
collection then fails to load on every open). Loading a Milvus Lite collection
(:func:`memento.bank.milvusindex.load_collection`) first removes its index files that are torn (one warning line
naming them; never a data, manifest, log or schema file), and milvus-lite rebuilds them from the segments' data; a
read-only open refuses with one line instead.

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
import time
import uuid
from pathlib import Path
from typing import Any

from memento.bank.front import BankFront
from memento.bank.local import BANK_FORMAT, BANK_FORMAT_VERSION
from memento.bank.milvusconn import (
    LiteUsers,
    MilvusOptions,
    connect,
    disconnect,
    import_pymilvus,
    lite_dir_of,
    milvus_message,
    remove_tree,
)
from memento.bank.milvusfeatures import MilvusFeatures
from memento.bank.milvusindex import MilvusVectors, ensure_index, milvus_index
from memento.bank.milvusrows import (
    ACTIONS_SUFFIX,
    ATTRS_FIELD,
    DEFAULT_COLLECTION,
    EVIDENCE_SUFFIX,
    HISTORY_SUFFIX,
    MAX_ID_BYTES,
    MAX_TEXT_BYTES,
    PROPERTY_PREFIX,
    SCOPE_COLUMNS,
    USAGE_SUFFIX,
    MilvusRows,
    utf8_len,
)
from memento.bank.parts import case_meta_json
from memento.config import BankConfig, EncoderConfig, IndexConfig, from_dict, to_dict
from memento.errors import BankError, DataFormatError, DimensionError, MementoError, NotABankError
from memento.types import SCOPE_FIELDS, Case

__all__ = ["ACTIONS_SUFFIX", "DEFAULT_COLLECTION", "EVIDENCE_SUFFIX", "HISTORY_SUFFIX", "USAGE_SUFFIX", "MilvusBank",
           "MilvusFeatures", "MilvusOptions", "MilvusRows", "MilvusVectors", "disconnect", "drop_milvus_bank",
           "lite_dir_of", "milvus_index"]

logger = logging.getLogger(__name__)


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
            if utf8_len(getattr(case, field)) > MAX_TEXT_BYTES:
                raise DataFormatError(f"case {i}: {field} is {utf8_len(getattr(case, field))} bytes; a Milvus bank "
                                      f"holds at most {MAX_TEXT_BYTES}")
        for field in ("env", "kind", *SCOPE_FIELDS):
            value = getattr(case, field)
            if value is not None and utf8_len(value) > MAX_ID_BYTES:
                raise DataFormatError(f"case {i}: {field} is longer than {MAX_ID_BYTES} bytes")
        if case.id is not None and utf8_len(case.id) > MAX_ID_BYTES:
            raise DataFormatError(f"case {i}: id is longer than {MAX_ID_BYTES} bytes")
        if utf8_len(case_meta_json(case)) > MAX_TEXT_BYTES:
            raise DataFormatError(f"case {i}: meta is more than {MAX_TEXT_BYTES} bytes of JSON")

    connect = staticmethod(connect)  # a MilvusClient and the Lite directory (memento.bank.milvusconn.connect)

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
            pymilvus = import_pymilvus()
            DataType = pymilvus.DataType
            schema = pymilvus.MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
            schema.add_field("pos", DataType.INT64, is_primary=True)
            schema.add_field("id", DataType.VARCHAR, max_length=MAX_ID_BYTES)
            schema.add_field("hash", DataType.VARCHAR, max_length=64)
            schema.add_field("state", DataType.VARCHAR, max_length=MAX_TEXT_BYTES)
            schema.add_field("action", DataType.VARCHAR, max_length=MAX_TEXT_BYTES)
            schema.add_field("reward", DataType.DOUBLE)
            schema.add_field("env", DataType.VARCHAR, max_length=MAX_ID_BYTES, nullable=True)
            schema.add_field("kind", DataType.VARCHAR, max_length=MAX_ID_BYTES)
            schema.add_field("meta", DataType.VARCHAR, max_length=MAX_TEXT_BYTES)
            schema.add_field(ATTRS_FIELD, DataType.JSON)
            for field in SCOPE_COLUMNS:
                schema.add_field(field, DataType.VARCHAR, max_length=MAX_ID_BYTES, nullable=True)
            schema.add_field("created", DataType.DOUBLE)
            schema.add_field("deleted", DataType.BOOL)
            schema.add_field("deleted_at", DataType.DOUBLE)
            schema.add_field("replaced_by", DataType.VARCHAR, max_length=MAX_ID_BYTES)
            schema.add_field("version", DataType.INT64, nullable=True)  # null: 1
            schema.add_field("updated", DataType.DOUBLE, nullable=True)  # null: created
            schema.add_field("vector", DataType.FLOAT_VECTOR, dim=dim)
            uid = uuid.uuid4().hex
            prop = PROPERTY_PREFIX
            properties = {f"{prop}format": BANK_FORMAT, f"{prop}format_version": str(BANK_FORMAT_VERSION),
                          f"{prop}uid": uid, f"{prop}config": json.dumps(to_dict(config), sort_keys=True),
                          f"{prop}created": repr(time.time()), f"{prop}committed": "0"}
            client.create_collection(collection, schema=schema, consistency_level="Strong", properties=properties)
            ensure_index(client, collection, config)
        except BankError:
            raise
        except Exception as error:
            disconnect(client, lite_dir)
            if lite_new and lite_dir is not None:
                remove_tree(lite_dir)
            raise BankError(f"{name}: cannot create the collection: {milvus_message(error)}") from None
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
            if props.get(f"{PROPERTY_PREFIX}format") != BANK_FORMAT:
                raise NotABankError(f"{name}: not a case bank (the collection has no memento properties)")
            version = int(props.get(f"{PROPERTY_PREFIX}format_version", "0"))
            if version > BANK_FORMAT_VERSION:
                raise BankError(f"{name}: bank format version {version} is newer than this memento reads "
                                f"({BANK_FORMAT_VERSION}); upgrade memento")
            config = from_dict(BankConfig, json.loads(props[f"{PROPERTY_PREFIX}config"]))
            if dim is not None and dim != config.dim:
                raise DimensionError(f"{name}: bank holds dim={config.dim} vectors, but dim={dim} was expected "
                                     "(was it made with another encoder?)")
            if encoder is not None and config.encoder is not None and encoder_id(encoder) != encoder_id(
                    config.encoder):
                raise BankError(f"{name}: bank was filled by encoder {encoder_id(config.encoder)}, not "
                                f"{encoder_id(encoder)}")
            if index is not None:
                if index.factory != config.index.factory:
                    raise BankError(f"{name}: bank index is {config.index.factory!r}, not {index.factory!r}")
                config = dataclasses.replace(config, index=index)
            ensure_index(client, collection, config, lite_dir=lite_dir, name=name, repair=not read_only)
        except MementoError:
            disconnect(client, lite_dir)
            raise
        except Exception as error:
            disconnect(client, lite_dir)
            raise BankError(f"{name}: cannot open: {milvus_message(error)}") from None
        bank = cls(client, uri=uri, collection=collection, name=name, config=config, uid=props[f"{PROPERTY_PREFIX}uid"],
                   lite_dir=lite_dir, options=options, read_only=read_only, audit=audit)
        return bank


def encoder_id(config: EncoderConfig) -> str:
    model = config.model if config.model is not None else "all-MiniLM-L6-v2 (bundled)"
    return f"{model} (pooling {config.pooling})"


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
    if remove_lite_file and lite_dir is not None and not others and lite_dir not in LiteUsers.count:
        remove_tree(lite_dir)
