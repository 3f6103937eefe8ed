"""The soft-Q learner: losses, target network, optimiser steps. No I/O beyond ``save``/``load``.

One :meth:`SoftQLearner.update` is one gradient step on a :class:`~memento.learn.replay.ReplayBatch`.

**Single-step (``gamma == 0``, Memento's practical setting).** Rewards are binary (any value in
``[0, 1]`` is accepted as a soft label). Each of the K chosen cases of a decision becomes one
``(s, c, r)`` pair and the loss is binary cross-entropy on the logit ``Q(s, c)``, so
``sigmoid(Q(s, c))`` estimates ``P(success | s, c)``. *Credit assignment:* every case shown gets
the task's reward. The outcome of a set cannot be split among its members from one reward, and
this is what Memento does; a case that rides along with good cases is pulled up too, and
averaging over many sets is what separates them.

**Multi-step (``gamma > 0``).** Soft TD with a target network ``Q_bar``::

    y = r + gamma * (1 - done) * alpha * logsumexp_{c' in C'} (Q_bar(s', c') / alpha)

over the masked next candidates ``C'`` (a row with no next candidate counts as terminal), and a
Huber (default) or squared loss between ``Q(s, c)`` and ``y`` for each chosen case.

**Target network.** A deep copy of the online network, in eval mode, updated by Polyak averaging
``theta_bar <- beta * theta_bar + (1 - beta) * theta`` every ``target_every`` updates
(:func:`polyak_update`).

**Importance weights** (``importance_weights="inverse_propensity"``, off by default). Batches do
not carry the current policy's probabilities, so the weight of a pair is ``min(1 / p, cap)`` with
``p`` the logged propensity of that case, self-normalised over the batch (the loss is a weighted
mean). This re-weights the logged pairs towards a uniform choice over candidates: cases the
logging policy rarely showed count as much as those it favoured, which keeps ``Q`` accurate
away from what the policy already likes. For K > 1 the logged per-case propensity is the
first-draw probability, a lower bound of the inclusion probability, so such weights are
somewhat too large; the cap bounds them.

**Temperature alpha** (``alpha_schedule``): ``"fixed"``; ``"linear"`` from ``alpha`` to
``alpha_final`` over ``alpha_decay_steps`` updates; ``"target_entropy"`` tunes ``log_alpha`` as in
discrete SAC with the loss ``-(log_alpha * (target_entropy - entropy).detach())``, where
``entropy`` is that of the policy ``softmax(Q / alpha)`` over the candidates present in the batch
and ``target_entropy = target_entropy_ratio * log(n)`` for a row of ``n`` candidates. With
``gamma > 0`` the candidates are the next candidates ``C'`` at ``s'``, scored by the target network
(already computed for the TD target; a lagged copy of the online network). With ``gamma == 0`` a
batch holds no other candidates, so they are the K chosen cases at ``s``, scored by the online
network; rows with a single case carry no signal (with K = 1 alpha stays put). The same entropy
is reported as the ``entropy`` metric.

**Planner labels** (online, :class:`~memento.config.OnlineLabelsConfig`). :meth:`SoftQLearner.update` may also get
a :class:`~memento.learn.listwise.ListwiseBatch` of labelled tasks; the step's loss is then the loss above plus
``weight`` times the listwise ``KL(softmax(score / tau) || softmax(Q / alpha))`` over each task's labelled
candidates (:func:`memento.learn.listwise.listwise_kl`, the loss of ``memento train --from-labels``).

**Randomness.** The learner owns one ``torch.Generator`` on its device; it draws the dropout
masks (callers may use it to sample batches too). Its state is part of :meth:`state_dict`, with
both networks, the optimisers, alpha and the update counter, so a resumed run continues bit for
bit on the same device.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import math
import uuid
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn

from memento.config import LearnerConfig, QNetConfig, from_dict, parses_to, to_dict
from memento.errors import CheckpointError, DataFormatError, DimensionError
from memento.io import atomic_write, atomic_write_text, check_same_save, read_safetensors, read_saved_meta
from memento.learn.listwise import ListwiseBatch, listwise_kl
from memento.learn.qnet import QNetwork, build_qnet
from memento.learn.replay import ReplayBatch

__all__ = ["LEARNER_FORMAT", "LEARNER_FORMAT_VERSION", "LossOutput", "SoftQLearner", "masked_entropy", "pair_weights",
           "polyak_update", "soft_q_loss", "soft_value"]

logger = logging.getLogger(__name__)

LEARNER_FORMAT = "memento-learner"
LEARNER_FORMAT_VERSION = 1
TENSORS_NAME = "learner.safetensors"
STATE_NAME = "learner.json"
CONFIG_NAME = "config.json"


@torch.no_grad()
def polyak_update(target: nn.Module, online: nn.Module, beta: float) -> None:
    """``theta_bar <- beta * theta_bar + (1 - beta) * theta`` for every parameter; buffers are copied."""
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"polyak_update: beta={beta!r} must lie in [0, 1]")
    target_params, online_params = list(target.parameters()), list(online.parameters())
    if len(target_params) != len(online_params):
        raise DimensionError(f"polyak_update: target has {len(target_params)} parameters, online "
                             f"{len(online_params)}")
    for p_bar, p in zip(target_params, online_params):
        if p_bar.shape != p.shape:
            raise DimensionError(f"polyak_update: target shape {tuple(p_bar.shape)} vs online {tuple(p.shape)}")
        p_bar.mul_(beta).add_(p, alpha=1.0 - beta)
    for b_bar, b in zip(target.buffers(), online.buffers()):
        b_bar.copy_(b)


def soft_value(q_BC: torch.Tensor, mask_BC: torch.Tensor, alpha: float) -> torch.Tensor:
    """``V(s) = alpha * logsumexp(Q(s, c) / alpha)`` over each row's valid candidates; 0 for an empty row."""
    v_B = alpha * torch.logsumexp(q_BC.masked_fill(~mask_BC, -math.inf) / alpha, dim=1)
    return torch.where(mask_BC.any(dim=1), v_B, torch.zeros_like(v_B))


