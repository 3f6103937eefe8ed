"""The regret experiment on the SYNTHETIC bandit: soft-Q's regret flattens, the baselines' does not.

Real components throughout: a SQLite + faiss case bank, the policies, the Q-network, the replay
buffer and the soft-Q learner. The world (``ENV``) has distractors that lure similarity retrieval
and a hidden case quality no vector encodes, so only a policy that learns from rewards improves.
"""

from __future__ import annotations

import dataclasses
import json
from typing import get_args

import numpy as np
import pytest
import torch

from memento.bank import CaseBank
from memento.config import QNetConfig, from_dict
from memento.envs import SyntheticBandit, SyntheticBanditConfig
from memento.errors import BankError, ConfigError
from memento.policies import PolicyKind, SoftQConfig, make_policy, regret_policy
from memento.runs.regret import RegretConfig, RegretResult, run_regret

# The default world: 8 task types, 400 cases (30 % tight look-alike distractors), dim 32, mean aggregate.
ENV = dict(n_task_types=8, n_cases=400, dim=32, distractor_fraction=0.3)
STEPS = 1500
WINDOW = 300


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def config_of(policy: str, seed: int = 0, *, steps: int = STEPS, warmup: int | None = None,
              dropout: float | None = None) -> RegretConfig:
    """The regret run's default config of ``policy``, with a soft-Q warm-up or Q-network dropout changed."""
    policy_config = regret_policy(policy)  # type: ignore[arg-type]
    if isinstance(policy_config, SoftQConfig):
        if warmup is not None:
            policy_config = dataclasses.replace(policy_config, warmup=warmup)
        if dropout is not None:
            policy_config = dataclasses.replace(policy_config, qnet=dataclasses.replace(policy_config.qnet,
                                                                                          dropout=dropout))
    return RegretConfig(policy=policy_config, steps=steps, seed=seed)


def run(seed: int, policy: str, tmp_path, **overrides) -> RegretResult:
    env = SyntheticBandit(SyntheticBanditConfig(seed=seed, **ENV))
    return run_regret(env, config_of(policy, seed, **overrides), make_policy=make_policy,
                      workdir=tmp_path / f"{policy}-{seed}-{len(list(tmp_path.iterdir()))}")


