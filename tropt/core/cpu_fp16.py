"""fp16 autocast on a CPU: say once that it cannot be fast, and run the loop checks' comparisons in fp32 (issue 32).

A CPU has no fp16 matrix units: under ``torch.autocast("cpu", dtype=torch.float16)`` every matmul converts and runs
in slow kernels, about 30x slower than fp32 on the machines tropt was measured on. A Setup that asks for it is the
user's setting, and the precision-specific checks (``perf.precision``, ``loop.loss_scaling``) keep it; but the loop
checks' invariance comparisons (the same step under changes that must not change the update: accumulation,
zero_grad, resume, DDP, train mode, scheduler cadence) do not depend on the precision for their verdict, so
:func:`diagnose` hands them the Setup in fp32 and each result says so (:func:`mark_result`).
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any

import torch

# Checks whose verdict is about the precision itself: they keep the Setup's fp16.
PRECISION_SPECIFIC = frozenset({"loop.loss_scaling", "perf.precision"})

NOTE = ("fp16 autocast on a CPU cannot be fast: a CPU has no fp16 matrix units, so each step runs about 30x slower "
        "than in fp32; train in fp32 (or bf16) on a CPU and keep fp16 with a GradScaler for a CUDA GPU")


def fp16_on_cpu(setup: Any) -> bool:
    """Whether ``setup`` asks for fp16 autocast on a CPU device."""
    device = getattr(setup, "device", None)
    return getattr(setup, "precision", None) == "fp16" and device is not None and torch.device(device).type == "cpu"


def runs_in_fp32(check: str, setup: Any) -> bool:
    """Whether ``check`` runs its comparisons in fp32 instead of the Setup's fp16 on a CPU (the loop checks but
    :data:`PRECISION_SPECIFIC` ones)."""
    return check.startswith("loop.") and check not in PRECISION_SPECIFIC and fp16_on_cpu(setup)


_FP32: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def fp32_setup(setup: Any) -> Any:
    """The same Setup with ``precision="fp32"`` (the scaler setting is kept: the user's step may call it), made once
    per Setup, so the loop checks of one diagnosis share it and its validation; the Setup itself when that fails
    (the checks then report what is wrong with it)."""
    got = _FP32.get(setup)
    if got is None:
        try:
            got = setup.replace(precision="fp32")
        except Exception:  # noqa: BLE001 - the original Setup's own checks name the problem
            return setup
        _FP32[setup] = got
    return got


def mark_result(result: Any) -> Any:
    """``result`` with a note that its comparisons ran in fp32, and why (``metrics["ran_in_precision"]``)."""
    metrics = dict(result.metrics)
    metrics.update(ran_in_precision="fp32", setup_precision="fp16")
    summary = (f"{result.summary} (compared in fp32, not the Setup's fp16: fp16 autocast on a CPU is about 30x "
               "slower and does not change this verdict)")
    return dataclasses.replace(result, summary=summary, metrics=metrics)
