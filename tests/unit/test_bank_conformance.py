"""One conformance suite for every bank backend: the directory bank (SQLite + faiss), a Milvus Lite bank, and a
Milvus server.

Every test runs on all three, the directory bank both with its vectors in RAM and on disk (``bank_uri`` is
parametrised). Milvus Lite starts in-process: one Lite file per test
module (its in-process server starts once, ~0.2 s), one collection per test. The server is Milvus Lite's gRPC
server (``milvus-lite server``, the same Milvus API over the network) in a child process, reached as
``milvus:http://127.0.0.1:PORT#collection``: the path a user's Milvus cluster takes, without Docker.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from memento.bank import Bank, CaseBank, MilvusBank, MilvusOptions, bank_exists, create_bank, open_bank
from memento.bank.front import BankFront
from memento.bank.uri import parse_bank_uri
from memento.config import EncoderConfig
from memento.errors import BankError, DataFormatError, DimensionError, NotABankError, UnknownCaseError
from memento.formats import read_cases_jsonl
from memento.types import Case, content_hash
from tests.conftest import unit_vectors

DIM = 16
BACKENDS = ["dir", "disk", "milvus", "server"]  # disk: a directory bank with vectors="disk"


@pytest.fixture(scope="module")
def lite_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("milvus") / "banks.db"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_milvus_server(data_dir: Path, port: int) -> subprocess.Popen:
    """``milvus-lite server`` on ``port`` in a child process, once it accepts connections."""
    child = subprocess.Popen([sys.executable, "-m", "milvus_lite", "server", "--data-dir", str(data_dir),
                              "--host", "127.0.0.1", "--port", str(port)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if child.poll() is not None:
            raise RuntimeError(f"milvus-lite server exited with {child.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return child
        except OSError:
            time.sleep(0.1)
    child.kill()
    raise RuntimeError("milvus-lite server did not listen within 60 s")


@pytest.fixture(scope="module")
def server_url(tmp_path_factory: pytest.TempPathFactory):
    port = _free_port()
    child = start_milvus_server(tmp_path_factory.mktemp("milvus-server"), port)
    yield f"http://127.0.0.1:{port}"
    child.terminate()
    try:
        child.wait(timeout=20)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


@pytest.fixture(params=BACKENDS)
def bank_uri(request: pytest.FixtureRequest, tmp_path: Path, lite_file: Path,
             monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "disk":  # every directory bank the test creates keeps its vectors in vectors.f32
        create = CaseBank.create.__func__  # type: ignore[attr-defined]
        monkeypatch.setattr(CaseBank, "create", classmethod(
            lambda cls, *args, **kwargs: create(cls, *args, **{**kwargs, "vectors": "disk"})))
    if request.param in ("dir", "disk"):
        return str(tmp_path / "bank")
    if request.param == "server":
        return f"milvus:{request.getfixturevalue('server_url')}#t{uuid.uuid4().hex[:12]}"
    return f"milvus:{lite_file}#t{uuid.uuid4().hex[:12]}"


@pytest.fixture
def bank(bank_uri: str):
    b = create_bank(bank_uri, DIM, encoder=EncoderConfig())
    yield b
    b.close()


def make_cases(n: int, prefix: str = "state", *, start: int = 0) -> list[Case]:
    """Cases with envs (None, e1, e2), kinds (case, tip) and rewards (0, 1, 0.5) that vary with i."""
    return [Case(state=f"{prefix} {i}", action=f"action {i}", reward=(0.0, 1.0, 0.5)[i % 3],
                 env=(None, "e1", "e2")[i % 3] if i % 5 else "e\"q", kind="tip" if i % 4 == 0 else "case",
                 meta={"i": i, "tag": f"t{i % 2}"}) for i in range(start, start + n)]


@pytest.fixture
def filled(bank: Bank, rng: np.random.Generator):
    emb = unit_vectors(rng, 30, DIM)
    cases = make_cases(30)
    ids = bank.add(cases, emb)
    return bank, cases, ids, emb


def test_both_backends_implement_the_protocol(bank: Bank) -> None:
    assert isinstance(bank, Bank)
    assert isinstance(bank, (CaseBank, MilvusBank))
    for name in Bank.__annotations__:  # the data members (uid, config, read_only, audit), set by the front
        assert hasattr(bank, name), name


def _protocol_members() -> dict[str, object]:
    """The operations :class:`Bank` documents: its methods and properties (the data members are checked on a bank)."""
    dunders = ("__len__", "__enter__", "__exit__")
    return {name: member for name, member in vars(Bank).items()
            if (isinstance(member, property) or inspect.isfunction(member))
            and (not name.startswith("_") or name in dunders)}


def _parameters(function: object) -> list[tuple[str, object, object]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]  # type: ignore


@pytest.mark.parametrize("implementation", [BankFront, CaseBank, MilvusBank], ids=lambda cls: cls.__name__)
def test_the_front_and_every_backend_have_each_protocol_member(implementation: type) -> None:
    """The protocol is the one description of the bank API: the front (and so each back end) has every member it
    documents, a property where it is one and the same parameters (names, kinds, defaults) where it is a method;
    and the front adds no public operation the protocol does not document."""
    members = _protocol_members()
    assert len(members) >= 40 and "add" in members and "path" in members
    for name, spec in members.items():
        impl = inspect.getattr_static(implementation, name, None)
        assert impl is not None, f"{implementation.__name__} has no {name}"
        if isinstance(spec, property):
            assert isinstance(impl, property), f"{implementation.__name__}.{name} is not a property"
        else:
            assert _parameters(spec) == _parameters(getattr(implementation, name)), f"{implementation.__name__}.{name}"
    public = {name for name in dir(BankFront) if not name.startswith("_")}
    assert public <= set(members), f"BankFront operations not in the protocol: {sorted(public - set(members))}"


def test_add_ids_dedupe_and_allow_duplicates(filled, rng) -> None:
    bank, cases, ids, emb = filled
    assert len(bank) == 30 and len(set(ids)) == 30
    assert ids[0] == "c" + content_hash(cases[0].state, cases[0].action, cases[0].env, cases[0].kind)[:16]
    again = bank.add(cases[:5], emb[:5])
    assert again == ids[:5] and len(bank) == 30  # same content: the stored ids, nothing added
    same = [Case(state="x", action="y", reward=0.0), Case(state="x", action="y", reward=1.0)]
    within = bank.add(same, unit_vectors(rng, 2, DIM))
    assert within[0] == within[1] and len(bank) == 31
    dup = bank.add(cases[:2], emb[:2], allow_duplicates=True)
    assert len(bank) == 33 and not set(dup) & set(ids)
    own = bank.add([Case(id="mine", state="own id", action="a", reward=0.0)], unit_vectors(rng, 1, DIM))
    assert own == ["mine"] and bank.get("mine").state == "own id"
    with pytest.raises(DataFormatError, match="already used"):
        bank.add([Case(id="mine", state="other", action="a", reward=0.0)], unit_vectors(rng, 1, DIM))
    with pytest.raises(DataFormatError, match="used twice"):
        bank.check_ids([Case(id="z", state=s, action="a", reward=0.0) for s in ("1", "2")])
    with pytest.raises(DimensionError):
        bank.add(cases[:2], emb[:1])
    with pytest.raises(DataFormatError, match="unit-norm"):
        bank.add([Case(state="n", action="a", reward=0.0)], 2 * emb[:1])
    assert len(bank) == 34


def test_get_rewards_embeddings_positions(filled) -> None:
    bank, cases, ids, emb = filled
    got = bank.get([ids[3], ids[1]])
    assert [c.state for c in got] == [cases[3].state, cases[1].state]
    one = bank.get(ids[7])
    assert (one.env, one.kind, one.meta, one.reward) == (cases[7].env, cases[7].kind, cases[7].meta, cases[7].reward)
    assert one.created is not None
    rewards = bank.rewards(ids)
    assert rewards.dtype == np.float64 and rewards.tolist() == [c.reward for c in cases]
    vectors = bank.embeddings(ids[::-1])
    assert vectors.dtype == np.float32 and np.array_equal(vectors, emb[::-1])
    assert np.array_equal(bank.embeddings_at([4, 2]), emb[[4, 2]])
    assert bank.positions_of([ids[5], ids[0]]).tolist() == [5, 0]
    assert bank.ids_at([0, 29]) == [ids[0], ids[29]]
    with pytest.raises(UnknownCaseError, match="nope"):
        bank.get("nope")
    with pytest.raises(UnknownCaseError):
        bank.positions_of(["nope"])
    with pytest.raises(UnknownCaseError):
        bank.embeddings_at([30])


def _exact(emb: np.ndarray, keep: np.ndarray, q: np.ndarray, c: int) -> list[int]:
    positions = np.flatnonzero(keep)
    sims = emb[positions] @ q
    return positions[np.argsort(-sims, kind="stable")[:c]].tolist()


@pytest.mark.parametrize("env,kind", [(None, None), ("e1", None), (None, "tip"), ("e2", "case"), ('e"q', None),
                                      ("absent", None)])
def test_candidates_with_filters_return_the_stored_vectors(filled, env, kind) -> None:
    bank, cases, ids, emb = filled
    q = emb[11]
    keep = np.array([(env is None or c.env == env) and (kind is None or c.kind == kind) for c in cases])
    cands = bank.candidates(q, 8, env=env, kind=kind)
    assert cands.positions_C.tolist() == _exact(emb, keep, q, 8)
    assert cands.ids == [ids[p] for p in cands.positions_C]
    assert cands.embeddings_CD.dtype == np.float32 and cands.embeddings_CD.shape == (len(cands), DIM)
    assert np.array_equal(cands.embeddings_CD, emb[cands.positions_C])
    assert np.allclose(cands.scores_C, emb[cands.positions_C] @ q, atol=1e-5)


def test_positive_candidates(filled) -> None:
    bank, cases, ids, emb = filled
    q = emb[2]
    cands = bank.candidates(q, 30)
    positive = cands.positive(bank.rewards(cands.ids))  # the post-filter every backend supports
    assert all(cases[p].reward > 0 for p in positive.positions_C)
    keep = np.array([c.reward > 0 for c in cases])  # the pre-filter: the top-C among positive cases
    pushed = bank.candidates(q, 5, positive=True)
    assert pushed.positions_C.tolist() == _exact(emb, keep, q, 5)
    assert np.array_equal(pushed.embeddings_CD, emb[pushed.positions_C])
    both = bank.candidates(q, 5, env="e1", positive=True)
    assert both.positions_C.tolist() == _exact(emb, keep & np.array([c.env == "e1" for c in cases]), q, 5)
    _, found = bank.search(q, 3, positive=True)
    assert list(found) == [ids[p] for p in _exact(emb, keep, q, 3)]
    # a reward changed after the add moves a case in or out of the filter at once
    best = _exact(emb, keep, q, 1)[0]
    bank.update_reward(ids[best], 0.0)
    bank.update_reward(ids[0], 1.0)
    keep[best], keep[0] = False, True
    assert bank.candidates(q, 5, positive=True).positions_C.tolist() == _exact(emb, keep, q, 5)
    bank.delete(ids[0])
    keep[0] = False
    assert bank.search_positions(q[None, :], 5, positive=True)[1][0].tolist() == _exact(emb, keep, q, 5)


def test_search_single_and_batch(filled) -> None:
    bank, cases, ids, emb = filled
    scores, found = bank.search(emb[4], 3)
    assert found[0] == ids[4] and scores[0] == pytest.approx(1.0, abs=1e-5)
    scores_BK, positions_BK = bank.search_positions(emb[:2], 40)
    assert positions_BK.shape == (2, 40) and (positions_BK[:, 30:] == -1).all()
    assert np.isneginf(scores_BK[:, 30:]).all()
    assert positions_BK[:, 0].tolist() == [0, 1]
    with pytest.raises(DimensionError):
        bank.search(np.ones(DIM + 1, dtype=np.float32), 3)
    with pytest.raises(DataFormatError):
        bank.search(emb[0], 0)


def test_update_reward(filled) -> None:
    bank, cases, ids, emb = filled
    bank.update_reward(ids[3], 0.25)
    assert bank.rewards([ids[3]]).tolist() == [0.25]
    assert np.array_equal(bank.embeddings([ids[3]]), emb[3:4])  # the row is otherwise unchanged
    assert bank.get(ids[3]).state == cases[3].state
    with pytest.raises(UnknownCaseError):
        bank.update_reward("nope", 1.0)
    with pytest.raises(DataFormatError):
        bank.update_reward(ids[3], float("nan"))


def test_delete_and_replace(filled, rng) -> None:
    bank, cases, ids, emb = filled
    assert bank.delete([ids[1], ids[2]]) == 2
    assert bank.is_deleted([ids[0], ids[1], ids[2]]) == [False, True, True]
    assert bank.deleted_ids() == [ids[1], ids[2]] and bank.num_deleted == 2
    assert ids[1] not in bank.candidates(emb[1], 30).ids
    assert ids[1] not in {c.id for c in bank.iter_cases()}
    with pytest.raises(UnknownCaseError, match="was deleted"):  # never read again by a user
        bank.get(ids[1])
    with pytest.raises(UnknownCaseError, match="was deleted"):
        bank.get([ids[0], ids[1]])
    assert bank.get(ids[1], include_deleted=True).state == cases[1].state  # logged decisions replay
    with pytest.raises(UnknownCaseError, match="already deleted"):
        bank.delete(ids[1])
    again = bank.add(cases[1:2], emb[1:2])  # the content again: a new case, a new id
    assert again[0] != ids[1] and len(bank) == 31
    new_vec = unit_vectors(rng, 1, DIM)[0]
    new_id = bank.replace(ids[5], Case(state="replacement", action="a", reward=1.0), new_vec)
    assert bank.is_deleted([ids[5], new_id]) == [True, False] and len(bank) == 32
    assert bank.candidates(new_vec, 1).ids == [new_id]
    assert bank.search(emb[5], 30)[1].tolist().count(ids[5]) == 0
    assert bank.replace(ids[6], cases[7], emb[7]) == ids[7]  # content already stored: that case's id
    assert bank.is_deleted([ids[6]]) == [True]
    with pytest.raises(UnknownCaseError, match="was deleted"):  # a replaced case is not read either
        bank.get(ids[5])


def test_truncate(filled) -> None:
    bank, cases, ids, emb = filled
    assert bank.truncate(20) == 10 and len(bank) == 20
    with pytest.raises(UnknownCaseError):
        bank.get(ids[25])
    assert bank.add(cases[25:26], emb[25:26]) == [ids[25]] and bank.positions_of([ids[25]]).tolist() == [20]


def test_iteration_export_and_stats(filled, tmp_path) -> None:
    bank, cases, ids, emb = filled
    bank.delete(ids[0])
    listed = list(bank.iter_cases(batch_size=7))
    assert [c.id for c in listed] == ids[1:]
    out = tmp_path / "export.jsonl"
    assert bank.export_jsonl(out) == 29
    assert [c.to_json() for c in read_cases_jsonl(out)] == [c.to_json() for c in listed]
    stats = bank.stats()
    assert stats["cases"] == 30 and stats["dim"] == DIM and stats["deleted"] == 1
    assert stats["reward_positive"] == sum(c.reward > 0 for c in cases)
    assert stats["reward_mean"] == pytest.approx(np.mean([c.reward for c in cases]))
    assert stats["by_kind"] == {"case": 22, "tip": 8}
    assert stats["by_env"] == {None: 8, "e\"q": 6, "e1": 8, "e2": 8}
    assert stats["encoder"]["pooling"] == "avg"


def test_reopen_after_close_keeps_everything(bank_uri, rng) -> None:
    emb = unit_vectors(rng, 12, DIM)
    with create_bank(bank_uri, DIM, encoder=EncoderConfig()) as bank:
        ids = bank.add(make_cases(12), emb)
        bank.update_reward(ids[2], 0.75)
        bank.delete(ids[3])
        uid, before = bank.uid, [c.to_json() for c in bank.iter_cases()]
    assert bank_exists(bank_uri)
    with open_bank(bank_uri, dim=DIM, encoder=EncoderConfig()) as bank:
        assert bank.uid == uid and len(bank) == 12 and bank.deleted_ids() == [ids[3]]
        assert [c.to_json() for c in bank.iter_cases()] == before
        assert np.array_equal(bank.embeddings_at(np.arange(12)), emb)
        assert bank.rewards([ids[2]]).tolist() == [0.75]
        assert bank.config.encoder == EncoderConfig()
    with pytest.raises(BankError, match="closed"):
        bank.get(ids[0])
    with open_bank(bank_uri, read_only=True) as reader:
        with pytest.raises(BankError, match="read-only"):
            reader.add(make_cases(1, "x"), emb[:1])


def test_dim_or_encoder_mismatch_is_one_line_and_writes_nothing(bank_uri, rng) -> None:
    with create_bank(bank_uri, DIM, encoder=EncoderConfig()) as bank:
        bank.add(make_cases(3), unit_vectors(rng, 3, DIM))
    with pytest.raises(DimensionError) as error:
        open_bank(bank_uri, dim=DIM + 1)
    assert "dim=16" in str(error.value) and "\n" not in str(error.value)
    with pytest.raises(BankError) as error:
        open_bank(bank_uri, encoder=EncoderConfig(model="/some/simcse", pooling="cls"))
    assert "encoder" in str(error.value) and "\n" not in str(error.value)
    with pytest.raises(BankError, match="already"):
        create_bank(bank_uri, DIM)
    with open_bank(bank_uri) as bank:
        assert len(bank) == 3 and bank.dim == DIM


def test_missing_bank_is_not_created(bank_uri) -> None:
    with pytest.raises(NotABankError):
        open_bank(bank_uri)
    assert not bank_exists(bank_uri)
    where = parse_bank_uri(bank_uri)
    if where.backend == "dir":
        assert not where.path.exists()


CHILD = textwrap.dedent("""
    import sys
    import numpy as np
    from memento.bank import open_bank
    from memento.types import Case
    bank = open_bank(sys.argv[1])
    rng = np.random.default_rng(0)
    for i in range(100000):
        x = rng.standard_normal((3, 16)).astype(np.float32)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        ids = bank.add([Case(state=f"step {i} case {j}", action="a", reward=1.0) for j in range(3)], x)
        print(" ".join(ids), flush=True)  # reported as committed: add returned
