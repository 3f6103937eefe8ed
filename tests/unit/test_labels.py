"""memento.learn.labels and `memento score`: planner-scored labels with a CallablePlanner of known scores.

The planner here is a function whose log-likelihoods are known in advance, so every label can be checked
exactly; texts are encoded with the hashing encoder of tests/loop_env.py (no model is loaded).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from memento.bank import CaseBank
from memento.cli import entry as cli
from memento.cli import score as score_cli
from memento.errors import ConfigError, DataFormatError
from memento.learn.labels import LabelRow, iter_labels, read_labels, write_labels
from memento.planners.base import AnswerScore, CallablePlanner, PlannerError
from memento.runs.labels import LabelConfig, LabelCost, label_tasks, read_label_tasks, score_candidates, summary_path
from memento.types import Case, Task
from tests.loop_env import HashingEncoder

DIM = 32
TOPICS = ["capital", "currency", "plural", "ordinal"]


def make_cases() -> list[Case]:
    return [Case(id=f"{topic}-{i}", state=f"question {i} about the {topic} of thing {i}",
                 action=f"answer {i}", reward=1.0) for topic in TOPICS for i in range(6)]


def make_tasks(n: int = 6) -> list[Task]:
    return [Task(id=f"t{j}", question=f"what is the {TOPICS[j % 4]} of item {j}", answers=(f"gold {j}",))
            for j in range(n)]


def known_logprob(task_id: str, case_ids: list[str]) -> float:
    """A fixed, distinct log-likelihood per (task, case set): the sum of per-case values."""
    return -sum((int.from_bytes((task_id + c).encode()[-3:], "little") % 997) / 100.0 + 0.01 for c in case_ids)


def score_fn(task: Task, cases: list[Case], answer: str) -> AnswerScore:
    assert answer == task.answers[0]
    return AnswerScore(logprob=known_logprob(task.id, [c.id for c in cases]), n_tokens=2, prompt_tokens=10 * len(cases))


def planner() -> CallablePlanner:
    return CallablePlanner(lambda task, cases: "unused", name="known", score_fn=score_fn)


@pytest.fixture
def bank(tmp_path):
    encoder = HashingEncoder(DIM)
    cases = make_cases()
    with CaseBank.create(tmp_path / "bank", DIM) as bank:
        bank.add(cases, encoder.encode([c.state for c in cases]))
        yield bank


# ---------------------------------------------------------------- scoring


def test_labels_equal_the_known_scores(bank):
    encoder = HashingEncoder(DIM)
    tasks = make_tasks()
    rows = list(score_candidates(tasks, bank, encoder, planner(), LabelConfig(candidates=5, batch_size=4)))
    assert [row.task_id for row in rows] == [t.id for t in tasks]
    for task, row in zip(tasks, rows):
        every = bank.candidates(encoder.encode(task.question), len(bank))  # all cases, by cosine
        cosine_of = dict(zip(every.ids, every.scores_C.tolist()))
        assert row.cosine == pytest.approx([cosine_of[i] for i in row.candidate_ids])
        assert list(row.cosine) == sorted(row.cosine, reverse=True)  # the cosine top-C, best first
        assert min(row.cosine) >= every.scores_C[5] - 1e-6 and len(row.candidate_ids) == 5
        assert row.logprob == tuple(known_logprob(task.id, [c]) for c in row.candidate_ids)
        assert row.mean_logprob == pytest.approx([lp / 2 for lp in row.logprob])
        assert row.n_tokens == (2,) * 5 and row.prompt_tokens == (10,) * 5
        assert row.state == task.question and row.answer == task.answers[0]
        assert row.planner == "CallablePlanner(name='known')" and row.prompt == "custom"
        assert row.sets is None and row.set_logprob is None
        assert row.best == int(np.argmax(row.mean_logprob))


def test_k_sets_are_scored_seeded_and_independent_of_batching(bank):
    encoder = HashingEncoder(DIM)
    config = LabelConfig(candidates=6, k=3, sets=4, seed=7, batch_size=1)
    rows = list(score_candidates(make_tasks(), bank, encoder, planner(), config))
    for row in rows:
        assert len(row.sets) == 4 and len({frozenset(s) for s in row.sets}) == 4
        assert all(len(s) == 3 and set(s) <= set(row.candidate_ids) for s in row.sets)
        assert row.set_logprob == tuple(known_logprob(row.task_id, list(s)) for s in row.sets)
    again = list(score_candidates(make_tasks(), bank, encoder, planner(), LabelConfig(
        candidates=6, k=3, sets=4, seed=7, batch_size=5)))
    assert [r.to_json() for r in again] == [r.to_json() for r in rows]
    other = list(score_candidates(make_tasks(), bank, encoder, planner(), LabelConfig(
        candidates=6, k=3, sets=4, seed=8)))
    assert [r.sets for r in other] != [r.sets for r in rows]


def test_summary_counts_forward_passes(bank, tmp_path):
    encoder = HashingEncoder(DIM)
    out = tmp_path / "labels.jsonl"
    summary = label_tasks(make_tasks(5), bank, encoder, planner(), LabelConfig(candidates=4), out)
    assert summary["rows"] == summary["tasks"] == 5
    assert summary["forward_passes"] == summary["single_passes"] == 5 * 4 and summary["set_passes"] == 0
    assert summary["wall_s"] >= summary["score_s"] >= 0 and summary["s_per_forward"] >= 0
    assert summary["prompt_tokens_mean"] == 10
    assert summary_path(out) == tmp_path / "labels.summary.json"
    assert json.loads(summary_path(out).read_text()) == json.loads(json.dumps(summary))
    with_sets = label_tasks(make_tasks(5), bank, encoder, planner(), LabelConfig(candidates=4, k=2, sets=3),
                            tmp_path / "sets.jsonl")
    assert with_sets["forward_passes"] == 5 * 4 + 5 * 3 and with_sets["set_passes"] == 15
    assert with_sets["config"]["k"] == 2


def test_max_tasks_and_own_question_excluded(bank, tmp_path):
    encoder = HashingEncoder(DIM)
    own = Task(id="own", question=make_cases()[3].state, answers=("x",))
    cost = LabelCost()
    rows = list(score_candidates([own, *make_tasks()], bank, encoder, planner(),
                                 LabelConfig(candidates=4, max_tasks=3), cost=cost))
    assert [r.task_id for r in rows] == ["own", "t0", "t1"]
    assert make_cases()[3].id not in rows[0].candidate_ids and len(rows[0].candidate_ids) == 4
    assert cost.excluded_self == 1 and cost.tasks == 3 and cost.forward_passes == 12
    kept = list(score_candidates([own], bank, encoder, planner(), LabelConfig(candidates=4, exclude_self=False)))
    assert make_cases()[3].id in kept[0].candidate_ids  # kept (it ties with the other capital cases here)


def test_a_planner_that_cannot_score_says_so_in_one_line(bank, tmp_path):
    no_scores = CallablePlanner(lambda task, cases: "x", name="plain")
    with pytest.raises(PlannerError, match="cannot score answers") as error:
        label_tasks(make_tasks(), bank, HashingEncoder(DIM), no_scores, LabelConfig(candidates=2),
                    tmp_path / "labels.jsonl")
    assert "\n" not in str(error.value)
    assert not (tmp_path / "labels.jsonl").exists()  # atomic: nothing half-written
    nan = CallablePlanner(lambda t, c: "x", score_fn=lambda t, c, a: math.nan)
    with pytest.raises(PlannerError, match="not finite"):
        list(score_candidates(make_tasks(), bank, HashingEncoder(DIM), nan, LabelConfig(candidates=2)))


def test_config_is_validated():
    with pytest.raises(ConfigError, match="LabelConfig.k=5: must be <= candidates=4"):
        LabelConfig(candidates=4, k=5)
    with pytest.raises(ConfigError, match="LabelConfig.candidates=0"):
        LabelConfig(candidates=0)
    assert LabelConfig(k=1, sets=8).sets_per_task == 0 and LabelConfig(k=2, sets=8).sets_per_task == 8


# ---------------------------------------------------------------- the file


def _row(**changes) -> dict:
    row = {"task_id": "t", "state": "q?", "answer": "a", "candidate_ids": ["c1", "c2"], "logprob": [-1.0, -2.0],
           "mean_logprob": [-0.5, -1.0], "n_tokens": [2, 2], "planner": "p", "prompt": "few_shot"}
    row.update(changes)
    return {k: v for k, v in row.items() if v is not None}


def test_rows_round_trip(bank, tmp_path):
    rows = list(score_candidates(make_tasks(), bank, HashingEncoder(DIM), planner(),
                                 LabelConfig(candidates=4, k=2, sets=2)))
    assert write_labels(tmp_path / "labels.jsonl", rows) == len(rows)
    assert read_labels(tmp_path / "labels.jsonl") == rows
    assert [number for number, _ in iter_labels(tmp_path / "labels.jsonl")] == list(range(1, len(rows) + 1))
    for row in rows:
        assert LabelRow.from_json(json.loads(json.dumps(row.to_json()))) == row
    first = json.loads((tmp_path / "labels.jsonl").read_text().splitlines()[0])
    assert list(first) == ["task_id", "state", "answer", "candidate_ids", "logprob", "mean_logprob", "n_tokens",
                           "cosine", "prompt_tokens", "sets", "set_logprob", "planner", "prompt"]


BAD_ROWS = [
    (_row(task_id=None), "missing field 'task_id'"),
    (_row(logprob=None), "missing field 'logprob'"),
    (_row(logprob=[-1.0, float("nan")]), "field 'logprob'[1] is nan: scores must be finite"),
    (_row(mean_logprob=[-0.5, float("inf")]), "field 'mean_logprob'[1] is inf"),
    (_row(mean_logprob=[-0.5]), "field 'mean_logprob' has 1 value(s) for 2 candidate(s)"),
    (_row(n_tokens=[2, 0]), "field 'n_tokens'[1] must be an integer in [1, 2147483647] (a token count), got 0"),
    (_row(candidate_ids=["c1", "c1"]), "lists a case twice"),
    (_row(sets=[["c1"]]), "'sets' and 'set_logprob' go together"),
    (_row(sets=[["c1", "c9"]], set_logprob=[-1.0]), "holds 'c9', which is not a candidate"),
    (_row(sets=[["c1"], ["c2"]], set_logprob=[-1.0]), "field 'set_logprob' has 1 value(s) for 2 set(s)"),
    (_row(extra=1), "unknown field(s) ['extra']"),
]

# issue 40's fuzz holes: each was accepted by `memento train --from-labels`
FUZZ_HOLES = [
    (_row(logprob=[-1.0, 0.5], mean_logprob=[-0.5, 0.25]),
     "field 'logprob'[1] is 0.5: must be <= 0 (a log-probability)"),
    (_row(mean_logprob=[-0.5, 3.0]), "field 'mean_logprob'[1] is 3.0: must be <= 0"),
    (_row(sets=[["c1"]], set_logprob=[2.0]), "field 'set_logprob'[0] is 2.0: must be <= 0"),
    (_row(cosine=[0.9, 5.0]), "field 'cosine'[1] is 5.0: must be in [-1.05, 1.05] (a cosine similarity)"),
    (_row(cosine=[-7, 0.5]), "field 'cosine'[0] is -7: must be in [-1.05, 1.05]"),
    (_row(n_tokens=[2, 10 ** 300]), "field 'n_tokens'[1] must be an integer in [1, 2147483647] (a token count), got an "
                                    "integer of 301 digits"),
    (_row(prompt_tokens=[3, 10 ** 300]), "field 'prompt_tokens'[1] must be an integer in [0, 2147483647]"),
    (_row(prompt_tokens=[3, -1]), "field 'prompt_tokens'[1] must be an integer in [0, 2147483647]"),
    (_row(mean_logprob=[-0.5, -0.1]), "field 'mean_logprob'[1] is -0.1, but logprob / n_tokens is -2.0 / 2 = -1.0"),
    (_row(state="\x00"), "field 'state' holds a NUL character"),
    (_row(answer="\x00\x00"), "field 'answer' holds a NUL character"),
    (_row(task_id="\x00"), "field 'task_id' holds a NUL character"),
    (_row(planner="\x00"), "field 'planner' holds a NUL character"),
    (_row(prompt="\x01"), "field 'prompt' holds a control character"),
    (_row(state=" \n "), "field 'state' is empty"),
    (_row(state="q" * 1_000_001), "field 'state' is 1000001 characters long; a text holds at most 1000000"),
    (_row(answer="a" * 1_000_001), "field 'answer' is 1000001 characters long"),
    (_row(task_id="t" * 257), "field 'task_id' is 257 characters long; an id holds at most 256"),
    (_row(candidate_ids=["c1", "c\n2"]), "field 'candidate_ids'[1] holds a control character"),
    (_row(sets=[["c1", "c1"]], set_logprob=[-1.0]), "field 'sets'[0] holds a case twice: ['c1', 'c1']"),
    (_row(sets=[["c1", "c2"], ["c1", "c2"]], set_logprob=[-1.0, -1.0]), "field 'sets'[1] repeats 'sets'[0]"),
    (_row(sets=[["c1"]] * 1025, set_logprob=[-1.0] * 1025), "field 'sets' lists 1025 sets, more than 1024"),
]


@pytest.mark.parametrize("bad, reason", BAD_ROWS + FUZZ_HOLES)
def test_bad_rows_name_file_and_line(tmp_path, bad, reason):
    path = tmp_path / "labels.jsonl"
    path.write_text(json.dumps(_row()) + "\n\n" + json.dumps(bad) + "\n")  # a blank line 2: the bad row is line 3
    with pytest.raises(DataFormatError) as error:
        read_labels(path)
    message = str(error.value)
    assert message.startswith(f"{path}:3: ") and reason in message and "\n" not in message


def test_nan_is_refused_when_built_and_when_read(tmp_path):
    with pytest.raises(DataFormatError, match="scores must be finite"):
        LabelRow(task_id="t", state="q", answer="a", candidate_ids=("c",), logprob=(math.nan,), mean_logprob=(0.0,),
                 n_tokens=(1,), planner="p", prompt="x")
    path = tmp_path / "labels.jsonl"
    path.write_text('{"task_id": "t", "state": "q", "answer": "a", "candidate_ids": ["c"], "logprob": [NaN], '
                    '"mean_logprob": [NaN], "n_tokens": [1], "planner": "p", "prompt": "x"}\n')
    with pytest.raises(DataFormatError, match=r"labels.jsonl:1: field 'logprob'\[0\] is nan"):
        read_labels(path)


def test_tasks_without_answers_are_skipped_and_counted(tmp_path):
    path = tmp_path / "tasks.jsonl"
    rows = [{"id": "a", "question": "q1", "answers": ["x"]}, {"id": "b", "question": "q2", "answers": []},
            {"id": "c", "question": "q3"}, {"id": "d", "question": "q4", "answers": ["  "]},
            {"id": 5, "question": "q5", "answers": ["y", ""], "family": "f"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tasks, skipped = read_label_tasks(path)
    assert [t.id for t in tasks] == ["a", "5"] and skipped == 3 and tasks[1].answers == ("y",)
    path.write_text('{"id": "a", "answers": ["x"]}\n')
    with pytest.raises(DataFormatError, match=r"tasks.jsonl:1: missing field 'question'"):
        read_label_tasks(path)


# ---------------------------------------------------------------- memento score


@pytest.fixture
def fake_models(monkeypatch):
    """`memento score` with the hashing encoder and the known-score planner (no model is loaded)."""
    built = []

    def build(spec, **kwargs):
        built.append(str(spec))
        return planner()

    monkeypatch.setattr(score_cli, "load_encoder", lambda config: HashingEncoder(DIM))
    monkeypatch.setattr(score_cli, "build_planner", build)
    return built


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_score_command_writes_labels_summary_and_bank(tmp_path, fake_models, capsys):
    tasks = _write(tmp_path / "tasks.jsonl", [t.to_json() for t in make_tasks(4)]
                   + [{"id": "none", "question": "no answer here", "answers": []}])
    cases = _write(tmp_path / "cases.jsonl", [c.to_json() for c in make_cases()])
    out = tmp_path / "labels.jsonl"
    code = cli.main(["score", "--tasks", str(tasks), "--cases", str(cases), "--candidates", "3", "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0 and fake_models == ["gemma"]
    rows = read_labels(out)
    assert len(rows) == 4 and all(r.n_candidates == 3 for r in rows)
    summary = json.loads((tmp_path / "labels.summary.json").read_text())
    assert summary["forward_passes"] == 12 and summary["skipped_no_answer"] == 1 and summary["tasks_read"] == 4
    assert "12 forward pass(es)" in printed and "1 task(s) without answers" in printed
    assert f"--bank {tmp_path / 'labels.bank'}" in printed
    with CaseBank.open(tmp_path / "labels.bank") as bank:
        assert len(bank) == len(make_cases())
        assert {i for r in rows for i in r.candidate_ids} <= {c.id for c in bank.iter_cases()}
    # the bank is not rebuilt over itself; reusing it with --bank works
    assert cli.main(["score", "--tasks", str(tasks), "--cases", str(cases), "--out", str(out)]) == 2
    assert "already exists; pass --bank" in capsys.readouterr().err
    assert cli.main(["score", "--tasks", str(tasks), "--bank", str(tmp_path / "labels.bank"), "--candidates", "2",
                     "--k", "2", "--sets", "1", "--out", str(tmp_path / "again.jsonl")]) == 0
    again = json.loads((tmp_path / "again.summary.json").read_text())
    assert again["forward_passes"] == 4 * 2 + 4 * 1


def test_score_command_on_a_suite_uses_its_seed_cases(tmp_path, fake_models, capsys):
    out = tmp_path / "facts.jsonl"
    assert cli.main(["score", "--suite", "facts", "--max-tasks", "3", "--candidates", "2", "--out", str(out)]) == 0
    rows = read_labels(out)
    assert len(rows) == 3 and all(r.task_id.startswith("facts") for r in rows)
    summary = json.loads(summary_path(out).read_text())
    assert summary["split"] == "train" and summary["forward_passes"] == 6 and summary["tasks_source"] == "facts"


@pytest.mark.parametrize("argv, message", [
    (["--suite", "no-such-suite"], "unknown suite 'no-such-suite'"),
    (["--tasks", "missing.jsonl", "--cases", "x.jsonl"], "missing.jsonl: file not found"),
    (["--tasks", "t.jsonl"], "no cases to choose from"),
    (["--suite", "facts", "--k", "9", "--candidates", "4"], "LabelConfig.k=9: must be <= candidates=4"),
    (["--suite", "facts", "--planner", "nonsense"], "planner spec 'nonsense': unknown planner"),
    (["--tasks", "t.jsonl", "--split", "test", "--cases", "c.jsonl"], "--split goes with --suite"),
])
def test_score_command_bad_input_is_one_line(tmp_path, fake_models, capsys, argv, message, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = cli.main(["score", *argv, "--out", str(tmp_path / "labels.jsonl")])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1 and fake_models == []


def test_score_command_with_a_planner_that_cannot_score(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(score_cli, "load_encoder", lambda config: HashingEncoder(DIM))
    monkeypatch.setattr(score_cli, "build_planner", lambda spec, **kw: CallablePlanner(lambda t, c: "x", name="plain"))
    code = cli.main(["score", "--suite", "facts", "--max-tasks", "2", "--out", str(tmp_path / "labels.jsonl")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "memento: error: planner 'plain' cannot score answers" in err
    assert not (tmp_path / "labels.jsonl").exists()


@pytest.mark.parametrize("value", ["9" * 400, "-" + "9" * 400, "1" + "0" * 309])
def test_a_score_past_float_range_is_one_line_not_an_overflow(tmp_path, value):
    """``math.isfinite(10 ** 400)`` raises OverflowError: the reader must refuse such a score itself."""
    from memento.errors import DataFormatError
    from memento.learn.labels import read_labels

    def row(logprob: str, n_tokens: str) -> str:
        return ('{"task_id": "t", "state": "q", "answer": "a", "candidate_ids": ["c1"], "logprob": [' + logprob
                + '], "mean_logprob": [-1.0], "n_tokens": [' + n_tokens + '], "planner": "p", "prompt": "few_shot"}')

    digits = len(value.lstrip("-"))
    path = tmp_path / "labels.jsonl"
    path.write_text(row(value, "1") + "\n")
    with pytest.raises(DataFormatError, match=rf"labels.jsonl:1: field 'logprob'\[0\] is an integer of {digits} digits"
                       ) as caught:
        read_labels(path)
    assert len(str(caught.value)) < 300
    path.write_text(row("-1.0", value) + "\n")
    with pytest.raises(DataFormatError, match=rf"'n_tokens'\[0\] must be an integer in \[1, 2147483647\] \(a token "
                                              rf"count\), got an integer of {digits} digits"):
        read_labels(path)
