"""Where tropt writes what it saw, in the tools users already read: TensorBoard, MLflow, W&B, a Lightning logger.

One small abstraction serves :meth:`tropt.GradientMonitor.log_to`, :meth:`tropt.Report.log_to` and the live
callbacks: :func:`as_sink` turns whatever the user holds (a ``SummaryWriter``, an MLflow run or ``"mlflow"`` for
the active one, a W&B run, a Lightning logger, or a list of them) into a :class:`Sink` with four methods, and
:func:`log_result` / :func:`log_report` write verdicts as text, numbers as scalars and figures from
:mod:`tropt.plots` (computation never draws; only these writers render). Every framework is imported only when its
sink is used, and detected by the type's module name, so nothing is imported to find out what a target is.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable
from typing import Any

from .errors import TroptError
from .output import md_lines, md_text


class Sink:
    """A place to log to. Subclasses implement what their backend supports; the rest is a no-op."""

    name = "sink"
    images = False  # whether :meth:`figure` stores anything

    def scalars(self, values: dict[str, float], step: int) -> None:
        """Log numbers under their keys at ``step``."""

    def text(self, key: str, text: str, step: int) -> None:
        """Log a piece of plain text (a verdict, a warning)."""

    def markdown_text(self, key: str, text: str, markdown: str, step: int) -> None:
        """Log a piece of text given both as plain text and as inert Markdown (every value escaped); a sink that
        renders Markdown logs ``markdown``, the others ``text``."""
        self.text(key, text, step)

    def figure(self, key: str, fig: Any, step: int) -> None:
        """Log a matplotlib figure (rendered by the caller from :mod:`tropt.plots`)."""

    def flush(self) -> None:
        """Make what was logged visible to readers (written to disk / sent)."""

    def close(self) -> None:
        """Release what :func:`as_sink` opened itself (a ``SummaryWriter`` for a directory path); the user's own
        writers and runs stay open."""


class MultiSink(Sink):
    """Several sinks at once (a list handed to ``log_to``, or a trainer with several loggers)."""

    name = "multi"

    def __init__(self, sinks: list[Sink]) -> None:
        self.sinks = sinks
        self.images = any(s.images for s in sinks)

    def scalars(self, values, step):
        for s in self.sinks:
            s.scalars(values, step)

    def text(self, key, text, step):
        for s in self.sinks:
            s.text(key, text, step)

    def markdown_text(self, key, text, markdown, step):
        for s in self.sinks:
            s.markdown_text(key, text, markdown, step)

    def figure(self, key, fig, step):
        for s in self.sinks:
            if s.images:
                s.figure(key, fig, step)

    def flush(self):
        for s in self.sinks:
            s.flush()

    def close(self):
        for s in self.sinks:
            s.close()


class TensorBoardSink(Sink):
    """A ``torch.utils.tensorboard.SummaryWriter`` (or anything with its ``add_scalar``/``add_text``/``add_figure``).

    TensorBoard renders text as Markdown, so what reaches ``add_text`` is inert Markdown: a value from the user's data
    shows as text, never as a link, an image or a heading.
    """

    name = "tensorboard"
    images = True

    def __init__(self, writer: Any, owned: bool = False) -> None:
        self.writer, self.owned = writer, owned

    def scalars(self, values, step):
        for k, v in values.items():
            self.writer.add_scalar(k, v, step)

    def text(self, key, text, step):
        self.writer.add_text(key, md_lines(text), step)

    def markdown_text(self, key, text, markdown, step):
        self.writer.add_text(key, markdown, step)

    def figure(self, key, fig, step):
        self.writer.add_figure(key, fig, step, close=False)  # the caller closes what it drew

    def flush(self):
        self.writer.flush()

    def close(self):
        if self.owned:
            self.writer.close()


class MlflowSink(Sink):
    """One MLflow run, written through ``MlflowClient`` by run id (so it works after the run ended, too)."""

    name = "mlflow"
    images = True

    def __init__(self, run_id: str, client: Any = None) -> None:
        if client is None:
            from mlflow.tracking import MlflowClient

            client = MlflowClient()
        self.run_id, self.client = run_id, client

    def scalars(self, values, step):
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(_mlflow_key(k), float(v), now, int(step)) for k, v in values.items()]
        for i in range(0, len(metrics), 1000):  # log_batch's limit
            self.client.log_batch(self.run_id, metrics=metrics[i:i + 1000])

    def text(self, key, text, step):
        # A tag is what the runs table shows; the full text (it may be long) is an artifact next to it.
        self.client.set_tag(self.run_id, _mlflow_key(key), text[:4900])
        self.client.log_text(self.run_id, text, f"{_mlflow_key(key)}/step_{int(step)}.txt")

    def figure(self, key, fig, step):
        self.client.log_figure(self.run_id, fig, f"{_mlflow_key(key)}/step_{int(step)}.png")


def mlflow_run_sink(run_id: str) -> MlflowSink:
    """The sink of an MLflow run given alone, in the current tracking store, checked to be there first: a run made
    by an ``MlflowClient`` on its own tracking URI is not, and MLflow would answer "run not found" after creating
    an empty ``mlflow.db`` in the working directory."""
    import mlflow
    from mlflow.tracking import MlflowClient

    uri = mlflow.get_tracking_uri()
    db = uri[len("sqlite:///"):].split("?")[0] if uri.startswith("sqlite:///") else None
    found = not (db and not os.path.exists(db))  # no database file yet: the run cannot be in it (and none is made)
    if found:
        client = MlflowClient(uri)
        try:
            client.get_run(run_id)
        except Exception:  # noqa: BLE001 - not found, or the store cannot be read: the same advice
            found = False
    if not found:
        raise TroptError(f"log_to: the MLflow run {run_id} is not in the current tracking store ({uri}); it was "
                         "created in another store (an MlflowClient with its own tracking_uri?)",
                         "pass the client with the run: report.log_to((client, run)), or "
                         "mlflow.set_tracking_uri(<its store>) first")
    return MlflowSink(run_id, client)


def _mlflow_key(key: str) -> str:
    """MLflow keys allow letters, digits, ``_ - . / space``: anything else becomes ``_``."""
    return "".join(c if c.isalnum() or c in "_-./ " else "_" for c in key)


class WandbSink(Sink):
    """A W&B run (``wandb.init(...)``'s return value, ``wandb.run``, a ``WandbLogger``'s ``experiment``).

    tropt's step goes into its own key ``tropt/step`` rather than W&B's ``step=``: W&B drops rows whose step is
    below the run's current one, and the trainer owns that counter.
    """

    name = "wandb"
    images = True

    def __init__(self, run: Any) -> None:
        self.run = run

    def scalars(self, values, step):
        self.run.log({**values, "tropt/step": int(step)})

    def text(self, key, text, step):
        import wandb

        self.run.log({key: wandb.Html(f"<pre>{_html(text)}</pre>"), "tropt/step": int(step)})
        self.run.summary[key] = text  # after log(), which would set the summary to the HTML panel

    def figure(self, key, fig, step):
        import wandb

        self.run.log({key: wandb.Image(fig), "tropt/step": int(step)})


def _html(text: str) -> str:
    import html

    return html.escape(text)


class MetricsSink(Sink):
    """A logger that only takes numbers (Lightning's ``CSVLogger``, any ``log_metrics(dict, step)`` logger)."""

    name = "metrics"

    def __init__(self, logger: Any) -> None:
        self.logger = logger

    def scalars(self, values, step):
        self.logger.log_metrics(dict(values), step=int(step))

    def flush(self):
        save = getattr(self.logger, "save", None)
        if callable(save):
            save()


def _module(obj: Any) -> str:
    return type(obj).__module__ or ""


def as_sink(target: Any) -> Sink:
    """A :class:`Sink` for ``target``.

    Accepted: a :class:`Sink`; a list/tuple of targets; a TensorBoard ``SummaryWriter``; a directory path (a new
    ``SummaryWriter`` there); ``"mlflow"`` (the active MLflow run) or an MLflow ``Run``/``ActiveRun`` (in the current
    tracking store; a run of another store as ``(client, run)`` with the ``MlflowClient`` that made it); ``"wandb"``
    (``wandb.run``) or a W&B run; a Lightning logger (``TensorBoardLogger``, ``MLFlowLogger``, ``WandbLogger``; any
    other logger with ``log_metrics`` gets numbers only).
    """
    if isinstance(target, Sink):
        return target
    if isinstance(target, tuple) and len(target) == 2 and type(target[0]).__name__ == "MlflowClient":
        run = target[1]  # (client, run or run id): the run in the client's own store
        return MlflowSink(run if isinstance(run, str) else run.info.run_id, target[0])
    if isinstance(target, (list, tuple)):
        return MultiSink([as_sink(t) for t in target])
    mod = _module(target)
    if isinstance(target, str) and target == "mlflow":
        import mlflow

        run = mlflow.active_run()
        if run is None:
            raise TroptError("log_to('mlflow'): there is no active MLflow run",
                             "start one first (with mlflow.start_run(): ...) or pass the run")
        return mlflow_run_sink(run.info.run_id)
    if isinstance(target, str) and target == "wandb":
        import wandb

        if wandb.run is None:
            raise TroptError("log_to('wandb'): there is no active W&B run",
                             "call wandb.init(...) first, or pass the run")
        return WandbSink(wandb.run)
    if isinstance(target, (str, os.PathLike)):
        from torch.utils.tensorboard import SummaryWriter

        return TensorBoardSink(SummaryWriter(os.fspath(target)), owned=True)
    if mod.startswith(("lightning.", "pytorch_lightning.")) and hasattr(target, "log_metrics"):
        return _lightning_logger_sink(target)
    if mod.startswith("mlflow") and hasattr(target, "info") and hasattr(target.info, "run_id"):
        return mlflow_run_sink(target.info.run_id)
    if mod.startswith("wandb") and hasattr(target, "log") and hasattr(target, "summary"):
        return WandbSink(target)
    if all(hasattr(target, a) for a in ("add_scalar", "add_text", "add_figure")):
        return TensorBoardSink(target)
    if hasattr(target, "log_metrics"):
        return MetricsSink(target)
    raise TroptError(f"log_to: cannot log to a {type(target).__name__}",
                     "pass a torch.utils.tensorboard.SummaryWriter, 'mlflow' (the active run) or an MLflow run, "
                     "'wandb' or a W&B run, a Lightning logger, or a list of these")


def _lightning_logger_sink(logger: Any) -> Sink:
    """The sink behind a Lightning logger: its own writer/client/run where it has one, numbers only otherwise."""
    kind = type(logger).__name__
    if kind == "TensorBoardLogger":
        return TensorBoardSink(logger.experiment)
    if kind == "MLFlowLogger":
        return MlflowSink(logger.run_id, logger.experiment)
    if kind == "WandbLogger":
        return WandbSink(logger.experiment)
    return MetricsSink(logger)


# ---------------------------------------------------------------------------------------------- what gets written
def _numbers(metrics: dict[str, Any], prefix: str) -> dict[str, float]:
    """The finite numeric metrics of a result, keyed under ``prefix`` (booleans and strings are not scalars)."""
    out = {}
    for k, v in metrics.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if math.isfinite(float(v)):
            out[f"{prefix}/{k}"] = float(v)
    return out


def _one_line(text: str) -> str:
    return " ".join(str(text).splitlines())


def verdict_text(result: Any) -> str:
    """One result as the text a person reads in a logger: status, summary, advice (one line each)."""
    lines = [f"{result.status.value.upper()} {_one_line(result.check)}: {_one_line(result.summary)}"]
    lines += [f"- {_one_line(a)}" for a in result.advice]
    return "\n".join(lines)


_SAFE_ID = re.compile(r"[a-z0-9]+(?:[._][a-z0-9]+)*")  # every ``_`` inside a word: never emphasis in Markdown


def verdict_markdown(result: Any) -> str:
    """:func:`verdict_text` as inert Markdown: every value escaped as ``Report.to_markdown`` does
    (:func:`tropt.output.md_text`); a registered-style check id stays as it is."""
    check = result.check if _SAFE_ID.fullmatch(result.check) else md_text(result.check)
    lines = [f"{result.status.value.upper()} {check}: {md_text(result.summary)}"]
    lines += [f"- {md_text(a)}" for a in result.advice]
    return "  \n".join(lines)


def log_result(result: Any, sink: Sink, step: int, *, prefix: str = "tropt", figures: bool = True) -> None:
    """Write one :class:`tropt.CheckResult`: its verdict as text, status rank and numeric metrics as scalars, and its
    figure (from :func:`tropt.plots.plot_result`) where the sink stores images."""
    key = f"{prefix}/{result.check}"
    sink.scalars({f"{key}/status": float(result.status.rank), **_numbers(result.metrics, key)}, step)
    sink.markdown_text(key, verdict_text(result), verdict_markdown(result), step)
    if figures and sink.images:
        _log_figure(result, sink, key, step)


def _log_figure(result: Any, sink: Sink, key: str, step: int) -> None:
    from .plots import plot_result

    try:
        ax = plot_result(result)
    except TroptError:
        return  # nothing to draw (no series): the text and numbers are the record
    import matplotlib.pyplot as plt

    fig = ax.get_figure()
    try:
        sink.figure(key, fig, step)
    finally:
        plt.close(fig)


def log_report(report: Any, sink: Sink, step: int = 0, *, prefix: str = "tropt", figures: bool = True) -> None:
    """Write a whole :class:`tropt.Report`: its status, then every result (see :func:`log_result`)."""
    from .verdict import summary_lines, summary_markdown

    sink.scalars({f"{prefix}/status": float(report.status.rank)}, step)
    sink.markdown_text(f"{prefix}/verdict", "\n".join(summary_lines(report)), "\n".join(summary_markdown(report)), step)
    for r in report.results:
        log_result(r, sink, step, prefix=prefix, figures=figures)
    sink.flush()


def log_targets(targets: Iterable[Any]) -> Sink:
    """A sink for every target that can take one; targets that cannot are skipped (the live callbacks log to
    whatever loggers a trainer has, and a logger tropt does not know must not stop training)."""
    sinks = []
    for t in targets:
        try:
            sinks.append(as_sink(t))
        except TroptError:
            continue
    return MultiSink(sinks)


def log_events(events: list, sink: Sink, step: int) -> None:
    """Write the live monitor's new warnings: each as text (when and why) and as a 1 at ``tropt/warnings/<kind>``."""
    for ev in events:
        sink.text(f"tropt/warning/{ev.kind}", f"step {ev.step}: {_one_line(ev.message)}", step)
    sink.scalars({f"tropt/warnings/{ev.kind}": 1.0 for ev in events}, step)


def log_monitor(mon: Any, sink: Sink, step: int, *, prefix: str = "tropt", figures: bool = True,
                **thresholds: Any) -> Any:
    """Write a :class:`tropt.GradientMonitor`'s record (see :meth:`tropt.GradientMonitor.log_to`); returns its verdict.

    The global gradient norm goes out once per recorded step (rows already logged by an earlier call are skipped, so
    calling this periodically draws one curve); per-layer gradient RMS and the verdict at ``step``.
    """
    import numpy as np

    start = mon.logged_rows
    norms = mon.global_norms()
    steps = mon.recorded_steps
    for i in range(start, norms.size):
        if np.isfinite(norms[i]):
            sink.scalars({f"{prefix}/grad_norm/global": float(norms[i])}, int(steps[i]))
    mon.logged_rows = int(norms.size)
    result = mon.result(**thresholds)
    layers = result.tables.get("layers")
    if layers is not None and len(layers):
        sink.scalars({f"{prefix}/grad_rms/{name or 'root'}": float(v)
                      for name, v in zip(layers["layer"], layers["grad_rms_mean"]) if np.isfinite(v)}, step)
    log_result(result, sink, step, prefix=prefix, figures=figures)
    sink.flush()
    return result
