"""Streaming bulk import of a Case JSONL file with precomputed vectors (``memento bank import FILE --embeddings
VECS --format case``), in bounded memory.

Two passes over the file, never holding it:

1. **check** (:func:`scan_case_file`): every line parsed (orjson) and checked as :func:`memento.formats.
   read_cases_jsonl` checks it, with the same one-line errors naming the file and line (a line the fast checks
   do not accept whole is parsed again by the standard reader, which raises its error or returns the case); an
   explicit id given on two lines is refused. Nothing is kept but the count and the explicit ids.
2. **import** (:func:`import_case_file`): after the vectors were checked and the bank opened, the ids given in
   the file are checked against the bank (:meth:`memento.bank.front.BankFront.check_ids`), then the file is
   read again ``chunk`` lines at a time; each chunk becomes cases (built without checking them a second time) and
   is added with its rows of the vectors in one transaction (:meth:`~memento.bank.front.BankFront.add`: the
   de-duplication, ids, scopes and crash guarantees of every add). A kill leaves whole chunks; running the same
   import again skips the cases already stored.

The index is trained once, on a sample of all the vectors, before the first chunk
(:meth:`memento.bank.local.CaseBank.train_index`). A progress bar (tqdm, on stderr when it is a terminal)
counts the cases. Throughput and memory: docs/benchmarks.md, "Bulk import".
"""

from __future__ import annotations

import contextlib
import logging
import queue
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from memento.errors import DataFormatError, DimensionError
from memento.formats import iter_jsonl, parse_case  # the reference checks, for what the fast ones do not accept
from memento.io import loads_json
from memento.types import SCOPE_FIELDS, Case, is_id, is_text, json_value_problem

__all__ = ["CaseFileScan", "import_case_file", "scan_case_file"]

logger = logging.getLogger(__name__)

_CASE_KEYS = frozenset({"id", "state", "action", "reward", "env", "kind", "meta", *SCOPE_FIELDS})
_BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True)
class CaseFileScan:
    """What the check of a Case JSONL file found: its path, how many cases it holds, and the line of each id it
    gives (``{id: line}``)."""

    path: Path
    cases: int
    ids: dict[str, int]


def _fast(row: Any) -> Case | None:
    """The case of a row that passes every check of :func:`memento.formats.parse_case` and :class:`Case`, built
    without running them again; None when any check needs the standard path (which then raises, or builds it)."""
    if type(row) is not dict or not row.keys() <= _CASE_KEYS:
        return None
    state, action, reward = row.get("state"), row.get("action"), row.get("reward")
    if not (is_text(state) and is_text(action)):
        return None
    if type(reward) is float:
        if not 0.0 <= reward <= 1.0:
            return None
    elif type(reward) is int:
        if not 0 <= reward <= 1:
            return None
        reward = float(reward)
    else:
        return None
    env, kind = row.get("env"), row.get("kind")
    if (env is not None and not is_id(env)) or (kind is not None and not is_id(kind)):
        return None
    case_id = row.get("id")
    if type(case_id) is int:
        case_id = str(case_id)
    if case_id is not None and not is_id(case_id):
        return None
    scope = tuple(row.get(name) for name in SCOPE_FIELDS)
    if any(value is not None and not is_id(value) for value in scope):
        return None
    meta = row.get("meta")
    if meta is None:
        meta = {}
    elif type(meta) is not dict or json_value_problem(meta, finite=True) is not None:
        return None
    case = object.__new__(Case)  # every field checked above, as Case.__post_init__ checks it
    case.__dict__.update(state=state, action=action, reward=reward, id=case_id, env=env,
                         kind="case" if kind is None else kind, meta=meta, created=None, user=scope[0],
                         agent=scope[1], session=scope[2], version=1, updated=None)
    return case


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """``(line number, raw line)`` of each line that is not blank, as :func:`memento.formats.iter_jsonl` reads
    them (a BOM before the first line, CRLF ends)."""
    try:
        handle = path.open("rb")
    except OSError:
        next(iter_jsonl(path), None)  # its one-line error for a file it cannot read
        raise
    with handle:
        number = 0
        for raw in handle:
            number += 1
            if number == 1 and raw.startswith(_BOM):
                raw = raw[len(_BOM):]
            if raw.strip():
                yield number, raw


def _case(path: Path, number: int, raw: bytes) -> Case:
    """The checked case of one line; the standard reader's ``DataFormatError`` (file and line) otherwise."""
    try:
        case = _fast(orjson.loads(raw))
    except orjson.JSONDecodeError:
        case = None
    if case is not None:
        return case
    try:
        row = loads_json(raw.rstrip(b"\r\n"))
        if not isinstance(row, dict):
            raise DataFormatError(f"expected a JSON object, got {type(row).__name__}")
        return parse_case(row)
    except DataFormatError as error:
        if not raw.decode("utf-8", "replace").strip():  # a line of other Unicode whitespace: skipped as blank
            raise _Blank() from None
        raise DataFormatError(error.reason, path=path, line=number) from None


class _Blank(Exception):
    pass


def _cases(path: Path) -> Iterator[tuple[int, Case]]:
    for number, raw in _lines(path):
        try:
            yield number, _case(path, number, raw)
        except _Blank:
            continue


