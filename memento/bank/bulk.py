"""Bulk import of cases whose embeddings are already computed (``memento bank import FILE --embeddings VECS``).

The vectors come from a ``.npy`` file or a ``.safetensors`` file with one ``[N, D]`` float tensor (F16, F32 or
F64; its header parsed here, with bounds), both memory-mapped: the import never holds them all, and no step makes
an ``[N, D]`` array (the checks read at most 64 MiB of rows at a time); row ``i`` is the embedding of the case on
the file's ``i``-th line. Everything is checked before the bank is touched: the shapes, every vector (finite,
unit-norm) and the ids. Then:

- an index that needs training (IVF, PQ) is trained once on a sample drawn from the whole file
  (:meth:`memento.bank.local.CaseBank.train_index`), so every later chunk is only encoded and added;
- the cases are added ``chunk`` at a time (fewer when ``chunk`` rows of float32 vectors would pass 256 MiB), each
  chunk in one transaction: a kill leaves whole chunks, never part of one, and running the same import again
  skips the cases already stored (their content is in the bank) and adds the rest. (With ``allow_duplicates``
  nothing is skipped, so a second run stores the first run's cases again.)

A progress bar (tqdm, on stderr when it is a terminal) counts the cases.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from memento.bank.local import CaseBank
from memento.bank.mapped import CHECK_BYTES, release_pages, rows_per
from memento.bank.parts import check_embedding_shape, check_unit_rows
from memento.config import MAX_DIM
from memento.errors import DataFormatError, DimensionError
from memento.io import loads_json
from memento.types import Case, shown

__all__ = ["DEFAULT_CHUNK", "check_embeddings", "import_with_embeddings", "read_embeddings"]

logger = logging.getLogger(__name__)

DEFAULT_CHUNK = 50_000
_ADD_BYTES = 256 << 20
"""At most this many bytes of float32 vectors go into one transaction: ``chunk`` is cut to fit (at least one row)."""
_MAX_HEADER = 100 << 20
"""The longest safetensors header read (the format's own bound)."""
_SAFETENSORS_DTYPES = {"F16": "<f2", "F32": "<f4", "F64": "<f8"}
_ACCEPTED = "F16, F32 or F64"


def read_embeddings(path: str | Path) -> np.ndarray:
    """The ``[N, D]`` vectors of a ``.npy`` file or of a ``.safetensors`` file holding one tensor, as a read-only
    memory map (only the rows read are in memory); ``D`` is at most :data:`memento.config.MAX_DIM`. Anything
    else (a damaged header, a dtype that is not a float, data the file does not hold...) raises one
    ``DataFormatError`` line naming the file; nothing else is raised."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".npy", ".safetensors"):
        raise DataFormatError(f"{path}: embeddings must be a .npy or .safetensors file")
    if not path.is_file():
        raise DataFormatError(f"{path}: no such file")
    vectors = _read_npy(path) if suffix == ".npy" else _read_safetensors(path)
    if vectors.ndim != 2 or not np.issubdtype(vectors.dtype, np.floating):
        raise DataFormatError(f"{path}: expected a 2-D float array [cases, dim], got shape {tuple(vectors.shape)} "
                              f"dtype {vectors.dtype}")
    _check_dim(path, int(vectors.shape[1]))
    return vectors


def _check_dim(path: Path, dim: int) -> None:
    if not 1 <= dim <= MAX_DIM:
        raise DataFormatError(f"{path}: vectors of dim {dim}; a bank holds vectors of dim 1..{MAX_DIM}")


def _read_npy(path: Path) -> np.ndarray:
    """A ``.npy`` file memory-mapped (numpy parses its header: a pickled or damaged one is refused)."""
    try:
        vectors = np.load(path, mmap_mode="r", allow_pickle=False)
    except Exception as error:  # noqa: BLE001 - numpy's header parser (ast, tokenize) and np.memmap raise many types
        # on a damaged header: ValueError, EOFError, OSError, SyntaxError, tokenize.TokenError, OverflowError...
        detail = " ".join(str(error).split())[:160] or type(error).__name__
        raise DataFormatError(f"{path}: not a readable .npy array ({detail})") from None
    if not isinstance(vectors, np.ndarray):
        raise DataFormatError(f"{path}: not a readable .npy array (no array in it)")
    if vectors.ndim == 2 and not vectors.flags.c_contiguous:
        raise DataFormatError(f"{path}: a Fortran-ordered (column-major) array of shape {tuple(vectors.shape)}; "
                              "its rows cannot be read one chunk at a time: save it row-major "
                              "(np.save(path, np.ascontiguousarray(vectors)))")
    return vectors


def _header_problem(header: Any) -> str | tuple[str, dict[str, Any]]:
    """The one tensor's name and entry of a parsed safetensors header, or what is wrong with the header."""
    if not isinstance(header, dict):
        return f"the header is a JSON {type(header).__name__}, not an object"
    metadata = header.get("__metadata__")
    if metadata is not None and not isinstance(metadata, dict):
        return f"__metadata__ is a JSON {type(metadata).__name__}, not an object"
    tensors = {name: entry for name, entry in header.items() if name != "__metadata__"}
    if len(tensors) != 1:
        names = ", ".join(shown(name) for name in sorted(tensors)[:5])
        return f"expected one tensor, found {len(tensors)}{f' ({names})' if tensors else ''}"
    [(name, entry)] = tensors.items()
    if not isinstance(entry, dict):
        return f"tensor {shown(name)}: its entry is a JSON {type(entry).__name__}, not an object"
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str):
        return f"tensor {shown(name)}: no dtype"
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        return f"tensor {shown(name)}: shape {shown(shape)} is not a list of sizes"
    if (not isinstance(offsets, list) or len(offsets) != 2 or not all(type(o) is int for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]):
        return f"tensor {shown(name)}: data_offsets {shown(offsets)} are not [begin, end] with 0 <= begin <= end"
    return name, entry


