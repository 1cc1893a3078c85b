"""Live monitoring of a real training run, shared by the Lightning and Hugging Face callbacks.

:class:`LiveMonitor` watches the user's own model while their trainer runs it: a :class:`tropt.GradientMonitor`
(optimizer step hooks, removed at the end) records gradient statistics, the trainer hands over the losses it logs,
and every ``every`` optimizer steps the record is judged with tropt's own rules (``model.gradient_flow``'s
non-finite/vanishing/exploding findings, ``dynamics.loss_curve``'s classifier). A new problem is warned about once
(a :class:`TroptLiveWarning`, the framework's logger, and the trainer's loggers as text); training stops only for
the kinds listed in ``stop_on``. On a multi-process run, every ``sync_every`` steps the ranks' parameter checksums are
compared (one collective) and replicas that drifted apart are a problem too. At the end, :meth:`LiveMonitor.report`
builds a :class:`tropt.Report` of what was seen and :meth:`LiveMonitor.write` writes ``report.html`` and
``findings.json``.

Losses arrive as tensors and are kept on their device until a check reads them, so the per-step cost is one list
append (no host synchronisation per step on an accelerator).
"""

from __future__ import annotations

import logging
import math
import os
import time
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..errors import TroptError

GRADIENT_FLOW, LOSS_CURVE = "model.gradient_flow", "dynamics.loss_curve"
CHECKS = (GRADIENT_FLOW, LOSS_CURVE)
KINDS = ("nonfinite", "diverging", "vanishing", "exploding", "replicas_out_of_sync")
_ALIASES = {"gradient_flow": GRADIENT_FLOW, "gradflow": GRADIENT_FLOW, "loss_curve": LOSS_CURVE, "loss": LOSS_CURVE}
# model.gradient_flow's problem names -> the live warning kind
_PROBLEM_KIND = {"non-finite gradient": "nonfinite", "vanishing gradient": "vanishing",
                 "exploding gradient": "exploding"}

log = logging.getLogger("tropt")


class TroptLiveWarning(UserWarning):
    """A problem tropt saw in a running training job (non-finite values, divergence, vanishing/exploding gradients)."""


@dataclass(frozen=True)
class LiveEvent:
    """One problem seen during training: its kind (one of :data:`KINDS`), the step, and the message."""

    kind: str
    step: int
    message: str


def _checks(checks: Any) -> tuple[str, ...]:
    if isinstance(checks, str):
        checks = (checks,)
    out = []
    for c in checks:
        cid = _ALIASES.get(c, c)
        if cid not in CHECKS:
            raise TroptError(f"live monitoring: unknown check {c!r}",
                             f"choose among {', '.join(CHECKS)} (or their short names gradient_flow, loss_curve)")
        out.append(cid)
    if not out:
        raise TroptError("live monitoring: checks is empty", f"pass at least one of {', '.join(CHECKS)}")
    return tuple(dict.fromkeys(out))


def _kinds(stop_on: Any) -> frozenset[str]:
    if stop_on is None or stop_on is False:
        return frozenset()
    if isinstance(stop_on, str):
        stop_on = (stop_on,)
    bad = [k for k in stop_on if k not in KINDS]
    if bad:
        raise TroptError(f"live monitoring: stop_on has unknown kinds {bad}", f"choose among {', '.join(KINDS)}")
    return frozenset(stop_on)


FIRST_COST = 0.01  # seconds assumed for a periodic part's first run (see LiveMonitor._costs)


