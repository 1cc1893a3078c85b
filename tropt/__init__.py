"""tropt — diagnose PyTorch training setups before you tune them.

The public API is loaded lazily: ``import tropt`` imports no plotting, widget or notebook library and changes no
global state. Start with :func:`tropt.diagnose` on a :class:`tropt.Setup`, or :func:`tropt.list_checks`.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "Status": "tropt.result",
    "CheckResult": "tropt.result",
    "Report": "tropt.result",
    "Setup": "tropt.setup",
    "Metric": "tropt.metric",
    "StepContext": "tropt.training",
    "standard_step": "tropt.training",
    "split_batch": "tropt.core.batch",
    "batch_size": "tropt.core.batch",
    "to_device": "tropt.core.batch",
    "preserved": "tropt.snapshot",
    "TroptError": "tropt.errors",
    "list_checks": "tropt.registry",
    "diagnose": "tropt.diagnosis",
    "run_identity": "tropt.identity",
    "GradientMonitor": "tropt.model.monitor",
    "dashboard": "tropt.widgets",
    "Budget": "tropt.experiments.budget",
    "Guardrails": "tropt.experiments.budget",
    "compare": "tropt.experiments.orchestration",
    "Comparison": "tropt.experiments.comparison",
    "suggest": "tropt.experiments.suggest",
    "OptimizationPlan": "tropt.experiments.plan",
    "optimize": "tropt.experiments.optimize",
    "explain": "tropt.checkdocs",
    "verdict": "tropt.verdict",
}
_SUBMODULES = {"data", "model", "loop", "dynamics", "perf", "plots", "widgets", "report", "testing", "registry", "experiments"}

__all__ = sorted(_LAZY) + ["__version__"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f"tropt.{name}")
    raise AttributeError(f"module 'tropt' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | _SUBMODULES)
