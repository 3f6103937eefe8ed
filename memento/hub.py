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
- A selector artifact on the Hub (resolving a pushed one into real files, pushing one) is
  :mod:`memento.selector.artifact.hub`'s, above this module: it rewrites the artifact's manifest.

The cache directory and the offline switch are read from the environment at each call (``HF_HUB_CACHE``,
``HF_HOME``, ``HF_HUB_OFFLINE``), not at import time.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from memento.errors import ConfigError, EncoderError, MementoError

__all__ = ["HUB_PREFIX", "MAX_REVISION_CHARS", "default_cache_dir", "hub_cache_dir", "hub_offline", "hub_ref",
           "is_hub_id", "local_or_hub", "resolve_snapshot", "revision_problem", "snapshot_of", "split_revision"]

logger = logging.getLogger(__name__)

_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_REVISION = re.compile(r"[A-Za-z0-9_+-][A-Za-z0-9._+-]*(?:/[A-Za-z0-9_+-][A-Za-z0-9._+-]*)*")
MAX_REVISION_CHARS = 256
"""The longest revision (branch, tag or commit) after ``@``."""


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
