"""``memento verify``: check an exported selector's checksums and dimensions without loading it."""

from __future__ import annotations

import argparse
import json
from typing import Any

from memento.cli.options import EXIT_OK, add_command, add_json_flag, add_selector_dir
from memento.selector.export import verify

DESCRIPTION = """\
Check an exported selector without loading it: every file against the sha256 and size in its
manifest, the format versions, and that the encoder, bank, Q-network and replay buffer agree on the
embedding dimension. Cases and feedback appended since the last save are accepted when the saved
rows are intact. Prints a summary (or JSON); a damaged artifact prints one line naming the file and
exits 2."""


def add_parser(commands: Any) -> None:
    parser = add_command(commands, "verify", "check an exported selector's checksums and dimensions", DESCRIPTION)
    add_selector_dir(parser, "the exported selector directory")
    add_json_flag(parser, "print the report (with the manifest) as JSON")


def run(args: argparse.Namespace) -> int:
    report = verify(args.dir)
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
        return EXIT_OK
    manifest = report["manifest"]
    print(f"{args.dir}: ok ({report['files']} files match the manifest; format {manifest['format']} "
          f"v{manifest['format_version']}, dim {report['dim']})")
    print(f"  {report['cases']} case(s), {report['feedbacks']} feedback(s); since the last save "
          f"({manifest.get('saved')}): +{report['cases_since_save']} case(s), "
          f"+{report['feedbacks_since_save']} feedback(s)")
    return EXIT_OK
