"""PlugMem: structuring, subgoal segmentation, propositions and prescriptions with provenance, the concept/intent
graph, retrieval with abstraction routing, pruning and compression, the policy, and both loops (scripted
planners: deterministic text in, text out)."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pytest

from memento.bank import CaseBank
from memento.errors import ConfigError, DataFormatError, ReplyFormatError
from memento.learn.policy import PolicyContext
from memento.planners.base import CallablePlanner, PlanOutput
from memento.policies import (
    PlugMemPolicy,
    PlugMemRetrievalConfig,
    check_policy,
    loop_policy,
    make_policy,
    regret_policy,
)
from memento.policies.similarity import bank_rewards
from memento.runs.qa import LoopConfig, run_online
from memento.systems.expand import ItemCandidates, expand_candidates
from memento.systems.items import ItemGraph, make_item, split_notes
from memento.systems.llm import MemoryLLM
from memento.systems.plugmem import (
    PlugMemBuilder,
    PlugMemConfig,
    PlugMemGraph,
    count_tokens,
    item_nodes,
    parse_facts,
    parse_procedure,
    parse_structure,
    prune_to_budget,
    raw_steps,
    retrieve,
    segment_steps,
)
from memento.systems.runtime import MemorySystems, SystemsConfig
from memento.types import Case, Task
from tests.loop_env import ExactJudge, HashingEncoder
from tests.unit.test_loop_systems import Recorder as LoopRecorder
from tests.unit.test_loop_systems import _bank, _tasks, check_extended_run
from tests.unit.test_loop_systems import _config as loop_config

DIM = 8


def unit(*pairs: tuple[int, float], dim: int = DIM) -> np.ndarray:
    v = np.zeros(dim, dtype=np.float32)
    for axis, value in pairs:
        v[axis] += value
    return v / np.linalg.norm(v)


class Encoder:
    """Fixed vectors for the texts of ``table``, a hashing encoder for any other text."""

    def __init__(self, table: dict[str, np.ndarray] | None = None, dim: int = DIM):
        self.table = table or {}
        self.hashing = HashingEncoder(dim=dim)

    def __call__(self, texts: list[str]) -> np.ndarray:
        rows = [self.table[t] if t in self.table else self.hashing.encode(t) for t in texts]
        return np.stack(rows).astype(np.float32) if rows else np.zeros((0, self.hashing.dim), np.float32)


class Scripted:
    """A planner answering each builder template (``task.id == "memory:<template>"``) with a string or a function
    of the prompt; records the prompts per template."""

    name = "scripted"

    def __init__(self, replies: dict | None = None):
        self.replies = replies or {}
        self.prompts: list[tuple[str, str]] = []

    def plan(self, task, cases):
        assert list(cases) == []
        template = task.id.removeprefix("memory:")
        self.prompts.append((template, task.question))
        reply = self.replies.get(template, "")
        return PlanOutput(text=reply(task.question) if callable(reply) else reply)

    def calls(self, template: str) -> list[str]:
        return [p for t, p in self.prompts if t == template]


# ---------------------------------------------------------------------- a game episode, scripted

GAME_STRUCTURE = {"go east": "in the east room | get the key | 0", "take key": "holding the key | get the key | 0.5",
                  "open door": "the door is open | open the door | 1"}
GAME_FACTS = {"get the key": "the key lies in the east room [key, east room]",
              "open the door": "the locked door opens with the key [door, Key]"}
GAME_PROCEDURE = {"get the key": "get the key => go east, then take the key",
                  "open the door": "open the door => open it while holding the key"}
SUBGOALS = {"get the key": unit((0, 1)), "open the door": unit((1, 1))}


def _field(prompt: str, name: str) -> str:
    match = re.search(rf"^{name}: (.*)$", prompt, re.MULTILINE)
    return match.group(1) if match else ""


def game_replies(**changes) -> dict:
    replies = {
        "plug_structure": lambda p: GAME_STRUCTURE.get(_field(p, "Action"), ""),
        "plug_facts": lambda p: GAME_FACTS.get(_field(p, "Subgoal"), ""),
        "plug_procedure": lambda p: GAME_PROCEDURE.get(_field(p, "Subgoal"), ""),
    }
    return {**replies, **changes}


def episode(bank: CaseBank, goal: str = "open the door", reward: float = 1.0, vector=None) -> str:
    case = Case(state=f"Goal: {goal}\nYou are in a small room.", action="> go east\n> take key\n> open door",
                reward=reward, env="coin", meta={"granularity": "episode", "won": reward > 0})
    [case_id] = bank.add([case], (unit((7, 1)) if vector is None else vector)[None, :])
    return case_id


@pytest.fixture
def bank(tmp_path):
    with CaseBank.create(tmp_path / "bank", dim=DIM) as b:
        yield b


def builder(bank, replies=None, **config) -> tuple[PlugMemBuilder, Scripted]:
    planner = Scripted(replies if replies is not None else game_replies())
    return PlugMemBuilder(MemoryLLM(planner), bank, PlugMemConfig(**config), encode=Encoder(SUBGOALS)), planner


def snapshot(bank: CaseBank) -> list[tuple]:
    return [(c.id, c.kind, c.state, c.action, c.env, json.dumps(c.meta, sort_keys=True)) for c in bank.iter_cases()]


# ---------------------------------------------------------------------- config and pure functions


def test_config_defaults_round_trip_and_validation() -> None:
    cfg = PlugMemConfig()
    assert cfg.segment_threshold == 0.5 and cfg.seed_k == 3 and cfg.budget_tokens == 256
    other = PlugMemConfig(segment_threshold=1, max_steps=3, facts_max=0)
    assert PlugMemConfig.from_json(other.to_json()) == other and isinstance(other.segment_threshold, float)
    assert PlugMemConfig.from_json({}) == cfg
    for bad in (dict(segment_threshold=1.5), dict(max_steps=0), dict(concepts_max=0), dict(budget_tokens=0),
                dict(match_threshold="high"), dict(seed_k=-1), dict(abstract_max=True)):
        with pytest.raises(ConfigError):
            PlugMemConfig(**bad)
    with pytest.raises(ConfigError, match="unknown"):
        PlugMemConfig.from_json({"threshold": 0.5})
    with pytest.raises(ConfigError, match="plugmem"):
        SystemsConfig(plugmem={"seed_k": 2})  # type: ignore[arg-type]
    assert SystemsConfig(build=["plugmem", "lifemem"]).build == ("plugmem", "lifemem")


def test_segmentation_known_answers() -> None:
    # cos(v0, v1) = 0.6 exactly, cos(v1, v2) = 0, cos(v2, v3) = 0.8
    v = np.array([[1, 0, 0], [3, 4, 0], [0, 0, 2], [0, 0.6, 0.8]], dtype=np.float64)
    assert segment_steps(v, 0.5) == [[0, 1], [2, 3]]
    assert segment_steps(v, 0.6) == [[0, 1], [2, 3]]  # equal to the threshold: the same segment
    assert segment_steps(v, 0.61) == [[0], [1], [2, 3]]
    assert segment_steps(v, 0.9) == [[0], [1], [2], [3]]
    assert segment_steps(v, -1.0) == [[0, 1, 2, 3]]
    assert segment_steps(v[:1], 0.5) == [[0]] and segment_steps(np.zeros((0, 3)), 0.5) == []
    for bad in (np.ones(3), np.array([[1.0, 0.0], [0.0, 0.0]]), np.array([[np.nan, 1.0]])):
        with pytest.raises(DataFormatError):
            segment_steps(bad, 0.5)


def test_replies_are_parsed_or_refused() -> None:
    assert parse_structure("holding the key | get the key | 0.5") == ("holding the key", "get the key", 0.5)
    assert parse_structure("door open; open the door; reward 3") == ("door open", "open the door", 1.0)
    assert parse_structure("only a state") == ("only a state", None, None)
    assert parse_structure("a | b | none") == (None, None, None)
    assert parse_structure(None) == (None, None, None)
    assert parse_facts("Lima is the capital of Peru [Capital cities, Peru]; no tag here; Oslo is in Norway "
                       "(norway / capitals).", 5) == [("Lima is the capital of Peru", ["capital cities", "peru"]),
                                                      ("Oslo is in Norway", ["norway", "capitals"])]
    assert parse_facts("a fact [a, bb, cc, dd]; a fact [x]", 5, concepts_max=2) == [("a fact", ["bb", "cc"])]
    for bad in ("", "untagged facts only; another one", "[just tags]", None):
        with pytest.raises(ReplyFormatError):
            parse_facts(bad, 5)
    assert parse_procedure("Intent: open the door => take the key, then open it") == (
        "open the door", "take the key, then open it")
    assert parse_procedure("noise\nanswer capitals -> say the name") == ("answer capitals", "say the name")
    assert parse_procedure("answer capitals: say the name.") == ("answer capitals", "say the name")
    for bad in ("", "no separator at all", "=> only a prescription", None):
        with pytest.raises(ReplyFormatError):
            parse_procedure(bad)


def test_pruning_respects_the_token_budget_exactly() -> None:
    texts = ["one two three", "four five six seven", "eight nine", "ten"]  # 3, 4, 2, 1 tokens
    assert [count_tokens(t) for t in texts] == [3, 4, 2, 1]
    assert prune_to_budget(texts, 7) == [0, 1]  # 7 of 7: nothing else fits
    assert prune_to_budget(texts, 6) == [0, 2, 3]  # the 4-token text is skipped, the shorter ones still fit
    assert prune_to_budget(texts, 10) == [0, 1, 2, 3] and prune_to_budget(texts, 0) == []
    for budget in range(12):
        kept = prune_to_budget(texts, budget)
        assert sum(count_tokens(texts[i]) for i in kept) <= budget
    with pytest.raises(ConfigError):
        prune_to_budget(texts, -1)


def test_raw_steps_of_an_episode_and_of_an_answer() -> None:
    game = Case(state="Goal: x\nroom", action="> go east\n\n> take key", reward=1.0, meta={"granularity": "episode"})
    assert raw_steps(game) == [("Goal: x\nroom", "go east"), ("", "take key")]
    answer = Case(state="What is the capital of Peru?", action="Lima", reward=1.0)
    assert raw_steps(answer) == [("What is the capital of Peru?", "Lima")]


# ---------------------------------------------------------------------- the builder


def test_structuring_segments_and_knowledge_with_provenance(bank) -> None:
    wc, planner = builder(bank)
    case_id = episode(bank)
    written = wc.add_trajectory(case_id)
    structure = planner.calls("plug_structure")
    assert len(structure) == 3
    assert "Observation: Goal: open the door You are in a small room." in structure[0]
    assert "Observation: (not recorded)" in structure[1] and "Earlier actions: go east" in structure[1]
    assert all("reward 1 (success)" in p for p in structure)
    # subgoals "get the key", "get the key", "open the door": two segments, one facts + one procedure call each
    assert len(planner.calls("plug_facts")) == 2 and len(planner.calls("plug_procedure")) == 2
    assert "2. state: holding the key | action: take key | subgoal: get the key | reward: 0.5" in \
        planner.calls("plug_facts")[0]
    props = [c for c in written if c.kind == "proposition"]
    prescs = [c for c in written if c.kind == "prescription"]
    assert [p.action for p in props] == ["the key lies in the east room", "the locked door opens with the key"]
    assert [p.meta["concepts"] for p in props] == [["key", "east room"], ["door", "key"]]
    assert [(p.meta["intent"], p.meta["return"]) for p in prescs] == [("get the key", 0.5), ("open the door", 1.0)]
    assert prescs[0].state == "get the key" and prescs[0].action == "get the key: go east, then take the key"
    for item in written:
        assert item.meta["sources"] == [case_id] and item.meta["system"] == "plugmem" and item.env == "coin"
        assert item.reward == 0.0 and item.meta["support"] == 1 and item.meta["version"] == 0
    assert dataclasses.replace(bank.get(written[0].id), created=None, updated=None) == written[0]  # a row, meta kept
    np.testing.assert_allclose(bank.embeddings([props[0].id])[0], Encoder(SUBGOALS)([props[0].state])[0], atol=1e-6)
    graph = ItemGraph.from_bank(bank)
    graph.check()
    assert graph.trace(prescs[1].id or "") == [case_id]
    plug = PlugMemGraph.from_bank(bank)
    assert plug.concepts() == ["key", "east room", "door"]
    assert plug.intents() == ["get the key", "open the door"]
    assert [p.id for p in plug.propositions_of(" Key. ")] == [p.id for p in props]
    assert [p.id for p in plug.prescriptions_of("Open the door")] == [prescs[1].id]
    assert [s.id for s in plug.sources_of(props[0])] == [case_id] and plug.sources_of(props[0].id or "")
    assert item_nodes(prescs[0]) == ("intent:get the key",) and item_nodes(bank.get(case_id)) == ()
    stats = wc.llm.stats()
    assert stats["items_by_kind"] == {"prescription": 2, "proposition": 2} and stats["calls"] == 7
    # the same trajectory again: nothing (no call, no entry)
    before = snapshot(bank)
    assert wc.add_trajectory(case_id) == [] and len(planner.prompts) == 7 and snapshot(bank) == before


def test_knowledge_found_again_is_a_new_version_with_merged_provenance(bank) -> None:
    def structure(prompt):
        reply = GAME_STRUCTURE.get(_field(prompt, "Action"), "")
        return reply.replace("| 0.5", "| 0.1") if "Goal: again" in prompt else reply

    wc, planner = builder(bank, game_replies(plug_structure=structure))
    first = episode(bank)
    wc.add_trajectory(first)
    second = episode(bank, goal="again", reward=1.0, vector=unit((6, 1)))
    written = wc.add_trajectory(second)
    assert len(written) == 4 and all(w.meta["version"] == 1 for w in written)
    assert all(w.meta["sources"] == [first, second] and w.meta["support"] == 2 for w in written)
    graph = ItemGraph.from_bank(bank)
    graph.check()
    assert len(graph.active("proposition")) == 2 and len(graph.active("prescription")) == 2
    assert len([c for c in graph.cases.values() if c.kind == "proposition"]) == 4  # old versions stay, inactive
    key = [p for p in graph.active("prescription") if p.meta["intent"] == "get the key"][0]
    assert key.meta["return"] == pytest.approx((0.5 + 0.1) / 2)
    assert {c.id for c in graph.children(first, "proposition")} == {w.id for w in written if w.kind == "proposition"}
    plug = PlugMemGraph(graph)
    assert [p.id for p in plug.propositions_of("key")] == [w.id for w in written if w.kind == "proposition"]
    # a reopened bank continues exactly: a third trajectory sees the merged versions
    third = episode(bank, goal="third", vector=unit((5, 1)))
    again, _ = builder(bank, game_replies(plug_structure=structure))
    assert {w.meta["version"] for w in again.add_trajectory(third)} == {2}


def test_bad_replies_give_no_item_and_never_a_malformed_bank(bank, caplog) -> None:
    wc, planner = builder(bank, {})  # every reply is empty
    case_id = episode(bank)
    steps = wc.structure(bank.get(case_id))
    assert [s.subgoal for s in steps] == ["Goal: open the door"] * 3  # the task, carried forward
    assert [s.reward for s in steps] == [0.0, 0.0, 1.0]  # the stored reward at the last step
    assert [s.state for s in steps] == ["Goal: open the door", "after take key", "after open door"]
    assert wc.add_trajectory(case_id) == []
    assert [c.kind for c in bank.iter_cases()] == ["case"]
    for replies in ({"plug_facts": "untagged fact; another", "plug_procedure": "no separator here"},
                    {"plug_structure": "x | y | z", "plug_facts": "[]; ok fact [", "plug_procedure": "=> b"},
                    {"plug_facts": 42, "plug_procedure": "\n\n"}):
        wc, _ = builder(bank, {k: (lambda _p, r=r: r) for k, r in replies.items()})
        assert wc.add_trajectory(episode(bank, goal=str(replies)[:20], vector=unit((3, 1)))) == []
    # a reply with one good fact among bad ones gives exactly that item, well formed
    wc, _ = builder(bank, {"plug_facts": "no tag; the door is red [door]", "plug_procedure": "nothing"})
    [item] = wc.add_trajectory(episode(bank, goal="red door", vector=unit((4, 1))))
    assert item.kind == "proposition" and item.meta["concepts"] == ["door"] and item.meta["sources"]
    ItemGraph.from_bank(bank).check()
    with pytest.raises(DataFormatError, match="not a trajectory"):
        step = Case(state="s", action="go", reward=0.0, meta={"granularity": "step"})
        wc.add_trajectory(bank.add([step], unit((2, 1))[None, :])[0])
    with pytest.raises(DataFormatError, match="holds no case"):
        wc.add_trajectory("missing")


def test_accepts_filters_trajectories(bank) -> None:
    planner = Scripted(game_replies())
    wc = PlugMemBuilder(MemoryLLM(planner), bank, encode=Encoder(SUBGOALS), accepts=lambda c: c.env != "coin")
    assert wc.add_trajectory(episode(bank)) == [] and planner.prompts == []


# ---------------------------------------------------------------------- graph, retrieval, policy

Q = unit((0, 1), (1, 0.1), dim=4)


@pytest.fixture
def knowledge(tmp_path):
    """Two trajectories: t1 (near the query) gave P1 (capital cities) and P3 (plurals); t2 (far) gave P2 (capital
    cities, ecuador) and R1. P3 is more similar to the query than P2, but P2 shares P1's concept."""
    bank = CaseBank.create(tmp_path / "kb", dim=4)
    t1, t2 = bank.add([Case(state="What is the capital of Peru?", action="Lima", reward=1.0, env="facts"),
                       Case(state="What is the plural of mouse?", action="mice", reward=1.0, env="facts")],
                      np.stack([unit((0, 1), (3, 0.2), dim=4), unit((3, 1), dim=4)]))

    def item(kind, text, sources, vector, **meta):
        return bank.add([make_item(kind, text if kind == "proposition" else meta["intent"], text, system="plugmem",
                                   sources=sources, env="facts", **meta)], vector[None, :])[0]

    p1 = item("proposition", "Lima is the capital of Peru", [t1], unit((0, 1), dim=4), concepts=["capital cities"])
    p3 = item("proposition", "mice is the plural of mouse", [t1], unit((0, 0.3), (2, 1), dim=4),
              concepts=["plurals"])
    p2 = item("proposition", "Quito is the capital of Ecuador", [t2], unit((1, 1), dim=4),
              concepts=["capital cities", "ecuador"])
    r1 = item("prescription", "answer a capital question: say the bare name", [t2], unit((3, 1), (1, 0.1), dim=4),
              intent="answer a capital question", prescription="say the bare name", **{"return": 1.0})
    yield bank, PlugMemGraph.from_bank(bank), dict(t1=t1, t2=t2, p1=p1, p2=p2, p3=p3, r1=r1)
    bank.close()


