"""The per-position cache of an MLP Q-network's case half (issue 41): cached scores equal uncached ones, and stale
rows (other weights, another vector at a position) are never used.

Speed is measured by ``memento bench select``, not here.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from memento.bank import Candidates
from memento.config import QNetConfig
from memento.learn.policy import q_values
from memento.learn.qnet import CaseHalfCache, MLPQNetwork, build_qnet

D, C, N = 16, 12, 40

CONFIGS = [
    QNetConfig(arch="mlp", dim=D, hidden=32, seed=1),
    QNetConfig(arch="mlp", dim=D, hidden=32, n_layers=3, seed=2),
    QNetConfig(arch="mlp_interact", dim=D, hidden=32, seed=3),
    QNetConfig(arch="mlp", dim=D, hidden=32, anchor="cosine", relation_rank=4, seed=4),
    QNetConfig(arch="mlp", dim=D, hidden=32, features="case", seed=5),
    QNetConfig(arch="mlp_interact", dim=D, hidden=32, features="case", relation_rank=3, seed=6),
]
IDS = [f"{c.arch}-{c.features}-{c.anchor}-r{c.relation_rank}-{c.n_layers}" for c in CONFIGS]


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def _net(config: QNetConfig, seed: int = 11) -> MLPQNetwork:
    net = build_qnet(config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in net.parameters():
            param.copy_(torch.randn(param.shape, generator=gen) * 0.3)
    assert isinstance(net, MLPQNetwork)
    return net


def _bank(config: QNetConfig, seed: int = 0, n: int = N) -> np.ndarray:
    """``n`` case vectors (question embedding, then the rest: with case features an answer embedding and scalars)."""
    rng = np.random.default_rng(seed)
    return np.concatenate([_unit(rng.standard_normal((n, D))),
                           rng.standard_normal((n, config.case_dim - D)).astype(np.float32)], axis=1)


def _uncached(net: MLPQNetwork, state_D: np.ndarray, cases_CE: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        return net.score(torch.as_tensor(state_D)[None], torch.as_tensor(cases_CE)[None])[0].numpy()


def _check(net: MLPQNetwork, state_D: np.ndarray, cases_CE: np.ndarray, positions_C: np.ndarray) -> None:
    cached_C = net.numpy_scores(state_D, cases_CE, positions_C)
    assert cached_C is not None
    np.testing.assert_allclose(cached_C, _uncached(net, state_D, cases_CE), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(cached_C, net.numpy_scores(state_D, cases_CE), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_cached_scores_equal_uncached_ones_cold_and_warm(config: QNetConfig) -> None:
    net = _net(config)
    bank_NE = _bank(config)
    rng = np.random.default_rng(1)
    for query in range(12):  # overlapping candidate sets: later ones are mostly hits
        positions_C = rng.choice(N, size=C, replace=False)
        if query % 4 == 3:  # a repeated position and one with no bank position
            positions_C[1] = positions_C[0]
            positions_C[2] = -1
        state_D = _unit(rng.standard_normal(D))
        _check(net, state_D, bank_NE[np.maximum(positions_C, 0)] if query % 4 != 3 else bank_NE[np.abs(positions_C)],
               positions_C)
    for c in (1, 2, 3, 5):  # the few-row products
        positions_C = rng.choice(N, size=c, replace=False)
        _check(net, _unit(rng.standard_normal(D)), bank_NE[positions_C], positions_C)
    cache = net.case_cache
    assert cache.hits > 0 and cache.misses > 0 and 0 < len(cache) <= N


def test_q_values_use_the_candidates_positions() -> None:
    config = CONFIGS[0]
    net = _net(config)
    bank_ND = _bank(config)
    positions_C = np.arange(C)
    candidates = Candidates(ids=[f"c{i}" for i in positions_C], positions_C=positions_C,
                            scores_C=np.zeros(C, dtype=np.float32), embeddings_CD=bank_ND[positions_C])
    state_D = _unit(np.random.default_rng(2).standard_normal(D))
    first_C = q_values(net, state_D, candidates)
    assert net.case_cache.misses == C and net.case_cache.hits == 0
    np.testing.assert_array_equal(q_values(net, state_D, candidates), first_C)
    assert net.case_cache.hits == C


def _warm(net: MLPQNetwork, config: QNetConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    bank_NE = _bank(config)
    positions_C = np.arange(C)
    state_D = _unit(np.random.default_rng(3).standard_normal(D))
    net.numpy_scores(state_D, bank_NE[positions_C], positions_C)
    assert len(net.case_cache) == C
    return state_D, bank_NE[positions_C], positions_C


@pytest.mark.parametrize("config", [CONFIGS[0], CONFIGS[3], CONFIGS[4]], ids=[IDS[0], IDS[3], IDS[4]])
@pytest.mark.parametrize("change", ["optimizer", "no_grad", "load_state_dict", "reset", "relation", "explicit"])
def test_a_weight_change_makes_every_cached_row_stale(config: QNetConfig, change: str) -> None:
    net = _net(config)
    state_D, cases_CE, positions_C = _warm(net, config)
    before_C = net.numpy_scores(state_D, cases_CE, positions_C)
    if change == "optimizer":
        optimizer = torch.optim.AdamW(net.parameters(), lr=0.1)
        net(torch.as_tensor(state_D)[None], torch.as_tensor(cases_CE)[None]).sum().backward()
        optimizer.step()
    elif change == "no_grad":
        with torch.no_grad():
            net.case_in.weight.mul_(1.5)
    elif change == "load_state_dict":
        net.load_state_dict(_net(config, seed=12).state_dict())
    elif change == "reset":
        net.reset_parameters(torch.Generator().manual_seed(5))
    elif change == "relation":
        if not net.relation:
            pytest.skip("no relation term")
        with torch.no_grad():
            net.relation_case.weight.add_(0.5)
    else:  # a write the version counters cannot see
        net.case_in.weight.data.mul_(1.5)
        net.invalidate_case_cache()
    after_C = net.numpy_scores(state_D, cases_CE, positions_C)
    assert not np.allclose(after_C, before_C)
    np.testing.assert_allclose(after_C, _uncached(net, state_D, cases_CE), rtol=1e-5, atol=1e-5)


def test_a_moved_network_and_its_copy_start_afresh() -> None:
    config = CONFIGS[0]
    net = _net(config)
    state_D, cases_CE, positions_C = _warm(net, config)
    twin = copy.deepcopy(net)  # the learner's target network
    assert len(twin.case_cache) == 0 and twin.case_cache.max_bytes == net.case_cache.max_bytes
    np.testing.assert_array_equal(twin.numpy_scores(state_D, cases_CE, positions_C),
                                  net.numpy_scores(state_D, cases_CE, positions_C))
    key = net._case_key()
    net.double().float()
    assert net._case_key() != key
    np.testing.assert_allclose(net.numpy_scores(state_D, cases_CE, positions_C), _uncached(net, state_D, cases_CE),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("config", [CONFIGS[0], CONFIGS[4]], ids=[IDS[0], IDS[4]])
def test_a_position_whose_vector_changed_is_scored_afresh(config: QNetConfig) -> None:
    """A bank truncated on resume and refilled gives old positions new cases; a case's answer vector may change."""
    net = _net(config)
    state_D, cases_CE, positions_C = _warm(net, config)
    other_CE = _bank(config, seed=9)[:C]
    _check(net, state_D, other_CE, positions_C)
    assert net.case_cache.hits == 0
    if config.features == "case":  # only the answer embedding changes: still a miss
        changed_CE = cases_CE.copy()
        changed_CE[:, D:2 * D] = other_CE[:, D:2 * D]
        misses = net.case_cache.misses
        _check(net, state_D, changed_CE, positions_C)
        assert net.case_cache.misses >= misses + C
        usage_CE = changed_CE.copy()  # usage statistics change every step: not part of the cached half
        usage_CE[:, 2 * D:] += 1.0
        hits = net.case_cache.hits
        _check(net, state_D, usage_CE, positions_C)
        assert net.case_cache.hits >= hits + C


