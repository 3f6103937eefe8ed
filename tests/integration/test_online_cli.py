"""``memento online``: a full run with an ``hf:`` planner (a tiny random GPT-2 made here), and bad input.

The tiny model answers garbage; the run only has to work end to end and write its files. Each bad
input prints one line on stderr and exits 2.
"""

from __future__ import annotations

import json
import socket
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from memento.cli.entry import main

TASKS = [
    {"id": "t1", "question": "What is the capital of France?", "answers": ["Paris"], "family": "capital"},
    {"id": "t2", "question": "What is the capital of Spain?", "answers": ["Madrid"], "family": "capital"},
    {"id": "t3", "question": "What is two plus two?", "answers": ["4", "four"], "family": "sum"},
    {"id": "t4", "question": "What is three plus four?", "answers": ["7", "seven"], "family": "sum"},
]
CASES = [
    {"id": "c1", "state": "What is the capital of Italy?", "action": "Rome", "reward": 1.0},
    {"id": "c2", "state": "What is the capital of Peru?", "action": "Lima", "reward": 1.0},
    {"id": "c3", "state": "What is one plus one?", "action": "2", "reward": 1.0},
    {"id": "c4", "state": "What is five plus five?", "action": "The answer is 10.", "reward": 0.0},
    {"id": "c5", "state": "What is the capital of Chile?", "action": "Santiago", "reward": 1.0},
]


# a planner that cannot answer: if a bad input were not refused up front, the run would fail fast
# instead of starting a real model
UNREACHABLE = "openai:m@http://127.0.0.1:9/v1"


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


@pytest.fixture
def files(tmp_path) -> tuple[Path, Path]:
    return _jsonl(tmp_path / "tasks.jsonl", TASKS), _jsonl(tmp_path / "cases.jsonl", CASES)


