"""Typed, frozen run configurations and their JSON round trip.

Every config is a ``@dataclass(frozen=True, kw_only=True)``. Fields are checked in
``__post_init__`` (a ``ConfigError`` names the field and the value), closed choices
are ``Literal`` types, and :func:`to_dict` / :func:`from_dict` convert a config to
and from plain JSON, recursing into nested configs. Unknown keys are rejected so a
typo in a config file never passes silently.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin

from memento.errors import ConfigError
from memento.io import atomic_write_text, read_json
from memento.types import shown

__all__ = [
    "MAX_BATCH",
    "MAX_BENCH_BYTES",
    "MAX_BENCH_ITEMS",
    "MAX_BENCH_VECTORS",
    "MAX_CANDIDATES",
    "MAX_CASE_CACHE_MIB",
    "MAX_DIM",
    "MAX_EF_SEARCH",
    "MAX_FACTORY_CHARS",
    "MAX_FACTORY_NUMBER",
    "MAX_HIDDEN",
    "MAX_HNSW_M",
    "MAX_K",
    "MAX_LAYERS",
    "MAX_LINUCB_DIM",
    "MAX_NLIST",
    "MAX_QNET_PARAMS",
    "MAX_REFINE",
    "MAX_REPLAY_BYTES",
    "MAX_REPLAY_CAPACITY",
    "MAX_SEED",
    "MAX_STEPS",
    "MAX_THREADS",
    "MAX_TOKENS",
    "MAX_UPDATES_PER_STEP",
    "MAX_WORKERS",
    "read_config_json",
    "AlphaSchedule",
    "BankConfig",
    "EncoderConfig",
    "ImportanceWeights",
    "IndexConfig",
    "LearnerConfig",
    "Pooling",
    "CASE_KINDS",
    "CASE_SCALARS",
    "QNetAnchor",
    "QNetFeatures",
    "QNetArch",
    "LabelTarget",
    "OnlineLabelsConfig",
    "QNetConfig",
    "ReplayConfig",
    "StorageDtype",
    "TDLoss",
    "check",
    "check_bools",
    "check_choice",
    "check_count",
    "check_float",
    "check_factory",
    "check_int",
    "check_int_tuple",
    "check_ints",
    "factory_problem",
    "is_int",
    "short_repr",
    "field_default",
    "from_dict",
    "load_json",
    "parses_to",
    "save_json",
    "to_dict",
    "VectorStore",
]

T = TypeVar("T")

Pooling = Literal["avg", "cls", "cls_before_pooler"]


# ---------------------------------------------------------------- bounds
# Every count, size and capacity a user can give has a maximum, checked in a config's ``__post_init__`` (or, for a
# command-line-only flag, by the command) before anything is allocated or written. The reason of each:

MAX_STEPS = 1_000_000_000
"""Tasks, episodes, steps of a run, windows, checkpoint intervals, warm-up decisions, update counters: a run's task
order is drawn one pass at a time, so no allocation grows with it; 10**9 LLM calls is beyond any real run."""
MAX_K = 1024
"""Cases shown per decision (``k``, ``k_max``, ``k_tasks``...): each is prompt text and each replay row keeps K
vector slots."""
MAX_CANDIDATES = 65_536
"""The candidate pool C of one decision: a (C, D) float32 matrix (D = 384: 100 MB at the bound)."""
MAX_BATCH = 65_536
"""Tasks planned together, mini-batch rows, texts encoded together."""
MAX_REPLAY_CAPACITY = 10_000_000
"""Decisions a replay buffer keeps (its row tensors are preallocated)."""
MAX_REPLAY_BYTES = 16 * 2**30
"""The most a replay buffer may reach when full (its preallocated rows plus its vector tables at their worst case,
:meth:`ReplayConfig.worst_case_bytes`): 16 GiB."""
MAX_DIM = 65_536
"""An embedding dimension D (transformer encoders give 384 to 4096)."""
MAX_LINUCB_DIM = 4096
"""LinUCB's dimension: a disjoint-mode model keeps an F x F float64 matrix per case (F = 2D + 1: 537 MB at 4096)."""
MAX_HIDDEN = 16_384
"""A Q-network's hidden width and tower output width."""
MAX_LAYERS = 64
"""A Q-network's hidden layers."""
MAX_QNET_PARAMS = 500_000_000
"""A Q-network's parameters (2 GB of float32, twice that with its target network), checked once D is known."""
MAX_CASE_CACHE_MIB = 1_048_576
"""A Q-network's per-case first-layer cache (``QNetConfig.case_cache_mib``), in MiB (1 TiB)."""
MAX_TOKENS = 1_048_576
"""A token or word budget (an encoder's ``max_length``, PlugMem's ``budget_tokens``)."""
MAX_UPDATES_PER_STEP = 1024
"""Gradient steps per decision."""
MAX_THREADS = 1024
"""``--torch-threads`` and a benchmark's server threads: beyond any machine's cores."""
MAX_WORKERS = 256
"""Rollout workers and server worker processes (each holds a planner or a model)."""
MAX_SEED = 2**64 - 1
"""A seed: numpy and torch take 64-bit seeds."""
MAX_EF_SEARCH = 65_536
"""HNSW's ``efSearch`` (a per-query candidate list)."""
MAX_NLIST = 2**20
"""IVF lists (``IVF<n>``) and ``nprobe``: training needs 39 vectors per list, 40 M vectors at the bound."""
MAX_REFINE = 16
"""``IndexConfig.refine``: at most 16 x C approximate hits re-ranked by their exact vectors."""
MAX_HNSW_M = 256
"""HNSW's ``M`` (``HNSW<M>``, also NSG's ``R``): every vector keeps 2M neighbour ids per level."""
MAX_FACTORY_NUMBER = 65_536
"""Any other number in a faiss factory string (PQ/OPQ/PCA sizes, bits...)."""
MAX_FACTORY_CHARS = 200
"""A faiss factory string's length."""
MAX_BENCH_VECTORS = 100_000_000
"""A benchmark's bank size (random vectors held in memory)."""
MAX_BENCH_BYTES = 32 * 2**30
"""A benchmark's bank of random float32 vectors: size x dim x 4 bytes at most 32 GiB."""
MAX_BENCH_ITEMS = 10_000_000
"""A benchmark's timed queries, requests, bootstrap resamples, repetitions (each is work, not memory)."""
MAX_K_SETS = 1024
"""Random K-sets scored per task when labelling (each is one planner scoring call)."""
MAX_RETRIES = 100
"""CFGM's replays of a failed game (each is a whole episode with the planner)."""
MAX_GAME_STEPS = 100_000
"""A text game's step limit and the history a prompt keeps (each step is a planner call and prompt text)."""


