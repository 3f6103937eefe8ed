"""A directory bank with ``vectors="disk"``: the float32 vectors in ``vectors.f32`` (memory-mapped), the index
compressed (IVF-PQ), and the ``refine`` stage that re-ranks the index's hits by their exact vectors."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from memento.bank import CaseBank, create_bank
from memento.bank.local import VECTORS_META_NAME, VECTORS_NAME
from memento.config import BankConfig, IndexConfig, from_dict
from memento.errors import ConfigError
from memento.types import Case
from tests.conftest import unit_vectors

DIM = 16
PQ = "IVF8,PQ4x4"  # 4-bit codes train in milliseconds, on 39 x 16 = 624 points or more


def clustered(rng: np.random.Generator, n: int, dim: int = DIM) -> np.ndarray:
    centres = unit_vectors(rng, 8, dim)
    x = centres[rng.integers(0, 8, n)] + 0.3 * rng.normal(size=(n, dim)).astype(np.float32)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def cases(n: int, start: int = 0) -> list[Case]:
    return [Case(state=f"s{i}", action=f"a{i}", reward=float(i % 2), env=("e1", "e2")[i % 2])
            for i in range(start, start + n)]


def make(path: Path, emb_ND: np.ndarray, vectors: str, factory: str = PQ, **index: int) -> CaseBank:
    bank = CaseBank.create(path, DIM, index=IndexConfig(factory=factory, **index), vectors=vectors, seed=3)
    bank.add(cases(len(emb_ND)), emb_ND)
    return bank


def test_config_round_trip_and_old_banks_read_as_ram() -> None:
    assert from_dict(BankConfig, {"dim": 4}).vectors == "ram"
    assert from_dict(BankConfig, {"dim": 4, "vectors": "disk"}).vectors == "disk"
    with pytest.raises(ConfigError, match="BankConfig.vectors='tape'"):
        BankConfig(dim=4, vectors="tape")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="refine"):
        IndexConfig(refine=0)


def test_disk_bank_answers_as_the_ram_bank(tmp_path: Path) -> None:
    """Same vectors, same seed: the same trained index, the same hits and the same candidate vectors."""
    emb = clustered(np.random.default_rng(0), 700)
    q = emb[:5] + 0.01
    with make(tmp_path / "ram", emb, "ram") as ram, make(tmp_path / "disk", emb, "disk") as disk:
        assert disk.stats()["vectors"] == "disk" and disk.stats()["index_trained"]
        for a, b in zip(ram.search_positions(q, 10), disk.search_positions(q, 10)):
            np.testing.assert_array_equal(a, b)
        for i in range(5):
            c_ram, c_disk = ram.candidates(q[i], 16, env="e2"), disk.candidates(q[i], 16, env="e2")
            np.testing.assert_array_equal(c_ram.positions_C, c_disk.positions_C)
            np.testing.assert_array_equal(c_disk.embeddings_CD, emb[c_disk.positions_C])
        np.testing.assert_array_equal(disk.embeddings(disk.ids_at([3, 7])), emb[[3, 7]])
    raw = np.fromfile(tmp_path / "disk" / VECTORS_NAME, dtype="<f4").reshape(-1, DIM)
    np.testing.assert_array_equal(raw, emb)
    assert json.loads((tmp_path / "disk" / VECTORS_META_NAME).read_text())["dim"] == DIM


def test_refine_reranks_by_exact_vectors(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    emb = clustered(rng, 800)
    q = clustered(rng, 20)
    truth = np.argsort(-(q @ emb.T), axis=1)[:, :10]
    with make(tmp_path / "b", emb, "disk", nprobe=8) as bank:
        plain = bank.search_positions(q, 10)[1]
        bank.set_search_params(refine=8)
        scores, refined = bank.search_positions(q, 10)
        np.testing.assert_allclose(scores, np.take_along_axis(q @ emb.T, refined, axis=1), rtol=1e-5)

        def recall(found: np.ndarray) -> float:
            return float(np.mean([len(set(f) & set(t)) / 10 for f, t in zip(found, truth)]))

        assert recall(refined) > recall(plain) and recall(refined) >= 0.9
        c = bank.candidates(q[0], 10)
        np.testing.assert_array_equal(c.embeddings_CD, emb[c.positions_C])


def legacy(path: Path, emb_ND: np.ndarray) -> None:
    """A disk bank as made before issue 41: SQLite holds the vectors, vectors.f32 caches them (built on open)."""
    make(path, emb_ND, "ram").close()
    conn = sqlite3.connect(path / "cases.sqlite")
    config = json.loads(conn.execute("SELECT value FROM meta WHERE key = 'config'").fetchone()[0])
    with conn:
        conn.execute("UPDATE meta SET value = ? WHERE key = 'config'", (json.dumps({**config, "vectors": "disk"}),))
    conn.close()
    CaseBank.open(path).close()


def test_file_is_repaired_from_sqlite(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A bank made before issue 41: its vectors.f32 is a cache of SQLite's copy."""
    emb = clustered(np.random.default_rng(2), 700)
    legacy(tmp_path / "b", emb)
    path = tmp_path / "b" / VECTORS_NAME
    row = 4 * DIM
    with open(path, "r+b") as f:  # a crash after SQLite committed: the last rows missing, one torn
        f.truncate(680 * row + 7)
    with CaseBank.open(tmp_path / "b") as bank:
        assert "behind SQLite" in caplog.text
        assert path.stat().st_size == 700 * row
        np.testing.assert_array_equal(bank.embeddings(bank.ids_at([699]))[0], emb[699])
    with open(path, "ab") as f:  # rows SQLite does not hold (an add rolled back after the file write)
        f.write(emb[:3].tobytes())
    CaseBank.open(tmp_path / "b").close()
    assert path.stat().st_size == 700 * row
    (tmp_path / "b" / VECTORS_META_NAME).write_text('{"uid": "another bank", "dim": 16}')
    with CaseBank.open(tmp_path / "b") as bank:  # a file of another bank is rebuilt
        np.testing.assert_array_equal(np.fromfile(path, dtype="<f4").reshape(-1, DIM), emb)
        bank.truncate(200)
    assert path.stat().st_size == 200 * row


def test_follower_reads_rows_the_file_lacks_from_sqlite(tmp_path: Path) -> None:
    emb = clustered(np.random.default_rng(3), 700)
    legacy(tmp_path / "b", emb[:500])
    writer = CaseBank.open(tmp_path / "b")
    follower = CaseBank.open(tmp_path / "b", read_only=True)
    writer.add(cases(200, start=500), emb[500:])
    writer.flush()
    with open(tmp_path / "b" / VECTORS_NAME, "r+b") as f:  # the writer's file behind its SQLite (killed)
        f.truncate(600 * 4 * DIM)
    assert follower.refresh() == 200
    follower.set_search_params(refine=16)  # exact scores: the query's own case comes first
    for i in (10, 550, 650):
        c = follower.candidates(emb[i], 4)
        assert c.positions_C[0] == i
        np.testing.assert_array_equal(c.embeddings_CD, emb[c.positions_C])
    follower.close()
    writer.close()


def test_milvus_refuses_disk_vectors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="directory bank's setting"):
        create_bank(f"milvus:{tmp_path / 'm.db'}", DIM, vectors="disk")
