"""Build the realistic suite ``elements-real`` (issue 29 d): right format, wrong content.

    .venv/bin/python data/build_elements_suite.py --out data/

writes ``<out>/elements-real/{train,test,cases}.jsonl`` and ``<out>/elements-real/CARD.md``. No network:
the facts come from the ``mendeleev`` package's bundled SQLite database (a ``data`` extra, pinned in
``constraints.txt``), read directly with ``sqlite3`` (the tables ``mendeleev.fetch.fetch_table`` returns,
without the package's slow import); the same package version gives byte-identical files
(``tests/unit/test_elements_suite.py``).

What makes it realistic: every seed case is a *correct*, *bare* answer with reward 1 (the format is right),
but the bank holds only a few attributes per element. Most tasks ask a bank element for an attribute the
bank does not hold for it, so a retriever that ranks by the question's similarity (dominated by the
element's name) shows the element's *other* attributes, whose answers ("Fe", "26", "d") are the wrong
content for the question asked, while the same attribute asked about other elements, also in the bank,
would be the helpful demonstrations.

Randomness: one ``random.Random`` per purpose, seeded with the string ``f"{seed}:elements-real:{purpose}"``
(string seeds are hashed with SHA-512: stable across runs, platforms and Python versions).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import importlib.metadata
import importlib.util
import random
import re
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

from memento.formats import write_jsonl
from memento.io import atomic_write_text
from memento.judges import ExactMatchJudge, normalize_answer
from memento.types import Case, Task

SUITE = "elements-real"
DEFAULT_SEED = 20250929
PACKAGE = "mendeleev"
MAX_Z = 100  # hydrogen to fermium: period, block, series and atomic weight known for each
BANK_FRACTION = 0.75  # of the elements have seed cases
BANK_ATTRIBUTES = 3  # seed cases per bank element
TEST_FRACTION = 0.3
NEAREST_K = 4
COMMAND = ".venv/bin/python data/build_elements_suite.py --out data/"

# attribute -> (what, the package column it comes from)
FAMILIES: dict[str, tuple[str, str]] = {
    "symbol": ("the chemical symbol, from the element's name", "symbol"),
    "atomic_number": ("the atomic number, in digits", "atomic_number"),
    "period": ("the period (row) of the periodic table, in digits", "period"),
    "group": ("the group (column, 1-18) of the periodic table, in digits; lanthanides and actinides have none",
              "group_id"),
    "block": ("the block: s, p, d or f (\"d-block\" accepted)", "block"),
    "atomic_mass": ("the atomic weight rounded to a whole number (half up; both neighbours accepted for x.5)",
                    "atomic_weight"),
    "discovery_year": ("the year of discovery; elements known since antiquity have none", "discovery_year"),
    "series": ("the chemical series (mendeleev's ten series names; singular accepted)", "series_id -> series"),
}

# {s}: the element's name in lower case. Every question starts with the element's context (see `context`).
TEMPLATES: dict[str, tuple[str, ...]] = {
    "symbol": ("What is the chemical symbol of {s}?", "What is the symbol for the element {s}?",
               "Which chemical symbol does {s} have?"),
    "atomic_number": ("What is the atomic number of {s}?", "How many protons are in an atom of {s}?",
                      "Which atomic number does {s} have?"),
    "period": ("In which period of the periodic table is {s}?", "What is the period of {s} in the periodic table?",
               "Which period (row) of the periodic table contains {s}?"),
    "group": ("In which group of the periodic table is {s}?", "What is the group number of {s}?",
              "Which group (column) of the periodic table contains {s}?"),
    "block": ("In which block of the periodic table is {s}?", "Which block (s, p, d or f) does {s} belong to?"),
    "atomic_mass": ("What is the atomic mass of {s}, rounded to a whole number?",
                    "What is the atomic weight of {s}, to the nearest whole number?",
                    "Rounded to a whole number, what is the atomic mass of {s}?"),
    "discovery_year": ("In which year was {s} discovered?", "What year was the element {s} discovered?",
                       "When was {s} discovered? Give the year."),
    "series": ("Which chemical series does {s} belong to?", "To which series of elements does {s} belong?"),
}

# mendeleev's series name -> accepted answers (the package's name first)
SERIES_ANSWERS = {
    "Nonmetals": ("Nonmetals", "nonmetal", "non-metals", "non-metal"),
    "Noble gases": ("Noble gases", "noble gas"),
    "Alkali metals": ("Alkali metals", "alkali metal"),
    "Alkaline earth metals": ("Alkaline earth metals", "alkaline earth metal"),
    "Metalloids": ("Metalloids", "metalloid"),
    "Halogens": ("Halogens", "halogen"),
    "Poor metals": ("Poor metals", "poor metal", "post-transition metals", "post-transition metal"),
    "Transition metals": ("Transition metals", "transition metal"),
    "Lanthanides": ("Lanthanides", "lanthanide", "lanthanoids", "lanthanoid"),
    "Actinides": ("Actinides", "actinide", "actinoids", "actinoid"),
}
# The context that opens every question about an element: its name and the origin of its name, from the
# package's `name_origin` (clauses that give the symbol's origin or a year removed), so that the element, not
# the attribute, dominates a question's similarity to the others, as a shared entity context does in real
# banks. No answer of the element's tasks may occur in it (checked by the build).
CONTEXT = "{name}. Origin of the name: {origin}."
_SYMBOL_CLAUSE = re.compile(r"[;:]?\s*symbol from .*$", re.IGNORECASE)
_YEAR_CLAUSE = re.compile(r",?\s*discovered in \d{4}")


@dataclass(frozen=True)
class Element:
    number: int
    symbol: str
    name: str
    origin: str  # the origin of the name, cleaned (see CONTEXT)
    values: dict[str, Any]  # family -> the package's value (None: not known)


@dataclass(frozen=True)
class Fact:
    element: Element
    family: str
    answers: tuple[str, ...]


@dataclass
class ElementsSuite:
    seed: int
    train: list[Task]
    test: list[Task]
    cases: list[Case]
    counts: dict[str, dict[str, int]]
    bank_elements: list[str]
    nearest: dict[str, float] = field(default_factory=dict)


# ------------------------------------------------------------------ the facts


def _round_half_up(value: float) -> int:
    return int(Decimal(repr(value)).quantize(Decimal(1), rounding=ROUND_HALF_UP))


def clean_origin(text: str) -> str:
    """The package's origin of a name without the origin of the symbol or a year ("Latin: cuprum (...)" is
    kept when the whole text is the symbol's origin)."""
    text = " ".join(text.split())
    kept = _SYMBOL_CLAUSE.sub("", text)
    kept = kept if kept.strip() else re.sub(r"^symbol from\s*", "", text, flags=re.IGNORECASE)
    kept = _YEAR_CLAUSE.sub("", kept).strip().rstrip(".;:,").strip()
    return kept[:1].upper() + kept[1:]


