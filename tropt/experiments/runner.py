"""One run of a comparison: a candidate's Setup, one seed, the shared budget, on the Setup's own step.

:func:`run_one` never raises for a problem of the run itself: a step that raises or a loss that goes non-finite
is returned as a failed run with its reason. It returns plain Python data (numbers, strings, lists), so a run
travels back from any executor unchanged; :func:`run_pickled` is the entry point for executors in other
processes (the spec travels as cloudpickle bytes, so closures and lambdas in a Setup work).
"""

from __future__ import annotations

import functools
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from ..core.batch import batch_size, split_batch
from ..errors import Cancelled, TroptError
from ..metric import Metric
from .budget import Budget, EarlyStopping
from .evaluation import score

if TYPE_CHECKING:
    from ..setup import Setup

MIN_CURVE_POINTS = 10


@dataclass
class RunSpec:
    """Everything one run needs; pickled whole when an executor runs it elsewhere."""

    setup: Setup
    candidate: str
    seed: int
    budget: Budget
    metric: Metric | None
    eval_every: int
    early_stopping: EarlyStopping | None = None
    model_factory: Callable[[], torch.nn.Module] | None = None
    reinit: bool = False
    final_splits: dict[str, Any] = field(default_factory=dict)  # evaluated once at the end, never for selection
    select: str = "final"
    select_name: str = "val"  # the selection split's name ("val": the Setup's val_data)
    select_data: Any = None  # its data when it is not the Setup's val_data
    threads: int | None = None  # torch intra-op threads, chosen once by compare for every run (None: as it is)
    phase: str = "select"  # "select": the comparison's own seeds; "confirm": the winner's fresh seeds
    pruner: Callable[[int, float], bool] | None = None  # (step, value) -> stop now (experiments.pruning)


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@functools.lru_cache(maxsize=4)
def _process(pid: int) -> Any:
    import psutil

    return psutil.Process(pid)


def _memory_now(device: torch.device) -> float:
    """Process RSS in MiB on CPU (/proc/self/statm on Linux, a few microseconds; else psutil; else the peak from
    getrusage)."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * _PAGE / 2**20
    except (OSError, ValueError, IndexError):
        pass
    try:
        return _process(os.getpid()).memory_info().rss / 2**20
    except ImportError:  # pragma: no cover - psutil ships with jupyter
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _reinit(model: torch.nn.Module, seed: int) -> None:
    """Re-initialise every module that knows how (``reset_parameters``) from ``seed``: a from-scratch seed."""
    torch.manual_seed(seed)
    for m in model.modules():
        if hasattr(m, "reset_parameters") and callable(m.reset_parameters):
            m.reset_parameters()


NO_OPTIMIZER = "none (hand-written update)"


def _optimizer_label(opt: torch.optim.Optimizer | None) -> str:
    """The optimizer's class and first learning rate; a loop that updates the parameters by hand has none."""
    if opt is None:
        return NO_OPTIMIZER
    lr = opt.param_groups[0].get("lr") if opt.param_groups else None
    return (f"{type(opt).__name__}(lr={float(lr):.3g})" if isinstance(lr, (int, float, torch.Tensor))
            else type(opt).__name__)


def _first_lr(opt: torch.optim.Optimizer | None) -> float:
    """The first param group's learning rate, NaN without an optimizer (a hand-written update) or param groups."""
    return float(opt.param_groups[0]["lr"]) if opt is not None and opt.param_groups else math.nan


