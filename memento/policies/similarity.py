"""Similarity retrieval: the non-parametric case-based-reasoning baseline (Memento's "non-parametric memory").

Scores are the cosine between the state and each candidate's stored vector, computed here
from ``candidates.embeddings_CD`` (so hand-made candidate sets and approximate-index scores
are treated alike). With the default ``sample=False`` the policy is deterministic: it always
returns the top-K by cosine (ties go to the earlier candidate), ``Selection.greedy`` is True and
``set_prob`` is 1.0. With ``sample=True`` a non-greedy ``select`` draws K without replacement
from ``softmax(cos / temperature)`` by Gumbel-top-k; ``greedy=True`` still gives top-K. In both
modes ``probs`` reports ``softmax(cos / temperature)``.

``positive_only=True`` keeps only candidates whose stored reward is > 0, like Memento's
non-parametric client, which retrieves only successful cases. Rewards come from, in order:

1. a ``rewards_C`` attribute on the candidate set (see :class:`RewardedCandidates` and
   :func:`with_rewards`), aligned with ``candidates.ids``;
2. the ``reward_of`` callable given to the policy: ``reward_of(ids) -> rewards`` for a list of
   case ids (:func:`bank_rewards` builds one that reads a :class:`~memento.bank.CaseBank`).

Excluded candidates get probability 0 and are never chosen; when fewer than K pass, all of them
are chosen. When none passes, ``if_no_positive`` decides: ``"all"`` (default) falls back to the
whole candidate set (logged at debug level), ``"error"`` raises ``DataFormatError``.

The module is the whole policy: its config (:class:`SimilarityConfig`), the policy (:class:`SimilarityPolicy`), its
factory entry (:func:`build`) and its run defaults (the online runs keep successful cases only, the regret run all
of them), declared in :data:`SPEC`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from memento.bank import Candidates
from memento.config import check_bools, check_choice, check_float
from memento.errors import DataFormatError, DimensionError
from memento.learn.policy import (
    PolicyContext,
    RewardFn,
    StaticPolicy,
    check_candidates,
    check_k,
    gumbel_top_k,
    make_selection,
    softmax,
    top_k,
)
from memento.policies.spec import PolicySpec
from memento.types import Selection

__all__ = [
    "SPEC",
    "IfNoPositive",
    "RewardedCandidates",
    "SimilarityConfig",
    "SimilarityPolicy",
    "bank_rewards",
    "build",
    "cosine_scores",
    "with_rewards",
]

logger = logging.getLogger(__name__)

IfNoPositive = Literal["all", "error"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class SimilarityConfig:
    """Options of ``memento.policies.similarity.SimilarityPolicy`` (the non-parametric CBR baseline).

    - ``sample``: False = always top-K by cosine; True = a non-greedy ``select`` samples.
    - ``temperature``: of ``softmax(cos / temperature)`` (cosines lie in [-1, 1], so small values).
    - ``positive_only``: keep only candidates with reward > 0 (Memento's non-parametric client).
    - ``if_no_positive``: what ``positive_only`` does when no candidate has reward > 0 (``"all"``: fall
      back to every candidate; ``"error"``: raise).
    """

    kind: Literal["similarity"] = dataclasses.field(default="similarity", metadata={"help": (
        "the policy: cosine top-K, the non-parametric case-based-reasoning baseline")})
    sample: bool = dataclasses.field(default=False, metadata={"help": (
        "a non-greedy choice samples K from softmax(cos / temperature) (false: always the top-K by cosine)")})
    temperature: float = dataclasses.field(default=0.05, metadata={"help": (
        "temperature of softmax(cos / temperature) (cosines lie in [-1, 1], so small values)")})
    positive_only: bool = dataclasses.field(default=False, metadata={"help": (
        "keep only the candidates with stored reward > 0 (Memento's non-parametric client)")})
    if_no_positive: IfNoPositive = dataclasses.field(default="all", metadata={"help": (
        "what positive_only does when no candidate has reward > 0: all (fall back to every candidate) or error "
        "(raise)")})

    def __post_init__(self) -> None:
        check_choice(self, "kind", Literal["similarity"])
        check_bools(self, "sample", "positive_only")
        check_float(self, "temperature", low=0.0, low_open=True)
        check_choice(self, "if_no_positive", IfNoPositive)


@dataclasses.dataclass(frozen=True)
class RewardedCandidates(Candidates):
    """A candidate set that also carries each candidate's stored reward (``rewards_C``)."""

    rewards_C: np.ndarray


def with_rewards(candidates: Candidates, rewards_C: Any) -> RewardedCandidates:
    """``candidates`` with their rewards attached (aligned with ``candidates.ids``)."""
    rewards = np.asarray(rewards_C, dtype=np.float64)
    if rewards.shape != (len(candidates),):
        raise DimensionError(f"rewards have shape {rewards.shape}, expected ({len(candidates)},) "
                             "(one per candidate)")
    return RewardedCandidates(ids=list(candidates.ids), positions_C=candidates.positions_C,
                              scores_C=candidates.scores_C, embeddings_CD=candidates.embeddings_CD,
                              rewards_C=rewards)


def bank_rewards(bank: Any) -> RewardFn:
    """A ``reward_of`` callable reading stored rewards from a case bank (``bank.rewards(ids)``)."""

    def reward_of(ids: Sequence[str]) -> np.ndarray:
        return bank.rewards(ids)

    return reward_of


def cosine_scores(state_D: np.ndarray, cases_CD: np.ndarray) -> np.ndarray:
    """Cosine similarity ``cos(state, case_c)`` for each row; a zero case vector scores 0."""
    state = np.asarray(state_D, dtype=np.float64)
    cases = np.asarray(cases_CD, dtype=np.float64)
    norm = float(np.linalg.norm(state))
    if norm == 0.0:
        raise DataFormatError("state vector is all zeros: cosine similarity is undefined")
    case_norms_C = np.linalg.norm(cases, axis=1)
    return (cases @ state) / (np.maximum(case_norms_C, np.finfo(np.float64).tiny) * norm)


class SimilarityPolicy(StaticPolicy):
    """Cosine top-K (optionally softmax sampling, optionally successful cases only)."""

    def __init__(self, config: SimilarityConfig | None = None, *, reward_of: RewardFn | None = None):
        self.config = config if config is not None else SimilarityConfig()
        if reward_of is not None and not callable(reward_of):
            raise DataFormatError(f"reward_of must be callable (ids -> rewards), got {type(reward_of).__name__}")
        self.reward_of = reward_of

    def _rewards(self, candidates: Candidates) -> np.ndarray:
        rewards = getattr(candidates, "rewards_C", None)
        source = "candidates.rewards_C"
        if rewards is None:
            if self.reward_of is None:
                raise DataFormatError("SimilarityConfig.positive_only=True needs rewards: pass candidates with a "
                                      "rewards_C attribute (memento.policies.similarity.with_rewards) or build the "
                                      "policy "
                                      "with reward_of=... (e.g. memento.policies.similarity.bank_rewards(bank))")
            rewards = self.reward_of(list(candidates.ids))
            source = "reward_of(ids)"
        rewards = np.asarray(rewards, dtype=np.float64)
        if rewards.shape != (len(candidates),):
            raise DimensionError(f"{source} has shape {rewards.shape}, expected ({len(candidates)},)")
        if not np.isfinite(rewards).all():
            raise DataFormatError(f"{source} contains NaN or inf")
        return rewards

    def _allowed(self, candidates: Candidates) -> np.ndarray:
        allowed_C = np.ones(len(candidates), dtype=bool)
        if not self.config.positive_only:
            return allowed_C
        allowed_C = self._rewards(candidates) > 0
        if not allowed_C.any():
            if self.config.if_no_positive == "error":
                raise DataFormatError(f"positive_only: none of the {len(candidates)} candidate(s) has reward > 0")
            logger.debug("positive_only: no candidate has reward > 0; falling back to all %d", len(candidates))
            allowed_C[:] = True
        return allowed_C

    def _logits(self, state_D: np.ndarray, candidates: Candidates) -> np.ndarray:
        state = check_candidates(state_D, candidates)
        cos_C = cosine_scores(state, candidates.embeddings_CD)
        return np.where(self._allowed(candidates), cos_C / self.config.temperature, -np.inf)

    def probs(self, state_D: np.ndarray, candidates: Candidates) -> np.ndarray:
        """``softmax(cos / temperature)`` over the allowed candidates (0 for excluded ones)."""
        return softmax(self._logits(state_D, candidates))

    def select(self, state_D: np.ndarray, candidates: Candidates, k: int, *, rng: np.random.Generator,
               greedy: bool = False) -> Selection:
        logits_C = self._logits(state_D, candidates)
        probs_C = softmax(logits_C)
        k = check_k(k, int(np.isfinite(logits_C).sum()))
        deterministic = greedy or not self.config.sample
        order_K = top_k(logits_C, k) if deterministic else gumbel_top_k(logits_C, k, rng)
        return make_selection(candidates, probs_C, order_K, greedy=deterministic, logits_C=logits_C)

    def __repr__(self) -> str:
        return f"SimilarityPolicy({self.config!r})"


def build(config: SimilarityConfig, context: PolicyContext) -> SimilarityPolicy:
    """The factory entry: a :class:`SimilarityPolicy` (``context.reward_of`` gives the stored rewards
    ``positive_only`` needs)."""
    return SimilarityPolicy(config, reward_of=context.reward_of)


SPEC = PolicySpec(kind="similarity", config=SimilarityConfig, build=build,
                  loop_default=lambda gamma: SimilarityConfig(positive_only=True),
                  regret_default=lambda: SimilarityConfig(positive_only=False))
"""Run defaults: the online runs (QA and game loops) choose among the successful cases only, as Memento's
non-parametric client retrieves them; the regret run takes the deterministic cosine top-k over all candidates."""
