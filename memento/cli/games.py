"""``memento play`` and ``memento bench games``: the multi-step agent on TextWorld games (memento.runs.games).

Kept apart from :mod:`memento.cli.entry` so the games extra (``textworld``) is imported only when these run.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any, get_args

from memento.config import field_default, from_dict, read_config_json

__all__ = ["add_bench_games_parser", "add_bench_stream_parser", "add_play_parser", "cmd_bench_games",
           "cmd_bench_stream", "cmd_play"]

_PLANNER_SPECS = "gemma | hf:PATH_OR_HUB_ID[@REV] | openai:MODEL@URL"

_PLAY_DESCRIPTION = """\
Play text games with a frozen LLM actor that sees the cases a policy chooses at each step.

Games come from a shipped suite (--suite, generated into the cache on first use with a progress
bar: ~5 s a game) or from game files (--games, .z8/.ulx with their .json). Each step the state
(objective, observation, inventory, recent history) is encoded, the policy chooses --k of the
--candidates nearest cases of the bank, and the actor (Gemma 3 270M by default) scores every
admissible command after a prompt holding those cases, and samples one (a command a chosen case
with a stored return > 0 proposes gets part of the mass). After each episode the policy learns
(soft-Q: cross-entropy on the step's reward with --gamma 0, soft TD with the target network with
--gamma > 0) and the bank retains the episode's step cases and one episode case.

