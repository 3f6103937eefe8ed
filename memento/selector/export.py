"""Export a trained selector as a self-describing directory, verify one, load one.

- :func:`export_selector` turns a soft-Q run of the online loop (``memento online`` / ``memento demo``)
  into an artifact (layout and checksum rules in :mod:`memento.selector.artifact`). The source may be a run
  directory (``checkpoints/demo/soft_q``), a comparison directory holding a ``soft_q`` run
  (``checkpoints/demo``), one of a run's checkpoint directories, or another artifact (copied, with a
  fresh manifest). From a run, the newest complete checkpoint gives the learner, the replay buffer and
  the number of cases: the bank is copied as it was at that checkpoint.
- :func:`create_selector` makes an artifact from any case bank with a fresh, untrained Q-network (it
  then learns from feedback with ``learn=True``).
- :func:`verify` runs the checks :func:`load_selector` runs (:func:`memento.selector.artifact.check_artifact`:
  confinement, checksums, formats, safetensors headers and tensors, dimensions) without loading the
  encoder; what an artifact may hold and what loading trusts is in ``docs/security.md``.
- :func:`load_selector` returns a :class:`~memento.selector.runtime.Selector` after the same checks.

Loading and selecting import neither Lightning nor an LLM client (nor FastAPI or MCP).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
from pathlib import Path
from typing import Any, Literal

import torch

from memento.bank import CaseBank, bank_exists, bankfile, copy_bank, parse_bank_uri
from memento.bank.local import DERIVED_NAMES
from memento.config import (
    FIXED_SETS,
    MAX_CANDIDATES,
    MAX_K,
    MAX_REPLAY_CAPACITY,
    MAX_STEPS,
    MAX_UPDATES_PER_STEP,
    EvidenceConfig,
    LearnerConfig,
    QNetConfig,
    ReplayConfig,
    from_dict,
    to_dict,
)
from memento.encoders import DEFAULT_MODEL_ID
from memento.errors import CheckpointError, ConfigError, DimensionError
from memento.io import sqlite_copy
from memento.learn.learner import SoftQLearner
from memento.learn.persist import LEARNER_DIR, REPLAY_DIR, load_trained_learner
from memento.learn.qnet import build_qnet
from memento.learn.replay import ReplayBuffer
from memento.policies import SoftQConfig
from memento.runs.qa import LoopConfig
from memento.runs.rundir import RunDir, read_json
from memento.selector.artifact import BANK_DIR, EncoderSpec, SelectorConfig
from memento.selector.artifact.manifest import has_manifest
from memento.selector.runtime import Selector
from memento.types import shown

__all__ = ["create_selector", "export_selector", "load_selector", "verify"]

logger = logging.getLogger(__name__)

_SUMMARY_KEYS = ("steps", "success_rate", "moving_success_rate", "window", "success_by_window", "llm_calls",
                 "bank_size_start", "bank_size_end", "retained", "updates", "final_alpha", "cumulative_reward")


def load_selector(path: str | Path, device: str | torch.device | None = None, *, learn: bool = False,
                  seed: int = 0, verify: bool = True, encoder: Any = None, revision: str | None = None,
                  audit: bool = False) -> Selector:
    """Load a selector artifact: a directory, or a Hugging Face Hub id written ``"hf://user/repo"`` (at
    ``revision``), resolved from the Hugging Face cache offline and downloaded online (:mod:`memento.hub`); a
    missing directory is a one-line ``CheckpointError``, never a Hub lookup.

    - ``device``: where the Q-network, learner and replay buffer live (default: the CPU); the text
      encoder uses it too when given (default: CUDA when present);
    - ``learn``: keep training from :meth:`~memento.selector.runtime.Selector.feedback` (save with ``save()``);
    - ``seed``: seeds the sampling generator (same seed, same calls: same selections);
    - ``verify``: check every file's sha256 against the manifest first (dimensions and format versions
      are always checked); a tampered, truncated or missing file raises ``CheckpointError`` naming it;
    - ``encoder``: an object with ``encode(texts)`` and ``dim`` to encode query texts instead of the one
      ``encoder.json`` names (needed when the run used a custom encoder);
    - ``audit``: a deleted case's history keeps its values (:meth:`~memento.selector.runtime.Selector.history`).
    """
    return Selector.load(path, device, learn=learn, seed=seed, verify=verify, encoder=encoder, revision=revision,
                         audit=audit)


def verify(path: str | Path) -> dict[str, Any]:
    """Check an artifact as :func:`load_selector` does, without loading its encoder or opening its bank.

    The same checks (:func:`memento.selector.artifact.check_artifact`): no symbolic link anywhere in it, manifest
    entries confined to it, checksums, format versions, configs, every safetensors file parsed (the learner
    and replay state are read on the CPU), the Q-network file against the learner, the SQLite files'
    formats, and that all parts agree on the embedding dimension. Returns ``{"path", "files", "cases",
    "feedbacks", "cases_since_save", "feedbacks_since_save", "dim", "manifest"}``; raises a one-line
    ``CheckpointError`` (a damaged or unsafe file) or ``DimensionError``.
    """
    path = Path(path)
    checked = Selector.check(path, verify=True, device="cpu")
    assert checked.report is not None  # verify=True
    return {"path": str(path), "files": checked.report["files"], **checked.counts(), "dim": checked.spec.dim,
            "manifest": checked.manifest}


# ---------------------------------------------------------------- export


@dataclasses.dataclass(frozen=True)
class _Source:
    kind: Literal["run", "checkpoint"]
    path: Path
    run_dir: Path
    learner_dir: Path
    replay_dir: Path | None
    bank_dir: Path
    bank_cases: int | None
    bank_uid: str | None
    step: int | None
    loop: LoopConfig
    summary: dict[str, Any] | None
    comparison: dict[str, Any] | None
    run_info: dict[str, Any] | None


def _resolve_source(source: Path) -> _Source:
    if not source.exists():
        raise CheckpointError(f"{source}: not found")
    if not source.is_dir():
        raise CheckpointError(f"{source}: not a directory (expected a run, a comparison or a checkpoint directory)")
    if (source / RunDir.STATE).is_file():
        kind: Literal["run", "checkpoint"] = "checkpoint"
        run, ckpt = RunDir(source.parent), source
    elif RunDir(source).is_run():
        kind, run = "run", RunDir(source)
        ckpt = run.latest_checkpoint()
    elif (source / "comparison.json").is_file() or (source / "soft_q").is_dir():
        if RunDir(source / "soft_q").config_path.is_file():
            return _resolve_source(source / "soft_q")
        policies = sorted(p.name for p in source.iterdir() if RunDir(p).config_path.is_file())
        raise CheckpointError(f"{source}: a comparison without a soft_q run (runs: {', '.join(policies) or 'none'}); "
                              "only soft_q trains a selector")
    else:
        raise CheckpointError(f"{source}: not a run directory (config.json + bank/), a comparison directory "
                              "(comparison.json + soft_q/) or a checkpoint (state.json)")
    state = None if ckpt is None else RunDir.read_state(ckpt)  # refuses other formats in one line
    config_path = (ckpt if ckpt is not None else run.path) / RunDir.CONFIG
    try:
        loop = from_dict(LoopConfig, read_json(config_path))
    except ConfigError as error:
        raise CheckpointError(f"{config_path}: not this memento's online-loop config ({error}); a run written "
                              "before the nested LoopConfig (checkpoint format 1) cannot be exported") from None
    if not isinstance(loop.policy, SoftQConfig):
        raise ConfigError(f"{run.path}: a {loop.policy_kind!r} run; only soft_q runs train a selector (a Q-network)")
    summary, run_info = run.read_summary(), run.read_run_info()
    comparison = None
    if (run.path.parent / "comparison.json").is_file():
        comparison = read_json(run.path.parent / "comparison.json")
        if not isinstance(comparison, dict) or run.path.name not in (comparison.get("policies") or {}):
            comparison = None
    final = run.selector
    step = None if ckpt is None else RunDir.checkpoint_step(ckpt)
    use_final = kind == "run" and (final / "learner.json").is_file() and (
        ckpt is None or (summary is not None and int(summary.get("steps", 0)) > int(step or 0)))
    if use_final:  # no checkpoint, or the run went on past its last one: the final learner, the whole bank
        return _Source(kind=kind, path=source, run_dir=run.path, learner_dir=final, replay_dir=None,
                       bank_dir=run.bank, bank_cases=None, bank_uid=None,
                       step=None if summary is None else int(summary["steps"]), loop=loop, summary=summary,
                       comparison=comparison, run_info=run_info)
    if ckpt is None or state is None:
        raise CheckpointError(f"{run.path}: no trained selector yet (no complete checkpoint and no selector/)")
    if not (ckpt / LEARNER_DIR).is_dir():
        raise CheckpointError(f"{ckpt}: no {LEARNER_DIR}/ in this checkpoint")
    return _Source(kind=kind, path=source, run_dir=run.path, learner_dir=ckpt / LEARNER_DIR,
                   replay_dir=ckpt / REPLAY_DIR if (ckpt / REPLAY_DIR).is_dir() else None, bank_dir=run.bank,
                   bank_cases=int(state["bank_size"]), bank_uid=str(state.get("bank_uid")), step=int(state["step"]),
                   loop=loop, summary=summary, comparison=comparison, run_info=run_info)


def _copy_bank(src: _Source, dst: Path, dim: int) -> tuple[Any, int]:
    """Copy the run's bank (as it was at the checkpoint) to ``dst``; returns (BankConfig, cases)."""

    db = src.bank_dir / "cases.sqlite"
    if not db.is_file():
        raise CheckpointError(f"{src.bank_dir}: the run's case bank is missing (no cases.sqlite)")
    dst.mkdir(parents=True)
    sqlite_copy(db, dst / "cases.sqlite")
    for name in DERIVED_NAMES:
        if (src.bank_dir / name).is_file():
            shutil.copy2(src.bank_dir / name, dst / name)
    truncated = False
    with CaseBank.open(dst, use_gpu=False) as bank:
        if bank.dim != dim:
            raise DimensionError(f"{src.bank_dir}: the bank holds dim={bank.dim} vectors, the Q-network of "
                                 f"{src.learner_dir} takes dim={dim}")
        if src.bank_uid is not None and bank.uid != src.bank_uid:
            raise CheckpointError(f"{src.path}: the checkpoint was saved for bank uid {src.bank_uid}, "
                                  f"{src.bank_dir} has uid {bank.uid}")
        if src.bank_cases is not None:
            if len(bank) < src.bank_cases:
                raise CheckpointError(f"{src.path}: the checkpoint counts {src.bank_cases} cases, {src.bank_dir} "
                                      f"holds {len(bank)}")
            truncated = bank.truncate(src.bank_cases) > 0  # cases retained after the checkpoint
        config, cases = bank.config, len(bank)
    if truncated:  # drop the freed pages, so the removed cases do not linger in the file
        bankfile.vacuum(dst / "cases.sqlite")
    return config, cases


