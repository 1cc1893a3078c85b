"""Pictures of stage-1 results: label distributions per split, the overlap timeline, near-duplicate pairs."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import TroptError
from . import new_axes, plain, register_plot, titled


def _splits_from(result: Any, prefix: str) -> list[str]:
    return [k.split(":", 1)[1] for k in result.series if k.startswith(prefix + ":")]


@register_plot("data.exact_duplicates")
@register_plot("data.group_leakage")
def plot_pairs(result: Any, ax: Any = None) -> Any:
    """Bars: share of each later split leaked into each earlier split."""
    pairs = result.tables.get("pairs")
    if pairs is None or pairs.empty:
        raise TroptError(f"{result.check} has no pairs to plot", "pass at least two splits")
    if len(pairs) < 2:  # one bar repeats the summary's number and adds nothing
        raise TroptError(f"{result.check}: one pair of splits, its number is in the summary", "read result.summary")
    col = "leaked_fraction" if "leaked_fraction" in pairs else "affected_fraction"
    ax = new_axes(ax)
    labels = [plain(f"{a} in {b}") for a, b in zip(pairs["split"], pairs["earlier_split"])]
    ax.bar(labels, 100 * pairs[col].to_numpy(dtype=float), color="#cf222e")
    ax.set_ylabel("% of the later split")
    return titled(ax, result, result.summary)


@register_plot("data.label_shift")
def plot_label_shift(result: Any, ax: Any = None) -> Any:
    """Grouped bars of class shares per split (classification) or label histograms per split (regression)."""
    ax = new_axes(ax)
    dist = result.tables.get("class_distribution")
    if dist is not None:
        shares = [c for c in dist.columns if str(c).startswith("share_")]
        x = np.arange(len(dist))
        w = 0.8 / max(len(shares), 1)
        for i, c in enumerate(shares):
            ax.bar(x + i * w - 0.4 + w / 2, dist[c].to_numpy(dtype=float), w, label=plain(str(c)[6:]))
        ax.set_xticks(x, [plain(v) for v in dist["class"]])
        ax.set_xlabel("class")
        ax.set_ylabel("share of split")
    else:
        edges = np.asarray(result.series.get("label_edges", []), dtype=float)
        if edges.size < 2:
            raise TroptError("data.label_shift has no distribution to plot", "look at result.tables instead")
        centres = (edges[:-1] + edges[1:]) / 2
        for name in _splits_from(result, "label_counts"):
            c = np.asarray(result.series[f"label_counts:{name}"], dtype=float)
            ax.step(centres, c / max(c.sum(), 1), where="mid", label=plain(name))
        ax.set_xlabel("label")
        ax.set_ylabel("share of split")
    ax.legend(fontsize=8)
    return titled(ax, result)


@register_plot("data.temporal_leakage")
def plot_timeline(result: Any, ax: Any = None) -> Any:
    """Rows over time per split on one axis; overlap shows as overlapping histograms."""
    edges = np.asarray(result.series.get("time_edges", []), dtype=float)
    if edges.size < 2:
        raise TroptError("data.temporal_leakage has no times to plot", "pass time= with a date or numeric column")
    ax = new_axes(ax)
    is_dt = edges.min() > 1e15  # ns since epoch
    centres = (edges[:-1] + edges[1:]) / 2
    xs = centres.astype("datetime64[ns]") if is_dt else centres
    width = (edges[1] - edges[0])
    for name in _splits_from(result, "time_counts"):
        c = np.asarray(result.series[f"time_counts:{name}"], dtype=float)
        ax.fill_between(xs, c, step="mid", alpha=0.45, label=plain(name))
    ax.set_ylabel("rows per bin")
    ax.set_xlabel("time" + (f" (bin {width / 8.64e13:.1f} days)" if is_dt else ""))
    ax.legend(fontsize=8)
    return titled(ax, result)


@register_plot("data.target_leakage")
def plot_target_leakage(result: Any, ax: Any = None) -> Any:
    """Horizontal bars: each feature's single-feature power per split."""
    t = result.tables.get("features")
    if t is None or t.empty:
        raise TroptError("data.target_leakage has no features to plot", "pass label= and a table with feature columns")
    t = t.head(25).iloc[::-1]
    cols = [c for c in t.columns if str(c).startswith("power_")]
    ax = new_axes(ax, figsize=(7, 0.3 * len(t) + 1.5))
    y = np.arange(len(t))
    h = 0.8 / len(cols)
    for i, c in enumerate(cols):
        ax.barh(y + i * h - 0.4 + h / 2, t[c].to_numpy(dtype=float), h, label=plain(str(c)[6:]))
    ax.set_yticks(y, [plain(f) for f in t["feature"]])
    ax.set_xlabel(str(result.metrics.get("metric", "power")))
    ax.legend(fontsize=8)
    return titled(ax, result)