OUT gets config.json, run.json, bank/, steps.jsonl (one line per command), episodes.jsonl, tb/,
checkpoint/, summary.json and, for soft_q, selector/. --resume continues an interrupted run from
its checkpoint (mid-episode too: the game is replayed to the saved step)."""


def add_play_parser(commands: Any) -> None:
    from memento.config import PolicyKind

    play = commands.add_parser("play", help="an agent plays TextWorld games, choosing cases at every step",
                               description=_PLAY_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = play.add_mutually_exclusive_group()
    source.add_argument("--suite", default=None,
                        help="a shipped game suite: tw-tiny, tw-small, tw-stream (default: tw-small)")
    source.add_argument("--games", nargs="+", metavar="FILE", default=None, help="game files (.z8 or .ulx)")
    play.add_argument("--split", default="train", help="split of --suite: train, test or ood (default: train)")
    play.add_argument("--policy", default="soft_q",
                      help=f"{', '.join(get_args(PolicyKind))}, or none (no memory) (default: soft_q)")
    play.add_argument("--gamma", type=float, default=0.0,
                      help="soft_q's discount: 0 = cross-entropy on each step's reward, > 0 = soft TD (default: 0)")
    play.add_argument("--planner", default="gemma", metavar="SPEC", help=f"{_PLANNER_SPECS} (default: gemma)")
    play.add_argument("--config", metavar="JSON", default=None,
                      help="a GameLoopConfig JSON file (flags given on the command line override its fields)")
    from memento.runs.games import GameLoopConfig

    for flag, field, text in (("--episodes", "episodes", "episodes to play"), ("--k", "k", "cases per decision"),
                              ("--candidates", "candidates", "candidate set size C"),
                              ("--checkpoint-every", "checkpoint_every", "steps between checkpoints; 0: at the end"),
                              ("--seed", "seed", "seed of every random stream")):
        play.add_argument(flag, type=int, default=None, dest=field,
                          help=f"{text} (default: {field_default(GameLoopConfig, field)})")
    play.add_argument("--retrieval", choices=["step", "episode"], default=None,
                      help="choose cases at every step or once per episode (default: step)")
    play.add_argument("--max-steps", type=int, default=None,
                      help=f"step limit per episode (default: {field_default(GameLoopConfig, 'game').max_steps})")
    add_systems_flags(play, games=True)
    play.add_argument("--bank", metavar="BANK", default=None,
                      help="a starting bank to copy (a directory or milvus:URI[#collection]; default: empty)")
    play.add_argument("--no-learn", action="store_true", help="the policy does not learn (evaluation)")
    play.add_argument("--no-retain", action="store_true", help="the bank retains nothing (evaluation)")
    play.add_argument("--out", required=True, metavar="DIR", help="run directory")
    play.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
    play.add_argument("--torch-threads", type=int, default=0, help="torch.set_num_threads (default: torch's)")
    play.add_argument("--no-progress", action="store_true", help="no progress bar")


def add_systems_flags(parser: Any, *, games: bool) -> None:
    """The memory-system flags of ``memento play`` (``games``: with reflection and retries) and ``memento
    online``."""
    parser.add_argument("--build", default=None, metavar="SYSTEMS",
                        help="memory systems that build items: comma-separated cfgm, lifemem, plugmem (default: none)")
    parser.add_argument("--items", choices=["cases", "all"], default=None,
                        help="candidates: raw cases only, or with their linked tips, skills and focus points "
                             "(default: cases)")
    if games:
        parser.add_argument("--reflect", action="store_true",
                            help="CFGM's key-information reflection at steps with an anomalous observation")
        parser.add_argument("--retries", type=int, default=None,
                            help="CFGM's exploration: replay a failed game up to N more times with a reflection "
                                 "(default: 0)")
    parser.add_argument("--templates", metavar="JSON", default=None,
                        help="a JSON file replacing builder prompt templates "
                             "(memento.systems.llm.BuilderTemplates)")


def systems_from_args(args: argparse.Namespace, base: Any) -> Any:
    """``base`` (a SystemsConfig) with the memory-system flags applied; None when no flag is given."""
    systems: dict[str, Any] = {}
    if args.build is not None:
        systems["build"] = tuple(b.strip() for b in args.build.split(",") if b.strip())
    if args.items is not None:
        systems["items"] = args.items
    if getattr(args, "reflect", False):
        systems["reflect"] = True
    if getattr(args, "retries", None) is not None:
        systems["retries"] = args.retries
    if args.templates is not None:
        from memento.systems.llm import BuilderTemplates

        BuilderTemplates.from_json(args.templates)  # a bad file is one line now, before a model loads
        systems["templates"] = args.templates
    return dataclasses.replace(base, **systems) if systems else None


def _play_config(args: argparse.Namespace) -> Any:
    from memento.config import PolicyKind
    from memento.errors import ConfigError
    from memento.runs.games import GameLoopConfig, game_policy

    base = from_dict(GameLoopConfig, read_config_json(args.config)) if args.config else GameLoopConfig()
    known = (*get_args(PolicyKind), "none")
    if args.policy not in known:
        raise ConfigError(f"--policy {args.policy!r}: choose from {', '.join(known)}")
    if not 0.0 <= args.gamma < 1.0:
        raise ConfigError(f"--gamma={args.gamma}: must be in [0, 1)")
    if args.gamma > 0 and args.policy != "soft_q":
        raise ConfigError(f"--gamma={args.gamma}: only soft_q learns with a discount")
    changes: dict[str, Any] = {name: getattr(args, name) for name in ("episodes", "k", "candidates",
                                                                        "checkpoint_every", "seed", "retrieval")
                               if getattr(args, name) is not None}
    if not args.config or args.policy != "soft_q" or args.gamma:
        changes["policy"] = game_policy("random" if args.policy == "none" else args.policy, gamma=args.gamma)
    changes["memory"] = args.policy != "none" and base.memory
    if args.max_steps is not None:
        changes["game"] = dataclasses.replace(base.game, max_steps=args.max_steps)
    if args.no_learn:
        changes["learn"] = False
    if args.no_retain:
        changes["cases"] = "none"
    systems = systems_from_args(args, base.systems)
    if systems is not None:
        changes["systems"] = systems
    return dataclasses.replace(base, **changes)


def _games(args: argparse.Namespace) -> list[Path]:
    from memento.envs.textworld import SUITES, build_suite
    from memento.errors import ConfigError, GameError

    if args.games:
        games = [Path(g) for g in args.games]
        missing = [g for g in games if not g.is_file()]
        if missing:
            raise GameError(f"{missing[0]}: game file not found")
        from memento.envs.textworld import TextWorldEnv

        for game in games:  # a corrupt file is one line now, not after the models have loaded
            TextWorldEnv(game).close()
        return games
    suite = args.suite or "tw-small"
    if suite not in SUITES:
        raise ConfigError(f"--suite {suite!r}: unknown; known: {', '.join(sorted(SUITES))}")
    if args.split not in SUITES[suite].splits:
        raise ConfigError(f"--split {args.split!r}: {suite} has {', '.join(SUITES[suite].splits)}")
    return build_suite(suite, splits=[args.split], progress=not args.no_progress)[args.split]


def cmd_play(args: argparse.Namespace) -> int:
    from memento.errors import ConfigError

    config = _play_config(args)  # everything cheap is checked before a model loads or a game is generated
    out = Path(args.out)
    if not args.resume and out.is_dir() and any(out.iterdir()):
        raise ConfigError(f"{out}: already holds a run; pass --resume or choose another --out")
    if args.torch_threads < 0:
        raise ConfigError(f"--torch-threads={args.torch_threads}: must be >= 0")
    from memento.planners.spec import build_planner, check_planner_spec, parse_planner_spec

    spec = parse_planner_spec(args.planner)
    check_planner_spec(spec)
    games = _games(args)
    if args.torch_threads:
        import torch

        torch.set_num_threads(args.torch_threads)  # process-wide, on purpose: the library never does this
    from memento.encoders import Encoder
    from memento.runs.games import run_games
    from policies import make_policy

    encoder = Encoder.from_pretrained()
    planner = build_planner(spec)
    summary = run_games(config, make_policy=make_policy, encoder=encoder, planner=planner, games=games, out_dir=out,
                        bank_dir=args.bank, resume=args.resume,
                        progress=not args.no_progress and sys.stderr.isatty())
    print(f"{summary['arm']}: {summary['episodes']} episodes, won {summary['success_rate']:.3f}, normalised score "
          f"{summary['mean_score']:.3f}, {summary['mean_steps']:.1f} steps/episode, "
          f"{summary['s_per_episode']:.1f} s/episode; bank {summary['bank_size_start']} -> "
          f"{summary['bank_size_end']} cases")
    print(f"results in {out} (summary.json, episodes.jsonl, steps.jsonl, tb/)")
    return 0


def add_bench_games_parser(bench_cmds: Any) -> None:
    from memento.bench.games import GamesBenchConfig

    bg = bench_cmds.add_parser(
        "games", help="multi-step agents on TextWorld games: no memory, similarity, soft-Q (gamma 0 and > 0)",
        description="Per seed and arm: train on the suite's train split from an empty bank (the policy learns "
                    "after each episode), then evaluate on each --splits split with the bank and Q-network "
                    "frozen, --eval-repeats episodes per game. Success rate, normalised score and steps per "
                    "episode, mean and 95%% t-interval over seeds, paired differences to none and similarity, "
                    "and the train phase's success by window. With Gemma 3 270M on 2 cores: ~0.5-1 s a step.")
    d = {f.name: f.default for f in dataclasses.fields(GamesBenchConfig)}
    bg.add_argument("--suite", default=None, help=f"shipped suite (default: {d['suite']})")
    bg.add_argument("--arms", default=None, help=f"comma-separated arms (default: {','.join(d['arms'])})")
    bg.add_argument("--seeds", type=int, nargs="+", default=None, help=f"seeds (default: {list(d['seeds'])})")
    bg.add_argument("--train-episodes", type=int, default=None, help=f"(default: {d['train_episodes']})")
    bg.add_argument("--eval-repeats", type=int, default=None,
                    help=f"evaluation episodes per game (default: {d['eval_repeats']})")
    bg.add_argument("--continual", action="store_true",
                    help="evaluate as the online loop runs: retain the evaluation episodes and keep learning "
                         "(results keyed <split>-continual; with --resume the train runs in --workdir are reused)")
    bg.add_argument("--case-weight", type=float, default=None,
                    help=f"the actor's probability mass on the chosen cases' proposals (default: {d['case_weight']})")
    bg.add_argument("--splits", default=None, help=f"evaluation splits (default: {','.join(d['splits'])})")
    bg.add_argument("--max-steps", type=int, default=None, help=f"step limit (default: {d['max_steps']})")
    bg.add_argument("--k", type=int, default=None, help=f"cases per decision (default: {d['k']})")
    bg.add_argument("--candidates", type=int, default=None, help=f"candidate set size (default: {d['candidates']})")
    bg.add_argument("--planner", default=None, metavar="SPEC", help=f"{_PLANNER_SPECS} (default: {d['planner']})")
    bg.add_argument("--workdir", default=None, help="keep the run directories here (default: a temporary one)")
    bg.add_argument("--resume", action="store_true", help="reuse finished runs in --workdir")
    bg.add_argument("--torch-threads", type=int, default=0, help="torch.set_num_threads (default: torch's)")
    bg.add_argument("--json", required=True, metavar="OUT", help="results file")


def _bench_fields(args: argparse.Namespace, names: tuple[str, ...], lists: tuple[str, ...]) -> dict[str, Any]:
    """A bench config's fields given on the command line: ``names`` as they are, ``lists`` comma-separated,
    ``--seeds``."""
    given: dict[str, Any] = {name: getattr(args, name) for name in names if getattr(args, name) is not None}
    for name in lists:
        if getattr(args, name):
            given[name] = tuple(v.strip() for v in getattr(args, name).split(",") if v.strip())
    if args.seeds:
        given["seeds"] = tuple(args.seeds)
    return given


def _run_bench(args: argparse.Namespace, run: Any, config: Any, table: Any) -> int:
    """``--torch-threads``, the benchmark, its table and where the results went."""
    if args.torch_threads:
        import torch

        torch.set_num_threads(args.torch_threads)
    results = run(config, out=args.json, workdir=args.workdir, progress=sys.stderr.isatty())
    print(table(results))
    print(f"results written to {args.json}")
    return 0


def cmd_bench_games(args: argparse.Namespace) -> int:
    from memento.bench.games import GamesBenchConfig, format_games_table, run_games_bench

    given = _bench_fields(args, ("suite", "train_episodes", "eval_repeats", "max_steps", "k", "candidates",
                                 "planner", "case_weight"), ("arms", "splits"))
    config = GamesBenchConfig(resume=args.resume, continual=args.continual, **given)
    return _run_bench(args, run_games_bench, config, format_games_table)


def add_bench_stream_parser(bench_cmds: Any) -> None:
    from memento.bench.stream import EXTRA_ARMS, STREAM_ARMS, StreamBenchConfig

    bs = bench_cmds.add_parser(
        "stream", help="lifelong evaluation of memory systems over a stream of environments (OP, BwT)",
        description="Per seed, stream order (grouped, random) and arm (" + ", ".join(STREAM_ARMS) + "): "
                    "play the suite's train games as one stream (retaining, building memory items, learning), "
                    "evaluate each environment's test games at its learned point (its last training game) and "
                    "after the stream, frozen (on a question suite such as facts-real its question families are "
                    "the environments, answered by the online loop from the suite's seed bank, scored by exact "
                    "match); report OP (mean final score), BwT (relative change from the learned point), final "
                    "success and the builders' LLM calls and items per kind.")
    d = {f.name: f.default for f in dataclasses.fields(StreamBenchConfig)}
    bs.add_argument("--suite", default=None, help=f"shipped suite (default: {d['suite']})")
    bs.add_argument("--arms", default=None, help=f"comma-separated arms (default: {','.join(d['arms'])}; also "
                                                 f"{', '.join(EXTRA_ARMS)}, only when named)")
    bs.add_argument("--orders", default=None, help=f"grouped, random (default: {','.join(d['orders'])})")
    bs.add_argument("--seeds", type=int, nargs="+", default=None, help=f"seeds (default: {list(d['seeds'])})")
    bs.add_argument("--eval-repeats", type=int, default=None,
                    help=f"evaluation episodes per test game (default: {d['eval_repeats']})")
    bs.add_argument("--max-steps", type=int, default=None, help=f"step limit (default: {d['max_steps']})")
    bs.add_argument("--k", type=int, default=None, help=f"items per decision, the prompt budget (default: {d['k']})")
    bs.add_argument("--candidates", type=int, default=None, help=f"candidate set size (default: {d['candidates']})")
    bs.add_argument("--planner", default=None, metavar="SPEC", help=f"{_PLANNER_SPECS} (default: {d['planner']})")
    bs.add_argument("--envs", default=None, metavar="F[,F...]",
                    help="question suites: the families in the stream (default: every family of the suite)")
    bs.add_argument("--train-per-env", type=int, default=None,
                    help=f"question suites: train questions per family (default: {d['train_per_env']})")
    bs.add_argument("--test-per-env", type=int, default=None,
                    help=f"question suites: test questions per family (default: {d['test_per_env']})")
    bs.add_argument("--no-seed-bank", action="store_true",
                    help="question suites: start every memory arm from an empty bank (default: the suite's seed "
                         "cases, retained answers stored with the lenient contains judge)")
    bs.add_argument("--workdir", default=None, help="keep the run directories here (default: a temporary one)")
    bs.add_argument("--resume", action="store_true", help="reuse finished runs in --workdir")
    bs.add_argument("--torch-threads", type=int, default=0, help="torch.set_num_threads (default: torch's)")
    bs.add_argument("--json", required=True, metavar="OUT", help="results file")


def cmd_bench_stream(args: argparse.Namespace) -> int:
    from memento.bench.stream import StreamBenchConfig, format_stream_table, run_stream_bench

    given = _bench_fields(args, ("suite", "eval_repeats", "max_steps", "k", "candidates", "planner",
                                 "train_per_env", "test_per_env"), ("arms", "orders", "envs"))
    if args.no_seed_bank:
        given["seed_bank"] = False
    config = StreamBenchConfig(resume=args.resume, **given)
    return _run_bench(args, run_stream_bench, config, format_stream_table)
