"""The directory of one online run: its layout, its checkpoints and what it has written.

:class:`RunDir` is the one owner of that layout (the online loop writes through it, the export step
reads through it)::

    config.json      the run's LoopConfig
    run.json         what else the run used: encoder, planner, judge, task count and fingerprint, device
    bank/            the case bank (SQLite commits every step)
    steps.jsonl      one record per step: the transition log (memento.formats.StepRecord)
    labels.jsonl     the online labels, when the policy learns from them (memento.learn.labels.LabelRow rows)
    episodes.jsonl   one record per episode (game runs, memento.runs.games)
    tb/              TensorBoard event files
    checkpoint/      the last complete checkpoint (state.json, config.json, steps.jsonl, the policy's state)
    summary.json     written at the end
    selector/        the trained model, when the policy has one (soft-Q: SoftQLearner.save)

A checkpoint is written into ``checkpoint.tmp`` and swapped in for ``checkpoint`` (the previous one is
moved to ``checkpoint.old`` for the instant of the swap); ``state.json`` is written last, so a
directory holding one is complete, and :meth:`RunDir.latest_checkpoint` takes the newest complete one
of the three.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any

from memento.config import from_dict, to_dict
from memento.errors import CheckpointError, ConfigError
from memento.io import fsync_dir, write_json

__all__ = ["CHECKPOINT_FORMAT", "CHECKPOINT_FORMAT_VERSION", "CHECKPOINT_KINDS", "RunDir", "check_saved_config",
           "read_json", "write_json"]

logger = logging.getLogger(__name__)

CHECKPOINT_FORMAT = "memento-online-checkpoint"
CHECKPOINT_FORMAT_VERSION = 2
"""2: the LoopConfig nests its policy's config (``policy: {"kind": ...}``); 1: flat policy fields."""

CHECKPOINT_KINDS: dict[str | None, str] = {None: "question-answering", "games": "game"}
"""The run that writes each kind of checkpoint (``state.json``'s ``kind``; none: the online loop's, written before
checkpoints were tagged), by the name a refused resume gives it (``a game run's checkpoint``)."""


def read_json(path: Path) -> Any:
    """Parsed JSON; an unreadable or malformed file is a one-line ``CheckpointError`` naming it."""
    from memento.io import read_json as read_any_json

    return read_any_json(path, error=CheckpointError, what="run file")  # digits, depth, surrogates: one line


def check_saved_config(ckpt: Path, cls: type, config: Any, resumable: tuple[str, ...]) -> None:
    """A checkpoint's ``config.json`` must parse as ``cls`` and equal ``config`` but for the ``resumable``
    fields; otherwise a one-line :class:`CheckpointError` naming the differing fields."""
    try:
        saved = from_dict(cls, read_json(Path(ckpt) / RunDir.CONFIG))
    except ConfigError as error:
        raise CheckpointError(f"{Path(ckpt) / RunDir.CONFIG}: not this memento's {cls.__name__} ({error})") from None
    ours, theirs = to_dict(config), to_dict(saved)
    changed = sorted(f for f in ours if ours[f] != theirs[f] and f not in resumable)
    if changed:
        raise CheckpointError(f"{ckpt}: saved with another configuration; differing field(s): "
                              + ", ".join(f"{f}={theirs[f]!r} (now {ours[f]!r})" for f in changed))


