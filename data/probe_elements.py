"""A small LLM probe of ``elements-real`` (the "Probe" section of its card; not run by the build or the tests).

    .venv/bin/python data/probe_elements.py            # 40 test tasks, K=4, one CPU thread, a few minutes

On the first ``--tasks`` test tasks (file order), Gemma 3 270M (``memento.planners.HFPlanner.default()``,
greedy, the default few-shot prompt) answers with K seed cases chosen two ways, judged by
``memento.judges.ExactMatchJudge``:

- ``cosine``: the K seed cases nearest to the question by cosine similarity of all-MiniLM-L6-v2 embeddings
  (``memento.Encoder.from_pretrained()``), as a similarity retriever over the whole bank would show them;
- ``same attribute``: the K seed cases of the task's attribute (all about other elements), the nearest by cosine.

It also prints how the encoder ranks the bank: the share of the cosine top-K about the task's element and of
its attribute, for the questions as shipped and with the element's context ("<Name>. Origin of the name: ...")
removed from every question.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

import numpy as np
import torch

from memento import Encoder
from memento.envs.tasks import load_suite, seed_cases
from memento.judges import ExactMatchJudge
from memento.planners import HFPlanner
from memento.types import Case, Task


def _builder():
    spec = importlib.util.spec_from_file_location("build_elements_suite",
                                                  Path(__file__).resolve().with_name("build_elements_suite.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def rank_stats(sim_TC: np.ndarray, tasks: list[Task], cases: list[Case], k: int, symbol_of) -> tuple[float, float]:
    same_element = same_family = 0
    for t, task in enumerate(tasks):
        top = np.argsort(-sim_TC[t], kind="stable")[:k]
        same_element += sum(symbol_of(cases[i].meta["task_id"]) == symbol_of(task.id) for i in top)
        same_family += sum(cases[i].meta["family"] == task.family for i in top)
    return same_element / (k * len(tasks)), same_family / (k * len(tasks))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=40)
    parser.add_argument("-k", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    builder = _builder()
    symbol_of = builder.symbol_of
    all_test, cases = load_suite("elements-real", "test"), seed_cases("elements-real")
    tasks = all_test[: args.tasks]
    held = builder.bank_view(cases)
    in_bank = [symbol_of(t.id) in held for t in tasks]

    encoder = Encoder.from_pretrained(use_cache=False)
    case_ND = encoder.encode([c.state for c in cases], normalize=True)
    test_ND = encoder.encode([t.question for t in all_test], normalize=True)
    sim_TC = test_ND @ case_ND.T
    bankfile = [i for i, t in enumerate(all_test) if symbol_of(t.id) in held]
    bank_tasks = [all_test[i] for i in bankfile]
    el, fa = rank_stats(sim_TC[bankfile], bank_tasks, cases, args.k, symbol_of)
    bare_case = encoder.encode([bare_question(builder, c.meta["family"], c.state) for c in cases], normalize=True)
    bare_test = encoder.encode([bare_question(builder, str(t.family), t.question) for t in bank_tasks], normalize=True)
    el0, fa0 = rank_stats(bare_test @ bare_case.T, bank_tasks, cases, args.k, symbol_of)
    print(f"encoder top-{args.k} on the {len(bank_tasks)} test tasks about a bank element: same element {el:.0%}, "
          f"same attribute {fa:.0%}; without the context: same element {el0:.0%}, same attribute {fa0:.0%}")

    first = {t.id: i for i, t in enumerate(all_test)}
    chosen: dict[str, list[list[Case]]] = {"cosine": [], "same attribute": []}
    for task in tasks:
        sims = sim_TC[first[task.id]]
        order = np.argsort(-sims, kind="stable")
        chosen["cosine"].append([cases[i] for i in order[: args.k]])
        same = [i for i in order if cases[i].meta["family"] == task.family and
                symbol_of(cases[i].meta["task_id"]) != symbol_of(task.id)]
        chosen["same attribute"].append([cases[i] for i in same[: args.k]])

    planner = HFPlanner.default(device="cpu")
    judge = ExactMatchJudge()
    for name, case_lists in chosen.items():
        start = time.perf_counter()
        outputs = planner.plan_many(tasks, case_lists)
        rewards = [judge(task, out.text).reward for task, out in zip(tasks, outputs)]
        bank_rewards = [r for r, b in zip(rewards, in_bank) if b]
        print(f"{name}: success {sum(rewards):g}/{len(tasks)} = {np.mean(rewards):.0%}; on the {len(bank_rewards)} "
              f"about a bank element {sum(bank_rewards):g}/{len(bank_rewards)}; {time.perf_counter() - start:.0f} s")
        for task, out, r in list(zip(tasks, outputs, rewards))[:6]:
            print(f"    {task.id}: {out.text!r} (want {task.answers[0]!r}) -> {r:g}")
    return 0


def bare_question(builder, family: str, question: str) -> str:
    """The phrasing that ends ``question`` (which opens with "<Name>. Origin of the name: ...")."""
    subject = question.split(".", 1)[0].lower()
    for template in builder.TEMPLATES[family]:
        text = template.format(s=subject)
        if question.endswith(" " + text):
            return text
    raise ValueError(f"no phrasing of {family} ends {question!r}")


if __name__ == "__main__":
    raise SystemExit(main())