""")


def test_kill_9_during_adds_keeps_every_reported_case(bank_uri, tmp_path, rng) -> None:
    with create_bank(bank_uri, DIM) as bank:
        bank.add(make_cases(5), unit_vectors(rng, 5, DIM))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    child = subprocess.Popen([sys.executable, "-c", CHILD, bank_uri], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True, env=env)
    reported: list[str] = []
    deadline = time.monotonic() + 120
    try:
        assert child.stdout is not None
        while len(reported) < 3 * 40 and time.monotonic() < deadline:
            line = child.stdout.readline()
            if not line:
                break
            reported.extend(line.split())
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
    assert len(reported) >= 3 * 40, "the child did not add in time"
    with open_bank(bank_uri) as bank:
        assert len(bank) >= 5 + len(reported)
        assert bank.positions_of(reported).tolist() == list(range(5, 5 + len(reported)))
        assert [c.id for c in bank.get(reported)] == reported
        listed = [c.id for c in bank.iter_cases()]
        assert listed[:5 + len(reported)] == bank.ids_at(range(5 + len(reported)))


def test_server_killed_during_adds_keeps_every_reported_case(tmp_path, rng) -> None:
    """``kill -9`` of the Milvus server (not the client) during adds, then a restart on the same data: every case
    whose ``add`` returned is there, at its position; the client's add in flight fails with one line."""
    data, port = tmp_path / "server-data", _free_port()
    uri = f"milvus:http://127.0.0.1:{port}#killed"
    server = start_milvus_server(data, port)
    try:
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        with create_bank(uri, DIM) as bank:
            bank.add(make_cases(5), unit_vectors(rng, 5, DIM))
        child = subprocess.Popen([sys.executable, "-c", CHILD, uri], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, env=env)
        reported: list[str] = []
        assert child.stdout is not None and child.stderr is not None
        deadline = time.monotonic() + 120
        while len(reported) < 3 * 40 and time.monotonic() < deadline:
            line = child.stdout.readline()
            if not line:
                break
            reported.extend(line.split())
        server.send_signal(signal.SIGKILL)
        server.wait(timeout=60)
        out, err = child.communicate(timeout=120)  # the client's next add fails: the server is gone
        reported.extend(out.split())
        assert child.returncode != 0 and "BankError" in err, err[-2000:]
        assert len(reported) >= 3 * 40, "the child did not add in time"
        server = start_milvus_server(data, port)
        with open_bank(uri) as bank:
            assert len(bank) >= 5 + len(reported)
            assert bank.positions_of(reported).tolist() == list(range(5, 5 + len(reported)))
            assert [c.id for c in bank.get(reported)] == reported
    finally:
        server.kill()
        server.wait()


