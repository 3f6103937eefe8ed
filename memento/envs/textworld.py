"""TextWorld text games as a multi-step environment: generated games, a bounded state text, suites with splits.

One **episode** is one play of one generated game::

    TextWorldEnv(game.z8).reset()        GameState: objective, observation, inventory, admissible commands
      -> state.text()                    the bounded text the encoder and the planner read
      -> env.step(command)               StepResult: next GameState, reward, done, invalid
      ... until state.done               won, lost, or ``max_steps`` commands taken

**The state.** :class:`GameState` holds the cleaned game text (the ASCII-art banner, the ``>`` prompt, the
status line and the end-of-game menu are stripped, whitespace is collapsed, every piece is bounded by
``max_observation_chars``), the admissible commands the agent may take (sorted; commands whose first word is
in ``hide_commands`` -- look, inventory, examine -- are removed: they never change the game state and random
agents waste steps on them; they are not admissible for the agent either), the last ``history`` (command,
observation) pairs, the score and the flags. :meth:`GameState.text` lays it out as
``Goal: ...\\nCarrying: ...\\nBefore: > cmd: obs | ...\\nNow: <observation>`` within ``max_state_chars``:
the observation is kept whole (it is what the next command answers to), the objective, the inventory and the
history are shortened to fit, in that order of precedence.

**Rewards.** ``reward = (score_after - score_before) / max_score``: the rewards of an episode sum to its
normalised final score, and each lies in [0, 1] (generated games never lose points). There is no step cost:
a discount ``gamma < 1`` already prefers short wins, and rewards in [0, 1] suit the BCE learner. A command
that is not admissible raises :class:`~memento.errors.GameError` (``not_admissible="error"``) or, under
``"penalty"``, is not sent to the game: the step counts, the reward is 0, ``StepResult.invalid`` is true.

**Resuming.** Games are deterministic, so :meth:`TextWorldEnv.replay` (reset, then the commands in order)
rebuilds the exact state of an episode from its command log: that is how a run resumes mid-episode.

**Generation.** :func:`make_game` builds one game from a :class:`GameSpec` (a game type, a level, a seed) with
TextWorld's own generators -- ``textworld.generator.make_game`` for ``custom``, the registered challenges
(``tw-coin_collector``, ``tw-treasure_hunter``, ``tw-simple``, ``tw-cooking``) otherwise, the same calls
``tw-make`` makes -- in a child process started with ``PYTHONHASHSEED=0``: TextWorld iterates over sets of
strings while generating (cooking's fail events, the grammar's excluded names), so only a fixed hash seed
makes the files byte-identical from run to run; the child also keeps the Inform 7 compiler and TextWorld's
import cost out of the calling process. Games are written into a temporary directory beside their place and
renamed into it (``NAME.json``, ``NAME.spec.json``, then ``NAME.z8`` last, so a present ``.z8`` means a
complete game); an existing game is reused.

**Suites.** :data:`SUITES` are deterministic game sets with ``train``, ``test`` (new games of the same kinds)
and ``ood`` (larger levels or held-out kinds) splits, seeds disjoint between splits; the table of their specs
(:data:`SUITE_TABLE`) is plain data near the top of this module. :func:`build_suite` generates what is
missing into ``<cache>/games/<suite>/`` and writes ``card.json`` and ``CARD.md`` there (the TextWorld version,
every spec with its split and its ``tw-make`` command line, the licence).

**Robustness.** A missing game, a missing companion ``.json`` (TextWorld's admissible commands come from it),
or a truncated or garbage ``.z8`` is a one-line :class:`~memento.errors.GameError` naming the file: the
Z-machine header (version, length, checksum) is verified before the interpreter sees the file, because the
interpreter exits the whole process on a story it cannot read.

TextWorld (PyPI ``textworld``, MIT licence, Microsoft) is an optional dependency (``memento-mdp[games]``); it
is imported inside the functions that need it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from memento.config import MAX_GAME_STEPS, MAX_TOKENS, check, check_choice, check_int, check_ints
from memento.errors import ConfigError, DataFormatError, GameError
from memento.extras import install_hint
from memento.io import atomic_write_text, load_json_file, write_json

__all__ = [
    "SUITES",
    "SUITE_TABLE",
    "GameSpec",
    "GameState",
    "GameSuite",
    "GameType",
    "NotAdmissible",
    "StepResult",
    "TextWorldConfig",
    "TextWorldEnv",
    "build_suite",
    "game_file",
    "make_game",
    "suite_env_name",
]

logger = logging.getLogger(__name__)

GameType = Literal["custom", "coin", "treasure", "simple", "cooking"]
NotAdmissible = Literal["error", "penalty"]

#: The suites: name -> (description, split -> ((game_type, level, seed), ...)). ``custom`` games use the
#: GameSpec defaults for world_size and nb_objects. Seeds are disjoint between the splits of a suite.
SUITE_TABLE: dict[str, tuple[str, dict[str, tuple[tuple[GameType, int, int], ...]]]] = {
    "tw-tiny": (
        "Tiny custom games for tests: 2 rooms, 3 objects, quests of 2 commands (ood: 3 commands).",
        {
            "train": (("custom", 2, 1), ("custom", 2, 2), ("custom", 2, 3)),
            "test": (("custom", 2, 11), ("custom", 2, 12)),
            "ood": (("custom", 3, 21),),
        },
    ),
    "tw-small": (
        "Coin collector (levels 4-7) and treasure hunter (levels 2-4) games, where an agent that samples its "
        "commands wins some but not all (a uniform random agent wins 30-40% of coin level 5-8 and treasure level 3 "
        "in 20 steps); ood: longer games of both kinds (coin levels 9-12, treasure levels 6-8).",
        {
            "train": (("coin", 4, 101), ("coin", 5, 102), ("coin", 6, 103), ("coin", 7, 104), ("coin", 5, 105),
                      ("coin", 6, 106),
                      ("treasure", 2, 111), ("treasure", 3, 112), ("treasure", 4, 113), ("treasure", 3, 114),
                      ("treasure", 4, 115), ("treasure", 2, 116)),
            "test": (("coin", 4, 201), ("coin", 5, 202), ("coin", 6, 203), ("coin", 7, 204),
                     ("treasure", 2, 211), ("treasure", 3, 212), ("treasure", 4, 213), ("treasure", 3, 214)),
            "ood": (("coin", 9, 301), ("coin", 10, 302), ("coin", 12, 303),
                    ("treasure", 6, 311), ("treasure", 7, 312), ("treasure", 8, 313)),
        },
    ),
    "tw-stream": (
        "A stream of three environments for lifelong evaluation (memento bench stream): coin collector (levels "
        "4-6), treasure hunter (levels 2-4) and custom quests of 3 commands in 2 rooms; train 3 and test 2 games "
        "of each.",
        {
            "train": (("coin", 4, 401), ("coin", 5, 402), ("coin", 6, 403),
                      ("treasure", 2, 411), ("treasure", 3, 412), ("treasure", 4, 413),
                      ("custom", 3, 421), ("custom", 3, 422), ("custom", 3, 423)),
            "test": (("coin", 5, 501), ("coin", 6, 502), ("treasure", 3, 511), ("treasure", 4, 512),
                     ("custom", 3, 521), ("custom", 3, 522)),
        },
    ),
}

_CHALLENGE = {"coin": "tw-coin_collector", "treasure": "tw-treasure_hunter", "simple": "tw-simple",
              "cooking": "tw-cooking"}
_SIMPLE_REWARDS = {1: "dense", 2: "balanced", 3: "sparse"}
_LEVELS = {"coin": (1, 300), "treasure": (1, 30), "simple": (1, 3), "cooking": (1, 5), "custom": (1, 20)}
_SEED_LIMIT = 2**32
_GENERATE_TIMEOUT_S = 300.0  # per game
_INSTALL_HINT = f"TextWorld games need the textworld package: {install_hint('games')}"
_DONE_MARK = "@@memento-game-done"


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def _import_textworld() -> Any:
    try:
        import textworld
    except ImportError as error:
        raise GameError(_INSTALL_HINT) from error
    return textworld


@dataclasses.dataclass(frozen=True, kw_only=True)
class GameSpec:
    """One game to generate.

    ``level``: coin/treasure: the challenge level; simple: 1, 2, 3 = rewards dense, balanced, sparse (goal
    detailed); cooking: the recipe size (ingredients, all to be found, one room, containers to open); custom:
    the quest length. ``world_size`` (rooms) and ``nb_objects`` apply to ``custom`` only and must keep their
    defaults for the other types (so that :attr:`name` is unique per spec).
    """

    game_type: GameType
    level: int = 1
    seed: int = 0
    world_size: int = 2
    nb_objects: int = 3

    def __post_init__(self) -> None:
        check_choice(self, "game_type", GameType)
        low, high = _LEVELS[self.game_type]
        check(isinstance(self.level, int) and not isinstance(self.level, bool) and low <= self.level <= high,
              type(self), "level", self.level, f"must be an integer in [{low}, {high}] for {self.game_type} games")
        if self.game_type == "coin":  # TextWorld 1.7 compiles at most 100 rooms
            rooms = ((self.level - 1) // 100 + 1) * ((self.level - 1) % 100 + 1)
            check(rooms <= 100, type(self), "level", self.level, f"makes {rooms} rooms (TextWorld 1.7: at most 100)")
        check_int(self, "seed", 0)
        check(self.seed < _SEED_LIMIT, type(self), "seed", self.seed, f"must be < {_SEED_LIMIT}")
        check_ints(self, world_size=1, nb_objects=0)
        if self.game_type != "custom":
            for field, default in (("world_size", 2), ("nb_objects", 3)):
                check(getattr(self, field) == default, type(self), field, getattr(self, field),
                      f"applies to custom games only (keep {default} for {self.game_type})")

    @property
    def name(self) -> str:
        """A file-name-safe name unique per spec, e.g. ``coin-l5-s17``, ``custom-l2-w2-o3-s1``."""
        if self.game_type == "custom":
            return f"custom-l{self.level}-w{self.world_size}-o{self.nb_objects}-s{self.seed}"
        return f"{self.game_type}-l{self.level}-s{self.seed}"

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GameSpec:
        """The spec of :meth:`to_json`; ConfigError on unknown, missing or invalid fields."""
        _check_fields(cls, data)
        if "game_type" not in data:
            raise ConfigError("GameSpec: missing field 'game_type'")
        return cls(**dict(data))

    def tw_make_args(self) -> list[str]:
        """The ``tw-make`` arguments that generate the same game (run with ``PYTHONHASHSEED=0``)."""
        if self.game_type == "custom":
            args = ["custom", "--world-size", str(self.world_size), "--nb-objects", str(self.nb_objects),
                    "--quest-length", str(self.level)]
        else:
            args = [_CHALLENGE[self.game_type]]
            if self.game_type in ("coin", "treasure"):
                args += ["--level", str(self.level)]
            elif self.game_type == "simple":
                args += ["--rewards", _SIMPLE_REWARDS[self.level], "--goal", "detailed"]
            else:
                args += ["--recipe", str(self.level), "--take", str(self.level), "--go", "1", "--open"]
        return [*args, "--seed", str(self.seed), "--output", f"{self.name}.z8"]

    def _settings(self) -> dict[str, Any]:
        """The ``settings`` mapping tw-make passes to the challenge's ``make`` (its parsed arguments)."""
        if self.game_type in ("coin", "treasure"):
            return {"level": self.level}
        if self.game_type == "simple":
            return {"rewards": _SIMPLE_REWARDS[self.level], "goal": "detailed", "test": False}
        return {"recipe": self.level, "take": self.level, "go": 1, "open": True, "cook": False, "cut": False,
                "drop": False, "recipe_seed": 0, "split": None}


