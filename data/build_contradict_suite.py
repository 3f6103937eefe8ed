"""Build the realistic suite ``contradict-real``: contradicting memories, a case bank nobody cleaned.

    .venv/bin/python data/build_contradict_suite.py --out data/

writes ``<out>/contradict-real/{train,test,cases}.jsonl`` and ``<out>/contradict-real/CARD.md``. No network:
the facts come from the ``babel`` package's bundled CLDR data (the currencies each territory used, with their
dates) and from ``pycountry``'s ISO 3166-3 list (country names withdrawn from ISO 3166-1), both ``data``
extras pinned in ``constraints.txt`` and imported only when the suite is built; the same package versions give
byte-identical files (``tests/unit/test_contradict_suite.py``).

What makes it realistic: each *thing* (a territory's currency, its currency's code, a country's name) has one
answer that changed over time, and the seed bank holds the *current* answer and the one or two most recent
*stale* ones, all as cases with reward 1 (each was right when it was stored) and all under the same question
wording. A retriever that ranks by the question's similarity finds the current and the stale cases of the
thing equally similar (their states are the same text); which one helps is in the action alone. The tasks ask
for the current answer with a paraphrase, judged by exact match.

Randomness: one ``random.Random`` per purpose, seeded with the string ``f"{seed}:contradict-real:{purpose}"``
(string seeds are hashed with SHA-512: stable across runs, platforms and Python versions).
"""

from __future__ import annotations

import argparse
import collections
import importlib.metadata
import random
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memento.formats import write_jsonl
from memento.io import atomic_write_text
from memento.judges import ExactMatchJudge, normalize_answer
from memento.types import Case, Task

SUITE = "contradict-real"
DEFAULT_SEED = 20251006
MAX_STALE = 2  # stale cases per thing: the most recent previous answers
TEST_FRACTION = 0.5  # of the territories (each territory's things go to one split)
NEAREST_K = 3
COMMAND = ".venv/bin/python data/build_contradict_suite.py --out data/"

# family -> (what the answer is, where it comes from, the bank's question, the two task paraphrases)
# {t}: the territory's name as the questions write it; {c}: an ISO 3166-1 alpha-2 code.
FAMILIES: dict[str, tuple[str, str, str, tuple[str, str]]] = {
    "currency": (
        "the English name of the legal tender currency in use (CLDR's name)",
        "babel: CLDR `territory_currencies`, `get_currency_name(code, locale='en')`",
        "What is the currency of {t}?",
        ("Which currency is used in {t} today?", "What currency does {t} use now?")),
    "currency_code": (
        "the ISO 4217 code of the same currency",
        "babel: CLDR `territory_currencies`",
        "What is the ISO 4217 code of the currency of {t}?",
        ("Which ISO 4217 currency code is used in {t} today?", "What three-letter currency code does {t} use now?")),
    "country_name": (
        "the English short name of the country now at the code (pycountry's name)",
        "pycountry: ISO 3166-1 `countries`, ISO 3166-3 `historic_countries`",
        "What is the name of the country with ISO 3166-1 code {c}?",
        ("Which country has the ISO 3166-1 code {c} today?", "What is the country with the ISO code {c} called now?")),
}

# CLDR region codes with currency data that are not a country or territory
NOT_TERRITORIES = frozenset({"EU", "EZ", "QO", "UN", "ZZ"})
# How a territory is written in a question: CLDR's English name, " & " written "and", a parenthesised
# alternative dropped ("Myanmar (Burma)" -> "Myanmar"), "the" before the names that take it, and these by hand.
TERRITORY_NAMES = {"CD": "the Democratic Republic of the Congo", "CG": "the Republic of the Congo",
                   "US": "the United States", "GB": "the United Kingdom"}
TAKES_THE = frozenset({"AE", "BQ", "BS", "CF", "CK", "DO", "FK", "FO", "GM", "KM", "KY", "MH", "MV", "NL", "PH", "SB",
                       "TC", "TF", "UM", "VG", "VI"})
