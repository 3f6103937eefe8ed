"""OpenAICompatPlanner against a scripted OpenAI-compatible server on 127.0.0.1 (HTTP/1.1, keep-alive)."""

from __future__ import annotations

import copy
import json
import math
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from memento.config import from_dict, to_dict
from memento.errors import ConfigError
from memento.planners import openai_compat
from memento.planners.base import Planner, PlannerError, ScoringPlanner
from memento.planners.openai_compat import OpenAICompatConfig, OpenAICompatPlanner
from memento.planners.prompts import PromptConfig
from memento.types import Case, Task

ITALY = Task(id="t1", question="What is the capital of Italy?", answers=["Rome"])
FRANCE = Case(state="What is the capital of France?", action="Paris", reward=1.0)
KEY_ENV = "MEMENTO_TEST_OPENAI_KEY"


def chat_reply(content: str | None = "Rome", usage: dict[str, int] | None = None) -> dict[str, Any]:
    reply: dict[str, Any] = {"id": "x", "object": "chat.completion",
                             "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                                          "finish_reason": "stop"}]}
    if usage is not None:
        reply["usage"] = usage
    return reply


class FakeServer:
    """Answers each POST with the next scripted step; the last step repeats.

    Steps: ``("json", obj)``, ``("status", code, body)`` (``body`` text), ``("raw", text)``
    (status 200, not JSON), ``("sleep", seconds)`` (then a normal reply),
    ``("retry_after", value)`` (429 with a Retry-After header), ``("fn", reply)`` (the JSON
    ``reply(request_body)`` returns).
    """

    def __init__(self) -> None:
        self.script: list[tuple[Any, ...]] = [("json", chat_reply())]
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive: a pooled client reuses its connection

            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with server.lock:
                    server.requests.append({"path": self.path, "headers": dict(self.headers),
                                            "body": json.loads(body), "client": self.client_address})
                    index = min(len(server.requests), len(server.script)) - 1
                    step = server.script[index]
                try:
                    self._answer(step, json.loads(body))
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout tests)
                    pass

            def _answer(self, step: tuple[Any, ...], body: dict[str, Any]) -> None:
                kind = step[0]
                if kind == "sleep":
                    time.sleep(step[1])
                    self._send(200, json.dumps(chat_reply()))
                elif kind == "json":
                    self._send(200, json.dumps(step[1]))
                elif kind == "raw":
                    self._send(200, step[1])
                elif kind == "status":
                    self._send(step[1], step[2])
                elif kind == "retry_after":
                    self._send(429, "slow down", {"Retry-After": str(step[1])})
                elif kind == "fn":
                    self._send(200, json.dumps(step[1](body)))

            def _send(self, code: int, text: str, headers: dict[str, str] | None = None) -> None:
                data = text.encode("utf-8")
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def reset(self, *script: tuple[Any, ...]) -> None:
        with self.lock:
            self.script = list(script) or [("json", chat_reply())]
            self.requests = []

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def _server():
    server = FakeServer()
    yield server
    server.close()


@pytest.fixture
def server(_server: FakeServer, monkeypatch: pytest.MonkeyPatch) -> FakeServer:
    _server.reset()
    monkeypatch.delenv(KEY_ENV, raising=False)
    return _server


def make(server: FakeServer, **kwargs: Any) -> OpenAICompatPlanner:
    options: dict[str, Any] = dict(api_key_env=KEY_ENV, timeout_s=2.0, max_retries=2, backoff_s=0.01)
    options.update(kwargs)
    return OpenAICompatPlanner("test-model", server.base_url, **options)


# ---------------------------------------------------------------- success