def _encoder_spec(encoder_config: Any, run_info: dict[str, Any] | None, dim: int) -> EncoderSpec:
    described = None if run_info is None else run_info.get("encoder")
    info = described if isinstance(described, dict) else {}
    if encoder_config is not None:
        if encoder_config.model is not None:  # a missing local path is an error, never recorded as a Hub id
            from memento.hub import local_or_hub

            local_or_hub(encoder_config.model, what="the bank's encoder", error=CheckpointError)
        return EncoderSpec(kind="transformers", model=encoder_config.model, pooling=encoder_config.pooling,
                           max_length=encoder_config.max_length, normalize=encoder_config.normalize, dim=dim,
                           model_id=info.get("model_id"), fingerprint=info.get("fingerprint"),
                           revision=info.get("revision"))
    if info.get("model_id") and info.get("pooling"):  # a memento.Encoder that the bank did not record
        model_id = str(info["model_id"])
        return EncoderSpec(kind="transformers", model=None if model_id == DEFAULT_MODEL_ID else model_id,
                           model_id=model_id, pooling=info["pooling"], max_length=int(info.get("max_length", 256)),
                           normalize=bool(info.get("normalize", True)), dim=dim, fingerprint=info.get("fingerprint"),
                           revision=info.get("revision"))
    return EncoderSpec(kind="none", dim=dim, description=None if described is None else str(described))


