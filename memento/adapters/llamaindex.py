"""A LlamaIndex retriever over a loaded selector (the ``llamaindex`` extra: ``llama-index-core``)::

    from memento.adapters.llamaindex import MementoRetriever
    retriever = MementoRetriever(memento.load_selector(path), k=4)
    nodes = retriever.retrieve("What is the capital of Peru?")  # the top 4 by Q; nothing written

    learner = MementoRetriever(memento.load_selector(path, learn=True), k=4, track=True, mode="sample")
    nodes = learner.retrieve("What is the capital of Peru?")    # explores; recorded for feedback
    learner.feedback(nodes, reward=1.0)                         # or learner.feedback(selection_id, 1.0)

Scoped and filtered (:mod:`memento.adapters`): ``scope={"user": "alice"}`` and ``filter={"topic": {"in": ["geo",
"sci"]}}`` (memento's filter JSON), or LlamaIndex's own ``filters=MetadataFilters(filters=[MetadataFilter(key="topic",
value="geo")])`` (operators ``==`` and ``in``, conditions AND/OR, nested; others are refused): only the cases of the
scope whose meta match are candidates. An ``==`` on ``user``, ``agent`` or ``session`` (at the top, or in a
top-level AND) selects the scope, as the nodes' metadata shows it.

Each node is a ``TextNode`` with text ``"Task: <state>\\nAction: <action>"``, ``id_`` the case id and
``metadata`` ``{id, reward, env, kind, score, q, similarity, prob, policy_prob, selection_id, mode,
policy_version, user?, agent?, session?}`` (:data:`memento.adapters.METADATA_KEYS`). The metadata is for code:
none of it reaches the LLM's prompt or the embedded text unless named, ``llm_metadata_keys=("env",)`` and
``embed_metadata_keys=(...)`` (each node's ``excluded_llm_metadata_keys`` / ``excluded_embed_metadata_keys`` are
all the other keys). ``NodeWithScore.score`` is the relevance, by default the policy's probability of the case,
``softmax(Q / alpha)`` over the candidate set (in (0, 1], higher for a higher Q, at most 1 summed over the nodes;
``score="success"``: ``sigmoid(Q)``; ``score="similarity"``: the cosine; see :mod:`memento.adapters`), so
``SimilarityPostprocessor(similarity_cutoff=0.1)`` keeps the cases the policy would draw first at least one
time in ten; the draw probability is ``metadata["prob"]`` (1.0 in greedy mode). It works wherever LlamaIndex
takes a retriever (``RetrieverQueryEngine``, ``aretrieve``). An argument it does not know (``similarity_top_k``:
use ``k``) is refused in one line.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

from memento.adapters import (
    METADATA_KEYS,
    ScoreKind,
    case_metadata,
    case_text,
    check_k,
    check_metadata_keys,
    check_retriever_options,
    check_unknown,
    missing_extra,
    select_where,
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


_OPERATORS = {FilterOperator.EQ: "eq", FilterOperator.NE: "ne", FilterOperator.GT: "gt", FilterOperator.GTE: "gte",
              FilterOperator.LT: "lt", FilterOperator.LTE: "lte", FilterOperator.IN: "in", FilterOperator.NIN: "nin",
              FilterOperator.TEXT_MATCH: "contains"}
"""LlamaIndex's operators and memento's (:mod:`memento.bank.where`); ``text_match`` is a substring match."""


def metadata_filters_json(filters: MetadataFilters) -> dict[str, Any]:
    """LlamaIndex ``MetadataFilters`` as memento filter JSON (:mod:`memento.bank.where`): ``== != > >= < <= in nin
    text_match`` (``ExactMatchFilter`` too) under AND/OR/NOT, nested; any other operator raises ``DataFormatError``."""
    if not isinstance(filters, MetadataFilters):
        raise DataFormatError(f"filters must be a llama_index MetadataFilters, got {type(filters).__name__}")
    if filters.condition not in (FilterCondition.AND, FilterCondition.OR, FilterCondition.NOT, None):
        raise DataFormatError(f"filters: condition {str(filters.condition)[:40]!r} is not supported (AND, OR, NOT)")
    parts: list[dict[str, Any]] = []
    for item in filters.filters:
        if isinstance(item, MetadataFilters):
            parts.append(metadata_filters_json(item))
        elif isinstance(item, MetadataFilter) and item.operator in _OPERATORS:
            operator = _OPERATORS[item.operator]
            value = item.value
            if operator in ("in", "nin") and not isinstance(value, list):
                value = [value]
            parts.append({item.key: value} if operator == "eq" else {item.key: {operator: value}})
        else:
            operator = getattr(item, "operator", type(item).__name__)
            raise DataFormatError(f"filters: operator {str(getattr(operator, 'value', operator))[:40]!r} is not "
                                  "supported (memento filters take == != > >= < <= in nin text_match under "
                                  "AND/OR/NOT)")
    if not parts:
        return {}
    if filters.condition == FilterCondition.NOT:  # none of them holds
        return {"NOT": parts[0] if len(parts) == 1 else {"OR": parts}}
    return parts[0] if len(parts) == 1 else {"OR" if filters.condition == FilterCondition.OR else "AND": parts}


_BASE_ARGUMENTS = ("callback_manager", "object_map", "objects", "verbose")
"""LlamaIndex ``BaseRetriever``'s own arguments, passed on."""


