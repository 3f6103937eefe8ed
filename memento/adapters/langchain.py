"""A LangChain retriever over a loaded selector (the ``langchain`` extra: ``langchain-core``)::

    from memento.adapters.langchain import MementoRetriever
    retriever = MementoRetriever(selector=memento.load_selector(path), k=4)
    docs = retriever.invoke("What is the capital of Peru?")     # the top 4 by Q; the same every time, nothing written

    learner = MementoRetriever(selector=memento.load_selector(path, learn=True), k=4, track=True, mode="sample")
    docs = learner.invoke("What is the capital of Peru?")       # explores; recorded for feedback
    ...                                                          # the agent solves the task with them
    learner.feedback(docs, reward=1.0)                           # or learner.feedback(selection_id, 1.0)

Scoped and filtered (:mod:`memento.adapters`)::

    alice = MementoRetriever(selector=selector, scope={"user": "alice"}, filter={"topic": {"in": ["geo", "sci"]}})
    docs = alice.invoke("What is the capital of Peru?")                      # only alice's geo/sci cases
    docs = retriever.invoke("...", scope={"user": "bob"}, filter={"topic": "geo"}, k=2)   # per call

Each ``Document``: ``page_content`` ``"Task: <state>\\nAction: <action>"``, ``id`` the case id, ``metadata``
``{id, reward, env, kind, score, q, similarity, prob, selection_id, mode, policy_version, user?, agent?,
session?}``: ``score`` the
relevance (``sigmoid(Q)``, or the cosine with ``score="similarity"``), ``prob`` the draw probability,
``selection_id`` ``None`` unless ``track=True`` (see :mod:`memento.adapters` for the defaults). ``on_select``
(optional) is called with each :class:`memento.selector.runtime.SelectionResult`.
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
    from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun, CallbackManagerForRetrieverRun
    from langchain_core.documents import Document
    from langchain_core.retrievers import BaseRetriever
    from langchain_core.runnables.config import run_in_executor
    from pydantic import ConfigDict, Field, model_validator
except ImportError:
    raise missing_extra("LangChain", "langchain", "langchain-core") from None

__all__ = ["MementoRetriever"]


class MementoRetriever(BaseRetriever):
    """``selector.select(query, k, mode, env, track=track, scope=scope, filter=filter)`` as a LangChain retriever;
    see the module docstring. ``invoke(query, scope=..., filter=..., k=...)`` overrides the fields for one call."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    selector: Any = Field(description="a loaded memento Selector")
    k: int = Field(4, ge=1, description="cases per query")
    mode: Literal["sample", "greedy"] = Field("greedy", description="greedy: the top k by Q (a retriever); "
                                              "sample: explore (needs track=True)")
    track: bool = Field(False, description="record each retrieval as a pending selection so feedback() can follow")
    score: ScoreKind = Field("success", description="metadata['score']: sigmoid(Q), or the cosine similarity")
    env: str | None = None
    scope: dict[str, Any] | None = Field(None, description='only cases of this scope: {"user", "agent", "session"}')
    filter: dict[str, Any] | None = Field(None, description='only cases whose meta match, e.g. {"topic": "geo"}')
    on_select: Callable[[Any], None] | None = None

    @model_validator(mode="after")
    def _sample_needs_track(self) -> MementoRetriever:
        check_retriever_options(self.mode, self.track, self.score)  # a ConfigError is a ValueError: pydantic reports it
        check_where(self.scope, self.filter)
        return self

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun,
                                scope: dict[str, Any] | None = None, filter: dict[str, Any] | None = None,
                                k: int | None = None) -> list[Document]:
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise DataFormatError(f"MementoRetriever: k must be a positive integer, got {str(k)[:80]}")
        result = self.selector.select(query, k=self.k if k is None else k, mode=self.mode, env=self.env,
                                      track=self.track, scope=self.scope if scope is None else scope,
                                      filter=self.filter if filter is None else filter)
        if self.on_select is not None:
            self.on_select(result)
        return [Document(page_content=case_text(case), id=case.id, metadata=metadata)
                for case, _, metadata in case_metadata(result, self.score)]

    async def _aget_relevant_documents(self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun,
                                       scope: dict[str, Any] | None = None, filter: dict[str, Any] | None = None,
                                       k: int | None = None) -> list[Document]:
        # LangChain's default drops the per-call arguments; run the sync retrieval in its executor with them
        return await run_in_executor(None, self._get_relevant_documents, query, run_manager=run_manager.get_sync(),
                                     scope=scope, filter=filter, k=k)

    def feedback(self, selection: str | Sequence[Document], reward: float) -> dict[str, Any]:
        """Report the reward in [0, 1] of what was done with one retrieval (its documents, or its selection id) made
        with ``track=True``; returns the selector's answer (``Selector.feedback``)."""
        return dict(self.selector.feedback(selection_id_of(selection), reward))
