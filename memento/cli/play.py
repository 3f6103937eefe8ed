"""``memento play``: the multi-step agent on TextWorld games (:mod:`memento.runs.games`).

The games extra (``textworld``) is imported only when the command runs.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any, get_args

from memento.cli.options import (
    add_bank_option,
    add_command,
    add_config_file,
    add_no_progress,
    add_out,
    add_planner_option,
    add_resume,
    add_systems_flags,
    add_torch_threads,
    check_tensorboard,
    check_torch_threads,
    progress,
    set_torch_threads,
    systems_from_args,
)
from memento.config import LearnerConfig, field_default, from_dict, read_config_json
from memento.errors import ConfigError, GameError
from memento.flags import check_count, config_option, config_options, config_switch, given_fields, option_value
from memento.policies import PolicyKind

MAX_EPISODE_STEPS = 100_000
"""``--max-steps``: an episode's steps (each an LLM call; the trajectory is held in memory until it ends)."""

DESCRIPTION = """\
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

_GAME_FIELDS = ("episodes", "k", "candidates", "checkpoint_every", "seed", "retrieval")
"""The GameLoopConfig fields set by flags of their own name (their help on the fields)."""


def add_parser(commands: Any) -> None:
    from memento.runs.games import GameLoopConfig

    play = add_command(commands, "play", "an agent plays TextWorld games, choosing cases at every step", DESCRIPTION)
    source = play.add_mutually_exclusive_group()
    source.add_argument("--suite", default=None,
                        help="a shipped game suite: tw-tiny, tw-small, tw-stream (default: tw-small)")
    source.add_argument("--games", nargs="+", metavar="FILE", default=None, help="game files (.z8 or .ulx)")
    play.add_argument("--split", default="train", help="split of --suite: train, test or ood (default: train)")
    play.add_argument("--policy", default="soft_q",
                      help=f"{', '.join(get_args(PolicyKind))}, or none (no memory) (default: soft_q)")
    config_option(play, LearnerConfig, "gamma", "soft_q's discount: 0 = cross-entropy on each step's reward, > 0 = "
                  "soft TD")
    add_planner_option(play, default="gemma")
    add_config_file(play, "a GameLoopConfig JSON file (flags given on the command line override its fields)",
                    metavar="JSON")
    config_options(play, GameLoopConfig, _GAME_FIELDS)
    game = field_default(GameLoopConfig, "game")
    config_option(play, type(game), "max_steps", "step limit per episode", shown_default=game.max_steps)
    config_switch(play, GameLoopConfig, "tensorboard")
    add_systems_flags(play, games=True)
    add_bank_option(play, "a starting bank to copy (a directory or milvus:URI[#collection]; default: empty)")
    config_switch(play, GameLoopConfig, "learn")
    play.add_argument("--no-retain", action="store_true", help="the bank retains nothing (evaluation)")
    add_out(play, "run directory")
    add_resume(play, "continue the run in --out from its checkpoint")
    add_torch_threads(play, 0, "torch.set_num_threads (default: torch's)")
    add_no_progress(play)


def _play_config(args: argparse.Namespace) -> Any:
    from memento.policies import loop_policy
    from memento.runs.games import GameLoopConfig

    base = from_dict(GameLoopConfig, read_config_json(args.config)) if args.config else GameLoopConfig()
    known = (*get_args(PolicyKind), "none")
    if args.policy not in known:
        raise ConfigError(f"--policy {args.policy!r}: choose from {', '.join(known)}")
    gamma = option_value(args, LearnerConfig, "gamma")
    if not 0.0 <= gamma < 1.0:
        raise ConfigError(f"--gamma={gamma}: must be in [0, 1)")
    if gamma > 0 and args.policy != "soft_q":
        raise ConfigError(f"--gamma={gamma}: only soft_q learns with a discount")
    changes: dict[str, Any] = given_fields(args, GameLoopConfig, (*_GAME_FIELDS, "learn", "tensorboard"))
    if not args.config or args.policy != "soft_q" or gamma:
        changes["policy"] = loop_policy("random" if args.policy == "none" else args.policy, gamma=gamma)
    changes["memory"] = args.policy != "none" and base.memory
    if args.max_steps is not None:
        check_count("--max-steps", args.max_steps, 1, MAX_EPISODE_STEPS)
        changes["game"] = dataclasses.replace(base.game, max_steps=args.max_steps)
    if args.no_retain:
        changes["cases"] = "none"
    systems = systems_from_args(args, base.systems)
    if systems is not None:
        changes["systems"] = systems
    return dataclasses.replace(base, **changes)


def _games(args: argparse.Namespace) -> list[Path]:
    from memento.envs.textworld import SUITES, build_suite

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


def run(args: argparse.Namespace) -> int:
    config = _play_config(args)  # everything cheap is checked before a model loads or a game is generated
    out = Path(args.out)
    if not args.resume and out.is_dir() and any(out.iterdir()):
        raise ConfigError(f"{out}: already holds a run; pass --resume or choose another --out")
    check_torch_threads(args)
    check_tensorboard(config)
    from memento.planners.spec import build_planner, check_planner_spec, parse_planner_spec

    spec = parse_planner_spec(args.planner)
    check_planner_spec(spec)
    games = _games(args)
    set_torch_threads(args.torch_threads)
    from memento.encoders import Encoder
    from memento.policies import make_policy
    from memento.runs.games import run_games

    encoder = Encoder.from_pretrained()
    planner = build_planner(spec)
    summary = run_games(config, make_policy=make_policy, encoder=encoder, planner=planner, games=games, out_dir=out,
                        bank_dir=args.bank, resume=args.resume,
                        progress=progress(args))
    print(f"{summary['arm']}: {summary['episodes']} episodes, won {summary['success_rate']:.3f}, normalised score "
          f"{summary['mean_score']:.3f}, {summary['mean_steps']:.1f} steps/episode, "
          f"{summary['s_per_episode']:.1f} s/episode; bank {summary['bank_size_start']} -> "
          f"{summary['bank_size_end']} cases")
    print(f"results in {out} (summary.json, episodes.jsonl, steps.jsonl, tb/)")
    return 0
