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

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
import torch

from memento.config import (
    CFGMRetrievalConfig,
    LifeMemRetrievalConfig,
    LinUCBConfig,
    PlugMemRetrievalConfig,
    PolicyConfig,
    PolicyKind,
    RandomConfig,
    SimilarityConfig,
    SoftQConfig,
    check,
    check_choice,
    check_float,
    check_int,
    check_policy,
    to_dict,
)
from memento.envs.textworld import GameState, TextWorldConfig, TextWorldEnv
from memento.errors import CheckpointError, ConfigError, GameError
from memento.formats import StepRecord
from memento.io import atomic_write
from memento.learn.features import CaseFeaturizer
from memento.learn.policy import Observation, Policy, PolicyContext, PolicyFactory
from memento.memory import Candidates, CaseBank
from memento.memory.index import use_gpu_for
from memento.memory.uri import bank_name
from memento.planners.actor import ActorChoice, ActorConfig, CommandActor
from memento.runs.qa import encode_checked, restore_bank, run_bank, success_by_window, task_order, torch_seed
from memento.runs.rundir import CHECKPOINT_FORMAT, CHECKPOINT_FORMAT_VERSION, RunDir, check_saved_config, write_json
from memento.systems.items import memory_tokens
from memento.systems.runtime import MemorySystems, SystemsConfig, split_notes
from memento.types import Case, Selection

__all__ = [
    "GAME_COMPONENTS",
    "GameLoop",
    "GameLoopConfig",
    "game_policy",
    "games_fingerprint",
    "prompt_case",
    "run_games",
]

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


