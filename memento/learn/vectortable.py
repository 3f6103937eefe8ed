"""A table of distinct vectors, each stored once, that callers refer to by row index.

The replay buffer keeps its states and cases here: the same case is shown in many decisions, so a
row of the buffer holds K small integers instead of K copies of a 384-float vector, and sampling a
batch reads indices only (the vectors are gathered when the batch's tensors are first used).

Interning hashes each vector's stored bytes (a 64-bit multiply-add hash over its bit pattern,
vectorised), looks the hash up in a dict, and then checks every hit element by element, so a hash
collision can only cost a duplicate row, never a wrong vector. The data tensor is replaced, never
changed in place below its used length, so a batch that holds the tensor it was sampled from stays
valid while the table grows or is compacted.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import torch

__all__ = ["VectorTable"]

_INT_VIEW = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}


class VectorTable:
    """Distinct ``width``-wide vectors in ``dtype`` on ``device`` (see the module docstring)."""

    def __init__(self, width: int, dtype: torch.dtype, device: torch.device, *, initial_rows: int = 1024,
                 grow_to: int | None = None):
        self.width = int(width)
        self.dtype = dtype
        self.device = device
        self._data_VW = torch.zeros(max(1, initial_rows), self.width, dtype=dtype, device=device)
        self._size = 0
        self._grow_to = grow_to  # doubling stops here (more only when asked for more)
        self._row_of_hash: dict[int, int] = {}
        # fixed odd multipliers (a constant of the hash, not random state)
        self._mult_W = np.random.default_rng(0x5EED).integers(1, 2**62, size=self.width, dtype=np.int64) | 1

    def __len__(self) -> int:
        return self._size

    @property
    def data(self) -> torch.Tensor:
        """The whole storage tensor (rows ``>= len(self)`` are unused); indices from :meth:`intern` point into it."""
        return self._data_VW

    def rows(self) -> torch.Tensor:
        """The used rows, ``[len(self), width]``."""
        return self._data_VW[:self._size]

    def _hashes(self, rows_MW: torch.Tensor) -> np.ndarray:
        bits = rows_MW.detach().to("cpu").contiguous().view(_INT_VIEW[self.dtype]).numpy()
        # einsum sums each row in order whatever the batch (a row's hash does not depend on its neighbours);
        # int64 arithmetic wraps
        h_M = np.einsum("mw,w->m", bits, self._mult_W, dtype=np.int64, casting="unsafe")
        return h_M ^ (h_M >> 31)

    def _reserve(self, rows: int) -> None:
        if rows <= self._data_VW.shape[0]:
            return
        doubled = 2 * self._data_VW.shape[0]
        if self._grow_to is not None:
            doubled = min(doubled, self._grow_to)
        grown = torch.zeros(max(rows, doubled), self.width, dtype=self.dtype, device=self.device)
        grown[:self._size] = self._data_VW[:self._size]
        self._data_VW = grown

    def intern(self, vectors: Any) -> torch.Tensor:
        """Row indices (int64, on the table's device) of ``vectors`` ``[M, width]``, adding the new ones."""
        rows_MW = torch.as_tensor(vectors, device=self.device).to(self.dtype).reshape(-1, self.width)
        m = rows_MW.shape[0]
        if m == 0:
            return torch.zeros(0, dtype=torch.int64, device=self.device)
        h_M = self._hashes(rows_MW)
        hashes_U, first_U, inverse_M = np.unique(h_M, return_index=True, return_inverse=True)
        keys = hashes_U.tolist()
        row_U = np.fromiter(map(self._row_of_hash.get, keys, itertools.repeat(-1)), dtype=np.int64,
                            count=len(keys))
        new_U = row_U < 0
        n_new = int(new_U.sum())
        if n_new:  # new vectors get rows in the order they first appear
            new_N = np.flatnonzero(new_U)
            new_N = new_N[np.argsort(first_U[new_N], kind="stable")]
            row_U[new_N] = np.arange(self._size, self._size + n_new)
            self._row_of_hash.update(zip(hashes_U[new_N].tolist(), row_U[new_N].tolist()))
            self._reserve(self._size + n_new)
            source = torch.as_tensor(first_U[new_N], device=self.device)
            self._data_VW[self._size:self._size + n_new] = rows_MW[source]
            self._size += n_new
        ix_M = row_U[inverse_M.reshape(-1)]
        index_M = torch.as_tensor(ix_M, device=self.device)
        # every row but the one each new vector was copied from is checked: hash collisions (or NaN) get rows
        copied_M = new_U[inverse_M.reshape(-1)] & (first_U[inverse_M.reshape(-1)] == np.arange(m))
        if bool(copied_M.all()):
            return index_M
        seen_S = torch.as_tensor(np.flatnonzero(~copied_M), device=self.device)
        wrong_S = (self._data_VW.index_select(0, index_M[seen_S]) != rows_MW[seen_S]).any(dim=1)
        if bool(wrong_S.any()):
            wrong = seen_S[wrong_S]
            self._reserve(self._size + len(wrong))
            self._data_VW[self._size:self._size + len(wrong)] = rows_MW[wrong]
            index_M[wrong] = torch.arange(self._size, self._size + len(wrong), device=self.device)
            self._size += len(wrong)
        return index_M

    def compacted(self, live_ix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows ``live_ix`` refers to, in table order, and the map old row -> new row (-1: dropped)."""
        keep_L = torch.unique(live_ix.reshape(-1).to(self.device))  # sorted: the table's order is kept
        remap_V = torch.full((self._data_VW.shape[0],), -1, dtype=torch.int64, device=self.device)
        remap_V[keep_L] = torch.arange(len(keep_L), device=self.device)
        return self._data_VW.index_select(0, keep_L), remap_V

    def replace(self, rows_LW: torch.Tensor) -> None:
        """Make ``rows_LW`` the table's rows (a new tensor; indices into the old one keep their old meaning there)."""
        rows_LW = torch.as_tensor(rows_LW, device=self.device).to(self.dtype).reshape(-1, self.width)
        room = 2 * rows_LW.shape[0] + 1024  # room to grow before the next copy
        if self._grow_to is not None:
            room = max(rows_LW.shape[0], min(room, self._grow_to))
        self._data_VW = torch.zeros(room, self.width, dtype=self.dtype, device=self.device)
        self._data_VW[:rows_LW.shape[0]] = rows_LW
        self._size = rows_LW.shape[0]
        hashes = self._hashes(rows_LW).tolist()
        self._row_of_hash = {}
        for row, key in enumerate(hashes):  # the first row with a hash answers for it, as when interning
            self._row_of_hash.setdefault(key, row)
