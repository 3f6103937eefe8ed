"""One range per field, the same verdict in every entry point (memento.types: check_reward, check_text, check_id).

The same bad values (rewards of -1, 1.0000001, +-1e308, NaN, inf, True, "1", 10**400; ids that are empty, blank,
NUL, control characters or 300 characters long; texts that are empty, blank, NUL or a lone surrogate) go through
every entry point that takes them: the Case record, a Case JSONL file, a directory bank (add, import_jsonl,
update_reward), the selector (add_case, feedback, delete_case, select), HTTP (/v1/cases, /v1/feedback, /v1/select,
DELETE /v1/cases/{id}), the MCP tools, and ``memento bank import``. Each is refused with memento's error (HTTP 422,
an MCP tool error, exit 2 and one line) and nothing is written; the good edge values (0, 1, 0.5) are accepted
everywhere.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np
import pytest

from memento.bank import CaseBank
from memento.errors import DataFormatError, MementoError
from memento.formats import read_cases_jsonl
from memento.types import Case
from tests.loop_env import HashingEncoder

DIM = 16
BAD_REWARDS: list[Any] = [-1, 1.0000001, 1e308, -1e308, math.nan, math.inf, -math.inf, True, False, "1", 10 ** 400,
                          None]
GOOD_REWARDS: list[Any] = [0, 1, 0.5, 0.0, 1.0]
BAD_IDS = ["", " ", "\x00", "\t\n", "a\x00b", "x" * 300, "a\x7fb", "\ud800"]
BAD_TEXTS = ["", "   ", "\x00", "\ud800", "a\x00b", " \n\t "]


def _refused(call: Callable[..., Any], *args: Any, **kwargs: Any) -> MementoError:
    """``call(*args, **kwargs)`` raises memento's DataFormatError, in one short line."""
    what = (getattr(call, "__name__", call), args, kwargs)
    with pytest.raises(MementoError) as info:
        call(*args, **kwargs)
    assert isinstance(info.value, DataFormatError), (what, type(info.value), info.value)
    text = str(info.value)
    assert "\n" not in text and len(text) < 400, (what, text)
    return info.value


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _row(**change: Any) -> dict[str, Any]:
    return {"id": "c-1", "state": "capital of peru", "action": "lima", "reward": 1, **change}


# ---------------------------------------------------------------- the records, a file, a directory bank


@pytest.mark.parametrize("field", ["reward", "id", "env", "kind", "state", "action"])
def test_case_and_case_jsonl_give_the_same_verdict(tmp_path: Path, field: str) -> None:
    bad = BAD_REWARDS if field == "reward" else BAD_TEXTS if field in ("state", "action") else BAD_IDS
    good = GOOD_REWARDS if field == "reward" else ["a task", "x" * 256] if field in ("state", "action") \
        else ["web", "c 1", "é" * 256]
    for value in bad:
        _refused(Case, **{**_row(), field: value})
        path = tmp_path / "cases.jsonl"
        path.write_text(json.dumps(_row(id="c-0")) + "\n" + json.dumps(_row(**{field: value})) + "\n",
                        encoding="utf-8")
        error = _refused(read_cases_jsonl, path)
        assert str(error).startswith(f"{path}:2: "), str(error)
    for value in good:
        case = Case(**_row(**{field: value}))
        path = tmp_path / "good.jsonl"
        path.write_text(json.dumps(_row(**{field: value})) + "\n", encoding="utf-8")
        assert read_cases_jsonl(path) == [case]


@pytest.fixture
def bank(tmp_path: Path) -> Iterator[CaseBank]:
    with CaseBank.create(tmp_path / "bank", DIM) as bank:
        bank.add([Case(id="kept", state="capital of peru", action="lima", reward=1.0)],
                 HashingEncoder(DIM).encode(["capital of peru"]))
        yield bank


