"""tropt — diagnose PyTorch training setups before you tune them.

The public API is loaded lazily: ``import tropt`` imports no plotting, widget or notebook library and changes no
global state. Start with :func:`tropt.diagnose` on a :class:`tropt.Setup`, or :func:`tropt.list_checks`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .lazy import lazy_attrs

if TYPE_CHECKING:  # what type checkers see; at run time each name loads on first access
    from tropt.checkdocs import explain as explain
    from tropt.core.batch import batch_size as batch_size
    from tropt.core.batch import split_batch as split_batch
    from tropt.core.batch import to_device as to_device
    from tropt.diagnosis import diagnose as diagnose
    from tropt.errors import TroptError as TroptError
    from tropt.experiments.budget import Budget as Budget
    from tropt.experiments.budget import Guardrails as Guardrails
    from tropt.experiments.comparison import Comparison as Comparison
    from tropt.experiments.optimize import optimize as optimize
    from tropt.experiments.orchestration import compare as compare
    from tropt.experiments.plan import OptimizationPlan as OptimizationPlan
    from tropt.experiments.replay import rerun as rerun
    from tropt.experiments.search import tune as tune
    from tropt.experiments.suggest import suggest as suggest
    from tropt.identity import run_identity as run_identity
    from tropt.metric import Metric as Metric
    from tropt.model.monitor import GradientMonitor as GradientMonitor
    from tropt.registry import list_checks as list_checks
    from tropt.result import CheckResult as CheckResult
    from tropt.result import Report as Report
    from tropt.result import Status as Status
    from tropt.setup import Setup as Setup
    from tropt.snapshot import preserved as preserved
    from tropt.training import StepContext as StepContext
    from tropt.training import standard_step as standard_step
    from tropt.verdict import verdict as verdict
    from tropt.widgets import dashboard as dashboard

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
    "rerun": "tropt.experiments.replay",
    "tune": "tropt.experiments.search",
    "explain": "tropt.checkdocs",
    "verdict": "tropt.verdict",
}
_SUBMODULES = {"core", "data", "model", "loop", "dynamics", "perf", "plots", "widgets", "report", "testing", "registry",
               "experiments"}

__all__ = [*sorted(_LAZY), "__version__"]

__getattr__, __dir__ = lazy_attrs(__name__, _LAZY, _SUBMODULES)
