"""``memento train-encoder``: SimCSE fine-tuning of the encoder from the command line.

This module only builds the argument parser and imports nothing heavy at module level:
``memento --help`` builds every subcommand's parser. Its options for :class:`~memento.training.config.SimCSEConfig`
fields are derived from the class (:func:`memento.flags.config_option`: type, choices, the default shown).
:func:`run` imports torch, Lightning and :mod:`memento.training.simcse` when the command actually runs.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from memento.config import field_default
from memento.flags import (
    HIDDEN,
    add_config_file,
    add_out,
    check_accelerator,
    config_option,
    config_options,
    config_switch,
    given_fields,
    shown,
)
from memento.training.config import LightningConfig, SimCSEConfig

__all__ = ["DESCRIPTION", "add_parser", "config_from_args", "run"]

_TAU = shown(field_default(SimCSEConfig, "temperature"))

DESCRIPTION = f"""\
Fine-tune the text encoder with SimCSE (contrastive learning, InfoNCE over cosine similarities, in-batch
negatives, temperature {_TAU}) on the project's own texts, and save it as a transformers directory that
`--encoder OUT/encoder` and Encoder.from_pretrained("OUT/encoder") load.

modes:
  unsup  every text twice through the encoder with different dropout masks (the positive pair); texts are
         case states and actions, task questions, Memento queries/cases/plans: any --data file below
  sup    rewarded pairs: (state, case with reward >= --positive-threshold) is a positive; the state's
         reward-0 cases are hard negatives in the denominator. --data must hold pairs:
           pairs JSONL {{"state", "case", "reward"}}
           Memento retriever pairs {{"query", "case", "truth_label", ...}} (reward = truth_label)

