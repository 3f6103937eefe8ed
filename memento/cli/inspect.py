"""``memento inspect``: browse a run or a selector in the browser (the 'serve' extra)."""

from __future__ import annotations

import argparse
from typing import Any

from memento.cli.options import EXIT_OK, add_command, add_listen_options, add_token_file
from memento.errors import ConfigError
from memento.serve.app import require_extra, resolve_token


def add_parser(commands: Any) -> None:
    inspect = add_command(
        commands, "inspect", "browse a run or a selector in the browser: bank search, steps, learning curves",
        raw=False,
        description="Serve HTML pages (no build step, no script) over a run directory (memento online), a "
                    "comparison or bench directory holding runs, or an exported selector: the bank (search by "
                    "text with the run's encoder, filters, a case's usage), each step (candidates, probabilities, "
                    "chosen cases, answer, reward) and the learning curves. Needs the 'serve' extra. `memento "
                    "serve` shows the same pages under /inspect.")
    inspect.add_argument("path", metavar="RUN_OR_ARTIFACT", help="a run, comparison or selector directory")
    add_listen_options(inspect, port=8090, loopback_note="")
    add_token_file(inspect, "require this bearer token (needed off loopback; default there: $MEMENTO_SERVE_TOKEN); "
                            "the browser gives it once as ?token= or in the login form")


def run(args: argparse.Namespace) -> int:
    from memento.serve.app import is_loopback
    from memento.serve.inspector import serve_inspector

    require_extra("serve", command="inspect")
    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port {args.port}: must be in [0, 65535]")
    loopback = is_loopback(args.host)
    token = resolve_token(token_file=args.token_file) if args.token_file or not loopback else None

    def ready(host: str, port: int) -> None:
        shown = f"[{host}]" if ":" in host else host
        print(f"memento inspect: {args.path} on http://{shown}:{port}/ (auth: {'token' if token else 'none'}); "
              "Ctrl-C stops", flush=True)

    serve_inspector(args.path, host=args.host, port=args.port, token=token, ready=ready)
    return EXIT_OK