# ISO 3166-3 entries (alpha-4: former code + code now) that renamed a country whose territory is now at the new
# code. Left out: mergers and partitions, where the former country was never at the new code (DDDE German
# Democratic Republic into Germany, SKIN Sikkim into India, VDVN, YDYE, FXFR, PZPA, CTKI, BQAQ, NQAQ, and the
# US islands into UM), and codes with no single successor (xxHH, CSXX, YUCS, ANHH, BYAA).
RENAMES = ("AIDJ", "BUMM", "DYBJ", "HVBF", "NHVU", "RHZW", "TPTL", "ZRCD")
# pycountry's current names that are written inverted, as a question's answer would not be
COUNTRY_NAMES = {"CD": "Democratic Republic of the Congo"}
_YEARS = re.compile(r"\s*\(\d{4}(?:\s*[\u2013\u2014-]\s*\d{4})?\)$")  # " (1927–2002)", " (2008)"
_PARENS = re.compile(r"\s*\([^)]*\)")


@dataclass(frozen=True)
class Value:
    """One answer a thing had: its text (a case's action), what it names (a currency code, a country code), and
    the years it started and ended where known (None: not known; ``end`` None for the current value)."""

    text: str
    code: str
    start: int | None
    end: int | None


@dataclass(frozen=True)
class Thing:
    id: str  # "<family>-<ISO 3166-1 alpha-2 code>"
    family: str
    territory: str  # the ISO 3166-1 alpha-2 code the split groups by
    subject: str  # what the questions name: the territory's name, or the code
    current: Value
    stale: tuple[Value, ...]  # most recent first, 1..MAX_STALE

    @property
    def state(self) -> str:
        return FAMILIES[self.family][2].format(t=self.subject, c=self.subject)

    def paraphrases(self) -> tuple[str, str]:
        a, b = FAMILIES[self.family][3]
        return a.format(t=self.subject, c=self.subject), b.format(t=self.subject, c=self.subject)


@dataclass
class Skipped:
    """Territories left out of a family, with the reason (for the card)."""

    reasons: dict[str, list[str]]

    def add(self, family: str, why: str, code: str) -> None:
        self.reasons.setdefault(f"{family}: {why}", []).append(code)


@dataclass
class ContradictSuite:
    seed: int
    things: list[Thing]
    train: list[Task]
    test: list[Task]
    cases: list[Case]
    skipped: Skipped
    test_territories: list[str]
    nearest: dict[str, float]


# ------------------------------------------------------------------ the things


def _import(name: str) -> Any:
    try:
        return __import__(name, fromlist=["_"])
    except ModuleNotFoundError as exc:
        package = name.split(".")[0]
        raise ModuleNotFoundError(f"the {package} package (a `data` extra) is needed to build {SUITE}: "
                                  f"pip install -c constraints.txt {package}") from exc


def territory_subject(code: str, cldr_name: str) -> str:
    """How the questions write a territory (see TERRITORY_NAMES)."""
    if code in TERRITORY_NAMES:
        return TERRITORY_NAMES[code]
    name = _PARENS.sub("", cldr_name).replace(" & ", " and ").strip()
    return f"the {name}" if code in TAKES_THE else name


def clean_currency_name(name: str) -> str:
    """CLDR's English currency name without the years it adds to tell a former currency from the current one of
    the same name ("Afghan Afghani (1927–2002)" -> "Afghan Afghani"): a bank's stale answer is the name people
    used, and a current and a stale answer that are then the same are no contradiction (see `history`)."""
    return _YEARS.sub("", name).strip()


def _year(date: tuple[int, int, int] | None) -> int | None:
    return None if date is None else date[0]


def history(records: Sequence[tuple[str, Any, Any, bool]], text: Callable[[str], str]
            ) -> tuple[Value, tuple[Value, ...]] | str:
    """A territory's current and stale values from CLDR's ``(code, start, end, tender)`` records, or why none:
    current = the one legal tender with no end date; stale = the legal tenders that ended, most recent end
    first (then latest start; CLDR's order breaks ties), whose answer differs (normalised) from the current one
    and from the stale ones before it, at most MAX_STALE."""
    tender = [r for r in records if r[3]]
    current = [r for r in tender if r[2] is None]
    if len(current) != 1:
        return "no current legal tender" if not current else "several current legal tenders"
    now = Value(text=text(current[0][0]), code=current[0][0], start=_year(current[0][1]), end=None)
    ended = sorted((r for r in tender if r[2] is not None), key=lambda r: (r[2], r[1] or (0, 0, 0)), reverse=True)
    if not ended:
        return "no former legal tender"
    seen = {normalize_answer(now.text)}
    stale: list[Value] = []
    for code, start, end, _ in ended:
        value = Value(text=text(code), code=code, start=_year(start), end=_year(end))
        if normalize_answer(value.text) not in seen and len(stale) < MAX_STALE:
            stale.append(value)
            seen.add(normalize_answer(value.text))
    if not stale:
        return "every former currency has the current one's name"
    return now, tuple(stale)


