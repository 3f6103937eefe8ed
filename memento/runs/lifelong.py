"""Lifelong evaluation over a stream of environments: the stream's order, overall performance and backward transfer.

A **stream** is the sequence of training tasks of several environments (TextWorld game types, question
families). Two orders (LifeMem compares them):

- ``"grouped"``: the environments in a seeded random order, each environment's tasks together, in their order;
- ``"random"``: every task of every environment in one seeded random order (environments interleaved).

An environment is **learned** at the position of its last training task in the stream; its score then (its
evaluation tasks, played with the memory and policy as they are at that point) is ``learned[env]``, and its score
after the whole stream is ``final[env]``. Then

- **OP** (overall performance) = the mean of ``final`` over environments;
- **BwT** (backward transfer) = the mean over environments with ``learned > 0`` of the relative change
  ``(final - learned) / learned`` (negative: forgetting; an environment learned at 0 has no relative change and
  is left out of it, counted in ``n_undefined``), and ``bwt_abs`` = the mean absolute change ``final - learned``
  over all environments.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, TypeVar, get_args

import numpy as np

from memento.errors import ConfigError, DataFormatError

__all__ = ["StreamOrder", "learned_points", "lifelong_metrics", "stream_order"]

StreamOrder = Literal["grouped", "random"]

T = TypeVar("T")


def stream_order(tasks_by_env: Mapping[str, Sequence[T]], order: StreamOrder,
                 rng: np.random.Generator) -> list[tuple[str, T]]:
    """The stream of ``(env, task)`` pairs in ``order`` (see the module docstring), drawn with ``rng``."""
    if order not in get_args(StreamOrder):
        raise ConfigError(f"stream order must be one of {get_args(StreamOrder)}, got {order!r}")
    envs = [env for env, tasks in tasks_by_env.items() if len(tasks)]
    if not envs:
        raise DataFormatError("the stream has no task")
    if order == "grouped":
        return [(envs[i], task) for i in rng.permutation(len(envs)) for task in tasks_by_env[envs[i]]]
    pairs = [(env, task) for env in envs for task in tasks_by_env[env]]
    return [pairs[i] for i in rng.permutation(len(pairs))]


def learned_points(stream: Sequence[tuple[str, Any]]) -> dict[str, int]:
    """For each environment, the 0-based position of its last task in ``stream`` (where it is learned)."""
    return {env: i for i, (env, _) in enumerate(stream)}


def lifelong_metrics(learned: Mapping[str, float], final: Mapping[str, float]) -> dict[str, Any]:
    """OP, BwT (relative) and the absolute change (see the module docstring), with the per-environment figures."""
    if set(learned) != set(final):
        raise DataFormatError(f"learned and final scores cover different environments: {sorted(learned)} vs "
                              f"{sorted(final)}")
    if not final:
        raise DataFormatError("no environment to evaluate")
    envs = sorted(final)
    rel = [(final[e] - learned[e]) / learned[e] for e in envs if learned[e] > 0]
    return {
        "op": float(np.mean([final[e] for e in envs])),
        "bwt": float(np.mean(rel)) if rel else None,
        "bwt_abs": float(np.mean([final[e] - learned[e] for e in envs])),
        "n_undefined": len(envs) - len(rel),
        "per_env": {e: {"learned": float(learned[e]), "final": float(final[e])} for e in envs},
    }