def scan_case_file(path: str | Path, *, progress: bool | None = None) -> CaseFileScan:
    """Pass 1: check every line of the Case JSONL ``path`` (see the module docstring); nothing is kept but the
    count and the ids given."""
    from tqdm.auto import tqdm

    path = Path(path)
    ids: dict[str, int] = {}
    n = 0
    with tqdm(desc="check", unit="case", disable=progress is False or None) as bar:
        for number, case in _cases(path):
            if case.id is not None:
                if case.id in ids:
                    raise DataFormatError(f"id {case.id!r} is used twice (first on line {ids[case.id]})", path=path,
                                          line=number)
                ids[case.id] = number
            n += 1
            if n % 65_536 == 0:
                bar.update(65_536)
        bar.update(n % 65_536)
    return CaseFileScan(path=path, cases=n, ids=ids)


def _chunks(path: Path, size: int) -> Iterator[tuple[list[int], list[Case]]]:
    numbers: list[int] = []
    cases: list[Case] = []
    for number, case in _cases(path):
        numbers.append(number)
        cases.append(case)
        if len(cases) == size:
            yield numbers, cases
            numbers, cases = [], []
    if cases:
        yield numbers, cases


def _read_ahead(chunks: Iterator[tuple[list[int], list[Case]]]) -> Iterator[list[Case]]:
    """The chunks' cases, the next chunk read by a thread while the caller stores this one (SQLite's steps,
    the fsync and faiss release the GIL); an error in the reader is raised here, in order."""
    done = object()
    ahead: queue.Queue[Any] = queue.Queue(maxsize=1)
    stop = threading.Event()

    def read() -> None:
        try:
            for _, cases in chunks:
                while not stop.is_set():
                    try:
                        ahead.put(cases, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            ahead.put(done)
        except BaseException as error:  # handed to the caller
            ahead.put(error)

    reader = threading.Thread(target=read, name="memento-import-reader", daemon=True)
    reader.start()
    try:
        while True:
            item = ahead.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        reader.join(timeout=5)


def _check_ids_against(bank: Any, scan: CaseFileScan, allow_duplicates: bool, chunk: int) -> None:
    """The ids the file gives, against the bank's (an id another stored case holds), as ``add`` would refuse
    them; before anything is written."""
    if not scan.ids or not len(bank):
        return
    for numbers, cases in _chunks(scan.path, chunk):
        given = [(number, case) for number, case in zip(numbers, cases) if case.id is not None]
        if not given:
            continue
        try:
            bank.check_ids([case for _, case in given], allow_duplicates=allow_duplicates)
        except DataFormatError as error:
            found = re.match(r"case (\d+): (.*)", error.reason, re.S)
            if found is None:
                raise DataFormatError(f"{error.reason} (bank {bank.path})", path=scan.path) from None
            raise DataFormatError(f"{found.group(2)} (bank {bank.path})", path=scan.path,
                                  line=given[int(found.group(1))][0]) from None


def import_case_file(bank: Any, scan: CaseFileScan, vectors_ND: np.ndarray, *, allow_duplicates: bool = False,
                     chunk: int = 50_000, progress: bool | None = None, where: str = "embeddings") -> int:
    """Pass 2: add the cases of the checked file ``scan`` with their rows of ``vectors_ND`` (``[cases, D]``,
    checked) to ``bank``, ``chunk`` per transaction; returns the cases added. See the module docstring. Vectors of
    another shape than ``[cases, bank.dim]`` are one ``DimensionError`` naming ``where``."""
    from tqdm.auto import tqdm

    from memento.bank.local import CaseBank
    from memento.bank.mapped import release_pages
    from memento.bank.parts import check_embedding_shape

    try:
        check_embedding_shape(np.shape(vectors_ND), scan.cases, bank.dim)
    except DimensionError as error:
        raise DimensionError(f"{where}: {error}") from None

    _check_ids_against(bank, scan, allow_duplicates, chunk)
    if isinstance(bank, CaseBank) and bank.train_index(vectors_ND):
        logger.info("%s: index trained on a sample of the %d imported vectors", bank.path, len(vectors_ND))
    before = len(bank)
    start = 0
    # SQLite's page cache for the id and content-hash indexes (random keys, ~120 bytes per case): 256 MiB up to
    # two million cases, more for larger banks (at 10M cases the indexes outgrow 256 MiB and every insert misses)
    cache_mib = min(2048, max(256, (before + scan.cases) * 128 >> 20))
    bulk = bank.bulk(cache_mib) if isinstance(bank, CaseBank) else contextlib.nullcontext()
    with bulk, tqdm(total=scan.cases, desc="import", unit="case", disable=progress is False or None) as bar:
        for cases in _read_ahead(_chunks(scan.path, chunk)):
            stop = start + len(cases)
            bank.add(cases, np.asarray(vectors_ND[start:stop], dtype=np.float32), allow_duplicates=allow_duplicates)
            release_pages(vectors_ND)
            bar.update(stop - start)
            start = stop
    if start != scan.cases:  # the file changed between the passes
        raise DataFormatError(f"holds {start} case(s) now, {scan.cases} when it was checked (changed during the "
                              "import)", path=scan.path)
    return len(bank) - before
