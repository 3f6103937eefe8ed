"""``memento mcp``: an exported selector as MCP tools over stdio (the 'mcp' extra)."""

from __future__ import annotations

import argparse
from typing import Any

from memento.cli.options import add_command, add_device, add_learn_flag, add_seed, add_selector_dir
from memento.config import MAX_SEED
from memento.flags import check_count, check_device, config_option
from memento.serve.app import ServeConfig, require_extra
from memento.serve.mcp import TOOLS_HELP, run_mcp

DESCRIPTION = """\
Serve an exported selector (a directory written by `memento export`) as MCP tools over stdio, for
agent frameworks that speak the Model Context Protocol. Needs the 'mcp' extra: pip install -e '.[mcp]'
(in a clone of memento).

{tools}

client configuration, e.g.:
  {"mcpServers": {"memento": {"command": "memento", "args": ["mcp", "/path/to/selector"]}}}
The server runs until the client closes stdin; then pending writes are drained and the artifact saved.""".replace(
    "{tools}", TOOLS_HELP)

SAVE_EVERY_N = 100
"""``memento mcp`` checkpoints after this many writes (its ``ServeConfig.save_every_n``; no time trigger)."""


def add_parser(commands: Any) -> None:
    mcp = add_command(commands, "mcp", "serve an exported selector as MCP tools over stdio", DESCRIPTION)
    add_selector_dir(mcp)
    add_learn_flag(mcp, "keep learning from record_outcome (default: record only)")
    config_option(mcp, ServeConfig, "save_every_n", "checkpoint after N writes (0: only at exit)", metavar="N",
                  shown_default=SAVE_EVERY_N)
    add_device(mcp, "torch device, e.g. cpu or cuda (default: cpu)")
    add_seed(mcp, "seed of the sampling RNG (default: 0)")


def run(args: argparse.Namespace) -> int:
    require_extra("mcp")
    check_device(args.device)
    check_count("--seed", args.seed, 0, MAX_SEED)
    return run_mcp(args.dir, learn=args.learn, device=args.device, seed=args.seed,
                   config=ServeConfig(save_every_n=SAVE_EVERY_N if args.save_every_n is None else args.save_every_n,
                                      save_every_s=0))
