"""Q-networks: shapes per architecture, dimension errors, known-answer equivalences, seeded init."""

from __future__ import annotations

import math

import pytest
import torch

from memento.config import QNetConfig, from_dict, to_dict
from memento.errors import ConfigError, DimensionError
from memento.learn.qnet import MLPQNetwork, QNetwork, TwoTowerQNetwork, build_qnet

ARCHS = ("mlp", "mlp_interact", "two_tower")


def _inputs(b: int, c: int, d: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, d, generator=g), torch.randn(b, c, d, generator=g)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize(("b", "c"), [(1, 1), (3, 5), (4, 17)])
def test_output_shape(arch: str, b: int, c: int) -> None:
    net = build_qnet(QNetConfig(arch=arch, dim=6, hidden=8, embed_dim=4, n_layers=2))
    state_BD, cases_BCD = _inputs(b, c, 6)
    q_BC = net(state_BD, cases_BCD)
    assert q_BC.shape == (b, c)
    assert q_BC.dtype == torch.float32
    assert torch.isfinite(q_BC).all()


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize(
    ("state_shape", "cases_shape"),
    [((3, 6), (2, 5, 6)), ((3, 7), (3, 5, 7)), ((3, 6), (3, 5, 7)), ((6,), (3, 5, 6)), ((3, 6), (5, 6))],
)
def test_dimension_errors_name_both_shapes(arch: str, state_shape: tuple, cases_shape: tuple) -> None:
    net = build_qnet(QNetConfig(arch=arch, dim=6, hidden=8, embed_dim=4))
    with pytest.raises(DimensionError) as info:
        net(torch.zeros(state_shape), torch.zeros(cases_shape))
    message = str(info.value)
    assert f"state_BD.shape={state_shape}" in message
    assert f"cases_BCD.shape={cases_shape}" in message


def test_build_qnet_picks_the_class() -> None:
    assert isinstance(build_qnet(QNetConfig(dim=4)), MLPQNetwork)
    assert isinstance(build_qnet(QNetConfig(arch="mlp_interact", dim=4)), MLPQNetwork)
    assert isinstance(build_qnet(QNetConfig(arch="two_tower", dim=4)), TwoTowerQNetwork)
    assert all(isinstance(build_qnet(QNetConfig(arch=a, dim=4)), QNetwork) for a in ARCHS)


def test_mlp_equals_the_concat_formula() -> None:
    """Known answer: Memento's concat(s, c) -> Linear(2D, H) -> ReLU -> Linear(H, 1), written out by hand."""
    net = build_qnet(QNetConfig(arch="mlp", dim=5, hidden=7, dropout=0.0)).eval()
    state_BD, cases_BCD = _inputs(2, 3, 5)
    w = torch.cat([net.state_in.weight, net.case_in.weight], dim=1)  # (H, 2D)
    expected = torch.empty(2, 3)
    for i in range(2):
        for j in range(3):
            x = torch.cat([state_BD[i], cases_BCD[i, j]])
            h = torch.relu(w @ x + net.state_in.bias)
            expected[i, j] = net.out.weight[0] @ h + net.out.bias[0]
    torch.testing.assert_close(net(state_BD, cases_BCD), expected, rtol=1e-5, atol=1e-5)


def test_mlp_interact_uses_product_and_distance_features() -> None:
    net = build_qnet(QNetConfig(arch="mlp_interact", dim=4, hidden=6, dropout=0.0)).eval()
    assert net.case_in.weight.shape == (6, 12)
    state_BD, cases_BCD = _inputs(2, 3, 4)
    s, c = state_BD[1], cases_BCD[1, 2]
    x = torch.cat([s, c, s * c, (s - c).abs()])
    w = torch.cat([net.state_in.weight, net.case_in.weight], dim=1)
    h = torch.relu(w @ x + net.state_in.bias)
    expected = net.out.weight[0] @ h + net.out.bias[0]
    torch.testing.assert_close(net(state_BD, cases_BCD)[1, 2], expected, rtol=1e-5, atol=1e-5)