def game_policy(kind: PolicyKind, *, gamma: float = 0.0) -> PolicyConfig:
    """The game loop's default config of each policy: as :func:`memento.runs.qa.loop_policy` (similarity and soft-Q
    choose among the cases with a stored return > 0; soft-Q's Q-network is anchored on cosine similarity and
    sees the case features: the case's action embedding and stored return), with soft-Q's ``learner.gamma``
    set to ``gamma`` (0: cross-entropy on each step's own reward; > 0: soft TD with the target network)."""
    match kind:
        case "random":
            return RandomConfig()
        case "similarity":
            return SimilarityConfig(positive_only=True)
        case "soft_q":
            soft_q = SoftQConfig(positive_only=True)
            return dataclasses.replace(
                soft_q, qnet=dataclasses.replace(soft_q.qnet, anchor="cosine", features="case"),
                learner=dataclasses.replace(soft_q.learner, gamma=float(gamma)))
        case "linucb":
            return LinUCBConfig()
        case "cfgm":
            return CFGMRetrievalConfig()
        case "lifemem":
            return LifeMemRetrievalConfig()
        case "plugmem":
            return PlugMemRetrievalConfig()
    raise ConfigError(f"policy kind {kind!r}: must be one of {get_args(PolicyKind)}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class GameLoopConfig:
    """One run of the game loop (see the module docstring).

    - ``episodes``: games to play (drawn from the game list: a fresh permutation per pass with ``shuffle``,
      else the list order, cycled); ``k``: cases shown per decision; ``candidates``: C, the cosine
      pre-selection the policy chooses from;
    - ``policy``: :data:`memento.config.PolicyConfig` (:func:`game_policy` gives the defaults); a soft-Q config
      may have ``learner.gamma > 0`` here (soft TD on the game's transitions);
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
    """

    episodes: int = 24
    k: int = 2
    candidates: int = 16
    policy: PolicyConfig = dataclasses.field(default_factory=lambda: game_policy("soft_q"))
    memory: bool = True
    same_env: bool = True
    retrieval: Retrieval = "step"
    cases: Retained = "both"
    case_gamma: float = 0.9
    learn: bool = True
    plan: bool = False
    game: TextWorldConfig = dataclasses.field(default_factory=lambda: TextWorldConfig(
        max_steps=15, history=1, max_state_chars=700))
    actor: ActorConfig = dataclasses.field(default_factory=ActorConfig)
    systems: SystemsConfig = dataclasses.field(default_factory=SystemsConfig)
    seed: int = 0
    shuffle: bool = True
    index: str = "Flat"
    window: int = 8
    checkpoint_every: int = 50
    tensorboard: bool = True

    def __post_init__(self) -> None:
        cls = type(self)
        check_int(self, "episodes", 1)
        check_int(self, "k", 1)
        check_int(self, "candidates", 1)
        check(self.k <= self.candidates, cls, "k", self.k, f"must be <= candidates={self.candidates}")
        check_policy(self)
        for field in ("memory", "same_env", "learn", "plan", "shuffle", "tensorboard"):
            check(isinstance(getattr(self, field), bool), cls, field, getattr(self, field), "must be true or false")
        check_choice(self, "retrieval", Retrieval)
        check_choice(self, "cases", Retained)
        check_float(self, "case_gamma", low=0.0, high=1.0)
        check(isinstance(self.game, TextWorldConfig), cls, "game", self.game, "must be a TextWorldConfig")
        check(isinstance(self.actor, ActorConfig), cls, "actor", self.actor, "must be an ActorConfig")
        check(isinstance(self.systems, SystemsConfig), cls, "systems", self.systems, "must be a SystemsConfig")
        check_int(self, "seed", 0)
        check(isinstance(self.index, str) and bool(self.index.strip()), cls, "index", self.index,
              "must be a non-empty faiss factory string")
        check_int(self, "window", 1)
        check_int(self, "checkpoint_every", 0)
        if isinstance(self.policy, SoftQConfig) and self.policy.labels.active:
            check(False, cls, "policy", f"labels.m={self.policy.labels.m}",
                  "online labels score a question's answer; the game loop has none (use labels.m = 0)")
        if isinstance(self.policy, SoftQConfig) and self.policy.learner.gamma > 0 and self.retrieval == "episode":
            check(False, cls, "retrieval", self.retrieval, "a per-episode choice is one decision per episode "
                  "(single-step): soft_q needs learner.gamma = 0 with it")

    @property
    def policy_kind(self) -> str:
        return str(self.policy.kind)

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


def _entropy(p_C: np.ndarray) -> float:
    p = np.asarray(p_C, dtype=np.float64)
    p = p[p > 0]
    return float(-(p * np.log(p)).sum()) if p.size else 0.0


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


class GameLoop:
    """Plays ``games`` with a frozen-LLM actor and a case-choosing policy (see the module docstring).

    - ``make_policy``: ``(policy config, PolicyContext) -> Policy`` (``policies.make_policy``);
    - ``encoder``: ``encode(texts) -> [N, D]`` unit vectors and ``dim``;
    - ``planner``: the frozen LLM the :class:`~memento.planners.actor.CommandActor` asks (an ``HFPlanner``, an
      ``OpenAICompatPlanner``, any planner the actor's mode supports);
    - ``games``: the game files (``.z8``/``.ulx`` with their ``.json``; ``memento.envs.textworld.build_suite``);
    - ``out_dir``: the run directory; ``bank_dir``: a starting bank (copied; the original is not changed);
    - ``resume``: continue from ``out_dir``'s checkpoint (without one, start afresh).
    """

    def __init__(self, config: GameLoopConfig, *, make_policy: PolicyFactory, encoder: Any, planner: Any,
                 games: Sequence[str | Path], out_dir: str | Path, bank_dir: str | Path | None = None,
                 device: str | torch.device = "cpu", resume: bool = False, progress: bool = False):
        if not isinstance(config, GameLoopConfig):
            raise ConfigError(f"GameLoop: config={type(config).__name__}: must be a GameLoopConfig")
        if not callable(make_policy):
            raise ConfigError(f"GameLoop: make_policy={make_policy!r} is not callable (config, context) -> Policy")
        self.games = [Path(g) for g in games]
        if not self.games:
            raise GameError("GameLoop: the game list is empty")
        for game in self.games:
            if not game.is_file():
                raise GameError(f"{game}: game file not found")
        dim = getattr(encoder, "dim", None)
        if not callable(getattr(encoder, "encode", None)) or not isinstance(dim, int):
            raise ConfigError(f"GameLoop: encoder {encoder!r} needs encode(texts) and an integer dim")
        self.config = config
        self.make_policy = make_policy
        self.encoder = encoder
        self.planner = planner
        self.actor = CommandActor(planner, config.actor)
        self.run_dir = RunDir(out_dir)
        self.out_dir = self.run_dir.path
        self.bank_dir = None if bank_dir is None else bank_name(bank_dir)  # a directory or milvus:URI
        self.device = torch.device(device)
        self.resume = resume
        self.progress = progress
        self.dim = dim

    # ------------------------------------------------------------------ setup

    def _encode(self, texts: list[str]) -> np.ndarray:
        return encode_checked(self.encoder, self.dim, texts)

    def _make_bank(self) -> CaseBank:
        from memento.config import EncoderConfig

        encoder_config = getattr(self.encoder, "config", None)
        return run_bank(self.run_dir.bank, self.dim, bank_dir=self.bank_dir, index=self.config.index,
                        encoder_config=encoder_config if isinstance(encoder_config, EncoderConfig) else None,
                        device=self.device)

    def _build_policy(self, seeds: list[np.random.SeedSequence], bank: CaseBank) -> Policy:
        context = PolicyContext(dim=self.dim, k_max=self.config.k, device=self.device,
                                qnet_seed=torch_seed(seeds[2]), learner_seed=torch_seed(seeds[3]),
                                reward_of=bank.rewards, featurizer=CaseFeaturizer(bank, self._encode),
                                c_max=self.config.candidates)
        return self.make_policy(self.config.policy, context)

    def _env(self, game: int) -> TextWorldEnv:
        return TextWorldEnv(self.games[game], self.config.game)

    # ------------------------------------------------------------------ checkpoints

    def _checkpoint(self, bank: CaseBank, handles: tuple[Any, Any], episode: _Episode | None) -> None:
        cfg = self.config
        tmp = self.run_dir.begin_checkpoint()
        bank.flush()
        for handle, path in zip(handles, (self.run_dir.steps, self.run_dir.episodes)):
            handle.flush()
            os.fsync(handle.fileno())
            atomic_write(tmp / path.name, lambda dst, src=path: shutil.copyfile(src, dst))
        self.policy.checkpoint(tmp)
        write_json(tmp / RunDir.CONFIG, to_dict(cfg))
        state = {"format": CHECKPOINT_FORMAT, "format_version": CHECKPOINT_FORMAT_VERSION, "kind": CHECKPOINT_KIND,
                 "step": self.step, "episode": self.episode_index, "policy": cfg.policy_kind,
                 "bank_size": len(bank), "bank_uid": bank.uid, "bank_size_start": self.bank_size_start,
                 "counters": dict(self.counters), "ms_totals": dict(self.ms_totals),
                 "policy_rng": self.policy_rng.bit_generator.state, "actor_rng": self.actor_rng.bit_generator.state,
                 "games_fingerprint": self.fingerprint, "n_games": len(self.games),
                 "in_progress": None if episode is None else episode.to_json(), "time": time.time()}
        write_json(tmp / RunDir.STATE, state)  # last: its presence marks the checkpoint complete
        final = self.run_dir.commit_checkpoint(tmp)
        logger.info("checkpoint at step %d, episode %d (%d cases in the bank) in %s", self.step, self.episode_index,
                    len(bank), final)

    def _restore(self, ckpt: Path, bank: CaseBank) -> _Episode | None:
        cfg = self.config
        state = RunDir.read_state(ckpt)
        if state.get("kind") != CHECKPOINT_KIND:
            raise CheckpointError(f"{ckpt}: a question-answering run's checkpoint, not a game run's")
        check_saved_config(ckpt, GameLoopConfig, cfg, RESUMABLE_CHANGES)
        if state["games_fingerprint"] != self.fingerprint:
            raise CheckpointError(f"{ckpt}: saved for other games ({state['n_games']} games, fingerprint "
                                  f"{state['games_fingerprint'][:12]}); now {len(self.games)} games, fingerprint "
                                  f"{self.fingerprint[:12]}")
        episode_index = int(state["episode"])
        if episode_index > cfg.episodes:
            raise CheckpointError(f"{ckpt}: the checkpoint is at episode {episode_index}, beyond episodes="
                                  f"{cfg.episodes}")
        restore_bank(ckpt, state, bank)
        self.step = int(state["step"])
        self.episode_index = episode_index
        self.bank_size_start = int(state["bank_size_start"])
        self.counters.update(state["counters"])
        self.ms_totals.update({k: float(v) for k, v in state["ms_totals"].items()})
        self.policy_rng.bit_generator.state = state["policy_rng"]
        self.actor_rng.bit_generator.state = state["actor_rng"]
        self.policy.restore(ckpt)
        for path in (self.run_dir.steps, self.run_dir.episodes):
            atomic_write(path, lambda dst, src=ckpt / path.name: shutil.copyfile(src, dst))
        self.episode_log = [json.loads(line) for line in self.run_dir.episodes.read_text("utf-8").splitlines()
                            if line.strip()]
        if len(self.episode_log) != episode_index:
            raise CheckpointError(f"{ckpt}: episodes.jsonl holds {len(self.episode_log)} records for episode "
                                  f"{episode_index}")
        self.run_dir.adopt_checkpoint(ckpt)
        progress = state.get("in_progress")
        episode = None if progress is None else _Episode.from_json(progress)
        logger.info("resumed %s at step %d, episode %d of %d%s", cfg.arm, self.step, episode_index, cfg.episodes,
                    "" if episode is None else f" ({len(episode.steps)} steps into it)")
        return episode

    # ------------------------------------------------------------------ the run

    def run(self) -> dict[str, Any]:
        """Play (or finish) the episodes; returns the summary (also written to ``out_dir/summary.json``)."""
        cfg = self.config
        started = time.perf_counter()
        self.fingerprint = games_fingerprint(self.games)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        ckpt = self.run_dir.start(self.resume)
        seeds = np.random.SeedSequence(cfg.seed).spawn(5)
        self.order = task_order(len(self.games), cfg.episodes, seeds[0], shuffle=cfg.shuffle)
        self.policy_rng = np.random.Generator(np.random.PCG64(seeds[1]))
        self.actor_rng = np.random.Generator(np.random.PCG64(seeds[4]))
        self.step = 0
        self.episode_index = 0
        self.counters: dict[str, Any] = {"retained": 0, "duplicates": 0, "invalid": 0, "unusable": 0,
                                         "from_case": 0, "decisions": 0, "memory_tokens": 0}
        self.ms_totals: dict[str, float] = {c: 0.0 for c in GAME_COMPONENTS}
        self.episode_log: list[dict[str, Any]] = []
        if ckpt is None:
            bank = self._make_bank()
        else:
            bank = CaseBank.open(self.run_dir.bank, dim=self.dim, use_gpu=use_gpu_for(self.device))
        try:
            self.systems = MemorySystems(cfg.systems, planner=self.planner, encode=self._encode,
                                         cache_path=self.out_dir / "memory_calls.jsonl")
            self.policy = self._build_policy(seeds, bank)
            in_progress = None
            if ckpt is None:
                self.bank_size_start = len(bank)
                write_json(self.run_dir.config_path, to_dict(cfg))
                self.run_dir.steps.write_bytes(b"")
                self.run_dir.episodes.write_bytes(b"")
            else:
                in_progress = self._restore(ckpt, bank)
            self.systems.open(bank)
            self._write_run_info()
            return self._loop(bank, in_progress, started, resumed_from=None if ckpt is None else self.step)
        finally:
            bank.close()

    def _write_run_info(self) -> None:
        describe = getattr(self.encoder, "describe", None)
        info = {"kind": CHECKPOINT_KIND, "arm": self.config.arm, "policy": self.config.policy_kind,
                "device": str(self.device), "encoder": describe() if callable(describe) else repr(self.encoder),
                "planner": repr(self.planner), "games": [str(g) for g in self.games],
                "games_fingerprint": self.fingerprint,
                "seed_bank": None if self.bank_dir is None else str(self.bank_dir),
                "torch": torch.__version__, "numpy": np.__version__}
        write_json(self.run_dir.run_info_path, info)

    def _loop(self, bank: CaseBank, in_progress: _Episode | None, started: float,
              resumed_from: int | None) -> dict[str, Any]:
        cfg = self.config
        self.writer = None
        if cfg.tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise ConfigError("GameLoopConfig.tensorboard=True needs TensorBoard: pip install "
                                  "'memento-mdp[train]' (or set \"tensorboard\": false)") from None
            self.writer = SummaryWriter(str(self.run_dir.tensorboard),
                                        purge_step=self.step if resumed_from is not None else None)
            if resumed_from is None:
                self.writer.add_text("config", "```\n" + json.dumps(to_dict(cfg), indent=2) + "\n```", 0)
        from tqdm.auto import tqdm

        self.recent: deque[float] = deque((float(e["won"]) for e in self.episode_log[-cfg.window:]),
                                          maxlen=cfg.window)
        bar = tqdm(total=cfg.episodes, initial=self.episode_index, desc=f"games {cfg.arm}", unit="episode",
                   disable=not self.progress, dynamic_ncols=True)
        try:
            with self.run_dir.steps.open("a", encoding="utf-8") as steps_handle, \
                    self.run_dir.episodes.open("a", encoding="utf-8") as episodes_handle:
                handles = (steps_handle, episodes_handle)
                while self.episode_index < cfg.episodes:
                    episode = in_progress or self._next_episode()
                    in_progress = None
                    self._play(bank, episode, handles)
                    bar.update(1)
                    bar.set_postfix(won=f"{np.mean(self.recent):.2f}", bank=len(bank))
                if self.episode_index == cfg.episodes and not self._checkpointed_at_end:
                    self._timed_checkpoint(bank, handles, None)
        finally:
            bar.close()
            if self.writer is not None:
                self.writer.close()
        has_model = self.policy.save_model(self.run_dir.selector)
        summary = self._summary(bank, time.perf_counter() - started, resumed_from, has_model)
        write_json(self.run_dir.summary_path, summary)
        logger.info("games %s: %d episodes, won %.3f, score %.3f, bank %d -> %d", cfg.arm, summary["episodes"],
                    summary["success_rate"], summary["mean_score"], summary["bank_size_start"],
                    summary["bank_size_end"])
        return summary

    _checkpointed_at_end = False

    def _next_episode(self) -> _Episode:
        """The next episode: the next game of the order, or (``systems.retries``) the failed game again."""
        last = self.episode_log[-1] if self.episode_log else None
        if last is not None and last.get("retry") is not None:
            return _Episode(index=self.episode_index, game=int(last["game_index"]), start_step=self.step,
                            attempt=int(last["attempt"]) + 1, reflection=str(last["retry"]))
        cursor = sum(1 for e in self.episode_log if int(e.get("attempt", 0)) == 0)
        return _Episode(index=self.episode_index, game=int(self.order[cursor]), start_step=self.step)

    def _timed_checkpoint(self, bank: CaseBank, handles: tuple[Any, Any], episode: _Episode | None) -> None:
        t0 = time.perf_counter()
        self._checkpoint(bank, handles, episode)
        self.ms_totals["checkpoint"] += (time.perf_counter() - t0) * 1000.0
        self._checkpointed_at_end = episode is None and self.episode_index == self.config.episodes

    # ------------------------------------------------------------------ one episode

    def _candidates(self, bank: CaseBank, state_D: np.ndarray) -> Candidates | None:
        """The top-C cases by cosine (of the game's own type with ``same_env``); ``None`` when there is none."""
        if not len(bank):
            return None
        env = self._env_name if self.config.same_env else None
        if self.config.systems.active:
            cands = self.systems.candidates(bank, state_D, self.config.candidates, env=env)
        else:
            cands = bank.candidates(state_D, self.config.candidates, env=env)
        return cands if len(cands) else None

    def _decide(self, bank: CaseBank, state_D: np.ndarray, ms: dict[str, float],
                episode: _Episode, first: bool) -> tuple[Candidates | None, Selection | None]:
        """The step's candidates and the policy's choice (per step, or the episode's one choice)."""
        cfg = self.config
        if not cfg.memory:
            return None, None
        if cfg.retrieval == "episode" and not first:
            return None, episode.selection
        t0 = time.perf_counter()
        cands = self._candidates(bank, state_D)
        ms["candidates"] += time.perf_counter() - t0
        t0 = time.perf_counter()
        sel = self.policy.select(state_D, cands, cfg.k, rng=self.policy_rng) if cands is not None and len(cands) \
            else None
        ms["select"] += time.perf_counter() - t0
        if cfg.retrieval == "episode":
            episode.selection = sel
        return cands, sel

    def _play(self, bank: CaseBank, episode: _Episode, handles: tuple[Any, Any]) -> None:
        cfg = self.config
        clock = time.perf_counter
        ms = {c: 0.0 for c in GAME_COMPONENTS}
        t_start = clock()
        with self._env(episode.game) as env:
            self._env_name = env.env
            t0 = clock()
            state = env.replay(episode.commands) if episode.steps else env.reset()
            ms["env"] += clock() - t0
            if not episode.steps and cfg.learn:  # CFGM's focus point, before the environment's first episode
                t0 = clock()
                self.systems.before_episode(bank, env.env, state.objective, state.admissible)
                ms["retain"] += clock() - t0
            if episode.steps:  # resumed mid-episode: the step vectors and candidates from the texts
                t0 = clock()
                vectors_TD = self._encode([s.text for s in episode.steps])
                ms["encode"] += clock() - t0
                for t, (s, state_D) in enumerate(zip(episode.steps, vectors_TD)):
                    s.state_D = state_D
                    wanted = cfg.memory and len(bank) and (cfg.retrieval == "step" or t == 0)
                    s.candidates = self._candidates(bank, state_D) if wanted else None
            version, alpha = self.policy.version, self.policy.alpha
            while not state.done:
                text = state.text()
                t0 = clock()
                state_D = self._encode([text])[0]
                ms["encode"] += clock() - t0
                cands, sel = self._decide(bank, state_D, ms, episode, first=not episode.steps)
                cases = [prompt_case(c) for c in bank.get(list(sel.ids))] if sel is not None else []
                if cases and cfg.systems.active:
                    cases = self.systems.prompt_cases(text, cases)
                self.counters["memory_tokens"] += memory_tokens(cases)
                shown, notes = split_notes(cases)
                if episode.reflection:
                    notes.insert(0, f"Reflection: {episode.reflection}")
                if episode.steps and episode.steps[-1].correction:
                    notes.append(f"Correction: {episode.steps[-1].correction}")
                key = _tried_key(state)
                t0 = clock()
                if cfg.plan and not episode.steps:  # the planner/executor split: one plan per episode
                    episode.plan = self._plan(text, shown, f"{env.name}#{episode.index}")
                shown_text = text if not episode.plan else f"Plan: {episode.plan}\n{text}"
                if notes:
                    shown_text = "\n".join(notes) + "\n" + shown_text
                choice = self.actor.act(shown_text, state.admissible, shown, rng=self.actor_rng,
                                        tried=episode.tried.get(key, ()), task_id=f"{env.name}#{episode.index}")
                ms["act"] += clock() - t0
                t0 = clock()
                result = env.step(choice.command)
                ms["env"] += clock() - t0
                episode.tried.setdefault(key, []).append(choice.command)
                step = _Step(text=text, selection=sel, command=choice.command, reward=float(result.reward),
                             invalid=bool(result.invalid), source=choice.source, state_D=state_D, candidates=cands)
                if cfg.systems.reflect and not result.state.done:
                    t0 = clock()
                    history = [(s.command, "") for s in episode.steps] + [(choice.command,
                                                                           result.state.observation)]
                    step.correction = self.systems.reflect_step(state.objective, history,
                                                                result.state.admissible,
                                                                score=float(result.state.score))
                    ms["act"] += clock() - t0
                episode.steps.append(step)
                self.counters["invalid"] += int(result.invalid)
                self.counters["unusable"] += int(choice.unusable)
                self.counters["from_case"] += int(choice.source == "case")
                t0 = clock()
                self._log_step(handles[0], episode, env.name, env.env, step, choice, result.state, version, alpha,
                               len(bank))
                ms["log"] += clock() - t0
                self.step += 1
                state = result.state
                every = cfg.checkpoint_every
                if every and self.step % every == 0 and not state.done:
                    self._write_ms(ms)
                    ms = {c: 0.0 for c in GAME_COMPONENTS}
                    episode.started += clock() - t_start
                    t_start = clock()
                    self._timed_checkpoint(bank, handles, episode)
            final = state
        self._finish(bank, episode, final, env.name, env.env, ms, handles, version, t_start)

    def _plan(self, text: str, shown: list[Case], task_id: str) -> str:
        """The planner's plan of subgoals for the episode, from its first state and the chosen cases (one call)."""
        from memento.types import Task

        task = Task(id=task_id, question=f"{text}\nWrite the plan: the commands that reach the goal, in order.",
                    answers=("plan",))
        plan = self.planner.plan(task, shown)
        out = getattr(plan, "text", plan)
        return " ".join(str(out).split())[:300]

    def _log_step(self, handle: Any, episode: _Episode, game: str, env_name: str, step: _Step, choice: ActorChoice,
                  after: GameState, version: int, alpha: float | None, bank_size: int) -> None:
        sel = step.selection
        record = StepRecord(
            step=self.step, task_id=f"{game}#{episode.index}", family=env_name, state=step.text,
            candidate_ids=[] if sel is None else list(sel.candidate_ids),
            chosen_ids=[] if sel is None else list(sel.ids),
            propensities=[] if sel is None else [float(p) for p in sel.probs_K],
            set_propensity=None if sel is None else float(sel.set_prob),
            greedy=None if sel is None else bool(sel.greedy), output=step.command, reward=step.reward,
            success=bool(after.won), reason=f"{choice.source}; score {after.score}/{after.max_score}"
                                             + ("; not admissible" if step.invalid else ""),
            done=bool(after.done), retained_id=None, duplicate=False, policy=self.config.arm, policy_version=version,
            bank_size=bank_size, entropy=0.0 if sel is None else _entropy(sel.probs_C), alpha=alpha, loss=None,
            time=time.time(), ms={}, candidate_probs=None if sel is None else [float(p) for p in sel.probs_C])
        handle.write(json.dumps(record.to_json(), ensure_ascii=False) + "\n")
        if self.writer is not None:
            self.writer.add_scalar("step/reward", step.reward, self.step)
            self.writer.add_scalar("step/from_case", float(choice.source == "case"), self.step)

    def _observations(self, bank: CaseBank, episode: _Episode, final: GameState, version: int,
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
            t0 = time.perf_counter()
            next_D = self._encode([final.text()])[0]
            ms["encode"] += time.perf_counter() - t0
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

    def _retain(self, bank: CaseBank, episode: _Episode, final: GameState, game: str, env_name: str) -> str | None:
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
                new_cases.append(Case(state=s.text, action=s.command, reward=float(ret), env=env_name,
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
        ids = bank.add(new_cases, np.stack(vectors))
        new_trajectory = cfg.cases in ("episode", "both") and ids[-1] not in self.systems.graph
        self.systems.added(new_cases, ids)
        self.counters["retained"] += len(bank) - before
        self.counters["duplicates"] += len(new_cases) - (len(bank) - before)
        return ids[-1] if new_trajectory else None

    def _finish(self, bank: CaseBank, episode: _Episode, final: GameState, game: str, env_name: str,
                ms: dict[str, float], handles: tuple[Any, Any], version: int, t_start: float) -> None:
        cfg = self.config
        clock = time.perf_counter
        t0 = clock()
        observations = self._observations(bank, episode, final, version, ms) if cfg.memory else []
        metrics = self.policy.observe(observations, learn=cfg.learn) if observations else {}
        self.counters["decisions"] += len(observations)
        ms["learn"] += clock() - t0
        t0 = clock()
        bank_before = len(bank)
        if cfg.memory and cfg.learn:
            for obs in observations:  # the case features' usage statistics: the episode's outcome per showing
                # logged at the episode's last step (< the next checkpoint's step, >= any checkpoint inside it)
                bank.record_usage(self.step - 1, list(obs.selection.ids), float(final.normalized_score))
        trajectory_id = self._retain(bank, episode, final, game, env_name)
        retry = self._build(bank, episode, final, game, env_name, trajectory_id) if cfg.learn else None
        ms["retain"] += clock() - t0
        record = {"episode": episode.index, "game": game, "env": env_name, "won": bool(final.won),
                  "lost": bool(final.lost), "score": int(final.score), "max_score": int(final.max_score),
                  "normalized_score": float(final.normalized_score), "steps": len(episode.steps),
                  "return": float(sum(s.reward for s in episode.steps)),
                  "from_case": sum(s.source == "case" for s in episode.steps),
                  "invalid": sum(s.invalid for s in episode.steps), "bank_size": bank_before,
                  "loss": metrics.get("loss"), "updates": int(self.policy.version), "first_step": episode.start_step,
                  "wall_s": round(episode.started + clock() - t_start, 4), "commands": episode.commands,
                  "game_index": episode.game, "attempt": episode.attempt, "retry": retry}
        t0 = clock()
        handles[1].write(json.dumps(record, ensure_ascii=False) + "\n")
        handles[1].flush()
        self.episode_log.append(record)
        self.recent.append(float(final.won))
        if self.writer is not None:
            e = episode.index
            self.writer.add_scalar("episode/won", float(final.won), e)
            self.writer.add_scalar("episode/score", float(final.normalized_score), e)
            self.writer.add_scalar("episode/steps", len(episode.steps), e)
            self.writer.add_scalar("episode/success_rate", float(np.mean(self.recent)), e)
            self.writer.add_scalar("bank_size", len(bank), e)
            if metrics.get("loss") is not None:
                self.writer.add_scalar("learner/loss", metrics["loss"], e)
            if self.policy.alpha is not None:
                self.writer.add_scalar("policy/alpha", self.policy.alpha, e)
        ms["log"] += clock() - t0
        self._write_ms(ms)
        self.episode_index += 1
        every = cfg.checkpoint_every
        crossed = every and self.step // every > episode.start_step // every
        if self.episode_index == cfg.episodes or crossed:
            self._timed_checkpoint(bank, handles, None)

    def _build(self, bank: CaseBank, episode: _Episode, final: GameState, game: str, env_name: str,
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

    def _summary(self, bank: CaseBank, wall_s: float, resumed_from: int | None, has_model: bool) -> dict[str, Any]:
        cfg = self.config
        log = self.episode_log
        won_E = np.asarray([float(e["won"]) for e in log], dtype=np.float64)
        score_E = np.asarray([float(e["normalized_score"]) for e in log], dtype=np.float64)
        steps_E = np.asarray([float(e["steps"]) for e in log], dtype=np.float64)
        n_steps = int(steps_E.sum())
        ms = {name: self.ms_totals[name] / max(1, n_steps) for name in GAME_COMPONENTS}
        ms["total"] = sum(ms.values())
        episode_wall = [float(e["wall_s"]) for e in log]
        return {
            "kind": CHECKPOINT_KIND, "arm": cfg.arm, "policy": cfg.policy_kind, "episodes": len(log),
            "steps": n_steps, "success_rate": float(won_E.mean()) if log else 0.0,
            "mean_score": float(score_E.mean()) if log else 0.0,
            "mean_steps": float(steps_E.mean()) if log else 0.0,
            "success_by_window": success_by_window(won_E, cfg.window),
            "score_by_window": success_by_window(score_E, cfg.window), "window": cfg.window,
            "by_env": _by_env(log),
            "from_case_share": float(self.counters["from_case"] / max(1, n_steps)),
            "memory_tokens": int(self.counters.get("memory_tokens", 0)),
            "invalid": int(self.counters["invalid"]), "unusable": int(self.counters["unusable"]),
            "bank_size_start": int(self.bank_size_start), "bank_size_end": len(bank),
            "retained": int(self.counters["retained"]), "duplicates": int(self.counters["duplicates"]),
            "decisions": int(self.counters["decisions"]), "updates": int(self.policy.version),
            "final_alpha": self.policy.alpha, "ms_per_step": ms,
            "s_per_episode": float(np.mean(episode_wall)) if episode_wall else 0.0,
            "seed": cfg.seed, "k": cfg.k, "candidates": cfg.candidates, "retrieval": cfg.retrieval,
            "memory": cfg.memory, "learn": cfg.learn, "resumed_from": resumed_from, "wall_s": wall_s,
            "selector": RunDir.SELECTOR if has_model else None,
            **({"systems": self.systems.stats()} if cfg.systems.active else {}),
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

