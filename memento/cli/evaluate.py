"""``memento evaluate``: off-policy evaluation of selection policies from a run's transition log; the pipeline is
:mod:`memento.ope.evaluate`."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

from memento.cli.options import add_bank_option, add_command, add_encoder_flag, add_results_file, add_seed
from memento.config import check_bools
from memento.errors import ConfigError
from memento.flags import HIDDEN, config_option, config_switch, given_fields
from memento.ope.estimators import OPEConfig, RewardModelConfig
from memento.ope.evaluate import export_rounds, run_evaluation, target_specs
from memento.ope.export import write_obp_json, write_vw_cb_adf
from memento.runs.rundir import RunDir

__all__ = ["EvaluateConfig", "add_parser", "cmd_evaluate", "run"]

DESCRIPTION = """\
Estimate, from a run's log, what other case-selection policies would have scored on the same steps
(off-policy evaluation; docs/ope.md).

RUN is a run directory (steps.jsonl, bank/, selector/) or a steps.jsonl file (its bank is the
bank/ beside it, or --bank: a directory or milvus:URI[#collection]). Each --policy is a target:
  logged       the logging policy itself (IPS and SNIPS give the observed mean reward)
  similarity   cosine top-K (deterministic, as the default similarity policy chooses)
  random       uniform over the candidates
  DIR          a trained soft-Q selector (a directory with learner.json, or a run holding selector/),
               sampling from softmax(Q / alpha) with its trained alpha
Per target: IPS, SNIPS, DM and DR on the first chosen case (the reward model is a cross-fitted
ridge-logistic regression on cosine, stored reward and state*case features) and, when steps show
K > 1 cases, the slate estimators inclusion_ips, pi and pi_set (they assume an additive slate
reward). Each with its effective sample size and a percentile-bootstrap interval; a value outside
the reward range [0, 1] is marked '!'. Each warning is printed once. Last, a bottom line per
target: the estimate to read (the logging policy: its observed mean; else the first of DR, SNIPS
whose support, ESS and range checks pass, else DM), its interval and its difference to the
logging policy's observed mean reward.

The log must hold candidate_probs (the logging policy's probability of every candidate), which the
online loop writes; older logs are refused."""


@dataclasses.dataclass(frozen=True)
class EvaluateConfig:
    """What ``memento evaluate`` estimates and writes beside the estimators' settings (:class:`OPEConfig`): the
    target policies, whether each is read greedily, and the log's exports."""

    policies: tuple[str, ...] = dataclasses.field(default=(), metadata={
        "help": "a target: logged, similarity, random or a selector directory (repeatable)"})
    greedy: bool = dataclasses.field(default=False, metadata={
        "help": "evaluate each target's arg-max choice instead of its sampling distribution"})
    export_vw: str | None = dataclasses.field(default=None, metadata={
        "help": "write the log as Vowpal Wabbit cb_adf text"})
    export_obp: str | None = dataclasses.field(default=None, metadata={
        "help": "write the log as Open Bandit Pipeline bandit feedback (JSON)"})

    def __post_init__(self) -> None:
        object.__setattr__(self, "policies", tuple(self.policies))
        check_bools(self, "greedy")
        if not self.policies and not (self.export_vw or self.export_obp):
            raise ConfigError("nothing to do: give at least one --policy, or --export-vw / --export-obp")


def add_parser(commands: Any) -> None:
    ev = add_command(commands, "evaluate", "off-policy evaluation of selection policies from a run's log",
                     DESCRIPTION)
    ev.add_argument("run", metavar="RUN_DIR_OR_STEPS_JSONL", help="a run directory or its steps.jsonl")
    config_option(ev, EvaluateConfig, "policies", flag="--policy", action="append", nargs=None, metavar="POLICY",
                  shown_default=HIDDEN)
    add_bank_option(ev, "the bank the log's candidates come from, a directory or milvus:URI[#collection] (default: "
                        "the run's bank/)")
    add_encoder_flag(ev, "the encoder the run used: a directory or a Hub id hf://ORG/NAME[@REV]")
    config_switch(ev, EvaluateConfig, "greedy")
    config_option(ev, OPEConfig, "n_boot", flag="--bootstrap", dest="bootstrap", metavar="N", type=int)
    config_option(ev, OPEConfig, "level")
    config_option(ev, RewardModelConfig, "folds", type=int)
    add_seed(ev, "seed of the bootstrap, the folds and Monte Carlo moments (default: 0)")
    add_results_file(ev, "write the estimates as JSON", required=False)
    config_option(ev, EvaluateConfig, "export_vw", metavar="FILE", shown_default=HIDDEN)
    config_option(ev, EvaluateConfig, "export_obp", metavar="FILE", shown_default=HIDDEN)


def _warn_stderr(message: str) -> None:
    print(f"memento: warning: {message}", file=sys.stderr)


def _check_outputs(args: argparse.Namespace, command: EvaluateConfig) -> None:
    """The output files (``--json``, ``--export-vw``, ``--export-obp``), checked before anything is read or written:
    distinct, none an existing directory, none the log itself, and ``--json`` only with a ``--policy`` to estimate."""
    if args.json and not command.policies:
        raise ConfigError(f"--json {args.json}: holds the estimates, which need at least one --policy")
    source = Path(args.run)
    log = (RunDir(source).steps if source.is_dir() else source).resolve()
    seen: dict[Path, str] = {}
    outputs = (("--json", args.json), ("--export-vw", command.export_vw), ("--export-obp", command.export_obp))
    for flag, value in outputs:
        if not value:
            continue
        path = Path(value).resolve()
        if path.is_dir():
            raise ConfigError(f"{flag} {value}: is a directory, expected a file to write")
        if path == log:
            raise ConfigError(f"{flag} {value}: is the log being evaluated; choose another file")
        if path in seen:
            raise ConfigError(f"{flag} {value}: the same file as {seen[path]}; give each output its own file")
        seen[path] = flag


def cmd_evaluate(args: argparse.Namespace, *, make_policy: Any | None = None, encoder: Any | None = None) -> int:
    """Run ``memento evaluate`` (:func:`memento.ope.evaluate.evaluate_run`, then the table, the JSON and the exports).
    ``make_policy`` (``memento.policies.make_policy``, passed in by the composition root)
    builds the similarity, random and
    selector targets; ``encoder`` replaces the one ``--encoder`` names (a test hook: tests pass a light one).
    Everything cheap (flags, targets, the whole log) is checked before the bank is opened and the encoder loaded."""
    command = EvaluateConfig(**given_fields(args, EvaluateConfig))
    given = {"n_boot": args.bootstrap, "level": args.level}
    model = RewardModelConfig(**given_fields(args, RewardModelConfig, ("folds",)))
    config = OPEConfig(**{name: value for name, value in given.items() if value is not None}, reward_model=model)
    if args.seed < 0:
        raise ConfigError(f"--seed={args.seed}: must be >= 0")
    specs = target_specs(command.policies)
    if make_policy is None and any(spec.kind != "logged" for spec in specs):
        raise ConfigError("cmd_evaluate: the similarity, random and selector targets need make_policy")
    _check_outputs(args, command)
    evaluation, data = run_evaluation(args.run, specs, bank=args.bank, config=config, make_policy=make_policy,
                                      encoder=encoder, encoder_path=args.encoder, greedy=command.greedy,
                                      seed=args.seed, warn=_warn_stderr)
    if command.export_vw:
        write_vw_cb_adf(command.export_vw, export_rounds(data))
        print(f"{evaluation.rounds} examples written to {command.export_vw} (Vowpal Wabbit cb_adf)")
    if command.export_obp:
        write_obp_json(command.export_obp, export_rounds(data))
        print(f"{evaluation.rounds} rounds written to {command.export_obp} (Open Bandit Pipeline bandit feedback)")
    if not specs:
        return 0
    print(f"{evaluation.source}: {evaluation.rounds} steps ({evaluation.skipped} without a choice skipped), K up to "
          f"{evaluation.k_max}, observed mean reward {evaluation.observed_mean_reward:.4f}, logged by "
          f"{', '.join(evaluation.logging_policy)}")
    print(evaluation.table())
    if args.json:
        from memento.io import write_json

        write_json(args.json, evaluation.to_json())
        print(f"estimates written to {args.json}")
    return 0


def run(args: argparse.Namespace) -> int:
    from memento.policies import make_policy

    return cmd_evaluate(args, make_policy=make_policy)
