"""GradientMonitor overhead, side by side in one run.

Plain training steps vs the same steps with ``tropt.GradientMonitor`` recording at every step, vs a naive loop that
computes the same per-parameter statistics with ``.norm().item()`` (one host sync per number), on a 4-layer
1024-wide MLP with batch 256 on CPU. The variants alternate within each repeat so machine noise hits them alike;
each variant's time per step is the median over repeats; the time spent inside the monitor's hooks is also measured
within the monitored steps (robust to noise from other processes). Goal: monitor overhead <= 5% of step time at
every step. One intra-op thread by default, so other processes on a shared machine do not oversubscribe the cores.

    .venv/bin/python benchmarks/bench_gradflow.py [--repeats 15] [--steps 20] [--threads N]
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


VARIANTS = {
    "plain": ("plain steps", None),
    "monitor": ("GradientMonitor(every=1)  [full_every=10]", {}),
    "monitor_updates_each": ("GradientMonitor(every=1, full_every=1)", {"full_every": 1}),
    "monitor_no_updates": ("GradientMonitor(every=1, track_updates=False)", {"track_updates": False}),
    "naive_item": ("naive per-parameter .norm().item()", None),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--steps", type=int, default=20,
                    help="timed steps per variant per repeat, after one untimed step; a multiple of 10 holds the "
                         "share of fully measured steps (full_every=10) a long run has")
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

    times: dict[str, list[float]] = {k: [] for k in VARIANTS}
    monitor_bytes: dict[str, int] = {}
    log: list = []
    in_hooks = {k: [0.0, 0] for k in VARIANTS if k.startswith("monitor")}  # seconds inside the hooks, timed steps

    def timed(fn, acc):
        def wrapper(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                acc[0] += time.perf_counter() - t0
        return wrapper

    def run(variant: str, n: int) -> None:
        for _ in range(n):
            if variant == "naive_item":
                naive_step(model, opt, x, y, log)
            else:
                step(model, opt, x, y)

    for r in range(args.repeats):
        order = list(times)
        order = order[r % len(order):] + order[: r % len(order)]  # rotate who goes first
        for variant in order:
            kwargs = VARIANTS[variant][1]
            if kwargs is None:
                run(variant, 1)  # the same untimed first step the monitored variants take
                start = time.perf_counter()
                run(variant, args.steps)
            else:
                # Steady state: the first monitored step allocates the record and the parameter copy; a user's loop
                # pays that once, so it is left out of the per-step time (the memory is reported below).
                mon = tropt.GradientMonitor(model, capacity=args.steps + 1, **kwargs)
                local = [0.0]
                mon._pre_hook, mon._post_hook = timed(mon._pre_hook, local), timed(mon._post_hook, local)
                with mon:
                    run(variant, 1)
                    local[0] = 0.0
                    start = time.perf_counter()
                    run(variant, args.steps)
                    elapsed = time.perf_counter() - start
                    in_hooks[variant][0] += local[0]
                    in_hooks[variant][1] += args.steps
                    monitor_bytes[variant] = mon.memory_bytes
                mon.array()  # the one host sync, when results are read
                times[variant].append(elapsed / args.steps)
                continue
            times[variant].append((time.perf_counter() - start) / args.steps)

    med = {k: statistics.median(v) for k, v in times.items()}
    base = med["plain"]
    print(f"bench_gradflow: 4-layer 1024-wide MLP ({n_params / 1e6:.2f}M params), batch {args.batch}, AdamW, CPU, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads; median of {args.repeats} alternating repeats "
          f"x {args.steps} steps (steady state)")
    for k, (label, _) in VARIANTS.items():
        print(f"  {label:<48} {med[k] * 1e3:8.2f} ms/step   x{med[k] / base:.3f} of plain   "
              f"overhead {100 * (med[k] / base - 1):+6.1f}%")
    print("  time inside the monitor's hooks (noise-robust view of the same cost), share of the plain step:")
    for k, (secs, n) in in_hooks.items():
        ms = 1e3 * secs / max(n, 1)
        print(f"    {VARIANTS[k][0]:<46} {ms:6.2f} ms/step = {100 * ms / (base * 1e3):4.1f}%   "
              f"memory {monitor_bytes.get(k, 0) / 2**20:5.1f} MiB")
    print(f"  (parameters themselves: {n_params * 4 / 2**20:.1f} MiB; the memory is the record plus, with update "
          "norms, one copy of the parameters)")
    ok_e2e = med["monitor"] / base <= 1.05
    ok_hook = in_hooks["monitor"][0] / max(in_hooks["monitor"][1], 1) <= 0.05 * base
    print(f"  goal: GradientMonitor(every=1) overhead <= 5% at every step -> end to end {'met' if ok_e2e else 'NOT met'}, "
          f"in-hook share {'met' if ok_hook else 'NOT met'}")


if __name__ == "__main__":
    main()
