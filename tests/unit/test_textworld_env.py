"""memento.envs.textworld: generated TextWorld games, the bounded state, rewards, errors, suites."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

pytest.importorskip("textworld")

from memento.envs.textworld import (  # noqa: E402
    SUITE_TABLE,
    SUITES,
    GameSpec,
    GameState,
    TextWorldConfig,
    TextWorldEnv,
    build_suite,
    game_file,
    make_game,
    suite_env_name,
)
from memento.errors import ConfigError, GameError  # noqa: E402


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, list[Path]]]:
    directory = tmp_path_factory.mktemp("tw-tiny")
    return directory, build_suite("tw-tiny", directory, progress=False)


@pytest.fixture(scope="module")
def game(suite: tuple[Path, dict[str, list[Path]]]) -> Path:
    return suite[1]["train"][0]


def _one_line_naming(error: pytest.ExceptionInfo, name: str) -> None:
    message = str(error.value)
    assert "\n" not in message
    assert name in message


def test_walkthrough_wins_and_rewards_sum_to_the_normalised_score(suite):
    for path in suite[1]["train"] + suite[1]["ood"]:
        with TextWorldEnv(path) as env:
            state = env.reset()
            assert state.step == 0 and not state.done and state.score == 0 and state.max_score >= 1
            total = 0.0
            for command in env.walkthrough:
                assert command in state.admissible
                result = env.step(command)
                assert 0.0 <= result.reward <= 1.0 and not result.invalid
                total += result.reward
                state = result.state
            assert state.won and state.done and result.done and not state.lost
            assert state.step == len(env.walkthrough)
            assert total == pytest.approx(state.normalized_score) == pytest.approx(1.0)
            assert state.admissible == ()


def test_initial_observation_is_clean(game):
    with TextWorldEnv(game) as env:
        state = env.reset()
    assert state.observation and "$$" not in state.observation and not state.observation.endswith("0/1")
    assert state.objective and not state.observation.startswith(state.objective[:30])
    assert "  " not in state.observation and "\n" not in state.observation
    assert not state.inventory.lower().startswith("you are carrying")
    assert list(state.admissible) == sorted(state.admissible)
    assert state.env == "custom" and state.game == game.stem


def test_step_limit_ends_the_episode_not_won(game):
    with TextWorldEnv(game, TextWorldConfig(max_steps=1)) as env:
        state = env.reset()
        wrong = next(c for c in state.admissible if c != env.walkthrough[0])
        result = env.step(wrong)
        assert result.done and result.state.done and not result.state.won and result.state.step == 1
        with pytest.raises(GameError, match="episode is over") as error:
            env.step(result.state.admissible[0])
        _one_line_naming(error, game.stem)
        # a reset starts over
        assert not env.reset().done


def test_hidden_commands_are_removed_and_not_admissible(game):
    with TextWorldEnv(game, TextWorldConfig(hide_commands=())) as env:
        every = env.reset().admissible
    assert "look" in every and "inventory" in every
    with TextWorldEnv(game) as env:
        shown = env.reset().admissible
        assert set(shown) == {c for c in every if c.split()[0] not in ("look", "inventory", "examine")}
        assert shown
        with pytest.raises(GameError, match="not admissible"):
            env.step("look")


def test_not_admissible_error_and_penalty(game):
    with TextWorldEnv(game) as env:
        env.reset()
        with pytest.raises(GameError, match="not admissible") as error:
            env.step("dance wildly")
        _one_line_naming(error, game.stem)
    with TextWorldEnv(game, TextWorldConfig(not_admissible="penalty")) as env:
        before = env.reset()
        result = env.step("dance wildly")
        assert result.invalid and result.reward == 0.0 and not result.done
        after = result.state
        assert after.step == 1 and after.observation == before.observation and after.score == 0
        assert after.history[-1][0] == "dance wildly"
        for command in env.walkthrough:  # the game itself did not move
            result = env.step(command)
        assert result.state.won and result.state.step == 1 + len(env.walkthrough)


def test_replay_equals_stepping(game):
    config = TextWorldConfig(not_admissible="penalty", history=3)
    with TextWorldEnv(game, config) as env:
        state = env.reset()
        commands = [next(c for c in state.admissible if c != env.walkthrough[0]), "dance"]
        for command in commands:
            state = env.step(command).state
        replayed = env.replay(commands)
    assert replayed == state and replayed.step == 2
    with TextWorldEnv(game, config) as other:
        assert other.replay(commands) == state
        assert other.replay([]) == other.reset()


def test_text_is_bounded_and_keeps_the_observation(game):
    for config in (TextWorldConfig(), TextWorldConfig(max_state_chars=140, max_observation_chars=80, history=4)):
        with TextWorldEnv(game, config) as env:
            state = env.reset()
            states = [state]
            for command in env.walkthrough:
                states.append(env.step(command).state)
        for s in states:
            text = s.text()
            assert len(text) <= config.max_state_chars
            assert text.endswith("Now: " + s.observation)
            assert len(s.observation) <= config.max_observation_chars
    state = states[0]
    long = GameState(game="g", env="e", step=3, objective="O" * 500, observation="x" * 300, inventory="i" * 400,
                     admissible=("go",), history=(("go north", "y" * 300), ("go south", "x" * 300)), score=0,
                     max_score=1, won=False, lost=False, done=False, max_state_chars=400)
    text = long.text()
    assert len(text) <= 400 and text.endswith("Now: " + "x" * 300) and text.startswith("Goal: O")
    with_history = GameState(**{**long.to_json(), "objective": "o", "inventory": "i", "admissible": ("go",),
                                "history": (("go north", "y" * 20), ("go south", "x" * 300)),
                                "max_state_chars": 900})
    assert "Before: > go north: yyyy" in with_history.text() and "> go south\nNow:" in with_history.text()


def test_state_json_round_trip_and_normalised_score(game):
    with TextWorldEnv(game) as env:
        env.reset()
        state = env.step(env.walkthrough[0]).state
    again = GameState.from_json(json.loads(json.dumps(state.to_json())))
    assert again == state
    empty = GameState(**{**state.to_json(), "admissible": (), "history": (), "max_score": 0})
    assert empty.normalized_score == 0.0


def test_names_and_walkthrough_before_reset(game):
    with TextWorldEnv(game, name="mine", env="kind") as env:
        with pytest.raises(GameError, match="reset"):
            _ = env.walkthrough
        state = env.reset()
        assert (env.name, env.env, state.game, state.env) == ("mine", "kind", "mine", "kind")
    env.close()  # idempotent
    with pytest.raises(GameError, match="closed"):
        env.reset()


def test_bad_files_are_one_line_game_errors(game, tmp_path):
    with pytest.raises(GameError, match="no such game file") as error:
        TextWorldEnv(tmp_path / "absent.z8")
    _one_line_naming(error, "absent.z8")

    no_json = tmp_path / "nojson.z8"
    shutil.copy(game, no_json)
    with pytest.raises(GameError, match="nojson.json") as error:
        TextWorldEnv(no_json)
    _one_line_naming(error, "nojson.z8")

    data = game.read_bytes()
    for stem, content in (("garbage", b"not a story file\n" * 10), ("truncated", data[: len(data) // 2]),
                          ("tiny", b"\x08\x00"), ("flipped", data[:5000] + bytes([data[5000] ^ 0xFF]) + data[5001:])):
        bad = tmp_path / f"{stem}.z8"
        bad.write_bytes(content)
        shutil.copy(game.with_suffix(".json"), bad.with_suffix(".json"))
        with pytest.raises(GameError) as error:  # the interpreter would exit the process on these
            TextWorldEnv(bad)
        _one_line_naming(error, f"{stem}.z8")

    broken = tmp_path / "badjson.z8"
    shutil.copy(game, broken)
    broken.with_suffix(".json").write_text("{", encoding="utf-8")
    with pytest.raises(GameError) as error:
        TextWorldEnv(broken)
    _one_line_naming(error, "badjson.json")


def test_missing_textworld_is_a_game_error(game, monkeypatch):
    monkeypatch.setitem(sys.modules, "textworld", None)
    with pytest.raises(GameError, match=r"pip install -e '\.\[games\]'"):
        TextWorldEnv(game)


def test_generation_is_deterministic_and_reused(suite, tmp_path):
    directory, paths = suite
    spec = SUITES["tw-tiny"].splits["train"][0]
    again = make_game(spec, tmp_path)
    assert again == game_file(spec, tmp_path) and again.name == paths["train"][0].name
    assert again.with_suffix(".json").read_bytes() == paths["train"][0].with_suffix(".json").read_bytes()
    assert again.read_bytes() == paths["train"][0].read_bytes()
    assert GameSpec.from_json(json.loads(again.with_suffix(".spec.json").read_text())) == spec
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp")]
    mtime = again.stat().st_mtime_ns
    assert make_game(spec, tmp_path) == again and again.stat().st_mtime_ns == mtime


def test_build_suite_card_and_reuse(suite):
    directory, paths = suite
    assert {k: len(v) for k, v in paths.items()} == {"train": 3, "test": 2, "ood": 1}
    card = json.loads((directory / "card.json").read_text())
    import textworld

    assert card["generator"]["version"] == textworld.__version__
    names = [g["name"] for g in card["games"]]
    assert names == [p.stem for split in ("train", "test", "ood") for p in paths[split]]
    assert all(g["tw_make"].startswith("PYTHONHASHSEED=0 tw-make custom --world-size 2") for g in card["games"])
    assert "MIT" in card["licence"] and "Microsoft" in card["licence"]
    markdown = (directory / "CARD.md").read_text()
    assert "MIT" in markdown and all(name in markdown for name in names)
    mtimes = {p: p.stat().st_mtime_ns for split in paths.values() for p in split}
    second = build_suite("tw-tiny", directory, progress=False)
    assert second == paths
    assert {p: p.stat().st_mtime_ns for split in second.values() for p in split} == mtimes
    assert build_suite("tw-tiny", directory, splits=["ood"], progress=False) == {"ood": paths["ood"]}
    with pytest.raises(ConfigError, match="tw-small"):
        build_suite("tw-nope", directory)
    with pytest.raises(ConfigError, match="valid"):
        build_suite("tw-tiny", directory, splits=["valid"])


def test_suite_tables_are_consistent():
    assert {"tw-tiny", "tw-small"} <= set(SUITES) and set(SUITES) == set(SUITE_TABLE)
    small = SUITES["tw-small"].splits
    assert {k: len(v) for k, v in small.items()} == {"train": 12, "test": 8, "ood": 6}
    for suite in SUITES.values():
        seeds = [{s.seed for s in specs} for specs in suite.splits.values()]
        assert sum(len(s) for s in seeds) == len(set().union(*seeds)), suite.name
        names = [s.name for _, s in suite.specs()]
        assert len(names) == len(set(names))
    assert {s.game_type for s in small["train"]} == {"coin", "treasure"}
    assert max(s.level for s in small["ood"] if s.game_type == "coin") == 12


def test_game_spec_names_json_and_validation():
    spec = GameSpec(game_type="coin", level=5, seed=17)
    assert spec.name == "coin-l5-s17" and suite_env_name(spec) == "coin"
    assert GameSpec.from_json(spec.to_json()) == spec
    assert GameSpec(game_type="custom", level=2, seed=1).name == "custom-l2-w2-o3-s1"
    assert GameSpec(game_type="coin", level=150).level == 150  # 100 rooms: the most TextWorld 1.7 compiles
    assert GameSpec(game_type="cooking", level=2).tw_make_args()[:5] == ["tw-cooking", "--recipe", "2", "--take", "2"]
    assert "sparse" in GameSpec(game_type="simple", level=3).tw_make_args()
    for bad in ({"game_type": "zork"}, {"game_type": "coin", "level": 0}, {"game_type": "coin", "level": 301},
                {"game_type": "coin", "level": 151}, {"game_type": "treasure", "level": 31},
                {"game_type": "simple", "level": 4}, {"game_type": "coin", "level": True},
                {"game_type": "coin", "seed": -1}, {"game_type": "coin", "seed": 2**32},
                {"game_type": "coin", "world_size": 3}, {"game_type": "custom", "world_size": 0},
                {"game_type": "custom", "nb_objects": -1}):
        with pytest.raises(ConfigError):
            GameSpec(**bad)
    with pytest.raises(ConfigError, match="unknown fields"):
        GameSpec.from_json({"game_type": "coin", "levle": 3})
    with pytest.raises(ConfigError, match="game_type"):
        GameSpec.from_json({"level": 3})


def test_textworld_config_validation_and_json():
    config = TextWorldConfig(hide_commands=["Look"], not_admissible="penalty")
    assert config.hide_commands == ("look",)
    assert TextWorldConfig.from_json(json.loads(json.dumps(config.to_json()))) == config
    for bad in ({"max_steps": 0}, {"history": -1}, {"max_observation_chars": 5}, {"max_state_chars": 50},
                {"max_state_chars": 200, "max_observation_chars": 300}, {"hide_commands": ("look around",)},
                {"hide_commands": ("",)}, {"not_admissible": "ignore"}, {"max_steps": 2.5}):
        with pytest.raises(ConfigError):
            TextWorldConfig(**bad)
    with pytest.raises(ConfigError, match="unknown fields"):
        TextWorldConfig.from_json({"max_step": 3})
