"""The stream benchmark's arms and protocol, shared by the game stream (:mod:`memento.bench.stream`) and the
question stream (:mod:`memento.bench.stream_qa`): what each arm runs (:func:`stream_arm`), the train run paused at
every environment's learned point and the frozen evaluations (:func:`learned_and_final`), and the per-call token
counts of a set of run summaries (:func:`per_call`).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from memento.errors import ConfigError
from memento.policies import CFGMRetrievalConfig, LifeMemRetrievalConfig, PlugMemRetrievalConfig
from memento.runs.rundir import read_json

__all__ = ["EXTRA_ARMS", "LEAN_BUDGET", "LEAN_NOTE", "STREAM_ARMS", "finished_or_cleared", "learned_and_final",
           "per_call", "stream_arm"]

STREAM_ARMS = ("none", "similarity", "cfgm", "lifemem", "soft_q-all")
EXTRA_ARMS = ("plugmem", "plugmem-lean", "soft_q-every")
"""Arms that run only when named (``--arms ...,plugmem``): PlugMem's builders and retrieval (3 builder calls per
question, more per game episode), the same with a small budget, and soft-Q over every kind of all three systems."""

LEAN_BUDGET = 48
"""``plugmem-lean``: words of knowledge kept after pruning (``PlugMemRetrievalConfig`` and ``PlugMemConfig``)."""
LEAN_NOTE = 24
"""``plugmem-lean``: the compressed note's most words (``PlugMemConfig.note_max_tokens``)."""


def stream_arm(arm: str, *, questions: bool = False) -> tuple[bool, Any, Any]:
    """``(memory, policy config, SystemsConfig)`` of a stream arm (see :mod:`memento.bench.stream`): the game loop's
    policies, or with ``questions`` the online loop's (no key-information reflection: a question has no
    observation to reflect on)."""
    from memento.policies import loop_policy as policy  # the game loop's defaults are the online loop's
    from memento.systems.plugmem import PlugMemConfig
    from memento.systems.runtime import SystemsConfig

    reflect = not questions
    match arm:
        case "none":
            return False, policy("random"), SystemsConfig()
        case "similarity":
            return True, policy("similarity"), SystemsConfig()
        case "cfgm":
            return True, CFGMRetrievalConfig(), SystemsConfig(build=("cfgm",), items="all", reflect=reflect)
        case "lifemem":
            return True, LifeMemRetrievalConfig(), SystemsConfig(build=("lifemem",), items="all")
        case "soft_q-all":
            return True, policy("soft_q"), SystemsConfig(build=("cfgm", "lifemem"), items="all", reflect=reflect)
        case "plugmem":
            return True, PlugMemRetrievalConfig(), SystemsConfig(build=("plugmem",), items="all")
        case "plugmem-lean":
            return True, PlugMemRetrievalConfig(budget_tokens=LEAN_BUDGET, cases=1), SystemsConfig(
                build=("plugmem",), items="all",
                plugmem=PlugMemConfig(budget_tokens=LEAN_BUDGET, note_max_tokens=LEAN_NOTE))
        case "soft_q-every":
            return True, policy("soft_q"), SystemsConfig(build=("cfgm", "lifemem", "plugmem"), items="all",
                                                         reflect=reflect)
    raise ConfigError(f"stream arm {arm!r}: choose one of {', '.join(STREAM_ARMS + EXTRA_ARMS)}")


def finished_or_cleared(out_dir: Path, *, resume: bool) -> dict[str, Any] | None:
    """An evaluation run's summary when ``resume`` (``--resume``) finds it finished; else ``None``, ``out_dir``
    cleared."""
    if resume and (out_dir / "summary.json").is_file():
        return read_json(out_dir / "summary.json")
    if out_dir.exists():
        shutil.rmtree(out_dir)
    return None


def learned_and_final(run_root: Path, points: dict[str, int], test_by_env: dict[str, list[Any]], *, resume: bool,
                      memory: bool, train: Any,
                      evaluate: Any) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any] | None]:
    """The protocol of one arm, for either loop: ``train(end, train_dir, resume) -> summary`` runs the stream's one
    train run up to position ``end`` (a later segment resumes it), and at each environment's learned point
    ``evaluate(out_dir, tests, bank_dir, selector) -> summary`` answers its tests frozen; after the stream every
    environment is evaluated again. ``resume`` (``--resume``): the first segment continues an existing run too.
    Returns the learned and final evaluation summaries by environment (without
    memory the final ones are the learned ones) and the last train summary."""
    train_dir = run_root / "train"
    learned: dict[str, Any] = {}
    train_summary: dict[str, Any] | None = None
    selector: Path | None = None
    bank_dir: Path | None = None
    if memory:
        for segment, end in enumerate(sorted(set(points.values()))):
            again = segment > 0 or resume  # a later segment continues the stream's one run
            if not again and train_dir.exists():
                shutil.rmtree(train_dir)
            train_summary = train(end, train_dir, again)
            selector = train_dir / "selector" if (train_dir / "selector").is_dir() else None
            for env in (e for e, point in points.items() if point == end):
                learned[env] = evaluate(run_root / f"learned-{env}", test_by_env[env], train_dir / "bank", selector)
        bank_dir = train_dir / "bank"
    final = {env: evaluate(run_root / f"final-{env}", test_by_env[env], bank_dir, selector) for env in sorted(points)}
    return (learned if memory else dict(final)), final, train_summary


def per_call(summaries: dict[str, dict[str, Any]], total: str, calls: str) -> float | None:
    """``total`` summed over the summaries per ``calls`` summed (``None`` when no call, or no summary has
    ``total``: a run from before it was counted)."""
    if not any(total in s for s in summaries.values()):
        return None
    n = sum(int(s.get(calls, 0)) for s in summaries.values())
    return sum(int(s.get(total, 0)) for s in summaries.values()) / n if n else None
