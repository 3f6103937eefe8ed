"""Encoders as their authors configured them: modules.json (Pooling, Dense, Normalize) and prompts."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from memento.encoders import Encoder, default_model_path
from memento.errors import EncoderError

TEXTS = ["What is the capital of Peru?", "a b", "Photosynthesis turns light into chemical energy in plants."]


def _manual_mean(texts: list[str], path: Path, prompt: str = "", skip: int = 0) -> torch.Tensor:
    """Mean pooling over real tokens with transformers directly (the first ``skip`` tokens left out)."""
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path).eval()
    batch = tokenizer([prompt + t for t in texts], padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.inference_mode():
        hidden_BTD = model(**batch).last_hidden_state
    mask_BT = batch["attention_mask"].clone()
    mask_BT[:, :skip] = 0
    mask_BT1 = mask_BT.unsqueeze(-1).float()
    return (hidden_BTD * mask_BT1).sum(1) / mask_BT1.sum(1).clamp(min=1e-9)


def _st_copy(tmp_path: Path, modules: list[dict[str, str]]) -> Path:
    """The bundled MiniLM's files (linked) with another modules.json."""
    src, out = default_model_path(), tmp_path / "st-model"
    out.mkdir()
    for item in src.iterdir():
        if item.name not in ("modules.json", "2_Dense", "config_sentence_transformers.json"):
            os.symlink(item, out / item.name)
    (out / "modules.json").write_text(json.dumps(modules))
    return out


def _dense_dir(root: Path, weight: torch.Tensor, bias: torch.Tensor, activation: str) -> None:
    from safetensors.torch import save_file

    (root / "2_Dense").mkdir()
    (root / "2_Dense" / "config.json").write_text(json.dumps(
        {"in_features": weight.shape[1], "out_features": weight.shape[0], "bias": True,
         "activation_function": activation}))
    save_file({"linear.weight": weight.contiguous(), "linear.bias": bias.contiguous()},
              str(root / "2_Dense" / "model.safetensors"))


MODULES = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
           {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]


def test_bundled_minilm_equals_mean_pooling_and_normalize_by_hand() -> None:
    encoder = Encoder.from_pretrained(device="cpu", use_cache=False)
    assert encoder.modules is not None and encoder.modules.pooling == ("mean",) and encoder.modules.normalize
    expected = torch.nn.functional.normalize(_manual_mean(TEXTS, default_model_path()), dim=-1).numpy()
    np.testing.assert_allclose(encoder.encode(TEXTS), expected, atol=1e-5)


def test_bundled_minilm_equals_sentence_transformers_when_installed() -> None:
    st = pytest.importorskip("sentence_transformers")
    reference = st.SentenceTransformer(str(default_model_path()), device="cpu").encode(TEXTS)
    np.testing.assert_allclose(Encoder.from_pretrained(device="cpu", use_cache=False).encode(TEXTS), reference,
                               atol=1e-5)


def test_a_dense_layer_and_normalize_are_applied(tmp_path: Path) -> None:
    path = _st_copy(tmp_path, [*MODULES, {"idx": 2, "name": "2", "path": "2_Dense",
                                          "type": "sentence_transformers.models.Dense"},
                               {"idx": 3, "name": "3", "path": "3_Normalize",
                                "type": "sentence_transformers.models.Normalize"}])
    gen = torch.Generator().manual_seed(0)
    weight_OI, bias_O = torch.randn(48, 384, generator=gen) * 0.1, torch.randn(48, generator=gen) * 0.1
    _dense_dir(path, weight_OI, bias_O, "torch.nn.modules.activation.Tanh")
    encoder = Encoder.from_pretrained(path, device="cpu", cache_dir=tmp_path / "cache")
    assert encoder.dim == 48
    expected = torch.tanh(_manual_mean(TEXTS, default_model_path()) @ weight_OI.T + bias_O)
    expected = torch.nn.functional.normalize(expected, dim=-1).numpy()
    np.testing.assert_allclose(encoder.encode(TEXTS), expected, atol=1e-5)
    np.testing.assert_allclose(encoder.encode(TEXTS), expected, atol=1e-5)  # again, from the cache
    plain = Encoder.from_pretrained(path, device="cpu", cache_dir=tmp_path / "cache", modules=False)
    assert plain.dim == 384  # modules=False: the transformer with the encoder's own pooling
    st = pytest.importorskip("sentence_transformers")
    np.testing.assert_allclose(encoder.encode(TEXTS), st.SentenceTransformer(str(path), device="cpu").encode(TEXTS),
                               atol=1e-5)


