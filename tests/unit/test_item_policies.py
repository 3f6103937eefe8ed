"""Expanded candidate sets (items linked to the nearest entries) and the CFGM / LifeMem retrieval policies."""

from __future__ import annotations

import numpy as np
import pytest

from memento.bank import CaseBank
from memento.errors import ConfigError
from memento.learn.policy import PolicyContext
from memento.policies import (
    CFGMPolicy,
    CFGMRetrievalConfig,
    LifeMemPolicy,
    LifeMemRetrievalConfig,
    check_policy,
    loop_policy,
    make_policy,
)
from memento.policies.similarity import bank_rewards
from memento.systems.expand import ItemCandidates, expand_candidates
from memento.systems.items import ItemGraph, make_item
from memento.types import Case


def _unit(*xs):
    v = np.asarray(xs, dtype=np.float32)
    return v / np.linalg.norm(v)


@pytest.fixture
def world(tmp_path):
    """Three trajectories of 'coin' (two won), a tip of each won one, a cluster of the won ones with two skills
    (an old version with one), and a focus point of 'coin'."""
    bank = CaseBank.create(tmp_path / "bank", dim=4)
    trajectories = [Case(state="goal: coin 1", action="> go east", reward=1.0, env="coin"),
                    Case(state="goal: coin 2", action="> go west", reward=1.0, env="coin"),
                    Case(state="goal: coin 3", action="> look", reward=0.0, env="coin")]
    t1, t2, t3 = bank.add(trajectories, np.stack([_unit(1, 0.1, 0, 0), _unit(1, 0.3, 0, 0), _unit(1, 0, 0, 0)]))
    tip1, tip2 = bank.add([make_item("tip", "goal: coin 1", "go east first", system="cfgm", sources=[t1, t3],
                                     env="coin"),
                           make_item("tip", "goal: coin 2", "west is right", system="cfgm", sources=[t2],
                                     env="coin")],
                          np.stack([_unit(0, 1, 0, 0), _unit(0, 1, 0.1, 0)]))
    [c0] = bank.add([make_item("cluster", "walk then take", "2 trajectories", system="lifemem", sources=[t1, t2],
                               env="coin", group="cluster:0", version=0, members=[t1, t2], cluster="0")],
                    _unit(1, 0.2, 0, 0)[None])
    bank.add([make_item("skill", "walk then take", "old rule", system="lifemem", sources=[c0], env="coin",
                        group="skills:0", version=0)], _unit(0, 0, 1, 0)[None])
    [c1] = bank.add([make_item("cluster", "walk, then take", "2 trajectories", system="lifemem", sources=[t1, t2],
                               env="coin", group="cluster:0", version=1, members=[t1, t2], cluster="0")],
                    _unit(1, 0.2, 0.01, 0)[None])
    s1, s2 = bank.add([make_item("skill", "walk, then take", f"rule {i}", system="lifemem", sources=[c1],
                                 env="coin", group="skills:0", version=1) for i in (1, 2)],
                      np.stack([_unit(0, 0, 1, 0.1), _unit(0, 0, 1, 0.2)]))
    [focus] = bank.add([make_item("focus", "coin: find the coin", "- look for exits", system="cfgm", env="coin")],
                       _unit(0, 0, 0, 1)[None])
    ids = dict(t1=t1, t2=t2, t3=t3, tip1=tip1, tip2=tip2, c1=c1, s1=s1, s2=s2, focus=focus)
    return bank, ItemGraph.from_bank(bank), ids


def test_expansion_adds_linked_items_once_with_their_links(world):
    bank, graph, ids = world
    state = _unit(1, 0.1, 0, 0)
    base = bank.candidates(state, 3, kind="case")
    cands = expand_candidates(bank, graph, state, base, env="coin")
    assert isinstance(cands, ItemCandidates)
    assert cands.ids[:3] == base.ids
    extra = dict(zip(cands.ids[3:], cands.kinds[3:]))
    assert extra == {ids["focus"]: "focus", ids["tip1"]: "tip", ids["tip2"]: "tip", ids["s1"]: "skill",
                     ids["s2"]: "skill"}  # the old skill version and the cluster entries are not shown
    row = {case_id: i for i, case_id in enumerate(cands.ids)}
    assert set(cands.links[row[ids["tip1"]]]) == {row[ids["t1"]], row[ids["t3"]]}
    assert set(cands.links[row[ids["s1"]]]) == {row[ids["t1"]], row[ids["t2"]]}
    np.testing.assert_allclose(cands.embeddings_CD, bank.embeddings(cands.ids))
    np.testing.assert_allclose(cands.scores_C, bank.embeddings(cands.ids) @ state, atol=1e-6)
    # the positive pool keeps every item, drops the failed trajectory
    pool = cands.positive(bank.rewards(cands.ids))
    assert ids["t3"] not in pool.ids and ids["tip1"] in pool.ids and isinstance(pool, ItemCandidates)
    kept = cands.take(np.array([row[ids["tip1"]], row[ids["t1"]]]))
    assert kept.links == [(1,), ()] and kept.kinds == ["tip", "case"]
    assert expand_candidates(bank, graph, state, base).kinds.count("focus") == 0  # no env: no focus point