def database_path() -> Path:
    """The package's bundled database (``mendeleev/elements.db``, what ``mendeleev.db.get_package_dbpath()``
    returns), found without importing the package: its import (SQLAlchemy models, pandas) takes seconds."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"the {PACKAGE} package (a `data` extra) is needed to build {SUITE}: "
                                  f"pip install -c constraints.txt {PACKAGE}")
    path = Path(next(iter(spec.submodule_search_locations))) / "elements.db"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: the database of {PACKAGE} {importlib.metadata.version(PACKAGE)} is missing")
    return path


def load_elements(max_z: int = MAX_Z) -> list[Element]:
    """Elements 1..max_z from the ``elements`` and ``series`` tables of the package's database (read-only)."""
    with contextlib.closing(sqlite3.connect(f"{database_path().as_uri()}?mode=ro", uri=True)) as db:
        series = dict(db.execute("SELECT id, name FROM series"))
        rows = db.execute("SELECT atomic_number, symbol, name, name_origin, period, group_id, block, atomic_weight, "
                          "discovery_year, series_id FROM elements WHERE atomic_number <= ? ORDER BY atomic_number",
                          (max_z,)).fetchall()
    elements = []
    for z, symbol, name, origin, period, group, block, weight, year, series_id in rows:
        values = {"symbol": symbol, "atomic_number": z, "period": period, "group": group, "block": block,
                  "atomic_mass": weight, "discovery_year": year,
                  "series": None if series_id is None else series[series_id]}
        elements.append(Element(number=z, symbol=symbol, name=name, origin=clean_origin(origin), values=values))
    if [e.number for e in elements] != list(range(1, max_z + 1)):
        raise RuntimeError(f"{PACKAGE}: elements 1..{max_z} expected")
    return elements


