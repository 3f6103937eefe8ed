"""The case bank: the Bank protocol, the bank front written once (:mod:`memento.bank.front`) and its two
backends, the directory bank (SQLite rows + faiss index) and the Milvus bank (one collection, plus side
collections for the case features), and the bank URIs that name either (``DIR`` or ``milvus:URI[#collection]``).

Modules: ``protocol`` (the operations, documented once), ``front`` (reads, searches, usage, lifetime) over
``edits`` (the writes) and ``parts`` (the part protocols and shared checks); the directory bank in ``local`` over
``sqliterows`` and ``faissvectors`` (``index``, ``vectorfile``); the Milvus bank in ``milvus`` over ``milvusconn``,
``milvusrows``, ``milvusindex`` and ``milvusfeatures``; ``uri``, ``where``, ``history``, ``bulk``, ``ingest``,
``mapped`` and ``bankfile`` beside them."""

from memento.bank.front import Candidates
from memento.bank.history import CaseEvent
from memento.bank.index import FaissIndex, gpu_available
from memento.bank.local import CaseBank
from memento.bank.milvus import MilvusBank, MilvusOptions
from memento.bank.protocol import Bank
from memento.bank.uri import BankLocation, bank_exists, copy_bank, create_bank, open_bank, parse_bank_uri

__all__ = ["Bank", "BankLocation", "Candidates", "CaseBank", "CaseEvent", "FaissIndex", "MilvusBank", "MilvusOptions",
           "bank_exists", "copy_bank", "create_bank", "gpu_available", "open_bank", "parse_bank_uri"]
