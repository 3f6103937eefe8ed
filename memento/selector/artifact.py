"""The selector artifact on disk (docs/formats.md, "Selector artifact"): layout, configs, manifest, checksums, the
feedback log.

An exported selector is a directory::

    manifest.json        written last: format and version, library versions, creation and save times, the
                         source run, sha256 and size of every other file, row counts and row digests of the
                         two live SQLite files
    config.json          SelectorConfig: K, candidate set size C, alpha, warm-up, the Q-network, learner,
                         replay and index configs, and the source run's full LoopConfig
    encoder.json         EncoderSpec: how query texts become vectors (model, pooling, dim, normalisation)
    qnet.safetensors     the Q-network's weights (metadata: its QNetConfig), for consumers that only score
    learner/             SoftQLearner.save: both networks, optimiser state, alpha, update counter, generator
    replay/              ReplayBuffer.save: the decisions the learner samples from
    bank/                the case bank: cases.sqlite (cases + float32 embeddings), index.faiss, index.json
                         (and vectors.f32, vectors.json for a bank with vectors on disk)
    feedback.sqlite      the feedback log: one row per Selector.feedback (live, see below)
    README.md            a model card generated from the source run and the artifact's own counts

**Checksums.** :func:`verify_artifact` compares every file listed in the manifest with its recorded size
and sha256; a missing, truncated or changed file is a ``CheckpointError`` naming it. Two files are
*live*: ``bank/cases.sqlite`` (``Selector.add_case`` commits new cases there) and ``feedback.sqlite``
(``Selector.feedback`` commits there), so both may legitimately grow after the last save. For them the
manifest also records the row count and a chained sha256 over the rows in order. A live file whose
hash no longer matches is accepted only if it holds *more* rows than were saved (or the bank recorded
deletions since) and its first rows still have the recorded digest (the saved content is intact; the rest
was appended since); the same row count with another hash, or fewer rows, is rejected. Cases updated in place
(``Selector.update_case``, recorded in the bank's history log) change saved rows: for the bank the manifest also
records ``stable_digest``, over the columns no write changes (position, id, state, env, kind, creation time,
vector), and a bank that recorded updates is accepted when that one still matches. The faiss index files are derived
from
``cases.sqlite`` and checked byte for byte unless cases were appended since the save (the bank then
checks the index against SQLite and adds what is missing).

**Saving in place** is crash-safe: the new state files and manifest are written to ``.save.tmp/``, the
directory is renamed to ``.save.ready/`` (the commit point), and its files are then moved over the old
ones, manifest last. :func:`recover` (run by the loader) finishes a move that a crash interrupted, or
drops an incomplete ``.save.tmp/``. :func:`save_in_place` and :func:`save_copy` are the two saves of a loaded
selector (:meth:`memento.Selector.save`), :func:`write_artifact` the writer of a new one
(:meth:`memento.Selector.create`).

**The published policy.** ``.policy.safetensors`` (:func:`write_policy`, :func:`read_policy`) holds the
Q-network a learner process publishes for read-only selectors in other processes: dot-named, volatile, never
in the manifest.

**Confinement.** Loading, verifying and saving never follow a symbolic link: :func:`check_tree` refuses a
link (or a FIFO, socket or device) anywhere below the root, dot-named entries and SQLite sidecars included,
before anything is read, moved or written; :func:`check_entry` refuses manifest entries that are absolute,
hold ``..``, ``.``, empty or dot-named components, backslashes or NUL. See ``docs/security.md``.

Nothing here is unpickled: JSON, safetensors and SQLite only.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import sqlite3
import stat as _stat
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from memento import sqlite
from memento.bank import bankfile
from memento.bank.local import BANK_FORMAT, BANK_FORMAT_VERSION, DERIVED_NAMES, CaseBank
from memento.config import (
    FIXED_SETS,
    MAX_CANDIDATES,
    MAX_K,
    MAX_STEPS,
    MAX_UPDATES_PER_STEP,
    NO_EVIDENCE,
    BankConfig,
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
    load_json,
    parses_to,
    save_json,
    to_dict,
)
from memento.errors import BankError, CheckpointError, ConfigError, DataFormatError, DimensionError, EncoderError
from memento.hub import HUB_PREFIX, is_hub_id
from memento.io import (
    atomic_write,
    atomic_write_text,
    fsync_dir,
    load_json_file,
    loads_json,
    parse_json,
    read_json,
    read_safetensors,
    read_versioned_json,
    sqlite_copy,
)
from memento.learn.learner import SoftQLearner
from memento.learn.persist import LEARNER_DIR, REPLAY_DIR, save_state
from memento.learn.replay import ReplayBuffer

__all__ = [
    "BANK_DB",
    "DERIVED_FILES",
    "ENCODER_FORMAT",
    "FEEDBACK_NAME",
    "LIVE_FILES",
    "MANIFEST_NAME",
    "POLICY_FORMAT",
    "POLICY_NAME",
    "REBUILT_FILES",
    "REQUIRED_FILES",
    "SELECTOR_FORMAT",
    "SELECTOR_FORMAT_VERSION",
    "EncoderKind",
    "EncoderSpec",
    "FeedbackLog",
    "FeedbackRow",
    "LiveParts",
    "SelectorConfig",
    "check_bank_file",
    "check_entry",
    "check_feedback_file",
    "check_tree",
    "checkpoint_live",
    "feedback_rows_digest",
    "feedback_with_case",
    "file_sha256",
    "library_versions",
    "load_encoder",
    "read_encoder_spec",
    "read_manifest",
    "read_policy",
    "recover",
    "save_copy",
    "save_in_place",
    "verify_artifact",
    "write_encoder_spec",
    "write_policy",
]

logger = logging.getLogger(__name__)

SELECTOR_FORMAT = "memento-selector"
SELECTOR_FORMAT_VERSION = 1
ENCODER_FORMAT = "memento-encoder"
ENCODER_FORMAT_VERSION = 1
FEEDBACK_FORMAT = "memento-feedback"
FEEDBACK_FORMAT_VERSION = 1
QNET_FORMAT = "memento-qnet"

MANIFEST_NAME = "manifest.json"
CONFIG_NAME = "config.json"
ENCODER_NAME = "encoder.json"
QNET_NAME = "qnet.safetensors"
CARD_NAME = "README.md"
# LEARNER_DIR, REPLAY_DIR: the soft-Q agent's own layout (memento.learn.persist), the same in a checkpoint and here
BANK_DIR = "bank"
FEEDBACK_NAME = "feedback.sqlite"
BANK_DB = f"{BANK_DIR}/cases.sqlite"
STAGING_DIR = ".save.tmp"
READY_DIR = ".save.ready"
POLICY_NAME = ".policy.safetensors"
"""The Q-network a learner publishes for read-only selectors (dot-named: volatile, never in the manifest)."""
POLICY_FORMAT = "memento-policy"

REQUIRED_FILES = (CONFIG_NAME, ENCODER_NAME, QNET_NAME, f"{LEARNER_DIR}/learner.safetensors",
                  f"{LEARNER_DIR}/learner.json", f"{LEARNER_DIR}/config.json", f"{REPLAY_DIR}/replay.safetensors",
                  f"{REPLAY_DIR}/replay.json", BANK_DB, FEEDBACK_NAME, CARD_NAME)
"""Files every artifact's manifest must list."""
LIVE_FILES = (BANK_DB, FEEDBACK_NAME)
"""SQLite files that grow between saves (new cases, feedback)."""
DERIVED_FILES = (f"{BANK_DIR}/index.faiss", f"{BANK_DIR}/index.json")
"""Rebuilt from cases.sqlite by the bank when stale; they change when cases are added."""
REBUILT_FILES = tuple(f"{BANK_DIR}/{name}" for name in DERIVED_NAMES)
"""The :data:`DERIVED_FILES` and, for a bank with its vectors on disk, vectors.f32 and vectors.json: all that the
bank rebuilds from cases.sqlite."""

