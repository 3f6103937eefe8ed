"""The OpenAI-compatible planner's server is a network peer: its replies are input.

A raw loopback HTTP server (a thread; it writes exactly the bytes a test asks for) answers the planner with
replies drawn by hypothesis: garbage, truncated JSON, deep nesting, huge numbers, NaN, lone surrogates, NUL,
wrong types, error objects, redirects, other Content-Types, gzip, bodies cut short, stalls, 429/5xx with odd
Retry-After headers. Every call returns what a well-formed reply says or raises exactly one one-line
:class:`PlannerError`, after exactly the attempts the classification (retried or not) implies; nonsense never
becomes an answer or a score. Targeted tests: the total deadline against slow drips (body and headers), the
size cap (announced, streamed, a gzip bomb) and the retry-vs-refuse table.
"""

from __future__ import annotations

import dataclasses
import email.utils
import gzip
import json
import socket
import socketserver
import threading
import time
import zlib
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memento.planners import openai_compat
from memento.planners.base import AnswerScore, PlannerError, PlanOutput
from memento.planners.openai_compat import _ERROR_BODY_BYTES, OpenAICompatPlanner
from memento.planners.prompts import PromptConfig
from memento.types import Case, Task
from tests.fuzzing import FUZZ, examples, record
from tests.unit.test_openai_compat import vllm_echo

pytestmark = pytest.mark.probe  # `make probe` runs it scaled up

ITALY = Task(id="t1", question="What is the capital of Italy?", answers=["Rome"])
FRANCE = Case(state="What is the capital of France?", action="Paris", reward=1.0)
MAX_TOKENS = 2  # answers of more than 64 * 2 characters are refused
TIMEOUT_S = 0.3


@dataclasses.dataclass(frozen=True)
class Reply:
    """One scripted answer. ``body`` is bytes or a function of the request's JSON. ``mode``: ``whole``
    (Content-Length, keep-alive), ``eof`` (no Content-Length; the body ends when the connection closes),
    ``cut`` (Content-Length announced, half the body sent, then closed), ``stall`` (half the body, then
    silence past the planner's deadline), ``drip`` (the reply in ``pieces`` pieces, or one byte at a time when
    0, one every ``drip_s``)."""

    body: bytes | Callable[[dict[str, Any]], bytes] = b"{}"
    status: int = 200
    content_type: str | None = "application/json"
    headers: tuple[tuple[str, str], ...] = ()
    mode: str = "whole"
    drip_s: float = 0.0
    pieces: int = 0
    encoding: str | None = None  # gzip / deflate: the body is compressed (its bytes are already, for others)


