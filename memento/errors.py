"""The error hierarchy of memento.

Every error a user can cause by passing bad input is one of these, carries the
evidence in its message (file and line, both shapes, the offending value), and
is meant to be shown as a single line. The CLI turns any ``MementoError`` into
that line and exit code 2.
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "BankError",
    "CheckpointError",
    "ConfigError",
    "DataFormatError",
    "DimensionError",
    "EncoderError",
    "GameError",
    "MementoError",
    "NotABankError",
    "ProvenanceError",
    "ReplyFormatError",
    "UnknownCaseError",
    "UnknownSelectionError",
    "WorkerError",
]


class MementoError(Exception):
    """Base class of every error raised on purpose by memento."""


class ConfigError(MementoError, ValueError):
    """A configuration field has an invalid value (the message names field and value)."""


class DataFormatError(MementoError, ValueError):
    """Input data is malformed: bad JSON, a missing or mistyped field, empty text, NaN.

    When the data came from a file, ``path`` and ``line`` (1-based) locate it and
    the message reads ``path:line: reason``.
    """

    def __init__(self, reason: str, *, path: str | Path | None = None, line: int | None = None):
        self.reason = reason
        self.path = None if path is None else str(path)
        self.line = line
        if self.path is not None and line is not None:
            message = f"{self.path}:{line}: {reason}"
        elif self.path is not None:
            message = f"{self.path}: {reason}"
        else:
            message = reason
        super().__init__(message)


class DimensionError(MementoError, ValueError):
    """Arrays or components disagree in shape (the message names both shapes)."""


class EncoderError(MementoError):
    """A text encoder cannot be loaded or used."""


class CheckpointError(MementoError):
    """A checkpoint or saved artifact is missing, incomplete or inconsistent."""


class GameError(MementoError):
    """A text game cannot be loaded or played: a missing or corrupt game file, a command that is not
    admissible (under ``not_admissible="error"``), a step after the episode ended."""


class ReplyFormatError(DataFormatError):
    """An LLM reply that a memory builder cannot read as the structure its template asks for (after the
    documented tolerant parsing); the builder's documented fallback decides what happens next."""


class ProvenanceError(DataFormatError):
    """An item's provenance links are broken: a link to a case the bank does not hold, or a cycle."""


class WorkerError(MementoError):
    """A rollout worker (``memento online --workers N``) could not be started or kept running."""


class BankError(MementoError):
    """A case bank cannot be created, opened or written."""


class NotABankError(BankError, FileNotFoundError):
    """A path that should hold a case bank does not."""


class UnknownCaseError(BankError, KeyError):
    """A case id that the bank does not hold."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class UnknownSelectionError(MementoError, KeyError):
    """A selection id that a Selector does not hold: never issued, already given feedback, or expired."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""
