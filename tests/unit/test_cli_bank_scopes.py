"""``memento bank import`` and ``bank search`` with scopes and metadata filters, end to end through the CLI: Case
JSONL rows carrying user/agent/session and meta are imported, exported unchanged and searched with
``--user/--agent/--session`` and ``--filter JSON`` (the top k of the matching cases); a bad filter is one line."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from memento.cli.entry import main

DIM = 16

ROWS = [
    {"id": "a-geo", "state": "capital of Peru", "action": "Lima", "reward": 1.0, "user": "alice", "agent": "planner",
     "meta": {"topic": "geo", "level": 1}},
    {"id": "a-sci", "state": "boiling point of water", "action": "100 C", "reward": 1.0, "user": "alice",
     "session": "s1", "meta": {"topic": "sci", "level": 2}},
    {"id": "b-geo", "state": "capital of Chile", "action": "Santiago", "reward": 0.0, "user": "bob",
     "agent": "planner", "meta": {"topic": "geo", "level": 2, "done": True}},
    {"id": "b-art", "state": "painter of Guernica", "action": "Picasso", "reward": 1.0, "user": "bob",
     "meta": {"topic": "art", "level": 1}},
    {"id": "none", "state": "unscoped case", "action": "x", "reward": 0.5},
]


class _HashEncoder:
    """Deterministic unit vectors from a text's hash (no model), counting the texts encoded."""

    def __init__(self) -> None:
        self.dim, self.model_id, self.encoded = DIM, "hash", 0

    def encode(self, texts: Any, **_: Any) -> np.ndarray:
        single = isinstance(texts, str)
        rows = []
        for text in [texts] if single else texts:
            seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
            v = np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)
            rows.append(v / np.linalg.norm(v))
        self.encoded += len(rows)
        return rows[0] if single else np.stack(rows)


@pytest.fixture
def encoder(monkeypatch: pytest.MonkeyPatch) -> _HashEncoder:
    enc = _HashEncoder()
    monkeypatch.setattr("memento.cli.bank.load_encoder", lambda config: enc)
    return enc


@pytest.fixture
def bank(tmp_path: Path, encoder: _HashEncoder, capsys: pytest.CaptureFixture[str]) -> str:
    path = tmp_path / "cases.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in ROWS), encoding="utf-8")
    bank = str(tmp_path / "bank")
    assert main(["bank", "import", str(path), "--bank", bank]) == 0
    assert "imported 5 case(s)" in capsys.readouterr().out
    return bank


def _search(bank: str, capsys: pytest.CaptureFixture[str], text: str, *flags: str) -> list[dict[str, Any]]:
    assert main(["bank", "search", text, "--bank", bank, "-k", "10", "--json", *flags]) == 0
    return json.loads(capsys.readouterr().out)


