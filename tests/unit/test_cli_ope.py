"""``memento evaluate`` (memento.cli_ope) on a tiny real run of the online loop: a soft-Q logger on the synthetic
text environment of tests/loop_env.py, the hashing encoder injected through ``cmd_evaluate``'s ``encoder``."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from memento.cli import main
from memento.cli_ope import add_evaluate_parser, cmd_evaluate
from memento.loop import LoopConfig, loop_policy, run_online
from memento.ope_export import parse_vw_cb_adf
from policies import make_policy
from tests.loop_env import ExactJudge, HashingEncoder, make_env

K1 = {"ips", "snips", "dm", "dr"}
SLATE = {"inclusion_ips", "pi", "pi_set"}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ope") / "run"
    env = make_env()
    config = LoopConfig(steps=16, k=2, candidates=6, shuffle=False, tensorboard=False, checkpoint_every=0, seed=0,
                        policy=dataclasses.replace(loop_policy("soft_q"), warmup=2))
    run_online(config, make_policy=make_policy, encoder=HashingEncoder(), planner=env.planner(), judge=ExactJudge(),
               tasks=env.tasks, seed_cases=env.seed_cases, out_dir=out)
    return out


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _evaluate(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="memento")
    add_evaluate_parser(parser.add_subparsers(dest="command"))
    return cmd_evaluate(parser.parse_args(["evaluate", *argv]), make_policy=make_policy, encoder=HashingEncoder())


def test_every_target_gets_every_estimator(run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ope.json"
    policies = ["logged", "similarity", "random", str(run / "selector")]
    assert _evaluate([str(run), *[a for p in policies for a in ("--policy", p)], "--bootstrap", "200",
                      "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    report = json.loads(out.read_text(encoding="utf-8"))
    rewards = [row["reward"] for row in _rows(run / "steps.jsonl")]
    assert report["rounds"] == len(rewards) == 16 and report["k_max"] == 2
    assert report["logging_policy"] == ["soft_q"]
    assert set(report["targets"]) == set(policies)
    for name, estimates in report["targets"].items():
        assert set(estimates) == K1 | SLATE, name
        for result in estimates.values():
            assert result["n"] == 16 and result["value"] is not None
            assert result["ci_low"] <= result["ci_high"]
            assert set(result) == {"estimator", "value", "ci_low", "ci_high", "ess", "n", "warnings"}
        assert estimates["dm"]["ess"] is None and estimates["ips"]["ess"] > 0
    logged = report["targets"]["logged"]
    assert logged["ips"]["value"] == np.mean(rewards) == report["observed_mean_reward"]
    assert logged["snips"]["value"] == np.mean(rewards)
    assert logged["pi"]["value"] == pytest.approx(np.mean(rewards), rel=1e-9)  # the logger's own PI weights are 1
    assert "similarity" in printed and "pi_set" in printed and "95% CI" in printed


def test_estimates_are_seeded(run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    reports = []
    for seed in ("3", "3", "4"):
        out = tmp_path / f"ope-{len(reports)}.json"
        _evaluate([str(run), "--policy", "random", "--bootstrap", "100", "--seed", seed, "--json", str(out)])
        reports.append(json.loads(out.read_text(encoding="utf-8"))["targets"])
    capsys.readouterr()
    assert reports[0] == reports[1]
    assert reports[0]["random"]["ips"]["ci_low"] != reports[2]["random"]["ips"]["ci_low"]


def test_exports_and_a_steps_file_with_one_case_a_step(run: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    rows = _rows(run / "steps.jsonl")
    for row in rows:  # the first draw alone: a K = 1 log of the same steps (a Plackett-Luce prefix)
        row["chosen_ids"], row["propensities"] = row["chosen_ids"][:1], row["propensities"][:1]
    steps = tmp_path / "k1" / "steps.jsonl"
    steps.parent.mkdir()
    steps.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    vw, obp, out = tmp_path / "log.vw", tmp_path / "obp.json", tmp_path / "k1.json"
    assert _evaluate([str(steps), "--bank", str(run / "bank"), "--policy", "similarity", "--bootstrap", "50",
                      "--json", str(out), "--export-vw", str(vw), "--export-obp", str(obp)]) == 0
    assert "16 examples written" in capsys.readouterr().out
    assert set(json.loads(out.read_text(encoding="utf-8"))["targets"]["similarity"]) == K1  # no slate estimators
    examples = parse_vw_cb_adf(vw.read_text(encoding="utf-8"))
    feedback = json.loads(obp.read_text(encoding="utf-8"))
    assert len(examples) == feedback["n_rounds"] == len(rows)
    for example, row, action, pscore in zip(examples, rows, feedback["action"], feedback["pscore"]):
        chosen = row["candidate_ids"].index(row["chosen_ids"][0])
        assert len(example.actions) == len(row["candidate_ids"])
        assert example.label_index == chosen and example.cost == pytest.approx(-row["reward"])
        assert example.probability == pytest.approx(row["candidate_probs"][chosen], rel=1e-5)
        assert feedback["action_ids"][action] == row["chosen_ids"][0]
        assert pscore == row["candidate_probs"][chosen]
    assert feedback["n_actions"] == len({c for row in rows for c in row["candidate_ids"]})


def _one_line_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("memento: error: ") and "\n" not in err and "Traceback" not in err
    return err


def test_bad_input_is_a_one_line_error(run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nothing" / "steps.jsonl"
    assert str(missing) in _one_line_error(["evaluate", str(missing), "--policy", "logged"], capsys)
    lines = (run / "steps.jsonl").read_text(encoding="utf-8").splitlines()
    old = json.loads(lines[2])
    del old["candidate_probs"]
    no_probs = tmp_path / "old" / "steps.jsonl"
    no_probs.parent.mkdir()
    no_probs.write_text("\n".join([lines[0], lines[1], json.dumps(old)]) + "\n", encoding="utf-8")
    err = _one_line_error(["evaluate", str(no_probs), "--policy", "logged"], capsys)
    assert f"{no_probs}:3:" in err and "candidate_probs" in err
    broken = tmp_path / "broken" / "steps.jsonl"
    broken.parent.mkdir()
    broken.write_text(lines[0] + "\n{not json\n", encoding="utf-8")
    err = _one_line_error(["evaluate", str(broken), "--policy", "logged"], capsys)
    assert f"{broken}:2:" in err and "invalid JSON" in err
    err = _one_line_error(["evaluate", str(run), "--policy", "nonsense"], capsys)
    assert "nonsense" in err and "selector directory" in err
    assert "nothing to do" in _one_line_error(["evaluate", str(run)], capsys)