def test_bank_uris() -> None:
    assert parse_bank_uri("runs/bank").backend == "dir"
    assert parse_bank_uri(Path("milvus:x.db")).backend == "dir"  # a Path is always a directory
    lite = parse_bank_uri("milvus:./b.db")
    assert (lite.backend, lite.uri, lite.collection, lite.lite) == ("milvus", "./b.db", "memento_cases", True)
    server = parse_bank_uri("milvus:http://host:19530#cases")
    assert (server.uri, server.collection, server.lite) == ("http://host:19530", "cases", False)
    for bad, match in [("s3://bucket/bank", "unknown bank scheme 's3:'"), ("milvus:", "no URI"),
                       ("milvus:./bank", "ends in .db"), ("milvus:./b.db#9x", "not a Milvus name")]:
        with pytest.raises(BankError, match=match) as error:
            parse_bank_uri(bad)
        assert "\n" not in str(error.value)


def test_unreachable_server_gives_up_within_the_timeout() -> None:
    t0 = time.monotonic()
    with pytest.raises(BankError, match="cannot reach the Milvus server") as error:
        open_bank("milvus:http://127.0.0.1:9#cases", options=MilvusOptions(connect_timeout_s=2.0))
    assert time.monotonic() - t0 < 10 and "\n" not in str(error.value)