def _read_safetensors(path: Path) -> np.ndarray:
    """The one tensor of a ``.safetensors`` file, memory-mapped read-only. The header (an 8-byte little-endian
    length N, then N bytes of JSON ``{name: {dtype, shape, data_offsets}, "__metadata__"?: {...}}``) is parsed
    here with bounds (N <= min(file size - 8, 100 MB)), so a file is never read whole."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            prefix = handle.read(8)
            if len(prefix) < 8:
                raise DataFormatError(f"{path}: not a safetensors file ({size} bytes: no 8-byte header length)")
            (length,) = struct.unpack("<Q", prefix)
            limit = min(size - 8, _MAX_HEADER)
            if length > limit:
                raise DataFormatError(f"{path}: not a safetensors file (header length {length} bytes; the file holds "
                                      f"{size - 8} bytes after it, and a header is at most {_MAX_HEADER})")
            raw = handle.read(length)
    except OSError as error:
        raise DataFormatError(f"{path}: cannot read ({error.strerror or error})") from None
    if len(raw) != length:
        raise DataFormatError(f"{path}: not a safetensors file (header cut short: {len(raw)} of {length} bytes)")
    try:
        header = loads_json(raw)
    except DataFormatError as error:
        raise DataFormatError(f"{path}: not a safetensors file (header: {error.reason})") from None
    found = _header_problem(header)
    if isinstance(found, str):
        raise DataFormatError(f"{path}: not a safetensors file of one tensor ({found})")
    name, entry = found
    dtype, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
    where = f"{path}: tensor {shown(name)}"
    if dtype == "BF16":
        raise DataFormatError(f"{where} is bfloat16 (BF16), which numpy cannot read: convert it to float32 or "
                              "float16 (tensor.float() or tensor.half()) and save it again")
    if dtype not in _SAFETENSORS_DTYPES:
        raise DataFormatError(f"{where} has dtype {shown(dtype)}; embeddings must be {_ACCEPTED}")
    if len(shape) != 2:
        raise DataFormatError(f"{where}: expected a 2-D tensor [cases, dim], got shape {tuple(shape)}")
    rows, dim = shape
    _check_dim(path, dim)
    kind = np.dtype(_SAFETENSORS_DTYPES[dtype])
    data = size - 8 - length
    if rows * dim * kind.itemsize != end - begin:
        raise DataFormatError(f"{where}: shape {tuple(shape)} of {dtype} is {rows * dim * kind.itemsize} bytes, "
                              f"its data_offsets [{begin}, {end}] span {end - begin}")
    if begin != 0 or end != data:
        raise DataFormatError(f"{where}: data_offsets [{begin}, {end}] do not cover the {data} data bytes the file "
                              "holds after its header (truncated, or bytes beside the tensor)")
    if rows == 0:  # np.memmap cannot map nothing
        empty = np.zeros((0, dim), dtype=kind)
        empty.flags.writeable = False
        return empty
    try:
        return np.memmap(path, dtype=kind, mode="r", offset=8 + length, shape=(rows, dim))
    except (ValueError, OSError) as error:
        raise DataFormatError(f"{path}: cannot map its tensor ({' '.join(str(error).split())[:160]})") from None


def _check_shape(vectors_ND: np.ndarray, n: int, dim: int, where: str) -> None:
    try:
        check_embedding_shape(vectors_ND.shape, n, dim)
    except DimensionError as error:
        raise DimensionError(f"{where}: {error}") from None


def check_embeddings(vectors_ND: np.ndarray, n: int, dim: int, where: str) -> None:
    """``vectors_ND`` is ``[n, dim]``, finite and unit-norm (read at most 64 MiB of float32 at a time, checked as
    :meth:`memento.bank.front.BankFront.add` checks them); one ``DimensionError`` or ``DataFormatError`` naming
    ``where`` and the first bad row otherwise."""
    _check_shape(vectors_ND, n, dim, where)
    step = rows_per(CHECK_BYTES, dim)
    for start in range(0, n, step):
        with np.errstate(over="ignore", invalid="ignore"):  # a float64 beyond float32 becomes inf: reported below
            chunk = np.asarray(vectors_ND[start:start + step], dtype=np.float32)
        try:
            check_unit_rows(chunk, start=start)
        except DataFormatError as error:
            raise DataFormatError(f"{where}: {error}") from None
        release_pages(vectors_ND)


def import_with_embeddings(bank: Any, cases: Sequence[Case], vectors_ND: np.ndarray, *,
                           allow_duplicates: bool = False, chunk: int = DEFAULT_CHUNK,
                           progress: bool | None = None, where: str = "embeddings", checked: bool = False) -> int:
    """Add ``cases`` with their vectors ``[N, D]`` to ``bank``, ``chunk`` cases per transaction, after training
    its index on a sample of all of them (see the module docstring); returns the cases added. The vectors are
    checked first (:func:`check_embeddings`); ``checked``: they were, only their shape is."""
    from tqdm.auto import tqdm

    if checked:
        _check_shape(vectors_ND, len(cases), bank.dim, where)
    else:
        check_embeddings(vectors_ND, len(cases), bank.dim, where)
    if isinstance(bank, CaseBank) and bank.train_index(vectors_ND):
        logger.info("%s: index trained on a sample of the %d imported vectors", bank.path, len(cases))
    per_add = rows_per(_ADD_BYTES, bank.dim)
    if chunk > per_add:  # never an [N, D] float32 copy of more than _ADD_BYTES, whatever the width
        logger.info("%s: %d cases per transaction (at most %d MiB of dim=%d vectors), not %d", where, per_add,
                    _ADD_BYTES >> 20, bank.dim, chunk)
        chunk = per_add
    before = len(bank)
    with tqdm(total=len(cases), desc="import", unit="case", disable=progress is False or None) as bar:
        for start in range(0, len(cases), chunk):
            stop = min(start + chunk, len(cases))
            bank.add(cases[start:stop], np.asarray(vectors_ND[start:stop], dtype=np.float32),
                     allow_duplicates=allow_duplicates)
            bar.update(stop - start)
    return len(bank) - before