_SQLITE_SIDECARS = ("-wal", "-shm", "-journal")
_HASH_CHUNK = 1 << 20
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


# ---------------------------------------------------------------- configs


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


# ---------------------------------------------------------------- small helpers


def library_versions() -> dict[str, str | None]:
    """Versions of the libraries an artifact's files depend on (recorded in the manifest)."""
    from importlib import metadata

    import numpy
    import torch

    from memento._version import __version__

    versions: dict[str, str | None] = {"memento": __version__, "python": sys.version.split()[0],
                                       "torch": torch.__version__, "numpy": numpy.__version__,
                                       "sqlite": sqlite3.sqlite_version}
    for dist in ("faiss-cpu", "faiss-gpu", "safetensors", "transformers"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return versions


def file_sha256(path: Path) -> str:
    """The sha256 of a regular file; a symbolic link is refused (``CheckpointError``), never followed."""
    try:
        fd = os.open(path, os.O_RDONLY | _O_NOFOLLOW)
    except OSError as error:
        if os.path.islink(path):
            raise CheckpointError(f"{path}: a symbolic link; an artifact's files are never read through "
                                  "links") from None
        raise CheckpointError(f"{path}: cannot read ({error.strerror})") from None
    digest = hashlib.sha256()
    with os.fdopen(fd, "rb") as handle:
        while chunk := handle.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def feedback_rows_digest(db: Path | sqlite3.Connection, stop: int, *, start: int = 0,
                         previous: str | None = None) -> str:
    """Chained sha256 (:func:`memento.sqlite.chain_digest`) of feedback rows ``start < seq <= stop`` (seq counts
    from 1); the bank's rows are digested by :func:`memento.bank.bankfile.digest`."""
    conn = db if isinstance(db, sqlite3.Connection) else sqlite.connect(db)
    try:
        rows = conn.execute(f"SELECT {_FEEDBACK_COLUMNS} FROM feedback WHERE seq > ? AND seq <= ? ORDER BY seq",
                            (start, stop))
        return sqlite.chain_digest(rows, previous)
    finally:
        if not isinstance(db, sqlite3.Connection):
            conn.close()


def _count_rows(path: Path, table: str) -> int:
    try:
        if table == "cases":
            return bankfile.count(path)
        conn = sqlite.connect(path)
        try:
            return int(conn.execute("SELECT COUNT(*) FROM feedback").fetchone()[0])
        finally:
            conn.close()
    except sqlite3.Error as error:
        raise CheckpointError(f"{path}: unreadable SQLite file ({error})") from None


# ---------------------------------------------------------------- encoder.json


ENCODER_FILES_DIR = "encoder"
"""Where an artifact keeps its own copy of a local encoder (``EncoderSpec.files``)."""
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


# ---------------------------------------------------------------- the feedback log

_FEEDBACK_SCHEMA = sqlite.META_SCHEMA + """
CREATE TABLE IF NOT EXISTS feedback (
    seq INTEGER PRIMARY KEY,
    selection_id TEXT NOT NULL UNIQUE,
    reward REAL NOT NULL,
    time REAL NOT NULL,
    mode TEXT NOT NULL,
    policy_version INTEGER NOT NULL,
    env TEXT,
    ids TEXT NOT NULL,
    probs TEXT NOT NULL,
    set_prob REAL NOT NULL,
    learned INTEGER NOT NULL,
    state BLOB
);
"""
_FEEDBACK_COLUMNS = "seq, selection_id, reward, time, mode, policy_version, env, ids, probs, set_prob, learned, state"


@dataclasses.dataclass(frozen=True, kw_only=True)
class FeedbackRow:
    """One recorded feedback: the selection it rewards (state vector, chosen ids, propensities) and the reward.

    ``learned`` says whether the selector that recorded it was learning (``learn=True``): replaying the
    row after a restart then repeats the gradient steps it triggered.
    """

    seq: int
    selection_id: str
    reward: float
    time: float
    mode: str
    policy_version: int
    env: str | None
    ids: list[str]
    probs: list[float]
    set_prob: float
    learned: bool
    state: bytes | None


class FeedbackLog:
    """``feedback.sqlite`` (WAL): each :meth:`append` is committed before it returns."""

    def __init__(self, path: Path, conn: sqlite3.Connection):
        self.path = path
        self._conn = conn
        self._count = int(conn.execute("SELECT COUNT(*) FROM feedback").fetchone()[0])

    @classmethod
    def create(cls, path: str | Path) -> FeedbackLog:
        path = Path(path)
        if path.exists():
            raise CheckpointError(f"{path}: a feedback log already exists here")
        sqlite.create(path, _FEEDBACK_SCHEMA,
                      {"format": FEEDBACK_FORMAT, "format_version": str(FEEDBACK_FORMAT_VERSION)})
        return cls.open(path)

    @classmethod
    def open(cls, path: str | Path) -> FeedbackLog:
        path = Path(path)
        if not path.is_file():
            raise CheckpointError(f"{path}: missing feedback log")
        conn, _ = sqlite.open_store(path, format=FEEDBACK_FORMAT, version=FEEDBACK_FORMAT_VERSION, what="feedback log")
        try:
            return cls(path, conn)
        except BaseException:
            conn.close()
            raise

    def __len__(self) -> int:
        return self._count

    @property
    def connection(self) -> sqlite3.Connection:
        return self._conn

    def append(self, *, selection_id: str, reward: float, mode: str, policy_version: int, env: str | None,
               ids: list[str], probs: list[float], set_prob: float, learned: bool, state: bytes | None) -> int:
        """Commit one feedback row; returns its ``seq`` (1, 2, ...)."""
        seq = self._count + 1
        try:
            with self._conn:
                self._conn.execute(
                    f"INSERT INTO feedback ({_FEEDBACK_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (seq, selection_id, float(reward), time.time(), mode, int(policy_version), env,
                     json.dumps(ids), json.dumps(probs), float(set_prob), int(learned), state))
        except sqlite3.IntegrityError as error:
            raise CheckpointError(f"{self.path}: cannot record feedback for {selection_id!r} ({error})") from None
        self._count = seq
        return seq

    def rows(self, after: int = 0) -> Iterator[FeedbackRow]:
        """Rows with ``seq > after``, in order."""
        for row in self._conn.execute(f"SELECT {_FEEDBACK_COLUMNS} FROM feedback WHERE seq > ? ORDER BY seq",
                                      (after,)).fetchall():
            yield _feedback_row(row)

    def checkpoint(self) -> None:
        """Move the WAL into the main file (so its bytes are what a checksum sees)."""
        self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def close(self) -> None:
        self._conn.close()


def _feedback_row(row: tuple[Any, ...]) -> FeedbackRow:
    seq, sid, reward, when, mode, version, env, ids, probs, set_prob, learned, state = row
    return FeedbackRow(seq=seq, selection_id=sid, reward=reward, time=when, mode=mode, policy_version=version, env=env,
                       ids=_row_json(ids, seq, "ids"), probs=_row_json(probs, seq, "probs"), set_prob=set_prob,
                       learned=bool(learned), state=state)


def _row_json(text: Any, seq: Any, column: str) -> Any:
    """A feedback row's JSON column parsed; bad JSON (nested too deeply for Python, say, which SQLite's
    ``json_valid`` accepts) is a one-line ``CheckpointError``."""
    try:
        return loads_json(text if isinstance(text, (str, bytes)) else str(text))
    except DataFormatError as error:
        raise CheckpointError(f"{FEEDBACK_NAME}: feedback row {seq}: {column} is not readable JSON "
                              f"({error.reason})") from None


