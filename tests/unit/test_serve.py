"""memento serve / memento mcp without a model: the HTTP layer (validation, auth, 404, 413), the single
writer, token and host rules, the CLI's one-line errors, and the MCP tools in-process.

A small in-test double implements the Selector contract (select/feedback/add_case/get_case/stats/save);
the real selector is exercised in tests/integration/test_serve_real.py and test_mcp.py.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from memento.errors import ConfigError, DataFormatError, DimensionError, UnknownCaseError, UnknownSelectionError
from memento.serve.app import (
    TOKEN_ENV,
    ServeConfig,
    ServerUnavailableError,
    Writer,
    check_host,
    create_app,
    is_loopback,
    resolve_token,
    token_matches,
)
from memento.types import Case

TOKEN = "test-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@dataclasses.dataclass(frozen=True)
class _Result:
    selection_id: str
    ids: tuple[str, ...]
    cases: tuple[Case, ...]
    probs: tuple[float, ...]
    mode: str

    def to_dict(self) -> dict[str, Any]:
        return {"selection_id": self.selection_id, "mode": self.mode, "policy_version": 0, "set_prob": 1.0,
                "cases": [{**c.to_json(), "id": i, "prob": np.float32(p), "score": np.float32(-r),
                           "similarity": np.float32(1.0 - r / 10)}
                          for r, (i, c, p) in enumerate(zip(self.ids, self.cases, self.probs))]}


class FakeSelector:
    """The Selector contract in memory (thread-safe), counting saves."""

    dim = 8

    def __init__(self, n: int = 6, *, block: threading.Event | None = None):
        self.lock = threading.RLock()
        self.cases = {f"c{i}": Case(id=f"c{i}", state=f"state {i}", action=f"action {i}", reward=float(i % 2))
                      for i in range(n)}
        self.pending: set[str] = set()
        self.feedbacks: list[tuple[str, float]] = []
        self.saves = 0
        self.block = block

    def select(self, query: Any, k: int = 4, mode: str = "sample", env: str | None = None, *, track: bool = True,
               scope: Any = None, filter: Any = None, include_global: bool = False) -> _Result:
        with self.lock:
            if isinstance(query, np.ndarray):
                if query.shape != (self.dim,):
                    raise DimensionError(f"query embedding shape={query.shape}, selector dim={self.dim}")
            elif not query.strip():
                raise DataFormatError("query text is empty")
            ids = tuple(case_id for case_id, case in self.cases.items()
                        if self._keeps(case, env, scope, filter, include_global))[:k]
            sid = uuid.uuid4().hex
            self.pending.add(sid)
            return _Result(sid, ids, tuple(self.cases[i] for i in ids), tuple(1.0 / len(ids) for _ in ids), mode)

    @staticmethod
    def _keeps(case: Case, env: str | None, scope: Any, filter: Any, include_global: bool = False) -> bool:
        """The real selector's verdicts (memento.bank.where), for the scoped reads."""
        from memento.bank.where import as_scope, parse_filter

        scope, where = as_scope(scope, include_global=include_global), parse_filter(filter)
        return ((env is None or case.env == env) and (scope is None or scope.matches(case))
                and (where is None or where.matches(case)))

    def search_cases(self, query: Any, k: int = 10, *, env: str | None = None, scope: Any = None,
                     filter: Any = None, include_global: bool = False) -> list[tuple[Case, float]]:
        with self.lock:
            kept = [case for case in self.cases.values() if self._keeps(case, env, scope, filter, include_global)][:k]
            return [(case, 1.0 - r / 10) for r, case in enumerate(kept)]

    def list_cases(self, *, env: str | None = None, scope: Any = None, filter: Any = None, limit: int = 100,
                   offset: int = 0, include_global: bool = False) -> list[Case]:
        with self.lock:
            return [case for case in self.cases.values()
                    if self._keeps(case, env, scope, filter, include_global)][offset:][:limit]

    def feedback(self, selection_id: str, reward: float) -> dict[str, Any]:
        if self.block is not None:
            self.block.wait(5)
        with self.lock:
            if not 0.0 <= reward <= 1.0:
                raise DataFormatError(f"reward={reward!r}: must be in [0, 1]")
            if selection_id not in self.pending:
                raise UnknownSelectionError(f"unknown selection id {selection_id!r}")
            self.pending.remove(selection_id)
            self.feedbacks.append((selection_id, reward))
            return {"selection_id": selection_id, "reward": reward, "recorded": True, "updates": 0}

    def add_case(self, state: str, action: str, reward: float, env: str | None = None,
                 meta: dict | None = None, *, embedding: np.ndarray | None = None, scope: Any = None) -> str:
        with self.lock:
            if embedding is not None and embedding.shape != (self.dim,):
                raise DimensionError(f"case state vector has shape {embedding.shape}, selector dim={self.dim}")
            case_id = f"c{len(self.cases)}"
            owner = dict(scope or {})
            self.cases[case_id] = Case(id=case_id, state=state, action=action, reward=reward, env=env,
                                       meta=meta or {}, **owner)
            return case_id

    def get_case(self, case_id: str) -> Case:
        with self.lock:
            if case_id not in self.cases:
                raise UnknownCaseError(f"unknown case id {case_id!r}")
            return self.cases[case_id]

    def stats(self) -> dict[str, Any]:
        with self.lock:
            return {"cases": len(self.cases), "feedbacks": len(self.feedbacks), "updates": 0,
                    "pending_selections": len(self.pending), "dim": np.int64(self.dim), "learn": False}

    def save(self, path: Any = None) -> Path:
        with self.lock:
            self.saves += 1
            return Path("/nonexistent/artifact")

    def close(self) -> None:
        pass


@pytest.fixture
def selector() -> FakeSelector:
    return FakeSelector()


@pytest.fixture
def client(selector: FakeSelector):
    from fastapi.testclient import TestClient

    app = create_app(selector, token=TOKEN, max_body_bytes=4096)
    with TestClient(app) as c:
        yield c


def _fields(response: Any) -> list[str]:
    """The field names a 422 answer points at."""
    assert response.status_code == 422, response.text
    return [str(part) for err in response.json()["detail"] for part in err["loc"]]


# ---------------------------------------------------------------- auth


