"""The selector artifact on disk (docs/formats.md, "Selector artifact"): an artifact assembled from parts that save,
load and check themselves, its manifest, checksums and crash-safe saves.

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

**The code.** Each part is one class in :mod:`~memento.selector.artifact.parts` (``config.json``, ``encoder.json``,
``qnet.safetensors``, ``learner/``, ``replay/``, ``bank/``, ``feedback.sqlite``, ``README.md``, in that order:
:data:`~memento.selector.artifact.parts.PARTS`); this module runs the steps over them (:func:`write_artifact`,
:func:`save_in_place`, :func:`save_copy`, :func:`check_artifact`) and commits staged saves. The manifest has one
owner, :mod:`~memento.selector.artifact.manifest` (its name, reading, writing, updating, :func:`verify_artifact`);
the rest: :mod:`~.layout` (file and format names), :mod:`~.files` (confined hashing and fsyncs), :mod:`~.configs`
(:class:`SelectorConfig`, :class:`EncoderSpec`), :mod:`~.feedback` (the feedback log), :mod:`~.bank` (the bank's
checks), :mod:`~.qnet` (Q-network files, the published policy), :mod:`~.card` (the model card). Adding a part is
one class in ``parts.py`` and one line in ``PARTS``.

Nothing here is unpickled: JSON, safetensors and SQLite only.
"""

# ruff: noqa: F401 - besides __all__, the names this module held before it became a package stay importable here

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import memento.selector.artifact.parts as _parts
from memento.bank.local import CaseBank
from memento.errors import CheckpointError
from memento.io import fsync_dir
from memento.learn.learner import SoftQLearner
from memento.learn.replay import ReplayBuffer
from memento.selector.artifact.bank import check_bank_file, check_bank_meta_files
from memento.selector.artifact.card import card_front_matter, model_card
from memento.selector.artifact.configs import (
    EncoderKind,
    EncoderSpec,
    SelectorConfig,
    SelectorPolicy,
    load_encoder,
    read_encoder_spec,
    write_encoder_spec,
)
from memento.selector.artifact.feedback import (
    FeedbackLog,
    FeedbackRow,
    check_feedback_file,
    feedback_rows_digest,
    feedback_with_case,
)
from memento.selector.artifact.files import check_entry, check_tree, file_sha256, fsync_tree, inside, real_dir, swap_in
from memento.selector.artifact.layout import (
    BANK_DB,
    BANK_DIR,
    CARD_NAME,
    CONFIG_NAME,
    DERIVED_FILES,
    ENCODER_FILES_DIR,
    ENCODER_FORMAT,
    ENCODER_FORMAT_VERSION,
    ENCODER_NAME,
    FEEDBACK_FORMAT,
    FEEDBACK_FORMAT_VERSION,
    FEEDBACK_NAME,
    POLICY_FORMAT,
    POLICY_NAME,
    QNET_FORMAT,
    QNET_NAME,
    READY_DIR,
    REBUILT_FILES,
    SELECTOR_FORMAT,
    SELECTOR_FORMAT_VERSION,
    STAGING_DIR,
)
from memento.selector.artifact.manifest import (
    MANIFEST_NAME,
    has_manifest,
    hash_files,
    library_versions,
    listed_files,
    new_manifest,
    now_iso,
    read_manifest,
    resaved_manifest,
    verify_artifact,
    write_manifest,
)
from memento.selector.artifact.parts import LIVE_FILES, REQUIRED_FILES, Loaded, SaveJob, SaveKind, check_dims
from memento.selector.artifact.qnet import read_policy, write_policy, write_qnet

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


# ---------------------------------------------------------------- crash-safe in-place saves


def commit_staged(root: Path) -> None:
    """Rename ``.save.tmp`` to ``.save.ready`` (the commit point), then move its files into place."""
    stage, ready = root / STAGING_DIR, root / READY_DIR
    if not real_dir(stage):
        raise CheckpointError(f"{stage}: no staged save to commit")
    fsync_tree(stage)
    if real_dir(ready):
        shutil.rmtree(ready)
    os.replace(stage, ready)
    fsync_dir(root)
    _apply_ready(root)


def _apply_ready(root: Path) -> None:
    ready = root / READY_DIR
    if not real_dir(ready):
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
        dst = inside(root, src.relative_to(ready))
        dst.parent.mkdir(parents=True, exist_ok=True)
        inside(root, src.relative_to(ready))  # the directories made just now are plain ones
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
    if real_dir(root / READY_DIR):
        logger.warning("%s: finishing a save that was interrupted", root)
        _apply_ready(root)
    if real_dir(root / STAGING_DIR):
        logger.warning("%s: dropping an incomplete save", root)
        shutil.rmtree(root / STAGING_DIR, ignore_errors=True)


# ---------------------------------------------------------------- saving: every part, then the manifest


