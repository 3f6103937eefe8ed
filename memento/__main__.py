"""``python -m memento``: the ``memento`` command (:func:`memento.cli.entry.main`)."""

from memento.cli.entry import main

if __name__ == "__main__":
    raise SystemExit(main())
