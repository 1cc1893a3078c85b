"""The runs ``perf.precision`` compares: a fresh copy of the Setup training in one precision, one step at a time.

:class:`PrecisionRun` keeps its own RNG stream and copy (so precisions can interleave), times each step and counts
activation bytes saved for backward and GradScaler skips; :func:`batch_search` doubles the batch in one precision
until memory runs out, a budget or a number of doublings.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pandas as pd
import torch

if TYPE_CHECKING:
    from ..setup import Setup


@contextlib.contextmanager
def tf32(enabled: bool) -> Iterator[None]:
    """Switch TF32 matmuls/convolutions on for the block and put the global flags back afterwards."""
    old = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    try:
        torch.backends.cuda.matmul.allow_tf32 = enabled
        torch.backends.cudnn.allow_tf32 = enabled
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


class SavedBytes:
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


def cat_batches(batches: list) -> Any:
    """Concatenate batches of the same structure along dimension 0 (for a bigger batch)."""
    first = batches[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(batches) if first.ndim else first
    if isinstance(first, dict):
        return type(first)({k: cat_batches([b[k] for b in batches]) for k in first})
    if isinstance(first, (list, tuple)):
        items = [cat_batches([b[i] for b in batches]) for i in range(len(first))]
        return type(first)(*items) if hasattr(first, "_fields") else type(first)(items)
    return first


class PrecisionRun:
    """A fresh copy of the Setup training in one precision, one step at a time (so precisions can interleave).

    Each run keeps its own torch RNG stream: interleaved with other runs it draws the same dropout masks it would
    draw alone, so its losses do not depend on the order the steps ran in."""

    def __init__(self, setup: Setup, precision: str, seed: int, source: list, clock: Any = time.perf_counter) -> None:
        from ..core.stepping import StepRunner

        self.precision, self.source, self.clock = precision, source, clock
        amp = "fp32" if precision == "tf32" else precision
        self.setup = setup.replace(precision=amp, use_scaler=amp == "fp16")
        self.device = cast(torch.device, setup.device)  # Setup.__post_init__ makes it a torch.device
        self.cuda = self.device.type == "cuda"
        base = torch.cuda.memory_allocated(self.device) if self.cuda else 0
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        with self._tf32():
            self.ctx = self.setup.build(seed=seed)
        if self.ctx.scaler is None and setup.use_scaler:
            # The Setup's step is written for AMP (ctx.scaler.scale(loss).backward(), scaler.step(...)): in a precision
            # without loss scaling it gets a disabled scaler, whose scale/unscale_/step/update are pass-throughs.
            self.ctx.scaler = torch.amp.GradScaler(self.device.type, enabled=False)
        self.runner = StepRunner(self.setup, self.ctx)
        self._base_mem = base
        self._rng = self._get_rng()
        self.losses: list[float] = []
        self.times: list[float] = []
        self.skips = 0
        self.saved = SavedBytes()
        self.peak_mb = math.nan

    def _tf32(self) -> Any:
        return tf32(self.precision == "tf32") if self.cuda else contextlib.nullcontext()

    def _get_rng(self) -> tuple:
        return (torch.get_rng_state(), torch.cuda.get_rng_state(self.device) if self.cuda else None)

    def _set_rng(self, state: tuple) -> None:
        torch.set_rng_state(state[0])
        if state[1] is not None:
            torch.cuda.set_rng_state(state[1], self.device)

    def step(self, i: int, timed: bool) -> None:
        """Run step ``i`` (batch ``i`` of the shared source): its loss always, its time when ``timed``."""
        from ..core.stepping import sync

        outer = self._get_rng()
        self._set_rng(self._rng)
        try:
            micro = self.ctx.split(self.source[i], self.ctx.accumulation_steps)
            scale = self.ctx.scaler.get_scale() if self.ctx.scaler is not None else None
            with self._tf32():
                sync(self.device)
                t0 = self.clock()
                if i == 0:
                    with self.saved.hooks():
                        loss = self.runner.step(micro)
                else:
                    loss = self.runner.step(micro)
                sync(self.device)
                elapsed = self.clock() - t0
        finally:
            self._rng = self._get_rng()
            self._set_rng(outer)
        if timed:
            self.times.append(elapsed)
        if self.ctx.scaler is not None and self.ctx.scaler.get_scale() < scale:
            self.skips += 1  # the scaler found inf/NaN gradients, skipped the step and lowered the scale
        self.losses.append(math.nan if loss is None else float(loss))

    def note_peak(self) -> None:
        """Peak device memory of this run so far, over what was allocated before it was built (CUDA only)."""
        if self.cuda:
            self.peak_mb = (torch.cuda.max_memory_allocated(self.device) - self._base_mem) / 2**20

    def result(self) -> dict[str, Any]:
        return {"losses": np.asarray(self.losses), "times": np.asarray(self.times), "skips": self.skips,
                "peak_mb": self.peak_mb, "activation_mb": self.saved.total / 2**20,
                "batch_size": self.setup.size(self.source[0]), "loss_from": self.runner.source}


def run_precision(setup: Setup, precision: str, steps: int, warmup: int, seed: int,
                  batches: list | None = None) -> dict[str, Any]:
    """Train a fresh copy for ``warmup + steps`` steps in ``precision``; losses of every step, times of the timed
    ones."""
    source = batches if batches is not None else list(setup.batches(warmup + steps, seed=seed))
    run = PrecisionRun(setup, precision, seed, source)
    for i in range(len(source)):
        run.step(i, timed=i >= warmup)
    run.note_peak()
    return run.result()


def is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower()


def batch_search(setup: Setup, precision: str, seed: int, max_doublings: int, memory_budget_mb: float | None,
                  steps: int = 3) -> pd.DataFrame:
    """Double the batch (by concatenating the Setup's batches) until OOM, a memory budget or ``max_doublings``."""
    rows = []
    base = list(setup.batches(2 ** max_doublings * (steps + 1), seed=seed))
    for k in range(max_doublings + 1):
        m = 2 ** k
        batches = [cat_batches(base[j * m:(j + 1) * m]) for j in range(steps + 1)]
        try:
            r = run_precision(setup, precision, steps, 1, seed, batches)
        except Exception as exc:  # noqa: BLE001 - OOM ends the search; anything else is reported as the stop reason
            rows.append({"batch_size": setup.size(batches[0]), "step_ms": math.nan, "samples_per_s": math.nan,
                         "memory_mb": math.nan,
                         "stopped": "out of memory" if is_oom(exc) else f"{type(exc).__name__}: {exc}"})
            if cast(torch.device, setup.device).type == "cuda":  # Setup.__post_init__ makes it a torch.device
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
