"""A selector artifact on the Hugging Face Hub: :func:`resolve_selector` copies a pushed selector into the cache as
real files, :func:`push_folder` uploads one (the model card and the manifest without absolute local paths, the
manifest rewritten through its owner, :mod:`memento.selector.artifact.manifest`). The Hub ids, revisions and
snapshots themselves are :mod:`memento.hub`'s."""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from memento.errors import CheckpointError, MementoError
from memento.hub import HUB_PREFIX, default_cache_dir, is_hub_id, resolve_snapshot, revision_problem
from memento.selector.artifact.card import CARD_METADATA
from memento.selector.artifact.layout import CARD_NAME
from memento.selector.artifact.manifest import (
    MANIFEST_NAME,
    has_manifest,
    read_manifest_object,
    with_file,
    write_manifest,
)

__all__ = ["PUSH_IGNORE", "portable_card", "portable_text", "push_folder", "resolve_selector"]

logger = logging.getLogger(__name__)

PUSH_IGNORE = [".*", "*/.*", "*-wal", "*-shm", "*-journal", "*.creating"]
"""``ignore_patterns`` of an upload: dot-named files and directories at any depth, SQLite sidecars."""


def _copy_real(src: Path, dst: Path) -> None:
    """Copy a snapshot's tree with its links dereferenced (links must stay inside the cache)."""
    for dirpath, dirnames, filenames in os.walk(src):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        rel = Path(dirpath).relative_to(src)
        (dst / rel).mkdir(parents=True, exist_ok=True)
        for name in sorted(filenames):
            if name.startswith("."):
                continue
            source = Path(dirpath) / name
            if not source.resolve().is_file():
                raise CheckpointError(f"{source}: not a file in the Hugging Face cache")
            shutil.copyfile(source, dst / rel / name)


def resolve_selector(repo_id: str, *, revision: str | None = None) -> Path:
    """A selector pushed to the Hub as a local artifact directory of real files (see the module docstring).

    The copy lives under ``$MEMENTO_CACHE_DIR/hub/<org>--<name>/<commit>`` and is reused by later loads
    of the same commit (with the feedback and cases they recorded there).
    """
    snapshot, commit = resolve_snapshot(repo_id, revision=revision, what="selector", error=CheckpointError)
    target = default_cache_dir() / "hub" / repo_id.replace("/", "--") / (commit or "snapshot")
    if has_manifest(target):
        return target
    if not has_manifest(snapshot):
        raise CheckpointError(f"selector {repo_id!r}: {snapshot} holds no {MANIFEST_NAME} (not a selector artifact)")
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _copy_real(snapshot, tmp)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    logger.info("selector %s (revision %s) copied to %s", repo_id, commit or "?", target)
    return target


_ABS_PATH = re.compile(r"(?:(?<=^)|(?<=[\s:=(\[{'\"`,]))(?:~/|/(?=[^/\s])|[A-Za-z]:[\\/])[^\s'\"`,;)\]}]*")
"""An absolute local path inside a text (``/home/u/runs/x``, ``~/runs/x``, ``C:\\runs\\x``), at the start or
after a space, a quote, a backtick, ``:``, ``=`` or an opening bracket; not the ``//`` of a URL."""



def portable_text(text: str) -> str:
    """``text`` with every absolute local path (:data:`_ABS_PATH`) cut to its last component: a run directory
    ``/home/u/runs/demo`` becomes ``demo`` (no trace of the exporting machine's layout)."""
    def name(match: re.Match[str]) -> str:
        parts = [part for part in re.split(r"[\\/]", match.group(0)) if part and not part.endswith(":")]
        return parts[-1] if parts and parts[-1] != "~" else "."

    return _ABS_PATH.sub(name, text)


