"""``memento bench train --lightning``: Lightning rows beside the plain loop's, in one document and one table."""

from __future__ import annotations

import json

import pytest

import memento.training.q_module  # noqa: F401  (imports Lightning at collection, not inside the first test)
from memento.bench.train import TrainBenchConfig, format_table
from memento.cli.entry import main
from memento.training.bench import run_train_bench_lightning


def test_lightning_rows_sit_beside_the_plain_rows(tmp_path):
    config = TrainBenchConfig(archs=("mlp", "two_tower"), dim=16, hidden=32, buffer_size=300, steps=4, warmup_steps=2,
                              replay_reps=3, batch_size=16, device="cpu")
    out = tmp_path / "train.json"
    results = run_train_bench_lightning(config, out=out)
    assert json.loads(out.read_text()) == json.loads(json.dumps(results))
    assert [(r["trainer"], r["arch"]) for r in results["results"]] == [
        ("plain", "mlp"), ("lightning", "mlp"), ("plain", "two_tower"), ("lightning", "two_tower")]
    for r in results["results"]:
        assert r["samples"] == 4 * 16 * 4 and r["samples_per_s"] == pytest.approx(4 * r["decisions_per_s"])
        assert r["seconds"] > 0 and 0 < r["update_p50_ms"] <= r["update_p99_ms"] and r["params"] > 0
    plain, lightning = results["results"][:2]
    assert plain["params"] == lightning["params"]  # the same network
    ops = {name for name in results["replay"]["operations"] if not name.startswith("anchor:")}
    assert ops == {"transition", "add", "add_batch(16)", "sample(16)", "sample(16) + vectors",
                   "sample(16), bank of 10,000 cases", "sample(16) + vectors, bank of 10,000 cases"}
    assert "| lightning | two_tower | cpu |" in format_table(results)


@pytest.mark.slow  # the CLI times 200 repetitions of each replay operation too
def test_cli_flag(tmp_path, capsys):
    out = tmp_path / "train.json"
    assert main(["bench", "train", "--lightning", "--archs", "mlp", "--dim", "16", "--batch-size", "16", "--steps",
                 "3", "--buffer-size", "200", "--device", "cpu", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| plain | mlp | cpu |" in printed and "| lightning | mlp | cpu |" in printed
    assert json.loads(out.read_text())["trainers"] == ["plain", "lightning"]
