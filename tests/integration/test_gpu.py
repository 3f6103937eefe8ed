"""CUDA paths: the encoder on the GPU and faiss-gpu search. Skipped where no GPU is present."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import unit_vectors

pytestmark = pytest.mark.gpu


def _tiny_bert(path):
    """A small randomly initialised BERT saved as a transformers directory (no model package needed)."""
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"abcdefghijklmnopqrstuvwxyz?", "the", "capital", "of"]
    (path / "vocab.txt").parent.mkdir(parents=True, exist_ok=True)
    (path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    BertTokenizerFast(vocab_file=str(path / "vocab.txt")).save_pretrained(path)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(vocab), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, max_position_embeddings=128)
    BertModel(config).save_pretrained(path)
    return path


@pytest.mark.parametrize("pooling", ["avg", "cls", "cls_before_pooler"])
def test_encoder_on_cuda_matches_cpu(tmp_path, pooling):
    from memento.encoders import Encoder

    model_dir = _tiny_bert(tmp_path / "bert")
    texts = ["what is the capital of peru?", "how many legs does a spider have?", "x" * 500]
    gpu = Encoder.from_pretrained(model_dir, pooling=pooling, device=None, use_cache=False)
    assert gpu.device == "cuda"
    cpu = Encoder.from_pretrained(model_dir, pooling=pooling, device="cpu", use_cache=False)
    np.testing.assert_allclose(gpu.encode(texts), cpu.encode(texts), atol=1e-4)


def test_default_device_is_cuda_when_present():
    from memento.encoders import resolve_device

    assert resolve_device(None) == "cuda"


@pytest.mark.parametrize("factory", ["Flat", "IVF16,Flat"])
def test_faiss_gpu_search_matches_cpu(tmp_path, factory):
    from memento.bank import CaseBank, gpu_available
    from memento.types import Case

    if not gpu_available():
        pytest.skip("faiss has no GPU support here (make install-gpu: faiss-gpu in place of faiss-cpu)")
    rng = np.random.default_rng(0)
    x = unit_vectors(rng, 2000, 32)
    cases = [Case(state=f"s{i}", action="a", reward=0.0) for i in range(len(x))]
    with CaseBank.create(tmp_path / "gpu", 32, index=factory, use_gpu=True) as gpu_bank, \
            CaseBank.create(tmp_path / "cpu", 32, index=factory, use_gpu=False) as cpu_bank:
        gpu_bank.add(cases, x)
        cpu_bank.add(cases, x)
        gpu_bank.set_search_params(nprobe=16)
        cpu_bank.set_search_params(nprobe=16)
        _, gpu_ids = gpu_bank.search(x[:20], 5)
        _, cpu_ids = cpu_bank.search(x[:20], 5)
        assert (gpu_ids[:, 0] == cpu_ids[:, 0]).all()
        # filtered search falls back to exact search on the GPU path
        _, ids = gpu_bank.search(x[0], 3, kind="case")
        assert ids[0] == cpu_ids[0, 0]
