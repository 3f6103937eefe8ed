"""``memento train``: the parser, the layered config (defaults, --config, flags) and one-line errors.

Every error here is raised before an encoder is loaded; runs with the real encoder are in
tests/integration/test_train_cli.py.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest
import torch

import memento.training.data  # noqa: F401  (imports Lightning once, at collection, not inside the first test)
from memento.cli.entry import build_parser, main
from memento.config import QNetConfig, to_dict
from memento.training.cli import build_train_config
from memento.training.config import TrainerConfig

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "memento"
MEMENTO = ["--from-memento", str(FIXTURES / "training_data.jsonl"), "--memory", str(FIXTURES / "memory.jsonl")]


def _args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["train", *argv])


def test_every_flag_has_help():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["train"]
    for action in sub._actions:
        assert action.help, action.dest
    text = sub.format_help()
    for phrase in ("--from-log", "--from-memento", "--memory", "--cases", "--rewards", "--resume", "--precision",
                   "--strategy", "--devices", "selector/", "config.json"):
        assert phrase in text
    flat = " ".join(text.split())  # the defaults shown are the config classes' own
    assert f"epochs at most (default: {TrainerConfig().max_epochs})" in flat
    assert f"hidden width (default: {QNetConfig().hidden})" in flat


def test_flags_override_the_config_file(tmp_path):
    base = {"data": {"source": "log", "log": "old-run", "val_fraction": 0.3, "encoder": {"pooling": "cls"}},
            "qnet": {"arch": "two_tower", "hidden": 64}, "learner": {"lr": 0.01},
            "trainer": {"max_epochs": 7, "patience": 2}}
    (tmp_path / "train.json").write_text(json.dumps(base))
    config = build_train_config(_args("--config", str(tmp_path / "train.json"), *MEMENTO, "--out", str(tmp_path / "o"),
                                      "--hidden", "32", "--max-epochs", "3", "--seed", "5", "--max-length", "64",
                                      "--devices", "2", "--hit-k", "2", "8", "--no-progress"), dim=384)
    assert config.data.source == "memento" and config.data.log is None  # the flag's source replaces the file's
    assert config.data.memento_pairs.endswith("training_data.jsonl") and config.data.val_fraction == 0.3
    assert (config.data.encoder.pooling, config.data.encoder.max_length) == ("cls", 64)
    assert (config.qnet.arch, config.qnet.hidden, config.qnet.dim) == ("two_tower", 32, 384)
    assert config.learner.lr == 0.01 and config.trainer.max_epochs == 3 and config.trainer.patience == 2
    assert config.qnet.seed == config.learner.seed == config.data.split_seed == 5
    assert config.trainer.lightning.devices == 2 and config.trainer.hit_k == (2, 8)
    assert config.trainer.progress_bar is False
    defaults = build_train_config(_args(*MEMENTO, "--out", "o"), dim=16)
    assert to_dict(defaults.learner) == to_dict(type(defaults.learner)())
    assert defaults.trainer.lightning.precision == "auto"


@pytest.mark.parametrize("argv, message", [
    ([], "no training data: give --from-log"),
    (["--from-memento", "pairs.jsonl"], "--from-memento needs --memory FILE"),
    (["--cases", "c.jsonl"], "--cases needs --rewards FILE"),
    (["--from-log", "run", "--cases", "c.jsonl"], "--from-log and --cases: give one data source"),
    (["--from-log", "run", "--memory", "m.jsonl"], "--memory goes with --from-memento"),
    (["--from-log", "nowhere"], "nowhere: transition log not found"),
    (["--from-memento", "nope.jsonl", "--memory", "m.jsonl"], "nope.jsonl: file not found"),
    ([*MEMENTO, "--val-fraction", "1.5"], "DataConfig.val_fraction=1.5"),
    ([*MEMENTO, "--hidden", "0"], "QNetConfig.hidden=0"),
    ([*MEMENTO, "--gamma", "0.5"], "gamma > 0 .* needs next states"),
    ([*MEMENTO, "--devices", "x"], "LightningConfig.devices='x'"),
    ([*MEMENTO, "--resume"], "config.json: config file not found"),
    ([*MEMENTO, "--torch-threads", "-1"], "--torch-threads=-1"),
    pytest.param([*MEMENTO, "--accelerator", "gpu"], "--accelerator gpu: no CUDA device is available",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")),
])
def test_bad_input_is_one_line_with_status_2(tmp_path, capsys, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("memento.training.cli.load_encoder", lambda config: pytest.fail("no encoder before checks"))
    assert main(["train", "--out", str(tmp_path / "run"), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("memento: error: ") and err.count("\n") == 1
    assert re.search(message, err), err
    assert not (tmp_path / "run" / "config.json").exists()


def test_a_used_run_directory_needs_resume_and_resume_keeps_the_model(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("memento.training.cli.load_encoder", lambda config: pytest.fail("no encoder before checks"))
    out = tmp_path / "run"
    out.mkdir()
    config = build_train_config(_args(*MEMENTO, "--out", str(out)), dim=384)
    (out / "config.json").write_text(json.dumps(to_dict(config)))
    assert main(["train", *MEMENTO, "--out", str(out)]) == 2
    assert "already holds a training run; pass --resume" in capsys.readouterr().err
    assert main(["train", "--resume", "--out", str(out), "--hidden", "7"]) == 2
    assert "--resume: the qnet settings differ" in capsys.readouterr().err
    assert main(["train", "--resume", "--out", str(out), "--config", "x.json"]) == 2
    assert "do not pass --config" in capsys.readouterr().err
    resumed = build_train_config(_args("--resume", "--out", str(out), "--max-epochs", "40", *MEMENTO), dim=384)
    assert resumed.trainer.max_epochs == 40 and resumed.qnet == config.qnet
    assert main(["train", "--resume", "--out", str(out)]) == 2  # no last.ckpt yet
    assert "last.ckpt: no Lightning checkpoint to resume from" in capsys.readouterr().err


def test_resume_reads_a_config_written_before_the_lightning_fields_were_nested(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    config = build_train_config(_args(*MEMENTO, "--out", str(out), "--accelerator", "cpu"), dim=384)
    flat = to_dict(config)
    flat["trainer"].update(flat["trainer"].pop("lightning"))  # the old shape: accelerator, devices... in trainer
    (out / "config.json").write_text(json.dumps(flat))
    resumed = build_train_config(_args("--resume", "--out", str(out), "--max-epochs", "40", "--devices", "2"), dim=384)
    assert resumed.trainer.max_epochs == 40 and resumed.trainer.lightning.devices == 2
    assert resumed.trainer.lightning.accelerator == "cpu" and resumed.qnet == config.qnet
    (tmp_path / "old.json").write_text(json.dumps(flat))  # an old file as --config, flags override it
    again = build_train_config(_args("--config", str(tmp_path / "old.json"), "--out", "o", "--strategy", "ddp"),
                               dim=384)
    assert (again.trainer.lightning.strategy, again.trainer.lightning.accelerator) == ("ddp", "cpu")
