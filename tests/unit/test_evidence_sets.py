"""Per-case evidence and the choice of the shown set (issue 39), against known answers.

Two SYNTHETIC text worlds with a planner whose behaviour and scores are known:

- **Contradicting memories.** Each made-up thing has one question, a *current* answer and one or two *stale*
  answers, stored as cases worded exactly alike (the same question), all reward 1. The planner copies the first
  case about the thing it is shown (Gemma copies stale cases), and scores the gold (current) answer -0.2 a token
  after the current case alone, -3 after a stale one. A Q over embeddings cannot tell the look-alikes apart; per-case
  evidence can, after one labelled visit.
- **One beats four.** Every case helps alone, but the planner answers right only when shown exactly one case (a
  longer prompt confuses it), and its scores say so. The learned set size finds that one is best.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence

import numpy as np
import pytest
import torch

from memento.bank import CaseBank
from memento.config import EvidenceConfig, OnlineLabelsConfig, SetChoiceConfig
from memento.learn.evidence import (
    add_reward,
    draw_set,
    lookalike_advantage,
    ranked_prefixes,
    relative_evidence,
    reward_size,
    set_size,
    update_set_values,
)
from memento.planners.base import CallablePlanner
from memento.policies import SoftQConfig, make_policy
from memento.runs.qa import LoopConfig, OnlineLoop, qa_policy, without_labels
from memento.types import Case, Task
from tests.loop_env import ExactJudge, HashingEncoder

THINGS = ["zorvia minor", "quenlo tarrak", "mirth ondale", "pellow ruska", "varnen oskel", "halbrecht umo",
          "krestin dolver", "sabrel pintov", "tomask eilen", "ulvar nesso", "dravik sollen", "yemmet carro"]


def _thing(text: str) -> str | None:
    return next((t for t in THINGS if t in text), None)


def _contradicting_world() -> tuple[list[Case], list[Task]]:
    cases, tasks = [], []
    words = iter(np.random.default_rng(1).permutation(
        [a + b for a in ("ka", "lo", "mi", "nu", "pe", "ro", "sa", "ti") for b in ("bar", "dex", "fin", "gol", "mur")]))
    for i, thing in enumerate(THINGS):
        question = f"What is the currency of {thing}?"
        answers = [str(next(words)) for _ in range(2 + i % 2)]  # no word marks the current one
        for j, answer in enumerate(answers):
            cases.append(Case(state=question, action=answer, reward=1.0, meta={"current": j == 0}))
        tasks.append(Task(id=f"t{i}", question=f"Which currency does {thing} use today?", answers=(answers[0],)))
    order = np.random.default_rng(0).permutation(len(cases))  # current not always first
    return [cases[i] for i in order], tasks


def _copy_plan(task: Task, cases: Sequence[Case]) -> str:
    same = [c for c in cases if _thing(c.state) == _thing(task.question)]
    return same[0].action if same else "unknown"


def _copy_score(task: Task, cases: Sequence[Case], answer: str) -> float:
    return -0.2 if _copy_plan(task, cases) == answer else -3.0


C_SEEDS, C_TASKS = _contradicting_world()


def _policy(*, evidence: bool = True, sizes: str = "reward", when: str = "always", m: int = 8) -> SoftQConfig:
    base = qa_policy("soft_q")
    assert isinstance(base, SoftQConfig)
    return dataclasses.replace(base, labels=OnlineLabelsConfig(m=m, when=when),  # type: ignore[arg-type]
                               evidence=EvidenceConfig(weight=2.0 if evidence else 0.0),
                               sets=SetChoiceConfig(sizes=sizes))  # type: ignore[arg-type]


def _run(tmp_path, name: str, policy, *, seeds, tasks, plan, score, k: int, steps: int, **extra) -> OnlineLoop:
    torch.set_num_threads(1)
    config = LoopConfig(steps=steps, k=k, candidates=8, retain=False, tensorboard=False, policy=policy,
                        **{"checkpoint_every": 0, **extra})
    loop = OnlineLoop(config, make_policy=make_policy, encoder=HashingEncoder(dim=256), judge=ExactJudge(),
                      planner=CallablePlanner(plan, score_fn=score), tasks=tasks, seed_cases=seeds,
                      out_dir=tmp_path / name)
    loop.run()
    return loop


def _steps(loop: OnlineLoop) -> list[dict]:
    return [json.loads(line) for line in loop.run_dir.steps.read_text(encoding="utf-8").splitlines()]


def _revisits_shown_current_alone(loop: OnlineLoop) -> tuple[float, int]:
    """Over the visits to a thing after its first labelled visit: the share whose shown set holds its current case
    and none of its stale ones."""
    current = {c.action for c in C_SEEDS if c.meta["current"]}
    seen: set[str] = set()
    good, n = 0, 0
    with CaseBank.open(loop.run_dir.bank, read_only=True) as bank:
        for step in _steps(loop):
            thing = _thing(step["state"])
            if thing in seen:
                actions = [c.action for c in bank.get(step["chosen_ids"]) if _thing(c.state) == thing]
                good += int(any(a in current for a in actions) and all(a in current for a in actions))
                n += 1
            seen.add(thing)
    return good / max(1, n), n


@pytest.mark.parametrize("k", [1, 4])
def test_after_one_labelled_visit_the_current_case_is_shown_and_no_stale_one(tmp_path, k) -> None:
    steps = 4 * len(C_TASKS)  # each thing visited four times
    with_evidence = _run(tmp_path, "evidence", _policy(), seeds=C_SEEDS, tasks=C_TASKS, plan=_copy_plan,
                         score=_copy_score, k=k, steps=steps)
    share, n = _revisits_shown_current_alone(with_evidence)
    assert n >= 3 * len(C_TASKS) - 1 and share >= 0.9, share
    without = _run(tmp_path, "plain", _policy(evidence=False), seeds=C_SEEDS, tasks=C_TASKS, plan=_copy_plan,
                   score=_copy_score, k=k, steps=steps)
    plain_share, _ = _revisits_shown_current_alone(without)
    assert plain_share <= share - 0.2, (plain_share, share)  # a Q over embeddings alone does not tell them apart
    assert np.mean(with_evidence.successes[len(C_TASKS):]) >= 0.9


def test_evidence_lives_in_the_bank_and_leaves_with_a_deleted_case(tmp_path) -> None:
    loop = _run(tmp_path, "bank", _policy(), seeds=C_SEEDS, tasks=C_TASKS, plan=_copy_plan, score=_copy_score,
                k=1, steps=len(C_TASKS))
    with CaseBank.open(loop.run_dir.bank, read_only=True) as bank:
        count_N, weight_N, value_N = bank.evidence_at(np.arange(len(bank)))
        assert count_N.sum() > 0
        current = np.asarray([bool(c.meta.get("current")) for c in bank.get(bank.ids_at(range(len(bank))))])
        labelled = count_N > 0
        assert (value_N[labelled & current] > 0).all() and (value_N[labelled & ~current] < 0).all()
    with CaseBank.open(loop.run_dir.bank) as bank:
        pos = int(np.flatnonzero(labelled)[0])
        bank.delete(bank.ids_at([pos]))
        assert bank.evidence_at([pos])[0][0] == 0
    with CaseBank.open(loop.run_dir.bank) as bank:  # and on reopening (the rows went with it)
        assert bank.evidence_at([pos])[0][0] == 0 and bank.evidence_at(np.flatnonzero(labelled))[0].sum() > 0


# ---------------------------------------------------------------- one beats four

FAMILIES = ["alpha", "bravo", "charlie", "delta"]


def _one_world() -> tuple[list[Case], list[Task]]:
    topics = ["apples", "rivers", "engines", "poems", "stars", "coins", "maps", "shoes", "clocks", "lamps"]
    cases = [Case(state=f"{fam} question on {topic}", action=f"{fam}-answer", reward=1.0)
             for fam in FAMILIES for topic in topics[:6]]
    tasks = [Task(id=f"{fam}-{i}", question=f"{fam} question about {topic}", answers=(f"{fam}-answer",))
             for fam in FAMILIES for i, topic in enumerate(topics)]
    return cases, tasks


def _one_plan(task: Task, cases: Sequence[Case]) -> str:
    return task.answers[0] if len(cases) == 1 and cases[0].action == task.answers[0] else "confused"


def _one_score(task: Task, cases: Sequence[Case], answer: str) -> float:
    return -0.2 if _one_plan(task, cases) == answer else -1.5


O_SEEDS, O_TASKS = _one_world()


@pytest.mark.parametrize("sizes", ["reward", "labels"])
def test_a_world_where_one_case_beats_four_learns_to_show_one(tmp_path, sizes) -> None:
    learned = _run(tmp_path, "learned", _policy(sizes=sizes), seeds=O_SEEDS, tasks=O_TASKS, plan=_one_plan,
                   score=_one_score, k=4, steps=80)
    shown = [len(step["chosen_ids"]) for step in _steps(learned)]
    if sizes == "labels":
        assert shown[0] == 4  # a fresh agent shows K cases, as before (with rewards: mostly, a drawn size)
    assert np.mean(np.asarray(shown[-40:]) == 1) >= 0.9, shown
    assert np.mean(learned.successes[-40:]) >= 0.8
    values = learned.policy.set_values
    if sizes == "labels":
        assert all(v[0] == max(v) for v in values.values())
    else:  # summed over the contexts of the top case's evidence
        def total(suffix: str) -> np.ndarray:
            return np.sum([np.pad(v, (0, 4 - len(v))) for key, v in values.items() if key.endswith(suffix)], axis=0)

        sums, counts = total("/reward"), total("/count")
        assert sums[0] / counts[0] > 0.9 and sums[3] / max(1, counts[3]) < 0.1 and counts[0] >= 30
        steps = _steps(learned)
        assert any(s["set_propensity"] < 1 for s in steps)  # the size draw is part of the logged probability
    fixed = _run(tmp_path, "fixed", _policy(sizes="fixed"), seeds=O_SEEDS, tasks=O_TASKS, plan=_one_plan,
                 score=_one_score, k=4, steps=80)
    assert {len(step["chosen_ids"]) for step in _steps(fixed)} == {4} and not any(fixed.successes)
    summary = json.loads(learned.run_dir.summary_path.read_text(encoding="utf-8"))
    assert summary["memory_tokens"] < json.loads(fixed.run_dir.summary_path.read_text(encoding="utf-8"))[
        "memory_tokens"]


def test_resume_with_evidence_and_set_labels_equals_an_uninterrupted_run(tmp_path) -> None:
    seeds, tasks = C_SEEDS + O_SEEDS, C_TASKS + O_TASKS
    kwargs = dict(seeds=seeds, tasks=tasks, plan=_copy_plan_or_one, score=_score_either, k=4)
    full = _run(tmp_path, "full", _policy(when="informative"), steps=60, checkpoint_every=20, **kwargs)
    _run(tmp_path, "cut", _policy(when="informative"), steps=40, checkpoint_every=20, **kwargs)
    config = LoopConfig(steps=60, k=4, candidates=8, retain=False, tensorboard=False,
                        policy=_policy(when="informative"), checkpoint_every=20)
    resumed = OnlineLoop(config, make_policy=make_policy, encoder=HashingEncoder(dim=256), judge=ExactJudge(),
                         planner=CallablePlanner(_copy_plan_or_one, score_fn=_score_either), tasks=tasks,
                         seed_cases=seeds, out_dir=tmp_path / "cut", resume=True)
    resumed.run()
    assert resumed.successes == full.successes
    assert resumed.run_dir.labels.read_bytes() == full.run_dir.labels.read_bytes()
    assert resumed.policy.set_values == full.policy.set_values and full.policy.set_values["none/count"]
    for a, b in zip(full.policy.qnet.state_dict().values(), resumed.policy.qnet.state_dict().values()):
        assert torch.equal(a, b)
    with CaseBank.open(full.run_dir.bank, read_only=True) as one, \
            CaseBank.open(resumed.run_dir.bank, read_only=True) as two:
        everything = np.arange(len(one))
        for x, y in zip(one.evidence_at(everything), two.evidence_at(everything)):
            assert np.array_equal(x, y)


def _copy_plan_or_one(task: Task, cases: Sequence[Case]) -> str:
    return _copy_plan(task, cases) if task.id.startswith("t") else _one_plan(task, cases)


def _score_either(task: Task, cases: Sequence[Case], answer: str) -> float:
    return _copy_score(task, cases, answer) if task.id.startswith("t") else _one_score(task, cases, answer)


# ---------------------------------------------------------------- the pieces


def test_lookalike_advantage_weighs_rivals_by_how_alike_they_are() -> None:
    emb = np.asarray([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    weight, value = lookalike_advantage(np.asarray([-0.2, -3.0, -5.0]), emb, 0.05)
    assert weight[0] == pytest.approx(1.0, abs=1e-6) and value[0] == pytest.approx(2.8, abs=1e-6)
    assert value[1] == pytest.approx(-2.8, abs=1e-6)
    assert weight[2] < 1e-8  # nothing looks like it: no evidence either way


def test_draw_set_skips_lookalikes_and_logs_the_exact_probability() -> None:
    emb = np.asarray([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
    q = np.asarray([1.0, 0.9, 0.5, 0.2])
    greedy = draw_set(q, emb, ["a", "b", "c", "d"], 3, 1.0, redundancy=0.95, rng=np.random.default_rng(0),
                      greedy=True)
    assert greedy.ids == ["a", "c", "d"] and greedy.set_prob == 1.0
    rng = np.random.default_rng(1)
    counts: dict[tuple[str, ...], int] = {}
    probs: dict[tuple[str, ...], float] = {}
    for _ in range(4000):
        sel = draw_set(q, emb, ["a", "b", "c", "d"], 2, 1.0, redundancy=0.95, rng=rng)
        counts[tuple(sel.ids)] = counts.get(tuple(sel.ids), 0) + 1
        probs[tuple(sel.ids)] = sel.set_prob
        assert not {"a", "b"} <= set(sel.ids)
    assert sum(probs.values()) == pytest.approx(1.0, abs=1e-9)
    for key, n in counts.items():
        assert n / 4000 == pytest.approx(probs[key], abs=0.03)


def test_set_values_and_prefixes() -> None:
    assert set_size([], 4) == 4 and set_size([0.0, 0.0, 0.0, 0.0], 4) == 4  # ties go to the larger size
    values = update_set_values([], [1, 2, 4], np.asarray([-0.2, -1.0, -1.5]), tau=0.5, lr=0.5)
    assert set_size(values, 4) == 1 and len(values) == 4
    emb = np.asarray([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
    assert ranked_prefixes(np.arange(4), emb, 0.95, (1, 2, 4)) == [[0], [0, 2], [0, 2, 3]]
    reward = SetChoiceConfig(sizes="reward")
    assert SetChoiceConfig(sizes="labels").scored_sizes(4) == (1, 2, 4) and reward.scored_sizes(4) == ()
    assert reward.arm_sizes(4) == (1, 2, 4) and SetChoiceConfig().arm_sizes(4) == (4,)
    rng = np.random.default_rng(0)
    sums, counts = add_reward([], [], 1, 1.0)
    for _ in range(9):
        sums, counts = add_reward(sums, counts, 1, 1.0)
    assert reward_size(sums, counts, (1, 2, 4), 4, explore=0.05, prior=2.0, prior_mean=0.5, bonus=0.1, rng=rng,
                       greedy=True) == (1, 1.0)
    assert reward_size([], [], (1, 2, 4), 4, explore=0.05, prior=2.0, prior_mean=0.5, bonus=0.1, rng=rng,
                       greedy=True) == (4, 1.0)
    draws = [reward_size([], [], (1, 2, 4), 4, explore=0.05, prior=2.0, prior_mean=0.5, bonus=0.1, rng=rng)
             for _ in range(2000)]
    p4 = math.exp(2.0) / (math.exp(2.0) + 2.0)
    assert np.mean([n == 4 for n, _ in draws]) == pytest.approx(p4, abs=0.03)
    assert all(p == pytest.approx(p4 if n == 4 else 1 / (math.exp(2.0) + 2.0)) for n, p in draws)


def test_default_soft_q_labels_and_a_planner_that_cannot_score_runs_without_them(tmp_path, caplog) -> None:
    policy = qa_policy("soft_q")
    assert isinstance(policy, SoftQConfig) and policy.labels.active and policy.labels.when == "informative"
    assert without_labels(policy).labels.m == 0
    config = LoopConfig(steps=3, k=1, candidates=8, retain=False, tensorboard=False)
    loop = OnlineLoop(config, make_policy=make_policy, encoder=HashingEncoder(dim=256), judge=ExactJudge(),
                      planner=CallablePlanner(_copy_plan), tasks=C_TASKS, seed_cases=C_SEEDS, out_dir=tmp_path / "x")
    loop.run()
    assert "online labels off" in caplog.text
    assert json.loads((tmp_path / "x" / "config.json").read_text())["policy"]["labels"]["m"] == 0


def test_a_label_budget_caps_the_scored_prompts_per_task(tmp_path) -> None:
    policy = dataclasses.replace(_policy(), labels=OnlineLabelsConfig(m=8, when="always", budget=2.0))
    loop = _run(tmp_path, "budget", policy, seeds=C_SEEDS, tasks=C_TASKS, plan=_copy_plan, score=_copy_score, k=4,
                steps=36)
    passes = loop.counters["label_passes"]
    assert 0 < passes <= 2.0 * 36 and 0 < loop.counters["labelled"] < 36
    unlimited = _run(tmp_path, "all", _policy(), seeds=C_SEEDS, tasks=C_TASKS, plan=_copy_plan, score=_copy_score,
                     k=4, steps=36)
    assert unlimited.counters["label_passes"] > 2.0 * 36


def test_an_exported_selector_carries_the_evidence_and_the_set_choice(tmp_path) -> None:
    from memento.selector.export import export_selector, load_selector

    loop = _run(tmp_path, "run", _policy(), seeds=C_SEEDS, tasks=C_TASKS, plan=_copy_plan, score=_copy_score, k=4,
                steps=len(C_TASKS))
    out = export_selector(loop.run_dir.path, tmp_path / "selector")
    current = {c.action for c in C_SEEDS if c.meta["current"]}
    with load_selector(out, encoder=HashingEncoder(dim=256)) as selector:
        assert selector.config.evidence.weight == 2.0 and selector.config.sets.sizes == "reward"
        picked = [selector.select(task.question, k=1, mode="greedy", track=False).cases[0].action
                  for task in C_TASKS]
    assert np.mean([a in current for a in picked]) >= 0.9


def test_relative_evidence_reorders_lookalikes_and_moves_nothing_else() -> None:
    emb = np.asarray([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    rel = relative_evidence(np.asarray([1.0, -1.0, 3.0]), emb, 0.05)
    assert rel[0] == pytest.approx(1.0) and rel[1] == pytest.approx(-1.0) and abs(rel[2]) < 1e-6
    assert not relative_evidence(np.zeros(3), emb, 0.05).any()