def suite_env_name(spec: GameSpec) -> str:
    """The environment name of a spec's games (``Case.env``): the game type, e.g. ``"coin"``."""
    return spec.game_type


@dataclasses.dataclass(frozen=True, kw_only=True)
class TextWorldConfig:
    """How a game is played and shown (see the module docstring).

    - ``max_steps``: the step limit: the episode ends (done, not won) after this many commands;
    - ``history``: past (command, observation) pairs in the state text;
    - ``max_observation_chars``: the bound on each observation (and the objective, the inventory);
    - ``max_state_chars``: :meth:`GameState.text` is at most this long;
    - ``hide_commands``: admissible commands whose first word is one of these are removed;
    - ``not_admissible``: ``"error"`` raises GameError; ``"penalty"`` does not send the command, counts the
      step, rewards 0 and marks ``StepResult.invalid``.
    """

    max_steps: int = 20
    history: int = 2
    max_observation_chars: int = 300
    max_state_chars: int = 900
    hide_commands: tuple[str, ...] = ("look", "inventory", "examine")
    not_admissible: NotAdmissible = "error"

    def __post_init__(self) -> None:
        check_ints(self, max_steps=(1, MAX_GAME_STEPS), history=(0, MAX_GAME_STEPS),
                   max_observation_chars=(20, MAX_TOKENS), max_state_chars=(100, MAX_TOKENS))
        check(self.max_observation_chars + 5 <= self.max_state_chars, type(self), "max_state_chars",
              self.max_state_chars, f"must leave room for 'Now: ' and an observation of max_observation_chars="
              f"{self.max_observation_chars}")
        hide = self.hide_commands
        check(isinstance(hide, (tuple, list)) and all(isinstance(w, str) and w.strip() and " " not in w.strip()
                                                      for w in hide),
              type(self), "hide_commands", hide, "must be a tuple of single non-empty words")
        object.__setattr__(self, "hide_commands", tuple(w.strip().lower() for w in hide))
        check_choice(self, "not_admissible", NotAdmissible)

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["hide_commands"] = list(self.hide_commands)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TextWorldConfig:
        _check_fields(cls, data)
        return cls(**dict(data))


