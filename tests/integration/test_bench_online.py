"""`memento bench online` on tiny settings: the synthetic and overhead parts (the real part needs Gemma)."""

from __future__ import annotations

import json

from memento.cli.entry import main


def test_bench_online_synthetic_and_overhead(tmp_path, capsys):
    out = tmp_path / "online.json"
    argv = ["bench", "online", "--parts", "synthetic,overhead", "--synthetic-steps", "60", "--overhead-bank", "2000",
            "--overhead-steps", "12", "--json", str(out), "--workdir", str(tmp_path / "work"), "--torch-threads", "0"]
    assert main(argv) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert "synthetic bandit" in printed and "loop overhead at 2,000 cases" in printed
    results = json.loads(out.read_text())
    assert set(results["synthetic"]) == {"soft_q", "similarity"}
    for summary in results["synthetic"].values():
        assert summary["steps"] == 60 and 0.0 <= summary["first_window_regret"] <= 1.0
    for ms in results["overhead"]["policies"].values():
        assert ms["overhead"] > 0 and ms["overhead"] <= ms["total"]
    assert results["overhead"]["policies"]["similarity"]["learn"] < 0.1  # similarity does not learn


def test_bench_online_rejects_unknown_parts(tmp_path, capsys):
    assert main(["bench", "online", "--parts", "real,bogus", "--json", str(tmp_path / "o.json")]) == 2
    assert "parts" in capsys.readouterr().err
    assert not (tmp_path / "o.json").exists()
