"""``memento bench select`` and ``memento bench train`` on tiny sizes (the reference encoder test is slow)."""

from __future__ import annotations

import json

import pytest
import torch

from memento.bench.select import SelectBenchConfig, format_table, run_select_bench
from memento.bench.train import TrainBenchConfig, run_train_bench
from memento.cli.entry import main
from memento.errors import ConfigError

ARCHS = ["mlp", "mlp_interact", "two_tower"]


def _tiny_select(**overrides):
    fields = {"sizes": (200,), "dim": 16, "queries": 10, "candidates": 16, "reference_size": 0}
    return SelectBenchConfig(**{**fields, **overrides})


def _check_timing(p):
    assert 0 < p["p50_ms"] <= p["p99_ms"]
    assert 0 < p["candidates_p50_ms"] <= p["candidates_p99_ms"]
    assert 0 < p["policy_p50_ms"] <= p["policy_p99_ms"]


# ---------------------------------------------------------------- select


def test_select_flat_structure_and_exact_recall(tmp_path):
    threads = torch.get_num_threads()
    out = tmp_path / "select.json"
    results = run_select_bench(_tiny_select(), out=out, workdir=tmp_path)
    assert json.loads(out.read_text()) == json.loads(json.dumps(results))
    assert results["benchmark"] == "select" and results["reference"] is None
    assert results["index_rule"] == "Flat (exact) for N <= 20,000, else HNSW32,Flat"
    assert {"python", "cpus", "faiss", "torch", "select_torch_threads"} <= set(results["environment"])
    [row] = results["results"]
    assert row["n"] == 200 and row["factory"] == "Flat" and row["exact"] and row["candidates"] == 16
    [setting] = row["settings"]
    assert setting["param"] is None and setting["recall_at_c"] == 1.0
    assert [(p["policy"], p["arch"]) for p in setting["policies"]] == [("similarity", None)] + [
        ("soft_q", a) for a in ARCHS]
    for p in setting["policies"]:
        _check_timing(p)
    assert torch.get_num_threads() == threads  # restored after timing with --torch-threads 1
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("memento-bench-")] == []


def test_select_uses_the_approximate_index_above_exact_max(tmp_path):
    config = _tiny_select(sizes=(200, 300), exact_max=250, factory="HNSW16,Flat", ef_search=(16, 64),
                          archs=("two_tower",), data="uniform")
    results = run_select_bench(config, workdir=tmp_path)
    small, large = results["results"]
    assert (small["factory"], large["factory"]) == ("Flat", "HNSW16,Flat")
    assert [(s["param"], s["value"]) for s in large["settings"]] == [("ef_search", 16), ("ef_search", 64)]
    for s in large["settings"]:
        assert 0.0 <= s["recall_at_c"] <= 1.0
        for p in s["policies"]:
            _check_timing(p)
    table = format_table(results)
    assert "| 300 | HNSW16,Flat | ef_search=64 |" in table and "soft_q (two_tower)" in table


def test_select_adds_the_reference_size_to_the_measured_sizes():
    assert _tiny_select(sizes=(200, 500), reference_size=300).measured_sizes == (200, 500, 300)
    assert _tiny_select(sizes=(200, 300), reference_size=300).measured_sizes == (200, 300)
    assert _tiny_select(reference_size=0).measured_sizes == (200,)
    assert _tiny_select().factory_for(20_000) == "Flat" and _tiny_select().factory_for(20_001) == "HNSW32,Flat"


@pytest.mark.parametrize("overrides", [{"sizes": ()}, {"sizes": (0,)}, {"k": 0}, {"candidates": 2, "k": 4},
                                       {"queries": 0}, {"archs": ("cnn",)}, {"archs": ("mlp", "mlp")},
                                       {"ef_search": ()}, {"data": "gaussian"}, {"reference_size": -1},
                                       {"alpha": 0.0}, {"factory": " "}, {"torch_threads": -1}])
