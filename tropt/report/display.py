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


def show_plot(result: Any) -> bool:
    """Draw a result's picture as a static image when it has one; returns whether it drew."""
    import matplotlib.pyplot as plt
    from IPython.display import display

    try:
        ax = result.plot()
    except TroptError:
        return False  # nothing to plot for this result
    fig = ax.figure if hasattr(ax, "figure") else ax
    display(fig)
    plt.close(fig)
    return True
