"""Build the realistic suites ``facts-real`` and ``arith-real`` (docs/formats.md; "a realistic bank").

    .venv/bin/python data/build_real_suites.py --out data/                       # both suites
    .venv/bin/python data/build_real_suites.py --suite arith-real --out data/    # one of them

writes ``<out>/<suite>/{train,test,cases}.jsonl`` and ``<out>/<suite>/CARD.md``. No network;
``facts-real`` reuses the facts of ``build_suites.py`` (packages of the ``data`` extra), ``arith-real``
is generated from the hand-written templates below with Python's ``random.Random``. The same
packages at the same versions give byte-identical files (``tests/unit/test_real_suites.py``).

What makes the seed banks *realistic* (issue 11, "the bank is too kind to similarity"): in
``facts`` every badly formatted demonstration carries reward 0, so a positive-only filter removes
exactly the cases that hurt. A real bank does not know which cases hurt. Here a seed case's stored
``reward`` is the outcome of its *own* task under a lenient judge (``memento.judges.ContainsJudge``,
run by this script on every case), as a bank that logged its agent's past answers would hold. So
correct demonstrations in a misleading format (a sentence, a JSON object, an answer after a line of
reasoning, "Answer: ...", an answer with its unit) carry reward 1, just like bare answers, and only
genuinely wrong ones carry 0. The tasks themselves are judged by exact match
(``memento.judges.ExactMatchJudge``), where those formats fail.

Randomness: one ``random.Random`` per purpose, seeded with the string ``f"{seed}:{suite}:{purpose}"``
(string seeds are hashed with SHA-512: stable across runs, platforms and Python versions).
"""

from __future__ import annotations

import argparse
import collections
import functools
import importlib.metadata
import importlib.util
import json
import random
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from memento.judges import ContainsJudge, ExactMatchJudge, normalize_answer
from memento.types import Case, Task


