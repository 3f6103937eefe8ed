"""Offline training data: logged (state, case, reward) decisions, encoded once, split by state.

Three inputs (:class:`~memento.training.config.DataConfig` ``source``):

- ``"log"`` -- the online loop's transition log ``steps.jsonl`` (see :mod:`memento.runs.qa`). Each
  record with a non-empty ``chosen_ids`` is one decision: the state text ``state``, the K chosen
  case ids ``chosen_ids`` with their logged ``propensities`` (each case's first-draw probability,
  in ``(0, 1]``), and the set's ``reward``. Case texts come from the run's case bank
  (``CaseBank.open``; by default ``bank/`` beside the log). Optional, for multi-step soft TD:
  ``"done": false`` with ``"next_state"`` (text) and ``"next_candidate_ids"`` (ids); the online
  loop is single-step and writes ``done: true``.
- ``"memento"`` -- Memento's retriever pairs ``{"query", "case", "case_label", "plan",
  "truth_label"}`` with the case memory ``{"case", "plan", "case_label"}`` they refer to (the
  readers of :mod:`memento.formats`). Each pair is one decision with K = 1: state ``query``, case
  ``case`` (matched to the memory by its text; pairs whose case is not in the memory are kept and
  counted), reward ``truth_label`` (1.0 or 0.0). The reference gives every case retrieved for a
  query that query's task-level label, so no query has mixed labels and per-query ranking is not
  learnable from these data (:func:`label_warning` says so).
- ``"cases"`` -- a Case JSONL bank (docs/formats.md; every case needs an ``id``) plus a **rewards file**,
  JSONL with one (state, case, reward) observation per line::

      {"state": "question text", "case_id": "id in the cases file", "reward": 1.0, "propensity": 0.25}

  (a reward is a number in [0, 1], as every case reward: :func:`memento.types.check_reward`)

  ``propensity`` is optional (default 1.0, i.e. no importance weight); no other keys are allowed.
  Each line is one decision with K = 1.
- ``"labels"`` -- planner-scored labels (:mod:`memento.learn.labels`, written by ``memento score``) with the
  case bank their candidate ids refer to. Each row is one *task*: its state (the question, encoded with
  the encoder), its C candidates (their **stored bank embeddings**, the vectors the online policy scores)
  and their scores ``mean_logprob`` (``TrainingData.score_NK``). These data are trained with the listwise
  loss of :mod:`memento.learn.listwise` and served as :class:`~memento.learn.listwise.ListwiseBatch` batches; rewards
  are not used (``reward_N`` is 0) and the split is by state, unstratified.

Every text is encoded once through the cached encoder (:class:`memento.Encoder`, or anything with
``encode(texts) -> [N, D]`` and ``dim``); the rows then hold indices into one state table and one
case table (:class:`TrainingData`), and a batch is gathered from them as a
:class:`memento.learn.replay.ReplayBatch` (``state_BD``, ``cases_BKD``, ``reward_B``, ``propensity_BK``,
``mask_BK``, ...). Bad rows raise ``DataFormatError`` with ``file:line``.

**Labels per state.** A (state, case) pair's label is the mean reward of the decisions that showed
that case for that state; it is *rewarded* when this is >= ``label_threshold``. A state has *mixed
labels* when it has both rewarded and unrewarded cases: only such states say which case to show
(:meth:`TrainingData.label_stats`, and the per-state ``hit@K`` metrics on validation).

**Split by state.** :func:`split_by_state` holds out a ``val_fraction`` of the distinct states,
stratified by their labels (all rewarded / all unrewarded / mixed) and seeded, so no state text is
in both splits and both splits see every kind of state where there are enough.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch

from memento.config import CASE_SCALARS
from memento.errors import ConfigError, DataFormatError, DimensionError
from memento.formats import iter_jsonl, read_memento_memory, read_memento_training_pairs
from memento.learn.listwise import ListwiseBatch
from memento.learn.replay import ReplayBatch
from memento.training.config import DataConfig
from memento.types import check_reward, finite_float, shown

__all__ = ["EpochSampler", "ListwiseDataset", "QDataModule", "RankingBatch", "RankingDataset", "RowDataset",
           "TrainingData", "check_inputs", "label_warning", "load_cases_rewards", "load_data", "load_labels",
           "load_memento_pairs", "load_transition_log", "resolve_log", "split_by_state"]

logger = logging.getLogger(__name__)

REWARD_KEYS = {"state", "case_id", "reward", "propensity"}


# ---------------------------------------------------------------- the encoded data


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainingData:
    """Encoded decisions in index form (numpy; N rows, S states, M cases, K = ``k_max``, C next candidates).

    - ``states_SD``, ``cases_MD``: unit vectors of the distinct state texts and cases;
    - ``state_texts`` (S), ``case_keys`` (M): what they are (case ids, or case texts for Memento pairs);
    - ``state_N``: each row's state; ``cases_NK``: its chosen cases (0 on padding), ``mask_NK`` which
      slots hold one; ``reward_N``; ``propensity_NK`` (1 on padding); ``done_N``;
    - ``next_state_N`` (-1: none), ``next_cands_NC``, ``next_mask_NC``: next states for soft TD, or
      ``None`` when no row has one;
    - ``origins``: ``"file:line"`` of each row (for error messages); ``source``: where it came from;
    - ``notes``: counts the loader wants reported (skipped records, cases missing from a memory...);
    - ``score_NK``: planner-scored labels only (``source="labels"``): each row is one task, ``cases_NK`` its
      candidates and ``score_NK`` their ``mean_logprob`` (0 on padding); ``None`` for reward data.
    """

    states_SD: np.ndarray
    cases_MD: np.ndarray
    state_texts: list[str]
    case_keys: list[str]
    state_N: np.ndarray
    cases_NK: np.ndarray
    mask_NK: np.ndarray
    reward_N: np.ndarray
    propensity_NK: np.ndarray
    done_N: np.ndarray
    origins: list[str]
    source: str
    next_state_N: np.ndarray | None = None
    next_cands_NC: np.ndarray | None = None
    next_mask_NC: np.ndarray | None = None
    notes: dict[str, Any] = dataclasses.field(default_factory=dict)
    score_NK: np.ndarray | None = None

    def __post_init__(self) -> None:
        n = self.state_N.shape[0]
        if self.states_SD.ndim != 2 or self.cases_MD.ndim != 2 or self.cases_MD.shape[1] not in (
                self.states_SD.shape[1], 2 * self.states_SD.shape[1] + CASE_SCALARS):
            raise DimensionError(f"TrainingData: states_SD.shape={self.states_SD.shape} and cases_MD.shape="
                                 f"{self.cases_MD.shape} must be (S, D) and (M, D), or (M, 2D + {CASE_SCALARS}) with "
                                 "case features")
        k = self.cases_NK.shape[1] if self.cases_NK.ndim == 2 else -1
        shapes = {"cases_NK": (n, k), "mask_NK": (n, k), "reward_N": (n,), "propensity_NK": (n, k), "done_N": (n,)}
        for name, shape in shapes.items():
            if getattr(self, name).shape != shape:
                raise DimensionError(f"TrainingData: {name}.shape={getattr(self, name).shape}, expected {shape} "
                                     f"(state_N.shape={self.state_N.shape})")
        if len(self.origins) != n:
            raise DimensionError(f"TrainingData: {len(self.origins)} origins for {n} rows")
        if self.score_NK is not None:
            if self.score_NK.shape != (n, k):
                raise DimensionError(f"TrainingData: score_NK.shape={self.score_NK.shape}, expected {(n, k)}")
            if not np.isfinite(self.score_NK).all():
                raise DataFormatError("TrainingData: score_NK holds NaN or inf")

    @property
    def listwise(self) -> bool:
        """Whether these are planner-scored labels (trained with the listwise loss), not rewards."""
        return self.score_NK is not None

    @property
    def n_rows(self) -> int:
        return int(self.state_N.shape[0])

    @property
    def dim(self) -> int:
        return int(self.states_SD.shape[1])

    @property
    def k_max(self) -> int:
        return int(self.cases_NK.shape[1])

    @property
    def has_next(self) -> bool:
        return self.next_state_N is not None

    @property
    def n_pairs(self) -> int:
        """(state, case, reward) samples: the valid slots of all rows."""
        return int(self.mask_NK.sum())

    def pair_labels(self, rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The distinct (state, case) pairs of ``rows`` (default all): ``state_P``, ``case_P`` and the mean
        reward ``reward_P`` of the decisions that showed that case for that state."""
        rows = np.arange(self.n_rows) if rows is None else np.asarray(rows, dtype=np.int64)
        mask = self.mask_NK[rows]
        state_p = np.repeat(self.state_N[rows], mask.sum(axis=1))
        case_p = self.cases_NK[rows][mask]
        reward_p = np.repeat(self.reward_N[rows], mask.sum(axis=1)).astype(np.float64)
        m = max(1, self.cases_MD.shape[0])
        keys, inverse = np.unique(state_p.astype(np.int64) * m + case_p, return_inverse=True)
        total = np.bincount(inverse, weights=reward_p, minlength=keys.size)
        count = np.bincount(inverse, minlength=keys.size)
        return keys // m, keys % m, total / np.maximum(count, 1)

    def state_kinds(self, threshold: float, rows: np.ndarray | None = None) -> dict[int, str]:
        """Each state of ``rows``: ``"rewarded"`` (all its cases), ``"unrewarded"`` or ``"mixed"``."""
        state_p, _, reward_p = self.pair_labels(rows)
        positive = reward_p >= threshold
        n_states = self.states_SD.shape[0]
        pos = np.bincount(state_p, weights=positive, minlength=n_states)
        tot = np.bincount(state_p, minlength=n_states)
        kinds: dict[int, str] = {}
        for s in np.flatnonzero(tot):
            kinds[int(s)] = "rewarded" if pos[s] == tot[s] else "unrewarded" if pos[s] == 0 else "mixed"
        return kinds

    def label_stats(self, threshold: float, rows: np.ndarray | None = None) -> dict[str, int]:
        """Counts: rows, pairs, states, and states whose cases are all rewarded / all unrewarded / mixed."""
        kinds = list(self.state_kinds(threshold, rows).values())
        rows_n = self.n_rows if rows is None else len(rows)
        pairs = int(self.mask_NK.sum() if rows is None else self.mask_NK[np.asarray(rows, dtype=np.int64)].sum())
        return {"rows": int(rows_n), "pairs": pairs, "states": len(kinds), "mixed": kinds.count("mixed"),
                "all_rewarded": kinds.count("rewarded"), "all_unrewarded": kinds.count("unrewarded")}

    def ranking_groups(self, threshold: float, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                                           np.ndarray]:
        """The states of ``rows`` with mixed labels and their labelled cases, padded:
        ``state_G``, ``cases_GC``, ``label_GC`` (0/1) and ``mask_GC``."""
        state_p, case_p, reward_p = self.pair_labels(rows)
        kinds = self.state_kinds(threshold, rows)
        mixed = sorted(s for s, kind in kinds.items() if kind == "mixed")
        if not mixed:
            empty = np.zeros((0, 1), dtype=np.int64)
            return np.zeros(0, dtype=np.int64), empty, empty.astype(np.float32), empty.astype(bool)
        groups = [np.flatnonzero(state_p == s) for s in mixed]
        c = max(len(g) for g in groups)
        cases_gc = np.zeros((len(mixed), c), dtype=np.int64)
        label_gc = np.zeros((len(mixed), c), dtype=np.float32)
        mask_gc = np.zeros((len(mixed), c), dtype=bool)
        for i, g in enumerate(groups):
            cases_gc[i, :len(g)] = case_p[g]
            label_gc[i, :len(g)] = reward_p[g] >= threshold
            mask_gc[i, :len(g)] = True
        return np.asarray(mixed, dtype=np.int64), cases_gc, label_gc, mask_gc


