"""Every flag that sets a config field is made by :func:`memento.flags.config_option`: left out it is ``None`` (the
field's own default applies) and its help shows that default, read from the field; and the package declares few
flags by hand (``add_argument`` outside ``config_option``), each for something no config holds."""

from __future__ import annotations

import argparse
import ast
import dataclasses
from pathlib import Path

import pytest

from memento.cli.entry import build_parser
from memento.config import field_default
from memento.flags import field_help, shown

ROOT = Path(__file__).resolve().parents[2] / "memento"
MAX_HAND_WRITTEN = 34
"""``add_argument`` calls outside ``config_option`` in the package (issue 42 asks for at most 40): positionals, the
shared groups no config holds (``--out``, ``--resume``, ``--config``, ``--bank``...) and ``-v``/``--version``."""


def _parsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, (*path, name))


def _config_actions() -> list[tuple[str, str, argparse.Action]]:
    out = []
    for path, parser in _parsers(build_parser()):
        for action in parser._actions:
            if hasattr(action, "config_field"):
                out.append((" ".join(path), action.option_strings[0], action))
    return out


_ACTIONS = _config_actions()


def test_config_options_are_found_in_every_kind_of_command() -> None:
    commands = {command.split()[0] for command, _, _ in _ACTIONS}
    assert {"online", "play", "serve", "bench", "train", "train-encoder", "score", "bank", "evaluate",
            "export"} <= commands
    assert len(_ACTIONS) > 150


@pytest.mark.parametrize(("command", "flag", "action"), _ACTIONS, ids=[f"{c} {f}" for c, f, _ in _ACTIONS])
def test_each_flag_defaults_to_its_field(command: str, flag: str, action: argparse.Action) -> None:
    cls, name = action.config_field
    field = next(f for f in dataclasses.fields(cls) if f.name == name)
    assert action.default is None, "left out, the flag must leave the config's default in place"
    assert action.help
    if action.const is not None or isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        # a switch sets the opposite of the field's default
        if field.default is not dataclasses.MISSING and isinstance(field.default, bool):
            assert action.const is (not field.default)
        return
    if action.shown_from_field:
        assert action.help.endswith(f"(default: {shown(field_default(cls, name))})"), action.help


_POLICY_CONFIGS = {"RandomConfig", "SimilarityConfig", "SoftQConfig", "LinUCBConfig", "CFGMRetrievalConfig",
                   "LifeMemRetrievalConfig", "PlugMemRetrievalConfig"}
"""Their fields' help moves onto the fields with the policy configs (memento.policies); until then a flag passes it."""
_ELSEWHERE = {("TextWorldConfig", "max_steps"), ("BankConfig", "dim")}
"""Fields outside the configs this change gives help (``memento play --max-steps``, ``memento bank create --dim``)."""


def test_every_field_a_flag_sets_has_its_help() -> None:
    missing = sorted({f"{cls.__name__}.{name}" for _, _, action in _ACTIONS for cls, name in [action.config_field]
                      if field_help(cls, name) is None and cls.__name__ not in _POLICY_CONFIGS
                      and (cls.__name__, name) not in _ELSEWHERE})
    assert not missing


def _hand_written(path: Path) -> list[int]:
    """Lines of ``.add_argument(`` calls outside a function named ``config_option``."""
    lines: list[int] = []

    def visit(node: ast.AST, inside: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, inside or child.name == "config_option")
                continue
            if (isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute)
                    and child.func.attr == "add_argument" and not inside):
                lines.append(child.lineno)
            visit(child, inside)

    visit(ast.parse(path.read_text(encoding="utf-8")), False)
    return lines


def test_few_flags_are_declared_by_hand() -> None:
    found = {str(p.relative_to(ROOT.parent)): lines for p in sorted(ROOT.rglob("*.py")) if (lines := _hand_written(p))}
    total = sum(len(lines) for lines in found.values())
    assert total <= MAX_HAND_WRITTEN, found


def test_bench_and_serve_restate_no_config_default() -> None:
    """The benchmarks' and ``memento serve``'s flags are their configs' fields, with nothing but a config_option."""
    for command, parser in _parsers(build_parser()):
        if command[:1] not in (("bench",), ("serve",)) or len(command) == 1 and command[0] == "bench":
            continue
        for action in parser._actions:
            if action.option_strings and action.default not in (None, False, argparse.SUPPRESS):
                assert action.dest in {"torch_threads", "port", "host", "seed", "help"}, (command, action.dest)


