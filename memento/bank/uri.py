"""One way to name a case bank everywhere a bank is accepted: a directory path, or ``milvus:URI[#collection]``.

- ``runs/bank`` (any path; a :class:`pathlib.Path` always is one): a directory bank (:class:`CaseBank`), the
  default backend;
- ``milvus:./bank.db``: a Milvus Lite file (in-process, no server), collection ``memento_cases``;
- ``milvus:http://host:19530#cases``: the collection ``cases`` on a Milvus server (``https://`` too). What
  follows ``milvus:`` is what ``pymilvus.MilvusClient`` takes as its ``uri``.

Any other scheme (``s3:``, ``sqlite:``...) is one line of error, as are an unreachable server (given up after
``MilvusOptions.connect_timeout_s``), a missing ``milvus`` extra, and a bank of another dimension or encoder.
(A directory whose name looks like ``scheme:rest`` is written ``./scheme:rest``.)
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any, Literal

from memento.bank.local import DB_NAME, CaseBank
from memento.bank.protocol import Bank
from memento.config import EncoderConfig, IndexConfig, VectorStore
from memento.errors import BankError, ConfigError
from memento.types import shown

__all__ = ["BankBackend", "BankLocation", "bank_exists", "copy_bank", "create_bank", "open_bank",
           "parse_bank_uri"]

logger = logging.getLogger(__name__)

BankBackend = Literal["dir", "milvus"]
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):")
_COLLECTION = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,254}$")
_SERVER_SCHEMES = ("http://", "https://", "tcp://", "unix:")
_COPY_BATCH = 1000


@dataclasses.dataclass(frozen=True, kw_only=True)
class BankLocation:
    """Where a bank lives: ``backend`` ``"dir"`` with ``path``, or ``"milvus"`` with ``uri`` and ``collection``."""

    backend: BankBackend
    text: str
    path: Path | None = None
    uri: str | None = None
    collection: str | None = None

    @property
    def lite(self) -> bool:
        """A Milvus Lite file (not a server)."""
        return self.backend == "milvus" and self.uri is not None and not self.uri.startswith(_SERVER_SCHEMES)

    def __str__(self) -> str:
        return self.text


def parse_bank_uri(text: str | Path) -> BankLocation:
    """Read a bank's name (see the module docstring); a malformed one raises ``BankError`` (one line)."""
    if isinstance(text, Path):
        return BankLocation(backend="dir", text=str(text), path=text)
    if not isinstance(text, str) or not text.strip():
        raise BankError(f"a bank is a directory path or milvus:URI[#collection], got {text!r}")
    match = _SCHEME.match(text)
    if match is None:
        return BankLocation(backend="dir", text=text, path=Path(text))
    scheme = match.group(1).lower()
    if scheme != "milvus":
        raise BankError(f"{text}: unknown bank scheme {scheme + ':'!r}; a bank is a directory path or "
                        "milvus:URI[#collection] (milvus:./bank.db, milvus:http://host:19530#cases)")
    rest = text[match.end():]
    uri, _, collection = rest.partition("#") if "#" in rest else (rest, "", "")
    from memento.bank.milvus import DEFAULT_COLLECTION

    collection = collection or DEFAULT_COLLECTION
    if not uri:
        raise BankError(f"{text}: no URI after 'milvus:' (milvus:./bank.db or milvus:http://host:19530)")
    if not _COLLECTION.match(collection):
        raise BankError(f"{text}: collection {collection!r} is not a Milvus name (a letter or _, then letters, "
                        "digits, _; at most 255)")
    if not uri.startswith(_SERVER_SCHEMES) and not uri.endswith(".db"):
        raise BankError(f"{text}: a Milvus Lite file ends in .db (milvus:./bank.db); a server is "
                        "milvus:http://host:19530")
    return BankLocation(backend="milvus", text=text, uri=uri, collection=collection)


def bank_name(text: str | Path) -> Path | str:
    """A bank's name as a run keeps it: a directory's :class:`~pathlib.Path`, or a Milvus bank's ``milvus:...``
    text unchanged (a ``Path`` would fold ``http://`` into ``http:/``); a malformed name raises ``BankError``."""
    where = parse_bank_uri(text)
    return where.path if where.backend == "dir" and where.path is not None else where.text


