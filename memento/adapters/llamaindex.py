"""A LlamaIndex retriever over a loaded selector (the ``llamaindex`` extra: ``llama-index-core``)::

    from memento.adapters.llamaindex import MementoRetriever
    retriever = MementoRetriever(memento.load_selector(path, learn=True), k=4)
    nodes = retriever.retrieve("What is the capital of Peru?")  # NodeWithScore, score = the case's probability
    retriever.feedback(nodes, reward=1.0)                       # or retriever.feedback(selection_id, 1.0)

Each node is a ``TextNode`` with text ``"Task: <state>\\nAction: <action>"``, ``id_`` the case id and
``metadata`` ``{id, reward, env, kind, prob, selection_id, mode, policy_version}``; it works wherever LlamaIndex
takes a retriever (``RetrieverQueryEngine``, ``aretrieve``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

from memento.adapters import case_text, missing_extra, selection_id_of
from memento.errors import DataFormatError

try:
    from llama_index.core.retrievers import BaseRetriever
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
except ImportError:
    raise missing_extra("LlamaIndex", "llamaindex", "llama-index-core") from None

__all__ = ["MementoRetriever"]


class MementoRetriever(BaseRetriever):
    """``selector.select(query, k, mode, env)`` as a LlamaIndex retriever; see the module docstring."""

    def __init__(self, selector: Any, k: int = 4, mode: Literal["sample", "greedy"] = "sample",
                 env: str | None = None, on_select: Callable[[Any], None] | None = None, **kwargs: Any):
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise DataFormatError(f"MementoRetriever: k must be a positive integer, got {k!r}")
        if mode not in ("sample", "greedy"):
            raise DataFormatError(f"MementoRetriever: mode must be 'sample' or 'greedy', got {mode!r}")
        super().__init__(**kwargs)
        self.selector, self.k, self.mode, self.env, self.on_select = selector, k, mode, env, on_select

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        result = self.selector.select(query_bundle.query_str, k=self.k, mode=self.mode, env=self.env)
        if self.on_select is not None:
            self.on_select(result)
        return [NodeWithScore(node=TextNode(id_=case.id, text=case_text(case),
                                            metadata={"id": case.id, "reward": case.reward, "env": case.env,
                                                      "kind": case.kind, "prob": prob,
                                                      "selection_id": result.selection_id, "mode": result.mode,
                                                      "policy_version": result.policy_version}),
                              score=float(prob))
                for case, prob in zip(result.cases, result.probs)]

    def feedback(self, selection: str | Sequence[NodeWithScore], reward: float) -> dict[str, Any]:
        """Report the reward in [0, 1] of what was done with one retrieval (its nodes, or its selection id);
        returns the selector's answer (``Selector.feedback``)."""
        return dict(self.selector.feedback(selection_id_of(selection), reward))
