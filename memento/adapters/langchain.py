"""A LangChain retriever over a loaded selector (the ``langchain`` extra: ``langchain-core``)::

    from memento.adapters.langchain import MementoRetriever
    retriever = MementoRetriever(selector=memento.load_selector(path), k=4)
    docs = retriever.invoke("What is the capital of Peru?")     # the top 4 by Q; the same every time, nothing written

    learner = MementoRetriever(selector=memento.load_selector(path, learn=True), k=4, track=True, mode="sample")
    docs = learner.invoke("What is the capital of Peru?")       # explores; recorded for feedback
    ...                                                          # the agent solves the task with them
    learner.feedback(docs, reward=1.0)                           # or learner.feedback(selection_id, 1.0)

Scoped, filtered and cut off (:mod:`memento.adapters`)::

    alice = MementoRetriever(selector=selector, scope={"user": "alice"}, filter={"topic": {"in": ["geo", "sci"]}})
    docs = alice.invoke("What is the capital of Peru?")                      # only alice's geo/sci cases
    docs = retriever.invoke("...", scope={"user": "bob"}, filter={"topic": "geo"}, k=2)   # per call
    likely = MementoRetriever(selector=selector, search_kwargs={"k": 8, "score_threshold": 0.1})

``search_kwargs`` takes what LangChain's ``VectorStoreRetriever`` does that applies to a learned selection:
``k``, ``score_threshold``, ``filter``, plus ``scope`` and ``env``; each is also a field (give it once) and a
per-call argument of ``invoke``. MMR's ``fetch_k``/``lambda_mult``, and any other key or argument, are refused in
one line (``DataFormatError``); MMR is :class:`MementoVectorStore`'s.

A LangChain ``VectorStore`` over a selector's bank, :class:`MementoVectorStore` (a plain cosine search: no
policy, nothing recorded; see its docstring)::

    store = MementoVectorStore(selector)
    store.add_texts(["What is the capital of Peru?"], [{"action": "Lima", "user": "alice", "topic": "geo"}])
    store.similarity_search("capital of Peru", k=2, filter={"user": "alice", "topic": {"in": ["geo"]}})
    store.as_retriever(search_kwargs={"k": 2, "filter": {"topic": "geo"}}).invoke("capital of Peru")
    store.as_retriever(search_type="mmr", search_kwargs={"k": 4, "fetch_k": 20, "lambda_mult": 0.5})
    store.similarity_search_by_vector(store.embeddings.embed_query("capital of Peru"), k=2)

Each ``Document`` of :class:`MementoRetriever`: ``page_content`` ``"Task: <state>\\nAction: <action>"``, ``id``
the case id, ``metadata`` ``{id, reward, env, kind, score, q, similarity, prob, policy_prob, selection_id, mode,
policy_version, user?, agent?, session?}``: ``score`` the relevance, by default the policy's probability of the
case, ``softmax(Q / alpha)`` over the candidate set (in (0, 1], higher for a higher Q, at most 1 summed over the
documents; ``score="success"``: ``sigmoid(Q)``, ``score="similarity"``: the cosine; see :mod:`memento.adapters`),
``score_threshold`` a cutoff on it, ``prob`` the draw probability (1.0 in greedy mode), ``selection_id`` ``None``
unless ``track=True``. ``on_select`` (optional) is called with each
:class:`memento.selector.runtime.SelectionResult`.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal

import numpy as np

from memento.adapters import (
    ScoreKind,
    above,
    case_metadata,
    case_text,
    check_k,
    check_retriever_options,
    check_threshold,
    check_unknown,
    check_where,
    missing_extra,
    select_where,
    selection_id_of,
)
from memento.bank.where import as_scope
from memento.errors import DataFormatError
from memento.types import SCOPE_FIELDS, Case, check_id, check_reward, check_text

try:
    from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun, CallbackManagerForRetrieverRun
    from langchain_core.documents import Document
    from langchain_core.embeddings import Embeddings
    from langchain_core.retrievers import BaseRetriever
    from langchain_core.runnables.config import run_in_executor
    from langchain_core.vectorstores import VectorStore
    from langchain_core.vectorstores.utils import maximal_marginal_relevance
    from pydantic import ConfigDict, Field, model_validator
except ImportError:
    raise missing_extra("LangChain", "langchain", "langchain-core") from None

__all__ = ["MementoEmbeddings", "MementoRetriever", "MementoVectorStore"]

_SEARCH_KEYS = ("k", "score_threshold", "filter", "scope", "include_global", "env")
"""What :class:`MementoRetriever` takes in ``search_kwargs`` and per call."""
_MMR_KEYS = ("fetch_k", "lambda_mult")


class MementoRetriever(BaseRetriever):
    """``selector.select(query, k, mode, env, track=track, scope=scope, filter=filter)`` as a LangChain retriever;
    see the module docstring. ``invoke(query, k=..., score_threshold=..., filter=..., scope=..., include_global=...,
    env=...)``
    overrides the fields for one call; ``search_kwargs`` (LangChain's) sets the same fields at construction."""

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    selector: Any = Field(description="a loaded memento Selector")
    k: int = Field(4, ge=1, description="cases per query")
    mode: Literal["sample", "greedy"] = Field("greedy", description="greedy: the top k by Q (a retriever); "
                                              "sample: explore (needs track=True)")
    track: bool = Field(False, description="record each retrieval as a pending selection so feedback() can follow")
    score: ScoreKind = Field("policy", description="metadata['score']: the policy's probability softmax(Q/alpha) "
                             "over the candidates; sigmoid(Q) ('success'); or the cosine ('similarity')")
    score_threshold: float | None = Field(None, description="keep only the documents whose score is at least this")
    env: str | None = None
    scope: dict[str, Any] | None = Field(None, description='only cases of this scope: {"user", "agent", "session"}')
    filter: dict[str, Any] | None = Field(None, description='only cases whose meta match, e.g. {"topic": "geo"}')
    include_global: bool = Field(False, description="beside a scope, also the cases without any owner")
    search_kwargs: dict[str, Any] = Field(default_factory=dict, description="LangChain's search arguments: k, "
                                          "score_threshold, filter, scope, include_global, env (each also a "
                                          "field: give it once)")
    on_select: Callable[[Any], None] | None = None

    def __init__(self, **data: Any) -> None:
        # checked here, not by pydantic, so that each is one line: an unknown argument, and search_kwargs
        check_unknown(data, type(self).model_fields, "MementoRetriever")
        search = data.get("search_kwargs")
        if search is not None:
            if not isinstance(search, Mapping):
                raise DataFormatError("MementoRetriever: search_kwargs must be a dict such as {\"k\": 2}, got "
                                      f"{type(search).__name__}")
            mmr = sorted(set(search) & set(_MMR_KEYS))
            if mmr:
                raise DataFormatError(f"MementoRetriever: search_kwargs {mmr} are MMR's; the learned selection does "
                                      "not diversify by MMR (MementoVectorStore(selector).as_retriever("
                                      "search_type='mmr') does)")
            check_unknown(search, _SEARCH_KEYS, "MementoRetriever: search_kwargs", "key")
            twice = sorted(key for key in search if key in data and data[key] != search[key])
            if twice:
                raise DataFormatError(f"MementoRetriever: {', '.join(twice)} is given twice (as an argument and in "
                                      "search_kwargs, with different values); give it once")
            if "k" in search:
                check_k(search["k"], "MementoRetriever: search_kwargs")
            check_threshold(search.get("score_threshold"), "MementoRetriever: search_kwargs")
            data = {**data, **search, "search_kwargs": dict(search)}
        super().__init__(**data)

    @model_validator(mode="after")
    def _sample_needs_track(self) -> MementoRetriever:
        check_retriever_options(self.mode, self.track, self.score)  # a ConfigError is a ValueError: pydantic reports it
        check_threshold(self.score_threshold, "MementoRetriever")
        select_where(self.scope, self.filter)
        return self

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun,
                                **kwargs: Any) -> list[Document]:
        check_unknown(kwargs, _SEARCH_KEYS, "MementoRetriever.invoke")
        k = self.k if kwargs.get("k") is None else check_k(kwargs["k"], "MementoRetriever")
        threshold = (check_threshold(kwargs["score_threshold"], "MementoRetriever") if "score_threshold" in kwargs
                     else self.score_threshold)
        possible, scope, filter = select_where(self.scope if kwargs.get("scope") is None else kwargs["scope"],
                                               self.filter if kwargs.get("filter") is None else kwargs["filter"])
        if not possible:
            return []
        include_global = self.include_global if kwargs.get("include_global") is None else kwargs["include_global"]
        result = self.selector.select(query, k=k, mode=self.mode, env=kwargs.get("env") or self.env,
                                      track=self.track, scope=scope, filter=filter,
                                      include_global=include_global)
        if self.on_select is not None:
            self.on_select(result)
        return [Document(page_content=case_text(case), id=case.id, metadata=metadata)
                for case, _, metadata in above(case_metadata(result, self.score), threshold)]

    async def _aget_relevant_documents(self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun,
                                       **kwargs: Any) -> list[Document]:
        # LangChain's default drops the per-call arguments; run the sync retrieval in its executor with them
        return await run_in_executor(None, self._get_relevant_documents, query, run_manager=run_manager.get_sync(),
                                     **kwargs)

    def feedback(self, selection: str | Sequence[Document], reward: float) -> dict[str, Any]:
        """Report the reward in [0, 1] of what was done with one retrieval (its documents, or its selection id) made
        with ``track=True``; returns the selector's answer (``Selector.feedback``)."""
        return dict(self.selector.feedback(selection_id_of(selection), reward))


