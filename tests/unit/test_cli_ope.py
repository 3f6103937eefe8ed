"""``memento evaluate`` (memento.cli.evaluate) on a tiny real run of the online loop: a soft-Q logger on the synthetic
text environment of tests/loop_env.py, the hashing encoder injected through ``cmd_evaluate``'s ``encoder``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest

from memento.cli.entry import main
from memento.cli.evaluate import add_parser, cmd_evaluate
from memento.ope.export import parse_vw_cb_adf
from memento.policies import make_policy
from tests.loop_env import HashingEncoder, soft_q_run

K1 = {"ips", "snips", "dm", "dr"}
SLATE = {"inclusion_ips", "pi", "pi_set"}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return soft_q_run(tmp_path_factory.mktemp("ope") / "run", steps=16)


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _evaluate(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="memento")
    add_parser(parser.add_subparsers(dest="command"))
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
            assert set(result) == {"estimator", "value", "ci_low", "ci_high", "ess", "n", "warnings",
                                   "outside_reward_range"}
            assert result["outside_reward_range"] == (not 0.0 <= result["value"] <= 1.0)
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


# ---------------------------------------------------------------- bad input: one line, exit 2, nothing written


def _outputs(tmp_path: Path) -> tuple[list[str], list[Path]]:
    """Every output flag of ``memento evaluate`` (the flags, then the paths none of which may exist after an error)."""
    paths = [tmp_path / "out" / "ope.json", tmp_path / "out" / "log.vw", tmp_path / "out" / "obp.json"]
    return ["--json", str(paths[0]), "--export-vw", str(paths[1]), "--export-obp", str(paths[2])], paths


def _nothing_written(paths: list[Path]) -> None:
    assert not any(path.exists() for path in paths) and not paths[0].parent.exists()


@pytest.fixture
def hashing_encoder(monkeypatch: pytest.MonkeyPatch) -> None:
    """``memento evaluate`` through ``main`` with the run's encoder (the hashing one) instead of the bundled model."""
    from memento.encoders import Encoder

    monkeypatch.setattr(Encoder, "from_pretrained", staticmethod(lambda *args, **kwargs: HashingEncoder()))


