"""The dashboard: a Tab of the panels that apply, and "Diagnose all" (``tropt.diagnose`` in contract order with a
progress bar and Stop, ending with the report)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._base import Action, W, header

if TYPE_CHECKING:
    from ..setup import Setup


class Dashboard(W.VBox):
    """All panels that apply to what you give, in one Tab, plus "Diagnose all".

    Parameters
    ----------
    setup
        A :class:`tropt.Setup` (adds the Protocol, Overfit, Gradient flow, Loop and Dynamics tabs, and Compare when it
        has ``val_data``).
    splits
        Data splits (adds the Data tab).
    label, group, time
        Initial column choices for the data checks (the Data tab's dropdowns win when it exists).
    checks
        What "Diagnose all" runs (as ``tropt.diagnose(checks=...)``; default everything implemented).
    budget
        The initial choice of the budget dropdown: "quick", "standard" or "thorough" (``tropt.diagnose(budget=...)``).
    """

    def __init__(self, setup: Setup | None = None, splits: Any = None, *, label: Any = None, group: Any = None,
                 time: Any = None, checks: Any = None, budget: str = "standard") -> None:
        from ..errors import TroptError
        from .data import DataPanel
        from .dynamics import DynamicsPanel
        from .experiments import ComparePanel
        from .loop import LoopPanel
        from .model import GradientFlowPanel, OverfitPanel
        from .protocol import ProtocolPanel

        if setup is None and splits is None:
            raise TroptError("Dashboard needs something to check: no setup and no splits were given",
                             "pass setup=tropt.Setup(...) and/or splits={'train': df_train, 'test': df_test}")
        self.setup, self.splits, self.checks = setup, splits, checks
        self._columns = {"label": label, "group": group, "time": time}
        self.panels: dict[str, Any] = {}
        if splits is not None:
            self.panels["Data"] = DataPanel(splits, label=label, group=group, time=time)
        if setup is not None:
            self.panels["Protocol"] = ProtocolPanel(setup)
            self.panels["Overfit"] = OverfitPanel(setup)
            self.panels["Gradient flow"] = GradientFlowPanel(setup)
            self.panels["Loop"] = LoopPanel(setup)
            self.panels["Dynamics"] = DynamicsPanel(setup)
            if setup.val_data is not None:  # compare selects on the validation split only
                self.panels["Compare"] = ComparePanel(setup)
        self.report: Any = None
        from ..budgets import BUDGETS, budget_options

        budget_options(budget, "")  # an unknown budget is refused here, not when the button is pressed
        self.budget = W.ToggleButtons(options=list(BUDGETS), value=budget, description="budget",
                                      tooltips=["fewer steps: a first answer in seconds", "every check's defaults",
                                                "more steps and seeds"])
        self.action = Action("Diagnose all", self._job, icon="stethoscope")
        what = " and ".join(x for x, v in (("the Setup", setup), ("the splits", splits)) if v is not None)
        overview = W.VBox([header("Diagnose all", f"Runs every check that applies to {what}, in contract order "
                                                  "(data → objective → can it learn → loop → dynamics → throughput), "
                                                  "and ends with the verdict: what to fix first, in order."),
                           self.budget, self.action.box])
        titles = ["Diagnose all", *self.panels]
        self.tab = W.Tab(children=[overview, *self.panels.values()])
        self.tab.titles = tuple(titles)
        super().__init__([self.tab])
        self.add_class("tropt-panel")
        self.add_class("tropt-dashboard")

    def _job(self, action: Action) -> None:
        from ..diagnosis import diagnose

        self.report = None
        opts = dict(self._columns)
        if "Data" in self.panels:
            opts = self.panels["Data"].options
        current: dict[str, Any] = {"index": 0, "count": 1, "check": ""}

        def callback(info: dict) -> None:
            if "index" in info:  # before each check
                current.update(index=info["index"], count=info["count"], check=info["check"])
                action.tick(info["index"], info["count"], f"{info['check']} ({info['index'] + 1}/{info['count']})")
            else:  # a step inside a long check: finer progress, and Stop ends the run here
                frac = info.get("step", 0) / max(info.get("total", 1) or 1, 1)
                action.tick(current["index"] + min(frac, 1.0), current["count"],
                            f"{current['check']} ({current['index'] + 1}/{current['count']}) step "
                            f"{info.get('step', 0)}/{info.get('total', '?')}")

        report = diagnose(self.setup, self.splits, label=opts["label"], group=opts["group"], time=opts["time"],
                          checks=self.checks, progress=False, callback=callback, budget=self.budget.value)
        self.report = report
        action.show(W.HTML(report._repr_html_()))


def dashboard(setup: Setup | None = None, splits: Any = None, **kwargs: Any) -> Dashboard:
    """One line in a notebook: ``tropt.dashboard(setup, splits, label="y")`` shows every panel that applies."""
    return Dashboard(setup, splits, **kwargs)
