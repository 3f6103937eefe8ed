"""memento: learn which past cases a frozen LLM should see.

The core library: typed configs, the text encoder, the case bank, Q-networks, the policy
protocol, the replay buffer, the soft-Q learner and synthetic environments. Importing it
never pulls in Lightning, FastAPI or LLM clients. Concrete policies live in the sibling
package ``policies``.
"""

from memento.config import BankConfig, EncoderConfig, IndexConfig, LearnerConfig, QNetConfig, ReplayConfig
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
from memento.export import export_selector, load_selector
from memento.learner import SoftQLearner
from memento.loop import LoopConfig, OnlineLoop, run_comparison, run_online
from memento.memory import Candidates, CaseBank
from memento.policy import Policy
from memento.qnet import QNetwork, build_qnet
from memento.replay import ReplayBatch, ReplayBuffer, Transition
from memento.selector import SelectionResult, Selector
from memento.types import Case, Selection, Task

__version__ = "0.1.0"

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
    "LoopConfig",
    "MementoError",
    "NotABankError",
    "OnlineLoop",
    "Policy",
    "QNetConfig",
    "QNetwork",
    "ReplayBatch",
    "ReplayBuffer",
    "ReplayConfig",
    "Selection",
    "SelectionResult",
    "Selector",
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
]
