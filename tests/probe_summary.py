"""Print the totals of a probe report (``make probe``): what the fuzz and kill tests tried, and what was lost.

``python -m tests.probe_summary FILE`` reads the JSON that ``MEMENTO_PROBE_REPORT=FILE`` made pytest write
(``tests/conftest.py``) and prints one row per test module and a total row. Exit status 1 when the report
counts anything lost or any traceback, or when pytest itself failed.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

KINDS = ("inputs", "requests", "kills", "lost", "tracebacks")


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tests.probe_summary REPORT.json", file=sys.stderr)
        return 2
    report = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    total: Counter[str] = Counter()
    width = max([len(name) for name in report["modules"]] + [len("total")])
    print(f"{'module':<{width}}  " + "  ".join(f"{kind:>10}" for kind in KINDS))
    for name, counts in report["modules"].items():
        total.update(counts)
        print(f"{name:<{width}}  " + "  ".join(f"{counts.get(kind, 0):>10}" for kind in KINDS))
    print(f"{'total':<{width}}  " + "  ".join(f"{total.get(kind, 0):>10}" for kind in KINDS))
    print(f"scale {report['scale']}, pytest exit status {report['exit_status']}")
    return int(bool(report["exit_status"] or total["lost"] or total["tracebacks"]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
