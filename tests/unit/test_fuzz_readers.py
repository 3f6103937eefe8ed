"""Every reader of a user's file or argument loads its input or refuses it in one line, and writes nothing.

Hypothesis (derandomised, bounded) over the readers of issue 31: the JSON files of a selector artifact through
``memento verify`` (manifest, encoder spec, config, learner and replay metadata, the bank's index description),
``memento train --config``, ``memento train-encoder --config``, ``--templates`` (memory-system prompt templates),
labels files, Memento's ``plan`` strings and ``memento bank search`` with any argument text, including the lone
surrogates Python makes of argv bytes that are not UTF-8. Each example either loads, or exits 2 with exactly one
stderr line ``memento: error: ...`` and no traceback; the files the command was given are left byte for byte.
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

from memento.cli.entry import main
from memento.errors import MementoError
from tests.fuzzing import FUZZ, examples, record
from tests.unit.test_artifact_security import rehash, snapshot
from tests.unit.test_fuzz import _dumps, json_values, mutations, nasty

pytestmark = pytest.mark.probe  # `make probe` runs it scaled up

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "artifacts" / "v1-selector"
DIRECTORY = b"<a directory>"
"""Stands for a directory where the file should be."""

# documents that broke a JSON reader once: past Python's digit limit, nested past the recursion limit, nested
# past memento's limit, a lone surrogate, bytes that are not UTF-8, empty, the wrong top level, NaN, a BOM
KNOWN_BAD = [b'{"format": "x", "a": ' + b"9" * 5000 + b"}", b"[" * 100_000 + b"]" * 100_000,
             b'{"a": ' + b"[" * 150 + b"]" * 150 + b"}", b'{"format": "\\ud800"}', b'{"\xff": 1}', b"", b"null",
             b"[]", b"NaN", b'"' + b"x" * 20_000 + b'"', b"\xef\xbb\xbf{}", b"\x00", DIRECTORY]


def documents(*bases: dict[str, Any]) -> st.SearchStrategy[bytes]:
    """JSON documents: mostly one of ``bases`` with nasty fields, else any JSON value, bytes or a known bad one."""
    mutated = mutations(*bases).map(_dumps)
    return st.one_of(mutated, mutated, json_values.map(_dumps), st.binary(max_size=40), st.sampled_from(KNOWN_BAD))


def _write(path: Path, content: bytes) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    if content == DIRECTORY:
        path.mkdir()
    else:
        path.write_bytes(content)


def _one_line_or_ok(code: int, err: str, *, may_load: bool = True) -> None:
    """Exit 0 (when loading is possible), or 2 with one ``memento: error:`` line; never a traceback."""
    assert "Traceback" not in err, err[-2000:]
    if code == 0 and may_load:
        return
    assert code == 2, (code, err[-2000:])
    assert err.startswith("memento: error: ") and err.count("\n") == 1 and err.endswith("\n"), err[-2000:]
    assert len(err) < 2000, f"{len(err)} characters: {err[:300]}..."


def _main(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str]:
    capsys.readouterr()
    code = main(argv)
    return code, capsys.readouterr().err


def _reader_error(call: Callable[[], Any]) -> MementoError | None:
    """None when ``call()`` loads; the MementoError it raised (one line) otherwise; anything else fails."""
    try:
        call()
    except MementoError as error:
        assert "\n" not in str(error) and "\r" not in str(error), repr(str(error))
        assert len(str(error)) < 2000, str(error)[:300]
        return error
    return None


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="memento-fuzz-readers-") as tmp:
        yield Path(tmp)


# ---------------------------------------------------------------- memento verify: an artifact's JSON files

ARTIFACT_JSON = ["manifest.json", "encoder.json", "config.json", "learner/config.json", "learner/learner.json",
                 "replay/replay.json", "bank/index.json"]


def _artifact_docs() -> st.SearchStrategy[tuple[str, bytes]]:
    def for_file(rel: str) -> st.SearchStrategy[tuple[str, bytes]]:
        base = json.loads((FIXTURE / rel).read_text(encoding="utf-8"))
        return st.tuples(st.just(rel), documents(base))
    return st.sampled_from(ARTIFACT_JSON).flatmap(for_file)


@settings(FUZZ, max_examples=examples(30))
@given(job=_artifact_docs())
@example(job=("manifest.json", KNOWN_BAD[0])).via("issue 31: a 5000-digit integer in the manifest")
@example(job=("manifest.json", KNOWN_BAD[1])).via("issue 31: nesting past the recursion limit")
@example(job=("encoder.json", b'{"format": "memento-encoder", "format_version": 1' + b"0" * 400 + b"}"))
@example(job=("learner/learner.json", KNOWN_BAD[1]))
@example(job=("learner/config.json", KNOWN_BAD[0]))
@example(job=("replay/replay.json", DIRECTORY))
def test_verify_loads_or_refuses_every_json_file_in_one_line(workdir: Path, capsys: pytest.CaptureFixture[str],
                                                             job: tuple[str, bytes]) -> None:
    rel, content = job
    record(__name__, "inputs")
    art = workdir / "artifact"
    shutil.rmtree(art, ignore_errors=True)
    shutil.copytree(FIXTURE, art)
    _write(art / rel, content)
    if rel != "manifest.json" and content != DIRECTORY:
        rehash(art)  # re-signed, so the check under test is never the checksum
    before = snapshot(art)
    code, err = _main(capsys, ["verify", str(art)])
    if "Traceback" in err:
        record(__name__, "tracebacks")
    _one_line_or_ok(code, err)
    assert snapshot(art) == before


# ---------------------------------------------------------------- memento train --config


def _train_base() -> dict[str, Any]:
    from memento.config import QNetConfig, to_dict
    from memento.training.config import DataConfig, TrainConfig

    return to_dict(TrainConfig(data=DataConfig(source="cases", cases="missing-cases.jsonl",
                                               rewards="missing-rewards.jsonl"), qnet=QNetConfig(dim=16)))


@settings(FUZZ, max_examples=examples(40))
@given(content=documents(_train_base()))
@example(content=KNOWN_BAD[0]).via("issue 31: train --config with a 5000-digit integer")
@example(content=KNOWN_BAD[1])
@example(content=b'{"learner": {"lr": ' + b"9" * 400 + b"}}")
def test_train_config_loads_or_refuses_in_one_line(workdir: Path, capsys: pytest.CaptureFixture[str],
                                                   content: bytes) -> None:
    """The data files never exist, so a config that loads stops at them (exit 2), before any model loads."""
    record(__name__, "inputs")
    case = workdir / "train"
    shutil.rmtree(case, ignore_errors=True)
    case.mkdir()
    _write(case / "config.json", content)
    before = snapshot(case)
    code, err = _main(capsys, ["train", "--config", str(case / "config.json"), "--out", str(case / "run")])
    _one_line_or_ok(code, err, may_load=False)
    assert snapshot(case) == before


# ---------------------------------------------------------------- memento train-encoder --config


def _simcse_base() -> dict[str, Any]:
    from memento.config import to_dict
    from memento.training.config import SimCSEConfig

    return to_dict(SimCSEConfig(data=["missing.jsonl"]))


@settings(FUZZ, max_examples=examples(40))
@given(content=documents(_simcse_base()))
@example(content=KNOWN_BAD[0]).via("issue 31: train-encoder --config with a 5000-digit integer")
@example(content=KNOWN_BAD[1])
@example(content=b'{"lr": ' + b"9" * 400 + b', "data": ["x"]}')
def test_train_encoder_config_loads_or_refuses_in_one_line(workdir: Path, capsys: pytest.CaptureFixture[str],
                                                           content: bytes) -> None:
    """The config as the command reads it; a refused one also through ``memento train-encoder`` (a config that
    loads is not trained on: that would take minutes)."""
    from memento.cli.entry import build_parser
    from memento.training.simcse_cli import config_from_args

    record(__name__, "inputs")
    case = workdir / "train-encoder"
    shutil.rmtree(case, ignore_errors=True)
    case.mkdir()
    _write(case / "config.json", content)
    before = snapshot(case)
    argv = ["train-encoder", "--config", str(case / "config.json"), "--out", str(case / "run")]
    error = _reader_error(lambda: config_from_args(build_parser().parse_args(argv)))
    if error is not None:
        code, err = _main(capsys, argv)
        _one_line_or_ok(code, err, may_load=False)
        assert err == f"memento: error: {error}\n"
    assert snapshot(case) == before


# ---------------------------------------------------------------- --templates (memory-system prompt templates)


def _templates_base() -> dict[str, Any]:
    from memento.systems.llm import BuilderTemplates

    return {name: text for name, text in BuilderTemplates().to_json().items() if name in ("focus", "reflect")}


@pytest.fixture(scope="module")
def online_tasks(workdir: Path) -> Path:
    path = workdir / "tasks.jsonl"
    path.write_text('{"id": "a", "question": "q?", "answers": ["x"]}\n', encoding="utf-8")
    return path


_TEMPLATE_VALUES = st.sampled_from(["{task:999999999}", "{task!z}", "{0}", "{}", "{task.upper}", "{task[0]}",
                                    "x\ud800", "{", "}", "{{ok}}", "{goal}", "", " "])


@settings(FUZZ, max_examples=examples(40))
@given(content=documents(_templates_base()) | st.dictionaries(st.sampled_from(["focus", "reflect", "skills"]),
                                                               _TEMPLATE_VALUES | nasty, min_size=1,
                                                               max_size=2).map(_dumps))
@example(content=KNOWN_BAD[0]).via("issue 31: --templates with a 5000-digit integer")
@example(content=b'{"focus": "{env:999999999}"}')
@example(content=b'{"reflect": "{goal!z}"}')
def test_templates_load_or_refuse_in_one_line(workdir: Path, online_tasks: Path, capsys: pytest.CaptureFixture[str],
                                              content: bytes) -> None:
    """The templates file as ``--templates`` reads it; a refused one also through ``memento online`` (which then
    creates no run directory). Templates that load render with every field they may use."""
    from memento.systems.llm import TEMPLATE_FIELDS, BuilderTemplates

    record(__name__, "inputs")
    case = workdir / "templates"
    shutil.rmtree(case, ignore_errors=True)
    case.mkdir()
    _write(case / "templates.json", content)
    before = snapshot(case)
    loaded: list[Any] = []
    error = _reader_error(lambda: loaded.append(BuilderTemplates.from_json(case / "templates.json")))
    if error is None:
        for name, fields in TEMPLATE_FIELDS.items():
            getattr(loaded[0], name).format(**{field: 1 for field in fields}).encode("utf-8")
    else:
        code, err = _main(capsys, ["online", "--tasks", str(online_tasks), "--planner", "gemma",
                                   "--out", str(case / "run"), "--templates", str(case / "templates.json")])
        _one_line_or_ok(code, err, may_load=False)
        assert err == f"memento: error: {error}\n"
    assert snapshot(case) == before


# ---------------------------------------------------------------- labels files

_LABEL = {"task_id": "t", "state": "q", "answer": "a", "candidate_ids": ["c1", "c2"], "logprob": [-1.0, -2.0],
          "mean_logprob": [-1.0, -2.0], "n_tokens": [1, 1], "planner": "p", "prompt": "few_shot",
          "cosine": [0.9, 0.8], "sets": [["c1"], ["c2"]], "set_logprob": [-1.0, -2.0]}
_HUGE = ["9" * 400, "-" + "9" * 400, "1" + "0" * 309, "1e999", "NaN", "-Infinity", "true", "null", '"1"']


def _label_line(field: str, slot: int, literal: str) -> bytes:
    row = {key: list(value) if isinstance(value, list) else value for key, value in _LABEL.items()}
    row[field][slot] = "@@"
    return json.dumps(row).replace('"@@"', literal).encode()


@settings(FUZZ, max_examples=examples(40))
@given(lines=st.lists(documents(_LABEL) | st.builds(_label_line, st.sampled_from(
    ["logprob", "mean_logprob", "n_tokens", "cosine", "set_logprob"]), st.integers(0, 1), st.sampled_from(_HUGE)),
    min_size=1, max_size=3))
@example(lines=[_label_line("logprob", 0, "9" * 400)]).via("issue 31: OverflowError from math.isfinite")
@example(lines=[_label_line("n_tokens", 1, "9" * 400)])
def test_labels_files_load_or_refuse_in_one_line(workdir: Path, lines: list[bytes]) -> None:
    from memento.learn.labels import read_labels

    record(__name__, "inputs")
    path = workdir / "labels.jsonl"
    path.write_bytes(b"\n".join(line for line in lines if line != DIRECTORY) + b"\n")
    rows: list[Any] = []
    error = _reader_error(lambda: rows.extend(read_labels(path)))
    if error is not None:
        assert str(error).startswith(f"{path}:"), str(error)
    for row in rows:  # what loads is finite and written back as JSON
        json.dumps(row.to_json(), allow_nan=False).encode("utf-8")


# ---------------------------------------------------------------- Memento's plan strings

_PLAN_STRINGS = st.one_of(json_values.map(lambda v: _dumps(v).decode("utf-8", "replace")), st.text(max_size=20),
                          st.sampled_from([doc.decode("utf-8", "replace") for doc in KNOWN_BAD if doc != DIRECTORY]),
                          st.builds(lambda plan: json.dumps({"plan": plan}), json_values))


def _plan_file(kind: str, plan: str) -> bytes:
    rows = {"memento-memory": {"case": "Capital of Peru?", "plan": plan, "case_label": "positive"},
            "memento-training": {"query": "Capital of Peru?", "case": "Capital of Peru?", "case_label": "negative",
                                 "plan": plan, "truth_label": True}}
    return json.dumps(rows[kind]).encode("utf-8") + b"\n"


@settings(FUZZ, max_examples=examples(40))
@given(kind=st.sampled_from(["memento-memory", "memento-training"]), plan=_PLAN_STRINGS)
@example(kind="memento-memory", plan="9" * 5000).via("issue 31: a plan string past the digit limit")
@example(kind="memento-training", plan="[" * 100_000)
@example(kind="memento-memory", plan='{"plan": [' + "[" * 2000 + "]" * 2000 + "]}")
def test_memento_plan_strings_load_or_refuse_in_one_line(workdir: Path, kind: str, plan: str) -> None:
    from memento.formats import read_case_file

    record(__name__, "inputs")
    path = workdir / "plans.jsonl"
    path.write_bytes(_plan_file(kind, plan))
    loaded: list[Any] = []
    error = _reader_error(lambda: loaded.extend(read_case_file(path, kind)))  # type: ignore[arg-type]
    if error is not None:
        assert str(error).startswith(f"{path}:1: "), str(error)


# ---------------------------------------------------------------- memento bank search: argument text


@pytest.fixture(scope="module")
def vector_bank(workdir: Path) -> Path:
    from memento.bank import CaseBank

    CaseBank.create(workdir / "bank", 8).close()  # no encoder: a text that passes the argument checks ends there
    return workdir / "bank"


_ARG_TEXT = st.text(max_size=12) | st.binary(max_size=12).map(lambda b: b.decode("utf-8", "surrogateescape")) \
    | st.sampled_from(["\udcff\udcfe", "caf\udcc3", "\ud800", "a\udfffb", "", " ", "-", "x" * 5000])


@settings(FUZZ, max_examples=examples(60))
@given(text=_ARG_TEXT, env=st.none() | _ARG_TEXT, kind=st.none() | _ARG_TEXT)
@example(text="\udcff\udcfe", env=None, kind=None).via("issue 31: bank search with argv bytes \\xff\\xfe")
def test_bank_search_arguments_are_refused_in_one_line(vector_bank: Path, capsys: pytest.CaptureFixture[str],
                                                       text: str, env: str | None, kind: str | None) -> None:
    record(__name__, "inputs")
    argv = ["bank", "search", "--bank", str(vector_bank), *([f"--env={env}"] if env is not None else []),
            *([f"--kind={kind}"] if kind is not None else []), "--", text]
    before = snapshot(vector_bank)
    code, err = _main(capsys, argv)
    _one_line_or_ok(code, err, may_load=False)
    surrogate = any(v is not None and not v.isascii() and _has_surrogate(v) for v in (text, env, kind))
    assert ("is not UTF-8 text" in err) == surrogate, err
    assert snapshot(vector_bank) == before


def _has_surrogate(value: str) -> bool:
    return any(0xD800 <= ord(ch) <= 0xDFFF for ch in value)


@pytest.mark.slow
def test_bank_search_with_undecodable_argv_bytes_in_a_real_process(tmp_path: Path) -> None:
    """The real thing: argv bytes ``\\xff\\xfe`` reach the command as surrogate escapes and are refused."""
    import os
    import subprocess
    import sys

    from memento.bank import CaseBank

    CaseBank.create(tmp_path / "bank", 8).close()
    done = subprocess.run([sys.executable.encode(), b"-m", b"memento", b"bank", b"search", b"\xff\xfe",
                           b"--bank", os.fsencode(tmp_path / "bank")], capture_output=True, timeout=120)
    assert done.returncode == 2, done.stderr.decode(errors="replace")
    assert done.stderr == b"memento: error: TEXT is not UTF-8 text (byte 0xff at character 1)\n"


# ---------------------------------------------------------------- an artifact whose encoder weights are a pickle


def _pickle_encoder_artifact(root: Path) -> Path:
    """The fixture artifact with a transformers encoder of its own (``encoder/``) whose weights are a pickle."""
    import torch

    from memento.encoders import default_model_path

    art = Path(shutil.copytree(FIXTURE, root / "pickle-artifact"))
    files = art / "encoder"
    files.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        shutil.copyfile(default_model_path() / name, files / name)
    torch.save({"embeddings.word_embeddings.weight": torch.zeros(2, 2)}, files / "pytorch_model.bin")
    spec = json.loads((art / "encoder.json").read_text())
    spec.update(kind="transformers", files="encoder", model=None, model_id="a-pickled-model", description=None)
    (art / "encoder.json").write_text(json.dumps(spec))
    rehash(art, {f"encoder/{p.name}": p for p in files.iterdir()})
    return art


def test_an_artifact_with_pickle_encoder_weights_is_refused_at_load(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Refused by verify and by load_selector in one line naming the file, before any torch.load (not a 500 on
    every text select afterwards)."""
    import torch

    from memento.errors import CheckpointError
    from memento.selector.export import load_selector

    art = _pickle_encoder_artifact(tmp_path)
    loads: list[Any] = []
    monkeypatch.setattr(torch, "load", lambda *args, **kwargs: loads.append(args) or {})
    expected = f"{art / 'encoder' / 'pytorch_model.bin'}: pickle weights are not loaded; convert to safetensors"
    code, err = _main(capsys, ["verify", str(art)])
    assert code == 2 and err.startswith(f"memento: error: {expected}") and err.count("\n") == 1, err
    with pytest.raises(CheckpointError, match="pickle weights are not loaded"):
        load_selector(art, learn=False)
    assert loads == []
