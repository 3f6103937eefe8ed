"""``memento bank import FILE --embeddings VECS``: precomputed vectors, checked whole first, the index trained on a
sample of them, the cases added a chunk per transaction, and a rerun after a failure adding only the rest."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from memento.bank import CaseBank
from memento.bank.bulk import import_with_embeddings, read_embeddings
from memento.cli.entry import main
from tests.conftest import unit_vectors

DIM = 16


def write_cases(path: Path, n: int, start: int = 0) -> Path:
    with path.open("w", encoding="utf-8") as out:
        for i in range(start, start + n):
            out.write(json.dumps({"state": f"question {i}", "action": f"answer {i}", "reward": float(i % 2)}) + "\n")
    return path


@pytest.fixture
def data(tmp_path: Path) -> tuple[Path, Path, np.ndarray]:
    rng = np.random.default_rng(0)
    vectors = unit_vectors(rng, 900, DIM)
    np.save(tmp_path / "vecs.npy", vectors)
    return write_cases(tmp_path / "cases.jsonl", 900), tmp_path / "vecs.npy", vectors


def test_import_trains_first_and_adds_in_chunks(tmp_path: Path, data, capsys: pytest.CaptureFixture) -> None:
    cases, vecs, vectors = data
    bank_dir = tmp_path / "bank"
    assert main(["bank", "import", str(cases), "--embeddings", str(vecs), "--bank", str(bank_dir),
                 "--index", "IVF8,PQ4x4", "--vectors", "disk", "--refine", "4", "--chunk", "200"]) == 0
    assert "imported 900 case(s)" in capsys.readouterr().out
    with CaseBank.open(bank_dir) as bank:
        assert len(bank) == 900 and bank.config.encoder is None and bank.config.vectors == "disk"
        assert bank.config.index.refine == 4
        assert bank.stats()["index_trained"] and bank.stats()["index_ntotal"] == 900
        c = bank.candidates(vectors[123], 5)
        assert c.positions_C[0] == 123
        np.testing.assert_array_equal(c.embeddings_CD, vectors[c.positions_C])
        assert bank.get(c.ids[0]).state == "question 123"
    # the same import again: every case is already stored
    assert main(["bank", "import", str(cases), "--embeddings", str(vecs), "--bank", str(bank_dir)]) == 0
    assert "imported 0 case(s)" in capsys.readouterr().out


def test_a_failed_import_keeps_whole_chunks_and_a_rerun_adds_the_rest(tmp_path: Path, data,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    cases, vecs, vectors = data
    bank = CaseBank.create(tmp_path / "bank", DIM, index="IVF8,Flat")
    from memento.formats import read_cases_jsonl

    rows = read_cases_jsonl(cases)
    add = CaseBank.add
    calls = []

    def dies_on_third_chunk(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt  # a kill between two chunks' transactions
        return add(self, *args, **kwargs)

    monkeypatch.setattr(CaseBank, "add", dies_on_third_chunk)
    with pytest.raises(KeyboardInterrupt):
        import_with_embeddings(bank, rows, read_embeddings(vecs), chunk=300)
    assert len(bank) == 600  # two whole chunks
    monkeypatch.setattr(CaseBank, "add", add)
    assert import_with_embeddings(bank, rows, read_embeddings(vecs), chunk=300) == 300
    assert len(bank) == 900 and bank.stats()["index_ntotal"] == 900
    np.testing.assert_array_equal(bank.embeddings(bank.ids_at(list(range(900)))), vectors)
    bank.close()


@pytest.mark.parametrize("problem, message", [
    ("rows", "embeddings have shape (899, 16), expected (900, 16)"),
    ("norm", "embedding row 7 has norm"),
    ("nan", "embedding row 3 contains NaN or inf"),
    ("suffix", "must be a .npy or .safetensors file"),
    ("pickle", "not a readable .npy array"),
])
def test_bad_embeddings_exit_2_and_create_nothing(tmp_path: Path, data, capsys: pytest.CaptureFixture,
                                                  problem: str, message: str) -> None:
    cases, vecs, vectors = data
    bad = tmp_path / "bad.npy"
    if problem == "rows":
        np.save(bad, vectors[:-1])
    elif problem == "norm":
        broken = vectors.copy()
        broken[7] *= 2
        np.save(bad, broken)
    elif problem == "nan":
        broken = vectors.copy()
        broken[3, 0] = np.nan
        np.save(bad, broken)
    elif problem == "suffix":
        bad = tmp_path / "vecs.txt"
        bad.write_text("1 2 3\n")
    else:
        np.save(bad, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    assert main(["bank", "import", str(cases), "--embeddings", str(bad), "--bank", str(tmp_path / "bank")]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "bank").exists()


def test_safetensors_and_an_existing_bank_of_another_dim(tmp_path: Path, data, capsys) -> None:
    from safetensors.numpy import save_file

    cases, _, vectors = data
    save_file({"embeddings": vectors}, str(tmp_path / "vecs.safetensors"))
    assert main(["bank", "import", str(cases), "--embeddings", str(tmp_path / "vecs.safetensors"),
                 "--bank", str(tmp_path / "bank")]) == 0
    CaseBank.create(tmp_path / "wide", DIM * 2).close()
    assert main(["bank", "import", str(cases), "--embeddings", str(tmp_path / "vecs.safetensors"),
                 "--bank", str(tmp_path / "wide")]) == 2
    assert "expected (900, 32)" in capsys.readouterr().err
