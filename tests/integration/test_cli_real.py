"""The issue's "done when" commands, run as a user would: the installed `memento` script, real encoder."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import MEMENTO_FIXTURES

pytestmark = pytest.mark.slow


def _memento(*args: str) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("memento")
    command = [str(exe)] if exe.exists() else [sys.executable, "-m", "memento"]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=300, env=os.environ.copy())


def test_import_memento_memory_then_search(tmp_path):
    bank = tmp_path / "b"
    result = _memento("bank", "import", "--format", "memento-memory", str(MEMENTO_FIXTURES / "memory.jsonl"),
                      "--bank", str(bank))
    assert result.returncode == 0, result.stderr
    assert "imported 200 case(s)" in result.stdout

    result = _memento("bank", "search", "--bank", str(bank), "What is the capital of Columbia County?", "-k", "4")
    assert result.returncode == 0, result.stderr
    ranks = re.findall(r"^(\d)\. \[(\d\.\d{4})\] (\S+)", result.stdout, flags=re.M)
    assert [r[0] for r in ranks] == ["1", "2", "3", "4"]
    scores = [float(r[1]) for r in ranks]
    assert scores == sorted(scores, reverse=True)
    assert "What is the capital of Orotina Canton?" in result.stdout.split("\n2. ")[0]

    # importing the same file again skips every case as a duplicate
    result = _memento("bank", "import", "--format", "memento-memory", str(MEMENTO_FIXTURES / "memory.jsonl"),
                      "--bank", str(bank))
    assert result.returncode == 0 and "imported 0 case(s)" in result.stdout


def test_malformed_line_exit_2_and_bank_unchanged(tmp_path):
    bank = tmp_path / "b"
    assert _memento("bank", "import", "--format", "memento-np-memory", str(MEMENTO_FIXTURES / "np_memory.jsonl"),
                    "--bank", str(bank)).returncode == 0
    before = (bank / "cases.sqlite").read_bytes()
    lines = (MEMENTO_FIXTURES / "memory.jsonl").read_text().splitlines()
    lines[6] = lines[6][:40]
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    result = _memento("bank", "import", "--format", "memento-memory", str(bad), "--bank", str(bank))
    assert result.returncode == 2
    assert result.stderr.startswith(f"memento: error: {bad}:7: invalid JSON")
    assert result.stderr.count("\n") == 1
    assert (bank / "cases.sqlite").read_bytes() == before
    stats = _memento("bank", "stats", "--bank", str(bank), "--json")
    assert '"cases": 8' in stats.stdout


def test_import_case_jsonl_with_env_and_filtered_search(tmp_path):
    source = tmp_path / "cases.jsonl"
    source.write_text(
        '{"id": "geo-1", "state": "What is the capital of Peru?", "action": "Lima", "reward": 1, "env": "geo"}\n'
        '{"id": "math-1", "state": "What is the capital of Peru? Answer with digits.", "action": "0", '
        '"reward": 0, "env": "math"}\n')
    bank = tmp_path / "b"
    assert _memento("bank", "import", str(source), "--bank", str(bank), "--index", "HNSW32,Flat").returncode == 0
    result = _memento("bank", "search", "--bank", str(bank), "capital of Peru", "-k", "4", "--env", "math", "--json")
    assert result.returncode == 0, result.stderr
    import json

    hits = json.loads(result.stdout)
    assert [h["id"] for h in hits] == ["math-1"]
    out = tmp_path / "export.jsonl"
    assert _memento("bank", "export", str(out), "--bank", str(bank)).returncode == 0
    assert [json.loads(x)["id"] for x in out.read_text().splitlines()] == ["geo-1", "math-1"]


def test_make_demo_target_commands_exist():
    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    assert "$(BIN)/memento demo" in makefile
    assert shutil.which("make") is not None
