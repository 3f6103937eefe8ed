"""The selector artifact: export from a run, verification, load_selector and the Selector API.

One small soft-Q vs similarity comparison on the SYNTHETIC text environment of tests/loop_env.py (hashing
encoder, no model to load; about 1 s) is exported once per module; tests that change an artifact work on a
copy. The real encoder and the blocked-imports subprocess are in tests/integration/test_export_real.py.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sqlite3
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

import memento
from memento.bank import CaseBank
from memento.bank.bankfile import digest as bank_rows_digest
from memento.cli.entry import main
from memento.config import LearnerConfig, QNetConfig, ReplayConfig, load_json, save_json, to_dict
from memento.errors import (
    CheckpointError,
    ConfigError,
    DataFormatError,
    DimensionError,
    EncoderError,
    MementoError,
    UnknownCaseError,
    UnknownSelectionError,
)
from memento.learn.learner import SoftQLearner
from memento.learn.qnet import build_qnet
from memento.learn.replay import ReplayBuffer
from memento.policies import SoftQConfig, make_policy
from memento.runs.compare import run_comparison
from memento.runs.qa import LoopConfig
from memento.selector.artifact import (
    BANK_DB,
    DERIVED_FILES,
    FEEDBACK_NAME,
    READY_DIR,
    REQUIRED_FILES,
    STAGING_DIR,
    SelectorConfig,
    hash_files,
    listed_files,
    write_qnet,
)
from memento.selector.export import export_selector, load_selector, verify
from memento.selector.runtime import Selector
from tests.loop_env import ExactJudge, HashingEncoder, make_env

STEPS = 40


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A soft_q + similarity comparison of 40 steps (checkpoints at 20 and 40)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    env = make_env()
    out = tmp_path_factory.mktemp("runs") / "demo"
    config = LoopConfig(steps=STEPS, checkpoint_every=20, tensorboard=False, policy=SoftQConfig(warmup=4), window=10)
    run_comparison(["soft_q", "similarity"], config=config, out_dir=out, late_steps=10, make_policy=make_policy,
                   encoder=HashingEncoder(),
                   planner=env.planner(), judge=ExactJudge(), tasks=env.tasks, seed_cases=env.seed_cases)
    torch.set_num_threads(threads)
    return out


@pytest.fixture(scope="module")
def exported(runs: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_selector(runs, tmp_path_factory.mktemp("export") / "selector")


@pytest.fixture
def artifact(exported: Path, tmp_path: Path) -> Path:
    """A private copy of the exported artifact (without the pending selections other tests left in it)."""
    return Path(shutil.copytree(exported, tmp_path / "selector", ignore=shutil.ignore_patterns(".pending.sqlite*")))


def _queries(n: int = 6) -> np.ndarray:
    env = make_env()
    return HashingEncoder().encode([task.question for task in env.tasks[::4][:n]])


def _rehash(root: Path) -> None:
    """Re-sign a deliberately edited artifact, so that the check under test is not the checksum."""
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["files"] = hash_files(listed_files(root))
    rows = manifest["live"][BANK_DB]["rows"]
    manifest["live"][BANK_DB]["digest"] = bank_rows_digest(root / BANK_DB, rows)
    (root / "manifest.json").write_text(json.dumps(manifest))


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


# ---------------------------------------------------------------- the artifact


def test_export_writes_every_part_with_checksums(exported: Path, runs: Path) -> None:
    manifest = json.loads((exported / "manifest.json").read_text())
    assert manifest["format"] == "memento-selector" and manifest["format_version"] == 1
    assert set(REQUIRED_FILES) <= set(manifest["files"]) and set(DERIVED_FILES) <= set(manifest["files"])
    assert set(manifest["files"]) == set(listed_files(exported))
    assert manifest["files"] == hash_files(listed_files(exported))
    assert {"memento", "torch", "numpy", "python", "safetensors"} <= set(manifest["versions"])
    source = manifest["source"]
    assert source["policy"] == "soft_q" and source["step"] == STEPS and source["run_dir"].endswith("soft_q")
    assert source["summary"]["steps"] == STEPS and set(source["comparison"]["policies"]) == {"soft_q", "similarity"}
    assert manifest["live"][FEEDBACK_NAME]["rows"] == 0
    config = load_json(SelectorConfig, exported / "config.json")
    assert (config.k, config.candidates, config.qnet.dim, config.index.factory) == (4, 32, 64, "Flat")
    assert config.run is not None and config.run["steps"] == STEPS and config.run["policy"]["kind"] == "soft_q"
    encoder = json.loads((exported / "encoder.json").read_text())
    assert encoder["kind"] == "none" and encoder["dim"] == 64 and "HashingEncoder" in encoder["description"]
    card = (exported / "README.md").read_text()
    assert "success rate" in card and "load_selector" in card and "similarity" in card
    with CaseBank.open(runs / "soft_q" / "bank") as run_bank, CaseBank.open(exported / "bank") as bank:
        assert len(bank) == len(run_bank) == source["bank_cases"]
        assert [c.to_json() for c in bank.iter_cases()] == [c.to_json() for c in run_bank.iter_cases()]
    report = verify(exported)
    assert report["files"] == len(manifest["files"]) and report["cases_since_save"] == 0


def test_selections_equal_the_trained_policy_greedy_and_sampled(exported: Path, runs: Path) -> None:
    from memento.policies import SoftQPolicy

    learner = SoftQLearner.load(runs / "soft_q" / "selector", device="cpu")
    policy = SoftQPolicy(learner.qnet, alpha=learner.alpha)
    reference_rng = np.random.default_rng(7)
    queries = _queries()
    with CaseBank.open(runs / "soft_q" / "bank") as bank, load_selector(exported, seed=7) as selector:
        for greedy in (True, False):
            for query in queries:
                candidates = bank.candidates(query, 32)
                expected = policy.select(query, candidates, 4, rng=reference_rng, greedy=greedy)
                got = selector.select(query, k=4, mode="greedy" if greedy else "sample")
                assert list(got.ids) == list(expected.ids)
                assert got.set_prob == pytest.approx(expected.set_prob, rel=1e-9)
                if not greedy:
                    np.testing.assert_allclose(got.probs, expected.probs_K, rtol=1e-9)
                else:
                    assert got.probs == (1.0,) * 4 and got.set_prob == 1.0
                assert [c.id for c in got.cases] == list(got.ids) and got.policy_version == learner.updates


def test_same_seed_same_sampled_selections_other_seed_differs(exported: Path) -> None:
    queries = _queries()
    draws = []
    for seed in (3, 3, 4):
        with load_selector(exported, seed=seed) as selector:
            draws.append([selector.select(q, k=4).ids for q in queries for _ in range(3)])
    assert draws[0] == draws[1]
    assert draws[0] != draws[2]


# ---------------------------------------------------------------- verification


@pytest.mark.parametrize("name", sorted(set(REQUIRED_FILES) | set(DERIVED_FILES)))
def test_a_changed_byte_in_any_file_is_rejected(artifact: Path, name: str) -> None:
    _flip_byte(artifact / name)
    with pytest.raises(CheckpointError, match=name.replace(".", r"\.")):
        load_selector(artifact)
    with pytest.raises(CheckpointError, match=name.replace(".", r"\.")):
        verify(artifact)


def test_truncated_missing_and_newer_files_are_rejected(artifact: Path, tmp_path: Path) -> None:
    replay = artifact / "replay" / "replay.safetensors"
    replay.write_bytes(replay.read_bytes()[: replay.stat().st_size // 2])
    with pytest.raises(CheckpointError, match=r"replay\.safetensors: \d+ bytes.*truncated"):
        load_selector(artifact)
    second = Path(shutil.copytree(artifact.parent / "selector", tmp_path / "second"))
    (second / "learner" / "learner.json").unlink()
    with pytest.raises(CheckpointError, match=r"learner\.json: missing"):
        load_selector(second)
    manifest = json.loads((artifact / "manifest.json").read_text())
    manifest["format_version"] = 99
    (artifact / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="newer"):
        load_selector(artifact)
    with pytest.raises(CheckpointError, match="not a selector artifact"):
        load_selector(tmp_path)
    with pytest.raises(CheckpointError, match="nowhere': no such local path"):  # never a Hub lookup
        load_selector(tmp_path / "nowhere")


def test_verify_false_skips_checksums_but_not_dimensions(artifact: Path) -> None:
    (artifact / "README.md").write_text("edited by hand\n")
    with pytest.raises(CheckpointError, match="README"):
        load_selector(artifact)
    with load_selector(artifact, verify=False) as selector:
        assert len(selector.select(_queries()[0], k=2)) == 2


def test_encoder_dimension_mismatch_is_rejected(artifact: Path) -> None:
    spec = json.loads((artifact / "encoder.json").read_text())
    spec["dim"] = 32
    (artifact / "encoder.json").write_text(json.dumps(spec))
    _rehash(artifact)
    with pytest.raises(DimensionError, match=r"encoder\.json dim=32.*dim=64"):
        load_selector(artifact)
    with pytest.raises(DimensionError, match=r"encoder\.json dim=32"):
        verify(artifact)


def test_index_dimension_mismatch_is_rejected(artifact: Path) -> None:
    shutil.rmtree(artifact / "bank")
    vectors = HashingEncoder(dim=32).encode(["a b", "c d"])
    with CaseBank.create(artifact / "bank", 32) as bank:
        bank.add([memento.Case(state="a b", action="x", reward=1.0), memento.Case(state="c d", action="y", reward=0.0)],
                 vectors)
    _rehash(artifact)
    with pytest.raises(DimensionError, match=r"bank/ \(faiss index and embeddings\) dim=32"):
        load_selector(artifact)
    with pytest.raises(DimensionError, match="bank/ dim=32"):
        verify(artifact)


def test_qnet_dimension_mismatch_is_rejected(artifact: Path) -> None:
    config = load_json(SelectorConfig, artifact / "config.json")
    qnet_config = dataclasses.replace(config.qnet, dim=32)
    learner = SoftQLearner(build_qnet(qnet_config), config.learner, device="cpu")
    shutil.rmtree(artifact / "learner")
    learner.save(artifact / "learner")
    write_qnet(artifact / "qnet.safetensors", learner)
    replay = ReplayBuffer(dataclasses.replace(config.replay, dim=32), device="cpu")
    shutil.rmtree(artifact / "replay")
    replay.save(artifact / "replay")
    save_json(dataclasses.replace(config, qnet=qnet_config, replay=replay.config), artifact / "config.json")
    _rehash(artifact)
    with pytest.raises(DimensionError, match=r"encoder\.json dim=64, config\.json \(Q-network\) dim=32"):
        load_selector(artifact)


def test_qnet_file_must_match_the_learner(artifact: Path) -> None:
    config = load_json(SelectorConfig, artifact / "config.json")
    other = SoftQLearner(build_qnet(dataclasses.replace(config.qnet, seed=99)), config.learner, device="cpu")
    write_qnet(artifact / "qnet.safetensors", other)
    _rehash(artifact)
    with pytest.raises(CheckpointError, match="differs from the learner"):
        load_selector(artifact)


def test_appended_rows_are_accepted_but_edited_saved_rows_are_not(artifact: Path) -> None:
    with load_selector(artifact) as selector:
        selector.add_case("a brand new state", "an answer", 1.0, embedding=_queries()[0])
        result = selector.select(_queries()[1], k=2)
        selector.feedback(result.selection_id, 0.0)
    report = verify(artifact)
    assert report["cases_since_save"] == 1 and report["feedbacks_since_save"] == 1
    conn = sqlite3.connect(artifact / BANK_DB)
    with conn:
        conn.execute("UPDATE cases SET action = 'forged' WHERE pos = 0")
    conn.close()
    with pytest.raises(CheckpointError, match=r"cases\.sqlite: its first \d+ saved cases row\(s\) were changed"):
        load_selector(artifact)


# ---------------------------------------------------------------- the Selector API


def test_select_result_and_to_dict(artifact: Path) -> None:  # a copy: pending selections persist on disk
    with load_selector(artifact) as selector:
        result = selector.select(_queries()[0], k=3)
        assert len(result) == 3 and len(result.cases) == 3 and len(result.probs) == 3
        assert result.mode == "sample" and 0.0 < result.set_prob <= 1.0 and len(result.selection_id) == 32
        assert all(0.0 < p <= 1.0 for p in result.probs)
        as_dict = result.to_dict()
        json.dumps(as_dict)
        assert set(as_dict) == {"selection_id", "mode", "policy_version", "set_prob", "cases"}
        first = as_dict["cases"][0]
        assert set(first) - {"meta", "user", "agent", "session"} == {"id", "state", "action", "reward", "env",
                                                                      "prob", "score", "similarity"}
        assert (first["score"], first["similarity"]) == (result.scores[0], result.similarities[0])
        assert first.get("meta", {}) == result.cases[0].meta
        assert [c["id"] for c in as_dict["cases"]] == list(result.ids)
        assert selector.get_case(result.ids[0]) == result.cases[0]
        many = selector.select(_queries()[0], k=40)  # more than C = 32: C grows to k, the bank has 59
        assert len(many) == 40 and len(set(many.ids)) == 40
        stats = selector.stats()
        assert stats["pending"] == 2 and stats["dim"] == 64 and stats["learn"] is False
        assert stats["cases"] == json.loads((artifact / "manifest.json").read_text())["source"]["bank_cases"]


def test_env_filter_and_an_empty_choice(artifact: Path) -> None:
    with load_selector(artifact) as selector:
        case_id = selector.add_case("a state of env x", "an action", 0.5, env="x", embedding=_queries()[2])
        only = selector.select(_queries()[0], k=4, env="x")
        assert only.ids == (case_id,) and only.cases[0].env == "x"
        empty = selector.select(_queries()[0], k=4, env="nothing-here")
        assert empty.ids == () and empty.set_prob == 1.0
        assert selector.feedback(empty.selection_id, 1.0)["recorded"] is True
        assert selector.stats()["feedbacks"] == 1


def test_bad_inputs_raise_the_documented_errors(artifact: Path) -> None:
    with load_selector(artifact) as selector:
        query = _queries()[0]
        with pytest.raises(DimensionError, match=r"shape \(32,\).*\(64,\)"):
            selector.select(query[:32])
        with pytest.raises(DataFormatError):
            selector.select(np.full(64, np.nan))
        with pytest.raises(DataFormatError):
            selector.select(np.zeros(64))
        with pytest.raises(DataFormatError, match="k must be"):
            selector.select(query, k=0)
        with pytest.raises(DataFormatError, match="mode"):
            selector.select(query, mode="best")  # type: ignore[arg-type]
        with pytest.raises(EncoderError, match="no text encoder"):
            selector.select("a text query needs an encoder")
        result = selector.select(query)
        for reward in (1.5, -0.1, float("nan"), True, "1"):
            with pytest.raises(DataFormatError):
                selector.feedback(result.selection_id, reward)  # type: ignore[arg-type]
        assert selector.feedback(result.selection_id, 1.0)["recorded"]
        with pytest.raises(UnknownSelectionError, match="already answered") as info:
            selector.feedback(result.selection_id, 1.0)
        assert isinstance(info.value, KeyError) and isinstance(info.value, MementoError)
        with pytest.raises(UnknownSelectionError):
            selector.feedback("0" * 32, 1.0)
        with pytest.raises(UnknownCaseError):
            selector.get_case("no-such-case")
        with pytest.raises(DataFormatError):
            selector.add_case("s", "a", 2.0, embedding=query)
        with pytest.raises(DataFormatError):
            selector.add_case("", "a", 1.0, embedding=query)
    with pytest.raises(ConfigError, match="seed"):
        load_selector(artifact, seed=-1)
    with pytest.raises(MementoError, match="closed"):
        selector.select(query)


def test_pending_selections_are_bounded_and_expire(exported: Path) -> None:
    with load_selector(exported) as selector:
        selector.config = dataclasses.replace(selector.config, max_pending=2)
        first = selector.select(_queries()[0])
        for query in _queries(3)[1:]:
            selector.select(query)
        with pytest.raises(UnknownSelectionError, match="expired"):
            selector.feedback(first.selection_id, 1.0)
        selector.config = dataclasses.replace(selector.config, pending_ttl_s=1e-6)
        late = selector.select(_queries()[0])
        with pytest.raises(UnknownSelectionError):
            selector.feedback(late.selection_id, 1.0)
        assert selector.stats()["pending"] == 0 and selector.stats()["expired"] >= 3


def test_add_case_encodes_with_the_given_encoder_and_deduplicates(artifact: Path) -> None:
    with load_selector(artifact, encoder=HashingEncoder()) as selector:
        case_id = selector.add_case("What is the capital of Atlantis?", "Poseidonia", 1.0, meta={"source": "test"})
        assert selector.add_case("What is the capital of Atlantis?", "Poseidonia", 1.0) == case_id
        case = selector.get_case(case_id)
        assert case.action == "Poseidonia" and case.meta == {"source": "test"}
        result = selector.select("What is the capital of Atlantis?", k=1, mode="greedy")
        assert len(result) == 1
        assert selector.stats()["cases_since_save"] == 1
    with pytest.raises(ConfigError, match="encoder"):
        load_selector(artifact, encoder=object())
    with pytest.raises(DimensionError, match="the encoder passed in dim=32"):
        load_selector(artifact, encoder=HashingEncoder(dim=32))


def test_feedback_survives_a_crash_and_replays_into_the_learner(artifact: Path) -> None:
    queries = _queries()
    with load_selector(artifact, learn=True, seed=1) as selector:
        updates0 = selector.stats()["updates"]
        for i in range(24):
            result = selector.select(queries[i % len(queries)], k=4)
            answer = selector.feedback(result.selection_id, float(i % 2))
            assert answer == {"selection_id": result.selection_id, "reward": float(i % 2), "recorded": True,
                              "updates": updates0 + i + 1}
        selector.add_case("kept across the crash", "yes", 1.0, embedding=queries[0])
        before = selector.stats()
        weights = {k: v.clone() for k, v in selector.learner.qnet.state_dict().items()}
        selector._bank.close()  # a crash: nothing saved, files closed
        selector._feedback.close()
        selector._closed = True
    report = verify(artifact)
    assert report["feedbacks_since_save"] == 24 and report["cases_since_save"] == 1
    with load_selector(artifact, learn=True, seed=1) as selector:
        after = selector.stats()
        for key in ("cases", "feedbacks", "updates", "replay", "replay_added", "feedbacks_since_save"):
            assert after[key] == before[key], key
        for name, value in selector.learner.qnet.state_dict().items():
            assert torch.equal(value, weights[name]), name
        assert selector.save() == artifact
        assert selector.stats()["feedbacks_since_save"] == 0 and selector.stats()["saves"] == 2
    report = verify(artifact)
    assert report["feedbacks_since_save"] == 0 and report["feedbacks"] == 24
    with load_selector(artifact) as selector:  # learn=False: recorded and buffered, but no gradient steps
        updates = selector.stats()["updates"]
        result = selector.select(queries[0])
        assert selector.feedback(result.selection_id, 1.0)["updates"] == updates
        assert selector.stats()["replay_added"] == after["replay_added"] + 1


def test_learning_changes_the_policy_version(artifact: Path) -> None:
    with load_selector(artifact, learn=True) as selector:
        first = selector.select(_queries()[0])
        selector.feedback(first.selection_id, 1.0)
        second = selector.select(_queries()[0])
        assert second.policy_version == first.policy_version + 1


def test_interrupted_saves_are_finished_or_dropped(artifact: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import memento.selector.artifact as artifact_module

    with load_selector(artifact, learn=True) as selector:
        for query in _queries():
            selector.feedback(selector.select(query).selection_id, 1.0)
        updates = selector.stats()["updates"]

        def crash(root: Path) -> None:
            raise OSError("simulated crash after the commit point")

        monkeypatch.setattr(artifact_module, "_apply_ready", crash)
        with pytest.raises(OSError, match="simulated"):
            selector.save()
        monkeypatch.undo()
        selector._bank.close()
        selector._feedback.close()
        selector._closed = True
    assert (artifact / READY_DIR).is_dir()
    with pytest.raises(CheckpointError, match="interrupted"):
        verify(artifact)
    with load_selector(artifact) as selector:  # finishes the move
        assert selector.stats()["updates"] == updates and selector.stats()["feedbacks_since_save"] == 0
    assert not (artifact / READY_DIR).exists()
    (artifact / STAGING_DIR).mkdir()
    (artifact / STAGING_DIR / "config.json").write_text("half written")
    with load_selector(artifact) as selector:
        assert selector.stats()["saves"] == 2
    assert not (artifact / STAGING_DIR).exists()


def test_save_to_another_directory(artifact: Path, tmp_path: Path) -> None:
    with load_selector(artifact, learn=True) as selector:
        selector.feedback(selector.select(_queries()[0]).selection_id, 1.0)
        copy = selector.save(tmp_path / "copy")
        assert copy == tmp_path / "copy"
        with pytest.raises(CheckpointError, match="not an empty directory"):
            selector.save(artifact.parent)
        assert selector.stats()["feedbacks_since_save"] == 1  # its own directory is not saved
    report = verify(copy)
    assert report["feedbacks"] == 1 and report["feedbacks_since_save"] == 0
    with load_selector(copy) as loaded:
        assert loaded.stats()["feedbacks"] == 1


def test_threads_share_one_selector(artifact: Path) -> None:
    queries = _queries()
    errors: list[BaseException] = []
    with load_selector(artifact, learn=True) as selector:
        start = selector.stats()

        def work(t: int) -> None:
            try:
                for i in range(15):
                    result = selector.select(queries[(t + i) % len(queries)], k=4)
                    selector.feedback(result.selection_id, float((t + i) % 2))
            except BaseException as error:  # pragma: no cover - reported below
                errors.append(error)

        threads = [threading.Thread(target=work, args=(t,)) for t in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        stats = selector.stats()
    assert not errors
    assert stats["feedbacks"] == 90 and stats["updates"] == start["updates"] + 90 and stats["pending"] == 0
    assert verify(artifact)["feedbacks_since_save"] == 90


# ---------------------------------------------------------------- export sources


def test_export_from_a_run_a_checkpoint_or_an_artifact(runs: Path, tmp_path: Path) -> None:
    for source in (runs / "soft_q", runs / "soft_q" / "checkpoint"):
        out = export_selector(source, tmp_path / source.name)
        assert verify(out)["cases"] == json.loads((runs / "soft_q" / "summary.json").read_text())["bank_size_end"]
    copy = export_selector(tmp_path / "soft_q", tmp_path / "copy")
    assert verify(copy)["manifest"]["source"] == verify(tmp_path / "soft_q")["manifest"]["source"]


def test_export_takes_the_bank_as_it_was_at_the_checkpoint(runs: Path, tmp_path: Path) -> None:
    run = Path(shutil.copytree(runs / "soft_q", tmp_path / "run"))
    saved = json.loads((run / "checkpoint" / "state.json").read_text())["bank_size"]
    with CaseBank.open(run / "bank") as bank:  # retained after the last checkpoint (a crash)
        bank.add([memento.Case(state="late case", action="late", reward=1.0)], _queries()[:1])
    (run / "summary.json").unlink()
    out = export_selector(run, tmp_path / "out")
    assert verify(out)["cases"] == saved
    with load_selector(out) as selector:
        with pytest.raises(UnknownCaseError):
            selector.get_case(memento.Case(state="late case", action="late", reward=1.0).content_hash[:16])


def test_export_refusals(runs: Path, exported: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="only soft_q"):
        export_selector(runs / "similarity", tmp_path / "a")
    with pytest.raises(CheckpointError, match="not a run directory"):
        export_selector(tmp_path, tmp_path / "b")
    with pytest.raises(CheckpointError, match="not found"):
        export_selector(tmp_path / "missing", tmp_path / "c")
    with pytest.raises(CheckpointError, match="already exists"):
        export_selector(runs, exported)
    (tmp_path / "precious").mkdir()
    (tmp_path / "precious" / "notes.txt").write_text("keep me")
    with pytest.raises(CheckpointError, match="not a selector artifact"):
        export_selector(runs, tmp_path / "precious", overwrite=True)
    assert (tmp_path / "precious" / "notes.txt").read_text() == "keep me"
    out = export_selector(runs, tmp_path / "d")
    first = json.loads((out / "manifest.json").read_text())["created_unix"]
    export_selector(runs, out, overwrite=True)
    assert json.loads((out / "manifest.json").read_text())["created_unix"] >= first
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_selector_config_validation() -> None:
    qnet, learner = QNetConfig(dim=8), LearnerConfig()
    replay = ReplayConfig(dim=8)
    SelectorConfig(qnet=qnet, learner=learner, replay=replay)
    with pytest.raises(ConfigError, match="gamma"):
        SelectorConfig(qnet=qnet, learner=LearnerConfig(gamma=0.5), replay=replay)
    with pytest.raises(ConfigError, match="replay"):
        SelectorConfig(qnet=qnet, learner=learner, replay=ReplayConfig(dim=9))
    with pytest.raises(ConfigError, match="k"):
        SelectorConfig(qnet=qnet, learner=learner, replay=replay, k=0)
    with pytest.raises(ConfigError, match="pending_ttl_s"):
        SelectorConfig(qnet=qnet, learner=learner, replay=replay, pending_ttl_s=0.0)
    assert to_dict(SelectorConfig(qnet=qnet, learner=learner, replay=replay))["run"] is None


# ---------------------------------------------------------------- CLI


def test_cli_export_and_verify(runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli"
    assert main(["export", str(runs), str(out)]) == 0
    printed = capsys.readouterr().out
    assert "case(s), dim 64" in printed and "load_selector" in printed
    assert main(["verify", str(out)]) == 0
    assert ": ok (" in capsys.readouterr().out
    assert main(["verify", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cases_since_save"] == 0
    assert main(["export", str(runs), str(out)]) == 2
    assert "--force" in capsys.readouterr().err
    assert main(["export", str(runs), str(out), "--force"]) == 0
    capsys.readouterr()
    _flip_byte(out / "qnet.safetensors")
    assert main(["verify", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("memento: error: ") and "qnet.safetensors" in err and err.count("\n") == 1


def test_public_api() -> None:
    for name in ("Selector", "SelectionResult", "load_selector", "export_selector", "UnknownSelectionError"):
        assert name in memento.__all__
    assert memento.Selector is Selector and memento.load_selector is load_selector


def test_create_selector_over_a_bank_learns_from_feedback(tmp_path: Path) -> None:
    env = make_env()
    encoder = HashingEncoder()
    with CaseBank.create(tmp_path / "bank", encoder.dim, index="HNSW32,Flat") as bank:
        bank.add(env.seed_cases, encoder.encode([c.state for c in env.seed_cases]))
    out = memento.selector.export.create_selector(tmp_path / "bank", tmp_path / "selector", k=2, warmup=1)
    report = verify(out)
    assert report["cases"] == len(env.seed_cases) and report["manifest"]["source"]["kind"] == "bank"
    assert "not trained by a run" in (out / "README.md").read_text()
    config = load_json(SelectorConfig, out / "config.json")
    assert (config.k, config.index.factory, config.run) == (2, "HNSW32,Flat", None)
    with load_selector(out, learn=True, encoder=encoder) as selector:
        result = selector.select(env.tasks[0].question, k=3)  # more than the buffer's k_max=2: split in rows
        assert len(result) == 3 and result.policy_version == 0
        assert selector.feedback(result.selection_id, 1.0)["updates"] == 1
        assert selector.stats()["replay_added"] == 2
        selector.save()
    with pytest.raises(DimensionError):
        memento.selector.export.create_selector(tmp_path / "bank", tmp_path / "other", qnet=QNetConfig(dim=8))
    with pytest.raises(CheckpointError, match="not a case bank"):
        memento.selector.export.create_selector(tmp_path, tmp_path / "other")
    assert not (tmp_path / "other").exists()


def test_positive_only_selector_shows_only_rewarded_cases(tmp_path: Path) -> None:
    env = make_env()
    encoder = HashingEncoder()
    cases = [dataclasses.replace(c, reward=float(i % 2)) for i, c in enumerate(env.seed_cases)]
    with CaseBank.create(tmp_path / "bank", encoder.dim) as bank:
        bank.add(cases, encoder.encode([c.state for c in cases]))
        rewarded = {c.id for c in bank.iter_cases() if c.reward > 0}
    out = memento.selector.export.create_selector(tmp_path / "bank", tmp_path / "selector", positive_only=True)
    assert load_json(SelectorConfig, out / "config.json").positive_only
    with load_selector(out, encoder=encoder) as selector:
        for task in env.tasks[:10]:
            for mode in ("sample", "greedy"):
                result = selector.select(task.question, k=4, mode=mode)
                assert len(result) == 4 and set(result.ids) <= rewarded
