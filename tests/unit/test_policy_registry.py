"""The policy registry (``memento.policies``): one module per policy kind (config, class, factory entry, run
defaults), one line per kind in ``POLICIES``; the static ``PolicyKind`` / ``PolicyConfig`` agree with it, every
config field carries its help, and the run defaults are those the runs used before the registry."""

from __future__ import annotations

import dataclasses
import importlib
import json
from typing import get_args

import pytest

from memento.config import LearnerConfig, from_dict, to_dict
from memento.errors import ConfigError
from memento.flags import field_help
from memento.learn.policy import PolicyContext
from memento.policies import (
    POLICIES,
    POLICY_CONFIGS,
    LinUCBConfig,
    PolicyConfig,
    PolicyKind,
    PolicySpec,
    RandomConfig,
    SimilarityConfig,
    SoftQConfig,
    check_policy,
    loop_policy,
    make_policy,
    regret_policy,
)
from memento.policies.soft_q import anchored
from memento.runs.qa import LoopConfig
from memento.runs.regret import RegretConfig


def test_the_static_types_agree_with_the_registry() -> None:
    assert get_args(PolicyKind) == tuple(POLICIES) == tuple(POLICY_CONFIGS)
    assert get_args(PolicyConfig) == tuple(spec.config for spec in POLICIES.values())


@pytest.mark.parametrize("kind", list(POLICIES))
def test_each_kind_is_one_module(kind: str) -> None:
    spec = POLICIES[kind]
    module = importlib.import_module(spec.config.__module__)
    assert isinstance(spec, PolicySpec) and spec.kind == kind and module.SPEC is spec
    assert module.__name__.startswith("memento.policies.") and spec.build.__module__ == module.__name__
    assert spec.config().kind == kind
    assert type(loop_policy(kind)) is spec.config and type(regret_policy(kind)) is spec.config


@pytest.mark.parametrize("config", list(POLICY_CONFIGS.values()), ids=list(POLICY_CONFIGS))
def test_every_policy_config_field_has_help(config: type) -> None:
    for field in dataclasses.fields(config):
        text = field_help(config, field.name)
        assert isinstance(text, str) and text.strip(), f"{config.__name__}.{field.name} has no help"


def test_loop_defaults_are_the_runs_defaults() -> None:
    soft_q = anchored(SoftQConfig(positive_only=True))
    assert soft_q.qnet.anchor == "cosine" and soft_q.qnet.features == "case" and soft_q.learner.gamma == 0.0
    assert loop_policy("soft_q") == soft_q
    game = loop_policy("soft_q", gamma=0.9)
    assert game == dataclasses.replace(soft_q, learner=dataclasses.replace(soft_q.learner, gamma=0.9))
    assert loop_policy("similarity") == SimilarityConfig(positive_only=True) == loop_policy("similarity", gamma=0.5)
    for kind in ("random", "linucb", "cfgm", "lifemem", "plugmem"):
        assert loop_policy(kind) == POLICY_CONFIGS[kind]() == loop_policy(kind, gamma=0.9)  # type: ignore[arg-type]
    assert LoopConfig(policy=loop_policy("random")).policy == RandomConfig()


def test_regret_defaults_are_the_regret_runs_defaults() -> None:
    assert regret_policy("soft_q") == SoftQConfig(
        learner=LearnerConfig(gamma=0.0, lr=3e-3, weight_decay=0.0, batch_size=64, alpha=0.2, alpha_final=0.05,
                              alpha_decay_steps=1000), warmup=50, replay_capacity=100_000)
    assert RegretConfig().policy == regret_policy("soft_q")
    assert regret_policy("similarity") == SimilarityConfig()
    for kind in ("random", "linucb", "cfgm", "lifemem", "plugmem"):
        assert regret_policy(kind) == POLICY_CONFIGS[kind]()  # type: ignore[arg-type]


def test_an_unknown_kind_is_a_config_error() -> None:
    for run_default in (loop_policy, regret_policy):
        with pytest.raises(ConfigError, match=r"policy kind 'greedy': must be one of \('random', 'similarity', "
                                              r"'soft_q', 'linucb', 'cfgm', 'lifemem', 'plugmem'\)"):
            run_default("greedy")  # type: ignore[arg-type]


def test_make_policy_dispatches_through_the_registry_and_keeps_its_errors() -> None:
    context = PolicyContext(dim=4, k_max=2)
    for kind, spec in POLICIES.items():
        if kind in ("similarity", "random", "soft_q", "linucb"):
            policy = make_policy(spec.config(), context)
            assert type(policy).__module__ == spec.config.__module__
    assert make_policy(LinUCBConfig(), context).config.dim == 4  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="make_policy: context=dict: must be a memento.learn.policy.PolicyContext"):
        make_policy(RandomConfig(), {})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="make_policy: config='soft_q': must be one of RandomConfig, "
                                          "SimilarityConfig, SoftQConfig, LinUCBConfig, CFGMRetrievalConfig, "
                                          "LifeMemRetrievalConfig, PlugMemRetrievalConfig"):
        make_policy("soft_q", context)  # type: ignore[arg-type]


def test_a_run_config_reads_back_each_kind() -> None:
    for kind in POLICIES:
        config = LoopConfig(policy=loop_policy(kind))  # type: ignore[arg-type]
        assert from_dict(LoopConfig, json.loads(json.dumps(to_dict(config)))) == config
    with pytest.raises(ConfigError, match=r"LoopConfig.policy.kind='greedy': must be one of \('random', "):
        from_dict(LoopConfig, {"policy": {"kind": "greedy"}})
    with pytest.raises(ConfigError, match="must be a policy config"):
        check_policy(type("X", (), {"policy": {"kind": "random"}})())