def test_directory_bank_refuses_and_writes_nothing(tmp_path: Path, bank: CaseBank) -> None:
    encoder = HashingEncoder(DIM)
    root = Path(bank.path)
    bank.flush()
    before = _files(root)

    def add(row: dict[str, Any]) -> list[str]:
        return bank.add([Case(**row)], encoder.encode(["x"]))

    for value in BAD_REWARDS:
        _refused(bank.update_reward, "kept", value)
        _refused(bank.record_usage, 0, ["kept"], value)
    for field, values in (("reward", BAD_REWARDS), ("state", BAD_TEXTS), ("action", BAD_TEXTS), ("id", BAD_IDS),
                          ("env", BAD_IDS)):
        for value in values:
            _refused(add, {**_row(id=None), field: value})
            path = tmp_path / "import.jsonl"
            path.write_text(json.dumps(_row(id="new")) + "\n" + json.dumps({**_row(id="new2"), field: value}) + "\n",
                            encoding="utf-8")
            _refused(bank.import_jsonl, path, encoder)
    bank.flush()
    assert _files(root) == before and len(bank) == 1 and bank.get("kept").reward == 1.0
    for value in GOOD_REWARDS:
        bank.update_reward("kept", value)
        assert bank.get("kept").reward == float(value)


# ---------------------------------------------------------------- the selector, HTTP and MCP


@pytest.fixture(scope="module")
def selector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from memento.selector.export import load_selector

    art = Path(shutil.copytree(Path(__file__).resolve().parents[1] / "fixtures" / "artifacts" / "v1-selector",
                               tmp_path_factory.mktemp("ranges") / "selector"))
    with load_selector(art, learn=False, seed=0, encoder=HashingEncoder(dim=DIM)) as selector:
        yield selector


def _state(selector: Any) -> tuple[int, int, int, int]:
    """What a write would change: cases, deleted cases, recorded feedbacks, pending selections."""
    stats = selector.stats()
    return stats["cases"], selector.bank.num_deleted, stats["feedbacks"], stats["pending"]


def test_selector_refuses_and_records_nothing(selector: Any) -> None:
    pending = selector.select("capital of peru", k=2).selection_id
    before = _state(selector)
    for value in BAD_REWARDS:
        _refused(selector.feedback, pending, value)
        _refused(selector.add_case, "capital of chile", "santiago", value)
    for value in BAD_TEXTS:
        _refused(selector.add_case, value, "santiago", 1.0)
        _refused(selector.add_case, "capital of chile", value, 1.0)
        _refused(selector.select, value, k=2)
        _refused(selector.select_many, [value], k=2)
    for value in BAD_IDS:
        _refused(selector.feedback, value, 1.0)
        _refused(selector.delete_case, value)
        _refused(selector.add_case, "capital of chile", "santiago", 1.0, env=value)
        _refused(selector.select, "capital of chile", k=2, env=value)
    assert _state(selector) == before
    assert selector.feedback(pending, 0.5)["recorded"]  # the refused feedbacks left the selection waiting
    for value in GOOD_REWARDS:
        case_id = selector.add_case(f"capital number {value!r}", "somewhere", value, embedding=np.eye(DIM)[1])
        assert selector.get_case(case_id).reward == float(value)
        sid = selector.select("capital of peru", k=2).selection_id
        assert selector.feedback(sid, value)["reward"] == float(value)


@pytest.fixture(scope="module")
def writer(selector: Any) -> Iterator[Any]:
    pytest.importorskip("fastapi")
    from memento.serve.app import Writer

    writer = Writer(selector).start()
    yield writer
    writer.stop(10)


def _json(body: dict[str, Any]) -> bytes:
    return json.dumps(body).encode()  # NaN and Infinity as JSON's literals, "\ud800" as an escape


def test_http_refuses_with_422_and_records_nothing(selector: Any, writer: Any) -> None:
    from fastapi.testclient import TestClient

    from memento.serve.app import create_app

    headers = {"Content-Type": "application/json"}
    with TestClient(create_app(selector, token=None, writer=writer)) as client:
        pending = client.post("/v1/select", json={"query": "capital of peru", "k": 2}).json()["selection_id"]
        before = _state(selector)
        posts: list[tuple[str, dict[str, Any]]] = []
        for value in BAD_REWARDS:
            posts += [("/v1/feedback", {"selection_id": pending, "reward": value}),
                      ("/v1/cases", {"state": "capital of chile", "action": "santiago", "reward": value})]
        for value in BAD_TEXTS:
            posts += [("/v1/cases", {"state": value, "action": "santiago", "reward": 1}),
                      ("/v1/cases", {"state": "capital of chile", "action": value, "reward": 1}),
                      ("/v1/select", {"query": value, "k": 2})]
        for value in BAD_IDS:
            posts += [("/v1/feedback", {"selection_id": value, "reward": 1}),
                      ("/v1/cases", {"state": "capital of chile", "action": "santiago", "reward": 1, "env": value}),
                      ("/v1/select", {"query": "capital of chile", "k": 2, "env": value})]
        for route, body in posts:
            response = client.post(route, content=_json(body), headers=headers)
            assert response.status_code == 422, (route, body, response.status_code, response.text)
            assert "detail" in response.json()
        for value in BAD_IDS[1:-1]:  # "" is no path, a lone surrogate no URL
            response = client.delete(f"/v1/cases/{quote(value, safe='')}")
            assert response.status_code == 422, (value, response.status_code, response.text)
        assert _state(selector) == before
        assert client.post("/v1/feedback", json={"selection_id": pending, "reward": 1}).status_code == 200
        for value in GOOD_REWARDS:
            added = client.post("/v1/cases", json={"state": f"http capital {value!r}", "action": "x", "reward": value})
            assert added.status_code == 200, added.text
            assert client.get(f"/v1/cases/{added.json()['id']}").json()["reward"] == float(value)


