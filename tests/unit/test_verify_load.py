"""``memento verify`` and ``load_selector`` accept and refuse the same artifacts.

A corpus of broken artifacts, each a copy of one small artifact with one defect and its manifest
re-signed (every sha256, size and row digest recomputed, as whoever edited it would), so that the check
under test is never the checksum. Both must refuse every one with the project's error type (a
``MementoError``: ``CheckpointError`` or ``DimensionError``) in one line; the few harmless edits at the
end must be accepted by both.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load, save_file

from memento.cli.entry import main
from memento.errors import CheckpointError, DimensionError, MementoError
from memento.selector.artifact import BANK_DB, FEEDBACK_NAME, MANIFEST_NAME, REQUIRED_FILES
from memento.selector.export import load_selector, verify
from tests.unit.test_artifact_security import build_artifact, rehash

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SAFETENSORS = ("qnet.safetensors", "learner/learner.safetensors", "replay/replay.safetensors")
Edit = Callable[[Path, Path], dict[str, Path] | None]


def _json(rel: str, change: Callable[[dict[str, Any]], Any]) -> Edit:
    def edit(art: Path, outside: Path) -> None:
        data = json.loads((art / rel).read_text())
        change(data)
        (art / rel).write_text(json.dumps(data))
    return edit


def _set(rel: str, keys: str, value: Any) -> Edit:
    """Set ``data[k1][k2]...`` (keys dot-separated) in a JSON file."""
    *path, last = keys.split(".")

    def change(data: dict[str, Any]) -> None:
        for key in path:
            data = data[key]
        data[last] = value
    return _json(rel, change)


def _drop(rel: str, key: str) -> Edit:
    return _json(rel, lambda data: data.pop(key))


def load_file(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file, in memory (not mapped: the file is rewritten next)."""
    return load(path.read_bytes())


def _pickle(rel: str) -> Edit:
    def edit(art: Path, outside: Path) -> None:
        torch.save(load_file(art / rel), art / rel)  # a pickle (torch's zip format) under a .safetensors name
    return edit


def _truncate(rel: str) -> Edit:
    def edit(art: Path, outside: Path) -> None:
        data = (art / rel).read_bytes()
        (art / rel).write_bytes(data[: len(data) - 5])
    return edit


def _qnet_metadata_dim(art: Path, outside: Path) -> None:
    from safetensors import safe_open

    with safe_open(str(art / "qnet.safetensors"), framework="pt") as handle:
        metadata = handle.metadata()
    config = json.loads(metadata["qnet_config"])
    config["dim"] = 32
    save_file(load_file(art / "qnet.safetensors"), str(art / "qnet.safetensors"),
              metadata={**metadata, "qnet_config": json.dumps(config)})


def _sql(rel: str, statement: str) -> Edit:
    def edit(art: Path, outside: Path) -> None:
        conn = sqlite3.connect(art / rel)
        with conn:
            conn.execute(statement)
        conn.close()
    return edit


def _bank_config_dim(art: Path, outside: Path) -> None:
    conn = sqlite3.connect(art / BANK_DB)
    config = json.loads(conn.execute("SELECT value FROM meta WHERE key = 'config'").fetchone()[0])
    config["dim"] = 32
    with conn:
        conn.execute("UPDATE meta SET value = ? WHERE key = 'config'", (json.dumps(config),))
    conn.close()


def _garbage(rel: str, data: bytes = b"not what it should be\n") -> Edit:
    def edit(art: Path, outside: Path) -> None:
        (art / rel).write_bytes(data)
    return edit


def _delete(rel: str) -> Edit:
    def edit(art: Path, outside: Path) -> None:
        (art / rel).unlink()
    return edit


def _entry(name: str) -> Edit:
    def edit(art: Path, outside: Path) -> dict[str, Path]:
        target = outside / "sentinel.txt"
        return {str(target) if name == "ABSOLUTE" else name: target}
    return edit


