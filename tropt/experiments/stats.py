"""Selection statistics and decisions: is a candidate's difference to the baseline real, and big enough to act on?

The test (documented, and the same for every candidate):

* Scores are paired by seed: candidate and baseline runs with the same seed saw the same data order and start.
  Only seeds where both runs succeeded are paired. ``gain`` is the paired difference signed so that positive is
  better (candidate − baseline for higher-is-better metrics, baseline − candidate for losses).
* Fewer than ``MIN_SEEDS`` (3) pairs: **inconclusive**, never a winner.
* The decision reads the paired differences only: their mean, the 95% t confidence interval of that mean (scipy's
  ``ttest_rel(...).confidence_interval()``) and the two-sided paired t-test's p-value. The spread of the baseline
  between seeds (``noise``) is reported beside them, never used as a yardstick: the pairing removes it, so a small
  gain seen on every seed is a gain however much the seeds differ from each other.
* Many candidates, one family: every p-value of a comparison is adjusted by Holm's step-down method
  (:func:`holm`), which keeps the chance of *any* false claim among the candidates (family-wise error) at
  ``ALPHA`` (0.05). ``p_adjusted`` is reported beside ``p_value``; ``family_size`` says how many were adjusted.
* **Adopt** needs the Holm-adjusted p < ``ALPHA`` *and* the interval's lower bound above the minimum effect,
  ``Guardrails.min_effect``: the smallest gain worth acting on, in the metric's units (or a fraction of the
  baseline's mean with ``relative=True``). Its default is ``MIN_EFFECT`` = 0.5% of the baseline's mean: smaller
  consistent differences are what incidental changes produce (a 1% learning-rate change moved an under-trained
  model's loss by 0.34% on every seed), and it keeps a deterministic but negligible difference from being adopted.
* **Reject: quality** is non-inferiority: the Holm-adjusted p < ``ALPHA`` *and* the interval's upper bound below
  minus the guardrail's allowed drop (the whole interval lies beyond it). A drop whose interval reaches inside the
  allowed drop is not rejected on quality (it is not adopted either).
* When the seeds change nothing (every run of the baseline and candidate gives the same score for all seeds) the
  variation cannot be measured: **inconclusive**, with that reason.

Decisions (:func:`decide`), in this order: reject for instability (more unstable runs than the baseline plus
``Guardrails.max_instability_increase``, even if faster); inconclusive when the baseline failed or a candidate's
run raised; escalate for budget when runs were cut short by the seconds cap (the comparison is not at the stated
budget, so quality is not judged); reject for quality (above); escalate for budget when slower than the
guardrail's per-run limit; adopt (above, inside every guardrail); adopt for speed (non-inferior quality and faster
beyond timing noise, :mod:`tropt.experiments.speed`); otherwise inconclusive. ``adopted_for`` says which
("quality" or "speed").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypeGuard

import numpy as np

from .budget import MIN_EFFECT, Guardrails

MIN_SEEDS = 3
ALPHA = 0.05

ADOPT = "adopt"
REJECT_QUALITY = "reject: quality"
REJECT_INSTABILITY = "reject: instability"
ESCALATE = "escalate: budget"
INCONCLUSIVE = "inconclusive"
VERDICTS = (ADOPT, REJECT_QUALITY, REJECT_INSTABILITY, ESCALATE, INCONCLUSIVE)

__all__ = ["ADOPT", "ALPHA", "ESCALATE", "INCONCLUSIVE", "MIN_EFFECT", "MIN_SEEDS", "REJECT_INSTABILITY",
           "REJECT_QUALITY", "VERDICTS", "Paired", "decide", "holm", "paired"]


@dataclass
class Paired:
    """The paired comparison of one candidate with the baseline over the seeds both completed."""

    n: int
    gain: float  # mean paired difference, positive = better
    gain_std: float
    ci_low: float  # 95% t interval of the mean gain
    ci_high: float
    p_value: float  # two-sided paired t-test, unadjusted
    noise: float  # the baseline's standard deviation over seeds (reported, not a yardstick)
    beyond_noise: bool  # the 95% interval excludes zero (p < alpha), in either direction
    note: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _constant(x: np.ndarray) -> bool:
    return bool(x.size == 0 or np.all(x == x[0]))


def _std(x: np.ndarray) -> float:
    return float(np.std(x, ddof=1)) if x.size > 1 else math.nan


def paired(base: dict[int, float], cand: dict[int, float], higher_is_better: bool, *, alpha: float = ALPHA,
           min_seeds: int = MIN_SEEDS) -> Paired:
    """Pair ``cand`` with ``base`` by seed (finite scores only): the mean paired gain, its interval and p-value."""
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
    if _constant(base_all) and _constant(c):  # exactly equal (a std of equal floats can be 1e-16, not 0)
        return Paired(n, gain, gain_std, nan, nan, nan, 0.0, False,
                      "every seed gave the same score, so seed noise cannot be measured (the seeds change neither the "
                      "data order nor the initialisation): shuffle the training data (a Dataset or a shuffling "
                      "DataLoader) or pass reinit=True")
    from scipy import stats

    if gain_std == 0:  # identical differences: the t statistic is infinite
        p = 0.0 if gain != 0 else 1.0
        lo = hi = gain
    else:
        se = gain_std / math.sqrt(n)
        p = float(min(1.0, 2 * stats.t.sf(abs(gain) / se, n - 1)))  # scipy's ttest_rel(c, b).pvalue, computed directly
        half = float(stats.t.ppf(1 - alpha / 2, n - 1)) * se
        lo, hi = gain - half, gain + half
    beyond = p < alpha
    level = f"{100 * (1 - alpha):g}%"
    if beyond:
        note = f"the paired {level} interval {lo:.3g}..{hi:.3g} excludes zero (p={p:.3g} < {alpha})"
    else:
        note = f"within seed noise: the paired {level} interval {lo:.3g}..{hi:.3g} includes zero (p={p:.3g} over {n} " \
               "seeds)"
    return Paired(n, gain, gain_std, lo, hi, p, noise, beyond, note)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment of ``p_values`` (one family): the adjusted p of the i-th smallest of m is
    ``max over j <= i of min(1, (m - j + 1) p_(j))``. A NaN (a candidate with no test) stays NaN and does not count
    in m. Rejecting every adjusted p below alpha keeps the family-wise error at alpha under any dependence."""
    p = [float(x) for x in p_values]
    finite = sorted((v, i) for i, v in enumerate(p) if math.isfinite(v))
    m = len(finite)
    out = [math.nan] * len(p)
    running = 0.0
    for rank, (v, i) in enumerate(finite):
        running = max(running, min(1.0, (m - rank) * v))
        out[i] = running
    return out