def masked_entropy(q_BC: torch.Tensor, mask_BC: torch.Tensor, alpha: float | torch.Tensor) -> torch.Tensor:
    """Entropy (nats) of ``softmax(Q / alpha)`` over each row's valid candidates; 0 for rows with < 2."""
    z_BC = q_BC.masked_fill(~mask_BC, -math.inf) / alpha
    logp_BC = z_BC - z_BC.logsumexp(dim=1, keepdim=True)  # not torch.log_softmax: slow on small CPU inputs
    plogp_BC = torch.where(mask_BC, logp_BC.exp() * logp_BC, torch.zeros_like(logp_BC))
    return -plogp_BC.sum(dim=1)


@dataclasses.dataclass(frozen=True)
class LossOutput:
    """What :func:`soft_q_loss` computed: the scalar loss and the tensors the metrics need."""

    loss: torch.Tensor  # scalar, differentiable
    q_BK: torch.Tensor  # Q(s, c) of the chosen cases (with grad)
    target_BK: torch.Tensor  # the regression / BCE target of each pair (no grad)
    weight_BK: torch.Tensor  # the per-pair weights (mask times importance weights)
    policy_q_BC: torch.Tensor  # the Q-values whose softmax entropy is reported (no grad)
    policy_mask_BC: torch.Tensor


def pair_weights(b: ReplayBatch, config: LearnerConfig) -> torch.Tensor:
    """Per-pair loss weights: the mask, times capped inverse propensities when enabled."""
    weight_BK = b.mask_BK.float()
    if config.importance_weights == "inverse_propensity":
        weight_BK = weight_BK * b.propensity_BK.reciprocal().clamp(max=config.importance_cap)
    return weight_BK


