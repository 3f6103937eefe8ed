"""Hostile input gets one line, never a traceback (issue 12): the JSONL readers, ``memento bank``, the HTTP
request bodies, config JSON, file permissions under a umask, and temporaries left by a killed write."""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from memento import io as memento_io
from memento.bank import CaseBank
from memento.cli.entry import main
from memento.config import EncoderConfig, load_json
from memento.errors import ConfigError, DataFormatError
from memento.formats import (
    iter_jsonl,
    read_case_file,
    read_cases_jsonl,
    read_memento_np_memory,
    read_tasks_jsonl,
)
from memento.io import atomic_write, atomic_write_text
from memento.runs.qa import LoopConfig
from memento.types import Case
from tests.conftest import unit_vectors

DIM = 8
PLAN = json.dumps({"plan": [{"id": 1, "description": "look it up"}]})


def _case(**fields: Any) -> str:
    return json.dumps({"state": "s", "action": "a", "reward": 1, **fields})


def _write(path: Path, *lines: str | bytes) -> Path:
    path.write_bytes(b"".join((line if isinstance(line, bytes) else line.encode()) + b"\n" for line in lines))
    return path


def _one_line_error(info: pytest.ExceptionInfo[BaseException], path: Path, line: int | None = 1) -> str:
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{path}:{line}: " if line is not None else f"{path}: "), message
    return message


def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth


# ---------------------------------------------------------------- the shared JSONL reader


def test_a_reward_of_400_digits_is_a_line_error(tmp_path: Path) -> None:
    path = _write(tmp_path / "c.jsonl", _case(), '{"state": "s2", "action": "a", "reward": ' + "9" * 400 + "}")
    with pytest.raises(DataFormatError) as info:
        read_cases_jsonl(path)
    assert "must be finite, got an integer of 400 digits" in _one_line_error(info, path, 2)


def test_an_integer_beyond_pythons_digit_limit_is_a_line_error(tmp_path: Path) -> None:
    path = _write(tmp_path / "c.jsonl", '{"state": "s", "action": "a", "reward": 1, "meta": {"x": ' + "1" * 5000 + "}}")
    with pytest.raises(DataFormatError) as info:
        read_cases_jsonl(path)
    assert "invalid JSON: Exceeds the limit" in _one_line_error(info, path)


@pytest.mark.parametrize("depth", [101, 2_000, 100_000])
def test_deep_nesting_is_a_line_error(tmp_path: Path, depth: int) -> None:
    path = _write(tmp_path / "c.jsonl", _case(), '{"state": "s", "action": "a", "reward": 1, "meta": {"x": '
                  + _deep(depth) + "}}")
    with pytest.raises(DataFormatError) as info:
        read_cases_jsonl(path)
    assert "nested deeper than 100 levels" in _one_line_error(info, path, 2)


def test_nesting_up_to_the_limit_loads(tmp_path: Path) -> None:
    path = _write(tmp_path / "c.jsonl", '{"state": "s", "action": "a", "reward": 1, "meta": {"x": ' + _deep(98) + "}}")
    assert len(read_cases_jsonl(path)) == 1


@pytest.mark.parametrize("line", [
    r'{"state": "s\ud800", "action": "a", "reward": 1}',
    r'{"state": "s", "action": "a", "reward": 1, "meta": {"\udfff": 1}}',
    r'{"state": "s", "action": "a", "reward": 1, "meta": {"x": ["ok", "\uDBFF"]}}',
])
def test_a_lone_surrogate_is_a_line_error(tmp_path: Path, line: str) -> None:
    path = _write(tmp_path / "c.jsonl", line)
    with pytest.raises(DataFormatError) as info:
        read_cases_jsonl(path)
    assert "lone surrogate" in _one_line_error(info, path)


def test_a_surrogate_pair_is_text(tmp_path: Path) -> None:
    path = _write(tmp_path / "c.jsonl", r'{"state": "smile \ud83d\ude00", "action": "a", "reward": 1}')
    assert read_cases_jsonl(path)[0].state == "smile \U0001f600"


def test_an_unreadable_file_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path / "c.jsonl", _case())
    real_open = Path.open

    def refuse(self: Path, *args: Any, **kwargs: Any) -> Any:
        if self == path:
            raise PermissionError(13, "Permission denied", str(self))
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", refuse)
    with pytest.raises(DataFormatError) as info:
        read_cases_jsonl(path)
    assert str(info.value) == f"{path}: cannot read: Permission denied"