def check(condition: bool, cls: type, field: str, value: Any, requirement: str) -> None:
    """Raise ``ConfigError("Cls.field=value: requirement")`` unless ``condition`` holds (for ``__post_init__``);
    a huge value is shown shortened (at most 80 characters)."""
    if not condition:
        raise ConfigError(f"{cls.__name__}.{field}={shown(value)}: {requirement}")


def is_int(value: Any) -> bool:
    """An int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_count(name: str, value: Any, minimum: int, maximum: int | None = None) -> None:
    """``value`` is an int (not a bool) of at least ``minimum`` and, when given, at most ``maximum``; else
    ``ConfigError("name=value: must be an integer ...")`` (``name``: ``Cls.field``, a flag such as ``--workers``;
    the value shortened)."""
    if not is_int(value) or value < minimum or (maximum is not None and value > maximum):
        bound = f">= {minimum}" if maximum is None else f"in {minimum}..{maximum}"
        raise ConfigError(f"{name}={shown(value)}: must be an integer {bound}")


def check_int(obj: Any, field: str, minimum: int, maximum: int | None = None) -> None:
    """``obj.field`` is an int (not a bool) of at least ``minimum`` and, when given, at most ``maximum``."""
    check_count(f"{type(obj).__name__}.{field}", getattr(obj, field), minimum, maximum)


def check_int_tuple(obj: Any, field: str, minimum: int, maximum: int, *, distinct: bool = False) -> None:
    """``obj.field`` is a non-empty tuple (or list) of ints in ``minimum..maximum`` (``distinct``: no repeats)."""
    value = getattr(obj, field)
    ok = isinstance(value, (tuple, list)) and bool(value) and len(value) <= 1024 \
        and all(is_int(v) and minimum <= v <= maximum for v in value)
    ok = ok and (not distinct or len(set(value)) == len(value))
    check(ok, type(obj), field, value,
          f"need 1..1024 {'distinct ' if distinct else ''}integers in {minimum}..{maximum}")


def check_ints(obj: Any, **bounds: int | tuple[int, int]) -> None:
    """:func:`check_int` for each ``field=minimum`` or ``field=(minimum, maximum)`` given, in that order."""
    for field, bound in bounds.items():
        if isinstance(bound, tuple):
            check_int(obj, field, *bound)
        else:
            check_int(obj, field, bound)


_FACTORY_BOUNDS = (("IVF", 1, MAX_NLIST, "IVF lists"), ("IMI2x", 1, 16, "IMI bits"), ("HNSW", 2, MAX_HNSW_M, "HNSW M"),
                   ("NSG", 2, MAX_HNSW_M, "NSG R"), ("PQ", 1, MAX_FACTORY_NUMBER, "PQ sub-quantizers"),
                   ("RQ", 1, 256, "RQ codebooks"), ("LSQ", 1, 256, "LSQ codebooks"))


def factory_problem(factory: Any) -> str | None:
    """Why a faiss factory string is refused before faiss sees it (``None``: it may be built): not a string, too
    long, an ``IVF<n>`` outside 1..MAX_NLIST, an ``HNSW<M>`` / ``NSG<R>`` outside 2..MAX_HNSW_M, any other number
    above MAX_FACTORY_NUMBER (or, in a ``...x<bits>`` suffix, above 16); faiss itself judges the rest (and
    :class:`memento.bank.index.FaissIndex` turns what it refuses into one line)."""
    import re

    if not isinstance(factory, str) or not factory.strip():
        return "must be a non-empty faiss factory string"
    if len(factory) > MAX_FACTORY_CHARS:
        return f"a faiss factory string of {len(factory)} characters (at most {MAX_FACTORY_CHARS})"
    if not factory.isascii() or not factory.isprintable():
        return "a faiss factory string is printable ASCII"
    for component in factory.replace("_", ",").split(","):
        rest = component  # what the generic number bound checks: the component, less a bounded prefix's number
        for prefix, low, high, what in _FACTORY_BOUNDS:
            match = re.fullmatch(re.escape(prefix) + r"(\d+)\D?.*", component.strip())
            if match is not None:
                n = int(match.group(1)[:12])  # 12 digits are beyond every bound
                if not low <= n <= high or len(match.group(1)) > 12:
                    return f"{what} {shown(match.group(1), 20)} in {component.strip()[:40]!r}: must be in {low}..{high}"
                rest = component.strip()[match.end(1):]
                break
        for digits in re.findall(r"\d+", rest):
            if len(digits) > 12 or int(digits) > MAX_FACTORY_NUMBER:
                return f"the number {shown(digits, 20)} in {component.strip()[:40]!r}: at most {MAX_FACTORY_NUMBER}"
        bits = re.search(r"x(\d+)", component)
        if bits is not None and not 1 <= int(bits.group(1)) <= 16:
            return f"{bits.group(1)} bits in {component.strip()[:40]!r}: must be in 1..16"
    return None


def check_factory(obj: Any, field: str) -> None:
    """``obj.field`` is a faiss factory string within the bounds (:func:`factory_problem`)."""
    value = getattr(obj, field)
    problem = factory_problem(value)
    check(problem is None, type(obj), field, value, str(problem))


@dataclasses.dataclass(frozen=True, kw_only=True)
class EncoderConfig:
    """How texts become state and case vectors.

    ``model`` is ``None`` for the bundled all-MiniLM-L6-v2 weights, or a local
    transformers encoder directory (SimCSE checkpoints included).
    """

    model: str | None = dataclasses.field(default=None, metadata={"help": (
        "local transformers encoder directory, or a Hub id hf://ORG/NAME[@REV]")})
    pooling: Pooling = dataclasses.field(default="avg", metadata={"help": (
        "how token vectors become one text vector (SimCSE pooling)")})
    max_length: int = dataclasses.field(default=256, metadata={"help": "token limit per text"})
    batch_size: int = 64
    normalize: bool = True

    def __post_init__(self) -> None:
        check(self.pooling in get_args(Pooling), type(self), "pooling", self.pooling,
               f"must be one of {get_args(Pooling)}")
        check_ints(self, max_length=(8, MAX_TOKENS), batch_size=(1, MAX_BATCH))
        check(isinstance(self.normalize, bool), type(self), "normalize", self.normalize, "must be true or false")
        check(self.model is None or bool(str(self.model).strip()), type(self), "model",
               self.model, "must be None or a non-empty path")


@dataclasses.dataclass(frozen=True, kw_only=True)
class IndexConfig:
    """A faiss index built from a factory string, inner product on unit vectors.

    ``factory`` is any ``faiss.index_factory`` description: ``"Flat"`` (exact),
    ``"HNSW32,Flat"``, ``"IVF1024,Flat"``, ``"IVF4096,PQ32"``... ``ef_search`` and
    ``nprobe`` are the search-time knobs of HNSW and IVF indexes. ``refine``: a search for C cases asks the
    index for ``refine * C`` and keeps the C whose exact float32 vectors score best (a compressed index such as
    ``"IVF1024,PQ32"`` ranks by approximate codes; 1 keeps the index's own order).
    """

    factory: str = dataclasses.field(
        default="Flat", metadata={"help": 'faiss index factory string, e.g. "Flat", "HNSW32,Flat", "IVF1024,Flat"'})
    ef_search: int = dataclasses.field(default=128, metadata={"help": "HNSW efSearch per query (an HNSW index)"})
    nprobe: int = dataclasses.field(default=32, metadata={"help": "IVF lists searched per query (an IVF index)"})
    refine: int = dataclasses.field(default=1, metadata={
        "help": f"re-rank REFINE x C index hits by their exact vectors, 1..{MAX_REFINE} (1: the index's order)"})

    def __post_init__(self) -> None:
        check_factory(self, "factory")
        check_ints(self, ef_search=(1, MAX_EF_SEARCH), nprobe=(1, MAX_NLIST), refine=(1, MAX_REFINE))


VectorStore = Literal["ram", "disk"]
"""Where a directory bank keeps the float32 vectors it hands the policy: ``ram`` mirrors every vector in memory
(the fast path for small banks), ``disk`` reads the candidates' vectors from a memory-mapped file beside
cases.sqlite (a large bank with a compressed index stays within a few bytes of RAM per case)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class BankConfig:
    """What a case bank is made of: embedding dimension, index, and the encoder that fills it."""

    dim: int
    index: IndexConfig = dataclasses.field(default_factory=IndexConfig)
    encoder: EncoderConfig | None = None
    vectors: VectorStore = dataclasses.field(default="ram", metadata={
        "help": "ram: every vector mirrored in memory (fast for small banks); disk: read by position from "
                "vectors.f32, memory-mapped (large banks with a compressed index)"})

    def __post_init__(self) -> None:
        check_int(self, "dim", 1, MAX_DIM)
        check_choice(self, "vectors", VectorStore)


# ---------------------------------------------------------------- JSON round trip


def to_dict(config: Any) -> dict[str, Any]:
    """A config as a plain JSON-ready dict (nested configs become nested dicts)."""
    if not dataclasses.is_dataclass(config) or isinstance(config, type):
        raise TypeError(f"to_dict expects a dataclass instance, got {type(config).__name__}")
    return dataclasses.asdict(config)


def _kind_of(tp: Any) -> str | None:
    """The default of a dataclass's ``kind`` field (the tag of a tagged union), if it has one."""
    if not (isinstance(tp, type) and dataclasses.is_dataclass(tp)):
        return None
    for field in dataclasses.fields(tp):
        if field.name == "kind" and isinstance(field.default, str):
            return field.default
    return None


short_repr = shown  # the old name, kept for the modules that still import it; new code uses memento.types.shown


def _convert(tp: Any, value: Any, where: str) -> Any:
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        options = get_args(tp)
        if value is None and type(None) in options:
            return None
        kinds = {_kind_of(option): option for option in options if _kind_of(option) is not None}
        if kinds and isinstance(value, dict):  # a tagged union (policy configs): "kind" picks the class
            if not isinstance(value.get("kind"), str) or value["kind"] not in kinds:
                raise ConfigError(f"{where}.kind={shown(value.get('kind'))}: must be one of {tuple(kinds)}")
            return _convert(kinds[value["kind"]], value, where)
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _convert(option, value, where)
            except ConfigError as error:
                errors.append(str(error))
        raise ConfigError(errors[0] if errors else f"{where}={shown(value)}: invalid")
    if origin is Literal:
        if value not in get_args(tp):
            raise ConfigError(f"{where}={shown(value)}: must be one of {get_args(tp)}")
        return value
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}={shown(value)}: expected an object for {tp.__name__}")
        return from_dict(tp, value, _where=where)
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}={shown(value)}: expected a list")
        args = get_args(tp)
        inner = args[0] if args else Any
        items = [_convert(inner, item, f"{where}[{i}]") for i, item in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}={shown(value)}: expected an object")
        return dict(value)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}={shown(value)}: expected true or false")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}={shown(value)}: expected an integer")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}={shown(value)}: expected a number")
        try:
            return float(value)
        except OverflowError:  # an integer beyond float range
            raise ConfigError(f"{where}: an integer of {len(str(abs(value)))} digits is not a finite number") \
                from None
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}={shown(value)}: expected a string")
        return value
    return value