class _Run:
    """The state of one run as it trains; :meth:`record` turns it into plain data."""

    def __init__(self, spec: RunSpec) -> None:
        self.spec = spec
        self.steps = self.samples = 0
        self.losses: list[Any] = []  # 0-d tensors until checked (no device sync per step)
        self.loss_steps: list[int] = []
        self.lrs: list[float] = []
        self.evals: dict[str, list[float]] = {}
        self.eval_steps: list[int] = []
        self.status, self.reason, self.stopped_by = "ok", "", "budget"
        self.best: float | None = None
        self.best_step = 0
        self.bad_evals = 0
        self.train_seconds = 0.0
        self.seconds = 0.0
        self.cpu_seconds = math.nan
        self.peak_mb = math.nan
        self.optimizer = ""
        self.final_scores: dict[str, float] = {}
        self.checked = 0  # losses already checked for finiteness
        self.eval_cache: dict[str, Any] = {}  # what the first evaluation identified (the objective), reused

    # ------------------------------------------------------------------ bookkeeping
    def nonfinite_step(self) -> int | None:
        """The first step whose loss is non-finite among those not yet checked (one sync per evaluation)."""
        pending = self.losses[self.checked:]
        self.checked = len(self.losses)
        if not pending:
            return None
        ok = torch.isfinite(torch.stack([p.float() for p in pending]))
        if bool(ok.all()):
            return None
        return self.checked - len(pending) + int((~ok).nonzero()[0, 0]) + 1

    def evaluate(self, setup: Setup, ctx: Any) -> bool:
        """Score the model; True when early stopping says stop."""
        scores = score(setup, ctx, self.spec.metric, self.spec.select_data, prefix=self.spec.select_name,
                       cache=self.eval_cache)
        self.eval_steps.append(self.steps)
        for k, v in scores.items():
            self.evals.setdefault(k, []).append(v)
        value = next(iter(scores.values()))
        metric = self.spec.metric
        higher = metric.higher_is_better if metric is not None else False
        es = self.spec.early_stopping
        delta = es.min_delta if es is not None else 0.0
        improved = self.best is None or (value > self.best + delta if higher else value < self.best - delta)
        if improved:
            self.bad_evals = 0
        else:
            self.bad_evals += 1
        if self.best is None or (value > self.best if higher else value < self.best):
            self.best, self.best_step = value, self.steps
        return es is not None and self.bad_evals >= es.patience

    def last_value(self) -> float:
        """The selection metric at the latest evaluation."""
        return next(iter(self.evals.values()))[-1]

    def fail(self, reason: str, stopped_by: str) -> None:
        self.status, self.reason, self.stopped_by = "failed", reason, stopped_by

    # ------------------------------------------------------------------ the result
    def record(self) -> dict[str, Any]:
        spec, budget = self.spec, self.spec.budget
        losses = torch.stack(self.losses).float().cpu().tolist() if self.losses else []  # one sync, not one a loss
        curve = _curve_signals(losses, self.lrs)
        primary = next(iter(self.evals), None)
        vals = self.evals.get(primary, []) if primary else []
        final = vals[-1] if vals and self.status == "ok" else math.nan
        best = self.best if self.best is not None and self.status == "ok" else math.nan
        planned_steps = budget.steps
        if planned_steps is None and budget.samples is not None and self.steps and self.samples:
            planned_steps = math.ceil(budget.samples / (self.samples / self.steps))
        early = self.stopped_by in ("early_stopping", "pruned")
        rec: dict[str, Any] = {
            "candidate": spec.candidate, "seed": spec.seed, "status": self.status, "reason": self.reason,
            "stopped_by": self.stopped_by, "optimizer": self.optimizer,
            "steps": self.steps, "samples": self.samples,
            "seconds": self.seconds, "train_seconds": self.train_seconds, "cpu_seconds": self.cpu_seconds,
            "samples_per_s": self.samples / self.train_seconds if self.train_seconds > 0 else math.nan,
            "seconds_per_step": self.train_seconds / self.steps if self.steps else math.nan,
            "threads": spec.threads, "phase": spec.phase,
            "peak_memory_mb": self.peak_mb,
            "cost": budget.cost(self.seconds),
            "score": (best if spec.select == "best" else final),
            "final": final, "best": best, "best_step": self.best_step if self.best is not None else None,
            "steps_saved": (planned_steps - self.steps) if early and planned_steps else 0,
            "samples_saved": (budget.samples - self.samples) if early and budget.samples else 0,
            **curve,
        }
        for k, v in self.evals.items():
            if k != primary:
                rec[f"final_{k}"] = v[-1] if v and self.status == "ok" else math.nan
        rec.update(self.final_scores)
        rec["curves"] = {"step": list(self.loss_steps), "train_loss": losses, "lr": list(self.lrs),
                         "eval_step": list(self.eval_steps), **{k: list(v) for k, v in self.evals.items()}}
        return rec


