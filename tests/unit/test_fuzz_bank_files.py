"""Bank input files that trust nothing: malformed ``--embeddings`` files (``.safetensors`` and ``.npy``) and JSON
files nested or damaged inside a bank or a selector artifact, fed to the CLI in-process (``memento bank
import/search/stats/export``, ``memento verify``). Each is refused in one line on stderr with exit status 2 (or,
for a bank's derived files that the bank rebuilds, accepted), never a traceback; an import writes nothing.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from memento.bank import CaseBank, bulk
from memento.bank.bulk import check_embeddings, import_with_embeddings, read_embeddings
from memento.cli.entry import main
from memento.config import MAX_DIM
from memento.errors import CheckpointError, DataFormatError
from memento.io import load_json_file
from tests.conftest import unit_vectors

N, DIM = 6, 8
NESTED = b"[" * 100_000


def _cases(path: Path, n: int = N) -> Path:
    path.write_text("".join(json.dumps({"state": f"q{i}", "action": f"a{i}", "reward": 1.0}) + "\n"
                            for i in range(n)), encoding="utf-8")
    return path


def _st(header: Any, data: bytes = b"", *, length: int | None = None) -> bytes:
    """A safetensors file: ``header`` (an object, or raw bytes), its 8-byte length (``length`` to lie), ``data``."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw) if length is None else length) + raw + data


def _one(dtype: str = "F32", shape: Any = (N, DIM), offsets: Any = None, data: bytes | None = None,
         **extra: Any) -> bytes:
    size = {"F16": 2, "BF16": 2, "F32": 4, "F64": 8, "I32": 4, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1,
            "I64": 8}[dtype] * int(np.prod(shape))
    data = bytes(size) if data is None else data
    entry = {"dtype": dtype, "shape": list(shape), "data_offsets": [0, size] if offsets is None else offsets}
    return _st({"t": entry, **extra}, data)


_F32 = unit_vectors(np.random.default_rng(0), N, DIM).astype("<f4").tobytes()

