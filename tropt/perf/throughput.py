"""``perf.throughput``: where one training step's time goes (waiting for data vs forward/backward/optimizer),
samples/s, peak memory, and a ``torch.profiler`` table of the top operators as evidence."""

from __future__ import annotations

import contextlib
import math
import os
import resource
import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pandas as pd
import torch

from ..errors import TroptError
from ..registry import register
from ..result import CheckResult, Status
from ._timing import machine_load, median_interval, oversubscription, oversubscription_advice, thread_probe

if TYPE_CHECKING:
    from ..setup import Setup

CHECK_ID = "perf.throughput"


def rss_mb() -> float:
    """Current resident set size of this process in MiB (from /proc; NaN where unavailable)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return math.nan


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MiB (``getrusage``; lifetime peak, not per step)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024


def state_mb(ctx: Any) -> dict[str, float]:
    """Bytes held by parameters, gradients and optimizer state of a built context, in MiB."""
    params = sum(p.numel() * p.element_size() for p in ctx.model.parameters())
    grads = sum(p.grad.numel() * p.grad.element_size() for p in ctx.model.parameters() if p.grad is not None)
    opt = 0
    for state in (ctx.optimizer.state.values() if ctx.optimizer is not None else ()):  # None: a hand-written update
        for v in state.values():
            if isinstance(v, torch.Tensor):
                opt += v.numel() * v.element_size()
    return {"params_mb": params / 2**20, "grads_mb": grads / 2**20, "optimizer_state_mb": opt / 2**20}


def _loader_advice(setup: Setup, device: torch.device) -> list[str]:
    """DataLoader settings that hide data loading behind compute, named from the user's loader."""
    data = setup.train_data
    cores = os.cpu_count() or 1
    if not isinstance(data, torch.utils.data.DataLoader):
        if isinstance(data, torch.utils.data.Dataset):
            return [f"Wrap the dataset in a DataLoader with num_workers={min(8, max(1, cores - 1))}, "
                    "persistent_workers=True and prefetch_factor=2–4"
                    + (", pin_memory=True" if device.type == "cuda" else "") + "."]
        return ["Precompute and cache the batches, or move the preprocessing into a DataLoader with workers."]
    advice = []
    if data.num_workers == 0:
        advice.append(f"Load in parallel: DataLoader(num_workers={min(8, max(1, cores - 1))}) (this machine has "
                      f"{cores} CPU cores).")
    else:
        if not data.persistent_workers:
            advice.append("Keep workers alive between epochs: DataLoader(persistent_workers=True).")
        if (data.prefetch_factor or 2) < 4:
            advice.append("Prefetch more batches per worker: DataLoader(prefetch_factor=4).")
        if data.num_workers < cores - 1:
            advice.append(f"Use more workers (num_workers={data.num_workers} of {cores} cores).")
    if device.type == "cuda" and not data.pin_memory:
        advice.append("Use pinned host memory for faster copies: DataLoader(pin_memory=True) and "
                      ".to(device, non_blocking=True).")
    advice.append("Move expensive per-sample work (decoding, augmentation) out of __getitem__ or cache its results.")
    return advice


def _cheap_batches_advice(setup: Setup) -> str:
    data = setup.train_data
    workers = isinstance(data, torch.utils.data.DataLoader) and data.num_workers > 0
    return ("Waiting is under a millisecond per batch, so worker processes may cost more than they save"
            + (f" (try num_workers=0 instead of {data.num_workers})" if workers else "")
            + ": index whole batches at once (tensors in memory sliced by a batch of indices, or a BatchSampler) "
            "instead of collating one sample at a time.")


@contextlib.contextmanager
def _native_stderr_muted() -> Iterator[None]:
    """Send file descriptor 2 to /dev/null for a moment.

    The profiler's native library writes "profiler_start"/"profiler_stop" lines straight to fd 2 at any log level;
    in Jupyter those land in the cell's output. Only the profiler's own start and stop run inside this, never the
    user's step, so nothing of theirs is hidden.
    """
    try:
        saved, sink = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    except OSError:  # no fd 2 to redirect (some embedded interpreters): leave the output as it is
        yield
        return
    try:
        os.dup2(sink, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(sink)


MAX_PROFILED_OPS = 50_000  # operator calls profiled in all: a step above it is profiled alone


def _profile_one(setup: Setup, ctx: Any, batch: Any, activities: list, cuda: bool) -> tuple[list[dict], int]:
    """One step under ``torch.profiler``: per-operator rows and the number of operator calls. One session per step
    keeps the profiler's events (a Python object each) to one step's worth: an LBFGS step over an unrolled RNN makes
    ~70,000, and three in one session grew the process by a gigabyte that it kept."""
    from torch.profiler import profile

    prof = profile(activities=activities)
    with _native_stderr_muted():
        prof.start()
    try:
        setup.run_step(ctx, ctx.split(batch, ctx.accumulation_steps))
        if cuda:
            torch.cuda.synchronize(ctx.device)
    finally:
        with _native_stderr_muted():
            prof.stop()
    rows, calls = [], 0
    for e in prof.key_averages():
        row = {"operator": e.key, "calls": int(e.count), "self_cpu_ms": e.self_cpu_time_total / 1e3,
               "cpu_total_ms": e.cpu_time_total / 1e3}
        if cuda:
            row["self_device_ms"] = getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0.0)) / 1e3
        rows.append(row)
        calls += int(e.count)
    return rows, calls


