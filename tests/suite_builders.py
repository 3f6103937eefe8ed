"""The shipped suites' build scripts (``data/build_*.py``) as modules, for the tests that rebuild them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

DATA = Path(__file__).resolve().parents[1] / "data"


def load_builder(name: str) -> ModuleType:
    """``data/<name>.py`` imported once as the module ``name`` (registered before it runs: dataclasses look their
    module up while the class is built)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, DATA / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]
