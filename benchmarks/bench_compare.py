"""Cost of ``tropt.compare``: its sequential overhead against the same runs as a plain loop, and a Dask
``LocalCluster`` of 2 single-threaded worker processes against sequential.

Goals (issue #18): sequential overhead <= 5%; Dask >= 1.6x faster than sequential on a 2-core machine, with
identical results. Measured side by side in this one run: repeats interleaved (plain, compare, plain, ...) so load
from other processes hits both alike; medians, with the spread (min..max) and the load average before and after.

    .venv/bin/python benchmarks/bench_compare.py [--repeats 5] [--steps 200] [--no-dask]
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time

import torch
from torch import nn
from torch.nn import functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import tropt

SEEDS = (0, 1, 2)
LRS = {"baseline": 0.05, "lr_x2": 0.1}  # 2 candidates x 3 seeds = 6 runs


def ce(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def make_setup() -> tropt.Setup:
    """A small MLP on a 10-class problem: 4096 training samples drawn in batches of 128, 512 validation samples."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096 + 512, 64, generator=g)
    y = (x @ torch.randn(64, 10, generator=g)).argmax(1)
    train = torch.utils.data.TensorDataset(x[:4096], y[:4096])
    val = [(x[4096 + i:4096 + i + 256], y[4096 + i:4096 + i + 256]) for i in (0, 256)]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    return tropt.Setup(model, ce, lambda m: torch.optim.SGD(m.parameters(), lr=LRS["baseline"], momentum=0.9),
                       train, val, num_classes=10, batch_size=128)


def plain_loop(setup: tropt.Setup, steps: int, eval_every: int, same_step: bool = True) -> list[float]:
    """The same 6 runs by hand: copy, seeded shuffled order, the step, val loss + accuracy every ``eval_every``.

    ``same_step``: each step calls the Setup's own step (here ``tropt.standard_step``) on a hand-built context, so
    the difference to compare is compare's harness. Otherwise a minimal zero_grad/backward/step loop (which also
    leaves out standard_step's own bookkeeping: sample-weighted loss, clip/scaler/scheduler branches).
    """
    finals = []
    for lr in LRS.values():
        for seed in SEEDS:
            torch.manual_seed(seed)
            model = copy.deepcopy(setup.model)
            opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
            ctx = tropt.StepContext(model, opt, None, None, ce, None, 1, torch.device("cpu"))
            loader = torch.utils.data.DataLoader(setup.train_data, batch_size=128, shuffle=True)
            torch.manual_seed(seed)
            done = 0
            while done < steps:
                for xb, yb in loader:
                    if same_step:
                        tropt.standard_step(ctx, [(xb, yb)])
                    else:
                        loss = F.cross_entropy(model(xb), yb)
                        loss.backward()
                        opt.step()
                        opt.zero_grad(set_to_none=True)
                    done += 1
                    if done % eval_every == 0:
                        model.eval()
                        with torch.no_grad():
                            tot = correct = 0.0
                            for vx, vy in setup.val_data:
                                out = model(vx)
                                tot += float(F.cross_entropy(out, vy)) * len(vy)
                                correct += float((out.argmax(1) == vy).sum())
                        model.train()
                        finals.append(tot / 512)
                    if done >= steps:
                        break
    return finals


def run_compare(setup: tropt.Setup, steps: int, eval_every: int, executor=None) -> tropt.Comparison:
    return tropt.compare(setup, {"lr_x2": {"lr": LRS["lr_x2"]}}, budget=tropt.Budget(steps=steps), seeds=SEEDS,
                         eval_every=eval_every, executor=executor, progress=False)


