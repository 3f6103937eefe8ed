"""The off-policy step of ``memento bench online``'s real part (memento.bench.online): per seed, after the comparison
(memento.runs.compare.run_comparison), ``memento evaluate``'s estimates of the greedy learned selector and of similarity
from the soft_q run's log, next to the measured figures. On the synthetic text environment of tests/loop_env.py
(a ``CallablePlanner``, the hashing encoder), patched in where the bench loads the planner, the suite and the encoder.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import memento.bench.online as online
import memento.envs.tasks
from memento.bench.online import OnlineBenchConfig, format_online_table, run_online_bench
from memento.cli.entry import main
from memento.errors import ConfigError
from memento.formats import read_steps_jsonl
from tests.loop_env import HashingEncoder, make_env

K1 = {"ips", "snips", "dm", "dr"}
SLATE = {"inclusion_ips", "pi", "pi_set"}
SEEDS = (0, 1)
STEPS = 12


class _Encoders:
    @staticmethod
    def from_pretrained(*_: Any, **__: Any) -> HashingEncoder:
        return HashingEncoder()


def _patch(monkeypatch: pytest.MonkeyPatch) -> None:
    env = make_env()
    monkeypatch.setattr(online, "Encoder", _Encoders)
    monkeypatch.setattr(online, "parse_planner_spec", lambda spec: spec)
    monkeypatch.setattr(online, "build_planner", lambda spec: env.planner())
    monkeypatch.setattr(online, "seed_cases", lambda suite: env.seed_cases)
    monkeypatch.setattr(memento.envs.tasks, "load_suite", lambda suite, split: env.tasks)


def _config(**kwargs: Any) -> OnlineBenchConfig:
    return OnlineBenchConfig(**{"steps": STEPS, "window": 4, "late_steps": 4, "parts": ("real",), "seeds": SEEDS,
                                "bootstrap": 50, "ope_bootstrap": 50, "policies": ("soft_q", "similarity"),
                                **kwargs})


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    root = tmp_path_factory.mktemp("bench-online-ope")
    with pytest.MonkeyPatch.context() as monkeypatch:
        _patch(monkeypatch)
        run_online_bench(_config(), out=root / "online.json", workdir=root / "work")
    return json.loads((root / "online.json").read_text(encoding="utf-8")), root / "work"


def test_the_real_part_reports_ope_estimates_next_to_the_measured_figures(bench: tuple[dict[str, Any], Path]) -> None:
    results, work = bench
    real = results["real"]
    ope = real["ope"]
    assert ope["logged_by"] == "soft_q" and ope["greedy_targets"] is True and ope["bootstrap"] == 50
    assert "neither samples nor learns" in ope["note"]
    assert ope["seeds"] == list(SEEDS) and set(ope["per_seed"]) == {str(s) for s in SEEDS}
    for seed in SEEDS:
        entry = ope["per_seed"][str(seed)]
        measured = {name: float(np.mean([r.success for r in read_steps_jsonl(
            work / "real" / f"seed-{seed}" / name / "steps.jsonl")])) for name in ("soft_q", "similarity")}
        assert entry["rounds"] == STEPS and entry["k_max"] == 4 and entry["ope_s"] > 0
        assert entry["observed_mean_reward"] == pytest.approx(measured["soft_q"])  # 0/1 rewards: the success rate
        assert set(entry["targets"]) == {"greedy_soft_q", "similarity"}
        for target, policy in (("greedy_soft_q", "soft_q"), ("similarity", "similarity")):
            t = entry["targets"][target]
            assert t["measured_policy"] == policy and t["measured_overall"] == pytest.approx(measured[policy])
            assert set(t["estimates"]) == K1 | SLATE
            for estimator, r in t["estimates"].items():
                assert r["n"] == STEPS
                if r["value"] is None:  # SNIPS when no logged first choice is the target's: all weights 0
                    assert estimator == "snips" and r["ci_low"] is r["minus_measured"] is None
                    continue
                assert r["ci_low"] is not None and r["ci_low"] <= r["ci_high"]
                assert r["minus_measured"] == pytest.approx(r["value"] - t["measured_overall"])
    for target, policy in (("greedy_soft_q", "soft_q"), ("similarity", "similarity")):
        s = ope["summary"][target]
        assert s["measured_policy"] == policy
        assert s["measured_overall"] == pytest.approx(real["summary"][policy]["overall"])
        assert s["measured_per_seed"] == pytest.approx(real["summary"][policy]["overall_per_seed"])
        assert set(s["estimates"]) == K1 | SLATE
        for estimator, e in s["estimates"].items():
            per_seed = [ope["per_seed"][str(x)]["targets"][target]["estimates"][estimator] for x in SEEDS]
            assert e["value_per_seed"] == [r["value"] for r in per_seed]
            assert e["ci_per_seed"] == [[r["ci_low"], r["ci_high"]] for r in per_seed]
            if None in e["value_per_seed"]:  # a seed without a number: no mean
                assert e["value"] is e["minus_measured"] is None
                continue
            assert e["value"] == pytest.approx(np.mean(e["value_per_seed"]))
            assert e["minus_measured"] == pytest.approx(e["value"] - s["measured_overall"])
    table = format_online_table(results)
    assert "off-policy estimates from the soft_q run's log" in table
    assert "| greedy_soft_q | pi |" in table and "| similarity | dr |" in table
    assert "estimate - measured" in table and "sampled and learned online" in table


def test_no_ope_skips_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _patch(monkeypatch)

    def refuse(*_: Any, **__: Any) -> None:
        raise AssertionError("ope=False must not estimate")

    monkeypatch.setattr(online, "ope_from_soft_q_run", refuse)
    results = run_online_bench(_config(ope=False, steps=6, window=3, late_steps=3, seeds=(0,)),
                               out=tmp_path / "online.json", workdir=tmp_path / "work")
    assert "ope" not in results["real"] and "soft_q" in results["real"]["summary"]
    assert "off-policy" not in format_online_table(results)


def test_without_a_soft_q_run_ope_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _patch(monkeypatch)
    results = run_online_bench(_config(policies=("similarity",), steps=6, window=3, late_steps=3, seeds=(0,)),
                               out=tmp_path / "online.json", workdir=tmp_path / "work")
    assert "no soft_q run" in results["real"]["ope"]["skipped"]
    assert "off-policy estimates: skipped" in format_online_table(results)


def test_the_config_checks_ope_and_its_bootstrap() -> None:
    assert OnlineBenchConfig().ope is True and OnlineBenchConfig().ope_bootstrap == 200
    with pytest.raises(ConfigError, match="ope="):
        OnlineBenchConfig(ope="no")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="ope_bootstrap"):
        OnlineBenchConfig(ope_bootstrap=-1)
    assert OnlineBenchConfig(ope_bootstrap=0).ope_bootstrap == 0


@pytest.mark.parametrize(("flags", "ope", "resamples"), [([], True, 200), (["--no-ope"], False, 200),
                                                          (["--ope-bootstrap", "50"], True, 50)])
def test_the_cli_flags(flags: list[str], ope: bool, resamples: int, tmp_path: Path,
                       monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[OnlineBenchConfig] = []

    def fake(config: OnlineBenchConfig, **_: Any) -> dict[str, Any]:
        seen.append(config)
        return {"benchmark": "online"}

    monkeypatch.setattr("memento.cli.bench.run_online_bench", fake)
    assert main(["bench", "online", "--parts", "real", "--torch-threads", "0", "--json", str(tmp_path / "o.json"),
                 *flags]) == 0
    capsys.readouterr()
    assert [(c.ope, c.ope_bootstrap) for c in seen] == [(ope, resamples)]