class RunDir:
    """One run directory (see the module docstring). Creating the object touches nothing on disk."""

    CONFIG = "config.json"
    RUN_INFO = "run.json"
    BANK = "bank"
    STEPS = "steps.jsonl"
    LABELS = "labels.jsonl"
    EPISODES = "episodes.jsonl"
    TENSORBOARD = "tb"
    CHECKPOINT = "checkpoint"
    SUMMARY = "summary.json"
    SELECTOR = "selector"
    STATE = "state.json"
    _SWAP = ("checkpoint.tmp", "checkpoint.old")

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    def __fspath__(self) -> str:
        return str(self.path)

    # ------------------------------------------------------------------ paths

    @property
    def config_path(self) -> Path:
        return self.path / self.CONFIG

    @property
    def run_info_path(self) -> Path:
        return self.path / self.RUN_INFO

    @property
    def bank(self) -> Path:
        return self.path / self.BANK

    @property
    def steps(self) -> Path:
        return self.path / self.STEPS

    @property
    def labels(self) -> Path:
        """The online labels (``memento score``'s format), when the run's policy learns from them."""
        return self.path / self.LABELS

    @property
    def episodes(self) -> Path:
        return self.path / self.EPISODES

    @property
    def tensorboard(self) -> Path:
        return self.path / self.TENSORBOARD

    @property
    def checkpoint(self) -> Path:
        return self.path / self.CHECKPOINT

    @property
    def summary_path(self) -> Path:
        return self.path / self.SUMMARY

    @property
    def selector(self) -> Path:
        return self.path / self.SELECTOR

    def is_run(self) -> bool:
        """Whether this looks like a run directory (a config and a bank)."""
        return self.config_path.is_file() and self.bank.is_dir()

    def files(self) -> list[Path]:
        """The run files that exist (what a fresh run would overwrite)."""
        names = (self.BANK, self.STEPS, self.LABELS, self.EPISODES, self.TENSORBOARD, self.CHECKPOINT, *self._SWAP,
                 self.SUMMARY, self.SELECTOR, self.CONFIG, self.RUN_INFO)
        return [self.path / name for name in names if (self.path / name).exists()]

    def start(self, resume: bool) -> Path | None:
        """The checkpoint a run continues from: the newest complete one with ``resume``; otherwise (or when there
        is none) the run starts afresh, clearing the run files, and a directory that already holds a run is refused
        without ``resume``."""
        ckpt = self.latest_checkpoint() if resume else None
        if ckpt is None:
            existing = self.files()
            if existing and not resume:
                raise ConfigError(f"{self.path}: already holds a run ({', '.join(p.name for p in existing)}); "
                                  "resume it or choose another output directory")
            self.clear()  # resume without a checkpoint: start afresh
        return ckpt

    def clear(self) -> None:
        """Remove every run file (a resume that found no checkpoint starts afresh)."""
        for path in self.files():
            shutil.rmtree(path) if path.is_dir() else path.unlink()

    # ------------------------------------------------------------------ reading

    def read_config(self) -> Any:
        """The parsed ``config.json``."""
        return read_json(self.config_path)

    def read_summary(self) -> dict[str, Any] | None:
        return read_json(self.summary_path) if self.summary_path.is_file() else None

    def read_run_info(self) -> dict[str, Any] | None:
        return read_json(self.run_info_path) if self.run_info_path.is_file() else None

    @classmethod
    def checkpoint_step(cls, ckpt: Path) -> int | None:
        """The step of a complete checkpoint directory, ``None`` when it has no readable ``state.json``."""
        state = Path(ckpt) / cls.STATE
        if not state.is_file():
            return None
        try:
            return int(read_json(state)["step"])
        except (CheckpointError, KeyError, TypeError, ValueError):
            logger.warning("%s: unreadable checkpoint state; ignoring it", ckpt)
            return None

    def latest_checkpoint(self) -> Path | None:
        """The newest complete checkpoint (of ``checkpoint``, ``checkpoint.tmp``, ``checkpoint.old``)."""
        best: tuple[int, Path] | None = None
        for name in (self.CHECKPOINT, *self._SWAP):
            step = self.checkpoint_step(self.path / name)
            if step is not None and (best is None or step > best[0]):
                best = (step, self.path / name)
        return None if best is None else best[1]

    @classmethod
    def read_state(cls, ckpt: Path) -> dict[str, Any]:
        """A checkpoint's ``state.json``, checked for the format and its version (one line when refused)."""
        state = read_json(Path(ckpt) / cls.STATE)
        if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
            raise CheckpointError(f"{ckpt}: not an online-loop checkpoint")
        version = state.get("format_version", 0)
        if not isinstance(version, int) or isinstance(version, bool):
            raise CheckpointError(f"{ckpt}: checkpoint format_version {version!r} is not an integer")
        if version > CHECKPOINT_FORMAT_VERSION:
            raise CheckpointError(f"{ckpt}: checkpoint format {version} is newer than this memento reads "
                                  f"({CHECKPOINT_FORMAT_VERSION})")
        if version < CHECKPOINT_FORMAT_VERSION:
            raise CheckpointError(f"{ckpt}: checkpoint format {version} (flat LoopConfig policy fields) is older "
                                  f"than this memento reads ({CHECKPOINT_FORMAT_VERSION}: nested policy config); "
                                  "start a new run, or resume it with the memento that wrote it")
        return state

    # ------------------------------------------------------------------ checkpoint swap

    def begin_checkpoint(self) -> Path:
        """An empty ``checkpoint.tmp`` to write the next checkpoint into."""
        tmp = self.path / self._SWAP[0]
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        return tmp

    def commit_checkpoint(self, tmp: Path) -> Path:
        """Swap the complete ``tmp`` (its ``state.json`` written last) in for ``checkpoint``."""
        final, old = self.checkpoint, self.path / self._SWAP[1]
        fsync_dir(tmp)
        if old.exists():
            shutil.rmtree(old)
        if final.exists():
            os.replace(final, old)
        os.replace(tmp, final)
        fsync_dir(self.path)
        shutil.rmtree(old, ignore_errors=True)
        return final

    def adopt_checkpoint(self, ckpt: Path) -> None:
        """After resuming from ``ckpt``: make it ``checkpoint`` (an interrupted swap) and drop the others."""
        if Path(ckpt) != self.checkpoint:
            if self.checkpoint.exists():
                shutil.rmtree(self.checkpoint)
            os.replace(ckpt, self.checkpoint)
        for stale in self._SWAP:
            shutil.rmtree(self.path / stale, ignore_errors=True)
