"""Compute saved by pruning losers by rank (``compare(prune=...)``, Optuna's pruners) against the full grid.

Issue #30: with a per-run patience rule the winner stopped early while the losers ran the whole budget; successive
halving would have used about a third of the compute. One comparison, a learning-rate grid on a digits MLP
(scikit-learn's 1,797 8x8 images; 1,437 train / 360 val; 64-64-10 MLP, SGD, batch 64, one thread), run three ways:

* the fixed budget (compare's default, the Playbook's: every run to the end);
* ``prune="halving"`` (SuccessiveHalvingPruner, min_resource = eval_every, reduction factor 3);
* ``prune="hyperband"`` (HyperbandPruner, min_resource = eval_every, max_resource = the steps).

Printed: steps run against the full grid, the wall time, and the verdicts (the same winner, or not).

    .venv/bin/python benchmarks/bench_pruning.py [--steps 300] [--seeds 3]
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from torch import nn
from torch.nn import functional as F

import tropt

LRS = (0.003, 0.01, 0.03, 0.3, 1.0, 3.0)  # the baseline is lr=0.1


def digits_setup() -> tropt.Setup:
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    g = torch.Generator().manual_seed(0)
    order = torch.randperm(len(x), generator=g)
    x = torch.tensor(x, dtype=torch.float32)[order] / 16.0
    y = torch.tensor(y)[order]
    cut = int(0.8 * len(x))
    train = torch.utils.data.TensorDataset(x[:cut], y[:cut])
    val = [(x[cut:], y[cut:])]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))

    def loss(m, batch):
        xb, yb = batch
        return F.cross_entropy(m(xb), yb)

    return tropt.Setup(model, loss, lambda m: torch.optim.SGD(m.parameters(), lr=0.1), train, val, batch_size=64,
                       num_classes=10)


def one(setup: tropt.Setup, prune: str | None, steps: int, seeds: int) -> dict:
    t0 = time.perf_counter()
    comp = tropt.compare(setup, {f"lr_{lr:g}": {"lr": lr} for lr in LRS}, budget=tropt.Budget(steps=steps),
                         seeds=range(seeds), reinit=True, eval_every=steps // 10, confirm=0, threads=1,
                         progress=False, prune=prune)
    wall = time.perf_counter() - t0
    ran = int(comp.runs["steps"].sum())
    full = (len(LRS) + 1) * seeds * steps
    d = comp.decision().set_index("candidate")
    return {"prune": prune or "none (fixed budget)", "steps": ran, "full": full, "wall": wall,
            "adopted": [n for n, v in d["verdict"].items() if v == "adopt"],
            "pruned": sorted((comp.meta.get("pruning") or {}).get("pruned", {}))}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    setup = digits_setup()
    print(f"load average {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} cores; torch {torch.__version__}")
    print(f"{len(LRS)} candidates + baseline, {args.seeds} seeds, {args.steps} steps, eval every {args.steps // 10}")
    print("| pruning | steps run / full grid | saved | wall s | adopted | pruned |")
    print("|---|---|---|---|---|---|")
    for prune in (None, "halving", "hyperband"):
        r = one(setup, prune, args.steps, args.seeds)
        print(f"| {r['prune']} | {r['steps']} / {r['full']} | {100 * (1 - r['steps'] / r['full']):.0f}% | "
              f"{r['wall']:.1f} | {', '.join(r['adopted']) or 'none'} | {', '.join(r['pruned']) or 'none'} |")


if __name__ == "__main__":
    main()
