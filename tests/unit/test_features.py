"""Case features (memento.learn.features): the bank's usage log and action vectors, the Q-network that sees them, the
soft-Q agent and the online loop with them (exact resume), and a known-answer test: two cases with the same
question but different answers are indistinguishable to a Q-network without features and learnable with them."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from memento.bank import CaseBank
from memento.config import CASE_KINDS, CASE_SCALARS, LearnerConfig, QNetConfig
from memento.errors import ConfigError, DimensionError
from memento.learn.features import CaseFeaturizer, case_scalars
from memento.learn.policy import Observation, PolicyContext
from memento.learn.qnet import build_qnet
from memento.policies import SoftQAgent, SoftQConfig, make_policy
from memento.runs.qa import LoopConfig, run_online
from memento.types import Case
from tests.conftest import unit_vectors
from tests.loop_env import ExactJudge, HashingEncoder, make_env

pytestmark = pytest.mark.usefixtures("one_torch_thread")

D = 8


class CountingEncoder:
    """Deterministic unit vectors from a text hash; counts the texts it encodes."""

    def __init__(self, dim: int = D):
        self.dim = dim
        self.calls: list[str] = []

    def __call__(self, texts: list[str]) -> np.ndarray:
        self.calls += list(texts)
        seeds = [int(hashlib.sha256(t.encode()).hexdigest()[:8], 16) for t in texts]
        out = np.stack([np.random.default_rng(seed).normal(size=self.dim) for seed in seeds])
        return (out / np.linalg.norm(out, axis=1, keepdims=True)).astype(np.float32)


def _bank(tmp_path: Path, n: int = 6) -> CaseBank:
    bank = CaseBank.create(tmp_path / "bank", D)
    rng = np.random.default_rng(0)
    cases = [Case(state=f"question {i}", action=f"answer {i}", reward=float(i % 2), kind="case" if i < 5 else "tip")
             for i in range(n)]
    bank.add(cases, unit_vectors(rng, n, D))
    return bank


def _tables(path: Path) -> set[str]:
    with sqlite3.connect(path / "cases.sqlite") as conn:
        return {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}


# ---------------------------------------------------------------- the bank's usage log and action vectors


def test_usage_log_aggregates_truncates_and_survives_reopening(tmp_path):
    bank = _bank(tmp_path)
    ids = bank.ids_at(range(len(bank)))
    assert "usage" not in _tables(bank.path)  # a bank that never uses features is left as it was
    assert [a.tolist() for a in bank.usage_at([0, 1])] == [[0, 0], [0.0, 0.0]]
    bank.record_usage(0, [ids[0], ids[1]], 1.0)
    bank.record_usage(1, [ids[0]], 0.0)
    bank.record_usage(2, [ids[0], ids[2]], 1.0)
    shown, total = bank.usage_at([0, 1, 2, 3])
    assert shown.tolist() == [3, 1, 1, 0] and total.tolist() == [2.0, 1.0, 1.0, 0.0]
    bank.close()
    with CaseBank.open(tmp_path / "bank") as bank:
        assert bank.usage_at([0])[0].tolist() == [3]
        assert bank.truncate_usage(1) == 3  # steps 1 and 2: a resume to a checkpoint at step 1
        assert bank.usage_at([0, 1, 2])[0].tolist() == [1, 1, 0]
        bank.add([Case(state="new", action="new answer", reward=1.0)], unit_vectors(np.random.default_rng(1), 1, D))
        assert bank.usage_at([len(bank) - 1])[0].tolist() == [0]  # a case added since: never shown
        bank.record_usage(3, [bank.ids_at([len(bank) - 1])[0]], 1.0)
        bank.truncate(len(bank) - 1)  # dropping a case drops its usage rows
        assert bank.usage_at([0])[0].tolist() == [1]
    with pytest.raises(Exception, match="step must be an integer >= 0"):
        with CaseBank.open(tmp_path / "bank") as bank:
            bank.record_usage(-1, [ids[0]], 1.0)
    with pytest.raises(Exception, match=r"reward must be a number in \[0, 1\]"):
        with CaseBank.open(tmp_path / "bank") as bank:
            bank.record_usage(0, [ids[0]], float("nan"))


def test_action_vectors_are_encoded_once_and_stored(tmp_path):
    bank = _bank(tmp_path)
    encode = CountingEncoder()
    featurizer = CaseFeaturizer(bank, encode)
    candidates = bank.candidates(bank.embeddings_at([0])[0], 4)
    first = featurizer.case_vectors(candidates)
    assert first.shape == (4, 2 * D + CASE_SCALARS) == (4, featurizer.case_dim)
    assert np.array_equal(first[:, :D], candidates.embeddings_CD)
    assert np.allclose(first[:, D:2 * D], encode([bank.get(i).action for i in candidates.ids]))
    encode.calls.clear()
    again = CaseFeaturizer(bank, encode).case_vectors(candidates)  # from the bank now
    assert encode.calls == [] and np.array_equal(first, again)
    memory = CaseFeaturizer(bank, CountingEncoder(), store=False)  # a served selector: nothing written
    other = bank.candidates(bank.embeddings_at([5])[0], 6)
    before = bank.action_embeddings_at(other.positions_C)[1].sum()
    memory.case_vectors(other)
    assert bank.action_embeddings_at(other.positions_C)[1].sum() == before
    bank.close()


def test_case_scalars_known_values():
    out = case_scalars(np.array([1.0, 0.0]), np.array([0, 3]), np.array([0.0, 2.0]), ["case", "unheard-of"])
    assert out.shape == (2, CASE_SCALARS)
    assert out[0, :3].tolist() == [1.0, 0.0, 0.0]  # reward, Beta(1,1) mean - 0.5 with no shows, log(1 + 0)
    assert out[1, :3] == pytest.approx([0.0, 3 / 5 - 0.5, np.log(4.0)])
    assert out[0, 3 + CASE_KINDS.index("case")] == 1.0 and out[0, 3:].sum() == 1.0
    assert out[1, -1] == 1.0 and out[1, 3:].sum() == 1.0  # "other"


# ---------------------------------------------------------------- the Q-network


def test_qnet_with_features_checks_shapes_and_anchors_on_cosine():
    config = QNetConfig(dim=D, hidden=16, anchor="cosine", features="case")
    assert config.case_dim == 2 * D + CASE_SCALARS
    net = build_qnet(config, torch.Generator().manual_seed(0))
    rng = np.random.default_rng(0)
    state_BD = torch.from_numpy(unit_vectors(rng, 3, D))
    cases_BCE = torch.randn(3, 5, config.case_dim)
    cases_BCE[..., :D] = torch.nn.functional.normalize(cases_BCE[..., :D], dim=-1)
    q_BC = net(state_BD, cases_BCE)
    cos_BC = torch.nn.functional.cosine_similarity(cases_BCE[..., :D], state_BD.unsqueeze(1), dim=-1)
    assert torch.equal(q_BC.argsort(dim=1), cos_BC.argsort(dim=1))  # a fresh network ranks like similarity
    shifted = cases_BCE.clone()
    shifted[..., 2 * D + 1:2 * D + 3] = torch.rand(3, 5, 2) * 4  # usage statistics: no effect before learning
    assert torch.equal(net(state_BD, shifted), q_BC)
    with pytest.raises(DimensionError, match=r"features='case'.*\(B, C, 27\).*cases_BCD.shape=\(3, 5, 8\)"):
        net(state_BD, cases_BCE[..., :D])
    with pytest.raises(ConfigError, match="features"):
        QNetConfig(dim=D, arch="two_tower", features="case")


def _agent(featurizer, *, features: str = "case", seed: int = 0) -> SoftQAgent:
    qnet = QNetConfig(hidden=32, dropout=0.0, features=features)  # type: ignore[arg-type]
    config = SoftQConfig(qnet=qnet, learner=LearnerConfig(batch_size=8, lr=3e-3), warmup=1, alpha=0.5)
    return SoftQAgent.create(config, PolicyContext(dim=D, k_max=1, qnet_seed=seed, learner_seed=seed,
                                                   featurizer=featurizer))


def test_known_answer_same_question_different_answers(tmp_path):
    """Cases A and B have the same question (the same embedding) and different answers; showing A earns 1,
    showing B earns 0. Without features Q(A) == Q(B) always; with features the agent learns Q(A) > Q(B)."""
    bank = CaseBank.create(tmp_path / "bank", D)
    vector = unit_vectors(np.random.default_rng(0), 1, D)
    ids = bank.add([Case(state="What is the capital of Peru?", action="Lima", reward=1.0),
                    Case(state="What is the capital of Peru?", action='{"answer": "Lima"}', reward=1.0)],
                   np.repeat(vector, 2, axis=0), allow_duplicates=True)
    featurizer = CaseFeaturizer(bank, CountingEncoder())
    state_D = unit_vectors(np.random.default_rng(1), 1, D)[0]
    candidates = bank.candidates(state_D, 2)
    rng = np.random.default_rng(0)
    for features in ("none", "case"):
        agent = _agent(featurizer if features == "case" else None, features=features)
        for step in range(60):
            selection = agent.select(state_D, candidates, 1, rng=rng)
            reward = 1.0 if selection.ids[0] == ids[0] else 0.0
            agent.observe([Observation(state_D=state_D, candidates=candidates, selection=selection, reward=reward,
                                       step=step, policy_version=agent.version)])
        q = dict(zip(candidates.ids, agent.q_values(state_D, candidates)))
        if features == "none":
            assert q[ids[0]] == q[ids[1]]
        else:
            assert q[ids[0]] > q[ids[1]] + 1.0
            assert agent.buffer.config.case_width == 2 * D + CASE_SCALARS
    bank.close()


def test_agent_with_features_needs_a_featurizer():
    with pytest.raises(ConfigError, match="featurizer"):
        _agent(None)


# ---------------------------------------------------------------- the online loop


def _run(out: Path, *, resume: bool = False, planner=None, steps: int = 40) -> dict:
    env = make_env()
    policy = SoftQConfig(qnet=QNetConfig(hidden=32, anchor="cosine", features="case"), warmup=4, positive_only=True)
    config = LoopConfig(policy=policy, steps=steps, checkpoint_every=10, tensorboard=False)
    return run_online(config, make_policy=make_policy, encoder=HashingEncoder(), planner=planner or env.planner(),
                      judge=ExactJudge(), tasks=env.tasks, seed_cases=env.seed_cases, out_dir=out, resume=resume)


def _usage(path: Path) -> list[tuple]:
    with sqlite3.connect(path / "bank" / "cases.sqlite") as conn:
        return conn.execute("SELECT step, pos, reward FROM usage ORDER BY step, pos").fetchall()


def test_loop_with_features_logs_usage_and_resumes_exactly(tmp_path):
    from tests.unit.test_loop import Crash, _crashing_planner

    reference = _run(tmp_path / "ref")
    usage = _usage(tmp_path / "ref")
    records = [json.loads(line) for line in (tmp_path / "ref" / "steps.jsonl").read_text().splitlines()]
    assert len(usage) == sum(len(r["chosen_ids"]) for r in records)  # every shown case, every step
    with pytest.raises(Crash):
        _run(tmp_path / "run", planner=_crashing_planner(26))
    resumed = _run(tmp_path / "run", resume=True)
    assert resumed["resumed_from"] == 20
    assert _usage(tmp_path / "run") == usage
    again = [json.loads(line) for line in (tmp_path / "run" / "steps.jsonl").read_text().splitlines()]
    assert [r["chosen_ids"] for r in again] == [r["chosen_ids"] for r in records]
    a = load_file(str(tmp_path / "ref" / "selector" / "learner.safetensors"))
    b = load_file(str(tmp_path / "run" / "selector" / "learner.safetensors"))
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert resumed["cumulative_reward"] == reference["cumulative_reward"]


def test_exported_selector_with_features_counts_usage_from_its_feedback_log(tmp_path):
    from memento.selector.export import export_selector, load_selector, verify

    _run(tmp_path / "run", steps=20)
    artifact = export_selector(tmp_path / "run", tmp_path / "artifact")
    verify(artifact)
    encoder = HashingEncoder()
    task = make_env().tasks[0]
    with load_selector(artifact, learn=True, encoder=encoder) as selector:
        assert selector._agent.featurizer is not None
        result = selector.select(task.question, k=2)
        positions = selector._bank.positions_of(list(result.ids))
        before = selector._usage_at(positions)[0].copy()
        selector.feedback(result.selection_id, reward=1.0)
        assert (selector._usage_at(positions)[0] == before + 1).all()
    verify(artifact)  # the checksummed bank file was not written by the features
    with load_selector(artifact, encoder=encoder) as selector:  # usage of saved + unsaved feedbacks, counted once
        assert (selector._usage_at(positions)[0] == before + 1).all()


def test_create_selector_over_a_bank_with_a_features_qnet(tmp_path):
    from memento.selector.export import create_selector, load_selector

    bank = _bank(tmp_path)
    bank.close()
    qnet = QNetConfig(dim=D, hidden=16, anchor="cosine", features="case")
    artifact = create_selector(tmp_path / "bank", tmp_path / "artifact", qnet=qnet, warmup=1)
    encoder = CountingEncoder()
    encoder.encode = encoder.__call__  # type: ignore[attr-defined]
    with load_selector(artifact, learn=True, encoder=encoder) as selector:
        assert selector._agent.buffer.config.case_width == 2 * D + CASE_SCALARS
        with CaseBank.open(tmp_path / "bank") as original:
            state = original.embeddings_at([2])[0]
        result = selector.select(state, k=2, mode="greedy")
        assert result.ids[0] == selector._bank.ids_at([2])[0]  # a fresh anchored selector ranks like similarity
        selector.feedback(result.selection_id, reward=1.0)
