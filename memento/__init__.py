"""memento: learn which past cases a frozen LLM should see.

The core library: typed configs, the text encoder, the case bank. Importing it never
pulls in Lightning, FastAPI or LLM clients.
"""

from memento.config import BankConfig, EncoderConfig, IndexConfig
from memento.encoders import EmbeddingCache, Encoder
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
)
from memento.memory import Candidates, CaseBank
from memento.types import Case, Task

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
    "MementoError",
    "NotABankError",
    "Task",
    "UnknownCaseError",
    "__version__",
]