@pytest.mark.parametrize("seed", [0, 3])
def test_soft_q_regret_flattens_while_baselines_stay_linear(seed: int, tmp_path) -> None:
    results = {p: run(seed, p, tmp_path) for p in ("random", "similarity", "soft_q", "linucb")}
    first = {p: r.first_last(WINDOW)[0] for p, r in results.items()}
    last = {p: r.first_last(WINDOW)[1] for p, r in results.items()}
    figures = {p: (round(first[p], 3), round(last[p], 3)) for p in results}

    # the baselines do not learn: their per-step regret stays where it started (cumulative regret is linear)
    for p in ("random", "similarity"):
        assert last[p] >= 0.85 * first[p], figures
        assert last[p] >= 0.2, figures  # and it is far from zero
        cumulative_T = results[p].cumulative_regret_T
        half = cumulative_T[STEPS // 2 - 1] / cumulative_T[-1]
        assert 0.4 <= half <= 0.6, (p, half)
    # soft-Q learns: its last window is far below its first, and well below similarity's
    assert last["soft_q"] <= 0.65 * first["soft_q"], figures
    assert last["soft_q"] <= last["similarity"] - 0.1, figures
    assert results["soft_q"].total_regret < results["similarity"].total_regret < results["random"].total_regret
    cumulative_T = results["soft_q"].cumulative_regret_T
    assert cumulative_T[STEPS // 2 - 1] / cumulative_T[-1] >= 0.55  # concave: the second half adds less
    assert results["soft_q"].success_rate > results["similarity"].success_rate
    # LinUCB learns from rewards too (its first window is already low: its bonus explores fast)
    assert last["linucb"] <= last["similarity"] - 0.1, figures
    # every policy chose among the same candidates: the candidate ceiling is the same, and low
    ceilings = {p: float(r.ceiling_regret_T.mean()) for p, r in results.items()}
    assert len(set(ceilings.values())) == 1 and ceilings["soft_q"] < 0.05, ceilings
    assert results["soft_q"].updates == STEPS - RegretConfig().policy.warmup + 1  # type: ignore[union-attr]
    assert results["random"].final_alpha is None and results["soft_q"].final_alpha == pytest.approx(0.2)


def test_a_seeded_run_is_reproducible(tmp_path) -> None:
    kwargs = dict(steps=150, warmup=20, dropout=0.1)  # dropout draws from the learner's generator
    a, b = run(5, "soft_q", tmp_path, **kwargs), run(5, "soft_q", tmp_path, **kwargs)
    np.testing.assert_array_equal(a.regret_T, b.regret_T)
    np.testing.assert_array_equal(a.reward_T, b.reward_T)
    assert a.qnet is not None and b.qnet is not None
    state_a, state_b = a.qnet.state_dict(), b.qnet.state_dict()
    assert state_a.keys() == state_b.keys()
    for name in state_a:
        assert torch.equal(state_a[name], state_b[name]), name
    env = SyntheticBandit(SyntheticBanditConfig(seed=5, **ENV))  # another seed of the run, same world
    c = run_regret(env, config_of("soft_q", 6, **kwargs), make_policy=make_policy,  # type: ignore[arg-type]
                   workdir=tmp_path / "other-seed")
    assert not np.array_equal(a.regret_T, c.regret_T)
    assert c.qnet is not None and not torch.equal(a.qnet.state_dict()["out.weight"], c.qnet.state_dict()["out.weight"])


def test_runs_write_their_config_and_result(tmp_path) -> None:
    result = run(1, "similarity", tmp_path, steps=40)
    (workdir,) = tmp_path.iterdir()
    saved = json.loads((workdir / "config.json").read_text())
    assert from_dict(RegretConfig, saved["regret"]) == result.config
    assert from_dict(SyntheticBanditConfig, saved["env"]) == SyntheticBanditConfig(seed=1, **ENV)
    summary = json.loads((workdir / "regret.json").read_text())
    assert summary["policy"] == "similarity" and summary["steps"] == 40
    np.testing.assert_allclose(summary["regret_T"], result.regret_T)
    assert summary["total_regret"] == pytest.approx(result.total_regret)
    assert result.regret_T.shape == result.reward_T.shape == (40,) and (result.regret_T >= 0).all()
    assert np.all(result.regret_T >= result.ceiling_regret_T - 1e-12)
    with CaseBank.open(workdir / "bank") as bank:
        assert len(bank) == 400
    with pytest.raises(BankError, match="fresh workdir"):  # the bank is not silently reused
        run_regret(SyntheticBandit(SyntheticBanditConfig(seed=1, **ENV)), config_of("random", steps=5),
                   make_policy=make_policy, workdir=workdir)


def test_config_validation() -> None:
    for kind in get_args(PolicyKind):
        assert regret_policy(kind).kind == kind
    for kwargs in ({"steps": 0}, {"k": 0}, {"k": 5, "candidates": 4}, {"policy": "oracle"}, {"seed": -1},
                   {"steps": 1.5}, {"k": True}):
        with pytest.raises(ConfigError):
            RegretConfig(**kwargs)  # type: ignore[arg-type]
    soft_q = regret_policy("soft_q")
    assert isinstance(soft_q, SoftQConfig) and soft_q.warmup == 50 and soft_q.replay_capacity == 100_000
    assert soft_q.learner.alpha_final == 0.05 and soft_q.learner.alpha_decay_steps == 1000
    config = RegretConfig(policy=SoftQConfig(qnet=QNetConfig(arch="two_tower"), alpha=0.3))
    assert config.policy.qnet.for_dim(16, seed=2).arch == "two_tower"  # type: ignore[union-attr]
    assert config.policy.learner.alpha == 0.3  # type: ignore[union-attr]
    with pytest.raises(ConfigError):
        RegretResult(config=config, regret_T=np.zeros(3), ceiling_regret_T=np.zeros(3), success_prob_T=np.zeros(3),
                     reward_T=np.zeros(3), final_alpha=None, updates=0, qnet=None, wall_s=0.0).first_last(4)
