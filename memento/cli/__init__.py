"""The ``memento`` command (:func:`memento.cli.entry.main`)."""

from memento.cli.entry import main

__all__ = ["main"]