SAFETENSORS: dict[str, bytes] = {
    "bf16": _one("BF16"),
    "f8_e4m3": _one("F8_E4M3"),
    "f8_e5m2": _one("F8_E5M2"),
    "header length 2**62": struct.pack("<Q", 2 ** 62) + b"{}",
    "header length past the end": _st({}, length=1000),
    "header length 0": struct.pack("<Q", 0),
    "empty file": b"",
    "five bytes": b"\x01\x02\x03\x04\x05",
    "header not json": _st(b"{not json"),
    "header not utf-8": _st(b'{"\xff": 1}'),
    "header a list": _st([1, 2]),
    "header a number": _st(3),
    "header deeply nested": _st(NESTED),
    "header nested in an entry": _st(b'{"t": ' + b"[" * 50_000 + b"}"),
    "huge integer in header": _st(b'{"t": {"dtype": "F32", "shape": [' + b"9" * 5000 + b', 8]}}'),
    "zero tensors": _st({"__metadata__": {"a": "b"}}),
    "empty header": _st({}),
    "two tensors": _st({"a": {"dtype": "F32", "shape": [N, DIM], "data_offsets": [0, N * DIM * 4]},
                        "b": {"dtype": "F32", "shape": [N, DIM], "data_offsets": [0, N * DIM * 4]}}, _F32),
    "entry not an object": _st({"t": [1, 2]}),
    "metadata not an object": _one(data=_F32, __metadata__=[1]),
    "missing data_offsets": _st({"t": {"dtype": "F32", "shape": [N, DIM]}}, _F32),
    "missing dtype": _st({"t": {"shape": [N, DIM], "data_offsets": [0, N * DIM * 4]}}, _F32),
    "missing shape": _st({"t": {"dtype": "F32", "data_offsets": [0, N * DIM * 4]}}, _F32),
    "negative offsets": _one(offsets=[-4, N * DIM * 4 - 4], data=_F32),
    "reversed offsets": _one(offsets=[N * DIM * 4, 0], data=_F32),
    "offsets of three": _one(offsets=[0, 1, 2], data=_F32),
    "bool offsets": _one(offsets=[False, True], data=_F32),
    "offsets past the end": _one(offsets=[0, N * DIM * 4 + 64], data=_F32),
    "data cut short": _one(data=_F32[:-4]),
    "trailing bytes": _one(data=_F32 + b"\x00" * 4),
    "begin not 0": _one(offsets=[4, N * DIM * 4 + 4], data=b"\x00" * 4 + _F32),
    "shape and offsets disagree": _one(shape=(N, DIM + 1), offsets=[0, N * DIM * 4], data=_F32),
    "negative shape": _st({"t": {"dtype": "F32", "shape": [-N, -DIM], "data_offsets": [0, N * DIM * 4]}}, _F32),
    "shape of strings": _st({"t": {"dtype": "F32", "shape": ["6", "8"], "data_offsets": [0, N * DIM * 4]}}, _F32),
    "huge shape": _st({"t": {"dtype": "F32", "shape": [2 ** 40, 2 ** 40], "data_offsets": [0, N * DIM * 4]}},
                      _F32),
    "1-D": _one(shape=(N * DIM,), data=_F32),
    "3-D": _one(shape=(N, 2, DIM // 2), data=_F32),
    "0-D": _one(shape=(), data=b"\x00" * 4),
    "I32": _one("I32"),
    "I64": _one("I64"),
    "U8": _one("U8"),
    "BOOL": _one("BOOL"),
    "unknown dtype": _st({"t": {"dtype": "Q7", "shape": [N, DIM], "data_offsets": [0, N * DIM * 4]}}, _F32),
    "dim 0": _one(shape=(N, 0)),
    "wider than MAX_DIM": _one("F16", shape=(1, MAX_DIM + 1)),
}


def _npy_bytes(array: np.ndarray, **kwargs: Any) -> bytes:
    import io

    out = io.BytesIO()
    np.save(out, array, **kwargs)
    return out.getvalue()


def _npy_header(header: bytes) -> bytes:
    body = header + b" " * (-(10 + len(header) + 1) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(body)) + body


_GOOD_NPY = _npy_bytes(unit_vectors(np.random.default_rng(1), N, DIM))
_NAN_WIDE = np.full((1, MAX_DIM + 1), np.nan, dtype=np.float16)

NPY: dict[str, bytes] = {
    "header claims more data": _GOOD_NPY[:-16],
    "header claims far more data": _npy_header(b"{'descr': '<f4', 'fortran_order': False, 'shape': (10**12, 8), }"),
    "object dtype": _npy_bytes(np.array([{"a": 1}], dtype=object), allow_pickle=True),
    "fortran order": _npy_bytes(np.asfortranarray(unit_vectors(np.random.default_rng(2), N, DIM))),
    "structured dtype": _npy_bytes(np.zeros((N,), dtype=[("a", "<f4"), ("b", "<f4")])),
    "int dtype": _npy_bytes(np.zeros((N, DIM), dtype=np.int32)),
    "complex dtype": _npy_bytes(np.zeros((N, DIM), dtype=np.complex64)),
    "1-D": _npy_bytes(np.zeros(N, dtype=np.float32)),
    "3-D": _npy_bytes(np.zeros((N, 2, 4), dtype=np.float32)),
    "dim 0": _npy_bytes(np.zeros((N, 0), dtype=np.float32)),
    "wider than MAX_DIM (rows never read)": _npy_bytes(_NAN_WIDE),
    "bad magic": b"NOTNUMPY" + _GOOD_NPY[8:],
    "empty": b"",
    "magic only": _GOOD_NPY[:8],
    "header not a dict": _npy_header(b"[1, 2, 3]"),
    "header garbage": _npy_header(b"{'descr': <f4 ...)"),
    "header deeply nested": _npy_header(b"(" * 3000),
    "header negative shape": _npy_header(b"{'descr': '<f4', 'fortran_order': False, 'shape': (-6, 8), }"),
    "header unknown descr": _npy_header(b"{'descr': 'zz9', 'fortran_order': False, 'shape': (6, 8), }"),
    "header huge shape": _npy_header(b"{'descr': '<f4', 'fortran_order': False, 'shape': (2**70, 2**70), }"),
}


def _one_line_error(capsys: pytest.CaptureFixture[str], *must: str) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("memento: error:")]
    assert len(lines) == 1, err
    for text in must:
        assert text in lines[0], lines[0]
    return lines[0]


def _run(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as stop:  # argparse
        return int(stop.code or 0)


@pytest.mark.parametrize("suffix, name", [(".safetensors", name) for name in sorted(SAFETENSORS)]
                         + [(".npy", name) for name in sorted(NPY)])
def test_malformed_embeddings_files_are_one_line(tmp_path: Path, suffix: str, name: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / f"vecs{suffix}"
    bad.write_bytes((SAFETENSORS if suffix == ".safetensors" else NPY)[name])
    with pytest.raises(DataFormatError) as raised:
        read_embeddings(bad)
    assert str(bad) in str(raised.value) and "\n" not in str(raised.value)
    assert _run(["bank", "import", str(_cases(tmp_path / "cases.jsonl")), "--embeddings", str(bad),
                 "--bank", str(tmp_path / "bank")]) == 2
    _one_line_error(capsys, str(bad))
    assert not (tmp_path / "bank").exists()


def test_bf16_says_to_convert_and_wide_vectors_name_max_dim(tmp_path: Path) -> None:
    path = tmp_path / "v.safetensors"
    path.write_bytes(SAFETENSORS["bf16"])
    with pytest.raises(DataFormatError, match="convert it to float32 or float16"):
        read_embeddings(path)
    path = tmp_path / "wide.npy"
    path.write_bytes(NPY["wider than MAX_DIM (rows never read)"])
    with pytest.raises(DataFormatError, match=f"dim {MAX_DIM + 1}; a bank holds vectors of dim 1..{MAX_DIM}"):
        read_embeddings(path)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_safetensors_are_memory_mapped_read_only_without_the_library_loader(
        tmp_path: Path, dtype: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import safetensors.numpy
    from safetensors.numpy import save_file

    vectors = unit_vectors(np.random.default_rng(3), N, DIM).astype(dtype)
    path = tmp_path / "vecs.safetensors"
    save_file({"embeddings": vectors}, str(path), metadata={"source": "test"})

    def whole_file(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("safetensors.numpy.load_file reads the whole file into memory")

    monkeypatch.setattr(safetensors.numpy, "load_file", whole_file)
    read = read_embeddings(path)
    assert isinstance(read, np.memmap) and not read.flags.writeable
    assert read.shape == (N, DIM) and read.dtype == dtype
    np.testing.assert_array_equal(read, vectors)
    assert _run(["bank", "import", str(_cases(tmp_path / "cases.jsonl")), "--embeddings", str(path),
                 "--bank", str(tmp_path / "bank")]) == 0
    assert f"imported {N} case(s)" in capsys.readouterr().out


class _Recorded:
    """An ``[N, D]`` array that records how many rows each slice asks for."""

    def __init__(self, array: np.ndarray):
        self.array, self.shape, self.dtype, self.asked = array, array.shape, array.dtype, []

    def __len__(self) -> int:
        return len(self.array)

    def __getitem__(self, key: slice) -> np.ndarray:
        start, stop, _ = key.indices(2 ** 62)
        self.asked.append(stop - start)
        return self.array[key]


def test_the_row_check_reads_a_bounded_number_of_bytes_at_any_width() -> None:
    dim = MAX_DIM  # 65,536 float16: the old 65,536-row chunk asked for 16 GiB of float32 at once
    vectors = np.zeros((3, dim), dtype=np.float16)
    vectors[:, 0] = 1.0
    recorded = _Recorded(vectors)
    check_embeddings(recorded, 3, dim, "wide")  # type: ignore[arg-type]
    assert recorded.asked and max(recorded.asked) * dim * 4 <= 64 << 20, recorded.asked
    narrow = _Recorded(unit_vectors(np.random.default_rng(4), 10, 4))
    check_embeddings(narrow, 10, 4, "narrow")  # type: ignore[arg-type]
    assert narrow.asked == [(64 << 20) // 16]  # at most 64 MiB of rows, here all of them at once


def test_an_import_adds_a_bounded_number_of_bytes_per_transaction(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from memento.formats import read_cases_jsonl

    monkeypatch.setattr(bulk, "_ADD_BYTES", 4 * DIM * 4)  # four float32 rows of DIM
    sizes: list[int] = []
    add = CaseBank.add

    def recording(self: CaseBank, cases: Any, vectors: np.ndarray, **kwargs: Any) -> Any:
        sizes.append(len(vectors))
        return add(self, cases, vectors, **kwargs)

    monkeypatch.setattr(CaseBank, "add", recording)
    vectors = unit_vectors(np.random.default_rng(5), 10, DIM)
    with CaseBank.create(tmp_path / "bank", DIM) as bank:
        assert import_with_embeddings(bank, read_cases_jsonl(_cases(tmp_path / "c.jsonl", 10)), vectors,
                                      chunk=1000) == 10
    assert sizes == [4, 4, 2]


# ---------------------------------------------------------------- JSON files inside a bank or an artifact


def test_load_json_file_turns_every_failure_into_one_line(tmp_path: Path) -> None:
    cases = {"nested": NESTED, "nested object": b'{"a": ' * 50_000, "not utf-8": b'{"\xff": 1}',
             "not json": b"{", "huge integer": b"1" * 5000, "empty": b""}
    for name, data in cases.items():
        path = tmp_path / f"{name}.json"
        path.write_bytes(data)
        with pytest.raises(DataFormatError) as raised:
            load_json_file(path, "test file")
        assert str(path) in str(raised.value) and "\n" not in str(raised.value), name
        assert isinstance(raised.value, ValueError)  # callers' `except (OSError, ValueError)` still hold
    with pytest.raises(DataFormatError, match="test file not found"):
        load_json_file(tmp_path / "missing.json", "test file")
    with pytest.raises(CheckpointError):
        load_json_file(tmp_path / "nested.json", error=CheckpointError)


@pytest.fixture(scope="module")
def disk_bank(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("disk_bank")
    from memento.formats import read_cases_jsonl

    with CaseBank.create(root / "bank", DIM, vectors="disk") as bank:
        bank.add(read_cases_jsonl(_cases(root / "cases.jsonl")), unit_vectors(np.random.default_rng(6), N, DIM))
    return root / "bank"


_BANK_COMMANDS: dict[str, Callable[[Path, Path], list[str]]] = {
    "stats": lambda bank, tmp: ["bank", "stats", "--bank", str(bank)],
    "search": lambda bank, tmp: ["bank", "search", "capital", "--bank", str(bank)],
    "export": lambda bank, tmp: ["bank", "export", str(tmp / "out.jsonl"), "--bank", str(bank)],
    "import": lambda bank, tmp: ["bank", "import", str(_cases(tmp / "more.jsonl", 2)), "--embeddings",
                                 str(_npy(tmp / "more.npy", 2)), "--bank", str(bank)],
}


def _npy(path: Path, n: int) -> Path:
    np.save(path, unit_vectors(np.random.default_rng(7), n, DIM))
    return path


@pytest.mark.parametrize("command", sorted(_BANK_COMMANDS))
@pytest.mark.parametrize("name, data", [
    ("index.json", b"{not json"),
    ("vectors.json", b"\xff\xfe"),
    ("index.json", NESTED),  # the bank catches RecursionError (a RuntimeError) there, and rebuilds its index
    ("vectors.json", NESTED),  # names the bank the store belongs to: rewritten from cases.sqlite
])
def test_a_bank_file_that_does_not_parse_is_rebuilt_or_one_line(disk_bank: Path, tmp_path: Path, command: str,
                                                                 name: str, data: bytes,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    bank = Path(shutil.copytree(disk_bank, tmp_path / "bank"))
    (bank / name).write_bytes(data)
    code = _run(_BANK_COMMANDS[command](bank, tmp_path))
    assert code in (0, 2)
    if code == 2:
        _one_line_error(capsys)
    else:
        assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("command", sorted(_BANK_COMMANDS))
def test_a_bank_config_nested_too_deeply_is_one_line(disk_bank: Path, tmp_path: Path, command: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    bank = Path(shutil.copytree(disk_bank, tmp_path / "bank"))
    with sqlite3.connect(bank / "cases.sqlite") as conn:
        conn.execute("UPDATE meta SET value = ? WHERE key = 'config'", (NESTED.decode(),))
    conn.close()
    assert _run(_BANK_COMMANDS[command](bank, tmp_path)) == 2
    _one_line_error(capsys, str(bank))


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.unit.test_artifact_security import build_artifact

    return build_artifact(tmp_path_factory.mktemp("artifact"))


def _bank_config(art: Path, value: bytes) -> None:
    with sqlite3.connect(art / "bank" / "cases.sqlite") as conn:
        conn.execute("UPDATE meta SET value = ? WHERE key = 'config'", (value.decode(),))
    conn.close()


_ARTIFACT_EDITS: dict[str, Callable[[Path], None]] = {
    "nested bank/index.json": lambda art: (art / "bank" / "index.json").write_bytes(NESTED),
    "unparseable bank/index.json": lambda art: (art / "bank" / "index.json").write_bytes(b"{not json"),
    "bank/index.json a list": lambda art: (art / "bank" / "index.json").write_bytes(b"[]"),
    "nested bank/vectors.json": lambda art: (art / "bank" / "vectors.json").write_bytes(NESTED),
    "not utf-8 bank/vectors.json": lambda art: (art / "bank" / "vectors.json").write_bytes(b"\xff"),
    "nested bank config": lambda art: _bank_config(art, NESTED),
    "nested config.json": lambda art: (art / "config.json").write_bytes(NESTED),
    "nested encoder.json": lambda art: (art / "encoder.json").write_bytes(NESTED),
    "nested learner/config.json": lambda art: (art / "learner" / "config.json").write_bytes(NESTED),
    "nested manifest.json": lambda art: (art / "manifest.json").write_bytes(NESTED),
}


@pytest.mark.parametrize("name", sorted(_ARTIFACT_EDITS))
def test_verify_reports_a_nested_or_unparseable_json_file(artifact: Path, tmp_path: Path, name: str,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    from memento.selector.export import verify
    from tests.unit.test_artifact_security import rehash

    art = Path(shutil.copytree(artifact, tmp_path / "art"))
    _ARTIFACT_EDITS[name](art)
    if name != "nested manifest.json":
        rehash(art)  # re-signed: the checksums do not give it away
    assert _run(["verify", str(art)]) == 2
    _one_line_error(capsys, str(art))
    with pytest.raises(CheckpointError):
        verify(art)
