"""Pictures of the stage-5 checks: the loss curve with its trend and findings, and the LR range sweep."""

from __future__ import annotations

from typing import Any

import numpy as np

from . import new_axes, register_plot, titled


def _arr(result: Any, name: str) -> np.ndarray:
    return np.asarray(result.series.get(name, []), dtype=float).reshape(-1)


@register_plot("dynamics.loss_curve")
def plot_loss_curve(result: Any, ax: Any = None) -> Any:
    """Training loss (raw and its robust trend), validation loss, spikes, the best validation step, non-finite start."""
    ax = new_axes(ax)
    x, y = _arr(result, "step"), _arr(result, "train_loss")
    if x.size != y.size:
        x = np.arange(y.size)
    ax.plot(x, y, color="#8c959f", lw=0.6, alpha=0.6, label="train loss")
    tx, ty = _arr(result, "trend_step"), _arr(result, "trend_loss")
    if tx.size and tx.size == ty.size:
        ax.plot(tx, ty, color="#0969da", lw=2, label="train trend (bin medians)")
    vx, vy = _arr(result, "val_step"), _arr(result, "val_loss")
    if vy.size and vx.size == vy.size:
        ax.plot(vx, vy, "o-", color="#bf3989", ms=3, lw=1.2, label="validation loss")
    sp = _arr(result, "spike_step")
    if sp.size and x.size:
        idx = np.clip(np.searchsorted(x, sp), 0, y.size - 1)
        ax.plot(x[idx], y[idx], "v", color="#cf222e", ms=6, label="spikes")
    m = result.metrics
    if "val_best_step" in m and "overfitting" in str(m.get("classes", "")):
        ax.axvline(m["val_best_step"], color="#bf3989", ls="--", lw=1, label=f"best val step {m['val_best_step']:.0f}")
    if m.get("val_baseline") is not None:  # what a prediction that ignores the input scores on validation
        ax.axhline(m["val_baseline"], color="#9a6700", ls="-.", lw=1, label="input-independent baseline")
    if m.get("first_non_finite_step") is not None:
        ax.axvline(m["first_non_finite_step"], color="#cf222e", ls=":", lw=1.5, label="first non-finite loss")
    finite = y[np.isfinite(y)]
    if finite.size and (finite > 0).all() and finite.max() / finite.min() > 20:
        ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend(fontsize=8)
    return titled(ax, result, str(m.get("classes", "")))


def lr_range_ylim(curves: list[np.ndarray]) -> tuple[float, float] | None:
    """y limits that keep the useful part of an LR sweep readable: from the lowest smoothed loss to a little above
    the starting loss, so the divergent tail at the top of the sweep (fastai clips it too) runs off the top."""
    starts = [c[np.isfinite(c)][:5] for c in curves]
    finite = [c[np.isfinite(c)] for c in curves]
    if not any(f.size for f in finite):
        return None
    low = float(min(f.min() for f in finite if f.size))
    high = (float(max(s.max() for s in starts if s.size)) if any(s.size for s in starts)
            else float(max(f.max() for f in finite if f.size)))
    span = max(high - low, 1e-12 * max(abs(high), 1.0))
    return low - 0.1 * span, high + 0.35 * span


@register_plot("dynamics.lr_range")
def plot_lr_range(result: Any, ax: Any = None) -> Any:
    """Smoothed loss against the learning rate for every seed, the divergent tail clipped; the suggestions marked on
    the curve, the suggested range shaded and the Setup's LR."""
    ax = new_axes(ax)
    seeds = sorted(k[len("lr_seed"):] for k in result.series if k.startswith("lr_seed"))
    smoothed, first = [], None
    for i, s in enumerate(seeds):
        lr, raw, sm = _arr(result, f"lr_seed{s}"), _arr(result, f"loss_seed{s}"), _arr(result, f"smoothed_seed{s}")
        n = min(lr.size, sm.size)
        if raw.size >= n and n:
            ax.plot(lr[:n], raw[:n], color="#8c959f", lw=0.5, alpha=0.5, label="raw loss" if i == 0 else None)
        if n:
            ax.plot(lr[:n], sm[:n], lw=1.8, label=f"smoothed, seed {s}")
            smoothed.append(sm[:n])
            first = first or (lr[:n], sm[:n])
    limits = lr_range_ylim(smoothed)
    if limits is not None:
        ax.set_ylim(*limits)
        clipped = any(np.nanmax(c) > limits[1] for c in smoothed if np.isfinite(c).any())
        if clipped:
            ax.annotate("loss diverges beyond the top (clipped)", (0.99, 0.98), xycoords="axes fraction", ha="right",
                        va="top", fontsize=7, color="#6e7781")
    m = result.metrics
    colours = {"steepest": "#1a7f37", "valley": "#0969da", "min_div_10": "#9a6700"}
    for method, colour in colours.items():
        v = m.get(f"suggested_{method}")
        if v is not None and np.isfinite(v):
            ax.axvline(v, color=colour, ls="--", lw=1)
            if first is not None:  # a dot on the first seed's curve where the suggestion lies
                ax.plot([v], [np.interp(np.log(v), np.log(first[0]), first[1])], "o", color=colour, ms=7,
                        label=f"{method.replace('_div_', ' / ')} {v:.2g}")
    if m.get("suggested_low") is not None and m.get("suggested_high") is not None:
        ax.axvspan(m["suggested_low"], m["suggested_high"], color="#1a7f37", alpha=0.08, label="suggested range")
    if m.get("setup_lr") is not None and np.isfinite(m["setup_lr"]) and m["setup_lr"] > 0:
        ax.axvline(m["setup_lr"], color="#cf222e", lw=1.5, label=f"Setup LR {m['setup_lr']:.2g}")
    ax.set_xscale("log")
    ax.set_xlabel("learning rate")
    ax.set_ylabel("loss")
    ax.legend(fontsize=7)
    return titled(ax, result)
