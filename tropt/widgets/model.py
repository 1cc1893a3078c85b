"""Stage-3 panels: overfit one batch (live loss curves), gradient flow (live per-layer bars and layer x step
heatmap)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..result import CheckResult, Status
from ._base import Action, Throttle, W, figure_png, header, image, result_html, result_widget, spec_text

if TYPE_CHECKING:
    from ..setup import Setup

_LAYOUT = W.Layout(width="420px")
_STYLE = {"description_width": "150px"}


def _slider(description: str, value: int, lo: int, hi: int, step: int = 1) -> Any:
    return W.IntSlider(value=value, min=lo, max=hi, step=step, description=description, continuous_update=False,
                       layout=_LAYOUT, style=_STYLE)


class OverfitPanel(W.VBox):
    """``model.overfit_batch`` interactively: batch size and steps sliders, Run; the loss on the batch and the
    zeroed-input baseline are drawn live while they train, then the verdict.

    Parameters
    ----------
    setup
        The :class:`tropt.Setup`.
    samples, steps
        Initial slider values (the check's defaults).
    """

    def __init__(self, setup: Setup, *, samples: int = 32, steps: int = 200) -> None:
        self.setup = setup
        self.samples = _slider("batch size (samples)", samples, 2, 256)
        self.steps = _slider("max steps", steps, 10, 2000, 10)
        self.action = Action("Overfit one batch", self._job)
        self.curves: dict[str, list[float]] = {"model": [], "baseline": []}
        title, text = spec_text("model.overfit_batch")
        super().__init__([header(f"{title} (model.overfit_batch)", text), self.samples, self.steps, self.action.box])
        self.add_class("tropt-panel")
        self.add_class("tropt-overfit-panel")

    @property
    def result(self) -> CheckResult | None:
        return getattr(self, "_result", None)

    def _live(self, phase: str, step: int, total: int) -> None:
        from ..plots.model import plot_overfit_batch

        model, base = self.curves["model"], self.curves["baseline"]
        series = {"loss": list(model)}
        if base:
            series["baseline_loss"] = list(base)
        metrics = {"start_loss": model[0], "target_fraction": 0.1} if model else {}
        provisional = CheckResult("model.overfit_batch", Status.SKIP, "running", metrics, series=series)

        def draw(fig: Any) -> None:
            ax = plot_overfit_batch(provisional, ax=fig.add_subplot())
            ax.set_title(f"training: {'model on the batch' if phase == 'model' else 'zeroed-input baseline'}, "
                         f"step {step}/{total}", loc="left", fontsize=10, color="#0969da")

        self.action.live.children = (image(figure_png(draw, (7.5, 3.2))),)

    def _job(self, action: Action) -> None:
        from ..model import check_overfit_batch

        self._result = None
        self.curves = {"model": [], "baseline": []}
        redraw = Throttle()
        samples, steps = int(self.samples.value), int(self.steps.value)

        def callback(info: dict) -> None:
            phase = info["phase"]
            self.curves[phase].append(float(info["loss"]))
            total = info["total"]
            # progress: the model phase is the first half, the baseline the second
            done = info["step"] / max(total, 1) * 0.5 + (0.5 if phase == "baseline" else 0.0)
            action.tick(done, 1.0, f"{'model' if phase == 'model' else 'baseline'} step {info['step']}/{total}")
            if redraw(force=info["step"] == 0 and phase == "baseline"):
                self._live(phase, info["step"], total)

        result = check_overfit_batch(self.setup, samples=samples, steps=steps, progress=False, callback=callback)
        self._result = result
        action.live.children = ()
        action.show(result_widget(result))


class GradientFlowPanel(W.VBox):
    """``model.gradient_flow`` interactively: the per-layer gradient bar chart and the layer x step heatmap,
    refreshed every N steps while a copy trains, then the verdict.

    ``GradientFlowPanel.attach(monitor)`` shows the same for a :class:`tropt.GradientMonitor` in your own loop.

    Parameters
    ----------
    setup
        The :class:`tropt.Setup` (None for a panel that only watches a monitor).
    steps
        Initial number of steps.
    every
        Redraw the live charts every this many steps.
    """

    def __init__(self, setup: Setup | None = None, *, steps: int = 20, every: int = 5) -> None:
        self.setup = setup
        self.steps = _slider("steps", steps, 2, 500)
        self.every = _slider("refresh every N steps", every, 1, 100)
        self.action = Action("Check gradient flow", self._job)
        self.monitor: Any = None
        self.refreshes = 0
        self._result: CheckResult | None = None
        title, text = spec_text("model.gradient_flow")
        self.live = W.VBox()  # used when attached to a monitor
        self.verdict = W.HTML("")
        children: list[Any] = [header(f"{title} (model.gradient_flow)", text)]
        if setup is not None:
            children += [self.steps, self.every, self.action.box]
        else:
            children += [self.verdict, self.live]
        super().__init__(children)
        self.add_class("tropt-panel")
        self.add_class("tropt-gradflow-panel")

    @property
    def result(self) -> CheckResult | None:
        return self._result

    # ------------------------------------------------------------------ drawing
    @staticmethod
    def charts(result: CheckResult, title: str | None = None) -> Any:
        """The bar chart and the heatmap of a gradient-flow result, one above the other, as an Image widget."""
        from ..errors import TroptError
        from ..plots.model import plot_gradient_bars, plot_gradient_heatmap

        def draw(fig: Any) -> None:
            top, bottom = fig.subplots(2, 1)
            plot_gradient_bars(result, top)
            if title:
                top.set_title(title, loc="left", fontsize=10, color="#0969da")
            try:
                plot_gradient_heatmap(result, bottom)
            except TroptError:
                bottom.set_visible(False)

        return image(figure_png(draw, (8, 6.4)))

    # ------------------------------------------------------------------ the check on the Setup
    def _job(self, action: Action) -> None:
        from ..model import check_gradient_flow

        self._result = None
        steps, every = int(self.steps.value), int(self.every.value)

        def callback(info: dict) -> None:
            action.callback(info)
            if info["step"] % every == 0 and info["step"] < info["total"]:
                assert self.setup is not None  # the Check button is only shown with a setup
                partial = info["monitor"].result(grad_clip=self.setup.grad_clip)
                action.live.children = (self.charts(partial, f"live: step {info['step']}/{info['total']}"),)
                self.refreshes += 1

        result = check_gradient_flow(self.setup, steps=steps, progress=False, callback=callback)
        self._result = result
        action.live.children = ()
        action.show(W.HTML(result_html(result)), self.charts(result))

    # ------------------------------------------------------------------ your own loop
    @classmethod
    def attach(cls, monitor: Any, *, every: int = 20) -> GradientFlowPanel:
        """A panel that follows ``monitor`` (a :class:`tropt.GradientMonitor` in your own loop), redrawing every
        ``every`` recorded steps; call :meth:`refresh` after the loop for the final picture.

        Display it before the loop::

            with tropt.GradientMonitor(model) as mon:
                display(GradientFlowPanel.attach(mon, every=20))
                for x, y in loader: ...

        The redraw runs inside your loop (about a tenth of a second each), so keep ``every`` large for fast steps.
        """
        panel = cls(None, every=every)
        panel.watch(monitor, every=every)
        return panel

    def watch(self, monitor: Any, *, every: int | None = None) -> GradientFlowPanel:
        """Follow ``monitor``: chain onto its ``callback`` and redraw every ``every`` recorded steps."""
        from ..errors import TroptError

        if not hasattr(monitor, "callback") or not hasattr(monitor, "result"):
            raise TroptError(f"GradientFlowPanel.attach: got a {type(monitor).__name__}, "
                             "expected a tropt.GradientMonitor",
                             "pass the monitor of your loop: with tropt.GradientMonitor(model) as mon: ...")
        if every is not None:
            self.every.value = max(1, int(every))
        self.monitor = monitor
        previous = monitor.callback
        seen = [0]

        def callback(info: dict) -> None:
            if previous is not None:
                previous(info)
            seen[0] += 1
            if seen[0] % int(self.every.value) == 0:
                self.refresh()

        monitor.callback = callback
        self.verdict.value = ('<span style="color:#6e7781">waiting for the first '
                              f'{int(self.every.value)} optimizer steps…</span>')
        return self

    def refresh(self) -> None:
        """Redraw from the monitor's record now (the verdict, the bars and the heatmap). Errors show in the panel."""
        from ._base import describe_error, error_html

        if self.monitor is None:
            return
        try:
            result = self.monitor.result()
            self._result = result
            self.verdict.value = result_html(result)
            steps = len(self.monitor.recorded_steps)
            self.live.children = (self.charts(result, f"your loop: {steps} recorded steps"),)
            self.refreshes += 1
        except Exception as exc:  # noqa: BLE001 - never break the user's loop for a picture
            self.verdict.value = error_html(*describe_error(exc))