--data formats (detected from the first row's keys; a bad row prints FILE:LINE: reason and exits 2):
  Case JSONL {{"id", "state", "action", "reward", ...}}    Task JSONL {{"id", "question", "answers", ...}}
  pairs {{"state", "case", "reward"}}                      Memento training pairs, memory, np-memory, tasks
  a case bank directory (cases.sqlite)

output (OUT):
  config.json        the run's SimCSEConfig (reusable with --config)
  encoder/           model.safetensors, config.json, tokenizer files, memento_encoder.json (pooling, ...)
  tb/                TensorBoard events: train/loss, train/lr, eval/loss_before, eval/loss_after
  result.json        steps, seconds per step, loss on a fixed batch before and after training

Runs on a GPU unchanged (--accelerator auto picks it; bf16-mixed precision there by default);
--devices N --strategy ddp trains on N GPUs (each device contrasts its own batch)."""

_PRECISIONS = ("auto", "32-true", "bf16-mixed", "16-mixed")  # what --precision offers (a config file may say more)


def add_parser(commands: Any) -> argparse.ArgumentParser:
    """Add ``train-encoder`` to an argparse subparsers object; returns the new parser. The options for
    :class:`~memento.training.config.SimCSEConfig` fields are derived from it (:func:`memento.flags.config_option`)."""
    p = commands.add_parser("train-encoder", help="fine-tune the encoder with SimCSE (unsupervised or from rewards)",
                            description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    config_option(p, SimCSEConfig, "data", action="append", nargs=None, metavar="FILE", shown_default=HIDDEN)
    config_option(p, SimCSEConfig, "mode")
    add_out(p, "output directory (created; its encoder/ is replaced)")
    add_config_file(p, "a SimCSEConfig JSON (e.g. an earlier OUT/config.json); flags given here override it")
    model = p.add_argument_group("model")
    config_option(model, SimCSEConfig, "model", metavar="PATH", shown_default="bundled all-MiniLM-L6-v2")
    config_options(model, SimCSEConfig, ("pooling", "max_length"))
    config_option(model, SimCSEConfig, "dropout", shown_default="the model's, 0.1 for MiniLM")
    _add_training_options(p.add_argument_group("training"))
    hw = p.add_argument_group("hardware (passed to lightning.Trainer)")
    config_option(hw, LightningConfig, "accelerator", choices=None)
    config_options(hw, LightningConfig, ("devices", "strategy"))
    config_option(hw, LightningConfig, "precision", choices=list(_PRECISIONS))
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="show Lightning's progress bar (default: when stderr is a terminal)")
    return p


def _add_training_options(train: Any) -> None:
    config_option(train, SimCSEConfig, "epochs")
    config_option(train, SimCSEConfig, "max_steps", shown_default="no limit")
    config_options(train, SimCSEConfig, ("batch_size", "lr", "weight_decay", "warmup_ratio", "temperature"))
    config_switch(train, SimCSEConfig, "include_actions", flag="--no-actions")
    config_option(train, SimCSEConfig, "positive_threshold")
    config_switch(train, SimCSEConfig, "hard_negatives")
    config_options(train, SimCSEConfig, ("eval_size", "seed"))


_FLAGS = {  # argparse dest -> its field's path in the SimCSEConfig JSON
    **{name: (name,) for name in ("mode", "model", "pooling", "max_length", "dropout", "epochs", "max_steps",
                                  "batch_size", "lr", "weight_decay", "warmup_ratio", "temperature",
                                  "positive_threshold", "eval_size", "seed")},
    **{name: ("lightning", name) for name in ("accelerator", "devices", "strategy", "precision")},
}


def config_from_args(args: argparse.Namespace) -> Any:
    """The ``SimCSEConfig``: ``--config`` (or the defaults), overridden by every flag given."""
    from memento.config import from_dict, to_dict
    from memento.errors import ConfigError
    from memento.training.config import simcse_config_from_dict

    if args.config:
        from memento.io import read_json

        data = read_json(args.config, error=ConfigError, what="config file", encoding="utf-8-sig")
        if not isinstance(data, dict):
            raise ConfigError(f"{args.config}: expected a JSON object (a SimCSEConfig), got {type(data).__name__}")
        base = to_dict(simcse_config_from_dict(data))
    else:
        base = to_dict(SimCSEConfig())
    for dest, path in _FLAGS.items():
        value = getattr(args, dest)
        if value is not None:
            target = base
            for name in path[:-1]:
                target = target[name]
            target[path[-1]] = value
    if args.data:
        base["data"] = list(args.data)
    base.update(given_fields(args, SimCSEConfig, ("include_actions", "hard_negatives")))
    if not base["data"]:
        raise ConfigError("no input: pass --data FILE (or a --config that lists data)")
    return from_dict(SimCSEConfig, base)


def run(args: argparse.Namespace) -> int:
    """Train and print a summary; a ``MementoError`` propagates to the ``memento`` CLI (one line, exit 2)."""
    import warnings

    from memento.training.cli import require_train_extra

    require_train_extra("train-encoder", ("lightning",))  # one line, before anything loads

    config = config_from_args(args)
    check_accelerator(config.lightning.accelerator)
    quiet = getattr(args, "verbose", 0) == 0
    if quiet:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
        logging.getLogger("lightning.fabric").setLevel(logging.WARNING)
        warnings.filterwarnings("ignore", message=r".*(LeafSpec|smaller than the logging interval|"
                                                  r"does not have many workers).*")
    from memento.training.simcse import train_encoder

    progress = sys.stderr.isatty() if args.progress is None else args.progress
    print(f"SimCSE ({config.mode}) on {', '.join(config.data)}: model {config.model or 'all-MiniLM-L6-v2 (bundled)'}, "
          f"pooling {config.pooling}, batch {config.batch_size}, lr {config.lr:g}", flush=True)
    result = train_encoder(config, args.out, progress=progress)
    what = "texts" if config.mode == "unsup" else "(state, positive) examples"
    print(f"trained on {result.items} {what}: {result.steps} steps in {result.seconds:.1f} s "
          f"({result.seconds_per_step:.3f} s/step, {result.device}, {result.precision})")
    if result.loss_before is not None and result.loss_after is not None:
        print(f"contrastive loss on a fixed batch: {result.loss_before:.4f} -> {result.loss_after:.4f}")
    if config.mode == "sup":
        stats = result.data_stats
        print(f"pairs: {stats.get('rows')} rows, {stats.get('duplicates')} duplicates, {stats.get('states')} states, "
              f"{stats.get('states_with_positive_and_negative')} with a positive and a hard negative")
    print(f"encoder saved to {result.encoder_dir} (pooling {config.pooling}); use it with --encoder "
          f"{result.encoder_dir}")
    print(f"TensorBoard: tensorboard --logdir {args.out}/tb")
    return 0
