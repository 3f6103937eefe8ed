"""The public surface of ``memento``: every exported name exists, and the import stays light."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import memento

HEAVY = ("lightning", "pytorch_lightning", "fastapi", "uvicorn", "openai", "httpx")


@pytest.mark.parametrize("name", memento.__all__)
def test_every_exported_name_is_importable(name: str) -> None:
    assert hasattr(memento, name)
    namespace: dict[str, object] = {}
    exec(f"from memento import {name}", namespace)
    assert namespace[name] is getattr(memento, name)


def test_all_is_sorted_and_unique() -> None:
    assert memento.__all__ == sorted(memento.__all__)
    assert len(set(memento.__all__)) == len(memento.__all__)
    assert "CaseBank" in memento.__all__ and "Encoder" in memento.__all__


def test_version() -> None:
    assert memento.__version__ == "0.1.0"


def test_error_hierarchy() -> None:
    for name in ("BankError", "CheckpointError", "ConfigError", "DataFormatError", "DimensionError",
                 "EncoderError", "NotABankError", "UnknownCaseError"):
        assert issubclass(getattr(memento, name), memento.MementoError)
    assert issubclass(memento.NotABankError, memento.BankError)
    assert issubclass(memento.UnknownCaseError, memento.BankError)


def test_import_does_not_pull_heavy_dependencies() -> None:
    code = (
        "import json, sys\n"
        "import memento, memento.config, memento.formats, memento.types, memento.encoders, memento.bank\n"
        f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))\n"
    )
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, timeout=120,
                            check=False)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []
