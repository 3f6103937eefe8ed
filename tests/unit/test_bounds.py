"""Resource bounds: every count, size and capacity a user can give is refused past its documented maximum
(memento/config.py's MAX_* table) in one line, before anything is allocated or written; the CLI checks are run in
a child process whose peak RSS is measured."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memento import config as C
from memento.config import (
    BankConfig,
    EncoderConfig,
    IndexConfig,
    LearnerConfig,
    QNetConfig,
    ReplayConfig,
    factory_problem,
    from_dict,
)
from memento.envs.textworld import TextWorldConfig
from memento.errors import ConfigError
from memento.policies import LinUCBConfig, SoftQConfig
from memento.runs.base import TaskOrder, task_order
from memento.runs.labels import LabelConfig
from memento.runs.qa import LoopConfig
from memento.runs.regret import MAX_REGRET_STEPS, RegretConfig
from memento.systems.runtime import SystemsConfig
from tests.fuzzing import FUZZ, examples, record

RSS_CEILING_KB = 1024 * 1024
"""A refused command's peak RSS (VmHWM): importing torch, transformers and faiss takes about 275 MB here; 1 GiB
leaves a margin and is far below what the refused values would allocate (the issue's run reached 19.7 GB)."""

HUGE = int("1" + "0" * 400)


def _refused(make: Any, field: str) -> str:
    with pytest.raises(ConfigError) as info:
        make()
    message = str(info.value)
    assert "\n" not in message and field in message and len(message) < 400, message
    return message


# (config factory taking the field's value, field name, maximum); the value at the bound is accepted
BOUNDS = [
    (lambda v: LoopConfig(steps=v), "steps", C.MAX_STEPS),
    (lambda v: LoopConfig(k=v, candidates=C.MAX_K), "k", C.MAX_K),
    (lambda v: LoopConfig(candidates=v), "candidates", C.MAX_CANDIDATES),
    (lambda v: LoopConfig(batch_size=v), "batch_size", C.MAX_BATCH),
    (lambda v: LoopConfig(window=v), "window", C.MAX_STEPS),
    (lambda v: LoopConfig(checkpoint_every=v), "checkpoint_every", C.MAX_STEPS),
    (lambda v: LoopConfig(seed=v), "seed", C.MAX_SEED),
    (lambda v: RegretConfig(steps=v), "steps", MAX_REGRET_STEPS),
    (lambda v: ReplayConfig(capacity=v, dim=4, k_max=1), "capacity", C.MAX_REPLAY_CAPACITY),
    (lambda v: ReplayConfig(capacity=8, dim=4, k_max=v), "k_max", C.MAX_K),
    (lambda v: ReplayConfig(capacity=8, dim=v), "dim", C.MAX_DIM),
    (lambda v: ReplayConfig(capacity=8, dim=4, c_max=v), "c_max", C.MAX_CANDIDATES),
    (lambda v: SoftQConfig(replay_capacity=v), "replay_capacity", C.MAX_REPLAY_CAPACITY),
    (lambda v: SoftQConfig(warmup=v), "warmup", C.MAX_STEPS),
    (lambda v: SoftQConfig(updates_per_step=v), "updates_per_step", C.MAX_UPDATES_PER_STEP),
    (lambda v: LearnerConfig(batch_size=v), "batch_size", C.MAX_BATCH),
    (lambda v: LearnerConfig(target_every=v), "target_every", C.MAX_STEPS),
    (lambda v: QNetConfig(hidden=v), "hidden", C.MAX_HIDDEN),
    (lambda v: QNetConfig(n_layers=v), "n_layers", C.MAX_LAYERS),
    (lambda v: QNetConfig(embed_dim=v), "embed_dim", C.MAX_HIDDEN),
    (lambda v: EncoderConfig(max_length=v), "max_length", C.MAX_TOKENS),
    (lambda v: EncoderConfig(batch_size=v), "batch_size", C.MAX_BATCH),
    (lambda v: IndexConfig(ef_search=v), "ef_search", C.MAX_EF_SEARCH),
    (lambda v: IndexConfig(nprobe=v), "nprobe", C.MAX_NLIST),
    (lambda v: BankConfig(dim=v), "dim", C.MAX_DIM),
    (lambda v: LinUCBConfig(dim=v), "dim", C.MAX_LINUCB_DIM),
    (lambda v: LabelConfig(candidates=v), "candidates", C.MAX_CANDIDATES),
    (lambda v: LabelConfig(k=v, candidates=C.MAX_K), "k", C.MAX_K),
    (lambda v: LabelConfig(sets=v), "sets", C.MAX_K_SETS),
    (lambda v: LabelConfig(batch_size=v), "batch_size", C.MAX_BATCH),
    (lambda v: LabelConfig(max_tasks=v), "max_tasks", C.MAX_STEPS),
    (lambda v: SystemsConfig(retries=v), "retries", C.MAX_RETRIES),
    (lambda v: TextWorldConfig(max_steps=v), "max_steps", C.MAX_GAME_STEPS),
]


@pytest.mark.parametrize(("make", "field", "maximum"), BOUNDS, ids=lambda v: v if isinstance(v, str) else None)
def test_each_bound_accepts_its_maximum_and_refuses_one_more(make: Any, field: str, maximum: int) -> None:
    make(maximum)
    message = _refused(lambda: make(maximum + 1), field)
    assert str(maximum) in message
    assert f"{field}=an integer of 401 digits:" in _refused(lambda: make(HUGE), field)  # shown by its size


def test_an_integer_too_long_to_print_is_refused_in_one_short_line() -> None:
    message = _refused(lambda: LoopConfig(steps=10**5000), "steps")
    assert len(message) < 200


def test_config_json_values_pass_the_same_bounds() -> None:
    _refused(lambda: from_dict(LoopConfig, {"steps": HUGE}), "steps")
    _refused(lambda: from_dict(LoopConfig, {"index": "IVF0,Flat"}), "index")
    _refused(lambda: from_dict(SoftQConfig, {"replay_capacity": 10**12}), "replay_capacity")


def test_a_replay_buffer_past_its_memory_budget_is_refused_before_allocation() -> None:
    ok = ReplayConfig(capacity=100_000, dim=384, k_max=4)
    assert ok.worst_case_bytes() < C.MAX_REPLAY_BYTES
    message = _refused(lambda: ReplayConfig(capacity=C.MAX_REPLAY_CAPACITY, dim=4096, k_max=64), "capacity")
    assert "GiB" in message


def test_a_saved_selector_config_with_a_huge_replay_capacity_is_refused() -> None:
    """What ``memento verify`` reads: the artifact's config converts through from_dict, whose ReplayConfig check
    refuses the capacity before a buffer is built."""
    from memento.selector.artifact import SelectorConfig

    data = C.to_dict(SelectorConfig(qnet=QNetConfig(dim=8), learner=LearnerConfig(),
                                    replay=ReplayConfig(capacity=16, dim=8, k_max=4), index=IndexConfig()))
    data["replay"]["capacity"] = 10**12
    _refused(lambda: from_dict(SelectorConfig, data), "capacity")


def test_qnet_parameter_budget() -> None:
    QNetConfig(dim=384, hidden=512)
    _refused(lambda: QNetConfig(dim=C.MAX_DIM, hidden=C.MAX_HIDDEN, n_layers=4), "hidden")


@pytest.mark.parametrize("factory", ["IVF0,Flat", "HNSW0,Flat", "HNSW1,Flat", "IVF99999999999,Flat",
                                     f"IVF{C.MAX_NLIST + 1},Flat", f"HNSW{C.MAX_HNSW_M + 1},Flat", "NSG0,Flat",
                                     "IVF16,PQ8x99", "PQ999999999", "IVF" + "9" * 5000 + ",Flat", "Flat" * 60,
                                     "", "  ", "IVF16,Flat\n"])
def test_bad_factories_are_refused_in_one_line(factory: str) -> None:
    assert factory_problem(factory) is not None
    message = _refused(lambda: IndexConfig(factory=factory), "factory")
    assert len(message) < 300


@pytest.mark.parametrize("factory", ["Flat", "HNSW32,Flat", "IVF1024,Flat", f"IVF{C.MAX_NLIST},Flat",
                                     f"HNSW{C.MAX_HNSW_M},Flat", "IVF16,PQ8x4", "OPQ16_64,IVF16,PQ16",
                                     "HNSW32_PQ8", "IVF16_HNSW32,Flat", "SQ8", "IDMap,Flat"])
def test_usual_factories_are_accepted(factory: str) -> None:
    assert factory_problem(factory) is None
    IndexConfig(factory=factory)


def test_faiss_refusals_and_failures_are_one_line() -> None:
    from memento.bank.index import FaissIndex

    for factory in ("PQ5", "LSH", "Flat,,"):  # faiss itself refuses these over dim 384
        _refused(lambda f=factory: FaissIndex(IndexConfig(factory=f), 384), "factory")


def test_task_order_is_drawn_one_pass_at_a_time() -> None:
    for n, steps, shuffle in ((10, 25, True), (3, 5, False), (7, 100, True), (1, 4, True)):
        eager = task_order(n, steps, np.random.SeedSequence(3), shuffle=shuffle)
        lazy = TaskOrder(n, steps, np.random.SeedSequence(3), shuffle=shuffle)
        assert [lazy[i] for i in range(steps)] == eager.tolist() == lazy[0:steps].tolist()
        assert lazy[3:9].tolist() == eager[3:9].tolist() and lazy[-1] == eager[-1]
    order = TaskOrder(50, C.MAX_STEPS, 0)  # the bound costs no memory: one pass is held
    assert len(order) == C.MAX_STEPS and 0 <= order[1234] < 50 and order._perm.nbytes == 50 * 8
    with pytest.raises(IndexError):
        order[C.MAX_STEPS]


# ---------------------------------------------------------------- the CLI, in a child process

_CHILD = """
import os, sys
from memento.cli.entry import main
try:
    code = main(sys.argv[1:])
finally:
    with open('/proc/self/status') as status:
        hwm = next(line for line in status if line.startswith('VmHWM'))
    with open(os.environ['MEMENTO_TEST_HWM'], 'w') as out:
        out.write(hwm.split()[1])
sys.exit(code)
"""


def _memento(tmp_path: Path, *argv: str) -> tuple[int, list[str], int]:
    """Run ``memento ARGV`` in a child; (exit code, stderr lines, peak RSS in kB)."""
    hwm = tmp_path / "hwm"
    env = {**os.environ, "MEMENTO_TEST_HWM": str(hwm), "CUDA_VISIBLE_DEVICES": os.environ.get(
        "CUDA_VISIBLE_DEVICES", "")}
    done = subprocess.run([sys.executable, "-c", _CHILD, *argv], capture_output=True, text=True, env=env,
                          timeout=300, cwd=tmp_path)
    return done.returncode, done.stderr.strip().splitlines(), int(hwm.read_text())


@pytest.fixture
def tasks(tmp_path: Path) -> Path:
    path = tmp_path / "tasks.jsonl"
    path.write_text('{"id": "t1", "question": "What is 2+2?", "answers": ["4"]}\n', encoding="utf-8")
    return path


ONLINE_REFUSALS = [
    (("--steps", "1" + "0" * 400), "LoopConfig.steps="),
    (("--torch-threads", "100000"), "--torch-threads=100000"),
    (("--index", "IVF0,Flat"), "IVF lists"),
    (("--index", "HNSW0,Flat"), "HNSW M"),
    (("--index", "IVF99999999999,Flat"), "IVF lists"),
    (("--candidates", str(C.MAX_CANDIDATES + 1)), "LoopConfig.candidates="),
    (("--workers", "100000"), "--workers=100000"),
]


@pytest.mark.parametrize(("flags", "expected"), ONLINE_REFUSALS, ids=lambda v: v[0] if isinstance(v, tuple) else None)
def test_online_refusals_in_process(tmp_path: Path, tasks: Path, capsys: pytest.CaptureFixture[str],
                                    flags: tuple[str, ...], expected: str) -> None:
    from memento.cli.entry import main

    out = tmp_path / "out"
    code = main(["online", "--tasks", str(tasks), "--planner", "openai:m@http://127.0.0.1:9", "--out", str(out),
                 *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("memento: error: ") and expected in err[0], err
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.probe
@pytest.mark.parametrize(("flags", "expected"), ONLINE_REFUSALS, ids=lambda v: v[0] if isinstance(v, tuple) else None)
def test_online_refuses_absurd_sizes_in_one_line_without_allocating(tmp_path: Path, tasks: Path,
                                                                    flags: tuple[str, ...], expected: str) -> None:
    out = tmp_path / "out"
    code, err, rss_kb = _memento(tmp_path, "online", "--tasks", str(tasks), "--planner",
                                 "openai:m@http://127.0.0.1:9", "--out", str(out), *flags)
    record(__name__, "inputs")
    assert code == 2 and len(err) == 1 and err[0].startswith("memento: error: ") and expected in err[0], err
    assert len(err[0]) < 300
    assert not out.exists()
    assert rss_kb < RSS_CEILING_KB, f"peak RSS {rss_kb} kB"


@pytest.mark.slow
@pytest.mark.parametrize("factory", ["IVF0,Flat", "HNSW0,Flat", "IVF99999999999,Flat", f"HNSW{10**6},Flat"])
def test_bank_create_refuses_absurd_factories(tmp_path: Path, factory: str) -> None:
    where = tmp_path / "bank"
    code, err, rss_kb = _memento(tmp_path, "bank", "create", "--bank", str(where), "--dim", "8", "--index", factory)
    assert code == 2 and len(err) == 1 and "--index" in err[0] and "must be in" in err[0], err
    assert not where.exists()
    assert rss_kb < RSS_CEILING_KB, f"peak RSS {rss_kb} kB"


@pytest.mark.slow
def test_device_cuda_without_cuda_is_one_line(tmp_path: Path, tasks: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    out = tmp_path / "out"
    code, err, _ = _memento(tmp_path, "online", "--tasks", str(tasks), "--planner", "openai:m@http://127.0.0.1:9",
                            "--out", str(out), "--device", "cuda")
    assert code == 2 and err == ["memento: error: --device cuda: no CUDA device is available "
                                 "(torch.cuda.is_available() is False); use --device cpu or auto"], err
    assert not out.exists()


def test_bank_create_refusal_in_process(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from memento.cli.entry import main

    where = tmp_path / "bank"
    assert main(["bank", "create", "--bank", str(where), "--dim", "8", "--index", "IVF99999999999,Flat"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "IVF lists" in err[0] and not where.exists(), err


def test_check_device_for_every_command_that_takes_it() -> None:
    import torch

    from memento.flags import check_device

    for ok in (None, "auto", "cpu"):
        check_device(ok)
    for bad in ("gpu", "cuda:x", "tpu"):
        with pytest.raises(ConfigError, match="--device"):
            check_device(bad)
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="^--device cuda:1: no CUDA device"):
            check_device("cuda:1")


# ---------------------------------------------------------------- fuzz: the numeric flags of memento online

_NUMERIC = {  # flag -> (inclusive range the command accepts)
    "--steps": (1, C.MAX_STEPS), "--k": (1, C.MAX_K), "--candidates": (1, C.MAX_CANDIDATES),
    "--batch-size": (1, C.MAX_BATCH), "--window": (1, C.MAX_STEPS), "--checkpoint-every": (0, C.MAX_STEPS),
    "--late-steps": (1, C.MAX_STEPS), "--torch-threads": (0, C.MAX_THREADS), "--warmup": (0, C.MAX_STEPS),
    "--updates-per-step": (0, C.MAX_UPDATES_PER_STEP), "--seed": (0, C.MAX_SEED),
}


@settings(FUZZ, max_examples=examples(25))
@given(flag=st.sampled_from(sorted(_NUMERIC)),
       value=st.one_of(st.integers(-5, 5), st.integers(-2**70, 2**70), st.integers(10**399, 10**401),
                       st.sampled_from([C.MAX_K, C.MAX_K + 1, C.MAX_STEPS, C.MAX_STEPS + 1, C.MAX_THREADS + 1,
                                        C.MAX_CANDIDATES + 1, C.MAX_SEED + 1])))
@pytest.mark.probe
def test_fuzz_online_numeric_flags(flag: str, value: int) -> None:
    """Parse and check the flags as ``memento online`` does before it loads anything: a value in range is accepted,
    any other is one ConfigError line naming the flag's field, of bounded length."""
    from memento.cli import online
    from memento.cli.entry import build_parser
    from memento.flags import check_count, check_torch_threads, option_value

    record(__name__, "inputs")
    argv = ["online", "--tasks", "t.jsonl", "--planner", "openai:m@http://127.0.0.1:9", "--out", "o",
            flag, str(value)]
    if flag == "--k":
        argv += ["--candidates", str(C.MAX_CANDIDATES)]
    args = build_parser().parse_args(argv)
    low, high = _NUMERIC[flag]
    field = flag.lstrip("-").replace("-", "_")
    try:
        check_torch_threads(args)
        check_count("--late-steps", option_value(args, online.OnlineCommandConfig, "late_steps"), 1, C.MAX_STEPS)
        soft_q = online.soft_q_config(args)
        config = online.loop_config(args, policy=soft_q)
    except ConfigError as error:
        message = str(error)
        assert not low <= value <= high, message
        assert "\n" not in message and len(message) < 300 and (field in message or flag in message), message
        return
    assert low <= value <= high
    assert dataclasses.is_dataclass(config)
