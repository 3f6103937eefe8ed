"""The realistic suite elements-real (issue 29 d): right format, wrong content. The build is deterministic and
matches the shipped files; the splits are disjoint; every seed case is a correct bare answer with reward 1; most
tasks ask a bank element for an attribute the bank lacks for it, so the cases most similar to a question (same
element) answer another attribute."""

from __future__ import annotations

import collections
import importlib.metadata
import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

from memento.envs.tasks import load_suite, seed_cases, suite_dir, suite_names
from memento.formats import read_cases_jsonl, read_tasks_jsonl
from memento.judges import ExactMatchJudge, normalize_answer
from memento.types import Case, Task
from tests.suite_builders import assert_rebuild_matches, load_builder

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "data"
SUITE = "elements-real"
FILES = ("train.jsonl", "test.jsonl", "cases.jsonl", "CARD.md")
FAMILIES = {"symbol", "atomic_number", "period", "group", "block", "atomic_mass", "discovery_year", "series"}


@pytest.fixture(scope="module")
def builder() -> ModuleType:
    """data/build_elements_suite.py as a module (it imports mendeleev only when it builds)."""
    return load_builder("build_elements_suite")


@pytest.fixture(scope="module")
def shipped() -> tuple[list[Task], list[Task], list[Case]]:
    directory = DATA / SUITE
    return (read_tasks_jsonl(directory / "train.jsonl"), read_tasks_jsonl(directory / "test.jsonl"),
            read_cases_jsonl(directory / "cases.jsonl"))


def _symbol(task_id: str) -> str:
    return task_id.rsplit("-", 1)[1]


# ------------------------------------------------------------------ the build


def test_command_line_rebuild_matches_the_shipped_files(tmp_path: Path) -> None:
    """The command line, in a fresh interpreter with another hash seed, writes the shipped bytes."""
    pytest.importorskip("mendeleev", reason="the data extra builds elements-real")
    assert_rebuild_matches("build_elements_suite", SUITE, FILES, tmp_path)


def test_contexts_are_cleaned(builder: ModuleType) -> None:
    assert builder.clean_origin("Anglo-Saxon: iron; symbol from Latin: ferrum (iron).") == "Anglo-Saxon: iron"
    assert builder.clean_origin("Symbol from Latin: cuprum (Cyprus).") == "Latin: cuprum (Cyprus)"
    assert builder.clean_origin("Named after the asteroid, Pallas, discovered in 1803.") == (
        "Named after the asteroid, Pallas")
    assert builder.clean_origin("Swedish: tung sten (heavy stone): symbol from its German name wolfram.") == (
        "Swedish: tung sten (heavy stone)")


# ------------------------------------------------------------------ the shipped files


def test_loaders_find_the_suite(shipped) -> None:
    train, test, cases = shipped
    assert SUITE in suite_names()
    assert suite_dir(SUITE) == DATA / SUITE
    assert load_suite(SUITE, "train") == train
    assert load_suite(SUITE, "test") == test
    assert load_suite(SUITE, "all") == train + test
    assert seed_cases(SUITE) == cases


def test_fields_sizes_and_families(shipped) -> None:
    train, test, cases = shipped
    assert len(test) >= 150 and len(train) >= 2 * len(test) and len(cases) >= 200
    assert {t.family for t in train} == {t.family for t in test} == {c.meta["family"] for c in cases} == FAMILIES
    judge = ExactMatchJudge()
    for t in train + test:
        assert t.env == SUITE and t.id == f"{SUITE}-{t.family}-{_symbol(t.id)}", t.id
        assert set(t.meta) == {"subject", "template"} and t.question.startswith(f"{t.meta['subject']}. "), t.id
        assert not re.search(r"\d", t.question), t.id  # no number leaks from the context or the phrasing
        assert judge(t, t.answers[0]).reward == 1.0 and judge(t, f"The answer is {t.answers[0]}.").reward == 0.0
        if t.family in ("atomic_number", "period", "group", "atomic_mass", "discovery_year"):
            assert all(a.isdigit() for a in t.answers), t.id
    per_family = collections.Counter(c.meta["family"] for c in cases)
    assert min(per_family.values()) >= 20


def test_train_test_and_seed_bank_are_disjoint(shipped) -> None:
    train, test, cases = shipped
    ids = [t.id for t in train + test] + [c.meta["task_id"] for c in cases]
    assert len(ids) == len(set(ids))  # one id per (attribute, element): no fact in two of them
    assert len({c.id for c in cases}) == len(cases)
    questions = [normalize_answer(t.question) for t in train + test] + [normalize_answer(c.state) for c in cases]
    assert len(questions) == len(set(questions))


def test_every_seed_case_is_a_correct_bare_answer_with_reward_1(shipped) -> None:
    _, _, cases = shipped
    judge = ExactMatchJudge()
    for case in cases:
        assert case.reward == 1.0 and case.env == SUITE and case.kind == "case", case.id
        assert case.id == f"{SUITE}-seed-{case.meta['task_id'].removeprefix(SUITE + '-')}"
        assert case.meta["format"] == "bare" and case.meta["correct"] is True and case.meta["source"] == "seed"
        assert case.action == case.meta["answers"][0]
        task = Task(id=case.meta["task_id"], question=case.state, answers=tuple(case.meta["answers"]))
        assert judge(task, case.action).reward == 1.0, case.id


def test_most_tasks_ask_a_bank_element_for_an_attribute_the_bank_lacks(builder: ModuleType, shipped) -> None:
    train, test, cases = shipped
    held: dict[str, set[str]] = collections.defaultdict(set)
    for case in cases:
        held[_symbol(case.meta["task_id"])].add(case.meta["family"])
    assert all(len(families) == 3 for families in held.values()) and len(held) >= 60
    for tasks in (train, test):
        lacking = [t for t in tasks if _symbol(t.id) in held and t.family not in held[_symbol(t.id)]]
        assert len(lacking) >= 0.55 * len(tasks)
        assert builder.misleading_share(tasks, cases) == len(lacking) / len(tasks)
    # the helpful demonstrations exist: every attribute has seed cases about many other elements
    for task in test:
        others = [c for c in cases
                  if c.meta["family"] == task.family and _symbol(c.meta["task_id"]) != _symbol(task.id)]
        assert len(others) >= 20, task.id


def test_similarity_finds_the_element_not_the_attribute(builder: ModuleType, shipped) -> None:
    _, test, cases = shipped
    stats = builder.nearest_stats(test, cases)
    assert stats["top1_same_element"] >= 0.8
    assert stats["topk_same_element"] >= 0.5 > stats["topk_same_family"]


def test_card_states_the_package_judge_and_command() -> None:
    card = (DATA / SUITE / "CARD.md").read_text(encoding="utf-8")
    for needle in ("ExactMatchJudge", "mendeleev (PyPI)", "MIT", "## Probe", "right format",
                   ".venv/bin/python data/build_elements_suite.py --out data/", "data/probe_elements.py"):
        assert needle in card, needle
    assert re.search(r"\| mendeleev \(PyPI\) \| \d+\.\d+\.\d+ \|", card)
    try:
        version = importlib.metadata.version("mendeleev")
    except importlib.metadata.PackageNotFoundError:
        return
    assert f"| mendeleev (PyPI) | {version} |" in card
