"""The real part's statistics of `memento bench online`: paired differences with a bootstrap interval."""

from __future__ import annotations

import numpy as np
import pytest

from memento.bench.online import BestOfCPlanner, OnlineBenchConfig, bench_policy, paired_difference, summarize_real
from memento.errors import ConfigError
from memento.planners.base import AnswerScore, CallablePlanner
from memento.policies import RandomConfig, SimilarityConfig, SoftQConfig
from memento.types import Case, Task


def test_paired_difference_known_answers() -> None:
    rng = np.random.default_rng(0)
    same = (rng.random((3, 100)) < 0.5).astype(float)
    d = paired_difference(same, same, resamples=200, rng=np.random.default_rng(1))
    assert d["mean"] == 0.0 and d["ci95"] == [0.0, 0.0]  # identical runs: no difference, no spread
    better = np.ones((2, 50))
    worse = np.zeros((2, 50))
    d = paired_difference(better, worse, resamples=200, rng=np.random.default_rng(1))
    assert d["mean"] == 1.0 and d["ci95"] == [1.0, 1.0]
    x = (rng.random((3, 400)) < 0.7).astype(float)
    y = (rng.random((3, 400)) < 0.5).astype(float)
    d = paired_difference(x, y, resamples=1000, rng=np.random.default_rng(2))
    assert d["ci95"][0] < d["mean"] < d["ci95"][1] and d["ci95"][0] > 0.1  # 0.2 apart: the interval excludes 0
    with pytest.raises(ConfigError):
        paired_difference(np.zeros((2, 0)), np.zeros((2, 0)), resamples=10, rng=rng)


def test_summarize_real_windows_and_gaps() -> None:
    successes = {"similarity": [np.zeros(10), np.zeros(10)], "soft_q": [np.r_[np.zeros(5), np.ones(5)]] * 2}
    summary = summarize_real(successes, window=4, late_steps=3, resamples=100)
    soft_q = summary["soft_q"]
    assert soft_q["early"] == 0.0 and soft_q["late"] == 1.0 and soft_q["overall"] == 0.5
    assert summary["soft_q"]["late_minus_similarity"]["mean"] == 1.0
    assert summary["soft_q"]["windows"] == {"overall": [0, 10], "early": [0, 4], "late": [7, 10]}
    assert "late_minus_similarity" not in summary["similarity"]


def test_bench_policies() -> None:
    assert bench_policy("uniform_positive") == RandomConfig(positive_only=True)
    anchored = bench_policy("soft_q_anchored", soft_q_positive_only=True)
    assert isinstance(anchored, SoftQConfig) and anchored.qnet.anchor == "cosine" and anchored.positive_only
    config = OnlineBenchConfig(policies=("soft_q", "similarity"), seeds=(0, 1, 2))
    assert list(config.loop_policies()) == ["soft_q", "similarity"]
    for bad in ({"policies": ("soft_q", "soft_q")}, {"policies": ("oracle",)}, {"seeds": ()}, {"seeds": (0, 0)}):
        with pytest.raises(ConfigError):
            OnlineBenchConfig(**bad)  # type: ignore[arg-type]


def test_bench_policies_with_features_pretrained_and_best_of_c() -> None:
    features = bench_policy("soft_q_features", soft_q_positive_only=True)
    assert isinstance(features, SoftQConfig) and features.qnet.features == "case" and features.qnet.anchor == "cosine"
    pretrained = bench_policy("soft_q_pretrained", init_qnet="runs/x")
    frozen = bench_policy("soft_q_pretrained_frozen", init_qnet="runs/x")
    assert pretrained.init_qnet == frozen.init_qnet == "runs/x"  # type: ignore[union-attr]
    assert (pretrained.updates_per_step, frozen.updates_per_step) == (1, 0)  # type: ignore[union-attr]
    assert bench_policy("best_of_c") == SimilarityConfig(positive_only=True)
    with pytest.raises(ConfigError, match="init_qnet"):
        OnlineBenchConfig(policies=("soft_q_pretrained", "similarity"))
    with pytest.raises(ConfigError, match="--init-qnet"):
        bench_policy("soft_q_pretrained")


def test_best_of_c_keeps_the_k_cases_the_planner_scores_highest() -> None:
    """The upper bound reads the gold answer: of the C cases shown, the K with the best single-case likelihood."""
    seen: list[list[str]] = []

    def plan(task: Task, cases: list[Case]) -> str:
        seen.append([c.action for c in cases])
        return "x"

    def score(task: Task, cases: list[Case], answer: str) -> AnswerScore:
        return AnswerScore(logprob=-float(int(cases[0].action)), n_tokens=2)

    oracle = BestOfCPlanner(CallablePlanner(plan, score_fn=score), k=2)
    cases = [Case(state="q", action=str(n), reward=1.0) for n in (5, 1, 4, 2, 3)]
    tasks = [Task(id="t", question="q", answers=("a",)), Task(id="u", question="q", answers=("a",))]
    oracle.plan_many(tasks, [cases, cases[:2]])
    assert seen == [["1", "2"], ["5", "1"]]  # best first; K or fewer cases are passed on unscored
    assert oracle.score_passes == 5
    with pytest.raises(ConfigError, match="scores answers"):
        BestOfCPlanner(object(), k=2)
