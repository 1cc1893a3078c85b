"""``tropt.experiments.rerun``: re-evaluate a plan's adopted change from the plan alone and check its numbers.

The plan records what the comparison was (``OptimizationPlan.rerun``: seeds, budget, eval_every, reinit, the
selection rule, early stopping, guardrails, threads, the identities and every selection run's score). Given the
same Setup (refused, naming both identities, when its configuration or data differ), the adopted candidate and the
baseline are run again on the same seeds; on CPU the scores are bit-identical.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import TroptError
from .budget import Budget, EarlyStopping, Guardrails
from .candidates import BASELINE

if TYPE_CHECKING:
    from ..setup import Setup
    from .comparison import Comparison


@dataclass
class Rerun:
    """The re-run: one row per (candidate, seed) with the plan's score and the re-run's, and the new comparison."""

    candidate: str
    rows: list[dict[str, Any]]
    comparison: Comparison

    @property
    def reproduced(self) -> bool:
        """True when every score of the plan came back (bit-identical unless ``rerun(tolerance=...)`` allows)."""
        return bool(self.rows) and all(r["reproduced"] for r in self.rows)

    def to_frame(self) -> Any:
        import pandas as pd

        return pd.DataFrame(self.rows)

    def __repr__(self) -> str:
        same = sum(r["reproduced"] for r in self.rows)
        return f"Rerun({self.candidate}: {same} of {len(self.rows)} scores reproduced)"


def _load(plan: Any) -> dict[str, Any]:
    from .plan import OptimizationPlan

    if not isinstance(plan, OptimizationPlan):
        plan = OptimizationPlan.from_json(str(plan))
    rec = dict(plan.rerun or {})
    if not rec:
        raise TroptError("rerun: the plan carries no re-run record (it was built without a comparison, or by a tropt "
                         "before plans recorded one)", "run tropt.optimize (or compare, then plan) again")
    if not rec.get("candidate"):
        raise TroptError("rerun: the plan adopted no change, so there is nothing to re-evaluate",
                         "re-run the comparison with tropt.compare to re-check a kept baseline")
    return rec


def _overrides(rec: dict[str, Any], candidates: Any) -> dict[str, Any]:
    """The adopted candidate's overrides: plain values from the plan, factories/modules/data given again."""
    name, out = rec["candidate"], dict(rec.get("overrides") or {})
    needed = dict(rec.get("given_by_setup") or {})
    given = dict((candidates or {}).get(name) or {})
    missing = {k: v for k, v in needed.items() if k not in given}
    if missing:
        raise TroptError(f"rerun: the adopted candidate {name!r} overrides {sorted(missing)} with values a plan "
                         f"cannot hold ({'; '.join(f'{k}: {v}' for k, v in missing.items())})",
                         f"give them again: rerun(plan, setup, candidates={{{name!r}: {{...}}}}) (the CLI: a setup "
                         "function returning (setup, candidates))")
    out.update({k: given[k] for k in needed})
    return out


def _refuse_other_setup(setup: Setup, rec: dict[str, Any]) -> None:
    from ..identity import run_identity
    from .provenance import _who

    planned = {k: v for k, v in (rec.get("identity") or {}).items() if v}
    setup.validate()  # compare's identity is taken on a validated Setup (describe() then names its optimizer)
    now = run_identity(setup)
    differ = [k for k in ("config_hash", "data_fingerprint") if planned.get(k) and planned[k] != now.get(k)]
    if differ:
        raise TroptError(f"rerun: the plan was compared on one Setup ({_who(planned)}) and this is another "
                         f"({_who(now)}): its {' and '.join(differ)} differ",
                         "pass the Setup the plan was made with (the same model, loss, step, optimizer and data)")


def rerun(plan: Any, setup: Setup, *, candidates: Any = None, metric: Any = None, splits: Any = None,
          executor: Any = None, progress: bool = False, tolerance: float = 0.0) -> Rerun:
    """Re-run the plan's adopted change and the baseline on the plan's seeds, under its budget and rules.

    ``plan``: an :class:`OptimizationPlan` or a plan.json path. ``candidates``: ``{name: overrides}`` for the
    adopted candidate's values a plan cannot hold (factories, modules, data). ``metric``, ``splits``: as given to
    compare. ``tolerance``: the largest absolute score difference still counted as reproduced (0: bit-identical).
    """
    from .orchestration import compare

    rec = _load(plan)
    name = rec["candidate"]
    overrides = _overrides(rec, candidates)
    _refuse_other_setup(setup, rec)
    comp = compare(setup, {name: overrides}, budget=Budget(**rec["budget"]), seeds=rec["seeds"], metric=metric,
                   eval_every=rec["eval_every"], early_stopping=EarlyStopping.coerce(rec.get("early_stopping")),
                   guardrails=Guardrails.from_dict(rec["guardrails"]) if rec.get("guardrails") else None,
                   select=rec.get("select") or "final", select_split=rec.get("select_split") or "val", splits=splits,
                   reinit=bool(rec.get("reinit")), threads=rec.get("threads"), confirm=0, executor=executor,
                   progress=progress)  # no pruning: the adopted candidate was never pruned, so its runs were whole
    if rec.get("metric") and comp.metric != rec["metric"]:
        raise TroptError(f"rerun: the plan selected on {rec['metric']!r}, this re-run on {comp.metric!r}",
                         "pass the metric the comparison used: rerun(plan, setup, metric=...)")
    rows = []
    for r in comp.records:
        planned = (rec.get("scores") or {}).get(r["candidate"], {}).get(str(r["seed"]))
        got = r.get("score")
        same = (planned is not None and got is not None and math.isfinite(got)
                and (got == planned if tolerance == 0 else abs(got - planned) <= tolerance))
        rows.append({"candidate": r["candidate"], "seed": r["seed"], "planned": planned, "rerun": got,
                     "difference": (got - planned) if planned is not None and got is not None else None,
                     "reproduced": bool(same)})
    rows.sort(key=lambda row: (row["candidate"] != BASELINE, row["seed"]))
    return Rerun(name, rows, comp)


def run_cli(plan_path: str, setup_spec: str, candidates_spec: str | None = None, json_path: str | None = None) -> int:
    """``tropt rerun``: re-run the plan's adopted change; prints each score; 0 when every one is reproduced, else 1.
    ``candidates_spec`` names a function returning ``{name: overrides}`` for the values a plan cannot hold."""
    from ..loading import load_callable, load_setup
    from ..output import write_json
    from ..result import json_safe

    setup = load_setup(setup_spec)
    given = load_callable(candidates_spec)() if candidates_spec else None
    out = rerun(plan_path, setup, candidates=given)
    for r in out.rows:
        mark = "same" if r["reproduced"] else f"differs by {r['difference']}"
        print(f"{r['candidate']:>16} seed {r['seed']}: plan {r['planned']!r}, re-run {r['rerun']!r} ({mark})")
    print(f"{out!r}")
    if json_path:
        write_json(json_safe({"candidate": out.candidate, "rows": out.rows, "reproduced": out.reproduced}), json_path,
                   indent=1)
    return 0 if out.reproduced else 1
