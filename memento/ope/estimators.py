"""Off-policy evaluation (OPE): what a *target* selection policy would have scored, from a log of another one.

Every step of the online loop logs the candidate set, the logging policy's first-draw distribution over it
(``candidate_probs``), the chosen cases in draw order and the reward (``steps.jsonl``,
:class:`memento.formats.StepRecord`). This module turns such logs into value estimates with confidence
intervals. It works on arrays (numpy; scikit-learn fits the reward model, scipy draws the bootstrap): the
caller supplies them (the ``memento evaluate`` command,
:mod:`memento.ope.evaluate`, builds them from a run directory).

One action (K = 1, or the first chosen case of a larger slate). Round ``i`` has a context ``x_i``, candidates
``c = 0..C_i-1``, the logging distribution ``mu_i(c)``, the logged action ``a_i`` and reward ``r_i``; the
target's distribution is ``pi_i(c)`` and ``w_i = pi_i(a_i) / mu_i(a_i)``.

- IPS: ``V = (1/N) sum_i w_i r_i``. Unbiased when ``mu_i(c) > 0`` wherever ``pi_i(c) > 0`` and the logged
  ``mu`` is the true logging distribution.
- SNIPS: ``V = sum_i w_i r_i / sum_i w_i``. Biased (consistent), lower variance; equals the observed mean
  reward for the logging policy itself.
- DM: ``V = (1/N) sum_i sum_c pi_i(c) rhat_i(c)`` with a reward model ``rhat``. Its bias is the model's.
- DR: ``V = (1/N) sum_i [sum_c pi_i(c) rhat_i(c) + w_i (r_i - rhat_i(a_i))]``. Unbiased when the propensities
  are right (whatever ``rhat``); its variance falls as ``rhat`` improves. With ``rhat`` cross-fitted
  (:func:`cross_fit_rewards`) no round's prediction was fitted on that round's reward.

When the log's slates hold K > 1 cases, the K = 1 estimators use the first chosen case ``a_i`` with its
first-draw probability ``mu_i(a_i)``; the reward is the slate's. They then estimate the value of a *hybrid*
policy that draws the first case from the target and the other K - 1 from the logging policy's
Plackett-Luce conditional; that is the target's value only when K = 1.

Slates (K > 1) drawn from Plackett-Luce (the loop's Gumbel-top-k): the slate estimators assume the slate
reward is **additive** over the shown cases and are biased otherwise (a max-like or interacting reward):

- inclusion-probability IPS (:func:`inclusion_ips`): ``V = (1/N) sum_i sum_{c in S_i} (pi_i(c in S) /
  mu_i(c in S)) r_ic`` with per-case rewards ``r_ic`` summing to the slate reward; unbiased for
  ``E_pi[sum_{c in S} phi(x, c)]`` when per-case rewards are observed and a case's reward does not depend on
  the others shown (position-independent). When only the slate reward is logged, ``r_ic = r_i / K`` (a case
  split): biased off-policy; a warning says so.
- pseudo-inverse (PI, Swaminathan et al. 2017, "Off-policy evaluation for slate recommendation"):
  ``V = (1/N) sum_i r_i q_pi(x_i)^T Gamma_mu(x_i)^+ 1_{S_i}`` with ``1_S`` the indicator of the slate's
  (slot, case) pairs, ``q_pi = E_pi[1_S]`` and ``Gamma_mu = E_mu[1_S 1_S^T]``; unbiased for a reward linear in
  ``1_S`` (position-dependent additive: ``r = sum_j phi(x, j, s_j) + noise``) when the target's ``q_pi`` lies
  in the span of the logger's slates (full support). ``granularity="set"`` uses case indicators (position
  independent additive reward), with pairwise inclusion probabilities.

Inclusion and pairwise probabilities of Plackett-Luce draws are computed exactly by enumerating the ordered
K-prefixes of positive probability when there are at most ``max_enumerate`` of them (C = 16, K = 4: 43,680),
and otherwise estimated from ``mc_samples`` seeded Gumbel-top-k draws (:attr:`SlateMoments.exact` says which;
a Monte Carlo ``Gamma`` makes PI approximately, not exactly, unbiased).

Uncertainty: percentile bootstrap over rounds (``scipy.stats.bootstrap``, seeded; one pass gives every
estimator of a call the same resamples; the reward model is fitted once, not per resample, so the DM/DR
intervals leave out the model's own variance). Effective sample size of importance weights ``w``:
``(sum w)^2 / sum w^2``. Support: a warning (a line in :attr:`OPEResult.warnings`, for the caller to print
once; logged at debug level) when the target puts probability on candidates the logger gave probability
``<= support_eps``; never for the logging policy evaluated against itself (its support is total).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence
from typing import Any, Literal, get_args

import numpy as np

from memento.config import check, check_choice, check_float, check_int
from memento.errors import ConfigError, DataFormatError, DimensionError

__all__ = [
    "Granularity",
    "OPEConfig",
    "OPEResult",
    "RewardModel",
    "RewardModelConfig",
    "SlateDistribution",
    "SlateMoments",
    "SlateRound",
    "bootstrap_ci",
    "cross_fit_rewards",
    "direct_method",
    "doubly_robust",
    "effective_sample_size",
    "estimate_k1",
    "estimate_slates",
    "fit_reward_model",
    "importance_weights",
    "inclusion_ips",
    "ips",
    "pseudo_inverse",
    "pseudo_inverse_vector",
    "reward_features",
    "slate_moments",
    "snips",
    "support_violation",
]

logger = logging.getLogger(__name__)

Granularity = Literal["slot", "set"]
Link = Literal["auto", "logistic", "linear"]

_SUPPORT_TOL = 1e-9
"""Target mass below this on unsupported candidates (per round) is rounding, not a support violation."""
_SUM_TOL = 1e-4
_LOW_ESS = 0.1
"""A warning when the effective sample size is below this fraction of the rounds."""
_BOOT_CHUNK = 2_000_000
"""Resampled entries held at once by the bootstrap."""


# ---------------------------------------------------------------- configs and the result


@dataclasses.dataclass(frozen=True, kw_only=True)
class RewardModelConfig:
    """The reward model of DM and DR (:func:`fit_reward_model`, :func:`cross_fit_rewards`).

    ``folds``: cross-fitting folds (each fold's predictions come from a model fitted on the others);
    ``l2``: ridge penalty on the standardised feature weights (not the intercept); ``link``: ``"logistic"``
    (rewards in [0, 1], scikit-learn's ``LogisticRegression`` with ``C = 1/l2`` and the Newton-Cholesky
    solver on the cross-entropy, fractional rewards allowed),
    ``"linear"`` (ridge regression) or ``"auto"`` (logistic when every reward lies in [0, 1]);
    ``max_iter`` / ``tol``: the solver's stopping rule (Newton steps; tolerance on the gradient).
    """

    folds: int = dataclasses.field(default=5, metadata={"help": "cross-fitting folds of the reward model"})
    l2: float = 1.0
    link: Link = "auto"
    max_iter: int = 50
    tol: float = 1e-8

    def __post_init__(self) -> None:
        check_int(self, "folds", 1)
        check_float(self, "l2", low=0.0)
        check_choice(self, "link", Link)
        check_int(self, "max_iter", 1)
        check_float(self, "tol", low=0.0, low_open=True)


@dataclasses.dataclass(frozen=True, kw_only=True)
class OPEConfig:
    """How estimates are made: ``n_boot`` bootstrap resamples (0: no interval) at confidence ``level``;
    ``support_eps``: a logging probability at or below it counts as no support; ``max_enumerate``: the most
    ordered K-prefixes enumerated for exact Plackett-Luce moments, beyond which ``mc_samples`` seeded draws
    estimate them; ``reward_model``: DM and DR's model."""

    n_boot: int = dataclasses.field(default=1000, metadata={"help": "bootstrap resamples for the intervals; 0: none"})
    level: float = dataclasses.field(default=0.95, metadata={"help": "interval confidence level"})
    support_eps: float = 1e-6
    max_enumerate: int = 60_000
    mc_samples: int = 20_000
    reward_model: RewardModelConfig = dataclasses.field(default_factory=RewardModelConfig)

    def __post_init__(self) -> None:
        check_int(self, "n_boot", 0)
        check_float(self, "level", low=0.0, high=1.0, low_open=True, high_open=True)
        check_float(self, "support_eps", low=0.0)
        check_int(self, "max_enumerate", 1)
        check_int(self, "mc_samples", 1)
        check(isinstance(self.reward_model, RewardModelConfig), type(self), "reward_model", self.reward_model,
              "must be a RewardModelConfig")


def _finite_or_none(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


@dataclasses.dataclass(frozen=True, kw_only=True)
class OPEResult:
    """One estimate: the ``estimator``'s ``value``, the bootstrap interval ``[ci_low, ci_high]`` (``None``
    without resamples), the effective sample size ``ess`` of its importance weights (``None`` for DM), the
    rounds ``n`` it used and ``warnings`` (support violations, few effective samples, assumptions not met)."""

    estimator: str
    value: float
    ci_low: float | None = None
    ci_high: float | None = None
    ess: float | None = None
    n: int
    warnings: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (a non-finite number becomes ``null``)."""
        return {"estimator": self.estimator, "value": _finite_or_none(self.value),
                "ci_low": _finite_or_none(self.ci_low), "ci_high": _finite_or_none(self.ci_high),
                "ess": _finite_or_none(self.ess), "n": int(self.n), "warnings": list(self.warnings)}


# ---------------------------------------------------------------- input checks


def _array(x: Any, name: str, n: int | None, shape: str) -> np.ndarray:
    """``x`` as finite float64 of ``len(shape.split(","))`` dimensions (``n`` rows when given)."""
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != shape.count(",") + 1 or (n is not None and a.shape[0] != n):
        rows = "N" if n is None else str(n)
        raise DimensionError(f"{name} must be a {'matrix' if ',' in shape else 'vector'} "
                             f"[{rows}{shape[1:]}], got {a.shape=}")
    if not np.isfinite(a).all():
        raise DataFormatError(f"{name} holds NaN or inf")
    return a


def _vector(x: Any, name: str, n: int | None = None) -> np.ndarray:
    return _array(x, name, n, "N")


def _matrix(x: Any, name: str, n: int | None = None) -> np.ndarray:
    return _array(x, name, n, "N, C")


def _distributions(x: Any, name: str, n: int) -> np.ndarray:
    """Rows of probabilities (padding with 0 allowed) that sum to 1."""
    m = _matrix(x, name, n)
    if (m < 0).any():
        raise DataFormatError(f"{name} holds a negative probability")
    sums = m.sum(axis=1)
    bad = np.flatnonzero(np.abs(sums - 1.0) > _SUM_TOL)
    if bad.size:
        raise DataFormatError(f"{name} row {int(bad[0])} sums to {sums[bad[0]]!r}, not 1")
    return m


def _actions(action_N: Any, n: int, c: int) -> np.ndarray:
    a = np.asarray(action_N)
    if a.shape != (n,) or (a.size and not np.issubdtype(a.dtype, np.integer)):
        raise DimensionError(f"action_N must be {n} integer indices, got shape {a.shape} dtype {a.dtype}")
    a = a.astype(np.int64)
    if a.size and (a.min() < 0 or a.max() >= c):
        raise DataFormatError(f"action_N must index the {c} candidates, got min {a.min()} max {a.max()}")
    return a


# ---------------------------------------------------------------- weights, ESS, bootstrap


def importance_weights(p_log_N: Any, p_tgt_N: Any) -> np.ndarray:
    """``w_N = p_tgt_N / p_log_N``: the target's over the logger's probability of each logged action.

    A logged action of logging probability 0 is impossible (the log is inconsistent): ``DataFormatError``."""
    p_log = _vector(p_log_N, "p_log_N")
    p_tgt = _vector(p_tgt_N, "p_tgt_N", p_log.shape[0])
    if (p_log <= 0).any() or (p_log > 1 + _SUM_TOL).any():
        i = int(np.flatnonzero((p_log <= 0) | (p_log > 1 + _SUM_TOL))[0])
        raise DataFormatError(f"p_log_N[{i}]={p_log[i]!r}: a logged action's probability must lie in (0, 1]")
    if (p_tgt < 0).any() or (p_tgt > 1 + _SUM_TOL).any():
        raise DataFormatError("p_tgt_N must lie in [0, 1]")
    return p_tgt / p_log


def effective_sample_size(w_N: Any) -> float:
    """Kish's effective sample size ``(sum w)^2 / sum w^2`` (N for equal weights, 0 for all-zero weights)."""
    w = np.asarray(w_N, dtype=np.float64)
    s2 = float(np.sum(w * w))
    return float(np.sum(w)) ** 2 / s2 if s2 > 0 else 0.0


def _boot_seed(rng: np.random.Generator | None) -> int | None:
    return None if rng is None else int(rng.integers(2**63 - 1))


Column = tuple[np.ndarray, "np.ndarray | None"]
"""One estimator's per-round ``(terms_N, denominators_N)``: its value is ``mean(terms)``, or
``sum(terms) / sum(denominators)`` when it is self-normalised."""


def _column_stats(columns: Sequence[Column], idx_BN: np.ndarray) -> np.ndarray:
    """``stat_EB``: each column's statistic on each resample of round indices ``idx_BN`` (NaN for a
    self-normalised one whose resampled denominators sum to 0)."""
    out = []
    for num_N, den_N in columns:
        if den_N is None:
            out.append(num_N[idx_BN].mean(axis=-1))
            continue
        den = den_N[idx_BN].sum(axis=-1)
        with np.errstate(invalid="ignore", divide="ignore"):
            out.append(np.where(den != 0, num_N[idx_BN].sum(axis=-1) / np.where(den != 0, den, 1.0), np.nan))
    return np.stack(out)


def _percentile_cis(seed: int | None, n_boot: int, level: float,
                    columns: Sequence[Column]) -> list[tuple[float | None, float | None]]:
    """Percentile intervals of several estimators over the SAME ``n_boot`` resamples of the rounds: one
    ``scipy.stats.bootstrap`` over the round indices (a statistic that returns every column's value), drawn from
    ``default_rng(seed)`` and at most ``_BOOT_CHUNK`` resampled entries at once (its ``batch``). A resample on
    which a self-normalised estimate is undefined is left out of that estimator's interval."""
    if isinstance(n_boot, bool) or not isinstance(n_boot, int) or n_boot < 0:
        raise ConfigError(f"n_boot={n_boot!r}: must be an integer >= 0")
    if not 0.0 < level < 1.0:
        raise ConfigError(f"level={level!r}: must lie in (0, 1)")
    n = columns[0][0].shape[0] if columns else 0
    if seed is None or n_boot == 0 or n == 0:
        return [(None, None)] * len(columns)
    tail = (1.0 - level) / 2.0
    if n == 1:  # every resample is the one round (scipy asks for two)
        stat_EB = _column_stats(columns, np.zeros((1, 1), dtype=np.int64))
        low_E = high_E = np.full(len(columns), np.nan)
    else:
        import warnings

        from scipy.stats import DegenerateDataWarning, bootstrap

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DegenerateDataWarning)  # NaN resamples: dropped below
            res = bootstrap((np.arange(n),), lambda idx, axis=-1: _column_stats(columns, idx), n_resamples=n_boot,
                            batch=max(1, _BOOT_CHUNK // n), vectorized=True, confidence_level=level,
                            method="percentile", rng=np.random.default_rng(seed))
        stat_EB = np.asarray(res.bootstrap_distribution).reshape(len(columns), n_boot)
        low_E = np.atleast_1d(res.confidence_interval.low)
        high_E = np.atleast_1d(res.confidence_interval.high)
    out: list[tuple[float | None, float | None]] = []
    for stat_B, low, high in zip(stat_EB, low_E, high_E):
        if not (math.isfinite(low) and math.isfinite(high)):
            finite = stat_B[np.isfinite(stat_B)]
            low, high = np.quantile(finite, [tail, 1.0 - tail]) if finite.size else (math.nan, math.nan)
        out.append((float(low), float(high)) if math.isfinite(low) and math.isfinite(high) else (None, None))
    return out


def bootstrap_ci(terms_N: Any, *, rng: np.random.Generator, n_boot: int = 1000, level: float = 0.95,
                 denominators_N: Any | None = None) -> tuple[float | None, float | None]:
    """Percentile bootstrap interval (seeded by ``rng``) of the mean of ``terms_N``, or of
    ``sum(terms) / sum(denominators)`` (a self-normalised estimate) when ``denominators_N`` is given."""
    num = _vector(terms_N, "terms_N")
    den = None if denominators_N is None else _vector(denominators_N, "denominators_N", num.shape[0])
    return _percentile_cis(_boot_seed(rng), n_boot, level, [(num, den)])[0]


def _ess_warnings(ess: float, n: int) -> list[str]:
    if n and ess < _LOW_ESS * n:
        return [f"low effective sample size: {ess:.1f} of {n} rounds (the estimate rests on a few heavily "
                "weighted rounds; its interval is unreliable)"]
    return []


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class _Estimate:
    """One estimator's value and per-round terms, before its bootstrap interval (:func:`_results`)."""

    name: str
    value: float
    terms_N: np.ndarray
    den_N: np.ndarray | None = None
    ess: float | None
    warnings: Sequence[str]


def _results(estimates: Sequence[_Estimate], *, seed: int | None, n_boot: int, level: float) -> list[OPEResult]:
    """The estimates with their intervals, all from one bootstrap: the same resamples for every estimator."""
    intervals = _percentile_cis(seed, n_boot, level, [(e.terms_N, e.den_N) for e in estimates])
    out = []
    for e, (low, high) in zip(estimates, intervals):
        notes = list(e.warnings) + ([] if e.ess is None else _ess_warnings(e.ess, e.terms_N.shape[0]))
        out.append(OPEResult(estimator=e.name, value=float(e.value), ci_low=low, ci_high=high, ess=e.ess,
                             n=int(e.terms_N.shape[0]), warnings=tuple(dict.fromkeys(notes))))
    return out


# ---------------------------------------------------------------- K = 1 estimators


def _ips_parts(reward_N: Any, p_log_N: Any, p_tgt_N: Any) -> tuple[np.ndarray, np.ndarray]:
    reward = _vector(reward_N, "reward_N")
    w = importance_weights(p_log_N, p_tgt_N)
    if w.shape != reward.shape:
        raise DimensionError(f"reward_N has {reward.shape=}, the propensities {w.shape}")
    return reward, w


def _ips(reward: np.ndarray, w: np.ndarray, *, warnings: Sequence[str]) -> _Estimate:
    terms = w * reward
    return _Estimate(name="ips", value=float(np.mean(terms)) if terms.size else math.nan, terms_N=terms,
                     ess=effective_sample_size(w), warnings=warnings)


def _snips(reward: np.ndarray, w: np.ndarray, *, warnings: Sequence[str]) -> _Estimate:
    total = float(np.sum(w))
    value = float(np.sum(w * reward)) / total if total > 0 else math.nan
    return _Estimate(name="snips", value=value, terms_N=w * reward, den_N=w, ess=effective_sample_size(w),
                     warnings=warnings)


def _dm_parts(rhat_NC: Any, pi_NC: Any) -> tuple[np.ndarray, np.ndarray]:
    pi = _matrix(pi_NC, "pi_NC")
    rhat = _matrix(rhat_NC, "rhat_NC", pi.shape[0])
    if rhat.shape != pi.shape:
        raise DimensionError(f"rhat_NC has {rhat.shape=}, pi_NC has {pi.shape=}")
    return (pi * rhat).sum(axis=1), rhat


def _dm(dm: np.ndarray, *, warnings: Sequence[str]) -> _Estimate:
    return _Estimate(name="dm", value=float(np.mean(dm)) if dm.size else math.nan, terms_N=dm, ess=None,
                     warnings=warnings)


def _dr(reward: np.ndarray, w: np.ndarray, dm: np.ndarray, rhat: np.ndarray, action_N: Any, *,
        warnings: Sequence[str]) -> _Estimate:
    if not (w.shape == reward.shape == dm.shape):
        raise DimensionError(f"reward_N {reward.shape}, propensities {w.shape} and rhat_NC {rhat.shape} disagree")
    a = _actions(action_N, reward.shape[0], rhat.shape[1])
    terms = dm + w * (reward - rhat[np.arange(reward.shape[0]), a])
    return _Estimate(name="dr", value=float(np.mean(terms)) if terms.size else math.nan, terms_N=terms,
                     ess=effective_sample_size(w), warnings=warnings)


def ips(reward_N: Any, p_log_N: Any, p_tgt_N: Any, *, rng: np.random.Generator | None = None, n_boot: int = 1000,
        level: float = 0.95, warnings: Sequence[str] = ()) -> OPEResult:
    """Inverse propensity scoring: ``mean(w_i r_i)`` with ``w_i = p_tgt_i / p_log_i`` (see the module docstring);
    the bootstrap interval (``n_boot`` resamples seeded by ``rng``; none without ``rng``) and the weights' ESS."""
    reward, w = _ips_parts(reward_N, p_log_N, p_tgt_N)
    return _results([_ips(reward, w, warnings=warnings)], seed=_boot_seed(rng), n_boot=n_boot, level=level)[0]


def snips(reward_N: Any, p_log_N: Any, p_tgt_N: Any, *, rng: np.random.Generator | None = None, n_boot: int = 1000,
          level: float = 0.95, warnings: Sequence[str] = ()) -> OPEResult:
    """Self-normalised IPS: ``sum(w_i r_i) / sum(w_i)`` (NaN when every weight is 0)."""
    reward, w = _ips_parts(reward_N, p_log_N, p_tgt_N)
    return _results([_snips(reward, w, warnings=warnings)], seed=_boot_seed(rng), n_boot=n_boot, level=level)[0]


def direct_method(rhat_NC: Any, pi_NC: Any, *, rng: np.random.Generator | None = None, n_boot: int = 1000,
                  level: float = 0.95, warnings: Sequence[str] = ()) -> OPEResult:
    """The reward model's value under the target: ``mean_i sum_c pi_i(c) rhat_i(c)``."""
    dm, _ = _dm_parts(rhat_NC, pi_NC)
    return _results([_dm(dm, warnings=warnings)], seed=_boot_seed(rng), n_boot=n_boot, level=level)[0]


def doubly_robust(reward_N: Any, p_log_N: Any, p_tgt_N: Any, rhat_NC: Any, pi_NC: Any, action_N: Any, *,
                  rng: np.random.Generator | None = None, n_boot: int = 1000, level: float = 0.95,
                  warnings: Sequence[str] = ()) -> OPEResult:
    """Doubly robust: ``mean_i [sum_c pi_i(c) rhat_i(c) + w_i (r_i - rhat_i(a_i))]``; ``action_N`` indexes the
    logged action in each row of ``rhat_NC`` / ``pi_NC``."""
    reward, w = _ips_parts(reward_N, p_log_N, p_tgt_N)
    dm, rhat = _dm_parts(rhat_NC, pi_NC)
    return _results([_dr(reward, w, dm, rhat, action_N, warnings=warnings)], seed=_boot_seed(rng), n_boot=n_boot,
                    level=level)[0]


def support_violation(p_log_NC: Any, pi_NC: Any, *, eps: float = 1e-6) -> np.ndarray:
    """Per round, the target's probability on candidates the logger gave probability ``<= eps``: mass that no
    logged round can show, so that IPS and DR are biased by it (``mass_N``)."""
    p_log = _matrix(p_log_NC, "p_log_NC")
    pi = _matrix(pi_NC, "pi_NC", p_log.shape[0])
    if pi.shape != p_log.shape:
        raise DimensionError(f"pi_NC has {pi.shape=}, p_log_NC has {p_log.shape=}")
    return np.where(p_log <= eps, pi, 0.0).sum(axis=1)


def _support_warning(mass_N: np.ndarray, eps: float, what: str = "probability") -> list[str]:
    bad = mass_N > _SUPPORT_TOL
    if not bad.any():
        return []
    message = (f"support violation: in {int(bad.sum())} of {mass_N.shape[0]} rounds the target puts {what} on "
               f"candidates the logger gave probability <= {eps:g} (mean mass {float(mass_N.mean()):.3g}, max "
               f"{float(mass_N.max()):.3g}); importance-weighted estimates cannot see that mass and are biased")
    logger.debug("%s", message)  # reported through the results' warnings, once, by whoever prints them
    return [message]


def estimate_k1(reward_N: Any, action_N: Any, p_log_NC: Any, pi_NC: Any, *, rhat_NC: Any | None = None,
                rng: np.random.Generator | None = None, config: OPEConfig | None = None) -> list[OPEResult]:
    """IPS, SNIPS and, with a reward model's ``rhat_NC``, DM and DR, all on the same bootstrap resamples.

    ``p_log_NC`` / ``pi_NC``: the logging and target distributions over each round's candidates (rows padded
    with zeros to a common C); ``action_N``: the logged action's index. A support violation
    (:func:`support_violation`) is attached to every result (none when ``pi_NC`` is ``p_log_NC`` itself)."""
    config = config or OPEConfig()
    reward = _vector(reward_N, "reward_N")
    n = reward.shape[0]
    p_log = _distributions(p_log_NC, "p_log_NC", n)
    pi = _distributions(pi_NC, "pi_NC", n)
    if pi.shape != p_log.shape:
        raise DimensionError(f"pi_NC has {pi.shape=}, p_log_NC has {p_log.shape=}")
    a = _actions(action_N, n, p_log.shape[1])
    rows = np.arange(n)
    w = importance_weights(p_log[rows, a], pi[rows, a])
    # the logging policy against itself: total support by construction (its own tiny probabilities are no gap)
    notes = [] if np.array_equal(p_log, pi) else _support_warning(support_violation(p_log, pi, eps=config.support_eps),
                                                                  config.support_eps)
    estimates = [_ips(reward, w, warnings=notes), _snips(reward, w, warnings=notes)]
    if rhat_NC is not None:
        dm, rhat = _dm_parts(rhat_NC, pi)
        estimates += [_dm(dm, warnings=notes), _dr(reward, w, dm, rhat, a, warnings=notes)]
    return _results(estimates, seed=_boot_seed(rng), n_boot=config.n_boot, level=config.level)


# ---------------------------------------------------------------- the reward model


def reward_features(state_ND: Any, cases_NCD: Any, stored_reward_NC: Any) -> np.ndarray:
    """Features of each (state, candidate) pair, ``X_NCF`` with ``F = 2 + D``: the cosine ``<s, c>`` (the
    vectors are unit), the case's stored reward and the element-wise product ``s * c`` (a learned weighting of
    the cosine's terms). Padded candidates (zero vectors) get zero features."""
    state = np.asarray(state_ND, dtype=np.float64)
    cases = np.asarray(cases_NCD, dtype=np.float64)
    stored = np.asarray(stored_reward_NC, dtype=np.float64)
    if state.ndim != 2 or cases.ndim != 3 or cases.shape[0] != state.shape[0] or cases.shape[2] != state.shape[1]:
        raise DimensionError(f"reward_features: {state.shape=} and {cases.shape=} must be [N, D] and [N, C, D]")
    if stored.shape != cases.shape[:2]:
        raise DimensionError(f"reward_features: {stored.shape=}, expected {cases.shape[:2]}")
    prod = cases * state[:, None, :]
    return np.concatenate([prod.sum(axis=2, keepdims=True), stored[..., None], prod], axis=2)


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class RewardModel:
    """A fitted reward model: standardisation (``mean_F``, ``scale_F``), ``weights_F``, ``bias`` and ``link``
    (``"logistic"``: ``sigmoid(z . w + b)``; ``"linear"``: ``z . w + b``); a constant model has zero weights."""

    mean_F: np.ndarray
    scale_F: np.ndarray
    weights_F: np.ndarray
    bias: float
    link: Literal["logistic", "linear"]

    def predict(self, x_F: Any) -> np.ndarray:
        """Predicted rewards for features ``[..., F]``."""
        x = np.asarray(x_F, dtype=np.float64)
        if x.shape[-1] != self.weights_F.shape[0]:
            raise DimensionError(f"RewardModel.predict: features have {x.shape=}, the model {self.weights_F.shape}")
        eta = ((x - self.mean_F) / self.scale_F) @ self.weights_F + self.bias
        return 0.5 * (1.0 + np.tanh(0.5 * eta)) if self.link == "logistic" else eta


def _fit_logistic(z_MF: np.ndarray, y_M: np.ndarray, config: RewardModelConfig) -> tuple[np.ndarray, float]:
    """scikit-learn's ``LogisticRegression`` (Newton-Cholesky) on the penalised cross-entropy
    ``sum_i [log(1 + e^eta_i) - y_i eta_i] + l2/2 |w|^2`` (``C = 1/l2``; the intercept unpenalised). A fractional
    target ``y`` is the row twice, as class 1 with weight ``y`` and class 0 with weight ``1 - y``: the same loss."""
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression

    m = z_MF.shape[0]
    x2 = np.concatenate([z_MF, z_MF])
    label2 = np.concatenate([np.ones(m), np.zeros(m)])
    weight2 = np.concatenate([y_M, 1.0 - y_M])
    keep = weight2 > 0
    model = LogisticRegression(C=1.0 / config.l2 if config.l2 > 0 else math.inf, solver="newton-cholesky",
                               tol=config.tol, max_iter=config.max_iter)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # separable rewards without l2: the weights so far
        model.fit(x2[keep], label2[keep], sample_weight=weight2[keep])
    if int(model.n_iter_[0]) >= config.max_iter:
        logger.debug("reward model: not converged in max_iter=%d Newton steps", config.max_iter)
    return model.coef_[0].astype(np.float64), float(model.intercept_[0])


def fit_reward_model(x_MF: Any, y_M: Any, config: RewardModelConfig | None = None) -> RewardModel:
    """Fit ``rhat(x)`` to rewards ``y_M`` on features ``x_MF`` (deterministic: no randomness).

    Features are standardised on these rows; the weights get the ridge penalty ``config.l2``, the intercept
    none. Logistic: scikit-learn's ``LogisticRegression`` (Newton's method) on the penalised cross-entropy
    (fractional targets in [0, 1] allowed). Rewards that are all equal give the constant model."""
    config = config or RewardModelConfig()
    x = np.asarray(x_MF, dtype=np.float64)
    if x.ndim != 2:
        raise DimensionError(f"fit_reward_model: features must be [M, F], got {x.shape=}")
    y = _vector(y_M, "y_M", x.shape[0])
    if y.size == 0:
        raise DataFormatError("fit_reward_model: no rows to fit")
    link: Literal["logistic", "linear"]
    if config.link == "auto":
        link = "logistic" if ((y >= 0) & (y <= 1)).all() else "linear"
    else:
        link = config.link
    if link == "logistic" and not ((y >= 0) & (y <= 1)).all():
        raise DataFormatError("fit_reward_model: a logistic model needs rewards in [0, 1]; use link='linear'")
    f = x.shape[1]
    mean = x.mean(axis=0)
    scale = x.std(axis=0)
    scale = np.where(scale > 1e-12, scale, 1.0)
    if y.min() == y.max():
        return RewardModel(mean_F=mean, scale_F=scale, weights_F=np.zeros(f), bias=float(y[0]), link="linear")
    z = (x - mean) / scale
    if link == "logistic":
        weights, bias = _fit_logistic(z, y, config)
        return RewardModel(mean_F=mean, scale_F=scale, weights_F=weights, bias=bias, link=link)
    z1 = np.concatenate([z, np.ones((x.shape[0], 1))], axis=1)
    pen = np.full(f + 1, float(config.l2))
    pen[-1] = 0.0
    w = np.linalg.solve(z1.T @ z1 + np.diag(pen) + 1e-10 * np.eye(f + 1), z1.T @ y)
    return RewardModel(mean_F=mean, scale_F=scale, weights_F=w[:-1], bias=float(w[-1]), link=link)


def cross_fit_rewards(features_NCF: Any, action_N: Any, reward_N: Any, *, rng: np.random.Generator,
                      config: RewardModelConfig | None = None) -> np.ndarray:
    """``rhat_NC``: predicted rewards of every candidate, cross-fitted over ``config.folds`` folds of rounds.

    The model is trained on each round's logged action (``features_NCF[i, action_N[i]]`` -> ``reward_N[i]``);
    the rounds are split into folds by ``rng.permutation`` and each fold's rows are predicted by a model
    fitted on the other folds only. With fewer than 2 rounds (or ``folds=1``) one model is fitted on all of
    them (not cross-fitted; logged at warning level)."""
    config = config or RewardModelConfig()
    x = np.asarray(features_NCF, dtype=np.float64)
    if x.ndim != 3:
        raise DimensionError(f"cross_fit_rewards: features must be [N, C, F], got {x.shape=}")
    n = x.shape[0]
    reward = _vector(reward_N, "reward_N", n)
    a = _actions(action_N, n, x.shape[1])
    train_x = x[np.arange(n), a]
    folds = min(config.folds, n)
    if folds < 2:
        logger.warning("reward model fitted on all %d round(s): too few to cross-fit", n)
        return fit_reward_model(train_x, reward, config).predict(x)
    fold_N = np.empty(n, dtype=np.int64)
    fold_N[rng.permutation(n)] = np.arange(n) % folds
    rhat = np.empty(x.shape[:2], dtype=np.float64)
    for fold in range(folds):
        held = fold_N == fold
        rhat[held] = fit_reward_model(train_x[~held], reward[~held], config).predict(x[held])
    return rhat


# ---------------------------------------------------------------- slates (Plackett-Luce)


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class SlateDistribution:
    """How a policy fills ``k`` ordered slots from ``n_candidates``: Plackett-Luce draws without replacement
    from ``probs_C`` (Gumbel-top-k; when the positive-probability candidates run out, the rest follow in
    index order, as :func:`memento.learn.policy.gumbel_top_k` does), or one fixed ``order_K`` (a greedy choice)."""

    n_candidates: int
    k: int
    probs_C: np.ndarray | None = None
    order_K: np.ndarray | None = None

    def __post_init__(self) -> None:
        if (self.probs_C is None) == (self.order_K is None):
            raise DataFormatError("SlateDistribution needs exactly one of probs_C and order_K")
        if not 1 <= self.k <= self.n_candidates:
            raise DataFormatError(f"SlateDistribution: k={self.k} must lie in [1, {self.n_candidates}]")
        if self.probs_C is not None:
            p = np.asarray(self.probs_C, dtype=np.float64)
            if p.shape != (self.n_candidates,) or not np.isfinite(p).all() or (p < 0).any():
                raise DataFormatError(f"SlateDistribution.probs_C must be {self.n_candidates} probabilities >= 0, "
                                      f"got {p.shape=}")
            if abs(p.sum() - 1.0) > _SUM_TOL:
                raise DataFormatError(f"SlateDistribution.probs_C sums to {p.sum()!r}, not 1")
            object.__setattr__(self, "probs_C", p)
        else:
            order = np.asarray(self.order_K)
            if order.shape != (self.k,) or (order.size and not np.issubdtype(order.dtype, np.integer)) \
                    or len(set(order.tolist())) != self.k or order.min() < 0 or order.max() >= self.n_candidates:
                raise DataFormatError(f"SlateDistribution.order_K must be {self.k} distinct indices in "
                                      f"[0, {self.n_candidates}), got {order.tolist()}")
            object.__setattr__(self, "order_K", order.astype(np.int64))

    @classmethod
    def plackett_luce(cls, probs_C: Any, k: int) -> SlateDistribution:
        p = np.asarray(probs_C, dtype=np.float64)
        return cls(n_candidates=int(p.shape[0]) if p.ndim == 1 else -1, k=int(k), probs_C=p)

    @classmethod
    def fixed(cls, order_K: Any, n_candidates: int) -> SlateDistribution:
        order = np.asarray(order_K)
        return cls(n_candidates=int(n_candidates), k=int(order.shape[0]) if order.ndim == 1 else -1, order_K=order)

    def first_draw(self) -> np.ndarray:
        """The distribution of the first slot (``probs_C``, or a one-hot vector)."""
        if self.probs_C is not None:
            return self.probs_C.copy()
        out = np.zeros(self.n_candidates)
        out[int(self.order_K[0])] = 1.0  # type: ignore[index]
        return out


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class SlateMoments:
    """First and second moments of a slate distribution: ``slot_KC[j, c] = P(slot j holds c)`` and, when asked
    for, ``pair_MM[j*C + a, l*C + b] = P(slot j holds a and slot l holds b)`` (``M = K*C``); ``exact``: from
    enumeration (True) or from Monte Carlo draws (False)."""

    slot_KC: np.ndarray
    pair_MM: np.ndarray | None
    exact: bool
    _pinv: dict[str, np.ndarray] = dataclasses.field(default_factory=dict, init=False, repr=False)

    def gram_pinv(self, granularity: Granularity) -> np.ndarray:
        """The pseudo-inverse of the second-moment matrix of ``granularity`` (slot pairs, or case pairs for
        ``"set"``), computed once per moments object: a logger's is shared by every target evaluated on it."""
        if granularity not in self._pinv:
            if granularity == "slot":
                if self.pair_MM is None:
                    raise DataFormatError("pseudo_inverse_vector: the logger's moments lack pairwise probabilities")
                gamma = self.pair_MM
            else:
                gamma = self.pair_inclusion_CC()
            self._pinv[granularity] = np.linalg.pinv(gamma, rcond=1e-10, hermitian=True)
        return self._pinv[granularity]

    @property
    def inclusion_C(self) -> np.ndarray:
        """``P(c in S)``: the slot marginals summed over slots (they sum to K)."""
        return self.slot_KC.sum(axis=0)

    def pair_inclusion_CC(self) -> np.ndarray:
        """``P(a in S and b in S)`` (the diagonal is the inclusion probability)."""
        if self.pair_MM is None:
            raise DataFormatError("SlateMoments: pairwise probabilities were not computed (pairs=False)")
        k, c = self.slot_KC.shape
        return self.pair_MM.reshape(k, c, k, c).sum(axis=(0, 2))


def _enumerate_pl(p_C: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Every ordered K-prefix of positive probability (``orders_TK``) and its probability ``prob_T``."""
    c = p_C.shape[0]
    orders = np.zeros((1, 0), dtype=np.int64)
    prob = np.ones(1)
    for _ in range(k):
        t = orders.shape[0]
        avail = np.ones((t, c), dtype=bool)
        if orders.shape[1]:
            avail[np.arange(t)[:, None], orders] = False
        mass = np.where(avail, p_C[None, :], 0.0)
        left = mass.sum(axis=1)
        child = np.divide(mass, left[:, None], out=np.zeros_like(mass), where=left[:, None] > 0)
        exhausted = left <= 0  # only zero-probability candidates remain: the lowest index comes next
        if exhausted.any():
            first = np.argmax(avail[exhausted], axis=1)
            child[np.flatnonzero(exhausted), first] = 1.0
        rows, cols = np.nonzero(child > 0)
        orders = np.concatenate([orders[rows], cols[:, None]], axis=1)
        prob = prob[rows] * child[rows, cols]
    return orders, prob


def _n_prefixes(p_C: np.ndarray, k: int) -> int:
    s = int((p_C > 0).sum())
    return math.perm(s, min(s, k))


def _sample_pl(p_C: np.ndarray, k: int, n: int, rng: np.random.Generator) -> np.ndarray:
    with np.errstate(divide="ignore"):
        logp = np.log(p_C)
    keys = logp[None, :] + rng.gumbel(size=(n, p_C.shape[0]))
    return np.argsort(-keys, axis=1, kind="stable")[:, :k].astype(np.int64)


def slate_moments(dist: SlateDistribution, *, pairs: bool = True, rng: np.random.Generator | None = None,
                  max_enumerate: int = 60_000, mc_samples: int = 20_000) -> SlateMoments:
    """Slot marginals (and pairwise slot probabilities) of ``dist``: exact for a fixed order or when at most
    ``max_enumerate`` ordered prefixes have positive probability, else from ``mc_samples`` Gumbel-top-k draws
    seeded by ``rng`` (required then)."""
    k, c = dist.k, dist.n_candidates
    p = dist.probs_C
    if p is None:
        orders, prob, exact = np.asarray(dist.order_K)[None, :], np.ones(1), True
    else:
        if _n_prefixes(p, k) <= max_enumerate:
            orders, prob = _enumerate_pl(p, k)
            exact = True
        else:
            if rng is None:
                raise DataFormatError(f"slate_moments: {_n_prefixes(p, k)} ordered prefixes exceed max_enumerate="
                                      f"{max_enumerate}; pass rng for a Monte Carlo estimate")
            orders = _sample_pl(p, k, mc_samples, rng)
            prob, exact = np.full(mc_samples, 1.0 / mc_samples), False
    flat_TK = orders + (np.arange(k) * c)[None, :]
    m = k * c
    slot = np.bincount(flat_TK.ravel(), weights=np.repeat(prob, k), minlength=m).reshape(k, c)
    pair = None
    if pairs:
        idx = (flat_TK[:, :, None] * m + flat_TK[:, None, :]).reshape(orders.shape[0], -1)
        pair = np.bincount(idx.ravel(), weights=np.repeat(prob, k * k), minlength=m * m).reshape(m, m)
    return SlateMoments(slot_KC=slot, pair_MM=pair, exact=exact)


def pseudo_inverse_vector(logger_m: SlateMoments, target_m: SlateMoments, *,
                          granularity: Granularity = "slot") -> np.ndarray:
    """``v = Gamma_mu^+ q_pi``: a logged slate ``S`` gets the PI weight ``sum of v over its indicators`` (its
    (slot, case) pairs for ``"slot"``, ``M = K*C`` entries; its cases for ``"set"``, ``C`` entries)."""
    if granularity not in get_args(Granularity):
        raise ConfigError(f"granularity={granularity!r}: must be one of {get_args(Granularity)}")
    if logger_m.slot_KC.shape != target_m.slot_KC.shape:
        raise DimensionError(f"logger moments {logger_m.slot_KC.shape} and target moments "
                             f"{target_m.slot_KC.shape} disagree")
    q = target_m.slot_KC.ravel() if granularity == "slot" else target_m.inclusion_C
    return logger_m.gram_pinv(granularity) @ q


def _pi_weight(v: np.ndarray, slate_K: np.ndarray, c: int, granularity: Granularity) -> float:
    if granularity == "slot":
        return float(v[np.arange(slate_K.shape[0]) * c + slate_K].sum())
    return float(v[slate_K].sum())


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class SlateRound:
    """One logged slate: the logging and target slate distributions over the round's candidates, the logged
    slate ``slate_K`` (candidate indices, in draw order; ``K = logger.k``), the slate ``reward`` and, when
    observed, per-case rewards ``item_rewards_K`` (summing to the slate reward under additivity)."""

    logger: SlateDistribution
    target: SlateDistribution
    slate_K: np.ndarray
    reward: float
    item_rewards_K: np.ndarray | None = None

    def __post_init__(self) -> None:
        k, c = self.logger.k, self.logger.n_candidates
        if (self.target.k, self.target.n_candidates) != (k, c):
            raise DimensionError(f"SlateRound: the target fills {self.target.k} of {self.target.n_candidates} "
                                 f"slots, the logger {k} of {c}")
        slate = np.asarray(self.slate_K)
        if slate.shape != (k,) or (slate.size and not np.issubdtype(slate.dtype, np.integer)) \
                or len(set(slate.tolist())) != k or slate.min() < 0 or slate.max() >= c:
            raise DataFormatError(f"SlateRound.slate_K must be {k} distinct indices in [0, {c}), got {slate.tolist()}")
        object.__setattr__(self, "slate_K", slate.astype(np.int64))
        if not math.isfinite(self.reward):
            raise DataFormatError(f"SlateRound.reward={self.reward!r} must be finite")
        if self.item_rewards_K is not None:
            object.__setattr__(self, "item_rewards_K", _vector(self.item_rewards_K, "item_rewards_K", k))


def _round_moments(rounds: Sequence[SlateRound], rng: np.random.Generator | None, config: OPEConfig,
                   logger_moments: Sequence[SlateMoments] | None = None) -> list[tuple[SlateMoments, SlateMoments]]:
    """Each round's (logger, target) moments; a target that is the logger's own distribution reuses them."""
    if logger_moments is not None and len(logger_moments) != len(rounds):
        raise DimensionError(f"{len(logger_moments)} logger moments for {len(rounds)} rounds")
    kw = {"rng": rng, "max_enumerate": config.max_enumerate, "mc_samples": config.mc_samples}
    out = []
    for i, r in enumerate(rounds):
        mu = logger_moments[i] if logger_moments is not None else slate_moments(r.logger, pairs=True, **kw)
        out.append((mu, mu if r.target is r.logger else slate_moments(r.target, pairs=False, **kw)))
    return out


def _inclusion_ips(rounds: Sequence[SlateRound], moments: Sequence[tuple[SlateMoments, SlateMoments]], *,
                   config: OPEConfig) -> _Estimate:
    terms = np.empty(len(rounds))
    weights = np.empty(len(rounds))
    mass = np.empty(len(rounds))
    split = 0
    for i, (r, (mu, pi)) in enumerate(zip(rounds, moments)):
        mu_in, pi_in = mu.inclusion_C, pi.inclusion_C
        shown = r.slate_K
        if (mu_in[shown] <= 0).any():
            raise DataFormatError(f"slate round {i}: a shown case has logged inclusion probability 0")
        w_K = pi_in[shown] / mu_in[shown]
        if r.item_rewards_K is None:
            split += not np.allclose(w_K, 1.0, rtol=1e-9, atol=0.0)  # weights 1 (the logger's own inclusions): no bias
            item = np.full(shown.shape[0], r.reward / shown.shape[0])
        else:
            item = r.item_rewards_K
        terms[i] = float(np.sum(w_K * item))
        weights[i] = float(np.mean(w_K))
        mass[i] = 0.0 if pi is mu else float(np.where(mu_in <= config.support_eps, pi_in, 0.0).sum()) / r.logger.k
    notes = _support_warning(mass, config.support_eps, "inclusion probability")
    if split:
        notes.append(f"inclusion_ips: {split} of {len(rounds)} rounds log only the slate reward and weigh "
                     "their cases off 1; each shown case was credited reward / K, which biases the estimate unless "
                     "every shown case contributes equally (read pi and pi_set instead)")
    return _Estimate(name="inclusion_ips", value=float(np.mean(terms)) if terms.size else math.nan, terms_N=terms,
                     ess=effective_sample_size(weights), warnings=notes)


def _pseudo_inverse(rounds: Sequence[SlateRound], moments: Sequence[tuple[SlateMoments, SlateMoments]], *,
                    granularity: Granularity, config: OPEConfig) -> _Estimate:
    terms = np.empty(len(rounds))
    weights = np.empty(len(rounds))
    mass = np.empty(len(rounds))
    approximate = 0
    for i, (r, (mu, pi)) in enumerate(zip(rounds, moments)):
        v = pseudo_inverse_vector(mu, pi, granularity=granularity)
        weights[i] = _pi_weight(v, r.slate_K, r.logger.n_candidates, granularity)
        terms[i] = r.reward * weights[i]
        if pi is mu:  # the logger's own moments: total support by construction
            mass[i] = 0.0
        elif granularity == "slot":
            mass[i] = float(np.where(mu.slot_KC <= config.support_eps, pi.slot_KC, 0.0).sum()) / r.logger.k
        else:
            mass[i] = float(np.where(mu.inclusion_C <= config.support_eps, pi.inclusion_C, 0.0).sum()) / r.logger.k
        approximate += not (mu.exact and pi.exact)
    notes = _support_warning(mass, config.support_eps,
                             "slot probability" if granularity == "slot" else "inclusion probability")
    if approximate:
        notes.append(f"{approximate} of {len(rounds)} rounds have too many ordered slates to enumerate: their "
                     "Plackett-Luce moments are Monte Carlo estimates, so the estimate is approximately unbiased")
    return _Estimate(name="pi" if granularity == "slot" else "pi_set",
                     value=float(np.mean(terms)) if terms.size else math.nan, terms_N=terms,
                     ess=effective_sample_size(weights), warnings=notes)


def inclusion_ips(rounds: Sequence[SlateRound], *, rng: np.random.Generator | None = None,
                  config: OPEConfig | None = None) -> OPEResult:
    """Inclusion-probability IPS: ``mean_i sum_{c in S_i} (pi_i(c in S) / mu_i(c in S)) r_ic``.

    Assumes an additive, position-independent slate reward ``r = sum_{c in S} r_c``, each case's reward
    independent of the other cases shown, and per-case rewards ``item_rewards_K``; unbiased then (given logger
    support). A round without them credits each shown case ``reward / K``: biased off-policy (a warning counts
    the rounds where a case weight differs from 1). The ESS is that of each round's mean case weight. ``rng``
    seeds the bootstrap (and the Monte Carlo moments of rounds too large to enumerate)."""
    config = config or OPEConfig()
    moments = _round_moments(rounds, rng, config)
    return _results([_inclusion_ips(rounds, moments, config=config)], seed=_boot_seed(rng), n_boot=config.n_boot,
                    level=config.level)[0]


def pseudo_inverse(rounds: Sequence[SlateRound], *, granularity: Granularity = "slot",
                   rng: np.random.Generator | None = None, config: OPEConfig | None = None) -> OPEResult:
    """The pseudo-inverse estimator (Swaminathan et al. 2017): ``mean_i r_i q_pi(x_i)^T Gamma_mu(x_i)^+ 1_{S_i}``.

    Assumes the slate reward is additive: over (slot, case) pairs for ``granularity="slot"`` (the paper's
    ranking form; position-dependent), over cases for ``"set"`` (position-independent, lower variance);
    unbiased then when the target's slates lie in the span of the logger's. Biased for non-additive rewards,
    and only approximately unbiased when the moments come from Monte Carlo draws (a warning says so). The
    result is named ``pi`` (slot) or ``pi_set``; its ESS is that of the per-round PI weights (which can be
    negative)."""
    config = config or OPEConfig()
    moments = _round_moments(rounds, rng, config)
    return _results([_pseudo_inverse(rounds, moments, granularity=granularity, config=config)],
                    seed=_boot_seed(rng), n_boot=config.n_boot, level=config.level)[0]


def estimate_slates(rounds: Sequence[SlateRound], *, rng: np.random.Generator | None = None,
                    config: OPEConfig | None = None,
                    logger_moments: Sequence[SlateMoments] | None = None) -> list[OPEResult]:
    """``inclusion_ips``, ``pi`` (slot) and ``pi_set`` on the same moments and the same bootstrap resamples.

    ``logger_moments``: each round's logger moments (:func:`slate_moments` with ``pairs=True``), computed once
    when several targets are evaluated on one log."""
    config = config or OPEConfig()
    if not rounds:
        raise DataFormatError("estimate_slates: no rounds")
    moments = _round_moments(rounds, rng, config, logger_moments)
    return _results([_inclusion_ips(rounds, moments, config=config),
                     _pseudo_inverse(rounds, moments, granularity="slot", config=config),
                     _pseudo_inverse(rounds, moments, granularity="set", config=config)],
                    seed=_boot_seed(rng), n_boot=config.n_boot, level=config.level)
