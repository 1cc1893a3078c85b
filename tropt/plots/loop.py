"""Pictures for the stage-4 loop checks: per-parameter relative errors, and learning-rate sequences."""

from __future__ import annotations

from typing import Any

import numpy as np

from . import new_axes, plain, register_plot, titled

_ERROR_TABLES = ("parameters_frozen_batch_stats", "parameters", "parameters_uneven")


def plot_parameter_errors(result: Any, ax: Any = None, max_bars: int = 25) -> Any:
    """Horizontal bars of each parameter's relative error (log scale, worst first) with the tolerance line."""
    name = next((t for t in _ERROR_TABLES if t in result.tables), None)
    if name is None:
        from ..errors import TroptError

        raise TroptError(f"{result.check} carries no per-parameter table to plot",
                         "this result was not computed by a loop check")
    df = result.tables[name].head(max_bars).iloc[::-1]
    floor = 1e-12
    ax = new_axes(ax, figsize=(7, max(2.8, 0.3 * len(df) + 1.5)))
    tol = result.metrics.get("tolerance")
    colours = ["#cf222e" if tol is not None and v > tol else "#1a7f37" for v in df["rel_error"]]
    errors = df["rel_error"].to_numpy(dtype=float)
    y = np.arange(len(df))
    nonzero = errors > 0
    ax.barh(y[nonzero], np.maximum(errors[nonzero], floor), color=np.array(colours)[nonzero])
    ax.set_yticks(y, [plain(t) for t in df["tensor"]])
    ax.set_ylim(-0.6, len(df) - 0.4)
    ax.set_xscale("log")
    ax.set_xlim(left=floor, right=max(1.0, float(errors.max()) * 2))
    for yy in y[~nonzero]:  # an exact match has no bar on a log axis: say so
        ax.annotate("0 (identical)", (floor, yy), xytext=(4, 0), textcoords="offset points", va="center",
                    fontsize=8, color="#1a7f37")
    if tol is not None:
        ax.axvline(tol, color="#6e7781", linestyle="--", label=f"tolerance {tol:.0e}")
        ax.legend(fontsize=8, loc="lower right")
    ax.set_xlabel("relative error (log)")
    ax.tick_params(axis="y", labelsize=8)
    return titled(ax, result, name.replace("_", " "))


def plot_lr_sequences(result: Any, ax: Any = None) -> Any:
    """The learning rate against the optimizer step for both runs (K=1 and K=k) as step lines from step 0 (the
    initial LR), with the y axis from zero so equal runs read as one line and a flat schedule as flat."""
    ax = new_axes(ax)
    styles = [dict(ls="-", marker="o", lw=2.2, alpha=0.6), dict(ls="--", marker="x", lw=1.4)]
    initial = result.metrics.get("initial_lr")
    top = 0.0
    for (name, values), style in zip(result.series.items(), styles):
        values = np.asarray(values, dtype=float).reshape(-1)
        steps = np.arange(1, len(values) + 1)
        if initial is not None and np.isfinite(float(initial)):
            steps, values = np.r_[0, steps], np.r_[float(initial), values]
        ax.step(steps, values, where="post", label=plain(name).replace("lr_k", "K = "), **style)
        if values.size and np.isfinite(values).any():
            top = max(top, float(np.nanmax(values)))
    ax.set_ylim(0, top * 1.15 if top > 0 else 1.0)
    from matplotlib.ticker import MaxNLocator

    longest = max((np.asarray(v).size for v in result.series.values()), default=1)
    ax.set_xlim(-0.5 if initial is not None else 0.5, longest + 0.5)  # whole steps, never a 0.96-1.04 axis
    if longest <= 12:
        ax.set_xticks(range(0 if initial is not None else 1, longest + 1))
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if longest == 1:  # one step each: say what the dots are
        for name, values in result.series.items():
            v = float(np.asarray(values, dtype=float).reshape(-1)[0])
            ax.annotate(f"{plain(name).replace('lr_k', 'K = ')}: {v:.3g}", (1, v),
                        xytext=(8, -12 if "k1" in name else 4), textcoords="offset points", fontsize=8)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("learning rate (group 0)")
    ax.legend(fontsize=8)
    return titled(ax, result)


for _check in ("loop.zero_grad", "loop.accumulation", "loop.loss_scaling", "loop.resume", "loop.ddp"):
    register_plot(_check)(plot_parameter_errors)
register_plot("loop.scheduler_cadence")(plot_lr_sequences)