def _check_fields(cls: type, data: Any) -> None:
    """``data`` is a JSON object naming only fields of dataclass ``cls`` (else a ConfigError)."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{cls.__name__}: expected a JSON object, got {type(data).__name__}")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"{cls.__name__}: unknown fields {unknown} (known: {sorted(known)})")


def _shorten(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, ending in ``...`` when cut."""
    if len(text) <= limit:
        return text
    if limit <= 3:
        return text[:limit]
    return text[: limit - 3].rstrip() + "..."


@dataclasses.dataclass(frozen=True)
class GameState:
    """One state of a game as the agent sees it (see the module docstring).

    ``env`` is the game type (``"coin"``; ``Case.env``); ``step`` counts the commands taken; ``admissible`` is
    sorted, after ``hide_commands``, and never empty unless ``done``; ``history`` holds the last ``history``
    (command, observation) pairs, oldest first; ``done = won or lost or step >= max_steps``.
    ``max_state_chars`` bounds :meth:`text`.
    """

    game: str
    env: str
    step: int
    objective: str
    observation: str
    inventory: str
    admissible: tuple[str, ...]
    history: tuple[tuple[str, str], ...]
    score: int
    max_score: int
    won: bool
    lost: bool
    done: bool
    max_state_chars: int = 900

    @property
    def normalized_score(self) -> float:
        """``score / max_score`` (0 when ``max_score`` is 0)."""
        return self.score / self.max_score if self.max_score > 0 else 0.0

    def text(self) -> str:
        """The bounded state text: ``Goal``, ``Carrying``, ``Before`` (history) and ``Now`` (the observation).

        The observation is kept whole when it fits (it always does under a validated TextWorldConfig); the
        objective gets up to half the remaining room, then the inventory, then the history what is left
        (newest pairs first; the newest command is shown without its observation when that is ``Now``).
        Lines with nothing to say are left out.
        """
        limit = self.max_state_chars
        now = "Now: " + _shorten(self.observation, max(limit - 5, 0))
        room = limit - len(now)
        lines: dict[str, str] = {}
        for key, share in (("Goal", 0.5), ("Carrying", 0.5), ("Before", 1.0)):
            prefix = f"{key}: "
            allot = int(room * share) - len(prefix) - 1
            if allot < 12:
                continue
            body = self._history_text(allot) if key == "Before" else _shorten(
                self.objective if key == "Goal" else self.inventory, allot)
            if body:
                lines[key] = prefix + body
                room -= len(lines[key]) + 1
        ordered = [lines[key] for key in ("Goal", "Carrying", "Before") if key in lines]
        return "\n".join([*ordered, now])

    def _history_text(self, limit: int) -> str:
        """``> cmd: obs | ... | > cmd`` in at most ``limit`` characters, dropping the oldest pairs first."""
        entries = []
        for index, (command, observation) in enumerate(self.history):
            last = index == len(self.history) - 1
            entries.append(f"> {command}" if last and observation == self.observation else
                           f"> {command}: {observation}")
        kept: list[str] = []
        used = 0
        for entry in reversed(entries):
            sep = 3 if kept else 0
            if used + sep + len(entry) <= limit:
                kept.append(entry)
                used += sep + len(entry)
                continue
            if limit - used - sep >= 24:  # room for a useful part of an older pair
                kept.append(_shorten(entry, limit - used - sep))
            elif not kept:
                kept.append(_shorten(entry, limit))
            break
        return " | ".join(reversed(kept))

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["admissible"] = list(self.admissible)
        data["history"] = [list(pair) for pair in self.history]
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GameState:
        """The state of :meth:`to_json`; DataFormatError on missing or mistyped fields."""
        try:
            state = cls(game=str(data["game"]), env=str(data["env"]), step=int(data["step"]),
                        objective=str(data["objective"]), observation=str(data["observation"]),
                        inventory=str(data["inventory"]),
                        admissible=tuple(str(c) for c in data["admissible"]),
                        history=tuple((str(c), str(o)) for c, o in data["history"]),
                        score=int(data["score"]), max_score=int(data["max_score"]), won=bool(data["won"]),
                        lost=bool(data["lost"]), done=bool(data["done"]),
                        max_state_chars=int(data.get("max_state_chars", 900)))
        except (KeyError, TypeError, ValueError) as error:
            raise DataFormatError(f"GameState: bad or missing field ({_one_line(error)})") from error
        return state


