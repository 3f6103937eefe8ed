"""The listwise loss of training from planner-scored labels (``memento train --from-labels``).

For one task (state ``s``) with candidates ``c_1..c_n`` (the valid slots of a row), planner scores
``score_i`` (the mean log-likelihood of the gold answer with ``c_i`` as the only demonstration,
:mod:`memento.labels`) and Q-values ``Q_i = Q(s, c_i)``:

    p_i   = softmax(score / tau)_i  = exp(score_i / tau) / sum_j exp(score_j / tau)     (the target)
    mu_i  = softmax(Q / alpha)_i    = exp(Q_i / alpha)   / sum_j exp(Q_j / alpha)       (the policy, DESIGN §2)
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
import math

import torch

__all__ = ["ListwiseBatch", "best_in_top_k", "listwise_kl"]


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