def label_warning(stats: dict[str, int]) -> str | None:
    """A warning when few states have mixed labels (so which case to show per state is barely learnable)."""
    states, mixed = stats["states"], stats["mixed"]
    if states == 0:
        return None
    if mixed == 0:
        return (f"no state has mixed labels: all {states} states have only rewarded ({stats['all_rewarded']}) or only "
                f"unrewarded ({stats['all_unrewarded']}) cases, so which case to show for a state cannot be learned "
                "from these data (Memento's training pairs give every case of a query the task's label); the Q-network "
                "can only learn which states succeed, which is what the held-out AUC measures")
    if mixed < 0.5 * states:
        return (f"only {mixed} of {states} states have mixed labels ({stats['all_rewarded']} all rewarded, "
                f"{stats['all_unrewarded']} all unrewarded): per-state ranking is learned from those {mixed} alone")
    return None


# ---------------------------------------------------------------- readers


def _text(row: dict[str, Any], name: str) -> str:
    value = row.get(name)
    if not isinstance(value, str) or not value.strip():
        raise DataFormatError(f"field {name!r} must be a non-empty string, got {value!r}")
    return value


def _reward(row: dict[str, Any]) -> float:
    """A row's ``reward``: a number in [0, 1] (:func:`memento.types.check_reward`, the range every case reward has;
    the loss reads it as a success probability)."""
    if "reward" not in row:
        raise DataFormatError("missing field 'reward'")
    return check_reward(row["reward"], "field 'reward'")


