"""``memento_suites``: the shipped task suites as package data (this directory, installed under that name).

One directory per suite holding ``train.jsonl``, ``test.jsonl``, ``cases.jsonl`` and ``CARD.md``;
:mod:`memento.envs.tasks` finds them with :mod:`importlib.resources`, in a source checkout, an editable
install and an installed wheel alike. ``build_suites.py`` (the script that wrote them) ships alongside.
"""
