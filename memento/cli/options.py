"""What several ``memento`` commands share: option groups written once (bank, planner, encoder, seed, torch
threads, progress, results file...) and the few things commands do with them (load the encoder, set torch's
threads, Milvus options). Options for config fields come from :func:`memento.flags.config_option`; the groups the
``training`` commands use too (``--bank``, ``--encoder``, ``--torch-threads``, ``--no-progress``) are defined in
:mod:`memento.flags` and exported here with the rest."""

from __future__ import annotations

import argparse
from typing import Any, Literal, get_args

from memento.bank import MilvusOptions
from memento.config import EncoderConfig, IndexConfig, factory_problem, field_default
from memento.encoders import saved_pooling
from memento.errors import ConfigError
from memento.extras import require
from memento.flags import (
    BANK,
    HIDDEN,
    add_bank_option,
    add_config_file,
    add_encoder_flag,
    add_no_progress,
    add_out,
    add_resume,
    add_torch_threads,
    check_count,
    check_device,
    check_torch_threads,
    config_option,
    config_switch,
    given_fields,
    int_arg,
    load_encoder,
    set_torch_threads,
)
from memento.formats import CaseFormat
from memento.types import shown

__all__ = ["BANK", "EXIT_ERROR", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_USAGE", "JUDGES", "PLANNER_SPECS", "RAW",
           "JudgeName", "add_bank_option", "add_cases_format", "add_command", "add_config_file", "add_connect_timeout",
           "add_device",
           "add_encoder_flag", "add_encoder_options", "add_json_flag", "add_learn_flag", "add_listen_options",
           "add_no_progress", "add_out", "add_planner_option", "add_results_file", "add_resume", "add_seed",
           "add_selector_dir", "add_systems_flags", "add_tasks_file", "add_token_file", "add_torch_threads",
           "add_workdir", "bank_options",
           "check_count", "check_device", "check_index_flag", "check_torch_threads", "int_arg",
           "comma_list", "config_option", "encoder_config", "index_factory", "load_encoder",
           "one_line", "progress", "set_torch_threads", "systems_from_args"]

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

PLANNER_SPECS = ("gemma | hf:PATH | hf://ORG/NAME[@REV] | openai:MODEL@URL[?KEY=VALUE&...] (an OpenAI-compatible "
                 "server; keys: mode=chat|completions (completions for a base model without a chat template; never "
                 "chosen automatically: servers do not say whether a model has one), "
                 "max_tokens, temperature, stop (repeatable; percent-encoded or \\n), api_key_env (a variable name, "
                 "or none), timeout_s, score_timeout_s, max_retries, concurrency, top_p, seed; quote the spec in a "
                 "shell)")
JudgeName = Literal["exact", "f1", "contains", "numeric"]
"""The judges a command's ``--judge`` names (:func:`memento.judges.make_judge`)."""
JUDGES = list(get_args(JudgeName))
RAW = argparse.RawDescriptionHelpFormatter


def add_command(commands: Any, name: str, help: str, description: str | None = None, *,
                raw: bool = True) -> argparse.ArgumentParser:
    """A subcommand's parser (its description shown as written when ``raw``)."""
    return commands.add_parser(name, help=help, description=description, formatter_class=RAW if raw else
                               argparse.HelpFormatter)


# ---------------------------------------------------------------- option groups


def add_connect_timeout(parser: Any, help: str | None = None) -> None:
    """``--connect-timeout S``: :class:`~memento.bank.MilvusOptions`' ``connect_timeout_s``."""
    config_option(parser, MilvusOptions, "connect_timeout_s", help, flag="--connect-timeout", dest="connect_timeout",
                  metavar="S")


def add_planner_option(parser: Any, config: type | None = None, *, required: bool = False,
                       default: str | None = None) -> None:
    """``--planner SPEC``: required, with a fixed ``default``, or (``config``) the config class's default."""
    if config is not None:
        config_option(parser, config, "planner", PLANNER_SPECS, metavar="SPEC")
        return
    shown = f" (default: {default})" if default is not None else ""
    parser.add_argument("--planner", required=required, default=default, metavar="SPEC", help=PLANNER_SPECS + shown)


def add_encoder_options(group: Any, *, index: tuple[type, str, str] | None = (IndexConfig, "factory", 'faiss '
                        'index factory string, e.g. "Flat", "HNSW32,Flat", "IVF1024,Flat"')) -> None:
    """``--encoder``, ``--pooling``, ``--max-length`` and (``index``: its config class, field and help) ``--index``,
    read by :func:`encoder_config`."""
    add_encoder_flag(group)
    pooling = field_default(EncoderConfig, "pooling")
    config_option(group, EncoderConfig, "pooling",
                  shown_default=f"the one a fine-tuned --encoder records, else {pooling}")
    config_option(group, EncoderConfig, "max_length")
    if index is not None:
        cls, field, text = index
        config_option(group, cls, field, text, flag="--index", dest="index")


def add_cases_format(parser: Any) -> None:
    parser.add_argument("--cases-format", choices=list(get_args(CaseFormat)), default="case",
                        help="format of --cases (default: case)")


def add_seed(parser: Any, help: str | None = None, *, default: int | None = 0) -> None:
    parser.add_argument("--seed", type=int_arg, default=default, help=help)


def add_json_flag(parser: Any, help: str = "print JSON instead of text") -> None:
    parser.add_argument("--json", action="store_true", help=help)


