"""The Policy protocol every case-selection policy implements, and the helpers they share.

A policy looks at one state vector ``state_D`` and a candidate set (``memento.bank.Candidates``:
``C`` case ids, their bank positions, similarity scores and stored vectors) and

- ``probs(state_D, candidates) -> probs_C``: its distribution over the candidates (float64, sums to 1);
- ``select(state_D, candidates, k, *, rng, greedy=False) -> Selection``: ``k`` distinct cases.

Conventions shared by every policy in ``policies/``:

- ``Selection.positions_K`` are indices **into the candidate set** (``0 <= p < C``), in the order the
  cases were drawn, so ``ids[i] == candidate_ids[positions_K[i]]`` and
  ``probs_K == probs_C[positions_K]``; a case's bank position is ``candidates.positions_C[p]``.
- A sampling policy draws ``k`` cases without replacement from ``probs_C`` by Gumbel-top-k
  (:func:`gumbel_top_k`); ``set_prob`` is then the Plackett-Luce probability of the drawn ordered
  set (:func:`plackett_luce_prob`). A deterministic choice (``greedy=True``, or a policy that is
  deterministic by construction) has ``set_prob == 1.0`` and ``Selection.greedy == True``; its
  ``probs_C`` still reports the policy's soft distribution, for diagnostics.
- When fewer than ``k`` candidates exist (or are allowed), all of them are selected: the selection
  then holds ``min(k, C)`` cases. An empty candidate set raises ``DataFormatError``.
- Randomness comes only from the ``rng`` passed in (a ``numpy.random.Generator``): the same seed
  gives the same selections.

Learning goes through the same object (the way Stable-Baselines3 writes its collect loop once and
lets each algorithm plug in): the online loop, the regret run and the served selector call only

- ``observe(observations, *, learn=True) -> metrics``: one update round of :class:`Observation`
  records (state, the candidate set, the selection made from it, the reward; a round holds the B
  decisions made with the same parameters). A learning policy records them (soft-Q: its replay
  buffer; LinUCB: its ridge regression) and, with ``learn``, takes its update steps; it returns
  scalars such as ``{"loss": ...}`` (``{}`` when nothing was learned);
- ``version`` (updates made so far, logged with each decision), ``alpha`` (the soft-max temperature,
  ``None`` for policies without one), ``reward_range`` (rewards the policy can learn from, ``None``:
  any finite number);
- ``checkpoint(directory)`` / ``restore(directory)``: the learning state, for resumable runs;
  ``save_model(directory) -> bool``: the trained model in the format ``memento train`` writes
  (``False`` when the policy has none).

:class:`StaticPolicy` gives the non-learning policies (random, similarity) those members.
Policies are built by ``memento.policies.make_policy(config, context)`` from a
:data:`~memento.policies.PolicyConfig` and a :class:`PolicyContext`; this module (the base layer) never imports
``memento.policies``: the runs take the factory as an argument (:data:`PolicyFactory`).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import numbers
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from memento.bank import Candidates
from memento.errors import DataFormatError, DimensionError
from memento.learn.qnet import MLPQNetwork, QNetwork, eval_call
from memento.types import Selection

__all__ = [
    "CandidateLabels",
    "EvidenceFn",
    "Observation",
    "Policy",
    "PolicyContext",
    "PolicyFactory",
    "RewardFn",
    "StaticPolicy",
    "boltzmann_select",
    "check_candidates",
    "check_k",
    "gumbel_top_k",
    "log_softmax",
    "make_selection",
    "plackett_luce_logprob",
    "plackett_luce_prob",
    "positive_pool",
    "q_values",
    "softmax",
    "top_k",
]

logger = logging.getLogger(__name__)

_SUM_TOLERANCE = 1e-6


RewardFn = Callable[[Sequence[str]], Any]
EvidenceFn = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]]
"""``evidence_of(positions_C) -> (count_C, weight_C, value_C)``: per-case evidence (the bank's ``evidence_at``)."""
"""``reward_of(case_ids) -> rewards``: the stored rewards of cases (e.g. ``CaseBank.rewards``)."""


@dataclasses.dataclass(frozen=True, eq=False)
class CandidateLabels:
    """Per-candidate planner labels of one decision (the online loop's, :class:`~memento.config.OnlineLabelsConfig`):
    ``rows_M``, indices into the observation's ``candidates`` of the labelled ones, and ``score_M``, the planner's
    length-normalised log-likelihood of the target answer with each as the only demonstration; ``sets`` (rows into
    ``candidates``, in prompt order) and ``set_score_S``, the same score of a few whole sets (set-level labels,
    :class:`~memento.config.SetChoiceConfig`)."""

    rows_M: np.ndarray
    score_M: np.ndarray
    sets: tuple[tuple[int, ...], ...] = ()
    set_score_S: np.ndarray | None = None

    def __post_init__(self) -> None:
        rows_M, score_M = np.asarray(self.rows_M), np.asarray(self.score_M, dtype=np.float64)
        if rows_M.ndim != 1 or score_M.shape != rows_M.shape or not np.isfinite(score_M).all():
            raise DimensionError(f"CandidateLabels: rows_M.shape={rows_M.shape}, score_M.shape={score_M.shape} "
                                 f"(finite: {bool(np.isfinite(score_M).all())}) must be equal 1-D and finite")
        set_score = np.zeros(0) if self.set_score_S is None else np.asarray(self.set_score_S, dtype=np.float64)
        if set_score.shape != (len(self.sets),) or not np.isfinite(set_score).all():
            raise DimensionError(f"CandidateLabels: {len(self.sets)} set(s), set_score_S.shape={set_score.shape} "
                                 "must match and be finite")


@dataclasses.dataclass(frozen=True, eq=False)
class Observation:
    """One decision and its outcome, as a policy learns from it.

    ``candidates`` must hold every chosen case (it may be the set the policy chose from, or a
    superset; the chosen cases are found by id); ``step`` is the decision's place in its stream
    (the loop's step, the feedback's sequence number); ``policy_version`` is ``policy.version``
    when the choice was made. ``case_rewards_K``, when given, is per-case credit: a target in [0, 1]
    for each chosen case (in draw order) that a learning policy uses instead of the shared ``reward``
    (the online loop's leave-one-out credit, ``LoopConfig.credit``).

    ``labels``, when given, are per-candidate planner labels (:class:`CandidateLabels`) that a learning policy
    may learn from beside the reward (the soft-Q agent's listwise loss, ``SoftQConfig.labels``).

    A multi-step decision (the game loop, :mod:`memento.runs.games`) also gives ``done`` (the episode ended with
    it: no bootstrap) and, when it did not, the next state's embedding ``next_state_D`` and its candidate set
    ``next_candidates`` (possibly empty), which a soft-Q learner with ``gamma > 0`` uses for its soft TD target.
    A single-step decision leaves them at ``done=True`` and ``None``.
    """

    state_D: np.ndarray
    candidates: Candidates
    selection: Selection
    reward: float
    step: int
    policy_version: int
    case_rewards_K: np.ndarray | None = None
    done: bool = True
    next_state_D: np.ndarray | None = None
    next_candidates: Candidates | None = None
    labels: CandidateLabels | None = None

    def case_rewards(self) -> np.ndarray:
        """The target of each chosen case: ``case_rewards_K``, else the shared reward for all of them."""
        k = len(self.selection.ids)
        if self.case_rewards_K is None:
            return np.full(k, float(self.reward))
        rewards_K = np.asarray(self.case_rewards_K, dtype=np.float64)
        if rewards_K.shape != (k,) or not np.isfinite(rewards_K).all():
            raise DimensionError(f"observation: case_rewards_K has shape {rewards_K.shape} (finite: "
                                 f"{bool(np.isfinite(rewards_K).all())}) for {k} chosen case(s)")
        return rewards_K

    def chosen_rows(self) -> np.ndarray:
        """Indices into ``candidates`` of the chosen cases, in draw order."""
        return self.candidates.rows_of(self.selection.ids)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PolicyContext:
    """What a run gives the policy factory besides the policy's own config.

    ``dim``: the state/case vector dimension; ``k_max``: the most cases one decision shows (the
    replay buffer's row width); ``device``: where a Q-network, learner and replay buffer live;
    ``qnet_seed`` / ``learner_seed``: torch seeds of the Q-network initialisation and of the learner's
    generator (derived from the run's seed); ``reward_of``: the stored rewards of the bank's cases
    (for positive-only choices); ``featurizer``: the case vectors of a Q-network with case features
    (:class:`memento.learn.features.CaseFeaturizer` over the run's bank and encoder; ``None``: the run gives none);
    ``c_max``: the most next-state candidates a multi-step decision logs (the game loop's candidate count; a
    soft-Q learner with ``gamma > 0`` keeps them in its replay buffer); ``evidence_of``: the per-case evidence at
    bank positions, ``(count_C, weight_C, value_C)`` (the bank's :meth:`~memento.bank.CaseBank.evidence_at`;
    ``None``: the run keeps none).
    """

    dim: int
    k_max: int = 4
    device: torch.device = dataclasses.field(default_factory=lambda: torch.device("cpu"))
    qnet_seed: int = 0
    learner_seed: int = 0
    reward_of: RewardFn | None = None
    featurizer: Any | None = None
    c_max: int = 32
    evidence_of: EvidenceFn | None = None


PolicyFactory = Callable[[Any, PolicyContext], "Policy"]
"""``make_policy(config, context) -> Policy`` (``memento.policies.make_policy``; ``config`` a
:data:`memento.policies.PolicyConfig`), passed in by the caller of a run."""


@runtime_checkable
class Policy(Protocol):
    """What every selection policy implements (see the module docstring for the conventions)."""

    def probs(self, state_D: np.ndarray, candidates: Candidates) -> np.ndarray:
        """The policy's distribution over the ``C`` candidates: float64 ``probs_C`` summing to 1."""
        ...

    def select(self, state_D: np.ndarray, candidates: Candidates, k: int, *, rng: np.random.Generator,
               greedy: bool = False) -> Selection:
        """Choose ``min(k, C)`` distinct candidates; ``greedy=True`` asks for the arg-max choice."""
        ...

    def observe(self, observations: Sequence[Observation], *, learn: bool = True) -> dict[str, float]:
        """Record one round of decisions and (with ``learn``) learn from them; returns scalars."""
        ...

    @property
    def version(self) -> int:
        """Updates made so far (logged with each decision as its policy version)."""
        ...

    @property
    def alpha(self) -> float | None:
        """The soft-max temperature the next choice uses (``None``: the policy has none)."""
        ...

    @property
    def reward_range(self) -> tuple[float, float] | None:
        """The rewards this policy can learn from (``None``: any finite number)."""
        ...

    def checkpoint(self, directory: Path) -> None:
        """Write the learning state into ``directory`` (which exists)."""
        ...

    def restore(self, directory: Path) -> None:
        """Read back what :meth:`checkpoint` wrote (into a freshly built policy of the same config)."""
        ...

    def save_model(self, directory: Path) -> bool:
        """Write the trained model (``False``, writing nothing, when the policy has none)."""
        ...


def positive_pool(candidates: Candidates, reward_of: RewardFn | None) -> Candidates:
    """The candidates whose stored reward (``reward_of(ids)``) is > 0, all of them when none is or when there is
    no ``reward_of``: the pool of Memento's positive-only retrieval, for policies that choose within it."""
    if reward_of is None or not len(candidates):
        return candidates
    return candidates.positive(np.asarray(reward_of(list(candidates.ids)), dtype=np.float64))


class StaticPolicy:
    """The learning members of :class:`Policy` for a policy that does not learn (random, similarity)."""

    def observe(self, observations: Sequence[Observation], *, learn: bool = True) -> dict[str, float]:
        return {}

    @property
    def version(self) -> int:
        return 0

    @property
    def alpha(self) -> float | None:
        return None

    @property
    def reward_range(self) -> tuple[float, float] | None:
        return None

    def checkpoint(self, directory: Path) -> None:
        return None

    def restore(self, directory: Path) -> None:
        return None

    def save_model(self, directory: Path) -> bool:
        return False


# ---------------------------------------------------------------- input checks


def check_candidates(state_D: np.ndarray, candidates: Candidates) -> np.ndarray:
    """Validate a (state, candidate set) pair; returns ``state_D`` as a float array.

    Raises ``DataFormatError`` for an empty candidate set or non-finite values, and
    ``DimensionError`` when the state and the candidate vectors disagree in shape.
    """
    state = np.asarray(state_D)
    if state.ndim != 1:
        raise DimensionError(f"state must be one vector [D], got {state.shape=}")
    if not np.issubdtype(state.dtype, np.number) or not np.isfinite(state).all():
        raise DataFormatError(f"state must be finite numbers, got dtype {state.dtype} (NaN/inf or non-numeric)")
    n = len(candidates)
    if n == 0:
        raise DataFormatError("the candidate set is empty (C=0): there is nothing to select from "
                              "(is the bank empty, or does the env/kind filter match no case?)")
    emb = np.asarray(candidates.embeddings_CD)
    if emb.ndim != 2 or emb.shape[0] != n or emb.shape[1] != state.shape[0]:
        raise DimensionError(f"candidate vectors have {emb.shape=}, expected ({n}, {state.shape[0]}) "
                             f"for {n} candidate id(s) and {state.shape=}")
    if np.asarray(candidates.positions_C).shape != (n,):
        raise DimensionError(f"candidates.positions_C has shape {np.asarray(candidates.positions_C).shape}, "
                             f"expected ({n},)")
    return state


def check_k(k: int, n_candidates: int) -> int:
    """``k`` as an int clipped to ``n_candidates`` (select all when fewer exist); ``k < 1`` raises."""
    if isinstance(k, (bool, np.bool_)) or not isinstance(k, numbers.Integral) or k < 1:
        raise DataFormatError(f"k must be a positive integer, got {k!r}")
    if k > n_candidates:
        logger.debug("k=%d exceeds the %d candidate(s); selecting all of them", k, n_candidates)
    return min(int(k), int(n_candidates))


def _check_vector(x: np.ndarray, name: str) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 1 or x.shape[0] == 0:
        raise DimensionError(f"{name} must be a non-empty vector [C], got {x.shape=}")
    if np.isnan(x).any() or np.isposinf(x).any():
        raise DataFormatError(f"{name} contains NaN or +inf: {x!r}")
    if not np.isfinite(x).any():
        raise DataFormatError(f"{name} has no finite entry (all -inf): nothing can be chosen")
    return x


def _check_temperature(temperature: float) -> float:
    if (isinstance(temperature, (bool, np.bool_)) or not isinstance(temperature, numbers.Real)
            or not math.isfinite(temperature) or temperature <= 0):
        raise DataFormatError(f"temperature must be a finite number > 0, got {temperature!r}")
    return float(temperature)


# ---------------------------------------------------------------- distributions


def log_softmax(x_C: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """``log softmax(x_C / temperature)`` in float64, stable for large logits; ``-inf`` entries stay ``-inf``."""
    z = _check_vector(x_C, "logits") / _check_temperature(temperature)
    if np.isposinf(z).any():
        raise DataFormatError(f"logits / temperature overflows (temperature={temperature!r}, max |logit|="
                              f"{np.abs(np.asarray(x_C, dtype=np.float64)).max()!r})")
    z = z - z.max()
    return z - np.log(np.exp(z).sum())


def softmax(x_C: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """``exp(x_c / T) / sum_j exp(x_j / T)`` in float64; subtracting the max keeps large logits finite.

    ``-inf`` entries get probability 0 (a mask); at least one entry must be finite.
    """
    p = np.exp(log_softmax(x_C, temperature))
    return p / p.sum()


def top_k(scores_C: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` largest scores, best first; ties go to the earlier candidate."""
    scores = _check_vector(scores_C, "scores")
    return np.argsort(-scores, kind="stable")[:k].astype(np.int64)


def gumbel_top_k(logp_C: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """Draw ``k`` distinct indices without replacement from ``softmax(logp_C)`` (Gumbel-top-k).

    Adding independent Gumbel(0, 1) noise to the log-probabilities and keeping the ``k`` largest
    keys draws an ordered sample whose law is Plackett-Luce (successive sampling without
    replacement). ``logp_C`` may be unnormalised logits. Entries at ``-inf`` (probability 0) are
    never drawn before a positive-probability entry; if ``k`` exceeds the support they come last,
    in index order. Returns ``order_K`` (int64), in draw order.
    """
    logp = _check_vector(logp_C, "logp")
    if isinstance(k, (bool, np.bool_)) or not isinstance(k, numbers.Integral) or not 1 <= k <= logp.shape[0]:
        raise DataFormatError(f"k must be an integer in [1, {logp.shape[0]}], got {k!r}")
    keys = logp + rng.gumbel(size=logp.shape[0])
    return np.argsort(-keys, kind="stable")[: int(k)].astype(np.int64)


def _check_order(order_K: np.ndarray, n: int) -> np.ndarray:
    order = np.asarray(order_K)
    if order.ndim != 1 or (order.size and not np.issubdtype(order.dtype, np.integer)):
        raise DataFormatError(f"order must be a vector of integer indices, got {order.shape=} {order.dtype=}")
    order = order.astype(np.int64)
    if order.size and (order.min() < 0 or order.max() >= n):
        raise DataFormatError(f"order indices must lie in [0, {n}), got {order.tolist()}")
    if len(set(order.tolist())) != order.size:
        raise DataFormatError(f"order repeats an index (draws are without replacement): {order.tolist()}")
    return order


def _check_probs(probs_C: np.ndarray) -> np.ndarray:
    p = np.asarray(probs_C, dtype=np.float64)
    if p.ndim != 1 or p.shape[0] == 0:
        raise DimensionError(f"probs must be a non-empty vector [C], got {p.shape=}")
    if not np.isfinite(p).all() or (p < 0).any():
        raise DataFormatError(f"probs must be finite and >= 0, got {p!r}")
    if abs(p.sum() - 1.0) > _SUM_TOLERANCE:
        raise DataFormatError(f"probs must sum to 1, got sum={p.sum()!r}")
    return p


def plackett_luce_prob(probs_C: np.ndarray, order_K: np.ndarray) -> float:
    """Probability of drawing exactly ``order_K`` (in that order) without replacement from ``probs_C``.

    ``prod_k p_{o_k} / (1 - sum_{j<k} p_{o_j})``; the denominator is computed as the mass still
    left (the sum over undrawn candidates), which equals ``1 - sum_{j<k} p_j`` but does not cancel
    catastrophically. A draw whose remaining mass is 0 has probability 0.
    """
    p = _check_probs(probs_C)
    order = _check_order(order_K, p.shape[0])
    remaining = p.copy()
    prob = 1.0
    for index in order:
        mass = remaining.sum()
        if mass <= 0.0 or remaining[index] <= 0.0:
            return 0.0
        prob *= remaining[index] / mass
        remaining[index] = 0.0
    return float(prob)


def plackett_luce_logprob(logits_C: np.ndarray, order_K: np.ndarray) -> float:
    """``log`` of :func:`plackett_luce_prob` for ``probs_C = softmax(logits_C)``, computed from the logits.

    Exact when the probabilities themselves underflow (a very low temperature): each factor is
    ``logit_k - logsumexp(logits of the undrawn candidates)``.
    """
    z = _check_vector(logits_C, "logits")
    return _plackett_luce_logprob(z, _check_order(order_K, z.shape[0]))


def _plackett_luce_logprob(z_C: np.ndarray, order_K: np.ndarray) -> float:
    """:func:`plackett_luce_logprob` of float64 logits and distinct indices already checked."""
    alive = np.ones(z_C.shape[0], dtype=bool)
    total = 0.0
    for index in order_K:
        rest = z_C[alive]
        top = rest.max()
        if not math.isfinite(top) or not math.isfinite(z_C[index]):
            return -math.inf
        total += float(z_C[index] - (top + math.log(np.exp(rest - top).sum())))
        alive[index] = False
    return total


# ---------------------------------------------------------------- the record


def make_selection(candidates: Candidates, probs_C: np.ndarray, order_K: np.ndarray, greedy: bool, *,
                   logits_C: np.ndarray | None = None) -> Selection:
    """Build the :class:`~memento.types.Selection` for candidates ``order_K`` (indices into the set).

    ``set_prob`` is 1.0 for a greedy (deterministic) choice, else the Plackett-Luce probability of
    the ordered draw. Pass ``logits_C`` (with ``probs_C == softmax(logits_C)``) to compute it in log
    space, exact even where ``probs_C`` underflows.
    """
    p = _check_probs(probs_C)
    n = len(candidates)
    if p.shape[0] != n:
        raise DimensionError(f"probs has {p.shape=} but there are {n} candidate(s)")
    order = _check_order(order_K, n)
    if order.size == 0:
        raise DataFormatError("a selection must hold at least one case (order is empty)")
    if greedy:
        set_prob = 1.0
    elif logits_C is not None:
        logits = np.asarray(logits_C, dtype=np.float64)
        if logits.shape != p.shape:
            raise DimensionError(f"logits has {logits.shape=}, probs has {p.shape=}")
        set_prob = math.exp(plackett_luce_logprob(logits, order))
    else:
        set_prob = plackett_luce_prob(p, order)
    candidate_ids = list(candidates.ids)
    return Selection(ids=[candidate_ids[i] for i in order], positions_K=order, probs_K=p[order].copy(),
                     set_prob=float(set_prob), candidate_ids=candidate_ids, probs_C=p, greedy=bool(greedy))


# ---------------------------------------------------------------- soft-max over Q-values


def q_values(qnet: torch.nn.Module, state_D: np.ndarray, candidates: Candidates,
             device: torch.device | None = None, *, cases_CE: np.ndarray | None = None) -> np.ndarray:
    """``Q(s, c)`` of every candidate as float64 ``q_C``, under ``torch.inference_mode`` in eval mode.

    The network sees ``candidates.embeddings_CD``, or ``cases_CE`` when given (one case vector per
    candidate, e.g. with case features: :meth:`memento.learn.features.CaseFeaturizer.case_vectors`).

    The network runs on ``device`` or, when ``None``, on the device of its first floating-point
    parameter or buffer (read at every call, so a moved network is followed; CPU for a parameterless
    one). A :class:`~memento.learn.qnet.QNetwork` scores through :meth:`~memento.learn.qnet.QNetwork.score`
    (the eval-mode values, its mode untouched), an MLP network on the CPU in float32 through its numpy twin
    :meth:`~memento.learn.qnet.MLPQNetwork.numpy_scores` (the same values to float32 rounding, faster for one
    state), which takes the case half of its first layer for the candidates' bank positions from its cache where
    the case's vector is the one it was computed from; any other module is put in ``eval()`` mode for the call and
    its training flag restored afterwards.
    """
    state = check_candidates(state_D, candidates)
    if isinstance(qnet, QNetwork):
        where, dtype = qnet.placement()
    else:
        where, dtype = torch.device("cpu"), torch.float32
        for tensor in itertools.chain(qnet.parameters(), qnet.buffers()):
            if tensor.is_floating_point():
                where, dtype = tensor.device, tensor.dtype
                break
    where = device or where
    vectors = candidates.embeddings_CD if cases_CE is None else cases_CE
    if isinstance(qnet, MLPQNetwork) and where.type == "cpu" and dtype == torch.float32:
        fast_C = qnet.numpy_scores(state, np.asarray(vectors), candidates.positions_C)
        if fast_C is not None:
            return np.array(fast_C, dtype=np.float64)
    with torch.inference_mode():
        state_BD = torch.as_tensor(state, dtype=dtype, device=where).unsqueeze(0)
        cases_BCD = torch.as_tensor(np.asarray(vectors), dtype=dtype, device=where).unsqueeze(0)
        q_BC = qnet.score(state_BD, cases_BCD) if isinstance(qnet, QNetwork) else eval_call(qnet, state_BD, cases_BCD)
        if not isinstance(q_BC, torch.Tensor) or tuple(q_BC.shape) != (1, len(candidates)):
            shape = tuple(q_BC.shape) if isinstance(q_BC, torch.Tensor) else type(q_BC).__name__
            raise DimensionError(f"qnet returned {shape}, expected q_BC of shape (1, {len(candidates)}) "
                                 f"for state_BD {tuple(state_BD.shape)} and cases_BCD {tuple(cases_BCD.shape)}")
        return np.array(q_BC[0].cpu().numpy(), dtype=np.float64)  # a float64 copy


def boltzmann_select(q_C: np.ndarray, candidates: Candidates, k: int, alpha: float, *, rng: np.random.Generator,
                     greedy: bool = False) -> Selection:
    """``k`` candidates from ``softmax(q_C / alpha)``: Gumbel-top-k draws with the exact Plackett-Luce
    propensity (in log space), or the top ``k`` by Q with ``set_prob = 1.0`` when ``greedy``.

    The same values as :func:`log_softmax`, :func:`softmax`, :func:`gumbel_top_k` (or :func:`top_k`) and
    :func:`make_selection` with ``logits_C = log_softmax(q_C, alpha)``, each input checked once.
    """
    n = len(candidates)
    k = check_k(k, n)
    logp_C = _log_softmax_fast(q_C, alpha)
    if logp_C.shape[0] != n:
        raise DimensionError(f"probs has p.shape={logp_C.shape} but there are {n} candidate(s)")
    p = np.exp(logp_C)
    probs_C = p / p.sum()  # softmax(q_C, alpha)
    if greedy:
        order_K = top_k(q_C, k)
        set_prob = 1.0
    else:
        keys_C = logp_C + rng.gumbel(size=n)  # gumbel_top_k
        order_K = np.argsort(-keys_C, kind="stable")[:k].astype(np.int64)
        set_prob = math.exp(_plackett_luce_logprob(logp_C, order_K))
    candidate_ids = list(candidates.ids)
    return Selection(ids=[candidate_ids[i] for i in order_K], positions_K=order_K, probs_K=probs_C[order_K].copy(),
                     set_prob=float(set_prob), candidate_ids=candidate_ids, probs_C=probs_C, greedy=bool(greedy))


def _log_softmax_fast(x_C: np.ndarray, temperature: float) -> np.ndarray:
    """:func:`log_softmax` with one finiteness test for the usual all-finite vector (the full checks otherwise)."""
    x = np.asarray(x_C, dtype=np.float64)
    if x.ndim != 1 or not x.shape[0] or not np.isfinite(x).all():
        return log_softmax(x_C, temperature)
    z = x / _check_temperature(temperature)
    if np.isinf(z).any():
        return log_softmax(x_C, temperature)  # raises: the division overflowed
    z = z - z.max()
    return z - np.log(np.exp(z).sum())
