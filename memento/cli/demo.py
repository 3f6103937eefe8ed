"""``memento demo``: the main job on its embedded defaults (what ``make demo`` runs), a ``memento online`` run."""

from __future__ import annotations

import argparse
import dataclasses
import shutil
from pathlib import Path
from typing import Any

from memento.cli import online
from memento.cli.options import add_command, add_out, add_planner_option, add_seed
from memento.config import check_bools, is_int
from memento.envs.tasks import suite_dir
from memento.errors import ConfigError
from memento.flags import config_option, config_switch, given_fields
from memento.runs.spans import LATE_STEPS

DESCRIPTION = """\
The main job on its embedded defaults (what `make demo` runs): the online loop on the realistic
facts-real suite (data/facts-real: test split, its seed case bank, whose stored rewards are each case's
own outcome under a lenient judge, so misleading-format demonstrations carry reward 1) with the real
Gemma 3 270M planner and the exact-match judge; retained cases are stored with their own lenient
outcome (--retain-judge contains), as the seed bank's are. Two policies on the same task stream, both
choosing among the cases with reward > 0:

  soft_q      the learned selector, STARTING FROM the selector shipped in data/facts-real/selector/:
              pre-trained offline on planner-scored labels of the facts-real TRAIN split (memento score
              + memento train --from-labels --anchor cosine --features case; the test split was never
              scored), then learning online from the rewards;
  similarity  Memento's non-parametric retrieval: the K nearest rewarded cases.

It prints a table (success rate early vs late, LLM calls, ms per step) and leaves, under --out, one
directory per policy (TensorBoard events in tb/, summary.json, steps.jsonl, the trained selector in
soft_q/selector/), comparison.json and learning_curves.svg (open it in a browser). Running it again
continues or re-reports the same run (--fresh starts over); --from-scratch starts soft_q from a fresh
(similarity-anchored) Q-network instead. Any option of `memento online` can be changed with `memento online`."""

DEMO_SELECTOR = "selector"
"""The pre-trained selector's directory inside the facts-real suite (data/facts-real/selector/)."""


@dataclasses.dataclass(frozen=True)
class DemoConfig:
    """What ``memento demo`` changes in the run it makes (everything else is the embedded defaults)."""

    steps: int = dataclasses.field(default=250, metadata={"help": "tasks (LLM calls) per policy"})
    fresh: bool = dataclasses.field(default=False, metadata={"help": "delete --out first and start over"})
    from_scratch: bool = dataclasses.field(default=False, metadata={
        "help": "soft_q starts from a fresh Q-network, not from the shipped pre-trained selector"})

    def __post_init__(self) -> None:
        if not is_int(self.steps):  # its range is memento online's to check (--steps)
            raise ConfigError(f"DemoConfig.steps={self.steps!r}: must be an integer")
        check_bools(self, "fresh", "from_scratch")


def add_parser(commands: Any) -> None:
    demo = add_command(commands, "demo", "the main job on its defaults: soft-Q vs similarity with Gemma", DESCRIPTION)
    config_option(demo, DemoConfig, "steps")
    add_out(demo, "output (default: checkpoints/demo)", default="checkpoints/demo")
    add_planner_option(demo, default="gemma")
    add_seed(demo, "seed of every random stream of the run (default: 0)")
    config_switch(demo, DemoConfig, "fresh")
    config_switch(demo, DemoConfig, "from_scratch")


def online_argv(args: argparse.Namespace, config: DemoConfig, out: Path) -> list[str]:
    """The ``memento online`` command line the demo runs."""
    suite = suite_dir("facts-real")
    argv = ["--tasks", str(suite / "test.jsonl"), "--cases", str(suite / "cases.jsonl"),
            "--planner", args.planner, "--policy", "soft_q,similarity", "--judge", "exact",
            "--retain-judge", "contains", "--soft-q-candidates", "positive",
            "--steps", str(config.steps), "--seed", str(args.seed), "--out", str(out), "--torch-threads", "1",
            "--late-steps", str(min(LATE_STEPS, max(1, config.steps // 2)))]
    if not config.from_scratch:
        selector = suite / DEMO_SELECTOR
        argv += ["--init-qnet", str(selector)]
        print(f"soft_q starts from the selector pre-trained on planner-scored labels of facts-real/train "
              f"({selector}; see its README.md); similarity is positive-only cosine retrieval. "
              f"Test split, {config.steps} tasks per policy.")
    else:
        print(f"soft_q starts from a fresh similarity-anchored Q-network with case features; "
              f"test split, {config.steps} tasks per policy.")
    if out.exists() and any(out.iterdir()):
        argv.append("--resume")
        print(f"continuing the demo run in {out} (use --fresh to start over)")
    return argv


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    config = DemoConfig(**given_fields(args, DemoConfig))
    if config.fresh and out.exists():
        shutil.rmtree(out)
    parser = argparse.ArgumentParser(prog="memento")
    online.add_parser(parser.add_subparsers(dest="command"))
    return online.run(parser.parse_args(["online", *online_argv(args, config, out)]))
