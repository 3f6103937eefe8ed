"""The soft-Q agent: Memento's parametric case-based reasoning as one object that chooses and learns.

:class:`SoftQAgent` owns a Q-network, its :class:`~memento.learn.learner.SoftQLearner` (optimiser, target
network, alpha schedule) and a :class:`~memento.learn.replay.ReplayBuffer`, and implements the
:class:`~memento.learn.policy.Policy` protocol:

- ``select``: optionally keep only the candidates with stored reward > 0 (``positive_only``; all of
  them when none is), then draw ``k`` of them from ``softmax(Q(s, c) / alpha)`` (Gumbel-top-k with the
  exact Plackett-Luce propensity; ``greedy`` takes the top ``k`` by Q);
- ``observe(round)``: each decision enters the replay buffer as a
  :class:`~memento.learn.replay.Transition` (state, the chosen cases' vectors in draw order, reward, each
  case's first-draw propensity, clipped to the smallest float32 above 0); a decision of more than
  ``k_max`` cases takes several rows; with per-case credit (``Observation.case_rewards_K``) each chosen case
  is its own row with its own target. Then, with ``learn`` and once ``warmup`` decisions are logged
  (at least one), ``updates_per_step`` gradient steps per decision of the round, each on a uniform
  mini-batch of ``learner.batch_size`` rows (the target-network update is inside the learner). So B
  decisions made with the same parameters are all recorded before the round's ``B *
  updates_per_step`` steps, and the number of steps per decision does not depend on B.

With online labels (``SoftQConfig.labels``, :class:`~memento.config.OnlineLabelsConfig`) an observation's
``labels`` (the planner's score of each of its top-``m`` candidates alone) go to a
:class:`~memento.learn.listwise.LabelBuffer`, and each gradient step also draws ``labels.batch_size`` labelled tasks
from it and adds ``labels.weight`` times the listwise loss (:meth:`SoftQLearner.update`). The label buffer is part
of :meth:`checkpoint` (``labels/``), so a resumed run continues exactly.

``alpha`` follows the learner (fixed, scheduled or tuned) unless ``fixed_alpha`` pins it (a served
selector whose config names one). The agent lives in the core because the served
:class:`~memento.selector.runtime.Selector` is one; ``memento.policies.soft_q`` re-exports it and
``memento.policies.make_policy`` builds it from a :class:`~memento.config.SoftQConfig`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from memento.bank import Candidates
from memento.config import ReplayConfig, SoftQConfig
from memento.errors import CheckpointError, ConfigError, DimensionError
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
from memento.learn.policy import (
    EvidenceFn,
    Observation,
    PolicyContext,
    RewardFn,
    boltzmann_select,
    check_k,
    positive_pool,
    q_values,
    softmax,
)
from memento.learn.qnet import build_qnet
from memento.learn.replay import ReplayBuffer, Transition
from memento.types import Selection

__all__ = ["LEARNER_DIR", "REPLAY_DIR", "SoftQAgent", "load_trained_learner", "save_state"]

logger = logging.getLogger(__name__)

LEARNER_DIR = "learner"
REPLAY_DIR = "replay"
LABELS_DIR = "labels"
"""Where :meth:`SoftQAgent.checkpoint` puts the learner and the replay buffer (a checkpoint, an artifact)."""

_TINY = np.finfo(np.float32).tiny


def load_trained_learner(path: str | Path, dim: int) -> SoftQLearner:
    """The :class:`~memento.learn.learner.SoftQLearner` of a trained selector directory (``SoftQLearner.save``), or of
    a run holding one in ``selector/`` (``memento train``), on the CPU.

    Raises :class:`~memento.errors.DimensionError` when its Q-network scores ``dim'``-dimensional vectors and
    the caller's encoder or bank gives ``dim``, and :class:`~memento.errors.CheckpointError` when ``path``
    holds no selector.
    """
    path = Path(path)
    if not (path / "learner.json").is_file() and (path / "selector" / "learner.json").is_file():
        path = path / "selector"
    if not (path / "learner.json").is_file():
        raise CheckpointError(f"{path}: not a trained selector directory (no learner.json; expected what "
                              "SoftQLearner.save or `memento train` writes)")
    learner = SoftQLearner.load(path, device="cpu")
    if learner.qnet.config.dim != dim:
        raise DimensionError(f"{path}: the Q-network takes dim={learner.qnet.config.dim}, the encoder gives "
                             f"dim={dim}")
    logger.info("trained Q-network from %s (arch=%s)", path, learner.qnet.config.arch)
    return learner


def save_state(directory: str | Path, learner: SoftQLearner, buffer: ReplayBuffer) -> None:
    """A soft-Q agent's learning state: ``learner/`` and ``replay/`` in ``directory`` (a checkpoint, an artifact)."""
    learner.save(Path(directory) / LEARNER_DIR)
    buffer.save(Path(directory) / REPLAY_DIR)


class SoftQAgent:
    """The learning soft-Q policy (see the module docstring). Build it with :meth:`create`."""

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
