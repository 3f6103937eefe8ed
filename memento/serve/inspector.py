"""``memento inspect``: a case-bank and run inspector in the browser (server-rendered HTML, no build step).

What it shows, for a run directory (``memento online``), a comparison directory (``comparison.json`` of
``memento online --policy A B`` / ``memento bench online``), a directory holding run directories, or an
exported selector (``memento export``):

- the bank: search by text (``?q=``, encoded with the run's or artifact's encoder: nearest cases with their
  scores), filters by env / kind / reward, paging; a case page with its usage statistics (the bank's usage log,
  :meth:`memento.memory.bank.CaseBank.usage_at`; for an artifact also its feedback log) and the steps that
  showed it;
- each step of a run (``steps.jsonl``): the candidates, their probabilities, the chosen cases, the answer and
  the reward, with prev/next links;
- the learning curves of the run(s): inline SVG drawn here (moving success rate, learner loss).

Pages are plain HTML + CSS and carry no script at all (``Content-Security-Policy: script-src 'none'``); every
text from the bank or the run is escaped (:func:`html.escape`): case texts are untrusted input. Banks are
opened read-only, so a run or a server may keep writing while it is inspected.

FastAPI is the ``serve`` extra, imported only by :func:`inspect_app`. ``memento serve`` mounts the same pages
under ``/inspect`` (:meth:`Inspector.for_selector`), behind the server's token: the ``Authorization: Bearer``
header, a ``?token=`` query parameter (which also sets an HttpOnly cookie) or that cookie, set by the login
form the pages show when the token is missing. The cookie holds a value derived from the token
(:func:`cookie_value`, an HMAC), never the token, and the server's access log shows ``?token=<redacted>``.
"""

from __future__ import annotations

import hashlib
import hmac
import html
import json
import logging
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode

import numpy as np

from memento.errors import DataFormatError, EncoderError, MementoError, NotABankError, UnknownCaseError
from memento.memory import rows as bank_rows
from memento.memory.bank import CaseBank
from memento.plots import moving_average
from memento.runs.rundir import RunDir, read_json
from memento.selector.artifact import FEEDBACK_NAME, feedback_with_case, load_encoder

__all__ = ["Inspector", "cookie_value", "inspect_app", "serve_inspector", "svg_line_chart"]

logger = logging.getLogger(__name__)

PAGE_SIZE = 25
MAX_SEARCH = 500
COOKIE = "memento_inspect_token"
_DEPTH = 3  # how deep a directory of runs is searched for run directories
_PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")


def e(value: Any) -> str:
    """``value`` as escaped HTML text (attribute-safe: quotes escaped too)."""
    return html.escape("" if value is None else str(value), quote=True)


def _short(text: str, n: int = 160) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[:n - 1] + "…"


def _num(value: Any, digits: int = 4) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    try:
        f = float(value)
    except (TypeError, ValueError):
        return e(value)
    return "—" if not math.isfinite(f) else f"{f:.{digits}g}"


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
            with self.path.open("r", encoding="utf-8") as f:
                for number, line in enumerate(f, start=1):
                    if not line.strip():
                        continue
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError:
                        if not line.endswith("\n"):  # the line a running loop is writing now
                            break
                        raise DataFormatError(f"{self.path}:{number}: not JSON") from None
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

        if (root / "manifest.json").is_file() and (root / "bank").is_dir():  # a selector artifact
            feedback = root / FEEDBACK_NAME
            add_bank(root.name or str(root), root / "bank", encoder_of=lambda bank: load_encoder(root),
                     feedback=feedback if feedback.is_file() else None)
            return cls(title=f"selector {root}", banks=banks, runs={}, owned=owned)

        runs = cls._find_runs(root)
        if not runs:
            raise NotABankError(f"{root}: neither a run directory (config.json + bank/), a directory of runs, "
                                "nor a selector artifact (manifest.json + bank/)")
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

    def window(self, name: str) -> int:
        if self.comparison and isinstance(self.comparison.get("window"), int) and self.comparison["window"] > 0:
            return int(self.comparison["window"])
        try:
            window = self.runs[name].read_config().get("window")
        except (MementoError, AttributeError):
            window = None
        return window if isinstance(window, int) and not isinstance(window, bool) and window > 0 else 50

    def filters(self, view: _BankView) -> tuple[list[str], list[str]]:
        """The envs and kinds the bank holds (for the filter menus)."""
        return bank_rows.distinct(view.db, "env"), bank_rows.distinct(view.db, "kind")

    def list_cases(self, view: _BankView, *, env: str | None, kind: str | None, reward: str | None,
                   page: int) -> tuple[list[dict[str, Any]], int]:
        """A page of cases in bank order under the filters, and how many match."""
        return bank_rows.page(view.db, env=env, kind=kind, reward=reward, offset=page * PAGE_SIZE, limit=PAGE_SIZE)

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
            case = view.bank.get(case_id)
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
                        cases[case_id] = view.bank.get(case_id)
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