def _g(x: Any) -> str:
    return f"{x:.4g}" if isinstance(x, (int, float)) and x is not None and math.isfinite(x) else "n/a"


def _quality(stats: Paired, numbers: str, allowed: float, min_eff: float,
             p_adj: float, family: int) -> tuple[str, str] | None:
    """The quality verdict from the paired interval: (REJECT_QUALITY or ADOPT, reason), or None (inconclusive)."""
    significant = _finite(p_adj) and p_adj < ALPHA
    holm_text = (f"Holm-adjusted p={_g(p_adj)} < {ALPHA} over {family} candidate{'s' if family != 1 else ''}"
                 if significant else "")
    if significant and stats.gain < 0 and stats.ci_high < -allowed:
        return REJECT_QUALITY, (f"quality dropped by {_g(-stats.gain)}: the whole 95% interval of the change "
                                f"({_g(stats.ci_low)}..{_g(stats.ci_high)}) lies beyond the guardrail's allowed drop "
                                f"{_g(allowed)} (non-inferiority rejected; {holm_text}): {numbers}")
    if significant and stats.gain > 0 and stats.ci_low > min_eff:
        return ADOPT, (f"better: the 95% interval of the gain ({_g(stats.ci_low)}..{_g(stats.ci_high)}) lies above "
                       f"min_effect {_g(min_eff)} ({holm_text}), inside every guardrail: {numbers}")
    return None


def _inconclusive_reason(stats: Paired, numbers: str, allowed: float, min_eff: float, p_adj: float,
                         family: int) -> str:
    if not _finite(stats.p_value) or stats.p_value >= ALPHA:
        return f"{stats.note}: {numbers}"
    if not (_finite(p_adj) and p_adj < ALPHA):
        return (f"p={_g(stats.p_value)} alone, but the Holm-adjusted p={_g(p_adj)} >= {ALPHA} over {family} "
                f"candidates: a difference this size is expected by chance among that many: {numbers}")
    if stats.gain > 0:
        return (f"better beyond seed noise (the interval excludes zero), but by too little to adopt: the 95% "
                f"interval of the gain ({_g(stats.ci_low)}..{_g(stats.ci_high)}) does not clear min_effect "
                f"{_g(min_eff)}, the smallest gain worth acting on (Guardrails(min_effect=...)): {numbers}")
    return (f"worse, but not beyond the guardrail: the 95% interval of the change ({_g(stats.ci_low)}.."
            f"{_g(stats.ci_high)}) reaches inside the allowed drop {_g(allowed)}: {numbers}")


