"""``MementoVectorStore``, a LangChain ``VectorStore`` over a small real selector (hashing encoder, no network),
driven through LangChain's own interfaces: ``add_texts``/``add_documents``, ``similarity_search`` (with scores,
with relevance scores, async), ``as_retriever(search_kwargs=...)`` (LangChain's ``VectorStoreRetriever``),
``get_by_ids``, ``delete`` and ``from_texts``; metadata round trips, scopes and metadata filters."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from memento.errors import DataFormatError, UnknownCaseError
from memento.selector.export import load_selector
from tests.loop_env import HashingEncoder, small_selector

pytest.importorskip("langchain_core")
pytestmark = pytest.mark.usefixtures("one_torch_thread")

from langchain_core.documents import Document  # noqa: E402
from langchain_core.vectorstores import VectorStore, VectorStoreRetriever  # noqa: E402

from memento.adapters.langchain import MementoVectorStore  # noqa: E402

TEXTS = ["What is the capital of Peru?", "What is the boiling point of water?", "What is the capital of Chile?",
         "Who painted Guernica?"]
METADATAS = [{"action": "Lima", "user": "alice", "topic": "geo", "level": 1},
             {"action": "100 C", "user": "alice", "session": "s1", "topic": "sci", "level": 2},
             {"action": "Santiago", "user": "bob", "agent": "planner", "topic": "geo", "level": 2, "reward": 0.0},
             {"user": "bob", "topic": "art", "level": 1}]


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return small_selector(tmp_path_factory.mktemp("vectorstore"))


@pytest.fixture
def selector(artifact: Path, tmp_path: Path):  # type: ignore[no-untyped-def]
    path = Path(shutil.copytree(artifact, tmp_path / "selector"))
    with load_selector(path, learn=True, encoder=HashingEncoder()) as sel:
        yield sel


@pytest.fixture
def store(selector) -> tuple[MementoVectorStore, list[str]]:  # type: ignore[no-untyped-def]
    s = MementoVectorStore(selector)
    return s, s.add_texts(TEXTS, METADATAS)


def test_added_texts_come_back_with_their_metadata(selector, store) -> None:  # type: ignore[no-untyped-def]
    vs, ids = store
    assert isinstance(vs, VectorStore) and len(ids) == 4 and len(set(ids)) == 4
    for text, metadata, case_id in zip(TEXTS, METADATAS, ids):
        doc, similarity = vs.similarity_search_with_score(text, k=1)[0]
        assert isinstance(doc, Document) and doc.id == case_id and doc.page_content == text
        assert similarity == pytest.approx(1.0, abs=1e-5)
        assert {**metadata, "action": metadata.get("action", text), "reward": metadata.get("reward", 1.0)} \
            == doc.metadata
    case = selector.get_case(ids[2])
    assert (case.state, case.action, case.reward, case.user, case.agent) == (TEXTS[2], "Santiago", 0.0, "bob",
                                                                               "planner")
    assert case.meta == {"topic": "geo", "level": 2}  # the case fields are not duplicated in meta
    assert vs.get_by_ids([ids[1], "unknown", ids[3]]) == [vs.similarity_search(TEXTS[1], k=1)[0],
                                                          vs.similarity_search(TEXTS[3], k=1)[0]]
    assert vs.add_texts([TEXTS[0]], [METADATAS[0]]) == [ids[0]]  # the same case again: its stored id
    assert selector.stats()["pending"] == 0  # a plain search records nothing


@pytest.mark.parametrize(("filter", "expected"), [
    ({"topic": "geo"}, {0, 2}),
    ({"topic": {"in": ["sci", "art"]}}, {1, 3}),
    ({"user": "alice"}, {0, 1}),  # a top-level scope field selects the scope
    ({"user": "bob", "topic": "geo"}, {2}),
    ({"agent": "planner"}, {2}),
    ({"session": "s1", "level": 2}, {1}),
    ({"OR": [{"level": 1}, {"topic": "sci"}]}, {0, 1, 3}),
    ({"AND": [{"topic": "geo"}, {"level": {"in": [2, 3]}}]}, {2}),
    ({"level": True}, set()),  # a boolean never matches a number
    ({"user": "carol"}, set()),
])
def test_similarity_search_filters(store, filter, expected) -> None:  # type: ignore[no-untyped-def]
    vs, ids = store
    found = {doc.id for doc in vs.similarity_search(TEXTS[0], k=50, filter=filter)}
    assert found & set(ids) == {ids[i] for i in expected}
    if filter != {"OR": [{"level": 1}, {"topic": "sci"}]}:  # the seed cases have no meta: filtered out
        assert found <= set(ids)


def test_the_top_k_is_of_the_matching_cases_and_scores_are_cosines(store) -> None:  # type: ignore[no-untyped-def]
    vs, ids = store
    scored = vs.similarity_search_with_score(TEXTS[0], k=1, filter={"user": "bob"})
    assert len(scored) == 1 and scored[0][0].id in ids[2:]  # pushed down: bob's nearest, not an empty top-1
    scored = vs.similarity_search_with_score(TEXTS[0], k=6)
    scores = [s for _, s in scored]
    assert scores == sorted(scores, reverse=True) and scored[0][0].id == ids[0]
    relevance = vs.similarity_search_with_relevance_scores(TEXTS[0], k=6)
    assert [r for _, r in relevance] == pytest.approx([(1 + s) / 2 for s in scores])
    assert all(0.0 <= r <= 1.0 for _, r in relevance)
    adocs = asyncio.run(vs.asimilarity_search(TEXTS[1], k=1, filter={"topic": "sci"}))
    assert [d.id for d in adocs] == [ids[1]]


def test_as_retriever_through_langchains_vector_store_retriever(store) -> None:  # type: ignore[no-untyped-def]
    vs, ids = store
    retriever = vs.as_retriever(search_kwargs={"k": 2, "filter": {"topic": "geo"}})
    assert isinstance(retriever, VectorStoreRetriever)
    docs = retriever.invoke("capital of Peru")
    assert {d.id for d in docs} == {ids[0], ids[2]}
    assert [d.id for d in retriever.invoke(TEXTS[2])][0] == ids[2]
    alice = vs.as_retriever(search_kwargs={"k": 5, "filter": {"user": "alice"}})
    assert {d.id for d in alice.invoke("anything")} == {ids[0], ids[1]}
    assert [len(b) for b in alice.batch(["a", "b"])] == [2, 2]
    threshold = vs.as_retriever(search_type="similarity_score_threshold",
                                search_kwargs={"k": 10, "score_threshold": 0.999})
    assert [d.id for d in threshold.invoke(TEXTS[3])] == [ids[3]]  # only the exact text: relevance 1.0


def test_a_scoped_store_writes_and_reads_its_scope(selector, store) -> None:  # type: ignore[no-untyped-def]
    _, ids = store
    carol = MementoVectorStore(selector, scope={"user": "carol"}, default_reward=0.5)
    assert carol.similarity_search(TEXTS[0], k=10) == []  # carol has nothing yet: empty, not an error
    [mine] = carol.add_texts([TEXTS[0]], [{"action": "Lima", "topic": "geo"}])
    assert mine not in ids  # another scope: another case
    assert selector.get_case(mine).user == "carol" and selector.get_case(mine).reward == 0.5
    assert [d.id for d in carol.similarity_search(TEXTS[0], k=10)] == [mine]
    assert carol.similarity_search(TEXTS[0], k=10, filter={"user": "alice"}) == []  # outside the store's scope
    assert [d.id for d in carol.similarity_search(TEXTS[0], k=10, filter={"topic": "geo"})] == [mine]


def test_delete_and_add_documents(selector, store) -> None:  # type: ignore[no-untyped-def]
    vs, ids = store
    assert vs.delete([ids[0], ids[3]]) is True
    assert vs.get_by_ids(ids) == vs.get_by_ids([ids[1], ids[2]]) and len(vs.get_by_ids(ids)) == 2
    assert ids[0] not in {d.id for d in vs.similarity_search(TEXTS[0], k=50)}
    with pytest.raises(UnknownCaseError):
        vs.delete([ids[0]])
    with pytest.raises(DataFormatError, match="give the ids"):
        vs.delete()
    added = vs.add_documents([Document(page_content="Who wrote Hamlet?", metadata={"action": "Shakespeare"})])
    assert vs.similarity_search("Who wrote Hamlet?", k=1)[0].id == added[0]
    before = selector.stats()["cases"]
    with pytest.raises(DataFormatError, match="ids cannot be chosen"):
        vs.add_documents([Document(id="mine", page_content="Who wrote Faust?")])
    assert selector.stats()["cases"] == before


@pytest.mark.parametrize(("metadatas", "message"), [
    ([{"reward": 2.0}, {}], "text 0: .*reward"),
    ([{}, {"user": ""}], "text 1: .*user"),
    ([{}, {"topic": float("nan")}], "text 1"),
    ([{}, {"action": ""}], "text 1: .*action"),
    ([{}], "1 metadatas for 2 texts"),
    ([{}, "topic"], "metadata must be a dict"),
])
def test_bad_metadata_adds_nothing(selector, metadatas, message) -> None:  # type: ignore[no-untyped-def]
    vs = MementoVectorStore(selector)
    before = selector.stats()["cases"]
    with pytest.raises(DataFormatError, match=message):
        vs.add_texts(["first text", "second text"], metadatas)
    assert selector.stats()["cases"] == before


def test_from_texts_and_bad_arguments(selector) -> None:  # type: ignore[no-untyped-def]
    vs = MementoVectorStore.from_texts(TEXTS[:2], None, METADATAS[:2], selector=selector, scope={"agent": "x"})
    assert {d.metadata["agent"] for d in vs.similarity_search(TEXTS[0], k=5)} == {"x"}
    with pytest.raises(DataFormatError, match="embedding=None"):
        MementoVectorStore.from_texts(TEXTS, object(), selector=selector)
    with pytest.raises(DataFormatError, match="selector="):
        MementoVectorStore.from_texts(TEXTS, None)
    with pytest.raises(DataFormatError, match="MementoVectorStore"):
        MementoVectorStore(selector, scope={"owner": "x"})
    with pytest.raises(DataFormatError, match="filter.topic: unknown operator"):
        vs.similarity_search("q", filter={"topic": {"like": 1}})
    with pytest.raises(DataFormatError, match="unknown search argument"):
        vs.similarity_search("q", fetch_k=3)


# ---------------------------------------------------------------- by vector, MMR, thresholds

def test_search_by_vector_matches_the_text_search(selector, store) -> None:  # type: ignore[no-untyped-def]
    vs, ids = store
    vector = vs.embeddings.embed_query(TEXTS[0])
    assert isinstance(vector, list) and len(vector) == selector.dim
    assert vs.embeddings.embed_documents(TEXTS[:2])[0] == pytest.approx(vector)
    by_text = vs.similarity_search_with_score(TEXTS[0], k=3, filter={"topic": "geo"})
    by_vector = vs.similarity_search_with_score_by_vector(vector, k=3, filter={"topic": "geo"})
    assert [(d.id, pytest.approx(s, abs=1e-6)) for d, s in by_vector] == [(d.id, s) for d, s in by_text]
    assert [d.id for d in vs.similarity_search_by_vector(vector, k=1, scope={"user": "bob"})] == [ids[2]]
    adocs = asyncio.run(vs.asimilarity_search_by_vector(vector, k=1))
    assert [d.id for d in adocs] == [ids[0]]
    with pytest.raises(Exception, match="expects"):
        vs.similarity_search_by_vector([1.0, 0.0], k=1)  # wrong dimension: one line from the selector
    with pytest.raises(DataFormatError, match=r"unknown search argument\(s\) \['fetch_k'\]"):
        vs.similarity_search_by_vector(vector, k=1, fetch_k=3)


def test_max_marginal_relevance_trades_similarity_for_diversity(selector) -> None:  # type: ignore[no-untyped-def]
    vs = MementoVectorStore(selector)
    texts = ["What is the capital of Peru?", "What is the capital of Peru? Lima.", "What is the capital city of Peru?",
             "Who painted Guernica?"]
    ids = vs.add_texts(texts, [{"topic": "geo"}, {"topic": "geo"}, {"topic": "geo"}, {"topic": "art"}])
    query = "capital of Peru"
    nearest = [d.id for d in vs.similarity_search(query, k=2, filter={"topic": {"in": ["geo", "art"]}})]
    diverse = vs.max_marginal_relevance_search(query, k=2, fetch_k=10, lambda_mult=0.0,
                                               filter={"topic": {"in": ["geo", "art"]}})
    assert nearest[0] == diverse[0].id and nearest[1] in ids[:3]
    assert diverse[1].id == ids[3]  # lambda 0: the most different of the fetched, Guernica
    assert [d.id for d in vs.max_marginal_relevance_search(query, k=2, fetch_k=10, lambda_mult=1.0,
                                                           filter={"topic": {"in": ["geo", "art"]}})] == nearest
    vector = vs.embeddings.embed_query(query)
    assert [d.id for d in vs.max_marginal_relevance_search_by_vector(
        vector, k=2, fetch_k=10, lambda_mult=0.0, filter={"topic": {"in": ["geo", "art"]}})] == [d.id for d in diverse]
    assert len(vs.max_marginal_relevance_search(query, k=3, fetch_k=2, filter={"topic": "geo"})) == 2  # fetch_k caps
    mmr = vs.as_retriever(search_type="mmr", search_kwargs={"k": 2, "fetch_k": 10, "lambda_mult": 0.0,
                                                            "filter": {"topic": {"in": ["geo", "art"]}}})
    assert [d.id for d in mmr.invoke(query)] == [d.id for d in diverse]
    assert [d.id for d in asyncio.run(mmr.ainvoke(query))] == [d.id for d in diverse]
    for bad, message in [({"lambda_mult": 1.5}, "lambda_mult must be a number in"), ({"fetch_k": 0}, "fetch_k"),
                         ({"k": -1}, "k must be"), ({"top_n": 2}, r"unknown search argument\(s\) \['top_n'\]")]:
        with pytest.raises(DataFormatError, match=message):
            vs.max_marginal_relevance_search(query, **bad)


def test_a_score_threshold_is_a_relevance_for_every_search(store) -> None:  # type: ignore[no-untyped-def]
    vs, ids = store
    relevance = vs.similarity_search_with_relevance_scores(TEXTS[0], k=6)
    cutoff = (relevance[0][1] + relevance[-1][1]) / 2
    expected = [d.id for d, r in relevance if r >= cutoff]
    assert 0 < len(expected) < 6
    assert [d.id for d in vs.similarity_search(TEXTS[0], k=6, score_threshold=cutoff)] == expected
    retriever = vs.as_retriever(search_kwargs={"k": 6, "score_threshold": cutoff})  # similarity search
    assert [d.id for d in retriever.invoke(TEXTS[0])] == expected
    assert [d.id for d in vs.max_marginal_relevance_search(TEXTS[0], k=6, lambda_mult=1.0,
                                                           score_threshold=cutoff)] == expected
    with pytest.raises(DataFormatError, match="score_threshold must be a number"):
        vs.similarity_search(TEXTS[0], score_threshold="high")