# ---------------------------------------------------------------- SVG


def svg_line_chart(series: Mapping[str, tuple[Sequence[float], Sequence[float]]], *, title: str, y_label: str,
                   y_range: tuple[float, float] | None = None, width: int = 720, height: int = 300) -> str:
    """An inline SVG line chart of ``{name: (x, y)}`` (escaped names), axes with ticks and a legend."""
    left, right, top, bottom = 56, 16, 28, 40
    pw, ph = width - left - right, height - top - bottom
    xs = [float(x) for xv, _ in series.values() for x in xv]
    ys = [float(y) for _, yv in series.values() for y in yv if math.isfinite(float(y))]
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" aria-label="{e(title)}">',
             f'<text x="{left}" y="18" class="title">{e(title)}</text>']
    if not xs or not ys:
        parts.append(f'<text x="{left}" y="{top + ph / 2:.0f}">no data</text></svg>')
        return "".join(parts)
    x0, x1 = min(xs), max(xs)
    y0, y1 = y_range if y_range is not None else (min(ys), max(ys))
    if x1 == x0:
        x1 = x0 + 1
    if y1 == y0:
        y0, y1 = y0 - 0.5, y1 + 0.5

    def px(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * pw

    def py(y: float) -> float:
        return top + (1 - (y - y0) / (y1 - y0)) * ph

    parts.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" class="frame"/>')
    for i in range(5):
        yv = y0 + (y1 - y0) * i / 4
        parts.append(f'<line x1="{left}" x2="{left + pw}" y1="{py(yv):.1f}" y2="{py(yv):.1f}" class="grid"/>'
                     f'<text x="{left - 6}" y="{py(yv) + 4:.1f}" text-anchor="end">{yv:.3g}</text>')
    for xv in sorted({round(x0 + (x1 - x0) * i / 4) for i in range(5)}):  # whole steps
        parts.append(f'<text x="{px(xv):.1f}" y="{top + ph + 16}" text-anchor="middle">{xv}</text>')
    parts.append(f'<text x="{left + pw / 2:.0f}" y="{height - 6}" text-anchor="middle">step</text>'
                 f'<text x="14" y="{top + ph / 2:.0f}" transform="rotate(-90 14 {top + ph / 2:.0f})" '
                 f'text-anchor="middle">{e(y_label)}</text>')
    for i, (name, (xs_T, ys_T)) in enumerate(series.items()):
        color = _PALETTE[i % len(_PALETTE)]
        points = " ".join(f"{px(float(x)):.1f},{py(float(y)):.1f}" for x, y in zip(xs_T, ys_T)
                          if math.isfinite(float(y)))
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.8" points="{points}" '
                     f'data-series="{e(name)}"/>')
        ly = top + 14 + 16 * i
        parts.append(f'<line x1="{left + pw - 150}" x2="{left + pw - 130}" y1="{ly}" y2="{ly}" stroke="{color}" '
                     f'stroke-width="3"/><text x="{left + pw - 124}" y="{ly + 4}">{e(_short(name, 24))}</text>')
    parts.append("</svg>")
    return "".join(parts)


# ---------------------------------------------------------------- pages

