"""The selector shipped with memento: the Q-network pre-trained on ``facts-real/train`` (packaged in the
``memento_suites`` data, ``data/facts-real/selector/``: its README says how it was trained and its figures)
over the suite's 312 seed cases, as a selector artifact ready for :func:`memento.load_selector`::

    path = memento.selector.shipped.shipped_selector()                      # built once, then reused
    selector = memento.load_selector(path)
    selector.select("What is the capital of Peru?", k=4)

The artifact is built on first use (the seed cases encoded with the bundled all-MiniLM-L6-v2, a few seconds
on a CPU) into ``directory`` (default ``checkpoints/<name>`` of a clone when it exists, else
``$XDG_CACHE_HOME/memento/selectors/<name>``), so no file is stored twice. From a clone the one command is
``python -m memento.selector.shipped facts-real checkpoints/facts-real``.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

from memento.errors import ConfigError

__all__ = ["SHIPPED", "shipped_selector"]

logger = logging.getLogger(__name__)

SHIPPED = ("facts-real",)
"""The suites that ship a pre-trained selector."""


def _default_directory(name: str) -> Path:
    clone = Path(__file__).resolve().parent.parent / "checkpoints"
    if (clone / "README.md").is_file():
        return clone / name
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "memento" / "selectors" / name


def shipped_selector(name: str = "facts-real", directory: str | Path | None = None, *,
                     rebuild: bool = False) -> Path:
    """The path of the shipped selector artifact ``name``, built there first when missing (see the module
    docstring); ``rebuild`` builds it again."""
    from memento.bank import CaseBank
    from memento.encoders import Encoder
    from memento.envs.tasks import suite_dir
    from memento.selector.artifact.manifest import has_manifest
    from memento.selector.export import create_selector

    if name not in SHIPPED:
        raise ConfigError(f"shipped_selector: no shipped selector {name!r} (shipped: {', '.join(SHIPPED)})")
    out = Path(directory) if directory is not None else _default_directory(name)
    if has_manifest(out) and not rebuild:
        return out
    suite = suite_dir(name)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.build-", dir=out.parent))
    try:
        encoder = Encoder.from_pretrained(None)
        with CaseBank.create(work / "bank", encoder.dim, encoder=encoder.config) as bank:
            bank.import_jsonl(suite / "cases.jsonl", encoder, show_progress_bar=False)
        create_selector(work / "bank", work / "selector", encoder=encoder, trained=suite / "selector",
                        positive_only=True, k=4, candidates=32)
        if out.exists():
            shutil.rmtree(out)
        os.replace(work / "selector", out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    logger.info("built the shipped selector %s in %s", name, out)
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    name = args[0] if args else "facts-real"
    path = shipped_selector(name, args[1] if len(args) > 1 else None, rebuild=True)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
