"""``memento inspect``: a case-bank and run inspector in the browser (server-rendered HTML, no build step).

What it shows, for a run directory (``memento online``), a comparison directory (``comparison.json`` of
``memento online --policy A B`` / ``memento bench online``), a directory holding run directories, or an
exported selector (``memento export``):

- the overview: early / late / overall success per policy and per task family and policy, pooled over the runs
  of a policy, with the difference to the similarity policy when a run of it is here (and, per policy, the
  families where it is better or worse late); the spans are :func:`memento.runs.spans.success_spans`;
- the bank: search by text (``?q=``, encoded with the run's or artifact's encoder: nearest cases with their
  scores), filters by env / kind / reward, paging; a case page with its usage statistics (the bank's usage log,
  :meth:`memento.bank.local.CaseBank.usage_at`; for an artifact also its feedback log) and the steps that
  showed it;
- the steps of a run (``steps.jsonl``), filtered by ``failures=1``, ``family``, ``policy``; each step: the
  candidates, their probabilities, the chosen cases, the answer and the reward, with prev/next links;
- the learning curves of the run(s): inline SVG (:mod:`memento.charts`: moving success rate from the
  first full window on, learner loss).

Pages are Jinja2 templates (``memento/serve/templates``) with autoescape on, and carry no script at all
(``Content-Security-Policy: default-src 'none'``): case texts are untrusted input. A bad query value (a page
number that is no whole number, an unknown family, a parameter over 200 characters) is a 400 page of one
line. Banks are opened read-only, so a run or a server may keep writing while it is inspected.

FastAPI is the ``serve`` extra, imported only by :func:`inspect_app`. ``memento serve`` mounts the same pages
under ``/inspect`` (:meth:`Inspector.for_selector`), behind the server's token: the ``Authorization: Bearer``
header, a ``?token=`` query parameter (which also sets an HttpOnly cookie) or that cookie, set by the login
form the pages show when the token is missing. The cookie holds a value derived from the token
(:func:`cookie_value`, an HMAC), never the token, and the server's access log shows ``?token=<redacted>``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode

import numpy as np

from memento.bank import bankfile
from memento.bank.local import CaseBank
from memento.charts import svg_line_chart, windowed_success
from memento.errors import DataFormatError, EncoderError, MementoError, NotABankError, UnknownCaseError
from memento.extras import require
from memento.io import loads_json
from memento.runs.rundir import RunDir, read_json
from memento.runs.spans import LATE_STEPS, success_spans
from memento.selector.artifact import FEEDBACK_NAME, feedback_with_case, load_encoder
from memento.selector.artifact.manifest import MANIFEST_NAME, has_manifest
from memento.serve.pages import number_text as _num
from memento.serve.pages import short_text as _short
from memento.serve.pages import template_env
from memento.types import shown

__all__ = ["Inspector", "cookie_value", "inspect_app", "serve_inspector", "svg_line_chart"]

logger = logging.getLogger(__name__)

PAGE_SIZE = 25
MAX_SEARCH = 500
COOKIE = "memento_inspect_token"
_DEPTH = 3  # how deep a directory of runs is searched for run directories
BASELINE = "similarity"  # the overview's reference policy
MAX_PARAM = 200  # characters of a query parameter
MAX_PAGE = 10**9


# ---------------------------------------------------------------- what is inspected


@dataclass
class _BankView:
    """One bank: the open :class:`CaseBank` (for search, get, usage), its SQLite file (for listing), and
    optionally the artifact's feedback log and the run whose bank it is."""

    name: str
    bank: Any
    db: Path
    encoder: Callable[[], Any]
    feedback: Path | None = None
    refresh: bool = False


@dataclass
class _Steps:
    """The parsed ``steps.jsonl`` of a run, re-read when the file changes (a run in progress)."""

    path: Path
    stamp: tuple[int, int] | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)

    def read(self) -> list[dict[str, Any]]:
        if not self.path.is_file():
            return []
        st = self.path.stat()
        stamp = (st.st_size, st.st_mtime_ns)
        if stamp != self.stamp:
            rows = []
            with self.path.open("rb") as f:
                for number, line in enumerate(f, start=1):
                    if not line.strip():
                        continue
                    try:
                        row = loads_json(line)  # bad JSON of any kind (not UTF-8, nested too deeply): one error
                    except DataFormatError as error:
                        if not line.endswith(b"\n"):  # the line a running loop is writing now
                            break
                        raise DataFormatError(f"{self.path}:{number}: not JSON ({error.reason})") from None
                    if not isinstance(row, dict) or not isinstance(row.get("step"), int):
                        raise DataFormatError(f"{self.path}:{number}: not a step record")
                    rows.append(row)
            self.rows, self.stamp = rows, stamp
        return self.rows