def feedback_with_case(path: Path, case_id: str) -> tuple[int, list[FeedbackRow]]:
    """The row count of the feedback log at ``path`` and its rows whose selection held ``case_id``, in order;
    read-only (a server may be writing the log). An unreadable file is a ``DataFormatError`` naming it."""
    conn = sqlite.connect(path, read_only=True, timeout=10.0, error=DataFormatError)
    try:
        total = int(conn.execute("SELECT COUNT(*) FROM feedback").fetchone()[0])
        rows = conn.execute(f"SELECT {_FEEDBACK_COLUMNS} FROM feedback WHERE EXISTS (SELECT 1 FROM "
                            "json_each(feedback.ids) WHERE json_each.value = ?) ORDER BY seq", (case_id,)).fetchall()
    except sqlite3.DatabaseError as error:
        raise DataFormatError(f"{path}: unreadable feedback log ({error})") from None
    finally:
        conn.close()
    return total, [_feedback_row(row) for row in rows]


def check_feedback_file(path: Path, dim: int) -> int:
    """``feedback.sqlite`` as the loader replays it: a feedback log of a readable version whose rows hold
    ``dim``-float state vectors and JSON lists of ids and probabilities. Returns its row count."""
    log = FeedbackLog.open(path)
    try:
        (bad,) = log.connection.execute(
            "SELECT COUNT(*) FROM feedback"
            " WHERE (state IS NOT NULL AND (typeof(state) != 'blob' OR length(state) != ?))"
            " OR CASE WHEN json_valid(ids) THEN json_type(ids) != 'array' ELSE 1 END"
            " OR CASE WHEN json_valid(probs) THEN json_type(probs) != 'array' ELSE 1 END", (4 * dim,)).fetchone()
        if bad:
            raise CheckpointError(f"{path}: {bad} feedback row(s) do not hold a {dim}-float state vector and JSON "
                                  "lists of ids and probabilities")
        return len(log)
    except sqlite3.Error as error:
        raise CheckpointError(f"{path}: unreadable feedback log ({error})") from None
    finally:
        log.close()


def check_bank_file(path: Path) -> dict[str, int]:
    """``bank/cases.sqlite`` as the loader opens it, read without changing it: a case bank of a readable
    version with a valid config and uid, dense positions and embeddings of one length. Returns ``cases``,
    ``dim`` (the bank's config) and, when it holds cases, ``embedding_dim`` (the stored vectors' length)."""
    try:
        found = bankfile.facts(path)
    except sqlite3.Error as error:
        raise CheckpointError(f"{path}: not a case bank ({error})") from None
    sqlite.check_format(found.meta, path, format=BANK_FORMAT, version=BANK_FORMAT_VERSION, what="case bank")
    if not isinstance(found.meta.get("uid"), str) or not isinstance(found.meta.get("config"), str):
        raise CheckpointError(f"{path}: damaged case bank (no config or uid in its meta table)")
    try:
        config = from_dict(BankConfig, parse_json(found.meta["config"], where=f"{path}: the config in its meta table",
                                                  error=CheckpointError))
    except (ValueError, ConfigError) as error:
        raise CheckpointError(f"{path}: damaged case bank config ({error})") from None
    n, short, long = found.cases, found.shortest, found.longest
    out = {"cases": n, "dim": config.dim}
    if n:
        if (found.low, found.high) != (0, n - 1):
            raise CheckpointError(f"{path}: case positions are not 0..{n - 1} (found {found.low}..{found.high})")
        if found.stored:  # the vectors are in vectors.f32, checked block by block (SQLite holds none)
            if found.blobs != n or long != 0:
                raise CheckpointError(f"{path}: damaged case bank (vectors stored in vectors.f32 and in SQLite)")
            try:
                bankfile.check_vectors(path, found.meta["uid"], config.dim, n)
            except BankError as error:
                raise CheckpointError(str(error)) from None
            out["embedding_dim"] = config.dim
            return out
        if found.blobs != n or short != long or long % 4:
            raise CheckpointError(f"{path}: case embeddings are not all float32 vectors of one length "
                                  f"({short}..{long} bytes)")
        out["embedding_dim"] = long // 4
    return out


def check_bank_meta_files(directory: Path) -> None:
    """The bank's index.json and vectors.json, where present, are JSON objects: the bank reads them when it opens
    (a stale one is rebuilt from SQLite; one that does not parse, nested too deeply, say, is a damaged artifact).
    A one-line ``CheckpointError`` naming the file otherwise."""
    for name in DERIVED_NAMES:
        path = directory / name
        if name.endswith(".json") and path.is_file():
            if not isinstance(load_json_file(path, f"bank {name}", error=CheckpointError), dict):
                raise CheckpointError(f"{path}: damaged bank metadata (not a JSON object)")


# ---------------------------------------------------------------- manifest


def check_tree(root: Path) -> None:
    """Refuse an artifact that holds a symbolic link (or a FIFO, socket or device) anywhere below ``root``.

    Every entry is looked at with ``lstat``, dot-named ones (``.save.tmp``, ``.save.ready``) and SQLite
    sidecars (``-wal``, ``-shm``) included: loading, verifying and saving never follow a link, so a planted
    link cannot make them read, move or write files outside the artifact. ``root`` itself may be a link.
    """
    pending = [Path(root)]
    while pending:
        directory = pending.pop()
        try:
            with os.scandir(directory) as entries:
                found = sorted(entries, key=lambda entry: entry.name)
        except OSError as error:
            raise CheckpointError(f"{directory}: cannot list ({error.strerror})") from None
        for entry in found:
            path = Path(entry.path)
            if entry.is_symlink():
                raise CheckpointError(f"{path}: a symbolic link inside the artifact; links are never followed "
                                      "(replace it with the file or directory itself)")
            if entry.is_dir(follow_symlinks=False):
                pending.append(path)
            elif not entry.is_file(follow_symlinks=False):
                raise CheckpointError(f"{path}: not a regular file or directory (an artifact holds only files)")


def check_entry(rel: Any, where: Path) -> str:
    """A manifest entry must name a file inside the artifact: a relative POSIX path of plain components.

    Refused (``CheckpointError`` naming the entry and ``where``, the manifest): a non-string, an empty
    name, an absolute path, a backslash or NUL, an empty, ``.`` or ``..`` component, and dot-named
    components (staging directories and temporaries are never listed).
    """
    if not isinstance(rel, str) or not rel:
        raise CheckpointError(f"{where}: manifest entry {rel!r} is not a file name")
    reason = None
    if rel.startswith("/"):
        reason = "an absolute path"
    elif "\\" in rel or "\x00" in rel:
        reason = "a backslash or NUL in the name"
    elif any(part in ("", ".", "..") for part in rel.split("/")):
        reason = "an empty, '.' or '..' component"
    elif any(part.startswith(".") for part in rel.split("/")):
        reason = "a dot-named component"
    if reason is not None:
        raise CheckpointError(f"{where}: manifest entry {rel!r} does not name a file inside the artifact ({reason})")
    return rel


def _check_file_entry(rel: str, entry: Any, where: Path) -> None:
    if (not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str) or len(entry["sha256"]) != 64
            or isinstance(entry.get("bytes"), bool) or not isinstance(entry.get("bytes"), int) or entry["bytes"] < 0):
        raise CheckpointError(f"{where}: damaged manifest entry for {rel} ({entry!r}; expected sha256 and bytes)")


