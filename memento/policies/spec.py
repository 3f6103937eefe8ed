"""What a policy module declares for the registry (:data:`memento.policies.POLICIES`): one :class:`PolicySpec`.

A policy module (``memento/policies/<kind>.py``) holds the policy's config class, the policy class, its factory
entry (``build(config, context) -> Policy``) and its run defaults, and ends with ``SPEC = PolicySpec(...)`` naming
them; the package's ``__init__`` lists each module's ``SPEC`` once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from memento.learn.policy import Policy, PolicyContext

__all__ = ["PolicySpec"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class PolicySpec:
    """One policy kind, as its module declares it.

    - ``kind``: the name of the kind (its config's ``kind`` field, an entry of
      :data:`memento.policies.PolicyKind`);
    - ``config``: the config class (a frozen dataclass whose ``kind`` field defaults to ``kind``);
    - ``build``: the factory entry, ``build(config, context) -> Policy`` (:func:`memento.policies.make_policy`
      calls it for a config of class ``config``);
    - ``loop_default``: ``loop_default(gamma) -> config``, the online runs' default config of this kind (the QA
      loop with ``gamma = 0``, the game loop with its discount; only a learner with a discount reads it);
    - ``regret_default``: ``regret_default() -> config``, the regret run's default config of this kind.
    """

    kind: str
    config: type
    build: Callable[[Any, PolicyContext], Policy]
    loop_default: Callable[[float], Any]
    regret_default: Callable[[], Any]