@dataclasses.dataclass(frozen=True)
class StepResult:
    """What one command did: the next state, its reward (score gained / max score), done, and whether the
    command was not admissible (only under ``not_admissible="penalty"``)."""

    state: GameState
    reward: float
    done: bool
    invalid: bool = False


# --- cleaning TextWorld's text -------------------------------------------------------------------------------

_END_RE = re.compile(r"\*\*\* (?:The End|You lost!?) \*\*\*")
_CARRY_RE = re.compile(r"^You are carrying:?\s*", re.IGNORECASE)


def _clean_feedback(feedback: str, objective: str = "") -> str:
    """The game's reply without the banner, the prompt and status line, the end-of-game menu; collapsed."""
    text = feedback or ""
    lines = text.split("\n")
    banner = [i for i, line in enumerate(lines) if "$$" in line]
    if banner:
        text = "\n".join(lines[banner[-1] + 1:])
    end = _END_RE.search(text)
    if end:
        text = text[: end.end()]
    else:
        prompt = text.rfind("\n>")
        if prompt >= 0:
            text = text[:prompt]
        elif text.lstrip().startswith(">"):
            text = ""
    text = _one_line(text)
    if objective and text.startswith(objective):
        text = text[len(objective):].lstrip()
    return text


def _clean_inventory(inventory: str | None) -> str:
    text = _one_line(inventory or "")
    return _CARRY_RE.sub("", text)


