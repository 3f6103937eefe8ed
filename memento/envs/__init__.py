"""Task sources for the online loop.

- ``synthetic``: SYNTHETIC contextual bandits over a generated case bank with a known oracle
  (exact success probabilities, so regret can be measured); not real data.
- ``regret``: the regret experiment, Memento's Algorithm 1 run on a synthetic bandit with any
  policy (:func:`run_regret`).

Planned: JSONL task suites (DESIGN §6 Task JSONL).
"""

from memento.envs.regret import RegretConfig, RegretResult, run_regret
from memento.envs.synthetic import SyntheticBandit, SyntheticBanditConfig

__all__ = ["RegretConfig", "RegretResult", "SyntheticBandit", "SyntheticBanditConfig", "run_regret"]
