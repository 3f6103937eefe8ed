"""The Lightning module of offline Q training: the online learner's network and loss under a ``Trainer``.

:class:`QModule` holds a :class:`memento.learn.qnet.QNetwork` (``build_qnet``), its target copy and the
temperature, and computes its loss with :func:`memento.learn.learner.soft_q_loss` -- the one copy of the
loss the online :class:`~memento.learn.learner.SoftQLearner` uses too: binary cross-entropy on the logit
``Q(s, c)`` for single-step rewards (``gamma == 0``), soft TD towards the target network when the
batches carry next states (``gamma > 0``), optionally weighted by logged propensities
(``importance_weights="inverse_propensity"``). What ``SoftQLearner.update`` does around the loss is
done the Lightning way with the same settings (:class:`~memento.config.LearnerConfig`):

- AdamW (``lr``, ``weight_decay``); the temperature's ``log_alpha`` is a second parameter group
  (``alpha_lr``, no weight decay: Adam) when ``alpha_schedule="target_entropy"``;
- gradient-norm clipping of the Q-network's parameters at ``max_grad_norm``
  (:meth:`configure_gradient_clipping`);
- the Polyak target update every ``target_every`` optimiser steps
  (:func:`memento.learn.learner.polyak_update`); the target network stays in eval mode;
- dropout masks from one ``torch.Generator`` seeded with ``learner.seed``, whose state is saved in
  Lightning checkpoints, so a resumed run continues bit for bit on the same device.

Hyperparameters are plain JSON values (``save_hyperparameters``), so a Lightning checkpoint of
this module loads with ``torch.load(..., weights_only=True)``.

Logged to TensorBoard (``self.log``): ``train/loss`` (per step and per epoch), ``train/auc`` and
``train/ece`` (per epoch, from the training pairs seen), ``val/loss``, ``val/auc``, ``val/ece``
(expected calibration error of ``sigmoid(Q)``; single-step only), and per held-out state with mixed
labels ``val/hit@K`` with its random-order baseline ``val/hit@K_random`` and ``val/ranking_states``;
``train/alpha`` when the temperature moves, ``train/entropy`` (per epoch) of ``softmax(Q / alpha)``. Under DDP
the AUC and ECE are global (torchmetrics states gathered from every process,
:class:`~memento.training.metrics.EpochPairMetrics`); hit@K and the entropy are means of per-process means.

**Planner-scored labels** (``source="labels"``, batches of :class:`~memento.learn.listwise.ListwiseBatch`): the loss
is the listwise ``KL(softmax(score / tau) || softmax(Q / alpha))`` over each task's candidates
(:func:`memento.learn.listwise.listwise_kl`, the maths in its module docstring) instead of BCE; dropout, AdamW,
clipping and the Polyak target update are as above (the target network is not used by the loss, but the
selector carries it). Logged: ``train/loss`` and ``val/loss`` (that KL), ``train/entropy``, and over the
held-out tasks ``val/hit@K`` -- the share whose planner-best candidate is among Q's top K -- with the same
for a random order (``val/hit@K_random``) and for cosine similarity (``val/hit@K_cosine``), and
``val/ranking_states`` (held-out tasks with >= 2 candidates).
"""

from __future__ import annotations

import copy
import math
from typing import Any

import lightning as L
import torch
from torch import nn

from memento.config import LearnerConfig, QNetConfig, from_dict, to_dict
from memento.learn.learner import SoftQLearner, masked_entropy, polyak_update, soft_q_loss
from memento.learn.listwise import ListwiseBatch, best_in_top_k, listwise_kl
from memento.learn.qnet import QNetwork, build_qnet
from memento.learn.replay import ReplayBatch
from memento.training.data import RankingBatch
from memento.training.metrics import EpochPairMetrics, hit_at_k, random_hit_at_k

__all__ = ["QModule"]

_MAX_METRIC_PAIRS = 1_000_000  # (state, case) pairs per epoch kept for the epoch-level AUC / ECE


