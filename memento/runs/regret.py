"""The regret experiment: Memento's Algorithm 1 on a SYNTHETIC bandit with a known oracle.

:func:`run_regret` fills a fresh case bank (exact ``Flat`` index) in ``workdir`` with the
bandit's cases, then for ``config.steps`` steps:

1. ``task, state_D = env.sample_task(task_rng)``;
2. ``cands = bank.candidates(state_D, C)`` -- the top-``C`` cases by cosine;
3. ``sel = policy.select(state_D, cands, k, rng=policy_rng)``;
4. ``r = env.reward(task, chosen bank positions, reward_rng)`` (a Bernoulli draw with the oracle's
   success probability), and the step's regret ``env.best_success_prob(task, k) - env.success_prob(task,
   chosen)`` from the oracle;
5. learning: ``policy.observe([Observation(...)])``, as in the online loop: ``soft_q``
   (:class:`~memento.policies.soft_q.SoftQAgent`) appends the decision to its replay buffer and, once ``warmup``
   decisions are logged, makes ``updates_per_step`` single-step (``gamma = 0``, binary cross-entropy)
   learner updates on uniform mini-batches; its temperature follows ``learner.alpha``. ``linucb``
   updates its ridge regression with the set's reward for each chosen case. ``random`` and
   ``similarity`` do not learn.

**No retention.** Algorithm 1 also retains each new experience, ``M_{t+1} = M_t ∪ {(s_t, a_t, r_t)}``.
In the bandit the planner's output is not modelled, so a retained case would be a vector with no
oracle success probability; the bank stays fixed here. The online loop with retention is
:class:`memento.runs.qa.OnlineLoop`.

**Regret** is measured against the best ``k``-set of the *whole* bank, so it includes what the
candidate pre-selection leaves out; ``RegretResult.ceiling_regret_T`` is the regret of the best
``k``-set *within* each step's candidates (the floor any policy over those candidates can reach).

**Randomness.** Everything is derived from ``config.seed`` through ``numpy.random.SeedSequence``:
three numpy generators (tasks, the policy's draws, rewards; separate streams, so every policy sees
the same task sequence for a seed) and two torch seeds (Q-network initialisation, the learner's
generator, which draws dropout masks and replay mini-batches). The environment's world is seeded
by its own ``SyntheticBanditConfig.seed``. Two runs with the same configs and device give the same
regret, bit for bit.

The policy is built by the ``make_policy`` factory the caller passes (``memento.policies.make_policy``): the
core never imports the ``policies`` package.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from memento.bank import CaseBank
from memento.bank.protocol import Bank
from memento.config import (
    MAX_CANDIDATES,
    MAX_K,
    MAX_SEED,
    check,
    check_int,
    to_dict,
)
from memento.envs.synthetic import SyntheticBandit
from memento.errors import BankError, ConfigError
from memento.learn.policy import Observation, PolicyContext, PolicyFactory
from memento.policies import PolicyConfig, SoftQConfig, check_policy, regret_policy
from memento.runs.base import torch_seed
from memento.runs.rundir import write_json

__all__ = ["RegretConfig", "RegretResult", "run_regret"]

logger = logging.getLogger(__name__)

BANK_DIR = "bank"
CONFIG_NAME = "config.json"
RESULT_NAME = "regret.json"


MAX_REGRET_STEPS = 10_000_000
"""A regret run's decisions: it keeps four float64 curves of one value per step (320 MB at the bound)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class RegretConfig:
    """One regret run (see the module docstring).

    - ``steps``: decisions; ``k``: cases shown per decision; ``candidates``: C, the size of the
      cosine pre-selection the policy chooses from (``k <= C``);
    - ``policy``: the policy's config (:data:`memento.policies.PolicyConfig`; :func:`memento.policies.regret_policy`
      gives this run's default of each kind; a ``SoftQConfig`` needs ``learner.gamma = 0``: the bandit is
      single-step);
    - ``seed``: every random stream of the run (not the world, which ``SyntheticBanditConfig.seed`` fixes).
    """

    steps: int = 1500
    k: int = 4
    candidates: int = 32
    policy: PolicyConfig = dataclasses.field(default_factory=lambda: regret_policy("soft_q"))
    seed: int = 0

    def __post_init__(self) -> None:
        check_int(self, "steps", 1, MAX_REGRET_STEPS)
        check_int(self, "k", 1, MAX_K)
        check_int(self, "candidates", 1, MAX_CANDIDATES)
        check(self.k <= self.candidates, type(self), "k", self.k, f"must be <= candidates={self.candidates}")
        check_policy(self)
        if isinstance(self.policy, SoftQConfig):
            check(self.policy.learner.gamma == 0.0, type(self), "policy", f"learner.gamma={self.policy.learner.gamma}",
                  "the bandit is single-step: learner.gamma must be 0")
        check_int(self, "seed", 0, MAX_SEED)


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
    qnet: torch.nn.Module | None
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
        return {"policy": self.config.policy.kind, "steps": self.steps, "total_regret": self.total_regret,
                "mean_regret": float(self.regret_T.mean()), "mean_ceiling_regret": float(self.ceiling_regret_T.mean()),
                "success_rate": self.success_rate, "mean_success_prob": float(self.success_prob_T.mean()),
                "window": w, "first_window_regret": first, "last_window_regret": last,
                "final_alpha": self.final_alpha, "updates": self.updates, "wall_s": self.wall_s}