def read_manifest(root: Path) -> dict[str, Any]:
    """``manifest.json``, checked: format and version, the listed names (:func:`check_entry`), the entries,
    the live-file records; the whole tree first (:func:`check_tree`: no links)."""
    root = Path(root)
    path = root / MANIFEST_NAME
    if not root.is_dir():
        raise CheckpointError(f"{root}: not a selector artifact (not a directory)")
    if not os.path.lexists(path):
        raise CheckpointError(f"{root}: not a selector artifact (no {MANIFEST_NAME})")
    check_tree(root)
    if not path.is_file():
        raise CheckpointError(f"{root}: not a selector artifact ({MANIFEST_NAME} is not a file)")
    manifest = read_versioned_json(path, format=SELECTOR_FORMAT, version=SELECTOR_FORMAT_VERSION,
                                   what="selector manifest")
    files, live = manifest.get("files"), manifest.get("live")
    if not isinstance(files, dict) or not isinstance(live, dict):
        raise CheckpointError(f"{path}: damaged manifest (no files or live sections)")
    for rel, entry in files.items():
        check_entry(rel, path)
        _check_file_entry(rel, entry, path)
    missing = [name for name in REQUIRED_FILES if name not in files]
    if missing:
        raise CheckpointError(f"{path}: the manifest does not list {missing[0]} (every artifact has "
                              f"{', '.join(REQUIRED_FILES)})")
    for name in LIVE_FILES:
        entry = live.get(name)
        if (not isinstance(entry, dict) or isinstance(entry.get("rows"), bool) or not isinstance(entry.get("rows"), int)
                or entry["rows"] < 0 or not isinstance(entry.get("digest"), str)
                or not isinstance(entry.get("stable_digest", ""), str)):
            raise CheckpointError(f"{path}: damaged manifest (live entry for {name}: {entry!r})")
    for key, low in (("dim", 1), ("saves", 1), ("learner_updates", 0)):
        value = manifest.get(key, low)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise CheckpointError(f"{path}: damaged manifest ({key}={value!r}; expected an integer >= {low})")
    if "dim" not in manifest:
        raise CheckpointError(f"{path}: damaged manifest (no dim)")
    return manifest


def listed_files(root: Path) -> dict[str, Path]:
    """Every file of an artifact that a manifest lists: all regular files except the manifest itself,
    SQLite sidecars, and dot-named files or directories (staging, temporaries). A symbolic link anywhere
    in the walk is a ``CheckpointError`` (a save never hashes or lists a file through a link)."""
    found: dict[str, Path] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            if os.path.islink(os.path.join(dirpath, name)):
                raise CheckpointError(f"{Path(dirpath) / name}: a symbolic link inside the artifact; links are "
                                      "never followed")
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if name.startswith(".") or name.endswith(_SQLITE_SIDECARS) or name.endswith(".creating"):
                continue
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            if rel != MANIFEST_NAME:
                found[rel] = path
    return found


def hash_files(files: dict[str, Path], cache: dict[str, tuple[int, int, str]] | None = None
               ) -> dict[str, dict[str, Any]]:
    """``{rel: {"sha256", "bytes"}}``; ``cache`` (rel -> (size, mtime_ns, sha256)) skips unchanged files."""
    out: dict[str, dict[str, Any]] = {}
    for rel, path in sorted(files.items()):
        stat = path.lstat()
        if not _stat.S_ISREG(stat.st_mode):
            raise CheckpointError(f"{path}: not a regular file (a symbolic link?); an artifact lists files only")
        hit = None if cache is None else cache.get(rel)
        if hit is not None and hit[0] == stat.st_size and hit[1] == stat.st_mtime_ns:
            sha = hit[2]
        else:
            sha = file_sha256(path)
        if cache is not None:  # a staged file keeps its size and mtime when it is moved into place
            cache[rel] = (stat.st_size, stat.st_mtime_ns, sha)
        out[rel] = {"sha256": sha, "bytes": stat.st_size}
    return out


def _wal_has_frames(db: Path) -> bool:
    wal = db.with_name(db.name + "-wal")
    return wal.is_file() and wal.stat().st_size > 0


def verify_artifact(root: str | Path, *, cache: dict[str, tuple[int, int, str]] | None = None) -> dict[str, Any]:
    """Check an artifact against its manifest (see the module docstring); returns a report.

    The report: ``manifest``, ``files`` (how many were checked), ``rows`` (current rows of each live
    file), ``appended`` (rows added since the save, per live file). Any problem raises a one-line
    ``CheckpointError`` naming the file.
    """
    root = Path(root)
    manifest = read_manifest(root)  # refuses links anywhere in the tree, and names outside it
    if (root / READY_DIR).is_dir():
        raise CheckpointError(f"{root}: a save was interrupted after it completed ({READY_DIR}/ is still there); "
                              "loading the artifact finishes it")
    files: dict[str, Any] = manifest["files"]
    rows: dict[str, int] = {}
    appended: dict[str, int] = {}
    # live files first: whether cases were appended decides how the derived index files are checked
    for rel in LIVE_FILES:
        path = root / rel
        entry, saved = files[rel], manifest["live"][rel]
        if not path.is_file():
            raise CheckpointError(f"{path}: missing (listed in {MANIFEST_NAME})")
        table = "cases" if rel == BANK_DB else "feedback"
        intact = _matches(path, entry, rel, cache)
        if intact and not _wal_has_frames(path):
            rows[rel], appended[rel] = saved["rows"], 0
            continue
        n = _count_rows(path, table)
        if n < saved["rows"]:
            raise CheckpointError(f"{path}: holds {n} {table} row(s), {MANIFEST_NAME} records {saved['rows']} "
                                  "(truncated or rolled back)")
        updated = table == "cases" and bankfile.has_updates(path)
        if n == saved["rows"] and not intact and not (table == "cases" and (bankfile.has_tombstones(path)
                                                                            or updated)):
            raise CheckpointError(f"{path}: changed after it was saved (size or sha256 differs from {MANIFEST_NAME}, "
                                  "and no rows were appended)")
        # rows appended, or cases deleted (tombstones) since the save: the saved rows themselves must be intact;
        # cases updated in place (recorded): what no update changes must be
        digest = (bankfile.digest if table == "cases" else feedback_rows_digest)(path, saved["rows"])
        if digest != saved["digest"] and not (updated and "stable_digest" in saved and bankfile.digest(
                path, saved["rows"], stable=True) == saved["stable_digest"]):
            raise CheckpointError(f"{path}: its first {saved['rows']} saved {table} row(s) were changed "
                                  f"(row digest differs from {MANIFEST_NAME})")
        rows[rel], appended[rel] = n, n - saved["rows"]
    cases_appended = appended[BANK_DB] > 0
    encoder_dir = root / ENCODER_FILES_DIR
    if encoder_dir.is_dir():  # the encoder's files are loaded as a model: every one must be listed and hashed
        for rel in listed_files(root):
            if rel.startswith(ENCODER_FILES_DIR + "/") and rel not in files:
                raise CheckpointError(f"{root / rel}: a file in the artifact's {ENCODER_FILES_DIR}/ that "
                                      f"{MANIFEST_NAME} does not list (the encoder is loaded from there)")
    checked = len(LIVE_FILES)
    for rel, entry in sorted(files.items()):
        if rel in LIVE_FILES:
            continue
        path = root / rel
        derived_may_differ = rel in REBUILT_FILES and cases_appended
        if not path.is_file():
            if derived_may_differ:
                continue
            raise CheckpointError(f"{path}: missing (listed in {MANIFEST_NAME})")
        if not _matches(path, entry, rel, cache):
            if derived_may_differ:
                continue
            size = path.stat().st_size
            if isinstance(entry, dict) and size != entry.get("bytes"):
                raise CheckpointError(f"{path}: {size} bytes, {MANIFEST_NAME} records {entry.get('bytes')} "
                                      "(truncated or changed)")
            raise CheckpointError(f"{path}: sha256 differs from {MANIFEST_NAME} (the file was changed after it "
                                  "was saved)")
        checked += 1
    return {"manifest": manifest, "files": checked, "rows": rows, "appended": appended}


