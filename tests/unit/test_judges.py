"""Judges: normalisation, each judge on known answers, the LLM judge through a CallablePlanner, the factory."""

from __future__ import annotations

import math

import numpy as np
import pytest

from memento.errors import ConfigError, DataFormatError
from memento.judges import (
    DEFAULT_LLM_JUDGE_PROMPT,
    CallableJudge,
    ContainsJudge,
    ExactMatchJudge,
    Judge,
    JudgeResult,
    LLMJudge,
    NumericJudge,
    TokenF1Judge,
    first_line,
    judge_many,
    make_judge,
    normalize_answer,
    parse_number,
)
from memento.planners.base import CallablePlanner, PlanOutput
from memento.types import Task


def task(*answers: str, question: str = "What is the capital of France?") -> Task:
    return Task(id="t1", question=question, answers=answers)


# ------------------------------------------------------------------ JudgeResult, normalisation


def test_judge_result_is_frozen_and_validated() -> None:
    result = JudgeResult(1, "ok")
    assert result.reward == 1.0 and isinstance(result.reward, float)
    with pytest.raises(AttributeError):
        result.reward = 0.5  # type: ignore[misc]
    for bad in (-0.1, 1.5, math.nan, math.inf, True, "1"):
        with pytest.raises(DataFormatError):
            JudgeResult(bad, "x")  # type: ignore[arg-type]
    with pytest.raises(DataFormatError):
        JudgeResult(0.5, None)  # type: ignore[arg-type]


@pytest.mark.parametrize(("text", "expected"), [
    ("Paris", "paris"),
    ("  The   Paris. ", "paris"),
    ("an apple a day", "apple day"),
    ("Theatre", "theatre"),                  # articles only as whole words
    ("U.S.A.", "usa"),
    ("forty-seven", "forty seven"),          # dashes split words
    ("forty–seven", "forty seven"),          # en dash too
    ("1,347", "1347"),
    ("+51", "51"),
    ("Bogotá", "bogota"),                    # accents folded
    ("Côte d'Ivoire", "cote divoire"),
    ("Pa’anga", "paanga"),                   # Unicode punctuation removed
    ('{"answer": "Lima"}', "answer lima"),
    ("", ""),
])
def test_normalize_answer(text: str, expected: str) -> None:
    assert normalize_answer(text) == expected


def test_first_line_skips_blank_lines() -> None:
    assert first_line("\n  \n Lima \nQuestion: next") == "Lima"
    assert first_line("") == "" and first_line("\n\n") == ""


# ------------------------------------------------------------------ exact match


@pytest.mark.parametrize("output", ["Paris", "paris", "Paris.", " the Paris ", "PARIS!", "Paris\nQuestion: What is",
                                    "\n\nParis", "Paris\n\nThe capital of Italy is Rome."])
def test_exact_match_accepts(output: str) -> None:
    result = ExactMatchJudge()(task("Paris"), output)
    assert result.reward == 1.0
    assert result.reason == "exact match with 'Paris'"


@pytest.mark.parametrize("output", ["The capital of France is Paris.", '{"answer": "Paris"}', "Paris, France",
                                    "Answer: Paris", "Lyon", "", "Let me think.\nParis"])
def test_exact_match_rejects(output: str) -> None:
    result = ExactMatchJudge()(task("Paris"), output)
    assert result.reward == 0.0
    assert result.reason.startswith("no answer matched; expected one of ['Paris']")


def test_exact_match_any_answer_and_aliases() -> None:
    t = task("United States", "USA", "United States of America")
    assert ExactMatchJudge()(t, "U.S.A.").reward == 1.0
    assert ExactMatchJudge()(t, "the United States").reason == "exact match with 'United States'"
    assert ExactMatchJudge()(task("forty-seven"), "Forty Seven").reward == 1.0


def test_exact_match_whole_output_when_first_line_off() -> None:
    judge = ExactMatchJudge(first_line=False)
    assert judge(task("Paris"), "Paris\nRome").reward == 0.0
    assert judge(task("Paris"), "\nParis\n").reward == 1.0


def test_exact_match_empty_answer_never_matches_empty_output() -> None:
    assert ExactMatchJudge()(task("The"), "").reward == 0.0


def test_reasons_are_short() -> None:
    t = task(*[f"answer number {i}" for i in range(9)])
    reason = ExactMatchJudge()(t, "x" * 500).reason
    assert "(+4 more)" in reason and len(reason) < 300


def test_judges_reject_non_string_output() -> None:
    for judge in (ExactMatchJudge(), TokenF1Judge(), ContainsJudge(), NumericJudge()):
        with pytest.raises(DataFormatError):
            judge(task("1"), None)  # type: ignore[arg-type]


# ------------------------------------------------------------------ token F1, contains