class LiveMonitor:
    """Watch one training run; the framework callbacks drive it.

    Parameters
    ----------
    checks
        What to watch: ``"model.gradient_flow"`` (a :class:`tropt.GradientMonitor` on the model) and/or
        ``"dynamics.loss_curve"`` (the logged losses).
    every
        Judge the record every this many optimizer steps (warnings come at this cadence; between checks the
        monitor only records).
    sample_every
        The gradient monitor records one optimizer step in this many (its ``every``). Recording costs a fixed
        ~0.1 ms of Python and foreach calls per recorded step, 5-15% of a 1-2 ms step of a small model
        (``benchmarks/bench_callbacks.py``), so the default records one step in 10; gradient statistics drift
        slowly and non-finite gradients persist, so sampling finds the same problems. Use 1 on slow steps to record
        each one. Losses are read at every step regardless.
    stop_on
        Kinds of problems that should stop training (any of ``"nonfinite"``, ``"diverging"``, ``"vanishing"``,
        ``"exploding"``, ``"replicas_out_of_sync"``); by default nothing stops training, problems are only warned
        about.
    warn
        Emit a :class:`TroptLiveWarning` for each new problem (the framework logger gets it either way).
    thresholds
        Keywords for the gradient-flow rules (``vanish_ratio``, ``explode_growth``, ...).
    curve_thresholds
        A :class:`tropt.dynamics.CurveThresholds` for the loss-curve classifier.
    budget
        The share of wall time the periodic judgements may take (0.01: 1%). Non-finite losses and gradients are
        looked for at every check (a scan of what arrived since the last one); the loss-curve classification and
        the ``model.gradient_flow`` judgement (vanishing, exploding), whose costs grow with the record, run at a
        check only while their total time stays within this share (on very fast steps they run less often than
        ``every``); the end of training always judges everything. ``budget=1``: no limit, every check judges.
    sync_every
        On a real multi-process run (``torch.distributed`` initialised, world size > 1), every this many optimizer
        steps compare the replicas: each rank's float64 sum and sum of squares of each trainable parameter (one pass
        over the parameters) are exchanged with one ``all_gather``, and a parameter that differs from rank 0's by
        more than a relative 1e-5 is a ``"replicas_out_of_sync"`` problem naming the parameters and ranks. Every
        rank must call :meth:`step_end` with the same steps (the callbacks do). Sharded models (FSDP, DTensor,
        DeepSpeed ZeRO-3) are not compared; ``None`` turns the check off. No effect in a single process.
    """

    def __init__(self, checks: Iterable[str] | str = CHECKS, every: int = 50, *, sample_every: int = 10,
                 stop_on: Iterable[str] | str | None = None, warn: bool = True, thresholds: dict | None = None,
                 curve_thresholds: Any = None, logger: logging.Logger | None = None, budget: float = 0.01,
                 sync_every: int | None = 200) -> None:
        for name, v in (("every", every), ("sample_every", sample_every)) + \
                ((("sync_every", sync_every),) if sync_every is not None else ()):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise TroptError(f"live monitoring: {name}={v!r}; it must be an integer >= 1", f"use {name}=50")
        self.checks = _checks(checks)
        self.every = every
        self.sample_every = sample_every
        self.stop_on = _kinds(stop_on)
        self.warn = warn
        self.thresholds = dict(thresholds or {})
        self.curve_thresholds = curve_thresholds
        self.logger = logger or log
        self.monitor: Any = None
        self.events: list[LiveEvent] = []
        self.should_stop = False
        self.stop_reason: str | None = None
        self._seen: set[tuple[str, str]] = set()
        self._pending: list[tuple[int, Any]] = []  # (step, loss tensor or number) not yet read back
        self.train_steps: list[float] = []
        self.train_loss: list[float] = []
        self.val_steps: list[float] = []
        self.val_loss: list[float] = []
        self._last_check = 0
        self._checked_rows = 0
        if not (isinstance(budget, (int, float)) and 0 < budget <= 1):
            raise TroptError(f"live monitoring: budget={budget!r}; it must be a share of training time in (0, 1]",
                             "use budget=0.01 (1%)")
        self.budget = float(budget)
        # Seconds the last run of each periodic part took; before the first run, a prior: a first run costs more than
        # later ones (first use of pandas and the judgement's code paths, ~10-20 ms on a CPU), so on fast steps it
        # waits until the budget affords it rather than making one step 10x slower early in training.
        self._costs: dict[str, float] = {"curve": FIRST_COST, "judge": FIRST_COST}
        self.spent = 0.0  # seconds spent in those parts so far
        self._started = time.perf_counter()
        self.judgements = 0
        self.sync_every = sync_every
        self._sync_params: list[tuple[str, torch.Tensor]] = []
        self._last_sync = 0
        self.syncs = 0  # replica comparisons run

    # ------------------------------------------------------------------ lifecycle
    def attach(self, model: torch.nn.Module) -> LiveMonitor:
        """Start watching ``model`` (hooks only; the model itself is not changed)."""
        # Import what the checks use now, at the start of training: a first import inside the step loop (tens of
        # milliseconds of module loading) would land in the step time of whichever step runs the first check.
        import importlib

        for name in ("..dynamics.curves", "..dynamics.loss_curve", "..model.gradient_flow", "..result"):
            importlib.import_module(name, __package__)
        self._started = time.perf_counter()
        if GRADIENT_FLOW in self.checks and self.monitor is None:
            from ..model.monitor import GradientMonitor

            self.monitor = GradientMonitor(model, every=self.sample_every).__enter__()
        self._sync_params = self._replicas(model)
        return self

    def _replicas(self, model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
        """The parameters the replica-sync check compares (none: not distributed, off, or a sharded model)."""
        from . import _replicas

        if self.sync_every is None or _replicas.distributed_world() < 2:
            return []
        why = _replicas.sharded(model)
        if why is not None:
            self.logger.info("tropt: replicas are not compared: %s", why)
            return []
        return [(n, p) for n, p in model.named_parameters() if p.requires_grad]

    def detach(self) -> None:
        """Remove every hook (idempotent); what was recorded stays readable."""
        if self.monitor is not None:
            self.monitor.close()

    # ------------------------------------------------------------------ feeding
    def add_loss(self, step: int, loss: Any) -> None:
        """The training loss the trainer logged at ``step`` (a tensor stays on its device until a check reads it)."""
        if loss is None:
            return
        if isinstance(loss, torch.Tensor):
            if loss.numel() != 1:
                return  # not a scalar loss (a per-sample vector): not a curve point
            loss = loss.detach()
        self._pending.append((int(step), loss))

    def add_val_loss(self, step: int, loss: Any) -> None:
        """A validation loss at ``step``."""
        if loss is None:
            return
        self.val_steps.append(float(step))
        self.val_loss.append(float(loss.detach().float().cpu()) if isinstance(loss, torch.Tensor) else float(loss))

    def _drain(self) -> None:
        """Read the pending losses back to the host in one transfer."""
        if not self._pending:
            return
        steps, values = zip(*self._pending)
        self._pending = []
        tensors = [v for v in values if isinstance(v, torch.Tensor)]
        if len(tensors) == len(values):
            arr = torch.stack([v.reshape(()).float() for v in values]).cpu().numpy().astype(np.float64)
        else:
            arr = np.array([float(v.float().cpu()) if isinstance(v, torch.Tensor) else float(v) for v in values])
        self.train_steps.extend(float(s) for s in steps)
        self.train_loss.extend(arr.tolist())

    # ------------------------------------------------------------------ judging
    def step_end(self, step: int, force: bool = False) -> list[LiveEvent]:
        """Call after each optimizer step; every ``every`` steps (or when ``force``) judge the record.

        Returns the new problems found (each is also warned about and logged)."""
        synced = self._sync(step) if self._sync_params else []
        # Judge when the step crosses a multiple of ``every`` (once per step: Lightning calls per micro-batch).
        if not force and step // self.every <= self._last_check // self.every:
            return self._record(synced)
        self._last_check = step
        return self._record(synced) + self.check(step, force=force)

    def _sync(self, step: int) -> list[LiveEvent]:
        """Every ``sync_every`` steps, compare the parameters' checksums across the ranks (one collective)."""
        from . import _replicas

        assert self.sync_every is not None
        if step // self.sync_every <= self._last_sync // self.sync_every:
            return []
        self._last_sync = step
        t = time.perf_counter()
        every = _replicas.gather(_replicas.checksums(self._sync_params))
        message, layout = _replicas.compare([n for n, _ in self._sync_params], every)
        self.syncs += 1
        self.spent += time.perf_counter() - t
        if layout is not None:
            self.logger.info("tropt: replicas are no longer compared: %s", layout)
            self._sync_params = []
        return [LiveEvent("replicas_out_of_sync", step, message)] if message else []

    def check(self, step: int, force: bool = False) -> list[LiveEvent]:
        """Judge what was recorded so far; returns the new problems.

        Non-finite losses and gradients are looked for every time (a scan of what arrived since the last check).
        The loss-curve classification and the ``model.gradient_flow`` judgement (vanishing, exploding), whose
        costs grow with the record, run only while tropt's time in these checks stays within ``budget`` of the
        wall time since monitoring started (each one's last measured cost is its estimate), or when ``force``.
        """
        self._drain()
        found: list[LiveEvent] = self._nonfinite_loss(step) if LOSS_CURVE in self.checks else []
        if self.monitor is not None:
            found += self._nonfinite_grads(step)
        if LOSS_CURVE in self.checks and self._afford("curve", force):
            found += self._timed("curve", self._diverging, step)
        if self.monitor is not None and self.monitor.rows >= 2 and self._afford("judge", force):
            found += self._timed("judge", self._judged, step)
        return self._record(found)

    def _record(self, found: list[LiveEvent]) -> list[LiveEvent]:
        """Keep, warn about and log the problems not seen before; set ``should_stop`` for a ``stop_on`` kind."""
        new = []
        for ev in found:
            key = (ev.kind, ev.message.split(":")[0])
            if key in self._seen:
                continue
            self._seen.add(key)
            new.append(ev)
            self.events.append(ev)
            self._announce(ev)
            if ev.kind in self.stop_on and not self.should_stop:
                self.should_stop = True
                self.stop_reason = ev.message
        return new

    def _afford(self, part: str, force: bool) -> bool:
        """Whether running ``part`` now keeps the checks' total time within ``budget`` of the elapsed time
        (always with ``budget=1``: no limit, every check judges)."""
        if force or self.budget >= 1.0:
            return True
        allowed = self.budget * (time.perf_counter() - self._started)
        return self.spent + self._costs.get(part, 0.0) <= allowed

    def _timed(self, part: str, fn: Any, step: int) -> list[LiveEvent]:
        t = time.perf_counter()
        try:
            return fn(step)
        finally:
            self._costs[part] = time.perf_counter() - t
            self.spent += self._costs[part]
            if part == "judge":
                self.judgements += 1

    def _announce(self, ev: LiveEvent) -> None:
        stop = " (stopping training: stop_on)" if ev.kind in self.stop_on else ""
        text = f"tropt: step {ev.step}: {ev.message}{stop}"
        self.logger.warning(text)
        if self.warn:
            warnings.warn(text, TroptLiveWarning, stacklevel=3)

    def _nonfinite_loss(self, step: int) -> list[LiveEvent]:
        y = np.asarray(self.train_loss, dtype=np.float64)
        bad = ~np.isfinite(y)
        if not bad.any():
            return []
        at = self.train_steps[int(np.argmax(bad))]
        return [LiveEvent("nonfinite", step, f"non-finite training loss: {int(bad.sum())} of {y.size} logged values "
                                             f"are NaN/inf, the first at step {at:g}. Lower the learning rate, clip "
                                             "gradients, or look for a log/division of zero")]

    def _diverging(self, step: int) -> list[LiveEvent]:
        from ..dynamics.curves import MIN_POINTS, classify_curve

        y = np.asarray(self.train_loss, dtype=np.float64)
        if y.size < MIN_POINTS or not np.isfinite(y).all():
            return []  # too short to judge, or already reported as non-finite
        diag = classify_curve(y, np.asarray(self.train_steps), thresholds=self.curve_thresholds)
        if "diverging" not in diag.classes:
            return []
        m = diag.metrics
        return [LiveEvent("diverging", step, f"the training loss is diverging: it rose from "
                                             f"{m.get('best_loss', math.nan):.4g} (best) to "
                                             f"{m.get('end_loss', math.nan):.4g}. Lower the learning rate or add "
                                             "warm-up/clipping")]

    def _nonfinite_grads(self, step: int) -> list[LiveEvent]:
        """Non-finite gradients in the rows recorded since the last check (only those rows are copied back)."""
        mon = self.monitor
        rows = mon.array(self._checked_rows)
        self._checked_rows = mon.rows
        if not rows.size:
            return []
        bad = np.nansum(rows[:, :, 4], axis=0) > 0
        if not bad.any():
            return []
        names = [n for n, b in zip(mon.names, bad) if b]
        return [LiveEvent("nonfinite", step, f"non-finite gradients: in {len(names)} parameter(s) "
                                             f"({', '.join(names[:5])}{', ...' if len(names) > 5 else ''}). Lower the "
                                             "learning rate, clip gradients, or check the loss for log(0)/division by "
                                             "zero")]

    def _judged(self, step: int) -> list[LiveEvent]:
        """Vanishing and exploding gradients by the ``model.gradient_flow`` rules on the whole record."""
        result = self.monitor.result(**self.thresholds)
        problems = result.tables.get("problems")
        out = []
        if problems is not None and len(problems):
            for kind in ("vanishing", "exploding"):
                hit = problems[problems["problem"].map(_PROBLEM_KIND.get) == kind]
                if len(hit):
                    names = list(dict.fromkeys(hit["name"]))
                    out.append(LiveEvent(kind, step, f"{kind} gradients: {', '.join(names[:5])}"
                                                     f"{', ...' if len(names) > 5 else ''}. {result.summary}"))
        return out

    # ------------------------------------------------------------------ the end
    def report(self, identity: dict | None = None) -> Any:
        """A :class:`tropt.Report` of what was seen: the gradient-flow verdict and the loss-curve diagnosis."""
        from ..result import CheckResult, Report, Status

        self._drain()
        results = []
        if self.monitor is not None:
            flow = self.monitor.result(**self.thresholds)
            flow.metrics["sample_every"] = self.sample_every  # the verdict covers the recorded steps only
            results.append(flow)
        if LOSS_CURVE in self.checks:
            results.append(self._curve_result())
        for r in results:
            r.metrics.setdefault("source", "live")
        ident = {
            "source": "live",
            "optimizer_steps_seen": int(self.monitor.steps_seen) if self.monitor is not None else None,
            "losses_seen": len(self.train_loss),
            "live_warnings": [f"{e.kind} at step {e.step}: {e.message}" for e in self.events],
            "stopped": self.stop_reason,
            **(identity or {}),
        }
        return Report(results=[r for r in results if isinstance(r, CheckResult)], identity=ident) if results else \
            Report(results=[CheckResult(LOSS_CURVE, Status.SKIP, "nothing was watched", {})], identity=ident)

    def _curve_result(self) -> Any:
        from ..dynamics.curves import MIN_POINTS, classify_curve
        from ..dynamics.loss_curve import curve_result
        from ..result import CheckResult, Status

        y = np.asarray(self.train_loss, dtype=np.float64)
        if y.size < MIN_POINTS and np.isfinite(y).all():
            return CheckResult(LOSS_CURVE, Status.SKIP,
                               f"{y.size} training losses were logged; classifying a curve needs at least {MIN_POINTS}",
                               {"points": int(y.size), "source": "live"},
                               advice=["Log the training loss at more steps (Lightning: self.log('train_loss', loss) "
                                       "every step; Hugging Face: logging_steps=1), or train longer."])
        val = np.asarray(self.val_loss) if self.val_loss else None
        diag = classify_curve(y, np.asarray(self.train_steps), val,
                              np.asarray(self.val_steps) if val is not None else None,
                              thresholds=self.curve_thresholds)
        return curve_result(diag, extra_metrics={"source": "live"})

    def write(self, report: Any, out_dir: str | os.PathLike) -> dict[str, str]:
        """Write ``report.html`` and ``findings.json`` into ``out_dir``; returns their paths."""
        os.makedirs(out_dir, exist_ok=True)
        paths = {"html": os.path.join(out_dir, "report.html"), "json": os.path.join(out_dir, "findings.json")}
        report.to_html(paths["html"], title="tropt live report")
        report.to_json(paths["json"])
        return paths

    def log(self, sink: Any, step: int, *, figures: bool = False) -> None:
        """Write the current record to a sink: losses-so-far are the trainer's; tropt adds the gradient norms, the
        warnings as text, and (``figures``) the gradient-flow picture."""
        if self.monitor is not None:
            from ..sinks import log_monitor

            log_monitor(self.monitor, sink, step, figures=figures, **self.thresholds)
