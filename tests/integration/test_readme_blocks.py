"""The Python blocks of README.md and docs/*.md run as written, and README.md runs top to bottom.

Every fenced ```python block is run as a script by this interpreter, in a fresh temporary directory (so it
cannot lean on files the test suite left behind), twice in the same directory (a block a reader runs again
must not fail on what its first run wrote), and must leave the repository's ``git status`` as it found it.

An HTML comment on the line(s) right before a fence says how the block is run:

- ``<!-- readme-test: skip (REASON) -->``: not run (it needs a server, a GPU, ...); the skip reports REASON;
- ``<!-- readme-test: setup: COMMAND -->``: COMMAND runs once in the block's directory before the block
  (what the text before it tells the reader to run first). A leading ``memento`` is this interpreter's
  ``-m memento``; ``{repo}`` is the repository root.

:func:`test_readme_top_to_bottom_twice` reads README.md as a newcomer does: in a fresh copy of the repository's
tracked files, every ```bash and ```python block in order (``memento`` and ``python`` on the PATH are this
interpreter), then all of them again in the same directory; a block that starts a server in the background
(``&``) stops it (its background jobs are killed when the block ends). ``skip`` directives apply to ```bash
blocks too (the two make targets, the install lines).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
DIRECTIVE = re.compile(r"<!--\s*readme-test:\s*(?P<body>.*?)\s*-->")
TIMEOUT_S = 600


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    code: str
    skip: str | None = None
    setup: tuple[str, ...] = ()
    language: str = "python"

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


def _directives(lines: list[str], fence: int, path: Path) -> tuple[str | None, tuple[str, ...]]:
    """The ``readme-test`` comments on the lines right above line index ``fence``."""
    skip: str | None = None
    setup: list[str] = []
    i = fence - 1
    while i >= 0 and (match := DIRECTIVE.fullmatch(lines[i].strip())):
        body = match.group("body")
        if m := re.fullmatch(r"skip\s*\((?P<reason>.+)\)", body):
            skip = m.group("reason").strip()
        elif body.startswith("setup:"):
            setup.insert(0, body.removeprefix("setup:").strip())
        else:
            raise AssertionError(f"{path}:{i + 1}: unknown readme-test directive {body!r}")
        i -= 1
    return skip, tuple(setup)


def fenced_blocks(path: Path, languages: tuple[str, ...] = ("python",)) -> list[Block]:
    """The fenced blocks of ``path`` in these languages, in order, with their directives."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        language = lines[i].strip().removeprefix("```")
        if lines[i].strip().startswith("```") and language in languages:
            start = i
            i += 1
            body: list[str] = []
            while i < len(lines) and not lines[i].strip().startswith("```"):
                body.append(lines[i])
                i += 1
            assert i < len(lines), f"{path}:{start + 1}: the {language} block is never closed"
            skip, setup = _directives(lines, start, path)
            blocks.append(Block(path, start + 1, "\n".join(body) + "\n", skip, setup, language))
        i += 1
    return blocks


def python_blocks(path: Path) -> list[Block]:
    return fenced_blocks(path)


BLOCKS = [block for document in DOCUMENTS for block in python_blocks(document)]


def test_blocks_are_found_and_every_directive_belongs_to_a_python_block() -> None:
    assert any(block.path.name == "README.md" for block in BLOCKS)
    for document in DOCUMENTS:
        lines = document.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            if "readme-test" not in line:
                continue
            assert DIRECTIVE.fullmatch(line.strip()), f"{document}:{i + 1}: malformed directive {line.strip()!r}"
            j = i + 1
            while j < len(lines) and DIRECTIVE.fullmatch(lines[j].strip()):
                j += 1
            assert j < len(lines) and lines[j].strip() in ("```python", "```bash"), (
                f"{document}:{i + 1}: a readme-test directive must sit right above a ```python or ```bash fence")
    for block in BLOCKS:  # every directive parses (an unknown one raises in python_blocks)
        assert block.skip is None or block.skip.strip()


