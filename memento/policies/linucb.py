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
:meth:`LinUCBPolicy.update` per case when finer credit is known. ``observe`` (the
:class:`~memento.learn.policy.Policy` protocol) does ``update_selection`` for each decision of a round
and logs every (state, case, reward, case id) it was updated with: ``checkpoint`` writes that log
(``linucb.safetensors`` + ``linucb.json``) and ``restore`` replays it in order, so a resumed run ends
with the same matrices as an uninterrupted one.

The module is the whole policy: its config (:class:`LinUCBConfig`), the policy (:class:`LinUCBPolicy`), its factory
entry (:func:`build`) and its run defaults (the class's own defaults in every run), declared in :data:`SPEC`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
from collections.abc import Sequence
from pathlib import Path
from typing import Literal, get_args

import numpy as np

from memento.bank import Candidates
from memento.config import MAX_LINUCB_DIM, check, check_bools, check_choice, check_float, check_int
from memento.errors import CheckpointError, ConfigError, DataFormatError, DimensionError
from memento.io import atomic_write, atomic_write_text, read_safetensors
from memento.learn.policy import (
    Observation,
    PolicyContext,
    StaticPolicy,
    check_candidates,
    check_k,
    make_selection,
    softmax,
    top_k,
)
from memento.policies.spec import PolicySpec
from memento.types import Selection

__all__ = ["SPEC", "LinUCBConfig", "LinUCBFeatures", "LinUCBMode", "LinUCBPolicy", "build", "linucb_features"]

LinUCBFeatures = Literal["product_concat", "product", "concat", "state"]
LinUCBMode = Literal["shared", "disjoint"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class LinUCBConfig:
    """Options of ``memento.policies.linucb.LinUCBPolicy``.

    ``dim`` is the state/case vector dimension D (``None`` in a run config: the encoder gives it);
    ``features`` the (state, case) features; ``mode`` one shared ridge regression or one per case;
    ``exploration`` the width of the confidence bonus (Li et al.'s alpha; 0 = greedy ridge regression);
    ``ridge`` the prior precision; ``temperature`` only shapes the reported ``probs_C``; ``intercept``
    appends a constant 1.
    """

    kind: Literal["linucb"] = dataclasses.field(default="linucb", metadata={"help": (
        "the policy: a LinUCB contextual bandit on (state, case) features")})
    dim: int | None = dataclasses.field(default=None, metadata={"help": (
        "the state/case vector dimension D (none: the run's encoder gives it)")})
    features: LinUCBFeatures = dataclasses.field(default="product_concat", metadata={"help": (
        "the (state, case) features: product_concat [s * c, c], product s * c, concat [s, c], or state s (only "
        "with mode disjoint)")})
    mode: LinUCBMode = dataclasses.field(default="shared", metadata={"help": (
        "shared: one ridge regression for all cases; disjoint: one per case")})
    intercept: bool = dataclasses.field(default=True, metadata={"help": "append a constant 1 to the features"})
    exploration: float = dataclasses.field(default=1.0, metadata={"help": (
        "width of the confidence bonus (Li et al.'s alpha; 0: greedy ridge regression)")})
    ridge: float = dataclasses.field(default=1.0, metadata={"help": "prior precision of the ridge regression"})
    temperature: float = dataclasses.field(default=0.1, metadata={"help": (
        "temperature of the reported softmax(ucb / temperature) (a diagnostic: the choice is the top-K by UCB)")})

    def __post_init__(self) -> None:
        check_choice(self, "kind", Literal["linucb"])
        if self.dim is not None:
            check_int(self, "dim", 1, MAX_LINUCB_DIM)
        check_choice(self, "features", LinUCBFeatures)
        check_choice(self, "mode", LinUCBMode)
        check(not (self.features == "state" and self.mode == "shared"), type(self), "features", self.features,
              "'state' features are the same for every case, so they need mode='disjoint'")
        check_float(self, "exploration", low=0.0)
        check_bools(self, "intercept")
        check_float(self, "ridge", low=0.0, low_open=True)
        check_float(self, "temperature", low=0.0, low_open=True)

    @property
    def feature_dim(self) -> int:
        """F, the length of ``phi(s, c)``."""
        if self.dim is None:
            raise ConfigError("LinUCBConfig.dim=None: the feature dimension needs dim")
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


class LinUCBPolicy(StaticPolicy):
    """Upper-confidence-bound selection with online ridge regression (see the module docstring); it learns in
    ``observe`` (``StaticPolicy`` gives it the protocol's no-temperature, any-reward, no-model defaults)."""

    kind = "linucb"

    def __init__(self, config: LinUCBConfig):
        if not isinstance(config, LinUCBConfig):
            raise DataFormatError(f"LinUCBPolicy needs a LinUCBConfig, got {type(config).__name__}")
        if config.dim is None:
            raise ConfigError("LinUCBConfig.dim=None: LinUCBPolicy needs the vector dimension")
        self.config = config
        self._log_states: list[np.ndarray] = []
        self._log_cases: list[np.ndarray] = []
        self._log_rewards: list[float] = []
        self._log_ids: list[str] = []
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

    # ------------------------------------------------------------------ the Policy protocol

    @property
    def version(self) -> int:
        return int(self.n_updates)

    def observe(self, observations: Sequence[Observation], *, learn: bool = True) -> dict[str, float]:
        """``update_selection`` for each decision (always: a ridge update is the only way LinUCB records)."""
        for obs in observations:
            if obs.case_rewards_K is None:
                self.update_selection(obs.state_D, obs.candidates, obs.selection, obs.reward)
                rewards_K = np.full(len(obs.selection.ids), float(obs.reward))
            else:  # per-case credit: each case its own reward
                rewards_K = obs.case_rewards()
                for row, reward in zip(obs.chosen_rows(), rewards_K):
                    self.update(obs.state_D, obs.candidates.embeddings_CD[int(row)], float(reward),
                                case_id=obs.candidates.ids[int(row)])
            for row, reward in zip(obs.chosen_rows(), rewards_K):
                self._log_states.append(np.asarray(obs.state_D, dtype=np.float32))
                self._log_cases.append(np.asarray(obs.candidates.embeddings_CD[int(row)], dtype=np.float32))
                self._log_rewards.append(float(reward))
                self._log_ids.append(obs.candidates.ids[int(row)])
        return {}

    def checkpoint(self, directory: Path) -> None:
        from safetensors.numpy import save_file

        directory, dim, n = Path(directory), int(self.config.dim or 0), len(self._log_ids)
        arrays = {"state_ND": np.stack(self._log_states) if n else np.zeros((0, dim), np.float32),
                  "case_ND": np.stack(self._log_cases) if n else np.zeros((0, dim), np.float32),
                  "reward_N": np.asarray(self._log_rewards, dtype=np.float64)}
        atomic_write(directory / "linucb.safetensors", lambda tmp: save_file(arrays, str(tmp)))
        atomic_write_text(directory / "linucb.json",
                          json.dumps({"n": n, "ids": self._log_ids}, indent=2, sort_keys=True, ensure_ascii=False)
                          + "\n")

    def restore(self, directory: Path) -> None:
        directory = Path(directory)
        try:
            meta = json.loads((directory / "linucb.json").read_text(encoding="utf-8"))
            n, ids = int(meta["n"]), list(meta["ids"])
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as error:
            raise CheckpointError(f"{directory / 'linucb.json'}: unreadable ({error})") from None
        tensors, _ = read_safetensors(directory / "linucb.safetensors")
        try:
            states, cases, rewards = (tensors[name].numpy() for name in ("state_ND", "case_ND", "reward_N"))
        except KeyError as error:
            raise CheckpointError(f"{directory / 'linucb.safetensors'}: no tensor {error}") from None
        dim = int(self.config.dim or 0)
        if states.shape != (n, dim) or cases.shape != (n, dim) or rewards.shape != (n,) or len(ids) != n:
            raise CheckpointError(f"{directory}: LinUCB log holds {states.shape} states for {n} ids")
        for s_D, c_D, r, case_id in zip(states, cases, rewards, ids):
            self.update(s_D, c_D, float(r), case_id=case_id)
        self._log_states, self._log_cases = list(states), list(cases)
        self._log_rewards, self._log_ids = [float(r) for r in rewards], ids

    def __repr__(self) -> str:
        return f"LinUCBPolicy({self.config!r}, n_updates={self.n_updates})"


def build(config: LinUCBConfig, context: PolicyContext) -> LinUCBPolicy:
    """The factory entry: a :class:`LinUCBPolicy` (``dim`` from ``context.dim`` when not set)."""
    if config.dim is None:
        config = dataclasses.replace(config, dim=context.dim)
    return LinUCBPolicy(config)


SPEC = PolicySpec(kind="linucb", config=LinUCBConfig, build=build, loop_default=lambda gamma: LinUCBConfig(),
                  regret_default=LinUCBConfig)
