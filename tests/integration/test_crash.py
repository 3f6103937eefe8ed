"""A real crash: a child process commits cases to SQLite and dies before writing the index."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np

from memento.bank import CaseBank
from memento.types import Case
from tests.conftest import unit_vectors

CHILD = textwrap.dedent("""
    import os, sys
    import numpy as np
    from memento.bank import CaseBank
    from memento.types import Case
    bank = CaseBank.open(sys.argv[1])
    x = np.load(sys.argv[2])
    bank.add([Case(state=f"late {i}", action="a", reward=1.0) for i in range(len(x))], x)
    os._exit(9)  # no close(), no flush(): the index file still describes the old bank
""")


def test_index_repaired_after_crash_between_commit_and_index_write(tmp_path, rng):
    path = tmp_path / "bank"
    early = unit_vectors(rng, 50, 16)
    with CaseBank.create(path, 16, index="HNSW16,Flat") as bank:
        bank.add([Case(state=f"early {i}", action="a", reward=0.0) for i in range(50)], early)
    late = unit_vectors(rng, 30, 16)
    np.save(tmp_path / "late.npy", late)
    child = subprocess.run([sys.executable, "-c", CHILD, str(path), str(tmp_path / "late.npy")],
                           capture_output=True, text=True, timeout=120)
    assert child.returncode == 9, child.stderr

    with CaseBank.open(path) as bank:
        assert len(bank) == 80
        assert bank.stats()["index_ntotal"] == 80
        scores, ids = bank.search(late[7], 1)
        assert bank.get(ids[0]).state == "late 7" and scores[0] > 0.999
        scores, ids = bank.search(early[3], 1)
        assert bank.get(ids[0]).state == "early 3"


def test_child_killed_mid_transaction_leaves_bank_as_before(tmp_path, rng):
    path = tmp_path / "bank"
    with CaseBank.create(path, 16) as bank:
        bank.add([Case(state=f"s{i}", action="a", reward=0.0) for i in range(10)], unit_vectors(rng, 10, 16))
    script = textwrap.dedent("""
        import os, sys, sqlite3
        import numpy as np
        from memento.bank import CaseBank
        from memento.types import Case
        bank = CaseBank.open(sys.argv[1])
        real_commit = bank._rows.conn.commit
        class Dying:
            def __getattr__(self, name):
                return getattr(conn, name)
            def commit(self):
                os._exit(7)  # die after the inserts, before the commit
        conn = bank._rows.conn
        bank._rows.conn = Dying()
        x = np.eye(16, dtype=np.float32)[:5]
        bank.add([Case(state=f"lost {i}", action="a", reward=1.0) for i in range(5)], x)
    """)
    child = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=120)
    assert child.returncode == 7, child.stderr
    with CaseBank.open(path) as bank:
        assert len(bank) == 10
        assert all(not c.state.startswith("lost") for c in bank.iter_cases())
