"""Real encoder + real faiss + SQLite: importing the Memento case memory and searching it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from memento.bank import CaseBank
from memento.encoders import Encoder
from memento.errors import DataFormatError, DimensionError
from memento.formats import read_memento_memory
from tests.conftest import MEMENTO_FIXTURES

MEMORY = MEMENTO_FIXTURES / "memory.jsonl"
QUESTION = "What is the capital of Orotina Canton?"


@pytest.fixture(scope="module")
def unique_count() -> int:
    return len({c.content_hash for c in read_memento_memory(MEMORY)})


@pytest.fixture
def imported(tmp_path: Path, encoder: Encoder):
    bank = CaseBank.create(tmp_path / "bank", encoder.dim)
    ids = bank.import_jsonl(MEMORY, encoder, format="memento-memory")
    yield bank, ids
    bank.close()


def test_import_memento_memory(imported, unique_count: int) -> None:
    bank, ids = imported
    assert unique_count == 200
    assert len(ids) == 200
    assert len(bank) == unique_count
    stats = bank.stats()
    assert stats["reward_positive"] == 110
    assert stats["dim"] == 384
    first = bank.get(ids[0])
    assert first.state == "What sport does Deportivo Cali play?"
    assert first.meta == {"source": "memento-memory"}
    np.testing.assert_allclose(np.linalg.norm(bank.embeddings(ids), axis=1), np.ones(200), atol=1e-5)


def test_search_finds_the_question(imported, encoder: Encoder) -> None:
    bank, _ = imported
    scores, found = bank.search(encoder.encode(QUESTION), 5)
    assert len(found) == 5
    top = bank.get(found[0])
    assert top.state == QUESTION
    assert top.reward == 1.0
    assert scores[0] > 0.99
    assert scores[1] < scores[0]


def test_reimport_adds_nothing(imported, encoder: Encoder, unique_count: int) -> None:
    bank, ids = imported
    assert bank.import_jsonl(MEMORY, encoder, format="memento-memory") == ids
    assert len(bank) == unique_count


def test_corrupted_line_5_changes_nothing(imported, encoder: Encoder, tmp_path: Path, unique_count: int) -> None:
    bank, _ = imported
    lines = MEMORY.read_text(encoding="utf-8").splitlines()
    lines[4] = lines[4][: len(lines[4]) // 2]  # cut line 5 in half
    extra = '{"case": "A brand new question never seen before?", "plan": "{\\"plan\\": []}", "case_label": "positive"}'
    bad = tmp_path / "memory-corrupt.jsonl"
    bad.write_text("\n".join([extra, *lines[1:]]) + "\n", encoding="utf-8")
    with pytest.raises(DataFormatError) as info:
        bank.import_jsonl(bad, encoder, format="memento-memory")
    assert str(info.value).startswith(f"{bad}:5:")
    assert info.value.line == 5
    assert len(bank) == unique_count
    path = bank.path
    bank.close()
    with CaseBank.open(path) as again:
        assert len(again) == unique_count


def test_import_into_bank_of_other_dim(tmp_path: Path, encoder: Encoder) -> None:
    with CaseBank.create(tmp_path / "small", 16) as bank:
        with pytest.raises(DimensionError) as info:
            bank.import_jsonl(MEMORY, encoder, format="memento-memory")
        message = str(info.value)
        assert "dim=384" in message and "dim=16" in message
        assert len(bank) == 0
