"""Off-policy evaluation: estimators over a run's logged propensities (:mod:`memento.ope.estimators`) and
exports to the input formats of other OPE tools (:mod:`memento.ope.export`).
"""
