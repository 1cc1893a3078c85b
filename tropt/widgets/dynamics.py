"""Stage-5 panel: the LR range test (suggestions marked on the plot) and loss-curve diagnosis of a probe run or of an
uploaded log (CSV)."""

from __future__ import annotations

import html
import io
from typing import TYPE_CHECKING, Any

from ._base import Action, W, header, result_widget

if TYPE_CHECKING:
    from ..setup import Setup

_STYLE = {"description_width": "110px"}
_WIDE = W.Layout(width="380px")


def uploaded_files(value: Any) -> list[dict]:
    """FileUpload's value as a list of {"name", "content": bytes} (ipywidgets 8 tuple of dicts; 7's dict too)."""
    if isinstance(value, dict):  # ipywidgets 7: {name: {"metadata":..., "content":...}}
        return [{"name": k, "content": bytes(v.get("content", b""))} for k, v in value.items()]
    return [{"name": f.get("name", "upload.csv"), "content": bytes(f.get("content", b""))} for f in (value or ())]


class DynamicsPanel(W.VBox):
    """``dynamics.lr_range`` and ``dynamics.loss_curve`` interactively.

    Parameters
    ----------
    setup
        The :class:`tropt.Setup`; None for a panel that only diagnoses uploaded logs.
    """

    def __init__(self, setup: Setup | None = None) -> None:
        self.setup = setup
        self.result_lr: Any = None
        self.result_curve: Any = None
        self.result_upload: Any = None
        children: list[Any] = [header("Dynamics (dynamics.*)",
                                      "Which learning rates work, and what the loss curve says: flat, unstable, "
                                      "diverging, overfitting or healthy.")]
        # --- LR range test
        self.start_lr = W.FloatLogSlider(value=1e-7, base=10, min=-9, max=-2, description="start LR",
                                         readout_format=".0e", continuous_update=False, style=_STYLE, layout=_WIDE)
        self.end_lr = W.FloatLogSlider(value=10.0, base=10, min=-3, max=2, description="end LR", readout_format=".0e",
                                       continuous_update=False, style=_STYLE, layout=_WIDE)
        self.num_steps = W.IntSlider(value=100, min=10, max=500, step=10, description="steps / sweep",
                                     continuous_update=False, style=_STYLE, layout=_WIDE)
        self.repeats = W.IntSlider(value=2, min=1, max=5, description="seeds", continuous_update=False, style=_STYLE,
                                   layout=_WIDE)
        self.lr_action = Action("LR range test", self._lr_job)
        # --- loss curve of a probe run
        self.curve_steps = W.IntSlider(value=300, min=10, max=3000, step=10, description="probe steps",
                                       continuous_update=False, style=_STYLE, layout=_WIDE)
        self.curve_action = Action("Diagnose a probe run", self._curve_job)
        if setup is not None:
            children += [W.HTML("<b>LR range test</b> (dynamics.lr_range)"),
                         W.HBox([W.VBox([self.start_lr, self.end_lr]), W.VBox([self.num_steps, self.repeats])]),
                         self.lr_action.box,
                         W.HTML("<b>Loss curve of a probe run</b> (dynamics.loss_curve)"),
                         self.curve_steps, self.curve_action.box]
        # --- uploaded log
        self.upload = W.FileUpload(accept=".csv,text/csv", multiple=False, description="Upload CSV",
                                   layout=W.Layout(width="220px"))
        self.upload_action = Action("Diagnose the upload", self._upload_job)
        self.upload.observe(lambda _change: self.upload_action.start(), names="value")
        children += [W.HTML("<b>Loss curve from your logs</b>: a CSV with a <code>loss</code> / "
                            "<code>train_loss</code> column (optional <code>step</code>, <code>val_loss</code>; "
                            "Lightning CSVLogger and TensorBoard's CSV export work)"),
                     self.upload, self.upload_action.box]
        super().__init__(children)
        self.add_class("tropt-panel")
        self.add_class("tropt-dynamics-panel")

    def _lr_job(self, action: Action) -> None:
        from ..dynamics.lr_range import check_lr_range

        self.result_lr = None
        result = check_lr_range(self.setup, start_lr=float(self.start_lr.value), end_lr=float(self.end_lr.value),
                                num_steps=int(self.num_steps.value), repeats=int(self.repeats.value), progress=False,
                                callback=action.callback)
        self.result_lr = result
        action.show(result_widget(result))

    def _curve_job(self, action: Action) -> None:
        from ..dynamics import check_loss_curve

        self.result_curve = None
        result = check_loss_curve(self.setup, steps=int(self.curve_steps.value), progress=False,
                                  callback=action.callback)
        self.result_curve = result
        action.show(result_widget(result))

    def _upload_job(self, action: Action) -> None:
        import pandas as pd

        from ..dynamics import diagnose_curves
        from ..errors import TroptError

        self.result_upload = None
        files = uploaded_files(self.upload.value)
        if not files:
            raise TroptError("no file uploaded yet", "click 'Upload CSV' and choose a CSV log with a loss column")
        f = files[-1]
        action.tick(0, 1, f"reading {f['name']}")
        try:
            frame = pd.read_csv(io.BytesIO(f["content"]))
        except Exception as exc:  # noqa: BLE001 - any parse failure gets the same advice
            raise TroptError(f"cannot read {f['name']} as CSV ({type(exc).__name__}: {exc})",
                             "upload a comma-separated file with a header row and a loss column") from None
        result = diagnose_curves(frame)
        self.result_upload = result
        action.show(W.HTML(f"<div style='color:#57606a'>{len(frame)} rows from "
                           f"<code>{html.escape(f['name'])}</code></div>"),
                    result_widget(result))
