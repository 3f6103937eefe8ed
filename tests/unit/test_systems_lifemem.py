"""LifeMem's builders: workflow clusters (init, assign, adaptive split), skills; items in a real bank."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest

from memento.bank import CaseBank
from memento.errors import ConfigError, DataFormatError, ReplyFormatError
from memento.planners.base import PlanOutput
from memento.systems.items import ItemGraph
from memento.systems.lifemem import (
    LifeMemConfig,
    WorkflowClusters,
    is_trajectory,
    mean_resultant_length,
    parse_groups,
    should_split,
    spherical_kmeans,
)
from memento.systems.llm import MemoryLLM
from memento.types import Case

INIT = "Group these trajectories"  # a phrase of each default template, to tell the calls apart
ASSIGN = "Does the new trajectory"
DESCRIBE = "Describe their shared workflow"
SPLIT = "sub-workflows"
SKILLS = "rules for this workflow"
DIM = 8

DEFAULT_REPLIES = {
    INIT: "1,3: pick up then open; 2,4,5: walk east",
    ASSIGN: "ADD 1",
    DESCRIBE: "walk to the room, then take the object",
    SPLIT: "",
    SKILLS: "take before open; walk before take; never repeat a command",
}


class Scripted:
    """A planner whose reply is that of the first ``replies`` key found in the prompt (a string, or a function of
    the prompt); records every prompt."""

    name = "scripted"

    def __init__(self, replies: dict | None = None):
        self.replies = {**DEFAULT_REPLIES, **(replies or {})}
        self.prompts: list[str] = []

    def plan(self, task, cases):
        assert list(cases) == []
        self.prompts.append(task.question)
        for key, reply in self.replies.items():
            if key in task.question:
                return PlanOutput(text=reply(task.question) if callable(reply) else reply)
        return PlanOutput(text="")

    def calls(self, phrase: str) -> list[str]:
        return [p for p in self.prompts if phrase in p]


def unit(*pairs: tuple[int, float]) -> np.ndarray:
    v = np.zeros(DIM, dtype=np.float32)
    for axis, value in pairs:
        v[axis] += value
    return v / np.linalg.norm(v)


def add_traj(bank: CaseBank, i: int, vector: np.ndarray, env: str | None = "coin", **meta) -> str:
    case = Case(state=f"Goal: task-{i:02d}\nCarrying: nothing", action=f"> go {i}\n> take coin", reward=1.0,
                env=env, meta={"granularity": "episode", **meta})
    [case_id] = bank.add([case], vector[None, :])
    return case_id


# trajectories 1, 3 point along axis 0; 2, 4, 5 along axis 1
BASE = [unit((0, 1), (2, 0.1)), unit((1, 1), (2, 0.1)), unit((0, 1), (3, 0.1)), unit((1, 1), (3, 0.1)),
        unit((1, 1), (4, 0.1))]


@pytest.fixture
def bank(tmp_path):
    with CaseBank.create(tmp_path / "bank", dim=DIM) as b:
        yield b


def make(bank, replies=None, **config):
    planner = Scripted(replies)
    wc = WorkflowClusters(MemoryLLM(planner), bank, LifeMemConfig(**config))
    return wc, planner


def initialised(bank, replies=None, **config):
    wc, planner = make(bank, replies, **config)
    ids = [add_traj(bank, i + 1, v) for i, v in enumerate(BASE)]
    for case_id in ids:
        wc.add_trajectory(case_id)
    return wc, planner, ids


def snapshot(bank: CaseBank) -> list[tuple]:
    return [(c.id, c.kind, c.state, c.action, c.env, c.meta) for c in bank.iter_cases()]


# ---------------------------------------------------------------------- config and numbers


def test_config_defaults_are_the_papers_and_round_trip() -> None:
    cfg = LifeMemConfig()
    assert (cfg.init_size, cfg.neighbours, cfg.split_size, cfg.split_tau) == (5, 4, 50, 0.95)
    assert (cfg.split_min, cfg.split_max, cfg.skills_min, cfg.skills_max) == (3, 6, 3, 5)
    assert cfg.skills_every == "double" and cfg.trajectory_max_chars == 600
    other = LifeMemConfig(split_size=3, split_tau=1, skills_every="always")
    assert LifeMemConfig.from_json(other.to_json()) == other and isinstance(other.split_tau, float)
    assert LifeMemConfig.from_json({}) == cfg


@pytest.mark.parametrize("changes", [dict(init_size=0), dict(neighbours=0), dict(split_tau=1.5),
                                     dict(split_min=4, split_max=3), dict(skills_min=6), dict(skills_max=0),
                                     dict(skills_every="sometimes"), dict(trajectory_max_chars=0),
                                     dict(split_size=True)])
def test_config_rejects_bad_values(changes) -> None:
    with pytest.raises(ConfigError):
        LifeMemConfig(**changes)


def test_config_from_json_rejects_unknown_fields() -> None:
    with pytest.raises(ConfigError, match="unknown"):
        LifeMemConfig.from_json({"clusters": 3})


def test_mean_resultant_length_known_answers() -> None:
    e0, e1 = np.eye(2)
    assert mean_resultant_length(np.stack([e0, e0])) == pytest.approx(1.0)
    assert mean_resultant_length(np.stack([e0, e1])) == pytest.approx(math.sqrt(2) / 2)
    assert mean_resultant_length(np.stack([e0, -e0])) == pytest.approx(0.0, abs=1e-12)
    assert mean_resultant_length(np.stack([3 * e0, 0.5 * e1])) == pytest.approx(math.sqrt(2) / 2)  # normalised
    for bad in (np.zeros((0, 4)), np.stack([e0, np.zeros(2)]), np.ones(3), [[np.nan, 1.0]]):
        with pytest.raises(DataFormatError):
            mean_resultant_length(bad)


def test_should_split_exactly_above_size_and_below_tau() -> None:
    assert should_split(51, 0.9)
    assert not should_split(50, 0.9)  # n == L
    assert not should_split(51, 0.95)  # R == tau
    assert not should_split(51, 0.99)
    assert should_split(4, 0.98, size=3, tau=0.99) and not should_split(3, 0.5, size=3, tau=0.99)


def test_parse_groups_reads_numbers_and_descriptions() -> None:
    assert parse_groups("1,3: pick up then open; 2: walk east", 3) == [([0, 2], "pick up then open"),
                                                                        ([1], "walk east")]
    assert parse_groups("- 1 and 2: a b c.\n3-5: \"open doors\"\nGroup 1: x", 5) == [([0, 1], "a b c"),
                                                                                    ([2, 3, 4], "open doors")]
    # out of range and repeated numbers are dropped; a group left empty is dropped
    assert parse_groups("1,9: first; 1,2: second; 7: none", 3) == [([0], "first"), ([1], "second")]
    assert parse_groups("1,2:", 2) == [([0, 1], "")]
    for bad in ("no groups here", "", "9: out of range", None):
        with pytest.raises(ReplyFormatError):
            parse_groups(bad, 3)


def test_spherical_kmeans_is_deterministic_and_finds_separated_groups() -> None:
    x = np.stack([unit((0, 1)), unit((1, 1)), unit((0, 1), (5, 0.1)), unit((2, 1)), unit((1, 1), (5, 0.1)),
                  unit((2, 1), (6, 0.1))])
    assert spherical_kmeans(x, 3) == [[0, 2], [1, 4], [3, 5]]
    assert spherical_kmeans(x, 3) == spherical_kmeans(x.copy(), 3)
    assert spherical_kmeans(x[:2], 3) == [[0], [1]]  # k above n: n groups
    assert spherical_kmeans(np.stack([unit((0, 1))] * 3), 3) == [[0, 1, 2]]  # identical rows: one group


# ---------------------------------------------------------------------- initial clustering


def test_trajectories_wait_until_init_size_then_one_init_call(bank) -> None:
    wc, planner = make(bank)
    ids = [add_traj(bank, i + 1, v) for i, v in enumerate(BASE)]
    for case_id in ids[:4]:
        assert wc.add_trajectory(case_id) == []
    assert planner.prompts == [] and wc.clusters() == [] and wc.pending(ids[3]) == ids[:4]
    written = wc.add_trajectory(ids[4])
    assert len(planner.calls(INIT)) == 1
    init = planner.calls(INIT)[0]
    for n in range(1, 6):
        assert f"{n}. Goal: task-{n:02d} -> > go {n} > take coin" in init
    clusters = wc.clusters()
    assert [c.state for c in clusters] == ["pick up then open", "walk east"]
    assert [c.meta["members"] for c in clusters] == [[ids[0], ids[2]], [ids[1], ids[3], ids[4]]]
    assert [c.meta["cluster"] for c in clusters] == ["0", "1"]
    assert all(c.meta["group"] == f"cluster:{c.meta['cluster']}" and c.meta["version"] == 0 for c in clusters)
    assert clusters[1].action.startswith("3 trajectories: Goal: task-02; Goal: task-04; Goal: task-05")
    assert clusters[0].env == "coin" and wc.pending() == []
    assert [wc.cluster_of(i) for i in ids] == ["0", "1", "0", "1", "1"]
    assert planner.calls(DESCRIBE) == []  # every group had its description
    assert len(planner.calls(SKILLS)) == 2 and {c.kind for c in written} == {"cluster", "skill"}
    assert all(c.id and c.meta["system"] == "lifemem" for c in written)
    # the cluster vector is the normalised mean of its members'
    mean = bank.embeddings([ids[0], ids[2]]).mean(axis=0)
    np.testing.assert_allclose(bank.embeddings([clusters[0].id])[0], mean / np.linalg.norm(mean), atol=1e-6)
    ItemGraph(bank.iter_cases()).check()
    stats = wc.llm.stats()
    assert stats["items_by_kind"]["cluster"] == 2 and stats["items_by_kind"]["skill"] == 6


def test_init_singletons_for_ungrouped_and_split_by_environment(bank) -> None:
    wc, planner = make(bank, {INIT: "1,2,3: mixed group; 9: nothing"})
    ids = [add_traj(bank, i + 1, v, env="a" if i != 1 else "b") for i, v in enumerate(BASE)]
    for case_id in ids:
        wc.add_trajectory(case_id)
    got = [(c.meta["members"], c.state, c.env) for c in wc.clusters()]
    describe = DEFAULT_REPLIES[DESCRIBE]
    assert got == [([ids[0], ids[2]], "mixed group", "a"), ([ids[1]], "mixed group", "b"),
                   ([ids[3]], describe, "a"), ([ids[4]], describe, "a")]
    assert len(planner.calls(DESCRIBE)) == 2  # one per singleton


def test_init_fallbacks_one_cluster_then_first_lines(bank, caplog) -> None:
    wc, planner = make(bank, {INIT: "I cannot group these", DESCRIBE: "...", SKILLS: "1. 2. 3."})
    with caplog.at_level(logging.WARNING, logger="memento.systems.lifemem"):
        for i, v in enumerate(BASE):
            wc.add_trajectory(add_traj(bank, i + 1, v))
    [cluster] = wc.clusters()
    assert len(cluster.meta["members"]) == 5
    assert cluster.state == "Goal: task-01"  # the describe call failed too: the first trajectory's first line
    assert len(planner.calls(DESCRIBE)) == 1 and wc.skills_of("0") == []  # no usable rule: no skill
    assert "one cluster of all 5" in caplog.text and "no description" in caplog.text


def test_seeded_bank_step_cases_are_not_trajectories(bank) -> None:
    wc, planner = make(bank)
    [step] = bank.add([Case(state="Now: a room", action="go east", reward=0.0, meta={"granularity": "step"})],
                      unit((7, 1))[None])
    assert not is_trajectory(bank.get(step))
    ids = [add_traj(bank, i + 1, v) for i, v in enumerate(BASE)]
    with pytest.raises(DataFormatError, match="not a trajectory"):
        wc.add_trajectory(step)
    with pytest.raises(DataFormatError, match="no case"):
        wc.add_trajectory("nope")
    for case_id in ids:
        wc.add_trajectory(case_id)
    assert sorted(m for c in wc.clusters() for m in c.meta["members"]) == sorted(ids)
    cluster = wc.clusters()[0]
    with pytest.raises(DataFormatError, match="not a trajectory"):
        wc.add_trajectory(cluster.id)


# ---------------------------------------------------------------------- assignment


def test_assign_lists_the_neighbours_clusters_and_follows_add(bank) -> None:
    wc, planner, ids = initialised(bank)
    t6 = add_traj(bank, 6, unit((1, 1), (5, 0.2)))  # near the axis-1 cluster "walk east"
    before = wc.cluster("1")
    written = wc.add_trajectory(t6)
    [prompt] = planner.calls(ASSIGN)
    assert "New trajectory:\nGoal: task-06 -> > go 6 > take coin" in prompt
    assert "Existing workflow clusters:\n1. walk east\n2. pick up then open\n" in prompt  # nearest first
    assert wc.cluster_of(t6) == "1"
    grown = wc.cluster("1")
    assert grown.meta["members"] == [ids[1], ids[3], ids[4], t6] and grown.meta["version"] == 1
    assert grown.state == DEFAULT_REPLIES[DESCRIBE] and grown.id != before.id
    assert wc.clusters()[0].meta["cluster"] == "0" and len(wc.clusters()) == 2
    assert written[0] == grown
    assert "4. Goal: task-06" in planner.calls(DESCRIBE)[-1]
    assert wc.add_trajectory(t6) == []  # already clustered: nothing
    ItemGraph(bank.iter_cases()).check()


def test_assign_new_and_neighbours_limit(bank) -> None:
    wc, planner, ids = initialised(bank, {ASSIGN: "NEW", DESCRIBE: "a brand new workflow"}, neighbours=1)
    t6 = add_traj(bank, 6, unit((0, 1), (5, 0.3)))
    wc.add_trajectory(t6)
    [prompt] = planner.calls(ASSIGN)
    assert "1. pick up then open" in prompt and "2." not in prompt.split("Existing workflow clusters:")[1]
    cid = wc.cluster_of(t6)
    assert cid == "2" and wc.cluster(cid).meta["members"] == [t6]
    assert wc.cluster(cid).state == "a brand new workflow" and wc.cluster(cid).meta["version"] == 0
    assert len(wc.clusters()) == 3


@pytest.mark.parametrize("reply", ["maybe", "ADD 7", ""])
def test_assign_bad_reply_adds_to_the_nearest_neighbours_cluster(bank, reply, caplog) -> None:
    wc, planner, ids = initialised(bank, {ASSIGN: reply})
    t6 = add_traj(bank, 6, unit((0, 1), (6, 0.2)))  # nearest: trajectory 1 or 3, cluster "0"
    with caplog.at_level(logging.WARNING, logger="memento.systems.lifemem"):
        wc.add_trajectory(t6)
    assert wc.cluster_of(t6) == "0" and "nearest neighbour" in caplog.text


def test_describe_fallbacks_keep_old_description_or_first_line(bank) -> None:
    wc, planner, ids = initialised(bank, {DESCRIBE: "", ASSIGN: lambda q: "NEW" if "task-07" in q else "ADD 1"})
    t6, t7 = add_traj(bank, 6, unit((1, 1), (5, 0.2))), add_traj(bank, 7, unit((1, 1), (6, 0.2)))
    wc.add_trajectory(t6)
    assert wc.cluster("1").state == "walk east" and wc.cluster("1").meta["version"] == 1
    wc.add_trajectory(t7)
    assert wc.cluster(wc.cluster_of(t7)).state == "Goal: task-07"


def test_other_environment_founds_a_cluster_without_a_call(bank) -> None:
    wc, planner, ids = initialised(bank)
    t6 = add_traj(bank, 6, unit((1, 1)), env="other")
    wc.add_trajectory(t6)
    assert planner.calls(ASSIGN) == []
    cid = wc.cluster_of(t6)
    assert cid == "2" and wc.cluster(cid).env == "other" and [c.meta["cluster"] for c in wc.clusters("other")] == ["2"]


# ---------------------------------------------------------------------- adaptive split


SPREAD = [unit((0, 1)), unit((1, 1)), unit((2, 1)), unit((0, 1), (3, 0.2)), unit((1, 1), (3, 0.2))]


def spread_world(bank, replies, **config):
    replies = {INIT: "1,2,3,4,5: one big workflow", **replies}
    wc, planner = make(bank, replies, split_size=3, split_tau=0.99, **config)
    ids = [add_traj(bank, i + 1, v) for i, v in enumerate(SPREAD)]
    for case_id in ids:
        wc.add_trajectory(case_id)
    assert len(wc.clusters()) == 1
    return wc, planner, ids


def test_split_when_large_and_dispersed(bank) -> None:
    wc, planner, ids = spread_world(bank, {SPLIT: "1,4: axis zero; 2: axis one; 3: axis two"})
    t6 = add_traj(bank, 6, unit((1, 1), (4, 0.2)))  # ungrouped by the reply: joins its nearest member, 2
    written = wc.add_trajectory(t6)
    [prompt] = planner.calls(SPLIT)
    assert "into 3 to 6 sub-workflows" in prompt and "6. Goal: task-06" in prompt
    old = wc.cluster("0")
    assert old.meta["members"] == [] and old.meta["split_into"] == ["1", "2", "3"] and old.meta["version"] == 2
    assert old.action == "0 trajectories (split into clusters 1, 2, 3)"
    got = [(c.meta["cluster"], c.state, c.meta["members"], c.meta["split_from"]) for c in wc.clusters()]
    assert got == [("1", "axis zero", [ids[0], ids[3]], "0"), ("2", "axis one", [ids[1], ids[4], t6], "0"),
                   ("3", "axis two", [ids[2]], "0")]
    assert wc.cluster_of(t6) == "2" and wc.skills_of("0") == []
    assert all(len(wc.skills_of(cid)) == 3 for cid in "123")
    assert {c.kind for c in written} == {"cluster", "skill"}
    graph = ItemGraph(bank.iter_cases())
    graph.check()
    for case_id in [*ids, t6]:  # every trajectory in exactly one active cluster
        assert sum(case_id in c.meta["members"] for c in graph.active("cluster")) == 1


def test_no_split_at_size_or_when_tight(bank, tmp_path) -> None:
    wc, planner, ids = spread_world(bank, {SPLIT: "1: a; 2: b; 3,4,5,6: c"}, )
    assert planner.calls(SPLIT) == []  # the initial clustering does not split
    with CaseBank.create(tmp_path / "tight", dim=DIM) as tight:
        wc2, planner2 = make(tight, {INIT: "1,2,3,4,5: one", SPLIT: "1: a; 2: b; 3,4,5,6: c"}, split_size=3,
                             split_tau=0.99)
        for i in range(7):
            wc2.add_trajectory(add_traj(tight, i + 1, unit((0, 1), (1 + i % 7, 0.05))))
        assert planner2.calls(SPLIT) == [] and len(wc2.clusters()) == 1
        assert mean_resultant_length(tight.embeddings(wc2.clusters()[0].meta["members"])) > 0.99
    with CaseBank.create(tmp_path / "size", dim=DIM) as sized:
        wc3, planner3 = make(sized, {INIT: "1,2,3,4,5: one", SPLIT: "1: a; 2: b; 3,4,5,6,7: c"}, split_size=6,
                             split_tau=0.99)
        for i, v in enumerate(SPREAD + [unit((2, 1), (5, 0.1))]):
            wc3.add_trajectory(add_traj(sized, i + 1, v))
        assert planner3.calls(SPLIT) == [] and len(wc3.clusters()[0].meta["members"]) == 6  # n == L
        wc3.add_trajectory(add_traj(sized, 7, unit((0, 1), (6, 0.1))))
        assert len(planner3.calls(SPLIT)) == 1 and len(wc3.clusters()) == 3  # n == L + 1


@pytest.mark.parametrize("reply", ["no idea", "1,2,3: a; 4,5,6: b"])  # unusable / too few groups
def test_bad_split_reply_falls_back_to_kmeans(bank, reply, caplog) -> None:
    wc, planner, ids = spread_world(bank, {SPLIT: reply, DESCRIBE: lambda q: "workflow of " + q.split("1. ")[1][:13]})
    t6 = add_traj(bank, 6, unit((2, 1), (4, 0.2)))
    with caplog.at_level(logging.WARNING, logger="memento.systems.lifemem"):
        wc.add_trajectory(t6)
    assert "k-means" in caplog.text
    members = [*ids, t6]
    expected = spherical_kmeans(bank.embeddings(members), 3)
    assert expected == [[0, 3], [1, 4], [2, 5]]
    assert [c.meta["members"] for c in wc.clusters()] == [[members[i] for i in g] for g in expected]
    assert [c.state for c in wc.clusters()] == ["workflow of Goal: task-01", "workflow of Goal: task-02",
                                                 "workflow of Goal: task-03"]


def test_split_into_too_many_groups_falls_back_too(bank) -> None:
    wc, planner, ids = spread_world(bank, {SPLIT: "1: a; 2: b; 3: c; 4: d; 5: e; 6: f"}, split_max=4)
    wc.add_trajectory(add_traj(bank, 6, unit((2, 1), (4, 0.2))))
    assert len(wc.clusters()) == 3  # k-means into split_min groups


# ---------------------------------------------------------------------- skills


def test_skills_count_sources_and_trace(bank) -> None:
    seven = "; ".join(f"rule number {i}" for i in range(1, 8))
    wc, planner, ids = initialised(bank, {SKILLS: seven})
    graph = ItemGraph.from_bank(bank)
    for cluster in wc.clusters():
        cid = cluster.meta["cluster"]
        skills = wc.skills_of(cid)
        assert [s.action for s in skills] == [f"rule number {i}" for i in range(1, 6)]  # at most skills_max
        for skill in skills:
            assert skill.meta["sources"] == [cluster.id] and skill.meta["cluster"] == cid
            assert skill.meta["group"] == f"skills:{cid}" and skill.meta["version"] == cluster.meta["version"]
            assert skill.state == cluster.state and skill.env == "coin"
            assert set(graph.trace(skill.id)) == set(cluster.meta["members"])
            np.testing.assert_allclose(bank.embeddings([skill.id]), bank.embeddings([cluster.id]))
    prompt = planner.calls(SKILLS)[0]
    assert "Workflow: pick up then open" in prompt and "Write 3 to 5 rules" in prompt
    graph.check()


def test_few_rules_are_kept(bank) -> None:
    wc, planner, ids = initialised(bank, {SKILLS: "only one rule"})
    assert [s.action for s in wc.skills_of("0")] == ["only one rule"]


def test_skills_double_schedule_and_carry_over(bank) -> None:
    wc, planner, ids = initialised(bank, {ASSIGN: "ADD 1"})  # cluster "1" has 3 members, distilled at 3
    assert [s.meta["distilled_at"] for s in wc.skills_of("1")] == [3, 3, 3]
    calls = len(planner.calls(SKILLS))
    t6 = add_traj(bank, 6, unit((1, 1), (5, 0.2)))
    wc.add_trajectory(t6)  # size 4: a new power of two
    assert len(planner.calls(SKILLS)) == calls + 1
    assert [s.meta["distilled_at"] for s in wc.skills_of("1")] == [4, 4, 4]
    t7 = add_traj(bank, 7, unit((1, 1), (6, 0.2)))
    written = wc.add_trajectory(t7)  # size 5: carried over, no call
    assert len(planner.calls(SKILLS)) == calls + 1
    skills = wc.skills_of("1")
    entry = wc.cluster("1")
    assert [s.meta.get("carried") for s in skills] == [True] * 3 and entry.meta["version"] == 2
    assert all(s.meta["sources"] == [entry.id] and s.meta["version"] == 2 for s in skills)
    assert [c.kind for c in written] == ["cluster", "skill", "skill", "skill"]
    graph = ItemGraph.from_bank(bank)
    assert [s.id for s in graph.children(entry.id, "skill")] == [s.id for s in skills]  # reached from the cluster
    assert wc.llm.stats()["items_by_kind"]["skill"] == 9  # carried copies are not built by the LLM


def test_skills_always_schedule_and_failed_distillation_retries(bank) -> None:
    state = {"reply": "..."}
    wc, planner, ids = initialised(bank, {SKILLS: lambda q: state["reply"]}, skills_every="always")
    assert wc.skills_of("0") == [] and wc.skills_of("1") == []  # no usable rule, nothing before: no write
    assert all(c.kind == "cluster" for c in bank.iter_cases() if c.kind != "case")
    state["reply"] = "walk first; then take; never repeat; look around"
    wc.add_trajectory(add_traj(bank, 6, unit((1, 1), (5, 0.2))))
    assert len(wc.skills_of("1")) == 4
    calls = len(planner.calls(SKILLS))
    state["reply"] = "no"
    wc.add_trajectory(add_traj(bank, 7, unit((1, 1), (6, 0.2))))
    assert len(planner.calls(SKILLS)) == calls + 1  # "always": asked again, failed: previous rules carried
    assert [s.action for s in wc.skills_of("1")] == ["walk first", "then take", "never repeat", "look around"]
    assert wc.skills_of("1")[0].meta["sources"] == [wc.cluster("1").id]


# ---------------------------------------------------------------------- rebuild


def _scripted_world() -> dict:
    def assign(q: str) -> str:
        if "task-07" in q.split("Existing")[0]:
            return "NEW"
        if "task-09" in q.split("Existing")[0]:
            return "what?"
        return "ADD 2" if "2." in q.split("Existing")[1] else "ADD 1"

    return {INIT: "1,2,3,4,5: one big workflow", ASSIGN: assign, SPLIT: "1,4: zero; 2,5: one",
            DESCRIBE: lambda q: f"workflow of {q.count(' -> ')} trajectories",
            SKILLS: lambda q: f"rule a {q.count(' -> ')}; rule b; rule c"}


VECTORS = SPREAD + [unit((1, 1), (4, 0.2)), unit((6, 1)), unit((2, 1), (5, 0.3)), unit((6, 1), (0, 0.3)),
                    unit((0, 1), (7, 0.2))]


@pytest.mark.parametrize("stop", [3, 6, 8])
def test_rebuilt_from_the_bank_continues_exactly(tmp_path, stop) -> None:
    config = dict(split_size=5, split_tau=0.99)
    with CaseBank.create(tmp_path / "ref", dim=DIM) as ref:
        wc, planner = make(ref, _scripted_world(), **config)
        for i, v in enumerate(VECTORS):
            wc.add_trajectory(add_traj(ref, i + 1, v))
        expected = snapshot(ref)
        clusters = [(c.meta["cluster"], c.meta["members"], c.state) for c in wc.clusters()]
        assert planner.calls(SPLIT) and len(clusters) >= 3
    with CaseBank.create(tmp_path / "run", dim=DIM) as run:
        first, _ = make(run, _scripted_world(), **config)
        for i, v in enumerate(VECTORS[:stop]):
            first.add_trajectory(add_traj(run, i + 1, v))
        again = WorkflowClusters(MemoryLLM(Scripted(_scripted_world())), run, LifeMemConfig(**config))
        assert [c.id for c in again.clusters()] == [c.id for c in first.clusters()]
        assert again.pending() == first.pending()
        for i, v in enumerate(VECTORS[stop:], start=stop):
            again.add_trajectory(add_traj(run, i + 1, v))
        assert [(c.meta["cluster"], c.meta["members"], c.state) for c in again.clusters()] == clusters
        assert snapshot(run) == expected
        ItemGraph(run.iter_cases()).check()


def test_reopened_bank_rebuilds_the_same_views(tmp_path) -> None:
    path = tmp_path / "bank"
    with CaseBank.create(path, dim=DIM) as bank:
        wc, _ = make(bank, _scripted_world(), split_size=5, split_tau=0.99)
        ids = [add_traj(bank, i + 1, v) for i, v in enumerate(VECTORS)]
        for case_id in ids:
            wc.add_trajectory(case_id)
        views = ([c.id for c in wc.clusters()], [wc.cluster_of(i) for i in ids],
                 {c.meta["cluster"]: [s.id for s in wc.skills_of(c.meta["cluster"])] for c in wc.clusters()})
    with CaseBank.open(path) as bank:
        again = WorkflowClusters(MemoryLLM(Scripted()), bank, LifeMemConfig(split_size=5, split_tau=0.99))
        assert ([c.id for c in again.clusters()], [again.cluster_of(i) for i in ids],
                {c.meta["cluster"]: [s.id for s in again.skills_of(c.meta["cluster"])]
                 for c in again.clusters()}) == views
        ItemGraph(bank.iter_cases()).check()


def test_shared_graph_is_updated_and_empty_cluster_views(bank) -> None:
    graph = ItemGraph.from_bank(bank)
    wc = WorkflowClusters(MemoryLLM(Scripted()), bank, LifeMemConfig(), graph=graph)
    ids = [add_traj(bank, i + 1, v) for i, v in enumerate(BASE)]  # behind the graph's back
    for case_id in ids:
        wc.add_trajectory(case_id)
    assert len(graph) == len(bank) and all(c.id in graph for c in bank.iter_cases())
    assert wc.cluster("99") is None and wc.members("99") == [] and wc.skills_of("99") == []
    assert wc.cluster_of("unknown") is None
    with pytest.raises(ConfigError):
        WorkflowClusters(MemoryLLM(Scripted()), bank, {"init_size": 3})


def test_truncated_to_a_checkpoint_then_resumed_equals_uninterrupted(tmp_path) -> None:
    config = dict(split_size=5, split_tau=0.99)
    with CaseBank.create(tmp_path / "ref", dim=DIM) as ref:
        wc, _ = make(ref, _scripted_world(), **config)
        for i, v in enumerate(VECTORS):
            wc.add_trajectory(add_traj(ref, i + 1, v))
        expected = snapshot(ref)
    with CaseBank.create(tmp_path / "run", dim=DIM) as run:
        first, _ = make(run, _scripted_world(), **config)
        checkpoint = 0
        for i, v in enumerate(VECTORS[:8]):
            first.add_trajectory(add_traj(run, i + 1, v))
            if i + 1 == 6:
                checkpoint = len(run)
        run.truncate(checkpoint)  # the crash: what came after the checkpoint is lost
        again = WorkflowClusters(MemoryLLM(Scripted(_scripted_world())), run, LifeMemConfig(**config))
        for i, v in enumerate(VECTORS[6:], start=6):
            again.add_trajectory(add_traj(run, i + 1, v))
        assert snapshot(run) == expected