NODE_VECTORS = {"capital cities": unit((0, 1), dim=6), "capitals of countries": unit((0, 1), (5, 0.2), dim=6),
                "ecuador": unit((1, 1), dim=6), "plurals": unit((2, 1), dim=6),
                "answer a capital question": unit((3, 1), dim=6), "unrelated words": unit((4, 1), dim=6)}


def test_routing_reaches_a_proposition_only_through_a_shared_concept(knowledge) -> None:
    bank, plug, ids = knowledge
    assert plug.concepts() == ["capital cities", "plurals", "ecuador"] and plug.intents() == ["answer a capital "
                                                                                             "question"]
    cfg = PlugMemConfig(seed_k=1)
    out = retrieve("What is the capital of Chile?", Q, bank=bank, graph=plug, config=cfg)  # no LLM: fallbacks
    assert out.seeds == [ids["p1"]] and out.queries == ["capital cities"] and out.nodes == ["concept:capital cities"]
    assert out.routed == [ids["p2"]] and ids["p3"] not in out.kept  # P3 is nearer, but not on the route
    assert out.kept == [ids["p1"], ids["p2"]] and out.calls == 0 and out.fallbacks == ("abstract", "compress")
    assert out.note == "Lima is the capital of Peru; Quito is the capital of Ecuador" and out.memory_tokens == 12
    # the LLM's abstract query matches the node by embedding; the note is its compression
    planner = Scripted({"plug_abstract": "capitals of countries; unrelated words",
                        "plug_compress": "Capitals: Lima (Peru), Quito (Ecuador).\nmore"})
    out = retrieve("What is the capital of Chile?", Q, bank=bank, graph=plug, config=cfg, llm=MemoryLLM(planner),
                   encode=Encoder(NODE_VECTORS, dim=6))
    assert out.queries == ["capitals of countries", "unrelated words"] and out.nodes == ["concept:capital cities"]
    assert out.kept == [ids["p1"], ids["p2"]] and out.calls == 2 and out.fallbacks == ()
    assert out.note == "Capitals: Lima (Peru), Quito (Ecuador)." and out.memory_tokens == 5
    assert "Related memory: capital cities" in planner.calls("plug_abstract")[0]
    assert "- Quito is the capital of Ecuador" in planner.calls("plug_compress")[0]
    # without an encoder the abstract query only matches exactly: no node, only the seed
    out = retrieve("q", Q, bank=bank, graph=plug, config=cfg, llm=MemoryLLM(Scripted({"plug_abstract": "x y z"})))
    assert out.nodes == [] and out.kept == [ids["p1"]] and out.fallbacks == ("compress",)