def _check_story(path: Path) -> None:
    """GameError unless ``path`` is a complete Z-machine story (version byte, length, checksum)."""
    try:
        data = path.read_bytes()
    except OSError as error:
        raise GameError(f"{path}: cannot read the game file ({_one_line(error)})") from error
    if len(data) < 64 or not 1 <= data[0] <= 8:
        raise GameError(f"{path}: not a Z-machine game file ({len(data)} bytes, version byte {data[:1]!r})")
    version = data[0]
    scale = 2 if version <= 3 else 4 if version <= 5 else 8
    length = struct.unpack(">H", data[0x1A:0x1C])[0] * scale
    if length < 64 or length > len(data):
        raise GameError(f"{path}: truncated or corrupt game file (header says {length} bytes, file has {len(data)})")
    checksum = struct.unpack(">H", data[0x1C:0x1E])[0]
    if sum(data[0x40:length]) % 0x10000 != checksum:
        raise GameError(f"{path}: corrupt game file (checksum mismatch)")


def _env_name_of(game_path: Path, metadata: Mapping[str, Any]) -> str:
    sidecar = game_path.with_suffix(".spec.json")
    if sidecar.is_file():
        try:
            return suite_env_name(GameSpec.from_json(load_json_file(sidecar, "game spec")))
        except (ValueError, OSError) as error:
            logger.warning("%s: unreadable spec (%s); env name from the game", sidecar, _one_line(error))
    uuid = str(metadata.get("uuid", ""))
    for game_type, challenge in _CHALLENGE.items():
        if uuid.startswith(challenge + "-"):
            return game_type
    return "textworld"


