"""The LangChain and LlamaIndex retrievers over a small real selector (hashing encoder, no network), driven
through each framework's own interfaces: LangChain's Runnable (invoke / ainvoke / batch) in an LCEL chain
ending in its FakeListLLM, LlamaIndex's retrieve / aretrieve and a RetrieverQueryEngine with its MockLLM; scopes
and metadata filters as retriever fields, per LangChain call, and as LlamaIndex MetadataFilters."""

from __future__ import annotations

import asyncio
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from memento.errors import MementoError
from memento.selector.export import load_selector
from tests.loop_env import HashingEncoder, make_env, small_selector

pytestmark = pytest.mark.usefixtures("one_torch_thread")
QUESTION = make_env().tasks[0].question


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return small_selector(tmp_path_factory.mktemp("adapters"))


@pytest.fixture
def selector(artifact: Path, tmp_path: Path):
    path = Path(shutil.copytree(artifact, tmp_path / "selector"))
    with load_selector(path, learn=True, encoder=HashingEncoder()) as sel:
        yield sel


def test_langchain_retriever_through_the_runnable_interface(selector) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("langchain_core")
    from langchain_core.documents import Document
    from langchain_core.language_models.fake import FakeListLLM
    from langchain_core.prompts import PromptTemplate
    from langchain_core.retrievers import BaseRetriever
    from langchain_core.runnables import RunnablePassthrough

    from memento.adapters.langchain import MementoRetriever

    seen = []
    retriever = MementoRetriever(selector=selector, k=3, on_select=seen.append, mode="sample", track=True)
    assert isinstance(retriever, BaseRetriever)
    docs = retriever.invoke(QUESTION)
    assert len(docs) == 3 and all(isinstance(d, Document) for d in docs)
    case = selector.get_case(docs[0].metadata["id"])
    assert docs[0].page_content == f"Task: {case.state}\nAction: {case.action}" and docs[0].id == case.id
    assert {d.metadata["selection_id"] for d in docs} == {seen[0].selection_id}
    assert all(0.0 < d.metadata["prob"] <= 1.0 and d.metadata["reward"] == selector.get_case(d.id).reward
               for d in docs)
    assert [d.metadata["q"] for d in docs] == list(seen[0].scores)
    # the score is the policy's probability of the case (a sampled draw's first-draw probability), not sigmoid(Q)
    assert [d.metadata["score"] for d in docs] == list(seen[0].policy_probs) == [d.metadata["prob"] for d in docs]
    assert retriever.feedback(docs, 1.0)["recorded"] is True
    with pytest.raises(MementoError, match="unknown selection"):
        retriever.feedback(docs[0].metadata["selection_id"], 1.0)  # answered once
    batch = retriever.batch([QUESTION, "something else entirely"])
    assert [len(b) for b in batch] == [3, 3]
    with pytest.raises(MementoError, match="2 retrievals"):
        retriever.feedback(batch[0] + batch[1], 1.0)
    adocs = asyncio.run(retriever.ainvoke(QUESTION))
    assert len(adocs) == 3 and retriever.feedback(adocs[0].metadata["selection_id"], 0.0)["recorded"]
    greedy = MementoRetriever(selector=selector, k=2)  # greedy, untracked: the defaults
    assert [d.id for d in greedy.invoke(QUESTION)] == list(selector.select(QUESTION, k=2, mode="greedy").ids)
    with pytest.raises(MementoError, match="track=False"):
        greedy.feedback(greedy.invoke(QUESTION), 1.0)
    # in a chain: retrieved cases go into the prompt of an LLM (the framework's fake one)
    prompt = PromptTemplate.from_template("Cases:\n{cases}\n\nTask: {task}")
    chain = ({"cases": retriever | (lambda ds: "\n\n".join(d.page_content for d in ds)),
              "task": RunnablePassthrough()} | prompt | FakeListLLM(responses=["Lima"]))
    assert chain.invoke(QUESTION) == "Lima"
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        MementoRetriever(selector=selector, k=0)


