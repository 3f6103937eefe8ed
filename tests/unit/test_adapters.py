"""The LangChain and LlamaIndex retrievers over a small real selector (hashing encoder, no network), driven
through each framework's own interfaces: LangChain's Runnable (invoke / ainvoke / batch) in an LCEL chain
ending in its FakeListLLM, LlamaIndex's retrieve / aretrieve and a RetrieverQueryEngine with its MockLLM."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

import memento
from memento.errors import MementoError
from memento.memory import CaseBank
from memento.selector.export import load_selector
from tests.loop_env import HashingEncoder, make_env

pytestmark = pytest.mark.usefixtures("one_torch_thread")
QUESTION = make_env().tasks[0].question


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("adapters")
    env, encoder = make_env(), HashingEncoder()
    with CaseBank.create(root / "bank", encoder.dim, index="Flat") as bank:
        bank.add(env.seed_cases, encoder.encode([c.state for c in env.seed_cases]))
    return memento.selector.export.create_selector(root / "bank", root / "selector", k=3, warmup=1)


@pytest.fixture
def selector(artifact: Path, tmp_path: Path):
    import shutil

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
    retriever = MementoRetriever(selector=selector, k=3, on_select=seen.append)
    assert isinstance(retriever, BaseRetriever)
    docs = retriever.invoke(QUESTION)
    assert len(docs) == 3 and all(isinstance(d, Document) for d in docs)
    case = selector.get_case(docs[0].metadata["id"])
    assert docs[0].page_content == f"Task: {case.state}\nAction: {case.action}" and docs[0].id == case.id
    assert {d.metadata["selection_id"] for d in docs} == {seen[0].selection_id}
    assert all(0.0 < d.metadata["prob"] <= 1.0 and d.metadata["reward"] == selector.get_case(d.id).reward
               for d in docs)
    assert retriever.feedback(docs, 1.0)["recorded"] is True
    with pytest.raises(MementoError, match="unknown selection"):
        retriever.feedback(docs[0].metadata["selection_id"], 1.0)  # answered once
    batch = retriever.batch([QUESTION, "something else entirely"])
    assert [len(b) for b in batch] == [3, 3]
    with pytest.raises(MementoError, match="2 retrievals"):
        retriever.feedback(batch[0] + batch[1], 1.0)
    adocs = asyncio.run(retriever.ainvoke(QUESTION))
    assert len(adocs) == 3 and retriever.feedback(adocs[0].metadata["selection_id"], 0.0)["recorded"]
    greedy = MementoRetriever(selector=selector, k=2, mode="greedy")
    assert [d.id for d in greedy.invoke(QUESTION)] == list(selector.select(QUESTION, k=2, mode="greedy").ids)
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

    retriever = MementoRetriever(selector, k=3)
    nodes = retriever.retrieve(QUESTION)
    assert len(nodes) == 3 and all(isinstance(n, NodeWithScore) and isinstance(n.node, TextNode) for n in nodes)
    case = selector.get_case(nodes[0].node.node_id)
    assert nodes[0].node.get_content() == f"Task: {case.state}\nAction: {case.action}"
    assert [n.score for n in nodes] == [n.node.metadata["prob"] for n in nodes]
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
    assert "\n" not in line and line.startswith("MementoError") and f"memento-mdp[{extra}]" in line