def test_missing_extra_names_it(monkeypatch, tmp_path) -> None:
    monkeypatch.setitem(sys.modules, "pymilvus", None)
    with pytest.raises(BankError, match="'milvus' extra"):
        create_bank(f"milvus:{tmp_path}/b.db", DIM)
    assert not (tmp_path / "b.db").exists()


def test_usage_statistics(bank, rng) -> None:
    ids = bank.add(make_cases(4), unit_vectors(rng, 4, DIM))
    assert bank.usage_at([0, 3])[0].tolist() == [0, 0]  # nothing recorded yet: nothing written either
    bank.record_usage(0, ids[:2], 1.0)
    bank.record_usage(1, [ids[1], ids[2]], 0.5)
    bank.record_usage(2, [ids[1]], 0.0)
    shown, total = bank.usage_at([0, 1, 2, 3])
    assert shown.tolist() == [1, 3, 1, 0] and total.tolist() == [1.0, 1.5, 0.5, 0.0]
    assert bank.truncate_usage(2) == 1  # a resume to step 2: the rows of steps >= 2 go
    assert bank.usage_at([1])[0].tolist() == [2]
    bank.delete(ids[0])  # a deleted case was never shown
    assert bank.usage_at([0, 1])[0].tolist() == [0, 2]
    with pytest.raises(UnknownCaseError):
        bank.record_usage(3, ["nope"], 1.0)
    with pytest.raises(DataFormatError, match="step"):
        bank.record_usage(-1, ids[1:2], 1.0)
    with pytest.raises(DataFormatError, match="reward"):
        bank.record_usage(3, ids[1:2], float("inf"))
    with pytest.raises(UnknownCaseError):
        bank.usage_at([4])
    bank.truncate(2)
    assert bank.usage_at([0, 1])[0].tolist() == [0, 2]
    bank.add(make_cases(2, start=2), unit_vectors(rng, 2, DIM))  # the truncated positions again: never shown
    assert bank.usage_at([2, 3])[0].tolist() == [0, 0]