def test_mcp_tools_refuse_with_a_tool_error_and_record_nothing(selector: Any, writer: Any) -> None:
    pytest.importorskip("mcp")
    import anyio
    from mcp import Client

    from memento.serve.mcp import build_mcp_server

    pending = selector.select("capital of peru", k=2).selection_id
    before = _state(selector)
    calls: list[tuple[str, dict[str, Any]]] = []
    for value in BAD_REWARDS:
        calls += [("record_outcome", {"selection_id": pending, "reward": value}),
                  ("add_case", {"state": "capital of chile", "action": "santiago", "reward": value})]
    for value in BAD_TEXTS:
        calls += [("add_case", {"state": value, "action": "santiago", "reward": 1}),
                  ("add_case", {"state": "capital of chile", "action": value, "reward": 1}),
                  ("select_cases", {"task": value, "k": 2})]
    for value in BAD_IDS:
        calls += [("record_outcome", {"selection_id": value, "reward": 1}), ("delete_case", {"case_id": value})]

    async def drive() -> None:
        async with Client(build_mcp_server(selector, writer)) as client:
            for tool, arguments in calls:
                result = await client.call_tool(tool, arguments)
                text = result.content[0].text if result.content else ""
                assert result.is_error and "\n" not in text and text.startswith(f"{tool}: invalid arguments: "), \
                    (tool, arguments, text)
            assert _state(selector) == before
            for value in GOOD_REWARDS:
                added = await client.call_tool("add_case", {"state": f"mcp capital {value!r}", "action": "x",
                                                            "reward": value})
                assert not added.is_error, added.content
                assert selector.get_case(added.structured_content["id"]).reward == float(value)
            recorded = await client.call_tool("record_outcome", {"selection_id": pending, "reward": 0.5})
            assert not recorded.is_error, recorded.content

    anyio.run(drive)


# ---------------------------------------------------------------- memento bank import


def test_bank_import_refuses_in_one_line_and_changes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    import memento.cli.bank
    from memento.cli.entry import main

    monkeypatch.setattr(memento.cli.bank, "bank_encoder", lambda bank: HashingEncoder(DIM))  # no model to load
    root = tmp_path / "bank"
    assert main(["bank", "create", "--bank", str(root), "--dim", str(DIM)]) == 0
    capsys.readouterr()
    before = _files(root)
    path = tmp_path / "in.jsonl"
    for field, values in (("reward", BAD_REWARDS), ("state", BAD_TEXTS), ("action", BAD_TEXTS), ("id", BAD_IDS),
                          ("env", BAD_IDS), ("kind", BAD_IDS)):
        for value in values:
            path.write_text(json.dumps(_row(id="a")) + "\n" + json.dumps({**_row(id="b"), field: value}) + "\n",
                            encoding="utf-8")
            assert main(["bank", "import", str(path), "--bank", str(root)]) == 2, (field, value)
            captured = capsys.readouterr()
            assert captured.out == "" and captured.err.count("\n") == 1, captured.err
            assert captured.err.startswith(f"memento: error: {path}:2: "), captured.err
            assert _files(root) == before, (field, value)
    path.write_text("".join(json.dumps(_row(id=f"g{i}", state=f"capital {i}", reward=value)) + "\n"
                            for i, value in enumerate(GOOD_REWARDS)), encoding="utf-8")
    assert main(["bank", "import", str(path), "--bank", str(root)]) == 0, capsys.readouterr().err
    with CaseBank.open(root) as bank:
        assert [bank.get(f"g{i}").reward for i in range(len(GOOD_REWARDS))] == [float(v) for v in GOOD_REWARDS]