def test_healthz_and_openapi_need_no_token(client: Any) -> None:
    assert client.get("/healthz").json()["status"] == "ok"
    spec = client.get("/openapi.json").json()
    for path in ("/v1/select", "/v1/feedback", "/v1/cases", "/v1/cases/{case_id}", "/v1/cases/{case_id}/history",
                 "/v1/cases/count", "/v1/stats", "/healthz"):
        assert path in spec["paths"], path
    assert any(s.get("scheme") == "bearer" for s in spec["components"]["securitySchemes"].values())


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong-token-0123456789"},
                                     {"Authorization": f"Basic {TOKEN}"}, {"Authorization": "Bearer"}])
def test_every_v1_endpoint_refuses_a_missing_or_wrong_token(client: Any, headers: dict[str, str]) -> None:
    calls = [("post", "/v1/select", {"query": "q"}), ("post", "/v1/feedback", {"selection_id": "x", "reward": 1}),
             ("post", "/v1/cases", {"state": "s", "action": "a", "reward": 1}), ("get", "/v1/cases/c0", None),
             ("get", "/v1/stats", None), ("patch", "/v1/cases/c0", {"reward": 1}),
             ("get", "/v1/cases/c0/history", None), ("get", "/v1/cases/count", None),
             ("delete", "/v1/cases?user=u", None)]
    for method, path, body in calls:
        response = client.request(method, path, json=body, headers=headers)
        assert response.status_code == 401, (path, response.text)
        assert response.headers["www-authenticate"] == "Bearer"


def test_no_auth_app_serves_without_a_token(selector: FakeSelector) -> None:
    from fastapi.testclient import TestClient

    with TestClient(create_app(selector, token=None)) as c:
        assert c.post("/v1/select", json={"query": "q", "k": 2}).status_code == 200


def test_token_matches_is_exact() -> None:
    assert token_matches(f"Bearer {TOKEN}", TOKEN)
    assert token_matches(f"bearer {TOKEN}", TOKEN)
    for header in (None, "", TOKEN, f"Bearer {TOKEN}x", f"Bearer {TOKEN[:-1]}", f"Token {TOKEN}"):
        assert not token_matches(header, TOKEN), header


# ---------------------------------------------------------------- select / feedback / cases


def test_select_feedback_roundtrip(client: Any, selector: FakeSelector) -> None:
    answer = client.post("/v1/select", json={"query": "capital of Peru?", "k": 3, "mode": "greedy"}, headers=AUTH)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert [c["id"] for c in body["cases"]] == ["c0", "c1", "c2"] and body["mode"] == "greedy"
    assert isinstance(body["cases"][0]["prob"], float)  # numpy scalars became JSON numbers
    by_vector = client.post("/v1/select", json={"embedding": [0.1] * 8, "k": 2}, headers=AUTH)
    assert by_vector.status_code == 200 and len(by_vector.json()["cases"]) == 2
    fb = client.post("/v1/feedback", json={"selection_id": body["selection_id"], "reward": 1}, headers=AUTH)
    assert fb.status_code == 200 and fb.json()["recorded"] is True
    assert selector.feedbacks == [(body["selection_id"], 1.0)]  # recorded before the answer
    again = client.post("/v1/feedback", json={"selection_id": body["selection_id"], "reward": 1}, headers=AUTH)
    assert again.status_code == 404 and "unknown selection" in again.json()["detail"]
    stats = client.get("/v1/stats", headers=AUTH).json()
    assert stats["feedbacks"] == 1 and stats["dim"] == 8
    assert stats["server"]["recorded_feedback"] == 1 and stats["server"]["auth"] is True


@pytest.mark.parametrize(("body", "field"), [
    ({"query": "q", "k": 0}, "k"),
    ({"query": "q", "k": 65}, "k"),
    ({"query": "q", "k": "four"}, "k"),
    ({"query": "q", "mode": "best"}, "mode"),
    ({"query": ""}, "query"),
    ({"query": 3}, "query"),
    ({"query": "q", "qurey": "typo"}, "qurey"),
    ({"embedding": []}, "embedding"),
    ({"embedding": ["a"]}, "embedding"),
    ({"embedding": [0.1] * 5}, "embedding"),  # the selector's DimensionError
    ({"query": "   "}, "query"),  # the selector's DataFormatError
    ({"query": "q", "env": ""}, "env"),
])
def test_select_validation_names_the_field(client: Any, body: dict[str, Any], field: str) -> None:
    assert field in _fields(client.post("/v1/select", json=body, headers=AUTH))


@pytest.mark.parametrize("body", [{}, {"query": "q", "embedding": [0.1] * 8}])
def test_select_needs_exactly_one_of_query_or_embedding(client: Any, body: dict[str, Any]) -> None:
    response = client.post("/v1/select", json=body, headers=AUTH)
    assert response.status_code == 422
    assert "exactly one of 'query'" in json.dumps(response.json())


def test_non_finite_numbers_are_refused(client: Any) -> None:
    raw = b'{"embedding": [NaN, 0, 0, 0, 0, 0, 0, 0]}'
    response = client.post("/v1/select", content=raw, headers={**AUTH, "Content-Type": "application/json"})
    assert "embedding" in _fields(response)
    raw = b'{"selection_id": "x", "reward": Infinity}'
    response = client.post("/v1/feedback", content=raw, headers={**AUTH, "Content-Type": "application/json"})
    assert "reward" in _fields(response)


@pytest.mark.parametrize(("body", "field"), [
    ({"selection_id": "x", "reward": 1.5}, "reward"),
    ({"selection_id": "x", "reward": -0.1}, "reward"),
    ({"selection_id": "", "reward": 1}, "selection_id"),
    ({"reward": 1}, "selection_id"),
    ({"selection_id": "x"}, "reward"),
])
def test_feedback_validation_names_the_field(client: Any, body: dict[str, Any], field: str) -> None:
    assert field in _fields(client.post("/v1/feedback", json=body, headers=AUTH))


