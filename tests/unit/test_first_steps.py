"""First steps that do not break: a bank command refuses a selector artifact, a missing extra is one line naming
the right command, ``memento online --no-tensorboard``, ``/readyz`` after a warm-up select, the access log, and
help texts that list every registered MCP tool and HTTP route (compared with what is registered)."""

from __future__ import annotations

import json
import logging
import re
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from memento.bank import CaseBank
from memento.cli.entry import build_parser, main
from memento.selector.export import create_selector
from memento.serve.app import ServeConfig, create_app
from tests.loop_env import HashingEncoder, make_env
from tests.unit.test_serve import AUTH, TOKEN, FakeSelector

ROOT = Path(__file__).resolve().parents[2]


def _help(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit):
        build_parser().parse_args([*argv, "--help"])
    return capsys.readouterr().out


def _one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("memento: error: "), err
    return err


# ---------------------------------------------------------------- 1. a bank command refuses a selector artifact


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("first_steps")
    env, encoder = make_env(), HashingEncoder(dim=16)
    with CaseBank.create(root / "bank", 16, index="Flat") as bank:
        bank.add(env.seed_cases[:6], encoder.encode([c.state for c in env.seed_cases[:6]]))
    return create_selector(root / "bank", root / "selector", k=2, warmup=1)


def _tree(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("target", ["", "bank"])
@pytest.mark.parametrize("action", ["import", "create", "copy"])
def test_bank_commands_refuse_a_selector_artifact(artifact: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  action: str, target: str) -> None:
    cases = tmp_path / "cases.jsonl"
    cases.write_text(json.dumps({"id": "n1", "state": "a new state", "action": "act", "reward": 1.0}) + "\n")
    where = str(artifact / target) if target else str(artifact)
    argv = {"import": ["bank", "import", str(cases), "--bank", where],
            "create": ["bank", "create", "--bank", where, "--dim", "16"],
            "copy": ["bank", "copy", where, "--bank", str(artifact.parent / "bank")]}[action]
    before = _tree(artifact)
    assert main(argv) == 2
    err = _one_line_error(capsys)
    assert "is a selector artifact" in err and "POST /v1/cases" in err and "memento export" in err, err
    assert _tree(artifact) == before  # nothing written: no second bank beside bank/, no rows in bank/


def test_bank_import_into_an_ordinary_bank_still_works(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "manifest.json").write_text(json.dumps({"format": "something-else"}))  # not a selector's
    with CaseBank.create(tmp_path / "bank", 16, index="Flat"):
        pass
    from memento.cli.bank import refuse_artifact

    refuse_artifact(str(tmp_path / "bank"))
    refuse_artifact(str(tmp_path / "elsewhere"))


# ---------------------------------------------------------------- 2. missing extras: one line, the right command


def test_train_without_lightning_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("")
    monkeypatch.setitem(sys.modules, "lightning", None)  # import fails as if not installed
    assert main(["train", "--from-memento", str(pairs), "--out", str(tmp_path / "run")]) == 2
    err = _one_line_error(capsys)
    assert "memento train needs the 'train' extra (lightning" in err and "pip install -e '.[train]'" in err
    assert not (tmp_path / "run").exists()


def test_train_encoder_without_lightning_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    texts = tmp_path / "texts.txt"
    texts.write_text("a sentence\n")
    monkeypatch.setitem(sys.modules, "lightning", None)
    assert main(["train-encoder", "--data", str(texts), "--out", str(tmp_path / "enc")]) == 2
    err = _one_line_error(capsys)
    assert "memento train-encoder needs the 'train' extra (lightning" in err
    assert not (tmp_path / "enc").exists()


@pytest.mark.parametrize(("command", "module", "extra"), [
    ("inspect", "fastapi", "serve"), ("inspect", "uvicorn", "serve"), ("serve", "fastapi", "serve"),
    ("mcp", "mcp", "mcp")])
def test_missing_extra_names_the_command_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str], command: str, module: str,
                                             extra: str) -> None:
    monkeypatch.setitem(sys.modules, module, None)
    monkeypatch.setenv("MEMENTO_SERVE_TOKEN", TOKEN)
    assert main([command, str(tmp_path)]) == 2
    err = _one_line_error(capsys)
    assert f"memento {command} needs the '{extra}' extra" in err and f"-e '.[{extra}]'" in err, err


