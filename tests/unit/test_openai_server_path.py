"""The OpenAI-compatible planner on the path the README documents (issue 40): a one-request-at-a-time server that
scores slowly (llama-cpp-python), a base model answering nothing in chat mode, and the deadline transport built on
the public APIs of httpx and httpcore. Against the scripted server of ``test_openai_compat``; the real server is in
``tests/integration/test_real_server.py``."""

from __future__ import annotations

import ast
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from memento.planners import openai_compat
from memento.planners.base import PlannerError
from memento.planners.openai_compat import MAX_TIMEOUT_S, SCORE_S_PER_CHAR, OpenAICompatPlanner, _env_proxy
from memento.planners.spec import parse_planner_spec
from tests.unit.test_openai_compat import FRANCE, ITALY, KEY_ENV, FakeServer, chat_reply, make, vllm_echo

URL = "http://127.0.0.1:9/v1"


@pytest.fixture(scope="module")
def _scripted() -> Iterator[FakeServer]:
    scripted = FakeServer()
    yield scripted
    scripted.close()


@pytest.fixture
def server(_scripted: FakeServer, monkeypatch: pytest.MonkeyPatch) -> FakeServer:
    _scripted.reset()
    monkeypatch.delenv(KEY_ENV, raising=False)
    return _scripted


# ---------------------------------------------------------------- the scoring deadline


def test_the_scoring_deadline_grows_with_the_prompt_and_the_requests_ahead_of_it() -> None:
    planner = OpenAICompatPlanner("m", URL)
    assert planner.config.timeout_s == 30.0 and planner.config.score_timeout_s is None
    assert SCORE_S_PER_CHAR == 1.0
    assert planner.config.score_deadline_s(150) == 30.0 + 150  # a one-case label prompt of facts-real
    assert planner.config.score_deadline_s(10 ** 9) == MAX_TIMEOUT_S
    # one request at a time: each waits for its own prompt only
    assert [s for s, _ in planner._score_deadlines([100, 50, 200])] == [130.0, 80.0, 230.0]
    # two in flight at a one-at-a-time server: each may wait behind the longest other one
    two = OpenAICompatPlanner("m", URL, concurrency=2)
    assert [s for s, _ in two._score_deadlines([100, 50, 200])] == [330.0, 280.0, 330.0]
    fixed = OpenAICompatPlanner("m", URL, score_timeout_s=5)
    assert fixed._score_deadlines([100, 50]) == [(5.0, "score_timeout_s=5")] * 2


def _slow_echo(seconds: float):
    def reply(body: dict[str, Any]) -> dict[str, Any]:
        time.sleep(seconds)
        return vllm_echo(body)

    return reply


def test_a_slow_score_is_waited_for_by_default(server: FakeServer) -> None:
    """A generation deadline of 0.2 s, a score that takes 0.5 s: scored (the deadline counts its prompt)."""
    server.reset(("fn", _slow_echo(0.5)))
    with make(server, timeout_s=0.2, max_retries=0) as planner:
        [score] = planner.score(ITALY, [[FRANCE]])
    assert score.n_tokens == 1 and len(server.requests) == 1