def _load_encoder(config: Any, where: Path) -> Any:
    if config is None:
        raise EncoderError(f"{where}: the bank records no encoder (the run used a custom one); search by text "
                           "needs one: memento.serve.inspector.Inspector.open(PATH, encoder=...) from Python")
    from memento.encoders import Encoder

    return Encoder.from_config(config)


def _lazy(make: Callable[[], Any]) -> Callable[[], Any]:
    lock = threading.Lock()
    box: list[Any] = []

    def get() -> Any:
        with lock:
            if not box:
                box.append(make())
            return box[0]

    return get


class Inspector:
    """The data behind the pages: banks (by name), runs (by name, with their ``steps.jsonl``), a comparison.

    Build it with :meth:`open` (a directory) or :meth:`for_selector` (a loaded :class:`memento.Selector`);
    ``encoder``: encodes the search texts instead of the encoder the bank or the artifact records.
    """

    def __init__(self, *, title: str, banks: dict[str, _BankView], runs: dict[str, RunDir],
                 comparison: dict[str, Any] | None = None, owned: Sequence[Any] = ()):
        self.title = title
        self.banks = banks
        self.runs = runs
        self.comparison = comparison
        self._steps = {name: _Steps(run.steps) for name, run in runs.items()}
        self._owned = list(owned)
        self._comparisons: dict[Path, dict[str, Any] | None] = {}
        self.lock = threading.RLock()

    # ------------------------------------------------------------------ construction

    @classmethod
    def open(cls, path: str | Path, *, encoder: Any = None) -> Inspector:
        """A run directory, a comparison directory, a directory of runs, or a selector artifact."""
        root = Path(path)
        if not root.is_dir():
            raise NotABankError(f"{root}: not a directory (give a run directory or a selector artifact)")
        banks: dict[str, _BankView] = {}
        owned: list[Any] = []

        def add_bank(name: str, bank_dir: Path, *, encoder_of: Callable[[Any], Any],
                     feedback: Path | None = None) -> None:
            bank = CaseBank.open(bank_dir, read_only=True, use_gpu=False)
            owned.append(bank)
            get = (lambda: encoder) if encoder is not None else _lazy(lambda: encoder_of(bank))
            banks[name] = _BankView(name, bank, bank_dir / "cases.sqlite", get, feedback=feedback, refresh=True)

        if has_manifest(root) and (root / "bank").is_dir():  # a selector artifact
            feedback = root / FEEDBACK_NAME
            add_bank(root.name or str(root), root / "bank", encoder_of=lambda bank: load_encoder(root),
                     feedback=feedback if feedback.is_file() else None)
            return cls(title=f"selector {root}", banks=banks, runs={}, owned=owned)

        runs = cls._find_runs(root)
        if not runs:
            raise NotABankError(f"{root}: neither a run directory (config.json + bank/), a directory of runs, "
                                f"nor a selector artifact ({MANIFEST_NAME} + bank/)")
        comparison = None
        if (root / "comparison.json").is_file():
            comparison = read_json(root / "comparison.json")
        for name, run in runs.items():
            add_bank(name, run.bank, encoder_of=lambda bank: _load_encoder(bank.config.encoder, bank.path))
        kind = "run" if list(runs.values())[0].path == root else "runs"
        return cls(title=f"{kind} {root}", banks=banks, runs=runs, comparison=comparison, owned=owned)

    @staticmethod
    def _find_runs(root: Path) -> dict[str, RunDir]:
        if RunDir(root).is_run():
            return {root.resolve().name or "run": RunDir(root)}
        found: dict[str, RunDir] = {}
        if (root / "comparison.json").is_file():  # the comparison's order first
            try:
                order = read_json(root / "comparison.json").get("order", [])
            except (MementoError, AttributeError):
                order = []
            for name in order:
                if isinstance(name, str) and RunDir(root / name).is_run():
                    found[name] = RunDir(root / name)
        frontier = [root]
        for _ in range(_DEPTH):
            deeper = []
            for folder in frontier:
                for child in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")):
                    if RunDir(child).is_run():
                        found.setdefault(child.relative_to(root).as_posix(), RunDir(child))
                    else:
                        deeper.append(child)
            frontier = deeper
        return found

    @classmethod
    def for_selector(cls, selector: Any) -> Inspector:
        """The pages of a loaded selector (``memento serve`` mounts them under ``/inspect``)."""
        bank = getattr(selector, "bank", None)
        if getattr(selector, "path", None) is None or getattr(bank, "path", None) is None:
            return cls(title=f"selector {selector!r}", banks={}, runs={})  # nothing on disk to show
        path = Path(selector.path)
        feedback = path / FEEDBACK_NAME
        view = _BankView(path.name or str(path), bank, Path(bank.path) / "cases.sqlite",  # type: ignore[union-attr]
                         selector.encoder,
                         feedback=feedback if feedback.is_file() else None)
        return cls(title=f"selector {path}", banks={view.name: view}, runs={})

    def close(self) -> None:
        for thing in self._owned:
            thing.close()
        self._owned.clear()

    def __enter__(self) -> Inspector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ data

    def view(self, name: str | None) -> _BankView:
        if not self.banks:
            raise UnknownCaseError("no bank to inspect")
        if name is None or name == "":
            return next(iter(self.banks.values()))
        if name not in self.banks:
            raise UnknownCaseError(f"no bank named {name!r}")
        return self.banks[name]

    def steps(self, name: str | None) -> tuple[str, list[dict[str, Any]]]:
        if not self.runs:
            raise UnknownCaseError("no run to inspect (a selector artifact has no steps)")
        name = name or next(iter(self.runs))
        if name not in self.runs:
            raise UnknownCaseError(f"no run named {name!r}")
        return name, self._steps[name].read()

    def _comparison_of(self, name: str) -> dict[str, Any] | None:
        """The ``comparison.json`` beside a run (its parent directory's), if any."""
        path = self.runs[name].path.parent / "comparison.json"
        if path not in self._comparisons:
            try:
                found = read_json(path) if path.is_file() else None
            except MementoError:
                found = None
            self._comparisons[path] = found if isinstance(found, dict) else None
        return self._comparisons[path]

    def _config_of(self, name: str) -> dict[str, Any]:
        try:
            config = self.runs[name].read_config()
        except MementoError:
            config = None
        return config if isinstance(config, dict) else {}

    @staticmethod
    def _count(value: Any) -> int | None:
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None

    def window(self, name: str) -> int:
        """The run's ``window`` (its comparison's, else its config's, else 50): the early span, the curve's."""
        comparison = self._comparison_of(name) or self.comparison or {}
        return self._count(comparison.get("window")) or self._count(self._config_of(name).get("window")) or 50

    def late_steps(self, name: str) -> int:
        """The run's late span: its comparison's ``late_steps``, else :data:`memento.runs.spans.LATE_STEPS`."""
        comparison = self._comparison_of(name) or self.comparison or {}
        return self._count(comparison.get("late_steps")) or LATE_STEPS

    def label(self, name: str) -> str:
        """The policy a run stands for: its name in its comparison's ``order``, else its steps' ``policy``."""
        run_dir = self.runs[name].path.name
        order = (self._comparison_of(name) or {}).get("order")
        if isinstance(order, list) and run_dir in order:
            return run_dir
        _, rows = self.steps(name)
        policy = rows[0].get("policy") if rows else None
        if not isinstance(policy, str):
            policy = (self._config_of(name).get("policy") or {}).get("kind") \
                if isinstance(self._config_of(name).get("policy"), dict) else None
        return policy if isinstance(policy, str) and policy else name

    def step_values(self, name: str) -> tuple[list[str], list[str]]:
        """The families and the policies a run's steps hold (the steps list's filter menus)."""
        _, rows = self.steps(name)
        families = sorted({str(row["family"]) for row in rows if row.get("family") not in (None, "")})
        policies = sorted({str(row["policy"]) for row in rows if row.get("policy") not in (None, "")})
        return families, policies

    @staticmethod
    def filter_steps(rows: Sequence[dict[str, Any]], *, failures: bool = False, family: str | None = None,
                     policy: str | None = None) -> list[dict[str, Any]]:
        """The step records without a success (``failures``), of ``family``, of ``policy``."""
        return [row for row in rows if not (failures and row.get("success"))
                and (not family or str(row.get("family")) == family)
                and (not policy or str(row.get("policy")) == policy)]

    def overview(self, baseline: str = BASELINE) -> dict[str, Any]:
        """Early / late / overall success per policy and per task family and policy, pooled over the runs of a
        policy, with the difference to ``baseline`` (the similarity policy) when a run of it is here; the spans
        are :func:`memento.runs.spans.success_spans` of each run (its window and late steps)."""
        spans_seen: set[tuple[int, int]] = set()
        totals: dict[str, dict[str, list[int]]] = {}
        by_family: dict[str, dict[str, dict[str, list[int]]]] = {}
        runs: dict[str, list[str]] = {}
        steps: dict[str, int] = {}
        for name in self.runs:
            _, rows = self.steps(name)
            label = self.label(name)
            runs.setdefault(label, []).append(name)
            steps[label] = steps.get(label, 0) + len(rows)
            window, late = self.window(name), self.late_steps(name)
            spans_seen.add((window, late))
            for span, (a, b) in success_spans(len(rows), window=window, late_steps=late).items():
                for row in rows[a:b]:
                    hit = 1 if row.get("success") else 0
                    for counts in (totals.setdefault(label, {}),
                                   by_family.setdefault(str(row.get("family") or "(none)"), {}).setdefault(label, {})):
                        pair = counts.setdefault(span, [0, 0])
                        pair[0] += hit
                        pair[1] += 1
        base = baseline if baseline in totals else None

        def cells(counts: dict[str, list[int]], base_counts: dict[str, list[int]] | None) -> dict[str, Any]:
            out = {}
            for span in ("overall", "early", "late"):
                hit, n = counts.get(span, (0, 0))
                rate = hit / n if n else None
                b_hit, b_n = (base_counts or {}).get(span, (0, 0))
                diff = rate - b_hit / b_n if rate is not None and b_n and base_counts is not None else None
                out[span] = {"rate": rate, "n": n, "diff": diff}
            return out

        policies = [{"label": label, "runs": len(runs[label]), "steps": steps[label],
                     **cells(counts, totals.get(base) if base and label != base else None)}
                    for label, counts in totals.items()]
        families = [{"family": family, "policies": [
            {"label": label, **cells(counts, per.get(base) if base and label != base else None)}
            for label, counts in per.items()]} for family, per in sorted(by_family.items())]
        wins = []
        for label in totals:
            if base is None or label == base:
                continue
            diffs = [(f["family"], p["late"]["diff"]) for f in families for p in f["policies"]
                     if p["label"] == label and p["late"]["diff"] is not None]
            wins.append({"label": label, "run": runs[label][0],
                         "better": [{"family": f, "diff": d} for f, d in sorted(diffs, key=lambda x: -x[1]) if d > 0],
                         "worse": [{"family": f, "diff": d} for f, d in sorted(diffs, key=lambda x: x[1]) if d < 0],
                         "even": [f for f, d in diffs if d == 0]})
        needs = ""
        if base is None:
            needs = (f"No {baseline} run here, so no difference to it: the comparison needs runs of both policies "
                     f"on the same tasks, e.g. a directory written by memento online --policy soft_q,{baseline} "
                     "(or memento bench online --workdir DIR), inspected as a whole.")
        elif len(totals) == 1:
            needs = f"Only {baseline} runs here: add a run of another policy on the same tasks to compare."
        spans_text = "; ".join(f"early: the first {w} steps of each run, late: the last {late}"
                               for w, late in sorted(spans_seen))
        return {"policies": policies, "families": families, "baseline": base, "wins": wins, "needs": needs,
                "spans_text": spans_text}

    def filters(self, view: _BankView) -> tuple[list[str], list[str]]:
        """The envs and kinds the bank holds (for the filter menus)."""
        return bankfile.distinct(view.db, "env"), bankfile.distinct(view.db, "kind")

    def list_cases(self, view: _BankView, *, env: str | None, kind: str | None, reward: str | None,
                   page: int) -> tuple[list[dict[str, Any]], int]:
        """A page of cases in bank order under the filters, and how many match."""
        return bankfile.page(view.db, env=env, kind=kind, reward=reward, offset=page * PAGE_SIZE, limit=PAGE_SIZE)

    def search(self, view: _BankView, text: str, *, env: str | None, kind: str | None, reward: str | None,
               page: int) -> tuple[list[dict[str, Any]], int]:
        """The nearest cases to ``text`` (best first, with their cosine scores) under the filters."""
        if not text.strip():
            raise DataFormatError("the search text is empty")
        with self.lock:
            if view.refresh:
                view.bank.refresh()
            query_D = np.asarray(view.encoder().encode([text]), dtype=np.float32).reshape(-1)
            norm = float(np.linalg.norm(query_D))
            if not math.isfinite(norm) or norm == 0.0:
                raise DataFormatError("the encoder gave a zero or non-finite vector for the search text")
            k = min(MAX_SEARCH, len(view.bank))
            if k == 0:
                return [], 0
            scores, ids = view.bank.search(query_D / norm, k, env=env or None, kind=kind or None)
            cases = view.bank.get(list(ids))
        rows = []
        for score, case in zip(np.asarray(scores).tolist(), cases):
            if reward == "positive" and not case.reward > 0 or reward == "zero" and case.reward > 0:
                continue
            rows.append({"id": case.id, "state": case.state, "action": case.action, "reward": case.reward,
                         "env": case.env, "kind": case.kind, "score": float(score)})
        return rows[page * PAGE_SIZE:(page + 1) * PAGE_SIZE], len(rows)

    def case(self, view: _BankView, case_id: str) -> dict[str, Any]:
        """A case, its bank position, its usage statistics, its feedback rows and the steps that showed it."""
        with self.lock:
            if view.refresh:
                view.bank.refresh()
            case = view.bank.get(case_id, include_deleted=True)  # the logs that showed a deleted case name it too
            (pos,) = view.bank.positions_of([case_id]).tolist()
            shown_C, reward_C = view.bank.usage_at([pos])
        out: dict[str, Any] = {"case": case, "pos": int(pos), "shown": int(shown_C[0]),
                               "reward_sum": float(reward_C[0]), "feedback": None, "steps": []}
        if view.feedback is not None:
            out["feedback"] = self._feedback_rows(view.feedback, case_id)
        if view.name in self.runs:
            _, rows = self.steps(view.name)
            for row in rows:
                chosen, candidates = row.get("chosen_ids") or [], row.get("candidate_ids") or []
                if case_id in chosen or case_id in candidates or row.get("retained_id") == case_id:
                    out["steps"].append({"step": row["step"], "chosen": case_id in chosen,
                                         "candidate": case_id in candidates,
                                         "retained": row.get("retained_id") == case_id, "reward": row.get("reward")})
        return out

    @staticmethod
    def _feedback_rows(path: Path, case_id: str) -> dict[str, Any]:
        """The feedback log's rows whose selection held ``case_id`` (read-only; the server may be writing)."""
        total, rows = feedback_with_case(path, case_id)
        items = []
        for row in rows:
            at = row.ids.index(case_id)
            items.append({"seq": row.seq, "selection_id": row.selection_id, "reward": row.reward, "time": row.time,
                          "mode": row.mode, "rank": at + 1, "prob": row.probs[at] if at < len(row.probs) else None})
        rewards = [item["reward"] for item in items]
        return {"log_rows": total, "rows": items, "count": len(items),
                "mean_reward": float(np.mean(rewards)) if rewards else None}

    def step(self, name: str | None, number: int) -> tuple[str, dict[str, Any], int | None, int | None,
                                                          list[dict[str, Any]]]:
        """The step record ``number`` of a run, the previous and next step numbers, and its candidate rows."""
        name, rows = self.steps(name)
        index = {row["step"]: i for i, row in enumerate(rows)}
        if number not in index:
            raise UnknownCaseError(f"run {name!r} has no step {number}")
        i = index[number]
        row = rows[i]
        prev_step = rows[i - 1]["step"] if i > 0 else None
        next_step = rows[i + 1]["step"] if i + 1 < len(rows) else None
        candidates = [str(c) for c in row.get("candidate_ids") or []]
        chosen = [str(c) for c in row.get("chosen_ids") or []]
        props = list(row.get("propensities") or [])
        probs_C = row.get("candidate_probs")  # logged by newer loops: the policy's whole distribution
        if not (isinstance(probs_C, list) and len(probs_C) == len(candidates)):
            probs_C = None
        view = self.banks.get(name)
        cases: dict[str, Any] = {}
        if view is not None:
            with self.lock:
                for case_id in dict.fromkeys(candidates + chosen):
                    try:
                        cases[case_id] = view.bank.get(case_id, include_deleted=True)  # a logged step
                    except UnknownCaseError:
                        pass
        out = []
        for c, case_id in enumerate(dict.fromkeys(candidates + chosen)):
            rank = chosen.index(case_id) + 1 if case_id in chosen else None
            prob = (probs_C[c] if probs_C is not None and c < len(candidates)
                    else props[rank - 1] if rank is not None and rank - 1 < len(props) else None)
            out.append({"id": case_id, "case": cases.get(case_id), "rank": rank, "prob": prob,
                        "candidate": c + 1 if case_id in candidates else None})
        out.sort(key=lambda c: (c["rank"] is None, c["rank"] or 0))  # the chosen cases first, in draw order
        return name, row, prev_step, next_step, out