def test_llamaindex_retriever_and_query_engine(selector) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("llama_index.core")
    from llama_index.core.llms import MockLLM
    from llama_index.core.query_engine import RetrieverQueryEngine
    from llama_index.core.schema import NodeWithScore, TextNode

    from memento.adapters.llamaindex import MementoRetriever

    retriever = MementoRetriever(selector, k=3, mode="sample", track=True)
    nodes = retriever.retrieve(QUESTION)
    assert len(nodes) == 3 and all(isinstance(n, NodeWithScore) and isinstance(n.node, TextNode) for n in nodes)
    case = selector.get_case(nodes[0].node.node_id)
    assert nodes[0].node.get_content() == f"Task: {case.state}\nAction: {case.action}"
    assert [n.score for n in nodes] == [n.node.metadata["score"] for n in nodes]  # the relevance, not the draw prob
    assert all(n.score == n.node.metadata["policy_prob"] == n.node.metadata["prob"] and 0.0 < n.score < 1.0
               for n in nodes)  # sampled: the policy's probability is the draw's
    assert retriever.feedback(nodes, 1.0)["recorded"] is True
    anodes = asyncio.run(retriever.aretrieve(QUESTION))
    assert len(anodes) == 3 and retriever.feedback(anodes, 0.5)["recorded"]
    engine = RetrieverQueryEngine.from_args(retriever, llm=MockLLM())
    response = engine.query(QUESTION)
    assert len(response.source_nodes) == 3
    assert retriever.feedback(response.source_nodes, 1.0)["recorded"] is True
    assert selector.stats()["feedbacks"] == 3
    with pytest.raises(MementoError):
        MementoRetriever(selector, k=0)


@pytest.mark.parametrize(("module", "blocked", "extra"), [("langchain", "langchain_core", "langchain"),
                                                          ("llamaindex", "llama_index", "llamaindex")])
