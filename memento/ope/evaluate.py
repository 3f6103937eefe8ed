"""Off-policy evaluation of selection policies from a run's transition log (:mod:`memento.ope.estimators`): the
pipeline behind ``memento evaluate`` (:mod:`memento.cli.evaluate`) and the online benchmark's estimates.

It reads ``steps.jsonl`` (a run directory's, or a file given directly, with the bank beside it or ``bank``),
rebuilds each step's candidate set from the bank, encodes each step's question with the encoder, asks every
target policy for its choice over those candidates, and estimates the target's value: IPS, SNIPS, DM and DR
on the first chosen case, and, when the log's steps show K > 1 cases, the slate estimators (inclusion IPS,
pseudo-inverse by slot and by set), each with an effective sample size and a bootstrap interval.

It never imports ``policies``: callers pass ``make_policy`` in.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from memento.errors import BankError, ConfigError, DataFormatError, UnknownCaseError
from memento.formats import StepRecord, iter_jsonl
from memento.ope.estimators import (
    OPEConfig,
    OPEResult,
    RewardModelConfig,
    SlateDistribution,
    SlateMoments,
    SlateRound,
    cross_fit_rewards,
    estimate_k1,
    estimate_slates,
    reward_features,
    slate_moments,
)
from memento.ope.export import ExportRound
from memento.runs.rundir import RunDir, read_json

__all__ = ["REWARD_RANGE", "BottomLine", "Evaluation", "LoadedSteps", "LoggedStep", "TargetSpec", "bottom_line",
           "evaluate_run", "export_rounds", "format_table", "outside_range", "parse_target", "read_log",
           "reward_range", "run_evaluation", "target_specs"]

logger = logging.getLogger(__name__)

_SUM_TOL = 1e-4


# ---------------------------------------------------------------- the log


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoggedStep:
    """A usable step of the log: its 1-based ``line``, the record, and the chosen cases' candidate indices."""

    line: int
    record: StepRecord
    chosen_rows: np.ndarray

    @property
    def k(self) -> int:
        return int(self.chosen_rows.shape[0])

    def logger(self) -> SlateDistribution:
        """The logging policy's slate distribution: the chosen order when the step was greedy, else
        Plackett-Luce draws from ``candidate_probs``."""
        c = len(self.record.candidate_ids)
        if self.record.greedy:
            return SlateDistribution.fixed(self.chosen_rows, c)
        return SlateDistribution.plackett_luce(np.asarray(self.record.candidate_probs, dtype=np.float64), self.k)


def _check_step(record: StepRecord) -> np.ndarray | None:
    """The chosen cases' candidate indices, ``None`` for a step that chose nothing; an unusable step raises."""
    if not record.candidate_ids or not record.chosen_ids:
        return None
    if record.candidate_probs is None:
        raise DataFormatError("the step has no candidate_probs (the logging policy's probability of every "
                              "candidate), which off-policy evaluation needs; the log predates them")
    ids, probs = record.candidate_ids, record.candidate_probs
    if not isinstance(probs, list) or len(probs) != len(ids):
        raise DataFormatError(f"candidate_probs must be a list of {len(ids)} numbers, one per candidate")
    if len(set(ids)) != len(ids):
        raise DataFormatError("candidate_ids repeats a case")
    p = np.asarray([x if isinstance(x, (int, float)) and not isinstance(x, bool) else math.nan for x in probs],
                   dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(p) | (p < 0))
    if bad.size:
        i = int(bad[0])
        raise DataFormatError(f"candidate_probs[{i}]={probs[i]!r} (case {ids[i]!r}) is not a probability: each must "
                              "be a finite number >= 0")
    if abs(p.sum() - 1.0) > _SUM_TOL:
        raise DataFormatError(f"candidate_probs must sum to 1, got sum {p.sum()!r}")
    if not isinstance(record.reward, (int, float)) or not math.isfinite(record.reward):
        raise DataFormatError(f"reward {record.reward!r} is not a finite number")
    row_of = {case_id: i for i, case_id in enumerate(ids)}
    missing = [case_id for case_id in record.chosen_ids if case_id not in row_of]
    if missing or len(set(record.chosen_ids)) != len(record.chosen_ids):
        raise DataFormatError(f"chosen_ids must be distinct candidates (not candidates: {missing[:3]})")
    rows = np.asarray([row_of[case_id] for case_id in record.chosen_ids], dtype=np.int64)
    zero = [int(row) for row in rows if p[row] <= 0] if not record.greedy else []
    if zero:
        i = zero[0]
        raise DataFormatError(f"candidate_probs[{i}]={probs[i]!r} for the chosen case {ids[i]!r}: a case the logging "
                              "policy drew must have logging probability > 0 (importance weights divide by it)")
    return rows


