"""EncoderConfig / IndexConfig / BankConfig: validation, dict round trip, JSON files."""

from __future__ import annotations

import dataclasses
import json

import pytest

from memento.config import BankConfig, EncoderConfig, IndexConfig, from_dict, load_json, save_json, to_dict
from memento.errors import ConfigError, MementoError

# ---------------------------------------------------------------- defaults and validation


def test_defaults() -> None:
    enc = EncoderConfig()
    assert (enc.model, enc.pooling, enc.max_length, enc.batch_size, enc.normalize) == (None, "avg", 256, 64, True)
    idx = IndexConfig()
    assert (idx.factory, idx.ef_search, idx.nprobe) == ("Flat", 128, 32)
    bank = BankConfig(dim=8)
    assert bank.index == IndexConfig()
    assert bank.encoder is None


def test_configs_are_frozen_and_keyword_only() -> None:
    cfg = IndexConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.factory = "HNSW32,Flat"  # type: ignore[misc]
    with pytest.raises(TypeError):
        IndexConfig("Flat")  # type: ignore[misc]


def test_config_error_is_a_memento_value_error() -> None:
    assert issubclass(ConfigError, MementoError)
    assert issubclass(ConfigError, ValueError)


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda: EncoderConfig(pooling="max"), "EncoderConfig.pooling='max'"),  # type: ignore[arg-type]
        (lambda: EncoderConfig(max_length=7), "EncoderConfig.max_length=7"),
        (lambda: EncoderConfig(batch_size=0), "EncoderConfig.batch_size=0"),
        (lambda: EncoderConfig(model=""), "EncoderConfig.model=''"),
        (lambda: EncoderConfig(model="   "), "EncoderConfig.model='   '"),
        (lambda: IndexConfig(factory=""), "IndexConfig.factory=''"),
        (lambda: IndexConfig(factory="  "), "IndexConfig.factory='  '"),
        (lambda: IndexConfig(ef_search=0), "IndexConfig.ef_search=0"),
        (lambda: IndexConfig(nprobe=-3), "IndexConfig.nprobe=-3"),
        (lambda: BankConfig(dim=0), "BankConfig.dim=0"),
        (lambda: BankConfig(dim=-4), "BankConfig.dim=-4"),
        (lambda: BankConfig(dim=3.0), "BankConfig.dim=3.0"),  # type: ignore[arg-type]
        (lambda: BankConfig(dim="16"), "BankConfig.dim='16'"),  # type: ignore[arg-type]
    ],
)
def test_invalid_field_names_field_and_value(make, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        make()
    assert str(info.value).startswith(expected + ":"), str(info.value)


def test_pooling_error_lists_choices() -> None:
    with pytest.raises(ConfigError, match=r"must be one of \('avg', 'cls', 'cls_before_pooler'\)"):
        EncoderConfig(pooling="mean")  # type: ignore[arg-type]


def test_boundary_values_are_accepted() -> None:
    assert EncoderConfig(max_length=8, batch_size=1).max_length == 8
    assert IndexConfig(ef_search=1, nprobe=1).nprobe == 1
    assert BankConfig(dim=1).dim == 1
    for pooling in ("avg", "cls", "cls_before_pooler"):
        assert EncoderConfig(pooling=pooling).pooling == pooling  # type: ignore[arg-type]


def test_direct_bankconfig_rejects_bool_dim() -> None:
    with pytest.raises(ConfigError, match=r"BankConfig\.dim=True"):
        BankConfig(dim=True)  # type: ignore[arg-type]


def test_direct_encoderconfig_rejects_str_max_length() -> None:
    with pytest.raises(ConfigError, match=r"EncoderConfig\.max_length='256'"):
        EncoderConfig(max_length="256")  # type: ignore[arg-type]


# ---------------------------------------------------------------- to_dict / from_dict


def test_to_dict_is_plain_and_nested() -> None:
    cfg = BankConfig(dim=384, index=IndexConfig(factory="HNSW32,Flat", ef_search=64),
                     encoder=EncoderConfig(model="/models/simcse", pooling="cls", max_length=128))
    data = to_dict(cfg)
    assert data == {
        "dim": 384,
        "index": {"factory": "HNSW32,Flat", "ef_search": 64, "nprobe": 32, "refine": 1},
        "encoder": {"model": "/models/simcse", "pooling": "cls", "max_length": 128, "batch_size": 64,
                    "normalize": True},
        "vectors": "ram",
    }
    assert json.loads(json.dumps(data)) == data


@pytest.mark.parametrize(
    "cfg",
    [
        EncoderConfig(),
        EncoderConfig(model="/x/y", pooling="cls_before_pooler", max_length=32, batch_size=3, normalize=False),
        IndexConfig(factory="IVF16,Flat", ef_search=5, nprobe=2),
        BankConfig(dim=7),
        BankConfig(dim=384, index=IndexConfig(factory="HNSW32,Flat"), encoder=EncoderConfig(pooling="cls")),
    ],
)
def test_round_trip(cfg) -> None:
    back = from_dict(type(cfg), to_dict(cfg))
    assert back == cfg
    assert type(back) is type(cfg)
    # through real JSON text too
    assert from_dict(type(cfg), json.loads(json.dumps(to_dict(cfg)))) == cfg


def test_from_dict_builds_nested_dataclasses() -> None:
    cfg = from_dict(BankConfig, {"dim": 4, "index": {"factory": "HNSW32,Flat"}, "encoder": {"pooling": "cls"}})
    assert isinstance(cfg.index, IndexConfig)
    assert cfg.index == IndexConfig(factory="HNSW32,Flat")
    assert isinstance(cfg.encoder, EncoderConfig)
    assert cfg.encoder.pooling == "cls"
    assert from_dict(BankConfig, {"dim": 4, "encoder": None}).encoder is None


def test_from_dict_partial_uses_defaults() -> None:
    assert from_dict(IndexConfig, {}) == IndexConfig()
    assert from_dict(EncoderConfig, {"batch_size": 2}) == EncoderConfig(batch_size=2)


def test_to_dict_rejects_non_dataclass() -> None:
    with pytest.raises(TypeError, match="dataclass instance"):
        to_dict({"dim": 3})
    with pytest.raises(TypeError, match="dataclass instance"):
        to_dict(BankConfig)


def test_unknown_key_rejected() -> None:
    with pytest.raises(ConfigError) as info:
        from_dict(IndexConfig, {"factory": "Flat", "nprob": 4})
    message = str(info.value)
    assert message.startswith("IndexConfig: unknown field(s) ['nprob']")
    assert "known: ['ef_search', 'factory', 'nprobe', 'refine']" in message


def test_unknown_nested_key_names_the_path() -> None:
    with pytest.raises(ConfigError, match=r"^BankConfig\.index: unknown field\(s\) \['typo'\]"):
        from_dict(BankConfig, {"dim": 4, "index": {"typo": 1}})
    with pytest.raises(ConfigError, match=r"^BankConfig\.encoder: unknown field\(s\) \['pool'\]"):
        from_dict(BankConfig, {"dim": 4, "encoder": {"pool": "avg"}})


def test_missing_required_field() -> None:
    with pytest.raises(ConfigError, match=r"^BankConfig: .*dim"):
        from_dict(BankConfig, {})


@pytest.mark.parametrize(
    ("cls", "data", "expected"),
    [
        (BankConfig, {"dim": True}, "BankConfig.dim=True: expected an integer"),
        (BankConfig, {"dim": 4.0}, "BankConfig.dim=4.0: expected an integer"),
        (BankConfig, {"dim": "4"}, "BankConfig.dim='4': expected an integer"),
        (IndexConfig, {"nprobe": False}, "IndexConfig.nprobe=False: expected an integer"),
        (IndexConfig, {"factory": 3}, "IndexConfig.factory=3: expected a string"),
        (EncoderConfig, {"normalize": 1}, "EncoderConfig.normalize=1: expected true or false"),
        (EncoderConfig, {"normalize": "true"}, "EncoderConfig.normalize='true': expected true or false"),
        (EncoderConfig, {"max_length": 256.5}, "EncoderConfig.max_length=256.5: expected an integer"),
        (EncoderConfig, {"model": 5}, "EncoderConfig.model=5: expected a string"),
        (EncoderConfig, {"pooling": "max"}, "EncoderConfig.pooling='max': must be one of"),
        (BankConfig, {"dim": 4, "index": "Flat"}, "BankConfig.index='Flat': expected an object for IndexConfig"),
        (BankConfig, {"dim": 4, "index": {"ef_search": True}}, "BankConfig.index.ef_search=True: expected an integer"),
        (BankConfig, {"dim": 4, "encoder": {"pooling": "max"}}, "BankConfig.encoder.pooling='max': must be one of"),
        (BankConfig, {"dim": 4, "encoder": []}, "BankConfig.encoder=[]: expected an object for EncoderConfig"),
    ],
)
def test_wrong_types_rejected(cls, data, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        from_dict(cls, data)
    assert str(info.value).startswith(expected), str(info.value)


def test_from_dict_runs_post_init_checks() -> None:
    with pytest.raises(ConfigError, match=r"^IndexConfig\.nprobe=0: must be an integer in 1\.\.1048576"):
        from_dict(BankConfig, {"dim": 4, "index": {"nprobe": 0}})
    with pytest.raises(ConfigError, match=r"^BankConfig\.dim=0"):
        from_dict(BankConfig, {"dim": 0})


def test_from_dict_rejects_non_object() -> None:
    with pytest.raises(ConfigError, match=r"^BankConfig: expected an object, got list"):
        from_dict(BankConfig, [1, 2])  # type: ignore[arg-type]


# ---------------------------------------------------------------- save_json / load_json


def test_save_load_round_trip(tmp_path) -> None:
    cfg = BankConfig(dim=12, index=IndexConfig(factory="HNSW32,Flat", ef_search=16),
                     encoder=EncoderConfig(model="/m", pooling="cls_before_pooler", normalize=False))
    path = tmp_path / "bank.json"
    save_json(cfg, path)
    assert load_json(BankConfig, path) == cfg
    assert json.loads(path.read_text(encoding="utf-8")) == to_dict(cfg)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bank.json"]  # no temporary file left


def test_save_json_replaces_existing_file(tmp_path) -> None:
    path = tmp_path / "index.json"
    save_json(IndexConfig(factory="Flat"), path)
    save_json(IndexConfig(factory="IVF8,Flat", nprobe=3), str(path))
    assert load_json(IndexConfig, str(path)) == IndexConfig(factory="IVF8,Flat", nprobe=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index.json"]


def test_save_json_is_sorted_and_indented(tmp_path) -> None:
    path = tmp_path / "c.json"
    save_json(IndexConfig(), path)
    text = path.read_text(encoding="utf-8")
    assert text == '{\n  "ef_search": 128,\n  "factory": "Flat",\n  "nprobe": 32,\n  "refine": 1\n}\n'


def test_load_json_missing_file(tmp_path) -> None:
    path = tmp_path / "nope.json"
    with pytest.raises(ConfigError) as info:
        load_json(BankConfig, path)
    assert str(info.value) == f"{path}: config file not found"


def test_load_json_invalid_json_names_line(tmp_path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{\n  "dim": 4,\n  "index": {,\n}\n', encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_json(BankConfig, path)
    assert str(info.value).startswith(f"{path}:3: invalid JSON: ")


def test_load_json_validates_content(tmp_path) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"dim": 4, "extra": 1}), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"unknown field\(s\) \['extra'\]"):
        load_json(BankConfig, path)
    path.write_text(json.dumps({"dim": True}), encoding="utf-8")
    with pytest.raises(ConfigError, match="expected an integer"):
        load_json(BankConfig, path)


def test_load_json_non_utf8_is_config_error(tmp_path) -> None:
    path = tmp_path / "latin1.json"
    path.write_bytes(b'{"factory": "caf\xe9"}')
    with pytest.raises(ConfigError):
        load_json(IndexConfig, path)