def test_import_keeps_the_scope_and_meta_of_every_row(bank: str, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out.jsonl"
    assert main(["bank", "export", str(out), "--bank", bank]) == 0
    exported = {row["id"]: row for row in map(json.loads, out.read_text(encoding="utf-8").splitlines())}
    for row in ROWS:
        got = exported[row["id"]]
        for key in ("user", "agent", "session", "meta"):
            assert got.get(key) == row.get(key), (row["id"], key)


@pytest.mark.parametrize(("flags", "expected"), [
    (["--user", "alice"], {"a-geo", "a-sci"}),
    (["--user", "bob", "--agent", "planner"], {"b-geo"}),
    (["--session", "s1"], {"a-sci"}),
    (["--filter", '{"topic": "geo"}'], {"a-geo", "b-geo"}),
    (["--filter", '{"topic": {"in": ["sci", "art"]}}'], {"a-sci", "b-art"}),
    (["--filter", '{"OR": [{"level": 1}, {"done": true}]}'], {"a-geo", "b-art", "b-geo"}),
    (["--filter", '{"AND": [{"topic": "geo"}, {"level": 2}]}'], {"b-geo"}),
    (["--filter", '{"done": 1}'], set()),  # a number never matches a boolean
    (["--user", "alice", "--filter", '{"topic": "art"}'], set()),  # matches nothing: empty, not an error
    (["--user", "carol"], set()),
    (["--user", "alice", "--include-global"], {"a-geo", "a-sci", "none"}),  # hers and the unowned pool
    (["--user", "carol", "--include-global"], {"none"}),
    (["--filter", '{"level": {"gte": 2}}'], {"a-sci", "b-geo"}),
    (["--filter", '{"user": "bob"}'], {"b-geo", "b-art"}),  # a scope field in a filter
    (["--filter", "{}"], {row["id"] for row in ROWS}),
    ([], {row["id"] for row in ROWS}),
])
def test_search_is_restricted_to_the_scope_and_filter(bank: str, capsys: pytest.CaptureFixture[str],
                                                      flags: list[str], expected: set[str]) -> None:
    found = _search(bank, capsys, "capital of Chile", *flags)
    assert {row["id"] for row in found} == expected
    scores = [row["score"] for row in found]
    assert scores == sorted(scores, reverse=True)


def test_the_top_k_is_of_the_matching_cases(bank: str, capsys: pytest.CaptureFixture[str]) -> None:
    # bob's case is the exact match; in alice's scope k=1 still finds one of hers (pushed down, not post-filtered)
    assert [r["id"] for r in _search(bank, capsys, "capital of Chile", "-k", "1")] == ["b-geo"]
    found = _search(bank, capsys, "capital of Chile", "-k", "1", "--user", "alice")
    assert len(found) == 1 and found[0]["id"] in {"a-geo", "a-sci"} and found[0]["user"] == "alice"
    hit = _search(bank, capsys, "capital of Peru", "--user", "alice", "--agent", "planner")
    assert hit[0]["id"] == "a-geo" and hit[0]["score"] == pytest.approx(1.0, abs=1e-5)
    assert hit[0]["meta"] == {"topic": "geo", "level": 1} and hit[0]["agent"] == "planner"


def test_text_output_shows_the_scope_and_meta(bank: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bank", "search", "capital of Peru", "--bank", bank, "-k", "1", "--user", "alice"]) == 0
    out = capsys.readouterr().out
    first = out.splitlines()[0]
    assert first.startswith("1. [1.0000] a-geo") and "user=alice" in first and "agent=planner" in first, out
    meta = [line for line in out.splitlines() if line.startswith("   meta:   ")]
    assert len(meta) == 1 and json.loads(meta[0][len("   meta:   "):]) == {"topic": "geo", "level": 1}
    assert main(["bank", "search", "capital of Peru", "--bank", bank, "--user", "carol"]) == 0
    assert capsys.readouterr().out == "no cases found\n"


@pytest.mark.parametrize(("flags", "message"), [
    (["--filter", "{topic: geo}"], "--filter:1: invalid JSON"),
    (["--filter", '["geo"]'], "--filter must be an object"),
    (["--filter", '{"topic": {"like": 1}}'], "--filter.topic: unknown operator"),
    (["--filter", '{"topic": {"in": []}}'], "--filter.topic.in takes a non-empty list"),
    (["--filter", '{"OR": {"a": 1}}'], "--filter.OR takes a non-empty list"),
    (["--filter", '{"level": 1e400}'], "--filter: inf is not a JSON number"),
    (["--filter", '{"level": NaN}'], "--filter: nan is not a JSON number"),
    (["--filter", '{"level": 1e300}'], "at most 2**53"),
    (["--filter", '{"1bad": 1}'], "a filter key is a meta key"),
    (["--filter", '{"topic": "' + "x" * 5000 + '"}'], "at most 256 characters"),
    (["--user", "al\x01ice"], "scope.user"),
    (["--agent", ""], "scope.agent"),
    (["--include-global"], "--include-global goes beside a scope"),
    (["--filter", '{"topic": "\udcff"}'], "--filter is not UTF-8"),
])
def test_a_bad_scope_or_filter_is_one_line_before_the_encoder_runs(bank: str, encoder: _HashEncoder,
                                                                   capsys: pytest.CaptureFixture[str],
                                                                   flags: list[str], message: str) -> None:
    encoded = encoder.encoded
    assert main(["bank", "search", "capital of Peru", "--bank", bank, *flags]) == 2
    captured = capsys.readouterr()
    err = captured.err
    assert err.startswith("memento: error: ") and err.count("\n") == 1 and message in err, err
    assert len(err) < 400 and captured.out == ""  # a huge value is shortened, never echoed whole
    assert encoder.encoded == encoded


def test_help_names_the_scope_and_filter_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["bank", "search", "--help"])
    out = capsys.readouterr().out
    for flag in ("--user", "--agent", "--session", "--filter", '"in"'):
        assert flag in out, flag
    with pytest.raises(SystemExit):
        main(["bank", "import", "--help"])
    assert '"session"?' in capsys.readouterr().out