def read_log(path: str | Path) -> tuple[list[LoggedStep], int]:
    """The usable steps of a ``steps.jsonl`` and how many chose nothing (skipped); any problem is a one-line
    ``DataFormatError`` naming the file and line."""
    steps: list[LoggedStep] = []
    skipped = 0
    for number, row in iter_jsonl(path):
        try:
            record = StepRecord.from_json(row)
            rows = _check_step(record)
        except DataFormatError as error:
            raise DataFormatError(error.reason, path=path, line=number) from None
        except TypeError as error:  # a field of the wrong type deep inside
            raise DataFormatError(f"malformed step record: {error}", path=path, line=number) from None
        if rows is None:
            skipped += 1
        else:
            steps.append(LoggedStep(line=number, record=record, chosen_rows=rows))
    if not steps:
        raise DataFormatError("no step with candidates and a choice to evaluate", path=path)
    return steps, skipped


# ---------------------------------------------------------------- targets


TargetKind = Literal["logged", "similarity", "random", "selector"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class TargetSpec:
    """A ``--policy`` value: its ``name`` as given, its ``kind`` and, for a selector, its ``path``; ``policy``: the
    target's policy config when it is not the kind's default (e.g. ``SimilarityConfig(positive_only=True)``, the
    similarity a benchmark ran; ``None``: :func:`parse_target`'s meaning of the kind)."""

    name: str
    kind: TargetKind
    path: Path | None = None
    policy: Any = None


def parse_target(text: str) -> TargetSpec:
    """``logged``, ``similarity``, ``random``, or a selector directory (``learner.json`` in it or in its
    ``selector/``); anything else is a ``ConfigError``."""
    if text in ("logged", "similarity", "random"):
        return TargetSpec(name=text, kind=text)  # type: ignore[arg-type]
    path = Path(text)
    if (path / "learner.json").is_file() or (path / RunDir.SELECTOR / "learner.json").is_file():
        return TargetSpec(name=text, kind="selector", path=path)
    raise ConfigError(f"--policy {text!r}: not logged, similarity, random or a selector directory (a directory "
                      "holding learner.json, or a run holding selector/learner.json)")


def _policy_config(spec: TargetSpec, dim: int) -> Any:
    from memento.policies import RandomConfig, SimilarityConfig, SoftQConfig

    if spec.policy is not None:
        return spec.policy
    if spec.kind == "similarity":
        return SimilarityConfig()
    if spec.kind == "random":
        return RandomConfig()
    from memento.learn.persist import load_trained_learner

    if spec.path is None:
        raise ConfigError(f"target {spec.name!r}: a selector target needs its path")
    alpha = float(load_trained_learner(str(spec.path), dim).alpha)
    return SoftQConfig(init_qnet=str(spec.path), alpha=alpha, positive_only=_run_positive_only(Path(spec.path)))


def _run_positive_only(selector: Path) -> bool:
    """The ``positive_only`` of the soft-Q run that trained ``selector`` (a run directory, or its ``selector/``),
    read from the run's ``config.json``; False when the selector is not a run's."""
    if (selector / RunDir.SELECTOR / "learner.json").is_file():
        run = selector
    elif selector.name == RunDir.SELECTOR:
        run = selector.parent
    else:
        return False
    if not (run / RunDir.CONFIG).is_file():
        return False
    data = read_json(run / RunDir.CONFIG)
    policy = data.get("policy") if isinstance(data, dict) else None
    return isinstance(policy, dict) and policy.get("kind") == "soft_q" and bool(policy.get("positive_only", False))


def _target_slates(spec: TargetSpec, steps: Sequence[LoggedStep], candidates: Sequence[Any], state_ND: np.ndarray,
                   *, logger_d: Sequence[SlateDistribution], policy: Any, greedy: bool,
                   rng: np.random.Generator) -> list[SlateDistribution]:
    """Each step's target slate distribution over the step's candidates (``logger_d`` itself for ``logged``)."""
    if spec.kind == "logged":
        return list(logger_d)
    out = []
    for step, cands, state_D in zip(steps, candidates, state_ND):
        sel = policy.select(state_D, cands, step.k, rng=rng, greedy=greedy)
        c = len(cands)
        if sel.greedy:
            out.append(SlateDistribution.fixed(cands.rows_of(list(sel.ids)), c))
            continue
        probs_C = np.zeros(c)
        probs_C[cands.rows_of(list(sel.candidate_ids))] = np.asarray(sel.probs_C, dtype=np.float64)
        out.append(SlateDistribution.plackett_luce(probs_C, step.k))
    return out


# ---------------------------------------------------------------- estimates


def _padded(rows: Sequence[np.ndarray], width: int) -> np.ndarray:
    out = np.zeros((len(rows), width) + rows[0].shape[1:], dtype=np.float64)
    for i, row in enumerate(rows):
        out[i, :row.shape[0]] = row
    return out


def _estimate(steps: Sequence[LoggedStep], logger_d: Sequence[SlateDistribution],
              target_d: Sequence[SlateDistribution], rhat_NC: np.ndarray, *, config: OPEConfig,
              rng: np.random.Generator, logger_m: Sequence[SlateMoments] | None) -> list[OPEResult]:
    width = rhat_NC.shape[1]
    reward_N = np.asarray([s.record.reward for s in steps], dtype=np.float64)
    action_N = np.asarray([s.chosen_rows[0] for s in steps], dtype=np.int64)
    p_log_NC = _padded([d.first_draw() for d in logger_d], width)
    pi_NC = _padded([d.first_draw() for d in target_d], width)
    results = estimate_k1(reward_N, action_N, p_log_NC, pi_NC, rhat_NC=rhat_NC, rng=rng, config=config)
    if max(s.k for s in steps) > 1:
        rounds = [SlateRound(logger=mu, target=pi, slate_K=s.chosen_rows, reward=float(s.record.reward))
                  for s, mu, pi in zip(steps, logger_d, target_d)]
        results += estimate_slates(rounds, rng=rng, config=config, logger_moments=logger_m)
    return results


REWARD_RANGE = (0.0, 1.0)
"""Every reward's range (:func:`memento.types.check_reward`); a log whose rewards lie outside widens it."""

_RANGE_TOL = 1e-9
_TRUST_ORDER = ("dr", "snips", "dm")
"""The bottom line's order of preference among a target's estimators (see :func:`bottom_line`)."""


def reward_range(reward_N: np.ndarray) -> tuple[float, float]:
    """The range a policy's value lies in: [0, 1], widened to the logged rewards where some lie outside it."""
    low, high = REWARD_RANGE
    if reward_N.size:
        low, high = min(low, float(np.min(reward_N))), max(high, float(np.max(reward_N)))
    return low, high


def outside_range(result: OPEResult, bounds: tuple[float, float]) -> bool:
    """Whether the estimate's value lies outside ``bounds`` (no policy can score there: the estimator's variance
    or bias shows); a value that is not a number is not flagged (it is ``null`` already)."""
    return math.isfinite(result.value) and not bounds[0] - _RANGE_TOL <= result.value <= bounds[1] + _RANGE_TOL


@dataclasses.dataclass(frozen=True, kw_only=True)
class BottomLine:
    """The estimate to read for one target (:func:`bottom_line`): its ``result``, ``why`` it was chosen, and
    ``vs_logged``: its value minus the logging policy's (the observed mean reward, measured on policy)."""

    target: str
    result: OPEResult
    why: str
    vs_logged: float | None
    outside: bool

    def to_json(self) -> dict[str, Any]:
        r = self.result.to_json()
        return {"estimator": r["estimator"], "value": r["value"], "ci_low": r["ci_low"], "ci_high": r["ci_high"],
                "outside_reward_range": self.outside, "vs_logged": _finite(self.vs_logged), "why": self.why}


def _finite(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def _failed_checks(result: OPEResult, bounds: tuple[float, float]) -> list[str]:
    failed = []
    weighted = result.estimator != "dm"  # DM has no importance weights: support and ESS do not apply
    if weighted and any(w.startswith("support violation") for w in result.warnings):
        failed.append("support")
    if any(w.startswith("low effective sample size") for w in result.warnings):
        failed.append("ESS")
    if not math.isfinite(result.value):
        failed.append("undefined")
    elif outside_range(result, bounds):
        failed.append("range")
    return failed


def bottom_line(target: str, results: Sequence[OPEResult], *, logged: bool, bounds: tuple[float, float],
                observed_mean: float) -> BottomLine | None:
    """The estimator to trust for ``target``. The logging policy itself (``logged``): SNIPS, its observed mean
    reward. Any other target: the first of DR, SNIPS, DM whose checks pass (DR and SNIPS: no support violation
    and an effective sample size of at least 10% of the rounds; all three: a value inside ``bounds``; DM has no
    weights and needs no support, its bias is the reward model's); when none passes, DM, flagged, saying which
    checks each failed. ``None`` without any of them."""
    by_name = {r.estimator: r for r in results}
    if logged and "snips" in by_name:
        r = by_name["snips"]
        return BottomLine(target=target, result=r, why="the logging policy: its observed mean reward",
                          vs_logged=r.value - observed_mean, outside=outside_range(r, bounds))
    failures = []
    for name in _TRUST_ORDER:
        if name not in by_name:
            continue
        failed = _failed_checks(by_name[name], bounds)
        if not failed:
            checks = "range check" if name == "dm" else "support, ESS and range checks"
            why = "; ".join([f"{name} passes its {checks}", *failures])
            r = by_name[name]
            return BottomLine(target=target, result=r, why=why, vs_logged=r.value - observed_mean,
                              outside=False)
        failures.append(f"{name} fails {', '.join(failed)}")
    for name in reversed(_TRUST_ORDER):  # nothing passed: the model-based one, flagged
        if name in by_name:
            r = by_name[name]
            return BottomLine(target=target, result=r, why="; ".join(["no estimator passes its checks", *failures]),
                              vs_logged=r.value - observed_mean, outside=outside_range(r, bounds))
    return None


def format_table(estimates: dict[str, list[OPEResult]], level: float, *,
                 bounds: tuple[float, float] | None = REWARD_RANGE,
                 bottom_lines: dict[str, BottomLine] | None = None) -> str:
    """The estimates as a text table (a value outside the reward range ``bounds`` marked ``!``, with a footnote),
    then each target's warnings (each once, naming the estimators it concerns) and each target's bottom line."""
    ci = f"{round(level * 100):d}% CI"
    lines = [f"{'target':<24} {'estimator':<14} {'value':>8}   {ci:<20} {'ESS':>9} {'n':>7}"]
    notes: list[str] = []
    flagged = False
    for target, results in estimates.items():
        concerns: dict[str, list[str]] = {}
        for r in results:
            interval = "-" if r.ci_low is None else f"[{r.ci_low:.4f}, {r.ci_high:.4f}]"
            ess = "-" if r.ess is None else f"{r.ess:.1f}"
            mark = "!" if bounds is not None and outside_range(r, bounds) else " "
            flagged |= mark == "!"
            lines.append(f"{target[-24:]:<24} {r.estimator:<14} {r.value:>8.4f}{mark}  {interval:<20} {ess:>9} "
                         f"{r.n:>7}")
            for note in r.warnings:
                concerns.setdefault(note, []).append(r.estimator)
        notes += [f"warning ({target}: {', '.join(names)}): {note}" for note, names in concerns.items()]
    if flagged and bounds is not None:
        lines.append(f"! outside the reward range [{bounds[0]:g}, {bounds[1]:g}]: no policy scores there; the "
                     "estimator's variance or bias shows, not a value")
    bottom = []
    for target, line in (bottom_lines or {}).items():
        r = line.result
        interval = "" if r.ci_low is None else f" [{r.ci_low:.4f}, {r.ci_high:.4f}]"
        versus = "" if line.vs_logged is None else f", {line.vs_logged:+.4f} vs logged"
        bottom.append(f"bottom line ({target}): {r.estimator} {r.value:.4f}{'!' if line.outside else ''}{interval}"
                      f"{versus} ({line.why})")
    return "\n".join(lines + notes + bottom)


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class LoadedSteps:
    """The usable steps with what every estimate needs: state vectors, candidate sets (with their vectors and
    stored rewards) and the logging policy's slate distribution of each step."""

    steps: list[LoggedStep]
    state_ND: np.ndarray
    candidates: list[Any]
    stored: list[np.ndarray]
    logger_d: list[SlateDistribution]

    @property
    def k_max(self) -> int:
        return max(step.k for step in self.steps)

    @property
    def reward_N(self) -> np.ndarray:
        return np.asarray([step.record.reward for step in self.steps], dtype=np.float64)

    @property
    def action_N(self) -> np.ndarray:
        return np.asarray([step.chosen_rows[0] for step in self.steps], dtype=np.int64)


def _stored_rewards(bank: Any, ids: Sequence[str]) -> np.ndarray:
    """The candidates' stored rewards, read through their whole rows (a damaged row is refused, not skipped); a
    logged candidate deleted since is read too."""
    return np.array([case.reward for case in bank.get(list(ids), include_deleted=True)], dtype=np.float64)


def _load_steps(steps: list[LoggedStep], steps_path: Path, bank: Any, encode: Any) -> LoadedSteps:
    from memento.bank import Candidates

    positions = []
    for step in steps:
        try:
            positions.append(bank.positions_of(step.record.candidate_ids))
        except UnknownCaseError as error:
            raise DataFormatError(f"a candidate is not in the bank {bank.path}: {error}", path=steps_path,
                                  line=step.line) from None
    texts = sorted({step.record.state for step in steps})
    row_of = {text: i for i, text in enumerate(texts)}
    state_ND = encode(texts)[[row_of[step.record.state] for step in steps]].astype(np.float64)
    candidates = []
    for step, p, state_D in zip(steps, positions, state_ND):
        cases_CD = bank.embeddings_at(p).astype(np.float32)
        candidates.append(Candidates(ids=list(step.record.candidate_ids), positions_C=p,
                                     scores_C=(cases_CD @ state_D.astype(np.float32)), embeddings_CD=cases_CD))
    return LoadedSteps(steps=steps, state_ND=state_ND, candidates=candidates,
                  stored=[_stored_rewards(bank, step.record.candidate_ids) for step in steps],
                  logger_d=[step.logger() for step in steps])


def _evaluate_targets(specs: Sequence[TargetSpec], data: LoadedSteps, *, bank: Any, encode: Any, make_policy: Any,
                      config: OPEConfig, greedy: bool, seed: int) -> dict[str, list[OPEResult]]:
    """Every target's estimates. Seeds: the reward model's folds, the targets' choices, the logger's Monte Carlo
    moments and each target's bootstrap come from separate children of ``seed``."""
    from memento.learn.features import CaseFeaturizer
    from memento.learn.policy import PolicyContext

    seeds = np.random.SeedSequence(seed).spawn(3 + len(specs))
    width = max(len(c) for c in data.candidates)
    features = _padded([reward_features(s_D[None], c.embeddings_CD[None], r_C[None])[0]
                        for s_D, c, r_C in zip(data.state_ND, data.candidates, data.stored)], width)
    rhat_NC = cross_fit_rewards(features, data.action_N, data.reward_N, rng=np.random.default_rng(seeds[0]),
                                config=config.reward_model)
    logger_m = None  # the logger's Plackett-Luce moments, shared by every target
    if data.k_max > 1:
        moment_rng = np.random.default_rng(seeds[2])
        logger_m = [slate_moments(d, pairs=True, rng=moment_rng, max_enumerate=config.max_enumerate,
                                  mc_samples=config.mc_samples) for d in data.logger_d]
    context = PolicyContext(dim=bank.dim, k_max=data.k_max, reward_of=bank.rewards,
                            featurizer=CaseFeaturizer(bank, encode, store=False), evidence_of=bank.evidence_at)
    estimates: dict[str, list[OPEResult]] = {}
    for i, spec in enumerate(specs):
        policy = None if spec.kind == "logged" else make_policy(_policy_config(spec, bank.dim), context)
        target_d = _target_slates(spec, data.steps, data.candidates, data.state_ND, logger_d=data.logger_d,
                                  policy=policy, greedy=greedy, rng=np.random.default_rng(seeds[1]))
        estimates[spec.name] = _estimate(data.steps, data.logger_d, target_d, rhat_NC, config=config,
                                         rng=np.random.default_rng(seeds[3 + i]), logger_m=logger_m)
    return estimates


def export_rounds(data: LoadedSteps) -> list[ExportRound]:
    return [ExportRound(state_D=s_D, candidate_ids=step.record.candidate_ids, cases_CD=c.embeddings_CD,
                        stored_rewards_C=r_C, action=int(step.chosen_rows[0]), reward=float(step.record.reward),
                        propensity=float(d.first_draw()[step.chosen_rows[0]]))
            for step, s_D, c, r_C, d in zip(data.steps, data.state_ND, data.candidates, data.stored, data.logger_d)]


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class Evaluation:
    """What :func:`evaluate_run` found: the log (``source``) and ``bank`` it read, its usable ``rounds``, the steps
    ``skipped`` (no choice), the ``multi_step`` decisions (``done`` false, each evaluated as a one-step round), the
    largest ``k_max``, the ``observed_mean_reward``, the ``logging_policy`` names, the ``config``, ``seed`` and
    ``greedy`` it ran with, and ``estimates``: each target's results
    (:class:`~memento.ope.estimators.OPEResult`), by name."""

    source: Path
    bank: Path | str
    rounds: int
    skipped: int
    multi_step: int
    k_max: int
    observed_mean_reward: float
    logging_policy: list[str]
    config: OPEConfig
    seed: int
    greedy: bool
    estimates: dict[str, list[OPEResult]]
    reward_range: tuple[float, float] = REWARD_RANGE
    bottom_lines: dict[str, BottomLine] = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` document of ``memento evaluate``."""
        def result(r: OPEResult) -> dict[str, Any]:
            return {**r.to_json(), "outside_reward_range": outside_range(r, self.reward_range)}

        return {"source": str(self.source), "bank": str(self.bank), "rounds": self.rounds, "skipped": self.skipped,
                "k_max": self.k_max, "observed_mean_reward": self.observed_mean_reward,
                "logging_policy": self.logging_policy, "bootstrap": self.config.n_boot, "level": self.config.level,
                "seed": self.seed, "greedy_targets": self.greedy, "reward_range": list(self.reward_range),
                "targets": {name: {r.estimator: result(r) for r in results}
                            for name, results in self.estimates.items()},
                "bottom_line": {name: line.to_json() for name, line in self.bottom_lines.items()}}

    def table(self) -> str:
        """The text report: :func:`format_table` with this evaluation's reward range and bottom lines."""
        return format_table(self.estimates, self.config.level, bounds=self.reward_range,
                            bottom_lines=self.bottom_lines)


def target_specs(targets: Sequence[str | TargetSpec]) -> list[TargetSpec]:
    """The targets as specs (strings through :func:`parse_target`), one per name (a repeated name: the last)."""
    specs = [t if isinstance(t, TargetSpec) else parse_target(t) for t in targets]
    return list({spec.name: spec for spec in specs}.values())


@contextlib.contextmanager
def _damaged_bank(path: Path | str, *, rows: bool = False) -> Iterator[None]:
    """Turn SQLite's "malformed" errors (a bank file damaged past its header, which ``CaseBank.open`` alone does not
    read) and, with ``rows``, a stored case whose ``meta`` is not JSON, into a one-line :class:`BankError`."""
    try:
        yield
    except sqlite3.DatabaseError as error:
        raise BankError(f"{path}: damaged bank (cases.sqlite: {error})") from None
    except json.JSONDecodeError as error:
        if not rows:
            raise
        raise BankError(f"{path}: damaged bank (cases.sqlite: a stored case's meta is not JSON: {error})") from None


def run_evaluation(source: str | Path, specs: Sequence[TargetSpec], *, bank: str | Path | None, config: OPEConfig,
                   make_policy: Any | None, encoder: Any | None, encoder_path: str | None, greedy: bool, seed: int,
                   warn: Callable[[str], None]) -> tuple[Evaluation, LoadedSteps]:
    """Read the log, open the bank, load the encoder (``encoder``, else the one at ``encoder_path``) and estimate
    every target; also the loaded steps (for the exports). Cheap checks come before the bank and the encoder."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"seed={seed!r}: must be an integer >= 0")
    if make_policy is None and any(spec.kind != "logged" for spec in specs):
        raise ConfigError("the similarity, random and selector targets need make_policy")
    source = Path(source)
    steps_path = RunDir(source).steps if source.is_dir() else source
    from memento.bank.uri import bank_name

    # a directory or milvus:URI[#collection]; a malformed name is one line before the log is read
    bank_path = bank_name(bank) if bank else steps_path.parent / RunDir.BANK
    steps, skipped = read_log(steps_path)
    multi_step = sum(not step.record.done for step in steps)
    if multi_step:
        warn(f"{steps_path} holds multi-step decisions (done=false); each is evaluated as a one-step round, so "
             "later rewards it led to are not credited")

    from memento.bank import open_bank
    from memento.runs.qa import encode_checked

    with _damaged_bank(bank_path):
        opened = open_bank(bank_path, read_only=True)
    with opened:
        if encoder is None:
            from memento.encoders import Encoder

            encoder = Encoder.from_pretrained(encoder_path)

        def encode(texts: list[str]) -> np.ndarray:
            return encode_checked(encoder, opened.dim, texts)

        with _damaged_bank(bank_path, rows=True):  # every candidate's row and vector is read here
            data = _load_steps(steps, steps_path, opened, encode)
        with _damaged_bank(bank_path):
            estimates = _evaluate_targets(specs, data, bank=opened, encode=encode, make_policy=make_policy,
                                          config=config, greedy=greedy, seed=seed) if specs else {}
    bounds = reward_range(data.reward_N)
    observed = float(np.mean(data.reward_N))
    kinds = {spec.name: spec.kind for spec in specs}
    lines = {name: bottom_line(name, results, logged=kinds.get(name) == "logged", bounds=bounds,
                               observed_mean=observed) for name, results in estimates.items()}
    evaluation = Evaluation(source=steps_path, bank=bank_path, rounds=len(steps), skipped=skipped,
                            multi_step=multi_step, k_max=data.k_max, observed_mean_reward=observed,
                            logging_policy=sorted({step.record.policy for step in steps}), config=config, seed=seed,
                            greedy=bool(greedy), estimates=estimates, reward_range=bounds,
                            bottom_lines={name: line for name, line in lines.items() if line is not None})
    return evaluation, data


def evaluate_run(run: str | Path, targets: Sequence[str | TargetSpec], *, make_policy: Any | None = None,
                 encoder: Any | None = None, encoder_path: str | None = None, bank: str | Path | None = None,
                 greedy: bool = False, n_boot: int = 1000, level: float = 0.95, folds: int = 5,
                 seed: int = 0) -> Evaluation:
    """``memento evaluate`` from Python: estimate each of ``targets`` (``logged``, ``similarity``, ``random``, a
    selector directory, or a :class:`TargetSpec`) from ``run`` (a run directory or its ``steps.jsonl``; the bank
    is ``bank`` or the ``bank/`` beside the log). ``make_policy`` (``memento.policies.make_policy``) builds every target
    but ``logged``; ``encoder`` must be the one the run used (``None``: the one at ``encoder_path``, by default
    the bundled all-MiniLM-L6-v2); ``greedy``: each target's arg-max choice instead of its sampling distribution;
    ``n_boot`` bootstrap resamples at ``level``; ``folds`` of the cross-fitted reward model; ``seed`` of the
    bootstrap, the folds and Monte Carlo moments. A multi-step log is evaluated step by step (a logged
    warning)."""
    config = OPEConfig(n_boot=n_boot, level=level, reward_model=RewardModelConfig(folds=folds))
    evaluation, _ = run_evaluation(run, target_specs(targets), bank=bank, config=config, make_policy=make_policy,
                                   encoder=encoder, encoder_path=encoder_path, greedy=greedy, seed=seed,
                                   warn=logger.warning)
    return evaluation
