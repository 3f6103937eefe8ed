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
"""

from __future__ import annotations

import dataclasses
import logging
import numbers
import os
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from memento.bank import Candidates, CaseBank
from memento.bank.front import finite_float32
from memento.bank.history import CaseEvent
from memento.bank.index import use_gpu_for
from memento.bank.where import Scope, Where, as_scope, parse_filter
from memento.errors import (
    CheckpointError,
    ConfigError,
    DataFormatError,
    DimensionError,
    MementoError,
    UnknownSelectionError,
)
from memento.hub import local_or_hub, push_folder, resolve_selector
from memento.learn.features import CaseFeaturizer
from memento.learn.learner import SoftQLearner
from memento.learn.policy import Observation
from memento.learn.replay import ReplayBuffer
from memento.policies import SoftQAgent, SoftQConfig
from memento.selector.artifact import (
    BANK_DB,
    BANK_DIR,
    FEEDBACK_NAME,
    MANIFEST_NAME,
    POLICY_NAME,
    SELECTOR_FORMAT_VERSION,
    CheckedArtifact,
    EncoderSpec,
    FeedbackLog,
    FeedbackRow,
    LiveParts,
    SelectorConfig,
    check_artifact,
    check_dims,
    checkpoint_live,
    feedback_with_case,
    load_encoder,
    read_manifest,
    read_policy,
    recover,
    save_copy,
    save_in_place,
    write_artifact,
    write_policy,
)
from memento.selector.batching import BatchedEncoder, EncodeBatcher, LockedGenerator, ReadWriteLock, SerialEncoder
from memento.selector.pending import PENDING_NAME, PendingSelection, PendingStore, answered_in
from memento.types import Case, Selection, check_id, check_reward, check_text, shown

__all__ = ["SelectionMode", "SelectionResult", "Selector", "SelectorConfig", "agent_config"]

logger = logging.getLogger(__name__)

SelectionMode = Literal["sample", "greedy"]
_MODES = ("sample", "greedy")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SelectionResult:
    """What :meth:`Selector.select` chose.

    - ``selection_id``: a uuid4 hex string; pass it to :meth:`Selector.feedback` with the reward (``None`` for
      a selection made with ``track=False``: nothing was recorded, there is nothing to give feedback on);
    - ``ids`` / ``cases``: the chosen cases in draw order (k of them, or fewer if fewer match);
    - ``probs``: each case's first-draw probability under the policy (1.0 for greedy): how likely the draw
      was, not how relevant the case is;
    - ``scores``: each case's relevance as the policy scored it, ``Q(s, c)`` (a logit: ``sigmoid(Q)``
      estimates the probability that the task succeeds with this case); greedy picks the top k by it;
    - ``similarities``: each case's cosine similarity to the query, as the bank's search returned it;
    - ``set_prob``: the Plackett-Luce probability of drawing exactly this ordered set (1.0 for greedy);
    - ``mode``: ``"sample"`` or ``"greedy"``; ``policy_version``: learner updates made before this choice;
    - ``policy_probs``: each case's probability under the policy, ``softmax(Q / alpha)`` over the candidate set
      (its first-draw probability: ``probs`` of a sampled choice, kept for a greedy one too, whose ``probs``
      are 1.0); in (0, 1], at most 1 summed over the chosen cases, higher for a higher Q.
    """

    selection_id: str | None
    ids: tuple[str, ...]
    cases: tuple[Case, ...]
    probs: tuple[float, ...]
    set_prob: float
    mode: SelectionMode
    policy_version: int
    scores: tuple[float, ...] = ()
    similarities: tuple[float, ...] = ()
    policy_probs: tuple[float, ...] = ()

    def __len__(self) -> int:
        return len(self.ids)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``selection_id``, ``mode``, ``policy_version``, ``set_prob`` and
        ``cases: [{id, state, action, reward, env, prob, score, similarity, meta?, user?, agent?, session?}]``
        (``score``: the Q-network's logit of success, ``similarity``: the cosine to the query; see
        :attr:`scores`)."""
        cases = []
        for i, (case, prob) in enumerate(zip(self.cases, self.probs)):
            row = {"id": case.id, "state": case.state, "action": case.action, "reward": case.reward,
                   "env": case.env, "prob": prob,
                   "score": self.scores[i] if i < len(self.scores) else None,
                   "similarity": self.similarities[i] if i < len(self.similarities) else None}
            row.update(_scope_and_meta(case))
            cases.append(row)
        return {"selection_id": self.selection_id, "mode": self.mode, "policy_version": self.policy_version,
                "set_prob": self.set_prob, "cases": cases}


def _scope_and_meta(case: Case) -> dict[str, Any]:
    """A case's scope fields and meta, those that are set (for JSON answers)."""
    row: dict[str, Any] = {name: value for name, value in zip(("user", "agent", "session"), case.scope)
                           if value is not None}
    if case.meta:
        row["meta"] = case.meta
    return row


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Pending(PendingSelection):
    """A selection waiting for its reward, as ``select`` makes it; the :class:`~memento.selector.pending.PendingStore`
    keeps its :class:`~memento.selector.pending.PendingSelection` fields on disk (``created``: wall clock, from which
    it expires) and hands back a ``PendingSelection``. ``born`` (``time.monotonic()`` at select) is not
    stored: monotonic time does not survive a restart."""

    born: float