class TextWorldEnv:
    """One TextWorld game, played one command at a time (see the module docstring).

    ``name`` (default: the file stem) names the game in logs; ``env`` (default: the game type read from the
    ``NAME.spec.json`` :func:`make_game` writes, else from the game's id, else ``"textworld"``) is ``Case.env``.
    """

    def __init__(self, game_file: str | Path, config: TextWorldConfig | None = None, *, name: str | None = None,
                 env: str | None = None):
        self.config = config if config is not None else TextWorldConfig()
        if not isinstance(self.config, TextWorldConfig):
            raise ConfigError(f"TextWorldEnv: config must be a TextWorldConfig, got {type(self.config).__name__}")
        path = Path(game_file)
        self.path = path
        if not path.is_file():
            raise GameError(f"{path}: no such game file")
        companion = path.with_suffix(".json")
        if not companion.is_file():
            raise GameError(f"{path}: missing the companion {companion.name} (TextWorld's game description)")
        try:
            metadata = load_json_file(companion, "game description").get("metadata", {})
        except (OSError, ValueError, AttributeError) as error:
            raise GameError(f"{companion}: unreadable game description ({_one_line(error)})") from error
        _check_story(path)
        self.name = name if name is not None else path.stem
        self.env = env if env is not None else _env_name_of(path, metadata if isinstance(metadata, dict) else {})
        textworld = _import_textworld()
        infos = textworld.EnvInfos(admissible_commands=True, objective=True, inventory=True, max_score=True,
                                   score=True, won=True, lost=True, policy_commands=True)
        try:
            with warnings.catch_warnings():  # jericho: "not fully supported" (TextWorld tracks the score itself)
                warnings.filterwarnings("ignore", message=".*is not fully supported.*")
                self._env = textworld.start(str(path), request_infos=infos)
        except Exception as error:  # textworld/jericho raise anything from OSError to ValueError
            raise GameError(f"{path}: cannot start the game ({_one_line(error)})") from error
        self._state: GameState | None = None
        self._walkthrough: tuple[str, ...] | None = None
        self._objective = ""
        self._closed = False

    # --- the episode ---------------------------------------------------------------------------------------

    def _visible(self, commands: Sequence[str] | None) -> tuple[str, ...]:
        every = sorted({_one_line(c) for c in commands or () if _one_line(c)})
        hide = set(self.config.hide_commands)
        shown = tuple(c for c in every if c.split(" ", 1)[0].lower() not in hide)
        return shown if shown else tuple(every)  # never empty while the game offers anything

    def _make_state(self, gs: Any, step: int, observation: str, history: tuple[tuple[str, str], ...]) -> GameState:
        cfg = self.config
        won, lost = bool(gs.won), bool(gs.lost)
        done = won or lost or step >= cfg.max_steps
        admissible = () if won or lost else self._visible(gs.admissible_commands)
        if not admissible:
            done = True
        return GameState(game=self.name, env=self.env, step=step,
                         objective=_shorten(self._objective, cfg.max_observation_chars),
                         observation=_shorten(observation, cfg.max_observation_chars),
                         inventory=_shorten(_clean_inventory(gs.inventory), cfg.max_observation_chars),
                         admissible=admissible, history=history[-cfg.history:] if cfg.history else (),
                         score=int(gs.score or 0), max_score=int(gs.max_score or 0), won=won, lost=lost, done=done,
                         max_state_chars=cfg.max_state_chars)

    def _live(self) -> Any:
        if self._closed:
            raise GameError(f"{self.path}: the game is closed")
        return self._env

    def reset(self) -> GameState:
        """Start a new episode; the initial state (step 0)."""
        env = self._live()
        try:
            gs = env.reset()
        except Exception as error:
            raise GameError(f"{self.path}: cannot reset the game ({_one_line(error)})") from error
        if gs.admissible_commands is None:
            raise GameError(f"{self.path}: the game gives no admissible commands (is its .json the right one?)")
        self._objective = _one_line(gs.objective or "")
        self._walkthrough = tuple(gs.policy_commands or ())
        self._last = gs
        self._state = self._make_state(gs, 0, _clean_feedback(gs.feedback, self._objective), ())
        return self._state

    def step(self, command: str) -> StepResult:
        """Take one command (one of ``state.admissible``); see the module docstring for rewards and penalties."""
        env = self._live()
        state = self._state
        if state is None:
            raise GameError(f"{self.path}: call reset() before step()")
        if state.done:
            raise GameError(f"{self.name}: the episode is over (step {state.step}); call reset()")
        command = _one_line(command)
        if command not in state.admissible:
            if self.config.not_admissible == "error":
                raise GameError(f"{self.name}: {command!r} is not admissible at step {state.step} "
                                f"(admissible: {', '.join(state.admissible)})")
            history = (*state.history, (command, "(not an available command)"))
            step = state.step + 1
            new = dataclasses.replace(state, step=step, done=step >= self.config.max_steps,
                                      history=history[-self.config.history:] if self.config.history else ())
            self._state = new
            return StepResult(state=new, reward=0.0, done=new.done, invalid=True)
        try:
            gs, _, _ = env.step(command)
        except Exception as error:
            raise GameError(f"{self.name}: the game failed on {command!r} ({_one_line(error)})") from error
        observation = _shorten(_clean_feedback(gs.feedback), self.config.max_observation_chars)
        history = (*state.history, (command, observation))
        new = self._make_state(gs, state.step + 1, observation, history)
        gained = new.score - state.score
        reward = gained / new.max_score if new.max_score > 0 else 0.0
        self._state = new
        return StepResult(state=new, reward=float(reward), done=new.done)

    def replay(self, commands: Sequence[str]) -> GameState:
        """Reset, then take ``commands`` in order: the state an episode reached with them (how a run resumes)."""
        state = self.reset()
        for command in commands:
            state = self.step(command).state
        return state

    @property
    def state(self) -> GameState | None:
        """The current state (``None`` before the first reset)."""
        return self._state

    @property
    def walkthrough(self) -> tuple[str, ...]:
        """The game's winning commands at reset (TextWorld's ``policy_commands``; for tests, scripted planners)."""
        if self._walkthrough is None:
            raise GameError(f"{self.path}: call reset() before reading the walkthrough")
        return self._walkthrough

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            try:
                self._env.close()
            except Exception as error:  # closing must not raise
                logger.debug("%s: close failed: %s", self.path, _one_line(error))

    def __enter__(self) -> TextWorldEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- generation --------------------------------------------------------------------------------------------

