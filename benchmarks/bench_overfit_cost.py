"""The cost of ``model.overfit_batch`` alone, in optimizer step-equivalents of the user's own step (issue 32).

    .venv/bin/python benchmarks/bench_overfit_cost.py [--layers 6] [--budgets standard,quick] [--repeats 1]

On the issue's GPT-2 (``benchmarks/bench_cost.py``'s setup: n_embd 384, 6 heads, vocab 5000, block 128, batches of
8, AdamW; ``--layers`` changes the depth for quicker iteration), the user's step is timed first (median of 5 after 2
warm-up steps, one torch thread), then ``tropt.diagnose(setup, checks=["model.overfit_batch"], budget=...)`` runs.
Its seconds divided by the step's seconds is its cost, in CPU time of this process (steady on a shared, loaded
machine) and in wall time (what a user waits). Prints the verdict, how many steps each run took and why it stopped,
and the load average at start and end. Goal (issue 32): at most 70 step-equivalents at the default budget, at most
12 at ``budget="quick"``, on the 6-layer model.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402
from torch import nn  # noqa: E402

import tropt  # noqa: E402
from benchmarks._common import load  # noqa: E402

SHOWN = ("steps_run", "stopped", "baseline_steps_run", "baseline_stopped", "samples", "max_steps", "start_loss",
         "final_loss", "final_accuracy", "baseline_final_loss")


def gpt2_setup(layers: int = 6) -> tropt.Setup:
    """bench_cost.gpt2_setup with ``layers`` blocks (6 is the issue's model)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=5000, n_positions=128, n_embd=384, n_layer=layers, n_head=6, bos_token_id=0,
                     eos_token_id=0)
    g = torch.Generator().manual_seed(0)
    data = [torch.randint(0, 5000, (8, 128), generator=g) for _ in range(6)]

    def loss(m: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        return m(input_ids=ids, labels=ids).loss

    return tropt.Setup(GPT2LMHeadModel(cfg), loss, lambda m: torch.optim.AdamW(m.parameters(), lr=3e-4),
                       train_data=data[:4], val_data=data[4:])


def step_times(setup: tropt.Setup, warmup: int = 2, steps: int = 5) -> tuple[float, float]:
    """Median (wall, CPU) seconds of one step of the Setup's own step, on a copy. CPU time (this process, one torch
    thread) is what a step costs whatever else competes for the cores; wall time is what a user waits."""
    ctx = setup.build()
    batch = next(iter(setup.batches(1)))
    wall, cpu = [], []
    for i in range(warmup + steps):
        t0, c0 = time.perf_counter(), time.process_time()
        setup.run_step(ctx, setup.split(batch, setup.accumulation_steps))
        if i >= warmup:
            wall.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    return statistics.median(wall), statistics.median(cpu)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--budgets", default="standard,quick")
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    for budget in args.budgets.split(","):
        for rep in range(args.repeats):
            setup = gpt2_setup(args.layers)
            load0 = load()
            step, step_cpu = step_times(setup)
            t0, c0 = time.perf_counter(), time.process_time()
            report = tropt.diagnose(setup, checks=["model.overfit_batch"], budget=budget, progress=False, threads=1)
            total, total_cpu = time.perf_counter() - t0, time.process_time() - c0
            r = report["model.overfit_batch"]
            shown = ", ".join(f"{k}={r.metrics[k]:.4g}" if isinstance(r.metrics[k], float) else f"{k}={r.metrics[k]}"
                              for k in SHOWN if k in r.metrics)
            print(f"gpt2 {args.layers}-layer {budget:8s} run {rep + 1}: {total_cpu / step_cpu:6.1f} step-equivalents "
                  f"of CPU time ({total_cpu:.1f} s; step {step_cpu:.3f} s), {total / step:6.1f} of wall time "
                  f"({total:.1f} s; step {step:.3f} s); load {load0:.2f} -> {load():.2f}; {r.status.value}: "
                  f"{r.summary}\n    {shown}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
