"""The online loop, the served selector and a read-only worker unchanged on a compressed bank: IVF-PQ codes in the
index, the float32 vectors on disk (``vectors="disk"``), re-ranked exactly (``refine``): select, feedback, add,
save and resume."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from memento.bank import CaseBank
from memento.config import IndexConfig, QNetConfig
from memento.errors import BankError
from memento.planners.base import CallablePlanner, PlannerError
from memento.policies import make_policy
from memento.runs.qa import LoopConfig, run_online
from memento.types import Case
from tests.loop_env import ExactJudge, HashingEncoder, make_env

INDEX = IndexConfig(factory="IVF4,PQ8x4", nprobe=4, refine=4)  # 4-bit codes: trained on >= 39 x 16 = 624 vectors
FILLERS = 620  # with the 28 seed cases, past 39 x 16 codes: the PQ trains on enough points


class Crash(PlannerError):
    pass


def compressed_seed_bank(path: Path) -> Path:
    """The text env's seed cases and FILLERS unrelated ones (so the IVF-PQ index trains), vectors on disk."""
    env, encoder = make_env(), HashingEncoder()
    fillers = [Case(state=f"unrelated filler note number {i} zz{i}", action=f"filler {i}", reward=0.0)
               for i in range(FILLERS)]
    cases = [*env.seed_cases, *fillers]
    with CaseBank.create(path, encoder.dim, index=INDEX, encoder=None, vectors="disk") as bank:
        bank.add(cases, encoder.encode([c.state for c in cases]))
        assert bank.stats()["index_trained"]
    return path


def _run(out: Path, seed_bank: Path, *, planner=None, resume: bool = False) -> dict:
    env = make_env()
    config = LoopConfig(steps=30, checkpoint_every=10, tensorboard=False, k=2, candidates=6)
    return run_online(config, make_policy=make_policy, encoder=HashingEncoder(), planner=planner or env.planner(),
                      judge=ExactJudge(), tasks=env.tasks, bank_dir=seed_bank, out_dir=out, resume=resume)


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]


def test_online_loop_on_a_compressed_bank_resumes_as_an_uninterrupted_run(tmp_path: Path) -> None:
    seed = compressed_seed_bank(tmp_path / "seed")
    reference = _run(tmp_path / "ref", seed)
    inner, calls = make_env().planner(), {"n": 0}

    def crashing(task, cases):
        calls["n"] += 1
        if calls["n"] > 16:
            raise Crash("simulated crash")
        return inner.plan(task, cases).text

    with pytest.raises(Crash):
        _run(tmp_path / "run", seed, planner=CallablePlanner(crashing, name="crashing"))
    resumed = _run(tmp_path / "run", seed, resume=True)
    assert resumed["resumed_from"] == 10
    ref, run = _records(tmp_path / "ref"), _records(tmp_path / "run")
    assert [r["chosen_ids"] for r in ref] == [r["chosen_ids"] for r in run]
    assert [r["reward"] for r in ref] == [r["reward"] for r in run]
    assert resumed["bank_size_end"] == reference["bank_size_end"] > FILLERS
    with CaseBank.open(tmp_path / "run" / "bank") as bank:
        assert bank.config.vectors == "disk" and bank.config.index == INDEX and bank.stats()["index_trained"]
        assert (tmp_path / "run" / "bank" / "vectors.f32").stat().st_size == len(bank) * 4 * bank.dim


def test_served_selector_and_a_worker_on_a_compressed_bank(tmp_path: Path) -> None:
    from memento.selector.export import create_selector
    from memento.selector.runtime import Selector

    seed = compressed_seed_bank(tmp_path / "bank")
    path = create_selector(seed, tmp_path / "selector", k=3, warmup=1, qnet=QNetConfig(dim=64, hidden=32))
    assert (path / "bank" / "vectors.f32").is_file()
    encoder = HashingEncoder()
    learner = Selector.load(path, learn=True, seed=0, shared=True, encoder=encoder)
    learner.publish_policy()
    reader = Selector.load(path, learn=False, seed=1, verify=False, read_only=True, encoder=encoder)
    try:
        for _ in range(3):
            result = reader.select(encoder.encode(["what is the capital of france"])[0], k=3)
            assert len(result.ids) == 3
            learner.feedback(result.selection_id, 1.0)
        assert learner.policy_version == 3
        vector = encoder.encode(["a brand new case about compressed banks"])[0]
        case_id = learner.add_case("a brand new case about compressed banks", "its action", 1.0, embedding=vector)
        learner.publish_policy()
        assert reader.sync()["cases"] == 1
        assert reader.bank.search(vector, 1)[1].tolist() == [case_id]
        np.testing.assert_array_equal(reader.bank.embeddings([case_id])[0], vector)
        weights = [p.detach().clone() for p in learner.learner.qnet.parameters()]
        learner.save()
    finally:
        reader.close()
        learner.close()
    again = Selector.load(path, learn=True, seed=0, encoder=encoder)  # resume: the saved cases and weights
    try:
        assert again.get_case(case_id).state == "a brand new case about compressed banks"
        assert all(torch.equal(a, b) for a, b in zip(weights, again.learner.qnet.parameters()))
        assert again.search_cases(vector, k=1)[0][0].id == case_id
        assert len(again.select(vector, k=3).ids) == 3
        assert again.bank.config.vectors == "disk"
    finally:
        again.close()
    copy = Path(shutil.copytree(path, tmp_path / "copy"))
    with CaseBank.open(copy / "bank") as bank:  # the copy's vectors.f32 is the store, checked on open
        np.testing.assert_array_equal(bank.embeddings([case_id])[0], vector)
    (copy / "bank" / "vectors.f32").unlink()  # the vectors' only copy: an open names what is lost
    with pytest.raises(BankError, match=r"vectors.f32: missing; it holds the vectors of this bank's \d+ case"):
        CaseBank.open(copy / "bank")
