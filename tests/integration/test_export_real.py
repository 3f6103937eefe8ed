"""Exported selectors in fresh processes: no Lightning, no LLM client, no web stack; the real text encoder.

- a subprocess that refuses to import Lightning, ``training``, LLM clients (``openai``, ``anthropic``,
  ``memento.planners``), FastAPI, uvicorn and MCP loads an artifact, selects, records feedback, learns and
  saves again;
- a soft-Q run with the real all-MiniLM-L6-v2 encoder is exported and, in such a subprocess,
  ``memento.load_selector(OUT).select("What is the capital of Peru?", k=4)`` returns 4 cases with
  probabilities, the same as the run's own policy would choose for that text (the issue's check, on a
  small run instead of ``make demo``'s).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from memento.policies import SoftQConfig, make_policy
from memento.runs.qa import LoopConfig, run_online
from memento.selector.export import export_selector, load_selector, verify
from tests.fuzzing import record
from tests.loop_env import ExactJudge, HashingEncoder, make_env

ROOT = Path(__file__).resolve().parents[2]
BLOCKED = ("lightning", "pytorch_lightning", "lightning_fabric", "training", "openai", "anthropic", "fastapi",
           "uvicorn", "starlette", "mcp", "memento.planners", "memento.serve.app", "memento.serve.http",
           "memento.serve.mcp")

_DRIVER = """
import importlib.abc, json, sys
BLOCKED = {blocked!r}

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in BLOCKED):
            raise ImportError("blocked in this test: " + name)
        return None

sys.meta_path.insert(0, Block())
import numpy as np
import memento

args = json.loads(sys.argv[1])
selector = memento.load_selector(args["path"], learn=args["learn"], seed=0)
query = args["query"] if isinstance(args["query"], str) else np.asarray(args["query"], dtype=np.float32)
result = selector.select(query, k=4)
out = {{"ids": list(result.ids), "probs": list(result.probs), "set_prob": result.set_prob}}
if args["learn"]:
    out["feedback"] = selector.feedback(result.selection_id, 1.0)
    selector.save()
