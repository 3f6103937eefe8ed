"""The distribution as users get it: a non-editable wheel holds every package and the shipped suites
(``data/`` as the package ``memento_suites``), and an install from it loads a suite away from the
repository. Also: ``pyproject.toml`` lists every package (it lists them by hand, see its comment)."""

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


@pytest.mark.slow  # builds and installs a wheel, then imports torch in a fresh interpreter: ~20 s
def test_wheel_install_loads_the_shipped_suite(tmp_path: Path) -> None:
    source = _copy_sources(tmp_path / "src")  # built away from the checkout: no build/ or egg-info left there
    wheels = tmp_path / "wheels"
    isolation = ["--no-build-isolation"] if importlib.util.find_spec("setuptools") else []
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-index", *isolation,
                            "-w", str(wheels), str(source)],
                           capture_output=True, text=True, timeout=300, check=False)
    assert build.returncode == 0, build.stdout + build.stderr
    (wheel,) = wheels.glob("memento-*.whl")

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
