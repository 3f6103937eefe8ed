"""Selection policies, one module each, all behind ``memento.learn.policy.Policy``.

- ``random``: uniform over the candidates (the floor);
- ``similarity``: cosine top-K, the non-parametric CBR baseline (optionally softmax sampling,
  optionally successful cases only);
- ``soft_q``: ``softmax(Q(s, c) / alpha)`` over a Q-network, parametric CBR (README, "Concepts"):
  :class:`SoftQAgent` owns its Q-network, learner and replay buffer and learns in ``observe``;
  :class:`SoftQPolicy` chooses with a given, fixed network;
- ``linucb``: a LinUCB contextual bandit on (state, case) features, learning in ``observe``.

- ``cfgm``: CFGM's dual-channel retrieval (focus point, similar successful trajectories, their tips);
- ``lifemem``: LifeMem's environment-aligned retrieval (similar trajectories and their clusters' skills);
- ``plugmem``: PlugMem's retrieval (the most similar propositions/prescriptions, routed through their concepts
  and intents, pruned to a token budget).

:func:`make_policy` is the one factory: it builds a
policy from its config (:data:`memento.config.PolicyConfig`, one class per kind) with an explicit
``match`` (no string-to-import registry). The configs live in :mod:`memento.config`, so run configs
of the core can nest them; this package depends on the core, never the other way round.
"""

from __future__ import annotations

import dataclasses

from memento.config import (
    POLICY_CONFIGS,
    CFGMRetrievalConfig,
    LifeMemRetrievalConfig,
    LinUCBConfig,
    PlugMemRetrievalConfig,
    PolicyConfig,
    PolicyKind,
    RandomConfig,
    SimilarityConfig,
    SoftQConfig,
)
from memento.errors import ConfigError
from memento.learn.policy import Policy, PolicyContext
from memento.policies.cfgm import CFGMPolicy
from memento.policies.lifemem import LifeMemPolicy
from memento.policies.linucb import LinUCBPolicy
from memento.policies.plugmem import PlugMemPolicy
from memento.policies.random import RandomPolicy
from memento.policies.similarity import RewardedCandidates, SimilarityPolicy, bank_rewards, with_rewards
from memento.policies.soft_q import SoftQAgent, SoftQPolicy

__all__ = [
    "POLICY_CONFIGS",
    "CFGMPolicy",
    "CFGMRetrievalConfig",
    "LifeMemPolicy",
    "LifeMemRetrievalConfig",
    "LinUCBConfig",
    "LinUCBPolicy",
    "PlugMemPolicy",
    "PlugMemRetrievalConfig",
    "PolicyConfig",
    "PolicyContext",
    "PolicyKind",
    "RandomConfig",
    "RandomPolicy",
    "RewardedCandidates",
    "SimilarityConfig",
    "SimilarityPolicy",
    "SoftQAgent",
    "SoftQConfig",
    "SoftQPolicy",
    "bank_rewards",
    "make_policy",
    "with_rewards",
]


def make_policy(config: PolicyConfig, context: PolicyContext) -> Policy:
    """The policy ``config`` describes, for a run described by ``context`` (the one policy factory).

    - :class:`RandomConfig` -> :class:`RandomPolicy`;
    - :class:`SimilarityConfig` -> :class:`SimilarityPolicy` (``context.reward_of`` gives the stored
      rewards ``positive_only`` needs);
    - :class:`SoftQConfig` -> :class:`SoftQAgent` (Q-network, learner and replay buffer on
      ``context.device``, seeded with ``context.qnet_seed`` / ``context.learner_seed``);
    - :class:`CFGMRetrievalConfig` -> :class:`CFGMPolicy`, :class:`LifeMemRetrievalConfig` ->
      :class:`LifeMemPolicy`, :class:`PlugMemRetrievalConfig` -> :class:`PlugMemPolicy` (``context.reward_of``
      for the successful trajectories);
    - :class:`LinUCBConfig` -> :class:`LinUCBPolicy` (``dim`` from ``context.dim`` when not set).

    Anything else raises ``ConfigError``.
    """
    if not isinstance(context, PolicyContext):
        raise ConfigError(f"make_policy: context={type(context).__name__}: "
                          "must be a memento.learn.policy.PolicyContext")
    match config:
        case RandomConfig():
            return RandomPolicy(positive_only=config.positive_only, reward_of=context.reward_of)
        case SimilarityConfig():
            return SimilarityPolicy(config, reward_of=context.reward_of)
        case SoftQConfig():
            return SoftQAgent.create(config, context)
        case CFGMRetrievalConfig():
            return CFGMPolicy(config, reward_of=context.reward_of)
        case LifeMemRetrievalConfig():
            return LifeMemPolicy(config, reward_of=context.reward_of)
        case PlugMemRetrievalConfig():
            return PlugMemPolicy(config, reward_of=context.reward_of)
        case LinUCBConfig():
            if config.dim is None:
                config = dataclasses.replace(config, dim=context.dim)
            return LinUCBPolicy(config)
        case _:
            raise ConfigError(f"make_policy: config={config!r}: must be one of "
                              f"{', '.join(c.__name__ for c in POLICY_CONFIGS.values())}")
