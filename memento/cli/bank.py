"""``memento bank``: create, fill, search, copy and inspect case banks."""

from __future__ import annotations

import argparse
import dataclasses
import json
import textwrap
from pathlib import Path
from typing import Any

from memento.bank import bank_exists, copy_bank, create_bank, open_bank, parse_bank_uri
from memento.bank.bulk import DEFAULT_CHUNK
from memento.bank.where import as_scope, parse_filter
from memento.cli.options import (
    BANK,
    EXIT_OK,
    add_bank_option,
    add_command,
    add_connect_timeout,
    add_encoder_options,
    add_json_flag,
    bank_options,
    check_index_flag,
    encoder_config,
    index_factory,
    load_encoder,
)
from memento.config import (
    MAX_CANDIDATES,
    MAX_DIM,
    BankConfig,
    IndexConfig,
    check_bools,
    check_choice,
    field_default,
)
from memento.errors import BankError, ConfigError, DataFormatError, DimensionError, EncoderError
from memento.flags import HIDDEN, check_count, config_option, config_options, config_switch, given_fields
from memento.formats import CaseFormat, read_case_file
from memento.io import loads_json, parse_json
from memento.types import SCOPE_FIELDS

MAX_CHUNK = 10_000_000
"""``bank import --chunk``: the most cases one transaction adds."""

CASE_FORMAT_HELP = """\
case               Case JSONL {"id", "state", "action", "reward", "env"?, "kind"?, "meta"?,
                   "user"?, "agent"?, "session"?}
memento-memory     Memento case memory {"case", "plan", "case_label": positive|negative}
memento-np-memory  Memento non-parametric memory {"question", "plan", "reward": 0|1}
memento-training   Memento retriever pairs {"query", "case", "case_label", "plan", "truth_label"}
                   (imports the unique cases they mention)"""

_DESCRIPTION = ("A case bank is a directory: cases.sqlite (cases + embeddings) and index.faiss beside it (with "
                "--vectors disk, the embeddings are stored once, in vectors.f32, checked by block); or a Milvus "
                "collection (the 'milvus' extra): --bank milvus:FILE.db is Milvus Lite in a local file, --bank "
                "milvus:http://host:19530 a server, each with an optional #collection (default memento_cases).")

_IMPORT_DESCRIPTION = ("Read a case file, encode the states and add every case in one transaction.\n"
                       "The whole file is checked first: a bad line prints FILE:LINE: reason, exits 2,\n"
                       "and leaves the bank unchanged. A missing bank is created (encoder options below).\n"
                       "An import that is killed or fails part-way leaves none of its cases, in a directory\n"
                       "bank (SQLite) and in a Milvus bank (rows past its committed count are removed when\n"
                       "it is next opened); run it again to add them all.\n\n"
                       "With --embeddings VECS (precomputed vectors, checked whole first) no encoder runs;\n"
                       "an index that needs training is trained once on a sample of all the vectors, then\n"
                       "the cases are added --chunk per transaction: a killed import leaves whole chunks,\n"
                       "and running it again skips the cases already stored and adds the rest.\n\n"
                       "formats:\n" + CASE_FORMAT_HELP)


@dataclasses.dataclass(frozen=True)
class ImportConfig:
    """What ``bank import`` reads and how it adds the cases (its flags are these fields; the bank and the encoder
    are the other options')."""

    format: CaseFormat = dataclasses.field(default="case", metadata={"help": "input format"})
    allow_duplicates: bool = dataclasses.field(default=False, metadata={
        "help": "store cases whose content is already in the bank"})
    embeddings: str | None = dataclasses.field(default=None, metadata={"help": (
        "precomputed unit-norm vectors, row i for line i: a .npy file or a .safetensors file with one [N, D] tensor "
        "(no encoder runs; a new bank records no encoder unless --encoder names one)")})
    chunk: int = dataclasses.field(default=DEFAULT_CHUNK, metadata={
        "help": "with --embeddings: cases per transaction"})

    def __post_init__(self) -> None:
        check_choice(self, "format", CaseFormat)
        check_bools(self, "allow_duplicates")
        if self.embeddings is not None:  # without vectors the cases are added in one transaction: no chunk
            check_count("--chunk", self.chunk, 1, MAX_CHUNK)


