"""MemoryLLM (templates, cache, accounting), parse_items, parse_choice; items and the provenance graph."""

from __future__ import annotations

import json

import numpy as np
import pytest

from memento.bank import CaseBank
from memento.errors import ConfigError, DataFormatError, ProvenanceError, ReplyFormatError
from memento.planners.base import PlanOutput
from memento.systems.items import ItemGraph, make_item, sources_of
from memento.systems.llm import BuilderTemplates, MemoryLLM, parse_choice, parse_items
from memento.types import Case


class Scripted:
    name = "scripted"

    def __init__(self, reply: str = "a tip; another tip"):
        self.reply = reply
        self.prompts: list[str] = []

    def plan(self, task, cases):
        assert list(cases) == []
        self.prompts.append(task.question)
        return PlanOutput(text=self.reply)


def test_ask_fills_the_template_and_counts():
    planner = Scripted()
    llm = MemoryLLM(planner)
    reply = llm.ask("tips_success", task="find the coin", success="> go east", max_items=3)
    assert reply == "a tip; another tip"
    assert "find the coin" in planner.prompts[0] and "> go east" in planner.prompts[0] and "3" in planner.prompts[0]
    llm.count_items("tip", 2)
    stats = llm.stats()
    assert stats["calls"] == 1 and stats["items"] == 2 and stats["calls_per_item"] == 0.5
    assert stats["by_template"]["tips_success"]["calls"] == 1


def test_cache_survives_a_new_instance_and_a_torn_line(tmp_path):
    path = tmp_path / "calls.jsonl"
    first = MemoryLLM(Scripted(), cache_path=path)
    first.ask("cluster_describe", trajectories="1. x")
    with path.open("a") as handle:
        handle.write('{"key": "abc", "repl')  # a crash mid-write
    planner = Scripted("other")
    second = MemoryLLM(planner, cache_path=path)
    assert second.ask("cluster_describe", trajectories="1. x") == "a tip; another tip"
    assert planner.prompts == [] and second.stats()["cached"] == 1
    assert second.ask("cluster_describe", trajectories="2. y") == "other"


def test_a_malformed_cache_line_names_the_file_and_line(tmp_path):
    path = tmp_path / "calls.jsonl"
    path.write_text('not json\n{"key": "k", "template": "t", "reply": "r"}\n')
    with pytest.raises(DataFormatError, match=r"calls.jsonl:1:"):
        MemoryLLM(Scripted(), cache_path=path)


def test_templates_are_replaceable_and_checked(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"reflect": "Why did {error} happen?"}))
    templates = BuilderTemplates.from_json(path)
    planner = Scripted()
    MemoryLLM(planner, templates=templates).ask("reflect", goal="g", progress="p", attempted="a", error="E",
                                                candidates="c")
    assert planner.prompts == ["Why did E happen?"]
    with pytest.raises(ConfigError, match="uses field"):
        BuilderTemplates(reflect="{nope}")
    with pytest.raises(ConfigError, match="unknown template"):
        BuilderTemplates.from_json({"other": "x"})
    with pytest.raises(ConfigError, match="unknown builder template"):
        MemoryLLM(planner).ask("nope")


@pytest.mark.parametrize("text, expected", [
    ("open the door; take the key; go east", ["open the door", "take the key", "go east"]),
    ("1. Open the door. 2. Take the key 3) go east", ["Open the door", "Take the key", "go east"]),
    ("- open the door\n- take the key\n* go east", ["open the door", "take the key", "go east"]),
    ('"open the door" | open the door | take it', ["open the door", "take it"]),
])
def test_parse_items(text, expected):
    assert parse_items(text, 5) == expected


def test_parse_items_caps_and_refuses_nothing():
    assert parse_items("a1 b; c1 d; e1 f; g1 h", 2) == ["a1 b", "c1 d"]
    for reply in ("", " ; ; ", "1. 2. 3.", "..."):
        with pytest.raises(ReplyFormatError):
            parse_items(reply, 3)


@pytest.mark.parametrize("text, n, expected", [
    ("ADD 2", 3, 1), ("add to cluster 1", 3, 0), ("NEW", 3, None), ("new cluster", 2, None), ("2", 2, 1),
    ("ADD 1 or NEW", 2, 0),
])
def test_parse_choice(text, n, expected):
    assert parse_choice(text, n) == expected


@pytest.mark.parametrize("text", ["ADD 5", "maybe", "", "7"])
def test_parse_choice_refuses(text):
    with pytest.raises(ReplyFormatError):
        parse_choice(text, 3)


