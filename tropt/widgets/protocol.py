"""The protocol panel: the stage 1-2 checks that read a Setup (its loaders, its metric): data.sampling,
data.eval_transforms, model.init_loss, model.eval_metric — tick, Run; a badge, evidence and a plot per check."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._base import Action, W, header, result_widget

if TYPE_CHECKING:
    from ..setup import Setup


class ProtocolPanel(W.VBox):
    """The Setup's own data pipeline and objective: training order and sampling, evaluation transforms, the loss at
    initialisation and the validation metric (every registered stage 1-2 check that runs on a Setup).

    Parameters
    ----------
    setup
        The :class:`tropt.Setup` whose loaders, loss and ``metric`` are checked.
    """

    def __init__(self, setup: Setup) -> None:
        from ..registry import specs

        self.setup = setup
        self.specs = [s for s in specs() if s.needs == "setup" and s.stage <= 2]
        self.boxes = {s.id: W.Checkbox(value=True, description=s.title, indent=False, tooltip=s.description,
                                       layout=W.Layout(width="320px")) for s in self.specs}
        self.action = Action("Check the protocol", self._job)
        self.results: dict[str, Any] = {}
        super().__init__([
            header("Sampling, evaluation and metric (data.sampling, data.eval_transforms, model.*)",
                   "Reads your own training and validation loaders and scores trivial predictors with your metric."),
            W.GridBox(list(self.boxes.values()), layout=W.Layout(grid_template_columns="repeat(2, 330px)")),
            self.action.box,
        ])
        self.add_class("tropt-panel")
        self.add_class("tropt-protocol-panel")

    def chosen(self) -> list[Any]:
        """The ticked checks, in contract order."""
        return [s for s in self.specs if self.boxes[s.id].value]

    def _job(self, action: Action) -> None:
        from ..diagnosis import run_check
        from ..errors import TroptError

        self.results = {}
        chosen = self.chosen()
        if not chosen:
            raise TroptError("no check is ticked", "tick at least one check above")
        self.setup.validate()  # bad Setup: one red message, not one ERROR per check
        for i, spec in enumerate(chosen):
            action.tick(i, len(chosen), f"{spec.id} ({i + 1}/{len(chosen)})")
            result = run_check(spec, self.setup, {"progress": False})
            self.results[spec.id] = result
            action.show(result_widget(result))
        action.tick(len(chosen), len(chosen), None)
