"""Q-networks that score one state against many cases in one batched call.

Every network maps ``(state_BD, cases_BCD)`` to ``q_BC``: the logit ``Q(s_b, c_bc)`` of each of
the ``C`` cases of row ``b``. With binary rewards ``sigmoid(Q)`` reads as ``P(success | s, c)``;
the retrieval policy is ``softmax(Q / alpha)`` over a row's candidates.

Architectures (``QNetConfig.arch``):

- ``"mlp"`` -- Memento's parametric memory: ``concat(s, c) -> Linear(2D, H) -> ReLU -> Dropout
  -> Linear(H, 1)`` (``n_layers`` hidden layers). The first layer ``W [s; c] + b`` is stored split
  as ``state_in`` (``W_s``, ``b``) and ``case_in`` (``W_c``, no bias) and applied as
  ``W_s s + W_c c + b``: the same function, with the state half computed once per row instead
  of once per case (initialised as one ``Linear(2D, H)`` would be);
- ``"mlp_interact"`` -- the same with ``s * c`` and ``|s - c|`` added to the concat (4D input);
- ``"two_tower"`` -- ``Q(s, c) = f(s) . g(c) + b`` with two small MLP towers ``f``, ``g`` and a
  learnable scalar ``b``. The case side does not depend on the state, so keys can be
  precomputed for a whole bank: ``encode_cases(cases_ND) -> keys_NE`` and
  ``encode_states(state_BD) -> queries_BE``; ``forward`` equals ``queries . keys + bias``.

With ``features="case"`` (MLPs only) a case vector is ``[state embedding (D) | case features]``
(:mod:`memento.learn.features`: the action's embedding, stored reward, usage statistics, kind; ``case_dim`` numbers in
all): the whole vector enters ``W_c``, and the cosine similarity of the case's state embedding to the state is
one more input of the first layer.

With ``anchor="cosine"`` (MLPs only) the network is anchored on similarity: ``Q = a * cos(s, c) + b +
MLP(s, c)``, the MLP's output layer zero at initialisation (``a = anchor_scale``, ``b = 0``), so a fresh
network's greedy choice is cosine similarity's top-K, and its residual learns where the rewards disagree.

With ``relation_rank = R > 0`` (MLPs only) the network adds a low-rank bilinear term ``(U s) . (V c)`` over the
state and the case's question embedding (``U``, ``V``: ``D -> R``): a multiplicative match between what two
questions ask (the question type of the state against the case's), which a concatenation MLP can hardly learn
from a few hundred rewards. ``V`` starts at zero, so the term is zero at initialisation (an anchored network
still ranks exactly like cosine) and its gradient is not.

:meth:`QNetwork.score` is the scoring path of a choice (:func:`memento.learn.policy.q_values`): the values
``forward`` gives in ``eval()`` mode, computed without switching the module's mode (``train()``/``eval()``
walk every submodule: ~45 us for an MLP, a twentieth of one choice) and with the element-wise steps in
place; :meth:`QNetwork.placement` names the device and dtype its inputs take (read from the first layer's
weight at every call, so a moved network is followed).

On the CPU in float32 an MLP network scores one state through its numpy twin :meth:`MLPQNetwork.numpy_scores`.
Given the candidates' bank positions it keeps the case half of its first layer per position
(:class:`CaseHalfCache`, ``QNetConfig.case_cache_mib``): ``W_c c`` over the part of a case vector that does not
change from step to step (its question embedding, and with case features its answer embedding; not the usage
statistics, stored reward and kind, nor ``mlp_interact``'s ``s * c`` and ``|s - c|``), with the relation term's
``V c``. A cached row is computed once per position and weights version: any change to those weights (an optimiser
step, ``load_state_dict``, ``reset_parameters``, a move) makes every row stale, and a row is used only while the
vector it came from is the one the candidate carries now (a fingerprint of it is checked), so a bank truncated
and refilled, or a case whose vectors changed, is scored afresh.

Parameters are initialised from an explicit ``torch.Generator`` (:meth:`QNetwork.reset_parameters`),
never from torch's global RNG. Dropout, in training mode, draws its masks from the generator
passed to ``forward`` (or torch's global RNG when none is passed).
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
from collections.abc import Callable, Hashable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from memento.config import QNetConfig
from memento.errors import ConfigError, DimensionError

__all__ = ["CaseHalfCache", "MLPQNetwork", "QNetwork", "TwoTowerQNetwork", "build_qnet", "eval_call"]

logger = logging.getLogger(__name__)


class _Linear(nn.Linear):
    """An ``nn.Linear`` whose constructor leaves its parameters uninitialised (no draw from the global RNG);
    :meth:`QNetwork.reset_parameters` fills them. (``nn.utils.skip_init`` does the same through the meta device,
    whose ``to_empty`` imports ``torch._dynamo`` and sympy: ~37 MiB and ~1.5 s for a process that only selects.)"""

    def reset_parameters(self) -> None:
        return None


def _linear(in_features: int, out_features: int, bias: bool = True) -> nn.Linear:
    """An uninitialised Linear (no draw from the global RNG); :meth:`QNetwork.reset_parameters` fills it."""
    return _Linear(in_features, out_features, bias=bias)


def _dropout(x: torch.Tensor, p: float, training: bool, generator: torch.Generator | None) -> torch.Tensor:
    if not training or p == 0.0:
        return x
    if generator is None:
        return F.dropout(x, p, training=True)
    keep = torch.empty_like(x).uniform_(generator=generator).ge_(p).mul_(1.0 / (1.0 - p))  # 0 or 1/(1-p)
    return x * keep


_PROBES = 2
_WAYS = 4  # slots per set of the case-half cache
_PROBE_SEED = 0x6361_7365
_CHUNK_ROWS = 4
_CHUNKED_MAX_ROWS = 16
_SMALL_PRODUCT = 2**20


def _rows_product(x_MF: np.ndarray, w_FN: np.ndarray) -> np.ndarray:
    """``x_MF @ w_FN`` in float32 (``w_FN`` C-contiguous), each row's values computed from that row alone.

    A product of one row takes OpenBLAS's matrix-vector kernel, whose sums round differently, so a single row is
    padded with a zero row: a cached row then has the bits it would have had computed with any other rows (on the
    machines we measured; the tests compare to float32 rounding). A few rows (at most ``_CHUNKED_MAX_ROWS``) go in
    products of ``_CHUNK_ROWS`` rows when such a product stays under ``_SMALL_PRODUCT`` multiply-adds: OpenBLAS then
    skips packing ``w`` (measured on the 2-core machine at 384 x 512: 15 us for 4 rows against 70 us for 8 and
    270 us for 64)."""
    m, (f, n) = x_MF.shape[0], w_FN.shape
    if m <= _CHUNKED_MAX_ROWS and _CHUNK_ROWS * f * n <= _SMALL_PRODUCT:
        if m % _CHUNK_ROWS == 0:
            return np.concatenate([x_MF[i:i + _CHUNK_ROWS] @ w_FN for i in range(0, m, _CHUNK_ROWS)]) \
                if m > _CHUNK_ROWS else x_MF @ w_FN
        padded_MF = np.zeros((m + _CHUNK_ROWS - m % _CHUNK_ROWS, f), dtype=np.float32)
        padded_MF[:m] = x_MF
        return _rows_product(padded_MF, w_FN)[:m]
    if m == 1:
        padded_MF = np.zeros((2, f), dtype=np.float32)
        padded_MF[:1] = x_MF
        return (padded_MF @ w_FN)[:1]
    return x_MF @ w_FN


class CaseHalfCache:
    """Rows that depend on a case alone (an MLP's ``W_c c``), kept per bank position, at most ``max_bytes``.

    A set-associative table of ``S`` slots in sets of :data:`_WAYS`: position ``p`` may sit in any slot of set
    ``p % (S / _WAYS)``, a new row replacing the set's slots in turn; ``S`` grows (a power of two, from 1,024, the
    table emptied when it does) with the largest position seen, up to ``max_bytes // (4 * width + 16)`` slots.
    Each slot keeps its row, its position and a fingerprint of the input it was computed from (the bits of two
    fixed random float32 projections of it): a row is used only when the position and the fingerprint of the
    vector the candidate carries now both match, so positions reused after a bank truncation, or a position whose
    vector changed, are computed again. Rows are valid for one ``key`` (the weights' version):
    a call with another key empties the table first. The table is allocated lazily; ``max_bytes=0`` keeps nothing.

    Thread-safe: lookups and stores hold a lock; the products of missing rows are computed outside it.
    """

    def __init__(self, max_bytes: int, width: int, in_width: int):
        self.max_bytes = int(max_bytes)
        self.width = int(width)
        self.in_width = int(in_width)
        self.slots_max = self.max_bytes // (4 * self.width + 16)  # the row, its position, its fingerprint
        self._probe_FP = np.random.default_rng(_PROBE_SEED).standard_normal((self.in_width, _PROBES)) \
            .astype(np.float32)
        self._lock = threading.Lock()
        self._reset()
        self.hits = 0
        self.misses = 0

    def _reset(self) -> None:
        self._key: Hashable | None = None
        self._rows_SW = np.empty((0, self.width), dtype=np.float32)
        self._tags_S = np.empty(0, dtype=np.int64)
        self._fp_S = np.empty(0, dtype=np.int64)
        self._next_G = np.empty(0, dtype=np.uint8)  # each set's next slot to replace (not counted in nbytes)

    def __deepcopy__(self, memo: dict[int, Any]) -> CaseHalfCache:  # a copied network starts empty
        return CaseHalfCache(self.max_bytes, self.width, self.in_width)

    def __getstate__(self) -> dict[str, int]:
        return {"max_bytes": self.max_bytes, "width": self.width, "in_width": self.in_width}

    def __setstate__(self, state: dict[str, int]) -> None:
        self.__init__(state["max_bytes"], state["width"], state["in_width"])  # type: ignore[misc]

    @property
    def enabled(self) -> bool:
        return self.slots_max > 0

    @property
    def nbytes(self) -> int:
        """Bytes the table holds now (at most ``max_bytes``)."""
        return self._rows_SW.nbytes + self._tags_S.nbytes + self._fp_S.nbytes

    def __len__(self) -> int:
        """Rows held now."""
        return int((self._tags_S >= 0).sum())

    def clear(self) -> None:
        """Forget every row and free the table."""
        with self._lock:
            self._reset()

    def _fit(self, max_pos: int) -> None:
        """Grow the table (under the lock) to the power of two above ``max_pos`` (at least 1,024, at most
        ``slots_max`` slots, a multiple of :data:`_WAYS`); a table that grows starts empty (its sets change)."""
        size = len(self._tags_S)
        if max_pos < size or size >= (self.slots_max // _WAYS) * _WAYS:
            return
        new = max(_WAYS, (min(self.slots_max, max(1024, 1 << int(max_pos).bit_length())) // _WAYS) * _WAYS)
        if new <= size:
            return
        self._rows_SW = np.empty((new, self.width), dtype=np.float32)
        self._tags_S = np.full(new, -1, dtype=np.int64)
        self._fp_S = np.empty(new, dtype=np.int64)
        self._next_G = np.zeros(new // _WAYS, dtype=np.uint8)

    def rows(self, key: Hashable, positions_C: np.ndarray, x_CF: np.ndarray,
             compute: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
        """``compute(x_CF)`` as a new ``(C, width)`` float32 array, taking the rows of positions already computed
        under ``key`` from the table and computing (and storing) the others; a negative position is never stored.
        ``compute`` must give each row's values from that row alone.

        The table is :data:`_WAYS`-way set-associative: position ``p`` may sit in any slot of set ``p % G``, and a
        new row replaces the set's slots in turn, so positions far apart rarely evict each other."""
        pos_C = np.asarray(positions_C, dtype=np.int64).reshape(-1)
        known_C = pos_C >= 0
        if not self.enabled or pos_C.shape[0] != x_CF.shape[0] or not known_C.any():
            return np.asarray(compute(x_CF), dtype=np.float32)
        fp_C = np.ascontiguousarray(_rows_product(x_CF, self._probe_FP)).view(np.int64).reshape(-1)
        with self._lock:
            if key != self._key:
                self._tags_S.fill(-1)
                self._key = key
            self._fit(int(pos_C.max()))
            sets = len(self._tags_S) // _WAYS
            set_C = pos_C % sets
            ways_CW = set_C[:, None] * _WAYS + np.arange(_WAYS)
            match_CW = (self._tags_S[ways_CW] == pos_C[:, None]) & (self._fp_S[ways_CW] == fp_C[:, None])
            hit_C = match_CW.any(axis=1) & known_C
            slots_C = ways_CW[np.arange(len(pos_C)), match_CW.argmax(axis=1)]
            out_CW = self._rows_SW[slots_C]  # a copy; the missing rows are filled in below
        miss_M = np.flatnonzero(~hit_C)
        self.hits += len(pos_C) - len(miss_M)
        self.misses += len(miss_M)
        if len(miss_M):
            out_CW[miss_M] = compute(x_CF[miss_M])
            store_M = miss_M[known_C[miss_M]]
            if len(store_M):
                with self._lock:
                    if self._key == key:  # not emptied for other weights meanwhile
                        self._fit(int(pos_C[store_M].max()))
                        sets = len(self._tags_S) // _WAYS
                        for m in store_M.tolist():  # in turn: two new rows of one set take two of its slots
                            group = int(pos_C[m]) % sets
                            slot = group * _WAYS + int(self._next_G[group])
                            self._next_G[group] = (self._next_G[group] + 1) % _WAYS
                            self._rows_SW[slot] = out_CW[m]
                            self._tags_S[slot] = pos_C[m]
                            self._fp_S[slot] = fp_C[m]
        return out_CW


class QNetwork(nn.Module):
    """Base class: ``forward(state_BD, cases_BCD) -> q_BC`` logits, input shapes checked."""

    config: QNetConfig

    def __init__(self, config: QNetConfig):
        super().__init__()
        self.config = config

    @property
    def dim(self) -> int:
        return self.config.dim

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """(Re)initialise every Linear as torch does by default, ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``,
        drawing from ``generator`` (a CPU generator; ``None``: one seeded with ``config.seed``).

        Values are drawn on the CPU and copied, so a seed gives the same network on every device.
        """
        if generator is None:
            generator = torch.Generator().manual_seed(self.config.seed)
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, nn.Linear):
                    bound = 1.0 / math.sqrt(getattr(module, "fan_in", module.in_features))
                    for param in (module.weight, module.bias):
                        if param is None:
                            continue
                        values = torch.empty(param.shape, dtype=torch.float32).uniform_(-bound, bound,
                                                                                          generator=generator)
                        param.copy_(values)
            for name, param in self.named_parameters():
                if name == "bias":  # the two-tower scalar
                    param.zero_()

    def _check_inputs(self, state_BD: torch.Tensor, cases_BCD: torch.Tensor) -> None:
        d, e = self.config.dim, self.config.case_dim
        if state_BD.ndim != 2 or cases_BCD.ndim != 3 or state_BD.shape[0] != cases_BCD.shape[0] \
                or state_BD.shape[1] != d or cases_BCD.shape[2] != e:
            what = "" if e == d else f", features={self.config.features!r}"
            raise DimensionError(
                f"{type(self).__name__} (dim={d}{what}) expects state_BD of shape (B, {d}) and cases_BCD of shape "
                f"(B, C, {e}); got state_BD.shape={tuple(state_BD.shape)}, cases_BCD.shape={tuple(cases_BCD.shape)}")

    def forward(self, state_BD: torch.Tensor, cases_BCD: torch.Tensor, *,
                generator: torch.Generator | None = None) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def placement(self) -> tuple[torch.device, torch.dtype]:
        """The device and dtype of the network's inputs: those of its first floating-point parameter or buffer
        (CPU float32 for none), read at every call."""
        for tensor in itertools.chain(self.parameters(), self.buffers()):
            if tensor.is_floating_point():
                return tensor.device, tensor.dtype
        return torch.device("cpu"), torch.float32

    def _scores_fast(self) -> bool:
        """Whether :meth:`score` may skip the module call: no forward (pre-)hook is set on the network."""
        return not (self._forward_hooks or self._forward_pre_hooks)

    def score(self, state_BD: torch.Tensor, cases_BCD: torch.Tensor) -> torch.Tensor:
        """``q_BC`` as ``forward`` gives it in ``eval()`` mode (no dropout), whatever the module's mode, which is
        left as it is. Call it under ``torch.inference_mode`` (or ``no_grad``): it may work in place.

        This base version switches to ``eval()`` and back around the module call (:func:`eval_call`); the
        networks of this module compute the same values without the switch."""
        return eval_call(self, state_BD, cases_BCD)