def test_per_case_evidence(bank, rng) -> None:
    ids = bank.add(make_cases(4), unit_vectors(rng, 4, DIM))
    assert bank.evidence_at([0, 3])[0].tolist() == [0, 0]  # nothing recorded yet
    bank.record_evidence(0, ids[:2], [1.0, 0.5], [2.0, -1.0])
    bank.record_evidence(1, [ids[1], ids[2]], [1.0, 0.0], [0.5, 0.0])
    bank.record_evidence(2, [ids[1]], [1.0], [-3.0])
    count, weight, value = bank.evidence_at([0, 1, 2, 3])
    assert count.tolist() == [1, 3, 1, 0] and weight.tolist() == [1.0, 2.5, 0.0, 0.0]
    assert value.tolist() == [2.0, -3.5, 0.0, 0.0]
    assert bank.truncate_usage(2) == 1  # a resume to step 2: the evidence rows of steps >= 2 go too
    assert bank.evidence_at([1])[2].tolist() == [-0.5]
    bank.delete(ids[0])  # a deleted case leaves no evidence
    assert bank.evidence_at([0, 1])[0].tolist() == [0, 2]
    with pytest.raises(UnknownCaseError):
        bank.record_evidence(3, ["nope"], [1.0], [0.0])
    with pytest.raises(DataFormatError, match="step"):
        bank.record_evidence(-1, ids[1:2], [1.0], [0.0])
    with pytest.raises(DataFormatError, match="finite"):
        bank.record_evidence(3, ids[1:2], [-1.0], [0.0])
    with pytest.raises(DimensionError):
        bank.record_evidence(3, ids[1:3], [1.0], [0.0])
    bank.truncate(2)
    bank.add(make_cases(2, start=2), unit_vectors(rng, 2, DIM))  # the truncated positions again: never labelled
    assert bank.evidence_at([1, 2, 3])[0].tolist() == [2, 0, 0]
    new_id = bank.replace(ids[1], make_cases(1, "replaced")[0], unit_vectors(rng, 1, DIM)[0])
    assert bank.evidence_at(bank.positions_of([ids[1], new_id]))[0].tolist() == [0, 0]


def test_action_vectors(bank, rng) -> None:
    ids = bank.add(make_cases(4), unit_vectors(rng, 4, DIM))
    emb, have = bank.action_embeddings_at([0, 1])
    assert emb.shape == (2, DIM) and emb.dtype == np.float32 and not have.any() and not emb.any()
    actions = unit_vectors(rng, 3, DIM)
    bank.set_action_embeddings([0, 1, 3], actions)
    emb, have = bank.action_embeddings_at([3, 2, 0, 3])
    assert have.tolist() == [True, False, True, True]
    assert np.array_equal(emb[[0, 2, 3]], actions[[2, 0, 2]]) and not emb[1].any()
    bank.set_action_embeddings([1], actions[:1])  # replaced
    assert np.array_equal(bank.action_embeddings_at([1])[0], actions[:1])
    with pytest.raises(DataFormatError, match="unit-norm"):
        bank.set_action_embeddings([2], 2 * actions[:1])
    with pytest.raises(UnknownCaseError):
        bank.set_action_embeddings([4], actions[:1])
    bank.delete(ids[0])  # a deleted case's action vector goes with it
    bank.truncate(3)  # and the truncated ones'
    assert bank.action_embeddings_at([0, 1, 2])[1].tolist() == [False, True, False]


def test_usage_and_action_vectors_survive_a_reopen(bank_uri, rng) -> None:
    actions = unit_vectors(rng, 2, DIM)
    with create_bank(bank_uri, DIM) as bank:
        ids = bank.add(make_cases(3), unit_vectors(rng, 3, DIM))
        bank.record_usage(0, ids, 1.0)
        bank.record_usage(1, ids[1:], 0.0)
        bank.set_action_embeddings([0, 2], actions)
        bank.record_evidence(1, ids[:2], [1.0, 1.0], [0.5, -0.5])
    with open_bank(bank_uri) as bank:
        assert bank.evidence_at([0, 1, 2])[2].tolist() == [0.5, -0.5, 0.0]
        shown, total = bank.usage_at([0, 1, 2])
        assert shown.tolist() == [1, 2, 2] and total.tolist() == [1.0, 1.0, 1.0]
        emb, have = bank.action_embeddings_at([0, 1, 2])
        assert have.tolist() == [True, False, True] and np.array_equal(emb[[0, 2]], actions)
    with open_bank(bank_uri, read_only=True) as reader:
        assert reader.usage_at([1])[0].tolist() == [2]
        with pytest.raises(BankError, match="read-only"):
            reader.record_usage(2, ids[:1], 1.0)