def test_two_tower_forward_equals_precomputed_keys_dot_queries_plus_bias() -> None:
    net = build_qnet(QNetConfig(arch="two_tower", dim=6, hidden=16, embed_dim=5, dropout=0.3)).eval()
    with torch.no_grad():
        net.bias.fill_(0.75)
    bank_ND = torch.randn(11, 6, generator=torch.Generator().manual_seed(3))
    state_BD = torch.randn(4, 6, generator=torch.Generator().manual_seed(4))
    keys_NE = net.encode_cases(bank_ND)
    queries_BE = net.encode_states(state_BD)
    assert keys_NE.shape == (11, 5) and queries_BE.shape == (4, 5)
    choice_BC = torch.tensor([[0, 1, 2], [10, 9, 8], [5, 5, 5], [3, 7, 1]])
    q_BC = net(state_BD, bank_ND[choice_BC])
    expected_BC = torch.einsum("be,bce->bc", queries_BE, keys_NE[choice_BC]) + 0.75
    torch.testing.assert_close(q_BC, expected_BC, rtol=1e-5, atol=1e-5)
    with pytest.raises(DimensionError, match=r"cases_ND.shape=\(11, 5\)"):
        net.encode_cases(torch.zeros(11, 5))
    with pytest.raises(DimensionError, match=r"state_BD.shape=\(4, 5\)"):
        net.encode_states(torch.zeros(4, 5))


def test_two_tower_bias_is_a_learnable_scalar_starting_at_zero() -> None:
    net = build_qnet(QNetConfig(arch="two_tower", dim=3, hidden=4, embed_dim=2))
    assert float(net.bias.detach()) == 0.0 and net.bias.requires_grad


@pytest.mark.parametrize("arch", ARCHS)
def test_init_is_seeded_and_leaves_the_global_rng_alone(arch: str) -> None:
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    a = build_qnet(QNetConfig(arch=arch, dim=5, hidden=8, embed_dim=3, seed=7))
    assert torch.equal(torch.random.get_rng_state(), before)
    b = build_qnet(QNetConfig(arch=arch, dim=5, hidden=8, embed_dim=3, seed=7))
    c = build_qnet(QNetConfig(arch=arch, dim=5, hidden=8, embed_dim=3, seed=8))
    d = build_qnet(QNetConfig(arch=arch, dim=5, hidden=8, embed_dim=3), generator=torch.Generator().manual_seed(7))
    for (name, pa), pb, pd in zip(a.state_dict().items(), b.state_dict().values(), d.state_dict().values()):
        assert torch.equal(pa, pb), name
        assert torch.equal(pa, pd), name
    assert not all(torch.equal(pa, pc) for pa, pc in zip(a.parameters(), c.parameters()))


def test_init_bounds_match_a_single_concat_linear() -> None:
    """Split first layer is initialised as one Linear(2D, H) would be: U(-1/sqrt(2D), 1/sqrt(2D))."""
    net = build_qnet(QNetConfig(arch="mlp", dim=32, hidden=512))
    bound = 1 / math.sqrt(64)
    for w in (net.state_in.weight, net.case_in.weight, net.state_in.bias):
        assert float(w.detach().abs().max()) <= bound
        assert float(w.detach().abs().max()) > 0.9 * bound
    assert float(net.out.weight.detach().abs().max()) <= 1 / math.sqrt(512)


@pytest.mark.parametrize("arch", ARCHS)
def test_dropout_uses_the_passed_generator_and_only_in_training(arch: str) -> None:
    net = build_qnet(QNetConfig(arch=arch, dim=6, hidden=32, embed_dim=8, dropout=0.5))
    state_BD, cases_BCD = _inputs(3, 4, 6)
    net.train()
    q1 = net(state_BD, cases_BCD, generator=torch.Generator().manual_seed(1))
    q2 = net(state_BD, cases_BCD, generator=torch.Generator().manual_seed(1))
    q3 = net(state_BD, cases_BCD, generator=torch.Generator().manual_seed(2))
    assert torch.equal(q1, q2)
    assert not torch.equal(q1, q3)
    net.eval()
    e1 = net(state_BD, cases_BCD, generator=torch.Generator().manual_seed(1))
    e2 = net(state_BD, cases_BCD)
    assert torch.equal(e1, e2)


