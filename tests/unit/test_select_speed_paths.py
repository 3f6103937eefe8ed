"""The fast scoring and choosing paths of a soft-Q selection equal the plain ones (issue 33).

``QNetwork.score`` must give exactly what ``forward`` gives in ``eval()`` mode, without touching the module's
mode; ``q_values`` must follow a network that moved; ``boltzmann_select`` must make exactly the choice (ids,
propensities, set probability, draws from the rng) that the public helpers make step by step. Speed itself is
measured by ``memento bench select``, not here.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from torch import nn

from memento.bank import Candidates
from memento.config import QNetConfig
from memento.errors import DataFormatError, DimensionError
from memento.learn.policy import (
    boltzmann_select,
    gumbel_top_k,
    log_softmax,
    make_selection,
    q_values,
    softmax,
    top_k,
)
from memento.learn.qnet import MLPQNetwork, QNetwork, build_qnet

D, C = 16, 12

CONFIGS = [
    QNetConfig(arch="mlp", dim=D, hidden=32, dropout=0.5, seed=1),
    QNetConfig(arch="mlp", dim=D, hidden=32, n_layers=3, dropout=0.5, seed=2),
    QNetConfig(arch="mlp_interact", dim=D, hidden=32, dropout=0.5, seed=3),
    QNetConfig(arch="mlp", dim=D, hidden=32, anchor="cosine", relation_rank=4, dropout=0.5, seed=4),
    QNetConfig(arch="mlp", dim=D, hidden=32, features="case", dropout=0.5, seed=5),
    QNetConfig(arch="two_tower", dim=D, hidden=32, n_layers=2, dropout=0.5, seed=6),
]


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def _trained_like(net: QNetwork) -> QNetwork:
    """Random non-zero weights everywhere (an anchored network starts with a zero output layer)."""
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for param in net.parameters():
            param.copy_(torch.randn(param.shape, generator=gen) * 0.3)
    return net


def _inputs(config: QNetConfig, seed: int = 0) -> tuple[np.ndarray, Candidates, np.ndarray]:
    rng = np.random.default_rng(seed)
    state_D = _unit(rng.standard_normal(D))
    emb_CD = _unit(rng.standard_normal((C, D)))
    cases_CE = np.concatenate([emb_CD, rng.standard_normal((C, config.case_dim - D)).astype(np.float32)], axis=1)
    candidates = Candidates(ids=[f"c{i}" for i in range(C)], positions_C=np.arange(C), scores_C=emb_CD @ state_D,
                            embeddings_CD=emb_CD)
    return state_D, candidates, cases_CE


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c.arch}-{c.features}-{c.anchor}-{c.n_layers}")
@pytest.mark.parametrize("training", [True, False])
def test_score_equals_eval_forward_and_keeps_the_mode(config: QNetConfig, training: bool) -> None:
    net = _trained_like(build_qnet(config)).train(training)
    state_D, _, cases_CE = _inputs(config)
    state_BD, cases_BCD = torch.as_tensor(state_D)[None], torch.as_tensor(cases_CE)[None]
    with torch.inference_mode():
        fast_BC = net.score(state_BD, cases_BCD)
    assert all(m.training == training for m in net.modules())
    net.eval()
    with torch.inference_mode():
        plain_BC = net(state_BD, cases_BCD)
    assert torch.equal(fast_BC, plain_BC)
    assert fast_BC.abs().max() > 0


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c.arch}-{c.features}-{c.anchor}-{c.n_layers}")
def test_q_values_of_a_qnetwork_equal_the_generic_module_path(config: QNetConfig) -> None:
    net = _trained_like(build_qnet(config)).train()

    class Wrapped(nn.Module):  # not a QNetwork: q_values switches it to eval() and back
        def __init__(self) -> None:
            super().__init__()
            self.inner = net

        def forward(self, state_BD: torch.Tensor, cases_BCD: torch.Tensor) -> torch.Tensor:
            return self.inner(state_BD, cases_BCD)

    wrapped = Wrapped().train()
    state_D, candidates, cases_CE = _inputs(config, seed=3)
    cases = None if config.features == "none" else cases_CE
    fast_C = q_values(net, state_D, candidates, cases_CE=cases)
    plain_C = q_values(wrapped, state_D, candidates, cases_CE=cases)
    assert fast_C.dtype == np.float64 and fast_C.shape == (C,)
    if isinstance(net, MLPQNetwork):  # numpy's products: the same values to float32 rounding
        np.testing.assert_allclose(fast_C, plain_C, rtol=1e-5, atol=1e-6)
    else:
        np.testing.assert_array_equal(fast_C, plain_C)
    assert net.training and wrapped.training


@pytest.mark.parametrize("config", [c for c in CONFIGS if c.arch != "two_tower"],
                         ids=lambda c: f"{c.arch}-{c.features}-{c.anchor}-{c.n_layers}")
def test_numpy_scores_equal_score_and_step_aside_where_they_cannot(config: QNetConfig) -> None:
    net = _trained_like(build_qnet(config)).train()
    state_D, _, cases_CE = _inputs(config, seed=5)
    with torch.inference_mode():
        plain_C = net.score(torch.as_tensor(state_D)[None], torch.as_tensor(cases_CE)[None])[0].numpy()
    fast_C = net.numpy_scores(state_D, cases_CE)
    assert fast_C is not None and fast_C.dtype == np.float32
    np.testing.assert_allclose(fast_C, plain_C, rtol=1e-5, atol=1e-6)
    assert net.numpy_scores(state_D[:-1], cases_CE) is None  # shapes: score raises the error
    handle = net.register_forward_hook(lambda *args: None)
    assert net.numpy_scores(state_D, cases_CE) is None  # a hook must see the call
    handle.remove()
    assert net.double().numpy_scores(state_D, cases_CE) is None


def test_q_values_follow_a_network_that_changed_dtype() -> None:
    config = CONFIGS[0]
    net = _trained_like(build_qnet(config))
    state_D, candidates, _ = _inputs(config)
    assert net.placement() == (torch.device("cpu"), torch.float32)
    single_C = q_values(net, state_D, candidates)
    net.double()
    assert net.placement() == (torch.device("cpu"), torch.float64)
    double_C = q_values(net, state_D, candidates)
    with torch.inference_mode():
        expected_C = net.eval()(torch.as_tensor(state_D, dtype=torch.float64)[None],
                                torch.as_tensor(candidates.embeddings_CD, dtype=torch.float64)[None])[0].numpy()
    np.testing.assert_array_equal(double_C, expected_C)
    assert not np.array_equal(single_C, double_C)  # float32 and float64 arithmetic differ in the last places
    np.testing.assert_allclose(single_C, double_C, rtol=1e-5, atol=1e-6)


def test_score_honours_an_overridden_forward_and_hooks() -> None:
    config = CONFIGS[0]

    class Shifted(MLPQNetwork):
        def forward(self, state_BD: torch.Tensor, cases_BCD: torch.Tensor, *, generator=None) -> torch.Tensor:
            return super().forward(state_BD, cases_BCD, generator=generator) + 100.0

    net, shifted = _trained_like(build_qnet(config)), Shifted(config)
    shifted.load_state_dict(net.state_dict())
    state_D, candidates, _ = _inputs(config)
    base_C = q_values(net, state_D, candidates)
    np.testing.assert_allclose(q_values(shifted.train(), state_D, candidates), base_C + 100.0, rtol=1e-6)
    assert shifted.training
    net.register_forward_hook(lambda module, args, out: out * 2)
    np.testing.assert_allclose(q_values(net, state_D, candidates), 2 * base_C, rtol=1e-6)


def _stepwise(q_C: np.ndarray, candidates: Candidates, k: int, alpha: float, rng: np.random.Generator,
              greedy: bool):
    """The choice as the public helpers make it, one checked step at a time."""
    k = min(k, len(candidates))
    logp_C = log_softmax(q_C, alpha)
    probs_C = softmax(q_C, alpha)
    order_K = top_k(q_C, k) if greedy else gumbel_top_k(logp_C, k, rng)
    return make_selection(candidates, probs_C, order_K, greedy=greedy, logits_C=logp_C)


@pytest.mark.parametrize("alpha", [1.0, 0.05, 1e-4, 30.0])
@pytest.mark.parametrize("greedy", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_boltzmann_select_equals_the_stepwise_helpers(alpha: float, greedy: bool, masked: bool) -> None:
    _, candidates, _ = _inputs(CONFIGS[0])
    data = np.random.default_rng(5)
    fast_rng, step_rng = np.random.default_rng(9), np.random.default_rng(9)
    for trial in range(40):
        q_C = data.normal(size=C) * 3
        if masked:  # -inf entries take the fully checked path
            q_C[data.choice(C, size=C - 2, replace=False)] = -np.inf
        k = int(data.integers(1, C + 3))
        fast = boltzmann_select(q_C, candidates, k, alpha, rng=fast_rng, greedy=greedy)
        step = _stepwise(q_C, candidates, k, alpha, step_rng, greedy)
        assert fast.ids == step.ids, trial
        assert fast.positions_K.dtype == step.positions_K.dtype
        np.testing.assert_array_equal(fast.positions_K, step.positions_K)
        np.testing.assert_array_equal(fast.probs_C, step.probs_C)
        np.testing.assert_array_equal(fast.probs_K, step.probs_K)
        assert fast.set_prob == step.set_prob and fast.greedy == step.greedy
        assert fast.candidate_ids == step.candidate_ids
    assert fast_rng.random() == step_rng.random()  # the same number of draws


def test_boltzmann_select_rejects_what_the_helpers_reject() -> None:
    _, candidates, _ = _inputs(CONFIGS[0])
    rng = np.random.default_rng(0)
    q_C = np.linspace(0.0, 1.0, C)
    for bad in (np.where(np.arange(C) == 3, np.nan, q_C), np.where(np.arange(C) == 3, np.inf, q_C),
                np.full(C, -np.inf)):
        with pytest.raises(DataFormatError):
            boltzmann_select(bad, candidates, 2, 1.0, rng=rng)
    for alpha in (0.0, -1.0, float("nan"), True):
        with pytest.raises(DataFormatError):
            boltzmann_select(q_C, candidates, 2, alpha, rng=rng)
    with pytest.raises(DataFormatError, match="overflows"):
        boltzmann_select(np.full(C, 1e300), candidates, 2, 1e-300, rng=rng)
    with pytest.raises(DimensionError):
        boltzmann_select(q_C[:-1], candidates, 2, 1.0, rng=rng)
    with pytest.raises(DataFormatError):
        boltzmann_select(q_C, candidates, 0, 1.0, rng=rng)


def test_agent_choices_are_unchanged_by_the_networks_mode() -> None:
    """A learning agent's network sits in train() mode between updates; its choices are the eval-mode ones."""
    config = dataclasses.replace(CONFIGS[0], dropout=0.9)
    net = _trained_like(build_qnet(config))
    state_D, candidates, _ = _inputs(config)
    net.train()
    a = boltzmann_select(q_values(net, state_D, candidates), candidates, 4, 0.1, rng=np.random.default_rng(2))
    net.eval()
    b = boltzmann_select(q_values(net, state_D, candidates), candidates, 4, 0.1, rng=np.random.default_rng(2))
    assert a.ids == b.ids and a.set_prob == b.set_prob