def add_results_file(parser: Any, help: str = "results file", *, required: bool = True) -> None:
    """``--json OUT``: a results file (a benchmark's: required)."""
    parser.add_argument("--json", required=required, default=None, metavar="OUT", help=help)


def add_tasks_file(parser: Any, *, required: bool) -> None:
    """``--tasks FILE``: a Task JSONL file."""
    parser.add_argument("--tasks", required=required, default=None, metavar="FILE",
                        help="Task JSONL {id, question, answers, ...}")


def add_device(parser: Any, help: str, *, choices: list[str] | None = None, default: str | None = None) -> None:
    """``--device``: the torch device a command runs on (checked by :func:`memento.flags.check_device`)."""
    parser.add_argument("--device", choices=choices, default=default, metavar=None if choices else "D", help=help)


def add_selector_dir(parser: Any, help: str = "the exported selector directory (memento export), or a Hub id "
                                              "hf://USER/REPO[@REV]") -> None:
    """``DIR``: an exported selector (positional)."""
    parser.add_argument("dir", metavar="DIR", help=help)


def add_learn_flag(parser: Any, help: str) -> None:
    """``--learn``: a served selector keeps learning from feedback."""
    parser.add_argument("--learn", action="store_true", help=help)


def add_token_file(parser: Any, help: str) -> None:
    """``--token-file FILE``: the bearer token of a server command."""
    parser.add_argument("--token-file", metavar="FILE", default=None, help=help)


def add_workdir(parser: Any, help: str = "where the temporary banks go (default: system temp)") -> None:
    parser.add_argument("--workdir", default=None, help=help)


def add_listen_options(parser: Any, *, port: int, loopback_note: str) -> None:
    """``--host`` and ``--port`` of a server command."""
    parser.add_argument("--host", default="127.0.0.1", help=f"address to listen on (default: 127.0.0.1{loopback_note})")
    parser.add_argument("--port", type=int_arg, default=port, help=f"port (default: {port}; 0 picks a free port)")


# ---------------------------------------------------------------- what commands do with them


def progress(args: argparse.Namespace) -> bool:
    """A progress bar unless ``--no-progress``, and only on a terminal."""
    import sys

    return not args.no_progress and sys.stderr.isatty()


def encoder_config(args: argparse.Namespace) -> EncoderConfig:
    """The EncoderConfig of ``--encoder``, ``--pooling`` and ``--max-length``."""
    pooling = args.pooling or (saved_pooling(args.encoder) if args.encoder else None) or field_default(
        EncoderConfig, "pooling")
    given = {} if args.max_length is None else {"max_length": args.max_length}
    return EncoderConfig(model=args.encoder, pooling=pooling, **given)


def index_factory(args: argparse.Namespace) -> str:
    """``--index``, else IndexConfig's default factory; a given one that is empty or out of bounds is one line
    (``--index ''`` is refused, never read as the default)."""
    if args.index is None:
        return field_default(IndexConfig, "factory")
    check_index_flag(args.index)
    return args.index


def check_index_flag(factory: str | None) -> None:
    """``--index FACTORY``, when given: a faiss factory string within the bounds (:func:`factory_problem`)."""
    if factory is not None and (problem := factory_problem(factory)) is not None:
        raise ConfigError(f"--index {shown(factory)}: {problem}")


def bank_options(args: argparse.Namespace) -> MilvusOptions:
    """The Milvus options of ``--connect-timeout``."""
    timeout = getattr(args, "connect_timeout", None)
    return MilvusOptions() if timeout is None else MilvusOptions(connect_timeout_s=timeout)


def comma_list(text: str) -> tuple[str, ...]:
    """``a,b,c`` as its non-empty items."""
    return tuple(item.strip() for item in text.split(",") if item.strip())


def one_line(message: object) -> str:
    """An error message on one line (a message with line breaks would read as several errors)."""
    return " ".join(str(message).splitlines())


# ---------------------------------------------------------------- memory systems (memento online, memento play)


def add_systems_flags(parser: Any, *, games: bool) -> None:
    """The memory-system flags of ``memento play`` (``games``: with reflection and retries) and ``memento
    online``, read by :func:`systems_from_args`."""
    from memento.systems.runtime import SystemsConfig

    config_option(parser, SystemsConfig, "build", type=comma_list, nargs=None, metavar="SYSTEMS", shown_default="none")
    config_option(parser, SystemsConfig, "items")
    if games:
        config_switch(parser, SystemsConfig, "reflect")
        config_option(parser, SystemsConfig, "retries")
    config_option(parser, SystemsConfig, "templates", metavar="JSON", shown_default=HIDDEN)


def systems_from_args(args: argparse.Namespace, base: Any) -> Any:
    """``base`` (a SystemsConfig) with the memory-system flags applied; None when no flag is given."""
    import dataclasses

    from memento.systems.runtime import SystemsConfig

    systems = given_fields(args, SystemsConfig, ("build", "items", "reflect", "retries", "templates"))
    if args.templates is not None:
        from memento.systems.llm import BuilderTemplates

        BuilderTemplates.from_json(args.templates)  # a bad file is one line now, before a model loads
        systems["templates"] = args.templates
    return dataclasses.replace(base, **systems) if systems else None


def check_tensorboard(config: Any) -> None:
    """A run that writes TensorBoard event files needs TensorBoard: without it, one line naming the flag, before
    --out is touched (found, not imported)."""
    if config.tensorboard:
        require("train", "tensorboard", what="writing TensorBoard event files", instead="pass --no-tensorboard")
