"""``memento bench select``: raw faiss next to the bank, chunked generation, build/train time and resident memory."""

from __future__ import annotations

import json

import numpy as np
import pytest

import memento.bench.common as common
from memento.bench.common import exact_topk, exact_topk_chunks, vector_chunks
from memento.bench.select import SelectBenchConfig, format_table, run_select_bench
from memento.cli.entry import main
from memento.errors import ConfigError


def _config(**overrides):
    fields = {"sizes": (2000,), "dim": 16, "queries": 12, "candidates": 16, "chunk": 500, "recall_queries": 8,
              "archs": ("mlp",), "reference_size": 0}
    return SelectBenchConfig(**{**fields, **overrides})


def _check_setting(setting):
    raw, cand = setting["faiss_alone"], setting["bank_candidates"]
    assert 0 < raw["p50_ms"] <= raw["p99_ms"] and 0 < cand["p50_ms"] <= cand["p99_ms"]
    assert setting["candidates_over_faiss_p50"] == pytest.approx(cand["p50_ms"] / raw["p50_ms"])
    assert setting["candidates_over_faiss_p99"] == pytest.approx(cand["p99_ms"] / raw["p99_ms"])
    assert 0.0 <= setting["recall_at_c"] <= 1.0 and 0.0 <= setting["faiss_recall_at_c"] <= 1.0
    similarity, soft_q = setting["policies"][0], setting["policies"][1]
    assert similarity["policy"] == "similarity" and soft_q["arch"] == "mlp"
    assert setting["softq_over_similarity_p50"] == {"mlp": pytest.approx(soft_q["p50_ms"] / similarity["p50_ms"])}
    assert setting["softq_over_similarity_p50"]["mlp"] > 0


def _check_row(row, n):
    assert row["n"] == n and row["chunk"] == 500 and row["recall_queries"] == 8
    assert row["build_s"] > 0 and row["add_per_s"] == pytest.approx(n / row["build_s"]) and row["exact_topk_s"] > 0
    assert 0 < row["rss_after_build_mib"] <= row["peak_rss_mib"]
    assert 0 < row["rss_after_select_mib"] <= row["peak_rss_mib"]


def test_select_reports_raw_faiss_memory_and_build_next_to_the_bank(tmp_path):
    out = tmp_path / "select.json"
    results = run_select_bench(_config(), out=out, workdir=tmp_path)
    assert json.loads(out.read_text()) == json.loads(json.dumps(results))
    [row] = results["results"]
    _check_row(row, 2000)
    assert row["factory"] == "Flat" and row["train_s"] is None  # Flat needs no training
    [setting] = row["settings"]
    _check_setting(setting)
    assert setting["recall_at_c"] == 1.0 and setting["faiss_recall_at_c"] == 1.0  # exact: both find the truth
    peers = format_table(results).split("\n\n")[1]
    assert "| 2,000 | Flat |  |" in peers and "mlp: " in peers and "candidates / faiss p50" in peers


def test_select_ivf_setting_per_nprobe_is_reproducible(tmp_path):
    config = _config(sizes=(2000,), exact_max=1000, factory="IVF16,Flat", nprobe=(1, 16), data="uniform")
    first = run_select_bench(config, workdir=tmp_path)
    second = run_select_bench(config, workdir=tmp_path)
    for results in (first, second):
        [row] = results["results"]
        _check_row(row, 2000)
        assert row["factory"] == "IVF16,Flat" and row["train_s"] > 0
        assert [(s["param"], s["value"]) for s in row["settings"]] == [("nprobe", 1), ("nprobe", 16)]
        for setting in row["settings"]:
            _check_setting(setting)
        # all 16 lists probed: exact; and the bank finds what the raw index finds
        assert row["settings"][1]["recall_at_c"] == 1.0
        assert [s["recall_at_c"] for s in row["settings"]] == [s["faiss_recall_at_c"] for s in row["settings"]]
    assert ([s["recall_at_c"] for s in first["results"][0]["settings"]]
            == [s["recall_at_c"] for s in second["results"][0]["settings"]])
    assert first["results"][0]["settings"][0]["recall_at_c"] < 1.0  # one list of 16: approximate, so not vacuous


