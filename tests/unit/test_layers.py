"""The import graph runs one way: the base < ``memento.policies`` < the composition of policies into runs <
``memento.training`` < the composition root.

- **base**: every module not named below (``memento.bank``, ``memento.learn``, ``memento.planners``,
  ``memento.encoders``, ``memento.systems``, ``memento.envs``, ``memento.adapters``, ``memento.config``,
  ``memento.types``, ``memento.errors``, ``memento.io``, ...): protocols, configs and machinery; it never imports
  ``memento.policies`` or ``memento.training``;
- **policies**: ``memento.policies``, one module per policy (config, class, factory entry, run defaults) and the
  registry;
- **compose**: :data:`COMPOSE`, the modules that compose policies into runs: the runs (whose configs nest a policy
  config), the served selector (a soft-Q agent), the service over it, off-policy evaluation of policy configs, the
  benchmarks, and the package ``memento`` itself (it re-exports policy configs and runs, imported on first use);
- **training**: ``memento.training`` (offline trainers);
- **root**: :data:`ROOT_MODULES`, the command line, which wires all of them together.

Checked on the source with ``ast`` (every import, at module level or inside a function; ``from memento import
sqlite`` is an import of ``memento.sqlite``, not of the package), plus: the module-level import graph has no circle,
importing the base loads neither ``memento.policies`` nor ``memento.training``, and importing the runs and the
selector does not load ``memento.training``.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("memento",)
ALIASES = ("policies", "training")
"""Top-level packages that only alias ``memento.policies`` and ``memento.training`` for one release."""
COMPOSE = ("memento.runs", "memento.selector", "memento.serve", "memento.ope", "memento.bench")
"""Subpackages that compose policies into runs (with the package ``memento`` itself, :data:`COMPOSE_MODULES`)."""
COMPOSE_MODULES = ("memento",)
ROOT_MODULES = ("memento.cli", "memento.__main__")
"""The composition root (``memento.cli`` and every module in it, ``python -m memento``)."""
BASE, POLICIES, COMPOSITION, TRAINING, COMPOSITION_ROOT = range(5)
LAYER_NAMES = ("base", "policies", "compose", "training", "root")
BASE_MODULES = ("memento.config", "memento.types", "memento.errors", "memento.io", "memento.formats", "memento.flags",
                "memento.bank", "memento.bank.local", "memento.encoders", "memento.hub", "memento.learn.policy",
                "memento.learn.learner", "memento.learn.persist", "memento.learn.labels", "memento.learn.evidence",
                "memento.learn.features", "memento.planners.spec", "memento.judges", "memento.systems.runtime",
                "memento.systems.expand", "memento.envs", "memento.adapters")
"""Base-layer modules a process imports without the policies (checked in a fresh interpreter)."""


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def _within(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == prefix or module.startswith(prefix + ".") for prefix in prefixes)


def _layer(module: str) -> int:
    if _within(module, ROOT_MODULES):
        return COMPOSITION_ROOT
    if _within(module, ("memento.training",)):
        return TRAINING
    if module in COMPOSE_MODULES or _within(module, COMPOSE):
        return COMPOSITION
    if _within(module, ("memento.policies",)):
        return POLICIES
    return BASE


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The project module an import names (the longest known prefix), or None for a third-party one."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in known:
            return candidate
    return None


def _targets(node: ast.Import | ast.ImportFrom, known: dict[str, Path]) -> set[str]:
    """The project modules an import statement loads: ``from P import m`` of submodules ``m`` names the submodules
    only (``P`` runs first anyway, as it does for any ``import P.m``)."""
    if isinstance(node, ast.Import):
        return {t for alias in node.names if (t := _resolve(alias.name, known)) is not None}
    package = _resolve(node.module or "", known)
    subs = {_resolve(f"{node.module}.{alias.name}", known) for alias in node.names}
    subs = {s for s in subs if s is not None and s != package}
    if package is None or len(subs) == len(node.names):
        return subs
    return subs | {package}


def _imports(path: Path, known: dict[str, Path], *, module_level_only: bool) -> list[tuple[int, set[str]]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = tree.body if module_level_only else list(ast.walk(tree))
    out = []
    for node in nodes:
        if module_level_only and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        if isinstance(node, ast.Import) or (isinstance(node, ast.ImportFrom) and node.module and node.level == 0):
            out.append((node.lineno, _targets(node, known)))
    return out


def test_every_layer_holds_modules() -> None:
    layers = {_layer(module) for module in _modules()}
    assert layers == set(range(len(LAYER_NAMES)))
    assert _layer("memento") == COMPOSITION and _layer("memento.policies.soft_q") == POLICIES
    assert _layer("memento.learn.policy") == BASE and _layer("memento.cli.online") == COMPOSITION_ROOT


def test_no_import_from_a_lower_layer_to_a_higher_one() -> None:
    known = _modules()
    offences = []
    for module, path in known.items():
        for line, targets in _imports(path, known, module_level_only=False):
            for target in sorted(targets):
                if _layer(target) > _layer(module):
                    offences.append(f"{path.relative_to(ROOT)}:{line}: {module} ({LAYER_NAMES[_layer(module)]}) "
                                    f"imports {target} ({LAYER_NAMES[_layer(target)]})")
    assert not offences, "\n".join(offences)


def _first_circle(*, module_level_only: bool) -> list[str] | None:
    """The first import circle (``a -> b -> a``) among the project's modules, or None; with every import
    (``module_level_only=False``) those inside functions count too. A package's own ``__init__`` is no edge of its
    submodules (it is imported first by any of them anyway)."""
    known = _modules()
    graph: dict[str, set[str]] = {}
    for module, path in known.items():
        graph[module] = {target for _, targets in _imports(path, known, module_level_only=module_level_only)
                         for target in targets if target != module and not module.startswith(target + ".")}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit(module)) is not None:
            return cycle
    return None


def test_the_module_level_import_graph_has_no_circle() -> None:
    cycle = _first_circle(module_level_only=True)
    assert cycle is None, " -> ".join(cycle)


def _loaded(imports: str) -> list[str]:
    """The layers above the base (and the old alias packages) that a fresh interpreter holds after ``imports``."""
    code = (f"import json, sys\nimport {imports}\n"
            "print(json.dumps(sorted({'.'.join(m.split('.')[:2]) for m in sys.modules} "
            "& {'memento.policies', 'memento.training', 'policies', 'training'})))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                            check=False)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_importing_the_base_loads_neither_policies_nor_training() -> None:
    assert all(_layer(module) == BASE for module in BASE_MODULES)
    assert _loaded("memento, " + ", ".join(BASE_MODULES)) == []


def test_importing_the_runs_and_the_selector_loads_the_policies_but_not_training() -> None:
    assert _loaded("memento.runs.qa, memento.selector.runtime, memento.runs.regret, memento.selector.export, "
                   "memento.serve.app") == ["memento.policies"]


# ---------------------------------------------------------------- what learning may import; private names

BELOW_THE_PLANNER = ("memento.learn", "memento.bank")
"""Packages that learn from data or hold it, and so never reach a planner, a run, the selector or the service."""
ABOVE_LEARNING = ("memento.planners", "memento.runs", "memento.selector", "memento.serve")
PRIVATE_IMPORTS_ALLOWED: dict[tuple[str, str, str], str] = {}
"""``(importer, module, name)`` -> why it is still imported; each entry is a debt, not a permission."""


def _under(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == package or module.startswith(package + ".") for package in packages)


def _named_modules(module: str, path: Path) -> list[tuple[int, str]]:
    """Every module an import in ``path`` may name, anywhere in the file (in a function too): ``import a.b`` names
    ``a.b``; ``from a import b`` names ``a`` and ``a.b`` (``b`` may be a module); a relative import is resolved
    against ``module``'s package; ``importlib.import_module("a.b")`` and ``__import__("a.b")`` name ``a.b``."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            out.append((node.lineno, base))
            out += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and (getattr(node.func, "attr", None) or getattr(node.func, "id", None)) in ("import_module",
                                                                                            "__import__")):
            out.append((node.lineno, node.args[0].value))
    return out