def answers_of(element: Element, family: str) -> tuple[str, ...] | None:
    value = element.values[family]
    if value is None:
        return None
    match family:
        case "symbol" | "block":
            return (value,) if family == "symbol" else (value, f"{value}-block")
        case "atomic_mass":
            rounded = _round_half_up(value)
            tie = Decimal(repr(value)) % 1 == Decimal("0.5")
            return (str(rounded), str(rounded - 1)) if tie else (str(rounded),)
        case "series":
            return SERIES_ANSWERS[value]
        case _:
            return (str(value),)


def all_facts(elements: Sequence[Element]) -> list[Fact]:
    facts = []
    for element in elements:
        for family in FAMILIES:
            answers = answers_of(element, family)
            if answers is not None:
                facts.append(Fact(element=element, family=family, answers=answers))
    return facts


def context(element: Element) -> str:
    return CONTEXT.format(name=element.name, origin=element.origin)


def check_contexts(facts: Sequence[Fact]) -> None:
    """No answer of an element's facts occurs (as whole words, normalised) in its context, nor its symbol (as a
    word, case-sensitively), nor any digit."""
    for fact in facts:
        text = context(fact.element)
        words = f" {normalize_answer(text)} "
        # a symbol is checked case-sensitively below ("in" is no leak of In)
        leaked = fact.family != "symbol" and any(f" {normalize_answer(a)} " in words for a in fact.answers)
        if leaked or re.search(r"\d", text) or re.search(rf"\b{re.escape(fact.element.symbol)}\b", text):
            raise RuntimeError(f"the context of {fact.element.name} gives away {fact.family}: {text!r}")


def make_task(fact: Fact, seed: int) -> Task:
    e = fact.element
    templates = TEMPLATES[fact.family]
    template = random.Random(f"{seed}:{SUITE}:template:{fact.family}:{e.symbol}").randrange(len(templates))
    question = f"{context(e)} {templates[template].format(s=e.name.lower())}"
    return Task(id=f"{SUITE}-{fact.family}-{e.symbol}", question=question, answers=fact.answers, family=fact.family,
                env=SUITE, meta={"subject": e.name, "template": template})


def make_case(task: Task) -> Case:
    """A seed case: the bare canonical answer, checked to be exactly right, reward 1."""
    action = task.answers[0]
    if ExactMatchJudge()(task, action).reward != 1.0:  # pragma: no cover - the answers are their own first item
        raise RuntimeError(f"seed demo {task.id}: {action!r} is not an exact match")
    key = task.id.removeprefix(f"{SUITE}-")
    return Case(id=f"{SUITE}-seed-{key}", state=task.question, action=action, reward=1.0, env=SUITE, kind="case",
                meta={"family": task.family, "format": "bare", "answers": list(task.answers), "task_id": task.id,
                      "source": "seed", "correct": True})


# ------------------------------------------------------------------ the split