def test_select_never_draws_more_than_one_chunk(tmp_path, monkeypatch):
    drawn: list[int] = []
    real = common.make_vectors

    def recording(rng, n, dim, data):
        out = real(rng, n, dim, data)
        drawn.append(len(out))
        return out

    monkeypatch.setattr(common, "make_vectors", recording)
    run_select_bench(_config(sizes=(1800,)), workdir=tmp_path)
    # queries (12) once, the base set 4 chunks to build (500 + 500 + 500 + 300) and again for the exact top-C
    assert sorted(drawn) == sorted([12] + [500, 500, 500, 300] * 2)
    assert max(drawn) <= 500


@pytest.mark.parametrize("data", ["uniform", "clustered"])
def test_vector_chunks_are_reproducible_and_drawn_alone(data):
    first = list(vector_chunks(7, 0, 1100, 12, data, 400))
    second = list(vector_chunks(7, 0, 1100, 12, data, 400))
    assert [start for start, _ in first] == [0, 400, 800] and [len(v) for _, v in first] == [400, 400, 300]
    for (s1, v1), (s2, v2) in zip(first, second):
        assert s1 == s2 and np.array_equal(v1, v2) and v1.dtype == np.float32
        assert np.allclose(np.linalg.norm(v1, axis=1), 1.0, atol=1e-5)
    assert not np.array_equal(first[0][1], first[1][1][:400])  # each chunk has its own generator
    other_seed = next(vector_chunks(8, 0, 1100, 12, data, 400))[1]
    queries = next(vector_chunks(7, 1, 1100, 12, data, 400))[1]
    assert not np.array_equal(other_seed, first[0][1]) and not np.array_equal(queries, first[0][1])


@pytest.mark.parametrize("chunk", [1, 7, 100, 1000])
def test_exact_topk_chunks_matches_the_whole_set(chunk):
    rng = np.random.default_rng(0)
    base_ND = rng.standard_normal((300, 8)).astype(np.float32)
    queries_QD = rng.standard_normal((70, 8)).astype(np.float32)  # more than one block of 64 queries
    chunks = ((start, base_ND[start:start + chunk]) for start in range(0, 300, chunk))
    assert np.array_equal(exact_topk_chunks(chunks, queries_QD, 10), exact_topk(base_ND, queries_QD, 10))
    few = exact_topk_chunks([(0, base_ND[:3])], queries_QD, 10)  # fewer vectors than k
    assert few.shape == (70, 3) and set(few[0].tolist()) == {0, 1, 2}


@pytest.mark.parametrize("overrides", [{"chunk": 0}, {"recall_queries": 0}, {"nprobe": ()}, {"nprobe": (0,)}])
def test_select_config_rejects_bad_chunk_and_nprobe(overrides):
    with pytest.raises(ConfigError, match="SelectBenchConfig"):
        _config(**overrides)


def test_select_cli_takes_chunk_nprobe_and_recall_queries(tmp_path, capsys):
    out = tmp_path / "select.json"
    assert main(["bench", "select", "--sizes", "1200", "--dim", "16", "--queries", "10", "--candidates", "16",
                 "--archs", "mlp", "--reference-size", "0", "--chunk", "500", "--recall-queries", "5",
                 "--exact-max", "1000", "--factory", "IVF8,Flat", "--nprobe", "2", "--json", str(out),
                 "--workdir", str(tmp_path)]) == 0
    results = json.loads(out.read_text())
    assert results["config"]["chunk"] == 500 and results["config"]["nprobe"] == [2]
    [row] = results["results"]
    assert row["recall_queries"] == 5 and row["settings"][0]["param"] == "nprobe"
    assert "| 1,200 | IVF8,Flat | nprobe=2 |" in capsys.readouterr().out
    assert main(["bench", "select", "--chunk", "0", "--json", str(out)]) == 2
    assert "SelectBenchConfig.chunk" in capsys.readouterr().err