def test_case_features_from_candidates(filled, rng) -> None:
    """The Q-network's case features (``QNetConfig.features="case"``) on every backend: the candidates' state
    vectors, their action vectors (encoded once, then stored in the bank) and usage statistics."""
    from memento.config import CASE_SCALARS
    from memento.learn.features import CaseFeaturizer

    bank, cases, ids, emb = filled
    action_of = {c.action: v for c, v in zip(cases, unit_vectors(rng, len(cases), DIM))}
    encoded: list[str] = []

    def encode(texts: list[str]) -> np.ndarray:
        encoded.extend(texts)
        return np.stack([action_of[t] for t in texts])

    featurizer = CaseFeaturizer(bank, encode)
    cands = bank.candidates(emb[4], 5)
    bank.record_usage(0, cands.ids[:2], 1.0)
    vectors = featurizer.case_vectors(cands)
    assert vectors.shape == (5, 2 * DIM + CASE_SCALARS) and vectors.dtype == np.float32
    assert np.array_equal(vectors[:, :DIM], emb[cands.positions_C])
    assert np.allclose(vectors[:, DIM:2 * DIM], [action_of[cases[p].action] for p in cands.positions_C], atol=1e-6)
    assert vectors[:, 2 * DIM + 2].tolist() == pytest.approx([np.log(2)] * 2 + [0.0] * 3)  # log(1 + shown)
    assert sorted(encoded) == sorted(cases[p].action for p in cands.positions_C)
    again = featurizer.case_vectors(bank.candidates(emb[4], 5))
    assert len(encoded) == 5 and np.array_equal(again, vectors)  # the action vectors came from the bank


def test_bench_bank_runs_both_backends_side_by_side(tmp_path) -> None:
    from memento.bench.bank import BankBenchConfig, format_table, run_bank_bench

    config = BankBenchConfig(sizes=(400,), factories=("Flat", "IVF{nlist},Flat", "IVF{nlist},SQ8"), dim=DIM,
                             queries=10, k=8, nprobe=(64,), backends=("dir", "milvus"), op="candidates")
    results = run_bank_bench(config, out=tmp_path / "bench.json", workdir=tmp_path)
    rows = {(r["backend"], r["factory"]): r for r in results["results"]}
    assert set(rows) == {(backend, factory) for backend in ("dir", "milvus")
                         for factory in ("Flat", "IVF8,Flat", "IVF8,SQ8")}  # SQ8: compressed codes on both
    for key in (("dir", "Flat"), ("milvus", "Flat")):  # exact on both backends
        assert rows[key]["search"][0]["recall@8"] == 1.0
    assert all(r["add_per_s"] > 0 and r["bytes"] > 0 for r in rows.values())
    assert "| 400 | Flat | milvus |" in format_table(results)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("memento-bench-")] == []


# ---------------------------------------------------------------- Milvus: all-or-nothing writes (the watermark)


@pytest.fixture
def lite_uri(lite_file: Path) -> str:
    return f"milvus:{lite_file}#w{uuid.uuid4().hex[:12]}"


def _raw(bank: MilvusBank, where: str = "") -> int:
    rows = bank._rows.client.query(bank.collection, filter=where, output_fields=["count(*)"])
    return int(rows[0]["count(*)"]) if rows else 0


def _properties(bank: MilvusBank) -> dict[str, str]:
    return {str(k): str(v) for k, v in bank._rows.client.describe_collection(bank.collection)["properties"].items()}


def test_milvus_add_that_fails_half_way_leaves_nothing(lite_uri, rng, monkeypatch) -> None:
    """An insert batch that fails after two went in: the add raises one line and the bank is as before (the
    two batches are deleted); the same add then succeeds at the same positions."""
    with create_bank(lite_uri, DIM, options=MilvusOptions(insert_batch=2)) as bank:
        before = bank.add(make_cases(5), unit_vectors(rng, 5, DIM))
        client, real = bank._rows.client, bank._rows.client.insert
        calls = []

        def failing(*args, **kwargs):
            calls.append(1)
            if len(calls) == 3:
                raise RuntimeError("disk full")
            return real(*args, **kwargs)

        monkeypatch.setattr(client, "insert", failing)
        cases, emb = make_cases(10, "new"), unit_vectors(rng, 10, DIM)
        with pytest.raises(BankError, match="insert failed: disk full"):
            bank.add(cases, emb)
        assert len(bank) == 5 and _raw(bank) == 5 and _properties(bank)["memento.committed"] == "5"
        assert bank.search(emb[0], 1)[1].tolist()[0] in before
        monkeypatch.setattr(client, "insert", real)
        ids = bank.add(cases, emb)
        assert bank.positions_of(ids).tolist() == list(range(5, 15)) and len(bank) == 15
        assert _properties(bank)["memento.committed"] == "15"


