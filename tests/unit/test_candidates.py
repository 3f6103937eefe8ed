"""TwoTowerIndex: candidates by the two-tower Q-network's own scores, kept in step with the bank and the network."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from memento.candidates import TwoTowerIndex
from memento.config import QNetConfig
from memento.errors import ConfigError, DataFormatError, DimensionError
from memento.memory import Candidates, CaseBank
from memento.qnet import TwoTowerQNetwork, build_qnet
from memento.types import Case
from policies import SoftQPolicy
from tests.conftest import unit_vectors

D = 16
N = 300


def make_cases(start: int, n: int) -> list[Case]:
    return [Case(id=f"case-{i}", state=f"state {i}", action=f"action {i}", reward=float(i % 2))
            for i in range(start, start + n)]


@pytest.fixture
def bank(tmp_path, rng: np.random.Generator):
    with CaseBank.create(tmp_path / "bank", dim=D) as bank:
        bank.add(make_cases(0, N), unit_vectors(rng, N, D))
        yield bank


def two_tower(seed: int = 0, dim: int = D) -> TwoTowerQNetwork:
    qnet = build_qnet(QNetConfig(arch="two_tower", dim=dim, hidden=32, embed_dim=8, dropout=0.2, seed=seed))
    assert isinstance(qnet, TwoTowerQNetwork)
    with torch.no_grad():
        qnet.bias.fill_(0.25)  # a non-zero bias, so scores must include it
    return qnet


def all_embeddings(bank: CaseBank) -> np.ndarray:
    return bank.embeddings(bank.ids_at(np.arange(len(bank))))


def brute_force_q(qnet: TwoTowerQNetwork, state_D: np.ndarray, cases_ND: np.ndarray) -> np.ndarray:
    qnet.eval()
    with torch.no_grad():
        return qnet(torch.as_tensor(state_D)[None], torch.as_tensor(cases_ND)[None])[0].numpy()


def assert_matches_brute_force(index: TwoTowerIndex, qnet: TwoTowerQNetwork, bank: CaseBank,
                               states_BD: np.ndarray, c: int) -> None:
    cases_ND = all_embeddings(bank)
    for state_D in states_BD:
        cands = index.candidates(state_D, c)
        q_N = brute_force_q(qnet, state_D, cases_ND)
        expected = np.argsort(-q_N, kind="stable")[:c]
        np.testing.assert_array_equal(cands.positions_C, expected)
        np.testing.assert_allclose(cands.scores_C, q_N[expected], rtol=1e-5, atol=1e-5)
        assert cands.ids == bank.ids_at(expected)
        np.testing.assert_array_equal(cands.embeddings_CD, cases_ND[expected])  # the original vectors, not keys


def test_flat_candidates_are_the_top_q_cases(bank: CaseBank, rng: np.random.Generator) -> None:
    qnet = two_tower()
    qnet.train()
    index = TwoTowerIndex(bank, qnet, "Flat")
    assert qnet.training  # building keys did not leave the network in eval mode
    assert len(index) == index.n_keys == N and index.n_missing == 0 and index.embed_dim == 8
    assert_matches_brute_force(index, qnet, bank, unit_vectors(rng, 5, D), c=20)
    state_D = unit_vectors(rng, 1, D)[0]
    cands = index.candidates(state_D, 10)
    assert isinstance(cands, Candidates) and len(cands) == 10
    assert np.all(np.diff(cands.scores_C) <= 1e-6)  # best first
    # scores are the Q-values a soft-Q policy computes on the candidates (with the same, current network)
    np.testing.assert_allclose(SoftQPolicy(qnet).q_values(state_D, cands), cands.scores_C, rtol=1e-5, atol=1e-5)
    everything = index.candidates(state_D, 10 * N)  # more than the bank holds: all of it, ranked
    assert len(everything) == N and sorted(everything.positions_C.tolist()) == list(range(N))


def test_refresh_follows_a_changed_network(bank: CaseBank, rng: np.random.Generator) -> None:
    qnet = two_tower(seed=1)
    old = two_tower(seed=1)
    index = TwoTowerIndex(bank, qnet)
    states_BD = unit_vectors(rng, 4, D)
    with torch.no_grad():  # change the case tower (the keys) and the state tower
        for param in qnet.parameters():
            param.add_(torch.randn(param.shape, generator=torch.Generator().manual_seed(7)) * 0.5)
    state_D = states_BD[0]
    q_old_N = brute_force_q(old, state_D, all_embeddings(bank))
    q_new_N = brute_force_q(qnet, state_D, all_embeddings(bank))
    assert not np.array_equal(np.argsort(-q_old_N)[:20], np.argsort(-q_new_N)[:20])
    stale = index.candidates(state_D, 20)
    # stale keys: the ranking is not the new network's (queries are current, keys are not)
    assert not np.array_equal(stale.positions_C, np.argsort(-q_new_N, kind="stable")[:20])
    index.refresh()
    assert index.refreshes == 2
    assert_matches_brute_force(index, qnet, bank, states_BD, c=20)


def test_add_new_covers_appended_cases(bank: CaseBank, rng: np.random.Generator) -> None:
    qnet = two_tower(seed=2)
    index = TwoTowerIndex(bank, qnet)
    assert index.add_new() == 0
    bank.add(make_cases(N, 40), unit_vectors(rng, 40, D))
    assert index.n_missing == 40 and index.n_keys == N
    assert index.add_new() == 40
    assert index.n_missing == 0 and index.n_keys == N + 40
    assert_matches_brute_force(index, qnet, bank, unit_vectors(rng, 3, D), c=25)
    # candidates() adds keys for appended cases by itself
    bank.add(make_cases(N + 40, 10), unit_vectors(rng, 10, D))
    state_D = unit_vectors(rng, 1, D)[0]
    everything = index.candidates(state_D, 2 * N)
    assert index.n_missing == 0 and len(everything) == N + 50
    assert set(everything.ids) >= {f"case-{i}" for i in range(N + 40, N + 50)}
    assert_matches_brute_force(index, qnet, bank, unit_vectors(rng, 2, D), c=25)


def test_an_approximate_factory_finds_the_top_cases(bank: CaseBank, rng: np.random.Generator) -> None:
    qnet = two_tower(seed=3)
    hnsw = TwoTowerIndex(bank, qnet, "HNSW32,Flat")
    flat = TwoTowerIndex(bank, qnet, "Flat")
    recalls = []
    for state_D in unit_vectors(rng, 10, D):
        a, b = hnsw.candidates(state_D, 10), flat.candidates(state_D, 10)
        recalls.append(len(set(a.ids) & set(b.ids)) / 10)
        np.testing.assert_allclose(a.scores_C, brute_force_q(qnet, state_D, a.embeddings_CD), rtol=1e-5, atol=1e-5)
    assert np.mean(recalls) >= 0.9


def test_an_untrained_ivf_index_searches_exactly_until_it_has_enough_keys(bank: CaseBank,
                                                                         rng: np.random.Generator) -> None:
    qnet = two_tower(seed=4)
    index = TwoTowerIndex(bank, qnet, "IVF16,Flat")  # needs 39 * 16 = 624 keys before training
    assert_matches_brute_force(index, qnet, bank, unit_vectors(rng, 3, D), c=15)
    bank.add(make_cases(N, 400), unit_vectors(rng, 400, D))
    assert index.add_new() == 400  # now trained and filled
    cands = index.candidates(unit_vectors(rng, 1, D)[0], 15)
    assert len(cands) == 15 and cands.positions_C.max() < N + 400


def test_empty_bank(tmp_path) -> None:
    with CaseBank.create(tmp_path / "empty", dim=D) as bank:
        index = TwoTowerIndex(bank, two_tower())
        cands = index.candidates(np.ones(D, dtype=np.float32) / 4, 5)
        assert len(cands) == 0 and cands.embeddings_CD.shape == (0, D)


def test_dimension_and_input_errors_are_clear(bank: CaseBank) -> None:
    with pytest.raises(DimensionError) as error:
        TwoTowerIndex(bank, two_tower(dim=8))
    assert "(8,)" in str(error.value) and f"({D},)" in str(error.value)
    index = TwoTowerIndex(bank, two_tower())
    with pytest.raises(DimensionError) as error:
        index.candidates(np.ones(D + 1, dtype=np.float32), 5)
    assert f"({D + 1},)" in str(error.value) and f"({D},)" in str(error.value)
    with pytest.raises(DimensionError):
        index.candidates(np.ones((2, D), dtype=np.float32), 5)
    with pytest.raises(DataFormatError):
        index.candidates(np.full(D, np.nan, dtype=np.float32), 5)
    for c in (0, -1, 2.5, True):
        with pytest.raises(DataFormatError):
            index.candidates(np.ones(D, dtype=np.float32), c)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="two_tower"):
        TwoTowerIndex(bank, build_qnet(QNetConfig(arch="mlp", dim=D, hidden=8)))  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        TwoTowerIndex(bank, two_tower(), "NotAFactory")