def test_cfgm_takes_focus_then_successful_trajectories_then_their_tips(world):
    bank, graph, ids = world
    state = _unit(1, 0.1, 0, 0)
    cands = expand_candidates(bank, graph, state, bank.candidates(state, 3, kind="case"), env="coin")
    policy = make_policy(CFGMRetrievalConfig(), PolicyContext(dim=4, reward_of=bank_rewards(bank)))
    assert isinstance(policy, CFGMPolicy)
    sel = policy.select(state, cands, 6, rng=np.random.default_rng(0))
    assert sel.ids == [ids["focus"], ids["t1"], ids["t2"], ids["tip1"], ids["tip2"]]
    assert sel.greedy and sel.set_prob == 1.0
    assert policy.select(state, cands, 2, rng=np.random.default_rng(0)).ids == [ids["focus"], ids["t1"]]
    one = CFGMPolicy(CFGMRetrievalConfig(k_tasks=1, focus=False))
    assert one.select(state, cands, 6, rng=np.random.default_rng(0)).ids == [ids["t1"], ids["tip1"]]
    probs = policy.probs(state, cands)
    assert probs.sum() == pytest.approx(1.0) and probs[cands.ids.index(ids["t3"])] == 0.0


def test_lifemem_takes_trajectories_and_their_clusters_skills_once(world):
    bank, graph, ids = world
    state = _unit(1, 0.3, 0, 0)
    cands = expand_candidates(bank, graph, state, bank.candidates(state, 3, kind="case", env="coin"), env="coin")
    policy = make_policy(LifeMemRetrievalConfig(), PolicyContext(dim=4, reward_of=bank_rewards(bank)))
    assert isinstance(policy, LifeMemPolicy)
    assert policy.select(state, cands, 6, rng=np.random.default_rng(0)).ids == [ids["t2"], ids["t1"], ids["s1"],
                                                                               ids["s2"]]
    plain = bank.candidates(state, 3, kind="case")  # no items: raw cases only
    assert policy.select(state, plain, 6, rng=np.random.default_rng(0)).ids == [ids["t2"], ids["t1"]]


def test_soft_q_with_case_features_chooses_among_every_kind(world):
    from memento.learn.features import CaseFeaturizer

    bank, graph, ids = world
    state = _unit(1, 0.1, 0, 0)
    cands = expand_candidates(bank, graph, state, bank.candidates(state, 3, kind="case"), env="coin")

    def encode(texts):
        out = np.ones((len(texts), 4), dtype=np.float32)
        return out / np.linalg.norm(out, axis=1, keepdims=True)

    featurizer = CaseFeaturizer(bank, encode)
    agent = make_policy(loop_policy("soft_q"), PolicyContext(dim=4, k_max=4, reward_of=bank_rewards(bank),
                                                             featurizer=featurizer))
    vectors = featurizer.vectors(cands) if hasattr(featurizer, "vectors") else agent.case_vectors(cands)
    kind_block = np.asarray(vectors)[:, -8:]
    assert kind_block.sum(axis=1).tolist() == [1.0] * len(cands)  # one kind bit each
    sel = agent.select(state, cands, 4, rng=np.random.default_rng(0))
    assert len(sel.ids) == 4 and ids["t3"] not in sel.ids  # the failed trajectory is outside the positive pool


def test_configs_validate():
    check_policy(type("X", (), {"policy": CFGMRetrievalConfig()})(), "policy")
    with pytest.raises(ConfigError):
        CFGMRetrievalConfig(k_tasks=0)
    with pytest.raises(ConfigError):
        LifeMemRetrievalConfig(skills="yes")
