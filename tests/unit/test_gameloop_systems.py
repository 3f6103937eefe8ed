"""The game loop with the memory systems (CFGM, LifeMem) on real tiny TextWorld games, scripted planner."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from memento.bank import CaseBank
from memento.planners.base import PlanOutput
from memento.policies import CFGMRetrievalConfig, LifeMemRetrievalConfig, loop_policy, make_policy
from memento.runs.games import GameLoop, GameLoopConfig, run_games
from memento.systems.items import ItemGraph
from memento.systems.runtime import SystemsConfig, split_notes
from memento.types import Case
from tests.game_env import HashingEncoder, ScriptedPlanner, walkthrough_commands

REPLIES = {  # a word of each builder template -> the scripted reply
    "guidance points": "look for exits; take what the goal names; do not repeat commands",
    "why the first succeeded": "take the key before opening; go east first",
    "succeed again": "follow the walkthrough; take the key before opening",
    "what went wrong": "The command failed: try another exit.",
    "Group these trajectories": "1,2,3: walk then take; 4,5: open then take",
    "Does the new trajectory": "ADD 1",
    "Describe their shared workflow": "walk to the room, then take the object",
    "Split them": "1,2: part one; 3,4: part two; 5,6: part three",
    "rules for this workflow": "take before open; walk before take; never repeat",
}


class BuilderPlanner(ScriptedPlanner):
    """The scripted actor, plus scripted replies to the memory builders' prompts; records what the actor saw."""

    def __init__(self, preferred, **kwargs):
        super().__init__(preferred, **kwargs)
        self.memory_prompts: list[str] = []
        self.actor_prompts: list[str] = []

    def plan(self, task, cases):
        if task.id.startswith("memory:"):
            self._tick()
            self.memory_prompts.append(task.question)
            for key, reply in REPLIES.items():
                if key in task.question:
                    return PlanOutput(text=reply)
            return PlanOutput(text="")
        return super().plan(task, cases)

    def score_many(self, tasks, case_sets_per_task, answers=None):
        self.actor_prompts.extend(t.question for t in tasks[:1])
        return super().score_many(tasks, case_sets_per_task, answers)


@pytest.fixture(scope="module")
def games(tiny_games: dict[str, list[Path]]) -> list[Path]:
    return tiny_games["train"]


@pytest.fixture(scope="module")
def preferred(games: list[Path]) -> list[str]:
    return walkthrough_commands(games)


def _config(**changes) -> GameLoopConfig:
    base = GameLoopConfig(episodes=6, k=4, tensorboard=False, checkpoint_every=0, seed=1,
                          game=dataclasses.replace(GameLoopConfig().game, max_steps=5))
    return dataclasses.replace(base, **changes)


def _run(out: Path, games, planner, config: GameLoopConfig, **kwargs) -> dict:
    return run_games(config, make_policy=make_policy, encoder=HashingEncoder(), planner=planner, games=games,
                     out_dir=out, **kwargs)


def _bank(out: Path) -> list[Case]:
    with CaseBank.open(out / "bank") as bank:
        return list(bank.iter_cases())


def test_split_notes_keeps_cases_and_labels_items() -> None:
    cases = [Case(state="s", action="> go", reward=1.0), Case(state="t", action="- a\n- b", reward=0.0, kind="focus"),
             Case(state="t", action="take first", reward=0.0, kind="tip")]
    raw, notes = split_notes(cases)
    assert raw == cases[:1] and notes == ["Guidance: a", "Guidance: b", "Tip: take first"]


def test_cfgm_builds_focus_and_tips_and_shows_them(tmp_path: Path, games, preferred) -> None:
    planner = BuilderPlanner(preferred)
    config = _config(policy=CFGMRetrievalConfig(),
                     systems=SystemsConfig(build=("cfgm",), items="all", reflect=True))
    summary = _run(tmp_path / "run", games, planner, config)
    cases = _bank(tmp_path / "run")
    graph = ItemGraph(cases)
    graph.check()
    focus = [c for c in cases if c.kind == "focus"]
    assert len(focus) == 1 and focus[0].env == "custom"  # one per environment
    tips = [c for c in cases if c.kind == "tip"]
    won = {c.meta["game"] for c in cases if c.meta.get("granularity") == "episode" and c.meta.get("won")}
    assert tips and {t.meta["task"] for t in tips} <= won
    for tip in tips:
        assert all(graph.cases[s].meta.get("granularity") == "episode" for s in tip.meta["sources"])
    assert any("Guidance:" in p for p in planner.actor_prompts) and any("Tip:" in p for p in planner.actor_prompts)
    assert summary["systems"]["llm"]["calls"] == len(planner.memory_prompts) > 0
    assert summary["systems"]["items_built"]["tip"] == len(tips)
    steps = [json.loads(line) for line in (tmp_path / "run" / "steps.jsonl").read_text().splitlines()]
    item_ids = {c.id for c in cases if c.kind != "case"}
    assert any(set(s["chosen_ids"]) & item_ids for s in steps)


