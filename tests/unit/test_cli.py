"""The memento command, in-process, on banks filled with vectors (no encoder needed)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from memento.bank import CaseBank
from memento.cli.entry import build_parser, main
from memento.types import Case
from tests.conftest import unit_vectors


def _bank_with_vectors(path, rng, n=20, dim=8):
    bank = CaseBank.create(path, dim)
    bank.add([Case(state=f"s{i}", action=f"a{i}", reward=float(i % 2), env="e" if i % 2 else None)
              for i in range(n)], unit_vectors(rng, n, dim))
    bank.close()


def test_help_lists_commands(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "bank" in out and "bench" in out


@pytest.mark.parametrize("argv", [["bank", "import", "--help"], ["bank", "search", "--help"],
                                  ["bench", "bank", "--help"], ["bank", "create", "--help"]])
def test_subcommand_help(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 0
    assert "--bank" in capsys.readouterr().out or argv[0] == "bench"


def test_no_command_prints_help_and_exits_2(capsys):
    assert main([]) == 2
    assert "usage" in capsys.readouterr().out


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("memento 0.")


def test_create_with_dim_then_stats(tmp_path, capsys):
    assert main(["bank", "create", "--bank", str(tmp_path / "b"), "--dim", "8", "--index", "HNSW32,Flat"]) == 0
    assert "dim=8" in capsys.readouterr().out
    assert main(["bank", "stats", "--bank", str(tmp_path / "b"), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["cases"] == 0 and stats["dim"] == 8 and stats["index"] == "HNSW32,Flat"


def test_create_twice_is_an_error(tmp_path, capsys):
    assert main(["bank", "create", "--bank", str(tmp_path / "b"), "--dim", "8"]) == 0
    assert main(["bank", "create", "--bank", str(tmp_path / "b"), "--dim", "8"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "already exists" in err


def test_bad_factory_is_one_line_error(tmp_path, capsys):
    assert main(["bank", "create", "--bank", str(tmp_path / "b"), "--dim", "8", "--index", "NotAnIndex"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("memento: error: IndexConfig.factory='NotAnIndex'") and err.count("\n") == 1
    assert not (tmp_path / "b").exists()


def test_stats_and_export(tmp_path, rng, capsys):
    _bank_with_vectors(tmp_path / "b", rng)
    assert main(["bank", "stats", "--bank", str(tmp_path / "b")]) == 0
    assert "cases: 20" in capsys.readouterr().out
    out = tmp_path / "out.jsonl"
    assert main(["bank", "export", str(out), "--bank", str(tmp_path / "b")]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["state"] for r in rows] == [f"s{i}" for i in range(20)]
    assert rows[1]["env"] == "e" and "env" not in rows[0]


def test_search_without_encoder_is_a_clear_error(tmp_path, rng, capsys):
    _bank_with_vectors(tmp_path / "b", rng)
    assert main(["bank", "search", "--bank", str(tmp_path / "b"), "hello"]) == 2
    assert "records no encoder" in capsys.readouterr().err


def test_not_a_bank(tmp_path, capsys):
    for command in (["bank", "stats"], ["bank", "search", "x"], ["bank", "export", str(tmp_path / "o.jsonl")]):
        assert main([*command, "--bank", str(tmp_path / "missing")]) == 2
        assert "not a case bank" in capsys.readouterr().err
    assert not (tmp_path / "o.jsonl").exists()


def test_import_bad_line_exits_2_and_changes_nothing(tmp_path, rng, capsys):
    _bank_with_vectors(tmp_path / "b", rng)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"state": "s", "action": "a", "reward": 1}\n{"state": "s", "action": "a", "reward": "x"}\n')
    assert main(["bank", "import", str(bad), "--bank", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert err == f"memento: error: {bad}:2: field 'reward' must be a number, got str\n"
    with CaseBank.open(tmp_path / "b") as bank:
        assert len(bank) == 20


def test_import_bad_file_does_not_create_a_bank(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"case": "q", "plan": "{\\"plan\\": []}", "case_label": "maybe"}\n')
    assert main(["bank", "import", "--format", "memento-memory", str(bad), "--bank", str(tmp_path / "new")]) == 2
    assert f"{bad}:1: field 'case_label' must be 'positive' or 'negative'" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()


def test_search_k_must_be_positive(tmp_path, rng, capsys):
    _bank_with_vectors(tmp_path / "b", rng)
    assert main(["bank", "search", "--bank", str(tmp_path / "b"), "x", "-k", "0"]) == 2
    assert "-k=0: must be an integer in 1..65536" in capsys.readouterr().err


def test_parser_rejects_unknown_format():
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["bank", "import", "f", "--bank", "b", "--format", "csv"])
    assert exit_info.value.code == 2


def test_bench_bank_tiny(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main(["bench", "bank", "--sizes", "300", "--factories", "Flat", "HNSW16,Flat", "IVF{nlist},Flat",
                 "--dim", "16", "--queries", "20", "-k", "5", "--json", str(out), "--workdir", str(tmp_path)]) == 0
    results = json.loads(out.read_text())
    rows = {r["factory"]: r for r in results["results"]}
    assert set(rows) == {"Flat", "HNSW16,Flat", "IVF4,Flat"}
    assert rows["Flat"]["search"][0]["recall@5"] == 1.0
    for row in rows.values():
        assert row["add_per_s"] > 0 and row["n"] == 300
        for s in row["search"]:
            assert 0.0 <= s["recall@5"] <= 1.0 and s["p50_ms"] <= s["p99_ms"]
    # exhaustive settings of approximate indexes are exact on a bank this small
    assert rows["IVF4,Flat"]["search"][-1]["recall@5"] == 1.0
    assert "| 300 | Flat |" in capsys.readouterr().out
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("memento-bench-")] == []


def test_ivf_nlist_trains():
    from memento.bench.bank import ivf_nlist

    assert ivf_nlist(1_000_000) == 4096
    for n in (300, 2_000, 10_000, 100_000):
        assert 39 * ivf_nlist(n) <= n


def test_bench_vectors_are_unit_and_seeded():
    from memento.bench.common import make_vectors

    for data in ("uniform", "clustered"):
        a = make_vectors(np.random.default_rng(3), 50, 12, data)
        b = make_vectors(np.random.default_rng(3), 50, 12, data)
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)
