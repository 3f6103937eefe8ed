"""The inspector's page helpers: :func:`template_env`, the Jinja2 environment of every inspector page (templates
shipped in ``memento/serve/templates``, autoescape on, undefined names an error), and its text filters.

The charts on the pages are :func:`memento.charts.svg_line_chart`'s SVG, the one chart implementation (also
``learning_curves.svg`` of a comparison).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

__all__ = ["number_text", "short_text", "template_env"]


def short_text(text: Any, n: int = 160) -> str:
    """``text`` on one line, cut to ``n`` characters (an ellipsis marks the cut)."""
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[:n - 1] + "…"


def number_text(value: Any, digits: int = 4) -> str:
    """A number as text with ``digits`` significant digits; ``—`` for none or a non-finite one."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    try:
        f = float(value)
    except (TypeError, ValueError):
        return str(value)
    return "—" if not math.isfinite(f) else f"{f:.{digits}g}"


def _pair(value: Any) -> tuple[Any, Any]:
    return value, value


@functools.lru_cache(maxsize=1)
def template_env() -> Any:
    """The Jinja2 environment of the pages (built once; autoescape on; filters ``num``, ``short``, ``pair``)."""
    import jinja2

    env = jinja2.Environment(loader=jinja2.PackageLoader("memento.serve", "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(num=number_text, short=short_text, pair=_pair)
    return env
