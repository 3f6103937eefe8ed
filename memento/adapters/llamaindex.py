"""A LlamaIndex retriever over a loaded selector (the ``llamaindex`` extra: ``llama-index-core``)::

    from memento.adapters.llamaindex import MementoRetriever
    retriever = MementoRetriever(memento.load_selector(path), k=4)
    nodes = retriever.retrieve("What is the capital of Peru?")  # the top 4 by Q, score = sigmoid(Q); nothing written

    learner = MementoRetriever(memento.load_selector(path, learn=True), k=4, track=True, mode="sample")
    nodes = learner.retrieve("What is the capital of Peru?")    # explores; recorded for feedback
    learner.feedback(nodes, reward=1.0)                         # or learner.feedback(selection_id, 1.0)

Each node is a ``TextNode`` with text ``"Task: <state>\\nAction: <action>"``, ``id_`` the case id and
``metadata`` ``{id, reward, env, kind, score, q, similarity, prob, selection_id, mode, policy_version}``; its
``NodeWithScore.score`` is the relevance (``sigmoid(Q)``, in [0, 1], or the cosine with ``score="similarity"``),
so ``SimilarityPostprocessor(similarity_cutoff=...)`` and rerankers see a relevance, not the draw probability
(that is ``metadata["prob"]``). See :mod:`memento.adapters` for the defaults. It works wherever LlamaIndex takes
a retriever (``RetrieverQueryEngine``, ``aretrieve``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

from memento.adapters import (
    ScoreKind,
    case_metadata,
    case_text,
    check_retriever_options,
    missing_extra,
    selection_id_of,
)
from memento.errors import DataFormatError

try:
    from llama_index.core.retrievers import BaseRetriever
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
except ImportError:
    raise missing_extra("LlamaIndex", "llamaindex", "llama-index-core") from None

__all__ = ["MementoRetriever"]


class MementoRetriever(BaseRetriever):
    """``selector.select(query, k, mode, env, track=track)`` as a LlamaIndex retriever; see the module docstring."""

    def __init__(self, selector: Any, k: int = 4, mode: Literal["sample", "greedy"] = "greedy",
                 env: str | None = None, on_select: Callable[[Any], None] | None = None, *, track: bool = False,
                 score: ScoreKind = "success", **kwargs: Any):
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise DataFormatError(f"MementoRetriever: k must be a positive integer, got {str(k)[:80]}")
        check_retriever_options(mode, track, score)
        super().__init__(**kwargs)
        self.selector, self.k, self.mode, self.env, self.on_select = selector, k, mode, env, on_select
        self.track, self.score = track, score

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        result = self.selector.select(query_bundle.query_str, k=self.k, mode=self.mode, env=self.env,
                                      track=self.track)
        if self.on_select is not None:
            self.on_select(result)
        return [NodeWithScore(node=TextNode(id_=case.id, text=case_text(case), metadata=metadata), score=relevance)
                for case, relevance, metadata in case_metadata(result, self.score)]

    def feedback(self, selection: str | Sequence[NodeWithScore], reward: float) -> dict[str, Any]:
        """Report the reward in [0, 1] of what was done with one retrieval (its nodes, or its selection id) made with
        ``track=True``; returns the selector's answer (``Selector.feedback``)."""
        return dict(self.selector.feedback(selection_id_of(selection), reward))
