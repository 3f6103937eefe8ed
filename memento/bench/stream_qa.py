"""``memento bench stream`` on a question-answering suite: the question families as a stream of environments.

The same protocol as the game stream (:mod:`memento.bench.stream`), with the online loop
(:class:`memento.runs.qa.OnlineLoop`) in place of the game loop:

- the **environments** are the suite's question families (``StreamBenchConfig.envs``; all of them when empty),
  each with its first ``train_per_env`` train questions and its first ``test_per_env`` test questions (file
  order; never tuned);
- an arm **trains** on the stream: one online run over the stream's questions in order (one LLM call each),
  starting from the suite's **seed bank** (``cases.jsonl``, ``StreamBenchConfig.seed_bank``; an empty bank for
  a suite without one or with ``seed_bank=False``), learning from the exact-match judge's reward and retaining
  every answer (with a seed bank, stored with its own outcome under the lenient ``contains`` judge, as the seed
  bank's rewards were: the realistic bank of ``facts-real``; otherwise with the exact-match reward), building
  the arm's memory items from the run's own answers (LifeMem does not cluster the seed cases), learning
  (soft-Q); at each family's learned point the run pauses and the family's test questions are answered with
  the bank and the policy of that moment, **frozen** (no retention, no building, no learning:
  ``LoopConfig.learn = False``; soft-Q starts from the train run's Q-network and still samples); after the
  stream every family's test questions are answered again;
- ``none`` shows no case at all (no bank);
- a family's score is the success rate under exact match (the mean reward); OP, BwT and the final success are
  :func:`memento.runs.lifelong.lifelong_metrics` of those, as for games.

The arms (``none``, ``similarity``, ``cfgm``, ``lifemem``, ``soft_q-all``, and ``plugmem``, ``soft_q-every``
when named) are the game stream's, with the online loop's policies (similarity: positive-only, Memento's
non-parametric client; soft-Q: the loop's default, anchored on cosine, with case features that include the
kind). The memory systems in question answering have no key-information reflection and no retries
(:class:`memento.runs.qa.LoopConfig`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from memento.bench.games import frozen_policy
from memento.bench.stream_arms import finished_or_cleared, learned_and_final, per_call, stream_arm
from memento.errors import ConfigError
from memento.runs.lifelong import lifelong_metrics
from memento.types import Case, Task

__all__ = ["qa_seed_cases", "qa_stream_tasks", "run_qa_arm"]


def qa_stream_tasks(suite: str, envs: tuple[str, ...], train_per_env: int,
                    test_per_env: int) -> tuple[dict[str, list[Task]], dict[str, list[Task]]]:
    """Per family: the first ``train_per_env`` train and ``test_per_env`` test questions of ``suite``."""
    from memento.envs.tasks import load_suite
    from memento.runs.qa import task_env

    train: dict[str, list[Task]] = {}
    test: dict[str, list[Task]] = {}
    for split, out, limit in (("train", train, train_per_env), ("test", test, test_per_env)):
        for task in load_suite(suite, split):  # type: ignore[arg-type]
            family = task_env(task)
            if envs and family not in envs:
                continue
            rows = out.setdefault(family, [])
            if len(rows) < limit:
                rows.append(task)
    unknown = sorted(set(envs) - set(train))
    if unknown:
        raise ConfigError(f"suite {suite!r} has no train questions of the family(ies) {unknown}; it has "
                          f"{sorted({task_env(t) for t in load_suite(suite, 'train')})}")
    missing = sorted(set(train) - set(test))
    if missing:
        raise ConfigError(f"family(ies) {missing} of suite {suite!r} have train questions but no test question")
    return train, test


def qa_seed_cases(suite: str) -> list[Case]:
    """The suite's seed cases (``cases.jsonl``), or ``[]`` when it ships none."""
    from memento.envs.tasks import seed_cases, suite_dir

    return seed_cases(suite) if (suite_dir(suite) / "cases.jsonl").is_file() else []


def _loop_config(config: Any, arm: str, seed: int) -> tuple[bool, Any]:
    from memento.runs.qa import LoopConfig

    memory, policy, systems = stream_arm(arm, questions=True)
    return memory, LoopConfig(k=config.k, candidates=config.candidates, policy=policy, systems=systems, seed=seed,
                              shuffle=False, checkpoint_every=0, tensorboard=False, window=10)


def _eval(config: Any, base: Any, out_dir: Path, tests: list[Task], bank_dir: Path | None, selector: Path | None,
          run_online: Any, common: dict[str, Any]) -> dict[str, Any]:
    common = {k: v for k, v in common.items() if k != "retain_judge"}  # nothing is retained
    finished = finished_or_cleared(out_dir, resume=config.resume)
    if finished is not None:
        return finished
    eval_cfg = dataclasses.replace(base, steps=len(tests), retain=False, learn=False,
                                   systems=dataclasses.replace(base.systems, build=()),
                                   policy=frozen_policy(base.policy, selector) if selector else base.policy)
    return run_online(eval_cfg, out_dir=out_dir, tasks=tests, bank_dir=bank_dir, **common)


def run_qa_arm(config: Any, arm: str, seed: int, run_root: Path, stream: list[tuple[str, Task]],
               points: dict[str, int], test_by_env: dict[str, list[Task]], common: dict[str, Any], *,
               seed_cases: list[Case] | None = None) -> dict[str, Any]:
    """One arm of one seed and order (see the module docstring): its entry in the results."""
    from memento.runs.qa import run_online

    memory, base = _loop_config(config, arm, seed)
    tasks = [task for _, task in stream]

    def train(end: int, train_dir: Path, resume: bool) -> dict[str, Any]:
        return run_online(dataclasses.replace(base, steps=end + 1), out_dir=train_dir, tasks=tasks, resume=resume,
                          seed_cases=seed_cases or None, **common)

    def evaluate(out_dir: Path, tests: list[Task], bank_dir: Path | None, selector: Path | None) -> dict[str, Any]:
        return _eval(config, base, out_dir, tests, bank_dir, selector, run_online, common)

    learned_s, final_s, train_summary = learned_and_final(run_root, points, test_by_env, resume=config.resume,
                                                          memory=memory, train=train, evaluate=evaluate)
    learned = {env: summary["success_rate"] for env, summary in learned_s.items()}
    final = {env: summary["success_rate"] for env, summary in final_s.items()}
    metrics = lifelong_metrics(learned, final)
    entry = {"op": metrics["op"], "bwt": metrics["bwt"], "bwt_abs": metrics["bwt_abs"],
             "n_undefined": metrics["n_undefined"], "per_env": metrics["per_env"],
             "final_success": metrics["op"], "learned_success": sum(learned.values()) / len(learned),
             "stream": [f"{env}:{task.id}" for env, task in stream],
             # the final evaluations' prompt tokens per answer (the questions are the same for every arm, so the
             # differences between arms are the memory shown; 0 for a planner that reports no token counts)
             "prompt_tokens_per_call": per_call(final_s, "prompt_tokens", "llm_calls"),
             # the memory part of those prompts (cases and notes, words: memento.systems.items.memory_tokens)
             "memory_tokens_per_call": per_call(final_s, "memory_tokens", "llm_calls")}
    if train_summary is not None:
        entry["train"] = {k: train_summary.get(k) for k in ("success_rate", "bank_size_end", "wall_s", "updates",
                                                               "llm_calls", "prompt_tokens", "systems")}
    return entry