def _source_info(src: _Source, cases: int, updates: int) -> dict[str, Any]:
    info = src.run_info or {}
    summary = None if src.summary is None else {k: src.summary[k] for k in _SUMMARY_KEYS if k in src.summary}
    comparison = None
    if src.comparison is not None:
        comparison = {key: src.comparison.get(key) for key in ("order", "window", "late_steps", "steps", "seed")}
        comparison["policies"] = {
            name: {k: r.get(k) for k in ("success_rate", "success_early", "success_late", "llm_calls")}
            for name, r in (src.comparison.get("policies") or {}).items()}
    return {"kind": src.kind, "path": str(src.path.resolve()), "run_dir": str(src.run_dir.resolve()),
            "policy": src.loop.policy_kind, "step": src.step, "steps": src.loop.steps, "seed": src.loop.seed,
            "bank_cases": cases, "learner_updates": updates, "planner": info.get("planner"),
            "judge": info.get("judge"), "n_tasks": info.get("n_tasks"),
            "tasks_fingerprint": info.get("tasks_fingerprint"), "encoder": info.get("encoder"),
            "summary": summary, "comparison": comparison}


def _prepare_out(out: Path, overwrite: bool) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        if not overwrite:
            raise CheckpointError(f"{out}: already exists and is not empty (overwrite=True / --force replaces it)")
        if not has_manifest(out):
            raise CheckpointError(f"{out}: exists and is not a selector artifact; refusing to replace it")


