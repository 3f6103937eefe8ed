"""``python -m memento``: the ``memento`` command (:func:`memento.cli.main`)."""

from memento.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
