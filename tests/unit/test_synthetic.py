"""The SYNTHETIC bandit: a seeded world, an exact oracle, and a known gap between similarity and the optimum."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from memento.bank import CaseBank
from memento.envs import SyntheticBandit, SyntheticBanditConfig
from memento.errors import ConfigError, DataFormatError, DimensionError
from memento.policies import RandomPolicy, SimilarityPolicy
from memento.types import Task

K = 4


@pytest.fixture(scope="module")
def env() -> SyntheticBandit:
    return SyntheticBandit(SyntheticBanditConfig(n_task_types=6, n_cases=300, dim=32, seed=3))


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def test_config_validation() -> None:
    for kwargs in ({"n_task_types": 0}, {"n_cases": 0}, {"dim": 1}, {"noise": -0.1}, {"noise": float("nan")},
                   {"distractor_fraction": 1.0}, {"distractor_fraction": -0.1}, {"distractor_offset": -1.0},
                   {"bias": float("inf")}, {"aggregate": "min"}, {"seed": -1}, {"n_cases": 10.0},
                   {"match_weight": True}):
        with pytest.raises(ConfigError):
            SyntheticBanditConfig(**kwargs)


def test_the_world_is_seeded() -> None:
    a, b = SyntheticBandit(SyntheticBanditConfig(seed=5)), SyntheticBandit(SyntheticBanditConfig(seed=5))
    np.testing.assert_array_equal(a.embeddings_ND, b.embeddings_ND)
    np.testing.assert_array_equal(a.success_TN, b.success_TN)
    assert [c.reward for c in a.cases()[0]] == [c.reward for c in b.cases()[0]]
    ta, sa = a.sample_task(np.random.default_rng(1))
    tb, sb = b.sample_task(np.random.default_rng(1))
    assert ta == tb
    np.testing.assert_array_equal(sa, sb)
    c = SyntheticBandit(SyntheticBanditConfig(seed=6))
    assert not np.array_equal(a.embeddings_ND, c.embeddings_ND)


def test_cases_fill_a_bank_with_matching_positions(env: SyntheticBandit, tmp_path) -> None:
    cases, emb = env.cases()
    assert len(cases) == env.n_cases == emb.shape[0] and emb.shape[1] == env.config.dim
    assert emb.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
    assert len({c.id for c in cases}) == env.n_cases
    assert {c.reward for c in cases} <= {0.0, 1.0} and all(c.env == "synthetic" for c in cases)
    assert "quality" not in cases[0].meta  # hidden
    assert env.is_distractor_N.sum() == round(env.config.distractor_fraction * env.n_cases)
    with CaseBank.create(tmp_path / "bank", dim=env.config.dim) as bank:
        ids = bank.add(cases, emb)
        assert ids == [c.id for c in cases]
        np.testing.assert_array_equal(env.positions(bank.ids_at(np.arange(env.n_cases))), np.arange(env.n_cases))
    with pytest.raises(DataFormatError):
        env.positions(["nope"])


def test_sample_task(env: SyntheticBandit) -> None:
    rng = np.random.default_rng(0)
    types, correct = [], 0
    for _ in range(600):
        task, state = env.sample_task(rng)
        assert isinstance(task, Task) and task.env == "synthetic"
        assert state.dtype == np.float32 and state.shape == (env.config.dim,)
        assert np.linalg.norm(state) == pytest.approx(1.0, abs=1e-5)
        t = env.task_type(task)
        types.append(t)
        correct += int(np.argmax(env.centroids_TD @ state) == t)
    counts = np.bincount(types, minlength=env.config.n_task_types)
    assert counts.min() > 60  # 100 expected each
    assert correct / 600 > 0.9  # states sit near their type's centroid
    with pytest.raises(DataFormatError):
        env.task_type(env.config.n_task_types)
    with pytest.raises(DataFormatError):
        env.task_type(Task(id="x", question="q", answers=("a",)))


def test_oracle_probabilities_follow_the_formula(env: SyntheticBandit) -> None:
    cfg = env.config
    assert ((env.success_TN >= 0) & (env.success_TN <= 1)).all()
    for t, c in [(0, 0), (1, 17), (5, 299)]:
        match = float(env.case_type_N[c] == t and not env.is_distractor_N[c])
        expected = sigmoid(cfg.match_weight * match + cfg.quality_weight * env.quality_N[c] + cfg.bias)
        assert env.success_prob(t, [c]) == pytest.approx(expected, rel=1e-12)
    rng = np.random.default_rng(0)
    for _ in range(50):
        chosen = rng.choice(env.n_cases, size=K, replace=False)
        p = env.success_prob(2, chosen)
        assert 0.0 <= p <= 1.0
        assert p == pytest.approx(env.success_TN[2, chosen].mean())
        assert env.regret(2, chosen) >= -1e-12
    assert env.success_prob(0, []) == pytest.approx(sigmoid(cfg.bias))
    assert env.best_success_prob(0, 10 * env.n_cases) == pytest.approx(env.success_TN[0].mean())


@pytest.mark.parametrize("aggregate", ["mean", "max"])
def test_best_success_prob_is_the_brute_force_optimum(aggregate: str) -> None:
    env = SyntheticBandit(SyntheticBanditConfig(n_task_types=2, n_cases=8, dim=4, aggregate=aggregate, seed=1))
    for t in range(2):
        for k in (1, 2, 3, 4):
            values = [env.success_prob(t, np.array(s)) for s in itertools.combinations(range(8), k)]
            best = env.best_success_prob(t, k)
            assert best == pytest.approx(max(values), abs=1e-12)
            assert all(v <= best + 1e-12 for v in values)
            assert env.success_prob(t, env.oracle_positions(t, k)) == pytest.approx(best, abs=1e-12)


def test_rewards_match_the_oracle_probability(env: SyntheticBandit) -> None:
    rng = np.random.default_rng(0)
    n = 4000
    for chosen in (env.oracle_positions(1, K), np.array([0, 1, 2, 3]), np.array([5])):
        p = env.success_prob(1, chosen)
        rewards = np.array([env.reward(1, chosen, rng) for _ in range(n)])
        assert set(np.unique(rewards)) <= {0.0, 1.0}
        assert abs(rewards.mean() - p) < 4 * math.sqrt(p * (1 - p) / n) + 1e-9, (rewards.mean(), p)


def test_bad_positions_and_k(env: SyntheticBandit) -> None:
    for bad in ([0, 0], [env.n_cases], [-1], [0.5]):
        with pytest.raises(DataFormatError):
            env.success_prob(0, np.array(bad))
    with pytest.raises(DimensionError):
        env.success_prob(0, np.zeros((2, 2), dtype=np.int64))
    for k in (0, -2, 1.5, True):
        with pytest.raises(DataFormatError):
            env.best_success_prob(0, k)  # type: ignore[arg-type]
    with pytest.raises(DataFormatError):
        env.oracle_positions(0, 2, among=[])


def test_similarity_is_not_optimal_but_the_oracle_is(env: SyntheticBandit, tmp_path) -> None:
    """The point of the environment: retrieval by similarity leaves regret a learner can remove."""
    cases, emb = env.cases()
    rng = np.random.default_rng(0)
    regret = {"similarity": [], "random": [], "oracle": [], "oracle_in_candidates": []}
    lured = []
    with CaseBank.create(tmp_path / "bank", dim=env.config.dim) as bank:
        bank.add(cases, emb)
        similarity, uniform = SimilarityPolicy(), RandomPolicy()
        for _ in range(200):
            task, state = env.sample_task(rng)
            cands = bank.candidates(state, 32)
            sel = similarity.select(state, cands, K, rng=rng)
            chosen = cands.positions_C[sel.positions_K]
            lured.append(env.is_distractor_N[chosen].mean())
            regret["similarity"].append(env.regret(task, chosen, K))
            sel = uniform.select(state, bank.candidates(state, env.n_cases), K, rng=rng)
            regret["random"].append(env.regret(task, env.positions(sel.ids), K))
            regret["oracle"].append(env.regret(task, env.oracle_positions(task, K), K))
            regret["oracle_in_candidates"].append(
                env.regret(task, env.oracle_positions(task, K, among=cands.positions_C), K))
    mean = {name: float(np.mean(v)) for name, v in regret.items()}
    assert mean["oracle"] == pytest.approx(0.0, abs=1e-12)
    assert mean["oracle_in_candidates"] < 0.05, mean
    assert mean["similarity"] > 0.15, mean  # similarity is far from optimal...
    assert mean["similarity"] < mean["random"], mean  # ...but better than chance
    assert float(np.mean(lured)) > 0.05  # partly because look-alike distractors lure it