def _matches(path: Path, entry: Any, rel: str, cache: dict[str, tuple[int, int, str]] | None) -> bool:
    if not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str):
        raise CheckpointError(f"{path}: damaged manifest entry {entry!r}")
    stat = path.stat()
    if stat.st_size != entry.get("bytes"):
        return False
    sha = file_sha256(path)
    if cache is not None:
        cache[rel] = (stat.st_size, stat.st_mtime_ns, sha)
    return sha == entry["sha256"]


# ---------------------------------------------------------------- crash-safe in-place saves


def fsync_tree(root: Path) -> None:
    """fsync every file and directory under ``root`` (before a rename makes them the committed state)."""
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            if os.path.islink(os.path.join(dirpath, name)):
                raise CheckpointError(f"{Path(dirpath) / name}: a symbolic link in a staged save; refusing it")
        for name in filenames:
            with open(Path(dirpath) / name, "rb") as handle:
                os.fsync(handle.fileno())
        fsync_dir(Path(dirpath))


def _real_dir(path: Path) -> bool:
    """Whether ``path`` is a directory (not a link to one); a link or another kind of file is refused."""
    if not os.path.lexists(path):
        return False
    if os.path.islink(path) or not path.is_dir():
        raise CheckpointError(f"{path}: not a directory (a symbolic link?); an artifact's save directories are "
                              "never followed through links")
    return True


def _inside(root: Path, rel: Path) -> Path:
    """``root / rel``, after checking that no component of it below ``root`` is a symbolic link."""
    here = root
    for part in rel.parts:
        here = here / part
        if os.path.islink(here):
            raise CheckpointError(f"{here}: a symbolic link inside the artifact; refusing to write through it")
    return here


def commit_staged(root: Path) -> None:
    """Rename ``.save.tmp`` to ``.save.ready`` (the commit point), then move its files into place."""
    stage, ready = root / STAGING_DIR, root / READY_DIR
    if not _real_dir(stage):
        raise CheckpointError(f"{stage}: no staged save to commit")
    fsync_tree(stage)
    if _real_dir(ready):
        shutil.rmtree(ready)
    os.replace(stage, ready)
    fsync_dir(root)
    _apply_ready(root)


def _apply_ready(root: Path) -> None:
    ready = root / READY_DIR
    if not _real_dir(ready):
        return
    staged: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(ready):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            if os.path.islink(path):
                raise CheckpointError(f"{path}: a symbolic link in a completed save; refusing to move it into "
                                      "the artifact")
            if name in filenames and not path.is_file():
                raise CheckpointError(f"{path}: not a regular file; refusing to move it into the artifact")
        staged += [Path(dirpath) / name for name in filenames]
    moves = sorted(staged, key=lambda p: p.name == MANIFEST_NAME)
    for src in moves:  # the manifest last: until it moves, the old manifest describes the old files
        dst = _inside(root, src.relative_to(ready))
        dst.parent.mkdir(parents=True, exist_ok=True)
        _inside(root, src.relative_to(ready))  # the directories made just now are plain ones
        os.replace(src, dst)
    fsync_dir(root)
    shutil.rmtree(ready, ignore_errors=True)


def recover(root: Path) -> None:
    """Finish an in-place save that a crash interrupted after its commit point; drop an incomplete one.

    The whole tree is checked first (:func:`check_tree`): a link named ``.save.ready`` or ``.save.tmp``
    (or anywhere else) is refused, never followed.
    """
    root = Path(root)
    check_tree(root)
    if _real_dir(root / READY_DIR):
        logger.warning("%s: finishing a save that was interrupted", root)
        _apply_ready(root)
    if _real_dir(root / STAGING_DIR):
        logger.warning("%s: dropping an incomplete save", root)
        shutil.rmtree(root / STAGING_DIR, ignore_errors=True)


# ---------------------------------------------------------------- the model card


def _pct(x: Any) -> str:
    return "n/a" if not isinstance(x, (int, float)) else f"{100.0 * x:.1f}%"


def card_front_matter(manifest: dict[str, Any], spec: EncoderSpec) -> list[str]:
    """The YAML front matter the Hugging Face Hub reads from a model card (``huggingface_hub.ModelCardData``):
    library name and tags (:data:`memento.hub.CARD_METADATA`), the base encoder (its Hub id when known), the
    task suite as the dataset, the run's figures as metrics and as the model index's results."""
    from huggingface_hub import EvalResult, ModelCardData

    from memento.hub import CARD_METADATA

    source = manifest.get("source") or {}
    summary = source.get("summary") or {}
    base = None
    if spec.kind == "transformers" and spec.files is None:
        base = spec.model if spec.model is not None else "sentence-transformers/all-MiniLM-L6-v2"
    if base is not None and ("/" not in base or base.startswith(("/", ".", "~"))):
        base = None
    run = (manifest.get("run") or {}) if isinstance(manifest.get("run"), dict) else {}
    suite = source.get("suite") or source.get("tasks") or run.get("suite")
    suite = suite if isinstance(suite, str) and suite else None
    metrics = [(name, summary.get(name)) for name in ("success_rate", "moving_success_rate")]
    metrics = [(name, float(value)) for name, value in metrics if isinstance(value, (int, float))
               and not isinstance(value, bool)]
    results = [EvalResult(task_type="case-selection", dataset_type=suite or "tasks", dataset_name=suite or "tasks",
                          metric_type=name, metric_value=float(f"{value:.6g}")) for name, value in metrics]
    data = ModelCardData(library_name=CARD_METADATA["library_name"], tags=list(CARD_METADATA["tags"]),
                         base_model=base, datasets=[suite] if suite else None,
                         metrics=[name for name, _ in metrics] or None,
                         model_name=str(source.get("policy") or "memento-selector") if results else None,
                         eval_results=results or None)
    return ["---", *data.to_yaml().splitlines(), "---", ""]


def _card_training(source: dict[str, Any]) -> list[str]:
    """The card's "Training" lines: where the selector came from and how well that run did."""
    summary = source.get("summary") or {}
    lines: list[str] = []
    if source.get("kind") == "bank":
        lines.append(f"- not trained by a run: a fresh Q-network over the case bank `{source.get('path')}`; "
                     "load it with `learn=True` to train it from feedback")
    elif source:
        lines += [
            f"- source: `{source.get('path')}` ({source.get('kind')}), policy `{source.get('policy')}`",
            f"- planner: {source.get('planner', 'n/a')}; judge: {source.get('judge', 'n/a')}; "
            f"tasks: {source.get('n_tasks', 'n/a')}",
            f"- steps (LLM calls): {source.get('step', 'n/a')} of {source.get('steps', 'n/a')} planned; "
            f"bank {summary.get('bank_size_start', 'n/a')} -> {source.get('bank_cases', 'n/a')} case(s)",
        ]
        if summary:
            lines.append(f"- success rate: {_pct(summary.get('success_rate'))} overall, "
                         f"{_pct(summary.get('moving_success_rate'))} over the last {summary.get('window')} steps")
            windows = summary.get("success_by_window") or []
            if windows:
                lines += ["", "| steps | success rate |", "|---|---|"]
                lines += [f"| {w['start']}-{w['end']} | {_pct(w['rate'])} |" for w in windows]
        comparison = source.get("comparison")
        if comparison:
            lines += ["", "Compared on the same task stream (same seed, same order):", "",
                      "| policy | early | late | overall |", "|---|---|---|---|"]
            for name in comparison.get("order", []):
                r = comparison["policies"][name]
                lines.append(f"| {name} | {_pct(r.get('success_early'))} | {_pct(r.get('success_late'))} | "
                             f"{_pct(r.get('success_rate'))} |")
            lines.append(f"\n(early: the first {comparison.get('window')} steps; late: the last "
                         f"{comparison.get('late_steps')} steps)")
    else:
        lines.append("- no source run recorded")
    return lines


