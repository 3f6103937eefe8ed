"""Atomic file writes: a temporary file in the same directory, fsync, then rename.

A reader never sees half a file: after a crash the old file (or none) is there, and the
temporary file is removed whenever the write fails.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from memento.errors import CheckpointError, DataFormatError, MementoError
from memento.types import finite_float, json_value_problem, shown

__all__ = ["atomic_write", "atomic_write_text", "check_same_save", "finite_float", "fsync_dir", "load_json_file",
           "loads_json", "parse_json", "read_json", "read_safetensors", "read_saved_meta", "read_versioned_json",
           "remove_stale_temporaries", "shorten", "sqlite_copy", "temporary_path", "write_json"]

logger = logging.getLogger(__name__)


def _umask() -> int:
    """The process umask, read from /proc where it can be (os.umask can only read it by setting it)."""
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)  # pragma: no cover - no /proc: set and restore at once
    os.umask(mask)  # pragma: no cover
    return mask  # pragma: no cover


_TMP_PID = re.compile(r"^\.(?P<name>.+)\.tmp-(?P<pid>\d+)$")


def temporary_path(path: Path) -> Path:
    """The temporary file :func:`atomic_write` writes ``path`` through: ``.NAME.tmp-PID`` beside it."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError, ValueError):  # no such process, or a number none can have
        return False
    except PermissionError:  # another user's process
        return True
    return pid > 0


