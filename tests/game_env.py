"""Test doubles and a driver for the game loop (memento.runs.games) on real, tiny TextWorld games.

- ``ScriptedPlanner``: a deterministic stand-in for the frozen LLM (a test double: the games, the engine,
  the bank and the learner are real). It scores a command 0.0 when it is one of ``preferred`` (e.g. the
  walkthrough commands of the games) and ``-3`` minus a small hash of the command otherwise, so the actor
  (sampling from the softmax of these scores) wins often but not always. ``plan`` writes the first
  preferred command that is admissible in the prompt text, else "wait" (for the generate mode).
- ``tiny_games(directory)``: the ``tw-tiny`` suite's train games, generated once into ``directory``.
- ``main``: ``python -m tests.game_env OUT GAMES_DIR CONFIG_JSON [--resume] [--delay S]`` runs
  :func:`memento.runs.games.run_games` with the hashing encoder and the scripted planner (the SIGKILL test).
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from memento.planners.base import AnswerScore, PlanOutput
from memento.types import Case, Task
from tests.loop_env import HashingEncoder

__all__ = ["HashingEncoder", "ScriptedPlanner", "tiny_games"]


def _noise(text: str) -> float:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little") / 2**32


class ScriptedPlanner:
    """See the module docstring. ``calls`` counts scoring and planning calls; ``fail_after`` raises after that
    many calls (a crash in the middle of a run)."""

    def __init__(self, preferred: Sequence[str], *, delay: float = 0.0, fail_after: int | None = None):
        self.preferred = set(preferred)
        self.delay = delay
        self.fail_after = fail_after
        self.calls = 0

    def _tick(self) -> None:
        self.calls += 1
        if self.fail_after is not None and self.calls > self.fail_after:
            raise RuntimeError(f"scripted crash after {self.fail_after} calls")
        if self.delay:
            time.sleep(self.delay)

    def score_many(self, tasks: Sequence[Task], case_sets_per_task: Sequence[Sequence[Sequence[Case]]],
                   answers: Sequence[str | None] | None = None) -> list[list[AnswerScore]]:
        self._tick()
        out = []
        for i, (task, sets) in enumerate(zip(tasks, case_sets_per_task)):
            answer = task.answers[0] if answers is None or answers[i] is None else answers[i]
            value = 0.0 if answer in self.preferred else -3.0 - _noise(answer)
            out.append([AnswerScore(logprob=value, n_tokens=max(1, len(answer.split())))] * len(sets))
        return out

    def plan(self, task: Task, cases: Sequence[Case]) -> PlanOutput:
        self._tick()
        for command in sorted(self.preferred):
            if command in task.question:
                return PlanOutput(text=command)
        return PlanOutput(text="wait")

    def plan_many(self, tasks: Sequence[Task], cases: Sequence[Sequence[Case]]) -> list[PlanOutput]:
        return [self.plan(t, c) for t, c in zip(tasks, cases)]

    def __repr__(self) -> str:
        return f"ScriptedPlanner({len(self.preferred)} preferred commands)"


def tiny_games(directory: Path, splits: Sequence[str] = ("train",)) -> dict[str, list[Path]]:
    """The ``tw-tiny`` suite's games in ``directory`` (generated on the first call, reused after)."""
    from memento.envs.textworld import build_suite

    return build_suite("tw-tiny", cache_dir=directory, splits=list(splits), progress=False)


def walkthrough_commands(games: Sequence[Path]) -> list[str]:
    from memento.envs.textworld import TextWorldEnv

    commands: list[str] = []
    for game in games:
        with TextWorldEnv(game) as env:
            env.reset()
            commands.extend(env.walkthrough)
    return commands


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    from memento.config import from_dict
    from memento.policies import make_policy
    from memento.runs.games import GameLoopConfig, run_games

    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("games", help="a directory of .z8 games")
    parser.add_argument("config", help="GameLoopConfig as JSON")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds each planner call sleeps")
    args = parser.parse_args(argv)
    games = sorted(Path(args.games).glob("*.z8"))
    config = from_dict(GameLoopConfig, json.loads(args.config))
    planner: Any = ScriptedPlanner(walkthrough_commands(games), delay=args.delay)
    run_games(config, make_policy=make_policy, encoder=HashingEncoder(), planner=planner, games=games,
              out_dir=Path(args.out), resume=args.resume)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