def _card_usage(root: Path, spec: EncoderSpec) -> list[str]:
    """The card's "How to use it" and "Files" sections."""
    return [
        "",
        "## How to use it",
        "",
        "```python",
        "import memento",
        "",
        f'selector = memento.load_selector("{root.name}")            # checks checksums and dimensions first',
        ('result = selector.select("What is the capital of Peru?", k=4)  # ids, cases, probabilities, selection id'
         if spec.kind == "transformers" else
         f"result = selector.select(state_vector, k=4)  # a unit {spec.dim}-d vector; ids, cases, probabilities"),
        "selector.feedback(result.selection_id, reward=1.0)        # learn=True keeps training; save() persists",
        "```",
        "",
        f"Over HTTP: `memento serve {root.name}`; as MCP tools: `memento mcp {root.name}`. "
        f"Check the files: `memento verify {root.name}`.",
        "",
        "## Files",
        "",
        "`manifest.json` (versions, sha256 of every file), `config.json` (selector, Q-network, learner, replay and "
        "index configs, the training run's config), `encoder.json`, `qnet.safetensors`, `learner/`, `replay/`, "
        "`bank/` (cases.sqlite + index.faiss), `feedback.sqlite` (feedback log), this card. Nothing is pickled.",
        "",
    ]


def model_card(root: Path, manifest: dict[str, Any], config: SelectorConfig, spec: EncoderSpec, *,
               cases: int, feedbacks: int, updates: int, alpha: float) -> str:
    """``README.md`` of an artifact: what it is, what it was trained on (figures from the run), how to load it.
    It opens with the YAML front matter the Hugging Face Hub reads (:func:`card_front_matter`)."""
    source = manifest.get("source") or {}
    q = config.qnet
    name = spec.model_id or spec.model or "sentence-transformers/all-MiniLM-L6-v2"
    where = (f", files in `{spec.files}/`" if spec.files else f", revision `{spec.revision}`" if spec.revision
             else "")
    encoder = (f"`{name}` "
               f"(pooling {spec.pooling}, max_length {spec.max_length}, dim {spec.dim}, "
               f"{'unit-normalised' if spec.normalize else 'raw'}{where})" if spec.kind == "transformers"
               else f"none stored (trained with {spec.description or 'a custom encoder'}; pass {spec.dim}-d vectors)")
    lines = card_front_matter(manifest, spec) + [
        f"# memento selector: {root.name}",
        "",
        "A trained case selector (Memento's parametric case-based reasoning): for a task, it picks which past "
        "cases a frozen LLM planner should see. It scores the top-C cosine candidates from its case bank with a "
        "Q-network that estimates P(success | task, case) and samples K of them from softmax(Q / alpha).",
        "",
        "## What it holds",
        "",
        f"- policy: `{config.policy}`, K = {config.k} cases by default, C = {config.candidates} candidates, "
        f"alpha = {alpha:g}" + (" (the learner's)" if config.alpha is None else ""),
        f"- Q-network: `{q.arch}`, dim {q.dim}, hidden {q.hidden} x {q.n_layers} layer(s)"
        + (f", tower width {q.embed_dim}" if q.arch == "two_tower" else "") + f"; {updates} learner update(s)",
        f"- encoder: {encoder}",
        f"- case bank: {cases} case(s), faiss index `{config.index.factory}`",
        f"- replay buffer: capacity {config.replay.capacity}; feedback recorded: {feedbacks}",
        f"- format `{SELECTOR_FORMAT}` version {SELECTOR_FORMAT_VERSION}, memento "
        f"{(manifest.get('versions') or {}).get('memento', '?')}; created {manifest.get('created', '?')}, "
        f"saved {manifest.get('saved', '?')} (save {manifest.get('saves', 1)})",
        "",
        "## Training",
        "",
    ]
    lines += _card_training(source)
    lines += _card_usage(root, spec)
    return "\n".join(lines)


# ---------------------------------------------------------------- checking and writing a whole artifact


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def check_dims(path: Path, dims: dict[str, int]) -> None:
    if len(set(dims.values())) > 1:
        listed = ", ".join(f"{name} dim={d}" for name, d in dims.items())
        raise DimensionError(f"{path}: the parts of this selector disagree on the embedding dimension: {listed}")


@dataclasses.dataclass(frozen=True)
class CheckedArtifact:
    """What :func:`check_artifact` read: the manifest, configs, the learner and replay buffer (on the
    device asked for), the embedding dimension each part records, and :func:`verify_artifact`'s report
    (``None`` when checksums were not checked)."""

    manifest: dict[str, Any]
    config: SelectorConfig
    spec: EncoderSpec
    learner: SoftQLearner
    buffer: ReplayBuffer
    dims: dict[str, int]
    report: dict[str, Any] | None

    def counts(self) -> dict[str, int]:
        """``cases`` and ``feedbacks`` in the live files, and how many of each came after the last save
        (``cases_since_save``, ``feedbacks_since_save``); needs the checksum report."""
        if self.report is None:
            raise CheckpointError("the artifact was checked without its checksums (verify=False): no row counts")
        rows, appended = self.report["rows"], self.report["appended"]
        return {"cases": rows[BANK_DB], "feedbacks": rows[FEEDBACK_NAME], "cases_since_save": appended[BANK_DB],
                "feedbacks_since_save": appended[FEEDBACK_NAME]}


def check_artifact(path: str | Path, *, verify: bool = True, device: str | torch.device = "cpu",
                   cache: dict[str, tuple[int, int, str]] | None = None) -> CheckedArtifact:
    """Every check of an artifact that does not need its encoder, bank index or feedback replay: the one
    function both :meth:`memento.Selector.load` and :func:`memento.selector.export.verify` run, so they accept
    and refuse the same artifacts.

    In order: no symbolic link or special file anywhere in the tree, manifest names confined to the
    artifact, checksums (``verify``), ``config.json``, ``encoder.json``, the learner (``learner.json``,
    every tensor of ``learner.safetensors``, ``learner/config.json``) and the replay buffer (``replay.json``,
    ``replay.safetensors``) loaded on ``device``, ``qnet.safetensors`` against the learner, the bank's
    ``cases.sqlite`` (format, version, config, embeddings) and ``feedback.sqlite`` (format, version, rows),
    and the embedding dimension of every part. Any problem is a one-line ``CheckpointError`` (or
    ``DimensionError``) naming the file.
    """
    path = Path(path)
    report = verify_artifact(path, cache=cache) if verify else None
    manifest = report["manifest"] if report is not None else read_manifest(path)
    try:
        config = load_json(SelectorConfig, path / CONFIG_NAME)
    except ConfigError as error:
        raise CheckpointError(f"{path / CONFIG_NAME}: not a selector config ({error})") from None
    spec = read_encoder_spec(path / ENCODER_NAME)
    learner = SoftQLearner.load(path / LEARNER_DIR, device=device)
    _check_learner_config(path / LEARNER_DIR / CONFIG_NAME, learner)
    buffer = ReplayBuffer.load(path / REPLAY_DIR, device=device)
    qnet_config = to_dict(learner.qnet.config)
    if qnet_config != to_dict(config.qnet):
        raise CheckpointError(f"{path / LEARNER_DIR}: Q-network {qnet_config} differs from {CONFIG_NAME}'s "
                              f"{to_dict(config.qnet)}")
    _check_qnet_file(path / QNET_NAME, learner)
    bank = check_bank_file(path / BANK_DB)
    check_bank_meta_files(path / BANK_DIR)
    dims = {f"{ENCODER_NAME}": spec.dim, f"{CONFIG_NAME} (Q-network)": config.qnet.dim,
            f"{LEARNER_DIR}/ (Q-network)": learner.qnet.config.dim, f"{REPLAY_DIR}/": buffer.config.dim,
            f"{BANK_DIR}/": bank["dim"]}
    if "embedding_dim" in bank:
        dims[f"{BANK_DIR}/ (faiss index and embeddings)"] = bank["embedding_dim"]
    dims[MANIFEST_NAME] = manifest["dim"]
    check_dims(path, dims)
    check_feedback_file(path / FEEDBACK_NAME, spec.dim)
    return CheckedArtifact(manifest=manifest, config=config, spec=spec, learner=learner, buffer=buffer, dims=dims,
                           report=report)