# ---------------------------------------------------------------- 3. memento online --no-tensorboard


def test_online_no_tensorboard_flag_and_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    from memento.cli.online import loop_config

    parser = build_parser()
    base = ["online", "--tasks", "t.jsonl", "--planner", "gemma", "--out", str(tmp_path / "o")]
    assert loop_config(parser.parse_args(base)).tensorboard is True
    assert loop_config(parser.parse_args([*base, "--no-tensorboard"])).tensorboard is False
    tasks = tmp_path / "t.jsonl"
    tasks.write_text(json.dumps({"id": "t1", "question": "q?", "answers": ["a"]}) + "\n")
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    argv = ["online", "--tasks", str(tasks), "--planner", "gemma", "--policy", "random", "--steps", "1",
            "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    err = _one_line_error(capsys)
    assert "--no-tensorboard" in err and "-e '.[train]'" in err, err
    assert not (tmp_path / "o").exists()  # refused before the run directory is made


def test_play_no_tensorboard_flag_and_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from memento.cli.play import _play_config

    parser = build_parser()
    base = ["play", "--suite", "tw-tiny", "--out", str(tmp_path / "o")]
    assert _play_config(parser.parse_args(base)).tensorboard is True
    assert _play_config(parser.parse_args([*base, "--no-tensorboard"])).tensorboard is False
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    assert main(base) == 2
    err = _one_line_error(capsys)
    assert "--no-tensorboard" in err and "-e '.[train]'" in err, err
    assert not (tmp_path / "o").exists()


def test_run_skeleton_tensorboard_message_names_the_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    import inspect

    from memento.runs import base

    assert "--no-tensorboard" in inspect.getsource(base.Run._tensorboard)


# ---------------------------------------------------------------- 4. /readyz after a warm-up select


class _SlowSelector(FakeSelector):
    """Blocks its first select until released; records whether the warm-up was tracked."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.calls: list[dict[str, Any]] = []

    def select(self, query: Any, k: int = 4, mode: str = "sample", env: str | None = None, *,
               track: bool = True) -> Any:
        self.calls.append({"query": query, "k": k, "mode": mode, "track": track})
        self.release.wait(10)
        return super().select(query, k=k, mode=mode, env=env)


def test_readyz_is_503_until_the_warm_up_select_returned() -> None:
    from fastapi.testclient import TestClient

    selector = _SlowSelector()
    with TestClient(create_app(selector, token=TOKEN)) as client:
        assert client.get("/healthz").status_code == 200  # liveness: at once
        warming = client.get("/readyz")  # no auth needed
        assert warming.status_code == 503 and warming.headers["retry-after"] == "1"
        selector.release.set()
        for _ in range(200):
            if client.get("/readyz").status_code == 200:
                break
            threading.Event().wait(0.01)
        ready = client.get("/readyz")
        assert ready.status_code == 200 and ready.json()["status"] == "ready"
    assert selector.calls[0]["track"] is False and selector.calls[0]["mode"] == "greedy"  # nothing recorded


def test_readyz_without_warmup_is_ready_at_once_and_a_failed_warmup_is_reported() -> None:
    from fastapi.testclient import TestClient

    selector = _SlowSelector()
    with TestClient(create_app(selector, token=TOKEN, config=ServeConfig(warmup=False))) as client:
        assert client.get("/readyz").status_code == 200
    assert selector.calls == []

    class Empty(FakeSelector):
        def select(self, *args: Any, **kwargs: Any) -> Any:
            raise ValueError("the bank holds no case")

    with TestClient(create_app(Empty(), token=TOKEN)) as client:
        for _ in range(200):
            if client.get("/readyz").status_code == 200:
                break
            threading.Event().wait(0.01)
        body = client.get("/readyz").json()
        assert body["status"] == "ready" and "no case" in body["warmup_error"]
    with pytest.raises(Exception, match="warmup"):
        ServeConfig(warmup="yes")  # type: ignore[arg-type]


def test_serve_cli_no_warmup_flag() -> None:
    from memento.flags import given_fields

    def warmup(*argv: str) -> bool:
        return ServeConfig(**given_fields(build_parser().parse_args(["serve", "dir", *argv]), ServeConfig)).warmup

    assert warmup() is True  # left out: ServeConfig's default
    assert warmup("--no-warmup") is False


# ---------------------------------------------------------------- 5. the access log


def test_access_log_one_line_per_request_token_redacted(caplog: pytest.LogCaptureFixture) -> None:
    from fastapi.testclient import TestClient

    selector = FakeSelector()
    with caplog.at_level(logging.INFO, logger="memento.serve.access"), \
            TestClient(create_app(selector, token=TOKEN, config=ServeConfig(warmup=False))) as client:
        assert client.get("/healthz").status_code == 200
        assert client.post("/v1/select", json={"query": "q", "k": 2}, headers=AUTH).status_code == 200
        assert client.get(f"/inspect/?token={TOKEN}&x=1").status_code in (200, 303, 307)
        assert client.get("/v1/stats").status_code == 401
    lines = [r.getMessage() for r in caplog.records if r.name == "memento.serve.access"]
    assert len(lines) == 4, lines
    assert re.fullmatch(r"GET /healthz 200 \d+\.\d ms", lines[0]), lines
    assert re.fullmatch(r"POST /v1/select 200 \d+\.\d ms", lines[1]), lines
    assert "token=<redacted>" in lines[2] and TOKEN not in " ".join(lines), lines
    assert lines[3].startswith("GET /v1/stats 401 "), lines


def test_access_log_is_silent_without_verbose(caplog: pytest.LogCaptureFixture) -> None:
    from fastapi.testclient import TestClient

    with caplog.at_level(logging.WARNING), \
            TestClient(create_app(FakeSelector(), token=TOKEN, config=ServeConfig(warmup=False))) as client:
        client.get("/healthz")
    assert not [r for r in caplog.records if r.name == "memento.serve.access"]


# ---------------------------------------------------------------- 6. help texts compared with what is registered


def test_mcp_help_lists_every_registered_tool(capsys: pytest.CaptureFixture[str]) -> None:
    import anyio
    from mcp import Client

    from memento.serve.app import Writer
    from memento.serve.mcp import build_mcp_server

    selector = FakeSelector()
    writer = Writer(selector).start()

    async def names() -> set[str]:
        async with Client(build_mcp_server(selector, writer)) as client:
            return {t.name for t in (await client.list_tools()).tools}

    try:
        tools = anyio.run(names)
    finally:
        writer.stop()
    text = _help(capsys, "mcp")
    assert "delete_case" in tools
    listed = set(re.findall(r"^  (\w+)\(", text, flags=re.MULTILINE))
    assert listed == tools, (listed, tools)


def test_serve_help_lists_every_registered_route(capsys: pytest.CaptureFixture[str]) -> None:
    from fastapi.routing import APIRoute

    app = create_app(FakeSelector(), token=TOKEN)
    routes = {(method, route.path.replace("{case_id}", "ID")) for route in app.routes if isinstance(route, APIRoute)
              for method in route.methods}
    text = _help(capsys, "serve")
    listed = {(m, p) for m, p in re.findall(r"\b(GET|POST|PUT|PATCH|DELETE)\s+(/[\w/.{}]*)", text)}
    assert ("DELETE", "/v1/cases/ID") in routes and ("PUT", "/v1/cases/ID") in routes
    assert routes <= listed, routes - listed
    assert "--no-warmup" in text and "memento.serve.access" in text


def test_help_texts_cite_only_docs_in_the_repository(capsys: pytest.CaptureFixture[str]) -> None:
    from memento.cli.entry import COMMANDS

    for command in COMMANDS:
        text = _help(capsys, command)
        for cited in re.findall(r"\b[\w./-]*\.md\b", text):
            assert (ROOT / cited).is_file(), f"memento {command} --help cites {cited}, not in the repository"
