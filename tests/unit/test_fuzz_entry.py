"""Fuzzing the selector's two transports with hypothesis (derandomised, bounded; ``make probe`` scales it up).

Over a small real selector (the v1 fixture artifact, a hashing encoder) and one writer:

- the MCP tools (``select_cases``, ``record_outcome``, ``add_case``, ``delete_case``, ``update_case``,
  ``case_history``, ``count_cases``, ``delete_all_cases``, ``search_cases``, ``list_cases``) called in-process with
  generated arguments: arbitrary JSON values (bools, numbers as strings, huge integers, NaN, nested objects, lone
  surrogates, NUL and blank texts, unknown keys, null scope fields, mem0's names), near-valid ones and real pending
  selection ids and case ids;
- the HTTP bodies of /v1/select, /v1/search, /v1/feedback and /v1/cases and ``PATCH /v1/cases/{id}``, likewise, and
  the query strings of ``GET /v1/cases``, ``GET /v1/cases/count`` and ``DELETE /v1/cases``.

Every call is answered (MCP: a result or a one-line tool error, never an exception out of the client call; HTTP:
2xx, or 4xx with the problem JSON, never 5xx), and no nonsense is recorded: a refused call leaves the bank, the
feedback log and the pending selections as they were, and what an accepted call stored reads back in range.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from memento.types import check_reward, check_text
from tests.fuzzing import FUZZ, examples, record
from tests.loop_env import HashingEncoder

pytestmark = pytest.mark.usefixtures("one_torch_thread")

DIM = 16
PENDING = "<a pending selection id>"  # replaced by a fresh selection's id when the call is made
ADDED = "<a case id added by the fuzz>"

_scalars = (st.none() | st.booleans() | st.integers(-3, 3)
            | st.sampled_from([10 ** 400, -(10 ** 400), 2 ** 63, 2 ** 1024])
            | st.floats(allow_nan=True, allow_infinity=True)
            | st.sampled_from([0, 1, 0.5, 0.0, 1.0, 1.0000001, -1, -0.0, 1e308, -1e308, 5e-324])
            | st.text(max_size=8)
            | st.sampled_from(["", " ", "\x00", "\ud800", "a\udfffb", "1", "0.5", "true", "NaN", "x" * 300, "a\tb",
                               " \n ", "capital of peru", "\u2028"]))
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=3)
                       | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=8)
_good_texts = st.sampled_from(["capital of peru", "capital of chile", "lima", "santiago de chile"]) \
    | st.text(min_size=1, max_size=8)
_GOOD: dict[str, st.SearchStrategy[Any]] = {
    "task": _good_texts, "query": _good_texts, "state": _good_texts, "action": _good_texts,
    "k": st.integers(1, 4), "reward": st.sampled_from([0, 1, 0.5]) | st.floats(0, 1),
    "selection_id": st.just(PENDING), "case_id": st.just(ADDED), "env": st.none() | st.just("web"),
    "mode": st.sampled_from(["sample", "greedy"]), "meta": st.none() | st.just({"source": "fuzz"}),
    "embedding": st.none(),
    "scope": st.sampled_from([{"user": "alice"}, {"user_id": "bob"}, {"agent": "a", "session": "s"}]),
    "filter": st.sampled_from([{"source": "fuzz"}, {"created": {"gte": 0}}, {"NOT": {"source": "x"}},
                               {"user": {"in": ["alice", "bob"]}}, {"updated": {"lt": "2100-01-01"}}]),
    "include_global": st.booleans(), "user": st.sampled_from(["alice", "bob"]),
}


def _spoil(job: tuple[dict[str, Any], list[str], list[Any]]) -> dict[str, Any]:
    """Valid arguments with the chosen keys set to arbitrary values (or removed, for a value of None)."""
    arguments, keys, values = job
    out = dict(arguments)
    for key, value in zip(keys, values):
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out


def _arguments(required: list[str], optional: list[str], *, objects_only: bool = False) -> st.SearchStrategy[Any]:
    """Valid arguments with 0 to 2 fields spoiled (set to any JSON value, removed, or an unknown key added), mostly;
    arbitrary objects (and, unless ``objects_only``, any JSON value: an MCP client sends an object) otherwise."""
    valid = st.fixed_dictionaries({name: _GOOD[name] for name in required},
                                  optional={name: _GOOD[name] for name in optional})
    keys = st.lists(st.sampled_from([*required, *optional, "extra"]), max_size=2, unique=True)
    near = st.tuples(valid, keys, st.lists(_values, min_size=2, max_size=2)).map(_spoil)
    wild = st.fixed_dictionaries({}, optional={**{name: _values for name in required + optional}, "extra": _values})
    return st.one_of(near, near, near, wild) if objects_only else st.one_of(near, near, near, wild, _values)


_MCP_TOOLS = {"select_cases": (["task"], ["k", "scope", "filter", "include_global"]),
              "record_outcome": (["selection_id", "reward"], []),
              "add_case": (["state", "action", "reward"], ["user", "meta"]), "delete_case": (["case_id"], []),
              "update_case": (["case_id"], ["action", "reward", "meta"]), "case_history": (["case_id"], []),
              "count_cases": ([], ["scope", "filter", "include_global"]),
              "delete_all_cases": (["scope"], ["filter"]),
              "search_cases": (["query"], ["k", "scope", "filter", "include_global"]),
              "list_cases": ([], ["scope", "filter", "include_global"])}
mcp_calls = st.sampled_from(sorted(_MCP_TOOLS)).flatmap(
    lambda tool: st.tuples(st.just(tool), _arguments(*_MCP_TOOLS[tool], objects_only=True)))

_HTTP_ROUTES = {"/v1/select": (["query"], ["k", "env", "mode", "scope", "filter", "include_global"]),
                "/v1/search": (["query"], ["k", "scope", "filter", "include_global"]),
                "/v1/feedback": (["selection_id", "reward"], []),
                "/v1/cases": (["state", "action", "reward"], ["env", "meta", "embedding", "user"]),
                "PATCH /v1/cases/{id}": ([], ["action", "reward", "meta"])}
http_calls = st.sampled_from(sorted(_HTTP_ROUTES)).flatmap(
    lambda route: st.tuples(st.just(route), _arguments(*_HTTP_ROUTES[route])))


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any, list[str]]]:
    """The selector, its writer, and the ids of the cases the fuzz added (what ``delete_case`` may delete)."""
    pytest.importorskip("fastapi")
    from memento.selector.export import load_selector
    from memento.serve.app import Writer

    art = Path(shutil.copytree(Path(__file__).resolve().parents[1] / "fixtures" / "artifacts" / "v1-selector",
                               tmp_path_factory.mktemp("fuzz-entry") / "selector"))
    with load_selector(art, learn=False, seed=0, encoder=HashingEncoder(dim=DIM)) as selector:
        writer = Writer(selector).start()
        try:
            yield selector, writer, []
        finally:
            writer.stop(10)


def _state(selector: Any) -> tuple[int, int, int, int]:
    """What a write changes: cases, deleted cases, recorded feedbacks, pending selections."""
    stats = selector.stats()
    return stats["cases"], selector.bank.num_deleted, stats["feedbacks"], stats["pending"]


def _fill(value: Any, selector: Any, added: list[str]) -> Any:
    if value == PENDING:
        return selector.select("capital of peru", k=2).selection_id
    if value == ADDED:
        return added[-1] if added else "no-such-case"
    return value


def _check_stored(selector: Any, case_id: str) -> None:
    """A case an accepted call stored reads back, in range."""
    case = selector.get_case(case_id)
    check_text(case.state, "state")
    check_text(case.action, "action")
    assert check_reward(case.reward) == case.reward


def _is_traceback(text: str) -> bool:
    return "Traceback" in text or any(f"{name}:" in text or f"{name}(" in text for name in (
        "TypeError", "AttributeError", "OverflowError", "RecursionError", "UnicodeEncodeError", "KeyError",
        "IndexError", "AssertionError", "sqlite3."))


@pytest.mark.probe
@settings(FUZZ, max_examples=examples(50))
@given(call=mcp_calls)
def test_mcp_tool_calls_are_answered_and_record_no_nonsense(served: tuple[Any, Any, list[str]],
                                                           call: tuple[str, Any]) -> None:
    pytest.importorskip("mcp")
    import anyio
    from mcp import Client

    from memento.serve.mcp import build_mcp_server

    selector, writer, added = served
    tool, arguments = call
    arguments = {key: _fill(value, selector, added) for key, value in arguments.items()}
    record(__name__, "inputs")
    before = _state(selector)
    outcome: dict[str, Any] = {}

    async def drive() -> None:
        async with Client(build_mcp_server(selector, writer)) as client:
            record(__name__, "requests")
            outcome["result"] = await client.call_tool(tool, arguments)

    anyio.run(drive)
    result = outcome["result"]
    after = _state(selector)
    event(f"{tool}: {'refused' if result.is_error else 'answered'}")
    if result.is_error:
        text = result.content[0].text if result.content else ""
        if _is_traceback(text):
            record(__name__, "tracebacks")
        assert text and "\n" not in text and not _is_traceback(text), (tool, arguments, text)
        assert after[:3] == before[:3], (tool, arguments, before, after)  # nothing recorded, nothing added
        assert after[3] <= before[3]  # a refused feedback never takes a pending selection (others may expire)
        if tool == "record_outcome" and arguments.get("selection_id") is not None and before[3]:
            sid = arguments["selection_id"]
            if isinstance(sid, str) and len(sid) == 32:  # a real pending one: still waiting
                assert selector.feedback(sid, 1.0)["recorded"]
        return
    body = result.structured_content
    assert isinstance(body, dict), (tool, arguments, result)
    if tool == "add_case":
        assert isinstance(arguments.get("state"), str) and isinstance(arguments.get("reward"), (int, float))
        _check_stored(selector, body["id"])
        if body["id"] not in added:
            added.append(body["id"])
    elif tool == "record_outcome":
        assert after[2] == before[2] + 1 and 0.0 <= body["reward"] <= 1.0, (arguments, body)
    elif tool == "delete_case":
        assert after[1] == before[1] + 1
        added.remove(arguments["case_id"])
    elif tool == "update_case":
        assert after[:2] == before[:2] and body["id"] == arguments["case_id"]
        _check_stored(selector, body["id"])
    elif tool == "delete_all_cases":
        assert arguments.get("scope") or arguments.get("filter")  # never all tenants by omission
        assert after[1] == before[1] + body["deleted"], (arguments, body, before, after)
        _forget_gone(selector, added)
    else:  # reads: nothing changes
        assert after[:3] == before[:3], (tool, arguments, before, after)


def _forget_gone(selector: Any, added: list[str]) -> None:
    """Drop from ``added`` the cases a delete_all took (they answer 404 now)."""
    from memento.errors import UnknownCaseError

    for case_id in list(added):
        try:
            selector.get_case(case_id)
        except UnknownCaseError:
            added.remove(case_id)


@pytest.fixture(scope="module")
def client(served: tuple[Any, Any, list[str]]) -> Iterator[Any]:
    from fastapi.testclient import TestClient

    from memento.serve.app import create_app

    selector, writer, _ = served
    with TestClient(create_app(selector, token=None, writer=writer)) as client:
        yield client


def _dumps(value: Any) -> bytes:
    try:
        return json.dumps(value).encode("utf-8", "surrogatepass")
    except ValueError:  # an integer too long to write: send what a client could
        return b'{"reward": ' + b"9" * 5000 + b"}"


@pytest.mark.probe
@settings(FUZZ, max_examples=examples(120))
@given(call=http_calls)
def test_http_bodies_are_answered_and_record_no_nonsense(served: tuple[Any, Any, list[str]], client: Any,
                                                         call: tuple[str, Any]) -> None:
    selector, _, added = served
    route, body = call
    if isinstance(body, dict):
        body = {key: _fill(value, selector, added) for key, value in body.items()}
    record(__name__, "inputs")
    before = _state(selector)
    record(__name__, "requests")
    if route.startswith("PATCH "):
        target = f"/v1/cases/{added[-1] if added else 'no-such-case'}"
        response = client.patch(target, content=_dumps(body), headers={"Content-Type": "application/json"})
    else:
        response = client.post(route, content=_dumps(body), headers={"Content-Type": "application/json"})
    after = _state(selector)
    event(f"{route}: {response.status_code}")
    if response.status_code >= 500:
        record(__name__, "tracebacks")
    assert response.status_code < 500, (route, body, response.status_code, response.text)
    if response.status_code >= 400:
        assert "detail" in response.json(), response.text
        assert after[:3] == before[:3] and after[3] <= before[3], (route, body, before, after)
        return
    answer = response.json()
    if route == "/v1/cases":
        _check_stored(selector, answer["id"])
        assert isinstance(body, dict) and math.isfinite(float(body["reward"]))
    elif route == "/v1/feedback":
        assert after[2] == before[2] + 1 and 0.0 <= answer["reward"] <= 1.0
    elif route.startswith("PATCH "):
        assert after[:2] == before[:2]
        _check_stored(selector, answer["id"])
    else:  # select and search: no case, deletion or feedback
        assert after[:3] == before[:3]


_QUERY_KEYS = ["user", "user_id", "agent", "session", "run_id", "env", "filter", "include_global", "limit",
               "offset", "all", "extra"]
_query_values = st.sampled_from(["alice", "bob", "", "true", "false", "1", "0", "-1", "10000000", "\x00", "null",
                                 '{"source": "fuzz"}', '{"user": null}', '{"created": {"gte": 0}}', '{"x": {"bad":1}}',
                                 "[1]", "\ud800", "%FF", "x" * 300]) | st.text(max_size=6)
query_calls = st.tuples(st.sampled_from(["GET /v1/cases", "GET /v1/cases/count", "DELETE /v1/cases"]),
                        st.lists(st.tuples(st.sampled_from(_QUERY_KEYS), _query_values), max_size=3))


@pytest.mark.probe
@settings(FUZZ, max_examples=examples(60))
@given(call=query_calls)
def test_http_query_strings_are_answered_and_delete_only_what_they_name(served: tuple[Any, Any, list[str]],
                                                                          client: Any, call: tuple[str, Any]) -> None:
    """List, count and delete-all by query string: never a 5xx; a refused one changes nothing; a delete-all
    needs a scope or a filter (or all=true) and deletes exactly what it reports."""
    selector, _, added = served
    route, params = call
    method, path = route.split(" ")
    record(__name__, "inputs")
    before = _state(selector)
    record(__name__, "requests")
    query = "&".join(f"{quote(key)}={quote(value.encode('utf-8', 'surrogatepass'))}" for key, value in params)
    response = client.request(method, f"{path}?{query}" if query else path)
    after = _state(selector)
    event(f"{route}: {response.status_code}")
    if response.status_code >= 500:
        record(__name__, "tracebacks")
    assert response.status_code < 500, (route, params, response.status_code, response.text)
    if response.status_code >= 400 or method == "GET":
        assert after[:3] == before[:3], (route, params, before, after)
        return
    names = {key for key, _ in params}
    assert names & {"user", "user_id", "agent", "session", "run_id", "filter", "all"}, params
    assert after[1] == before[1] + response.json()["deleted"]
    _forget_gone(selector, added)
