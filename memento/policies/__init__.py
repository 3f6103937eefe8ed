"""Selection policies, one module each, all behind ``memento.learn.policy.Policy``, and their one registry.

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

A policy is one module (``memento/policies/<kind>.py``): its config class, its policy class, its factory entry
``build(config, context)`` and its run defaults, declared in the module's ``SPEC``
(:class:`~memento.policies.spec.PolicySpec`). :data:`POLICIES` is the one registry (kind -> spec); from it come
:data:`POLICY_CONFIGS`, :func:`check_policy`, :func:`make_policy` (the one factory) and the run defaults
:func:`loop_policy` (the QA and game loops) and :func:`regret_policy` (the regret run). :data:`PolicyKind` and
:data:`PolicyConfig` spell the same kinds and classes for type checkers (a test checks they agree).

Adding a policy: a module ``memento/policies/<kind>.py`` ending in ``SPEC = PolicySpec(...)``, its line in
:data:`POLICIES`, and its kind and config class in :data:`PolicyKind` and :data:`PolicyConfig` below.

Layers: this package sits on the base layer (``memento.config``, ``memento.learn``, ``memento.bank``, ...), which
never imports it; the modules that compose policies into runs (``memento.runs``, ``memento.selector``, ...) import
it (tests/unit/test_layers.py).
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from memento.config import check
from memento.errors import ConfigError
from memento.learn.policy import Policy, PolicyContext
from memento.policies import cfgm, lifemem, linucb, plugmem, random, similarity, soft_q
from memento.policies.cfgm import CFGMPolicy, CFGMRetrievalConfig
from memento.policies.lifemem import LifeMemPolicy, LifeMemRetrievalConfig
from memento.policies.linucb import LinUCBConfig, LinUCBPolicy
from memento.policies.plugmem import PlugMemPolicy, PlugMemRetrievalConfig
from memento.policies.random import RandomConfig, RandomPolicy
from memento.policies.similarity import (
    RewardedCandidates,
    SimilarityConfig,
    SimilarityPolicy,
    bank_rewards,
    with_rewards,
)
from memento.policies.soft_q import SoftQAgent, SoftQConfig, SoftQPolicy
from memento.policies.spec import PolicySpec

__all__ = [
    "POLICIES",
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
    "PolicySpec",
    "RandomConfig",
    "RandomPolicy",
    "RewardedCandidates",
    "SimilarityConfig",
    "SimilarityPolicy",
    "SoftQAgent",
    "SoftQConfig",
    "SoftQPolicy",
    "bank_rewards",
    "check_policy",
    "loop_policy",
    "make_policy",
    "regret_policy",
    "with_rewards",
]

POLICIES: dict[str, PolicySpec] = {spec.kind: spec for spec in (
    random.SPEC,
    similarity.SPEC,
    soft_q.SPEC,
    linucb.SPEC,
    cfgm.SPEC,
    lifemem.SPEC,
    plugmem.SPEC,
)}
"""The registry: each policy kind's :class:`~memento.policies.spec.PolicySpec` (config class, factory entry, run
defaults), in the order the kinds are listed everywhere (``--policy`` help, error messages)."""

PolicyKind = Literal["random", "similarity", "soft_q", "linucb", "cfgm", "lifemem", "plugmem"]
"""The kinds of :data:`POLICIES`, for type checkers."""

PolicyConfig = (RandomConfig | SimilarityConfig | SoftQConfig | LinUCBConfig | CFGMRetrievalConfig
                | LifeMemRetrievalConfig | PlugMemRetrievalConfig)
"""One selection policy's configuration; ``config.kind`` names the policy. Run configs (the online loop, the regret
run) nest one of them; a JSON ``{"kind": ...}`` object converts back to the right class
(:func:`memento.config.from_dict`)."""

POLICY_CONFIGS: dict[str, type] = {kind: spec.config for kind, spec in POLICIES.items()}
"""The config class of each policy kind (the names of :data:`PolicyKind`)."""


def check_policy(obj: Any, field: str = "policy") -> None:
    """``obj.field`` is one of the :data:`PolicyConfig` classes."""
    value = getattr(obj, field)
    check(isinstance(value, tuple(POLICY_CONFIGS.values())), type(obj), field, value,
          f"must be a policy config ({', '.join(c.__name__ for c in POLICY_CONFIGS.values())})")


def make_policy(config: PolicyConfig, context: PolicyContext) -> Policy:
    """The policy ``config`` describes, for a run described by ``context`` (the one policy factory): the factory
    entry of the kind whose config class ``config`` is (:data:`POLICIES`, in order), e.g.

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
    for spec in POLICIES.values():
        if isinstance(config, spec.config):
            return spec.build(config, context)
    raise ConfigError(f"make_policy: config={config!r}: must be one of "
                      f"{', '.join(c.__name__ for c in POLICY_CONFIGS.values())}")


def _spec(kind: str) -> PolicySpec:
    spec = POLICIES.get(kind) if isinstance(kind, str) else None
    if spec is None:
        raise ConfigError(f"policy kind {kind!r}: must be one of {get_args(PolicyKind)}")
    return spec


def loop_policy(kind: PolicyKind, *, gamma: float = 0.0) -> PolicyConfig:
    """The online runs' default config of policy ``kind`` (its module's ``loop_default``): the config class's own
    defaults, except

    - similarity: among the successful cases only, as Memento's non-parametric client retrieves them;
    - soft_q: among the same successful cases with a Q-network anchored on cosine similarity that sees the case
      features (:func:`memento.policies.soft_q.loop_default`), its ``learner.gamma`` set to ``gamma`` (0:
      cross-entropy on each step's own reward; > 0: soft TD with the target network, for the game loop).

    The QA loop takes these defaults (:func:`memento.runs.qa.qa_policy` adds soft-Q's labels, evidence and set
    choice), the game loop passes its ``gamma``. An unknown kind raises ``ConfigError``."""
    return _spec(kind).loop_default(gamma)


def regret_policy(kind: PolicyKind) -> PolicyConfig:
    """The regret run's default config of policy ``kind`` (its module's ``regret_default``): similarity's
    deterministic cosine top-k over all candidates, the run's own soft-Q
    (:func:`memento.policies.soft_q.regret_default`), the class's own defaults otherwise. An unknown kind raises
    ``ConfigError``."""
    return _spec(kind).regret_default()
