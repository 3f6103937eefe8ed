"""The online (question-answering) loop with the memory systems: CFGM's focus points and tips, LifeMem's clusters
and skills, items shown as notes, the item policies, frozen evaluation and resume; a scripted planner."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from memento.bank import CaseBank
from memento.errors import ConfigError
from memento.planners.base import CallablePlanner
from memento.policies import CFGMRetrievalConfig, LifeMemRetrievalConfig, loop_policy, make_policy
from memento.runs.qa import LoopConfig, run_online, task_env
from memento.systems.items import ItemGraph
from memento.systems.runtime import SystemsConfig
from memento.types import Case, Task
from tests.loop_env import ExactJudge, HashingEncoder

REPLIES = {  # a phrase of each builder template -> the scripted reply
    "guidance points": "answer with the name alone; no sentence",
    "why the first succeeded": "answer with one word; do not repeat the question",
    "succeed again": "give the bare answer",
    "Group these trajectories": "1,2,3: capitals; 4,5: plurals",
    "Does the new trajectory": "ADD 1",
    "Describe their shared workflow": "answer a short factual question",
    "rules for this workflow": "one word; no punctuation; capitalise names",
}

CAPITALS = {"Peru": "Lima", "Chad": "NDjamena", "Chile": "Santiago", "Spain": "Madrid", "Italy": "Rome"}
PLURALS = {"mouse": "mice", "cat": "cats", "goose": "geese", "child": "children", "box": "boxes"}


def _tasks() -> list[Task]:
    tasks = [Task(id=f"capital-{k}", question=f"What is the capital of {k}?", answers=(v,), family="capital",
                  env="facts") for k, v in CAPITALS.items()]
    tasks += [Task(id=f"plural-{k}", question=f"What is the plural of {k}?", answers=(v,), family="plural",
                   env="facts") for k, v in PLURALS.items()]
    return tasks


class Recorder:
    """A scripted planner: builder prompts get the scripted replies; a question is answered right when a tip or
    a skill is shown or when its index is even, else in a sentence (wrong under exact match)."""

    def __init__(self) -> None:
        self.memory_prompts: list[str] = []
        self.shown_kinds: list[list[str]] = []
        self.answers = {t.question: t.answers[0] for t in _tasks()}

    HELPED = ("tip", "skill")  # the item kinds that make an answer right

    def builder_reply(self, task: Task) -> str:
        return next((reply for key, reply in REPLIES.items() if key in task.question), "")

    def __call__(self, task: Task, cases: list[Case]) -> str:
        if task.id.startswith("memory:"):
            self.memory_prompts.append(task.question)
            return self.builder_reply(task)
        self.shown_kinds.append([c.kind for c in cases])
        answer = self.answers[task.question]
        helped = any(c.kind in self.HELPED for c in cases)
        even = list(self.answers).index(task.question) % 2 == 0
        return answer if helped or even else f"It is {answer}."


def _run(out: Path, config: LoopConfig, planner: Recorder | None = None, **kwargs) -> tuple[dict, Recorder]:
    planner = planner or Recorder()
    summary = run_online(config, make_policy=make_policy, encoder=HashingEncoder(), tasks=_tasks(), out_dir=out,
                         planner=CallablePlanner(planner, name="recorder"), judge=ExactJudge(), **kwargs)
    return summary, planner


def _config(**changes) -> LoopConfig:
    base = LoopConfig(steps=10, k=4, candidates=8, shuffle=False, tensorboard=False, checkpoint_every=0, seed=0)
    return dataclasses.replace(base, **changes)


def _bank(out: Path) -> list[Case]:
    with CaseBank.open(out / "bank") as bank:
        return list(bank.iter_cases())


def test_task_env_is_the_family_then_the_env() -> None:
    assert task_env(Task(id="a", question="q", answers=("x",), family="capital", env="facts")) == "capital"
    assert task_env(Task(id="a", question="q", answers=("x",), env="facts")) == "facts"
    assert task_env(Task(id="a", question="q", answers=("x",))) == "default"


def test_plain_loop_builds_nothing(tmp_path: Path) -> None:
    summary, planner = _run(tmp_path / "run", _config())
    assert {c.kind for c in _bank(tmp_path / "run")} == {"case"}
    assert planner.memory_prompts == [] and "systems" not in summary
    assert not (tmp_path / "run" / "memory_calls.jsonl").exists()
    assert all("success" not in c.meta for c in _bank(tmp_path / "run"))


def test_reflection_and_retries_are_refused_in_question_answering() -> None:
    with pytest.raises(ConfigError, match="multi-step games"):
        LoopConfig(systems=SystemsConfig(reflect=True))
    with pytest.raises(ConfigError, match="multi-step games"):
        LoopConfig(systems=SystemsConfig(retries=1))


def test_cfgm_focus_points_per_family_and_tips_of_successful_questions(tmp_path: Path) -> None:
    config = _config(policy=CFGMRetrievalConfig(), systems=SystemsConfig(build=("cfgm",), items="all"))
    summary, planner = _run(tmp_path / "run", config)
    cases = _bank(tmp_path / "run")
    focus = [c for c in cases if c.kind == "focus"]
    assert sorted(c.env for c in focus) == ["capital", "plural"]  # one per family, before its first question
    focus_prompts = [p for p in planner.memory_prompts if "guidance points" in p]
    assert len(focus_prompts) == 2 and "What is the capital of Peru?" in focus_prompts[0]
    assert "Lima" not in focus_prompts[0]  # questions only, never their answers
    answers = {c.id: c for c in cases if c.kind == "case"}
    tips = [c for c in cases if c.kind == "tip"]
    assert tips
    for tip in tips:  # linked to a successful answer of the question the tip is about
        sources = tip.meta["sources"]
        assert sources and all(s in answers for s in sources)
        assert answers[sources[0]].meta["success"] and answers[sources[0]].meta["task_id"] == tip.meta["task"]
    failed = {c.meta["task_id"] for c in answers.values() if not c.meta["success"]}
    assert not failed & {t.meta["task"] for t in tips}  # a question without a success has no tip
    assert all(c.meta["family"] in ("capital", "plural") for c in answers.values())
    # items were shown as notes: a later question saw a tip or the focus point
    assert any({"tip", "focus"} & set(kinds) for kinds in planner.shown_kinds)
    assert summary["systems"]["items_built"]["focus"] == 2
    assert summary["systems"]["llm"]["calls"] == len(planner.memory_prompts)
    ItemGraph(cases).check()


def test_lifemem_clusters_every_answer_and_distils_skills(tmp_path: Path) -> None:
    config = _config(policy=LifeMemRetrievalConfig(), systems=SystemsConfig(build=("lifemem",), items="all"))
    summary, planner = _run(tmp_path / "run", config)
    cases = _bank(tmp_path / "run")
    graph = ItemGraph(cases)
    answers = [c.id for c in cases if c.kind == "case"]
    clustered = {m for c in graph.active("cluster") for m in c.meta.get("members", [])}
    assert set(answers) == clustered  # every retained answer is in exactly the active clusters
    assert graph.active("skill")
    assert summary["systems"]["active_by_kind"]["skill"] >= 3
    assert any("skill" in kinds for kinds in planner.shown_kinds)


def test_soft_q_over_every_kind_learns_and_frozen_evaluation_does_not(tmp_path: Path) -> None:
    systems = SystemsConfig(build=("cfgm", "lifemem"), items="all")
    soft_q = dataclasses.replace(loop_policy("soft_q"), warmup=2)
    summary, _ = _run(tmp_path / "train", _config(policy=soft_q, systems=systems))
    assert summary["updates"] > 0
    frozen = _config(policy=dataclasses.replace(soft_q, init_qnet=str(tmp_path / "train" / "selector")),
                     systems=SystemsConfig(items="all"), retain=False, learn=False)
    evaluated, planner = _run(tmp_path / "eval", frozen, bank_dir=tmp_path / "train" / "bank")
    assert evaluated["updates"] == 0 and evaluated["bank_size_end"] == evaluated["bank_size_start"]
    assert planner.memory_prompts == []  # nothing is built in a frozen evaluation
    assert any(set(kinds) - {"case"} for kinds in planner.shown_kinds)


def check_extended_run(tmp_path: Path, run, config_of) -> None:
    """A run of 6 steps extended to 10 (``run(out, config, **kwargs)``, ``config_of(steps)``) ends with the bank
    of an uninterrupted 10-step run, and the reply cache holds each builder prompt once."""
    whole, _ = run(tmp_path / "whole", config_of(10))
    run(tmp_path / "part", config_of(6))
    cache = (tmp_path / "part" / "memory_calls.jsonl").read_text().splitlines()
    run(tmp_path / "part", config_of(10), resume=True)
    strip = [(c.id, c.kind, c.state, c.action, c.reward, json.dumps(c.meta, sort_keys=True))
             for c in _bank(tmp_path / "whole")]
    assert [(c.id, c.kind, c.state, c.action, c.reward, json.dumps(c.meta, sort_keys=True))
            for c in _bank(tmp_path / "part")] == strip
    after = (tmp_path / "part" / "memory_calls.jsonl").read_text().splitlines()
    assert after[:len(cache)] == cache
    assert len(after) == whole["systems"]["llm"]["calls"]  # each prompt paid once across both processes


def test_an_extended_run_equals_an_uninterrupted_one_and_pays_no_call_twice(tmp_path: Path) -> None:
    systems = SystemsConfig(build=("cfgm", "lifemem"), items="all")
    check_extended_run(tmp_path, _run,
                       lambda steps: _config(steps=steps, policy=CFGMRetrievalConfig(), systems=systems))


def test_lifemem_clusters_the_run_answers_not_the_seed_bank(tmp_path: Path) -> None:
    seeds = [Case(state=f"What is the capital of Seedland {i}?", action=f"Seed {i}", reward=1.0, env="facts")
             for i in range(7)]
    config = _config(policy=LifeMemRetrievalConfig(), systems=SystemsConfig(build=("lifemem",), items="all"))
    _, planner = _run(tmp_path / "run", config, seed_cases=seeds)
    cases = _bank(tmp_path / "run")
    clustered = {m for c in ItemGraph(cases).active("cluster") for m in c.meta.get("members", [])}
    own = {c.id for c in cases if c.kind == "case" and "success" in c.meta}
    assert len(own) == 10 and clustered == own
    assert not any("Seedland" in p for p in planner.memory_prompts)
