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


def test_every_arm_has_its_policy_and_builders() -> None:
    from memento.bench.stream import EXTRA_ARMS, LEAN_BUDGET, LEAN_NOTE, stream_arm

    assert set(EXTRA_ARMS) == {"plugmem", "plugmem-lean", "soft_q-every"}
    kinds = {arm: stream_arm(arm, questions=True) for arm in STREAM_ARMS + EXTRA_ARMS}
    assert kinds["none"][0] is False and all(memory for arm, (memory, _, _) in kinds.items() if arm != "none")
    assert kinds["soft_q-every"][2].build == ("cfgm", "lifemem", "plugmem")
    _, default, systems = kinds["plugmem"]
    _, lean, lean_systems = kinds["plugmem-lean"]
    assert (default.kind, default.cases) == ("plugmem", 0) and systems.build == lean_systems.build == ("plugmem",)
    assert (lean.cases, lean.budget_tokens) == (1, LEAN_BUDGET)
    assert lean_systems.plugmem.note_max_tokens == LEAN_NOTE < systems.plugmem.note_max_tokens
    assert lean_systems.plugmem.budget_tokens == LEAN_BUDGET < systems.plugmem.budget_tokens


# ---------------------------------------------------------------- question families as the stream


def _qa_suite(root: Path) -> Path:
    from memento.types import Task

    rows = {"capital": [("Peru", "Lima"), ("Chad", "NDjamena"), ("Chile", "Santiago"), ("Spain", "Madrid"),
                        ("Italy", "Rome")],
            "plural": [("mouse", "mice"), ("cat", "cats"), ("goose", "geese"), ("child", "children"),
                       ("box", "boxes")]}
    root.mkdir()
    for split, part in (("train", slice(0, 3)), ("test", slice(3, 5))):
        lines = []
        for family, facts in rows.items():
            for key, answer in facts[part]:
                question = f"What is the capital of {key}?" if family == "capital" else f"What is the plural of {key}?"
                task = Task(id=f"{family}-{key}", question=question, answers=(answer,), family=family, env="toy")
                lines.append(json.dumps({"id": task.id, "question": task.question, "answers": list(task.answers),
                                         "family": family, "env": "toy"}))
        (root / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
    return root


def test_question_stream_reports_op_and_bwt_over_families(tmp_path: Path) -> None:
    from memento.planners.base import CallablePlanner
    from tests.unit.test_loop_systems import REPLIES

    answers = {"Peru": "Lima", "Chad": "NDjamena", "Chile": "Santiago", "Spain": "Madrid", "Italy": "Rome",
               "mouse": "mice", "cat": "cats", "goose": "geese", "child": "children", "box": "boxes"}
    seen: list[tuple[str, list[str]]] = []

    def answer(task, cases):  # right only when a demonstration or a note was shown
        if task.id.startswith("memory:"):
            return next((reply for key, reply in REPLIES.items() if key in task.question), "")
        seen.append((task.id, [c.kind for c in cases]))
        key = task.question.rstrip("?").split()[-1]
        return answers[key] if cases or task.id.endswith(("Peru", "mouse")) else "I do not know"

    suite = _qa_suite(tmp_path / "toy")
    config = StreamBenchConfig(suite=str(suite), arms=STREAM_ARMS + ("plugmem",), orders=("grouped", "random"), k=3,
                               candidates=6,
                               train_per_env=3, test_per_env=2)
    results = run_stream_bench(config, out=tmp_path / "stream.json", workdir=tmp_path / "work",
                               planner=CallablePlanner(answer, name="toy"), encoder=HashingEncoder())
    assert results["domain"] == "questions" and results["envs"] == {"capital": 3, "plural": 3}
    for order in ("grouped", "random"):
        runs = results["runs"]["0"][order]
        assert runs["none"]["op"] == 0.0  # no memory: every test question unanswered
        for arm in STREAM_ARMS[1:] + ("plugmem",):
            assert runs[arm]["op"] == 1.0, (order, arm)  # the retained answers are shown: all right
            assert set(runs[arm]["per_env"]) == {"capital", "plural"} and len(runs[arm]["stream"]) == 6
        assert results["summary"][order]["cfgm"]["llm_calls"] > 0
        assert results["summary"][order]["plugmem"]["llm_calls"] > 0  # structuring calls, even with no reply
        assert runs["plugmem"]["prompt_tokens_per_call"] == 0  # the scripted planner counts no tokens
        assert results["summary"][order]["soft_q-all"]["items"].get("skill", 0) > 0
    grouped = [s.split(":")[0] for s in results["runs"]["0"]["grouped"]["similarity"]["stream"]]
    assert grouped in (["capital"] * 3 + ["plural"] * 3, ["plural"] * 3 + ["capital"] * 3)
    learned = tmp_path / "work" / "seed-0" / "grouped" / "cfgm" / "learned-capital" / "summary.json"
    frozen = json.loads(learned.read_text())
    assert frozen["updates"] == 0 and frozen["retained"] == 0
    assert "OP" in format_stream_table(results)


def test_question_stream_bad_family_is_one_line(tmp_path: Path) -> None:
    suite = _qa_suite(tmp_path / "toy")
    config = StreamBenchConfig(suite=str(suite), envs=("capital", "nope"))
    with pytest.raises(ConfigError, match="nope"):
        run_stream_bench(config, out=tmp_path / "s.json", planner=object(), encoder=HashingEncoder())


def test_question_stream_starts_from_the_suite_seed_bank(tmp_path: Path) -> None:
    from memento.planners.base import CallablePlanner

    suite = _qa_suite(tmp_path / "toy")
    seeds = [{"id": "seed-1", "state": "What is the capital of France?", "action": "The capital is Paris.",
              "reward": 1.0, "env": "toy"},
             {"id": "seed-2", "state": "What is the plural of dog?", "action": "dogs", "reward": 1.0, "env": "toy"}]
    (suite / "cases.jsonl").write_text("".join(json.dumps(row) + "\n" for row in seeds))
    stored: dict[str, float] = {}

    def answer(task, cases):  # a sentence: wrong under exact match, right under the lenient retain judge
        return "It is " + task.answers[0] + "." if not task.id.startswith("memory:") else ""

    config = StreamBenchConfig(suite=str(suite), arms=("none", "similarity"), orders=("grouped",), k=2,
                               candidates=4, train_per_env=3, test_per_env=2)
    results = run_stream_bench(config, out=tmp_path / "s.json", workdir=tmp_path / "work",
                               planner=CallablePlanner(answer, name="toy"), encoder=HashingEncoder())
    assert results["seed_bank"] == 2
    from memento.bank import CaseBank

    with CaseBank.open(tmp_path / "work" / "seed-0" / "grouped" / "similarity" / "train" / "bank") as bank:
        stored = {c.state: c.reward for c in bank.iter_cases()}
    assert len(stored) == 2 + 6 and stored["What is the capital of France?"] == 1.0
    assert all(reward == 1.0 for reward in stored.values())  # retained with the lenient judge: "contains"
    assert results["runs"]["0"]["grouped"]["similarity"]["op"] == 0.0  # the task's own judge is exact match
    assert results["runs"]["0"]["grouped"]["similarity"]["train"]["bank_size_end"] == 8
    no_bank = StreamBenchConfig(suite=str(suite), arms=("similarity",), orders=("grouped",), k=2, candidates=4,
                                train_per_env=3, test_per_env=2, seed_bank=False)
    results = run_stream_bench(no_bank, out=tmp_path / "s2.json", workdir=tmp_path / "work2",
                               planner=CallablePlanner(answer, name="toy"), encoder=HashingEncoder())
    assert results["seed_bank"] == 0 and results["runs"]["0"]["grouped"]["similarity"]["train"]["bank_size_end"] == 6
