"""Case and Task: validation, content hash, JSON rows."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math

import numpy as np
import pytest

from memento.errors import DataFormatError
from memento.types import Case, Task, content_hash

# ---------------------------------------------------------------- Case


def test_case_defaults_and_reward_is_float() -> None:
    case = Case(state="s", action="a", reward=1)
    assert case.reward == 1.0
    assert type(case.reward) is float
    assert (case.id, case.env, case.kind, case.meta, case.created) == (None, None, "case", {}, None)


def test_case_is_frozen() -> None:
    case = Case(state="s", action="a", reward=0.5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        case.reward = 1.0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"state": ""}, "Case.state is empty"),
        ({"state": "  \n\t"}, "Case.state is empty"),
        ({"action": ""}, "Case.action is empty"),
        ({"state": 3}, "Case.state must be a string, got int"),
        ({"state": None}, "Case.state must be a string, got NoneType"),
        ({"action": b"bytes"}, "Case.action must be a string, got bytes"),
        ({"action": ["a"]}, "Case.action must be a string, got list"),
        ({"kind": ""}, "Case.kind is empty"),
        ({"kind": 1}, "Case.kind must be a string, got int"),
        ({"id": ""}, "Case.id is empty"),
        ({"id": 7}, "Case.id must be a string, got int"),
        ({"env": " "}, "Case.env is empty"),
        ({"env": 1.5}, "Case.env must be a string, got float"),
        ({"meta": []}, "Case.meta must be an object, got list"),
        ({"meta": "x"}, "Case.meta must be an object, got str"),
    ],
)
def test_case_rejects_bad_fields(kwargs, message: str) -> None:
    fields = {"state": "s", "action": "a", "reward": 1.0, **kwargs}
    with pytest.raises(DataFormatError) as info:
        Case(**fields)
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("reward", "message"),
    [
        (math.nan, "Case.reward must be a number in [0, 1], got nan"),
        (math.inf, "Case.reward must be a number in [0, 1], got inf"),
        (-math.inf, "Case.reward must be a number in [0, 1], got -inf"),
        (True, "Case.reward must be a number in [0, 1], got True"),
        (False, "Case.reward must be a number in [0, 1], got False"),
        ("1.0", "Case.reward must be a number in [0, 1], got '1.0'"),
        (None, "Case.reward must be a number in [0, 1], got None"),
        (-2.5, "Case.reward must be a number in [0, 1], got -2.5"),
        (-1, "Case.reward must be a number in [0, 1], got -1"),
        (1.0000001, "Case.reward must be a number in [0, 1], got 1.0000001"),
        (1e308, "Case.reward must be a number in [0, 1], got 1e+308"),
        (10 ** 400, "Case.reward must be finite, got an integer of 401 digits (a reward is a number in [0, 1])"),
        pytest.param(10 ** 5000, "Case.reward must be finite, got an integer of about 5001 digits "
                     "(a reward is a number in [0, 1])", id="int-5001-digits"),
    ],
)
def test_case_rejects_bad_reward(reward, message: str) -> None:
    with pytest.raises(DataFormatError) as info:
        Case(state="s", action="a", reward=reward)
    assert str(info.value) == message


def test_case_error_has_no_location() -> None:
    with pytest.raises(DataFormatError) as info:
        Case(state="", action="a", reward=0.0)
    assert info.value.path is None and info.value.line is None
    assert info.value.reason == "Case.state is empty"


def test_case_accepts_rewards_in_the_unit_interval() -> None:
    assert Case(state="s", action="a", reward=0.25).reward == 0.25
    assert Case(state="s", action="a", reward=0).reward == 0.0
    assert Case(state="s", action="a", reward=1).reward == 1.0
    assert type(Case(state="s", action="a", reward=np.float32(0.5)).reward) is float


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"state": "\x00"}, "Case.state holds a NUL character ('\\x00' at index 0), which is not allowed in a text"),
    ({"action": "a\ud800"},
     "Case.action holds a lone surrogate ('\\ud800' at index 1), which is not allowed in a text"),
    ({"id": "a\tb"}, "Case.id holds a control character ('\\t' at index 1), which is not allowed in an id"),
    ({"env": "x" * 257}, "Case.env is 257 characters long; an id holds at most 256"),
    ({"kind": "\x7f"}, "Case.kind holds a control character ('\\x7f' at index 0), which is not allowed in an id"),
    ({"meta": {"x": math.nan}}, "Case.meta: nan is not a JSON number"),
    ({"meta": {1: "x"}}, "Case.meta: an object key is 1, not a string"),
    ({"meta": {"x": {1, 2}}}, "Case.meta: set is not a JSON value"),
    ({"created": math.inf}, "Case.created must be a finite number (Unix seconds), got inf"),
])
def test_case_rejects_text_nobody_can_store(kwargs, message: str) -> None:
    with pytest.raises(DataFormatError) as info:
        Case(**{"state": "s", "action": "a", "reward": 1.0, **kwargs})
    assert str(info.value) == message


def test_case_text_limit() -> None:
    from memento.types import MAX_TEXT_CHARS

    assert Case(state="x" * MAX_TEXT_CHARS, action="a", reward=1).state == "x" * MAX_TEXT_CHARS
    with pytest.raises(DataFormatError, match=f"Case.state is {MAX_TEXT_CHARS + 1} characters long"):
        Case(state="x" * (MAX_TEXT_CHARS + 1), action="a", reward=1)
    assert Case(id="i" * 256, state="s\tt\n", action="a\u2028", reward=1).id == "i" * 256  # tabs fine in a text


# ---------------------------------------------------------------- content hash


def test_content_hash_value_is_sha256_of_json_list() -> None:
    payload = json.dumps(["q", "plan", None, "case"], ensure_ascii=False, separators=(",", ":"))
    expected = hashlib.sha256(payload.encode("utf-8")).hexdigest()
    assert content_hash("q", "plan", None, "case") == expected
    assert Case(state="q", action="plan", reward=0.0).content_hash == expected
    assert len(expected) == 64


def test_content_hash_ignores_reward_id_meta_created() -> None:
    a = Case(state="q", action="p", reward=0.0)
    b = Case(state="q", action="p", reward=1.0, id="x", meta={"k": 1}, created=12.0)
    assert a.content_hash == b.content_hash


@pytest.mark.parametrize(
    "change",
    [{"state": "q2"}, {"action": "p2"}, {"env": "web"}, {"env": "None"}, {"kind": "tip"}],
)
def test_content_hash_depends_on_content(change) -> None:
    base = {"state": "q", "action": "p", "reward": 1.0}
    assert Case(**base).content_hash != Case(**{**base, **change}).content_hash


def test_content_hash_has_no_field_boundary_ambiguity() -> None:
    # naive concatenation would make these equal
    assert content_hash("ab", "c", None, "case") != content_hash("a", "bc", None, "case")


def test_content_hash_unicode() -> None:
    assert content_hash("café", "é", "env", "case") != content_hash("cafe", "é", "env", "case")


# ---------------------------------------------------------------- Case.to_json


def test_case_to_json_minimal() -> None:
    assert Case(state="s", action="a", reward=1).to_json() == {
        "id": None, "state": "s", "action": "a", "reward": 1.0, "kind": "case"}


def test_case_to_json_full() -> None:
    case = Case(id="c1", state="s", action="a", reward=0.25, env="web", kind="tip", meta={"x": [1]}, created=3.0)
    row = case.to_json()
    assert row == {"id": "c1", "state": "s", "action": "a", "reward": 0.25, "kind": "tip", "env": "web",
                   "meta": {"x": [1]}}
    assert "created" not in row
    assert json.loads(json.dumps(row)) == row


# ---------------------------------------------------------------- Task


def test_task_list_answers_become_tuple() -> None:
    task = Task(id="t1", question="q?", answers=["a", "b"])
    assert task.answers == ("a", "b")
    assert isinstance(task.answers, tuple)
    assert (task.family, task.env, task.meta) == (None, None, {})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"answers": "Paris"}, "Task.answers must be a list of strings, got 'Paris'"),
        ({"answers": None}, "Task.answers must be a list of strings, got None"),
        ({"answers": {"a": 1}}, "Task.answers must be a list of strings, got {'a': 1}"),
        ({"answers": []}, "Task.answers is empty"),
        ({"answers": ()}, "Task.answers is empty"),
        ({"answers": ["ok", ""]}, "Task.answers[] is empty"),
        ({"answers": ["ok", 3]}, "Task.answers[] must be a string, got int"),
        ({"id": ""}, "Task.id is empty"),
        ({"id": 5}, "Task.id must be a string, got int"),
        ({"question": " "}, "Task.question is empty"),
        ({"family": ""}, "Task.family is empty"),
        ({"env": 2}, "Task.env must be a string, got int"),
        ({"meta": None}, "Task.meta must be an object, got NoneType"),
    ],
)
def test_task_rejects_bad_fields(kwargs, message: str) -> None:
    fields = {"id": "t", "question": "q", "answers": ("a",), **kwargs}
    with pytest.raises(DataFormatError) as info:
        Task(**fields)
    assert str(info.value) == message


def test_task_to_json() -> None:
    assert Task(id="t", question="q", answers=("a",)).to_json() == {"id": "t", "question": "q", "answers": ["a"]}
    full = Task(id="t", question="q", answers=["a", "b"], family="nq", env="web", meta={"k": "v"})
    assert full.to_json() == {"id": "t", "question": "q", "answers": ["a", "b"], "family": "nq", "env": "web",
                              "meta": {"k": "v"}}
