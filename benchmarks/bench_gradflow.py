"""GradientMonitor overhead, side by side in one run, at 1 and 2 threads, with AdamW and SGD-momentum.

Plain training steps vs the same steps with ``tropt.GradientMonitor`` recording at every step, vs a naive loop that
computes the same per-parameter statistics with ``.norm().item()`` (one host sync per number), on a 4-layer
1024-wide MLP with batch 256 on CPU. Two identical copies train side by side, their steps alternating one by one
(copy A plain, copy B under the variant), so load from other processes lands on both sides of each pair; each
overhead is the median over repeats of B's time over A's, with its min and max, and a plain-vs-plain control row
shows the measurement's own noise. The time spent inside the monitor's hooks is also measured. Goal: monitor
overhead <= 5% of step time at every step, in the hooks and end to end, with update norms. Each configuration also
prints the passes the monitor makes over gradient- and parameter-sized memory per recorded step
(``GradientMonitor.passes``).
The load average is printed before and after; a result taken at load > 1.5 is marked.

    .venv/bin/python benchmarks/bench_gradflow.py [--repeats 9] [--steps 20] [--threads 1,2] [--optimizers adamw,sgd]
    (quick look on a loaded machine: --repeats 5 --steps 10)
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tropt from the source tree

import torch
from _common import LoadWatch, spread
from torch import nn
from torch.nn import functional as F

import tropt

OPTIMIZERS = {
    "adamw": ("AdamW", lambda params: torch.optim.AdamW(params, lr=1e-4)),
    "sgd": ("SGD(momentum=0.9)", lambda params: torch.optim.SGD(params, lr=1e-3, momentum=0.9)),
}


def make(optimizer: str = "adamw", width: int = 1024, depth: int = 4, seed: int = 0):
    torch.manual_seed(seed)
    layers = []
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.ReLU()]
    layers.append(nn.Linear(width, 10))
    model = nn.Sequential(*layers)
    return model, OPTIMIZERS[optimizer][1](model.parameters())


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
    "control": ("plain steps (control: plain vs plain)", None),
    "monitor": ("GradientMonitor(model)  [full_every=10]", {}),
    "monitor_updates_each": ("GradientMonitor(model, full_every=1)", {"full_every": 1}),
    "monitor_no_updates": ("GradientMonitor(model, track_updates=False)", {"track_updates": False}),
    "naive_item": ("naive per-parameter .norm().item()", None),
}


def bench(optimizer: str, threads: int, repeats: int, steps: int, batch: int) -> dict:
    """One configuration, measured on paired steps.

    Two identical copies of the model train side by side: copy A always plainly, copy B under the variant. Their
    steps alternate one by one (A B B A A B ...), so a burst of load from other processes lands on both sides of a
    pair; a variant's overhead in one repeat is B's time over A's. The control variant runs B plainly too: its
    overhead is the measurement's own noise floor. Variants rotate within each repeat."""
    torch.set_num_threads(threads)
    model_a, opt_a = make(optimizer)
    model_b, opt_b = make(optimizer)
    x = torch.randn(batch, 1024)
    y = torch.randint(0, 10, (batch,))
    for _ in range(3):  # warm up allocator and kernels
        step(model_a, opt_a, x, y)
        step(model_b, opt_b, x, y)
    ratios: dict[str, list[float]] = {k: [] for k in VARIANTS}
    plain: list[float] = []
    hooks: dict[str, list[float]] = {k: [] for k in VARIANTS if k.startswith("monitor")}
    passes: dict[str, dict] = {}
    memory: dict[str, int] = {}
    log: list = []

    def timed(fn, acc):
        def wrapper(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                acc[0] += time.perf_counter() - t0
        return wrapper

    def run_b(variant: str) -> None:
        if variant == "naive_item":
            naive_step(model_b, opt_b, x, y, log)
        else:
            step(model_b, opt_b, x, y)

    for r in range(repeats):
        order = list(VARIANTS)
        order = order[r % len(order):] + order[: r % len(order)]  # rotate who goes first
        for variant in order:
            kwargs = VARIANTS[variant][1]
            local = [0.0]
            mon = None
            if kwargs is not None:
                # optimizer=opt_b: B's steps only (A, the reference, carries no hooks at all)
                mon = tropt.GradientMonitor(model_b, optimizer=opt_b, capacity=steps + 2, **kwargs)
                mon._pre_hook, mon._post_hook = timed(mon._pre_hook, local), timed(mon._post_hook, local)
            with mon if mon is not None else contextlib.nullcontext():
                # Steady state: the first monitored step allocates the record (and a parameter copy where the update
                # needs one); a user's loop pays that once, so it is left out of the per-step time.
                step(model_a, opt_a, x, y)
                run_b(variant)
                local[0] = 0.0
                ta = tb = 0.0
                for k in range(steps):
                    for side in (("a", "b") if k % 2 == 0 else ("b", "a")):
                        t0 = time.perf_counter()
                        if side == "a":
                            step(model_a, opt_a, x, y)
                            ta += time.perf_counter() - t0
                        else:
                            run_b(variant)
                            tb += time.perf_counter() - t0
                if mon is not None:
                    memory[variant] = mon.memory_bytes
            if mon is not None:
                mon.array()  # the one host sync, when results are read
                hooks[variant].append(local[0] / ta)
                passes[variant] = mon.passes_per_step()
            ratios[variant].append(tb / ta)
            plain.append(ta / steps)
    return {"ratios": ratios, "plain": plain, "hooks": hooks, "passes": passes, "memory": memory,
            "params": sum(p.numel() for p in model_a.parameters())}


def report(optimizer: str, threads: int, res: dict, repeats: int, steps: int, batch: int) -> list[bool]:
    ratios, hooks = res["ratios"], res["hooks"]
    print(f"\n## {OPTIMIZERS[optimizer][0]}, {threads} thread(s): 4-layer 1024-wide MLP "
          f"({res['params'] / 1e6:.2f}M params), "
          f"batch {batch}, CPU; {repeats} repeats x {steps} paired steps per variant (steady state)")
    print(f"  plain step (copy A): {spread(res['plain'], 1e3, ' ms', 2)}")
    print(f"  {'variant':<44} {'end-to-end overhead: median (min, max) over repeats':<58} "
          f"{'in hooks, % of plain':<32} passes/step (grads, params)  memory")
    goals = []
    for k, (label, _) in VARIANTS.items():
        over = [100 * (q - 1) for q in ratios[k]]
        line = f"  {label:<44} {spread(over, 1, '%', 1):<58}"
        if k in hooks:
            share = [100 * h for h in hooks[k]]
            p = res["passes"][k]
            line += f" {spread(share, 1, '%', 1):<32} {p['gradients']:.2f}, {p['parameters']:.2f}" \
                    f"{'':<17}{res['memory'][k] / 2**20:5.1f} MiB"
            if k == "monitor":
                goals = [statistics.median(over) <= 5.0, statistics.median(share) <= 5.0]
        print(line)
    print(f"  goal (GradientMonitor(model) <= 5% with update norms): end to end {'met' if goals[0] else 'NOT met'}, "
          f"in the hooks {'met' if goals[1] else 'NOT met'} (the control row is the measurement's own noise)")
    return goals


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--steps", type=int, default=20,
                    help="timed step pairs per variant per repeat, after one untimed pair; a multiple of 10 holds the "
                         "share of fully measured steps (full_every=10) a long run has")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--threads", default="1,2", help="comma list of torch intra-op thread counts")
    ap.add_argument("--optimizers", default="adamw,sgd", help="comma list of: " + ", ".join(OPTIMIZERS))
    args = ap.parse_args()
    watch = LoadWatch("bench_gradflow")
    print(f"torch {torch.__version__}; passes = reads or writes of every watched gradient / parameter-sized tensor "
          "once, per recorded step (full_every=10 rows add the parameter norm, the zero count and the update)")
    verdicts = []
    for optimizer in args.optimizers.split(","):
        for threads in (int(t) for t in args.threads.split(",")):
            res = bench(optimizer, threads, args.repeats, args.steps, args.batch)
            verdicts.append(all(report(optimizer, threads, res, args.repeats, args.steps, args.batch)))
    watch.done()
    print(f"overall: goal {'met' if all(verdicts) else 'NOT met'} in {sum(verdicts)} of {len(verdicts)} configurations "
          f"{watch.mark()}".rstrip())


if __name__ == "__main__":
    main()
