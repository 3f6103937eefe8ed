"""``manifest.json``, the record of a selector artifact, and its one owner: this module names the file, reads and
checks it (:func:`read_manifest`), writes it (:func:`write_manifest`), makes it for a first save
(:func:`new_manifest`) and for each save after (:func:`resaved_manifest`), updates an entry (:func:`with_file`: the
Hub push rewrites the card) and checks an artifact's files against it (:func:`verify_artifact`). Everyone else
(the saves, :mod:`memento.hub`, the inspector) goes through these functions.

The manifest holds the format and version, library versions, creation and save times, the source run, the
embedding dimension and learner updates, the sha256 and size of every other file (``files``), and for each live
file (:data:`~memento.selector.artifact.parts.LIVE_FILES`) its row count and row digests (``live``). It is written
as indented JSON with sorted keys, always last (see "Saving in place" in :mod:`memento.selector.artifact`).
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import stat as _stat
import sys
import time
from pathlib import Path
from typing import Any

import memento.selector.artifact.parts as _parts
from memento.errors import CheckpointError
from memento.io import atomic_write_text, parse_json, read_versioned_json
from memento.selector.artifact.files import check_entry, check_tree, file_sha256
from memento.selector.artifact.layout import READY_DIR, SELECTOR_FORMAT, SELECTOR_FORMAT_VERSION, SQLITE_SIDECARS

__all__ = ["MANIFEST_NAME", "has_manifest", "hash_files", "library_versions", "listed_files", "manifest_path",
           "new_manifest", "now_iso", "read_manifest", "read_manifest_object", "resaved_manifest", "verify_artifact",
           "with_file", "write_manifest"]

MANIFEST_NAME = "manifest.json"


def manifest_path(root: str | Path) -> Path:
    """Where the manifest of the artifact at ``root`` is."""
    return Path(root) / MANIFEST_NAME


def has_manifest(root: str | Path) -> bool:
    """Whether ``root`` holds a manifest file (unchecked: :func:`read_manifest` checks it)."""
    return manifest_path(root).is_file()


# ---------------------------------------------------------------- making and writing


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def library_versions() -> dict[str, str | None]:
    """Versions of the libraries an artifact's files depend on (recorded in the manifest)."""
    from importlib import metadata

    import numpy
    import torch

    from memento._version import __version__

    versions: dict[str, str | None] = {"memento": __version__, "python": sys.version.split()[0],
                                       "torch": torch.__version__, "numpy": numpy.__version__,
                                       "sqlite": sqlite3.sqlite_version}
    for dist in ("faiss-cpu", "faiss-gpu", "safetensors", "transformers"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return versions


def new_manifest(*, source: dict[str, Any], dim: int, learner_updates: int,
                 live: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The manifest of a new artifact, less its ``files`` (created and saved now, save 1)."""
    now = time.time()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
    return {"format": SELECTOR_FORMAT, "format_version": SELECTOR_FORMAT_VERSION, "created": stamp,
            "created_unix": now, "saved": stamp, "saved_unix": now, "saves": 1, "versions": library_versions(),
            "source": source, "dim": dim, "learner_updates": learner_updates, "live": live}


def resaved_manifest(previous: dict[str, Any], *, dim: int, learner_updates: int, files: dict[str, dict[str, Any]],
                     live: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The ``previous`` manifest as a new save writes it (creation time and source kept, one more save)."""
    manifest = {key: value for key, value in previous.items() if key not in ("files", "live")}
    manifest.update({"format": SELECTOR_FORMAT, "format_version": SELECTOR_FORMAT_VERSION,
                     "versions": library_versions(), "saved": now_iso(), "saved_unix": time.time(),
                     "saves": int(previous.get("saves", 1)) + 1, "dim": dim,
                     "learner_updates": learner_updates, "files": files, "live": live})
    return manifest


def with_file(manifest: dict[str, Any], rel: str, data: bytes) -> dict[str, Any]:
    """``manifest`` with the entry of ``rel``, where it lists one, recording ``data`` (its sha256 and size)."""
    files = manifest.get("files")
    if isinstance(files, dict) and rel in files:
        files[rel] = {**files[rel], "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    return manifest


def write_manifest(directory: Path, manifest: dict[str, Any], *, atomic: bool = True) -> None:
    """Write ``manifest`` into ``directory`` (indented JSON, sorted keys); ``atomic``: through a temporary file
    (``False`` only for a scratch copy, such as a Hub push's staging directory)."""
    text = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    if atomic:
        atomic_write_text(manifest_path(directory), text)
    else:
        manifest_path(directory).write_text(text, encoding="utf-8")


# ---------------------------------------------------------------- reading


def read_manifest_object(root: Path) -> dict[str, Any]:
    """The manifest of ``root`` as JSON, unchecked beyond being an object (a Hub push rewrites it as it is)."""
    path = manifest_path(root)
    manifest = parse_json(path.read_bytes(), where=str(path))
    if not isinstance(manifest, dict):
        raise CheckpointError(f"{path}: not a JSON object")
    return manifest


def _check_file_entry(rel: str, entry: Any, where: Path) -> None:
    if (not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str) or len(entry["sha256"]) != 64
            or isinstance(entry.get("bytes"), bool) or not isinstance(entry.get("bytes"), int) or entry["bytes"] < 0):
        raise CheckpointError(f"{where}: damaged manifest entry for {rel} ({entry!r}; expected sha256 and bytes)")


def read_manifest(root: Path) -> dict[str, Any]:
    """``manifest.json``, checked: format and version, the listed names (:func:`check_entry`), the entries,
    the live-file records; the whole tree first (:func:`check_tree`: no links)."""
    root = Path(root)
    path = manifest_path(root)
    if not root.is_dir():
        raise CheckpointError(f"{root}: not a selector artifact (not a directory)")
    if not os.path.lexists(path):
        raise CheckpointError(f"{root}: not a selector artifact (no {MANIFEST_NAME})")
    check_tree(root)
    if not path.is_file():
        raise CheckpointError(f"{root}: not a selector artifact ({MANIFEST_NAME} is not a file)")
    manifest = read_versioned_json(path, format=SELECTOR_FORMAT, version=SELECTOR_FORMAT_VERSION,
                                   what="selector manifest")
    files, live = manifest.get("files"), manifest.get("live")
    if not isinstance(files, dict) or not isinstance(live, dict):
        raise CheckpointError(f"{path}: damaged manifest (no files or live sections)")
    for rel, entry in files.items():
        check_entry(rel, path)
        _check_file_entry(rel, entry, path)
    missing = [name for name in _parts.REQUIRED_FILES if name not in files]
    if missing:
        raise CheckpointError(f"{path}: the manifest does not list {missing[0]} (every artifact has "
                              f"{', '.join(_parts.REQUIRED_FILES)})")
    for name in _parts.LIVE_FILES:
        entry = live.get(name)
        if (not isinstance(entry, dict) or isinstance(entry.get("rows"), bool) or not isinstance(entry.get("rows"), int)
                or entry["rows"] < 0 or not isinstance(entry.get("digest"), str)
                or not isinstance(entry.get("stable_digest", ""), str)):
            raise CheckpointError(f"{path}: damaged manifest (live entry for {name}: {entry!r})")
    for key, low in (("dim", 1), ("saves", 1), ("learner_updates", 0)):
        value = manifest.get(key, low)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise CheckpointError(f"{path}: damaged manifest ({key}={value!r}; expected an integer >= {low})")
    if "dim" not in manifest:
        raise CheckpointError(f"{path}: damaged manifest (no dim)")
    return manifest


# ---------------------------------------------------------------- the files it lists


def listed_files(root: Path) -> dict[str, Path]:
    """Every file of an artifact that a manifest lists: all regular files except the manifest itself,
    SQLite sidecars, and dot-named files or directories (staging, temporaries). A symbolic link anywhere
    in the walk is a ``CheckpointError`` (a save never hashes or lists a file through a link)."""
    found: dict[str, Path] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            if os.path.islink(os.path.join(dirpath, name)):
                raise CheckpointError(f"{Path(dirpath) / name}: a symbolic link inside the artifact; links are "
                                      "never followed")
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if name.startswith(".") or name.endswith(SQLITE_SIDECARS) or name.endswith(".creating"):
                continue
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            if rel != MANIFEST_NAME:
                found[rel] = path
    return found


def hash_files(files: dict[str, Path], cache: dict[str, tuple[int, int, str]] | None = None
               ) -> dict[str, dict[str, Any]]:
    """``{rel: {"sha256", "bytes"}}``; ``cache`` (rel -> (size, mtime_ns, sha256)) skips unchanged files."""
    out: dict[str, dict[str, Any]] = {}
    for rel, path in sorted(files.items()):
        stat = path.lstat()
        if not _stat.S_ISREG(stat.st_mode):
            raise CheckpointError(f"{path}: not a regular file (a symbolic link?); an artifact lists files only")
        hit = None if cache is None else cache.get(rel)
        if hit is not None and hit[0] == stat.st_size and hit[1] == stat.st_mtime_ns:
            sha = hit[2]
        else:
            sha = file_sha256(path)
        if cache is not None:  # a staged file keeps its size and mtime when it is moved into place
            cache[rel] = (stat.st_size, stat.st_mtime_ns, sha)
        out[rel] = {"sha256": sha, "bytes": stat.st_size}
    return out


# ---------------------------------------------------------------- checking an artifact against it


def verify_artifact(root: str | Path, *, cache: dict[str, tuple[int, int, str]] | None = None) -> dict[str, Any]:
    """Check an artifact against its manifest (see the :mod:`memento.selector.artifact` docstring); returns a report.

    The report: ``manifest``, ``files`` (how many were checked), ``rows`` (current rows of each live
    file), ``appended`` (rows added since the save, per live file). Any problem raises a one-line
    ``CheckpointError`` naming the file.
    """
    root = Path(root)
    manifest = read_manifest(root)  # refuses links anywhere in the tree, and names outside it
    if (root / READY_DIR).is_dir():
        raise CheckpointError(f"{root}: a save was interrupted after it completed ({READY_DIR}/ is still there); "
                              "loading the artifact finishes it")
    files: dict[str, Any] = manifest["files"]
    rows: dict[str, int] = {}
    appended: dict[str, int] = {}
    # live files first: whether rows were appended decides how the files derived from them are checked
    may_differ: set[str] = set()
    for part in _parts.LIVE_PARTS:
        rel = part.live
        path = root / rel
        entry, saved = files[rel], manifest["live"][rel]
        if not path.is_file():
            raise CheckpointError(f"{path}: missing (listed in {MANIFEST_NAME})")
        intact = _matches(path, entry, rel, cache)
        if intact and not _wal_has_frames(path):
            rows[rel], appended[rel] = saved["rows"], 0
            continue
        n = part.count(path)
        if n < saved["rows"]:
            raise CheckpointError(f"{path}: holds {n} {part.rows_name} row(s), {MANIFEST_NAME} records "
                                  f"{saved['rows']} (truncated or rolled back)")
        if n == saved["rows"] and not intact and not part.rows_rewritten(path):
            raise CheckpointError(f"{path}: changed after it was saved (size or sha256 differs from {MANIFEST_NAME}, "
                                  "and no rows were appended)")
        # rows appended, or rows deleted or updated (recorded) since the save: the saved rows must be intact
        if not part.saved_rows_intact(path, saved):
            raise CheckpointError(f"{path}: its first {saved['rows']} saved {part.rows_name} row(s) were changed "
                                  f"(row digest differs from {MANIFEST_NAME})")
        rows[rel], appended[rel] = n, n - saved["rows"]
        if appended[rel] > 0:
            may_differ.update(part.rebuilt)
    for each in _parts.PARTS:  # a directory loaded as a model: every file in it must be listed and hashed
        for loaded in each.loaded_dirs:
            if (root / loaded).is_dir():
                for rel in listed_files(root):
                    if rel.startswith(loaded + "/") and rel not in files:
                        raise CheckpointError(f"{root / rel}: a file in the artifact's {loaded}/ that "
                                              f"{MANIFEST_NAME} does not list (the encoder is loaded from there)")
    checked = len(_parts.LIVE_FILES)
    for rel, entry in sorted(files.items()):
        if rel in _parts.LIVE_FILES:
            continue
        path = root / rel
        derived_may_differ = rel in may_differ
        if not path.is_file():
            if derived_may_differ:
                continue
            raise CheckpointError(f"{path}: missing (listed in {MANIFEST_NAME})")
        if not _matches(path, entry, rel, cache):
            if derived_may_differ:
                continue
            size = path.stat().st_size
            if isinstance(entry, dict) and size != entry.get("bytes"):
                raise CheckpointError(f"{path}: {size} bytes, {MANIFEST_NAME} records {entry.get('bytes')} "
                                      "(truncated or changed)")
            raise CheckpointError(f"{path}: sha256 differs from {MANIFEST_NAME} (the file was changed after it "
                                  "was saved)")
        checked += 1
    return {"manifest": manifest, "files": checked, "rows": rows, "appended": appended}


def _wal_has_frames(db: Path) -> bool:
    wal = db.with_name(db.name + "-wal")
    return wal.is_file() and wal.stat().st_size > 0


def _matches(path: Path, entry: Any, rel: str, cache: dict[str, tuple[int, int, str]] | None) -> bool:
    if not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str):
        raise CheckpointError(f"{path}: damaged manifest entry {entry!r}")
    stat = path.stat()
    if stat.st_size != entry.get("bytes"):
        return False
    sha = file_sha256(path)
    if cache is not None:
        cache[rel] = (stat.st_size, stat.st_mtime_ns, sha)
    return sha == entry["sha256"]
