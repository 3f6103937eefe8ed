"""The real all-MiniLM-L6-v2 encoder: shapes, norms, semantics, sentence-transformers parity, the cache."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

import memento.encoders
from memento.encoders import DEFAULT_MODEL_ID, EmbeddingCache, Encoder
from memento.errors import DataFormatError, EncoderError

DIM = 384
TEXTS = ["What is the capital of Orotina Canton?", "What sport does Deportivo Cali play?",
         "In what country is Northland Communications?"]


@pytest.fixture(scope="module")
def uncached() -> Encoder:
    """A second default encoder with the cache disabled."""
    return Encoder.from_pretrained(device="cpu", use_cache=False)


def test_single_string_shape(encoder: Encoder) -> None:
    vec = encoder.encode("A single sentence.")
    assert vec.shape == (DIM,)
    assert vec.dtype == np.float32
    assert np.linalg.norm(vec) == pytest.approx(1.0, abs=1e-5)


def test_list_shape_and_unit_norm(encoder: Encoder) -> None:
    out = encoder.encode(TEXTS)
    assert out.shape == (3, DIM)
    assert out.dtype == np.float32
    assert out.flags["C_CONTIGUOUS"]
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), np.ones(3), atol=1e-5)
    assert not np.allclose(out[0], out[1])


def test_properties(encoder: Encoder) -> None:
    assert encoder.dim == DIM
    assert encoder.model_id == DEFAULT_MODEL_ID == "sentence-transformers/all-MiniLM-L6-v2"
    assert encoder.pooling == "avg"
    assert encoder.device == "cpu"
    info = encoder.describe()
    assert info["model_id"] == DEFAULT_MODEL_ID
    assert (info["pooling"], info["dim"], info["max_length"], info["normalize"]) == ("avg", DIM, 256, True)
    assert len(info["fingerprint"]) == 32
    assert repr(encoder) == f"Encoder(model_id={DEFAULT_MODEL_ID!r}, pooling='avg', dim={DIM}, device='cpu')"


def test_single_matches_list_row(encoder: Encoder) -> None:
    one = encoder.encode(TEXTS[1])
    many = encoder.encode(TEXTS)
    np.testing.assert_allclose(one, many[1], atol=1e-6)


def test_repeated_text_in_one_call(encoder: Encoder) -> None:
    out = encoder.encode(["repeat me please", "something else", "repeat me please"])
    np.testing.assert_array_equal(out[0], out[2])


def test_paraphrase_beats_unrelated(encoder: Encoder) -> None:
    anchor, paraphrase, unrelated = encoder.encode([
        "How old is the Eiffel Tower?",
        "What is the age of the Eiffel Tower?",
        "I like to eat bananas for breakfast.",
    ])
    close, far = float(anchor @ paraphrase), float(anchor @ unrelated)
    assert close > 0.8
    assert far < 0.3
    assert close > far + 0.4


def test_parity_with_sentence_transformers(encoder: Encoder) -> None:
    st = pytest.importorskip("sentence_transformers")
    model = st.SentenceTransformer(str(memento.encoders.default_model_path()), device="cpu")
    reference = model.encode(TEXTS, normalize_embeddings=True)
    ours = encoder.encode(TEXTS)
    assert reference.shape == ours.shape == (3, DIM)
    assert float(np.abs(reference - ours).max()) < 1e-4


def test_cache_hits_skip_the_model(encoder: Encoder, monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(encoder.cache, EmbeddingCache)
    texts = ["cache probe: the first text", "cache probe: the second text", "cache probe: the first text"]
    misses0, hits0 = encoder.cache.misses, encoder.cache.hits
    first = encoder.encode(texts)
    assert encoder.cache.misses - misses0 == 2  # two unique texts, never seen before
    assert encoder.cache.hits == hits0

    def no_forward(batch: list[str]) -> np.ndarray:
        raise AssertionError(f"the model ran on {batch}")

    monkeypatch.setattr(encoder, "_forward", no_forward)
    second = encoder.encode(texts)
    assert encoder.cache.hits - hits0 == 2
    assert encoder.cache.misses - misses0 == 2
    np.testing.assert_array_equal(first, second)
    single = encoder.encode("cache probe: the second text")
    np.testing.assert_array_equal(single, first[1])


def test_raw_vectors_normalise_to_the_default_output(encoder: Encoder) -> None:
    raw = encoder.encode(TEXTS, normalize=False)
    norms = np.linalg.norm(raw, axis=1)
    assert raw.dtype == np.float32
    assert np.all(np.abs(norms - 1.0) > 0.05)  # really not normalised
    np.testing.assert_allclose(raw / norms[:, None], encoder.encode(TEXTS), atol=1e-6)


def test_cache_key_separates_pooling(encoder: Encoder) -> None:
    text = "pooling separation probe sentence"
    avg = encoder.encode(text)
    cls_encoder = Encoder.from_pretrained(device="cpu", pooling="cls_before_pooler",
                                          cache_dir=encoder.cache.path.parent)
    try:
        assert cls_encoder.cache.path == encoder.cache.path
        cls = cls_encoder.encode(text)
        assert cls_encoder.cache.misses == 1 and cls_encoder.cache.hits == 0
        assert cls.shape == (DIM,)
        assert np.linalg.norm(cls) == pytest.approx(1.0, abs=1e-5)
        assert float(np.abs(cls - avg).max()) > 1e-2
        # and the avg vector is still served from the shared cache, unchanged
        np.testing.assert_array_equal(encoder.encode(text), avg)
    finally:
        cls_encoder.cache.close()


@pytest.mark.parametrize(("texts", "message"), [
    ("", "text 0 is empty"),
    ("   \n", "text 0 is empty"),
    (["fine", ""], "text 1 is empty"),
    (["fine", 3], "text 1 is int, expected a string"),
    ([None], "text 0 is NoneType, expected a string"),
])
def test_bad_text(encoder: Encoder, texts, message: str) -> None:
    with pytest.raises(DataFormatError) as info:
        encoder.encode(texts)
    assert str(info.value) == message


def test_empty_list(encoder: Encoder) -> None:
    out = encoder.encode([])
    assert out.shape == (0, DIM)
    assert out.dtype == np.float32


def test_from_pretrained_missing_path(tmp_path: Path) -> None:
    with pytest.raises(EncoderError, match="no such local path"):
        Encoder.from_pretrained(tmp_path / "no-such-model", device="cpu")


def test_from_pretrained_dir_without_model(tmp_path: Path) -> None:
    with pytest.raises(EncoderError, match="cannot load from"):
        Encoder.from_pretrained(tmp_path, device="cpu", use_cache=False)


def test_from_pretrained_local_copy(tmp_path: Path, uncached: Encoder) -> None:
    copy = tmp_path / "minilm"
    shutil.copytree(memento.encoders.default_model_path(), copy)
    local = Encoder.from_pretrained(copy, device="cpu", use_cache=False)
    assert local.model_id == str(copy.resolve())
    assert local.dim == DIM
    assert local.describe()["fingerprint"] != uncached.describe()["fingerprint"]
    np.testing.assert_allclose(local.encode(TEXTS), uncached.encode(TEXTS), atol=1e-6)


def test_determinism_without_cache(uncached: Encoder) -> None:
    other = Encoder.from_pretrained(device="cpu", use_cache=False)
    assert other.cache is None and uncached.cache is None
    texts = [*TEXTS, "a short one", "An entirely different and somewhat longer sentence about rivers and mountains."]
    a = uncached.encode(texts)
    b = other.encode(texts)
    assert a.tobytes() == b.tobytes()
    assert uncached.encode(texts).tobytes() == a.tobytes()  # and across calls
