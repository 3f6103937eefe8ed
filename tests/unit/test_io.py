"""Atomic writes keep the old file on failure and leave no temporary file behind."""

from __future__ import annotations

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
