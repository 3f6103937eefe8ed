"""Early and late success: the one definition of the spans a comparison reports.

``early`` is the first ``window`` steps of a run (the loop's moving-average window), ``late`` the last
``late_steps`` steps (``memento online --late-steps``, default :data:`LATE_STEPS`), ``overall`` every step;
each is clipped to the run's length. :func:`memento.runs.compare.run_comparison` (``comparison.json``), the
online benchmark and the inspector's overview read success over these spans.
"""

from __future__ import annotations

from memento.errors import ConfigError

__all__ = ["LATE_STEPS", "success_spans"]

LATE_STEPS = 200
"""The default ``late_steps`` (``memento online --late-steps``, :func:`memento.runs.compare.run_comparison`)."""


def success_spans(steps: int, *, window: int, late_steps: int = LATE_STEPS) -> dict[str, tuple[int, int]]:
    """``{"overall", "early", "late"}`` -> ``(start, end)`` step indices (end exclusive) of a run of ``steps``."""
    for name, value, low in (("steps", steps, 0), ("window", window, 1), ("late_steps", late_steps, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(f"success_spans: {name}={value!r}: must be an integer >= {low}")
    return {"overall": (0, steps), "early": (0, min(window, steps)), "late": (steps - min(late_steps, steps), steps)}
