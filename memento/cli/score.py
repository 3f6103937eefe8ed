"""``memento score``: label training tasks' candidate cases with the frozen planner's answer likelihood."""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
from pathlib import Path
from typing import Any, Literal

from memento.bank import CaseBank, open_bank
from memento.bank.uri import bank_name
from memento.cli.options import (
    EXIT_OK,
    add_bank_option,
    add_cases_format,
    add_command,
    add_encoder_options,
    add_no_progress,
    add_out,
    add_planner_option,
    add_tasks_file,
    add_torch_threads,
    check_torch_threads,
    encoder_config,
    index_factory,
    load_encoder,
    progress,
    set_torch_threads,
)
from memento.config import check_choice
from memento.envs.tasks import suite_dir
from memento.errors import ConfigError, DataFormatError
from memento.flags import HIDDEN, config_option, config_options, config_switch, given_fields
from memento.formats import read_case_file
from memento.planners.base import PlannerError
from memento.planners.spec import build_planner, check_planner_spec, parse_planner_spec
from memento.runs.labels import LabelConfig, label_tasks, read_label_tasks, summary_path

DESCRIPTION = """\
Label training tasks with the frozen planner (docs/training.md, "From planner-scored labels"; EPR / LLM-R style):
for each task with a known answer, encode the question, take the bank's top --candidates cases by cosine, and score
the log-likelihood of the gold answer (answers[0]) with each candidate as the only demonstration (--k > 1: also
--sets random K-sets of them). Nothing is generated. Tasks without answers are skipped and counted.

The labels go to --out (JSONL, one self-describing row per task: task_id, state, answer, candidate_ids,
logprob, mean_logprob, n_tokens, cosine, prompt_tokens, sets / set_logprob when k > 1, planner, prompt)
and the cost (forward passes = scored prompts, wall time, seconds per scored candidate) to
<out stem>.summary.json beside it. A bank built from --cases (or a suite's seed cases) is kept in
--save-bank (default <out stem>.bank/): train from the labels with
  memento train --from-labels OUT --bank BANK --out RUN"""

_LABEL_FIELDS = ("candidates", "max_tasks", "k", "sets", "seed", "batch_size")
"""The LabelConfig fields set by flags of their own name (their help on the fields)."""

ScoreSplit = Literal["train", "test", "all"]
DEFAULT_SPLIT = "train"
"""The split of ``--suite`` when ``--split`` is not given."""


@dataclasses.dataclass(frozen=True)
class ScoreSourceConfig:
    """Where ``memento score`` takes its tasks and candidate cases from (beside ``--tasks`` and ``--bank``), and
    where a bank it builds goes; ``None``: not given."""

    suite: str | None = dataclasses.field(default=None, metadata={
        "help": "a shipped suite (facts, facts-real, arith-real, elements-real, contradict-real) or a suite directory"})
    split: ScoreSplit | None = dataclasses.field(default=None, metadata={"help": "split of --suite"})
    cases: str | None = dataclasses.field(default=None, metadata={
        "help": "cases to build the bank from (default with --suite: the suite's seed cases)"})
    save_bank: str | None = dataclasses.field(default=None, metadata={
        "help": "where a bank built from --cases or the suite's seed cases goes"})

    def __post_init__(self) -> None:
        if self.split is not None:
            check_choice(self, "split", ScoreSplit)


def add_parser(commands: Any) -> None:
    score = add_command(commands, "score", "label tasks' candidate cases with the planner's answer likelihood",
                        DESCRIPTION)
    source = score.add_mutually_exclusive_group(required=True)
    config_option(source, ScoreSourceConfig, "suite", metavar="NAME|DIR", shown_default=HIDDEN)
    add_tasks_file(source, required=False)
    config_option(score, ScoreSourceConfig, "split", shown_default=DEFAULT_SPLIT)
    bank = score.add_mutually_exclusive_group()
    add_bank_option(bank, "the case bank to take candidates from (a directory or milvus:URI[#collection])")
    config_option(bank, ScoreSourceConfig, "cases", metavar="FILE", shown_default=HIDDEN)
    add_cases_format(score)
    config_option(score, ScoreSourceConfig, "save_bank", metavar="DIR", shown_default="<out stem>.bank next to --out")
    add_planner_option(score, LabelConfig)
    config_options(score, LabelConfig, {name: {"metavar": "N", "shown_default": "all"} if name == "max_tasks" else {}
                                        for name in _LABEL_FIELDS})
    config_switch(score, LabelConfig, "exclude_self", flag="--keep-self")
    add_out(score, "the labels JSONL file (written atomically)", metavar="FILE")
    add_torch_threads(score)
    add_no_progress(score)
    add_encoder_options(score.add_argument_group("encoder (used when the bank is created)"))


def _tasks(args: argparse.Namespace, source: ScoreSourceConfig) -> tuple[list[Any], int, str]:
    """The tasks with answers of ``--suite``/``--split`` or ``--tasks``, how many were skipped, and the split."""
    if args.tasks is not None and source.split is not None:
        raise ConfigError("--split goes with --suite (a --tasks file is one split)")
    if source.suite is None and args.bank is None and source.cases is None:
        raise ConfigError("no cases to choose from: give --bank DIR or --cases FILE "
                          "(or --suite NAME for its seed cases)")
    split = source.split or DEFAULT_SPLIT
    if source.suite is not None:
        directory = suite_dir(source.suite)  # an unknown suite is one line
        files = [directory / f"{part}.jsonl" for part in (("train", "test") if split == "all" else (split,))]
    else:
        files = [Path(args.tasks)]
    tasks, skipped = [], 0
    for file in files:
        part, part_skipped = read_label_tasks(file)
        tasks.extend(part)
        skipped += part_skipped
    if not tasks:
        raise DataFormatError(f"no task with an answer to score ({skipped} task(s) without answers skipped)",
                              path=files[0] if len(files) == 1 else None)
    return tasks, skipped, split


