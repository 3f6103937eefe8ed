"""memento bench stream on real tiny games with the scripted planner: the stream, learned points, OP and BwT."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memento.bench.stream import STREAM_ARMS, StreamBenchConfig, format_stream_table, game_env, run_stream_bench
from memento.errors import ConfigError
from tests.game_env import HashingEncoder, walkthrough_commands
from tests.unit.test_gameloop_systems import BuilderPlanner


def test_stream_bench_reports_op_and_bwt_per_arm_and_order(tmp_path: Path, tiny_games) -> None:
    games = tiny_games_with_test(tiny_games)
    planner = BuilderPlanner(walkthrough_commands(games["train"] + games["test"]))
    config = StreamBenchConfig(arms=("none", "similarity", "cfgm"), orders=("grouped", "random"), max_steps=4,
                               k=3)
    out = tmp_path / "stream.json"
    results = run_stream_bench(config, out=out, workdir=tmp_path / "work", planner=planner,
                               encoder=HashingEncoder(), games=games)
    saved = json.loads(out.read_text())
    assert saved["summary"] == results["summary"]
    for order in ("grouped", "random"):
        for arm in ("none", "similarity", "cfgm"):
            entry = results["runs"]["0"][order][arm]
            assert 0.0 <= entry["op"] <= 1.0 and set(entry["per_env"]) == {"custom"}
            assert len(entry["stream"]) == len(games["train"])
            row = results["summary"][order][arm]
            assert row["op"]["n"] == 1
        assert results["runs"]["0"][order]["none"]["bwt_abs"] == 0.0  # no memory: nothing to forget
        assert results["summary"][order]["cfgm"]["llm_calls"] > 0
    assert set(results["summary"]["random_minus_grouped_op"]) == {"none", "similarity", "cfgm"}
    assert (tmp_path / "work" / "seed-0" / "grouped" / "cfgm" / "learned-custom" / "summary.json").is_file()
    assert "OP" in format_stream_table(results)


def tiny_games_with_test(tiny_games) -> dict[str, list[Path]]:
    return {"train": list(tiny_games["train"]), "test": list(tiny_games.get("test") or tiny_games["train"][:1])}


def test_game_env_and_bad_config() -> None:
    assert game_env(Path("coin-l5-s401.z8")) == "coin" and game_env(Path("custom-l3-w2-o3-s1.z8")) == "custom"
    assert STREAM_ARMS[0] == "none"
    with pytest.raises(ConfigError, match="stream arm"):
        StreamBenchConfig(arms=("nope",))
    with pytest.raises(ConfigError):
        StreamBenchConfig(orders=("sorted",))
