"""``README.md``, the model card of a selector artifact: what it is, what it was trained on, how to load it, with
the YAML front matter the Hugging Face Hub reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memento.selector.artifact.configs import EncoderSpec, SelectorConfig
from memento.selector.artifact.layout import SELECTOR_FORMAT, SELECTOR_FORMAT_VERSION

__all__ = ["CARD_METADATA", "card_front_matter", "model_card"]

CARD_METADATA: dict[str, Any] = {"library_name": "memento-mdp",
                                 "tags": ["memento", "case-based-reasoning", "retrieval", "soft-q"]}
"""The model card metadata every pushed selector carries (its PyPI name: ``pip install memento-mdp``)."""


def _pct(x: Any) -> str:
    return "n/a" if not isinstance(x, (int, float)) else f"{100.0 * x:.1f}%"


def card_front_matter(manifest: dict[str, Any], spec: EncoderSpec) -> list[str]:
    """The YAML front matter the Hugging Face Hub reads from a model card (``huggingface_hub.ModelCardData``):
    library name and tags (:data:`CARD_METADATA`), the base encoder (its Hub id
    when known), the task suite as the dataset, the run's figures as metrics and as the model index's results."""
    from huggingface_hub import EvalResult, ModelCardData

    source = manifest.get("source") or {}
    summary = source.get("summary") or {}
    base = None
    if spec.kind == "transformers" and spec.files is None:
        base = spec.model if spec.model is not None else "sentence-transformers/all-MiniLM-L6-v2"
    if base is not None and ("/" not in base or base.startswith(("/", ".", "~"))):
        base = None
    run = (manifest.get("run") or {}) if isinstance(manifest.get("run"), dict) else {}
    suite = source.get("suite") or source.get("tasks") or run.get("suite")
    suite = suite if isinstance(suite, str) and suite else None
    metrics = [(name, summary.get(name)) for name in ("success_rate", "moving_success_rate")]
    metrics = [(name, float(value)) for name, value in metrics if isinstance(value, (int, float))
               and not isinstance(value, bool)]
    results = [EvalResult(task_type="case-selection", dataset_type=suite or "tasks", dataset_name=suite or "tasks",
                          metric_type=name, metric_value=float(f"{value:.6g}")) for name, value in metrics]
    data = ModelCardData(library_name=CARD_METADATA["library_name"], tags=list(CARD_METADATA["tags"]),
                         base_model=base, datasets=[suite] if suite else None,
                         metrics=[name for name, _ in metrics] or None,
                         model_name=str(source.get("policy") or "memento-selector") if results else None,
                         eval_results=results or None)
    return ["---", *data.to_yaml().splitlines(), "---", ""]


def _card_training(source: dict[str, Any]) -> list[str]:
    """The card's "Training" lines: where the selector came from and how well that run did."""
    summary = source.get("summary") or {}
    lines: list[str] = []
    if source.get("kind") == "bank":
        lines.append(f"- not trained by a run: a fresh Q-network over the case bank `{source.get('path')}`; "
                     "load it with `learn=True` to train it from feedback")
    elif source:
        lines += [
            f"- source: `{source.get('path')}` ({source.get('kind')}), policy `{source.get('policy')}`",
            f"- planner: {source.get('planner', 'n/a')}; judge: {source.get('judge', 'n/a')}; "
            f"tasks: {source.get('n_tasks', 'n/a')}",
            f"- steps (LLM calls): {source.get('step', 'n/a')} of {source.get('steps', 'n/a')} planned; "
            f"bank {summary.get('bank_size_start', 'n/a')} -> {source.get('bank_cases', 'n/a')} case(s)",
        ]
        if summary:
            lines.append(f"- success rate: {_pct(summary.get('success_rate'))} overall, "
                         f"{_pct(summary.get('moving_success_rate'))} over the last {summary.get('window')} steps")
            windows = summary.get("success_by_window") or []
            if windows:
                lines += ["", "| steps | success rate |", "|---|---|"]
                lines += [f"| {w['start']}-{w['end']} | {_pct(w['rate'])} |" for w in windows]
        comparison = source.get("comparison")
        if comparison:
            lines += ["", "Compared on the same task stream (same seed, same order):", "",
                      "| policy | early | late | overall |", "|---|---|---|---|"]
            for name in comparison.get("order", []):
                r = comparison["policies"][name]
                lines.append(f"| {name} | {_pct(r.get('success_early'))} | {_pct(r.get('success_late'))} | "
                             f"{_pct(r.get('success_rate'))} |")
            lines.append(f"\n(early: the first {comparison.get('window')} steps; late: the last "
                         f"{comparison.get('late_steps')} steps)")
    else:
        lines.append("- no source run recorded")
    return lines


