"""The soft-Q policy: parametric case-based reasoning (README, "Concepts").

``mu(c | s) = softmax(Q(s, c) / alpha)`` over the candidate set, where ``Q`` is any
``torch.nn.Module`` with ``forward(state_BD, cases_BCD) -> q_BC`` (the interface of
``memento.learn.qnet``). A non-greedy ``select`` draws K cases without replacement by Gumbel-top-k
and records the exact Plackett-Luce propensity (computed in log space, so it stays exact
when ``alpha`` is tiny); ``greedy=True`` returns the top-K by Q (ties go to the earlier
candidate) with ``set_prob = 1.0``, for evaluation.

``alpha`` is a plain attribute (validated on assignment) that a learner may anneal or tune.
Q is evaluated under ``torch.inference_mode`` on the Q-network's device (that of its first
parameter or buffer, read at every call so a moved network is followed; CPU for a
parameterless one) unless ``device`` pins one. While scoring, the network is put in
``eval()`` mode and its previous mode is restored afterwards. No learning happens here: that
is the learner's job.

:class:`~memento.learn.agent.SoftQAgent` (re-exported here) is the learning soft-Q policy: it owns its
Q-network, learner and replay buffer and chooses with the same rule; ``memento.policies.make_policy`` builds
it from a :class:`~memento.config.SoftQConfig`.
"""

from __future__ import annotations

import math
import numbers

import numpy as np
import torch

from memento.bank import Candidates
from memento.errors import ConfigError
from memento.learn.agent import SoftQAgent
from memento.learn.policy import StaticPolicy, boltzmann_select, q_values, softmax
from memento.types import Selection

__all__ = ["SoftQAgent", "SoftQPolicy"]


class SoftQPolicy(StaticPolicy):
    """Boltzmann policy over a given Q-network's scores (see the module docstring); it does not learn."""

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

    def q_values(self, state_D: np.ndarray, candidates: Candidates) -> np.ndarray:
        """``Q(s, c)`` for every candidate, as float64 ``q_C``."""
        return q_values(self.qnet, state_D, candidates, self.device)

    def probs(self, state_D: np.ndarray, candidates: Candidates) -> np.ndarray:
        """``softmax(Q(s, c) / alpha)`` over the candidates."""
        return softmax(self.q_values(state_D, candidates), self.alpha)

    def select(self, state_D: np.ndarray, candidates: Candidates, k: int, *, rng: np.random.Generator,
               greedy: bool = False) -> Selection:
        return boltzmann_select(self.q_values(state_D, candidates), candidates, k, self.alpha, rng=rng,
                                greedy=greedy)

    def __repr__(self) -> str:
        return f"SoftQPolicy(qnet={type(self.qnet).__name__}, alpha={self.alpha!r}, device={self.device})"
