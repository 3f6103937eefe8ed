"""Command-line options derived from the frozen config dataclasses (standard library only).

:func:`config_option` adds ``--flag`` for one field of a config class and reads everything it can from the field:
its type (``int``, ``float``, ``str``; a ``Literal`` gives the choices; ``X | None`` is ``X``; ``tuple[X, ...]``
takes one or more values), its help (``field(metadata={"help": ...})``, unless the command passes a text of its
own), and the default the help shows. The option itself defaults to ``None``: a flag left out keeps the config's
default (or a ``--config`` file's value), so every default is written once, in the config. :func:`config_switch`
is the same for a boolean field (``--x`` or ``--no-x``), :func:`config_options` declares several fields at once,
and a command reads them back with :func:`given_fields` (the fields the command line set) or :func:`option_value`
(one flag's value, else the field's default). Each action it makes records the field it sets
(``action.config_field``), so tests can walk every command's flags.

It also holds the option groups the ``memento`` commands and the ``training`` commands both declare (``--bank``,
``--encoder``, ``--torch-threads``, ``--no-progress``) and what a command does with them (set torch's threads, load
the encoder). It lives in the core (not in :mod:`memento.cli`) because the ``training`` commands may not import the
composition root.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import types
import typing
from typing import Any, Literal, get_args, get_origin

from memento.config import MAX_THREADS, EncoderConfig, check_count, field_default
from memento.errors import ConfigError
from memento.types import shown as value_shown

__all__ = ["BANK", "HIDDEN", "add_bank_option", "add_config_file", "add_encoder_flag", "add_no_progress", "add_out",
           "add_resume", "add_torch_threads", "check_accelerator",
           "check_count", "check_device", "check_torch_threads", "config_option", "config_options", "config_switch",
           "field_help", "field_type", "given_fields", "int_arg", "load_encoder", "option_value", "set_torch_threads",
           "shown"]

BANK = "a directory or milvus:URI[#collection]"


def shown(value: Any) -> str:
    """A default as ``--help`` shows it: a float in ``%g`` form, a tuple as its items with spaces."""
    if isinstance(value, float):
        return format(value, "g")
    if isinstance(value, tuple):
        return " ".join(str(v) for v in value)
    return str(value)


def _field(cls: type, name: str) -> dataclasses.Field[Any]:
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        if field.name == name:
            return field
    raise ConfigError(f"{cls.__name__} has no field {name!r}")


def field_help(cls: type, name: str) -> str | None:
    """The help text of field ``name`` of ``cls`` (its ``metadata["help"]``), ``None`` when it has none."""
    return _field(cls, name).metadata.get("help")


def field_type(cls: type, name: str) -> Any:
    """The resolved annotation of field ``name`` of ``cls`` (string annotations evaluated in ``cls``'s module)."""
    tp = _field(cls, name).type
    if isinstance(tp, str):
        tp = eval(tp, vars(sys.modules[cls.__module__]), dict(vars(typing)))  # noqa: S307 -- our own annotation
    return tp


def _argparse_kwargs(tp: Any) -> dict[str, Any]:
    """``type``/``choices``/``nargs`` for an annotation: ``X | None`` is ``X``; ``Literal`` gives choices."""
    if get_origin(tp) in (typing.Union, types.UnionType):
        inner = [arg for arg in get_args(tp) if arg is not type(None)]
        if len(inner) == 1:
            return _argparse_kwargs(inner[0])
        return {}
    if get_origin(tp) is Literal:
        return {"choices": list(get_args(tp))}
    if get_origin(tp) is tuple:
        return {"nargs": "+", **_argparse_kwargs(get_args(tp)[0])}
    if tp is int:
        return {"type": int_arg}
    if tp is float:
        return {"type": float}
    return {}


def int_arg(text: str) -> int:
    """argparse's ``type`` for an integer flag: ``int``, but a value that is not one is echoed shortened (an integer
    of thousands of digits, a megabyte of text); ranges are the configs' (or the command's) to check."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer: {value_shown(text, 60)}") from None
    except TypeError:
        raise argparse.ArgumentTypeError("invalid integer") from None


def config_option(parser: Any, cls: type, name: str, help: str | None = None, *, flag: str | None = None,
                  shown_default: Any = dataclasses.MISSING, **kwargs: Any) -> argparse.Action:
    """Add ``--flag`` (default: ``--`` + ``name`` with dashes) for field ``name`` of config class ``cls`` to
    ``parser`` (a parser or an argument group). ``dest`` defaults to ``name``; ``type``, ``choices`` and ``nargs``
    come from the field's annotation unless given; the help is ``help`` or the field's ``metadata["help"]``,
    followed by ``(default: ...)``: ``shown_default`` when given, else the field's default. The argparse default
    is ``None`` (the config's default applies)."""
    text = help if help is not None else field_help(cls, name)
    if text is None:
        raise ConfigError(f"{cls.__name__}.{name}: no help text (add metadata={{'help': ...}} or pass help=)")
    value = field_default(cls, name) if shown_default is dataclasses.MISSING else shown_default
    derived = _argparse_kwargs(field_type(cls, name))
    if "type" in kwargs or "choices" in kwargs:  # the caller's type or choices replace the annotation's
        derived = {key: v for key, v in derived.items() if key == "nargs"}
    if kwargs.get("action") in _SWITCHES:  # a switch takes no value: no type, choices or nargs
        derived = {}
    options = {"default": None, "dest": name, **derived, **kwargs}
    suffix = "" if value is HIDDEN else f" (default: {shown(value)})"
    action = parser.add_argument(flag or "--" + name.replace("_", "-"), help=text + suffix, **options)
    action.config_field = (cls, name)  # type: ignore[attr-defined] # the field it sets (tests walk the parsers)
    action.shown_from_field = shown_default is dataclasses.MISSING  # type: ignore[attr-defined]
    return action


_SWITCHES = ("store_true", "store_false", "store_const")
HIDDEN: Any = object()
"""A ``shown_default`` that shows none: a switch's (:func:`config_switch`; the flag's name says it), or an option
whose field's default means "not given"."""


def config_switch(parser: Any, cls: type, name: str, help: str | None = None, *, flag: str | None = None,
                  shown_default: Any = dataclasses.MISSING, **kwargs: Any) -> argparse.Action:
    """A flag without a value for boolean field ``name``: ``--flag`` sets the opposite of the field's default
    (``--no-x`` for a field that defaults to true); left out (``None``), the config's default applies. Its help
    names no default unless ``shown_default`` is given."""
    on = not field_default(cls, name)
    if flag is None and not on:
        flag = "--no-" + name.replace("_", "-")
    return config_option(parser, cls, name, help, flag=flag,
                         shown_default=HIDDEN if shown_default is dataclasses.MISSING else shown_default,
                         action="store_true" if on else "store_false", **kwargs)


def config_options(parser: Any, cls: type,
                   fields: dict[str, dict[str, Any]] | tuple[str, ...]) -> list[argparse.Action]:
    """A flag for each of ``fields`` of ``cls``: field names, or names -> keyword arguments of :func:`config_option`
    (``help``, ``flag``, ``metavar``, ...); boolean fields as :func:`config_switch`."""
    table = fields if isinstance(fields, dict) else {name: {} for name in fields}
    actions = []
    for name, kwargs in table.items():
        add = config_switch if field_type(cls, name) is bool else config_option
        actions.append(add(parser, cls, name, **kwargs))
    return actions


def given_fields(args: argparse.Namespace, cls: type, names: tuple[str, ...] | None = None) -> dict[str, Any]:
    """The fields of ``cls`` (or only ``names``) the command line set: each one's value under its field name
    (``dest``), lists as tuples; a flag left out (``None``) is not there, so the config's default applies."""
    out: dict[str, Any] = {}
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        if names is not None and field.name not in names:
            continue
        value = getattr(args, field.name, None)
        if value is not None:
            out[field.name] = tuple(value) if isinstance(value, list) else value
    return out


def option_value(args: argparse.Namespace, cls: type, name: str, dest: str | None = None) -> Any:
    """The value of the flag for field ``name`` of ``cls``: the command line's, else the field's default."""
    value = getattr(args, dest or name)
    return field_default(cls, name) if value is None else value


# ---------------------------------------------------------------- option groups of memento and training commands


def add_bank_option(parser: Any, help: str = BANK, *, required: bool = False, metavar: str = "BANK") -> None:
    """``--bank``: a case bank, a directory or a Milvus URI."""
    parser.add_argument("--bank", required=required, metavar=metavar, default=None, help=help)


def add_encoder_flag(parser: Any, help: str | None = None) -> None:
    """``--encoder PATH``: a local transformers encoder directory or a Hub id ``hf://org/name[@rev]``
    (``None``: the bundled model)."""
    config_option(parser, EncoderConfig, "model", help, flag="--encoder", dest="encoder", metavar="PATH",
                  shown_default="bundled all-MiniLM-L6-v2")


def add_out(parser: Any, help: str, *, metavar: str = "DIR", default: str | None = None) -> None:
    """``--out``: where a command writes (required unless it has a ``default``)."""
    parser.add_argument("--out", required=default is None, default=default, metavar=metavar, help=help)


def add_resume(parser: Any, help: str) -> None:
    """``--resume``: continue the run in ``--out`` (the flag's meaning per command in ``help``)."""
    parser.add_argument("--resume", action="store_true", help=help)


def add_config_file(parser: Any, help: str, *, metavar: str = "FILE") -> None:
    """``--config FILE``: a config JSON file the flags given override."""
    parser.add_argument("--config", metavar=metavar, default=None, help=help)


def add_torch_threads(parser: Any, default: int = 0,
                      help: str = "torch.set_num_threads for this process (default: 0, torch's default)") -> None:
    parser.add_argument("--torch-threads", type=int_arg, default=default, metavar=f"0..{MAX_THREADS}", help=help)


def add_no_progress(parser: Any, help: str = "no progress bar") -> None:
    parser.add_argument("--no-progress", action="store_true", help=help)


def check_torch_threads(args: argparse.Namespace) -> None:
    """``--torch-threads`` in 0..MAX_THREADS (0: torch's default)."""
    check_count("--torch-threads", args.torch_threads, 0, MAX_THREADS)


def check_device(device: Any, flag: str = "--device") -> None:
    """A ``--device`` value a command can use: ``None``, ``auto`` or ``cpu``, or a torch device that exists here
    (``cuda`` needs a CUDA device, ``cuda:N`` the N-th one); else one ConfigError naming the flag."""
    if device is None or device in ("auto", "cpu"):
        return
    import torch

    try:
        parsed = torch.device(str(device))
    except (RuntimeError, ValueError, TypeError):
        raise ConfigError(f"{flag} {str(device)[:40]!r}: not a torch device (e.g. cpu, cuda, cuda:1)") from None
    if parsed.type == "cpu":
        return
    if parsed.type != "cuda":
        raise ConfigError(f"{flag} {str(device)[:40]}: only cpu, cuda[:N] and auto are supported")
    if not torch.cuda.is_available():
        raise ConfigError(f"{flag} {device}: no CUDA device is available (torch.cuda.is_available() is False); "
                          "use --device cpu or auto")
    count = torch.cuda.device_count()
    if parsed.index is not None and parsed.index >= count:
        raise ConfigError(f"{flag} {device}: this machine has {count} CUDA device(s) (cuda:0..cuda:{count - 1})")


def check_accelerator(accelerator: Any, flag: str = "--accelerator") -> None:
    """A Lightning accelerator this machine has: ``gpu``/``cuda`` need a CUDA device, ``mps`` Apple's Metal;
    else one ConfigError naming the flag (Lightning would raise its own exception after the run directory was
    written)."""
    if accelerator in ("gpu", "cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(f"{flag} {accelerator}: no CUDA device is available (torch.cuda.is_available() is "
                              "False); use --accelerator cpu or auto")
    elif accelerator == "mps":
        import torch

        if not torch.backends.mps.is_available():
            raise ConfigError(f"{flag} mps: Apple's Metal (MPS) is not available here; use --accelerator cpu or auto")


def set_torch_threads(threads: int) -> None:
    """``torch.set_num_threads`` when ``threads`` > 0: process-wide, on purpose (the library never does this);
    ``threads`` outside 0..MAX_THREADS is a ConfigError (torch would try to start them)."""
    check_count("torch threads", threads, 0, MAX_THREADS)
    if threads:
        import torch

        torch.set_num_threads(threads)


def load_encoder(config: Any) -> Any:
    """The encoder of an :class:`~memento.config.EncoderConfig`, without transformers' per-load progress bar (a
    command shows its own output)."""
    from transformers.utils import logging as hf_logging

    from memento.encoders import Encoder

    if logging.getLogger().level > logging.INFO:
        hf_logging.disable_progress_bar()
    return Encoder.from_config(config)
