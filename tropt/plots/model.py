"""Pictures for stages 2-3: init loss, overfit curves, gradient flow (bars, heatmap, global norm), activations.

matplotlib and seaborn are imported inside the functions. Each registered plotter draws one picture on ``ax``;
with ``ax=None`` the gradient-flow and activation plotters draw a small multi-panel figure and return its first Axes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import TroptError
from . import layer_labels, new_axes, plain, register_plot, titled


@register_plot("model.init_loss")
def plot_init_loss(result: Any, ax: Any = None) -> Any:
    """Per-batch loss at initialisation against the level the objective implies."""
    ax = new_axes(ax)
    batches = result.tables.get("batches")
    if batches is None or batches.empty:
        raise TroptError(f"{result.check} has no per-batch losses to plot", "look at result.summary")
    ax.bar(batches["batch"].astype(str), batches["loss"], color="#8c959f", label="loss at init")
    m = result.metrics
    if "expected_loss" in m:
        e = m["expected_loss"]
        ax.axhline(e, color="#1a7f37", label=f"expected ({m.get('expected_basis', '')})")
        for key, colour in (("warn_ratio", "#9a6700"), ("fail_ratio", "#cf222e")):
            if key in m:
                ax.axhline(e * m[key], color=colour, ls="--", lw=1, label=key.replace("_", " ") + f" x{m[key]:g}")
    ax.set_xlabel("batch")
    ax.set_ylabel("loss")
    ax.legend(fontsize=8)
    return titled(ax, result)


@register_plot("model.overfit_batch")
def plot_overfit_batch(result: Any, ax: Any = None) -> Any:
    """Loss on the fixed batch over steps, with the zeroed-input baseline (log scale)."""
    ax = new_axes(ax)
    for key, label, colour in (("loss", "model on the batch", "#0969da"),
                               ("baseline_loss", "zeroed inputs (baseline)", "#8c959f")):
        if key in result.series:
            y = np.asarray(result.series[key], dtype=float)
            ax.plot(np.arange(len(y)), np.where(y > 0, y, np.nan), label=label, color=colour)
    start = result.metrics.get("start_loss")
    frac = result.metrics.get("target_fraction")
    if start is not None and frac is not None and np.isfinite(start) and start > 0:
        ax.axhline(start * frac, color="#1a7f37", ls="--", lw=1, label=f"target ({frac:g} x start)")
    ax.set_yscale("log")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss")
    ax.legend(fontsize=8)
    return titled(ax, result)


def plot_gradient_bars(result: Any, ax: Any = None) -> Any:
    """The per-layer gradient-flow bar chart: mean and max |grad| per layer (forward order), log scale."""
    ax = new_axes(ax, figsize=(8, 3.5))
    layers = result.tables.get("layers")
    if layers is None or layers.empty:
        raise TroptError(f"{result.check} has no layer table to plot", "look at result.summary")
    x = np.arange(len(layers))
    has_abs = "grad_abs_mean" in layers and layers["grad_abs_mean"].notna().any()
    mean = (layers["grad_abs_mean"] if has_abs else layers["grad_rms_mean"]).to_numpy(dtype=float)
    top = (layers["grad_abs_max"] if has_abs else layers["grad_rms_max"]).to_numpy(dtype=float)
    floor = np.nanmin(np.concatenate([mean[mean > 0], top[top > 0], [1e-12]])) / 10
    ax.bar(x, np.where(top > 0, top, floor), color="#54aeff", alpha=0.6,
           label="max |grad|" if has_abs else "max RMS grad")
    ax.bar(x, np.where(mean > 0, mean, floor), color="#0550ae", label="mean |grad|" if has_abs else "mean RMS grad")
    problems = result.tables.get("problems")
    bad = set(problems["name"]) if problems is not None else set()
    for i, layer in enumerate(layers["layer"]):
        if layer in bad or any(str(n).startswith(f"{layer}.") for n in bad) or not np.isfinite(mean[i]) or mean[i] == 0:
            ax.axvspan(i - 0.5, i + 0.5, color="#cf222e", alpha=0.12, lw=0)
    ax.set_yscale("log")
    ax.set_xticks(x)
    ax.set_xticklabels(layer_labels(layers), rotation=60, ha="right", fontsize=8)
    ax.set_ylabel("|gradient|")
    ax.legend(fontsize=8)
    return titled(ax, result)


def plot_gradient_heatmap(result: Any, ax: Any = None) -> Any:
    """Layer x step heatmap of the gradient RMS (log10), seaborn."""
    import seaborn as sns

    ax = new_axes(ax, figsize=(8, 3.5))
    grid = result.series.get("layer_grad_rms")
    layers = result.tables.get("layers")
    if grid is None or layers is None or np.asarray(grid).size == 0:
        raise TroptError(f"{result.check} has no per-step layer gradients to plot", "look at result.summary")
    grid = np.asarray(grid, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        logg = np.log10(np.where(grid > 0, grid, np.nan)).T
    steps = np.asarray(result.series.get("recorded_steps", np.arange(grid.shape[0])), dtype=int)
    sns.heatmap(logg, ax=ax, cmap="viridis", cbar_kws={"label": "log10 gradient RMS"},
                yticklabels=layer_labels(layers), xticklabels=False)
    # At most about 12 step labels, so they never overlap however long the run.
    stride = max(1, int(np.ceil(len(steps) / 12)))
    ticks = np.arange(0, len(steps), stride)
    ax.set_xticks(ticks + 0.5, [str(steps[i]) for i in ticks], rotation=0)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("layer")
    return titled(ax, result)


def plot_global_norm(result: Any, ax: Any = None) -> Any:
    """Global gradient norm over steps, with the clip threshold when the Setup clips."""
    ax = new_axes(ax)
    g = np.asarray(result.series.get("global_grad_norm", []), dtype=float)
    if g.size == 0:
        raise TroptError(f"{result.check} has no global norms to plot", "look at result.summary")
    steps = np.asarray(result.series.get("recorded_steps", np.arange(g.size)), dtype=float)
    ax.plot(steps, g, marker=".", color="#0969da", label="global gradient norm (at optimizer.step)")
    clip = result.metrics.get("grad_clip")
    if clip is not None:
        ax.axhline(clip, color="#9a6700", ls="--", label=f"grad_clip={clip:g}")
    if np.all(g[np.isfinite(g)] > 0) and np.isfinite(g).any():
        ax.set_yscale("log")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("norm")
    ax.legend(fontsize=8)
    return titled(ax, result)


@register_plot("model.gradient_flow")
def plot_gradient_flow(result: Any, ax: Any = None) -> Any:
    """The bar chart on ``ax``; with ``ax=None`` a figure with the bars, the heatmap and the global norm."""
    if ax is not None:
        return plot_gradient_bars(result, ax)
    import matplotlib.pyplot as plt

    _fig, axes = plt.subplots(3, 1, figsize=(9, 10), layout="constrained")
    plot_gradient_bars(result, axes[0])
    try:
        plot_gradient_heatmap(result, axes[1])
    except TroptError:
        axes[1].set_visible(False)
    try:
        plot_global_norm(result, axes[2])
    except TroptError:
        axes[2].set_visible(False)
    return axes[0]


def _hist_layers(result: Any) -> list[str]:
    return [k.split("/", 1)[1] for k in result.series if k.startswith("hist/")]


def plot_activation_histogram(result: Any, ax: Any = None, layer: str | None = None) -> Any:
    """fastai's "colorful dimension": one layer's activation histogram (log counts) over training steps."""
    layers = _hist_layers(result)
    if not layers:
        raise TroptError(f"{result.check} recorded no activation histograms (steps=0?)", "rerun with steps > 0")
    if layer is None:
        layer = _worst_layer(result, layers)
    if layer not in layers:
        raise TroptError(f"no activation histogram for layer {layer!r}", f"choose one of: {', '.join(layers)}")
    ax = new_axes(ax, figsize=(5, 3))
    h = np.asarray(result.series[f"hist/{layer}"], dtype=float)
    ax.imshow(np.log1p(h).T, origin="lower", aspect="auto", cmap="viridis")
    ax.set_xlabel("training step")
    ranges = result.tables.get("hist_ranges")
    row = ranges[ranges["layer"] == layer] if ranges is not None else None
    if row is not None and len(row):
        lo, hi = float(row["low"].iloc[0]), float(row["high"].iloc[0])
        ax.set_yticks([-0.5, (h.shape[1] - 1) / 2, h.shape[1] - 0.5],
                      [f"{lo:.2g}", f"{(lo + hi) / 2:.2g}", f"{hi:.2g}"])
        ax.set_ylabel("activation")
    else:
        ax.set_ylabel("activation bin")
    stats = result.tables.get("layers")
    kind: Any = stats.loc[stats["layer"] == layer, "type"] if stats is not None and "type" in stats else []
    ax.set_title(plain(f"{layer} ({kind.iloc[0]})" if len(kind) else layer), fontsize=9, loc="left")
    return ax


def _worst_layer(result: Any, layers: list[str]) -> str:
    problems = result.tables.get("problems")
    if problems is not None:
        for name in problems["layer"]:
            if name in layers:
                return name
    return layers[0]


@register_plot("model.activation_stats")
def plot_activation_stats(result: Any, ax: Any = None) -> Any:
    """On ``ax``: the histogram of the worst layer; with ``ax=None``: a grid of up to 8 layers' histograms."""
    if ax is not None:
        out = plot_activation_histogram(result, ax)
        return titled(out, result, out.get_title())
    import matplotlib.pyplot as plt

    layers = _hist_layers(result)
    if not layers:
        raise TroptError(f"{result.check} recorded no activation histograms (steps=0?)", "rerun with steps > 0")
    problems = result.tables.get("problems")
    first = [n for n in (problems["layer"] if problems is not None else []) if n in layers]
    chosen = list(dict.fromkeys(first + layers))[:8]
    cols = min(4, len(chosen))
    rows = -(-len(chosen) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.6 * rows), layout="constrained", squeeze=False)
    for a, name in zip(axes.ravel(), chosen):
        plot_activation_histogram(result, a, name)
    for a in axes.ravel()[len(chosen):]:
        a.set_visible(False)
    fig.suptitle(plain(f"{result.check} — {result.status.value.upper()}: {result.summary}"[:140]), fontsize=9)
    return axes.ravel()[0]