def test_milvus_rows_past_the_watermark_are_unseen_then_rolled_back(lite_uri, rng, caplog) -> None:
    """Rows a killed write inserted but never committed: a reader neither counts nor finds them; the next writer
    deletes them (one warning line) and adds at their positions."""
    with create_bank(lite_uri, DIM) as bank:
        ids = bank.add(make_cases(5), unit_vectors(rng, 5, DIM))
        ghost = unit_vectors(rng, 3, DIM)
        bank._rows.client.insert(bank.collection, [
            {"pos": 5 + i, "id": f"ghost{i}", "hash": "0" * 64, "state": "g", "action": "g", "reward": 1.0,
             "env": None, "kind": "case", "meta": "{}", "attrs": {}, "created": 0.0, "deleted": False,
             "deleted_at": 0.0, "replaced_by": "", "vector": ghost[i]} for i in range(3)])
        bank._features.set_actions(np.array([6]), ghost[:1])  # a side row past the watermark too
    with open_bank(lite_uri, read_only=True) as reader:
        assert len(reader) == 5 and _raw(reader) == 8
        assert reader.search(ghost[0], 3)[1].tolist()[0] in ids
        assert [c.id for c in reader.iter_cases()] == ids
    with caplog.at_level(logging.WARNING, logger="memento.bank.milvus"), open_bank(lite_uri) as bank:
        assert [r.message for r in caplog.records if "rolled back 3 row(s)" in r.message]
        assert len(bank) == 5 and _raw(bank) == 5
        new = bank.add(make_cases(3, "new"), ghost)
        assert bank.positions_of(new).tolist() == [5, 6, 7]
        assert not bank.action_embeddings_at([6])[1].any()


def test_milvus_deletions_committed_before_a_crash_are_completed(lite_uri, rng) -> None:
    """A write killed after its commit point but before its tombstones were all written: the next writer writes
    them (and drops the deleted cases' usage rows); nothing pending is left."""
    with create_bank(lite_uri, DIM) as bank:
        ids = bank.add(make_cases(6), unit_vectors(rng, 6, DIM))
        bank.record_usage(0, ids[2:4], 1.0)
        pending = {"tombstones": [[[2, 3], "", 1.0]], "forget": [2, 3]}
        bank._rows.client.alter_collection_properties(bank.collection,
                                                      properties={"memento.pending": json.dumps(pending)})
    with open_bank(lite_uri) as bank:
        assert bank.is_deleted(ids) == [False, False, True, True, False, False]
        assert bank.usage_at([2, 3])[0].tolist() == [0, 0]
        assert "memento.pending" not in _properties(bank)
        assert len(bank.search(unit_vectors(rng, 1, DIM)[0], 6)[1]) == 4


def test_milvus_truncate_and_delete_move_the_watermark_first(lite_uri, rng) -> None:
    with create_bank(lite_uri, DIM) as bank:
        ids = bank.add(make_cases(8), unit_vectors(rng, 8, DIM))
        bank.record_usage(0, ids[5:7], 1.0)
        bank.delete(ids[:2])
        assert "memento.pending" not in _properties(bank) and bank.num_deleted == 2
        # a truncate killed after lowering the watermark: the next writer removes the rest
        bank._rows.client.alter_collection_properties(bank.collection, properties={"memento.committed": "5"})
    with open_bank(lite_uri) as bank:
        assert len(bank) == 5 and _raw(bank) == 5 and bank.num_deleted == 2
        assert _raw(bank, where="pos >= 5") == 0
        assert bank.usage_at([4])[0].tolist() == [0]
        assert bank.truncate(3) == 2 and _properties(bank)["memento.committed"] == "3"


def test_milvus_bank_written_before_the_watermark_opens_and_gets_one(lite_uri, rng) -> None:
    with create_bank(lite_uri, DIM) as bank:
        ids = bank.add(make_cases(4), unit_vectors(rng, 4, DIM))
        bank._rows.client.drop_collection_properties(bank.collection, property_keys=["memento.committed"])
    with open_bank(lite_uri) as bank:
        assert len(bank) == 4 and bank.ids_at(range(4)) == ids
        bank.add(make_cases(1, "more"), unit_vectors(rng, 1, DIM))
        assert _properties(bank)["memento.committed"] == "5"


# ---------------------------------------------------------------- the case lifecycle (issue 40): update, history,
# add with new meta, count, delete_all


def test_update_changes_a_case_in_place(filled, bank_uri) -> None:
    bank, cases, ids, emb = filled
    before = bank.get(ids[4])
    assert before.version == 1 and before.updated == before.created
    new = bank.update(ids[4], action="a better answer", reward=0.25, meta={"topic": "geo"})
    assert (new.id, new.version, new.action, new.reward, new.meta) == (ids[4], 2, "a better answer", 0.25,
                                                                       {"topic": "geo"})
    assert new.updated is not None and new.updated >= before.created and new.state == before.state
    got = bank.get(ids[4])
    assert (got.version, got.action, got.reward, got.meta, got.updated) == (2, new.action, 0.25, new.meta,
                                                                            new.updated)
    assert np.array_equal(bank.embeddings([ids[4]]), emb[4:5]) and len(bank) == 30  # same row, same vector
    assert bank.search(emb[4], 1, filter={"topic": "geo"})[1].tolist() == [ids[4]]  # the new meta is searched
    assert bank.search(emb[4], 30, filter={"i": 4})[1].tolist() == []  # the old one is not
    assert bank.update(ids[4], reward=0.25).version == 2  # nothing changed: no new version
    assert bank.update(ids[4], state=before.state, reward=0.5).version == 3  # the same state may be given
    with pytest.raises(DataFormatError, match="replace the case"):
        bank.update(ids[4], state="another question")
    with pytest.raises(DataFormatError, match="at least one"):
        bank.update(ids[4])
    with pytest.raises(DataFormatError):
        bank.update(ids[4], reward=1.5)
    assert bank.update(ids[5], action=cases[5].action + "!").version == 2
    assert bank.update(ids[5], action=cases[5].action).version == 3  # back to its own content: no clash
    bank.add([Case(state=cases[6].state, action="taken", reward=0.0, env=cases[6].env, kind=cases[6].kind)],
             emb[6:7])
    with pytest.raises(DataFormatError, match="content of case"):  # would duplicate another live case
        bank.update(ids[6], action="taken")
    assert bank.get(ids[6]).action == cases[6].action and bank.get(ids[6]).version == 1  # nothing changed
    with pytest.raises(UnknownCaseError):
        bank.update("nope", reward=1.0)
    bank.delete(ids[7])
    with pytest.raises(UnknownCaseError, match="already deleted"):
        bank.update(ids[7], reward=1.0)
    bank.close()
    with open_bank(bank_uri) as again:  # stored, not only in this process
        assert (again.get(ids[4]).version, again.get(ids[4]).action) == (3, "a better answer")
        assert again.get(ids[0]).version == 1


