"""A Milvus Lite import killed with SIGKILL is all-or-nothing, and the killed bank always opens.

A child process adds N cases (read from a Case JSONL file, with precomputed unit vectors: the same
``bank.add`` that ``memento bank import`` calls after encoding) to a Milvus Lite bank that holds a few cases,
in insert batches of 100 rows, and is killed (10 times per phase, times ``MEMENTO_PROBE_SCALE``) in one of three
phases of an uninterrupted add:

- ``add``: at moments spread over the whole add (mostly while it inserts);
- ``seal``: at moments spread from the add's flush (``MilvusRows.seal``: milvus-lite writes the segment's Parquet
  file and its manifest) to the end (the commit, milvus-lite's index build, the close);
- ``index``: while milvus-lite writes the sealed segment's vector index file (``indexes/*.vector.flat.idx``,
  written in place by its background thread); a killed write leaves a torn file, which milvus-lite cannot load
  (before the repair in ``memento.bank.milvusindex.load_collection``, no command opened such a bank).

In every phase the child writes that index file as milvus-lite does (``np.save`` into the path opened for
writing) through a file object that pauses after each 16 KiB (~70 ms for the whole file), so that kills land
inside the write.

Reopened, the bank holds its earlier cases and either all N new ones or none (rows the killed add had inserted
are rolled back), search works, and adding the file again completes it to exactly N new cases, each once.
"""

from __future__ import annotations

import logging
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from memento.bank import MilvusBank, MilvusOptions, create_bank, open_bank
from memento.formats import write_jsonl
from memento.types import Case
from tests.fuzzing import record, scale

pytestmark = [pytest.mark.slow, pytest.mark.probe]

N, BEFORE, DIM, BATCH = 2000, 5, 32, 100

CHILD = """
import sys, time
import numpy as np
import milvus_lite, pymilvus
from milvus_lite.index.brute_force import BruteForceIndex
from memento.formats import read_case_file
from memento.bank import MilvusOptions, open_bank
from memento.bank.milvus import MilvusRows
uri, path, vectors, batch = sys.argv[1:5]
cases = read_case_file(path, "case")
vectors_ND = np.load(vectors)

class Paused:  # a file whose writes pause after each 16 KiB
    def __init__(self, stream):
        self.stream = stream
    def write(self, data):
        view = memoryview(data).cast("B")
        for start in range(0, len(view), 16384):
            self.stream.write(view[start:start + 16384])
            self.stream.flush()
            time.sleep(0.004)
        return len(view)

def save(self, path):  # BruteForceIndex.save (milvus-lite 3.2), its writes paused; markers around it
    print("index", len(self._vectors), flush=True)
    with open(path, "wb") as stream:
        np.save(Paused(stream), self._vectors, allow_pickle=False)
    print("indexed", flush=True)

BruteForceIndex.save = save
plain_seal = MilvusRows.seal
def seal(self):
    if self.unflushed:
        print("sealing", flush=True)
    plain_seal(self)
MilvusRows.seal = seal
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


def wait_for_marker(child: subprocess.Popen, word: str) -> float:
    """Read the child's lines up to ``word`` (the new segment's ``index`` line: more than BEFORE rows); returns
    the time it was read."""
    assert child.stdout is not None
    while True:
        line = child.stdout.readline()
        assert line, (word, child.communicate(timeout=60)[1][-2000:])
        parts = line.split()
        if parts[0] == word and (word != "index" or int(parts[1]) > BEFORE):
            return time.monotonic()


def torn_index_files(uri: str) -> list[str]:
    """The vector index files of a killed bank that numpy cannot read whole (checked before the bank opens)."""
    lite = Path(uri.removeprefix("milvus:").split("#")[0])
    torn = []
    for path in sorted(lite.glob("collections/*/partitions/*/indexes/*.idx")):
        try:
            np.load(path, allow_pickle=False)
        except Exception:
            torn.append(path.name)
    return torn


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
        from memento.bank.milvus import disconnect

        disconnect(client, lite_dir)


@pytest.mark.parametrize("phase", ["add", "seal", "index"])
def test_import_killed_is_all_or_nothing_and_opens(inputs, tmp_path: Path, phase: str) -> None:
    _, _, cases, vectors_ND = inputs
    rng = np.random.default_rng(0)
    chance = random.Random(f"milvus-kill-{phase}")
    calibrate = f"milvus:{tmp_path / 'calibrate.db'}#cases"
    prefilled(calibrate, rng)
    child = start(calibrate, inputs)
    go(child)
    began = time.monotonic()
    seen = {}  # marker -> when it was read (the index lines come from milvus-lite's thread: any order after sealing)
    assert child.stdout is not None
    for line in child.stdout:
        parts = line.split()
        if parts and (parts[0] != "index" or int(parts[1]) > BEFORE):
            seen.setdefault(parts[0], time.monotonic())
    assert child.wait(timeout=60) == 0
    assert {"sealing", "index", "indexed", "added"} <= set(seen), seen
    window = {"add": (began, seen["added"]), "seal": (seen["sealing"], max(seen["added"], seen["indexed"])),
              "index": (seen["index"], seen["indexed"])}[phase]
    width = window[1] - window[0]
    points = 10 * scale()
    outcomes: list[tuple[float, int, int, list[str]]] = []  # (delay, raw rows, cases after reopening, torn files)
    uris = [f"milvus:{tmp_path / f'b{i}.db'}#cases" for i in range(points)]
    child = start(uris[0], inputs)  # each child imports while the previous one's bank is checked
    for i, uri in enumerate(uris):
        before_ids, before_ND = prefilled(uri, rng)
        go(child)
        if phase != "add":
            wait_for_marker(child, {"seal": "sealing", "index": "index"}[phase])
        delay = chance.uniform(0.0, 1.1 * width)  # up to a little past the window's end
        time.sleep(delay)
        alive = child.poll() is None
        child.kill()
        child.communicate(timeout=60)
        record(__name__, "kills", int(alive))
        if i + 1 < points:
            child = start(uris[i + 1], inputs)
        raw = raw_rows(uri)
        torn = torn_index_files(uri)
        with open_bank(uri) as bank:  # a torn index file is removed and rebuilt (one warning line)
            n = len(bank)
            outcomes.append((delay, raw, n, torn))
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
        assert torn_index_files(uri) == []
    logging.getLogger(__name__).info("%s: %d kills, %d rolled back, %d committed, %d with a torn index file "
                                     "(window %.3f s): %s", phase, points,
                                     sum(1 for o in outcomes if o[2] == BEFORE),
                                     sum(1 for o in outcomes if o[2] == BEFORE + N),
                                     sum(1 for o in outcomes if o[3]), width, outcomes)
    if phase == "add":
        rolled_back = sum(1 for _, raw, n, _ in outcomes if raw > BEFORE and n == BEFORE)
        assert rolled_back >= points * 3 // 10, f"too few kills landed mid-import: {outcomes} (add took {width:.2f} s)"
    if phase == "index":
        torn = sum(1 for o in outcomes if o[3])
        assert torn >= points * 3 // 10, f"too few kills tore the index file: {outcomes} (its write took {width:.3f} s)"
