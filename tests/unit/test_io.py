"""Atomic writes keep the old file on failure and leave no temporary file behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from memento.io import atomic_write, atomic_write_text


def test_atomic_write_text_replaces(tmp_path):
    path = tmp_path / "sub" / "f.json"
    atomic_write_text(path, "one")
    atomic_write_text(path, "two")
    assert path.read_text() == "two"
    assert sorted(p.name for p in path.parent.iterdir()) == ["f.json"]


def test_failed_write_keeps_old_file_and_cleans_up(tmp_path):
    path = tmp_path / "f.txt"
    path.write_text("old")

    def broken(tmp):
        tmp.write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        atomic_write(path, broken)
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.txt"]


def test_atomic_write_leaves_safetensors_files_readable_by_others(tmp_path):
    import torch
    from safetensors.torch import save_file

    from memento.io import atomic_write

    atomic_write(tmp_path / "x.safetensors", lambda tmp: save_file({"x": torch.zeros(2)}, str(tmp)))
    assert (tmp_path / "x.safetensors").stat().st_mode & 0o044 == 0o044


# ---------------------------------------------------------------- robust JSON parsing and finite numbers

_BAD_JSON = {
    "invalid": (b"{", "invalid JSON"),
    "digits": (b'{"a": ' + b"9" * 5000 + b"}", "Exceeds the limit"),
    "deep": (b"[" * 100_000 + b"]" * 100_000, "nested deeper than 100"),
    "deep-parsed": (b"[" * 150 + b"]" * 150, "nested deeper than 100"),
    "surrogate": (b'{"a": "x\\ud800"}', "lone surrogate"),
    "not-utf8": (b'{"\xff": 1}', "not UTF-8"),
    "empty": (b"", "invalid JSON"),
}


@pytest.mark.parametrize("name", sorted(_BAD_JSON))
def test_read_json_refuses_every_bad_document_in_one_line(tmp_path: Path, name: str) -> None:
    from memento.errors import ConfigError
    from memento.io import read_json

    content, expected = _BAD_JSON[name]
    path = tmp_path / "x.json"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as caught:
        read_json(path, error=ConfigError)
    message = str(caught.value)
    assert message.startswith(str(path)) and expected in message and "\n" not in message and len(message) < 400


def test_read_json_names_missing_files_and_directories(tmp_path: Path) -> None:
    from memento.errors import CheckpointError
    from memento.io import read_json

    with pytest.raises(CheckpointError, match="not found"):
        read_json(tmp_path / "absent.json")
    with pytest.raises(CheckpointError, match="is a directory"):
        read_json(tmp_path)
    (tmp_path / "bom.json").write_bytes(b"\xef\xbb\xbf[1]")
    assert read_json(tmp_path / "bom.json", encoding="utf-8-sig") == [1]
    with pytest.raises(CheckpointError, match="invalid JSON"):
        read_json(tmp_path / "bom.json")


def test_parse_json_finite_refuses_nan_and_infinity() -> None:
    from memento.errors import DataFormatError
    from memento.io import parse_json

    assert parse_json('{"a": NaN}', where="w", error=DataFormatError)["a"] != 0  # NaN kept unless finite
    for text in ('{"a": NaN}', "[Infinity]", "-Infinity"):
        with pytest.raises(DataFormatError, match="^w: .* is not a JSON number"):
            parse_json(text, where="w", error=DataFormatError, finite=True)


def test_finite_float_never_raises_on_huge_integers() -> None:
    from memento.io import finite_float, shorten

    assert finite_float(10 ** 400) is None and finite_float(-(10 ** 400)) is None
    assert finite_float(2 ** 1023) == float(2 ** 1023)
    assert finite_float(True) is None and finite_float("1") is None and finite_float(float("nan")) is None
    assert finite_float(3) == 3.0 and finite_float(-0.5) == -0.5
    assert shorten(10 ** 400) == "an integer of 401 digits" and shorten(10 ** 5000).startswith("an integer of about 50")
    assert len(shorten("x" * 10_000)) == 80 and shorten("a\nb") == "'a\\nb'"


def test_read_versioned_json_huge_version_is_one_short_line(tmp_path: Path) -> None:
    from memento.errors import CheckpointError
    from memento.io import read_versioned_json

    path = tmp_path / "meta.json"
    path.write_text('{"format": "f", "format_version": 1' + "0" * 1000 + "}")
    with pytest.raises(CheckpointError, match="newer than") as caught:
        read_versioned_json(path, format="f", version=1, what="thing")
    assert len(str(caught.value)) < 300
    path.write_text("[" * 5000 + "]" * 5000)
    with pytest.raises(CheckpointError, match="nested deeper"):
        read_versioned_json(path, format="f", version=1, what="thing")