def from_dict(cls: type[T], data: dict[str, Any], *, _where: str | None = None) -> T:
    """Build config ``cls`` from a plain dict, checking every field's type and value."""
    where = _where or cls.__name__
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected an object, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {unknown}; known: {sorted(fields)}")
    kwargs = {name: _convert(hints[name], value, f"{where}.{name}") for name, value in data.items()}
    try:
        return cls(**kwargs)
    except TypeError as error:  # a required field is missing
        raise ConfigError(f"{where}: {error}") from None


def field_default(cls: type, name: str) -> Any:
    """The default of dataclass ``cls``'s field ``name`` (its ``default_factory()`` when it has one), so a
    command-line option can show and fall back to it without writing it a second time."""
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        if field.name == name:
            if field.default is not dataclasses.MISSING:
                return field.default
            if field.default_factory is not dataclasses.MISSING:
                return field.default_factory()
            raise ConfigError(f"{cls.__name__}.{name} has no default")
    raise ConfigError(f"{cls.__name__} has no field {name!r}")


def parses_to(cls: type, data: Any, config: Any) -> bool:
    """Whether saved JSON ``data`` reads back as ``config`` (a field added since it was written takes its
    default, so an older file of the same configuration still matches); unreadable data does not match."""
    try:
        return from_dict(cls, data) == config
    except ConfigError:
        return False


