"""Candidate pre-selection by a two-tower Q-network's own scores (maximum inner product search).

A :class:`~memento.qnet.TwoTowerQNetwork` scores ``Q(s, c) = f(s) . g(c) + b``. The case side
``g(c)`` does not depend on the state, so :class:`TwoTowerIndex` computes a **key**
``g(c)`` (``E`` numbers) for every case of a bank once, puts the keys in a faiss inner-product
index (keys and queries are *not* normalised: the inner product is the Q-value up to the
scalar ``b``), and answers a state with the ``C`` cases of highest Q: the query ``f(s)`` is
searched, and each hit scores ``key . query + b``, which equals ``qnet(state, case)`` for an
exact (``"Flat"``) index. Compared with the bank's cosine pre-selection, the candidates are
the ones the learned Q-function likes, not those that merely look like the state.

The returned :class:`~memento.memory.Candidates` are interchangeable with
``CaseBank.candidates``: bank positions, case ids, scores (here Q-values) and the cases'
**original** bank embeddings ``embeddings_CD`` (what policies and the replay buffer need).

Keeping keys current:

- :meth:`TwoTowerIndex.refresh` recomputes every key (``O(N)`` case-tower passes) and rebuilds the
  index. Call it after the Q-network changed enough to matter, e.g. every few hundred learner
  updates (on the target-network cadence is a natural choice), and after loading other weights.
  Between refreshes the keys lag the network: that only changes *which* ``C`` cases are
  pre-selected, because a soft-Q policy re-scores the candidates with the current network.
- :meth:`TwoTowerIndex.add_new` adds keys, under the current network, for the cases appended to the
  bank since the last build (``O(new)``). :meth:`TwoTowerIndex.candidates` calls it itself when the
  bank has grown, so appended cases are searchable at once, as they are in the bank.

States are used as given (not normalised), exactly as ``qnet(state_BD, cases_BCD)`` would see
them. The index lives on the CPU; key and query computation runs on the Q-network's device,
in eval mode and under ``torch.inference_mode`` (the network's training flag is restored).
"""

from __future__ import annotations

import logging
import numbers
from typing import Any

import numpy as np
import torch

from memento.config import IndexConfig
from memento.errors import ConfigError, DataFormatError, DimensionError
from memento.memory import Candidates, CaseBank, FaissIndex
from memento.memory.index import exact_topk
from memento.qnet import TwoTowerQNetwork

__all__ = ["TwoTowerIndex"]

logger = logging.getLogger(__name__)

_ENCODE_BATCH = 8192