def test_the_cache_stays_within_its_bytes() -> None:
    config = QNetConfig(arch="mlp", dim=D, hidden=64, seed=1, case_cache_mib=1)
    net = _net(config)
    limit = 2**20
    assert net.case_cache.slots_max == limit // (4 * 64 + 16)
    rng = np.random.default_rng(4)
    bank_NE = _bank(config, n=500)
    for _ in range(40):
        rows_C = rng.choice(500, size=C, replace=False)
        positions_C = rows_C * 2003 + 1_000_000  # large, spread positions share slots
        _check(net, _unit(rng.standard_normal(D)), bank_NE[rows_C], positions_C)
    assert 0 < net.case_cache.nbytes <= limit


def test_no_cache_and_cache_give_the_same_scores() -> None:
    config = CONFIGS[3]
    off = _net(QNetConfig(**{**config.__dict__, "case_cache_mib": 0}))
    on = _net(config)
    assert not off.case_cache.enabled and on.case_cache.enabled
    bank_NE = _bank(config)
    positions_C = np.arange(C)
    state_D = _unit(np.random.default_rng(6).standard_normal(D))
    for _ in range(2):
        np.testing.assert_allclose(off.numpy_scores(state_D, bank_NE[:C], positions_C),
                                   on.numpy_scores(state_D, bank_NE[:C], positions_C), rtol=1e-6, atol=1e-6)
    assert len(off.case_cache) == 0 and off.case_cache.nbytes == 0


