"""Task sources for the online loop.

- ``synthetic``: SYNTHETIC contextual bandits over a generated case bank with a known oracle
  (exact success probabilities, so regret can be measured); not real data.

Planned: JSONL task suites (DESIGN §6 Task JSONL).
"""

from memento.envs.synthetic import SyntheticBandit, SyntheticBanditConfig

__all__ = ["SyntheticBandit", "SyntheticBanditConfig"]
