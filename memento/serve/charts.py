"""The inspector's one chart: an inline SVG line chart (a Jinja2 template), its nice ticks and its curves.

- :func:`nice_ticks`: axis ticks at 1, 2, 2.5 or 5 times a power of ten (0, 0.25, 0.5, ...; steps as integers
  0, 50, 100, ...), the axis stretched to the outer ticks;
- :func:`windowed_success`: the moving success rate drawn from the first *full* window on (a mean over fewer
  steps, e.g. 1.0 from a single success at step 0, is not drawn);
- :func:`svg_line_chart`: the SVG (every name and label escaped by the template's autoescape).

:func:`template_env` is the Jinja2 environment of every inspector page (templates shipped in
``memento/serve/templates``, autoescape on, undefined names an error).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from memento.plots import moving_average

__all__ = ["nice_ticks", "number_text", "short_text", "svg_line_chart", "template_env", "tick_label",
           "windowed_success"]

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")


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


def _nice_step(raw: float, *, integer: bool) -> float:
    exponent = math.floor(math.log10(raw))
    base = 10.0 ** exponent
    for m in (1.0, 2.0, 2.5, 5.0, 10.0):
        step = m * base
        if step >= raw * (1 - 1e-9) and not (integer and (step < 1 or m == 2.5 and exponent < 1)):
            return step
    return 10.0 * base


def nice_ticks(lo: float, hi: float, count: int = 5, *, integer: bool = False) -> list[float]:
    """About ``count`` ticks at a nice step (1, 2, 2.5 or 5 x 10^k; whole numbers when ``integer``), the first at
    or below ``lo`` and the last at or above ``hi``."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError(f"nice_ticks: non-finite range ({lo}, {hi})")
    lo, hi = min(lo, hi), max(lo, hi)
    if hi == lo:
        lo, hi = (lo - 1, hi + 1) if integer else (lo - 0.5, hi + 0.5)
    step = _nice_step((hi - lo) / max(1, count - 1), integer=integer)
    if integer:
        step = max(1.0, round(step))
    first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
    return [round(i * step, 12) + 0.0 for i in range(first, last + 1)]


def tick_label(value: float) -> str:
    """A tick as text: ``0``, ``0.25``, ``50``, ``1e+06`` (no float noise)."""
    text = f"{round(value, 10):g}"
    return "0" if text == "-0" else text


def windowed_success(success_T: Sequence[float] | np.ndarray, window: int) -> tuple[list[float], list[float]]:
    """``(steps, rates)``: the trailing mean of the last ``window`` successes at each step from step
    ``window - 1`` on (the first full window); empty when the run is shorter than ``window``."""
    x_T = np.asarray(success_T, dtype=np.float64).reshape(-1)
    if x_T.size < window:
        return [], []
    rate_T = moving_average(x_T, window)[window - 1:]
    return [float(s) for s in range(window - 1, x_T.size)], rate_T.tolist()


def svg_line_chart(series: Mapping[str, tuple[Sequence[float], Sequence[float]]], *, title: str, y_label: str,
                   y_range: tuple[float, float] | None = None, width: int = 720, height: int = 300,
                   note: str = "") -> str:
    """An inline SVG line chart of ``{name: (steps, values)}`` with nice ticks, a grid and a legend."""
    left, right, top, bottom = 56, 16, 28, 40
    pw, ph = width - left - right, height - top - bottom
    clean = {name: [(float(x), float(y)) for x, y in zip(xs, ys) if math.isfinite(float(x)) and math.isfinite(float(y))]
             for name, (xs, ys) in series.items()}
    xs = [x for pts in clean.values() for x, _ in pts]
    ys = [y for pts in clean.values() for _, y in pts]
    chart: dict[str, Any] = {"width": width, "height": height, "left": left, "top": top, "pw": pw, "ph": ph,
                             "title": title, "y_label": y_label, "note": note, "empty": not xs, "lines": [],
                             "x_ticks": [], "y_ticks": [], "legend": []}
    if xs:
        x_t = nice_ticks(min(xs), max(xs), 6, integer=True)
        y_t = nice_ticks(*(y_range if y_range is not None else (min(ys), max(ys))), 5)
        x0, x1, y0, y1 = x_t[0], x_t[-1], y_t[0], y_t[-1]

        def px(x: float) -> float:
            return left + (x - x0) / (x1 - x0) * pw

        def py(y: float) -> float:
            return top + (1 - (y - y0) / (y1 - y0)) * ph

        chart["x_ticks"] = [{"at": round(px(t), 1), "label": tick_label(t)} for t in x_t]
        chart["y_ticks"] = [{"at": round(py(t), 1), "label": tick_label(t)} for t in y_t]
        for i, (name, pts) in enumerate(clean.items()):
            color = PALETTE[i % len(PALETTE)]
            chart["lines"].append({"name": name, "color": color,
                                   "points": " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)})
    for i, name in enumerate(series):
        chart["legend"].append({"name": short_text(name, 24), "color": PALETTE[i % len(PALETTE)],
                                "y": top + 14 + 16 * i})
    return str(template_env().get_template("chart.svg.j2").render(chart=chart))
