"""The selection policies (random, similarity, soft-Q, LinUCB) against known answers."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from memento.bank import Candidates, CaseBank
from memento.errors import ConfigError, DataFormatError, DimensionError
from memento.learn.policy import Observation, Policy, PolicyContext, plackett_luce_prob, softmax
from memento.policies import (
    LinUCBConfig,
    LinUCBPolicy,
    RandomConfig,
    RandomPolicy,
    SimilarityConfig,
    SimilarityPolicy,
    SoftQAgent,
    SoftQConfig,
    SoftQPolicy,
    bank_rewards,
    make_policy,
    with_rewards,
)
from memento.types import Case, Selection
from tests.conftest import unit_vectors

DIM = 8


class FixedQ(torch.nn.Module):
    """Q(s, c) = a fixed vector, whatever the inputs (a buffer, no parameters)."""

    def __init__(self, q_C: np.ndarray):
        super().__init__()
        self.register_buffer("q_C", torch.as_tensor(q_C, dtype=torch.float32))

    def forward(self, state_BD: torch.Tensor, cases_BCD: torch.Tensor) -> torch.Tensor:
        return self.q_C.expand(state_BD.shape[0], -1)


class BilinearQ(torch.nn.Module):
    """Q(s, c) = s^T W c."""

    def __init__(self, w_DD: np.ndarray):
        super().__init__()
        self.w = torch.nn.Parameter(torch.as_tensor(w_DD, dtype=torch.float32))

    def forward(self, state_BD: torch.Tensor, cases_BCD: torch.Tensor) -> torch.Tensor:
        return torch.einsum("bd,de,bce->bc", state_BD, self.w, cases_BCD)


def make_candidates(n: int, dim: int = DIM, seed: int = 0, *, scale: bool = False) -> Candidates:
    rng = np.random.default_rng(seed)
    emb = unit_vectors(rng, n, dim)
    if scale:  # non-unit vectors: cosine and inner product then rank differently
        emb = emb * rng.uniform(0.2, 3.0, size=(n, 1)).astype(np.float32)
    return Candidates(ids=[f"case-{i}" for i in range(n)], positions_C=np.arange(100, 100 + n),
                      scores_C=np.zeros(n, dtype=np.float32), embeddings_CD=emb)


def make_state(seed: int = 1, dim: int = DIM) -> np.ndarray:
    return unit_vectors(np.random.default_rng(seed), 1, dim)[0]


def assert_valid_selection(sel: Selection, cands: Candidates, k: int) -> None:
    assert isinstance(sel, Selection)
    assert len(sel) == min(k, len(cands)) == len(sel.positions_K) == len(sel.probs_K)
    assert sel.candidate_ids == list(cands.ids)
    assert sel.ids == [cands.ids[int(p)] for p in sel.positions_K]
    assert len(set(sel.ids)) == len(sel.ids)
    assert sel.probs_C.dtype == np.float64 and sel.probs_C.shape == (len(cands),)
    assert sel.probs_C.sum() == pytest.approx(1.0, abs=1e-9)
    np.testing.assert_array_equal(sel.probs_K, sel.probs_C[sel.positions_K])
    if sel.greedy:
        assert sel.set_prob == 1.0
    else:
        assert sel.set_prob == pytest.approx(plackett_luce_prob(sel.probs_C, sel.positions_K), rel=1e-9, abs=1e-300)


def all_policies() -> dict[str, Policy]:
    rng = np.random.default_rng(3)
    return {
        "random": RandomPolicy(),
        "similarity": SimilarityPolicy(),
        "similarity_sampled": SimilarityPolicy(SimilarityConfig(sample=True, temperature=0.2)),
        "soft_q": SoftQPolicy(BilinearQ(rng.normal(size=(DIM, DIM))), alpha=0.5),
        "linucb": LinUCBPolicy(LinUCBConfig(dim=DIM)),
    }


POLICY_NAMES = list(all_policies())


# ---------------------------------------------------------------- every policy


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_policy_contract(name: str) -> None:
    policy = all_policies()[name]
    assert isinstance(policy, Policy)
    cands, state = make_candidates(12), make_state()
    p = policy.probs(state, cands)
    assert p.dtype == np.float64 and p.shape == (12,) and p.sum() == pytest.approx(1.0) and (p >= 0).all()
    for greedy in (False, True):
        sel = policy.select(state, cands, 4, rng=np.random.default_rng(0), greedy=greedy)
        assert_valid_selection(sel, cands, 4)
        np.testing.assert_allclose(sel.probs_C, p, rtol=1e-9)


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_k_above_c_selects_all(name: str) -> None:
    policy = all_policies()[name]
    cands = make_candidates(3)
    for greedy in (False, True):
        sel = policy.select(make_state(), cands, 10, rng=np.random.default_rng(0), greedy=greedy)
        assert_valid_selection(sel, cands, 10)
        assert sorted(sel.ids) == sorted(cands.ids)


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_empty_candidates_and_bad_k_raise(name: str) -> None:
    policy = all_policies()[name]
    empty = Candidates(ids=[], positions_C=np.zeros(0, np.int64), scores_C=np.zeros(0, np.float32),
                       embeddings_CD=np.zeros((0, DIM), np.float32))
    with pytest.raises(DataFormatError, match="empty"):
        policy.select(make_state(), empty, 4, rng=np.random.default_rng(0))
    with pytest.raises(DataFormatError, match="empty"):
        policy.probs(make_state(), empty)
    with pytest.raises(DataFormatError, match="k must"):
        policy.select(make_state(), make_candidates(3), 0, rng=np.random.default_rng(0))
    with pytest.raises(DimensionError):
        policy.select(make_state(dim=DIM + 1), make_candidates(3), 1, rng=np.random.default_rng(0))


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_seeded_determinism(name: str) -> None:
    cands = make_candidates(20)
    states = [make_state(seed) for seed in range(5)]

    def run(seed: int) -> list[list[str]]:
        policy, rng = all_policies()[name], np.random.default_rng(seed)
        return [policy.select(s, cands, 3, rng=rng).ids for s in states]

    assert run(42) == run(42)


# ---------------------------------------------------------------- random


def test_random_is_uniform_and_samples_even_when_greedy() -> None:
    cands = make_candidates(6)
    policy = RandomPolicy()
    np.testing.assert_allclose(policy.probs(make_state(), cands), np.full(6, 1 / 6))
    sel = policy.select(make_state(), cands, 3, rng=np.random.default_rng(0), greedy=True)
    assert not sel.greedy and sel.set_prob == pytest.approx(math.factorial(3) / math.factorial(6))
    rng = np.random.default_rng(1)
    firsts = np.bincount([int(policy.select(make_state(), cands, 2, rng=rng).positions_K[0]) for _ in range(3000)],
                         minlength=6)
    assert firsts.min() > 400 and firsts.max() < 600  # 500 expected each


# ---------------------------------------------------------------- similarity


def cosine(state: np.ndarray, cands: Candidates) -> np.ndarray:
    e = cands.embeddings_CD.astype(np.float64)
    return e @ state / (np.linalg.norm(e, axis=1) * np.linalg.norm(state))


def test_similarity_greedy_is_cosine_top_k() -> None:
    cands, state = make_candidates(30, scale=True), make_state()
    cos = cosine(state, cands)
    expected = np.argsort(-cos)[:5]
    assert not np.array_equal(expected, np.argsort(-(cands.embeddings_CD @ state))[:5])  # cosine, not dot
    policy = SimilarityPolicy(SimilarityConfig(temperature=0.1))
    for greedy in (True, False):  # sample=False: deterministic either way
        sel = policy.select(state, cands, 5, rng=np.random.default_rng(0), greedy=greedy)
        np.testing.assert_array_equal(sel.positions_K, expected)
        assert sel.greedy and sel.set_prob == 1.0
    np.testing.assert_allclose(policy.probs(state, cands), softmax(cos / 0.1), rtol=1e-6)


def test_similarity_sampling_follows_softmax_over_cosine() -> None:
    cands, state = make_candidates(6), make_state()
    policy = SimilarityPolicy(SimilarityConfig(sample=True, temperature=0.5))
    p = softmax(cosine(state, cands) / 0.5)
    rng = np.random.default_rng(2)
    sels = [policy.select(state, cands, 2, rng=rng) for _ in range(4000)]
    assert all(not s.greedy for s in sels)
    firsts = np.bincount([int(s.positions_K[0]) for s in sels], minlength=6) / 4000
    np.testing.assert_allclose(firsts, p, atol=0.03)
    assert_valid_selection(sels[0], cands, 2)
    greedy = policy.select(state, cands, 2, rng=rng, greedy=True)
    np.testing.assert_array_equal(greedy.positions_K, np.argsort(-p)[:2])


def test_similarity_positive_only_excludes_failed_cases() -> None:
    cands, state = make_candidates(10), make_state()
    rewards = np.array([1, 0, 1, 0, 0, 1, 0, 0, 1, 0], dtype=float)
    cos = cosine(state, cands)
    positive = np.flatnonzero(rewards > 0)
    expected = positive[np.argsort(-cos[positive])][:3]
    via_attr = SimilarityPolicy(SimilarityConfig(positive_only=True))
    via_fn = SimilarityPolicy(SimilarityConfig(positive_only=True),
                              reward_of=lambda ids: [rewards[int(i.split("-")[1])] for i in ids])
    for policy, c in ((via_attr, with_rewards(cands, rewards)), (via_fn, cands)):
        sel = policy.select(state, c, 3, rng=np.random.default_rng(0))
        np.testing.assert_array_equal(sel.positions_K, expected)
        p = policy.probs(state, c)
        assert (p[rewards == 0] == 0).all() and p.sum() == pytest.approx(1.0)
        assert_valid_selection(sel, c, 3)
    sampled = SimilarityPolicy(SimilarityConfig(positive_only=True, sample=True, temperature=1.0))
    rng = np.random.default_rng(0)
    for _ in range(200):
        sel = sampled.select(state, with_rewards(cands, rewards), 3, rng=rng)
        assert set(sel.positions_K.tolist()) <= set(positive.tolist())
    few = sampled.select(state, with_rewards(cands, rewards), 9, rng=rng)  # only 4 positives: all of them
    assert sorted(few.positions_K.tolist()) == positive.tolist()


def test_similarity_positive_only_edge_cases() -> None:
    cands, state = make_candidates(5), make_state()
    with pytest.raises(DataFormatError, match="rewards"):
        SimilarityPolicy(SimilarityConfig(positive_only=True)).select(state, cands, 2, rng=np.random.default_rng(0))
    none_positive = with_rewards(cands, np.zeros(5))
    fallback = SimilarityPolicy(SimilarityConfig(positive_only=True))
    sel = fallback.select(state, none_positive, 2, rng=np.random.default_rng(0))
    np.testing.assert_array_equal(sel.positions_K, np.argsort(-cosine(state, cands))[:2])
    strict = SimilarityPolicy(SimilarityConfig(positive_only=True, if_no_positive="error"))
    with pytest.raises(DataFormatError, match="reward > 0"):
        strict.select(state, none_positive, 2, rng=np.random.default_rng(0))
    with pytest.raises(DimensionError):
        with_rewards(cands, np.zeros(4))
    bad_fn = SimilarityPolicy(SimilarityConfig(positive_only=True), reward_of=lambda ids: [1.0])
    with pytest.raises(DimensionError):
        bad_fn.probs(state, cands)
    # without positive_only rewards are never needed
    SimilarityPolicy().select(state, cands, 2, rng=np.random.default_rng(0))


def test_similarity_positive_only_reads_a_real_bank(tmp_path) -> None:
    rng = np.random.default_rng(0)
    emb = unit_vectors(rng, 40, DIM)
    cases = [Case(state=f"task {i}", action=f"answer {i}", reward=float(i % 3 == 0)) for i in range(40)]
    with CaseBank.create(tmp_path / "bank", dim=DIM) as bank:
        bank.add(cases, emb)
        state = make_state()
        cands = bank.candidates(state, 20)
        policy = SimilarityPolicy(SimilarityConfig(positive_only=True), reward_of=bank_rewards(bank))
        sel = policy.select(state, cands, 4, rng=rng)
        assert all(case.reward > 0 for case in bank.get(sel.ids))
        stored = np.array([c.reward for c in bank.get(cands.ids)])
        expected = np.flatnonzero(stored > 0)[:4]  # candidates come in cosine order
        np.testing.assert_array_equal(sel.positions_K, expected)


def test_similarity_config_validation() -> None:
    for kwargs in ({"temperature": 0.0}, {"temperature": -1.0}, {"temperature": float("nan")},
                   {"sample": "yes"}, {"positive_only": 1}, {"if_no_positive": "skip"}):
        with pytest.raises(ConfigError):
            SimilarityConfig(**kwargs)


# ---------------------------------------------------------------- soft-Q


def test_soft_q_probs_are_softmax_of_q_over_alpha() -> None:
    cands, state = make_candidates(10), make_state()
    w = np.random.default_rng(4).normal(size=(DIM, DIM))
    q = state.astype(np.float64) @ w @ cands.embeddings_CD.astype(np.float64).T
    for alpha in (0.1, 1.0, 3.0):
        policy = SoftQPolicy(BilinearQ(w), alpha=alpha)
        np.testing.assert_allclose(policy.q_values(state, cands), q, rtol=1e-4, atol=1e-5)
        expected = np.exp(q / alpha) / np.exp(q / alpha).sum()
        np.testing.assert_allclose(policy.probs(state, cands), expected, rtol=1e-4, atol=1e-7)


def test_soft_q_greedy_is_top_k_by_q() -> None:
    q = np.array([0.1, 2.0, -1.0, 0.7, 1.5, 0.0])
    policy = SoftQPolicy(FixedQ(q), alpha=10.0)
    sel = policy.select(make_state(), make_candidates(6), 3, rng=np.random.default_rng(0), greedy=True)
    np.testing.assert_array_equal(sel.positions_K, [1, 4, 3])
    assert sel.greedy and sel.set_prob == 1.0
    assert sel.ids == ["case-1", "case-4", "case-3"]


def test_soft_q_sampling_matches_the_policy_distribution() -> None:
    q = np.array([1.0, 0.5, 0.0, -0.5])
    policy = SoftQPolicy(FixedQ(q), alpha=0.5)
    cands, state = make_candidates(4), make_state()
    rng = np.random.default_rng(9)
    sels = [policy.select(state, cands, 2, rng=rng) for _ in range(4000)]
    firsts = np.bincount([int(s.positions_K[0]) for s in sels], minlength=4) / 4000
    np.testing.assert_allclose(firsts, softmax(q, 0.5), atol=0.03)
    for sel in sels[:20]:
        assert not sel.greedy
        assert_valid_selection(sel, cands, 2)


def test_soft_q_alpha_limits() -> None:
    q = np.array([0.3, 0.9, 0.1, 0.5, -0.2])
    cands, state = make_candidates(5), make_state()
    cold = SoftQPolicy(FixedQ(q), alpha=1e-4)
    np.testing.assert_allclose(cold.probs(state, cands), [0, 1, 0, 0, 0], atol=1e-12)
    rng = np.random.default_rng(0)
    greedy = cold.select(state, cands, 3, rng=rng, greedy=True)
    for _ in range(50):
        sampled = cold.select(state, cands, 3, rng=rng)
        np.testing.assert_array_equal(sampled.positions_K, greedy.positions_K)
        assert sampled.set_prob == pytest.approx(1.0)  # exact via log space although probs underflow
    hot = SoftQPolicy(FixedQ(q), alpha=1e4)
    np.testing.assert_allclose(hot.probs(state, cands), np.full(5, 0.2), atol=1e-4)


def test_soft_q_alpha_is_a_validated_attribute() -> None:
    policy = SoftQPolicy(FixedQ(np.array([0.0, 1.0])), alpha=1.0)
    policy.alpha = 0.25
    assert policy.alpha == 0.25
    np.testing.assert_allclose(policy.probs(make_state(), make_candidates(2)), softmax(np.array([0.0, 1.0]), 0.25),
                               rtol=1e-6)
    for bad in (0.0, -1.0, float("nan"), float("inf"), True, "1"):
        with pytest.raises(ConfigError, match="alpha"):
            policy.alpha = bad  # type: ignore[assignment]
    with pytest.raises(ConfigError):
        SoftQPolicy(lambda s, c: s, alpha=1.0)  # type: ignore[arg-type]


def test_soft_q_checks_the_qnet_output_and_restores_train_mode() -> None:
    class WrongShape(torch.nn.Module):
        def forward(self, state_BD: torch.Tensor, cases_BCD: torch.Tensor) -> torch.Tensor:
            return cases_BCD.sum(-1)[:, :-1]

    with pytest.raises(DimensionError, match="qnet returned"):
        SoftQPolicy(WrongShape()).probs(make_state(), make_candidates(4))
    net = BilinearQ(np.eye(DIM))
    net.train()
    SoftQPolicy(net).select(make_state(), make_candidates(4), 2, rng=np.random.default_rng(0))
    assert net.training
    assert net.w.grad is None


@pytest.mark.gpu
def test_soft_q_runs_on_the_qnets_cuda_device() -> None:
    w = np.random.default_rng(4).normal(size=(DIM, DIM))
    cands, state = make_candidates(16), make_state()
    cpu = SoftQPolicy(BilinearQ(w)).q_values(state, cands)
    gpu = SoftQPolicy(BilinearQ(w).cuda()).q_values(state, cands)
    np.testing.assert_allclose(gpu, cpu, rtol=1e-3, atol=1e-4)


# ---------------------------------------------------------------- LinUCB


def linear_bandit(seed: int = 0, n_arms: int = 10, dim: int = 6):
    """Mean reward 0.5 + 0.4 * [s * c, c] . theta (|theta| = 1/sqrt(2)), so in [0.1, 0.9]."""
    rng = np.random.default_rng(seed)
    arms = Candidates(ids=[f"arm-{i}" for i in range(n_arms)], positions_C=np.arange(n_arms),
                      scores_C=np.zeros(n_arms, np.float32), embeddings_CD=unit_vectors(rng, n_arms, dim))
    theta = unit_vectors(rng, 1, 2 * dim)[0].astype(np.float64) / math.sqrt(2)

    def mean_reward(state: np.ndarray) -> np.ndarray:
        e = arms.embeddings_CD.astype(np.float64)
        return 0.5 + 0.4 * np.concatenate([e * state, e], axis=1) @ theta

    return arms, mean_reward, rng


def run_bandit(policy, arms, mean_reward, rng, rounds: int, dim: int) -> np.ndarray:
    regret = np.zeros(rounds)
    for t in range(rounds):
        state = unit_vectors(rng, 1, dim)[0]
        mu = mean_reward(state)
        sel = policy.select(state, arms, 1, rng=rng)
        c = int(sel.positions_K[0])
        regret[t] = mu.max() - mu[c]
        if isinstance(policy, LinUCBPolicy):
            policy.update_selection(state, arms, sel, float(mu[c] + 0.1 * rng.normal()))
    return regret


@pytest.mark.parametrize("mode", ["shared", "disjoint"])
def test_linucb_learns_a_linear_bandit(mode: str) -> None:
    arms, mean_reward, rng = linear_bandit()
    features = "product_concat" if mode == "shared" else "concat"  # disjoint: one model per arm
    linucb = LinUCBPolicy(LinUCBConfig(dim=6, mode=mode, features=features, exploration=0.5))
    rounds = 1200
    regret = run_bandit(linucb, arms, mean_reward, rng, rounds, 6)
    arms2, mean_reward2, rng2 = linear_bandit()
    random_regret = run_bandit(RandomPolicy(), arms2, mean_reward2, rng2, rounds, 6)
    assert regret[-200:].mean() < 0.25 * random_regret[-200:].mean(), (regret[-200:].mean(),
                                                                         random_regret[-200:].mean())
    assert regret[-200:].mean() < regret[:200].mean()
    assert linucb.n_updates == rounds


def test_linucb_scores_by_hand() -> None:
    policy = LinUCBPolicy(LinUCBConfig(dim=2, features="product", exploration=2.0, ridge=1.0, intercept=False))
    cands = Candidates(ids=["a", "b"], positions_C=np.arange(2), scores_C=np.zeros(2, np.float32),
                       embeddings_CD=np.array([[1.0, 0.0], [0.0, 1.0]], np.float32))
    state = np.array([1.0, 1.0])
    mean, bonus = policy.scores(state, cands)
    np.testing.assert_allclose(mean, [0.0, 0.0])
    np.testing.assert_allclose(bonus, [2.0, 2.0])
    policy.update(state, cands.embeddings_CD[0], 1.0)  # x = (1, 0): A = diag(2, 1), b = (1, 0)
    mean, bonus = policy.scores(state, cands)
    np.testing.assert_allclose(mean, [0.5, 0.0])
    np.testing.assert_allclose(bonus, [2.0 * math.sqrt(0.5), 2.0])
    ucb_sel = policy.select(state, cands, 1, rng=np.random.default_rng(0))
    assert ucb_sel.ids == ["b"]  # 0 + 2 > 0.5 + 1.41
    greedy_sel = policy.select(state, cands, 1, rng=np.random.default_rng(0), greedy=True)
    assert greedy_sel.ids == ["a"] and greedy_sel.greedy and greedy_sel.set_prob == 1.0
    np.testing.assert_allclose(policy.probs(state, cands), softmax(mean + bonus, 0.1))


def test_linucb_validation() -> None:
    for kwargs in ({"dim": 0}, {"dim": 4, "features": "outer"}, {"dim": 4, "mode": "both"},
                   {"dim": 4, "features": "state"}, {"dim": 4, "exploration": -1.0}, {"dim": 4, "ridge": 0.0},
                   {"dim": 4, "temperature": float("nan")}, {"dim": 4, "intercept": 1}):
        with pytest.raises(ConfigError):
            LinUCBConfig(**kwargs)
    assert LinUCBConfig(dim=4, features="state", mode="disjoint").feature_dim == 5
    assert LinUCBConfig(dim=4, intercept=False).feature_dim == 8
    policy = LinUCBPolicy(LinUCBConfig(dim=4, mode="disjoint"))
    with pytest.raises(DataFormatError, match="case_id"):
        policy.update(np.ones(4), np.ones(4), 1.0)
    with pytest.raises(DimensionError):
        policy.update(np.ones(3), np.ones(3), 1.0, case_id="a")
    with pytest.raises(DataFormatError):
        policy.update(np.ones(4), np.ones(4), float("nan"), case_id="a")
    with pytest.raises(DimensionError, match="LinUCBConfig.dim=4"):
        policy.probs(make_state(dim=8), make_candidates(3, dim=8))
    other = make_candidates(3, dim=4)
    sel = policy.select(make_state(dim=4), other, 1, rng=np.random.default_rng(0))
    with pytest.raises(DataFormatError, match="another candidate set"):
        policy.update_selection(make_state(dim=4), make_candidates(4, dim=4, seed=5), sel, 1.0)


# ---------------------------------------------------------------- the factory


def test_make_policy_builds_each_kind() -> None:
    context = PolicyContext(dim=4, k_max=2, reward_of=lambda ids: np.ones(len(ids)))
    assert isinstance(make_policy(RandomConfig(), context), RandomPolicy)
    sim = make_policy(SimilarityConfig(temperature=0.2, positive_only=True), context)
    assert isinstance(sim, SimilarityPolicy) and sim.config.temperature == 0.2 and sim.reward_of is not None
    soft_q = make_policy(SoftQConfig(alpha=0.3, warmup=2), context)
    assert isinstance(soft_q, SoftQAgent) and soft_q.alpha == 0.3 and soft_q.learner.qnet.config.dim == 4
    assert soft_q.buffer.config.k_max == 2 and soft_q.version == 0 and soft_q.reward_range == (0.0, 1.0)
    linucb = make_policy(LinUCBConfig(exploration=0.1), context)
    assert isinstance(linucb, LinUCBPolicy) and linucb.config == LinUCBConfig(dim=4, exploration=0.1)
    for policy in (sim, soft_q, linucb):
        assert isinstance(policy, Policy)


def test_make_policy_rejects_bad_arguments() -> None:
    context = PolicyContext(dim=4)
    with pytest.raises(ConfigError, match="must be one of"):
        make_policy("greedy", context)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="PolicyContext"):
        make_policy(RandomConfig(), {"dim": 4})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="reward_of"):
        make_policy(SoftQConfig(positive_only=True), context)
    with pytest.raises(ConfigError, match="temperature"):
        LinUCBConfig(dim=4, temperature=-1.0)
    with pytest.raises(ConfigError, match="dim=None"):
        LinUCBPolicy(LinUCBConfig())


def test_soft_q_agent_records_then_learns_after_warmup() -> None:
    """observe: every decision of a round enters the replay buffer first, then updates_per_step steps per
    decision once `warmup` decisions are logged; propensities are those logged; a K > k_max choice is split."""
    context = PolicyContext(dim=DIM, k_max=2, qnet_seed=1, learner_seed=2)
    agent = make_policy(SoftQConfig(warmup=3, updates_per_step=2), context)
    cands = make_candidates(6)
    rng = np.random.default_rng(0)

    def observation(step: int, k: int = 2) -> Observation:
        sel = agent.select(make_state(step), cands, k, rng=rng)
        return Observation(state_D=make_state(step), candidates=cands, selection=sel, reward=float(step % 2),
                           step=step, policy_version=agent.version)

    assert agent.observe([observation(0), observation(1)]) == {}  # 2 < warmup: recorded, not learned
    assert agent.buffer.added == 2 and agent.version == 0
    metrics = agent.observe([observation(2)])
    assert agent.version == 2 and metrics["updates"] == 2 and np.isfinite(metrics["loss"])
    agent.observe([observation(3), observation(4)], learn=False)
    assert agent.version == 2 and agent.buffer.added == 5
    agent.observe([observation(5, k=3)])  # 3 cases, k_max 2: two rows
    assert agent.buffer.added == 7 and agent.version == 4


def test_linucb_checkpoint_replays_its_log(tmp_path) -> None:
    context = PolicyContext(dim=DIM)
    a, b = make_policy(LinUCBConfig(), context), make_policy(LinUCBConfig(), context)
    cands, rng = make_candidates(6), np.random.default_rng(0)
    for step in range(5):
        sel = a.select(make_state(step), cands, 2, rng=rng)
        a.observe([Observation(state_D=make_state(step), candidates=cands, selection=sel, reward=float(step % 2),
                               step=step, policy_version=a.version)])
    a.checkpoint(tmp_path)
    b.restore(tmp_path)
    assert b.version == a.version == 10
    np.testing.assert_array_equal(b.ucb(make_state(9), cands), a.ucb(make_state(9), cands))
    assert not a.save_model(tmp_path / "model") and not (tmp_path / "model").exists()


def test_random_positive_only_is_uniform_among_rewarded_cases() -> None:
    cands = make_candidates(6)
    rewards = {cid: float(i % 2) for i, cid in enumerate(cands.ids)}
    policy = make_policy(RandomConfig(positive_only=True),
                         PolicyContext(dim=DIM, reward_of=lambda ids: [rewards[i] for i in ids]))
    rng = np.random.default_rng(0)
    for _ in range(20):
        sel = policy.select(make_state(), cands, 2, rng=rng)
        assert all(rewards[i] == 1.0 for i in sel.ids) and len(sel.candidate_ids) == 3
        np.testing.assert_allclose(sel.probs_C, np.full(3, 1 / 3))
    with pytest.raises(ConfigError, match="reward_of"):
        make_policy(RandomConfig(positive_only=True), PolicyContext(dim=DIM))
