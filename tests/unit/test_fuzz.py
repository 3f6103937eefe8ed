"""Fuzzing the input surfaces with hypothesis (deterministic: derandomized, no example database).

Every generated input either loads or is refused with memento's own error, in one line; never a traceback:

- (a) the JSONL readers (Case, Task, Memento's memory / np-memory / training pairs / tasks, steps.jsonl,
  labels) on generated lines: near-valid rows with values of random types, random text, random bytes;
- (b) config JSON (``LoopConfig``, ``SelectorConfig``, ``TrainConfig``) from generated objects;
- (c) the HTTP API over a small real selector: generated bodies to /v1/select, /v1/feedback, /v1/cases are
  answered 2xx, or 4xx with the problem JSON, never 5xx;
- (d) ``memento bank import`` of generated files: a file the reader refuses exits 2 with the reader's one
  line, and the bank directory is left byte for byte as it was.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from memento.config import load_json
from memento.errors import ConfigError, MementoError
from memento.formats import (
    read_case_file,
    read_cases_jsonl,
    read_memento_memory,
    read_memento_np_memory,
    read_memento_tasks,
    read_memento_training_pairs,
    read_steps_jsonl,
    read_tasks_jsonl,
)
from memento.learn.labels import read_labels
from memento.runs.labels import read_label_tasks
from memento.runs.qa import LoopConfig
from memento.selector.artifact import SelectorConfig
from tests.fuzzing import FUZZ, examples, record

pytestmark = pytest.mark.probe  # `make probe` runs it scaled up


PLAN = json.dumps({"plan": [{"id": 1, "description": "look it up"}]})

# ---------------------------------------------------------------- generated JSON

_scalars = (st.none() | st.booleans() | st.integers(-10, 10) | st.integers(min_value=-(10 ** 500), max_value=10 ** 500)
            | st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([0, 1, 0.0, 1.0, 0.5, -1, 2])
            | st.text(max_size=12) | st.sampled_from(["", " ", "\ud800", "a\udfffb", "\x00", "\u2028", "x\ny"]))
json_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=12)

_DELETE = object()


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key path into the nested objects (and lists) of ``value``."""
    out: list[tuple[Any, ...]] = []
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in items:
        out.append((*prefix, key))
        out.extend(_paths(child, (*prefix, key)))
    return out


def _mutate(base: dict[str, Any], path: tuple[Any, ...], new: Any) -> dict[str, Any]:
    out = json.loads(json.dumps(base))
    parent = out
    for key in path[:-1]:
        parent = parent[key]
    if new is _DELETE:
        if path[-1] in parent or isinstance(parent, list):
            del parent[path[-1]]
    else:
        parent[path[-1]] = new
    return out


# values that broke a reader once: past float range, past Python's digit limit (as a literal), NaN, bools...
nasty = st.sampled_from([10 ** 400, -(10 ** 400), 2 ** 63, 1e308, float("nan"), float("inf"), float("-inf"), True,
                         False, None, "", " ", "\ud800", "1", 0, -1, 2, 0.5, [], {}, [[[]]], {"": None}, ["x", 1],
                         "x" * 300, "a\nb"])
_values = st.one_of(nasty, nasty, nasty, json_values)  # three in four a nasty value


def _mutate_all(base: dict[str, Any], changes: list[tuple[tuple[Any, ...], Any]]) -> dict[str, Any]:
    out = base
    for path, new in changes:
        try:
            out = _mutate(out, path, new)
        except (KeyError, IndexError, TypeError):  # an earlier change removed the path
            pass
    return out