def test_history_lists_add_update_replace_and_delete(filled, bank_uri, rng) -> None:
    bank, cases, ids, emb = filled
    bank.update(ids[1], action="second", meta={"k": 1})
    bank.update(ids[1], reward=0.0)
    events = [event.to_json() for event in bank.history(ids[1])]
    assert [event["event"] for event in events] == ["add", "update", "update"]
    assert [event["version"] for event in events] == [1, 2, 3]
    assert events[0]["new"]["action"] == cases[1].action and events[0]["new"]["meta"] == cases[1].meta
    assert events[1]["fields"] == ["action", "meta"] and events[1]["old"] == {"action": cases[1].action,
                                                                              "meta": cases[1].meta}
    assert events[1]["new"] == {"action": "second", "meta": {"k": 1}}
    assert events[2]["old"] == {"reward": cases[1].reward} and events[2]["new"] == {"reward": 0.0}
    assert events[0]["time"] <= events[1]["time"] <= events[2]["time"]
    new_id = bank.replace(ids[1], Case(state="a new question", action="a", reward=1.0), unit_vectors(rng, 1, DIM)[0])
    gone = [event.to_json() for event in bank.history(ids[1])]
    assert [event["event"] for event in gone] == ["add", "update", "update", "replace"]
    assert gone[-1]["replaced_by"] == new_id
    assert all("old" not in e and "new" not in e for e in gone)  # the values are erased, the fields' names kept
    assert gone[1]["fields"] == ["action", "meta"]
    assert [e.to_json()["event"] for e in bank.history(new_id)] == ["add"]
    assert bank.history(new_id)[0].replaces == ids[1]
    bank.delete(ids[2])
    assert [e.event for e in bank.history(ids[2])] == ["add", "delete"] and bank.history(ids[2])[0].new is None
    with pytest.raises(UnknownCaseError):
        bank.history("nope")
    bank.close()
    with open_bank(bank_uri, audit=True) as audited:  # an audit keeps the values of what it deletes
        audited.update(ids[3], action="kept")
        audited.delete(ids[3])
        events = audited.history(ids[3])
        assert [e.event for e in events] == ["add", "update", "delete"]
        assert events[0].new["action"] == cases[3].action and events[1].new == {"action": "kept"}
        assert audited.history(ids[1])[1].old is None  # erased before: gone for good


def test_adding_stored_content_with_new_meta_updates_it_in_place(filled) -> None:
    bank, cases, ids, emb = filled
    again = dataclasses.replace(cases[8], meta={"topic": "sci"})
    assert bank.add([again], emb[8:9]) == [ids[8]] and len(bank) == 30  # the same case
    got = bank.get(ids[8])
    assert got.meta == {"topic": "sci"} and got.version == 2
    assert [e.event for e in bank.history(ids[8])] == ["add", "update"]
    assert bank.history(ids[8])[1].fields == ("meta",)
    assert bank.add([dataclasses.replace(cases[8], meta={})], emb[8:9]) == [ids[8]]  # no meta: kept as it is
    assert bank.add([again], emb[8:9]) == [ids[8]] and bank.get(ids[8]).version == 2  # the same meta: no change
    assert bank.count(filter={"topic": "sci"}) == 1


def test_count_and_delete_all_need_a_scope_or_filter(bank, rng) -> None:
    emb = unit_vectors(rng, 6, DIM)
    cases = [Case(state=f"q{i % 3}", action="a", reward=1.0, user=("alice", "bob")[i // 3], meta={"n": i % 2})
             for i in range(6)]
    ids = bank.add(cases, emb)
    assert len(set(ids)) == 6
    assert bank.count() == 6 and bank.count(scope={"user": "alice"}) == 3
    assert bank.count(scope={"user": "bob"}, filter={"n": 1}) == 2 and bank.count(scope={"user": "carol"}) == 0
    assert bank.ids_where(scope={"user": "bob"}) == ids[3:]
    with pytest.raises(DataFormatError, match="needs a scope"):
        bank.delete_all()
    with pytest.raises(DataFormatError, match="needs a scope"):
        bank.delete_all(scope={})
    assert bank.count() == 6
    assert bank.delete_all(scope={"user": "bob"}, filter={"n": 0}) == 1
    assert bank.count(scope={"user": "bob"}) == 2 and bank.count(scope={"user": "alice"}) == 3
    with pytest.raises(UnknownCaseError):
        bank.get(ids[4])
    assert bank.get(ids[0]).user == "alice"  # the other tenant's case of the same question is untouched
    assert bank.delete_all(scope={"user": "carol"}) == 0
    assert bank.delete_all(all=True) == 5 and bank.count() == 0 and len(bank) == 6


def test_a_milvus_collection_made_before_versions_updates_without_one(lite_uri, rng, caplog, monkeypatch) -> None:
    """A collection created before case versions (no version/updated fields; Milvus Lite cannot add fields): an
    update rewrites the row (one warning line), the case reads version 1, and its history has the update."""
    with create_bank(lite_uri, DIM) as bank:
        ids = bank.add(make_cases(3), unit_vectors(rng, 3, DIM))
        monkeypatch.setattr(bank._rows, "versioned", False)
        with caplog.at_level(logging.WARNING, logger="memento.bank.milvus"):
            bank.update(ids[0], action="changed")
        assert "before case versions" in caplog.text
        got = bank.get(ids[0])
        assert (got.action, got.version, got.updated) == ("changed", 1, got.created)
        assert [event.event for event in bank.history(ids[0])] == ["add", "update"]
