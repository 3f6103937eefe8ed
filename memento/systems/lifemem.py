"""LifeMem (lifelong experience reuse): workflow clusters of trajectories, adaptive split, distilled skills.

Every LLM call goes through :meth:`memento.systems.llm.MemoryLLM.ask` with one of the
:class:`~memento.systems.llm.BuilderTemplates`; every item is made with :func:`memento.systems.items.make_item`
(``system="lifemem"``) and written with ``bank.add(..., allow_duplicates=True)`` (a new version may repeat an
earlier one's text; it is still a new entry).

**Items.** A cluster with id ``cid`` (``"0"``, ``"1"``, ... in order of creation) is the group
``"cluster:<cid>"``: one ``cluster`` entry per version, ``state`` its description, ``action`` a summary
(``"<n> trajectories: <first lines of the first three>"``), ``meta.members`` the trajectory ids in the order they
joined, ``meta.cluster = cid``, ``sources`` = the members; its vector is the normalised mean of the members'
vectors. Its skills are the group ``"skills:<cid>"``: several ``skill`` entries sharing the version of the cluster
entry they belong to, ``state`` the cluster description, ``action`` one rule, ``meta.cluster = cid``,
``meta.distilled_at`` the cluster's size when the rules were written, ``sources = [that cluster entry's id]``,
the cluster entry's vector. Nothing is edited: each change is a new version (:class:`~memento.systems.items.
ItemGraph` tells the active one), so the bank truncated to a checkpoint holds every earlier state exactly.

**Trajectories** are raw bank entries (``kind == "case"``) whose ``meta.granularity`` is ``"episode"`` or unset
(the game loop's step cases are not trajectories); their vectors are the bank's (unit) vectors.

**Procedure** (:meth:`WorkflowClusters.add_trajectory`):

a. *Pending.* While no cluster exists, the pending trajectories are every trajectory the bank holds up to and
   including the one just given (in bank order). Fewer than ``init_size`` (paper: 5): nothing is done.
b. *Initial clustering.* At ``init_size`` pending trajectories, one ``cluster_init`` call lists them numbered
   1..n (a trajectory's text: ``"<its state's first line> -> <its action>"``, whitespace collapsed, cut to
   ``trajectory_max_chars``) and :func:`parse_groups` reads ``"1,3: desc; 2: desc"``. A group spanning several
   environments is split by environment (a cluster keeps to one environment), each part keeping the
   description. A trajectory in no group gets its own cluster.
c. *Assignment.* Each later trajectory takes its ``neighbours`` (paper: 4) nearest clustered trajectories by
   cosine (members of the active clusters of its environment when it has one, else of all), collects their
   clusters (deduplicated, nearest first), and one ``cluster_assign`` call lists them numbered 1..m with their
   descriptions: ``ADD n`` joins cluster n, ``NEW`` founds a cluster
   (:func:`~memento.systems.llm.parse_choice`). With no clustered trajectory of its environment it founds a
   cluster without a call. Then one ``cluster_describe`` call on the cluster's members (the 8 most recent in
   the prompt) refreshes the description and the new cluster version is written.
d. *Adaptive split.* After an ADD, when :func:`should_split` holds (``n > L`` members, paper ``L = 50``, and
   their mean resultant length ``R`` (:func:`mean_resultant_length`) below ``tau``, paper 0.95), one
   ``cluster_split`` call lists all members and asks for ``split_min``..``split_max`` (paper 3-6) sub-workflows.
   A member in no group joins the group of its nearest grouped member (cosine). Each group becomes a new cluster
   (``meta.split_from``) and the old cluster gets a final version with no members (``meta.split_into`` the new
   ids), which retrieval ignores; its old skills are no longer reached through any active cluster.
e. *Skills.* With ``skills_every="double"`` a cluster's skills are distilled when it has none yet, and again
   each time its size reaches a new power of two since the last distillation (1, 2, 4, 8, ...);
   with ``"always"`` at every change. One ``skills`` call (description, the 8 most recent members,
   ``skills_min``..``skills_max``, paper 3-5) read by :func:`~memento.systems.llm.parse_items` (at most
   ``skills_max``) gives one skill entry per rule. When the cluster changes without a distillation, its active
   rules are carried over to the new cluster version (same rules, no call, ``meta.carried = True``), so the
   active skills always hang from the active cluster entry (the candidate expansion follows the active
   cluster's children).

**Rebuild rule.** The bank is the only state: every decision above reads the
:class:`~memento.systems.items.ItemGraph` of the bank (active versions, members, the pending trajectories of a),
so ``WorkflowClusters(llm, bank, config)`` over a reopened (or truncated) bank continues exactly as the
original would, given the same trajectories in the same order (and the same replies: a deterministic planner,
or the reply cache). A trajectory given again, or already in a cluster, changes nothing.

**Fallbacks** (each logs a warning; a bad reply never crashes and never writes a bad item):

- ``cluster_init`` with no usable group: all pending trajectories form one cluster described by a
  ``cluster_describe`` call;
- ``cluster_assign`` with no decision (neither ``ADD n`` in range nor ``NEW``): ADD to the nearest neighbour's
  cluster;
- ``cluster_describe`` with no sentence: the old description of a grown cluster; the first line of its first
  trajectory for a new one (an empty member list asks nothing);
- a group of ``cluster_init`` or ``cluster_split`` without a description: a ``cluster_describe`` call, then the
  first line of its first trajectory;
- ``cluster_split`` with no usable grouping, or fewer than ``split_min`` / more than ``split_max`` groups:
  seeded spherical k-means into ``split_min`` groups (:func:`spherical_kmeans`: deterministic, farthest-point
  initialisation from the first member); fewer than 2 non-empty groups, or fewer members than ``split_min``:
  no split;
- ``skills`` with no usable rule: the previous rules stay (carried over to the new cluster version when there
  are some; nothing written when there are none), and the next change distils again; fewer than
  ``skills_min`` rules are kept as they are (a small planner writes few).
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np

from memento.config import check, check_choice, check_float, check_int, check_ints, from_dict
from memento.errors import ConfigError, DataFormatError, ReplyFormatError
from memento.systems.items import ItemGraph, make_item
from memento.systems.llm import parse_choice, parse_items
from memento.types import Case

__all__ = [
    "LifeMemConfig",
    "SkillsSchedule",
    "WorkflowClusters",
    "is_trajectory",
    "mean_resultant_length",
    "parse_groups",
    "should_split",
    "spherical_kmeans",
]

logger = logging.getLogger(__name__)

SYSTEM = "lifemem"
PROMPT_MEMBERS = 8
"""At most this many (most recent) members are shown to ``cluster_describe`` and ``skills``."""
SUMMARY_MEMBERS = 3
LINE_MAX_CHARS = 120
DESCRIPTION_MAX_CHARS = 200
KMEANS_ITERATIONS = 25

SkillsSchedule = Literal["double", "always"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class LifeMemConfig:
    """LifeMem's builder settings (see the module docstring; the defaults are the paper's)."""

    init_size: int = 5
    neighbours: int = 4
    split_size: int = 50
    split_tau: float = 0.95
    split_min: int = 3
    split_max: int = 6
    skills_min: int = 3
    skills_max: int = 5
    trajectory_max_chars: int = 600
    skills_every: SkillsSchedule = "double"

    def __post_init__(self) -> None:
        cls = type(self)
        check_ints(self, init_size=1, neighbours=1, split_size=1)
        check_float(self, "split_tau", low=0.0, high=1.0)
        check_ints(self, split_min=2, split_max=2)
        check(self.split_max >= self.split_min, cls, "split_max", self.split_max,
              f"must be >= split_min ({self.split_min})")
        check_ints(self, skills_min=1, skills_max=1)
        check(self.skills_max >= self.skills_min, cls, "skills_max", self.skills_max,
              f"must be >= skills_min ({self.skills_min})")
        check_int(self, "trajectory_max_chars", 1)
        check_choice(self, "skills_every", SkillsSchedule)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LifeMemConfig:
        """From a dict (missing fields keep their defaults; an unknown field or a bad value: ConfigError)."""
        return from_dict(cls, data)


# ---------------------------------------------------------------------- numbers


def _rows_normalised(x_ND: Any, what: str) -> np.ndarray:
    x = np.asarray(x_ND, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] == 0 or x.shape[1] == 0:
        raise DataFormatError(f"{what}: expected a non-empty [N, D] array, got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise DataFormatError(f"{what}: the vectors are not all finite")
    norms_N = np.linalg.norm(x, axis=1)
    if np.any(norms_N == 0.0):
        raise DataFormatError(f"{what}: row {int(np.argmin(norms_N))} is a zero vector")
    return x / norms_N[:, None]


def mean_resultant_length(x_ND: Any) -> float:
    """``R = ||mean_i x_i / ||x_i||| |`` in [0, 1]: 1 for identical directions, near 0 for dispersed ones.

    An empty array or a zero row raises :class:`~memento.errors.DataFormatError`."""
    unit_ND = _rows_normalised(x_ND, "mean_resultant_length")
    return min(1.0, float(np.linalg.norm(unit_ND.mean(axis=0))))


def should_split(n: int, r: float, *, size: int = 50, tau: float = 0.95) -> bool:
    """LifeMem's split rule: more than ``size`` members and a mean resultant length below ``tau``."""
    return n > size and r < tau


