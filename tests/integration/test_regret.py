"""The regret experiment on the SYNTHETIC bandit: soft-Q's regret flattens, the baselines' does not.

Real components throughout: a SQLite + faiss case bank, the policies, the Q-network, the replay
buffer and the soft-Q learner. The world (``ENV``) has distractors that lure similarity retrieval
and a hidden case quality no vector encodes, so only a policy that learns from rewards improves.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import get_args

import numpy as np
import pytest
import torch

from memento.config import from_dict
from memento.envs import RegretConfig, RegretResult, SyntheticBandit, SyntheticBanditConfig, run_regret
from memento.envs.regret import RegretPolicyKind
from memento.errors import BankError, ConfigError
from memento.memory import CaseBank
from policies import PolicyKind

# The default world: 8 task types, 400 cases (30 % tight look-alike distractors), dim 32, mean aggregate.
ENV = dict(n_task_types=8, n_cases=400, dim=32, distractor_fraction=0.3)
STEPS = 1500
WINDOW = 300


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    """Tiny networks run fastest on one thread, and a busy 2-core machine does not make them crawl."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def run(seed: int, policy: str, tmp_path, **overrides) -> RegretResult:
    env = SyntheticBandit(SyntheticBanditConfig(seed=seed, **ENV))
    config = RegretConfig(policy=policy, steps=overrides.pop("steps", STEPS), seed=seed, **overrides)  # type: ignore
    return run_regret(env, config, workdir=tmp_path / f"{policy}-{seed}-{len(list(tmp_path.iterdir()))}")


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
    assert results["soft_q"].updates == STEPS - RegretConfig().warmup_steps + 1
    assert results["random"].final_alpha is None and results["soft_q"].final_alpha == pytest.approx(0.2)


def test_a_seeded_run_is_reproducible(tmp_path) -> None:
    kwargs = dict(steps=150, warmup_steps=20, dropout=0.1)  # dropout draws from the learner's generator
    a, b = run(5, "soft_q", tmp_path, **kwargs), run(5, "soft_q", tmp_path, **kwargs)
    np.testing.assert_array_equal(a.regret_T, b.regret_T)
    np.testing.assert_array_equal(a.reward_T, b.reward_T)
    assert a.qnet is not None and b.qnet is not None
    state_a, state_b = a.qnet.state_dict(), b.qnet.state_dict()
    assert state_a.keys() == state_b.keys()
    for name in state_a:
        assert torch.equal(state_a[name], state_b[name]), name
    env = SyntheticBandit(SyntheticBanditConfig(seed=5, **ENV))  # another seed of the run, same world
    c = run_regret(env, RegretConfig(policy="soft_q", seed=6, **kwargs), workdir=tmp_path / "other-seed")
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
        run_regret(SyntheticBandit(SyntheticBanditConfig(seed=1, **ENV)), RegretConfig(policy="random", steps=5),
                   workdir=workdir)


def test_config_validation() -> None:
    assert get_args(RegretPolicyKind) == get_args(PolicyKind)
    for kwargs in ({"steps": 0}, {"k": 0}, {"k": 5, "candidates": 4}, {"policy": "oracle"}, {"seed": -1},
                   {"qnet_arch": "cnn"}, {"dropout": 1.0}, {"warmup_steps": -1}, {"batch_size": 0}, {"lr": 0.0},
                   {"alpha": 0.0}, {"alpha_schedule": "cosine"}, {"importance_weights": "clipped"},
                   {"linucb_exploration": -1.0}, {"steps": 1.5}, {"k": True}):
        with pytest.raises(ConfigError):
            RegretConfig(**kwargs)  # type: ignore[arg-type]
    config = RegretConfig(policy="soft_q", qnet_arch="two_tower", alpha=0.3, batch_size=32)
    assert config.qnet_config(16, seed=2).arch == "two_tower" and config.qnet_config(16).dim == 16
    learner = config.learner_config(seed=4)
    assert learner.gamma == 0.0 and learner.alpha == 0.3 and learner.batch_size == 32 and learner.seed == 4
    with pytest.raises(ConfigError):
        RegretResult(config=config, regret_T=np.zeros(3), ceiling_regret_T=np.zeros(3), success_prob_T=np.zeros(3),
                     reward_T=np.zeros(3), final_alpha=None, updates=0, qnet=None, wall_s=0.0).first_last(4)
