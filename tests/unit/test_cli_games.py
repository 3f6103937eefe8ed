"""``memento play`` and ``memento bench games``: help and one-line errors before any model loads."""

from __future__ import annotations

from pathlib import Path

import pytest

from memento.cli.entry import main


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().err


def test_help_explains_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["play", "--help"], ["bench", "games", "--help"]):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "--gamma" in out and "--retrieval" in out and "--eval-repeats" in out and "--resume" in out


@pytest.mark.parametrize("argv, message", [
    (["--games", "missing.z8"], "missing.z8: game file not found"),
    (["--policy", "oracle"], "--policy 'oracle'"),
    (["--gamma", "1.5"], "--gamma=1.5"),
    (["--policy", "similarity", "--gamma", "0.5"], "only soft_q"),
    (["--suite", "nope"], "--suite 'nope'"),
    (["--suite", "tw-tiny", "--split", "dev"], "--split 'dev'"),
    (["--retrieval", "episode", "--gamma", "0.9"], "retrieval"),
    (["--build", "memgpt"], "build"),
    (["--retries", "-1"], "retries"),
    (["--templates", "missing-templates.json"], "no such templates file"),
])
def test_bad_input_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str],
                               message: str) -> None:
    code, err = _run(capsys, "play", "--out", str(tmp_path / "run"), *argv)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "run").exists()


def test_a_corrupt_game_file_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path, tiny_games) -> None:
    game = tmp_path / "broken.z8"
    game.write_bytes(tiny_games["train"][0].read_bytes()[:5000])
    (tmp_path / "broken.json").write_text(tiny_games["train"][0].with_suffix(".json").read_text())
    code, err = _run(capsys, "play", "--games", str(game), "--out", str(tmp_path / "run"))
    assert code == 2 and "broken.z8" in err and len(err.strip().splitlines()) == 1, err


def test_bench_games_refuses_an_unknown_arm(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, err = _run(capsys, "bench", "games", "--arms", "none,oracle", "--json", str(tmp_path / "x.json"))
    assert code == 2 and "arm 'oracle'" in err


@pytest.mark.parametrize("argv, message", [(["--arms", "none,oracle"], "stream arm 'oracle'"),
                                           (["--orders", "grouped,sorted"], "orders")])
def test_bench_stream_refuses_bad_arms_and_orders(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                  argv: list[str], message: str) -> None:
    code, err = _run(capsys, "bench", "stream", *argv, "--json", str(tmp_path / "x.json"))
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "x.json").exists()


def test_bad_templates_file_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "t.json"
    bad.write_text('{"tips_success": "{unknown_field}"}')
    code, err = _run(capsys, "play", "--out", str(tmp_path / "run"), "--templates", str(bad))
    assert code == 2 and "unknown_field" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "run").exists()


def test_bench_stream_on_a_question_suite_refuses_an_unknown_family(capsys: pytest.CaptureFixture[str],
                                                                    tmp_path: Path) -> None:
    code, err = _run(capsys, "bench", "stream", "--suite", "facts-real", "--envs", "capital,nope", "--json",
                     str(tmp_path / "x.json"))
    assert code == 2 and "'nope'" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize("argv, message", [(["--build", "cfgm,nope"], "build"),
                                           (["--templates", "missing.json"], "no such templates file")])
def test_online_refuses_bad_memory_system_flags(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                argv: list[str], message: str) -> None:
    tasks = tmp_path / "t.jsonl"
    tasks.write_text('{"id": "a", "question": "q?", "answers": ["x"]}\n')
    code, err = _run(capsys, "online", "--tasks", str(tasks), "--planner", "gemma", "--out", str(tmp_path / "run"),
                     *argv)
    assert code == 2 and message in err, err
    assert not (tmp_path / "run").exists()
