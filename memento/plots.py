"""Learning-curve figures (PNG) with matplotlib's Agg canvas.

The figure is drawn on a ``matplotlib.figure.Figure`` with an explicit ``FigureCanvasAgg``: no
``pyplot``, no global backend switch, nothing left open, so it works on headless machines and in
any process.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from memento.errors import ConfigError
from memento.io import atomic_write

__all__ = ["moving_average", "plot_learning_curves"]


def moving_average(values: Sequence[float] | np.ndarray, window: int) -> np.ndarray:
    """The trailing mean over the last ``window`` values at each index (over fewer at the start)."""
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ConfigError(f"moving_average: window={window!r}: must be an integer >= 1")
    x = np.asarray(values, dtype=np.float64).reshape(-1)
    if x.size == 0:
        return x
    csum = np.concatenate([[0.0], np.cumsum(x)])
    hi = np.arange(1, x.size + 1)
    lo = np.maximum(0, hi - window)
    return (csum[hi] - csum[lo]) / (hi - lo)


def plot_learning_curves(curves: Mapping[str, Sequence[float]], path: str | Path, *, window: int = 50,
                         title: str | None = None, ylabel: str = "success rate") -> Path:
    """Plot the moving average (``window`` steps) of each named per-step series against the step; write a PNG.

    ``curves`` maps a label (a policy) to its per-step values (0/1 successes or rewards). The file
    is written atomically. Returns ``path``.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not curves:
        raise ConfigError("plot_learning_curves: no curves given")
    path = Path(path)
    fig = Figure(figsize=(7.0, 4.2), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for label, values in curves.items():
        y = moving_average(values, window)
        ax.plot(np.arange(1, y.size + 1), y, label=f"{label} (mean {np.mean(values) if len(values) else 0:.2f})",
                linewidth=1.6)
    ax.set_xlabel("step (task)")
    ax.set_ylabel(f"{ylabel}, moving average over {window}")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right", fontsize="small")
    if title:
        ax.set_title(title)
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png"))
    return path