def test_the_table_alone() -> None:
    cache = CaseHalfCache(2**16, width=3, in_width=2)
    calls: list[int] = []

    def compute(x_MF: np.ndarray) -> np.ndarray:
        calls.append(len(x_MF))
        return np.repeat(x_MF.sum(axis=1, keepdims=True), 3, axis=1)

    x_CF = np.arange(8, dtype=np.float32).reshape(4, 2)
    first = cache.rows("k1", np.array([3, 5, 7, 9]), x_CF, compute)
    again = cache.rows("k1", np.array([9, 7, 5, 3]), x_CF[::-1].copy(), compute)
    np.testing.assert_array_equal(again, first[::-1])
    assert calls == [4]
    cache.rows("k2", np.array([3, 5, 7, 9]), x_CF, compute)  # other weights: all recomputed
    assert calls == [4, 4]
    cache.clear()
    assert len(cache) == 0 and cache.nbytes == 0


def test_positions_of_one_set_do_not_evict_each_other() -> None:
    """Four positions that a direct-mapped table of 1,024 slots would put in one slot (``p % 1024``) all stay."""
    from memento.learn.qnet import CaseHalfCache

    width, in_width = 8, 4
    cache = CaseHalfCache(1024 * (4 * width + 16), width, in_width)
    rng = np.random.default_rng(0)
    x_CF = rng.standard_normal((5, in_width)).astype(np.float32)
    calls = []

    def compute(x: np.ndarray) -> np.ndarray:
        calls.append(len(x))
        return np.repeat(x.sum(axis=1, keepdims=True), width, axis=1).astype(np.float32)

    same_set = np.array([3, 3 + 1024, 3 + 2048, 3 + 3072])  # 1,024 slots in 256 sets of 4: one set
    cache.rows("k", same_set, x_CF[:4], compute)
    assert cache.misses == 4
    out = cache.rows("k", same_set, x_CF[:4], compute)
    assert cache.hits == 4 and cache.misses == 4
    np.testing.assert_allclose(out[:, 0], x_CF[:4].sum(axis=1), rtol=1e-6)
    cache.rows("k", np.array([3 + 4096]), x_CF[4:5], compute)  # a fifth of the set replaces its oldest slot
    cache.rows("k", same_set[1:], x_CF[1:4], compute)
    assert cache.hits == 7 and cache.misses == 5
