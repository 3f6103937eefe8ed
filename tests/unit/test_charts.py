"""memento.charts, the one chart implementation (inspector pages and learning_curves.svg): well-formed standalone
SVG whatever the names and values, nice ticks over any finite range, windows from the first full one."""

from __future__ import annotations

import math
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from memento.charts import MAX_ABS, learning_curves_svg, nice_ticks, svg_line_chart, tick_label, windowed_success
from memento.errors import ConfigError

SVG = "{http://www.w3.org/2000/svg}"


def _texts(root: ET.Element, cls: str) -> list[str]:
    return [t.text or "" for t in root.iter(SVG + "text") if t.get("class") == cls]


def test_names_xml_cannot_carry_still_give_a_well_formed_file():
    names = ["<script>alert(1)</script>", 'a"b&c', "ctl\x00\x01\x1b\x7f", "lone \ud800 surrogate", "x" * 5000,
             "\ufffe\uffff ok"]
    text = learning_curves_svg({n: [1, 0, 1, 1] for n in names}, window=2, title="t\x00<i>")
    root = ET.fromstring(text.encode("utf-8"))  # UTF-8 encodable: no lone surrogate left
    assert root.get("xmlns") is None and root.tag == SVG + "svg" and root.get("viewBox")
    assert "<script>" not in text and "<i>" not in text
    series = [p.get("data-series") for p in root.iter(SVG + "polyline")]
    assert series[:2] == names[:2] and series[2] == "ctl\ufffd\ufffd\ufffd\x7f" and "\ufffd" in series[3]
    assert len(series[4]) <= 200 and series[4].endswith("…")
    assert all(len(t) <= 100 for t in _texts(root, "legend")) and len(_texts(root, "legend")) == len(names)
    assert _texts(root, "legend")[1] == 'a"b&c (mean 0.75)'


@pytest.mark.parametrize(("lo", "hi"), [(1e-13, 2e-13), (-1e300, 1e300), (1e300, 1e300), (0.0, 0.0),
                                        (-5e-324, 5e-324), (3.0, 3.0), (0.1, 0.13), (-7.5, 1234567.0)])
def test_nice_ticks_any_finite_range(lo, hi):
    for integer in (False, True):
        ticks = nice_ticks(lo, hi, 5, integer=integer)
        assert all(math.isfinite(t) for t in ticks) and 2 <= len(ticks) <= 9, ticks
        assert ticks[0] <= lo and ticks[-1] >= hi and len(set(ticks)) == len(ticks), ticks
        if integer:
            assert all(t.is_integer() for t in ticks)
        labels = [tick_label(t) for t in ticks]
        assert len(set(labels)) == len(labels) and all(len(label) <= 16 for label in labels), labels


def test_nice_ticks_refuses_what_it_cannot_draw():
    for lo, hi in ((0.0, math.inf), (math.nan, 1.0), (0.0, 1e308)):
        with pytest.raises(ValueError):
            nice_ticks(lo, hi)


def test_values_out_of_range_are_left_out_and_one_point_is_a_dot():
    root = ET.fromstring(svg_line_chart({"a": ([0, 1, 2, 3], [1.0, math.nan, 1e308, 2.0]), "b": ([5], [1.5]),
                                         "c": (["x", None], [1, 2])}, title="loss", y_label="loss"))
    lines = {p.get("data-series"): p.get("points").split() for p in root.iter(SVG + "polyline")}
    assert {k: len(v) for k, v in lines.items()} == {"a": 2, "b": 1}
    assert len(list(root.iter(SVG + "circle"))) == 1 and _texts(root, "ytick")[0] == "1"
    assert all(math.isfinite(float(v)) for pts in lines.values() for p in pts for v in p.split(","))
    empty = ET.fromstring(svg_line_chart({"a": ([], [])}, title="t", y_label="y", note="no full window yet"))
    assert _texts(empty, "note") == ["no full window yet"] and not list(empty.iter(SVG + "polyline"))
    assert MAX_ABS < 1e308


def test_windowed_success_starts_at_the_first_full_window():
    assert windowed_success([1, 0, 0, 0, 1, 1], 4) == ([3.0, 4.0, 5.0], [0.25, 0.25, 0.5])
    assert windowed_success([1, 1], 4) == ([], [])
    assert windowed_success([True, False], 1) == ([0.0, 1.0], [1.0, 0.0])
    for bad in (0, True, 2.0):
        with pytest.raises(ConfigError):
            windowed_success([1], bad)


def test_importable_without_matplotlib_jinja2_or_fastapi():
    code = ("import sys; import memento.charts, memento.runs.compare; "
            "print(sorted(m for m in ('matplotlib', 'jinja2', 'fastapi') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