def profile_ops(setup: Setup, ctx: Any, batches: list, top: int = 15) -> pd.DataFrame:
    """``torch.profiler`` over a few steps, one profiler session each (summed): the top operators by self time (CPU,
    plus CUDA on GPU). Steps after the first are skipped once the operator calls would pass ``MAX_PROFILED_OPS``;
    ``df.attrs["profiled_steps"]`` says how many were profiled."""
    from torch.profiler import ProfilerActivity

    activities = [ProfilerActivity.CPU]
    cuda = ctx.device.type == "cuda"
    if cuda:
        activities.append(ProfilerActivity.CUDA)
    rows, profiled, calls = [], 0, 0
    for batch in batches:
        if profiled and calls * (profiled + 1) / profiled > MAX_PROFILED_OPS:
            break
        got, n = _profile_one(setup, ctx, batch, activities, cuda)
        rows += got
        calls += n
        profiled += 1
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    df = df.groupby("operator", as_index=False, sort=False).sum()
    key = "self_device_ms" if cuda and df["self_device_ms"].sum() > 0 else "self_cpu_ms"
    df = df[~df["operator"].str.startswith("ProfilerStep")]
    total = df[key].sum() or 1.0
    df = df.sort_values(key, ascending=False).head(top).reset_index(drop=True)
    df["share"] = df[key] / total
    df.attrs["profiled_steps"] = profiled
    return df


@register(CHECK_ID, title="Step time, data wait and memory",
          description="Time steady-state steps on a copy: data wait vs compute, samples/s, peak memory, "
                      "top profiler operators.",
          budgets={'quick': {'warmup': 1, 'steps': 5, 'min_steps': 3, 'profile': False},
                   'thorough': {'warmup': 10, 'steps': 100, 'min_steps': 30, 'profile_steps': 3}},
          plot="tropt.plots.perf")
def check_throughput(
    setup: Setup,
    *,
    warmup: int = 2,
    steps: int = 30,
    min_steps: int = 8,
    data_threshold: float = 0.2,
    profile: bool = True,
    profile_steps: int = 1,
    progress: bool = True,
) -> CheckResult:
    """Measure steady-state training steps of a copy of the Setup.

    Parameters
    ----------
    setup
        The :class:`tropt.Setup` (never modified; the copy trains inside :func:`tropt.snapshot.preserved`).
    warmup
        Steps run first and not timed (allocator, caches, lazy initialisation, DataLoader worker start-up).
    steps, min_steps
        Timed optimizer steps, at most and at least: after ``min_steps`` the timing stops once the wait share's 95%
        interval is off ``data_threshold``. Each step's time is split into waiting for its batch (the user's
        loader, the move to the device) and the step itself, with device synchronisation on GPU.
    data_threshold
        WARN when waiting for data takes more than this share of the step time, beyond noise: the 95% interval of
        the per-step share lies above it (a median above it with an interval that reaches below is "too noisy to
        decide", a PASS that says so).
    profile, profile_steps
        Also run ``profile_steps`` steps under ``torch.profiler`` for the top-operators table.
    progress
        Show a progress bar.

    Step times come with their spread; on CPU a short probe alternates torch's threads with one (oversubscription).
    Memory: on CUDA the allocator's peak; on CPU the process's RSS and the bytes of parameters, grads, optimizer state.
    """
    from tqdm.auto import tqdm

    from ..snapshot import preserved

    _check_counts(warmup, steps, profile_steps)
    floor = max(3, min(int(min_steps), steps))
    setup.validate()
    device = cast(torch.device, setup.device)  # Setup.__post_init__ makes it a torch.device
    cuda = device.type == "cuda"
    machine = machine_load()  # before the steps: the load other processes put on the cores
    probe = None
    with preserved(setup.model):
        ctx = setup.build()
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        rss_before = rss_mb()
        total = warmup + steps
        it = iter(setup.batches(total + (profile_steps if profile else 0)))
        bar = tqdm(total=total, desc=CHECK_ID, disable=not progress, leave=False)
        try:
            waits, computes, sizes, micro = _timed_steps(setup, ctx, it, warmup, total, bar,
                                                         lambda w, c: _decided(w, c, floor, data_threshold))
            memory = _memory(ctx, device, rss_before)
            if device.type == "cpu":  # after the timed steps: the probe's extra steps change nothing measured
                probe = thread_probe(lambda: setup.run_step(ctx, micro))
            ops = profile_ops(setup, ctx, [next(it) for _ in range(profile_steps)]) if profile else None
        finally:
            bar.close()
    wait, comp = np.asarray(waits), np.asarray(computes)
    step = wait + comp
    metrics = _metrics(wait, comp, sizes, warmup, len(step), setup, memory)
    metrics["max_steps"] = int(steps)
    tables = _tables(wait, comp, warmup, ops, metrics)
    series = {"data_wait_ms": wait * 1e3, "compute_ms": comp * 1e3}
    verdict = data_verdict(wait, step, data_threshold)
    metrics.update(data_wait_share_low=verdict["low"], data_wait_share_high=verdict["high"])
    metrics["limited_by"] = "data loading" if verdict["bound"] else ("device compute" if cuda else "compute")
    over = oversubscription(step, machine, probe, device.type)
    metrics.update(machine, oversubscribed=bool(over))
    if probe is not None:
        metrics["one_thread_speedup"] = probe[0]
    return _result(setup, metrics, tables, series, verdict, over, machine, data_threshold)


