"""memento.training.metrics: AUC (rank statistic), expected calibration error and hit@K against known answers."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from memento.training.metrics import expected_calibration_error, hit_at_k, random_hit_at_k, roc_auc


def _auc_by_pairs(scores, labels) -> float:
    """The definition: P(score of a positive > score of a negative), ties 1/2."""
    pos = [s for s, y in zip(scores, labels) if y]
    neg = [s for s, y in zip(scores, labels) if not y]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in itertools.product(pos, neg))
    return wins / (len(pos) * len(neg))


@pytest.mark.parametrize("scores, labels, expected", [
    ([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1], 0.75),  # the classic example
    ([1.0, 2.0, 3.0, 4.0], [0, 0, 1, 1], 1.0),
    ([4.0, 3.0, 2.0, 1.0], [0, 0, 1, 1], 0.0),
    ([0.5, 0.5, 0.5, 0.5], [0, 1, 0, 1], 0.5),  # all tied
    ([0.2, 0.5, 0.5, 0.9], [0, 0, 1, 1], 0.875),  # one tie between classes counts one half
])
def test_auc_known_answers(scores, labels, expected):
    assert roc_auc(torch.tensor(scores), torch.tensor(labels)) == pytest.approx(expected)


def test_auc_equals_the_pairwise_definition_with_ties():
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 5, 60).astype(float)  # many ties
    labels = rng.random(60) < 0.4
    assert roc_auc(torch.tensor(scores), torch.tensor(labels)) == pytest.approx(_auc_by_pairs(scores, labels))


def test_auc_is_nan_with_one_class_and_checks_shapes():
    assert math.isnan(roc_auc(torch.tensor([0.1, 0.2]), torch.tensor([1, 1])))
    with pytest.raises(ValueError, match="scores_N.shape"):
        roc_auc(torch.zeros(3), torch.zeros(2))


def test_ece_known_answers():
    # bins of width 0.1: p = 0.2 holds labels (0, 1): |0.2 - 0.5| = 0.3; p = 0.8 holds (1, 1): |0.8 - 1| = 0.2
    probs, labels = torch.tensor([0.2, 0.2, 0.8, 0.8]), torch.tensor([0.0, 1.0, 1.0, 1.0])
    assert expected_calibration_error(probs, labels, n_bins=10) == pytest.approx(0.5 * 0.3 + 0.5 * 0.2)
    # one bin: |mean p - mean y|
    assert expected_calibration_error(probs, labels, n_bins=1) == pytest.approx(abs(0.5 - 0.75))
    # perfectly calibrated bins, and p = 1.0 falls into the last bin
    assert expected_calibration_error(torch.tensor([0.25, 0.25, 0.25, 0.25, 1.0]),
                                      torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0]), n_bins=4) == pytest.approx(0.0)
    assert math.isnan(expected_calibration_error(torch.zeros(0), torch.zeros(0)))
    with pytest.raises(ValueError, match="n_bins"):
        expected_calibration_error(probs, labels, n_bins=0)


def test_hit_at_k_and_its_random_baseline():
    q = torch.tensor([[3.0, 2.0, 1.0, 0.0], [3.0, 2.0, 1.0, 9.0], [0.0, 1.0, 2.0, 3.0]])
    labels = torch.tensor([[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[True] * 4, [True, True, True, False], [True] * 4])  # row 1: the 9.0 is padding
    assert hit_at_k(q, labels, mask, 1).tolist() == [0.0, 0.0, 0.0]
    assert hit_at_k(q, labels, mask, 2).tolist() == [1.0, 0.0, 0.0]
    assert hit_at_k(q, labels, mask, 3).tolist() == [1.0, 1.0, 0.0]
    assert hit_at_k(q, labels, mask, 10).tolist() == [1.0, 1.0, 1.0]  # K beyond the row: every valid case
    # 1 - C(n - p, k) / C(n, k): n=4, p=1, k=2 -> 1 - 3/6; n=3 (one padded), p=1 -> 1 - 1/3
    assert random_hit_at_k(labels, mask, 2).tolist() == pytest.approx([0.5, 1 - 1 / 3, 0.5])
    assert random_hit_at_k(labels, mask, 4).tolist() == pytest.approx([1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="q_SC.shape"):
        hit_at_k(q, labels[:2], mask, 1)


def test_epoch_pair_metrics_match_the_functions_over_batches():
    from memento.training.metrics import EpochPairMetrics

    rng = np.random.default_rng(3)
    q = torch.tensor(rng.integers(-3, 4, 200).astype(np.float32))  # ties
    y = torch.tensor(rng.choice([0.0, 0.25, 0.5, 1.0], 200).astype(np.float32))  # soft rewards
    metrics = EpochPairMetrics(n_bins=7)
    for part in range(0, 200, 64):
        metrics.update(q[part:part + 64], y[part:part + 64], threshold=0.5)
    values = metrics.compute()
    assert values["auc"] == pytest.approx(roc_auc(q, y >= 0.5), abs=1e-6)
    assert values["ece"] == pytest.approx(expected_calibration_error(torch.sigmoid(q), y, 7), abs=1e-9)
    metrics.reset()
    assert metrics.compute() == {}  # no pairs: nothing to log
    metrics.update(q, torch.ones(200), threshold=0.5)
    assert set(metrics.compute()) == {"ece"}  # one class: no AUC