class Selector:
    """A selector artifact, loaded (see the module docstring). Build it with :meth:`load` or
    :func:`memento.load_selector`; ``close()`` it (or use ``with``) when done."""

    def __init__(self, *, path: Path, config: SelectorConfig, encoder_spec: EncoderSpec, manifest: dict[str, Any],
                 bank: CaseBank, feedback_log: FeedbackLog, learner: SoftQLearner, buffer: ReplayBuffer,
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
        self._featured = learner.qnet.config.features != "none"
        featurizer = (CaseFeaturizer(bank, self._encode_actions, usage_at=self._usage_at, store=False)
                      if self._featured else None)
        self._fb_shown: dict[int, int] = {}  # usage since the saved bank: from the feedback log
        self._fb_reward: dict[int, float] = {}
        self._agent = SoftQAgent(agent_config(config), learner=learner, buffer=buffer, reward_of=bank.rewards,
                                 fixed_alpha=config.alpha, featurizer=featurizer, evidence_of=bank.evidence_at)
        self._encoder = encoder
        self._encoder_device = encoder_device
        self._hash_cache = hash_cache if hash_cache is not None else {}
        self._rng = np.random.default_rng(seed)
        self._pending = PendingStore.open(path / PENDING_NAME, dim=encoder_spec.dim, answered=answered_in(feedback_log))
        # reads in parallel, writes alone; ``_lock`` is the exclusive side (re-entrant, like the RLock it replaced)
        self._rw = ReadWriteLock()
        self._lock = self._rw.write_lock
        self._rng_lock = threading.Lock()  # draws from self._rng, one call at a time
        self._encoder_lock = threading.Lock()  # loading the encoder, switching batching on or off
        self._encoder_front: SerialEncoder | BatchedEncoder | None = None
        self._batcher: EncodeBatcher | None = None
        self._closed = False
        self.read_only = False  # set by load(read_only=True)
        self._feedback_seen = len(feedback_log)  # read-only: the feedback rows taken in (see sync)
        self._policy_key: tuple[int, int, int] | None = None  # read-only: the published policy file loaded
        self._manifest_key: tuple[int, int, int] | None = None

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
        where = torch.device(device) if device is not None else torch.device("cpu")
        checked = check_artifact(path, verify=verify, device=where, cache=cache)  # the checks `memento verify` runs
        manifest, config, spec = checked.manifest, checked.config, checked.spec
        learner, buffer, dims = checked.learner, checked.buffer, dict(checked.dims)
        if encoder is not None:
            dims["the encoder passed in"] = int(encoder.dim)
        check_dims(path, dims)
        bank = CaseBank.open(path / BANK_DIR, use_gpu=use_gpu_for(where), read_only=read_only, audit=audit)
        feedback_log: FeedbackLog | None = None
        try:
            dims[f"{BANK_DIR}/ (faiss index and embeddings)"] = bank.dim
            check_dims(path, dims)
            feedback_log = FeedbackLog.open(path / FEEDBACK_NAME)
            selector = cls(path=path, config=config, encoder_spec=spec, manifest=manifest, bank=bank,
                           feedback_log=feedback_log, learner=learner, buffer=buffer, device=where, learn=learn,
                           seed=int(seed), encoder=encoder,
                           encoder_device=None if device is None else str(device), hash_cache=cache)
            if read_only or shared:
                selector._pending.shared = True
                selector.read_only = read_only
                selector._manifest_key = _stat_key(path / MANIFEST_NAME)
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

    def _saved_rows(self, rel: str) -> int:
        return int(self._manifest["live"][rel]["rows"])

    def _encode_actions(self, texts: list[str]) -> np.ndarray:
        """Action vectors for the case features (the selector's text encoder)."""
        return np.asarray(self.encoder().encode(texts), dtype=np.float32).reshape(len(texts), self.dim)

    def _usage_at(self, positions_C: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Usage statistics: the saved bank's log plus the feedbacks this artifact recorded."""
        shown_C, reward_C = self._bank.usage_at(positions_C)
        for i, pos in enumerate(np.asarray(positions_C).tolist()):
            shown_C[i] += self._fb_shown.get(pos, 0)
            reward_C[i] += self._fb_reward.get(pos, 0.0)
        return shown_C, reward_C

    def _count_usage(self, ids: Sequence[str], reward: float) -> None:
        if not self._featured or not ids:
            return
        for pos in self._bank.positions_of(list(ids)).tolist():
            self._fb_shown[pos] = self._fb_shown.get(pos, 0) + 1
            self._fb_reward[pos] = self._fb_reward.get(pos, 0.0) + float(reward)

    def _replay_unsaved_feedback(self) -> None:
        """Feed the rows recorded after the last save into the replay buffer (and learner) again, in order."""
        saved = self._saved_rows(FEEDBACK_NAME)
        if self._featured:  # the usage statistics of the saved feedbacks (not in the saved bank's log)
            for row in self._feedback.rows(after=0):
                if row.seq > saved:
                    break
                self._count_usage(list(row.ids), row.reward)
        replayed = 0
        for row in self._feedback.rows(after=saved):
            if not self.read_only:  # a read-only selector takes the learner's published weights instead (sync)
                self._learn_from_row(row)
            self._count_usage(list(row.ids), row.reward)
            self._feedback_seen = max(self._feedback_seen, row.seq)
            replayed += 1
        if replayed:
            logger.info("%s: replayed %d feedback(s) recorded after the last save (%d learner updates now)",
                        self.path, replayed, self.learner.updates)

    def _learn_from_row(self, row: FeedbackRow) -> None:
        if not row.ids:
            return
        if row.state is None:
            raise CheckpointError(f"{self.path / FEEDBACK_NAME}: feedback {row.seq} has no state vector")
        state_D = np.frombuffer(row.state, dtype=np.float32).copy()
        if state_D.shape != (self.dim,):
            raise DimensionError(f"{self.path / FEEDBACK_NAME}: feedback {row.seq} has a state of shape "
                                 f"{state_D.shape}, the selector has dim={self.dim}")
        try:
            cases_KD = self._bank.embeddings(row.ids)
        except MementoError as error:
            raise CheckpointError(f"{self.path / FEEDBACK_NAME}: feedback {row.seq}: {error}") from None
        self._learn(state_D, list(row.ids), cases_KD, row.probs, row.set_prob, row.reward, row.seq,
                    row.policy_version, row.learned)

    def _learn(self, state_D: np.ndarray, ids: list[str], cases_KD: np.ndarray, probs: list[float], set_prob: float,
               reward: float, seq: int, version: int, learned: bool) -> None:
        """One decision, as logged (propensities 1.0 for a greedy choice), to the agent: into its replay buffer
        (as several rows when it holds more than ``k_max`` cases), then its gradient steps when ``learned``.
        Cases deleted since the selection are left out (a decision of deleted cases only is not learned from)."""
        gone = self._bank.is_deleted(list(ids))
        if any(gone):
            keep = [i for i, deleted in enumerate(gone) if not deleted]
            if not keep:
                return
            ids, cases_KD, probs = [ids[i] for i in keep], np.asarray(cases_KD)[keep], [probs[i] for i in keep]
        k = len(ids)
        probs_K = np.asarray(probs, dtype=np.float64)
        positions_K = self._bank.positions_of(list(ids))  # case features and per-case evidence read by position
        candidates = Candidates(ids=list(ids), positions_C=positions_K, scores_C=np.zeros(k),
                                embeddings_CD=np.asarray(cases_KD))
        selection = Selection(ids=list(ids), positions_K=np.arange(k), probs_K=probs_K, set_prob=float(set_prob),
                              candidate_ids=list(ids), probs_C=probs_K, greedy=False)
        self._agent.observe([Observation(state_D=state_D, candidates=candidates, selection=selection, reward=reward,
                                         step=seq, policy_version=version)], learn=learned)

    # ------------------------------------------------------------------ properties

    @property
    def dim(self) -> int:
        return self.encoder_spec.dim

    @property
    def alpha(self) -> float:
        """The temperature the policy uses now."""
        return self._agent.alpha

    @property
    def agent(self) -> SoftQAgent:
        """The soft-Q agent that chooses and learns."""
        return self._agent

    @property
    def bank(self) -> CaseBank:
        """The case bank (read it; write through :meth:`add_case`)."""
        return self._bank

    @property
    def learner(self) -> SoftQLearner:
        """The agent's soft-Q learner."""
        return self._agent.learner

    @property
    def replay(self) -> ReplayBuffer:
        """The agent's replay buffer."""
        return self._agent.buffer

    @property
    def manifest(self) -> dict[str, Any]:
        """The manifest of the last save (or of the loaded artifact)."""
        return self._manifest

    @property
    def policy_version(self) -> int:
        """Learner updates done so far."""
        return self.learner.updates

    def __enter__(self) -> Selector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"Selector({str(self.path)!r}, cases={len(self._bank)}, dim={self.dim}, "
                f"updates={self.learner.updates}, learn={self.learn})")

    def _check_open(self) -> None:
        if self._closed:
            raise MementoError(f"{self.path}: selector is closed")

    def _check_writable(self) -> None:
        self._check_open()
        if self.read_only:
            raise MementoError(f"{self.path}: this selector is read-only (another process writes the artifact: "
                               "send feedback, new cases and saves there)")

    # ------------------------------------------------------------------ encoding

    def encoder(self) -> Any:
        """The text encoder (loaded on first use from ``encoder.json``), behind a front that threads may share:
        its ``encode`` runs through the dynamic batcher after :meth:`batch_encoding`, else one call at a time
        (the front's other attributes, and ``.encoder``, are the encoder's own)."""
        with self._encoder_lock:
            if self._encoder is None:
                self._encoder = load_encoder(self.path, self.encoder_spec, device=self._encoder_device)
            if self._encoder_front is None or self._encoder_front.encoder is not self._encoder:
                self._encoder_front = (SerialEncoder(self._encoder) if self._batcher is None
                                       else BatchedEncoder(self._encoder, self._batcher))
            return self._encoder_front

    def batch_encoding(self, max_texts: int | None = 32, wait_ms: float = 2.0) -> EncodeBatcher | None:
        """From now on encode texts (queries, new cases' states, action texts of case features) through a
        dynamic batcher: concurrent calls are grouped, up to ``max_texts`` texts or until ``wait_ms`` ms after
        the first, into one forward pass in the batcher's thread (:class:`memento.selector.batching.EncodeBatcher`).
        Returns the batcher (its ``stats()`` count the forwards). ``max_texts=None`` switches batching off
        again; the old batcher encodes what it holds and stops."""
        batcher = (None if max_texts is None else
                   EncodeBatcher(self._encode_batch, max_texts=max_texts, wait_ms=wait_ms,
                                 name=f"memento-encode-{self.path.name}"))
        with self._encoder_lock:
            old, self._batcher = self._batcher, batcher
            self._encoder_front = None
        if old is not None:
            old.close()
        return batcher

    def _encode_batch(self, texts: list[str]) -> np.ndarray:
        """The batcher's forward pass: the encoder itself (called in the batcher's thread only)."""
        return self.encoder().encoder.encode(texts)

    def _state(self, query: Any, what: str = "query") -> np.ndarray:
        """A query text or vector as a unit float32 vector ``[D]``."""
        if isinstance(query, str):
            check_text(query, f"{what} text")
            vec = np.asarray(self.encoder().encode([query]), dtype=np.float32).reshape(-1)
        elif isinstance(query, (np.ndarray, list, tuple, torch.Tensor)):
            if isinstance(query, torch.Tensor):
                query = query.detach().cpu().numpy()
            vec = np.asarray(query)
            if vec.dtype == object or not np.issubdtype(vec.dtype, np.number) or np.issubdtype(vec.dtype,
                                                                                                np.complexfloating):
                raise DataFormatError(f"{what} vector must hold real numbers, got dtype {vec.dtype}")
            vec = finite_float32(vec if np.issubdtype(vec.dtype, np.floating) else vec.astype(np.float64),
                                 f"{what} vector")
        else:
            raise DataFormatError(f"{what} must be a text or a vector, got {type(query).__name__}")
        if vec.shape != (self.dim,):
            raise DimensionError(f"{what} vector has shape {vec.shape}, this selector expects ({self.dim},)")
        if not np.isfinite(vec).all():
            raise DataFormatError(f"{what} vector contains NaN or inf")
        norm = float(np.linalg.norm(vec))
        if norm == 0.0:
            raise DataFormatError(f"{what} vector has zero norm")
        if abs(norm - 1.0) > 1e-4:  # as the online loop does: a unit vector is used exactly as given
            vec = vec / norm
        return np.ascontiguousarray(vec, dtype=np.float32)

    # ------------------------------------------------------------------ select / feedback

    def select(self, query: str | np.ndarray, k: int = 4, mode: SelectionMode = "sample",
               env: str | None = None, *, track: bool = True, scope: Scope | Mapping[str, Any] | None = None,
               filter: Where | Mapping[str, Any] | None = None, include_global: bool = False) -> SelectionResult:
        """Choose ``k`` cases for a task text or state vector (see the module docstring).

        ``track=False`` retrieves only: no pending selection is written (nothing on disk changes) and the
        result's ``selection_id`` is ``None``, so no feedback can follow. The cases chosen, and the draws
        taken from the seeded generator, are the same either way. ``scope`` (``{"user": ..., "agent": ...,
        "session": ...}``) and ``filter`` (on the cases' meta: ``{"topic": {"in": ["geo", "sci"]}}``, AND/OR;
        :mod:`memento.bank.where`) restrict the candidates; one that matches nothing gives an empty result.
        ``include_global``: beside a scope, the cases without any owner (no user, agent, session) are candidates too."""
        k = _check_select_args(k, mode, env, track)
        scope, filter = as_scope(scope, include_global=include_global), parse_filter(filter)
        self._check_open()
        state_D = self._state(query)  # text is encoded outside the lock (batched with other callers' when on)
        with self._rw.read():
            self._check_open()
            # parallel readers must see the network in eval mode: q_values puts back the training flag it found,
            # and a learner update leaves it in training mode (dropout), so set it before any reader scores
            if self.learner.qnet.training:
                self.learner.qnet.eval()
            candidates = self._bank.candidates(state_D, max(self.config.candidates, k), env=env, scope=scope,
                                               filter=filter)
            return self._choose(state_D, candidates, k, mode, env, track)

    def _remember(self, selection_id: str, pending: PendingSelection) -> None:
        """Keep a selection until its feedback: committed to the pending store (one SQLite transaction; the
        expired ones and the oldest beyond ``max_pending`` are dropped). A selection ``_take_pending`` handed
        out is put back (its feedback was not recorded)."""
        self._pending.put(selection_id, pending, max_pending=self.config.max_pending,
                          ttl_s=self.config.pending_ttl_s)

    def _take_pending(self, selection_id: str) -> PendingSelection | None:
        """The selection waiting under ``selection_id``, handed out once (``None`` when unknown, answered or
        expired); its row leaves the store after the feedback was committed (see :mod:`memento.selector.pending`)."""
        self._purge_expired()
        return self._pending.take(selection_id, ttl_s=self.config.pending_ttl_s)

    def _purge_expired(self) -> None:
        self._pending.purge(self.config.pending_ttl_s)

    def feedback(self, selection_id: str | None, reward: float) -> dict[str, Any]:
        """Record the reward of a selection (committed before this returns) and learn from it when ``learn``.

        Returns ``{"selection_id", "reward", "recorded": True, "updates"}`` (``updates``: learner updates
        done so far). Raises ``UnknownSelectionError`` for an unknown, already answered or expired id and
        ``DataFormatError`` for a reward outside [0, 1].
        """
        reward = check_reward(reward, "reward")
        if selection_id is None:
            raise UnknownSelectionError("selection_id is None: the selection was made with track=False (nothing "
                                        "was recorded); select with track=True to give feedback")
        check_id(selection_id, "selection_id")
        self._check_writable()
        with self._lock:
            self._check_open()
            pending = self._take_pending(selection_id)
            if pending is None:
                raise UnknownSelectionError(f"unknown selection id {selection_id!r}: never issued by this artifact's "
                                            "service, already answered, or expired (pending_ttl_s="
                                            f"{self.config.pending_ttl_s})")
            try:
                seq = self._feedback.append(selection_id=selection_id, reward=reward, mode=pending.mode,
                                            policy_version=pending.policy_version, env=pending.env, ids=pending.ids,
                                            probs=pending.probs, set_prob=pending.set_prob, learned=self.learn,
                                            state=pending.state_D.tobytes())
            except BaseException:
                self._remember(selection_id, pending)  # not recorded: the caller may retry
                raise
            if pending.ids:
                self._learn(pending.state_D, pending.ids, pending.cases_KD, pending.probs, pending.set_prob, reward,
                            seq, pending.policy_version, self.learn)
                self._count_usage(pending.ids, reward)
            return {"selection_id": selection_id, "reward": reward, "recorded": True,
                    "updates": int(self.learner.updates)}

    # ------------------------------------------------------------------ cases

    def add_case(self, state: str, action: str, reward: float, env: str | None = None,
                 meta: dict[str, Any] | None = None, *, embedding: np.ndarray | None = None,
                 scope: Scope | Mapping[str, Any] | None = None) -> str:
        """Add a case to the bank (committed before this returns); returns its id.

        ``state`` is encoded with the artifact's encoder unless ``embedding`` (``[D]``) is given. A case
        whose (state, action, env, scope) is already stored is not added again: the stored id is returned, and
        when ``meta`` is given and differs from the stored case's, the stored case takes it in place (its version
        goes up by one, as :meth:`update_case` does).
        ``scope``: whose case it is (``{"user": ..., "agent": ..., "session": ...}``).
        """
        case, state_D = self._new_case(state, action, reward, env, meta, embedding, scope)
        with self._lock:
            self._check_open()
            updates = self._bank.updates_made
            case_id = self._bank.add([case], state_D[None, :])[0]
            if self._bank.updates_made != updates:  # stored content with new meta: updated in place
                self._saved_rows_changed()
            return case_id

    def _new_case(self, state: str, action: str, reward: float, env: str | None, meta: dict[str, Any] | None,
                  embedding: np.ndarray | None, scope: Scope | Mapping[str, Any] | None = None
                  ) -> tuple[Case, np.ndarray]:
        """A case to write and its state vector (``state`` encoded unless ``embedding``), checked and encoded
        outside the lock."""
        owner = as_scope(scope) or Scope()
        case = Case(state=state, action=action, reward=check_reward(reward, "reward"), env=env,
                    meta={} if meta is None else meta, user=owner.user, agent=owner.agent, session=owner.session)
        self._check_writable()
        return case, self._state(state if embedding is None else embedding, "case state")

    def search_cases(self, query: str | np.ndarray, k: int = 10, *, env: str | None = None,
                     scope: Scope | Mapping[str, Any] | None = None,
                     filter: Where | Mapping[str, Any] | None = None,
                     include_global: bool = False) -> list[tuple[Case, float]]:
        """The ``k`` cases nearest to a task text or state vector by cosine, with their similarity (a plain search:
        no policy, no draw, nothing recorded), among the cases of ``scope`` (and, with ``include_global``, those
        without any owner) that match ``filter``."""
        k = _check_select_args(k, "greedy", env, False)
        scope, filter = as_scope(scope, include_global=include_global), parse_filter(filter)
        self._check_open()
        state_D = self._state(query)
        with self._rw.read():
            self._check_open()
            found = self._bank.candidates(state_D, k, env=env, scope=scope, filter=filter)
            return list(zip(self._bank.get(found.ids), (float(s) for s in found.scores_C))) if found.ids else []

    def list_cases(self, *, env: str | None = None, scope: Scope | Mapping[str, Any] | None = None,
                   filter: Where | Mapping[str, Any] | None = None, limit: int = 100, offset: int = 0,
                   include_global: bool = False) -> list[Case]:
        """Live cases in position order (deleted ones left out), those of ``env`` and ``scope`` (and, with
        ``include_global``, those without any owner) that match ``filter``, from the ``offset``-th match, at most
        ``limit`` (1..10,000)."""
        if env is not None:
            check_id(env, "env")
        scope, filter = as_scope(scope, include_global=include_global), parse_filter(filter)
        for name, value, top in (("limit", limit, 10_000), ("offset", offset, 2 ** 62)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not (
                    (1 if name == "limit" else 0) <= value <= top):
                raise DataFormatError(f"{name} must be an integer in [{1 if name == 'limit' else 0}, {top}], "
                                      f"got {shown(value)}")
        out: list[Case] = []
        seen = 0
        with self._rw.read():
            self._check_open()
            for case in self._bank.iter_cases():
                if (env is not None and case.env != env) or (scope is not None and not scope.matches(case)) or (
                        filter is not None and not filter.matches(case)):
                    continue
                seen += 1
                if seen > offset:
                    out.append(case)
                    if len(out) >= limit:
                        break
        return out

    def get_case(self, case_id: str) -> Case:
        """The stored case; an unknown id raises ``UnknownCaseError``."""
        if not isinstance(case_id, str) or not case_id:
            raise DataFormatError(f"case id must be a non-empty string, got {case_id!r}")
        with self._rw.read():
            self._check_open()
            return self._bank.get(case_id)

    # ------------------------------------------------------------------ forgetting

    def _forget_deleted(self, ids: Sequence[str] | None = None) -> int:
        """Mask the replay slots of the deleted cases ``ids`` (all deleted cases when None) by their bank positions
        (:meth:`memento.learn.replay.ReplayBuffer.forget_cases`): never the slots of another case that shares a
        deleted case's text. Slots saved without positions (an older replay save) are matched by the deleted
        cases' state vectors, the first ``D`` columns of the case vectors the buffer stores."""
        ids = self._bank.deleted_ids() if ids is None else list(ids)
        if not ids or not len(self.replay):
            return 0
        return int(self.replay.forget_cases(self._bank.positions_of(ids), self._bank.embeddings(ids)))

    def delete_case(self, case_id: str) -> dict[str, Any]:
        """Forget a case: it is never selected again (committed to the bank, then checkpointed with a save in
        place before this returns, so a restart finds it deleted and ``memento verify`` passes); the replay
        slots holding it are masked. Returns ``{"id", "deleted": True, "replay_slots_masked"}``; an unknown or
        already deleted id raises ``UnknownCaseError``."""
        check_id(case_id, "case id")
        self._check_writable()
        with self._lock:
            self._check_open()
            self._bank.delete([case_id])
            masked = self._forget_deleted([case_id])
            self._save_in_place()
        return {"id": case_id, "deleted": True, "replay_slots_masked": masked}

    def replace_case(self, case_id: str, state: str, action: str, reward: float, env: str | None = None,
                     meta: dict[str, Any] | None = None, *, embedding: np.ndarray | None = None,
                     scope: Scope | Mapping[str, Any] | None = None) -> str:
        """Supersede a case by a new one (one bank transaction, then a save in place, as :meth:`delete_case`):
        the old case is never selected again, the new one can be; returns the new case's id (ids are never
        reused; see :meth:`memento.bank.CaseBank.replace`). ``state`` is encoded unless ``embedding`` is given.
        The new case keeps the old one's owner (``user``/``agent``/``session``) and ``meta`` unless ``scope`` or
        ``meta`` is given (``scope={}``: no owner, ``meta={}``: no meta)."""
        check_id(case_id, "case id")
        self._check_open()
        with self._rw.read():
            old = self._bank.get(case_id)  # unknown or deleted: UnknownCaseError
        if scope is None:
            scope = Scope(user=old.user, agent=old.agent, session=old.session)
        case, state_D = self._new_case(state, action, reward, env, old.meta if meta is None else meta, embedding,
                                       scope)
        with self._lock:
            self._check_open()
            new_id = self._bank.replace(case_id, case, state_D)
            self._forget_deleted([case_id])
            self._save_in_place()
        return new_id

    def update_case(self, case_id: str, *, action: str | None = None, reward: float | None = None,
                    meta: dict[str, Any] | None = None, state: str | None = None) -> Case:
        """Change a case in place (mem0's ``update``; committed before this returns): its ``action``, ``reward``
        and/or ``meta`` (replaced whole). The id, the vector, the scope and the usage stay; ``version`` goes up by
        one and ``updated`` is now (:meth:`memento.bank.CaseBank.update`). A new ``state`` would need a new
        vector: it is refused (use :meth:`replace_case`). Returns the case as stored now; an unknown or deleted id
        raises ``UnknownCaseError``."""
        check_id(case_id, "case id")
        self._check_writable()
        with self._lock:
            self._check_open()
            before = self._bank.get(case_id)
            case = self._bank.update(case_id, action=action, reward=reward, meta=meta, state=state)
            if case.action != before.action and self._agent.featurizer is not None:
                self._agent.featurizer.forget_actions(self._bank.positions_of([case_id]))
            if case.version != before.version:
                self._saved_rows_changed()
        return case

    def _saved_rows_changed(self) -> None:
        """After an update in place: an artifact saved before updates existed (no ``stable_digest`` for its bank in
        the manifest) is saved now, so that a restart before the next save still verifies (see
        :mod:`memento.selector.artifact`, "Checksums")."""
        if "stable_digest" not in self._manifest["live"][BANK_DB]:
            self._save_in_place()

    def history(self, case_id: str) -> list[CaseEvent]:
        """A case's events, oldest first: ``add``, ``update`` (the fields, their old and new values), ``replace``,
        ``delete`` (:meth:`memento.bank.CaseBank.history`) and ``feedback``: each reward reported on a selection
        that showed it (from ``feedback.sqlite``; a selection is logged once its reward is). A deleted or replaced
        case's events keep only their kind, time, version and field names (no values, no rewards) unless the bank
        audits (``load(..., audit=True)``). An unknown id raises ``UnknownCaseError``."""
        check_id(case_id, "case id")
        self._check_open()
        with self._rw.read():
            self._check_open()
            events = self._bank.history(case_id)
            _, rows = feedback_with_case(self.path / FEEDBACK_NAME, case_id)
        erase = events[-1].event in ("delete", "replace") and not self._bank.audit
        shown = [CaseEvent(event="feedback", time=float(row.time), case_id=case_id, reward=float(row.reward),
                           selection_id=row.selection_id) for row in rows]
        if erase:
            shown = [event.erased() for event in shown]
        return sorted(events + shown, key=lambda event: event.time)

    def count(self, *, env: str | None = None, scope: Scope | Mapping[str, Any] | None = None,
              filter: Where | Mapping[str, Any] | None = None, include_global: bool = False) -> int:
        """How many live cases there are of ``env``, in ``scope`` (and, with ``include_global``, without any owner)
        that match ``filter``; all live cases when none is given."""
        if env is not None:
            check_id(env, "env")
        scope, filter = as_scope(scope, include_global=include_global), parse_filter(filter)
        with self._rw.read():
            self._check_open()
            return self._bank.count(env=env, scope=scope, filter=filter)

    def delete_all(self, *, env: str | None = None, scope: Scope | Mapping[str, Any] | None = None,
                   filter: Where | Mapping[str, Any] | None = None, all: bool = False) -> dict[str, Any]:
        """Forget every live case of ``scope`` whose meta match ``filter`` (and of ``env`` when given), as
        :meth:`delete_case` forgets one (one bank transaction, replay slots masked by position, a save in place).
        A scope or a filter is required, so that no one deletes every tenant's cases by accident: ``all=True``
        goes without. Returns ``{"deleted": n, "replay_slots_masked": m}``."""
        if env is not None:
            check_id(env, "env")
        scope, filter = as_scope(scope), parse_filter(filter)
        self._check_writable()
        with self._lock:
            self._check_open()
            ids = self._bank.delete_where(env=env, scope=scope, filter=filter, all=all)
            masked = self._forget_deleted(ids) if ids else 0
            if ids:
                self._save_in_place()
        return {"deleted": len(ids), "replay_slots_masked": masked}

    # ------------------------------------------------------------------ several tasks at once

    def select_many(self, queries: Sequence[str] | np.ndarray, k: int = 4, mode: SelectionMode = "sample",
                    env: str | None = None, *, track: bool = True, scope: Scope | Mapping[str, Any] | None = None,
                    filter: Where | Mapping[str, Any] | None = None,
                    include_global: bool = False) -> list[SelectionResult]:
        """:meth:`select` for several tasks: the texts are encoded in one ``encode`` call and the candidates of
        all of them found in one bank search; each result has its own pending selection id (feedback each
        one). Greedy results equal ``select`` called on each query in turn; sampled ones draw from the same
        generator in query order. ``queries``: texts, or a ``[B, D]`` array of state vectors. ``track``, ``scope``,
        ``filter``, ``include_global``: as for :meth:`select`."""
        k = _check_select_args(k, mode, env, track)
        scope, filter = as_scope(scope, include_global=include_global), parse_filter(filter)
        if isinstance(queries, str):
            raise DataFormatError("select_many takes a list of queries; for one text use select()")
        self._check_open()
        states_BD = self._states(queries)
        if not len(states_BD):
            return []
        with self._rw.read():
            self._check_open()
            if self.learner.qnet.training:
                self.learner.qnet.eval()
            width = max(self.config.candidates, k)
            scores_BC, positions_BC = self._bank.search_positions(states_BD, width, env=env, scope=scope,
                                                                  filter=filter)
            results = []
            for b, state_D in enumerate(states_BD):
                valid = positions_BC[b] >= 0
                positions_C = positions_BC[b][valid]
                candidates = Candidates(ids=self._bank.ids_at(positions_C), positions_C=positions_C,
                                        scores_C=scores_BC[b][valid],
                                        embeddings_CD=self._bank.embeddings_at(positions_C))
                results.append(self._choose(state_D, candidates, k, mode, env, track))
            return results

    def _states(self, queries: Sequence[str] | np.ndarray) -> np.ndarray:
        """Queries as unit float32 state vectors ``[B, D]``: texts encoded in one call, vectors as given."""
        if isinstance(queries, (np.ndarray, torch.Tensor)):
            rows = list(queries.detach().cpu().numpy() if isinstance(queries, torch.Tensor) else queries)
        else:
            rows = list(queries)
        if rows and all(isinstance(q, str) for q in rows):
            for i, text in enumerate(rows):
                check_text(text, f"query {i}: text")
            rows = list(np.asarray(self.encoder().encode(rows), dtype=np.float32).reshape(len(rows), self.dim))
        elif any(isinstance(q, str) for q in rows):
            raise DataFormatError("select_many: queries must be all texts or all vectors")
        return np.stack([self._state(q, f"query {i}") for i, q in enumerate(rows)]) if rows else np.zeros(
            (0, self.dim), dtype=np.float32)

    def _choose(self, state_D: np.ndarray, candidates: Candidates, k: int, mode: SelectionMode,
                env: str | None, track: bool = True) -> SelectionResult:
        """One selection over a candidate set, remembered as pending when ``track`` (for :meth:`select` and
        :meth:`select_many`; the caller holds the read lock and has put the Q-network in eval mode)."""
        version = self._agent.version
        scores: tuple[float, ...] = ()
        similarities: tuple[float, ...] = ()
        policy_probs: tuple[float, ...] = ()
        if len(candidates) == 0:
            ids: list[str] = []
            probs: list[float] = []
            set_prob = 1.0
            cases_KD = np.zeros((0, self.dim), dtype=np.float32)
        else:
            rng: Any = LockedGenerator(self._rng, self._rng_lock)  # the same draws, one call at a time
            selection, q_K = self._agent.select_scored(state_D, candidates, k, rng=rng, greedy=mode == "greedy")
            ids = list(selection.ids)
            policy_probs = tuple(float(p) for p in selection.probs_K)  # softmax(Q / alpha) over the candidates
            probs = [1.0] * len(ids) if mode == "greedy" else list(policy_probs)
            set_prob = float(selection.set_prob)
            rows_K = candidates.rows_of(ids)
            cases_KD = candidates.embeddings_CD[rows_K]
            scores = tuple(float(q) for q in q_K)  # Q of the forward pass that chose them
            similarities = tuple(float(c) for c in np.asarray(candidates.scores_C, dtype=np.float64)[rows_K])
        cases = tuple(self._bank.get(ids)) if ids else ()
        selection_id = uuid.uuid4().hex if track else None
        if selection_id is not None:
            self._remember(selection_id, _Pending(state_D=state_D, ids=ids, cases_KD=cases_KD, probs=probs,
                                                  set_prob=set_prob, mode=mode, policy_version=version, env=env,
                                                  born=time.monotonic()))
        return SelectionResult(selection_id=selection_id, ids=tuple(ids), cases=cases, probs=tuple(probs),
                               set_prob=set_prob, mode=mode, policy_version=version, scores=scores,
                               similarities=similarities, policy_probs=policy_probs)

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

    # ------------------------------------------------------------------ several processes

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
        key = _stat_key(policy)
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
        manifest_key = _stat_key(self.path / MANIFEST_NAME)
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
                checkpoint_live(self.path, self._bank, self._feedback)
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
                         bank=self._bank, feedback=self._feedback, alpha=self.alpha)

    def _save_in_place(self) -> None:
        self._manifest = save_in_place(self.path, self._live_parts(), self._manifest, cache=self._hash_cache)

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


def _check_select_args(k: Any, mode: Any, env: Any, track: Any) -> int:
    """The arguments :meth:`Selector.select` and :meth:`Selector.select_many` share, checked; returns ``k``."""
    if isinstance(k, (bool, np.bool_)) or not isinstance(k, numbers.Integral) or k < 1:
        raise DataFormatError(f"k must be a positive integer, got {shown(k)}")
    if mode not in _MODES:
        raise DataFormatError(f"mode must be one of {_MODES}, got {shown(mode)}")
    if env is not None:
        check_id(env, "env")
    if not isinstance(track, (bool, np.bool_)):
        raise DataFormatError(f"track must be true or false, got {type(track).__name__}")
    return int(k)


def _stat_key(path: Path) -> tuple[int, int, int] | None:
    """What tells a replaced file from the one seen before (inode, mtime, size); ``None`` when it is missing."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    return (info.st_ino, info.st_mtime_ns, info.st_size)


def agent_config(config: SelectorConfig) -> SoftQConfig:
    """The soft-Q agent a selector config describes (its Q-network, learner, replay size and learning rule)."""
    return SoftQConfig(qnet=config.qnet, learner=config.learner, replay_capacity=config.replay.capacity,
                       warmup=config.warmup, updates_per_step=config.updates_per_step,
                       positive_only=config.positive_only, evidence=config.evidence, sets=config.sets)