def _started() -> float | None:
    """When this process started (Unix seconds, to within a second), where /proc tells."""
    try:
        with open("/proc/self/stat", encoding="ascii") as handle:
            ticks = int(handle.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime: clock ticks after boot
        with open("/proc/stat", encoding="ascii") as handle:
            boot = next(int(line.split()[1]) for line in handle if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):  # pragma: no cover - no /proc
        return None


def remove_stale_temporaries(directory: str | Path, names: Iterable[str]) -> list[Path]:
    """Delete the temporaries of :func:`atomic_write` for the files ``names`` in ``directory`` left behind by a
    process that died: ``.NAME.tmp-PID`` where no process PID is alive, or where PID is this process's but the
    file is older than it (a killed process of the same PID, as in a container where every run is PID 1). A
    temporary of another live process, or one this process is writing now, is left alone. Returns what was
    removed; a file that cannot be removed is logged and kept."""
    wanted = set(names)
    removed: list[Path] = []
    try:
        entries = list(Path(directory).iterdir())
    except OSError:
        return removed
    started = _started()
    for entry in entries:
        match = _TMP_PID.match(entry.name)
        if match is None or match["name"] not in wanted:
            continue
        pid = int(match["pid"])
        try:
            if pid == os.getpid():
                if started is not None and entry.stat().st_mtime >= started - 1.0:
                    continue  # written by this process: perhaps another thread's write in flight
            elif _pid_alive(pid):
                continue
            entry.unlink()
        except FileNotFoundError:
            continue
        except OSError as error:
            logger.warning("%s: cannot remove a stale temporary file (%s)", entry, error.strerror or error)
            continue
        logger.warning("%s: removed a temporary file left by an interrupted write (process %d)", entry, pid)
        removed.append(entry)
    return removed


def atomic_write(path: str | Path, write: Callable[[Path], object]) -> None:
    """Call ``write(tmp_path)`` to produce the file, then move it over ``path`` atomically.

    The file gets the permissions ``open()`` would give a new file (``0o666`` less the umask), also when
    ``write`` creates it private (safetensors writes ``0o600``).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_path(path)
    try:
        write(tmp)
        wanted = 0o666 & ~_umask()
        if tmp.stat().st_mode & 0o777 == 0o600 != wanted:  # a private file (safetensors): as open() makes it
            os.chmod(tmp, wanted)
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
        detail = " ".join(str(error).split())  # one line
        raise CheckpointError(f"{path}: not a readable safetensors file ({detail})") from None
    return tensors, header


shorten = shown  # the old name, kept for the modules that still import it; new code uses memento.types.shown


MAX_JSON_DEPTH = 100
"""How deeply a JSON document memento reads may nest objects and lists."""


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_INT_DIGITS = 4300  # Python's default int <-> str limit, json_value_problem's bound


def _may_hold_problem(text: str, *, decoded: bool) -> bool:
    """Whether ``text``, once parsed, may hold what :func:`memento.types.json_value_problem` refuses (without
    ``finite``): more than :data:`MAX_JSON_DEPTH` brackets, a lone surrogate (escaped, or unless ``text`` was
    ``decoded`` from UTF-8 the character itself), or, where the process raised Python's digit limit, an integer
    too long to write back."""
    if text.count("[") + text.count("{") > MAX_JSON_DEPTH or _SURROGATE_ESCAPE.search(text):
        return True
    if not decoded and not text.isascii():
        try:
            text.encode("utf-8")  # a C loop: far faster than a regular expression over non-ASCII text
        except UnicodeEncodeError:
            return True
    return not 0 < sys.get_int_max_str_digits() <= _INT_DIGITS


def loads_json(text: str | bytes, *, finite: bool = False) -> Any:
    """``text`` parsed as JSON, or a :class:`DataFormatError` whose ``reason`` says why (``line``: the line of
    ``text`` where the JSON is invalid, else None); what is refused is what :func:`parse_json` refuses. Never
    raises anything else. The parsed value is walked (:func:`memento.types.json_value_problem`) only where
    ``text`` may nest too deeply or hold a lone surrogate, or with ``finite``."""
    decoded = isinstance(text, bytes)
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as failure:
            raise DataFormatError(f"not UTF-8 text ({failure.reason} at byte {failure.start + 1})") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as failure:
        raise DataFormatError(f"invalid JSON: {failure.msg} (column {failure.colno})", line=failure.lineno) from None
    except RecursionError:
        raise DataFormatError(f"invalid JSON: nested deeper than {MAX_JSON_DEPTH} levels") from None
    except (ValueError, MemoryError) as failure:  # an integer of more than sys.get_int_max_str_digits() digits
        raise DataFormatError("invalid JSON: " + " ".join(str(failure).split(";")[0].split())[:200]) from None
    if finite or _may_hold_problem(text, decoded=decoded):  # else json_value_problem would find nothing
        problem = json_value_problem(value, finite=finite)
        if problem is not None:
            raise DataFormatError(problem)
    return value


def parse_json(text: str | bytes, *, where: str, error: type[MementoError] = CheckpointError,
               finite: bool = False) -> Any:
    """``text`` parsed as JSON, or a one-line ``error`` whose message starts with ``where`` (a path, or a path and
    a field). Refused: invalid JSON (with its line), an integer of more digits than Python converts, nesting
    deeper than :data:`MAX_JSON_DEPTH`, a lone surrogate escape in a string, bytes that are not UTF-8, and with
    ``finite`` the NaN and Infinity tokens. Never raises anything else."""
    try:
        return loads_json(text, finite=finite)
    except DataFormatError as failure:
        raise error(f"{where}{'' if failure.line is None else f':{failure.line}'}: {failure.reason}") from None


def read_json(path: str | Path, *, error: type[MementoError] = CheckpointError, what: str = "JSON file",
              finite: bool = False, encoding: str = "utf-8") -> Any:
    """The parsed JSON of the file ``path`` (see :func:`parse_json`); a missing file, a directory, an unreadable
    file or bad content is a one-line ``error`` naming ``path`` (``what`` says what the file should be).
    ``encoding="utf-8-sig"`` accepts a byte-order mark."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise error(f"{path}: {what} not found") from None
    except IsADirectoryError:
        raise error(f"{path}: is a directory, expected a {what}") from None
    except OSError as failure:  # permission denied, a name too long...
        raise error(f"{path}: cannot read ({failure.strerror or failure})") from None
    if encoding == "utf-8-sig" and raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    return parse_json(raw, where=str(path), error=error, finite=finite)


def load_json_file(path: str | Path, what: str = "JSON file", *, error: type[MementoError] = DataFormatError,
                   encoding: str = "utf-8") -> Any:
    """The parsed JSON of the file ``path``, every failure one line naming it: :func:`read_json` with a
    :class:`DataFormatError` (a ``ValueError``, so a caller's ``except (OSError, ValueError)`` still treats it
    as unreadable) unless ``error`` says otherwise. Invalid JSON, bytes that are not UTF-8, nesting deeper than
    :data:`MAX_JSON_DEPTH` (``[`` * 100000 raises ``RecursionError`` in :func:`json.loads`), a missing file, a
    directory and an unreadable file are all that one error; nothing else is raised. ``what`` says what the
    file should be (``"bank vectors metadata"``)."""
    return read_json(path, error=error, what=what, encoding=encoding)


def read_versioned_json(path: Path, *, format: str, version: int, what: str) -> dict[str, Any]:
    """The JSON metadata of a saved artifact, checked for its ``format`` tag and a readable ``format_version``.

    Any problem is a one-line ``CheckpointError`` naming ``path`` (``what`` names the artifact): unreadable
    JSON as :func:`read_json` refuses it, a top level that is not an object, the wrong format tag.
    """
    meta = read_json(path, error=CheckpointError, what=f"{what} file")
    if not isinstance(meta, dict) or meta.get("format") != format:
        raise CheckpointError(f"{path}: not a {what} file")
    found = meta.get("format_version", 0)
    if isinstance(found, bool) or not isinstance(found, int) or found < 0:
        raise CheckpointError(f"{path}: format_version {shown(found)} is not a version number (this memento reads "
                              f"{what} format versions up to {version})")
    if found > version:
        raise CheckpointError(f"{path}: format version {shown(found)} is newer than this memento reads ({version})")
    return meta


def read_saved_meta(directory: Path, meta_name: str, tensors_name: str, *, name: str, format: str, version: int,
                    what: str, kinds: dict[str, type]) -> dict[str, Any]:
    """The metadata of a save of ``name`` (a learner, a replay buffer): ``directory`` holds ``meta_name`` (JSON,
    :func:`read_versioned_json` with ``format``, ``version`` and ``what``) and ``tensors_name``, and the metadata
    has every key of ``kinds`` with a value of its type (never a bool). Else a one-line ``CheckpointError``."""
    meta_path, tensors_path = directory / meta_name, directory / tensors_name
    if not meta_path.is_file() or not tensors_path.is_file():
        raise CheckpointError(f"{directory}: not a saved {name} (needs {meta_name} and {tensors_name})")
    meta = read_versioned_json(meta_path, format=format, version=version, what=what)
    for key, kind in kinds.items():
        if key not in meta or isinstance(meta[key], bool) or not isinstance(meta[key], kind):
            raise CheckpointError(f"{meta_path}: damaged {name} state ({key!r} is "
                                  f"{'missing' if key not in meta else shown(meta[key])}; expected a "
                                  f"{kind.__name__})")
    return meta


def check_same_save(directory: Path, meta_name: str, tensors_name: str, meta: dict[str, Any],
                    header: dict[str, str]) -> None:
    """The metadata and the tensors file's header carry the same ``uid`` (one save wrote both)."""
    if header.get("uid") != meta.get("uid"):
        raise CheckpointError(f"{directory}: {meta_name} and {tensors_name} come from different saves "
                              f"(uid {meta.get('uid')} vs {header.get('uid')}); was a save interrupted?")


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