def eval_call(module: torch.nn.Module, state_BD: torch.Tensor, cases_BCD: torch.Tensor) -> Any:
    """``module(state_BD, cases_BCD)`` in ``eval()`` mode; the module's training flag is restored afterwards."""
    was_training = module.training
    try:
        if was_training:
            module.eval()
        return module(state_BD, cases_BCD)
    finally:
        if was_training:
            module.train(True)


class MLPQNetwork(QNetwork):
    """``"mlp"`` and ``"mlp_interact"``: an MLP on the concatenation of state and case (features)."""

    def __init__(self, config: QNetConfig):
        super().__init__(config)
        if config.arch not in ("mlp", "mlp_interact"):
            raise ValueError(f"MLPQNetwork takes arch 'mlp' or 'mlp_interact', not {config.arch!r}")
        self.interact = config.arch == "mlp_interact"
        d, h = config.dim, config.hidden
        self.features = config.features == "case"
        case_width = config.case_dim + (2 * d if self.interact else 0)  # [c (+ features) | s*c | |s-c|]
        self.state_in = _linear(d, h)  # W_s and the first layer's bias
        self.case_in = _linear(case_width, h, bias=False)  # W_c
        fan_in = d + case_width + (1 if self.features else 0)  # as one Linear over the whole concat
        self.state_in.fan_in = self.case_in.fan_in = fan_in
        if self.features:  # cosine similarity to the state is one more input of the first layer
            self.cos_in = _linear(1, h, bias=False)
            self.cos_in.fan_in = fan_in
        self.hidden_layers = nn.ModuleList([_linear(h, h) for _ in range(config.n_layers - 1)])
        self.out = _linear(h, 1)
        self.relation = config.relation_rank > 0
        if self.relation:  # registered after the MLP: without it, the MLP draws the same initial weights
            self.relation_state = _linear(d, config.relation_rank, bias=False)  # U
            self.relation_case = _linear(d, config.relation_rank, bias=False)  # V (zero at initialisation)
            self.relation_state.fan_in = 1  # U s of unit-order entries for a unit s (else V would learn slowly)
        self.anchored = config.anchor == "cosine"
        if self.anchored:
            self.anchor_scale = nn.Parameter(torch.full((), float(config.anchor_scale)))
            self.anchor_offset = nn.Parameter(torch.zeros(()))
        # the case half numpy_scores keeps per bank position: W_c over the columns of a case vector that do not change
        # per step (its question embedding, and its answer embedding with case features), then V c
        self._fixed_width = 2 * d if self.features else d
        self._weights_version = 0
        self._case_weights_at: tuple[Hashable, np.ndarray, np.ndarray] | None = None
        self.case_cache = CaseHalfCache(config.case_cache_mib * 2**20, h + config.relation_rank, self._fixed_width)
        self.register_load_state_dict_post_hook(_weights_loaded)
        self.reset_parameters()

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """As :meth:`QNetwork.reset_parameters`; an anchored network then zeroes its residual's output layer
        and resets ``a = anchor_scale``, ``b = 0`` (so it ranks as cosine similarity)."""
        super().reset_parameters(generator)
        self.invalidate_case_cache()
        if getattr(self, "features", False):  # the usage statistics' weights start at 0 (memento.learn.features)
            with torch.no_grad():
                usage = 2 * self.config.dim + 1  # [embedding | action embedding | reward, usage mean, log shown ...]
                self.case_in.weight[:, usage:usage + 2].zero_()
        if getattr(self, "relation", False):
            with torch.no_grad():
                self.relation_case.weight.zero_()
        if getattr(self, "anchored", False):
            with torch.no_grad():
                self.out.weight.zero_()
                self.out.bias.zero_()
                self.anchor_scale.fill_(float(self.config.anchor_scale))
                self.anchor_offset.zero_()

    def forward(self, state_BD: torch.Tensor, cases_BCD: torch.Tensor, *,
                generator: torch.Generator | None = None) -> torch.Tensor:
        return self._q(state_BD, cases_BCD, self.training, generator, in_place=False)

    def invalidate_case_cache(self) -> None:
        """Mark every row of :attr:`case_cache` stale (they are recomputed on need). Changes to the weights made
        in place through the parameters (an optimiser step, ``copy_`` under ``no_grad``, ``load_state_dict``) are
        seen without it, from the tensors' version counters; call it after writing a weight through ``.data`` or
        a numpy view."""
        self._weights_version = getattr(self, "_weights_version", 0) + 1

    def _apply(self, fn: Any, recurse: bool = True) -> Any:  # .to(), .double(), ...: new weight tensors
        self.invalidate_case_cache()
        return super()._apply(fn, recurse)

    def _case_key(self) -> tuple[Any, ...]:
        """The version of the weights a cached row depends on: the explicit counter, and the identity, storage and
        in-place version counter of ``W_c`` (and ``V``)."""
        params = (self.case_in.weight, self.relation_case.weight) if self.relation else (self.case_in.weight,)
        return (self._weights_version, *((id(p), p.data_ptr(), p._version) for p in params))

    def _zeros(self, shape: tuple[int, ...]) -> np.ndarray:
        """A read-only float32 block of zeros of ``shape`` (rows, hidden), kept for the largest row count seen."""
        held = getattr(self, "_zeros_RH", None)
        if held is None or held.shape[0] < shape[0] or held.shape[1] != shape[1]:
            held = np.zeros((max(shape[0], 64), shape[1]), dtype=np.float32)
            held.flags.writeable = False
            self._zeros_RH = held
        return held[:shape[0]]

    def _case_weights(self, key: Hashable) -> tuple[np.ndarray, np.ndarray]:
        """``(head_FN, tail_TN)``, C-contiguous float32 copies made once per weights version: the transposed rows
        of ``W_c`` over the fixed part of a case vector (its first F numbers), then ``V`` zero-padded to F rows
        (with a relation term); and ``W_c`` over the rest of the first layer's case input (T numbers: the case's
        scalars, ``s * c`` and ``|s - c|``; T may be 0)."""
        held = self._case_weights_at
        if held is not None and held[0] == key:
            return held[1], held[2]
        f = self._fixed_width
        w_HE = self.case_in.weight.detach().numpy()
        head_NF = w_HE[:, :f]
        if self.relation:
            v_RD = self.relation_case.weight.detach().numpy()
            head_NF = np.concatenate([head_NF, np.pad(v_RD, ((0, 0), (0, f - v_RD.shape[1])))], axis=0)
        head_FN = np.ascontiguousarray(head_NF.T, dtype=np.float32)
        tail_TN = np.ascontiguousarray(w_HE[:, f:].T, dtype=np.float32)
        self._case_weights_at = (key, head_FN, tail_TN)
        return head_FN, tail_TN

    def numpy_scores(self, state_D: np.ndarray, cases_CE: np.ndarray,
                     positions_C: np.ndarray | None = None) -> np.ndarray | None:
        """``q_C`` of one state, as :meth:`score` gives it (to float32 rounding), computed with numpy on the CPU;
        None where that does not apply (parameters on another device or of another dtype, a subclass's forward,
        forward hooks). One selection scores ~64 candidates: numpy's BLAS (OpenBLAS) runs these small products
        faster than torch's CPU kernels, whose MKL takes a generic path on some CPUs (AMD's), and skips torch's
        per-op dispatch (``memento bench select``; docs/benchmarks.md).

        ``positions_C``, the candidates' bank positions, lets the network take the case half of its first layer
        from :attr:`case_cache` (see the module docstring); the values are the same with or without them."""
        weight = self.state_in.weight
        if (weight.device.type != "cpu" or weight.dtype != torch.float32
                or type(self).forward is not MLPQNetwork.forward or not self._scores_fast()):
            return None

        def w(param: torch.Tensor) -> np.ndarray:
            return param.detach().numpy()

        s_D = np.asarray(state_D, dtype=np.float32)
        cases = np.asarray(cases_CE, dtype=np.float32)
        d, f, h = self.config.dim, self._fixed_width, self.config.hidden
        if s_D.shape != (d,) or cases.ndim != 2 or cases.shape[1] != self.config.case_dim:
            return None  # let score() raise its one error about the shapes
        emb_CD = cases[:, :d]
        key = self._case_key()
        head_FN, tail_TN = self._case_weights(key)

        def head(x_MF: np.ndarray) -> np.ndarray:
            return _rows_product(x_MF, head_FN)

        x_CF = cases[:, :f]
        if positions_C is None:
            head_CN = head(x_CF)
        else:
            head_CN = self.case_cache.rows(key, positions_C, x_CF, head)
        h_CH = head_CN[:, :h]
        tail = [cases[:, f:]] if cases.shape[1] > f else []  # the case's scalars (features)
        if self.interact:
            tail += [s_D * emb_CD, np.abs(s_D - emb_CD)]
        if tail:
            x_CT = np.concatenate(tail, axis=1) if len(tail) > 1 else tail[0]
            h_CH += x_CT @ tail_TN
        h_CH += w(self.state_in.weight) @ s_D + w(self.state_in.bias)
        if self.features or self.anchored:  # as F.cosine_similarity: x.y / max(|x| |y|, eps)
            norms_C = np.linalg.norm(emb_CD, axis=1) * np.linalg.norm(s_D)
            cos_C = (emb_CD @ s_D) / np.maximum(norms_C, np.float32(1e-8))
        if self.features:
            h_CH += cos_C[:, None] * w(self.cos_in.weight)[:, 0]
        zeros_CH = self._zeros(h_CH.shape)  # np.maximum against an array: 3x as fast as against the scalar 0
        np.maximum(h_CH, zeros_CH, out=h_CH)
        for layer in self.hidden_layers:
            h_CH = h_CH @ w(layer.weight).T + w(layer.bias)
            np.maximum(h_CH, zeros_CH, out=h_CH)
        q_C = h_CH @ w(self.out.weight)[0] + w(self.out.bias)[0]
        if self.relation:  # (U s) . (V c)
            q_C = q_C + head_CN[:, h:] @ (w(self.relation_state.weight) @ s_D)
        if self.anchored:
            q_C = q_C + w(self.anchor_scale) * cos_C + w(self.anchor_offset)
        return q_C

    def _q(self, state_BD: torch.Tensor, cases_BCD: torch.Tensor, training: bool,
           generator: torch.Generator | None, *, in_place: bool) -> torch.Tensor:
        """``forward`` with dropout on when ``training``; ``in_place`` (no autograd) adds the state half and
        applies the ReLU in the case half's buffer (the same arithmetic, two allocations fewer)."""
        self._check_inputs(state_BD, cases_BCD)
        d = self.config.dim
        h_BH = self.state_in(state_BD)
        emb_BCD = cases_BCD[..., :d]  # the case's state embedding (the rest: its features)
        if self.interact:
            s_B1D = state_BD.unsqueeze(1)
            h_BCH = self.case_in(torch.cat([cases_BCD, s_B1D * emb_BCD, (s_B1D - emb_BCD).abs()], dim=-1))
        else:
            h_BCH = self.case_in(cases_BCD)
        if self.features or self.anchored:
            cos_BC = F.cosine_similarity(emb_BCD, state_BD.unsqueeze(1), dim=-1)
        if self.features:
            h_BCH = h_BCH + self.cos_in(cos_BC.unsqueeze(-1))
        if in_place:
            h_BCH = h_BCH.add_(h_BH.unsqueeze(1)).relu_()
        else:
            h_BCH = F.relu(h_BCH + h_BH.unsqueeze(1))
        h_BCH = _dropout(h_BCH, self.config.dropout, training, generator)
        for layer in self.hidden_layers:
            h_BCH = layer(h_BCH).relu_() if in_place else F.relu(layer(h_BCH))
            h_BCH = _dropout(h_BCH, self.config.dropout, training, generator)
        q_BC = self.out(h_BCH).squeeze(-1)
        if self.relation:  # (U s) . (V c): how the two questions relate
            q_BC = q_BC + torch.einsum("br,bcr->bc", self.relation_state(state_BD), self.relation_case(emb_BCD))
        if self.anchored:
            q_BC = q_BC + self.anchor_scale * cos_BC + self.anchor_offset
        return q_BC


