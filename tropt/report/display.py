"""Show a Report in a notebook as static output (HTML + PNG), stage by stage — what the report notebooks call.

Static on purpose: an HTML export of widgets needs JavaScript from a CDN, while these outputs read offline.
"""

from __future__ import annotations

import html
from typing import Any

from ..errors import TroptError
from ..registry import STAGES, find_spec
from ..result import Report


def show_report(report: Report, *, plots: bool = True) -> None:
    """Display the verdict first (overall status, then what to fix first, in order), then each stage's results
    with their metrics, evidence and pictures collapsed under one line each."""
    from IPython.display import HTML, display

    from ..verdict import summary_html

    display(HTML(summary_html(report)))
    by_stage: dict[Any, list] = {}
    for r in report:
        spec = find_spec(r.check)
        by_stage.setdefault(spec.stage if spec else None, []).append(r)
    for stage, results in by_stage.items():
        title = f"Stage {stage}: {STAGES.get(stage, 'other')}" if stage else "Other checks"
        display(HTML(f'<h3 class="tropt-stage">{html.escape(title)}</h3>'
                     + "".join(result_html_with_plot(r, plots=plots) for r in results)))


def result_html_with_plot(result: Any, *, plots: bool = True) -> str:
    """A result's HTML with its picture (a PNG embedded as data) inside its collapsed evidence.

    A plot that fails to draw becomes a one-line note there: the finding itself is never lost.
    """
    import base64

    from ..result import result_html

    extra = ""
    if plots:
        try:
            png = render_png(result)
        except Exception as exc:  # noqa: BLE001 - a picture is never worth a lost report
            message = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
            extra = (f'<p class="tropt-plot-note"><i>plot of {html.escape(result.check)} could not be drawn '
                     f"({html.escape(message)}); the finding above is complete.</i></p>")
        else:
            if png is not None:
                extra = (f'<img class="tropt-plot" alt="plot of {html.escape(result.check)}" style="max-width:100%" '
                         f'src="data:image/png;base64,{base64.b64encode(png).decode()}">')
    return result_html(result, extra=extra)


def render_png(result: Any) -> bytes | None:
    """A result's picture as PNG bytes (None when it has nothing to plot); drawing errors propagate.

    Rendered here with ``savefig`` rather than left to the notebook's display hooks, so the image reaches the
    output whatever matplotlib backend the kernel runs (``MPLBACKEND=Agg`` on CI has no inline display hook).
    """
    import io

    import matplotlib.pyplot as plt

    try:
        ax = result.plot()
    except TroptError:
        return None  # nothing to plot for this result
    fig = ax.figure if hasattr(ax, "figure") else ax
    try:
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=fig.dpi, bbox_inches="tight")  # text is laid out (and may fail) here
        return buf.getvalue()
    finally:
        plt.close(fig)


def show_plot(result: Any) -> bool:
    """Draw a result's picture as a static image when it has one; returns whether it drew.

    A plot that fails to draw becomes a one-line note under the result: the finding itself is never lost.
    """
    import html

    from IPython.display import HTML, Image, display

    try:
        png = render_png(result)
    except Exception as exc:  # noqa: BLE001 - a picture is never worth a lost report
        message = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
        display(HTML(f'<p class="tropt-plot-note"><i>plot of {html.escape(result.check)} could not be drawn '
                     f"({html.escape(message)}); the finding above is complete.</i></p>"))
        return False
    if png is None:
        return False
    display(Image(data=png, format="png"))
    return True


def bundled_sample(start: str | None = None) -> dict[str, Any] | None:
    """The bundled sample's report parameters when ``data/samples/`` is under ``start`` (default: the current
    directory) or one of its parents, else None (an installed package does not ship the sample data)."""
    import os
    from pathlib import Path

    here = Path(start or os.getcwd()).resolve()
    for folder in (here, *here.parents):
        samples = folder / "data" / "samples"
        if (samples / "sample_setup.py").is_file() and (samples / "train.csv").is_file():
            return {"setup": f"{samples / 'sample_setup.py'}:make_setup",
                    "splits": {"train": str(samples / "train.csv"), "test": str(samples / "test.csv")},
                    "label": "churned", "group": "customer_id", "time": "signup_date"}
    return None