def save_json(config: Any, path: str | Path) -> None:
    """Write ``config`` as indented JSON, atomically (temporary file, then rename)."""
    atomic_write_text(path, json.dumps(to_dict(config), indent=2, sort_keys=True) + "\n")


def read_config_json(path: str | Path) -> Any:
    """The parsed JSON of a config file; a missing, unreadable or malformed file is a one-line ConfigError."""
    return read_json(path, error=ConfigError, what="config file", encoding="utf-8-sig")  # a byte-order mark is ok


def load_json(cls: type[T], path: str | Path) -> T:
    """Read a config of type ``cls`` written by :func:`save_json`."""
    return from_dict(cls, read_config_json(path))


# ---------------------------------------------------------------- learning core: Q-network, replay, learner
# QNetConfig, ReplayConfig and LearnerConfig configure memento.learn.qnet, memento.learn.replay and
# memento.learn.learner.

QNetArch = Literal["mlp", "mlp_interact", "two_tower"]
QNetFeatures = Literal["none", "case"]
"""What the Q-network sees of a case: ``"none"``, its state's embedding only; ``"case"``, also its case features
(:mod:`memento.learn.features`: the action's embedding, stored reward, usage statistics, kind)."""

CASE_KINDS = ("case", "focus", "tip", "cluster", "skill", "proposition", "prescription")
"""The item kinds a bank holds (docs/formats.md); a case feature vector one-hot encodes these and "other"."""
CASE_SCALARS = 3 + len(CASE_KINDS) + 1
"""Case-feature numbers besides the action embedding: stored reward, usage mean, log(1 + times shown), kind."""

QNetAnchor = Literal["none", "cosine"]
StorageDtype = Literal["float32", "float16", "bfloat16"]
AlphaSchedule = Literal["fixed", "linear", "target_entropy"]
TDLoss = Literal["huber", "mse"]
ImportanceWeights = Literal["none", "inverse_propensity"]


def check_choice(obj: Any, field: str, choices: Any) -> None:
    """``obj.field`` is one of the values of the ``Literal`` type ``choices``."""
    value = getattr(obj, field)
    check(value in get_args(choices), type(obj), field, value, f"must be one of {get_args(choices)}")


def check_bools(obj: Any, *fields: str) -> None:
    """Each ``obj.field`` of ``fields`` is a bool."""
    for field in fields:
        check(isinstance(getattr(obj, field), bool), type(obj), field, getattr(obj, field), "must be true or false")


def check_float(obj: Any, field: str, *, low: float | None = None, high: float | None = None,
                 low_open: bool = False, high_open: bool = False) -> None:
    """``obj.field`` is a finite real number within the bounds; an int is stored as a float."""
    value = getattr(obj, field)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value == value \
        and value not in (float("inf"), float("-inf"))
    if ok and low is not None:
        ok = value > low if low_open else value >= low
    if ok and high is not None:
        ok = value < high if high_open else value <= high
    if not ok:
        lo = "" if low is None else ("(" if low_open else "[") + repr(low)
        hi = "" if high is None else repr(high) + (")" if high_open else "]")
        interval = f"in {lo or '(-inf'}, {hi or 'inf)'}"
        check(False, type(obj), field, value, f"must be a finite number {interval}")
    object.__setattr__(obj, field, float(value))


