"""The names of a selector artifact's files and formats (docs/formats.md, "Selector artifact").

Which part writes which file is :mod:`memento.selector.artifact.parts`; the manifest is named, read and written by
its owner alone, :mod:`memento.selector.artifact.manifest`.
"""

from __future__ import annotations

import os

from memento.bank.local import DERIVED_NAMES
from memento.learn.persist import LEARNER_DIR, REPLAY_DIR

__all__ = ["BANK_DB", "BANK_DIR", "CARD_NAME", "CONFIG_NAME", "DERIVED_FILES", "ENCODER_FILES_DIR", "ENCODER_FORMAT",
           "ENCODER_FORMAT_VERSION", "ENCODER_NAME", "FEEDBACK_FORMAT", "FEEDBACK_FORMAT_VERSION", "FEEDBACK_NAME",
           "LEARNER_DIR", "POLICY_FORMAT", "POLICY_NAME", "QNET_FORMAT", "QNET_NAME", "READY_DIR",
           "REBUILT_FILES", "REPLAY_DIR", "SELECTOR_FORMAT", "SELECTOR_FORMAT_VERSION", "STAGING_DIR"]

SELECTOR_FORMAT = "memento-selector"
SELECTOR_FORMAT_VERSION = 1
ENCODER_FORMAT = "memento-encoder"
ENCODER_FORMAT_VERSION = 1
FEEDBACK_FORMAT = "memento-feedback"
FEEDBACK_FORMAT_VERSION = 1
QNET_FORMAT = "memento-qnet"

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
ENCODER_FILES_DIR = "encoder"
"""Where an artifact keeps its own copy of a local encoder (``EncoderSpec.files``)."""

DERIVED_FILES = (f"{BANK_DIR}/index.faiss", f"{BANK_DIR}/index.json")
"""Rebuilt from cases.sqlite by the bank when stale; they change when cases are added."""
REBUILT_FILES = tuple(f"{BANK_DIR}/{name}" for name in DERIVED_NAMES)
"""The :data:`DERIVED_FILES` and, for a bank with its vectors on disk, vectors.f32 and vectors.json: all that the
bank rebuilds from cases.sqlite."""

SQLITE_SIDECARS = ("-wal", "-shm", "-journal")
HASH_CHUNK = 1 << 20
O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
