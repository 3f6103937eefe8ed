"""Atomic file writes: a temporary file in the same directory, fsync, then rename.

A reader never sees half a file: after a crash the old file (or none) is there, and the
temporary file is removed whenever the write fails.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memento.errors import CheckpointError

__all__ = ["atomic_write", "atomic_write_text", "fsync_dir", "read_safetensors", "read_versioned_json", "sqlite_copy",
           "write_json"]


def atomic_write(path: str | Path, write: Callable[[Path], object]) -> None:
    """Call ``write(tmp_path)`` to produce the file, then move it over ``path`` atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        if tmp.stat().st_mode & 0o777 == 0o600:  # safetensors creates its files 0600: make them shareable like
            os.chmod(tmp, 0o644)                   # any other file here (artifacts are handed to other users)
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def fsync_dir(path: str | Path) -> None:
    """Flush a directory's entries (renames, new files) to disk; a no-op where directories cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - not supported on this platform
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def read_safetensors(path: Path, *, device: str = "cpu") -> tuple[dict[str, Any], dict[str, str]]:
    """The tensors of a safetensors file (on ``device``) and its string metadata; damage is a CheckpointError."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt", device=device) as handle:
            header = handle.metadata() or {}
            tensors = {name: handle.get_tensor(name) for name in handle.keys()}
    except Exception as error:  # safetensors raises its own error types for damaged files
        raise CheckpointError(f"{path}: unreadable ({error})") from None
    return tensors, header


def read_versioned_json(path: Path, *, format: str, version: int, what: str) -> dict[str, Any]:
    """The JSON metadata of a saved artifact, checked for its ``format`` tag and a readable ``format_version``.

    Any problem is a one-line ``CheckpointError`` naming ``path`` (``what`` names the artifact).
    """
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{path}: unreadable ({error})") from None
    if not isinstance(meta, dict) or meta.get("format") != format:
        raise CheckpointError(f"{path}: not a {what} file")
    if int(meta.get("format_version", 0)) > version:
        raise CheckpointError(f"{path}: format version {meta['format_version']} is newer than this "
                              f"memento reads ({version})")
    return meta


def sqlite_copy(src: Path, dst: Path) -> None:
    """A consistent copy of a SQLite file (the backup API; WAL content included), in WAL mode."""
    import sqlite3

    source = sqlite3.connect(src, timeout=30.0)
    target = sqlite3.connect(dst)
    try:
        source.backup(target)
        target.execute("PRAGMA journal_mode=WAL")
    finally:
        target.close()
        source.close()


def write_json(path: str | Path, payload: Any) -> None:
    """Indented, key-sorted JSON (non-ASCII kept as is), written atomically."""
    atomic_write_text(path, json.dumps(payload, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
