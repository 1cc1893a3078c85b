"""Stage 7, experiments: compare candidates under one budget, over seeds, with guardrails (:func:`compare`).

Nothing heavy is imported here: scipy, dask and MLflow load only when a comparison needs them.
"""

from __future__ import annotations

from ..lazy import lazy_attrs

_LAZY = {
    "Budget": "tropt.experiments.budget",
    "Guardrails": "tropt.experiments.budget",
    "EarlyStopping": "tropt.experiments.budget",
    "compare": "tropt.experiments.orchestration",
    "Comparison": "tropt.experiments.comparison",
    "dask_executor": "tropt.experiments.executors",
    "DaskExecutor": "tropt.experiments.executors",
    "log_comparison": "tropt.experiments.tracking",
    "VERDICTS": "tropt.experiments.stats",
    "suggest": "tropt.experiments.suggest",
    "Suggestions": "tropt.experiments.suggest",
    "OptimizationPlan": "tropt.experiments.plan",
    "optimize": "tropt.experiments.optimize",
    "rerun": "tropt.experiments.replay",
    "Rerun": "tropt.experiments.replay",
    "tune": "tropt.experiments.search",
    "Tuning": "tropt.experiments.search",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_attrs(__name__, _LAZY)
