"""SimCSE fine-tuning without a real model: config, the InfoNCE loss (known answers), data readers, batches, CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from memento.config import LearnerConfig, QNetConfig, load_json, save_json
from memento.errors import ConfigError, DataFormatError, DimensionError, EncoderError
from memento.training.config import JointConfig, LightningConfig, joint_config_from_dict, simcse_config_from_dict
from memento.training.run import resolve_precision
from memento.training.simcse import (
    PairData,
    SimCSEConfig,
    SupCollate,
    SupExample,
    build_sup_examples,
    detect_format,
    info_nce,
    load_pairs,
    load_texts,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SIMCSE = FIXTURES / "simcse"
MEMENTO = FIXTURES / "memento"


# ---------------------------------------------------------------- config


def test_config_json_round_trip(tmp_path: Path) -> None:
    config = SimCSEConfig(mode="sup", data=["a.jsonl", "b.jsonl"], pooling="cls_before_pooler", max_steps=7,
                          dropout=0.2, lr=1e-5, lightning=LightningConfig(devices="0,1"))
    save_json(config, tmp_path / "config.json")
    loaded = load_json(SimCSEConfig, tmp_path / "config.json")
    assert loaded == config
    assert loaded.data == ("a.jsonl", "b.jsonl")
    assert SimCSEConfig().temperature == 0.05 and SimCSEConfig().mode == "unsup"


@pytest.mark.parametrize("field, value", [("mode", "joint"), ("temperature", 0.0), ("batch_size", 1),
                                          ("pooling", "max"), ("max_steps", 0), ("dropout", 1.0), ("data", [""]),
                                          ("lr", -1.0), ("model", " ")])
def test_config_rejects(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=f"SimCSEConfig.{field}="):
        SimCSEConfig(**{field: value})
    with pytest.raises(ConfigError, match="LightningConfig.precision='fp8'"):
        SimCSEConfig(lightning=LightningConfig(precision="fp8"))


def test_precision_and_devices() -> None:
    assert resolve_precision("32-true", "gpu") == "32-true"
    expected = "bf16-mixed" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "32-true"
    assert resolve_precision("auto", "auto") == expected
    assert resolve_precision("auto", "cpu") == "32-true"
    assert tuple(LightningConfig(devices=d).devices for d in ("auto", "2", "-1", "0,1")) == ("auto", 2, -1, "0,1")


def test_joint_config_nests_the_q_head_and_reads_the_old_flat_form() -> None:
    config = JointConfig()
    assert (config.qnet.arch, config.qnet.hidden, config.qnet.n_layers, config.qnet.dropout) == ("mlp", 256, 1, 0.1)
    assert config.qnet.dim is None and config.qnet.for_dim(384, seed=3) == QNetConfig(hidden=256, dim=384, seed=3)
    flat = {"data": ["p.jsonl"], "qnet_arch": "two_tower", "n_layers": 2, "qnet_dropout": 0.2, "seed": 4,
            "accelerator": "cpu", "devices": "1"}
    assert joint_config_from_dict(flat) == JointConfig(
        data=("p.jsonl",), qnet=QNetConfig(arch="two_tower", hidden=256, n_layers=2, dropout=0.2), seed=4,
        lightning=LightningConfig(accelerator="cpu", devices=1))
    with pytest.raises(ConfigError, match="JointConfig: give the Q head either as qnet or in the old flat form"):
        joint_config_from_dict({"hidden": 32, "qnet": {"hidden": 64}})
    with pytest.raises(ConfigError, match="JointConfig.learner=.*gamma=0"):
        JointConfig(learner=LearnerConfig(gamma=0.5))


def test_config_written_before_the_nesting_still_loads() -> None:
    """A SimCSE config.json with the Lightning fields flat (as runs wrote them before) reads as the nested form."""
    flat = {"mode": "sup", "data": ["a.jsonl"], "accelerator": "cpu", "devices": "1", "strategy": "auto",
            "precision": "32-true", "log_every_n_steps": 5}
    assert simcse_config_from_dict(flat) == SimCSEConfig(
        mode="sup", data=("a.jsonl",),
        lightning=LightningConfig(accelerator="cpu", devices=1, precision="32-true", log_every_n_steps=5))


# ---------------------------------------------------------------- the loss, by hand


def test_info_nce_unsup_known_answer() -> None:
    # two orthogonal texts, each its own positive: logits [[1/tau, 0], [0, 1/tau]]
    z = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    tau = 0.5
    expected = math.log(1 + math.exp(-2.0))  # -log(e^2 / (e^2 + e^0))
    assert float(info_nce(z, z, tau)) == pytest.approx(expected, rel=1e-6)
    # scale does not matter: cosine similarities
    assert float(info_nce(3 * z, 0.5 * z, tau)) == pytest.approx(expected, rel=1e-6)


def test_info_nce_sup_with_hard_negative_known_answer() -> None:
    a = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    p = torch.tensor([[0.6, 0.8], [0.0, 1.0]]) * torch.tensor([[3.0], [1.0]])  # cos(a0, p0) = 0.6 after normalising
    n = torch.tensor([[0.8, 0.6]])  # hard negative of row 0
    cands = torch.cat([p, n])  # columns: p0, p1, n0
    tau = 0.1
    # row 0: cos = [0.6, 0.0, 0.8] -> logits [6, 0, 8], target 0
    loss0 = -6 + math.log(math.exp(6) + math.exp(0) + math.exp(8))
    # row 1: cos = [0.8, 1.0, 0.6] -> logits [8, 10, 6], target 1
    loss1 = -10 + math.log(math.exp(8) + math.exp(10) + math.exp(6))
    assert float(info_nce(a, cands, tau)) == pytest.approx((loss0 + loss1) / 2, rel=1e-5)
    # masking p0 out of row 1's denominator (say p0 is a known positive of row 1's state too)
    valid = torch.tensor([[True, True, True], [False, True, True]])
    loss1_masked = -10 + math.log(math.exp(10) + math.exp(6))
    assert float(info_nce(a, cands, tau, valid)) == pytest.approx((loss0 + loss1_masked) / 2, rel=1e-5)


def test_info_nce_gradient_and_shapes() -> None:
    a = torch.randn(4, 8, requires_grad=True)
    loss = info_nce(a, torch.randn(6, 8), 0.05)
    loss.backward()
    assert a.grad is not None and torch.isfinite(a.grad).all()
    with pytest.raises(DimensionError, match=r"anchor_BD.shape=\(4, 8\).*candidates_CD.shape=\(3, 8\)"):
        info_nce(torch.randn(4, 8), torch.randn(3, 8), 0.05)
    with pytest.raises(DimensionError):
        info_nce(torch.randn(4, 8), torch.randn(4, 7), 0.05)


# ---------------------------------------------------------------- formats and readers


@pytest.mark.parametrize("path, fmt", [
    (SIMCSE / "cases.jsonl", "case"), (SIMCSE / "tasks.jsonl", "task"), (SIMCSE / "pairs.jsonl", "pairs"),
    (MEMENTO / "training_data.jsonl", "memento-training"), (MEMENTO / "memory.jsonl", "memento-memory"),
    (MEMENTO / "np_memory.jsonl", "memento-np-memory"), (MEMENTO / "deepresearcher.jsonl", "memento-tasks")])
def test_detect_format(path: Path, fmt: str) -> None:
    assert detect_format(path) == fmt


def test_detect_format_errors(tmp_path: Path) -> None:
    odd = tmp_path / "odd.jsonl"
    odd.write_text('\n{"text": "hello"}\n')
    with pytest.raises(DataFormatError, match=rf"{odd}:2: cannot tell the format from the keys \['text'\]"):
        detect_format(odd)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(DataFormatError, match="no rows"):
        detect_format(empty)
    with pytest.raises(DataFormatError, match="not a case bank"):
        detect_format(tmp_path)
    with pytest.raises(DataFormatError, match="file not found"):
        detect_format(tmp_path / "missing.jsonl")


def test_load_texts_dedupes_and_includes_actions() -> None:
    states = load_texts([SIMCSE / "cases.jsonl"], include_actions=False)
    both = load_texts([SIMCSE / "cases.jsonl"])
    assert len(states) == 52 and len(set(states)) == 52
    assert set(states) < set(both) and len(both) > len(states)
    tasks = load_texts([SIMCSE / "tasks.jsonl", SIMCSE / "tasks.jsonl"])  # the same file twice: no duplicates
    assert len(tasks) == 26
    memento = load_texts([MEMENTO / "training_data.jsonl"])
    assert len(memento) == len(set(memento)) > 50  # queries and cases, deduplicated


def test_bad_line_names_file_and_line(tmp_path: Path) -> None:
    rows = [json.loads(line) for line in (SIMCSE / "pairs.jsonl").read_text().splitlines()[:2]]
    bad = tmp_path / "pairs.jsonl"
    bad.write_text(json.dumps(rows[0]) + "\n" + json.dumps(rows[1]) + "\n" + '{"state": "q", "case": "c", '
                   '"reward": "yes"}\n')
    with pytest.raises(DataFormatError, match=rf"^{bad}:3: field 'reward' must be a finite number, got 'yes'$"):
        load_pairs([bad])
    with pytest.raises(DataFormatError, match=rf"^{bad}:3: "):
        load_texts([bad])
    bad.write_text(json.dumps(rows[0]) + '\n{"state": "", "case": "c", "reward": 1}\n')
    with pytest.raises(DataFormatError, match=rf"^{bad}:2: field 'state' is empty$"):
        load_pairs([bad])
    bad.write_text(json.dumps(rows[0]) + '\n{"state": "q", "reward": 1, "case": 3}\n')
    with pytest.raises(DataFormatError, match=rf"^{bad}:2: field 'case' must be a string, got int$"):
        load_pairs([bad])
    cases = tmp_path / "cases.jsonl"
    good = (SIMCSE / "cases.jsonl").read_text().splitlines()[0]
    cases.write_text(good + "\n" + good.replace('"reward": 0.0', '"reward": NaN') + "\n")
    with pytest.raises(DataFormatError, match=rf"^{cases}:2: "):
        load_texts([cases])


def test_sup_refuses_text_only_formats() -> None:
    with pytest.raises(DataFormatError, match=r"cases.jsonl: is case data, which holds no rewarded"):
        load_pairs([SIMCSE / "cases.jsonl"])


def test_load_pairs_dedupes_and_groups() -> None:
    data = load_pairs([SIMCSE / "pairs.jsonl"])
    stats = data.stats()
    assert stats == {"rows": 97, "pairs": 96, "duplicates": 1, "conflicts": 0, "states": 24, "cases": stats["cases"],
                     "states_with_positive": 24, "states_with_positive_and_negative": 24}
    assert all(len(p) == 2 and len(n) == 2 for p, n in zip(data.positives, data.negatives))


def test_load_pairs_memento_reference_has_no_hard_negatives() -> None:
    data = load_pairs([MEMENTO / "training_data.jsonl"])
    stats = data.stats()
    assert stats["rows"] == 400 and stats["duplicates"] > 0
    # every retrieved case of a query shares the query's truth_label: no state has both kinds
    assert stats["states_with_positive_and_negative"] == 0
    assert 0 < stats["states_with_positive"] < stats["states"]


def test_load_pairs_conflicts_use_the_mean(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [
        {"state": "s", "case": "a", "reward": 1}, {"state": "s", "case": "a", "reward": 0},
        {"state": "s", "case": "a", "reward": 1}, {"state": "s", "case": "b", "reward": 0.2}]))
    data = load_pairs([path])
    assert (data.conflicts, data.duplicates, data.positives, data.negatives) == (1, 2, [[0]], [[1]])


def test_build_sup_examples() -> None:
    data = load_pairs([SIMCSE / "pairs.jsonl"])
    first = build_sup_examples(data, seed=3)
    assert first == build_sup_examples(data, seed=3)
    assert len(first) == sum(len(p) for p in data.positives)
    for e in first:
        assert e.positive in data.positives[e.state] and e.negative in data.negatives[e.state]
    by_state = [[e.negative for e in first if e.state == s] for s in range(len(data.states))]
    assert all(len(set(negs)) == 2 for negs in by_state)  # 2 positives, 2 negatives: each negative used once
    assert all(e.negative == -1 for e in build_sup_examples(data, seed=3, hard_negatives=False))


class _StubTokenizer:
    def __call__(self, texts, **kwargs):
        n = len(texts)
        return {"input_ids": torch.ones(n, 3, dtype=torch.long), "attention_mask": torch.ones(n, 3, dtype=torch.long)}


def test_sup_collate_masks_known_positives() -> None:
    # state 0 has positives {case 0, case 1}; state 1 has positive case 1 and negative case 2
    data = PairData(states=["s0", "s1"], cases=["c0", "c1", "c2"], positives=[[0, 1], [1]], negatives=[[], [2]],
                    rows=4, duplicates=0, conflicts=0)
    batch = SupCollate(_StubTokenizer(), 16, data)([SupExample(state=0, positive=0, negative=-1),
                                                     SupExample(state=1, positive=1, negative=2)])
    assert batch["anchor"]["input_ids"].shape[0] == 2 and batch["negative"]["input_ids"].shape[0] == 1
    # columns: c0 (row 0's positive), c1 (row 1's positive), c2 (row 1's hard negative)
    assert batch["valid_BC"].tolist() == [[True, False, True],  # c1 is also a positive of s0: not a negative
                                          [True, True, True]]


# ---------------------------------------------------------------- CLI (parsing only)


def _args(argv: list[str]):
    from memento.cli.entry import build_parser

    return build_parser().parse_args(argv)


def test_cli_flags_build_the_config(tmp_path: Path) -> None:
    from memento.training.simcse_cli import config_from_args

    args = _args(["train-encoder", "--data", "a.jsonl", "--data", "b.jsonl", "--mode", "sup", "--out", "o",
                  "--pooling", "cls", "--max-steps", "5", "--batch-size", "8", "--lr", "1e-4", "--seed", "2",
                  "--accelerator", "cpu", "--devices", "1", "--no-hard-negatives", "--no-actions"])
    config = config_from_args(args)
    assert (config.data, config.mode, config.pooling, config.max_steps, config.batch_size, config.lr, config.seed,
            config.lightning.accelerator, config.lightning.devices, config.hard_negatives, config.include_actions) == \
        (("a.jsonl", "b.jsonl"), "sup", "cls", 5, 8, 1e-4, 2, "cpu", 1, False, False)
    save_json(config, tmp_path / "config.json")  # --config FILE, then flags override it
    again = config_from_args(_args(["train-encoder", "--config", str(tmp_path / "config.json"), "--out", "o",
                                    "--seed", "9"]))
    assert again == SimCSEConfig(**{**config.__dict__, "seed": 9})
    with pytest.raises(ConfigError, match="no input"):
        config_from_args(_args(["train-encoder", "--out", "o"]))
    with pytest.raises(ConfigError, match="SimCSEConfig.batch_size=1"):
        config_from_args(_args(["train-encoder", "--data", "a", "--out", "o", "--batch-size", "1"]))


def test_cli_help_explains_every_flag(capsys: pytest.CaptureFixture[str]) -> None:
    from memento.cli.entry import main

    with pytest.raises(SystemExit) as exit_info:
        main(["train-encoder", "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for flag in ("--data", "--mode", "--out", "--model", "--pooling", "--epochs", "--max-steps", "--batch-size",
                 "--lr", "--seed", "--accelerator", "--devices", "--precision", "memento_encoder.json"):
        assert flag in text


def test_cli_bad_data_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from memento.cli.entry import main

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"state": "q", "case": "c", "reward": 1}\n{"state": "q", "case": "d"}\n')
    code = main(["train-encoder", "--data", str(bad), "--mode", "sup", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2
    assert err.strip() == f"memento: error: {bad}:2: missing field 'reward'"
    assert not (tmp_path / "out").exists()  # nothing written


# ---------------------------------------------------------------- Encoder reads the pooling of a saved directory


def _tiny_bert(path: Path) -> Path:
    from transformers import BertConfig, BertModel, BertTokenizerFast

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"abcdefghijklmnopqrstuvwxyz?"]
    path.mkdir(parents=True, exist_ok=True)
    (path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    BertTokenizerFast(vocab_file=str(path / "vocab.txt")).save_pretrained(path)
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=len(vocab), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=32, max_position_embeddings=64)).save_pretrained(path)
    return path


def test_encoder_takes_pooling_from_saved_directory(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from memento.encoders import ENCODER_META_NAME, Encoder

    model_dir = _tiny_bert(tmp_path / "bert")
    assert Encoder.from_pretrained(model_dir, device="cpu", use_cache=False).pooling == "avg"  # no file: avg
    (model_dir / ENCODER_META_NAME).write_text(json.dumps(
        {"format": "memento-encoder", "format_version": 1, "pooling": "cls_before_pooler"}))
    assert Encoder.from_pretrained(model_dir, device="cpu", use_cache=False).pooling == "cls_before_pooler"
    with caplog.at_level("WARNING", logger="memento.encoders"):
        explicit = Encoder.from_pretrained(model_dir, pooling="avg", device="cpu", use_cache=False)
    assert explicit.pooling == "avg" and "fine-tuned with pooling='cls_before_pooler'" in caplog.text
    (model_dir / ENCODER_META_NAME).write_text(json.dumps(
        {"format": "memento-encoder", "format_version": 1, "pooling": "max"}))
    with pytest.raises(EncoderError, match="pooling='max' is not one of"):
        Encoder.from_pretrained(model_dir, device="cpu", use_cache=False)


def test_sup_eval_batch_spreads_over_states() -> None:
    """The fixed sup batch takes one example per state in turn (examples of one state would mask each other)."""
    from memento.training.simcse import SimCSEDataModule

    class Recorder(_StubTokenizer):
        calls: list[list[str]] = []

        def __call__(self, texts, **kwargs):
            self.calls.append(list(texts))
            return super().__call__(texts, **kwargs)

    data = load_pairs([SIMCSE / "pairs.jsonl"])
    tokenizer = Recorder()
    module = SimCSEDataModule(SimCSEConfig(mode="sup", eval_size=24), tokenizer, pairs=data)
    module.setup("fit")
    module.setup("fit")  # idempotent: the Trainer calls it again
    assert len(module.items) == 48
    batch = module.eval_batch()
    anchors, positives = tokenizer.calls[0], tokenizer.calls[1]
    assert len(set(anchors)) == 24  # every state once
    valid = batch["valid_BC"]
    assert valid.shape == (24, 48) and valid.diagonal().all()
    for i, anchor in enumerate(anchors):  # masked positive columns are exactly the anchor state's known positives
        known = {data.cases[c] for c in data.positives[data.states.index(anchor)]}
        assert [not v for v in valid[i, :24].tolist()] == [j != i and positives[j] in known for j in range(24)]