def spherical_kmeans(x_ND: Any, k: int, *, iterations: int = KMEANS_ITERATIONS) -> list[list[int]]:
    """Deterministic spherical k-means: the non-empty groups of row indices (each in row order, the groups in
    order of their first row).

    Initial centres by farthest point from row 0 (each next centre the row least similar to its nearest chosen
    centre, the first among ties); then rows join their most similar centre (the first among ties) and each
    centre becomes its group's normalised mean (an empty group keeps its centre), until nothing moves."""
    unit_ND = _rows_normalised(x_ND, "spherical_kmeans")
    n = unit_ND.shape[0]
    if k < 1:
        raise ConfigError(f"spherical_kmeans: k must be >= 1, got {k}")
    k = min(k, n)
    chosen = [0]
    best_N = unit_ND @ unit_ND[0]
    while len(chosen) < k:
        best_N[chosen] = np.inf
        nxt = int(np.argmin(best_N))
        chosen.append(nxt)
        best_N = np.maximum(best_N, unit_ND @ unit_ND[nxt])
    centres_KD = unit_ND[chosen].copy()
    labels_N = np.full(n, -1, dtype=np.int64)
    for _ in range(max(1, iterations)):
        new_N = np.argmax(unit_ND @ centres_KD.T, axis=1)
        if np.array_equal(new_N, labels_N):
            break
        labels_N = new_N
        for j in range(k):
            rows = labels_N == j
            if rows.any():
                mean_D = unit_ND[rows].mean(axis=0)
                norm = float(np.linalg.norm(mean_D))
                if norm > 0.0:
                    centres_KD[j] = mean_D / norm
    groups: dict[int, list[int]] = {}
    for row, label in enumerate(labels_N.tolist()):
        groups.setdefault(label, []).append(row)
    return list(groups.values())


