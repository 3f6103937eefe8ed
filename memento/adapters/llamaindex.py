"""A LlamaIndex retriever over a loaded selector (the ``llamaindex`` extra: ``llama-index-core``)::

    from memento.adapters.llamaindex import MementoRetriever
    retriever = MementoRetriever(memento.load_selector(path), k=4)
    nodes = retriever.retrieve("What is the capital of Peru?")  # the top 4 by Q, score = sigmoid(Q); nothing written

    learner = MementoRetriever(memento.load_selector(path, learn=True), k=4, track=True, mode="sample")
    nodes = learner.retrieve("What is the capital of Peru?")    # explores; recorded for feedback
    learner.feedback(nodes, reward=1.0)                         # or learner.feedback(selection_id, 1.0)

Scoped and filtered (:mod:`memento.adapters`): ``scope={"user": "alice"}`` and ``filter={"topic": {"in": ["geo",
"sci"]}}`` (memento's filter JSON), or LlamaIndex's own ``filters=MetadataFilters(filters=[MetadataFilter(key="topic",
value="geo")])`` (operators ``==`` and ``in``, conditions AND/OR, nested; others are refused): only the cases of the
scope whose meta match are candidates.

Each node is a ``TextNode`` with text ``"Task: <state>\\nAction: <action>"``, ``id_`` the case id and
``metadata`` ``{id, reward, env, kind, score, q, similarity, prob, selection_id, mode, policy_version, user?,
agent?, session?}``; its
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
    check_where,
    missing_extra,
    selection_id_of,
)
from memento.errors import DataFormatError

try:
    from llama_index.core.retrievers import BaseRetriever
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
    from llama_index.core.vector_stores.types import FilterCondition, FilterOperator, MetadataFilter, MetadataFilters
except ImportError:
    raise missing_extra("LlamaIndex", "llamaindex", "llama-index-core") from None

__all__ = ["MementoRetriever", "metadata_filters_json"]


def metadata_filters_json(filters: MetadataFilters) -> dict[str, Any]:
    """LlamaIndex ``MetadataFilters`` as memento filter JSON (:mod:`memento.memory.where`): ``==`` and ``in``
    (``ExactMatchFilter`` too) under AND/OR, nested; any other operator or condition raises ``DataFormatError``."""
    if not isinstance(filters, MetadataFilters):
        raise DataFormatError(f"filters must be a llama_index MetadataFilters, got {type(filters).__name__}")
    if filters.condition not in (FilterCondition.AND, FilterCondition.OR, None):
        raise DataFormatError(f"filters: condition {str(filters.condition)[:40]!r} is not supported (AND, OR)")
    parts: list[dict[str, Any]] = []
    for item in filters.filters:
        if isinstance(item, MetadataFilters):
            parts.append(metadata_filters_json(item))
        elif isinstance(item, MetadataFilter) and item.operator == FilterOperator.EQ:
            parts.append({item.key: item.value})
        elif isinstance(item, MetadataFilter) and item.operator == FilterOperator.IN:
            values = item.value if isinstance(item.value, list) else [item.value]
            parts.append({item.key: {"in": values}})
        else:
            operator = getattr(item, "operator", type(item).__name__)
            raise DataFormatError(f"filters: operator {str(getattr(operator, 'value', operator))[:40]!r} is not "
                                  "supported (memento filters take '==' and 'in' under AND/OR)")
    if not parts:
        return {}
    return parts[0] if len(parts) == 1 else {"OR" if filters.condition == FilterCondition.OR else "AND": parts}


class MementoRetriever(BaseRetriever):
    """``selector.select(query, k, mode, env, track=track, scope=scope, filter=filter)`` as a LlamaIndex retriever;
    see the module docstring. ``filters`` (LlamaIndex ``MetadataFilters``) is ANDed with ``filter``."""

    def __init__(self, selector: Any, k: int = 4, mode: Literal["sample", "greedy"] = "greedy",
                 env: str | None = None, on_select: Callable[[Any], None] | None = None, *, track: bool = False,
                 score: ScoreKind = "success", scope: dict[str, Any] | None = None,
                 filter: dict[str, Any] | None = None, filters: MetadataFilters | None = None, **kwargs: Any):
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise DataFormatError(f"MementoRetriever: k must be a positive integer, got {str(k)[:80]}")
        check_retriever_options(mode, track, score)
        if filters is not None:
            try:
                native = metadata_filters_json(filters)
            except DataFormatError as error:
                raise DataFormatError(f"MementoRetriever: {error}") from None
            filter = native if not filter else ({"AND": [filter, native]} if native else filter)
        where = check_where(scope, filter)
        super().__init__(**kwargs)
        self.selector, self.k, self.mode, self.env, self.on_select = selector, k, mode, env, on_select
        self.track, self.score = track, score
        self.scope, self.filter = where

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        result = self.selector.select(query_bundle.query_str, k=self.k, mode=self.mode, env=self.env,
                                      track=self.track, scope=self.scope, filter=self.filter)
        if self.on_select is not None:
            self.on_select(result)
        return [NodeWithScore(node=TextNode(id_=case.id, text=case_text(case), metadata=metadata), score=relevance)
                for case, relevance, metadata in case_metadata(result, self.score)]

    def feedback(self, selection: str | Sequence[NodeWithScore], reward: float) -> dict[str, Any]:
        """Report the reward in [0, 1] of what was done with one retrieval (its nodes, or its selection id) made with
        ``track=True``; returns the selector's answer (``Selector.feedback``)."""
        return dict(self.selector.feedback(selection_id_of(selection), reward))
