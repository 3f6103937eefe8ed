"""Forgetting and batch selects: CaseBank.delete / replace (tombstones), Selector.delete_case / replace_case
(replay slots masked, a save in place), select_many, over small banks with the hashing encoder."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

import memento
from memento.bank import CaseBank
from memento.errors import DataFormatError, UnknownCaseError
from memento.selector.export import load_selector, verify
from memento.selector.runtime import Selector
from memento.types import Case
from tests.loop_env import HashingEncoder, make_env

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _bank(path: Path, index: str = "Flat") -> tuple[CaseBank, list[Case], HashingEncoder]:
    env, encoder = make_env(), HashingEncoder()
    cases = [dataclasses.replace(c, reward=1.0) for c in env.seed_cases]
    bank = CaseBank.create(path, encoder.dim, index=index)
    bank.add(cases, encoder.encode([c.state for c in cases]))
    return bank, cases, encoder


@pytest.fixture()
def artifact(tmp_path: Path) -> tuple[Path, HashingEncoder]:
    bank, _, encoder = _bank(tmp_path / "bank", "HNSW32,Flat")
    bank.close()
    out = memento.selector.export.create_selector(tmp_path / "bank", tmp_path / "selector", k=2, warmup=1)
    return out, encoder


@pytest.mark.parametrize("index", ["Flat", "HNSW32,Flat"])
def test_bank_delete_hides_a_case_from_every_search(tmp_path: Path, index: str) -> None:
    bank, cases, encoder = _bank(tmp_path / "bank", index)
    gone = cases[0].id or bank.search(encoder.encode(cases[0].state), 1)[1][0]
    query = encoder.encode(cases[0].state)
    assert bank.search(query, 1)[1][0] == gone
    n = len(bank)
    assert bank.delete([gone]) == 1
    assert len(bank) == n and bank.num_deleted == 1 and bank.deleted_ids() == [gone]  # positions stay dense
    assert gone not in bank.search(query, n)[1].tolist()
    assert gone not in bank.candidates(query, n).ids and len(bank.candidates(query, n)) == n - 1
    assert gone not in bank.search(query[None, :], n)[1][0].tolist()
    assert gone not in [c.id for c in bank.iter_cases()] and bank.stats()["deleted"] == 1
    assert bank.is_deleted([gone]) == [True]
    with pytest.raises(UnknownCaseError, match="already deleted"):
        bank.delete([gone])
    with pytest.raises(UnknownCaseError):
        bank.delete(["no-such-case"])
    bank.close()
    with CaseBank.open(tmp_path / "bank") as again:  # the tombstone is on disk
        assert gone not in again.search(query, n)[1].tolist() and again.num_deleted == 1
        # re-adding the same content gives a new id, never the deleted one
        new_id = again.add([dataclasses.replace(cases[0], id=None)], query[None, :])[0]
        assert new_id != gone and again.search(query, 1)[1][0] == new_id


def test_bank_replace_makes_the_new_text_findable_and_the_old_not(tmp_path: Path) -> None:
    bank, cases, encoder = _bank(tmp_path / "bank")
    old = bank.search(encoder.encode(cases[3].state), 1)[1][0]
    new_case = Case(state="which colour is a ripe banana", action="yellow", reward=1.0)
    new_id = bank.replace(old, new_case, encoder.encode(new_case.state))
    assert new_id != old and bank.get(new_id).action == "yellow"
    assert bank.search(encoder.encode(new_case.state), 1)[1][0] == new_id
    assert old not in bank.search(encoder.encode(cases[3].state), len(bank))[1].tolist()
    row = bank._rows.conn.execute("SELECT replaced_by FROM deleted WHERE id = ?", (old,)).fetchone()
    assert row == (new_id,)
    with pytest.raises(DataFormatError):
        bank.replace(new_id, new_case, np.zeros(encoder.dim, dtype=np.float32))  # not unit norm: nothing written
    assert bank.num_deleted == 1
    bank.close()


def test_bank_delete_clears_usage_and_truncate_drops_tombstones(tmp_path: Path) -> None:
    bank, _, encoder = _bank(tmp_path / "bank")
    ids = bank.ids_at([0, 1])
    bank.record_usage(0, ids, 1.0)
    bank.delete([ids[0]])
    shown, reward = bank.usage_at([0, 1])
    assert shown.tolist() == [0, 1] and reward.tolist() == [0.0, 1.0]
    bank.truncate(1)
    assert bank.num_deleted == 1  # position 0 is below the cut
    bank.truncate(0)
    assert bank.num_deleted == 0
    bank.close()


def test_a_deleted_case_is_never_selected_again_also_after_a_restart(artifact: tuple[Path, HashingEncoder]) -> None:
    out, encoder = artifact
    env = make_env()
    query = env.tasks[0].question
    with load_selector(out, learn=True, encoder=encoder) as selector:
        for _ in range(3):  # some replay rows that hold the case
            result = selector.select(query, k=2, mode="greedy")
            selector.feedback(result.selection_id, 1.0)
        gone = result.ids[0]
        report = selector.delete_case(gone)
        assert report["deleted"] and report["replay_slots_masked"] >= 3
        chosen = {i for _ in range(60) for i in selector.select(query, k=2).ids}  # sampled
        assert gone not in chosen and chosen
        with pytest.raises(UnknownCaseError):
            selector.delete_case(gone)
        # a feedback for a selection made after the deletion learns without the case
        selector.feedback(selector.select(query, k=2).selection_id, 0.0)
    assert verify(out)["manifest"]["saves"] >= 2  # the deletion was checkpointed: verify passes
    with load_selector(out, encoder=encoder) as again:  # restart without a save after the last feedback
        assert again.bank.num_deleted == 1
        assert not any(gone in again.select(query, k=2).ids for _ in range(60))
        assert not any(gone in r.ids for r in again.select_many([query] * 5, k=2))


def test_replace_case_through_the_selector(artifact: tuple[Path, HashingEncoder]) -> None:
    out, encoder = artifact
    with load_selector(out, encoder=encoder) as selector:
        old = selector.select("the capital of nowhere", k=1, mode="greedy").ids[0]
        new_id = selector.replace_case(old, "the capital of nowhere land", "Utopia", 1.0)
        picks = {i for _ in range(40) for i in selector.select("the capital of nowhere land", k=2).ids}
        assert new_id in picks and old not in picks
    verify(out)
    with load_selector(out, encoder=encoder) as again:
        assert again.select("the capital of nowhere land", k=1, mode="greedy").ids[0] == new_id


def test_select_many_equals_select_one_by_one_in_greedy_mode(artifact: tuple[Path, HashingEncoder]) -> None:
    out, encoder = artifact
    calls: list[int] = []

    class Counting(HashingEncoder):
        def encode(self, texts, **kw):  # type: ignore[no-untyped-def, override]
            calls.append(1 if isinstance(texts, str) else len(texts))
            return super().encode(texts, **kw)

    counting = Counting(encoder.dim)
    env = make_env()
    queries = [t.question for t in env.tasks[:6]]
    with load_selector(out, encoder=counting) as selector:
        many = selector.select_many(queries, k=3, mode="greedy")
        assert calls == [6]  # one batched encode
        one = [selector.select(q, k=3, mode="greedy") for q in queries]
        assert [r.ids for r in many] == [r.ids for r in one]
        assert len({r.selection_id for r in many}) == 6
        selector.feedback(many[2].selection_id, 1.0)  # each id is a pending selection
        vectors = np.stack([encoder.encode(q) for q in queries])
        assert [r.ids for r in selector.select_many(vectors, k=3, mode="greedy")] == [r.ids for r in one]
        assert selector.select_many([], k=2) == []
        with pytest.raises(DataFormatError):
            selector.select_many("one text", k=2)
        with pytest.raises(DataFormatError):
            selector.select_many([queries[0], vectors[0]], k=2)
    assert isinstance(selector, Selector)


def test_http_delete_and_replace_a_case(artifact: tuple[Path, HashingEncoder]) -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from memento.serve.app import create_app

    out, encoder = artifact
    query = make_env().tasks[0].question
    headers = {"Authorization": "Bearer t0k"}
    with load_selector(out, learn=True, encoder=encoder) as selector:
        with TestClient(create_app(selector, token="t0k")) as client:
            first = client.post("/v1/select", json={"query": query, "k": 2, "mode": "greedy"}, headers=headers)
            gone = first.json()["cases"][0]["id"]
            assert client.delete(f"/v1/cases/{gone}").status_code == 401
            answer = client.delete(f"/v1/cases/{gone}", headers=headers)
            assert answer.status_code == 200 and answer.json()["deleted"] is True
            assert client.delete(f"/v1/cases/{gone}", headers=headers).status_code == 404
            for _ in range(30):
                body = client.post("/v1/select", json={"query": query, "k": 2}, headers=headers).json()
                assert gone not in [c["id"] for c in body["cases"]]
            old = body["cases"][0]["id"]
            put = client.put(f"/v1/cases/{old}", json={"state": "the tallest tree on the moon", "action": "none",
                                                       "reward": 1.0}, headers=headers)
            assert put.status_code == 200 and put.json()["replaced"] == old
            picks = {c["id"] for _ in range(30) for c in client.post(
                "/v1/select", json={"query": "the tallest tree on the moon", "k": 2}, headers=headers).json()["cases"]}
            assert put.json()["id"] in picks and old not in picks
    verify(out)
    with load_selector(out, encoder=encoder) as again:
        assert set(again.bank.deleted_ids()) == {gone, old}


def test_a_crash_between_a_deletion_and_its_save_leaves_a_loadable_artifact(
        artifact: tuple[Path, HashingEncoder]) -> None:
    out, encoder = artifact
    with load_selector(out, encoder=encoder) as selector:
        gone = selector.select(make_env().tasks[0].question, k=1, mode="greedy").ids[0]
        selector.bank.delete([gone])  # committed, as in delete_case, but the process dies before the save
    verify(out)  # the saved rows are intact; the tombstone is what changed
    with load_selector(out, encoder=encoder) as again:
        assert again.bank.num_deleted == 1


def test_feedback_for_a_selection_made_before_a_deletion_learns_without_the_case(
        artifact: tuple[Path, HashingEncoder]) -> None:
    out, encoder = artifact
    query = make_env().tasks[0].question
    with load_selector(out, learn=True, encoder=encoder) as selector:
        before = selector.select(query, k=2, mode="greedy")
        selector.delete_case(before.ids[0])
        added = selector.replay.added
        selector.feedback(before.selection_id, 1.0)
        assert selector.replay.added == added + 1  # the other case is learned from
        state = selector.bank.embeddings([before.ids[0]])
        assert selector.replay.forget(state) == 0  # no slot holds the deleted case


def test_deleting_one_tenants_case_keeps_another_tenants_replay_slot(artifact: tuple[Path, HashingEncoder]) -> None:
    """Two tenants stored the same question (the same state vector): deleting bob's case masks bob's replay
    slot only, by its bank position, never alice's (issue 40: the buffer was masked by state vector)."""
    out, encoder = artifact
    question, answer = "which tenant owns this question", "both do"
    with load_selector(out, learn=True, encoder=encoder) as selector:
        alice = selector.add_case(question, answer, 1.0, scope={"user": "alice"})
        bob = selector.add_case(question, answer, 1.0, scope={"user": "bob"})
        assert alice != bob and np.array_equal(*selector.bank.embeddings([alice, bob]))
        for user, case_id in (("alice", alice), ("bob", bob)):
            result = selector.select(question, k=1, mode="greedy", scope={"user": user})
            assert result.ids == (case_id,)
            selector.feedback(result.selection_id, 1.0)
        report = selector.delete_case(bob)
        assert report["replay_slots_masked"] == 1  # bob's one slot, not alice's
        mask_NK = selector.replay.gather(torch.arange(len(selector.replay))).mask_BK
        assert int(mask_NK[-2].sum()) == 1 and int(mask_NK[-1].sum()) == 0  # alice's decision, then bob's
    with load_selector(out, learn=True, encoder=encoder) as again:  # the positions were saved with the buffer
        mask_NK = again.replay.gather(torch.arange(len(again.replay))).mask_BK
        assert int(mask_NK[-2].sum()) == 1 and int(mask_NK[-1].sum()) == 0
        assert again.delete_case(alice)["replay_slots_masked"] == 1