def test_retrieval_prunes_to_the_budget_and_compression_falls_back(knowledge) -> None:
    bank, plug, ids = knowledge
    for budget, kept in ((12, ["p1", "p2"]), (11, ["p1"]), (6, ["p1"]), (5, [])):
        out = retrieve("q", Q, bank=bank, graph=plug, config=PlugMemConfig(seed_k=1, budget_tokens=budget))
        assert out.kept == [ids[k] for k in kept] and out.memory_tokens <= budget
    out = retrieve("q", Q, bank=bank, graph=plug, config=PlugMemConfig(seed_k=1, budget_tokens=5))
    assert out.note == "" and out.memory_tokens == 0
    planner = Scripted({"plug_abstract": "capital cities", "plug_compress": "  \n..."})  # no usable line
    out = retrieve("q", Q, bank=bank, graph=plug, config=PlugMemConfig(seed_k=1), llm=MemoryLLM(planner))
    assert out.fallbacks == ("compress",) and out.note == "; ".join(out.texts) and out.calls == 2
    long = Scripted({"plug_compress": " ".join(["word"] * 50)})
    out = retrieve("q", Q, bank=bank, graph=plug, config=PlugMemConfig(seed_k=1, note_max_tokens=7),
                   llm=MemoryLLM(long))
    assert out.memory_tokens == 7


