"""``perf.precision``: which precision is fast *and* stable on this device for this Setup.

Each precision the device supports runs the same seeded steps from the same copy of the model as fp32, the timed
steps interleaved round by round; we compare step time (with its spread and the speed-up's interval), memory and
stability (loss-trajectory deviation from fp32, non-finite losses, GradScaler skipped steps) and recommend the
fastest one inside the stability guardrail when its speed-up is beyond timing noise. Unsupported precisions are SKIP
with the hardware reason. An optional batch-size search doubles the batch until memory runs out or a budget is
reached, and keeps the throughput curve.
"""


from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pandas as pd
import torch

from ..errors import TroptError
from ..registry import register
from ..result import CheckResult, Status
from ._timing import machine_load, oversubscription, oversubscription_advice, thread_probe
from .precision_runs import PrecisionRun, batch_search

if TYPE_CHECKING:
    from ..setup import Setup

CHECK_ID = "perf.precision"
PRECISIONS = ("fp32", "bf16", "fp16", "tf32")
COLUMNS = ["precision", "status", "reason", "step_ms", "step_ms_min", "step_ms_max", "samples_per_s", "speedup",
           "speedup_low", "speedup_high", "peak_memory_mb", "activation_mb", "loss_deviation", "max_step_deviation",
           "non_finite", "scaler_skips", "stable"]


def support(precision: str, device: torch.device) -> tuple[bool, str]:
    """Whether ``device`` supports ``precision`` for training, and why not."""
    kind = device.type
    if precision == "fp32":
        return True, ""
    if precision == "bf16":
        if kind == "cuda":
            ok = torch.cuda.is_bf16_supported()
            return ok, "" if ok else (f"{torch.cuda.get_device_name(device)} has no bfloat16 support (needs compute "
                                      "capability >= 8.0)")
        if kind in ("cpu", "mps"):
            return True, ""
        return False, f"bf16 autocast is not available on {kind}"
    if precision == "fp16":
        if kind == "cuda":
            return True, ""
        return False, (f"fp16 training (autocast + GradScaler) is a CUDA path: this device is a {kind.upper()}, whose "
                       "matrix units gain nothing from fp16 and whose GradScaler support is limited; use bf16 here")
    if precision == "tf32":
        if kind == "cuda":
            major, _ = torch.cuda.get_device_capability(device)
            if major >= 8:
                return True, ""
            return False, f"TF32 needs an NVIDIA GPU of compute capability >= 8.0 (Ampere); this one is {major}.x"
        return False, f"TF32 is a tensor-core format of NVIDIA GPUs (Ampere and later); this device is a {kind.upper()}"
    raise TroptError(f"unknown precision {precision!r}", f"use some of {', '.join(PRECISIONS)}")



def _measure(setup: Setup, order: list[str], steps: int, warmup: int, seed: int,
             clock: Any = time.perf_counter, decided: Any = None) -> tuple[dict[str, dict], dict[str, str], Any]:
    """Run every supported precision of ``order`` on the same seeded batches, timed steps interleaved.

    Each run's build and warm-up steps go one precision at a time (so its peak memory is its own); then the timed
    steps take turns, round by round, the order rotating each round, so a burst of machine noise lands on every
    precision alike and step ``i`` of each precision forms a pair. After each round ``decided(runs)`` may end the
    timing early (a sequential test: the recommendation can no longer change). Returns (results, reasons for those
    not measured, the fp32 run for a thread probe)."""
    reasons: dict[str, str] = {}
    live: dict[str, PrecisionRun] = {}
    source = list(setup.batches(warmup + steps, seed=seed))
    first = max(1, warmup)  # at least one step alone: the peak memory of each run
    for p in order:
        ok, why = support(p, cast(torch.device, setup.device))  # Setup.__post_init__ makes it a torch.device
        if not ok:
            reasons[p] = why
            continue
        try:
            run = PrecisionRun(setup, p, seed, source, clock)
            for i in range(min(first, len(source))):
                run.step(i, timed=i >= warmup)
            run.note_peak()
            live[p] = run
        except Exception as exc:  # one precision failing is a finding, not a crash (fp32 failing re-raises)
            if p == "fp32":
                raise
            reasons[p] = f"failed: {type(exc).__name__}: {exc}"
    for i in range(first, len(source)):
        names = list(live)
        k = i % max(1, len(names))
        for p in names[k:] + names[:k]:
            try:
                live[p].step(i, timed=True)
            except Exception as exc:
                if p == "fp32":
                    raise
                reasons[p] = f"failed: {type(exc).__name__}: {exc}"
                del live[p]
        if decided is not None and decided(live):
            break
    return {p: r.result() for p, r in live.items()}, reasons, live.get("fp32")


