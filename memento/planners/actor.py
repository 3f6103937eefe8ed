"""The frozen-LLM command actor of text games: one admissible command per game step.

At each step of a TextWorld game the policy has selected cases from the bank; the actor turns the game
state, the admissible commands and those cases into one command::

    state_text, admissible, cases
      -> proposals   case_proposals(cases, admissible, tried): the admissible commands the
                     successful cases propose (a step case its command, an episode case each
                     command of its trajectory that is admissible now and not tried yet)
      -> commands    proposals first, then the rest of ``admissible`` in its order, at most
                     ``max_commands``; ``allowed``: those not tried in this game state yet
                     (``avoid_repeats``; all of them when every one was tried)
      -> planner     score mode: the log-likelihood of each allowed command after the planner's own
                     prompt for Task(question=state_text) with the cases (length-normalised with
                     ``length_norm``), softmax at ``temperature`` (0: arg-max);
                     generate mode: the planner writes a command, matched to the closest allowed one
                     (exact > prefix / contained > word overlap; no match: uniform, ``unusable``)
      -> mixture     p = (1 - w) * planner part + w * uniform over the allowed proposals,
                     w = case_weight when an allowed proposal exists, else 0
      -> draw        with the caller's rng: first the part (proposal part with probability w), then the
                     command within it, so ``ActorChoice.source`` says where its mass came from

**Scoring paths.** A planner with ``render``, ``render_continuation`` and ``score_options``
(:class:`~memento.planners.hf.HFPlanner`) scores all commands after one rendered prompt, sharing the
prompt's forward pass. Any other :class:`~memento.planners.base.ScoringPlanner` (OpenAI-compatible servers,
a ``CallablePlanner`` with ``score_fn``) gets ``score_many([task] * N, [[cases]] * N, answers=commands)``.
The task's ``answers`` hold a placeholder (the first command): prompts never show them.

**Matching** (generate mode and proposals) compares commands case- and whitespace-insensitively;
a generated text also loses a leading ``>`` and trailing ``.``/``!``. The actor keeps no state and draws only
from the generator it is given: one call is deterministic given the rng state (two draws per call).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Collection, Sequence
from typing import Any, Literal

import numpy as np

from memento.config import check_bools, check_choice, check_float, check_int
from memento.errors import GameError
from memento.planners.base import PlannerError
from memento.types import Case, Task

__all__ = ["ActorChoice", "ActorConfig", "ActorMode", "ChoiceSource", "CommandActor", "case_proposals",
           "match_command"]

logger = logging.getLogger(__name__)

ActorMode = Literal["score", "generate"]
ChoiceSource = Literal["planner", "case", "fallback"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class ActorConfig:
    """How the actor turns the planner's view of the commands into a draw (see the module docstring).

    - ``mode``: ``"score"``: softmax over the planner's log-likelihood of each admissible command;
      ``"generate"``: the planner writes a command, matched to the closest admissible one;
    - ``temperature``: of the softmax over command log-likelihoods; 0 = arg-max (the first best);
    - ``length_norm``: use the mean token log-prob instead of the sum;
    - ``case_weight``: the probability mass given to the commands the selected cases propose (uniform over
      them); 0 = cases only go in the prompt;
    - ``avoid_repeats``: a command already tried in this same game state gets no mass (unless every
      command was tried);
    - ``max_commands``: score at most this many commands (proposals first, then the admissible order).
    """

    mode: ActorMode = "score"
    temperature: float = 1.0
    length_norm: bool = False
    case_weight: float = 0.5
    avoid_repeats: bool = True
    max_commands: int = 32

    def __post_init__(self) -> None:
        check_choice(self, "mode", ActorMode)
        check_float(self, "temperature", low=0.0)
        check_float(self, "case_weight", low=0.0, high=1.0)
        check_bools(self, "length_norm", "avoid_repeats")
        check_int(self, "max_commands", 1)


@dataclasses.dataclass(frozen=True, eq=False)
class ActorChoice:
    """One step's decision: the command, the commands considered and the actor's distribution over them.

    ``source``: where the chosen command's mass came from (``"case"``: the proposal part of the mixture;
    ``"fallback"``: generate mode matched nothing usable and the planner part was a uniform draw).
    ``unusable``: generate mode's text matched no allowed command. (``eq=False``: it holds an array.)
    """

    command: str
    commands: tuple[str, ...]
    probs_A: np.ndarray
    source: ChoiceSource
    proposals: tuple[str, ...]
    unusable: bool = False

    def to_json(self) -> dict[str, Any]:
        """For the steps log (probabilities rounded to 6 digits)."""
        return {"command": self.command, "commands": list(self.commands),
                "probs": [round(float(p), 6) for p in self.probs_A], "source": self.source,
                "proposals": list(self.proposals), "unusable": self.unusable}


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def _trajectory_commands(action: str) -> list[str]:
    """The commands of an episode case's trajectory: its ``> cmd`` lines when it has any, else every line."""
    lines = [line.strip() for line in action.splitlines()]
    marked = [line.lstrip(">").strip() for line in lines if line.startswith(">")]
    return [line for line in (marked if marked else lines) if line]


