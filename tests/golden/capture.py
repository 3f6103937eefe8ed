"""Capture seeded outputs of the online loop, the regret run and a served selector.

``python -m tests.golden.capture OUT.json`` writes what ``tests/unit/test_golden.py`` compares against
``tests/golden/golden.json``: made once from commit 86025c1 (before the structural step of issue 10, with that
commit's flat ``LoopConfig``/``RegretConfig`` fields; this script now spells the same settings in the nested
configs), so a refactor that changes any seeded number, choice or file shows up as a diff.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

VOLATILE = ("time", "ms")
ADDED_SINCE = ("candidate_probs",)  # fields the records gained after the golden file was written


def _steps(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        for key in VOLATILE + ADDED_SINCE:
            record.pop(key, None)
        out.append(record)
    return out


def _dense_replay(tensors: dict[str, Any]) -> dict[str, Any]:
    """A replay save of format 2 or 3 (row indices into vector tables; format 3 adds the cases' bank positions,
    their identities, dropped here) as format 1 stored it (one vector per slot), so the digest checks the
    decisions themselves, whatever the layout."""
    if "states_VD" not in tensors:
        return tensors
    for name in ("case_pos_NK", "next_pos_NC"):
        tensors.pop(name, None)
    tables = {"state": tensors.pop("states_VD"), "cases": tensors.pop("cases_VE")}
    dense = {"state_ix_N": ("state_ND", "state"), "next_state_ix_N": ("next_state_ND", "state"),
             "cases_ix_NK": ("cases_NKD", "cases"), "next_cands_ix_NC": ("next_cands_NCD", "cases")}
    for ix_name, (name, table) in dense.items():
        if ix_name in tensors:
            tensors[name] = tables[table][tensors.pop(ix_name)]
    return tensors


def _tensor_digest(directory: Path) -> str:
    from safetensors.torch import load_file

    digest = hashlib.sha256()
    for file in sorted(directory.rglob("*.safetensors")):
        tensors = _dense_replay(load_file(str(file)))
        for name in sorted(tensors):
            digest.update(f"{file.relative_to(directory)}:{name}".encode())
            digest.update(tensors[name].contiguous().numpy().tobytes())
    return digest.hexdigest()


def online_runs(root: Path) -> dict[str, Any]:
    from memento.config import LearnerConfig
    from memento.policies import LinUCBConfig, RandomConfig, SimilarityConfig, SoftQConfig, make_policy
    from memento.runs.qa import LoopConfig, run_online
    from tests.loop_env import ExactJudge, HashingEncoder, make_env

    env = make_env()
    variants: dict[str, LoopConfig] = {
        "soft_q": LoopConfig(steps=30, policy=SoftQConfig(warmup=4), window=10, checkpoint_every=10,
                             tensorboard=False),
        "soft_q_positive_b2": LoopConfig(steps=30, window=10, checkpoint_every=0, tensorboard=False, batch_size=2,
                                         seed=3, policy=SoftQConfig(warmup=4, positive_only=True, learner=LearnerConfig(
                                             gamma=0.0, lr=1e-2, batch_size=16, alpha=0.5))),
        "similarity": LoopConfig(steps=30, policy=SimilarityConfig(positive_only=True), window=10, tensorboard=False),
        "random": LoopConfig(steps=30, policy=RandomConfig(), window=10, tensorboard=False, seed=1),
        "linucb": LoopConfig(steps=30, policy=LinUCBConfig(), window=10, tensorboard=False, checkpoint_every=10),
    }
    out: dict[str, Any] = {}
    for name, config in variants.items():
        run = root / name
        summary = run_online(config, make_policy=make_policy, encoder=HashingEncoder(), planner=env.planner(),
                             judge=ExactJudge(), tasks=env.tasks, seed_cases=env.seed_cases, out_dir=run)
        out[name] = {
            "steps": _steps(run / "steps.jsonl"),
            "summary": {k: summary[k] for k in ("success_rate", "updates", "final_alpha", "bank_size_end",
                                                 "retained", "duplicates", "cumulative_reward")},
            "tensors": _tensor_digest(run / "checkpoint"),
        }
    return out


def regret_runs(root: Path) -> dict[str, Any]:
    import dataclasses

    from memento.envs.synthetic import SyntheticBandit, SyntheticBanditConfig
    from memento.policies import make_policy, regret_policy
    from memento.runs.regret import RegretConfig, run_regret

    out: dict[str, Any] = {}
    for policy in ("soft_q", "linucb", "similarity", "random"):
        env = SyntheticBandit(SyntheticBanditConfig(seed=0))
        config = regret_policy(policy)
        if policy == "soft_q":
            config = dataclasses.replace(config, warmup=10)
        result = run_regret(env, RegretConfig(steps=120, policy=config), make_policy=make_policy,
                            workdir=root / policy)
        out[policy] = {"regret_T": [round(float(x), 12) for x in result.regret_T],
                       "reward_T": [float(x) for x in result.reward_T], "updates": result.updates,
                       "final_alpha": result.final_alpha}
    return out


def selector_run(root: Path) -> dict[str, Any]:
    from memento.policies import SoftQConfig, make_policy
    from memento.runs.qa import LoopConfig, run_online
    from memento.selector.export import export_selector, load_selector
    from tests.loop_env import ExactJudge, HashingEncoder, make_env

    env = make_env()
    run = root / "sel-run"
    run_online(LoopConfig(steps=20, policy=SoftQConfig(warmup=4), window=10, tensorboard=False),
               make_policy=make_policy, encoder=HashingEncoder(),
               planner=env.planner(), judge=ExactJudge(), tasks=env.tasks, seed_cases=env.seed_cases, out_dir=run)
    art = export_selector(run, root / "artifact")
    encoder = HashingEncoder()
    picks = []
    with load_selector(art, learn=True, seed=5, encoder=encoder) as selector:
        for i, task in enumerate(env.tasks[:12]):
            result = selector.select(task.question, k=4)
            picks.append({"ids": list(result.ids), "probs": [round(p, 10) for p in result.probs],
                          "version": result.policy_version})
            selector.feedback(result.selection_id, reward=float(i % 3 == 0))
        updates = selector.learner.updates
    files = sorted(str(p.relative_to(art)) for p in art.rglob("*")  # not the service's pending selections
                   if p.is_file() and not p.name.startswith(".pending.sqlite"))
    return {"picks": picks, "updates": updates, "files": files}


def capture() -> dict[str, Any]:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        return {"online": online_runs(root / "online"), "regret": regret_runs(root / "regret"),
                "selector": selector_run(root / "selector")}


def main(argv: list[str]) -> int:
    result = capture()
    Path(argv[0]).write_text(json.dumps(result, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":  # pragma: no cover
    np.seterr(all="ignore")
    sys.exit(main(sys.argv[1:]))