def _fresh_tmp(out: Path) -> Path:
    """The empty directory beside ``out`` where a new artifact is assembled (a leftover is removed)."""
    tmp = out.parent / f".{out.name}.export-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    return tmp


def export_selector(source: str | Path, out_dir: str | Path, *, overwrite: bool = False) -> Path:
    """Write a selector artifact to ``out_dir`` from a soft-Q run, a comparison, a checkpoint or an artifact.

    The directory is assembled beside ``out_dir`` and renamed into place when complete. An existing
    non-empty ``out_dir`` is refused unless ``overwrite`` (and then only if it is an artifact).
    """

    source, out = Path(source), Path(out_dir)
    _prepare_out(out, overwrite)
    if source.is_dir() and has_manifest(source):  # an artifact: a verified copy
        if out.exists() and out.resolve() == source.resolve():
            raise CheckpointError(f"{out}: is the source artifact itself")
        with load_selector(source) as selector:
            selector.save(out, overwrite=overwrite)
        logger.info("exported a copy of selector %s to %s", source, out)
        return out

    src = _resolve_source(source)
    soft_q = src.loop.policy
    assert isinstance(soft_q, SoftQConfig)  # _resolve_source refuses other policies
    learner = SoftQLearner.load(src.learner_dir, device="cpu")
    dim = learner.qnet.config.dim
    if src.replay_dir is not None:
        buffer = ReplayBuffer.load(src.replay_dir, device="cpu")
    else:
        buffer = ReplayBuffer(ReplayConfig(capacity=soft_q.replay_capacity, dim=dim, k_max=src.loop.k), device="cpu")
    if buffer.config.dim != dim:
        raise DimensionError(f"{src.replay_dir}: the replay buffer holds dim={buffer.config.dim}, the Q-network "
                             f"of {src.learner_dir} takes dim={dim}")
    tmp = _fresh_tmp(out)
    try:
        bank_config, cases = _copy_bank(src, tmp / BANK_DIR, dim)
        spec = _encoder_spec(bank_config.encoder, src.run_info, dim)
        config = SelectorConfig(k=src.loop.k, candidates=src.loop.candidates, alpha=None,
                                positive_only=soft_q.positive_only, warmup=soft_q.warmup,
                                updates_per_step=soft_q.updates_per_step, qnet=learner.qnet.config,
                                learner=learner.config, replay=buffer.config, index=bank_config.index,
                                evidence=soft_q.evidence, sets=soft_q.sets, run=to_dict(src.loop))
        Selector.create(tmp, out, learner=learner, buffer=buffer, config=config, spec=spec, cases=cases,
                         source=_source_info(src, cases, learner.updates))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    logger.info("exported selector %s -> %s (%d cases, dim %d, %d updates)", src.path, out, cases, dim,
                learner.updates)
    return out


