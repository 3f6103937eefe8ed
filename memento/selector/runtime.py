"""A loaded selector artifact: choose cases for a task, take feedback, keep learning, save again.

Load one with :func:`memento.load_selector` (it verifies checksums, the format version and that the
encoder, bank, Q-network and replay buffer agree on the dimension before anything is used)::
    selector = memento.load_selector("checkpoints/selector", learn=True)
    result = selector.select("What is the capital of Peru?", k=4)      # SelectionResult
    selector.feedback(result.selection_id, reward=1.0)                 # recorded, then learned from
    selector.add_case("What is the capital of Peru?", "Lima", reward=1.0)
    selector.save()                                                    # atomically, in place

**Selecting.** A text query is encoded with the artifact's encoder (loaded on first use; see
``encoder.json``), a vector query is used as given (normalised). The bank returns the top-C cosine
candidates (C = ``config.candidates``, at least k), optionally restricted to one ``env``, and the soft-Q
policy picks k of them: ``mode="sample"`` draws without replacement from ``softmax(Q / alpha)``
(Gumbel-top-k, with the exact Plackett-Luce probability of the ordered set), ``mode="greedy"`` takes the
top k by Q (probabilities 1.0). Draws come from one ``numpy.random.Generator`` seeded with ``seed``: two
selectors loaded with the same seed make the same choices for the same calls.

**Choosing and learning** is the soft-Q agent's (:class:`memento.policies.soft_q.SoftQAgent`, the same one the online
loop runs): the selector calls only its ``select`` and ``observe``.

**Feedback.** ``feedback(selection_id, reward)`` looks up the selection (kept on disk by
:class:`memento.selector.pending.PendingStore` in the artifact's ``.pending.sqlite``, committed before ``select``
returns: at most ``config.max_pending`` of them, each for ``config.pending_ttl_s`` seconds; an unknown,
answered or expired id raises :class:`~memento.errors.UnknownSelectionError`), commits one row to
``feedback.sqlite`` and only then returns (SQLite WAL with ``synchronous=NORMAL``, like the bank: a killed
process loses nothing acknowledged; an operating-system crash or power cut may lose the last commits). The
decision (state vector, chosen case vectors, propensities, reward) enters the replay buffer; with
``learn=True`` the soft-Q learner then takes ``config.updates_per_step`` gradient steps once
``config.warmup`` decisions are in the buffer (the same learner and rule as the online loop), and the next
selection uses the new weights.
``add_case`` commits the case to the bank's SQLite before it returns.

**A case's lifecycle** (mem0's verbs, over the bank's: :mod:`memento.bank.history`). ``add_case`` of stored
content (same state, action, env and scope) with other meta updates the stored case's meta in place;
``update_case`` changes a case's action, reward or meta in place (same id, ``version`` bumped); ``replace_case``
supersedes a case by new content under a new id, keeping the old case's scope and meta unless given;
``delete_case`` and ``delete_all`` (which needs a scope or filter) forget cases: they are never selected, listed,
searched or read again (``get_case`` raises ``UnknownCaseError``), and the replay slots that held them, by their
bank positions, are masked; ``count`` counts the live cases of a scope or filter; ``history`` lists a case's
events, with the rewards reported on the selections that showed it (from ``feedback.sqlite``).

**Restarts.** ``save()`` writes the Q-network, learner and replay state and a fresh manifest. Feedback
recorded after the last save is replayed on load, in order, into the replay buffer, repeating the
gradient steps it triggered, so a selector that crashed after acknowledging feedback comes back with the
same counts (and, on the CPU, the same weights) as if it had saved just before the crash. Pending
selections survive a restart (SIGTERM or a killed process; not a power cut, see :mod:`memento.selector.pending`):
feedback for a selection made before it is accepted and learned from exactly as without the restart, with
the propensities and policy version logged at select time even if the policy changed since. The store is
volatile state of the running service: not in the manifest, not copied by ``save(path)``.

**Threads.** A selector can be shared by threads. Reads (``select``, ``get_case``, ``stats``) run in
parallel; writes (``feedback`` with its learning, ``add_case``, ``save``, ``close``) run one at a time and
alone (:class:`memento.selector.batching.ReadWriteLock`; a waiting write lets no new read in). Text is encoded
before the lock is taken, one call at a time, or, after :meth:`Selector.batch_encoding`, by a dynamic
batcher that groups concurrent texts into one forward pass (:class:`memento.selector.batching.EncodeBatcher`).
Sampling draws from the one seeded generator one call at a time, so a single caller's choices are exactly
those of a selector without threads; concurrent callers share the stream in arrival order.

**Processes** (``memento serve --workers``). One process, the learner, writes the artifact; others open it
with ``read_only=True``: no recovery, no save, no feedback or new cases (those raise ``MementoError``), the
bank opened read-only, the pending store shared (their selections go into the same ``.pending.sqlite``, where
the learner's ``feedback`` finds them; load the learner with ``shared=True``). The learner publishes its
Q-network with :meth:`Selector.publish_policy` (``.policy.safetensors``, dot-named: volatile, not in the
manifest); a read-only selector's :meth:`Selector.sync` loads the newest published weights (its
``policy_version`` then is the learner's update count they were published at), takes in the cases and, for
case features, the usage of the feedbacks the learner committed since, and re-reads the manifest after a save.

**Layout.** :class:`Selector` is the core state its concerns share (:mod:`memento.selector.core`) plus one class
per concern: selecting (:mod:`memento.selector.selecting`), feedback and learning
(:mod:`memento.selector.feedback`), bank editing (:mod:`memento.selector.cases`) and persistence
(:mod:`memento.selector.persistence`); its query encoder is a part of its own (:mod:`memento.selector.encoding`).
This module builds and loads it, and holds what spans every concern: ``stats`` and ``close``.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import torch

from memento.bank import CaseBank
from memento.bank.index import use_gpu_for
from memento.bank.protocol import Bank
from memento.errors import CheckpointError, ConfigError
from memento.hub import local_or_hub
from memento.learn.features import CaseFeaturizer
from memento.learn.learner import SoftQLearner
from memento.learn.replay import ReplayBuffer
from memento.policies import SoftQAgent, SoftQConfig
from memento.selector.artifact import (
    BANK_DB,
    BANK_DIR,
    FEEDBACK_NAME,
    MANIFEST_NAME,
    SELECTOR_FORMAT_VERSION,
    EncoderSpec,
    FeedbackLog,
    SelectorConfig,
    check_artifact,
    check_dims,
    recover,
)
from memento.selector.artifact.hub import resolve_selector
from memento.selector.batching import ReadWriteLock
from memento.selector.cases import BankEditing
from memento.selector.encoding import QueryEncoder
from memento.selector.feedback import FeedbackLearning
from memento.selector.pending import PENDING_NAME, PendingStore, answered_in
from memento.selector.persistence import ArtifactPersistence, stat_key
from memento.selector.selecting import CaseSelecting, SelectionMode, SelectionResult

__all__ = ["SelectionMode", "SelectionResult", "Selector", "SelectorConfig", "agent_config"]

logger = logging.getLogger(__name__)


class Selector(CaseSelecting, FeedbackLearning, BankEditing, ArtifactPersistence):
    """A selector artifact, loaded (see the module docstring). Build it with :meth:`load` or
    :func:`memento.load_selector`; ``close()`` it (or use ``with``) when done."""

    def __init__(self, *, path: Path, config: SelectorConfig, encoder_spec: EncoderSpec, manifest: dict[str, Any],
                 bank: Bank, feedback_log: FeedbackLog, learner: SoftQLearner, buffer: ReplayBuffer,
                 device: torch.device, learn: bool, seed: int, encoder: Any = None,
                 encoder_device: str | None = None, hash_cache: dict[str, tuple[int, int, str]] | None = None):
        self.path = path
        self.config = config
        self.encoder_spec = encoder_spec
        self.device = device
        self.learn = learn
        self.seed = seed
        self._manifest = manifest
        self._bank = bank
        self._feedback = feedback_log
        self._encoding = QueryEncoder(path, encoder_spec, encoder, encoder_device)  # the encoder, its batcher
        self._featured = learner.qnet.config.features != "none"
        featurizer = (CaseFeaturizer(bank, self._encode_actions, usage_at=self._usage_at, store=False)
                      if self._featured else None)
        self._fb_shown = {}  # usage since the saved bank: from the feedback log
        self._fb_reward = {}
        self._agent = SoftQAgent(agent_config(config), learner=learner, buffer=buffer, reward_of=bank.rewards,
                                 fixed_alpha=config.alpha, featurizer=featurizer, evidence_of=bank.evidence_at)
        self._hash_cache = hash_cache if hash_cache is not None else {}
        self._rng = np.random.default_rng(seed)
        self._pending = PendingStore.open(path / PENDING_NAME, dim=encoder_spec.dim, answered=answered_in(feedback_log))
        # reads in parallel, writes alone; ``_lock`` is the exclusive side (re-entrant, like the RLock it replaced)
        self._rw = ReadWriteLock()
        self._lock = self._rw.write_lock
        self._rng_lock = threading.Lock()  # draws from self._rng, one call at a time
        self._closed = False
        self.read_only = False  # set by load(read_only=True)
        self._feedback_seen = len(feedback_log)  # read-only: the feedback rows taken in (see sync)
        self._policy_key = None  # read-only: the published policy file loaded
        self._manifest_key = None

    # ------------------------------------------------------------------ loading

    @classmethod
    def from_pretrained(cls, repo_or_path: str | Path, **kwargs: Any) -> Selector:
        """The Hugging Face spelling of :meth:`load` (and :func:`memento.load_selector`): an artifact directory, or
        a Hub id written ``"hf://org/name[@revision]"``; ``kwargs`` are :meth:`load`'s (``device``, ``learn``,
        ``seed``, ``verify``, ``encoder``, ``read_only``, ``shared``, ``revision``). A bare ``"org/name"`` is a
        local path, as everywhere in memento: never a Hub lookup."""
        return cls.load(repo_or_path, **kwargs)

    @classmethod
    def load(cls, path: str | Path, device: str | torch.device | None = None, *, learn: bool = False,
             seed: int = 0, verify: bool = True, encoder: Any = None, read_only: bool = False,
             shared: bool = False, revision: str | None = None, audit: bool = False) -> Selector:
        """Load an artifact directory, or a Hub id ``"hf://user/repo"`` at ``revision`` (see
        :func:`memento.load_selector`); a missing directory is an error, never a Hub lookup.

        ``read_only``: another process writes this artifact (see "Processes" in the module docstring);
        ``shared``: this selector writes it while read-only selectors in other processes select over it.
        ``audit``: a deleted case's history keeps its values (see :meth:`history`).
        """
        where = local_or_hub(path, what="selector", error=CheckpointError)
        path = where if isinstance(where, Path) else resolve_selector(where[0], revision=revision or where[1])
        if not isinstance(learn, bool):
            raise ConfigError(f"load_selector: learn={learn!r}: must be true or false")
        if read_only and learn:
            raise ConfigError("load_selector: a read_only selector cannot learn (learn=True)")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ConfigError(f"load_selector: seed={seed!r}: must be an integer >= 0")
        if encoder is not None and (not callable(getattr(encoder, "encode", None))
                                    or not isinstance(getattr(encoder, "dim", None), int)):
            raise ConfigError(f"load_selector: encoder={encoder!r} needs encode(texts) and an integer dim")
        if path.is_dir() and os.path.lexists(path / MANIFEST_NAME) and not read_only:
            recover(path)  # refuses a symbolic link anywhere in the artifact before it moves anything
        cache: dict[str, tuple[int, int, str]] = {}
        on = torch.device(device) if device is not None else torch.device("cpu")
        checked = check_artifact(path, verify=verify, device=on, cache=cache)  # the checks `memento verify` runs
        manifest, config, spec = checked.manifest, checked.config, checked.spec
        learner, buffer, dims = checked.learner, checked.buffer, dict(checked.dims)
        if encoder is not None:
            dims["the encoder passed in"] = int(encoder.dim)
        check_dims(path, dims)
        bank = CaseBank.open(path / BANK_DIR, use_gpu=use_gpu_for(on), read_only=read_only, audit=audit)
        feedback_log: FeedbackLog | None = None
        try:
            dims[f"{BANK_DIR}/ (faiss index and embeddings)"] = bank.dim
            check_dims(path, dims)
            feedback_log = FeedbackLog.open(path / FEEDBACK_NAME)
            selector = cls(path=path, config=config, encoder_spec=spec, manifest=manifest, bank=bank,
                           feedback_log=feedback_log, learner=learner, buffer=buffer, device=on, learn=learn,
                           seed=int(seed), encoder=encoder,
                           encoder_device=None if device is None else str(device), hash_cache=cache)
            if read_only or shared:
                selector._pending.shared = True
                selector.read_only = read_only
                selector._manifest_key = stat_key(path / MANIFEST_NAME)
            selector._replay_unsaved_feedback()
            selector._forget_deleted()  # deleted cases leave the replay rows the feedback replay brought back
            if len(bank):  # read the bank's vectors now, not in the first select (about 2 s at 100k cases)
                bank.embeddings_at([0])
        except BaseException:
            bank.close()
            if feedback_log is not None:
                feedback_log.close()
            raise
        logger.info("loaded selector %s: %d cases, %d feedback(s), %d learner update(s), learn=%s", path,
                    len(bank), len(feedback_log), learner.updates, learn)
        return selector

    def stats(self) -> dict[str, Any]:
        """Counts and settings: cases, feedbacks, updates, pending selections, dim, learn, and more."""
        with self._rw.read():
            self._check_open()
            self._purge_expired()
            spec = self.encoder_spec
            return {
                "path": str(self.path), "cases": len(self._bank), "feedbacks": self._feedbacks(),
                "updates": int(self.learner.updates), "policy_version": self.policy_version,
                "read_only": self.read_only, "pending": len(self._pending),
                "expired": self._pending.expired + self._pending.dropped, "dim": self.dim, "learn": self.learn,
                "k": self.config.k, "candidates": self.config.candidates, "alpha": self.alpha,
                "replay": len(self.replay), "replay_added": self.replay.added,
                "cases_since_save": len(self._bank) - self._saved_rows(BANK_DB),
                "feedbacks_since_save": self._feedbacks() - self._saved_rows(FEEDBACK_NAME),
                "saves": int(self._manifest.get("saves", 1)), "saved": self._manifest.get("saved"),
                "device": str(self.device), "index": self.config.index.factory, "qnet": self.config.qnet.arch,
                "encoder": None if spec.kind == "none" else (spec.model_id or spec.model),
                "format_version": SELECTOR_FORMAT_VERSION,
            }

    def __enter__(self) -> Selector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"Selector({str(self.path)!r}, cases={len(self._bank)}, dim={self.dim}, "
                f"updates={self.learner.updates}, learn={self.learn})")

    def close(self) -> None:
        """Flush the bank's index and close the files. Does not save (call :meth:`save`). Safe to call twice."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._pending.close()
            finally:
                try:
                    self._bank.close()
                finally:
                    self._feedback.close()


# ---------------------------------------------------------------- helpers


def agent_config(config: SelectorConfig) -> SoftQConfig:
    """The soft-Q agent a selector config describes (its Q-network, learner, replay size and learning rule)."""
    return SoftQConfig(qnet=config.qnet, learner=config.learner, replay_capacity=config.replay.capacity,
                       warmup=config.warmup, updates_per_step=config.updates_per_step,
                       positive_only=config.positive_only, evidence=config.evidence, sets=config.sets)
