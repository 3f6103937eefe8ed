"""Off-policy evaluation: estimators over a run's logged propensities (:mod:`memento.ope.estimators`), the
pipeline from a run's log to their estimates (:mod:`memento.ope.evaluate`, behind ``memento evaluate``) and
exports to the input formats of other OPE tools (:mod:`memento.ope.export`).
"""
