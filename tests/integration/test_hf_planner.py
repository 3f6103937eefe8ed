"""The real default planner: Gemma 3 270M base, converted from its GGUF package into the test cache dir.

The conversion runs once per test session (conftest gives every session its own
``MEMENTO_CACHE_DIR``): about a minute on two CPU cores; every later load takes a few seconds.
"""

from __future__ import annotations

import logging
import time

import pytest

from memento.planners import HFPlanner, PlanOutput, PromptConfig, default_planner_path
from memento.types import Case, Task

pytestmark = pytest.mark.slow

CAPITALS = [
    Case(state="What is the capital of France?", action="Paris", reward=1.0),
    Case(state="What is the capital of Germany?", action="Berlin", reward=1.0),
    Case(state="What is the capital of Spain?", action="Madrid", reward=1.0),
]
ITALY = Task(id="italy", question="What is the capital of Italy?", answers=["Rome"])


@pytest.fixture(scope="session")
def gemma() -> tuple[HFPlanner, float]:
    """The default planner, loaded once per session, and how long the first ``default()`` took."""
    start = time.perf_counter()
    planner = HFPlanner.default(device="cpu")
    return planner, time.perf_counter() - start


def test_default_is_converted_once_into_the_cache_dir(gemma):
    planner, _ = gemma
    path = default_planner_path()
    assert planner.model_path == path
    for name in ("config.json", "model.safetensors", "tokenizer.json", "memento-model.json"):
        assert (path / name).is_file(), name
    assert "quantization_config" not in (path / "config.json").read_text()
    assert [p.name for p in path.parent.iterdir()] == ["gemma3-270m"]  # no temporary directory left behind
    assert planner.config.model is None  # a saved config names the default, not this machine's path


def test_capital_of_italy(gemma):
    planner, _ = gemma
    out = planner.plan(ITALY, CAPITALS)
    assert isinstance(out, PlanOutput)
    assert "Rome" in out.text and "\n" not in out.text
    assert out.prompt_tokens > 10 and out.output_tokens > 0 and out.latency_s > 0
    again = planner.plan(ITALY, CAPITALS)  # greedy decoding: deterministic
    assert (again.text, again.prompt_tokens, again.output_tokens) == (out.text, out.prompt_tokens, out.output_tokens)


def test_second_load_comes_from_the_cache_dir(gemma, caplog):
    first, first_seconds = gemma
    caplog.set_level(logging.INFO, logger="memento.planners.hf")
    start = time.perf_counter()
    second = HFPlanner.default(device="cpu")
    seconds = time.perf_counter() - start
    messages = [record.getMessage() for record in caplog.records]
    assert any("loading the converted Gemma 3 270M" in m for m in messages), messages
    assert not any("converting" in m for m in messages), messages
    assert second.model_path == first.model_path
    if first_seconds > 20:  # the session fixture converted the GGUF file; loading the result is much faster
        assert seconds < first_seconds / 2, (seconds, first_seconds)
    assert second.plan(ITALY, CAPITALS).text == first.plan(ITALY, CAPITALS).text


def test_plan_many_equals_plan_one_by_one(gemma):
    planner, _ = gemma
    planner = planner.replace(batch_size=4)  # two batches, the second one partial
    arithmetic = [Case(state="What is 2 + 2?", action="4", reward=1.0),
                  Case(state="What is 3 + 5?", action="8", reward=1.0)]
    tasks = [
        ITALY,
        Task(id="japan", question="What is the capital of Japan?", answers=["Tokyo"]),
        Task(id="sum", question="What is 7 + 6?", answers=["13"]),
        Task(id="hamlet", question="Who wrote Hamlet?", answers=["Shakespeare"]),
        Task(id="gold", question="What is the chemical symbol for gold?", answers=["Au"]),
        Task(id="planet", question="What is the largest planet in the solar system?", answers=["Jupiter"]),
    ]
    cases = [CAPITALS, CAPITALS[:1], arithmetic, [], [Case(state="What is the chemical symbol for iron?",
                                                           action="Fe", reward=1.0)], CAPITALS + arithmetic]
    one_by_one = [planner.plan(task, task_cases) for task, task_cases in zip(tasks, cases)]
    batched = planner.plan_many(tasks, cases)
    assert [(o.text, o.prompt_tokens, o.output_tokens) for o in batched] == \
        [(o.text, o.prompt_tokens, o.output_tokens) for o in one_by_one]
    assert len({o.prompt_tokens for o in batched}) > 1  # the batch really was padded
    assert all(o.output_tokens > 0 and o.latency_s > 0 for o in batched)


def test_max_new_tokens_without_stop_and_with_custom_stop(gemma):
    planner, _ = gemma
    free = planner.replace(stop=(), max_new_tokens=6)
    out = free.plan(ITALY, CAPITALS)
    assert out.output_tokens == 6  # no stop string: runs to max_new_tokens (the base model does not stop)
    assert "Rome" in out.text and "\n" in out.text  # it goes on with the next "Question:" line
    stopped = planner.replace(stop=("Question",), max_new_tokens=12).plan(ITALY, CAPITALS)
    assert stopped.text == out.text.split("Question")[0].strip()
    assert stopped.output_tokens <= 12


def test_memento_plan_style_generates(gemma):
    planner, _ = gemma
    plan_case = Case(state="What is the capital of France?",
                     action='{"plan": [{"id": 1, "description": "Look up the capital of France."}]}', reward=1.0)
    planner = planner.replace(prompt=PromptConfig(style="memento_plan"), max_new_tokens=24)
    out = planner.plan(ITALY, [plan_case])
    assert out.output_tokens > 0 and out.prompt_tokens > 40
