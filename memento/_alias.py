"""Old top-level import paths kept as aliases for one release: ``policies`` is :mod:`memento.policies` and
``training`` is :mod:`memento.training` (they moved inside ``memento`` in 0.x; the old names warn once).

:func:`alias` makes ``import OLD.sub`` return the very module object ``NEW.sub`` (one module, so classes and
``isinstance`` agree), through a finder on ``sys.meta_path`` that loads nothing of its own.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings

__all__ = ["alias"]


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return importlib.import_module(self.target)

    def exec_module(self, module: types.ModuleType) -> None:
        """The target module is already executed."""


class _AliasFinder(importlib.abc.MetaPathFinder):
    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new

    def find_spec(self, fullname: str, path: object = None,
                  target: object = None) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(self.old + "."):
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(self.new + fullname[len(self.old):]))


def alias(old: str, new: str) -> types.ModuleType:
    """Make the package ``old`` (being imported) and its submodules the modules of ``new``; returns ``new``."""
    warnings.warn(f"'{old}' is now '{new}'; the old name is an alias for one release", DeprecationWarning,
                  stacklevel=3)
    module = importlib.import_module(new)
    if not any(isinstance(f, _AliasFinder) and f.old == old for f in sys.meta_path):
        sys.meta_path.insert(0, _AliasFinder(old, new))
    sys.modules[old] = module
    return module
