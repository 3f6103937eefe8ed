"""The configs of a selector artifact: ``config.json`` (:class:`SelectorConfig`) and ``encoder.json``
(:class:`EncoderSpec`: how query texts become vectors), with the encoder spec's reader, writer and loader."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any, Literal

from memento.config import (
    FIXED_SETS,
    MAX_CANDIDATES,
    MAX_K,
    MAX_STEPS,
    MAX_UPDATES_PER_STEP,
    NO_EVIDENCE,
    EncoderConfig,
    EvidenceConfig,
    IndexConfig,
    LearnerConfig,
    Pooling,
    QNetConfig,
    ReplayConfig,
    SetChoiceConfig,
    check,
    check_choice,
    check_float,
    check_int,
    from_dict,
    to_dict,
)
from memento.errors import CheckpointError, ConfigError, DimensionError, EncoderError
from memento.hub import HUB_PREFIX, is_hub_id
from memento.io import atomic_write_text, read_versioned_json
from memento.selector.artifact.files import check_entry, check_tree
from memento.selector.artifact.layout import ENCODER_FILES_DIR, ENCODER_FORMAT, ENCODER_FORMAT_VERSION, ENCODER_NAME

__all__ = ["EncoderKind", "EncoderSpec", "SelectorConfig", "load_encoder", "read_encoder_spec", "write_encoder_spec"]

logger = logging.getLogger(__name__)

EncoderKind = Literal["transformers", "none"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class EncoderSpec:
    """``encoder.json``: how a query text becomes the state vector the selector was trained on.

    - ``kind``: ``"transformers"`` (a :class:`memento.Encoder`: ``model`` is a Hugging Face Hub id,
      ``None`` for the bundled all-MiniLM-L6-v2, or ``None`` with ``files``) or ``"none"`` (the run used
      a custom encoder that cannot be rebuilt from a file: pass vectors, or an encoder object to the loader);
    - ``revision``: the Hub commit ``model`` resolved to at training time (loads the same weights anywhere);
    - ``files``: the encoder's files inside the artifact (``"encoder"``; listed and hashed in the manifest):
      :func:`write_encoder_spec` copies a local encoder directory there, so the artifact works on any machine;
    - ``model_id``, ``fingerprint``: what :meth:`memento.Encoder.describe` reported at training time;
    - ``pooling``, ``max_length``, ``normalize``: as in :class:`memento.config.EncoderConfig`;
    - ``dim``: D, which must equal the bank's, the Q-network's and the replay buffer's;
    - ``description``: free text (for ``"none"``: the training encoder's ``repr``).
    """

    kind: EncoderKind = "transformers"
    model: str | None = None
    model_id: str | None = None
    pooling: Pooling = "avg"
    max_length: int = 256
    normalize: bool = True
    dim: int
    fingerprint: str | None = None
    description: str | None = None
    revision: str | None = None
    files: str | None = None

    def __post_init__(self) -> None:
        check_choice(self, "kind", EncoderKind)
        check_int(self, "dim", 1)
        check_int(self, "max_length", 8)
        check(isinstance(self.normalize, bool), type(self), "normalize", self.normalize, "must be true or false")

    def encoder_config(self) -> EncoderConfig:
        """The :class:`EncoderConfig` that loads this encoder (``kind="transformers"`` only): the artifact's own
        copy (``files``, as :func:`read_encoder_spec` resolved it), else ``model`` at ``revision``."""
        model = self.model
        if self.files is not None:
            located = getattr(self, "_files_dir", None)
            if located is None:
                raise CheckpointError(f"{ENCODER_NAME}: the encoder lives in the artifact ({self.files}/); "
                                      "read the spec with read_encoder_spec (load_selector does)")
            model = str(located)
        elif model is not None and is_hub_id(model) and not Path(model).expanduser().is_dir():  # written explicitly
            at = f"@{self.revision}" if self.revision and "@" not in model else ""
            model = f"{HUB_PREFIX}{model}{at}"
        return EncoderConfig(model=model, pooling=self.pooling, max_length=self.max_length,
                             normalize=self.normalize)


SelectorPolicy = Literal["soft_q"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class SelectorConfig:
    """``config.json`` of a selector artifact: how the loaded :class:`memento.Selector` chooses and learns.

    - ``policy``: ``"soft_q"`` (``softmax(Q / alpha)`` over the candidates, Gumbel-top-k sampling);
    - ``k``: the number of cases the selector was trained to choose (the replay buffer's ``k_max``; a
      selection of more cases enters the buffer as several rows); ``candidates``: C, the cosine
      pre-selection the policy chooses from (a call asking for more than C cases uses C = k);
    - ``alpha``: the temperature; ``None`` follows the learner's (fixed or scheduled) alpha;
    - ``positive_only``: choose among the candidates with stored reward > 0 only (all of them when none
      is), as a run with ``LoopConfig.soft_q_positive_only`` did;
    - ``warmup``: decisions in the replay buffer before feedback triggers gradient steps;
      ``updates_per_step``: gradient steps per feedback after that (``learn=True`` only);
    - ``max_pending``: selections kept for feedback (the oldest are dropped beyond it);
      ``pending_ttl_s``: seconds a selection accepts feedback (``None``: no limit; default one hour: long
      enough for an agent that calls back after a restart or deploy, short enough to keep the on-disk
      store of pending selections, ``.pending.sqlite`` (about 8 KB each at D=384, k=4), small);
    - ``qnet``, ``learner``, ``replay``, ``index``: the component configs (``learner.gamma`` must be 0:
      feedback is single-step);
    - ``evidence``, ``sets``: the per-case evidence added to Q and the choice of the shown set
      (:mod:`memento.learn.evidence`; the evidence rows are in the artifact's bank). Absent from an artifact
      written before them: off, as it chose then; ``memento export`` writes the run's, and a selector made from a
      bank reads the bank's evidence and draws K cases as Memento does (it has no set labels to learn sizes from);
    - ``run``: the full ``LoopConfig`` of the run it was trained in (``None`` when unknown).
    """

    policy: SelectorPolicy = "soft_q"
    k: int = 4
    candidates: int = 32
    alpha: float | None = None
    positive_only: bool = False
    warmup: int = 16
    updates_per_step: int = 1
    max_pending: int = 100_000
    pending_ttl_s: float | None = 3_600.0
    qnet: QNetConfig
    learner: LearnerConfig
    replay: ReplayConfig
    index: IndexConfig = dataclasses.field(default_factory=IndexConfig)
    evidence: EvidenceConfig = dataclasses.field(default_factory=lambda: NO_EVIDENCE)
    sets: SetChoiceConfig = dataclasses.field(default_factory=lambda: FIXED_SETS)
    run: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        cls = type(self)
        check_choice(self, "policy", SelectorPolicy)
        check_int(self, "k", 1, MAX_K)
        check_int(self, "candidates", 1, MAX_CANDIDATES)
        if self.alpha is not None:
            check_float(self, "alpha", low=0.0, low_open=True)
        check(isinstance(self.positive_only, bool), cls, "positive_only", self.positive_only, "must be true or false")
        check_int(self, "warmup", 0, MAX_STEPS)
        check_int(self, "updates_per_step", 0, MAX_UPDATES_PER_STEP)
        check_int(self, "max_pending", 1, MAX_STEPS)
        if self.pending_ttl_s is not None:
            check_float(self, "pending_ttl_s", low=0.0, low_open=True)
        for field, kind in (("qnet", QNetConfig), ("learner", LearnerConfig), ("replay", ReplayConfig),
                            ("index", IndexConfig), ("evidence", EvidenceConfig), ("sets", SetChoiceConfig)):
            check(isinstance(getattr(self, field), kind), cls, field, getattr(self, field),
                   f"must be a {kind.__name__}")
        check(self.learner.gamma == 0.0, cls, "learner", f"gamma={self.learner.gamma}",
               "a selector learns single-step from feedback: learner.gamma must be 0")
        check(self.qnet.dim == self.replay.dim, cls, "replay", f"dim={self.replay.dim}",
               f"must equal qnet.dim={self.qnet.dim}")
        check(self.run is None or isinstance(self.run, dict), cls, "run", self.run, "must be an object or null")


# ---------------------------------------------------------------- encoder.json

_ENCODER_SKIP_DIRS = ("onnx", "openvino", "coreml", "tf_model", "flax_model")
_ENCODER_SKIP_SUFFIXES = (".h5", ".msgpack", ".ot", ".onnx", ".tflite", ".mlmodel", ".gguf")


def _copy_encoder_files(src: Path, dst: Path) -> int:
    """Copy what loading an encoder needs (configs, tokenizer, weights, sentence-transformers modules) as real
    files: no dot-named entries, no other frameworks' weights, ``pytorch_model.bin`` only without safetensors."""
    copied = 0
    for dirpath, dirnames, filenames in os.walk(src, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d not in _ENCODER_SKIP_DIRS)
        rel = Path(dirpath).relative_to(src)
        for name in sorted(filenames):
            source = Path(dirpath) / name
            if name.startswith(".") or name.endswith(_ENCODER_SKIP_SUFFIXES) or (
                    name == "pytorch_model.bin" and (source.parent / "model.safetensors").exists()):
                continue
            if not source.resolve().is_file():
                raise CheckpointError(f"{source}: not a regular file; cannot copy the encoder into the artifact")
            (dst / rel).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, dst / rel / name)
            copied += 1
    return copied


def _portable_spec(directory: Path, spec: EncoderSpec) -> EncoderSpec:
    """``spec`` as it can be written into ``directory`` and read on another machine (see :class:`EncoderSpec`)."""
    from memento.encoders import Encoder
    from memento.hub import hub_ref, split_revision

    if spec.kind != "transformers":
        return spec
    if spec.files is not None:
        source = getattr(spec, "_files_dir", None)
        target = directory / spec.files
        if source is not None and Path(source).resolve() != target.resolve() and not (
                directory.resolve().parent == Path(source).resolve().parent):  # not a staged save in place
            if not target.exists():
                _copy_encoder_files(Path(source), target)
        elif source is None and not target.is_dir():
            raise CheckpointError(f"{directory / ENCODER_NAME}: files={spec.files!r} but {target} does not exist")
        return spec
    if spec.model is None:
        return spec
    local = Path(spec.model).expanduser()
    if not local.is_dir():  # a Hub id (hf://id@revision, or id@revision as encoder.json records it)
        repo_id, revision = hub_ref(spec.model) or split_revision(spec.model)
        return dataclasses.replace(spec, model=repo_id, revision=spec.revision or revision)
    path, model_id, revision = Encoder.resolve(str(local))
    if revision:  # a snapshot of the Hub cache
        return dataclasses.replace(spec, model=model_id, model_id=model_id, revision=revision)
    if model_id != str(path):  # the bundled model
        return dataclasses.replace(spec, model=None, model_id=model_id)
    count = _copy_encoder_files(path, directory / ENCODER_FILES_DIR)
    logger.info("copied encoder %s into %s (%d files)", path, directory / ENCODER_FILES_DIR, count)
    return dataclasses.replace(spec, model=None, files=ENCODER_FILES_DIR, model_id=spec.model_id or str(path))


def write_encoder_spec(path: Path, spec: EncoderSpec) -> None:
    """Write ``encoder.json``, portable: a Hub id with its commit, the bundled model, or (for a local encoder
    directory) the encoder's files copied into ``encoder/`` beside it (``files``)."""
    spec = _portable_spec(Path(path).parent, spec)
    payload = {"format": ENCODER_FORMAT, "format_version": ENCODER_FORMAT_VERSION, **to_dict(spec)}
    atomic_write_text(path, json.dumps(payload, indent=2, sort_keys=True) + "\n")


def read_encoder_spec(path: Path) -> EncoderSpec:
    """Read ``encoder.json``; ``files`` must name a real directory inside the artifact (never outside it)."""
    meta = read_versioned_json(path, format=ENCODER_FORMAT, version=ENCODER_FORMAT_VERSION, what="encoder spec")
    body = {k: v for k, v in meta.items() if k not in ("format", "format_version")}
    try:
        spec = from_dict(EncoderSpec, body)
    except ConfigError as error:
        raise CheckpointError(f"{path}: {error}") from None
    if spec.files is not None:
        check_entry(spec.files, path)
        root = Path(path).parent
        located = root / spec.files
        if located.is_symlink() or not located.is_dir():
            raise CheckpointError(f"{path}: files={spec.files!r}: no such directory inside the artifact")
        check_tree(located)
        if not located.resolve().is_relative_to(root.resolve()):
            raise CheckpointError(f"{path}: files={spec.files!r} leaves the artifact")
        object.__setattr__(spec, "_files_dir", located.resolve())  # not a field: never written back
    if spec.kind == "transformers":  # pickle weights are refused now, not on every text select
        from memento.encoders import check_safetensors_weights

        weights = getattr(spec, "_files_dir", None)
        if weights is None and spec.model is not None and Path(spec.model).expanduser().is_dir():
            weights = Path(spec.model).expanduser()
        if weights is not None:
            check_safetensors_weights(weights, error=CheckpointError)
    return spec


def load_encoder(root: Path, spec: EncoderSpec | None = None, *, device: str | None = None) -> Any:
    """The text encoder of the artifact at ``root`` (``spec``: its ``encoder.json``, read when None) on
    ``device``, checked against the dimension the spec records. A spec of kind ``none`` (no encoder stored)
    raises ``EncoderError``."""
    from memento.encoders import Encoder

    spec = read_encoder_spec(root / ENCODER_NAME) if spec is None else spec
    if spec.kind == "none":
        raise EncoderError(f"{root}: this selector stores no text encoder ({ENCODER_NAME}: kind 'none', trained "
                           f"with {spec.description or 'a custom encoder'}); pass a {spec.dim}-d vector, or "
                           "load_selector(..., encoder=...)")
    encoder = Encoder.from_config(spec.encoder_config(), device=device)
    if encoder.dim != spec.dim:
        raise DimensionError(f"{root / ENCODER_NAME}: dim={spec.dim}, but encoder {encoder.model_id} gives "
                             f"dim={encoder.dim}")
    if spec.fingerprint and spec.fingerprint != encoder.describe().get("fingerprint"):
        logger.info("%s: encoder %s has another fingerprint than at training time (other files or install)", root,
                    encoder.model_id)
    return encoder
