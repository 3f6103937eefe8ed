"""An artifact never reaches outside its directory: no symbolic link is followed, no manifest entry escapes.

A small artifact (8 cases, dim 16, a few feedbacks, one save) is built once per module with
:func:`memento.selector.export.create_selector`; every test works on a copy. A planted link points to a copy of
what it replaces (so its checksum still matches) or to a directory of sentinel files, and the test
checks that loading, verifying and saving refuse with one ``CheckpointError`` line naming the entry and
that nothing outside the artifact changed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from functools import partial
from pathlib import Path

import pytest

from memento.bank import CaseBank
from memento.bank.bankfile import digest as bank_rows_digest
from memento.errors import CheckpointError
from memento.selector.artifact import (
    BANK_DB,
    DERIVED_FILES,
    FEEDBACK_NAME,
    MANIFEST_NAME,
    READY_DIR,
    REQUIRED_FILES,
    STAGING_DIR,
    feedback_rows_digest,
)
from memento.selector.export import create_selector, load_selector, verify
from tests.loop_env import HashingEncoder, make_env

pytestmark = pytest.mark.usefixtures("one_torch_thread")

DIM = 16
FILES = sorted({*REQUIRED_FILES, *DERIVED_FILES, MANIFEST_NAME})
DIRS = ("bank", "learner", "replay")
"""At least these; the tests plant links in place of whatever the artifact holds."""


def build_artifact(root: Path) -> Path:
    """A small trained artifact: 8 cases, 3 feedbacks saved, 1 recorded after the save."""
    env, encoder = make_env(), HashingEncoder(dim=DIM)
    with CaseBank.create(root / "bank", DIM) as bank:
        bank.add(env.seed_cases[:8], encoder.encode([c.state for c in env.seed_cases[:8]]))
    out = create_selector(root / "bank", root / "selector", k=2, warmup=1, replay_capacity=16)
    with load_selector(out, learn=True) as selector:
        for task in env.tasks[:3]:
            result = selector.select(encoder.encode(task.question), k=2)
            selector.feedback(result.selection_id, 1.0)
        selector.save()
        result = selector.select(encoder.encode(env.tasks[3].question), k=2)
        selector.feedback(result.selection_id, 0.0)
    return out


def rehash(root: Path, extra: dict[str, Path] | None = None) -> None:
    """Re-sign an edited artifact as an attacker would: the sha256 and size of every listed file (read through
    links), ``extra`` entries added, and the live files' row digests, so that no checksum gives it away."""
    manifest = json.loads((root / MANIFEST_NAME).read_text())
    paths = {rel: root / rel for rel in manifest["files"]}
    paths.update(extra or {})
    files = {}
    for rel, path in paths.items():
        if os.path.lexists(path):
            data = path.read_bytes()
            files[rel] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
        else:
            files[rel] = manifest["files"][rel]
    manifest["files"] = files
    for rel, digest in ((BANK_DB, bank_rows_digest), (FEEDBACK_NAME, feedback_rows_digest)):
        try:
            rows = manifest["live"][rel]["rows"]
            manifest["live"][rel]["digest"] = digest(root / rel, rows)
        except Exception:  # an edited SQLite file may not be readable: keep the recorded digest
            pass
    (root / MANIFEST_NAME).write_text(json.dumps(manifest))


def snapshot(base: Path) -> dict[str, bytes | None]:
    """Every entry under ``base`` with its bytes (``None`` for a directory)."""
    out: dict[str, bytes | None] = {}
    for path in sorted(base.rglob("*")):
        out[path.relative_to(base).as_posix()] = None if path.is_dir() else path.read_bytes()
    return out


def refuses(call, *names: str) -> str:
    """``call()`` raises one ``CheckpointError`` line that names every one of ``names``."""
    with pytest.raises(CheckpointError) as caught:
        call()
    message = str(caught.value)
    assert "\n" not in message, message
    for name in names:
        assert name in message, (name, message)
    return message


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_artifact(tmp_path_factory.mktemp("built"))