@register_plot("data.class_coverage")
def plot_class_coverage(result: Any, ax: Any = None) -> Any:
    """Class counts per split as a heat map (zeros stand out)."""
    counts = result.tables.get("counts")
    if counts is None or counts.empty:
        raise TroptError("data.class_coverage has no counts to plot", "pass label=")
    values = counts.drop(columns=["class"]).to_numpy(dtype=float)
    ax = new_axes(ax, figsize=(1.2 * values.shape[1] + 3, 0.25 * len(counts) + 1.5))
    ax.imshow(np.log1p(values), aspect="auto", cmap="viridis")
    ax.set_xticks(range(values.shape[1]), [plain(c) for c in counts.columns[1:]])
    ax.set_yticks(range(len(counts)), [plain(c) for c in counts["class"]])
    for (i, j), v in np.ndenumerate(values):
        if len(counts) <= 40:
            ax.text(j, i, f"{int(v)}", ha="center", va="center", fontsize=7, color="w" if v == 0 else "k")
    return titled(ax, result)


def _similarity_axis(ax: Any) -> None:
    """Label a log10(1 - cosine) axis in words: each tick shows the cosine similarity it stands for."""
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    def similarity(x: float, _pos: Any = None) -> str:
        sim = 1.0 - 10.0 ** x
        return "1" if sim >= 1 else f"{sim:.{max(1, min(8, int(np.ceil(-x)) + 1))}f}".rstrip("0").rstrip(".")

    ax.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=8))
    ax.xaxis.set_major_formatter(FuncFormatter(similarity))
    ax.set_xlabel("cosine similarity to the nearest earlier-split row (log spacing: near copies on the left)")


@register_plot("data.near_duplicates")
def plot_near_duplicates(result: Any, ax: Any = None) -> Any:
    """Image pairs side by side (images), else the nearest-neighbour distance histogram with the threshold."""
    images = result.series.get("pair_images")
    if images is not None and len(images):
        import matplotlib.pyplot as plt

        images = np.asarray(images, dtype=float)
        k = len(images)
        if ax is None:
            fig, axes = plt.subplots(2, k, figsize=(1.6 * k, 3.4), squeeze=False, layout="constrained")
        else:
            fig = ax.figure
            ax.axis("off")
            gs = ax.get_subplotspec().subgridspec(2, k)
            axes = np.array([[fig.add_subplot(gs[r, c]) for c in range(k)] for r in range(2)])
        table = result.tables.get("near_duplicates")
        for c in range(k):
            for r in range(2):
                a = axes[r, c]
                a.imshow(images[c, r], cmap="gray" if images[c, r].ndim == 2 else None)
                a.set_xticks([])
                a.set_yticks([])
            if table is not None and c < len(table):
                row = table.iloc[c]
                axes[0, c].set_title(plain(f"{row['split']}[{row['row']}]\nsim {row['similarity']:.3f}"), fontsize=7)
                axes[1, c].set_title(plain(f"{row['earlier_split']}[{row['earlier_row']}]"), fontsize=7)
        titled(axes[0, 0], result) if ax is None else titled(ax, result)
        return axes[0, 0] if ax is None else ax
    edges = np.asarray(result.series.get("log10_distance_edges", []), dtype=float)
    counts = np.asarray(result.series.get("log10_distance_counts", []), dtype=float)
    if edges.size < 2:
        raise TroptError(f"data.near_duplicates ({result.status.value}) has nothing to plot", "read result.summary")
    ax = new_axes(ax)
    ax.bar(edges[:-1], counts, width=np.diff(edges), align="edge", color="#6e7781")
    thr = result.metrics.get("threshold")
    if thr is not None:
        ax.axvline(np.log10(max(1 - float(thr), 1e-9)), color="#cf222e", ls="--", label="threshold")
        ax.legend(fontsize=8)
    _similarity_axis(ax)
    ax.set_ylabel("rows")
    ax.set_yscale("symlog")
    return titled(ax, result)