def _fill_bank(env: SyntheticBandit, path: Path) -> Bank:
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


def run_regret(env: SyntheticBandit, config: RegretConfig, *, make_policy: PolicyFactory, workdir: str | Path,
               device: str | torch.device = "cpu") -> RegretResult:
    """Run ``config.policy`` (built by ``make_policy``, e.g. ``memento.policies.make_policy``) on ``env`` for
    ``config.steps`` decisions and measure its regret.

    ``workdir`` receives the case bank (``bank/``), ``config.json`` (the run config and the
    environment's) and ``regret.json`` (:meth:`RegretResult.summary` and the per-step regret).
    ``device`` holds the Q-network, the learner and the replay buffer (soft-Q only); results are
    reproducible on one device, not across devices.
    """
    if not isinstance(env, SyntheticBandit):
        raise ConfigError(f"run_regret: env={type(env).__name__}: must be a SyntheticBandit (it needs the oracle)")
    if not isinstance(config, RegretConfig):
        raise ConfigError(f"run_regret: config={type(config).__name__}: must be a RegretConfig")
    if not callable(make_policy):
        raise ConfigError(f"run_regret: make_policy={make_policy!r} is not callable "
                          "(pass memento.policies.make_policy)")
    if config.k > env.n_cases:
        raise ConfigError(f"RegretConfig.k={config.k}: must be <= the bandit's n_cases={env.n_cases}")
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    device = torch.device(device)
    started = time.perf_counter()

    seeds = np.random.SeedSequence(config.seed).spawn(5)
    task_rng, policy_rng, reward_rng = (np.random.default_rng(s) for s in seeds[:3])
    dim, k, n_steps = env.config.dim, config.k, config.steps

    regret_T = np.zeros(n_steps)
    ceiling_T = np.zeros(n_steps)
    success_T = np.zeros(n_steps)
    reward_T = np.zeros(n_steps)
    log_every = max(1, n_steps // 10)
    bank = _fill_bank(env, workdir / BANK_DIR)  # first: it refuses a used workdir before anything is overwritten
    write_json(workdir / CONFIG_NAME, {"regret": to_dict(config), "env": to_dict(env.config), "device": str(device)})
    with bank:
        policy = make_policy(config.policy, PolicyContext(dim=dim, k_max=k, device=device,
                                                          qnet_seed=torch_seed(seeds[3]),
                                                          learner_seed=torch_seed(seeds[4]), reward_of=bank.rewards))
        for step in range(n_steps):
            task, state_D = env.sample_task(task_rng)
            cands = bank.candidates(state_D, config.candidates)
            version = policy.version
            sel = policy.select(state_D, cands, k, rng=policy_rng)
            chosen_K = cands.positions_C[cands.rows_of(sel.ids)]
            reward = env.reward(task, chosen_K, reward_rng)
            best = env.best_success_prob(task, k)
            success_T[step] = env.success_prob(task, chosen_K)
            regret_T[step] = max(0.0, best - success_T[step])  # clip float round-off
            ceiling_K = env.oracle_positions(task, k, among=cands.positions_C)
            ceiling_T[step] = max(0.0, best - env.success_prob(task, ceiling_K))
            reward_T[step] = reward
            policy.observe([Observation(state_D=state_D, candidates=cands, selection=sel, reward=reward, step=step,
                                        policy_version=version)])

            if (step + 1) % log_every == 0:
                lo = max(0, step + 1 - log_every)
                logger.info("regret %s: step %d/%d, mean regret (last %d) %.4f, cumulative %.1f", config.policy.kind,
                            step + 1, n_steps, step + 1 - lo, regret_T[lo:step + 1].mean(), regret_T[:step + 1].sum())

    qnet = getattr(policy, "qnet", None)  # the soft-Q agent's network, for callers that evaluate it
    result = RegretResult(config=config, regret_T=regret_T, ceiling_regret_T=ceiling_T, success_prob_T=success_T,
                          reward_T=reward_T, final_alpha=policy.alpha, updates=policy.version,
                          qnet=qnet if isinstance(qnet, torch.nn.Module) else None,
                          wall_s=time.perf_counter() - started)
    write_json(workdir / RESULT_NAME, {**result.summary(), "regret_T": regret_T.tolist()})
    logger.info("regret %s: %s", config.policy.kind, {k_: v for k_, v in result.summary().items()
                                                      if isinstance(v, float) and math.isfinite(v)})
    return result