def currency_things(skipped: Skipped) -> list[Thing]:
    """The ``currency`` and ``currency_code`` families from CLDR (babel), one thing per territory each."""
    core = _import("babel.core")
    numbers = _import("babel.numbers")
    territories = core.Locale("en").territories
    table = core.get_global("territory_currencies")

    def name(code: str) -> str:
        return clean_currency_name(numbers.get_currency_name(code, locale="en"))

    things: list[Thing] = []
    for family, text in (("currency", name), ("currency_code", str)):
        for code in sorted(table):
            if code in NOT_TERRITORIES or not re.fullmatch(r"[A-Z]{2}", code) or code not in territories:
                skipped.add(family, "not a country or territory (or no English name)", code)
                continue
            found = history(table[code], text)
            if isinstance(found, str):
                skipped.add(family, found, code)
                continue
            now, stale = found
            things.append(Thing(id=f"{family}-{code}", family=family, territory=code,
                                subject=territory_subject(code, territories[code]), current=now, stale=stale))
    return things


def country_name_things() -> list[Thing]:
    """The ``country_name`` family from pycountry: the renames in RENAMES, one thing per code now in use."""
    pycountry = _import("pycountry")
    by_new: dict[str, list[Any]] = collections.defaultdict(list)
    for old in pycountry.historic_countries:
        if old.alpha_4 in RENAMES:
            by_new[old.alpha_4[2:]].append(old)
    if sum(map(len, by_new.values())) != len(RENAMES):
        raise RuntimeError(f"pycountry: ISO 3166-3 entries {RENAMES} expected")
    things = []
    for code, olds in sorted(by_new.items()):
        country = pycountry.countries.get(alpha_2=code)
        name = COUNTRY_NAMES.get(code) or getattr(country, "common_name", None) or country.name
        olds = sorted(olds, key=lambda o: o.withdrawal_date, reverse=True)[:MAX_STALE]
        stale = tuple(Value(text=o.name.split(",")[0].strip(), code=o.alpha_2, start=None,
                            end=int(o.withdrawal_date[:4])) for o in olds)
        things.append(Thing(id=f"country_name-{code}", family="country_name", territory=code, subject=code,
                            current=Value(text=name, code=code, start=None, end=None), stale=stale))
    return things


def check_things(things: Sequence[Thing]) -> None:
    for thing in things:
        gold = normalize_answer(thing.current.text)
        stale = [normalize_answer(v.text) for v in thing.stale]
        if not gold or gold in stale or len(set(stale)) != len(stale) or not 1 <= len(stale) <= MAX_STALE:
            raise RuntimeError(f"{thing.id}: current {thing.current.text!r} vs stale {[v.text for v in thing.stale]}")
        leaked = [a for a in (thing.current.text, *(v.text for v in thing.stale))
                  if f" {normalize_answer(a)} " in f" {normalize_answer(thing.state)} "]
        if leaked and thing.family != "currency":  # a currency may be named after its country ("Czech Koruna")
            raise RuntimeError(f"{thing.id}: the question gives away {leaked}")
    ids = [t.id for t in things]
    if len(ids) != len(set(ids)):
        raise RuntimeError("duplicate thing ids")


# ------------------------------------------------------------------ tasks, cases, the split


def make_tasks(thing: Thing) -> list[Task]:
    return [Task(id=f"{thing.id}-{letter}", question=question, answers=(thing.current.text,), family=thing.family,
                 env=SUITE, meta={"thing": thing.id})
            for letter, question in zip("ab", thing.paraphrases())]


def _case(thing: Thing, value: Value, label: str, current: bool) -> Case:
    meta: dict[str, Any] = {"thing": thing.id, "family": thing.family, "current": current, "code": value.code}
    if value.start is not None:
        meta["start"] = value.start
    if value.end is not None:
        meta["end"] = value.end
    meta["source"] = "seed"
    return Case(id=f"{SUITE}-seed-{thing.id}-{label}", state=thing.state, action=value.text, reward=1.0, env=SUITE,
                kind="case", meta=meta)