def case_proposals(cases: Sequence[Case], admissible: Sequence[str], tried: Collection[str] = ()) -> tuple[str, ...]:
    """The admissible commands the cases propose, deduplicated, in case order (admissible spelling).

    Only cases with ``reward > 0`` propose (the others still appear in the prompt). A *step* case
    (``meta["granularity"] == "step"``, also the default when it is unset) proposes its action, one command,
    when it is admissible; an *episode* case (``"episode"``) has its trajectory as action, one command per
    line (``"> cmd"`` lines, or plain lines when none is marked), and proposes each of its commands that is
    admissible now and not in ``tried``. Commands match case- and whitespace-insensitively.
    """
    by_norm: dict[str, str] = {}
    for command in admissible:
        by_norm.setdefault(_norm(command), command)
    tried_norm = {_norm(command) for command in tried}
    proposals: dict[str, None] = {}
    for case in cases:
        if case.reward <= 0:
            continue
        if case.meta.get("granularity") == "episode":
            wanted = [c for c in _trajectory_commands(case.action) if _norm(c) not in tried_norm]
        else:
            wanted = [case.action]
        for command in wanted:
            found = by_norm.get(_norm(command))
            if found is not None:
                proposals.setdefault(found, None)
    return tuple(proposals)


def match_command(text: str, commands: Sequence[str]) -> str | None:
    """The command of ``commands`` closest to a generated ``text`` (``None``: none is usable).

    In order: an exact match (case- and whitespace-insensitive; the text loses a leading ``>`` and trailing
    ``.``/``!``); a command contained in the text (at word boundaries; the longest) or, failing that, one
    that starts with the text (the first); the command sharing the most words with the text (at least one;
    the first among ties).
    """
    wanted = _norm(text.strip().lstrip(">").rstrip(".!"))
    if not wanted:
        return None
    normed = [_norm(command) for command in commands]
    for command, norm in zip(commands, normed):
        if norm == wanted:
            return command
    contained = [i for i, norm in enumerate(normed) if norm and f" {norm} " in f" {wanted} "]
    if contained:
        return commands[max(contained, key=lambda i: len(normed[i]))]  # the longest; the first among ties
    for command, norm in zip(commands, normed):
        if norm.startswith(wanted):
            return command
    words = set(wanted.split())
    overlaps = [len(words & set(norm.split())) for norm in normed]
    best = max(overlaps, default=0)
    return commands[overlaps.index(best)] if best >= 1 else None


def _softmax(values: np.ndarray, temperature: float) -> np.ndarray:
    if temperature == 0.0:
        out = np.zeros(len(values))
        out[int(np.argmax(values))] = 1.0
        return out
    scaled = values / temperature
    scaled = np.exp(scaled - scaled.max())
    return scaled / scaled.sum()


