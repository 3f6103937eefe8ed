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
from memento.config import LearnerConfig, check_bools, field_default, from_dict, read_config_json
from memento.errors import ConfigError, GameError
from memento.flags import (
    HIDDEN,
    check_count,
    config_option,
    config_options,
    config_switch,
    given_fields,
    option_value,
)
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

DEFAULT_SUITE = "tw-small"
"""The shipped suite played when neither ``--suite`` nor ``--games`` is given."""


@dataclasses.dataclass(frozen=True)
class PlayCommandConfig:
    """What ``memento play`` plays and with which policy, beside the loop's config (:class:`GameLoopConfig`, which
    ``--config`` and the other flags set): the games (a shipped suite's split, or game files), the policy by name
    (``none``: no memory) and whether the bank retains the episodes."""

    suite: str | None = dataclasses.field(default=None, metadata={
        "help": "a shipped game suite: tw-tiny, tw-small, tw-stream"})
    games: tuple[str, ...] | None = dataclasses.field(default=None, metadata={"help": "game files (.z8 or .ulx)"})
    split: str = dataclasses.field(default="train", metadata={"help": "split of --suite: train, test or ood"})
    policy: str = dataclasses.field(default="soft_q", metadata={
        "help": f"{', '.join(get_args(PolicyKind))}, or none (no memory)"})
    no_retain: bool = dataclasses.field(default=False, metadata={
        "help": "the bank retains nothing (evaluation)"})

    def __post_init__(self) -> None:
        known = (*get_args(PolicyKind), "none")
        if self.policy not in known:
            raise ConfigError(f"--policy {self.policy!r}: choose from {', '.join(known)}")
        check_bools(self, "no_retain")


def _command(args: argparse.Namespace) -> PlayCommandConfig:
    """The :class:`PlayCommandConfig` of the command line."""
    return PlayCommandConfig(**given_fields(args, PlayCommandConfig))


def add_parser(commands: Any) -> None:
    from memento.runs.games import GameLoopConfig

    play = add_command(commands, "play", "an agent plays TextWorld games, choosing cases at every step", DESCRIPTION)
    source = play.add_mutually_exclusive_group()
    config_option(source, PlayCommandConfig, "suite", shown_default=DEFAULT_SUITE)
    config_option(source, PlayCommandConfig, "games", metavar="FILE", shown_default=HIDDEN)
    config_option(play, PlayCommandConfig, "split")
    config_option(play, PlayCommandConfig, "policy")
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
    config_switch(play, PlayCommandConfig, "no_retain")
    add_out(play, "run directory")
    add_resume(play, "continue the run in --out from its checkpoint")
    add_torch_threads(play, 0, "torch.set_num_threads (default: torch's)")
    add_no_progress(play)


def _play_config(args: argparse.Namespace) -> Any:
    from memento.policies import loop_policy
    from memento.runs.games import GameLoopConfig

    base = from_dict(GameLoopConfig, read_config_json(args.config)) if args.config else GameLoopConfig()
    command = _command(args)  # a policy it does not know is refused here
    gamma = option_value(args, LearnerConfig, "gamma")
    if not 0.0 <= gamma < 1.0:
        raise ConfigError(f"--gamma={gamma}: must be in [0, 1)")
    if gamma > 0 and command.policy != "soft_q":
        raise ConfigError(f"--gamma={gamma}: only soft_q learns with a discount")
    changes: dict[str, Any] = given_fields(args, GameLoopConfig, (*_GAME_FIELDS, "learn", "tensorboard"))
    if not args.config or command.policy != "soft_q" or gamma:
        changes["policy"] = loop_policy("random" if command.policy == "none" else command.policy, gamma=gamma)
    changes["memory"] = command.policy != "none" and base.memory
    if args.max_steps is not None:
        check_count("--max-steps", args.max_steps, 1, MAX_EPISODE_STEPS)
        changes["game"] = dataclasses.replace(base.game, max_steps=args.max_steps)
    if command.no_retain:
        changes["cases"] = "none"
    systems = systems_from_args(args, base.systems)
    if systems is not None:
        changes["systems"] = systems
    return dataclasses.replace(base, **changes)


def _games(args: argparse.Namespace, command: PlayCommandConfig) -> list[Path]:
    from memento.envs.textworld import SUITES, build_suite

    if command.games:
        games = [Path(g) for g in command.games]
        missing = [g for g in games if not g.is_file()]
        if missing:
            raise GameError(f"{missing[0]}: game file not found")
        from memento.envs.textworld import TextWorldEnv

        for game in games:  # a corrupt file is one line now, not after the models have loaded
            TextWorldEnv(game).close()
        return games
    suite = command.suite or DEFAULT_SUITE
    if suite not in SUITES:
        raise ConfigError(f"--suite {suite!r}: unknown; known: {', '.join(sorted(SUITES))}")
    if command.split not in SUITES[suite].splits:
        raise ConfigError(f"--split {command.split!r}: {suite} has {', '.join(SUITES[suite].splits)}")
    return build_suite(suite, splits=[command.split], progress=not args.no_progress)[command.split]


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
    games = _games(args, _command(args))
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