def test_learning_and_the_bank_import_nothing_above_them() -> None:
    known = _modules()
    offences = [f"{path.relative_to(ROOT)}:{line}: {module} imports {name}"
                for module, path in known.items() if _under(module, BELOW_THE_PLANNER)
                for line, name in _named_modules(module, path) if _under(name, ABOVE_LEARNING)]
    assert not offences, "\n".join(offences)
    assert any(_under(module, ("memento.learn",)) for module in known)  # the rule reads real files


def test_no_module_imports_another_modules_private_name() -> None:
    """``from memento.x import _y`` reaches into another module: what two modules share is public (documented,
    no underscore) in its rightful home. Dunder names (``__version__``) are public."""
    known = _modules()
    offences, used = [], set()
    for module, path in known.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom):
                continue
            source = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                source = ".".join(parts + ([node.module] if node.module else []))
            if not _under(source, PACKAGES):
                continue
            for alias in node.names:
                name = alias.name
                if not name.startswith("_") or (name.startswith("__") and name.endswith("__")):
                    continue
                if (module, source, name) in PRIVATE_IMPORTS_ALLOWED:
                    used.add((module, source, name))
                    continue
                offences.append(f"{path.relative_to(ROOT)}:{node.lineno}: {module} imports {source}.{name}")
    assert not offences, "\n".join(offences)
    stale = set(PRIVATE_IMPORTS_ALLOWED) - used
    assert not stale, f"allowed but no longer imported (remove from PRIVATE_IMPORTS_ALLOWED): {sorted(stale)}"


