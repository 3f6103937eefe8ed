"""Learning which cases to show: the Q-networks, the replay buffer, the soft-Q learner and agent, case features,
the Policy protocol, and planner-scored labels with their listwise loss.

A new policy implements :class:`memento.learn.policy.Policy` (concrete policies live in the top-level
``policies`` package and are wired in by the composition root).
"""