def _ids(row: dict[str, Any], name: str) -> list[str]:
    value = row.get(name)
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise DataFormatError(f"field {name!r} must be a list of case ids (strings), got {value!r}")
    return value


def _propensity(value: Any, name: str) -> float:
    number = finite_float(value)
    if number is None or not 0.0 < number <= 1.0:
        raise DataFormatError(f"{name} must be numbers in (0, 1], got {shown(value)}")
    return number


def _encode(encoder: Any, texts: Sequence[str], what: str) -> np.ndarray:
    texts = list(texts)
    dim = getattr(encoder, "dim", None)
    if not callable(getattr(encoder, "encode", None)) or not isinstance(dim, int):
        raise ConfigError(f"encoder {encoder!r} needs encode(texts) and an integer dim")
    if not texts:
        return np.zeros((0, dim), dtype=np.float32)
    out = np.asarray(encoder.encode(texts), dtype=np.float32).reshape(len(texts), -1)
    if out.shape[1] != dim:
        raise DimensionError(f"encoder returned {what} vectors of shape {out.shape}; expected dim={dim}")
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    if not np.isfinite(out).all() or (norms == 0).any():
        raise DataFormatError(f"encoder returned NaN, inf or zero vectors for the {what} texts")
    return np.ascontiguousarray(out / norms, dtype=np.float32)


class _Builder:
    """Collects decisions as text/ids, then encodes each distinct text once."""

    def __init__(self) -> None:
        self.state_index: dict[str, int] = {}
        self.case_index: dict[str, int] = {}
        self.case_texts: list[str] = []
        self.rows: list[tuple[int, list[int], float, list[float], bool, int, list[int]]] = []
        self.origins: list[str] = []

    def state(self, text: str) -> int:
        return self.state_index.setdefault(text, len(self.state_index))

    def case(self, key: str, text: str) -> int:
        if key not in self.case_index:
            self.case_index[key] = len(self.case_texts)
            self.case_texts.append(text)
        return self.case_index[key]

    def add(self, origin: str, state: int, cases: list[int], reward: float, propensities: list[float],
            done: bool = True, next_state: int = -1, next_cands: list[int] | None = None) -> None:
        self.rows.append((state, cases, reward, propensities, done, next_state, next_cands or []))
        self.origins.append(origin)

    def build(self, encoder: Any, source: str, notes: dict[str, Any], *, with_next: bool = False) -> TrainingData:
        if not self.rows:
            raise DataFormatError(f"no usable (state, case, reward) rows in the {source} data")
        state_texts = list(self.state_index)
        states = _encode(encoder, state_texts, "state")
        cases = _encode(encoder, self.case_texts, "case")
        n, k = len(self.rows), max(len(r[1]) for r in self.rows)
        cases_nk = np.zeros((n, k), dtype=np.int64)
        mask_nk = np.zeros((n, k), dtype=bool)
        prop_nk = np.ones((n, k), dtype=np.float32)
        for i, (_, ids, _, props, _, _, _) in enumerate(self.rows):
            cases_nk[i, :len(ids)] = ids
            mask_nk[i, :len(ids)] = True
            prop_nk[i, :len(ids)] = props
        extra: dict[str, Any] = {}
        if with_next:
            c = max(1, max(len(r[6]) for r in self.rows))
            next_nc = np.zeros((n, c), dtype=np.int64)
            next_mask = np.zeros((n, c), dtype=bool)
            for i, row in enumerate(self.rows):
                next_nc[i, :len(row[6])] = row[6]
                next_mask[i, :len(row[6])] = True
            extra = {"next_state_N": np.array([r[5] for r in self.rows], dtype=np.int64), "next_cands_NC": next_nc,
                     "next_mask_NC": next_mask}
        return TrainingData(
            states_SD=states, cases_MD=cases, state_texts=state_texts, case_keys=list(self.case_index),
            state_N=np.array([r[0] for r in self.rows], dtype=np.int64), cases_NK=cases_nk, mask_NK=mask_nk,
            reward_N=np.array([r[2] for r in self.rows], dtype=np.float32), propensity_NK=prop_nk,
            done_N=np.array([r[4] for r in self.rows], dtype=bool), origins=self.origins, source=source,
            notes=notes, **extra)