def test_token_f1_known_values() -> None:
    judge = TokenF1Judge()
    assert judge(task("Paris"), "Paris").reward == 1.0
    # "capital of france is paris" (5 tokens) vs "paris": P = 1/5, R = 1, F1 = 2/6
    assert judge(task("Paris"), "The capital of France is Paris.").reward == pytest.approx(1 / 3)
    # best over answers: "new york city" vs "new york": P = 2/2, R = 2/3 -> 0.8
    result = judge(task("Big Apple", "New York City"), "New York")
    assert result.reward == pytest.approx(0.8)
    assert result.reason == "token F1 0.80 with 'New York City'"
    zero = judge(task("Paris"), "Rome")
    assert zero.reward == 0.0 and zero.reason.startswith("no token overlap")
    assert judge(task("Paris"), "").reward == 0.0


def test_token_f1_counts_repeated_tokens_once_each() -> None:
    # prediction "paris paris" vs "paris": common = 1, P = 1/2, R = 1 -> 2/3
    assert TokenF1Judge()(task("Paris"), "Paris Paris").reward == pytest.approx(2 / 3)


def test_contains_judge_word_boundaries() -> None:
    judge = ContainsJudge()
    assert judge(task("Lima"), "The capital of Peru is Lima.").reward == 1.0
    assert judge(task("Lima"), '{"answer": "Lima"}').reason == "output contains 'Lima'"
    assert judge(task("PE"), "Peru").reward == 0.0            # not a substring match
    assert judge(task("New York"), "I love new-york!").reward == 1.0
    assert judge(task("Lima"), "Quito\nLima").reward == 0.0   # first line only by default
    assert ContainsJudge(first_line=False)(task("Lima"), "Quito\nLima").reward == 1.0


# ------------------------------------------------------------------ numbers


@pytest.mark.parametrize(("text", "value"), [
    ("347", 347.0), ("1,347", 1347.0), ("about 1,234,567 people", 1234567.0), ("-3.5 degrees", -3.5),
    ("+51", 51.0), ("2e3", 2000.0), (".5", 0.5), ("the 3rd of May", 3.0), ("no digits", None),
    ("1,34", 1.0),  # not a thousands group: the first number is 1
])
def test_parse_number(text: str, value: float | None) -> None:
    assert parse_number(text) == value


@pytest.mark.parametrize(("text", "value"), [
    ("twelve", 12.0), ("three hundred and forty-seven", 347.0), ("Forty-Two apples", 42.0),
    ("one thousand, three hundred and forty-seven", 1347.0), ("two million five thousand", 2005000.0),
    ("a hundred", 100.0), ("zero", 0.0), ("minus seven", -7.0), ("no number here", None),
    ("it is 12 not twelve", 12.0),  # digits win
])
def test_parse_number_words(text: str, value: float | None) -> None:
    assert parse_number(text, words=True) == value


def test_numeric_judge() -> None:
    t = task("1,347", question="How many?")
    assert NumericJudge()(t, "1347").reward == 1.0
    assert NumericJudge()(t, "The answer is 1,347.0 exactly").reason == "number 1347 matches '1,347'"
    assert NumericJudge()(t, "1348").reward == 0.0
    assert NumericJudge(abs_tol=1)(t, "1348").reward == 1.0
    assert NumericJudge(rel_tol=0.01)(t, "1360").reward == 1.0
    assert NumericJudge()(t, "one thousand three hundred and forty-seven").reward == 0.0
    assert NumericJudge(words=True)(t, "one thousand three hundred and forty-seven").reward == 1.0
    missing = NumericJudge()(t, "I don't know")
    assert missing.reward == 0.0 and missing.reason.startswith("no number in output")


def test_numeric_judge_skips_non_numeric_answers_and_rejects_tasks_without_any() -> None:
    assert NumericJudge()(task("about", "12"), "12").reward == 1.0
    with pytest.raises(DataFormatError, match="no numeric answer"):
        NumericJudge()(task("Paris"), "12")


@pytest.mark.parametrize("kwargs", [{"rel_tol": -1}, {"abs_tol": math.nan}, {"rel_tol": True}, {"words": 1}])
def test_numeric_judge_validates(kwargs: dict) -> None:
    with pytest.raises(ConfigError):
        NumericJudge(**kwargs)


# ------------------------------------------------------------------ LLM judge


def test_llm_judge_with_a_callable_planner() -> None:
    seen = []

    def grader(judge_task: Task, cases: list) -> str:
        seen.append((judge_task, cases))
        answer_line = next(line for line in judge_task.question.splitlines() if line.startswith("Answer to grade:"))
        return "Yes." if "Paris" in answer_line else "No, it is wrong."

    judge = LLMJudge(CallablePlanner(grader))
    t = task("Paris", "City of Light")
    assert judge(t, "It is Paris.") == JudgeResult(1.0, "LLM judge said 'yes'")
    assert judge(t, "Lyon") == JudgeResult(0.0, "LLM judge said 'no'")
    judge_task, cases = seen[0]
    assert cases == []
    assert judge_task.id == "judge:t1" and judge_task.meta == {"judged_task": "t1"}
    assert "Question: What is the capital of France?" in judge_task.question
    assert "Ground truth (any of): Paris | City of Light" in judge_task.question


