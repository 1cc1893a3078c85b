"""All drawing. Each function takes a result (and ``ax=None``) and returns the matplotlib Axes it drew on.

matplotlib (and seaborn, where used) are imported inside the functions, never at ``import tropt``. A check id gets
its own picture by registering a plotter with :func:`register_plot` in the module its registration names
(``@register(..., plot="tropt.plots.<module>")``); otherwise :func:`plot_series` draws the result's named series.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from typing import Any

from ..errors import TroptError

_PLOTTERS: dict[str, Callable] = {}
_COLOURS = {"pass": "#1a7f37", "warn": "#9a6700", "fail": "#cf222e", "error": "#8250df", "skip": "#6e7781"}


def register_plot(check_id: str) -> Callable:
    """Decorator: use this function to draw results of ``check_id``."""

    def deco(func: Callable) -> Callable:
        _PLOTTERS[check_id] = func
        return func

    return deco


def plain(text: Any) -> str:
    """A user string (split, column, class, layer name, a summary quoting them) as literal text in a plot.

    matplotlib reads text between two ``$`` as mathtext: ``cost_in_$_and_$`` fails to draw, ``$x^2$`` draws as math.
    Escaped dollars draw as themselves. Every user string that reaches a plot goes through here; idempotent, so
    text read back from an Axes (``ax.get_title()``) can pass again.
    """
    return re.sub(r"(?<!\\)\$", r"\\$", str(text))


def layer_labels(table: Any) -> list[str]:
    """Layer names a person reads: the module path with its class, "0 (Linear)", "encoder.attn (MultiheadAttention)"
    (a Sequential's index alone says nothing); the class alone names the root module ("" path)."""
    names = [str(n) for n in table["layer"]]
    types = [str(t) for t in table["type"]] if "type" in getattr(table, "columns", []) else [""] * len(names)
    return [plain(f"{n} ({t})" if n and t else (t or n or "model")) for n, t in zip(names, types)]


def new_axes(ax: Any = None, figsize: tuple[float, float] = (7, 3.5)) -> Any:
    """``ax`` itself, or the Axes of a new figure (matplotlib imported lazily)."""
    if ax is not None:
        return ax
    import matplotlib.pyplot as plt
    _, ax = plt.subplots(figsize=figsize, layout="constrained")
    return ax


def titled(ax: Any, result: Any, text: str | None = None) -> Any:
    """Title an Axes with the check id and status, coloured by status."""
    if text:
        text = plain(text)
    if text:  # wrap to the axes' width so a long subtitle is never cut at the figure edge
        import textwrap

        fig = ax.get_figure()
        chars = max(30, int(fig.get_figwidth() * ax.get_position().width * 13))
        text = textwrap.fill(text, chars)
    ax.set_title(f"{plain(result.check)} — {result.status.value.upper()}" + (f"\n{text}" if text else ""),
                 color=_COLOURS[result.status.value], fontsize=10, loc="left")
    return ax


def plot_series(result: Any, ax: Any = None) -> Any:
    """Default picture: every 1-d series of the result as a line over its index."""
    import numpy as np

    series = {k: np.asarray(v, dtype=float) for k, v in result.series.items()}
    series = {k: v for k, v in series.items() if v.ndim == 1 and v.size}
    if not series:
        raise TroptError(f"{result.check} has nothing to plot (no series)",
                         "look at result.tables and result.metrics instead")
    ax = new_axes(ax)
    for name, values in series.items():
        ax.plot(np.arange(len(values)), values, label=plain(name))
    ax.set_xlabel("index")
    ax.legend(fontsize=8)
    return titled(ax, result)


def plot_result(result: Any, ax: Any = None) -> Any:
    """Draw ``result`` with the plotter registered for its check, or :func:`plot_series`."""
    from ..registry import find_spec

    spec = find_spec(result.check)
    if spec is not None and spec.plot is not None:
        importlib.import_module(spec.plot)
    return _PLOTTERS.get(result.check, plot_series)(result, ax=ax)
