"""Prompt templates: exact rendered strings, chat messages, stop strings, validation, JSON round trip."""

from __future__ import annotations

import json

import pytest

from memento.config import from_dict, to_dict
from memento.errors import ConfigError
from memento.planners.prompts import DEFAULT_INSTRUCTIONS, PromptConfig, format_plan, render_messages, render_prompt
from memento.types import Case, Task

ITALY = Task(id="t1", question="What is the capital of Italy?", answers=["Rome"])
FRANCE = Case(state="What is the capital of France?", action="Paris", reward=1.0)
GERMANY = Case(state="What is the capital of Germany?", action="Munich", reward=0.0)
PLAN = json.dumps({"plan": [{"id": 1, "description": "Find the country."},
                            {"id": 2, "description": "Name its capital."}]})


def test_few_shot_exact():
    assert render_prompt(PromptConfig(style="few_shot"), ITALY, [FRANCE, GERMANY]) == (
        "Question: What is the capital of France?\n"
        "Answer: Paris\n"
        "Question: What is the capital of Germany?\n"
        "Answer: Munich\n"
        "Question: What is the capital of Italy?\n"
        "Answer:"
    )


def test_few_shot_without_cases_is_just_the_question():
    assert render_prompt(PromptConfig(), ITALY, []) == "Question: What is the capital of Italy?\nAnswer:"


def test_few_shot_collapses_whitespace_so_each_demonstration_is_two_lines():
    case = Case(state="  What is\n the  capital\tof Spain? ", action="Madrid\n(city)", reward=1.0)
    task = Task(id="t", question="Capital\nof Peru?", answers=["Lima"])
    assert render_prompt(PromptConfig(), task, [case]) == (
        "Question: What is the capital of Spain?\nAnswer: Madrid (city)\nQuestion: Capital of Peru?\nAnswer:"
    )


def test_few_shot_instruction_and_truncation():
    config = PromptConfig(style="few_shot", instruction="Answer with one word.", max_case_chars=20)
    long_case = Case(state="Q" * 30, action="A" * 25, reward=1.0)
    long_task = Task(id="t", question="X" * 40, answers=["x"])
    assert render_prompt(config, long_task, [long_case]) == (
        "Answer with one word.\n\n"
        f"Question: {'Q' * 17}...\n"
        f"Answer: {'A' * 17}...\n"
        f"Question: {'X' * 40}\n"  # the task itself is never cut
        "Answer:"
    )


def test_memento_plan_exact():
    negative = Case(state="What is the capital of Columbia County?", action="Bloomsburg, I think", reward=0.0)
    config = PromptConfig(style="memento_plan", instruction="Plan.")
    assert render_prompt(config, ITALY, [negative, Case(state="What is the capital of France?", action=PLAN,
                                                         reward=1.0)]) == (
        "Plan.\n"
        "\n"
        "Task: What is the capital of Italy?\n"
        "\n"
        "Positive examples (reward >= 0.5):\n"
        "Example 1:\n"
        "Question: What is the capital of France?\n"
        "Plan:\n"
        "1. Find the country.\n"
        "2. Name its capital.\n"
        "\n"
        "Negative examples (reward < 0.5):\n"
        "Example 1:\n"
        "Question: What is the capital of Columbia County?\n"
        "Plan:\n"
        "Bloomsburg, I think\n"
        "\n"
        "Based on the examples above, write a plan for the task. Follow the positive examples and avoid the "
        "patterns of the negative ones.\n"
        "\n"
        "Plan:"
    )


def test_memento_plan_default_instruction_asks_for_json_and_no_cases():
    text = render_prompt(PromptConfig(style="memento_plan"), ITALY, [])
    assert text == (DEFAULT_INSTRUCTIONS["memento_plan"] + "\n\nTask: What is the capital of Italy?\n\n"
                    "Write a plan for the task.\n\nPlan:")
    assert '{"plan": [{"id": 1, "description": "..."}]}' in text
    assert "Positive" not in text and "Negative" not in text


def test_memento_plan_threshold_splits_by_reward():
    config = PromptConfig(style="memento_plan", positive_min_reward=0.9)
    partial = Case(state="s", action="a", reward=0.6)
    text = render_prompt(config, ITALY, [partial])
    assert "Negative examples (reward < 0.9):" in text and "Positive" not in text


def test_format_plan():
    assert format_plan(PLAN) == "1. Find the country.\n2. Name its capital."
    assert format_plan('{"plan": [{"description": "no id"}]}') == "1. no id"
    for other in ("Paris", "[1, 2]", '{"plan": []}', '{"plan": [{"id": 1}]}', '{"steps": 1}'):
        assert format_plan(other) == other


