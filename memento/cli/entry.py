"""The ``memento`` command: one module per subcommand, each with ``add_parser(subparsers)`` and ``run(args)``,
composed here (:data:`COMMANDS`, in the order ``memento --help`` lists them).

Every subcommand validates its input before writing anything; a ``MementoError`` is printed as one line
(``memento: error: ...``) with exit code 2.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import NoReturn

import memento.training.cli
import memento.training.simcse_cli
from memento._version import __version__
from memento.cli import bank, bench, demo, evaluate, export, inspect, mcp, online, play, score, serve, verify
from memento.cli.options import EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, one_line
from memento.errors import MementoError

COMMANDS: dict[str, ModuleType] = {
    "bank": bank, "bench": bench, "demo": demo, "online": online, "play": play, "evaluate": evaluate,
    "export": export, "verify": verify, "serve": serve, "mcp": mcp, "inspect": inspect, "score": score,
    "train-encoder": memento.training.simcse_cli, "train": memento.training.cli,
}
"""Each subcommand and its module (``add_parser(subparsers)``, ``run(args) -> int``). The ``training`` modules
import only argparse and the configs at module level: Lightning loads when a run starts."""


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line, ``memento COMMAND: error: ... (see --help)``, exit 2
    (argparse's default prints the whole usage block first). Subcommand parsers inherit the class."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {one_line(message)} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    """The ``memento`` parser: global flags, then each command module's subcommand."""
    parser = OneLineParser(
        prog="memento",
        description="Learn which past cases a frozen LLM should see. Manage case banks and run benchmarks.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Errors in input print one line and exit with status 2. Run 'memento COMMAND --help' for details.")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log more (-v info, -vv debug)")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMANDS.values():
        module.add_parser(commands)
    return parser


def _configure_logging(verbosity: int) -> None:
    level = logging.WARNING if verbosity == 0 else logging.INFO if verbosity == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        print(f"memento {__version__}")
        return EXIT_OK
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    _configure_logging(args.verbose)
    try:
        return COMMANDS[args.command].run(args)
    except MementoError as error:
        print(f"memento: error: {one_line(error)}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as error:  # a file the command needs cannot be read or written: no traceback either
        where = f"{error.filename}: " if error.filename else ""
        print(f"memento: error: {where}{one_line(error.strerror or error)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("memento: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
