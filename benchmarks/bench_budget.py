"""Time to the first answer: ``tropt.diagnose`` at budget "quick" against "standard" (and "thorough"), and the
thread choice under load, side by side in one run. Prints times and ratios; asserts nothing.

    .venv/bin/python benchmarks/bench_budget.py
"""

from __future__ import annotations

import os
import sys
import time

import torch
from torch import nn
from torch.nn import functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import tropt
from tropt.budgets import available_cores, busy_cores


def make_setup() -> tropt.Setup:
    torch.manual_seed(0)
    x = torch.randn(4096, 64)
    y = (x[:, :8].sum(1) > 0).long()
    batches = [(x[i:i + 128], y[i:i + 128]) for i in range(0, 4096, 128)]
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 2))
    return tropt.Setup(model, lambda m, b: F.cross_entropy(m(b[0]), b[1]),
                       lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3),
                       batches, val_data=batches[:4], num_classes=2)


def main() -> None:
    checks = ["model", "dynamics", "perf"]  # the checks the budget changes
    print(f"cores {available_cores()}, load {busy_cores()}, torch threads {torch.get_num_threads()}")
    tropt.diagnose(make_setup(), checks=checks, budget="quick", progress=False)  # warm-up: imports, first-call costs
    times = {}
    for budget in ("quick", "standard", "thorough"):
        start = time.perf_counter()
        report = tropt.diagnose(make_setup(), checks=checks, budget=budget, progress=False)
        times[budget] = time.perf_counter() - start
        bad = [(r.check, r.status.value) for r in report if r.status.value in ("fail", "error")]
        print(f"{budget:<9} {times[budget]:6.1f} s  threads {report.identity['threads']}  fail/error: {bad or 'none'}")
    print(f"quick / standard = {times['quick'] / times['standard']:.2f}; "
          f"thorough / standard = {times['thorough'] / times['standard']:.2f}")
    for threads in (1, torch.get_num_threads()):
        start = time.perf_counter()
        tropt.diagnose(make_setup(), checks=["model.overfit_batch"], budget="standard", progress=False, threads=threads)
        print(f"model.overfit_batch with {threads} thread(s): {time.perf_counter() - start:.2f} s")


if __name__ == "__main__":
    main()
