"""The selector artifact: a trained case selector on disk and loaded (:mod:`memento.selector.runtime`), its
layout and checks (:mod:`memento.selector.artifact`), export from a run (:mod:`memento.selector.export`),
pending selections, request batching, and the selector shipped with memento.
"""
