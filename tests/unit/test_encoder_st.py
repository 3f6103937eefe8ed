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


def test_third_party_modules_and_activations_are_refused_in_one_line(tmp_path: Path) -> None:
    path = _st_copy(tmp_path, [*MODULES, {"idx": 2, "name": "2", "path": "2_Evil", "type": "mypackage.Evil"}])
    with pytest.raises(EncoderError, match="module type 'mypackage.Evil' is not part of sentence-transformers") as info:
        Encoder.from_pretrained(path, device="cpu", use_cache=False)
    assert "\n" not in str(info.value)
    (tmp_path / "b").mkdir()
    path2 = _st_copy(tmp_path / "b", [*MODULES, {"idx": 2, "name": "2", "path": "2_Dense",
                                                 "type": "sentence_transformers.models.Dense"}])
    _dense_dir(path2, torch.zeros(4, 384), torch.zeros(4), "mypackage.Evil")  # sentence-transformers: Tanh instead
    with pytest.raises(EncoderError, match="activation_function 'mypackage.Evil' is not a torch"):
        Encoder.from_pretrained(path2, device="cpu", use_cache=False)


def test_any_sentence_transformers_module_runs_a_layer_norm_here(tmp_path: Path) -> None:
    """Modules beyond Pooling/Dense/Normalize now run, as sentence-transformers runs them (here a LayerNorm)."""
    from safetensors.torch import save_file

    path = _st_copy(tmp_path, [*MODULES, {"idx": 2, "name": "2", "path": "2_LayerNorm",
                                          "type": "sentence_transformers.models.LayerNorm"}])
    (path / "2_LayerNorm").mkdir()
    (path / "2_LayerNorm" / "config.json").write_text(json.dumps({"dimension": 384}))
    gen = torch.Generator().manual_seed(2)
    weight_D, bias_D = 1 + torch.randn(384, generator=gen) * 0.1, torch.randn(384, generator=gen) * 0.1
    save_file({"norm.weight": weight_D, "norm.bias": bias_D}, str(path / "2_LayerNorm" / "model.safetensors"))
    encoder = Encoder.from_pretrained(path, device="cpu", cache_dir=tmp_path / "cache")
    assert encoder.modules is not None and encoder.modules.steps == ("LayerNorm",) and not encoder.modules.normalize
    expected = torch.nn.functional.layer_norm(_manual_mean(TEXTS, default_model_path()), (384,), weight_D, bias_D)
    np.testing.assert_allclose(encoder.encode(TEXTS, normalize=False), expected.numpy(), atol=1e-4)
    np.testing.assert_allclose(encoder.encode(TEXTS, normalize=False), expected.numpy(), atol=1e-4)  # from the cache
    assert encoder.cache is not None and encoder.cache.hits == len(TEXTS)
    assert "modules" in encoder.describe()  # not a plain avg encoder: the cache key and artifacts say so


def test_bad_module_files_are_one_line_errors(tmp_path: Path) -> None:
    path = _st_copy(tmp_path, MODULES)
    (path / "modules.json").write_text("[{")
    with pytest.raises(EncoderError, match=r"modules.json") as info:
        Encoder.from_pretrained(path, device="cpu", use_cache=False)
    assert "\n" not in str(info.value)
    (path / "modules.json").write_text(json.dumps([*MODULES, {"idx": 2, "name": "2", "path": "2_Dense",
                                                              "type": "sentence_transformers.models.Dense"}]))
    _dense_dir(path, torch.zeros(4, 100), torch.zeros(4), "torch.nn.modules.linear.Identity")  # takes 100, gets 384
    with pytest.raises(EncoderError) as info:
        Encoder.from_pretrained(path, device="cpu", use_cache=False).encode(TEXTS)
    assert "\n" not in str(info.value) and "shapes cannot be multiplied (3x384 and 100x4)" in str(info.value)
    # weights of another shape than the config says
    (path / "2_Dense" / "config.json").write_text(json.dumps({"in_features": 384, "out_features": 5}))
    with pytest.raises(EncoderError, match=r"size mismatch for linear.weight") as info:
        Encoder.from_pretrained(path, device="cpu", use_cache=False)
    assert "\n" not in str(info.value)
    (path / "modules.json").write_text(json.dumps([{"idx": 0, "name": "0", "path": "../x", "type": "x"}]))
    with pytest.raises(EncoderError, match="leaves the model directory"):
        Encoder.from_pretrained(path, device="cpu", use_cache=False)


def test_an_explicit_pooling_wins_over_modules_json() -> None:
    from transformers import AutoModel, AutoTokenizer

    encoder = Encoder.from_pretrained(pooling="cls_before_pooler", device="cpu", use_cache=False)
    assert encoder.modules is None and encoder.pooling == "cls_before_pooler"
    tokenizer = AutoTokenizer.from_pretrained(default_model_path())
    model = AutoModel.from_pretrained(default_model_path()).eval()
    batch = tokenizer(TEXTS, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.inference_mode():
        cls_BD = model(**batch).last_hidden_state[:, 0]
    np.testing.assert_allclose(encoder.encode(TEXTS), torch.nn.functional.normalize(cls_BD, dim=-1).numpy(),
                               atol=1e-5)
    plain = Encoder.from_pretrained(device="cpu", use_cache=False, modules=False)
    assert plain.modules is None and plain.pooling == "avg"
    np.testing.assert_allclose(plain.encode(TEXTS), Encoder.from_pretrained(device="cpu", use_cache=False)
                               .encode(TEXTS), atol=1e-5)


def test_training_pool_equals_encode_and_encode_keeps_the_training_mode() -> None:
    encoder = Encoder.from_pretrained(device="cpu", use_cache=False)
    assert not encoder.model.training  # loaded in eval mode
    batch = encoder.tokenizer(TEXTS, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.inference_mode():
        pooled_BD = encoder.pool(encoder.model(**batch), batch["attention_mask"])
    np.testing.assert_allclose(pooled_BD.numpy(), encoder.encode(TEXTS, normalize=False), atol=1e-5)
    encoder.model.train()
    encoder.encode(["another text"])
    assert encoder.model.training  # encode never switches a model under training to eval


def test_loading_never_opens_a_socket(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import socket

    connects: list[object] = []

    def refuse(self: socket.socket, address: object) -> None:
        connects.append(address)
        raise OSError("no network in this test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    encoder = Encoder.from_pretrained(_st_copy(tmp_path, MODULES), device="cpu", use_cache=False)
    encoder.encode(TEXTS)
    assert connects == []


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