def test_expansion_routes_and_the_policy_chooses_within_the_budget(knowledge) -> None:
    bank, plug, ids = knowledge
    base = bank.candidates(Q, 1, kind="case")
    assert base.ids == [ids["t1"]]
    plain = expand_candidates(bank, plug.graph, Q, base)  # children of t1 only
    assert plain.ids == [ids["t1"], ids["p1"], ids["p3"]] and plain.kinds == ["case", "proposition", "proposition"]
    cands = expand_candidates(bank, plug.graph, Q, base, plug=plug, seeds=1, route=3)
    assert isinstance(cands, ItemCandidates)
    assert cands.ids == [ids["t1"], ids["p1"], ids["p3"], ids["p2"]]  # P2: routed from P1 through its concept
    assert cands.links[3] == (1,) and cands.nodes[3] == ("concept:capital cities", "concept:ecuador")
    assert cands.tokens_C.tolist() == [1, 6, 6, 6]
    kept = cands.take(np.array([3, 0]))
    assert kept.nodes == [cands.nodes[3], ()] and kept.tokens_C.tolist() == [6, 1]
    policy = make_policy(PlugMemRetrievalConfig(seeds=1), PolicyContext(dim=4, reward_of=bank_rewards(bank)))
    assert isinstance(policy, PlugMemPolicy)
    sel = policy.select(Q, cands, 4, rng=np.random.default_rng(0))
    assert sel.ids == [ids["p1"], ids["p2"]] and sel.greedy and sel.set_prob == 1.0
    for config, expected in ((PlugMemRetrievalConfig(seeds=1, route=False), ["p1"]),
                             (PlugMemRetrievalConfig(seeds=1, budget_tokens=11), ["p1"]),
                             (PlugMemRetrievalConfig(seeds=1, budget_tokens=12), ["p1", "p2"]),
                             (PlugMemRetrievalConfig(seeds=1, cases=1), ["p1", "p2", "t1"]),
                             (PlugMemRetrievalConfig(seeds=2), ["p1", "p3", "p2"])):
        assert PlugMemPolicy(config).select(Q, cands, 4, rng=np.random.default_rng(0)).ids == [ids[k]
                                                                                              for k in expected]
    assert policy.select(Q, cands, 1, rng=np.random.default_rng(0)).ids == [ids["p1"]]
    assert policy.select(Q, plain_cases := bank.candidates(Q, 2, kind="case"), 2,
                         rng=np.random.default_rng(0)).ids == plain_cases.ids  # no item: the most similar
    probs = policy.probs(Q, cands)
    assert probs.sum() == pytest.approx(1.0) and probs[2] == 0.0
    raw, notes = split_notes([bank.get(ids["p1"]), bank.get(ids["r1"])])
    assert raw == [] and notes == ["Fact: Lima is the capital of Peru",
                                   "Procedure: answer a capital question: say the bare name"]