def _tiny_causal_lm(path: Path) -> Path:
    """A 2-layer GPT-2 with random weights and a word-level tokenizer over the test's words."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    words = sorted({w for row in TASKS + CASES for text in row.values() if isinstance(text, str)
                    for w in text.replace("?", " ? ").replace(".", " . ").split()}
                   | {"Question", "Answer", ":", "Q", "A", "Examples", "Task", "Case", "reward"})
    vocab = {tok: i for i, tok in enumerate(["<unk>", "<pad>", "<eos>", *words])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", pad_token="<pad>",
                                        eos_token="<eos>", bos_token="<eos>")
    config = GPT2Config(vocab_size=len(vocab), n_positions=2048, n_embd=32, n_layer=2, n_head=2,
                        bos_token_id=vocab["<eos>"], eos_token_id=vocab["<eos>"], pad_token_id=vocab["<pad>"])
    import torch

    torch.manual_seed(0)
    GPT2LMHeadModel(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("memento: error: ")
    return err[0]


def test_online_with_a_tiny_hf_planner_writes_every_result(tmp_path, files, capsys):
    pytest.importorskip("memento.planners.hf")
    pytest.importorskip("memento.judges")
    tasks, cases = files
    model = _tiny_causal_lm(tmp_path / "tiny-gpt2")
    out = tmp_path / "out"
    argv = ["online", "--tasks", str(tasks), "--cases", str(cases), "--planner", f"hf:{model}",
            "--policy", "soft_q,similarity", "--judge", "exact", "--steps", "6", "--k", "2", "--candidates", "4",
            "--seed", "3", "--out", str(out), "--batch-size", "2", "--checkpoint-every", "2", "--warmup", "1",
            "--window", "3", "--late-steps", "3"]
    assert main(argv) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert "soft_q" in printed and "similarity" in printed and "LLM calls" in printed

    comparison = json.loads((out / "comparison.json").read_text())
    assert comparison["order"] == ["soft_q", "similarity"]
    svg = ET.parse(out / comparison["learning_curves"]).getroot()  # learning_curves.svg: a polyline per policy
    assert svg.tag == "{http://www.w3.org/2000/svg}svg" and comparison["learning_curves"] == "learning_curves.svg"
    lines = {p.get("data-series"): p.get("points").split() for p in svg.iter("{http://www.w3.org/2000/svg}polyline")}
    assert {k: len(v) for k, v in lines.items()} == {"soft_q": 4, "similarity": 4}  # steps 2..5: window 3 full
    for policy in ("soft_q", "similarity"):
        summary = json.loads((out / policy / "summary.json").read_text())
        assert summary["steps"] == summary["llm_calls"] == 6 and summary["bank_size_start"] == len(CASES)
        assert comparison["policies"][policy]["llm_calls"] == 6
        assert list((out / policy / "tb").glob("events.out.tfevents.*"))
        assert len((out / policy / "steps.jsonl").read_text().splitlines()) == 6
        assert json.loads((out / policy / "checkpoint" / "state.json").read_text())["step"] == 6
    assert (out / "soft_q" / "selector" / "learner.safetensors").is_file()
    assert json.loads((out / "soft_q" / "run.json").read_text())["planner"].startswith("HFPlanner")

    assert main(argv) == 2  # the directory holds runs now
    assert "already holds a run" in _error_line(capsys)
    assert main([*argv, "--resume"]) == 0  # finished runs: nothing left to do
    assert json.loads((out / "soft_q" / "summary.json").read_text())["resumed_from"] == 6


def test_missing_tasks_file(tmp_path, files, capsys):
    _, cases = files
    code = main(["online", "--tasks", str(tmp_path / "nope.jsonl"), "--cases", str(cases), "--planner", UNREACHABLE,
                 "--out", str(tmp_path / "out")])
    assert code == 2
    assert "nope.jsonl: file not found" in _error_line(capsys)
    assert not (tmp_path / "out").exists()


def test_malformed_task_line(tmp_path, files, capsys):
    _, cases = files
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(TASKS[0]) + "\n" + json.dumps({"id": "x", "question": "q?"}) + "\n")
    code = main(["online", "--tasks", str(bad), "--cases", str(cases), "--planner", UNREACHABLE,
                 "--out", str(tmp_path / "out")])
    assert code == 2
    assert f"{bad}:2: missing field 'answers'" in _error_line(capsys)


def test_malformed_case_line(tmp_path, files, capsys):
    tasks, _ = files
    bad = _jsonl(tmp_path / "cases.jsonl", [CASES[0], {"id": "c9", "state": "s", "action": "a", "reward": "yes"}])
    code = main(["online", "--tasks", str(tasks), "--cases", str(bad), "--planner", UNREACHABLE,
                 "--out", str(tmp_path / "out")])
    assert code == 2
    assert f"{bad}:2:" in _error_line(capsys)


@pytest.mark.parametrize("spec", ["llama", "hf:", "openai:model-without-url", "openai:m@localhost:8000"])
def test_bad_planner_spec(tmp_path, files, capsys, spec):
    tasks, cases = files
    code = main(["online", "--tasks", str(tasks), "--cases", str(cases), "--planner", spec,
                 "--out", str(tmp_path / "out")])
    assert code == 2
    assert "planner spec" in _error_line(capsys)


def test_missing_model_dir(tmp_path, files, capsys):
    tasks, cases = files
    code = main(["online", "--tasks", str(tasks), "--cases", str(cases), "--planner", f"hf:{tmp_path / 'no-model'}",
                 "--out", str(tmp_path / "out")])
    assert code == 2
    assert "no-model" in _error_line(capsys)


@pytest.mark.parametrize(("option", "value", "message"), [
    ("--policy", "soft_q,greedy", "unknown policy 'greedy'"), ("--policy", "random,random", "listed twice"),
    ("--steps", "0", "LoopConfig.steps=0"), ("--k", "33", "LoopConfig.k=33"), ("--batch-size", "0", "batch_size=0"),
])
def test_bad_options(tmp_path, files, capsys, option, value, message):
    tasks, cases = files
    code = main(["online", "--tasks", str(tasks), "--cases", str(cases), "--planner", UNREACHABLE,
                 "--out", str(tmp_path / "out"), option, value])
    assert code == 2
    assert message in _error_line(capsys)


def _closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_unreachable_openai_server(tmp_path, files, capsys):
    pytest.importorskip("memento.planners.openai_compat")
    pytest.importorskip("memento.judges")
    tasks, cases = files
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    code = main(["online", "--tasks", str(tasks), "--cases", str(cases), "--planner", f"openai:some-model@{url}",
                 "--policy", "similarity", "--steps", "3", "--out", str(tmp_path / "out")])
    assert code == 2
    line = _error_line(capsys)
    assert "127.0.0.1" in line


def test_demo_runs_the_shipped_suite_and_continues(tmp_path, capsys):
    """`memento demo` (what `make demo` runs) on the shipped facts-real suite, soft_q from the shipped pre-trained
    selector, with a tiny planner for speed."""
    pytest.importorskip("memento.planners.hf")
    model = _tiny_causal_lm(tmp_path / "tiny-gpt2")
    out = tmp_path / "demo"
    argv = ["demo", "--planner", f"hf:{model}", "--steps", "4", "--out", str(out)]
    assert main(argv) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert "soft_q" in printed and "pre-trained on planner-scored labels of facts-real/train" in printed
    comparison = json.loads((out / "comparison.json").read_text())
    assert comparison["order"] == ["soft_q", "similarity"]
    summary = json.loads((out / "soft_q" / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["bank_size_start"] == 312
    assert (out / "soft_q" / "selector" / "learner.safetensors").is_file()
    policy = json.loads((out / "soft_q" / "config.json").read_text())["policy"]
    assert policy["positive_only"] is True and policy["init_qnet"].endswith("facts-real/selector")
    learner = json.loads((out / "soft_q" / "selector" / "learner.json").read_text())
    assert learner["qnet_config"]["features"] == "case" and learner["qnet_config"]["anchor"] == "cosine"
    assert main(argv) == 0  # a second run continues (here: re-reports) the same run
    assert "continuing the demo run" in capsys.readouterr().out
    assert main([*argv, "--fresh"]) == 0
