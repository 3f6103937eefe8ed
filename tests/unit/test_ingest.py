"""The streamed bulk import (:mod:`memento.bank.ingest`): the same cases, ids, hashes and one-line errors as the
standard reader and ``add``, in two passes over the file."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memento.bank import CaseBank
from memento.bank.ingest import _fast, import_case_file, scan_case_file
from memento.cli.entry import main
from memento.errors import DataFormatError
from memento.formats import read_cases_jsonl
from memento.types import Case, content_hash
from tests.conftest import unit_vectors

DIM = 16

ROWS = [
    {"state": "what is 2+2?", "action": "4", "reward": 1},
    {"state": "ünïcode \u2028 \"quoted\" \\ /", "action": "é\t", "reward": 0.25, "env": "e1", "kind": "tip"},
    {"id": "given-1", "state": "s", "action": "a", "reward": 0, "meta": {"b": [1, 2.5], "a": {"x": None}}},
    {"id": 17, "state": "scoped", "action": "a", "reward": 1.0, "user": "u", "session": "s1"},
    {"state": "x\x01y", "action": "ctl", "reward": 0.5},
]


def write(path: Path, lines: list[str | dict]) -> Path:
    path.write_text("".join((json.dumps(x) if isinstance(x, dict) else x) + "\n" for x in lines), encoding="utf-8")
    return path


@given(st.text(min_size=1), st.text(min_size=1), st.one_of(st.none(), st.text(min_size=1, max_size=5)),
       st.text(min_size=1, max_size=5), st.one_of(st.none(), st.text(min_size=1, max_size=5)))
@settings(max_examples=300, deadline=None)
def test_the_hash_is_the_one_banks_were_made_with(state: str, action: str, env: str | None, kind: str,
                                                  user: str | None) -> None:
    """content_hash writes its fields with orjson: the bytes json.dumps wrote when the banks' ids were derived."""
    try:
        case = Case(state=state, action=action, reward=0.0, env=env, kind=kind, user=user)
    except DataFormatError:
        return
    fields: list = [state, action, env, kind] + ([[user, None, None]] if user is not None else [])
    reference = hashlib.sha256(json.dumps(fields, ensure_ascii=False, separators=(",", ":")).encode()).hexdigest()
    assert content_hash(state, action, env, kind, case.scope) == case.content_hash == reference


def test_fast_cases_equal_the_standard_readers(tmp_path: Path) -> None:
    path = write(tmp_path / "c.jsonl", ROWS)
    standard = read_cases_jsonl(path)
    fast = [_fast(row) for row in ROWS]
    assert all(case is not None for case in fast)
    assert fast == standard


@pytest.mark.parametrize("line", [
    '{"state": "s", "action": "a", "reward": 1.5}',
    '{"state": "s", "action": "a", "reward": true}',
    '{"state": "s", "action": "a", "reward": NaN}',
    '{"state": "s", "action": "a", "reward": 1, "extra": 1}',
    '{"state": " ", "action": "a", "reward": 1}',
    '{"state": "s\\u0000", "action": "a", "reward": 1}',
    '{"state": "s", "action": "a", "reward": 1, "env": "e\\n"}',
    '{"state": "s", "action": "a", "reward": 1, "meta": {"x": Infinity}}',
    '{"state": "s", "action": "a", "reward": 1, "meta": []}',
    '{"state": "s", "action": "a", "reward": 100000000000000000000000000000000}',
    '{"state": "\\ud800", "action": "a", "reward": 1}',
    '{"state": "s", "action": "a"',
    '[1, 2]',
    '{"state": "s", "action": "a", "reward": 1, "meta": ' + "[" * 150 + "]" * 150 + "}",
])
def test_bad_lines_give_the_standard_error(tmp_path: Path, line: str) -> None:
    path = write(tmp_path / "c.jsonl", [ROWS[0], line])
    with pytest.raises(DataFormatError) as standard:
        read_cases_jsonl(path)
    with pytest.raises(DataFormatError) as fast:
        scan_case_file(path, progress=False)
    assert str(fast.value) == str(standard.value)
    assert ":2:" in str(fast.value)


def test_blank_lines_bom_crlf_and_ids_used_twice(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(ROWS[0]).encode() + b"\r\n\n   \n\xe2\x80\x83\n"
                     + json.dumps(ROWS[2]).encode() + b"\n")
    assert scan_case_file(path, progress=False).cases == len(read_cases_jsonl(path)) == 2
    write(path, [ROWS[2], ROWS[0], {**ROWS[1], "id": "given-1"}])
    with pytest.raises(DataFormatError, match=r":3: id 'given-1' is used twice \(first on line 1\)"):
        scan_case_file(path, progress=False)


