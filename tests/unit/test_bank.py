"""CaseBank on random unit vectors: storage, search, filters, bad input, broken files, crash recovery."""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from memento.bank import Candidates, CaseBank
from memento.config import EncoderConfig, IndexConfig
from memento.errors import (
    BankError,
    ConfigError,
    DataFormatError,
    DimensionError,
    NotABankError,
    UnknownCaseError,
)
from memento.formats import read_cases_jsonl
from memento.types import Case
from tests.conftest import unit_vectors

DIM = 16


def make_cases(n: int, prefix: str = "state", *, env: str | None = None, kind: str = "case",
               start: int = 0) -> list[Case]:
    return [Case(state=f"{prefix} {i}", action=f"action {i}", reward=float(i % 2), env=env, kind=kind)
            for i in range(start, start + n)]


def brute_force(emb_ND: np.ndarray, q_D: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    sims = emb_ND @ (q_D / np.linalg.norm(q_D))
    order = np.argsort(-sims, kind="stable")[:k]
    return sims[order], order


@pytest.fixture
def bank_path(tmp_path: Path) -> Path:
    return tmp_path / "bank"


@pytest.fixture
def bank(bank_path: Path):
    b = CaseBank.create(bank_path, DIM)
    yield b
    b.close()


@pytest.fixture
def filled(bank: CaseBank, rng: np.random.Generator):
    """A bank of 20 cases; returns (bank, ids, embeddings)."""
    emb = unit_vectors(rng, 20, DIM)
    ids = bank.add(make_cases(20), emb)
    return bank, ids, emb


def assert_count(bank: CaseBank, n: int) -> None:
    """The bank holds n cases, in memory and on disk after a reopen."""
    assert len(bank) == n
    path = bank.path
    bank.close()
    with CaseBank.open(path) as again:
        assert len(again) == n
        assert sum(1 for _ in again.iter_cases()) == n


class FakeEncoder:
    """Deterministic hashed unit vectors; stands in for a text encoder in import tests."""

    def __init__(self, dim: int = DIM):
        self.dim = dim
        self.model_id = "fake-encoder"

    def encode(self, texts, *, show_progress_bar=None, normalize=True):
        rows = []
        for text in texts:
            seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
            rows.append(unit_vectors(np.random.default_rng(seed), 1, self.dim)[0])
        return np.stack(rows) if rows else np.zeros((0, self.dim), np.float32)


# ---------------------------------------------------------------- create / open


def test_create_makes_empty_bank(bank: CaseBank, bank_path: Path) -> None:
    assert len(bank) == 0
    assert bank.dim == DIM
    assert bank.config.index == IndexConfig(factory="Flat")
    assert bank.config.encoder is None
    assert (bank_path / "cases.sqlite").is_file()
    assert not (bank_path / "cases.sqlite.creating").exists()
    assert len(bank.uid) == 32
    assert repr(bank) == f"CaseBank({str(bank_path)!r}, cases=0, dim={DIM}, index='Flat')"
    scores, ids = bank.search(np.ones(DIM, np.float32), 3)
    assert scores.shape == (0,) and ids.shape == (0,)


def test_create_records_config_and_open_reads_it(bank_path: Path) -> None:
    enc = EncoderConfig(pooling="cls", max_length=64)
    with CaseBank.create(bank_path, 8, IndexConfig(factory="HNSW32,Flat", ef_search=40), encoder=enc) as b:
        uid = b.uid
    with CaseBank.open(bank_path) as b:
        assert b.dim == 8
        assert b.uid == uid
        assert b.config.encoder == enc
        assert b.config.index == IndexConfig(factory="HNSW32,Flat", ef_search=40)


def test_open_keeps_cases(filled, bank_path: Path) -> None:
    bank, ids, emb = filled
    bank.close()
    with CaseBank.open(bank_path, dim=DIM) as again:
        assert len(again) == 20
        assert [c.id for c in again.iter_cases()] == ids
        np.testing.assert_array_equal(again.embeddings(ids), emb)


def test_create_exist_ok_opens_existing(filled, bank_path: Path) -> None:
    bank, ids, _ = filled
    bank.close()
    with CaseBank.create(bank_path, DIM, exist_ok=True) as again:
        assert len(again) == 20


def test_create_over_existing_bank_raises(bank: CaseBank, bank_path: Path) -> None:
    with pytest.raises(BankError, match="a case bank already exists here"):
        CaseBank.create(bank_path, DIM)


def test_create_on_a_file_raises(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("x")
    with pytest.raises(BankError, match="exists and is not a directory"):
        CaseBank.create(target, DIM)


@pytest.mark.parametrize("factory", ["NotAFactory", "IVF,Flat", "Flat,Flat,Nope"])
def test_bad_factory_string_creates_nothing(tmp_path: Path, factory: str) -> None:
    path = tmp_path / "bank"
    with pytest.raises(ConfigError, match=r"IndexConfig\.factory="):
        CaseBank.create(path, DIM, factory)
    assert not path.exists()


def test_empty_factory_and_bad_dim_create_nothing(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"IndexConfig\.factory=''"):
        CaseBank.create(tmp_path / "a", DIM, "")
    with pytest.raises(ConfigError, match=r"BankConfig\.dim=0"):
        CaseBank.create(tmp_path / "b", 0)
    assert list(tmp_path.iterdir()) == []


def test_open_nonexistent_dir(tmp_path: Path) -> None:
    with pytest.raises(NotABankError, match="not a case bank") as info:
        CaseBank.open(tmp_path / "nope")
    assert isinstance(info.value, FileNotFoundError)
    assert not (tmp_path / "nope").exists()


def test_open_empty_dir(tmp_path: Path) -> None:
    with pytest.raises(NotABankError, match=r"no cases\.sqlite"):
        CaseBank.open(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_open_a_file_path(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(NotABankError):
        CaseBank.open(tmp_path / "f")


def test_open_garbage_sqlite(tmp_path: Path) -> None:
    garbage = b"this is not a database at all " * 200
    (tmp_path / "cases.sqlite").write_bytes(garbage)
    with pytest.raises(NotABankError, match=r"not a case bank \(cases\.sqlite: "):
        CaseBank.open(tmp_path)
    assert (tmp_path / "cases.sqlite").read_bytes() == garbage


def test_open_foreign_sqlite(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "cases.sqlite")
    conn.execute("CREATE TABLE foo (x INTEGER)")
    conn.commit()
    conn.close()
    with pytest.raises(NotABankError, match="no such table: meta"):
        CaseBank.open(tmp_path)


def test_open_sqlite_with_other_format(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "cases.sqlite")
    conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    conn.execute("INSERT INTO meta VALUES ('format', 'something-else')")
    conn.commit()
    conn.close()
    with pytest.raises(NotABankError, match="has format 'something-else'"):
        CaseBank.open(tmp_path)


def test_open_foreign_sqlite_leaves_it_untouched(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "cases.sqlite")
    conn.execute("CREATE TABLE foo (x INTEGER)")
    conn.commit()
    conn.close()
    with pytest.raises(NotABankError):
        CaseBank.open(tmp_path)
    conn = sqlite3.connect(tmp_path / "cases.sqlite")
    mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
    conn.close()
    assert mode == "delete"


def test_open_newer_format_version(bank: CaseBank, bank_path: Path) -> None:
    bank.close()
    conn = sqlite3.connect(bank_path / "cases.sqlite")
    with conn:
        conn.execute("UPDATE meta SET value = '99' WHERE key = 'format_version'")
    conn.close()
    with pytest.raises(BankError, match="format version 99 is newer"):
        CaseBank.open(bank_path)


def test_open_dim_mismatch(bank: CaseBank, bank_path: Path) -> None:
    with pytest.raises(DimensionError) as info:
        CaseBank.open(bank_path, dim=384)
    assert f"dim={DIM}" in str(info.value) and "dim=384" in str(info.value)


def test_create_exist_ok_dim_mismatch(bank: CaseBank, bank_path: Path) -> None:
    with pytest.raises(DimensionError):
        CaseBank.create(bank_path, DIM + 1, exist_ok=True)


def test_reopen_with_other_factory_raises(bank: CaseBank, bank_path: Path) -> None:
    bank.close()
    with pytest.raises(BankError, match="bank index is 'Flat', not 'HNSW32,Flat'"):
        CaseBank.open(bank_path, index=IndexConfig(factory="HNSW32,Flat", ef_search=64))


def test_reopen_with_same_factory_new_knobs(bank_path: Path, rng) -> None:
    with CaseBank.create(bank_path, DIM, "HNSW32,Flat") as b:
        b.add(make_cases(10), unit_vectors(rng, 10, DIM))
    with CaseBank.open(bank_path, index=IndexConfig(factory="HNSW32,Flat", ef_search=7)) as b:
        assert b.config.index.ef_search == 7
        assert len(b) == 10
    with CaseBank.open(bank_path) as b:  # the override is for that session only
        assert b.config.index.ef_search == 128


# ---------------------------------------------------------------- add / duplicates / ids


def test_add_returns_ids_aligned_with_input(bank: CaseBank, rng) -> None:
    cases = make_cases(5)
    ids = bank.add(cases, unit_vectors(rng, 5, DIM))
    assert ids == [f"c{c.content_hash[:16]}" for c in cases]
    assert len(set(ids)) == 5
    assert len(bank) == 5
    for case_id, case in zip(ids, cases, strict=True):
        stored = bank.get(case_id)
        assert (stored.id, stored.state, stored.action, stored.reward, stored.env, stored.kind, stored.meta) == (
            case_id, case.state, case.action, case.reward, None, "case", {})
        assert isinstance(stored.created, float)


def test_add_keeps_meta_env_kind_created(bank: CaseBank, rng) -> None:
    case = Case(state="s", action="a", reward=0.25, env="web", kind="tip", meta={"é": [1, {"x": None}]}, created=5.0)
    [case_id] = bank.add([case], unit_vectors(rng, 1, DIM))
    assert bank.get(case_id) == Case(id=case_id, state="s", action="a", reward=0.25, env="web", kind="tip",
                                     meta={"é": [1, {"x": None}]}, created=5.0, updated=5.0)  # never updated


def test_add_single_vector_for_single_case(bank: CaseBank, rng) -> None:
    vec = unit_vectors(rng, 1, DIM)[0]
    [case_id] = bank.add(make_cases(1), vec)
    np.testing.assert_array_equal(bank.embeddings([case_id])[0], vec)


def test_add_nothing(bank: CaseBank) -> None:
    assert bank.add([], np.zeros((0, DIM), np.float32)) == []
    assert len(bank) == 0


def test_add_accepts_float64_and_stores_float32(bank: CaseBank, rng) -> None:
    emb = unit_vectors(rng, 3, DIM).astype(np.float64)
    ids = bank.add(make_cases(3), emb)
    got = bank.embeddings(ids)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, emb, atol=1e-7)


def test_duplicates_skipped(filled, rng) -> None:
    bank, ids, emb = filled
    again = make_cases(20)
    again = [Case(state=c.state, action=c.action, reward=0.5) for c in again]  # the reward is not content
    out = bank.add(again, unit_vectors(rng, 20, DIM))
    assert out == ids
    assert len(bank) == 20
    assert bank.get(ids[3]).reward == 1.0  # untouched
    np.testing.assert_array_equal(bank.embeddings(ids), emb)


def test_duplicate_mixed_with_new(filled, rng) -> None:
    bank, ids, _ = filled
    new = make_cases(2, prefix="new")
    out = bank.add([new[0], make_cases(1, start=4)[0], new[1]], unit_vectors(rng, 3, DIM))
    assert out[1] == ids[4]
    assert out[0] == f"c{new[0].content_hash[:16]}"
    assert out[2] == f"c{new[1].content_hash[:16]}"
    assert len(bank) == 22
    assert [c.id for c in bank.iter_cases()][-2:] == [out[0], out[2]]


def test_same_text_other_env_or_kind_is_not_duplicate(bank: CaseBank, rng) -> None:
    cases = [Case(state="s", action="a", reward=1.0), Case(state="s", action="a", reward=1.0, env="x"),
             Case(state="s", action="a", reward=1.0, kind="tip")]
    ids = bank.add(cases, unit_vectors(rng, 3, DIM))
    assert len(set(ids)) == 3
    assert len(bank) == 3


def test_allow_duplicates(filled, rng) -> None:
    bank, ids, _ = filled
    cases = make_cases(3)
    out = bank.add(cases, unit_vectors(rng, 3, DIM), allow_duplicates=True)
    assert out == [f"c{c.content_hash[:16]}-{20 + i}" for i, c in enumerate(cases)]
    assert len(bank) == 23
    assert not set(out) & set(ids)


def test_duplicate_within_one_call(bank: CaseBank, rng) -> None:
    a, b = make_cases(2)
    a_again = Case(state=a.state, action=a.action, reward=0.0)
    out = bank.add([a, b, a_again, b], unit_vectors(rng, 4, DIM))
    assert out[2] == out[0] and out[3] == out[1]
    assert out[0] != out[1]
    assert len(bank) == 2
    assert bank.get(out[0]).reward == a.reward  # the first occurrence wins


def test_duplicate_within_one_call_allowed(bank: CaseBank, rng) -> None:
    a = make_cases(1)[0]
    out = bank.add([a, a, a], unit_vectors(rng, 3, DIM), allow_duplicates=True)
    assert len(set(out)) == 3
    assert len(bank) == 3


def test_given_ids_kept(bank: CaseBank, rng) -> None:
    cases = [Case(id=f"my-{i}", state=f"s{i}", action="a", reward=1.0) for i in range(4)]
    out = bank.add(cases, unit_vectors(rng, 4, DIM))
    assert out == ["my-0", "my-1", "my-2", "my-3"]
    assert [c.id for c in bank.get(["my-2", "my-0"])] == ["my-2", "my-0"]


def test_id_collision_with_stored_case(filled, rng) -> None:
    bank, ids, _ = filled
    cases = [*make_cases(2, prefix="fresh"), Case(id=ids[5], state="other", action="x", reward=1.0)]
    with pytest.raises(DataFormatError) as info:
        bank.add(cases, unit_vectors(rng, 3, DIM))
    assert str(info.value) == f"case 2: id {ids[5]!r} is already used by another case"
    assert bank.get(ids[5]).state == "state 5"
    assert_count(bank, 20)


def test_id_collision_within_one_call(bank: CaseBank, rng) -> None:
    cases = [Case(id="x", state="one", action="a", reward=1.0), Case(id="x", state="two", action="a", reward=1.0)]
    with pytest.raises(DataFormatError, match="case 1: id 'x' is used twice in this call"):
        bank.add(cases, unit_vectors(rng, 2, DIM))
    assert_count(bank, 0)


def test_a_derived_id_already_taken_gives_the_new_case_an_id_of_its_own(bank: CaseBank, rng) -> None:
    """A case without an id whose derived id another case holds (given explicitly, or kept through an update that
    changed its content) is stored under an id of its own; the holder keeps its id. An explicit id that is taken
    is still refused."""
    later = Case(state="later", action="a", reward=1.0)
    taken = f"c{later.content_hash[:16]}"
    bank.add([Case(id=taken, state="first", action="a", reward=1.0)], unit_vectors(rng, 1, DIM))
    (new_id,) = bank.add([later], unit_vectors(rng, 1, DIM))
    assert new_id != taken and new_id.startswith(taken + "-")
    assert bank.get(taken).state == "first" and bank.get(new_id).state == "later"
    with pytest.raises(DataFormatError, match="already used by another case"):
        bank.add([Case(id=taken, state="third", action="a", reward=1.0)], unit_vectors(rng, 1, DIM))


def test_add_rejects_non_case(bank: CaseBank, rng) -> None:
    with pytest.raises(DataFormatError, match="item 1 is dict, expected memento.Case"):
        bank.add([make_cases(1)[0], {"state": "s"}], unit_vectors(rng, 2, DIM))  # type: ignore[list-item]
    assert_count(bank, 0)


# ---------------------------------------------------------------- add: bad embeddings


def test_wrong_embedding_width(filled, rng) -> None:
    bank, _, _ = filled
    with pytest.raises(DimensionError) as info:
        bank.add(make_cases(3, prefix="n"), unit_vectors(rng, 3, DIM + 1))
    message = str(info.value)
    assert f"(3, {DIM + 1})" in message and f"(3, {DIM})" in message
    assert_count(bank, 20)


def test_wrong_embedding_count(filled, rng) -> None:
    bank, _, _ = filled
    with pytest.raises(DimensionError) as info:
        bank.add(make_cases(3, prefix="n"), unit_vectors(rng, 2, DIM))
    assert f"(2, {DIM})" in str(info.value) and f"(3, {DIM})" in str(info.value)
    assert_count(bank, 20)


def test_embedding_with_nan_row(filled, rng) -> None:
    bank, _, _ = filled
    emb = unit_vectors(rng, 3, DIM)
    emb[1, 4] = np.nan
    with pytest.raises(DataFormatError, match="embedding row 1 contains NaN or inf"):
        bank.add(make_cases(3, prefix="n"), emb)
    assert_count(bank, 20)


def test_embedding_with_inf_row(filled, rng) -> None:
    bank, _, _ = filled
    emb = unit_vectors(rng, 3, DIM)
    emb[2, 0] = np.inf
    with pytest.raises(DataFormatError, match="embedding row 2 contains NaN or inf"):
        bank.add(make_cases(3, prefix="n"), emb)
    assert_count(bank, 20)


def test_embedding_not_unit_norm(filled, rng) -> None:
    bank, _, _ = filled
    emb = unit_vectors(rng, 3, DIM)
    emb[2] *= 2.0
    with pytest.raises(DataFormatError, match="embedding row 2 has norm 2.0000; bank vectors must be unit-norm"):
        bank.add(make_cases(3, prefix="n"), emb)
    assert_count(bank, 20)


def test_embedding_non_float_dtype(filled) -> None:
    bank, _, _ = filled
    emb = np.zeros((2, DIM), dtype=np.int64)
    emb[:, 0] = 1
    with pytest.raises(DataFormatError, match="embeddings must be floating point, got dtype int64"):
        bank.add(make_cases(2, prefix="n"), emb)
    assert_count(bank, 20)


# ---------------------------------------------------------------- get / embeddings


def test_get_single_and_list(filled) -> None:
    bank, ids, _ = filled
    assert bank.get(ids[7]).state == "state 7"
    order = [ids[9], ids[0], ids[9], ids[3]]
    assert [c.state for c in bank.get(order)] == ["state 9", "state 0", "state 9", "state 3"]
    assert bank.get([]) == []


def test_get_unknown_id(filled) -> None:
    bank, ids, _ = filled
    with pytest.raises(UnknownCaseError) as info:
        bank.get([ids[0], "nope"])
    assert str(info.value) == f"{bank.path}: unknown case id 'nope'"
    assert isinstance(info.value, KeyError) and isinstance(info.value, BankError)
    with pytest.raises(UnknownCaseError):
        bank.get("nope")


def test_embeddings_equal_what_was_added(filled) -> None:
    bank, ids, emb = filled
    np.testing.assert_array_equal(bank.embeddings(ids), emb)
    np.testing.assert_array_equal(bank.embeddings([ids[5], ids[1]]), emb[[5, 1]])
    assert bank.embeddings([]).shape == (0, DIM)
    with pytest.raises(UnknownCaseError, match=r"unknown case id 'x' \(and 1 more\)"):
        bank.embeddings(["x", ids[0], "y"])


def test_embeddings_are_copies(filled) -> None:
    bank, ids, emb = filled
    got = bank.embeddings(ids[:1])
    got[:] = 0
    np.testing.assert_array_equal(bank.embeddings(ids[:1]), emb[:1])


def test_ids_at(filled) -> None:
    bank, ids, _ = filled
    assert bank.ids_at([3, 0]) == [ids[3], ids[0]]
    assert bank.ids_at(np.array([19])) == [ids[19]]


# ---------------------------------------------------------------- search


def test_search_single_query_finds_itself(filled) -> None:
    bank, ids, emb = filled
    scores, found = bank.search(emb[4], 5)
    assert scores.shape == (5,) and found.shape == (5,)
    assert found.dtype == object
    assert found[0] == ids[4]
    assert scores[0] == pytest.approx(1.0, abs=1e-5)
    assert np.all(np.diff(scores) <= 1e-7)
    expected_scores, expected_pos = brute_force(emb, emb[4], 5)
    np.testing.assert_allclose(scores, expected_scores, atol=1e-5)
    assert list(found) == [ids[p] for p in expected_pos]


def test_search_single_query_trimmed(filled) -> None:
    bank, ids, emb = filled
    scores, found = bank.search(emb[0], 50)
    assert scores.shape == (20,) and found.shape == (20,)
    assert set(found) == set(ids)
    assert np.isfinite(scores).all()


def test_search_batch_padded(filled, rng) -> None:
    bank, ids, emb = filled
    queries = unit_vectors(rng, 3, DIM)
    scores, found = bank.search(queries, 25)
    assert scores.shape == (3, 25) and found.shape == (3, 25)
    assert scores.dtype == np.float32
    for b in range(3):
        assert np.isneginf(scores[b, 20:]).all()
        assert list(found[b, 20:]) == [None] * 5
        expected_scores, expected_pos = brute_force(emb, queries[b], 20)
        np.testing.assert_allclose(scores[b, :20], expected_scores, atol=1e-5)
        assert list(found[b, :20]) == [ids[p] for p in expected_pos]


def test_search_normalises_query(filled) -> None:
    bank, ids, emb = filled
    s1, i1 = bank.search(emb[2], 3)
    s2, i2 = bank.search(emb[2].astype(np.float64) * 7.5, 3)
    np.testing.assert_allclose(s1, s2, atol=1e-6)
    assert list(i1) == list(i2)


def test_search_positions(filled) -> None:
    bank, ids, emb = filled
    scores, positions = bank.search_positions(emb[[1, 2]], 22)
    assert positions.dtype == np.int64
    assert positions[:, 0].tolist() == [1, 2]
    assert (positions[:, 20:] == -1).all()
    assert np.isneginf(scores[:, 20:]).all()


def test_search_k_as_numpy_integer(filled) -> None:
    bank, ids, emb = filled
    _, found = bank.search(emb[0], np.int64(2))
    assert len(found) == 2


def _env_bank(bank: CaseBank, rng) -> tuple[list[str], list[str], np.ndarray]:
    cases = make_cases(10, prefix="a", env="web") + make_cases(10, prefix="b", env="math") + \
        make_cases(5, prefix="t", env="web", kind="tip")
    emb = unit_vectors(rng, 25, DIM)
    ids = bank.add(cases, emb)
    return ids, [c.env for c in cases], emb


def test_env_filter(bank: CaseBank, rng) -> None:
    ids, envs, emb = _env_bank(bank, rng)
    web = {i for i, e in zip(ids, envs, strict=True) if e == "web"}
    scores, found = bank.search(emb[12], 40, env="web")
    assert set(found) == web
    assert len(found) == 15
    positions = [ids.index(i) for i in found]
    np.testing.assert_allclose(scores, emb[positions] @ emb[12], atol=1e-5)
    assert np.all(np.diff(scores) <= 1e-6)
    _, top = bank.search(emb[12], 1, env="math")
    assert top.tolist() == [ids[12]]


def test_kind_filter_and_combined(bank: CaseBank, rng) -> None:
    ids, _, emb = _env_bank(bank, rng)
    _, found = bank.search(emb[0], 40, kind="tip")
    assert set(found) == set(ids[20:])
    _, found = bank.search(emb[0], 40, env="math", kind="tip")
    assert len(found) == 0
    _, found = bank.search(emb[0], 40, env="web", kind="case")
    assert set(found) == set(ids[:10])


def test_filter_with_no_match(bank: CaseBank, rng) -> None:
    _, _, emb = _env_bank(bank, rng)
    scores, found = bank.search(emb[0], 3, env="nowhere")
    assert scores.shape == (0,) and found.shape == (0,)
    scores, found = bank.search(emb[:2], 3, env="nowhere")
    assert np.isneginf(scores).all() and found.tolist() == [[None] * 3] * 2


def test_filter_after_more_adds(bank: CaseBank, rng) -> None:
    ids, _, emb = _env_bank(bank, rng)
    extra = unit_vectors(rng, 3, DIM)
    new_ids = bank.add(make_cases(3, prefix="z", env="math"), extra)
    _, found = bank.search(extra[1], 1, env="math")
    assert found.tolist() == [new_ids[1]]
    _, found = bank.search(extra[1], 30, env="math")
    assert set(found) == set(ids[10:20]) | set(new_ids)


def test_candidates(filled) -> None:
    bank, ids, emb = filled
    cand = bank.candidates(emb[6], 4)
    assert isinstance(cand, Candidates)
    assert len(cand) == 4
    assert cand.ids[0] == ids[6]
    assert cand.positions_C.tolist() == [ids.index(i) for i in cand.ids]
    np.testing.assert_array_equal(cand.embeddings_CD, bank.embeddings(cand.ids))
    np.testing.assert_allclose(cand.scores_C, cand.embeddings_CD @ emb[6], atol=1e-5)
    assert len(bank.candidates(emb[6], 100)) == 20
    assert len(bank.candidates(emb[6][None, :], 3)) == 3


def test_candidates_rejects_batch(filled) -> None:
    bank, _, emb = filled
    with pytest.raises(DimensionError, match="candidates takes one state"):
        bank.candidates(emb[:2], 3)


def test_candidates_with_filter(bank: CaseBank, rng) -> None:
    ids, _, emb = _env_bank(bank, rng)
    cand = bank.candidates(emb[0], 50, env="math")
    assert set(cand.ids) == set(ids[10:20])


# ---------------------------------------------------------------- search: bad queries


def test_query_wrong_dim(filled, rng) -> None:
    bank, _, _ = filled
    with pytest.raises(DimensionError) as info:
        bank.search(unit_vectors(rng, 1, DIM + 2)[0], 3)
    assert f"({DIM + 2},)" in str(info.value) and f"({DIM},)" in str(info.value)
    with pytest.raises(DimensionError):
        bank.search(np.ones((2, 3, DIM), np.float32), 3)
    assert_count(bank, 20)


def test_query_nan(filled, rng) -> None:
    bank, _, emb = filled
    q = emb[0].copy()
    q[3] = np.nan
    with pytest.raises(DataFormatError, match="query contains NaN or inf"):
        bank.search(q, 3)
    assert_count(bank, 20)


def test_query_zero(filled) -> None:
    bank, _, _ = filled
    with pytest.raises(DataFormatError, match="query has zero norm"):
        bank.search(np.zeros(DIM, np.float32), 3)
    assert_count(bank, 20)


def test_query_integer_dtype(filled) -> None:
    bank, _, _ = filled
    with pytest.raises(DataFormatError, match="query must be floating point"):
        bank.search(np.ones(DIM, dtype=np.int32), 3)
    assert_count(bank, 20)


@pytest.mark.parametrize("k", [0, -1, True, 2.0])
def test_bad_k(filled, k) -> None:
    bank, _, emb = filled
    with pytest.raises(DataFormatError, match="k must be a positive integer"):
        bank.search(emb[0], k)
    assert_count(bank, 20)


# ---------------------------------------------------------------- update_reward / iter / export / stats


def test_update_reward(filled, bank_path: Path) -> None:
    bank, ids, _ = filled
    bank.update_reward(ids[2], 0.75)
    assert bank.get(ids[2]).reward == 0.75
    bank.update_reward(ids[2], 1)
    assert bank.get(ids[2]).reward == 1.0
    bank.update_reward(ids[2], 0)
    assert bank.get(ids[2]).reward == 0.0
    bank.close()
    with CaseBank.open(bank_path) as again:
        assert again.get(ids[2]).reward == 0.0
        assert again.get(ids[3]).reward == 1.0


def test_update_reward_unknown_id(filled) -> None:
    bank, _, _ = filled
    with pytest.raises(UnknownCaseError, match="unknown case id 'ghost'"):
        bank.update_reward("ghost", 1.0)


@pytest.mark.parametrize("reward", [float("nan"), float("inf"), True, "1", -1, 1.0000001, 3, 1e308, -1e308, 10 ** 400])
def test_update_reward_bad_value(filled, reward) -> None:
    bank, ids, _ = filled
    with pytest.raises(DataFormatError, match=r"reward must be (a number in \[0, 1\]|finite)"):
        bank.update_reward(ids[0], reward)
    assert bank.get(ids[0]).reward == 0.0


def test_iter_cases_order(bank: CaseBank, rng) -> None:
    first = bank.add(make_cases(4, prefix="x"), unit_vectors(rng, 4, DIM))
    second = bank.add(make_cases(3, prefix="y"), unit_vectors(rng, 3, DIM))
    assert [c.id for c in bank.iter_cases()] == first + second
    assert [c.id for c in bank.iter_cases(batch_size=3)] == first + second
    assert [c.state for c in bank.iter_cases(batch_size=1)][:2] == ["x 0", "x 1"]


def test_export_import_round_trip(bank: CaseBank, rng, tmp_path: Path) -> None:
    cases = [Case(id="given", state="s0", action="a0", reward=1.0, env="web", kind="tip", meta={"k": "é"}),
             *make_cases(5)]
    emb = unit_vectors(rng, 6, DIM)
    ids = bank.add(cases, emb)
    out = tmp_path / "out" / "cases.jsonl"
    assert bank.export_jsonl(out) == 6
    assert sorted(p.name for p in out.parent.iterdir()) == ["cases.jsonl"]
    read = read_cases_jsonl(out)
    stored = list(bank.iter_cases())
    assert [c.id for c in read] == ids
    assert read == [Case(id=c.id, state=c.state, action=c.action, reward=c.reward, env=c.env, kind=c.kind,
                         meta=c.meta) for c in stored]
    with CaseBank.create(tmp_path / "copy", DIM) as copy:
        assert copy.add(read, bank.embeddings(ids)) == ids
        np.testing.assert_array_equal(copy.embeddings(ids), emb)
        assert [c.to_json() for c in copy.iter_cases()] == [c.to_json() for c in stored]


def test_import_jsonl_with_a_fake_encoder(bank: CaseBank, tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join(json.dumps({"state": f"s{i}", "action": "a", "reward": 1}) for i in range(6)) + "\n",
                    encoding="utf-8")
    enc = FakeEncoder()
    ids = bank.import_jsonl(path, enc)
    assert len(ids) == 6 and len(bank) == 6
    np.testing.assert_allclose(bank.embeddings(ids), enc.encode([f"s{i}" for i in range(6)]), atol=1e-7)
    assert bank.import_jsonl(path, enc) == ids  # duplicates
    assert len(bank) == 6


def test_import_jsonl_bad_line_writes_nothing(filled, tmp_path: Path) -> None:
    bank, _, _ = filled
    path = tmp_path / "c.jsonl"
    path.write_text('{"state": "s", "action": "a", "reward": 1}\n{"state": "s2"}\n', encoding="utf-8")
    with pytest.raises(DataFormatError) as info:
        bank.import_jsonl(path, FakeEncoder())
    assert str(info.value) == f"{path}:2: missing field 'action'"
    assert_count(bank, 20)


def test_import_jsonl_dim_mismatch(filled, tmp_path: Path) -> None:
    bank, _, _ = filled
    path = tmp_path / "c.jsonl"
    path.write_text('{"state": "s", "action": "a", "reward": 1}\n', encoding="utf-8")
    with pytest.raises(DimensionError) as info:
        bank.import_jsonl(path, FakeEncoder(dim=DIM * 2))
    assert f"dim={DIM * 2}" in str(info.value) and f"dim={DIM}" in str(info.value)
    assert_count(bank, 20)


def test_stats(bank: CaseBank, rng) -> None:
    bank.add(make_cases(3, env="web") + make_cases(2, prefix="t", kind="tip"), unit_vectors(rng, 5, DIM))
    bank.flush()
    stats = bank.stats()
    assert stats["path"] == str(bank.path)
    assert stats["cases"] == 5
    assert stats["dim"] == DIM
    assert stats["index"] == "Flat"
    assert stats["index_trained"] is True
    assert stats["index_ntotal"] == 5
    assert stats["reward_mean"] == pytest.approx((0 + 1 + 0 + 0 + 1) / 5)
    assert stats["reward_positive"] == 2
    assert stats["by_kind"] == {"case": 3, "tip": 2}
    assert stats["by_env"] == {None: 2, "web": 3}
    assert stats["encoder"] is None
    assert {"cases.sqlite", "index.faiss", "index.json"} <= set(stats["files"])
    assert stats["files"]["index.faiss"] > 0


def test_stats_empty_and_with_encoder(tmp_path: Path) -> None:
    with CaseBank.create(tmp_path / "b", 4, encoder=EncoderConfig(pooling="cls")) as b:
        stats = b.stats()
        assert (stats["cases"], stats["reward_mean"], stats["reward_positive"]) == (0, None, 0)
        assert stats["by_kind"] == {} and stats["by_env"] == {}
        assert stats["encoder"]["pooling"] == "cls"


# ---------------------------------------------------------------- close


def test_close_twice_and_context_manager(bank_path: Path, rng) -> None:
    with CaseBank.create(bank_path, DIM) as b:
        b.add(make_cases(2), unit_vectors(rng, 2, DIM))
    b.close()
    b.close()
    assert len(b) == 2
    assert (bank_path / "index.faiss").is_file()
    info = json.loads((bank_path / "index.json").read_text())
    assert info == {"uid": b.uid, "factory": "Flat", "dim": DIM, "ntotal": 2}


@pytest.mark.parametrize(
    "operation",
    [
        lambda b, e: b.add(make_cases(1, prefix="late"), e[:1]),
        lambda b, e: b.get("x"),
        lambda b, e: b.embeddings([]),
        lambda b, e: b.search(e[0], 1),
        lambda b, e: b.search_positions(e[0], 1),
        lambda b, e: b.candidates(e[0], 1),
        lambda b, e: b.update_reward("x", 1.0),
        lambda b, e: list(b.iter_cases()),
        lambda b, e: b.stats(),
        lambda b, e: b.flush(),
        lambda b, e: b.export_jsonl(b.path / "x.jsonl"),
    ],
    ids=["add", "get", "embeddings", "search", "search_positions", "candidates", "update_reward", "iter_cases",
         "stats", "flush", "export_jsonl"],
)
def test_closed_bank_raises(filled, operation) -> None:
    bank, _, emb = filled
    bank.close()
    with pytest.raises(BankError, match="bank is closed"):
        operation(bank, emb)


def test_closed_bank_ids_at_raises(bank_path: Path, rng) -> None:
    with CaseBank.create(bank_path, DIM) as b:
        b.add(make_cases(2), unit_vectors(rng, 2, DIM))
    b = CaseBank.open(bank_path)
    b.close()
    with pytest.raises(BankError):
        b.ids_at([0])


# ---------------------------------------------------------------- crash recovery


def test_missing_index_file_rebuilt(filled, bank_path: Path, caplog) -> None:
    bank, ids, emb = filled
    bank.close()
    (bank_path / "index.faiss").unlink()
    with caplog.at_level("WARNING", logger="memento.bank.local"), CaseBank.open(bank_path) as again:
        assert "rebuilding from 20 cases" in caplog.text
        assert again.stats()["index_ntotal"] == 20
        _, found = again.search(emb[11], 1)
        assert found.tolist() == [ids[11]]
    assert (bank_path / "index.faiss").is_file()


def test_garbage_index_file_rebuilt(filled, bank_path: Path) -> None:
    bank, ids, emb = filled
    bank.close()
    (bank_path / "index.faiss").write_bytes(b"\x00garbage" * 10)
    with CaseBank.open(bank_path) as again:
        _, found = again.search(emb[3], 1)
        assert found.tolist() == [ids[3]]
    with CaseBank.open(bank_path) as again:  # the rewritten file is good
        assert again.stats()["index_ntotal"] == 20


def test_crash_between_commit_and_index_write(bank_path: Path, rng, caplog) -> None:
    early_emb = unit_vectors(rng, 10, DIM)
    late_emb = unit_vectors(rng, 5, DIM)
    with CaseBank.create(bank_path, DIM) as b:
        early = b.add(make_cases(10), early_emb)
    b = CaseBank.open(bank_path)
    late = b.add(make_cases(5, prefix="late"), late_emb)
    assert len(b) == 15
    # crash: SQLite committed, the index file was never rewritten
    b._rows.conn.close()
    b._closed = True
    assert json.loads((bank_path / "index.json").read_text())["ntotal"] == 10
    with caplog.at_level("WARNING", logger="memento.bank.local"), CaseBank.open(bank_path) as again:
        assert "index is 5 case(s) behind SQLite; adding them" in caplog.text  # caught up, not rebuilt
        assert "rebuilding" not in caplog.text
        assert len(again) == 15
        assert again.stats()["index_ntotal"] == 15
        for j, case_id in enumerate(late):
            scores, found = again.search(late_emb[j], 1)
            assert found.tolist() == [case_id]
            assert scores[0] == pytest.approx(1.0, abs=1e-5)
        _, found = again.search(early_emb[0], 1)
        assert found.tolist() == [early[0]]
    assert json.loads((bank_path / "index.json").read_text())["ntotal"] == 15


def test_index_from_another_bank_rebuilt(tmp_path: Path, rng, caplog) -> None:
    mine_emb = unit_vectors(rng, 8, DIM)
    other_emb = unit_vectors(rng, 5, DIM)
    with CaseBank.create(tmp_path / "mine", DIM) as mine:
        mine_ids = mine.add(make_cases(8), mine_emb)
        uid = mine.uid
    with CaseBank.create(tmp_path / "other", DIM) as other:
        other.add(make_cases(5, prefix="other"), other_emb)
    for name in ("index.faiss", "index.json"):
        shutil.copy(tmp_path / "other" / name, tmp_path / "mine" / name)
    with caplog.at_level("WARNING", logger="memento.bank.local"), CaseBank.open(tmp_path / "mine") as again:
        assert "index missing or stale; rebuilding from 8 cases" in caplog.text
        assert again.stats()["index_ntotal"] == 8
        for j in range(8):
            _, found = again.search(mine_emb[j], 1)
            assert found.tolist() == [mine_ids[j]]
    info = json.loads((tmp_path / "mine" / "index.json").read_text())
    assert info["uid"] == uid and info["ntotal"] == 8


def test_index_with_more_rows_than_sqlite_rebuilt(filled, bank_path: Path, tmp_path: Path, rng) -> None:
    bank, ids, emb = filled
    bank.close()
    import faiss

    big = faiss.index_factory(DIM, "Flat", faiss.METRIC_INNER_PRODUCT)
    big.add(unit_vectors(rng, 30, DIM))
    faiss.write_index(big, str(bank_path / "index.faiss"))
    info = json.loads((bank_path / "index.json").read_text())
    (bank_path / "index.json").write_text(json.dumps({**info, "ntotal": 30}))
    with CaseBank.open(bank_path) as again:
        assert again.stats()["index_ntotal"] == 20
        _, found = again.search(emb[0], 1)
        assert found.tolist() == [ids[0]]


# ---------------------------------------------------------------- other index types


def test_ivf_untrained_is_exact_then_trains(bank_path: Path, rng) -> None:
    emb = unit_vectors(rng, 200, DIM)
    with CaseBank.create(bank_path, DIM, "IVF4,Flat") as b:
        ids = b.add(make_cases(50), emb[:50])
        assert b.stats()["index_trained"] is False
        assert b.stats()["index_ntotal"] == 0
        queries = unit_vectors(rng, 5, DIM)
        scores, found = b.search(queries, 7)
        for q in range(5):
            expected_scores, expected_pos = brute_force(emb[:50], queries[q], 7)
            np.testing.assert_allclose(scores[q], expected_scores, atol=1e-5)
            assert list(found[q]) == [ids[p] for p in expected_pos]
        _, top = b.search(emb[10], 1, env=None)
        assert top.tolist() == [ids[10]]

        ids += b.add(make_cases(150, start=50), emb[50:])
        assert 200 >= 39 * 4
        stats = b.stats()
        assert stats["index_trained"] is True and stats["index_ntotal"] == 200
        for j in (0, 77, 199):
            scores, found = b.search(emb[j], 1)
            assert found.tolist() == [ids[j]]
            assert scores[0] == pytest.approx(1.0, abs=1e-5)
        # nprobe (32) >= nlist (4): the trained index is still exact
        q = unit_vectors(rng, 1, DIM)[0]
        scores, found = b.search(q, 10)
        expected_scores, expected_pos = brute_force(emb, q, 10)
        np.testing.assert_allclose(scores, expected_scores, atol=1e-5)
        assert list(found) == [ids[p] for p in expected_pos]
    with CaseBank.open(bank_path) as again:
        assert again.stats()["index_trained"] is True
        _, found = again.search(emb[42], 1)
        assert found.tolist() == [ids[42]]


def test_ivf_untrained_bank_writes_no_index_file(bank_path: Path, rng) -> None:
    emb = unit_vectors(rng, 20, DIM)
    with CaseBank.create(bank_path, DIM, "IVF4,Flat") as b:
        ids = b.add(make_cases(20), emb)
    assert not (bank_path / "index.faiss").exists()
    with CaseBank.open(bank_path) as again:
        _, found = again.search(emb[5], 1)
        assert found.tolist() == [ids[5]]


def test_ivf_trained_with_filter(bank_path: Path, rng) -> None:
    emb = unit_vectors(rng, 200, DIM)
    cases = make_cases(100, env="web") + make_cases(100, prefix="m", env="math")
    with CaseBank.create(bank_path, DIM, "IVF4,Flat") as b:
        ids = b.add(cases, emb)
        assert b.stats()["index_trained"] is True
        _, found = b.search(emb[150], 200, env="math")
        assert set(found) == set(ids[100:])
        assert found[0] == ids[150]


def test_hnsw(bank_path: Path, rng) -> None:
    emb = unit_vectors(rng, 100, DIM)
    cases = make_cases(50, env="web") + make_cases(50, prefix="m", env="math")
    with CaseBank.create(bank_path, DIM, "HNSW32,Flat") as b:
        ids = b.add(cases, emb)
        assert b.stats()["index_ntotal"] == 100
        _, found = b.search(emb, 1)
        assert found[:, 0].tolist() == ids
        _, found = b.search(emb[60], 100, env="math")
        assert set(found) == set(ids[50:])
        assert found[0] == ids[60]
    with CaseBank.open(bank_path) as again:
        _, found = again.search(emb[3], 1)
        assert found.tolist() == [ids[3]]


def test_embeddings_at_positions(tmp_path, rng):
    vectors = unit_vectors(rng, 5, DIM)
    with CaseBank.create(tmp_path / "b", DIM) as bank:
        bank.add([Case(state=f"s{i}", action="a", reward=0.0) for i in range(5)], vectors)
        np.testing.assert_array_equal(bank.embeddings_at([3, 0]), vectors[[3, 0]])
        assert bank.embeddings_at([]).shape == (0, DIM)
        with pytest.raises(UnknownCaseError, match=r"positions must lie in \[0, 5\)"):
            bank.embeddings_at([5])


@pytest.mark.parametrize("factory", ["Flat", "HNSW16,Flat"])
def test_truncate_rolls_back_newest_cases(tmp_path, rng, factory):
    vectors = unit_vectors(rng, 12, DIM)
    path = tmp_path / "b"
    with CaseBank.create(path, DIM, index=factory) as bank:
        ids = bank.add([Case(state=f"s{i}", action="a", reward=0.0) for i in range(12)], vectors)
        assert bank.truncate(12) == 0
        assert bank.truncate(8) == 4
        assert len(bank) == 8
        with pytest.raises(UnknownCaseError):
            bank.get(ids[9])
        _, found = bank.search(vectors[10], 3)
        assert ids[10] not in list(found)
        # the same content can be added again after the rollback and gets the same id
        again = bank.add([Case(state="s9", action="a", reward=0.0)], vectors[9:10])
        assert again == [ids[9]] and len(bank) == 9
        with pytest.raises(DataFormatError, match="truncate: n must be an integer in"):
            bank.truncate(10)
    with CaseBank.open(path) as bank:
        assert len(bank) == 9 and bank.stats()["index_ntotal"] == 9
        _, found = bank.search(vectors[3], 1)
        assert list(found) == [ids[3]]


def test_candidates_subset_and_positive():
    import numpy as np

    from memento.bank import Candidates
    from memento.errors import DimensionError

    cands = Candidates(ids=["a", "b", "c"], positions_C=np.array([5, 1, 7]), scores_C=np.array([0.9, 0.8, 0.1]),
                       embeddings_CD=np.eye(3, dtype=np.float32))
    sub = cands.subset(np.array([True, False, True]))
    assert sub.ids == ["a", "c"] and sub.positions_C.tolist() == [5, 7] and sub.scores_C.tolist() == [0.9, 0.1]
    assert sub.embeddings_CD.tolist() == [[1, 0, 0], [0, 0, 1]]
    assert cands.positive(np.array([0.0, 1.0, 0.5])).ids == ["b", "c"]
    assert cands.positive(np.zeros(3)) is cands  # none rewarded: all of them
    assert cands.positive(np.ones(3)) is cands
    with pytest.raises(DimensionError, match=r"keep_C.shape=\(2,\) for 3 candidates"):
        cands.subset(np.array([True, False]))


def test_rewards_in_the_order_asked(filled) -> None:
    bank, ids, _ = filled
    rewards = bank.rewards([ids[3], ids[0], ids[3]])
    assert rewards.dtype == np.float64 and rewards.tolist() == [1.0, 0.0, 1.0]
    with pytest.raises(UnknownCaseError):
        bank.rewards(["nope"])


def test_a_stored_row_out_of_range_is_a_bank_error_naming_the_case(filled, bank_path: Path) -> None:
    bank, ids, _ = filled
    bank.close()
    conn = sqlite3.connect(bank_path / "cases.sqlite")
    with conn:
        conn.execute("UPDATE cases SET reward = 5.0 WHERE id = ?", (ids[1],))
    conn.close()
    with CaseBank.open(bank_path) as again:
        with pytest.raises(BankError, match=rf"case '{ids[1]}' in cases.sqlite is out of range: Case.reward must be"):
            again.get(ids[1])
        assert again.get(ids[0]).state  # the other rows read


def test_scores_a_few_last_places_apart_are_one_tie_in_position_order() -> None:
    """An index may score two equal vectors one unit in the last place apart (other SIMD lanes, another CPU):
    such runs are one tie, given the run's first score and ordered by position; real gaps and padding keep
    their order, and the vectors follow their rows."""
    from memento.bank.front import order_ties

    near = np.nextafter(np.float32(0.9697622), np.float32(1.0))
    scores_BK = np.array([[near, np.float32(0.9697622), np.float32(0.5), -np.inf],
                          [np.float32(0.8), np.float32(0.7), np.float32(0.7), -np.inf]], dtype=np.float32)
    labels_BK = np.array([[17, 15, 3, -1], [9, 8, 2, -1]], dtype=np.int64)
    vectors_BKD = labels_BK[..., None].astype(np.float32)
    scores, labels, vectors = order_ties(scores_BK, labels_BK, vectors_BKD)
    assert labels.tolist() == [[15, 17, 3, -1], [9, 2, 8, -1]]
    assert scores[0, 0] == scores[0, 1] == near and scores[0, 2] == np.float32(0.5) and scores[0, 3] == -np.inf
    assert vectors[..., 0].tolist() == labels.astype(np.float32).tolist()
