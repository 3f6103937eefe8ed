"""Selection policies, one module each, all behind ``memento.policy.Policy``.

- ``random``: uniform over the candidates (the floor);
- ``similarity``: cosine top-K, the non-parametric CBR baseline (optionally softmax sampling,
  optionally successful cases only);
- ``soft_q``: ``softmax(Q(s, c) / alpha)`` over a Q-network, parametric CBR (DESIGN §2);
- ``linucb``: a LinUCB contextual bandit on (state, case) features.

Later: ``cfgm``, ``lifemem``, ``plugmem``. :func:`make_policy` builds one by name with an
explicit ``match`` (no string-to-import registry).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, get_args

from memento.errors import ConfigError
from memento.policy import Policy
from policies.linucb import LinUCBConfig, LinUCBPolicy
from policies.random import RandomPolicy
from policies.similarity import RewardedCandidates, SimilarityConfig, SimilarityPolicy, bank_rewards, with_rewards
from policies.soft_q import SoftQPolicy

__all__ = [
    "LinUCBConfig",
    "LinUCBPolicy",
    "PolicyKind",
    "RandomPolicy",
    "RewardedCandidates",
    "SimilarityConfig",
    "SimilarityPolicy",
    "SoftQPolicy",
    "bank_rewards",
    "make_policy",
    "with_rewards",
]

PolicyKind = Literal["random", "similarity", "soft_q", "linucb"]


def _split(kind: str, kwargs: dict[str, Any], config_cls: type, extra: tuple[str, ...]) -> tuple[Any, dict[str, Any]]:
    fields = {f.name for f in dataclasses.fields(config_cls)}
    unknown = sorted(set(kwargs) - fields - set(extra))
    if unknown:
        raise ConfigError(f"make_policy({kind!r}): unknown argument(s) {unknown}; "
                          f"known: {sorted(fields | set(extra))}")
    try:
        config = config_cls(**{k: v for k, v in kwargs.items() if k in fields})
    except TypeError as error:  # a required field is missing
        raise ConfigError(f"make_policy({kind!r}): {error}") from None
    return config, {k: v for k, v in kwargs.items() if k in extra}


def make_policy(kind: PolicyKind, **kwargs: Any) -> Policy:
    """Build a policy by name.

    - ``"random"``: no arguments;
    - ``"similarity"``: :class:`SimilarityConfig` fields and ``reward_of``;
    - ``"soft_q"``: ``qnet`` (required), ``alpha``, ``device``;
    - ``"linucb"``: :class:`LinUCBConfig` fields (``dim`` required).

    An unknown kind or argument raises ``ConfigError``.
    """
    match kind:
        case "random":
            if kwargs:
                raise ConfigError(f"make_policy('random'): takes no arguments, got {sorted(kwargs)}")
            return RandomPolicy()
        case "similarity":
            config, extra = _split(kind, kwargs, SimilarityConfig, ("reward_of",))
            return SimilarityPolicy(config, **extra)
        case "soft_q":
            unknown = sorted(set(kwargs) - {"qnet", "alpha", "device"})
            if unknown or "qnet" not in kwargs:
                raise ConfigError(f"make_policy('soft_q'): needs qnet= and accepts alpha=, device=; "
                                  f"got {sorted(kwargs)}")
            return SoftQPolicy(**kwargs)
        case "linucb":
            config, _ = _split(kind, kwargs, LinUCBConfig, ())
            return LinUCBPolicy(config)
        case _:
            raise ConfigError(f"make_policy: kind={kind!r}: must be one of {get_args(PolicyKind)}")
