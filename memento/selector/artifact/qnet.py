"""The Q-network's files: ``qnet.safetensors`` (the artifact's, for consumers that only score) and
``.policy.safetensors`` (the Q-network a learner process publishes for read-only selectors in other processes:
dot-named, volatile, never in the manifest)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from memento.config import QNetConfig, parses_to, to_dict
from memento.errors import CheckpointError, DataFormatError, DimensionError
from memento.io import atomic_write, loads_json, read_safetensors
from memento.learn.learner import SoftQLearner
from memento.selector.artifact.layout import LEARNER_DIR, POLICY_FORMAT, POLICY_NAME, QNET_FORMAT

__all__ = ["check_qnet_file", "read_policy", "write_policy", "write_qnet"]

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


def check_qnet_file(path: Path, learner: SoftQLearner) -> None:
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
