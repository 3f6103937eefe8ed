"""``hf://org/name[@revision]`` planner specs: a tiny model saved in the Hub cache layout, no network."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from memento.planners import HFPlanner, PlannerError, build_planner, check_planner_spec, parse_planner_spec
from memento.planners import hf as hf_module
from tests.unit.test_chat_template import ITALY, tiny_lm

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_lm(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture
def hub_cache(tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``models--org--tiny-lm/snapshots/<commit>/`` and ``refs/main`` under ``HF_HUB_CACHE``, offline."""
    repo = tmp_path / "models--org--tiny-lm"
    shutil.copytree(model_dir, repo / "snapshots" / COMMIT)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT, encoding="utf-8")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path


def test_hub_id_resolves_from_the_cache_offline(hub_cache: Path):
    snapshot = hub_cache / "models--org--tiny-lm" / "snapshots" / COMMIT
    assert hf_module.resolve_model("hf://org/tiny-lm") == snapshot
    assert hf_module.resolve_model(f"hf://org/tiny-lm@{COMMIT}") == snapshot
    assert parse_planner_spec("hf:hf://org/tiny-lm") == parse_planner_spec("hf://org/tiny-lm")
    spec = parse_planner_spec("hf://org/tiny-lm")
    assert str(spec) == "hf://org/tiny-lm"
    check_planner_spec(spec)  # a Hub id passes the cheap checks
    planner = build_planner(spec, max_new_tokens=2)
    assert isinstance(planner, HFPlanner) and planner.model_path == snapshot
    assert planner.config.model == "hf://org/tiny-lm"  # the saved config names the id, not this machine's path
    assert planner.plan(ITALY, []).output_tokens >= 1
    assert HFPlanner.from_config(planner.config).model_path == snapshot


def test_unknown_id_offline_is_one_line_naming_it(hub_cache: Path):
    with pytest.raises(PlannerError) as info:
        build_planner(parse_planner_spec("hf://org/missing@v2"))
    message = str(info.value)
    assert message.startswith(f"planner model 'hf://org/missing@v2': not in the Hugging Face cache {hub_cache}")
    assert message.endswith("HF_HUB_OFFLINE is set") and "\n" not in message


def test_online_downloads_safetensors_only_and_failure_is_one_line(hub_cache: Path, model_dir: Path,
                                                                   monkeypatch: pytest.MonkeyPatch):
    import huggingface_hub

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    calls: list[dict] = []
    real = huggingface_hub.snapshot_download

    def fake(repo_id: str, **kwargs):
        calls.append({"repo_id": repo_id, **kwargs})
        if kwargs.get("local_files_only"):
            return real(repo_id, **kwargs)
        if repo_id == "org/remote":
            return str(model_dir)
        raise OSError("Name or service not known\n(details)")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    assert hf_module.resolve_model("hf://org/remote@main") == model_dir
    assert calls[-1]["revision"] == "main" and "*.safetensors" in calls[-1]["allow_patterns"]
    assert not any(pattern.endswith(".bin") for pattern in calls[-1]["allow_patterns"])
    with pytest.raises(PlannerError) as info:
        hf_module.resolve_model("hf://org/nowhere")
    assert str(info.value) == ("planner model 'hf://org/nowhere': not in the "
                               f"Hugging Face cache {hub_cache} (LocalEntryNotFoundError); download failed: "
                               "OSError: Name or service not known (details)")


@pytest.mark.parametrize("spec", ["hf:./missing-dir", "hf:/no/such/dir", "hf:a/b/c", "hf:org/tiny-lm"])
def test_paths_that_are_not_hub_ids_are_refused_before_loading(spec: str):
    with pytest.raises(PlannerError, match=r"no such local path \(a Hugging Face Hub id is written hf://"):
        check_planner_spec(parse_planner_spec(spec))
