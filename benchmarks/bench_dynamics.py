"""Side by side: tropt's LR range test vs torch-lr-finder vs plain training steps; the curve classifier on 1M steps.

Run in the benchmark environment (torch-lr-finder is never a tropt dependency):

    .venv-peers/bin/python benchmarks/bench_dynamics.py

Same MLP (784-512-256-10), same synthetic data (batch 128), same 100 iterations for everyone: both finders sweep
1e-7 -> 1e-1 exponentially with stopping disabled, so each runs exactly 100 steps. Tools alternate inside one
process; medians of several passes are printed with ratios to the plain loop. Prints, never asserts.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tropt from the source tree

import numpy as np
import torch
from _common import LoadWatch, spread
from torch import nn
from torch.nn import functional as F

import tropt
from tropt.dynamics import diagnose_curves
from tropt.dynamics.lr_range import check_lr_range

ITERS, BATCH, PASSES = 100, 128, 5
START, END = 1e-7, 1e-1
torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "1")))  # shared machines: 1 thread is steadier


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 10))


g = torch.Generator().manual_seed(0)
X = torch.randn(ITERS * BATCH, 784, generator=g)
Y = torch.randint(0, 10, (ITERS * BATCH,), generator=g)
LOADER = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=BATCH, shuffle=False)


def plain_steps() -> float:
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    t = time.perf_counter()
    for i, (x, y) in enumerate(LOADER):
        for grp in opt.param_groups:
            grp["lr"] = START * (END / START) ** (i / (ITERS - 1))
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        loss.item()
    return time.perf_counter() - t


def lr_finder() -> float:
    from torch_lr_finder import LRFinder

    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=START, momentum=0.9)
    t = time.perf_counter()
    finder = LRFinder(model, opt, nn.CrossEntropyLoss(), device="cpu")
    finder.range_test(LOADER, end_lr=END, num_iter=ITERS, step_mode="exp", diverge_th=1e30)
    finder.reset()
    elapsed = time.perf_counter() - t
    assert len(finder.history["lr"]) == ITERS
    return elapsed


def tropt_lr_range() -> float:
    model = make_model()
    setup = tropt.Setup(model, lambda m, b: F.cross_entropy(m(b[0]), b[1]),
                        lambda m: torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9), LOADER)
    setup.validate()
    t = time.perf_counter()
    r = check_lr_range(setup, start_lr=START, end_lr=END, num_steps=ITERS, repeats=1, stop_factor=1e30, progress=False)
    elapsed = time.perf_counter() - t
    assert r.metrics["steps_per_sweep"] == ITERS, r.metrics
    return elapsed


def main() -> None:
    import torch_lr_finder

    watch = LoadWatch("bench_dynamics")
    print(f"torch {torch.__version__}, torch-lr-finder {getattr(torch_lr_finder, '__version__', '0.2.x')}, "
          f"tropt {tropt.__version__}, threads {torch.get_num_threads()}")
    print(f"LR range test: MLP 784-512-256-10, batch {BATCH}, {ITERS} iterations, {PASSES} alternating passes")
    for fn in (plain_steps, lr_finder, tropt_lr_range):  # warm-up (imports, allocator)
        fn()
    times = {"plain steps": [], "torch-lr-finder": [], "tropt lr_range": []}
    for _ in range(PASSES):
        times["plain steps"].append(plain_steps())
        times["torch-lr-finder"].append(lr_finder())
        times["tropt lr_range"].append(tropt_lr_range())
    base = statistics.median(times["plain steps"])
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"  {name:16s} median {med:6.3f} s  (min {min(ts):.3f}, max {max(ts):.3f})  "
              f"ratio to plain steps {med / base:.2f}x")
    ratios = [a / b for a, b in zip(times["tropt lr_range"], times["torch-lr-finder"])]
    print(f"  tropt / torch-lr-finder, per alternating pass: {spread(ratios, 1, 'x', 2)}")

    print("Curve classifier: 1,000,000 logged steps")
    rng = np.random.default_rng(0)
    t_ = np.arange(1_000_000)
    y = (0.3 + 2.0 * np.exp(-t_ / 80_000)) * np.exp(rng.normal(0, 0.05, t_.size))
    runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        r = diagnose_curves(y)
        runs.append(time.perf_counter() - t0)
    print(f"  diagnose_curves {spread(runs, 1, ' s')}, class: {r.metrics['class']}")
    watch.done()


if __name__ == "__main__":
    main()