def _card_usage(root: Path, spec: EncoderSpec) -> list[str]:
    """The card's "How to use it" and "Files" sections."""
    return [
        "",
        "## How to use it",
        "",
        "```python",
        "import memento",
        "",
        f'selector = memento.load_selector("{root.name}")            # checks checksums and dimensions first',
        ('result = selector.select("What is the capital of Peru?", k=4)  # ids, cases, probabilities, selection id'
         if spec.kind == "transformers" else
         f"result = selector.select(state_vector, k=4)  # a unit {spec.dim}-d vector; ids, cases, probabilities"),
        "selector.feedback(result.selection_id, reward=1.0)        # learn=True keeps training; save() persists",
        "```",
        "",
        f"Over HTTP: `memento serve {root.name}`; as MCP tools: `memento mcp {root.name}`. "
        f"Check the files: `memento verify {root.name}`.",
        "",
        "## Files",
        "",
        "`manifest.json` (versions, sha256 of every file), `config.json` (selector, Q-network, learner, replay and "
        "index configs, the training run's config), `encoder.json`, `qnet.safetensors`, `learner/`, `replay/`, "
        "`bank/` (cases.sqlite + index.faiss), `feedback.sqlite` (feedback log), this card. Nothing is pickled.",
        "",
    ]


def model_card(root: Path, manifest: dict[str, Any], config: SelectorConfig, spec: EncoderSpec, *,
               cases: int, feedbacks: int, updates: int, alpha: float) -> str:
    """``README.md`` of an artifact: what it is, what it was trained on (figures from the run), how to load it.
    It opens with the YAML front matter the Hugging Face Hub reads (:func:`card_front_matter`)."""
    source = manifest.get("source") or {}
    q = config.qnet
    name = spec.model_id or spec.model or "sentence-transformers/all-MiniLM-L6-v2"
    where = (f", files in `{spec.files}/`" if spec.files else f", revision `{spec.revision}`" if spec.revision
             else "")
    encoder = (f"`{name}` "
               f"(pooling {spec.pooling}, max_length {spec.max_length}, dim {spec.dim}, "
               f"{'unit-normalised' if spec.normalize else 'raw'}{where})" if spec.kind == "transformers"
               else f"none stored (trained with {spec.description or 'a custom encoder'}; pass {spec.dim}-d vectors)")
    lines = card_front_matter(manifest, spec) + [
        f"# memento selector: {root.name}",
        "",
        "A trained case selector (Memento's parametric case-based reasoning): for a task, it picks which past "
        "cases a frozen LLM planner should see. It scores the top-C cosine candidates from its case bank with a "
        "Q-network that estimates P(success | task, case) and samples K of them from softmax(Q / alpha).",
        "",
        "## What it holds",
        "",
        f"- policy: `{config.policy}`, K = {config.k} cases by default, C = {config.candidates} candidates, "
        f"alpha = {alpha:g}" + (" (the learner's)" if config.alpha is None else ""),
        f"- Q-network: `{q.arch}`, dim {q.dim}, hidden {q.hidden} x {q.n_layers} layer(s)"
        + (f", tower width {q.embed_dim}" if q.arch == "two_tower" else "") + f"; {updates} learner update(s)",
        f"- encoder: {encoder}",
        f"- case bank: {cases} case(s), faiss index `{config.index.factory}`",
        f"- replay buffer: capacity {config.replay.capacity}; feedback recorded: {feedbacks}",
        f"- format `{SELECTOR_FORMAT}` version {SELECTOR_FORMAT_VERSION}, memento "
        f"{(manifest.get('versions') or {}).get('memento', '?')}; created {manifest.get('created', '?')}, "
        f"saved {manifest.get('saved', '?')} (save {manifest.get('saves', 1)})",
        "",
        "## Training",
        "",
    ]
    lines += _card_training(source)
    lines += _card_usage(root, spec)
    return "\n".join(lines)

