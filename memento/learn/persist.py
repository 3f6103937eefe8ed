"""The soft-Q learning state on disk: where it lives and how a trained selector's learner is read back.

A soft-Q agent (:class:`memento.policies.soft_q.SoftQAgent`) saves its learner in ``learner/`` and its replay buffer
in ``replay/`` (:func:`save_state`; its online labels in ``labels/``), the same layout in a run's checkpoint and in
an exported selector artifact (:mod:`memento.selector.artifact`); :func:`load_trained_learner` reads the learner of
a trained selector directory (what ``SoftQLearner.save`` or ``memento train`` writes). Nothing here needs the agent
itself, so the selector's artifact and export read and write this layout without the policies.
"""

from __future__ import annotations

import logging
from pathlib import Path

from memento.errors import CheckpointError, DimensionError
from memento.learn.learner import SoftQLearner
from memento.learn.replay import ReplayBuffer

__all__ = ["LABELS_DIR", "LEARNER_DIR", "REPLAY_DIR", "load_trained_learner", "save_state"]

logger = logging.getLogger(__name__)

LEARNER_DIR = "learner"
REPLAY_DIR = "replay"
LABELS_DIR = "labels"
"""Where a soft-Q agent's checkpoint puts the learner, the replay buffer and the label buffer (a checkpoint, an
artifact)."""


def load_trained_learner(path: str | Path, dim: int) -> SoftQLearner:
    """The :class:`~memento.learn.learner.SoftQLearner` of a trained selector directory (``SoftQLearner.save``), or of
    a run holding one in ``selector/`` (``memento train``), on the CPU.

    Raises :class:`~memento.errors.DimensionError` when its Q-network scores ``dim'``-dimensional vectors and
    the caller's encoder or bank gives ``dim``, and :class:`~memento.errors.CheckpointError` when ``path``
    holds no selector.
    """
    path = Path(path)
    if not (path / "learner.json").is_file() and (path / "selector" / "learner.json").is_file():
        path = path / "selector"
    if not (path / "learner.json").is_file():
        raise CheckpointError(f"{path}: not a trained selector directory (no learner.json; expected what "
                              "SoftQLearner.save or `memento train` writes)")
    learner = SoftQLearner.load(path, device="cpu")
    if learner.qnet.config.dim != dim:
        raise DimensionError(f"{path}: the Q-network takes dim={learner.qnet.config.dim}, the encoder gives "
                             f"dim={dim}")
    logger.info("trained Q-network from %s (arch=%s)", path, learner.qnet.config.arch)
    return learner


def save_state(directory: str | Path, learner: SoftQLearner, buffer: ReplayBuffer) -> None:
    """A soft-Q agent's learning state: ``learner/`` and ``replay/`` in ``directory`` (a checkpoint, an artifact)."""
    learner.save(Path(directory) / LEARNER_DIR)
    buffer.save(Path(directory) / REPLAY_DIR)
