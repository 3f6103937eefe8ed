"""LinUCB (Li et al., 2010): a linear contextual bandit over (state, case) features.

Each (state, case) pair becomes a feature vector ``x = phi(s, c)`` (``features``):

- ``"product_concat"`` (default): ``[s * c, c]`` (2D) — a diagonal bilinear match term plus a
  per-direction case prior; it can learn "cases like this help tasks like that" and "this
  region of the bank is good in general";
- ``"product"``: ``s * c`` (D);
- ``"concat"``: ``[s, c]`` (2D; with a shared model the state part cannot change the ranking);
- ``"state"``: ``s`` (D) — the classic disjoint LinUCB context; only with ``mode="disjoint"``;

plus, with ``intercept=True`` (default), a constant 1 (the mean reward level; per case in
disjoint mode, so even ``"state"`` features can learn that one case is better than another).

``mode="shared"`` fits one ridge regression ``r ~ x . theta`` for all cases (generalises to
cases never shown); ``mode="disjoint"`` fits one per case id (created on first update; an
unseen case has ``theta = 0`` and the prior's full bonus). The score of a candidate is

    ucb_c = x_c . theta + exploration * sqrt(x_c^T A^-1 x_c),   A = ridge * I + sum x x^T,

with ``A^-1`` kept up to date by Sherman-Morrison (O(F^2) per update).

Selection is deterministic: top-K by UCB, or top-K by the mean ``x . theta`` when
``greedy=True`` (pure exploitation, for evaluation). The returned ``Selection`` therefore
has ``greedy=True`` and ``set_prob=1.0``; its ``probs_C`` (like :meth:`LinUCBPolicy.probs`)
report ``softmax(ucb / temperature)`` as a diagnostic, not as a sampling law.

Rewards should be on the scale the bonus assumes (e.g. 0/1): an unseen direction scores only
its bonus, so rewards far above ``exploration`` make the policy stop exploring.

Credit for a K-case selection: :meth:`LinUCBPolicy.update_selection` gives the set's reward
to every chosen case (the same task-level credit Memento's data carries); call
:meth:`LinUCBPolicy.update` per case when finer credit is known.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Literal, get_args

import numpy as np

from memento.config import check, check_int
from memento.errors import DataFormatError, DimensionError
from memento.memory import Candidates
from memento.policy import check_candidates, check_k, make_selection, softmax, top_k
from memento.types import Selection

__all__ = ["LinUCBConfig", "LinUCBFeatures", "LinUCBMode", "LinUCBPolicy", "linucb_features"]

LinUCBFeatures = Literal["product_concat", "product", "concat", "state"]
LinUCBMode = Literal["shared", "disjoint"]


def _positive_float(obj: object, field: str) -> None:
    value = getattr(obj, field)
    check(isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0,
           type(obj), field, value, "must be a finite number > 0")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LinUCBConfig:
    """Options of :class:`LinUCBPolicy` (see the module docstring).

    ``dim`` is the state/case vector dimension D; ``exploration`` the width of the confidence
    bonus (Li et al.'s alpha; 0 = greedy ridge regression); ``ridge`` the prior precision;
    ``temperature`` only shapes the reported ``probs_C``; ``intercept`` appends a constant 1.
    """

    dim: int
    features: LinUCBFeatures = "product_concat"
    mode: LinUCBMode = "shared"
    intercept: bool = True
    exploration: float = 1.0
    ridge: float = 1.0
    temperature: float = 0.1

    def __post_init__(self) -> None:
        check_int(self, "dim", 1)
        check(self.features in get_args(LinUCBFeatures), type(self), "features", self.features,
               f"must be one of {get_args(LinUCBFeatures)}")
        check(self.mode in get_args(LinUCBMode), type(self), "mode", self.mode,
               f"must be one of {get_args(LinUCBMode)}")
        check(not (self.features == "state" and self.mode == "shared"), type(self), "features", self.features,
               "'state' features are the same for every case, so they need mode='disjoint'")
        e = self.exploration
        check(isinstance(e, (int, float)) and not isinstance(e, bool) and math.isfinite(e) and e >= 0,
               type(self), "exploration", e, "must be a finite number >= 0")
        check(isinstance(self.intercept, bool), type(self), "intercept", self.intercept, "must be true or false")
        _positive_float(self, "ridge")
        _positive_float(self, "temperature")

    @property
    def feature_dim(self) -> int:
        """F, the length of ``phi(s, c)``."""
        base = 2 * self.dim if self.features in ("product_concat", "concat") else self.dim
        return base + int(self.intercept)


def linucb_features(state_D: np.ndarray, cases_CD: np.ndarray, features: LinUCBFeatures, *,
                    intercept: bool = True) -> np.ndarray:
    """``phi(s, c)`` for each case row: ``X_CF`` in float64 (see the module docstring)."""
    s_D = np.asarray(state_D, dtype=np.float64)
    c_CD = np.asarray(cases_CD, dtype=np.float64)
    match features:
        case "product_concat":
            parts = [c_CD * s_D, c_CD]
        case "product":
            parts = [c_CD * s_D]
        case "concat":
            parts = [np.broadcast_to(s_D, c_CD.shape), c_CD]
        case "state":
            parts = [np.broadcast_to(s_D, c_CD.shape)]
        case _:
            raise DataFormatError(f"unknown LinUCB features {features!r}; expected one of {get_args(LinUCBFeatures)}")
    if intercept:
        parts.append(np.ones((c_CD.shape[0], 1)))
    return np.concatenate(parts, axis=1)


class _Ridge:
    """One online ridge regression: ``A^-1`` (Sherman-Morrison) and ``b``."""

    __slots__ = ("A_inv_FF", "b_F", "n")

    def __init__(self, f: int, ridge: float):
        self.A_inv_FF = np.eye(f) / ridge
        self.b_F = np.zeros(f)
        self.n = 0

    def update(self, x_F: np.ndarray, reward: float) -> None:
        ax_F = self.A_inv_FF @ x_F
        self.A_inv_FF -= np.outer(ax_F, ax_F) / (1.0 + x_F @ ax_F)
        self.b_F += reward * x_F
        self.n += 1
        if self.n % 256 == 0:  # keep A^-1 symmetric despite rounding
            self.A_inv_FF = 0.5 * (self.A_inv_FF + self.A_inv_FF.T)

    def scores(self, X_CF: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        theta_F = self.A_inv_FF @ self.b_F
        var_C = ((X_CF @ self.A_inv_FF) * X_CF).sum(axis=1)
        return X_CF @ theta_F, np.sqrt(np.maximum(var_C, 0.0))


class LinUCBPolicy:
    """Upper-confidence-bound selection with online ridge regression (see the module docstring)."""

    def __init__(self, config: LinUCBConfig):
        if not isinstance(config, LinUCBConfig):
            raise DataFormatError(f"LinUCBPolicy needs a LinUCBConfig, got {type(config).__name__}")
        self.config = config
        self._shared = _Ridge(config.feature_dim, config.ridge) if config.mode == "shared" else None
        self._per_case: dict[str, _Ridge] = {}
        self.n_updates = 0

    def _check_dim(self, d: int, what: str) -> None:
        if d != self.config.dim:
            raise DimensionError(f"{what} has dimension {d}, but LinUCBConfig.dim={self.config.dim}")

    def scores(self, state_D: np.ndarray, candidates: Candidates) -> tuple[np.ndarray, np.ndarray]:
        """``(mean_C, bonus_C)``: the ridge estimate ``x . theta`` and ``exploration * sqrt(x^T A^-1 x)``."""
        state = check_candidates(state_D, candidates)
        self._check_dim(state.shape[0], "state")
        X_CF = linucb_features(state, candidates.embeddings_CD, self.config.features, intercept=self.config.intercept)
        if self._shared is not None:
            mean_C, width_C = self._shared.scores(X_CF)
        else:
            mean_C = np.zeros(len(candidates))
            width_C = np.linalg.norm(X_CF, axis=1) / math.sqrt(self.config.ridge)  # an unseen case's prior
            for c, case_id in enumerate(candidates.ids):
                model = self._per_case.get(case_id)
                if model is not None:
                    m, w = model.scores(X_CF[c:c + 1])
                    mean_C[c], width_C[c] = m[0], w[0]
        return mean_C, self.config.exploration * width_C

    def ucb(self, state_D: np.ndarray, candidates: Candidates) -> np.ndarray:
        """The upper confidence bound ``mean + bonus`` of each candidate."""
        mean_C, bonus_C = self.scores(state_D, candidates)
        return mean_C + bonus_C

    def probs(self, state_D: np.ndarray, candidates: Candidates) -> np.ndarray:
        """``softmax(ucb / temperature)``: a diagnostic; the choice itself is deterministic."""
        return softmax(self.ucb(state_D, candidates), self.config.temperature)

    def select(self, state_D: np.ndarray, candidates: Candidates, k: int, *, rng: np.random.Generator,
               greedy: bool = False) -> Selection:
        """Top-K by UCB, or by the mean estimate when ``greedy``; ``rng`` is unused (deterministic)."""
        mean_C, bonus_C = self.scores(state_D, candidates)
        ucb_C = mean_C + bonus_C
        k = check_k(k, len(candidates))
        order_K = top_k(mean_C if greedy else ucb_C, k)
        return make_selection(candidates, softmax(ucb_C, self.config.temperature), order_K, greedy=True)

    def update(self, state_D: np.ndarray, case_D: np.ndarray, reward: float, *, case_id: str | None = None) -> None:
        """Add one observation ``(phi(state, case), reward)``; ``case_id`` is required in disjoint mode."""
        state = np.asarray(state_D, dtype=np.float64)
        case = np.asarray(case_D, dtype=np.float64)
        if state.ndim != 1 or case.shape != state.shape:
            raise DimensionError(f"update takes state [D] and case [D], got {state.shape=} {case.shape=}")
        self._check_dim(state.shape[0], "state")
        if not (np.isfinite(state).all() and np.isfinite(case).all()):
            raise DataFormatError("update: state or case vector contains NaN or inf")
        if (isinstance(reward, (bool, np.bool_)) or not isinstance(reward, numbers.Real)
                or not math.isfinite(reward)):
            raise DataFormatError(f"reward must be a finite number, got {reward!r}")
        x_F = linucb_features(state, case[None, :], self.config.features, intercept=self.config.intercept)[0]
        if self._shared is not None:
            model = self._shared
        else:
            if not isinstance(case_id, str) or not case_id:
                raise DataFormatError(f"LinUCB mode='disjoint' needs the case_id of each update, got {case_id!r}")
            model = self._per_case.get(case_id)
            if model is None:
                model = self._per_case[case_id] = _Ridge(self.config.feature_dim, self.config.ridge)
        model.update(x_F, float(reward))
        self.n_updates += 1

    def update_selection(self, state_D: np.ndarray, candidates: Candidates, selection: Selection,
                         reward: float) -> None:
        """Credit the set's ``reward`` to each case of ``selection`` (made from ``candidates``)."""
        if list(selection.candidate_ids) != list(candidates.ids):
            raise DataFormatError("selection was made from another candidate set "
                                  f"({len(selection.candidate_ids)} vs {len(candidates)} candidate ids differ)")
        for p in selection.positions_K:
            self.update(state_D, candidates.embeddings_CD[int(p)], reward, case_id=candidates.ids[int(p)])

    def __repr__(self) -> str:
        return f"LinUCBPolicy({self.config!r}, n_updates={self.n_updates})"