def resolve_log(log: str | Path, bank: str | Path | None = None) -> tuple[Path, Path | str]:
    """``(steps.jsonl, bank)`` for a run directory or a ``steps.jsonl`` path; the bank is ``bank`` (a directory or
    ``milvus:URI[#collection]``, see :func:`memento.bank.parse_bank_uri`), else the ``bank/`` beside the log."""
    path = Path(log)
    steps = path / "steps.jsonl" if path.is_dir() else path
    if path.is_dir() and not steps.is_file():
        runs = sorted(p.parent.name for p in path.glob("*/steps.jsonl"))
        if runs:
            raise DataFormatError(f"a comparison directory with one run per policy; pass one of them: "
                                  f"{', '.join(str(path / r) for r in runs)}", path=path)
    if not steps.is_file():
        raise DataFormatError("transition log not found (expected a run directory holding steps.jsonl, or the "
                              "steps.jsonl file)", path=steps)
    from memento.bank.uri import bank_name

    bank_dir = bank_name(bank) if bank is not None else steps.parent / "bank"
    return steps, bank_dir


def load_transition_log(log: str | Path, encoder: Any, *, bank: str | Path | None = None) -> TrainingData:
    """Decisions of an online-loop transition log, case texts from its bank (see the module docstring)."""
    from memento.bank import open_bank

    steps, bank_dir = resolve_log(log, bank)
    with open_bank(bank_dir, read_only=True) as case_bank:
        texts = {case.id: case.state for case in case_bank.iter_cases()}
        recorded = case_bank.config.encoder
    used = getattr(encoder, "config", None)
    if recorded is not None and used is not None and getattr(used, "model", None) != recorded.model:
        logger.warning("%s was filled by encoder %s, training encodes with %s: the Q-network will see other vectors "
                       "than the bank's", bank_dir, recorded.model or "all-MiniLM-L6-v2",
                       getattr(used, "model", None) or "all-MiniLM-L6-v2")
    b = _Builder()
    skipped = 0
    any_next = False
    for number, row in iter_jsonl(steps):
        try:
            chosen = _ids(row, "chosen_ids")
            if not chosen:
                skipped += 1  # no selection was made (an empty bank)
                continue
            state = _text(row, "state")
            props = row.get("propensities")
            if not isinstance(props, list) or len(props) != len(chosen):
                raise DataFormatError(f"field 'propensities' must be a list of {len(chosen)} numbers (one per chosen "
                                      f"case), got {props!r}")
            props = [_propensity(p, "propensities") for p in props]
            reward = _reward(row)
            done = row.get("done", True)
            if not isinstance(done, bool):
                raise DataFormatError(f"field 'done' must be true or false, got {done!r}")
            missing = [i for i in chosen if i not in texts]
            if missing:
                raise DataFormatError(f"case id {missing[0]!r} is not in the bank {bank_dir}")
            next_state, next_cands = -1, None
            if row.get("next_state") is not None or row.get("next_candidate_ids") is not None:
                nxt = _ids(row, "next_candidate_ids")
                unknown = [i for i in nxt if i not in texts]
                if unknown:
                    raise DataFormatError(f"next candidate id {unknown[0]!r} is not in the bank {bank_dir}")
                next_state = b.state(_text(row, "next_state"))
                next_cands = [b.case(i, texts[i]) for i in nxt]
                any_next = True
        except DataFormatError as error:
            raise DataFormatError(error.reason, path=steps, line=number) from None
        b.add(f"{steps}:{number}", b.state(state), [b.case(i, texts[i]) for i in chosen], reward, props, done,
              next_state, next_cands)
    notes = {"log": str(steps), "bank": str(bank_dir), "records_without_selection": skipped}
    return b.build(encoder, "log", notes, with_next=any_next)


def load_memento_pairs(pairs: str | Path, memory: str | Path, encoder: Any) -> TrainingData:
    """Memento retriever pairs (label: ``truth_label``) with the case memory they refer to."""
    pair_rows = read_memento_training_pairs(pairs)  # validates the whole file (file:line errors)
    memory_cases = read_memento_memory(memory)
    known = {case.state for case in memory_cases}
    lines = [number for number, _ in iter_jsonl(pairs)]
    b = _Builder()
    missing: set[str] = set()
    for number, pair in zip(lines, pair_rows):
        if pair.case not in known:
            missing.add(pair.case)
        b.add(f"{pairs}:{number}", b.state(pair.query), [b.case(pair.case, pair.case)], float(pair.truth_label), [1.0])
    if missing:
        logger.info("%d of %d distinct cases in %s are not in the memory %s (kept, encoded from the pair's text)",
                       len(missing), len(b.case_texts), pairs, memory)
    notes = {"pairs": str(pairs), "memory": str(memory), "memory_cases": len(memory_cases),
             "cases_not_in_memory": len(missing), "label": "truth_label"}
    return b.build(encoder, "memento", notes)


