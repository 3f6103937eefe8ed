"""Deprecated alias of :mod:`memento.training` for one release: ``training.x`` is ``memento.training.x``."""

from memento._alias import alias

alias(__name__, "memento.training")