def choose_bank(elements: Sequence[Element], facts: Sequence[Fact], seed: int) -> dict[int, list[str]]:
    """Bank element number -> the families of its seed cases: BANK_FRACTION of the elements (seeded), each
    with BANK_ATTRIBUTES families it has, the least used so far first (ties broken at random), so every
    family gets about as many seed cases."""
    order = [e.number for e in elements]
    random.Random(f"{seed}:{SUITE}:bank").shuffle(order)
    bank = order[:round(BANK_FRACTION * len(order))]
    has: dict[int, list[str]] = collections.defaultdict(list)
    for fact in facts:
        has[fact.element.number].append(fact.family)
    used = collections.Counter({family: 0 for family in FAMILIES})
    rng = random.Random(f"{seed}:{SUITE}:bank-families")
    chosen: dict[int, list[str]] = {}
    for z in bank:
        candidates = list(has[z])
        rng.shuffle(candidates)
        picked = sorted(candidates, key=lambda f: used[f])[:BANK_ATTRIBUTES]  # stable: the shuffle breaks ties
        used.update(picked)
        chosen[z] = sorted(picked, key=list(FAMILIES).index)
    return dict(sorted(chosen.items()))


def build(seed: int = DEFAULT_SEED) -> ElementsSuite:
    elements = load_elements()
    facts = all_facts(elements)
    check_contexts(facts)
    bank = choose_bank(elements, facts, seed)
    seed_facts = [f for f in facts if f.family in bank.get(f.element.number, ())]
    rest = [f for f in facts if f.family not in bank.get(f.element.number, ())]

    # stratified by (family, bank element or not): TEST_FRACTION of each stratum's facts to test, by seeded shuffle
    strata: dict[tuple[str, bool], list[int]] = collections.defaultdict(list)
    for fact in rest:
        strata[(fact.family, fact.element.number in bank)].append(fact.element.number)
    test_keys: set[tuple[str, int]] = set()
    for (family, in_bank), numbers in sorted(strata.items()):
        random.Random(f"{seed}:{SUITE}:split:{family}:{int(in_bank)}").shuffle(numbers)
        test_keys.update((family, z) for z in numbers[:round(TEST_FRACTION * len(numbers))])
    train = [make_task(f, seed) for f in rest if (f.family, f.element.number) not in test_keys]
    test = [make_task(f, seed) for f in rest if (f.family, f.element.number) in test_keys]
    cases = [make_case(make_task(f, seed)) for family in FAMILIES for f in seed_facts if f.family == family]
    check_disjoint(train, test, cases)
    random.Random(f"{seed}:{SUITE}:order:train").shuffle(train)
    random.Random(f"{seed}:{SUITE}:order:test").shuffle(test)

    counts: dict[str, dict[str, int]] = {}
    for family in FAMILIES:
        counts[family] = {"facts": sum(f.family == family for f in facts),
                          "train": sum(t.family == family for t in train),
                          "test": sum(t.family == family for t in test),
                          "seed": sum(c.meta["family"] == family for c in cases)}
    names = {e.number: e.symbol for e in elements}
    return ElementsSuite(seed=seed, train=train, test=test, cases=cases, counts=counts,
                         bank_elements=[names[z] for z in bank],
                         nearest=nearest_stats(test, cases))


def check_disjoint(train: Sequence[Task], test: Sequence[Task], cases: Sequence[Case]) -> None:
    questions = [normalize_answer(t.question) for t in [*train, *test]] + [normalize_answer(c.state) for c in cases]
    duplicates = [q for q, n in collections.Counter(questions).items() if n > 1]
    if duplicates:
        raise RuntimeError(f"duplicate questions: {duplicates[:5]}")
    ids = [t.id for t in [*train, *test]] + [c.meta["task_id"] for c in cases]
    if len(ids) != len(set(ids)):
        raise RuntimeError("a fact is in two of (train, test, seed bank)")


# ------------------------------------------------------------------ statistics (no LLM, no embeddings)