def load_cases_rewards(cases: str | Path, rewards: str | Path, encoder: Any) -> TrainingData:
    """A Case JSONL bank plus a rewards file ``{"state", "case_id", "reward", "propensity"?}`` (one line each)."""
    from memento.formats import read_cases_jsonl

    case_rows = read_cases_jsonl(cases)
    texts: dict[str, str] = {}
    for number, case in zip((n for n, _ in iter_jsonl(cases)), case_rows):
        if case.id is None:
            raise DataFormatError("the case has no 'id' (the rewards file refers to cases by id)", path=cases,
                                  line=number)
        if case.id in texts:
            raise DataFormatError(f"case id {case.id!r} appears twice", path=cases, line=number)
        texts[case.id] = case.state
    b = _Builder()
    for number, row in iter_jsonl(rewards):
        try:
            unknown = sorted(set(row) - REWARD_KEYS)
            if unknown:
                raise DataFormatError(f"unknown field(s) {unknown} in a rewards row; known: {sorted(REWARD_KEYS)}")
            state = _text(row, "state")
            case_id = row.get("case_id")
            if not isinstance(case_id, str) or not case_id:
                raise DataFormatError(f"field 'case_id' must be a non-empty string, got {case_id!r}")
            if case_id not in texts:
                raise DataFormatError(f"case id {case_id!r} is not in {cases}")
            reward = _reward(row)
            propensity = _propensity(row.get("propensity", 1.0), "field 'propensity'")
        except DataFormatError as error:
            raise DataFormatError(error.reason, path=rewards, line=number) from None
        b.add(f"{rewards}:{number}", b.state(state), [b.case(case_id, texts[case_id])], reward, [propensity])
    notes = {"cases": str(cases), "rewards": str(rewards), "bank_cases": len(texts)}
    return b.build(encoder, "cases", notes)


def load_labels(labels: str | Path, bank: str | Path, encoder: Any, *, features: str = "none") -> TrainingData:
    """Planner-scored labels (:mod:`memento.learn.labels`) with the bank their candidate ids refer to: one row per task,
    the candidates' stored bank embeddings, the states encoded with ``encoder``, ``score_NK = mean_logprob``.

    With ``features="case"`` each candidate is its case vector (:mod:`memento.learn.features`: embedding, action
    embedding, stored reward, usage statistics, kind; action vectors missing from the bank are encoded and stored
    there)."""
    from memento.bank import Candidates, open_bank
    from memento.learn.features import CaseFeaturizer
    from memento.learn.labels import iter_labels

    rows = list(iter_labels(labels))  # the whole file is checked first (file:line errors)
    if not rows:
        raise DataFormatError("no label rows in the file", path=labels)
    # writable: features="case" stores the action vectors it encodes (a Milvus bank refuses them, one line)
    with open_bank(bank, read_only=features != "case") as case_bank:
        known = set(case_bank.ids_at(np.arange(len(case_bank))))
        for number, row in rows:
            missing = [i for i in row.candidate_ids if i not in known]
            if missing:
                raise DataFormatError(f"candidate id {missing[0]!r} is not in the bank {bank}", path=labels,
                                      line=number)
        case_keys = list(dict.fromkeys(case_id for _, row in rows for case_id in row.candidate_ids))
        cases_MD = np.ascontiguousarray(case_bank.embeddings(case_keys), dtype=np.float32)
        if features == "case":
            featurizer = CaseFeaturizer(case_bank, lambda texts: _encode(encoder, texts, "action"))
            m = len(case_keys)
            cases_MD = featurizer.case_vectors(Candidates(ids=case_keys, positions_C=case_bank.positions_of(case_keys),
                                                          scores_C=np.zeros(m), embeddings_CD=cases_MD))
        recorded = case_bank.config.encoder
        bank_dim = case_bank.dim
    dim = getattr(encoder, "dim", None)
    if dim != bank_dim:
        raise DimensionError(f"the bank {bank} holds dim={bank_dim} case vectors, the encoder {encoder!r} gives "
                             f"dim={dim} state vectors: train with the encoder that filled the bank (--encoder)")
    used = getattr(encoder, "config", None)
    if recorded is not None and used is not None and getattr(used, "model", None) != recorded.model:
        logger.warning("%s was filled by encoder %s, the states are encoded with %s: states and cases come from "
                       "different encoders", bank, recorded.model or "all-MiniLM-L6-v2",
                       getattr(used, "model", None) or "all-MiniLM-L6-v2")
    state_index: dict[str, int] = {}
    for _, row in rows:
        state_index.setdefault(row.state, len(state_index))
    state_texts = list(state_index)
    states_SD = _encode(encoder, state_texts, "state")
    case_of = {case_id: m for m, case_id in enumerate(case_keys)}
    n, c = len(rows), max(row.n_candidates for _, row in rows)
    cases_nk = np.zeros((n, c), dtype=np.int64)
    mask_nk = np.zeros((n, c), dtype=bool)
    score_nk = np.zeros((n, c), dtype=np.float32)
    for i, (_, row) in enumerate(rows):
        m = row.n_candidates
        cases_nk[i, :m] = [case_of[case_id] for case_id in row.candidate_ids]
        mask_nk[i, :m] = True
        score_nk[i, :m] = row.mean_logprob
    counts = mask_nk.sum(axis=1)
    spread = [max(row.mean_logprob) - min(row.mean_logprob) for _, row in rows]
    with_cosine = [row for _, row in rows if row.cosine is not None]
    notes = {"labels": str(labels), "bank": str(bank), "tasks": n, "candidates_max": int(c),
             "candidates_mean": float(counts.mean()), "rows_with_one_candidate": int((counts < 2).sum()),
             "score_spread_mean": float(np.mean(spread)),
             "best_is_cosine_top1": (float(np.mean([row.best == int(np.argmax(row.cosine)) for row in with_cosine]))
                                     if with_cosine else None),
             "planners": sorted({row.planner for _, row in rows}), "prompts": sorted({row.prompt for _, row in rows})}
    if len(notes["planners"]) > 1:
        logger.warning("%s mixes labels of %d planners: %s", labels, len(notes["planners"]), notes["planners"])
    return TrainingData(states_SD=states_SD, cases_MD=cases_MD, state_texts=state_texts, case_keys=case_keys,
                        state_N=np.array([state_index[row.state] for _, row in rows], dtype=np.int64),
                        cases_NK=cases_nk, mask_NK=mask_nk, reward_N=np.zeros(n, dtype=np.float32),
                        propensity_NK=np.ones((n, c), dtype=np.float32), done_N=np.ones(n, dtype=bool),
                        origins=[f"{labels}:{number}" for number, _ in rows], source="labels", notes=notes,
                        score_NK=score_nk)


