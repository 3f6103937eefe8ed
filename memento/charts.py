"""Line charts as SVG: the inspector's curves and a comparison's ``learning_curves.svg`` (one implementation).

- :func:`nice_ticks`: axis ticks at 1, 2, 2.5 or 5 times a power of ten (0, 0.25, 0.5, ...; steps as integers
  0, 50, 100, ...), the axis stretched to the outer ticks;
- :func:`windowed_success`: the moving success rate from the first *full* window on (a mean over fewer
  steps, e.g. 1.0 from a single success at step 0, is not drawn);
- :func:`svg_line_chart`: one ``<svg>`` element (inline in a page, or a file with :func:`svg_document`);
- :func:`learning_curves_svg`: the moving success rate of several policies on one stream, each policy's mean in
  the legend (``memento online --policy A B``, ``memento demo``).

The SVG is built with :mod:`xml.etree.ElementTree`, so every name and label is escaped and the file is well
formed; characters XML cannot carry (controls, lone surrogates) become U+FFFD. Presentation attributes (not a
page's stylesheet) give the colours, so the file looks the same on its own as inside an inspector page. Only the
standard library and numpy: no matplotlib, no Jinja2.
"""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from memento.errors import ConfigError

__all__ = ["MAX_ABS", "learning_curves_svg", "nice_ticks", "svg_document", "svg_line_chart", "tick_label",
           "windowed_success"]

