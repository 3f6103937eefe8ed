"""SYNTHETIC contextual bandits over a case bank, with a known oracle.

Nothing here is real data: it is a generated world in which the best achievable success
rate is known exactly, so that regret can be measured. The world:

- ``T`` latent **task types**, each with a random unit centroid ``mu_t`` in R^D.
- ``N`` cases. A **genuine** case belongs to one task type ``t``; its vector is
  ``unit(mu_t + noise * g / sqrt(D))`` with ``g ~ N(0, I)``, like the tasks of that type.
  A **distractor** case imitates a task type ``t`` (a look-alike, near-duplicate surface
  form): its vector is ``unit(d_t + distractor_noise * g / sqrt(D))`` around a centroid
  ``d_t = unit(mu_t + distractor_offset * u_t)`` (``u_t`` a unit vector orthogonal to ``mu_t``)
  that is close to ``mu_t``, and tightly clustered — so for a task of type ``t`` distractors
  are often *more* cosine-similar than genuine cases, yet they do not help.
- Each case has a hidden **quality** ``q ~ U(0, 1)`` that no vector encodes.
- A task of type ``t`` is ``unit(mu_t + noise * g / sqrt(D))``.

The oracle. Showing one case ``c`` for a task of type ``t`` succeeds with probability

    p(t, c) = sigmoid(match_weight * match(t, c) + quality_weight * q_c + bias),

``match(t, c) = 1`` when ``c`` is a genuine case of type ``t`` and 0 otherwise (distractors
and other types). A set ``S`` of cases succeeds with ``mean_{c in S} p(t, c)`` (default: an
unhelpful case in the prompt dilutes the helpful ones) or ``max_{c in S} p(t, c)``
(``aggregate="max"``: one good case is enough). The empty set succeeds with ``sigmoid(bias)``
(no memory). Both aggregates are maximised over sets of exactly ``k`` cases by the ``k``
cases of largest ``p(t, c)``, so :meth:`SyntheticBandit.best_success_prob` is O(1) after an
O(T N log N) precomputation; regret of a choice ``S`` of ``k`` cases is
``best_success_prob(task, k) - success_prob(task, S)`` (a choice of fewer than ``k`` cases can
score above the best ``k``-set under ``"mean"``: regret is defined for exactly ``k``).

Stored rewards (``Case.reward``) are one Bernoulli draw of each case's success *in its own
original context*, ``sigmoid(match_weight + quality_weight * q + bias)`` for genuine and
distractor cases alike (a distractor did solve its own, unlisted task): past success
correlates with quality but says nothing about helpfulness for another task type.

Similarity retrieval sees types (roughly) but not quality, and is lured by distractors, so it
is not optimal; a learner that observes rewards can find the good cases. Positions passed to
``success_prob``/``reward`` index :meth:`SyntheticBandit.cases` in order; they are the bank
positions when the cases are added, in that order, to an empty bank. All randomness is
seeded: the world from ``config.seed``, tasks and rewards from the ``rng`` passed in.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import numbers
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from memento.config import check, check_choice, check_ints
from memento.errors import DataFormatError, DimensionError
from memento.types import Case, Task

__all__ = ["Aggregate", "SyntheticBandit", "SyntheticBanditConfig"]

logger = logging.getLogger(__name__)

Aggregate = Literal["mean", "max"]

ENV_NAME = "synthetic"


def _real(obj: Any, field: str, minimum: float | None = None, maximum: float | None = None,
          *, open_max: bool = False) -> None:
    value = getattr(obj, field)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok and minimum is not None:
        ok = value >= minimum
    if ok and maximum is not None:
        ok = value < maximum if open_max else value <= maximum
    bounds = "" if minimum is None and maximum is None else (
        f" in [{minimum}, {maximum}{')' if open_max else ']'}" if maximum is not None else f" >= {minimum}")
    check(ok, type(obj), field, value, f"must be a finite number{bounds}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SyntheticBanditConfig:
    """The generated world of :class:`SyntheticBandit` (see the module docstring for each knob)."""

    n_task_types: int = 8
    n_cases: int = 400
    dim: int = 32
    noise: float = 0.5
    distractor_fraction: float = 0.3
    distractor_offset: float = 0.4
    distractor_noise: float = 0.1
    match_weight: float = 4.0
    quality_weight: float = 3.0
    bias: float = -4.0
    aggregate: Aggregate = "mean"
    seed: int = 0

    def __post_init__(self) -> None:
        check_ints(self, n_task_types=1, n_cases=1, dim=2, seed=0)
        _real(self, "noise", 0.0)
        _real(self, "distractor_fraction", 0.0, 1.0, open_max=True)
        _real(self, "distractor_offset", 0.0)
        _real(self, "distractor_noise", 0.0)
        for field in ("match_weight", "quality_weight", "bias"):
            _real(self, field)
        check_choice(self, "aggregate", Aggregate)


def _sigmoid(x: Any) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * np.asarray(x, dtype=np.float64)))


def _unit_rows(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


class SyntheticBandit:
    """A SYNTHETIC case-selection bandit with a known oracle (see the module docstring).

    Public arrays (read-only by convention): ``centroids_TD``, ``distractor_centroids_TD``,
    ``case_type_N`` (the task type each case belongs to or imitates), ``is_distractor_N``,
    ``quality_N`` (hidden), ``embeddings_ND`` and ``success_TN`` (``p(t, c)``).
    """

    def __init__(self, config: SyntheticBanditConfig | None = None):
        self.config = config = config if config is not None else SyntheticBanditConfig()
        rng = np.random.default_rng(config.seed)
        t, n, d = config.n_task_types, config.n_cases, config.dim
        self.centroids_TD = _unit_rows(rng.normal(size=(t, d)))
        u_TD = rng.normal(size=(t, d))
        u_TD -= np.sum(u_TD * self.centroids_TD, axis=1, keepdims=True) * self.centroids_TD
        u_TD = _unit_rows(u_TD)
        self.distractor_centroids_TD = _unit_rows(self.centroids_TD + config.distractor_offset * u_TD)

        n_distractors = int(round(config.distractor_fraction * n))
        is_distractor = np.arange(n) >= n - n_distractors
        case_type = np.concatenate([np.arange(n - n_distractors) % t, np.arange(n_distractors) % t])
        order = rng.permutation(n)
        self.is_distractor_N = is_distractor[order]
        self.case_type_N = case_type[order].astype(np.int64)
        self.quality_N = rng.uniform(size=n)

        centres_ND = np.where(self.is_distractor_N[:, None], self.distractor_centroids_TD[self.case_type_N],
                              self.centroids_TD[self.case_type_N])
        spread_N = np.where(self.is_distractor_N, config.distractor_noise, config.noise)
        noise_ND = rng.normal(size=(n, d)) / math.sqrt(d)
        self.embeddings_ND = _unit_rows(centres_ND + spread_N[:, None] * noise_ND).astype(np.float32)

        match_TN = (self.case_type_N[None, :] == np.arange(t)[:, None]) & ~self.is_distractor_N[None, :]
        self.success_TN = _sigmoid(config.match_weight * match_TN + config.quality_weight * self.quality_N[None, :]
                                   + config.bias)
        own_N = _sigmoid(config.match_weight + config.quality_weight * self.quality_N + config.bias)
        self._stored_rewards_N = (rng.uniform(size=n) < own_N).astype(np.float64)

        # the oracle's ranking per task type, and prefix sums for O(1) best-k means
        self._ranked_TN = np.argsort(-self.success_TN, axis=1, kind="stable")
        ranked_p_TN = np.take_along_axis(self.success_TN, self._ranked_TN, axis=1)
        self._prefix_TN1 = np.concatenate([np.zeros((t, 1)), np.cumsum(ranked_p_TN, axis=1)], axis=1)
        self._ids = [f"syn-{i:06d}" for i in range(n)]
        self._positions = {case_id: i for i, case_id in enumerate(self._ids)}
        self._n_tasks = 0
        logger.debug("synthetic bandit: %d task types, %d cases (%d distractors), dim %d", t, n, n_distractors, d)

    # ------------------------------------------------------------------ the bank side

    @property
    def n_cases(self) -> int:
        return self.config.n_cases

    def cases(self) -> tuple[list[Case], np.ndarray]:
        """The cases (ids ``syn-000000``...) and their unit vectors ``embeddings_ND`` (float32), to fill a bank."""
        out = []
        for i, case_id in enumerate(self._ids):
            kind = "look-alike" if self.is_distractor_N[i] else "worked"
            out.append(Case(id=case_id, state=f"synthetic task of type {int(self.case_type_N[i])}: {kind} case {i}",
                            action=f"synthetic action {i}", reward=float(self._stored_rewards_N[i]), env=ENV_NAME,
                            meta={"synthetic": True, "case_type": int(self.case_type_N[i]),
                                  "distractor": bool(self.is_distractor_N[i])}))
        return out, self.embeddings_ND.copy()

    def positions(self, ids: Sequence[str]) -> np.ndarray:
        """Case positions of the given case ids."""
        try:
            return np.array([self._positions[i] for i in ids], dtype=np.int64)
        except KeyError as error:
            raise DataFormatError(f"not a case id of this synthetic bandit: {error.args[0]!r}") from None

    # ------------------------------------------------------------------ tasks

    def sample_task(self, rng: np.random.Generator) -> tuple[Task, np.ndarray]:
        """A task of a uniformly drawn type and its state vector ``state_D`` (float32, unit norm).

        The task's type is in ``task.meta["task_type"]`` (and ``task.family``); ids count up per env.
        """
        t = int(rng.integers(self.config.n_task_types))
        noise_D = rng.normal(size=self.config.dim) / math.sqrt(self.config.dim)
        state_D = _unit_rows(self.centroids_TD[t] + self.config.noise * noise_D).astype(np.float32)
        task = Task(id=f"syn-task-{self._n_tasks:06d}", question=f"synthetic task of type {t}", answers=("1",),
                    family=f"type-{t}", env=ENV_NAME, meta={"synthetic": True, "task_type": t})
        self._n_tasks += 1
        return task, state_D

    def task_type(self, task: Task | int) -> int:
        """The latent type of ``task`` (a task from :meth:`sample_task`, or a type index)."""
        if isinstance(task, Task):
            t = task.meta.get("task_type")
        else:
            t = task
        n_types = self.config.n_task_types
        if isinstance(t, (bool, np.bool_)) or not isinstance(t, numbers.Integral) or not 0 <= int(t) < n_types:
            raise DataFormatError(f"not a task of this synthetic bandit (task_type={t!r}, "
                                  f"n_task_types={self.config.n_task_types})")
        return int(t)

    # ------------------------------------------------------------------ the oracle

    def _check_positions(self, chosen_positions: Any) -> np.ndarray:
        chosen = np.asarray(chosen_positions)
        if chosen.ndim != 1:
            raise DimensionError(f"chosen positions must be a vector [K], got {chosen.shape=}")
        if chosen.size and not np.issubdtype(chosen.dtype, np.integer):
            raise DataFormatError(f"chosen positions must be integers, got dtype {chosen.dtype}")
        chosen = chosen.astype(np.int64)
        if chosen.size and (chosen.min() < 0 or chosen.max() >= self.n_cases):
            raise DataFormatError(f"chosen positions must lie in [0, {self.n_cases}), got {chosen.tolist()}")
        if len(set(chosen.tolist())) != chosen.size:
            raise DataFormatError(f"chosen positions repeat a case: {chosen.tolist()}")
        return chosen

    def _check_k(self, k: int) -> int:
        if isinstance(k, (bool, np.bool_)) or not isinstance(k, numbers.Integral) or k < 1:
            raise DataFormatError(f"k must be a positive integer, got {k!r}")
        return min(int(k), self.n_cases)

    def case_success_probs(self, task: Task | int) -> np.ndarray:
        """``p(t, c)`` for every case (float64 ``[N]``, a copy)."""
        return self.success_TN[self.task_type(task)].copy()

    def success_prob(self, task: Task | int, chosen_positions: Any) -> float:
        """The oracle: probability that showing these cases solves ``task`` (in [0, 1])."""
        t = self.task_type(task)
        chosen = self._check_positions(chosen_positions)
        if chosen.size == 0:
            return float(_sigmoid(self.config.bias))
        p_K = self.success_TN[t, chosen]
        return float(p_K.mean() if self.config.aggregate == "mean" else p_K.max())

    def best_success_prob(self, task: Task | int, k: int) -> float:
        """The largest :meth:`success_prob` over sets of exactly ``min(k, N)`` cases (O(1))."""
        t = self.task_type(task)
        k = self._check_k(k)
        if self.config.aggregate == "mean":
            return float(self._prefix_TN1[t, k] / k)
        return float(self._prefix_TN1[t, 1])

    def oracle_positions(self, task: Task | int, k: int, among: Any = None) -> np.ndarray:
        """The ``k`` cases of largest ``p(t, c)``, best first: an optimal set (restricted to ``among`` if given)."""
        t = self.task_type(task)
        k = self._check_k(k)
        if among is None:
            return self._ranked_TN[t, :k].copy()
        pool = self._check_positions(among)
        if pool.size == 0:
            raise DataFormatError("oracle_positions: among is empty")
        return pool[np.argsort(-self.success_TN[t, pool], kind="stable")[:k]]

    def regret(self, task: Task | int, chosen_positions: Any, k: int | None = None) -> float:
        """``best_success_prob(task, k) - success_prob(task, chosen)``; ``k`` defaults to the set's size."""
        chosen = self._check_positions(chosen_positions)
        kk = k if k is not None else max(int(chosen.size), 1)
        return self.best_success_prob(task, kk) - self.success_prob(task, chosen)

    def reward(self, task: Task | int, chosen_positions: Any, rng: np.random.Generator) -> float:
        """A Bernoulli draw with the oracle's success probability: 1.0 or 0.0."""
        return float(rng.uniform() < self.success_prob(task, chosen_positions))

    def __repr__(self) -> str:
        return f"SyntheticBandit({self.config!r})"
