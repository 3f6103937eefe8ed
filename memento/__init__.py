"""memento: learn which past cases a frozen LLM should see.

The library in layers (CONTRIBUTING.md, tests/unit/test_layers.py): the base (typed configs, the text encoder, the
case bank, Q-networks, the policy protocol, the replay buffer, the soft-Q learner, synthetic environments), the
policies on it (``memento.policies``: one module per policy, config and defaults beside the class, and one registry;
the soft-Q agent :class:`SoftQAgent` is one), and what composes policies into runs (``memento.runs``, the served
:class:`Selector`). Importing ``memento`` loads the base only and never pulls in Lightning, FastAPI or LLM clients; a
name of a higher layer (a policy config, :class:`SoftQAgent`, :func:`run_online`, :class:`Selector`, ...) is imported
on first use.

A trained selector ships with the package (the ``facts-real`` suite's pre-trained Q-network over its seed
cases); :func:`shipped_selector` builds it on first use and returns its path::

    import memento

    with memento.load_selector(memento.shipped_selector()) as selector:
        print(selector.select("What is the capital of Peru?", k=4).cases)
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

from memento._version import __version__
from memento.bank import Candidates, CaseBank
from memento.config import (
    BankConfig,
    EncoderConfig,
    IndexConfig,
    LearnerConfig,
    OnlineLabelsConfig,
    QNetConfig,
    ReplayConfig,
)
from memento.encoders import EmbeddingCache, Encoder
from memento.envs import SyntheticBandit, SyntheticBanditConfig
from memento.errors import (
    BankError,
    CheckpointError,
    ConfigError,
    DataFormatError,
    DimensionError,
    EncoderError,
    MementoError,
    NotABankError,
    UnknownCaseError,
    UnknownSelectionError,
)
from memento.learn.learner import SoftQLearner
from memento.learn.policy import Observation, Policy, PolicyContext
from memento.learn.qnet import QNetwork, build_qnet
from memento.learn.replay import ReplayBatch, ReplayBuffer, Transition
from memento.types import Case, Selection, Task

if TYPE_CHECKING:
    from memento.policies import LinUCBConfig, PolicyConfig, RandomConfig, SimilarityConfig, SoftQAgent, SoftQConfig
    from memento.runs.compare import run_comparison
    from memento.runs.qa import LoopConfig, OnlineLoop, run_online
    from memento.runs.rundir import RunDir
    from memento.selector.export import export_selector, load_selector
    from memento.selector.runtime import SelectionResult, Selector
    from memento.selector.shipped import shipped_selector

_LAZY = {
    **dict.fromkeys(("LinUCBConfig", "PolicyConfig", "RandomConfig", "SimilarityConfig", "SoftQAgent", "SoftQConfig"),
                    "memento.policies"),
    "run_comparison": "memento.runs.compare",
    **dict.fromkeys(("LoopConfig", "OnlineLoop", "run_online"), "memento.runs.qa"),
    "RunDir": "memento.runs.rundir",
    **dict.fromkeys(("export_selector", "load_selector"), "memento.selector.export"),
    **dict.fromkeys(("SelectionResult", "Selector"), "memento.selector.runtime"),
    "shipped_selector": "memento.selector.shipped",
}
"""The exported names of the layers above the base (the policies, the runs, the selector) and their modules:
imported on first use, so that importing the base never loads the policies (tests/unit/test_layers.py)."""


def __getattr__(name: str) -> Any:
    """A name of :data:`_LAZY` from its module, or a submodule of ``memento`` (``memento.runs`` after ``import
    memento``), imported on first use."""
    module = _LAZY.get(name)
    if module is not None:
        return getattr(importlib.import_module(module), name)
    if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "BankConfig",
    "BankError",
    "Candidates",
    "Case",
    "CaseBank",
    "CheckpointError",
    "ConfigError",
    "DataFormatError",
    "DimensionError",
    "EmbeddingCache",
    "Encoder",
    "EncoderConfig",
    "EncoderError",
    "IndexConfig",
    "LearnerConfig",
    "LinUCBConfig",
    "LoopConfig",
    "MementoError",
    "NotABankError",
    "Observation",
    "OnlineLabelsConfig",
    "OnlineLoop",
    "Policy",
    "PolicyConfig",
    "PolicyContext",
    "QNetConfig",
    "QNetwork",
    "RandomConfig",
    "ReplayBatch",
    "ReplayBuffer",
    "ReplayConfig",
    "RunDir",
    "Selection",
    "SelectionResult",
    "Selector",
    "SimilarityConfig",
    "SoftQAgent",
    "SoftQConfig",
    "SoftQLearner",
    "SyntheticBandit",
    "SyntheticBanditConfig",
    "Task",
    "Transition",
    "UnknownCaseError",
    "UnknownSelectionError",
    "__version__",
    "build_qnet",
    "export_selector",
    "load_selector",
    "run_comparison",
    "run_online",
    "shipped_selector",
]
