"""A selector's queries as state vectors: its text encoder (loaded on first use), the front threads share it
through (one call at a time, or a dynamic batcher), and the checks a text or vector query passes.

:class:`QueryEncoder` is a part of :class:`memento.selector.runtime.Selector`, which hands it every text it
encodes: queries of ``select``/``select_many``/``search_cases``, new cases' states, action texts of case features.
It owns the encoder, its front and the batcher; its lock guards loading the encoder and switching batching on
or off (the selector's read/write lock is not involved: texts are encoded before it is taken).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from memento.bank.front import finite_float32
from memento.errors import DataFormatError, DimensionError
from memento.selector.artifact import EncoderSpec, load_encoder
from memento.selector.batching import BatchedEncoder, EncodeBatcher, SerialEncoder
from memento.types import check_text

__all__ = ["QueryEncoder"]


class QueryEncoder:
    """The text encoder of the artifact at ``path`` (``spec``: its ``encoder.json``; ``encoder``: one passed to
    ``load`` instead, ``device``: where to load it) and the query checks, for vectors of ``spec.dim``."""

    def __init__(self, path: Path, spec: EncoderSpec, encoder: Any = None, device: str | None = None):
        self.path = path
        self.spec = spec
        self._encoder = encoder
        self._device = device
        self._lock = threading.Lock()  # loading the encoder, switching batching on or off
        self._front: SerialEncoder | BatchedEncoder | None = None
        self.batcher: EncodeBatcher | None = None

    @property
    def dim(self) -> int:
        return self.spec.dim

    def encoder(self) -> Any:
        """The encoder behind its front (see :meth:`memento.selector.runtime.Selector.encoder`)."""
        with self._lock:
            if self._encoder is None:
                self._encoder = load_encoder(self.path, self.spec, device=self._device)
            if self._front is None or self._front.encoder is not self._encoder:
                self._front = (SerialEncoder(self._encoder) if self.batcher is None
                               else BatchedEncoder(self._encoder, self.batcher))
            return self._front

    def batch(self, max_texts: int | None = 32, wait_ms: float = 2.0) -> EncodeBatcher | None:
        """Encode through a new dynamic batcher from now on, or one call at a time again when ``max_texts`` is
        ``None`` (see :meth:`memento.selector.runtime.Selector.batch_encoding`); the old batcher is closed."""
        batcher = (None if max_texts is None else
                   EncodeBatcher(self._encode_batch, max_texts=max_texts, wait_ms=wait_ms,
                                 name=f"memento-encode-{self.path.name}"))
        with self._lock:
            old, self.batcher = self.batcher, batcher
            self._front = None
        if old is not None:
            old.close()
        return batcher

    def _encode_batch(self, texts: list[str]) -> np.ndarray:
        """The batcher's forward pass: the encoder itself (called in the batcher's thread only)."""
        return self.encoder().encoder.encode(texts)

    def actions(self, texts: list[str]) -> np.ndarray:
        """Action vectors ``[N, D]`` for the case features."""
        return np.asarray(self.encoder().encode(texts), dtype=np.float32).reshape(len(texts), self.dim)

    def state(self, query: Any, what: str = "query") -> np.ndarray:
        """A query text or vector as a unit float32 vector ``[D]``."""
        if isinstance(query, str):
            check_text(query, f"{what} text")
            vec = np.asarray(self.encoder().encode([query]), dtype=np.float32).reshape(-1)
        elif isinstance(query, (np.ndarray, list, tuple, torch.Tensor)):
            if isinstance(query, torch.Tensor):
                query = query.detach().cpu().numpy()
            vec = np.asarray(query)
            if vec.dtype == object or not np.issubdtype(vec.dtype, np.number) or np.issubdtype(vec.dtype,
                                                                                                np.complexfloating):
                raise DataFormatError(f"{what} vector must hold real numbers, got dtype {vec.dtype}")
            vec = finite_float32(vec if np.issubdtype(vec.dtype, np.floating) else vec.astype(np.float64),
                                 f"{what} vector")
        else:
            raise DataFormatError(f"{what} must be a text or a vector, got {type(query).__name__}")
        if vec.shape != (self.dim,):
            raise DimensionError(f"{what} vector has shape {vec.shape}, this selector expects ({self.dim},)")
        if not np.isfinite(vec).all():
            raise DataFormatError(f"{what} vector contains NaN or inf")
        norm = float(np.linalg.norm(vec))
        if norm == 0.0:
            raise DataFormatError(f"{what} vector has zero norm")
        if abs(norm - 1.0) > 1e-4:  # as the online loop does: a unit vector is used exactly as given
            vec = vec / norm
        return np.ascontiguousarray(vec, dtype=np.float32)

    def states(self, queries: Sequence[str] | np.ndarray) -> np.ndarray:
        """Queries as unit float32 state vectors ``[B, D]``: texts encoded in one call, vectors as given."""
        if isinstance(queries, (np.ndarray, torch.Tensor)):
            rows = list(queries.detach().cpu().numpy() if isinstance(queries, torch.Tensor) else queries)
        else:
            rows = list(queries)
        if rows and all(isinstance(q, str) for q in rows):
            for i, text in enumerate(rows):
                check_text(text, f"query {i}: text")
            rows = list(np.asarray(self.encoder().encode(rows), dtype=np.float32).reshape(len(rows), self.dim))
        elif any(isinstance(q, str) for q in rows):
            raise DataFormatError("select_many: queries must be all texts or all vectors")
        return np.stack([self.state(q, f"query {i}") for i, q in enumerate(rows)]) if rows else np.zeros(
            (0, self.dim), dtype=np.float32)
