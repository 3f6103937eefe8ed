"""Scoring without generating: AnswerScore, the argument checks, render_answer, CallablePlanner.score.

The real planners are tested against a loopback server (tests/unit/test_openai_compat.py) and the
real Gemma (tests/integration/test_hf_scoring.py).
"""

from __future__ import annotations

import json
import math

import pytest

from memento.config import from_dict, to_dict
from memento.errors import ConfigError, DataFormatError
from memento.planners import (
    AnswerScore,
    CallablePlanner,
    Planner,
    PlannerError,
    PromptConfig,
    ScoringPlanner,
    render_answer,
    render_prompt,
)
from memento.planners.base import score_requests
from memento.types import Case, Task

ITALY = Task(id="italy", question="What is the capital of Italy?", answers=["Rome", "Roma"])
SUM = Task(id="sum", question="What is 7 + 6?", answers=["13"])
FRANCE = Case(state="What is the capital of France?", action="Paris", reward=1.0)
GERMANY = Case(state="What is the capital of Germany?", action="Berlin", reward=0.0)


# ---------------------------------------------------------------- AnswerScore


def test_answer_score_mean_and_json():
    score = AnswerScore(logprob=-3, n_tokens=2, prompt_tokens=20)
    assert score.logprob == -3.0 and isinstance(score.logprob, float)
    assert score.mean_logprob == -1.5
    assert score.to_json() == {"logprob": -3.0, "n_tokens": 2, "mean_logprob": -1.5, "prompt_tokens": 20,
                               "truncated_tokens": 0}
    assert json.loads(json.dumps(score.to_json()))["mean_logprob"] == -1.5


@pytest.mark.parametrize("kwargs, field", [
    ({"logprob": math.nan}, "logprob"),
    ({"logprob": -math.inf}, "logprob"),
    ({"logprob": True}, "logprob"),
    ({"n_tokens": 0}, "n_tokens"),
    ({"n_tokens": 1.0}, "n_tokens"),
    ({"prompt_tokens": -1}, "prompt_tokens"),
    ({"truncated_tokens": -2}, "truncated_tokens"),
])
def test_answer_score_rejects_bad_values(kwargs, field):
    options = {"logprob": -1.0, "n_tokens": 1}
    options.update(kwargs)
    with pytest.raises(DataFormatError, match=rf"^AnswerScore\.{field} must be"):
        AnswerScore(**options)


# ---------------------------------------------------------------- render_answer: the scored continuation


def test_few_shot_answer_follows_answer_colon_as_a_demonstration_does():
    config = PromptConfig(style="few_shot")
    assert render_answer(config, "Rome") == " Rome"
    assert render_answer(config, "  Rome,\n the  Eternal City ") == " Rome, the Eternal City"  # one line, as shown
    # A demonstration of the same question and answer is exactly the scored text plus the line break.
    demo = Case(state=ITALY.question, action="Rome", reward=1.0)
    bare = render_prompt(config, ITALY, [])
    assert render_prompt(config, ITALY, [demo]) == bare + render_answer(config, "Rome") + "\n" + bare
    # The answer is never cut, even when demonstrations are.
    short = PromptConfig(style="few_shot", max_case_chars=16)
    assert render_answer(short, "x" * 40) == " " + "x" * 40


def test_memento_plan_answer_follows_plan_colon_as_an_example_does():
    config = PromptConfig(style="memento_plan", instruction="Plan.")
    plan = '{"plan": [{"id": 1, "description": "Recall the capital."}, {"id": 2, "description": "Answer."}]}'
    assert render_answer(config, plan) == "\n1. Recall the capital.\n2. Answer."
    example = Case(state=ITALY.question, action=plan, reward=1.0)
    assert "Plan:" + render_answer(config, plan) + "\n" in render_prompt(config, SUM, [example])
    assert render_prompt(config, ITALY, []).endswith("Plan:")
    assert render_answer(config, "Rome") == "\nRome"


@pytest.mark.parametrize("answer", ["", "   ", "\n\t"])
def test_empty_answer_is_a_one_line_error(answer):
    with pytest.raises(DataFormatError, match="is empty: there is nothing to score"):
        render_answer(PromptConfig(), answer)


# ---------------------------------------------------------------- the argument checks every planner shares