class TwoTowerIndex:
    """A faiss inner-product index over ``qnet.encode_cases`` of every bank case (see the module docstring).

    ``factory`` is a ``faiss.index_factory`` string (``"Flat"``: exact; ``"HNSW32,Flat"``,
    ``"IVF256,Flat"``...: approximate). An index that needs training is trained once it holds
    enough keys (39 per IVF list); until then searches are exact. ``seed`` drives the training
    sample. Building the object computes all keys (:meth:`refresh`).
    """

    def __init__(self, bank: CaseBank, qnet: TwoTowerQNetwork, factory: str | IndexConfig = "Flat", *,
                 seed: int = 0):
        if not isinstance(qnet, TwoTowerQNetwork):
            arch = getattr(getattr(qnet, "config", None), "arch", None)
            raise ConfigError(f"TwoTowerIndex.qnet={type(qnet).__name__} (arch={arch!r}): needs a TwoTowerQNetwork "
                              "(QNetConfig.arch='two_tower'); other architectures have no separable case keys")
        if not isinstance(bank, CaseBank):
            raise ConfigError(f"TwoTowerIndex.bank={type(bank).__name__}: must be a memento.memory.CaseBank")
        if qnet.config.dim != bank.dim:
            raise DimensionError(f"TwoTowerIndex: the Q-network takes state/case vectors of shape ({qnet.config.dim},) "
                                 f"but bank {bank.path} holds vectors of shape ({bank.dim},)")
        self.bank = bank
        self.qnet = qnet
        self.index_config = IndexConfig(factory=factory) if isinstance(factory, str) else factory
        self._seed = seed
        FaissIndex(self.index_config, qnet.config.embed_dim)  # a bad factory string fails here, before any work
        self._index: FaissIndex
        self._pending_NE = np.zeros((0, qnet.config.embed_dim), dtype=np.float32)  # keys while untrained
        self._n_keyed = 0
        self.refreshes = 0
        self.refresh()

    # ------------------------------------------------------------------ properties

    @property
    def embed_dim(self) -> int:
        """E, the length of keys and queries."""
        return self.qnet.config.embed_dim

    @property
    def n_keys(self) -> int:
        """Bank positions ``0..n_keys-1`` have keys in the index."""
        return self._n_keyed

    @property
    def n_missing(self) -> int:
        """Cases appended to the bank that have no key yet (:meth:`add_new` adds them)."""
        return len(self.bank) - self._n_keyed

    def __len__(self) -> int:
        return self._n_keyed

    # ------------------------------------------------------------------ the towers

    def _device(self) -> torch.device:
        return next(self.qnet.parameters()).device

    def _run_tower(self, encode: Any, x_ND: np.ndarray) -> np.ndarray:
        device = self._device()
        was_training = self.qnet.training
        out: list[np.ndarray] = []
        try:
            self.qnet.eval()
            with torch.inference_mode():
                for start in range(0, x_ND.shape[0], _ENCODE_BATCH):
                    x = torch.as_tensor(x_ND[start:start + _ENCODE_BATCH], dtype=torch.float32, device=device)
                    out.append(encode(x).to("cpu", torch.float32).numpy())
        finally:
            self.qnet.train(was_training)
        if not out:
            return np.zeros((0, self.embed_dim), dtype=np.float32)
        return np.ascontiguousarray(np.concatenate(out, axis=0), dtype=np.float32)

    def keys(self, cases_ND: np.ndarray) -> np.ndarray:
        """Keys ``g(c)`` ``[N, E]`` (float32) of case vectors ``[N, D]`` under the current network."""
        return self._run_tower(self.qnet.encode_cases, np.asarray(cases_ND, dtype=np.float32))

    def query(self, state_D: Any) -> np.ndarray:
        """The query ``f(s)`` ``[E]`` (float32) of one state ``[D]`` under the current network."""
        return self._run_tower(self.qnet.encode_states, self._check_state(state_D)[None, :])[0]

    def bias(self) -> float:
        """The scalar ``b`` of ``Q = f(s) . g(c) + b``."""
        return float(self.qnet.bias.detach().to("cpu"))

    # ------------------------------------------------------------------ building

    def _bank_embeddings(self, start: int, stop: int) -> np.ndarray:
        if stop <= start:
            return np.zeros((0, self.bank.dim), dtype=np.float32)
        return self.bank.embeddings_at(np.arange(start, stop))

    def _add_keys(self, keys_NE: np.ndarray) -> None:
        if self._index.is_trained:
            self._index.add(keys_NE)
            return
        self._pending_NE = np.concatenate([self._pending_NE, keys_NE], axis=0)
        if self._pending_NE.shape[0] >= self._index.min_train:
            self._index.train(self._pending_NE, np.random.default_rng(self._seed))
            self._index.add(self._pending_NE)
            self._pending_NE = np.zeros((0, self.embed_dim), dtype=np.float32)

    def _encode_range(self, start: int, stop: int) -> None:
        for lo in range(start, stop, _ENCODE_BATCH):
            hi = min(stop, lo + _ENCODE_BATCH)
            self._add_keys(self.keys(self._bank_embeddings(lo, hi)))
            self._n_keyed = hi

    def refresh(self) -> None:
        """Recompute every key with the current Q-network and rebuild the index (call after the network changed)."""
        self._index = FaissIndex(self.index_config, self.embed_dim)
        self._pending_NE = np.zeros((0, self.embed_dim), dtype=np.float32)
        self._n_keyed = 0
        self._encode_range(0, len(self.bank))
        self.refreshes += 1
        logger.debug("two-tower index (%s): %d keys built (refresh %d)", self.index_config.factory, self._n_keyed,
                     self.refreshes)

    def add_new(self) -> int:
        """Add keys for the cases appended to the bank since the last build; returns how many were added."""
        start, stop = self._n_keyed, len(self.bank)
        if stop <= start:
            return 0
        self._encode_range(start, stop)
        logger.debug("two-tower index: added %d key(s), %d in all", stop - start, self._n_keyed)
        return stop - start

    # ------------------------------------------------------------------ search

    def _check_state(self, state_D: Any) -> np.ndarray:
        state = np.asarray(state_D)
        d = self.qnet.config.dim
        if state.ndim != 1 or state.shape[0] != d:
            raise DimensionError(f"TwoTowerIndex: state_D.shape={tuple(state.shape)}, but the Q-network and the bank "
                                 f"take one state of shape ({d},) (bank vectors: ({len(self.bank)}, {self.bank.dim}))")
        if not np.issubdtype(state.dtype, np.number) or not np.isfinite(state).all():
            raise DataFormatError(f"TwoTowerIndex: state must be finite numbers (dtype {state.dtype}, NaN/inf or "
                                  "non-numeric)")
        return state.astype(np.float32)

    def search(self, state_D: Any, c: int) -> tuple[np.ndarray, np.ndarray]:
        """``(q_C, positions_C)``: the (up to) ``c`` bank positions of highest Q, best first, and their Q-values."""
        if isinstance(c, (bool, np.bool_)) or not isinstance(c, numbers.Integral) or c < 1:
            raise DataFormatError(f"c must be a positive integer, got {c!r}")
        if self.n_missing:
            self.add_new()
        query_1E = self.query(state_D)[None, :]
        c = int(min(c, max(self._n_keyed, 1)))
        if self._n_keyed == 0:
            return np.zeros(0, dtype=np.float32), np.zeros(0, dtype=np.int64)
        if self._index.is_trained:
            result = self._index.search(query_1E, c)
            assert result is not None  # no filter, so the index always answers
            scores_1C, labels_1C = result
        else:
            scores_1C, labels_1C = exact_topk(self._pending_NE, query_1E, c)
        valid = labels_1C[0] >= 0
        positions_C = labels_1C[0][valid].astype(np.int64)
        q_C = (scores_1C[0][valid].astype(np.float64) + self.bias()).astype(np.float32)
        return q_C, positions_C

    def candidates(self, state_D: Any, c: int) -> Candidates:
        """The top-``c`` cases by two-tower Q for one state, as :class:`~memento.memory.Candidates`.

        ``scores_C`` are the Q-values ``key . query + bias``; ``embeddings_CD`` are the cases' stored
        bank vectors. Cases appended to the bank since the last build get keys first (:meth:`add_new`).
        """
        q_C, positions_C = self.search(state_D, c)
        ids = self.bank.ids_at(positions_C)
        embeddings_CD = self.bank.embeddings_at(positions_C)
        return Candidates(ids=ids, positions_C=positions_C, scores_C=q_C, embeddings_CD=embeddings_CD)

    def __repr__(self) -> str:
        return (f"TwoTowerIndex(bank={str(self.bank.path)!r}, keys={self._n_keyed}, "
                f"factory={self.index_config.factory!r}, embed_dim={self.embed_dim})")
