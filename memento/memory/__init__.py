"""The case bank: the Bank protocol, the directory bank (SQLite store + faiss index), the Milvus bank, and the
bank URIs that name either (``DIR`` or ``milvus:URI[#collection]``)."""

from memento.memory.bank import Candidates, CaseBank
from memento.memory.index import FaissIndex, gpu_available
from memento.memory.milvus import MilvusBank, MilvusOptions
from memento.memory.protocol import Bank
from memento.memory.uri import BankLocation, bank_exists, copy_bank, create_bank, open_bank, parse_bank_uri

__all__ = ["Bank", "BankLocation", "Candidates", "CaseBank", "FaissIndex", "MilvusBank", "MilvusOptions",
           "bank_exists", "copy_bank", "create_bank", "gpu_available", "open_bank", "parse_bank_uri"]
