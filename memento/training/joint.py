"""Joint fine-tuning of the encoder and a Q head on rewarded (state, case) pairs (optional; not the default).

The Memento reference fine-tunes its whole retriever backbone on (query, case, label) pairs. This
module makes the same possible here: the transformer encoder (pooled by
:meth:`memento.encoders.Encoder.pool`, unit-normalised as in a bank) feeds a
:class:`~memento.learn.qnet.QNetwork`, and the loss is the one copy of the soft-Q loss,
:func:`memento.learn.learner.soft_q_loss`, on a :class:`~memento.learn.replay.ReplayBatch` built from the
pooled vectors *with* their gradients: each pair is a decision with one shown case (K = 1),
propensity 1, single-step (``gamma`` must be 0: pairs carry no next state), so the loss is
binary cross-entropy of ``Q(s, c)`` against the reward. Both parameter sets get AdamW steps,
the encoder with its own (small) learning rate.

:func:`train_joint` saves ``OUT/config.json`` (the :class:`~memento.training.config.JointConfig`, which
:func:`~memento.training.config.joint_config_from_dict` reads back), ``OUT/encoder/`` (as
:mod:`memento.training.simcse` does: loadable by ``Encoder.from_pretrained``) and ``OUT/selector/`` (a saved
:class:`~memento.learn.learner.SoftQLearner` whose Q-network scores vectors of that encoder). A Q head
trained this way is only valid with the encoder it was trained with.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from memento.config import save_json, to_dict
from memento.encoders import Encoder
from memento.errors import DataFormatError, DimensionError
from memento.io import atomic_write_text
from memento.learn.learner import SoftQLearner, polyak_update, soft_q_loss
from memento.learn.qnet import QNetwork, build_qnet
from memento.learn.replay import ReplayBatch
from memento.training import simcse
from memento.training.config import JointConfig
from memento.training.run import trainer_kwargs
from memento.training.simcse import ENCODER_DIR, ListDataset, PairData, load_pairs, save_encoder, tokenize

__all__ = ["JointConfig", "JointModule", "JointResult", "pair_rows", "train_joint"]

logger = logging.getLogger(__name__)

SELECTOR_DIR = "selector"


def pair_rows(data: PairData) -> list[tuple[int, int, float]]:
    """``(state index, case index, reward)`` for every deduplicated pair: positives 1, negatives 0."""
    rows = []
    for s, (pos, neg) in enumerate(zip(data.positives, data.negatives)):
        rows += [(s, c, 1.0) for c in pos] + [(s, c, 0.0) for c in neg]
    return rows


class _JointCollate:
    def __init__(self, tokenizer: Any, max_length: int, data: PairData):
        self.tokenizer, self.max_length, self.data = tokenizer, max_length, data

    def __call__(self, rows: list[tuple[int, int, float]]) -> dict[str, Any]:
        return {"state": tokenize(self.tokenizer, [self.data.states[s] for s, _, _ in rows], self.max_length),
                "case": tokenize(self.tokenizer, [self.data.cases[c] for _, c, _ in rows], self.max_length),
                "reward_B": torch.tensor([r for _, _, r in rows], dtype=torch.float32)}


class JointModule(L.LightningModule):
    """Encoder (``self.model``) + Q head (``self.qnet``, target copy ``self.target``) trained with ``soft_q_loss``."""

    def __init__(self, config: JointConfig, encoder: Encoder | None = None, qnet: QNetwork | None = None):
        super().__init__()
        self.config = config
        self.save_hyperparameters({"config": to_dict(config)})
        if encoder is None:
            encoder = simcse.trainable_encoder(config)
        self.encoder = encoder
        self.model = encoder.model
        self.model.train()
        self.tokenizer = encoder.tokenizer
        if qnet is None:
            qnet_config = config.qnet.for_dim(encoder.dim, seed=config.seed)
            qnet = build_qnet(qnet_config, generator=torch.Generator().manual_seed(config.seed))
        if qnet.dim != encoder.dim:
            raise DimensionError(f"JointModule: Q-network dim {qnet.dim} != encoder dim {encoder.dim}")
        self.qnet = qnet
        self.target = copy.deepcopy(qnet).eval().requires_grad_(False)
        self.updates = 0

    def embed(self, tokens: dict[str, torch.Tensor]) -> torch.Tensor:
        """Unit vectors ``[B, D]`` (float32, differentiable), as a bank stores them."""
        outputs = self.model(**tokens)
        return F.normalize(self.encoder.pool(outputs, tokens["attention_mask"]).float(), dim=-1)

    def replay_batch(self, batch: dict[str, Any]) -> ReplayBatch:
        """The pairs as a :class:`ReplayBatch` of K = 1 decisions, vectors with gradients."""
        state_BD = self.embed(batch["state"])
        cases_BKD = self.embed(batch["case"]).unsqueeze(1)
        b, dev = state_BD.shape[0], state_BD.device
        return ReplayBatch(state_BD=state_BD, cases_BKD=cases_BKD, reward_B=batch["reward_B"].float(),
                           propensity_BK=torch.ones(b, 1, device=dev), mask_BK=torch.ones(b, 1, dtype=torch.bool,
                                                                                           device=dev),
                           done_B=torch.ones(b, device=dev), step_B=torch.zeros(b, dtype=torch.long, device=dev),
                           policy_version_B=torch.zeros(b, dtype=torch.long, device=dev))

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        lc = self.config.learner
        out = soft_q_loss(self.qnet, self.target, self.replay_batch(batch), lc, lc.alpha)
        b = int(batch["reward_B"].shape[0])
        self.log("train/loss", out.loss, prog_bar=True, batch_size=b)
        self.log("train/q_mean", out.q_BK.detach().float().mean(), batch_size=b)
        return out.loss

    def on_train_start(self) -> None:
        self.model.train()
        self.qnet.train()

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.updates += 1
        if self.updates % self.config.learner.target_every == 0:
            polyak_update(self.target, self.qnet, self.config.learner.target_beta)

    def configure_optimizers(self) -> Any:
        lc = self.config.learner
        return torch.optim.AdamW([
            {"params": list(self.model.parameters()), "lr": self.config.encoder_lr, "weight_decay": 0.0},
            {"params": list(self.qnet.parameters()), "lr": lc.lr, "weight_decay": lc.weight_decay},
        ])


@dataclasses.dataclass(frozen=True, kw_only=True)
class JointResult:
    out: str
    encoder_dir: str
    selector_dir: str
    pairs: int
    steps: int
    seconds: float
    device: str
    precision: str


def train_joint(config: JointConfig, out: str | Path, *, pairs: PairData | None = None,
                encoder: Encoder | None = None, progress: bool = False, callbacks: Sequence[Any] = ()) -> JointResult:
    """Train encoder and Q head together on ``config.data`` (or ``pairs``); save OUT/encoder and OUT/selector."""
    out = Path(out)
    if pairs is None:
        pairs = load_pairs(config.data, positive_threshold=config.positive_threshold)
    rows = pair_rows(pairs)
    if len(rows) < 2:
        raise DataFormatError(f"joint training needs at least 2 (state, case, reward) pairs; got {len(rows)} "
                              f"from {list(config.data)}")
    module = JointModule(config, encoder)
    gen = torch.Generator().manual_seed(config.seed)
    loader = DataLoader(ListDataset(rows), batch_size=config.batch_size, shuffle=True, generator=gen,
                        collate_fn=_JointCollate(module.tokenizer, config.max_length, pairs))
    out.mkdir(parents=True, exist_ok=True)
    save_json(config, out / "config.json")
    lightning = trainer_kwargs(config.lightning)
    precision = lightning["precision"]
    from lightning.pytorch.loggers import TensorBoardLogger

    trainer = L.Trainer(
        **lightning, max_epochs=config.epochs, max_steps=config.max_steps or -1,
        logger=TensorBoardLogger(save_dir=str(out), name="tb", version="", default_hp_metric=False),
        enable_checkpointing=False, enable_progress_bar=progress, enable_model_summary=False,
        gradient_clip_val=config.learner.max_grad_norm, num_sanity_val_steps=0, limit_val_batches=0,
        callbacks=list(callbacks))
    seconds = simcse.seeded_fit(trainer, module, config.seed, train_dataloaders=loader)
    encoder_dir, selector_dir = out / ENCODER_DIR, out / SELECTOR_DIR
    if trainer.is_global_zero:
        module.model.eval()
        save_encoder(module.model, module.tokenizer, encoder_dir, pooling=config.pooling,
                     max_length=config.max_length, base_model=module.encoder.model_id,
                     extra={"training": {"joint": to_dict(config)}})
        learner = SoftQLearner(copy.deepcopy(module.qnet).cpu(), config.learner, device="cpu")
        learner.target.load_state_dict({k: v.cpu() for k, v in module.target.state_dict().items()})
        learner.updates = module.updates
        learner.save(selector_dir)
    result = JointResult(out=str(out), encoder_dir=str(encoder_dir), selector_dir=str(selector_dir), pairs=len(rows),
                         steps=int(trainer.global_step), seconds=seconds, device=str(module.device),
                         precision=precision)
    if trainer.is_global_zero:
        atomic_write_text(out / "result.json", json.dumps(dataclasses.asdict(result), indent=2, sort_keys=True) + "\n")
    return result