# ---------------------------------------------------------------- sizes, circles through functions, the run skeleton

MAX_MODULE_LINES = 1000
MAX_CLASS_LINES = 500


def test_no_module_over_1000_lines_and_no_class_over_500() -> None:
    """A module one reader can hold: at most :data:`MAX_MODULE_LINES` lines; a class (``class`` to its last line,
    docstrings included) at most :data:`MAX_CLASS_LINES`. Tests are not counted."""
    offences = []
    for path in _modules().values():
        text = path.read_text(encoding="utf-8")
        if (lines := len(text.splitlines())) > MAX_MODULE_LINES:
            offences.append(f"{path.relative_to(ROOT)}: {lines} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and (size := node.end_lineno - node.lineno + 1) > MAX_CLASS_LINES:
                offences.append(f"{path.relative_to(ROOT)}:{node.lineno}: class {node.name} is {size} lines")
    assert not offences, "\n".join(offences)


def test_no_circle_through_imports_inside_functions_either() -> None:
    """With every import counted (inside functions too), the graph still has no circle: a function-level import
    that closes one only hides it from the module-level test above."""
    cycle = _first_circle(module_level_only=False)
    assert cycle is None, " -> ".join(cycle)


def test_the_run_skeleton_names_no_run_kind_and_builds_no_attribute_name() -> None:
    """``memento.runs.base`` knows its run kinds only through their :class:`~memento.runs.base.RunSpec`: it names no
    subclass, and it reads no attribute by a name built at run time (``getattr(x, a + b)``, f-strings)."""
    path = ROOT / "memento" / "runs" / "base.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    kinds = {"OnlineLoop", "GameLoop", "RayOnlineLoop"}
    named = sorted({node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and node.id in kinds})
    assert not named, named
    built = [node.lineno for node in ast.walk(tree)
             if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("getattr", "setattr", "hasattr")
             and len(node.args) > 1 and isinstance(node.args[1], (ast.BinOp, ast.JoinedStr))]
    assert not built, f"memento/runs/base.py builds attribute names at lines {built}"