def decide(name: str, cand_runs: list[dict], base_runs: list[dict], stats: Paired, *, metric: str,
           guardrails: Guardrails, higher_is_better: bool, p_adjusted: float | None = None,
           family: int = 1, overrides: Any = None) -> dict[str, Any]:
    """One verdict for one candidate, with the numbers behind it.

    ``p_adjusted`` is the candidate's p-value after Holm's adjustment over the ``family`` candidates of its
    comparison (:meth:`Comparison.decision` computes it); None judges the candidate alone (its own p-value).
    ``overrides`` (the candidate's Setup keywords) tell whether it can change the compute per step, which a
    candidate adopted for speed must (:mod:`tropt.experiments.speed`).
    """
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
    p_adj = stats.p_value if p_adjusted is None else p_adjusted
    allowed = guardrails.allowed_drop(b_mean) if math.isfinite(b_mean) else 0.0
    min_eff = guardrails.required_gain(b_mean) if math.isfinite(b_mean) else 0.0
    numbers = (f"{metric} {_g(c_mean)} vs baseline {_g(b_mean)}; paired gain {_g(stats.gain)} "
               f"(95% CI {_g(stats.ci_low)}..{_g(stats.ci_high)}, p={_g(stats.p_value)}, Holm-adjusted p={_g(p_adj)}, "
               f"{stats.n} seeds; the baseline's spread between seeds {_g(stats.noise)})")
    costs: list[float] = [r["cost"] for r in cand_runs if _finite(r.get("cost"))]  # finite: the key is there
    out = {"candidate": name, "metric": metric, "mean": c_mean, "baseline_mean": b_mean, "gain": stats.gain,
           "ci_low": stats.ci_low, "ci_high": stats.ci_high, "p_value": stats.p_value, "p_adjusted": p_adj,
           "family_size": family, "min_effect": min_eff, "allowed_drop": allowed,
           "noise": stats.noise, "seeds": stats.n, "unstable_runs": unstable_c,
           "baseline_unstable_runs": unstable_b, "failed_runs": sum(r["status"] == "failed" for r in cand_runs),
           "seconds": secs_c, "baseline_seconds": secs_b, "cost_per_run": float(np.mean(costs)) if costs else math.nan}

    def verdict(v: str, reason: str, adopted_for: str | None = None) -> dict[str, Any]:
        return {**out, "verdict": v, "reason": reason,
                "adopted_for": adopted_for or ("quality" if v == ADOPT else None)}

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
    stopped = _not_judged(cand_runs, errors)
    if stopped:
        return verdict(INCONCLUSIVE, stopped)
    capped = [r for r in cand_runs + base_runs if r.get("stopped_by") == "seconds"]
    if capped:
        mine = sum(r["candidate"] == name for r in capped)
        r = capped[0]
        return verdict(ESCALATE, f"{mine}/{n_c} of its runs and {len(capped) - mine}/{n_b} of the baseline's hit the "
                                 "seconds cap before the steps/samples budget "
                                 f"(e.g. seed {r['seed']} after {r['steps']} steps, {r['samples']} samples, "
                                 f"{_g(r['seconds'])} s): the comparison is not at the stated budget; raise "
                                 "Budget(seconds=...) or lower steps/samples")
    judged = _quality(stats, numbers, allowed, min_eff, p_adj, family)
    if judged is not None and judged[0] == REJECT_QUALITY:
        return verdict(*judged)
    limit = guardrails.max_seconds
    if limit is not None and secs_c > limit:
        return verdict(ESCALATE, f"{_g(secs_c)} s per run exceeds the guardrail's {_g(limit)} s "
                                 f"(baseline {_g(secs_b)} s)")
    if judged is not None:
        return verdict(*judged)
    from .speed import speed_verdict

    fast, why, sp = speed_verdict(cand_runs, base_runs, stats, overrides, max(allowed, min_eff))
    out.update(speedup=sp.speedup, speed_ratio_high=sp.ratio_high, speed_p=sp.p_value) if sp is not None else None
    if fast:
        return verdict(ADOPT, f"{why}: {numbers}", "speed")
    reason = _inconclusive_reason(stats, numbers, allowed, min_eff, p_adj, family)
    return verdict(INCONCLUSIVE, f"{reason}; not adopted for speed: {why}" if why else reason)


def _not_judged(cand_runs: list[dict], errors: list[dict]) -> str:
    """Why a candidate is not judged: pruned by rank (experiments.pruning: its scores are not at the budget), or
    some of its runs raised; '' when it is judged."""
    pruned = [r for r in cand_runs if r.get("stopped_by") == "pruned"]
    if pruned:
        return (f"{pruned[0]['reason'] or 'pruned'}; {len(pruned)}/{len(cand_runs)} of its runs were pruned or not "
                "run, so it is not judged at the budget")
    return (f"{len(errors)}/{len(cand_runs)} runs raised ({errors[0]['reason']}); fix the candidate and compare again"
            if errors else "")


def _finite(x: Any) -> TypeGuard[float]:
    return isinstance(x, (int, float)) and x is not None and math.isfinite(x)
