"""Shared settings and counters of the fuzzing and kill tests (``make probe`` runs them scaled up).

- :data:`FUZZ`: hypothesis settings every fuzz test starts from: derandomised (the same inputs on every run), no
  example database, no deadline.
- :func:`examples`: a test's ``max_examples``, multiplied by ``MEMENTO_PROBE_SCALE`` (default 1; ``make probe``
  sets it higher).
- :func:`record`: count what a probe did (``inputs`` tried, ``kills`` sent, ``requests`` made, ``lost`` acknowledged
  items missing afterwards, ``tracebacks`` seen). With ``MEMENTO_PROBE_REPORT=FILE`` set, the session's totals per
  test module are written to FILE as JSON when pytest ends (``tests/conftest.py``).
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Literal

from hypothesis import HealthCheck, settings

FUZZ = settings(derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large, HealthCheck.filter_too_much])

Kind = Literal["inputs", "kills", "requests", "lost", "tracebacks"]

COUNTS: dict[str, Counter[str]] = {}
"""Totals of this pytest process: test module -> kind -> count."""


def scale() -> int:
    """``MEMENTO_PROBE_SCALE`` as a positive integer (1 when unset)."""
    raw = os.environ.get("MEMENTO_PROBE_SCALE", "1")
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"MEMENTO_PROBE_SCALE={raw!r}: must be a positive integer") from None
    if value < 1:
        raise ValueError(f"MEMENTO_PROBE_SCALE={raw!r}: must be a positive integer")
    return value


def examples(n: int) -> int:
    """``max_examples`` for a fuzz test: ``n`` times the probe scale."""
    return n * scale()


def record(module: str, kind: Kind, n: int = 1) -> None:
    """Add ``n`` to ``kind`` for test module ``module`` (pass ``__name__``)."""
    COUNTS.setdefault(module.rsplit(".", 1)[-1], Counter())[kind] += n