def test_chat_success_text_usage_headers_and_body(server: FakeServer, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(KEY_ENV, "sk-test-123")
    server.reset(("json", chat_reply("  Rome\nQuestion: What else?", {"prompt_tokens": 21, "completion_tokens": 4})))
    planner = make(server, max_tokens=8, temperature=0.0)
    assert isinstance(planner, Planner)
    out = planner.plan(ITALY, [FRANCE])
    assert out.text == "Rome"  # cut at the few_shot stop string "\n", stripped
    assert (out.prompt_tokens, out.output_tokens) == (21, 4)
    assert out.latency_s > 0
    [request] = server.requests
    assert request["path"] == "/v1/chat/completions"
    assert request["headers"]["Authorization"] == "Bearer sk-test-123"
    assert request["headers"]["Content-Type"] == "application/json"
    assert request["body"] == {
        "model": "test-model",
        "messages": [{"role": "user", "content": "Question: What is the capital of France?\nAnswer: Paris\n"
                                                 "Question: What is the capital of Italy?\nAnswer:"}],
        "max_tokens": 8,
        "temperature": 0.0,
        "stop": ["\n"],
    }
    assert planner.attempts == 1


def test_key_is_read_at_call_time_and_optional(server: FakeServer, monkeypatch: pytest.MonkeyPatch):
    planner = make(server)
    planner.plan(ITALY, [])
    assert "Authorization" not in server.requests[-1]["headers"]
    monkeypatch.setenv(KEY_ENV, "later-key")
    planner.plan(ITALY, [])
    assert server.requests[-1]["headers"]["Authorization"] == "Bearer later-key"
    no_key = make(server, api_key_env=None)
    no_key.plan(ITALY, [])
    assert "Authorization" not in server.requests[-1]["headers"]


def test_completions_mode(server: FakeServer):
    server.reset(("json", {"choices": [{"index": 0, "text": " Rome\n", "finish_reason": "stop"}],
                           "usage": {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11}}))
    planner = OpenAICompatPlanner("base-model", server.base_url + "/", mode="completions", stop=["\n", "Question:"],
                                  max_tokens=5, temperature=0.7, api_key_env=None)
    out = planner.plan(ITALY, [FRANCE])
    assert (out.text, out.prompt_tokens, out.output_tokens) == ("Rome", 9, 2)
    [request] = server.requests
    assert request["path"] == "/v1/completions"
    assert request["body"] == {
        "model": "base-model",
        "prompt": "Question: What is the capital of France?\nAnswer: Paris\nQuestion: What is the capital of Italy?"
                  "\nAnswer:",
        "max_tokens": 5,
        "temperature": 0.7,
        "stop": ["\n", "Question:"],
    }


def test_memento_plan_prompt_sends_a_system_message_and_its_stops(server: FakeServer):
    plan = '{"plan": [{"id": 1, "description": "Name the capital of Italy."}]}'
    server.reset(("json", chat_reply(plan)))
    out = make(server, prompt=PromptConfig(style="memento_plan", instruction="Plan.")).plan(ITALY, [])
    assert out.text == plan
    body = server.requests[0]["body"]
    assert body["messages"][0] == {"role": "system", "content": "Plan."}
    assert body["messages"][1]["role"] == "user" and body["messages"][1]["content"].endswith("Plan:")
    assert body["stop"] == ["\nTask:", "\nQuestion:", "\nExample ", "\nBased on the examples"]


def test_no_usage_gives_zero_counts_and_null_content_gives_empty_text(server: FakeServer):
    server.reset(("json", chat_reply(None)))
    out = make(server).plan(ITALY, [])
    assert (out.text, out.prompt_tokens, out.output_tokens) == ("", 0, 0)


def test_empty_stop_is_not_sent(server: FakeServer):
    make(server, stop=()).plan(ITALY, [])
    assert "stop" not in server.requests[0]["body"]


def test_plan_many_keeps_order_with_concurrency(server: FakeServer):
    server.reset(("json", chat_reply("A")), ("json", chat_reply("B")), ("json", chat_reply("C")))
    tasks = [Task(id=str(i), question=f"Question {i}?", answers=["x"]) for i in range(3)]
    outs = make(server, concurrency=3).plan_many(tasks, [[], [FRANCE], []])
    assert len(outs) == 3 and sorted(o.text for o in outs) == ["A", "B", "C"]  # replies in arrival order
    asked = sorted(r["body"]["messages"][-1]["content"].splitlines()[-2] for r in server.requests)
    assert asked == ["Question: Question 0?", "Question: Question 1?", "Question: Question 2?"]
    sequential = make(server)
    server.reset(("json", chat_reply("A")), ("json", chat_reply("B")), ("json", chat_reply("C")))
    assert [o.text for o in sequential.plan_many(tasks, [[], [], []])] == ["A", "B", "C"]
    with pytest.raises(PlannerError, match="2 tasks but 1 case lists"):
        sequential.plan_many(tasks[:2], [[]])


# ---------------------------------------------------------------- retries and errors


def test_500_then_success_is_retried(server: FakeServer):
    server.reset(("status", 500, "upstream hiccup"), ("json", chat_reply("Rome")))
    planner = make(server)
    assert planner.plan(ITALY, []).text == "Rome"
    assert planner.attempts == 2 and len(server.requests) == 2


def test_always_500_fails_after_all_attempts(server: FakeServer):
    server.reset(("status", 500, '{"error": "boom"}'))
    planner = make(server, max_retries=2)
    with pytest.raises(PlannerError) as info:
        planner.plan(ITALY, [])
    assert str(info.value) == (f"POST {server.base_url}/chat/completions: HTTP 500 after 3 attempts: "
                               '{"error": "boom"}')
    assert len(server.requests) == 3 and planner.attempts == 3


def test_backoff_is_exponential_and_honours_retry_after(server: FakeServer, monkeypatch: pytest.MonkeyPatch):
    delays: list[float] = []
    monkeypatch.setattr(openai_compat.time, "sleep", delays.append)
    server.reset(("status", 503, "busy"))
    with pytest.raises(PlannerError, match="HTTP 503 after 4 attempts: busy"):
        make(server, max_retries=3, backoff_s=0.5).plan(ITALY, [])
    assert delays == [0.5, 1.0, 2.0]
    delays.clear()
    server.reset(("retry_after", 3), ("json", chat_reply()))
    assert make(server, backoff_s=0.5).plan(ITALY, []).text == "Rome"
    assert delays == [3.0]


def test_429_is_retried(server: FakeServer):
    server.reset(("status", 429, "rate limited"), ("json", chat_reply("Rome")))
    planner = make(server)
    assert planner.plan(ITALY, []).text == "Rome" and planner.attempts == 2


@pytest.mark.parametrize("code", [400, 401, 404])
def test_other_4xx_fail_at_once(server: FakeServer, code: int):
    server.reset(("status", code, '{"error": {"message": "Incorrect API key provided"}}'))
    planner = make(server, max_retries=3)
    with pytest.raises(PlannerError) as info:
        planner.plan(ITALY, [])
    assert str(info.value) == (f"POST {server.base_url}/chat/completions: HTTP {code}: "
                               '{"error": {"message": "Incorrect API key provided"}}')
    assert len(server.requests) == 1


def test_long_error_bodies_are_cut_to_one_line(server: FakeServer):
    server.reset(("status", 401, "line one\nline two " + "x" * 500))
    with pytest.raises(PlannerError) as info:
        make(server).plan(ITALY, [])
    message = str(info.value)
    assert "\n" not in message and message.endswith("...") and "line one line two" in message
    assert len(message) < 320


def test_timeout_is_retried_then_fails(server: FakeServer):
    server.reset(("sleep", 0.6))
    planner = make(server, timeout_s=0.15, max_retries=1, backoff_s=0.01)
    start = time.perf_counter()
    with pytest.raises(PlannerError) as info:
        planner.plan(ITALY, [])
    elapsed = time.perf_counter() - start
    assert str(info.value) == (f"POST {server.base_url}/chat/completions: timed out (timeout_s=0.15 for the whole "
                               "attempt) after 2 attempts")
    assert len(server.requests) == 2 and elapsed < 1.0


def test_timeout_then_success(server: FakeServer):
    server.reset(("sleep", 0.6), ("json", chat_reply("Rome")))
    planner = make(server, timeout_s=0.15, max_retries=1)
    assert planner.plan(ITALY, []).text == "Rome" and planner.attempts == 2


def test_connection_refused_is_retried_then_fails():
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    planner = OpenAICompatPlanner("m", f"http://127.0.0.1:{port}/v1", max_retries=1, backoff_s=0.01, timeout_s=1.0)
    with pytest.raises(PlannerError, match=rf"^POST http://127\.0\.0\.1:{port}/v1/chat/completions: cannot connect "
                                           r"after 2 attempts: .*refused"):
        planner.plan(ITALY, [])
    assert planner.attempts == 2


@pytest.mark.parametrize("step, message", [
    (("raw", "<html>not json</html>"), "response is not JSON: '<html>not json</html>'"),
    (("raw", '{"choices": [{"message": '), "response is not JSON"),
    (("json", [1, 2]), "response is not a JSON object"),
    (("json", {"object": "chat.completion"}), "response has no choices"),
    (("json", {"choices": []}), "response has no choices"),
    (("json", {"choices": [{"index": 0}]}), "choices[0] has no message"),
    (("json", {"choices": [{"message": {"content": 3}}]}), "choices[0] has no message"),
])
def test_malformed_responses(server: FakeServer, step: tuple[Any, ...], message: str):
    server.reset(step)
    planner = make(server)
    with pytest.raises(PlannerError) as info:
        planner.plan(ITALY, [])
    assert str(info.value).startswith(f"POST {server.base_url}/chat/completions: {message}")
    assert len(server.requests) == 1  # a malformed answer is not retried


def test_completions_without_text(server: FakeServer):
    server.reset(("json", {"choices": [{"message": {"content": "chat-shaped"}}]}))
    with pytest.raises(PlannerError, match="choices\\[0\\] has no text"):
        make(server, mode="completions").plan(ITALY, [])


# ---------------------------------------------------------------- scoring (echo + prompt logprobs, as vLLM)


def words(text: str) -> list[str]:
    """A toy tokenizer: each word with the whitespace before it (as SentencePiece's "▁Rome")."""
    tokens = re.findall(r"\s*\S+", text)
    assert "".join(tokens) == text
    return tokens


def token_logprob(token: str) -> float:
    return -len(token.strip()) / 10


def vllm_echo(body: dict[str, Any], *, bos: str | None = "<bos>", usage: bool = True) -> dict[str, Any]:
    """What vLLM's /v1/completions answers to echo=true, logprobs=1: every prompt token with its logprob
    (the first has none), then ``max_tokens`` generated tokens. Offsets count the token strings, so a
    ``<bos>`` string shifts them against the prompt text, as vLLM's do."""
    prompt_tokens = ([bos] if bos else []) + words(body["prompt"])
    generated = [" Question:"][:body["max_tokens"]]
    tokens = prompt_tokens + generated
    logprobs: list[float | None] = [None] + [token_logprob(t) for t in tokens[1:len(prompt_tokens)]]
    logprobs += [-0.05] * len(generated)
    offsets = [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
    reply: dict[str, Any] = {
        "id": "cmpl-1", "object": "text_completion", "model": body["model"],
        "choices": [{"index": 0, "text": body["prompt"] + "".join(generated), "finish_reason": "length",
                     "logprobs": {"tokens": tokens, "token_logprobs": logprobs, "text_offset": offsets,
                                  "top_logprobs": [None] + [{t: lp} for t, lp in zip(tokens[1:], logprobs[1:])]}}]}
    if usage:
        reply["usage"] = {"prompt_tokens": len(prompt_tokens), "completion_tokens": len(generated),
                          "total_tokens": len(tokens)}
    return reply


FEW_SHOT_ITALY = ("Question: What is the capital of France?\nAnswer: Paris\nQuestion: What is the capital of Italy?"
                  "\nAnswer:")


def test_score_sends_an_echo_request_and_sums_the_answer_tokens(server: FakeServer):
    server.reset(("fn", vllm_echo))
    planner = make(server)  # a chat-mode planner scores through /completions all the same
    assert isinstance(planner, ScoringPlanner)
    with_case, without = planner.score(ITALY, [[FRANCE], []])
    assert server.requests[0]["path"] == "/v1/completions"
    assert server.requests[0]["body"] == {"model": "test-model", "prompt": FEW_SHOT_ITALY + " Rome", "max_tokens": 1,
                                          "temperature": 0.0, "echo": True, "logprobs": 1}
    assert server.requests[0]["body"] == planner.score_request_body(ITALY, [FRANCE])
    assert server.requests[1]["body"]["prompt"] == "Question: What is the capital of Italy?\nAnswer: Rome"
    assert (with_case.logprob, with_case.n_tokens, with_case.mean_logprob) == (-0.4, 1, -0.4)  # " Rome" only
    assert with_case.prompt_tokens == 1 + len(words(FEW_SHOT_ITALY))  # <bos> and the prompt's tokens
    assert without.prompt_tokens == 1 + len(words("Question: What is the capital of Italy?\nAnswer:"))
    assert with_case.latency_s > 0 and planner.attempts == 2


def test_score_multi_token_answer_without_bos_or_usage(server: FakeServer):
    server.reset(("fn", lambda body: vllm_echo(body, bos=None, usage=False)))
    [score] = make(server, mode="completions").score(ITALY, [[]], answer="the  Eternal\nCity")
    assert server.requests[0]["body"]["prompt"].endswith("Answer: the Eternal City")  # one line, as demonstrations
    assert score.n_tokens == 3 and score.logprob == pytest.approx(-(3 + 7 + 4) / 10)
    assert score.mean_logprob == pytest.approx(score.logprob / 3)


def test_score_memento_plan_continuation(server: FakeServer):
    server.reset(("fn", vllm_echo))
    plan = '{"plan": [{"id": 1, "description": "Name Rome."}]}'
    [score] = make(server, prompt=PromptConfig(style="memento_plan")).score(ITALY, [[]], answer=plan)
    assert server.requests[0]["body"]["prompt"].endswith("Plan:\n1. Name Rome.")
    assert score.n_tokens == 3 and score.logprob == pytest.approx(-(2 + 4 + 5) / 10)  # "\n1." " Name" " Rome."


def llama_cpp_echo(body: dict[str, Any]) -> dict[str, Any]:
    """What llama-cpp-python's server answers to echo=true, logprobs=1 (seen from 0.3.36 with Gemma 3): the
    lists leave the <bos> out, usage.prompt_tokens counts it, and the generated token ("\n") comes last."""
    reply = vllm_echo(body, bos=None)
    reply["choices"][0]["text"] = body["prompt"] + "\n"
    logprobs = reply["choices"][0]["logprobs"]
    logprobs["tokens"][-1] = "\n"
    reply["usage"] = {"prompt_tokens": len(logprobs["tokens"]), "completion_tokens": 1,
                      "total_tokens": len(logprobs["tokens"]) + 1}
    return reply


def test_score_a_bos_counted_in_usage_but_not_listed(server: FakeServer):
    server.reset(("fn", llama_cpp_echo))
    [score] = make(server).score(ITALY, [[FRANCE]])
    # " Rome" only, not " Rome" and the generated "\n" (usage.prompt_tokens covers every listed token)
    assert (score.logprob, score.n_tokens) == (-0.4, 1)
    assert score.prompt_tokens == 1 + len(words(FEW_SHOT_ITALY))  # the unlisted <bos> counted, as in process


def test_score_never_sends_max_tokens_0_and_counts_the_generated_token_out(server: FakeServer):
    # llama-cpp-python reads max_tokens=0 as "no limit" and generates until its context is full
    server.reset(("fn", lambda body: vllm_echo(body, usage=False)))
    planner = make(server)
    [score] = planner.score(ITALY, [[FRANCE]])
    assert (score.logprob, score.n_tokens) == (-0.4, 1)  # the generated " Question:" is not the answer's
    planner.score_many([ITALY, ITALY], [[[]], [[FRANCE]]])
    assert [r["body"]["max_tokens"] for r in server.requests] == [1, 1, 1]
    server.reset(("status", 400, "bad"))
    with pytest.raises(PlannerError, match="HTTP 400: bad$"):
        planner.score(ITALY, [[]])
    assert [r["body"]["max_tokens"] for r in server.requests] == [1]  # a refusal is not retried with other values


def test_score_other_refusals_are_one_line_errors(server: FakeServer):
    server.reset(("status", 404, "no such route"))
    with pytest.raises(PlannerError) as info:
        make(server).score(ITALY, [[]])
    assert str(info.value) == f"POST {server.base_url}/completions: HTTP 404: no such route"
    server.reset(("status", 400, "bad"), ("status", 400, "still bad"))
    with pytest.raises(PlannerError, match="HTTP 400: bad$"):
        make(server).score(ITALY, [[]])
    assert len(server.requests) == 1


def test_score_many_keeps_order_with_concurrency(server: FakeServer):
    server.reset(("fn", vllm_echo))
    tasks = [Task(id=str(i), question=f"Question {i}?", answers=["x" * (i + 1)]) for i in range(4)]
    scores = make(server, concurrency=4).score_many(tasks, [[[], [FRANCE]]] * 4)
    assert [[s.logprob for s in task_scores] for task_scores in scores] == \
        [[pytest.approx(-(i + 1) / 10)] * 2 for i in range(4)]
    assert len(server.requests) == 8


def _mutated(change):
    def reply(body: dict[str, Any]) -> dict[str, Any]:
        out = copy.deepcopy(vllm_echo(body))
        change(out["choices"][0])
        return out
    return reply


def _set(path: str, value: Any):
    def change(choice: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        target = choice
        for key in parents:
            target = target[key]
        if value is KeyError:
            del target[last]
        else:
            target[last] = value
    return change


NEED = ("the server returns no prompt log-probabilities: it does not support echo=true with logprobs=1 on "
        "/completions, which scoring needs (vLLM's /v1/completions does)")


def _no_echo(choice: dict[str, Any]) -> None:
    """What a server that ignores echo answers: the generated token alone, with its logprob."""
    choice.update(text=" Question:", logprobs={"tokens": [" Question:"], "token_logprobs": [-0.05],
                                                "text_offset": [0]})


@pytest.mark.parametrize("change, message", [
    (_set("logprobs", KeyError), NEED + " (choices[0].logprobs is missing)"),
    (_set("logprobs", None), NEED + " (choices[0].logprobs is null)"),
    (_set("logprobs.token_logprobs", None), NEED + " (choices[0].logprobs.token_logprobs is null)"),
    (_set("logprobs.token_logprobs", KeyError), NEED + " (choices[0].logprobs.token_logprobs is missing)"),
    (lambda choice: choice["logprobs"].update(token_logprobs=[None] * len(choice["logprobs"]["tokens"])),
     NEED + " (choices[0].logprobs.token_logprobs is all null)"),
    (_no_echo, NEED + " (it did not echo the prompt: choices[0].text does not start with it: 'Question:')"),
    (lambda choice: _no_echo(choice) or choice.pop("text"),
     NEED + " (choices[0].logprobs holds 1 tokens, no more than it generated)"),
])
def test_score_without_prompt_logprobs_names_the_server_and_what_is_missing(server: FakeServer, change, message):
    def reply(body: dict[str, Any]) -> dict[str, Any]:
        out = _mutated(change)(body)
        out.pop("usage")  # counted from the lists alone
        return out
    server.reset(("fn", reply))
    with pytest.raises(PlannerError) as info:
        make(server).score(ITALY, [[FRANCE]])
    assert str(info.value) == f"POST {server.base_url}/completions: {message}"
    assert len(server.requests) == 1  # not retried


@pytest.mark.parametrize("change, message", [
    (lambda choice: choice["logprobs"]["text_offset"].pop(),
     "malformed logprobs: tokens, token_logprobs and text_offset must be lists of one length"),
    (_set("logprobs.text_offset", KeyError), "got lengths {'tokens': 20, 'token_logprobs': 20, 'text_offset': "
                                             "'missing'}"),
    (lambda choice: choice["logprobs"]["text_offset"].reverse(), "non-decreasing offsets"),
    (lambda choice: choice["logprobs"]["tokens"].__setitem__(3, 7), "malformed logprobs"),
    (_set("text", "Rome"), "the server returns no prompt log-probabilities: it does not support echo=true with "
                           "logprobs=1 on /completions, which scoring needs (vLLM's /v1/completions does) (it did "
                           "not echo the prompt: choices[0].text does not start with it: 'Rome')"),
    (lambda choice: choice["logprobs"]["token_logprobs"].__setitem__(-2, None),
     "the server returned no log-probability for answer token 18 (choices[0].logprobs.token_logprobs[18] is None)"),
    (lambda choice: choice["logprobs"]["token_logprobs"].__setitem__(-2, "x"),
     "choices[0].logprobs.token_logprobs[18] is 'x', not a log-probability (null or a finite number <= 0)"),
    (lambda choice: choice["logprobs"]["token_logprobs"].__setitem__(-2, 0.5), "token_logprobs[18] is 0.5, not a"),
    (lambda choice: choice["logprobs"]["token_logprobs"].__setitem__(-2, -10 ** 400), "is an integer of"),
    (lambda choice: choice["logprobs"].update(tokens=["me", "x"], token_logprobs=[-0.4, -0.05], text_offset=[0, 2])
     or choice.pop("text"), "the echoed prompt tokens (text_offset up to 2) cannot hold the answer's 5 characters"),
    (lambda choice: choice["logprobs"]["token_logprobs"].__setitem__(-2, math.nan),
     "response is not JSON: "),  # NaN is no JSON number
])
def test_score_malformed_logprobs(server: FakeServer, change, message):
    def reply(body: dict[str, Any]) -> dict[str, Any]:
        out = _mutated(change)(body)
        out.pop("usage")  # the prompt's tokens are then all but the generated ones (none)
        return out
    server.reset(("fn", reply))
    with pytest.raises(PlannerError) as info:
        make(server).score(ITALY, [[FRANCE]])
    assert str(info.value).startswith(f"POST {server.base_url}/completions: ")
    assert message in str(info.value) and "\n" not in str(info.value)
    assert len(server.requests) == 1


@pytest.mark.parametrize("step, message", [
    (("json", {"object": "text_completion"}), "response has no choices"),
    (("raw", "<html>"), "response is not JSON"),
])
def test_score_bad_responses(server: FakeServer, step, message):
    server.reset(step)
    with pytest.raises(PlannerError) as info:
        make(server).score(ITALY, [[]])
    assert str(info.value).startswith(f"POST {server.base_url}/completions: ") and message in str(info.value)


def test_score_input_errors_come_before_any_request(server: FakeServer):
    from memento.errors import DataFormatError

    planner = make(server)
    with pytest.raises(DataFormatError, match="no case sets to score"):
        planner.score(ITALY, [])
    with pytest.raises(DataFormatError, match="the answer ' ' is empty"):
        planner.score(ITALY, [[]], answer=" ")
    assert server.requests == []


# ---------------------------------------------------------------- config


def test_config_round_trip_and_from_config(server: FakeServer):
    planner = make(server, mode="completions", stop=["\n"], prompt=PromptConfig(style="memento_plan"))
    data = json.loads(json.dumps(to_dict(planner.config)))
    assert data["prompt"]["style"] == "memento_plan" and data["stop"] == ["\n"]
    config = from_dict(OpenAICompatConfig, data)
    assert config == planner.config
    rebuilt = OpenAICompatPlanner.from_config(config)
    assert rebuilt.config == config and rebuilt.url == f"{server.base_url}/completions"


@pytest.mark.parametrize("kwargs, field", [
    ({"model": " "}, "model"),
    ({"base_url": "127.0.0.1:8000/v1"}, "base_url"),
    ({"mode": "responses"}, "mode"),
    ({"timeout_s": 0}, "timeout_s"),
    ({"max_retries": -1}, "max_retries"),
    ({"backoff_s": -0.1}, "backoff_s"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 2 ** 20 + 1}, "max_tokens"),
    ({"max_retries": 101}, "max_retries"),
    ({"concurrency": 257}, "concurrency"),
    ({"temperature": float("nan")}, "temperature"),
    ({"stop": "\n"}, "stop"),
    ({"stop": [""]}, "stop"),
    ({"concurrency": 0}, "concurrency"),
    ({"api_key_env": ""}, "api_key_env"),
])
def test_invalid_config(kwargs: dict[str, Any], field: str):
    options: dict[str, Any] = {"model": "m", "base_url": "http://127.0.0.1:1/v1"}
    options.update(kwargs)
    with pytest.raises(ConfigError, match=f"OpenAICompatConfig.{field}="):
        OpenAICompatPlanner(options.pop("model"), options.pop("base_url"), **options)


# ---------------------------------------------------------------- httpx: pooling, pass-through fields


def test_calls_reuse_one_pooled_connection(server: FakeServer):
    server.reset(("json", chat_reply("Rome")), ("status", 500, "hiccup"), ("json", chat_reply("Rome")))
    with make(server) as planner:
        for _ in range(4):
            assert planner.plan(ITALY, []).text == "Rome"
        planner.score_request_body(ITALY, [])  # no request
    assert len(server.requests) == 5 and planner.attempts == 5
    assert len({r["client"] for r in server.requests}) == 1  # one TCP connection for all calls and the retry
    assert planner.plan(ITALY, []).text == "Rome"  # a closed planner opens a new pool
    assert len({r["client"] for r in server.requests}) == 2
    planner.close()


def test_concurrent_calls_share_at_most_concurrency_connections(server: FakeServer):
    planner = make(server, concurrency=2)
    tasks = [Task(id=str(i), question=f"Question {i}?", answers=["x"]) for i in range(8)]
    planner.plan_many(tasks, [[]] * 8)
    planner.plan_many(tasks, [[]] * 8)
    assert len(server.requests) == 16 and len({r["client"] for r in server.requests}) <= 2
    planner.close()


def test_seed_top_p_and_extra_body_reach_the_request_body(server: FakeServer):
    extra = {"top_k": 1, "chat_template_kwargs": {"enable_thinking": False}, "max_tokens": 9}
    planner = make(server, seed=7, top_p=0.9, extra_body=extra)
    planner.plan(ITALY, [])
    body = server.requests[0]["body"]
    assert (body["seed"], body["top_p"], body["top_k"]) == (7, 0.9, 1)
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert body["max_tokens"] == 9  # extra_body is merged last: it may override a field
    assert body == planner.request_body(ITALY, [])
    make(server).plan(ITALY, [])
    assert not {"seed", "top_p", "top_k"} & set(server.requests[-1]["body"])  # unset: not sent
    data = json.loads(json.dumps(to_dict(planner.config)))
    assert from_dict(OpenAICompatConfig, data) == planner.config and data["extra_body"] == extra


def test_retry_after_seconds_and_http_date_are_honoured(server: FakeServer, monkeypatch: pytest.MonkeyPatch):
    import email.utils

    delays: list[float] = []
    monkeypatch.setattr(openai_compat.time, "sleep", delays.append)
    server.reset(("retry_after", "2.5"), ("json", chat_reply()))
    assert make(server, backoff_s=0.01).plan(ITALY, []).text == "Rome"
    assert delays == [2.5]
    delays.clear()
    date = email.utils.formatdate(time.time() + 30, usegmt=True)
    server.reset(("retry_after", date), ("json", chat_reply()))
    assert make(server, backoff_s=0.01).plan(ITALY, []).text == "Rome"
    assert len(delays) == 1 and 25 <= delays[0] <= 31
    delays.clear()
    server.reset(("retry_after", "soon"), ("json", chat_reply()))  # unreadable: the backoff alone
    assert make(server, backoff_s=0.01).plan(ITALY, []).text == "Rome" and delays == [0.01]


def test_retry_after_really_waits(server: FakeServer):
    server.reset(("retry_after", "0.3"), ("json", chat_reply()))
    start = time.perf_counter()
    assert make(server, backoff_s=0.01).plan(ITALY, []).text == "Rome"
    assert time.perf_counter() - start >= 0.3


def test_missing_httpx_is_one_line_naming_the_extra(monkeypatch: pytest.MonkeyPatch):
    import builtins

    real_import = builtins.__import__

    def no_httpx(name: str, *args: Any, **kwargs: Any) -> Any:
        if name in ("httpx", "httpx2"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_httpx)
    with pytest.raises(PlannerError) as info:
        OpenAICompatPlanner("m", "http://127.0.0.1:1/v1")
    assert str(info.value) == ("OpenAICompatPlanner needs the httpx package: pip install -e '.[openai]' (in a clone "
                               "of memento)")


@pytest.mark.parametrize("kwargs, field", [
    ({"seed": 1.5}, "seed"),
    ({"seed": True}, "seed"),
    ({"top_p": 0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"extra_body": [1]}, "extra_body"),
    ({"extra_body": {"x": object()}}, "extra_body"),
])
def test_invalid_pass_through_fields(kwargs: dict[str, Any], field: str):
    with pytest.raises(ConfigError, match=f"OpenAICompatConfig.{field}="):
        OpenAICompatPlanner("m", "http://127.0.0.1:1/v1", **kwargs)