def _options(options: Any | None) -> Any:
    from memento.bank.milvus import MilvusOptions

    return options if options is not None else MilvusOptions()


def _check_encoder(bank: Bank, encoder: EncoderConfig | None) -> None:
    recorded = bank.config.encoder
    if encoder is None or recorded is None:
        return
    if (encoder.model, encoder.pooling) != (recorded.model, recorded.pooling):
        from memento.bank.milvus import encoder_id

        bank.close()
        raise BankError(f"{bank.path}: bank was filled by encoder {encoder_id(recorded)}, not {encoder_id(encoder)}")


def open_bank(uri: str | Path | BankLocation, *, dim: int | None = None, encoder: EncoderConfig | None = None,
              read_only: bool = False, index: IndexConfig | None = None, use_gpu: bool | None = None, seed: int = 0,
              options: Any | None = None, audit: bool = False) -> Bank:
    """Open the bank named ``uri``; ``dim``/``encoder``, when given, must be the bank's (one-line errors).

    ``use_gpu``/``seed`` are a directory bank's (its faiss index); ``options`` a Milvus bank's
    (:class:`memento.bank.milvus.MilvusOptions`: connect timeout, flush policy). ``audit``: a deleted case's
    history keeps its values (:mod:`memento.bank.history`)."""
    where = uri if isinstance(uri, BankLocation) else parse_bank_uri(uri)
    if where.backend == "dir":
        assert where.path is not None
        bank: Bank = CaseBank.open(where.path, dim=dim, use_gpu=use_gpu, seed=seed, index=index,
                                   read_only=read_only, audit=audit)
        _check_encoder(bank, encoder)
        return bank
    from memento.bank.milvus import MilvusBank

    assert where.uri is not None and where.collection is not None
    return MilvusBank.open(where.uri, collection=where.collection, dim=dim, encoder=encoder, index=index,
                           read_only=read_only, options=_options(options), audit=audit)


def create_bank(uri: str | Path | BankLocation, dim: int, index: str | IndexConfig = "Flat", *,
                encoder: EncoderConfig | None = None, exist_ok: bool = False, use_gpu: bool | None = None,
                seed: int = 0, options: Any | None = None, vectors: VectorStore = "ram", audit: bool = False) -> Bank:
    """Create an empty bank named ``uri`` for ``dim``-dimensional unit vectors (see :meth:`CaseBank.create`).
    ``vectors="disk"`` (a directory bank's setting) keeps the vectors in a memory-mapped file, not in RAM."""
    where = uri if isinstance(uri, BankLocation) else parse_bank_uri(uri)
    if where.backend == "dir":
        assert where.path is not None
        return CaseBank.create(where.path, dim, index=index, encoder=encoder, exist_ok=exist_ok, use_gpu=use_gpu,
                               seed=seed, vectors=vectors, audit=audit)
    if vectors != "ram":
        raise ConfigError(f"vectors={shown(vectors, 40)}: a Milvus bank keeps its vectors in Milvus; "
                          "vectors='disk' is a directory bank's setting")
    from memento.bank.milvus import MilvusBank

    assert where.uri is not None and where.collection is not None
    return MilvusBank.create(where.uri, dim, index, collection=where.collection, encoder=encoder,
                             exist_ok=exist_ok, options=_options(options), audit=audit)


def bank_exists(uri: str | Path | BankLocation, *, options: Any | None = None) -> bool:
    """Whether a bank is stored at ``uri`` (a directory with a bank, or an existing collection). Creates nothing."""
    where = uri if isinstance(uri, BankLocation) else parse_bank_uri(uri)
    if where.backend == "dir":
        assert where.path is not None
        return (where.path / DB_NAME).is_file()
    from memento.bank.milvus import MilvusBank, disconnect, lite_dir_of

    assert where.uri is not None
    lite = lite_dir_of(where.uri)
    if lite is not None and not lite.exists():
        return False
    client, lite_dir = MilvusBank.connect(where.uri, options=_options(options), must_exist=lite is not None)
    try:
        return bool(client.has_collection(where.collection))
    finally:
        disconnect(client, lite_dir)