out["stats"] = selector.stats()
selector.close()
tops = {{m.split(".")[0] for m in sys.modules}}
out["imported"] = sorted(tops | {{m for m in sys.modules if m.startswith("memento.")}})
print(json.dumps(out))
"""


def _run_blocked(path: Path, query: str | list[float], *, learn: bool) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", _DRIVER.format(blocked=BLOCKED),
                           json.dumps({"path": str(path), "query": query, "learn": learn})],
                          capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not [m for m in result["imported"] if m in BLOCKED], result["imported"]
    return result


@pytest.fixture(scope="module")
def hashing_artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    env = make_env()
    out = tmp_path_factory.mktemp("hashing")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run_online(LoopConfig(steps=30, checkpoint_every=0, tensorboard=False, policy=SoftQConfig(warmup=4)),
                   make_policy=make_policy, encoder=HashingEncoder(),
                   planner=env.planner(), judge=ExactJudge(), tasks=env.tasks, seed_cases=env.seed_cases,
                   out_dir=out / "run")
    finally:
        torch.set_num_threads(threads)
    return export_selector(out / "run", out / "selector")


@pytest.mark.slow
def test_load_select_learn_save_without_lightning_or_llm_clients(hashing_artifact: Path, tmp_path: Path) -> None:
    import shutil

    hashing_artifact = Path(shutil.copytree(hashing_artifact, tmp_path / "selector"))  # this test writes to it
    query = HashingEncoder().encode("In geography class, what is the capital city of Peru?")
    with load_selector(hashing_artifact, seed=0) as selector:
        expected = selector.select(query, k=4)
        updates = selector.stats()["updates"]
    result = _run_blocked(hashing_artifact, query.tolist(), learn=True)
    assert result["ids"] == list(expected.ids)
    np.testing.assert_allclose(result["probs"], expected.probs, rtol=1e-9)
    assert result["feedback"]["recorded"] is True and result["feedback"]["updates"] == updates + 1
    assert "transformers" not in result["imported"]  # a vector query loads no text model
    report = verify(hashing_artifact)
    assert report["feedbacks"] == 1 and report["feedbacks_since_save"] == 0


@pytest.mark.slow
def test_real_encoder_text_query_in_a_fresh_process(encoder, tmp_path: Path) -> None:
    from memento.bank import CaseBank
    from memento.learn.learner import SoftQLearner
    from memento.policies import SoftQPolicy

    env = make_env()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run_online(LoopConfig(steps=24, checkpoint_every=0, tensorboard=False, policy=SoftQConfig(warmup=4)),
                   make_policy=make_policy, encoder=encoder,
                   planner=env.planner(), judge=ExactJudge(), tasks=env.tasks, seed_cases=env.seed_cases,
                   out_dir=tmp_path / "run")
    finally:
        torch.set_num_threads(threads)
    out = export_selector(tmp_path / "run", tmp_path / "selector")
    spec = json.loads((out / "encoder.json").read_text())
    assert spec["kind"] == "transformers" and spec["dim"] == 384 and spec["pooling"] == "avg"
    assert spec["model_id"] == "sentence-transformers/all-MiniLM-L6-v2" and spec["model"] is None

    question = "What is the capital of Peru?"
    result = _run_blocked(out, question, learn=False)
    assert len(result["ids"]) == 4 and len(set(result["ids"])) == 4
    assert all(0.0 < p <= 1.0 for p in result["probs"]) and 0.0 < result["set_prob"] <= 1.0
    assert "transformers" in result["imported"]

    learner = SoftQLearner.load(tmp_path / "run" / "selector", device="cpu")
    policy = SoftQPolicy(learner.qnet, alpha=learner.alpha)
    with CaseBank.open(tmp_path / "run" / "bank") as bank:
        state = encoder.encode(question)
        expected = policy.select(state, bank.candidates(state, 32), 4, rng=np.random.default_rng(0))
    assert result["ids"] == list(expected.ids)
    np.testing.assert_allclose(result["probs"], expected.probs_K, rtol=1e-5)


@pytest.mark.gpu
def test_a_selector_learns_on_cuda_and_reloads_on_the_cpu(hashing_artifact: Path, tmp_path: Path) -> None:
    import shutil

    artifact = Path(shutil.copytree(hashing_artifact, tmp_path / "selector"))
    queries = HashingEncoder().encode([task.question for task in make_env().tasks[:8]])
    with load_selector(artifact, device="cuda", learn=True) as selector:
        assert next(selector.learner.qnet.parameters()).is_cuda
        for q in queries:
            result = selector.select(q, k=4)
            assert len(result) == 4
            selector.feedback(result.selection_id, 1.0)
        updates = selector.stats()["updates"]
        weights = {k: v.detach().cpu() for k, v in selector.learner.qnet.state_dict().items()}
        selector.save()
    with load_selector(artifact, device="cpu") as selector:
        assert selector.stats()["updates"] == updates and selector.stats()["feedbacks_since_save"] == 0
        for name, value in selector.learner.qnet.state_dict().items():
            assert torch.equal(value, weights[name]), name


_KILL_DRIVER = """
import json, sys
import numpy as np
import memento
from tests.loop_env import HashingEncoder, make_env

selector = memento.load_selector(sys.argv[1], learn=True)
queries = HashingEncoder().encode([task.question for task in make_env().tasks])
print("ready", selector.stats()["updates"], flush=True)
for i in range(100000):
    result = selector.select(queries[i % len(queries)], k=4)
    answer = selector.feedback(result.selection_id, float(i % 2))
    if i % 7 == 0:
        selector.add_case(f"case added at {i}", "x", 1.0, embedding=queries[i % len(queries)])
    print("ack", i + 1, answer["updates"], flush=True)
"""


@pytest.mark.slow
@pytest.mark.probe
def test_sigkill_loses_no_acknowledged_feedback(hashing_artifact: Path, tmp_path: Path) -> None:
    import shutil
    import signal

    artifact = Path(shutil.copytree(hashing_artifact, tmp_path / "selector"))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", _KILL_DRIVER, str(artifact)], stdout=subprocess.PIPE, text=True,
                            cwd=ROOT, env=env)
    assert proc.stdout is not None
    acked, updates = 0, 0
    try:
        for line in proc.stdout:
            if line.startswith("ack"):
                _, acked_text, updates_text = line.split()
                acked, updates = int(acked_text), int(updates_text)
                if acked >= 60:
                    break
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    assert acked >= 60
    record(__name__, "kills")
    report = verify(artifact)  # appended rows only: the saved content is intact
    record(__name__, "lost", max(0, acked - report["feedbacks"]))
    assert report["feedbacks"] >= acked and report["feedbacks_since_save"] == report["feedbacks"]
    with load_selector(artifact, learn=True) as selector:
        stats = selector.stats()
        assert stats["feedbacks"] >= acked and stats["updates"] >= updates
        assert stats["cases_since_save"] >= (acked - 1) // 7 + 1
        selector.save()
    assert verify(artifact)["feedbacks_since_save"] == 0
