"""Pictures for the sampling, evaluation-protocol, metric and train-mode checks (drawn from their tables/series)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import TroptError
from . import _COLOURS, new_axes, register_plot, titled

_VERDICT = {"fail": _COLOURS["fail"], "warn": _COLOURS["warn"], "ok": _COLOURS["pass"]}


def _need(result: Any, table: str) -> Any:
    df = result.tables.get(table)
    if df is None or df.empty:
        raise TroptError(f"{result.check} has no {table} table to plot",
                         "look at result.summary and result.metrics instead")
    return df


@register_plot("data.sampling")
def plot_sampling(result: Any, ax: Any = None) -> Any:
    """The class entropy of each batch read, against what shuffled batches of the same data would have."""
    got = np.asarray(result.series.get("batch_entropy", []), dtype=float)
    if got.size == 0:
        raise TroptError("data.sampling has no per-batch class entropy to plot (labels not found)",
                         "look at result.summary instead")
    expected = np.asarray(result.series.get("shuffled_entropy", np.full_like(got, np.nan)), dtype=float)
    ax = new_axes(ax)
    x = np.arange(len(got))
    ax.bar(x, got, color=_COLOURS[result.status.value] if result.status.value in ("fail", "warn") else _COLOURS["pass"],
           label="class entropy of the batch")
    ax.plot(x, expected, "--", color="#57606a", label="shuffled batches (expected)")
    ax.set_xlabel("batch (first pass)")
    ax.set_ylabel("class entropy (nats)")
    ax.legend(fontsize=8)
    return titled(ax, result)


@register_plot("data.eval_transforms")
def plot_eval_transforms(result: Any, ax: Any = None, max_bars: int = 20) -> Any:
    """Per feature/channel: |train mean - val mean| in pooled stds (bars, worst first), with the val/train std ratio."""
    df = _need(result, "features").head(max_bars).iloc[::-1]
    ax = new_axes(ax, figsize=(7, max(2.8, 0.3 * len(df) + 1.5)))
    effect = np.nan_to_num(df["effect"].to_numpy(dtype=float), posinf=10.0)
    y = np.arange(len(df))
    ax.barh(y, effect, color=[_VERDICT.get(v, _COLOURS["pass"]) for v in df["verdict"]])
    ax.set_yticks(y, [f"{i} {k} {n}" for i, k, n in zip(df["input"], df["kind"], df["index"])])
    for yy, e, r in zip(y, effect, df["std_ratio"].to_numpy(dtype=float)):
        ax.annotate(f"std x{r:.2g}", (e, yy), xytext=(4, 0), textcoords="offset points", va="center", fontsize=7)
    ax.set_xlabel("|train mean - val mean| / pooled std")
    ax.tick_params(axis="y", labelsize=8)
    return titled(ax, result)


@register_plot("model.eval_metric")
def plot_eval_metric(result: Any, ax: Any = None) -> Any:
    """The metric's score for the model and each trivial predictor, with the perfect score marked (or, for a metric
    that never calls its model, each evaluation's score with the forward calls it made)."""
    if "scores" not in result.tables and "metric_calls" in result.tables:
        return _plot_metric_calls(result, ax)
    df = _need(result, "scores")
    df = df[df["score"].notna()]
    if df.empty:
        raise TroptError("model.eval_metric has no scores to plot", "look at result.tables['scores']['error']")
    ax = new_axes(ax)
    y = np.arange(len(df))
    colours = ["#0969da" if p == "model" else "#6e7781" for p in df["predictor"]]
    ax.barh(y, df["score"].to_numpy(dtype=float), color=colours)
    ax.set_yticks(y, df["predictor"].astype(str))
    ax.invert_yaxis()
    perfect = result.metrics.get("perfect_score")
    if perfect is not None:
        ax.axvline(float(perfect), color=_COLOURS["pass"], linestyle="--", label=f"perfect {float(perfect):.3g}")
        ax.legend(fontsize=8)
    ax.set_xlabel(str(result.metrics.get("metric", "score")))
    return titled(ax, result)


def _plot_metric_calls(result: Any, ax: Any = None) -> Any:
    """A metric that never calls its model: the score of each evaluation, labelled with its forward calls."""
    df = _need(result, "metric_calls")
    df = df[df["score"].notna()]
    if len(df) < 2:
        raise TroptError("model.eval_metric scored fewer than two evaluations: nothing to compare in a picture",
                         "look at result.tables['metric_calls'] and result.summary")
    ax = new_axes(ax)
    y = np.arange(len(df))
    scores = df["score"].to_numpy(dtype=float)
    ax.barh(y, scores, color=["#0969da" if e == "model" else "#6e7781" for e in df["evaluation"]])
    ax.set_yticks(y, [f"{e}: {h}" for e, h in zip(df["evaluation"], df["handed"])])
    ax.invert_yaxis()
    for yy, s, c in zip(y, scores, df["forward_calls"]):
        ax.annotate(f"{int(c)} forward call{'' if int(c) == 1 else 's'}", (s, yy), xytext=(4, 0),
                    textcoords="offset points", va="center", fontsize=8)
    low, high = min(0.0, float(scores.min())), max(0.0, float(scores.max()))
    ax.set_xlim(low, high + 0.35 * ((high - low) or 1.0))  # room for the call counts right of the bars
    ax.set_xlabel(str(result.metrics.get("metric", "score")))
    ax.tick_params(axis="y", labelsize=8)
    return titled(ax, result)


@register_plot("loop.train_mode")
def plot_train_mode(result: Any, ax: Any = None) -> Any:
    """A grid: each mode-dependent module's mode when handed over, in the step and in the metric."""
    df = _need(result, "modules")
    cols = [c for c in ("handed_over", "in_step", "in_metric") if c in df]
    code = {"train": 0, "eval": 1, "not run": 2}
    grid = np.array([[code.get(v, 2) for v in df[c]] for c in cols]).T
    from matplotlib.colors import ListedColormap

    ax = new_axes(ax, figsize=(6, max(2.4, 0.3 * len(df) + 1.5)))
    ax.imshow(grid, cmap=ListedColormap(["#1a7f37", "#9a6700", "#d0d7de"]), vmin=0, vmax=2, aspect="auto")
    for (i, j), v in np.ndenumerate(grid):
        ax.text(j, i, ["train", "eval", "-"][v], ha="center", va="center", fontsize=8,
                color="white" if v < 2 else "black")
    labels = [f"{m} ({t})" + (" !" if verdict == "eval while training" else "")
              for m, t, verdict in zip(df["module"], df["type"], df["verdict"])]
    ax.set_yticks(np.arange(len(df)), labels)
    ax.set_xticks(np.arange(len(cols)), [c.replace("_", " ") for c in cols])
    ax.tick_params(axis="y", labelsize=8)
    return titled(ax, result)
