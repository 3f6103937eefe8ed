"""The listwise loss of planner-scored labels: ``memento train --from-labels`` offline, and online the soft-Q
agent's per-candidate labels (:class:`memento.config.OnlineLabelsConfig`, :class:`memento.learn.replay.LabelBuffer`).

For one task (state ``s``) with candidates ``c_1..c_n`` (the valid slots of a row), planner scores
``score_i`` (the mean log-likelihood of the gold answer with ``c_i`` as the only demonstration,
:mod:`memento.learn.labels`) and Q-values ``Q_i = Q(s, c_i)``:

    p_i   = softmax(score / tau)_i  = exp(score_i / tau) / sum_j exp(score_j / tau)     (the target)
    mu_i  = softmax(Q / alpha)_i    = exp(Q_i / alpha)   / sum_j exp(Q_j / alpha)       (the policy)
    KL(p || mu) = sum_i p_i * (log p_i - log mu_i)
                = sum_i p_i log p_i  -  sum_i p_i Q_i / alpha  +  logsumexp_j(Q_j / alpha)

Its gradient is ``d KL / d Q_i = (mu_i - p_i) / alpha``: the minimum is ``mu = p``, i.e. ``Q_i = alpha *
score_i / tau + const(s)``, so the policy ``softmax(Q / alpha)`` reproduces the planner's preferences among
the candidates (EPR / LLM-R distil a scorer this way; the constant per state is free: only the ranking
and the spread within a state are learned). ``tau`` sharpens (small) or flattens (large) the target.

The batch loss is the mean of the per-task KL over the rows with at least two valid candidates (a task with
one candidate has nothing to rank; its KL is 0 whatever Q is). Terms with ``p_i = 0`` contribute 0
(``0 log 0 = 0``). Everything is computed in float32 or wider.

:func:`best_in_top_k` is the validation metric ``hit@K``: whether the planner's best candidate (any of them
on ties) is among the ``K`` candidates with the highest Q.
"""

from __future__ import annotations

import dataclasses
import json
import math
import uuid
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from memento.errors import CheckpointError, DimensionError, MementoError
from memento.io import atomic_write, read_safetensors

__all__ = ["LABEL_BUFFER_FORMAT", "LabelBuffer", "ListwiseBatch", "best_in_top_k", "listwise_kl"]

LABEL_BUFFER_FORMAT = "memento-label-buffer"
LABEL_BUFFER_FORMAT_VERSION = 1
LABEL_BUFFER_NAME = "labels.safetensors"


@dataclasses.dataclass(frozen=True, kw_only=True)
class ListwiseBatch:
    """B tasks, each with up to C scored candidates: ``state_BD``, ``cases_BCD`` (unit vectors), ``score_BC``
    (the labels' ``mean_logprob``; 0 on padding) and ``mask_BC`` (bool, which slots hold a candidate).
    :attr:`cosine_BC` is the cosine similarity of state and case (the cosine baseline of ``hit@K``)."""

    state_BD: torch.Tensor
    cases_BCD: torch.Tensor
    score_BC: torch.Tensor
    mask_BC: torch.Tensor

    @property
    def batch_size(self) -> int:
        return int(self.state_BD.shape[0])

    @property
    def cosine_BC(self) -> torch.Tensor:
        d = self.state_BD.shape[1]  # with case features, a case's embedding is its first D numbers
        return torch.einsum("bd,bcd->bc", self.state_BD.float(), self.cases_BCD[..., :d].float())

    def to(self, device: torch.device | str, non_blocking: bool = False) -> ListwiseBatch:
        return ListwiseBatch(**{f.name: getattr(self, f.name).to(device, non_blocking=non_blocking)
                                for f in dataclasses.fields(self)})


def _check(q_BC: torch.Tensor, score_BC: torch.Tensor, mask_BC: torch.Tensor) -> None:
    if q_BC.ndim != 2 or q_BC.shape != score_BC.shape or q_BC.shape != mask_BC.shape:
        raise ValueError(f"listwise: q_BC.shape={tuple(q_BC.shape)}, score_BC.shape={tuple(score_BC.shape)} and "
                         f"mask_BC.shape={tuple(mask_BC.shape)} must be equal (B, C)")


