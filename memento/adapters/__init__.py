"""Retrievers over a loaded selector for agent frameworks (each in its own extra, imported on first use):

- :class:`memento.adapters.langchain.MementoRetriever`: a LangChain ``BaseRetriever`` (``memento-mdp[langchain]``);
- :class:`memento.adapters.llamaindex.MementoRetriever`: a LlamaIndex ``BaseRetriever`` (``memento-mdp[llamaindex]``).

Both turn ``selector.select(query, k, mode, env)`` into the framework's documents/nodes (text ``Task: ...`` /
``Action: ...``; metadata: case id, reward, env, kind, prob, selection_id) and send the outcome back with
``retriever.feedback(selection_id_or_documents, reward)``. Importing this package imports neither framework.
"""

from __future__ import annotations

from typing import Any

from memento.errors import MementoError
from memento.types import Case

__all__ = ["case_text", "missing_extra", "selection_id_of"]


def case_text(case: Case) -> str:
    """What a retrieved case reads as in a prompt: ``Task: <state>`` and ``Action: <action>`` on two lines."""
    return f"Task: {case.state}\nAction: {case.action}"


def missing_extra(framework: str, extra: str, module: str) -> MementoError:
    """The one-line error for a framework that is not installed."""
    return MementoError(f"memento.adapters.{extra} needs {framework} ({module} is not installed): "
                        f"pip install 'memento-mdp[{extra}]'")


def selection_id_of(selection: Any) -> str:
    """The selection id of a retrieval: the id itself, or the documents/nodes one retrieval returned (each
    carries ``metadata["selection_id"]``); documents of several retrievals, or none, raise ``MementoError``."""
    if isinstance(selection, str):
        if not selection:
            raise MementoError("feedback: the selection id is empty")
        return selection
    ids = set()
    for item in selection:
        node = getattr(item, "node", item)  # a LlamaIndex NodeWithScore holds its node
        metadata = getattr(node, "metadata", None) or {}
        if "selection_id" not in metadata:
            raise MementoError(f"feedback: {type(item).__name__} has no metadata['selection_id'] (not retrieved "
                               "by a memento retriever)")
        ids.add(metadata["selection_id"])
    if len(ids) != 1:
        raise MementoError(f"feedback: the documents come from {len(ids)} retrievals; give those of one "
                           "retrieval, or its selection id")
    return ids.pop()