def copy_bank(src: str | Path | BankLocation, dst: str | Path | BankLocation, *, index: str | None = None,
              options: Any | None = None) -> int:
    """Copy the bank ``src`` to a new bank ``dst`` (any two backends); returns the rows copied.

    Every row keeps its position, id, state, action, reward, env, kind, meta, scope, creation time, version,
    update time and vector (float32, bit for bit); deleted cases are copied and deleted again, so positions (the
    faiss labels, the Milvus primary keys) are the same on both sides. The copy is a new bank (its own uid). Not
    copied: a bank's usage statistics and action vectors, its cases' history of updates, and which case replaced
    a deleted one.

    ``dst`` must not hold a bank. On any error nothing is left at ``dst``: a directory is built beside it and
    renamed into place at the end; a Milvus collection is dropped (and a Milvus Lite file this call made,
    removed). ``index``: the destination's index factory (default: the source's)."""
    source = src if isinstance(src, BankLocation) else parse_bank_uri(src)
    target = dst if isinstance(dst, BankLocation) else parse_bank_uri(dst)
    if (source.backend, source.path and source.path.resolve(), source.uri, source.collection) == (
            target.backend, target.path and target.path.resolve(), target.uri, target.collection):
        raise BankError(f"{target}: the source and the destination are the same bank")
    opts = _options(options) if source.backend == "milvus" or target.backend == "milvus" else None
    if bank_exists(target, options=opts):
        raise BankError(f"{target}: already holds a bank; copy writes a new one")
    if target.backend == "dir":
        assert target.path is not None
        if target.path.exists() and (not target.path.is_dir() or any(target.path.iterdir())):
            raise BankError(f"{target}: exists and is not an empty directory")
    with open_bank(source, read_only=True, options=opts) as bank:
        factory = index or bank.config.index.factory
        if target.backend == "milvus":
            from memento.bank.milvus import milvus_index

            milvus_index(factory)  # a factory Milvus has no index for: one line, before anything is written
        if target.backend == "dir":
            assert target.path is not None
            work = target.path.with_name(f".{target.path.name}.copy-{os.getpid()}")
            shutil.rmtree(work, ignore_errors=True)
            try:
                n = _copy_rows(bank, create_bank(work, bank.dim, factory, encoder=bank.config.encoder,
                                                 vectors=bank.config.vectors))
                if target.path.exists():
                    target.path.rmdir()  # empty, checked above
                os.replace(work, target.path)
            finally:
                shutil.rmtree(work, ignore_errors=True)
        else:
            from memento.bank.milvus import drop_milvus_bank, lite_dir_of

            assert target.uri is not None and target.collection is not None
            lite = lite_dir_of(target.uri)
            lite_new = lite is not None and not lite.exists()
            try:
                n = _copy_rows(bank, create_bank(target, bank.dim, factory, encoder=bank.config.encoder,
                                                 options=opts))
            except BaseException:
                try:
                    drop_milvus_bank(target.uri, target.collection, options=opts, remove_lite_file=lite_new)
                except Exception as error:  # the copy's own error is the one to show
                    logger.warning("%s: could not remove the partial copy: %s", target, error)
                raise
    logger.info("copied %d row(s) from %s to %s", n, source, target)
    return n


def _copy_rows(src: Bank, dst: Bank) -> int:
    """Every row of ``src`` into the empty ``dst`` at the same positions, then the same deletions; closes ``dst``."""
    with dst:
        total = len(src)
        for start in range(0, total, _COPY_BATCH):
            positions = list(range(start, min(total, start + _COPY_BATCH)))
            ids = src.ids_at(positions)
            dst.add(src.get(ids, include_deleted=True), src.embeddings_at(positions), allow_duplicates=True)
        dead = src.deleted_ids()
        if dead:
            dst.delete(dead)
        if len(dst) != total:
            raise BankError(f"{dst.path}: copied {len(dst)} row(s) of {total}")
    return total


def describe_backends() -> str:
    """One line for --help texts."""
    return "a directory, or milvus:FILE.db / milvus:http://host:19530 with an optional #collection"