def test_cases_are_scored_independently() -> None:
    """Scoring a case does not depend on which other cases share its row (no cross-case leakage)."""
    for arch in ARCHS:
        net = build_qnet(QNetConfig(arch=arch, dim=4, hidden=8, embed_dim=3)).eval()
        state_BD, cases_BCD = _inputs(2, 5, 4)
        full = net(state_BD, cases_BCD)
        part = net(state_BD, cases_BCD[:, 2:4])
        torch.testing.assert_close(full[:, 2:4], part)


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"arch": "gru", "dim": 4}, "QNetConfig.arch='gru'"),
        ({"dim": 0}, "QNetConfig.dim=0"),
        ({"dim": 4, "hidden": 0}, "QNetConfig.hidden=0"),
        ({"dim": 4, "n_layers": 0}, "QNetConfig.n_layers=0"),
        ({"dim": 4, "dropout": 1.0}, "QNetConfig.dropout=1.0"),
        ({"dim": 4, "dropout": -0.1}, "QNetConfig.dropout=-0.1"),
        ({"dim": 4, "embed_dim": 0}, "QNetConfig.embed_dim=0"),
        ({"dim": 4, "seed": -1}, "QNetConfig.seed=-1"),
    ],
)
def test_config_validation(kwargs: dict, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        QNetConfig(**kwargs)
    assert str(info.value).startswith(expected + ":"), str(info.value)


def test_config_round_trip() -> None:
    cfg = QNetConfig(arch="two_tower", dim=384, hidden=256, n_layers=2, dropout=0.2, embed_dim=64, seed=3)
    assert from_dict(QNetConfig, to_dict(cfg)) == cfg
    assert QNetConfig(dim=4, dropout=0).dropout == 0.0 and isinstance(QNetConfig(dim=4, dropout=0).dropout, float)


# ---------------------------------------------------------------- similarity-anchored Q


@pytest.mark.parametrize("arch", ["mlp", "mlp_interact"])
def test_a_fresh_anchored_network_ranks_exactly_like_cosine(arch: str) -> None:
    import numpy as np

    from memento.bank import Candidates
    from memento.policies import SimilarityPolicy, SoftQPolicy

    net = build_qnet(QNetConfig(arch=arch, dim=16, hidden=32, anchor="cosine", seed=3)).eval()
    rng = np.random.default_rng(0)
    for trial in range(20):
        state_D = rng.normal(size=16).astype(np.float32)
        cases_CD = rng.normal(size=(24, 16)).astype(np.float32)
        cands = Candidates(ids=[f"c{i}" for i in range(24)], positions_C=np.arange(24), scores_C=np.zeros(24),
                           embeddings_CD=cases_CD)
        soft_q = SoftQPolicy(net, alpha=0.2).select(state_D, cands, 4, rng=rng, greedy=True)
        similarity = SimilarityPolicy().select(state_D, cands, 4, rng=rng)
        assert soft_q.ids == similarity.ids, trial
        q_C = SoftQPolicy(net).q_values(state_D, cands)
        cos_C = cases_CD @ state_D / (np.linalg.norm(cases_CD, axis=1) * np.linalg.norm(state_D))
        np.testing.assert_allclose(q_C, 20.0 * cos_C, atol=1e-4)  # the residual starts at exactly zero


def test_the_anchored_residual_learns_against_similarity() -> None:
    """Two cases; the more similar one always fails, the other always succeeds: BCE moves the ranking."""
    from memento.config import LearnerConfig
    from memento.learn.learner import SoftQLearner
    from memento.learn.replay import ReplayBatch

    torch.manual_seed(0)
    net = build_qnet(QNetConfig(dim=4, hidden=16, dropout=0.0, anchor="cosine", anchor_scale=2.0))
    learner = SoftQLearner(net, LearnerConfig(gamma=0.0, lr=1e-2, weight_decay=0.0), device="cpu",
                           generator=torch.Generator().manual_seed(0))
    state_BD = torch.tensor([[1.0, 0.0, 0.0, 0.0]]).repeat(8, 1)
    near, far = torch.tensor([0.9, 0.436, 0.0, 0.0]), torch.tensor([0.6, 0.0, 0.8, 0.0])
    cases_BKD = torch.stack([near, far]).unsqueeze(0).repeat(8, 1, 1)
    before = net(state_BD[:1], cases_BKD[:1]).detach()
    assert before[0, 0] > before[0, 1]  # cosine prefers the near case
    for _ in range(300):
        for case, reward in ((near, 0.0), (far, 1.0)):
            learner.update(ReplayBatch(
                state_BD=state_BD, cases_BKD=case.view(1, 1, 4).repeat(8, 1, 1), reward_B=torch.full((8,), reward),
                propensity_BK=torch.ones(8, 1), mask_BK=torch.ones(8, 1, dtype=torch.bool),
                done_B=torch.ones(8, dtype=torch.bool), step_B=torch.zeros(8, dtype=torch.long),
                policy_version_B=torch.zeros(8, dtype=torch.long)))
    after = net(state_BD[:1], cases_BKD[:1]).detach()
    assert after[0, 1] > after[0, 0], (before, after)


def test_the_anchor_is_for_mlps_and_checked() -> None:
    with pytest.raises(ConfigError, match="anchor"):
        QNetConfig(arch="two_tower", dim=4, anchor="cosine")
    with pytest.raises(ConfigError, match="anchor"):
        QNetConfig(dim=4, anchor="bm25")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="anchor_scale"):
        QNetConfig(dim=4, anchor="cosine", anchor_scale=0.0)
    a = build_qnet(QNetConfig(dim=4, hidden=8, anchor="cosine", seed=1))
    b = build_qnet(QNetConfig(dim=4, hidden=8, anchor="cosine", seed=1))
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert {"anchor_scale", "anchor_offset"} <= set(a.state_dict())


