"""The winner's curse: the best of many candidates is re-run on fresh seeds before it is adopted.

Among several candidates, the one that looks best on the selection seeds is partly the one the seeds favoured:
its gain is biased upwards, however well each test is corrected. So when a comparison of two or more candidates
adopts one, :func:`tropt.compare` re-runs that winner and the baseline on ``confirm`` fresh seeds (by default as
many as the selection used, never reused), and :func:`apply_confirmation` keeps the adoption only when the fresh
seeds alone confirm it: a paired 95% interval above the same ``min_effect`` (one pre-stated test, p < 0.05) and no
more unstable runs than the baseline's plus the guardrail's allowance. Both results are reported side by side
(``confirm_gain``, ``confirm_ci_low``, ``confirm_ci_high``, ``confirm_p``, ``confirmed``). When the winner is not
confirmed, nothing of that comparison is adopted: the runners-up were not confirmed either.
"""

from __future__ import annotations

import math
from typing import Any

from .budget import Guardrails
from .candidates import BASELINE
from .stats import ADOPT, ALPHA, INCONCLUSIVE, paired

CONFIRM = "confirm"


def phase(record: dict) -> str:
    """A run's phase: ``"select"`` (the comparison's seeds) or ``"confirm"`` (the winner's fresh seeds)."""
    return record.get("phase") or "select"


def fresh_seeds(seeds: list[int], n: int) -> list[int]:
    """``n`` seeds none of ``seeds`` uses: the integers after the largest."""
    start = max(seeds) + 1
    return list(range(start, start + n))


def winner(rows: list[dict]) -> str | None:
    """The adopted candidate with the largest gain when two or more candidates were judged (ties: the first
    given), else None (a single candidate is one pre-stated test, with no selection to correct)."""
    adopted = [r for r in rows if r["verdict"] == ADOPT]
    if len(rows) < 2 or not adopted:
        return None
    return max(adopted, key=lambda r: r["gain"])["candidate"]


def _scores(runs: list[dict]) -> dict[int, float]:
    return {r["seed"]: r["score"] for r in runs if r["status"] == "ok" and _finite(r.get("score"))}


def _g(x: Any) -> str:
    return f"{x:.4g}" if _finite(x) else "n/a"


def apply_confirmation(comp: Any, rows: list[dict], g: Guardrails) -> list[dict]:
    """``rows`` (one decision per candidate) with the fresh-seed confirmation of the comparison's winner applied."""
    conf = comp.meta.get("confirmation")
    if not conf or not rows:
        return rows
    name, seeds = conf["candidate"], conf.get("seeds", [])
    runs = [r for r in comp.records if phase(r) == CONFIRM]
    cand = [r for r in runs if r["candidate"] == name]
    base = [r for r in runs if r["candidate"] == BASELINE]
    stats = paired(_scores(base), _scores(cand), comp.higher_is_better)
    row = next((r for r in rows if r["candidate"] == name), None)
    min_eff = row["min_effect"] if row is not None else 0.0
    unstable = sum(bool(r.get("unstable")) for r in cand) - sum(bool(r.get("unstable")) for r in base)
    ok = (_finite(stats.p_value) and stats.p_value < ALPHA and stats.gain > 0 and stats.ci_low > min_eff
          and unstable <= g.max_instability_increase)
    text = (f"on {stats.n} fresh seeds {seeds} the paired gain is {_g(stats.gain)} (95% CI {_g(stats.ci_low)}.."
            f"{_g(stats.ci_high)}, p={_g(stats.p_value)}; needs the interval above min_effect {_g(min_eff)})")
    out = []
    for r in rows:
        r = dict(r)
        if r["candidate"] == name:
            r.update(confirm_seeds=stats.n, confirm_gain=stats.gain, confirm_ci_low=stats.ci_low,
                     confirm_ci_high=stats.ci_high, confirm_p=stats.p_value, confirmed=bool(ok))
            if r["verdict"] == ADOPT and ok:
                r["reason"] = f"{r['reason']}; confirmed against the winner's curse: {text}"
            elif r["verdict"] == ADOPT:
                r["verdict"] = INCONCLUSIVE
                r["reason"] = (f"best of {len(rows)} candidates on the selection seeds, but not confirmed on fresh "
                               f"seeds: {text}; the best of many looks better than it is (the winner's curse). "
                               f"Selection: {r['reason']}")
        elif r["verdict"] == ADOPT and not ok:
            r["verdict"] = INCONCLUSIVE
            r["reason"] = (f"beat the baseline on the selection seeds, but the best candidate ({name}) was not "
                           f"confirmed on fresh seeds, so no candidate of this comparison is adopted; compare "
                           f"{r['candidate']} alone on new seeds. Selection: {r['reason']}")
        out.append(r)
    return out


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