def _curve_signals(losses: list[float], lrs: list[float]) -> dict[str, Any]:
    """Instability signals of a training curve: non-finite values, spikes, and its ``dynamics.loss_curve`` class."""
    import numpy as np

    from ..dynamics.curves import classify_curve

    y = np.asarray(losses, dtype=float)
    out = {"non_finite": int((~np.isfinite(y)).sum()), "spikes": 0, "curve_class": "too_short"}
    if y.size >= MIN_CURVE_POINTS or out["non_finite"]:
        try:
            known = len(lrs) >= y.size and not np.isnan(np.asarray(lrs[: y.size], dtype=float)).all()
            diag = classify_curve(y, lrs=lrs[: y.size] if known else None)
            out["spikes"] = int(diag.metrics.get("spikes", 0) or 0)
            out["curve_class"] = diag.primary
        except TroptError:
            pass
    out["unstable"] = bool(out["non_finite"] or out["spikes"] or out["curve_class"] in ("diverging", "non_finite"))
    return out


def _start(spec: RunSpec, run: _Run) -> tuple[Any, Any]:
    """The run's Setup (its seed) and fresh training objects: the model factory's or a copy, re-initialised on
    request."""
    from .seeding import vary_order

    setup = vary_order(spec.setup.replace(seed=spec.seed), spec.seed)
    model = None
    if spec.model_factory is not None:
        torch.manual_seed(spec.seed)  # the factory's initialisation is the seed's
        model = spec.model_factory()
        if not isinstance(model, torch.nn.Module):
            raise TroptError(f"the model factory returned a {type(model).__name__}, not an nn.Module",
                             "return the module")
    ctx = setup.build(seed=spec.seed, model=model)
    if spec.reinit:
        _reinit(ctx.model, spec.seed)
    run.optimizer = _optimizer_label(ctx.optimizer)
    if ctx.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(ctx.device)
    else:
        run.peak_mb = _memory_now(ctx.device)
    return setup, ctx


def _cut(batch: Any, n: int, budget: Budget, seen: int) -> tuple[Any, int]:
    """The batch, cut so a samples budget is met exactly (the last batch of a run may be partial)."""
    if budget.samples is not None and seen + n > budget.samples:
        keep = budget.samples - seen
        return split_batch(batch, sizes=[keep, n - keep])[0], keep
    return batch, n


class _Stepper:
    """Calls the Setup's step and reads its loss. The first step goes through :class:`StepRunner` (which finds where
    the loss comes from); once the step is seen to return its loss, later steps call it with no wrapper at all."""

    def __init__(self, setup: Setup, ctx: Any) -> None:
        from ..core.stepping import StepRunner

        self.setup, self.ctx = setup, ctx
        self.runner = StepRunner(setup, ctx)
        self.direct = False

    def __call__(self, micro: list) -> Any:
        from ..core.stepping import as_loss

        if self.direct:
            return as_loss(self.setup.run_step(self.ctx, micro))
        loss = self.runner.step(micro)
        if self.runner.source == "step return":
            # The first step went through Setup.loss, which checks that loss_fn gives a scalar tensor; from now on the
            # step calls loss_fn itself (an error still fails the run, through Setup.run_step).
            self.ctx.loss_fn, self.direct = self.setup.loss_fn, True
        return loss


def _checkpoint(spec: RunSpec, run: _Run, setup: Setup, ctx: Any, callback: Callable | None) -> bool | None:
    """At an evaluation point: None when the loss went non-finite (the run failed), else whether early stopping
    says stop. Records the scores and the memory high-water mark."""
    bad = run.nonfinite_step()
    if bad is not None:
        run.fail(f"non-finite training loss at step {run.loss_steps[bad - 1]}", "non_finite")
        return None
    early = run.evaluate(setup, ctx)
    if ctx.device.type != "cuda":
        run.peak_mb = max(run.peak_mb, _memory_now(ctx.device))
    if callback is not None:
        callback({"candidate": spec.candidate, "seed": spec.seed, "step": run.steps, "total": spec.budget.steps,
                  **{k: v[-1] for k, v in run.evals.items()}})
    return early


