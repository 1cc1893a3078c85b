"""Show a Report in a notebook as static output (HTML + PNG), stage by stage — what the report notebooks call.

Static on purpose: an HTML export of widgets needs JavaScript from a CDN, while these outputs read offline.
"""

from __future__ import annotations

from typing import Any

from ..errors import TroptError
from ..registry import STAGES, find_spec
from ..result import Report


def show_report(report: Report, *, plots: bool = True) -> None:
    """Display the report's overview, then each stage's results with their evidence and pictures."""
    from IPython.display import HTML, Markdown, display

    display(Markdown(f"## Overview: {report.status.value.upper()}"))
    display(report.to_frame().drop(columns=["duration_s"]))
    by_stage: dict[Any, list] = {}
    for r in report:
        spec = find_spec(r.check)
        by_stage.setdefault(spec.stage if spec else None, []).append(r)
    for stage, results in by_stage.items():
        display(Markdown(f"## Stage {stage}: {STAGES.get(stage, 'other')}" if stage else "## Other checks"))
        for r in results:
            display(HTML(r._repr_html_()))
            if plots:
                show_plot(r)


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
