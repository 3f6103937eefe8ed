"""Task sources for the online loop.

- ``synthetic``: SYNTHETIC contextual bandits over a generated case bank with a known oracle
  (exact success probabilities, so regret can be measured); not real data.
- ``textworld``: TextWorld text games (generated from a seed, admissible commands, score, win) as a
  multi-step environment, and the game suites with train/test/ood splits; import
  ``memento.envs.textworld`` directly (TextWorld is the optional extra ``memento-mdp[games]``).

"""

from memento.envs.synthetic import SyntheticBandit, SyntheticBanditConfig

__all__ = ["SyntheticBandit", "SyntheticBanditConfig"]
