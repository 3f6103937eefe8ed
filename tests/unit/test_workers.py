"""Ray rollout workers of the online loop (``memento online --workers N``, :mod:`memento.runs.ray`).

One local Ray for the module. The runs use the synthetic text environment of ``tests/loop_env.py`` (a planner that
copies the format of the cases it is shown, a hashing encoder) or, through the CLI, the shipped suite with an
OpenAI-compatible planner on a loopback server. Each test checks one promise of the module docstring:
end to end through the CLI, the same transitions from the same seed, a worker killed with SIGKILL, a driver killed
with SIGKILL and resumed, and the one-line error without the ``ray`` extra.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import ray  # the dev extra (`make test`) installs it: these tests run in CI, they never skip

from memento.cli.entry import main
from memento.config import from_dict, to_dict
from memento.errors import ConfigError
from memento.formats import read_steps_jsonl
from memento.planners.base import CallablePlanner
from memento.policies import loop_policy, make_policy
from memento.runs.qa import LoopConfig
from memento.runs.ray import RayOnlineLoop, WorkersConfig, import_ray, read_workers_log
from memento.runs.rundir import RunDir
from tests.loop_env import ExactJudge, HashingEncoder, make_env

ROOT = Path(__file__).resolve().parents[2]
VOLATILE = ("time", "ms")  # what a rerun does not reproduce (module docstring of memento.runs.ray)
CONFIG = LoopConfig(steps=24, k=2, candidates=8, checkpoint_every=6, tensorboard=False, seed=3, window=6,
                    policy=loop_policy("soft_q"))


@pytest.fixture(scope="module", autouse=True)
def _ray():
    ray.init(num_cpus=4, include_dashboard=False, logging_level="ERROR")
    yield
    ray.shutdown()


def _killing_planner(marker: str, after: int, delay_s: float):
    """The environment's planner, except that the worker process making its ``after``-th call first kills itself
    with SIGKILL (once per test: ``marker`` is created atomically by the one that does)."""
    env = make_env()
    inner = env.planner(delay_s)
    calls = {"n": 0}

    def plan(task, cases):
        calls["n"] += 1
        if calls["n"] == after:
            try:
                os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                pass
            else:
                os.kill(os.getpid(), signal.SIGKILL)
        return inner.plan(task, cases).text

    return CallablePlanner(plan, name="format-copying")


def _run(out: Path, *, planner=None, workers: int = 2, resume: bool = False, config: LoopConfig = CONFIG) -> dict:
    env = make_env()
    loop = RayOnlineLoop(config, workers=WorkersConfig(workers=workers, max_restarts=2),
                         planner=planner if planner is not None else env.planner(), judge=ExactJudge(),
                         make_policy=make_policy, encoder=HashingEncoder(), tasks=env.tasks,
                         seed_cases=env.seed_cases, out_dir=out, resume=resume)
    return loop.run()


def _transitions(path: Path) -> list[dict]:
    return [{k: v for k, v in r.to_json().items() if k not in VOLATILE} for r in read_steps_jsonl(path)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("reference") / "run"
    _run(out)
    return out


# ---------------------------------------------------------------- the transitions


def test_a_run_logs_each_transition_once_with_the_snapshot_that_chose_it(reference):
    records = read_steps_jsonl(reference / "steps.jsonl")
    assert [r.step for r in records] == list(range(CONFIG.steps))
    for r in records:  # what off-policy evaluation needs, from the worker's snapshot
        assert r.candidate_probs is not None and len(r.candidate_probs) == len(r.candidate_ids)
        assert abs(sum(r.candidate_probs) - 1.0) < 1e-6
        assert len(r.propensities) == len(r.chosen_ids) == CONFIG.k and 0 < r.set_propensity <= 1
    rows = read_workers_log(reference)
    assert [row["step"] for row in rows] == list(range(CONFIG.steps))
    assert {row["worker"] for row in rows} == {0, 1} and {row["attempt"] for row in rows} == {1}
    for r, row in zip(records, rows):
        assert row["policy_version"] == r.policy_version
        assert row["staleness"] == row["learner_version"] - row["policy_version"] >= 0
    summary = json.loads((reference / "summary.json").read_text())
    assert summary["steps"] == summary["llm_calls"] == CONFIG.steps and summary["updates"] > 0
    assert summary["workers"]["workers"] == 2 and summary["workers"]["restarts"] == 0
    assert max(r.policy_version for r in records) > 0  # snapshots followed the learner
    info = json.loads((reference / "run.json").read_text())
    assert info["workers"]["workers"] == 2 and info["planner"].startswith("RayWorkers(2 x ")


def test_same_seed_and_workers_give_the_same_transitions(reference, tmp_path):
    _run(tmp_path / "again")
    assert _transitions(tmp_path / "again" / "steps.jsonl") == _transitions(reference / "steps.jsonl")
    again = json.loads((tmp_path / "again" / "summary.json").read_text())
    first = json.loads((reference / "summary.json").read_text())
    assert again["updates"] == first["updates"] and again["bank_size_end"] == first["bank_size_end"]


def test_a_worker_killed_with_sigkill_is_restarted_and_nothing_is_counted_twice(reference, tmp_path):
    planner = _killing_planner(str(tmp_path / "killed"), after=5, delay_s=0.02)
    summary = _run(tmp_path / "run", planner=planner)
    assert (tmp_path / "killed").exists()  # a worker did die
    assert summary["workers"]["restarts"] == 1 and summary["workers"]["resubmitted"] == 1
    records = read_steps_jsonl(tmp_path / "run" / "steps.jsonl")
    assert [r.step for r in records] == list(range(CONFIG.steps))  # every transition id exactly once
    assert summary["steps"] == summary["llm_calls"] == CONFIG.steps
    rows = read_workers_log(tmp_path / "run")
    assert sorted(row["attempt"] for row in rows) == [1] * (CONFIG.steps - 1) + [2]
    # the unit was sent again unchanged: the run is the run without the kill
    assert _transitions(tmp_path / "run" / "steps.jsonl") == _transitions(reference / "steps.jsonl")


# ---------------------------------------------------------------- a driver killed and resumed


def _driver(argv: list[str]) -> int:
    """``python -m tests.unit.test_workers OUT CONFIG [--resume] [--delay S]``: one run with 2 workers."""
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("config")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--delay", type=float, default=0.0)
    args = parser.parse_args(argv)
    with import_ray().init(num_cpus=4, include_dashboard=False, logging_level="ERROR"):
        _run(Path(args.out), planner=make_env().planner(args.delay), resume=args.resume,
             config=from_dict(LoopConfig, json.loads(args.config)))
    return 0


def test_a_driver_killed_with_sigkill_resumes_without_losing_a_committed_transition(reference, tmp_path):
    out = tmp_path / "run"
    steps = out / "steps.jsonl"
    driver = subprocess.Popen([sys.executable, "-m", "tests.unit.test_workers", str(out),
                               json.dumps(to_dict(CONFIG)), "--delay", "0.15"], cwd=ROOT, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and driver.poll() is None:
            state = out / "checkpoint" / "state.json"
            if state.is_file() and steps.is_file() and len(steps.read_text().splitlines()) >= 9:
                break
            time.sleep(0.05)
        assert driver.poll() is None, driver.stderr.read().decode()[-2000:] if driver.stderr else ""
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=30)
    finally:
        try:  # the driver's local Ray processes share its session: end them with it
            os.killpg(driver.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        driver.wait(timeout=30)
    logged = [json.loads(line) for line in steps.read_text().splitlines() if line.endswith("}")]
    ckpt = RunDir(out).latest_checkpoint()  # the one --resume takes (a swap may have been cut short)
    assert ckpt is not None
    committed = [json.loads(line) for line in (ckpt / "steps.jsonl").read_text().splitlines()]
    assert 6 <= len(committed) < CONFIG.steps and len(logged) >= len(committed)

    summary = _run(out, resume=True)
    assert summary["resumed_from"] == len(committed)
    # the worker figures cover the whole run (the checkpoint's and the resumed driver's), not the last process
    first = json.loads((reference / "summary.json").read_text())["workers"]
    assert summary["workers"]["transitions"] == CONFIG.steps and summary["workers"]["processes"] == 2
    assert summary["workers"]["staleness_mean"] == pytest.approx(first["staleness_mean"])
    assert summary["workers"]["staleness_max"] == first["staleness_max"] and summary["workers"]["restarts"] == 0
    # ... but the rate is this process's (memento.runs.ray.steady_rate): the transitions it committed over its own
    # time (issue 40: the whole run's count over the last process's time gave 87.3 tasks/s for 12.3)
    assert summary["workers"]["process_transitions"] == CONFIG.steps - len(committed)
    assert summary["workers"]["tasks_per_s"] is None or summary["workers"]["tasks_per_s"] > 0
    final = [r.to_json() for r in read_steps_jsonl(steps)]
    assert [r["step"] for r in final] == list(range(CONFIG.steps))  # none lost, none twice
    assert final[:len(committed)] == committed  # the committed transitions, byte for byte
    strip = [{k: v for k, v in r.items() if k not in VOLATILE} for r in final]
    assert strip[:len(logged)] == [{k: v for k, v in r.items() if k not in VOLATILE} for r in logged]
    assert strip == _transitions(reference / "steps.jsonl")  # as if never killed
    assert [row["step"] for row in read_workers_log(out)] == list(range(CONFIG.steps))


# ---------------------------------------------------------------- the CLI


def test_memento_online_with_two_workers_runs_the_shipped_suite_end_to_end(tmp_path, capsys):
    from memento.bench.online import fixed_latency_openai

    suite = ROOT / "data" / "facts"
    out = tmp_path / "out"
    with fixed_latency_openai(5.0, reply="Paris", process=False) as url:
        argv = ["online", "--tasks", str(suite / "test.jsonl"), "--cases", str(suite / "cases.jsonl"),
                "--planner", f"openai:fake@{url}", "--policy", "soft_q,similarity", "--steps", "12", "--k", "2",
                "--candidates", "8", "--checkpoint-every", "4", "--warmup", "1", "--window", "4", "--late-steps", "4",
                "--workers", "2", "--sync-every", "2", "--out", str(out), "--no-progress"]
        assert main(argv) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert "soft_q" in printed and "similarity" in printed
    comparison = json.loads((out / "comparison.json").read_text())
    assert comparison["order"] == ["soft_q", "similarity"]
    for policy in ("soft_q", "similarity"):
        summary = json.loads((out / policy / "summary.json").read_text())
        assert summary["steps"] == summary["llm_calls"] == 12 and summary["workers"]["workers"] == 2
        assert [r.step for r in read_steps_jsonl(out / policy / "steps.jsonl")] == list(range(12))
        assert json.loads((out / policy / "checkpoint" / "state.json").read_text())["step"] == 12
        assert json.loads((out / policy / "run.json").read_text())["workers"]["sync_every"] == 2
    assert (out / "soft_q" / "selector" / "learner.safetensors").is_file()
    versions = [r.policy_version for r in read_steps_jsonl(out / "soft_q" / "steps.jsonl")]
    assert versions == sorted(versions) and versions[-1] > 0


def test_worker_flags_are_checked_before_anything_runs(tmp_path, capsys):
    suite = ROOT / "data" / "facts"
    base = ["online", "--tasks", str(suite / "test.jsonl"), "--cases", str(suite / "cases.jsonl"),
            "--planner", "openai:m@http://127.0.0.1:9/v1", "--out", str(tmp_path / "out")]
    for extra, message in ((["--workers", "0"], "--workers=0"),
                           (["--ray-address", "auto"], "--ray-address is for rollout workers"),
                           (["--workers", "2", "--policy", "linucb"], "runs in-process only"),
                           (["--workers", "2", "--sync-every", "0"], "sync_every")):
        assert main(base + extra) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
    assert not (tmp_path / "out").exists()


def test_without_the_ray_extra_one_line_names_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now fails as if it were not installed
    with pytest.raises(ConfigError, match=r"-e '\.\[ray\]'"):
        import_ray()
    suite = ROOT / "data" / "facts"
    code = main(["online", "--tasks", str(suite / "test.jsonl"), "--cases", str(suite / "cases.jsonl"),
                 "--planner", "openai:m@http://127.0.0.1:9/v1", "--workers", "2", "--out", str(tmp_path / "out")])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install -e '.[ray]'" in err[0], err


def test_the_benchmark_pieces_without_ray():
    import pickle

    from memento.bench.online import OnlineBenchConfig, SyntheticTextEnv

    env = SyntheticTextEnv.create(20, seed=1)
    assert len({t.question for t in env.tasks}) == 20 and env.encoder.encode([env.tasks[0].question]).shape == (1, 32)
    cases = env.seed_cases[:4]
    first = [env.planner.plan(task, cases).text for task in env.tasks]
    shipped = pickle.loads(pickle.dumps(env.planner))  # what a worker receives: the config, not the world
    assert shipped._env is None and [shipped.plan(task, cases).text for task in env.tasks] == first
    assert set(first) <= {"0", "1"}
    with pytest.raises(ConfigError, match="workers"):
        OnlineBenchConfig(workers=(1, 1))
    with pytest.raises(ConfigError, match="parts"):
        OnlineBenchConfig(parts=("workerz",))


def test_workers_config_is_validated():
    with pytest.raises(ConfigError, match="WorkersConfig.workers"):
        WorkersConfig(workers=0)
    from memento.config import MAX_WORKERS

    with pytest.raises(ConfigError, match=rf"WorkersConfig.workers.*<= {MAX_WORKERS}"):
        WorkersConfig(workers=MAX_WORKERS + 1)
    with pytest.raises(ConfigError, match="WorkersConfig.workers"):
        WorkersConfig(workers=10**100)  # one line, no OverflowError
    assert WorkersConfig(workers=MAX_WORKERS).workers == MAX_WORKERS
    with pytest.raises(ConfigError, match="WorkersConfig.address"):
        WorkersConfig(address=" ")
    assert WorkersConfig().sync_every == 1


if __name__ == "__main__":  # the driver of the driver-kill test
    sys.exit(_driver(sys.argv[1:]))
