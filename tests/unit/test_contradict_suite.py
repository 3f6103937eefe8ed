"""The realistic suite contradict-real: contradicting memories. The build is deterministic and matches the shipped
files; the splits are disjoint by thing (and territory); every thing asked has exactly one current case and one or
two stale ones in the seed bank, all reward 1 and worded alike; the gold answer is the current case's action and no
stale action."""

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
SUITE = "contradict-real"
FILES = ("train.jsonl", "test.jsonl", "cases.jsonl", "CARD.md")
FAMILIES = {"currency", "currency_code", "country_name"}
COMMAND = ".venv/bin/python data/build_contradict_suite.py --out data/"


@pytest.fixture(scope="module")
def builder() -> ModuleType:
    """data/build_contradict_suite.py as a module (it imports babel and pycountry only when it builds)."""
    return load_builder("build_contradict_suite")


@pytest.fixture(scope="module")
def shipped() -> tuple[list[Task], list[Task], list[Case]]:
    directory = DATA / SUITE
    return (read_tasks_jsonl(directory / "train.jsonl"), read_tasks_jsonl(directory / "test.jsonl"),
            read_cases_jsonl(directory / "cases.jsonl"))


@pytest.fixture(scope="module")
def bank(shipped) -> dict[str, list[Case]]:
    """Thing id -> its seed cases."""
    held: dict[str, list[Case]] = collections.defaultdict(list)
    for case in shipped[2]:
        held[case.meta["thing"]].append(case)
    return held


# ------------------------------------------------------------------ the build


def test_command_line_rebuild_matches_the_shipped_files(tmp_path: Path) -> None:
    """The command line, in a fresh interpreter with another hash seed, writes the shipped bytes."""
    pytest.importorskip("babel", reason="the data extra builds contradict-real")
    pytest.importorskip("pycountry", reason="the data extra builds contradict-real")
    assert_rebuild_matches("build_contradict_suite", SUITE, FILES, tmp_path)


def test_history_picks_the_current_and_the_most_recent_stale_values(builder: ModuleType) -> None:
    records = [("AAA", (1900, 1, 1), (1950, 1, 1), True), ("BBB", (1950, 1, 1), (1990, 1, 1), True),
               ("XXX", (1960, 1, 1), (1995, 1, 1), False), ("CCC", (1990, 1, 1), (2002, 1, 1), True),
               ("DDD", (2002, 1, 1), None, True)]
    now, stale = builder.history(records, str)
    assert now.text == "DDD" and now.start == 2002 and now.end is None
    assert [(v.text, v.start, v.end) for v in stale] == [("CCC", 1990, 2002), ("BBB", 1950, 1990)]
    # a stale answer with the current one's name is no contradiction: skipped, the next one taken
    now, stale = builder.history(records, lambda code: "Same" if code in ("CCC", "DDD") else code)
    assert now.text == "Same" and [v.text for v in stale] == ["BBB", "AAA"]
    assert builder.history(records[:3], str) == "no current legal tender"
    assert builder.history([*records, ("EEE", (2009, 1, 1), None, True)], str) == "several current legal tenders"
    assert builder.history(records[4:], str) == "no former legal tender"
    assert builder.clean_currency_name("Afghan Afghani (1927–2002)") == "Afghan Afghani"
    assert builder.clean_currency_name("Sierra Leonean Leone (1964—2022)") == "Sierra Leonean Leone"
    assert builder.clean_currency_name("German Mark") == "German Mark"
    assert builder.territory_subject("MM", "Myanmar (Burma)") == "Myanmar"
    assert builder.territory_subject("BA", "Bosnia & Herzegovina") == "Bosnia and Herzegovina"
    assert builder.territory_subject("NL", "Netherlands") == "the Netherlands"


# ------------------------------------------------------------------ the shipped files


def test_loaders_find_the_suite(shipped) -> None:
    train, test, cases = shipped
    assert SUITE in suite_names()
    assert suite_dir(SUITE) == DATA / SUITE
    assert load_suite(SUITE, "train") == train
    assert load_suite(SUITE, "test") == test
    assert load_suite(SUITE, "all") == train + test
    assert seed_cases(SUITE) == cases