def test_policy_config_kind_and_factories() -> None:
    assert loop_policy("plugmem") == PlugMemRetrievalConfig() == regret_policy("plugmem")
    check_policy(type("X", (), {"policy": PlugMemRetrievalConfig()})(), "policy")
    for bad in (dict(seeds=0), dict(route="yes"), dict(budget_tokens=0), dict(cases=-1)):
        with pytest.raises(ConfigError):
            PlugMemRetrievalConfig(**bad)  # type: ignore[arg-type]


# ---------------------------------------------------------------------- the runtime hook


def test_memory_systems_build_on_every_new_trajectory_and_report_note_tokens(tmp_path, bank) -> None:
    planner = Scripted(game_replies(plug_abstract="key", plug_compress="take the key first"))
    systems = MemorySystems(SystemsConfig(build=("plugmem",), items="all"), planner=planner,
                            encode=Encoder(SUBGOALS), cache_path=tmp_path / "calls.jsonl")
    systems.open(bank)
    case_id = episode(bank)
    systems.added([bank.get(case_id)], [case_id])
    systems.after_episode(bank, case_id)
    systems.after_episode(bank, None)
    kinds = [c.kind for c in bank.iter_cases()]
    assert kinds.count("proposition") == 2 and kinds.count("prescription") == 2
    cands = systems.candidates(bank, unit((7, 1)), 4, env="coin")
    assert set(cands.kinds) == {"case", "proposition", "prescription"}
    note = systems.plugmem_note(bank, "open the door", unit((7, 1)))
    assert note.note == "take the key first" and note.memory_tokens == 4
    stats = systems.stats()
    assert stats["plugmem_notes"] == {"notes": 1, "calls": 2, "memory_tokens_mean": 4.0, "memory_tokens_max": 4}
    assert stats["items_built"] == {"prescription": 2, "proposition": 2}
    plain = MemorySystems(SystemsConfig(), planner=planner, encode=Encoder(), cache_path=None)
    plain.open(bank)
    other = episode(bank, goal="plain", vector=unit((6, 1)))
    plain.after_episode(bank, other)
    assert plain.llm is None and plain.plugmem is None and len(list(bank.iter_cases())) == len(kinds) + 1


