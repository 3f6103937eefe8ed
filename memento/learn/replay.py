"""The replay buffer: preallocated tensors, ring overwrite, uniform sampling, safetensors persistence.

One row per decision. A decision shows ``K <= k_max`` cases for a state and gets one reward;
rows with fewer than ``k_max`` cases are zero-padded and masked. With ``store_next=True`` a row
also holds the next state and its (up to ``c_max``) candidate cases, for multi-step soft TD.

Storage (N = capacity, on the buffer's device). Vectors live in two :class:`~memento.learn.vectortable.VectorTable`
tables, each distinct vector once (in ``storage_dtype``): ``states`` (width D: states and next states) and
``cases`` (width E = D, or more with case features: chosen cases and next candidates). A case shown in many
decisions is stored once; a row holds indices into the tables:

==================  ==========  ===========================================================
tensor              dtype       meaning
==================  ==========  ===========================================================
state_ix_N          int64       the state (a row of ``states``)
cases_ix_NK         int64       the chosen cases (rows of ``cases``), zero vectors past K
mask_NK             bool        which of the ``k_max`` slots hold a case
reward_N            float32     the reward of the decision
propensity_NK       float32     the logging policy's probability of each chosen case (1 on padding)
done_N              bool        the episode ended with this decision
step_N              int64       the environment step (or global step) of the decision
policy_version_N    int64       the learner version that chose the cases
next_state_ix_N     int64       (``store_next``) the next state
next_cands_ix_NC    int64       (``store_next``) its candidates, zero vectors past C
next_mask_NC        bool        (``store_next``) which of the ``c_max`` slots hold a candidate
case_pos_NK         int64       the bank position of each chosen case (-1: unknown, on padding too)
next_pos_NC         int64       (``store_next``) the bank position of each next candidate (-1: unknown)
==================  ==========  ===========================================================

The positions are the cases' identities: :meth:`ReplayBuffer.forget_cases` masks the slots of deleted cases
by position, never another case that shares its text (two tenants' cases of the same question have the same
state vector, so the same row of ``cases``). A slot whose position is unknown (a decision added without
positions, or read from a version-1 or -2 save) can only be matched by its vector.

A table grows as needed and is compacted (vectors no stored decision refers to are dropped) when it would
pass 1.5 times the most it can need (N rows times the slots per row); compaction changes row numbers, never
a decision's vectors, so it is invisible to sampling and to resume. ``sample`` reads the row fields only; the
batch gathers its vectors from the tables when first read.

Sampling is uniform with replacement, with a ``torch.Generator`` on the buffer's device (so a
buffer on the GPU samples on the GPU). Saving writes ``replay.safetensors`` (the row fields of the
filled rows and the tables, compacted: ``states_VD``, ``cases_VE``) and ``replay.json`` (format version 3,
config, ring position), each atomically; a version-1 save (one vector per slot) and a version-2 save (no case
positions: they read as unknown) still load; a random uid
written into both detects a pair torn by a crash. Nothing is pickled.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file

from memento.config import ReplayConfig, from_dict, to_dict
from memento.errors import CheckpointError, ConfigError, DataFormatError, DimensionError, MementoError
from memento.io import atomic_write, atomic_write_text, check_same_save, read_safetensors, read_saved_meta
from memento.learn.vectortable import VectorTable

__all__ = ["REPLAY_FORMAT", "REPLAY_FORMAT_VERSION", "ReplayBatch", "ReplayBuffer", "Transition"]

logger = logging.getLogger(__name__)

REPLAY_FORMAT = "memento-replay"
REPLAY_FORMAT_VERSION = 3  # 1: one vector per slot; 2: no case positions (both still read)
TENSORS_NAME = "replay.safetensors"
META_NAME = "replay.json"

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _vector(value: Any, name: str, ndim: int) -> np.ndarray:
    array = np.ascontiguousarray(np.asarray(value, dtype=np.float32))
    if array.ndim != ndim:
        raise DimensionError(f"Transition.{name} must have {ndim} dimension(s); got {name}.shape={array.shape}")
    if not np.isfinite(array).all():
        raise DataFormatError(f"Transition.{name} holds NaN or infinite values")
    return array


@dataclasses.dataclass(frozen=True, kw_only=True)
class Transition:
    """One decision, as numpy arrays (converted to contiguous float32 and checked on construction).

    - ``state_D``: the state embedding, shape ``(D,)``;
    - ``cases_KD``: the ``K`` chosen case embeddings in the order drawn, ``(K, D)``, ``1 <= K``;
    - ``reward``: the reward (in ``[0, 1]`` for the single-step BCE learner);
    - ``propensity_K``: each chosen case's probability under the logging policy, ``(K,)``, in
      ``(0, 1]`` (``Selection.probs_K``); 1.0 for a deterministic choice;
    - ``done``: the episode ended with this decision (a single-step task always does);
    - ``next_state_D`` / ``next_cands_CD``: the next state ``(D,)`` and its candidate cases
      ``(C', D)``, both or neither (``C' = 0`` is allowed when ``done``);
    - ``step``, ``policy_version``: bookkeeping for off-policy evaluation and staleness;
    - ``case_pos_K`` / ``next_pos_C``: the bank positions of the chosen cases and of the next candidates (their
      identity, which :meth:`ReplayBuffer.forget_cases` masks by), ``None`` when unknown.
    """

    state_D: np.ndarray
    cases_KD: np.ndarray
    reward: float
    propensity_K: np.ndarray
    done: bool = True
    next_state_D: np.ndarray | None = None
    next_cands_CD: np.ndarray | None = None
    step: int = 0
    policy_version: int = 0
    case_pos_K: np.ndarray | None = None
    next_pos_C: np.ndarray | None = None

    def __post_init__(self) -> None:
        state_D = _vector(self.state_D, "state_D", 1)
        cases_KD = _vector(self.cases_KD, "cases_KD", 2)
        # a case drawn late at a low temperature can have a propensity below float32's range: keep it positive
        propensity_K = np.maximum(_vector(self.propensity_K, "propensity_K", 1), np.finfo(np.float32).tiny)
        if not (np.asarray(self.propensity_K, dtype=np.float64) > 0).all():
            raise DataFormatError(f"Transition.propensity_K must lie in (0, 1]; got "
                                  f"{np.asarray(self.propensity_K).tolist()}")
        d, k = state_D.shape[0], cases_KD.shape[0]
        if k < 1 or cases_KD.shape[1] < 1:
            raise DimensionError(f"Transition: cases_KD must be (K >= 1, E >= 1); got state_D.shape={state_D.shape}, "
                                 f"cases_KD.shape={cases_KD.shape}")
        if propensity_K.shape != (k,):
            raise DimensionError(f"Transition: propensity_K must be (K={k},); got propensity_K.shape="
                                 f"{propensity_K.shape}, cases_KD.shape={cases_KD.shape}")
        if not ((propensity_K > 0) & (propensity_K <= 1)).all():
            raise DataFormatError(f"Transition.propensity_K must lie in (0, 1]; got {propensity_K.tolist()}")
        if isinstance(self.reward, bool) or not isinstance(self.reward, (int, float, np.floating, np.integer)) \
                or not math.isfinite(float(self.reward)):
            raise DataFormatError(f"Transition.reward must be a finite number; got {self.reward!r}")
        if (self.next_state_D is None) != (self.next_cands_CD is None):
            raise DataFormatError("Transition: give both next_state_D and next_cands_CD, or neither")
        for name in ("step", "policy_version"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise DataFormatError(f"Transition.{name} must be an integer; got {value!r}")
            object.__setattr__(self, name, int(value))
        object.__setattr__(self, "state_D", state_D)
        object.__setattr__(self, "cases_KD", cases_KD)
        object.__setattr__(self, "propensity_K", propensity_K)
        object.__setattr__(self, "reward", float(self.reward))
        object.__setattr__(self, "done", bool(self.done))
        if self.next_state_D is not None:
            next_state_D = _vector(self.next_state_D, "next_state_D", 1)
            next_cands_CD = np.asarray(self.next_cands_CD, dtype=np.float32)
            if next_cands_CD.size == 0:  # no next candidates: as wide as the chosen cases (E, not D)
                next_cands_CD = next_cands_CD.reshape(0, cases_KD.shape[1])
            next_cands_CD = _vector(next_cands_CD, "next_cands_CD", 2)
            e = cases_KD.shape[1]
            if next_state_D.shape != (d,) or next_cands_CD.shape[1] != e:
                raise DimensionError(f"Transition: next_state_D must be (D={d},) and next_cands_CD (C', {e}); got "
                                     f"next_state_D.shape={next_state_D.shape}, "
                                     f"next_cands_CD.shape={next_cands_CD.shape}")
            object.__setattr__(self, "next_state_D", next_state_D)
            object.__setattr__(self, "next_cands_CD", next_cands_CD)
        for name, rows in (("case_pos_K", k), ("next_pos_C", None if self.next_cands_CD is None
                                                        else self.next_cands_CD.shape[0])):
            value = getattr(self, name)
            if value is None:
                continue
            pos = np.asarray(value)
            if rows is None or pos.shape != (rows,) or (pos.size and not np.issubdtype(pos.dtype, np.integer)):
                raise DimensionError(f"Transition.{name} must hold {rows} integer position(s); got "
                                     f"{name}.shape={pos.shape}, dtype {pos.dtype}")
            object.__setattr__(self, name, pos.astype(np.int64))


_VECTOR_FIELDS = ("state_BD", "cases_BKD", "next_state_BD", "next_cands_BCD")


class ReplayBatch:
    """A mini-batch of B decisions (all tensors on one device); shapes are checked on construction.

    ``state_BD``, ``cases_BKD`` (float32), ``mask_BK`` (bool), ``reward_B``, ``propensity_BK``,
    ``done_B`` (float32, 0 or 1), ``step_B``, ``policy_version_B`` (int64); the multi-step fields
    ``next_state_BD``, ``next_cands_BCD`` (float32) and ``next_mask_BC`` (bool) are ``None`` when
    the buffer does not store them.

    Built from tensors (every field given), or by :meth:`ReplayBuffer.sample` from row indices into the
    buffer's vector tables: then the four vector fields are gathered when first read (and kept), so
    sampling costs the indices only.
    """

    def __init__(self, *, state_BD: torch.Tensor | None = None, cases_BKD: torch.Tensor | None = None,
                 reward_B: torch.Tensor, propensity_BK: torch.Tensor, mask_BK: torch.Tensor, done_B: torch.Tensor,
                 step_B: torch.Tensor, policy_version_B: torch.Tensor, next_state_BD: torch.Tensor | None = None,
                 next_cands_BCD: torch.Tensor | None = None, next_mask_BC: torch.Tensor | None = None,
                 _lazy: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None, _checked: bool = False):
        self.reward_B, self.propensity_BK, self.mask_BK = reward_B, propensity_BK, mask_BK
        self.done_B, self.step_B, self.policy_version_B = done_B, step_B, policy_version_B
        self.next_mask_BC = next_mask_BC
        self._vectors: dict[str, torch.Tensor | None] = {"state_BD": state_BD, "cases_BKD": cases_BKD,
                                                         "next_state_BD": next_state_BD,
                                                         "next_cands_BCD": next_cands_BCD}
        self._lazy = _lazy or {}  # name -> (table [V, W], row indices [B] / [B, K])
        if _lazy is None and (state_BD is None or cases_BKD is None):
            raise DataFormatError("ReplayBatch: state_BD and cases_BKD are required")
        if not _checked:  # (a buffer's own batches have their shapes by construction)
            self._check()

    def _shape(self, name: str) -> tuple[int, ...] | None:
        if name in self._lazy:
            table, ix = self._lazy[name]
            return (*ix.shape, table.shape[1])
        value = self._vectors[name]
        return None if value is None else tuple(value.shape)

    def _get(self, name: str) -> torch.Tensor | None:
        value = self._vectors[name]
        if value is None and name in self._lazy:
            table, ix = self._lazy[name]
            value = table.index_select(0, ix.reshape(-1)).reshape(*ix.shape, table.shape[1]).float()
            self._vectors[name] = value
        return value

    state_BD = property(lambda self: self._get("state_BD"))
    cases_BKD = property(lambda self: self._get("cases_BKD"))
    next_state_BD = property(lambda self: self._get("next_state_BD"))
    next_cands_BCD = property(lambda self: self._get("next_cands_BCD"))

    def _check(self) -> None:
        state, cases = self._shape("state_BD"), self._shape("cases_BKD")
        if state is None or cases is None or len(state) != 2 or len(cases) != 3:
            raise DimensionError(f"ReplayBatch: state_BD must be (B, D) and cases_BKD (B, K, D); got "
                                 f"state_BD.shape={state}, cases_BKD.shape={cases}")
        b, d = state
        k, e = cases[1], cases[2]  # e: D, or more with case features
        expected = {"cases_BKD": (b, k, e), "reward_B": (b,), "propensity_BK": (b, k), "mask_BK": (b, k),
                    "done_B": (b,), "step_B": (b,), "policy_version_B": (b,)}
        next_cands = self._shape("next_cands_BCD")
        nexts = [self._shape("next_state_BD"), next_cands, self.next_mask_BC]
        if any(x is not None for x in nexts):
            if any(x is None for x in nexts):
                raise DataFormatError("ReplayBatch: next_state_BD, next_cands_BCD and next_mask_BC come together")
            if len(next_cands) != 3:  # type: ignore[arg-type]
                raise DimensionError(f"ReplayBatch: next_cands_BCD must be (B, C, D); got next_cands_BCD.shape="
                                     f"{next_cands}")
            c = next_cands[1]  # type: ignore[index]
            expected.update({"next_state_BD": (b, d), "next_cands_BCD": (b, c, e), "next_mask_BC": (b, c)})
        for name, shape in expected.items():
            actual = self._shape(name) if name in _VECTOR_FIELDS else tuple(getattr(self, name).shape)
            if actual != shape:
                raise DimensionError(f"ReplayBatch: {name}.shape={actual} does not match state_BD.shape={(b, d)} "
                                     f"and cases_BKD.shape={(b, k, e)} (expected {shape})")

    def fields(self) -> dict[str, torch.Tensor | None]:
        """Every field by name (the vector fields gathered), as the constructor takes them."""
        return {"state_BD": self.state_BD, "cases_BKD": self.cases_BKD, "reward_B": self.reward_B,
                "propensity_BK": self.propensity_BK, "mask_BK": self.mask_BK, "done_B": self.done_B,
                "step_B": self.step_B, "policy_version_B": self.policy_version_B,
                "next_state_BD": self.next_state_BD, "next_cands_BCD": self.next_cands_BCD,
                "next_mask_BC": self.next_mask_BC}

    def replace(self, **changes: torch.Tensor | None) -> ReplayBatch:
        """A batch with some fields replaced (checked again)."""
        return ReplayBatch(**{**self.fields(), **changes})

    @property
    def batch_size(self) -> int:
        return int(self.reward_B.shape[0])

    @property
    def has_next(self) -> bool:
        return self.next_mask_BC is not None

    def to(self, device: torch.device | str, non_blocking: bool = False) -> ReplayBatch:
        """The same batch on ``device`` (itself when already there)."""
        device = torch.device(device)
        if self.reward_B.device == device:
            return self
        return ReplayBatch(**{name: None if value is None else value.to(device, non_blocking=non_blocking)
                              for name, value in self.fields().items()})


# row fields: name -> (dtype, fill of a fresh row); "ix" fields index the vector tables
_ROW_FIELDS: dict[str, tuple[torch.dtype, float]] = {
    "state_ix_N": (torch.int64, 0), "cases_ix_NK": (torch.int64, 0), "mask_NK": (torch.bool, 0),
    "reward_N": (torch.float32, 0), "propensity_NK": (torch.float32, 1), "done_N": (torch.bool, 0),
    "step_N": (torch.int64, 0), "policy_version_N": (torch.int64, 0), "case_pos_NK": (torch.int64, -1),
}
_NEXT_ROW_FIELDS: dict[str, tuple[torch.dtype, float]] = {
    "next_state_ix_N": (torch.int64, 0), "next_cands_ix_NC": (torch.int64, 0), "next_mask_NC": (torch.bool, 0),
    "next_pos_NC": (torch.int64, -1),
}
_POSITION_FIELDS = ("case_pos_NK", "next_pos_NC")  # absent from version-1 and -2 saves: unknown (-1)
_TABLE_OF = {"state_ix_N": "states", "next_state_ix_N": "states", "cases_ix_NK": "cases",
             "next_cands_ix_NC": "cases"}
_TABLE_TENSORS = {"states": "states_VD", "cases": "cases_VE"}
_INPUT_NAME = {"state_ix_N": "state_BD", "cases_ix_NK": "cases_BKD", "next_state_ix_N": "next_state_BD",
               "next_cands_ix_NC": "next_cands_BCD", "case_pos_NK": "case_pos_BK", "next_pos_NC": "next_pos_BC"}
_V1_VECTORS = {"state_ND": "state_ix_N", "cases_NKD": "cases_ix_NK", "next_state_ND": "next_state_ix_N",
               "next_cands_NCD": "next_cands_ix_NC"}


class ReplayBuffer:
    """A ring buffer of decisions in preallocated tensors on ``device`` (see the module docstring).

    ``device=None`` puts it on CUDA when a GPU is present, else on the CPU.
    """

    def __init__(self, config: ReplayConfig, device: torch.device | str | None = None):
        self.config = config
        self.device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
        n, k, c = config.capacity, config.k_max, config.c_max
        shapes = {"state_ix_N": (n,), "cases_ix_NK": (n, k), "mask_NK": (n, k), "reward_N": (n,),
                  "propensity_NK": (n, k), "done_N": (n,), "step_N": (n,), "policy_version_N": (n,),
                  "next_state_ix_N": (n,), "next_cands_ix_NC": (n, c), "next_mask_NC": (n, c),
                  "case_pos_NK": (n, k), "next_pos_NC": (n, c)}
        fields = {**_ROW_FIELDS, **(_NEXT_ROW_FIELDS if config.store_next else {})}
        # the row fields of one dtype share one [N, F] tensor (a sample is one index_select per dtype);
        # self._t holds each field as a view of its columns
        columns: dict[torch.dtype, list[tuple[str, int]]] = {}
        for name, (dtype, _) in fields.items():
            columns.setdefault(dtype, []).append((name, shapes[name][1] if len(shapes[name]) > 1 else 1))
        self._packed: dict[torch.dtype, torch.Tensor] = {}
        self._columns: dict[str, tuple[torch.dtype, int, int, bool]] = {}  # name -> (dtype, start, stop, 2-D)
        self._t: dict[str, torch.Tensor] = {}
        for dtype, names in columns.items():
            packed = torch.empty(n, sum(width for _, width in names), dtype=dtype, device=self.device)
            start = 0
            for name, width in names:
                self._columns[name] = (dtype, start, start + width, len(shapes[name]) > 1)
                view = packed[:, start:start + width] if len(shapes[name]) > 1 else packed[:, start]
                view.fill_(fields[name][1])
                self._t[name] = view
                start += width
            self._packed[dtype] = packed
        emb = _DTYPES[config.storage_dtype]
        per_row = {"states": 2 if config.store_next else 1, "cases": k + (c if config.store_next else 0)}
        # a table is compacted (rows no decision refers to dropped) when it would pass 1.5x its worst case
        self._table_limit = {name: n * rows + max(n * rows // 2, 1024) for name, rows in per_row.items()}
        widths = {"states": config.dim, "cases": config.case_width}
        self._tables = {name: VectorTable(widths[name], emb, self.device, initial_rows=min(limit, 1024),
                                          grow_to=limit) for name, limit in self._table_limit.items()}
        self._ptr = 0  # the next row to write
        self._size = 0  # rows filled
        self._added = 0  # rows ever added

    # ------------------------------------------------------------------ size

    def __len__(self) -> int:
        return self._size

    @property
    def capacity(self) -> int:
        return self.config.capacity

    @property
    def added(self) -> int:
        """Transitions ever added (``len(self)`` stops growing at capacity; this does not)."""
        return self._added

    def table_rows(self) -> dict[str, int]:
        """Distinct vectors stored: ``{"states": ..., "cases": ...}``."""
        return {name: len(table) for name, table in self._tables.items()}

    # ------------------------------------------------------------------ adding

    def add(self, transition: Transition) -> None:
        """Append one decision (overwriting the oldest when full)."""
        t = transition
        d, k_max, c_max = self.config.dim, self.config.k_max, self.config.c_max
        e = self.config.case_width
        k = t.cases_KD.shape[0]
        if t.state_D.shape[0] != d or k > k_max or t.cases_KD.shape[1] != e:
            raise DimensionError(f"replay buffer holds dim={d}, k_max={k_max}, cases of {e} numbers; got "
                                 f"state_D.shape={t.state_D.shape}, cases_KD.shape={t.cases_KD.shape}")
        nexts: dict[str, np.ndarray | None] = {"next_state_BD": None, "next_cands_BCD": None, "next_mask_BC": None,
                                               "next_pos_BC": None}
        if t.next_state_D is not None and self.config.store_next:  # (without store_next they are not kept)
            assert t.next_cands_CD is not None
            c = t.next_cands_CD.shape[0]
            if c > c_max:
                raise DimensionError(f"replay buffer holds c_max={c_max} next candidates; got "
                                     f"next_cands_CD.shape={t.next_cands_CD.shape}")
            cands_1CD = np.zeros((1, max(c, 1), e), dtype=np.float32)
            cands_1CD[0, :c] = t.next_cands_CD
            pos_1C = np.full((1, max(c, 1)), -1, dtype=np.int64)
            if t.next_pos_C is not None:
                pos_1C[0, :c] = t.next_pos_C
            nexts = {"next_state_BD": t.next_state_D[None], "next_cands_BCD": cands_1CD,
                     "next_mask_BC": (np.arange(max(c, 1)) < c)[None], "next_pos_BC": pos_1C}
        self.add_batch(state_BD=t.state_D[None], cases_BKD=t.cases_KD[None],
                       reward_B=np.array([t.reward], dtype=np.float32), propensity_BK=t.propensity_K[None],
                       done_B=np.array([t.done]), step_B=np.array([t.step], dtype=np.int64),
                       policy_version_B=np.array([t.policy_version], dtype=np.int64),
                       case_pos_BK=None if t.case_pos_K is None else t.case_pos_K[None], **nexts)

    def add_batch(self, *, state_BD: Any, cases_BKD: Any, reward_B: Any, propensity_BK: Any | None = None,
                  mask_BK: Any | None = None, done_B: Any | None = None, step_B: Any | None = None,
                  policy_version_B: Any | None = None, next_state_BD: Any | None = None,
                  next_cands_BCD: Any | None = None, next_mask_BC: Any | None = None, case_pos_BK: Any | None = None,
                  next_pos_BC: Any | None = None) -> None:
        """Append B decisions at once from numpy arrays or tensors (vectorised; no per-row Python).

        ``K`` of ``cases_BKD`` may be below ``k_max`` (and ``C`` of ``next_cands_BCD`` below ``c_max``):
        the rest is padded. Defaults: every slot valid, propensity 1, done True, step and version 0, bank positions
        of the cases (``case_pos_BK``, ``next_pos_BC``) unknown (-1).
        Values are not checked here (use :class:`Transition` / :meth:`add` for checked input).
        """
        cfg, dev = self.config, self.device
        state_BD = torch.as_tensor(state_BD, device=dev)
        cases_BKD = torch.as_tensor(cases_BKD, device=dev)
        b = state_BD.shape[0] if state_BD.ndim == 2 else -1
        if state_BD.ndim != 2 or state_BD.shape[1] != cfg.dim or cases_BKD.ndim != 3 or cases_BKD.shape[0] != b \
                or cases_BKD.shape[2] != cfg.case_width or not 1 <= cases_BKD.shape[1] <= cfg.k_max:
            raise DimensionError(f"replay buffer holds dim={cfg.dim}, k_max={cfg.k_max}: state_BD must be (B, "
                                 f"{cfg.dim}) and cases_BKD (B, K<={cfg.k_max}, {cfg.case_width}); got state_BD.shape="
                                 f"{tuple(state_BD.shape)}, cases_BKD.shape={tuple(cases_BKD.shape)}")
        k = cases_BKD.shape[1]
        ones_BK = torch.ones(b, k, device=dev)
        rows: dict[str, tuple[Any, tuple[int, ...]]] = {  # name -> (value, expected shape)
            "state_ix_N": (state_BD, (b, cfg.dim)),
            "cases_ix_NK": (cases_BKD, (b, k, cfg.case_width)),
            "mask_NK": (ones_BK.bool() if mask_BK is None else mask_BK, (b, k)),
            "reward_N": (reward_B, (b,)),
            "propensity_NK": (ones_BK if propensity_BK is None else propensity_BK, (b, k)),
            "done_N": (torch.ones(b, device=dev) if done_B is None else done_B, (b,)),
            "step_N": (torch.zeros(b, device=dev) if step_B is None else step_B, (b,)),
            "policy_version_N": (torch.zeros(b, device=dev) if policy_version_B is None else policy_version_B, (b,)),
            "case_pos_NK": (torch.full((b, k), -1, dtype=torch.int64, device=dev) if case_pos_BK is None
                            else case_pos_BK, (b, k)),
        }
        if cfg.store_next:
            if next_state_BD is None or next_cands_BCD is None:
                raise DataFormatError("this replay buffer stores next states (store_next=True): give next_state_BD "
                                      "and next_cands_BCD")
            next_cands_BCD = torch.as_tensor(next_cands_BCD, device=dev)
            if next_cands_BCD.ndim != 3 or next_cands_BCD.shape[1] > cfg.c_max:
                raise DimensionError(f"replay buffer holds c_max={cfg.c_max}: next_cands_BCD must be (B, C<="
                                     f"{cfg.c_max}, {cfg.case_width}); got next_cands_BCD.shape="
                                     f"{tuple(next_cands_BCD.shape)}")
            c = next_cands_BCD.shape[1]
            rows["next_state_ix_N"] = (next_state_BD, (b, cfg.dim))
            rows["next_cands_ix_NC"] = (next_cands_BCD, (b, c, cfg.case_width))
            rows["next_mask_NC"] = (torch.ones(b, c, dtype=torch.bool, device=dev) if next_mask_BC is None
                                    else next_mask_BC, (b, c))
            rows["next_pos_NC"] = (torch.full((b, c), -1, dtype=torch.int64, device=dev) if next_pos_BC is None
                                   else next_pos_BC, (b, c))
        values: dict[str, torch.Tensor] = {}
        for name, (value, shape) in rows.items():
            value = torch.as_tensor(value, device=dev)
            if tuple(value.shape) != shape:
                raise DimensionError(f"replay add_batch: {_INPUT_NAME.get(name, name)} has shape {tuple(value.shape)}, "
                                     f"expected {shape} "
                                     f"(state_BD.shape={tuple(state_BD.shape)}, "
                                     f"cases_BKD.shape={tuple(cases_BKD.shape)})")
            values[name] = value
        if b == 0:
            return
        if b > cfg.capacity:  # only the newest `capacity` rows survive
            skipped = b - cfg.capacity
            values = {name: x[skipped:] for name, x in values.items()}
            self._ptr = (self._ptr + skipped) % cfg.capacity
            self._added += skipped
            b = cfg.capacity
        index_B = (self._ptr + torch.arange(b, device=dev)) % cfg.capacity
        self._make_room(values, index_B)
        for name, value in values.items():
            store = self._t[name]
            if store.ndim >= 2 and value.shape[1] < store.shape[1]:  # pad K -> k_max, C -> c_max (zero vectors)
                fill = 1.0 if name == "propensity_NK" else -1 if name in _POSITION_FIELDS else 0.0
                pad = torch.full((b, store.shape[1] - value.shape[1], *value.shape[2:]), fill, dtype=value.dtype,
                                 device=dev)
                value = torch.cat([value, pad], dim=1)
            if name in _TABLE_OF:  # vectors -> row indices of their table
                value = self._tables[_TABLE_OF[name]].intern(value).reshape(value.shape[:-1])
            store.index_copy_(0, index_B, value.to(store.dtype))
        self._ptr = (self._ptr + b) % cfg.capacity
        self._size = min(self._size + b, cfg.capacity)
        self._added += b

    def _live_rows(self, overwritten_B: torch.Tensor | None = None) -> torch.Tensor:
        """The filled rows, less those about to be overwritten."""
        live_N = torch.zeros(self.capacity, dtype=torch.bool, device=self.device)
        live_N[:self._size] = True
        if overwritten_B is not None:
            live_N[overwritten_B] = False
        return torch.nonzero(live_N).reshape(-1)

    def _compacted(self, rows: torch.Tensor, tables: tuple[str, ...]) -> tuple[dict[str, torch.Tensor],
                                                                               dict[str, torch.Tensor]]:
        """The used rows of ``tables`` that ``rows`` refer to, and the index fields of ``rows`` remapped."""
        new_tables: dict[str, torch.Tensor] = {}
        remapped: dict[str, torch.Tensor] = {}
        for table_name in tables:
            fields = [name for name, table in _TABLE_OF.items() if table == table_name and name in self._t]
            live = torch.cat([self._t[name].index_select(0, rows).reshape(-1) for name in fields])
            new_tables[table_name], remap_V = self._tables[table_name].compacted(live)
            for name in fields:
                remapped[name] = remap_V[self._t[name].index_select(0, rows)]
        return new_tables, remapped

    def _make_room(self, values: dict[str, torch.Tensor], index_B: torch.Tensor) -> None:
        """Compact a table that the new vectors could push past its limit (rows about to be overwritten let go)."""
        full = tuple(table_name for table_name, table in self._tables.items()
                     if len(table) + sum(v.shape[:-1].numel() for name, v in values.items()
                                         if _TABLE_OF.get(name) == table_name) > self._table_limit[table_name])
        if not full:
            return
        rows = self._live_rows(index_B)
        new_tables, remapped = self._compacted(rows, full)
        for name, ix in remapped.items():
            self._t[name].zero_()  # rows not live are overwritten before they are read again
            self._t[name][rows] = ix
        for table_name, data in new_tables.items():
            self._tables[table_name].replace(data)
        logger.debug("replay buffer: compacted %s to %s vectors", full, self.table_rows())

    # ------------------------------------------------------------------ forgetting

    def forget(self, prefix_MP: Any, *, unknown_only: bool = False) -> int:
        """Mask every stored case slot, and next-candidate slot, whose case vector begins with one of the rows
        of ``prefix_MP`` (``[M, P]``, ``1 <= P <= case width``: a state embedding, which starts its case vector
        with or without case features). Returns the number of slots masked; a decision left with no slot weighs
        nothing in the loss. This matches by content: every case of that text, whoever stored it (use
        :meth:`forget_cases` to forget cases by identity); ``unknown_only``: only the slots whose bank position
        is unknown."""
        prefix = torch.as_tensor(prefix_MP, device=self.device)
        if prefix.ndim == 1:
            prefix = prefix.unsqueeze(0)
        width = self.config.case_width
        if prefix.ndim != 2 or not 1 <= prefix.shape[1] <= width:
            raise DimensionError(f"replay forget: prefix_MP must be (M, P <= {width}); got shape {tuple(prefix.shape)}")
        table = self._tables["cases"]
        stored_VP = table.rows()[:, :prefix.shape[1]]
        prefix = prefix.to(stored_VP.dtype)
        match_V = torch.zeros(len(table), dtype=torch.bool, device=self.device)
        for row_P in prefix:  # one comparison pass over the table per forgotten case
            match_V |= (stored_VP == row_P).all(dim=1)
        if not bool(match_V.any()):
            return 0
        masked = 0
        for ix_name, mask_name, pos_name in (("cases_ix_NK", "mask_NK", "case_pos_NK"),
                                             ("next_cands_ix_NC", "next_mask_NC", "next_pos_NC")):
            if ix_name not in self._t:
                continue
            hit = match_V[self._t[ix_name]] & self._t[mask_name]
            if unknown_only:
                hit &= self._t[pos_name] < 0
            masked += int(hit.sum())
            self._t[mask_name].masked_fill_(hit, False)
        logger.info("replay buffer: forgot %d case slot(s) of %d case vector(s)", masked, int(match_V.sum()))
        return masked

    def forget_cases(self, positions_M: Any, prefix_MP: Any | None = None) -> int:
        """Mask every stored case slot, and next-candidate slot, that holds a case at one of the bank positions
        ``positions_M`` (the deleted cases' identities: another case that shares a deleted case's text, hence its
        vector, keeps its slots). A slot whose position is unknown (-1: added without positions, or read from a
        version-1 or -2 save) is masked when its vector begins with the matching row of ``prefix_MP`` (``[M, P]``,
        as :meth:`forget` matches), the only identity such a slot has. Returns the number of slots masked."""
        positions = torch.as_tensor(np.asarray(positions_M, dtype=np.int64).reshape(-1), device=self.device)
        masked = 0
        for pos_name, mask_name in (("case_pos_NK", "mask_NK"), ("next_pos_NC", "next_mask_NC")):
            if pos_name not in self._t:
                continue
            pos = self._t[pos_name]
            hit = torch.isin(pos, positions) & (pos >= 0) & self._t[mask_name]
            masked += int(hit.sum())
            self._t[mask_name].masked_fill_(hit, False)
        if prefix_MP is not None and bool((self._t["case_pos_NK"][:self._size] < 0).any()
                                          or ("next_pos_NC" in self._t
                                              and (self._t["next_pos_NC"][:self._size] < 0).any())):
            masked += self.forget(prefix_MP, unknown_only=True)
        if masked:
            logger.info("replay buffer: forgot %d case slot(s) of %d case(s)", masked, int(positions.numel()))
        return masked

    # ------------------------------------------------------------------ sampling

    def sample(self, batch_size: int, generator: torch.Generator) -> ReplayBatch:
        """``batch_size`` rows drawn uniformly with replacement; ``generator`` lives on the buffer's device."""
        if self._size == 0:
            raise MementoError("cannot sample from an empty replay buffer")
        if generator.device.type != self.device.type:
            raise MementoError(f"the sampling generator is on {generator.device} but the buffer on {self.device}; "
                               f"use torch.Generator(device={str(self.device)!r})")
        index_B = torch.randint(0, self._size, (batch_size,), generator=generator, device=self.device)
        return self.gather(index_B)

    def gather(self, index_B: torch.Tensor) -> ReplayBatch:
        """The rows at ``index_B`` (positions in storage order, ``0 <= i < len(self)``) as a batch.

        Reads the row fields only; the batch gathers its vectors from the tables when first read."""
        packed = {dtype: x.index_select(0, index_B) for dtype, x in self._packed.items()}
        take = {name: packed[dtype][:, start:stop] if wide else packed[dtype][:, start]
                for name, (dtype, start, stop, wide) in self._columns.items()}
        states, cases = self._tables["states"].data, self._tables["cases"].data
        lazy = {"state_BD": (states, take["state_ix_N"]), "cases_BKD": (cases, take["cases_ix_NK"])}
        if "next_state_ix_N" in take:
            lazy.update({"next_state_BD": (states, take["next_state_ix_N"]),
                         "next_cands_BCD": (cases, take["next_cands_ix_NC"])})
        return ReplayBatch(reward_B=take["reward_N"], propensity_BK=take["propensity_NK"], mask_BK=take["mask_NK"],
                           done_B=take["done_N"].float(), step_B=take["step_N"],
                           policy_version_B=take["policy_version_N"], next_mask_BC=take.get("next_mask_NC"),
                           _lazy=lazy, _checked=True)

    # ------------------------------------------------------------------ state and persistence

    def state_dict(self) -> dict[str, Any]:
        """Tensors (the filled rows, and the vectors they refer to, compacted) plus ints and the config as a
        plain dict: no Python objects."""
        rows = self._live_rows()
        tables, remapped = self._compacted(rows, tuple(self._tables))
        tensors = {name: remapped.get(name, x[:self._size]) for name, x in self._t.items()}
        tensors.update({_TABLE_TENSORS[name]: data for name, data in tables.items()})
        return {"config": to_dict(self.config), "ptr": self._ptr, "size": self._size, "added": self._added,
                "tensors": tensors}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output (or a version-1 save's dense tensors); the config must match."""
        config = state.get("config")
        try:  # a config saved before a field existed reads with that field's default
            config = to_dict(from_dict(ReplayConfig, config)) if isinstance(config, dict) else config
        except ConfigError:
            pass
        if config != to_dict(self.config):
            raise CheckpointError(f"replay state was saved with config {config}, this buffer has "
                                  f"{to_dict(self.config)}")
        size, ptr, added = int(state["size"]), int(state["ptr"]), int(state["added"])
        tensors = dict(state["tensors"])
        if _V1_VECTORS.keys() & tensors.keys():
            tensors = self._from_dense(tensors, size)
        for name in _POSITION_FIELDS:  # a version-1 or -2 save: the cases' positions are unknown
            if name in self._t and name not in tensors and isinstance(tensors.get("mask_NK"), torch.Tensor):
                tensors[name] = torch.full((size, *self._t[name].shape[1:]), -1, dtype=torch.int64,
                                           device=tensors["mask_NK"].device)
        expected = set(self._t) | set(_TABLE_TENSORS.values())
        if set(tensors) != expected or not 0 <= size <= self.capacity or not 0 <= ptr < self.capacity:
            raise CheckpointError(f"replay state is inconsistent: tensors {sorted(tensors)}, size={size}, ptr={ptr}")
        emb = _DTYPES[self.config.storage_dtype]
        for table_name, table in self._tables.items():
            data = tensors[_TABLE_TENSORS[table_name]]
            if data.ndim != 2 or data.shape[1] != table.width or data.dtype != emb:
                raise CheckpointError(f"replay state: {_TABLE_TENSORS[table_name]} has shape {tuple(data.shape)} and "
                                      f"dtype {data.dtype}, expected (V, {table.width}) and {emb}")
        for name, store in self._t.items():
            value = tensors[name]
            if tuple(value.shape) != (size, *store.shape[1:]) or value.dtype != store.dtype:
                raise CheckpointError(f"replay state: {name} has shape {tuple(value.shape)} and dtype {value.dtype}, "
                                      f"expected {(size, *store.shape[1:])} and {store.dtype}")
            if name in _TABLE_OF:
                rows = tensors[_TABLE_TENSORS[_TABLE_OF[name]]].shape[0]
                if value.numel() and (int(value.min()) < 0 or int(value.max()) >= rows):
                    raise CheckpointError(f"replay state: {name} refers to vector rows outside 0..{rows - 1}")
        for table_name, table in self._tables.items():
            table.replace(tensors[_TABLE_TENSORS[table_name]])
        for name, store in self._t.items():
            store.fill_(_ROW_FIELDS.get(name, _NEXT_ROW_FIELDS.get(name, (None, 0.0)))[1])  # as a fresh buffer
            store[:size].copy_(tensors[name])
        self._size, self._ptr, self._added = size, ptr, added

    def _from_dense(self, tensors: dict[str, torch.Tensor], size: int) -> dict[str, torch.Tensor]:
        """A version-1 state (one vector per slot) as row indices into vector tables."""
        emb = _DTYPES[self.config.storage_dtype]
        tables = {name: VectorTable(table.width, emb, self.device) for name, table in self._tables.items()}
        out = {name: x for name, x in tensors.items() if name not in _V1_VECTORS}
        for dense, name in _V1_VECTORS.items():
            if dense not in tensors:
                continue
            value = tensors[dense].to(self.device)
            table = tables[_TABLE_OF[name]]
            if value.ndim < 2 or value.shape[-1] != table.width:
                raise CheckpointError(f"replay state: {dense} has shape {tuple(value.shape)}, expected vectors of "
                                      f"{table.width}")
            out[name] = table.intern(value.reshape(-1, table.width)).reshape(value.shape[:-1])
        out.update({_TABLE_TENSORS[name]: table.rows() for name, table in tables.items()})
        return out

    def save(self, directory: str | Path) -> Path:
        """Write ``replay.safetensors`` + ``replay.json`` into ``directory`` (created if needed), atomically."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        state = self.state_dict()
        uid = uuid.uuid4().hex
        meta = {"format": REPLAY_FORMAT, "format_version": REPLAY_FORMAT_VERSION, "uid": uid,
                "config": state["config"], "ptr": state["ptr"], "size": state["size"], "added": state["added"]}
        tensors = {name: x.detach().to("cpu").contiguous() for name, x in state["tensors"].items()}
        atomic_write(directory / TENSORS_NAME,
                     lambda tmp: save_file(tensors, str(tmp), metadata={"format": REPLAY_FORMAT, "uid": uid}))
        atomic_write_text(directory / META_NAME, json.dumps(meta, indent=2, sort_keys=True) + "\n")
        logger.info("saved replay buffer (%d of %d rows) to %s", self._size, self.capacity, directory)
        return directory

    @classmethod
    def load(cls, directory: str | Path, device: torch.device | str | None = None) -> ReplayBuffer:
        """A buffer read from :meth:`save` output, on ``device`` (default: CUDA when present)."""
        directory = Path(directory)
        meta_path, tensors_path = directory / META_NAME, directory / TENSORS_NAME
        meta = read_saved_meta(directory, META_NAME, TENSORS_NAME, name="replay buffer", format=REPLAY_FORMAT,
                               version=REPLAY_FORMAT_VERSION, what="replay buffer",
                               kinds={"uid": str, "config": dict, "ptr": int, "size": int, "added": int})
        try:
            config = from_dict(ReplayConfig, meta["config"])
        except ConfigError as error:
            raise CheckpointError(f"{meta_path}: not a replay buffer config ({error})") from None
        buffer = cls(config, device=device)
        tensors, header = read_safetensors(tensors_path, device=str(buffer.device))
        check_same_save(directory, META_NAME, TENSORS_NAME, meta, header)
        try:
            buffer.load_state_dict({"config": meta["config"], "ptr": meta["ptr"], "size": meta["size"],
                                    "added": meta["added"], "tensors": tensors})
        except (MementoError, KeyError, TypeError, ValueError, IndexError, RuntimeError) as error:
            detail = " ".join(str(error).split())  # one line naming the file
            raise CheckpointError(f"{meta_path}: damaged replay buffer state ({type(error).__name__}: "
                                  f"{detail})") from None
        return buffer
