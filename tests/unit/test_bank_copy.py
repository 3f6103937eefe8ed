"""`memento bank copy`: the shipped seed bank (facts-real's 312 cases, bundled encoder) from a directory to
Milvus Lite and back; `memento bank export` of every side equal line for line; failures write nothing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from memento.bank import open_bank
from memento.cli.entry import main
from memento.envs.tasks import suite_dir


@pytest.fixture(scope="module")
def seed_bank(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The facts-real seed cases imported as `memento bank import` does (the bundled encoder)."""
    path = tmp_path_factory.mktemp("seed") / "bank"
    assert main(["bank", "import", str(suite_dir("facts-real") / "cases.jsonl"), "--bank", str(path)]) == 0
    with open_bank(path) as bank:  # a deleted case and a changed reward travel too
        bank.delete(bank.ids_at([3]))
        bank.update_reward(bank.ids_at([4])[0], 0.25)
    return path


def _export(bank: str, out: Path) -> list[str]:
    assert main(["bank", "export", str(out), "--bank", bank]) == 0
    return out.read_text(encoding="utf-8").splitlines()


def test_directory_to_milvus_and_back_is_exact(seed_bank: Path, tmp_path: Path, capsys) -> None:
    lite = f"milvus:{tmp_path}/b.db"
    back = tmp_path / "back"
    assert main(["bank", "copy", "--bank", str(seed_bank), lite]) == 0
    assert main(["bank", "copy", "--bank", lite, str(back)]) == 0
    assert "copied 312 case(s)" in capsys.readouterr().out
    original = _export(str(seed_bank), tmp_path / "a.jsonl")
    assert len(original) == 311
    assert _export(lite, tmp_path / "b.jsonl") == original
    assert _export(str(back), tmp_path / "c.jsonl") == original
    with open_bank(seed_bank) as a, open_bank(lite) as b, open_bank(back) as c:
        everything = np.arange(len(a))
        assert len(a) == len(b) == len(c) == 312
        assert a.ids_at(everything) == b.ids_at(everything) == c.ids_at(everything)
        assert np.array_equal(a.embeddings_at(everything), b.embeddings_at(everything))
        assert np.array_equal(a.embeddings_at(everything), c.embeddings_at(everything))
        assert a.deleted_ids() == b.deleted_ids() == c.deleted_ids()
        assert a.config.encoder == b.config.encoder == c.config.encoder
        ids = a.ids_at(everything)
        assert a.rewards(ids).tolist() == b.rewards(ids).tolist() == c.rewards(ids).tolist()
        assert [x.created for x in a.get(ids, include_deleted=True)] == [
            x.created for x in b.get(ids, include_deleted=True)]
        query = a.embeddings_at([10])[0]
        assert a.candidates(query, 8).ids == b.candidates(query, 8).ids == c.candidates(query, 8).ids
    assert main(["bank", "stats", "--bank", lite, "--json"]) == 0
    assert '"cases": 312' in capsys.readouterr().out


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("memento: error:"), err
    return err[0]


def test_failed_copies_write_nothing(seed_bank: Path, tmp_path: Path, capsys) -> None:
    taken = tmp_path / "taken"
    assert main(["bank", "copy", "--bank", str(seed_bank), str(taken)]) == 0
    capsys.readouterr()
    assert main(["bank", "copy", "--bank", str(seed_bank), str(taken)]) == 2
    assert "already holds a bank" in _one_line_error(capsys)
    assert main(["bank", "copy", "--bank", str(seed_bank), "s3://bucket/bank"]) == 2
    assert "unknown bank scheme 's3:'" in _one_line_error(capsys)
    assert main(["bank", "copy", "--bank", str(seed_bank), f"milvus:{tmp_path}/x.db", "--index", "IVF64,PQ8"]) == 2
    assert "Milvus bank takes" in _one_line_error(capsys)
    assert not (tmp_path / "x.db").exists()
    assert main(["bank", "copy", "--bank", str(tmp_path / "nothing"), str(tmp_path / "y")]) == 2
    _one_line_error(capsys)
    assert not (tmp_path / "y").exists()
    assert main(["bank", "copy", "--bank", str(seed_bank), "milvus:http://127.0.0.1:9#c",
                 "--connect-timeout", "1"]) == 2
    assert "cannot reach the Milvus server" in _one_line_error(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]


def test_online_runs_from_a_milvus_seed_bank(seed_bank: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys) -> None:
    """`memento online --bank milvus:...`: the run's own bank starts as a copy of the live seed cases, each with
    its vector (by id: the seed bank has a deleted case in the middle), and the Milvus bank is not changed."""
    import json

    import memento.cli.online as cli
    from memento.planners.base import CallablePlanner

    lite = f"milvus:{tmp_path}/seed.db"
    assert main(["bank", "copy", "--bank", str(seed_bank), lite]) == 0
    tasks = tmp_path / "tasks.jsonl"
    lines = (suite_dir("facts-real") / "test.jsonl").read_text(encoding="utf-8").splitlines()[:4]
    tasks.write_text("\n".join(lines) + "\n", encoding="utf-8")
    monkeypatch.setattr(cli, "build_planner", lambda spec, **kwargs: CallablePlanner(lambda task, cases: "Paris",
                                                                                     name="fixed"))
    out = tmp_path / "run"
    assert main(["online", "--tasks", str(tasks), "--planner", "gemma", "--bank", lite, "--policy", "similarity",
                 "--steps", "4", "--checkpoint-every", "0", "--no-progress", "--out", str(out)]) == 0
    summary = json.loads((out / "similarity" / "summary.json").read_text(encoding="utf-8"))
    assert summary["bank_size_start"] == 311 and summary["steps"] == 4
    with open_bank(lite) as seed, open_bank(out / "similarity" / "bank") as run:
        assert len(seed) == 312  # unchanged
        live = [c.id for c in seed.iter_cases()]
        assert run.ids_at(np.arange(311)) == live
        assert np.array_equal(run.embeddings(live), seed.embeddings(live))
    assert main(["online", "--tasks", str(tasks), "--planner", "gemma", "--bank", "s3:bucket/bank",
                 "--policy", "similarity", "--steps", "1", "--out", str(tmp_path / "x")]) == 2
    assert "unknown bank scheme" in capsys.readouterr().err and not (tmp_path / "x").exists()
