"""A process that opens a bank and selects with a Q-network imports no heavy module it does not need (issue 41).

Run in a fresh interpreter: ``sys.modules`` of this one holds whatever other tests imported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import memento

ROOT = Path(memento.__file__).resolve().parents[1]

HEAVY = ("sympy", "torch._dynamo", "pandas", "transformers", "sentence_transformers", "fastapi", "uvicorn", "pydantic",
         "sklearn", "scipy", "matplotlib", "tensorboard", "lightning", "ray", "pymilvus")

SCRIPT = """
import json, sys, tempfile
import numpy as np
from memento.config import QNetConfig
from memento.learn.policy import boltzmann_select, q_values
from memento.learn.qnet import build_qnet
from memento.bank import CaseBank
from memento.types import Case

d = 8
with tempfile.TemporaryDirectory() as root:
    bank = CaseBank.create(root + "/bank", d, index="Flat", vectors="disk")
    rng = np.random.default_rng(0)
    v = rng.standard_normal((20, d)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    bank.add([Case(state=f"s{i}", action=f"a{i}", reward=1.0) for i in range(20)], v)
    net = build_qnet(QNetConfig(dim=d, hidden=16)).eval()
    for i in range(3):
        candidates = bank.candidates(v[i], 8)
        boltzmann_select(q_values(net, v[i], candidates), candidates, 2, 1.0, rng=rng)
    bank.close()
print(json.dumps(sorted(name for name in sys.modules if name.split(".")[0] in {h.split(".")[0] for h in HEAVY})))
"""


def test_selecting_with_a_qnetwork_imports_no_heavy_module() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", f"HEAVY = {HEAVY!r}\n{SCRIPT}"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300, check=True)
    loaded = set(json.loads(out.stdout.strip().splitlines()[-1]))
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))