@pytest.fixture
def art(built: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(built, tmp_path / "art"))


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory beside the artifact with sentinel content."""
    base = tmp_path / "outside"
    base.mkdir()
    (base / "sentinel.txt").write_text("do not touch\n")
    return base


def _plant_link(art: Path, rel: str, outside: Path) -> None:
    """Move ``art/rel`` outside and leave a link to it (same content: the checksums still match)."""
    target = outside / rel.replace("/", "__")
    shutil.move(str(art / rel), str(target))
    os.symlink(target, art / rel, target_is_directory=target.is_dir())


def _entries(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))


def test_the_small_artifact_has_every_part(built: Path) -> None:
    entries = _entries(built)
    assert set(FILES) | set(DIRS) <= set(entries)
    assert verify(built)["feedbacks_since_save"] == 1


def test_a_link_in_place_of_any_file_or_directory_is_refused(built: Path, tmp_path: Path) -> None:
    """Every file and every directory of the artifact in turn (whatever it holds: listed or not)."""
    for i, rel in enumerate(_entries(built)):
        art = Path(shutil.copytree(built, tmp_path / f"art{i}"))
        outside = tmp_path / f"outside{i}"
        outside.mkdir()
        (outside / "sentinel.txt").write_text("do not touch\n")
        _plant_link(art, rel, outside)
        before = snapshot(outside)
        refuses(partial(verify, art), rel)
        refuses(partial(load_selector, art), rel)
        refuses(partial(load_selector, art, verify=False), rel)
        assert snapshot(outside) == before, rel
        shutil.rmtree(art)


@pytest.mark.parametrize("rel", [READY_DIR, STAGING_DIR, f"{FEEDBACK_NAME}-wal", f"{FEEDBACK_NAME}-shm",
                                 f"{BANK_DB}-wal", f"{BANK_DB}-shm", f"{BANK_DB}-journal", "bank/index.faiss.tmp",
                                 "learner/extra", "extra"])
def test_an_extra_link_anywhere_is_refused(art: Path, outside: Path, rel: str) -> None:
    """A link the manifest does not list (staging directories, SQLite sidecars, anything else)."""
    if rel in (READY_DIR, STAGING_DIR):  # a "completed save" that would move the sentinel files in
        os.symlink(outside, art / rel, target_is_directory=True)
    else:
        os.symlink(outside / "sentinel.txt", art / rel)
    before = snapshot(outside)
    refuses(lambda: verify(art), rel)
    refuses(lambda: load_selector(art), rel)
    assert snapshot(outside) == before


def test_a_ready_link_does_not_move_files_in(art: Path, outside: Path) -> None:
    """The reported defect: ``.save.ready`` linked to a directory made loading move its files into the artifact."""
    victim = outside / "v"
    victim.mkdir()
    (victim / "a").write_text("x\n")
    os.symlink(victim, art / READY_DIR, target_is_directory=True)
    refuses(lambda: load_selector(art, learn=True), READY_DIR)
    assert (victim / "a").read_text() == "x\n" and not (art / "a").exists()


@pytest.mark.parametrize("entry", ["ABSOLUTE", "../outside/sentinel.txt", "bank/../../outside/sentinel.txt",
                                   "bank\\..\\x", "", "./config.json", "bank//cases.sqlite", ".save.ready/x",
                                   "bank/."])
def test_manifest_entries_outside_the_artifact_are_refused(art: Path, outside: Path, entry: str) -> None:
    entry = str(outside / "sentinel.txt") if entry == "ABSOLUTE" else entry
    rehash(art, extra={entry: outside / "sentinel.txt"})  # the right size and sha256: only the name gives it away
    manifest = art / MANIFEST_NAME
    assert entry in json.loads(manifest.read_text())["files"]
    refuses(lambda: verify(art), MANIFEST_NAME, repr(entry))
    refuses(lambda: load_selector(art), MANIFEST_NAME, repr(entry))
    refuses(lambda: load_selector(art, verify=False), MANIFEST_NAME, repr(entry))


@pytest.mark.parametrize("rel", ["bank", "learner", "replay", STAGING_DIR, READY_DIR])
def test_saving_in_place_refuses_a_link_planted_after_loading(art: Path, outside: Path, rel: str) -> None:
    with load_selector(art, learn=True) as selector:
        if rel in DIRS:
            _plant_link(art, rel, outside)
        else:
            os.symlink(outside, art / rel, target_is_directory=True)
        before = {k: v for k, v in snapshot(outside).items() if not k.endswith(("-wal", "-shm"))}
        refuses(selector.save, rel)
        assert {k: v for k, v in snapshot(outside).items() if not k.endswith(("-wal", "-shm"))} == before
        if rel not in DIRS:  # the link removed, the next save works and the result loads
            os.unlink(art / rel)
            selector.save()
    if rel not in DIRS:
        assert verify(art)["feedbacks_since_save"] == 0
        assert snapshot(outside) == {"sentinel.txt": b"do not touch\n"}


def test_saving_a_copy_refuses_links(art: Path, outside: Path, tmp_path: Path) -> None:
    empty = outside / "empty"
    empty.mkdir()
    os.symlink(empty, tmp_path / "link", target_is_directory=True)
    with load_selector(art) as selector:
        refuses(lambda: selector.save(tmp_path / "link"), "link")
        assert list(empty.iterdir()) == [] and (tmp_path / "link").is_symlink()
        _plant_link(art, "learner", outside)
        refuses(lambda: selector.save(tmp_path / "copy"), "learner")
        assert not (tmp_path / "copy").exists()


def test_a_bank_link_sends_no_write_outside(art: Path, outside: Path) -> None:
    """The reported defect: with ``bank/`` a link, cases were added outside and the next save did not load."""
    _plant_link(art, "bank", outside)
    before = snapshot(outside)
    refuses(lambda: load_selector(art, learn=True), "bank")
    assert snapshot(outside) == before
