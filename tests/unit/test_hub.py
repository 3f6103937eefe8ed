"""Hub ids for encoders and selectors, portable encoder specs, push_to_hub: all without the network.

The Hugging Face cache is built in tmp_path in huggingface_hub's layout (models--org--name/snapshots/<commit>/,
refs/main) and HF_HUB_OFFLINE=1 keeps huggingface_hub off the network.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

import memento
import memento.selector.artifact.hub
from memento.bank import CaseBank
from memento.encoders import Encoder, default_model_path
from memento.errors import CheckpointError, EncoderError
from memento.selector.artifact import EncoderSpec, read_encoder_spec
from memento.selector.export import create_selector, load_selector, verify
from memento.types import Case

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "hf" / "hub"
    cache.mkdir(parents=True)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("MEMENTO_CACHE_DIR", str(tmp_path / "memento-cache"))
    return cache


def _cache_repo(cache: Path, repo_id: str, files: Path, commit: str = COMMIT) -> Path:
    """Lay ``files`` out as huggingface_hub does: blobs, a snapshot of links to them, refs/main."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    for src in sorted(p for p in files.rglob("*") if p.is_file() and not p.name.startswith(".")):
        rel = src.relative_to(files)
        blob = repo / "blobs" / f"{abs(hash(rel.as_posix())):x}{len(rel.parts)}"
        blob.parent.mkdir(parents=True, exist_ok=True)
        if not blob.exists():
            os.symlink(src.resolve(), blob)  # the content (a link keeps the test fast; the Hub stores the bytes)
        (snapshot / rel).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(blob, (snapshot / rel).parent), snapshot / rel)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return snapshot


def test_a_hub_id_resolves_offline_from_the_cache_and_records_its_commit(hub_cache: Path) -> None:
    _cache_repo(hub_cache, "org/mini", default_model_path())
    encoder = Encoder.from_pretrained("hf://org/mini", device="cpu", use_cache=False)
    assert (encoder.model_id, encoder.revision) == ("org/mini", COMMIT)
    assert encoder.describe()["revision"] == COMMIT
    bundled = Encoder.from_pretrained(device="cpu", use_cache=False)
    np.testing.assert_array_equal(encoder.encode(["hello there"]), bundled.encode(["hello there"]))
    pinned = Encoder.from_pretrained("hf://org/mini", revision=COMMIT, device="cpu", use_cache=False)
    assert pinned.revision == COMMIT
    config_model = memento.config.EncoderConfig(model=f"hf://org/mini@{COMMIT}")  # the encoder spec of a config
    assert Encoder.from_config(config_model, device="cpu", use_cache=False).revision == COMMIT


def test_an_unknown_hub_id_is_one_line_naming_it(hub_cache: Path) -> None:
    with pytest.raises(EncoderError, match="'hf://nobody/nothing'") as info:
        Encoder.from_pretrained("hf://nobody/nothing", device="cpu", use_cache=False)
    assert "\n" not in str(info.value) and "HF_HUB_OFFLINE" in str(info.value)
    with pytest.raises(EncoderError, match="'/no/such/dir': no such local path .*hf://org/name"):
        Encoder.from_pretrained("/no/such/dir", device="cpu", use_cache=False)
    with pytest.raises(EncoderError, match="'nobody/nothing': no such local path"):  # never a Hub id by itself
        Encoder.from_pretrained("nobody/nothing", device="cpu", use_cache=False)


def _bank(path: Path, encoder: Encoder, model: str | None) -> Path:
    cases = [Case(state=f"question {i} about {topic}", action=f"answer {i}", reward=float(i % 2))
             for i, topic in enumerate(["rivers", "capitals", "chemistry", "poems", "planets", "music"])]
    config = memento.config.EncoderConfig(model=model)
    with CaseBank.create(path, encoder.dim, encoder=config) as bank:
        bank.add(cases, encoder.encode([c.state for c in cases]))
    return path