# Run in a child process (PYTHONHASHSEED=0): reads [{"kind", "settings", "options", "path"}, ...] as JSON on
# stdin, writes each game (.z8, .json) and prints a done mark per game. It imports only textworld.
_WORKER = r"""
import json, sys
import textworld, textworld.challenges, textworld.generator
jobs = json.load(sys.stdin)
for index, job in enumerate(jobs):
    options = textworld.GameOptions()
    options.seeds = job["seed"]
    options.path = job["path"]
    options.file_ext = ".z8"
    options.force_recompile = True
    if job["kind"] == "custom":
        custom = job["custom"]
        options.nb_rooms = custom["world_size"]
        options.nb_objects = custom["nb_objects"]
        options.nb_parallel_quests = 1
        chaining = options.chaining
        chaining.min_breadth, chaining.max_breadth, chaining.min_depth = 1, 5, 1
        chaining.min_length = chaining.max_length = chaining.max_depth = custom["quest_length"]
        game = textworld.generator.make_game(options)
    else:
        _, make, _ = textworld.challenges.CHALLENGES[job["kind"]]
        game = make(settings=job["settings"], options=options)
    textworld.generator.compile_game(game, options)
    print(MARK, index, flush=True)
"""


def game_file(spec: GameSpec, directory: str | Path) -> Path:
    """Where ``spec``'s game lives: ``directory / f"{spec.name}.z8"`` (with ``.json`` and ``.spec.json`` beside)."""
    return Path(directory) / f"{spec.name}.z8"


def _complete(spec: GameSpec, directory: Path) -> bool:
    path = game_file(spec, directory)
    return path.is_file() and path.with_suffix(".json").is_file()


def _job(spec: GameSpec, path: Path) -> dict[str, Any]:
    if spec.game_type == "custom":
        return {"kind": "custom", "seed": spec.seed, "path": str(path),
                "custom": {"world_size": spec.world_size, "nb_objects": spec.nb_objects, "quest_length": spec.level}}
    return {"kind": _CHALLENGE[spec.game_type], "seed": spec.seed, "path": str(path), "settings": spec._settings()}


def _generate(specs: Sequence[GameSpec], directory: Path, *, progress: bool = False, desc: str = "games") -> None:
    """Generate ``specs`` (all missing) into ``directory``, in one child process, each atomically."""
    if not specs:
        return
    import importlib.util

    if importlib.util.find_spec("textworld") is None:
        raise GameError(_INSTALL_HINT)
    from tqdm.auto import tqdm

    directory.mkdir(parents=True, exist_ok=True)
    temps = [Path(tempfile.mkdtemp(prefix=f".tmp-{spec.name}-", dir=directory)) for spec in specs]
    jobs = [_job(spec, tmp / f"{spec.name}.z8") for spec, tmp in zip(specs, temps)]
    child_env = {**os.environ, "PYTHONHASHSEED": "0"}
    err_path = temps[0] / "stderr.txt"
    done = 0
    timed_out = threading.Event()
    try:
        with open(err_path, "w+", encoding="utf-8") as err, \
                tqdm(total=len(specs), desc=desc, unit="game", disable=not progress) as bar:
            proc = subprocess.Popen([sys.executable, "-c", f"MARK = {_DONE_MARK!r}\n" + _WORKER],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True,
                                    env=child_env, cwd=str(temps[0]))

            def kill() -> None:
                timed_out.set()
                proc.kill()

            timer = threading.Timer(_GENERATE_TIMEOUT_S * len(specs), kill)
            timer.start()
            try:
                assert proc.stdin is not None and proc.stdout is not None
                proc.stdin.write(json.dumps(jobs))
                proc.stdin.close()
                for line in proc.stdout:
                    if not line.startswith(_DONE_MARK):
                        continue
                    index = int(line.split()[1])
                    _place(specs[index], temps[index], directory)
                    done += 1
                    bar.update(1)
                rc = proc.wait()
            finally:
                timer.cancel()
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            if rc != 0 or done != len(specs):
                err.seek(0)
                tail = [line for line in err.read().splitlines() if line.strip()]
                failed = specs[done] if done < len(specs) else specs[-1]
                why = f"timed out after {_GENERATE_TIMEOUT_S:.0f} s a game" if timed_out.is_set() \
                    else (_one_line(tail[-1]) if tail else f"exit code {rc}")
                raise GameError(f"{game_file(failed, directory)}: generation failed ({why})")
    finally:
        for tmp in temps:
            shutil.rmtree(tmp, ignore_errors=True)


def _place(spec: GameSpec, tmp: Path, directory: Path) -> None:
    """Move a generated game into place: description, spec, then the story file last."""
    target = game_file(spec, directory)
    source = tmp / target.name
    if not source.is_file() or not source.with_suffix(".json").is_file():
        raise GameError(f"{target}: the generator wrote no game")
    os.replace(source.with_suffix(".json"), target.with_suffix(".json"))
    write_json(target.with_suffix(".spec.json"), spec.to_json())
    os.replace(source, target)
    logger.info("generated %s", target)


