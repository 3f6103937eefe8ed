"""Per-case evidence and the choice of the shown set: what a Q over embeddings cannot do on its own (issue 39).

A Q-network reads a case only through its vectors, so two cases worded alike (a current answer and a stale one to
the same question) look alike to it: what a label says about *this* case is spread over every case that resembles
it. Two pieces sit beside the embedding Q, both in the soft-Q agent (:class:`memento.policies.soft_q.SoftQAgent`):

- **Per-case evidence** (:class:`~memento.config.EvidenceConfig`). When the planner labels a task's candidates (each
  scored alone against the target, :class:`~memento.learn.policy.CandidateLabels`), each labelled case gets one
  evidence row in the bank (:meth:`memento.bank.CaseBank.record_evidence`): its label advantage over its
  *look-alike* rivals in that labelled set, :func:`lookalike_advantage`. The agent adds ``weight`` times the shrunk
  mean ``value_sum / (weight_sum + prior)`` (:func:`evidence_term`), centred on the case's look-alikes among the
  candidates (:func:`relative_evidence`), to the Q-network's score: look-alikes are reordered, nothing else moves,
  and a case never labelled ranks as the embedding part says. The rows live in the bank beside the usage log (both back
  ends), roll back with it on resume, travel in an exported selector's bank and leave with a deleted or replaced
  case.
- **The set** (:class:`~memento.config.SetChoiceConfig`). Cases are drawn one at a time from the softmax over the
  candidates still allowed, where a candidate whose question is a look-alike (cosine >= ``redundancy``) of one
  already drawn, with less per-case evidence than it, is not allowed (look-alikes nothing tells apart yet are both
  allowed: showing both hedges where a choice would be a coin flip; :func:`draw_set`, the exact probability of the
  ordered set is logged), and the set's size is chosen among a few of 1..K separately in each context of what the
  evidence says of the policy's top case (:func:`set_context`): by default drawn from a softmax over the mean
  reward the shown sets of each size earned there (:func:`reward_size`, :func:`add_reward`; the draw's probability
  is logged), or, with set-level labels, the size whose value ``V(context, n)`` is highest
  (:func:`update_set_values` learns ``V`` from the planner's score of the policy's ranked prefixes of a few sizes,
  :func:`ranked_prefixes`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from memento.errors import DimensionError
from memento.types import Selection

__all__ = ["SET_CONTEXTS", "add_reward", "draw_set", "evidence_term", "lookalike_advantage", "ranked_prefixes",
           "leaning", "relative_evidence", "reward_size", "set_context", "set_size", "update_set_values"]


def _lookalike_weights(emb_ND: np.ndarray, bandwidth: float) -> np.ndarray:
    """``exp((cos(e_i, e_j) - 1) / bandwidth)`` for every pair of the N unit vectors: 1 for cases worded alike, almost 0
    for unrelated ones (the look-alike kernel of :func:`lookalike_advantage` and :func:`relative_evidence`)."""
    emb = np.asarray(emb_ND, dtype=np.float64)
    return np.exp((np.clip(emb @ emb.T, -1.0, 1.0) - 1.0) / bandwidth)


def lookalike_advantage(score_M: np.ndarray, emb_MD: np.ndarray, bandwidth: float) -> tuple[np.ndarray, np.ndarray]:
    """``(weight_M, value_M)`` of M cases labelled together: ``w_ij = exp((cos(e_i, e_j) - 1) / bandwidth)`` for
    ``j != i``, ``weight_i = sum_j w_ij`` and ``value_i = sum_j w_ij (score_i - score_j)`` (so ``value / weight`` is
    the case's advantage over its look-alikes, and an unrelated rival counts for almost nothing)."""
    score_M = np.asarray(score_M, dtype=np.float64).reshape(-1)
    emb_MD = np.asarray(emb_MD, dtype=np.float64)
    if emb_MD.ndim != 2 or emb_MD.shape[0] != score_M.shape[0]:
        raise DimensionError(f"lookalike_advantage: score_M.shape={score_M.shape}, emb_MD.shape={emb_MD.shape}")
    w_MM = _lookalike_weights(emb_MD, bandwidth)
    np.fill_diagonal(w_MM, 0.0)
    weight_M = w_MM.sum(axis=1)
    value_M = (w_MM * (score_M[:, None] - score_M[None, :])).sum(axis=1)
    return weight_M, value_M


def evidence_term(weight_C: np.ndarray, value_C: np.ndarray, prior: float) -> np.ndarray:
    """A case's shrunk evidence ``value_sum / (weight_sum + prior)`` (0 for a case never labelled)."""
    return np.asarray(value_C, dtype=np.float64) / (np.asarray(weight_C, dtype=np.float64) + prior)


SET_CONTEXTS = ("none", "positive", "negative")
"""What the set size is conditioned on: the per-case evidence of the policy's top case (none yet, or it beat or lost to
its look-alikes). A case whose evidence says it is the right one is best shown alone when the planner copies
whatever else it is shown; a case nothing is known about may need company."""


def leaning(context: str, k: int) -> int:
    """The size the reward prior leans to in a context: 1 for a top case that beat its look-alikes (the planner's
    labels showed it the right demonstration: shown alone, nothing beside it to copy), else ``k`` (Memento's K)."""
    return 1 if context == "positive" else k


def set_context(evidence: float) -> str:
    """The :data:`SET_CONTEXTS` entry of a top case with shrunk evidence ``evidence``."""
    return "none" if abs(evidence) < 1e-9 else "positive" if evidence > 0 else "negative"


def relative_evidence(e_C: np.ndarray, emb_CD: np.ndarray, bandwidth: float) -> np.ndarray:
    """``e(c)`` minus the kernel-weighted mean evidence of ``c``'s look-alikes among the C candidates, itself included
    (``exp((cos - 1) / bandwidth)``, as :func:`lookalike_advantage`). Evidence says which of two cases worded alike
    helps, not how much a case helps another question: added to Q as it is, a case that beat its own look-alikes by
    a wide margin would rise above the right cases of every other task; centred on its look-alikes it reorders the
    look-alikes and leaves a case without any where the embedding part puts it."""
    e = np.asarray(e_C, dtype=np.float64)
    if not e.any():
        return e
    w_CC = _lookalike_weights(emb_CD, bandwidth)
    return e - (w_CC @ e) / w_CC.sum(axis=1)


def set_size(values: Sequence[float] | None, k: int) -> int:
    """The size in 1..k with the highest value ``values[n - 1]`` (ties go to the larger; no values: ``k``)."""
    if not values or k <= 1:
        return max(1, k)
    v = np.asarray(values[:k], dtype=np.float64)
    best = np.flatnonzero(v >= v.max() - 1e-12)
    return int(best[-1]) + 1 if best.size else k


def reward_size(sums: Sequence[float] | None, counts: Sequence[float] | None, arms: Sequence[int], lean: int, *,
                explore: float, prior: float, prior_mean: float, bonus: float, rng: np.random.Generator,
                greedy: bool = False) -> tuple[int, float]:
    """A set size drawn from ``softmax(m(n) / explore)`` over ``arms``, where ``m(n) = (sum_n + prior * m0_n) /
    (count_n + prior)`` is the shrunk mean reward of the sets of size ``n`` shown so far (``sums[n - 1]``,
    ``counts[n - 1]``; ``m0_n = prior_mean``, plus ``bonus`` for the size the prior leans to, ``n = lean``);
    ``greedy`` takes the best (ties: the larger). Returns ``(n, probability of the draw)``."""
    sizes = np.asarray(arms, dtype=np.int64)

    def at(values: Sequence[float] | None) -> np.ndarray:  # values[n - 1] per arm, 0 where none was recorded
        known = values or []
        return np.asarray([known[n - 1] if n <= len(known) else 0.0 for n in sizes], dtype=np.float64)

    s, c = at(sums), at(counts)
    m0 = prior_mean + bonus * (sizes == lean)
    mean = (s + prior * m0) / (c + prior)
    z = (mean - mean.max()) / explore
    p = np.exp(z)
    p /= p.sum()
    if greedy:
        best = np.flatnonzero(mean >= mean.max() - 1e-12)
        return int(sizes[best[-1]]), 1.0
    j = int(np.argmax(np.log(np.maximum(p, 1e-300)) + rng.gumbel(size=sizes.size)))
    return int(sizes[j]), float(p[j])


def add_reward(sums: list[float], counts: list[float], n: int, reward: float) -> tuple[list[float], list[float]]:
    """``sums``/``counts`` with one shown set of ``n`` cases that earned ``reward`` (grown to ``n``)."""
    sums = list(sums) + [0.0] * max(0, n - len(sums))
    counts = list(counts) + [0.0] * max(0, n - len(counts))
    sums[n - 1] += float(reward)
    counts[n - 1] += 1.0
    return sums, counts


def update_set_values(values: list[float], sizes_S: Sequence[int], score_S: np.ndarray, *, tau: float,
                      lr: float) -> list[float]:
    """One step of the listwise loss ``KL(softmax(score_S / tau) || softmax(V[sizes_S] / tau))`` on the values of
    the scored sizes (the others are left as they are); returns the new values (grown to the largest size)."""
    sizes = [int(n) for n in sizes_S]
    out = list(values) + [0.0] * max(0, max(sizes) - len(values))
    if len(sizes) < 2:
        return out
    score = np.asarray(score_S, dtype=np.float64) / tau
    v = np.asarray([out[n - 1] for n in sizes], dtype=np.float64) / tau
    p = np.exp(score - score.max())
    q = np.exp(v - v.max())
    grad = (q / q.sum() - p / p.sum()) / tau  # d KL / d V
    for n, g in zip(sizes, grad):
        out[n - 1] -= lr * float(g)
    return out


def _beaten(cos_CC: np.ndarray, evidence_C: np.ndarray | None, i: int, redundancy: float) -> np.ndarray:
    """The candidates case ``i`` rules out once shown: its look-alikes (cosine >= ``redundancy``) whose per-case
    evidence is below its own. Look-alikes nothing tells apart (no evidence, or as much) stay: showing both hedges
    where a choice would be a coin flip."""
    lookalike_C = cos_CC[i] >= redundancy - 1e-6
    if evidence_C is None:
        return lookalike_C
    return lookalike_C & (evidence_C < evidence_C[i] - 1e-9)


def ranked_prefixes(order_P: np.ndarray, emb_PD: np.ndarray, redundancy: float, sizes: Sequence[int],
                    evidence_P: np.ndarray | None = None) -> list[list[int]]:
    """The prefixes of ``sizes`` of a ranking ``order_P`` (indices into ``emb_PD``) once the cases a case ranked
    higher rules out are skipped (:func:`draw_set`'s rule); a size the ranking cannot fill gives the longest prefix
    (duplicates dropped)."""
    emb = np.asarray(emb_PD, dtype=np.float64)
    cos_PP = emb @ emb.T
    ranked: list[int] = []
    out_P = np.zeros(cos_PP.shape[0], dtype=bool)
    for i in np.asarray(order_P, dtype=np.int64).tolist():
        if not out_P[i]:
            ranked.append(i)
            out_P |= _beaten(cos_PP, evidence_P, i, redundancy)
    out: list[list[int]] = []
    for n in sizes:
        prefix = ranked[:n]
        if prefix and prefix not in out:
            out.append(prefix)
    return out


def draw_set(q_C: np.ndarray, emb_CD: np.ndarray, candidate_ids: Sequence[str], n: int, alpha: float, *,
             redundancy: float, rng: np.random.Generator, greedy: bool = False,
             evidence_C: np.ndarray | None = None) -> Selection:
    """``n`` cases drawn one at a time from ``softmax(q / alpha)`` over the candidates still allowed (not ruled
    out by one drawn before: a look-alike, cosine >= ``redundancy``, with less per-case evidence ``evidence_C``
    than it; with no evidence given, every look-alike); fewer when the allowed ones run out. ``greedy``
    takes the best allowed one each time (``set_prob = 1``); otherwise ``set_prob`` is the product of each draw's
    probability, exact. ``probs_C`` is the softmax over all candidates and ``probs_K`` its value at the drawn
    cases (each case's first-draw propensity)."""
    q = np.asarray(q_C, dtype=np.float64)
    c = q.shape[0]
    z = (q - q.max()) / alpha
    p_C = np.exp(z)
    probs_C = p_C / p_C.sum()
    emb = np.asarray(emb_CD, dtype=np.float64)
    cos_CC = emb @ emb.T
    allowed = np.ones(c, dtype=bool)
    chosen: list[int] = []
    log_prob = 0.0
    for _ in range(min(n, c)):
        if chosen:
            allowed &= ~_beaten(cos_CC, evidence_C, chosen[-1], redundancy)
        allowed[chosen] = False
        idx = np.flatnonzero(allowed)
        if not idx.size:
            break
        if greedy:
            pick = int(idx[np.argmax(q[idx])])  # the first of equal values: the earlier candidate
        else:
            logits = z[idx]
            logp = logits - logits.max()
            logp = logp - math.log(np.exp(logp).sum())
            j = int(np.argmax(logp + rng.gumbel(size=idx.size)))
            pick = int(idx[j])
            log_prob += float(logp[j])
        chosen.append(pick)
    order_K = np.asarray(chosen, dtype=np.int64)
    ids = list(candidate_ids)
    return Selection(ids=[ids[i] for i in order_K], positions_K=order_K, probs_K=probs_C[order_K].copy(),
                     set_prob=1.0 if greedy else float(math.exp(log_prob)), candidate_ids=ids, probs_C=probs_C,
                     greedy=bool(greedy))
