"""Reaching Milvus for a bank (:mod:`memento.bank.milvus`): :class:`MilvusOptions`, :func:`connect` (a
``MilvusClient`` for a Milvus Lite file or a server URL) and :func:`disconnect`, and the count of this process's
clients of each Milvus Lite file (the last one to close stops the file's in-process server, so another process
can open it).
"""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from typing import Any

from memento.errors import BankError, ConfigError, NotABankError
from memento.extras import install_hint

__all__ = ["MilvusOptions", "connect", "disconnect", "lite_dir_of"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class MilvusOptions:
    """How a Milvus bank connects and writes.

    ``connect_timeout_s``: give up connecting to a server after this long (one line, exit 2 in the CLI).
    ``flush_rows``: seal the rows added since the last flush once there are this many (0: only on
    ``flush()``/``close()``; None: 256 for Milvus Lite, 0 for a server). ``insert_batch``: rows per insert
    request (a Milvus Lite insert is one write-ahead-log batch).
    """

    connect_timeout_s: float = dataclasses.field(default=5.0, metadata={"help": (
        "give up connecting to a Milvus server after S seconds")})
    flush_rows: int | None = None
    insert_batch: int = 1000

    def __post_init__(self) -> None:
        if isinstance(self.connect_timeout_s, bool) or not isinstance(self.connect_timeout_s, (int, float)) \
                or not 0 < self.connect_timeout_s <= 3600:
            raise ConfigError(f"MilvusOptions.connect_timeout_s={self.connect_timeout_s!r}: must be in (0, 3600]")
        if self.flush_rows is not None and (isinstance(self.flush_rows, bool) or not isinstance(self.flush_rows, int)
                                            or self.flush_rows < 0):
            raise ConfigError(f"MilvusOptions.flush_rows={self.flush_rows!r}: must be None or an integer >= 0")
        if isinstance(self.insert_batch, bool) or not isinstance(self.insert_batch, int) or self.insert_batch < 1:
            raise ConfigError(f"MilvusOptions.insert_batch={self.insert_batch!r}: must be an integer >= 1")


def import_pymilvus() -> Any:
    try:
        import pymilvus
    except ImportError:
        raise BankError(f"a Milvus bank needs the 'milvus' extra: {install_hint('milvus')}") from None
    return pymilvus


def milvus_message(error: BaseException) -> str:
    message = getattr(error, "message", None) or str(error)
    return " ".join(str(message).split())[:400]


def connect(uri: str, *, options: MilvusOptions, must_exist: bool) -> tuple[Any, Path | None]:
    """A ``MilvusClient`` for ``uri`` (a Milvus Lite file ``*.db`` or a server URL) and the Lite directory.

    ``must_exist``: a Milvus Lite file that does not exist is a ``NotABankError`` (nothing is created)."""
    pymilvus = import_pymilvus()
    lite_dir = None
    if uri.endswith(".db") and "://" not in uri:
        lite_dir = Path(uri).expanduser().resolve()
        if must_exist and not lite_dir.exists():
            raise NotABankError(f"milvus:{uri}: no Milvus Lite file here")
        if not lite_dir.parent.is_dir():
            raise BankError(f"milvus:{uri}: the directory {lite_dir.parent} does not exist")
        try:
            import milvus_lite  # noqa: F401
        except ImportError:
            raise BankError("a Milvus Lite bank needs the 'milvus' extra (milvus-lite): "
                            + install_hint("milvus")) from None
    try:
        client = pymilvus.MilvusClient(uri=str(lite_dir) if lite_dir else uri,
                                       timeout=options.connect_timeout_s)
        _lite_opened(lite_dir)
    except Exception as error:  # pymilvus raises MilvusException and grpc errors alike
        where = "cannot open the Milvus Lite file" if lite_dir else \
            f"cannot reach the Milvus server (gave up after {options.connect_timeout_s:g} s)"
        raise BankError(f"milvus:{uri}: {where}: {milvus_message(error)}") from None
    return client, lite_dir


class LiteUsers:
    """How many clients of this process use each Milvus Lite file. pymilvus starts one in-process server per file
    and keeps it (and the file's lock) until the process exits; the last close here stops it, so another process
    can open the file. (Process-wide state, as the server it counts is.)"""

    lock = threading.Lock()
    count: dict[Path, int] = {}  # noqa: RUF012


def disconnect(client: Any, lite_dir: Path | None) -> None:
    """Close a client of :meth:`MilvusBank.connect` (the last one of a Milvus Lite file stops its server)."""
    try:
        client.close()
    finally:
        _lite_closed(lite_dir)


def _lite_opened(lite_dir: Path | None) -> None:
    if lite_dir is not None:
        with LiteUsers.lock:
            LiteUsers.count[lite_dir] = LiteUsers.count.get(lite_dir, 0) + 1


def _lite_closed(lite_dir: Path | None) -> None:
    if lite_dir is None:
        return
    with LiteUsers.lock:
        left = LiteUsers.count.get(lite_dir, 0) - 1
        if left > 0:
            LiteUsers.count[lite_dir] = left
            return
        LiteUsers.count.pop(lite_dir, None)
        _release_lite(lite_dir)


def _release_lite(lite_dir: Path) -> None:
    """Stop this process's Milvus Lite server for ``lite_dir`` (it holds the file's lock until then)."""
    try:
        from milvus_lite.server_manager import server_manager_instance
    except ImportError:
        return
    server_manager_instance.release_server(str(lite_dir))


def remove_tree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def lite_dir_of(uri: str) -> Path | None:
    """The Milvus Lite directory a ``milvus:`` URI names, or None for a server."""
    return Path(uri).expanduser().resolve() if uri.endswith(".db") and "://" not in uri else None