def _link(rel: str) -> Edit:
    def edit(art: Path, outside: Path) -> None:
        target = outside / "copy"
        if os.path.lexists(art / rel):
            shutil.move(str(art / rel), str(target))
        else:
            target.write_bytes(b"sentinel")
        os.symlink(target, art / rel)
    return edit


BAD_VERSIONS = ("abc", [1], 99, -1, 1.5, True, None)
CORPUS: dict[str, Edit] = {
    **{f"pickle {rel}": _pickle(rel) for rel in SAFETENSORS},
    **{f"truncated {rel}": _truncate(rel) for rel in SAFETENSORS},
    **{f"not safetensors {rel}": _garbage(rel) for rel in SAFETENSORS},
    # the embedding dimension, in each place that records it
    "dim encoder.json": _set("encoder.json", "dim", 32),
    "dim config.json qnet": _set("config.json", "qnet.dim", 32),
    "dim config.json qnet and replay": _json("config.json", lambda d: (d["qnet"].update(dim=32),
                                                                       d["replay"].update(dim=32))),
    "dim learner.json": _set("learner/learner.json", "qnet_config.dim", 32),
    "dim learner/config.json": _set("learner/config.json", "qnet.dim", 32),
    "dim replay.json": _set("replay/replay.json", "config.dim", 32),
    "dim qnet.safetensors metadata": _qnet_metadata_dim,
    "dim bank config": _bank_config_dim,
    "dim bank embeddings": _sql(BANK_DB, "UPDATE cases SET embedding = zeroblob(128) WHERE pos = 0"),
    "dim feedback state": _sql(FEEDBACK_NAME, "UPDATE feedback SET state = zeroblob(8) WHERE seq = 4"),
    "dim manifest": _set(MANIFEST_NAME, "dim", 32),
    "dim manifest type": _set(MANIFEST_NAME, "dim", [16]),
    # format versions
    **{f"version {rel} {value!r}": _set(rel, "format_version", value) for value in BAD_VERSIONS
       for rel in (MANIFEST_NAME, "encoder.json", "learner/learner.json", "replay/replay.json")},
    **{f"version {rel} {value!r}": _sql(rel, f"UPDATE meta SET value = '{value}' WHERE key = 'format_version'")
       for value in ("abc", "99", "-1", "1.5") for rel in (BANK_DB, FEEDBACK_NAME)},
    "format qnet.safetensors": lambda art, outside: save_file(load_file(art / "qnet.safetensors"),
                                                              str(art / "qnet.safetensors")),
    "format bank": _sql(BANK_DB, "UPDATE meta SET value = 'other' WHERE key = 'format'"),
    "format feedback": _sql(FEEDBACK_NAME, "UPDATE meta SET value = 'other' WHERE key = 'format'"),
    # missing keys and wrong types
    **{f"missing learner.json {key}": _drop("learner/learner.json", key)
       for key in ("uid", "updates", "generator_device", "config", "qnet_config", "optimizer", "format")},
    **{f"missing replay.json {key}": _drop("replay/replay.json", key)
       for key in ("uid", "config", "ptr", "size", "added", "format")},
    **{f"missing encoder.json {key}": _drop("encoder.json", key) for key in ("dim", "format")},
    **{f"missing config.json {key}": _drop("config.json", key) for key in ("qnet", "learner", "replay")},
    "missing learner/config.json qnet": _drop("learner/config.json", "qnet"),
    "missing bank uid": _sql(BANK_DB, "DELETE FROM meta WHERE key = 'uid'"),
    "type learner.json qnet_config": _set("learner/learner.json", "qnet_config", "mlp"),
    "type learner.json updates": _set("learner/learner.json", "updates", "3"),
    "type learner.json config": _set("learner/learner.json", "config", []),
    "type learner.json optimizer": _set("learner/learner.json", "optimizer", {"state": 1}),
    "type learner.json qnet_config.hidden": _set("learner/learner.json", "qnet_config.hidden", "x"),
    "type replay.json size": _set("replay/replay.json", "size", "abc"),
    "value replay.json ptr": _set("replay/replay.json", "ptr", -1),
    "type replay.json config": _set("replay/replay.json", "config", 5),
    "type encoder.json dim": _set("encoder.json", "dim", "16"),
    "type config.json k": _set("config.json", "k", "four"),
    # issue 40: k = candidates = 10**12 passed verify and loaded
    "bound config.json k": _set("config.json", "k", 10 ** 12),
    "bound config.json candidates": _set("config.json", "candidates", 10 ** 12),
    "bound config.json k and candidates": _json("config.json", lambda d: d.update(k=10 ** 12, candidates=10 ** 12)),
    "bound config.json warmup": _set("config.json", "warmup", 10 ** 12),
    "bound config.json updates_per_step": _set("config.json", "updates_per_step", 10 ** 6),
    "bound config.json max_pending": _set("config.json", "max_pending", 10 ** 12),
    "not json encoder.json": _garbage("encoder.json"),
    "not json config.json": _garbage("config.json"),
    "not json learner.json": _garbage("learner/learner.json"),
    "list config.json": _garbage("config.json", b"[]"),
    "not sqlite bank": _garbage(BANK_DB),
    "not sqlite feedback": _garbage(FEEDBACK_NAME),
    "uid mismatch learner": _set("learner/learner.json", "uid", "0" * 32),
    # manifest entries outside the artifact, files missing, links
    **{f"entry {name}": _entry(name) for name in ("ABSOLUTE", "../outside/sentinel.txt", "bank/../x", "a\\b", "")},
    **{f"missing {rel}": _delete(rel) for rel in REQUIRED_FILES},
    **{f"link {rel}": _link(rel) for rel in ("qnet.safetensors", "learner", "bank", f"{FEEDBACK_NAME}-wal",
                                            ".save.ready", "extra")},
}