def _save_parts(job: SaveJob, previous: dict[str, Any] | None, source: dict[str, Any] | None,
                hashed: Callable[[], dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """Every part of :data:`PARTS` saves itself for ``job`` (in order; the card from the draft manifest), then the
    manifest is written, last, listing ``hashed()`` (hashed after the parts wrote their files); returns it.
    ``previous``: the last save's manifest (``None`` for a new artifact, whose manifest records ``source``)."""
    job.directory.mkdir(parents=True, exist_ok=True)
    drafts: list[dict[str, Any]] = []

    def draft() -> dict[str, Any]:
        if not drafts:
            live = {part.live: part.entry(job, None if previous is None else previous["live"][part.live])
                    for part in _parts.LIVE_PARTS}
            drafts.append(
                new_manifest(source=source or {}, dim=job.spec.dim, learner_updates=job.learner.updates, live=live)
                if previous is None else
                resaved_manifest(previous, dim=job.spec.dim, learner_updates=int(job.learner.updates), files={},
                                 live=live))
        return drafts[0]

    job.draft = draft
    for part in _parts.PARTS:
        part.save(job)
    files = hashed()
    if previous is None:  # a new artifact: created and saved at the same time
        manifest = {**draft(), "files": files}
    else:
        manifest = resaved_manifest(previous, dim=job.spec.dim, learner_updates=int(job.learner.updates),
                                    files=files, live=draft()["live"])
    write_manifest(job.directory, manifest)
    return manifest


def write_artifact(tmp: Path, out: Path, *, learner: SoftQLearner, buffer: ReplayBuffer, config: SelectorConfig,
                   spec: EncoderSpec, cases: int, source: dict[str, Any]) -> None:
    """A new artifact: every part into ``tmp`` (which holds ``bank/`` with ``cases`` rows already; the feedback log
    starts empty), the manifest last; then ``tmp`` is swapped in for ``out``.

    The one writer of a new artifact (reached through :meth:`memento.Selector.create`; ``memento.selector.export``
    resolves where its parts come from); a loaded selector saves itself with :meth:`memento.Selector.save`
    (:func:`save_in_place`, :func:`save_copy`), through the same parts.
    """
    job = SaveJob(kind="new", directory=tmp, source=tmp, target=out, config=config, spec=spec, learner=learner,
                  buffer=buffer, alpha=learner.alpha, new_cases=cases)
    _save_parts(job, None, source, lambda: hash_files(listed_files(tmp)))
    fsync_tree(tmp)
    swap_in(tmp, out)


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

    def job(self, kind: SaveKind, directory: Path, source: Path, target: Path) -> SaveJob:
        return SaveJob(kind=kind, directory=directory, source=source, target=target,
                       config=self.config, spec=self.spec, learner=self.learner, buffer=self.buffer, alpha=self.alpha,
                       bank=self.bank, feedback=self.feedback)


def checkpoint_live(root: Path, bank: CaseBank, feedback: FeedbackLog) -> None:
    """Flush the bank's index and move both live SQLite files' committed rows into their main files (so
    their bytes are what a checksum, a copy or an upload sees)."""
    for part in _parts.LIVE_PARTS:
        part.checkpoint(root, bank, feedback)


def save_in_place(root: Path, parts: LiveParts, previous: dict[str, Any], *,
                  cache: dict[str, tuple[int, int, str]] | None = None) -> dict[str, Any]:
    """Save a loaded selector over its own artifact ``root``, crash-safely (see the module docstring): the state
    files, card and manifest staged in ``.save.tmp/`` (the live files checkpointed where they are), then committed
    (:func:`commit_staged`). ``previous``: the manifest of the last save; returns the new one. ``cache``:
    :func:`hash_files`'s."""
    stage = root / STAGING_DIR
    check_tree(root)  # no symbolic link was planted since loading: nothing is read or written through one
    if stage.exists():
        shutil.rmtree(stage)
    stage.mkdir()
    manifest = _save_parts(parts.job("in_place", stage, root, root), previous, None,
                           lambda: hash_files({**listed_files(root), **listed_files(stage)}, cache))
    commit_staged(root)
    logger.info("saved selector %s (%d cases, %d feedbacks, %d updates)", root, manifest["live"][BANK_DB]["rows"],
                manifest["live"][FEEDBACK_NAME]["rows"], parts.learner.updates)
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
        if not has_manifest(target):
            raise CheckpointError(f"{target}: exists and is not a selector artifact; refusing to replace it")
    check_tree(root)  # the files copied from are read through no symbolic link
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}"
    if tmp.is_symlink():
        tmp.unlink()
    elif tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    try:
        _save_parts(parts.job("copy", tmp, root, target), previous, None, lambda: hash_files(listed_files(tmp)))
        fsync_tree(tmp)
        swap_in(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    logger.info("saved a copy of selector %s to %s", root, target)


# ---------------------------------------------------------------- checking: every part, in order


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
    artifact, checksums (``verify``: :func:`verify_artifact`); then each part loads its files (:meth:`Part.load`:
    ``config.json``, ``encoder.json``, the learner (``learner.json``, every tensor of ``learner.safetensors``,
    ``learner/config.json``) and the replay buffer (``replay.json``, ``replay.safetensors``) on ``device``), and
    checks them against the others (:meth:`Part.check`: the learner's Q-network against ``config.json``'s,
    ``qnet.safetensors`` against the learner, the bank's ``cases.sqlite`` (format, version, config, embeddings),
    the embedding dimension of every part, and ``feedback.sqlite`` (format, version, rows)). Any problem is a
    one-line ``CheckpointError`` (or ``DimensionError``) naming the file.
    """
    path = Path(path)
    report = verify_artifact(path, cache=cache) if verify else None
    manifest = report["manifest"] if report is not None else read_manifest(path)
    got = Loaded(root=path, device=device, recorded={MANIFEST_NAME: manifest["dim"]})
    for part in _parts.PARTS:
        part.load(got)
    for part in _parts.PARTS:
        part.check(got)
    dims = got.dims()
    check_dims(path, dims)
    assert got.config is not None and got.spec is not None and got.learner is not None and got.buffer is not None
    return CheckedArtifact(manifest=manifest, config=got.config, spec=got.spec, learner=got.learner,
                           buffer=got.buffer, dims=dims, report=report)
