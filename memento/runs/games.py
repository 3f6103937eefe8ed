"""The multi-step loop: a frozen-LLM agent plays text games, a policy chooses the cases it sees at each step.

One **episode** is one game played from its start until it is won, lost or reaches the step limit
(``GameLoopConfig.game.max_steps``). One **step** is one command::

    state (objective, observation, inventory, recent history)    memento.envs.textworld.GameState
      -> encoder.encode(state.text())                             state_D
      -> bank.candidates(state_D, C)                              top-C cases by cosine
      -> policy.select(state_D, candidates, K, rng)               Selection     (retrieval="step"; "episode":
                                                                                 once, at the first step)
      -> actor.act(state.text(), admissible, cases, rng)          one admissible command (memento.planners.actor)
      -> env.step(command)                                        reward = normalised score change, done

At the **end of an episode** the policy learns from the episode's decisions (one
:class:`~memento.learn.policy.Observation` per step, with the next state's embedding and candidates and the
``done`` flag: a soft-Q learner with ``gamma > 0`` regresses on the soft TD target
``r + gamma * (1 - done) * V_target(s')``, with ``gamma = 0`` it fits ``P(r = 1)`` of the step's own reward
by cross-entropy), and the bank retains the episode (``GameLoopConfig.cases``):

- **step cases**, one per step: ``state`` = the state text, ``action`` = the command, ``reward`` = the
  discounted return from that step, ``sum_j case_gamma**j * r_{t+j}`` (so a step on the way to a win keeps
  credit for it), ``env`` = the game type, ``meta.granularity = "step"``;
- one **episode case**, as Memento stores a task: ``state`` = the first state's text, ``action`` = the
  trajectory (one ``> command`` per line), ``reward`` = the normalised final score, ``meta.granularity =
  "episode"``.

A case the bank already holds (same state, action, env, kind) is not added again. A step's reward lies in
[0, 1] and an episode's rewards sum to its normalised score, so the single-step learner's range holds and
``gamma < 1`` already prefers short wins (there is no step cost). Within an episode the policy and the bank
do not change: an episode never sees its own steps, and every step of it chose with the same parameters.

**Time-limit truncation** is not termination: the last step of an episode cut by the step limit keeps
``done = False`` and bootstraps from the final state (its embedding and candidates), while a won or lost
game ends with ``done = True``.

**Randomness.** ``numpy.random.SeedSequence(seed)`` spawns the game order, the policy's draws, the Q-network
initialisation, the learner's generator and the actor's draws. A seeded run is reproducible on one device
when the planner is deterministic.

**Checkpoints and resume.** A checkpoint (every ``checkpoint_every`` steps, at the end of the run, and
whenever an episode ends after the step count crossed a multiple) holds ``state.json`` (counters, both RNG
states, the bank's length and uid, the game-list fingerprint and, mid-episode, the episode so far: its
commands, each step's state text, selection and reward), ``config.json``, copies of ``steps.jsonl`` and
``episodes.jsonl``, and the policy's state. Resuming truncates the bank and the logs back to the checkpoint,
re-creates the game's state by replaying the episode's commands from the start (the engine is deterministic)
and the step embeddings and candidates from the texts (the bank is the checkpoint's), and continues: the run
ends in the state an uninterrupted run reaches (bank, Q-network weights, per-step rewards).

**Run directory**: :class:`memento.runs.rundir.RunDir` (``config.json``, ``run.json``, ``bank/``,
``steps.jsonl`` (:class:`memento.formats.StepRecord`, one per command: ``task_id`` is ``<game>#<episode>``,
``output`` the command, ``done`` the episode's end), ``episodes.jsonl``, ``tb/``, ``checkpoint/``,
``summary.json``, ``selector/``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from memento.bank import Candidates
from memento.bank.protocol import Bank
from memento.config import (
    MAX_STEPS,
    check,
    check_choice,
    check_float,
    check_int,
)
from memento.envs.textworld import GameState, TextWorldConfig, TextWorldEnv
from memento.errors import CheckpointError, GameError
from memento.formats import StepRecord
from memento.io import parse_json
from memento.learn.policy import Observation, Policy, PolicyFactory
from memento.planners.actor import ActorChoice, ActorConfig, CommandActor
from memento.policies import SoftQConfig
from memento.runs.base import Run, RunConfig, RunSpec, Stream, selection_fields, timed
from memento.runs.qa import success_by_window
from memento.runs.rundir import RunDir
from memento.systems.items import memory_tokens
from memento.systems.runtime import split_notes
from memento.types import Case, Selection

__all__ = ["GAME_COMPONENTS", "GameLoop", "GameLoopConfig", "games_fingerprint", "prompt_case",
           "run_games"]

logger = logging.getLogger(__name__)

Retrieval = Literal["step", "episode"]
"""When the policy chooses cases: at every step, or once per episode (at its first state)."""

Retained = Literal["step", "episode", "both", "none"]
"""Which cases an episode adds to the bank (``GameLoopConfig.cases``)."""

GAME_COMPONENTS = ("encode", "candidates", "select", "act", "env", "learn", "retain", "log", "checkpoint")
"""Where a step's time goes; ``summary.json`` reports the mean milliseconds per step of each."""