class MementoEmbeddings(Embeddings):
    """A selector's own text encoder as LangChain ``Embeddings``: the vectors its bank holds and searches with
    (``MementoVectorStore.embeddings``; for ``similarity_search_by_vector`` and the MMR search by vector)."""

    def __init__(self, selector: Any):
        self.selector = selector

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """Each text as the selector encodes a query (``DataFormatError`` for an empty or non-text one)."""
        texts = [check_text(text, f"MementoEmbeddings: text {i}") for i, text in enumerate(texts)]
        if not texts:
            return []
        vectors = np.asarray(self.selector.encoder().encode(texts), dtype=np.float32)
        return vectors.reshape(len(texts), -1).tolist()

    def embed_query(self, text: str) -> list[float]:
        return self.embed_documents([text])[0]


_CASE_KEYS = ("action", "reward", "env", *SCOPE_FIELDS)
"""Metadata keys that :meth:`MementoVectorStore.add_texts` stores as case fields, not in ``meta``."""


class MementoVectorStore(VectorStore):
    """A LangChain ``VectorStore`` over a loaded selector's case bank (a plain cosine search with the selector's
    encoder: no policy, no draw, nothing recorded; use :class:`MementoRetriever` for the learned selection).

    :meth:`add_texts` stores each text as a case whose **state** is the text (what is embedded and searched) and
    whose other fields come from the text's metadata: ``action`` (default: the text itself), ``reward`` (default
    ``default_reward``), ``env``, and the scope ``user``/``agent``/``session`` (default: the store's ``scope``); every
    other key goes into the case's ``meta`` (a JSON object), where filters look. Case ids are content hashes
    assigned by the bank (a text already stored with the same action, env and scope gets its stored id), so
    ``ids`` cannot be chosen. A returned ``Document`` has ``id`` the case id, ``page_content`` the state and
    ``metadata`` the meta plus ``action``, ``reward`` and ``env``/``user``/``agent``/``session`` when set: what
    was added comes back.

    ``filter`` (:meth:`similarity_search`, ``as_retriever(search_kwargs={"filter": ...})``) is memento's filter JSON
    (``{"topic": "geo"}``, ``{"topic": {"in": [...]}}``, ``{"AND": [...]}``, ``{"OR": [...]}``); its top-level string
    equalities on ``user``, ``agent`` or ``session`` (also in a top-level AND) select the scope. The store's
    ``scope`` restricts every search. :meth:`delete` forgets cases by id (never all at once).
    ``similarity_search_with_score`` gives the cosine similarity; the relevance score of
    ``similarity_search_with_relevance_scores`` is ``(1 + cosine) / 2``, and ``score_threshold`` (a search argument
    of every search, and of ``as_retriever``'s ``search_kwargs`` with any ``search_type``) is a minimum of that
    relevance. The searches by vector (``similarity_search_by_vector``, ``similarity_search_with_score_by_vector``)
    take a vector of the selector's space, :attr:`embeddings` (the selector's encoder); the maximal marginal
    relevance searches (``max_marginal_relevance_search``, ``..._by_vector``; ``as_retriever(search_type="mmr")``)
    diversify the ``fetch_k`` nearest over the bank's stored embeddings. Every search also takes ``scope=`` and
    ``env=``; any other argument is refused in one line (``DataFormatError``)."""

    def __init__(self, selector: Any, *, scope: Mapping[str, Any] | None = None, default_reward: float = 1.0,
                 env: str | None = None):
        self.selector = selector
        owner, _ = check_where(scope, None, "MementoVectorStore")
        self.scope: dict[str, str] = owner or {}
        self.default_reward = check_reward(default_reward, "MementoVectorStore.default_reward")
        self.env = None if env is None else check_id(env, "MementoVectorStore.env")

    # ------------------------------------------------------------------ writes

    def add_texts(self, texts: Iterable[str], metadatas: list[dict] | None = None, *, ids: list[str] | None = None,
                  **kwargs: Any) -> list[str]:
        """Store each text as a case (see the class docstring); returns the case ids, in order. Every text and
        metadata is checked before the first is written (a bad one raises ``DataFormatError``, nothing added)."""
        if kwargs:
            raise DataFormatError(f"MementoVectorStore.add_texts: unknown argument(s) {sorted(kwargs)}")
        texts = list(texts)
        if ids is not None and any(i is not None for i in ids):
            raise DataFormatError("MementoVectorStore.add_texts: case ids are content hashes assigned by the bank; "
                                  "ids cannot be chosen (leave ids out)")
        if metadatas is not None and len(metadatas) != len(texts):
            raise DataFormatError(f"MementoVectorStore.add_texts: {len(metadatas)} metadatas for {len(texts)} texts")
        rows = [self._case(text, metadatas[i] if metadatas else None, i) for i, text in enumerate(texts)]
        return [self.selector.add_case(c.state, c.action, c.reward, env=c.env, meta=c.meta,
                                       scope={n: v for n, v in zip(SCOPE_FIELDS, c.scope) if v is not None} or None)
                for c in rows]

    def _case(self, text: Any, metadata: Any, i: int) -> Case:
        where = f"MementoVectorStore.add_texts: text {i}"
        if not isinstance(text, str):
            raise DataFormatError(f"{where} is a {type(text).__name__}, not a str")
        if metadata is None:
            metadata = {}
        if not isinstance(metadata, Mapping):
            raise DataFormatError(f"{where}: metadata must be a dict, got {type(metadata).__name__}")
        fields = {key: metadata[key] for key in _CASE_KEYS if metadata.get(key) is not None}
        scope = {**self.scope, **{name: fields[name] for name in SCOPE_FIELDS if name in fields}}
        meta = {key: value for key, value in metadata.items() if key not in _CASE_KEYS}
        try:
            as_scope(scope)
            return Case(state=text, action=fields.get("action", text),
                        reward=fields.get("reward", self.default_reward), env=fields.get("env", self.env),
                        meta=meta, **scope)
        except DataFormatError as error:
            raise DataFormatError(f"{where}: {error}") from None

    def delete(self, ids: list[str] | None = None, **kwargs: Any) -> bool:
        """Forget the cases of ``ids`` (each committed and checkpointed: ``Selector.delete_case``); an unknown id
        raises ``UnknownCaseError`` after the ones before it are deleted. ``ids=None`` (LangChain's "delete all") is
        refused."""
        if kwargs:
            raise DataFormatError(f"MementoVectorStore.delete: unknown argument(s) {sorted(kwargs)}")
        if ids is None:
            raise DataFormatError("MementoVectorStore.delete: give the ids to delete (deleting every case at once "
                                  "is not offered)")
        for case_id in ids:
            self.selector.delete_case(case_id)
        return True

    # ------------------------------------------------------------------ reads

    def _document(self, case: Case) -> Document:
        metadata = {**case.meta, "action": case.action, "reward": case.reward}
        for name in ("env", *SCOPE_FIELDS):
            if getattr(case, name) is not None:
                metadata[name] = getattr(case, name)
        return Document(id=case.id, page_content=case.state, metadata=metadata)

    def _where(self, filter: Mapping[str, Any] | None, scope: Mapping[str, Any] | None
               ) -> tuple[bool, Any, Any]:
        """Whether anything can match, the scope (the store's, the call's, then the filter's top-level
        user/agent/session equalities: :func:`memento.adapters.split_where`) and the rest of the filter."""
        if scope is not None and not isinstance(scope, Mapping):
            raise DataFormatError(f"MementoVectorStore: scope must be an object such as {{\"user\": \"alice\"}}, "
                                  f"got {type(scope).__name__}")
        if filter is not None and not isinstance(filter, Mapping):
            raise DataFormatError(f"filter must be an object such as {{\"topic\": \"geo\"}}, got "
                                  f"{type(filter).__name__}")
        return select_where({**self.scope, **(scope or {})} or None, filter, "MementoVectorStore")

    def _found(self, query: str | np.ndarray, k: Any, filter: Mapping[str, Any] | None, kwargs: dict[str, Any],
               name: str = "k") -> list[tuple[Case, float]]:
        """The cases nearest to ``query`` (a text or a vector) with their cosine: the search behind every read.
        ``kwargs``: ``scope``, ``env`` and ``score_threshold`` (a relevance, ``(1 + cosine) / 2``); any other
        raises ``DataFormatError``."""
        k = check_k(k, "MementoVectorStore", name)
        scope = kwargs.pop("scope", None)
        env = kwargs.pop("env", self.env)
        threshold = check_threshold(kwargs.pop("score_threshold", None), "MementoVectorStore")
        if kwargs:
            raise DataFormatError(f"MementoVectorStore: unknown search argument(s) {sorted(kwargs)} (known: k, "
                                  "filter, scope, env, score_threshold; fetch_k and lambda_mult for MMR)")
        possible, owner, where = self._where(filter, scope)
        if not possible:
            return []
        found = self.selector.search_cases(query, k=k, env=env, scope=owner, filter=where)
        if threshold is not None:
            relevance = self._select_relevance_score_fn()
            found = [(case, similarity) for case, similarity in found if relevance(similarity) >= threshold]
        return found

    @staticmethod
    def _vector(embedding: Any) -> np.ndarray:
        if isinstance(embedding, (str, bytes)) or embedding is None:
            raise DataFormatError("MementoVectorStore: the search by vector takes a list of floats (embed a text "
                                  f"with store.embeddings.embed_query), got {type(embedding).__name__}")
        return np.asarray(embedding, dtype=np.float32) if isinstance(embedding, (list, tuple)) else embedding

    @property
    def embeddings(self) -> MementoEmbeddings:
        """The selector's encoder as LangChain ``Embeddings`` (the space of the bank and of the by-vector searches)."""
        return MementoEmbeddings(self.selector)

    def similarity_search_with_score(self, query: str, k: int = 4, filter: Mapping[str, Any] | None = None,
                                     **kwargs: Any) -> list[tuple[Document, float]]:
        """The ``k`` stored cases nearest to ``query`` by cosine, with the cosine similarity, among those of the
        store's scope (and ``scope=`` if given) whose meta match ``filter``; ``env=`` restricts to one env and
        ``score_threshold=`` keeps those whose relevance ``(1 + cosine) / 2`` is at least it."""
        if not isinstance(query, str):
            raise DataFormatError(f"MementoVectorStore: the query must be a text, got {type(query).__name__} (for "
                                  "a vector: similarity_search_by_vector)")
        return [(self._document(case), float(s)) for case, s in self._found(query, k, filter, dict(kwargs))]

    def similarity_search(self, query: str, k: int = 4, filter: Mapping[str, Any] | None = None,
                          **kwargs: Any) -> list[Document]:
        """:meth:`similarity_search_with_score` without the scores."""
        return [doc for doc, _ in self.similarity_search_with_score(query, k, filter, **kwargs)]

    def similarity_search_with_score_by_vector(self, embedding: list[float], k: int = 4,
                                               filter: Mapping[str, Any] | None = None,
                                               **kwargs: Any) -> list[tuple[Document, float]]:
        """:meth:`similarity_search_with_score` for a vector in the selector's space (``self.embeddings``; of the
        selector's dimension, normalised as the selector does)."""
        found = self._found(self._vector(embedding), k, filter, dict(kwargs))
        return [(self._document(case), float(s)) for case, s in found]

    def similarity_search_by_vector(self, embedding: list[float], k: int = 4,
                                    filter: Mapping[str, Any] | None = None, **kwargs: Any) -> list[Document]:
        """:meth:`similarity_search_with_score_by_vector` without the scores."""
        return [doc for doc, _ in self.similarity_search_with_score_by_vector(embedding, k, filter, **kwargs)]

    def max_marginal_relevance_search(self, query: str, k: int = 4, fetch_k: int = 20, lambda_mult: float = 0.5,
                                      filter: Mapping[str, Any] | None = None, **kwargs: Any) -> list[Document]:
        """:meth:`max_marginal_relevance_search_by_vector` for the query text (encoded by the selector)."""
        return self.max_marginal_relevance_search_by_vector(self.embeddings.embed_query(query), k, fetch_k,
                                                            lambda_mult, filter, **kwargs)

    def max_marginal_relevance_search_by_vector(self, embedding: list[float], k: int = 4, fetch_k: int = 20,
                                                lambda_mult: float = 0.5, filter: Mapping[str, Any] | None = None,
                                                **kwargs: Any) -> list[Document]:
        """LangChain's maximal marginal relevance: the ``fetch_k`` nearest cases (as :meth:`similarity_search`,
        with its ``filter``, ``scope``, ``env`` and ``score_threshold``), of which ``k`` are picked one at a time,
        each maximising ``lambda_mult * cosine(query) - (1 - lambda_mult) * max cosine(picked)`` over the stored
        embeddings (``langchain_core.vectorstores.utils.maximal_marginal_relevance``; ``lambda_mult=1``: the
        similarity order, ``0``: the most diverse). Fewer than ``k`` when fewer match or ``fetch_k < k``."""
        k = check_k(k, "MementoVectorStore")
        if isinstance(lambda_mult, bool) or not isinstance(lambda_mult, numbers.Real) or not 0.0 <= lambda_mult <= 1.0:
            raise DataFormatError(f"MementoVectorStore: lambda_mult must be a number in [0, 1], got "
                                  f"{str(lambda_mult)[:80]}")
        vector = self._vector(embedding)
        found = self._found(vector, fetch_k, filter, dict(kwargs), "fetch_k")
        if not found:
            return []
        query_D = np.asarray(vector, dtype=np.float64).reshape(-1)
        stored_ND = np.asarray(self.selector.bank.embeddings([case.id for case, _ in found]), dtype=np.float64)
        picked = maximal_marginal_relevance(query_D, stored_ND, lambda_mult=float(lambda_mult),  # type: ignore[arg-type]
                                            k=min(k, len(found)))
        return [self._document(found[i][0]) for i in picked]

    def _select_relevance_score_fn(self) -> Callable[[float], float]:
        return lambda similarity: (1.0 + similarity) / 2.0  # cosine in [-1, 1] -> relevance in [0, 1]

    def get_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        """The stored cases of ``ids`` as documents, in order (unknown or deleted ids left out)."""
        from memento.errors import UnknownCaseError

        out = []
        for case_id in ids:
            try:
                case = self.selector.get_case(case_id)
                if not self.selector.bank.is_deleted([case_id])[0]:
                    out.append(self._document(case))
            except UnknownCaseError:
                continue
        return out

    @classmethod
    def from_texts(cls, texts: list[str], embedding: Any = None, metadatas: list[dict] | None = None, *,
                   selector: Any = None, ids: list[str] | None = None, **kwargs: Any) -> MementoVectorStore:
        """A store over ``selector`` with ``texts`` added. The selector's own encoder embeds the texts, so
        ``embedding`` must be ``None``; ``kwargs`` go to the constructor (``scope``, ``default_reward``, ``env``)."""
        if selector is None:
            raise DataFormatError("MementoVectorStore.from_texts needs selector= (a loaded memento Selector)")
        if embedding is not None:
            raise DataFormatError("MementoVectorStore.from_texts: the selector's encoder embeds the texts; pass "
                                  f"embedding=None (got a {type(embedding).__name__})")
        store = cls(selector, **kwargs)
        store.add_texts(texts, metadatas, ids=ids)
        return store
