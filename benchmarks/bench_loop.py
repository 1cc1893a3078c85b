"""Cost of each stage-4 invariance check, as a multiple of one optimizer step of the same Setup.

Goal (issue #8): each check costs at most 3x one optimizer step plus the copies it makes (the floor is about 2x:
two runs of the same step). Everything is measured side by side in this one run; medians of repeats.

    .venv/bin/python benchmarks/bench_loop.py
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import torch
from torch import nn
from torch.nn import functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _common import LoadWatch

import tropt
from tropt.loop import (
    check_accumulation,
    check_ddp,
    check_loss_scaling,
    check_resume,
    check_scheduler_cadence,
    check_zero_grad,
)
from tropt.snapshot import preserved

REPEATS = 5
CHECKS = [check_zero_grad, check_accumulation, check_loss_scaling, check_scheduler_cadence, check_resume, check_ddp]


def ce(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def mlp_setup(**kw):
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(256, 512, generator=g), torch.randint(0, 10, (256,), generator=g)) for _ in range(4)]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
    return tropt.Setup(model, ce, lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3), batches,
                       scheduler=lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, 100), grad_clip=1.0, **kw)


def cnn_setup(**kw):
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(64, 3, 32, 32, generator=g), torch.randint(0, 10, (64,), generator=g)) for _ in range(4)]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1),
                          nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32 * 8 * 8, 10))
    return tropt.Setup(model, ce, lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9), batches,
                       scheduler=lambda o: torch.optim.lr_scheduler.StepLR(o, 10), **kw)


SPREAD: dict[str, tuple[float, float]] = {}  # the last median_time's (min, max), printed beside each row


def median_time(fn, key: str = "") -> float:
    times = []
    for _ in range(REPEATS):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    SPREAD[key] = (min(times), max(times))
    return statistics.median(times)


def baseline(setup):
    """One optimizer step on an already-built copy, and one build (the copies a check makes)."""
    with preserved(setup.model):
        ctx = setup.build()
        batch = setup.sample_batch()
        micro = tropt.split_batch(batch, setup.accumulation_steps)
        tropt.standard_step(ctx, micro)  # warm-up
        step = median_time(lambda: setup.run_step(ctx, micro))
        build = median_time(setup.build)
        # What a check's run actually costs: a fresh copy and its first step (optimizer state is allocated then).
        fresh = median_time(lambda: setup.run_step(setup.build(), micro))
    return step, build, fresh


def main() -> None:
    torch.set_num_threads(max(1, torch.get_num_threads()))
    watch = LoadWatch("bench_loop")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, medians of {REPEATS}")
    print(f"{'setup':<16}{'check':<24}{'check ms':>9}{'step ms':>9}{'copy ms':>9}{'fresh ms':>9}{'× step':>8}"
          f"{'× fresh':>9}"
          f"  check min..max ms")
    for name, make in (("MLP", mlp_setup), ("CNN", cnn_setup)):
        for precision in ("fp32", "fp16+scaler"):
            setup = make() if precision == "fp32" else make(precision="fp16", use_scaler=True)
            setup.validate()
            for check in CHECKS:
                if check is check_loss_scaling and precision == "fp32":
                    continue
                if check is not check_loss_scaling and precision != "fp32":
                    continue
                step, build, fresh = baseline(setup)
                check(setup)  # warm-up
                t = median_time(lambda: check(setup), "check")  # noqa: B023 - called in this iteration
                lo, hi = SPREAD["check"]
                print(f"{name + ' ' + precision:<16}{check.check_id:<24}{t * 1e3:>9.1f}{step * 1e3:>9.1f}"
                      f"{build * 1e3:>9.1f}"
                      f"{fresh * 1e3:>9.1f}{t / step:>8.2f}{t / fresh:>9.2f}  {lo * 1e3:.1f}..{hi * 1e3:.1f}")
    print("× step: check time / one warm optimizer step; × fresh: / (a fresh copy + its first step), what each run of "
          "a check costs. Runs per check: zero_grad 3 steps on 1 copy, accumulation 2 runs when it passes (1 and K "
          "unequal micro-batches; +1 equal split otherwise), scheduler_cadence 2 runs, resume 3 steps + a checkpoint "
          "through torch.save/load, loss_scaling 2 runs, ddp 1 run + 2 forked processes.")
    watch.done()


if __name__ == "__main__":
    main()