RESUMABLE_CHANGES = ("episodes", "checkpoint_every", "tensorboard")
"""GameLoopConfig fields a resumed run may change; any other difference is refused."""

CHECKPOINT_KIND = "games"

GAMES = Stream(noun="games", changed="other games", fingerprint_key="games_fingerprint", size_key="n_games")
"""A stream of game files (``state.json``: ``games_fingerprint``, ``n_games``)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class GameLoopConfig(RunConfig):
    """One run of the game loop (see the module docstring).

    - ``episodes``: games to play (drawn from the game list: a fresh permutation per pass with ``shuffle``,
      else the list order, cycled); ``k``: cases shown per decision; ``candidates``: C, the cosine
      pre-selection the policy chooses from;
    - ``policy``: :data:`memento.policies.PolicyConfig` (:func:`memento.policies.loop_policy` gives the defaults, with
      the game's ``gamma``); a soft-Q config may have ``learner.gamma > 0`` here (soft TD on the game's transitions);
    - ``memory``: retrieve cases at all (``False``: the no-memory baseline: the actor sees no case and nothing
      is retrieved, whatever the bank holds); ``same_env``: candidates only among the cases of the game's own
      type (``Case.env``); ``retrieval``: per ``"step"`` or per ``"episode"``;
    - ``cases``: what an episode retains (``"step"``, ``"episode"``, ``"both"``, ``"none"``); ``case_gamma``: the
      discount of a step case's stored return;
    - ``learn``: let the policy learn from the episodes (``False``: evaluate a fixed policy);
    - ``plan``: Memento's planner/executor split: at an episode's first step the planner writes a plan of
      subgoals from the first state and the chosen cases (one generation), and every step's actor prompt shows it
      (``Plan: ...`` before the state; the encoded state does not include it);
    - ``game``: the environment's settings (:class:`~memento.envs.textworld.TextWorldConfig`: step limit, state
      text bounds, hidden commands, what a command that is not admissible does); the loop's default is 15 steps,
      one past step in the state text and 700 characters, so a prompt with two cases stays near 300 tokens;
    - ``actor``: how the frozen LLM picks a command (:class:`~memento.planners.actor.ActorConfig`);
    - ``systems``: the memory systems built and shown (:class:`~memento.systems.runtime.SystemsConfig`: CFGM's
      focus points, tips, reflection and retries, LifeMem's clusters and skills, candidates over raw cases or over
      every kind); the default builds nothing and shows raw cases, as every earlier run did;
    - ``seed``; ``index``: the faiss factory of a new bank; ``window``: episodes per moving-average window;
      ``checkpoint_every``: steps between checkpoints (0: only at the end); ``tensorboard``: event files
      under ``out_dir/tb``.

    The fields shared with the QA loop and their checks are :class:`~memento.runs.base.RunConfig`'s (here with
    smaller ``k``, ``candidates``, ``window`` and ``checkpoint_every`` defaults).
    """

    episodes: int = dataclasses.field(default=24, metadata={"help": "episodes to play"})
    k: int = dataclasses.field(default=2, metadata={"help": "cases per decision"})
    candidates: int = dataclasses.field(default=16, metadata={"help": "candidate set size C"})
    memory: bool = True
    same_env: bool = True
    retrieval: Retrieval = dataclasses.field(default="step", metadata={"help": (
        "choose cases at every step or once per episode")})
    cases: Retained = "both"
    case_gamma: float = 0.9
    plan: bool = False
    game: TextWorldConfig = dataclasses.field(default_factory=lambda: TextWorldConfig(
        max_steps=15, history=1, max_state_chars=700))
    actor: ActorConfig = dataclasses.field(default_factory=ActorConfig)
    window: int = 8
    checkpoint_every: int = dataclasses.field(default=50, metadata={"help": "steps between checkpoints; 0: at the end"})

    def __post_init__(self) -> None:
        cls = type(self)
        check_int(self, "episodes", 1, MAX_STEPS)
        super().__post_init__()
        for field in ("memory", "same_env", "plan"):
            check(isinstance(getattr(self, field), bool), cls, field, getattr(self, field), "must be true or false")
        check_choice(self, "retrieval", Retrieval)
        check_choice(self, "cases", Retained)
        check_float(self, "case_gamma", low=0.0, high=1.0)
        check(isinstance(self.game, TextWorldConfig), cls, "game", self.game, "must be a TextWorldConfig")
        check(isinstance(self.actor, ActorConfig), cls, "actor", self.actor, "must be an ActorConfig")
        if isinstance(self.policy, SoftQConfig) and self.policy.labels.active:
            check(False, cls, "policy", f"labels.m={self.policy.labels.m}",
                  "online labels score a question's answer; the game loop has none (use labels.m = 0)")
        if isinstance(self.policy, SoftQConfig) and self.policy.learner.gamma > 0 and self.retrieval == "episode":
            check(False, cls, "retrieval", self.retrieval, "a per-episode choice is one decision per episode "
                  "(single-step): soft_q needs learner.gamma = 0 with it")

    @property
    def arm(self) -> str:
        """A short name of what this run compares: ``none``, ``similarity``, ``soft_q``, ``soft_q-g0.9``..."""
        if not self.memory:
            return "none"
        if isinstance(self.policy, SoftQConfig) and self.policy.learner.gamma > 0:
            return f"soft_q-g{self.policy.learner.gamma:g}"
        return self.policy_kind


def games_fingerprint(games: Sequence[Path]) -> str:
    """sha256 over the game files' names and bytes, in order (a resumed run must play the same games)."""
    digest = hashlib.sha256()
    for game in games:
        digest.update(Path(game).name.encode("utf-8") + b"\0")
        with open(game, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        digest.update(b"\n")
    return digest.hexdigest()


def discounted_returns(rewards_T: Sequence[float], gamma: float) -> np.ndarray:
    """``G_t = sum_j gamma**j * r_{t+j}`` for every step ``t`` of an episode."""
    out_T = np.zeros(len(rewards_T), dtype=np.float64)
    running = 0.0
    for t in range(len(rewards_T) - 1, -1, -1):
        running = float(rewards_T[t]) + gamma * running
        out_T[t] = running
    return out_T


def prompt_case(case: Case, *, max_chars: int = 300) -> Case:
    """A case as the actor's prompt shows it: a step case's state cut to its ``Now:`` part (what the player saw
    when it took the action), an episode case's to its ``Goal:`` line, each at most ``max_chars`` characters (a
    prompt of two full 700-character states is twice as slow to score); other cases unchanged."""
    granularity = case.meta.get("granularity")
    if granularity not in ("step", "episode"):
        return case
    lines = case.state.splitlines()
    key = "Now: " if granularity == "step" else "Goal: "
    part = next((line for line in (reversed(lines) if granularity == "step" else lines) if line.startswith(key)),
                case.state)
    part = part[len(key):] if part.startswith(key) else part
    if len(part) > max_chars:
        part = part[:max_chars - 3].rstrip() + "..."
    return dataclasses.replace(case, state=part or case.state)


def _selection_to_json(sel: Selection | None) -> dict[str, Any] | None:
    if sel is None:
        return None
    return {"ids": list(sel.ids), "positions": [int(p) for p in sel.positions_K],
            "probs_K": [float(p) for p in sel.probs_K], "set_prob": float(sel.set_prob),
            "candidate_ids": list(sel.candidate_ids), "probs_C": [float(p) for p in sel.probs_C],
            "greedy": bool(sel.greedy)}


def _selection_from_json(data: dict[str, Any] | None) -> Selection | None:
    if data is None:
        return None
    return Selection(ids=list(data["ids"]), positions_K=np.asarray(data["positions"], dtype=np.int64),
                     probs_K=np.asarray(data["probs_K"], dtype=np.float64), set_prob=float(data["set_prob"]),
                     candidate_ids=list(data["candidate_ids"]), probs_C=np.asarray(data["probs_C"], dtype=np.float64),
                     greedy=bool(data["greedy"]))


@dataclasses.dataclass
class _Step:
    """One step of the episode in progress (JSON in a mid-episode checkpoint)."""

    text: str
    selection: Selection | None
    command: str
    reward: float
    invalid: bool
    source: str
    correction: str | None = None  # systems.reflect: the reflection on this step's anomalous observation
    # not saved: recomputed from ``text`` and the (unchanged) bank on resume
    state_D: np.ndarray | None = None
    candidates: Candidates | None = None

    def to_json(self) -> dict[str, Any]:
        return {"text": self.text, "selection": _selection_to_json(self.selection), "command": self.command,
                "reward": self.reward, "invalid": self.invalid, "source": self.source, "correction": self.correction}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> _Step:
        return cls(text=str(data["text"]), selection=_selection_from_json(data["selection"]),
                   command=str(data["command"]), reward=float(data["reward"]), invalid=bool(data["invalid"]),
                   source=str(data["source"]), correction=data.get("correction"))


@dataclasses.dataclass
class _Episode:
    """The episode in progress."""

    index: int
    game: int  # index into the game list
    steps: list[_Step] = dataclasses.field(default_factory=list)
    tried: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    selection: Selection | None = None  # retrieval="episode": the episode's one choice
    plan: str | None = None  # GameLoopConfig.plan: the planner's plan of subgoals, written at the first step
    start_step: int = 0  # the run's step count when the episode began
    attempt: int = 0  # systems.retries: 0 for a game's first attempt, then 1, 2, ...
    reflection: str | None = None  # systems.retries: the reflection on the failed previous attempt
    started: float = 0.0  # wall seconds spent on it before this process (a resumed episode)

    @property
    def commands(self) -> list[str]:
        return [step.command for step in self.steps]

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "game": self.game, "steps": [s.to_json() for s in self.steps],
                "tried": self.tried, "selection": _selection_to_json(self.selection), "plan": self.plan,
                "start_step": self.start_step, "attempt": self.attempt, "reflection": self.reflection,
                "wall_s": self.started}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> _Episode:
        return cls(index=int(data["index"]), game=int(data["game"]),
                   steps=[_Step.from_json(s) for s in data["steps"]],
                   tried={str(k): [str(c) for c in v] for k, v in data["tried"].items()},
                   selection=_selection_from_json(data["selection"]), plan=data.get("plan"),
                   start_step=int(data["start_step"]), attempt=int(data.get("attempt", 0)),
                   reflection=data.get("reflection"),
                   started=float(data.get("wall_s", 0.0)))