def _check_learner_config(path: Path, learner: SoftQLearner) -> None:
    """``learner/config.json`` must describe the learner that ``learner.json`` holds."""
    saved = read_json(path, error=CheckpointError, what="learner config")  # bad JSON of any kind: one line
    if (not isinstance(saved, dict) or not parses_to(QNetConfig, saved.get("qnet"), learner.qnet.config)
            or not parses_to(type(learner.config), saved.get("learner"), learner.config)):
        raise CheckpointError(f"{path}: does not describe the learner of {LEARNER_DIR}/learner.json (Q-network "
                              f"{to_dict(learner.qnet.config)})")


def write_qnet(path: Path, learner: SoftQLearner) -> None:
    """``qnet.safetensors``: the online Q-network's tensors, with its QNetConfig in the metadata."""
    tensors = {name: value.detach().to("cpu").contiguous() for name, value in learner.qnet.state_dict().items()}
    _write_tensors(path, tensors, QNET_FORMAT, learner)


def _write_tensors(path: Path, tensors: dict[str, torch.Tensor], format: str, learner: SoftQLearner,
                   **extra: str) -> None:
    """A safetensors file atomically, its metadata ``format``, ``extra`` and the learner's QNetConfig."""
    from safetensors.torch import save_file

    metadata = {"format": format, **extra, "qnet_config": json.dumps(to_dict(learner.qnet.config), sort_keys=True)}
    atomic_write(path, lambda tmp: save_file(tensors, str(tmp), metadata=metadata))


def _check_qnet_config(path: Path, metadata: dict[str, str], learner: SoftQLearner, whose: str) -> None:
    """The QNetConfig a safetensors file's metadata records must be ``learner``'s."""
    try:
        config = loads_json(metadata.get("qnet_config", ""))
    except DataFormatError as error:
        raise CheckpointError(f"{path}: damaged metadata (qnet_config: {error.reason})") from None
    if not parses_to(QNetConfig, config, learner.qnet.config):
        raise CheckpointError(f"{path}: Q-network {config} differs from {whose} {to_dict(learner.qnet.config)}")


def _check_qnet_file(path: Path, learner: SoftQLearner) -> None:
    """qnet.safetensors must hold the learner's Q-network (same config, same tensors)."""
    tensors, header = read_safetensors(path)
    if header.get("format") != QNET_FORMAT:
        raise CheckpointError(f"{path}: not a memento Q-network file")
    _check_qnet_config(path, header, learner, "the learner's")
    state = learner.qnet.state_dict()
    if set(tensors) != set(state):
        raise CheckpointError(f"{path}: tensors {sorted(tensors)} differ from the Q-network's {sorted(state)}")
    for name, value in state.items():
        if tuple(tensors[name].shape) != tuple(value.shape):
            raise DimensionError(f"{path}: {name} has shape {tuple(tensors[name].shape)}, the learner's "
                                 f"{tuple(value.shape)}")
        if not torch.equal(tensors[name], value.detach().to("cpu")):
            raise CheckpointError(f"{path}: {name} differs from the learner's Q-network ({LEARNER_DIR}/)")


def write_parts(directory: Path, config: SelectorConfig, spec: EncoderSpec, learner: SoftQLearner,
                 buffer: ReplayBuffer) -> None:
    """The parts of an artifact besides the bank, the feedback log, the card and the manifest: config.json,
    encoder.json, qnet.safetensors and the agent's learner/ and replay/ (its checkpoint layout)."""
    directory.mkdir(parents=True, exist_ok=True)
    save_json(config, directory / CONFIG_NAME)
    write_encoder_spec(directory / ENCODER_NAME, spec)
    write_qnet(directory / QNET_NAME, learner)
    save_state(directory, learner, buffer)


def write_artifact(tmp: Path, out: Path, *, learner: SoftQLearner, buffer: ReplayBuffer, config: SelectorConfig,
                   spec: EncoderSpec, cases: int, source: dict[str, Any]) -> None:
    """A new artifact: everything but the bank into ``tmp`` (which holds ``bank/`` with ``cases`` rows already),
    an empty feedback log, the model card and the manifest last; then ``tmp`` is swapped in for ``out``.

    The one writer of a new artifact (reached through :meth:`memento.Selector.create`; ``memento.selector.export``
    resolves where its parts come from); a loaded selector saves itself with :meth:`memento.Selector.save`
    (:func:`save_in_place`, :func:`save_copy`), through the same parts writer.
    """
    write_parts(tmp, config, spec, learner, buffer)
    FeedbackLog.create(tmp / FEEDBACK_NAME).close()
    now = time.time()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
    manifest: dict[str, Any] = {
        "format": SELECTOR_FORMAT, "format_version": SELECTOR_FORMAT_VERSION, "created": stamp,
        "created_unix": now, "saved": stamp, "saved_unix": now, "saves": 1, "versions": library_versions(),
        "source": source, "dim": spec.dim, "learner_updates": learner.updates,
        "live": {BANK_DB: {"rows": cases, "digest": bankfile.digest(tmp / BANK_DB, cases),
                           "stable_digest": bankfile.digest(tmp / BANK_DB, cases, stable=True)},
                 FEEDBACK_NAME: {"rows": 0, "digest": feedback_rows_digest(tmp / FEEDBACK_NAME, 0)}},
    }
    atomic_write_text(tmp / CARD_NAME, model_card(out, manifest, config, spec, cases=cases, feedbacks=0,
                                                  updates=learner.updates, alpha=learner.alpha))
    manifest["files"] = hash_files(listed_files(tmp))
    _write_manifest(tmp, manifest)
    fsync_tree(tmp)
    swap_in(tmp, out)