class CommandActor:
    """Picks one admissible command per game step with a frozen planner (see the module docstring)."""

    def __init__(self, planner: Any, config: ActorConfig = ActorConfig()):
        self.planner = planner
        self.config = config

    def act(self, state_text: str, admissible: Sequence[str], cases: Sequence[Case], *, rng: np.random.Generator,
            tried: Collection[str] = (), task_id: str = "step") -> ActorChoice:
        """The command for ``state_text``: drawn with ``rng`` from the mixture of the planner's distribution over
        the allowed commands and the cases' proposals. Empty ``admissible``: :class:`GameError`; planner errors
        (:class:`PlannerError`) propagate."""
        config = self.config
        if isinstance(admissible, str):
            raise GameError(f"actor, task {task_id!r}: admissible must be a list of commands, not a string")
        admissible = list(dict.fromkeys(c for c in admissible if isinstance(c, str) and c.strip()))
        if not admissible:
            raise GameError(f"actor, task {task_id!r}: no admissible command to choose from")
        proposals = case_proposals(cases, admissible, tried)
        commands = tuple(dict.fromkeys([*proposals, *admissible]))[:config.max_commands]
        proposals = tuple(p for p in proposals if p in commands)
        tried_set = set(tried)
        allowed = [c for c in commands if c not in tried_set] if config.avoid_repeats else list(commands)
        if not allowed:
            allowed = list(commands)
        task = Task(id=task_id, question=state_text, answers=(allowed[0],))
        planner_part, unusable = self._planner_part(task, allowed, cases)
        allowed_proposals = [p for p in proposals if p in allowed]
        weight = config.case_weight if allowed_proposals else 0.0
        index = {command: i for i, command in enumerate(commands)}
        probs_A = np.zeros(len(commands))
        for command, p in zip(allowed, planner_part):
            probs_A[index[command]] += (1.0 - weight) * p
        for command in allowed_proposals:
            probs_A[index[command]] += weight / len(allowed_proposals)
        probs_A /= probs_A.sum()
        from_cases = bool(rng.random() < weight)
        u = float(rng.random())
        if from_cases:
            command = allowed_proposals[min(int(u * len(allowed_proposals)), len(allowed_proposals) - 1)]
            source: ChoiceSource = "case"
        else:
            cdf = np.cumsum(planner_part)
            command = allowed[min(int(np.searchsorted(cdf, u * cdf[-1], side="right")), len(allowed) - 1)]
            source = "fallback" if unusable else "planner"
        logger.debug("actor %s: %r from %s (%d command(s), %d proposal(s))", task_id, command, source,
                     len(commands), len(proposals))
        return ActorChoice(command=command, commands=commands, probs_A=probs_A, source=source, proposals=proposals,
                           unusable=unusable)

    def _planner_part(self, task: Task, allowed: list[str], cases: Sequence[Case]) -> tuple[np.ndarray, bool]:
        """The planner's distribution over ``allowed`` (and whether generate mode's text was unusable)."""
        if self.config.mode == "generate":
            text = self.planner.plan(task, list(cases)).text
            matched = match_command(text, allowed)
            if matched is None:
                logger.debug("actor %s: the planner's text %r matches no allowed command", task.id, text)
                return np.full(len(allowed), 1.0 / len(allowed)), True
            part = np.zeros(len(allowed))
            part[allowed.index(matched)] = 1.0
            return part, False
        if len(allowed) == 1:
            return np.ones(1), False
        scores = self._scores(task, allowed, cases)
        values = np.array([s.mean_logprob if self.config.length_norm else s.logprob for s in scores], dtype=np.float64)
        if not all(math.isfinite(v) for v in values):
            raise PlannerError(f"actor, task {task.id!r}: the planner gave a non-finite command log-likelihood")
        return _softmax(values, self.config.temperature), False

    def _scores(self, task: Task, allowed: list[str], cases: Sequence[Case]) -> list[Any]:
        planner = self.planner
        if all(hasattr(planner, name) for name in ("render", "render_continuation", "score_options")):
            prompt = planner.render(task, list(cases))
            scores = planner.score_options(prompt, [planner.render_continuation(c) for c in allowed])
        elif hasattr(planner, "score_many"):
            grouped = planner.score_many([task] * len(allowed), [[list(cases)]] * len(allowed), answers=allowed)
            scores = [group[0] for group in grouped]
        else:
            raise PlannerError(f"actor: planner {planner!r} cannot score commands (no score_options or score_many); "
                               "use ActorConfig(mode='generate')")
        if len(scores) != len(allowed):
            raise PlannerError(f"actor: planner {planner!r} returned {len(scores)} scores for {len(allowed)} commands")
        return scores