def test_a_local_encoder_travels_inside_the_artifact(tmp_path: Path, hub_cache: Path) -> None:
    tuned = tmp_path / "my-tuned-encoder"  # a fine-tuned encoder saved locally (here: the bundled weights)
    shutil.copytree(default_model_path(), tuned)
    encoder = Encoder.from_pretrained(tuned, device="cpu", use_cache=False)
    bank = _bank(tmp_path / "bank", encoder, str(tuned))
    out = create_selector(bank, tmp_path / "made" / "selector", k=2)
    spec = json.loads((out / "encoder.json").read_text())
    assert (spec["model"], spec["files"]) == (None, "encoder")
    assert "encoder/model.safetensors" in verify(out)["manifest"]["files"]
    moved = tmp_path / "elsewhere" / "selector"
    moved.parent.mkdir()
    shutil.move(str(out), moved)
    shutil.rmtree(tuned)
    query = "question 2 about chemistry"
    expected = encoder.encode(query)
    with load_selector(moved, seed=3) as selector:
        np.testing.assert_array_equal(selector.encoder().encode(query), expected)
        assert selector.encoder().encoder.path == (moved / "encoder").resolve()
        assert selector.select(query, k=2, mode="greedy").ids
        copy = selector.save(tmp_path / "copied")  # a copy takes the encoder's files along
        selector.save()  # in place: the files stay listed
    assert "encoder/config.json" in verify(copy)["manifest"]["files"]
    assert "encoder/config.json" in verify(moved)["manifest"]["files"]
    (moved / "encoder" / "extra.py").write_text("print('planted')")  # an unlisted file where the model loads
    with pytest.raises(CheckpointError, match="encoder/extra.py.*does not list"):
        verify(moved)
    with pytest.raises(CheckpointError, match="encoder/extra.py"):
        load_selector(moved)
    (moved / "encoder" / "extra.py").unlink()
    (moved / "encoder" / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match="encoder/config.json"):
        verify(moved)


def test_encoder_files_must_stay_inside_the_artifact(tmp_path: Path) -> None:
    (tmp_path / "encoder.json").write_text(json.dumps({"format": "memento-encoder", "format_version": 1, "dim": 4,
                                                      "files": "../outside"}))
    with pytest.raises(CheckpointError, match="does not name a file inside the artifact"):
        read_encoder_spec(tmp_path / "encoder.json")


def test_hub_and_bundled_encoders_are_stored_by_name(tmp_path: Path, hub_cache: Path) -> None:
    from memento.selector.artifact import write_encoder_spec

    snapshot = _cache_repo(hub_cache, "org/mini", default_model_path())
    for model, expected in ((str(snapshot), ("org/mini", COMMIT)), (f"hf://org/mini@{COMMIT}", ("org/mini", COMMIT)),
                            (f"org/mini@{COMMIT}", ("org/mini", COMMIT)),  # as encoder.json records it
                            (str(default_model_path()), (None, None))):
        target = tmp_path / "a" / "encoder.json"
        target.parent.mkdir(exist_ok=True)
        write_encoder_spec(target, EncoderSpec(model=model, dim=384))
        spec = read_encoder_spec(target)
        assert (spec.model, spec.revision, spec.files) == (*expected, None)
        assert not (target.parent / "encoder").exists()


