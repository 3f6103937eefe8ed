"""SimCSE fine-tuning of the real all-MiniLM-L6-v2 on the facts fixtures: the loss falls, the saved
directory reloads with the same vectors, a new bank works with it, the command runs end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from memento.bank.local import CaseBank
from memento.config import EncoderConfig, load_json
from memento.encoders import ENCODER_META_NAME, Encoder
from memento.formats import read_cases_jsonl
from memento.training.config import LightningConfig
from memento.training.simcse import SimCSEConfig, SimCSEModule, SimCSEResult, load_texts, tokenize, train_encoder

pytestmark = pytest.mark.slow

SIMCSE = Path(__file__).resolve().parents[1] / "fixtures" / "simcse"
UNSUP_DATA = (str(SIMCSE / "cases.jsonl"), str(SIMCSE / "tasks.jsonl"))
PROBE = ["What is the capital of Peru?", "What is the currency code of Peru?", "Write 347 in words.",
         "What is the plural of mouse?"]


def _small(**overrides) -> SimCSEConfig:
    base = {"data": UNSUP_DATA, "max_length": 32, "batch_size": 16, "max_steps": 6, "epochs": 50, "lr": 2e-4,
            "eval_size": 32, "lightning": LightningConfig(accelerator="cpu", devices="1")}
    return SimCSEConfig(**{**base, **overrides})


@pytest.fixture(scope="module")
def unsup_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[SimCSEResult, Encoder, SimCSEConfig]:
    """One unsupervised run; the Encoder object passed in is the one trained (in place)."""
    config = _small()
    encoder = Encoder.from_pretrained(pooling=config.pooling, max_length=config.max_length, device="cpu",
                                      use_cache=False)
    result = train_encoder(config, tmp_path_factory.mktemp("simcse") / "out", encoder=encoder)
    return result, encoder, config


def test_unsup_lowers_the_contrastive_loss(unsup_run) -> None:
    result, _, config = unsup_run
    assert result.steps == config.max_steps
    assert result.loss_before is not None and result.loss_after is not None
    assert result.loss_after < 0.8 * result.loss_before, (result.loss_before, result.loss_after)
    assert result.seconds_per_step > 0
    print(f"\nunsup: fixed-batch loss {result.loss_before:.5f} -> {result.loss_after:.5f}, "
          f"{result.seconds_per_step:.3f} s/step on {result.device}")


def test_fixed_batch_loss_is_reproducible_from_the_saved_dirs(unsup_run) -> None:
    """The figures in result.json are the loss of the base model and of the saved encoder on the same batch."""
    result, _, config = unsup_run
    texts = load_texts(config.data)[:config.eval_size]

    def fixed_loss(encoder: Encoder) -> float:
        module = SimCSEModule(config, encoder)
        return module.fixed_batch_loss({"tokens": tokenize(module.tokenizer, texts, config.max_length)})

    base = Encoder.from_pretrained(max_length=config.max_length, device="cpu", use_cache=False)
    tuned = Encoder.from_pretrained(result.encoder_dir, max_length=config.max_length, device="cpu", use_cache=False)
    assert fixed_loss(base) == pytest.approx(result.loss_before, rel=1e-4)
    assert fixed_loss(tuned) == pytest.approx(result.loss_after, rel=1e-4)
    state = torch.get_rng_state()
    fixed_loss(tuned)
    assert torch.equal(state, torch.get_rng_state())  # the caller's RNG is untouched


def test_saved_dir_loads_with_the_same_vectors(unsup_run) -> None:
    result, trained, config = unsup_run
    out = Path(result.out)
    encoder_dir = Path(result.encoder_dir)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "encoder", "result.json", "tb"]
    assert load_json(SimCSEConfig, out / "config.json") == config
    assert list((out / "tb").glob("events.out.tfevents.*"))
    assert (encoder_dir / "model.safetensors").is_file() and not list(encoder_dir.glob("*.bin"))
    meta = json.loads((encoder_dir / ENCODER_META_NAME).read_text())
    assert (meta["pooling"], meta["max_length"], meta["dim"], meta["base_model"]) == \
        ("avg", 32, 384, "sentence-transformers/all-MiniLM-L6-v2")
    assert meta["training"]["mode"] == "unsup"
    assert result.reload_max_abs_diff is not None and result.reload_max_abs_diff < 1e-5

    loaded = Encoder.from_pretrained(encoder_dir, max_length=config.max_length, device="cpu", use_cache=False)
    assert (loaded.pooling, loaded.dim) == ("avg", 384)
    mine = trained.encode(PROBE)  # the in-memory trained model, eval mode, Encoder.pool
    theirs = loaded.encode(PROBE)
    np.testing.assert_allclose(theirs, mine, atol=1e-5)
    module = SimCSEModule(config, trained)  # the training-time forward, in eval mode
    np.testing.assert_allclose(module.embed_texts(PROBE).numpy(), theirs, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(theirs, axis=1), 1.0, atol=1e-5)  # unit norm
    base = Encoder.from_pretrained(max_length=config.max_length, device="cpu", use_cache=False).encode(PROBE)
    assert np.abs(base - theirs).max() > 1e-4  # training moved the weights


def test_new_bank_with_the_fine_tuned_encoder(unsup_run, tmp_path: Path) -> None:
    result, _, _ = unsup_run
    encoder = Encoder.from_pretrained(result.encoder_dir, device="cpu", cache_dir=tmp_path / "cache")
    cases = read_cases_jsonl(SIMCSE / "cases.jsonl")
    bank = CaseBank.create(tmp_path / "bank", dim=encoder.dim,
                           encoder=EncoderConfig(model=result.encoder_dir, pooling=encoder.pooling))
    try:
        ids = bank.add(cases, encoder.encode([c.state for c in cases]))
        scores, found = bank.search(encoder.encode(cases[5].state), k=3)
        assert found[0] == ids[5] and scores[0] == pytest.approx(1.0, abs=1e-4)
        assert bank.get(found[0]).state == cases[5].state
    finally:
        bank.close()
    reopened = CaseBank.open(tmp_path / "bank")
    try:
        stats = reopened.stats()
        assert (stats["cases"], stats["dim"], stats["encoder"]["model"]) == (len(cases), 384, result.encoder_dir)
    finally:
        reopened.close()


def test_sup_with_hard_negatives_and_another_pooling(tmp_path: Path) -> None:
    """Supervised from rewarded pairs, pooled with cls_before_pooler: the loss falls and the directory
    reloads with that pooling (from memento_encoder.json) and the same vectors."""
    config = _small(mode="sup", data=(str(SIMCSE / "pairs.jsonl"),), pooling="cls_before_pooler", max_steps=4,
                    batch_size=12, eval_size=12)
    result = train_encoder(config, tmp_path / "sup")
    assert result.data_stats["states_with_positive_and_negative"] == 24
    assert result.loss_after < result.loss_before, (result.loss_before, result.loss_after)
    loaded = Encoder.from_pretrained(result.encoder_dir, device="cpu", use_cache=False)
    assert loaded.pooling == "cls_before_pooler"
    assert result.reload_max_abs_diff < 1e-5
    print(f"\nsup: fixed-batch loss {result.loss_before:.4f} -> {result.loss_after:.4f}, "
          f"{result.seconds_per_step:.3f} s/step")


def test_seeded_runs_are_identical(tmp_path: Path) -> None:
    config = _small(max_steps=2, eval_size=4, batch_size=4)
    first = train_encoder(config, tmp_path / "a")
    second = train_encoder(config, tmp_path / "b")
    assert (first.loss_before, first.loss_after) == (second.loss_before, second.loss_after)
    a = Encoder.from_pretrained(first.encoder_dir, device="cpu", use_cache=False).encode(PROBE)
    b = Encoder.from_pretrained(second.encoder_dir, device="cpu", use_cache=False).encode(PROBE)
    np.testing.assert_array_equal(a, b)


def test_command_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from memento.cli.entry import main

    out = tmp_path / "run"
    code = main(["train-encoder", "--data", str(SIMCSE / "pairs.jsonl"), "--mode", "sup", "--out", str(out),
                 "--max-steps", "2", "--batch-size", "8", "--max-length", "32", "--eval-size", "8",
                 "--accelerator", "cpu", "--no-progress"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "contrastive loss on a fixed batch:" in printed and f"encoder saved to {out / 'encoder'}" in printed
    assert json.loads((out / "result.json").read_text())["steps"] == 2
    bank = tmp_path / "bank"
    assert main(["bank", "import", str(SIMCSE / "cases.jsonl"), "--bank", str(bank), "--encoder",
                 str(out / "encoder")]) == 0
    capsys.readouterr()
    assert main(["bank", "search", "What is the capital of Peru?", "--bank", str(bank), "-k", "2", "--json"]) == 0
    hits = json.loads(capsys.readouterr().out)
    assert len(hits) == 2
