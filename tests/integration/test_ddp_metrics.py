"""Epoch AUC / ECE under DDP: two gloo processes on CPU log what one process logs on all the pairs.

Before torchmetrics, each process computed the AUC of its own shard and Lightning averaged them
(``sync_dist=True``), which is not the AUC of the data: the shards below are built so the two differ.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from memento.config import LearnerConfig, QNetConfig, to_dict
from memento.training.metrics import expected_calibration_error, roc_auc
from memento.training.q_module import QModule

WORLD = 2


def _shard(rank: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q_BK, reward_B, mask_BK) of one process: rank 1's scores are shifted up, so per-shard AUCs mislead."""
    generator = torch.Generator().manual_seed(rank)
    reward_B = (torch.rand(40, generator=generator) < (0.3 if rank == 0 else 0.7)).float()
    q_BK = torch.randn(40, 3, generator=generator) + reward_B[:, None] * 0.8 + (2.0 if rank == 1 else -1.0)
    mask_BK = torch.rand(40, 3, generator=generator) < 0.8
    mask_BK[:, 0] = True
    return q_BK, reward_B, mask_BK


def _module() -> QModule:
    return QModule(qnet=to_dict(QNetConfig(dim=4)), learner=to_dict(LearnerConfig()), ece_bins=10)


def _epoch(module: QModule, shards: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> dict[str, float]:
    for q_BK, reward_B, mask_BK in shards:
        for part in range(0, q_BK.shape[0], 16):  # several batches per epoch
            rows = slice(part, part + 16)
            module._collect("train", q_BK[rows], SimpleNamespace(reward_B=reward_B[rows], mask_BK=mask_BK[rows]))
    return module._epoch_metrics("train")


def _worker(rank: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        metrics = _epoch(_module(), [_shard(rank)])
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(metrics), encoding="utf-8")
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow  # ~25 s: two spawned processes import torch and Lightning
def test_two_process_ddp_logs_the_global_auc_and_ece(tmp_path: Path):
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    mp.spawn(_worker, args=(_free_port(), str(tmp_path)), nprocs=WORLD, join=True)
    per_rank = [json.loads((tmp_path / f"rank{rank}.json").read_text(encoding="utf-8")) for rank in range(WORLD)]
    single = _epoch(_module(), [_shard(rank) for rank in range(WORLD)])

    q = torch.cat([q_BK[m_BK] for q_BK, _, m_BK in map(_shard, range(WORLD))])
    y = torch.cat([r_B[:, None].expand_as(m_BK)[m_BK] for _, r_B, m_BK in map(_shard, range(WORLD))])
    assert single["train/auc"] == pytest.approx(roc_auc(q, y >= 0.5), abs=1e-6)
    assert single["train/ece"] == pytest.approx(expected_calibration_error(torch.sigmoid(q), y, 10), abs=1e-9)
    for metrics in per_rank:  # every process logs the global values
        assert metrics["train/auc"] == pytest.approx(single["train/auc"], abs=1e-6)
        assert metrics["train/ece"] == pytest.approx(single["train/ece"], abs=1e-9)

    shard_aucs = [_epoch(_module(), [_shard(rank)])["train/auc"] for rank in range(WORLD)]
    assert abs(sum(shard_aucs) / WORLD - single["train/auc"]) > 0.02  # what averaging per-shard AUCs logged
