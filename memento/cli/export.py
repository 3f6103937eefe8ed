"""``memento export``: a trained soft-Q selector as a self-describing directory (see ``serve``, ``mcp``)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from memento.cli.options import EXIT_OK, add_bank_option, add_command, add_connect_timeout, bank_options
from memento.errors import ConfigError
from memento.flags import config_option, option_value
from memento.runs.base import RunConfig
from memento.selector.export import create_selector, export_selector, verify

DESCRIPTION = """\
Export the selector a soft-Q run trained as a self-describing directory that any Python process can
load (memento.load_selector), `memento serve` serves over HTTP and `memento mcp` as MCP tools.

SRC is a run directory (e.g. checkpoints/demo/soft_q), a comparison directory holding a soft_q run
(e.g. checkpoints/demo, what `make demo` writes), one checkpoint directory of a run, or an exported
selector (copied with a fresh manifest). From a run, its newest complete checkpoint gives the
Q-network, learner and replay state, and the case bank is copied as it was at that checkpoint.

OUT gets: manifest.json (format version, library versions, sha256 of every file, the source run),
config.json (selector, Q-network, learner, replay and index configs; the run's full config),
encoder.json, qnet.safetensors, learner/, replay/, bank/ (cases.sqlite + index.faiss),
feedback.sqlite (empty) and a README.md model card with the run's success rates.
OUT is assembled beside itself and renamed into place when complete.

With --bank BANK, SRC is instead a selector trained offline (a `memento train` run directory or its
selector/ subdirectory): OUT pairs its Q-network and learner settings with a copy of the case bank
BANK (a bank directory, e.g. RUN/bank of the online run whose log it was trained on); the replay
buffer starts empty."""


def add_parser(commands: Any) -> None:
    export = add_command(commands, "export", "export a trained soft-Q selector as a directory (see serve, mcp)",
                         DESCRIPTION)
    export.add_argument("source", metavar="SRC", help="run, comparison or checkpoint directory (or a selector)")
    export.add_argument("out", metavar="OUT", help="the selector directory to write")
    export.add_argument("--force", action="store_true",
                        help="replace OUT if it is already an exported selector (anything else is never replaced)")
    add_bank_option(export, "SRC is an offline-trained selector (memento train); serve it over this case bank, a "
                            "directory or milvus:URI[#collection] (copied into OUT's own directory bank)")
    add_connect_timeout(export, "with a milvus:http://... --bank: give up on the server after S seconds")
    config_option(export, RunConfig, "k", "with --bank: cases shown per task")
    config_option(export, RunConfig, "candidates", "with --bank: the cosine pre-selection the policy chooses from")


def run(args: argparse.Namespace) -> int:
    src = Path(args.source)
    if args.bank is not None:
        out = create_selector(args.bank, args.out, trained=src, k=option_value(args, RunConfig, "k"),
                              candidates=option_value(args, RunConfig, "candidates"),
                              overwrite=args.force, bank_options=bank_options(args))
    elif (src / "selector" / "learner.json").is_file() and not (src / "bank").is_dir():
        raise ConfigError(f"{src}: an offline-trained selector (memento train) has no case bank of its own; "
                          "pass --bank BANK (a directory or milvus:URI)")
    else:
        out = export_selector(args.source, args.out, overwrite=args.force)
    report = verify(out)
    manifest = report["manifest"]
    source = manifest.get("source") or {}
    summary = source.get("summary") or {}
    trained = (f"trained {source.get('step')} step(s), success rate {summary['success_rate']:.3f}"
               if summary.get("success_rate") is not None else "")
    print(f"exported {args.source} -> {out}: {report['cases']} case(s), dim {report['dim']}, "
          f"{manifest.get('learner_updates')} learner update(s)" + (f"; {trained}" if trained else ""))
    print(f"load it:   python -c \"import memento; print(memento.load_selector({str(out)!r}).select('...', k=4))\"")
    print(f"serve it:  memento serve {out}    (or: memento mcp {out})")
    return EXIT_OK
