"""Several policies on one task stream: the comparison behind ``memento online --policy A B`` and ``memento demo``.

:func:`run_comparison` runs each policy with the same seed (so the same task order) from its own copy
of the same starting bank, in ``out_dir/<policy>/``, and writes ``comparison.json`` and the learning
curves; :func:`comparison_table` prints it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, get_args

import numpy as np

from memento.charts import learning_curves_svg
from memento.errors import ConfigError
from memento.io import atomic_write_text
from memento.policies import POLICY_CONFIGS, PolicyConfig, PolicyKind, loop_policy
from memento.runs.qa import LoopConfig, OnlineLoop
from memento.runs.rundir import write_json
from memento.runs.spans import LATE_STEPS, success_spans

__all__ = ["comparison_table", "run_comparison"]


def _named(policies: Sequence[PolicyConfig | PolicyKind] | Mapping[str, PolicyConfig],
           config: LoopConfig) -> list[tuple[str, PolicyConfig]]:
    """``(name, config)`` per policy: a mapping names its configs; a kind or a config is named by its kind."""
    if isinstance(policies, Mapping):
        items = list(policies.items())
        for name, policy in items:
            if not isinstance(name, str) or not name.strip() or "/" in name or name.startswith("."):
                raise ConfigError(f"run_comparison: policy name {name!r}: must be a plain directory name")
            if not isinstance(policy, tuple(POLICY_CONFIGS.values())):
                raise ConfigError(f"run_comparison: {name}={policy!r}: not a policy config")
        return items
    out: list[tuple[str, PolicyConfig]] = []
    for policy in policies:
        if isinstance(policy, str):
            if policy not in get_args(PolicyKind):
                raise ConfigError(f"run_comparison: unknown policy {policy!r}; choose from {get_args(PolicyKind)}")
            out.append((policy, config.policy if config.policy.kind == policy else loop_policy(policy)))  # type: ignore[arg-type]
        elif isinstance(policy, tuple(POLICY_CONFIGS.values())):
            out.append((str(policy.kind), policy))
        else:
            raise ConfigError(f"run_comparison: {policy!r}: not a policy kind or config")
    return out


def run_comparison(policies: Sequence[PolicyConfig | PolicyKind] | Mapping[str, PolicyConfig], *, config: LoopConfig,
                   out_dir: str | Path,
                   late_steps: int = LATE_STEPS, loop_class: Callable[..., OnlineLoop] = OnlineLoop,
                   **kwargs: Any) -> dict[str, Any]:
    """Run each policy on the same task stream (same seed, same task order) in ``out_dir/<policy>/``.

    ``policies``: policy configs, or kinds (a kind takes ``config.policy`` when it is of that kind, else
    :func:`memento.policies.loop_policy`'s default), each named by its kind; or a mapping ``{name: config}`` (to
    compare variants of one kind). Each name at most once; it names the run's directory. Each policy starts from its own
    copy of the same starting bank (``bank_dir`` or ``seed_cases`` in ``kwargs``, as for
    :class:`~memento.runs.qa.OnlineLoop`, which also gets ``make_policy`` and the rest of ``kwargs``). Writes
    ``out_dir/comparison.json`` (per policy: overall success, early success over the first ``config.window``
    steps, late success over the last ``late_steps`` steps, LLM calls, milliseconds per step by component)
    and ``out_dir/learning_curves.svg`` (:func:`memento.charts.learning_curves_svg`: the moving success rate per
    policy against the step, from the first full window on, each policy's mean in the legend). ``loop_class``
    builds each run (default :class:`~memento.runs.qa.OnlineLoop`; ``memento online --workers N`` passes
    :class:`memento.runs.ray.RayOnlineLoop` with its worker settings bound).
    """
    named = _named(policies if isinstance(policies, Mapping) else list(policies), config)
    if not named:
        raise ConfigError("run_comparison: no policies given")
    kinds = [name for name, _ in named]
    if len(set(kinds)) != len(kinds):
        raise ConfigError(f"run_comparison: policies repeat: {kinds}")
    if isinstance(late_steps, bool) or not isinstance(late_steps, int) or late_steps < 1:
        raise ConfigError(f"run_comparison: late_steps={late_steps!r}: must be an integer >= 1")
    out_dir = Path(out_dir)
    created = not out_dir.exists()
    out_dir.mkdir(parents=True, exist_ok=True)
    curves: dict[str, list[bool]] = {}
    results: dict[str, Any] = {}
    for kind, policy in named:
        try:
            loop = loop_class(dataclasses.replace(config, policy=policy), out_dir=out_dir / kind, **kwargs)
        except BaseException:
            if created and not results and not any(out_dir.iterdir()):  # refused before anything was written
                out_dir.rmdir()
            raise
        summary = loop.run()
        success_T = np.asarray(loop.successes, dtype=np.float64)
        curves[kind] = list(loop.successes)
        spans = success_spans(int(success_T.size), window=config.window, late_steps=late_steps)
        (e0, e1), (l0, l1) = spans["early"], spans["late"]
        results[kind] = {
            "success_rate": summary["success_rate"],
            "success_early": float(success_T[e0:e1].mean()),
            "early_steps": [e0, e1],
            "success_late": float(success_T[l0:l1].mean()),
            "late_steps": [l0, l1],
            "llm_calls": summary["llm_calls"], "score_calls": summary.get("score_calls", 0),
            "cumulative_reward": summary["cumulative_reward"],
            "bank_size_start": summary["bank_size_start"], "bank_size_end": summary["bank_size_end"],
            "ms_per_step": summary["ms_per_step"], "updates": summary["updates"], "dir": kind,
            "memory_tokens": summary.get("memory_tokens", 0),
        }
    atomic_write_text(out_dir / "learning_curves.svg", learning_curves_svg(
        curves, window=config.window, title=f"moving success rate ({config.window} steps), seed {config.seed}"))
    comparison = {"steps": config.steps, "seed": config.seed, "window": config.window, "late_steps": late_steps,
                  "policies": results, "order": kinds, "learning_curves": "learning_curves.svg"}
    write_json(out_dir / "comparison.json", comparison)
    return comparison


def comparison_table(comparison: dict[str, Any]) -> str:
    """A plain-text table of a comparison: success early vs late, LLM calls, milliseconds per step."""
    head = ("policy", "early", "late", "overall", "LLM calls", "scored prompts", "ms/step", "overhead ms")
    rows = [head]
    for policy in comparison["order"]:
        r = comparison["policies"][policy]
        rows.append((policy, f"{r['success_early']:.3f}", f"{r['success_late']:.3f}", f"{r['success_rate']:.3f}",
                     str(r["llm_calls"]), str(r.get("score_calls", 0)), f"{r['ms_per_step']['total']:.1f}",
                     f"{r['ms_per_step']['overhead']:.1f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    spans = f"early: {_span_label(comparison, 'early')}; late: {_span_label(comparison, 'late')}"
    return "\n".join(lines) + (f"\n({spans}; scored prompts: online labels or leave-one-out credit, forward passes "
                               "without generation)")


def _span_label(comparison: dict[str, Any], which: str) -> str:
    """How many steps the ``early`` (first) or ``late`` (last) column averaged, from the spans each policy's row
    records (a run shorter than the window or ``late_steps`` averages fewer); per policy when they differ."""
    first_or_last = "first" if which == "early" else "last"
    labels = {}
    for policy in comparison["order"]:
        span = comparison["policies"][policy].get(f"{which}_steps")
        if span is None:  # a comparison written before the spans were recorded: what was asked for
            n = min(comparison["window" if which == "early" else "late_steps"], comparison["steps"])
        else:
            n = max(0, int(span[1]) - int(span[0]))
        labels[policy] = f"{first_or_last} {n} step{'' if n == 1 else 's'}"
    if len(set(labels.values())) == 1:
        return next(iter(labels.values()))
    return ", ".join(f"{label} ({policy})" for policy, label in labels.items())
