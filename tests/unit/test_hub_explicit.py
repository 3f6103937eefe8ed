"""A Hub id is explicit (``hf://org/name``): a missing local path never reaches the Hugging Face Hub.

A loopback fake Hub (an ``http.server`` thread on 127.0.0.1, answering 404 "repository not found") records
every request, with ``huggingface_hub`` pointed at it and online (``HF_HUB_OFFLINE`` unset): bare names that
are not local paths give one-line errors and the fake Hub sees no request; ``hf://org/name`` does reach it.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from memento.cli.entry import main
from memento.encoders import Encoder
from memento.errors import CheckpointError, ConfigError, EncoderError
from memento.hub import hub_ref
from memento.planners import PlannerError, build_planner, check_planner_spec, parse_planner_spec
from memento.planners.hf import resolve_model
from memento.selector.export import load_selector

HINT = "no such local path (a Hugging Face Hub id is written hf://org/name[@revision])"


class _FakeHub(http.server.BaseHTTPRequestHandler):
    requests: list[str] = []

    def _answer(self) -> None:
        type(self).requests.append(f"{self.command} {self.path}")
        body = b'{"error": "Repository not found"}'
        self.send_response(404)
        self.send_header("Content-Type", "application/json")
        self.send_header("X-Error-Code", "RepoNotFound")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_HEAD = do_POST = _answer

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass


@pytest.fixture
def fake_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The requests the fake Hub received; huggingface_hub online and pointed at it, caches in tmp_path."""
    from huggingface_hub import constants

    requests: list[str] = []
    handler = type("Hub", (_FakeHub,), {"requests": requests})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HTTP_PROXY", "HTTPS_PROXY", "http_proxy",
                 "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("MEMENTO_CACHE_DIR", str(tmp_path / "memento"))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)  # read by huggingface_hub at import time
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", endpoint + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.chdir(tmp_path)  # "checkpoints/demo" and "some/missing" do not exist here
    try:
        yield requests
    finally:
        server.shutdown()
        server.server_close()


def _one_line(error: BaseException) -> str:
    message = str(error)
    assert "\n" not in message
    return message