def _check_counts(warmup: int, steps: int, profile_steps: int) -> None:
    """Raise on a step count that is not an integer or is too small, saying what to use."""
    for name, value, low in (("warmup", warmup, 0), ("steps", steps, 3), ("profile_steps", profile_steps, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise TroptError(f"{name}={value!r}; it must be an integer >= {low}", f"use e.g. {name}={max(low, 5)}")


def _tables(wait: np.ndarray, comp: np.ndarray, warmup: int, ops: pd.DataFrame | None,
            metrics: dict[str, Any]) -> dict[str, pd.DataFrame]:
    """Per-step times and, when profiled, the top operators (their step count goes into ``metrics``)."""
    step = wait + comp
    per_step = pd.DataFrame({"step": np.arange(warmup, warmup + len(step)), "data_wait_ms": wait * 1e3,
                             "compute_ms": comp * 1e3, "step_ms": step * 1e3})
    tables = {"steps": per_step}
    if ops is not None and not ops.empty:
        tables["top_operators"] = ops
        metrics["profiled_steps"] = int(ops.attrs.get("profiled_steps", 0))
    return tables


def _decided(waits: list[float], computes: list[float], min_steps: int, threshold: float) -> bool:
    """Whether the timed steps so far decide the data-wait verdict: at least ``min_steps`` of them, and the wait
    share's 95% interval wholly above or below ``threshold``."""
    if len(waits) < min_steps:
        return False
    v = data_verdict(np.asarray(waits), np.asarray(waits) + np.asarray(computes), threshold)
    return bool(v["low"] > threshold or v["high"] < threshold)


def _timed_steps(setup: Setup, ctx: Any, it: Iterator, warmup: int, total: int, bar: Any,
                 decided: Any = None) -> tuple[list[float], list[float], list[int], Any]:
    """Run up to ``total`` steps, timing the wait for each batch apart from the step (device synchronised around
    both); the waits, step times and batch sizes of the steps after ``warmup``, and the last step's micro-batches.
    Stops early once ``decided(waits, computes)`` says the verdict is settled."""
    from ..core.stepping import sync

    device = cast(torch.device, setup.device)  # Setup.__post_init__ makes it a torch.device
    waits, computes, sizes = [], [], []
    micro = None
    for i in range(total):
        sync(device)
        t0 = time.perf_counter()
        batch = next(it)
        micro = ctx.split(batch, ctx.accumulation_steps)
        sync(device)
        t1 = time.perf_counter()
        setup.run_step(ctx, micro)
        sync(device)
        t2 = time.perf_counter()
        bar.update(1)
        if i >= warmup:
            waits.append(t1 - t0)
            computes.append(t2 - t1)
            sizes.append(ctx.batch_size(batch))
            if decided is not None and decided(waits, computes):
                break
    return waits, computes, sizes, micro


def _memory(ctx: Any, device: torch.device, rss_before: float) -> dict[str, float]:
    """Parameters, gradients and optimizer state of the copy, the process's RSS and, on CUDA, the allocator's peak."""
    memory = state_mb(ctx)
    memory["rss_mb"] = rss_mb()
    memory["rss_increase_mb"] = memory["rss_mb"] - rss_before
    memory["peak_rss_mb"] = peak_rss_mb()
    if device.type == "cuda":
        memory["peak_allocated_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
        memory["peak_reserved_mb"] = torch.cuda.max_memory_reserved(device) / 2**20
    return memory


def _metrics(wait: np.ndarray, comp: np.ndarray, sizes: list[int], warmup: int, steps: int, setup: Setup,
             memory: dict[str, float]) -> dict[str, Any]:
    """Median step, wait and compute times, the spread of the step time, samples/s and the memory."""
    step = wait + comp
    frac = float(wait.sum() / step.sum()) if step.sum() > 0 else 0.0
    med = float(np.median(step))
    samples = float(np.median(sizes))
    return {
        "step_ms": med * 1e3,
        "data_wait_ms": float(np.median(wait)) * 1e3,
        "compute_ms": float(np.median(comp)) * 1e3,
        "data_wait_share": frac,
        "samples_per_s": samples / med if med > 0 else math.nan,
        "batch_size": samples,
        "timed_steps": int(steps),
        "warmup_steps": int(warmup),
        "step_time_cv": float(np.std(step) / np.mean(step)) if step.mean() > 0 else 0.0,
        "step_ms_min": float(np.min(step)) * 1e3,
        "step_ms_p10": float(np.percentile(step, 10)) * 1e3,
        "step_ms_p90": float(np.percentile(step, 90)) * 1e3,
        "step_ms_max": float(np.max(step)) * 1e3,
        "device": str(setup.device),
        "precision": setup.precision,
        **memory,
    }


def _result(setup: Setup, metrics: dict[str, Any], tables: dict[str, pd.DataFrame], series: dict[str, np.ndarray],
            verdict: dict[str, Any], over: list[str], machine: dict[str, Any], data_threshold: float) -> CheckResult:
    """The summary and the advice: WARN when waiting for data limits the step beyond noise."""
    device = cast(torch.device, setup.device)  # Setup.__post_init__ makes it a torch.device
    mem = (f"peak GPU memory {metrics['peak_allocated_mb']:.0f} MiB" if device.type == "cuda"
           else f"RSS {metrics['rss_mb']:.0f} MiB")
    summary = (f"{metrics['step_ms']:.3g} ms/step ({metrics['step_ms_min']:.3g}-{metrics['step_ms_max']:.3g} over "
               f"{metrics['timed_steps']} steps), {metrics['samples_per_s']:.4g} samples/s; waiting for data takes "
               f"{metrics['data_wait_share']:.0%} of the step; {mem}")
    if verdict["noisy"]:
        summary += (f"; timings too noisy to decide whether data loading limits the step (its share per step: median "
                    f"{verdict['median']:.0%}, interval {verdict['low']:.0%}-{verdict['high']:.0%} around the "
                    f"{data_threshold:.0%} threshold)")
    extra = []
    if over:
        summary += "; timings may be inflated by oversubscription (" + "; ".join(over) + ")"
        extra.append(oversubscription_advice(machine))
    if verdict["bound"]:
        # Sub-millisecond waits are per-sample overhead, not slow loading: more workers would not help, so the
        # worker / prefetch advice is left out rather than contradicted.
        advice = [_cheap_batches_advice(setup)] if metrics["data_wait_ms"] < 1.0 else _loader_advice(setup, device)
        return CheckResult(CHECK_ID, Status.WARN, f"data-loading bound: {summary}", metrics, tables, advice + extra,
                           series)
    return CheckResult(CHECK_ID, Status.PASS, f"{metrics['limited_by']}-bound: {summary}", metrics, tables, extra,
                       series)


def data_verdict(wait: np.ndarray, step: np.ndarray, threshold: float) -> dict[str, Any]:
    """Whether waiting for data limits the step beyond noise: the per-step wait share's median and 95% interval.

    ``bound`` when the whole interval lies above ``threshold``; ``noisy`` when the median does but the interval
    reaches below it (then no verdict either way)."""
    shares = [w / t for w, t in zip(wait, step, strict=False) if t > 0]
    med, lo, hi = median_interval(shares)
    if not shares:
        med = lo = hi = 0.0
    return {"median": med, "low": lo, "high": hi, "bound": bool(lo > threshold),
            "noisy": bool(med > threshold >= lo)}
