"""Training from planner-scored labels: the listwise loss, the "labels" data source, fits on the CPU.

The loss is checked against a hand computation; a tiny fit on labels of known structure must make Q's top
candidate the labels' top candidate for most training tasks; seeded runs are identical; `memento score` then
`memento train --from-labels` runs end to end with the hashing encoder and a known-score planner.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from memento.bank import CaseBank
from memento.cli import entry as cli
from memento.cli import score as score_cli
from memento.config import CASE_SCALARS, LearnerConfig, QNetConfig
from memento.errors import ConfigError, DataFormatError
from memento.learn.learner import SoftQLearner
from memento.learn.listwise import ListwiseBatch, best_in_top_k, listwise_kl
from memento.planners.base import AnswerScore, CallablePlanner
from memento.runs.labels import LabelConfig, label_tasks
from memento.training.config import DataConfig, LightningConfig, TrainConfig, TrainerConfig
from memento.training.data import ListwiseDataset, QDataModule, TrainingData, load_labels
from memento.training.run import train_q
from memento.types import Case, Task
from tests.loop_env import HashingEncoder

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ---------------------------------------------------------------- the loss


def test_listwise_kl_against_a_hand_computation():
    q = [[1.0, 0.0, -1.0, 5.0], [2.0, 1.0, 0.0, 0.0], [3.0, 0.0, 0.0, 0.0]]
    s = [[0.0, -1.0, -2.0, 9.0], [-0.5, -0.5, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]
    mask = [[True, True, True, False], [True, True, False, False], [True, False, False, False]]
    alpha, tau = 0.5, 2.0

    def kl(q_row: list[float], s_row: list[float]) -> float:
        zq = sum(math.exp(x / alpha) for x in q_row)
        zs = sum(math.exp(x / tau) for x in s_row)
        p = [math.exp(x / tau) / zs for x in s_row]
        mu = [math.exp(x / alpha) / zq for x in q_row]
        return sum(pi * (math.log(pi) - math.log(mi)) for pi, mi in zip(p, mu))

    expected = [kl(q[0][:3], s[0][:3]), kl(q[1][:2], s[1][:2]), 0.0]
    q_BC = torch.tensor(q, dtype=torch.float64, requires_grad=True)
    loss, kl_B = listwise_kl(q_BC, torch.tensor(s, dtype=torch.float64), torch.tensor(mask), alpha=alpha, tau=tau)
    assert kl_B.tolist() == pytest.approx(expected, abs=1e-12)
    # the mean over the rows with >= 2 candidates: the 1-candidate row is left out
    assert float(loss.detach()) == pytest.approx((expected[0] + expected[1]) / 2, abs=1e-12)
    loss.backward()
    # d KL / d Q_i = (mu_i - p_i) / alpha, averaged over the 2 counted rows; padding and the single row get none
    row = q[0][:3]
    mu = np.exp(np.array(row) / alpha) / np.exp(np.array(row) / alpha).sum()
    p = np.exp(np.array(s[0][:3]) / tau) / np.exp(np.array(s[0][:3]) / tau).sum()
    assert q_BC.grad[0, :3].tolist() == pytest.approx(((mu - p) / alpha / 2).tolist(), abs=1e-12)
    assert q_BC.grad[0, 3] == 0 and q_BC.grad[2].abs().sum() == 0
    # the minimum: Q = alpha * score / tau + a constant per task
    q_star = torch.tensor(s, dtype=torch.float64) * alpha / tau + 3.0
    assert float(listwise_kl(q_star, torch.tensor(s), torch.tensor(mask), alpha=alpha, tau=tau)[0]) == pytest.approx(
        0.0, abs=1e-12)


def test_listwise_kl_edge_cases():
    empty = torch.zeros((2, 3), dtype=torch.bool)
    loss, kl_B = listwise_kl(torch.zeros(2, 3, requires_grad=True), torch.zeros(2, 3), empty, alpha=1.0, tau=1.0)
    assert float(loss.detach()) == 0.0 and kl_B.tolist() == [0.0, 0.0]
    loss.backward()  # differentiable even without a counted row
    with pytest.raises(ValueError, match="must be equal"):
        listwise_kl(torch.zeros(2, 3), torch.zeros(2, 4), empty, alpha=1.0, tau=1.0)
    with pytest.raises(ValueError, match="must be finite and > 0"):
        listwise_kl(torch.zeros(2, 3), torch.zeros(2, 3), empty, alpha=0.0, tau=1.0)


def test_best_in_top_k_known_answers():
    q = torch.tensor([[3.0, 2.0, 1.0], [1.0, 2.0, 3.0], [0.0, 5.0, 0.0], [1.0, 0.0, 9.0]])
    s = torch.tensor([[0.0, -1.0, -2.0], [0.0, -1.0, -2.0], [-1.0, -1.0, -3.0], [0.0, -1.0, 7.0]])
    mask = torch.tensor([[True] * 3, [True] * 3, [True] * 3, [True, True, False]])
    assert best_in_top_k(q, s, mask, 1).tolist() == [1.0, 0.0, 1.0, 1.0]  # ties: either best counts; padding ignored
    assert best_in_top_k(q, s, mask, 2).tolist() == [1.0, 0.0, 1.0, 1.0]
    assert best_in_top_k(q, s, mask, 3).tolist() == [1.0, 1.0, 1.0, 1.0]


# ---------------------------------------------------------------- a tiny fit on known labels


def known_labels(n_tasks: int = 40, n_cases: int = 60, c: int = 8, dim: int = 16, seed: int = 0) -> TrainingData:
    """Random unit vectors; a task's score of a candidate is a fixed weighted inner product with the state,
    unlike cosine (so learning must move away from similarity), and each task sees C random cases."""
    rng = np.random.default_rng(seed)

    def unit(n: int) -> np.ndarray:
        x = rng.normal(size=(n, dim)).astype(np.float32)
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    states, cases = unit(n_tasks), unit(n_cases)
    w = rng.normal(size=dim).astype(np.float32) * 3
    cases_nc = np.stack([rng.choice(n_cases, size=c, replace=False) for _ in range(n_tasks)])
    score_nc = np.einsum("nd,ncd,d->nc", states, cases[cases_nc], w).astype(np.float32)
    return TrainingData(states_SD=states, cases_MD=cases, state_texts=[f"task {i}" for i in range(n_tasks)],
                        case_keys=[f"c{i}" for i in range(n_cases)], state_N=np.arange(n_tasks), cases_NK=cases_nc,
                        mask_NK=np.ones((n_tasks, c), dtype=bool), reward_N=np.zeros(n_tasks, dtype=np.float32),
                        propensity_NK=np.ones((n_tasks, c), dtype=np.float32), done_N=np.ones(n_tasks, dtype=bool),
                        origins=[f"labels.jsonl:{i + 1}" for i in range(n_tasks)], source="labels",
                        score_NK=score_nc)


def _config(data: TrainingData, *, epochs: int = 60, seed: int = 0, tau: float = 1.0) -> TrainConfig:
    return TrainConfig(
        data=DataConfig(source="labels", labels="unused", bank="unused", tau=tau, split_seed=seed),
        qnet=QNetConfig(arch="mlp_interact", dim=data.dim, hidden=64, dropout=0.0, seed=seed),
        learner=LearnerConfig(batch_size=8, lr=1e-2, seed=seed),
        trainer=TrainerConfig(lightning=LightningConfig(accelerator="cpu"), max_epochs=epochs, patience=0,
                              progress_bar=False))


def test_a_tiny_fit_puts_the_labels_top_candidate_first(tmp_path):
    data = known_labels()
    summary = train_q(_config(data), tmp_path, data=data)
    learner = SoftQLearner.load(tmp_path / "selector")  # the selector format of today
    rows = np.arange(data.n_rows)
    dm = QDataModule(_config(data).data, batch_size=8, data=data)
    dm.setup("fit")
    train = dm.train_rows
    with torch.no_grad():
        q = learner.qnet.eval()(torch.from_numpy(data.states_SD[data.state_N[rows]]),
                                torch.from_numpy(data.cases_MD[data.cases_NK[rows]])).numpy()
    agree = (q.argmax(axis=1) == data.score_NK.argmax(axis=1))
    cosine = np.einsum("nd,ncd->nc", data.states_SD[data.state_N], data.cases_MD[data.cases_NK])
    assert agree[train].mean() >= 0.8, agree[train].mean()
    assert (cosine.argmax(axis=1) == data.score_NK.argmax(axis=1))[train].mean() < 0.5  # cosine does not know it
    metrics = summary["metrics"]
    assert {"val/loss", "val/hit@1", "val/hit@1_random", "val/hit@1_cosine", "val/ranking_states"} <= set(metrics)
    assert metrics["val/ranking_states"] == len(dm.val_rows)
    assert "val/auc" not in metrics and "val/ece" not in metrics  # no rewards here
    assert json.loads((tmp_path / "config.json").read_text())["data"]["source"] == "labels"


def test_seeded_fits_are_identical(tmp_path):
    data = known_labels(n_tasks=20)
    first = train_q(_config(data, epochs=3, seed=1), tmp_path / "a", data=data)
    second = train_q(_config(data, epochs=3, seed=1), tmp_path / "b", data=data)
    a, b = SoftQLearner.load(tmp_path / "a" / "selector"), SoftQLearner.load(tmp_path / "b" / "selector")
    for (name, x), (_, y) in zip(a.qnet.state_dict().items(), b.qnet.state_dict().items()):
        assert torch.equal(x, y), name
    assert first["metrics"] == second["metrics"]
    other = train_q(_config(data, epochs=3, seed=2), tmp_path / "c", data=data)
    assert other["metrics"]["val/loss"] != first["metrics"]["val/loss"]


def test_listwise_batches_and_config_checks():
    data = known_labels(n_tasks=10)
    dm = QDataModule(_config(data).data, batch_size=4, data=data)
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert isinstance(batch, ListwiseBatch) and batch.score_BC.shape == (4, 8) and batch.cases_BCD.shape == (4, 8, 16)
    assert isinstance(dm.val_dataloader()[0].dataset, ListwiseDataset) and len(dm.val_dataloader()) == 1
    with pytest.raises(ConfigError, match="bank=None: is required for source='labels'"):
        DataConfig(source="labels", labels="l.jsonl")
    with pytest.raises(ConfigError, match="tau=0: must be a finite number"):
        DataConfig(source="labels", labels="l.jsonl", bank="b", tau=0)
    with pytest.raises(ConfigError, match="alpha_schedule='target_entropy'"):
        TrainConfig(data=DataConfig(source="labels", labels="l", bank="b"), qnet=QNetConfig(dim=4),
                    learner=LearnerConfig(alpha_schedule="target_entropy"))


# ---------------------------------------------------------------- the files and the commands

DIM = 32
WORDS = ["red", "green", "blue", "black", "white", "brown"]
TOPICS = ["capital", "currency", "plural"]


def _bank_and_tasks(tmp_path):
    """A bank of cases of three topics in six colours, tasks of those topics; the planner prefers 'blue' cases."""
    encoder = HashingEncoder(DIM)
    cases = [Case(id=f"{topic}-{word}", state=f"the {topic} question about {word} things", action=word, reward=1.0)
             for topic in TOPICS for word in WORDS]
    with CaseBank.create(tmp_path / "bank", DIM) as bank:
        bank.add(cases, encoder.encode([c.state for c in cases]))
    tasks = [Task(id=f"t{j}", question=f"the {TOPICS[j % 3]} question about item {name} and {other}",
                  answers=(f"gold {j}",))
             for j, (name, other) in enumerate((a, b) for a in ["one", "two", "three", "four", "five"]
                                               for b in ["north", "south", "east", "west"])]
    return tmp_path / "bank", tasks


def blue_planner() -> CallablePlanner:
    def score(task: Task, cases: list[Case], answer: str) -> AnswerScore:
        return AnswerScore(logprob=sum(-0.5 if c.action == "blue" else -3.0 - 0.1 * WORDS.index(c.action)
                                       for c in cases), n_tokens=1)
    return CallablePlanner(lambda t, c: "x", name="blue", score_fn=score)


def test_load_labels_takes_case_vectors_from_the_bank(tmp_path):
    bank_dir, tasks = _bank_and_tasks(tmp_path)
    encoder = HashingEncoder(DIM)
    with CaseBank.open(bank_dir) as bank:
        label_tasks(tasks, bank, encoder, blue_planner(), LabelConfig(candidates=6), tmp_path / "labels.jsonl")
        data = load_labels(tmp_path / "labels.jsonl", bank_dir, encoder)
        assert data.listwise and data.n_rows == len(tasks) and data.k_max == 6
        np.testing.assert_array_equal(data.cases_MD, bank.embeddings(data.case_keys))
    assert data.notes["planners"] == ["CallablePlanner(name='blue')"] and data.origins[0].endswith("labels.jsonl:1")
    lines = (tmp_path / "labels.jsonl").read_text().splitlines()
    row = json.loads(lines[1])
    row["candidate_ids"][0] = "not-in-the-bank"
    (tmp_path / "bad.jsonl").write_text(lines[0] + "\n" + json.dumps(row) + "\n")
    with pytest.raises(DataFormatError, match=r"bad.jsonl:2: candidate id 'not-in-the-bank' is not in the bank"):
        load_labels(tmp_path / "bad.jsonl", bank_dir, encoder)
    with pytest.raises(Exception, match="dim=32 case vectors, the encoder .* gives dim=16"):
        load_labels(tmp_path / "labels.jsonl", bank_dir, HashingEncoder(16))


def test_score_then_train_from_labels_then_export(tmp_path, monkeypatch, capsys):
    import memento.training.cli

    bank_dir, tasks = _bank_and_tasks(tmp_path)
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(t.to_json()) + "\n" for t in tasks))
    monkeypatch.setattr(score_cli, "load_encoder", lambda config: HashingEncoder(DIM))
    monkeypatch.setattr(score_cli, "build_planner", lambda spec, **kw: blue_planner())
    monkeypatch.setattr(memento.training.cli, "load_encoder", lambda config: HashingEncoder(DIM))
    labels = tmp_path / "labels.jsonl"
    assert cli.main(["score", "--tasks", str(tmp_path / "tasks.jsonl"), "--bank", str(bank_dir), "--candidates", "6",
                     "--out", str(labels), "--no-progress"]) == 0
    run = tmp_path / "run"
    code = cli.main(["train", "--from-labels", str(labels), "--bank", str(bank_dir), "--out", str(run),
                     "--max-epochs", "30", "--arch", "mlp_interact", "--hidden", "32", "--batch-size", "4",
                     "--lr", "0.01", "--no-progress", "--accelerator", "cpu", "--patience", "0", "--tau", "0.5"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "data (labels): 20 tasks" in out and "val listwise KL" in out and "hit@1" in out
    summary = json.loads((run / "summary.json").read_text())
    assert summary["metrics"]["val/hit@1"] >= 0.5 and summary["data"]["notes"]["tasks"] == 20
    assert json.loads((run / "config.json").read_text())["data"]["tau"] == 0.5
    learner = SoftQLearner.load(run / "selector")
    assert learner.qnet.config.arch == "mlp_interact"
    assert cli.main(["export", str(run), str(tmp_path / "selector"), "--bank", str(bank_dir)]) == 0
    assert cli.main(["verify", str(tmp_path / "selector")]) == 0


@pytest.mark.parametrize("argv, message", [
    (["--from-labels", "labels.jsonl"], "--from-labels needs --bank DIR"),
    (["--cases", "c.jsonl", "--rewards", "r.jsonl", "--bank", "b"], "--bank goes with --from-log or --from-labels"),
    (["--from-labels", "missing.jsonl", "--bank", "."], "missing.jsonl: file not found"),
])
def test_train_from_labels_bad_flags_are_one_line(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    code = cli.main(["train", *argv, "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1


def test_train_from_labels_with_case_features(tmp_path, monkeypatch, capsys):
    """The planner prefers cases whose *answer* is 'blue': with case features the Q-network sees the answer's
    embedding and puts a blue case first on the held-out tasks."""
    import memento.training.cli

    bank_dir, tasks = _bank_and_tasks(tmp_path)
    encoder = HashingEncoder(DIM)
    with CaseBank.open(bank_dir) as bank:
        label_tasks(tasks, bank, encoder, blue_planner(), LabelConfig(candidates=6), tmp_path / "labels.jsonl")
    data = load_labels(tmp_path / "labels.jsonl", bank_dir, encoder, features="case")
    assert data.cases_MD.shape[1] == 2 * DIM + CASE_SCALARS
    with CaseBank.open(bank_dir) as bank:  # the action vectors are stored in the bank
        assert bank.action_embeddings_at(bank.positions_of(data.case_keys))[1].all()
    monkeypatch.setattr(memento.training.cli, "load_encoder", lambda config: HashingEncoder(DIM))
    run = tmp_path / "run"
    code = cli.main(["train", "--from-labels", str(tmp_path / "labels.jsonl"), "--bank", str(bank_dir),
                     "--out", str(run), "--max-epochs", "40", "--hidden", "32", "--batch-size", "4", "--lr", "0.01",
                     "--no-progress", "--accelerator", "cpu", "--patience", "0", "--anchor", "cosine",
                     "--features", "case"])
    out = capsys.readouterr().out
    assert code == 0, out
    summary = json.loads((run / "summary.json").read_text())
    assert summary["metrics"]["val/hit@1"] >= 0.75
    learner = SoftQLearner.load(run / "selector")
    assert learner.qnet.config.features == "case" and learner.qnet.config.anchor == "cosine"
    with pytest.raises(ConfigError, match="case features .* planner-scored labels"):
        from memento.training.data import load_data

        load_data(DataConfig(source="cases", cases=str(tmp_path / "c.jsonl"), rewards=str(tmp_path / "r.jsonl")),
                  encoder, features="case")