@pytest.mark.parametrize("bad", ["zero", "negative", "nan", "string"])
def test_a_chosen_case_without_a_positive_propensity_is_refused(run: Path, tmp_path: Path, bad: str,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    rows = _rows(run / "steps.jsonl")
    row = rows[2]
    assert not row["greedy"]
    probs = row["candidate_probs"]
    chosen = row["candidate_ids"].index(row["chosen_ids"][0])
    other = next(i for i, c in enumerate(row["candidate_ids"]) if c not in row["chosen_ids"])
    value = {"zero": 0.0, "negative": -0.25, "nan": float("nan"), "string": "0.3"}[bad]
    if isinstance(value, float) and value == value:  # keep the sum at 1: only the chosen case's entry is wrong
        probs[other] += probs[chosen] - value
    probs[chosen] = value
    steps = tmp_path / "log" / "steps.jsonl"
    steps.parent.mkdir()
    steps.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")  # NaN is written as NaN
    flags, paths = _outputs(tmp_path)
    err = _one_line_error(["evaluate", str(steps), "--bank", str(run / "bank"), "--policy", "logged", *flags], capsys)
    assert f"{steps}:3:" in err and f"candidate_probs[{chosen}]=" in err and row["chosen_ids"][0] in err, err
    assert ("> 0" if bad == "zero" else "not a probability") in err
    _nothing_written(paths)


def _other_dim_selector(run: Path, out: Path, dim: int) -> Path:
    from memento.learn.learner import SoftQLearner
    from memento.learn.qnet import build_qnet

    learner = SoftQLearner.load(run / "selector", device="cpu")
    assert learner.qnet.config.dim == HashingEncoder().dim != dim
    other = SoftQLearner(build_qnet(dataclasses.replace(learner.qnet.config, dim=dim)), learner.config, device="cpu")
    return other.save(out)


def test_a_selector_over_another_dimension_is_refused(run: Path, tmp_path: Path, hashing_encoder: None,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    selector = _other_dim_selector(run, tmp_path / "wide", 32)
    flags, paths = _outputs(tmp_path)
    err = _one_line_error(["evaluate", str(run), "--policy", "logged", "--policy", str(selector), *flags], capsys)
    assert str(selector) in err and "dim=32" in err and "dim=64" in err, err
    _nothing_written(paths)
    # the same selector with its saved config edited to claim the run's dimension: its tensors disagree
    state = selector / "learner.json"
    meta = json.loads(state.read_text(encoding="utf-8"))
    meta["qnet_config"]["dim"] = 64
    state.write_text(json.dumps(meta), encoding="utf-8")
    err = _one_line_error(["evaluate", str(run), "--policy", str(selector), *flags], capsys)
    assert str(selector) in err and "does not fit" in err and "size mismatch" in err, err
    _nothing_written(paths)


def _corrupt_bank(bank: Path, how: str) -> None:
    """Damage a bank's ``cases.sqlite``: ``garbage`` (the whole file), ``cases_page`` (the root page of its cases
    table: the header and the meta table still read) or ``meta_json`` (every case's meta column not JSON)."""
    import sqlite3

    db = bank / "cases.sqlite"
    if how == "garbage":
        db.write_bytes(np.random.default_rng(0).bytes(db.stat().st_size))
        return
    conn = sqlite3.connect(db)
    try:
        if how == "meta_json":
            conn.execute("UPDATE cases SET meta = '{not json'")
            conn.commit()
            return
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        [root] = conn.execute("SELECT rootpage FROM sqlite_master WHERE type = 'table' AND name = 'cases'").fetchone()
    finally:
        conn.close()
    data = bytearray(db.read_bytes())
    data[(root - 1) * page_size:root * page_size] = np.random.default_rng(1).bytes(page_size)
    db.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["garbage", "cases_page", "meta_json"])
def test_a_corrupt_bank_is_refused(run: Path, tmp_path: Path, how: str, hashing_encoder: None,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    bank = tmp_path / "bank"
    shutil.copytree(run / "bank", bank)
    _corrupt_bank(bank, how)
    before = sorted((p.name, p.stat().st_size) for p in bank.iterdir())
    flags, paths = _outputs(tmp_path)
    err = _one_line_error(["evaluate", str(run / "steps.jsonl"), "--bank", str(bank), "--policy", "logged",
                           "--policy", "similarity", "--bootstrap", "10", *flags], capsys)
    assert str(bank) in err and "cases.sqlite" in err, err
    _nothing_written(paths)
    assert sorted((p.name, p.stat().st_size) for p in bank.iterdir()) == before  # read only: not repaired either


def test_output_flags_are_checked_before_anything_is_written(run: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    vw = tmp_path / "log.vw"
    err = _one_line_error(["evaluate", str(run), "--export-vw", str(vw), "--export-obp", str(vw)], capsys)
    assert "--export-obp" in err and "same file as --export-vw" in err
    err = _one_line_error(["evaluate", str(run), "--policy", "logged", "--json", str(tmp_path)], capsys)
    assert "is a directory" in err
    err = _one_line_error(["evaluate", str(run), "--policy", "logged", "--json", str(run / "steps.jsonl")], capsys)
    assert "the log being evaluated" in err
    err = _one_line_error(["evaluate", str(run), "--export-vw", str(vw), "--json", str(tmp_path / "o.json")], capsys)
    assert "--policy" in err
    assert not vw.exists() and not (tmp_path / "o.json").exists()


# ---------------------------------------------------------------- the report a user reads


def _report(argv: list[str], capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> str:
    """Everything ``memento evaluate`` (through ``main``) shows: stdout, stderr and the log records."""
    with caplog.at_level(logging.DEBUG):
        assert main(["evaluate", *argv]) == 0
    captured = capsys.readouterr()
    shown = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    return "\n".join([captured.out, captured.err, *shown])


def test_the_report_warns_once_flags_the_range_and_ends_with_a_bottom_line(
        run: Path, tmp_path: Path, hashing_encoder: None, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    out = tmp_path / "ope.json"
    policies = ["logged", "similarity", "random", str(run / "selector")]
    text = _report([str(run), *[a for p in policies for a in ("--policy", p)], "--bootstrap", "100",
                    "--json", str(out)], capsys, caplog)
    report = json.loads(out.read_text(encoding="utf-8"))
    notes = {w for estimates in report["targets"].values() for r in estimates.values() for w in r["warnings"]}
    assert any("support violation" in w for w in notes)  # the random target: a greedy first step or two
    for target, estimates in report["targets"].items():
        for note in {w for r in estimates.values() for w in r["warnings"]}:
            lines = [line for line in text.splitlines() if note in line and f"({target}" in line]
            assert len(lines) == 1 and lines[0].startswith(f"warning ({target}: "), (note, lines)
    assert len([line for line in text.splitlines() if "support violation" in line]) == len(
        {(t, w) for t, e in report["targets"].items() for r in e.values() for w in r["warnings"]
         if "support violation" in w})  # nothing else (the log, stderr) repeats a support warning
    # no support warning for the logging policy against itself
    assert not any(r["warnings"] for r in report["targets"]["logged"].values())
    assert "warning (logged" not in text
    # a value outside [0, 1] is marked in its row, and the footnote says what the mark means
    rows = {tuple(line.split()[:2]): line for line in text.splitlines() if line.split()[:1] and
            line.split()[0] in {p[-24:] for p in policies}}
    flagged = 0
    for target, estimates in report["targets"].items():
        for name, r in estimates.items():
            value_field = rows[(target[-24:], name)].split()[2]
            assert value_field.endswith("!") == r["outside_reward_range"], (target, name, value_field)
            flagged += r["outside_reward_range"]
    assert ("! outside the reward range [0, 1]" in text) == bool(flagged)
    # one bottom line per target, in the text and the JSON
    assert report["reward_range"] == [0.0, 1.0]
    assert set(report["bottom_line"]) == set(policies)
    for target, line in report["bottom_line"].items():
        chosen = report["targets"][target][line["estimator"]]
        assert line["value"] == chosen["value"] and line["ci_low"] == chosen["ci_low"]
        assert line["vs_logged"] == pytest.approx(chosen["value"] - report["observed_mean_reward"])
        [printed] = [x for x in text.splitlines() if x.startswith(f"bottom line ({target}): ")]
        assert f"{line['estimator']} {line['value']:.4f}" in printed
        assert f"{line['vs_logged']:+.4f} vs logged" in printed
    logged = report["bottom_line"]["logged"]
    assert logged["estimator"] == "snips" and logged["value"] == report["observed_mean_reward"]
    assert logged["vs_logged"] == 0.0
    for target in policies[1:]:
        line = report["bottom_line"][target]
        assert line["estimator"] in {"dr", "snips", "dm"}
        if line["estimator"] != "dr":  # DR was passed over: the reason names the check it failed
            assert "dr fails" in line["why"], line
        if not line["why"].startswith("no estimator"):
            assert not line["outside_reward_range"]


def test_the_logging_policy_has_full_support_against_itself(run: Path, tmp_path: Path, hashing_encoder: None,
                                                            capsys: pytest.CaptureFixture[str],
                                                            caplog: pytest.LogCaptureFixture) -> None:
    """A cold logger gives the cases it did not draw probability 1e-8 (<= support_eps): evaluated against itself
    that is no support violation (the issue's report: the logging policy warned of one against itself)."""
    rows = _rows(run / "steps.jsonl")
    cold = 0
    for row in rows:
        if row["greedy"]:
            continue
        chosen = {row["candidate_ids"].index(c) for c in row["chosen_ids"]}
        others = len(row["candidate_ids"]) - len(chosen)
        mass = sum(row["candidate_probs"][i] for i in chosen)
        row["candidate_probs"] = [row["candidate_probs"][i] / mass * (1 - 1e-8 * others) if i in chosen else 1e-8
                                  for i in range(len(row["candidate_ids"]))]
        cold += others > 0
    assert cold >= 8
    steps = tmp_path / "cold" / "steps.jsonl"
    steps.parent.mkdir()
    steps.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    out = tmp_path / "cold.json"
    text = _report([str(steps), "--bank", str(run / "bank"), "--policy", "logged", "--policy", "random",
                    "--bootstrap", "20", "--json", str(out)], capsys, caplog)
    report = json.loads(out.read_text(encoding="utf-8"))
    assert not any(r["warnings"] for r in report["targets"]["logged"].values())
    assert "warning (logged" not in text
    # the check itself still runs: the random target leans on the cold cases
    assert any("support violation" in w for w in report["targets"]["random"]["ips"]["warnings"])
    assert text.count("warning (random: ips, snips, dm, dr): support violation") == 1
