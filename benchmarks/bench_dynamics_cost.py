"""The cost of ``dynamics.loss_curve``, ``dynamics.lr_range`` and ``loop.scheduler_cadence`` on the issue's GPT-2
(issue 32), in optimizer step-equivalents of the user's own step.

    .venv/bin/python benchmarks/bench_dynamics_cost.py [--layers 6] [--budgets standard,quick] [--repeats 1]
                                                       [--checks dynamics.loss_curve,dynamics.lr_range,...]

The Setup is :func:`benchmarks.bench_cost.gpt2_setup` (n_embd 384, 6 heads, vocab 5000, block 128, batch 8,
AdamW) with ``n_layer`` set by ``--layers`` (2 to iterate, 6 for the issue's figures). Each check's seconds (from
``on_result``) over the median seconds of one step of the Setup's own step (timed in the same process right
before) is its cost; the steps each check ran and why it stopped come from its metrics. Prints the load average at
the start and end of every run; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

import tropt  # noqa: E402
from benchmarks import bench_cost  # noqa: E402
from benchmarks._common import load  # noqa: E402

CHECKS = "dynamics.loss_curve,dynamics.lr_range,loop.scheduler_cadence"
EVIDENCE = ("steps_run", "stopped", "steps_per_sweep", "sweeps", "stop_reason", "optimizer_steps", "class",
            "classes", "suggested_low", "suggested_high", "shared_steps")


def gpt2_setup(layers: int) -> tropt.Setup:
    """The issue's GPT-2 Setup with ``layers`` transformer blocks."""
    from transformers import GPT2Config

    real = GPT2Config.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        kwargs["n_layer"] = layers
        real(self, *args, **kwargs)

    GPT2Config.__init__ = init  # type: ignore[method-assign]
    try:
        return bench_cost.gpt2_setup()
    finally:
        GPT2Config.__init__ = real  # type: ignore[method-assign]


def one_run(layers: int, budget: str, checks: list[str]) -> None:
    setup = gpt2_setup(layers)
    load0 = load()
    step = bench_cost.step_seconds(setup)
    seconds: dict[str, float] = {}
    last = [time.perf_counter()]

    def on_result(r: Any) -> None:
        now = time.perf_counter()
        seconds[r.check] = now - last[0]
        last[0] = now

    t0 = time.perf_counter()
    report = tropt.diagnose(setup, checks=checks, budget=budget, progress=False, threads=1, on_result=on_result)
    total = time.perf_counter() - t0
    print(f"gpt2 n_layer={layers} budget={budget}: step {step:.3f} s; total {total:.1f} s = {total / step:.0f} "
          f"step-equivalents; load {load0:.2f} -> {load():.2f}", flush=True)
    for r in report.results:
        ev = {k: r.metrics[k] for k in EVIDENCE if k in r.metrics}
        print(f"  {r.check:24s} {r.status.value:5s} {seconds.get(r.check, 0):7.1f} s = "
              f"{seconds.get(r.check, 0) / step:6.1f} steps  {r.summary[:110]}\n      {ev}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--budgets", default="standard,quick")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--checks", default=CHECKS)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    for budget in args.budgets.split(","):
        for _ in range(args.repeats):
            one_run(args.layers, budget, args.checks.split(","))
    return 0


if __name__ == "__main__":
    sys.exit(main())