ACCEPTED: dict[str, Edit] = {
    "garbage index.faiss (rebuilt from SQLite)": _garbage("bank/index.faiss"),
    "an extra regular file": _garbage("notes.txt"),
}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_artifact(tmp_path_factory.mktemp("built"))


def _broken(built: Path, tmp_path: Path, name: str, edit: Edit) -> Path:
    art = Path(shutil.copytree(built, tmp_path / "art"))
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "sentinel.txt").write_text("outside\n")
    rehash(art, extra=edit(art, outside))
    return art


def _refusal(call: Callable[[], Any]) -> MementoError:
    try:
        call()
    except MementoError as error:
        return error
    raise AssertionError("accepted")


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_verify_and_load_refuse_the_same_broken_artifacts(built: Path, tmp_path: Path, name: str) -> None:
    art = _broken(built, tmp_path, name, CORPUS[name])
    by_verify = _refusal(lambda: verify(art))
    by_load = _refusal(lambda: load_selector(art).close())
    for error in (by_verify, by_load):
        assert isinstance(error, (CheckpointError, DimensionError)), repr(error)
        assert "\n" not in str(error) and str(art) in str(error), str(error)


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_verify_and_load_accept_the_same_harmless_edits(built: Path, tmp_path: Path, name: str) -> None:
    art = _broken(built, tmp_path, name, ACCEPTED[name])
    verify(art)
    load_selector(art).close()


@pytest.mark.parametrize("value", ["abc", [1]])
def test_cli_verify_prints_one_line_for_a_bad_format_version(built: Path, tmp_path: Path, value: Any,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    art = _broken(built, tmp_path, "version", _set(MANIFEST_NAME, "format_version", value))
    assert main(["verify", str(art)]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "format_version" in err and "Traceback" not in err, err


def test_load_reports_a_learner_json_without_qnet_config_in_one_line(built: Path, tmp_path: Path) -> None:
    art = _broken(built, tmp_path, "missing", _drop("learner/learner.json", "qnet_config"))
    with pytest.raises(CheckpointError, match=r"learner\.json: damaged learner state \('qnet_config' is missing"):
        load_selector(art)
