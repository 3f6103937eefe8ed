"""The shipped selector (memento.selector.shipped):
built from the packaged pre-trained Q-network and the facts-real seed
cases with the bundled encoder, verified, loaded and selecting by text."""

from __future__ import annotations

from pathlib import Path

import pytest

import memento
from memento.errors import ConfigError
from memento.selector.shipped import shipped_selector

pytestmark = pytest.mark.slow


def test_shipped_selector_builds_loads_and_selects_by_text(tmp_path: Path) -> None:
    path = shipped_selector("facts-real", tmp_path / "facts-real")
    assert memento.selector.export.verify(path)["cases"] == 312
    assert shipped_selector("facts-real", path) == path  # reused, not rebuilt
    with memento.load_selector(path) as selector:
        result = selector.select("What is the capital of Peru?", k=4)
        assert len(result) == 4 and all(c.reward > 0 for c in result.cases)  # positive-only, as the demo
        assert selector.config.qnet.features == "case"
    with pytest.raises(ConfigError, match="no shipped selector"):
        shipped_selector("nope", tmp_path / "x")