def symbol_of(task_id: str) -> str:
    """The element symbol of a task id ``elements-real-<attribute>-<symbol>`` (symbols have no dash)."""
    return task_id.rsplit("-", 1)[1]


def bank_view(cases: Sequence[Case]) -> dict[str, set[str]]:
    """Element symbol -> the attributes the seed bank holds for it."""
    held: dict[str, set[str]] = collections.defaultdict(set)
    for case in cases:
        held[symbol_of(case.meta["task_id"])].add(case.meta["family"])
    return held


def misleading_share(tasks: Sequence[Task], cases: Sequence[Case]) -> float:
    """Share of ``tasks`` about an element the bank holds cases for, asking an attribute it lacks for it."""
    held = bank_view(cases)
    return sum(symbol_of(t.id) in held and t.family not in held[symbol_of(t.id)] for t in tasks) / len(tasks)


def _bag(text: str) -> dict[str, int]:
    return dict(collections.Counter(normalize_answer(text).split()))


def nearest_stats(test: Sequence[Task], cases: Sequence[Case], k: int = NEAREST_K) -> dict[str, float]:
    """How a similarity retriever fares on the seed bank, with bag-of-words cosine over the normalised question
    words standing in for an embedding (as ``build_real_suites.nearest_stats``; deterministic).

    For the test tasks about a bank element: the mean share of the k nearest seed cases about the same element
    and of the same attribute, the share of tasks whose nearest case is about the same element, and the share
    whose top-k holds no case of the same attribute. The same shares over all test tasks end in ``_all``.
    """
    held = bank_view(cases)
    bags = [_bag(c.state) for c in cases]
    norms = [sum(v * v for v in bag.values()) for bag in bags]
    sums: dict[str, collections.Counter[str]] = {"bank": collections.Counter(), "all": collections.Counter()}
    for task in test:
        query = _bag(task.question)
        scores = [-(sum(n * bag.get(w, 0) for w, n in query.items()) ** 2 / norm) for bag, norm in zip(bags, norms)]
        top = sorted(range(len(cases)), key=lambda i: (scores[i], i))[:k]
        same_element = [symbol_of(cases[i].meta["task_id"]) == symbol_of(task.id) for i in top]
        same_family = [cases[i].meta["family"] == task.family for i in top]
        groups = ["all", "bank"] if symbol_of(task.id) in held else ["all"]
        for group in groups:
            c = sums[group]
            c["n"] += 1
            c["same_element"] += sum(same_element)
            c["same_family"] += sum(same_family)
            c["top1_same_element"] += same_element[0]
            c["no_same_family"] += not any(same_family)
    out: dict[str, float] = {}
    for group, c in sums.items():
        suffix = "" if group == "bank" else "_all"
        n = c["n"] or 1
        out[f"topk_same_element{suffix}"] = c["same_element"] / (k * n)
        out[f"topk_same_family{suffix}"] = c["same_family"] / (k * n)
        out[f"top1_same_element{suffix}"] = c["top1_same_element"] / n
        out[f"topk_without_same_family{suffix}"] = c["no_same_family"] / n
    out["bank_tasks"] = sums["bank"]["n"] / len(test)
    return out


# ------------------------------------------------------------------ the card


def _pct(x: float) -> str:
    return f"{round(100 * x)}%"


def family_rows(suite: ElementsSuite) -> str:
    rows = []
    for family, (what, column) in FAMILIES.items():
        c = suite.counts[family]
        phrasings = " / ".join(f"\"{t.format(s='X')}\"" for t in TEMPLATES[family])
        rows.append(f"| `{family}` | {what} | `{column}` | {phrasings} | {c['facts']} | {c['train']} | {c['test']} "
                    f"| {c['seed']} |")
    total = {k: sum(c[k] for c in suite.counts.values()) for k in ("facts", "train", "test", "seed")}
    rows.append(f"| **total** | | | | {total['facts']} | {total['train']} | {total['test']} | {total['seed']} |")
    return "\n".join(rows)