SVG_NS = "http://www.w3.org/2000/svg"
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")
MAX_ABS = 1e300  # values beyond +-MAX_ABS are not drawn (like NaN): their axis would overflow
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _text(text: Any, n: int) -> str:
    """``text`` on one line, cut to ``n`` characters (an ellipsis marks the cut), XML-safe."""
    text = " ".join(str(text).split())
    text = text if len(text) <= n else text[:n - 1] + "…"
    return _NOT_XML.sub("\ufffd", text)


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
    or below ``lo`` and the last at or above ``hi``. Both within +-:data:`MAX_ABS` (else a ValueError)."""
    if not (math.isfinite(lo) and math.isfinite(hi) and abs(lo) <= MAX_ABS and abs(hi) <= MAX_ABS):
        raise ValueError(f"nice_ticks: range ({lo:.3g}, {hi:.3g}) is not finite or beyond +-{MAX_ABS:g}")
    lo, hi = min(lo, hi), max(lo, hi)
    if hi - lo < 1e-200 or hi - lo <= 1e-12 * max(abs(lo), abs(hi)):  # one value (or as good as): an axis around it
        d = max(1.0 if integer else 0.5, max(abs(lo), abs(hi)) * 0.05)
        lo, hi = lo - d, hi + d
    step = _nice_step(hi / max(1, count - 1) - lo / max(1, count - 1), integer=integer)
    if integer:
        step = max(1.0, round(step))
    first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
    last = max(last, first + 1)  # two ticks at least: the axis has a length
    return [float(f"{i * step:.12g}") + 0.0 for i in range(first, last + 1)]  # no float noise, no -0.0


def tick_label(value: float) -> str:
    """A tick as text: ``0``, ``0.25``, ``50``, ``1e+06`` (no float noise)."""
    text = f"{value:.10g}"
    return "0" if text == "-0" else text


def windowed_success(success_T: Sequence[float] | np.ndarray, window: int) -> tuple[list[float], list[float]]:
    """``(steps, rates)``: the mean of the last ``window`` successes at each step from step ``window - 1`` on (the
    first full window); empty when the run is shorter than ``window``."""
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ConfigError(f"windowed_success: window={window!r}: must be an integer >= 1")
    x_T = np.asarray(success_T, dtype=np.float64).reshape(-1)
    if x_T.size < window:
        return [], []
    csum_T = np.concatenate([[0.0], np.cumsum(x_T)])
    rate_T = (csum_T[window:] - csum_T[:-window]) / window
    return [float(s) for s in range(window - 1, x_T.size)], rate_T.tolist()


def _drawable(x: Any, y: Any) -> tuple[float, float] | None:
    try:
        fx, fy = float(x), float(y)
    except (TypeError, ValueError, OverflowError):
        return None
    ok = math.isfinite(fx) and math.isfinite(fy) and abs(fx) <= MAX_ABS and abs(fy) <= MAX_ABS
    return (fx, fy) if ok else None


def _sub(parent: ET.Element, tag: str, text: str | None = None, **attrs: Any) -> ET.Element:
    el = ET.SubElement(parent, tag, {k.rstrip("_").replace("_", "-"): str(v) for k, v in attrs.items()})
    el.text = text
    return el


def svg_line_chart(series: Mapping[str, tuple[Sequence[float], Sequence[float]]], *, title: str, y_label: str,
                   y_range: tuple[float, float] | None = None, width: int = 720, height: int = 300,
                   note: str = "", legend: Mapping[str, str] | None = None, x_label: str = "step") -> str:
    """An SVG line chart (one ``<svg>`` element, no XML declaration) of ``{name: (steps, values)}``: nice ticks, a
    grid, one polyline per series (``data-series`` its name), a legend below the plot (``legend[name]`` or the
    name). Points that are not finite numbers are left out; ``note`` is shown when no point is left."""
    left, right, top, bottom = 56, 16, 28, 40
    pw, ph = width - left - right, height - top - bottom
    names = list(series)
    clean = {name: [p for p in (_drawable(x, y) for x, y in zip(*series[name])) if p is not None] for name in names}
    xs = [x for pts in clean.values() for x, _ in pts]
    ys = [y for pts in clean.values() for _, y in pts]
    total = height + (16 * len(names) + 6 if names else 0)
    svg = ET.Element("svg", {"xmlns": SVG_NS, "class": "chart", "width": str(width), "height": str(total),
                             "viewBox": f"0 0 {width} {total}", "role": "img", "aria-label": _text(title, 200),
                             "font-family": "sans-serif", "font-size": "11", "fill": "#333"})
    _sub(svg, "title", _text(title, 200))
    _sub(svg, "rect", x=0, y=0, width=width, height=total, fill="#fff")
    _sub(svg, "text", _text(title, 100), x=left, y=18, font_size=13, font_weight=600, class_="title")
    if not xs:
        _sub(svg, "text", _text(note or "no data", 120), x=left, y=round(top + ph / 2), class_="note")
    else:
        x_t = nice_ticks(min(xs), max(xs), 6, integer=True)
        y_t = nice_ticks(*(y_range if y_range is not None else (min(ys), max(ys))), 5)
        x0, x1, y0, y1 = x_t[0], x_t[-1], y_t[0], y_t[-1]

        def px(x: float) -> float:
            return left + (x - x0) / (x1 - x0) * pw

        def py(y: float) -> float:
            return top + (1 - (y - y0) / (y1 - y0)) * ph

        _sub(svg, "rect", x=left, y=top, width=pw, height=ph, fill="none", stroke="#bbb", class_="frame")
        for t in y_t:
            at = round(py(t), 1)
            _sub(svg, "line", x1=left, x2=left + pw, y1=at, y2=at, stroke="#eee", class_="grid")
            _sub(svg, "text", tick_label(t), x=left - 6, y=round(at + 4, 1), text_anchor="end", class_="ytick")
        for t in x_t:
            _sub(svg, "text", tick_label(t), x=round(px(t), 1), y=top + ph + 16, text_anchor="middle",
                 class_="xtick")
        _sub(svg, "text", _text(x_label, 80), x=left + pw / 2, y=top + ph + 32, text_anchor="middle")
        mid = top + ph / 2
        _sub(svg, "text", _text(y_label, 80), x=14, y=mid, transform=f"rotate(-90 14 {mid})", text_anchor="middle")
        for i, name in enumerate(names):
            pts = clean[name]
            if not pts:
                continue
            color = PALETTE[i % len(PALETTE)]
            points = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
            _sub(svg, "polyline", fill="none", stroke=color, stroke_width=1.8, points=points,
                 data_series=_text(name, 200))
            if len(pts) == 1:  # a polyline of one point draws nothing
                _sub(svg, "circle", cx=f"{px(pts[0][0]):.1f}", cy=f"{py(pts[0][1]):.1f}", r=2.5, fill=color)
    for i, name in enumerate(names):
        y = height + 16 * i + 4
        color = PALETTE[i % len(PALETTE)]
        _sub(svg, "line", x1=left, x2=left + 20, y1=y, y2=y, stroke=color, stroke_width=3)
        label = (legend or {}).get(name, name)
        _sub(svg, "text", _text(label, 100), x=left + 26, y=y + 4, class_="legend")
    return ET.tostring(svg, encoding="unicode")


def svg_document(svg: str) -> str:
    """A standalone SVG file's text: the XML declaration, then the ``<svg>`` element."""
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + svg + "\n"


def learning_curves_svg(curves: Mapping[str, Sequence[float]], *, window: int, title: str) -> str:
    """A standalone SVG of each policy's moving success rate (:func:`windowed_success` over ``window`` steps)
    against the step, its mean success in the legend. ``curves`` maps a policy name to its per-step 0/1
    successes."""
    if not curves:
        raise ConfigError("learning_curves_svg: no curves given")
    series = {name: windowed_success(values, window) for name, values in curves.items()}
    legend = {name: f"{_text(name, 60)} (mean {float(np.mean(values)) if len(values) else 0.0:.2f})"
              for name, values in curves.items()}
    longest = max(len(values) for values in curves.values())
    return svg_document(svg_line_chart(series, title=title, y_label=f"success rate, last {window} steps",
                                       y_range=(0.0, 1.0), legend=legend,
                                       note=f"no full window yet ({longest} of {window} steps)"))