def _unit_mean(x_ND: np.ndarray) -> np.ndarray:
    """The normalised mean of unit rows (the first row when they cancel out)."""
    unit_ND = _rows_normalised(x_ND, "lifemem cluster vector")
    mean_D = unit_ND.mean(axis=0)
    norm = float(np.linalg.norm(mean_D))
    return (mean_D / norm if norm > 1e-9 else unit_ND[0]).astype(np.float32)


# ---------------------------------------------------------------------- replies

_GROUP_TOKEN = re.compile(r"#?(\d+)(?:-(\d+))?")
_GROUP_WORD = re.compile(r"^(?:trajector(?:y|ies)|numbers?|nos?\.?)\s*", re.IGNORECASE)
_BULLET = re.compile(r"^\s*(?:[-*\u2022]\s+|\(\s*)")


def _clean_text(text: str) -> str:
    text = " ".join(text.split()).strip(" \"'`").rstrip(",.;").strip(" \"'`").strip()
    return text[:DESCRIPTION_MAX_CHARS].rstrip()


def parse_groups(text: str, n: int) -> list[tuple[list[int], str]]:
    """The groups of a ``"1,3: description; 2: description"`` reply over ``n`` numbered trajectories.

    Groups are separated by ``;`` or new lines; a group is its numbers (``1,3``, ``1 and 3``, ``2-4``), a
    ``:``, and its description (may be empty). Indices are 0-based; a number out of ``1..n`` or already used by
    an earlier group is dropped, and a group left without a number is dropped. No group at all:
    :class:`~memento.errors.ReplyFormatError`."""
    if not isinstance(text, str):
        raise ReplyFormatError(f"cluster groups: the reply is not text ({type(text).__name__})")
    used: set[int] = set()
    out: list[tuple[list[int], str]] = []
    for line in text.splitlines():
        for part in line.split(";"):
            head, colon, tail = part.partition(":")
            if not colon:
                continue
            head = _BULLET.sub("", head).strip().rstrip(")").strip()
            head = _GROUP_WORD.sub("", head)
            head = re.sub(r"\s*-\s*", "-", re.sub(r"&|\band\b", ",", head, flags=re.IGNORECASE))
            tokens = [token for token in re.split(r"[,\s]+", head) if token]
            matches = [_GROUP_TOKEN.fullmatch(token) for token in tokens]
            if not tokens or not all(matches):
                continue
            indices: list[int] = []
            for match in matches:
                assert match is not None
                low = int(match.group(1))
                high = int(match.group(2)) if match.group(2) else low
                if high < low or high - low > n:
                    high = low
                for number in range(low, high + 1):
                    index = number - 1
                    if 0 <= index < n and index not in used:
                        used.add(index)
                        indices.append(index)
            if indices:
                out.append((indices, _clean_text(tail)))
    if not out:
        raise ReplyFormatError(f"cluster groups: no 'numbers: description' group in {text[:80]!r}")
    return out