def test_render_messages():
    config = PromptConfig(style="few_shot", instruction="Be brief.")
    assert render_messages(config, ITALY, [FRANCE]) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Question: What is the capital of France?\nAnswer: Paris\n"
                                    "Question: What is the capital of Italy?\nAnswer:"},
    ]
    assert render_messages(PromptConfig(), ITALY, []) == [
        {"role": "user", "content": "Question: What is the capital of Italy?\nAnswer:"}]
    plan_messages = render_messages(PromptConfig(style="memento_plan"), ITALY, [])
    assert plan_messages[0] == {"role": "system", "content": DEFAULT_INSTRUCTIONS["memento_plan"]}


def test_stop_strings_per_style():
    assert PromptConfig(style="few_shot").stop == ("\n",)
    assert PromptConfig(style="memento_plan").stop == ("\nTask:", "\nQuestion:", "\nExample ",
                                                       "\nBased on the examples")
    assert all(len(PromptConfig(style=style).stop) <= 4 for style in ("few_shot", "memento_plan"))  # OpenAI's cap


def test_empty_instruction_means_none():
    assert PromptConfig(style="memento_plan", instruction="").resolved_instruction == ""
    assert render_prompt(PromptConfig(style="memento_plan", instruction=""), ITALY, []).startswith("Task: ")


@pytest.mark.parametrize("kwargs, field", [
    ({"style": "chat"}, "style"),
    ({"instruction": 3}, "instruction"),
    ({"max_case_chars": 5}, "max_case_chars"),
    ({"max_case_chars": True}, "max_case_chars"),
    ({"positive_min_reward": float("nan")}, "positive_min_reward"),
    ({"positive_min_reward": "0.5"}, "positive_min_reward"),
])
def test_invalid_config(kwargs, field):
    with pytest.raises(ConfigError, match=f"PromptConfig.{field}="):
        PromptConfig(**kwargs)


def test_json_round_trip():
    config = PromptConfig(style="memento_plan", instruction="Plan it.", max_case_chars=300, positive_min_reward=1)
    data = json.loads(json.dumps(to_dict(config)))
    assert data == {"style": "memento_plan", "instruction": "Plan it.", "max_case_chars": 300,
                    "positive_min_reward": 1.0}
    assert from_dict(PromptConfig, data) == config
    assert from_dict(PromptConfig, to_dict(PromptConfig())) == PromptConfig()


# ---------------------------------------------------------------- the transformers planner's config (no model needed)


def test_hf_planner_config_round_trip():
    from memento.planners.hf import HFPlannerConfig

    config = HFPlannerConfig(model="/models/x", dtype="bfloat16", stop=["\n", "Question:"],
                             prompt=PromptConfig(style="memento_plan"))
    assert config.stop == ("\n", "Question:") and config.stop_strings == ("\n", "Question:")
    data = json.loads(json.dumps(to_dict(config)))
    assert from_dict(HFPlannerConfig, data) == config
    default = HFPlannerConfig()
    assert default.model is None and default.stop_strings == ("\n",)  # the few_shot style's stop
    assert from_dict(HFPlannerConfig, json.loads(json.dumps(to_dict(default)))) == default


@pytest.mark.parametrize("kwargs, field", [
    ({"model": ""}, "model"),
    ({"dtype": "float64"}, "dtype"),
    ({"max_new_tokens": 0}, "max_new_tokens"),
    ({"batch_size": 0}, "batch_size"),
    ({"stop": "\n"}, "stop"),
    ({"stop": ["\n", ""]}, "stop"),
    ({"device": ""}, "device"),
])
def test_hf_planner_config_invalid(kwargs, field):
    from memento.planners.hf import HFPlannerConfig

    with pytest.raises(ConfigError, match=f"HFPlannerConfig.{field}="):
        HFPlannerConfig(**kwargs)


def test_hf_planner_missing_model_is_a_one_line_error(tmp_path):
    from memento.planners import HFPlanner, PlannerError

    missing = tmp_path / "no-such-model"
    with pytest.raises(PlannerError) as info:
        HFPlanner(missing)
    assert str(missing) in str(info.value) and "\n" not in str(info.value)


def test_hf_planner_unloadable_directory_is_a_one_line_error(tmp_path):
    from memento.planners import HFPlanner, PlannerError

    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(PlannerError, match="cannot load") as info:
        HFPlanner(tmp_path, device="cpu")
    assert "\n" not in str(info.value)


def test_default_planner_path_follows_the_cache_dir(tmp_path, monkeypatch):
    from memento.planners import default_planner_path

    assert default_planner_path(tmp_path) == tmp_path / "models" / "gemma3-270m"
    monkeypatch.setenv("MEMENTO_CACHE_DIR", str(tmp_path / "env"))
    assert default_planner_path() == tmp_path / "env" / "models" / "gemma3-270m"