def test_cases_add_get_and_404(client: Any) -> None:
    added = client.post("/v1/cases", json={"state": "new task", "action": "did it", "reward": 1, "env": "facts",
                                           "meta": {"source": "test"}}, headers=AUTH)
    assert added.status_code == 200, added.text
    case = client.get(f"/v1/cases/{added.json()['id']}", headers=AUTH).json()
    assert (case["state"], case["action"], case["reward"], case["env"]) == ("new task", "did it", 1.0, "facts")
    assert case["meta"] == {"source": "test"}
    with_vector = client.post("/v1/cases", json={"state": "s2", "action": "a", "reward": 0, "embedding": [0.5] * 8},
                              headers=AUTH)
    assert with_vector.status_code == 200
    bad_vector = client.post("/v1/cases", json={"state": "s3", "action": "a", "reward": 0, "embedding": [0.5] * 3},
                             headers=AUTH)
    assert "embedding" in _fields(bad_vector)
    missing = client.get("/v1/cases/nope", headers=AUTH)
    assert missing.status_code == 404 and "nope" in missing.json()["detail"]


@pytest.mark.parametrize(("body", "field"), [
    ({"state": "", "action": "a", "reward": 1}, "state"),
    ({"state": "s", "reward": 1}, "action"),
    ({"state": "s", "action": "a", "reward": "high"}, "reward"),
    ({"state": "s", "action": "a", "reward": 2}, "reward"),
    ({"state": "s", "action": "a", "reward": 1, "meta": [1]}, "meta"),
    ({"state": "s", "action": "a", "reward": 1, "id": "mine"}, "id"),
])
def test_case_validation_names_the_field(client: Any, body: dict[str, Any], field: str) -> None:
    assert field in _fields(client.post("/v1/cases", json=body, headers=AUTH))


def test_oversized_bodies_get_413(client: Any) -> None:
    big = {"state": "s" * 5000, "action": "a", "reward": 1}
    assert client.post("/v1/cases", json=big, headers=AUTH).status_code == 413

    def chunks():  # no Content-Length: the limit is counted while reading
        yield b'{"state": "'
        for _ in range(10):
            yield b"s" * 1000
        yield b'", "action": "a", "reward": 1}'

    response = client.post("/v1/cases", content=chunks(), headers={**AUTH, "Content-Type": "application/json"})
    assert response.status_code == 413
    assert client.post("/v1/select", json={"query": "q" * 1000}, headers=AUTH).status_code == 200  # still serving


def test_text_longer_than_the_limit_is_422_not_500(selector: FakeSelector) -> None:
    from fastapi.testclient import TestClient

    app = create_app(selector, token=TOKEN, config=ServeConfig(max_text_chars=10, max_k=2))
    with TestClient(app) as c:
        assert "query" in _fields(c.post("/v1/select", json={"query": "q" * 11}, headers=AUTH))
        assert "k" in _fields(c.post("/v1/select", json={"query": "q", "k": 3}, headers=AUTH))


def test_writes_after_shutdown_get_503(selector: FakeSelector) -> None:
    from fastapi.testclient import TestClient

    writer = Writer(selector).start()
    with TestClient(create_app(selector, token=TOKEN, writer=writer)) as c:
        writer.stop()
        response = c.post("/v1/cases", json={"state": "s", "action": "a", "reward": 1}, headers=AUTH)
        assert response.status_code == 503 and response.headers["retry-after"] == "1"
        assert c.post("/v1/select", json={"query": "q"}, headers=AUTH).status_code == 200


# ---------------------------------------------------------------- the writer


def test_writer_saves_every_n_writes_and_on_stop(selector: FakeSelector) -> None:
    writer = Writer(selector, ServeConfig(save_every_n=3, save_every_s=0)).start()
    for _ in range(7):
        sid = selector.select("q").selection_id
        assert writer.submit_feedback(sid, 1.0).result(5)["recorded"]
    assert selector.saves == 2  # after writes 3 and 6
    writer.stop(5)
    assert selector.saves == 3 and not writer.running  # write 7 saved on shutdown
    with pytest.raises(ServerUnavailableError, match="shutting down"):
        writer.submit_case("s", "a", 1.0)
    writer.stop(5)  # idempotent
    assert selector.saves == 3


def test_writer_saves_after_s_seconds(selector: FakeSelector) -> None:
    now = [0.0]
    writer = Writer(selector, ServeConfig(save_every_n=0, save_every_s=0.01), clock=lambda: now[0]).start()
    writer.submit_case("s", "a", 1.0).result(5)
    assert selector.saves == 0
    now[0] = 1.0
    for _ in range(200):
        if selector.saves:
            break
        threading.Event().wait(0.01)
    assert selector.saves == 1
    writer.stop(5)
    assert selector.saves == 1  # nothing new to save


def test_writer_drains_the_queue_on_stop_and_reports_errors() -> None:
    gate = threading.Event()
    selector = FakeSelector(block=gate)
    writer = Writer(selector, ServeConfig(queue_size=4, save_every_n=0, save_every_s=0)).start()
    sids = [selector.select("q").selection_id for _ in range(4)]
    futures = [writer.submit_feedback(sids[0], 0.5)]
    for _ in range(500):  # the writer took it and is blocked in feedback()
        if writer.queued == 0:
            break
        threading.Event().wait(0.01)
    futures += [writer.submit_feedback(sid, 0.5) for sid in sids[1:]]  # three queued
    futures.append(writer.submit_feedback("unknown", 0.5))  # the fourth fills the queue
    with pytest.raises(ServerUnavailableError, match="queue is full"):
        writer.submit_feedback(sids[0], 0.5)
    stopper = threading.Thread(target=writer.stop)
    stopper.start()
    gate.set()
    stopper.join(5)
    assert [f.result(0)["selection_id"] for f in futures[:4]] == sids
    with pytest.raises(UnknownSelectionError):
        futures[4].result(0)
    assert len(selector.feedbacks) == 4 and selector.saves == 1 and writer.counts["errors"] == 1


# ---------------------------------------------------------------- token and host rules


def test_resolve_token_sources(tmp_path: Path) -> None:
    assert resolve_token(environ={TOKEN_ENV: f" {TOKEN}\n"}) == TOKEN
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    assert resolve_token(token_file=path, environ={TOKEN_ENV: "other-token-0123456789"}) == TOKEN  # the file wins
    assert resolve_token(no_auth=True, environ={TOKEN_ENV: TOKEN}) is None
    with pytest.raises(ConfigError, match=TOKEN_ENV):
        resolve_token(environ={})
    with pytest.raises(ConfigError, match="at least 16"):
        resolve_token(environ={TOKEN_ENV: "short"})
    with pytest.raises(ConfigError, match="cannot read"):
        resolve_token(token_file=tmp_path / "missing", environ={})
    with pytest.raises(ConfigError, match="exclude"):
        resolve_token(token_file=path, no_auth=True, environ={})