def _portable(value: Any) -> Any:
    if isinstance(value, str):
        return portable_text(value)
    if isinstance(value, dict):
        return {key: _portable(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_portable(item) for item in value]
    return value


def portable_card(text: str) -> str:
    """A model card as pushed: absolute local paths cut (:func:`portable_text`) and the metadata read and written
    back by ``huggingface_hub.ModelCard``, with :data:`CARD_METADATA` (a card whose YAML does not parse is a
    ``CheckpointError``)."""
    from huggingface_hub import ModelCard

    try:
        card = ModelCard(portable_text(text))
    except Exception as failure:  # malformed front matter (a YAML or a metadata error)
        first = (str(failure).strip().splitlines() or [""])[0][:160]
        raise CheckpointError(f"model card: its metadata does not parse ({type(failure).__name__}: {first})") from None
    for key, value in CARD_METADATA.items():
        if key == "tags":
            card.data.tags = list(dict.fromkeys([*value, *(card.data.tags or [])]))
        else:
            setattr(card.data, key, value)
    return str(card)


def _stage_push(folder: Path, staging: Path) -> None:
    """``folder`` as pushed, in ``staging``: every file that is not dot-named or a SQLite sidecar linked (copied
    where links are not possible), the model card and the manifest rewritten without absolute local paths
    (the manifest's entry for the card updated to the pushed bytes, through the manifest's owner,
    :mod:`memento.selector.artifact.manifest`)."""
    from huggingface_hub.utils import filter_repo_objects

    names = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() and not p.is_symlink())
    for rel in filter_repo_objects(names, ignore_patterns=PUSH_IGNORE):
        if rel in (CARD_NAME, MANIFEST_NAME):
            continue
        (staging / rel).parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(folder / rel, staging / rel)  # read, never written, by the upload
        except OSError:
            shutil.copyfile(folder / rel, staging / rel)
    if not has_manifest(folder):
        raise CheckpointError(f"push_to_hub: {folder} holds no {MANIFEST_NAME} (not a selector artifact)")
    manifest = _portable(read_manifest_object(folder))
    if (folder / CARD_NAME).is_file():
        card = portable_card((folder / CARD_NAME).read_text(encoding="utf-8")).encode("utf-8")
        (staging / CARD_NAME).write_bytes(card)
        manifest = with_file(manifest, CARD_NAME, card)
    write_manifest(staging, manifest, atomic=False)  # a scratch directory, uploaded whole


def push_folder(folder: Path, repo_id: str, *, token: str | None = None, private: bool = False,
                commit_message: str = "Upload memento selector", revision: str | None = None) -> Any:
    """Create ``repo_id`` (``"user/name"`` or ``"hf://user/name"``) if needed and upload ``folder`` (without
    :data:`PUSH_IGNORE`; the card and the manifest without absolute local paths, :func:`_stage_push`); returns
    the commit info. A failure (network, authentication, permissions) is a one-line ``CheckpointError`` naming
    the repository and the endpoint."""
    from huggingface_hub import HfApi

    repo_id = repo_id[len(HUB_PREFIX):] if repo_id.startswith(HUB_PREFIX) else repo_id
    if not is_hub_id(repo_id) or "@" in repo_id:
        raise CheckpointError(f"push_to_hub: {repo_id!r} is not a Hub repository id (expected 'user/name')")
    if revision is not None and (problem := revision_problem(revision)) is not None:
        raise CheckpointError(f"push_to_hub {HUB_PREFIX}{repo_id}: {problem}")
    folder = Path(folder)
    api = HfApi(token=token)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.push-", dir=folder.parent))
    try:
        _stage_push(folder, staging)
        try:
            api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
            info = api.upload_folder(folder_path=str(staging), repo_id=repo_id, repo_type="model",
                                     commit_message=commit_message, ignore_patterns=PUSH_IGNORE, revision=revision)
        except MementoError:
            raise
        except Exception as failure:  # network, authentication, permissions, a rejected commit
            first = (str(failure).strip().splitlines() or [""])[0][:160]
            raise CheckpointError(f"push_to_hub {HUB_PREFIX}{repo_id} to {api.endpoint}: "
                                  f"{type(failure).__name__}: {first}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    logger.info("pushed %s to the Hub as %s", folder, repo_id)
    return info
