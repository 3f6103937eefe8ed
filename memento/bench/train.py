"""``memento bench train``: soft-Q learner throughput with cached embeddings, and replay-buffer latency.

Training: a replay buffer is filled with random decisions (unit-norm state and K case vectors,
binary rewards, propensities), then for each Q-network architecture a fresh
:class:`~memento.learn.learner.SoftQLearner` (single-step BCE, ``gamma = 0``, target update every
step) runs ``steps`` iterations of ``buffer.sample(B)`` + ``learner.update(batch)`` after a few
warm-up steps. Throughput counts (state, case, reward) samples: each decision of a batch
contributes its K pairs, so one step trains ``B * K`` samples (decisions/s is reported too).

Replay: the p50/p99 latency (microseconds) of ``add`` of one :class:`~memento.learn.replay.Transition`
(and of building that checked Transition), ``add_batch`` of B decisions and ``sample(B)``.

Everything runs on ``device`` (``auto``: CUDA when present, else CPU), which is recorded. Each
way of training is one ``Trainer`` value timed by its own function (:func:`time_training`
dispatches with ``match``), so another trainer adds a value and a function, and its rows sit
beside the plain loop's in the same table.

The pieces of the measurement are public so that another trainer's benchmark (``memento bench train --lightning``,
:mod:`memento.training.bench`) runs the same one: :func:`resolve_device`, :func:`torch_environment`,
:func:`filled_buffer`, :func:`time_training`, :func:`time_replay`, :func:`sync_device` and :func:`percentiles_ms`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import platform
import time
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np

from memento.bench.common import distinct_choices, finish, timestamp, write_results
from memento.config import (
    MAX_BATCH,
    MAX_BENCH_BYTES,
    MAX_BENCH_ITEMS,
    MAX_BENCH_VECTORS,
    MAX_DIM,
    MAX_HIDDEN,
    MAX_K,
    MAX_REPLAY_CAPACITY,
    MAX_SEED,
    MAX_THREADS,
    LearnerConfig,
    QNetArch,
    QNetConfig,
    ReplayConfig,
    check,
    check_choice,
    check_ints,
)
from memento.errors import ConfigError
from memento.learn.learner import SoftQLearner
from memento.learn.qnet import build_qnet
from memento.learn.replay import ReplayBuffer, Transition

__all__ = ["Trainer", "TrainBenchConfig", "filled_buffer", "format_table", "percentiles_ms", "resolve_device",
           "run_train_bench", "sync_device", "time_replay", "time_training", "torch_environment"]

logger = logging.getLogger(__name__)

Trainer = Literal["plain"]  # "plain": SoftQLearner.update in a Python loop
BenchDevice = Literal["auto", "cpu", "cuda"]

_FILL_CHUNK = 10_000


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainBenchConfig:
    """What ``memento bench train`` measures.

    - ``archs``: Q-network architectures (``hidden`` units); ``trainers``: ways of training;
    - ``batch_size``: B decisions per update, each with ``k`` cases (B * K samples);
    - ``steps``: timed updates after ``warmup_steps`` untimed ones;
    - ``dim``: embedding dimension; ``buffer_size``: decisions in the (full) replay buffer;
    - ``bank_cases``: a second buffer's cases are drawn from a bank of this many vectors;
    - ``replay_reps``: timed repetitions of each replay operation;
    - ``device``: ``auto`` (CUDA when present), ``cpu`` or ``cuda``;
    - ``torch_threads``: torch intra-op threads (0: torch's default, one per core).
    """

    archs: tuple[QNetArch, ...] = dataclasses.field(default=("mlp", "mlp_interact", "two_tower"), metadata={"help": (
        "Q-network architectures")})
    trainers: tuple[Trainer, ...] = ("plain",)
    batch_size: int = dataclasses.field(default=256, metadata={"help": "decisions per update"})
    k: int = dataclasses.field(default=4, metadata={"help": "cases per decision"})
    steps: int = dataclasses.field(default=200, metadata={"help": "timed updates per architecture"})
    warmup_steps: int = 10
    dim: int = dataclasses.field(default=384, metadata={"help": "embedding dimension"})
    hidden: int = 512
    buffer_size: int = dataclasses.field(default=100_000, metadata={"help": "decisions in the replay buffer"})
    bank_cases: int = dataclasses.field(default=10_000, metadata={"help": (
        "a second buffer draws its cases from a bank of this many vectors")})
    replay_reps: int = 200
    device: BenchDevice = dataclasses.field(default="auto", metadata={"help": (
        "where to train (auto: CUDA when present)")})
    torch_threads: int = dataclasses.field(default=0, metadata={"help": "torch threads (0: torch's default)"})
    seed: int = dataclasses.field(default=0, metadata={"help": "random seed"})

    def __post_init__(self) -> None:
        check_ints(self, batch_size=(1, MAX_BATCH), k=(1, MAX_K), steps=(1, MAX_BENCH_ITEMS), dim=(1, MAX_DIM),
                   hidden=(1, MAX_HIDDEN), buffer_size=(1, MAX_REPLAY_CAPACITY), bank_cases=(1, MAX_BENCH_VECTORS),
                   replay_reps=(1, MAX_BENCH_ITEMS))
        check_ints(self, warmup_steps=(0, MAX_BENCH_ITEMS), torch_threads=(0, MAX_THREADS), seed=(0, MAX_SEED))
        check(self.bank_cases * self.dim * 4 <= MAX_BENCH_BYTES, type(self), "bank_cases", self.bank_cases,
              f"a bank of {self.bank_cases} x dim={self.dim} float32 vectors is over {MAX_BENCH_BYTES // 2**30} GiB")
        ReplayConfig(capacity=self.buffer_size, dim=self.dim, k_max=self.k)  # its memory bound, before allocating
        check(distinct_choices(self.archs, QNetArch), type(self), "archs", self.archs,
              f"need distinct values from {get_args(QNetArch)}")
        check(distinct_choices(self.trainers, Trainer), type(self), "trainers", self.trainers,
              f"need distinct values from {get_args(Trainer)}")
        check_choice(self, "device", BenchDevice)


def resolve_device(config: TrainBenchConfig) -> Any:
    """The ``torch.device`` of ``config.device`` (``auto``: CUDA when present, else CPU); ``cuda`` without a CUDA
    device is a ``ConfigError``."""
    import torch

    if config.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("TrainBenchConfig.device='cuda': no CUDA device is available (use 'auto' or 'cpu')")
    if config.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(config.device)


def sync_device(device: Any) -> None:
    """Wait for the work queued on ``device`` (CUDA; nothing to wait for on the CPU), before reading a clock."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def torch_environment(device: Any) -> dict[str, Any]:
    """The results document's ``environment``: Python, the machine, its CPUs, numpy and torch with its thread
    count, the device (with the CUDA device's name) and the load average at the start."""
    import torch

    env = {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
           "numpy": np.__version__, "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
           "device": str(device), "loadavg_start": list(os.getloadavg())}
    if device.type == "cuda":
        env["cuda_device"] = torch.cuda.get_device_name(device)
    return env


def _unit(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    x = rng.standard_normal(shape, dtype=np.float32)
    x /= np.linalg.norm(x, axis=-1, keepdims=True)
    return x


def _random_batch(rng: np.random.Generator, b: int, config: TrainBenchConfig) -> dict[str, np.ndarray]:
    return {"state_BD": _unit(rng, (b, config.dim)), "cases_BKD": _unit(rng, (b, config.k, config.dim)),
            "reward_B": (rng.random(b) < 0.5).astype(np.float32),
            "propensity_BK": rng.uniform(0.05, 1.0, (b, config.k)).astype(np.float32)}


def filled_buffer(config: TrainBenchConfig, device: Any, rng: np.random.Generator) -> tuple[Any, float]:
    """A replay buffer holding ``buffer_size`` random decisions; also the fill time in seconds."""

    buffer = ReplayBuffer(ReplayConfig(capacity=config.buffer_size, dim=config.dim, k_max=config.k), device=device)
    fill_s = 0.0
    for start in range(0, config.buffer_size, _FILL_CHUNK):
        batch = _random_batch(rng, min(_FILL_CHUNK, config.buffer_size - start), config)
        t0 = time.perf_counter()
        buffer.add_batch(**batch)
        sync_device(device)
        fill_s += time.perf_counter() - t0
    return buffer, fill_s


def percentiles_ms(seconds: list[float]) -> dict[str, float]:
    """``{"p50_ms", "p99_ms"}``: the median and 99th percentile of durations in seconds, in milliseconds."""
    ms = np.array(seconds) * 1e3
    return {"p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99))}


def _time_plain(arch: QNetArch, buffer: Any, config: TrainBenchConfig, device: Any) -> dict[str, Any]:
    """``buffer.sample`` + ``SoftQLearner.update`` in a plain Python loop."""
    import torch

    qnet = build_qnet(QNetConfig(arch=arch, dim=config.dim, hidden=config.hidden, seed=config.seed))
    learner = SoftQLearner(qnet, LearnerConfig(batch_size=config.batch_size, seed=config.seed), device=device)
    generator = torch.Generator(device=device).manual_seed(config.seed)
    for _ in range(config.warmup_steps):
        learner.update(buffer.sample(config.batch_size, generator))
    sample_s: list[float] = []
    update_s: list[float] = []
    pairs = 0.0
    metrics: dict[str, float] = {}
    sync_device(device)
    start = time.perf_counter()
    for _ in range(config.steps):
        t0 = time.perf_counter()
        batch = buffer.sample(config.batch_size, generator)
        sync_device(device)
        t1 = time.perf_counter()
        metrics = learner.update(batch)  # returns floats: the step is finished on the device
        t2 = time.perf_counter()
        sample_s.append(t1 - t0)
        update_s.append(t2 - t1)
        pairs += metrics["pairs"]
    seconds = time.perf_counter() - start
    sample, update = percentiles_ms(sample_s), percentiles_ms(update_s)
    return {"params": sum(p.numel() for p in learner.qnet.parameters()), "seconds": seconds,
            "samples": int(pairs), "samples_per_s": pairs / seconds,
            "decisions_per_s": config.steps * config.batch_size / seconds,
            "sample_p50_ms": sample["p50_ms"], "update_p50_ms": update["p50_ms"], "update_p99_ms": update["p99_ms"],
            "final_loss": metrics["loss"]}


def time_training(trainer: Trainer, arch: QNetArch, buffer: Any, config: TrainBenchConfig,
                  device: Any) -> dict[str, Any]:
    """One row of the training table: ``trainer`` training a fresh ``arch`` Q-network on ``buffer``."""
    match trainer:
        case "plain":
            timing = _time_plain(arch, buffer, config, device)
        case _:  # pragma: no cover - TrainBenchConfig rejects other values
            raise ConfigError(f"unknown trainer {trainer!r}")
    return {"trainer": trainer, "arch": arch, "device": str(device), "batch_size": config.batch_size, "k": config.k,
            "steps": config.steps, **timing}


def _us(seconds: list[float]) -> dict[str, float]:
    us = np.array(seconds) * 1e6
    return {"p50_us": float(np.percentile(us, 50)), "p99_us": float(np.percentile(us, 99))}


def _timed(prepare: Any, operation: Any, reps: int, device: Any) -> dict[str, float]:
    """p50/p99 µs of ``operation(prepare())``; ``prepare`` (fresh input each time) is not timed."""
    for _ in range(10):  # warm-up
        operation(prepare())
    sync_device(device)
    seconds = []
    for _ in range(reps):
        args = prepare()
        t0 = time.perf_counter()
        operation(args)
        sync_device(device)
        seconds.append(time.perf_counter() - t0)
    return _us(seconds)


def _materialize(batch: Any) -> None:
    batch.state_BD, batch.cases_BKD  # noqa: B018 - reading them gathers the vectors


def _bank_buffer(config: TrainBenchConfig, device: Any, rng: np.random.Generator) -> Any:
    """``buffer_size`` decisions whose cases come from a bank of ``bank_cases`` vectors (as online runs have)."""
    bank_ND = _unit(rng, (config.bank_cases, config.dim))
    buffer = ReplayBuffer(ReplayConfig(capacity=config.buffer_size, dim=config.dim, k_max=config.k), device=device)
    for start in range(0, config.buffer_size, _FILL_CHUNK):
        batch = _random_batch(rng, min(_FILL_CHUNK, config.buffer_size - start), config)
        batch["cases_BKD"] = bank_ND[rng.integers(0, config.bank_cases, batch["cases_BKD"].shape[:2])]
        buffer.add_batch(**batch)
    return buffer


def time_replay(buffer: Any, config: TrainBenchConfig, device: Any, rng: np.random.Generator) -> dict[str, Any]:
    """p50/p99 µs of Transition(...), add(one), add_batch(B), sample(B) and sample(B) with its vectors gathered,
    on the filled buffer (fresh random input for each add), and the two samples on a buffer whose cases come
    from a bank of ``bank_cases``."""
    import torch

    def fields() -> dict[str, Any]:
        one = _random_batch(rng, 1, config)
        return {"state_D": one["state_BD"][0], "cases_KD": one["cases_BKD"][0], "reward": float(one["reward_B"][0]),
                "propensity_K": one["propensity_BK"][0]}

    b = config.batch_size
    generator = torch.Generator(device=device).manual_seed(config.seed)
    bank_buffer = _bank_buffer(config, device, rng)
    operations: dict[str, tuple[Any, Any]] = {
        "transition": (fields, lambda f: Transition(**f)),
        "add": (lambda: Transition(**fields()), buffer.add),
        f"add_batch({b})": (lambda: _random_batch(rng, b, config), lambda batch: buffer.add_batch(**batch)),
        f"sample({b})": (lambda: None, lambda _: buffer.sample(b, generator)),
        f"sample({b}) + vectors": (lambda: None, lambda _: _materialize(buffer.sample(b, generator))),
        f"sample({b}), bank of {config.bank_cases:,} cases": (lambda: None, lambda _: bank_buffer.sample(b, generator)),
        f"sample({b}) + vectors, bank of {config.bank_cases:,} cases":
            (lambda: None, lambda _: _materialize(bank_buffer.sample(b, generator))),
    }
    out: dict[str, Any] = {name: _timed(prepare, operation, config.replay_reps, device)
                           for name, (prepare, operation) in operations.items()}
    out.update(_anchors(config))
    rows = {"random cases": buffer.table_rows(), f"bank of {config.bank_cases:,} cases": bank_buffer.table_rows()}
    return {"operations": out, "table_rows": rows}


def _anchors(config: TrainBenchConfig) -> dict[str, Any]:
    """``sample(B)`` of Stable-Baselines3's and TorchRL's replay buffers, when installed, over ``buffer_size``
    rows of 4 floats (small observations, as they are usually quoted) and of (1 + K) * dim floats (the
    vectors of one decision here), on the CPU."""
    import torch

    widths = {"4 floats": 4, f"{(1 + config.k) * config.dim} floats": (1 + config.k) * config.dim}
    out: dict[str, Any] = {}
    rows = min(config.buffer_size, 20_000)  # sampling does not depend on how full a buffer is
    try:
        import gymnasium
        from stable_baselines3.common.buffers import ReplayBuffer as SB3Buffer
    except ImportError:
        logger.info("bench train: stable-baselines3 is not installed; its anchor is not measured")
    else:
        for label, width in widths.items():
            space = gymnasium.spaces.Box(-1.0, 1.0, (width,), np.float32)
            sb3 = SB3Buffer(rows, space, gymnasium.spaces.Discrete(4), device="cpu")
            obs = np.zeros((1, width), dtype=np.float32)
            for _ in range(rows):
                sb3.add(obs, obs, np.array([1]), np.array([1.0]), np.array([False]), [{}])
            out[f"anchor: Stable-Baselines3 sample({config.batch_size}), {label}"] = _timed(
                lambda: None, lambda _, buf=sb3: buf.sample(config.batch_size), config.replay_reps, torch.device("cpu"))
    try:
        from tensordict import TensorDict
        from torchrl.data import LazyTensorStorage
        from torchrl.data import ReplayBuffer as TorchRLBuffer
    except ImportError:
        logger.info("bench train: torchrl is not installed; its anchor is not measured")
    else:
        for label, width in widths.items():
            trl = TorchRLBuffer(storage=LazyTensorStorage(rows), batch_size=config.batch_size)
            trl.extend(TensorDict({"obs": torch.zeros(rows, width), "reward": torch.zeros(rows)}, batch_size=[rows]))
            out[f"anchor: TorchRL sample({config.batch_size}), {label}"] = _timed(
                lambda: None, lambda _, buf=trl: buf.sample(), config.replay_reps, torch.device("cpu"))
    return out


def run_train_bench(config: TrainBenchConfig, *, out: str | Path | None = None) -> dict[str, Any]:
    """Run the benchmark; returns (and writes to ``out`` as it goes) the results document."""
    import torch

    device = resolve_device(config)
    default_threads = torch.get_num_threads()
    try:
        if config.torch_threads:
            torch.set_num_threads(config.torch_threads)
        rng = np.random.default_rng(config.seed)
        results: dict[str, Any] = {"benchmark": "train", "config": dataclasses.asdict(config),
                                   "environment": torch_environment(device),
                                   "started": timestamp(), "results": [], "replay": None}
        buffer, fill_s = filled_buffer(config, device, rng)
        results["buffer"] = {"decisions": len(buffer), "fill_s": fill_s, "fill_per_s": len(buffer) / fill_s}
        for trainer in config.trainers:
            for arch in config.archs:
                logger.info("bench train: %s %s on %s", trainer, arch, device)
                results["results"].append(time_training(trainer, arch, buffer, config, device))
                if out is not None:
                    write_results(out, results)
        results["replay"] = time_replay(buffer, config, device, rng)
    finally:
        torch.set_num_threads(default_threads)
    return finish(results, out)


def format_table(results: dict[str, Any]) -> str:
    """Markdown tables of the results (the form docs/benchmarks.md records): training, then replay."""
    lines = ["| trainer | arch | device | params | batch (B x K) | samples/s | decisions/s | sample p50 (ms) | "
             "update p50 (ms) |",
             "|---|---|---|---:|---|---:|---:|---:|---:|"]
    for r in results["results"]:
        lines.append(f"| {r['trainer']} | {r['arch']} | {r['device']} | {r['params']:,} | {r['batch_size']} x {r['k']} "
                     f"| {r['samples_per_s']:,.0f} | {r['decisions_per_s']:,.0f} | {r['sample_p50_ms']:.3f} | "
                     f"{r['update_p50_ms']:.3f} |")
    replay = results.get("replay")
    if replay:
        lines += ["", f"| replay operation ({results['environment']['device']}) | p50 (µs) | p99 (µs) |",
                  "|---|---:|---:|"]
        for name, t in replay["operations"].items():
            label = "Transition(...) (checked construction)" if name == "transition" else name
            lines.append(f"| {label} | {t['p50_us']:,.1f} | {t['p99_us']:,.1f} |")
        lines += ["", "| buffer | distinct states stored | distinct cases stored |", "|---|---:|---:|"]
        for name, rows in replay["table_rows"].items():
            lines.append(f"| {name} | {rows['states']:,} | {rows['cases']:,} |")
    return "\n".join(lines)