def example(suite: ElementsSuite) -> str:
    """One test task about a bank element, with the bank's cases about that element and one same-family case."""
    held: dict[str, list[Case]] = collections.defaultdict(list)
    for case in suite.cases:
        held[symbol_of(case.meta["task_id"])].append(case)
    for task in suite.test:
        same = held.get(symbol_of(task.id), [])
        if len(same) == BANK_ATTRIBUTES and task.family in ("atomic_number", "period", "group"):
            other = next(c for c in suite.cases if c.meta["family"] == task.family and c not in same)
            lines = [f"- task: \"{task.question}\" -> `{task.answers[0]}`",
                     *(f"- in the bank, same element: \"{c.state}\" -> `{c.action}`" for c in same),
                     f"- in the bank, same attribute: \"{other.state}\" -> `{other.action}`"]
            return "\n".join(lines)
    return ""  # pragma: no cover


def card(suite: ElementsSuite) -> str:
    n = suite.nearest
    version = importlib.metadata.version(PACKAGE)
    licence = importlib.metadata.metadata(PACKAGE)["License"] or "see the package"
    return CARD.format(
        n_tasks=len(suite.train) + len(suite.test), n_train=len(suite.train), n_test=len(suite.test),
        n_cases=len(suite.cases), n_families=len(FAMILIES), max_z=MAX_Z, n_bank=len(suite.bank_elements),
        bank_pct=round(100 * BANK_FRACTION), per_element=BANK_ATTRIBUTES, test_pct=round(100 * TEST_FRACTION),
        families=family_rows(suite), example=example(suite), context=CONTEXT.format(name="<Name>", origin="<origin>"),
        example_question=suite.test[0].question,
        mis_train=_pct(misleading_share(suite.train, suite.cases)), mis_test=_pct(misleading_share(suite.test,
                                                                                                    suite.cases)),
        k=NEAREST_K, bank_tasks=_pct(n["bank_tasks"]), same_element=_pct(n["topk_same_element"]),
        same_family=_pct(n["topk_same_family"]), top1_element=_pct(n["top1_same_element"]),
        no_family=_pct(n["topk_without_same_family"]), same_element_all=_pct(n["topk_same_element_all"]),
        same_family_all=_pct(n["topk_same_family_all"]), no_family_all=_pct(n["topk_without_same_family_all"]),
        package=PACKAGE, version=version, licence=licence, command=COMMAND, seed=suite.seed,
        seed_note="" if suite.seed == DEFAULT_SEED else f" --seed {suite.seed}",
        package_use=PACKAGE_USE, probe_note=PROBE_NOTE,
        probe_rows="\n".join(f"| {what} | {a} | {b} |" for what, a, b in PROBE_ROWS))


PACKAGE_USE = ("symbols, names and their origins (the questions' context), atomic numbers, periods, groups, blocks, "
               "atomic weights (IUPAC/CIAAW values as the package compiles them; the most stable isotope's mass "
               "number for radioactive elements), discovery years, series")
# data/probe_elements.py's figures on the shipped files (seed 20250929), copied by hand after a run
PROBE_ROWS = (
    ("the first 40 (`--tasks 40`, the default)", "10/40 = 25%", "12/40 = 30%"),
    ("of those, the 21 about a bank element", "3/21", "3/21"),
    ("all 163 (`--tasks 1000`)", "23/163 = 14%", "38/163 = 23%"),
    ("of those, the 103 about a bank element", "12/103 = 12%", "23/103 = 22%"),
)
PROBE_NOTE = """\
The encoder ranks as intended: for the 103 test tasks about a bank element, 75% of the cosine top-4 are
cases about the task's element (the most there can be: the bank holds 3 per element) and 20% are of the
task's attribute; with the element's context cut from every question (the phrasing alone) these shares
are 27% and 73%, which is why the questions carry it. A 270M model knows few of these facts either way;
showing it cases of the asked attribute instead of the nearest ones adds 9 points on all 163 test tasks and
10 on the 103 where similarity shows the element's other attributes; on the first 40 alone the difference
(2 tasks) is within noise. Time: about 45 s per 40 tasks and condition on one CPU thread."""

