"""Retrievers over a loaded selector for agent frameworks (each in its own extra, imported on first use):

- :class:`memento.adapters.langchain.MementoRetriever`: a LangChain ``BaseRetriever`` (``memento-mdp[langchain]``);
- :class:`memento.adapters.llamaindex.MementoRetriever`: a LlamaIndex ``BaseRetriever`` (``memento-mdp[llamaindex]``);
- :class:`memento.adapters.langchain.MementoVectorStore`: a LangChain ``VectorStore`` over the selector's bank
  (``add_texts``, ``similarity_search(filter=...)``, ``delete``, ``as_retriever(search_kwargs=...)``): a plain
  cosine search, no policy.

Both turn ``selector.select(query, k, mode, env, track=track, scope=scope, filter=filter)`` into the framework's
documents/nodes (text ``Task: ...`` / ``Action: ...``; metadata :data:`METADATA_KEYS`: case id, reward, env, kind,
score, q, similarity, prob, policy_prob, selection_id, mode, policy_version, and the case's user/agent/session
when set). ``scope`` (``{"user", "agent", "session"}``) and ``filter`` (on the cases' meta: ``{"topic": "geo"}``,
``{"topic": {"in": [...]}}``, ``{"AND": [...]}``, ``{"OR": [...]}``; :mod:`memento.bank.where`) restrict the
candidates: a field on both retrievers, and per call on LangChain's (``retriever.invoke(query, scope=...,
filter=..., k=..., score_threshold=...)``, or ``search_kwargs``); the LlamaIndex retriever also takes LlamaIndex's
own ``MetadataFilters`` (``==`` and ``in``, AND/OR). A top-level string equality on ``user``, ``agent`` or
``session`` in a filter (or in one part of a top-level AND) selects the scope, as the metadata shows it (two
different owners match nothing). A scope or filter that matches nothing retrieves nothing. An argument an adapter
does not know is refused in one line (``DataFormatError``), never dropped. They behave as retrievers by default:

- ``mode="greedy"``: the top ``k`` cases by the policy's Q-value, so one query gives the same documents every
  time (as long as the bank and the policy do not change);
- ``track=False``: nothing is written; no pending selection is recorded and ``selection_id`` is ``None``
  (``feedback`` then raises ``MementoError``);
- the relevance ``score`` (``Document.metadata["score"]``, ``NodeWithScore.score``) is ``score="policy"``: the
  policy's probability of choosing the case, ``softmax(Q / alpha)`` over the candidate set the selector scored
  (the top ``config.candidates`` by cosine, within the scope and filter), i.e. the case's first-draw probability
  in ``mode="sample"``, reported in greedy mode too (``metadata["policy_prob"]``). It is in (0, 1], higher for a
  higher Q (so in the greedy order), and sums to at most 1 over the documents: a cutoff of 0.1 keeps the cases
  the policy would draw first at least one time in ten. It is not a probability of success, and it depends on
  the candidate set (a narrow filter leaves fewer candidates, each more likely). ``score="success"`` is
  ``sigmoid(Q)`` (the Q-network's logit of success: about 0.9999 for every case of the shipped selector, whose Q
  is 10-13, so no cutoff separates them); ``score="similarity"`` is the cosine similarity to the query. The draw
  probability stays in ``metadata["prob"]`` (1.0 in greedy mode).

To let the selector learn from outcomes, opt in with ``track=True`` (each retrieval is then recorded as a
pending selection, kept ``pending_ttl_s`` seconds at most, ``max_pending`` of them at most) and send
``retriever.feedback(selection_id_or_documents, reward)``; add ``mode="sample"`` to explore (it draws from
``softmax(Q / alpha)``, so one query gives different documents). Sampling without ``track=True`` is refused: its
exploration could never be learned from. Importing this package imports neither framework.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from memento.bank.where import as_scope, parse_filter
from memento.errors import ConfigError, DataFormatError, MementoError
from memento.extras import install_hint
from memento.types import SCOPE_FIELDS, Case

__all__ = ["METADATA_KEYS", "ScoreKind", "above", "case_metadata", "case_text", "check_k", "check_metadata_keys",
           "check_retriever_options", "check_threshold", "check_unknown", "check_where", "missing_extra",
           "select_where", "selection_id_of", "split_where"]

ScoreKind = Literal["policy", "success", "similarity"]
_SCORES = ("policy", "success", "similarity")

METADATA_KEYS = ("id", "reward", "env", "kind", "score", "q", "similarity", "prob", "policy_prob", "selection_id",
                 "mode", "policy_version", *SCOPE_FIELDS)
"""The metadata keys of a retrieved document or node (``user``/``agent``/``session`` only when the case has them)."""


def case_text(case: Case) -> str:
    """What a retrieved case reads as in a prompt: ``Task: <state>`` and ``Action: <action>`` on two lines."""
    return f"Task: {case.state}\nAction: {case.action}"


def missing_extra(framework: str, extra: str, module: str) -> MementoError:
    """The one-line error for a framework that is not installed."""
    return MementoError(f"memento.adapters.{extra} needs {framework} ({module} is not installed): "
                        + install_hint(extra))


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


def check_unknown(given: Iterable[str], known: Iterable[str], who: str, what: str = "argument") -> None:
    """Refuse, in one line (``DataFormatError``), the names in ``given`` that are not ``known``."""
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise DataFormatError(f"{who}: unknown {what}(s) {unknown} (known: {', '.join(known)})")


def check_k(k: Any, who: str, name: str = "k") -> int:
    """A positive integer count (``DataFormatError`` naming ``who`` otherwise)."""
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
        raise DataFormatError(f"{who}: {name} must be a positive integer, got {str(k)[:80]}")
    return int(k)


def check_threshold(value: Any, who: str) -> float | None:
    """A score cutoff: ``None`` (none) or a finite real number (``DataFormatError`` naming ``who`` otherwise)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise DataFormatError(f"{who}: score_threshold must be a number, got {str(value)[:80]!r}")
    return float(value)


