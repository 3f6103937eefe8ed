"""The soft-Q policy: parametric case-based reasoning (DESIGN §2).

``mu(c | s) = softmax(Q(s, c) / alpha)`` over the candidate set, where ``Q`` is any
``torch.nn.Module`` with ``forward(state_BD, cases_BCD) -> q_BC`` (the interface of
``memento.qnet``). A non-greedy ``select`` draws K cases without replacement by Gumbel-top-k
and records the exact Plackett-Luce propensity (computed in log space, so it stays exact
when ``alpha`` is tiny); ``greedy=True`` returns the top-K by Q (ties go to the earlier
candidate) with ``set_prob = 1.0``, for evaluation.

``alpha`` is a plain attribute (validated on assignment) that a learner may anneal or tune.
Q is evaluated under ``torch.inference_mode`` on the Q-network's device (that of its first
parameter or buffer, read at every call so a moved network is followed; CPU for a
parameterless one) unless ``device`` pins one. While scoring, the network is put in
``eval()`` mode and its previous mode is restored afterwards. No learning happens here: that
is the learner's job.
"""

from __future__ import annotations

import math
import numbers

import numpy as np
import torch

from memento.errors import ConfigError, DimensionError
from memento.memory import Candidates
from memento.policy import check_candidates, check_k, gumbel_top_k, log_softmax, make_selection, softmax, top_k
from memento.types import Selection

__all__ = ["SoftQPolicy"]


class SoftQPolicy:
    """Boltzmann policy over a Q-network's scores (see the module docstring)."""

    def __init__(self, qnet: torch.nn.Module, *, alpha: float = 1.0, device: str | torch.device | None = None):
        if not isinstance(qnet, torch.nn.Module):
            raise ConfigError(f"SoftQPolicy.qnet={type(qnet).__name__}: must be a torch.nn.Module "
                              "with forward(state_BD, cases_BCD) -> q_BC")
        self.qnet = qnet
        self._alpha: float = 1.0
        self.alpha = alpha
        self.device = None if device is None else torch.device(device)

    @property
    def alpha(self) -> float:
        """The temperature of ``softmax(Q / alpha)``: -> 0 is greedy, large is uniform."""
        return self._alpha

    @alpha.setter
    def alpha(self, value: float) -> None:
        if (isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real)
                or not math.isfinite(value) or value <= 0):
            raise ConfigError(f"SoftQPolicy.alpha={value!r}: must be a finite number > 0")
        self._alpha = float(value)

    def _placement(self) -> tuple[torch.device, torch.dtype]:
        for tensor in (*self.qnet.parameters(), *self.qnet.buffers()):
            if tensor.is_floating_point():
                return (self.device or tensor.device), tensor.dtype
        return (self.device or torch.device("cpu")), torch.float32

    def q_values(self, state_D: np.ndarray, candidates: Candidates) -> np.ndarray:
        """``Q(s, c)`` for every candidate, as float64 ``q_C``."""
        state = check_candidates(state_D, candidates)
        device, dtype = self._placement()
        was_training = self.qnet.training
        try:
            self.qnet.eval()
            with torch.inference_mode():
                state_BD = torch.as_tensor(state, dtype=dtype, device=device).unsqueeze(0)
                cases_BCD = torch.as_tensor(np.asarray(candidates.embeddings_CD), dtype=dtype,
                                            device=device).unsqueeze(0)
                q_BC = self.qnet(state_BD, cases_BCD)
                if not isinstance(q_BC, torch.Tensor) or tuple(q_BC.shape) != (1, len(candidates)):
                    shape = tuple(q_BC.shape) if isinstance(q_BC, torch.Tensor) else type(q_BC).__name__
                    raise DimensionError(f"qnet returned {shape}, expected q_BC of shape (1, {len(candidates)}) "
                                         f"for state_BD {tuple(state_BD.shape)} and cases_BCD "
                                         f"{tuple(cases_BCD.shape)}")
                q_C = q_BC[0].to("cpu").double().numpy().copy()
        finally:
            self.qnet.train(was_training)
        return q_C

    def probs(self, state_D: np.ndarray, candidates: Candidates) -> np.ndarray:
        """``softmax(Q(s, c) / alpha)`` over the candidates."""
        return softmax(self.q_values(state_D, candidates), self.alpha)

    def select(self, state_D: np.ndarray, candidates: Candidates, k: int, *, rng: np.random.Generator,
               greedy: bool = False) -> Selection:
        q_C = self.q_values(state_D, candidates)
        k = check_k(k, len(candidates))
        logp_C = log_softmax(q_C, self.alpha)
        probs_C = softmax(q_C, self.alpha)
        order_K = top_k(q_C, k) if greedy else gumbel_top_k(logp_C, k, rng)
        return make_selection(candidates, probs_C, order_K, greedy=greedy, logits_C=logp_C)

    def __repr__(self) -> str:
        return f"SoftQPolicy(qnet={type(self.qnet).__name__}, alpha={self.alpha!r}, device={self.device})"