def test_score_requests_flattens_task_by_task_and_defaults_to_the_first_answer():
    requests = score_requests([ITALY, SUM], [[[FRANCE], [], [FRANCE, GERMANY]], [[GERMANY]]], [None, "thirteen"])
    assert [(r.task_index, r.set_index, r.task.id, len(r.cases), r.answer) for r in requests] == [
        (0, 0, "italy", 1, "Rome"), (0, 1, "italy", 0, "Rome"), (0, 2, "italy", 2, "Rome"),
        (1, 0, "sum", 1, "thirteen")]
    assert [r.answer for r in score_requests([ITALY], [[[]]])] == ["Rome"]


@pytest.mark.parametrize("tasks, case_sets, answers, message", [
    ([ITALY], [[]], None, "task 'italy': no case sets to score (pass [[]] to score the prompt without cases)"),
    ([ITALY], [[FRANCE]], None, "task 'italy': case set 0 is a Case, expected a list of Case"),
    ([ITALY], [FRANCE], None, "task 'italy': case_sets must be a list of case lists"),
    ([ITALY], [[["Paris"]]], None, "task 'italy': case set 0 holds a str, expected Case"),
    ([ITALY], [[[]]], [" "], "task 'italy': the answer ' ' is empty"),
    ([ITALY], [[[]]], [""], "task 'italy': the answer '' is empty"),
    ([ITALY, SUM], [[[]]], None, "score_many got 2 tasks but 1 lists of case sets"),
    ([ITALY], [[[]]], ["a", "b"], "score_many got 1 tasks but 2 answers"),
    (["italy"], [[[]]], None, "task 0 is str, expected memento.Task"),
])
def test_score_requests_errors_are_one_line(tasks, case_sets, answers, message):
    with pytest.raises(DataFormatError) as info:
        score_requests(tasks, case_sets, answers)
    assert message in str(info.value) and "\n" not in str(info.value)


# ---------------------------------------------------------------- CallablePlanner


def test_callable_planner_without_score_fn_cannot_score():
    planner = CallablePlanner(lambda task, cases: "Rome", name="echo")
    assert isinstance(planner, Planner) and isinstance(planner, ScoringPlanner)
    with pytest.raises(PlannerError) as info:
        planner.score(ITALY, [[FRANCE]])
    assert str(info.value) == ("planner 'echo' cannot score answers: build it as CallablePlanner(fn, score_fn=...) "
                               "to give it a scoring function")


def test_callable_planner_with_score_fn():
    seen = []

    def score_fn(task, cases, answer):
        seen.append((task.id, len(cases), answer))
        if answer == "long":
            return AnswerScore(logprob=-6.0, n_tokens=3)
        return -0.5 * (1 + len(cases))

    planner = CallablePlanner(lambda task, cases: "Rome", score_fn=score_fn)
    scores = planner.score(ITALY, [[], [FRANCE], [FRANCE, GERMANY]])
    assert [s.logprob for s in scores] == [-0.5, -1.0, -1.5] and all(s.n_tokens == 1 for s in scores)
    assert seen == [("italy", 0, "Rome"), ("italy", 1, "Rome"), ("italy", 2, "Rome")]
    assert planner.score(ITALY, [[]], answer="long")[0].mean_logprob == -2.0
    many = planner.score_many([ITALY, SUM], [[[]], [[FRANCE], []]], answers=None)
    assert [[s.logprob for s in task_scores] for task_scores in many] == [[-0.5], [-1.0, -0.5]]


@pytest.mark.parametrize("value, message", [
    (math.nan, "task 'italy', case set 0: the log-likelihood of the answer is nan (not finite)"),
    ("bad", "score_fn returned str, expected float or AnswerScore"),
])
def test_callable_planner_bad_scores_are_one_line_errors(value, message):
    planner = CallablePlanner(lambda task, cases: "Rome", score_fn=lambda task, cases, answer: value)
    with pytest.raises(PlannerError, match="^planner 'callable': ") as info:
        planner.score(ITALY, [[]])
    assert message in str(info.value)


# ---------------------------------------------------------------- HFPlannerConfig.score_max_length (no model needed)


def test_hf_planner_config_score_max_length():
    from memento.planners.hf import HFPlannerConfig

    config = HFPlannerConfig(score_max_length=512)
    assert from_dict(HFPlannerConfig, json.loads(json.dumps(to_dict(config)))) == config
    assert HFPlannerConfig().score_max_length is None
    old = to_dict(HFPlannerConfig())
    del old["score_max_length"]  # a config saved before the field existed
    assert from_dict(HFPlannerConfig, old) == HFPlannerConfig()
    for bad in (1, 0, "512", True):
        with pytest.raises(ConfigError, match="HFPlannerConfig.score_max_length="):
            HFPlannerConfig(score_max_length=bad)
