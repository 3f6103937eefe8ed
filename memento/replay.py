"""The replay buffer: preallocated tensors, ring overwrite, uniform sampling, safetensors persistence.

One row per decision. A decision shows ``K <= k_max`` cases for a state and gets one reward;
rows with fewer than ``k_max`` cases are zero-padded and masked. With ``store_next=True`` a row
also holds the next state and its (up to ``c_max``) candidate cases, for multi-step soft TD.

Storage (N = capacity, on the buffer's device; embeddings in ``storage_dtype``):

==================  ==========  ===========================================================
tensor              dtype       meaning
==================  ==========  ===========================================================
state_ND            embeddings  the state vector
cases_NKD           embeddings  the chosen cases, zero-padded to ``k_max``
mask_NK             bool        which of the ``k_max`` slots hold a case
reward_N            float32     the reward of the decision
propensity_NK       float32     the logging policy's probability of each chosen case (1 on padding)
done_N              bool        the episode ended with this decision
step_N              int64       the environment step (or global step) of the decision
policy_version_N    int64       the learner version that chose the cases
next_state_ND       embeddings  (``store_next``) the next state
next_cands_NCD      embeddings  (``store_next``) its candidates, zero-padded to ``c_max``
next_mask_NC        bool        (``store_next``) which of the ``c_max`` slots hold a candidate
==================  ==========  ===========================================================

Sampling is uniform with replacement, with a ``torch.Generator`` on the buffer's device (so a
buffer on the GPU samples on the GPU). Saving writes ``replay.safetensors`` and ``replay.json``
(format, config, ring position), each atomically; a random uid written into both detects a pair
torn by a crash. Nothing is pickled.
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
from memento.io import atomic_write, atomic_write_text, read_safetensors, read_versioned_json

__all__ = ["REPLAY_FORMAT", "REPLAY_FORMAT_VERSION", "ReplayBatch", "ReplayBuffer", "Transition"]

logger = logging.getLogger(__name__)

REPLAY_FORMAT = "memento-replay"
REPLAY_FORMAT_VERSION = 1
TENSORS_NAME = "replay.safetensors"
META_NAME = "replay.json"

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_NEXT_FIELDS = ("next_state_ND", "next_cands_NCD", "next_mask_NC")


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
    - ``step``, ``policy_version``: bookkeeping for off-policy evaluation and staleness.
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
            if next_cands_CD.size == 0:
                next_cands_CD = next_cands_CD.reshape(0, d)
            next_cands_CD = _vector(next_cands_CD, "next_cands_CD", 2)
            e = cases_KD.shape[1]
            if next_state_D.shape != (d,) or next_cands_CD.shape[1] != e:
                raise DimensionError(f"Transition: next_state_D must be (D={d},) and next_cands_CD (C', {e}); got "
                                     f"next_state_D.shape={next_state_D.shape}, "
                                     f"next_cands_CD.shape={next_cands_CD.shape}")
            object.__setattr__(self, "next_state_D", next_state_D)
            object.__setattr__(self, "next_cands_CD", next_cands_CD)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReplayBatch:
    """A mini-batch of B decisions (all tensors on one device); shapes are checked on construction.

    ``state_BD``, ``cases_BKD`` (float32), ``mask_BK`` (bool), ``reward_B``, ``propensity_BK``,
    ``done_B`` (float32, 0 or 1), ``step_B``, ``policy_version_B`` (int64); the multi-step fields
    ``next_state_BD``, ``next_cands_BCD`` (float32) and ``next_mask_BC`` (bool) are ``None`` when
    the buffer does not store them.
    """

    state_BD: torch.Tensor
    cases_BKD: torch.Tensor
    reward_B: torch.Tensor
    propensity_BK: torch.Tensor
    mask_BK: torch.Tensor
    done_B: torch.Tensor
    step_B: torch.Tensor
    policy_version_B: torch.Tensor
    next_state_BD: torch.Tensor | None = None
    next_cands_BCD: torch.Tensor | None = None
    next_mask_BC: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.state_BD.ndim != 2 or self.cases_BKD.ndim != 3:
            raise DimensionError(f"ReplayBatch: state_BD must be (B, D) and cases_BKD (B, K, D); got "
                                 f"state_BD.shape={tuple(self.state_BD.shape)}, "
                                 f"cases_BKD.shape={tuple(self.cases_BKD.shape)}")
        b, d = self.state_BD.shape
        k, e = self.cases_BKD.shape[1], self.cases_BKD.shape[2]  # e: D, or more with case features
        expected = {"cases_BKD": (b, k, e), "reward_B": (b,), "propensity_BK": (b, k), "mask_BK": (b, k),
                    "done_B": (b,), "step_B": (b,), "policy_version_B": (b,)}
        nexts = [self.next_state_BD, self.next_cands_BCD, self.next_mask_BC]
        if any(x is not None for x in nexts):
            if any(x is None for x in nexts):
                raise DataFormatError("ReplayBatch: next_state_BD, next_cands_BCD and next_mask_BC come together")
            if self.next_cands_BCD.ndim != 3:  # type: ignore[union-attr]
                raise DimensionError(f"ReplayBatch: next_cands_BCD must be (B, C, D); got next_cands_BCD.shape="
                                     f"{tuple(self.next_cands_BCD.shape)}")  # type: ignore[union-attr]
            c = self.next_cands_BCD.shape[1]  # type: ignore[union-attr]
            expected.update({"next_state_BD": (b, d), "next_cands_BCD": (b, c, e), "next_mask_BC": (b, c)})
        for name, shape in expected.items():
            actual = tuple(getattr(self, name).shape)
            if actual != shape:
                raise DimensionError(f"ReplayBatch: {name}.shape={actual} does not match state_BD.shape={(b, d)} "
                                     f"and cases_BKD.shape={(b, k, e)} (expected {shape})")

    @property
    def batch_size(self) -> int:
        return int(self.state_BD.shape[0])

    @property
    def has_next(self) -> bool:
        return self.next_state_BD is not None

    def to(self, device: torch.device | str, non_blocking: bool = False) -> ReplayBatch:
        """The same batch on ``device`` (itself when already there)."""
        device = torch.device(device)
        if self.state_BD.device == device:
            return self
        moved = {f.name: None if getattr(self, f.name) is None else getattr(self, f.name).to(
            device, non_blocking=non_blocking) for f in dataclasses.fields(self)}
        return ReplayBatch(**moved)


class ReplayBuffer:
    """A ring buffer of decisions in preallocated tensors on ``device`` (see the module docstring).

    ``device=None`` puts it on CUDA when a GPU is present, else on the CPU.
    """

    def __init__(self, config: ReplayConfig, device: torch.device | str | None = None):
        self.config = config
        self.device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
        n, k, d, c = config.capacity, config.k_max, config.dim, config.c_max
        e = config.case_width
        emb = _DTYPES[config.storage_dtype]
        dev = self.device
        self._t: dict[str, torch.Tensor] = {
            "state_ND": torch.zeros(n, d, dtype=emb, device=dev),
            "cases_NKD": torch.zeros(n, k, e, dtype=emb, device=dev),
            "mask_NK": torch.zeros(n, k, dtype=torch.bool, device=dev),
            "reward_N": torch.zeros(n, dtype=torch.float32, device=dev),
            "propensity_NK": torch.ones(n, k, dtype=torch.float32, device=dev),
            "done_N": torch.zeros(n, dtype=torch.bool, device=dev),
            "step_N": torch.zeros(n, dtype=torch.int64, device=dev),
            "policy_version_N": torch.zeros(n, dtype=torch.int64, device=dev),
        }
        if config.store_next:
            self._t["next_state_ND"] = torch.zeros(n, d, dtype=emb, device=dev)
            self._t["next_cands_NCD"] = torch.zeros(n, c, e, dtype=emb, device=dev)
            self._t["next_mask_NC"] = torch.zeros(n, c, dtype=torch.bool, device=dev)
        self._ptr = 0  # the next row to write
        self._size = 0  # rows filled
        self._added = 0  # rows ever added
        logger.debug("replay buffer: capacity %d, %.1f MiB on %s", n,
                     sum(t.numel() * t.element_size() for t in self._t.values()) / 2**20, dev)

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
        cases_1KD = np.zeros((1, k_max, e), dtype=np.float32)
        cases_1KD[0, :k] = t.cases_KD
        propensity_1K = np.ones((1, k_max), dtype=np.float32)
        propensity_1K[0, :k] = t.propensity_K
        mask_1K = (np.arange(k_max) < k)[None]
        nexts: dict[str, np.ndarray | None] = {"next_state_BD": None, "next_cands_BCD": None, "next_mask_BC": None}
        if t.next_state_D is not None and self.config.store_next:  # (without store_next they are not kept)
            assert t.next_cands_CD is not None
            c = t.next_cands_CD.shape[0]
            if c > c_max:
                raise DimensionError(f"replay buffer holds c_max={c_max} next candidates; got "
                                     f"next_cands_CD.shape={t.next_cands_CD.shape}")
            cands_1CD = np.zeros((1, c_max, e), dtype=np.float32)
            cands_1CD[0, :c] = t.next_cands_CD
            nexts = {"next_state_BD": t.next_state_D[None], "next_cands_BCD": cands_1CD,
                     "next_mask_BC": (np.arange(c_max) < c)[None]}
        self.add_batch(state_BD=t.state_D[None], cases_BKD=cases_1KD, mask_BK=mask_1K,
                       reward_B=np.array([t.reward], dtype=np.float32), propensity_BK=propensity_1K,
                       done_B=np.array([t.done]), step_B=np.array([t.step], dtype=np.int64),
                       policy_version_B=np.array([t.policy_version], dtype=np.int64), **nexts)

    def add_batch(self, *, state_BD: Any, cases_BKD: Any, reward_B: Any, propensity_BK: Any | None = None,
                  mask_BK: Any | None = None, done_B: Any | None = None, step_B: Any | None = None,
                  policy_version_B: Any | None = None, next_state_BD: Any | None = None,
                  next_cands_BCD: Any | None = None, next_mask_BC: Any | None = None) -> None:
        """Append B decisions at once from numpy arrays or tensors (vectorised; no per-row Python).

        ``K`` of ``cases_BKD`` may be below ``k_max`` (and ``C`` of ``next_cands_BCD`` below ``c_max``):
        the rest is padded. Defaults: every slot valid, propensity 1, done True, step and version 0.
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
            "state_ND": (state_BD, (b, cfg.dim)),
            "cases_NKD": (cases_BKD, (b, k, cfg.case_width)),
            "mask_NK": (ones_BK.bool() if mask_BK is None else mask_BK, (b, k)),
            "reward_N": (reward_B, (b,)),
            "propensity_NK": (ones_BK if propensity_BK is None else propensity_BK, (b, k)),
            "done_N": (torch.ones(b, device=dev) if done_B is None else done_B, (b,)),
            "step_N": (torch.zeros(b, device=dev) if step_B is None else step_B, (b,)),
            "policy_version_N": (torch.zeros(b, device=dev) if policy_version_B is None else policy_version_B, (b,)),
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
            rows["next_state_ND"] = (next_state_BD, (b, cfg.dim))
            rows["next_cands_NCD"] = (next_cands_BCD, (b, c, cfg.case_width))
            rows["next_mask_NC"] = (torch.ones(b, c, dtype=torch.bool, device=dev) if next_mask_BC is None
                                    else next_mask_BC, (b, c))
        values: dict[str, torch.Tensor] = {}
        for name, (value, shape) in rows.items():
            value = torch.as_tensor(value, device=dev)
            if tuple(value.shape) != shape:
                raise DimensionError(f"replay add_batch: {name} has shape {tuple(value.shape)}, expected {shape} "
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
        for name, value in values.items():
            store = self._t[name]
            value = value.to(store.dtype)
            if value.ndim >= 2 and value.shape[1] < store.shape[1]:  # pad K -> k_max, C -> c_max
                fill = 1.0 if name == "propensity_NK" else 0.0
                pad = torch.full((b, store.shape[1] - value.shape[1], *value.shape[2:]), fill, dtype=store.dtype,
                                 device=dev)
                value = torch.cat([value, pad], dim=1)
            store.index_copy_(0, index_B, value)
        self._ptr = (self._ptr + b) % cfg.capacity
        self._size = min(self._size + b, cfg.capacity)
        self._added += b

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
        """The rows at ``index_B`` (positions in storage order, ``0 <= i < len(self)``) as a batch."""
        t = self._t
        take = {name: x.index_select(0, index_B) for name, x in t.items()}

        def emb(name: str) -> torch.Tensor:
            return take[name].float()

        return ReplayBatch(
            state_BD=emb("state_ND"), cases_BKD=emb("cases_NKD"), reward_B=take["reward_N"],
            propensity_BK=take["propensity_NK"], mask_BK=take["mask_NK"], done_B=take["done_N"].float(),
            step_B=take["step_N"], policy_version_B=take["policy_version_N"],
            next_state_BD=emb("next_state_ND") if "next_state_ND" in take else None,
            next_cands_BCD=emb("next_cands_NCD") if "next_cands_NCD" in take else None,
            next_mask_BC=take.get("next_mask_NC"),
        )

    # ------------------------------------------------------------------ state and persistence

    def state_dict(self) -> dict[str, Any]:
        """Tensors (the filled rows) plus ints and the config as a plain dict: no Python objects."""
        return {"config": to_dict(self.config), "ptr": self._ptr, "size": self._size, "added": self._added,
                "tensors": {name: x[:self._size] for name, x in self._t.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output; the config must match this buffer's."""
        config = state.get("config")
        try:  # a config saved before a field existed reads with that field's default
            config = to_dict(from_dict(ReplayConfig, config)) if isinstance(config, dict) else config
        except ConfigError:
            pass
        if config != to_dict(self.config):
            raise CheckpointError(f"replay state was saved with config {config}, this buffer has "
                                  f"{to_dict(self.config)}")
        size, ptr, added = int(state["size"]), int(state["ptr"]), int(state["added"])
        tensors = state["tensors"]
        if set(tensors) != set(self._t) or not 0 <= size <= self.capacity or not 0 <= ptr < self.capacity:
            raise CheckpointError(f"replay state is inconsistent: tensors {sorted(tensors)}, size={size}, ptr={ptr}")
        for name, store in self._t.items():
            value = tensors[name]
            if tuple(value.shape) != (size, *store.shape[1:]) or value.dtype != store.dtype:
                raise CheckpointError(f"replay state: {name} has shape {tuple(value.shape)} and dtype {value.dtype}, "
                                      f"expected {(size, *store.shape[1:])} and {store.dtype}")
        for name, store in self._t.items():
            store.fill_(1.0 if name == "propensity_NK" else 0.0)  # rows past `size` as a fresh buffer has them
            store[:size].copy_(tensors[name])
        self._size, self._ptr, self._added = size, ptr, added

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
        if not meta_path.is_file() or not tensors_path.is_file():
            raise CheckpointError(f"{directory}: not a saved replay buffer (needs {META_NAME} and {TENSORS_NAME})")
        meta = read_versioned_json(meta_path, format=REPLAY_FORMAT, version=REPLAY_FORMAT_VERSION,
                                   what="replay buffer")
        buffer = cls(from_dict(ReplayConfig, meta["config"]), device=device)
        tensors, header = read_safetensors(tensors_path, device=str(buffer.device))
        if header.get("uid") != meta.get("uid"):
            raise CheckpointError(f"{directory}: {META_NAME} and {TENSORS_NAME} come from different saves "
                                  f"(uid {meta.get('uid')} vs {header.get('uid')}); was a save interrupted?")
        buffer.load_state_dict({"config": meta["config"], "ptr": meta["ptr"], "size": meta["size"],
                                "added": meta["added"], "tensors": tensors})
        return buffer