class PeerServer:
    """A raw HTTP/1.1 server on 127.0.0.1 answering POST n with ``script[min(n, len - 1)]``."""

    def __init__(self) -> None:
        self.script: list[Reply] = [Reply()]
        self.requests = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()
        peer = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                sock: socket.socket = self.request
                sock.settimeout(5.0)
                buffer = b""
                try:
                    while not peer.stop.is_set():
                        while b"\r\n\r\n" not in buffer:
                            data = sock.recv(65536)
                            if not data:
                                return
                            buffer += data
                        head, buffer = buffer.split(b"\r\n\r\n", 1)
                        length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                                       if line.lower().startswith(b"content-length:")), 0)
                        while len(buffer) < length:
                            buffer += sock.recv(65536)
                        request, buffer = json.loads(buffer[:length]), buffer[length:]
                        with peer.lock:
                            reply = peer.script[min(peer.requests, len(peer.script) - 1)]
                            peer.requests += 1
                        if not peer.answer(sock, reply, request):
                            return
                except OSError:  # the planner gave up on the connection
                    return

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def answer(self, sock: socket.socket, reply: Reply, request: dict[str, Any]) -> bool:
        """Write ``reply``; whether the connection stays open."""
        body = reply.body(request) if callable(reply.body) else reply.body
        if reply.encoding == "gzip":
            body = gzip.compress(body)
        elif reply.encoding == "deflate":
            body = zlib.compress(body)
        lines = [f"HTTP/1.1 {reply.status} X"]
        if reply.content_type is not None:
            lines.append(f"Content-Type: {reply.content_type}")
        if reply.encoding is not None:
            lines.append(f"Content-Encoding: {reply.encoding}")
        lines += [f"{name}: {value}" for name, value in reply.headers]
        keep = reply.mode == "whole"
        if reply.mode != "eof":
            lines.append(f"Content-Length: {len(body)}")
        lines.append("Connection: keep-alive" if keep else "Connection: close")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        if reply.mode == "drip":
            data = head + body
            size = -(-len(data) // reply.pieces) if reply.pieces else 1
            for i in range(0, len(data), size):
                if self.stop.wait(reply.drip_s):
                    return False
                sock.sendall(data[i:i + size])
            return False
        if reply.mode in ("cut", "stall"):
            sock.sendall(head + body[:len(body) // 2])
            if reply.mode == "stall":
                self.stop.wait(TIMEOUT_S * 3)
            return False
        sock.sendall(head + body)
        return keep

    def reset(self, *script: Reply) -> None:
        with self.lock:
            self.script = list(script)
            self.requests = 0

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def peer():
    server = PeerServer()
    yield server
    server.close()


@pytest.fixture(autouse=True)
def _fast_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    # a Retry-After of 1e308 is capped at 60 s (test_retry_after_is_capped); here the cap is made tiny
    monkeypatch.setattr(openai_compat, "_MAX_BACKOFF_S", 0.01)


def make(peer: PeerServer, **kwargs: Any) -> OpenAICompatPlanner:
    options: dict[str, Any] = dict(api_key_env=None, timeout_s=TIMEOUT_S, score_timeout_s=TIMEOUT_S, max_retries=1,
                                   backoff_s=0.01, max_tokens=MAX_TOKENS)
    options.update(kwargs)
    return OpenAICompatPlanner("m", peer.base_url, **options)


# ---------------------------------------------------------------- replies and what they mean

@dataclasses.dataclass(frozen=True)
class Case_:
    """A drawn reply with its meaning: ``transient`` (retried), else ``expect`` (None: refused)."""

    reply: Reply
    transient: bool = False
    expect: Any = None


def _dumps(value: Any) -> bytes:
    return json.dumps(value).encode("utf-8")


def _content() -> st.SearchStrategy[tuple[Any, str | None]]:
    """(content, the answer it gives or None when refused)."""
    def meaning(text: str) -> str | None:
        return None if "\x00" in text or len(text) > 64 * MAX_TOKENS else text
    return st.one_of(
        st.text(max_size=40).map(lambda t: (t, meaning(t))),
        st.text(min_size=120, max_size=140).map(lambda t: (t, meaning(t))),
        st.just((None, "")),
        st.sampled_from([3, 2.5, True, [], {"text": "Rome"}, ["Rome"]]).map(lambda v: (v, None)),
        st.just(("Ro\x00me", None)),
    )


COUNTS_OK = st.one_of(st.none(), st.integers(0, 2 ** 31 - 1))
COUNTS_BAD = st.one_of(st.integers(max_value=-1), st.integers(min_value=2 ** 31), st.floats(allow_nan=False),
                       st.booleans(), st.text(max_size=5), st.just([1]))


@st.composite
def _usage(draw: st.DrawFn) -> tuple[Any, tuple[int, int] | None]:
    """(usage or a missing marker, the counts it gives or None when refused)."""
    kind = draw(st.sampled_from(["missing", "null", "ok", "bad", "not a dict"]))
    if kind == "missing":
        return ..., (0, 0)
    if kind == "null":
        return None, (0, 0)
    if kind == "not a dict":
        return draw(st.sampled_from([[1, 2], "lots", 7])), None
    usage: dict[str, Any] = {"total_tokens": draw(st.integers(-5, 10))}  # not read
    bad_key = draw(st.sampled_from(["prompt_tokens", "completion_tokens"])) if kind == "bad" else None
    for key in ("prompt_tokens", "completion_tokens"):
        if key == bad_key:
            usage[key] = draw(COUNTS_BAD)
        elif draw(st.booleans()):
            usage[key] = draw(COUNTS_OK)
    if bad_key is not None:
        return usage, None
    return usage, (usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0)


def _cut_at_stop(text: str) -> str:
    cuts = [i for i in (text.find(s) for s in PromptConfig().stop) if i >= 0]
    return (text[:min(cuts)] if cuts else text).strip()


BROKEN_DOCUMENTS = [
    b"", b"   ", b"null", b"[1, 2]", b'"text"', b"3", b"<html>502 Bad Gateway</html>", b"\xff\xfe{}",
    b'{"choices": [{"message": {"content": "R', b'{"choices": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    b'{"choices": [{"message": {"content": "Rome"}}], "usage": {"prompt_tokens": ' + b"9" * 5000 + b"}}",
    b'{"choices": [{"message": {"content": "Rome"}}], "usage": {"prompt_tokens": NaN}}',
    b'{"choices": [{"message": {"content": "Rome"}}], "usage": {"prompt_tokens": 1e999}}',
    b'{"choices": [{"message": {"content": "Rome"}}], "id": Infinity}',
    b'{"choices": [{"message": {"content": "Ro\\ud800me"}}]}',
    b'{"choices": [{"message": {"content": "Rome"}}], "x": "\\udfff"}',
    b'{"error": {"message": "model overloaded", "code": 503}}', b'{"error": "' + b"e" * 10_000 + b'"}',
    b'{"choices": []}', b'{"choices": {"0": {"message": {"content": "Rome"}}}}', b'{"choices": ["Rome"]}',
    b'{"choices": [{"message": "Rome"}]}', b'{"choices": [{"text": "Rome"}]}', b'{"choices": null}',
]


def _sent_len(body: bytes | Callable[[dict[str, Any]], bytes], encoding: str | None) -> int:
    """The bytes the server sends of ``body`` (0 for a body made from the request: those are small)."""
    if callable(body):
        return 0
    if encoding == "gzip":
        return len(gzip.compress(body))
    if encoding == "deflate":
        return len(zlib.compress(body))
    return len(body)


@st.composite
def _wire(draw: st.DrawFn, body: bytes | Callable[[dict[str, Any]], bytes], valid: bool, expect: Any) -> Case_:
    """The same body through a drawn status, Content-Type, coding and delivery."""
    status = draw(st.sampled_from([200] * 12 + [201, 301, 302, 307, 400, 401, 404, 422, 429, 500, 502, 503]))
    content_type = draw(st.sampled_from(["application/json", "application/json", "application/json; charset=utf-8",
                                         None, "application/vnd.x+json", "text/html", "text/plain",
                                         "text/event-stream"]))
    headers: list[tuple[str, str]] = []
    if status in (429, 503):
        far = email.utils.formatdate(time.time() + 10 ** 9, usegmt=True)
        headers.append(("Retry-After", draw(st.sampled_from(
            ["0", "1e308", "inf", "nan", "-1", far, "Fri, 31 Dec 9999 23:59:59 GMT", "soon", "9" * 400]))))
    if 300 <= status < 400:
        headers.append(("Location", draw(st.sampled_from(["http://198.51.100.7/v1/chat/completions", "/elsewhere"]))))
    encoding = draw(st.sampled_from([None, None, None, "gzip", "deflate", "br"]))
    mode = draw(st.sampled_from(["whole"] * 6 + ["eof", "cut", "stall", "drip"]))
    if mode in ("cut", "stall") and not callable(body) and _sent_len(body, None if encoding == "br" else encoding) == 0:
        mode = "whole"  # half of nothing is all of it (a "br" body is sent as it is)
    reply = Reply(body=body, status=status, content_type=content_type, headers=tuple(headers), mode=mode,
                  drip_s=0.002, pieces=8, encoding=encoding if encoding != "br" else None)
    if encoding == "br":  # bytes the planner cannot undo
        reply = dataclasses.replace(reply, headers=(*reply.headers, ("Content-Encoding", "br")))
    refused_early = (300 <= status < 500 and status != 429  # an error body is read up to its cap only: a cut
                     and _sent_len(body, reply.encoding) // 2 > _ERROR_BODY_BYTES)  # past the cap is never seen
    if (mode in ("cut", "stall") and not refused_early) or status == 429 or status >= 500:
        return Case_(reply, transient=True)
    json_type = content_type is None or content_type.split(";")[0].endswith("json")
    ok = 200 <= status < 300 and json_type and encoding != "br" and valid
    return Case_(reply, expect=expect if ok else None)


@st.composite
def plan_cases(draw: st.DrawFn) -> Case_:
    if draw(st.integers(0, 4)) == 0:
        return draw(_wire(draw(st.sampled_from(BROKEN_DOCUMENTS)), False, None))
    content, answer = draw(_content())
    usage, counts = draw(_usage())
    reply: dict[str, Any] = {"id": "x", "object": "chat.completion",
                             "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                                          "finish_reason": "stop"}]}
    if usage is not ...:
        reply["usage"] = usage
    if draw(st.booleans()):
        reply["system_fingerprint"] = draw(st.text(max_size=10))  # unknown fields are fine
    valid = answer is not None and counts is not None
    expect = (_cut_at_stop(answer), *counts) if valid else None  # type: ignore[arg-type]
    return draw(_wire(_dumps(reply), valid, expect))


def _answer_token(choice: dict[str, Any], value: Any) -> None:
    choice["logprobs"]["token_logprobs"][-2] = value  # the last is the one generated token (max_tokens: 1)


SCORE_BENIGN: list[Callable[[dict[str, Any]], Any]] = [
    lambda reply: None,
    lambda reply: reply.pop("usage"),
    lambda reply: reply["choices"][0]["logprobs"]["token_logprobs"].__setitem__(1, -37.5),  # not the answer's
    lambda reply: reply["choices"][0].pop("text"),
    lambda reply: reply.update(extra={"nested": [1, 2, 3]}),
]
SCORE_BAD: list[Callable[[dict[str, Any]], Any]] = [
    lambda reply: _answer_token(reply["choices"][0], 0.25),  # a probability above 1
    lambda reply: _answer_token(reply["choices"][0], "x"),
    lambda reply: _answer_token(reply["choices"][0], True),
    lambda reply: _answer_token(reply["choices"][0], None),
    lambda reply: _answer_token(reply["choices"][0], -10 ** 400),
    lambda reply: _answer_token(reply["choices"][0], [-0.4]),
    lambda reply: reply["choices"][0]["logprobs"]["token_logprobs"].__setitem__(1, 3.0),
    lambda reply: reply["choices"][0]["logprobs"]["text_offset"].__setitem__(0, -1),
    lambda reply: reply["choices"][0]["logprobs"]["text_offset"].reverse(),
    lambda reply: reply["choices"][0]["logprobs"]["text_offset"].pop(),
    lambda reply: reply["choices"][0]["logprobs"]["tokens"].__setitem__(2, 7),
    lambda reply: reply["choices"][0]["logprobs"].update(token_logprobs="-0.4"),
    lambda reply: reply["choices"][0].update(logprobs=None),
    lambda reply: reply["choices"][0].update(text=12),
    lambda reply: reply["choices"][0].update(text="Rome"),
    lambda reply: reply["usage"].update(prompt_tokens=-3),
    lambda reply: reply["usage"].update(prompt_tokens=2 ** 40),
    lambda reply: reply.update(usage="many"),
    lambda reply: reply.update(choices=[]),
]
SCORE = (-0.4, 1)  # " Rome" after FRANCE's demonstration (vllm_echo's toy logprobs; test_openai_compat checks it)


@st.composite
def score_cases(draw: st.DrawFn) -> Case_:
    if draw(st.integers(0, 4)) == 0:
        return draw(_wire(draw(st.sampled_from(BROKEN_DOCUMENTS)), False, None))
    bad = draw(st.booleans())
    change = draw(st.sampled_from(SCORE_BAD if bad else SCORE_BENIGN))

    def body(request: dict[str, Any]) -> bytes:
        reply = vllm_echo(request)
        change(reply)
        return _dumps(reply)
    return draw(_wire(body, not bad, None if bad else SCORE))


def _outcome(cases: list[Case_], attempts: int) -> tuple[Any, int]:
    """(what the call must give -- None: a PlannerError --, the requests it takes). Scoring asks the same way
    (``max_tokens: 1`` from the first request: an HTTP 400 is an answer, not a cue to ask again)."""
    for requests in range(1, attempts + 1):
        case = cases[min(requests - 1, len(cases) - 1)]
        if not case.transient:
            return case.expect, requests
    return None, attempts


def _check_error(error: PlannerError, url: str) -> None:
    text = str(error)
    assert type(error) is PlannerError and text.startswith(f"POST {url}: "), text
    assert len(text.splitlines()) == 1 and "\n" not in text and len(text) < 1000, text


@settings(FUZZ, max_examples=examples(40))
@given(cases=st.lists(plan_cases(), min_size=1, max_size=2))
def test_fuzz_plan_replies(peer: PeerServer, cases: list[Case_]) -> None:
    record(__name__, "inputs")
    peer.reset(*[case.reply for case in cases])
    expect, requests = _outcome(cases, 2)
    with make(peer) as planner:
        try:
            out = planner.plan(ITALY, [FRANCE])
        except PlannerError as error:
            _check_error(error, planner.url)
            out = None
        except Exception as error:  # noqa: BLE001 - anything else is the bug this test looks for
            record(__name__, "tracebacks")
            raise AssertionError(f"{type(error).__name__} escaped: {error}") from error
    record(__name__, "requests", peer.requests)
    assert peer.requests == requests
    if expect is None:
        assert out is None, f"nonsense accepted: {out}"
    else:
        assert isinstance(out, PlanOutput) and (out.text, out.prompt_tokens, out.output_tokens) == expect


@settings(FUZZ, max_examples=examples(30))
@given(cases=st.lists(score_cases(), min_size=1, max_size=2))
def test_fuzz_score_replies(peer: PeerServer, cases: list[Case_]) -> None:
    record(__name__, "inputs")
    peer.reset(*[case.reply for case in cases])
    expect, requests = _outcome(cases, 2)
    with make(peer) as planner:
        try:
            [score] = planner.score(ITALY, [[FRANCE]])
        except PlannerError as error:
            _check_error(error, planner.completions_url)
            score = None
        except Exception as error:  # noqa: BLE001
            record(__name__, "tracebacks")
            raise AssertionError(f"{type(error).__name__} escaped: {error}") from error
    record(__name__, "requests", peer.requests)
    if expect is None:
        assert score is None, f"nonsense accepted: {score}"
    else:
        assert isinstance(score, AnswerScore) and (score.logprob, score.n_tokens) == pytest.approx(expect)
    assert peer.requests == requests


# ---------------------------------------------------------------- the deadline, the size cap, the classification

def _ok() -> bytes:
    return _dumps({"choices": [{"message": {"content": "Rome"}}]})


@pytest.mark.parametrize("what", ["body", "headers"])
def test_a_slow_drip_is_cut_off_at_the_total_deadline(peer: PeerServer, what: str) -> None:
    # one byte every 50 ms: each read succeeds (a per-read timeout never fires), the whole reply takes seconds
    body = _ok() + b" " * 200 if what == "body" else _ok()
    peer.reset(Reply(body=body, mode="drip", drip_s=0.05, headers=(("X-Pad", "p" * 100),)))
    with make(peer, timeout_s=0.5, max_retries=1) as planner:
        start = time.monotonic()
        with pytest.raises(PlannerError) as info:
            planner.plan(ITALY, [])
        elapsed = time.monotonic() - start
    assert "timed out (timeout_s=0.5 for the whole attempt) after 2 attempts" in str(info.value)
    assert peer.requests == 2
    assert 1.0 <= elapsed < 1.0 + 0.5, elapsed  # two attempts of 0.5 s (and a 0.01 s backoff), within a margin


def test_a_drip_that_ends_in_time_is_read(peer: PeerServer) -> None:
    peer.reset(Reply(body=_ok(), mode="drip", drip_s=0.001))
    with make(peer, timeout_s=5.0) as planner:
        assert planner.plan(ITALY, []).text == "Rome"


def test_size_cap(peer: PeerServer, monkeypatch: pytest.MonkeyPatch) -> None:
    big = b'{"choices": [{"message": {"content": "' + b"x" * (openai_compat.MAX_REPLY_BYTES + 10) + b'"}}]}'
    with make(peer, timeout_s=10.0) as planner:
        for mode, message in (("whole", "announces a body of"), ("eof", "with a body of more than 16777216 bytes")):
            peer.reset(Reply(body=big, mode=mode))
            with pytest.raises(PlannerError, match=message):
                planner.plan(ITALY, [])
            assert peer.requests == 1  # not retried
        bomb = b'{"choices": [{"message": {"content": "' + b"0" * (64 * 2 ** 20) + b'"}}]}'
        peer.reset(Reply(body=bomb, encoding="gzip"))
        with pytest.raises(PlannerError, match="decompresses to more than 16777216 bytes"):
            planner.plan(ITALY, [])
        peer.reset(Reply(body=_ok(), encoding="gzip"))  # a body compressed as asked is read
        assert planner.plan(ITALY, []).text == "Rome"
    monkeypatch.setattr(openai_compat, "MAX_REPLY_BYTES", 100)
    peer.reset(Reply(body=_dumps({"choices": [{"message": {"content": "R" * 50}}], "pad": "p" * 60}), mode="eof"))
    with make(peer) as planner, pytest.raises(PlannerError, match="more than 100 bytes"):
        planner.plan(ITALY, [])


@pytest.mark.parametrize("reply, retried, message", [
    (Reply(status=500, body=b"boom"), True, "HTTP 500 after 2 attempts: boom"),
    (Reply(status=429, body=b"slow down", headers=(("Retry-After", "1e308"),)), True, "HTTP 429 after 2 attempts"),
    (Reply(body=_ok(), mode="cut"), True, "connection failed after 2 attempts"),
    (Reply(body=_ok(), mode="stall"), True, "timed out"),
    (Reply(status=404, body=b"no route"), False, "HTTP 404: no route"),
    (Reply(status=302, headers=(("Location", "http://198.51.100.7/v1/x"),)), False,
     "HTTP 302 redirect to 'http://198.51.100.7/v1/x': redirects are not followed"),
    (Reply(body=_ok(), content_type="text/html"), False, "Content-Type 'text/html', expected application/json"),
    (Reply(body=b""), False, "response is not JSON: '' ("),
    (Reply(body=b'{"choices": [{"message": {"content": "Ro', mode="eof"), False, "response is not JSON"),
    (Reply(body=b'{"error": {"message": "no such model"}}'), False,
     "the server answered with an error: '{\"message\": \"no such model\"}'"),
    (Reply(body=b"[" * 100_000), False, "nested deeper than 100 levels"),
    (Reply(body=b'{"usage": {"prompt_tokens": ' + b"1" * 5000 + b"}}"), False, "response is not JSON"),
    (Reply(body=_dumps({"choices": [{"message": {"content": "x" * 129}}]})), False,
     "choices[0].message.content is 129 characters, more than max_tokens=2 tokens can hold (128)"),
    (Reply(body=_dumps({"choices": [{"message": {"content": "Rome"}}], "usage": {"completion_tokens": -1}})),
     False, "usage.completion_tokens is -1, expected a token count"),
    (Reply(body=b"{}", headers=(("Content-Encoding", "br"),)), False, "Content-Encoding 'br' is not supported"),
])
def test_retried_or_one_line(peer: PeerServer, reply: Reply, retried: bool, message: str) -> None:
    peer.reset(reply)
    with make(peer) as planner, pytest.raises(PlannerError) as info:
        planner.plan(ITALY, [])
    _check_error(info.value, planner.url)
    assert message in str(info.value)
    assert peer.requests == (2 if retried else 1)


def test_a_transient_failure_then_a_good_reply_succeeds(peer: PeerServer) -> None:
    for first in (Reply(body=_ok(), mode="cut"), Reply(status=503, body=b"warming up"),
                  Reply(body=_ok(), mode="stall")):
        peer.reset(first, Reply(body=_ok()))
        with make(peer) as planner:
            assert planner.plan(ITALY, []).text == "Rome"
        assert peer.requests == 2


def test_retry_after_is_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.undo()  # the real cap
    far = email.utils.formatdate(time.time() + 10 ** 9, usegmt=True)
    for header in ("1e308", "inf", far, "Fri, 31 Dec 9999 23:59:59 GMT"):
        wait = openai_compat._retry_after(header)
        assert wait is not None and wait > 60 and min(wait, openai_compat._MAX_BACKOFF_S) == 60.0
    for header in ("nan", "soon", "9" * 400 + "x", "Mon, 99 Foo 99999 99:99:99 GMT"):
        assert openai_compat._retry_after(header) is None


# ---------------------------------------------------------------- the run keeps its committed steps

@pytest.mark.slow
def test_an_online_run_whose_server_turns_hostile_keeps_its_committed_steps_and_resumes(
        peer: PeerServer, tmp_path, capsys) -> None:
    from pathlib import Path

    from memento.cli.entry import main
    from memento.formats import read_steps_jsonl

    suite = Path(__file__).resolve().parents[2] / "data" / "facts"
    out = tmp_path / "run"
    argv = ["online", "--tasks", str(suite / "test.jsonl"), "--cases", str(suite / "cases.jsonl"),
            "--planner", f"openai:m@{peer.base_url}", "--policy", "similarity", "--steps", "6", "--k", "2",
            "--candidates", "8", "--checkpoint-every", "1", "--out", str(out), "--no-progress"]
    good = Reply(body=_dumps({"choices": [{"message": {"content": "Paris"}}], "usage": {"prompt_tokens": 9}}))
    peer.reset(good, good, good, Reply(body=b"<html>" + b"\x00" * 10 + b"garbage"))
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("memento: error: POST ") and "response is not JSON" in err[0], err
    assert peer.requests == 4  # not retried
    steps = out / "similarity" / "steps.jsonl"
    assert [r.step for r in read_steps_jsonl(steps)] == [0, 1, 2]  # the committed steps, nothing of the 4th
    assert [r.step for r in read_steps_jsonl(out / "similarity" / "checkpoint" / "steps.jsonl")] == [0, 1, 2]

    peer.reset(good)
    assert main([*argv, "--resume"]) == 0, capsys.readouterr().err
    records = read_steps_jsonl(steps)
    assert [r.step for r in records] == list(range(6))  # none lost, none twice
    assert peer.requests == 3
    record(__name__, "requests", 7)
