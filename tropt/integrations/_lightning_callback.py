"""``TroptCallback``: tropt's live monitoring inside ``lightning.Trainer.fit`` (see :mod:`tropt.integrations.live`)."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ..errors import MissingDependencyError
from .live import CHECKS, LiveMonitor

try:
    from lightning.pytorch.callbacks import Callback as _Callback
except ImportError:  # pragma: no cover - the standalone package
    try:
        from pytorch_lightning.callbacks import Callback as _Callback  # type: ignore[assignment]  # the standalone twin, same API
    except ImportError as exc:
        raise MissingDependencyError("tropt.integrations.lightning.TroptCallback needs PyTorch Lightning",
                                     "pip install 'tropt[lightning]'") from exc

from ..dynamics.logs import VAL_NAMES

if TYPE_CHECKING:
    from ..result import Report


class TroptCallback(_Callback):
    """Watch ``Trainer.fit`` live: gradient flow and the logged loss curve, early warnings, a report at the end.

    Parameters
    ----------
    checks
        ``"model.gradient_flow"`` and/or ``"dynamics.loss_curve"`` (both by default).
    every
        Judge the record every this many optimizer steps (and at the end of fit).
    sample_every
        The gradient monitor records one optimizer step in this many.
    stop_on
        Problem kinds that stop training (``"nonfinite"``, ``"diverging"``, ``"vanishing"``, ``"exploding"``):
        the callback sets ``trainer.should_stop``. By default problems are only warned about.
    out_dir
        Where ``report.html`` and ``findings.json`` go; default ``<trainer.log_dir or default_root_dir>/tropt``.
    log_figures
        Also log the report's figures to the trainer's loggers at the end of fit (where the logger takes images).
    warn, thresholds, curve_thresholds, budget, sync_every
        As :class:`tropt.integrations.live.LiveMonitor` (``sync_every``: compare the replicas across the processes of
        a multi-process run every this many optimizer steps; a difference is a ``"replicas_out_of_sync"`` problem).

    After fit, ``callback.report`` is the :class:`tropt.Report`, ``callback.paths`` its files and
    ``callback.events`` the problems warned about.
    """

    def __init__(self, checks: Iterable[str] | str = CHECKS, every: int = 50, *, sample_every: int = 10,
                 stop_on: Iterable[str] | str | None = None, out_dir: str | os.PathLike | None = None,
                 log_figures: bool = True, warn: bool = True, thresholds: dict | None = None,
                 curve_thresholds: Any = None, budget: float = 0.01, sync_every: int | None = 200) -> None:
        super().__init__()
        from ._frameworks import supported
        from ._lightning_setup import HIGH, LOW

        # the callback relies on the Callback hooks of these versions
        supported("lightning" if _Callback.__module__.startswith("lightning.") else "pytorch-lightning", LOW, HIGH,
                  "lightning")
        self._options = dict(checks=checks, every=every, sample_every=sample_every, stop_on=stop_on, warn=warn,
                             thresholds=thresholds, curve_thresholds=curve_thresholds, budget=budget,
                             sync_every=sync_every,
                             logger=logging.getLogger("lightning.pytorch"))
        LiveMonitor(**self._options)  # validate the arguments now, not when fit starts
        self.out_dir = out_dir
        self.log_figures = log_figures
        self.live: LiveMonitor | None = None
        self.report: Report | None = None
        self.paths: dict[str, str] = {}
        self._batches = 0

    @property
    def events(self) -> list:
        return list(self.live.events) if self.live is not None else []

    # ------------------------------------------------------------------ fit
    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self.live = LiveMonitor(**self._options).attach(pl_module)
        self.report, self.paths, self._batches = None, {}, 0

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.live is None:
            return
        self.live.add_loss(self._batches, _loss_of(outputs))
        self._batches += 1
        step = int(trainer.global_step)
        new = self.live.step_end(step)
        if new:
            self._log_events(trainer, new, step)
        if self.live.should_stop:
            trainer.should_stop = True

    def on_validation_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if self.live is None or getattr(trainer, "sanity_checking", False):
            return
        metrics = trainer.callback_metrics
        key = _pick(metrics, VAL_NAMES, val=True)
        if key is not None:
            self.live.add_val_loss(self._batches, metrics[key])

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self._finish(trainer)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if self.live is not None:
            self.live.detach()  # never leave hooks behind on a crashed run

    # ------------------------------------------------------------------ helpers
    def _finish(self, trainer: Any) -> None:
        if self.live is None:
            return
        live = self.live
        step = int(trainer.global_step)
        new = live.check(step, force=True)
        if new:
            self._log_events(trainer, new, step)
        live.detach()
        import importlib

        package = _Callback.__module__.split(".")[0]  # lightning, or the standalone pytorch_lightning
        version = getattr(importlib.import_module(package), "__version__", None)
        self.report = live.report({"framework": package, package: version})
        out = self.out_dir or os.path.join(trainer.log_dir or trainer.default_root_dir, "tropt")
        if trainer.is_global_zero:
            self.paths = live.write(self.report, out)
            sink = self._sink(trainer)
            if sink is not None:
                live.log(sink, step, figures=False)
                self.report.log_to(sink, step, figures=self.log_figures)

    def _sink(self, trainer: Any) -> Any:
        from ..sinks import log_targets

        loggers = list(getattr(trainer, "loggers", []) or [])
        return log_targets(loggers) if loggers else None

    def _log_events(self, trainer: Any, events: list, step: int) -> None:
        if not trainer.is_global_zero:
            return
        from ..sinks import log_events

        sink = self._sink(trainer)
        if sink is not None:
            log_events(events, sink, step)


def _loss_of(outputs: Any) -> Any:
    """The loss in what ``training_step`` returned: a tensor, or the ``"loss"`` key of a dict."""
    if isinstance(outputs, dict):
        return outputs.get("loss")
    return outputs


def _pick(metrics: Any, names: tuple[str, ...], val: bool) -> str | None:
    keys = list(metrics.keys())
    lower = {k.lower(): k for k in keys}
    for n in names:
        if n.lower() in lower:
            return lower[n.lower()]
    for k in keys:
        low = k.lower()
        if "loss" in low and any(t in low for t in ("val", "valid", "eval")) == val:
            return k
    return None


__all__ = ["TroptCallback"]