@dataclasses.dataclass(frozen=True, kw_only=True)
class QNetConfig:
    """A Q-network scoring (state, case) pairs: ``Q(s, c)`` is a logit (see :mod:`memento.learn.qnet`).

    - ``arch``: ``"mlp"`` (Memento: concat(s, c) -> hidden -> 1), ``"mlp_interact"`` (adds
      ``s*c`` and ``|s-c|`` to the concat) or ``"two_tower"`` (``f(s) . g(c) + bias``, case
      side precomputable);
    - ``dim``: the embedding dimension D of states and cases; ``None`` in a run config whose encoder
      gives it (:meth:`for_dim` fills it in before a network is built);
    - ``hidden``: width of every hidden layer; ``n_layers``: hidden layers (per tower for
      ``two_tower``);
    - ``dropout``: after every hidden ReLU, in training mode only;
    - ``embed_dim``: E, the output width of each tower (``two_tower`` only);
    - ``anchor``: ``"none"``, or ``"cosine"`` (``mlp``/``mlp_interact`` only): ``Q(s, c) = a * cos(s, c) + b +
      residual(s, c)`` with learnable scalars ``a`` (initialised to ``anchor_scale``) and ``b`` (0) and the
      residual's output layer initialised to zero, so a fresh network ranks the candidates exactly as cosine
      similarity does and learning can only move away from it where rewards say so;
    - ``features``: ``"none"`` (a case is its state's embedding, D numbers) or ``"case"`` (``mlp``/``mlp_interact``
      only): a case is ``[state embedding | action embedding | stored reward, usage mean, log(1 + shown), kind
      one-hot]`` (:attr:`case_dim` = 2D + :data:`CASE_SCALARS` numbers, :mod:`memento.learn.features`);
    - ``relation_rank``: R > 0 (``mlp``/``mlp_interact`` only) adds a low-rank bilinear term ``(U s) . (V c)``
      (``U``, ``V``: D -> R, over the state and the case's question embedding): a multiplicative match between
      what the question asks and what the case's question asked, which a concatenation MLP can hardly express.
      ``V`` starts at zero, so a fresh network still scores exactly as without it (an anchored one ranks like
      cosine); 0 (default): no such term;
    - ``seed``: seeds the parameter initialisation when :func:`memento.learn.qnet.build_qnet` gets no generator;
    - ``case_cache_mib``: ``mlp``/``mlp_interact`` on the CPU in float32: the most MiB the network keeps of the case
      half of its first layer per bank position (``W_c c`` of the part of a case that does not change per step,
      computed once per position and weights version, :class:`memento.learn.qnet.CaseHalfCache`); a runtime
      setting: the scores are the same with or without it (to float32 rounding); 0: no cache. 64 MiB hold about
      32,000 cases at ``hidden=512``.
    """

    arch: QNetArch = dataclasses.field(default="mlp", metadata={"help": "architecture"})
    dim: int | None = None
    hidden: int = dataclasses.field(default=512, metadata={"help": "hidden width"})
    n_layers: int = dataclasses.field(default=1, metadata={"help": "hidden layers"})
    dropout: float = dataclasses.field(default=0.1, metadata={"help": "dropout"})
    embed_dim: int = dataclasses.field(default=128, metadata={"help": "two_tower output width"})
    anchor: QNetAnchor = dataclasses.field(default="none", metadata={"help": (
        "none, or cosine: Q = a*cos + b + a residual that starts at 0, so a "
        "fresh network ranks like similarity")})
    anchor_scale: float = 20.0
    features: QNetFeatures = dataclasses.field(default="none", metadata={"help": (
        "none (a case is its question's embedding), or case (also its answer's "
        "embedding, stored reward, usage statistics from the bank, and kind)")})
    relation_rank: int = dataclasses.field(default=0, metadata={"help": (
        "the rank of a bilinear term (U s).(V c) between the question and a "
        "case's question (0: none; it starts at 0, so a fresh network still scores as without it)")})
    seed: int = 0
    case_cache_mib: int = dataclasses.field(default=64, metadata={"help": (
        "MiB of per-case first-layer products kept between selections (0: none)")})

    def __post_init__(self) -> None:
        check_choice(self, "arch", QNetArch)
        if self.dim is not None:
            check_int(self, "dim", 1, MAX_DIM)
        check_ints(self, hidden=(1, MAX_HIDDEN), n_layers=(1, MAX_LAYERS))
        check_float(self, "dropout", low=0.0, high=1.0, high_open=True)
        check_int(self, "embed_dim", 1, MAX_HIDDEN)
        check_choice(self, "anchor", QNetAnchor)
        check(self.anchor == "none" or self.arch != "two_tower", type(self), "anchor", self.anchor,
              "a cosine anchor needs arch 'mlp' or 'mlp_interact' (two_tower keys must stay state-free)")
        check_float(self, "anchor_scale", low=0.0, low_open=True)
        check_choice(self, "features", QNetFeatures)
        check(self.features == "none" or self.arch != "two_tower", type(self), "features", self.features,
              "case features need arch 'mlp' or 'mlp_interact' (two_tower keys come from the bank's vectors)")
        check_int(self, "relation_rank", 0)
        check(self.relation_rank <= 4096, type(self), "relation_rank", self.relation_rank, "must be <= 4096")
        check(self.relation_rank == 0 or self.arch != "two_tower", type(self), "relation_rank", self.relation_rank,
              "a bilinear relation term needs arch 'mlp' or 'mlp_interact' (two_tower is one already)")
        check_int(self, "seed", 0, MAX_SEED)
        check_int(self, "case_cache_mib", 0, MAX_CASE_CACHE_MIB)
        params = self.parameters_estimate()
        check(params is None or params <= MAX_QNET_PARAMS, type(self), "hidden", self.hidden,
              f"a Q-network of about {params} parameters with dim={self.dim}, n_layers={self.n_layers}, "
              f"relation_rank={self.relation_rank} (at most {MAX_QNET_PARAMS})")

    def parameters_estimate(self) -> int | None:
        """About how many parameters the network has (``None`` while ``dim`` is): what :data:`MAX_QNET_PARAMS`
        bounds."""
        if self.dim is None:
            return None
        d, c, h = self.dim, self.case_dim or self.dim, self.hidden
        if self.arch == "two_tower":
            tower = (d + 1) * h + (self.n_layers - 1) * (h + 1) * h + (h + 1) * self.embed_dim
            return 2 * tower + 1
        width = d + c + (2 * d if self.arch == "mlp_interact" else 0)
        return (width + 1) * h + (self.n_layers - 1) * (h + 1) * h + h + 1 + self.relation_rank * (d + c)

    @property
    def case_dim(self) -> int | None:
        """Numbers per case vector: D, or 2D + CASE_SCALARS with case features (``None`` while ``dim`` is)."""
        if self.dim is None:
            return None
        return self.dim if self.features == "none" else 2 * self.dim + CASE_SCALARS

    def for_dim(self, dim: int, *, seed: int | None = None) -> QNetConfig:
        """This architecture over ``dim``-dimensional vectors (and, when given, another init ``seed``)."""
        if self.dim is not None and self.dim != dim:
            raise ConfigError(f"QNetConfig.dim={self.dim}: the encoder gives dim={dim}")
        return dataclasses.replace(self, dim=dim, seed=self.seed if seed is None else seed)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReplayConfig:
    """A replay buffer of preallocated tensors (see :mod:`memento.learn.replay`).

    - ``capacity``: transitions held; the oldest is overwritten when full (ring);
    - ``dim``: D; ``k_max``: most cases chosen per decision (rows with fewer are masked);
    - ``case_dim``: numbers per stored case vector (``None``: D; a Q-network with case features stores
      ``QNetConfig.case_dim``);
    - ``store_next``: also keep ``next_state`` and up to ``c_max`` next candidates (multi-step
      soft TD needs them; single-step BCE does not, and then they take no memory);
    - ``storage_dtype``: how embeddings are stored (``float16``/``bfloat16`` halve the memory;
      batches are always float32).
    """

    capacity: int = 100_000
    dim: int
    k_max: int = 4
    store_next: bool = False
    c_max: int = 32
    storage_dtype: StorageDtype = "float32"
    case_dim: int | None = None

    def __post_init__(self) -> None:
        check_ints(self, capacity=(1, MAX_REPLAY_CAPACITY), dim=(1, MAX_DIM))
        if self.case_dim is not None:
            check_int(self, "case_dim", 1, 2 * MAX_DIM + CASE_SCALARS)
        check_int(self, "k_max", 1, MAX_K)
        check(isinstance(self.store_next, bool), type(self), "store_next", self.store_next, "must be true or false")
        check_int(self, "c_max", 1, MAX_CANDIDATES)
        check_choice(self, "storage_dtype", StorageDtype)
        need = self.worst_case_bytes()
        check(need <= MAX_REPLAY_BYTES, type(self), "capacity", self.capacity,
              f"a full buffer of {self.capacity} decisions (k_max={self.k_max}, dim={self.dim}, "
              f"case width {self.case_width}, store_next={self.store_next}) may take {need / 2**30:.1f} GiB; "
              f"at most {MAX_REPLAY_BYTES // 2**30} GiB")

    def worst_case_bytes(self) -> int:
        """What the buffer may hold when full: its preallocated rows (ids, masks, rewards, propensities) plus its
        vector tables at their worst case (every row's vectors distinct, 1.5x before compaction)."""
        n, k, c = self.capacity, self.k_max, self.c_max
        itemsize = 4 if self.storage_dtype == "float32" else 2
        rows = 8 * (1 + k) + k * 5 + 32
        vectors = self.dim + k * self.case_width
        if self.store_next:
            rows += 8 * (1 + c) + c
            vectors += self.dim + c * self.case_width
        return n * rows + (3 * n * vectors * itemsize) // 2

    @property
    def case_width(self) -> int:
        """Numbers per stored case vector (``case_dim``, else ``dim``)."""
        return self.dim if self.case_dim is None else self.case_dim