def test_a_byte_order_mark_and_crlf_are_accepted(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + _case().encode() + b"\r\n\r\n" + _case(state="s2").encode() + b"\r\n")
    assert [c.state for c in read_cases_jsonl(path)] == ["s", "s2"]


@pytest.mark.parametrize("meta", ['{"x": NaN}', '{"x": [Infinity]}', '{"x": {"y": -Infinity}}'])
def test_nan_in_meta_is_a_line_error(tmp_path: Path, meta: str) -> None:
    path = _write(tmp_path / "c.jsonl", '{"state": "s", "action": "a", "reward": 1, "meta": ' + meta + "}")
    with pytest.raises(DataFormatError) as info:
        read_cases_jsonl(path)
    assert "field 'meta':" in _one_line_error(info, path) and "is not a JSON number" in str(info.value)
    task = _write(tmp_path / "t.jsonl", '{"id": 1, "question": "q", "answers": ["a"], "meta": ' + meta + "}")
    with pytest.raises(DataFormatError, match="field 'meta'"):
        read_tasks_jsonl(task)


def test_invalid_utf8_and_non_objects_are_line_errors(tmp_path: Path) -> None:
    path = _write(tmp_path / "c.jsonl", _case(), b'{"state": "\xff"}')
    with pytest.raises(DataFormatError, match="not UTF-8 text") as info:
        list(iter_jsonl(path))
    _one_line_error(info, path, 2)
    path = _write(tmp_path / "c.jsonl", "[1, 2]")
    with pytest.raises(DataFormatError, match="expected a JSON object, got list"):
        list(iter_jsonl(path))


def test_an_id_on_two_lines_names_both(tmp_path: Path) -> None:
    path = _write(tmp_path / "c.jsonl", _case(id="x"), _case(id="y", state="s2"), "", _case(id="x", state="s3"))
    with pytest.raises(DataFormatError) as info:
        read_cases_jsonl(path)
    assert _one_line_error(info, path, 4) == f"{path}:4: id 'x' is used twice (first on line 1)"


@pytest.mark.parametrize("reward", [2, -1, 0.5, 1e300])
def test_memento_np_memory_rewards_are_0_or_1(tmp_path: Path, reward: float) -> None:
    path = _write(tmp_path / "np.jsonl", json.dumps({"question": "q1", "plan": PLAN, "reward": 1}),
                  json.dumps({"question": "q2", "plan": PLAN, "reward": reward}))
    with pytest.raises(DataFormatError) as info:
        read_memento_np_memory(path)
    assert f"field 'reward' must be 0 or 1 in Memento's memory, got {reward!r}" in _one_line_error(info, path, 2)


def test_memento_np_memory_accepts_0_and_1(tmp_path: Path) -> None:
    path = _write(tmp_path / "np.jsonl", *(json.dumps({"question": f"q{i}", "plan": PLAN, "reward": r})
                                           for i, r in enumerate([0, 1, 0.0, 1.0])))
    assert [c.reward for c in read_memento_np_memory(path)] == [0.0, 1.0, 0.0, 1.0]


# ---------------------------------------------------------------- memento bank import / search


def _files(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())} if path.exists() else {}


BAD_IMPORTS = {
    "huge-reward": ("case", '{"state": "s", "action": "a", "reward": ' + "7" * 400 + "}"),
    "deep-meta": ("case", '{"state": "s", "action": "a", "reward": 1, "meta": {"x": ' + _deep(100_000) + "}}"),
    "surrogate": ("case", r'{"state": "s\ud800", "action": "a", "reward": 1}'),
    "np-reward-2": ("memento-np-memory", json.dumps({"question": "q", "plan": PLAN, "reward": 2})),
    "duplicate-id": ("case", _case(id="x") + "\n" + _case(id="x", state="other")),
}