CARD = """\
# Suite card: `elements-real`

Questions about the chemical elements with a seed bank whose demonstrations have the **right format and
the wrong content** (issue 29 d). {n_tasks} tasks in {n_families} attribute families ({n_train} train,
{n_test} test) about elements 1-{max_z} (hydrogen to fermium), and a seed case bank of {n_cases}
demonstrations. This file is generated by `data/build_elements_suite.py`; edit the script, not the card.

## Why

In `facts-real` and `arith-real` the misleading demonstrations have the wrong *form* (a sentence, JSON,
reasoning first). Here every seed case is a correct bare answer with reward 1, exactly the form the judge
wants, and a positive-only filter keeps all of them. What misleads is the *content*: the bank holds only
{per_element} attributes for each of {n_bank} elements ({bank_pct}% of them), and most tasks ask a bank
element for an attribute the bank lacks for it ({mis_train} of train, {mis_test} of test). A retriever that
ranks by similarity of the question, which the element's name dominates, then shows the element's *other*
attributes: their answers ("Fe", "26", "d", "Transition metals") are bare, correct, and the wrong thing to
copy for the question asked (premise, probed below for a 270M planner). The helpful demonstrations, the
same attribute asked about other elements, are in the bank too, less similar. For example:

{example}

A selector that learns which shown cases produce a reward can prefer cases of the question's attribute;
the state text tells it the attribute, so, unlike the format suites, this needs no embedding of the action.

## Files

| file | format | rows |
|---|---|---|
| `train.jsonl` | Task JSONL (docs/formats.md), `env` = "elements-real", `family` = the attribute | {n_train} |
| `test.jsonl` | Task JSONL | {n_test} |
| `cases.jsonl` | Case JSONL, `env` = "elements-real", `kind` = "case" | {n_cases} |

Load them with `memento.envs.tasks.load_suite("elements-real", "train" | "test")` and
`memento.envs.tasks.seed_cases("elements-real")`. A task is `{{"id": "elements-real-<attribute>-<symbol>",
"question", "answers": [canonical, aliases...], "family": <attribute>, "env": "elements-real", "meta":
{{"subject": <element name>, "template": <phrasing index>}}}}`. A case is `{{"id":
"elements-real-seed-<attribute>-<symbol>", "state": question, "action": bare canonical answer, "reward": 1.0,
"env", "kind": "case", "meta": {{"family", "format": "bare", "answers", "task_id", "source": "seed",
"correct": true}}}}`.

Judge the tasks with exact match, `memento.judges.ExactMatchJudge()` (`make_judge("exact")`): the first
line of the answer, normalised (case, punctuation, articles), must equal one of `answers`.

## Families

| attribute | answer | package column | phrasings (X: the element's name) | facts | train | test | seed |
|---|---|---|---|---|---|---|---|
{families}

Every question (task and seed case alike) opens with the element's context, `{context}`, then one phrasing:
e.g. "{example_question}". The context is the package's origin of the element's name, without the
origin of its symbol or a year; the build checks that it contains no digit, not the symbol, and none of the
element's answers. It is there so that the *element* dominates a question's similarity to the others, as a
shared entity context (a passage, a product page) does in real banks; without it a sentence encoder
(all-MiniLM-L6-v2) ranks cases of the same attribute first, and similarity is not misled (see Probe).

Aliases: a series answer may be singular ("transition metal", also "post-transition metal" for the package's
"Poor metals", "lanthanoid", "actinoid"); a block may be "d-block"; an atomic weight exactly halfway (x.5)
accepts both neighbours. Only facts the package holds are asked (no group for the lanthanides and actinides,
no year for the elements known since antiquity).

## How the split is made

- Seed bank: {n_bank} of the {max_z} elements ({bank_pct}%, seeded shuffle), {per_element} attributes each,
  chosen greedily among the attributes the element has so that every attribute gets about as many seed
  cases (see the table).
- The remaining facts go {test_pct}% to test and the rest to train, per (attribute, bank element or not), by
  seeded shuffle. No fact and no question is in two of
  (train, test, seed bank); each element's other facts are spread over the three.
- A question's phrasing is drawn per (attribute, element) with a seeded `random.Random`.

## What similarity finds

With bag-of-words cosine over the normalised question words standing in for an embedding (computed by the
build; no LLM, no encoder; a bag of words weighs the phrasing's words as much as the element's name, so a
sentence encoder, which the build does not run, ranks differently). {bank_tasks} of the test tasks are
about a bank element; for those, the {k} lexically nearest seed cases are about the same element
{same_element} of the time and of the same attribute {same_family} of the time; the nearest one is about the
same element for {top1_element} of them, and the top-{k} holds no case of the asked attribute for
{no_family}. Over all test tasks: same element {same_element_all}, same attribute {same_family_all}, no
same-attribute case in the top-{k} for {no_family_all}.

## Probe

Measured once with `data/probe_elements.py` (not by the build; the figures below are copied into the
builder): Gemma 3 270M (`memento.planners.HFPlanner.default()`, greedy, the default few-shot prompt, one
CPU thread), K = 4 seed cases per task, judged by `ExactMatchJudge`, cases chosen two ways with
all-MiniLM-L6-v2 (`memento.Encoder.from_pretrained()`):

| test tasks | cosine top-4 over the bank | 4 cases of the task's attribute (nearest by cosine) |
|---|---|---|
{probe_rows}

{probe_note}

## Sources and licences

| source | version used | licence | used for |
|---|---|---|---|
| {package} (PyPI) | {version} | {licence} (package metadata) | {package_use} |
| hand lists in `build_elements_suite.py` | - | this project's (MIT) | phrasings, aliases, the split |

The shipped files contain facts (names, numbers, years, the origins of names), not the package's code or
database. The package is
a `data` extra (pinned in `constraints.txt`); nothing needs it at run time.

## How it was built

    {command}{seed_note}

Seed {seed}. Deterministic: the same package version gives byte-identical files
(`tests/unit/test_elements_suite.py` rebuilds and compares).
"""