def test_a_missing_framework_is_one_line_naming_the_extra(module: str, blocked: str, extra: str) -> None:
    code = (f"import sys; sys.modules[{blocked!r}] = None\n"
            "import memento.adapters\n"
            "try:\n"
            f"    import memento.adapters.{module}\n"
            "except Exception as e:\n"
            "    print(type(e).__name__, e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    line = out.stdout.strip()
    assert "\n" not in line and line.startswith("MementoError") and f"-e '.[{extra}]'" in line


def _retriever(framework: str, selector, **options):  # type: ignore[no-untyped-def]
    """A retriever of ``framework`` and a function giving (ids, scores, metadata) of one retrieval."""
    if framework == "langchain":
        pytest.importorskip("langchain_core")
        from memento.adapters.langchain import MementoRetriever as LangChainRetriever

        lc = LangChainRetriever(selector=selector, **options)
        return lc, lambda q: [(d.id, d.metadata["score"], d.metadata) for d in lc.invoke(q)]
    pytest.importorskip("llama_index.core")
    from memento.adapters.llamaindex import MementoRetriever as LlamaRetriever

    li = LlamaRetriever(selector, **options)
    return li, lambda q: [(n.node.node_id, n.score, n.node.metadata) for n in li.retrieve(q)]


@pytest.mark.parametrize("framework", ["langchain", "llamaindex"])
def test_a_default_retriever_is_greedy_repeatable_and_writes_nothing(framework: str, selector) -> None:  # type: ignore[no-untyped-def]
    retriever, retrieve = _retriever(framework, selector, k=3)
    assert retriever.mode == "greedy" and retriever.track is False
    pending = selector.path / ".pending.sqlite"
    first = retrieve(QUESTION)
    assert [retrieve(QUESTION) for _ in range(2)] == [first, first]  # three invokes, one document set
    assert [i for i, _, _ in first] == list(selector.select(QUESTION, k=3, mode="greedy", track=False).ids)
    scores = [s for _, s, _ in first]
    assert scores == sorted(scores, reverse=True)  # greedy: the top k by Q, so by relevance
    assert all(m["prob"] == 1.0 and m["selection_id"] is None and m["mode"] == "greedy" for _, _, m in first)
    for i in range(20):
        retrieve(f"{QUESTION} {i}")
    assert selector.stats()["pending"] == 0 and not pending.exists()  # not one pending row in 23 retrievals
    with pytest.raises(MementoError, match="track=False"):
        retriever.feedback(_docs(retriever, framework), 1.0)
    tracked, retrieve_tracked = _retriever(framework, selector, k=3, track=True)
    assert [i for i, _, _ in retrieve_tracked(QUESTION)] == [i for i, _, _ in first]  # tracking changes no choice
    assert selector.stats()["pending"] == 1


def _docs(retriever, framework: str):  # type: ignore[no-untyped-def]
    return retriever.invoke(QUESTION) if framework == "langchain" else retriever.retrieve(QUESTION)


@pytest.mark.parametrize("framework", ["langchain", "llamaindex"])
def test_sampling_needs_track_and_explores(framework: str, selector) -> None:  # type: ignore[no-untyped-def]
    from memento.errors import ConfigError

    expected: tuple[type[Exception], ...] = (ConfigError,)
    if framework == "langchain":
        pytest.importorskip("langchain_core")
        from pydantic import ValidationError

        expected = (ValidationError,)
    with pytest.raises(expected, match="track=True"):
        _retriever(framework, selector, k=3, mode="sample")
    with pytest.raises(expected):
        _retriever(framework, selector, k=3, score="probability")
    retriever, retrieve = _retriever(framework, selector, k=3, mode="sample", track=True)
    sets = [tuple(i for i, _, _ in retrieve(QUESTION)) for _ in range(6)]
    assert len(set(sets)) > 1  # sampled: the opt-in exploration
    assert selector.stats()["pending"] == 6


@pytest.mark.parametrize("framework", ["langchain", "llamaindex"])
def test_score_similarity_is_the_cosine(framework: str, selector) -> None:  # type: ignore[no-untyped-def]
    _, retrieve = _retriever(framework, selector, k=3, score="similarity")
    got = retrieve(QUESTION)
    result = selector.select(QUESTION, k=3, mode="greedy", track=False)
    assert [s for _, s, _ in got] == list(result.similarities) == [m["similarity"] for _, _, m in got]
    assert all(-1.0 - 1e-6 <= s <= 1.0 + 1e-6 for s in result.similarities)


def test_llamaindex_similarity_cutoff_sees_the_relevance(selector) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("llama_index.core")
    from llama_index.core.postprocessor import SimilarityPostprocessor

    from memento.adapters.llamaindex import MementoRetriever

    nodes = MementoRetriever(selector, k=5, score="similarity").retrieve(QUESTION)
    scores = sorted(n.score for n in nodes)
    assert len(set(scores)) > 1  # greedy used to give 1.0 to every node: a cutoff kept all or none
    cutoff = (scores[0] + scores[-1]) / 2
    kept = SimilarityPostprocessor(similarity_cutoff=cutoff).postprocess_nodes(nodes)
    assert 0 < len(kept) < len(nodes) and all(n.score >= cutoff for n in kept)


def test_select_track_false_records_nothing_and_draws_the_same(artifact: Path, tmp_path: Path) -> None:
    import numpy as np

    from memento.errors import UnknownSelectionError

    loaded = []
    for name in ("a", "b"):
        path = Path(shutil.copytree(artifact, tmp_path / name))
        loaded.append(load_selector(path, learn=False, encoder=HashingEncoder(), seed=7))
    tracked, untracked = loaded
    try:
        queries = [QUESTION, "something else entirely", QUESTION, "a third task"]
        a = [tracked.select(q, k=3) for q in queries]  # sampled
        b = [untracked.select(q, k=3, track=False) for q in queries]
        assert [r.ids for r in a] == [r.ids for r in b] and [r.probs for r in a] == [r.probs for r in b]
        assert [r.scores for r in a] == [r.scores for r in b]
        assert all(r.selection_id is None for r in b) and all(r.selection_id for r in a)
        assert untracked.stats()["pending"] == 0 and tracked.stats()["pending"] == 4
        assert not (untracked.path / ".pending.sqlite").exists()
        many = untracked.select_many(queries, k=2, mode="greedy", track=False)
        assert all(r.selection_id is None for r in many) and untracked.stats()["pending"] == 0
        with pytest.raises(UnknownSelectionError, match="track=False"):
            untracked.feedback(None, 1.0)  # type: ignore[arg-type]
        with pytest.raises(MementoError, match="track must be"):
            untracked.select(QUESTION, k=2, track="no")  # type: ignore[arg-type]
        # the choices are the soft-Q agent's, drawn from a generator seeded as the selector's (as before scores
        # existed): the extra scoring pass takes no draw
        rng = np.random.default_rng(7)
        for query, result in zip(queries, a):
            state_D = untracked._state(query)
            candidates = untracked.bank.candidates(state_D, max(untracked.config.candidates, 3))
            chosen = untracked.agent.select(state_D, candidates, 3, rng=rng)
            assert tuple(chosen.ids) == result.ids
            q_C = untracked.agent.q_values(state_D, candidates)
            rows = candidates.rows_of(list(result.ids))
            assert result.scores == pytest.approx(tuple(q_C[rows]), abs=1e-6)
            assert result.similarities == pytest.approx(tuple(candidates.scores_C[rows]), abs=1e-6)
        greedy = untracked.select(QUESTION, k=3, mode="greedy", track=False)
        assert list(greedy.scores) == sorted(greedy.scores, reverse=True)
    finally:
        for sel in loaded:
            sel.close()


# ---------------------------------------------------------------- scopes and metadata filters

_SCOPED = [("alice", "planner", "geo", 1), ("alice", None, "sci", 2), ("bob", "planner", "geo", 2),
           ("bob", None, "art", 1)]


def _add_scoped(selector) -> dict[tuple[str, str], str]:  # type: ignore[no-untyped-def]
    """Four scoped cases with meta, near QUESTION; their ids by (user, topic)."""
    ids = {}
    for user, agent, topic, level in _SCOPED:
        scope = {"user": user} if agent is None else {"user": user, "agent": agent}
        ids[user, topic] = selector.add_case(f"{QUESTION} ({user}, {topic})", f"answer for {user}", 1.0,
                                             meta={"topic": topic, "level": level}, scope=scope)
    return ids


def test_langchain_retriever_scope_and_filter_as_fields_and_per_call(selector) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("langchain_core")
    from pydantic import ValidationError

    from memento.adapters.langchain import MementoRetriever
    from memento.errors import DataFormatError

    ids = _add_scoped(selector)
    alice = MementoRetriever(selector=selector, k=4, scope={"user": "alice"})
    docs = alice.invoke(QUESTION)
    assert {d.id for d in docs} == {ids["alice", "geo"], ids["alice", "sci"]}
    assert all(d.metadata["user"] == "alice" for d in docs)
    assert [d.id for d in docs] == list(selector.select(QUESTION, k=4, mode="greedy", track=False,
                                                        scope={"user": "alice"}).ids)
    assert [d.id for d in alice.invoke(QUESTION)] == [d.id for d in docs]  # greedy: repeatable in a scope too
    geo = MementoRetriever(selector=selector, k=4, filter={"topic": "geo"})
    assert {d.id for d in geo.invoke(QUESTION)} == {ids["alice", "geo"], ids["bob", "geo"]}
    # per call, through the Runnable interface: overrides the fields for that call only
    bob_geo = alice.invoke(QUESTION, scope={"user": "bob"}, filter={"topic": {"in": ["geo"]}})
    assert [d.id for d in bob_geo] == [ids["bob", "geo"]] and bob_geo[0].metadata["agent"] == "planner"
    assert len(alice.invoke(QUESTION, k=1)) == 1
    either = alice.invoke(QUESTION, filter={"OR": [{"topic": "art"}, {"level": 2}]})
    assert {d.id for d in either} == {ids["alice", "sci"]}  # alice's scope, and art or level 2
    assert {d.id for d in alice.invoke(QUESTION, filter={"topic": "art"})} == set()  # nothing matches: empty
    assert MementoRetriever(selector=selector, scope={"user": "carol"}).invoke(QUESTION) == []
    adocs = asyncio.run(alice.ainvoke(QUESTION, scope={"user": "bob"}, filter={"topic": "art"}))
    assert [d.id for d in adocs] == [ids["bob", "art"]]
    batch = alice.batch([QUESTION, QUESTION], filter={"topic": "sci"})
    assert [[d.id for d in b] for b in batch] == [[ids["alice", "sci"]]] * 2
    # refused at construction (pydantic's error) or at the call (one line), before anything is selected
    for bad in ({"scope": {"owner": "x"}}, {"filter": {"topic": {"like": 1}}}, {"filter": ["geo"]},
                {"scope": {"user": ""}}):
        with pytest.raises(ValidationError, match="MementoRetriever"):
            MementoRetriever(selector=selector, **bad)
    with pytest.raises(DataFormatError, match="filter.topic: unknown operator"):
        alice.invoke(QUESTION, filter={"topic": {"like": 1}})
    with pytest.raises(DataFormatError, match="k must be a positive integer"):
        alice.invoke(QUESTION, k=0)
    assert selector.stats()["pending"] == 0


def test_llamaindex_retriever_scope_filter_and_metadata_filters(selector) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("llama_index.core")
    from llama_index.core.vector_stores.types import (
        FilterCondition,
        FilterOperator,
        MetadataFilter,
        MetadataFilters,
    )

    from memento.adapters.llamaindex import MementoRetriever, metadata_filters_json
    from memento.errors import DataFormatError

    ids = _add_scoped(selector)

    def got(**options) -> set[str]:  # type: ignore[no-untyped-def]
        return {n.node.node_id for n in MementoRetriever(selector, k=6, **options).retrieve(QUESTION)}

    assert got(scope={"user": "bob"}) == {ids["bob", "geo"], ids["bob", "art"]}
    assert got(scope={"agent": "planner"}, filter={"topic": "geo"}) == {ids["alice", "geo"], ids["bob", "geo"]}
    nodes = MementoRetriever(selector, k=6, scope={"user": "alice", "agent": "planner"}).retrieve(QUESTION)
    assert [n.node.node_id for n in nodes] == [ids["alice", "geo"]] and nodes[0].node.metadata["user"] == "alice"
    assert got(scope={"session": "none"}) == set()
    # LlamaIndex's own MetadataFilters: ==, in, OR, nested
    eq = MetadataFilters(filters=[MetadataFilter(key="topic", value="sci")])
    assert got(filters=eq) == {ids["alice", "sci"]}
    within = MetadataFilters(filters=[MetadataFilter(key="topic", value=["art", "sci"], operator=FilterOperator.IN)])
    assert got(filters=within) == {ids["alice", "sci"], ids["bob", "art"]}
    nested = MetadataFilters(condition=FilterCondition.OR, filters=[
        MetadataFilter(key="topic", value="art"),
        MetadataFilters(filters=[MetadataFilter(key="topic", value="geo"), MetadataFilter(key="level", value=2)])])
    assert metadata_filters_json(nested) == {"OR": [{"topic": "art"}, {"AND": [{"topic": "geo"}, {"level": 2}]}]}
    assert got(filters=nested) == {ids["bob", "art"], ids["bob", "geo"]}
    assert got(filters=nested, filter={"topic": "art"}) == {ids["bob", "art"]}  # both: ANDed
    assert got(filters=nested, scope={"user": "alice"}) == set()
    assert got(filters=eq, scope={"user": "alice"}) == {ids["alice", "sci"]}
    # the comparison operators, text_match and NOT, as memento's filters take them
    above_one = MetadataFilters(filters=[MetadataFilter(key="level", value=1, operator=FilterOperator.GT)])
    assert metadata_filters_json(above_one) == {"level": {"gt": 1}}
    assert got(filters=above_one) == {ids["alice", "sci"], ids["bob", "geo"]}
    not_geo = MetadataFilters(condition=FilterCondition.NOT, filters=[
        MetadataFilter(key="topic", value="geo")])
    assert metadata_filters_json(not_geo) == {"NOT": {"topic": "geo"}}
    # (NOT holds for the bank's other cases too, which have no topic: the level range keeps the four)
    assert got(filters=not_geo, filter={"level": {"gte": 1}}) == {ids["alice", "sci"], ids["bob", "art"]}
    outside = MetadataFilters(filters=[MetadataFilter(key="topic", value=["geo", "art"], operator=FilterOperator.NIN),
                                       MetadataFilter(key="topic", value="sc", operator=FilterOperator.TEXT_MATCH)])
    assert got(filters=outside) == {ids["alice", "sci"]}
    with pytest.raises(DataFormatError, match="operator 'any' is not supported"):
        MementoRetriever(selector, filters=MetadataFilters(filters=[MetadataFilter(key="level", value=[2],
                                                                                   operator=FilterOperator.ANY)]))
    for bad in ({"scope": {"owner": "x"}}, {"filter": {"topic": {"in": []}}}):
        with pytest.raises(DataFormatError, match="MementoRetriever"):
            MementoRetriever(selector, **bad)
    assert selector.stats()["pending"] == 0


# ---------------------------------------------------------------- scores, search_kwargs, unknown arguments

def _policy_probs(selector, query: str, ids) -> list[float]:  # type: ignore[no-untyped-def]
    """softmax(Q / alpha) over the query's candidate set, at ``ids``: computed here from the agent's Q."""
    import numpy as np

    state_D = selector._state(query)
    candidates = selector.bank.candidates(state_D, selector.config.candidates)
    z_C = selector.agent.q_values(state_D, candidates) / selector.alpha
    p_C = np.exp(z_C - z_C.max())
    p_C /= p_C.sum()
    return [float(p) for p in p_C[candidates.rows_of(list(ids))]]


@pytest.mark.parametrize("framework", ["langchain", "llamaindex"])
def test_the_default_score_is_the_policys_probability_over_the_candidates(framework: str, selector) -> None:  # type: ignore[no-untyped-def]
    _, retrieve = _retriever(framework, selector, k=5)
    got = retrieve(QUESTION)
    ids, scores = [i for i, _, _ in got], [s for _, s, _ in got]
    assert scores == pytest.approx(_policy_probs(selector, QUESTION, ids), rel=1e-5)
    assert all(m["score"] == m["policy_prob"] == s and m["prob"] == 1.0 for _, s, m in got)  # greedy draws
    assert scores == sorted(scores, reverse=True) and len(set(scores)) == 5 and 0.0 < sum(scores) <= 1.0
    _, retrieve_success = _retriever(framework, selector, k=5, score="success")  # the old score, on request
    assert all(s == pytest.approx(1 / (1 + math.exp(-m["q"]))) for _, s, m in retrieve_success(QUESTION))


def test_langchain_search_kwargs_are_honoured(selector) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("langchain_core")
    from memento.adapters.langchain import MementoRetriever

    ids = _add_scoped(selector)
    two = MementoRetriever(selector=selector, search_kwargs={"k": 2})
    assert two.k == 2 and len(two.invoke(QUESTION)) == 2  # was: accepted and ignored (4 documents)
    alice = MementoRetriever(selector=selector, search_kwargs={"k": 4, "scope": {"user": "alice"}})
    assert {d.id for d in alice.invoke(QUESTION)} == {ids["alice", "geo"], ids["alice", "sci"]}
    geo = MementoRetriever(selector=selector, search_kwargs={"k": 4, "filter": {"topic": "geo"}})
    assert {d.id for d in geo.invoke(QUESTION)} == {ids["alice", "geo"], ids["bob", "geo"]}
    # LangChain's filter idiom: a top-level user/agent/session equality selects the scope (as the VectorStore's)
    bob = MementoRetriever(selector=selector, search_kwargs={"k": 4, "filter": {"user": "bob", "topic": "geo"}})
    assert [d.id for d in bob.invoke(QUESTION)] == [ids["bob", "geo"]]
    assert MementoRetriever(selector=selector, scope={"user": "alice"}, filter={"user": "bob"}).invoke(QUESTION) == []
    scores = [d.metadata["score"] for d in MementoRetriever(selector=selector, k=6).invoke(QUESTION)]
    cutoff = (scores[0] + scores[-1]) / 2
    kept = MementoRetriever(selector=selector, search_kwargs={"k": 6, "score_threshold": cutoff}).invoke(QUESTION)
    assert 0 < len(kept) < 6 and [d.metadata["score"] for d in kept] == [s for s in scores if s >= cutoff]
    per_call = MementoRetriever(selector=selector, k=6).invoke(QUESTION, score_threshold=cutoff)
    assert [d.id for d in per_call] == [d.id for d in kept]
    assert MementoRetriever(selector=selector, search_kwargs={"k": 2}).search_kwargs == {"k": 2}
    assert selector.stats()["pending"] == 0


def test_unknown_or_conflicting_arguments_are_one_line(selector) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("langchain_core")
    pytest.importorskip("llama_index.core")
    from memento.adapters.langchain import MementoRetriever as LangChainRetriever
    from memento.adapters.llamaindex import MementoRetriever as LlamaRetriever
    from memento.errors import DataFormatError

    def one_line(error: pytest.ExceptionInfo) -> str:  # type: ignore[type-arg]
        assert "\n" not in str(error.value)
        return str(error.value)

    for bad, message in [({"search_kwargs": {"kk": 2}}, r"search_kwargs: unknown key\(s\) \['kk'\]"),
                         ({"search_kwargs": {"fetch_k": 9}}, "fetch_k.*MMR.*MementoVectorStore"),
                         ({"search_kwargs": {"k": 0}}, "k must be a positive integer"),
                         ({"search_kwargs": {"score_threshold": "high"}}, "score_threshold must be a number"),
                         ({"search_kwargs": ["k", 2]}, "search_kwargs must be a dict"),
                         ({"k": 3, "search_kwargs": {"k": 2}}, "k is given twice"),
                         ({"search_type": "mmr"}, r"unknown argument\(s\) \['search_type'\]"),
                         ({"top_k": 2}, r"unknown argument\(s\) \['top_k'\]")]:
        with pytest.raises(DataFormatError, match=message) as error:
            LangChainRetriever(selector=selector, **bad)
        assert one_line(error).startswith("MementoRetriever")
    retriever = LangChainRetriever(selector=selector, k=2)
    with pytest.raises(DataFormatError, match=r"unknown argument\(s\) \['fetch_k'\]") as error:
        retriever.invoke(QUESTION, fetch_k=3)
    one_line(error)
    with pytest.raises(DataFormatError, match=r"unknown argument\(s\) \['similarity_top_k'\]") as error:
        LlamaRetriever(selector, similarity_top_k=2)
    one_line(error)
    with pytest.raises(DataFormatError, match=r"llm_metadata_keys: unknown key\(s\) \['topic'\]") as error:
        LlamaRetriever(selector, llm_metadata_keys=("env", "topic"))
    one_line(error)
    assert LlamaRetriever(selector, verbose=True, k=2).retrieve(QUESTION)  # LlamaIndex's own arguments pass


def test_llamaindex_nodes_show_the_llm_only_the_named_metadata(selector) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("llama_index.core")
    from llama_index.core.llms import MockLLM
    from llama_index.core.query_engine import RetrieverQueryEngine
    from llama_index.core.schema import MetadataMode

    from memento.adapters.llamaindex import MementoRetriever

    _add_scoped(selector)
    nodes = MementoRetriever(selector, k=3, scope={"user": "alice"}).retrieve(QUESTION)
    for node in (n.node for n in nodes):
        assert {"q", "selection_id", "user", "score"} <= set(node.metadata)  # kept for code, not for the LLM
        assert node.get_content(metadata_mode=MetadataMode.LLM) == node.get_content()  # the case text only
        assert node.get_content(metadata_mode=MetadataMode.EMBED) == node.get_content()
    named = MementoRetriever(selector, k=3, llm_metadata_keys=("env", "reward"), embed_metadata_keys=("env",))
    for node in (n.node for n in named.retrieve(QUESTION)):
        llm = node.get_content(metadata_mode=MetadataMode.LLM)
        assert f"env: {node.metadata['env']}" in llm and f"reward: {node.metadata['reward']}" in llm
        assert "q: " not in llm and "selection_id" not in llm and "policy_version" not in llm
        embed = node.get_content(metadata_mode=MetadataMode.EMBED)
        assert "env: " in embed and "reward" not in embed
    # what the query engine's LLM is sent (MockLLM answers with its prompt)
    prompt = str(RetrieverQueryEngine.from_args(MementoRetriever(selector, k=3, scope={"user": "alice"}),
                                                llm=MockLLM()).query(QUESTION))
    assert "Task: " in prompt and not any(f"{key}: " in prompt for key in ("selection_id", "q", "prob", "user",
                                                                            "policy_version", "similarity"))


def test_llamaindex_metadata_filters_on_scope_fields_select_the_scope(selector) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("llama_index.core")
    from llama_index.core.vector_stores.types import MetadataFilter, MetadataFilters

    from memento.adapters.llamaindex import MementoRetriever

    ids = _add_scoped(selector)
    # a node shows metadata["user"]: filtering on it selects the scope (it used to look in meta and match nothing)
    nodes = MementoRetriever(selector, k=6, filters=MetadataFilters(filters=[
        MetadataFilter(key="user", value="bob"), MetadataFilter(key="topic", value="geo")])).retrieve(QUESTION)
    assert [n.node.node_id for n in nodes] == [ids["bob", "geo"]]
    assert MementoRetriever(selector, k=6, scope={"user": "alice"}, filter={"user": "bob"}).retrieve(QUESTION) == []


@pytest.mark.parametrize("framework", ["langchain", "llamaindex"])
def test_include_global_adds_the_cases_without_an_owner(framework: str, selector) -> None:  # type: ignore[no-untyped-def]
    """A scope's cases and the shared pool (cases with no owner) in one retrieval; not without the flag."""
    pytest.importorskip("langchain_core" if framework == "langchain" else "llama_index.core")
    ids = _add_scoped(selector)
    shared = selector.add_case(f"{QUESTION} (shared)", "answer for everyone", 1.0, meta={"topic": "pool", "level": 1})
    mine = {"level": {"gte": 1}}  # the test's cases, not the artifact's own (unowned too)
    alice = {ids["alice", "geo"], ids["alice", "sci"]}
    bob = {ids["bob", "geo"], ids["bob", "art"]}
    own, retrieve_own = _retriever(framework, selector, k=8, scope={"user": "alice"}, filter=mine)
    _, retrieve_pooled = _retriever(framework, selector, k=8, scope={"user": "alice"}, filter=mine,
                                    include_global=True)
    assert {i for i, _, _ in retrieve_own(QUESTION)} == alice
    found = {i for i, _, _ in retrieve_pooled(QUESTION)}
    assert found == alice | {shared}
    if framework == "langchain":
        per_call = {d.id for d in own.invoke(QUESTION, include_global=True)}
        assert per_call == alice | {shared} and not per_call & bob