# ---------------------------------------------------------------- pages


def _render(template: str, page: _Page, inspector: Inspector | None, title: str, **context: Any) -> str:
    if inspector is not None:
        nav = [("overview", page.url("/"))]
        if inspector.banks:
            nav.append(("bank", page.url("/bank")))
        if inspector.runs:
            nav += [("steps", page.url("/steps")), ("curves", page.url("/curves"))]
        context.update(nav=nav, inspector_title=inspector.title)
    return str(template_env().get_template(template).render(title=title, url=page.url, **context))


class _Page:
    """URL building for one request (the pages may be mounted under a prefix, e.g. ``/inspect``); the
    templates escape what it returns."""

    def __init__(self, base: str):
        self.base = base.rstrip("/")

    def url(self, path: str, **params: Any) -> str:
        query = urlencode({k: v for k, v in params.items() if not (v is None or v is False or v == "")})
        return f"{self.base}{path}" + (f"?{query}" if query else "")


def _pages(total: int) -> int:
    return max(1, math.ceil(total / PAGE_SIZE))


def page_index(inspector: Inspector, page: _Page) -> str:
    banks = [{"name": name, "size": len(view.bank), "dim": view.bank.dim, "index": view.bank.config.index.factory,
              "feedback": view.feedback is not None} for name, view in inspector.banks.items()]
    runs = []
    for name, run in inspector.runs.items():
        _, steps = inspector.steps(name)
        runs.append({"name": name, "label": inspector.label(name), "steps": len(steps),
                     "rate": np.mean([bool(s.get("success")) for s in steps]) if steps else None,
                     "llm_calls": (run.read_summary() or {}).get("llm_calls")})
    return _render("overview.html.j2", page, inspector, "overview", banks=banks, runs=runs,
                   ov=inspector.overview() if inspector.runs else None)