def test_identity_dense_and_a_default_prompt_left_out_of_pooling(tmp_path: Path) -> None:
    path = _st_copy(tmp_path, [*MODULES, {"idx": 2, "name": "2", "path": "2_Dense",
                                          "type": "sentence_transformers.models.Dense"}])
    (path / "1_Pooling").unlink()
    (path / "1_Pooling").mkdir()
    (path / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 384, "pooling_mode": "mean", "include_prompt": False}))
    (path / "config_sentence_transformers.json").write_text(json.dumps(
        {"prompts": {"query": "query: "}, "default_prompt_name": "query"}))
    gen = torch.Generator().manual_seed(1)
    weight_OI, bias_O = torch.randn(16, 384, generator=gen), torch.randn(16, generator=gen)
    _dense_dir(path, weight_OI, bias_O, "torch.nn.modules.linear.Identity")
    encoder = Encoder.from_pretrained(path, device="cpu", use_cache=False)
    # "query: " is [CLS] query : -> 3 tokens before the text (the trailing [SEP] of the lone prompt is not counted)
    raw = _manual_mean(TEXTS, default_model_path(), prompt="query: ", skip=3) @ weight_OI.T + bias_O
    np.testing.assert_allclose(encoder.encode(TEXTS, normalize=False), raw.numpy(), atol=1e-4)
    st = pytest.importorskip("sentence_transformers")
    reference = st.SentenceTransformer(str(path), device="cpu").encode(TEXTS)
    np.testing.assert_allclose(encoder.encode(TEXTS, normalize=False), reference, atol=1e-4)


def test_unsupported_modules_are_refused_in_one_line(tmp_path: Path) -> None:
    path = _st_copy(tmp_path, [*MODULES, {"idx": 2, "name": "2", "path": "2_LayerNorm",
                                          "type": "sentence_transformers.models.LayerNorm"}])
    with pytest.raises(EncoderError, match="LayerNorm.*not supported") as info:
        Encoder.from_pretrained(path, device="cpu", use_cache=False)
    assert "\n" not in str(info.value)
    (tmp_path / "b").mkdir()
    path2 = _st_copy(tmp_path / "b", [*MODULES, {"idx": 2, "name": "2", "path": "2_Dense",
                                                 "type": "sentence_transformers.models.Dense"}])
    _dense_dir(path2, torch.zeros(4, 384), torch.zeros(4), "mypackage.Evil")
    with pytest.raises(EncoderError, match="activation_function 'mypackage.Evil'"):
        Encoder.from_pretrained(path2, device="cpu", use_cache=False)


def _pickle_encoder(tmp_path: Path, *, with_safetensors: bool = False) -> Path:
    """The bundled MiniLM's config and tokenizer, its weights as a pickle (``pytorch_model.bin``) only."""
    src, out = default_model_path(), tmp_path / "pickle-model"
    out.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        os.symlink(src / name, out / name)
    torch.save({"embeddings.word_embeddings.weight": torch.zeros(2, 2)}, out / "pytorch_model.bin")
    if with_safetensors:
        os.symlink(src / "model.safetensors", out / "model.safetensors")
    return out


def _no_torch_load(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    loads: list[str] = []
    monkeypatch.setattr(torch, "load", lambda *args, **kwargs: loads.append(str(args[0])) or {})
    return loads


def test_pickle_only_weights_are_refused_before_any_torch_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _pickle_encoder(tmp_path)
    loads = _no_torch_load(monkeypatch)
    with pytest.raises(EncoderError) as caught:
        Encoder.from_pretrained(str(model), device="cpu", use_cache=False)
    message = str(caught.value)
    assert message == (f"{model / 'pytorch_model.bin'}: pickle weights are not loaded; convert to safetensors "
                       "(model.safetensors)")
    assert loads == []


def test_pickle_weights_beside_safetensors_are_never_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _pickle_encoder(tmp_path, with_safetensors=True)
    loads = _no_torch_load(monkeypatch)
    encoder = Encoder.from_pretrained(str(model), device="cpu", use_cache=False)
    assert loads == [] and encoder.dim == 384


def test_a_pickle_dense_module_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kinds = enumerate([("", "Transformer"), ("1_Pooling", "Pooling"), ("2_Dense", "Dense")])
    model = _st_copy(tmp_path, [{"idx": str(i), "name": str(i), "path": rel,
                                 "type": f"sentence_transformers.models.{kind}"} for i, (rel, kind) in kinds])
    (model / "2_Dense").mkdir()
    (model / "2_Dense" / "config.json").write_text(json.dumps({"in_features": 384, "out_features": 4}))
    torch.save({"linear.weight": torch.zeros(4, 384)}, model / "2_Dense" / "pytorch_model.bin")
    loads = _no_torch_load(monkeypatch)
    with pytest.raises(EncoderError, match=r"2_Dense/pytorch_model.bin: pickle weights are not loaded"):
        Encoder.from_pretrained(str(model), device="cpu", use_cache=False)
    assert loads == []
