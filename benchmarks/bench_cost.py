"""The cost of a diagnosis in optimizer step-equivalents of the user's own step (issue 32).

    .venv/bin/python benchmarks/bench_cost.py [--models mlp,cnn,gpt2] [--budgets standard,quick] [--repeats 3]
                                              [--json PATH]

For each model, the user's step is timed first (median of 5 steps after 2 warm-up steps, on tropt's own copy of
the Setup, one torch thread), then a full diagnosis (every check but the data checks, which need no model) runs at
each budget; each check's seconds (from ``on_result``) divided by the step's seconds is its cost in
step-equivalents. A ratio to the step taken in the same process, right before, is steadier under load than seconds,
but both are printed, with the load average at the start and end of every run.

Models (what a new user would try, random init):

- ``mlp``: a 2-layer 64-wide MLP on 16 features, batches of 64 (AdamW);
- ``cnn``: two conv + BatchNorm blocks on 3x32x32 images, batches of 64 (SGD with momentum);
- ``gpt2``: a 6-layer GPT-2 (``GPT2Config``: n_embd 384, 6 heads, vocab 5000, block 128), batches of 8 (AdamW),
  the issue's reference model (needs transformers).

Goal (issue 32): a default diagnosis of the 6-layer GPT-2 at most 300 step-equivalents, ``budget="quick"`` at most
60.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402
from torch import nn  # noqa: E402

import tropt  # noqa: E402
from benchmarks._common import load  # noqa: E402

CHECKS = ["model", "loop", "dynamics", "perf"]


def _ce(model: nn.Module, batch: Any) -> torch.Tensor:
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)


def mlp_setup() -> tropt.Setup:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    w = torch.randn(16, 4, generator=g)
    data = []
    for _ in range(8):
        x = torch.randn(64, 16, generator=g)
        data.append((x, (x @ w).argmax(1)))
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    return tropt.Setup(model, _ce, lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2), train_data=data[:6],
                       val_data=data[6:], num_classes=4)


def cnn_setup() -> tropt.Setup:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    data = [(torch.randn(64, 3, 32, 32, generator=g), torch.randint(0, 10, (64,), generator=g)) for _ in range(6)]
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(32, 10))
    return tropt.Setup(model, _ce, lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9),
                       train_data=data[:4], val_data=data[4:], num_classes=10)


def gpt2_setup() -> tropt.Setup:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=5000, n_positions=128, n_embd=384, n_layer=6, n_head=6, bos_token_id=0,
                     eos_token_id=0)
    g = torch.Generator().manual_seed(0)
    data = [torch.randint(0, 5000, (8, 128), generator=g) for _ in range(6)]

    def loss(m: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        return m(input_ids=ids, labels=ids).loss

    return tropt.Setup(GPT2LMHeadModel(cfg), loss, lambda m: torch.optim.AdamW(m.parameters(), lr=3e-4),
                       train_data=data[:4], val_data=data[4:])


MODELS = {"mlp": mlp_setup, "cnn": cnn_setup, "gpt2": gpt2_setup}


def step_seconds(setup: tropt.Setup, warmup: int = 2, steps: int = 5) -> float:
    """The median time of one optimizer step of the Setup's own step, on a copy."""
    ctx = setup.build()
    batch = next(iter(setup.batches(1)))
    times = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        setup.run_step(ctx, setup.split(batch, setup.accumulation_steps))
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def one_run(name: str, budget: str) -> dict:
    setup = MODELS[name]()
    load0 = load()
    step = step_seconds(setup)
    seconds: dict[str, float] = {}
    last = [time.perf_counter()]

    def on_result(r: Any) -> None:
        now = time.perf_counter()
        seconds[r.check] = now - last[0]
        last[0] = now

    t0 = time.perf_counter()
    report = tropt.diagnose(setup, checks=CHECKS, budget=budget, progress=False, threads=1, on_result=on_result)
    total = time.perf_counter() - t0
    return {"model": name, "budget": budget, "step_s": step, "total_s": total, "total_steps": total / step,
            "per_check_steps": {c: s / step for c, s in seconds.items()},
            "statuses": {r.check: r.status.value for r in report.results}, "load_start": load0, "load_end": load()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="mlp,cnn,gpt2")
    ap.add_argument("--budgets", default="standard,quick")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    runs = []
    for name in args.models.split(","):
        for budget in args.budgets.split(","):
            for rep in range(args.repeats):
                r = one_run(name, budget)
                runs.append(r)
                top = sorted(r["per_check_steps"].items(), key=lambda kv: -kv[1])[:4]
                print(f"{name:5s} {budget:8s} run {rep + 1}: {r['total_steps']:7.0f} step-equivalents "
                      f"({r['total_s']:.1f} s; step {1e3 * r['step_s']:.1f} ms; load {r['load_start']:.2f} -> "
                      f"{r['load_end']:.2f}); most: " + ", ".join(f"{c} {v:.0f}" for c, v in top), flush=True)
    print("\nper check, median step-equivalents over the repeats:")
    for name in args.models.split(","):
        for budget in args.budgets.split(","):
            rs = [r for r in runs if r["model"] == name and r["budget"] == budget]
            if not rs:
                continue
            checks = list(rs[0]["per_check_steps"])
            cells = ", ".join(f"{c} {statistics.median(r['per_check_steps'].get(c, 0) for r in rs):.0f}"
                              for c in checks)
            print(f"{name} {budget}: total {statistics.median(r['total_steps'] for r in rs):.0f}: {cells}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(runs, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