def test_directives_are_read_from_the_lines_above_the_fence(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text("text\n<!-- readme-test: skip (needs a running server) -->\n```python\nprint(1)\n```\n\n"
                   "<!-- readme-test: setup: memento train --out runs/x -->\n<!-- readme-test: setup: python -V -->\n"
                   "```python\nprint(2)\n```\n```bash\necho 3\n```\n", encoding="utf-8")
    first, second = python_blocks(doc)
    assert (first.line, first.code, first.skip, first.setup) == (3, "print(1)\n", "needs a running server", ())
    assert (second.line, second.skip) == (9, None)
    assert second.setup == ("memento train --out runs/x", "python -V")
    assert _setup_argv(second.setup[0])[:3] == [sys.executable, "-m", "memento"]
    doc.write_text("<!-- readme-test: skipp -->\n```python\npass\n```\n", encoding="utf-8")
    with pytest.raises(AssertionError, match="unknown readme-test directive"):
        python_blocks(doc)


def _git_status() -> str | None:
    """``git status --porcelain`` of the repository, or ``None`` outside a git checkout."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        return None
    result = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=REPO,
                            capture_output=True, text=True, timeout=60, check=False)
    return result.stdout if result.returncode == 0 else None


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _run(argv: list[str], cwd: Path, what: str) -> None:
    result = subprocess.run(argv, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=TIMEOUT_S,
                            check=False)
    assert result.returncode == 0, (
        f"{what} failed (exit {result.returncode}) in {cwd}\n"
        f"--- stdout (tail) ---\n{result.stdout[-3000:]}\n--- stderr (tail) ---\n{result.stderr[-3000:]}")


def _setup_argv(command: str) -> list[str]:
    argv = shlex.split(command.replace("{repo}", str(REPO)))
    if argv and argv[0] == "memento":
        argv = [sys.executable, "-m", "memento", *argv[1:]]
    elif argv and argv[0] == "python":
        argv = [sys.executable, *argv[1:]]
    return argv


@pytest.mark.slow
@pytest.mark.parametrize("block", BLOCKS, ids=[block.name for block in BLOCKS])
def test_python_block_runs_as_written_twice(block: Block, tmp_path: Path) -> None:
    if block.skip is not None:
        pytest.skip(f"{block.name}: {block.skip}")
    before = _git_status()
    script = tmp_path / "block.py"
    script.write_text(block.code, encoding="utf-8")
    work = tmp_path / "work"
    work.mkdir()
    for command in block.setup:
        _run(_setup_argv(command), work, f"{block.name}: setup {command!r}")
    for attempt in ("first", "second"):
        _run([sys.executable, str(script)], work, f"{block.name} ({attempt} run)")
    after = _git_status()
    if before is not None and after is not None:  # entries only: a file committed meanwhile just drops out
        new = sorted(set(after.splitlines()) - set(before.splitlines()))
        assert not new, f"{block.name} changed the repository (git status):\n" + "\n".join(new)


def _tracked_copy(target: Path) -> Path:
    """The repository's tracked files (a fresh clone's tree) under ``target``; without git, the tree minus what
    builds and runs leave behind."""
    files = None
    if shutil.which("git") is not None and (REPO / ".git").exists():
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, timeout=60, check=False)
        if listed.returncode == 0:
            files = [name for name in listed.stdout.decode().split("\0") if name]
    if files is None:
        shutil.copytree(REPO, target, ignore=shutil.ignore_patterns(".venv", ".git", "checkpoints", "runs",
                                                                   "__pycache__", "*.egg-info"))
        return target
    for name in files:
        source = REPO / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


def _walk_env(bin_dir: Path) -> dict[str, str]:
    bin_dir.mkdir(exist_ok=True)
    for name, command in (("memento", f'exec "{sys.executable}" -m memento "$@"'),
                          ("python", f'exec "{sys.executable}" "$@"')):
        shim = bin_dir / name
        shim.write_text(f"#!/bin/sh\n{command}\n", encoding="utf-8")
        shim.chmod(0o755)
    env = _env()
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    return env


_STOP_JOBS = ("trap 'rc=$?; for j in $(jobs -p); do kill \"$j\" 2>/dev/null || true; done; wait || true; exit $rc' "
              "EXIT\n")


@pytest.mark.slow
def test_readme_top_to_bottom_twice(tmp_path: Path) -> None:
    if shutil.which("bash") is None or shutil.which("curl") is None:
        pytest.skip("the README's shell blocks need bash and curl")
    blocks = fenced_blocks(REPO / "README.md", ("python", "bash"))
    assert {b.language for b in blocks if b.skip is None} == {"python", "bash"}
    tree = _tracked_copy(tmp_path / "clone")
    env = {**_walk_env(tmp_path / "bin"), "PYTHONPATH": str(tree)}  # the clone's code, as installed with -e
    before = _git_status()
    for attempt in ("first", "second"):
        for block in blocks:
            if block.skip is not None:
                continue
            script = tmp_path / f"block-{block.line}.{'sh' if block.language == 'bash' else 'py'}"
            if block.language == "bash":  # a server started with & is stopped when its block ends
                script.write_text("set -euo pipefail\n" + _STOP_JOBS + block.code, encoding="utf-8")
                argv = ["bash", str(script)]
            else:
                script.write_text(block.code, encoding="utf-8")
                argv = [sys.executable, str(script)]
            result = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True, timeout=TIMEOUT_S,
                                    check=False)
            assert result.returncode == 0, (
                f"{block.name} ({attempt} pass) failed (exit {result.returncode})\n--- stdout (tail) ---\n"
                f"{result.stdout[-3000:]}\n--- stderr (tail) ---\n{result.stderr[-3000:]}")
    after = _git_status()
    if before is not None and after is not None:
        assert sorted(set(after.splitlines()) - set(before.splitlines())) == []
