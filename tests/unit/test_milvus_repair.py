"""A Milvus Lite bank whose index file a crash left torn opens with its cases (memento.bank.milvus).

milvus-lite writes a sealed segment's vector index (``indexes/<segment>.vector.<type>.idx``) in place, in a
background thread after a flush; a kill while it writes leaves a prefix of the file, and loading the collection
then fails on every open. These tests fabricate that file (truncate the real index file of a small flushed
bank) and check that a writer's open removes it, milvus-lite rebuilds it from the segment's data, and the bank
opens with all its cases; a read-only open refuses with one line naming the file.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

import numpy as np
import pytest

from memento.bank import create_bank, open_bank
from memento.errors import BankError
from memento.types import Case
from tests.conftest import unit_vectors

N, DIM = 300, 16


def flushed_bank(tmp_path: Path, factory: str = "Flat") -> tuple[str, Path, list[str], np.ndarray]:
    """A closed bank of N cases in one sealed segment, its index file written: (uri, lite dir, ids, vectors)."""
    lite = tmp_path / "bank.db"
    uri = f"milvus:{lite}#cases"
    vectors_ND = unit_vectors(np.random.default_rng(3), N, DIM)
    with create_bank(uri, DIM, factory) as bank:
        ids = bank.add([Case(state=f"question {i}", action=f"answer {i}", reward=1.0) for i in range(N)], vectors_ND)
    with open_bank(uri) as bank:  # a load after the flush: the index file is on disk whatever the bg thread did
        assert len(bank) == N
    return uri, lite, ids, vectors_ND


def index_files(lite: Path, collection: str = "cases") -> list[Path]:
    return sorted((lite / "collections" / collection / "partitions").glob("*/indexes/*.idx"))


def data_digests(lite: Path) -> dict[str, str]:
    """Every file of the bank that is not an index file, by content: the repair never touches these."""
    return {str(p.relative_to(lite)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(lite.rglob("*"))
            if p.is_file() and "indexes" not in p.parts and p.name != "LOCK" and "wal" not in p.parts}


@pytest.mark.parametrize("factory", ["Flat", "HNSW8,Flat", "IVF4,Flat"])
@pytest.mark.parametrize("keep", [0.5, 0.0])  # half the file; an empty file (killed right after it was opened)
def test_a_torn_index_file_is_rebuilt_on_open(tmp_path: Path, factory: str, keep: float,
                                              caplog: pytest.LogCaptureFixture) -> None:
    uri, lite, ids, vectors_ND = flushed_bank(tmp_path, factory)
    (index,) = index_files(lite)
    whole = index.stat().st_size
    os.truncate(index, int(whole * keep))
    data = data_digests(lite)

    with pytest.raises(BankError) as refused:  # a read-only open does not repair: one line naming the file
        open_bank(uri, read_only=True)
    message = str(refused.value)
    assert "\n" not in message and index.name in message and "open the bank once for writing" in message
    assert index.stat().st_size == int(whole * keep)

    with caplog.at_level(logging.WARNING, logger="memento.bank.milvus"), open_bank(uri) as bank:
        assert len(bank) == N
        assert bank.ids_at(range(N)) == ids
        scores, found = bank.search(vectors_ND[17], 1)
        assert found.tolist() == [ids[17]] and scores[0] > 0.99
    warnings = [r.getMessage() for r in caplog.records if "torn index file" in r.getMessage()]
    assert len(warnings) == 1 and index.name in warnings[0]
    assert index.stat().st_size == whole  # rebuilt by milvus-lite from the segment's data
    assert data_digests(lite) == data  # data, manifest and schema files untouched

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="memento.bank.milvus"), open_bank(uri, read_only=True) as bank:
        assert len(bank) == N
    assert not caplog.records


def test_a_whole_bank_opens_without_repair(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    uri, lite, _, _ = flushed_bank(tmp_path)
    before = {p: p.stat().st_mtime_ns for p in index_files(lite)}
    with caplog.at_level(logging.WARNING, logger="memento.bank.milvus"), open_bank(uri) as bank:
        assert len(bank) == N
    assert not caplog.records
    assert {p: p.stat().st_mtime_ns for p in index_files(lite)} == before


def test_a_torn_index_file_of_a_side_collection_is_rebuilt(tmp_path: Path) -> None:
    uri, lite, ids, _ = flushed_bank(tmp_path)
    with open_bank(uri) as bank:
        for step in range(300):
            bank.record_usage(step, ids[:2], 1.0)
    with open_bank(uri) as bank:  # loads the usage collection: its index file is written
        shown, _ = bank.usage_at([0, 1, 2])
        assert shown.tolist() == [300, 300, 0]
    (index,) = index_files(lite, "cases__usage")
    os.truncate(index, index.stat().st_size // 3)
    with open_bank(uri) as bank:
        shown, _ = bank.usage_at([0, 1, 2])
        assert shown.tolist() == [300, 300, 0]