@dataclasses.dataclass(frozen=True, kw_only=True)
class LearnerConfig:
    """The soft-Q learner's hyperparameters (see :mod:`memento.learn.learner`).

    - ``gamma``: 0 is Memento's single-step case (binary rewards, BCE on logits); > 0 is soft TD
      with the Huber (``td_loss="huber"``, threshold ``huber_delta``) or squared loss;
    - ``lr``, ``weight_decay``: AdamW; ``max_grad_norm``: gradient-norm clipping (``None``: off);
    - ``batch_size``: the mini-batch size callers sample from the replay buffer (``update``
      takes any batch);
    - ``target_every`` / ``target_beta``: every ``target_every`` updates,
      ``theta_bar <- beta * theta_bar + (1 - beta) * theta`` (``beta = 0`` copies);
    - ``alpha`` (the soft-max temperature) and ``alpha_schedule``: ``"fixed"``; ``"linear"`` from
      ``alpha`` to ``alpha_final`` over ``alpha_decay_steps`` updates; ``"target_entropy"``
      (discrete-SAC tuning from ``alpha``, learning rate ``alpha_lr``) towards an entropy of
      ``target_entropy_ratio * log(n)`` over each row's ``n`` candidates;
    - ``importance_weights``: ``"none"`` or ``"inverse_propensity"`` (weights
      ``min(1 / propensity, importance_cap)``, self-normalised over the batch);
    - ``seed``: seeds the learner's generator (dropout masks) when none is passed.
    """

    gamma: float = dataclasses.field(
        default=0.0, metadata={"help": "0: single-step BCE; > 0: soft TD (logs with next states only)"})
    lr: float = dataclasses.field(default=1e-3, metadata={"help": "AdamW learning rate"})
    weight_decay: float = dataclasses.field(default=0.01, metadata={"help": "AdamW weight decay"})
    max_grad_norm: float | None = dataclasses.field(default=10.0, metadata={"help": "gradient-norm clip"})
    batch_size: int = dataclasses.field(default=256, metadata={"help": "decisions per batch"})
    target_every: int = dataclasses.field(default=1, metadata={"help": "updates between Polyak steps"})
    target_beta: float = dataclasses.field(default=0.995, metadata={"help": "Polyak beta"})
    td_loss: TDLoss = dataclasses.field(default="huber", metadata={"help": "soft-TD loss"})
    huber_delta: float = 1.0
    alpha: float = dataclasses.field(default=1.0, metadata={"help": "soft-max temperature"})
    alpha_schedule: AlphaSchedule = dataclasses.field(default="fixed", metadata={"help": "temperature schedule"})
    alpha_final: float = 0.1
    alpha_decay_steps: int = 10_000
    target_entropy_ratio: float = 0.5
    alpha_lr: float = 3e-4
    importance_weights: ImportanceWeights = dataclasses.field(
        default="none", metadata={"help": "weight pairs by capped inverse logged propensity"})
    importance_cap: float = 100.0
    seed: int = dataclasses.field(default=0, metadata={"help": "seed of the learner's dropout masks"})

    def __post_init__(self) -> None:
        check_float(self, "gamma", low=0.0, high=1.0, high_open=True)
        check_float(self, "lr", low=0.0, low_open=True)
        check_float(self, "weight_decay", low=0.0)
        if self.max_grad_norm is not None:
            check_float(self, "max_grad_norm", low=0.0, low_open=True)
        check_ints(self, batch_size=(1, MAX_BATCH), target_every=(1, MAX_STEPS))
        check_float(self, "target_beta", low=0.0, high=1.0)
        check_choice(self, "td_loss", TDLoss)
        check_float(self, "huber_delta", low=0.0, low_open=True)
        check_float(self, "alpha", low=0.0, low_open=True)
        check_choice(self, "alpha_schedule", AlphaSchedule)
        check_float(self, "alpha_final", low=0.0, low_open=True)
        check_int(self, "alpha_decay_steps", 1, MAX_STEPS)
        check_float(self, "target_entropy_ratio", low=0.0, high=1.0, low_open=True)
        check_float(self, "alpha_lr", low=0.0, low_open=True)
        check_choice(self, "importance_weights", ImportanceWeights)
        check_float(self, "importance_cap", low=1.0)
        check_int(self, "seed", 0, MAX_SEED)