# ---------------------------------------------------------------------- the question-answering loop

def _family(prompt: str) -> str:
    return "capitals" if "capital" in _field(prompt, "Task") else "plurals"


def _qa_fact(prompt: str) -> str:
    question = re.search(r"observation: (.*?) \| state:", prompt)
    answer = re.search(r"action: (.*?) \| subgoal:", prompt)
    if not question or not answer:
        return ""
    return f"{answer.group(1)} answers {question.group(1)} [{_family(prompt)}]"


QA_REPLIES = {
    "plug_structure": lambda p: f"the question is answered | answer a {_family(p)} question | 1",
    "plug_facts": _qa_fact,
    "plug_procedure": lambda p: f"answer a {_family(p)} question => reply with the bare word",
}


class Recorder(LoopRecorder):
    """As the loop tests' scripted planner, with PlugMem's scripted replies; a plugmem item makes an answer right."""

    HELPED = ("proposition", "prescription", "memory")  # items, or the note they were compressed into

    def builder_reply(self, task: Task) -> str:
        reply = QA_REPLIES.get(task.id.removeprefix("memory:"), "")
        return reply(task.question) if callable(reply) else reply


def _run(out: Path, config: LoopConfig, **kwargs) -> tuple[dict, Recorder]:
    planner = Recorder()
    summary = run_online(config, make_policy=make_policy, encoder=HashingEncoder(), tasks=_tasks(), out_dir=out,
                         planner=CallablePlanner(planner, name="recorder"), judge=ExactJudge(), **kwargs)
    return summary, planner