def listwise_kl(q_BC: torch.Tensor, score_BC: torch.Tensor, mask_BC: torch.Tensor, *, alpha: float,
                tau: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(loss, kl_B)``: the batch loss (mean KL over rows with >= 2 valid candidates; a differentiable 0 when
    there are none) and each row's ``KL(softmax(score / tau) || softmax(Q / alpha))`` over its valid slots
    (see the module docstring)."""
    _check(q_BC, score_BC, mask_BC)
    if not (alpha > 0 and tau > 0 and math.isfinite(alpha) and math.isfinite(tau)):
        raise ValueError(f"listwise_kl: alpha={alpha!r} and tau={tau!r} must be finite and > 0")
    mask_BC = mask_BC.bool()
    dtype = torch.promote_types(q_BC.dtype, torch.float32)
    q = q_BC.to(dtype).masked_fill(~mask_BC, -math.inf)
    s = score_BC.to(dtype).masked_fill(~mask_BC, -math.inf)
    rows_B = mask_BC.sum(dim=1) >= 2
    # a row without any valid slot would give NaN softmaxes: give it one harmless slot (it is not counted)
    empty_B = ~mask_BC.any(dim=1)
    if empty_B.any():
        fill = torch.zeros_like(mask_BC)
        fill[:, 0] = empty_B
        q = torch.where(fill, torch.zeros_like(q), q)
        s = torch.where(fill, torch.zeros_like(s), s)
        mask_BC = mask_BC | fill
    log_p_BC = torch.log_softmax(s / tau, dim=1)
    log_mu_BC = torch.log_softmax(q / alpha, dim=1)
    p_BC = log_p_BC.exp()
    terms_BC = torch.where(mask_BC & (p_BC > 0), p_BC * (log_p_BC - log_mu_BC), torch.zeros_like(p_BC))
    kl_B = terms_BC.sum(dim=1)
    n_rows = rows_B.sum()
    loss = (kl_B * rows_B).sum() / n_rows.clamp_min(1)
    return loss, kl_B


def best_in_top_k(q_BC: torch.Tensor, score_BC: torch.Tensor, mask_BC: torch.Tensor, k: int) -> torch.Tensor:
    """Per row: 1.0 when one of the ``k`` highest-Q valid candidates has the row's highest score, else 0.0.

    Rows without a valid slot give 0. With fewer than ``k`` valid candidates all of them count (1.0).
    """
    _check(q_BC, score_BC, mask_BC)
    if k < 1:
        raise ValueError(f"best_in_top_k: k={k} must be >= 1")
    mask_BC = mask_BC.bool()
    k = min(k, q_BC.shape[1])
    s = score_BC.detach().double().masked_fill(~mask_BC, -math.inf)
    best_BC = (s == s.max(dim=1, keepdim=True).values) & mask_BC
    top_BK = q_BC.detach().double().masked_fill(~mask_BC, -math.inf).topk(k, dim=1).indices
    hit_BK = best_BC.gather(1, top_BK) & mask_BC.gather(1, top_BK)
    return hit_BK.any(dim=1).float()


class LabelBuffer:
    """A ring buffer of labelled tasks for the online listwise loss (:class:`memento.config.OnlineLabelsConfig`):
    per task the state, the case vectors of its (up to ``m``) labelled candidates, their scores (the planner's
    mean log-likelihood of the target) and which slots hold one. Preallocated tensors on ``device``; saved as
    one safetensors file (atomic), so a checkpoint holds it and a resumed run samples exactly the same batches.
    """

    def __init__(self, *, capacity: int, dim: int, m: int, case_width: int, device: torch.device | str = "cpu"):
        if min(capacity, dim, m, case_width) < 1:
            raise MementoError(f"LabelBuffer: capacity={capacity}, dim={dim}, m={m} and case_width={case_width} "
                               "must be >= 1")
        self.capacity, self.dim, self.m, self.case_width = capacity, dim, m, case_width
        self.device = torch.device(device)
        self._ptr = self._size = self._added = 0
        self._allocated = False  # the tensors are made on the first add or load (a served selector never labels)

    def _allocate(self) -> None:
        if self._allocated:
            return
        n, m = self.capacity, self.m
        self.state_ND = torch.zeros(n, self.dim, device=self.device)
        self.cases_NMD = torch.zeros(n, m, self.case_width, device=self.device)
        self.score_NM = torch.zeros(n, m, device=self.device)
        self.mask_NM = torch.zeros(n, m, dtype=torch.bool, device=self.device)
        self._allocated = True

    def __len__(self) -> int:
        return self._size

    @property
    def added(self) -> int:
        return self._added

    def add(self, state_D: np.ndarray, cases_ME: np.ndarray, score_M: np.ndarray) -> None:
        """One labelled task: its state, the case vectors of its labelled candidates and their scores."""
        state_D = np.asarray(state_D, dtype=np.float32)
        cases_ME = np.asarray(cases_ME, dtype=np.float32)
        score_M = np.asarray(score_M, dtype=np.float32)
        n = score_M.shape[0] if score_M.ndim == 1 else -1
        if state_D.shape != (self.dim,) or cases_ME.shape != (n, self.case_width) or not 1 <= n <= self.m \
                or not np.isfinite(score_M).all():
            raise DimensionError(f"LabelBuffer (dim={self.dim}, m={self.m}, case_width={self.case_width}): got "
                                 f"state_D.shape={state_D.shape}, cases_ME.shape={cases_ME.shape}, "
                                 f"score_M.shape={score_M.shape} (finite: {bool(np.isfinite(score_M).all())})")
        self._allocate()
        i = self._ptr
        self.state_ND[i] = torch.from_numpy(state_D)
        self.cases_NMD[i].zero_()
        self.cases_NMD[i, :n] = torch.from_numpy(cases_ME)
        self.score_NM[i].zero_()
        self.score_NM[i, :n] = torch.from_numpy(score_M)
        self.mask_NM[i].zero_()
        self.mask_NM[i, :n] = True
        self._ptr = (i + 1) % self.capacity
        self._size = min(self._size + 1, self.capacity)
        self._added += 1

    def sample(self, batch_size: int, generator: torch.Generator) -> ListwiseBatch:
        """``batch_size`` tasks drawn uniformly with replacement (``generator`` on the buffer's device)."""
        if self._size == 0:
            raise MementoError("cannot sample from an empty label buffer")
        index_B = torch.randint(0, self._size, (batch_size,), generator=generator, device=self.device)
        return ListwiseBatch(state_BD=self.state_ND[index_B], cases_BCD=self.cases_NMD[index_B],
                             score_BC=self.score_NM[index_B], mask_BC=self.mask_NM[index_B])

    def _shape(self) -> dict[str, int]:
        return {"capacity": self.capacity, "dim": self.dim, "m": self.m, "case_width": self.case_width}

    def save(self, directory: str | Path) -> Path:
        """Write ``labels.safetensors`` (the filled rows, the ring position, the shape) into ``directory``."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self._allocate()
        n = self._size
        tensors = {"state_ND": self.state_ND[:n], "cases_NMD": self.cases_NMD[:n], "score_NM": self.score_NM[:n],
                   "mask_NM": self.mask_NM[:n]}
        tensors = {name: x.detach().to("cpu").contiguous() for name, x in tensors.items()}
        meta = {"format": LABEL_BUFFER_FORMAT, "format_version": str(LABEL_BUFFER_FORMAT_VERSION),
                "uid": uuid.uuid4().hex, "shape": json.dumps(self._shape(), sort_keys=True),
                "ptr": str(self._ptr), "size": str(n), "added": str(self._added)}
        path = directory / LABEL_BUFFER_NAME
        atomic_write(path, lambda tmp: save_file(tensors, str(tmp), metadata=meta))
        return path

    def load(self, directory: str | Path) -> None:
        """Restore :meth:`save` output into this (same-shaped) buffer; anything else is a CheckpointError."""
        path = Path(directory) / LABEL_BUFFER_NAME
        if not path.is_file():
            raise CheckpointError(f"{path}: missing (a checkpoint of a run with online labels holds it)")
        tensors, meta = read_safetensors(path, device=str(self.device))
        self._allocate()
        try:
            if meta.get("format") != LABEL_BUFFER_FORMAT or int(meta["format_version"]) != LABEL_BUFFER_FORMAT_VERSION:
                raise ValueError(f"format {meta.get('format')!r} version {meta.get('format_version')!r}")
            if json.loads(meta["shape"]) != self._shape():
                raise ValueError(f"saved for {meta['shape']}, this buffer is {self._shape()}")
            ptr, size, added = int(meta["ptr"]), int(meta["size"]), int(meta["added"])
            if not (0 <= size <= self.capacity and 0 <= ptr < self.capacity and added >= size):
                raise ValueError(f"ptr={ptr}, size={size}, added={added}")
            for name, store in (("state_ND", self.state_ND), ("cases_NMD", self.cases_NMD),
                                ("score_NM", self.score_NM), ("mask_NM", self.mask_NM)):
                value = tensors[name]
                if tuple(value.shape) != (size, *store.shape[1:]) or value.dtype != store.dtype:
                    raise ValueError(f"{name} has shape {tuple(value.shape)} and dtype {value.dtype}")
                store.zero_()
                store[:size].copy_(value)
        except (KeyError, ValueError, TypeError) as error:
            raise CheckpointError(f"{path}: damaged label buffer ({type(error).__name__}: {error})") from None
        self._ptr, self._size, self._added = ptr, size, added