def test_relation_term_starts_at_zero_and_can_learn_a_question_match() -> None:
    """``relation_rank``: a fresh network scores exactly as one without the term (the same initial weights, the
    bilinear term zero), and the term alone can fit a match that is a product of two question types."""
    import dataclasses as dc

    base = QNetConfig(dim=16, hidden=8, anchor="cosine", dropout=0.0)
    plain, related = build_qnet(base), build_qnet(dc.replace(base, relation_rank=4))
    gen = torch.Generator().manual_seed(0)
    state_BD = torch.nn.functional.normalize(torch.randn(3, 16, generator=gen), dim=-1)
    cases_BCD = torch.nn.functional.normalize(torch.randn(3, 5, 16, generator=gen), dim=-1)
    assert torch.equal(plain(state_BD, cases_BCD), related(state_BD, cases_BCD))
    assert related.relation_case.weight.abs().sum() == 0 and related.relation_state.weight.abs().sum() > 0
    # a type in dims 0-1 of the state must match a type in dims 2-3 of the case: cross-dimension, not s * c
    types_B, ctypes_BC = torch.randint(0, 2, (64,), generator=gen), torch.randint(0, 2, (64, 6), generator=gen)
    s_BD = torch.zeros(64, 16)
    s_BD[torch.arange(64), types_B] = 1.0
    c_BCD = torch.zeros(64, 6, 16)
    c_BCD[torch.arange(64)[:, None], torch.arange(6)[None, :], 2 + ctypes_BC] = 1.0
    target_BC = (types_B[:, None] == ctypes_BC).float()
    net = build_qnet(dc.replace(base, relation_rank=4, anchor="none", hidden=1))
    with torch.no_grad():
        net.out.weight.zero_()
    opt = torch.optim.Adam([net.relation_state.weight, net.relation_case.weight], lr=0.05)
    for _ in range(300):
        loss = torch.nn.functional.binary_cross_entropy_with_logits(net(s_BD, c_BCD), target_BC)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert ((net(s_BD, c_BCD) > 0).float() == target_BC).float().mean() > 0.95
