"""The shipped suites' build scripts (``data/build_*.py``) as modules, for the tests that rebuild them."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data"


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


def assert_rebuild_matches(script: str, suite: str, files: tuple[str, ...], out: Path) -> None:
    """``data/<script>.py --out OUT``, in a fresh interpreter with another hash seed, writes ``suite``'s shipped
    ``files`` byte for byte (and names the suite on stdout)."""
    env = {**os.environ, "PYTHONHASHSEED": "4321"}
    result = subprocess.run([sys.executable, str(DATA / f"{script}.py"), "--out", str(out)],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert f"{suite}: " in result.stdout
    for name in files:
        assert (out / suite / name).read_bytes() == (DATA / suite / name).read_bytes(), (
            f"data/{suite}/{name} is stale: rebuild with `.venv/bin/python data/{script}.py --out data/`")
