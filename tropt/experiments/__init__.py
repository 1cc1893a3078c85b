"""Stage 7, experiments: compare candidates under one budget, over seeds, with guardrails (:func:`compare`).

Nothing heavy is imported here: scipy, dask and MLflow load only when a comparison needs them.
"""

from __future__ import annotations

import importlib
from typing import Any

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
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'tropt.experiments' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