_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#222;background:#fafafa}
header{background:#243447;color:#fff;padding:8px 16px}header a{color:#cfe3ff;margin-right:14px}
main{padding:12px 16px;max-width:1250px}h1{font-size:20px;margin:8px 0}h2{font-size:16px;margin:14px 0 6px}
table{border-collapse:collapse;width:100%;background:#fff}td,th{border:1px solid #ddd;padding:4px 6px;
vertical-align:top;text-align:left}th{background:#f0f2f5}tr.chosen{background:#eef8ee}
.num{text-align:right;font-variant-numeric:tabular-nums}.muted{color:#777}.text{white-space:pre-wrap;
word-break:break-word}form.bar{margin:8px 0;display:flex;gap:8px;flex-wrap:wrap;align-items:center}
input[type=text]{width:420px}nav.pager{margin:8px 0}nav.pager a{margin-right:12px}
.chart{background:#fff;border:1px solid #ddd;margin:6px 0}.chart text{font-size:11px;fill:#333}
.chart .title{font-size:13px;font-weight:600}.chart .grid{stroke:#eee}.chart .frame{fill:none;stroke:#bbb}
.error{color:#a00}dl.kv{display:grid;grid-template-columns:max-content auto;gap:2px 14px}dl.kv dt{color:#555}
"""


class _Page:
    """URL building for one request (the pages may be mounted under a prefix, e.g. ``/inspect``)."""

    def __init__(self, base: str):
        self.base = base.rstrip("/")

    def url(self, path: str, **params: Any) -> str:
        query = urlencode({k: v for k, v in params.items() if v not in (None, "")})
        return e(f"{self.base}{path}" + (f"?{query}" if query else ""))

    def render(self, inspector: Inspector, title: str, body: str) -> str:
        links = [f'<a href="{self.url("/")}">overview</a>']
        if inspector.banks:
            links.append(f'<a href="{self.url("/bank")}">bank</a>')
        if inspector.runs:
            links.append(f'<a href="{self.url("/steps")}">steps</a><a href="{self.url("/curves")}">curves</a>')
        return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{e(title)} · memento inspect'
                f'</title><style>{_CSS}</style></head><body><header><b>memento inspect</b> · {e(inspector.title)} '
                f'· {"".join(links)}</header><main><h1>{e(title)}</h1>{body}</main></body></html>')


def _pager(page: _Page, path: str, number: int, total: int, **params: Any) -> str:
    pages = max(1, math.ceil(total / PAGE_SIZE))
    bits = []
    if number > 0:
        bits.append(f'<a rel="prev" href="{page.url(path, **params, page=number - 1)}">&larr; prev</a>')
    bits.append(f'<span>page {number + 1} of {pages} ({total} in all)</span>')
    if number + 1 < pages:
        bits.append(f'<a rel="next" href="{page.url(path, **params, page=number + 1)}">next &rarr;</a>')
    return f'<nav class="pager">{"".join(bits)}</nav>'


def _select(name: str, options: Sequence[tuple[str, str]], current: str | None) -> str:
    opts = "".join(f'<option value="{e(v)}"{" selected" if v == (current or "") else ""}>{e(label)}</option>'
                   for v, label in options)
    return f'<select name="{e(name)}">{opts}</select>'


def page_index(inspector: Inspector, page: _Page) -> str:
    body = []
    for name, view in inspector.banks.items():
        body.append(f'<h2>bank <a href="{page.url("/bank", b=name)}">{e(name)}</a></h2>'
                    f'<p>{len(view.bank)} case(s), dim {view.bank.dim}, index {e(view.bank.config.index.factory)}'
                    + (", with a feedback log" if view.feedback is not None else "") + "</p>")
    if inspector.runs:
        rows = []
        for name, run in inspector.runs.items():
            summary = run.read_summary() or {}
            _, steps = inspector.steps(name)
            rate = np.mean([bool(s.get("success")) for s in steps]) if steps else None
            rows.append(f'<tr><td>{e(name)}</td><td class="num">{len(steps)}</td><td class="num">{_num(rate)}</td>'
                        f'<td class="num">{_num(summary.get("llm_calls"))}</td>'
                        f'<td><a href="{page.url("/steps", r=name)}">steps</a> · '
                        f'<a href="{page.url("/bank", b=name)}">bank</a></td></tr>')
        body.append('<h2>runs</h2><table><tr><th>run</th><th>steps</th><th>success rate</th><th>LLM calls</th>'
                    f'<th></th></tr>{"".join(rows)}</table><p><a href="{page.url("/curves")}">learning curves</a></p>')
    return page.render(inspector, "overview", "".join(body))


def page_bank(inspector: Inspector, page: _Page, *, b: str | None, q: str | None, env: str | None,
              kind: str | None, reward: str | None, number: int) -> str:
    view = inspector.view(b)
    envs, kinds = inspector.filters(view)
    bank_menu = ""
    if len(inspector.banks) > 1:
        bank_menu = _select("b", [(n, n) for n in inspector.banks], view.name)
    else:
        bank_menu = f'<input type="hidden" name="b" value="{e(view.name)}">'
    form = (f'<form class="bar" method="get" action="{page.url("/bank")}">{bank_menu}'
            f'<input type="text" name="q" value="{e(q or "")}" placeholder="search by text (nearest cases)">'
            + _select("env", [("", "any env"), *[(v, v) for v in envs]], env)
            + _select("kind", [("", "any kind"), *[(v, v) for v in kinds]], kind)
            + _select("reward", [("", "any reward"), ("positive", "reward > 0"), ("zero", "reward ≤ 0")], reward)
            + '<button type="submit">show</button></form>')
    error = ""
    searching = bool(q and q.strip())
    try:
        if searching:
            rows, total = inspector.search(view, q or "", env=env, kind=kind, reward=reward, page=number)
        else:
            rows, total = inspector.list_cases(view, env=env, kind=kind, reward=reward, page=number)
    except MementoError as err:
        rows, total, error = [], 0, f'<p class="error">{e(err)}</p>'
    head = ("<th>rank</th><th>score</th>" if searching else "<th>pos</th>")
    lines = []
    for i, row in enumerate(rows):
        lead = (f'<td class="num">{number * PAGE_SIZE + i + 1}</td>'
                f'<td class="num score" data-score="{row["score"]:.6f}">{row["score"]:.4f}</td>'
                if searching else f'<td class="num">{row["pos"]}</td>')
        lines.append(f'<tr class="case" data-case-id="{e(row["id"])}">{lead}'
                     f'<td><a href="{page.url("/case", b=view.name, id=row["id"])}">{e(_short(row["id"], 40))}</a></td>'
                     f'<td class="text">{e(_short(row["state"]))}</td><td class="text">{e(_short(row["action"]))}</td>'
                     f'<td class="num">{_num(row["reward"])}</td><td>{e(row["env"] or "")}</td>'
                     f'<td>{e(row["kind"])}</td></tr>')
    table = (f'<table id="cases"><tr>{head}<th>id</th><th>state</th><th>action</th><th>reward</th><th>env</th>'
             f'<th>kind</th></tr>{"".join(lines)}</table>')
    params = {"b": view.name, "q": q, "env": env, "kind": kind, "reward": reward}
    what = f"nearest cases to “{e(_short(q or '', 80))}”" if searching else f"{len(view.bank)} case(s)"
    body = form + error + f"<p>{what}</p>" + table + _pager(page, "/bank", number, total, **params)
    return page.render(inspector, f"bank {view.name}", body)


def page_case(inspector: Inspector, page: _Page, *, b: str | None, case_id: str) -> str:
    view = inspector.view(b)
    info = inspector.case(view, case_id)
    case = info["case"]
    mean = info["reward_sum"] / info["shown"] if info["shown"] else None
    meta = json.dumps(case.meta, ensure_ascii=False, indent=1, sort_keys=True) if case.meta else ""
    body = [f'<dl class="kv"><dt>id</dt><dd id="case-id">{e(case.id)}</dd><dt>position</dt><dd>{info["pos"]}</dd>'
            f'<dt>env</dt><dd>{e(case.env or "—")}</dd><dt>kind</dt><dd>{e(case.kind)}</dd>'
            f'<dt>reward</dt><dd>{_num(case.reward)}</dd></dl>'
            f'<h2>state</h2><div class="text" id="case-state">{e(case.state)}</div>'
            f'<h2>action</h2><div class="text" id="case-action">{e(case.action)}</div>']
    if meta:
        body.append(f'<h2>meta</h2><pre class="text">{e(meta)}</pre>')
    body.append('<h2>usage (the bank\'s usage log)</h2>'
                f'<p id="usage" data-shown="{info["shown"]}" data-reward-sum="{info["reward_sum"]:.6g}">shown '
                f'{info["shown"]} time(s), summed reward {_num(info["reward_sum"])}, mean reward when shown '
                f'{_num(mean)}</p>')
    fb = info["feedback"]
    if fb is not None:
        rows = "".join(f'<tr><td class="num">{r["seq"]}</td><td>{e(r["selection_id"])}</td><td>{e(r["mode"])}</td>'
                       f'<td class="num">{r["rank"]}</td><td class="num">{_num(r["prob"])}</td>'
                       f'<td class="num">{_num(r["reward"])}</td></tr>' for r in fb["rows"][-200:])
        body.append(f'<h2>feedback log</h2><p id="feedback" data-count="{fb["count"]}">in {fb["count"]} of '
                    f'{fb["log_rows"]} feedback(s), mean reward {_num(fb["mean_reward"])}</p>'
                    + (f'<table><tr><th>seq</th><th>selection</th><th>mode</th><th>rank</th><th>probability</th>'
                       f'<th>reward</th></tr>{rows}</table>' if rows else ""))
    if info["steps"]:
        rows = "".join(f'<tr><td><a href="{page.url("/step", r=view.name, n=s["step"])}">{s["step"]}</a></td>'
                       f'<td>{"chosen" if s["chosen"] else "candidate" if s["candidate"] else ""}'
                       f'{" · retained here" if s["retained"] else ""}</td><td class="num">{_num(s["reward"])}</td>'
                       "</tr>" for s in info["steps"][-200:])
        body.append(f'<h2>steps of the run</h2><table><tr><th>step</th><th>role</th><th>reward</th></tr>{rows}'
                    "</table>")
    return page.render(inspector, f"case {_short(case.id, 60)}", "".join(body))


def page_steps(inspector: Inspector, page: _Page, *, r: str | None, number: int) -> str:
    name, rows = inspector.steps(r)
    menu = ""
    if len(inspector.runs) > 1:
        menu = " · ".join(f'<a href="{page.url("/steps", r=n)}">{e(n)}</a>' for n in inspector.runs)
    chunk = rows[number * PAGE_SIZE:(number + 1) * PAGE_SIZE]
    lines = "".join(
        f'<tr><td><a href="{page.url("/step", r=name, n=row["step"])}">{row["step"]}</a></td>'
        f'<td>{e(_short(str(row.get("task_id", "")), 40))}</td>'
        f'<td class="text">{e(_short(row.get("state", ""), 100))}</td>'
        f'<td class="text">{e(_short(row.get("output", ""), 60))}</td><td class="num">{_num(row.get("reward"))}</td>'
        f'<td class="num">{len(row.get("chosen_ids") or [])}/{len(row.get("candidate_ids") or [])}</td></tr>'
        for row in chunk)
    body = (f"<p>{menu}</p>" if menu else "") + (
        '<table id="steps"><tr><th>step</th><th>task</th><th>state</th><th>answer</th><th>reward</th>'
        f'<th>chosen/candidates</th></tr>{lines}</table>') + _pager(page, "/steps", number, len(rows), r=name)
    return page.render(inspector, f"steps of {name}", body)


def page_step(inspector: Inspector, page: _Page, *, r: str | None, number: int) -> str:
    name, row, prev_step, next_step, cands = inspector.step(r, number)
    listing = page.url("/steps", r=name, page=inspector.steps(name)[1].index(row) // PAGE_SIZE)
    nav = [f'<a rel="prev" id="prev" href="{page.url("/step", r=name, n=prev_step)}">&larr; step {prev_step}</a>'
           if prev_step is not None else "",
           f'<a href="{listing}">all steps</a>',
           f'<a rel="next" id="next" href="{page.url("/step", r=name, n=next_step)}">step {next_step} &rarr;</a>'
           if next_step is not None else ""]
    full = isinstance(row.get("candidate_probs"), list)
    kv = [("run", name), ("task", row.get("task_id")), ("family", row.get("family")), ("policy", row.get("policy")),
          ("policy version", row.get("policy_version")), ("bank size", row.get("bank_size")),
          ("greedy", _num(row.get("greedy"))), ("entropy", _num(row.get("entropy"))), ("alpha", _num(row.get("alpha"))),
          ("set probability", _num(row.get("set_propensity"))), ("loss", _num(row.get("loss")))]
    body = [f'<nav class="pager">{" ".join(b for b in nav if b)}</nav><dl class="kv">'
            + "".join(f"<dt>{e(k)}</dt><dd>{e(v if v is not None else '—')}</dd>" for k, v in kv) + "</dl>",
            f'<h2>task</h2><div class="text" id="step-state">{e(row.get("state", ""))}</div>',
            f'<h2>answer</h2><div class="text" id="step-output">{e(row.get("output", ""))}</div>'
            f'<p>reward <b id="step-reward" data-reward="{e(row.get("reward"))}">{_num(row.get("reward"))}</b>, '
            f'{"success" if row.get("success") else "no success"} ({e(row.get("reason", ""))})'
            + (f'; retained as <a href="{page.url("/case", b=name, id=row["retained_id"])}">'
               f'{e(row["retained_id"])}</a>' if row.get("retained_id") and name in inspector.banks else "")
            + "</p>"]
    lines, shown = [], 0.0
    for c in cands:
        case = c["case"]
        prob = c["prob"]
        cell = (f'<td class="num prob" data-prob="{float(prob):.12g}">{float(prob):.4f}</td>' if prob is not None
                else '<td class="num muted">not logged</td>')
        shown += float(prob) if prob is not None else 0.0
        link = (f'<a href="{page.url("/case", b=name, id=c["id"])}">{e(_short(c["id"], 40))}</a>'
                if case is not None else e(_short(c["id"], 40)))
        lines.append(f'<tr class="cand{" chosen" if c["rank"] else ""}" data-case-id="{e(c["id"])}"'
                     + (f' data-rank="{c["rank"]}"' if c["rank"] else "") + f'><td class="num">{c["rank"] or ""}</td>'
                     f'{cell}<td class="num">{c["candidate"] or ""}</td><td>{link}</td>'
                     f'<td class="text">{e(_short(case.state) if case else "")}</td>'
                     f'<td class="text">{e(_short(case.action) if case else "")}</td>'
                     f'<td class="num">{_num(case.reward) if case else "—"}</td></tr>')
    if not full and cands:  # only the chosen cases' first-draw probabilities are logged
        rest = max(0.0, 1.0 - shown)
        others = sum(1 for c in cands if c["prob"] is None)
        lines.append(f'<tr class="rest"><td></td><td class="num prob" data-prob="{rest:.12g}">{rest:.4f}</td>'
                     f'<td colspan="5" class="muted">the other {others} candidate(s) together (this run logged only '
                     "the chosen cases' probabilities)</td></tr>")
    body.append(f'<h2>candidates ({len(row.get("candidate_ids") or [])}; chosen {len(row.get("chosen_ids") or [])}, '
                'rank = draw order, # = similarity order)</h2><table id="candidates"><tr><th>rank</th>'
                '<th>probability</th><th>#</th><th>case</th>'
                f'<th>state</th><th>action</th><th>reward</th></tr>{"".join(lines)}</table>')
    return page.render(inspector, f"step {row['step']} of {name}", "".join(body))


def page_curves(inspector: Inspector, page: _Page) -> str:
    success: dict[str, tuple[list[float], list[float]]] = {}
    loss: dict[str, tuple[list[float], list[float]]] = {}
    window = 50
    for name in inspector.runs:
        _, rows = inspector.steps(name)
        window = inspector.window(name)
        steps = [float(row["step"]) for row in rows]
        if rows:
            ma = moving_average([1.0 if row.get("success") else 0.0 for row in rows], window)
            success[name] = (steps, ma.tolist())
        pts = [(float(row["step"]), float(row["loss"])) for row in rows
               if isinstance(row.get("loss"), (int, float)) and math.isfinite(float(row["loss"]))]
        if pts:
            loss[name] = ([p[0] for p in pts], [p[1] for p in pts])
    body = [svg_line_chart(success, title=f"moving success rate ({window} steps)", y_label="success rate",
                           y_range=(0.0, 1.0))]
    if loss:
        body.append(svg_line_chart(loss, title="learner loss (mean per update round)", y_label="loss"))
    if inspector.comparison:
        comp = inspector.comparison
        table = "".join(
            f'<tr><td>{e(p)}</td><td class="num">{_num(r.get("success_early"))}</td>'
            f'<td class="num">{_num(r.get("success_late"))}</td><td class="num">{_num(r.get("success_rate"))}</td>'
            f'<td class="num">{_num(r.get("llm_calls"))}</td></tr>'
            for p, r in (comp.get("policies") or {}).items() if isinstance(r, dict))
        body.append('<h2>comparison</h2><table><tr><th>policy</th><th>early</th><th>late</th><th>overall</th>'
                    f'<th>LLM calls</th></tr>{table}</table>')
    return page.render(inspector, "learning curves", "".join(body))


# ---------------------------------------------------------------- the app


def _require_serve() -> None:
    for name in ("fastapi", "uvicorn"):
        try:
            __import__(name)
        except ImportError:
            raise MementoError(f"memento inspect needs the 'serve' extra ({name} is not installed): "
                               "pip install 'memento-mdp[serve]'") from None


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


def _integer(value: str | None, default: int = 0) -> int:
    try:
        return max(0, int(value)) if value not in (None, "") else default
    except ValueError:
        return default


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
        path = request.url.path
        form = (f'<p class="error">{e(message)}</p><form class="bar" method="post" action="{e(_base(request))}/login">'
                f'<input type="hidden" name="next" value="{e(path)}"><input type="password" name="token" '
                'placeholder="the server token" autocomplete="current-password"><button type="submit">log in</button>'
                "</form>")
        body = (f'<!doctype html><html><head><meta charset="utf-8"><title>log in · memento inspect</title>'
                f"<style>{_CSS}</style></head><body><main><h1>memento inspect</h1>{form}</main></body></html>")
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
            return html_response(f"<!doctype html><title>not found</title><p>{e(message)}</p>", 404)
        except MementoError as error:
            return html_response(f"<!doctype html><title>error</title><p>{e(error)}</p>", 400)

    # plain Starlette routes (the handler gets the request): no annotations for FastAPI to resolve
    pages: dict[str, Callable[[Any, _Page], str]] = {
        "/": lambda q, p: page_index(inspector, p),
        "/bank": lambda q, p: page_bank(inspector, p, b=q.get("b"), q=q.get("q"), env=q.get("env"),
                                        kind=q.get("kind"), reward=q.get("reward"), number=_integer(q.get("page"))),
        "/case": lambda q, p: page_case(inspector, p, b=q.get("b"), case_id=q.get("id") or ""),
        "/steps": lambda q, p: page_steps(inspector, p, r=q.get("r"), number=_integer(q.get("page"))),
        "/step": lambda q, p: page_step(inspector, p, r=q.get("r"), number=_integer(q.get("n"))),
        "/curves": lambda q, p: page_curves(inspector, p),
    }
    for path, render in pages.items():
        def endpoint(request: Any, render: Callable[[Any, _Page], str] = render) -> Response:
            return guarded(lambda: render(request.query_params, _Page(_base(request))))

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
