"""``Comparison``: what :func:`tropt.compare` returns — every run, the per-candidate table, the decisions.

Values only: the tables are computed here, drawing lives in :mod:`tropt.plots.experiments`.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ..errors import TroptError
from ..result import read_json, write_json
from .budget import Guardrails
from .candidates import BASELINE
from .stats import ADOPT, INCONCLUSIVE, REJECT_INSTABILITY, REJECT_QUALITY, Paired, decide, holm, paired

FORMAT = "tropt.comparison/1"
_VERDICT_COLOUR = {ADOPT: "#1a7f37", REJECT_QUALITY: "#cf222e", REJECT_INSTABILITY: "#cf222e", INCONCLUSIVE: "#6e7781"}


@dataclass
class Comparison:
    """The result of :func:`tropt.compare`.

    Attributes
    ----------
    records
        One dict per run (candidate × seed), including its curves under ``"curves"``.
    meta
        The comparison's settings: metric and direction, budget, seeds, candidates' overrides, guardrails,
        early stopping, notes, run identity, executor and tracking.
    """

    records: list[dict[str, Any]]
    meta: dict[str, Any] = field(default_factory=dict)

    # ------------------------------------------------------------------ basics
    @property
    def metric(self) -> str:
        return self.meta.get("metric", "val_loss")

    @property
    def higher_is_better(self) -> bool:
        return bool(self.meta.get("higher_is_better", False))

    @property
    def candidates(self) -> list[str]:
        """Names in order, the baseline first."""
        names = [BASELINE] + [n for n in self.meta.get("candidates", {}) if n != BASELINE]
        seen = {r["candidate"] for r in self.records}
        return [n for n in names if n in seen] + sorted(seen - set(names))

    @property
    def guardrails(self) -> Guardrails:
        g = self.meta.get("guardrails")
        return Guardrails.from_dict(g) if g else Guardrails()

    @property
    def notes(self) -> list[str]:
        return list(self.meta.get("notes", []))

    def _runs_of(self, name: str) -> list[dict]:
        """The runs of ``name`` on the comparison's own seeds (the winner's fresh-seed confirmation apart)."""
        from .confirmation import phase

        return sorted((r for r in self.records if r["candidate"] == name and phase(r) == "select"),
                      key=lambda r: r["seed"])

    @property
    def runs(self) -> pd.DataFrame:
        """One row per run (candidate × seed): status and reason, budget used, scores, speed, instability; the
        selection runs first, then the winner's confirmation on fresh seeds (``phase`` "confirm")."""
        from .confirmation import phase

        order = {n: i for i, n in enumerate(self.candidates)}
        recs = sorted(self.records, key=lambda r: (phase(r) != "select", order.get(r["candidate"], 0), r["seed"]))
        rows = [{k: v for k, v in r.items() if k != "curves"} for r in recs]
        return pd.DataFrame(rows)

    def curves(self, candidate: str, seed: int) -> dict[str, list]:
        """The curves of one run: ``step``/``train_loss``/``lr`` per step, ``eval_step`` and the scores per
        evaluation."""
        for r in self.records:
            if r["candidate"] == candidate and r["seed"] == seed:
                return r["curves"]
        raise TroptError(f"no run of candidate {candidate!r} with seed {seed!r}", f"candidates: {self.candidates}")

    def _scores(self, name: str) -> dict[int, float]:
        return {r["seed"]: r["score"] for r in self._runs_of(name) if r["status"] == "ok" and _finite(r["score"])}

    def paired(self, candidate: str) -> Paired:
        """The paired comparison of ``candidate`` with the baseline (see :mod:`tropt.experiments.stats`)."""
        return paired(self._scores(BASELINE), self._scores(candidate), self.higher_is_better)

    # ------------------------------------------------------------------ tables
    def decision(self, guardrails: Guardrails | None = None) -> pd.DataFrame:
        """One verdict per candidate (adopt, reject: quality, reject: instability, escalate: budget, inconclusive),
        its reason and the numbers behind it. ``guardrails`` defaults to the ones given to compare.

        The candidates are one family: their p-values are adjusted by Holm's method (``p_adjusted``, over
        ``family_size`` candidates), so the chance that any of them is adopted or rejected by chance stays at 5%.
        When two or more candidates were judged, the adopted winner must also be confirmed on fresh seeds
        (:mod:`tropt.experiments.confirmation`); ``adopted_for`` is "quality" or "speed"."""
        from .confirmation import apply_confirmation

        g = guardrails if guardrails is not None else self.guardrails
        if not isinstance(g, Guardrails):
            raise TroptError(f"decision: guardrails is a {type(g).__name__}", "pass tropt.Guardrails(...) or None")
        base = self._runs_of(BASELINE)
        names = [n for n in self.candidates if n != BASELINE]
        tests = [self.paired(n) for n in names]
        adjusted = holm([t.p_value for t in tests])
        family = sum(_finite(p) for p in adjusted)
        overrides = self.meta.get("candidates", {})
        rows = [decide(n, self._runs_of(n), base, t, metric=self.metric, guardrails=g,
                       higher_is_better=self.higher_is_better, p_adjusted=p, family=family,
                       overrides=overrides.get(n))
                for n, t, p in zip(names, tests, adjusted, strict=True)]
        rows = apply_confirmation(self, rows, g)
        cols = ["candidate", "verdict", "reason"]
        df = pd.DataFrame(rows)
        return df[cols + [c for c in df.columns if c not in cols]] if rows else pd.DataFrame(columns=cols)

    def to_frame(self, guardrails: Guardrails | None = None) -> pd.DataFrame:
        """One row per candidate (the baseline first): mean ± std over seeds, the paired gain to the baseline with
        its 95% interval, p-value and Holm-adjusted p-value, then its cost beside it, and the verdict.

        Every cost column is **per run, the mean over the candidate's runs** on the comparison's seeds: ``steps``,
        ``samples``, ``seconds`` (wall time of a run, evaluations included), ``seconds_per_step`` (training time per
        step measured inside the run, evaluations excluded), ``samples_per_s`` and ``cost`` (the priced machine time
        of a run, NaN without ``Budget(cost_per_hour=...)``). ``relative_cost`` is the candidate's mean seconds per
        run over the baseline's (its cost when priced, the same ratio). ``total_seconds`` and ``total_cost`` are
        the sums over those runs. ``peak_memory_mb`` is the highest of any run."""
        m = self.metric
        verdicts = self.decision(guardrails).set_index("candidate") if len(self.candidates) > 1 else None
        overrides = self.meta.get("candidates", {})
        base_secs = _nanmean([r["seconds"] for r in self._runs_of(BASELINE)])
        rows = []
        for name in self.candidates:
            runs = self._runs_of(name)
            ok = [r for r in runs if r["status"] == "ok" and _finite(r["score"])]
            s = np.array([r["score"] for r in ok], dtype=float)
            row: dict[str, Any] = {
                "candidate": name,
                "overrides": ", ".join(f"{k}={v}" for k, v in overrides.get(name, {}).items()) or "(the Setup)",
                "runs": len(runs), "failed": sum(r["status"] == "failed" for r in runs),
                f"{m}_mean": float(s.mean()) if s.size else math.nan,
                f"{m}_std": float(s.std(ddof=1)) if s.size > 1 else math.nan,
            }
            if name == BASELINE or verdicts is None:
                row.update(gain=0.0, ci_low=math.nan, ci_high=math.nan, p_value=math.nan, p_adjusted=math.nan)
            else:
                v = verdicts.loc[name]
                row.update(gain=v["gain"], ci_low=v["ci_low"], ci_high=v["ci_high"], p_value=v["p_value"],
                           p_adjusted=v["p_adjusted"])
            extra = sorted({k for r in ok for k in r if k.startswith("final_") or k.startswith("test_")})
            for k in extra:
                vals = [r[k] for r in ok if _finite(r.get(k))]
                row[f"{k}_mean"] = float(np.mean(vals)) if vals else math.nan
            row.update(_cost_columns(runs, base_secs))
            row["verdict"] = "baseline" if name == BASELINE or verdicts is None else verdicts.loc[name, "verdict"]
            rows.append(row)
        return pd.DataFrame(rows).set_index("candidate")

    @property
    def compared_at(self) -> str:
        """What every run was equal in: "equal steps" or "equal samples" (:mod:`tropt.experiments.fairness`)."""
        return str(self.meta.get("compared_at") or "equal steps")

    # ------------------------------------------------------------------ drawing (delegated)
    def plot_curves(self, metric: str | None = None, ax: Any = None) -> Any:
        """Mean validation curve per candidate over seeds, with a band from the lowest to the highest seed."""
        from ..plots.experiments import plot_curves

        return plot_curves(self, metric=metric, ax=ax)

    def plot_tradeoff(self, ax: Any = None) -> Any:
        """Quality against cost (or seconds) per candidate, the Pareto front marked."""
        from ..plots.experiments import plot_tradeoff

        return plot_tradeoff(self, ax=ax)

    # ------------------------------------------------------------------ serialisation
    def to_dict(self) -> dict[str, Any]:
        """JSON-safe (non-finite numbers become None)."""
        from ..result import json_safe

        return {"format": FORMAT, "meta": json_safe(self.meta), "records": json_safe(self.records)}

    def to_json(self, path: Any = None) -> str:
        return write_json(self.to_dict(), path, indent=1, allow_nan=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Comparison:
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise TroptError("not a tropt comparison "
                             f"(format {d.get('format') if isinstance(d, dict) else type(d).__name__!r})",
                             f"pass what Comparison.to_dict() wrote (format {FORMAT!r})")
        return cls([_restore_nan(r) for r in d["records"]], d.get("meta", {}))

    @classmethod
    def from_json(cls, text_or_path: str) -> Comparison:
        return cls.from_dict(read_json(text_or_path))

    # ------------------------------------------------------------------ display
    def summary(self) -> str:
        """One line: the verdict per candidate."""
        d = self.decision()
        return "; ".join(f"{r.candidate}: {r.verdict}" for r in d.itertuples()) or "no candidates"

    def _repr_html_(self) -> str:
        e = html.escape
        d = self.decision()
        items = "".join(
            f'<li><b>{e(r.candidate)}</b> — <span style="color:{_VERDICT_COLOUR.get(r.verdict, "#9a6700")}">'
            f"<b>{e(r.verdict)}</b></span>: {e(r.reason)}</li>" for r in d.itertuples())
        b = self.meta.get("budget", {})
        budget = ", ".join(f"{k}={v}" for k, v in b.items() if v is not None)
        direction = "higher is better" if self.higher_is_better else "lower is better"
        seeds = self.meta.get("seeds", [])
        notes = "".join(f"<li>{e(n)}</li>" for n in self.notes)
        conf = self.meta.get("confirmation") or {}
        frame = self.to_frame().drop(columns=["overrides"]).to_html(float_format=lambda x: f"{x:.4g}", na_rep="–",
                                                                    border=0)
        return (f'<div class="tropt-comparison"><b>tropt.compare</b> — selection metric <code>{e(self.metric)}</code> '
                f"({direction}) on the validation split, budget {e(budget)} ({e(self.compared_at)}), seeds "
                f"{e(str(seeds))}" + (f"; winner re-run on fresh seeds {e(str(conf.get('seeds')))}" if conf else "")
                + f"<ul>{items}</ul>{frame}" + (f"<div><b>Notes</b><ul>{notes}</ul></div>" if notes else "") + "</div>")

    def __repr__(self) -> str:
        return f"Comparison({len(self.records)} runs; {self.summary()})"


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _nanmean(xs: list) -> float:
    v = [x for x in xs if _finite(x)]
    return float(np.mean(v)) if v else math.nan


def _nanmax(xs: list) -> float:
    v = [x for x in xs if _finite(x)]
    return float(np.max(v)) if v else math.nan


def _cost_columns(runs: list[dict], base_secs: float) -> dict[str, Any]:
    """A candidate's cost per run (means over its runs), its relative cost and its totals (see ``to_frame``)."""
    from .speed import step_seconds

    secs = _nanmean([r["seconds"] for r in runs])
    return {
        "steps": _nanmean([r["steps"] for r in runs]), "samples": _nanmean([r["samples"] for r in runs]),
        "seconds": secs, "seconds_per_step": _nanmean([step_seconds(r) for r in runs]),
        "samples_per_s": _nanmean([r["samples_per_s"] for r in runs]),
        "cost": _nanmean([r.get("cost") for r in runs]),
        "relative_cost": secs / base_secs if _finite(secs) and _finite(base_secs) and base_secs > 0 else math.nan,
        "total_seconds": _sum_or_nan([r["seconds"] for r in runs]),
        "total_cost": _sum_or_nan([r.get("cost") for r in runs]),
        "peak_memory_mb": _nanmax([r["peak_memory_mb"] for r in runs]),
        "unstable_runs": sum(bool(r.get("unstable")) for r in runs),
        "steps_saved": int(sum(r.get("steps_saved", 0) or 0 for r in runs)),
    }


def _sum_or_nan(xs: list) -> float:
    v = [x for x in xs if _finite(x)]
    return float(np.sum(v)) if v else math.nan


_NUMERIC = ("score", "final", "best", "seconds", "train_seconds", "cpu_seconds", "samples_per_s", "peak_memory_mb",
            "seconds_per_step")


def _restore_nan(r: dict) -> dict:
    """JSON wrote NaN as null; numeric fields come back as NaN (curves keep None → NaN too)."""
    r = dict(r)
    for k, v in r.items():
        if v is None and (k in _NUMERIC or k.startswith("final_") or k.startswith("test_")):
            r[k] = math.nan
    curves = r.get("curves") or {}
    r["curves"] = {k: [math.nan if x is None else x for x in v] for k, v in curves.items()}
    return r
