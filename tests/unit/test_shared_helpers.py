"""The helpers every module shares: shortened values, finite numbers, the extras check, JSON text, integer ranges."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from memento.config import check_count
from memento.errors import ConfigError, DataFormatError
from memento.extras import require
from memento.io import loads_json, parse_json
from memento.types import Case, finite_float, shown


@pytest.mark.parametrize("limit", [20, 40, 80, 120])
def test_shown_is_one_line_within_its_limit(limit: int) -> None:
    for value in ("x" * 10_000, list(range(1000)), np.zeros((50, 50)), {"a\nb": "c" * 500}):
        text = shown(value, limit)
        assert len(text) <= limit and "\n" not in text, text
    assert shown("x" * 10_000).endswith("' (10002 chars)") and shown("short") == "'short'"


def test_shown_describes_large_integers_by_their_digits() -> None:
    assert shown(10 ** 400) == "an integer of 401 digits" and shown(-(10 ** 30), 20) == "an integer of 31 digits"
    assert shown(10 ** 5000) == "an integer of about 5001 digits" and shown(12345) == "12345"


def test_finite_float_takes_real_numbers_but_bools() -> None:
    assert finite_float(np.float32(0.5)) == 0.5 and finite_float(np.int64(3)) == 3.0
    assert finite_float(np.bool_(True)) is None and finite_float(np.float64("inf")) is None


def test_case_created_past_float_range_is_a_data_format_error() -> None:
    with pytest.raises(DataFormatError, match="Case.created must be a finite number .* an integer of 401 digits"):
        Case(id="a", state="s", action="a", reward=1.0, created=10 ** 400)


def test_a_missing_extra_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    with pytest.raises(ConfigError) as info:
        require("train", "tensorboard", what="writing TensorBoard event files", instead="pass --no-tensorboard")
    assert str(info.value) == ("writing TensorBoard event files needs the 'train' extra (tensorboard is not "
                               "installed): pass --no-tensorboard, or pip install -e '.[train]' (in a clone of "
                               "memento)")
    require("train", "json", what="a module that is there")  # found: nothing raised


def test_loads_json_keeps_the_line_and_walks_what_may_be_refused() -> None:
    with pytest.raises(DataFormatError) as info:
        loads_json('{"a": 1,\n "b": }')
    assert info.value.line == 2 and info.value.reason.startswith("invalid JSON: Expecting value")
    for text in ('["\\ud800"]', '["\ud800"]', "[" * 150 + "]" * 150):
        with pytest.raises(DataFormatError):
            loads_json(text)
    assert loads_json(b'{"caf\xc3\xa9": [1, 2]}') == {"café": [1, 2]}
    with pytest.raises(ConfigError, match=r"^f.json: a string holds a lone surrogate"):
        parse_json('{"a": "\\udc00"}', where="f.json", error=ConfigError)


def test_check_count_names_what_it_checks() -> None:
    check_count("--workers", 4, 1, 8)
    with pytest.raises(ConfigError, match=r"^--workers=an integer of 401 digits: must be an integer in 1\.\.8$"):
        check_count("--workers", 10 ** 400, 1, 8)
    with pytest.raises(ConfigError, match=r"^X\.k=True: must be an integer >= 1$"):
        check_count("X.k", True, 1)