# ---------------------------------------------------------------- the soft-Q agent's learning machinery
# What memento.learn (labels, listwise loss, per-case evidence, set choice) reads; the soft-Q policy's own config,
# memento.policies.soft_q.SoftQConfig, nests these three.

LabelTarget = Literal["gold", "hindsight"]
"""What online labels score (``OnlineLabelsConfig.target``): ``"gold"``, the task's gold answer when it has one
(else the hindsight target); ``"hindsight"``, only the planner's own output when the judge rewarded it."""


LabelWhen = Literal["always", "informative"]
"""Which steps online labels score (``OnlineLabelsConfig.when``): ``"always"`` every ``every``-th step;
``"informative"`` only those where a label can tell the agent something it does not know yet (see
:class:`OnlineLabelsConfig`)."""

@dataclasses.dataclass(frozen=True, kw_only=True)
class OnlineLabelsConfig:
    """Per-candidate planner labels online (EPR / LLM-R brought into the loop; docs/training.md, "From
    planner-scored labels").

    After a task is judged, the run scores the ``m`` candidates the policy ranked highest (by its probabilities
    over the pool it chose from), each *alone* as the only demonstration, with the frozen planner: the
    length-normalised log-likelihood of a target answer (``planner.score_many``, no generation; one batch).
    ``target="gold"`` scores the task's gold answer (``task.answers[0]``) when it has one and otherwise, as
    ``"hindsight"`` always does, the planner's own output when the judge rewarded it (which case makes a rewarded
    answer most likely); a task with neither gets no labels. The soft-Q agent keeps the labelled rows in a
    buffer of ``capacity`` tasks and adds to each gradient step on the shared reward ``weight`` times the
    listwise loss ``memento train --from-labels`` uses, ``KL(softmax(score / tau) || softmax(Q / alpha))`` over a
    task's ``m`` candidates, on ``batch_size`` labelled tasks.

    - ``m``: candidates scored per labelled task (0: no labels, this class's default; the QA loop's soft-Q default
      is 8, :func:`memento.runs.qa.qa_policy`); ``every``: label every n-th step; ``when``: ``"always"`` scores the
      top ``m`` on each such step, ``"informative"`` (default) only on a step that failed or showed a case never
      labelled, and then only the never-labelled ones of the top ``m`` beside the top case (what a label can still
      teach: the cost falls as the per-case evidence fills in);
    - ``target``, ``tau``, ``weight``, ``capacity``, ``batch_size``: as above;
    - ``budget``: the most scored prompts (singles and sets) per task on average since the run's start; a step
      whose labels would take the count past ``budget * steps`` is not labelled (``None``: no limit). The count
      is the run's ``label_passes`` counter, part of its checkpoint, so a resumed run labels the same steps.
    """

    m: int = dataclasses.field(default=0, metadata={"help": (
        "per-candidate planner labels online: score the top-M candidates each alone after a task (0: off)")})
    every: int = dataclasses.field(default=1, metadata={"help": "label every N-th task only"})
    when: LabelWhen = dataclasses.field(default="informative", metadata={"help": (
        "always: label every (every-th) step; informative: only a step that failed or showed a case never "
        "labelled, scoring the never-labelled ones of the top M beside the top case")})
    target: LabelTarget = dataclasses.field(default="gold", metadata={"help": (
        "what the labels score: gold (the task's gold answer; the planner's own output when the judge rewarded it "
        "where a task has none) or hindsight (only the rewarded outputs: no gold answer used)")})
    tau: float = 1.0
    weight: float = 1.0
    capacity: int = 2048
    batch_size: int = 16
    budget: float | None = dataclasses.field(default=None, metadata={"help": (
        "at most this many scored prompts per task on average, counted from the run's start (a step whose labels "
        "would exceed it is not labelled); none: no limit")})

    def __post_init__(self) -> None:
        cls = type(self)
        check_int(self, "m", 0)
        check(self.m <= 256, cls, "m", self.m, "must be <= 256 (scored prompts per task)")
        check_int(self, "every", 1, MAX_STEPS)
        check_choice(self, "when", LabelWhen)
        check_choice(self, "target", LabelTarget)
        check_float(self, "tau", low=0.0, low_open=True)
        check_float(self, "weight", low=0.0)
        check_int(self, "capacity", 1)
        check(self.capacity <= 1_000_000, cls, "capacity", self.capacity, "must be <= 1000000")
        check_int(self, "batch_size", 1, MAX_BATCH)
        if self.budget is not None:
            check_float(self, "budget", low=0.0)

    @property
    def active(self) -> bool:
        """Whether the run labels candidates (``m >= 2``: one candidate has nothing to rank)."""
        return self.m >= 2


