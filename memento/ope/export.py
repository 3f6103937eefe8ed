"""A logged run in the input formats of other off-policy evaluation tools (numpy only; nothing here imports them).

Both exports hold one example per logged step and describe the step's **first** chosen case (as the K = 1
estimators of :mod:`memento.ope.estimators` do); the reward is the step's (the slate's when K > 1).

Vowpal Wabbit ``cb_adf`` text (:func:`write_vw_cb_adf`), one example per step, a blank line after each::

    shared |s d0:0.0123 d1:-0.0456 ...                        the state vector
    |a d0:... d1:... |f cos:0.83 stored_reward:1 |i id=c1f3    one line per candidate, in candidate order
    0:-1:0.25 |a ... |f ... |i ...                            the chosen candidate: 0:cost:probability

``cost = -reward`` (VW minimises cost) and ``probability`` is the logging policy's first-draw probability of
the chosen candidate (1 for a greedy step). Namespaces: ``s`` the state vector, ``a`` the case vector, ``f``
the cosine and the case's stored reward, ``i`` the case id (whitespace, ``|`` and ``:`` replaced by ``_``).
``vw --cb_adf -d FILE`` (or ``--cb_explore_adf``) reads it; ``--cb_type ips|dr`` chooses VW's estimator.

Open Bandit Pipeline's bandit feedback (:func:`obp_bandit_feedback`, saved as JSON by :func:`write_obp_json`):
a dict of lists, ``np.asarray`` each to hand it to OBP. The action set is the union of every step's candidates,
numbered by first appearance:

- ``n_rounds``: the steps; ``n_actions``: the distinct candidate cases;
- ``action[i]``: the action number of step i's first chosen case; ``reward[i]``: the step's reward;
- ``pscore[i]``: the logging policy's first-draw probability of that case **within the step's candidate set**;
- ``position[i]``: 0 (one slot is exported);
- ``context[i]``: the state vector; ``action_context[a]``: the case vector of action a;
- ``action_ids[a]`` (an extra key OBP ignores): the case id of action a.

OBP's estimators assume every action is available in every round; here only the step's candidates were (all
others had logging probability 0), so give OBP a target ``action_dist`` that is zero outside each step's
candidates, or the estimates will be biased.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from memento.errors import DataFormatError, DimensionError
from memento.io import atomic_write

__all__ = ["ExportRound", "VWExample", "obp_bandit_feedback", "parse_vw_cb_adf", "vw_cb_adf_lines",
           "write_obp_json", "write_vw_cb_adf"]

_UNSAFE = re.compile(r"[\s|:]")


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class ExportRound:
    """One logged step as the exports see it: the state vector ``state_D``, the candidates (``candidate_ids``,
    their vectors ``cases_CD`` and stored rewards ``stored_rewards_C``), the chosen candidate's index ``action``,
    the ``reward`` and the logging probability ``propensity`` of that choice."""

    state_D: np.ndarray
    candidate_ids: Sequence[str]
    cases_CD: np.ndarray
    stored_rewards_C: np.ndarray
    action: int
    reward: float
    propensity: float

    def __post_init__(self) -> None:
        state = np.asarray(self.state_D, dtype=np.float64)
        cases = np.asarray(self.cases_CD, dtype=np.float64)
        stored = np.asarray(self.stored_rewards_C, dtype=np.float64)
        c = len(self.candidate_ids)
        if state.ndim != 1 or cases.shape != (c, state.shape[0]) or stored.shape != (c,):
            raise DimensionError(f"ExportRound: {state.shape=}, {cases.shape=}, {stored.shape=} for {c} candidates")
        if not 0 <= self.action < c:
            raise DataFormatError(f"ExportRound.action={self.action} must index the {c} candidates")
        if not math.isfinite(self.reward) or not 0 < self.propensity <= 1:
            raise DataFormatError(f"ExportRound: reward {self.reward!r} must be finite and propensity "
                                  f"{self.propensity!r} in (0, 1]")
        object.__setattr__(self, "state_D", state)
        object.__setattr__(self, "cases_CD", cases)
        object.__setattr__(self, "stored_rewards_C", stored)


def _num(x: float, precision: int) -> str:
    return f"{float(x) + 0.0:.{precision}g}"  # + 0.0: no "-0"


def _vector_features(namespace: str, v: np.ndarray, precision: int) -> str:
    return f"|{namespace} " + " ".join(f"d{i}:{_num(x, precision)}" for i, x in enumerate(v))


def vw_cb_adf_lines(rounds: Iterable[ExportRound], *, precision: int = 6) -> Iterator[str]:
    """The ``cb_adf`` lines of the rounds (see the module docstring), a ``""`` line after each example."""
    for r in rounds:
        yield "shared " + _vector_features("s", r.state_D, precision)
        cos_C = r.cases_CD @ r.state_D
        for c, case_id in enumerate(r.candidate_ids):
            label = f"0:{_num(-r.reward, precision)}:{_num(r.propensity, precision)} " if c == r.action else ""
            yield (f"{label}{_vector_features('a', r.cases_CD[c], precision)} |f cos:{_num(cos_C[c], precision)} "
                   f"stored_reward:{_num(r.stored_rewards_C[c], precision)} |i id={_UNSAFE.sub('_', str(case_id))}")
        yield ""


def write_vw_cb_adf(path: str | Path, rounds: Sequence[ExportRound], *, precision: int = 6) -> int:
    """Write the rounds as VW ``cb_adf`` text (atomically); returns the examples written."""

    def write(tmp: Path) -> None:
        with tmp.open("w", encoding="utf-8") as handle:
            for line in vw_cb_adf_lines(rounds, precision=precision):
                handle.write(line + "\n")

    atomic_write(path, write)
    return len(rounds)


@dataclasses.dataclass(frozen=True, kw_only=True)
class VWExample:
    """One parsed ``cb_adf`` example: its shared line, its action lines, and the labelled action's index,
    cost and probability (``None`` when no line is labelled)."""

    shared: str
    actions: list[str]
    label_index: int | None
    cost: float | None
    probability: float | None


def parse_vw_cb_adf(text: str) -> list[VWExample]:
    """Read back ``cb_adf`` text of the shape :func:`write_vw_cb_adf` writes (for checks, not a VW parser):
    blank-line separated examples, a ``shared`` first line, at most one labelled action line each."""
    examples: list[VWExample] = []
    for block in re.split(r"\n\s*\n", text.strip("\n")):
        lines = [line for line in block.split("\n") if line.strip()]
        if not lines:
            continue
        if not lines[0].startswith("shared "):
            raise DataFormatError(f"cb_adf example {len(examples) + 1} does not start with a shared line")
        label_index = cost = probability = None
        for i, line in enumerate(lines[1:]):
            head = line.split(" ", 1)[0]
            if not head.startswith("|"):
                if label_index is not None:
                    raise DataFormatError(f"cb_adf example {len(examples) + 1} labels two actions")
                parts = head.split(":")
                if len(parts) != 3:
                    raise DataFormatError(f"cb_adf example {len(examples) + 1}: label {head!r} is not a:cost:prob")
                label_index, cost, probability = i, float(parts[1]), float(parts[2])
        examples.append(VWExample(shared=lines[0], actions=lines[1:], label_index=label_index, cost=cost,
                                  probability=probability))
    return examples


def obp_bandit_feedback(rounds: Sequence[ExportRound]) -> dict[str, Any]:
    """Open Bandit Pipeline's bandit-feedback dict (lists; see the module docstring for the mapping)."""
    if not rounds:
        raise DataFormatError("obp_bandit_feedback: no rounds")
    number: dict[str, int] = {}
    action_context: list[list[float]] = []
    action: list[int] = []
    for r in rounds:
        for c, case_id in enumerate(r.candidate_ids):
            if case_id not in number:
                number[case_id] = len(number)
                action_context.append([float(x) for x in r.cases_CD[c]])
        action.append(number[r.candidate_ids[r.action]])
    return {"n_rounds": len(rounds), "n_actions": len(number), "action": action,
            "reward": [float(r.reward) for r in rounds], "pscore": [float(r.propensity) for r in rounds],
            "position": [0] * len(rounds), "context": [[float(x) for x in r.state_D] for r in rounds],
            "action_context": action_context, "action_ids": list(number)}


def write_obp_json(path: str | Path, rounds: Sequence[ExportRound]) -> int:
    """Write :func:`obp_bandit_feedback` as JSON (atomically); returns the rounds written."""
    feedback = obp_bandit_feedback(rounds)
    text = json.dumps(feedback, ensure_ascii=False, separators=(",", ":"))
    atomic_write(path, lambda tmp: tmp.write_text(text + "\n", encoding="utf-8"))
    return int(feedback["n_rounds"])