def _tried_key(state: GameState) -> str:
    """Which game state a command was tried in (the observation and what the player carries)."""
    return hashlib.sha1((state.observation + "\0" + state.inventory).encode("utf-8")).hexdigest()[:16]



@dataclasses.dataclass
class _Commanded:
    """A command's act: the episode it belongs to, the step it made (``None``: the game was over before one), the
    actor's choice, the game's state after it and the memory tokens the actor was shown."""

    episode: _Episode
    step: _Step | None
    choice: ActorChoice | None
    after: GameState
    memory_tokens: int = 0


class GameLoop(Run):
    """Plays ``games`` with a frozen-LLM actor and a case-choosing policy (see the module docstring).

    - ``make_policy``: ``(policy config, PolicyContext) -> Policy`` (``memento.policies.make_policy``);
    - ``encoder``: ``encode(texts) -> [N, D]`` unit vectors and ``dim``;
    - ``planner``: the frozen LLM the :class:`~memento.planners.actor.CommandActor` asks (an ``HFPlanner``, an
      ``OpenAICompatPlanner``, any planner the actor's mode supports);
    - ``games``: the game files (``.z8``/``.ulx`` with their ``.json``; ``memento.envs.textworld.build_suite``);
    - ``out_dir``: the run directory; ``bank_dir``: a starting bank (copied; the original is not changed);
    - ``resume``: continue from ``out_dir``'s checkpoint (without one, start afresh).

    The run itself is :class:`~memento.runs.base.Run`'s; a unit is one command of the episode in progress:
    :meth:`_begin` starts the episode (the game reset, or replayed to a checkpoint; CFGM's focus point),
    :meth:`_act` chooses the cases and the command and plays it, :meth:`_commit` logs the step and, at the
    episode's end, learns from the episode, retains it and logs it. A checkpoint falls after a command that brought
    the step count to a multiple of ``checkpoint_every`` (mid-episode), and after an episode whose steps crossed
    one.
    """

    SPEC = RunSpec(name="game", config=GameLoopConfig, length="episodes", unit="episode", bar_unit="episode",
                   rate="won", stream=GAMES, components=GAME_COMPONENTS,
                   counters=("retained", "duplicates", "invalid", "unusable", "from_case", "decisions",
                             "memory_tokens"),
                   resumable=RESUMABLE_CHANGES, rngs=(("policy_rng", 1), ("actor_rng", 4)),
                   logs=(RunDir.STEPS, RunDir.EPISODES), checkpoint_kind=CHECKPOINT_KIND, final_checkpoint=True)

    def __init__(self, config: GameLoopConfig, *, make_policy: PolicyFactory, encoder: Any, planner: Any,
                 games: Sequence[str | Path], out_dir: str | Path, bank_dir: str | Path | None = None,
                 device: str | torch.device = "cpu", resume: bool = False, progress: bool = False):
        super().__init__(config, make_policy=make_policy, encoder=encoder, planner=planner, out_dir=out_dir,
                         bank_dir=bank_dir, device=device, resume=resume, progress=progress)
        self.games = [Path(g) for g in games]
        if not self.games:
            raise GameError("GameLoop: the game list is empty")
        for game in self.games:
            if not game.is_file():
                raise GameError(f"{game}: game file not found")
        self.actor = CommandActor(planner, config.actor)

    # ------------------------------------------------------------------ the skeleton's hooks

    def _stream(self) -> tuple[int, str]:
        return len(self.games), games_fingerprint(self.games)

    def _done(self) -> int:
        return self.episode_index

    def _reset(self) -> None:
        self.actor_rng = self.rngs["actor_rng"]
        self.episode_index = 0
        self.episode_log: list[dict[str, Any]] = []
        self._episode: _Episode | None = None  # the episode in progress (from a checkpoint, or begun)
        self._game: contextlib.ExitStack | None = None  # the episode's game, open from its start to its end

    def _build_policy(self, seeds: list[np.random.SeedSequence], bank: Bank, **context: Any) -> Policy:
        return super()._build_policy(seeds, bank, c_max=self.config.candidates, **context)

    def _open_env(self, game: int) -> TextWorldEnv:
        return TextWorldEnv(self.games[game], self.config.game)

    def _checkpoint_state(self) -> dict[str, Any]:
        """The episode count and, mid-episode, the episode so far (with the wall seconds spent on it)."""
        episode, progress = self._episode, None
        if episode is not None:
            progress = episode.to_json()
            progress["wall_s"] = episode.started + time.perf_counter() - self._t_start
        return {"kind": CHECKPOINT_KIND, "episode": self.episode_index, "in_progress": progress}

    def _checkpoint_due(self, unit: _Episode) -> bool:
        """Mid-episode: when the step count reached a multiple of ``checkpoint_every``; at an episode's end: when
        its steps crossed one (or the run is done)."""
        if self._episode is not None:
            every = self.config.checkpoint_every
            return bool(every and self.step % every == 0)
        return super()._checkpoint_due(unit)

    def _resumed(self, ckpt: Path, state: dict[str, Any]) -> None:
        self.episode_index = int(state["episode"])
        self.episode_log = [parse_json(line, where=f"{self.run_dir.episodes}:{number}")  # a CheckpointError
                            for number, line in enumerate(self.run_dir.episodes.read_bytes().splitlines(), start=1)
                            if line.strip()]
        if len(self.episode_log) != self.episode_index:
            raise CheckpointError(f"{ckpt}: episodes.jsonl holds {len(self.episode_log)} records for episode "
                                  f"{self.episode_index}")
        progress = state.get("in_progress")
        self._episode = None if progress is None else _Episode.from_json(progress)
        if self._episode is not None:
            logger.info("resumed %s %d steps into episode %d", self.config.arm, len(self._episode.steps),
                        self.episode_index)

    def _run_info(self) -> dict[str, Any]:
        return {**super()._run_info(), "kind": CHECKPOINT_KIND, "arm": self.config.arm,
                "games": [str(g) for g in self.games]}

    def _desc(self) -> str:
        return f"games {self.config.arm}"

    def _recent(self) -> deque[float]:
        window = self.config.window
        return deque((float(e["won"]) for e in self.episode_log[-window:]), maxlen=window)

    def _next_unit(self) -> _Episode:
        """The episode in progress (the one a checkpoint interrupted), else the next: the next game of the order,
        or (``systems.retries``) the failed game again."""
        if self._episode is None:
            self._episode = self._next_episode()
        return self._episode

    def _next_episode(self) -> _Episode:
        last = self.episode_log[-1] if self.episode_log else None
        if last is not None and last.get("retry") is not None:
            return _Episode(index=self.episode_index, game=int(last["game_index"]), start_step=self.step,
                            attempt=int(last["attempt"]) + 1, reflection=str(last["retry"]))
        cursor = sum(1 for e in self.episode_log if int(e.get("attempt", 0)) == 0)
        return _Episode(index=self.episode_index, game=int(self.order[cursor]), start_step=self.step)

    def _log_summary(self, summary: dict[str, Any]) -> None:
        logger.info("games %s: %d episodes, won %.3f, score %.3f, bank %d -> %d", self.config.arm,
                    summary["episodes"], summary["success_rate"], summary["mean_score"], summary["bank_size_start"],
                    summary["bank_size_end"])

    # ------------------------------------------------------------------ act: play one episode

    def _candidates(self, bank: Bank, state_D: np.ndarray) -> Candidates | None:
        """The top-C cases by cosine (of the game's own type with ``same_env``); ``None`` when there is none."""
        if not len(bank):
            return None
        env = self._env_name if self.config.same_env else None
        cands = self.systems.candidates(bank, state_D, self.config.candidates, env=env)
        return cands if len(cands) else None

    def _decide(self, bank: Bank, state_D: np.ndarray, ms: dict[str, float],
                episode: _Episode, first: bool) -> tuple[Candidates | None, Selection | None]:
        """The step's candidates and the policy's choice (per step, or the episode's one choice)."""
        cfg = self.config
        if not cfg.memory:
            return None, None
        if cfg.retrieval == "episode" and not first:
            return None, episode.selection
        with timed(ms, "candidates"):
            cands = self._candidates(bank, state_D)
        with timed(ms, "select"):
            sel = self.policy.select(state_D, cands, cfg.k, rng=self.policy_rng) if cands is not None and len(cands) \
                else None
        if cfg.retrieval == "episode":
            episode.selection = sel
        return cands, sel

    def _begin(self, bank: Bank, episode: _Episode) -> None:
        """At an episode's first command: open its game, reset it (or, resumed, replay its commands), CFGM's focus
        point before the environment's first episode, and (resumed) the step vectors and candidates."""
        if self._game is not None:
            return
        cfg = self.config
        self._ms = ms = dict.fromkeys(GAME_COMPONENTS, 0.0)
        self._t_start = time.perf_counter()
        self._game = contextlib.ExitStack()
        env = self._env = self._game.enter_context(self._open_env(episode.game))
        self._env_name = env.env
        with timed(ms, "env"):
            state = env.replay(episode.commands) if episode.steps else env.reset()
        if not episode.steps and cfg.learn:  # CFGM's focus point, before the environment's first episode
            with timed(ms, "retain"):
                self.systems.before_episode(bank, env.env, state.objective, state.admissible)
        if episode.steps:  # resumed mid-episode: the step vectors and candidates from the texts
            with timed(ms, "encode"):
                vectors_TD = self._encode([s.text for s in episode.steps])
            for t, (s, state_D) in enumerate(zip(episode.steps, vectors_TD)):
                s.state_D = state_D
                wanted = cfg.memory and len(bank) and (cfg.retrieval == "step" or t == 0)
                s.candidates = self._candidates(bank, state_D) if wanted else None
        self._version, self._alpha = self.policy.version, self.policy.alpha
        self._state = state

    def _close_game(self) -> None:
        if self._game is not None:
            game, self._game = self._game, None
            game.close()

    def _drive(self, bank: Bank) -> None:
        try:
            super()._drive(bank)
        finally:
            self._close_game()  # a run that failed mid-episode

    def _prompt(self, bank: Bank, text: str, episode: _Episode,
                sel: Selection | None) -> tuple[list[Case], list[str], int]:
        """The cases the actor is shown for the step's choice, the notes above its state (memory items, the
        reflection on a failed attempt, the correction of the previous step) and the memory tokens shown."""
        cases = [prompt_case(c) for c in bank.get(list(sel.ids))] if sel is not None else []
        cases = self.systems.prompt_cases(text, cases)
        shown, notes = split_notes(cases)
        if episode.reflection:
            notes.insert(0, f"Reflection: {episode.reflection}")
        if episode.steps and episode.steps[-1].correction:
            notes.append(f"Correction: {episode.steps[-1].correction}")
        return shown, notes, memory_tokens(cases)

    def _act(self, bank: Bank, episode: _Episode) -> _Commanded:
        """One command: encode -> candidates -> select -> the actor's command -> the game's reward and the state
        after it (the episode's steps grow in the commit)."""
        cfg, env, ms, state = self.config, self._env, self._ms, self._state
        if state.done:  # a game over before its first command
            return _Commanded(episode=episode, step=None, choice=None, after=state)
        text = state.text()
        with timed(ms, "encode"):
            state_D = self._encode([text])[0]
        cands, sel = self._decide(bank, state_D, ms, episode, first=not episode.steps)
        shown, notes, tokens = self._prompt(bank, text, episode, sel)
        key = _tried_key(state)
        with timed(ms, "act"):
            if cfg.plan and not episode.steps:  # the planner/executor split: one plan per episode
                episode.plan = self._plan(text, shown, f"{env.name}#{episode.index}")
            shown_text = "\n".join([*notes, *([f"Plan: {episode.plan}"] if episode.plan else []), text])
            choice = self.actor.act(shown_text, state.admissible, shown, rng=self.actor_rng,
                                    tried=episode.tried.get(key, ()), task_id=f"{env.name}#{episode.index}")
        with timed(ms, "env"):
            result = env.step(choice.command)
        episode.tried.setdefault(key, []).append(choice.command)
        step = _Step(text=text, selection=sel, command=choice.command, reward=float(result.reward),
                     invalid=bool(result.invalid), source=choice.source, state_D=state_D, candidates=cands)
        if cfg.systems.reflect and not result.state.done:
            with timed(ms, "act"):
                history = [(s.command, "") for s in episode.steps] + [(choice.command, result.state.observation)]
                step.correction = self.systems.reflect_step(state.objective, history, result.state.admissible,
                                                            score=float(result.state.score))
        return _Commanded(episode=episode, step=step, choice=choice, after=result.state, memory_tokens=tokens)

    def _plan(self, text: str, shown: list[Case], task_id: str) -> str:
        """The planner's plan of subgoals for the episode, from its first state and the chosen cases (one call)."""
        from memento.types import Task

        task = Task(id=task_id, question=f"{text}\nWrite the plan: the commands that reach the goal, in order.",
                    answers=("plan",))
        plan = self.planner.plan(task, shown)
        out = getattr(plan, "text", plan)
        return " ".join(str(out).split())[:300]


    def _log_step(self, episode: _Episode, game: str, env_name: str, step: _Step, choice: ActorChoice,
                  after: GameState, version: int, alpha: float | None, bank_size: int) -> None:
        record = StepRecord(
            step=self.step, task_id=f"{game}#{episode.index}", family=env_name, state=step.text,
            **selection_fields(step.selection), output=step.command, reward=step.reward, success=bool(after.won),
            reason=f"{choice.source}; score {after.score}/{after.max_score}"
                   + ("; not admissible" if step.invalid else ""),
            done=bool(after.done), retained_id=None, duplicate=False, policy=self.config.arm, policy_version=version,
            bank_size=bank_size, alpha=alpha, loss=None, time=time.time(), ms={})
        self.handles[self.run_dir.steps].write(json.dumps(record.to_json(), ensure_ascii=False) + "\n")
        if self.writer is not None:
            self.writer.add_scalar("step/reward", step.reward, self.step)
            self.writer.add_scalar("step/from_case", float(choice.source == "case"), self.step)

    # ------------------------------------------------------------------ commit: learn, retain, log

    def _commit(self, bank: Bank, commanded: _Commanded) -> None:
        """The command into the episode, its counts and its ``steps.jsonl`` record; at the episode's end,
        :meth:`_end_episode`."""
        episode, step, choice, ms = commanded.episode, commanded.step, commanded.choice, self._ms
        env = self._env
        if step is not None and choice is not None:
            episode.steps.append(step)
            self.counters["memory_tokens"] += commanded.memory_tokens
            self.counters["invalid"] += int(step.invalid)
            self.counters["unusable"] += int(choice.unusable)
            self.counters["from_case"] += int(choice.source == "case")
            with timed(ms, "log"):
                self._log_step(episode, env.name, env.env, step, choice, commanded.after, self._version,
                               self._alpha, len(bank))
            self.step += 1
        self._state = commanded.after
        if not commanded.after.done:
            self._write_ms(ms)
            ms.update(dict.fromkeys(ms, 0.0))
            return
        game, env_name = env.name, env.env
        self._close_game()
        self._end_episode(bank, episode, commanded.after, game, env_name)
        self._episode = None

    def _end_episode(self, bank: Bank, episode: _Episode, final: GameState, game: str, env_name: str) -> None:
        """The episode's end: observe -> usage -> retain (and the memory systems' builds) -> log."""
        cfg, ms = self.config, self._ms
        with timed(ms, "learn"):
            observations = self._observations(bank, episode, final, self._version, ms) if cfg.memory else []
            metrics = self.policy.observe(observations, learn=cfg.learn) if observations else {}
            self.counters["decisions"] += len(observations)
        with timed(ms, "retain"):
            bank_before = len(bank)
            if cfg.memory and cfg.learn:
                for obs in observations:  # the case features' usage statistics: the episode's outcome per showing
                    # logged at the episode's last step (< the next checkpoint's step, >= any checkpoint inside it)
                    bank.record_usage(self.step - 1, list(obs.selection.ids), float(final.normalized_score))
            trajectory_id = self._retain(bank, episode, final, game, env_name)
            retry = self._build(bank, episode, final, game, env_name, trajectory_id) if cfg.learn else None
        record = {"episode": episode.index, "game": game, "env": env_name, "won": bool(final.won),
                  "lost": bool(final.lost), "score": int(final.score), "max_score": int(final.max_score),
                  "normalized_score": float(final.normalized_score), "steps": len(episode.steps),
                  "return": float(sum(s.reward for s in episode.steps)),
                  "from_case": sum(s.source == "case" for s in episode.steps),
                  "invalid": sum(s.invalid for s in episode.steps), "bank_size": bank_before,
                  "loss": metrics.get("loss"), "updates": int(self.policy.version), "first_step": episode.start_step,
                  "wall_s": round(episode.started + time.perf_counter() - self._t_start, 4),
                  "commands": episode.commands, "game_index": episode.game, "attempt": episode.attempt,
                  "retry": retry}
        with timed(ms, "log"):
            self._log_episode(bank, record, final, metrics.get("loss"))
        self._write_ms(ms)
        self.episode_index += 1

    def _log_episode(self, bank: Bank, record: dict[str, Any], final: GameState, loss: float | None) -> None:
        handle = self.handles[self.run_dir.episodes]
        handle.write(json.dumps(record, ensure_ascii=False) + "\n")
        handle.flush()
        self.episode_log.append(record)
        self.recent.append(float(final.won))
        if self.writer is not None:
            e = record["episode"]
            self.writer.add_scalar("episode/won", float(final.won), e)
            self.writer.add_scalar("episode/score", float(final.normalized_score), e)
            self.writer.add_scalar("episode/steps", record["steps"], e)
            self.writer.add_scalar("episode/success_rate", float(np.mean(self.recent)), e)
            self.writer.add_scalar("bank_size", len(bank), e)
            if loss is not None:
                self.writer.add_scalar("learner/loss", loss, e)
            if self.policy.alpha is not None:
                self.writer.add_scalar("policy/alpha", self.policy.alpha, e)

    def _observations(self, bank: Bank, episode: _Episode, final: GameState, version: int,
                      ms: dict[str, float]) -> list[Observation]:
        """The episode's decisions as the policy learns from them (see the module docstring)."""
        cfg = self.config
        steps = episode.steps
        terminal = final.won or final.lost
        if cfg.retrieval == "episode":
            first = steps[0]
            if first.selection is None or first.candidates is None:
                return []
            return [Observation(state_D=first.state_D, candidates=first.candidates, selection=first.selection,
                                reward=float(final.normalized_score), step=episode.start_step,
                                policy_version=version)]
        next_D, next_cands = None, None
        if not terminal and cfg.memory:  # cut by the step limit: bootstrap from the final state
            with timed(ms, "encode"):
                next_D = self._encode([final.text()])[0]
            next_cands = self._candidates(bank, next_D)
        out = []
        for t, s in enumerate(steps):
            last = t == len(steps) - 1
            nxt_D, nxt_c = (next_D, next_cands) if last else (steps[t + 1].state_D, steps[t + 1].candidates)
            if s.selection is None or s.candidates is None:
                continue
            out.append(Observation(state_D=s.state_D, candidates=s.candidates, selection=s.selection,
                                   reward=s.reward, step=episode.start_step + t, policy_version=version,
                                   done=bool(last and terminal), next_state_D=nxt_D, next_candidates=nxt_c))
        return out

    def _retain(self, bank: Bank, episode: _Episode, final: GameState, game: str, env_name: str) -> str | None:
        """Add the episode's cases to the bank; returns the episode case's id when it is a new trajectory."""
        cfg = self.config
        if cfg.cases == "none" or not episode.steps:
            return None
        new_cases, vectors = [], []
        if cfg.cases in ("step", "both"):
            returns_T = discounted_returns([s.reward for s in episode.steps], cfg.case_gamma)
            for t, (s, ret) in enumerate(zip(episode.steps, returns_T)):
                if s.invalid:
                    continue
                # a case's reward lies in [0, 1] (memento.types.check_reward): a return's float sum may pass 1 by
                # an ulp (case_gamma = 1), a score that went down makes it negative
                reward = min(1.0, max(0.0, float(ret)))
                new_cases.append(Case(state=s.text, action=s.command, reward=reward, env=env_name,
                                      meta={"granularity": "step", "game": game, "episode": episode.index, "t": t,
                                            "policy": cfg.arm}))
                vectors.append(s.state_D)
        if cfg.cases in ("episode", "both"):
            trajectory = "\n".join(f"> {c}" for c in episode.commands)
            new_cases.append(Case(state=episode.steps[0].text, action=trajectory,
                                  reward=float(final.normalized_score), env=env_name,
                                  meta={"granularity": "episode", "game": game, "episode": episode.index,
                                        "steps": len(episode.steps), "won": bool(final.won), "policy": cfg.arm}))
            vectors.append(episode.steps[0].state_D)
        if not new_cases:
            return None
        before = len(bank)
        ids = bank.add(new_cases, np.stack(vectors), update_meta=False)  # a repeat keeps the stored case (resume)
        new_trajectory = cfg.cases in ("episode", "both") and ids[-1] not in self.systems.graph
        self.systems.added(new_cases, ids)
        self.counters["retained"] += len(bank) - before
        self.counters["duplicates"] += len(new_cases) - (len(bank) - before)
        return ids[-1] if new_trajectory else None


    def _build(self, bank: Bank, episode: _Episode, final: GameState, game: str, env_name: str,
               trajectory_id: str | None) -> str | None:
        """The memory systems' builds after an episode (``trajectory_id``: its episode case when new); returns the
        reflection for a retry of the game (or None)."""
        systems = self.systems
        systems.after_episode(bank, trajectory_id)
        retries = self.config.systems.retries
        if retries and not final.won and episode.attempt < retries and self.episode_index + 1 < self.config.episodes:
            history = list(final.history) or [(c, "") for c in episode.commands]
            return systems.retry_note(final.objective, history, final.admissible)
        systems.after_attempts(bank, game=game, env=env_name, task=final.objective)
        return None

    def _write_ms(self, ms: dict[str, float]) -> None:
        for name, seconds in ms.items():
            self.ms_totals[name] += seconds * 1000.0

    # ------------------------------------------------------------------ summary

    def _summary(self, bank: Bank) -> dict[str, Any]:
        cfg = self.config
        log = self.episode_log
        won_E = np.asarray([float(e["won"]) for e in log], dtype=np.float64)
        score_E = np.asarray([float(e["normalized_score"]) for e in log], dtype=np.float64)
        steps_E = np.asarray([float(e["steps"]) for e in log], dtype=np.float64)
        n_steps = int(steps_E.sum())
        episode_wall = [float(e["wall_s"]) for e in log]
        return {
            "kind": CHECKPOINT_KIND, "arm": cfg.arm, "episodes": len(log),
            "steps": n_steps, "success_rate": float(won_E.mean()) if log else 0.0,
            "mean_score": float(score_E.mean()) if log else 0.0,
            "mean_steps": float(steps_E.mean()) if log else 0.0,
            "success_by_window": success_by_window(won_E, cfg.window),
            "score_by_window": success_by_window(score_E, cfg.window), "by_env": _by_env(log),
            "from_case_share": float(self.counters["from_case"] / max(1, n_steps)),
            "invalid": int(self.counters["invalid"]), "unusable": int(self.counters["unusable"]),
            "decisions": int(self.counters["decisions"]), "ms_per_step": self._ms_per_step(n_steps),
            "s_per_episode": float(np.mean(episode_wall)) if episode_wall else 0.0,
            "retrieval": cfg.retrieval, "memory": cfg.memory, "learn": cfg.learn,
        }


def _by_env(log: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for env in sorted({e["env"] for e in log}):
        rows = [e for e in log if e["env"] == env]
        out[env] = {"episodes": len(rows), "success_rate": float(np.mean([e["won"] for e in rows])),
                    "mean_score": float(np.mean([e["normalized_score"] for e in rows])),
                    "mean_steps": float(np.mean([e["steps"] for e in rows]))}
    return out


def run_games(config: GameLoopConfig, **kwargs: Any) -> dict[str, Any]:
    """``GameLoop(config, **kwargs).run()``: play the episodes; returns the summary."""
    return GameLoop(config, **kwargs).run()