def _facts_builder() -> ModuleType:
    """``build_suites`` (this directory's facts builder), loaded once however this script was started."""
    name = "build_suites"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().with_name("build_suites.py"))
    if spec is None or spec.loader is None:  # pragma: no cover - the file is next to this one
        raise ImportError("data/build_suites.py not found next to build_real_suites.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


fb = _facts_builder()

FACTS_REAL = "facts-real"
ARITH_REAL = "arith-real"
SUITES = (FACTS_REAL, ARITH_REAL)
DEFAULT_SEEDS = {FACTS_REAL: 20250917, ARITH_REAL: 20250918}
TEST_FRACTION = 0.3
LENIENT_JUDGE = "contains"  # the name recorded in each case's meta; the judge is ContainsJudge()
NEAREST_K = 4

# A seed bank's formats per family: (format, count), shuffled over the family's seed tasks, the bare
# ones first spread over the phrasings (see assign_formats). More than half of each family's seed
# cases are correct, misleadingly formatted and rewarded 1 by the lenient judge.
FACTS_REAL_PLAN = (("bare", 5), ("wrong", 2), ("wrong_sentence", 1), ("sentence", 3), ("json", 3),
                   ("explained", 3), ("prefixed", 3), ("hedged", 2), ("alt", 2))
ARITH_REAL_PLAN = (("bare", 5), ("wrong", 2), ("wrong_sentence", 1), ("unit", 4), ("sentence", 3),
                   ("explained", 3), ("json", 3), ("prefixed", 3))
# (lenient reward, exact-match reward) each format must get for its own task; None = whatever the judge says.
EXPECTED: dict[str, tuple[float | None, float]] = {
    "bare": (1.0, 1.0), "wrong": (0.0, 0.0), "wrong_sentence": (0.0, 0.0), "alt": (None, 0.0),
    "sentence": (1.0, 0.0), "json": (1.0, 0.0), "explained": (1.0, 0.0), "prefixed": (1.0, 0.0),
    "hedged": (1.0, 0.0), "unit": (1.0, 0.0),
}
FORMAT_DESCRIPTIONS = {
    "bare": "the bare canonical answer, as the exact-match judge wants it",
    "sentence": "a full sentence that contains the answer",
    "json": 'a JSON object {"answer": ...}',
    "explained": "a line of reasoning, then the answer",
    "prefixed": '"Answer: " before the answer',
    "hedged": '"I think it is ..."',
    "unit": "the number with its unit (\"7 boxes\", \"29 dollars\")",
    "alt": "another form or alias: a code for a name or a name for a code, \"city, country\", "
           "\"code (country)\", \"00 51\" for \"+51\", \"noun: plural\", digits next to words",
    "wrong": "a wrong answer, bare",
    "wrong_sentence": "a wrong answer in a sentence",
}


# ------------------------------------------------------------------ shared machinery


@dataclass
class RealSuite:
    name: str
    seed: int
    train: list[Task]
    test: list[Task]
    cases: list[Case]
    counts: dict[str, dict[str, int]]
    templates: dict[str, tuple[str, ...]]
    nearest: dict[str, float] = field(default_factory=dict)


def assign_formats(seed_tasks: Sequence[Task], plan: Sequence[tuple[str, int]], rng: random.Random) -> list[str]:
    """The format of each seed task: ``plan``'s bare count first, one per phrasing present (so format
    and phrasing are not correlated), then the other formats of ``plan`` shuffled over the rest."""
    counts = dict(plan)
    if sum(counts.values()) != len(seed_tasks):
        raise ValueError(f"format plan {plan} does not cover {len(seed_tasks)} seed tasks")
    by_template: dict[int, list[int]] = collections.defaultdict(list)
    for i, task in enumerate(seed_tasks):
        by_template[task.meta["template"]].append(i)
    bare = {rng.choice(positions) for _, positions in sorted(by_template.items())}
    while len(bare) < counts["bare"]:
        bare.add(rng.choice(sorted(set(range(len(seed_tasks))) - bare)))
    others = [fmt for fmt, n in plan if fmt != "bare" for _ in range(n)]
    rng.shuffle(others)
    fill = iter(others)
    return ["bare" if i in bare else next(fill) for i in range(len(seed_tasks))]


def seed_case(suite: str, family: str, key: str, task: Task, action: str, fmt: str) -> Case:
    """One seed case: its stored reward is the lenient judge's verdict on its own task (checked against EXPECTED)."""
    lenient = ContainsJudge()(task, action)
    exact = ExactMatchJudge()(task, action)
    want_lenient, want_exact = EXPECTED[fmt]
    if (want_lenient is not None and lenient.reward != want_lenient) or exact.reward != want_exact:
        raise RuntimeError(f"seed demo {task.id} in format {fmt!r} ({action!r}): lenient {lenient.reward} "
                           f"({lenient.reason}), exact {exact.reward} ({exact.reason}); expected {EXPECTED[fmt]}")
    return Case(id=f"{suite}-seed-{family}-{key}", state=task.question, action=action, reward=lenient.reward,
                env=suite, kind="case",
                meta={"family": family, "format": fmt, "answers": list(task.answers), "task_id": task.id,
                      "source": "seed", "judge": LENIENT_JUDGE, "exact": exact.reward,
                      "correct": not fmt.startswith("wrong")})


def split_family(tasks: list[Task], n_seed: int) -> tuple[list[Task], list[Task], list[Task]]:
    """(seed, test, train): the first ``n_seed`` tasks, then TEST_FRACTION of the rest, then the remainder."""
    seed_part, rest = tasks[:n_seed], tasks[n_seed:]
    n_test = round(TEST_FRACTION * len(rest))
    return seed_part, rest[:n_test], rest[n_test:]


def check_disjoint(train: list[Task], test: list[Task], cases: list[Case]) -> None:
    questions = [normalize_answer(t.question) for t in train + test] + [normalize_answer(c.state) for c in cases]
    duplicates = [q for q, n in collections.Counter(questions).items() if n > 1]
    if duplicates:
        raise RuntimeError(f"duplicate questions: {duplicates[:5]}")
    ids = [t.id for t in train + test] + [c.meta["task_id"] for c in cases]
    if len(ids) != len(set(ids)):
        raise RuntimeError("a fact is in two of (train, test, seed bank)")


@dataclass(frozen=True)
class FamilyPlan:
    """One family of a suite: its items (facts, problems; each with a ``key``) in task order and their tasks;
    ``render(item, fmt, wrong)`` is a seed case's action, ``wrongs(item)`` the wrong answers a wrong format tries,
    in order."""

    name: str
    items: list[Any]
    tasks: list[Task]
    render: Callable[[Any, str, Any], str]
    wrongs: Callable[[Any], Iterable[Any]]


def assemble(name: str, seed: int, plan: Sequence[tuple[str, int]], families: Iterable[FamilyPlan],
             templates: dict[str, tuple[str, ...]]) -> RealSuite:
    """The suite of ``families``: each family's first tasks become seed cases in ``plan``'s formats (a wrong
    format shows the first wrong answer the lenient judge rejects), the rest the test and train tasks; each
    split shuffled."""
    per_family = sum(n for _, n in plan)
    train: list[Task] = []
    test: list[Task] = []
    cases: list[Case] = []
    counts: dict[str, dict[str, int]] = {}
    lenient = ContainsJudge()
    for family in families:
        seed_part, test_part, train_part = split_family(family.tasks, per_family)
        train.extend(train_part)
        test.extend(test_part)
        formats = assign_formats(seed_part, plan, random.Random(f"{seed}:{name}:formats:{family.name}"))
        family_cases = []
        for item, task, fmt in zip(family.items, seed_part, formats):
            wrong = None
            if fmt.startswith("wrong"):
                wrong = next((w for w in family.wrongs(item)
                              if lenient(task, family.render(item, fmt, w)).reward == 0.0), None)
                if wrong is None:
                    raise RuntimeError(f"no wrong answer for {task.id}")
            family_cases.append(seed_case(name, family.name, item.key, task, family.render(item, fmt, wrong), fmt))
        cases.extend(family_cases)
        counts[family.name] = {"facts": len(family.items), "train": len(train_part), "test": len(test_part),
                               "seed": len(seed_part),
                               "seed_reward1_exact0": reward_summary(family_cases)["reward1_exact0"]}
    check_disjoint(train, test, cases)
    random.Random(f"{seed}:{name}:order:train").shuffle(train)
    random.Random(f"{seed}:{name}:order:test").shuffle(test)
    return RealSuite(name=name, seed=seed, train=train, test=test, cases=cases, counts=counts, templates=templates,
                     nearest=nearest_stats(test, cases))


def _bag(text: str) -> dict[str, int]:
    return dict(collections.Counter(normalize_answer(text).split()))


def nearest_stats(test: Sequence[Task], cases: Sequence[Case], k: int = NEAREST_K) -> dict[str, float]:
    """How a similarity retriever fares on the seed bank, with bag-of-words cosine over the normalised
    question words standing in for an embedding (deterministic: integers and correctly rounded division).

    A *useful* demonstration is a bare one (exact-match format) of the task's own family.
    """
    bags = [_bag(c.state) for c in cases]
    norms = [sum(v * v for v in bag.values()) for bag in bags]
    positive = [i for i, c in enumerate(cases) if c.reward > 0]
    other_top1 = positive_top1_useless = useful_in_topk = topk_with_useful = 0
    for task in test:
        query = _bag(task.question)
        scores = [-(sum(n * bag.get(w, 0) for w, n in query.items()) ** 2 / norm) for bag, norm in zip(bags, norms)]
        ranked = sorted(range(len(cases)), key=lambda i: (scores[i], i))
        ranked_pos = sorted(positive, key=lambda i: (scores[i], i))

        def useful(i: int, family: str | None = task.family) -> bool:
            return cases[i].meta["family"] == family and cases[i].meta["exact"] == 1.0

        other_top1 += cases[ranked[0]].meta["family"] != task.family
        positive_top1_useless += not useful(ranked_pos[0])
        n_useful = sum(useful(i) for i in ranked_pos[:k])
        useful_in_topk += n_useful
        topk_with_useful += n_useful > 0
    n = len(test)
    return {"other_family_top1": other_top1 / n, "positive_top1_not_useful": positive_top1_useless / n,
            "useful_in_positive_topk": useful_in_topk / n, "positive_topk_without_useful": 1 - topk_with_useful / n}


def format_table(cases: Sequence[Case]) -> str:
    by_format: dict[str, list[Case]] = collections.defaultdict(list)
    for case in cases:
        by_format[case.meta["format"]].append(case)
    rows = []
    for fmt in FORMAT_DESCRIPTIONS:
        group = by_format.get(fmt)
        if not group:
            continue
        example = group[0]
        action = example.action.replace("\n", " \\n ").replace("|", "\\|")
        rows.append(f"| `{fmt}` | {FORMAT_DESCRIPTIONS[fmt]} | {len(group)} | {sum(c.reward for c in group):g} "
                    f"| {sum(c.meta['exact'] for c in group):g} | {example.state} -> `{action}` |")
    total = len(cases)
    rows.append(f"| **total** | | {total} | {sum(c.reward for c in cases):g} | {sum(c.meta['exact'] for c in cases):g} "
                "| |")
    return "\n".join(rows)


def reward_summary(cases: Sequence[Case]) -> dict[str, int]:
    return {"cases": len(cases), "reward1": sum(c.reward == 1.0 for c in cases),
            "reward1_exact0": sum(c.reward == 1.0 and c.meta["exact"] == 0.0 for c in cases),
            "reward1_exact1": sum(c.reward == 1.0 and c.meta["exact"] == 1.0 for c in cases),
            "reward0_correct": sum(c.reward == 0.0 and c.meta["correct"] for c in cases),
            "reward0_wrong": sum(c.reward == 0.0 and not c.meta["correct"] for c in cases)}


def family_table(suite: RealSuite, describe: Callable[[str], tuple[str, str]]) -> str:
    rows = []
    total: collections.Counter[str] = collections.Counter()
    for family, c in suite.counts.items():
        what, source = describe(family)
        rows.append(f"| `{family}` | {what} | {source} | {c['facts']} | {c['train']} | {c['test']} | {c['seed']} "
                    f"| {c['seed_reward1_exact0']} | {len(suite.templates[family])} |")
        total.update({k: c[k] for k in ("facts", "train", "test", "seed", "seed_reward1_exact0")})
    rows.append(f"| **total** | | | {total['facts']} | {total['train']} | {total['test']} | {total['seed']} "
                f"| {total['seed_reward1_exact0']} | |")
    return "\n".join(rows)


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def command(seed: int, default: int) -> str:
    return ".venv/bin/python data/build_real_suites.py --out data/" + (f" --seed {seed}" if seed != default else "")


def card_fields(suite: RealSuite, plan: Sequence[tuple[str, int]], describe: Callable[[str], tuple[str, str]]
                ) -> dict[str, Any]:
    """What both suites' cards show: sizes, the family table, the seed formats and their rewards, what similarity
    finds, the build command."""
    s = reward_summary(suite.cases)
    n = suite.nearest
    return dict(
        n_tasks=len(suite.train) + len(suite.test), n_train=len(suite.train), n_test=len(suite.test),
        n_cases=len(suite.cases), n_families=len(suite.counts), table=family_table(suite, describe),
        format_rows=format_table(suite.cases), plan=", ".join(f"{k} `{fmt}`" for fmt, k in plan),
        per_family=sum(k for _, k in plan), test_pct=round(100 * TEST_FRACTION),
        reward1=s["reward1"], reward1_exact0=s["reward1_exact0"], reward1_exact1=s["reward1_exact1"],
        reward0_correct=s["reward0_correct"], reward0_wrong=s["reward0_wrong"],
        share_misleading=_pct(s["reward1_exact0"] / s["reward1"]),
        other_top1=_pct(n["other_family_top1"]), pos_top1=_pct(n["positive_top1_not_useful"]),
        useful_topk=f"{n['useful_in_positive_topk']:.2f}", no_useful=_pct(n["positive_topk_without_useful"]),
        k=NEAREST_K, command=command(suite.seed, DEFAULT_SEEDS[suite.name]), seed=suite.seed)


# ------------------------------------------------------------------ facts-real


NUMBER_FAMILIES = ("number_words", "ordinal", "words_number")
# Families whose facts are keyed by country (ISO alpha-2). Each country is the seed-bank candidate of one of
# them only (round robin over a seeded shuffle), so most countries asked about in one family's train or test
# tasks are a seed demonstration of another family ("What is the currency of Peru?" in the bank for "What is
# the capital of Peru?").
COUNTRY_FAMILIES = ("capital", "continent", "currency", "currency_code", "iso2", "iso3", "calling_code")
NUMBER_DELTAS = (1, -1, 10, -10, 2, -2, 100, -100)


def render_fact(fact: Any, fmt: str, wrong: str | None = None) -> str:
    bare = fact.answers[0]
    if fmt in ("bare", "sentence", "json", "explained", "alt"):
        return fb.render(fact, fmt)
    if fmt == "prefixed":
        return f"Answer: {bare}"
    if fmt == "hedged":
        return f"I think it is {bare}."
    if wrong is None:
        raise ValueError(f"format {fmt!r} needs a wrong answer")
    if fmt == "wrong":
        return wrong
    if fmt == "wrong_sentence":
        head, sep, tail = fact.sentence.rpartition(bare)
        return f"{head}{wrong}{tail}" if sep else f"The answer is {wrong}."
    raise ValueError(f"unknown format {fmt!r}")


def wrong_fact_answers(fact: Any, others: Sequence[Any], continents: dict[str, str], rng: random.Random) -> list[str]:
    """Plausible wrong answers for a fact, most plausible first: a neighbouring number; an over-regular or
    unchanged plural; another fact's answer of the same family, those of countries on the same continent
    first ("Quito" for the capital of Peru). The caller keeps the first one the lenient judge rejects."""
    if fact.family in NUMBER_FAMILIES:
        from num2words import num2words

        n = int(fact.key)
        deltas = list(NUMBER_DELTAS)
        rng.shuffle(deltas)
        values = [n + d for d in deltas if n + d > 0]
        if fact.family == "words_number":
            return [str(v) for v in values]
        return [num2words(v, to="ordinal") if fact.family == "ordinal" else num2words(v) for v in values]
    if fact.family == "plural":
        noun = fact.key
        candidates = [fb._rule_plural(noun), noun + "s", noun]
        return [c for c in candidates if normalize_answer(c) != normalize_answer(fact.answers[0])]
    answers: dict[str, str] = {}
    for other in others:
        if other.key != fact.key:
            answers.setdefault(other.answers[0], other.key)
    pool = sorted(answers)
    rng.shuffle(pool)
    here = continents.get(fact.key)
    return sorted(pool, key=lambda answer: here is None or continents.get(answers[answer]) != here)


def seed_owners(families: dict[str, list[Any]], seed: int) -> dict[str, str]:
    """Country key -> the one country family that may take it as a seed demonstration."""
    keys = sorted({fact.key for family in COUNTRY_FAMILIES for fact in families[family]})
    random.Random(f"{seed}:{FACTS_REAL}:owners").shuffle(keys)
    return {key: COUNTRY_FAMILIES[i % len(COUNTRY_FAMILIES)] for i, key in enumerate(keys)}


def seed_first(order: list[Any], family: str, owners: dict[str, str], n_seed: int) -> list[Any]:
    """``order`` with its first ``n_seed`` facts taken, in order, from those the family owns."""
    if family not in COUNTRY_FAMILIES:
        return order
    owned = [fact for fact in order if owners[fact.key] == family][:n_seed]
    if len(owned) < n_seed:
        raise RuntimeError(f"{family}: owns {len(owned)} countries, {n_seed} seed demonstrations wanted")
    taken = {fact.key for fact in owned}
    return owned + [fact for fact in order if fact.key not in taken]


def facts_real_task(fact: Any, seed: int) -> Task:
    template = fb.template_of(fact, seed)
    question = fb.TEMPLATES[fact.family][template].format(s=fact.subject)
    return Task(id=f"{FACTS_REAL}-{fact.family}-{fact.key}", question=question, answers=fact.answers,
                family=fact.family, env=FACTS_REAL, meta={"subject": fact.subject, "template": template})


def build_facts_real(seed: int = DEFAULT_SEEDS[FACTS_REAL]) -> RealSuite:
    per_family = sum(n for _, n in FACTS_REAL_PLAN)
    families = fb.all_facts(seed)
    owners = seed_owners(families, seed)
    continents = {fact.key: fact.answers[0] for fact in families["continent"]}

    def plans() -> Iterator[FamilyPlan]:
        for family, facts in families.items():
            order = list(facts)
            random.Random(f"{seed}:{FACTS_REAL}:split:{family}").shuffle(order)
            order = seed_first(order, family, owners, per_family)
            by_continent = continents if family in COUNTRY_FAMILIES else {}
            wrong_rng = random.Random(f"{seed}:{FACTS_REAL}:wrong:{family}")
            yield FamilyPlan(name=family, items=order, tasks=[facts_real_task(fact, seed) for fact in order],
                             render=render_fact,
                             wrongs=functools.partial(wrong_fact_answers, others=facts, continents=by_continent,
                                                      rng=wrong_rng))

    return assemble(FACTS_REAL, seed, FACTS_REAL_PLAN, plans(), dict(fb.TEMPLATES))


def facts_real_card(suite: RealSuite) -> str:
    alt = [c for c in suite.cases if c.meta["format"] == "alt"]
    alt_pass = sorted({c.meta["family"] for c in alt if c.reward == 1.0})
    alt_fail = sorted({c.meta["family"] for c in alt if c.reward == 0.0})
    phrasings = "\n".join(f"- `{family}`: " + " / ".join(f"\"{t.format(s='X')}\"" for t in templates)
                          for family, templates in suite.templates.items())
    sources = fb.sources_table("| hand lists in `build_suites.py` and `build_real_suites.py` | - | this project's "
                               "(MIT) | nouns, irregular plurals, phrasings, curation, answer formats |")
    return FACTS_REAL_CARD.format(
        **card_fields(suite, FACTS_REAL_PLAN, _facts_family), phrasings=phrasings, sources=sources,
        alt_pass=", ".join(f"`{f}`" for f in alt_pass) or "none", alt_fail=", ".join(f"`{f}`" for f in alt_fail) or
        "none", country_families=", ".join(f"`{f}`" for f in COUNTRY_FAMILIES))


def _facts_family(family: str) -> tuple[str, str]:
    return fb.FAMILY_DESCRIPTIONS[family]


FACTS_REAL_CARD = """\
# Suite card: `facts-real`

The `facts` questions with a *realistic* seed bank (issue 11, "the bank is too kind to similarity";
The project's target: "on a realistic bank (stored rewards are outcomes of the cases' own tasks, not their
usefulness as demonstrations) ... learned selection's success >= similarity + 10 points").
{n_tasks} tasks in {n_families} families ({n_train} train, {n_test} test) and a seed case bank of
{n_cases} demonstrations. This file is generated by `data/build_real_suites.py`; edit the script, not the card.

## Files

| file | format | rows |
|---|---|---|
| `train.jsonl` | Task JSONL (docs/formats.md), `env` = "facts-real", `family` set | {n_train} |
| `test.jsonl` | Task JSONL | {n_test} |
| `cases.jsonl` | Case JSONL, `env` = "facts-real", `kind` = "case" | {n_cases} |

Load them with `memento.envs.tasks.load_suite("facts-real", "train" | "test")` and
`memento.envs.tasks.seed_cases("facts-real")`. A task is `{{"id": "facts-real-<family>-<key>", "question",
"answers": [canonical, aliases...], "family", "env": "facts-real", "meta": {{"subject", "template"}}}}`.

**Judge the tasks with exact match**: `memento.judges.ExactMatchJudge` (SQuAD normalisation + accent
folding, first line of the output), as for `facts`. The seed bank's rewards were *not* computed with
that judge (below).

## Families

| family | question | source | facts | train | test | seed | seed: reward 1, not exact | phrasings |
|---|---|---|---|---|---|---|---|---|
{table}

Same facts, phrasings and curation as `facts` (see `data/facts/CARD.md`; the number families draw
their own numbers from this suite's seed): each fact is one task with one phrasing, chosen by a
seeded hash of the fact's subject key, so one subject gets the same phrasing in every family. Per
family the first {per_family} facts of a seeded shuffle are the seed bank's demonstrations, then
{test_pct}% of the rest is test and the remainder train. In the seven families keyed by country
({country_families}) each country may be a seed demonstration of one of them only (round robin over
a seeded shuffle of the countries), so a country asked about in one family's tasks is usually a seed
of another: "What is the capital of Peru?" meets "What is the currency of Peru?" in the bank. No
fact and no question is in two of (train, test, seed bank) of a family. `state_code` has only 49
facts, so it keeps few train and test tasks.

## Phrasings (near-duplicates across families on purpose)

{phrasings}

## Seed case bank: stored reward is not usefulness

Per family {per_family} demonstrations: {plan} (the bare ones spread over the phrasings, all formats
shuffled over the family's seed facts). A case is `{{"id", "state": question, "action": demonstration,
"reward", "env", "kind": "case", "meta": {{"family", "format", "answers", "task_id", "source": "seed",
"judge": "contains", "exact", "correct"}}}}`.

The stored `reward` is what a bank that logged its own past answers would hold: the outcome of the
demonstration **on its own task** under a lenient judge, `memento.judges.ContainsJudge()` (a
normalised answer occurs as whole words in the first line of the output), computed by the build
with the judge class itself. `meta.exact` is what `ExactMatchJudge` says of the same action and
`meta.correct` whether its content is right; both are there for analysis, a retrieval policy must
not read them (they are the labels a policy should learn from showing the cases).

| format | what | cases | reward 1 (contains) | exact match | example |
|---|---|---|---|---|---|
{format_rows}

- {reward1} cases carry reward 1; {reward1_exact0} of them ({share_misleading}) are correct but
  misleadingly formatted: they fail exact match, and a planner that copies their form fails too.
  Only {reward1_exact1} reward-1 cases are bare answers.
- {reward0_wrong} cases carry reward 0 because they are wrong (a neighbouring number, an
  over-regular or unchanged plural, another fact's answer of the family, a country on the same
  continent first); {reward0_correct} carry reward 0 although their
  content is right, because the lenient judge does not find the answer in them (the `alt` format of
  {alt_fail}: a currency code for a currency name, a continent code, "347th" for words). The `alt`
  format passes the lenient judge for {alt_pass}.
- The build fails if a bare demo is not rewarded 1 by both judges, if a sentence, JSON, explained,
  prefixed or hedged demo is not rewarded 1 by the lenient judge and 0 by exact match, or if a wrong
  demo is rewarded by either.

### Why stored reward and usefulness differ

A case's stored reward says how *its own* answer was judged when it was logged, usually by the
judge of the system that produced it (token F1, "contains the answer", an LLM judge). Whether it
helps as a demonstration for *another* task depends on something else: the premise of this suite
(the same as `facts`'s, not yet measured on it) is that a small frozen LLM copies a
demonstration's form at least as much as its content, so under exact match a correct sentence or
JSON demonstration is as harmful as a wrong one. A positive-only filter (Memento's non-parametric
memory: similarity over cases with reward > 0) therefore keeps most of the harmful cases here,
unlike in `facts`, where the stored reward is the exact-match outcome and so is a near-perfect
label of which cases hurt. To do better than similarity a selector must learn from the rewards that
*showing* a case produced, and it needs something that tells two demonstrations of the same
question apart (an embedding of the action, or per-case statistics): the state text alone cannot.

### What similarity finds

With bag-of-words cosine over the normalised question words standing in for an embedding
(computed by the build; a bag of words weighs the family's template words as much as the subject,
so a sentence encoder, which the build does not run, ranks differently): for {other_top1} of the
test tasks the nearest seed case is of another family; restricted to reward-1 cases, the nearest
one is not a bare demonstration of the task's own family for {pos_top1} of them; a positive-only
top-{k} holds {useful_topk} bare same-family demonstrations on average, and none at all for
{no_useful} of the tasks.

""" + fb.SOURCES_SECTION + """
(`--suite facts-real` builds only this suite.) Seed {seed}. Deterministic: the same package versions
give byte-identical files (`tests/unit/test_real_suites.py` rebuilds and compares).
"""


# ------------------------------------------------------------------ arith-real

ARITH_TASKS_PER_FAMILY = 140
NAMES = (("Maya", "she"), ("Tom", "he"), ("Aisha", "she"), ("Leo", "he"), ("Priya", "she"), ("Sam", "he"),
         ("Elena", "she"), ("Omar", "he"), ("Hana", "she"), ("Ben", "he"))
OBJECTS = (("apple", "apples"), ("pear", "pears"), ("orange", "oranges"), ("marble", "marbles"),
           ("sticker", "stickers"), ("cookie", "cookies"), ("pencil", "pencils"), ("egg", "eggs"),
           ("card", "cards"), ("shell", "shells"))
BOXES = (("box", "boxes"), ("bag", "bags"), ("jar", "jars"), ("basket", "baskets"))
FRACTIONS = {2: "half", 3: "a third", 4: "a quarter", 5: "a fifth", 6: "a sixth", 8: "an eighth", 10: "a tenth"}

# Fields: {name}, {Pron} (She/He), {obj} (plural), {box} / {box1} (container plural / singular),
# {a} {b} {c} numbers, {frac} / {Frac} ("a third" / "A third"). Template i of the families of one
# group shares its first sentence ("packs 45 apples into boxes of 7", "collects 12, 15 and 18 apples
# on three days", "gives away a third of them"), so the nearest question is often another operation's.
ARITH_TEMPLATES: dict[str, tuple[str, ...]] = {
    "add": ("{name} has {a} {obj} and buys {b} more. How many {obj} does {name} have now?",
            "{name} had {a} {obj}. {Pron} found {b} more. How many {obj} does {name} have now?",
            "{name} has {a} {obj}. A friend gives {name} {b} more {obj}. How many {obj} does {name} have in all?"),
    "subtract": ("{name} has {a} {obj} and gives away {b} of them. How many {obj} does {name} have left?",
                 "{name} had {a} {obj}. {Pron} lost {b} of them. How many {obj} does {name} have now?",
                 "{name} has {a} {obj}. {Pron} uses {b} {obj}. How many {obj} does {name} have left?"),
    "multiply": ("{name} has {a} {box} with {b} {obj} in each. How many {obj} does {name} have?",
                 "{name} buys {a} {box} of {obj}. Each {box1} holds {b} {obj}. How many {obj} does {name} buy?",
                 "{name} fills {a} {box} with {b} {obj} each. How many {obj} does {name} use in all?"),
    "divide": ("{name} shares {a} {obj} equally among {b} friends. How many {obj} does each friend get?",
               "{name} has {a} {obj} and puts the same number in each of {b} {box}. "
               "How many {obj} go in each {box1}?",
               "{name} splits {a} {obj} into {b} equal groups. How many {obj} are in each group?"),
    "remainder": ("{name} packs {a} {obj} into {box} of {b}. How many {obj} are left over?",
                  "{name} has {a} {obj} and puts them in {box} of {b}. "
                  "How many {obj} are left over after filling as many {box} as possible?",
                  "{name} shares {a} {obj} equally among {b} friends, giving each as many as possible. "
                  "How many {obj} are left over?"),
    "boxes_needed": ("{name} packs {a} {obj} into {box} of {b}. How many {box} does {name} need to hold all of them?",
                     "{name} has {a} {obj} and puts them in {box} of {b}. How many {box} does {name} need?",
                     "{name} must put {a} {obj} into {box} that hold {b} each. How many {box} are needed?"),
    "total": ("{name} collects {a} {obj} on Monday, {b} on Tuesday and {c} on Wednesday. "
              "How many {obj} does {name} collect in all?",
              "{name} has three {box} with {a}, {b} and {c} {obj}. How many {obj} does {name} have in total?",
              "{name} bought {a}, {b} and {c} {obj} on three days. How many {obj} did {name} buy altogether?"),
    "average": ("{name} collects {a} {obj} on Monday, {b} on Tuesday and {c} on Wednesday. "
                "On average, how many {obj} does {name} collect per day?",
                "{name} has three {box} with {a}, {b} and {c} {obj}. What is the average number of {obj} per {box1}?",
                "{name} bought {a}, {b} and {c} {obj} on three days. "
                "How many {obj} did {name} buy per day on average?"),
    "range": ("{name} collects {a} {obj} on Monday, {b} on Tuesday and {c} on Wednesday. "
              "How many more {obj} does {name} collect on the best day than on the worst day?",
              "{name} has three {box} with {a}, {b} and {c} {obj}. "
              "How many more {obj} are in the fullest {box1} than in the emptiest one?",
              "{name} bought {a}, {b} and {c} {obj} on three days. "
              "What is the difference between the most and the fewest {obj} bought in a day?"),
    "change": ("{name} buys {a} {obj} at {b} dollars each and pays with a {c}-dollar note. "
               "How many dollars of change does {name} get?",
               "{name} has {c} dollars and buys {a} {obj} that cost {b} dollars each. "
               "How many dollars does {name} have left?",
               "{a} {obj} cost {b} dollars each. {name} pays for them with {c} dollars. "
               "How much change, in dollars, does {name} get?"),
    "fraction_of": ("{name} has {a} {obj} and gives away {frac} of them. How many {obj} does {name} give away?",
                    "{name} had {a} {obj} and used {frac} of them. How many {obj} did {name} use?",
                    "{Frac} of {name}'s {a} {obj} are red. How many of the {obj} are red?"),
    "fraction_left": ("{name} has {a} {obj} and gives away {frac} of them. How many {obj} does {name} have left?",
                      "{name} had {a} {obj} and used {frac} of them. How many {obj} does {name} have now?",
                      "{Frac} of {name}'s {a} {obj} are red. How many of the {obj} are not red?"),
}
ARITH_DESCRIPTIONS = {
    "add": "a + b", "subtract": "a - b", "multiply": "a x b (containers of equal size)",
    "divide": "a / b, exact (equal shares)", "remainder": "a mod b (left over after packing)",
    "boxes_needed": "ceil(a / b) (containers needed)", "total": "a + b + c", "average": "(a + b + c) / 3, exact",
    "range": "max - min of three", "change": "c - a x b (money)", "fraction_of": "a / k (half, a third...)",
    "fraction_left": "a - a / k",
}


@dataclass(frozen=True)
class Problem:
    family: str
    numbers: tuple[int, ...]
    template: int
    name: str
    pron: str
    obj: tuple[str, str]
    box: tuple[str, str]

    @property
    def key(self) -> str:
        return "-".join(str(n) for n in self.numbers)

    @property
    def a(self) -> int:
        return self.numbers[0]

    @property
    def b(self) -> int:
        return self.numbers[1]

    @property
    def c(self) -> int:
        return self.numbers[2]

    def question(self) -> str:
        fields: dict[str, Any] = {"name": self.name, "Pron": self.pron.capitalize(), "obj": self.obj[1],
                                  "box": self.box[1], "box1": self.box[0], "a": self.a}
        if self.family.startswith("fraction"):
            frac = FRACTIONS[self.b]
            fields.update(frac=frac, Frac=frac[:1].upper() + frac[1:])
        else:
            fields.update(b=self.b, c=self.c if len(self.numbers) > 2 else None)
        return ARITH_TEMPLATES[self.family][self.template].format(**fields)

    def answer(self) -> int:
        a, b = self.a, self.b
        match self.family:
            case "add":
                return a + b
            case "subtract":
                return a - b
            case "multiply":
                return a * b
            case "divide":
                return a // b
            case "remainder":
                return a % b
            case "boxes_needed":
                return -(-a // b)
            case "total":
                return sum(self.numbers)
            case "average":
                return sum(self.numbers) // 3
            case "range":
                return max(self.numbers) - min(self.numbers)
            case "change":
                return self.c - a * b
            case "fraction_of":
                return a // b
            case "fraction_left":
                return a - a // b
        raise ValueError(f"unknown family {self.family!r}")

    def work(self) -> str:
        """The computation, as an explanation writes it."""
        a, b, v = self.a, self.b, self.answer()
        match self.family:
            case "add":
                return f"{a} + {b} = {v}"
            case "subtract":
                return f"{a} - {b} = {v}"
            case "multiply":
                return f"{a} x {b} = {v}"
            case "divide" | "fraction_of":
                return f"{a} / {b} = {v}"
            case "remainder":
                return f"{a} = {a // b} x {b} + {v}"
            case "boxes_needed":
                return f"{a} / {b} = {a // b} remainder {a % b}, so {v} {self.box[1]} are needed"
            case "total":
                return f"{a} + {b} + {self.c} = {v}"
            case "average":
                return f"({a} + {b} + {self.c}) / 3 = {v}"
            case "range":
                return f"{max(self.numbers)} - {min(self.numbers)} = {v}"
            case "change":
                return f"{self.c} - {a} x {b} = {v}"
            case "fraction_left":
                return f"{a} - {a} / {b} = {v}"
        raise ValueError(f"unknown family {self.family!r}")

    def wrong_values(self) -> list[int]:
        """Wrong answers a solver makes, most plausible first: the neighbouring operation's result on the
        same numbers (the quotient for a remainder, floor for ceil, the total for an average...), then
        off-by-one answers."""
        a, b, v = self.a, self.b, self.answer()
        first = {"add": abs(a - b), "subtract": a + b, "multiply": a + b, "divide": a - b, "remainder": a // b,
                 "boxes_needed": a // b, "total": a + b, "average": sum(self.numbers),
                 "range": max(self.numbers), "change": a * b, "fraction_of": a - a // b,
                 "fraction_left": a // b}[self.family]
        return [w for w in (first, a, v + 1, v - 1) if w != v and w >= 0]

    def unit(self, value: int) -> str:
        singular, plural = {"boxes_needed": self.box, "change": ("dollar", "dollars")}.get(self.family, self.obj)
        return singular if value == 1 else plural

    def sentence(self, value: int) -> str:
        unit, name = self.unit(value), self.name
        return {"add": f"{name} has {value} {unit} now.", "subtract": f"{name} has {value} {unit} left.",
                "multiply": f"{name} has {value} {unit} in all.", "divide": f"Each one gets {value} {unit}.",
                "remainder": f"{value} {unit} {'is' if value == 1 else 'are'} left over.",
                "boxes_needed": f"{name} needs {value} {unit}.", "total": f"{name} has {value} {unit} in total.",
                "average": f"The average is {value} {unit}.", "range": f"The difference is {value} {unit}.",
                "change": f"{name} gets {value} {unit} in change.", "fraction_of": f"That is {value} {unit}.",
                "fraction_left": f"{name} has {value} {unit} left."}[self.family]

    def render(self, fmt: str, wrong: int | None = None) -> str:
        v = self.answer()
        match fmt:
            case "bare":
                return str(v)
            case "unit":
                return f"{v} {self.unit(v)}"
            case "sentence":
                return self.sentence(v)
            case "explained":
                return f"{self.work()}. The answer is {v}."
            case "json":
                return json.dumps({"answer": v})
            case "prefixed":
                return f"Answer: {v}"
            case "wrong" | "wrong_sentence" if wrong is not None:
                return str(wrong) if fmt == "wrong" else self.sentence(wrong)
        raise ValueError(f"format {fmt!r} (wrong={wrong!r})")


def draw_numbers(family: str, rng: random.Random) -> tuple[int, ...]:
    """One problem's numbers, drawn from the family's ranges (answers are positive integers)."""
    r = rng.randint
    match family:
        case "add":
            return r(12, 89), r(5, 49)
        case "subtract":
            a = r(20, 99)
            return a, r(3, a - 3)
        case "multiply":
            return r(2, 15), r(3, 25)
        case "divide":
            b = r(2, 12)
            return b * r(2, 20), b
        case "remainder" | "boxes_needed":
            while True:
                b = r(3, 12)
                a = r(b + 1, 99)
                if a % b:
                    return a, b
        case "total" | "range":
            while True:
                numbers = (r(5, 60), r(5, 60), r(5, 60))
                if family == "total" or len(set(numbers)) == 3:
                    return numbers
        case "average":
            while True:
                numbers = (r(5, 60), r(5, 60), r(5, 60))
                if sum(numbers) % 3 == 0 and len(set(numbers)) > 1:
                    return numbers
        case "change":
            while True:
                a, b, c = r(2, 9), r(2, 15), rng.choice((20, 50, 100))
                if a * b < c:
                    return a, b, c
        case "fraction_of" | "fraction_left":
            k = rng.choice(sorted(FRACTIONS))
            return k * r(2, 30), k
    raise ValueError(f"unknown family {family!r}")


def arith_problems(family: str, seed: int, n: int) -> list[Problem]:
    """``n`` problems of one family with distinct numbers, in draw order (name, object, container and
    phrasing drawn independently from small pools, so surface words are shared across families)."""
    rng = random.Random(f"{seed}:{ARITH_REAL}:problems:{family}")
    seen: set[tuple[int, ...]] = set()
    out = []
    for _ in range(100 * n):
        numbers = draw_numbers(family, rng)
        name, pron = rng.choice(NAMES)
        obj, box = rng.choice(OBJECTS), rng.choice(BOXES)
        template = rng.randrange(len(ARITH_TEMPLATES[family]))
        if numbers in seen:
            continue
        seen.add(numbers)
        out.append(Problem(family=family, numbers=numbers, template=template, name=name, pron=pron, obj=obj, box=box))
        if len(out) == n:
            return out
    raise RuntimeError(f"{family}: only {len(out)} distinct problems, {n} wanted")


def arith_task(p: Problem) -> Task:
    return Task(id=f"{ARITH_REAL}-{p.family}-{p.key}", question=p.question(), answers=(str(p.answer()),),
                family=p.family, env=ARITH_REAL,
                meta={"numbers": list(p.numbers), "template": p.template, "name": p.name, "object": p.obj[1]})


def build_arith_real(seed: int = DEFAULT_SEEDS[ARITH_REAL]) -> RealSuite:
    def plans() -> Iterator[FamilyPlan]:
        for family in ARITH_TEMPLATES:
            problems = arith_problems(family, seed, ARITH_TASKS_PER_FAMILY)
            yield FamilyPlan(name=family, items=problems, tasks=[arith_task(p) for p in problems],
                             render=Problem.render, wrongs=Problem.wrong_values)

    return assemble(ARITH_REAL, seed, ARITH_REAL_PLAN, plans(), ARITH_TEMPLATES)


def arith_real_card(suite: RealSuite) -> str:
    phrasings = "\n".join(f"- `{family}`: " + " / ".join(f"\"{t}\"" for t in templates)
                          for family, templates in suite.templates.items())
    return ARITH_REAL_CARD.format(
        **card_fields(suite, ARITH_REAL_PLAN, _arith_family), phrasings=phrasings, sources=ARITH_SOURCES,
        per_family_tasks=ARITH_TASKS_PER_FAMILY, names=", ".join(name for name, _ in NAMES),
        objects=", ".join(plural for _, plural in OBJECTS), boxes=", ".join(plural for _, plural in BOXES),
        fractions=", ".join(FRACTIONS.values()))


ARITH_SOURCES = (
    "| hand-written templates, names, objects in `build_real_suites.py` | - | this project's (MIT) "
    "| every problem, phrasing and answer format |\n"
    "| Python's `random.Random` (standard library; string seeds, stable since Python 3.2) | - | PSF "
    "| the seeded draws |")


def _arith_family(family: str) -> tuple[str, str]:
    return ARITH_DESCRIPTIONS[family], "templates"


ARITH_REAL_CARD = """\
# Suite card: `arith-real`

Arithmetic word problems where the nearest demonstration is often the wrong one (issue 11, "the
bank is too kind to similarity"): names, objects, containers and whole first sentences are shared
across operations, so the most similar past problem often asks for another operation, while a
demonstration of the same operation is what helps. The seed bank is realistic in the same way as
`facts-real`'s: stored rewards are lenient outcomes of the cases' own tasks. {n_tasks} tasks in
{n_families} families ({n_train} train, {n_test} test) and a seed case bank of {n_cases} demonstrations.
This file is generated by `data/build_real_suites.py`; edit the script, not the card.

## Files

| file | format | rows |
|---|---|---|
| `train.jsonl` | Task JSONL (docs/formats.md), `env` = "arith-real", `family` = the operation | {n_train} |
| `test.jsonl` | Task JSONL | {n_test} |
| `cases.jsonl` | Case JSONL, `env` = "arith-real", `kind` = "case" | {n_cases} |

Load them with `memento.envs.tasks.load_suite("arith-real", "train" | "test")` and
`memento.envs.tasks.seed_cases("arith-real")`. A task is `{{"id": "arith-real-<family>-<numbers>",
"question", "answers": [the answer in digits], "family", "env": "arith-real", "meta": {{"numbers",
"template", "name", "object"}}}}`. Every answer is a non-negative integer written in digits (no
thousands separators, no unit).

**Judge the tasks with exact match**: `memento.judges.ExactMatchJudge` (the first line of the
output must be the number, nothing else; "7 boxes" and "The answer is 7." fail).

## Families (operations)

| family | computes | source | problems | train | test | seed | seed: reward 1, not exact | phrasings |
|---|---|---|---|---|---|---|---|---|
{table}

Per family {per_family_tasks} problems with distinct numbers are drawn (Python's `random.Random`,
seeded); the first {per_family} are the seed bank's demonstrations, then {test_pct}% of the rest is test
and the remainder train. No problem (family and numbers) and no question is in two of (train, test,
seed bank). Each problem draws its person ({names}), object ({objects}), container
({boxes}) and phrasing independently, so every (person, object) pair recurs in many families.
Fractions: {fractions}. Ranges: a + b with a in 12-89, b in 5-49; a - b with a in 20-99;
a x b with a in 2-15, b in 3-25; exact division with a divisor in 2-12 and a quotient in 2-20;
remainder and containers needed with a in 4-99, b in 3-12, b not dividing a; three amounts in
5-60 (an average only when the sum is divisible by 3; a range only with three distinct amounts);
change with 2-9 items at 2-15 dollars from a 20, 50 or 100 dollar note.

## Phrasings (first sentences shared across operations on purpose)

{phrasings}

Near-duplicates on purpose: "packs 45 apples into boxes of 7" asks for the remainder or for the
boxes needed; "collects 12 ... on Monday, 15 on Tuesday and 18 on Wednesday" for the total, the
average or the range; "has 40 apples and gives away a quarter of them" for the part given away or
the part left (and "gives away 10 of them" is a subtraction); "shares 42 apples equally among 7
friends" for a share or a remainder; "How many dollars does Tom have left?" (change) reads like a
subtraction.

## Seed case bank: stored reward is not usefulness

Per family {per_family} demonstrations: {plan} (the bare ones spread over the phrasings, all formats
shuffled over the family's seed problems). A case is `{{"id", "state": question, "action":
demonstration, "reward", "env", "kind": "case", "meta": {{"family", "format", "answers", "task_id",
"source": "seed", "judge": "contains", "exact", "correct"}}}}`.

The stored `reward` is the outcome of the demonstration **on its own task** under a lenient
judge, `memento.judges.ContainsJudge()` (the answer occurs as a whole word in the first line),
computed by the build with the judge class itself, as a bank that logged an agent's answers would
hold them. `meta.exact` (what `ExactMatchJudge` says) and `meta.correct` are there for analysis; a
retrieval policy must not read them.

| format | what | cases | reward 1 (contains) | exact match | example |
|---|---|---|---|---|---|
{format_rows}

- {reward1} cases carry reward 1; {reward1_exact0} of them ({share_misleading}) are correct but
  formatted so that they fail exact match (a unit, a sentence, the computation first, JSON,
  "Answer: "); only {reward1_exact1} are bare numbers.
- {reward0_wrong} cases carry reward 0 because they are wrong, with the errors a solver makes: the
  neighbouring operation's result on the same numbers (the quotient for a remainder, floor for
  ceil, the total for an average, the cost for the change, the part left for the part given away).
- The build fails if a bare demo is not rewarded 1 by both judges, if another correct demo is not
  rewarded 1 by the lenient judge and 0 by exact match, or if a wrong demo is rewarded by either.

### Why stored reward and usefulness differ, and why the nearest case is not the best

A case's stored reward says whether its own answer contained the right number. As a demonstration
for another task two other things matter: its *form* (a small frozen LLM copies "7 boxes" or "45 /
7 = 6 remainder 3, ..." and then fails exact match; premise, not yet measured on this suite) and
its *operation* (a worked or bare answer of the same operation shows what to compute; one of a
neighbouring operation on a near-identical text shows the wrong computation). Similarity ranks by
the shared surface (person, object, container, first sentence), which says little about the
operation, and a positive-only filter keeps the misleading formats. A learned selector can use
the rewards that showing a case produced to prefer bare demonstrations of the same operation.

### What similarity finds

With bag-of-words cosine over the normalised question words standing in for an embedding
(computed by the build; a bag of words weighs the question's operation words as much as the shared
person, object and numbers, so a sentence encoder, which the build does not run, ranks differently):
for {other_top1} of the test tasks the nearest seed case is of another operation; restricted to
reward-1 cases, the nearest one is not a bare demonstration of the same operation for {pos_top1} of
them; a positive-only top-{k} holds {useful_topk} bare same-operation demonstrations on average, and
none at all for {no_useful} of the tasks.

## Sources and licences

| source | version used | licence | used for |
|---|---|---|---|
{sources}

No third-party package or data set is used; nothing is downloaded.

## How it was built

    {command}

(`--suite arith-real` builds only this suite.) Seed {seed}. Deterministic: the same script gives
byte-identical files (`tests/unit/test_real_suites.py` rebuilds and compares).
"""


# ------------------------------------------------------------------ main

BUILDERS: dict[str, tuple[Callable[[int], RealSuite], Callable[[RealSuite], str]]] = {
    FACTS_REAL: (build_facts_real, facts_real_card),
    ARITH_REAL: (build_arith_real, arith_real_card),
}


def main(argv: list[str] | None = None, *, echo: Callable[[str], None] = print) -> int:
    parser = argparse.ArgumentParser(description="Build the realistic task suites (deterministic, no network).")
    parser.add_argument("--suite", choices=(*SUITES, "all"), default="all", help="which suite (default: all)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent,
                        help="directory that receives <suite>/ (default: this script's directory)")
    parser.add_argument("--seed", type=int, default=None,
                        help="build seed (default: " + ", ".join(f"{k} {v}" for k, v in DEFAULT_SEEDS.items()) + ")")
    args = parser.parse_args(argv)
    for name in SUITES if args.suite == "all" else (args.suite,):
        build, card = BUILDERS[name]
        suite = build(DEFAULT_SEEDS[name] if args.seed is None else args.seed)
        for path in fb.write_suite(args.out / suite.name, suite.train, suite.test, suite.cases, card(suite)):
            echo(f"wrote {path}")
        s = reward_summary(suite.cases)
        echo(f"{name}: {len(suite.train)} train, {len(suite.test)} test, {len(suite.cases)} seed cases "
             f"({s['reward1']} with reward 1, {s['reward1_exact0']} of them failing exact match), "
             f"{len(suite.counts)} families")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
