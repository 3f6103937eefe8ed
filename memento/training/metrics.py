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

Under DDP the epoch metrics must be global, not an average of per-process values:
:class:`EpochPairMetrics` accumulates an epoch's (score, label) pairs in torchmetrics states
(``BinaryAUROC``'s exact, threshold-free state for the AUC; per-bin sums for the ECE), which
torchmetrics gathers across processes at ``compute()``; it gives the same values as
:func:`roc_auc` / :func:`expected_calibration_error` on all processes' pairs together.
``torchmetrics.BinaryCalibrationError`` is not used for the ECE: it needs 0/1 targets (rewards may be
soft) and gives ``p = 1.0`` a bin of its own, where :func:`expected_calibration_error` closes the last bin.
"""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["EpochPairMetrics", "expected_calibration_error", "hit_at_k", "random_hit_at_k", "roc_auc"]


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


def _calibration_metric(n_bins: int) -> nn.Module:
    """A torchmetrics ``Metric`` summing, per probability bin, the predictions and labels (and the class counts)."""
    from torchmetrics import Metric

    class BinnedCalibration(Metric):
        full_state_update = False
        is_differentiable = False
        higher_is_better = False

        def __init__(self) -> None:
            super().__init__()
            self.n_bins = n_bins
            self.add_state("prob_sum_B", default=torch.zeros(n_bins, dtype=torch.float64), dist_reduce_fx="sum")
            self.add_state("label_sum_B", default=torch.zeros(n_bins, dtype=torch.float64), dist_reduce_fx="sum")
            self.add_state("n_pos", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
            self.add_state("n", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

        def update(self, probs_N: torch.Tensor, labels_N: torch.Tensor, positive_N: torch.Tensor) -> None:
            probs, labels = _flat(probs_N), _flat(labels_N)
            bins = (probs.clamp(0.0, 1.0) * self.n_bins).floor().long().clamp(max=self.n_bins - 1)
            self.prob_sum_B.index_add_(0, bins, probs)
            self.label_sum_B.index_add_(0, bins, labels)
            self.n_pos += positive_N.sum().to(torch.float64)
            self.n += probs.numel()

        def compute(self) -> torch.Tensor:
            ece = (self.prob_sum_B - self.label_sum_B).abs().sum() / self.n
            return torch.stack([ece, self.n_pos, self.n])

    return BinnedCalibration()


class EpochPairMetrics(nn.Module):
    """An epoch's AUC and ECE over the (score, label) pairs of all processes (see the module docstring).

    ``update(q_N, labels_N, threshold)`` adds pairs: scores (logits), labels (rewards, maybe soft) and the
    reward from which a pair counts as rewarded; ``compute()`` returns ``{"auc": ..., "ece": ...}``, without
    ``"auc"`` when one class is absent (globally) and empty when no process saw a pair; ``reset()`` clears.
    Under ``torch.distributed`` every process must call ``compute()`` (it gathers).
    """

    def __init__(self, n_bins: int = 10):
        super().__init__()
        from torchmetrics.classification import BinaryAUROC

        self.auroc = BinaryAUROC(thresholds=None, validate_args=False)
        self.calibration = _calibration_metric(n_bins)

    def update(self, q_N: torch.Tensor, labels_N: torch.Tensor, threshold: float) -> None:
        q, labels = q_N.detach().float().reshape(-1), labels_N.detach().float().reshape(-1)
        positive = labels >= threshold
        self.auroc.update(q, positive.long())
        self.calibration.update(torch.sigmoid(q), labels, positive)

    def compute(self) -> dict[str, float]:
        import warnings

        with warnings.catch_warnings():  # no update on this process (a split that collects no pairs)
            warnings.filterwarnings("ignore", message=".*compute.*before.*update.*")
            ece, n_pos, n = (float(v) for v in self.calibration.compute())
        if n == 0:
            return {}
        metrics = {"ece": ece}
        if 0 < n_pos < n:
            metrics["auc"] = float(self.auroc.compute())
        return metrics

    def reset(self) -> None:
        self.auroc.reset()
        self.calibration.reset()