def _train(spec: RunSpec, run: _Run, callback: Callable[[dict], Any] | None) -> tuple[Any, Any]:
    """The training loop of one run; fills ``run`` and returns (setup, ctx) for the final evaluations."""
    from ..core.stepping import sync

    budget = spec.budget
    setup, ctx = _start(spec, run)
    step = _Stepper(setup, ctx)
    t0, c0 = time.perf_counter(), time.thread_time()
    eval_time, stop = 0.0, None
    for batch in setup.batches(budget.steps if budget.steps is not None else sys.maxsize, seed=spec.seed):
        batch, n = _cut(batch, batch_size(batch), budget, run.samples)
        k = min(ctx.accumulation_steps, n)
        loss = step([batch] if k == 1 else split_batch(batch, k))
        run.steps += 1
        run.samples += n
        if loss is not None:  # None only on the first step of a loop whose loss tropt reads by an extra forward
            run.losses.append(loss)
            run.loss_steps.append(run.steps)
            run.lrs.append(_first_lr(ctx.optimizer))
        done = (budget.steps is not None and run.steps >= budget.steps) or (
            budget.samples is not None and run.samples >= budget.samples)
        if budget.seconds is not None and not done and time.perf_counter() - t0 >= budget.seconds:
            stop = "seconds"
        if done or stop or run.steps % spec.eval_every == 0:
            e0 = time.perf_counter()
            early = _checkpoint(spec, run, setup, ctx, callback)
            eval_time += time.perf_counter() - e0
            if early is None:
                break
            if early and not done and not stop:
                stop = "early_stopping"
            if spec.pruner is not None and spec.pruner(run.steps, run.last_value()) and not done and not stop:
                stop = "pruned"  # every evaluation is reported to the pruner, the last one too
        if done or stop:
            break
    sync(ctx.device)
    run.seconds = time.perf_counter() - t0
    run.cpu_seconds = time.thread_time() - c0  # this thread's CPU time: wall time minus waiting for a core
    run.train_seconds = max(run.seconds - eval_time, 0.0)
    if ctx.device.type == "cuda":
        run.peak_mb = torch.cuda.max_memory_allocated(ctx.device) / 2**20
    if run.status == "ok":
        run.stopped_by = stop or ("steps" if budget.steps is not None and run.steps >= budget.steps else "samples")
    return setup, ctx


def run_one(spec: RunSpec, callback: Callable[[dict], Any] | None = None) -> dict[str, Any]:
    """Train and score one run; problems of the run become a failed record, never an exception.

    The process's RNG states are put back afterwards, so a sequential comparison leaves the caller's randomness
    as it was. :class:`tropt.errors.Cancelled` raised by ``callback`` propagates (a Stop button).
    """
    from ..snapshot import preserved

    run = _Run(spec)
    before = torch.get_num_threads()
    if spec.threads is not None:
        torch.set_num_threads(spec.threads)  # the same count in every process, so runs stay comparable
    with preserved():
        try:
            setup, ctx = _train(spec, run, callback)
            if run.status == "ok":
                for name, data in spec.final_splits.items():
                    run.final_scores.update(score(setup, ctx, spec.metric, data, prefix=name))
        except Cancelled:
            raise
        except Exception as exc:  # noqa: BLE001 - the run failed; the comparison goes on
            message = exc.message if isinstance(exc, TroptError) else f"{type(exc).__name__}: {exc}"
            if "non-finite" in message or "nan" in message.lower().split():
                run.fail(message, "non_finite")
            else:
                run.fail(message, "error")
        finally:
            torch.set_num_threads(before)
    return run.record()


def run_pickled(blob: bytes) -> dict[str, Any]:
    """Executor entry point: unpickle a :class:`RunSpec` (cloudpickle bytes) and run it."""
    import pickle

    return run_one(pickle.loads(blob))