def make_game(spec: GameSpec, directory: str | Path) -> Path:
    """The ``.z8`` of ``spec`` in ``directory``: generated if absent (atomically), else reused."""
    directory = Path(directory)
    if not _complete(spec, directory):
        _generate([spec], directory)
    return game_file(spec, directory)


# --- suites ------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class GameSuite:
    """A deterministic set of games with splits: ``train``, ``test`` (new games, same kinds), ``ood``."""

    name: str
    description: str
    splits: dict[str, tuple[GameSpec, ...]]

    def specs(self) -> list[tuple[str, GameSpec]]:
        """Every (split, spec), in split then table order."""
        return [(split, spec) for split, specs in self.splits.items() for spec in specs]


def _suites() -> dict[str, GameSuite]:
    suites = {}
    for name, (description, table) in SUITE_TABLE.items():
        splits = {split: tuple(GameSpec(game_type=kind, level=level, seed=seed) for kind, level, seed in rows)
                  for split, rows in table.items()}
        suites[name] = GameSuite(name=name, description=description, splits=splits)
    return suites


#: The known suites, built from :data:`SUITE_TABLE`.
SUITES: dict[str, GameSuite] = _suites()


def _textworld_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("textworld")
    except PackageNotFoundError:
        return "unknown"


def _write_card(suite: GameSuite, directory: Path) -> None:
    tw_version = _textworld_version()
    games = [{"split": split, "name": spec.name, "file": f"{spec.name}.z8", "env": suite_env_name(spec),
              "spec": spec.to_json(), "tw_make": "PYTHONHASHSEED=0 tw-make " + " ".join(spec.tw_make_args())}
             for split, spec in suite.specs()]
    licence = ("TextWorld is MIT-licensed (Copyright (c) Microsoft Corporation); these games were generated "
               "with it and are derived from its generators, grammars and knowledge bases.")
    card = {"suite": suite.name, "description": suite.description,
            "generator": {"package": "textworld", "version": tw_version, "python_hash_seed": 0},
            "splits": {split: [spec.name for spec in specs] for split, specs in suite.splits.items()},
            "games": games, "licence": licence}
    write_json(directory / "card.json", card)
    rows = "\n".join(f"| {g['split']} | `{g['name']}` | {g['env']} | `{g['tw_make']}` |" for g in games)
    counts = ", ".join(f"{split} {len(specs)}" for split, specs in suite.splits.items())
    atomic_write_text(directory / "CARD.md", f"""# Game suite `{suite.name}`

{suite.description}

Splits: {counts}. Seeds are disjoint between splits.

## Generator

TextWorld {tw_version} (PyPI `textworld`), run by `memento.envs.textworld.build_suite("{suite.name}")` with
`PYTHONHASHSEED=0` (TextWorld iterates over string sets while generating; a fixed hash seed makes the files
byte-identical). Each line below is the equivalent `tw-make` command.

| split | game | env | tw-make |
|---|---|---|---|
{rows}

## Licence

{licence}
""")


def build_suite(name: str, cache_dir: str | Path | None = None, *, splits: Sequence[str] | None = None,
                progress: bool = True) -> dict[str, list[Path]]:
    """Generate the missing games of suite ``name`` (all splits, or ``splits``) and return split -> game files.

    ``cache_dir`` defaults to ``memento.encoders.default_cache_dir() / "games" / name``. Games already there
    are reused; ``card.json`` and ``CARD.md`` are (re)written. Unknown suite or split -> ConfigError.
    """
    if name not in SUITES:
        raise ConfigError(f"unknown game suite {name!r} (known: {', '.join(sorted(SUITES))})")
    suite = SUITES[name]
    chosen = list(suite.splits) if splits is None else list(splits)
    unknown = [split for split in chosen if split not in suite.splits]
    if unknown:
        raise ConfigError(f"suite {name!r} has no splits {unknown} (known: {', '.join(suite.splits)})")
    if cache_dir is None:
        from memento.encoders import default_cache_dir

        directory = default_cache_dir() / "games" / name
    else:
        directory = Path(cache_dir)
    directory.mkdir(parents=True, exist_ok=True)
    wanted = [spec for split in chosen for spec in suite.splits[split]]
    missing = [spec for spec in dict.fromkeys(wanted) if not _complete(spec, directory)]
    if missing:
        logger.info("suite %s: generating %d of %d games into %s", name, len(missing), len(wanted), directory)
    _generate(missing, directory, progress=progress, desc=f"games {name}")
    _write_card(suite, directory)
    return {split: [game_file(spec, directory) for spec in suite.splits[split]] for split in chosen}
