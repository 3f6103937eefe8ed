"""The vector index of a Milvus bank (:mod:`memento.bank.milvus`): :class:`MilvusVectors` (top-k searches with the
env/kind/positive/deleted filters pushed down, the stored vectors), :func:`milvus_index` (a faiss factory string as
a Milvus index), the index's declaration and the collection's load, and the repair of the torn index files a
killed Milvus Lite leaves (:func:`load_collection`).
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from memento.bank.milvusconn import milvus_message
from memento.bank.milvusrows import MAX_TOPK, MilvusRows, filter_expression
from memento.bank.parts import Filter, NewRow
from memento.config import BankConfig, IndexConfig
from memento.errors import BankError, ConfigError, DataFormatError

__all__ = ["MilvusVectors", "declare_index", "ensure_index", "load_collection", "milvus_index"]

logger = logging.getLogger("memento.bank.milvus")  # a Milvus bank's log lines, wherever its code lives


def milvus_index(factory: str) -> tuple[str, dict[str, Any]]:
    """The Milvus index type and build parameters for a faiss factory string (see "Index and flush" in
    :mod:`memento.bank.milvus`)."""
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


class MilvusVectors:
    """The vector index of a Milvus bank: the collection's ``vector`` field and its Milvus index; filters become
    a Milvus filter expression (``deleted == false and env == ... and reward > 0``)."""

    def __init__(self, rows: MilvusRows, config: BankConfig):
        self._rows = rows
        self.config = config

    def added(self, rows: Sequence[NewRow]) -> None:
        """Nothing: the row store's insert wrote the vectors."""

    def _filter(self, where: Filter) -> str:
        return filter_expression(self._rows, where)

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
        if k > MAX_TOPK or len(q_BD) > MAX_TOPK:
            raise DataFormatError(f"k={k} for {len(q_BD)} queries: a Milvus search returns at most "
                                  f"{MAX_TOPK} cases for at most {MAX_TOPK} queries")
        scores_BK = np.full((len(q_BD), k), -np.inf, dtype=np.float32)
        positions_BK = np.full((len(q_BD), k), -1, dtype=np.int64)
        vectors_BKD = np.zeros((len(q_BD), k, self.config.dim), dtype=np.float32) if with_vectors else None
        fetch = min(MAX_TOPK, k + self._rows.twice)
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


def declare_index(client: Any, collection: str, index_type: str, build: dict[str, Any],
                   field: str = "vector", *, lite_dir: Path | None = None, label: str = "",
                   repair: bool = True) -> None:
    """Declare the vector index (when a crash after ``create_collection`` left none) and load the collection
    (:func:`load_collection`: a Milvus Lite collection's torn index files are repaired first).

    ``sync=False``: pymilvus would otherwise poll the index state with a timestamp call Milvus Lite lacks."""
    if not client.list_indexes(collection):
        index_params = client.prepare_index_params()
        index_params.add_index(field_name=field, index_type=index_type, metric_type="IP", params=build)
        client.create_index(collection, index_params, sync=False)
    load_collection(client, collection, lite_dir=lite_dir, label=label or collection, repair=repair)


def ensure_index(client: Any, collection: str, config: BankConfig, *, lite_dir: Path | None = None,
                  name: str = "", repair: bool = True) -> None:
    """The bank collection's vector index (:func:`milvus_index` of its factory), declared if missing, and loaded."""
    declare_index(client, collection, *milvus_index(config.index.factory), lite_dir=lite_dir, label=name,
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
        return f"unreadable by faiss ({milvus_message(error)[:120]})"
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
        return f"unreadable ({milvus_message(error)[:120]})"
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


def load_collection(client: Any, collection: str, *, lite_dir: Path | None, label: str, repair: bool) -> None:
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