def _description(text: Any) -> str | None:
    """A one-sentence reply's description (its first line with a letter), or None."""
    if not isinstance(text, str):
        return None
    for line in text.splitlines():
        line = _clean_text(line)
        if len(line) >= 3 and any(ch.isalpha() for ch in line):
            return line
    return None


# ---------------------------------------------------------------------- trajectories


def is_trajectory(case: Case) -> bool:
    """A raw case whose ``meta.granularity`` is ``"episode"`` or unset."""
    return case.kind == "case" and case.meta.get("granularity", "episode") == "episode"


def _first_line(case: Case) -> str:
    line = next((ln for ln in case.state.splitlines() if ln.strip()), case.state)
    line = " ".join(line.split())
    return line if len(line) <= LINE_MAX_CHARS else line[:LINE_MAX_CHARS - 3].rstrip() + "..."


def _is_cluster(case: Case) -> bool:
    return case.kind == "cluster" and case.meta.get("system") == SYSTEM and isinstance(case.meta.get("cluster"), str)


class WorkflowClusters:
    """LifeMem's workflow clusters and skills over a bank (see the module docstring).

    ``graph`` is the bank's :class:`~memento.systems.items.ItemGraph` when the caller keeps one (it is updated
    with every entry written here); by default it is read from the bank. ``accepts``: which of the bank's
    trajectories the initial clustering takes (default: all; the question-answering loop clusters its own answers,
    not a seed bank's cases)."""

    def __init__(self, llm: Any, bank: Any, config: LifeMemConfig | None = None, *, graph: ItemGraph | None = None,
                 accepts: Callable[[Case], bool] | None = None):
        if config is None:
            config = LifeMemConfig()
        if not isinstance(config, LifeMemConfig):
            raise ConfigError(f"lifemem: config must be a LifeMemConfig, got {type(config).__name__}")
        self.llm = llm
        self.bank = bank
        self.config = config
        self.graph = graph if graph is not None else ItemGraph.from_bank(bank)
        self.accepts = accepts
        self._written: list[Case] = []

    # ------------------------------------------------------------------ views

    def clusters(self, env: str | None = None) -> list[Case]:
        """The active cluster entries with members (of ``env`` when given), in order of writing."""
        return [c for c in self.graph.active("cluster", env=env) if _is_cluster(c) and c.meta.get("members")]

    def cluster(self, cid: str) -> Case | None:
        """The active entry of cluster ``cid`` (None: no such cluster)."""
        latest = self.graph.latest(f"cluster:{cid}")
        return latest[0] if latest else None

    def members(self, cid: str) -> list[str]:
        """The trajectory ids of cluster ``cid`` (empty: emptied by a split, or no such cluster)."""
        entry = self.cluster(cid)
        return list(entry.meta.get("members", [])) if entry is not None else []

    def cluster_of(self, trajectory_id: str) -> str | None:
        """The id of the active cluster holding ``trajectory_id`` (None: not clustered)."""
        for child in self.graph.children(trajectory_id, "cluster"):
            if _is_cluster(child) and trajectory_id in child.meta.get("members", []):
                return str(child.meta["cluster"])
        return None

    def skills_of(self, cid: str) -> list[Case]:
        """The active skills of cluster ``cid`` (empty when it has none or was split)."""
        entry = self.cluster(cid)
        if entry is None or not entry.meta.get("members"):
            return []
        return [s for s in self.graph.latest(f"skills:{cid}") if s.kind == "skill"]

    def pending(self, upto: str | None = None) -> list[str]:
        """The trajectories waiting for the initial clustering: before any cluster exists, every trajectory the
        bank holds up to and including ``upto`` (all when None); after it, none."""
        if self._started():
            return []
        out: list[str] = []
        for case_id, case in self.graph.cases.items():
            if is_trajectory(case) and (self.accepts is None or self.accepts(case)):
                out.append(case_id)
            if case_id == upto:
                break
        return out

    # ------------------------------------------------------------------ helpers

    def _started(self) -> bool:
        return any(_is_cluster(c) for c in self.graph.cases.values())

    def _case(self, case_id: str) -> Case:
        case = self.graph.cases.get(case_id)
        if case is None:  # written to the bank behind the graph's back: read what it lacks, in bank order
            for stored in self.bank.iter_cases():
                if stored.id not in self.graph:
                    self.graph.add(stored)
            case = self.graph.cases.get(case_id)
            if case is None:
                raise DataFormatError(f"lifemem: the bank holds no case {case_id!r}")
        return case

    def _text(self, case: Case) -> str:
        text = " ".join(f"{_first_line(case)} -> {case.action}".split())
        limit = self.config.trajectory_max_chars
        return text if len(text) <= limit else text[:limit].rstrip()

    def _numbered(self, cases: Sequence[Case]) -> str:
        return "\n".join(f"{i}. {self._text(case)}" for i, case in enumerate(cases, start=1))

    def _vectors(self, ids: Sequence[str]) -> np.ndarray:
        return np.asarray(self.bank.embeddings(list(ids)), dtype=np.float64)

    def _new_cid(self) -> str:
        used = {str(c.meta["cluster"]) for c in self.graph.cases.values() if _is_cluster(c)}
        number = len(used)
        while str(number) in used:
            number += 1
        return str(number)

    def _write(self, items: list[Case], vectors_ND: np.ndarray) -> list[Case]:
        ids = self.bank.add(items, np.asarray(vectors_ND, dtype=np.float32), allow_duplicates=True)
        out = [dataclasses.replace(item, id=case_id) for item, case_id in zip(items, ids)]
        for item in out:
            self.graph.add(item)
        self._written.extend(out)
        return out

    def _describe(self, members: Sequence[Case], fallback: str) -> str:
        if not members:
            return fallback
        reply = self.llm.ask("cluster_describe", trajectories=self._numbered(list(members)[-PROMPT_MEMBERS:]))
        description = _description(reply)
        if description is None:
            logger.warning("lifemem cluster_describe: no description in %r; keeping %r", str(reply)[:80], fallback)
            return fallback
        return description

    def _write_cluster(self, cid: str, description: str, members: Sequence[Case], *, vector_D: np.ndarray | None = None,
                       env: str | None = None, **meta: Any) -> Case:
        ids = [m.id or "" for m in members]
        if members:
            envs = {m.env for m in members}
            env = envs.pop() if len(envs) == 1 else None
            lines = [_first_line(m) for m in members[:SUMMARY_MEMBERS]]
            action = f"{len(members)} trajectories: " + "; ".join(lines) + ("; ..." if len(members) > SUMMARY_MEMBERS
                                                                              else "")
            vector_D = _unit_mean(self._vectors(ids))
        else:
            into = meta.get("split_into") or []
            action = "0 trajectories" + (f" (split into clusters {', '.join(into)})" if into else "")
        assert vector_D is not None
        group = f"cluster:{cid}"
        item = make_item("cluster", description, action, system=SYSTEM, sources=ids, env=env, group=group,
                         version=self.graph.version(group) + 1, members=ids, cluster=cid, **meta)
        [entry] = self._write([item], vector_D[None, :])
        return entry

    def _member_cases(self, entry: Case) -> list[Case]:
        return [self._case(m) for m in entry.meta.get("members", [])]

    # ------------------------------------------------------------------ skills

    def _skills_due(self, entry: Case) -> bool:
        n = len(entry.meta.get("members", []))
        previous = self.graph.latest(f"skills:{entry.meta['cluster']}")
        if not previous or self.config.skills_every == "always":
            return True
        last = previous[0].meta.get("distilled_at")
        last = last if isinstance(last, int) and last > 0 else 0
        return n.bit_length() > last.bit_length()

    def _skills(self, entry: Case) -> list[Case]:
        """Distil (when due) or carry over the skills of the newly written cluster version ``entry``."""
        members = self._member_cases(entry)
        if not members:
            return []
        cid = str(entry.meta["cluster"])
        group = f"skills:{cid}"
        version = int(entry.meta.get("version", 0))
        vector_1D = self._vectors([entry.id or ""])
        cfg = self.config
        if self._skills_due(entry):
            reply = self.llm.ask("skills", description=entry.state,
                                 trajectories=self._numbered(members[-PROMPT_MEMBERS:]),
                                 min_items=cfg.skills_min, max_items=cfg.skills_max)
            try:
                rules = parse_items(reply, cfg.skills_max, what="skills")
            except ReplyFormatError as error:
                logger.warning("lifemem skills of cluster %s: %s; keeping the previous rules", cid, error)
            else:
                if len(rules) < cfg.skills_min:
                    logger.info("lifemem skills of cluster %s: %d rule(s), fewer than %d; kept", cid, len(rules),
                                cfg.skills_min)
                items = [make_item("skill", entry.state, rule, system=SYSTEM, sources=[entry.id or ""],
                                   env=entry.env, group=group, version=version, cluster=cid,
                                   distilled_at=len(members)) for rule in rules]
                out = self._write(items, np.repeat(vector_1D, len(items), axis=0))
                self.llm.count_items("skill", len(out))
                return out
        previous = [s for s in self.graph.latest(group) if s.kind == "skill"]
        if not previous or int(previous[0].meta.get("version", 0)) >= version:
            return []
        items = [make_item("skill", entry.state, s.action, system=SYSTEM, sources=[entry.id or ""], env=entry.env,
                           group=group, version=version, cluster=cid, distilled_at=s.meta.get("distilled_at", 0),
                           carried=True) for s in previous]
        return self._write(items, np.repeat(vector_1D, len(items), axis=0))

    # ------------------------------------------------------------------ the procedure

    def add_trajectory(self, case_id: str) -> list[Case]:
        """Add the bank's trajectory ``case_id`` (see the module docstring); the new bank entries written."""
        if not isinstance(case_id, str) or not case_id:
            raise DataFormatError(f"lifemem: a trajectory id must be a non-empty string, got {case_id!r}")
        case = self._case(case_id)
        if not is_trajectory(case):
            raise DataFormatError(f"lifemem: {case_id} is not a trajectory (kind {case.kind!r}, granularity "
                                  f"{case.meta.get('granularity')!r}; expected a raw case of granularity 'episode')")
        self._written = []
        if not self._started():
            pending = self.pending(case_id)
            if len(pending) < self.config.init_size:
                logger.debug("lifemem: %d of %d trajectories pending", len(pending), self.config.init_size)
                return []
            self._initial([self._case(i) for i in pending])
        elif self.cluster_of(case_id) is None:
            self._assign(case)
        written, self._written = self._written, []
        return written

    def _initial(self, pending: list[Case]) -> None:
        n = len(pending)
        reply = self.llm.ask("cluster_init", trajectories=self._numbered(pending))
        try:
            groups = parse_groups(reply, n)
        except ReplyFormatError as error:
            logger.warning("lifemem cluster_init: %s; one cluster of all %d trajectories", error, n)
            groups = [(list(range(n)), "")]
        grouped = {i for indices, _ in groups for i in indices}
        groups += [([i], "") for i in range(n) if i not in grouped]
        parts: list[tuple[list[Case], str]] = []
        for indices, description in groups:
            by_env: dict[str | None, list[Case]] = {}
            for i in indices:
                by_env.setdefault(pending[i].env, []).append(pending[i])
            parts.extend((members, description) for members in by_env.values())
        entries = []
        for members, description in parts:
            description = description or self._describe(members, _first_line(members[0]))
            entries.append(self._write_cluster(self._new_cid(), description, members))
        self.llm.count_items("cluster", len(entries))
        for entry in entries:
            self._skills(entry)
        logger.info("lifemem: %d trajectories -> %d initial clusters", n, len(entries))

    def _assign(self, case: Case) -> None:
        cfg = self.config
        options_all = [c for c in self.clusters() if case.env is None or c.env == case.env]
        cluster_of_member: dict[str, Case] = {}
        for entry in options_all:
            for member in entry.meta["members"]:
                cluster_of_member.setdefault(member, entry)
        member_ids = list(cluster_of_member)
        target: Case | None = None
        if member_ids:
            sims_M = self._vectors(member_ids) @ self._vectors([case.id or ""])[0]
            nearest = np.argsort(-sims_M, kind="stable")[:cfg.neighbours]
            options: list[Case] = []
            for i in nearest:
                option = cluster_of_member[member_ids[int(i)]]
                if all(option.id != seen.id for seen in options):
                    options.append(option)
            listing = "\n".join(f"{i}. {entry.state}" for i, entry in enumerate(options, start=1))
            reply = self.llm.ask("cluster_assign", trajectory=self._text(case), clusters=listing)
            try:
                choice = parse_choice(reply, len(options))
            except ReplyFormatError as error:
                logger.warning("lifemem cluster_assign for %s: %s; adding it to the nearest neighbour's cluster",
                               case.id, error)
                choice = 0
            target = None if choice is None else options[choice]
        else:
            logger.debug("lifemem: no clustered trajectory of env %r; %s founds a cluster", case.env, case.id)
        if target is None:
            entry = self._write_cluster(self._new_cid(), self._describe([case], _first_line(case)), [case])
            self.llm.count_items("cluster", 1)
            self._skills(entry)
            return
        cid = str(target.meta["cluster"])
        members = self._member_cases(target) + [case]
        entry = self._write_cluster(cid, self._describe(members, target.state), members)
        self.llm.count_items("cluster", 1)
        r = mean_resultant_length(self._vectors([m.id or "" for m in members]))
        if should_split(len(members), r, size=cfg.split_size, tau=cfg.split_tau) and self._split(entry, members):
            return
        self._skills(entry)

    def _split(self, entry: Case, members: list[Case]) -> bool:
        cfg = self.config
        n = len(members)
        cid = str(entry.meta["cluster"])
        if n < cfg.split_min:
            logger.info("lifemem: cluster %s has %d members, fewer than split_min=%d; not split", cid, n,
                        cfg.split_min)
            return False
        vectors_ND = self._vectors([m.id or "" for m in members])
        reply = self.llm.ask("cluster_split", trajectories=self._numbered(members), min_parts=cfg.split_min,
                             max_parts=cfg.split_max)
        groups: list[tuple[list[int], str]] | None = None
        try:
            parsed = parse_groups(reply, n)
        except ReplyFormatError as error:
            logger.warning("lifemem cluster_split of %s: %s; spherical k-means instead", cid, error)
        else:
            if cfg.split_min <= len(parsed) <= cfg.split_max:
                group_of = {i: g for g, (indices, _) in enumerate(parsed) for i in indices}
                grouped = list(group_of)
                unit_ND = vectors_ND / np.linalg.norm(vectors_ND, axis=1, keepdims=True)
                for i in range(n):
                    if i not in group_of:
                        sims_G = unit_ND[grouped] @ unit_ND[i]
                        parsed[group_of[grouped[int(np.argmax(sims_G))]]][0].append(i)
                groups = [(sorted(indices), description) for indices, description in parsed]
            else:
                logger.warning("lifemem cluster_split of %s: %d group(s), not %d..%d; spherical k-means instead",
                               cid, len(parsed), cfg.split_min, cfg.split_max)
        if groups is None:
            parts = spherical_kmeans(vectors_ND, cfg.split_min)
            if len(parts) < 2:
                logger.warning("lifemem: k-means found %d group(s) in cluster %s; not split", len(parts), cid)
                return False
            groups = [(part, "") for part in parts]
        new_entries = []
        for indices, description in groups:
            part = [members[i] for i in indices]
            description = description or self._describe(part, _first_line(part[0]))
            new_entries.append(self._write_cluster(self._new_cid(), description, part, split_from=cid))
        self.llm.count_items("cluster", len(new_entries))
        into = [str(e.meta["cluster"]) for e in new_entries]
        self._write_cluster(cid, entry.state, [], vector_D=self._vectors([entry.id or ""])[0], env=entry.env,
                            split_into=into)
        for new in new_entries:
            self._skills(new)
        logger.info("lifemem: cluster %s (%d members, R below %.3f) split into %s", cid, n, cfg.split_tau, into)
        return True
