"""Property: a Flat bank's search is exact brute-force top-k, with and without an env filter."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memento.bank import CaseBank
from memento.types import Case
from tests.conftest import unit_vectors

TOL = 1e-5


def _check_row(scores: np.ndarray, ids: np.ndarray, emb: np.ndarray, all_ids: list[str], q: np.ndarray,
               allowed: np.ndarray, k: int) -> None:
    positions = np.flatnonzero(allowed)
    sims = emb[positions] @ (q / np.linalg.norm(q))
    order = np.argsort(-sims, kind="stable")[:k]
    expected_scores = sims[order]
    expected_ids = [all_ids[positions[j]] for j in order]
    found = len(expected_ids)
    assert scores.shape == (k,) and ids.shape == (k,)
    # the found part
    np.testing.assert_allclose(scores[:found], expected_scores, atol=TOL, rtol=0)
    got_ids = list(ids[:found])
    assert None not in got_ids
    # ids agree position by position where the scores are well separated, as sets within near-ties
    for j in range(found):
        near = np.abs(expected_scores - expected_scores[j]) <= TOL
        if near.sum() == 1:
            assert got_ids[j] == expected_ids[j]
    assert set(got_ids) <= {all_ids[p] for p in positions}
    boundary = expected_scores[-1] if found else None
    clear = [expected_ids[j] for j in range(found) if boundary is None or expected_scores[j] > boundary + TOL]
    assert set(clear) <= set(got_ids)
    # the padding
    assert np.isneginf(scores[found:]).all()
    assert list(ids[found:]) == [None] * (k - found)


@settings(max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 60),
    dim=st.integers(2, 12),
    k=st.integers(1, 10),
    seed=st.integers(0, 2**32 - 1),
    use_env=st.booleans(),
    n_queries=st.integers(1, 4),
    filter_env=st.sampled_from([None, "red", "blue"]),
)
def test_flat_search_is_brute_force(n: int, dim: int, k: int, seed: int, use_env: bool, n_queries: int,
                                    filter_env: str | None) -> None:
    rng = np.random.default_rng(seed)
    emb = unit_vectors(rng, n, dim)
    envs = [("red", "blue")[int(b)] for b in rng.integers(0, 2, size=n)] if use_env else [None] * n
    cases = [Case(state=f"state {i}", action=f"action {i}", reward=float(i % 2), env=envs[i]) for i in range(n)]
    queries = unit_vectors(rng, n_queries, dim) * rng.uniform(0.5, 3.0, size=(n_queries, 1)).astype(np.float32)
    env = filter_env if use_env else None
    allowed = np.array([env is None or e == env for e in envs])
    with tempfile.TemporaryDirectory() as tmp, CaseBank.create(Path(tmp) / "bank", dim) as bank:
        ids = bank.add(cases, emb)
        assert len(bank) == n
        scores_BK, ids_BK = bank.search(queries, k, env=env)
        assert scores_BK.shape == (n_queries, k)
        for b in range(n_queries):
            _check_row(scores_BK[b], ids_BK[b], emb, ids, queries[b], allowed, k)
        # the single-query form is the trimmed first row
        s, i = bank.search(queries[0], k, env=env)
        found = min(k, int(allowed.sum()))
        assert s.shape == (found,) and i.shape == (found,)
        np.testing.assert_allclose(s, scores_BK[0][:found], atol=TOL, rtol=0)