def _bank(tmp_path, cases):
    bank = CaseBank.create(tmp_path / "bank", dim=4)
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(len(cases), 4)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    ids = bank.add(cases, vectors)
    return bank, ids


def test_items_link_to_their_sources_through_the_bank(tmp_path):
    bank, (a, b) = _bank(tmp_path, [Case(state="task a", action="> go", reward=1.0),
                                    Case(state="task b", action="> stop", reward=0.0)])
    tip = make_item("tip", "task a", "go first", system="cfgm", sources=[a, b, a], env="coin")
    assert sources_of(tip) == [a, b]
    [tip_id] = bank.add([tip], np.eye(4, dtype=np.float32)[:1])
    skill_v0 = make_item("skill", "desc", "rule 1", system="lifemem", sources=[tip_id], group="skills:0", version=0)
    skill_v1 = [make_item("skill", "desc", f"rule {i}", system="lifemem", sources=[tip_id], group="skills:0",
                          version=1) for i in (2, 3)]
    bank.add([skill_v0, *skill_v1], np.eye(4, dtype=np.float32)[1:4])
    graph = ItemGraph.from_bank(bank)
    graph.check()
    assert [c.id for c in graph.children(a, "tip")] == [tip_id]
    assert [c.action for c in graph.latest("skills:0")] == ["rule 2", "rule 3"]
    assert graph.version("skills:0") == 1 and graph.version("nope") == -1
    assert [c.action for c in graph.children(tip_id)] == ["rule 2", "rule 3"]
    assert len(graph.children(tip_id, active_only=False)) == 3
    assert sorted(graph.trace(graph.latest("skills:0")[0].id)) == sorted([a, b])
    assert [c.action for c in graph.active("skill")] == ["rule 2", "rule 3"]
    with pytest.raises(ProvenanceError):
        make_item("case", "s", "a", system="x")


def test_check_names_a_missing_source_and_a_cycle():
    x = Case(state="s", action="a", reward=0.0, id="x", kind="tip", meta={"sources": ["y"]})
    with pytest.raises(ProvenanceError, match="does not hold"):
        ItemGraph([x]).check()
    y = Case(state="s", action="b", reward=0.0, id="y", kind="tip", meta={"sources": ["z"]})
    z = Case(state="s", action="c", reward=0.0, id="z", kind="skill", meta={"sources": ["x"]})
    with pytest.raises(ProvenanceError, match="cycle: .*x"):
        ItemGraph([x, y, z]).check()
    with pytest.raises(ProvenanceError, match="must be a list"):
        sources_of(Case(state="s", action="a", reward=0.0, id="w", kind="tip", meta={"sources": "x"}))
    ItemGraph([Case(state="s", action="a", reward=0.0, id="q")]).check()


def test_with_meta_finds_active_entries_by_an_indexed_field():
    def entry(i: str, kind: str, version: int | None = None, **meta) -> Case:
        group = {"group": "g", "version": version} if version is not None else {}
        return Case(state="s", action=i, reward=0.0, id=i, kind=kind, meta={**meta, **group})

    graph = ItemGraph([entry("a", "case", task_id="q1"), entry("b", "case", task_id="q2"),
                       entry("t0", "tip", 0, task="q1"), entry("c", "case", task_id="q1", game="g1")])
    assert [c.id for c in graph.with_meta("task_id", "q1")] == ["a", "c"]
    assert [c.id for c in graph.with_meta("task", "q1", "tip")] == ["t0"]
    graph.add(entry("t1", "tip", 1, task="q1"))  # a later version supersedes t0
    assert [c.id for c in graph.with_meta("task", "q1")] == ["t1"]
    assert [c.id for c in graph.with_meta("game", "g1", "case")] == ["c"] and graph.with_meta("game", "g2") == []
    with pytest.raises(ProvenanceError, match="not indexed"):
        graph.with_meta("family", "x")


def test_run_accounting_counts_the_calls_of_earlier_processes(tmp_path) -> None:
    from memento.systems.llm import MemoryLLM

    class Echo:
        def plan(self, task, cases):
            return "a; b"

    cache = tmp_path / "memory_calls.jsonl"
    first = MemoryLLM(Echo(), cache_path=cache)
    first.ask("cluster_describe", trajectories="one")
    first.ask("cluster_describe", trajectories="two")
    second = MemoryLLM(Echo(), cache_path=cache)  # a resumed process
    second.ask("cluster_describe", trajectories="two")  # served from the cache
    second.ask("cluster_describe", trajectories="three")
    stats = second.stats()
    assert stats["calls"] == 1 and stats["cached"] == 1 and stats["run_calls"] == 3
    assert stats["run_wall_s"] >= stats["wall_s"]
