"""Selection statistics and decisions: is a candidate's difference to the baseline bigger than seed noise?

The test (documented, and the same for every candidate):

* Scores are paired by seed: candidate and baseline runs with the same seed saw the same data order and start.
  Only seeds where both runs succeeded are paired. ``gain`` is the paired difference signed so that positive is
  better (candidate − baseline for higher-is-better metrics, baseline − candidate for losses).
* Fewer than ``MIN_SEEDS`` (3) pairs: **inconclusive**, never a winner.
* The difference is *beyond seed noise* when both hold: a two-sided paired t-test (``scipy.stats.ttest_rel``)
  gives p < ``ALPHA`` (0.05), **and** the mean gain exceeds the seed noise, the standard deviation of the
  baseline's scores over seeds (a minimum effect: significance alone can come from tiny, consistent differences).
* When the seeds change nothing (every run of the baseline and candidate gives the same score for all seeds) the
  seed noise cannot be measured: **inconclusive**, with that reason.

Decisions (:func:`decide`), in this order: reject for instability (more unstable runs than the baseline plus
``Guardrails.max_instability_increase``, even if faster); inconclusive when the baseline failed or a candidate's
run raised; escalate for budget when runs were cut short by the seconds cap (the comparison is not at the stated
budget, so quality is not judged); reject for quality (a drop beyond the guardrail *and* beyond seed noise);
escalate for budget when slower than the guardrail's per-run limit; adopt (a gain beyond seed noise, inside every
guardrail); otherwise inconclusive.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, TypeGuard

import numpy as np

from .budget import Guardrails

MIN_SEEDS = 3
ALPHA = 0.05

ADOPT = "adopt"
REJECT_QUALITY = "reject: quality"
REJECT_INSTABILITY = "reject: instability"
ESCALATE = "escalate: budget"
INCONCLUSIVE = "inconclusive"
VERDICTS = (ADOPT, REJECT_QUALITY, REJECT_INSTABILITY, ESCALATE, INCONCLUSIVE)


@dataclass
class Paired:
    """The paired comparison of one candidate with the baseline over the seeds both completed."""

    n: int
    gain: float  # mean paired difference, positive = better
    gain_std: float
    ci_low: float  # 95% t interval of the mean gain
    ci_high: float
    p_value: float
    noise: float  # the baseline's standard deviation over seeds
    beyond_noise: bool  # significant and bigger than the noise (in either direction)
    note: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _std(x: np.ndarray) -> float:
    return float(np.std(x, ddof=1)) if x.size > 1 else math.nan


def paired(base: dict[int, float], cand: dict[int, float], higher_is_better: bool, *, alpha: float = ALPHA,
           min_seeds: int = MIN_SEEDS) -> Paired:
    """Pair ``cand`` with ``base`` by seed (finite scores only) and test the difference against seed noise."""
    seeds = sorted(s for s in cand if s in base and math.isfinite(cand[s]) and math.isfinite(base[s]))
    b = np.array([base[s] for s in seeds], dtype=float)
    c = np.array([cand[s] for s in seeds], dtype=float)
    d = (c - b) if higher_is_better else (b - c)
    n = int(d.size)
    nan = math.nan
    if n == 0:
        return Paired(0, nan, nan, nan, nan, nan, nan, False,
                      "no seed where both the candidate and the baseline completed")
    gain, gain_std = float(d.mean()), _std(d)
    base_all = np.array([v for v in base.values() if math.isfinite(v)], dtype=float)
    noise = _std(base_all)
    if n < min_seeds:
        return Paired(n, gain, gain_std, nan, nan, nan, noise, False,
                      f"{n} paired seed{'s' if n != 1 else ''}; telling a difference from seed noise needs at least "
                      f"{min_seeds}")
    if (noise == 0 or not math.isfinite(noise)) and _std(c) == 0:
        return Paired(n, gain, gain_std, nan, nan, nan, 0.0, False,
                      "every seed gave the same score, so seed noise cannot be measured (the seeds change neither the "
                      "data order nor the initialisation): shuffle the training data (a Dataset or a shuffling "
                      "DataLoader) or pass reinit=True")
    from scipy import stats

    if gain_std == 0:  # identical differences: the t statistic is infinite
        p = 0.0 if gain != 0 else 1.0
        lo = hi = gain
    else:
        p = float(stats.ttest_rel(c, b).pvalue)
        half = float(stats.t.ppf(0.975, n - 1)) * gain_std / math.sqrt(n)
        lo, hi = gain - half, gain + half
    beyond = p < alpha and abs(gain) > noise
    if beyond:
        note = f"beyond seed noise: |gain| {abs(gain):.3g} > noise {noise:.3g}, p={p:.3g} < {alpha}"
    elif p >= alpha:
        note = f"within seed noise: p={p:.3g} >= {alpha} over {n} seeds"
    else:
        note = f"within seed noise: |gain| {abs(gain):.3g} <= noise {noise:.3g} (p={p:.3g})"
    return Paired(n, gain, gain_std, lo, hi, p, noise, beyond, note)


def _g(x: Any) -> str:
    return f"{x:.4g}" if isinstance(x, (int, float)) and x is not None and math.isfinite(x) else "n/a"


def decide(name: str, cand_runs: list[dict], base_runs: list[dict], stats: Paired, *, metric: str,
           guardrails: Guardrails, higher_is_better: bool) -> dict[str, Any]:
    """One verdict for one candidate, with the numbers behind it."""
    n_c, n_b = len(cand_runs), len(base_runs)
    unstable_c = sum(bool(r.get("unstable")) for r in cand_runs)
    unstable_b = sum(bool(r.get("unstable")) for r in base_runs)
    errors = [r for r in cand_runs if r["status"] == "failed" and r.get("stopped_by") == "error"]
    c_scores = np.array([r["score"] for r in cand_runs if r["status"] == "ok" and _finite(r["score"])], dtype=float)
    b_scores = np.array([r["score"] for r in base_runs if r["status"] == "ok" and _finite(r["score"])], dtype=float)
    c_mean = float(c_scores.mean()) if c_scores.size else math.nan
    b_mean = float(b_scores.mean()) if b_scores.size else math.nan
    secs_c = float(np.mean([r["seconds"] for r in cand_runs])) if cand_runs else math.nan
    secs_b = float(np.mean([r["seconds"] for r in base_runs])) if base_runs else math.nan
    numbers = (f"{metric} {_g(c_mean)} vs baseline {_g(b_mean)}; paired gain {_g(stats.gain)} "
               f"(95% CI {_g(stats.ci_low)}..{_g(stats.ci_high)}, p={_g(stats.p_value)}, seed noise {_g(stats.noise)}, "
               f"{stats.n} seeds)")
    costs: list[float] = [r["cost"] for r in cand_runs if _finite(r.get("cost"))]  # finite: the key is there
    out = {"candidate": name, "metric": metric, "mean": c_mean, "baseline_mean": b_mean, "gain": stats.gain,
           "p_value": stats.p_value, "noise": stats.noise, "seeds": stats.n, "unstable_runs": unstable_c,
           "baseline_unstable_runs": unstable_b, "failed_runs": sum(r["status"] == "failed" for r in cand_runs),
           "seconds": secs_c, "baseline_seconds": secs_b, "cost_per_run": float(np.mean(costs)) if costs else math.nan}

    def verdict(v: str, reason: str) -> dict[str, Any]:
        return {**out, "verdict": v, "reason": reason}

    if unstable_c > unstable_b + guardrails.max_instability_increase:
        kinds = {"non-finite": sum(bool(r.get("non_finite")) for r in cand_runs),
                 "spiking": sum(bool(r.get("spikes")) for r in cand_runs),
                 "diverging": sum(r.get("curve_class") == "diverging" for r in cand_runs)}
        detail = ", ".join(f"{k} {v}" for k, v in kinds.items() if v)
        faster = f"; it was faster ({_g(secs_c)} s vs {_g(secs_b)} s per run)" if secs_c < secs_b else ""
        return verdict(REJECT_INSTABILITY, f"{unstable_c}/{n_c} runs unstable ({detail}) vs baseline "
                                           f"{unstable_b}/{n_b}, allowed "
                                           f"+{guardrails.max_instability_increase}{faster}")
    if base_runs and all(r["status"] == "failed" for r in base_runs):
        return verdict(INCONCLUSIVE, f"every baseline run failed ({base_runs[0]['reason']}); there is nothing to "
                                     "compare with")
    if errors:
        return verdict(INCONCLUSIVE, f"{len(errors)}/{n_c} runs raised ({errors[0]['reason']}); fix the candidate "
                                     "and compare again")
    capped = [r for r in cand_runs + base_runs if r.get("stopped_by") == "seconds"]
    if capped:
        mine = sum(r["candidate"] == name for r in capped)
        r = capped[0]
        return verdict(ESCALATE, f"{mine}/{n_c} of its runs and {len(capped) - mine}/{n_b} of the baseline's hit the "
                                 "seconds cap before the steps/samples budget "
                                 f"(e.g. seed {r['seed']} after {r['steps']} steps, {r['samples']} samples, "
                                 f"{_g(r['seconds'])} s): the comparison is not at the stated budget; raise "
                                 "Budget(seconds=...) or lower steps/samples")
    allowed = guardrails.allowed_drop(b_mean) if math.isfinite(b_mean) else 0.0
    if stats.beyond_noise and stats.gain < 0 and -stats.gain > allowed:
        return verdict(REJECT_QUALITY, f"quality dropped by {_g(-stats.gain)} (> guardrail {_g(allowed)}), beyond "
                                       f"seed noise: {numbers}")
    limit = guardrails.max_seconds
    if limit is not None and secs_c > limit:
        return verdict(ESCALATE, f"{_g(secs_c)} s per run exceeds the guardrail's {_g(limit)} s "
                                 f"(baseline {_g(secs_b)} s)")
    if stats.beyond_noise and stats.gain > 0:
        return verdict(ADOPT, f"better beyond seed noise, inside every guardrail: {numbers}")
    return verdict(INCONCLUSIVE, f"{stats.note}: {numbers}")


def _finite(x: Any) -> TypeGuard[float]:
    return isinstance(x, (int, float)) and x is not None and math.isfinite(x)