@pytest.mark.parametrize(("reply", "reward", "reason"), [
    ("yes", 1.0, "LLM judge said 'yes'"),
    ("  \nYES, it matches", 1.0, "LLM judge said 'yes'"),
    ("Correct.", 1.0, "LLM judge said 'correct'"),
    ("no", 0.0, "LLM judge said 'no'"),
    ("Incorrect", 0.0, "LLM judge said 'incorrect'"),
    ("The answer matches: yes", 1.0, "LLM judge said 'yes' (not first)"),
    ("I think not", 0.0, "LLM judge reply is not yes/no: 'I think not'"),
    ("", 0.0, "LLM judge reply is not yes/no: ''"),
])
def test_llm_judge_reply_parsing(reply: str, reward: float, reason: str) -> None:
    assert LLMJudge.parse_reply(reply) == JudgeResult(reward, reason)


def test_llm_judge_custom_template_and_plan_output() -> None:
    template = "Q={question} A={answers} O={output} {{literal}}"
    prompts = []

    def grader(judge_task: Task, cases: list) -> PlanOutput:
        prompts.append(judge_task.question)
        return PlanOutput(text="yes")

    judge = LLMJudge(CallablePlanner(grader), template)
    assert judge(task("Paris"), "  Paris {x}  ").reward == 1.0
    assert prompts == ["Q=What is the capital of France? A=Paris O=Paris {x} {literal}"]


@pytest.mark.parametrize("template", ["no fields", "{question} {answers}", "{question} {answers} {output} {extra}"])
def test_llm_judge_template_needs_its_fields(template: str) -> None:
    with pytest.raises(ConfigError, match="prompt_template"):
        LLMJudge(CallablePlanner(lambda t, c: "yes"), template)


def test_llm_judge_needs_a_planner() -> None:
    with pytest.raises(ConfigError, match="planner"):
        LLMJudge(object())  # type: ignore[arg-type]
    assert "{output}" in DEFAULT_LLM_JUDGE_PROMPT


def test_llm_judge_many_uses_one_batched_call() -> None:
    calls = []

    class Batched(CallablePlanner):
        def plan_many(self, tasks, cases):
            calls.append(len(tasks))
            return super().plan_many(tasks, cases)

    planner = Batched(lambda t, c: "yes" if "Answer to grade: Paris" in t.question else "no")
    judge = LLMJudge(planner)
    results = judge_many(judge, [task("Paris"), task("Paris")], ["Paris", "Rome"])
    assert [r.reward for r in results] == [1.0, 0.0]
    assert calls == [2]
    with pytest.raises(DataFormatError):
        judge.judge_many([task("Paris")], [])


# ------------------------------------------------------------------ callables, protocol, factory


def test_callable_judge_accepts_several_return_types() -> None:
    t = task("Paris")
    assert CallableJudge(lambda t, o: o == "Paris")(t, "Paris") == JudgeResult(1.0, "<lambda>: reward 1")
    assert CallableJudge(lambda t, o: np.bool_(False))(t, "x").reward == 0.0
    assert CallableJudge(lambda t, o: 0.25, name="quarter")(t, "x") == JudgeResult(0.25, "quarter: reward 0.25")
    assert CallableJudge(lambda t, o: (np.float64(0.5), "half"))(t, "x") == JudgeResult(0.5, "half")
    assert CallableJudge(lambda t, o: JudgeResult(1.0, "mine"))(t, "x").reason == "mine"
    with pytest.raises(DataFormatError):
        CallableJudge(lambda t, o: 2.0)(t, "x")
    with pytest.raises(DataFormatError):
        CallableJudge(lambda t, o: "yes")(t, "x")
    with pytest.raises(ConfigError):
        CallableJudge("not callable")  # type: ignore[arg-type]


def test_every_judge_satisfies_the_protocol() -> None:
    planner = CallablePlanner(lambda t, c: "yes")
    for judge in (ExactMatchJudge(), TokenF1Judge(), ContainsJudge(), NumericJudge(), LLMJudge(planner),
                  CallableJudge(lambda t, o: True)):
        assert isinstance(judge, Judge)
        assert isinstance(repr(judge), str)


def test_judge_many_loops_over_plain_judges() -> None:
    results = judge_many(ExactMatchJudge(), [task("Paris"), task("Rome")], ["paris", "Paris"])
    assert [r.reward for r in results] == [1.0, 0.0]
    with pytest.raises(DataFormatError):
        judge_many(ExactMatchJudge(), [task("Paris")], ["a", "b"])


@pytest.mark.parametrize(("kind", "cls"), [("exact", ExactMatchJudge), ("f1", TokenF1Judge),
                                           ("contains", ContainsJudge), ("numeric", NumericJudge)])
def test_make_judge(kind: str, cls: type) -> None:
    assert type(make_judge(kind)) is cls  # type: ignore[arg-type]


def test_make_judge_passes_kwargs_and_rejects_bad_ones() -> None:
    judge = make_judge("numeric", abs_tol=0.5, words=True)
    assert isinstance(judge, NumericJudge) and judge.abs_tol == 0.5 and judge.words
    assert make_judge("exact", first_line=False).first_line is False  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="must be one of"):
        make_judge("llm")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="bad arguments"):
        make_judge("exact", rel_tol=0.1)