def test_fields_sizes_and_families(shipped, bank) -> None:
    train, test, cases = shipped
    things = {t.meta["thing"] for t in train + test}
    assert len(things) >= 150 and set(bank) == things  # the bank holds every thing asked, and only those
    assert len(test) >= 150 and len(train) >= 150
    assert {t.family for t in train} == {t.family for t in test} == {c.meta["family"] for c in cases} == FAMILIES
    for t in train + test:
        assert t.env == SUITE and set(t.meta) == {"thing"} and t.family == t.meta["thing"].split("-")[0], t.id
        assert re.fullmatch(rf"{re.escape(t.meta['thing'])}-[ab]", t.id), t.id
    for c in cases:
        assert c.env == SUITE and c.kind == "case" and c.meta["source"] == "seed", c.id
        assert {"thing", "family", "current"} <= set(c.meta) and isinstance(c.meta["current"], bool), c.id
        assert c.meta["family"] == c.meta["thing"].split("-")[0], c.id
        assert all(isinstance(c.meta[k], int) for k in ("start", "end") if k in c.meta), c.id
        assert ("end" in c.meta) != c.meta["current"], c.id  # a stale value ended, the current one did not
    assert len({c.id for c in cases}) == len(cases) and len({t.id for t in train + test}) == len(train + test)
    # the bank is shuffled: the current case is not always the first of its thing
    first: dict[str, bool] = {}
    for c in cases:
        first.setdefault(c.meta["thing"], c.meta["current"])
    assert 0.2 < sum(first.values()) / len(first) < 0.9


def test_splits_are_disjoint_by_thing_and_territory(shipped) -> None:
    train, test, _ = shipped
    train_things, test_things = {t.meta["thing"] for t in train}, {t.meta["thing"] for t in test}
    assert not train_things & test_things
    territory = lambda thing: thing.rsplit("-", 1)[1]  # noqa: E731
    assert not {territory(t) for t in train_things} & {territory(t) for t in test_things}
    assert 0.35 < len(test_things) / len(train_things | test_things) < 0.65
    questions = [normalize_answer(t.question) for t in train + test]
    assert len(questions) == len(set(questions))


def test_every_thing_has_one_current_and_one_or_two_stale_cases_worded_alike(shipped, bank) -> None:
    train, test, _ = shipped
    for thing in {t.meta["thing"] for t in train + test}:
        cases = bank[thing]
        current = [c for c in cases if c.meta["current"]]
        stale = [c for c in cases if not c.meta["current"]]
        assert len(current) == 1 and 1 <= len(stale) <= 2, thing
        assert all(c.reward == 1.0 for c in cases), thing
        assert len({c.state for c in cases}) == 1, thing  # the same question wording
        actions = [normalize_answer(c.action) for c in cases]
        assert len(set(actions)) == len(actions), thing
        assert current[0].id == f"{SUITE}-seed-{thing}-current"
        assert sorted(c.id for c in stale) == [f"{SUITE}-seed-{thing}-stale-{i}" for i in range(1, len(stale) + 1)]
        # most recent first: stale-1 ended no earlier than stale-2
        ends = [c.meta["end"] for c in sorted(stale, key=lambda c: c.id)]
        assert ends == sorted(ends, reverse=True), thing


def test_gold_is_the_current_action_and_no_stale_one(shipped, bank) -> None:
    train, test, _ = shipped
    judge = ExactMatchJudge()
    for task in train + test:
        cases = bank[task.meta["thing"]]
        current = next(c for c in cases if c.meta["current"])
        assert task.answers == (current.action,), task.id
        assert normalize_answer(task.answers[0]) == normalize_answer(current.action)
        assert judge(task, current.action).reward == 1.0, task.id
        for case in cases:
            if not case.meta["current"]:
                assert normalize_answer(case.action) != normalize_answer(task.answers[0]), task.id
                assert judge(task, case.action).reward == 0.0, task.id
        assert normalize_answer(task.question) != normalize_answer(current.state), task.id  # a paraphrase


def test_every_thing_has_two_tasks_with_different_questions(shipped) -> None:
    train, test = shipped[0], shipped[1]
    for tasks in (train, test):
        by_thing: dict[str, list[Task]] = collections.defaultdict(list)
        for task in tasks:
            by_thing[task.meta["thing"]].append(task)
        for thing, mine in by_thing.items():
            assert sorted(t.id for t in mine) == [f"{thing}-a", f"{thing}-b"], thing
            assert len({normalize_answer(t.question) for t in mine}) == 2, thing


def test_similarity_cannot_tell_current_from_stale(builder: ModuleType, shipped) -> None:
    _, test, cases = shipped
    stats = builder.nearest_stats(test, cases)
    assert stats["top1_same_thing"] >= 0.6
    assert stats["top1_stale"] >= 0.2  # ties broken by bank order: a stale case is often shown first


def test_card_states_the_sources_counts_and_command(shipped) -> None:
    train, test, cases = shipped
    card = (DATA / SUITE / "CARD.md").read_text(encoding="utf-8")
    for needle in ("ExactMatchJudge", "babel (PyPI)", "BSD-3-Clause", "Unicode License v3", "pycountry (PyPI)",
                   "LGPL-2.1", "iso-codes", "Never tune on the test split", COMMAND,
                   f"({len(train)} train, {len(test)} test)", f"{len(cases)} cases"):
        assert needle in card, needle
    for package in ("babel", "pycountry"):
        assert re.search(rf"\| {package} \(PyPI\) \| \d+\.\d+(\.\d+)? \|", card), package
        try:
            version = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            continue
        assert f"| {package} (PyPI) | {version} |" in card
