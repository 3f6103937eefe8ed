"""Persistence: writing a selector's artifact and keeping other processes in step with it.

:class:`ArtifactPersistence` is the concern of :class:`memento.selector.runtime.Selector` that writes and
re-reads files: ``create`` and ``check`` (:mod:`memento.selector.artifact` does the writing and checking),
``save`` (in place, crash-safely, or a copy elsewhere) and ``push_to_hub`` under the write lock, the Q-network
published for the read-only selectors of other processes (``publish_policy``, ``.policy.safetensors``) and their
``sync``: the newest published weights, the cases and feedback usage committed since, and the manifest after a
save. It owns the manifest of the last save and the keys (inode, mtime, size) of the files ``sync`` re-reads.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, cast

import torch

from memento.bank import CaseBank
from memento.errors import MementoError
from memento.learn.learner import SoftQLearner
from memento.learn.replay import ReplayBuffer
from memento.selector.artifact import (
    MANIFEST_NAME,
    POLICY_NAME,
    CheckedArtifact,
    EncoderSpec,
    LiveParts,
    SelectorConfig,
    check_artifact,
    checkpoint_live,
    read_manifest,
    read_policy,
    save_copy,
    save_in_place,
    write_artifact,
    write_policy,
)
from memento.selector.artifact.hub import push_folder
from memento.selector.core import SelectorCore

__all__ = ["ArtifactPersistence", "stat_key"]

logger = logging.getLogger("memento.selector.runtime")  # the Selector's log: one name for all its concerns


class ArtifactPersistence(SelectorCore):
    """Saving, publishing and syncing for a :class:`~memento.selector.runtime.Selector` (a mixin over
    :class:`~memento.selector.core.SelectorCore`; see the module docstring). Owns the manifest
    (``_manifest``, declared by the core: every concern reads it) and the keys below."""

    _hash_cache: dict[str, tuple[int, int, str]]  # file digests by (inode, mtime), for saves in place
    _policy_key: tuple[int, int, int] | None  # read-only: the published policy file loaded
    _manifest_key: tuple[int, int, int] | None  # read-only: the manifest file read

    # ------------------------------------------------------------------ creating and checking

    @staticmethod
    def create(staged: Path, out: Path, *, learner: SoftQLearner, buffer: ReplayBuffer, config: SelectorConfig,
               spec: EncoderSpec, cases: int, source: dict[str, Any]) -> None:
        """Write a new artifact at ``out`` from ``staged`` (a directory holding its ``bank/`` of ``cases`` rows):
        the rest of its files, an empty feedback log, the model card and the manifest, then swapped in for
        ``out`` (:func:`memento.selector.artifact.write_artifact`). Load it with :meth:`load`."""
        write_artifact(staged, out, learner=learner, buffer=buffer, config=config, spec=spec, cases=cases,
                       source=source)

    @staticmethod
    def check(path: str | Path, *, verify: bool = True, device: str | torch.device = "cpu") -> CheckedArtifact:
        """Every check :meth:`load` runs that needs neither the encoder nor the bank's index
        (:func:`memento.selector.artifact.check_artifact`)."""
        return check_artifact(path, verify=verify, device=device)

    def _saved_rows(self, rel: str) -> int:
        return int(self._manifest["live"][rel]["rows"])

    def _feedbacks(self) -> int:
        """Feedback rows: this selector's log, or for a read-only one those it took in (:meth:`sync`)."""
        return self._feedback_seen if self.read_only else len(self._feedback)

    def publish_policy(self) -> int:
        """Write the Q-network (and the learner's temperature and update count) to ``.policy.safetensors``
        atomically, for the read-only selectors of other processes (:meth:`sync`); returns the version
        (learner updates) published. Call it from the thread that makes the updates (the serve writer)."""
        self._check_writable()
        with self._rw.read():
            self._check_open()
            learner = self.learner
            tensors = {f"qnet.{name}": value.detach().to("cpu").clone().contiguous()
                       for name, value in learner.qnet.state_dict().items()}
            tensors["log_alpha"] = learner.log_alpha.detach().to("cpu").clone().reshape(-1)
            version = int(learner.updates)
        write_policy(self.path, tensors, learner, version)
        return version

    def sync(self) -> dict[str, int]:
        """A read-only selector catches up with the process that writes the artifact: the newest published
        Q-network (when ``.policy.safetensors`` changed), the cases added since (bank mirror and index), the
        usage of the feedbacks recorded since (case features) and, after a save, the new manifest. Cheap when
        nothing changed (two ``stat`` calls and two indexed SQLite reads). Returns what it took in:
        ``{"policy": 0|1, "cases": n, "feedbacks": n}``. A published file that is a symbolic link, or damaged,
        raises ``CheckpointError`` (the weights in use stay)."""
        if not self.read_only:
            raise MementoError(f"{self.path}: sync() is for a read_only selector (this one writes the artifact)")
        self._check_open()
        out = {"policy": 0, "cases": 0, "feedbacks": 0}
        policy = self.path / POLICY_NAME
        key = stat_key(policy)
        if key is not None and key != self._policy_key:
            self._policy_key = key  # a damaged file is reported once, not at every call
            tensors, version = read_policy(self.path, self.learner)  # outside the lock: selects go on meanwhile
            with self._lock:
                self._check_open()
                self.learner.qnet.load_state_dict(tensors["qnet"], strict=True)
                if "log_alpha" in tensors:
                    self.learner.log_alpha.copy_(tensors["log_alpha"].reshape(self.learner.log_alpha.shape))
                self.learner.updates = version
            out["policy"] = 1
        cases = self._bank.rows_on_disk()
        (feedbacks,) = self._feedback.connection.execute("SELECT COALESCE(MAX(seq), 0) FROM feedback").fetchone()
        if cases > len(self._bank) or feedbacks > self._feedback_seen:
            with self._lock:
                self._check_open()
                out["cases"] = self._bank.refresh()
                rows = list(self._feedback.rows(after=self._feedback_seen)) if self._featured else []
                for row in rows:
                    self._count_usage(list(row.ids), row.reward)
                out["feedbacks"] = int(feedbacks) - self._feedback_seen
                self._feedback_seen = max(self._feedback_seen, int(feedbacks))
        manifest_key = stat_key(self.path / MANIFEST_NAME)
        if manifest_key is not None and manifest_key != self._manifest_key:
            self._manifest_key = manifest_key
            try:
                manifest = read_manifest(self.path)
            except MementoError as error:
                logger.warning("%s: kept the previous manifest (%s)", self.path, error)
            else:
                with self._lock:
                    self._manifest = manifest
        return out

    # ------------------------------------------------------------------ saving

    def push_to_hub(self, repo_id: str, *, token: str | None = None, private: bool = False,
                    commit_message: str = "Upload memento selector", revision: str | None = None) -> Any:
        """Upload this artifact, as it is on disk, to the Hugging Face Hub model repository ``repo_id``
        (``"user/repo"`` or ``"hf://user/repo"``; created if needed; ``private`` then applies); returns
        ``huggingface_hub``'s commit info.

        ``save()`` first to include the newest learner state: cases and feedback committed since the last
        save go too (verification accepts appended rows). Dot-named files (``.pending.sqlite``,
        ``.policy.safetensors``, staging directories) and SQLite sidecars stay local. Anyone loads it with
        ``memento.load_selector("hf://user/repo")``; the model card carries the front matter the Hub reads.
        """
        with self._lock:
            self._check_open()
            if not self.read_only:  # the SQLite files' committed rows into the main files (no -wal uploaded)
                checkpoint_live(self.path, self._directory_bank(), self._feedback)
            return push_folder(self.path, repo_id, token=token, private=private, commit_message=commit_message,
                               revision=revision)

    def save(self, path: str | Path | None = None, *, overwrite: bool = False) -> Path:
        """Write the artifact: Q-network, learner and replay state, model card and a fresh manifest.

        ``None`` (or the artifact's own path) saves in place, crash-safely (see :mod:`memento.selector.artifact`);
        another path writes a complete copy there (it must not exist, or be an empty directory, or with
        ``overwrite`` an artifact, which the copy replaces) and this selector keeps working on its own
        directory. Returns the path written.
        """
        self._check_writable()
        with self._lock:
            self._check_open()
            if path is None or (Path(path).exists() and Path(path).resolve() == self.path.resolve()):
                self._save_in_place()
                return self.path
            save_copy(self.path, Path(path), self._live_parts(), self._manifest, overwrite=overwrite)
            return Path(path)

    def _live_parts(self) -> LiveParts:
        return LiveParts(config=self.config, spec=self.encoder_spec, learner=self.learner, buffer=self.replay,
                         bank=self._directory_bank(), feedback=self._feedback, alpha=self.alpha)

    def _save_in_place(self) -> None:
        self._manifest = save_in_place(self.path, self._live_parts(), self._manifest, cache=self._hash_cache)

    def _directory_bank(self) -> CaseBank:
        """The bank as the artifact writes it: always its own directory bank (``bank/``, opened by
        :meth:`memento.selector.runtime.Selector.load`); the other concerns need only the bank protocol."""
        return cast(CaseBank, self._bank)


def stat_key(path: Path) -> tuple[int, int, int] | None:
    """What tells a replaced file from the one seen before (inode, mtime, size); ``None`` when it is missing."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    return (info.st_ino, info.st_mtime_ns, info.st_size)