def _config(**changes) -> LoopConfig:
    return loop_config(**{"policy": PlugMemRetrievalConfig(),
                          "systems": SystemsConfig(build=("plugmem",), items="all"), **changes})


def test_online_loop_builds_plugmem_items_and_the_policy_shows_them(tmp_path: Path) -> None:
    summary, planner = _run(tmp_path / "run", _config())
    cases = _bank(tmp_path / "run")
    graph = ItemGraph(cases)
    graph.check()
    answers = {c.id for c in cases if c.kind == "case"}
    items = [c for c in cases if c.kind in ("proposition", "prescription")]
    assert len(answers) == 10 and items
    assert all(set(c.meta["sources"]) <= answers and c.meta["system"] == "plugmem" for c in items)
    assert {s for c in items for s in c.meta["sources"]} == answers  # every answer gave knowledge
    plug = PlugMemGraph(graph)
    assert plug.concepts() == ["capitals", "plurals"]
    assert plug.intents() == ["answer a capitals question", "answer a plurals question"]
    [procedure] = plug.prescriptions_of("answer a capitals question")
    assert procedure.meta["support"] == 5 and procedure.meta["version"] == 4  # one entry, merged five times
    assert any("memory" in kinds for kinds in planner.shown_kinds)  # the items, compressed into one note
    assert not any({"proposition", "prescription"} & set(kinds) for kinds in planner.shown_kinds)
    steps = [json.loads(line) for line in (tmp_path / "run" / "steps.jsonl").read_text().splitlines()]
    item_ids = {c.id for c in items}
    assert any(set(s["chosen_ids"]) & item_ids for s in steps)
    built = summary["systems"]["items_built"]
    assert built["proposition"] == len([c for c in items if c.kind == "proposition"])
    assert summary["systems"]["active_by_kind"]["prescription"] == 2
    assert summary["systems"]["llm"]["calls"] == len(planner.memory_prompts)


def test_an_extended_run_equals_an_uninterrupted_one_and_pays_no_call_twice(tmp_path: Path) -> None:
    check_extended_run(tmp_path, _run, lambda steps: _config(steps=steps))


def test_soft_q_over_every_kind_can_choose_plugmem_items(tmp_path: Path) -> None:
    soft_q = dataclasses.replace(loop_policy("soft_q"), warmup=2)
    summary, planner = _run(tmp_path / "run", _config(policy=soft_q))
    assert summary["updates"] > 0
    assert any("memory" in kinds for kinds in planner.shown_kinds)


# ---------------------------------------------------------------------- the game loop

def _game_step(prompt: str) -> str:
    action = _field(prompt, "Action")
    return f"after {action} | {'explore the rooms' if action.startswith('go') else 'finish the quest'} | 0"


GAME_LOOP_REPLIES = {
    "plug_structure": _game_step,
    "plug_facts": "the quest names the object to take [quest]",
    "plug_procedure": "finish the quest => follow the commands the goal names, in order",
}