class MementoRetriever(BaseRetriever):
    """``selector.select(query, k, mode, env, track=track, scope=scope, filter=filter)`` as a LlamaIndex retriever;
    see the module docstring. ``filters`` (LlamaIndex ``MetadataFilters``) is ANDed with ``filter``;
    ``llm_metadata_keys`` / ``embed_metadata_keys`` name the metadata the LLM / the embedding sees (none by
    default)."""

    def __init__(self, selector: Any, k: int = 4, mode: Literal["sample", "greedy"] = "greedy",
                 env: str | None = None, on_select: Callable[[Any], None] | None = None, *, track: bool = False,
                 score: ScoreKind = "policy", scope: dict[str, Any] | None = None,
                 filter: dict[str, Any] | None = None, filters: MetadataFilters | None = None,
                 llm_metadata_keys: Sequence[str] = (), embed_metadata_keys: Sequence[str] = (),
                 include_global: bool = False, **kwargs: Any):
        check_unknown(kwargs, _BASE_ARGUMENTS, "MementoRetriever")
        if not isinstance(include_global, bool):
            raise DataFormatError(f"MementoRetriever: include_global must be true or false, got {include_global!r}")
        k = check_k(k, "MementoRetriever")
        check_retriever_options(mode, track, score)
        if filters is not None:
            try:
                native = metadata_filters_json(filters)
            except DataFormatError as error:
                raise DataFormatError(f"MementoRetriever: {error}") from None
            filter = native if not filter else ({"AND": [filter, native]} if native else filter)
        possible, owner, where = select_where(scope, filter)
        self.llm_metadata_keys = check_metadata_keys(llm_metadata_keys, "MementoRetriever", "llm_metadata_keys")
        self.embed_metadata_keys = check_metadata_keys(embed_metadata_keys, "MementoRetriever", "embed_metadata_keys")
        super().__init__(**kwargs)
        self.selector, self.k, self.mode, self.env, self.on_select = selector, k, mode, env, on_select
        self.track, self.score = track, score
        self.possible, self.scope, self.filter, self.include_global = possible, owner, where, include_global

    def _node(self, case: Any, metadata: dict[str, Any]) -> TextNode:
        return TextNode(id_=case.id, text=case_text(case), metadata=metadata,
                        excluded_llm_metadata_keys=[key for key in METADATA_KEYS if key not in self.llm_metadata_keys],
                        excluded_embed_metadata_keys=[key for key in METADATA_KEYS
                                                      if key not in self.embed_metadata_keys])

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        if not self.possible:  # the scope and the filter name two owners: nothing matches
            return []
        result = self.selector.select(query_bundle.query_str, k=self.k, mode=self.mode, env=self.env,
                                      track=self.track, scope=self.scope, filter=self.filter,
                                      include_global=self.include_global)
        if self.on_select is not None:
            self.on_select(result)
        return [NodeWithScore(node=self._node(case, metadata), score=relevance)
                for case, relevance, metadata in case_metadata(result, self.score)]

    def feedback(self, selection: str | Sequence[NodeWithScore], reward: float) -> dict[str, Any]:
        """Report the reward in [0, 1] of what was done with one retrieval (its nodes, or its selection id) made with
        ``track=True``; returns the selector's answer (``Selector.feedback``)."""
        return dict(self.selector.feedback(selection_id_of(selection), reward))
