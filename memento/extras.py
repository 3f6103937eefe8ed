"""Whether an optional extra of ``memento-mdp`` is installed, checked the same way for every command.

:func:`require` finds the extra's modules without importing them (nothing heavy loads before a command's own
checks, and Ray is not imported before a local Ray is configured) and raises one :class:`ConfigError` line:

    WHAT needs the 'EXTRA' extra (MODULE is not installed): [INSTEAD, or ]pip install -e '.[EXTRA]' (in a clone ...)

:func:`install_hint` is that command for every hint: ``memento-mdp`` is on no package index, so the extra is
installed from a clone (or from git, ``"memento-mdp[EXTRA] @ git+URL"``: README, Install).
"""

from __future__ import annotations

import importlib.util

from memento.errors import ConfigError

__all__ = ["MODULES", "install_hint", "installed", "missing_extra", "require"]

MODULES: dict[str, tuple[str, ...]] = {
    "serve": ("fastapi", "uvicorn"),
    "mcp": ("mcp",),
    "train": ("lightning", "torchmetrics", "tensorboard"),  # Lightning, its metrics, TensorBoard event files
    "ray": ("ray",),
}
"""The modules an extra must provide (those a command imports), by extra."""


def install_hint(extra: str) -> str:
    """How to install the extra ``extra`` (or several, ``"servers,demo"``): from a clone, as README says."""
    return f"pip install -e '.[{extra}]' (in a clone of memento)"


def installed(module: str) -> bool:
    """Whether ``module`` can be imported (found, not imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a broken parent package, or a module whose spec is unset
        return False


def missing_extra(extra: str, module: str, *, what: str, instead: str | None = None) -> ConfigError:
    """The one-line error for ``module`` of the extra ``extra`` missing when ``what`` needs it; ``instead``: what
    else the user can do (``"pass --no-tensorboard"``)."""
    alternative = f"{instead}, or " if instead else ""
    return ConfigError(f"{what} needs the '{extra}' extra ({module} is not installed): "
                       f"{alternative}{install_hint(extra)}")


def require(extra: str, *modules: str, what: str, instead: str | None = None) -> None:
    """Raise :func:`missing_extra`'s error for the first of ``modules`` (default: the extra's :data:`MODULES`)
    that is not installed; ``what`` names what needs it (``"memento serve"``)."""
    for module in modules or MODULES[extra]:
        if not installed(module):
            raise missing_extra(extra, module, what=what, instead=instead)
