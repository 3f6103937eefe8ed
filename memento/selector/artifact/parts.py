"""The parts of a selector artifact, in order (:data:`PARTS`): each is one class that saves, loads and checks its own
files.

The idea is sentence-transformers' (a model is an ordered list of modules, each saving and loading itself, listed
in ``modules.json``); here the list is code, and the manifest (:mod:`memento.selector.artifact.manifest`) stays
the one record on disk, with its digests. A part declares the files every manifest lists (:attr:`Part.files`)
and implements what it does at each step; the assembler (:mod:`memento.selector.artifact`) runs the steps over
:data:`PARTS` in order:

- :meth:`Part.save` for every save: a new artifact (:func:`~memento.selector.artifact.write_artifact`), a save in
  place (:func:`~memento.selector.artifact.save_in_place`) or a copy (:func:`~memento.selector.artifact.save_copy`),
  told apart by :attr:`SaveJob.kind`;
- :meth:`Part.load` (read its own files, check their formats), then :meth:`Part.check` (against the other parts)
  for :func:`~memento.selector.artifact.check_artifact`; :meth:`Part.dims` is the embedding dimension it records;
- a :class:`LivePart` (a SQLite file that grows between saves) also gives its manifest record (:meth:`LivePart.entry`)
  and how :func:`~memento.selector.artifact.verify_artifact` accepts rows appended since the save.

Adding a part is one class here and one line in :data:`PARTS`.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch

from memento import sqlite
from memento.bank import bankfile
from memento.bank.local import CaseBank
from memento.config import QNetConfig, load_json, parses_to, save_json, to_dict
from memento.errors import CheckpointError, ConfigError, DimensionError
from memento.io import atomic_write_text, read_json, sqlite_copy
from memento.learn.learner import SoftQLearner
from memento.learn.replay import ReplayBuffer
from memento.selector.artifact.bank import check_bank_file, check_bank_meta_files, count_bank_rows
from memento.selector.artifact.card import model_card
from memento.selector.artifact.configs import EncoderSpec, SelectorConfig, read_encoder_spec, write_encoder_spec
from memento.selector.artifact.feedback import (
    FeedbackLog,
    check_feedback_file,
    count_feedback_rows,
    feedback_rows_digest,
)
from memento.selector.artifact.layout import (
    BANK_DB,
    BANK_DIR,
    CARD_NAME,
    CONFIG_NAME,
    ENCODER_FILES_DIR,
    ENCODER_NAME,
    FEEDBACK_NAME,
    LEARNER_DIR,
    QNET_NAME,
    REBUILT_FILES,
    REPLAY_DIR,
)
from memento.selector.artifact.qnet import check_qnet_file, write_qnet

__all__ = ["LIVE_FILES", "PARTS", "REQUIRED_FILES", "BankPart", "CardPart", "ConfigPart", "EncoderPart",
           "FeedbackPart", "LearnerPart", "LivePart", "Loaded", "Part", "QNetPart", "ReplayPart", "SaveJob", "SaveKind",
           "check_dims"]

SaveKind = Literal["new", "in_place", "copy"]


@dataclasses.dataclass(kw_only=True)
class SaveJob:
    """One save, as the parts see it.

    - ``kind``: ``"new"`` (an artifact written for the first time: its ``bank/`` is already in ``directory``),
      ``"in_place"`` (a loaded selector over its own artifact: state files staged in ``.save.tmp/``, the live files
      stay where they are) or ``"copy"`` (a loaded selector written whole to another directory);
    - ``directory``: where the parts write their files; ``source``: the artifact saved from (``directory`` for a
      new one); ``target``: the artifact's path once the save is done (the model card names it);
    - the state saved: ``config``, ``spec``, ``learner``, ``buffer``, ``alpha`` (the temperature in use, for the
      card), the open ``bank`` and ``feedback`` log of a loaded selector (``None`` for a new artifact, which has
      ``new_cases`` cases and no feedback);
    - ``draft``: the manifest as the save will write it, less its file list (the card is written from it).
    """

    kind: SaveKind
    directory: Path
    source: Path
    target: Path
    config: SelectorConfig
    spec: EncoderSpec
    learner: SoftQLearner
    buffer: ReplayBuffer
    alpha: float
    bank: CaseBank | None = None
    feedback: FeedbackLog | None = None
    new_cases: int = 0
    draft: Callable[[], dict[str, Any]] = dataclasses.field(default=lambda: {})

    @property
    def live_dir(self) -> Path:
        """Where the live files are read after their part saved: the artifact itself when saving in place."""
        return self.source if self.kind == "in_place" else self.directory

    def cases(self) -> int:
        return self.new_cases if self.bank is None else len(self.bank)

    def feedbacks(self) -> int:
        return 0 if self.feedback is None else len(self.feedback)


def check_dims(path: Path, dims: dict[str, int]) -> None:
    if len(set(dims.values())) > 1:
        listed = ", ".join(f"{name} dim={d}" for name, d in dims.items())
        raise DimensionError(f"{path}: the parts of this selector disagree on the embedding dimension: {listed}")


@dataclasses.dataclass(kw_only=True)
class Loaded:
    """What the parts of the artifact at ``root`` have loaded so far (on ``device``), for the checks that compare
    them; ``recorded``: the dimensions the manifest records (listed after the parts')."""

    root: Path
    device: str | torch.device
    recorded: dict[str, int]
    config: SelectorConfig | None = None
    spec: EncoderSpec | None = None
    learner: SoftQLearner | None = None
    buffer: ReplayBuffer | None = None
    bank: dict[str, int] | None = None

    def dims(self) -> dict[str, int]:
        """The embedding dimension each part records: the part that fixes it first (:attr:`Part.defines_dim`: the
        encoder, whose vectors the queries are), then the others in order, then the manifest's."""
        ordered = [part for part in PARTS if part.defines_dim] + [part for part in PARTS if not part.defines_dim]
        out: dict[str, int] = {}
        for part in ordered:
            out.update(part.dims(self))
        out.update(self.recorded)
        return out

    def agreed_dim(self) -> int:
        """The dimension every part agrees on (``DimensionError`` listing them all otherwise)."""
        dims = self.dims()
        check_dims(self.root, dims)
        return next(iter(dims.values()))


class Part:
    """One part of a selector artifact (see the module docstring). Subclasses set :attr:`files` and override the
    steps they take part in; the defaults do nothing."""

    files: ClassVar[tuple[str, ...]] = ()
    """The files every artifact's manifest lists for this part."""
    defines_dim: ClassVar[bool] = False
    """Whether this part fixes the embedding dimension the others must equal (listed first in a mismatch)."""
    loaded_dirs: ClassVar[tuple[str, ...]] = ()
    """Directories loaded as a whole (a model's files): every file in them must be listed in the manifest."""

    def save(self, job: SaveJob) -> None:
        """Write this part's files for ``job`` into ``job.directory``."""

    def load(self, got: Loaded) -> None:
        """Read this part's files from ``got.root`` into ``got``, checking their formats."""

    def check(self, got: Loaded) -> None:
        """Check this part's files against what the other parts loaded."""

    def dims(self, got: Loaded) -> dict[str, int]:
        """The embedding dimension this part records, by what the error message calls it."""
        return {}


class ConfigPart(Part):
    """``config.json``: the :class:`SelectorConfig`."""

    files = (CONFIG_NAME,)

    def save(self, job: SaveJob) -> None:
        save_json(job.config, job.directory / CONFIG_NAME)

    def load(self, got: Loaded) -> None:
        try:
            got.config = load_json(SelectorConfig, got.root / CONFIG_NAME)
        except ConfigError as error:
            raise CheckpointError(f"{got.root / CONFIG_NAME}: not a selector config ({error})") from None

    def check(self, got: Loaded) -> None:
        assert got.config is not None and got.learner is not None
        qnet_config = to_dict(got.learner.qnet.config)
        if qnet_config != to_dict(got.config.qnet):
            raise CheckpointError(f"{got.root / LEARNER_DIR}: Q-network {qnet_config} differs from {CONFIG_NAME}'s "
                                  f"{to_dict(got.config.qnet)}")

    def dims(self, got: Loaded) -> dict[str, int]:
        return {} if got.config is None else {f"{CONFIG_NAME} (Q-network)": got.config.qnet.dim}


class EncoderPart(Part):
    """``encoder.json`` (:class:`EncoderSpec`) and, for a local encoder, its files in ``encoder/``."""

    files = (ENCODER_NAME,)
    defines_dim = True
    loaded_dirs = (ENCODER_FILES_DIR,)

    def save(self, job: SaveJob) -> None:
        write_encoder_spec(job.directory / ENCODER_NAME, job.spec)

    def load(self, got: Loaded) -> None:
        got.spec = read_encoder_spec(got.root / ENCODER_NAME)

    def dims(self, got: Loaded) -> dict[str, int]:
        return {} if got.spec is None else {f"{ENCODER_NAME}": got.spec.dim}


class QNetPart(Part):
    """``qnet.safetensors``: the online Q-network's tensors, for consumers that only score; the learner's own."""

    files = (QNET_NAME,)

    def save(self, job: SaveJob) -> None:
        write_qnet(job.directory / QNET_NAME, job.learner)

    def check(self, got: Loaded) -> None:
        assert got.learner is not None
        check_qnet_file(got.root / QNET_NAME, got.learner)


class LearnerPart(Part):
    """``learner/``: :meth:`SoftQLearner.save` (both networks, optimiser state, alpha, update counter, generator)."""

    files = (f"{LEARNER_DIR}/learner.safetensors", f"{LEARNER_DIR}/learner.json", f"{LEARNER_DIR}/config.json")

    def save(self, job: SaveJob) -> None:
        job.learner.save(job.directory / LEARNER_DIR)

    def load(self, got: Loaded) -> None:
        got.learner = SoftQLearner.load(got.root / LEARNER_DIR, device=got.device)
        _check_learner_config(got.root / LEARNER_DIR / CONFIG_NAME, got.learner)

    def dims(self, got: Loaded) -> dict[str, int]:
        return {} if got.learner is None else {f"{LEARNER_DIR}/ (Q-network)": got.learner.qnet.config.dim}


def _check_learner_config(path: Path, learner: SoftQLearner) -> None:
    """``learner/config.json`` must describe the learner that ``learner.json`` holds."""
    saved = read_json(path, error=CheckpointError, what="learner config")  # bad JSON of any kind: one line
    if (not isinstance(saved, dict) or not parses_to(QNetConfig, saved.get("qnet"), learner.qnet.config)
            or not parses_to(type(learner.config), saved.get("learner"), learner.config)):
        raise CheckpointError(f"{path}: does not describe the learner of {LEARNER_DIR}/learner.json (Q-network "
                              f"{to_dict(learner.qnet.config)})")


class ReplayPart(Part):
    """``replay/``: :meth:`ReplayBuffer.save`, the decisions the learner samples from."""

    files = (f"{REPLAY_DIR}/replay.safetensors", f"{REPLAY_DIR}/replay.json")

    def save(self, job: SaveJob) -> None:
        job.buffer.save(job.directory / REPLAY_DIR)

    def load(self, got: Loaded) -> None:
        got.buffer = ReplayBuffer.load(got.root / REPLAY_DIR, device=got.device)

    def dims(self, got: Loaded) -> dict[str, int]:
        return {} if got.buffer is None else {f"{REPLAY_DIR}/": got.buffer.config.dim}


class LivePart(Part):
    """A part whose SQLite file (:attr:`live`) grows between saves: the manifest records its row count and a chained
    digest of its rows (:meth:`entry`); a file whose hash no longer matches is accepted when rows were only
    appended (:meth:`rows_rewritten`, :meth:`saved_rows_intact`; see
    :func:`memento.selector.artifact.manifest.verify_artifact`)."""

    live: ClassVar[str]
    rows_name: ClassVar[str]
    """What its rows are called in messages."""
    rebuilt: ClassVar[tuple[str, ...]] = ()
    """Files derived from :attr:`live`, which may differ from the manifest (or be missing) once rows were appended."""

    def entry(self, job: SaveJob, previous: dict[str, Any] | None) -> dict[str, Any]:
        """The manifest's record of :attr:`live` after ``job`` (``previous``: the last save's, extended over the new
        rows; ``None`` for a new artifact)."""
        raise NotImplementedError

    def checkpoint(self, root: Path, bank: CaseBank, feedback: FeedbackLog) -> None:
        """Move committed rows into the main file of ``root``'s :attr:`live` file (its bytes are then what a
        checksum, a copy or an upload sees)."""

    def count(self, path: Path) -> int:
        raise NotImplementedError

    def rows_rewritten(self, path: Path) -> bool:
        """Whether the file at ``path`` records changes to saved rows (so the same row count may hash otherwise)."""
        return False

    def saved_rows_intact(self, path: Path, saved: dict[str, Any]) -> bool:
        """Whether the first ``saved["rows"]`` rows at ``path`` are the ones the manifest recorded."""
        raise NotImplementedError


class BankPart(LivePart):
    """``bank/``: the case bank, ``cases.sqlite`` (live: :meth:`memento.Selector.add_case` commits there) and the
    index and vector files rebuilt from it."""

    files = (BANK_DB,)
    live = BANK_DB
    rows_name = "cases"
    rebuilt = REBUILT_FILES

    def save(self, job: SaveJob) -> None:
        if job.kind == "in_place":
            self.checkpoint(job.source, job.bank, job.feedback)  # type: ignore[arg-type]
        elif job.kind == "copy":
            assert job.bank is not None
            job.bank.flush()
            (job.directory / BANK_DIR).mkdir()
            sqlite_copy(job.source / BANK_DB, job.directory / BANK_DB)
            for name in REBUILT_FILES:
                if (job.source / name).is_file():
                    shutil.copy2(job.source / name, job.directory / name)
        # a new artifact's bank/ is staged before its parts are written

    def checkpoint(self, root: Path, bank: CaseBank, feedback: FeedbackLog) -> None:
        bank.flush()
        sqlite.checkpoint(root / BANK_DB)

    def entry(self, job: SaveJob, previous: dict[str, Any] | None) -> dict[str, Any]:
        db, n = job.live_dir / BANK_DB, job.cases()
        if previous is None:
            return {"rows": n, "digest": bankfile.digest(db, n), "stable_digest": bankfile.digest(db, n, stable=True)}
        # from the first row when the bank recorded updates in place (saved rows may have changed); the stable digest
        # from the first row when the previous manifest has none (written before updates in place)
        again = bankfile.has_updates(db)
        stable = previous.get("stable_digest")
        return {"rows": n,
                "digest": bankfile.digest(db, n, start=0 if again else previous["rows"],
                                          previous=None if again else previous["digest"]),
                "stable_digest": bankfile.digest(db, n, start=0 if stable is None else previous["rows"],
                                                 previous=stable, stable=True)}

    def check(self, got: Loaded) -> None:
        got.bank = check_bank_file(got.root / BANK_DB)
        check_bank_meta_files(got.root / BANK_DIR)

    def dims(self, got: Loaded) -> dict[str, int]:
        if got.bank is None:
            return {}
        out = {f"{BANK_DIR}/": got.bank["dim"]}
        if "embedding_dim" in got.bank:
            out[f"{BANK_DIR}/ (faiss index and embeddings)"] = got.bank["embedding_dim"]
        return out

    def count(self, path: Path) -> int:
        return count_bank_rows(path)

    def rows_rewritten(self, path: Path) -> bool:
        return bankfile.has_tombstones(path) or bankfile.has_updates(path)

    def saved_rows_intact(self, path: Path, saved: dict[str, Any]) -> bool:
        # cases updated in place (recorded): what no update changes must be
        if bankfile.digest(path, saved["rows"]) == saved["digest"]:
            return True
        return (bankfile.has_updates(path) and "stable_digest" in saved
                and bankfile.digest(path, saved["rows"], stable=True) == saved["stable_digest"])


class FeedbackPart(LivePart):
    """``feedback.sqlite``: the feedback log (live: :meth:`memento.Selector.feedback` commits there)."""

    files = (FEEDBACK_NAME,)
    live = FEEDBACK_NAME
    rows_name = "feedback"

    def save(self, job: SaveJob) -> None:
        if job.kind == "new":
            FeedbackLog.create(job.directory / FEEDBACK_NAME).close()
        elif job.kind == "in_place":
            self.checkpoint(job.source, job.bank, job.feedback)  # type: ignore[arg-type]
        else:
            sqlite_copy(job.source / FEEDBACK_NAME, job.directory / FEEDBACK_NAME)

    def checkpoint(self, root: Path, bank: CaseBank, feedback: FeedbackLog) -> None:
        feedback.checkpoint()

    def entry(self, job: SaveJob, previous: dict[str, Any] | None) -> dict[str, Any]:
        db: Any = job.directory / FEEDBACK_NAME
        if job.kind == "in_place":
            assert job.feedback is not None
            db = job.feedback.connection
        n = job.feedbacks()
        return {"rows": n, "digest": feedback_rows_digest(db, n, start=0 if previous is None else previous["rows"],
                                                          previous=None if previous is None else previous["digest"])}

    def check(self, got: Loaded) -> None:
        check_feedback_file(got.root / FEEDBACK_NAME, got.agreed_dim())

    def count(self, path: Path) -> int:
        return count_feedback_rows(path)

    def saved_rows_intact(self, path: Path, saved: dict[str, Any]) -> bool:
        return feedback_rows_digest(path, saved["rows"]) == saved["digest"]


class CardPart(Part):
    """``README.md``: the model card, from the manifest the save writes (:func:`model_card`)."""

    files = (CARD_NAME,)

    def save(self, job: SaveJob) -> None:
        atomic_write_text(job.directory / CARD_NAME, model_card(
            job.target, job.draft(), job.config, job.spec, cases=job.cases(), feedbacks=job.feedbacks(),
            updates=int(job.learner.updates), alpha=job.alpha))


PARTS: tuple[Part, ...] = (ConfigPart(), EncoderPart(), QNetPart(), LearnerPart(), ReplayPart(), BankPart(),
                           FeedbackPart(), CardPart())
"""The parts of every artifact, in the order they are saved and loaded (the card last: it reports the others)."""
LIVE_PARTS: tuple[LivePart, ...] = tuple(part for part in PARTS if isinstance(part, LivePart))

REQUIRED_FILES = tuple(name for part in PARTS for name in part.files)
"""Files every artifact's manifest must list."""
LIVE_FILES = tuple(part.live for part in LIVE_PARTS)
"""SQLite files that grow between saves (new cases, feedback)."""