def _banks(tmp_path: Path, n: int) -> tuple[CaseBank, CaseBank, list[Case], np.ndarray, Path]:
    rows = [{"state": f"s{i % 150}", "action": f"a{i % 150}", "reward": i % 2, "env": f"e{i % 3}"} for i in range(n)]
    rows[7] = {**rows[7], "id": "given", "state": "unique"}
    path = write(tmp_path / "c.jsonl", rows)
    emb = unit_vectors(np.random.default_rng(0), n, DIM)
    a = CaseBank.create(tmp_path / "a", DIM, vectors="disk")
    b = CaseBank.create(tmp_path / "b", DIM, vectors="disk")
    return a, b, read_cases_jsonl(path), emb, path


def test_the_import_stores_what_add_stores(tmp_path: Path) -> None:
    a, b, cases, emb, path = _banks(tmp_path, 400)
    with a, b:
        a.add(cases, emb)
        assert import_case_file(b, scan_case_file(path, progress=False), emb, chunk=64, progress=False) == len(a)
        assert [c.id for c in a.iter_cases()] == [c.id for c in b.iter_cases()]
        def timeless(bank: CaseBank) -> list[Case]:
            return [dataclasses.replace(c, created=None, updated=None) for c in bank.iter_cases()]

        assert timeless(a) == timeless(b)
        np.testing.assert_array_equal(a.embeddings_at(np.arange(len(a))), b.embeddings_at(np.arange(len(b))))
        assert import_case_file(b, scan_case_file(path, progress=False), emb, chunk=64, progress=False) == 0


def test_an_id_another_case_holds_names_its_line(tmp_path: Path) -> None:
    a, b, cases, emb, path = _banks(tmp_path, 50)
    with b:
        b.add([Case(id="given", state="other", action="x", reward=1.0)], emb[:1])
        with pytest.raises(DataFormatError, match=r"c\.jsonl:8: id 'given' is already used by another case"):
            import_case_file(b, scan_case_file(path, progress=False), emb, progress=False)
        assert len(b) == 1
    a.close()


def test_the_cli_streams_a_case_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    n = 300
    path = write(tmp_path / "c.jsonl", [{"state": f"s{i}", "action": "a", "reward": 1} for i in range(n)])
    np.save(tmp_path / "v.npy", unit_vectors(np.random.default_rng(1), n, DIM))
    args = ["bank", "import", str(path), "--embeddings", str(tmp_path / "v.npy"), "--bank", str(tmp_path / "bank"),
            "--vectors", "disk", "--chunk", "100"]
    assert main(args) == 0
    assert f"imported {n} case(s)" in capsys.readouterr().out
    assert main(args) == 0
    assert "imported 0 case(s)" in capsys.readouterr().out
    conn = sqlite3.connect(tmp_path / "bank" / "cases.sqlite")
    assert conn.execute("SELECT COUNT(*), MAX(length(embedding)) FROM cases").fetchone() == (n, 0)
    conn.close()
    write(path, [{"state": "s", "action": "a", "reward": 1}] * 2 + ['{"state": 3}'])
    assert main(["bank", "import", str(path), "--embeddings", str(tmp_path / "v.npy"), "--bank",
                 str(tmp_path / "new")]) == 2
    assert "c.jsonl:3: field 'state' must be a string" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()


@pytest.mark.slow
def test_sigkill_during_a_streamed_import_keeps_whole_chunks_and_a_rerun_completes_it(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys
    import time

    n, chunk = 20_000, 500
    path = write(tmp_path / "c.jsonl", [{"state": f"s{i}", "action": "a", "reward": i % 2} for i in range(n)])
    emb = unit_vectors(np.random.default_rng(2), n, DIM)
    np.save(tmp_path / "v.npy", emb)
    command = [sys.executable, "-m", "memento", "bank", "import", str(path), "--embeddings", str(tmp_path / "v.npy"),
               "--bank", str(tmp_path / "bank"), "--vectors", "disk", "--index", "IVF8,PQ4x4fs", "--chunk", str(chunk)]
    rng = np.random.default_rng(0)
    killed = 0
    for _ in range(3):
        child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(float(rng.uniform(2.5, 5.0)))
        if child.poll() is None:
            child.send_signal(signal.SIGKILL)
            killed += 1
        child.wait()
        if (tmp_path / "bank" / "cases.sqlite").exists():
            with CaseBank.open(tmp_path / "bank") as bank:  # every block verifies; whole chunks only
                assert len(bank) % chunk == 0
                assert (tmp_path / "bank" / "vectors.f32").stat().st_size == len(bank) * DIM * 4
    assert subprocess.run(command, capture_output=True, timeout=300).returncode == 0
    with CaseBank.open(tmp_path / "bank") as bank:
        assert len(bank) == n
        np.testing.assert_array_equal(bank.embeddings_at(np.arange(n)), emb)