def check_metadata_keys(keys: Any, who: str, name: str) -> tuple[str, ...]:
    """Metadata key names to show (a sequence of :data:`METADATA_KEYS`), checked (``DataFormatError``)."""
    if isinstance(keys, str) or not isinstance(keys, Iterable) or not all(isinstance(k, str) for k in keys):
        raise DataFormatError(f"{who}: {name} must be a list of metadata key names, got {str(keys)[:80]}")
    keys = tuple(keys)
    check_unknown(keys, METADATA_KEYS, f"{who}: {name}", "key")
    return keys


def split_where(scope: Any, filter: Any) -> tuple[bool, dict[str, Any] | None, Any]:
    """A search's ``scope`` and ``filter`` with the filter's scope equalities moved into the scope: a top-level
    key ``user``/``agent``/``session`` whose value is a string (of the filter object, or of an object in a
    top-level ``{"AND": [...]}``). Returns whether anything can match (two different owners cannot), the scope
    (``None`` when empty) and the rest of the filter (``None`` when empty); neither is checked here."""
    owner = dict(scope) if isinstance(scope, Mapping) else scope
    if not isinstance(filter, Mapping) or not isinstance(owner, (dict, type(None))):
        return True, owner or None, filter  # malformed: checked (and refused) by check_where
    owner = owner or {}

    def take(part: Mapping[str, Any]) -> dict[str, Any] | None:
        rest = {}
        for key, value in part.items():
            if key in SCOPE_FIELDS and isinstance(value, str):
                if owner.get(key, value) != value:
                    return None
                owner[key] = value
            else:
                rest[key] = value
        return rest

    if set(filter) == {"AND"} and isinstance(filter["AND"], list):
        parts = []
        for item in filter["AND"]:
            rest = take(item) if isinstance(item, Mapping) and not {"AND", "OR"} & set(item) else item
            if rest is None:
                return False, None, None
            if rest != {}:
                parts.append(rest)
        remaining: Any = {"AND": parts} if len(parts) > 1 else (parts[0] if parts else None)
    elif {"AND", "OR"} & set(filter):
        remaining = filter
    else:
        remaining = take(filter)
        if remaining is None:
            return False, None, None
    return True, owner or None, remaining or None


def select_where(scope: Any, filter: Any, who: str = "MementoRetriever") -> tuple[bool, dict[str, str] | None,
                                                                                  Any | None]:
    """:func:`split_where`, then :func:`check_where`: whether anything can match, the scope and the filter as
    JSON."""
    possible, owner, rest = split_where(scope, filter)
    if not possible:
        check_where(scope, filter, who)  # still refuse a malformed one
        return False, None, None
    return (True, *check_where(owner, rest, who))


def _sigmoid(q: float) -> float:
    return 1.0 / (1.0 + math.exp(-q)) if q >= 0 else math.exp(q) / (1.0 + math.exp(q))


def case_metadata(result: Any, score: ScoreKind) -> list[tuple[Case, float | None, dict[str, Any]]]:
    """Each chosen case of a :class:`~memento.selector.runtime.SelectionResult` with its relevance score (see the
    package docstring; ``None`` from a selector that gives no such score) and its metadata, in the order chosen."""
    out = []
    policy_probs = getattr(result, "policy_probs", ())
    for i, (case, prob) in enumerate(zip(result.cases, result.probs)):
        q = float(result.scores[i]) if i < len(result.scores) else None
        similarity = float(result.similarities[i]) if i < len(result.similarities) else None
        policy_prob = float(policy_probs[i]) if i < len(policy_probs) else None
        relevance = {"policy": policy_prob, "similarity": similarity,
                     "success": None if q is None else _sigmoid(q)}[score]
        out.append((case, relevance,
                    {"id": case.id, "reward": case.reward, "env": case.env, "kind": case.kind,
                     "score": relevance, "q": q, "similarity": similarity, "prob": float(prob),
                     "policy_prob": policy_prob, "selection_id": result.selection_id, "mode": result.mode,
                     "policy_version": result.policy_version,
                     **{name: value for name, value in zip(SCOPE_FIELDS, case.scope) if value is not None}}))
    return out


def above(rows: list[tuple[Case, float | None, dict[str, Any]]], threshold: float | None
          ) -> list[tuple[Case, float | None, dict[str, Any]]]:
    """The rows whose score is at least ``threshold`` (all of them when it is ``None``; a row without a score
    never passes a threshold)."""
    if threshold is None:
        return rows
    return [row for row in rows if row[1] is not None and row[1] >= threshold]


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
