"""``perf.precision``: which precision is fast *and* stable on this device for this Setup.

Each precision the device supports runs the same seeded steps from the same copy of the model as fp32; we
compare step time, memory and stability (loss-trajectory deviation from fp32, non-finite losses, GradScaler
skipped steps) and recommend the fastest one inside the stability guardrail. Unsupported precisions are SKIP
with the hardware reason. An optional batch-size search doubles the batch until memory runs out or a budget is
reached, and keeps the throughput curve.
"""

from __future__ import annotations

import contextlib
import math
import time
from typing import Any, Iterator

import numpy as np
import pandas as pd
import torch

from ..errors import TroptError
from ..registry import register
from ..result import CheckResult, Status

CHECK_ID = "perf.precision"
PRECISIONS = ("fp32", "bf16", "fp16", "tf32")


def support(precision: str, device: torch.device) -> tuple[bool, str]:
    """Whether ``device`` supports ``precision`` for training, and why not."""
    kind = device.type
    if precision == "fp32":
        return True, ""
    if precision == "bf16":
        if kind == "cuda":
            ok = torch.cuda.is_bf16_supported()
            return ok, "" if ok else f"{torch.cuda.get_device_name(device)} has no bfloat16 support (needs compute capability >= 8.0)"
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


@contextlib.contextmanager
def _tf32(enabled: bool) -> Iterator[None]:
    """Switch TF32 matmuls/convolutions on for the block and put the global flags back afterwards."""
    old = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    try:
        torch.backends.cuda.matmul.allow_tf32 = enabled
        torch.backends.cudnn.allow_tf32 = enabled
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


class _SavedBytes:
    """Counts the bytes autograd saves for backward (activation memory) while active."""

    def __init__(self) -> None:
        self.total = 0
        self._seen: set[int] = set()

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        try:
            key = t.untyped_storage().data_ptr()
            if key not in self._seen:
                self._seen.add(key)
                self.total += t.untyped_storage().nbytes()
        except Exception:  # noqa: BLE001 - tensors without storage (e.g. some subclasses)
            self.total += t.numel() * t.element_size()
        return t

    @staticmethod
    def unpack(t: torch.Tensor) -> torch.Tensor:
        return t

    def hooks(self) -> Any:
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)