def soft_q_loss(qnet: nn.Module, target: nn.Module, b: ReplayBatch, config: LearnerConfig, alpha: float, *,
                generator: torch.Generator | None = None) -> LossOutput:
    """The soft-Q loss of one batch (see the module docstring): BCE for ``gamma == 0``, soft TD otherwise.

    The one copy of the loss: :meth:`SoftQLearner.update` and the offline Lightning module both call
    it. ``qnet`` is called as ``qnet(state_BD, cases_BKD, generator=...)``; ``target`` only for
    ``gamma > 0`` (under ``no_grad``). ``b`` must already be checked and on the networks' device.
    """
    q_BK = qnet(b.state_BD, b.cases_BKD, generator=generator)
    if config.gamma == 0.0:  # P(success | s, c) = sigmoid(Q): every shown case gets the task's reward
        target_BK = b.reward_B.unsqueeze(1).expand_as(q_BK)
        loss_BK = F.binary_cross_entropy_with_logits(q_BK, target_BK, reduction="none")
        policy_q_BC, policy_mask_BC = q_BK.detach(), b.mask_BK  # for the entropy: the chosen set
    else:  # soft TD towards r + gamma * (1 - done) * V_bar(s')
        with torch.no_grad():
            q_next_BC = target(b.next_state_BD, b.next_cands_BCD)
            y_B = b.reward_B + config.gamma * (1.0 - b.done_B) * soft_value(q_next_BC, b.next_mask_BC, alpha)
        target_BK = y_B.unsqueeze(1).expand_as(q_BK)
        loss_BK = (F.huber_loss(q_BK, target_BK, reduction="none", delta=config.huber_delta)
                   if config.td_loss == "huber" else F.mse_loss(q_BK, target_BK, reduction="none"))
        policy_q_BC, policy_mask_BC = q_next_BC, b.next_mask_BC  # for the entropy: the next candidates
    weight_BK = pair_weights(b, config)
    loss = (loss_BK * weight_BK).sum() / weight_BK.sum().clamp_min(1e-12)
    return LossOutput(loss=loss, q_BK=q_BK, target_BK=target_BK, weight_BK=weight_BK, policy_q_BC=policy_q_BC,
                      policy_mask_BC=policy_mask_BC)


