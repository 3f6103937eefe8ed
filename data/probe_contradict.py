"""A small LLM probe of ``contradict-real``: which set of cases makes Gemma give the current answer (not run by the
build or the tests; docs/benchmarks.md, issue 39).

    .venv/bin/python data/probe_contradict.py            # 60 train tasks, a few minutes on 2 cores

On the first ``--tasks`` tasks of ``--split`` (file order; the train split, so that nothing is tuned on the test
split), Gemma 3 270M (``memento.planners.HFPlanner.default()``, greedy, the default few-shot prompt) answers with
the seed cases shown in six ways, judged by ``memento.judges.ExactMatchJudge``:

- ``current``: the thing's current case alone;
- ``current first`` / ``current last``: the current case before / after the three cosine-nearest cases of *other*
  things;
- ``current + stale`` / ``stale + current``: the current case and a stale one of the thing (the first in the bank),
  in either order;
- ``cosine top 4``: the four cases nearest to the question (all-MiniLM-L6-v2), as similarity retrieval shows them.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from memento import Encoder
from memento.envs.tasks import load_suite, seed_cases
from memento.judges import ExactMatchJudge
from memento.planners import HFPlanner


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=60, help="tasks probed (default: 60)")
    parser.add_argument("--split", default="train", choices=["train", "test"], help="split (default: train)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default: 2)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    tasks = load_suite("contradict-real", args.split)[:args.tasks]
    cases = seed_cases("contradict-real")
    encoder = Encoder.from_pretrained()
    case_ND = encoder.encode([c.state for c in cases])
    task_TD = encoder.encode([t.question for t in tasks])
    sets: dict[str, list[list]] = {name: [] for name in ("current", "current first", "current last",
                                                         "current + stale", "stale + current", "cosine top 4")}
    for task, q_D in zip(tasks, task_TD):
        thing = task.meta["thing"]
        current = next(c for c in cases if c.meta["thing"] == thing and c.meta["current"])
        stale = next(c for c in cases if c.meta["thing"] == thing and not c.meta["current"])
        order = np.argsort(-(case_ND @ q_D), kind="stable")
        others = [cases[i] for i in order if cases[i].meta["thing"] != thing][:3]
        sets["current"].append([current])
        sets["current first"].append([current, *others])
        sets["current last"].append([*others, current])
        sets["current + stale"].append([current, stale])
        sets["stale + current"].append([stale, current])
        sets["cosine top 4"].append([cases[i] for i in order[:4]])
    planner, judge = HFPlanner.default(), ExactMatchJudge()
    print(f"contradict-real/{args.split}, first {len(tasks)} tasks, {planner!r}")
    for name, shown in sets.items():
        t0 = time.perf_counter()
        outputs = planner.plan_many(tasks, shown)
        right = np.mean([judge(t, o.text).reward for t, o in zip(tasks, outputs)])
        print(f"{name:16s} exact match {right:.3f}  ({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
