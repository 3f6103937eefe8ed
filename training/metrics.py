"""Evaluation metrics of offline Q training: AUC, expected calibration error, per-state hit@K.

All take torch tensors (any device) and return Python floats; no sklearn.

- :func:`roc_auc`: the area under the ROC curve as a rank statistic (Mann-Whitney U): the
  probability that a random rewarded pair scores above a random unrewarded one, ties counting
  one half (average ranks). ``nan`` when one class is absent.
- :func:`expected_calibration_error`: ``sum_b (n_b / n) * |mean(p in b) - mean(y in b)|`` over
  ``n_bins`` equal-width bins of the predicted probability on ``[0, 1]`` (the last bin closed).
- :func:`hit_at_k`: per state, whether any of the K top-scored cases among that state's labelled
  cases is rewarded; averaged over states. :func:`random_hit_at_k` is the same quantity for a
  uniformly random order, ``1 - C(n - p, K) / C(n, K)`` for a state with ``n`` cases of which
  ``p`` are rewarded (the baseline a learned ranking must beat).
"""

from __future__ import annotations

import math

import torch

__all__ = ["expected_calibration_error", "hit_at_k", "random_hit_at_k", "roc_auc"]


def _flat(x: torch.Tensor) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        x = torch.as_tensor(x)
    return x.detach().reshape(-1).to(torch.float64)


def roc_auc(scores_N: torch.Tensor, labels_N: torch.Tensor) -> float:
    """AUC of ``scores_N`` for binary ``labels_N`` (1 = rewarded) by average ranks; ``nan`` with one class."""
    scores, labels = _flat(scores_N), _flat(labels_N) > 0.5
    if scores.shape != labels.shape:
        raise ValueError(f"roc_auc: scores_N.shape={tuple(scores_N.shape)} vs labels_N.shape={tuple(labels_N.shape)}")
    n_pos = int(labels.sum())
    n_neg = int(labels.numel()) - n_pos
    if n_pos == 0 or n_neg == 0:
        return math.nan
    order = torch.argsort(scores, stable=True)
    sorted_scores = scores[order]
    # average rank (1-based) within each run of tied scores
    unique, inverse, counts = torch.unique_consecutive(sorted_scores, return_inverse=True, return_counts=True)
    ends = torch.cumsum(counts, 0).to(torch.float64)
    avg_rank_U = ends - (counts.to(torch.float64) - 1.0) / 2.0
    ranks = torch.empty_like(scores)
    ranks[order] = avg_rank_U[inverse]
    rank_sum = float(ranks[labels].sum())
    return (rank_sum - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg)


def expected_calibration_error(probs_N: torch.Tensor, labels_N: torch.Tensor, n_bins: int = 10) -> float:
    """ECE of predicted probabilities against 0/1 (or soft) labels over equal-width bins; ``nan`` when empty."""
    probs, labels = _flat(probs_N), _flat(labels_N)
    if probs.shape != labels.shape:
        raise ValueError(f"expected_calibration_error: probs_N.shape={tuple(probs_N.shape)} vs "
                         f"labels_N.shape={tuple(labels_N.shape)}")
    if n_bins < 1:
        raise ValueError(f"expected_calibration_error: n_bins={n_bins} must be >= 1")
    n = probs.numel()
    if n == 0:
        return math.nan
    bins = (probs.clamp(0.0, 1.0) * n_bins).floor().long().clamp(max=n_bins - 1)
    prob_sum_B = torch.zeros(n_bins, dtype=torch.float64, device=probs.device).index_add_(0, bins, probs)
    label_sum_B = torch.zeros(n_bins, dtype=torch.float64, device=probs.device).index_add_(0, bins, labels)
    return float((prob_sum_B - label_sum_B).abs().sum() / n)


def hit_at_k(q_SC: torch.Tensor, labels_SC: torch.Tensor, mask_SC: torch.Tensor, k: int) -> torch.Tensor:
    """Per state (row): 1.0 if one of the ``k`` highest-scored valid cases is rewarded, else 0.0; shape ``(S,)``.

    ``q_SC`` scores, ``labels_SC`` 0/1 labels and ``mask_SC`` (bool) which of the ``C`` slots hold a case.
    With fewer than ``k`` valid cases all of them count.
    """
    if q_SC.shape != labels_SC.shape or q_SC.shape != mask_SC.shape or q_SC.ndim != 2:
        raise ValueError(f"hit_at_k: q_SC.shape={tuple(q_SC.shape)}, labels_SC.shape={tuple(labels_SC.shape)}, "
                         f"mask_SC.shape={tuple(mask_SC.shape)} must be equal (S, C)")
    if k < 1:
        raise ValueError(f"hit_at_k: k={k} must be >= 1")
    k = min(k, q_SC.shape[1])
    scores = q_SC.detach().float().masked_fill(~mask_SC, -math.inf)
    top_SK = scores.topk(k, dim=1).indices
    hit_SK = (labels_SC.gather(1, top_SK) > 0.5) & mask_SC.gather(1, top_SK)
    return hit_SK.any(dim=1).float()


def random_hit_at_k(labels_SC: torch.Tensor, mask_SC: torch.Tensor, k: int) -> torch.Tensor:
    """Per state: the probability that ``k`` cases drawn uniformly without replacement include a rewarded one."""
    n_S = mask_SC.sum(dim=1).tolist()
    p_S = ((labels_SC > 0.5) & mask_SC).sum(dim=1).tolist()
    out = []
    for n, p in zip(n_S, p_S):
        kk = min(k, n)
        out.append(0.0 if n == 0 else 1.0 - math.comb(n - p, kk) / math.comb(n, kk))
    return torch.tensor(out, dtype=torch.float32)