def test_a_replay_buffer_saved_without_positions_forgets_by_vector(tmp_path: Path) -> None:
    """Slots of a version-2 save carry no bank position: forget_cases matches them by vector (all cases of that
    text), and the slots added since by position."""
    from memento.config import ReplayConfig
    from memento.learn.replay import ReplayBuffer

    buffer = ReplayBuffer(ReplayConfig(capacity=8, dim=3, k_max=1), device="cpu")
    a = np.eye(3, dtype=np.float32)[0]
    buffer.add_batch(state_BD=a[None], cases_BKD=a[None, None], reward_B=np.ones(1, np.float32))  # unknown
    buffer.add_batch(state_BD=a[None], cases_BKD=a[None, None], reward_B=np.ones(1, np.float32),
                     case_pos_BK=np.array([[4]]))
    buffer.add_batch(state_BD=a[None], cases_BKD=a[None, None], reward_B=np.ones(1, np.float32),
                     case_pos_BK=np.array([[5]]))
    state = buffer.state_dict()
    del state["tensors"]["case_pos_NK"]  # as a version-2 save holds it
    old = ReplayBuffer(buffer.config, device="cpu")
    old.load_state_dict(state)
    assert old.forget_cases([5], a[None]) == 3  # no positions: every slot of that vector
    assert buffer.forget_cases([5], a[None]) == 2  # slot 0 (unknown) by vector, slot 2 by position
    assert buffer.gather(torch.arange(3)).mask_BK[:, 0].tolist() == [False, True, False]
