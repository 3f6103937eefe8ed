"""An artifact's files on disk, confined: hashing without following links, the tree and entry checks, fsyncs, the
swap of a finished directory into place (see ``docs/security.md``)."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Any

from memento.errors import CheckpointError
from memento.io import fsync_dir
from memento.selector.artifact.layout import HASH_CHUNK, O_NOFOLLOW

__all__ = ["check_entry", "check_tree", "file_sha256", "fsync_tree", "inside", "real_dir", "swap_in"]

def file_sha256(path: Path) -> str:
    """The sha256 of a regular file; a symbolic link is refused (``CheckpointError``), never followed."""
    try:
        fd = os.open(path, os.O_RDONLY | O_NOFOLLOW)
    except OSError as error:
        if os.path.islink(path):
            raise CheckpointError(f"{path}: a symbolic link; an artifact's files are never read through "
                                  "links") from None
        raise CheckpointError(f"{path}: cannot read ({error.strerror})") from None
    digest = hashlib.sha256()
    with os.fdopen(fd, "rb") as handle:
        while chunk := handle.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()

def check_tree(root: Path) -> None:
    """Refuse an artifact that holds a symbolic link (or a FIFO, socket or device) anywhere below ``root``.

    Every entry is looked at with ``lstat``, dot-named ones (``.save.tmp``, ``.save.ready``) and SQLite
    sidecars (``-wal``, ``-shm``) included: loading, verifying and saving never follow a link, so a planted
    link cannot make them read, move or write files outside the artifact. ``root`` itself may be a link.
    """
    pending = [Path(root)]
    while pending:
        directory = pending.pop()
        try:
            with os.scandir(directory) as entries:
                found = sorted(entries, key=lambda entry: entry.name)
        except OSError as error:
            raise CheckpointError(f"{directory}: cannot list ({error.strerror})") from None
        for entry in found:
            path = Path(entry.path)
            if entry.is_symlink():
                raise CheckpointError(f"{path}: a symbolic link inside the artifact; links are never followed "
                                      "(replace it with the file or directory itself)")
            if entry.is_dir(follow_symlinks=False):
                pending.append(path)
            elif not entry.is_file(follow_symlinks=False):
                raise CheckpointError(f"{path}: not a regular file or directory (an artifact holds only files)")


def check_entry(rel: Any, where: Path) -> str:
    """A manifest entry must name a file inside the artifact: a relative POSIX path of plain components.

    Refused (``CheckpointError`` naming the entry and ``where``, the manifest): a non-string, an empty
    name, an absolute path, a backslash or NUL, an empty, ``.`` or ``..`` component, and dot-named
    components (staging directories and temporaries are never listed).
    """
    if not isinstance(rel, str) or not rel:
        raise CheckpointError(f"{where}: manifest entry {rel!r} is not a file name")
    reason = None
    if rel.startswith("/"):
        reason = "an absolute path"
    elif "\\" in rel or "\x00" in rel:
        reason = "a backslash or NUL in the name"
    elif any(part in ("", ".", "..") for part in rel.split("/")):
        reason = "an empty, '.' or '..' component"
    elif any(part.startswith(".") for part in rel.split("/")):
        reason = "a dot-named component"
    if reason is not None:
        raise CheckpointError(f"{where}: manifest entry {rel!r} does not name a file inside the artifact ({reason})")
    return rel

def fsync_tree(root: Path) -> None:
    """fsync every file and directory under ``root`` (before a rename makes them the committed state)."""
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            if os.path.islink(os.path.join(dirpath, name)):
                raise CheckpointError(f"{Path(dirpath) / name}: a symbolic link in a staged save; refusing it")
        for name in filenames:
            with open(Path(dirpath) / name, "rb") as handle:
                os.fsync(handle.fileno())
        fsync_dir(Path(dirpath))


def real_dir(path: Path) -> bool:
    """Whether ``path`` is a directory (not a link to one); a link or another kind of file is refused."""
    if not os.path.lexists(path):
        return False
    if os.path.islink(path) or not path.is_dir():
        raise CheckpointError(f"{path}: not a directory (a symbolic link?); an artifact's save directories are "
                              "never followed through links")
    return True


def inside(root: Path, rel: Path) -> Path:
    """``root / rel``, after checking that no component of it below ``root`` is a symbolic link."""
    here = root
    for part in rel.parts:
        here = here / part
        if os.path.islink(here):
            raise CheckpointError(f"{here}: a symbolic link inside the artifact; refusing to write through it")
    return here

def swap_in(tmp: Path, out: Path) -> None:
    """Move the finished ``tmp`` directory to ``out`` (replacing an old artifact, or an empty directory, there)."""
    old = out.parent / f".{out.name}.old-{os.getpid()}"
    if out.exists():
        os.replace(out, old)
    os.replace(tmp, out)
    shutil.rmtree(old, ignore_errors=True)

