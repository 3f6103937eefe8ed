"""What is left of the matplotlib learning curves: :func:`moving_average`, for ``memento.runs.qa``'s
``moving_success_rate`` only. The charts are :mod:`memento.charts` (SVG); this module goes once qa.py stops
importing it."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from memento.errors import ConfigError

__all__ = ["moving_average"]


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