SetSizes = Literal["fixed", "reward", "labels"]
"""How many cases a soft-Q decision shows (``SetChoiceConfig.sizes``): ``"fixed"`` always K; ``"reward"`` a size
drawn by what the shown sets of each size earned; ``"labels"`` the size whose set the planner's set-level labels
value most."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvidenceConfig:
    """Per-case evidence (:mod:`memento.learn.evidence`): what the planner's labels said about *this* case, kept in the
    bank beside its usage and added to the embedding Q-network's score, ``Q'(s, c) = Q(s, c) + weight * (e(c) -
    ē(c))``, where ``ē(c)`` is the kernel-weighted mean evidence of ``c``'s look-alikes among the candidates (itself
    included; :func:`memento.learn.evidence.relative_evidence`), so the term reorders look-alikes and moves nothing
    else.

    A labelled candidate's evidence is its label advantage over its *look-alike* rivals in the same labelled set,
    each rival weighted by ``exp((cos(c, c') - 1) / bandwidth)`` on the two cases' question embeddings (a case
    worded like it weighs 1, an unrelated one almost 0: what tells two look-alike cases apart is exactly what a Q
    over embeddings cannot learn); ``e(c)`` is the summed weighted advantage over the summed weights plus
    ``prior`` (shrunk towards 0 while evidence is thin). A case never labelled has ``e(c) = 0``; one whose look-alikes
    were not labelled either ranks as the embedding part says. Measured on contradicting memories, ``e(c)`` added
    as it is lifted a case that beat its own stale look-alikes by a wide margin above the right cases of other
    tasks (docs/benchmarks.md, issue 39).

    - ``weight``: Q units per nat (per answer token) of label advantage; 0 turns the term off;
    - ``bandwidth``: the look-alike kernel's width in cosine; ``prior``: pseudo-weight of the shrinkage.
    """

    weight: float = dataclasses.field(default=2.0, metadata={"help": (
        "per-case evidence: Q units per nat of label advantage over look-alike cases (0: off)")})
    bandwidth: float = dataclasses.field(default=0.05, metadata={"help": (
        "per-case evidence: width in cosine of the look-alike kernel exp((cos - 1) / bandwidth)")})
    prior: float = dataclasses.field(default=1.0, metadata={"help": (
        "per-case evidence: pseudo-weight that shrinks thin evidence towards 0")})

    def __post_init__(self) -> None:
        check_float(self, "weight", low=0.0)
        check_float(self, "bandwidth", low=0.0, low_open=True)
        check_float(self, "prior", low=0.0, low_open=True)

    @property
    def active(self) -> bool:
        return self.weight > 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class SetChoiceConfig:
    """Which set a soft-Q decision shows (:mod:`memento.learn.evidence`), beyond ranking single cases.

    - ``redundancy``: a candidate whose question embedding has cosine >= this with a case already drawn for the set,
      and less per-case evidence than it, is not drawn beside it (two look-alike cases are a contradiction or a
      repeat, and the evidence says which to keep; look-alikes nothing tells apart yet are both allowed); 1.0
      keeps only exact duplicates out (a value above 1 turns it off). Draws stay exact: each draw is a softmax over
      the candidates still allowed, and the selection's ``set_prob`` is the product of those draws' probabilities;
    - ``sizes``: ``"fixed"`` (default) shows K cases: measured, a learned size cost ``elements-real`` 8 points late
      (docs/benchmarks.md, issue 39). The other two choose among the sizes ``arms`` (spread over 1..K, 1 and K
      included), separately in each context of what the per-case evidence says of the policy's top case
      (:func:`memento.learn.evidence.set_context`: none yet, it beat its look-alikes, it lost to them):
      ``"reward"`` draws the size from ``softmax(m(n) / explore)``, ``m(n)`` the mean reward of the sets
      of size ``n`` shown in that context so far, shrunk with ``prior`` pseudo-counts towards ``prior_mean``, and
      ``prior_mean + bonus`` for the size the prior leans to (:func:`memento.learn.evidence.leaning`: 1 when the top
      case beat its look-alikes, else K, so a fresh agent mostly shows K cases, as Memento); the draw's
      probability is part of the selection's ``set_prob``. ``"labels"`` shows the size with the highest value
      ``V(n)``, learned from set-level labels: on a labelled step the planner also scores the prefixes of the
      sizes ``arms`` of the policy's ranking against the same target, and ``V`` moves by ``lr`` along the listwise
      loss ``KL(softmax(score / tau) || softmax(V / tau))``; ``V`` starts at 0, ties going to the larger size.
      Measured on contradicting memories, the gold answer's likelihood rises with more cases of the right format
      around the current one while greedy answers copy them (docs/benchmarks.md, issue 39): ``"labels"`` kept
      showing 4 where one is best;
    - ``arms``: how many sizes are considered (their prefixes cost one forward pass each with ``"labels"``).
    """

    redundancy: float = dataclasses.field(default=0.95, metadata={"help": (
        "a case whose question has cosine >= this with a shown case, and less per-case evidence, is not shown "
        "beside it (above 1: off)")})
    sizes: SetSizes = dataclasses.field(default="fixed", metadata={"help": (
        "fixed: always show K cases; reward: a size drawn by what shown sets of each size earned; labels: the size "
        "whose set the planner's set-level labels value most")})
    arms: int = dataclasses.field(default=3, metadata={"help": "set sizes considered (spread over 1..K)"})
    explore: float = 0.05
    prior: float = 2.0
    prior_mean: float = 0.5
    bonus: float = 0.2
    tau: float = 0.5
    lr: float = 0.5

    def __post_init__(self) -> None:
        check_float(self, "redundancy", low=0.0, low_open=True, high=2.0)
        check_choice(self, "sizes", SetSizes)
        check_int(self, "arms", 1, MAX_K)
        check_float(self, "explore", low=0.0, low_open=True)
        check_float(self, "prior", low=0.0, low_open=True)
        check_float(self, "prior_mean", low=0.0, high=1.0)
        check_float(self, "bonus", low=0.0, high=1.0)
        check_float(self, "tau", low=0.0, low_open=True)
        check_float(self, "lr", low=0.0)

    def arm_sizes(self, k: int) -> tuple[int, ...]:
        """The set sizes considered for a decision of at most ``k`` cases: ``arms`` sizes spread over ``1..k`` (1 and
        ``k`` included); ``(k,)`` when the sizes are fixed or ``k == 1``."""
        if self.sizes == "fixed" or k <= 1:
            return (k,)
        n = min(self.arms, k)
        return (k,) if n == 1 else tuple(sorted({1 + i * (k - 1) // (n - 1) for i in range(n)}))

    def scored_sizes(self, k: int) -> tuple[int, ...]:
        """The set sizes a labelled step scores (``sizes="labels"`` only; none otherwise)."""
        return self.arm_sizes(k) if self.sizes == "labels" and k > 1 else ()


NO_EVIDENCE = EvidenceConfig(weight=0.0)
"""Per-case evidence off: the Q-network's score alone (:class:`memento.policies.soft_q.SoftQConfig`'s own
default; the QA loop turns it on)."""
FIXED_SETS = SetChoiceConfig(sizes="fixed", redundancy=2.0)
"""K cases drawn by Gumbel-top-k, look-alikes allowed (:class:`memento.policies.soft_q.SoftQConfig`'s own default,
Memento's choice; the QA loop learns the set)."""
