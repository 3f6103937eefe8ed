"""A LangChain retriever over a loaded selector (the ``langchain`` extra: ``langchain-core``)::

    from memento.adapters.langchain import MementoRetriever
    retriever = MementoRetriever(selector=memento.load_selector(path, learn=True), k=4)
    docs = retriever.invoke("What is the capital of Peru?")     # Documents, in the order chosen
    ...                                                          # the agent solves the task with them
    retriever.feedback(docs, reward=1.0)                         # or retriever.feedback(selection_id, 1.0)

Each ``Document``: ``page_content`` ``"Task: <state>\\nAction: <action>"``, ``id`` the case id, ``metadata``
``{id, reward, env, kind, prob, selection_id, mode, policy_version}``. ``on_select`` (optional) is called with each
:class:`memento.selector.runtime.SelectionResult`, e.g. to keep selection ids for later feedback.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

from memento.adapters import case_text, missing_extra, selection_id_of

try:
    from langchain_core.callbacks import CallbackManagerForRetrieverRun
    from langchain_core.documents import Document
    from langchain_core.retrievers import BaseRetriever
    from pydantic import ConfigDict, Field
except ImportError:
    raise missing_extra("LangChain", "langchain", "langchain-core") from None

__all__ = ["MementoRetriever"]


class MementoRetriever(BaseRetriever):
    """``selector.select(query, k, mode, env)`` as a LangChain retriever; see the module docstring."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    selector: Any = Field(description="a loaded memento Selector")
    k: int = Field(4, ge=1, description="cases per query")
    mode: Literal["sample", "greedy"] = "sample"
    env: str | None = None
    on_select: Callable[[Any], None] | None = None

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        result = self.selector.select(query, k=self.k, mode=self.mode, env=self.env)
        if self.on_select is not None:
            self.on_select(result)
        return [Document(page_content=case_text(case), id=case.id,
                         metadata={"id": case.id, "reward": case.reward, "env": case.env, "kind": case.kind,
                                   "prob": prob, "selection_id": result.selection_id, "mode": result.mode,
                                   "policy_version": result.policy_version})
                for case, prob in zip(result.cases, result.probs)]

    def feedback(self, selection: str | Sequence[Document], reward: float) -> dict[str, Any]:
        """Report the reward in [0, 1] of what was done with one retrieval (its documents, or its selection id);
        returns the selector's answer (``Selector.feedback``)."""
        return dict(self.selector.feedback(selection_id_of(selection), reward))