class SoftQLearner:
    """Trains ``qnet`` with soft-Q losses; see the module docstring for the maths.

    ``device=None`` picks CUDA when present; the network is moved there. ``generator`` (on that
    device) draws dropout masks; by default one seeded with ``config.seed``.
    """

    def __init__(self, qnet: QNetwork, config: LearnerConfig, device: torch.device | str | None = None,
                 generator: torch.Generator | None = None):
        self.config = config
        self.device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
        self.qnet = qnet.to(self.device)
        self.target = copy.deepcopy(self.qnet).eval().requires_grad_(False)
        self.optimizer = torch.optim.AdamW(self.qnet.parameters(), lr=config.lr, weight_decay=config.weight_decay)
        self.log_alpha = torch.tensor(math.log(config.alpha), device=self.device,
                                      requires_grad=config.alpha_schedule == "target_entropy")
        self.alpha_optimizer = torch.optim.Adam([self.log_alpha], lr=config.alpha_lr) \
            if config.alpha_schedule == "target_entropy" else None
        if generator is None:
            generator = torch.Generator(device=self.device).manual_seed(config.seed)
        elif generator.device.type != self.device.type:
            raise ValueError(f"SoftQLearner: generator is on {generator.device}, the learner on {self.device}")
        self.generator = generator
        self.updates = 0
        self.set_values: dict[str, list[float]] = {}  # the soft-Q agent's set-size values (memento.learn.evidence)

    @property
    def alpha(self) -> float:
        """The temperature now (the policy should use the same)."""
        cfg = self.config
        match cfg.alpha_schedule:
            case "fixed":
                return cfg.alpha
            case "linear":
                frac = min(1.0, self.updates / cfg.alpha_decay_steps)
                return cfg.alpha + (cfg.alpha_final - cfg.alpha) * frac
            case "target_entropy":
                return float(self.log_alpha.detach().exp())
        raise AssertionError(cfg.alpha_schedule)  # pragma: no cover

    # ------------------------------------------------------------------ one update

    def update(self, batch: ReplayBatch, *, labels: ListwiseBatch | None = None, label_weight: float = 1.0,
               label_tau: float = 1.0) -> dict[str, float]:
        """One gradient step on ``batch`` (moved to the learner's device if needed), plus ``label_weight`` times
        the listwise loss on ``labels`` (planner-scored candidates; ``label_tau`` sharpens their target) when
        given; its value is reported as ``listwise``.

        Returns floats: ``loss`` (before the step), ``grad_norm`` (before clipping), ``q_mean`` and
        ``target_mean`` over the valid pairs, ``entropy`` (see the module docstring), ``alpha_loss``
        (0 unless tuned), ``pairs`` (valid (s, c) pairs), ``alpha`` (used in this update) and
        ``updates`` (the count after it).
        """
        cfg, b = self.config, self._checked(batch)
        alpha = self.alpha
        self.qnet.train()
        out = soft_q_loss(self.qnet, self.target, b, cfg, alpha, generator=self.generator)
        loss, q_BK, target_BK = out.loss, out.q_BK, out.target_BK
        policy_q_BC, policy_mask_BC = out.policy_q_BC, out.policy_mask_BC
        listwise = torch.zeros((), device=self.device)
        if labels is not None:
            lb = labels.to(self.device)
            q_BC = self.qnet(lb.state_BD, lb.cases_BCD, generator=self.generator)
            listwise, _ = listwise_kl(q_BC, lb.score_BC, lb.mask_BC, alpha=alpha, tau=label_tau)
            loss = loss + label_weight * listwise

        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        max_norm = cfg.max_grad_norm if cfg.max_grad_norm is not None else math.inf
        grad_norm = nn.utils.clip_grad_norm_(self.qnet.parameters(), max_norm)
        self.optimizer.step()
        entropy, alpha_loss = self._alpha_step(policy_q_BC, policy_mask_BC, alpha)
        self.updates += 1
        if self.updates % cfg.target_every == 0:
            polyak_update(self.target, self.qnet, cfg.target_beta)

        valid_BK = b.mask_BK.float()
        pairs, n = valid_BK.sum(), valid_BK.sum().clamp_min(1.0)
        names = ["loss", "grad_norm", "q_mean", "target_mean", "entropy", "alpha_loss", "pairs"]
        values = torch.stack([loss.detach(), grad_norm.detach().float(), (q_BK.detach() * valid_BK).sum() / n,
                              (target_BK * valid_BK).sum() / n, entropy, alpha_loss, pairs])
        return {**dict(zip(names, values.tolist())), "alpha": alpha, "updates": float(self.updates),
                **({"listwise": float(listwise.detach())} if labels is not None else {})}

    # ------------------------------------------------------------------ parts of the update

    def _checked(self, batch: ReplayBatch) -> ReplayBatch:
        b = batch.to(self.device)
        if b.state_BD.shape[1] != self.qnet.config.dim:
            raise DimensionError(f"batch state_BD.shape={tuple(b.state_BD.shape)} does not fit the Q-network's "
                                 f"dim={self.qnet.config.dim}")
        if self.config.gamma > 0.0 and not b.has_next:
            raise DataFormatError(f"gamma={self.config.gamma} needs next_state_BD / next_cands_BCD in the batch "
                                  "(ReplayConfig.store_next=True)")
        if self.config.gamma == 0.0 and bool(((b.reward_B < 0) | (b.reward_B > 1)).any()):
            raise DataFormatError(f"gamma=0 trains P(success) with cross-entropy: rewards must lie in [0, 1]; got "
                                  f"min={float(b.reward_B.min())}, max={float(b.reward_B.max())}")
        return b

    def _weights(self, b: ReplayBatch) -> torch.Tensor:
        """Per-pair loss weights (:func:`pair_weights`)."""
        return pair_weights(b, self.config)

    def _alpha_step(self, q_BC: torch.Tensor, mask_BC: torch.Tensor, alpha: float
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean policy entropy over rows with >= 2 candidates and, for ``target_entropy``, one step on log_alpha."""
        n_B = mask_BC.sum(dim=1)
        rows_B = (n_B >= 2).float()
        n_rows = rows_B.sum().clamp_min(1.0)
        entropy_B = masked_entropy(q_BC, mask_BC, alpha)
        entropy = (entropy_B * rows_B).sum() / n_rows
        if self.alpha_optimizer is None:
            return entropy, torch.zeros((), device=self.device)
        target_B = self.config.target_entropy_ratio * n_B.clamp_min(1).float().log()
        alpha_loss = -(self.log_alpha * ((target_B - entropy_B) * rows_B).sum() / n_rows)
        self.alpha_optimizer.zero_grad(set_to_none=True)
        alpha_loss.backward()
        self.alpha_optimizer.step()
        return entropy, alpha_loss.detach()

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs: networks, optimisers, alpha, counter, generator state."""
        state: dict[str, Any] = {
            "qnet": self.qnet.state_dict(),
            "target": self.target.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "log_alpha": self.log_alpha.detach().clone(),
            "updates": self.updates,
            "generator": self.generator.get_state(),
            "generator_device": self.generator.device.type,
            "config": to_dict(self.config),
            "qnet_config": to_dict(self.qnet.config),
            "set_values": {context: [float(v) for v in values] for context, values in self.set_values.items()},
        }
        if self.alpha_optimizer is not None:
            state["alpha_optimizer"] = self.alpha_optimizer.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output (the Q-network architecture must match)."""
        if not parses_to(QNetConfig, state.get("qnet_config"), self.qnet.config):
            raise CheckpointError(f"learner state is for Q-network {state.get('qnet_config')}, this learner has "
                                  f"{to_dict(self.qnet.config)}")
        if state.get("config") != to_dict(self.config):
            logger.warning("loading learner state saved with another LearnerConfig; the run will not continue "
                           "exactly as it would have")
        try:
            self.qnet.load_state_dict(state["qnet"])
            self.target.load_state_dict(state["target"])
            self.optimizer.load_state_dict(state["optimizer"])
            if self.alpha_optimizer is not None and "alpha_optimizer" in state:
                self.alpha_optimizer.load_state_dict(state["alpha_optimizer"])
        except (KeyError, RuntimeError, ValueError) as error:
            raise CheckpointError(f"learner state does not fit this learner: {error}") from None
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        self.updates = int(state["updates"])
        set_values = state.get("set_values", {})  # absent from a learner saved before set sizes were learned
        if not isinstance(set_values, dict) or not all(
                isinstance(key, str) and isinstance(values, list)
                and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values)
                for key, values in set_values.items()):
            raise CheckpointError(f"learner state: set_values={set_values!r} must map contexts to lists of finite "
                                  "numbers")
        self.set_values = {key: [float(v) for v in values] for key, values in set_values.items()}
        if state.get("generator_device") == self.generator.device.type:
            self.generator.set_state(state["generator"].cpu())
        else:
            logger.warning("learner generator state was saved on %s and is not restored on %s",
                           state.get("generator_device"), self.generator.device.type)

    def save(self, directory: str | Path) -> Path:
        """Write ``learner.safetensors`` (every tensor), ``learner.json`` (the rest) and ``config.json``."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        state = self.state_dict()
        tensors: dict[str, torch.Tensor] = {}
        for net in ("qnet", "target"):
            tensors.update({f"{net}.{name}": value for name, value in state[net].items()})
        tensors["log_alpha"] = state["log_alpha"]
        tensors["generator"] = state["generator"]
        uid = uuid.uuid4().hex
        meta = {"format": LEARNER_FORMAT, "format_version": LEARNER_FORMAT_VERSION, "uid": uid,
                "updates": state["updates"], "generator_device": state["generator_device"],
                "config": state["config"], "qnet_config": state["qnet_config"], "set_values": state["set_values"],
                "optimizer": _flatten_optimizer(state["optimizer"], "optimizer", tensors)}
        if "alpha_optimizer" in state:
            meta["alpha_optimizer"] = _flatten_optimizer(state["alpha_optimizer"], "alpha_optimizer", tensors)
        tensors = {name: value.detach().to("cpu").contiguous() for name, value in tensors.items()}
        atomic_write(directory / TENSORS_NAME, lambda tmp: save_file(tensors, str(tmp), metadata={"uid": uid}))
        atomic_write_text(directory / STATE_NAME, json.dumps(meta, indent=2, sort_keys=True) + "\n")
        config = {"learner": state["config"], "qnet": state["qnet_config"]}
        atomic_write_text(directory / CONFIG_NAME, json.dumps(config, indent=2, sort_keys=True) + "\n")
        logger.info("saved learner (%d updates) to %s", self.updates, directory)
        return directory

    @classmethod
    def load(cls, directory: str | Path, device: torch.device | str | None = None) -> SoftQLearner:
        """A learner rebuilt from :meth:`save` output (Q-network, configs and state), on ``device``."""
        directory = Path(directory)
        meta_path, tensors_path = directory / STATE_NAME, directory / TENSORS_NAME
        kinds = {"uid": str, "updates": int, "generator_device": str, "config": dict, "qnet_config": dict,
                 "optimizer": dict}
        meta = read_saved_meta(directory, STATE_NAME, TENSORS_NAME, name="learner", format=LEARNER_FORMAT,
                               version=LEARNER_FORMAT_VERSION, what="learner state", kinds=kinds)
        if meta["updates"] < 0 or not isinstance(meta.get("alpha_optimizer", {}), dict):
            raise CheckpointError(f"{meta_path}: damaged learner state (updates or alpha_optimizer)")
        tensors, header = read_safetensors(tensors_path)
        check_same_save(directory, STATE_NAME, TENSORS_NAME, meta, header)
        try:
            qnet = build_qnet(from_dict(QNetConfig, meta["qnet_config"]))
            learner = cls(qnet, from_dict(LearnerConfig, meta["config"]), device=device)
            state: dict[str, Any] = {
                "qnet": {k[5:]: v for k, v in tensors.items() if k.startswith("qnet.")},
                "target": {k[7:]: v for k, v in tensors.items() if k.startswith("target.")},
                "optimizer": _unflatten_optimizer(meta["optimizer"], tensors),
                "log_alpha": tensors["log_alpha"], "generator": tensors["generator"],
                "updates": meta["updates"], "generator_device": meta["generator_device"],
                "config": meta["config"], "qnet_config": meta["qnet_config"],
                "set_values": meta.get("set_values", {}),
            }
            if "alpha_optimizer" in meta:
                state["alpha_optimizer"] = _unflatten_optimizer(meta["alpha_optimizer"], tensors)
            learner.load_state_dict(state)
        except (CheckpointError, KeyError, TypeError, ValueError, AttributeError, IndexError,
                RuntimeError) as error:  # one line naming the file, whatever part of the state is damaged
            detail = " ".join(str(error).split())
            if isinstance(error, KeyError):
                detail = f"missing {detail}"
            raise CheckpointError(f"{meta_path}: damaged learner state, or it does not fit its Q-network "
                                  f"({type(error).__name__}: {detail})") from None
        return learner


# ---------------------------------------------------------------- persistence helpers


def _flatten_optimizer(state: dict[str, Any], prefix: str, tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    """An optimiser state_dict as a JSON-ready structure; its tensors go into ``tensors``
    under ``prefix.state.<param id>.<name>``."""
    flat_state: dict[str, dict[str, Any]] = {}
    for pid, entries in state["state"].items():
        flat: dict[str, Any] = {}
        for name, value in entries.items():
            if isinstance(value, torch.Tensor):
                key = f"{prefix}.state.{pid}.{name}"
                tensors[key] = value
                flat[name] = {"tensor": key}
            else:
                flat[name] = {"value": value}
        flat_state[str(pid)] = flat
    groups = [{name: list(value) if isinstance(value, tuple) else value for name, value in group.items()}
              for group in state["param_groups"]]
    return {"state": flat_state, "param_groups": groups}


def _unflatten_optimizer(flat: dict[str, Any], tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    state = {int(pid): {name: tensors[entry["tensor"]] if "tensor" in entry else entry["value"]
                        for name, entry in entries.items()} for pid, entries in flat["state"].items()}
    groups = [{name: tuple(value) if name == "betas" else value for name, value in group.items()}
              for group in flat["param_groups"]]
    return {"state": state, "param_groups": groups}