# ------------------------------------------------------------------ main


def write_suite(out: Path, suite: ElementsSuite, text: str) -> list[Path]:
    target = out / SUITE
    paths = [target / "train.jsonl", target / "test.jsonl", target / "cases.jsonl", target / "CARD.md"]
    write_jsonl(paths[0], (t.to_json() for t in suite.train))
    write_jsonl(paths[1], (t.to_json() for t in suite.test))
    write_jsonl(paths[2], (c.to_json() for c in suite.cases))
    atomic_write_text(paths[3], text)
    return paths


def main(argv: list[str] | None = None, *, echo: Callable[[str], None] = print) -> int:
    parser = argparse.ArgumentParser(description="Build the elements-real task suite (deterministic, no network).")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent,
                        help="directory that receives elements-real/ (default: this script's directory)")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"build seed (default: {DEFAULT_SEED})")
    args = parser.parse_args(argv)
    suite = build(args.seed)
    for path in write_suite(args.out, suite, card(suite)):
        echo(f"wrote {path}")
    echo(f"{SUITE}: {len(suite.train)} train, {len(suite.test)} test, {len(suite.cases)} seed cases, "
         f"{len(FAMILIES)} families; {misleading_share(suite.test, suite.cases):.0%} of test tasks ask a bank "
         "element for an attribute the bank lacks")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
