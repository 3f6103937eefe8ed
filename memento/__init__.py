"""memento: learn which past cases a frozen LLM should see.

The core library: typed configs, the text encoder, the case bank, Q-networks, the policy
protocol, the replay buffer, the soft-Q learner and synthetic environments. Importing it
never pulls in Lightning, FastAPI or LLM clients. Concrete policies live in the sibling
package ``policies`` (which depends on this one, never the other way round): runs that choose a
policy take the factory ``memento.policies.make_policy`` as an argument. The soft-Q agent
(:class:`SoftQAgent`) lives here, because a served :class:`Selector` is one.

A trained selector ships with the package (the ``facts-real`` suite's pre-trained Q-network over its seed
cases); :func:`shipped_selector` builds it on first use and returns its path::

    import memento

    with memento.load_selector(memento.shipped_selector()) as selector:
        print(selector.select("What is the capital of Peru?", k=4).cases)
"""

from memento._version import __version__
from memento.bank import Candidates, CaseBank
from memento.config import (
    BankConfig,
    EncoderConfig,
    IndexConfig,
    LearnerConfig,
    LinUCBConfig,
    OnlineLabelsConfig,
    PolicyConfig,
    QNetConfig,
    RandomConfig,
    ReplayConfig,
    SimilarityConfig,
    SoftQConfig,
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
from memento.learn.agent import SoftQAgent
from memento.learn.learner import SoftQLearner
from memento.learn.policy import Observation, Policy, PolicyContext
from memento.learn.qnet import QNetwork, build_qnet
from memento.learn.replay import ReplayBatch, ReplayBuffer, Transition
from memento.runs.compare import run_comparison
from memento.runs.qa import LoopConfig, OnlineLoop, run_online
from memento.runs.rundir import RunDir
from memento.selector.export import export_selector, load_selector
from memento.selector.runtime import SelectionResult, Selector
from memento.selector.shipped import shipped_selector
from memento.types import Case, Selection, Task

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