def test_select_config_rejects_bad_values(overrides):
    with pytest.raises(ConfigError, match="SelectBenchConfig"):
        _tiny_select(**overrides)


def test_select_cli_writes_the_file_and_prints_the_table(tmp_path, capsys):
    out = tmp_path / "sub" / "select.json"
    assert main(["bench", "select", "--sizes", "200", "--dim", "16", "--queries", "10", "--candidates", "16",
                 "--archs", "mlp", "--reference-size", "0", "--json", str(out), "--workdir", str(tmp_path)]) == 0
    results = json.loads(out.read_text())
    assert [p["arch"] for p in results["results"][0]["settings"][0]["policies"]] == [None, "mlp"]
    printed = capsys.readouterr().out
    assert "| 200 | Flat |  | 1.000 | similarity |" in printed and "soft_q (mlp)" in printed
    assert f"results written to {out}" in printed


@pytest.mark.parametrize("argv, message", [
    (["--sizes", "0"], "SelectBenchConfig.sizes"),
    (["--k", "8", "--candidates", "4"], "SelectBenchConfig.candidates"),
    (["--factory", "NotAnIndex"], "NotAnIndex"),
])
def test_select_cli_bad_values_are_one_line_errors(tmp_path, capsys, argv, message):
    out = tmp_path / "select.json"
    assert main(["bench", "select", "--sizes", "200", "--dim", "16", "--queries", "5", "--reference-size", "0",
                 "--json", str(out), "--workdir", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("memento: error: ") and message in err and err.count("\n") == 1
    assert not out.exists()


@pytest.mark.parametrize("argv", [["--data", "gaussian"], ["--archs", "cnn"], ["--sizes", "many"]])
def test_select_cli_rejects_bad_choices_with_status_2(tmp_path, argv):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "select", "--json", str(tmp_path / "x.json"), *argv])
    assert exit_info.value.code == 2


@pytest.mark.slow
def test_select_reference_with_the_real_encoder(tmp_path):
    """The Memento-style reference on 20 cases: 2N encoded sequences per query, compared at the same size."""
    config = _tiny_select(sizes=(20,), candidates=8, reference_size=20, reference_queries=2, archs=("mlp",))
    results = run_select_bench(config, workdir=tmp_path)
    ref = results["reference"]
    assert ref["n"] == 20 and ref["sequences_per_query"] == 40 and ref["queries"] == 2
    assert ref["model"] == "sentence-transformers/all-MiniLM-L6-v2" and ref["device"] == "cpu"
    assert 0 < ref["p50_ms"] <= ref["p99_ms"] and ref["query_encode_p50_ms"] > 0
    assert set(ref["soft_q_p50_ms"]) == {"mlp"}
    assert ref["ratio"]["mlp"] == pytest.approx(ref["p50_ms"] / ref["soft_q_p50_ms"]["mlp"])
    assert ref["ratio"]["mlp"] > 1.0
    assert "| 20 |" in format_table(results).split("\n\n")[1]


@pytest.mark.slow
def test_reference_scorer_encodes_every_pair(encoder):
    from memento.bench.select import ReferenceScorer, reference_texts

    scorer = ReferenceScorer(encoder, batch_size=8)
    encoded: list[list[str]] = []
    real_encode = scorer._encode
    scorer._encode = lambda texts: encoded.append(list(texts)) or real_encode(texts)
    cases = reference_texts(20)
    scores = scorer.scores("which region has the capital?", cases)
    assert scores.shape == (20,) and ((scores > 0) & (scores < 1)).all()
    assert sum(len(t) for t in encoded) == 40  # the query once per case (no de-duplication), plus each case
    assert [c for t in encoded[1::2] for c in t] == cases
    top = scorer.top_k("which region has the capital?", cases, 4)
    assert top.tolist() == sorted(range(20), key=lambda i: -scores[i])[:4]


# ---------------------------------------------------------------- train