def test_missing_paths_are_one_line_errors_and_never_reach_the_hub(fake_hub: list[str],
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(CheckpointError) as selector:
        load_selector("checkpoints/demo")
    assert _one_line(selector.value) == f"selector 'checkpoints/demo': {HINT}"
    with pytest.raises(EncoderError) as encoder:
        Encoder.from_pretrained("some/missing", device="cpu", use_cache=False)
    assert _one_line(encoder.value) == f"encoder 'some/missing': {HINT}"
    with pytest.raises(EncoderError, match="needs a Hub id"):  # a revision does not turn a path into a Hub id
        Encoder.from_pretrained("some/missing", revision="main", device="cpu", use_cache=False)
    with pytest.raises(PlannerError) as planner:
        check_planner_spec(parse_planner_spec("hf:org/name"))
    assert _one_line(planner.value) == f"planner hf:org/name: model 'org/name': {HINT}"
    with pytest.raises(PlannerError, match="no such local path"):
        build_planner(parse_planner_spec("hf:org/name@v1"))
    with pytest.raises(PlannerError, match="no such local path"):
        resolve_model("org/name")
    capsys.readouterr()
    assert main(["serve", "some/missing", "--no-auth"]) == 2
    err = capsys.readouterr().err
    assert err == f"memento: error: selector 'some/missing': {HINT}\n"
    assert fake_hub == []


def test_an_explicit_hub_id_reaches_the_hub(fake_hub: list[str]) -> None:
    with pytest.raises(CheckpointError) as selector:
        load_selector("hf://org/fake")
    assert _one_line(selector.value).startswith("selector 'hf://org/fake': download failed")
    assert any("/org/fake/" in request for request in fake_hub)
    fake_hub.clear()
    with pytest.raises(EncoderError) as encoder:
        Encoder.from_pretrained("hf://org/fake-encoder@v1", device="cpu", use_cache=False)
    assert _one_line(encoder.value).startswith("encoder 'hf://org/fake-encoder@v1': download failed")
    assert any("/org/fake-encoder/" in request for request in fake_hub)
    fake_hub.clear()
    with pytest.raises(PlannerError) as planner:
        build_planner(parse_planner_spec("hf://org/fake-lm"))
    assert "download failed" in _one_line(planner.value)
    assert any("/org/fake-lm/" in request for request in fake_hub)


def test_hub_ref_parses_only_the_explicit_form() -> None:
    assert hub_ref("hf://org/name") == ("org/name", None)
    assert hub_ref("hf://org/name@v2") == ("org/name", "v2")
    assert hub_ref("org/name") is None and hub_ref(Path("hf://org/name")) is None
    for bad in ("hf://name", "hf://a/b/c", "hf://../x", "hf://"):
        with pytest.raises(ConfigError, match="expected hf://org/name"):
            hub_ref(bad)


@pytest.mark.parametrize("revision, problem", [
    ("", "an empty revision after @"),
    ("@", "revision '@' is not a branch, tag or commit name"),
    ("../../", "revision '../../' is not a branch, tag or commit name"),
    ("a/../b", "is not a branch, tag or commit name"),
    ("v1 beta", "is not a branch, tag or commit name"),
    ("ma\nin", "is not a branch, tag or commit name"),
    ("x.lock", "is not a branch, tag or commit name"),
    ("r" * 257, "a revision of 257 characters (at most 256)"),
])
def test_a_bad_revision_is_one_line_and_never_reaches_the_hub(fake_hub: list[str], revision: str,
                                                              problem: str) -> None:
    with pytest.raises(ConfigError) as refused:
        hub_ref(f"hf://org/name@{revision}")
    assert problem in str(refused.value) and "\n" not in str(refused.value)
    with pytest.raises(PlannerError, match="revision"):
        build_planner(parse_planner_spec(f"hf://org/fake-lm@{revision}"))
    with pytest.raises(EncoderError, match="revision"):
        Encoder.from_pretrained(f"hf://org/fake-encoder@{revision}", device="cpu", use_cache=False)
    with pytest.raises(EncoderError, match="revision"):
        Encoder.from_pretrained("hf://org/fake-encoder", revision=revision or "@", device="cpu", use_cache=False)
    assert fake_hub == []


def test_good_revisions_pass() -> None:
    from memento.hub import revision_problem

    for revision in ("main", "v1.0", "refs/pr/1", "release-2024_01", "a" * 40, "v1+build"):
        assert revision_problem(revision) is None, revision
        assert hub_ref(f"hf://org/name@{revision}") == ("org/name", revision)


def test_a_bank_whose_encoder_path_is_missing_is_not_exported_as_a_hub_id(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """``org/name`` recorded as a local path that no longer exists is refused, never written to encoder.json as a
    Hub id (a Hub encoder is recorded as ``hf://org/name``); nothing is created."""
    from memento.bank import CaseBank
    from memento.config import EncoderConfig
    from memento.selector.export import create_selector

    monkeypatch.chdir(tmp_path)
    CaseBank.create(tmp_path / "bank", 16, encoder=EncoderConfig(model="org/missing")).close()
    with pytest.raises(CheckpointError, match="'org/missing': no such local path"):
        create_selector(tmp_path / "bank", tmp_path / "selector", k=2)
    assert not (tmp_path / "selector").exists()


def _artifact_stub(root: Path) -> Path:
    """What push_folder reads before it uploads: a manifest and a card (the upload fails before any check)."""
    root.mkdir()
    (root / "manifest.json").write_text('{"files": {}, "source": {"path": "/home/u/runs/demo"}}\n')
    (root / "README.md").write_text("---\nlibrary_name: memento-mdp\n---\n# demo\n")
    return root


def test_a_failed_push_is_one_line_naming_the_repository_and_the_endpoint(fake_hub: list[str],
                                                                           tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    from huggingface_hub import constants

    from memento.selector.artifact.hub import push_folder

    folder = _artifact_stub(tmp_path / "artifact")
    with pytest.raises(CheckpointError) as refused:  # the fake Hub answers 404 to the repository's creation
        push_folder(folder, "hf://org/fake", token="hf_fake")
    endpoint = constants.ENDPOINT
    assert _one_line(refused.value).startswith(f"push_to_hub hf://org/fake to {endpoint}: ")
    assert any(request.startswith("POST /api/repos/create") for request in fake_hub)
    with socket.socket() as probe:  # a port nothing listens on: the connection is refused
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}"
    monkeypatch.setattr(constants, "ENDPOINT", closed)
    with pytest.raises(CheckpointError) as unreachable:
        push_folder(folder, "org/fake", token="hf_fake")
    message = _one_line(unreachable.value)
    assert message.startswith(f"push_to_hub hf://org/fake to {closed}: ") and "Connect" in message
    assert sorted(p.name for p in tmp_path.iterdir() if ".push-" in p.name) == []  # no staging left behind
