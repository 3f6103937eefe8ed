"""What a prompt carries from memory: PlugMem's compressed note (``PlugMemConfig.show``) and the memory tokens
counted per planner call (``memento.systems.items.memory_tokens``, ``summary.json``'s ``memory_tokens``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from memento.errors import ConfigError
from memento.planners.base import CallablePlanner
from memento.planners.prompts import PromptConfig, render_prompt
from memento.policies import PlugMemRetrievalConfig, loop_policy
from memento.systems.items import make_item, memory_tokens, split_notes
from memento.systems.plugmem import NOTE_KIND, PlugMemConfig, compress
from memento.systems.runtime import MemorySystems, SystemsConfig
from memento.types import Case, Task
from tests.unit.test_loop_systems import Recorder, _config, _run


class Asker:
    """A MemoryLLM stand-in: records each ``ask`` and answers with ``reply``."""

    def __init__(self, reply: str) -> None:
        self.reply = reply
        self.asked: list[tuple[str, dict]] = []

    def ask(self, template: str, **fields) -> str:
        self.asked.append((template, fields))
        return self.reply


def _raw(state: str, action: str) -> Case:
    return Case(state=state, action=action, reward=1.0, id=f"c-{state}")


def _fact(text: str, i: int) -> Case:
    item = make_item("proposition", text, text, system="plugmem", sources=["c-x"], concepts=["x"])
    return dataclasses.replace(item, id=f"p{i}")


def test_compress_cuts_the_reply_and_falls_back_without_an_llm() -> None:
    config = PlugMemConfig(note_max_tokens=3)
    llm = Asker("answer with the capital city alone\nsecond line")
    assert compress("What is the capital of Peru?", ["Lima is the capital of Peru"], llm=llm,
                    config=config) == ("answer with the", 1, False)
    [(template, fields)] = llm.asked
    assert template == "plug_compress" and fields["memory"] == "- Lima is the capital of Peru"
    assert compress("q", ["a b", "c"], llm=None) == ("a b; c", 0, True)
    assert compress("q", ["a b", "c"], llm=Asker("   ")) == ("a b; c", 1, True)
    assert compress("q", [], llm=llm) == ("", 0, False) and len(llm.asked) == 1


def test_show_is_validated() -> None:
    assert PlugMemConfig().show == "note"
    with pytest.raises(ConfigError, match="show"):
        PlugMemConfig(show="both")  # type: ignore[arg-type]
    assert PlugMemConfig.from_json(PlugMemConfig(show="items").to_json()).show == "items"
    # a frozen evaluation builds nothing, yet compresses what its policy chose: it needs the run's LLM
    assert SystemsConfig(items="all").needs_llm and not SystemsConfig().needs_llm
    assert not SystemsConfig(items="all", plugmem=PlugMemConfig(show="items")).needs_llm


def test_prompt_cases_put_one_note_where_the_first_item_was(tmp_path: Path) -> None:
    asked: list[str] = []
    planner = CallablePlanner(lambda task, cases: asked.append(task.question) or "Peru's capital is Lima",
                              name="scripted")
    systems = MemorySystems(SystemsConfig(items="all"), planner=planner, encode=lambda texts: None,
                            cache_path=None)  # no builder: the LLM is there for the notes
    cases = [_raw("What is the capital of Chad?", "NDjamena"), _fact("Lima is the capital of Peru", 0),
             _raw("What is the capital of Chile?", "Santiago"), _fact("Rome is the capital of Italy", 1)]
    shown = systems.prompt_cases("What is the capital of Peru?", cases)
    assert [c.kind for c in shown] == ["case", NOTE_KIND, "case"]
    assert shown[1].action == "Peru's capital is Lima" and shown[1].meta["sources"] == ["p0", "p1"]
    [prompt] = asked
    assert "- Lima is the capital of Peru\n- Rome is the capital of Italy" in prompt
    raw, notes = split_notes(shown)
    assert notes == ["Memory: Peru's capital is Lima"] and [c.action for c in raw] == ["NDjamena", "Santiago"]
    text = render_prompt(PromptConfig(), Task(id="t", question="What is the capital of Peru?", answers=("Lima",)),
                         shown)
    assert "Memory: Peru's capital is Lima" in text and "Rome" not in text
    stats = systems.stats()["plugmem_notes"]
    assert stats == {"notes": 1, "calls": 1, "memory_tokens_mean": 4.0, "memory_tokens_max": 4}
    assert memory_tokens(shown) == 6 + 1 + 4 + 6 + 1
    assert systems.prompt_cases("q", cases[::2]) == cases[::2]  # no PlugMem item: as it was, no call
    items = MemorySystems(SystemsConfig(items="all", plugmem=PlugMemConfig(show="items")), planner=None,
                          encode=lambda texts: None, cache_path=None)
    assert items.prompt_cases("q", cases) == cases and "plugmem_notes" not in items.stats()


def test_memory_tokens_count_case_words_and_note_words_without_labels() -> None:
    tip = make_item("tip", "capital", "answer with one word\n- no sentence", system="cfgm", sources=["c-a"])
    assert memory_tokens([]) == 0
    assert memory_tokens([_raw("a b c", "d"), tip]) == 4 + 4 + 2


def test_the_loop_counts_the_memory_tokens_of_every_prompt(tmp_path: Path) -> None:
    class Counting(Recorder):
        def __init__(self) -> None:
            super().__init__()
            self.tokens = 0

        def __call__(self, task: Task, cases: list[Case]) -> str:
            if not task.id.startswith("memory:"):
                self.tokens += memory_tokens(cases)
            return super().__call__(task, cases)

    for policy, systems in ((loop_policy("similarity"), SystemsConfig()),
                            (PlugMemRetrievalConfig(), SystemsConfig(build=("plugmem",), items="all"))):
        planner = Counting()
        summary, _ = _run(tmp_path / policy.kind, _config(policy=policy, systems=systems), planner=planner)
        assert summary["memory_tokens"] == planner.tokens > 0
