"""GradientMonitor overhead, side by side in one run.

Plain training steps vs the same steps with ``tropt.GradientMonitor`` recording at every step, vs a naive loop that
computes the same per-parameter statistics with ``.norm().item()`` (one host sync per number), on a 4-layer
1024-wide MLP with batch 256 on CPU. The variants alternate within each repeat so machine noise hits them alike;
each variant's time per step is the median over repeats; the time spent inside the monitor's hooks is also measured
within the monitored steps (robust to noise from other processes). Goal: monitor overhead <= 5% of step time at
every step. One intra-op thread by default, so other processes on a shared machine do not oversubscribe the cores.

    .venv/bin/python benchmarks/bench_gradflow.py [--repeats 15] [--steps 4] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn
from torch.nn import functional as F

import tropt


def make(width: int = 1024, depth: int = 4, seed: int = 0):
    torch.manual_seed(seed)
    layers = []
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.ReLU()]
    layers.append(nn.Linear(width, 10))
    model = nn.Sequential(*layers)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def step(model, opt, x, y):
    F.cross_entropy(model(x), y).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def naive_step(model, opt, x, y, log):
    F.cross_entropy(model(x), y).backward()
    params = list(model.parameters())
    before = [p.detach().clone() for p in params]
    stats = [(p.grad.norm().item(), p.norm().item()) for p in params]
    opt.step()
    updates = [(p.detach() - b).norm().item() for p, b in zip(params, before)]
    log.append((stats, updates))
    opt.zero_grad(set_to_none=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--steps", type=int, default=4, help="steps per variant per repeat")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads (default 1: steady on a shared machine; 0 keeps torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    model, opt = make()
    x = torch.randn(args.batch, 1024)
    y = torch.randint(0, 10, (args.batch,))
    n_params = sum(p.numel() for p in model.parameters())
    for _ in range(3):  # warm up allocator and kernels
        step(model, opt, x, y)

    times: dict[str, list[float]] = {"plain": [], "monitor": [], "monitor_no_updates": [], "naive_item": []}
    monitor_bytes = 0
    log: list = []
    in_hooks = [0.0, 0]  # seconds spent inside the monitor's hooks, monitored steps

    def timed(fn):
        def wrapper(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                in_hooks[0] += time.perf_counter() - t0
        return wrapper
    for r in range(args.repeats):
        order = list(times)
        order = order[r % len(order):] + order[: r % len(order)]  # rotate who goes first
        for variant in order:
            start = time.perf_counter()
            if variant == "plain":
                for _ in range(args.steps):
                    step(model, opt, x, y)
            elif variant.startswith("monitor"):
                mon = tropt.GradientMonitor(model, track_updates=variant == "monitor", capacity=args.steps)
                if variant == "monitor":  # also time the hooks themselves: a noise-robust view of the same cost
                    mon._pre_hook, mon._post_hook = timed(mon._pre_hook), timed(mon._post_hook)
                    in_hooks[1] += args.steps
                with mon:
                    for _ in range(args.steps):
                        step(model, opt, x, y)
                    if variant == "monitor":
                        monitor_bytes = mon.memory_bytes
                mon.array()  # the one host sync, when results are read
            else:
                for _ in range(args.steps):
                    naive_step(model, opt, x, y, log)
            times[variant].append((time.perf_counter() - start) / args.steps)

    med = {k: statistics.median(v) for k, v in times.items()}
    base = med["plain"]
    print(f"bench_gradflow: 4-layer 1024-wide MLP ({n_params / 1e6:.2f}M params), batch {args.batch}, AdamW, CPU, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads; median of {args.repeats} alternating repeats "
          f"x {args.steps} steps")
    labels = {
        "plain": "plain steps",
        "monitor": "GradientMonitor(every=1)",
        "monitor_no_updates": "GradientMonitor(every=1, track_updates=False)",
        "naive_item": "naive per-parameter .norm().item()",
    }
    for k, label in labels.items():
        print(f"  {label:<40} {med[k] * 1e3:8.2f} ms/step   x{med[k] / base:.3f} of plain   "
              f"overhead {100 * (med[k] / base - 1):+6.1f}%")
    hook_ms = 1e3 * in_hooks[0] / max(in_hooks[1], 1)
    print(f"  time inside GradientMonitor's hooks: {hook_ms:.2f} ms/step = {100 * hook_ms / (base * 1e3):.1f}% of the "
          "plain step (measured within the monitored steps; robust to machine noise)")
    print(f"  monitor memory: {monitor_bytes / 2**20:.1f} MiB (parameter copy for update norms + record; "
          f"parameters themselves {n_params * 4 / 2**20:.1f} MiB)")
    print(f"  goal: monitor overhead <= 5% at every step -> end to end {'met' if med['monitor'] / base <= 1.05 else 'NOT met'}, "
          f"in-hook share {'met' if hook_ms / (base * 1e3) <= 0.05 else 'NOT met'}")


if __name__ == "__main__":
    main()
