"""SimCSE contrastive fine-tuning of the text encoder, with PyTorch Lightning.

Two objectives (Gao et al., 2021), both InfoNCE over cosine similarities with temperature
``tau`` (0.05) and in-batch negatives:

- **unsupervised** (``mode="unsup"``): every text goes through the encoder twice in training mode;
  the two dropout masks differ, so the two vectors ``z_i``, ``z_i'`` are a positive pair and the
  other texts of the batch are negatives::

      loss = mean_i -log( exp(cos(z_i, z_i') / tau) / sum_j exp(cos(z_i, z_j') / tau) )

  Texts are the project's own: case states (and actions), task questions, Memento queries and
  cases.
- **supervised** (``mode="sup"``): from rewarded pairs. An anchor is a state text ``s_i``, its
  positive ``c_i+`` a case that earned reward 1 with it, and its hard negative ``c_i-`` (when the
  state has one) a case that earned reward 0 with it. The denominator runs over every positive
  and every hard negative of the batch::

      loss = mean_i -log( exp(cos(s_i, c_i+)/tau) / sum_j [exp(cos(s_i, c_j+)/tau) + exp(cos(s_i, c_j-)/tau)] )

  Columns that are known positives of the anchor's state (the same case shown with the same
  state elsewhere in the batch) are masked out of the denominator: they are not negatives.

Pooling is :meth:`memento.encoders.Encoder.pool` itself (the model is loaded through
:class:`~memento.encoders.Encoder`), so the saved directory, loaded with
``Encoder.from_pretrained(OUT/encoder)``, gives the vectors the training-time forward gives in
eval mode; :func:`train_encoder` checks this after saving.

Output directory ``OUT``:

- ``config.json``: the :class:`~memento.training.config.SimCSEConfig` of the run (its ``lightning`` part is the
  ``lightning.Trainer``'s devices and precision; :func:`~memento.training.config.simcse_config_from_dict` reads it);
- ``encoder/``: a normal transformers directory (``model.safetensors``, ``config.json``,
  tokenizer files) plus ``memento_encoder.json`` (pooling, max_length, base model, dim, the
  training config and figures). Use it as ``--encoder OUT/encoder`` or
  ``Encoder.from_pretrained("OUT/encoder")`` (which reads the pooling from it);
- ``tb/``: TensorBoard events (``train/loss``, ``train/lr``, ``eval/loss_before``, ``eval/loss_after``);
- ``result.json``: steps, seconds per step, the fixed-batch loss before and after.

No Lightning checkpoint is written (those are pickles); the encoder directory is the artifact.
Under DDP every device contrasts its own batch (negatives are not gathered across devices).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import shutil
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from memento.config import Pooling, save_json, to_dict
from memento.encoders import (
    ENCODER_META_FORMAT,
    ENCODER_META_NAME,
    ENCODER_META_VERSION,
    Encoder,
)
from memento.errors import CheckpointError, DataFormatError, DimensionError
from memento.formats import (
    iter_jsonl,
    read_cases_jsonl,
    read_memento_memory,
    read_memento_np_memory,
    read_memento_tasks,
    read_memento_training_pairs,
    read_tasks_jsonl,
)
from memento.io import atomic_write_text
from memento.training.config import SimCSEConfig
from memento.training.run import trainer_kwargs

__all__ = [
    "DataFormatName",
    "PairData",
    "SimCSEConfig",
    "SimCSEDataModule",
    "SimCSEModule",
    "SimCSEResult",
    "SupExample",
    "build_sup_examples",
    "detect_format",
    "info_nce",
    "load_pairs",
    "load_texts",
    "save_encoder",
    "seeded_fit",
    "train_encoder",
    "trainable_encoder",
]

logger = logging.getLogger(__name__)

DataFormatName = Literal["case", "task", "pairs", "memento-training", "memento-memory", "memento-np-memory",
                         "memento-tasks", "bank"]
SUP_FORMATS: tuple[DataFormatName, ...] = ("pairs", "memento-training")
ENCODER_DIR = "encoder"
RESULT_NAME = "result.json"
CONFIG_NAME = "config.json"


# ---------------------------------------------------------------- data: formats and readers


_SIGNATURES: tuple[tuple[DataFormatName, frozenset[str]], ...] = (
    ("memento-training", frozenset({"query", "case", "truth_label"})),
    ("pairs", frozenset({"state", "case", "reward"})),
    ("case", frozenset({"state", "action"})),
    ("memento-memory", frozenset({"case", "case_label"})),
    ("memento-np-memory", frozenset({"question", "plan", "reward"})),
    ("task", frozenset({"question", "answers"})),
    ("memento-tasks", frozenset({"question", "ground_truth"})),
)


def _data_input(path: str | Path) -> Path | str:
    """An input as the readers take it: a Milvus bank's name as given (``milvus:URI[#collection]``; a malformed
    one raises ``BankError``, one line), anything else a :class:`~pathlib.Path`."""
    if isinstance(path, str) and path.lower().startswith("milvus:"):
        from memento.bank.uri import bank_name

        return bank_name(path)
    return Path(path)


def detect_format(path: str | Path) -> DataFormatName:
    """The format of a data file from the keys of its first row, or ``"bank"`` for a bank directory or a
    ``milvus:URI[#collection]`` bank."""
    path = _data_input(path)
    if isinstance(path, str):  # a Milvus bank
        return "bank"
    if path.is_dir():
        from memento.bank.local import DB_NAME

        if not (path / DB_NAME).is_file():
            raise DataFormatError(f"a directory, but not a case bank (no {DB_NAME})", path=path)
        return "bank"
    for number, row in iter_jsonl(path):
        keys = set(row)
        for name, needed in _SIGNATURES:
            if needed <= keys:
                return name
        raise DataFormatError(
            f"cannot tell the format from the keys {sorted(keys)}; expected Case JSONL {{state, action, reward}}, "
            "Task JSONL {id, question, answers}, pairs {state, case, reward}, or a Memento file "
            "(training pairs, memory, np-memory, tasks)", path=path, line=number)
    raise DataFormatError("no rows", path=path)


def _texts_of(path: Path | str, fmt: DataFormatName, include_actions: bool) -> list[str]:
    if fmt == "bank":
        from memento.bank import open_bank

        bank = open_bank(path, read_only=True)
        try:
            cases = list(bank.iter_cases())
        finally:
            bank.close()
        return [t for c in cases for t in ((c.state, c.action) if include_actions else (c.state,))]
    if fmt == "case":
        return [t for c in read_cases_jsonl(path) for t in ((c.state, c.action) if include_actions else (c.state,))]
    if fmt == "task":
        return [t.question for t in read_tasks_jsonl(path)]
    if fmt == "memento-tasks":
        return [t.question for t in read_memento_tasks(path)]
    if fmt == "memento-memory":
        return [t for c in read_memento_memory(path) for t in ((c.state, c.action) if include_actions else (c.state,))]
    if fmt == "memento-np-memory":
        return [t for c in read_memento_np_memory(path)
                for t in ((c.state, c.action) if include_actions else (c.state,))]
    if fmt == "memento-training":
        return [t for p in read_memento_training_pairs(path) for t in (p.query, p.case)]
    if fmt == "pairs":
        return [t for row in _read_pair_rows(path) for t in (row[0], row[1])]
    raise AssertionError(fmt)  # pragma: no cover


def load_texts(paths: Iterable[str | Path], *, include_actions: bool = True) -> list[str]:
    """The unique non-blank texts of every input, in first-seen order (unsupervised SimCSE).

    Each file is validated whole by its reader; a bad row raises ``DataFormatError`` as ``path:line: reason``.
    """
    texts: dict[str, None] = {}
    for path in paths:
        path = _data_input(path)
        fmt = detect_format(path)
        found = _texts_of(path, fmt, include_actions)
        before = len(texts)
        texts.update((t, None) for t in found if t.strip())
        logger.info("%s (%s): %d texts, %d new", path, fmt, len(found), len(texts) - before)
    return list(texts)


def _read_pair_rows(path: Path) -> list[tuple[str, str, float, int]]:
    """Rows ``(state, case, reward, line)`` of a pairs file ``{"state", "case", "reward"}``."""
    rows = []
    for number, row in iter_jsonl(path):
        values = []
        for name in ("state", "case"):
            value = row.get(name)
            if not isinstance(value, str):
                reason = f"missing field {name!r}" if value is None else \
                    f"field {name!r} must be a string, got {type(value).__name__}"
                raise DataFormatError(reason, path=path, line=number)
            if not value.strip():
                raise DataFormatError(f"field {name!r} is empty", path=path, line=number)
            values.append(value)
        reward = row.get("reward")
        if reward is None:
            raise DataFormatError("missing field 'reward'", path=path, line=number)
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
            raise DataFormatError(f"field 'reward' must be a finite number, got {reward!r}", path=path, line=number)
        rows.append((values[0], values[1], float(reward), number))
    return rows


@dataclasses.dataclass(frozen=True)
class PairData:
    """Deduplicated rewarded pairs grouped by state (supervised SimCSE).

    ``states`` and ``cases`` are the unique texts; ``positives[s]`` / ``negatives[s]`` the case
    indices that earned a reward at or above / below the threshold with state ``s`` (a pair seen
    several times counts once, with its mean reward). ``rows``: pairs read; ``duplicates``: rows
    that repeated a pair; ``conflicts``: pairs whose repeats disagree on the side of the threshold.
    """

    states: list[str]
    cases: list[str]
    positives: list[list[int]]
    negatives: list[list[int]]
    rows: int
    duplicates: int
    conflicts: int

    def stats(self) -> dict[str, int]:
        with_pos = sum(1 for p in self.positives if p)
        with_both = sum(1 for p, n in zip(self.positives, self.negatives) if p and n)
        return {"rows": self.rows, "pairs": sum(len(p) + len(n) for p, n in zip(self.positives, self.negatives)),
                "duplicates": self.duplicates, "conflicts": self.conflicts, "states": len(self.states),
                "cases": len(self.cases), "states_with_positive": with_pos,
                "states_with_positive_and_negative": with_both}


def load_pairs(paths: Iterable[str | Path], *, positive_threshold: float = 0.5) -> PairData:
    """Rewarded (state, case) pairs from pairs JSONL ``{"state", "case", "reward"}`` and Memento training pairs.

    A Memento row ``{"query", "case", "truth_label"}`` is the pair (query, case question) with reward
    ``truth_label`` (the task-level outcome of showing that case; the case's own ``case_label`` is
    not the outcome of the pair). Other formats raise ``DataFormatError``: they hold no pairs.
    """
    sums: dict[tuple[str, str], list[float]] = {}
    rows = 0
    for path in paths:
        path = _data_input(path)
        fmt = detect_format(path)
        if fmt == "pairs":
            found = [(s, c, r) for s, c, r, _ in _read_pair_rows(path)]
        elif fmt == "memento-training":
            found = [(p.query, p.case, float(p.truth_label)) for p in read_memento_training_pairs(path)]
        else:
            raise DataFormatError(f"is {fmt} data, which holds no rewarded (state, case) pairs; supervised "
                                  f"SimCSE reads {' or '.join(SUP_FORMATS)} files (use --mode unsup for texts)",
                                  path=path)
        rows += len(found)
        for state, case, reward in found:
            sums.setdefault((state, case), []).append(reward)
        logger.info("%s (%s): %d pairs", path, fmt, len(found))
    state_ids: dict[str, int] = {}
    case_ids: dict[str, int] = {}
    positives: list[list[int]] = []
    negatives: list[list[int]] = []
    conflicts = 0
    for (state, case), rewards in sums.items():
        s = state_ids.setdefault(state, len(state_ids))
        c = case_ids.setdefault(case, len(case_ids))
        if s == len(positives):
            positives.append([])
            negatives.append([])
        sides = {r >= positive_threshold for r in rewards}
        conflicts += len(sides) > 1
        (positives if sum(rewards) / len(rewards) >= positive_threshold else negatives)[s].append(c)
    return PairData(states=list(state_ids), cases=list(case_ids), positives=positives, negatives=negatives,
                    rows=rows, duplicates=rows - len(sums), conflicts=conflicts)


@dataclasses.dataclass(frozen=True)
class SupExample:
    """One supervised anchor: state index, positive case index, hard-negative case index (-1: none)."""

    state: int
    positive: int
    negative: int


def build_sup_examples(data: PairData, *, seed: int, hard_negatives: bool = True) -> list[SupExample]:
    """One example per (state, positive case); the k-th positive of a state gets the k-th of its negatives
    (in a seeded order, cycling), so every negative is used when there are enough positives."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for s, (pos, neg) in enumerate(zip(data.positives, data.negatives)):
        order = [neg[i] for i in torch.randperm(len(neg), generator=gen).tolist()] if neg and hard_negatives else []
        for k, p in enumerate(pos):
            out.append(SupExample(state=s, positive=p, negative=order[k % len(order)] if order else -1))
    return out


# ---------------------------------------------------------------- the loss


def info_nce(anchor_BD: torch.Tensor, candidates_CD: torch.Tensor, temperature: float,
             valid_BC: torch.Tensor | None = None) -> torch.Tensor:
    """InfoNCE over cosine similarities: row ``i``'s positive is column ``i`` (so ``C >= B``).

    ``valid_BC`` (bool) drops columns from row ``i``'s denominator; column ``i`` must stay valid.
    Computed in float32 whatever the input dtype.
    """
    if anchor_BD.ndim != 2 or candidates_CD.ndim != 2 or candidates_CD.shape[0] < anchor_BD.shape[0] \
            or candidates_CD.shape[1] != anchor_BD.shape[1]:
        raise DimensionError(f"info_nce: anchor_BD.shape={tuple(anchor_BD.shape)}, "
                             f"candidates_CD.shape={tuple(candidates_CD.shape)} (need C >= B, same D)")
    a_BD = F.normalize(anchor_BD.float(), dim=-1)
    c_CD = F.normalize(candidates_CD.float(), dim=-1)
    logits_BC = a_BD @ c_CD.T / temperature
    if valid_BC is not None:
        logits_BC = logits_BC.masked_fill(~valid_BC, -math.inf)
    labels_B = torch.arange(a_BD.shape[0], device=a_BD.device)
    return F.cross_entropy(logits_BC, labels_B)


# ---------------------------------------------------------------- batches


def tokenize(tokenizer: Any, texts: Sequence[str], max_length: int) -> dict[str, torch.Tensor]:
    batch = tokenizer(list(texts), padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    return {k: v for k, v in batch.items()}


class ListDataset(Dataset):
    """A list as a map-style dataset."""

    def __init__(self, items: Sequence[Any]):
        self.items = list(items)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> Any:
        return self.items[i]


class UnsupCollate:
    """Texts -> ``{"tokens": ...}`` (each text once; the module doubles them)."""

    def __init__(self, tokenizer: Any, max_length: int):
        self.tokenizer, self.max_length = tokenizer, max_length

    def __call__(self, texts: list[str]) -> dict[str, Any]:
        return {"tokens": tokenize(self.tokenizer, texts, self.max_length)}


class SupCollate:
    """Examples -> anchor, positive and hard-negative tokens plus the denominator mask ``valid_BC``.

    Columns are the B positives, then the hard negatives of the rows that have one. A column is
    invalid for row ``i`` when its case is a known positive of row ``i``'s state (other than column ``i``).
    """

    def __init__(self, tokenizer: Any, max_length: int, data: PairData):
        self.tokenizer, self.max_length, self.data = tokenizer, max_length, data
        self._positive_sets = [set(p) for p in data.positives]

    def __call__(self, examples: list[SupExample]) -> dict[str, Any]:
        d = self.data
        negs = [e.negative for e in examples if e.negative >= 0]
        columns = [e.positive for e in examples] + negs
        valid_BC = torch.tensor([[c == i or columns[c] not in self._positive_sets[e.state] for c in range(len(columns))]
                                 for i, e in enumerate(examples)], dtype=torch.bool)
        out: dict[str, Any] = {
            "anchor": tokenize(self.tokenizer, [d.states[e.state] for e in examples], self.max_length),
            "positive": tokenize(self.tokenizer, [d.cases[e.positive] for e in examples], self.max_length),
            "valid_BC": valid_BC,
        }
        if negs:
            out["negative"] = tokenize(self.tokenizer, [d.cases[c] for c in negs], self.max_length)
        return out


class SimCSEDataModule(L.LightningDataModule):
    """Serves unsupervised texts or supervised examples; data are read in ``setup`` unless given.

    ``texts`` (unsup) or ``pairs`` (sup) skip reading ``config.data``. The training order is
    shuffled with a generator seeded from ``config.seed``. ``eval_batch()`` is the fixed batch
    whose loss :class:`SimCSEModule` reports before and after training.
    """

    def __init__(self, config: SimCSEConfig, tokenizer: Any, *, texts: Sequence[str] | None = None,
                 pairs: PairData | None = None):
        super().__init__()
        self.config, self.tokenizer = config, tokenizer
        self.texts = None if texts is None else list(texts)
        self.pairs = pairs
        self.examples: list[SupExample] | None = None
        self._ready = False

    def setup(self, stage: str | None = None) -> None:
        if self._ready:  # train_encoder calls it before the Trainer does
            return
        cfg = self.config
        if cfg.mode == "unsup":
            if self.texts is None:
                self.texts = load_texts(cfg.data, include_actions=cfg.include_actions)
            if len(self.texts) < 2:
                raise DataFormatError(f"unsupervised SimCSE needs at least 2 distinct texts; got {len(self.texts)} "
                                      f"from {list(cfg.data)}")
        else:
            if self.pairs is None:
                self.pairs = load_pairs(cfg.data, positive_threshold=cfg.positive_threshold)
            if self.examples is None:
                self.examples = build_sup_examples(self.pairs, seed=cfg.seed, hard_negatives=cfg.hard_negatives)
            stats = self.pairs.stats()
            if len(self.examples) < 2:
                raise DataFormatError(f"supervised SimCSE needs at least 2 (state, positive case) pairs; got "
                                      f"{len(self.examples)} from {list(cfg.data)} ({stats})")
            no_neg = stats["states_with_positive"] - stats["states_with_positive_and_negative"]
            if cfg.hard_negatives and no_neg:
                logger.warning("%d of %d states with a positive case have no reward-0 case: their anchors train "
                               "with in-batch negatives only", no_neg, stats["states_with_positive"])
        self._ready = True

    @property
    def items(self) -> list[Any]:
        return list(self.texts if self.config.mode == "unsup" else self.examples)  # type: ignore[arg-type]

    def collate(self) -> Callable[[list[Any]], dict[str, Any]]:
        if self.config.mode == "unsup":
            return UnsupCollate(self.tokenizer, self.config.max_length)
        assert self.pairs is not None
        return SupCollate(self.tokenizer, self.config.max_length, self.pairs)

    def train_dataloader(self) -> DataLoader:
        items = self.items
        gen = torch.Generator().manual_seed(self.config.seed)
        return DataLoader(ListDataset(items), batch_size=self.config.batch_size, shuffle=True, generator=gen,
                          drop_last=len(items) > self.config.batch_size, collate_fn=self.collate())

    def eval_batch(self) -> dict[str, Any]:
        """A fixed batch of ``eval_size`` items: the first texts (unsup), or examples taken one state at a
        time, round robin (sup: examples of one state mask each other out of the denominator)."""
        if self.config.mode == "unsup":
            return self.collate()(self.items[:self.config.eval_size])
        by_state: dict[int, list[SupExample]] = {}
        for example in self.items:
            by_state.setdefault(example.state, []).append(example)
        queues = list(by_state.values())
        chosen = [q[i] for i in range(max(map(len, queues))) for q in queues if i < len(q)]
        return self.collate()(chosen[:self.config.eval_size])


# ---------------------------------------------------------------- the module


def trainable_encoder(config: Any) -> Encoder:
    """The encoder of ``config.model`` (with ``config.pooling`` and ``config.max_length``) to train: on the CPU
    (Lightning moves it), without the embedding cache."""
    return Encoder.from_pretrained(config.model, pooling=config.pooling, max_length=config.max_length, device="cpu",
                                   use_cache=False)


def seeded_fit(trainer: Any, module: Any, seed: int, **data: Any) -> float:
    """``trainer.fit(module, **data)`` under torch's global RNG seeded with ``seed`` (forked: the caller's RNG state,
    CUDA's included, is restored afterwards); returns the seconds it took."""
    cuda = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    start = time.perf_counter()
    with torch.random.fork_rng(devices=cuda):
        torch.manual_seed(seed)
        trainer.fit(module, **data)
    return time.perf_counter() - start


class SimCSEModule(L.LightningModule):
    """The encoder (``self.model``, a transformers model) trained with the SimCSE loss of ``config.mode``.

    ``encoder`` (an :class:`~memento.encoders.Encoder`) is loaded from ``config.model`` when not
    given; its ``pool`` is the pooling used here, and its tokenizer is the one saved.
    """

    def __init__(self, config: SimCSEConfig, encoder: Encoder | None = None):
        super().__init__()
        self.config = config
        self.save_hyperparameters({"config": to_dict(config)})
        if encoder is None:
            encoder = trainable_encoder(config)
        if encoder.pooling != config.pooling:
            raise CheckpointError(f"SimCSEModule: encoder pooling {encoder.pooling!r} != config.pooling "
                                  f"{config.pooling!r}")
        self.encoder = encoder
        self.model = encoder.model
        self.tokenizer = encoder.tokenizer
        self.base_model = encoder.model_id
        if config.dropout is not None:
            set_dropout(self.model, config.dropout)
        self.model.train()  # Encoder loads it in eval mode; Lightning keeps submodules' modes as they are
        self.eval_inputs: dict[str, Any] | None = None
        self.eval_losses: dict[str, float] = {}
        self.step_seconds: list[float] = []  # wall time of each training batch (forward, backward, optimiser step)
        self._step_start = 0.0

    def embed(self, tokens: dict[str, torch.Tensor]) -> torch.Tensor:
        """Pooled, unnormalised vectors ``[B, D]`` (differentiable): the model's forward + ``Encoder.pool``."""
        outputs = self.model(**tokens)
        return self.encoder.pool(outputs, tokens["attention_mask"])

    @torch.no_grad()
    def embed_texts(self, texts: Sequence[str], *, normalize: bool = True) -> torch.Tensor:
        """Unit vectors ``[N, D]`` of ``texts`` in eval mode (what the saved encoder will give)."""
        was_training = self.model.training
        self.model.eval()
        try:
            tokens = {k: v.to(self.device) for k, v in tokenize(self.tokenizer, texts, self.config.max_length).items()}
            out_ND = self.embed(tokens).float()
        finally:
            self.model.train(was_training)
        return F.normalize(out_ND, dim=-1) if normalize else out_ND

    def batch_loss(self, batch: dict[str, Any]) -> torch.Tensor:
        """The SimCSE loss of one collated batch (dropout active when the model is in training mode)."""
        tau = self.config.temperature
        if self.config.mode == "unsup":
            tokens = batch["tokens"]
            doubled = {k: torch.cat([v, v]) for k, v in tokens.items()}  # one forward, two dropout masks per text
            z_2BD = self.embed(doubled)
            b = tokens["input_ids"].shape[0]
            return info_nce(z_2BD[:b], z_2BD[b:], tau)
        anchor_BD = self.embed(batch["anchor"])
        cands_CD = self.embed(batch["positive"])
        if "negative" in batch:
            cands_CD = torch.cat([cands_CD, self.embed(batch["negative"])])
        return info_nce(anchor_BD, cands_CD, tau, batch["valid_BC"])

    def fixed_batch_loss(self, batch: dict[str, Any]) -> float:
        """``batch_loss`` in training mode (SimCSE's objective) with dropout masks from ``config.seed``,
        without touching the caller's RNG state: comparable before and after training."""
        was_training = self.model.training
        devices = [self.device.index or 0] if self.device.type == "cuda" else []
        batch = _to_device(batch, self.device)
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            torch.manual_seed(self.config.seed)
            self.model.train()
            try:
                return float(self.batch_loss(batch))
            finally:
                self.model.train(was_training)

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        loss = self.batch_loss(batch)
        self.log("train/loss", loss, prog_bar=True, batch_size=self._batch_size(batch))
        self.log("train/lr", self.trainer.optimizers[0].param_groups[0]["lr"], batch_size=self._batch_size(batch))
        return loss

    @staticmethod
    def _batch_size(batch: dict[str, Any]) -> int:
        return int((batch["tokens"] if "tokens" in batch else batch["anchor"])["input_ids"].shape[0])

    def _log_eval(self, name: str) -> None:
        if self.eval_inputs is None:
            return
        loss = self.fixed_batch_loss(self.eval_inputs)
        self.eval_losses[name] = loss
        if self.logger is not None and self.trainer.is_global_zero:
            self.logger.log_metrics({f"eval/{name}": loss}, step=self.global_step)

    def on_fit_start(self) -> None:
        self._log_eval("loss_before")

    def on_train_start(self) -> None:
        self.model.train()  # dropout on: SimCSE's augmentation

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self._step_start = time.perf_counter()

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.step_seconds.append(time.perf_counter() - self._step_start)

    def on_fit_end(self) -> None:
        self._log_eval("loss_after")

    def configure_optimizers(self) -> Any:
        cfg = self.config
        decay: list[nn.Parameter] = []
        no_decay: list[nn.Parameter] = []
        for name, param in self.model.named_parameters():
            (no_decay if param.ndim < 2 or "LayerNorm" in name or "layer_norm" in name else decay).append(param)
        optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                                       {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr)
        total = max(1, int(self.trainer.estimated_stepping_batches))
        warmup = int(cfg.warmup_ratio * total)

        def factor(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            return max(0.0, (total - step) / max(1, total - warmup))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def set_dropout(model: nn.Module, p: float) -> None:
    """Every ``nn.Dropout`` of ``model`` (and its config's hidden/attention dropout) to ``p``."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = p
    for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "dropout", "attention_dropout"):
        if hasattr(model.config, name):
            setattr(model.config, name, p)


def _to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, dict):
        return {k: _to_device(v, device) for k, v in batch.items()}
    return batch


# ---------------------------------------------------------------- saving


def save_encoder(model: Any, tokenizer: Any, directory: str | Path, *, pooling: Pooling, max_length: int,
                 base_model: str, extra: dict[str, Any] | None = None) -> Path:
    """Write a transformers directory (safetensors weights, config, tokenizer) plus ``memento_encoder.json``.

    The directory is written beside its target and renamed into place, so ``directory`` is either
    the previous encoder or the new one, never half of one.
    """
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = directory.with_name(f".{directory.name}.tmp-{os.getpid()}")
    old = directory.with_name(f".{directory.name}.old-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        if not list(tmp.glob("*.safetensors")):
            raise CheckpointError(f"{tmp}: save_pretrained wrote no safetensors weights")
        meta = {"format": ENCODER_META_FORMAT, "format_version": ENCODER_META_VERSION, "pooling": pooling,
                "max_length": max_length, "dim": int(model.config.hidden_size), "normalize": True,
                "base_model": base_model, **(extra or {})}
        atomic_write_text(tmp / ENCODER_META_NAME, json.dumps(meta, indent=2, sort_keys=True) + "\n")
        if directory.exists():
            os.replace(directory, old)
        os.replace(tmp, directory)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
    return directory


# ---------------------------------------------------------------- the run


@dataclasses.dataclass(frozen=True, kw_only=True)
class SimCSEResult:
    """What :func:`train_encoder` did (also written to ``OUT/result.json``)."""

    out: str
    encoder_dir: str
    mode: str
    items: int
    steps: int
    seconds: float
    seconds_per_step: float
    loss_before: float | None
    loss_after: float | None
    device: str
    precision: str
    reload_max_abs_diff: float | None
    data_stats: dict[str, Any]


def train_encoder(config: SimCSEConfig, out: str | Path, *, texts: Sequence[str] | None = None,
                  pairs: PairData | None = None, encoder: Encoder | None = None, progress: bool = False,
                  callbacks: Sequence[Any] = ()) -> SimCSEResult:
    """Fine-tune the encoder with SimCSE and save it to ``OUT/encoder`` (see the module docstring).

    Data come from ``config.data`` unless ``texts`` (unsup) or ``pairs`` (sup) are given; they are
    read and checked before anything is written. ``encoder`` (loaded from ``config.model`` when
    None) is trained in place. The caller's torch RNG state is left as it was.
    """
    out = Path(out)
    if config.mode == "unsup" and texts is None:  # read and check the data before loading the model
        texts = load_texts(config.data, include_actions=config.include_actions)
    if config.mode == "sup" and pairs is None:
        pairs = load_pairs(config.data, positive_threshold=config.positive_threshold)
    module = SimCSEModule(config, encoder)
    data = SimCSEDataModule(config, module.tokenizer, texts=texts, pairs=pairs)
    data.setup("fit")  # checks sizes before anything is written
    module.eval_inputs = data.eval_batch()
    out.mkdir(parents=True, exist_ok=True)
    save_json(config, out / CONFIG_NAME)
    lightning = trainer_kwargs(config.lightning)
    precision = lightning["precision"]
    from lightning.pytorch.loggers import TensorBoardLogger

    trainer = L.Trainer(
        **lightning, max_epochs=config.epochs, max_steps=config.max_steps or -1,
        logger=TensorBoardLogger(save_dir=str(out), name="tb", version="", default_hp_metric=False),
        enable_checkpointing=False, enable_progress_bar=progress, enable_model_summary=False,
        num_sanity_val_steps=0, limit_val_batches=0, callbacks=list(callbacks))
    seconds = seeded_fit(trainer, module, config.seed, datamodule=data)
    steps = int(trainer.global_step)
    device = str(module.device)
    per_step = sum(module.step_seconds) / len(module.step_seconds) if module.step_seconds else float("nan")
    if not trainer.is_global_zero:
        return SimCSEResult(out=str(out), encoder_dir=str(out / ENCODER_DIR), mode=config.mode, items=len(data.items),
                            steps=steps, seconds=seconds, seconds_per_step=per_step,
                            loss_before=None, loss_after=None, device=device, precision=precision,
                            reload_max_abs_diff=None, data_stats={})
    data_stats = {"texts": len(data.items)} if config.mode == "unsup" else \
        {"examples": len(data.items), **data.pairs.stats()}  # type: ignore[union-attr]
    figures: dict[str, Any] = {"steps": steps, "seconds_per_step": per_step,
               "loss_before": module.eval_losses.get("loss_before"),
               "loss_after": module.eval_losses.get("loss_after"), "data": data_stats}
    module.model.eval()
    encoder_dir = save_encoder(module.model, module.tokenizer, out / ENCODER_DIR, pooling=config.pooling,
                               max_length=config.max_length, base_model=module.base_model,
                               extra={"training": to_dict(config), "figures": figures})
    if config.mode == "unsup":
        probe = [str(t) for t in data.items[:8]]
    else:
        examples, pair_data = data.items[:4], data.pairs
        assert pair_data is not None  # setup read them
        probe = [pair_data.states[e.state] for e in examples] + [pair_data.cases[e.positive] for e in examples]
    diff = _check_reload(module, encoder_dir, list(dict.fromkeys(probe)), config)
    result = SimCSEResult(out=str(out), encoder_dir=str(encoder_dir), mode=config.mode, items=len(data.items),
                          steps=steps, seconds=seconds, seconds_per_step=per_step,
                          loss_before=figures["loss_before"], loss_after=figures["loss_after"], device=device,
                          precision=precision, reload_max_abs_diff=diff, data_stats=data_stats)
    atomic_write_text(out / RESULT_NAME, json.dumps(dataclasses.asdict(result), indent=2, sort_keys=True) + "\n")
    logger.info("SimCSE %s: %d steps in %.1f s, fixed-batch loss %s -> %s; encoder saved to %s", config.mode, steps,
                seconds, figures["loss_before"], figures["loss_after"], encoder_dir)
    return result


def _check_reload(module: SimCSEModule, encoder_dir: Path, texts: list[str], config: SimCSEConfig) -> float:
    """Load the saved directory through ``Encoder.from_pretrained`` and compare the vectors of ``texts``
    with the in-memory model in eval mode; a mismatch is a ``CheckpointError``."""
    device = "cuda" if module.device.type == "cuda" else "cpu"
    loaded = Encoder.from_pretrained(encoder_dir, max_length=config.max_length, device=device, use_cache=False)
    if loaded.pooling != config.pooling:
        raise CheckpointError(f"{encoder_dir}: reloads with pooling {loaded.pooling!r}, trained with "
                              f"{config.pooling!r}")
    mine_ND = module.embed_texts(texts).cpu().numpy()
    theirs_ND = loaded.encode(texts)
    diff = float(abs(mine_ND - theirs_ND).max())
    if diff > 1e-3:
        raise CheckpointError(f"{encoder_dir}: the reloaded encoder differs from the trained model by {diff:.2e} "
                              f"on {len(texts)} texts")
    return diff