def make_cases(thing: Thing) -> list[Case]:
    """The thing's current case and its stale ones, all reward 1 and with the same state."""
    cases = [_case(thing, thing.current, "current", True)]
    cases += [_case(thing, value, f"stale-{i}", False) for i, value in enumerate(thing.stale, 1)]
    task = make_tasks(thing)[0]
    judge = ExactMatchJudge()
    if judge(task, cases[0].action).reward != 1.0 or any(judge(task, c.action).reward for c in cases[1:]):
        raise RuntimeError(f"{thing.id}: the judge does not tell the current case from the stale ones")
    return cases


def split_territories(things: Sequence[Thing], seed: int) -> set[str]:
    """The test territories: TEST_FRACTION of the territories (seeded shuffle of the sorted codes); all the
    things of a territory (its currency, currency code, country name) go to the same split."""
    territories = sorted({t.territory for t in things})
    random.Random(f"{seed}:{SUITE}:split").shuffle(territories)
    return set(territories[:round(TEST_FRACTION * len(territories))])


def build(seed: int = DEFAULT_SEED) -> ContradictSuite:
    skipped = Skipped(reasons={})
    things = currency_things(skipped) + country_name_things()
    check_things(things)
    test_territories = split_territories(things, seed)
    train = [task for t in things if t.territory not in test_territories for task in make_tasks(t)]
    test = [task for t in things if t.territory in test_territories for task in make_tasks(t)]
    cases = [case for t in things for case in make_cases(t)]
    check_disjoint(train, test)
    random.Random(f"{seed}:{SUITE}:order:train").shuffle(train)
    random.Random(f"{seed}:{SUITE}:order:test").shuffle(test)
    random.Random(f"{seed}:{SUITE}:order:cases").shuffle(cases)
    return ContradictSuite(seed=seed, things=things, train=train, test=test, cases=cases, skipped=skipped,
                           test_territories=sorted(test_territories), nearest=nearest_stats(test, cases))


def check_disjoint(train: Sequence[Task], test: Sequence[Task]) -> None:
    train_things = {t.meta["thing"] for t in train}
    if train_things & {t.meta["thing"] for t in test}:
        raise RuntimeError("a thing is in train and test")
    questions = [normalize_answer(t.question) for t in [*train, *test]]
    if len(questions) != len(set(questions)):
        raise RuntimeError("duplicate task questions")


# ------------------------------------------------------------------ statistics (no LLM, no embeddings)


def _bag(text: str) -> dict[str, int]:
    return dict(collections.Counter(normalize_answer(text).split()))


def nearest_stats(test: Sequence[Task], cases: Sequence[Case], k: int = NEAREST_K) -> dict[str, float]:
    """How a similarity retriever fares on the seed bank, with bag-of-words cosine over the normalised question
    words standing in for an embedding (ties, such as a thing's cases, which share their state, broken by bank
    order): over the test tasks, the share whose nearest case is about the task's thing, whose nearest case is a
    stale one of it, and the mean share of the top-k that are stale cases of the task's thing."""
    bags = [_bag(c.state) for c in cases]
    norms = [sum(v * v for v in bag.values()) for bag in bags]
    sums: collections.Counter[str] = collections.Counter()
    for task in test:
        query = _bag(task.question)
        scores = [-(sum(n * bag.get(w, 0) for w, n in query.items()) ** 2 / norm) for bag, norm in zip(bags, norms)]
        top = [cases[i] for i in sorted(range(len(cases)), key=lambda i: (scores[i], i))[:k]]
        mine = [c.meta["thing"] == task.meta["thing"] for c in top]
        sums["top1_same_thing"] += mine[0]
        sums["top1_stale"] += mine[0] and not top[0].meta["current"]
        sums["topk_stale"] += sum(m and not c.meta["current"] for m, c in zip(mine, top))
        sums["topk_current"] += sum(m and c.meta["current"] for m, c in zip(mine, top))
    n = len(test) or 1
    return {"top1_same_thing": sums["top1_same_thing"] / n, "top1_stale": sums["top1_stale"] / n,
            "topk_stale": sums["topk_stale"] / (k * n), "topk_current": sums["topk_current"] / n}


# ------------------------------------------------------------------ the card


def _pct(x: float) -> str:
    return f"{round(100 * x)}%"


