"""Reading the rows of a large memory-mapped ``[N, D]`` array (an embeddings file being imported) without keeping
its pages: :func:`release_pages` and :func:`gather_rows`, which the bulk import (:mod:`memento.bank.bulk`) and a
directory bank's index training (:meth:`memento.bank.faissvectors.FaissVectors.train_on`) share.
"""

from __future__ import annotations

import mmap
from typing import Any

import numpy as np

__all__ = ["gather_rows", "release_pages"]

CHECK_BYTES = 64 << 20
"""At most this many bytes of float32 are read (or checked) at once (and at least one row), whatever the width."""


def rows_per(limit: int, dim: int) -> int:
    """How many float32 rows of ``dim`` fit in ``limit`` bytes (at least one)."""
    return max(1, limit // (4 * max(1, dim)))


def release_pages(vectors_ND: Any) -> None:
    """Drop the pages of a memory-mapped ``vectors_ND`` read so far from this process's map (``MADV_DONTNEED``;
    the kernel's page cache keeps them), so a pass over a large file does not grow its resident memory by the
    file's size. Anything else is left as it is."""
    mapped = getattr(vectors_ND, "_mmap", None)  # np.memmap's map (numpy keeps it there)
    advice = getattr(mmap, "MADV_DONTNEED", None)
    if isinstance(mapped, mmap.mmap) and advice is not None:
        try:
            mapped.madvise(advice)
        except (OSError, ValueError):  # pragma: no cover - a map that cannot take advice stays as it is
            pass


def gather_rows(vectors_ND: Any, positions: np.ndarray) -> np.ndarray:
    """``vectors_ND[positions]`` (sorted positions, e.g. an index's training sample) as float32, read 64 MiB of
    rows at a time with :func:`release_pages` after each, so a sample spread over a memory-mapped file does not
    map the whole file at once."""
    positions = np.asarray(positions, dtype=np.int64)
    dim = int(np.shape(vectors_ND)[1])
    out = np.empty((len(positions), dim), dtype=np.float32)
    window = rows_per(CHECK_BYTES, dim)
    done = 0
    while done < len(positions):
        stop = int(np.searchsorted(positions, positions[done] + window, side="left"))
        out[done:stop] = vectors_ND[positions[done:stop]]
        release_pages(vectors_ND)
        done = stop
    return out