def test_select_compares_ram_and_disk_banks_and_refine(tmp_path, capsys):
    out = tmp_path / "select.json"
    assert main(["bench", "select", "--sizes", "1500", "--dim", "16", "--queries", "10", "--candidates", "16",
                 "--archs", "mlp", "--reference-size", "0", "--chunk", "500", "--recall-queries", "8",
                 "--exact-max", "1000", "--factory", "IVF8,PQ4x4", "--nprobe", "8", "--vectors", "ram", "disk",
                 "--refine", "1", "4", "--json", str(out), "--workdir", str(tmp_path)]) == 0
    rows = json.loads(out.read_text())["results"]
    assert [(r["n"], r["vectors"]) for r in rows] == [(1500, "ram"), (1500, "disk")]
    for row in rows:
        assert [(s["value"], s["refine"]) for s in row["settings"]] == [(8, 1), (8, 4)]
        plain, refined = row["settings"]
        assert refined["recall_at_c"] > plain["recall_at_c"]  # 4-bit codes rank coarsely; exact re-ranking helps
    assert [s["recall_at_c"] for s in rows[0]["settings"]] == [s["recall_at_c"] for s in rows[1]["settings"]]
    assert "vector_reads" not in rows[0]
    assert rows[1]["vector_reads"] is None  # a disk bank stores its vectors once, in vectors.f32: no SQLite copy
    printed = capsys.readouterr().out
    assert "SQLite / map p50" not in printed
    assert "| 1,500 | IVF8,PQ4x4 (disk) | nprobe=8, refine=4 |" in printed
    assert not list(tmp_path.glob("memento-bench-*"))  # the banks are removed


def test_import_bench_then_select_on_the_kept_bank_cold_and_warm(tmp_path, capsys):
    """``bench import`` builds a bank with the real CLI; ``bench select --bank --cold`` measures it in place."""
    out = tmp_path / "import.json"
    assert main(["bench", "import", "--sizes", "1200", "--dim", "16", "--factory", "IVF8,PQ4x4fs", "--chunk", "500",
                 "--again", "--keep", str(tmp_path / "keep"), "--json", str(out)]) == 0
    [row] = json.loads(out.read_text())["results"]
    assert row["n"] == 1200 and row["cases_per_s"] > 0 and row["peak_rss_mib"] > 0 and row["again"]["wall_s"] > 0
    assert row["bank_bytes"]["vectors.f32"] == 1200 * 16 * 4
    assert "| 1,200 | IVF8,PQ4x4fs |" in capsys.readouterr().out
    bank = tmp_path / "keep" / "import-1200" / "bank"
    sel = tmp_path / "select.json"
    assert main(["bench", "select", "--bank", str(bank), "--queries", "10", "--candidates", "16", "--archs", "mlp",
                 "--recall-queries", "8", "--chunk", "500", "--nprobe", "8", "--refine", "1", "4", "--cold",
                 "--json", str(sel)]) == 0
    [measured] = json.loads(sel.read_text())["results"]
    assert measured["n"] == 1200 and measured["bank"] == str(bank) and measured["factory"] == "IVF8,PQ4x4fs"
    assert [(s["refine"], s["pass"]) for s in measured["settings"]] == [(1, "cold"), (1, "warm"), (4, "cold"),
                                                                          (4, "warm")]
    assert measured["settings"][2]["recall_at_c"] >= measured["settings"][0]["recall_at_c"]
    for setting in measured["settings"]:
        soft_q = setting["policies"][1]
        assert soft_q["first_pass_p50_ms"] > 0 and setting["softq_over_similarity_first_pass_p50"]["mlp"] > 0
    assert "nprobe=8, refine=4, cold" in capsys.readouterr().out


def test_select_on_cuda_needs_a_cuda_device(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device: tests/unit/test_bench_select_train.py runs the GPU bench")
    assert main(["bench", "select", "--sizes", "1200", "--device", "cuda", "--json", str(tmp_path / "o.json")]) == 2
    err = capsys.readouterr().err
    assert "--device cuda: no CUDA device is available" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o.json").exists()


@pytest.mark.gpu
def test_select_on_cuda_scores_and_searches_on_the_gpu(tmp_path):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU; none is present")
    results = run_select_bench(_config(sizes=(1500,), exact_max=1000, factory="IVF8,PQ4x4", vectors=("disk",),
                                       refine=(1, 4), device="cuda"), workdir=tmp_path)
    assert results["environment"]["policy_device"] == "cuda"
    [row] = results["results"]
    assert row["vectors"] == "disk" and [s["refine"] for s in row["settings"]] == [1, 4]
    for setting in row["settings"]:
        assert all(p["p50_ms"] > 0 for p in setting["policies"])