def test_a_score_past_its_deadline_is_one_line_naming_the_fix(server: FakeServer,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    server.reset(("fn", _slow_echo(0.6)))
    with make(server, timeout_s=0.2, max_retries=0, score_timeout_s=0.2) as planner, \
            pytest.raises(PlannerError) as info:
        planner.score(ITALY, [[FRANCE]])
    assert str(info.value) == (f"POST {server.base_url}/completions: timed out (score_timeout_s=0.2 for the whole "
                               "attempt) after 1 attempt")
    monkeypatch.setattr(openai_compat, "SCORE_S_PER_CHAR", 0.0)  # the derived deadline, down to timeout_s
    with make(server, timeout_s=0.2, max_retries=0) as planner, pytest.raises(PlannerError) as info:
        planner.score(ITALY, [[FRANCE]])
    message = str(info.value)
    assert "timed out (0.2 s: timeout_s=0.2 + 0 s per prompt character, " in message, message
    assert "queued; or set score_timeout_s for the whole attempt) after 1 attempt" in message, message
    assert "\n" not in message


def test_score_timeout_s_is_a_spec_option() -> None:
    spec = parse_planner_spec(f"openai:m@{URL}?mode=completions&score_timeout_s=900")
    assert dict(spec.options)["score_timeout_s"] == 900.0 and "score_timeout_s=900.0" in str(spec)
    assert parse_planner_spec(str(spec)) == spec
    from memento.errors import ConfigError

    with pytest.raises(ConfigError, match="score_timeout_s=0.0: must be None or a number > 0"):
        parse_planner_spec(f"openai:m@{URL}?score_timeout_s=0")


# ---------------------------------------------------------------- chat mode against a base model


def test_the_first_empty_chat_answer_warns_once_naming_completions(server: FakeServer,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="memento.planners.openai_compat")
    server.reset(("json", chat_reply("")), ("json", chat_reply(None)), ("json", chat_reply("Rome")))
    with make(server) as planner:
        answers = [planner.plan(ITALY, []).text for _ in range(3)]
    assert answers == ["", "", "Rome"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "chat mode got an empty answer from model 'test-model'" in warnings[0]
    assert "add ?mode=completions to the planner spec" in warnings[0] and "\n" not in warnings[0]


def test_no_warning_for_answers_or_in_completions_mode(server: FakeServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="memento.planners.openai_compat")
    server.reset(("json", chat_reply("Rome")))
    with make(server) as planner:
        planner.plan(ITALY, [])
    server.reset(("json", {"choices": [{"text": ""}]}))
    with make(server, mode="completions") as planner:
        assert planner.plan(ITALY, []).text == ""
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


# ---------------------------------------------------------------- the transport: public APIs only


def test_the_module_reaches_into_no_other_objects_private_names() -> None:
    """The deadline used to be put under httpx's client by rewriting ``client._transport._pool._network_backend``;
    now the module touches no underscore name of an object it did not make (``self._x`` only)."""
    tree = ast.parse(Path(openai_compat.__file__).read_text(encoding="utf-8"))
    private = [f"{ast.unparse(node)} (line {node.lineno})" for node in ast.walk(tree)
               if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
               and not (isinstance(node.value, ast.Name) and node.value.id == "self")]
    private += [f"getattr(..., {node.args[1].value!r}) (line {node.lineno})" for node in ast.walk(tree)
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
                and str(node.args[1].value).startswith("_")]
    assert private == []


def test_the_client_runs_on_a_custom_httpx_transport(server: FakeServer, monkeypatch: pytest.MonkeyPatch) -> None:
    import httpx

    made: list[Any] = []
    real = openai_compat._deadline_transport

    def recording(*args: Any) -> Any:
        made.append(real(*args))
        return made[-1]

    monkeypatch.setattr(openai_compat, "_deadline_transport", recording)
    server.reset(("json", chat_reply("Rome")))
    with make(server) as planner:
        assert planner.plan(ITALY, []).text == "Rome"
    assert len(made) == 1 and isinstance(made[0], httpx.BaseTransport)


def test_an_environment_proxy_is_used_as_httpx_would(server: FakeServer, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("no_proxy", "NO_PROXY", "all_proxy", "ALL_PROXY", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY"):
        monkeypatch.delenv(name, raising=False)
    proxy = server.base_url.rsplit("/v1", 1)[0]
    monkeypatch.setenv("http_proxy", proxy)
    assert _env_proxy("http://models.invalid:8000/v1") == proxy
    monkeypatch.setenv("no_proxy", "models.invalid")
    assert _env_proxy("http://models.invalid:8000/v1") is None
    monkeypatch.setenv("no_proxy", "localhost, .corp.example,other.example,10.0.0.0/8")
    bypassed = {host: _env_proxy(f"http://{host}:8000/v1") is None for host in (
        "localhost", "a.corp.example", "corp.example", "other.example", "x.other.example", "wwwother.example",
        "10.1.2.3", "11.1.2.3")}
    assert bypassed == {"localhost": True, "a.corp.example": True, "corp.example": False, "other.example": True,
                        "x.other.example": True, "wwwother.example": False, "10.1.2.3": True, "11.1.2.3": False}
    assert _env_proxy("https://models.invalid/v1") is None  # no https_proxy, no all_proxy
    monkeypatch.delenv("no_proxy")
    server.reset(("json", chat_reply("Rome")))
    planner = OpenAICompatPlanner("m", "http://models.invalid:8000/v1", api_key_env=None, max_retries=0)
    with planner:
        assert planner.plan(ITALY, []).text == "Rome"  # the scripted server answered as the proxy
    assert server.requests[0]["path"] == "http://models.invalid:8000/v1/chat/completions"
    assert json.dumps(server.requests[0]["body"])
