"""The shared policy helpers against known answers: softmax, Gumbel-top-k, Plackett-Luce, Selection."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from memento.bank import Candidates
from memento.errors import DataFormatError, DimensionError
from memento.learn.policy import (
    check_candidates,
    check_k,
    gumbel_top_k,
    log_softmax,
    make_selection,
    plackett_luce_logprob,
    plackett_luce_prob,
    softmax,
    top_k,
)
from tests.conftest import unit_vectors

# chi-square critical values at significance 0.001 (used when scipy is absent)
CHI2_CRITICAL_001 = {4: 18.467, 19: 43.820}


def chi_square_ok(observed: np.ndarray, expected: np.ndarray, df: int) -> tuple[bool, float]:
    stat = float(((observed - expected) ** 2 / expected).sum())
    try:
        from scipy.stats import chi2
    except ImportError:
        return stat < CHI2_CRITICAL_001[df], stat
    return bool(chi2.sf(stat, df) > 1e-3), stat


def make_candidates(n: int, dim: int = 8, seed: int = 0) -> Candidates:
    emb = unit_vectors(np.random.default_rng(seed), n, dim)
    return Candidates(ids=[f"case-{i}" for i in range(n)], positions_C=np.arange(100, 100 + n),
                      scores_C=np.zeros(n, dtype=np.float32), embeddings_CD=emb)


# ---------------------------------------------------------------- softmax


def test_softmax_equals_the_formula_with_temperature() -> None:
    x = np.array([1.0, 2.0, 3.0, -0.5])
    for t in (1.0, 0.5, 3.0):
        expected = np.exp(x / t) / np.exp(x / t).sum()
        p = softmax(x, t)
        assert p.dtype == np.float64
        np.testing.assert_allclose(p, expected, rtol=1e-12)
        assert p.sum() == pytest.approx(1.0, abs=1e-12)
        np.testing.assert_allclose(log_softmax(x, t), np.log(expected), rtol=1e-12)


def test_softmax_is_stable_with_large_logits() -> None:
    x = np.array([1000.0, 1001.0, 999.0])
    p = softmax(x)
    assert np.isfinite(p).all()
    np.testing.assert_allclose(p, softmax(np.array([1.0, 2.0, 0.0])), rtol=1e-12)
    tiny_t = softmax(np.array([0.3, 0.2, 0.1]), 1e-6)  # logits / T = 3e5
    np.testing.assert_array_equal(tiny_t, [1.0, 0.0, 0.0])
    np.testing.assert_allclose(softmax(np.array([-1e6, -1e6 + 1])), softmax(np.array([0.0, 1.0])), rtol=1e-12)


def test_softmax_masks_minus_inf_and_rejects_bad_input() -> None:
    p = softmax(np.array([0.0, -np.inf, 0.0]))
    np.testing.assert_allclose(p, [0.5, 0.0, 0.5])
    for bad in ([np.nan, 1.0], [np.inf, 0.0], [-np.inf, -np.inf]):
        with pytest.raises(DataFormatError):
            softmax(np.array(bad))
    for t in (0.0, -1.0, np.nan, np.inf, True):
        with pytest.raises(DataFormatError, match="temperature"):
            softmax(np.array([1.0, 2.0]), t)
    with pytest.raises(DimensionError):
        softmax(np.zeros((2, 2)))
    with pytest.raises(DimensionError):
        softmax(np.zeros(0))


def test_top_k_is_descending_with_ties_to_the_earlier() -> None:
    np.testing.assert_array_equal(top_k(np.array([0.1, 0.5, 0.5, 0.9, -1.0]), 3), [3, 1, 2])


# ---------------------------------------------------------------- Gumbel-top-k vs Plackett-Luce


def test_gumbel_top_k_first_draw_frequencies_match_the_distribution() -> None:
    p = np.array([0.4, 0.25, 0.15, 0.12, 0.08])
    rng = np.random.default_rng(7)
    n = 20000
    counts = np.zeros(5)
    for _ in range(n):
        counts[gumbel_top_k(np.log(p), 2, rng)[0]] += 1
    ok, stat = chi_square_ok(counts, n * p, df=4)
    assert ok, (stat, counts / n)


def test_gumbel_top_k_ordered_pairs_match_plackett_luce() -> None:
    p = np.array([0.4, 0.25, 0.15, 0.12, 0.08])
    rng = np.random.default_rng(11)
    n = 20000
    logits = np.log(p) + 3.0  # unnormalised logits draw the same law
    pairs = list(itertools.permutations(range(5), 2))
    counts = dict.fromkeys(pairs, 0)
    for _ in range(n):
        order = gumbel_top_k(logits, 2, rng)
        counts[(int(order[0]), int(order[1]))] += 1
    expected = np.array([n * plackett_luce_prob(p, np.array(pair)) for pair in pairs])
    assert expected.sum() == pytest.approx(n)
    ok, stat = chi_square_ok(np.array([counts[pair] for pair in pairs], dtype=float), expected, df=19)
    assert ok, stat


def test_gumbel_top_k_draws_distinct_and_skips_zero_probability() -> None:
    rng = np.random.default_rng(0)
    logp = np.array([0.0, -np.inf, 0.0, -np.inf])  # probabilities (0.5, 0, 0.5, 0)
    for _ in range(200):
        order = gumbel_top_k(logp, 2, rng)
        assert sorted(order.tolist()) == [0, 2]
    order = gumbel_top_k(logp, 4, rng)  # beyond the support: zero-probability entries last, in index order
    assert sorted(order[:2].tolist()) == [0, 2] and order[2:].tolist() == [1, 3]
    for k in (0, 5, 1.5, True):
        with pytest.raises(DataFormatError):
            gumbel_top_k(logp, k, rng)


def test_gumbel_top_k_is_seeded() -> None:
    logp = np.log(np.full(10, 0.1))
    a = [gumbel_top_k(logp, 3, np.random.default_rng(5)).tolist() for _ in range(3)]
    assert a[0] == a[1] == a[2]
    rng = np.random.default_rng(5)
    assert len({tuple(gumbel_top_k(logp, 3, rng).tolist()) for _ in range(20)}) > 1


# ---------------------------------------------------------------- Plackett-Luce


def test_plackett_luce_hand_computed() -> None:
    p = np.array([0.5, 0.3, 0.2])
    assert plackett_luce_prob(p, np.array([1, 0])) == pytest.approx(0.3 * 0.5 / 0.7)
    assert plackett_luce_prob(p, np.array([2, 0, 1])) == pytest.approx(0.2 * (0.5 / 0.8) * 1.0)
    assert plackett_luce_prob(p, np.array([0])) == pytest.approx(0.5)
    assert plackett_luce_prob(p, np.array([], dtype=np.int64)) == 1.0
    assert plackett_luce_prob(np.array([1.0, 0.0]), np.array([1])) == 0.0


def test_plackett_luce_sums_to_one_over_ordered_k_sets() -> None:
    p = softmax(np.array([0.3, -1.0, 2.0, 0.0, 0.7]))
    for k in (1, 2, 3, 5):
        total = sum(plackett_luce_prob(p, np.array(o)) for o in itertools.permutations(range(5), k))
        assert total == pytest.approx(1.0, abs=1e-12)


def test_plackett_luce_logprob_matches_and_survives_underflow() -> None:
    z = np.array([0.3, -1.0, 2.0, 0.0])
    for order in ([2, 0], [1, 3, 0], [0, 1, 2, 3]):
        assert math.exp(plackett_luce_logprob(z, np.array(order))) == pytest.approx(
            plackett_luce_prob(softmax(z), np.array(order)), rel=1e-12)
    z_cold = np.array([3.0, 2.0, 1.0]) / 1e-4  # probabilities underflow to (1, 0, 0)
    assert plackett_luce_prob(softmax(z_cold), np.array([0, 1])) == 0.0
    assert plackett_luce_logprob(z_cold, np.array([0, 1])) == pytest.approx(0.0, abs=1e-12)


def test_plackett_luce_rejects_bad_input() -> None:
    p = np.array([0.5, 0.3, 0.2])
    for order in ([0, 0], [3], [-1], [0.5]):
        with pytest.raises(DataFormatError):
            plackett_luce_prob(p, np.array(order))
    with pytest.raises(DataFormatError, match="sum to 1"):
        plackett_luce_prob(np.array([0.5, 0.3]), np.array([0]))
    with pytest.raises(DataFormatError):
        plackett_luce_prob(np.array([1.5, -0.5]), np.array([0]))


# ---------------------------------------------------------------- make_selection and input checks


def test_make_selection_fields_are_consistent() -> None:
    cands = make_candidates(5)
    p = softmax(np.array([0.1, 0.4, -0.2, 0.9, 0.0]))
    order = np.array([3, 0, 4])
    sel = make_selection(cands, p, order, greedy=False)
    assert sel.ids == ["case-3", "case-0", "case-4"] == [sel.candidate_ids[i] for i in sel.positions_K]
    assert sel.candidate_ids == cands.ids
    np.testing.assert_array_equal(sel.positions_K, order)
    np.testing.assert_array_equal(sel.probs_K, p[order])
    np.testing.assert_array_equal(sel.probs_C, p)
    assert sel.set_prob == pytest.approx(p[3] * p[0] / (1 - p[3]) * p[4] / (1 - p[3] - p[0]))
    assert not sel.greedy and len(sel) == 3
    logits = np.log(p) + 1.0
    assert make_selection(cands, p, order, False, logits_C=logits).set_prob == pytest.approx(sel.set_prob, rel=1e-12)
    greedy = make_selection(cands, p, order, greedy=True)
    assert greedy.greedy and greedy.set_prob == 1.0
    np.testing.assert_array_equal(greedy.probs_K, p[order])


def test_make_selection_rejects_inconsistent_input() -> None:
    cands = make_candidates(3)
    p = np.array([0.2, 0.3, 0.5])
    with pytest.raises(DimensionError):
        make_selection(cands, np.array([0.5, 0.5]), np.array([0]), False)
    with pytest.raises(DataFormatError):
        make_selection(cands, np.array([0.2, 0.3, 0.6]), np.array([0]), False)
    with pytest.raises(DataFormatError):
        make_selection(cands, p, np.array([1, 1]), False)
    with pytest.raises(DataFormatError):
        make_selection(cands, p, np.array([3]), False)
    with pytest.raises(DataFormatError):
        make_selection(cands, p, np.array([], dtype=np.int64), False)


def test_check_candidates_and_k() -> None:
    cands = make_candidates(4, dim=8)
    state = unit_vectors(np.random.default_rng(1), 1, 8)[0]
    assert check_candidates(state, cands).shape == (8,)
    empty = Candidates(ids=[], positions_C=np.zeros(0, np.int64), scores_C=np.zeros(0, np.float32),
                       embeddings_CD=np.zeros((0, 8), np.float32))
    with pytest.raises(DataFormatError, match="empty"):
        check_candidates(state, empty)
    with pytest.raises(DimensionError):
        check_candidates(state[:4], cands)
    with pytest.raises(DimensionError):
        check_candidates(state[None, :], cands)
    with pytest.raises(DataFormatError):
        check_candidates(np.full(8, np.nan), cands)
    assert check_k(2, 4) == 2
    assert check_k(9, 4) == 4
    for bad in (0, -1, 2.0, True, "2"):
        with pytest.raises(DataFormatError):
            check_k(bad, 4)  # type: ignore[arg-type]
