"""Learning which cases to show: the Q-networks, the replay buffer, the soft-Q learner and its saved state, case
features, per-case evidence, the Policy protocol, and planner-scored labels with their listwise loss.

A new policy implements :class:`memento.learn.policy.Policy`; concrete policies (the soft-Q agent among them) live
in ``memento.policies``, one module each, which builds on this package and is never imported by it.
"""
