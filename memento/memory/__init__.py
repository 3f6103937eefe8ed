"""The case bank: SQLite store, faiss index, and the CaseBank API over both."""

from memento.memory.bank import Candidates, CaseBank
from memento.memory.index import FaissIndex, gpu_available

__all__ = ["Candidates", "CaseBank", "FaissIndex", "gpu_available"]
