"""ipywidgets panels for interactive investigation in JupyterLab.

Panels compute nothing themselves: they call the registered checks (and ``tropt.diagnose``) and draw with
:mod:`tropt.plots`. Every long action shows progress, has a Stop button that ends the run at its next step,
disables its Run button while running, and shows errors in the panel as a red message with the fix.

``ipywidgets`` is imported when a panel is first used (``pip install "tropt[widgets]"``), never by ``import tropt``.

>>> tropt.dashboard(setup, splits={"train": df_train, "test": df_test}, label="y")   # doctest: +SKIP
"""

from __future__ import annotations

from ..lazy import lazy_attrs

_LAZY = {
    "Action": "tropt.widgets._base",
    "DataPanel": "tropt.widgets.data",
    "ProtocolPanel": "tropt.widgets.protocol",
    "OverfitPanel": "tropt.widgets.model",
    "GradientFlowPanel": "tropt.widgets.model",
    "LoopPanel": "tropt.widgets.loop",
    "DynamicsPanel": "tropt.widgets.dynamics",
    "ComparePanel": "tropt.widgets.experiments",
    "Dashboard": "tropt.widgets.board",
    "dashboard": "tropt.widgets.board",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_attrs(__name__, _LAZY)