def family_rows(suite: ContradictSuite) -> str:
    test = set(suite.test_territories)
    rows = []
    totals: collections.Counter[str] = collections.Counter()
    for family, (_, _, state, paraphrases) in FAMILIES.items():
        things = [t for t in suite.things if t.family == family]
        c = {"things": len(things), "two": sum(len(t.stale) == 2 for t in things),
             "train": sum(t.territory not in test for t in things), "test": sum(t.territory in test for t in things),
             "cases": sum(1 + len(t.stale) for t in things)}
        totals.update(c)
        asked = " / ".join(f"\"{p.format(t='X', c='X')}\"" for p in paraphrases)
        rows.append(f"| `{family}` | \"{state.format(t='X', c='X')}\" | {asked} | {c['things']} | {c['two']} "
                    f"| {c['train']} | {c['test']} | {c['cases']} |")
    rows.append(f"| **total** | | | {totals['things']} | {totals['two']} | {totals['train']} | {totals['test']} "
                f"| {totals['cases']} |")
    return "\n".join(rows)


def examples(suite: ContradictSuite) -> str:
    """One test task per family, with its thing's cases (current first)."""
    by_thing: dict[str, list[Case]] = collections.defaultdict(list)
    for case in suite.cases:
        by_thing[case.meta["thing"]].append(case)
    blocks = []
    for family in FAMILIES:
        mine = [t for t in suite.test if t.family == family]
        task = next((t for t in mine if len(by_thing[t.meta["thing"]]) == 1 + MAX_STALE), mine[0])
        lines = [f"- task `{task.id}`: \"{task.question}\" -> `{task.answers[0]}`"]
        for case in sorted(by_thing[task.meta["thing"]], key=lambda c: not c.meta["current"]):
            start, end = case.meta.get("start"), case.meta.get("end")
            years = (f", {start}-{end}" if start and end else f", since {start}" if start
                     else f", until {end}" if end else "")
            label = "current" if case.meta["current"] else "stale"
            lines.append(f"  - in the bank ({label}{years}): \"{case.state}\" -> `{case.action}`")
        blocks.append("\n".join(lines))
    return "\n".join(blocks)


def answer_rows() -> str:
    return "\n".join(f"| `{family}` | {what} | {source} |" for family, (what, source, _, _) in FAMILIES.items())


def source_rows(versions: dict[str, str]) -> str:
    rows = (
        ("babel (PyPI)", versions["babel"], "BSD-3-Clause (package metadata)", "the CLDR data it bundles"),
        ("Unicode CLDR, through babel", versions["cldr"], "Unicode License v3",
         "territories' currencies with dates and legal tender flags, English currency and territory names"),
        ("pycountry (PyPI)", versions["pycountry"], "LGPL-2.1-only (package metadata)",
         "ISO 3166-1 country names and ISO 3166-3 withdrawn names, from Debian's iso-codes data it bundles"),
        ("hand lists in `build_contradict_suite.py`", "-", "this project's (MIT)",
         "the questions' wordings, the territories' written names, the renames, the split"),
    )
    return "\n".join(f"| {' | '.join(row)} |" for row in rows)


def skipped_rows(suite: ContradictSuite, most: int = 30) -> str:
    """One row per reason and the families it left the same territories out of (long lists: the count only)."""
    merged: dict[tuple[str, tuple[str, ...]], list[str]] = collections.defaultdict(list)
    for key, codes in suite.skipped.reasons.items():
        family, why = key.split(": ", 1)
        merged[(why, tuple(codes))].append(f"`{family}`")
    rows = []
    for (why, codes), families in sorted(merged.items()):
        shown = ", ".join(codes) if len(codes) <= most else "(not listed)"
        rows.append(f"| {why} | {', '.join(families)} | {len(codes)} | {shown} |")
    return "\n".join(rows)


def card(suite: ContradictSuite) -> str:
    babel_version = importlib.metadata.version("babel")
    cldr = _import("babel.core").get_cldr_version()
    n = suite.nearest
    things = len(suite.things)
    return CARD.format(
        n_things=things, n_tasks=len(suite.train) + len(suite.test), n_train=len(suite.train), n_test=len(suite.test),
        n_cases=len(suite.cases), n_current=sum(c.meta["current"] for c in suite.cases),
        n_stale=sum(not c.meta["current"] for c in suite.cases),
        n_train_things=len({t.meta["thing"] for t in suite.train}),
        n_test_things=len({t.meta["thing"] for t in suite.test}),
        n_territories=len({t.territory for t in suite.things}), n_test_territories=len(suite.test_territories),
        families=family_rows(suite), examples=examples(suite), skipped=skipped_rows(suite),
        max_stale=MAX_STALE, test_pct=round(100 * TEST_FRACTION), renames=", ".join(RENAMES),
        k=NEAREST_K, top1_same=_pct(n["top1_same_thing"]), top1_stale=_pct(n["top1_stale"]),
        topk_stale=_pct(n["topk_stale"]), topk_current=_pct(n["topk_current"]),
        answers=answer_rows(), sources=source_rows({"babel": babel_version, "cldr": cldr,
                                                    "pycountry": importlib.metadata.version("pycountry")}),
        command=COMMAND, seed=suite.seed, seed_note="" if suite.seed == DEFAULT_SEED else f" --seed {suite.seed}")


