"""The selector artifact is assembled from parts (``memento.selector.artifact.parts.PARTS``), and its manifest has one
owner (``memento.selector.artifact.manifest``).

- the files every manifest must list are the parts' files, in the parts' order;
- a part added to the list is saved with a new artifact, listed and hashed in its manifest, loaded and checked by
  the loader and ``verify``, and saved again in place and in a copy: no other code changes;
- the manifest's owner writes, reads and updates it; the modules that once named or rewrote ``manifest.json`` by
  hand (the Hub push, the inspector, export, the shipped selector) hold no such name.
"""

from __future__ import annotations

import ast
import hashlib
import json
from pathlib import Path
from typing import ClassVar

import pytest

import memento.selector.artifact.parts as parts
from memento.bank import CaseBank
from memento.errors import CheckpointError
from memento.selector.artifact import LIVE_FILES, REQUIRED_FILES
from memento.selector.artifact.manifest import (
    MANIFEST_NAME,
    has_manifest,
    manifest_path,
    read_manifest,
    read_manifest_object,
    with_file,
    write_manifest,
)
from memento.selector.export import create_selector, load_selector, verify
from tests.loop_env import HashingEncoder, make_env

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROOT = Path(__file__).resolve().parents[2]
DIM = 8


def _bank(root: Path) -> Path:
    env, encoder = make_env(), HashingEncoder(dim=DIM)
    with CaseBank.create(root / "bank", DIM) as bank:
        bank.add(env.seed_cases[:6], encoder.encode([c.state for c in env.seed_cases[:6]]))
    return root / "bank"


def test_the_required_files_are_the_parts_files_in_order() -> None:
    assert REQUIRED_FILES == tuple(name for part in parts.PARTS for name in part.files)
    assert REQUIRED_FILES == ("config.json", "encoder.json", "qnet.safetensors", "learner/learner.safetensors",
                              "learner/learner.json", "learner/config.json", "replay/replay.safetensors",
                              "replay/replay.json", "bank/cases.sqlite", "feedback.sqlite", "README.md")
    assert LIVE_FILES == ("bank/cases.sqlite", "feedback.sqlite")
    assert [type(part).__name__ for part in parts.PARTS] == ["ConfigPart", "EncoderPart", "QNetPart", "LearnerPart",
                                                             "ReplayPart", "BankPart", "FeedbackPart", "CardPart"]


class NotesPart(parts.Part):
    """A toy part: ``notes.txt`` holds the embedding dimension, which it checks against the encoder's."""

    files: ClassVar[tuple[str, ...]] = ("notes.txt",)

    def save(self, job: parts.SaveJob) -> None:
        (job.directory / "notes.txt").write_text(f"dim {job.spec.dim}\n", encoding="utf-8")

    def check(self, got: parts.Loaded) -> None:
        assert got.spec is not None
        if (got.root / "notes.txt").read_text(encoding="utf-8") != f"dim {got.spec.dim}\n":
            raise CheckpointError(f"{got.root / 'notes.txt'}: not this selector's notes")


def test_a_new_part_is_one_class_and_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    extended = (*parts.PARTS[:-1], NotesPart(), parts.PARTS[-1])  # the one line: the card stays last
    monkeypatch.setattr(parts, "PARTS", extended)
    monkeypatch.setattr(parts, "REQUIRED_FILES", tuple(name for part in extended for name in part.files))
    out = create_selector(_bank(tmp_path), tmp_path / "selector", k=2, warmup=1, replay_capacity=8)
    assert (out / "notes.txt").read_text() == f"dim {DIM}\n"
    assert "notes.txt" in read_manifest(out)["files"]
    with load_selector(out, learn=True) as selector:
        selector.feedback(selector.select(HashingEncoder(dim=DIM).encode("a question"), k=2).selection_id, 1.0)
        selector.save()
        selector.save(tmp_path / "copy")
    for artifact in (out, tmp_path / "copy"):
        assert verify(artifact)["files"] == len(read_manifest(artifact)["files"])
    (out / "notes.txt").write_text("dim 3\n")
    with pytest.raises(CheckpointError, match="notes.txt: sha256 differs"):
        verify(out)
    with pytest.raises(CheckpointError, match="not this selector's notes"):
        load_selector(out, verify=False)
    manifest = read_manifest_object(out)
    del manifest["files"]["notes.txt"]
    write_manifest(out, manifest)
    with pytest.raises(CheckpointError, match="does not list notes.txt"):
        verify(out)


def test_the_manifest_owner_writes_reads_and_updates(tmp_path: Path) -> None:
    assert not has_manifest(tmp_path) and manifest_path(tmp_path) == tmp_path / MANIFEST_NAME
    manifest = {"format": "memento-selector", "files": {"README.md": {"sha256": "0" * 64, "bytes": 1}}, "b": 1}
    write_manifest(tmp_path, manifest)
    assert has_manifest(tmp_path)
    text = manifest_path(tmp_path).read_text()
    assert text == json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    updated = with_file(read_manifest_object(tmp_path), "README.md", b"# card\n")
    assert updated["files"]["README.md"] == {"sha256": hashlib.sha256(b"# card\n").hexdigest(), "bytes": 7}
    assert with_file(updated, "absent.txt", b"x")["files"].keys() == {"README.md"}
    manifest_path(tmp_path).write_text("[1, 2]")
    with pytest.raises(CheckpointError, match="not a JSON object"):
        read_manifest_object(tmp_path)


@pytest.mark.parametrize("module", ["memento/hub.py", "memento/serve/inspector.py", "memento/selector/export.py",
                                    "memento/selector/shipped.py"])
def test_no_manifest_named_outside_its_owner(module: str) -> None:
    tree = ast.parse((ROOT / module).read_text(encoding="utf-8"))
    named = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Constant) and node.value == MANIFEST_NAME]
    assert not named, f"{module}: {MANIFEST_NAME!r} written by hand at line(s) {named}"