def _stage_bank(where: Any, dst: Path, bank_options: Any | None) -> None:
    """A copy of the bank at ``where`` in the (existing, empty) directory ``dst``: a directory bank's files as
    they are (usage statistics and action vectors included), a Milvus bank's rows, ids, positions and vectors."""
    if where.path is not None:
        sqlite_copy(where.path / "cases.sqlite", dst / "cases.sqlite")
        for name in DERIVED_NAMES:
            if (where.path / name).is_file():
                shutil.copy2(where.path / name, dst / name)
    else:
        copy_bank(where, dst, options=bank_options)


def _create_spec(encoder: Any, bank_config: Any, dim: int, where: Any) -> EncoderSpec:
    """The encoder of :func:`create_selector`: given, described by a memento.Encoder, or the bank's."""
    if isinstance(encoder, EncoderSpec):
        spec = encoder
    elif encoder is not None and callable(getattr(encoder, "describe", None)):
        spec = _encoder_spec(getattr(encoder, "config", None), {"encoder": encoder.describe()}, dim)
    elif encoder is not None:
        raise ConfigError(f"create_selector: encoder={encoder!r}: expected an EncoderSpec, a memento.Encoder "
                          "or None")
    else:
        spec = _encoder_spec(bank_config.encoder, None, dim)
    if spec.dim != dim:
        raise DimensionError(f"create_selector: the encoder gives dim={spec.dim}, bank {where} holds dim={dim}")
    return spec


def _create_learner(trained: str | Path | None, qnet: QNetConfig | None, learner: LearnerConfig | None, dim: int,
                    where: Any) -> SoftQLearner:
    """The learner of :func:`create_selector`: a trained one (single-step), or a fresh one on the CPU."""
    if trained is not None:
        if qnet is not None or learner is not None:
            raise ConfigError("create_selector: pass either trained= or qnet=/learner=, not both")
        trainer = load_trained_learner(trained, dim)
        if trainer.config.gamma != 0.0:
            raise ConfigError(f"{trained}: trained with gamma={trainer.config.gamma}; a selector learns "
                              "single-step (gamma=0) from feedback")
        return trainer
    qnet_config = qnet if qnet is not None else QNetConfig(dim=dim, hidden=128, dropout=0.0, embed_dim=64)
    if qnet_config.dim != dim:
        raise DimensionError(f"create_selector: qnet.dim={qnet_config.dim}, bank {where} holds dim={dim}")
    learner_config = learner if learner is not None else LearnerConfig(gamma=0.0, lr=3e-3, weight_decay=0.0,
                                                                        batch_size=64, alpha=0.2)
    return SoftQLearner(build_qnet(qnet_config, torch.Generator().manual_seed(qnet_config.seed)), learner_config,
                        device="cpu")