def _cat(batches: list) -> Any:
    """Concatenate batches of the same structure along dimension 0 (for a bigger batch)."""
    first = batches[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(batches) if first.ndim else first
    if isinstance(first, dict):
        return type(first)({k: _cat([b[k] for b in batches]) for k in first})
    if isinstance(first, (list, tuple)):
        items = [_cat([b[i] for b in batches]) for i in range(len(first))]
        return type(first)(*items) if hasattr(first, "_fields") else type(first)(items)
    return first


def _run(setup: Any, precision: str, steps: int, warmup: int, seed: int, batches: list | None = None) -> dict[str, Any]:
    """Train a fresh copy for ``warmup + steps`` steps in ``precision``; losses of every step, times of the timed ones."""
    from ..dynamics._run import StepRunner, sync

    amp = "fp32" if precision == "tf32" else precision
    run_setup = setup.replace(precision=amp, use_scaler=amp == "fp16")
    device = setup.device
    cuda = device.type == "cuda"
    with _tf32(precision == "tf32") if cuda else contextlib.nullcontext():
        ctx = run_setup.build(seed=seed)
        if ctx.scaler is None and setup.use_scaler:
            # The Setup's step is written for AMP (ctx.scaler.scale(loss).backward(), scaler.step(...)): in a precision
            # without loss scaling it gets a disabled scaler, whose scale/unscale_/step/update are pass-throughs.
            ctx.scaler = torch.amp.GradScaler(device.type, enabled=False)
        runner = StepRunner(run_setup, ctx)
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        source = batches if batches is not None else list(setup.batches(warmup + steps, seed=seed))
        losses, times, skips, saved = [], [], 0, _SavedBytes()
        for i, batch in enumerate(source):
            micro = ctx.split(batch, ctx.accumulation_steps)
            scale = ctx.scaler.get_scale() if ctx.scaler is not None else None
            sync(device)
            t0 = time.perf_counter()
            if i == 0:
                with saved.hooks():
                    loss = runner.step(micro)
            else:
                loss = runner.step(micro)
            sync(device)
            if i >= warmup:
                times.append(time.perf_counter() - t0)
            if ctx.scaler is not None and ctx.scaler.get_scale() < scale:
                skips += 1  # the scaler found inf/NaN gradients, skipped the step and lowered the scale
            losses.append(math.nan if loss is None else float(loss))
        peak = torch.cuda.max_memory_allocated(device) / 2**20 if cuda else math.nan
        n = setup.size(source[0])
    return {"losses": np.asarray(losses), "times": np.asarray(times), "skips": skips, "peak_mb": peak,
            "activation_mb": saved.total / 2**20, "batch_size": n, "loss_from": runner.source}


def _is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower()


def _batch_search(setup: Any, precision: str, seed: int, max_doublings: int, memory_budget_mb: float | None,
                  steps: int = 3) -> pd.DataFrame:
    """Double the batch (by concatenating the Setup's batches) until OOM, a memory budget or ``max_doublings``."""
    rows = []
    base = list(setup.batches(2 ** max_doublings * (steps + 1), seed=seed))
    for k in range(max_doublings + 1):
        m = 2 ** k
        batches = [_cat(base[j * m:(j + 1) * m]) for j in range(steps + 1)]
        try:
            r = _run(setup, precision, steps, 1, seed, batches)
        except Exception as exc:  # noqa: BLE001 - OOM ends the search; anything else is reported as the stop reason
            rows.append({"batch_size": setup.size(batches[0]), "step_ms": math.nan, "samples_per_s": math.nan,
                         "memory_mb": math.nan, "stopped": "out of memory" if _is_oom(exc) else f"{type(exc).__name__}: {exc}"})
            if setup.device.type == "cuda":
                torch.cuda.empty_cache()
            break
        step = float(np.median(r["times"]))
        mem = r["peak_mb"] if math.isfinite(r["peak_mb"]) else r["activation_mb"]
        rows.append({"batch_size": r["batch_size"], "step_ms": step * 1e3, "samples_per_s": r["batch_size"] / step,
                     "memory_mb": mem, "stopped": ""})
        if memory_budget_mb is not None and mem > memory_budget_mb:
            rows[-1]["stopped"] = f"memory {mem:.0f} MiB over the budget of {memory_budget_mb:.0f} MiB"
            break
    return pd.DataFrame(rows, columns=["batch_size", "step_ms", "samples_per_s", "memory_mb", "stopped"])


@register(CHECK_ID, title="Precision: speed, memory and stability",
          description="Run the same steps in fp32, bf16 (and fp16/TF32 on CUDA); recommend the fastest inside a stability guardrail.")
def check_precision(
    setup: Any,
    *,
    precisions: tuple[str, ...] = PRECISIONS,
    steps: int = 20,
    warmup: int = 3,
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
        Timed steps after ``warmup`` untimed ones; the loss of every step is compared with fp32's.
    max_deviation
        Stability guardrail: the mean loss over the last fifth of the steps may differ from fp32's by at most this
        share, and no loss may be non-finite ...
    max_skip_share
        ... and the GradScaler may skip at most this share of the steps (fp16).
    speedup_threshold
        WARN when a stable precision is at least this many times faster than the Setup's own; below it the
        Setup's own (stable) precision stays the recommendation (a smaller difference is within timing noise).
    batch_size_search, max_doublings, memory_budget_mb
        Also double the batch in the recommended precision until out of memory, ``memory_budget_mb`` (on CPU the
        activation memory saved for backward) or ``max_doublings``; the curve is in ``tables['batch_size']``.
    progress
        Show a progress bar.
    """
    from tqdm.auto import tqdm

    from ..snapshot import preserved

    unknown = [p for p in precisions if p not in PRECISIONS]
    if unknown:
        raise TroptError(f"unknown precision(s) {unknown}", f"choose from {', '.join(PRECISIONS)}")
    for name, value, low in (("steps", steps, 3), ("warmup", warmup, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise TroptError(f"{name}={value!r}; it must be an integer >= {low}", f"use e.g. {name}={max(low, 5)}")
    setup.validate()
    device = setup.device
    order = ["fp32"] + [p for p in PRECISIONS if p in precisions and p != "fp32"]
    runs: dict[str, dict] = {}
    reasons: dict[str, str] = {}
    with preserved(setup.model):
        bar = tqdm(order, desc=CHECK_ID, disable=not progress, leave=False)
        for p in bar:
            ok, why = support(p, device)
            if not ok:
                reasons[p] = why
                continue
            try:
                runs[p] = _run(setup, p, steps, warmup, setup.seed)
            except Exception as exc:  # noqa: BLE001 - one precision failing is a finding, not a crash
                if p == "fp32":
                    raise
                reasons[p] = f"failed: {type(exc).__name__}: {exc}"
        bar.close()
        ref = runs["fp32"]
        tail = max(1, (warmup + steps) // 5)
        ref_tail = float(np.nanmean(ref["losses"][-tail:]))
        rows = []
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
            dev_max = float(np.max(np.abs(losses[both] - ref["losses"][both]) / np.maximum(np.abs(ref["losses"][both]), 1e-12))) if both.any() else math.nan
            step = float(np.median(r["times"]))
            stable = non_finite == 0 and dev_tail <= max_deviation and r["skips"] <= max_skip_share * len(losses)
            rows.append({
                "precision": p, "status": "measured", "reason": "",
                "step_ms": step * 1e3, "samples_per_s": r["batch_size"] / step,
                "speedup_vs_fp32": float(np.median(ref["times"])) / step,
                "peak_memory_mb": r["peak_mb"], "activation_mb": r["activation_mb"],
                "loss_deviation": dev_tail, "max_step_deviation": dev_max,
                "non_finite": non_finite, "scaler_skips": int(r["skips"]), "stable": bool(stable),
            })
        table = pd.DataFrame(rows, columns=["precision", "status", "reason", "step_ms", "samples_per_s", "speedup_vs_fp32",
                                            "peak_memory_mb", "activation_mb", "loss_deviation", "max_step_deviation",
                                            "non_finite", "scaler_skips", "stable"])
        measured = table[table["status"] == "measured"]
        stable_rows = measured[measured["stable"].astype(bool)]
        best = stable_rows.sort_values("step_ms").iloc[0] if not stable_rows.empty else measured.iloc[0]
        fastest = str(best["precision"])
        current = setup.precision
        cur = measured[measured["precision"] == current]
        kept = ""  # why the Setup's own precision is kept over a marginally faster one
        if (fastest != current and not cur.empty and bool(cur.iloc[0]["stable"])
                and float(cur.iloc[0]["step_ms"]) / float(best["step_ms"]) < speedup_threshold):
            ratio = float(cur.iloc[0]["step_ms"]) / float(best["step_ms"])
            kept = (f"{fastest} is only {ratio:.2f}× faster than the Setup's {current}, under the "
                    f"{speedup_threshold:g}× speedup threshold (within timing noise), so {current} is kept")
            best = cur.iloc[0]
        recommended = str(best["precision"])
        tables = {"precisions": table}
        if batch_size_search:
            tables["batch_size"] = _batch_search(setup, recommended, setup.seed, max_doublings, memory_budget_mb)

    metrics: dict[str, Any] = {"recommended": recommended, "setup_precision": current, "device": str(device),
                               "steps": steps, "max_deviation": max_deviation, "fastest_stable": fastest,
                               "speedup_threshold": speedup_threshold}
    for _, row in table.iterrows():
        p = row["precision"]
        if row["status"] == "measured":
            metrics[f"{p}_step_ms"] = float(row["step_ms"])
            metrics[f"{p}_loss_deviation"] = float(row["loss_deviation"])
        else:
            metrics[f"{p}_skipped"] = str(row["reason"])
    series = {f"loss_{p}": r["losses"] for p, r in runs.items()}
    series.update({f"step_ms_{p}": r["times"] * 1e3 for p, r in runs.items()})
    skipped = ", ".join(f"{p} ({'not supported here' if not reasons[p].startswith('failed') else 'failed'})" for p in order if p in reasons)
    compared = ", ".join(f"{p} {float(measured.loc[measured['precision'] == p, 'step_ms'].iloc[0]):.3g} ms"
                         + ("" if bool(measured.loc[measured['precision'] == p, 'stable'].iloc[0]) else " (unstable)")
                         for p in measured["precision"])
    summary = (f"recommend {recommended}: {compared}" + (f"; {kept}" if kept else "")
               + (f"; skipped {skipped}" if skipped else ""))
    advice: list[str] = []
    status = Status.PASS
    if cur.empty:
        status = Status.WARN
        if current not in reasons:  # left out by the caller's ``precisions``
            advice.append(f"The Setup's precision {current} was not among the precisions compared; {recommended} is the "
                          f"fastest stable one of those measured (add {current!r} to precisions= to compare it).")
        elif reasons[current].startswith("failed"):
            advice.append(f"The Setup's precision {current} could not run here ({reasons[current]}); use {recommended}.")
        else:
            advice.append(f"The Setup's precision {current} is not measured on this {device.type.upper()} "
                          f"({reasons[current]}); the fastest stable precision measured here is {recommended}.")
    else:
        c = cur.iloc[0]
        if not bool(c["stable"]):
            status = Status.WARN
            advice.append(f"{current} is outside the stability guardrail here (loss {float(c['loss_deviation']):.1%} from fp32, "
                          f"{int(c['non_finite'])} non-finite, {int(c['scaler_skips'])} scaler skip{'' if int(c['scaler_skips']) == 1 else 's'}): "
                          f"train in {recommended}.")
        elif recommended != current and float(c["step_ms"]) / float(best["step_ms"]) >= speedup_threshold:
            status = Status.WARN
            advice.append(f"Train in {recommended}: it is {float(c['step_ms']) / float(best['step_ms']):.2f}× faster than "
                          f"{current} here and stays within {max_deviation:.0%} of fp32's loss.")
    if stable_rows.empty:
        status = Status.WARN
        advice.append("No precision stayed inside the stability guardrail, not even fp32 against itself; look at dynamics.loss_curve.")
    return CheckResult(CHECK_ID, status, summary, metrics, tables, advice, series)
