"""The ``memento`` command is composed of one module per subcommand: every subcommand's ``--help`` works, and the
options derived from the config dataclasses (:func:`memento.flags.config_option`) leave the config's default in
place (an unset flag is ``None``) and show it in the help."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

import pytest

from memento.cli.entry import COMMANDS, build_parser, main
from memento.config import EncoderConfig, LearnerConfig, OnlineLabelsConfig, QNetConfig
from memento.flags import config_option, field_help, int_arg, shown
from memento.policies import SoftQConfig


def _subcommands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = [path]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += _subcommands(sub, (*path, name))
    return out


_ALL = _subcommands(build_parser())


def test_every_command_module_has_add_parser_and_run() -> None:
    for name, module in COMMANDS.items():
        assert callable(module.add_parser) and callable(module.run), name
    assert {path[0] for path in _ALL if path} == set(COMMANDS)


@pytest.mark.parametrize("path", _ALL, ids=lambda path: " ".join(path) or "memento")
def test_help_of_every_subcommand(path: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([*path, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: memento") and "Traceback" not in out


def _actions(path: tuple[str, ...]) -> dict[str, argparse.Action]:
    parser = build_parser()
    for name in path:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[name]
    return {flag: action for action in parser._actions for flag in action.option_strings}


_DERIVED = [  # (command, flag, config class, field, the default the help shows)
    (("online",), "--warmup", SoftQConfig, "warmup", None),
    (("online",), "--updates-per-step", SoftQConfig, "updates_per_step", None),
    (("online",), "--labels-every", OnlineLabelsConfig, "every", None),
    (("online",), "--labels-target", OnlineLabelsConfig, "target", None),
    (("online",), "--max-length", EncoderConfig, "max_length", None),
    (("bank", "create"), "--max-length", EncoderConfig, "max_length", None),
    (("train",), "--arch", QNetConfig, "arch", None),
    (("train",), "--hidden", QNetConfig, "hidden", None),
    (("train",), "--dropout", QNetConfig, "dropout", None),
    (("train",), "--lr", LearnerConfig, "lr", None),
    (("train",), "--max-grad-norm", LearnerConfig, "max_grad_norm", None),
    (("train",), "--td-loss", LearnerConfig, "td_loss", None),
    (("train",), "--importance-weights", LearnerConfig, "importance_weights", None),
]


@pytest.mark.parametrize(("path", "flag", "cls", "name", "default"), _DERIVED,
                         ids=lambda v: v if isinstance(v, str) else None)
def test_derived_options_match_their_config(path: tuple[str, ...], flag: str, cls: type, name: str,
                                            default: Any) -> None:
    action = _actions(path)[flag]
    value = next(f.default for f in dataclasses.fields(cls) if f.name == name)
    assert action.default is None  # unset: the config's own default applies
    assert f"(default: {shown(value if default is None else default)})" in action.help
    text = field_help(cls, name)
    if text is not None:
        assert text in action.help
    if isinstance(value, str):
        assert value in action.choices
    elif isinstance(value, (int, float)):
        assert action.type is (int_arg if type(value) is int else type(value))


def test_online_soft_q_defaults_are_the_loop_policy() -> None:
    from memento.cli.online import SOFT_Q

    actions = _actions(("online",))
    assert f"(default: {shown(SOFT_Q.learner.alpha)})" in actions["--alpha"].help
    assert f"(default: {SOFT_Q.qnet.anchor})" in actions["--anchor"].help
    assert actions["--anchor"].choices == ["none", "cosine"]


def test_unset_flags_keep_the_config_defaults() -> None:
    from memento.cli.online import SOFT_Q, loop_config, soft_q_config
    from memento.runs.qa import LoopConfig

    args = build_parser().parse_args(["online", "--tasks", "t.jsonl", "--planner", "gemma", "--out", "o"])
    assert soft_q_config(args) == SOFT_Q
    assert loop_config(args, policy=SOFT_Q) == LoopConfig(policy=SOFT_Q)
    args = build_parser().parse_args(["online", "--tasks", "t.jsonl", "--planner", "gemma", "--out", "o",
                                      "--steps", "7", "--anchor", "none", "--labels", "3"])
    assert loop_config(args, policy=SOFT_Q).steps == 7
    config = soft_q_config(args)
    assert config.qnet.anchor == "none" and config.labels.m == 3


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Toy:
    count: int = dataclasses.field(default=3, metadata={"help": "how many"})
    mode: str = "a"
    ratio: float | None = None
    sizes: tuple[int, ...] = (1, 2)


def test_config_option_derives_type_choices_and_help() -> None:
    parser = argparse.ArgumentParser()
    count = config_option(parser, _Toy, "count")
    assert count.type is int_arg and count.help == "how many (default: 3)" and count.dest == "count"
    ratio = config_option(parser, _Toy, "ratio", "a share")
    assert ratio.type is float and ratio.help == "a share (default: None)"
    sizes = config_option(parser, _Toy, "sizes", "sizes")
    assert sizes.nargs == "+" and sizes.type is int_arg and sizes.help == "sizes (default: 1 2)"
    with pytest.raises(Exception, match="no help text"):
        config_option(parser, _Toy, "mode")
    args = parser.parse_args(["--count", "5", "--sizes", "4", "5"])
    assert (args.count, args.ratio, args.sizes) == (5, None, [4, 5])
