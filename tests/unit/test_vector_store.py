"""A disk bank's ``vectors.f32`` as the vectors' only store (issue 41): written before the commit, checked by
block checksums on every open and by ``memento verify``, never followed through a link or into a special file."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from memento.bank import CaseBank, bankfile
from memento.bank.vectorfile import VECTORS_META_NAME, VECTORS_NAME, block_rows_for
from memento.errors import BankError
from memento.types import Case
from tests.conftest import unit_vectors

DIM = 1024  # 1,024 rows of 4 KiB per 4 MiB block: 3,000 cases fill two blocks and part of a third
ROW = 4 * DIM


def cases(n: int, start: int = 0) -> list[Case]:
    return [Case(state=f"s{i}", action=f"a{i}", reward=float(i % 2)) for i in range(start, start + n)]


def make(path: Path, n: int = 3000, seed: int = 0) -> np.ndarray:
    emb = unit_vectors(np.random.default_rng(seed), n, DIM)
    with CaseBank.create(path, DIM, vectors="disk") as bank:
        bank.add(cases(n), emb)
    return emb


def test_the_vector_is_stored_once(tmp_path: Path) -> None:
    emb = make(tmp_path / "b")
    assert block_rows_for(DIM) == 1024
    conn = sqlite3.connect(tmp_path / "b" / "cases.sqlite")
    assert conn.execute("SELECT MAX(length(embedding)) FROM cases").fetchone()[0] == 0
    assert [r[0] for r in conn.execute("SELECT rows FROM vector_blocks ORDER BY block")] == [1024, 1024, 952]
    conn.close()
    np.testing.assert_array_equal(np.fromfile(tmp_path / "b" / VECTORS_NAME, dtype="<f4").reshape(-1, DIM), emb)
    with CaseBank.open(tmp_path / "b") as bank:
        np.testing.assert_array_equal(bank.embeddings(bank.ids_at([0, 2999])), emb[[0, 2999]])
        bank.add(cases(10, start=3000), unit_vectors(np.random.default_rng(9), 10, DIM))
        bank.truncate(1500)  # back into the second block: its checksum is the kept rows'
    with CaseBank.open(tmp_path / "b") as bank:
        assert len(bank) == 1500
        np.testing.assert_array_equal(bank.embeddings(bank.ids_at([1499])), emb[[1499]])
    assert (tmp_path / "b" / VECTORS_NAME).stat().st_size == 1500 * ROW


def test_the_row_digest_reads_the_vectors_from_the_file(tmp_path: Path) -> None:
    make(tmp_path / "b", n=50)
    db = tmp_path / "b" / "cases.sqlite"
    before = bankfile.digest(db, 50)
    with open(tmp_path / "b" / VECTORS_NAME, "r+b") as f:  # one float changed
        f.seek(7 * ROW)
        f.write(np.float32(0.5).tobytes())
    assert bankfile.digest(db, 50) != before
    assert bankfile.digest(db, 7) == bankfile.digest(db, 7)


@pytest.mark.parametrize("damage", ["nan", "zero", "shift", "swap"])
def test_a_changed_row_of_the_right_size_is_found_on_open(tmp_path: Path, damage: str) -> None:
    emb = make(tmp_path / "b")
    path = tmp_path / "b" / VECTORS_NAME
    data = bytearray(path.read_bytes())
    if damage == "nan":
        data[1500 * ROW:1500 * ROW + 4] = np.float32(np.nan).tobytes()
    elif damage == "zero":
        data[2000 * ROW:2001 * ROW] = bytes(ROW)
    elif damage == "shift":
        data = data[ROW:] + data[:ROW]
    else:
        data[10 * ROW:11 * ROW], data[11 * ROW:12 * ROW] = emb[11].tobytes(), emb[10].tobytes()
    path.write_bytes(bytes(data))
    with pytest.raises(BankError, match=r"vectors.f32: rows \d+\.\.\d+ do not match their checksum"):
        CaseBank.open(tmp_path / "b")
    with pytest.raises(BankError, match="do not match their checksum"):
        CaseBank.open(tmp_path / "b", read_only=True)
    assert path.read_bytes() == bytes(data)  # nothing was "repaired" away


def test_lost_rows_are_named_and_a_surplus_is_cut(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    emb = make(tmp_path / "b", n=100)
    path = tmp_path / "b" / VECTORS_NAME
    with open(path, "ab") as f:  # an add killed after its file write, before its commit
        f.write(emb[:3].tobytes() + b"\x01\x02")
    with CaseBank.open(tmp_path / "b", read_only=True) as follower:  # a follower reads the committed rows only
        assert len(follower) == 100
    assert path.stat().st_size == 100 * ROW + 3 * ROW + 2
    with CaseBank.open(tmp_path / "b") as bank:
        assert len(bank) == 100 and "did not commit" in caplog.text
    assert path.stat().st_size == 100 * ROW
    os.truncate(path, 90 * ROW + 5)
    with pytest.raises(BankError, match=r"holds 90 vector\(s\), the bank 100: the vectors of positions 90\.\.99 "
                                        "are lost"):
        CaseBank.open(tmp_path / "b")
    assert path.stat().st_size == 90 * ROW + 5  # not cut further


def test_a_link_or_a_fifo_is_never_followed_or_written(tmp_path: Path) -> None:
    make(tmp_path / "b", n=20)
    path = tmp_path / "b" / VECTORS_NAME
    target = tmp_path / "elsewhere.f32"
    os.replace(path, target)
    (tmp_path / "b" / VECTORS_META_NAME).unlink()
    path.symlink_to(target)
    before = target.read_bytes()
    with pytest.raises(BankError, match="is a symbolic link, not a regular file"):
        CaseBank.open(tmp_path / "b")
    assert target.read_bytes() == before
    path.unlink()
    os.mkfifo(path)
    script = textwrap.dedent(f"""
        from memento.bank import CaseBank
        from memento.errors import BankError
        try:
            CaseBank.open({str(tmp_path / 'b')!r})
        except BankError as error:
            print(error)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert "is a FIFO, not a regular file" in out.stdout, out.stderr


