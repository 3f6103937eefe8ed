"""Retrievers over a loaded selector for agent frameworks (each in its own extra, imported on first use):

- :class:`memento.adapters.langchain.MementoRetriever`: a LangChain ``BaseRetriever`` (``memento-mdp[langchain]``);
- :class:`memento.adapters.llamaindex.MementoRetriever`: a LlamaIndex ``BaseRetriever`` (``memento-mdp[llamaindex]``);
- :class:`memento.adapters.langchain.MementoVectorStore`: a LangChain ``VectorStore`` over the selector's bank
  (``add_texts``, ``similarity_search(filter=...)``, ``delete``, ``as_retriever(search_kwargs=...)``): a plain
  cosine search, no policy.

Both turn ``selector.select(query, k, mode, env, track=track, scope=scope, filter=filter)`` into the framework's
documents/nodes (text ``Task: ...`` / ``Action: ...``; metadata: case id, reward, env, kind, score, q, similarity,
prob, selection_id, mode, policy_version, and the case's user/agent/session when set). ``scope``
(``{"user", "agent", "session"}``) and ``filter`` (on the cases' meta: ``{"topic": "geo"}``,
``{"topic": {"in": [...]}}``, ``{"AND": [...]}``, ``{"OR": [...]}``; :mod:`memento.memory.where`) restrict the
candidates: a field on both retrievers, and per call on LangChain's (``retriever.invoke(query, scope=...,
filter=..., k=...)``); the LlamaIndex retriever also takes LlamaIndex's own ``MetadataFilters`` (``==`` and ``in``,
AND/OR). A scope or filter that matches nothing retrieves nothing. They behave as retrievers by default:

- ``mode="greedy"``: the top ``k`` cases by the policy's Q-value, so one query gives the same documents every
  time (as long as the bank and the policy do not change);
- ``track=False``: nothing is written; no pending selection is recorded and ``selection_id`` is ``None``
  (``feedback`` then raises ``MementoError``);
- the relevance ``score`` (``Document.metadata["score"]``, ``NodeWithScore.score``) is ``sigmoid(Q)``, the
  policy's estimate of the probability that the task succeeds with the case (``score="similarity"``: the cosine
  similarity to the query instead); the draw probability stays in ``metadata["prob"]`` (1.0 in greedy mode).

To let the selector learn from outcomes, opt in with ``track=True`` (each retrieval is then recorded as a
pending selection, kept ``pending_ttl_s`` seconds at most, ``max_pending`` of them at most) and send
``retriever.feedback(selection_id_or_documents, reward)``; add ``mode="sample"`` to explore (it draws from
``softmax(Q / alpha)``, so one query gives different documents). Sampling without ``track=True`` is refused: its
exploration could never be learned from. Importing this package imports neither framework.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from memento.errors import ConfigError, MementoError
from memento.memory.where import as_scope, parse_filter
from memento.types import SCOPE_FIELDS, Case

__all__ = ["ScoreKind", "case_metadata", "case_text", "check_retriever_options", "check_where", "missing_extra",
           "selection_id_of"]

ScoreKind = Literal["success", "similarity"]
_SCORES = ("success", "similarity")


def case_text(case: Case) -> str:
    """What a retrieved case reads as in a prompt: ``Task: <state>`` and ``Action: <action>`` on two lines."""
    return f"Task: {case.state}\nAction: {case.action}"


def missing_extra(framework: str, extra: str, module: str) -> MementoError:
    """The one-line error for a framework that is not installed."""
    return MementoError(f"memento.adapters.{extra} needs {framework} ({module} is not installed): "
                        f"pip install 'memento-mdp[{extra}]'")


def check_retriever_options(mode: Any, track: Any, score: Any) -> None:
    """A retriever's ``mode``, ``track`` and ``score``, checked (``ConfigError``, a ``ValueError``): sampling is
    exploration for the learner, so ``mode="sample"`` needs ``track=True``."""
    if mode not in ("sample", "greedy"):
        raise ConfigError(f"MementoRetriever: mode must be 'sample' or 'greedy', got {str(mode)[:80]!r}")
    if not isinstance(track, bool):
        raise ConfigError(f"MementoRetriever: track must be true or false, got {type(track).__name__}")
    if score not in _SCORES:
        raise ConfigError(f"MementoRetriever: score must be one of {_SCORES}, got {str(score)[:80]!r}")
    if mode == "sample" and not track:
        raise ConfigError("MementoRetriever: mode='sample' explores for the learner and needs track=True (each "
                          "retrieval recorded for feedback); use mode='greedy' to retrieve only")


def check_where(scope: Any, filter: Any, who: str = "MementoRetriever") -> tuple[dict[str, str] | None,
                                                                                   Any | None]:
    """A retriever's ``scope`` and ``filter``, checked now (``DataFormatError``, a ``ValueError``, naming ``who``)
    rather than at the first retrieval; returned as JSON (``None`` when empty)."""
    try:
        owner, where = as_scope(scope), parse_filter(filter)
    except MementoError as error:
        raise type(error)(f"{who}: {error}") from None
    return (None if owner is None else owner.to_json()), (None if where is None else where.to_json())


def _sigmoid(q: float) -> float:
    return 1.0 / (1.0 + math.exp(-q)) if q >= 0 else math.exp(q) / (1.0 + math.exp(q))


def case_metadata(result: Any, score: ScoreKind) -> list[tuple[Case, float | None, dict[str, Any]]]:
    """Each chosen case of a :class:`~memento.selector.runtime.SelectionResult` with its relevance score (see the
    package docstring; ``None`` from a selector that gives no scores) and its metadata, in the order chosen."""
    out = []
    for i, (case, prob) in enumerate(zip(result.cases, result.probs)):
        q = float(result.scores[i]) if i < len(result.scores) else None
        similarity = float(result.similarities[i]) if i < len(result.similarities) else None
        relevance = similarity if score == "similarity" else (None if q is None else _sigmoid(q))
        out.append((case, relevance,
                    {"id": case.id, "reward": case.reward, "env": case.env, "kind": case.kind,
                     "score": relevance, "q": q, "similarity": similarity, "prob": float(prob),
                     "selection_id": result.selection_id, "mode": result.mode,
                     "policy_version": result.policy_version,
                     **{name: value for name, value in zip(SCOPE_FIELDS, case.scope) if value is not None}}))
    return out


def selection_id_of(selection: Any) -> str:
    """The selection id of a retrieval: the id itself, or the documents/nodes one retrieval returned (each
    carries ``metadata["selection_id"]``); documents of several retrievals, or none, or of a retrieval made
    without ``track=True``, raise ``MementoError``."""
    if selection is None:
        raise MementoError("feedback: the selection id is None (retrieved with track=False: nothing was "
                           "recorded); make the retriever with track=True to give feedback")
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
    if None in ids:
        raise MementoError("feedback: these documents were retrieved with track=False (no selection was "
                           "recorded); make the retriever with track=True to give feedback")
    if len(ids) != 1:
        raise MementoError(f"feedback: the documents come from {len(ids)} retrievals; give those of one "
                           "retrieval, or its selection id")
    return ids.pop()
