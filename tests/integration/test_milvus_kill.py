"""A Milvus Lite import killed with SIGKILL at 10 points is all-or-nothing.

A child process adds N cases (read from a Case JSONL file, with precomputed unit vectors: the same
``bank.add`` that ``memento bank import`` calls after encoding) to a Milvus Lite bank that holds a few cases,
in insert batches of 100 rows, and is killed at one of 10 moments spread over an uninterrupted add's duration.
Reopened, the bank holds its earlier cases and either all N new ones or none (rows the killed add had inserted
are rolled back), search works, and adding the file again completes it to exactly N new cases, each once.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from memento.formats import write_jsonl
from memento.memory import MilvusBank, MilvusOptions, create_bank, open_bank
from memento.types import Case
from tests.fuzzing import record, scale

pytestmark = [pytest.mark.slow, pytest.mark.probe]

N, BEFORE, DIM, BATCH = 2000, 5, 32, 100

CHILD = """
import sys
import numpy as np
import milvus_lite, pymilvus
from memento.formats import read_case_file
from memento.memory import MilvusOptions, open_bank
uri, path, vectors, batch = sys.argv[1:5]
cases = read_case_file(path, "case")
vectors_ND = np.load(vectors)
print("ready", flush=True)
sys.stdin.readline()
bank = open_bank(uri, options=MilvusOptions(insert_batch=int(batch)))
print("adding", flush=True)
bank.add(cases, vectors_ND)
print("added", len(bank), flush=True)
bank.close()
"""


def unit(rng: np.random.Generator, n: int) -> np.ndarray:
    v_ND = rng.standard_normal((n, DIM)).astype(np.float32)
    return v_ND / np.linalg.norm(v_ND, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[Case], np.ndarray]:
    root = tmp_path_factory.mktemp("milvus-kill")
    rng = np.random.default_rng(7)
    cases = [Case(state=f"question {i}: how many legs has animal {i}?", action=f"answer {i}",
                  reward=float(i % 2), env="kill") for i in range(N)]
    path = root / "cases.jsonl"
    write_jsonl(path, (c.to_json() for c in cases))
    vectors_ND = unit(rng, N)
    np.save(root / "vectors.npy", vectors_ND, allow_pickle=False)
    return path, root / "vectors.npy", cases, vectors_ND


def start(uri: str, inputs: tuple[Path, Path, list[Case], np.ndarray]) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return subprocess.Popen([sys.executable, "-c", CHILD, uri, str(inputs[0]), str(inputs[1]), str(BATCH)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def go(child: subprocess.Popen) -> None:
    """Once the child has imported everything: let it open the bank and add; returns when the add begins."""
    wait_for(child, "ready")
    assert child.stdin is not None
    child.stdin.write("go\n")
    child.stdin.flush()
    wait_for(child, "adding")


def wait_for(child: subprocess.Popen, word: str) -> None:
    assert child.stdout is not None
    line = child.stdout.readline()
    assert line.startswith(word), (line, child.communicate(timeout=60)[1][-2000:])


def prefilled(uri: str, rng: np.random.Generator) -> tuple[list[str], np.ndarray]:
    with create_bank(uri, DIM) as bank:
        vectors_ND = unit(rng, BEFORE)
        ids = bank.add([Case(state=f"earlier {i}", action="a", reward=1.0) for i in range(BEFORE)], vectors_ND)
    return ids, vectors_ND


def raw_rows(uri: str) -> int:
    """Rows in the collection as Milvus counts them, before a bank opens it (and rolls back)."""
    lite, collection = uri.removeprefix("milvus:").split("#")
    client, lite_dir = MilvusBank.connect(lite, options=MilvusOptions(), must_exist=True)
    try:
        rows = client.query(collection, filter="", output_fields=["count(*)"])
        return int(rows[0]["count(*)"]) if rows else 0
    finally:
        from memento.memory.milvus import disconnect

        disconnect(client, lite_dir)


def test_import_killed_at_10_points_is_all_or_nothing(inputs, tmp_path: Path) -> None:
    _, _, cases, vectors_ND = inputs
    rng = np.random.default_rng(0)
    calibrate = f"milvus:{tmp_path / 'calibrate.db'}#cases"
    prefilled(calibrate, rng)
    child = start(calibrate, inputs)
    go(child)
    began = time.monotonic()
    wait_for(child, "added")
    duration = time.monotonic() - began
    assert child.wait(timeout=60) == 0
    points = 10 * scale()
    outcomes: list[tuple[float, int, int]] = []  # (delay, raw rows at the kill, cases after reopening)
    uris = [f"milvus:{tmp_path / f'b{i}.db'}#cases" for i in range(points)]
    child = start(uris[0], inputs)  # each child imports while the previous one's bank is checked
    for i, uri in enumerate(uris):
        before_ids, before_ND = prefilled(uri, rng)
        go(child)
        delay = duration * (i + 0.5) / points
        time.sleep(delay)
        alive = child.poll() is None
        child.kill()
        child.communicate(timeout=60)
        record(__name__, "kills", int(alive))
        if i + 1 < points:
            child = start(uris[i + 1], inputs)
        raw = raw_rows(uri)
        with open_bank(uri) as bank:
            n = len(bank)
            outcomes.append((delay, raw, n))
            assert n in (BEFORE, BEFORE + N), (delay, raw, n)
            lost = sum(1 for p, case_id in enumerate(before_ids) if bank.ids_at([p]) != [case_id])
            if n == BEFORE + N:
                lost += N - len(set(bank.ids_at(range(BEFORE, n))))
            record(__name__, "lost", lost)
            assert lost == 0
            scores, ids = bank.search(before_ND[1], 1)
            assert ids.tolist() == [before_ids[1]] and scores[0] > 0.99
            scores, ids = bank.search(vectors_ND[7], 1)  # a new case is found only when all of them are there
            if n == BEFORE + N:
                assert ids.tolist() == [f"c{cases[7].content_hash[:16]}"] and scores[0] > 0.99
            else:
                assert ids.tolist()[0] in before_ids
            added = bank.add(cases, vectors_ND)  # the import run again completes it
            assert len(bank) == BEFORE + N and len(set(added)) == N
            assert bank.positions_of(added).tolist() == list(range(BEFORE, BEFORE + N))
            assert len(set(bank.ids_at(range(len(bank))))) == BEFORE + N
        with open_bank(uri) as bank:
            assert len(bank) == BEFORE + N
            assert [c.id for c in bank.iter_cases()][:BEFORE] == before_ids
    rolled_back = sum(1 for _, raw, n in outcomes if raw > BEFORE and n == BEFORE)
    assert rolled_back >= points * 3 // 10, f"too few kills landed mid-import: {outcomes} (add took {duration:.2f} s)"