def _fake_upload(hub_cache: Path, commit: str) -> Any:
    """HfApi.upload_folder into the local Hub cache layout, honouring ignore_patterns as the Hub client does."""
    from huggingface_hub.utils import filter_repo_objects

    calls: list[dict[str, Any]] = []

    def upload_folder(self: Any, *, folder_path: str, repo_id: str, ignore_patterns: list[str], **kwargs: Any) -> str:
        root = Path(folder_path)
        names = [p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()]
        kept = list(filter_repo_objects(names, ignore_patterns=ignore_patterns))
        staging = hub_cache.parent / "uploaded" / repo_id
        for rel in kept:
            (staging / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(root / rel, staging / rel)
        _cache_repo(hub_cache, repo_id, staging, commit)
        calls.append({"repo_id": repo_id, "files": kept, **kwargs})
        return f"https://huggingface.co/{repo_id}/commit/{commit}"

    return upload_folder, calls


def test_push_to_hub_and_load_by_repo_id(tmp_path: Path, hub_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import HfApi

    encoder = Encoder.from_pretrained(device="cpu", use_cache=False)
    out = create_selector(_bank(tmp_path / "bank", encoder, None), tmp_path / "selector", k=2)
    upload, calls = _fake_upload(hub_cache, COMMIT)
    monkeypatch.setattr(HfApi, "upload_folder", upload)
    monkeypatch.setattr(HfApi, "create_repo", lambda self, repo_id, **kw: repo_id)
    with load_selector(out, learn=True) as selector:
        result = selector.select("question 1 about capitals", k=2)  # a pending selection: .pending.sqlite
        assert (out / ".pending.sqlite").exists()
        assert selector.push_to_hub("hf://user/repo").endswith(COMMIT)
        selected = selector.select("question 1 about capitals", k=2, mode="greedy").ids
        del result
    pushed = calls[0]["files"]
    assert "manifest.json" in pushed and "bank/cases.sqlite" in pushed
    assert not [name for name in pushed if name.startswith(".") or "/." in name or name.endswith(("-wal", "-shm"))]
    with load_selector("hf://user/repo") as loaded:
        assert loaded.select("question 1 about capitals", k=2, mode="greedy").ids == selected
        assert loaded.path.is_relative_to(tmp_path / "memento-cache")
    with load_selector("hf://user/repo", revision=COMMIT) as again:
        assert again.path == loaded.path
    with pytest.raises(CheckpointError, match="'hf://user/other'"):
        load_selector("hf://user/other")
    with pytest.raises(CheckpointError, match="'user/repo': no such local path"):  # a Hub id is explicit
        load_selector("user/repo")
    with pytest.raises(CheckpointError, match="not a Hub repository id"):
        memento.selector.artifact.hub.push_folder(out, "not a repo")


def _absolute_paths(text: str) -> list[str]:
    return [m.group(0) for m in memento.selector.artifact.hub._ABS_PATH.finditer(text)]


def test_the_pushed_card_and_manifest_carry_no_local_path(tmp_path: Path, hub_cache: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import HfApi, ModelCard

    from memento.selector.runtime import Selector

    encoder = Encoder.from_pretrained(device="cpu", use_cache=False)
    out = create_selector(_bank(tmp_path / "bank", encoder, None), tmp_path / "selector", k=2)
    local_manifest = (out / "manifest.json").read_text()
    assert str(tmp_path / "bank") in local_manifest and str(tmp_path / "bank") in (out / "README.md").read_text()
    upload, calls = _fake_upload(hub_cache, COMMIT)
    monkeypatch.setattr(HfApi, "upload_folder", upload)
    monkeypatch.setattr(HfApi, "create_repo", lambda self, repo_id, **kw: repo_id)
    with Selector.from_pretrained(out) as selector:  # a local directory
        selector.push_to_hub("user/portable")
    assert (out / "manifest.json").read_text() == local_manifest  # the local artifact keeps its record
    assert not [p for p in out.parent.iterdir() if ".push-" in p.name]  # the staging directory is gone
    pushed = hub_cache.parent / "uploaded" / "user" / "portable"
    card, manifest = (pushed / "README.md").read_text(), (pushed / "manifest.json").read_text()
    for text in (card, manifest):
        assert str(tmp_path) not in text and _absolute_paths(text) == []
    assert json.loads(manifest)["source"]["path"] == "bank"  # the bank directory's name, not where it lay
    assert "case bank `bank`" in card
    data = ModelCard.load(pushed / "README.md").data
    assert data.library_name == "memento-mdp" and data.tags[:2] == ["memento", "case-based-reasoning"]
    assert data.base_model == "sentence-transformers/all-MiniLM-L6-v2"
    with Selector.from_pretrained("hf://user/portable", learn=False, seed=3) as loaded:  # checksums verified
        assert loaded.path.is_relative_to(tmp_path / "memento-cache")
        assert len(loaded.select("question 2 about capitals", k=2).ids) == 2
    with pytest.raises(CheckpointError, match="'user/portable': no such local path"):  # a Hub id is explicit
        Selector.from_pretrained("user/portable")


def test_a_card_whose_metadata_does_not_parse_is_refused() -> None:
    card = "---\nlibrary_name: other\ntags:\n- mine\n---\n# x: /home/u/run\n"
    text = memento.selector.artifact.hub.portable_card(card)
    assert text.endswith("# x: run\n") and yaml.safe_load(text.split("---\n")[1])["tags"][-1] == "mine"
    with pytest.raises(CheckpointError, match="model card"):
        memento.selector.artifact.hub.portable_card("---\nlibrary_name: [unclosed\n---\n# x\n")


def test_the_model_card_front_matter_is_what_the_hub_reads(tmp_path: Path) -> None:
    encoder = Encoder.from_pretrained(device="cpu", use_cache=False)
    out = create_selector(_bank(tmp_path / "bank", encoder, None), tmp_path / "selector", k=2)
    card = (out / "README.md").read_text()
    assert card.startswith("---\n")
    front = yaml.safe_load(card.split("---\n")[1])
    assert front["library_name"] == "memento-mdp"
    assert front["tags"] == ["memento", "case-based-reasoning", "retrieval", "soft-q"]
    assert front["base_model"] == "sentence-transformers/all-MiniLM-L6-v2"
    from memento.selector.artifact import card_front_matter

    manifest = {"source": {"policy": "soft_q", "suite": "facts", "summary": {"success_rate": 0.75}}}
    front = yaml.safe_load("\n".join(card_front_matter(manifest, EncoderSpec(model="BAAI/bge-small-en-v1.5",
                                                                             dim=384))[1:-2]))
    assert front["base_model"] == "BAAI/bge-small-en-v1.5" and front["datasets"] == ["facts"]
    assert front["metrics"] == ["success_rate"]
    result = front["model-index"][0]["results"][0]
    assert result["metrics"] == [{"type": "success_rate", "value": 0.75}] and result["dataset"]["name"] == "facts"