@dataclasses.dataclass(frozen=True)
class SearchConfig:
    """The query of ``bank search`` beside its text: how many cases, and which cases may be found (``None``: any)."""

    k: int = dataclasses.field(default=4, metadata={"help": f"number of cases, 1..{MAX_CANDIDATES}"})
    env: str | None = dataclasses.field(default=None, metadata={"help": "only cases of this env"})
    kind: str | None = dataclasses.field(default=None, metadata={"help": "only cases of this kind"})
    user: str | None = dataclasses.field(default=None, metadata={"help": "only cases of this user (scope)"})
    agent: str | None = dataclasses.field(default=None, metadata={"help": "only cases of this agent (scope)"})
    session: str | None = dataclasses.field(default=None, metadata={"help": "only cases of this session (scope)"})
    include_global: bool = dataclasses.field(default=False, metadata={"help": (
        "beside a scope, also the cases without any owner (a shared pool plus the scope's own)")})
    filter: str | None = dataclasses.field(default=None, metadata={"help": (
        'only cases that match, e.g. \'{"topic": "geo"}\', \'{"level": {"gte": 2}}\', '
        '\'{"topic": {"in": ["geo", "sci"]}}\', \'{"OR": [{"level": 1}, {"done": true}]}\', '
        '\'{"created": {"gte": "2024-05-01"}}\' (docs/formats.md)')})

    def __post_init__(self) -> None:
        check_bools(self, "include_global")
        for name in ("env", "kind", *SCOPE_FIELDS, "filter"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ConfigError(f"SearchConfig.{name}={value!r}: must be a string or None")

    @property
    def scope_fields(self) -> dict[str, str]:
        """The scope given (``--user``, ``--agent``, ``--session``), by field."""
        return {name: getattr(self, name) for name in SCOPE_FIELDS if getattr(self, name) is not None}


def add_parser(commands: Any) -> None:
    bank = add_command(commands, "bank", "create, fill, search, copy and inspect case banks", _DESCRIPTION, raw=False)
    actions = bank.add_subparsers(dest="bank_command", metavar="ACTION", required=True)
    create = add_command(actions, "create", "create an empty bank", raw=False,
                         description="Create an empty case bank. Its dimension comes from the encoder, or from --dim "
                                     "for a bank filled with your own vectors.")
    add_bank_option(create, "bank to create (a directory or milvus:URI)", required=True)
    config_option(create, BankConfig, "dim", "vector dimension without an encoder (then text search is unavailable)",
                  shown_default=HIDDEN)
    add_encoder_options(create.add_argument_group("encoder (used when the bank is created)"))
    add_storage_options(create)

    imp = add_command(actions, "import", "import cases from a JSONL file", _IMPORT_DESCRIPTION)
    imp.add_argument("file", metavar="FILE", help="JSONL file to import")
    add_bank_option(imp, "bank (a directory or milvus:URI; created if missing)", required=True)
    config_option(imp, ImportConfig, "format")
    config_switch(imp, ImportConfig, "allow_duplicates")
    config_option(imp, ImportConfig, "embeddings", metavar="VECS", shown_default=HIDDEN)
    config_option(imp, ImportConfig, "chunk")
    add_encoder_options(imp.add_argument_group("encoder (used when the bank is created)"))
    add_storage_options(imp)

    exp = add_command(actions, "export", "write every case as Case JSONL", raw=False)
    exp.add_argument("out", metavar="OUT", help="output JSONL file (written atomically)")
    add_bank_option(exp, BANK, required=True)

    search = add_command(actions, "search", "nearest cases to a text", raw=False,
                         description="Encode TEXT with the bank's encoder and print the k nearest cases by cosine "
                                     "similarity, among the cases of a scope (--user/--agent/--session) whose meta "
                                     "match --filter (the top k of the matching cases).")
    search.add_argument("text", metavar="TEXT")
    add_bank_option(search, BANK, required=True)
    config_option(search, SearchConfig, "k", flag="-k")
    config_options(search, SearchConfig, {"env": {"shown_default": HIDDEN}, "kind": {"shown_default": HIDDEN},
                                          **{name: {"metavar": "ID", "shown_default": HIDDEN} for name in SCOPE_FIELDS},
                                          "include_global": {}, "filter": {"metavar": "JSON", "shown_default": HIDDEN}})
    add_json_flag(search)

    reindex = add_command(actions, "reindex", "build a new faiss index over a directory bank's vectors", raw=False,
                          description="Train a new faiss index (--index FACTORY, e.g. IVF4096_HNSW32,PQ64x4fs) on a "
                                      "sample of the bank's vectors, fill it from them a chunk at a time, and make it "
                                      "the bank's, with its search knobs (--nprobe, --ef-search, --refine). Cases, ids "
                                      "and positions are unchanged; a directory bank only.")
    add_bank_option(reindex, BANK, required=True)
    config_option(reindex, IndexConfig, "factory", "the new index's faiss factory string", flag="--index",
                  dest="index", required=True, shown_default=HIDDEN)
    config_options(reindex, IndexConfig, ("nprobe", "ef_search", "refine"))

    stats = add_command(actions, "stats", "counts, rewards, index and file sizes", raw=False)
    add_bank_option(stats, BANK, required=True)
    add_json_flag(stats)

    copy = add_command(actions, "copy", "copy a bank to a new one (directory <-> Milvus)", raw=False,
                       description="Copy every case of --bank SRC to a new bank DST, keeping positions, ids, rewards, "
                                   "kinds, meta and embeddings exactly (deleted cases stay deleted). Either side is a "
                                   "directory or milvus:URI[#collection]. DST must not hold a bank; a failed copy "
                                   "leaves nothing at DST.")
    copy.add_argument("dst", metavar="DST", help="the new bank")
    add_bank_option(copy, "the bank to copy", required=True, metavar="SRC")
    config_option(copy, IndexConfig, "factory", "DST's index factory", flag="--index", dest="index",
                  shown_default="SRC's; Milvus takes Flat, IVF<n>,Flat, IVF<n>,SQ8, HNSW<M>,Flat")
    for action in (copy, create, imp, exp, search, stats, reindex):
        add_connect_timeout(action)


def run(args: argparse.Namespace) -> int:
    return _ACTIONS[args.bank_command](args)


ARTIFACT_ADVICE = ("add cases through the served selector instead (memento serve: POST /v1/cases; memento mcp: the "
                   "add_case tool; Python: Selector.add_case), or import into the source bank and run memento "
                   "export again")
"""Why a bank inside a selector artifact is not written by ``memento bank``: the artifact's manifest, its
replay and its running server (the one writer, whose in-memory index would not see the rows) own it."""


def _selector_artifact(path: Path) -> Path | None:
    """The selector artifact ``path`` is, or whose ``bank/`` it is (recognised by its selector manifest,
    :func:`memento.selector.artifact.read_manifest`; a manifest.json of that format that fails its checks
    counts too); ``None`` otherwise."""
    from memento.errors import CheckpointError
    from memento.selector.artifact import BANK_DIR, MANIFEST_NAME, SELECTOR_FORMAT, read_manifest

    for root in (path, path.parent) if path.name == BANK_DIR else (path,):
        manifest = root / MANIFEST_NAME
        if not manifest.is_file():
            continue
        try:
            read_manifest(root)
            return root
        except CheckpointError:
            try:
                found = loads_json(manifest.read_text(encoding="utf-8")[:1 << 20]).get("format")
            except (OSError, ValueError, AttributeError):
                found = None
            if found == SELECTOR_FORMAT:
                return root
    return None


def refuse_artifact(bank: str, flag: str = "--bank") -> None:
    """A write into a selector artifact (its root, where a second bank would be created beside ``bank/``, or
    its ``bank/``) is refused in one line, before anything is written."""
    where = parse_bank_uri(bank)
    if where.backend != "dir" or where.path is None:
        return
    root = _selector_artifact(Path(where.path))
    if root is None:
        return
    inside = "" if Path(where.path) == root else " (it is the bank/ of a selector artifact)"
    shown = bank if len(bank) <= 80 else f"{bank[:77]}..."
    raise BankError(f"{flag} {shown} is a selector artifact{inside}; memento bank does not write into an "
                    f"artifact (a served selector would not see the cases): {ARTIFACT_ADVICE}")


def add_storage_options(parser: Any) -> None:
    """``--vectors``, ``--nprobe`` and ``--refine``: how a new directory bank stores and searches its vectors."""
    group = parser.add_argument_group("storage and search (used when the bank is created)")
    config_option(group, BankConfig, "vectors")
    config_option(group, IndexConfig, "nprobe")
    config_option(group, IndexConfig, "refine")


def _index_config(args: argparse.Namespace) -> IndexConfig:
    knobs = {name: getattr(args, name, None) for name in ("nprobe", "refine")}
    return IndexConfig(factory=index_factory(args), **{k: v for k, v in knobs.items() if v is not None})


def _create_bank(args: argparse.Namespace, dim: int | None = None) -> Any:
    if dim is not None:
        check_count("--dim", dim, 1, MAX_DIM)
    where = parse_bank_uri(args.bank)  # a malformed or unknown bank name: one line, before the encoder loads
    index = _index_config(args)
    vectors = getattr(args, "vectors", None) or field_default(BankConfig, "vectors")
    if dim is not None:
        return create_bank(where, dim, index=index, options=bank_options(args), vectors=vectors), None
    config = encoder_config(args)
    encoder = load_encoder(config)
    return create_bank(where, encoder.dim, index=index, encoder=config, options=bank_options(args),
                       vectors=vectors), encoder


def bank_encoder(bank: Any) -> Any:
    """The encoder ``bank`` records, loaded and checked against the bank's dimension."""
    if bank.config.encoder is None:
        raise EncoderError(f"{bank.path}: this bank records no encoder (created with --dim); "
                           "it can only be searched with vectors from Python")
    encoder = load_encoder(bank.config.encoder)
    if encoder.dim != bank.dim:
        raise DimensionError(f"encoder {encoder.model_id} gives dim={encoder.dim}, "
                             f"bank {bank.path} holds dim={bank.dim}")
    return encoder


def _create(args: argparse.Namespace) -> int:
    refuse_artifact(args.bank)
    bank, _ = _create_bank(args, args.dim)
    with bank:
        print(f"created {bank.path} (dim={bank.dim}, index={bank.config.index.factory})")
    return EXIT_OK


def _copy(args: argparse.Namespace) -> int:
    refuse_artifact(args.dst, "DST")
    check_index_flag(args.index)  # '' is refused, never read as "the source's"
    n = copy_bank(args.bank, args.dst, index=args.index, options=bank_options(args))
    print(f"copied {n} case(s) from {args.bank} to {args.dst}")
    return EXIT_OK


def _import(args: argparse.Namespace) -> int:
    refuse_artifact(args.bank)
    config = ImportConfig(**given_fields(args, ImportConfig))
    if config.embeddings is not None and config.format == "case":  # streamed: the file is checked, never held
        from memento.bank.ingest import scan_case_file

        return _import_embeddings(args, config, scan_case_file(args.file, progress=None))
    cases = read_case_file(args.file, config.format)  # validate the whole file before creating anything
    if config.embeddings is not None:
        return _import_embeddings(args, config, cases)
    if bank_exists(args.bank, options=bank_options(args)):
        bank, encoder = open_bank(args.bank, options=bank_options(args)), None
    else:
        bank, encoder = _create_bank(args)
        print(f"created {bank.path} (dim={bank.dim}, index={bank.config.index.factory})")
    with bank:
        try:  # ids used by other cases of the bank: refused before the encoder runs
            bank.check_ids(cases, allow_duplicates=config.allow_duplicates)
        except DataFormatError as error:
            raise DataFormatError(f"{error} (bank {bank.path})", path=args.file) from None
        encoder = encoder or bank_encoder(bank)
        before = len(bank)
        vectors = encoder.encode([c.state for c in cases], normalize=True).reshape(len(cases), bank.dim)
        bank.add(cases, vectors, allow_duplicates=config.allow_duplicates)
        added = len(bank) - before
        print(f"imported {added} case(s) from {args.file} into {bank.path} "
              f"({len(cases) - added} duplicate(s) skipped; {len(bank)} in the bank)")
    return EXIT_OK


def _import_embeddings(args: argparse.Namespace, config: ImportConfig, cases: Any) -> int:
    """``bank import FILE --embeddings VECS``: the vectors given, checked whole before the bank is created or
    opened, then added a chunk per transaction (:mod:`memento.bank.bulk`; a Case JSONL file is streamed,
    ``cases`` is then its :class:`memento.bank.ingest.CaseFileScan`)."""
    from memento.bank.bulk import check_embeddings, import_with_embeddings, read_embeddings
    from memento.bank.ingest import CaseFileScan, import_case_file

    vectors = read_embeddings(config.embeddings)
    where = f"{config.embeddings} (for {args.file})"
    n_cases = cases.cases if isinstance(cases, CaseFileScan) else len(cases)
    check_embeddings(vectors, n_cases, int(vectors.shape[1]), where)  # read_embeddings: [N, D]
    if bank_exists(args.bank, options=bank_options(args)):
        bank = open_bank(args.bank, options=bank_options(args))
    else:  # the bank records an encoder only when one is named (then its dim must be the vectors')
        bank, encoder = _create_bank(args, None if args.encoder else int(vectors.shape[1]))
        if encoder is not None and encoder.dim != vectors.shape[1]:
            bank.close()
            raise DimensionError(f"encoder {encoder.model_id} gives dim={encoder.dim}, {config.embeddings} holds "
                                 f"dim={vectors.shape[1]} vectors")
        print(f"created {bank.path} (dim={bank.dim}, index={bank.config.index.factory})")
    with bank:
        if isinstance(cases, CaseFileScan):
            added = import_case_file(bank, cases, vectors, allow_duplicates=config.allow_duplicates, chunk=config.chunk,
                                     where=where)
        else:
            try:
                bank.check_ids(cases, allow_duplicates=config.allow_duplicates)
            except DataFormatError as error:
                raise DataFormatError(f"{error} (bank {bank.path})", path=args.file) from None
            added = import_with_embeddings(bank, cases, vectors, allow_duplicates=config.allow_duplicates,
                                           chunk=config.chunk, where=where, checked=True)
        print(f"imported {added} case(s) from {args.file} into {bank.path} "
              f"({n_cases - added} already stored or duplicate(s) skipped; {len(bank)} in the bank)")
    return EXIT_OK


def _reindex(args: argparse.Namespace) -> int:
    from memento.bank import CaseBank

    check_index_flag(args.index)
    knobs = {name: value for name, value in (("nprobe", args.nprobe), ("ef_search", args.ef_search),
                                             ("refine", args.refine)) if value is not None}
    config = IndexConfig(factory=args.index, **knobs)
    with open_bank(args.bank, options=bank_options(args)) as bank:
        if not isinstance(bank, CaseBank):
            raise BankError(f"{args.bank}: reindex takes a directory bank (a Milvus bank's index is Milvus's)")
        bank.reindex(config)
        print(f"reindexed {len(bank)} case(s) of {bank.path} with {config.factory}")
    return EXIT_OK


def _export(args: argparse.Namespace) -> int:
    with open_bank(args.bank, options=bank_options(args)) as bank:
        n = bank.export_jsonl(args.out)
    print(f"exported {n} case(s) to {args.out}")
    return EXIT_OK


def _utf8_argument(value: str | None, name: str) -> None:
    """A command-line text that is not UTF-8 (Python turns its undecodable bytes into lone surrogates, which
    cannot be encoded, stored or searched) is refused in one line."""
    if value is None:
        return
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as error:
        code = ord(value[error.start])
        byte = f"byte {code - 0xDC00:#04x}" if 0xDC80 <= code <= 0xDCFF else f"{value[error.start]!r}"
        raise DataFormatError(f"{name} is not UTF-8 text ({byte} at character {error.start + 1})") from None


def _search_where(query: SearchConfig) -> tuple[Any, Any]:
    """The scope and the parsed filter of ``bank search``, checked before the bank opens (one-line errors)."""
    for name in SCOPE_FIELDS:
        _utf8_argument(getattr(query, name), f"--{name}")
    _utf8_argument(query.filter, "--filter")
    fields = query.scope_fields
    if query.include_global and not fields:
        raise DataFormatError("--include-global goes beside a scope (--user, --agent or --session): without one "
                              "every case is searched already")
    scope = as_scope(fields, include_global=query.include_global)
    where = None
    if query.filter is not None:
        where = parse_filter(parse_json(query.filter, where="--filter", error=DataFormatError, finite=True),
                             what="--filter")
    return scope, where


def _scope_text(case: Any) -> str:
    return "".join(f"  {name}={value}" for name, value in zip(SCOPE_FIELDS, case.scope) if value is not None)


def _search(args: argparse.Namespace) -> int:
    query = SearchConfig(**given_fields(args, SearchConfig))
    for value, name in ((args.text, "TEXT"), (query.env, "--env"), (query.kind, "--kind")):
        _utf8_argument(value, name)
    scope, where = _search_where(query)
    with open_bank(args.bank, options=bank_options(args)) as bank:
        check_count("-k", query.k, 1, MAX_CANDIDATES)
        encoder = bank_encoder(bank)
        k = min(query.k, max(len(bank), 1))  # more than the bank holds finds them all
        scores, ids = bank.search(encoder.encode(args.text), k, env=query.env, kind=query.kind, scope=scope,
                                  filter=where)
        cases = bank.get(list(ids))
    if args.json:
        print(json.dumps([{"score": float(s), **c.to_json()} for s, c in zip(scores, cases)],
                         ensure_ascii=False, indent=2))
        return EXIT_OK
    if not cases:
        print("no cases found")
    for rank, (score, case) in enumerate(zip(scores, cases), start=1):
        print(f"{rank}. [{score:.4f}] {case.id}  reward={case.reward:g}  kind={case.kind}"
              + (f"  env={case.env}" if case.env else "") + _scope_text(case))
        print(textwrap.indent(textwrap.shorten(case.state, 200), "   state:  "))
        print(textwrap.indent(textwrap.shorten(case.action, 200), "   action: "))
        if case.meta:
            print(textwrap.indent(textwrap.shorten(json.dumps(case.meta, ensure_ascii=False), 200), "   meta:   "))
    return EXIT_OK


def _stats(args: argparse.Namespace) -> int:
    with open_bank(args.bank, options=bank_options(args)) as bank:
        stats = bank.stats()
    if args.json:
        print(json.dumps(stats, indent=2))
    else:
        for key, value in stats.items():
            print(f"{key:>16}: {value}")
    return EXIT_OK


_ACTIONS = {"create": _create, "import": _import, "reindex": _reindex, "export": _export, "search": _search,
            "stats": _stats, "copy": _copy}
