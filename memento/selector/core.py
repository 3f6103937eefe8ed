"""What the concerns of a loaded selector share: the state :class:`memento.selector.runtime.Selector` holds and
each of its parts reads, its read-only properties, the open/writable checks and the query encoder.

A :class:`~memento.selector.runtime.Selector` is this core plus one class per concern, each in its own module:

- :class:`memento.selector.selecting.CaseSelecting`: candidates, the policy's draw (sample or greedy), ``select``
  and ``select_many``; owns the seeded generator and its lock;
- :class:`memento.selector.feedback.FeedbackLearning`: pending decisions, ``feedback``, the learner's updates,
  the usage counts of the feedback since the saved bank, the replay of unsaved feedback on load; owns the pending
  store;
- :class:`memento.selector.cases.BankEditing`: adding, updating, replacing, deleting, listing and searching cases,
  scopes, a case's history;
- :class:`memento.selector.persistence.ArtifactPersistence`: ``create``/``check``, ``save``, ``push_to_hub``, the
  policy published to other processes and ``sync``; owns the manifest and the keys of the files it re-reads.

The concerns share one bank, one agent and one lock (reads in parallel, writes alone), so they are mixins over
this core rather than separate objects; the encoder, whose state no other concern touches, is a part of its own
(:class:`memento.selector.encoding.QueryEncoder`).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from memento.bank.protocol import Bank
from memento.errors import MementoError
from memento.learn.learner import SoftQLearner
from memento.learn.replay import ReplayBuffer
from memento.policies import SoftQAgent
from memento.selector.artifact import EncoderSpec, FeedbackLog, SelectorConfig
from memento.selector.batching import EncodeBatcher, ReadWriteLock
from memento.selector.encoding import QueryEncoder

if TYPE_CHECKING:
    from memento.selector.pending import PendingSelection

__all__ = ["SelectorCore"]


class SelectorCore:
    """The state a selector's concerns share (set by :meth:`memento.selector.runtime.Selector.__init__`)."""

    path: Path
    config: SelectorConfig
    encoder_spec: EncoderSpec
    device: torch.device
    learn: bool
    seed: int
    read_only: bool  # another process writes the artifact (load(read_only=True))
    _manifest: dict[str, Any]  # the manifest of the last save (ArtifactPersistence writes it)
    _bank: Bank
    _feedback: FeedbackLog
    _feedback_seen: int  # feedback rows taken in: replayed on load (FeedbackLearning), by a read-only one's sync
    _featured: bool  # the Q-network reads case features
    _agent: SoftQAgent
    _encoding: QueryEncoder
    _rw: ReadWriteLock  # reads in parallel, writes alone
    _lock: AbstractContextManager[None]  # the exclusive side of _rw (re-entrant, like the RLock it replaced)
    _closed: bool

    if TYPE_CHECKING:  # what one concern calls on another (defined in the class named)
        def _remember(self, selection_id: str, pending: PendingSelection) -> None: ...  # FeedbackLearning

        def _purge_expired(self) -> None: ...  # FeedbackLearning

        def _count_usage(self, ids: Sequence[str], reward: float) -> None: ...  # FeedbackLearning

        def _save_in_place(self) -> None: ...  # ArtifactPersistence

        def _saved_rows(self, rel: str) -> int: ...  # ArtifactPersistence

        def _feedbacks(self) -> int: ...  # ArtifactPersistence

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
    def bank(self) -> Bank:
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

    def _check_open(self) -> None:
        if self._closed:
            raise MementoError(f"{self.path}: selector is closed")

    def _check_writable(self) -> None:
        self._check_open()
        if self.read_only:
            raise MementoError(f"{self.path}: this selector is read-only (another process writes the artifact: "
                               "send feedback, new cases and saves there)")

    # ------------------------------------------------------------------ encoding (the QueryEncoder's)

    def encoder(self) -> Any:
        """The text encoder (loaded on first use from ``encoder.json``), behind a front that threads may share:
        its ``encode`` runs through the dynamic batcher after :meth:`batch_encoding`, else one call at a time
        (the front's other attributes, and ``.encoder``, are the encoder's own)."""
        return self._encoding.encoder()

    def batch_encoding(self, max_texts: int | None = 32, wait_ms: float = 2.0) -> EncodeBatcher | None:
        """From now on encode texts (queries, new cases' states, action texts of case features) through a
        dynamic batcher: concurrent calls are grouped, up to ``max_texts`` texts or until ``wait_ms`` ms after
        the first, into one forward pass in the batcher's thread (:class:`memento.selector.batching.EncodeBatcher`).
        Returns the batcher (its ``stats()`` count the forwards). ``max_texts=None`` switches batching off
        again; the old batcher encodes what it holds and stops."""
        return self._encoding.batch(max_texts, wait_ms)

    @property
    def _batcher(self) -> EncodeBatcher | None:
        """The dynamic batcher texts are encoded through, ``None`` when batching is off."""
        return self._encoding.batcher

    def _encode_actions(self, texts: list[str]) -> np.ndarray:
        """Action vectors for the case features (the selector's text encoder)."""
        return self._encoding.actions(texts)

    def _state(self, query: Any, what: str = "query") -> np.ndarray:
        """A query text or vector as a unit float32 vector ``[D]``."""
        return self._encoding.state(query, what)

    def _states(self, queries: Sequence[str] | np.ndarray) -> np.ndarray:
        """Queries as unit float32 state vectors ``[B, D]``: texts encoded in one call, vectors as given."""
        return self._encoding.states(queries)

