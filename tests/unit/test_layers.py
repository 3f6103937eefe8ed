"""The import graph runs one way: the core < ``memento.policies`` < ``memento.training`` < the composition root.

The composition root (the ``memento`` command and the benchmarks that run concrete policies) is the only
place where concrete policies and trainers are wired into the loop, the regret run and the selector; the
core defines protocols and configs and takes the factory (``make_policy``) as an argument. Checked on the
source with ``ast`` (every import, at module level or inside a function), plus: the module-level import
graph has no circle, and importing the core modules loads neither ``policies`` nor ``training``.
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
COMPOSITION_ROOT = {"memento.cli", "memento.__main__", "memento.bench.online",
                    "memento.bench.select", "memento.bench.serve", "memento.bench.games",
                    "memento.bench.stream", "memento.bench.stream_qa"}
"""Modules allowed to import every layer (the CLI, every module of ``memento.cli``, and the benchmarks that run
concrete policies)."""


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def _layer(module: str) -> int:
    if module in COMPOSITION_ROOT or module.startswith("memento.cli."):
        return 3
    for prefix, layer in (("memento.policies", 1), ("memento.training", 2)):
        if module == prefix or module.startswith(prefix + "."):
            return layer
    return 0


def _resolve(module: str, name: str, known: dict[str, Path]) -> str | None:
    """The project module an import names (the longest known prefix), or None for a third-party one."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in known:
            return candidate
    return None


def _imports(path: Path, *, module_level_only: bool) -> list[tuple[int, str, list[str]]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = tree.body if module_level_only else list(ast.walk(tree))
    out = []
    for node in nodes:
        if module_level_only and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module, [alias.name for alias in node.names]))
    return out


def test_no_import_from_a_lower_layer_to_a_higher_one() -> None:
    known = _modules()
    offences = []
    for module, path in known.items():
        for line, name, names in _imports(path, module_level_only=False):
            targets = [_resolve(module, name, known)]
            targets += [_resolve(module, f"{name}.{n}", known) for n in names]  # from memento import bench
            for target in {t for t in targets if t is not None}:
                if _layer(target) > _layer(module):
                    offences.append(f"{path.relative_to(ROOT)}:{line}: {module} imports {target}")
    assert not offences, "\n".join(offences)


def test_the_module_level_import_graph_has_no_circle() -> None:
    known = _modules()
    graph: dict[str, set[str]] = {}
    for module, path in known.items():
        edges = set()
        for _, name, names in _imports(path, module_level_only=True):
            for target in [_resolve(module, name, known)] + [_resolve(module, f"{name}.{n}", known) for n in names]:
                if target is not None and target != module and not module.startswith(target + "."):
                    edges.add(target)  # a package's own __init__ is imported first by any submodule anyway
        graph[module] = edges
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
        if module not in state:
            cycle = visit(module)
            assert cycle is None, " -> ".join(cycle)


def test_importing_the_core_loads_neither_policies_nor_training() -> None:
    code = ("import json, sys\n"
            "import memento, memento.runs.qa, memento.selector.runtime, memento.runs.regret\n"
            "import memento.selector.export, memento.serve.app\n"
            "print(json.dumps(sorted({'.'.join(m.split('.')[:2]) for m in sys.modules} "
            "& {'memento.policies', 'memento.training', 'policies', 'training'})))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                            check=False)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []


# ---------------------------------------------------------------- what learning may import; private names

BELOW_THE_PLANNER = ("memento.learn", "memento.bank")
"""Packages that learn from data or hold it, and so never reach a planner, a run, the selector or the service."""
ABOVE_LEARNING = ("memento.planners", "memento.runs", "memento.selector", "memento.serve")
PRIVATE_IMPORTS_ALLOWED = {
    ("memento.bank.uri", "memento.bank.milvus", "_encoder_id"):
        "memento/bank/milvus.py is being split (issue 42); the encoder's name becomes public there",
}
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