def page_bank(inspector: Inspector, page: _Page, *, b: str | None, q: str | None, env: str | None,
              kind: str | None, reward: str | None, number: int) -> str:
    view = inspector.view(b)
    envs, kinds = inspector.filters(view)
    error = ""
    searching = bool(q and q.strip())
    try:
        if searching:
            rows, total = inspector.search(view, q or "", env=env, kind=kind, reward=reward, page=number)
        else:
            rows, total = inspector.list_cases(view, env=env, kind=kind, reward=reward, page=number)
    except MementoError as err:
        rows, total, error = [], 0, str(err)
    return _render("bank.html.j2", page, inspector, f"bank {view.name}", bank_names=list(inspector.banks),
                   view_name=view.name, q=q, env=env, kind=kind, reward=reward, envs=envs, kinds=kinds, error=error,
                   searching=searching, rows=rows, number=number, total=total, pages=_pages(total),
                   page_size=PAGE_SIZE, size=len(view.bank),
                   params={"b": view.name, "q": q, "env": env, "kind": kind, "reward": reward})


def page_case(inspector: Inspector, page: _Page, *, b: str | None, case_id: str) -> str:
    view = inspector.view(b)
    info = inspector.case(view, case_id)
    case = info["case"]
    return _render("case.html.j2", page, inspector, f"case {_short(case.id, 60)}", view_name=view.name, case=case,
                   pos=info["pos"], shown=info["shown"], reward_sum=info["reward_sum"],
                   mean=info["reward_sum"] / info["shown"] if info["shown"] else None,
                   meta=json.dumps(case.meta, ensure_ascii=False, indent=1, sort_keys=True) if case.meta else "",
                   feedback=info["feedback"], steps=info["steps"])


