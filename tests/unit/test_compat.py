"""What an earlier memento wrote still loads, or is refused in one line naming its format version.

The fixtures in ``tests/fixtures/artifacts`` were written at commit 86025c1, before the structural step
(nested LoopConfig, one policy protocol, RunDir): a selector artifact (format 1, unchanged since) and the
soft-Q run it was exported from (online checkpoint format 1, now 2).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from memento.errors import CheckpointError
from memento.policies import SoftQConfig, make_policy
from memento.runs.qa import LoopConfig, OnlineLoop
from memento.runs.rundir import RunDir
from memento.selector.export import export_selector, load_selector, verify
from tests.loop_env import ExactJudge, HashingEncoder, make_env

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "artifacts"


def test_a_format_1_selector_still_verifies_loads_selects_and_learns(tmp_path: Path) -> None:
    art = tmp_path / "selector"
    shutil.copytree(FIXTURES / "v1-selector", art)
    report = verify(art)
    assert report["dim"] == 16 and report["cases"] > 12
    env = make_env()
    with load_selector(art, learn=True, seed=0, encoder=HashingEncoder(dim=16)) as selector:
        updates = selector.learner.updates
        for task in env.tasks[:6]:
            result = selector.select(task.question, k=4)
            assert len(result) == 4 and len(set(result.ids)) == 4
            selector.feedback(result.selection_id, reward=1.0)
        assert selector.learner.updates == updates + 6  # warm already: one update per feedback
        selector.save()
    with load_selector(art, encoder=HashingEncoder(dim=16)) as again:
        assert again.stats()["feedbacks"] == 6 and again.learner.updates == updates + 6


def test_a_format_1_run_is_refused_in_one_line(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "v1-run", run)
    with pytest.raises(CheckpointError, match="checkpoint format 1") as error:
        export_selector(run, tmp_path / "out")
    assert "\n" not in str(error.value) and not (tmp_path / "out").exists()
    env = make_env()
    loop = OnlineLoop(LoopConfig(steps=20, tensorboard=False, policy=SoftQConfig(warmup=4)), make_policy=make_policy,
                      encoder=HashingEncoder(dim=16), planner=env.planner(), judge=ExactJudge(), tasks=env.tasks,
                      out_dir=run, resume=True)
    before = sorted(p.name for p in run.iterdir())
    with pytest.raises(CheckpointError, match="checkpoint format 1") as error:
        loop.run()
    assert "\n" not in str(error.value)
    assert sorted(p.name for p in run.iterdir()) == before and RunDir(run).latest_checkpoint() is not None


def test_a_format_1_selector_updates_a_case_in_place_and_still_verifies(tmp_path: Path) -> None:
    """A bank written before case versions and histories: its cases read version 1 (updated = created); the first
    update adds the columns and the history table, and is saved at once (the old manifest has no stable digest),
    so the artifact verifies and loads without a later save; a replay buffer of format 1 loads, its slots
    forgotten by vector."""
    art = tmp_path / "selector"
    shutil.copytree(FIXTURES / "v1-selector", art)
    with load_selector(art, encoder=HashingEncoder(dim=16)) as selector:
        case = selector.list_cases(limit=1)[0]
        assert case.version == 1 and case.updated == case.created
        assert [event.event for event in selector.history(case.id)] == ["add"]
        changed = selector.update_case(case.id, action="changed in place", meta={"k": 1})
        assert changed.version == 2 and changed.updated >= case.created
        assert "stable_digest" in selector.manifest["live"]["bank/cases.sqlite"]
        other = selector.list_cases(limit=2)[1]
        selector.update_case(other.id, reward=0.5)  # then the process dies: no save
    verify(art)
    with load_selector(art, encoder=HashingEncoder(dim=16)) as again:
        assert again.get_case(case.id).action == "changed in place" and again.get_case(other.id).reward == 0.5
        report = again.delete_case(case.id)
        assert report["deleted"] and again.history(case.id)[-1].event == "delete"
    verify(art)