@pytest.mark.parametrize("name", sorted(BAD_IMPORTS))
@pytest.mark.parametrize("existing", [False, True])
def test_bank_import_of_hostile_input_is_one_line_and_changes_nothing(tmp_path: Path, capsys: Any, name: str,
                                                                      existing: bool) -> None:
    fmt, text = BAD_IMPORTS[name]
    path = tmp_path / "in.jsonl"
    good = _case(state="good") if fmt == "case" else json.dumps({"question": "good", "plan": PLAN, "reward": 1})
    path.write_text(good + "\n" + text + "\n", encoding="utf-8")
    bank = tmp_path / "bank"
    if existing:
        assert main(["bank", "create", "--bank", str(bank), "--dim", str(DIM)]) == 0
        capsys.readouterr()
    before = _files(bank)
    assert main(["bank", "import", "--format", fmt, str(path), "--bank", str(bank)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1, captured.err
    assert re.match(rf"memento: error: {re.escape(str(path))}:[23]: ", captured.err), captured.err
    assert _files(bank) == before
    assert bank.exists() == existing


def test_bank_import_of_an_unreadable_file(tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path / "in.jsonl", _case())
    if os.geteuid() != 0:  # as root, chmod 0 does not stop reading: refuse it the way the OS would
        path.chmod(0)
    else:
        real_open = Path.open
        monkeypatch.setattr(Path, "open", lambda self, *a, **k: (_ for _ in ()).throw(
            PermissionError(13, "Permission denied", str(self))) if self == path else real_open(self, *a, **k))
    assert main(["bank", "import", str(path), "--bank", str(tmp_path / "bank")]) == 2
    assert capsys.readouterr().err == f"memento: error: {path}: cannot read: Permission denied\n"
    assert not (tmp_path / "bank").exists()


def test_bank_import_of_an_id_the_bank_holds_fails_before_encoding(tmp_path: Path, rng: Any, capsys: Any) -> None:
    bank_path = tmp_path / "bank"
    with CaseBank.create(bank_path, DIM) as bank:
        bank.add([Case(id="x", state="stored", action="a", reward=1.0)], unit_vectors(rng, 1, DIM))
    before = _files(bank_path)
    path = _write(tmp_path / "in.jsonl", _case(id="y", state="new"), _case(id="x", state="other"))
    # the bank records no encoder: reaching the encoder would be another error
    assert main(["bank", "import", str(path), "--bank", str(bank_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "id 'x' is already used by another case" in err and str(path) in err, err
    assert _files(bank_path) == before


class _CountingEncoder:
    """Deterministic hashed unit vectors, counting the texts it encoded."""

    def __init__(self, dim: int = DIM):
        self.dim, self.model_id, self.encoded = dim, "counting", 0

    def encode(self, texts: Any, **_: Any) -> np.ndarray:
        single = isinstance(texts, str)
        rows = []
        for text in [texts] if single else texts:
            seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
            rows.append(unit_vectors(np.random.default_rng(seed), 1, self.dim)[0])
        self.encoded += len(rows)
        return rows[0] if single else np.stack(rows)


def test_import_jsonl_checks_ids_before_encoding(tmp_path: Path, rng: Any) -> None:
    with CaseBank.create(tmp_path / "bank", DIM) as bank:
        bank.add([Case(id="x", state="stored", action="a", reward=1.0)], unit_vectors(rng, 1, DIM))
        path = _write(tmp_path / "in.jsonl", _case(id="x", state="other"))
        encoder = _CountingEncoder()
        with pytest.raises(DataFormatError, match="id 'x' is already used by another case") as info:
            bank.import_jsonl(path, encoder)
        assert "\n" not in str(info.value) and str(info.value).startswith(f"{path}: ")
        assert encoder.encoded == 0 and len(bank) == 1


def _searchable_bank(path: Path, rng: Any, monkeypatch: pytest.MonkeyPatch, n: int = 5) -> None:
    with CaseBank.create(path, DIM, encoder=EncoderConfig()) as bank:
        bank.add([Case(state=f"s{i}", action=f"a{i}", reward=1.0) for i in range(n)], unit_vectors(rng, n, DIM))
    monkeypatch.setattr("memento.cli.bank.load_encoder", lambda config: _CountingEncoder())


def test_bank_search_k_is_bounded_and_a_k_past_the_bank_finds_every_case(tmp_path: Path, rng: Any, capsys: Any,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    _searchable_bank(tmp_path / "bank", rng, monkeypatch)
    assert main(["bank", "search", "s1", "--bank", str(tmp_path / "bank"), "-k", "65536", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 5
    assert main(["bank", "search", "s1", "--bank", str(tmp_path / "bank"), "-k", "1000000000000", "--json"]) == 2
    assert capsys.readouterr().err == "memento: error: -k=1000000000000: must be an integer in 1..65536\n"


@pytest.mark.parametrize("k", ["0", "-3"])
def test_bank_search_k_below_1_is_one_line(tmp_path: Path, rng: Any, capsys: Any, monkeypatch: pytest.MonkeyPatch,
                                           k: str) -> None:
    _searchable_bank(tmp_path / "bank", rng, monkeypatch)
    assert main(["bank", "search", "s1", "--bank", str(tmp_path / "bank"), f"-k={k}"]) == 2
    assert capsys.readouterr().err == f"memento: error: -k={k}: must be an integer in 1..65536\n"


def test_bank_search_api_caps_k(tmp_path: Path, rng: Any) -> None:
    with CaseBank.create(tmp_path / "bank", DIM) as bank:
        emb = unit_vectors(rng, 5, DIM)
        bank.add([Case(state=f"s{i}", action="a", reward=1.0) for i in range(5)], emb)
        scores, ids = bank.search(emb[0], 10**12)
        assert len(ids) == 5 and ids[0] == bank.ids_at([0])[0]
        assert len(bank.candidates(emb[0], 10**12)) == 5
        scores, found = bank.search(emb[:2], 7)  # a batch is still padded to k
        assert scores.shape == (2, 7) and list(found[0, 5:]) == [None, None]
        with pytest.raises(DataFormatError, match="the bank holds 5 cases") as info:
            bank.search(emb[:2], 10**12)
        assert "\n" not in str(info.value)


def test_cli_os_errors_are_one_line(tmp_path: Path, rng: Any, capsys: Any) -> None:
    with CaseBank.create(tmp_path / "bank", DIM) as bank:
        bank.add([Case(state="s", action="a", reward=1.0)], unit_vectors(rng, 1, DIM))
    (tmp_path / "file").write_text("not a directory")
    assert main(["bank", "export", str(tmp_path / "file" / "out.jsonl"), "--bank", str(tmp_path / "bank")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("memento: error: ") and err.count("\n") == 1 and "Traceback" not in err


# ---------------------------------------------------------------- file modes under a umask


@pytest.fixture
def umask() -> Any:
    old = os.umask(0o022)
    os.umask(old)

    def set_mask(mask: int) -> None:
        os.umask(mask)

    yield set_mask
    os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("mask", [0o077, 0o022, 0o002])
def test_atomic_write_respects_the_umask(tmp_path: Path, umask: Any, mask: int) -> None:
    umask(mask)

    def private(tmp: Path) -> None:  # as safetensors writes its files
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, b"x")
        os.close(fd)

    atomic_write(tmp_path / "a.bin", private)
    atomic_write_text(tmp_path / "b.txt", "text")
    assert _mode(tmp_path / "a.bin") == 0o666 & ~mask
    assert _mode(tmp_path / "b.txt") == 0o666 & ~mask


def test_a_bank_under_umask_077_stays_private(tmp_path: Path, umask: Any, rng: Any) -> None:
    umask(0o077)
    with CaseBank.create(tmp_path / "bank", DIM, index="HNSW8,Flat") as bank:
        bank.add([Case(state=f"s{i}", action="a", reward=1.0) for i in range(12)], unit_vectors(rng, 12, DIM))
    files = sorted((tmp_path / "bank").iterdir())
    assert {p.name for p in files} >= {"cases.sqlite", "index.faiss", "index.json"}
    assert {p.name: _mode(p) & 0o077 for p in files} == {p.name: 0 for p in files}


# ---------------------------------------------------------------- temporaries left by a killed write


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_open_removes_temporaries_of_dead_writers_only(tmp_path: Path, rng: Any) -> None:
    bank_path = tmp_path / "bank"
    with CaseBank.create(bank_path, DIM, index="HNSW8,Flat") as bank:
        bank.add([Case(state=f"s{i}", action="a", reward=1.0) for i in range(4)], unit_vectors(rng, 4, DIM))
    dead = _dead_pid()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        names = {f".index.faiss.tmp-{dead}": True, f".index.json.tmp-{dead}": True,
                 f".index.json.tmp-{os.getpid()}": True,  # older than this process: a killed one of the same PID
                 f".index.faiss.tmp-{os.getpid()}": False,  # newer: this process may be writing it
                 f".index.faiss.tmp-{live.pid}": False,  # a live writer's: kept
                 f".notes.txt.tmp-{dead}": False, "index.faiss.tmp-1": False}  # not the bank's temporaries
        for name in names:
            (bank_path / name).write_bytes(b"partial")
        os.utime(bank_path / f".index.json.tmp-{os.getpid()}", (1e9, 1e9))
        with CaseBank.open(bank_path) as bank:
            assert len(bank) == 4
        assert {name: not (bank_path / name).exists() for name in names} == names
    finally:
        live.kill()
        live.wait()


def test_remove_stale_temporaries_of_a_missing_directory(tmp_path: Path) -> None:
    assert memento_io.remove_stale_temporaries(tmp_path / "nowhere", ["index.faiss"]) == []


# ---------------------------------------------------------------- config JSON


@pytest.mark.parametrize("text, match", [
    ('{"steps": 1, "success_threshold": ' + "9" * 400 + "}", "digits is not a finite number"),
    ('{"steps": ' + _deep(5000) + "}", "nested deeper than 100 levels"),
    ('{"steps": ' + _deep(150) + "}", "nested deeper than 100 levels"),
    ('{"index": "\\ud800"}', "lone surrogate"),
    ('{"steps": ' + "1" * 5000 + "}", "Exceeds the limit"),
    ('{"steps": [' + ", ".join(["1"] * 400) + "]}", "expected an integer"),
])
def test_config_json_hostile_values_are_one_line(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError, match=match) as info:
        load_json(LoopConfig, path)
    assert "\n" not in str(info.value) and len(str(info.value)) < 400


def test_config_json_with_a_byte_order_mark_loads(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps({"steps": 3}).encode())
    assert load_json(LoopConfig, path).steps == 3


def test_read_case_file_formats_share_the_hardening(tmp_path: Path) -> None:
    path = _write(tmp_path / "m.jsonl", r'{"case": "q\ud800", "plan": "{}", "case_label": "positive"}')
    with pytest.raises(DataFormatError, match="lone surrogate"):
        read_case_file(path, "memento-memory")


# ---------------------------------------------------------------- HTTP request bodies


@pytest.fixture
def http() -> Any:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from memento.serve.app import create_app
    from tests.unit.test_serve import AUTH, TOKEN, FakeSelector

    with TestClient(create_app(FakeSelector(), token=TOKEN)) as client:
        client.headers.update(AUTH)
        yield client


def _refused(response: Any, field: str) -> None:
    assert response.status_code == 422, response.text
    assert [err["loc"] for err in response.json()["detail"]][0][:2] == ["body", field], response.text


@pytest.mark.parametrize("k", [True, False, "4", 4.0, 2.5, None])
def test_http_k_must_be_an_integer(http: Any, k: Any) -> None:
    _refused(http.post("/v1/select", json={"query": "q", "k": k}), "k")


@pytest.mark.parametrize("reward", [True, False, "1", "0.5", None])
def test_http_rewards_must_be_numbers(http: Any, reward: Any) -> None:
    _refused(http.post("/v1/cases", json={"state": "s", "action": "a", "reward": reward}), "reward")
    _refused(http.post("/v1/feedback", json={"selection_id": "x", "reward": reward}), "reward")


def test_http_integers_are_numbers(http: Any) -> None:
    assert http.post("/v1/cases", json={"state": "s", "action": "a", "reward": 1}).status_code == 200
    assert http.post("/v1/select", json={"embedding": [1] + [0] * 7, "k": 2}).status_code == 200


def test_http_embedding_refuses_bools_and_strings(http: Any) -> None:
    _refused(http.post("/v1/select", json={"embedding": [True] + [0.0] * 7}), "embedding")
    _refused(http.post("/v1/select", json={"embedding": ["1"] + [0.0] * 7}), "embedding")


@pytest.mark.parametrize("body, field", [
    ('{"state": "s\\ud800", "action": "a", "reward": 1}', "state"),
    ('{"state": "s", "action": "a", "reward": 1, "meta": {"x": NaN}}', "meta"),
    ('{"state": "s", "action": "a", "reward": 1, "meta": {"\\udc00": 1}}', "meta"),
    ('{"state": "s", "action": "a", "reward": 1, "meta": {"x": ' + _deep(150) + "}}", "meta"),
    ('{"state": "s", "action": "a", "reward": 1, "env": "\\ud800"}', "env"),
])
def test_http_case_text_and_meta_must_be_storable(http: Any, body: str, field: str) -> None:
    _refused(http.post("/v1/cases", content=body, headers={"Content-Type": "application/json"}), field)


def test_http_select_query_with_a_lone_surrogate(http: Any) -> None:
    _refused(http.post("/v1/select", content='{"query": "q\\ud800"}', headers={"Content-Type": "application/json"}),
             "query")


@pytest.mark.parametrize("action", ["9" * 5000, "[" * 100_000, '{"plan": ' + "[" * 5000 + "]" * 5000 + "}"])
def test_a_case_action_that_breaks_json_is_shown_as_plain_text(action: str) -> None:
    """A stored action too deep or with too many digits for Python's JSON is plain text in a prompt, not an error."""
    from memento.planners.prompts import format_plan

    assert format_plan(action) == action
