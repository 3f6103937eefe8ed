"""Stream order, OP and BwT with known answers."""

from __future__ import annotations

import numpy as np
import pytest

from memento.errors import ConfigError, DataFormatError
from memento.runs.lifelong import learned_points, lifelong_metrics, stream_order

TASKS = {"coin": ["c1", "c2", "c3"], "treasure": ["t1", "t2"], "qa": ["q1"]}


def test_grouped_keeps_each_environment_together_and_random_interleaves():
    grouped = stream_order(TASKS, "grouped", np.random.default_rng(0))
    envs = [env for env, _ in grouped]
    blocks = [env for i, env in enumerate(envs) if i == 0 or envs[i - 1] != env]
    assert sorted(blocks) == sorted(TASKS) and len(blocks) == 3
    assert [t for e, t in grouped if e == "coin"] == ["c1", "c2", "c3"]
    rand = stream_order(TASKS, "random", np.random.default_rng(0))
    assert sorted(t for _, t in rand) == sorted(t for ts in TASKS.values() for t in ts)
    assert rand == stream_order(TASKS, "random", np.random.default_rng(0))
    assert any(stream_order(TASKS, "random", np.random.default_rng(s)) != rand for s in range(1, 5))


def test_learned_points_are_each_environments_last_task():
    stream = [("a", 1), ("b", 2), ("a", 3), ("c", 4)]
    assert learned_points(stream) == {"a": 2, "b": 1, "c": 3}


def test_op_and_bwt_known_answer():
    out = lifelong_metrics({"a": 0.5, "b": 0.25, "c": 0.0}, {"a": 0.25, "b": 0.5, "c": 0.5})
    assert out["op"] == pytest.approx((0.25 + 0.5 + 0.5) / 3)
    assert out["bwt"] == pytest.approx((-0.5 + 1.0) / 2)  # c is learned at 0: no relative change
    assert out["bwt_abs"] == pytest.approx((-0.25 + 0.25 + 0.5) / 3)
    assert out["n_undefined"] == 1
    assert lifelong_metrics({"a": 0.0}, {"a": 0.0})["bwt"] is None


def test_bad_input():
    with pytest.raises(DataFormatError, match="different environments"):
        lifelong_metrics({"a": 1.0}, {"b": 1.0})
    with pytest.raises(ConfigError):
        stream_order(TASKS, "sorted", np.random.default_rng(0))
    with pytest.raises(DataFormatError):
        stream_order({"a": []}, "random", np.random.default_rng(0))