CARD = """\
# Suite card: `contradict-real`

Contradicting memories: a case bank nobody cleaned. {n_things} *things* (a territory's currency, the ISO
4217 code of that currency, the name of the country at an ISO 3166-1 code), each with one answer that
changed over time; {n_tasks} tasks ({n_train} train, {n_test} test) ask for the current answer, and a seed
bank of {n_cases} cases holds, for every thing, its current answer and its {max_stale} most recent stale ones
(or 1 when there is only one), all with reward 1. This file is generated by `data/build_contradict_suite.py`;
edit the script, not the card.

**Never tune on the test split**: choose methods, prompts and hyperparameters on `train.jsonl` (or a part of
it held out), and run `test.jsonl` once, for the numbers you report.

## Why

A bank that logs its agent's answers over years holds answers that were right when they were stored and
are wrong now: "What is the currency of Germany?" -> `German Mark` (reward 1 in 1999) beside the same
question -> `Euro`. Nothing in the stored reward tells them apart, and a retriever that ranks by the
question finds them equally similar: the current case and the stale ones of a thing have the *same* state
text, so only the action (and what a selector learns about it) separates them. Here the stale cases are
{n_stale} of the {n_cases} ({n_current} current), and a task is answered correctly only with the current
answer (exact match). A territory's currency and currency-code cases are near each other too (same
territory, similar wording): a second kind of distractor. For example (test tasks, with their thing's cases):

{examples}

## Files

| file | format | rows |
|---|---|---|
| `train.jsonl` | Task JSONL (docs/formats.md), `env` = "contradict-real", `family` = the thing's family | {n_train} |
| `test.jsonl` | Task JSONL | {n_test} |
| `cases.jsonl` | Case JSONL, `env` = "contradict-real", `kind` = "case" | {n_cases} |

Load them with `memento.envs.tasks.load_suite("contradict-real", "train" | "test")` and
`memento.envs.tasks.seed_cases("contradict-real")`. A task is `{{"id": "<thing>-a" | "<thing>-b",
"question": a paraphrase, "answers": [the current answer], "family", "env": "contradict-real", "meta":
{{"thing": <thing>}}}}`, with thing ids `<family>-<ISO 3166-1 alpha-2 code>` (`currency-DE`). A case is
`{{"id": "contradict-real-seed-<thing>-current" | "...-stale-1" | "...-stale-2", "state": the bank's question,
"action": the answer, "reward": 1.0, "env", "kind": "case", "meta": {{"thing", "family", "current": true |
false, "code": the currency's ISO 4217 code or the country's ISO 3166-1 code, "start", "end" (years, where
known), "source": "seed"}}}}`. `meta.current` is for analysis only: a selector must not read it.

Judge the tasks with exact match, `memento.judges.ExactMatchJudge()` (`make_judge("exact")`): the first
line of the answer, normalised (case, punctuation, articles, accents), must equal the current answer, which is
spelled exactly as the current case's action. No stale answer matches.

## Families

| family | the bank's question (X: territory or code) | the tasks' questions | things | 2 stale | train | test | cases |
|---|---|---|---|---|---|---|---|
{families}

`things`: how many things the family gives; `2 stale`: of those, how many have two stale cases (the others one);
`train`, `test`: things whose tasks are in that split (two tasks each); `cases`: the family's seed cases.

| family | the answer | source |
|---|---|---|
{answers}

Every thing has two tasks, one per paraphrase (`-a`, `-b`), neither worded like the bank's question; every
thing's cases are in the bank, whichever split its tasks are in.

## How the things are chosen

- `currency`, `currency_code`: CLDR's `territory_currencies` (through babel) lists for each territory the
  currencies it used, with start and end dates and a legal tender flag. Current: the one legal tender with
  no end date. Stale: the legal tenders that ended, the most recent end first, at most {max_stale}, skipping
  one whose answer (normalised) equals the current one or an earlier stale one. Currency names are
  `babel.numbers.get_currency_name(code, locale="en")` without the years CLDR appends to a former
  currency that shares its name with a later one ("Afghan Afghani (1927–2002)" -> "Afghan Afghani"): a
  bank stores the name people used, and the years would label the stale case for any reader. So a former
  currency of the same name as the current one is no stale answer (Russia's "Russian Ruble (1991–1998)"),
  and a territory whose every former currency has the current one's name is left out of `currency` (it
  stays in `currency_code`: RUR vs RUB).
- Territories are written as CLDR's English name (`babel.Locale("en").territories`) with " & " written
  "and", a parenthesised alternative dropped ("Myanmar (Burma)" -> "Myanmar"), "the" before the names that
  take it, and the two Congos written out ("the Democratic Republic of the Congo").
- `country_name`: the ISO 3166-3 entries (pycountry's `historic_countries`) that *renamed* a country now at
  the new code: {renames} (alpha-4 code: former code, code now). Current: pycountry's name of the
  country at the code ("Democratic Republic of the Congo" for pycountry's inverted "Congo, The Democratic
  Republic of the"); stale: the former name up to its first comma ("Burma, Socialist Republic of the Union
  of" -> "Burma"), with the year the former code was withdrawn as `end`. Mergers and partitions are left out
  (the German Democratic Republic was never at DE, Sikkim never at IN).
- The split is by territory: {test_pct}% of the {n_territories} territories (seeded shuffle) have their
  things' tasks in test ({n_test_territories} territories, {n_test_things} things), the rest in train
  ({n_train_things} things), so no thing and no territory is in both. The seed bank holds the cases of all
  things, in a seeded shuffled order (the current case is not always first).

Left out (territory codes):

| reason | families | territories | codes |
|---|---|---|---|
{skipped}

## What similarity finds

With bag-of-words cosine over the normalised question words standing in for an embedding (computed by the
build; no LLM, no encoder; ties broken by bank order), the nearest seed case of a test task is one of its
thing's cases for {top1_same} of the test tasks, and a *stale* one for {top1_stale}; of the top {k},
{topk_stale} are stale cases of the task's thing, and the top {k} holds the task's current case for
{topk_current} of the test tasks. A thing's cases tie (same state), so which of them comes first is the
bank's order, not the question.

## Sources and licences

| source | version used | licence | used for |
|---|---|---|---|
{sources}

The shipped files contain facts (names, codes, years), not the packages' code or data files. The packages
are `data` extras (pinned in `constraints.txt`); nothing needs them at run time.

## How it was built

    {command}{seed_note}

Seed {seed}. Deterministic: the same babel and pycountry versions give byte-identical files
(`tests/unit/test_contradict_suite.py` rebuilds and compares). Another CLDR release moves dates and adds
currencies (a territory's current currency may change): rebuild, check the diff, and commit both.
"""


