"""Deprecated alias of :mod:`memento.policies` for one release: ``import policies.x`` imports ``memento.policies.x``."""

from memento._alias import alias

alias(__name__, "memento.policies")
