"""Cost of the four contract checks of issue #20, counted and timed against the units their docstrings state.

Counts (exact, from instrumented objects): dataset items read from the training / validation split, calls of the
user's step, forward passes of the model and evaluations of the metric. Times: medians of repeats, as a multiple of
one pass over the validation loader and of one call of the user's step, all measured side by side in this run.

    .venv/bin/python benchmarks/bench_contract_checks.py
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import tropt
from tropt.data import check_eval_transforms, check_sampling
from tropt.loop import check_train_mode
from tropt.model import check_eval_metric
from tropt.snapshot import preserved

REPEATS = 5
N_TRAIN, N_VAL, BATCH, D, C = 8192, 2048, 64, 256, 10


class Counted(Dataset):
    """Images-as-vectors with a per-item transform (a normalisation), counting every item read."""

    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x, self.y = 3 + 2 * torch.randn(n, D, generator=g), torch.randint(0, C, (n,), generator=g)
        self.reads = 0

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        self.reads += 1
        return (self.x[i] - 3) / 2, self.y[i]


def accuracy(model: nn.Module, loader) -> float:
    hits = total = 0
    for x, y in loader:
        hits += int((model(x).argmax(1) == y).sum())
        total += len(y)
    return hits / total


def make():
    train, val = Counted(N_TRAIN, 0), Counted(N_VAL, 1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(D, 512), nn.BatchNorm1d(512), nn.ReLU(), nn.Dropout(0.1), nn.Linear(512, C))
    calls = {"step": 0, "metric": 0, "forward": 0}

    def step(ctx, mbs):
        calls["step"] += 1
        return tropt.standard_step(ctx, mbs)

    def metric(m, loader):
        calls["metric"] += 1
        return accuracy(m, loader)

    setup = tropt.Setup(model, lambda m, b: F.cross_entropy(m(b[0]), b[1]),
                        lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3),
                        DataLoader(train, batch_size=BATCH, shuffle=True), val_data=DataLoader(val, batch_size=256),
                        step=step, metric=tropt.Metric(metric), num_classes=C)
    return setup, train, val, calls


def timed(fn, repeats: int = REPEATS) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    torch.set_num_threads(1)
    setup, train, val, calls = make()
    setup.validate()
    ctx = setup.build()
    with preserved(setup.model):
        val_pass = timed(lambda: [b for b in setup.val_data])
        ctx.model.eval()
        with torch.no_grad():
            metric_eval = timed(lambda: setup.metric(ctx.model, setup.val_data))
        ctx.model.train()
        batch = next(iter(setup.train_data))
        one_step = timed(lambda: setup.step(ctx, [batch]))
    print(f"units: one validation pass {1e3 * val_pass:.1f} ms ({N_VAL} items, no model), one metric evaluation "
          f"{1e3 * metric_eval:.1f} ms, one user step {1e3 * one_step:.2f} ms (batch {BATCH}); "
          f"training split {N_TRAIN} items")
    print(f"{'check':22s} {'status':6s} {'train items':>11s} {'val items':>9s} {'steps':>5s} {'metric':>6s} "
          f"{'median ms':>9s} {'x val pass':>10s} {'x metric':>8s} {'x step':>7s}")
    for check in (check_sampling, check_eval_transforms, check_eval_metric, check_train_mode):
        train.reads = val.reads = 0
        for k in calls:
            calls[k] = 0
        result = check(setup)
        counts = (train.reads, val.reads, calls["step"], calls["metric"])
        t = timed(lambda: check(setup))  # noqa: B023 - timed() calls it in this iteration
        print(f"{check.check_id:22s} {result.status.value:6s} {counts[0]:11d} {counts[1]:9d} {counts[2]:5d} "
              f"{counts[3]:6d} "
              f"{1e3 * t:9.1f} {t / val_pass:10.2f} {t / metric_eval:8.2f} {t / one_step:7.1f}")


if __name__ == "__main__":
    main()
