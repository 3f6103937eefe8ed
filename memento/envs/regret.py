"""The regret experiment: Memento's Algorithm 1 on a SYNTHETIC bandit with a known oracle.

:func:`run_regret` fills a fresh case bank (exact ``Flat`` index) in ``workdir`` with the
bandit's cases, then for ``config.steps`` steps:

1. ``task, state_D = env.sample_task(task_rng)``;
2. ``cands = bank.candidates(state_D, C)`` -- the top-``C`` cases by cosine;
3. ``sel = policy.select(state_D, cands, k, rng=policy_rng)``;
4. ``r = env.reward(task, chosen bank positions, reward_rng)`` (a Bernoulli draw with the oracle's
   success probability), and the step's regret ``env.best_success_prob(task, k) - env.success_prob(task,
   chosen)`` from the oracle;
5. learning: ``soft_q`` appends a :class:`~memento.replay.Transition` (state, chosen case vectors in
   draw order, reward, first-draw propensities) to a :class:`~memento.replay.ReplayBuffer` and, once
   ``warmup_steps`` decisions are logged, makes ``updates_per_step`` single-step (``gamma = 0``,
   binary cross-entropy) :class:`~memento.learner.SoftQLearner` updates on uniform mini-batches; the
   policy's temperature follows ``learner.alpha``. ``linucb`` updates its ridge regression with the
   set's reward for each chosen case. ``random`` and ``similarity`` do not learn.

**No retention.** Algorithm 1 also retains each new experience, ``M_{t+1} = M_t ∪ {(s_t, a_t, r_t)}``.
In the bandit the planner's output is not modelled, so a retained case would be a vector with no
oracle success probability; the bank stays fixed here. The online loop with retention is
``memento.loop`` (a later issue).

**Regret** is measured against the best ``k``-set of the *whole* bank, so it includes what the
candidate pre-selection leaves out; ``RegretResult.ceiling_regret_T`` is the regret of the best
``k``-set *within* each step's candidates (the floor any policy over those candidates can reach).

**Randomness.** Everything is derived from ``config.seed`` through ``numpy.random.SeedSequence``:
three numpy generators (tasks, the policy's draws, rewards; separate streams, so every policy sees
the same task sequence for a seed) and two torch seeds (Q-network initialisation, the learner's
generator, which draws dropout masks and replay mini-batches). The environment's world is seeded
by its own ``SyntheticBanditConfig.seed``. Two runs with the same configs and device give the same
regret, bit for bit.

Policies come from the sibling package ``policies`` and are imported inside :func:`run_regret`
(``memento`` never imports them at module level).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch

from memento.config import (
    AlphaSchedule,
    ImportanceWeights,
    LearnerConfig,
    QNetArch,
    QNetConfig,
    ReplayConfig,
    check,
    check_choice,
    check_float,
    check_int,
    to_dict,
)
from memento.envs.synthetic import SyntheticBandit
from memento.errors import BankError, ConfigError
from memento.io import atomic_write_text
from memento.learner import SoftQLearner
from memento.memory import CaseBank
from memento.qnet import QNetwork, build_qnet
from memento.replay import ReplayBuffer, Transition

if TYPE_CHECKING:
    from memento.policy import Policy

__all__ = ["RegretConfig", "RegretPolicyKind", "RegretResult", "run_regret"]

logger = logging.getLogger(__name__)

RegretPolicyKind = Literal["random", "similarity", "soft_q", "linucb"]
"""The policies the experiment can run (the same names as ``policies.PolicyKind``)."""

BANK_DIR = "bank"
CONFIG_NAME = "config.json"
RESULT_NAME = "regret.json"


@dataclasses.dataclass(frozen=True, kw_only=True)
class RegretConfig:
    """One regret run (see the module docstring).

    Experiment:

    - ``steps``: decisions; ``k``: cases shown per decision; ``candidates``: C, the size of the
      cosine pre-selection the policy chooses from (``k <= C``);
    - ``policy``: ``"random"``, ``"similarity"`` (deterministic cosine top-k), ``"soft_q"`` or
      ``"linucb"``;
    - ``seed``: every random stream of the run (not the world, which ``SyntheticBanditConfig.seed`` fixes).

    Soft-Q Q-network (:class:`~memento.config.QNetConfig`; ``dim`` comes from the environment):
    ``qnet_arch``, ``hidden``, ``n_layers``, ``dropout``, ``embed_dim`` (``two_tower`` only).

    Soft-Q learning (:class:`~memento.config.LearnerConfig` with ``gamma = 0``):

    - ``warmup_steps``: decisions logged before the first update; ``updates_per_step``: gradient
      steps after each later decision; ``batch_size``: decisions per mini-batch (each gives ``k``
      (state, case) pairs); ``replay_capacity``: decisions the buffer keeps;
    - ``lr``, ``weight_decay``, ``max_grad_norm``: AdamW and clipping;
    - ``alpha``, ``alpha_schedule``, ``alpha_final``, ``alpha_decay_steps`` (counted in updates),
      ``target_entropy_ratio``: the temperature of ``softmax(Q / alpha)``;
    - ``importance_weights``: ``"none"`` or ``"inverse_propensity"`` (capped at ``importance_cap``).

    LinUCB: ``linucb_exploration`` (the bonus width) and ``linucb_ridge`` (shared model,
    ``product_concat`` features).
    """

    steps: int = 1500
    k: int = 4
    candidates: int = 32
    policy: RegretPolicyKind = "soft_q"
    seed: int = 0
    # Q-network
    qnet_arch: QNetArch = "mlp"
    hidden: int = 128
    n_layers: int = 1
    dropout: float = 0.0
    embed_dim: int = 64
    # learner
    warmup_steps: int = 50
    updates_per_step: int = 1
    batch_size: int = 64
    replay_capacity: int = 100_000
    lr: float = 3e-3
    weight_decay: float = 0.0
    max_grad_norm: float | None = 10.0
    alpha: float = 0.2
    alpha_schedule: AlphaSchedule = "fixed"
    alpha_final: float = 0.05
    alpha_decay_steps: int = 1000
    target_entropy_ratio: float = 0.5
    importance_weights: ImportanceWeights = "none"
    importance_cap: float = 100.0
    # LinUCB
    linucb_exploration: float = 1.0
    linucb_ridge: float = 1.0

    def __post_init__(self) -> None:
        check_int(self, "steps", 1)
        check_int(self, "k", 1)
        check_int(self, "candidates", 1)
        check(self.k <= self.candidates, type(self), "k", self.k, f"must be <= candidates={self.candidates}")
        check_choice(self, "policy", RegretPolicyKind)
        check_int(self, "seed", 0)
        check_choice(self, "qnet_arch", QNetArch)
        check_int(self, "hidden", 1)
        check_int(self, "n_layers", 1)
        check_float(self, "dropout", low=0.0, high=1.0, high_open=True)
        check_int(self, "embed_dim", 1)
        check_int(self, "warmup_steps", 0)
        check_int(self, "updates_per_step", 0)
        check_int(self, "batch_size", 1)
        check_int(self, "replay_capacity", 1)
        check_float(self, "lr", low=0.0, low_open=True)
        check_float(self, "weight_decay", low=0.0)
        if self.max_grad_norm is not None:
            check_float(self, "max_grad_norm", low=0.0, low_open=True)
        check_float(self, "alpha", low=0.0, low_open=True)
        check_choice(self, "alpha_schedule", AlphaSchedule)
        check_float(self, "alpha_final", low=0.0, low_open=True)
        check_int(self, "alpha_decay_steps", 1)
        check_float(self, "target_entropy_ratio", low=0.0, high=1.0, low_open=True)
        check_choice(self, "importance_weights", ImportanceWeights)
        check_float(self, "importance_cap", low=1.0)
        check_float(self, "linucb_exploration", low=0.0)
        check_float(self, "linucb_ridge", low=0.0, low_open=True)

    def qnet_config(self, dim: int, seed: int = 0) -> QNetConfig:
        """The Q-network of a soft-Q run over ``dim``-dimensional vectors."""
        return QNetConfig(arch=self.qnet_arch, dim=dim, hidden=self.hidden, n_layers=self.n_layers,
                          dropout=self.dropout, embed_dim=self.embed_dim, seed=seed)

    def learner_config(self, seed: int = 0) -> LearnerConfig:
        """The single-step (``gamma = 0``) learner of a soft-Q run."""
        return LearnerConfig(gamma=0.0, lr=self.lr, weight_decay=self.weight_decay, max_grad_norm=self.max_grad_norm,
                             batch_size=self.batch_size, alpha=self.alpha, alpha_schedule=self.alpha_schedule,
                             alpha_final=self.alpha_final, alpha_decay_steps=self.alpha_decay_steps,
                             target_entropy_ratio=self.target_entropy_ratio,
                             importance_weights=self.importance_weights, importance_cap=self.importance_cap,
                             seed=seed)


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class RegretResult:
    """What a run measured; per-step arrays have length ``T = config.steps``.

    - ``regret_T``: ``best_success_prob(task, k) - success_prob(task, chosen)`` per step (float64, >= 0);
    - ``ceiling_regret_T``: the same for the best ``k``-set within the step's candidates;
    - ``success_prob_T``: the oracle's success probability of the chosen set; ``reward_T``: the observed
      reward (0 or 1);
    - ``final_alpha``: the soft-Q temperature at the end (``None`` for other policies); ``updates``:
      learner (soft-Q) or ridge (LinUCB, one per chosen case) updates made;
    - ``qnet``: the trained Q-network (soft-Q only), on the run's device;
    - ``wall_s``: seconds the run took.
    """

    config: RegretConfig
    regret_T: np.ndarray
    ceiling_regret_T: np.ndarray
    success_prob_T: np.ndarray
    reward_T: np.ndarray
    final_alpha: float | None
    updates: int
    qnet: QNetwork | None
    wall_s: float

    @property
    def steps(self) -> int:
        return int(self.regret_T.shape[0])

    @property
    def cumulative_regret_T(self) -> np.ndarray:
        """Regret summed up to each step."""
        return np.cumsum(self.regret_T)

    @property
    def total_regret(self) -> float:
        return float(self.regret_T.sum())

    @property
    def success_rate(self) -> float:
        """The fraction of steps whose reward was 1."""
        return float(self.reward_T.mean())

    def window_mean(self, start: int, stop: int | None = None) -> float:
        """Mean per-step regret over steps ``start..stop-1`` (Python slice semantics; negative counts from the end)."""
        window = self.regret_T[start:stop]
        if window.size == 0:
            raise ConfigError(f"window [{start}:{stop}] of a {self.steps}-step run is empty")
        return float(window.mean())

    def first_last(self, window: int) -> tuple[float, float]:
        """Mean per-step regret of the first and of the last ``window`` steps."""
        if isinstance(window, bool) or not isinstance(window, int) or not 1 <= window <= self.steps:
            raise ConfigError(f"window={window!r}: must be an integer in [1, {self.steps}]")
        return self.window_mean(0, window), self.window_mean(self.steps - window)

    def summary(self, window: int | None = None) -> dict[str, Any]:
        """Scalars for logs and JSON: totals, success rate, first/last-window mean regret (default window T/5)."""
        w = window if window is not None else max(1, self.steps // 5)
        first, last = self.first_last(w)
        return {"policy": self.config.policy, "steps": self.steps, "total_regret": self.total_regret,
                "mean_regret": float(self.regret_T.mean()), "mean_ceiling_regret": float(self.ceiling_regret_T.mean()),
                "success_rate": self.success_rate, "mean_success_prob": float(self.success_prob_T.mean()),
                "window": w, "first_window_regret": first, "last_window_regret": last,
                "final_alpha": self.final_alpha, "updates": self.updates, "wall_s": self.wall_s}


def _torch_seed(seq: np.random.SeedSequence) -> int:
    return int(seq.generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))  # a non-negative int64


def _fill_bank(env: SyntheticBandit, path: Path) -> CaseBank:
    if path.exists():
        raise BankError(f"{path}: already exists; run_regret needs a fresh workdir (or one without {BANK_DIR}/)")
    cases, emb_ND = env.cases()
    bank = CaseBank.create(path, dim=env.config.dim, index="Flat", use_gpu=False)
    try:
        ids = bank.add(cases, emb_ND)
        expected = [case.id for case in cases]
        if ids != expected or len(bank) != env.n_cases:  # positions must be the env's case positions
            raise BankError(f"{path}: the bank did not store the {env.n_cases} synthetic cases in order "
                            f"(holds {len(bank)}); the bandit's positions would not be bank positions")
    except BaseException:
        bank.close()
        raise
    return bank


def run_regret(env: SyntheticBandit, config: RegretConfig, *, workdir: str | Path,
               device: str | torch.device = "cpu") -> RegretResult:
    """Run ``config.policy`` on ``env`` for ``config.steps`` decisions and measure its regret.

    ``workdir`` receives the case bank (``bank/``), ``config.json`` (the run config and the
    environment's) and ``regret.json`` (:meth:`RegretResult.summary` and the per-step regret).
    ``device`` holds the Q-network, the learner and the replay buffer (soft-Q only); results are
    reproducible on one device, not across devices.
    """
    from policies import LinUCBConfig, LinUCBPolicy, RandomPolicy, SimilarityPolicy, SoftQPolicy

    if not isinstance(env, SyntheticBandit):
        raise ConfigError(f"run_regret: env={type(env).__name__}: must be a SyntheticBandit (it needs the oracle)")
    if not isinstance(config, RegretConfig):
        raise ConfigError(f"run_regret: config={type(config).__name__}: must be a RegretConfig")
    if config.k > env.n_cases:
        raise ConfigError(f"RegretConfig.k={config.k}: must be <= the bandit's n_cases={env.n_cases}")
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    device = torch.device(device)
    started = time.perf_counter()

    seeds = np.random.SeedSequence(config.seed).spawn(5)
    task_rng, policy_rng, reward_rng = (np.random.default_rng(s) for s in seeds[:3])
    qnet_seed, learner_seed = _torch_seed(seeds[3]), _torch_seed(seeds[4])

    dim, k, n_steps = env.config.dim, config.k, config.steps
    learner: SoftQLearner | None = None
    buffer: ReplayBuffer | None = None
    soft_q: SoftQPolicy | None = None
    linucb: LinUCBPolicy | None = None
    policy: Policy
    match config.policy:
        case "random":
            policy = RandomPolicy()
        case "similarity":
            policy = SimilarityPolicy()
        case "soft_q":
            qnet_config = config.qnet_config(dim, seed=qnet_seed)
            qnet = build_qnet(qnet_config, torch.Generator().manual_seed(qnet_seed))
            learner = SoftQLearner(qnet, config.learner_config(seed=learner_seed), device=device,
                                   generator=torch.Generator(device=device).manual_seed(learner_seed))
            buffer = ReplayBuffer(ReplayConfig(capacity=config.replay_capacity, dim=dim, k_max=k), device=device)
            policy = soft_q = SoftQPolicy(learner.qnet, alpha=learner.alpha)
        case "linucb":
            policy = linucb = LinUCBPolicy(LinUCBConfig(dim=dim, exploration=config.linucb_exploration,
                                                        ridge=config.linucb_ridge))
        case _:  # pragma: no cover - RegretConfig rejects other values
            raise ConfigError(f"RegretConfig.policy={config.policy!r}")


    regret_T = np.zeros(n_steps)
    ceiling_T = np.zeros(n_steps)
    success_T = np.zeros(n_steps)
    reward_T = np.zeros(n_steps)
    log_every = max(1, n_steps // 10)
    bank = _fill_bank(env, workdir / BANK_DIR)  # first: it refuses a used workdir before anything is overwritten
    _write_json(workdir / CONFIG_NAME, {"regret": to_dict(config), "env": to_dict(env.config), "device": str(device)})
    with bank:
        for step in range(n_steps):
            task, state_D = env.sample_task(task_rng)
            cands = bank.candidates(state_D, config.candidates)
            if soft_q is not None and learner is not None:
                soft_q.alpha = learner.alpha
            sel = policy.select(state_D, cands, k, rng=policy_rng)
            chosen_K = cands.positions_C[sel.positions_K]
            reward = env.reward(task, chosen_K, reward_rng)
            best = env.best_success_prob(task, k)
            success_T[step] = env.success_prob(task, chosen_K)
            regret_T[step] = max(0.0, best - success_T[step])  # clip float round-off
            ceiling_K = env.oracle_positions(task, k, among=cands.positions_C)
            ceiling_T[step] = max(0.0, best - env.success_prob(task, ceiling_K))
            reward_T[step] = reward

            if learner is not None and buffer is not None:
                buffer.add(Transition(state_D=state_D, cases_KD=cands.embeddings_CD[sel.positions_K], reward=reward,
                                      propensity_K=sel.probs_K, step=step,
                                      policy_version=learner.updates))
                if step + 1 >= config.warmup_steps:
                    for _ in range(config.updates_per_step):
                        learner.update(buffer.sample(config.batch_size, learner.generator))
            elif linucb is not None:
                linucb.update_selection(state_D, cands, sel, reward)

            if (step + 1) % log_every == 0:
                lo = max(0, step + 1 - log_every)
                logger.info("regret %s: step %d/%d, mean regret (last %d) %.4f, cumulative %.1f", config.policy,
                            step + 1, n_steps, step + 1 - lo, regret_T[lo:step + 1].mean(), regret_T[:step + 1].sum())

    updates = learner.updates if learner is not None else (linucb.n_updates if linucb is not None else 0)
    result = RegretResult(config=config, regret_T=regret_T, ceiling_regret_T=ceiling_T, success_prob_T=success_T,
                          reward_T=reward_T, final_alpha=learner.alpha if learner is not None else None,
                          updates=updates, qnet=learner.qnet if learner is not None else None,
                          wall_s=time.perf_counter() - started)
    _write_json(workdir / RESULT_NAME, {**result.summary(), "regret_T": regret_T.tolist()})
    logger.info("regret %s: %s", config.policy, {k_: v for k_, v in result.summary().items()
                                                 if isinstance(v, float) and math.isfinite(v)})
    return result


def _write_json(path: Path, payload: dict[str, Any]) -> None:
    atomic_write_text(path, json.dumps(payload, indent=2, sort_keys=True) + "\n")