def test_lifemem_clusters_trajectories_and_distils_skills(tmp_path: Path, games, preferred) -> None:
    planner = BuilderPlanner(preferred)
    config = _config(episodes=7, policy=LifeMemRetrievalConfig(),
                     systems=SystemsConfig(build=("lifemem",), items="all"))
    summary = _run(tmp_path / "run", games, planner, config)
    cases = _bank(tmp_path / "run")
    graph = ItemGraph(cases)
    graph.check()
    clusters = [c for c in graph.active("cluster") if c.meta.get("members")]
    skills = graph.active("skill")
    assert clusters and skills
    members = {m for c in clusters for m in c.meta["members"]}
    episodes = {c.id for c in cases if c.meta.get("granularity") == "episode"}
    assert members <= episodes and len(members) >= 5
    for skill in skills:
        assert set(graph.trace(skill.id)) <= episodes
    assert summary["systems"]["active_by_kind"].get("skill", 0) == len(skills)


def test_soft_q_over_every_kind_runs_and_learns(tmp_path: Path, games, preferred) -> None:
    planner = BuilderPlanner(preferred)
    policy = dataclasses.replace(loop_policy("soft_q"), warmup=2)
    config = _config(episodes=7, policy=policy,
                     systems=SystemsConfig(build=("cfgm", "lifemem"), items="all", reflect=True))
    summary = _run(tmp_path / "run", games, planner, config)
    assert summary["updates"] > 0 and summary["episodes"] == 7
    kinds = {c.kind for c in _bank(tmp_path / "run")}
    assert {"case", "focus", "cluster"} <= kinds


def test_retries_replay_a_failed_game_with_a_reflection(tmp_path: Path, games) -> None:
    planner = BuilderPlanner([])
    config = _config(episodes=5, policy=CFGMRetrievalConfig(), shuffle=False,  # one step: a quest of two is lost
                     game=dataclasses.replace(GameLoopConfig().game, max_steps=1),
                     systems=SystemsConfig(build=("cfgm",), items="all", retries=2))
    _run(tmp_path / "run", games, planner, config)
    log = [json.loads(line) for line in (tmp_path / "run" / "episodes.jsonl").read_text().splitlines()]
    assert not any(e["won"] for e in log)
    assert [(e["game_index"], e["attempt"]) for e in log] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
    assert log[0]["retry"] and "try another exit" in log[0]["retry"].lower()
    assert log[2]["retry"] is None  # the last attempt of game 0: the next episode moves on
    assert any("Reflection:" in p for p in planner.actor_prompts)


def test_crash_then_resume_equals_uninterrupted_with_builders(tmp_path: Path, games, preferred,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    config = _config(episodes=6, checkpoint_every=4, policy=CFGMRetrievalConfig(),
                     systems=SystemsConfig(build=("cfgm", "lifemem"), items="all", reflect=True))
    _run(tmp_path / "ref", games, BuilderPlanner(preferred), config)
    crashing = BuilderPlanner(preferred)
    original = GameLoop._checkpoint

    def checkpoint_then_arm(self, bank):  # noqa: ANN001, ANN202
        original(self, bank)
        if self.episode_index >= 2 and crashing.fail_after is None:
            crashing.fail_after = crashing.calls + 3
    monkeypatch.setattr(GameLoop, "_checkpoint", checkpoint_then_arm)
    with pytest.raises(RuntimeError, match="scripted crash"):
        _run(tmp_path / "run", games, crashing, config)
    monkeypatch.undo()
    resumed = BuilderPlanner(preferred)
    _run(tmp_path / "run", games, resumed, config, resume=True)
    a = [(c.id, c.kind, c.state, c.action, c.meta.get("sources")) for c in _bank(tmp_path / "ref")]
    b = [(c.id, c.kind, c.state, c.action, c.meta.get("sources")) for c in _bank(tmp_path / "run")]
    assert a == b
    ref_log = (tmp_path / "ref" / "episodes.jsonl").read_text().splitlines()
    run_log = (tmp_path / "run" / "episodes.jsonl").read_text().splitlines()
    strip = [{k: v for k, v in json.loads(x).items() if k != "wall_s"} for x in ref_log]
    assert strip == [{k: v for k, v in json.loads(x).items() if k != "wall_s"} for x in run_log]


def test_default_systems_config_keeps_the_plain_loop(tmp_path: Path, games, preferred) -> None:
    planner = BuilderPlanner(preferred)
    summary = _run(tmp_path / "run", games, planner, _config(episodes=3, policy=loop_policy("similarity")))
    assert "systems" not in summary and planner.memory_prompts == []
    assert {c.kind for c in _bank(tmp_path / "run")} == {"case"}
    assert not (tmp_path / "run" / "memory_calls.jsonl").exists()


def test_items_and_their_links_survive_export_and_load(tmp_path: Path, games, preferred) -> None:
    from memento.selector.export import create_selector, load_selector

    policy = dataclasses.replace(loop_policy("soft_q"), warmup=2)
    config = _config(episodes=7, policy=policy,
                     systems=SystemsConfig(build=("cfgm", "lifemem"), items="all"))
    _run(tmp_path / "run", games, BuilderPlanner(preferred), config)
    out = create_selector(tmp_path / "run" / "bank", tmp_path / "selector", trained=tmp_path / "run" / "selector")
    before = [(c.id, c.kind, c.action, c.meta) for c in _bank(tmp_path / "run")]
    with load_selector(out) as selector:
        after = [(c.id, c.kind, c.action, c.meta) for c in selector.bank.iter_cases()]
        ItemGraph(selector.bank.iter_cases()).check()
    assert after == before
    assert {kind for _, kind, _, _ in after} >= {"case", "focus", "cluster", "skill"}