def _weights_loaded(module: nn.Module, incompatible_keys: Any) -> None:
    """``load_state_dict`` post-hook of an :class:`MLPQNetwork`: its cached case rows are stale."""
    module.invalidate_case_cache()  # type: ignore[operator]


class _Tower(nn.Module):
    def __init__(self, config: QNetConfig):
        super().__init__()
        widths = [config.dim] + [config.hidden] * config.n_layers
        self.layers = nn.ModuleList([_linear(a, b) for a, b in zip(widths[:-1], widths[1:])])
        self.out = _linear(config.hidden, config.embed_dim)
        self.dropout = config.dropout

    def forward(self, x: torch.Tensor, generator: torch.Generator | None, training: bool | None = None) -> torch.Tensor:
        training = self.training if training is None else training
        for layer in self.layers:
            x = _dropout(F.relu(layer(x)), self.dropout, training, generator)
        return self.out(x)


class TwoTowerQNetwork(QNetwork):
    """``"two_tower"``: ``Q(s, c) = f(s) . g(c) + bias``; ``g(c)`` can be precomputed per case."""

    def __init__(self, config: QNetConfig):
        super().__init__(config)
        if config.arch != "two_tower":
            raise ValueError(f"TwoTowerQNetwork takes arch 'two_tower', not {config.arch!r}")
        self.state_tower = _Tower(config)
        self.case_tower = _Tower(config)
        self.bias = nn.Parameter(torch.zeros(()))
        self.reset_parameters()

    def _check_last(self, name: str, x: torch.Tensor, ndim: int) -> None:
        if x.ndim != ndim or x.shape[-1] != self.config.dim:
            lead = "(B, " if ndim == 2 else "(N, " if name == "cases_ND" else "(B, C, "
            raise DimensionError(f"TwoTowerQNetwork (dim={self.config.dim}) expects {name} of shape "
                                 f"{lead}{self.config.dim}); got {name}.shape={tuple(x.shape)}")

    def encode_states(self, state_BD: torch.Tensor, *, generator: torch.Generator | None = None) -> torch.Tensor:
        """Queries ``f(s)``: ``(B, D) -> (B, E)``."""
        self._check_last("state_BD", state_BD, 2)
        return self.state_tower(state_BD, generator)

    def encode_cases(self, cases_ND: torch.Tensor, *, generator: torch.Generator | None = None) -> torch.Tensor:
        """Keys ``g(c)``: ``(N, D) -> (N, E)`` (any leading shape works; N is the usual one)."""
        if cases_ND.ndim < 2 or cases_ND.shape[-1] != self.config.dim:
            raise DimensionError(f"TwoTowerQNetwork (dim={self.config.dim}) expects cases_ND of shape "
                                 f"(N, {self.config.dim}); got cases_ND.shape={tuple(cases_ND.shape)}")
        return self.case_tower(cases_ND, generator)

    def forward(self, state_BD: torch.Tensor, cases_BCD: torch.Tensor, *,
                generator: torch.Generator | None = None) -> torch.Tensor:
        self._check_inputs(state_BD, cases_BCD)
        queries_BE = self.state_tower(state_BD, generator)
        keys_BCE = self.case_tower(cases_BCD, generator)
        return torch.einsum("be,bce->bc", queries_BE, keys_BCE) + self.bias

    def placement(self) -> tuple[torch.device, torch.dtype]:
        tower = self.state_tower
        weight = tower.layers[0].weight if len(tower.layers) else tower.out.weight
        return weight.device, weight.dtype

    def score(self, state_BD: torch.Tensor, cases_BCD: torch.Tensor) -> torch.Tensor:
        if type(self).forward is not TwoTowerQNetwork.forward or not self._scores_fast():
            return super().score(state_BD, cases_BCD)
        self._check_inputs(state_BD, cases_BCD)
        queries_BE = self.state_tower(state_BD, None, False)
        keys_BCE = self.case_tower(cases_BCD, None, False)
        return torch.einsum("be,bce->bc", queries_BE, keys_BCE) + self.bias


def build_qnet(config: QNetConfig, generator: torch.Generator | None = None) -> QNetwork:
    """The Q-network ``config.arch`` names, initialised from ``generator`` (default: seeded with ``config.seed``)."""
    if config.dim is None:
        raise ConfigError("QNetConfig.dim=None: give the embedding dimension (QNetConfig.for_dim) before building")
    match config.arch:
        case "mlp" | "mlp_interact":
            net: QNetwork = MLPQNetwork(config)
        case "two_tower":
            net = TwoTowerQNetwork(config)
        case _:  # pragma: no cover - QNetConfig rejects other values
            raise ValueError(f"unknown Q-network arch {config.arch!r}")
    if generator is not None:
        net.reset_parameters(generator)
    logger.debug("built %s Q-network: %d parameters", config.arch, sum(p.numel() for p in net.parameters()))
    return net