def test_no_auth_only_on_loopback() -> None:
    for host in ("127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"):
        assert is_loopback(host), host
        check_host(host, no_auth=True)
    for host in ("0.0.0.0", "::", "192.168.1.4", "example.com"):
        assert not is_loopback(host), host
        check_host(host, no_auth=False)
        with pytest.raises(ConfigError, match="loopback"):
            check_host(host, no_auth=True)


def test_serve_config_validation() -> None:
    with pytest.raises(ConfigError, match="max_k"):
        ServeConfig(max_k=0)
    with pytest.raises(ConfigError, match="save_every_s"):
        ServeConfig(save_every_s=-1)
    for bad in ({"batch_max_texts": -1}, {"batch_max_texts": 2.5}, {"batch_max_texts": True},
                {"batch_wait_ms": -0.5}, {"batch_wait_ms": float("inf")}, {"batch_wait_ms": 5000}):
        with pytest.raises(ConfigError, match="batch_"):
            ServeConfig(**bad)  # type: ignore[arg-type]
    config = ServeConfig(batch_max_texts=0, batch_wait_ms=1)
    assert config.batch_max_texts == 0 and isinstance(config.batch_wait_ms, float)
    assert (ServeConfig().batch_max_texts, ServeConfig().batch_wait_ms) == (32, 2.0)


# ---------------------------------------------------------------- CLI


def test_cli_help_explains_the_token(capsys: pytest.CaptureFixture[str]) -> None:
    from memento.cli.entry import main

    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    out = capsys.readouterr().out
    for flag in (TOKEN_ENV, "--token-file", "--no-auth", "--learn", "--save-every-s", "--save-every-n", "--device",
                 "--port", "--host", "--max-body-bytes", "--threads", "-e '.[serve]'", "--batch-max-texts",
                 "--batch-wait-ms", "one forward pass"):
        assert flag in out, flag
    with pytest.raises(SystemExit):
        main(["mcp", "--help"])
    out = capsys.readouterr().out
    for word in ("select_cases", "record_outcome", "add_case", "-e '.[mcp]'", "--learn"):
        assert word in out, word