def page_steps(inspector: Inspector, page: _Page, *, r: str | None, number: int, failures: bool = False,
               family: str | None = None, policy: str | None = None) -> str:
    name, rows = inspector.steps(r)
    families, policies = inspector.step_values(name)
    for key, value, known in (("family", family, families), ("policy", policy, policies)):
        if value and value not in known:
            raise DataFormatError(f"{key}={shown(value)}: run {name!r} has no such {key} "
                                  f"(it has: {_short(', '.join(known), 200) or 'none'})")
    chosen = inspector.filter_steps(rows, failures=failures, family=family, policy=policy)
    params = {"r": name, "failures": 1 if failures else None, "family": family, "policy": policy}
    return _render("steps.html.j2", page, inspector, f"steps of {name}", run_names=list(inspector.runs), name=name,
                   failures=failures, family=family, policy=policy, families=families, policies=policies,
                   rows=chosen[number * PAGE_SIZE:(number + 1) * PAGE_SIZE], total=len(chosen), all_steps=len(rows),
                   number=number, pages=_pages(len(chosen)), params=params)


def page_step(inspector: Inspector, page: _Page, *, r: str | None, number: int) -> str:
    name, row, prev_step, next_step, cands = inspector.step(r, number)
    listing = page.url("/steps", r=name, page=inspector.steps(name)[1].index(row) // PAGE_SIZE)
    kv = [("run", name), ("task", row.get("task_id")), ("family", row.get("family")), ("policy", row.get("policy")),
          ("policy version", row.get("policy_version")), ("bank size", row.get("bank_size")),
          ("greedy", _num(row.get("greedy"))), ("entropy", _num(row.get("entropy"))), ("alpha", _num(row.get("alpha"))),
          ("set probability", _num(row.get("set_propensity"))), ("loss", _num(row.get("loss")))]
    rest = None
    if not isinstance(row.get("candidate_probs"), list) and cands:  # only the chosen cases' probabilities logged
        listed = sum(float(c["prob"]) for c in cands if c["prob"] is not None)
        rest = {"prob": max(0.0, 1.0 - listed), "others": sum(1 for c in cands if c["prob"] is None)}
    retained = row.get("retained_id") if row.get("retained_id") and name in inspector.banks else None
    return _render("step.html.j2", page, inspector, f"step {row['step']} of {name}", name=name, row=row,
                   prev_step=prev_step, next_step=next_step, listing=listing, kv=kv, cands=cands, rest=rest,
                   retained=retained, n_candidates=len(row.get("candidate_ids") or []),
                   n_chosen=len(row.get("chosen_ids") or []))


def page_curves(inspector: Inspector, page: _Page) -> str:
    from markupsafe import Markup

    success: dict[str, tuple[list[float], list[float]]] = {}
    loss: dict[str, tuple[list[float], list[float]]] = {}
    windows = set()
    short = []
    for name in inspector.runs:
        _, rows = inspector.steps(name)
        window = inspector.window(name)
        windows.add(window)
        steps_T, rate_T = windowed_success([1.0 if row.get("success") else 0.0 for row in rows], window)
        success[name] = ([float(rows[int(i)]["step"]) for i in steps_T], rate_T)
        if not steps_T:
            short.append(f"{name}: {len(rows)} of {window} steps")
        pts = [(float(row["step"]), float(row["loss"])) for row in rows
               if isinstance(row.get("loss"), (int, float)) and math.isfinite(float(row["loss"]))]
        if pts:
            loss[name] = ([p[0] for p in pts], [p[1] for p in pts])
    label = "/".join(str(w) for w in sorted(windows)) or "50"
    charts = [Markup(svg_line_chart(success, title=f"moving success rate ({label} steps)", y_label="success rate",
                                    y_range=(0.0, 1.0), note="no full window yet (" + "; ".join(short) + ")"))]
    if loss:
        charts.append(Markup(svg_line_chart(loss, title="learner loss (mean per update round)", y_label="loss")))
    comparison = [(p, r) for p, r in ((inspector.comparison or {}).get("policies") or {}).items()
                  if isinstance(r, dict)]
    return _render("curves.html.j2", page, inspector, "learning curves", charts=charts, comparison=comparison)


# ---------------------------------------------------------------- the app


def _require_serve() -> None:
    require("serve", what="memento inspect")


def inspect_app(inspector: Inspector, *, token: str | None = None) -> Any:
    """The FastAPI app of the pages (mount it, or serve it with :func:`serve_inspector`); ``token``: the
    bearer token every page needs (header, ``?token=`` or the cookie set by the login form)."""
    _require_serve()
    from fastapi import FastAPI

    app = FastAPI(title="memento inspect", docs_url=None, redoc_url=None, openapi_url=None)
    headers = {"Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; "
                                          "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
               "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "Cache-Control": "no-store"}
    _add_login(app, token, headers)
    _add_pages(app, inspector, headers)
    return app


def cookie_value(token: str) -> str:
    """What the login cookie holds: ``HMAC-SHA256(token, "memento inspect cookie")`` in hex, never the token itself
    (a stolen cookie opens these pages only, not the API, and does not reveal the token); checked in constant
    time."""
    return hmac.new(token.encode("utf-8"), b"memento inspect cookie", hashlib.sha256).hexdigest()


def _base(request: Any) -> str:
    return str(request.scope.get("root_path", "")).rstrip("/")


def _whole(name: str, value: str | None) -> int:
    """A page or step number from the query: a whole number 0 .. 10^9 (absent: 0); else a one-line error."""
    if value in (None, ""):
        return 0
    text = str(value).strip()
    if not text.isdecimal() or len(text) > 10 or int(text) > MAX_PAGE:
        raise DataFormatError(f"{name}={shown(text, 40)}: must be a whole number from 0 to {MAX_PAGE}")
    return int(text)


_FLAGS = {"": False, "0": False, "false": False, "no": False, "1": True, "true": True, "yes": True, "on": True}


def _flag(name: str, value: str | None) -> bool:
    key = (value or "").strip().lower()
    if key not in _FLAGS:
        raise DataFormatError(f"{name}={shown(key, 40)}: must be 1 or 0")
    return _FLAGS[key]


def _params(query: Any) -> dict[str, str]:
    """The query's parameters, each at most :data:`MAX_PARAM` characters (the search text 4000), else a
    one-line error; a repeated parameter counts once (its last value)."""
    out = {}
    for key, value in query.items():
        limit = 4000 if key == "q" else MAX_PARAM
        if len(value) > limit:
            raise DataFormatError(f"{shown(key, 40)}: {len(value)} characters, at most {limit}")
        out[key] = value
    return out


def _add_login(app: Any, token: str | None, headers: dict[str, str]) -> None:
    """The token check of every page (header, ``?token=`` or cookie) and the login form's POST /login."""
    from fastapi.responses import HTMLResponse, RedirectResponse, Response

    def given_token(request: Any) -> str | None:
        header = request.headers.get("authorization", "")
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
        return request.query_params.get("token")

    def valid(candidate: str | None) -> bool:
        return token is None or (candidate is not None and hmac.compare_digest(candidate.encode("utf-8"),
                                                                              token.encode("utf-8")))

    session = None if token is None else cookie_value(token)

    def valid_cookie(request: Any) -> bool:
        value = request.cookies.get(COOKIE)
        return session is not None and value is not None and hmac.compare_digest(value.encode("utf-8"),
                                                                                 session.encode("utf-8"))

    def login_page(request: Any, message: str) -> Response:
        body = _render("login.html.j2", _Page(_base(request)), None, "log in", message=message,
                       action=f"{_base(request)}/login", next=request.url.path)
        return HTMLResponse(body, status_code=401, headers={**headers, "WWW-Authenticate": "Bearer"})

    def set_cookie(response: Response, request: Any) -> None:
        assert session is not None
        response.set_cookie(COOKIE, session, httponly=True, samesite="strict", path=(_base(request) or "") + "/")

    @app.middleware("http")
    async def authorize(request: Any, call_next: Any) -> Any:
        if token is None or request.url.path.rstrip("/").endswith("/login") and request.method == "POST":
            return await call_next(request)
        candidate = given_token(request)
        if not (valid(candidate) if candidate is not None else valid_cookie(request)):
            return login_page(request, "missing or wrong token")
        response = await call_next(request)
        if request.query_params.get("token") and not valid_cookie(request):
            set_cookie(response, request)
        return response

    async def login(request: Any) -> Response:
        form = parse_qs((await request.body())[:4096].decode("utf-8", "replace"))
        candidate = (form.get("token") or [""])[0]
        if not valid(candidate):
            return login_page(request, "wrong token")
        target = (form.get("next") or [""])[0]
        if not target.startswith(_base(request) + "/") or target.startswith("//") or "\\" in target:
            target = _base(request) + "/"  # only a page of this app: never a redirect elsewhere
        response = RedirectResponse(target, status_code=303)
        set_cookie(response, request)
        return response

    app.add_route("/login", login, methods=["POST"])


def _add_pages(app: Any, inspector: Inspector, headers: dict[str, str]) -> None:
    """The GET pages; a missing case or run is a 404 page, another memento error a 400 page."""
    from fastapi.responses import HTMLResponse, Response

    def html_response(body: str, status: int = 200) -> Response:
        return HTMLResponse(body, status_code=status, headers=headers)

    def guarded(render: Callable[[], str]) -> Response:
        try:
            return html_response(render())
        except (UnknownCaseError, KeyError) as error:
            message = str(error.args[0]) if error.args else str(error)
            return html_response(error_page("not found", message), 404)
        except MementoError as error:
            return html_response(error_page("error", str(error)), 400)

    def error_page(title: str, message: str) -> str:
        return str(template_env().get_template("error.html.j2").render(title=title, message=_short(message, 400)))

    # plain Starlette routes (the handler gets the request): no annotations for FastAPI to resolve
    pages: dict[str, Callable[[Any, _Page], str]] = {
        "/": lambda q, p: page_index(inspector, p),
        "/bank": lambda q, p: page_bank(inspector, p, b=q.get("b"), q=q.get("q"), env=q.get("env"),
                                        kind=q.get("kind"), reward=q.get("reward"),
                                        number=_whole("page", q.get("page"))),
        "/case": lambda q, p: page_case(inspector, p, b=q.get("b"), case_id=q.get("id") or ""),
        "/steps": lambda q, p: page_steps(inspector, p, r=q.get("r"), number=_whole("page", q.get("page")),
                                          failures=_flag("failures", q.get("failures")), family=q.get("family"),
                                          policy=q.get("policy")),
        "/step": lambda q, p: page_step(inspector, p, r=q.get("r"), number=_whole("n", q.get("n"))),
        "/curves": lambda q, p: page_curves(inspector, p),
    }
    for path, render in pages.items():
        def endpoint(request: Any, render: Callable[[Any, _Page], str] = render) -> Response:
            return guarded(lambda: render(_params(request.query_params), _Page(_base(request))))

        app.add_route(path, endpoint, methods=["GET"])


def serve_inspector(path: str | Path, *, host: str = "127.0.0.1", port: int = 8090, token: str | None = None,
                    encoder: Any = None, ready: Callable[[str, int], None] | None = None) -> None:
    """Serve the pages of ``path`` with uvicorn until interrupted (``memento inspect``); ``ready(host, port)`` is
    called once the socket listens (``port=0`` picks a free one)."""
    _require_serve()
    import asyncio
    import socket

    import uvicorn

    from memento.serve.common import redact_server_logs

    with Inspector.open(path, encoder=encoder) as inspector:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        try:
            config = uvicorn.Config(inspect_app(inspector, token=token), log_level="warning", access_log=False)
            redact_server_logs()
            server = uvicorn.Server(config)
            if ready is not None:
                ready(host, sock.getsockname()[1])
            try:
                asyncio.run(server.serve(sockets=[sock]))
            except KeyboardInterrupt:
                pass
        finally:
            sock.close()
