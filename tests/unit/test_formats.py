"""JSONL readers and writers: the real Memento reference files, every bad input, atomic writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memento.errors import DataFormatError
from memento.formats import (
    ANSWER_SPLIT,
    MementoPair,
    iter_jsonl,
    read_case_file,
    read_cases_jsonl,
    read_memento_memory,
    read_memento_np_memory,
    read_memento_tasks,
    read_memento_training_pairs,
    read_tasks_jsonl,
    write_jsonl,
)
from memento.types import Case, Task
from tests.conftest import MEMENTO_FIXTURES

MEMORY = MEMENTO_FIXTURES / "memory.jsonl"
NP_MEMORY = MEMENTO_FIXTURES / "np_memory.jsonl"
TRAINING = MEMENTO_FIXTURES / "training_data.jsonl"
TASKS = MEMENTO_FIXTURES / "deepresearcher.jsonl"

PLAN = json.dumps({"plan": [{"id": 1, "description": "look it up"}]})


def _raw_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _row(**fields) -> str:
    return json.dumps(fields)


def _error(func, path: Path) -> DataFormatError:
    with pytest.raises(DataFormatError) as info:
        func(path)
    return info.value


# ---------------------------------------------------------------- the real fixtures


def test_read_memento_memory_fixture() -> None:
    cases = read_memento_memory(MEMORY)
    raw = _raw_lines(MEMORY)
    assert len(cases) == 200
    assert sum(c.reward == 1.0 for c in cases) == 110
    assert sum(c.reward == 0.0 for c in cases) == 90
    assert all(isinstance(c, Case) for c in cases)
    first = cases[0]
    assert first.state == "What sport does Deportivo Cali play?"
    assert first.action == raw[0]["plan"]  # kept verbatim
    assert first.reward == 1.0
    assert (first.id, first.env, first.kind) == (None, None, "case")
    assert first.meta == {"source": "memento-memory"}
    for case, row in zip(cases, raw, strict=True):
        assert case.state == row["case"]
        assert case.reward == (1.0 if row["case_label"] == "positive" else 0.0)
    assert any(c.state == "What is the capital of Orotina Canton?" for c in cases)


def test_read_memento_np_memory_fixture() -> None:
    cases = read_memento_np_memory(NP_MEMORY)
    assert len(cases) == 8
    assert [c.reward for c in cases] == [0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]
    assert cases[0].state == "What is the capital of Columbia County?"
    assert all(c.meta == {"source": "memento-np-memory"} for c in cases)
    assert all(json.loads(c.action)["plan"] for c in cases)


def test_read_memento_training_pairs_fixture() -> None:
    pairs = read_memento_training_pairs(TRAINING)
    raw = _raw_lines(TRAINING)
    assert len(pairs) == 400
    assert all(isinstance(p, MementoPair) for p in pairs)
    assert len({p.query for p in pairs}) == 50
    assert sum(p.truth_label for p in pairs) == 64
    assert all(isinstance(p.truth_label, bool) for p in pairs)
    first = pairs[0]
    assert first.query == "What is the capital of Columbia County?"
    assert first.case == "What sport does Deportivo Cali play?"
    assert first.case_reward == 1.0
    assert first.truth_label is False
    assert first.plan == raw[0]["plan"]
    case = first.as_case()
    assert (case.state, case.action, case.reward, case.meta) == (first.case, first.plan, 1.0,
                                                                 {"source": "memento-training"})
    # 8 rows per query, all with the same truth label
    by_query: dict[str, set[bool]] = {}
    for pair in pairs:
        by_query.setdefault(pair.query, set()).add(pair.truth_label)
    assert all(len(labels) == 1 for labels in by_query.values())


def test_read_memento_tasks_fixture() -> None:
    tasks = read_memento_tasks(TASKS)
    raw = _raw_lines(TASKS)
    assert len(tasks) == 200
    assert all(isinstance(t, Task) for t in tasks)
    assert tasks[0].id == "2wiki-1"
    assert tasks[0].answers == ("20 July 1851",)
    assert tasks[0].family == "2wiki"
    assert tasks[0].meta == {"data_source": "2wiki"}
    assert tasks[1].id == "popqa-2"
    assert tasks[1].question == "What is the capital of Columbia County?"
    assert tasks[1].answers == ("Bloomsburg", "The Only Town in Pennsylvania", "Eyersburg")
    for number, (task, row) in enumerate(zip(tasks, raw, strict=True), start=1):
        expected = tuple(a.strip() for a in row["ground_truth"].split(ANSWER_SPLIT) if a.strip())
        assert task.answers == expected
        assert task.id == f"{row['data_source']}-{number}"
        assert all(ANSWER_SPLIT not in a for a in task.answers)
    assert len({t.id for t in tasks}) == 200
    assert sum(len(t.answers) for t in tasks) == 877
    assert {t.family for t in tasks} == {"popqa", "hotpotqa", "tq", "2wiki", "Bamboogle", "musique", "nq"}


def test_read_case_file_every_format() -> None:
    assert read_case_file(MEMORY, "memento-memory") == read_memento_memory(MEMORY)
    assert read_case_file(NP_MEMORY, "memento-np-memory") == read_memento_np_memory(NP_MEMORY)
    unique = read_case_file(TRAINING, "memento-training")
    pairs = read_memento_training_pairs(TRAINING)
    assert len(unique) == 297
    assert len({(p.case, p.plan, p.case_reward) for p in pairs}) == 297
    assert len({c.content_hash for c in unique}) == 297
    assert unique[0] == pairs[0].as_case()  # first-seen order
    assert all(c.meta == {"source": "memento-training"} for c in unique)


def test_read_case_file_case_format(tmp_path: Path) -> None:
    path = _write(tmp_path / "c.jsonl", [_row(id="a", state="s", action="x", reward=1)])
    assert read_case_file(path, "case") == [Case(id="a", state="s", action="x", reward=1.0)]


def test_read_case_file_unknown_format() -> None:
    with pytest.raises(DataFormatError, match=r"unknown case format 'csv'; choose from"):
        read_case_file(MEMORY, "csv")  # type: ignore[arg-type]


# ---------------------------------------------------------------- Case / Task JSONL


def test_read_cases_jsonl_all_fields(tmp_path: Path) -> None:
    path = _write(tmp_path / "c.jsonl", [
        _row(id="a", state="s1", action="x1", reward=0.5, env="web", kind="tip", meta={"k": 1}),
        "",
        "   ",
        _row(id=7, state="s2", action="x2", reward=0),
        _row(id=None, state="s3", action="x3", reward=1.0, kind=None, meta=None),
    ])
    cases = read_cases_jsonl(path)
    assert cases == [
        Case(id="a", state="s1", action="x1", reward=0.5, env="web", kind="tip", meta={"k": 1}),
        Case(id="7", state="s2", action="x2", reward=0.0),
        Case(id=None, state="s3", action="x3", reward=1.0),
    ]


def test_read_tasks_jsonl(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.jsonl", [
        _row(id="t1", question="q1", answers=["a", "b"], family="nq", env="web", meta={"x": 1}),
        _row(id=2, question="q2", answers=["c"]),
    ])
    assert read_tasks_jsonl(path) == [
        Task(id="t1", question="q1", answers=("a", "b"), family="nq", env="web", meta={"x": 1}),
        Task(id="2", question="q2", answers=("c",)),
    ]


def test_iter_jsonl_line_numbers_count_blank_lines(tmp_path: Path) -> None:
    path = _write(tmp_path / "x.jsonl", ['{"a": 1}', "", '{"a": 2}', "  ", '{"a": 3}'])
    assert list(iter_jsonl(path)) == [(1, {"a": 1}), (3, {"a": 2}), (5, {"a": 3})]


def test_empty_file_reads_as_nothing(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text("", encoding="utf-8")
    assert read_cases_jsonl(path) == []
    assert read_memento_tasks(path) == []


# ---------------------------------------------------------------- bad input: path:line: reason


def _two_good_cases() -> list[str]:
    return [_row(state="s1", action="a1", reward=1), _row(state="s2", action="a2", reward=0)]


def test_malformed_json_on_line_3(tmp_path: Path) -> None:
    path = _write(tmp_path / "c.jsonl", [*_two_good_cases(), '{"state": "s3", "action": '])
    error = _error(read_cases_jsonl, path)
    assert str(error).startswith(f"{path}:3: invalid JSON: ")
    assert "(column " in str(error)
    assert (error.path, error.line) == (str(path), 3)


def test_malformed_json_after_blank_lines(tmp_path: Path) -> None:
    path = _write(tmp_path / "c.jsonl", [_row(state="s1", action="a1", reward=1), "", "{nope"])
    error = _error(read_cases_jsonl, path)
    assert str(error).startswith(f"{path}:3: invalid JSON: ")


@pytest.mark.parametrize(("text", "kind"),
                         [("[1, 2]", "list"), ('"hello"', "str"), ("42", "int"), ("null", "NoneType")])
def test_non_object_line(tmp_path: Path, text: str, kind: str) -> None:
    path = _write(tmp_path / "c.jsonl", [*_two_good_cases(), text])
    error = _error(read_cases_jsonl, path)
    assert str(error) == f"{path}:3: expected a JSON object, got {kind}"


def test_missing_field_case(tmp_path: Path) -> None:
    path = _write(tmp_path / "c.jsonl", [_row(state="s1", action="a1", reward=1), _row(state="s2", reward=1)])
    assert str(_error(read_cases_jsonl, path)) == f"{path}:2: missing field 'action'"


def test_null_required_field_is_missing(tmp_path: Path) -> None:
    path = _write(tmp_path / "c.jsonl", [_row(state="s1", action="a1", reward=None)])
    assert str(_error(read_cases_jsonl, path)) == f"{path}:1: missing field 'reward'"


def test_missing_field_memento_memory(tmp_path: Path) -> None:
    path = _write(tmp_path / "m.jsonl", [_row(case="q", plan=PLAN, case_label="positive"),
                                         _row(case="q2", case_label="negative")])
    assert str(_error(read_memento_memory, path)) == f"{path}:2: missing field 'plan'"


def test_missing_field_tasks(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.jsonl", [_row(question="q", ground_truth="a"), _row(question="q2")])
    assert str(_error(read_memento_tasks, path)) == f"{path}:2: missing field 'ground_truth'"


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ({"state": 5, "action": "a", "reward": 1}, "field 'state' must be a string, got int"),
        ({"state": "s", "action": ["a"], "reward": 1}, "field 'action' must be a string, got list"),
        ({"state": "s", "action": "a", "reward": "1"}, "field 'reward' must be a number, got str"),
        ({"state": "s", "action": "a", "reward": True}, "field 'reward' must be a number, got True"),
        ({"state": "s", "action": "a", "reward": 1, "env": 3}, "field 'env' must be a string, got int"),
        ({"state": "s", "action": "a", "reward": 1, "meta": [1]}, "field 'meta' must be an object, got list"),
        ({"id": 1.5, "state": "s", "action": "a", "reward": 1}, "field 'id' must be a string or a number, got float"),
        ({"id": True, "state": "s", "action": "a", "reward": 1},
         "field 'id' must be a string or a number, got True"),
    ],
)
def test_mistyped_field_case(tmp_path: Path, row: dict, reason: str) -> None:
    path = _write(tmp_path / "c.jsonl", [*_two_good_cases(), json.dumps(row)])
    error = _error(read_cases_jsonl, path)
    assert str(error) == f"{path}:3: {reason}"
    assert error.reason == reason


def test_mistyped_truth_label(tmp_path: Path) -> None:
    good = _row(query="q", case="c", case_label="positive", plan=PLAN, truth_label=True)
    bad = _row(query="q", case="c", case_label="positive", plan=PLAN, truth_label=1)
    path = _write(tmp_path / "t.jsonl", [good, bad])
    assert str(_error(read_memento_training_pairs, path)) == (
        f"{path}:2: field 'truth_label' must be true or false, got int")


def test_mistyped_answers_in_task_jsonl(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.jsonl", [_row(id="t", question="q", answers="Paris")])
    assert str(_error(read_tasks_jsonl, path)) == f"{path}:1: field 'answers' must be a list, got str"


def test_empty_text_case(tmp_path: Path) -> None:
    path = _write(tmp_path / "c.jsonl", [*_two_good_cases(), _row(state="   ", action="a", reward=1)])
    assert str(_error(read_cases_jsonl, path)) == f"{path}:3: Case.state is empty"


def test_empty_text_memento_memory(tmp_path: Path) -> None:
    path = _write(tmp_path / "m.jsonl", [_row(case="", plan=PLAN, case_label="positive")])
    assert str(_error(read_memento_memory, path)) == f"{path}:1: Case.state is empty"


@pytest.mark.parametrize("field", ["query", "case"])
def test_empty_text_training_pair(tmp_path: Path, field: str) -> None:
    row = {"query": "q", "case": "c", "case_label": "negative", "plan": PLAN, "truth_label": False}
    path = _write(tmp_path / "t.jsonl", [json.dumps(row), json.dumps({**row, field: " "})])
    assert str(_error(read_memento_training_pairs, path)) == f"{path}:2: field {field!r} is empty"


def test_empty_answers_task(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.jsonl", [_row(question="q", ground_truth="a"),
                                         _row(question="q2", ground_truth=f" {ANSWER_SPLIT} ")])
    assert str(_error(read_memento_tasks, path)) == f"{path}:2: Task.answers is empty"


def test_nan_reward_case_jsonl(tmp_path: Path) -> None:
    lines = [*_two_good_cases(), '{"state": "s", "action": "a", "reward": NaN}']
    path = _write(tmp_path / "c.jsonl", lines)
    assert str(_error(read_cases_jsonl, path)) == f"{path}:3: field 'reward' must be a number in [0, 1], got nan"


def test_infinite_reward_np_memory(tmp_path: Path) -> None:
    good = _row(question="q", plan=PLAN, reward=1)
    bad = json.dumps({"question": "q2", "plan": PLAN, "reward": float("inf")})  # writes Infinity
    path = _write(tmp_path / "np.jsonl", [good, bad])
    assert str(_error(read_memento_np_memory, path)) == (
        f"{path}:2: field 'reward' must be 0 or 1 in Memento's memory, got inf")


def test_nan_reward_np_memory(tmp_path: Path) -> None:
    path = _write(tmp_path / "np.jsonl", ['{"question": "q", "plan": ' + json.dumps(PLAN) + ', "reward": NaN}'])
    assert str(_error(read_memento_np_memory, path)) == (
        f"{path}:1: field 'reward' must be 0 or 1 in Memento's memory, got nan")


@pytest.mark.parametrize(("label", "shown"), [("Positive", "'Positive'"), ("yes", "'yes'")])
def test_bad_case_label(tmp_path: Path, label: str, shown: str) -> None:
    path = _write(tmp_path / "m.jsonl", [_row(case="q", plan=PLAN, case_label="positive"),
                                         _row(case="q2", plan=PLAN, case_label="negative"),
                                         _row(case="q3", plan=PLAN, case_label=label)])
    assert str(_error(read_memento_memory, path)) == (
        f"{path}:3: field 'case_label' must be 'positive' or 'negative', got {shown}")


def test_case_label_not_a_string(tmp_path: Path) -> None:
    path = _write(tmp_path / "m.jsonl", [_row(case="q", plan=PLAN, case_label=1)])
    assert str(_error(read_memento_memory, path)) == f"{path}:1: field 'case_label' must be a string, got int"


def test_plan_not_json(tmp_path: Path) -> None:
    path = _write(tmp_path / "m.jsonl", [_row(case="q", plan=PLAN, case_label="positive"),
                                         _row(case="q2", plan="step 1: search", case_label="positive")])
    error = _error(read_memento_memory, path)
    assert str(error).startswith(f"{path}:2: field 'plan':1: invalid JSON: ")
    assert error.line == 2


@pytest.mark.parametrize(("plan", "reason"), [
    ('{"plan": [' + "9" * 5000 + "]}", "field 'plan': invalid JSON: Exceeds the limit (4300 digits)"),
    ("[" * 100_000 + "]" * 100_000, "field 'plan': invalid JSON: nested deeper than 100 levels"),
    ("\x00", "field 'plan' holds a NUL character"),
])
def test_plan_json_python_cannot_parse_is_the_rows_error(tmp_path: Path, plan: str, reason: str) -> None:
    path = _write(tmp_path / "np.jsonl", [_row(question="q", plan=PLAN, reward=1), _row(question="q", plan=plan,
                                                                                       reward=1)])
    error = _error(read_memento_np_memory, path)
    assert str(error).startswith(f"{path}:2: {reason}"), str(error)
    assert "\n" not in str(error) and len(str(error)) < 300


@pytest.mark.parametrize("plan", ['{"steps": []}', "[1, 2]", '{"plan": "one step"}'])
def test_plan_json_of_wrong_shape(tmp_path: Path, plan: str) -> None:
    path = _write(tmp_path / "np.jsonl", [_row(question="q", plan=plan, reward=1)])
    assert str(_error(read_memento_np_memory, path)) == (
        f'{path}:1: field \'plan\' must encode an object {{"plan": [...]}}')


def test_plan_as_object_instead_of_string(tmp_path: Path) -> None:
    path = _write(tmp_path / "m.jsonl", [_row(case="q", plan={"plan": []}, case_label="positive")])
    assert str(_error(read_memento_memory, path)) == f"{path}:1: field 'plan' must be a string, got dict"


def test_unknown_field_case_jsonl(tmp_path: Path) -> None:
    path = _write(tmp_path / "c.jsonl", [*_two_good_cases(),
                                         _row(state="s", action="a", reward=1, rewrd=1, zz=0)])
    assert str(_error(read_cases_jsonl, path)) == f"{path}:3: unknown field(s) ['rewrd', 'zz'] for a Case JSONL row"


def test_file_not_found(tmp_path: Path) -> None:
    path = tmp_path / "missing.jsonl"
    for reader in (read_cases_jsonl, read_tasks_jsonl, read_memento_memory, read_memento_np_memory,
                   read_memento_training_pairs, read_memento_tasks):
        error = _error(reader, path)
        assert str(error) == f"{path}: file not found"
        assert (error.path, error.line) == (str(path), None)
    with pytest.raises(DataFormatError, match="file not found"):
        read_case_file(path, "memento-training")


def test_directory_instead_of_file(tmp_path: Path) -> None:
    assert str(_error(read_cases_jsonl, tmp_path)) == f"{tmp_path}: is a directory, expected a JSONL file"


def test_non_utf8_bytes_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"state": "s1", "action": "a", "reward": 1}\n'
                     b'{"state": "s2", "action": "a", "reward": 1}\n'
                     b'{"state": "caf\xe9", "action": "a", "reward": 1}\n')
    error = _error(read_cases_jsonl, path)
    assert str(error).startswith(f"{path}:3: ")


def test_empty_kind_in_case_jsonl_rejected(tmp_path: Path) -> None:
    path = _write(tmp_path / "c.jsonl", [_row(state="s", action="a", reward=1, kind="")])
    assert str(_error(read_cases_jsonl, path)) == f"{path}:1: Case.kind is empty"


def test_error_on_late_line_reads_nothing(tmp_path: Path) -> None:
    lines = [_row(state=f"s{i}", action="a", reward=1) for i in range(50)] + ['{"state": 1}']
    path = _write(tmp_path / "c.jsonl", lines)
    error = _error(read_cases_jsonl, path)
    assert error.line == 51


# ---------------------------------------------------------------- write_jsonl


def test_write_jsonl_round_trip(tmp_path: Path) -> None:
    cases = [
        Case(id="a", state="Où est la gare ?", action="plan ✓", reward=1.0, env="web", kind="tip", meta={"n": [1, 2]}),
        Case(id="b", state="s2", action="a2", reward=0.5),
        Case(state="s3", action="a3", reward=0.0),
    ]
    path = tmp_path / "sub" / "dir" / "cases.jsonl"
    assert write_jsonl(path, (c.to_json() for c in cases)) == 3
    assert read_cases_jsonl(path) == cases
    assert "Où est la gare ?" in path.read_text(encoding="utf-8")  # not ASCII-escaped
    assert sorted(p.name for p in path.parent.iterdir()) == ["cases.jsonl"]


def test_write_jsonl_replaces_and_counts(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    write_jsonl(path, [{"a": 1}, {"a": 2}])
    assert write_jsonl(path, [{"b": 3}]) == 1
    assert path.read_text(encoding="utf-8") == '{"b": 3}\n'
    assert write_jsonl(path, []) == 0
    assert path.read_text(encoding="utf-8") == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.jsonl"]


def test_write_jsonl_failure_keeps_old_file_and_no_temp(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    write_jsonl(path, [{"old": True}])

    def rows():
        yield {"new": 1}
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        write_jsonl(path, rows())
    assert path.read_text(encoding="utf-8") == '{"old": true}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.jsonl"]
