"""Every memory builder once with the real Gemma 3 270M base (slow: loads the model).

The small base model rarely writes the structure a template asks for; the test checks that each builder runs
through the planner protocol, that what it writes is well-formed (kind, provenance) or that it took its
documented fallback, and that the calls are counted.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from memento.memory import CaseBank
from memento.planners import HFPlanner
from memento.systems.cfgm import CFGMConfig, KeyInfoReflection, build_tips, focus_point
from memento.systems.items import ItemGraph
from memento.systems.lifemem import LifeMemConfig, WorkflowClusters
from memento.systems.llm import MemoryLLM
from memento.systems.runtime import builder_planner
from memento.types import Case

pytestmark = pytest.mark.slow

GOAL = "Find the coin. It is somewhere east of the kitchen."


@pytest.fixture(scope="module")
def llm() -> MemoryLLM:
    return MemoryLLM(builder_planner(HFPlanner.default(device="cpu"), 32))


def _unit(rng: np.random.Generator, n: int) -> np.ndarray:
    x = rng.normal(size=(n, 8)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_every_builder_runs_with_gemma(llm: MemoryLLM, tmp_path) -> None:
    config = CFGMConfig()
    focus = focus_point(llm, "coin", GOAL, ["> go east", "> take coin"], config)
    assert focus is None or (focus.kind == "focus" and focus.action.strip())
    bank = CaseBank.create(tmp_path / "bank", dim=8)
    rng = np.random.default_rng(0)
    trajectories = [Case(state=f"Goal: {GOAL} ({i})", action=act, reward=r, env="coin",
                         meta={"granularity": "episode"})
                    for i, (act, r) in enumerate([("> go east\n> take coin", 1.0), ("> go west\n> look", 0.0),
                                                  ("> go east\n> go east\n> take coin", 1.0),
                                                  ("> open door\n> go north", 0.0), ("> go east\n> take coin", 1.0),
                                                  ("> take coin", 0.0)])]
    ids = bank.add(trajectories, _unit(rng, len(trajectories)))
    cases = [dataclasses.replace(c, id=i) for c, i in zip(trajectories, ids)]
    tips = build_tips(llm, GOAL, "coin", [cases[0]], [cases[1]], config, task_key="coin-1")
    assert len(tips) <= 8 and all(t.kind == "tip" and set(t.meta["sources"]) <= {ids[0], ids[1]} for t in tips)
    kir = KeyInfoReflection(llm, config=config)
    assert kir.reflect(GOAL, [("go east", "You are in a hall.")], ["go west"]) is None and kir.calls == 0
    correction = kir.reflect(GOAL, [("go north", "You can't go that way.")], ["go east", "go west"])
    assert isinstance(correction, str) and correction.strip() and kir.calls == 1
    clusters = WorkflowClusters(llm, bank, LifeMemConfig())
    for case_id in ids:
        clusters.add_trajectory(case_id)
    graph = ItemGraph.from_bank(bank)
    graph.check()
    assert clusters.clusters() and all(c.meta["members"] for c in clusters.clusters())
    stats = llm.stats()
    assert stats["calls"] >= 4 and stats["wall_s"] > 0