class QModule(L.LightningModule):
    """Offline soft-Q training of a Q-network (see the module docstring).

    ``qnet`` and ``learner`` are :class:`~memento.config.QNetConfig` / :class:`~memento.config.LearnerConfig`
    as plain dicts (``to_dict``); ``hit_k``: the K of the ranking metrics; ``ece_bins``: calibration bins;
    ``label_threshold``: the reward from which a pair counts as rewarded; ``tau``: the temperature of the
    listwise targets ``softmax(score / tau)`` (used by :class:`~memento.learn.listwise.ListwiseBatch` batches only).
    """

    def __init__(self, qnet: dict[str, Any], learner: dict[str, Any], hit_k: list[int] | None = None,
                 ece_bins: int = 10, label_threshold: float = 0.5, tau: float = 1.0):
        super().__init__()
        self.save_hyperparameters()
        self.qnet_config = from_dict(QNetConfig, qnet)
        self.learner_config = from_dict(LearnerConfig, learner)
        self.hit_k = list(hit_k or [1, 4])
        self.ece_bins = ece_bins
        self.label_threshold = label_threshold
        self.tau = float(tau)
        self.qnet: QNetwork = build_qnet(self.qnet_config)
        self.target: QNetwork = copy.deepcopy(self.qnet).eval().requires_grad_(False)
        tuned = self.learner_config.alpha_schedule == "target_entropy"
        self.log_alpha = nn.Parameter(torch.tensor(math.log(self.learner_config.alpha)), requires_grad=tuned)
        self._generator: torch.Generator | None = None
        self._pending_generator: dict[str, Any] | None = None
        self._last_target_step = 0
        # torchmetrics states (not in the state dict): the epoch's pairs of each split, gathered across processes
        self.train_pair_metrics = EpochPairMetrics(ece_bins)
        self.val_pair_metrics = EpochPairMetrics(ece_bins)
        self._reset_metrics()

    @classmethod
    def from_config(cls, config: Any) -> QModule:
        """The module of a :class:`memento.training.config.TrainConfig`."""
        return cls(qnet=to_dict(config.qnet), learner=to_dict(config.learner), hit_k=list(config.trainer.hit_k),
                   ece_bins=config.trainer.ece_bins, label_threshold=config.data.label_threshold,
                   tau=config.data.tau)

    # ------------------------------------------------------------------ state

    def train(self, mode: bool = True) -> QModule:
        super().train(mode)
        self.target.eval()  # as in SoftQLearner: the target network never drops out
        return self

    @property
    def alpha(self) -> float:
        """The temperature now (``LearnerConfig.alpha_schedule``; ``linear`` counts optimiser steps)."""
        cfg = self.learner_config
        match cfg.alpha_schedule:
            case "fixed":
                return cfg.alpha
            case "linear":
                frac = min(1.0, self.global_step / cfg.alpha_decay_steps)
                return cfg.alpha + (cfg.alpha_final - cfg.alpha) * frac
            case "target_entropy":
                return float(self.log_alpha.detach().exp())
        raise AssertionError(cfg.alpha_schedule)  # pragma: no cover

    def _dropout_generator(self, device: torch.device) -> torch.Generator:
        if self._generator is None or self._generator.device.type != device.type:
            generator = torch.Generator(device=device).manual_seed(self.learner_config.seed)
            pending = self._pending_generator
            if pending is not None and pending["device"] == device.type:
                generator.set_state(pending["state"].cpu())
            self._generator, self._pending_generator = generator, None
        return self._generator

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self._generator is not None:
            checkpoint["memento_generator"] = {"state": self._generator.get_state(),
                                               "device": self._generator.device.type}
        checkpoint["memento_last_target_step"] = self._last_target_step

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self._generator = None
        self._pending_generator = checkpoint.get("memento_generator")
        self._last_target_step = int(checkpoint.get("memento_last_target_step", 0))

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        if isinstance(batch, (ReplayBatch, RankingBatch, ListwiseBatch)):
            return batch.to(device)
        return super().transfer_batch_to_device(batch, device, dataloader_idx)

    # ------------------------------------------------------------------ optimisation

    def configure_optimizers(self) -> torch.optim.Optimizer:
        cfg = self.learner_config
        groups: list[dict[str, Any]] = [{"params": list(self.qnet.parameters())}]
        if cfg.alpha_schedule == "target_entropy":
            groups.append({"params": [self.log_alpha], "lr": cfg.alpha_lr, "weight_decay": 0.0})
        return torch.optim.AdamW(groups, lr=cfg.lr, weight_decay=cfg.weight_decay)

    def configure_gradient_clipping(self, optimizer: torch.optim.Optimizer, gradient_clip_val: Any = None,
                                    gradient_clip_algorithm: Any = None) -> None:
        if self.learner_config.max_grad_norm is not None:
            nn.utils.clip_grad_norm_(self.qnet.parameters(), self.learner_config.max_grad_norm)

    def training_step(self, batch: ReplayBatch | ListwiseBatch, batch_idx: int) -> torch.Tensor:
        if isinstance(batch, ListwiseBatch):
            return self._listwise_step(batch)
        cfg = self.learner_config
        alpha = self.alpha
        out = soft_q_loss(self.qnet, self.target, batch, cfg, alpha,
                          generator=self._dropout_generator(batch.state_BD.device))
        loss = out.loss
        b = batch.batch_size
        n_B = out.policy_mask_BC.sum(dim=1)
        rows_B = (n_B >= 2).float()
        n_rows = rows_B.sum().clamp_min(1.0)
        entropy_B = masked_entropy(out.policy_q_BC.float(), out.policy_mask_BC, alpha)
        total = loss
        if cfg.alpha_schedule == "target_entropy":  # as SoftQLearner._alpha_step
            target_B = cfg.target_entropy_ratio * n_B.clamp_min(1).float().log()
            alpha_loss = -(self.log_alpha * ((target_B - entropy_B) * rows_B).sum() / n_rows)
            total = loss + alpha_loss
        self.log("train/loss", loss.detach(), on_step=True, on_epoch=True, prog_bar=True, batch_size=b)
        self._entropy.append(((entropy_B * rows_B).sum() / n_rows).detach())  # logged per epoch: one log per step
        if cfg.alpha_schedule != "fixed":
            self.log("train/alpha", alpha, on_step=True, on_epoch=False, batch_size=b)
        self._collect("train", out.q_BK, batch)
        return total

    def _listwise_step(self, batch: ListwiseBatch) -> torch.Tensor:
        """The listwise KL of one batch of planner-scored labels (see :mod:`memento.learn.listwise`)."""
        alpha = self.alpha
        q_BC = self.qnet(batch.state_BD, batch.cases_BCD, generator=self._dropout_generator(batch.state_BD.device))
        loss, _ = listwise_kl(q_BC, batch.score_BC, batch.mask_BC, alpha=alpha, tau=self.tau)
        mask_BC = batch.mask_BC.bool()
        rows_B = (mask_BC.sum(dim=1) >= 2).float()
        entropy_B = masked_entropy(q_BC.detach().float(), mask_BC, alpha)
        self.log("train/loss", loss.detach(), on_step=True, on_epoch=True, prog_bar=True, batch_size=batch.batch_size)
        self._entropy.append(((entropy_B * rows_B).sum() / rows_B.sum().clamp_min(1.0)).detach())
        if self.learner_config.alpha_schedule != "fixed":
            self.log("train/alpha", alpha, on_step=True, on_epoch=False, batch_size=batch.batch_size)
        return loss

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = self.global_step
        if step != self._last_target_step and step % self.learner_config.target_every == 0:
            polyak_update(self.target, self.qnet, self.learner_config.target_beta)
        self._last_target_step = step

    # ------------------------------------------------------------------ validation

    def validation_step(self, batch: ReplayBatch | RankingBatch | ListwiseBatch, batch_idx: int,
                        dataloader_idx: int = 0) -> None:
        if isinstance(batch, ListwiseBatch):
            q_BC = self.qnet(batch.state_BD, batch.cases_BCD).float()
            loss, _ = listwise_kl(q_BC, batch.score_BC, batch.mask_BC, alpha=self.alpha, tau=self.tau)
            rows_B = batch.mask_BC.bool().sum(dim=1) >= 2
            n_rows = int(rows_B.sum())
            if n_rows:
                self.log("val/loss", loss, on_step=False, on_epoch=True, prog_bar=True, batch_size=n_rows,
                         sync_dist=True, add_dataloader_idx=False)
            mask_BC = batch.mask_BC.bool()
            s_BC = batch.score_BC.float().masked_fill(~mask_BC, -math.inf)
            best_BC = ((s_BC == s_BC.max(dim=1, keepdim=True).values) & mask_BC).float()
            cosine_BC = batch.cosine_BC
            for k in self.hit_k:
                self._hits[k].append(best_in_top_k(q_BC, batch.score_BC, mask_BC, k)[rows_B].cpu())
                self._hits_random[k].append(random_hit_at_k(best_BC.cpu(), mask_BC.cpu(), k)[rows_B.cpu()])
                self._hits_cosine[k].append(best_in_top_k(cosine_BC, batch.score_BC, mask_BC, k)[rows_B].cpu())
            return
        if isinstance(batch, RankingBatch):
            q_GC = self.qnet(batch.state_GD, batch.cases_GCD).float()
            for k in self.hit_k:
                self._hits[k].append(hit_at_k(q_GC, batch.label_GC, batch.mask_GC, k).cpu())
                self._hits_random[k].append(random_hit_at_k(batch.label_GC.cpu(), batch.mask_GC.cpu(), k))
            return
        out = soft_q_loss(self.qnet, self.target, batch, self.learner_config, self.alpha)
        self.log("val/loss", out.loss, on_step=False, on_epoch=True, prog_bar=True, batch_size=batch.batch_size,
                 sync_dist=True, add_dataloader_idx=False)
        self._collect("val", out.q_BK, batch)

    # ------------------------------------------------------------------ epoch metrics

    def _reset_metrics(self, split: str | None = None) -> None:
        if split in (None, "train"):
            self.train_pair_metrics.reset()
            self._n_pairs = {**getattr(self, "_n_pairs", {}), "train": 0}
            self._entropy: list[torch.Tensor] = []
        if split in (None, "val"):
            self.val_pair_metrics.reset()
            self._n_pairs = {**self._n_pairs, "val": 0}
            self._hits: dict[int, list[torch.Tensor]] = {k: [] for k in self.hit_k}
            self._hits_random: dict[int, list[torch.Tensor]] = {k: [] for k in self.hit_k}
            self._hits_cosine: dict[int, list[torch.Tensor]] = {k: [] for k in self.hit_k}

    def _collect(self, split: str, q_BK: torch.Tensor, batch: ReplayBatch) -> None:
        if self._n_pairs[split] >= _MAX_METRIC_PAIRS:
            return
        mask_BK = batch.mask_BK
        q_N = q_BK.detach()[mask_BK].float()
        y_N = batch.reward_B.detach().unsqueeze(1).expand_as(mask_BK)[mask_BK].float()
        self._pair_metrics(split).update(q_N, y_N, self.label_threshold)
        self._n_pairs[split] += q_BK.numel()

    def _pair_metrics(self, split: str) -> EpochPairMetrics:
        return self.train_pair_metrics if split == "train" else self.val_pair_metrics

    def _epoch_metrics(self, split: str) -> dict[str, float]:
        """AUC and ECE of the epoch's pairs on all processes (a collective under DDP: every process calls it)."""
        values = self._pair_metrics(split).compute()
        metrics = {f"{split}/auc": values["auc"]} if "auc" in values else {}
        if "ece" in values and self.learner_config.gamma == 0.0:
            metrics[f"{split}/ece"] = values["ece"]
        return metrics

    def on_train_epoch_end(self) -> None:
        metrics = self._epoch_metrics("train")
        if self._entropy:
            metrics["train/entropy"] = float(torch.stack(self._entropy).float().mean())
        if metrics:
            self.log_dict(metrics, sync_dist=True)
        self._reset_metrics("train")

    def on_validation_epoch_end(self) -> None:
        metrics = self._epoch_metrics("val")
        if self._hits[self.hit_k[0]] and torch.cat(self._hits[self.hit_k[0]]).numel():
            for k in self.hit_k:
                metrics[f"val/hit@{k}"] = float(torch.cat(self._hits[k]).mean())
                metrics[f"val/hit@{k}_random"] = float(torch.cat(self._hits_random[k]).mean())
                if self._hits_cosine[k]:
                    metrics[f"val/hit@{k}_cosine"] = float(torch.cat(self._hits_cosine[k]).mean())
            metrics["val/ranking_states"] = float(torch.cat(self._hits[self.hit_k[0]]).numel())
        if metrics:
            self.log_dict(metrics, sync_dist=True, add_dataloader_idx=False)
        self._reset_metrics("val")

    # ------------------------------------------------------------------ export

    def to_learner(self, device: str | torch.device = "cpu") -> SoftQLearner:
        """A :class:`~memento.learn.learner.SoftQLearner` holding this module's Q-network, target, temperature and
        step count (``SoftQLearner.save`` then writes the selector directory the online loop and export load)."""
        qnet = build_qnet(self.qnet_config)
        qnet.load_state_dict({k: v.detach().float().cpu() for k, v in self.qnet.state_dict().items()})
        learner = SoftQLearner(qnet, self.learner_config, device=device)
        learner.target.load_state_dict({k: v.detach().float().cpu() for k, v in self.target.state_dict().items()})
        with torch.no_grad():
            learner.log_alpha.copy_(self.log_alpha.detach().float().cpu())
        learner.updates = int(self.global_step) if self._trainer is not None else 0
        return learner
