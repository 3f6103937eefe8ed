"""JSONL task suites: the shipped suites under ``data/`` and any task file.

- :func:`load_suite` reads a shipped suite by name (``"facts"``) or any suite directory holding
  ``train.jsonl`` and ``test.jsonl`` (Task JSONL, docs/formats.md).
- :func:`seed_cases` reads a suite's seed case bank (``cases.jsonl``, Case JSONL).
- :func:`load_tasks` reads one task file, in Task JSONL or in Memento's DeepResearcher format
  ``{"question", "ground_truth": "a<|answer_split|>b", "data_source"}``.

The shipped suites live in ``data/`` at the repository root; setuptools installs that directory
as the package ``memento_suites`` (``[tool.setuptools.package-dir]`` in ``pyproject.toml``), and
:func:`data_dir` finds it with :mod:`importlib.resources`: the repository's ``data/`` in a source
checkout or an editable install, the installed copy from a wheel. Any other suite: pass its directory.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path
from typing import Literal, get_args

from memento.errors import ConfigError, DataFormatError
from memento.formats import read_cases_jsonl, read_memento_tasks, read_tasks_jsonl
from memento.types import Case, Task

__all__ = ["Split", "TaskFormat", "data_dir", "load_suite", "load_tasks", "seed_cases", "suite_dir", "suite_names"]

Split = Literal["train", "test", "all"]
TaskFormat = Literal["task", "memento"]


_SUITES_PACKAGE = "memento_suites"


def data_dir() -> Path:
    """The shipped suites' directory (the repository's ``data/``, installed as the package ``memento_suites``);
    ``DataFormatError`` when it is not installed or not a directory on the file system."""
    try:
        root = importlib.resources.files(_SUITES_PACKAGE)
    except ModuleNotFoundError:
        raise DataFormatError(f"the shipped suites are not installed: the package {_SUITES_PACKAGE!r} (the "
                              "repository's data/ directory) is missing; reinstall memento or pass a suite "
                              "directory") from None
    if not isinstance(root, Path) or not root.is_dir():
        raise DataFormatError(f"the shipped suites (package {_SUITES_PACKAGE!r}) are not a directory on the file "
                              "system (a zipped install?); pass a suite directory", path=str(root))
    return root.resolve()


def suite_names() -> list[str]:
    """Names of the shipped suites (directories of ``data/`` with a ``train.jsonl``)."""
    return sorted(p.name for p in data_dir().iterdir() if (p / "train.jsonl").is_file())


def suite_dir(name_or_dir: str | Path) -> Path:
    """A suite's directory: an existing directory as given, or a shipped suite's name."""
    path = Path(name_or_dir)
    if isinstance(name_or_dir, Path) or path.is_dir() or len(path.parts) > 1:
        if not path.is_dir():
            raise DataFormatError("suite directory not found", path=path)
        return path
    shipped = data_dir() / str(name_or_dir)
    if not shipped.is_dir():
        raise DataFormatError(f"unknown suite {str(name_or_dir)!r}; shipped suites: {suite_names()}", path=shipped)
    return shipped


def load_suite(name_or_dir: str | Path, split: Split = "train") -> list[Task]:
    """The tasks of a suite's split (``"all"`` = train then test), in file order."""
    if split not in get_args(Split):
        raise ConfigError(f"split={split!r}: must be one of {get_args(Split)}")
    directory = suite_dir(name_or_dir)
    splits = ("train", "test") if split == "all" else (split,)
    return [task for part in splits for task in read_tasks_jsonl(directory / f"{part}.jsonl")]


def seed_cases(name_or_dir: str | Path) -> list[Case]:
    """A suite's seed case bank (``cases.jsonl``), to add to an empty bank before the loop starts."""
    return read_cases_jsonl(suite_dir(name_or_dir) / "cases.jsonl")


def load_tasks(path: str | Path, format: TaskFormat = "task") -> list[Task]:
    """Tasks from one file: ``"task"`` = Task JSONL; ``"memento"`` = Memento's DeepResearcher format."""
    match format:
        case "task":
            return read_tasks_jsonl(path)
        case "memento":
            return read_memento_tasks(path)
        case _:
            raise ConfigError(f"format={format!r}: must be one of {get_args(TaskFormat)}")