def settled(live: dict[str, PrecisionRun], current: str, min_steps: int, speedup_threshold: float,
            max_deviation: float = 0.05) -> bool:
    """Whether the timed rounds so far settle the recommendation (a sequential test): at least ``min_steps`` of them,
    every loss finite, no scaler skip, and every candidate's speed-up over the Setup's precision (fp32 when it is
    not measured) decided: the 95% interval wholly under ``speedup_threshold`` (it cannot be recommended), or wholly
    at or above it with the loss of the last fifth of the steps within half of ``max_deviation`` of the reference's
    (clearly worth it, clearly stable). Anything in between keeps the comparison going to ``steps``."""
    from ._timing import speedup

    ref = current if current in live else "fp32"
    if ref not in live or len(live[ref].times) < min_steps:
        return False
    if any(not np.all(np.isfinite(r.losses)) or r.skips for r in live.values()):
        return False
    ref_losses = np.asarray(live[ref].losses, dtype=float)
    tail = max(1, len(ref_losses) // 5)
    ref_tail = float(np.mean(ref_losses[-tail:]))
    for p, r in live.items():
        if p == ref:
            continue
        _, low, high = speedup(live[ref].times, r.times)
        dev = abs(float(np.mean(np.asarray(r.losses, dtype=float)[-tail:])) - ref_tail) / max(abs(ref_tail), 1e-12)
        if not (high < speedup_threshold or (low >= speedup_threshold and dev <= max_deviation / 2)):
            return False
    return True


def choose(times: dict[str, np.ndarray], stable: dict[str, bool], current: str,
           speedup_threshold: float = 1.2) -> dict[str, Any]:
    """Which precision to recommend from interleaved step times, by rules that survive timing noise.

    Speed-ups are measured against the Setup's own precision (fp32 when it was not measured) as the median of
    paired per-round ratios with a 95% interval (:func:`tropt.perf._timing.speedup`). A stable precision is
    recommended over the Setup's own only when its interval excludes 1 and its median reaches
    ``speedup_threshold``; it is a WARN only when even the interval's low end reaches the threshold (the Setup's
    precision is clearly slower beyond noise), otherwise advice with a PASS. A median at the threshold whose
    interval includes 1 is "timings too noisy to decide". An unstable Setup precision always gives way to the
    fastest stable one (WARN). Returns the recommendation, the verdict and every speed-up interval."""
    from ._timing import clear, speedup

    ref = current if current in times else "fp32"
    ups = {p: speedup(times[ref], t) for p, t in times.items()}
    stable_ps = [p for p in times if stable.get(p)]
    fastest = min(stable_ps, key=lambda p: float(np.median(times[p]))) if stable_ps else next(iter(times))
    out = {"reference": ref, "speedups": ups, "fastest": fastest, "recommended": ref, "verdict": "keep", "warn": False}
    if current in times and not stable.get(current):
        out.update(recommended=fastest, verdict="unstable", warn=fastest != current)
        return out
    faster = [p for p in stable_ps if p != ref and clear(ups[p])]
    worth = [p for p in faster if ups[p][0] >= speedup_threshold]
    noisy = [p for p in stable_ps if p != ref and ups[p][0] >= speedup_threshold and not clear(ups[p])]
    if worth:
        best = max(worth, key=lambda p: ups[p][0])
        out.update(recommended=best, verdict="clear" if clear(ups[best], speedup_threshold) else "likely",
                   warn=clear(ups[best], speedup_threshold))
    elif noisy:
        out.update(verdict="noisy", candidate=max(noisy, key=lambda p: ups[p][0]))
    elif faster:
        out.update(verdict="marginal", candidate=max(faster, key=lambda p: ups[p][0]))
    return out


@register(CHECK_ID, title="Precision: speed, memory and stability",
          description="Run the same steps in fp32, bf16 (and fp16/TF32 on CUDA); "
                      "recommend the fastest inside a stability guardrail.",
          budgets={'quick': {'warmup': 1, 'steps': 5, 'min_steps': 3},
                   'thorough': {'warmup': 5, 'steps': 50, 'min_steps': 50}},
          plot="tropt.plots.perf")
def check_precision(
    setup: Setup,
    *,
    precisions: tuple[str, ...] = PRECISIONS,
    steps: int = 20,
    warmup: int = 2,
    min_steps: int = 8,
    max_deviation: float = 0.05,
    max_skip_share: float = 0.1,
    speedup_threshold: float = 1.2,
    batch_size_search: bool = False,
    max_doublings: int = 4,
    memory_budget_mb: float | None = None,
    progress: bool = True,
) -> CheckResult:
    """Compare precisions on copies of the Setup over the same seeded steps.

    Parameters
    ----------
    setup
        The :class:`tropt.Setup` (never modified; global TF32 switches are put back too).
    precisions
        Candidates among "fp32", "bf16", "fp16" (autocast + GradScaler) and "tf32" (fp32 with TF32 matmuls).
        fp32 is always run as the reference.
    steps, warmup
        Timed steps (at most) after ``warmup`` untimed ones; the loss of every step is compared with fp32's.
    min_steps
        Timed steps always run; then the comparison stops once the recommendation is settled (see :func:`settled`).
    max_deviation
        Stability guardrail: the mean loss over the last fifth of the steps may differ from fp32's by at most this
        share, and no loss may be non-finite ...
    max_skip_share
        ... and the GradScaler may skip at most this share of the steps (fp16).
    speedup_threshold
        Recommend a stable precision over the Setup's own only when its speed-up's 95% interval excludes 1 and its
        median reaches this; WARN only when the interval's low end reaches it too (else PASS with the advice). A
        median above it with an interval that includes 1 is "timings too noisy to decide" (see :func:`choose`).

    batch_size_search, max_doublings, memory_budget_mb
        Also double the batch in the recommended precision until out of memory, ``memory_budget_mb`` (on CPU the
        activation memory saved for backward) or ``max_doublings``; the curve is in ``tables['batch_size']``.
    progress
        Show a progress bar.
    """
    from tqdm.auto import tqdm

    from ..snapshot import preserved

    opts = _Options(precisions, steps, warmup, max_deviation, max_skip_share, speedup_threshold, batch_size_search,
                    max_doublings, memory_budget_mb)
    _check_options(opts)
    setup.validate()
    device = cast(torch.device, setup.device)  # Setup.__post_init__ makes it a torch.device
    order = ["fp32"] + [p for p in PRECISIONS if p in precisions and p != "fp32"]
    machine = machine_load()  # before the runs: the load other processes put on the cores
    with preserved(setup.model):
        bar = tqdm(total=1, desc=CHECK_ID, disable=not progress, leave=False)
        runs, reasons, fp32_run = _measure(setup, order, steps, warmup, setup.seed, decided=lambda live: settled(
            live, setup.precision, max(3, min(min_steps, steps)), speedup_threshold, max_deviation))
        probe = None
        if device.type == "cpu" and fp32_run is not None:  # after the losses are recorded: extra steps change nothing
            probe = thread_probe(lambda: fp32_run.step(len(fp32_run.source) - 1, timed=False))
        bar.close()
        rows, stable = _rows(order, runs, reasons, opts)
        decision = choose({p: r["times"] for p, r in runs.items()}, stable, setup.precision, speedup_threshold)
        table = _table(rows, decision)
        tables = {"precisions": table}
        if batch_size_search:
            tables["batch_size"] = batch_search(setup, decision["recommended"], setup.seed, max_doublings,
                                                memory_budget_mb)
    over = oversubscription(runs["fp32"]["times"], machine, probe, device.type)
    metrics = _metrics(table, decision, setup, opts, machine, probe, over)
    metrics["timed_steps"] = len(runs["fp32"]["times"])  # under ``steps`` when settled early
    series = {f"loss_{p}": r["losses"] for p, r in runs.items()}
    series.update({f"step_ms_{p}": r["times"] * 1e3 for p, r in runs.items()})
    summary = _summary(table, decision, setup.precision, order, reasons, opts, over)
    status, advice = _verdict(table, decision, setup, reasons, opts, over, machine)
    summary = _fp16_cpu_note(setup, summary, metrics)
    return CheckResult(CHECK_ID, status, summary, metrics, tables, advice, series)


def _fp16_cpu_note(setup: Setup, summary: str, metrics: dict[str, Any]) -> str:
    """The summary headed by the report's one clear word on fp16 autocast on a CPU, when the Setup asks for it (the
    loop checks compare in fp32 meanwhile, :mod:`tropt.core.cpu_fp16`)."""
    from ..core.cpu_fp16 import NOTE, fp16_on_cpu

    if not fp16_on_cpu(setup):
        return summary
    metrics["precision_note"] = NOTE
    return f"{NOTE}; {summary}"


@dataclass(frozen=True)
class _Options:
    """The check's keywords that shape the comparison and the verdict, bundled for the helpers below."""

    precisions: tuple[str, ...]
    steps: int
    warmup: int
    max_deviation: float
    max_skip_share: float
    speedup_threshold: float
    batch_size_search: bool
    max_doublings: int
    memory_budget_mb: float | None


def _check_options(opts: _Options) -> None:
    """Raise on an unknown precision or a step count out of range, saying what to use."""
    unknown = [p for p in opts.precisions if p not in PRECISIONS]
    if unknown:
        raise TroptError(f"unknown precision(s) {unknown}", f"choose from {', '.join(PRECISIONS)}")
    for name, value, low in (("steps", opts.steps, 3), ("warmup", opts.warmup, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise TroptError(f"{name}={value!r}; it must be an integer >= {low}", f"use e.g. {name}={max(low, 5)}")


def _rows(order: list[str], runs: dict[str, dict], reasons: dict[str, str],
          opts: _Options) -> tuple[list[dict], dict[str, bool]]:
    """One row per precision (measured, skipped or failed) and whether each measured one is stable."""
    ref = runs["fp32"]
    tail = max(1, len(ref["losses"]) // 5)  # the steps run (the comparison may have stopped when settled)
    ref_tail = float(np.nanmean(ref["losses"][-tail:]))
    stable: dict[str, bool] = {}
    rows: list[dict[str, Any]] = []
    for p in order:
        if p not in runs:
            rows.append({"precision": p, "status": "skipped" if not reasons[p].startswith("failed") else "failed",
                         "reason": reasons[p]})
            continue
        r = runs[p]
        losses = r["losses"]
        finite = np.isfinite(losses)
        non_finite = int((~finite[~np.isnan(ref["losses"])]).sum()) if losses.size else 0
        dev_tail = abs(float(np.nanmean(losses[-tail:])) - ref_tail) / max(abs(ref_tail), 1e-12)
        both = finite & np.isfinite(ref["losses"])
        dev_max = float(np.max(np.abs(losses[both] - ref["losses"][both])
                               / np.maximum(np.abs(ref["losses"][both]), 1e-12))) if both.any() else math.nan
        step = float(np.median(r["times"]))
        stable[p] = bool(non_finite == 0 and dev_tail <= opts.max_deviation
                         and r["skips"] <= opts.max_skip_share * len(losses))
        rows.append({
            "precision": p, "status": "measured", "reason": "",
            "step_ms": step * 1e3, "step_ms_min": float(np.min(r["times"])) * 1e3,
            "step_ms_max": float(np.max(r["times"])) * 1e3, "samples_per_s": r["batch_size"] / step,
            "peak_memory_mb": r["peak_mb"], "activation_mb": r["activation_mb"],
            "loss_deviation": dev_tail, "max_step_deviation": dev_max,
            "non_finite": non_finite, "scaler_skips": int(r["skips"]), "stable": stable[p],
        })
    return rows, stable


def _table(rows: list[dict], decision: dict[str, Any]) -> pd.DataFrame:
    """The precisions table, each measured row with its speed-up interval."""
    for row in rows:
        if row["status"] == "measured":
            s_, lo, hi = decision["speedups"][row["precision"]]
            row.update(speedup=s_, speedup_low=lo, speedup_high=hi)
    return pd.DataFrame(rows, columns=COLUMNS)


def _metrics(table: pd.DataFrame, decision: dict[str, Any], setup: Setup, opts: _Options, machine: dict[str, Any],
             probe: tuple | None, over: list[str]) -> dict[str, Any]:
    """The recommendation, the timing verdict and each precision's step time, deviation and speed-up."""
    metrics: dict[str, Any] = {"recommended": decision["recommended"], "setup_precision": setup.precision,
                               "device": str(setup.device), "steps": opts.steps, "max_deviation": opts.max_deviation,
                               "fastest_stable": decision["fastest"], "speedup_threshold": opts.speedup_threshold,
                               "speedup_reference": decision["reference"], "timing_verdict": decision["verdict"],
                               "oversubscribed": bool(over), **machine}
    if probe is not None:
        metrics["one_thread_speedup"] = probe[0]
    for _, row in table.iterrows():
        p = row["precision"]
        if row["status"] == "measured":
            metrics[f"{p}_step_ms"] = float(row["step_ms"])
            metrics[f"{p}_loss_deviation"] = float(row["loss_deviation"])
            metrics[f"{p}_speedup"] = float(row["speedup"])
            metrics[f"{p}_speedup_low"] = float(row["speedup_low"])
            metrics[f"{p}_speedup_high"] = float(row["speedup_high"])
        else:
            metrics[f"{p}_skipped"] = str(row["reason"])
    return metrics


def _ms(measured: pd.DataFrame, p: str) -> str:
    row = measured[measured["precision"] == p].iloc[0]
    return (f"{p} {float(row['step_ms']):.3g} ms ({float(row['step_ms_min']):.3g}-{float(row['step_ms_max']):.3g})"
            + ("" if bool(row["stable"]) else " (unstable)"))


def _up(decision: dict[str, Any], p: str) -> str:
    s_, lo, hi = decision["speedups"][p]
    return f"{s_:.2f}× faster than {decision['reference']} (95% interval {lo:.2f}-{hi:.2f}×)"


def _summary(table: pd.DataFrame, decision: dict[str, Any], current: str, order: list[str], reasons: dict[str, str],
             opts: _Options, over: list[str]) -> str:
    """The precisions compared, the timing note (too noisy, or under the threshold) and what was skipped."""
    measured = table[table["status"] == "measured"]
    recommended, verdict = decision["recommended"], decision["verdict"]
    skipped = ", ".join(f"{p} ({'not supported here' if not reasons[p].startswith('failed') else 'failed'})"
                        for p in order if p in reasons)
    compared = ", ".join(_ms(measured, p) for p in measured["precision"])
    note = ""
    if verdict == "noisy":
        c = decision["candidate"]
        note = (f"timings too noisy to decide: {c} looks {_up(decision, c)}, an interval that includes 1, so "
                f"{recommended} is kept")
    elif verdict == "marginal":
        c = decision["candidate"]
        s_ = decision["speedups"][c][0]
        note = (f"{c} is only {s_:.2f}× faster than the Setup's {current}, under the {opts.speedup_threshold:g}× "
                f"speedup threshold, so {current} is kept")
    summary = (f"recommend {recommended}: {compared}" + (f"; {note}" if note else "")
               + (f"; skipped {skipped}" if skipped else ""))
    if over:
        summary += "; timings may be inflated by oversubscription (" + "; ".join(over) + ")"
    return summary


def _verdict(table: pd.DataFrame, decision: dict[str, Any], setup: Setup, reasons: dict[str, str], opts: _Options,
             over: list[str], machine: dict[str, Any]) -> tuple[Status, list[str]]:
    """The status and the advice: about the Setup's own precision, the recommendation, and the timings."""
    measured = table[table["status"] == "measured"]
    current, recommended, verdict = setup.precision, decision["recommended"], decision["verdict"]
    cur = measured[measured["precision"] == current]
    advice: list[str] = []
    status = Status.PASS
    if cur.empty:
        status = Status.WARN
        advice.append(_not_measured_advice(current, recommended, reasons, cast(torch.device, setup.device)))
    else:
        c = cur.iloc[0]
        if verdict == "unstable":
            status = Status.WARN
            advice.append(f"{current} is outside the stability guardrail here (loss {float(c['loss_deviation']):.1%} "
                          f"from fp32, {int(c['non_finite'])} non-finite, {int(c['scaler_skips'])} scaler "
                          f"skip{'' if int(c['scaler_skips']) == 1 else 's'}): train in {recommended}.")
        elif verdict in ("clear", "likely"):
            status = Status.WARN if decision["warn"] else Status.PASS
            advice.append(f"Train in {recommended}: it is {_up(decision, recommended)} here and stays within "
                          f"{opts.max_deviation:.0%} of fp32's loss"
                          + ("." if decision["warn"] else
                             f" (a PASS: the interval's low end is under the {opts.speedup_threshold:g}× threshold)."))
        elif verdict == "noisy":
            advice.append(f"Rerun with more steps= or on a quieter machine before switching to "
                          f"{decision['candidate']}: the speed-up's interval includes 1.")
    if over:
        advice.append(oversubscription_advice(machine))
    if measured[measured["stable"].astype(bool)].empty:
        status = Status.WARN
        advice.append("No precision stayed inside the stability guardrail, not even fp32 against itself; look at "
                      "dynamics.loss_curve.")
    return status, advice


def _not_measured_advice(current: str, recommended: str, reasons: dict[str, str], device: torch.device) -> str:
    """Why the Setup's own precision has no row of measurements, and what was measured instead."""
    if current not in reasons:  # left out by the caller's ``precisions``
        return (f"The Setup's precision {current} was not among the precisions compared; {recommended} is the "
                f"fastest stable one of those measured (add {current!r} to precisions= to compare it).")
    if reasons[current].startswith("failed"):
        return f"The Setup's precision {current} could not run here ({reasons[current]}); use {recommended}."
    return (f"The Setup's precision {current} is not measured on this {device.type.upper()} "
            f"({reasons[current]}); the fastest stable precision measured here is {recommended}.")
