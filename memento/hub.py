"""Hugging Face Hub ids for encoders, selector artifacts and planners, through ``huggingface_hub``.

**How a Hub id is named**: always explicitly, ``hf://org/name`` (optionally ``hf://org/name@revision``: a
branch, tag or commit, :func:`revision_problem`), wherever a selector, an encoder or a planner model is accepted
(``--planner hf://org/name`` too). Any other text is a local path; a local path that does not exist is a one-line
error and never a Hub lookup (``checkpoints/demo`` missing on this machine must not fetch a Hub repository of that
name). :func:`hub_ref` parses the explicit form; :func:`local_or_hub` is the check every caller makes.

- :func:`resolve_snapshot` turns a repository id ``"org/name"`` (+ a revision) into a local snapshot
  directory: downloaded when online, taken from the local Hugging Face cache when offline
  (``HF_HUB_OFFLINE=1``) or when the Hub cannot be reached; a one-line error naming the id when neither
  works. The directory's name is the commit hash, which callers record (``EncoderSpec.revision``).
- :func:`resolve_selector` does the same for a selector artifact pushed with
  :meth:`memento.Selector.push_to_hub`, then copies the snapshot (whose files are links into the cache's
  blobs) to real files under ``$MEMENTO_CACHE_DIR/hub/`` once per commit: a selector writes to its
  directory (feedback, new cases, saves) and loading never follows a link.
- :func:`push_folder` uploads an artifact, leaving out dot-named files (the pending-selection store, the
  published policy, staging directories) and SQLite sidecars; the pushed model card and manifest carry no
  absolute local path (a source run's ``/home/u/runs/demo`` is pushed as ``demo``), and the card's metadata
  is read and written by ``huggingface_hub.ModelCard``. A failed push is one line naming the repository and
  the endpoint.

The cache directory and the offline switch are read from the environment at each call (``HF_HUB_CACHE``,
``HF_HOME``, ``HF_HUB_OFFLINE``), not at import time.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from memento.errors import CheckpointError, ConfigError, EncoderError, MementoError

__all__ = ["CARD_METADATA", "HUB_PREFIX", "MAX_REVISION_CHARS", "PUSH_IGNORE", "default_cache_dir", "hub_cache_dir",
           "hub_offline", "hub_ref", "is_hub_id", "local_or_hub", "portable_card", "portable_text", "push_folder",
           "resolve_selector", "resolve_snapshot", "revision_problem", "snapshot_of", "split_revision"]

logger = logging.getLogger(__name__)

_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_REVISION = re.compile(r"[A-Za-z0-9_+-][A-Za-z0-9._+-]*(?:/[A-Za-z0-9_+-][A-Za-z0-9._+-]*)*")
MAX_REVISION_CHARS = 256
"""The longest revision (branch, tag or commit) after ``@``."""
PUSH_IGNORE = [".*", "*/.*", "*-wal", "*-shm", "*-journal", "*.creating"]
"""``ignore_patterns`` of an upload: dot-named files and directories at any depth, SQLite sidecars."""


def default_cache_dir() -> Path:
    """memento's own cache (encoded texts, Hub selectors, games, planner weights): ``$MEMENTO_CACHE_DIR``
    if set, else ``~/.cache/memento`` (read now, not at import)."""
    env = os.environ.get("MEMENTO_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "memento"


def split_revision(name: str) -> tuple[str, str | None]:
    """``"org/name@rev"`` -> ``("org/name", "rev")``; without ``@``: ``(name, None)``."""
    base, sep, revision = name.partition("@")
    return (base, revision or None) if sep else (name, None)


def revision_problem(revision: str) -> str | None:
    """Why ``revision`` (the text after ``@``) is no branch, tag or commit name, or None: empty, longer than
    :data:`MAX_REVISION_CHARS`, or not path components of letters, digits and ``._+-`` (each starting with none
    of ``.``), joined by single ``/``, without ``..`` and not ending in ``.lock`` (git's ref-name rules, narrowed:
    ``refs/pr/1`` and a 40-digit commit pass; ``@``, ``../..``, spaces and control characters do not)."""
    if not isinstance(revision, str) or not revision:
        return "an empty revision after @ (give a branch, tag or commit, or no @)"
    if len(revision) > MAX_REVISION_CHARS:
        return f"a revision of {len(revision)} characters (at most {MAX_REVISION_CHARS})"
    if not _REVISION.fullmatch(revision) or ".." in revision or revision.endswith((".", ".lock")):
        return (f"revision {revision[:60]!r} is not a branch, tag or commit name (letters, digits and ._+- in "
                "components joined by /, no '..')")
    return None


def is_hub_id(name: str) -> bool:
    """``"org/name"`` (optionally ``@revision``, :func:`revision_problem`): two plain components, no ``..``, not an
    absolute path (the repository id after :data:`HUB_PREFIX`; on its own it names no Hub repository: see the
    module docstring)."""
    text = str(name)
    base, revision = split_revision(text)
    if "@" in text and revision_problem(text.partition("@")[2]) is not None:
        return False
    return bool(_HUB_ID.match(base)) and ".." not in base


HUB_PREFIX = "hf://"
"""The prefix that makes a text a Hub id (``hf://org/name[@revision]``); without it a text is a local path."""


def hub_ref(text: str | Path, *, what: str = "model",
            error: type[MementoError] = ConfigError) -> tuple[str, str | None] | None:
    """``"hf://org/name[@revision]"`` -> ``("org/name", revision)``; any other text (a local path) -> None.

    A ``Path`` is always local. After the prefix, anything but ``org/name[@revision]`` raises ``error``.
    """
    if not isinstance(text, str) or not text.startswith(HUB_PREFIX):
        return None
    rest = text[len(HUB_PREFIX):]
    base, at, revision = rest.partition("@")
    if at and is_hub_id(base) and (problem := revision_problem(revision)) is not None:
        raise error(f"{what} {text[:120]!r}: {problem}; expected {HUB_PREFIX}org/name[@revision]")
    if not is_hub_id(rest):
        raise error(f"{what} {text!r}: not a Hugging Face Hub id (expected {HUB_PREFIX}org/name[@revision])")
    return split_revision(rest)


def local_or_hub(text: str | Path, *, what: str,
                 error: type[MementoError] = ConfigError) -> Path | tuple[str, str | None]:
    """The Hub id of an explicit ``hf://`` text (:func:`hub_ref`), else the local path, which must exist:
    a missing one raises ``error`` (one line naming it and the explicit Hub form); never a Hub lookup."""
    ref = hub_ref(text, what=what, error=error)
    if ref is not None:
        return ref
    path = Path(text).expanduser()
    if not os.path.lexists(path):
        raise error(f"{what} {str(text)!r}: no such local path (a Hugging Face Hub id is written "
                    f"{HUB_PREFIX}org/name[@revision])")
    return path


def hub_cache_dir() -> Path:
    """``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub`` (read now, not at import)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path.home() / ".cache" / "huggingface" / "hub"


def hub_offline() -> bool:
    """True when ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) is set to a true value."""
    return any(os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")
               for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def snapshot_of(path: Path) -> tuple[str, str] | None:
    """``(repo_id, commit)`` when ``path`` is a snapshot directory of a Hub cache
    (``.../models--org--name/snapshots/<commit>``), else None."""
    path = Path(path)
    if path.parent.name != "snapshots" or not _COMMIT.match(path.name):
        return None
    repo = path.parent.parent.name
    if not repo.startswith("models--") or repo.count("--") < 2:
        return None
    return repo[len("models--"):].replace("--", "/", 1), path.name


def resolve_snapshot(repo_id: str, *, revision: str | None = None, what: str = "encoder",
                     error: type[MementoError] = EncoderError) -> tuple[Path, str]:
    """The local snapshot of ``repo_id`` at ``revision`` (default: ``main``) and its commit hash.

    Online: ``snapshot_download`` (which itself falls back to the cache when the Hub cannot be reached);
    offline, or when that fails: the local cache only. Raises ``error`` naming the id when neither works.
    """
    if revision is not None and (problem := revision_problem(revision)) is not None:  # never sent to the Hub
        raise error(f"{what} {HUB_PREFIX + str(repo_id)[:120]!r}: {problem}")
    from huggingface_hub import snapshot_download

    cache = hub_cache_dir()
    reasons: list[str] = []
    path: str | None = None
    if not hub_offline():
        try:
            path = snapshot_download(repo_id, revision=revision, cache_dir=cache)
        except Exception as failure:  # network, authentication, unknown repo: try the cache next
            reasons.append(f"download failed: {type(failure).__name__}: {str(failure).splitlines()[0][:160]}")
    if path is None:
        try:
            path = snapshot_download(repo_id, revision=revision, cache_dir=cache, local_files_only=True)
        except Exception as failure:
            reasons.append(f"not in the Hugging Face cache {cache} ({type(failure).__name__})")
    if path is None:
        at = f"@{revision}" if revision else ""
        offline = "; HF_HUB_OFFLINE is set" if hub_offline() else ""
        raise error(f"{what} {HUB_PREFIX + repo_id + at!r}: {'; '.join(reasons)}{offline}")
    snapshot = Path(path)
    commit = snapshot.name if _COMMIT.match(snapshot.name) else (revision or "")
    logger.info("%s %s resolved to %s (revision %s)", what, repo_id, snapshot, commit or "?")
    return snapshot, commit


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
    from memento.selector.artifact.manifest import MANIFEST_NAME, has_manifest

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

CARD_METADATA: dict[str, Any] = {"library_name": "memento-mdp",
                                 "tags": ["memento", "case-based-reasoning", "retrieval", "soft-q"]}
"""The model card metadata every pushed selector carries (its PyPI name: ``pip install memento-mdp``)."""


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

    from memento.selector.artifact.layout import CARD_NAME
    from memento.selector.artifact.manifest import (
        MANIFEST_NAME,
        has_manifest,
        read_manifest_object,
        with_file,
        write_manifest,
    )

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
