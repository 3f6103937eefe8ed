"""``memento train``: offline Q-network training with Lightning (the parser and the handler).

``memento.cli.entry`` calls :func:`add_parser` while it builds its parser and :func:`run` for the
command; this module imports only the standard library and ``memento``/``memento.training.config``
at module level (Lightning is imported when a run starts).

The run configuration is built in three layers: the defaults of :class:`~memento.training.config.TrainConfig`,
then ``--config FILE`` (a TrainConfig JSON, ``qnet.dim`` may be left out), then each flag given on
the command line. ``--resume`` takes the run's own ``config.json`` as the base instead and allows
only trainer flags (more epochs, other devices...).
"""

from __future__ import annotations

import argparse
import copy
import logging
import math
import sys
from pathlib import Path
from typing import Any

from memento import flags
from memento.errors import ConfigError
from memento.extras import require
from memento.flags import config_option, config_options, field_help, load_encoder
from memento.types import shown

__all__ = ["add_parser", "build_train_config", "run"]

_DESCRIPTION = """\
Train a case selector's Q-network offline from logged (state, case, reward) data, with a
PyTorch Lightning Trainer (CPU, one GPU, or many GPUs and nodes with --strategy ddp).
Texts are encoded once with the cached encoder; train/validation is split by state.

data (exactly one source):
  --from-log RUN_DIR|steps.jsonl      an online-loop transition log (case texts from RUN_DIR/bank
                                      or --bank DIR)
  --from-memento PAIRS --memory MEM   Memento retriever pairs {"query","case","plan","truth_label"}
                                      with the case memory {"case","plan","case_label"} they use
  --cases CASES --rewards REWARDS     a Case JSONL bank plus a rewards JSONL file, one line per
                                      observation: {"state","case_id","reward","propensity"?}
  --from-labels LABELS --bank DIR     planner-scored labels (memento score) with the bank their
                                      candidate ids refer to; trained with the listwise loss
                                      KL(softmax(mean_logprob / tau) || softmax(Q / alpha)) per task

The run directory --out gets config.json (the full TrainConfig), data.json (label statistics),
tb/ (TensorBoard: train/val loss, AUC, calibration error, hit@K per state), checkpoints/
(last.ckpt, best-*.ckpt) and selector/: the best checkpoint as SoftQLearner.save writes it,
which the online loop and the export step load. Mixed-label statistics are printed with a
warning when few states have both rewarded and unrewarded cases."""


