"""``bank/``, the artifact's case bank, as the loader checks it without opening it (the bank itself is
:class:`memento.bank.CaseBank`'s: ``cases.sqlite`` is a live file, the index and vector files are rebuilt from it)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from memento import sqlite
from memento.bank import bankfile
from memento.bank.local import BANK_FORMAT, BANK_FORMAT_VERSION, DERIVED_NAMES
from memento.config import BankConfig, from_dict
from memento.errors import BankError, CheckpointError, ConfigError
from memento.io import load_json_file, parse_json

__all__ = ["check_bank_file", "check_bank_meta_files", "count_bank_rows"]


def count_bank_rows(path: Path) -> int:
    """The cases of the bank file at ``path`` (a one-line ``CheckpointError`` for an unreadable file)."""
    try:
        return bankfile.count(path)
    except sqlite3.Error as error:
        raise CheckpointError(f"{path}: unreadable SQLite file ({error})") from None


def check_bank_file(path: Path) -> dict[str, int]:
    """``bank/cases.sqlite`` as the loader opens it, read without changing it: a case bank of a readable
    version with a valid config and uid, dense positions and embeddings of one length. Returns ``cases``,
    ``dim`` (the bank's config) and, when it holds cases, ``embedding_dim`` (the stored vectors' length)."""
    try:
        found = bankfile.facts(path)
    except sqlite3.Error as error:
        raise CheckpointError(f"{path}: not a case bank ({error})") from None
    sqlite.check_format(found.meta, path, format=BANK_FORMAT, version=BANK_FORMAT_VERSION, what="case bank")
    if not isinstance(found.meta.get("uid"), str) or not isinstance(found.meta.get("config"), str):
        raise CheckpointError(f"{path}: damaged case bank (no config or uid in its meta table)")
    try:
        config = from_dict(BankConfig, parse_json(found.meta["config"], where=f"{path}: the config in its meta table",
                                                  error=CheckpointError))
    except (ValueError, ConfigError) as error:
        raise CheckpointError(f"{path}: damaged case bank config ({error})") from None
    n, short, long = found.cases, found.shortest, found.longest
    out = {"cases": n, "dim": config.dim}
    if n:
        if (found.low, found.high) != (0, n - 1):
            raise CheckpointError(f"{path}: case positions are not 0..{n - 1} (found {found.low}..{found.high})")
        if found.stored:  # the vectors are in vectors.f32, checked block by block (SQLite holds none)
            if found.blobs != n or long != 0:
                raise CheckpointError(f"{path}: damaged case bank (vectors stored in vectors.f32 and in SQLite)")
            try:
                bankfile.check_vectors(path, found.meta["uid"], config.dim, n)
            except BankError as error:
                raise CheckpointError(str(error)) from None
            out["embedding_dim"] = config.dim
            return out
        if found.blobs != n or short != long or long % 4:
            raise CheckpointError(f"{path}: case embeddings are not all float32 vectors of one length "
                                  f"({short}..{long} bytes)")
        out["embedding_dim"] = long // 4
    return out


def check_bank_meta_files(directory: Path) -> None:
    """The bank's index.json and vectors.json, where present, are JSON objects: the bank reads them when it opens
    (a stale one is rebuilt from SQLite; one that does not parse, nested too deeply, say, is a damaged artifact).
    A one-line ``CheckpointError`` naming the file otherwise."""
    for name in DERIVED_NAMES:
        path = directory / name
        if name.endswith(".json") and path.is_file():
            if not isinstance(load_json_file(path, f"bank {name}", error=CheckpointError), dict):
                raise CheckpointError(f"{path}: damaged bank metadata (not a JSON object)")