def test_an_unreadable_vectors_json_is_rewritten(tmp_path: Path) -> None:
    emb = make(tmp_path / "b", n=20)
    meta = tmp_path / "b" / VECTORS_META_NAME
    meta.write_text("[" * 100_000)
    with CaseBank.open(tmp_path / "b") as bank:
        np.testing.assert_array_equal(bank.embeddings(bank.ids_at([19])), emb[[19]])
    assert '"store": true' in meta.read_text()


def test_a_failed_write_cuts_its_rows_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make(tmp_path / "b", n=20)
    path = tmp_path / "b" / VECTORS_NAME
    with CaseBank.open(tmp_path / "b") as bank:
        def fail(self: object, sums: object) -> None:
            raise sqlite3.OperationalError("disk I/O error")

        monkeypatch.setattr(type(bank._rows), "_put_block_sums", fail)
        with pytest.raises(sqlite3.OperationalError):
            bank.add(cases(5, start=20), unit_vectors(np.random.default_rng(1), 5, DIM))
        assert path.stat().st_size == 20 * ROW
        monkeypatch.undo()
        bank.add(cases(5, start=20), unit_vectors(np.random.default_rng(1), 5, DIM))
    with CaseBank.open(tmp_path / "b") as bank:
        assert len(bank) == 25


def test_a_follower_reads_new_rows_from_the_file(tmp_path: Path) -> None:
    emb = make(tmp_path / "b", n=100)
    follower = CaseBank.open(tmp_path / "b", read_only=True)
    more = unit_vectors(np.random.default_rng(5), 50, DIM)
    with CaseBank.open(tmp_path / "b") as writer:
        writer.add(cases(50, start=100), more)
    assert follower.refresh() == 50
    np.testing.assert_array_equal(follower.embeddings(follower.ids_at([0, 149])), np.stack([emb[0], more[49]]))
    follower.close()


_WRITER = """
import sys
import numpy as np
from memento.bank import CaseBank
from memento.types import Case
bank = CaseBank.open(sys.argv[1])
rng = np.random.default_rng(int(sys.argv[2]))
n = len(bank)
print("ready", flush=True)
while True:
    emb = rng.normal(size=(300, 1024)).astype(np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    bank.add([Case(state=f"s{i}", action="a", reward=1.0) for i in range(n, n + 300)], emb)
    n += 300
"""


def test_sigkill_during_adds_leaves_whole_adds_that_verify(tmp_path: Path) -> None:
    make(tmp_path / "b", n=10)
    rng = np.random.default_rng(0)
    for attempt in range(4):
        proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path / "b"), str(attempt)],
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        import time

        time.sleep(float(rng.uniform(0.05, 0.6)))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        with CaseBank.open(tmp_path / "b") as bank:  # every block verifies; the count is whole adds
            assert (len(bank) - 10) % 300 == 0
            assert (tmp_path / "b" / VECTORS_NAME).stat().st_size == len(bank) * ROW
        bankfile.check_vectors(tmp_path / "b" / "cases.sqlite", bank.uid, DIM, len(bank))


@pytest.mark.parametrize("damage", ["DELETE FROM vector_blocks WHERE block = 1",
                                    "UPDATE vector_blocks SET rows = 'many' WHERE block = 0",
                                    "DROP TABLE vector_blocks"])
def test_a_damaged_checksum_table_is_one_line(tmp_path: Path, damage: str) -> None:
    make(tmp_path / "b")
    with sqlite3.connect(tmp_path / "b" / "cases.sqlite") as conn:
        conn.execute(damage)
    with pytest.raises(BankError, match="damaged bank"):
        CaseBank.open(tmp_path / "b")


def test_reindex_builds_a_new_index_over_the_stored_vectors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from memento.cli.entry import main

    emb = make(tmp_path / "b", n=3000)
    before = bankfile.digest(tmp_path / "b" / "cases.sqlite", 3000)
    assert main(["bank", "reindex", "--bank", str(tmp_path / "b"), "--index", "IVF16,PQ64x4fs", "--nprobe", "16",
                 "--refine", "8"]) == 0
    assert "reindexed 3000 case(s)" in capsys.readouterr().out
    with CaseBank.open(tmp_path / "b") as bank:
        assert bank.config.index.factory == "IVF16,PQ64x4fs" and bank.config.index.refine == 8
        assert bank.stats()["index_trained"] and bank.stats()["index_ntotal"] == 3000
        for i in (0, 1234, 2999):
            assert bank.candidates(emb[i], 4).positions_C[0] == i
    assert bankfile.digest(tmp_path / "b" / "cases.sqlite", 3000) == before  # the cases and vectors unchanged
    assert main(["bank", "reindex", "--bank", str(tmp_path / "b"), "--index", "IVF0,Nope"]) == 2
    assert "memento: error:" in capsys.readouterr().err
    with CaseBank.open(tmp_path / "b") as bank:
        assert bank.config.index.factory == "IVF16,PQ64x4fs"