def add_parser(commands: Any) -> argparse.ArgumentParser:
    """Add the ``train`` subcommand to ``commands`` (an ``add_subparsers()`` result).

    The options for config fields are derived from the config classes (:func:`memento.flags.config_option`): their
    types, choices, defaults and, where the field has one, their help.
    """
    from memento.config import EncoderConfig, LearnerConfig

    p = commands.add_parser("train", help="train a Q-network offline from logs or labelled pairs (Lightning)",
                            description=_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    flags.add_config_file(p, "a TrainConfig JSON file (qnet.dim may be left out); flags override it")
    flags.add_out(p, "run directory (created)")
    flags.add_resume(p, "continue the run in --out from checkpoints/last.ckpt (its config.json is the base; only "
                        "trainer flags may change)")
    config_option(p, LearnerConfig, "seed", "seed of the Q-network initialisation, the dropout masks, the batch "
                  "order and the split")
    flags.add_torch_threads(p)
    flags.add_no_progress(p)
    data = p.add_argument_group("data")
    _add_data_options(data)
    flags.add_encoder_flag(data)
    config_options(data, EncoderConfig, ("pooling", "max_length"))
    _add_model_options(p)
    _add_trainer_options(p.add_argument_group("trainer (Lightning)"))
    return p


def _add_data_options(data: Any) -> None:
    from memento.training.config import DataConfig

    source = {"shown_default": flags.HIDDEN}
    config_option(data, DataConfig, "log", flag="--from-log", dest="from_log", metavar="PATH", **source)
    flags.add_bank_option(data, f"the case bank the log's case ids refer to, {flags.BANK} (default: bank/ beside "
                          "steps.jsonl); with --from-labels, required: the bank the labels were scored on")
    config_option(data, DataConfig, "memento_pairs", flag="--from-memento", dest="from_memento", metavar="FILE",
                  **source)
    config_option(data, DataConfig, "memento_memory", flag="--memory", dest="memory", metavar="FILE", **source)
    config_option(data, DataConfig, "cases", metavar="FILE", **source)
    config_option(data, DataConfig, "rewards", metavar="FILE", **source)
    config_option(data, DataConfig, "labels", flag="--from-labels", dest="from_labels", metavar="FILE", **source)
    config_options(data, DataConfig, ("tau", "val_fraction", "label_threshold", "num_workers"))


def _add_model_options(p: argparse.ArgumentParser) -> None:
    """The Q-network's and the learner's fields (their help from the config classes)."""
    from memento.config import LearnerConfig, QNetConfig

    net = p.add_argument_group("Q-network")
    for name in ("arch", "hidden", "n_layers", "dropout", "embed_dim", "anchor"):
        config_option(net, QNetConfig, name)
    config_option(net, QNetConfig, "features", f"{field_help(QNetConfig, 'features')}; --from-labels only")
    learn = p.add_argument_group("learner (the online learner's settings)")
    for name in ("batch_size", "lr", "weight_decay", "max_grad_norm", "gamma", "td_loss", "alpha", "alpha_schedule",
                 "target_every", "target_beta", "importance_weights"):
        config_option(learn, LearnerConfig, name)


def _add_trainer_options(tr: Any) -> None:
    from memento.training.config import LightningConfig, TrainerConfig

    config_options(tr, TrainerConfig, ("max_epochs", "max_steps", "patience"))
    config_options(tr, LightningConfig, ("accelerator", "devices", "num_nodes", "strategy", "precision",
                                         "log_every_n_steps"))
    config_option(tr, TrainerConfig, "hit_k")


_SOURCE_FLAGS = {"from_log": ("log", "log"), "from_memento": ("memento", "memento_pairs"),
                 "cases": ("cases", "cases"), "from_labels": ("labels", "labels")}
_SOURCE_FIELDS = ("log", "bank", "memento_pairs", "memento_memory", "cases", "rewards", "labels")
_FLAG_FIELDS = {  # argparse dest -> its field's path in the TrainConfig JSON
    "bank": ("data", "bank"), "memory": ("data", "memento_memory"), "rewards": ("data", "rewards"),
    "val_fraction": ("data", "val_fraction"), "label_threshold": ("data", "label_threshold"),
    "num_workers": ("data", "num_workers"), "tau": ("data", "tau"),
    "encoder": ("data", "encoder", "model"), "pooling": ("data", "encoder", "pooling"),
    "max_length": ("data", "encoder", "max_length"),
    "arch": ("qnet", "arch"), "hidden": ("qnet", "hidden"), "n_layers": ("qnet", "n_layers"),
    "dropout": ("qnet", "dropout"), "embed_dim": ("qnet", "embed_dim"), "anchor": ("qnet", "anchor"),
    "features": ("qnet", "features"),
    "batch_size": ("learner", "batch_size"), "lr": ("learner", "lr"), "weight_decay": ("learner", "weight_decay"),
    "max_grad_norm": ("learner", "max_grad_norm"), "gamma": ("learner", "gamma"), "td_loss": ("learner", "td_loss"),
    "alpha": ("learner", "alpha"), "alpha_schedule": ("learner", "alpha_schedule"),
    "target_every": ("learner", "target_every"), "target_beta": ("learner", "target_beta"),
    "importance_weights": ("learner", "importance_weights"),
    "max_epochs": ("trainer", "max_epochs"), "max_steps": ("trainer", "max_steps"),
    "patience": ("trainer", "patience"), "hit_k": ("trainer", "hit_k"),
    **{name: ("trainer", "lightning", name)
       for name in ("accelerator", "devices", "num_nodes", "strategy", "precision", "log_every_n_steps")},
}


def _read_json_object(path: Path) -> dict[str, Any]:
    from memento.io import read_json

    data = read_json(path, error=ConfigError, what="config file", encoding="utf-8-sig")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object (a TrainConfig), got {type(data).__name__}")
    return data


def _nested(path: Path) -> dict[str, Any]:
    """The TrainConfig JSON object in ``path``, its trainer's Lightning fields nested (older files have them flat)."""
    from memento.training.config import nest_flat_lightning

    raw = _read_json_object(path)
    trainer = raw.get("trainer")
    if isinstance(trainer, dict):
        try:
            raw["trainer"] = nest_flat_lightning(trainer, where="TrainConfig.trainer")
        except ConfigError as error:
            raise ConfigError(f"{path}: {error}") from None
    return raw


def _overrides(args: argparse.Namespace) -> dict[tuple[str, ...], Any]:
    """The flags given on the command line, as ``{path in the TrainConfig JSON: value}`` (``None``: remove)."""
    out: dict[tuple[str, ...], Any] = {}
    sources = [flag for flag in _SOURCE_FLAGS if getattr(args, flag) is not None]
    if len(sources) > 1:
        names = " and ".join("--" + s.replace("_", "-") for s in sources)
        raise ConfigError(f"{names}: give one data source")
    if sources:
        source, field = _SOURCE_FLAGS[sources[0]]
        out.update({("data", name): None for name in _SOURCE_FIELDS})
        out.update({("data", "source"): source, ("data", field): getattr(args, sources[0])})
    for dest, path in _FLAG_FIELDS.items():
        value = getattr(args, dest)
        if value is not None:
            out[path] = value
    if args.no_progress:
        out["trainer", "progress_bar"] = False
    if args.seed is not None:
        for path in (("qnet", "seed"), ("learner", "seed"), ("data", "split_seed")):
            out[path] = args.seed
    return out


def _merge(raw: dict[str, Any], overrides: dict[tuple[str, ...], Any]) -> dict[str, Any]:
    raw = copy.deepcopy(raw)
    for path, value in overrides.items():
        target = raw
        for depth, name in enumerate(path[:-1]):
            target = target.setdefault(name, {})
            if not isinstance(target, dict):
                raise ConfigError(f"TrainConfig.{'.'.join(path[:depth + 1])}={shown(target)}: expected an object")
        if value is None:
            target.pop(path[-1], None)
        else:
            target[path[-1]] = value
    return raw


def _section(raw: dict[str, Any], name: str) -> dict[str, Any]:
    """The object ``raw[name]`` (an empty one when absent); anything else is a one-line ConfigError."""
    value = raw.get(name, {})
    if not isinstance(value, dict):
        raise ConfigError(f"TrainConfig.{name}={shown(value)}: expected an object, got {type(value).__name__}")
    return value


def _check_pairs(raw: dict[str, Any]) -> None:
    data = _section(raw, "data")
    source = data.get("source")
    if source is None:
        raise ConfigError("no training data: give --from-log PATH, --from-memento PAIRS --memory MEMORY, "
                          "--cases CASES --rewards REWARDS, or --from-labels LABELS --bank DIR (or a --config file "
                          "with a data section)")
    if source == "memento" and not data.get("memento_memory"):
        raise ConfigError("--from-memento needs --memory FILE (the case memory the pairs refer to)")
    if source == "cases" and not data.get("rewards"):
        raise ConfigError("--cases needs --rewards FILE (JSONL {\"state\", \"case_id\", \"reward\"})")
    if source == "labels" and not data.get("bank"):
        raise ConfigError("--from-labels needs --bank DIR (the case bank the labels' candidate ids refer to)")
    for flag, field, needs in (("--memory", "memento_memory", "memento"), ("--rewards", "rewards", "cases")):
        if data.get(field) is not None and source != needs:
            raise ConfigError(f"{flag} goes with --{'from-' if needs != 'cases' else ''}{needs} "
                              f"(this run's data source is {shown(source)})")
    if data.get("bank") is not None and source not in ("log", "labels"):
        raise ConfigError(f"--bank goes with --from-log or --from-labels (this run's data source is "
                          f"{shown(source)})")


def build_train_config(args: argparse.Namespace, *, dim: int | None = None) -> Any:
    """The :class:`~memento.training.config.TrainConfig` of the command line (``dim``: the encoder's, when loaded)."""
    from memento.config import to_dict
    from memento.training.config import RESUMABLE_CHANGES, train_config_from_dict

    overrides = _overrides(args)
    out = Path(args.out)
    if args.resume:
        if args.config is not None:
            raise ConfigError("--resume continues with the run's own config.json; do not pass --config")
        base = _nested(out / "config.json")
        before = train_config_from_dict(base)
        after = train_config_from_dict(_merge(base, overrides))
        changed = [section for section in ("data", "qnet", "learner")
                   if to_dict(getattr(before, section)) != to_dict(getattr(after, section))]
        if changed:
            raise ConfigError(f"--resume: the {', '.join(changed)} settings differ from {out / 'config.json'}; a "
                              f"resumed run may change only trainer settings ({', '.join(RESUMABLE_CHANGES)})")
    else:
        base = _nested(Path(args.config)) if args.config is not None else {}
    raw = _merge(base, overrides)
    _check_pairs(raw)
    provisional = dim if dim is not None else _section(raw, "qnet").get("dim", 1)
    return train_config_from_dict(raw, dim=provisional)


def _quiet_lightning(verbose: bool) -> None:
    if not verbose:  # Lightning's rank-zero info lines (GPU available: ..., tips) are noise at the CLI
        logging.getLogger("lightning.pytorch.utilities.rank_zero").setLevel(logging.WARNING)
        logging.getLogger("lightning.fabric.utilities.rank_zero").setLevel(logging.WARNING)


def _print_stats(stats: dict[str, Any]) -> None:
    from memento.training.data import label_warning

    a = stats["all"]
    if stats["source"] == "labels":
        notes = stats.get("notes", {})
        cosine = notes.get("best_is_cosine_top1")
        print(f"data (labels): {a['rows']} tasks, {a['pairs']} scored (task, candidate) pairs "
              f"({notes.get('candidates_mean', 0):.1f} candidates per task); train {stats['train']['states']} "
              f"states / validation {stats['val']['states']} states")
        print(f"labels: planner {', '.join(notes.get('planners', []))}; mean spread of mean_logprob within a task "
              f"{notes.get('score_spread_mean', 0):.3f}" + (f"; the planner's best candidate is cosine's top-1 in "
                                                            f"{cosine:.0%} of the tasks" if cosine is not None else ""))
        if notes.get("rows_with_one_candidate"):
            print(f"note: {notes['rows_with_one_candidate']} task(s) have a single candidate (nothing to rank)")
        return
    print(f"data ({stats['source']}): {a['rows']} decisions, {a['pairs']} (state, case) pairs, {a['states']} states; "
          f"train {stats['train']['states']} states / validation {stats['val']['states']} states")
    print(f"labels: {a['mixed']} states with mixed labels, {a['all_rewarded']} all rewarded, "
          f"{a['all_unrewarded']} all unrewarded")
    notes = stats.get("notes", {})
    if notes.get("cases_not_in_memory"):
        print(f"note: {notes['cases_not_in_memory']} cases of the pairs are not in the memory file "
              "(encoded from the pairs' text)")
    if notes.get("records_without_selection"):
        print(f"note: {notes['records_without_selection']} log records chose no case and were skipped")
    warning = label_warning(a)
    if warning:
        print(f"memento: warning: {warning}", file=sys.stderr)


def require_train_extra(command: str = "train", modules: tuple[str, ...] = ()) -> None:
    """:func:`memento.extras.require` of the 'train' extra (``modules``, default all of it) for ``memento COMMAND``
    (found, not imported: nothing heavy loads before the command's checks)."""
    require("train", *modules, what=f"memento {command}")


def run(args: argparse.Namespace) -> int:
    """The ``memento train`` command; returns the exit status (errors are raised as ``MementoError``)."""
    require_train_extra()  # before anything loads: a missing extra is one line, not a traceback
    from memento.training.run import launched_rank_zero

    config = build_train_config(args)  # every cheap check before the encoder is loaded
    flags.check_accelerator(config.trainer.lightning.accelerator)
    out = Path(args.out)
    rank_zero = launched_rank_zero()  # DDP re-runs this command in one process per further device
    if rank_zero and not args.resume and (out / "config.json").exists():
        raise ConfigError(f"{out}: already holds a training run; pass --resume or choose another --out")
    last = out / "checkpoints" / "last.ckpt"
    if args.resume and not last.is_file():
        from memento.errors import CheckpointError

        raise CheckpointError(f"{last}: no Lightning checkpoint to resume from")
    flags.check_torch_threads(args)
    from memento.training.data import check_inputs

    check_inputs(config.data)
    flags.set_torch_threads(args.torch_threads)
    _quiet_lightning(getattr(args, "verbose", 0) > 0)
    encoder = load_encoder(config.data.encoder)
    config = build_train_config(args, dim=encoder.dim)
    from memento.training.data import QDataModule

    dm = QDataModule(config.data, batch_size=config.learner.batch_size, encoder=encoder, seed=config.learner.seed,
                     gamma=config.learner.gamma, features=config.qnet.features)
    dm.prepare_data()
    dm.setup("fit")
    if rank_zero:
        _print_stats(dm.stats())
    from memento.training.run import train_q

    summary = train_q(config, out, encoder=encoder, data=dm.data, resume=args.resume)
    if not rank_zero:
        return 0
    m = summary["metrics"]

    def fmt(name: str) -> str:
        return f"{m[name]:.3f}" if name in m else "n/a"

    print(f"trained {summary['global_step']} steps, {summary['epochs']} epochs on {summary['device']} "
          f"({summary['precision']}) in {summary['fit_s']:.1f} s")
    if config.data.source == "labels":
        print(f"best checkpoint {summary['best_checkpoint']}: val listwise KL {fmt('val/loss')}")
        hits = [k for k in config.trainer.hit_k if f"val/hit@{k}" in m]
        if hits:
            print(f"planner's best candidate among Q's top K on {int(m['val/ranking_states'])} held-out tasks: "
                  + ", ".join(f"hit@{k} {m[f'val/hit@{k}']:.3f} (cosine {m.get(f'val/hit@{k}_cosine', math.nan):.3f}, "
                              f"random {m[f'val/hit@{k}_random']:.3f})" for k in hits))
        print(f"run in {out}: config.json, tb/ (tensorboard --logdir {out / 'tb'}), checkpoints/, "
              f"selector/ (SoftQLearner.load)")
        return 0
    line = f"best checkpoint {summary['best_checkpoint']}: val loss {fmt('val/loss')}, held-out AUC {fmt('val/auc')}"
    if "val/ece" in m:
        line += f", calibration error {fmt('val/ece')}"
    print(line)
    hits = [k for k in config.trainer.hit_k if f"val/hit@{k}" in m]
    if hits:
        print(f"ranking on {int(m['val/ranking_states'])} held-out states with mixed labels: " + ", ".join(
            f"hit@{k} {m[f'val/hit@{k}']:.3f} (random {m[f'val/hit@{k}_random']:.3f})" for k in hits))
    else:
        print("ranking: no held-out state has mixed labels, so hit@K is not measured")
    print(f"run in {out}: config.json, tb/ (tensorboard --logdir {out / 'tb'}), checkpoints/, "
          f"selector/ (SoftQLearner.load)")
    return 0

