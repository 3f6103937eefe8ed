"""The selector artifact: a trained case selector on disk and loaded (:mod:`memento.selector.runtime`: the
``Selector``, whose concerns are :mod:`~memento.selector.selecting`, :mod:`~memento.selector.feedback`,
:mod:`~memento.selector.cases` and :mod:`~memento.selector.persistence` over :mod:`~memento.selector.core`, its
query encoder :mod:`~memento.selector.encoding`), its layout and checks (:mod:`memento.selector.artifact`), export
from a run (:mod:`memento.selector.export`), pending selections, request batching, and the selector shipped with
memento.
"""
