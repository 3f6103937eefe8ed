"""A SYNTHETIC text environment for the online loop, importable by tests and by subprocess drivers.

Four task families of short questions. The planner is a ``CallablePlanner`` whose answer format copies
the cases it is shown: it answers with the bare answer (``"Paris"``) iff at least one shown case of the
task's own family has a bare action, and otherwise in the verbose style (``"The answer is Paris."``),
which the exact-match judge scores 0. So a case helps a task only when it is of the same family AND
bare. The seed bank is built so that cosine retrieval is misled on half the families:

- "easy" families (``capital``, ``color``): the bare seed cases are worded like the tasks, the verbose
  ones differently -- the nearest successful cases are bare, so similarity retrieval succeeds;
- "trap" families (``plural``, ``opposite``): the verbose seed cases are worded like the tasks and carry
  reward 1 (they were judged by a lenient judge once), the bare ones are worded differently -- the
  nearest successful cases are all verbose, so similarity retrieval (positive-only, top-K) fails on
  every such task and never retains a success for them.

A policy that learns from rewards (soft-Q) finds the bare, differently worded cases of the trap
families among the C candidates. Seed cases carry their ``format`` and ``family`` in ``meta``; the
planner reads the format from the action text, so retained cases (whose actions are the planner's
own outputs) count as bare or verbose too.

Also: a deterministic hashing encoder (no model to load) for subprocess drivers, and ``main`` -- a
driver that runs ``memento.runs.qa.run_online`` on this environment (used by the kill/resume test).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from memento.planners.base import CallablePlanner
from memento.types import Case, Task

VERBOSE_PREFIX = "The answer is "

# family -> (task wording, other wording, [(entity, answer)] for tasks, verbose seeds, bare seeds)
_FAMILIES: dict[str, dict[str, object]] = {
    "capital": {
        "easy": True,
        "task": "In geography class, what is the capital city of {}?",
        "other": "{}: capital?",
        "tasks": [("France", "Paris"), ("Spain", "Madrid"), ("Italy", "Rome"), ("Japan", "Tokyo"),
                  ("Egypt", "Cairo"), ("Peru", "Lima")],
        "seeds_same": [("Chile", "Santiago"), ("Kenya", "Nairobi"), ("Norway", "Oslo")],
        "seeds_other": [("India", "New Delhi"), ("Greece", "Athens"), ("Brazil", "Brasilia"),
                        ("Cuba", "Havana")],
    },
    "color": {
        "easy": True,
        "task": "In the art lesson, which colour is a ripe {} usually?",
        "other": "{} colour?",
        "tasks": [("banana", "yellow"), ("tomato", "red"), ("lime", "green"), ("plum", "purple"),
                  ("carrot", "orange"), ("coconut", "brown")],
        "seeds_same": [("lemon", "yellow"), ("cherry", "red"), ("kiwi", "green")],
        "seeds_other": [("grape", "purple"), ("pumpkin", "orange"), ("blueberry", "blue"), ("peach", "pink")],
    },
    "plural": {
        "easy": False,
        "task": "In the grammar lesson, what is the plural form of the noun '{}'?",
        "other": "{} -> plural",
        "tasks": [("mouse", "mice"), ("child", "children"), ("goose", "geese"), ("tooth", "teeth"),
                  ("woman", "women"), ("cactus", "cacti")],
        "seeds_same": [("foot", "feet"), ("man", "men"), ("person", "people"), ("ox", "oxen")],
        "seeds_other": [("leaf", "leaves"), ("calf", "calves"), ("wolf", "wolves")],
    },
    "opposite": {
        "easy": False,
        "task": "In the vocabulary lesson, what is the opposite of the adjective '{}'?",
        "other": "antonym: {}",
        "tasks": [("hot", "cold"), ("tall", "short"), ("happy", "sad"), ("early", "late"),
                  ("heavy", "light"), ("rich", "poor")],
        "seeds_same": [("big", "small"), ("fast", "slow"), ("old", "young"), ("hard", "soft")],
        "seeds_other": [("dark", "bright"), ("wet", "dry"), ("loud", "quiet")],
    },
}


def _bare(case: Case) -> bool:
    return not case.action.startswith(VERBOSE_PREFIX)


@dataclasses.dataclass
class TextEnv:
    """Tasks, seed cases and a ``state text -> family`` table (see the module docstring)."""

    tasks: list[Task]
    seed_cases: list[Case]
    family_of: dict[str, str]

    def planner(self, delay_s: float = 0.0) -> CallablePlanner:
        family_of = self.family_of

        def plan(task: Task, cases: Sequence[Case]) -> str:
            if delay_s:
                time.sleep(delay_s)
            helped = any(family_of.get(case.state) == task.family and _bare(case) for case in cases)
            return task.answers[0] if helped else f"{VERBOSE_PREFIX}{task.answers[0]}."

        return CallablePlanner(plan, name="format-copying")

    @property
    def trap_families(self) -> list[str]:
        return [name for name, spec in _FAMILIES.items() if not spec["easy"]]


def make_env() -> TextEnv:
    tasks: list[Task] = []
    seeds: list[Case] = []
    family_of: dict[str, str] = {}
    for family, spec in _FAMILIES.items():
        task_wording, other_wording = str(spec["task"]), str(spec["other"])
        for entity, answer in spec["tasks"]:  # type: ignore[attr-defined]
            question = task_wording.format(entity)
            tasks.append(Task(id=f"{family}-{entity}", question=question, answers=(answer,), family=family))
            family_of[question] = family
        # easy: the task-worded seeds are bare; trap: the task-worded seeds are verbose (and "successful")
        same_format, other_format = ("bare", "verbose") if spec["easy"] else ("verbose", "bare")
        for wording, entities, fmt in ((task_wording, spec["seeds_same"], same_format),
                                       (other_wording, spec["seeds_other"], other_format)):
            for entity, answer in entities:  # type: ignore[attr-defined]
                state = wording.format(entity)
                action = answer if fmt == "bare" else f"{VERBOSE_PREFIX}{answer}."
                seeds.append(Case(state=state, action=action, reward=1.0,
                                  meta={"format": fmt, "family": family}))
                family_of[state] = family
    return TextEnv(tasks=tasks, seed_cases=seeds, family_of=family_of)


@dataclasses.dataclass(frozen=True)
class Judged:
    reward: float
    reason: str


class ExactJudge:
    """Exact match after stripping whitespace: reward 1.0 or 0.0."""

    def __call__(self, task: Task, output: str) -> Judged:
        ok = output.strip() in task.answers
        return Judged(reward=1.0 if ok else 0.0, reason="exact match" if ok else "no exact match")

    def __repr__(self) -> str:
        return "ExactJudge()"


class HashingEncoder:
    """A deterministic bag-of-words encoder (hashed tokens + bigrams, unit norm): no model, instant."""

    def __init__(self, dim: int = 64):
        self.dim = dim

    def _one(self, text: str) -> np.ndarray:
        tokens = re.findall(r"[a-z]+", text.lower())
        grams = tokens + [f"{a}_{b}" for a, b in zip(tokens, tokens[1:])]
        v = np.zeros(self.dim, dtype=np.float64)
        for gram in grams:
            h = int.from_bytes(hashlib.sha256(gram.encode()).digest()[:8], "little")
            v[h % self.dim] += 1.0 if (h >> 32) & 1 else -1.0
        norm = np.linalg.norm(v)
        return (v / norm if norm else np.eye(self.dim)[0]).astype(np.float32)

    def encode(self, texts: str | Sequence[str], **_: object) -> np.ndarray:
        if isinstance(texts, str):
            return self._one(texts)
        return np.stack([self._one(t) for t in texts]) if len(texts) else np.zeros((0, self.dim), np.float32)

    def __repr__(self) -> str:
        return f"HashingEncoder(dim={self.dim})"


def small_selector(root: Path) -> Path:
    """A small real selector artifact at ``root/selector`` (k = 3, warm-up 1) over a Flat bank of the text env's seed
    cases at ``root/bank``, encoded with :class:`HashingEncoder` (load it with ``encoder=HashingEncoder()``)."""
    from memento.bank import CaseBank
    from memento.selector.export import create_selector

    env, encoder = make_env(), HashingEncoder()
    with CaseBank.create(root / "bank", encoder.dim, index="Flat") as bank:
        bank.add(env.seed_cases, encoder.encode([c.state for c in env.seed_cases]))
    return create_selector(root / "bank", root / "selector", k=3, warmup=1)


def soft_q_run(out: Path, *, steps: int) -> Path:
    """A tiny real run of the online loop at ``out`` (``steps`` tasks, K = 2 of C = 6, no shuffle, soft-Q with
    warm-up 2, no checkpoints or TensorBoard): the logged run the OPE and bank-name tests evaluate."""
    from memento.policies import loop_policy, make_policy
    from memento.runs.qa import LoopConfig, run_online

    env = make_env()
    config = LoopConfig(steps=steps, k=2, candidates=6, shuffle=False, tensorboard=False, checkpoint_every=0, seed=0,
                        policy=dataclasses.replace(loop_policy("soft_q"), warmup=2))
    run_online(config, make_policy=make_policy, encoder=HashingEncoder(), planner=env.planner(), judge=ExactJudge(),
               tasks=env.tasks, seed_cases=env.seed_cases, out_dir=out)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tests.loop_env OUT_DIR CONFIG_JSON [--resume] [--delay S]``: one online run on this env."""
    import argparse

    from memento.config import from_dict
    from memento.policies import make_policy
    from memento.runs.qa import LoopConfig, run_online

    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("config", help="LoopConfig as JSON")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds each planner call sleeps")
    args = parser.parse_args(argv)
    env = make_env()
    config = from_dict(LoopConfig, json.loads(args.config))
    run_online(config, make_policy=make_policy, encoder=HashingEncoder(), planner=env.planner(args.delay),
               judge=ExactJudge(), tasks=env.tasks, seed_cases=env.seed_cases, out_dir=Path(args.out),
               resume=args.resume)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