def _seed_cases(args: argparse.Namespace, source: ScoreSourceConfig, out: Path) -> tuple[list[Any] | None, Path | None]:
    """Without ``--bank``: the cases to build a bank from and where it goes (checked free)."""
    from memento.envs.tasks import seed_cases

    if args.bank is not None:
        open_bank(args.bank, read_only=True).close()  # fails early on a name that is not a bank
        return None, None
    cases = read_case_file(source.cases, args.cases_format) if source.cases else seed_cases(source.suite)
    if not cases:
        raise DataFormatError("no cases to build the bank from", path=source.cases)
    stem = out.name[:-len(".jsonl")] if out.name.endswith(".jsonl") else out.name
    save_bank = Path(source.save_bank) if source.save_bank else out.with_name(f"{stem}.bank")
    if save_bank.exists():
        raise ConfigError(f"--save-bank {save_bank}: already exists; pass --bank {save_bank} to reuse it, "
                          "or remove it")
    return cases, save_bank


def _build_bank(args: argparse.Namespace, source: ScoreSourceConfig, cases: list[Any], save_bank: Path, encoder: Any,
                config: Any) -> Any:
    """The bank of ``cases``, assembled beside ``save_bank`` and renamed into place."""
    work = save_bank.with_name(f".{save_bank.name}.tmp-{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    try:
        with CaseBank.create(work, encoder.dim, index=index_factory(args), encoder=config) as building:
            vectors = encoder.encode([c.state for c in cases], normalize=True)
            building.add(cases, vectors.reshape(len(cases), building.dim))
        os.replace(work, save_bank)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"built bank {save_bank} from {len(cases)} case(s)"
          f"{' of ' + str(source.cases) if source.cases else ' (the seed cases of ' + str(source.suite) + ')'}")
    return CaseBank.open(save_bank)


def run(args: argparse.Namespace) -> int:
    # everything cheap is checked before a model is loaded or a file written
    config = LabelConfig(**given_fields(args, LabelConfig, ("planner", *_LABEL_FIELDS, "exclude_self")))
    source = ScoreSourceConfig(**given_fields(args, ScoreSourceConfig))
    spec = parse_planner_spec(config.planner)
    check_planner_spec(spec)
    check_torch_threads(args)
    tasks, skipped, split = _tasks(args, source)
    out = Path(args.out)
    if out.is_dir():
        raise ConfigError(f"--out {out}: is a directory; give the labels file to write")
    cases, save_bank = _seed_cases(args, source, out)
    set_torch_threads(args.torch_threads)
    bank = None if args.bank is None else open_bank(args.bank, read_only=True)
    if bank is not None and not args.encoder and bank.config.encoder is not None:
        encoding = bank.config.encoder  # the encoder the bank records
    else:
        encoding = encoder_config(args)
    bank_dir = bank_name(args.bank) if args.bank is not None else save_bank
    try:
        encoder = load_encoder(encoding)
        try:
            planner = build_planner(spec)
        except ImportError as error:
            raise PlannerError(f"planner {spec}: not available ({error})") from None
        if bank is None:
            assert cases is not None and save_bank is not None
            bank = _build_bank(args, source, cases, save_bank, encoder, encoding)
        if len(bank) == 0:
            raise DataFormatError("the bank holds no case to choose from", path=bank.path)
        meta = {"tasks_source": str(source.suite if source.suite is not None else args.tasks),
                "split": split if source.suite is not None else None, "skipped_no_answer": skipped,
                "tasks_read": len(tasks)}
        summary = label_tasks(tasks, bank, encoder, planner, config, out, progress=progress(args), meta=meta)
    finally:
        if bank is not None:
            bank.close()
    _report(summary, config, out, bank_dir)
    return EXIT_OK


def _report(summary: dict[str, Any], config: LabelConfig, out: Path, bank_dir: Any) -> None:
    sets = f" + {summary['set_passes']} set(s)" if summary["set_passes"] else ""
    per = summary["s_per_forward"]
    print(f"scored {summary['rows']} task(s) x up to {config.candidates} candidate(s){sets}: "
          f"{summary['forward_passes']} forward pass(es) (scored prompts) in {summary['wall_s']:.1f} s wall, "
          f"{summary['score_s']:.1f} s scoring" + (f", {per:.3f} s per scored candidate" if per is not None else ""))
    print(f"skipped: {summary['skipped_no_answer']} task(s) without answers, {summary['skipped_no_candidates']} "
          f"without candidates; {summary['excluded_self']} candidate(s) that were the task's own question left out")
    print(f"planner {summary['planner']} (prompt {summary['prompt']})")
    print(f"labels in {out} ({summary['rows']} rows), cost in {summary_path(out)}")
    print(f"train on them: memento train --from-labels {out} --bank {bank_dir} --out RUN")
