"""Stage-4 panel: the invariance checks of the user's own training step, with the per-parameter error plots."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._base import Action, W, header, result_widget

if TYPE_CHECKING:
    from ..setup import Setup

_STYLE = {"description_width": "150px"}


class LoopPanel(W.VBox):
    """The ``loop.*`` invariance checks interactively: K (micro-batches), loss scaling and resume options, Run;
    each result with its per-parameter relative-error plot (or the learning-rate sequences for the cadence).

    Parameters
    ----------
    setup
        The :class:`tropt.Setup` whose ``step`` is checked.
    k
        Initial K for ``loop.accumulation`` and ``loop.scheduler_cadence`` (default: the Setup's
        ``accumulation_steps`` when above 1, else 4).
    """

    def __init__(self, setup: Setup, *, k: int | None = None) -> None:
        from ..registry import specs

        self.setup = setup
        k = k if k is not None else (setup.accumulation_steps if getattr(setup, "accumulation_steps", 1) > 1 else 4)
        self.k = W.IntSlider(value=k, min=2, max=16, description="K (micro-batches)", continuous_update=False,
                             layout=W.Layout(width="420px"), style=_STYLE)
        self.scaler = W.Checkbox(value=bool(getattr(setup, "use_scaler", False)), indent=False,
                                 description="fp16 + GradScaler (run loop.loss_scaling)")
        self.resume = W.Checkbox(value=True, indent=False, description="resume: save / load mid-run (loop.resume)")
        self.resume_steps = W.IntSlider(value=1, min=1, max=10, description="resume after N steps",
                                        continuous_update=False, layout=W.Layout(width="420px"), style=_STYLE)
        self.specs = [s for s in specs() if s.id.startswith("loop.")]
        self.action = Action("Check the loop", self._job)
        self.results: dict[str, Any] = {}
        super().__init__([
            header("Is the update right? (loop.*)",
                   "Runs your own step twice under changes that must not change the update and compares what "
                   "reaches optimizer.step()."),
            self.k, W.HBox([self.scaler, self.resume]), self.resume_steps, self.action.box,
        ])
        self.add_class("tropt-panel")
        self.add_class("tropt-loop-panel")

    def chosen(self) -> list[Any]:
        """The loop checks the options select, in contract order."""
        out = []
        for spec in self.specs:
            if spec.id == "loop.resume" and not self.resume.value:
                continue
            if spec.id == "loop.loss_scaling" and not self.scaler.value:
                continue
            out.append(spec)
        return out

    def _job(self, action: Action) -> None:
        from ..diagnosis import run_check

        self.results = {}
        setup = self.setup
        if self.scaler.value and not setup.use_scaler:
            setup = setup.replace(precision="fp16", use_scaler=True)
        setup.validate()  # bad Setup: one red message, not one ERROR per check
        chosen = self.chosen()
        k = int(self.k.value)
        for i, spec in enumerate(chosen):
            action.tick(i, len(chosen), f"{spec.id} ({i + 1}/{len(chosen)})")
            options = {"k": k, "progress": False}
            if spec.id == "loop.resume":
                options["steps"] = int(self.resume_steps.value)
            result = run_check(spec, setup, options)
            self.results[spec.id] = result
            action.show(result_widget(result))
        action.tick(len(chosen), len(chosen), None)
