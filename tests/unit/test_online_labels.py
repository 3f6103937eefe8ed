"""Online per-candidate labels (SoftQConfig.labels) and the Q-network's relation term, against a known answer.

A SYNTHETIC text environment of the kind where similarity fails with the right format and the wrong content:
questions name an entity (three made-up words, which dominate a bag-of-words embedding) and ask for one of
four attributes. The bank holds two attributes of each entity, all correct, reward 1; every task asks an
entity for an attribute the bank lacks for it. The cosine neighbours are the entity's *other* attributes,
which mislead the planner: it answers right iff the one case it is shown (K = 1) asks the *same attribute*
(of another entity). The planner's scores know it: the gold answer is likely (-0.2 nats a token) after a
same-attribute case and unlikely (-2) after any other.

The default learner (BCE on the one shared reward, a concatenation MLP anchored on cosine) does not find the
same-attribute cases within the run; with online labels and the bilinear relation term it does.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
import torch

from memento.config import OnlineLabelsConfig
from memento.errors import ConfigError
from memento.learn.labels import read_labels
from memento.planners.base import CallablePlanner
from memento.policies import SoftQConfig, loop_policy, make_policy
from memento.runs.qa import LoopConfig, OnlineLoop
from memento.types import Case, Task
from tests.loop_env import ExactJudge, HashingEncoder

ENTITIES = ["zorvia minor east", "quenlo tarrak vey", "mirth ondale sar", "pellow ruska dane", "varnen oskel tiv",
            "halbrecht umo faye", "krestin dolver an", "sabrel pintov uru", "tomask eilen brae", "ulvar nesso kip",
            "dravik sollen pa", "yemmet carro ilt"]
ATTRIBUTES = {"capital": "What is the capital of {}?", "currency": "What is the currency of {}?",
              "language": "What is the language of {}?", "animal": "What is the national animal of {}?"}
NAMES = list(ATTRIBUTES)


def _answer(attribute: str, entity: str) -> str:
    return f"{attribute}-{entity.split()[0]}"


def _question_attribute(question: str) -> str:
    return next(a for a, template in ATTRIBUTES.items() if question.startswith(template.split("{}")[0]))


def _world() -> tuple[list[Case], list[Task]]:
    seeds, tasks = [], []
    for i, entity in enumerate(ENTITIES):
        held = {NAMES[i % 4], NAMES[(i + 1) % 4]}  # two attributes per entity in the bank
        for attribute in NAMES:
            question = ATTRIBUTES[attribute].format(entity)
            if attribute in held:
                seeds.append(Case(state=question, action=_answer(attribute, entity), reward=1.0))
            else:
                tasks.append(Task(id=f"{attribute}-{i}", question=question, answers=(_answer(attribute, entity),)))
    return seeds, tasks


def _plan(task: Task, cases: Sequence[Case]) -> str:
    attribute = _question_attribute(task.question)
    if any(_question_attribute(c.state) == attribute for c in cases):
        return task.answers[0]
    return cases[0].action if cases else "unknown"  # copies the misleading neighbour's content


def _score(task: Task, cases: Sequence[Case], answer: str) -> float:
    attribute = _question_attribute(task.question)
    return -0.2 if any(_question_attribute(c.state) == attribute for c in cases) else -2.0


SEEDS, TASKS = _world()


def _labels_policy(m: int = 8, rank: int = 8, target: str = "gold") -> SoftQConfig:
    base = loop_policy("soft_q")
    assert isinstance(base, SoftQConfig)
    return dataclasses.replace(base, qnet=dataclasses.replace(base.qnet, relation_rank=rank),
                               labels=OnlineLabelsConfig(m=m, target=target))  # type: ignore[arg-type]


def _run(tmp_path, name: str, policy: SoftQConfig, *, steps: int = 240, planner=None, **extra) -> OnlineLoop:
    torch.set_num_threads(1)
    config = LoopConfig(steps=steps, k=1, candidates=8, retain=False, tensorboard=False, policy=policy,
                        **{"checkpoint_every": 0, **extra})
    loop = OnlineLoop(config, make_policy=make_policy, encoder=HashingEncoder(dim=256), judge=ExactJudge(),
                      planner=planner or CallablePlanner(_plan, score_fn=_score), tasks=TASKS, seed_cases=SEEDS,
                      out_dir=tmp_path / name)
    loop.run()
    return loop


def test_the_world_misleads_similarity() -> None:
    encoder = HashingEncoder(dim=256)
    state_TD = encoder.encode([t.question for t in TASKS])
    case_ND = encoder.encode([c.state for c in SEEDS])
    nearest_T = (state_TD @ case_ND.T).argmax(axis=1)
    same_entity = [SEEDS[j].state.split(" of ")[-1] == t.question.split(" of ")[-1] for t, j in zip(TASKS, nearest_T)]
    assert np.mean(same_entity) >= 0.75  # cosine's top case is the same entity (another attribute)
    assert not any(_plan(t, [SEEDS[j]]) == t.answers[0] for t, j in zip(TASKS, nearest_T))


def test_online_labels_find_the_same_attribute_cases_the_default_does_not(tmp_path) -> None:
    default = _run(tmp_path, "default", loop_policy("soft_q"))  # type: ignore[arg-type]
    labelled = _run(tmp_path, "labels", _labels_policy())
    late_default = float(np.mean(default.successes[-80:]))
    late_labels = float(np.mean(labelled.successes[-80:]))
    assert late_labels >= 0.8, (late_labels, late_default)
    assert late_labels >= late_default + 0.4, (late_labels, late_default)
    summary = json.loads(labelled.run_dir.summary_path.read_text(encoding="utf-8"))
    assert summary["labels"]["labelled"] == 240 and summary["labels"]["gold"] == 240
    assert summary["labels"]["forward_passes"] == 240 * 8
    rows = read_labels(labelled.run_dir.labels)  # memento score's format: trainable offline
    assert len(rows) == 240 and all(len(r.candidate_ids) == 8 for r in rows)
    assert rows[0].answer == TASKS[[t.id for t in TASKS].index(rows[0].task_id)].answers[0]


def test_hindsight_targets_label_only_rewarded_steps(tmp_path) -> None:
    loop = _run(tmp_path, "hindsight", _labels_policy(target="hindsight"), steps=60)
    summary = json.loads(loop.run_dir.summary_path.read_text(encoding="utf-8"))
    assert summary["labels"]["gold"] == 0
    assert summary["labels"]["hindsight"] == sum(loop.successes) > 0
    rows = read_labels(loop.run_dir.labels)
    steps = [json.loads(line) for line in loop.run_dir.steps.read_text(encoding="utf-8").splitlines()]
    rewarded = [(s["task_id"], s["output"]) for s in steps if s["success"]]
    assert [(r.task_id, r.answer) for r in rows] == rewarded  # the planner's own rewarded output, in order


def test_labels_every_nth_step(tmp_path) -> None:
    policy = dataclasses.replace(_labels_policy(), labels=OnlineLabelsConfig(m=4, every=3))
    loop = _run(tmp_path, "every", policy, steps=30)
    assert loop.counters["labelled"] == 10 and loop.counters["label_passes"] == 40


def test_resume_with_labels_equals_an_uninterrupted_run(tmp_path) -> None:
    full = _run(tmp_path, "full", _labels_policy(), steps=60, checkpoint_every=20)
    _run(tmp_path, "cut", _labels_policy(), steps=40, checkpoint_every=20)
    config = LoopConfig(steps=60, k=1, candidates=8, retain=False, tensorboard=False, policy=_labels_policy(),
                        checkpoint_every=20)
    resumed = OnlineLoop(config, make_policy=make_policy, encoder=HashingEncoder(dim=256), judge=ExactJudge(),
                         planner=CallablePlanner(_plan, score_fn=_score), tasks=TASKS, seed_cases=SEEDS,
                         out_dir=tmp_path / "cut", resume=True)
    resumed.run()
    assert resumed.successes == full.successes
    assert resumed.run_dir.labels.read_bytes() == full.run_dir.labels.read_bytes()
    for a, b in zip(full.policy.qnet.state_dict().values(), resumed.policy.qnet.state_dict().values()):
        assert torch.equal(a, b)


def test_labels_are_off_with_one_line_when_the_planner_cannot_score(tmp_path, caplog) -> None:
    config = LoopConfig(steps=2, k=1, candidates=8, tensorboard=False, policy=_labels_policy())
    loop = OnlineLoop(config, make_policy=make_policy, encoder=HashingEncoder(dim=256), judge=ExactJudge(),
                      planner=CallablePlanner(_plan), tasks=TASKS, seed_cases=SEEDS, out_dir=tmp_path / "x")
    warnings = [r.getMessage() for r in caplog.records if "online labels off" in r.getMessage()]
    assert len(warnings) == 1 and "\n" not in warnings[0] and "log-probabilities" in warnings[0]
    loop.run()
    assert loop.config.policy.labels.m == 0  # type: ignore[union-attr]
    assert not loop.run_dir.labels.exists() or not loop.run_dir.labels.read_text(encoding="utf-8")


def test_labels_config_bounds() -> None:
    with pytest.raises(ConfigError, match="m"):
        OnlineLabelsConfig(m=-1)
    with pytest.raises(ConfigError, match="target"):
        OnlineLabelsConfig(target="oracle")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="every"):
        OnlineLabelsConfig(every=0)
    assert not OnlineLabelsConfig().active and not OnlineLabelsConfig(m=1).active and OnlineLabelsConfig(m=2).active


def test_game_loop_refuses_labels() -> None:
    from memento.runs.games import GameLoopConfig

    with pytest.raises(ConfigError, match="labels"):
        GameLoopConfig(policy=_labels_policy())


def _cli_files(tmp_path) -> tuple[Path, Path]:
    """Four of the world's tasks and six of its cases as the CLI's task and case files."""
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"id": t.id, "question": t.question, "answers": list(t.answers)}) + "\n"
                             for t in TASKS[:4]), encoding="utf-8")
    cases = tmp_path / "cases.jsonl"
    cases.write_text("".join(json.dumps({"id": f"c{i}", "state": c.state, "action": c.action, "reward": c.reward})
                             + "\n" for i, c in enumerate(SEEDS[:6])), encoding="utf-8")
    return tasks, cases


def test_cli_labels_with_a_server_without_logprobs_is_one_line_and_writes_nothing(tmp_path, capsys) -> None:
    from memento.cli.entry import main
    from tests.unit.test_openai_compat import FakeServer

    tasks, cases = _cli_files(tmp_path)
    server = FakeServer()  # answers every POST with a chat reply: no prompt logprobs
    try:
        code = main(["online", "--tasks", str(tasks), "--cases", str(cases), "--planner",
                     f"openai:m@{server.base_url}", "--policy", "soft_q", "--labels", "4", "--steps", "2",
                     "--out", str(tmp_path / "out"), "--no-progress"])
    finally:
        server.close()
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "--labels needs a planner" in err, err
    assert not (tmp_path / "out").exists()


def test_cli_default_labels_are_off_with_one_line_when_the_server_gives_no_logprobs(tmp_path, capsys) -> None:
    from memento.cli.entry import main
    from tests.unit.test_openai_compat import FakeServer

    tasks, cases = _cli_files(tmp_path)
    server = FakeServer()  # answers every POST with a chat reply: no prompt logprobs
    try:
        code = main(["online", "--tasks", str(tasks), "--cases", str(cases), "--planner",
                     f"openai:m@{server.base_url}", "--policy", "soft_q", "--steps", "2", "--no-tensorboard",
                     "--out", str(tmp_path / "out"), "--no-progress"])
    finally:
        server.close()
    out = capsys.readouterr().out
    assert code == 0, out
    said = [line for line in out.splitlines() if line.startswith("online labels")]
    assert len(said) == 1 and said[0].startswith("online labels off: "), out
    config = json.loads((tmp_path / "out" / "soft_q" / "config.json").read_text(encoding="utf-8"))
    assert config["policy"]["labels"]["m"] == 0 and config["policy"]["evidence"]["weight"] > 0


def test_a_runs_online_labels_train_a_selector_offline(tmp_path) -> None:
    pytest.importorskip("lightning")
    from memento.training.data import load_labels

    loop = _run(tmp_path, "run", _labels_policy(), steps=24)
    data = load_labels(loop.run_dir.labels, loop.run_dir.bank, HashingEncoder(dim=256), features="case")
    assert data.listwise and data.n_rows == 24  # the run's own bank resolves every candidate id