def _tiny_train(**overrides):
    fields = {"dim": 16, "hidden": 32, "buffer_size": 500, "steps": 5, "warmup_steps": 1, "replay_reps": 5,
              "batch_size": 32, "device": "cpu"}
    return TrainBenchConfig(**{**fields, **overrides})


def test_train_structure(tmp_path):
    out = tmp_path / "train.json"
    results = run_train_bench(_tiny_train(), out=out)
    assert json.loads(out.read_text()) == json.loads(json.dumps(results))
    assert results["benchmark"] == "train" and results["environment"]["device"] == "cpu"
    assert results["buffer"]["decisions"] == 500
    assert [(r["trainer"], r["arch"]) for r in results["results"]] == [("plain", a) for a in ARCHS]
    for r in results["results"]:
        assert r["samples"] == 5 * 32 * 4 and r["device"] == "cpu" and r["params"] > 0
        assert r["samples_per_s"] == pytest.approx(4 * r["decisions_per_s"])
        assert r["sample_p50_ms"] > 0 and 0 < r["update_p50_ms"] <= r["update_p99_ms"]
    ops = {name for name in results["replay"]["operations"] if not name.startswith("anchor:")}
    assert ops == {"transition", "add", "add_batch(32)", "sample(32)", "sample(32) + vectors",
                   "sample(32), bank of 10,000 cases", "sample(32) + vectors, bank of 10,000 cases"}
    for t in results["replay"]["operations"].values():
        assert 0 < t["p50_us"] <= t["p99_us"]


@pytest.mark.parametrize("overrides", [{"batch_size": 0}, {"k": 0}, {"steps": 0}, {"archs": ()},
                                       {"archs": ("cnn",)}, {"trainers": ("lightning",)}, {"device": "tpu"},
                                       {"warmup_steps": -1}])
def test_train_config_rejects_bad_values(overrides):
    with pytest.raises(ConfigError, match="TrainBenchConfig"):
        _tiny_train(**overrides)


def test_train_cli_writes_the_file_and_prints_the_tables(tmp_path, capsys):
    out = tmp_path / "train.json"
    assert main(["bench", "train", "--archs", "two_tower", "--dim", "16", "--batch-size", "16", "--steps", "3",
                 "--buffer-size", "200", "--device", "cpu", "--json", str(out)]) == 0
    results = json.loads(out.read_text())
    assert [r["arch"] for r in results["results"]] == ["two_tower"]
    printed = capsys.readouterr().out
    assert "| plain | two_tower | cpu |" in printed and "| sample(16) |" in printed
    assert f"results written to {out}" in printed


def test_train_cli_bad_values_are_one_line_errors(tmp_path, capsys):
    out = tmp_path / "train.json"
    assert main(["bench", "train", "--batch-size", "0", "--json", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("memento: error: TrainBenchConfig.batch_size=0") and err.count("\n") == 1
    assert not out.exists()
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "train", "--archs", "cnn", "--json", str(out)])
    assert exit_info.value.code == 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error where no GPU exists")
def test_train_cuda_without_a_gpu_is_a_one_line_error(tmp_path, capsys):
    assert main(["bench", "train", "--device", "cuda", "--dim", "16", "--json", str(tmp_path / "t.json")]) == 2
    err = capsys.readouterr().err
    assert "no CUDA device" in err and err.count("\n") == 1


@pytest.mark.gpu
def test_train_on_cuda(tmp_path):
    results = run_train_bench(_tiny_train(device="cuda", archs=("mlp",)))
    assert results["environment"]["device"].startswith("cuda") and "cuda_device" in results["environment"]
    assert results["results"][0]["samples_per_s"] > 0


def test_train_bench_counts_the_distinct_vectors_of_each_buffer():
    results = run_train_bench(_tiny_train(bank_cases=100, archs=("mlp",)))
    rows = results["replay"]["table_rows"]
    random_cases, bank_cases = rows["random cases"]["cases"], rows["bank of 100 cases"]["cases"]
    assert bank_cases <= 101 and random_cases >= 500 * 4  # bank cases (and the zero padding) are stored once each