def mutations(*bases: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """A valid object with one to three fields (anywhere in it) replaced by nasty or random values, deleted, or
    added."""
    def some(base: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
        paths = st.sampled_from(_paths(base) + [("unknown_field",)])
        change = st.tuples(paths, st.one_of(_values, st.just(_DELETE)))
        return st.builds(_mutate_all, st.just(base), st.lists(change, min_size=1, max_size=2))
    return st.sampled_from(bases).flatmap(lambda base: st.one_of(some(base), some(base), some(base), st.just(base)))


_STEP = {"step": 0, "task_id": "t", "family": "f", "state": "q", "candidate_ids": ["a", "b"], "chosen_ids": ["a"],
         "propensities": [0.5], "set_propensity": 0.5, "greedy": False, "output": "o", "reward": 1.0,
         "success": True, "reason": "r", "done": True, "retained_id": None, "duplicate": False, "policy": "p",
         "policy_version": 0, "bank_size": 2, "entropy": 0.1, "alpha": 0.2, "loss": None, "time": 0.0,
         "ms": {"select": 1.0}}
_LABEL = {"task_id": "t", "state": "q", "answer": "a", "candidate_ids": ["c1", "c2"], "logprob": [-1.0, -2.0],
          "mean_logprob": [-1.0, -2.0], "n_tokens": [1, 1], "planner": "p", "prompt": "few_shot",
          "cosine": [0.9, 0.8]}
ROW_BASES = [
    {"id": "x", "state": "What is 2+2?", "action": "4", "reward": 1, "env": "e", "kind": "case", "meta": {"a": [1]}},
    {"id": 7, "question": "Capital of Peru?", "answers": ["Lima"], "family": "facts", "meta": {}},
    {"case": "Capital of Peru?", "plan": PLAN, "case_label": "positive"},
    {"question": "Capital of Peru?", "plan": PLAN, "reward": 1},
    {"query": "Capital of Peru?", "case": "Capital of Peru?", "case_label": "negative", "plan": PLAN,
     "truth_label": True},
    {"question": "Capital of Peru?", "ground_truth": "Lima<|answer_split|>lima", "data_source": "fuzz"},
    {"state": "Capital of Peru?", "case_id": "x", "reward": 1, "propensity": 0.5},
    _STEP, _LABEL,
]
rows = mutations(*ROW_BASES) | st.dictionaries(st.text(max_size=8), json_values, max_size=5)


def _deep(depth: int) -> str:
    return '{"state": "s", "action": "a", "reward": 1, "meta": ' + "[" * depth + "]" * depth + "}"


def _dumps(value: Any) -> bytes:
    try:
        return json.dumps(value).encode("utf-8")  # NaN and Infinity written as literals; surrogates escaped
    except ValueError:  # an integer past Python's digit limit
        return b"{}"


lines = (rows.map(_dumps) | json_values.map(_dumps) | st.text(max_size=40).map(lambda t: t.encode("utf-8", "replace"))
         | st.binary(max_size=40) | st.sampled_from([_deep(150).encode(), _deep(50_000).encode(), b"\xef\xbb\xbf{}",
                                                     b'{"reward": ' + b"9" * 5000 + b"}", b"[]", b"null", b"\r"]))
jsonl_files = st.lists(lines, min_size=1, max_size=4).map(lambda ls: b"\n".join(ls) + b"\n")


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="memento-fuzz-") as tmp:
        yield Path(tmp)


def _one_line(error: BaseException) -> None:
    assert isinstance(error, MementoError), f"{type(error).__name__}: {error}"
    assert "\n" not in str(error) and "\r" not in str(error), repr(str(error))


def _storable(value: Any) -> None:
    """What loaded can be written back as UTF-8 JSON (the bank stores meta as JSON text; export writes it)."""
    json.dumps(value, ensure_ascii=False, allow_nan=False, default=repr).encode("utf-8")


# ---------------------------------------------------------------- (a) the JSONL readers

_CASE, _TASK, _MEMORY, _NP, _PAIR, _MTASK, _REWARD = ROW_BASES[:7]
READERS: dict[str, tuple[Callable[[Path], Any], dict[str, Any]]] = {
    "cases": (read_cases_jsonl, _CASE), "tasks": (read_tasks_jsonl, _TASK),
    "memento-memory": (read_memento_memory, _MEMORY), "memento-np-memory": (read_memento_np_memory, _NP),
    "memento-training": (read_memento_training_pairs, _PAIR), "memento-tasks": (read_memento_tasks, _MTASK),
    "steps": (read_steps_jsonl, _STEP), "labels": (read_labels, _LABEL), "label-tasks": (read_label_tasks, _TASK),
}


def _files_for(base: dict[str, Any]) -> st.SearchStrategy[bytes]:
    """JSONL files of one to four lines: mostly the reader's own row with nasty fields, else any line."""
    mutated = mutations(base).map(_dumps)
    line = st.one_of(mutated, mutated, mutated, lines.map(bytes))  # (mapped: one_of would flatten `lines`)
    return st.lists(line, min_size=1, max_size=4).map(lambda ls: b"\n".join(ls) + b"\n")


def _known_examples(base: dict[str, Any]) -> Callable[[Any], Any]:
    """The inputs of issue 12, always tried first (generation also draws constants from the modules loaded,
    so what it finds can change with the tests selected)."""
    key = next(k for k in ("reward", "state", "question", "case", "query", "step") if k in base)
    body = json.dumps(base)[:-1]
    cases = [body + f', "{key}": ' + "9" * 400 + "}", body + ', "meta": ' + "[" * 100_000 + "]" * 100_000 + "}",
             body + ', "meta": ' + "[" * 150 + "]" * 150 + "}", body + f', "{key}": "x\\ud800"' + "}",
             body + f', "{key}": NaN' + "}", body + f', "{key}": ' + "1" * 5000 + "}"]

    def apply(test: Any) -> Any:
        for line in cases:
            test = example(content=line.encode() + b"\n")(test)
        for raw in (b"\xef\xbb\xbf" + json.dumps(base).encode() + b"\r\n", b'{"x": "\xff"}\n', b"[1]\n"):
            test = example(content=raw)(test)
        return test
    return apply


def _check_reader(name: str, read: Callable[[Path], Any], path: Path) -> None:
    try:
        loaded = read(path)
    except Exception as error:  # noqa: BLE001 - the point: only MementoError may come out
        _one_line(error)
        return
    if name in ("cases", "tasks", "memento-memory", "memento-np-memory"):
        for item in loaded:
            _storable(item.meta)
            _storable([item.state if hasattr(item, "state") else item.question])
    if name == "memento-np-memory":
        assert all(case.reward in (0.0, 1.0) for case in loaded)


@pytest.mark.parametrize("name", sorted(READERS))
def test_jsonl_readers_load_or_refuse_in_one_line(workdir: Path, name: str) -> None:
    read, base = READERS[name]

    @settings(FUZZ, max_examples=examples(40))
    @given(content=_files_for(base))
    @_known_examples(base)
    def run(content: bytes) -> None:
        record(__name__, "inputs")
        path = workdir / f"reader-{name}.jsonl"
        path.write_bytes(content)
        _check_reader(name, read, path)

    run()


@pytest.fixture(scope="module")
def rewards_cases(workdir: Path) -> Path:
    path = workdir / "rewards-cases.jsonl"
    path.write_text(json.dumps({"id": "x", "state": "Capital of Peru?", "action": "Lima", "reward": 1}) + "\n",
                    encoding="utf-8")
    return path


@settings(FUZZ, max_examples=examples(60))
@given(content=_files_for(_REWARD))
@_known_examples(_REWARD)
def test_rewards_jsonl_loads_or_refuses_in_one_line(workdir: Path, rewards_cases: Path, content: bytes) -> None:
    from memento.training.data import load_cases_rewards
    from tests.loop_env import HashingEncoder

    record(__name__, "inputs")
    path = workdir / "rewards.jsonl"
    path.write_bytes(content)
    try:
        load_cases_rewards(rewards_cases, path, HashingEncoder(dim=16))
    except Exception as error:  # noqa: BLE001
        _one_line(error)


# ---------------------------------------------------------------- (b) config JSON


def _config_bases() -> list[tuple[type, dict[str, Any]]]:
    from memento.config import IndexConfig, LearnerConfig, QNetConfig, ReplayConfig, to_dict
    from memento.policies import loop_policy
    from memento.training.config import DataConfig, TrainConfig

    qnet = QNetConfig(dim=16)
    loop = [to_dict(LoopConfig()), to_dict(LoopConfig(policy=loop_policy("similarity"))),
            to_dict(LoopConfig(policy=loop_policy("linucb")))]
    selector = to_dict(SelectorConfig(qnet=qnet, learner=LearnerConfig(), replay=ReplayConfig(dim=16),
                                      index=IndexConfig()))
    train = to_dict(TrainConfig(data=DataConfig(source="cases", cases="c.jsonl", rewards="r.jsonl"), qnet=qnet))
    return [*((LoopConfig, base) for base in loop), (SelectorConfig, selector), (TrainConfig, train)]


CONFIG_BASES = _config_bases()
configs = st.sampled_from(range(len(CONFIG_BASES))).flatmap(
    lambda i: st.tuples(st.just(CONFIG_BASES[i][0]), mutations(CONFIG_BASES[i][1]) | json_values))


@settings(FUZZ, max_examples=examples(150))
@given(config=configs)
def test_config_json_loads_or_refuses_in_one_line(workdir: Path, config: tuple[type, Any]) -> None:
    record(__name__, "inputs")
    cls, data = config
    path = workdir / "config.json"
    path.write_bytes(_dumps(data))
    try:
        load_json(cls, path)
    except Exception as error:  # noqa: BLE001
        assert isinstance(error, (ConfigError, MementoError)), f"{cls.__name__}: {type(error).__name__}: {error}"
        _one_line(error)
        assert len(str(error)) < 1000, str(error)


# ---------------------------------------------------------------- (c) HTTP bodies, a real selector


@pytest.fixture(scope="module")
def http(workdir: Path) -> Iterator[Any]:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from memento.selector.export import load_selector
    from memento.serve.app import create_app
    from tests.loop_env import HashingEncoder

    art = Path(shutil.copytree(Path(__file__).resolve().parents[1] / "fixtures" / "artifacts" / "v1-selector",
                               workdir / "selector"))
    with load_selector(art, learn=False, seed=0, encoder=HashingEncoder(dim=16)) as selector:
        with TestClient(create_app(selector, token=None)) as client:
            yield client


_embeddings = st.lists(st.floats(-1, 1, width=32) | _values, min_size=0, max_size=20) | _values
_http_fields = {
    "/v1/select": {"query": st.sampled_from(["capital of peru", ""]) | _values, "embedding": _embeddings,
                   "k": st.integers(-2, 40) | _values, "mode": st.sampled_from(["sample", "greedy"]) | _values,
                   "env": _values},
    "/v1/feedback": {"selection_id": st.text(max_size=10) | _values, "reward": st.floats(-1, 2) | _values},
    "/v1/cases": {"state": st.text(max_size=10) | _values, "action": st.text(max_size=10) | _values,
                  "reward": st.floats(-1, 2) | _values, "env": _values, "meta": _values, "embedding": _embeddings},
}
bodies = st.sampled_from(sorted(_http_fields)).flatmap(lambda route: st.tuples(
    st.just(route), st.fixed_dictionaries({}, optional=_http_fields[route]).map(_dumps)
    | json_values.map(_dumps) | st.binary(max_size=30)))


@settings(FUZZ, max_examples=examples(200))
@given(body=bodies)
def test_http_bodies_get_2xx_or_a_4xx_problem(http: Any, body: tuple[str, bytes]) -> None:
    record(__name__, "inputs")
    record(__name__, "requests")
    route, content = body
    response = http.post(route, content=content, headers={"Content-Type": "application/json"})
    assert response.status_code < 500, (route, content, response.status_code, response.text)
    if response.status_code >= 400:
        assert "detail" in response.json(), response.text
    elif route == "/v1/cases":  # what was stored reads back
        stored = http.get(f"/v1/cases/{response.json()['id']}")
        assert stored.status_code == 200, stored.text


# ---------------------------------------------------------------- (d) memento bank import


@pytest.fixture(scope="module")
def bank_dir(workdir: Path) -> Path:
    from memento.bank import CaseBank

    CaseBank.create(workdir / "bank", 8).close()  # no encoder: a file the reader takes fails on that, still rc 2
    return workdir / "bank"


@settings(FUZZ, max_examples=examples(25))
@given(job=st.sampled_from([("case", _CASE), ("memento-memory", _MEMORY), ("memento-np-memory", _NP),
                            ("memento-training", _PAIR)]).flatmap(lambda j: st.tuples(st.just(j[0]), _files_for(j[1]))))
def test_bank_import_refuses_in_one_line_and_changes_nothing(workdir: Path, bank_dir: Path, capsys: Any,
                                                             job: tuple[str, bytes]) -> None:
    from memento.cli.entry import main

    record(__name__, "inputs")
    fmt, content = job

    path = workdir / "import.jsonl"
    path.write_bytes(content)
    before = {p.name: p.read_bytes() for p in sorted(bank_dir.iterdir())}
    try:
        read_case_file(path, fmt)  # type: ignore[arg-type]
        expected = None
    except MementoError as error:
        expected = f"memento: error: {error}\n"
    capsys.readouterr()
    assert main(["bank", "import", "--format", fmt, str(path), "--bank", str(bank_dir)]) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and captured.err.startswith("memento: error: "), captured.err
    if expected is not None:
        assert captured.err == expected
    assert {p.name: p.read_bytes() for p in sorted(bank_dir.iterdir())} == before
