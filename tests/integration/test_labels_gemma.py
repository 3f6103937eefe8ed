"""Planner-scored labels with the real Gemma 3 270M and the real MiniLM encoder, then a short listwise fit.

Five facts-real train tasks, C = 4 cosine candidates from the suite's seed bank: 20 scored prompts. The
labels must be the planner's own scores (one candidate re-scored directly gives the same number), and
`train_q` must fit 2 epochs on them and leave a loadable selector.
"""

from __future__ import annotations

import json
import math

import pytest

from memento.bank import CaseBank
from memento.config import EncoderConfig, LearnerConfig, QNetConfig
from memento.envs.tasks import load_suite, seed_cases
from memento.learn.labels import read_labels
from memento.learn.learner import SoftQLearner
from memento.planners import HFPlanner
from memento.runs.labels import LabelConfig, label_tasks, summary_path
from memento.training.config import DataConfig, LightningConfig, TrainConfig, TrainerConfig
from memento.training.run import train_q

pytestmark = pytest.mark.slow


def test_gemma_labels_five_facts_real_tasks_and_train_two_epochs(tmp_path, encoder):
    cases = seed_cases("facts-real")
    with CaseBank.create(tmp_path / "bank", encoder.dim, encoder=EncoderConfig()) as bank:
        bank.add(cases, encoder.encode([c.state for c in cases]))
    tasks = load_suite("facts-real", "train")[:5]
    planner = HFPlanner.default(device="cpu")
    labels = tmp_path / "labels.jsonl"
    with CaseBank.open(tmp_path / "bank") as bank:
        summary = label_tasks(tasks, bank, encoder, planner, LabelConfig(candidates=4, batch_size=5), labels)
        rows = read_labels(labels)
        assert [r.task_id for r in rows] == [t.id for t in tasks]
        assert summary["forward_passes"] == 20 and summary["rows"] == 5 and summary["set_passes"] == 0
        assert summary["s_per_forward"] > 0 and summary["prompt"] == "few_shot"
        assert json.loads(summary_path(labels).read_text())["forward_passes"] == 20
        for row in rows:
            assert row.n_candidates == 4 and all(math.isfinite(x) and x < 0 for x in row.logprob)
            assert row.mean_logprob == pytest.approx([lp / n for lp, n in zip(row.logprob, row.n_tokens)])
        # a label is the planner's score of that one-case prompt
        direct = planner.score(tasks[0], [[bank.get(rows[0].candidate_ids[2])]])[0]
        assert rows[0].logprob[2] == pytest.approx(direct.logprob, abs=1e-4)
    print(f"gemma labels: {summary['forward_passes']} scored prompts in {summary['wall_s']:.1f} s wall, "
          f"{summary['s_per_forward']:.3f} s each (mean prompt {summary['prompt_tokens_mean']:.0f} tokens)")

    config = TrainConfig(
        data=DataConfig(source="labels", labels=str(labels), bank=str(tmp_path / "bank")),
        qnet=QNetConfig(arch="mlp_interact", dim=encoder.dim, hidden=64, anchor="cosine"),
        learner=LearnerConfig(batch_size=2),
        trainer=TrainerConfig(lightning=LightningConfig(accelerator="cpu"), max_epochs=2, patience=0,
                              progress_bar=False))
    result = train_q(config, tmp_path / "run", encoder=encoder)
    assert result["epochs"] == 2 and result["global_step"] >= 2
    assert math.isfinite(result["metrics"]["val/loss"]) and "val/hit@1" in result["metrics"]
    learner = SoftQLearner.load(tmp_path / "run" / "selector")
    assert learner.qnet.config.dim == encoder.dim
