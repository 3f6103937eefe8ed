"""``memento bench serve`` end to end on a small bank: the artifact is built (create_selector over a random bank),
a real server answers, and the JSON and the table hold every phase (the 100k-case figures are in
docs/benchmarks.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memento.cli.entry import main

pytestmark = pytest.mark.slow


def test_bench_serve_small(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "serve.json"
    argv = ["bench", "serve", "--size", "300", "--factory", "Flat", "--clients", "1", "4", "--selects", "40",
            "--text-selects", "4", "--feedbacks", "40", "--warmup", "2", "--no-learn", "--batch-max-texts", "8",
            "--artifact", str(tmp_path / "selector"), "--json", str(out)]
    assert main(argv) == 0
    table = capsys.readouterr().out
    results = json.loads(out.read_text())
    assert results["benchmark"] == "serve" and results["artifact"]["reused"] is False
    assert {"fastapi", "uvicorn", "torch", "loadavg_start", "loadavg_end"} <= set(results["environment"])
    record = results["record"]
    for kind, n in (("select_embedding", 40), ("select_text", 4)):
        for clients in ("1", "4"):
            phase = record[kind][clients]
            assert phase["ok"] == n and phase["errors"] == 0 and 0 < phase["p50_ms"] <= phase["p99_ms"]
    assert all(record["feedback"][c]["ok"] == 40 for c in ("1", "4"))
    assert record["acknowledged_feedback"] == record["recorded_feedback"] == 80
    assert record["exit_status"] == 0 and record["selector_stats"]["cases"] >= 300
    assert "learn" not in results
    for kind in ("select_text", "select_embedding"):  # 1 vs 4 clients: a ratio, no target (that is 1 vs 16)
        sc = results["scaling"][kind]
        assert sc["clients"] == [1, 4] and sc["ratio"] > 0 and sc["target"] is None
    # 4 timed and 2 warm-up text selects per client count, and the server's own warm-up select before /readyz
    assert record["encode_batching"]["texts"] == 2 * (4 + 2) + 1 and record["encode_batching"]["max_texts"] == 8
    assert "| by text | 1 -> 4 |" in table and "text encoding: 13 text(s) in" in table and "with 4 client(s)" in table
    for row in ("| select by embedding | 4 |", "| select by text | 1 |", "| feedback (record) | 4 |"):
        assert row in table
    assert (tmp_path / "selector" / "manifest.json").is_file()  # kept for reuse


def test_bench_serve_workers_1_and_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "serve.json"
    argv = ["bench", "serve", "--size", "300", "--factory", "Flat", "--clients", "1", "4", "--selects", "40",
            "--text-selects", "0", "--feedbacks", "40", "--warmup", "2", "--no-learn", "--workers", "1", "2",
            "--artifact", str(tmp_path / "selector"), "--json", str(out)]
    assert main(argv) == 0
    table = capsys.readouterr().out
    results = json.loads(out.read_text())
    assert results["config"]["workers"] == [1, 2] and set(results["by_workers"]) == {"1", "2"}
    assert results["by_workers"]["1"]["record"] == results["record"] and results["record"]["workers"] == 1
    two = results["by_workers"]["2"]["record"]
    assert two["workers"] == 2 and two["exit_status"] == 0
    assert all(two["select_embedding"][c]["ok"] == 40 for c in ("1", "4"))
    assert two["acknowledged_feedback"] == two["recorded_feedback"] == 80  # forwarded, all recorded
    assert "| 2 | by embedding | " in table and "| 1 | by embedding | " in table