def _write_manifest(directory: Path, manifest: dict[str, Any]) -> None:
    atomic_write_text(directory / MANIFEST_NAME, json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def swap_in(tmp: Path, out: Path) -> None:
    """Move the finished ``tmp`` directory to ``out`` (replacing an old artifact, or an empty directory, there)."""
    old = out.parent / f".{out.name}.old-{os.getpid()}"
    if out.exists():
        os.replace(out, old)
    os.replace(tmp, out)
    shutil.rmtree(old, ignore_errors=True)


# ---------------------------------------------------------------- saving a loaded selector


@dataclasses.dataclass(frozen=True, kw_only=True)
class LiveParts:
    """What a loaded selector (:class:`memento.Selector`) saves: its configs, its agent's learner and replay
    buffer, its open bank and feedback log, and the temperature its policy uses now (for the model card)."""

    config: SelectorConfig
    spec: EncoderSpec
    learner: SoftQLearner
    buffer: ReplayBuffer
    bank: CaseBank
    feedback: FeedbackLog
    alpha: float


def checkpoint_live(root: Path, bank: CaseBank, feedback: FeedbackLog) -> None:
    """Flush the bank's index and move both live SQLite files' committed rows into their main files (so
    their bytes are what a checksum, a copy or an upload sees)."""
    bank.flush()
    sqlite.checkpoint(root / BANK_DB)
    feedback.checkpoint()


def _live_entries(parts: LiveParts, previous: dict[str, Any], bank_db: Path,
                  feedback_db: sqlite3.Connection | Path) -> dict[str, dict[str, Any]]:
    """Row counts and digests of the live files, extending the ``previous`` manifest's digests over new rows; the
    bank's from its first row when it recorded updates in place (saved rows may have changed), its stable digest
    when the previous manifest has none (written before updates in place)."""
    n_cases, n_feedback = len(parts.bank), len(parts.feedback)
    old_cases, old_feedback = previous["live"][BANK_DB], previous["live"][FEEDBACK_NAME]
    again = bankfile.has_updates(bank_db)
    stable = old_cases.get("stable_digest")
    return {
        BANK_DB: {"rows": n_cases,
                  "digest": bankfile.digest(bank_db, n_cases, start=0 if again else old_cases["rows"],
                                             previous=None if again else old_cases["digest"]),
                  "stable_digest": bankfile.digest(bank_db, n_cases, start=0 if stable is None else old_cases["rows"],
                                                    previous=stable, stable=True)},
        FEEDBACK_NAME: {"rows": n_feedback,
                        "digest": feedback_rows_digest(feedback_db, n_feedback, start=old_feedback["rows"],
                                                       previous=old_feedback["digest"])},
    }


def _saved_manifest(parts: LiveParts, previous: dict[str, Any], files: dict[str, dict[str, Any]],
                    live: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The ``previous`` manifest as a new save writes it (creation time and source kept, one more save)."""
    manifest = {key: value for key, value in previous.items() if key not in ("files", "live")}
    manifest.update({"format": SELECTOR_FORMAT, "format_version": SELECTOR_FORMAT_VERSION,
                     "versions": library_versions(), "saved": now_iso(), "saved_unix": time.time(),
                     "saves": int(previous.get("saves", 1)) + 1, "dim": parts.spec.dim,
                     "learner_updates": int(parts.learner.updates), "files": files, "live": live})
    return manifest


def _write_card_and_manifest(directory: Path, name: Path, parts: LiveParts, previous: dict[str, Any],
                             live: dict[str, dict[str, Any]],
                             files: Callable[[], dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """The model card of the artifact at ``name`` into ``directory``, then the manifest (listing ``files()``,
    hashed after the card is written); returns the manifest."""
    draft = _saved_manifest(parts, previous, {}, live)
    atomic_write_text(directory / CARD_NAME, model_card(
        name, draft, parts.config, parts.spec, cases=len(parts.bank), feedbacks=len(parts.feedback),
        updates=int(parts.learner.updates), alpha=parts.alpha))
    manifest = _saved_manifest(parts, previous, files(), live)
    _write_manifest(directory, manifest)
    return manifest


def save_in_place(root: Path, parts: LiveParts, previous: dict[str, Any], *,
                  cache: dict[str, tuple[int, int, str]] | None = None) -> dict[str, Any]:
    """Save a loaded selector over its own artifact ``root``, crash-safely (see the module docstring): the state
    files, card and manifest staged in ``.save.tmp/``, then committed (:func:`commit_staged`). ``previous``:
    the manifest of the last save; returns the new one. ``cache``: :func:`hash_files`'s."""
    stage = root / STAGING_DIR
    check_tree(root)  # no symbolic link was planted since loading: nothing is read or written through one
    if stage.exists():
        shutil.rmtree(stage)
    stage.mkdir()
    write_parts(stage, parts.config, parts.spec, parts.learner, parts.buffer)
    checkpoint_live(root, parts.bank, parts.feedback)
    live = _live_entries(parts, previous, root / BANK_DB, parts.feedback.connection)
    manifest = _write_card_and_manifest(stage, root, parts, previous, live,
                                        lambda: hash_files({**listed_files(root), **listed_files(stage)}, cache))
    commit_staged(root)
    logger.info("saved selector %s (%d cases, %d feedbacks, %d updates)", root, live[BANK_DB]["rows"],
                live[FEEDBACK_NAME]["rows"], parts.learner.updates)
    return manifest


def save_copy(root: Path, target: Path, parts: LiveParts, previous: dict[str, Any], *,
              overwrite: bool = False) -> None:
    """Write a complete copy of the loaded selector of ``root`` to ``target`` (which must not exist, be an
    empty directory, or with ``overwrite`` an artifact to replace): assembled beside it, then swapped in."""
    if target.is_symlink():
        raise CheckpointError(f"{target}: a symbolic link; save() writes a new artifact directory there, not "
                              "through a link")
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        if not overwrite:
            raise CheckpointError(f"{target}: already exists and is not an empty directory; save() writes a new "
                                  "artifact there (save() without a path saves in place)")
        if not (target / MANIFEST_NAME).is_file():
            raise CheckpointError(f"{target}: exists and is not a selector artifact; refusing to replace it")
    check_tree(root)  # the files copied from are read through no symbolic link
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}"
    if tmp.is_symlink():
        tmp.unlink()
    elif tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    try:
        write_parts(tmp, parts.config, parts.spec, parts.learner, parts.buffer)
        parts.bank.flush()
        (tmp / BANK_DIR).mkdir()
        sqlite_copy(root / BANK_DB, tmp / BANK_DB)
        for name in REBUILT_FILES:
            if (root / name).is_file():
                shutil.copy2(root / name, tmp / name)
        sqlite_copy(root / FEEDBACK_NAME, tmp / FEEDBACK_NAME)
        live = _live_entries(parts, previous, tmp / BANK_DB, tmp / FEEDBACK_NAME)
        _write_card_and_manifest(tmp, target, parts, previous, live, lambda: hash_files(listed_files(tmp)))
        fsync_tree(tmp)
        swap_in(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    logger.info("saved a copy of selector %s to %s", root, target)


# ---------------------------------------------------------------- the published policy (several processes)


def write_policy(root: Path, tensors: dict[str, torch.Tensor], learner: SoftQLearner, version: int) -> None:
    """Publish ``tensors`` (the Q-network's as ``qnet.*`` and ``log_alpha``, copied from ``learner``) at ``version``
    (learner updates) to the artifact ``root``'s ``.policy.safetensors``, atomically (see
    :meth:`memento.Selector.publish_policy`)."""
    _write_tensors(root / POLICY_NAME, tensors, POLICY_FORMAT, learner, version=str(version))


def read_policy(root: Path, learner: SoftQLearner) -> tuple[dict[str, Any], int]:
    """The Q-network a learner published in the artifact ``root`` (:func:`write_policy`), checked against
    ``learner``'s: ``({"qnet": state_dict, "log_alpha": tensor}, version)``. Opened without following a symbolic
    link; any problem is a one-line ``CheckpointError`` naming the file."""
    import errno
    import stat as stat_

    from safetensors.torch import load as load_safetensors

    path = root / POLICY_NAME
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as error:
        what = "a symbolic link; refusing it" if error.errno == errno.ELOOP else f"cannot open it ({error.strerror})"
        raise CheckpointError(f"{path}: {what}") from None
    with os.fdopen(fd, "rb") as handle:
        if not stat_.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise CheckpointError(f"{path}: not a regular file; refusing it")
        data = handle.read()
    try:
        (size,) = np.frombuffer(data[:8], dtype="<u8")
        metadata = json.loads(data[8:8 + int(size)]).get("__metadata__") or {}
        tensors = load_safetensors(data)
    except Exception as error:  # noqa: BLE001 - safetensors raises its own error types for damaged files
        raise CheckpointError(f"{path}: not a readable safetensors file ({' '.join(str(error).split())})") from None
    if metadata.get("format") != POLICY_FORMAT or not str(metadata.get("version", "")).isdigit():
        raise CheckpointError(f"{path}: not a published memento policy (format {metadata.get('format')!r})")
    _check_qnet_config(path, metadata, learner, "this selector's")
    state = {name[len("qnet."):]: value for name, value in tensors.items() if name.startswith("qnet.")}
    own = learner.qnet.state_dict()
    if set(state) != set(own) or any(tuple(state[n].shape) != tuple(v.shape) for n, v in own.items()):
        raise CheckpointError(f"{path}: its tensors do not fit this selector's Q-network")
    out: dict[str, Any] = {"qnet": state}
    if "log_alpha" in tensors:
        out["log_alpha"] = tensors["log_alpha"]
    return out, int(metadata["version"])
