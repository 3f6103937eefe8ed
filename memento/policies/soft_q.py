"""The soft-Q policy: parametric case-based reasoning (README, "Concepts"), the whole policy in one module.

``mu(c | s) = softmax(Q(s, c) / alpha)`` over the candidate set. The module holds

- :class:`SoftQConfig`, the policy's config (a Q-network, its learner, its replay buffer, and the online labels,
  per-case evidence and set choice of :mod:`memento.learn`);
- :class:`SoftQAgent`, the learning soft-Q policy: it owns a Q-network, its
  :class:`~memento.learn.learner.SoftQLearner` (optimiser, target network, alpha schedule) and a
  :class:`~memento.learn.replay.ReplayBuffer`, and learns in ``observe`` (the online runs' soft-Q, and the served
  :class:`~memento.selector.runtime.Selector`'s);
- :class:`SoftQPolicy`, the same rule over a given, fixed network (it does not learn);
- :func:`build`, the factory entry (:func:`memento.policies.make_policy` builds a :class:`SoftQAgent` with it), and
  the run defaults (:func:`loop_default`, :func:`regret_default`), declared in :data:`SPEC`.

**Choosing.** ``select`` optionally keeps only the candidates with stored reward > 0 (``positive_only``; all of
them when none is), then draws ``k`` of them from ``softmax(Q(s, c) / alpha)`` by Gumbel-top-k and records the exact
Plackett-Luce propensity (computed in log space, so it stays exact when ``alpha`` is tiny); ``greedy=True`` returns
the top-K by Q (ties go to the earlier candidate) with ``set_prob = 1.0``, for evaluation. ``Q`` is any
``torch.nn.Module`` with ``forward(state_BD, cases_BCD) -> q_BC`` (the interface of ``memento.learn.qnet``).

**Learning** (:class:`SoftQAgent` only): ``observe(round)`` puts each decision into the replay buffer and, after
``warmup``, takes ``updates_per_step`` gradient steps per decision (see :class:`SoftQAgent`). With online labels
(``SoftQConfig.labels``, :class:`~memento.config.OnlineLabelsConfig`) an observation's ``labels`` (the planner's score
of each of its top-``m`` candidates alone) go to a :class:`~memento.learn.listwise.LabelBuffer`, and each gradient
step also draws ``labels.batch_size`` labelled tasks from it and adds ``labels.weight`` times the listwise loss
(:meth:`SoftQLearner.update`). The label buffer is part of :meth:`SoftQAgent.checkpoint` (``labels/``), so a resumed
run continues exactly. The agent's ``alpha`` follows the learner (fixed, scheduled or tuned) unless ``fixed_alpha``
pins it (a served selector whose config names one).

:class:`SoftQPolicy`'s ``alpha`` is a plain attribute (validated on assignment) that a learner may anneal or tune.
Q is evaluated under ``torch.inference_mode`` on the Q-network's device (that of its first parameter or buffer, read
at every call so a moved network is followed; CPU for a parameterless one) unless ``device`` pins one. While
scoring, the network is put in ``eval()`` mode and its previous mode is restored afterwards.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from memento.bank import Candidates
from memento.config import (
    FIXED_SETS,
    MAX_REPLAY_CAPACITY,
    MAX_STEPS,
    MAX_UPDATES_PER_STEP,
    NO_EVIDENCE,
    EvidenceConfig,
    LearnerConfig,
    OnlineLabelsConfig,
    QNetConfig,
    ReplayConfig,
    SetChoiceConfig,
    check,
    check_bools,
    check_choice,
    check_float,
    check_ints,
)
from memento.errors import ConfigError, DimensionError
from memento.learn.evidence import (
    add_reward,
    draw_set,
    evidence_term,
    leaning,
    ranked_prefixes,
    relative_evidence,
    reward_size,
    set_context,
    set_size,
    update_set_values,
)
from memento.learn.learner import SoftQLearner
from memento.learn.listwise import LabelBuffer
from memento.learn.persist import LABELS_DIR, LEARNER_DIR, REPLAY_DIR, load_trained_learner, save_state
from memento.learn.policy import (
    EvidenceFn,
    Observation,
    PolicyContext,
    RewardFn,
    StaticPolicy,
    boltzmann_select,
    check_k,
    positive_pool,
    q_values,
    softmax,
)
from memento.learn.qnet import build_qnet
from memento.learn.replay import ReplayBuffer, Transition
from memento.policies.spec import PolicySpec
from memento.types import Selection

__all__ = ["SPEC", "SoftQAgent", "SoftQConfig", "SoftQPolicy", "anchored", "build", "loop_default", "regret_default"]

_TINY = np.finfo(np.float32).tiny


def _online_learner() -> LearnerConfig:
    return LearnerConfig(gamma=0.0, lr=3e-3, weight_decay=0.0, batch_size=64, alpha=0.2)


def _online_qnet() -> QNetConfig:
    return QNetConfig(hidden=128, dropout=0.0, embed_dim=64)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SoftQConfig:
    """The soft-Q agent (:class:`memento.policies.soft_q.SoftQAgent`): a Q-network, its learner and its replay buffer.

    - ``qnet``: the Q-network (``dim`` comes from the encoder; the init seed from the run's seed);
    - ``learner``: the soft-Q learner (``learner.batch_size`` is the replay mini-batch); single-step runs
      need ``gamma = 0``;
    - ``alpha``: when given, the temperature of ``softmax(Q / alpha)``, overriding ``learner.alpha`` (the
      stored ``learner`` then carries it);
    - ``replay_capacity``: decisions the buffer keeps; ``warmup``: decisions logged before the first
      update; ``updates_per_step``: gradient steps per decision after warm-up;
    - ``positive_only``: choose among the candidates with stored reward > 0 only (all of them when none
      is), the pool Memento's non-parametric retrieval uses;
    - ``init_qnet``: a trained selector directory (what ``SoftQLearner.save`` writes, e.g. ``memento
      train``'s ``OUT/selector``, or that run directory itself) whose Q-network, architecture included, the
      run starts from instead of a fresh one (the optimiser starts fresh with ``learner``; ``qnet`` is then
      unused);
    - ``labels``: per-candidate planner labels online and the listwise loss on them
      (:class:`OnlineLabelsConfig`; default off);
    - ``evidence``: per-case evidence from those labels added to Q (:class:`EvidenceConfig`; default off,
      :data:`NO_EVIDENCE`); ``sets``: which set is shown (:class:`SetChoiceConfig`; default K cases as Memento draws
      them, :data:`FIXED_SETS`). The QA loop's default soft-Q (:func:`memento.runs.qa.qa_policy`) turns all three
      on.
    """

    kind: Literal["soft_q"] = dataclasses.field(default="soft_q", metadata={"help": (
        "the policy: softmax(Q(s, c) / alpha) over a Q-network that learns online (parametric case-based "
        "reasoning)")})
    qnet: QNetConfig = dataclasses.field(default_factory=_online_qnet, metadata={"help": (
        "the Q-network (dim comes from the encoder; the init seed from the run's seed)")})
    learner: LearnerConfig = dataclasses.field(default_factory=_online_learner, metadata={"help": (
        "the soft-Q learner (learner.batch_size is the replay mini-batch; single-step runs need gamma = 0)")})
    alpha: float | None = dataclasses.field(default=None, metadata={"help": "soft-Q temperature"})
    replay_capacity: int = dataclasses.field(default=10_000, metadata={"help": "decisions the replay buffer keeps"})
    warmup: int = dataclasses.field(default=16, metadata={"help": "decisions before the first soft-Q update"})
    updates_per_step: int = dataclasses.field(default=1, metadata={"help": (
        "soft-Q gradient steps per decision after warm-up (0: the Q-network is "
        "not updated online, e.g. a pre-trained selector used as it is)")})
    positive_only: bool = dataclasses.field(default=False, metadata={"help": (
        "choose only among the candidates with stored reward > 0 (the pool of similarity's positive-only "
        "retrieval; all when none is)")})
    init_qnet: str | None = dataclasses.field(default=None, metadata={"help": (
        "soft_q starts from this trained Q-network (a `memento train` run directory or its selector/ "
        "subdirectory) instead of a fresh one")})
    labels: OnlineLabelsConfig = dataclasses.field(default_factory=OnlineLabelsConfig, metadata={"help": (
        "per-candidate planner labels online and the listwise loss on them (default: off)")})
    evidence: EvidenceConfig = dataclasses.field(default_factory=lambda: NO_EVIDENCE, metadata={"help": (
        "per-case evidence from those labels added to Q (default: off)")})
    sets: SetChoiceConfig = dataclasses.field(default_factory=lambda: FIXED_SETS, metadata={"help": (
        "which set of cases a decision shows (default: K cases as Memento draws them)")})

    def __post_init__(self) -> None:
        cls = type(self)
        check_choice(self, "kind", Literal["soft_q"])
        check(isinstance(self.evidence, EvidenceConfig), cls, "evidence", self.evidence, "must be an EvidenceConfig")
        check(isinstance(self.sets, SetChoiceConfig), cls, "sets", self.sets, "must be a SetChoiceConfig")
        check(isinstance(self.qnet, QNetConfig), cls, "qnet", self.qnet, "must be a QNetConfig")
        check(isinstance(self.learner, LearnerConfig), cls, "learner", self.learner, "must be a LearnerConfig")
        if self.alpha is not None:
            check_float(self, "alpha", low=0.0, low_open=True)
            if self.learner.alpha != self.alpha:
                object.__setattr__(self, "learner", dataclasses.replace(self.learner, alpha=self.alpha))
        check_ints(self, replay_capacity=(1, MAX_REPLAY_CAPACITY), warmup=(0, MAX_STEPS),
                   updates_per_step=(0, MAX_UPDATES_PER_STEP))
        check_bools(self, "positive_only")
        check(self.init_qnet is None or (isinstance(self.init_qnet, str) and bool(self.init_qnet.strip())), cls,
              "init_qnet", self.init_qnet, "must be a selector directory path or null")
        check(isinstance(self.labels, OnlineLabelsConfig), cls, "labels", self.labels, "must be an OnlineLabelsConfig")


class SoftQAgent:
    """The learning soft-Q policy (see the module docstring). Build it with :meth:`create`.

    :meth:`observe` takes each decision into the replay buffer as a :class:`~memento.learn.replay.Transition`
    (state, the chosen cases' vectors in draw order, reward, each case's first-draw propensity, clipped to the
    smallest float32 above 0); a decision of more than ``k_max`` cases takes several rows; with per-case credit
    (``Observation.case_rewards_K``) each chosen case is its own row with its own target. Then, with ``learn`` and
    once ``warmup`` decisions are logged (at least one), ``updates_per_step`` gradient steps per decision of the
    round, each on a uniform mini-batch of ``learner.batch_size`` rows (the target-network update is inside the
    learner). So B decisions made with the same parameters are all recorded before the round's ``B *
    updates_per_step`` steps, and the number of steps per decision does not depend on B.
    """

    kind = "soft_q"

    def __init__(self, config: SoftQConfig, *, learner: SoftQLearner, buffer: ReplayBuffer,
                 reward_of: RewardFn | None = None, fixed_alpha: float | None = None, featurizer: Any | None = None,
                 evidence_of: EvidenceFn | None = None):
        if not isinstance(config, SoftQConfig):
            raise ConfigError(f"SoftQAgent: config={type(config).__name__}: must be a SoftQConfig")
        if config.positive_only and reward_of is None:
            raise ConfigError("SoftQConfig.positive_only=True needs the bank's rewards (PolicyContext.reward_of)")
        if learner.qnet.config.features != "none" and featurizer is None:
            raise ConfigError(f"SoftQAgent: the Q-network sees case features (features="
                              f"{learner.qnet.config.features!r}); the run must give a featurizer "
                              "(PolicyContext.featurizer)")
        if buffer.config.case_width != learner.qnet.config.case_dim:
            raise DimensionError(f"SoftQAgent: the replay buffer stores cases of {buffer.config.case_width} numbers, "
                                 f"the Q-network takes {learner.qnet.config.case_dim}")
        self.config = config
        self.learner = learner
        self.buffer = buffer
        self.reward_of = reward_of
        self.fixed_alpha = fixed_alpha
        self.featurizer = featurizer
        self.evidence_of = evidence_of if config.evidence.active else None
        labels = config.labels
        self.label_buffer = LabelBuffer(capacity=labels.capacity, dim=buffer.config.dim, m=labels.m,
                                        case_width=buffer.config.case_width, device=learner.device) \
            if labels.active else None

    @classmethod
    def create(cls, config: SoftQConfig, context: PolicyContext, *, fixed_alpha: float | None = None) -> SoftQAgent:
        """A fresh agent (or one whose Q-network comes from ``config.init_qnet``) on ``context.device``."""
        device = torch.device(context.device)
        if config.init_qnet is not None:
            qnet = load_trained_learner(config.init_qnet, context.dim).qnet
        else:
            qnet = build_qnet(config.qnet.for_dim(context.dim, seed=context.qnet_seed),
                              torch.Generator().manual_seed(context.qnet_seed))
        learner = SoftQLearner(qnet, dataclasses.replace(config.learner, seed=context.learner_seed), device=device,
                               generator=torch.Generator(device=device).manual_seed(context.learner_seed))
        case_dim = qnet.config.case_dim
        multi_step = config.learner.gamma > 0  # soft TD: the buffer keeps each decision's next state and candidates
        buffer = ReplayBuffer(ReplayConfig(capacity=config.replay_capacity, dim=context.dim, k_max=context.k_max,
                                           case_dim=None if case_dim == context.dim else case_dim,
                                           **({"store_next": True, "c_max": context.c_max} if multi_step else {})),
                              device=device)
        return cls(config, learner=learner, buffer=buffer, reward_of=context.reward_of, fixed_alpha=fixed_alpha,
                   featurizer=context.featurizer if qnet.config.features != "none" else None,
                   evidence_of=context.evidence_of)

    # ------------------------------------------------------------------ the Policy protocol

    @property
    def qnet(self) -> torch.nn.Module:
        return self.learner.qnet

    @property
    def version(self) -> int:
        return int(self.learner.updates)

    @property
    def alpha(self) -> float:
        return self.fixed_alpha if self.fixed_alpha is not None else self.learner.alpha

    @property
    def reward_range(self) -> tuple[float, float]:
        return (0.0, 1.0)  # Q(s, c) estimates P(success): binary cross-entropy needs rewards in [0, 1]

    def _pool(self, candidates: Candidates) -> Candidates:
        return positive_pool(candidates, self.reward_of) if self.config.positive_only else candidates

    def case_vectors(self, candidates: Candidates) -> np.ndarray:
        """What the Q-network sees of each candidate: its embedding, or its case vector with case features."""
        if self.featurizer is None:
            return np.asarray(candidates.embeddings_CD)
        return self.featurizer.case_vectors(candidates)

    def q_values(self, state_D: np.ndarray, candidates: Candidates, *,
                 evidence_C: np.ndarray | None = None) -> np.ndarray:
        """``Q(s, c)`` for every candidate (float64 ``q_C``): the Q-network's score plus, with per-case evidence
        (``SoftQConfig.evidence``), ``weight`` times each case's evidence relative to its look-alikes among the
        candidates (:meth:`evidence`, or ``evidence_C`` when the caller has it, :mod:`memento.learn.evidence`)."""
        cases_CE = None if self.featurizer is None else self.case_vectors(candidates)
        q_C = q_values(self.learner.qnet, state_D, candidates, cases_CE=cases_CE)
        if self.evidence_of is not None and len(candidates):
            e_C = self.evidence(candidates) if evidence_C is None else evidence_C
            q_C = q_C + self.config.evidence.weight * e_C
        return q_C

    def evidence(self, candidates: Candidates) -> np.ndarray:
        """Each candidate's shrunk per-case evidence ``e(c)`` relative to its look-alikes among ``candidates``
        (:func:`memento.learn.evidence.relative_evidence`: it reorders look-alikes and moves nothing else; zeros
        without an evidence source)."""
        if self.evidence_of is None or not len(candidates):
            return np.zeros(len(candidates))
        cfg = self.config.evidence
        _, weight_C, value_C = self.evidence_of(np.asarray(candidates.positions_C, dtype=np.int64))
        return relative_evidence(evidence_term(weight_C, value_C, cfg.prior), candidates.embeddings_CD, cfg.bandwidth)

    @property
    def set_values(self) -> dict[str, list[float]]:
        """What the agent learned about set sizes, per context (:func:`memento.learn.evidence.set_context`):
        ``"<context>/reward"`` and ``"<context>/count"`` (the summed reward and count of the shown sets of size ``n``
        at ``[n - 1]``, ``sets.sizes="reward"``) or ``"<context>"`` (the value ``V(n)`` at ``[n - 1]``,
        ``sets.sizes="labels"``); a context not seen yet is absent."""
        return {context: list(values) for context, values in self.learner.set_values.items()}

    def _context(self, candidates: Candidates, row: int, evidence_C: np.ndarray | None = None) -> str:
        """The set-size context of candidate ``row`` as the top case: what its per-case evidence says."""
        return set_context(float((self.evidence(candidates) if evidence_C is None else evidence_C)[row]))

    def set_size(self, k: int, candidates: Candidates | None = None, top: int = 0, *,
                 rng: np.random.Generator | None = None, greedy: bool = True,
                 evidence_C: np.ndarray | None = None) -> tuple[int, float]:
        """How many of at most ``k`` cases a decision shows and the probability of that choice: ``k`` with fixed
        sizes, else chosen in the context of its top case (``candidates`` row ``top``) by ``SoftQConfig.sets``."""
        cfg = self.config.sets
        if cfg.sizes == "fixed" or candidates is None or not len(candidates) or k <= 1:
            return k, 1.0
        context = self._context(candidates, top, evidence_C)
        values = self.learner.set_values
        if cfg.sizes == "labels":
            return set_size(values.get(context), k), 1.0
        return reward_size(values.get(f"{context}/reward"), values.get(f"{context}/count"), cfg.arm_sizes(k),
                           leaning(context, k), explore=cfg.explore, prior=cfg.prior, prior_mean=cfg.prior_mean,
                           bonus=cfg.bonus,
                           rng=rng if rng is not None else np.random.default_rng(0), greedy=greedy or rng is None)

    def label_sets(self, selection: Selection, candidates: Candidates, k: int) -> list[list[int]]:
        """The sets a labelled step scores (set-level labels, :class:`~memento.config.SetChoiceConfig`): the prefixes
        of the scored sizes of the policy's ranking (its probabilities over the pool it chose from, look-alikes of a
        case ranked higher skipped), as rows into ``candidates``; none with fixed sizes."""
        sizes = self.config.sets.scored_sizes(k)
        if not sizes:
            return []
        rows_P = candidates.rows_of(list(selection.candidate_ids))
        order_P = np.argsort(-np.asarray(selection.probs_C, dtype=np.float64), kind="stable")
        emb_PD = np.asarray(candidates.embeddings_CD)[rows_P]
        prefixes = ranked_prefixes(order_P, emb_PD, self.config.sets.redundancy, sizes,
                                   self.evidence(candidates.take(rows_P)))
        return [[int(rows_P[i]) for i in prefix] for prefix in prefixes]

    def probs(self, state_D: np.ndarray, candidates: Candidates) -> np.ndarray:
        """``softmax(Q / alpha)`` over the candidates (before any positive-only restriction)."""
        return softmax(self.q_values(state_D, candidates), self.alpha)

    def select(self, state_D: np.ndarray, candidates: Candidates, k: int, *, rng: np.random.Generator,
               greedy: bool = False) -> Selection:
        return self.select_scored(state_D, candidates, k, rng=rng, greedy=greedy)[0]

    def select_scored(self, state_D: np.ndarray, candidates: Candidates, k: int, *, rng: np.random.Generator,
                      greedy: bool = False) -> tuple[Selection, np.ndarray]:
        """:meth:`select`, and ``Q(s, c)`` of each chosen case in draw order (``q_K``): the values of the one
        forward pass that made the choice (a served selector reports them as the cases' scores)."""
        pool = self._pool(candidates)
        e_C = self.evidence(pool)  # once: Q, the size's context and the look-alike rule all read it
        q_C = self.q_values(state_D, pool, evidence_C=e_C)
        n, p_n = self.set_size(k, pool, int(np.argmax(q_C)), rng=rng, greedy=greedy, evidence_C=e_C) \
            if len(pool) else (k, 1.0)
        redundancy = self.config.sets.redundancy
        if redundancy > 1.0 and n == k:  # today's draw: Gumbel-top-k over the whole pool
            selection = boltzmann_select(q_C, pool, k, self.alpha, rng=rng, greedy=greedy)
        else:
            selection = draw_set(q_C, pool.embeddings_CD, pool.ids, check_k(n, len(pool)), self.alpha,
                                 redundancy=redundancy, rng=rng, greedy=greedy, evidence_C=e_C)
        if p_n < 1.0:  # the size was drawn too: the set's probability is the size's times the draws'
            selection = dataclasses.replace(selection, set_prob=float(selection.set_prob * p_n))
        return selection, np.asarray(q_C, dtype=np.float64)[np.asarray(selection.positions_K, dtype=np.int64)]

    def observe(self, observations: Sequence[Observation], *, learn: bool = True) -> dict[str, float]:
        k_max = self.buffer.config.k_max
        for obs in observations:
            self._add_set_reward(obs)
            chosen = obs.candidates.take(obs.chosen_rows())  # the chosen cases, in draw order
            cases_KD = self.case_vectors(chosen)
            pos_K = np.asarray(chosen.positions_C, dtype=np.int64)  # their identities (forgetting masks by them)
            probs_K = np.maximum(np.asarray(obs.selection.probs_K, dtype=np.float64), _TINY)
            nxt = self._next(obs)
            if obs.case_rewards_K is not None:  # per-case credit: one row per case, each with its own target
                for k, reward in enumerate(obs.case_rewards()):
                    self.buffer.add(Transition(state_D=obs.state_D, cases_KD=cases_KD[k:k + 1], reward=float(reward),
                                               propensity_K=probs_K[k:k + 1], step=obs.step,
                                               policy_version=obs.policy_version, case_pos_K=pos_K[k:k + 1], **nxt))
                continue
            for start in range(0, len(cases_KD), k_max):
                self.buffer.add(Transition(state_D=obs.state_D, cases_KD=cases_KD[start:start + k_max],
                                           reward=obs.reward, propensity_K=probs_K[start:start + k_max],
                                           step=obs.step, policy_version=obs.policy_version,
                                           case_pos_K=pos_K[start:start + k_max], **nxt))
            self._add_labels(obs)
        losses: list[float] = []
        listwise: list[float] = []
        if learn and observations and self.buffer.added >= max(1, self.config.warmup):
            cfg = self.config.labels
            for _ in range(self.config.updates_per_step * len(observations)):
                batch = self.buffer.sample(self.learner.config.batch_size, self.learner.generator)
                labels = self.label_buffer.sample(cfg.batch_size, self.learner.generator) \
                    if self.label_buffer is not None and len(self.label_buffer) else None
                metrics = self.learner.update(batch, labels=labels, label_weight=cfg.weight, label_tau=cfg.tau)
                losses.append(metrics["loss"])
                if "listwise" in metrics:
                    listwise.append(metrics["listwise"])
        out = {"loss": float(np.mean(losses)), "updates": float(len(losses))} if losses else {}
        return {**out, "listwise": float(np.mean(listwise))} if listwise else out

    def _add_set_reward(self, obs: Observation) -> None:
        """With ``sets.sizes="reward"``: the shown set's size and reward into its context's statistics (the context
        of the pool's top case, as when it was chosen: evidence changes only after the round's observe)."""
        n = len(obs.selection.ids)
        if self.config.sets.sizes != "reward" or n == 0 or not len(obs.selection.candidate_ids):
            return
        top = obs.selection.candidate_ids[int(np.argmax(np.asarray(obs.selection.probs_C)))]
        context = self._context(obs.candidates, int(obs.candidates.rows_of([top])[0]))
        values = self.learner.set_values
        values[f"{context}/reward"], values[f"{context}/count"] = add_reward(
            values.get(f"{context}/reward", []), values.get(f"{context}/count", []), n, obs.reward)

    def _add_labels(self, obs: Observation) -> None:
        """An observation's planner labels into the label buffer (the best ``m`` when it carries more), and its
        set-level labels into the set values (``SoftQConfig.sets``)."""
        if obs.labels is not None and len(obs.labels.sets) >= 2 and self.config.sets.sizes == "labels":
            cfg = self.config.sets
            context = self._context(obs.candidates, obs.labels.sets[0][0])  # the ranking's top case
            self.learner.set_values[context] = update_set_values(
                self.learner.set_values.get(context, []), [len(rows) for rows in obs.labels.sets],
                obs.labels.set_score_S, tau=cfg.tau, lr=cfg.lr)
        if self.label_buffer is None or obs.labels is None or len(obs.labels.rows_M) < 2:
            return
        rows_M = np.asarray(obs.labels.rows_M, dtype=np.int64)[:self.label_buffer.m]
        score_M = np.asarray(obs.labels.score_M, dtype=np.float64)[:self.label_buffer.m]
        self.label_buffer.add(obs.state_D, self.case_vectors(obs.candidates.take(rows_M)), score_M)

    def _next(self, obs: Observation) -> dict[str, Any]:
        """The Transition fields of a multi-step decision (a buffer with ``store_next``, built for ``gamma > 0``):
        ``done`` and the next state with the vectors of the candidates the policy would choose from there (after
        ``positive_only``); an episode's last decision, or one without a next state, stores an empty set."""
        if not self.buffer.config.store_next:
            return {"done": bool(obs.done)}
        width = self.buffer.config.case_width
        empty_0E = np.zeros((0, width), dtype=np.float32)
        if obs.done or obs.next_state_D is None or obs.next_candidates is None or not len(obs.next_candidates):
            next_D = obs.state_D if obs.next_state_D is None else obs.next_state_D
            return {"done": bool(obs.done), "next_state_D": next_D, "next_cands_CD": empty_0E,
                    "next_pos_C": np.zeros(0, dtype=np.int64)}
        pool = self._pool(obs.next_candidates)
        return {"done": False, "next_state_D": obs.next_state_D, "next_cands_CD": self.case_vectors(pool),
                "next_pos_C": np.asarray(pool.positions_C, dtype=np.int64)}

    def checkpoint(self, directory: Path) -> None:
        save_state(directory, self.learner, self.buffer)
        if self.label_buffer is not None:
            self.label_buffer.save(Path(directory) / LABELS_DIR)

    def restore(self, directory: Path) -> None:
        device = self.learner.device
        self.learner = SoftQLearner.load(Path(directory) / LEARNER_DIR, device=device)
        self.buffer = ReplayBuffer.load(Path(directory) / REPLAY_DIR, device=device)
        if self.label_buffer is not None:
            self.label_buffer.load(Path(directory) / LABELS_DIR)

    def save_model(self, directory: Path) -> bool:
        self.learner.save(Path(directory))
        return True

    def __repr__(self) -> str:
        return (f"SoftQAgent(arch={self.learner.qnet.config.arch}, alpha={self.alpha!r}, updates={self.version}, "
                f"replay={len(self.buffer)})")


class SoftQPolicy(StaticPolicy):
    """Boltzmann policy over a given Q-network's scores (see the module docstring); it does not learn."""

    def __init__(self, qnet: torch.nn.Module, *, alpha: float = 1.0, device: str | torch.device | None = None):
        if not isinstance(qnet, torch.nn.Module):
            raise ConfigError(f"SoftQPolicy.qnet={type(qnet).__name__}: must be a torch.nn.Module "
                              "with forward(state_BD, cases_BCD) -> q_BC")
        self.qnet = qnet
        self._alpha: float = 1.0
        self.alpha = alpha
        self.device = None if device is None else torch.device(device)

    @property
    def alpha(self) -> float:
        """The temperature of ``softmax(Q / alpha)``: -> 0 is greedy, large is uniform."""
        return self._alpha

    @alpha.setter
    def alpha(self, value: float) -> None:
        if (isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real)
                or not math.isfinite(value) or value <= 0):
            raise ConfigError(f"SoftQPolicy.alpha={value!r}: must be a finite number > 0")
        self._alpha = float(value)

    def q_values(self, state_D: np.ndarray, candidates: Candidates) -> np.ndarray:
        """``Q(s, c)`` for every candidate, as float64 ``q_C``."""
        return q_values(self.qnet, state_D, candidates, self.device)

    def probs(self, state_D: np.ndarray, candidates: Candidates) -> np.ndarray:
        """``softmax(Q(s, c) / alpha)`` over the candidates."""
        return softmax(self.q_values(state_D, candidates), self.alpha)

    def select(self, state_D: np.ndarray, candidates: Candidates, k: int, *, rng: np.random.Generator,
               greedy: bool = False) -> Selection:
        return boltzmann_select(self.q_values(state_D, candidates), candidates, k, self.alpha, rng=rng,
                                greedy=greedy)

    def __repr__(self) -> str:
        return f"SoftQPolicy(qnet={type(self.qnet).__name__}, alpha={self.alpha!r}, device={self.device})"


def build(config: SoftQConfig, context: PolicyContext) -> SoftQAgent:
    """The factory entry: a :class:`SoftQAgent` (Q-network, learner and replay buffer on ``context.device``, seeded
    with ``context.qnet_seed`` / ``context.learner_seed``)."""
    return SoftQAgent.create(config, context)


def anchored(soft_q: SoftQConfig, **qnet: Any) -> SoftQConfig:
    """``soft_q`` with its Q-network anchored on cosine similarity and seeing the case features (``anchor="cosine"``,
    ``features="case"``), with ``qnet``'s further changes."""
    return dataclasses.replace(soft_q, qnet=dataclasses.replace(soft_q.qnet, anchor="cosine", features="case", **qnet))


def loop_default(gamma: float = 0.0) -> SoftQConfig:
    """The online runs' default soft-Q (the QA loop's before :func:`memento.runs.qa.qa_policy` adds its labels,
    evidence and set choice; the game loop's with its ``gamma``): among the successful cases only, with a Q-network
    anchored on cosine similarity that sees the case features (:func:`anchored`), the configuration measured best on
    ``facts-real`` (docs/benchmarks.md; :class:`SoftQConfig`'s own defaults stay the plain Memento Q-network, which
    needs no bank to build); its ``learner.gamma`` set to ``gamma`` (0: cross-entropy on each step's own reward;
    > 0: soft TD with the target network, for the game loop)."""
    base = anchored(SoftQConfig(positive_only=True))
    return dataclasses.replace(base, learner=dataclasses.replace(base.learner, gamma=float(gamma)))


def regret_default() -> SoftQConfig:
    """The regret run's soft-Q: among all candidates, 50 warm-up decisions, a 100k replay buffer, alpha 0.2 decaying
    to 0.05 over 1000 updates when scheduled."""
    base = SoftQConfig(learner=LearnerConfig(gamma=0.0, lr=3e-3, weight_decay=0.0, batch_size=64, alpha=0.2,
                                             alpha_final=0.05, alpha_decay_steps=1000),
                       warmup=50, replay_capacity=100_000)
    return dataclasses.replace(base, learner=dataclasses.replace(base.learner, gamma=0.0))


SPEC = PolicySpec(kind="soft_q", config=SoftQConfig, build=build, loop_default=loop_default,
                  regret_default=regret_default)