@pytest.mark.parametrize(("argv", "env", "message"), [
    (["--host", "0.0.0.0", "--no-auth"], {}, "--no-auth is only allowed on a loopback host"),
    ([], {}, f"no token: set {TOKEN_ENV}"),
    (["--no-auth", "--token-file", "x"], {}, "not allowed with argument"),
    ([], {TOKEN_ENV: "short"}, "at least 16 characters"),
    (["--no-auth", "--batch-wait-ms", "-1"], {}, "ServeConfig.batch_wait_ms=-1.0"),
    (["--no-auth", "--batch-max-texts", "-2"], {}, "--batch-max-texts=-2: must be an integer in 0..65536"),
])
def test_cli_serve_refuses_bad_auth_settings_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str], argv: list[str],
                                                         env: dict[str, str], message: str) -> None:
    from memento.cli.entry import main

    monkeypatch.delenv(TOKEN_ENV, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    try:
        code = main(["serve", str(tmp_path / "artifact"), *argv])
    except SystemExit as exit_:  # argparse's own usage errors
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2 and message in err, err
    if "not allowed" not in message:
        assert err.count("\n") == 1 and err.startswith("memento: error: ")


@pytest.mark.parametrize(("command", "module"), [("serve", "fastapi"), ("serve", "uvicorn"), ("mcp", "mcp")])
def test_cli_missing_extra_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str], command: str, module: str) -> None:
    from memento.cli.entry import main

    monkeypatch.setitem(sys.modules, module, None)  # import fails as if not installed
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    assert main([command, str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"pip install -e '.[{command}]'" in err, err


@pytest.mark.slow  # a fresh interpreter importing torch: 1.5-3 s
def test_serve_and_mcp_modules_import_without_the_extras() -> None:
    code = ("import sys, json, memento, memento.serve.app, memento.serve.mcp\n"
            "print(json.dumps([m for m in ('fastapi', 'uvicorn', 'mcp', 'starlette') if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(out.stdout) == []


# ---------------------------------------------------------------- MCP tools in-process


def test_mcp_tools_in_process(selector: FakeSelector) -> None:
    import anyio
    from mcp import Client

    from memento.serve.mcp import build_mcp_server

    writer = Writer(selector).start()
    server = build_mcp_server(selector, writer)

    async def drive() -> None:
        async with Client(server) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert set(tools) == {"select_cases", "record_outcome", "add_case", "update_case", "delete_case",
                                  "delete_all_cases", "search_cases", "list_cases", "count_cases", "get_case",
                                  "case_history"}
            assert set(tools["select_cases"].input_schema["properties"]) == {"task", "k", "scope", "filter", "env",
                                                                              "include_global"}
            assert set(tools["add_case"].input_schema["properties"]) == {"state", "action", "reward", "user", "agent",
                                                                          "session", "meta", "env", "user_id",
                                                                          "agent_id", "run_id"}
            assert all(tool.input_schema["additionalProperties"] is False for tool in tools.values())
            chosen = await client.call_tool("select_cases", {"task": "capital of Peru?", "k": 2})
            assert not chosen.is_error
            body = chosen.structured_content
            assert len(body["cases"]) == 2 and all("score" in c and "similarity" in c for c in body["cases"])
            recorded = await client.call_tool("record_outcome", {"selection_id": body["selection_id"], "reward": 1})
            assert not recorded.is_error and recorded.structured_content["recorded"] is True
            again = await client.call_tool("record_outcome", {"selection_id": body["selection_id"], "reward": 1})
            assert again.is_error and "unknown selection" in again.content[0].text
            bad = await client.call_tool("select_cases", {"task": "q", "k": 0})
            assert bad.is_error and "k" in bad.content[0].text
            added = await client.call_tool("add_case", {"state": "s", "action": "a", "reward": 1.0})
            assert added.structured_content["id"] in selector.cases
            # scoped cases with meta, then the scoped reads
            ids = {}
            for user, topic in (("alice", "geo"), ("alice", "sci"), ("bob", "geo")):
                made = await client.call_tool("add_case", {"state": f"{user} {topic}", "action": "a", "reward": 1.0,
                                                           "user": user, "agent": "planner",
                                                           "meta": {"topic": topic}})
                assert not made.is_error, made.content
                ids[user, topic] = made.structured_content["id"]
            assert selector.cases[ids["alice", "geo"]].user == "alice"
            assert selector.cases[ids["alice", "geo"]].meta == {"topic": "geo"}
            scoped = await client.call_tool("select_cases", {"task": "q", "k": 4, "scope": {"user": "alice"}})
            assert {c["id"] for c in scoped.structured_content["cases"]} == {ids["alice", "geo"], ids["alice", "sci"]}
            assert all(c["user"] == "alice" and c["agent"] == "planner" for c in scoped.structured_content["cases"])
            filtered = await client.call_tool("select_cases", {"task": "q", "k": 4, "filter": {"topic": "geo"}})
            assert {c["id"] for c in filtered.structured_content["cases"]} == {ids["alice", "geo"], ids["bob", "geo"]}
            nothing = await client.call_tool("select_cases", {"task": "q", "scope": {"user": "carol"}})
            assert not nothing.is_error and nothing.structured_content["cases"] == []
            found = await client.call_tool("search_cases", {"query": "q", "k": 5, "scope": {"agent": "planner"},
                                                            "filter": {"OR": [{"topic": "sci"}, {"topic": "geo"}]}})
            assert not found.is_error, found.content
            rows = found.structured_content["cases"]
            assert [r["id"] for r in rows] == [ids["alice", "geo"], ids["alice", "sci"], ids["bob", "geo"]]
            assert [r["similarity"] for r in rows] == [1.0, 0.9, 0.8] and rows[2]["meta"] == {"topic": "geo"}
            listed = await client.call_tool("list_cases", {"filter": {"topic": {"in": ["sci"]}}})
            assert [r["id"] for r in listed.structured_content["cases"]] == [ids["alice", "sci"]]
            page = await client.call_tool("list_cases", {"limit": 2, "offset": 1})
            assert page.structured_content["limit"] == 2 and page.structured_content["offset"] == 1
            assert [r["id"] for r in page.structured_content["cases"]] == ["c1", "c2"]
            got = await client.call_tool("get_case", {"case_id": ids["bob", "geo"]})
            assert got.structured_content["user"] == "bob" and got.structured_content["state"] == "bob geo"
            missing = await client.call_tool("get_case", {"case_id": "nope"})
            assert missing.is_error and "unknown case id" in missing.content[0].text
            for tool, args, field in (("list_cases", {"limit": 0}, "limit"), ("list_cases", {"offset": -1}, "offset"),
                                      ("list_cases", {"limit": True}, "limit"),
                                      ("search_cases", {"query": "q", "filter": {"topic": {"like": 1}}}, "filter"),
                                      ("list_cases", {"scope": {"owner": "x"}}, "scope"),
                                      ("get_case", {"case_id": ""}, "case_id")):
                refused = await client.call_tool(tool, args)
                text = refused.content[0].text
                assert refused.is_error and "\n" not in text and f"{field}:" in text, (tool, args, text)

    anyio.run(drive)
    writer.stop(5)
    assert selector.feedbacks and selector.saves == 1


# ---------------------------------------------------------------- nothing unknown passes (issue 40)


def _scoped(selector: FakeSelector) -> dict[str, str]:
    """Cases of alice and bob beside the fixture's unowned ones: {owner: id}."""
    made = {}
    for user in ("alice", "bob"):
        case_id = f"c{len(selector.cases)}"
        selector.cases[case_id] = Case(id=case_id, state=f"{user}'s", action="a", reward=1.0, user=user)
        made[user] = case_id
    return made


def test_every_endpoint_refuses_an_unknown_query_parameter(client: Any) -> None:
    from fastapi.routing import APIRoute

    routes = [r for r in client.app.routes if isinstance(r, APIRoute)]
    assert {"/v1/select", "/v1/search", "/v1/cases", "/v1/cases/{case_id}", "/v1/stats", "/healthz"} <= {
        r.path for r in routes}
    for route in routes:
        for method in route.methods:
            path = route.path.replace("{case_id}", "c1")
            response = client.request(method, path, params={"user_id": "alice", "bogus": "1"}, headers=AUTH,
                                      json={"query": "q"} if method in ("POST", "PUT") else None)
            assert response.status_code == 422, (method, path, response.text)
            (problem,) = response.json()["detail"]
            assert problem["loc"][0] == "query" and "unknown query parameter" in problem["msg"], (method, path)
            assert "\n" not in problem["msg"]
    twice = client.get("/v1/cases", params=[("user", "alice"), ("user", "bob")], headers=AUTH)
    assert twice.status_code == 422 and "given twice" in twice.text


def test_scope_names_over_http_are_mem0s_too_and_never_null(client: Any, selector: FakeSelector) -> None:
    owners = _scoped(selector)
    # GET /v1/cases?user_id=alice ignored the parameter and listed every tenant's cases
    listed = client.get("/v1/cases", params={"user_id": "alice"}, headers=AUTH)
    assert listed.status_code == 200 and [c["id"] for c in listed.json()["cases"]] == [owners["alice"]]
    for params in ({"user": "alice", "user_id": "bob"}, {"agent": ""}, {"run_id": "x\x01"}):
        assert client.get("/v1/cases", params=params, headers=AUTH).status_code == 422, params
    added = client.post("/v1/cases", headers=AUTH, json={"state": "s", "action": "a", "reward": 1, "user_id": "carol",
                                                         "agent_id": "p", "run_id": "r"})
    assert added.status_code == 200, added.text
    assert selector.cases[added.json()["id"]].scope == ("carol", "p", "r")
    n = len(selector.cases)
    for body, needle in (({"user": None}, "not null"), ({"user": "a", "user_id": "b"}, "differ"),
                         ({"scope": {"user": "a"}}, "unknown field 'scope'")):
        refused = client.post("/v1/cases", headers=AUTH, json={"state": "s", "action": "a", "reward": 1, **body})
        assert refused.status_code == 422 and needle in refused.text, (body, refused.text)
    assert len(selector.cases) == n  # nothing stored unscoped
    for path in ("/v1/select", "/v1/search"):
        mem0 = client.post(path, headers=AUTH, json={"query": "q", "k": 8, "scope": {"user_id": "alice"}})
        assert [c["id"] for c in mem0.json()["cases"]] == [owners["alice"]]
        for body, needle in (({"scope": {"user": None}}, "is null"), ({"user_id": "alice"}, "a scope goes in scope"),
                             ({"scope": {"user": "alice", "user_id": "bob"}}, "differ")):
            refused = client.post(path, headers=AUTH, json={"query": "q", **body})
            assert refused.status_code == 422 and needle in refused.text, (path, body, refused.text)
        by_filter = client.post(path, headers=AUTH, json={"query": "q", "k": 8, "filter": {"user": "alice"}})
        assert [c["id"] for c in by_filter.json()["cases"]] == [owners["alice"]]  # the scope field, not a meta key


def test_include_global_over_http(client: Any, selector: FakeSelector) -> None:
    owners = _scoped(selector)
    unowned = [case_id for case_id, case in selector.cases.items() if case.user is None]
    for path in ("/v1/select", "/v1/search"):
        both = client.post(path, headers=AUTH, json={"query": "q", "k": 20, "scope": {"user": "alice"},
                                                     "include_global": True})
        assert both.status_code == 200, both.text
        assert sorted(c["id"] for c in both.json()["cases"]) == sorted([owners["alice"], *unowned])
        assert client.post(path, headers=AUTH, json={"query": "q", "include_global": 1}).status_code == 422
    listed = client.get("/v1/cases", params={"user": "bob", "include_global": "true"}, headers=AUTH)
    assert sorted(c["id"] for c in listed.json()["cases"]) == sorted([owners["bob"], *unowned])


@pytest.mark.parametrize("raw,content_type", [
    ('{"query": "q"}'.encode("utf-16"), "application/json"),  # with a byte order mark
    ('{"query": "q"}'.encode("utf-16-le"), "application/json"),  # without one: json.loads reads it anyway
    ('{"query": "q"}'.encode("utf-32"), "application/json"),
    ('{"query": "q\u00e9"}'.encode("latin-1"), "application/json"),
    ('{"query": "q"}'.encode("utf-8-sig"), "application/json"),
    (b'{"query": "q"}', "application/json; charset=utf-16"),
    ('{"query": "q"}'.encode("utf-16-le"), None),
])
def test_a_json_body_that_is_not_utf8_is_refused(client: Any, selector: FakeSelector, raw: bytes,
                                                 content_type: str | None) -> None:
    headers = {**AUTH, **({"Content-Type": content_type} if content_type else {})}
    response = client.post("/v1/select", content=raw, headers=headers)
    assert 400 <= response.status_code < 500 and response.status_code != 200, response.text
    if content_type is not None:
        assert response.status_code == 415 and "not UTF-8 JSON" in response.json()["detail"]
    ok = client.post("/v1/select", content='{"query": "qu\u00e9"}'.encode(), headers={
        **AUTH, "Content-Type": "application/json; charset=UTF-8"})
    assert ok.status_code == 200, ok.text


def test_mcp_tools_refuse_unknown_arguments_and_null_owners(selector: FakeSelector) -> None:
    import anyio
    from mcp import Client

    from memento.serve.mcp import build_mcp_server

    owners = _scoped(selector)
    unowned = sorted(case_id for case_id, case in selector.cases.items() if case.user is None)
    writer = Writer(selector).start()

    async def drive() -> None:
        async with Client(build_mcp_server(selector, writer)) as client:
            async def refused(tool: str, args: dict[str, Any], needle: str) -> None:
                result = await client.call_tool(tool, args)
                text = result.content[0].text
                assert result.is_error and needle in text and "\n" not in text, (tool, args, text)

            async def ids(tool: str, args: dict[str, Any]) -> list[str]:
                result = await client.call_tool(tool, args)
                assert not result.is_error, result.content
                return sorted(c["id"] for c in result.structured_content["cases"])

            # list_cases(user=...) listed every tenant's cases; add_case(user_id=...) stored the case unscoped
            await refused("list_cases", {"user": "alice"}, "unknown argument 'user'; a scope goes in scope")
            await refused("search_cases", {"query": "q", "user_id": "alice"}, "unknown argument 'user_id'")
            await refused("select_cases", {"task": "q", "scope": {"user": None}}, "scope.user is null")
            await refused("get_case", {"case_id": "c0", "user": "alice"}, "unknown argument 'user'")
            await refused("add_case", {"state": "s", "action": "a", "reward": 1, "scope": {"user": "a"}},
                          "a new case's owner is given as user")
            await refused("add_case", {"state": "s", "action": "a", "reward": 1, "user": None}, "not null")
            await refused("add_case", {"state": "s", "action": "a", "reward": 1, "user": "a", "user_id": "b"},
                          "differ")
            made = await client.call_tool("add_case", {"state": "s", "action": "a", "reward": 1, "user_id": "carol",
                                                       "run_id": "r1"})
            assert selector.cases[made.structured_content["id"]].scope == ("carol", None, "r1")
            assert await ids("list_cases", {"scope": {"user_id": "alice"}}) == [owners["alice"]]
            assert await ids("search_cases", {"query": "q", "filter": {"user": "bob"}}) == [owners["bob"]]
            assert await ids("list_cases", {"scope": {"user": "alice"}, "include_global": True}) == sorted(
                [owners["alice"], *unowned])
            assert await ids("search_cases", {"query": "q", "k": 20, "scope": {"user": "bob"},
                                              "include_global": True}) == sorted([owners["bob"], *unowned])

    anyio.run(drive)
    writer.stop(5)


_BAD_ARGUMENTS = [  # (tool, HTTP path, arguments, the field named): refused alike by both transports
    ("select_cases", "/v1/select", {"k": True}, "k"),
    ("select_cases", "/v1/select", {"k": "4"}, "k"),
    ("select_cases", "/v1/select", {"k": 0}, "k"),
    ("select_cases", "/v1/select", {"k": 10**9}, "k"),
    ("select_cases", "/v1/select", {"text": "q" * 11}, "text"),
    ("record_outcome", "/v1/feedback", {"reward": True}, "reward"),
    ("record_outcome", "/v1/feedback", {"reward": "1"}, "reward"),
    ("record_outcome", "/v1/feedback", {"reward": 1.5}, "reward"),
    ("record_outcome", "/v1/feedback", {"reward": float("nan")}, "reward"),
    ("add_case", "/v1/cases", {"reward": True}, "reward"),
    ("add_case", "/v1/cases", {"text": "s" * 11}, "text"),
    ("select_cases", "/v1/select", {"scope": {"owner": "x"}}, "scope"),
    ("select_cases", "/v1/select", {"scope": "alice"}, "scope"),
    ("select_cases", "/v1/select", {"scope": {"user": "a\x01"}}, "scope"),
    ("select_cases", "/v1/select", {"filter": {"topic": {"like": 1}}}, "filter"),
    ("select_cases", "/v1/select", {"filter": ["geo"]}, "filter"),
    ("select_cases", "/v1/select", {"filter": {"level": 1e300}}, "filter"),
    ("add_case", "/v1/cases", {"user": ""}, "user"),
    ("add_case", "/v1/cases", {"session": 3}, "session"),
    ("add_case", "/v1/cases", {"meta": ["x"]}, "meta"),
]


def test_http_and_mcp_refuse_the_same_arguments_and_record_nothing(selector: FakeSelector) -> None:
    import anyio
    from fastapi.testclient import TestClient
    from mcp import Client

    from memento.serve.mcp import build_mcp_server

    config = ServeConfig(max_text_chars=10)
    sid = selector.select("q").selection_id
    base = {"select_cases": ({"task": "q", "k": 2}, {"query": "q", "k": 2}),
            "record_outcome": ({"selection_id": sid, "reward": 1.0}, {"selection_id": sid, "reward": 1.0}),
            "add_case": ({"state": "s", "action": "a", "reward": 1.0}, {"state": "s", "action": "a", "reward": 1.0})}
    text_field = {"select_cases": ("task", "query"), "add_case": ("state", "state")}

    def bodies(tool: str, change: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        mcp_args, http_body = dict(base[tool][0]), dict(base[tool][1])
        for key, value in change.items():
            mcp_key, http_key = text_field[tool] if key == "text" else (key, key)
            mcp_args[mcp_key], http_body[http_key] = value, value
        return mcp_args, http_body

    with TestClient(create_app(selector, token=TOKEN, config=config)) as c:
        for tool, path, change, field in _BAD_ARGUMENTS:
            raw = json.dumps(bodies(tool, change)[1]).encode()  # NaN as JSON's NaN
            response = c.post(path, content=raw, headers={**AUTH, "Content-Type": "application/json"})
            assert (text_field[tool][1] if field == "text" else field) in _fields(response), (tool, change)
    writer = Writer(selector, config).start()

    async def drive() -> None:
        async with Client(build_mcp_server(selector, writer, config=config)) as client:
            for tool, _, change, field in _BAD_ARGUMENTS:
                field = text_field[tool][0] if field == "text" else field
                result = await client.call_tool(tool, bodies(tool, change)[0])
                text = result.content[0].text
                assert result.is_error and "\n" not in text and f"{field}:" in text, (tool, change, text)

    anyio.run(drive)
    writer.stop(5)
    assert selector.feedbacks == [] and len(selector.cases) == 6 and sid in selector.pending


# ---------------------------------------------------------------- bench serve (the run itself: tests/integration)


def test_bench_serve_config_and_table() -> None:
    from memento.bench.serve import ServeBenchConfig, format_serve_table, scaling

    with pytest.raises(ConfigError, match="clients"):
        ServeBenchConfig(clients=())
    with pytest.raises(ConfigError, match="k"):
        ServeBenchConfig(size=3, k=4)
    with pytest.raises(ConfigError, match="data"):
        ServeBenchConfig(data="gaussian")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="batch_wait_ms"):
        ServeBenchConfig(batch_wait_ms=-1.0)
    phase = {"requests": 10, "ok": 10, "errors": 0, "wall_s": 1.0, "per_s": 10.0, "p50_ms": 1.0, "p99_ms": 2.0}
    run = {"learn": False, "select_embedding": {"1": phase}, "select_text": {"16": phase}, "feedback": {"1": phase},
           "start_s": 3.0, "shutdown_s": 1.0, "acknowledged_feedback": 10, "recorded_feedback": 10}
    table = format_serve_table({"config": dataclasses.asdict(ServeBenchConfig()), "record": run,
                                "learn": {**run, "learn": True}})
    for row in ("| select by embedding | 1 | 1.00 | 2.00 | 10 | 0 |", "| select by text | 16 |",
                "| feedback (record) | 1 |", "| feedback (learn) | 1 |", "| --learn | 3.0 | 1.0 | 10 | 10 |"):
        assert row in table, row

    sc = scaling({"select_text": {"1": phase, "16": {**phase, "per_s": 35.0}},
                  "select_embedding": {"1": phase, "16": {**phase, "per_s": 12.0}}}, (1, 16))
    assert sc["select_text"]["ratio"] == 3.5 and sc["select_text"]["meets_target"] is True
    assert sc["select_embedding"]["ratio"] == pytest.approx(1.2) and sc["select_embedding"]["meets_target"] is False
    table = format_serve_table({"config": dataclasses.asdict(ServeBenchConfig()), "record": run, "scaling": sc})
    assert "| by text | 1 -> 16 | 10 -> 35 | 1.0 -> 1.0 | 2.0 -> 2.0 | 3.50x | >= 3x (met) |" in table
    assert "| by embedding | 1 -> 16 |" in table and ">= 1.5x (missed)" in table


# ---------------------------------------------------------------- a real selector under concurrent requests


@pytest.fixture(scope="module")
def real_artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A selector over the 28 seed cases of tests/loop_env.py (hashing encoder), a Q-network with heavy dropout
    (a forward in training mode would show), learning from the first feedback."""
    from memento.bank import CaseBank
    from memento.config import QNetConfig
    from memento.selector.export import create_selector
    from tests.loop_env import HashingEncoder, make_env

    root = tmp_path_factory.mktemp("real-serve")
    env, encoder = make_env(), HashingEncoder()
    with CaseBank.create(root / "bank", encoder.dim, index="Flat") as bank:
        bank.add(env.seed_cases, encoder.encode([c.state for c in env.seed_cases]))
    return create_selector(root / "bank", root / "selector", k=4, warmup=1,
                           qnet=QNetConfig(dim=encoder.dim, hidden=64, dropout=0.5))


@pytest.fixture
def real_selector(real_artifact: Path, tmp_path: Path):
    import shutil

    from memento import load_selector
    from tests.loop_env import HashingEncoder

    path = Path(shutil.copytree(real_artifact, tmp_path / "selector"))
    with load_selector(path, learn=True, seed=3, encoder=HashingEncoder()) as selector:
        yield selector


def _tasks() -> list[str]:
    from tests.loop_env import make_env

    return [task.question for task in make_env().tasks]


@pytest.mark.usefixtures("one_torch_thread")
def test_16_threads_select_in_parallel_with_feedback_in_between_and_lose_nothing(real_selector: Any) -> None:
    """Selects by text (batched) and by vector from 16 threads while the single writer records and learns from
    feedback: no error, and every acknowledged feedback is in the feedback log."""
    from memento.selector.artifact import FeedbackLog
    from tests.loop_env import HashingEncoder

    tasks = _tasks()
    vectors = HashingEncoder().encode(tasks)
    batcher = real_selector.batch_encoding(max_texts=16, wait_ms=5)
    writer = Writer(real_selector, ServeConfig(save_every_n=0, save_every_s=0)).start()
    acknowledged: list[str] = []
    guard = threading.Lock()

    def client(c: int) -> None:
        for i in range(12):
            j = (c * 12 + i) % len(tasks)
            result = real_selector.select(tasks[j] if i % 2 else vectors[j], k=4, mode="sample" if c % 4 else "greedy")
            assert len(result) == 4 and len(set(result.ids)) == 4
            if i % 3 == 0:
                answer = writer.submit_feedback(result.selection_id, float(j % 2)).result(30)
                with guard:
                    acknowledged.append(answer["selection_id"])

    errors: list[BaseException] = []

    def run(c: int) -> None:
        try:
            client(c)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=run, args=(c,)) for c in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    writer.stop()
    assert not errors, errors[:3]
    stats = real_selector.stats()
    assert len(acknowledged) == 16 * 4 and stats["feedbacks"] == 64 and stats["updates"] == 64
    log = FeedbackLog.open(real_selector.path / "feedback.sqlite")
    try:
        assert {row.selection_id for row in log.rows(after=0)} == set(acknowledged)
    finally:
        log.close()
    counts = batcher.stats()
    assert counts["texts"] == 16 * 6 and counts["batches"] < counts["texts"]  # concurrent texts shared forwards


@pytest.mark.usefixtures("one_torch_thread")
def test_parallel_greedy_selects_after_learning_equal_serial_ones(real_selector: Any) -> None:
    """After learner updates (which leave the network in training mode, dropout 0.5) greedy selects from 16
    threads choose exactly what one thread chooses: every reader scores in eval mode."""
    tasks = _tasks()
    for i in range(6):
        result = real_selector.select(tasks[i], k=4)
        real_selector.feedback(result.selection_id, 1.0)
    assert real_selector.learner.updates == 6
    real_selector.learner.qnet.train()  # as a learner update leaves it
    expected = [real_selector.select(t, k=4, mode="greedy").ids for t in tasks]
    for _ in range(3):
        real_selector.learner.qnet.train()
        got: list[Any] = [None] * (16 * len(tasks))

        def client(c: int, got: list[Any] = got) -> None:
            for i in range(c, len(got), 16):
                got[i] = real_selector.select(tasks[i % len(tasks)], k=4, mode="greedy").ids

        threads = [threading.Thread(target=client, args=(c,)) for c in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert got == [expected[i % len(tasks)] for i in range(len(got))]


def test_batching_keeps_single_caller_choices_exactly(real_artifact: Path, tmp_path: Path) -> None:
    """One caller, same seed: the same sampled choices (ids, probabilities) with the batcher on as without it,
    by text and by vector, and the same greedy ones."""
    import shutil

    from memento import load_selector
    from tests.loop_env import HashingEncoder

    tasks = _tasks()[:10]
    runs = []
    for batched in (False, True):
        path = Path(shutil.copytree(real_artifact, tmp_path / f"selector-{batched}"))
        with load_selector(path, seed=11, encoder=HashingEncoder()) as selector:
            if batched:
                selector.batch_encoding(max_texts=8, wait_ms=1)
            picks = []
            for i, task in enumerate(tasks):
                query = task if i % 2 else HashingEncoder().encode(task)
                for mode in ("sample", "greedy"):
                    result = selector.select(query, k=3, mode=mode)
                    picks.append((result.ids, result.probs, result.set_prob))
            runs.append(picks)
            selector.batch_encoding(None)
    assert runs[0] == runs[1]


def test_app_turns_batching_on_for_its_lifetime(real_selector: Any) -> None:
    from fastapi.testclient import TestClient

    app = create_app(real_selector, token=None, config=ServeConfig(batch_max_texts=8, batch_wait_ms=0,
                                                                  warmup=False))
    with TestClient(app) as client:
        answer = client.post("/v1/select", json={"query": "what is the capital of Peru?", "k": 2})
        assert answer.status_code == 200 and len(answer.json()["cases"]) == 2
        stats = client.get("/v1/stats").json()["server"]["encode_batching"]
        assert stats["texts"] == 1 and stats["max_texts"] == 8
        case = client.post("/v1/cases", json={"state": "a new task about Lima", "action": "Lima", "reward": 1.0})
        assert case.status_code == 200
    assert real_selector._batcher is None  # switched off again on shutdown
    assert real_selector.select("what is the capital of Peru?", k=2).ids  # encodes in the calling thread again


@pytest.mark.usefixtures("one_torch_thread")
def test_warm_up_select_makes_ready_and_records_nothing(real_selector: Any) -> None:
    from fastapi.testclient import TestClient

    before = real_selector.stats()
    with TestClient(create_app(real_selector, token=None)) as client:
        for _ in range(500):
            ready = client.get("/readyz")
            if ready.status_code == 200:
                break
            threading.Event().wait(0.01)
        assert ready.status_code == 200 and "warmup_error" not in ready.json(), ready.text
        stats = client.get("/v1/stats").json()
    assert stats["pending"] == before["pending"] == 0 and stats["cases"] == before["cases"]
