"""Bulk import of cases whose embeddings are already computed (``memento bank import FILE --embeddings VECS``).

The vectors come from a ``.npy`` file (memory-mapped: the import never holds them all) or a ``.safetensors`` file
with one ``[N, D]`` tensor; row ``i`` is the embedding of the case on the file's ``i``-th line. Everything is
checked before the bank is touched: the shapes, every vector (finite, unit-norm) and the ids. Then:

- an index that needs training (IVF, PQ) is trained once on a sample drawn from the whole file
  (:meth:`memento.memory.bank.CaseBank.train_index`), so every later chunk is only encoded and added;
- the cases are added ``chunk`` at a time, each chunk in one transaction: a kill leaves whole chunks, never part of
  one, and running the same import again skips the cases already stored (their content is in the bank) and adds
  the rest. (With ``allow_duplicates`` nothing is skipped, so a second run stores the first run's cases again.)

A progress bar (tqdm, on stderr when it is a terminal) counts the cases.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from memento.errors import DataFormatError, DimensionError
from memento.memory.front import check_embedding_shape, check_unit_rows
from memento.types import Case

__all__ = ["DEFAULT_CHUNK", "check_embeddings", "import_with_embeddings", "read_embeddings"]

logger = logging.getLogger(__name__)

DEFAULT_CHUNK = 50_000
_CHECK_CHUNK = 65_536


def read_embeddings(path: str | Path) -> np.ndarray:
    """The ``[N, D]`` vectors of a ``.npy`` file (memory-mapped) or a ``.safetensors`` file holding one tensor;
    anything else raises ``DataFormatError`` naming the file."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".npy", ".safetensors"):
        raise DataFormatError(f"{path}: embeddings must be a .npy or .safetensors file")
    if not path.is_file():
        raise DataFormatError(f"{path}: no such file")
    try:
        if suffix == ".npy":
            vectors = np.load(path, mmap_mode="r", allow_pickle=False)
        else:
            from safetensors.numpy import load_file

            tensors = load_file(str(path))
            if len(tensors) != 1:
                raise DataFormatError(f"{path}: expected one tensor, found {len(tensors)} ({sorted(tensors)[:5]})")
            [vectors] = tensors.values()
    except (ValueError, OSError, EOFError) as error:
        raise DataFormatError(f"{path}: not a readable {suffix} array ({str(error).splitlines()[0][:160]})") from None
    if vectors.ndim != 2 or not np.issubdtype(vectors.dtype, np.floating):
        raise DataFormatError(f"{path}: expected a 2-D float array [cases, dim], got shape {tuple(vectors.shape)} "
                              f"dtype {vectors.dtype}")
    return vectors


def _check_shape(vectors_ND: np.ndarray, n: int, dim: int, where: str) -> None:
    try:
        check_embedding_shape(vectors_ND.shape, n, dim)
    except DimensionError as error:
        raise DimensionError(f"{where}: {error}") from None


def check_embeddings(vectors_ND: np.ndarray, n: int, dim: int, where: str) -> None:
    """``vectors_ND`` is ``[n, dim]``, finite and unit-norm (read a chunk at a time, checked as
    :meth:`memento.memory.front.BankFront.add` checks them); one ``DimensionError`` or ``DataFormatError`` naming
    ``where`` and the first bad row otherwise."""
    _check_shape(vectors_ND, n, dim, where)
    for start in range(0, n, _CHECK_CHUNK):
        with np.errstate(over="ignore", invalid="ignore"):  # a float64 beyond float32 becomes inf: reported below
            chunk = np.asarray(vectors_ND[start:start + _CHECK_CHUNK], dtype=np.float32)
        try:
            check_unit_rows(chunk, start=start)
        except DataFormatError as error:
            raise DataFormatError(f"{where}: {error}") from None


def import_with_embeddings(bank: Any, cases: Sequence[Case], vectors_ND: np.ndarray, *,
                           allow_duplicates: bool = False, chunk: int = DEFAULT_CHUNK,
                           progress: bool | None = None, where: str = "embeddings", checked: bool = False) -> int:
    """Add ``cases`` with their vectors ``[N, D]`` to ``bank``, ``chunk`` cases per transaction, after training
    its index on a sample of all of them (see the module docstring); returns the cases added. The vectors are
    checked first (:func:`check_embeddings`); ``checked``: they were, only their shape is."""
    from tqdm.auto import tqdm

    from memento.memory.bank import CaseBank

    if checked:
        _check_shape(vectors_ND, len(cases), bank.dim, where)
    else:
        check_embeddings(vectors_ND, len(cases), bank.dim, where)
    if isinstance(bank, CaseBank) and bank.train_index(vectors_ND):
        logger.info("%s: index trained on a sample of the %d imported vectors", bank.path, len(cases))
    before = len(bank)
    with tqdm(total=len(cases), desc="import", unit="case", disable=progress is False or None) as bar:
        for start in range(0, len(cases), chunk):
            stop = min(start + chunk, len(cases))
            bank.add(cases[start:stop], np.asarray(vectors_ND[start:stop], dtype=np.float32),
                     allow_duplicates=allow_duplicates)
            bar.update(stop - start)
    return len(bank) - before
