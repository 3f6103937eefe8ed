"""CFGM's builders: focus points, hybrid-grained tips, key-information reflection; items in a real bank."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from memento.bank import CaseBank
from memento.errors import ConfigError, DataFormatError, ProvenanceError
from memento.planners.base import PlanOutput
from memento.systems.cfgm import (
    DEFAULT_ANOMALY_PATTERNS,
    AnomalyDetector,
    CFGMConfig,
    KeyFacts,
    KeyInfoReflection,
    PatternDetector,
    build_tips,
    focus_point,
    key_facts,
    retry_reflection,
)
from memento.systems.items import ItemGraph
from memento.systems.llm import MemoryLLM
from memento.types import Case

CONTRAST = "Compare them."  # a phrase of each default template, to tell the calls apart
SUCCESS = "to succeed again"
FOCUS = "guidance points"
REFLECT = "what went wrong"


class Scripted:
    """A planner whose reply is the first ``replies`` entry whose key is in the prompt (else ``default``)."""

    name = "scripted"

    def __init__(self, replies: dict[str, str] | None = None, default: str = ""):
        self.replies = dict(replies or {})
        self.default = default
        self.prompts: list[str] = []

    def plan(self, task, cases):
        assert list(cases) == []
        self.prompts.append(task.question)
        for key, reply in self.replies.items():
            if key in task.question:
                return PlanOutput(text=reply)
        return PlanOutput(text=self.default)

    def calls(self, phrase: str) -> list[str]:
        return [p for p in self.prompts if phrase in p]


def case(case_id: str, action: str, reward: float, **meta) -> Case:
    return Case(id=case_id, state="find the coin", action=action, reward=reward, env="coin", meta=meta)


WIN = "> go east\nYou are in the vault.\n> take coin\nYou win!"
LOSS = "> go west\nYou can't go that way.\n> look\nA dark room."


# ---------------------------------------------------------------------- config


def test_config_defaults_validation_and_json_round_trip():
    config = CFGMConfig()
    assert (config.focus_max, config.tips_contrast_max, config.tips_success_max, config.retries) == (5, 5, 3, 3)
    assert (config.reflect_max_chars, config.trajectory_max_chars) == (200, 1200)
    other = CFGMConfig(focus_max=2, tips_contrast_max=0, retries=0, reflect_max_chars=40)
    assert CFGMConfig.from_json(other.to_json()) == other
    assert CFGMConfig.from_json({}) == config
    for bad in ({"focus_max": 0}, {"tips_success_max": -1}, {"retries": True}, {"trajectory_max_chars": 0},
                {"reflect_max_chars": 0}):
        with pytest.raises(ConfigError):
            CFGMConfig(**bad)
    with pytest.raises(ConfigError, match="unknown field"):
        CFGMConfig.from_json({"focus_maxx": 3})
    with pytest.raises(ConfigError):
        CFGMConfig.from_json({"focus_max": "5"})


# ---------------------------------------------------------------------- focus


def test_focus_point_parses_points_into_one_item():
    planner = Scripted({FOCUS: "1. read the room; 2) look for exits; - take what shines; look for exits"})
    llm = MemoryLLM(planner)
    item = focus_point(llm, "coin", "Find the coin.", ["> go east", "> take coin"], CFGMConfig(focus_max=5))
    assert item is not None and item.kind == "focus" and item.env == "coin"
    assert item.state == "coin: Find the coin."
    assert item.action == "- read the room\n- look for exits\n- take what shines"
    assert item.meta["points"] == ["read the room", "look for exits", "take what shines"]
    assert item.meta["sources"] == [] and item.meta["system"] == "cfgm"
    [prompt] = planner.prompts
    assert "- > go east\n- > take coin" in prompt and "at most 5" in prompt and "Find the coin." in prompt
    assert llm.stats()["items_by_kind"] == {"focus": 1}


def test_focus_point_caps_points_and_keeps_a_state_for_an_empty_description():
    llm = MemoryLLM(Scripted(default="aaa; bbb; ccc; ddd"))
    item = focus_point(llm, "coin", "  ", [], CFGMConfig(focus_max=2))
    assert item is not None and item.state == "coin" and item.meta["points"] == ["aaa", "bbb"]


def test_focus_point_falls_back_to_none(caplog):
    llm = MemoryLLM(Scripted(default="  ;; 12 ;"))
    with caplog.at_level(logging.WARNING, logger="memento.systems.cfgm"):
        assert focus_point(llm, "coin", "Find the coin.", ["> look"]) is None
    assert "no focus point" in caplog.text
    assert llm.stats()["items_by_kind"] == {}
    with pytest.raises(DataFormatError):
        focus_point(llm, "", "Find the coin.", [])


# ---------------------------------------------------------------------- tips


def test_tips_from_a_success_and_a_failure():
    planner = Scripted({CONTRAST: "go east not west; take the coin; 3. check exits; look first; be brief; extra",
                        SUCCESS: "take the coin; open doors; go east at once; never seen"})
    llm = MemoryLLM(planner)
    low, best, tie = case("s1", "> go north\n> go east", 0.5), case("s2", WIN, 1.0), case("s3", "other", 1.0)
    failure, later = case("f1", LOSS, 0.0), case("f2", "> wait", 0.0)
    tips = build_tips(llm, "find the coin", "coin", [low, best, tie], [failure, later], CFGMConfig(),
                      task_key="game-1")
    assert len(tips) <= 5 + 3
    contrast = [t for t in tips if t.meta["source_kind"] == "contrast"]
    success = [t for t in tips if t.meta["source_kind"] == "success"]
    assert [t.action for t in contrast] == ["go east not west", "take the coin", "check exits", "look first",
                                            "be brief"]
    # the call's first 3 items, the repeat of a contrast tip dropped (the 4th is past the call's budget)
    assert [t.action for t in success] == ["open doors", "go east at once"]
    assert all(t.meta["sources"] == ["s2", "f1"] for t in contrast)
    assert all(t.meta["sources"] == ["s2"] for t in success)
    for tip in tips:
        assert tip.kind == "tip" and tip.state == "find the coin" and tip.env == "coin" and tip.reward == 0.0
        assert tip.meta["task"] == "game-1" and tip.meta["system"] == "cfgm"
    [contrast_prompt] = planner.calls(CONTRAST)
    [success_prompt] = planner.calls(SUCCESS)
    assert WIN in contrast_prompt and LOSS in contrast_prompt and "at most 5" in contrast_prompt
    assert WIN in success_prompt and LOSS not in success_prompt and "at most 3" in success_prompt
    assert llm.stats()["items_by_kind"] == {"tip": 7}


def test_tips_trajectories_are_cut_and_task_key_defaults_to_the_task():
    planner = Scripted(default="a useful tip")
    long_win = "> go east " * 100
    tips = build_tips(MemoryLLM(planner), "find the coin", None, [case("s1", long_win, 1.0)],
                      [case("f1", "x" * 500, 0.0)], CFGMConfig(trajectory_max_chars=50))
    [contrast_prompt] = planner.calls(CONTRAST)
    assert long_win[:50].rstrip() in contrast_prompt and long_win[:60] not in contrast_prompt
    assert "x" * 50 in contrast_prompt and "x" * 51 not in contrast_prompt
    assert [t.meta["task"] for t in tips] == ["find the coin"] and tips[0].env is None  # duplicate kept once


def test_no_success_gives_no_tips_and_no_call():
    planner = Scripted(default="a tip")
    llm = MemoryLLM(planner)
    assert build_tips(llm, "find the coin", "coin", [], [case("f1", LOSS, 0.0)]) == []
    assert planner.prompts == [] and llm.stats()["items"] == 0


def test_success_only_asks_only_the_success_call():
    planner = Scripted(default="take the coin; go east")
    tips = build_tips(MemoryLLM(planner), "find the coin", "coin", [case("s1", WIN, 1.0)], [])
    assert len(planner.prompts) == 1 and planner.calls(SUCCESS) and not planner.calls(CONTRAST)
    assert [t.action for t in tips] == ["take the coin", "go east"]
    assert all(t.meta["sources"] == ["s1"] and t.meta["source_kind"] == "success" for t in tips)


def test_a_garbage_reply_falls_back_and_the_other_call_counts(caplog):
    planner = Scripted({CONTRAST: " ;; -- 42 ;", SUCCESS: "take the coin"})
    llm = MemoryLLM(planner)
    with caplog.at_level(logging.WARNING, logger="memento.systems.cfgm"):
        tips = build_tips(llm, "find the coin", "coin", [case("s1", WIN, 1.0)], [case("f1", LOSS, 0.0)])
    assert [t.action for t in tips] == ["take the coin"] and tips[0].meta["source_kind"] == "success"
    assert "tips_contrast" in caplog.text
    planner = Scripted({CONTRAST: "go east first", SUCCESS: "!!!"})
    tips = build_tips(MemoryLLM(planner), "find the coin", "coin", [case("s1", WIN, 1.0)], [case("f1", LOSS, 0.0)])
    assert [t.action for t in tips] == ["go east first"] and tips[0].meta["sources"] == ["s1", "f1"]


def test_duplicate_tips_between_calls_are_kept_once():
    planner = Scripted({CONTRAST: "Go East First; take the coin", SUCCESS: "go  east first; TAKE THE COIN; look"})
    tips = build_tips(MemoryLLM(planner), "find the coin", "coin", [case("s1", WIN, 1.0)], [case("f1", LOSS, 0.0)])
    assert [t.action for t in tips] == ["Go East First", "take the coin", "look"]


def test_a_zero_budget_skips_its_call():
    planner = Scripted(default="take the coin")
    tips = build_tips(MemoryLLM(planner), "find the coin", "coin", [case("s1", WIN, 1.0)], [case("f1", LOSS, 0.0)],
                      CFGMConfig(tips_contrast_max=0))
    assert len(planner.prompts) == 1 and planner.calls(SUCCESS) and len(tips) == 1


def test_tips_need_case_ids():
    llm = MemoryLLM(Scripted(default="a tip"))
    unsaved = Case(state="find the coin", action=WIN, reward=1.0)
    with pytest.raises(ProvenanceError, match="no id"):
        build_tips(llm, "find the coin", "coin", [unsaved], [])
    with pytest.raises(DataFormatError, match="failures"):
        build_tips(llm, "find the coin", "coin", [case("s1", WIN, 1.0)], [Case(state="t", action="a", reward=0.0)])


# ---------------------------------------------------------------------- items in a real bank


def unit(i: int, dim: int = 8) -> np.ndarray:
    v_D = np.zeros(dim, dtype=np.float32)
    v_D[i % dim] = 1.0
    return v_D


def test_items_in_a_real_bank_link_to_their_sources(tmp_path):
    bank = CaseBank.create(tmp_path / "bank", dim=8)
    raw = [Case(state="find the coin", action=WIN, reward=1.0, env="coin"),
           Case(state="find the coin", action=LOSS, reward=0.0, env="coin")]
    success_id, failure_id = bank.add(raw, np.stack([unit(0), unit(1)]))
    success, failure = bank.get([success_id, failure_id])
    planner = Scripted({CONTRAST: "go east not west; take the coin", SUCCESS: "take the coin; open doors",
                        FOCUS: "look for exits; take coins"})
    llm = MemoryLLM(planner)
    tips = build_tips(llm, "find the coin", "coin", [success], [failure], task_key="game-1")
    focus = focus_point(llm, "coin", "Find the coin.", ["> go east"])
    assert focus is not None and len(tips) == 3
    items = [*tips, focus]
    ids = bank.add(items, np.stack([unit(2 + i) for i in range(len(items))]))
    graph = ItemGraph(bank.iter_cases())
    graph.check()
    children = graph.children(success_id, "tip")
    assert sorted(c.id for c in children) == sorted(ids[:3])
    assert [c.action for c in graph.children(failure_id, "tip")] == ["go east not west", "take the coin"]
    assert graph.trace(ids[0]) == [success_id, failure_id]
    assert graph.active("focus", env="coin")[0].meta["points"] == ["look for exits", "take coins"]
    bank.close()


# ---------------------------------------------------------------------- key-information reflection


def test_pattern_detector():
    detect = PatternDetector()
    assert isinstance(detect, AnomalyDetector)
    assert detect("Nothing happens.") and detect("You can't go that way.") and detect("You can\u2019t go that way.")
    assert detect("The door is LOCKED.") and detect("That's not a verb I recognise.")
    assert not detect("You open the door.") and not detect("") and not detect(None)  # type: ignore[arg-type]
    assert len(DEFAULT_ANOMALY_PATTERNS) >= 16
    custom = PatternDetector([r"\bboom\b"])
    assert custom("BOOM!") and not custom("Nothing happens.")
    with pytest.raises(ConfigError):
        PatternDetector(["(unclosed"])


def test_key_facts_fields():
    history = [("go west", "You can't go that way."), ("look", "A room."), ("go  west", "You can't go that way."),
               ("open door", "The door is locked.")]
    facts = key_facts("find the coin", history, ["go east", "look", "take key", "go east", "unlock door"],
                      score=1.5, max_items=2)
    assert facts.progress == "4 steps taken, score 1.5"
    assert facts.attempted == ("go west", "open door")  # the last 2 distinct commands, oldest first
    assert facts.error == "The door is locked."
    assert facts.candidates == ("go east", "take key")  # not attempted yet, first 2
    fields = facts.to_fields()
    assert fields == {"goal": "find the coin", "progress": "4 steps taken, score 1.5",
                      "attempted": "go west, open door", "error": "The door is locked.",
                      "candidates": "go east, take key"}
    empty = key_facts("find the coin", [], [])
    assert empty.progress == "0 steps taken" and empty.to_fields()["attempted"] == "none"
    assert empty.to_fields()["candidates"] == "none"
    long = key_facts("g", [("x", "word  \n " * 100)], [])
    assert len(long.error) <= 200 and "  " not in long.error
    assert isinstance(facts, KeyFacts)


def test_kir_fires_on_an_anomaly_only():
    planner = Scripted({REFLECT: "\n  The door is locked:   find the key " + "first " * 80 + "\nsecond line"})
    llm = MemoryLLM(planner)
    kir = KeyInfoReflection(llm, config=CFGMConfig(reflect_max_chars=60))
    assert kir.reflect("find the coin", [("open door", "You open the door.")], ["go east"]) is None
    assert kir.reflect("find the coin", [], ["go east"]) is None
    assert planner.prompts == [] and kir.fired == 0 and kir.calls == 0
    history = [("go east", "A hall."), ("open door", "The door is locked.")]
    text = kir.reflect("find the coin", history, ["take key", "go east"], score=0)
    assert text is not None and text.startswith("The door is locked: find the key first") and len(text) <= 60
    assert "\n" not in text and kir.fired == 1 and kir.calls == 1 and len(planner.prompts) == 1
    [prompt] = planner.prompts
    assert "find the coin" in prompt and "2 steps taken, score 0" in prompt and "The door is locked." in prompt
    assert "Open candidates: take key" in prompt
    assert llm.stats()["items_by_kind"] == {"reflection": 1}


def test_kir_fallback_and_a_custom_detector():
    llm = MemoryLLM(Scripted({REFLECT: "  \n ... 42 \n"}))
    kir = KeyInfoReflection(llm, detector=lambda observation: "boom" in observation)
    assert kir.reflect("g", [("open door", "Nothing happens.")], ["x"]) is None
    text = kir.reflect("find the coin", [("open door", "A boom.")], ["open door", "take key"])
    assert text == "The last action (open door) failed: A boom. Try another action, e.g. take key."
    assert kir.calls == 1
    text = kir.reflect("find the coin", [("open door", "A boom.")], ["open door"])
    assert text == "The last action (open door) failed: A boom. Try another action."


def test_retry_reflection_always_fires():
    planner = Scripted({REFLECT: "Go east before taking the coin."})
    llm = MemoryLLM(planner)
    history = [("go west", "A dark room."), ("look", "A dark room.")]
    assert retry_reflection(llm, "find the coin", history, ["go east"], CFGMConfig()) == \
        "Go east before taking the coin."
    fallback = retry_reflection(MemoryLLM(Scripted(default="")), "find the coin", history, ["go east"], CFGMConfig())
    assert fallback == "The last action (look) failed: A dark room. Try another action, e.g. go east."
    assert retry_reflection(MemoryLLM(Scripted(default="")), "g", [], [], CFGMConfig()).startswith("The last action")


def test_at_most_five_plus_three_tips():
    many = "; ".join(f"tip number {word}" for word in "abcdefghij")
    planner = Scripted({CONTRAST: many, SUCCESS: many.replace("tip number", "rule")})
    tips = build_tips(MemoryLLM(planner), "find the coin", "coin", [case("s1", WIN, 1.0)], [case("f1", LOSS, 0.0)])
    assert len(tips) == 8 and [t.meta["source_kind"] for t in tips] == ["contrast"] * 5 + ["success"] * 3