# ------------------------------------------------------------------ main


def write_suite(out: Path, suite: ContradictSuite, text: str) -> list[Path]:
    target = out / SUITE
    paths = [target / "train.jsonl", target / "test.jsonl", target / "cases.jsonl", target / "CARD.md"]
    rows: Iterable[dict[str, Any]]
    for path, rows in zip(paths, ((t.to_json() for t in suite.train), (t.to_json() for t in suite.test),
                                  (c.to_json() for c in suite.cases))):
        write_jsonl(path, rows)
    atomic_write_text(paths[3], text)
    return paths


def main(argv: list[str] | None = None, *, echo: Callable[[str], None] = print) -> int:
    parser = argparse.ArgumentParser(description="Build the contradict-real task suite (deterministic, no network).")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent,
                        help="directory that receives contradict-real/ (default: this script's directory)")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"build seed (default: {DEFAULT_SEED})")
    args = parser.parse_args(argv)
    suite = build(args.seed)
    for path in write_suite(args.out, suite, card(suite)):
        echo(f"wrote {path}")
    per_family = collections.Counter(t.family for t in suite.things)
    echo(f"{SUITE}: {len(suite.things)} things ({', '.join(f'{f} {per_family[f]}' for f in FAMILIES)}), "
         f"{len(suite.train)} train, {len(suite.test)} test, {len(suite.cases)} seed cases "
         f"({sum(not c.meta['current'] for c in suite.cases)} stale)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
