"""A bank named by URI where a command reads one: ``memento evaluate --bank``, ``memento export --bank``
(``create_selector``), ``memento train --bank`` (transition logs) and ``memento train-encoder`` take a Milvus Lite
bank as they take a directory, and give the same results; a bad name is one line and exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from memento.bank import copy_bank, open_bank
from memento.cli.entry import main
from memento.selector.export import create_selector, load_selector, verify
from tests.loop_env import HashingEncoder, soft_q_run
from tests.unit.test_cli_ope import _evaluate


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return soft_q_run(tmp_path_factory.mktemp("uri") / "run", steps=12)


@pytest.fixture(scope="module")
def lite(run: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The run's bank copied to a Milvus Lite file (ids, positions and vectors kept)."""
    uri = f"milvus:{tmp_path_factory.mktemp('lite')}/bank.db#run"
    copy_bank(run / "bank", uri)
    return uri


def test_evaluate_reads_a_milvus_bank_as_the_directory(run: Path, lite: str, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    reports = {}
    for name, bank in (("dir", str(run / "bank")), ("milvus", lite)):
        out = tmp_path / f"{name}.json"
        assert _evaluate([str(run), "--bank", bank, "--policy", "logged", "--policy", "similarity",
                          "--policy", "random", "--bootstrap", "50", "--json", str(out)]) == 0
        reports[name] = json.loads(out.read_text(encoding="utf-8"))
    assert reports["milvus"]["bank"] == lite
    assert reports["milvus"]["targets"] == reports["dir"]["targets"]
    assert reports["dir"]["rounds"] == 12
    capsys.readouterr()
    out = tmp_path / "never.json"
    assert main(["evaluate", str(run), "--bank", "s3:bucket/bank", "--policy", "logged", "--json", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown bank scheme" in err[0] and not out.exists()


def test_create_selector_from_a_milvus_bank(run: Path, lite: str, tmp_path: Path) -> None:
    from_dir = create_selector(run / "bank", tmp_path / "a")
    from_milvus = create_selector(lite, tmp_path / "b")
    assert verify(from_milvus)["cases"] == verify(from_dir)["cases"]
    manifest = json.loads((from_milvus / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["source"]["path"] == lite
    with open_bank(from_dir / "bank") as a, open_bank(from_milvus / "bank") as b:
        everything = np.arange(len(a))
        assert a.ids_at(everything) == b.ids_at(everything)
        assert np.array_equal(a.embeddings_at(everything), b.embeddings_at(everything))
        assert a.deleted_ids() == b.deleted_ids()
    query_BD = np.asarray(HashingEncoder().encode(["what is 2 + 3?", "capital of France"]), dtype=np.float32)
    with load_selector(from_dir, seed=3) as sa, load_selector(from_milvus, seed=3) as sb:
        for state_D in query_BD:
            assert ([c.id for c in sa.select(state_D, k=2).cases] == [c.id for c in sb.select(state_D, k=2).cases])


def test_export_refuses_a_missing_milvus_collection(run: Path, lite: str, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    missing = lite.replace("#run", "#nothing_here")
    assert main(["export", str(run / "selector"), str(tmp_path / "x"), "--bank", missing]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a case bank" in err[0], err
    assert not (tmp_path / "x").exists()


def test_training_data_from_a_milvus_bank(run: Path, lite: str) -> None:
    from memento.training.data import load_transition_log
    from memento.training.simcse import load_texts

    a = load_transition_log(run, HashingEncoder(), bank=run / "bank")
    b = load_transition_log(run, HashingEncoder(), bank=lite)
    assert a.case_keys == b.case_keys and a.state_texts == b.state_texts
    assert np.array_equal(a.cases_MD, b.cases_MD) and np.array_equal(a.reward_N, b.reward_N)
    assert load_texts([lite]) == load_texts([str(run / "bank")])


def test_online_loop_with_case_features_from_a_milvus_seed_bank(lite: str, tmp_path: Path) -> None:
    """``memento online --bank milvus:...`` with the default soft-Q (case features: usage statistics and action
    vectors): the run copies the seed bank into its own bank and logs the features there."""
    import dataclasses

    from memento.policies import loop_policy, make_policy
    from memento.runs.qa import LoopConfig, run_online
    from tests.loop_env import ExactJudge, make_env

    env = make_env()
    policy = dataclasses.replace(loop_policy("soft_q"), warmup=2)
    assert policy.qnet.features == "case"
    config = LoopConfig(steps=4, k=2, candidates=6, shuffle=False, tensorboard=False, checkpoint_every=0, seed=0,
                        policy=policy)
    run_online(config, make_policy=make_policy, encoder=HashingEncoder(), planner=env.planner(), judge=ExactJudge(),
               tasks=env.tasks, bank_dir=lite, out_dir=tmp_path / "run")
    with open_bank(lite, read_only=True) as seed, open_bank(tmp_path / "run" / "bank") as bank:
        assert len(bank) >= len(seed) and bank.ids_at(range(len(seed))) == seed.ids_at(range(len(seed)))
        shown_N, _ = bank.usage_at(np.arange(len(bank)))
        assert shown_N.sum() == 4 * 2  # K cases shown per step
        assert bank.action_embeddings_at(np.flatnonzero(shown_N))[1].all()
