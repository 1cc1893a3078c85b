"""The cost of the checks other than the big three (issue 32), in step-equivalents of the user's own step.

    nice .venv/bin/python benchmarks/bench_other_cost.py [--layers 6] [--budgets standard,quick] [--repeats 1]
                                                         [--checks ID,ID,...] [--precision fp32] [--json PATH]

On the issue's GPT-2 (``benchmarks/bench_cost.py``'s ``gpt2_setup``: n_embd 384, 6 heads, vocab 5000, block 128,
batch 8, AdamW; ``--layers 2`` for a quicker one), runs ``tropt.diagnose`` on every check but
``model.overfit_batch``, ``dynamics.loss_curve``, ``dynamics.lr_range`` and ``loop.scheduler_cadence`` (other
work cuts those), at each budget, with one torch thread. Each check's seconds (``callback`` to ``on_result``)
divided by one step of the Setup's own, timed on the bench's own copy right before and right after that check
(their mean), are its cost in step-equivalents: steady when the load drifts during a run. The load average is printed
with every check.

Goal: these checks together at most ~100 step-equivalents at the default budget and ~30 at ``budget="quick"``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402
from torch import nn  # noqa: E402

import tropt  # noqa: E402
from benchmarks._common import load  # noqa: E402

OTHERS = ["model.init_loss", "model.eval_metric", "model.gradient_flow", "model.activation_stats",
          "loop.zero_grad", "loop.accumulation", "loop.loss_scaling", "loop.resume", "loop.ddp", "loop.train_mode",
          "perf.throughput", "perf.precision", "perf.memory"]


def gpt2_setup(layers: int, precision: str = "fp32") -> tropt.Setup:
    """The issue's GPT-2 with ``layers`` blocks (6 is the reference)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=5000, n_positions=128, n_embd=384, n_layer=layers, n_head=6, bos_token_id=0,
                     eos_token_id=0)
    g = torch.Generator().manual_seed(0)
    data = [torch.randint(0, 5000, (8, 128), generator=g) for _ in range(6)]

    def loss(m: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        return m(input_ids=ids, labels=ids).loss

    return tropt.Setup(GPT2LMHeadModel(cfg), loss, lambda m: torch.optim.AdamW(m.parameters(), lr=3e-4),
                       train_data=data[:4], val_data=data[4:], precision=precision)


class _LocalStep:
    """One step of the Setup's own step, timed on a copy of the bench's own right before and right after each check:
    the check's seconds over the mean of the two is its cost in step-equivalents, steady when the machine's load
    drifts during a run (a unit timed once at the start is not: a load rising from 2 to 15 inflated every check 5x)."""

    def __init__(self, setup: tropt.Setup) -> None:
        self.setup, self.ctx = setup, setup.build(seed=1)
        self.batch = next(iter(setup.batches(1)))
        self.time()  # warm-up

    def time(self) -> float:
        t0 = time.perf_counter()
        self.setup.run_step(self.ctx, self.setup.split(self.batch, self.setup.accumulation_steps))
        return time.perf_counter() - t0


def one_run(layers: int, budget: str, checks: list[str], precision: str) -> dict[str, Any]:
    setup = gpt2_setup(layers, precision)
    load0 = load()
    torch.set_num_threads(1)
    local = _LocalStep(setup)
    seconds: dict[str, float] = {}
    steps: dict[str, float] = {}
    last = [time.perf_counter()]
    before = [local.time()]

    def callback(info: Any) -> None:  # before each check (not the per-step calls some checks make): the step now
        if "index" not in info:
            return
        before[0] = local.time()
        last[0] = time.perf_counter()

    def on_result(r: Any) -> None:
        seconds[r.check] = time.perf_counter() - last[0]
        unit = (before[0] + local.time()) / 2
        steps[r.check] = seconds[r.check] / unit
        print(f"  .. {r.check:24s} {seconds[r.check]:7.1f} s {steps[r.check]:6.1f} steps (step {unit:.2f} s)  "
              f"{r.status.value}  (load {load():.1f})", flush=True)

    t0 = time.perf_counter()
    report = tropt.diagnose(setup, checks=checks, budget=budget, progress=False, threads=1, on_result=on_result,
                            callback=callback)
    total = time.perf_counter() - t0
    step = report.identity.get("step_seconds") or float("nan")
    return {"layers": layers, "budget": budget, "precision": precision, "step_s": step, "total_s": total,
            "per_check_steps": steps, "per_check_seconds": seconds,
            "cost_steps": {r.check: r.metrics.get("cost_steps") for r in report.results},
            "statuses": {r.check: r.status.value for r in report.results},
            "load_start": load0, "load_end": load()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--budgets", default="standard,quick")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--checks", default=",".join(OTHERS))
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    runs = []
    for budget in args.budgets.split(","):
        for rep in range(args.repeats):
            r = one_run(args.layers, budget, args.checks.split(","), args.precision)
            runs.append(r)
            total = sum(r["per_check_steps"].values())
            print(f"gpt2-{args.layers} {budget:8s} run {rep + 1}: {total:6.1f} step-equivalents ({r['total_s']:.1f} s;"
                  f" step {r['step_s']:.3f} s; load {r['load_start']:.2f} -> {r['load_end']:.2f})", flush=True)
            for c, v in r["per_check_steps"].items():
                print(f"    {c:24s} {v:6.1f}  {r['statuses'].get(c, '')}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(runs, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