_COMMAND_CONFIGS = {"ImportConfig": "bank import", "SearchConfig": "bank search", "EvaluateConfig": "evaluate",
                    "DemoConfig": "demo", "ScoreSourceConfig": "score", "OnlineCommandConfig": "online",
                    "PlayCommandConfig": "play"}
"""The configs of command-level options (once argparse's alone), and the command whose flags are their fields."""


def test_command_configs_give_every_field_a_flag() -> None:
    """Each field of a command's own config is a flag of that command (so the default-equality test above covers
    it), with its help on the field."""
    for name, command in _COMMAND_CONFIGS.items():
        actions = [(cls, field) for c, _, action in _ACTIONS if c == command
                   for cls, field in [action.config_field] if cls.__name__ == name]
        assert actions, name
        cls = actions[0][0]
        assert {field for _, field in actions} == {f.name for f in dataclasses.fields(cls)}, name
        assert all(field_help(cls, f.name) for f in dataclasses.fields(cls)), name


@pytest.mark.parametrize(("argv", "expected"), [
    (["bank", "import", "F", "--bank", "B"], {"format": "case", "allow_duplicates": False, "embeddings": None,
                                               "chunk": 50_000}),
    (["bank", "search", "T", "--bank", "B"], {"k": 4, "env": None, "kind": None, "user": None, "agent": None,
                                              "session": None, "include_global": False, "filter": None}),
    (["evaluate", "R", "--policy", "logged"], {"policies": ("logged",), "greedy": False, "export_vw": None,
                                               "export_obp": None}),
    (["demo"], {"steps": 250, "fresh": False, "from_scratch": False}),
    (["score", "--suite", "facts", "--out", "o.jsonl"], {"suite": "facts", "split": None, "cases": None,
                                                          "save_bank": None}),
    (["online", "--tasks", "t", "--planner", "p", "--out", "o"],
     {"cases": None, "policy": "soft_q,similarity", "judge": "exact", "retain_judge": None, "late_steps": 200,
      "workers": 1}),
    (["play", "--out", "o"], {"suite": None, "games": None, "split": "train", "policy": "soft_q", "no_retain": False}),
    (["play", "--games", "a.z8", "b.ulx", "--out", "o", "--no-retain"],
     {"suite": None, "games": ("a.z8", "b.ulx"), "split": "train", "policy": "soft_q", "no_retain": True}),
])
def test_command_configs_keep_the_flags_defaults(argv: list[str], expected: dict) -> None:
    """Left out, each command-level flag has the default it had as a plain argparse option."""
    from memento.cli import bank, demo, evaluate, online, play, score
    from memento.flags import given_fields

    configs = {"bank import": bank.ImportConfig, "bank search": bank.SearchConfig, "evaluate": evaluate.EvaluateConfig,
               "demo": demo.DemoConfig, "score": score.ScoreSourceConfig, "online": online.OnlineCommandConfig,
               "play": play.PlayCommandConfig}
    cls = configs[" ".join(argv[:2]) if argv[0] == "bank" else argv[0]]
    args = build_parser().parse_args(argv)
    assert dataclasses.asdict(cls(**given_fields(args, cls))) == expected


def test_command_configs_refuse_what_argparse_would() -> None:
    from memento.cli.bank import ImportConfig, SearchConfig
    from memento.cli.evaluate import EvaluateConfig
    from memento.cli.online import OnlineCommandConfig
    from memento.cli.play import PlayCommandConfig
    from memento.cli.score import ScoreSourceConfig
    from memento.errors import ConfigError

    for make in (lambda: ImportConfig(format="csv"), lambda: ImportConfig(embeddings="v.npy", chunk=0),
                 lambda: SearchConfig(include_global=1), lambda: EvaluateConfig(),
                 lambda: ScoreSourceConfig(split="dev"), lambda: OnlineCommandConfig(judge="fuzzy"),
                 lambda: OnlineCommandConfig(workers="2"), lambda: PlayCommandConfig(policy="greedy")):
        with pytest.raises(ConfigError):
            make()
    assert ImportConfig(chunk=0).chunk == 0  # without --embeddings --chunk is not used, so not checked