def test_game_loop_builds_plugmem_items_from_episodes_and_shows_them(tmp_path: Path, tiny_games) -> None:
    from memento.runs.games import GameLoopConfig, run_games
    from tests.game_env import ScriptedPlanner, walkthrough_commands

    class Planner(ScriptedPlanner):
        def __init__(self, preferred):
            super().__init__(preferred)
            self.actor_prompts: list[str] = []

        def plan(self, task, cases):
            if task.id.startswith("memory:"):
                reply = GAME_LOOP_REPLIES.get(task.id.removeprefix("memory:"), "")
                return PlanOutput(text=reply(task.question) if callable(reply) else reply)
            return super().plan(task, cases)

        def score_many(self, tasks, case_sets_per_task, answers=None):
            self.actor_prompts.extend(t.question for t in tasks[:1])
            return super().score_many(tasks, case_sets_per_task, answers)

    games = tiny_games["train"]
    planner = Planner(walkthrough_commands(games))
    base = GameLoopConfig(episodes=4, k=4, tensorboard=False, checkpoint_every=0, seed=1,
                          game=dataclasses.replace(GameLoopConfig().game, max_steps=5))
    config = dataclasses.replace(base, policy=loop_policy("plugmem"),
                                 systems=SystemsConfig(build=("plugmem",), items="all"))
    summary = run_games(config, make_policy=make_policy, encoder=HashingEncoder(), planner=planner, games=games,
                        out_dir=tmp_path / "run")
    cases = _bank(tmp_path / "run")
    graph = ItemGraph(cases)
    graph.check()
    episodes = {c.id for c in cases if c.meta.get("granularity") == "episode"}
    items = graph.active("proposition") + graph.active("prescription")
    assert len(items) == 2 and all(set(c.meta["sources"]) == episodes for c in items)  # merged over the episodes
    assert items[0].meta["support"] == len(episodes) >= 2  # (a repeated episode is no new trajectory)
    assert summary["systems"]["active_by_kind"]["proposition"] == 1
    assert any("Memory: " in p for p in planner.actor_prompts)  # the chosen items, compressed into one note
    assert summary["memory_tokens"] > 0


# ---------------------------------------------------------------------- `memento online` over a damaged PlugMem bank

def _damage(bank: Path, how: str) -> None:
    """Damage a bank holding PlugMem items (its graph is derived from these SQLite rows): ``garbage`` (the whole
    ``cases.sqlite``), ``cases_page`` (the root page of its cases table; the header and the meta table still
    read), ``meta_json`` (the items' meta not JSON) or ``provenance`` (the prescriptions' sources not in the bank)."""
    import sqlite3

    db = bank / "cases.sqlite"
    if how == "garbage":
        db.write_bytes(np.random.default_rng(0).bytes(db.stat().st_size))
        return
    conn = sqlite3.connect(db)
    try:
        if how == "meta_json":
            conn.execute("UPDATE cases SET meta = '{not json' WHERE kind IN ('proposition', 'prescription')")
        elif how == "provenance":
            for case_id, meta in conn.execute("SELECT id, meta FROM cases WHERE kind = 'prescription'").fetchall():
                conn.execute("UPDATE cases SET meta = ? WHERE id = ?",
                             (json.dumps({**json.loads(meta), "sources": ["c-not-in-the-bank"]}), case_id))
        else:
            page = conn.execute("PRAGMA page_size").fetchone()[0]
            [root] = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'cases'").fetchone()
        conn.commit()
    finally:
        conn.close()
    if how == "cases_page":
        data = bytearray(db.read_bytes())
        data[(root - 1) * page:root * page] = np.random.default_rng(1).bytes(page)
        db.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["garbage", "cases_page", "meta_json", "provenance"])
def test_online_over_a_damaged_plugmem_bank_is_one_line_and_writes_nothing(
        tmp_path: Path, how: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import memento.cli.entry as cli
    import memento.cli.online as online_cli

    _run(tmp_path / "seed", _config())
    bank = tmp_path / "bank"
    (tmp_path / "seed" / "bank").rename(bank)
    assert {"proposition", "prescription"} <= {c.kind for c in _bank(tmp_path)}
    _damage(bank, how)
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"id": t.id, "question": t.question, "answers": list(t.answers),
                                         "family": t.family, "env": t.env}) + "\n" for t in _tasks()))
    monkeypatch.setattr(online_cli, "load_encoder", lambda config: HashingEncoder())  # the seed run's encoder
    monkeypatch.setattr(online_cli, "build_planner", lambda spec, **kw: CallablePlanner(Recorder(), name="recorder"))
    out = tmp_path / "out"
    code = cli.main(["online", "--tasks", str(tasks), "--planner", "gemma", "--bank", str(bank), "--build", "plugmem",
                     "--policy", "plugmem", "--steps", "3", "--checkpoint-every", "0", "--no-progress",
                     "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("memento: error: ") and "\n" not in err, err
    assert not out.exists()