def check_inputs(config: DataConfig) -> None:
    """Cheap checks before any model is loaded: the input files and directories exist."""
    def need_file(path: str | None) -> None:
        if path is not None and not Path(path).is_file():
            raise DataFormatError("file not found", path=path)

    match config.source:
        case "log":
            assert config.log is not None
            _, bank_dir = resolve_log(config.log, config.bank)
            if isinstance(bank_dir, Path) and not (bank_dir / "cases.sqlite").is_file():
                raise DataFormatError("no case bank here (the log's case texts come from it; pass --bank DIR)",
                                      path=bank_dir)
        case "memento":
            need_file(config.memento_pairs)
            need_file(config.memento_memory)
        case "cases":
            need_file(config.cases)
            need_file(config.rewards)
        case "labels":
            need_file(config.labels)
            assert config.bank is not None
            from memento.bank import parse_bank_uri

            if parse_bank_uri(config.bank).backend == "dir" and not (Path(config.bank) / "cases.sqlite").is_file():
                raise DataFormatError("no case bank here (the labels' candidate ids refer to one; pass --bank DIR)",
                                      path=config.bank)


def load_data(config: DataConfig, encoder: Any, *, features: str = "none") -> TrainingData:
    """The :class:`TrainingData` that ``config`` names, encoded with ``encoder``; ``features="case"`` (the
    Q-network's ``QNetConfig.features``) gives case vectors with case features (planner-scored labels only)."""
    if features != "none" and config.source != "labels":
        raise ConfigError(f"Q-network case features (features={features!r}) are built for planner-scored labels "
                          f"(--from-labels); this run's data source is {config.source!r}")
    match config.source:
        case "log":
            assert config.log is not None
            return load_transition_log(config.log, encoder, bank=config.bank)
        case "memento":
            assert config.memento_pairs is not None and config.memento_memory is not None
            return load_memento_pairs(config.memento_pairs, config.memento_memory, encoder)
        case "cases":
            assert config.cases is not None and config.rewards is not None
            return load_cases_rewards(config.cases, config.rewards, encoder)
        case "labels":
            assert config.labels is not None and config.bank is not None
            return load_labels(config.labels, config.bank, encoder, features=features)
    raise ConfigError(f"unknown data source {config.source!r}")  # pragma: no cover


# ---------------------------------------------------------------- split


