"""``memento mcp DIR`` for real: the official SDK's stdio client drives the tools of a real exported selector in a
subprocess (select, feedback, scoped add_case, search_cases/list_cases/get_case with a scope and a metadata
filter); what they write is in the artifact afterwards."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from memento import load_selector
from tests.integration.serve_helpers import QUESTION, make_real_artifact

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def artifact(encoder: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_real_artifact(tmp_path_factory.mktemp("mcp"), encoder, steps=12)


def test_mcp_tools_over_stdio(artifact: Path, tmp_path: Path) -> None:
    import anyio
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    with load_selector(artifact) as selector:
        before = selector.stats()
    env = {key: os.environ[key] for key in ("HOME", "MEMENTO_CACHE_DIR") if key in os.environ}
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(ROOT)})
    params = StdioServerParameters(command=sys.executable, args=["-m", "memento", "mcp", str(artifact)],
                                   env=env, cwd=str(ROOT))
    seen: dict[str, Any] = {}

    async def drive() -> None:
        with open(tmp_path / "mcp.log", "w") as errlog:
            async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                tools = {tool.name: tool for tool in (await session.list_tools()).tools}
                assert set(tools) == {"select_cases", "record_outcome", "add_case", "update_case", "delete_case",
                                      "delete_all_cases", "search_cases", "list_cases", "count_cases", "get_case",
                                      "case_history"}
                assert set(tools["select_cases"].input_schema["properties"]) == {"task", "k", "scope", "filter",
                                                                                 "env", "include_global"}
                assert tools["list_cases"].input_schema["additionalProperties"] is False  # unknown: refused

                chosen = await session.call_tool("select_cases", {"task": QUESTION, "k": 4})
                assert not chosen.is_error, chosen.content
                body = chosen.structured_content or json.loads(chosen.content[0].text)
                assert len(body["cases"]) == 4 and all(0.0 < c["prob"] <= 1.0 for c in body["cases"])
                assert all(isinstance(c["score"], float) and -1.0 <= c["similarity"] <= 1.0 for c in body["cases"])

                recorded = await session.call_tool("record_outcome", {"selection_id": body["selection_id"],
                                                                      "reward": 1.0})
                assert not recorded.is_error and recorded.structured_content["recorded"] is True
                again = await session.call_tool("record_outcome", {"selection_id": body["selection_id"],
                                                                   "reward": 1.0})
                assert again.is_error and "unknown selection id" in again.content[0].text
                bad = await session.call_tool("record_outcome", {"selection_id": "x", "reward": 2.0})
                assert bad.is_error and "reward" in bad.content[0].text

                added = await session.call_tool("add_case", {"state": "What is the capital of Bolivia?",
                                                             "action": "Sucre", "reward": 1.0})
                assert not added.is_error, added.content
                seen["case_id"] = added.structured_content["id"]

                scoped = {}
                for user, state, action in (("alice", "What is the capital of Peru?", "Lima (alice)"),
                                            ("bob", "What is the capital of Peru?", "Lima (bob)")):
                    made = await session.call_tool("add_case", {"state": state, "action": action, "reward": 1.0,
                                                                "user": user, "meta": {"topic": "geo"}})
                    assert not made.is_error, made.content
                    scoped[user] = made.structured_content["id"]
                mine = await session.call_tool("select_cases", {"task": QUESTION, "k": 4,
                                                                "scope": {"user": "alice"}})
                assert not mine.is_error, mine.content
                assert [c["id"] for c in mine.structured_content["cases"]] == [scoped["alice"]]
                assert mine.structured_content["cases"][0]["meta"] == {"topic": "geo"}
                nearest = await session.call_tool("search_cases", {"query": "What is the capital of Peru?", "k": 3,
                                                                   "filter": {"topic": {"in": ["geo"]}}})
                rows = nearest.structured_content["cases"]
                assert {r["id"] for r in rows} == set(scoped.values())
                assert all(r["similarity"] == pytest.approx(1.0, abs=1e-4) for r in rows)
                listed = await session.call_tool("list_cases", {"scope": {"user": "bob"}})
                assert [r["id"] for r in listed.structured_content["cases"]] == [scoped["bob"]]
                got = await session.call_tool("get_case", {"case_id": scoped["bob"]})
                assert got.structured_content["user"] == "bob" and got.structured_content["action"] == "Lima (bob)"
                none = await session.call_tool("search_cases", {"query": QUESTION, "scope": {"user": "carol"}})
                assert not none.is_error and none.structured_content["cases"] == []
                bad = await session.call_tool("search_cases", {"query": QUESTION, "filter": {"topic": {"like": 1}}})
                assert bad.is_error and "filter:" in bad.content[0].text

    anyio.run(drive)
    with load_selector(artifact) as selector:  # the server drained and saved when the client closed stdin
        after = selector.stats()
        assert selector.get_case(seen["case_id"]).action == "Sucre"
        assert [c.action for c, _ in selector.search_cases(QUESTION, k=4, scope={"user": "alice"})] == ["Lima (alice)"]
    assert after["feedbacks"] == before["feedbacks"] + 1 and after["cases"] == before["cases"] + 3
    assert after["feedbacks_since_save"] == 0 and after["cases_since_save"] == 0
