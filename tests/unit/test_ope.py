"""Off-policy evaluation (memento.ope.estimators) on the SYNTHETIC bandit,
whose oracle gives every target's true value exactly,
and the exports (memento.ope.export)."""

from __future__ import annotations

import itertools
import json
import logging
import math
from pathlib import Path

import numpy as np
import pytest

from memento.envs import SyntheticBandit, SyntheticBanditConfig
from memento.errors import ConfigError, DataFormatError
from memento.ope.estimators import (
    OPEConfig,
    OPEResult,
    RewardModelConfig,
    SlateDistribution,
    SlateRound,
    bootstrap_ci,
    cross_fit_rewards,
    doubly_robust,
    effective_sample_size,
    estimate_k1,
    estimate_slates,
    fit_reward_model,
    inclusion_ips,
    ips,
    pseudo_inverse,
    reward_features,
    slate_moments,
    snips,
    support_violation,
)
from memento.ope.export import ExportRound, obp_bandit_feedback, parse_vw_cb_adf, write_obp_json, write_vw_cb_adf


def _softmax(x_MC: np.ndarray) -> np.ndarray:
    z = np.exp(x_MC - x_MC.max(axis=1, keepdims=True))
    return z / z.sum(axis=1, keepdims=True)


class World:
    """M fixed contexts of the synthetic bandit (a task, its top C/2 cases by cosine and C/2 others), the oracle's
    success probability of every (context, candidate), a softmax logger over cosine and a softmax target over
    cosine plus the case's stored reward; ``truth`` is the target's exact value, ``E_m sum_c pi(c|m) p(m, c)``."""

    def __init__(self, m: int = 24, c: int = 6, seed: int = 3):
        self.bandit = SyntheticBandit(SyntheticBanditConfig(n_task_types=4, n_cases=48, dim=8, seed=seed))
        rng = np.random.default_rng(seed)
        cases, emb_ND = self.bandit.cases()
        self.stored_N = np.asarray([case.reward for case in cases])
        states, types, cands = [], [], []
        for _ in range(m):
            task, state_D = self.bandit.sample_task(rng)
            states.append(state_D)
            types.append(self.bandit.task_type(task))
            ranked = np.argsort(-(emb_ND @ state_D))
            cands.append(np.concatenate([ranked[:c // 2], rng.choice(ranked[c // 2:], c - c // 2, replace=False)]))
        self.state_MD = np.asarray(states, dtype=np.float64)
        self.cand_MC = np.asarray(cands)
        self.type_M = np.asarray(types)
        self.cases_MCD = emb_ND[self.cand_MC].astype(np.float64)
        self.cos_MC = np.einsum("mcd,md->mc", self.cases_MCD, self.state_MD)
        self.p_MC = np.stack([[self.bandit.success_prob(int(t), [int(i)]) for i in row]
                              for t, row in zip(self.type_M, self.cand_MC)])
        self.mu_MC = _softmax(self.cos_MC / 0.5)
        self.pi_MC = _softmax((self.cos_MC + self.stored_N[self.cand_MC]) / 0.3)
        self.features_MCF = reward_features(self.state_MD, self.cases_MCD, self.stored_N[self.cand_MC])
        self.m, self.c = m, c

    def truth(self, pi_MC: np.ndarray) -> float:
        return float((pi_MC * self.p_MC).sum(axis=1).mean())

    def logs(self, n_logs: int, n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``n_logs`` logs of ``n`` rounds each (vectorised): contexts, logged actions, Bernoulli rewards."""
        rng = np.random.default_rng(seed)
        ctx = rng.integers(self.m, size=(n_logs, n))
        u = rng.uniform(size=(n_logs, n, 1))
        act = np.minimum((np.cumsum(self.mu_MC[ctx], axis=2) < u).sum(axis=2), self.c - 1)
        reward = (rng.uniform(size=(n_logs, n)) < self.p_MC[ctx, act]).astype(np.float64)
        return ctx, act, reward


@pytest.fixture(scope="module")
def world() -> World:
    return World()


# ---------------------------------------------------------------- K = 1


def test_ips_and_dr_intervals_cover_the_true_value_and_dr_varies_less(world: World) -> None:
    truth = world.truth(world.pi_MC)
    assert abs(truth - world.truth(world.mu_MC)) > 0.01  # the target differs from the logger
    n_logs = 200
    ctx, act, reward = world.logs(n_logs, 400, seed=11)
    config = OPEConfig(n_boot=300)
    values: dict[str, list[float]] = {"ips": [], "snips": [], "dm": [], "dr": []}
    covered = dict.fromkeys(values, 0)
    for log in range(n_logs):
        rng = np.random.default_rng(log)
        c = ctx[log]
        rhat = cross_fit_rewards(world.features_MCF[c], act[log], reward[log], rng=rng)
        for result in estimate_k1(reward[log], act[log], world.mu_MC[c], world.pi_MC[c], rhat_NC=rhat, rng=rng,
                                  config=config):
            values[result.estimator].append(result.value)
            covered[result.estimator] += result.ci_low <= truth <= result.ci_high
    for name in ("ips", "dr"):
        assert 0.88 <= covered[name] / n_logs <= 0.99, (name, covered[name])
        standard_error = np.std(values[name]) / math.sqrt(n_logs)
        assert abs(np.mean(values[name]) - truth) < 4 * standard_error, name  # unbiased
    assert np.std(values["dr"]) < np.std(values["ips"])


def test_ips_and_dr_are_exactly_unbiased(world: World) -> None:
    """The expectation over contexts and logged actions, summed exactly: IPS and DR (with any reward model,
    here a deliberately wrong one) equal the true value."""
    truth = world.truth(world.pi_MC)
    rhat_MC = np.full_like(world.p_MC, 0.3) + 0.1 * world.cos_MC
    expected_ips = expected_dr = 0.0
    for m in range(world.m):
        for a in range(world.c):
            weight = world.mu_MC[m, a] / world.m
            args = ([world.p_MC[m, a]], [world.mu_MC[m, a]], [world.pi_MC[m, a]])
            expected_ips += weight * ips(*args).value
            expected_dr += weight * doubly_robust(*args, rhat_MC[m:m + 1], world.pi_MC[m:m + 1], [a]).value
    assert expected_ips == pytest.approx(truth, rel=1e-12)
    assert expected_dr == pytest.approx(truth, rel=1e-12)


def test_the_logging_policy_itself_scores_the_observed_mean(world: World) -> None:
    ctx, act, reward = world.logs(1, 300, seed=2)
    p_log_NC = world.mu_MC[ctx[0]].copy()
    p_log_NC[:20] = np.eye(world.c)[act[0, :20]]  # greedy rounds: the logged choice had probability 1
    results = estimate_k1(reward[0], act[0], p_log_NC, p_log_NC, rng=np.random.default_rng(0),
                          config=OPEConfig(n_boot=100))
    by_name = {r.estimator: r for r in results}
    assert by_name["ips"].value == np.mean(reward[0])
    assert by_name["snips"].value == np.mean(reward[0])
    assert by_name["ips"].ess == pytest.approx(300.0)
    assert not by_name["ips"].warnings


def test_support_violation_warns_and_is_recorded(caplog: pytest.LogCaptureFixture) -> None:
    p_log_NC = np.array([[0.5, 0.5, 0.0], [0.2, 0.8, 0.0], [0.4, 0.6, 0.0]])
    uniform_NC = np.full((3, 3), 1 / 3)
    np.testing.assert_allclose(support_violation(p_log_NC, uniform_NC), [1 / 3, 1 / 3, 1 / 3])
    with caplog.at_level(logging.DEBUG, logger="memento.ope.estimators"):
        results = estimate_k1([1.0, 0.0, 1.0], [0, 1, 0], p_log_NC, uniform_NC, config=OPEConfig(n_boot=0))
    # recorded in the results, for the report to print once; the log holds it at debug level only
    assert any("support violation" in r.getMessage() for r in caplog.records)
    assert not any(r.levelno >= logging.WARNING for r in caplog.records)
    assert all(any("support violation: in 3 of 3 rounds" in w for w in r.warnings) for r in results)
    inside_NC = np.array([[0.9, 0.1, 0.0]] * 3)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="memento.ope.estimators"):
        results = estimate_k1([1.0, 0.0, 1.0], [0, 1, 0], p_log_NC, inside_NC, config=OPEConfig(n_boot=0))
    assert not caplog.records and not any(r.warnings for r in results)
    assert results[0].ci_low is None and results[0].ci_high is None  # no resamples, no interval


def test_weights_ess_snips_and_inconsistent_logs() -> None:
    assert effective_sample_size(np.ones(7)) == pytest.approx(7.0)
    assert effective_sample_size([0.0, 0.0, 4.0]) == pytest.approx(1.0)
    assert effective_sample_size(np.zeros(3)) == 0.0
    assert snips([1.0, 0.0], [0.5, 0.5], [1.0, 0.0]).value == pytest.approx(1.0)
    assert math.isnan(snips([1.0, 0.0], [0.5, 0.5], [0.0, 0.0]).value)
    with pytest.raises(DataFormatError, match="p_log_N"):
        ips([1.0], [0.0], [1.0])  # a logged action cannot have probability 0
    with pytest.raises(ConfigError, match="n_boot"):
        OPEConfig(n_boot=-1)
    with pytest.raises(ConfigError, match="folds"):
        RewardModelConfig(folds=0)


def test_bootstrap_is_seeded_and_results_serialise() -> None:
    terms = np.random.default_rng(0).normal(size=200)
    a = bootstrap_ci(terms, rng=np.random.default_rng(5), n_boot=400)
    assert a == bootstrap_ci(terms, rng=np.random.default_rng(5), n_boot=400)
    assert a != bootstrap_ci(terms, rng=np.random.default_rng(6), n_boot=400)
    assert a[0] < terms.mean() < a[1]
    result = OPEResult(estimator="snips", value=math.nan, ci_low=0.1, ci_high=None, ess=3.0, n=4, warnings=("x",))
    assert json.loads(json.dumps(result.to_json())) == {"estimator": "snips", "value": None, "ci_low": 0.1,
                                                        "ci_high": None, "ess": 3.0, "n": 4, "warnings": ["x"]}


def test_reward_model_is_cross_fitted_and_deterministic(world: World) -> None:
    ctx, act, reward = world.logs(1, 300, seed=4)
    features = world.features_MCF[ctx[0]]
    first = cross_fit_rewards(features, act[0], reward[0], rng=np.random.default_rng(1))
    np.testing.assert_array_equal(first, cross_fit_rewards(features, act[0], reward[0], rng=np.random.default_rng(1)))
    flipped = reward[0].copy()
    flipped[0] = 1.0 - flipped[0]
    second = cross_fit_rewards(features, act[0], flipped, rng=np.random.default_rng(1))
    np.testing.assert_array_equal(first[0], second[0])  # round 0 is predicted by a model that never saw it
    assert not np.array_equal(first, second)  # the other folds' models did
    assert ((first >= 0) & (first <= 1)).all()


def test_logistic_reward_model_recovers_a_known_model() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4000, 3))
    p = 1 / (1 + np.exp(-(x @ np.array([1.5, -1.0, 0.0]) + 0.3)))
    model = fit_reward_model(x, (rng.uniform(size=4000) < p).astype(float), RewardModelConfig(l2=0.1))
    assert model.link == "logistic"
    assert np.abs(model.predict(x) - p).max() < 0.06
    linear = fit_reward_model(x, x @ np.array([2.0, 0.0, -1.0]) + 5.0, RewardModelConfig(l2=1e-6))
    assert linear.link == "linear"  # rewards outside [0, 1]
    np.testing.assert_allclose(linear.predict(x), x @ np.array([2.0, 0.0, -1.0]) + 5.0, atol=1e-4)


@pytest.mark.parametrize("l2", [0.5, 0.0])
def test_logistic_reward_model_minimises_the_penalised_cross_entropy_of_fractional_rewards(l2: float) -> None:
    rng = np.random.default_rng(2)
    x = rng.normal(size=(300, 3))
    y = np.clip(1 / (1 + np.exp(-x[:, 0])) + rng.normal(scale=0.2, size=300), 0.0, 1.0)  # fractional targets
    model = fit_reward_model(x, y, RewardModelConfig(l2=l2))
    assert model.link == "logistic"
    z = (x - model.mean_F) / model.scale_F
    residual = model.predict(x) - y
    # first-order optimality of sum_i [log(1 + e^eta_i) - y_i eta_i] + l2/2 |w|^2 (intercept unpenalised)
    assert np.abs(z.T @ residual + l2 * model.weights_F).max() < 1e-5
    assert abs(residual.sum()) < 1e-5


def test_one_bootstrap_pass_shares_resamples_within_the_memory_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    import memento.ope.estimators as est

    seen: list[np.ndarray] = []
    real = est._column_stats

    def spy(columns: object, idx_BN: np.ndarray) -> np.ndarray:
        seen.append(idx_BN.copy())
        return real(columns, idx_BN)  # type: ignore[arg-type]

    monkeypatch.setattr(est, "_column_stats", spy)
    monkeypatch.setattr(est, "_BOOT_CHUNK", 90)  # 30 rounds: 3 resamples at once
    rng = np.random.default_rng(0)
    n, c = 30, 4
    p_log = rng.dirichlet(np.ones(c), size=n)
    pi = rng.dirichlet(np.ones(c), size=n)
    action = np.array([rng.choice(c, p=p) for p in p_log])
    reward = rng.uniform(size=n)
    rhat = rng.uniform(size=(n, c))
    results = estimate_k1(reward, action, p_log, pi, rhat_NC=rhat, rng=np.random.default_rng(7),
                          config=OPEConfig(n_boot=10))
    assert [i.shape for i in seen] == [(3, n)] * 3 + [(1, n)]  # one pass for all four estimators, 90 entries at most
    idx_BN = np.concatenate(seen)
    w = pi[np.arange(n), action] / p_log[np.arange(n), action]
    dm = (pi * rhat).sum(axis=1)
    stats = {"ips": (w * reward)[idx_BN].mean(axis=1),
             "snips": (w * reward)[idx_BN].sum(axis=1) / w[idx_BN].sum(axis=1),
             "dm": dm[idx_BN].mean(axis=1),
             "dr": (dm + w * (reward - rhat[np.arange(n), action]))[idx_BN].mean(axis=1)}
    for result in results:  # every estimator's interval comes from the same resamples
        low, high = np.quantile(stats[result.estimator], [0.025, 0.975])
        assert (result.ci_low, result.ci_high) == pytest.approx((low, high), rel=1e-12), result.estimator
    seen.clear()
    alone = bootstrap_ci(w * reward, rng=np.random.default_rng(7), n_boot=10)
    assert alone == (results[0].ci_low, results[0].ci_high)  # a lone estimator draws the same resamples
    assert bootstrap_ci([0.25], rng=np.random.default_rng(7), n_boot=10) == (0.25, 0.25)  # one round
    # a self-normalised estimate undefined on a resample (its weights all 0) leaves that resample out
    low, high = bootstrap_ci([0.0, 1.0, 0.0], rng=np.random.default_rng(3), n_boot=200, denominators_N=[0.0, 2.0, 0.0])
    assert low == high == 0.5


# ---------------------------------------------------------------- slates


def _pl_prob(p_C: np.ndarray, order: tuple[int, ...]) -> float:
    left, out = 1.0, 1.0
    for i in order:
        out *= p_C[i] / left
        left -= p_C[i]
    return out


def test_plackett_luce_moments_are_exact_and_monte_carlo_is_close() -> None:
    p_C = np.random.default_rng(0).dirichlet(np.ones(6))
    slot = np.zeros((3, 6))
    pair = np.zeros((6, 6))
    for order in itertools.permutations(range(6), 3):
        prob = _pl_prob(p_C, order)
        for j, i in enumerate(order):
            slot[j, i] += prob
        for i in order:
            pair[i, list(order)] += prob
    exact = slate_moments(SlateDistribution.plackett_luce(p_C, 3))
    assert exact.exact
    np.testing.assert_allclose(exact.slot_KC, slot, atol=1e-12)
    np.testing.assert_allclose(exact.pair_inclusion_CC(), pair, atol=1e-12)
    assert exact.inclusion_C.sum() == pytest.approx(3.0)
    sampled = slate_moments(SlateDistribution.plackett_luce(p_C, 3), rng=np.random.default_rng(1), max_enumerate=10,
                            mc_samples=40_000)
    assert not sampled.exact
    np.testing.assert_allclose(sampled.slot_KC, slot, atol=0.015)
    # fewer positive-probability candidates than slots: the rest follow in index order (as gumbel_top_k draws)
    short = slate_moments(SlateDistribution.plackett_luce([0.0, 0.7, 0.0, 0.3], 3))
    np.testing.assert_allclose(short.slot_KC[2], [1.0, 0.0, 0.0, 0.0])


def _slate_world(world: World, k: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per context: the logger's and the target's first-draw distributions and each candidate's item value."""
    return [(world.mu_MC[m], world.pi_MC[m], world.p_MC[m] / k) for m in range(4)]


def _expected(world: World, k: int, make_round, estimator) -> float:
    """``E_mu[estimate]`` summed exactly over every logged slate of every context (equal context weights)."""
    total = 0.0
    contexts = _slate_world(world, k)
    for mu_C, pi_C, phi_C in contexts:
        logger = SlateDistribution.plackett_luce(mu_C, k)
        for order in itertools.permutations(range(world.c), k):
            slate_round = make_round(logger, pi_C, phi_C, np.asarray(order))
            total += _pl_prob(mu_C, order) * estimator([slate_round]).value / len(contexts)
    return total


POSITION_WEIGHTS = np.array([1.0, 0.6, 0.3])


@pytest.mark.parametrize("target_kind", ["plackett-luce", "fixed"])
def test_slate_estimators_are_unbiased_on_additive_rewards(world: World, target_kind: str) -> None:
    k = 3
    config = OPEConfig(n_boot=0)

    def target(pi_C: np.ndarray, phi_C: np.ndarray) -> SlateDistribution:
        if target_kind == "fixed":
            return SlateDistribution.fixed(np.argsort(-phi_C)[:k], world.c)
        return SlateDistribution.plackett_luce(pi_C, k)

    truth_set = truth_slot = 0.0
    for _, pi_C, phi_C in _slate_world(world, k):
        q = slate_moments(target(pi_C, phi_C), pairs=False)
        truth_set += float(q.inclusion_C @ phi_C) / 4
        truth_slot += float(POSITION_WEIGHTS @ q.slot_KC @ phi_C) / 4

    def set_round(logger, pi_C, phi_C, order):  # additive, position-independent, per-case rewards observed
        return SlateRound(logger=logger, target=target(pi_C, phi_C), slate_K=order, reward=float(phi_C[order].sum()),
                          item_rewards_K=phi_C[order])

    def slot_round(logger, pi_C, phi_C, order):  # additive over (slot, case): position-dependent
        return SlateRound(logger=logger, target=target(pi_C, phi_C), slate_K=order,
                          reward=float(POSITION_WEIGHTS @ phi_C[order]))

    assert _expected(world, k, set_round, lambda r: inclusion_ips(r, config=config)) == pytest.approx(truth_set,
                                                                                                    rel=1e-9)
    assert _expected(world, k, set_round, lambda r: pseudo_inverse(r, granularity="set", config=config)) == \
        pytest.approx(truth_set, rel=1e-9)
    assert _expected(world, k, slot_round, lambda r: pseudo_inverse(r, granularity="slot", config=config)) == \
        pytest.approx(truth_slot, rel=1e-9)


def test_pseudo_inverse_is_biased_when_the_reward_is_not_additive(world: World) -> None:
    """The documented assumption: with an interacting slate reward (it pays when candidates 0 and 1 are shown
    together, each alone is worth nothing) the exact expectation of PI misses the truth."""
    k = 3
    config = OPEConfig(n_boot=0)

    def pays(order) -> float:
        return float({0, 1} <= set(np.asarray(order).tolist()))

    truth = 0.0
    for _, pi_C, _ in _slate_world(world, k):
        truth += sum(_pl_prob(pi_C, order) * pays(order) for order in itertools.permutations(range(world.c), k)) / 4

    def pair_round(logger, pi_C, phi_C, order):
        return SlateRound(logger=logger, target=SlateDistribution.plackett_luce(pi_C, k), slate_K=order,
                          reward=pays(order))

    for granularity in ("slot", "set"):
        estimate = _expected(world, k, pair_round,
                             lambda r, g=granularity: pseudo_inverse(r, granularity=g, config=config))
        assert abs(estimate - truth) > 0.01, (granularity, estimate, truth)


def test_slate_estimators_sampled_on_a_log_and_on_policy(world: World) -> None:
    k, rng = 2, np.random.default_rng(7)
    rounds, on_policy = [], []
    for i in range(300):
        mu_C, pi_C, phi_C = _slate_world(world, k)[i % 4]
        order = np.argsort(-(np.log(mu_C) + rng.gumbel(size=world.c)))[:k]
        logger = SlateDistribution.plackett_luce(mu_C, k)
        reward = float(rng.uniform() < phi_C[order].sum())
        rounds.append(SlateRound(logger=logger, target=SlateDistribution.plackett_luce(pi_C, k), slate_K=order,
                                 reward=reward))
        on_policy.append(SlateRound(logger=logger, target=logger, slate_K=order, reward=reward))
    results = {r.estimator: r for r in estimate_slates(rounds, rng=np.random.default_rng(0),
                                                       config=OPEConfig(n_boot=200))}
    assert set(results) == {"inclusion_ips", "pi", "pi_set"}
    assert all(r.ci_low is not None and r.ci_low <= r.value <= r.ci_high and r.n == 300 for r in results.values())
    assert any("credited reward / K" in w for w in results["inclusion_ips"].warnings)
    mean = np.mean([r.reward for r in rounds])
    for result in estimate_slates(on_policy, config=OPEConfig(n_boot=0)):  # the logger scores its own mean
        assert result.value == pytest.approx(mean, rel=1e-9), result.estimator
        assert not result.warnings


def test_slate_estimators_reduce_to_ips_for_one_case(world: World) -> None:
    ctx, act, reward = world.logs(1, 50, seed=3)
    rounds = [SlateRound(logger=SlateDistribution.plackett_luce(world.mu_MC[m], 1),
                         target=SlateDistribution.plackett_luce(world.pi_MC[m], 1), slate_K=np.array([a]), reward=r)
              for m, a, r in zip(ctx[0], act[0], reward[0])]
    expected = ips(reward[0], world.mu_MC[ctx[0], act[0]], world.pi_MC[ctx[0], act[0]]).value
    for result in estimate_slates(rounds, config=OPEConfig(n_boot=0)):
        assert result.value == pytest.approx(expected, rel=1e-9), result.estimator


def test_slate_support_violation_and_bad_rounds() -> None:
    logger = SlateDistribution.plackett_luce([0.5, 0.5, 0.0, 0.0], 2)
    target = SlateDistribution.fixed([2, 0], 4)
    results = estimate_slates([SlateRound(logger=logger, target=target, slate_K=np.array([0, 1]), reward=1.0)],
                              config=OPEConfig(n_boot=0))
    assert all(any("support violation" in w for w in r.warnings) for r in results)
    with pytest.raises(DataFormatError, match="distinct"):
        SlateRound(logger=logger, target=target, slate_K=np.array([0, 0]), reward=1.0)
    with pytest.raises(DataFormatError, match="sums to"):
        SlateDistribution.plackett_luce([0.5, 0.2], 1)


# ---------------------------------------------------------------- exports


def _export_rounds(world: World, n: int = 12) -> list[ExportRound]:
    ctx, act, reward = world.logs(1, n, seed=9)
    return [ExportRound(state_D=world.state_MD[m], candidate_ids=[f"syn {i}|x:y" for i in world.cand_MC[m]],
                        cases_CD=world.cases_MCD[m], stored_rewards_C=world.stored_N[world.cand_MC[m]], action=int(a),
                        reward=float(r), propensity=float(world.mu_MC[m, a]))
            for m, a, r in zip(ctx[0], act[0], reward[0])]


def test_vw_cb_adf_export_round_trips(world: World, tmp_path: Path) -> None:
    rounds = _export_rounds(world)
    assert write_vw_cb_adf(tmp_path / "log.vw", rounds) == len(rounds)
    text = (tmp_path / "log.vw").read_text(encoding="utf-8")
    examples = parse_vw_cb_adf(text)
    assert len(examples) == len(rounds)
    assert text.count("\n\n") == len(rounds)  # a blank line after every example
    for example, r in zip(examples, rounds):
        assert example.shared.startswith("shared |s d0:")
        assert len(example.actions) == len(r.candidate_ids)
        assert example.label_index == r.action
        assert example.cost == pytest.approx(-r.reward, abs=1e-6) and example.probability == pytest.approx(
            r.propensity, rel=1e-5)
        assert "-0:" not in example.actions[r.action]  # a zero cost is written 0, not -0
        assert all(line.count("|") == 3 for line in example.actions)  # ids sanitised: no stray namespace
        assert " |i id=syn_" in example.actions[0]


def test_obp_export_round_trips(world: World, tmp_path: Path) -> None:
    rounds = _export_rounds(world)
    assert write_obp_json(tmp_path / "obp.json", rounds) == len(rounds)
    feedback = json.loads((tmp_path / "obp.json").read_text(encoding="utf-8"))
    assert feedback == obp_bandit_feedback(rounds)
    assert feedback["n_rounds"] == len(rounds)
    assert {"n_rounds", "n_actions", "action", "reward", "pscore", "position", "context",
            "action_context"} <= set(feedback)
    union = {case_id for r in rounds for case_id in r.candidate_ids}
    assert feedback["n_actions"] == len(union) == len(feedback["action_context"]) == len(feedback["action_ids"])
    for i, r in enumerate(rounds):
        assert feedback["action_ids"][feedback["action"][i]] == r.candidate_ids[r.action]
        assert feedback["reward"][i] == r.reward and feedback["pscore"][i] == r.propensity
        assert feedback["position"][i] == 0 and len(feedback["context"][i]) == world.state_MD.shape[1]
        np.testing.assert_allclose(feedback["action_context"][feedback["action"][i]], r.cases_CD[r.action])


def test_vw_cb_adf_is_read_by_vowpal_wabbit_when_installed(world: World) -> None:
    """A cross-check against VW's own parser (the ``ope`` extra, in the development install: never skipped)."""
    from vowpalwabbit import pyvw

    from memento.ope.export import vw_cb_adf_lines

    rounds = _export_rounds(world, n=4)
    lines = list(vw_cb_adf_lines(rounds))
    vw = pyvw.Workspace("--cb_adf --quiet")
    try:
        blocks = "\n".join(lines).strip().split("\n\n")
        for block, r in zip(blocks, rounds):
            examples = vw.parse(block, pyvw.LabelType.CONTEXTUAL_BANDIT)
            assert len(examples) == 1 + len(r.candidate_ids)
            label = examples[1 + r.action].get_label(pyvw.LabelType.CONTEXTUAL_BANDIT)
            assert label.costs[0].cost == pytest.approx(-r.reward, abs=1e-6)
            assert label.costs[0].probability == pytest.approx(r.propensity, rel=1e-5)
            vw.learn(examples)
            vw.finish_example(examples)
    finally:
        vw.finish()


def test_k1_estimators_agree_with_open_bandit_pipeline_when_installed(world: World) -> None:
    """A cross-check against OBP's IPS, DM and DR (the ``ope`` extra, in the development install: never
    skipped)."""
    import obp.ope as obp_ope
    ctx, act, reward = world.logs(1, 300, seed=5)
    mu_NC, pi_NC = world.mu_MC[ctx[0]], world.pi_MC[ctx[0]]
    rhat_NC = cross_fit_rewards(world.features_MCF[ctx[0]], act[0], reward[0], rng=np.random.default_rng(0))
    ours = {r.estimator: r.value for r in estimate_k1(reward[0], act[0], mu_NC, pi_NC, rhat_NC=rhat_NC,
                                                      config=OPEConfig(n_boot=0))}
    feedback = {"n_rounds": 300, "n_actions": world.c, "action": act[0], "reward": reward[0],
                "pscore": mu_NC[np.arange(300), act[0]], "position": np.zeros(300, dtype=int)}
    theirs = obp_ope.OffPolicyEvaluation(
        bandit_feedback=feedback, ope_estimators=[obp_ope.InverseProbabilityWeighting(), obp_ope.DirectMethod(),
                                                  obp_ope.DoublyRobust()],
    ).estimate_policy_values(action_dist=pi_NC[:, :, None], estimated_rewards_by_reg_model=rhat_NC[:, :, None])
    assert theirs["ipw"] == pytest.approx(ours["ips"], rel=1e-9)
    assert theirs["dm"] == pytest.approx(ours["dm"], rel=1e-9)
    assert theirs["dr"] == pytest.approx(ours["dr"], rel=1e-9)


def test_the_logging_policy_against_itself_has_no_support_gap() -> None:
    """A cold logger's own tiny probabilities (<= support_eps) are no support violation against itself."""
    p_log_NC = np.array([[1 - 2e-8, 1e-8, 1e-8], [1e-8, 1 - 2e-8, 1e-8]])
    results = estimate_k1([1.0, 0.0], [0, 1], p_log_NC, p_log_NC.copy(), rhat_NC=np.full((2, 3), 0.5),
                          config=OPEConfig(n_boot=0))
    assert not any(r.warnings for r in results)
    assert support_violation(p_log_NC, p_log_NC)[0] > 1e-9  # what the old check counted as a violation
    other_NC = np.array([[0.5, 0.25, 0.25]] * 2)
    assert all(any("support violation" in w for w in r.warnings)
               for r in estimate_k1([1.0, 0.0], [0, 1], p_log_NC, other_NC, config=OPEConfig(n_boot=0)))
    mu = SlateDistribution.plackett_luce(np.array([0.5, 0.5 - 4e-8, 1e-8, 1e-8, 1e-8, 1e-8]), 2)
    rounds = [SlateRound(logger=mu, target=mu, slate_K=np.array([0, 1]), reward=1.0)]
    slates = estimate_slates(rounds, rng=np.random.default_rng(0), config=OPEConfig(n_boot=0))
    assert not any("support violation" in w for r in slates for w in r.warnings)


def _r(name: str, value: float, *warnings: str) -> OPEResult:
    return OPEResult(estimator=name, value=value, ci_low=value - 0.1, ci_high=value + 0.1, ess=None if name == "dm"
                     else 50.0, n=100, warnings=warnings)


def test_the_bottom_line_rule() -> None:
    from memento.ope.evaluate import bottom_line, format_table, outside_range

    support = "support violation: in 3 of 100 rounds ..."
    low_ess = "low effective sample size: 4.0 of 100 rounds ..."
    bounds = (0.0, 1.0)

    def pick(*results: OPEResult, logged: bool = False):
        line = bottom_line("t", results, logged=logged, bounds=bounds, observed_mean=0.5)
        return line.result.estimator, line.why, line.outside, line.vs_logged

    assert pick(_r("ips", 0.7), _r("snips", 0.6), _r("dm", 0.55), _r("dr", 0.65))[:3] == (
        "dr", "dr passes its support, ESS and range checks", False)
    assert pick(_r("snips", 0.6), _r("dm", 0.55), _r("dr", 0.65), logged=True)[0] == "snips"
    estimator, why, _, vs = pick(_r("snips", 0.6), _r("dm", 0.55), _r("dr", -0.319))  # the DR
    assert estimator == "snips" and "dr fails range" in why and vs == pytest.approx(0.1)
    estimator, why, outside, _ = pick(_r("snips", 0.6, support), _r("dm", 0.55, support), _r("dr", 0.6, low_ess))
    assert (estimator, outside) == ("dm", False) and "dr fails ESS" in why and "snips fails support" in why
    estimator, why, outside, _ = pick(_r("snips", 0.6, support), _r("dm", 1.2), _r("dr", 1.3, support))
    assert (estimator, outside) == ("dm", True) and why.startswith("no estimator passes its checks")
    assert "dr fails support, range" in why and "dm fails range" in why
    assert bottom_line("t", [_r("ips", 0.5)], logged=False, bounds=bounds, observed_mean=0.5) is None
    assert outside_range(_r("dr", 1.0 + 1e-6), bounds) and not outside_range(_r("dr", 1.0 + 1e-12), bounds)
    assert not outside_range(_r("snips", math.nan), bounds)
    table = format_table({"t": [_r("ips", 1.5, support), _r("snips", 0.6, support), _r("dr", 0.4)]}, 0.95)
    rows = table.splitlines()
    assert rows[1].split()[2] == "1.5000!" and rows[2].split()[2] == "0.6000"
    assert "! outside the reward range [0, 1]" in table
    assert table.count(support) == 1 and f"warning (t: ips, snips): {support}" in table
    assert "!" not in format_table({"t": [_r("ips", 0.6)]}, 0.95)