def split_by_state(data: TrainingData, val_fraction: float, seed: int, threshold: float = 0.5
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Row indices ``(train_rows, val_rows)``: ``val_fraction`` of the distinct states held out, stratified
    by their kind (all rewarded / all unrewarded / mixed), seeded; no state is in both."""
    if not 0.0 < val_fraction < 1.0:
        raise ConfigError(f"split_by_state: val_fraction={val_fraction!r} must lie in (0, 1)")
    kinds = data.state_kinds(threshold)
    if len(kinds) < 2:
        raise DataFormatError(f"the {data.source} data hold {len(kinds)} distinct state(s); a train/validation "
                              "split by state needs at least 2")
    rng = np.random.default_rng(seed)
    strata = {kind: np.array(sorted(s for s, k in kinds.items() if k == kind), dtype=np.int64)
              for kind in ("unrewarded", "rewarded", "mixed")}
    val: list[np.ndarray] = []
    leftovers: list[int] = []
    for states in strata.values():
        states = rng.permutation(states)
        n_val = min(len(states) - 1, int(round(val_fraction * len(states)))) if len(states) > 1 else 0
        val.append(states[:n_val])
        leftovers.extend(states[n_val:n_val + 1].tolist())
    val_states = np.concatenate(val)
    if val_states.size == 0:  # tiny data: hold out one state
        val_states = np.array(leftovers[:1], dtype=np.int64)
    is_val = np.zeros(data.states_SD.shape[0], dtype=bool)
    is_val[val_states] = True
    rows_val = is_val[data.state_N]
    return np.flatnonzero(~rows_val), np.flatnonzero(rows_val)


# ---------------------------------------------------------------- batches


@dataclasses.dataclass(frozen=True, kw_only=True)
class RankingBatch:
    """G validation states with mixed labels and their labelled cases: ``state_GD``, ``cases_GCD``,
    ``label_GC`` (0/1), ``mask_GC``."""

    state_GD: torch.Tensor
    cases_GCD: torch.Tensor
    label_GC: torch.Tensor
    mask_GC: torch.Tensor

    def to(self, device: torch.device | str, non_blocking: bool = False) -> RankingBatch:
        return RankingBatch(**{f.name: getattr(self, f.name).to(device, non_blocking=non_blocking)
                               for f in dataclasses.fields(self)})


class _Tensors:
    """A :class:`TrainingData` as torch tensors; :meth:`batch` gathers rows into a ReplayBatch."""

    def __init__(self, data: TrainingData):
        self.states_SD = torch.from_numpy(data.states_SD)
        self.cases_MD = torch.from_numpy(data.cases_MD)
        self.state_N = torch.from_numpy(data.state_N)
        self.cases_NK = torch.from_numpy(data.cases_NK)
        self.mask_NK = torch.from_numpy(data.mask_NK)
        self.reward_N = torch.from_numpy(data.reward_N)
        self.propensity_NK = torch.from_numpy(data.propensity_NK)
        self.done_N = torch.from_numpy(data.done_N).float()
        self.score_NK = None if data.score_NK is None else torch.from_numpy(data.score_NK)
        self.has_next = data.has_next
        if data.has_next:
            assert data.next_state_N is not None and data.next_cands_NC is not None and data.next_mask_NC is not None
            self.next_state_N = torch.from_numpy(data.next_state_N)
            self.next_cands_NC = torch.from_numpy(data.next_cands_NC)
            self.next_mask_NC = torch.from_numpy(data.next_mask_NC)

    def batch(self, rows_B: torch.Tensor) -> ReplayBatch:
        b = rows_B.shape[0]
        zeros_B = torch.zeros(b, dtype=torch.int64)
        nexts: dict[str, torch.Tensor | None] = {}
        if self.has_next:
            next_state_B = self.next_state_N[rows_B]
            nexts = {"next_state_BD": self.states_SD[next_state_B.clamp_min(0)]
                     * (next_state_B >= 0).unsqueeze(1).float(),
                     "next_cands_BCD": self.cases_MD[self.next_cands_NC[rows_B]],
                     "next_mask_BC": self.next_mask_NC[rows_B]}
        return ReplayBatch(state_BD=self.states_SD[self.state_N[rows_B]],
                           cases_BKD=self.cases_MD[self.cases_NK[rows_B]], reward_B=self.reward_N[rows_B],
                           propensity_BK=self.propensity_NK[rows_B],
                           mask_BK=self.mask_NK[rows_B], done_B=self.done_N[rows_B], step_B=rows_B.clone(),
                           policy_version_B=zeros_B, **nexts)


class RowDataset(torch.utils.data.Dataset):
    """Rows of a :class:`TrainingData`; ``__getitems__`` gathers a whole batch with tensor indexing."""

    def __init__(self, tensors: _Tensors, rows: np.ndarray):
        self.tensors = tensors
        self.rows = torch.as_tensor(np.asarray(rows, dtype=np.int64))

    def __len__(self) -> int:
        return int(self.rows.shape[0])

    def __getitem__(self, index: int) -> ReplayBatch:
        return self.__getitems__([index])

    def __getitems__(self, indices: Sequence[int]) -> ReplayBatch:
        return self.tensors.batch(self.rows[torch.as_tensor(indices, dtype=torch.int64)])


class RankingDataset(torch.utils.data.Dataset):
    """The validation ranking groups (:meth:`TrainingData.ranking_groups`), batched like :class:`RowDataset`."""

    def __init__(self, tensors: _Tensors, groups: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]):
        self.tensors = tensors
        self.state_G, self.cases_GC, self.label_GC, self.mask_GC = (torch.from_numpy(np.ascontiguousarray(x))
                                                                    for x in groups)

    def __len__(self) -> int:
        return int(self.state_G.shape[0])

    def __getitem__(self, index: int) -> RankingBatch:
        return self.__getitems__([index])

    def __getitems__(self, indices: Sequence[int]) -> RankingBatch:
        idx = torch.as_tensor(indices, dtype=torch.int64)
        return RankingBatch(state_GD=self.tensors.states_SD[self.state_G[idx]],
                            cases_GCD=self.tensors.cases_MD[self.cases_GC[idx]], label_GC=self.label_GC[idx],
                            mask_GC=self.mask_GC[idx])


class ListwiseDataset(torch.utils.data.Dataset):
    """Rows of planner-scored labels (``TrainingData.score_NK``) as :class:`~memento.learn.listwise.ListwiseBatch`
    batches, gathered with tensor indexing like :class:`RowDataset`."""

    def __init__(self, tensors: _Tensors, rows: np.ndarray):
        if tensors.score_NK is None:
            raise ConfigError("ListwiseDataset needs planner-scored labels (TrainingData.score_NK)")
        self.tensors = tensors
        self.rows = torch.as_tensor(np.asarray(rows, dtype=np.int64))

    def __len__(self) -> int:
        return int(self.rows.shape[0])

    def __getitem__(self, index: int) -> ListwiseBatch:
        return self.__getitems__([index])

    def __getitems__(self, indices: Sequence[int]) -> ListwiseBatch:
        t = self.tensors
        assert t.score_NK is not None
        rows_B = self.rows[torch.as_tensor(indices, dtype=torch.int64)]
        return ListwiseBatch(state_BD=t.states_SD[t.state_N[rows_B]], cases_BCD=t.cases_MD[t.cases_NK[rows_B]],
                             score_BC=t.score_NK[rows_B], mask_BC=t.mask_NK[rows_B])


class EpochSampler(torch.utils.data.Sampler[int]):
    """A fresh permutation each epoch, drawn from ``seed`` and the epoch (Lightning calls ``set_epoch``),
    so a run resumed at an epoch boundary sees the same order as an uninterrupted one."""

    def __init__(self, n: int, seed: int):
        self.n, self.seed, self.epoch = n, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n

    def __iter__(self):  # type: ignore[no-untyped-def]
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return iter(torch.randperm(self.n, generator=generator).tolist())


def _batch_itself(batch: Any) -> Any:
    """collate_fn: the dataset's ``__getitems__`` already returns the batch."""
    return batch


# ---------------------------------------------------------------- the LightningDataModule


class QDataModule(L.LightningDataModule):
    """Serves :class:`~memento.learn.replay.ReplayBatch` batches of the training states and, for validation,
    batches of the held-out states plus (when any held-out state has mixed labels) :class:`RankingBatch`
    batches for the per-state ``hit@K`` metrics. Planner-scored labels (``source="labels"``) are served as
    :class:`~memento.learn.listwise.ListwiseBatch` batches instead, for training and validation alike.

    ``prepare_data`` (one process per node) reads the files and encodes every text, which fills the
    encoder's cache; ``setup(stage)`` (every process) reads and encodes again (cache hits; on the
    process that prepared, the result is reused), checks the data against the learner and splits
    by state. Give ``data`` to skip the files (tests, benchmarks). ``encoder=None`` loads
    ``config.encoder`` when the files are first read.
    """

    def __init__(self, config: DataConfig, *, batch_size: int, encoder: Any = None, data: TrainingData | None = None,
                 seed: int = 0, gamma: float = 0.0, features: str = "none"):
        super().__init__()
        self.features = features
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(f"QDataModule: batch_size={batch_size!r} must be an integer >= 1")
        self.config = config
        self.batch_size = batch_size
        self.encoder = encoder
        self.seed = seed
        self.gamma = gamma
        self.data: TrainingData | None = data
        self.train_rows: np.ndarray | None = None
        self.val_rows: np.ndarray | None = None
        self._tensors: _Tensors | None = None
        self._groups: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None

    def _encoder(self) -> Any:
        if self.encoder is None:
            from memento.encoders import Encoder

            self.encoder = Encoder.from_config(self.config.encoder)
        return self.encoder

    def prepare_data(self) -> None:
        if self.data is None:
            check_inputs(self.config)
            self.data = load_data(self.config, self._encoder(), features=self.features)

    def setup(self, stage: str | None = None) -> None:
        if self.train_rows is not None:
            return
        if self.data is None:
            self.data = load_data(self.config, self._encoder(), features=self.features)
        data = self._checked(self.data)
        self.train_rows, self.val_rows = split_by_state(data, self.config.val_fraction, self.config.split_seed,
                                                        self.config.label_threshold)
        if data.listwise and not (data.mask_NK[self.val_rows].sum(axis=1) >= 2).any():
            raise DataFormatError(f"no held-out task of the {data.source} data has two or more candidates, so the "
                                  "listwise validation loss is undefined (score more candidates per task)")
        self._tensors = _Tensors(data)
        self._groups = data.ranking_groups(self.config.label_threshold, self.val_rows)
        logger.info("data (%s): %d rows, %d train / %d validation rows, %d validation states with mixed labels",
                    data.source, data.n_rows, len(self.train_rows), len(self.val_rows), len(self._groups[0]))

    def _checked(self, data: TrainingData) -> TrainingData:
        if self.gamma == 0.0:
            bad = np.flatnonzero((data.reward_N < 0.0) | (data.reward_N > 1.0))
            if bad.size:
                raise DataFormatError(f"{data.origins[bad[0]]}: reward {float(data.reward_N[bad[0]])} is outside "
                                      "[0, 1]; gamma=0 trains P(success) with cross-entropy")
        elif not data.has_next:
            raise DataFormatError(f"gamma={self.gamma} (soft TD) needs next states, and no row of the {data.source} "
                                  "data has one (next_state / next_candidate_ids in the transition log)")
        return data

    def stats(self) -> dict[str, Any]:
        """Label statistics of all rows and of each split (after :meth:`setup`), and the loader's notes."""
        if self.data is None or self.train_rows is None or self.val_rows is None or self._groups is None:
            raise ConfigError("QDataModule.stats() needs setup() first")
        t = self.config.label_threshold
        return {"source": self.data.source, "dim": self.data.dim, "k_max": self.data.k_max,
                "all": self.data.label_stats(t), "train": self.data.label_stats(t, self.train_rows),
                "val": self.data.label_stats(t, self.val_rows), "val_ranking_states": int(len(self._groups[0])),
                "notes": dict(self.data.notes)}

    def _loader(self, dataset: torch.utils.data.Dataset, sampler: Any = None) -> torch.utils.data.DataLoader:
        workers = self.config.num_workers
        return torch.utils.data.DataLoader(dataset, batch_size=self.batch_size, sampler=sampler, shuffle=False,
                                           collate_fn=_batch_itself, num_workers=workers,
                                           persistent_workers=workers > 0)

    def _rows(self, rows: np.ndarray) -> torch.utils.data.Dataset:
        assert self._tensors is not None
        if self._tensors.score_NK is not None:  # planner-scored labels: one listwise group per row
            return ListwiseDataset(self._tensors, rows)
        return RowDataset(self._tensors, rows)

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        if self._tensors is None or self.train_rows is None:
            raise ConfigError("QDataModule.train_dataloader() needs setup() first")
        return self._loader(self._rows(self.train_rows), EpochSampler(len(self.train_rows), self.seed))

    def val_dataloader(self) -> list[torch.utils.data.DataLoader]:
        if self._tensors is None or self.val_rows is None or self._groups is None:
            raise ConfigError("QDataModule.val_dataloader() needs setup() first")
        loaders = [self._loader(self._rows(self.val_rows))]
        if len(self._groups[0]):
            loaders.append(self._loader(RankingDataset(self._tensors, self._groups)))
        return loaders