def _burn(steps: int = 600) -> float:
    """A fixed pure-torch workload (the same MLP step), for calibrating how much parallelism the machine gives now."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    x, y = torch.randn(128, 64), torch.randint(0, 10, (128,))
    for _ in range(steps):
        F.cross_entropy(m(x), y).backward()
        opt.step()
        opt.zero_grad()
    return 0.0


def machine_parallelism() -> float:
    """Speedup of 2 plain processes over 1 on the same 2 pieces of work: the ceiling any executor can reach now."""
    import concurrent.futures as cf
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    with cf.ProcessPoolExecutor(1, mp_context=ctx) as one, cf.ProcessPoolExecutor(2, mp_context=ctx) as two:
        one.submit(_burn, 5).result()
        list(two.map(_burn, [5, 5]))
        t1, _ = timed(lambda: list(one.map(_burn, [600, 600])))
        t2, _ = timed(lambda: list(two.map(_burn, [600, 600])))
    return t1 / t2


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def spread(ts: list[float]) -> str:
    return f"median {statistics.median(ts):.3f} s (min {min(ts):.3f}, max {max(ts):.3f}, n={len(ts)})"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--no-dask", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)  # the same as one single-threaded Dask worker, so results and per-run cost compare
    steps, every = args.steps, max(1, args.steps // 10)
    setup = make_setup()
    load0 = os.getloadavg()
    print(f"tropt.compare benchmark: 2 candidates x {len(SEEDS)} seeds x {steps} steps, MLP 64-256-256-10, batch 128, "
          f"eval every {every} steps; torch threads 1; cpus {os.cpu_count()}")
    print(f"load average before: {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}")
    run_compare(setup, 5, 5)  # warm-up: imports, allocator
    plain_loop(setup, 5, 5)

    plain_t, comp_t, bare_t = [], [], []
    plain_c, comp_c, bare_c = [], [], []
    for _ in range(args.repeats):
        for fn, wall, cpu in ((lambda: plain_loop(setup, steps, every), plain_t, plain_c),
                              (lambda: run_compare(setup, steps, every), comp_t, comp_c),
                              (lambda: plain_loop(setup, steps, every, same_step=False), bare_t, bare_c)):
            c = time.process_time()
            t, _ = timed(fn)
            wall.append(t)
            cpu.append(time.process_time() - c)
    med = statistics.median
    print(f"plain loop, same step (6 runs): {spread(plain_t)}; CPU {spread(plain_c)}")
    print(f"tropt.compare sequential:       {spread(comp_t)}; CPU {spread(comp_c)}")
    print(f"minimal hand-written loop:      {spread(bare_t)}; CPU {spread(bare_c)}")
    print("sequential overhead vs the plain loop calling the same step: "
          f"wall {100 * (med(comp_t) / med(plain_t) - 1):+.1f}%, "
          f"CPU {100 * (med(comp_c) / med(plain_c) - 1):+.1f}%  (goal <= 5%)")
    pairs = sorted(c / p for c, p in zip(comp_t, plain_t))  # each compare against the plain loop timed just before it
    print(f"  per-repeat ratios (compare / the plain loop just before it): "
          f"{', '.join(f'{100 * (r - 1):+.1f}%' for r in pairs)}; median {100 * (statistics.median(pairs) - 1):+.1f}%")
    print(f"vs the minimal loop (also counts standard_step's own bookkeeping): wall "
          f"{100 * (med(comp_t) / med(bare_t) - 1):+.1f}%, CPU {100 * (med(comp_c) / med(bare_c) - 1):+.1f}%")

    if not args.no_dask:
        from tropt.experiments import dask_executor

        t_start = time.perf_counter()
        with dask_executor(n_workers=2) as ex:
            started = time.perf_counter() - t_start
            run_compare(setup, 5, 5, ex)  # warm-up: workers import torch and tropt once
            dask_t, seq_t = [], []
            same = True
            for _ in range(args.repeats):
                t, seq = timed(lambda: run_compare(setup, steps, every))
                seq_t.append(t)
                t, par = timed(lambda: run_compare(setup, steps, every, ex))
                dask_t.append(t)
                cols = ["candidate", "seed", "status", "steps", "samples", "final", "best", "final_val_accuracy"]
                same = same and seq.runs[cols].equals(par.runs[cols]) and all(
                    seq.curves(r.candidate, r.seed) == par.curves(r.candidate, r.seed) for r in seq.runs.itertuples())
        speedup = statistics.median(seq_t) / statistics.median(dask_t)
        wall_s, cpu_s = seq.runs[["seconds", "cpu_seconds"]].sum(), par.runs[["seconds", "cpu_seconds"]].sum()
        ceiling = machine_parallelism()
        print(f"dask LocalCluster: 2 worker processes x 1 thread, started in {started:.1f} s (not counted)")
        print(f"sequential:                {spread(seq_t)}")
        print(f"dask (2 workers):          {spread(dask_t)}")
        print(f"dask speedup: {speedup:.2f}x  (goal >= 1.6x); identical results: {same}")
        print(f"inside the runs (last repeat, 6 runs summed): sequential {wall_s['seconds']:.2f} s wall / "
              f"{wall_s['cpu_seconds']:.2f} s CPU; dask {cpu_s['seconds']:.2f} s wall / "
              f"{cpu_s['cpu_seconds']:.2f} s CPU "
              "(wall well above CPU = the run waited for a core)")
        print(f"calibration: 2 plain processes vs 1 on the same work: {ceiling:.2f}x (the parallelism the machine "
              "gave just now; dask's ratio cannot exceed it)")
    load1 = os.getloadavg()
    print(f"load average after:  {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}  "
          "(a load above the core count means other processes took CPU time from these measurements)")


if __name__ == "__main__":
    main()