def create_selector(bank: str | Path, out_dir: str | Path, *, encoder: Any = None, qnet: QNetConfig | None = None,
                    learner: LearnerConfig | None = None, k: int = 4, candidates: int = 32,
                    replay_capacity: int = 10_000, warmup: int = 16, updates_per_step: int = 1,
                    overwrite: bool = False, trained: str | Path | None = None, positive_only: bool = False,
                    bank_options: Any | None = None) -> Path:
    """A selector artifact over an existing case bank, with a fresh (untrained) Q-network.

    For a bank built without a run (imported cases, Memento memories): load it with ``learn=True`` and it
    trains from feedback. ``bank`` is a case bank directory (copied with its usage statistics and action vectors;
    its index factory is kept) or a Milvus bank ``milvus:URI[#collection]`` (its rows copied into the artifact's
    own directory bank by :func:`memento.bank.copy_bank`; ``bank_options``: its
    :class:`~memento.bank.MilvusOptions`). The artifact always holds its own directory bank.
    ``encoder``: an :class:`EncoderSpec`, a :class:`memento.Encoder` (its description is recorded), or
    ``None`` for the encoder the bank records (if none, the artifact takes vectors only). ``qnet`` and
    ``learner`` default to the online loop's soft-Q settings (``dim`` comes from the bank).
    ``trained``: a trained selector directory (``SoftQLearner.save``; a ``memento train`` run directory or
    its ``selector/``) whose Q-network and learner settings replace the fresh ones (``qnet``/``learner``
    must then be None): an offline-trained selector over a bank. ``positive_only``: choose among the
    candidates with stored reward > 0 only (:class:`~memento.selector.artifact.SelectorConfig`).
    """

    for name, value, low, high in (("k", k, 1, MAX_K), ("candidates", candidates, 1, MAX_CANDIDATES),
                                   ("replay_capacity", replay_capacity, 1, MAX_REPLAY_CAPACITY),
                                   ("warmup", warmup, 0, MAX_STEPS),
                                   ("updates_per_step", updates_per_step, 0, MAX_UPDATES_PER_STEP)):
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ConfigError(f"create_selector: {name}={shown(value, 40)}: must be an integer in {low}..{high}")
    if candidates < k:
        raise ConfigError(f"create_selector: k={k}: must be <= candidates={candidates}")
    where, out = parse_bank_uri(bank), Path(out_dir)
    bank_dir = where.path  # a directory bank's; None for a Milvus bank
    if bank_dir is not None:
        if not (bank_dir / "cases.sqlite").is_file():
            raise CheckpointError(f"{bank_dir}: not a case bank (no cases.sqlite)")
    elif not bank_exists(where, options=bank_options):  # an unreachable server or no such collection: one line
        raise CheckpointError(f"{where}: not a case bank (no such collection)")
    _prepare_out(out, overwrite)
    tmp = _fresh_tmp(out)
    (tmp / BANK_DIR).mkdir()
    try:
        _stage_bank(where, tmp / BANK_DIR, bank_options)
        with CaseBank.open(tmp / BANK_DIR, use_gpu=False) as copy:
            dim, cases, bank_config = copy.dim, len(copy), copy.config
        spec = _create_spec(encoder, bank_config, dim, where)
        trainer = _create_learner(trained, qnet, learner, dim, where)
        qnet_config, learner_config = trainer.qnet.config, trainer.config
        case_dim = qnet_config.case_dim
        buffer = ReplayBuffer(ReplayConfig(capacity=replay_capacity, dim=dim, k_max=k,
                                           case_dim=None if case_dim == dim else case_dim), device="cpu")
        config = SelectorConfig(k=k, candidates=candidates, positive_only=positive_only, warmup=warmup,
                                updates_per_step=updates_per_step,
                                qnet=qnet_config, learner=learner_config, replay=buffer.config,
                                index=bank_config.index, evidence=EvidenceConfig(), sets=FIXED_SETS)
        source = {"kind": "bank", "path": str(bank_dir.resolve()) if bank_dir is not None else where.text,
                  "bank_cases": cases,
                  "learner_updates": trainer.updates, "policy": "soft_q", "summary": None, "comparison": None}
        if trained is not None:
            source.update(kind="trained", trained=str(Path(trained).resolve()))
        Selector.create(tmp, out, learner=trainer, buffer=buffer, config=config, spec=spec, cases=cases,
                         source=source)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    logger.info("created selector %s over bank %s (%d cases, dim %d, %s)", out, where, cases, dim,
                "untrained" if trained is None else f"Q-network from {trained}")
    return out
