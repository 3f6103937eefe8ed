"""The adapters' relevance score on the shipped selector (pre-trained on facts-real, the real encoder): its Q is
10-13 for every candidate, so sigmoid(Q) is 0.9997-0.99999 for all of them and a cutoff on it keeps all or
nothing; the default score, the policy's probability softmax(Q / alpha) over the candidate set, spreads, follows
the greedy order, and a cutoff on it keeps a proper subset (LangChain's ``score_threshold``, LlamaIndex's
``SimilarityPostprocessor``)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import memento
from memento.selector.shipped import shipped_selector

pytestmark = pytest.mark.slow

K = 8
QUESTIONS = [json.loads(line)["question"]
             for line in (Path(__file__).parents[2] / "data/facts-real/test.jsonl").read_text().splitlines()[:6]]


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    path = shipped_selector("facts-real", tmp_path_factory.mktemp("shipped") / "facts-real")
    with memento.load_selector(path) as selector:
        yield selector


def test_shipped_scores_spread_follow_the_choice_and_a_cutoff_keeps_a_proper_subset(shipped) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("langchain_core")
    pytest.importorskip("llama_index.core")
    from llama_index.core.postprocessor import SimilarityPostprocessor

    from memento.adapters.langchain import MementoRetriever as LangChainRetriever
    from memento.adapters.llamaindex import MementoRetriever as LlamaRetriever

    for question in QUESTIONS:
        result = shipped.select(question, k=K, mode="greedy", track=False)
        sigmoids = [1 / (1 + math.exp(-q)) for q in result.scores]
        assert min(sigmoids) > 0.999 and max(sigmoids) - min(sigmoids) < 1e-3  # the finding: no cutoff between

        docs = LangChainRetriever(selector=shipped, k=K).invoke(question)
        scores = [d.metadata["score"] for d in docs]
        assert [d.id for d in docs] == list(result.ids) and scores == list(result.policy_probs)
        assert all(a > b for a, b in zip(scores, scores[1:]))  # distinct, in the greedy choice order
        assert scores[0] > 2 * scores[-1] and 0.0 < sum(scores) < 1.0  # spread: a probability over 32 candidates
        cutoff = (scores[0] + scores[-1]) / 2
        kept = LangChainRetriever(selector=shipped, search_kwargs={"k": K, "score_threshold": cutoff}).invoke(
            question)
        assert 0 < len(kept) < K and [d.id for d in kept] == [d.id for d, s in zip(docs, scores) if s >= cutoff]

        nodes = LlamaRetriever(shipped, k=K).retrieve(question)
        assert [n.score for n in nodes] == scores
        post = SimilarityPostprocessor(similarity_cutoff=cutoff).postprocess_nodes(nodes)
        assert [n.node.node_id for n in post] == [d.id for d in kept]
    assert shipped.stats()["pending"] == 0
