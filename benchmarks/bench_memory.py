"""perf.memory: its accounting against the measured peak, and its cost in optimizer steps.

Three setups built from plain torch modules (no downloads): a 4×1024 MLP, a small CNN with BatchNorm, and a tiny
GPT-2-like transformer (token + position embeddings, 4 pre-norm blocks of causal self-attention and a 4× MLP, a
tied LM head), all with AdamW. For each:

- ``peak@B``: the check's measured peak at the Setup's batch B vs an independent ground truth: a plain
  ``torch.profiler(profile_memory=True)`` run of the same steps (on CUDA ``torch.cuda.max_memory_allocated``),
  the bytes allocated since the copy was built, peak of the third step;
- ``estimate@2B``: the check's estimated peak at twice the batch (its line, fitted from B and B/2) vs the ground
  truth measured at 2B: the number that decides "the largest batch that fits";
- ``parts``: how much of the peak the named parts explain (parameters + gradients + optimizer state + activations
  alive at the peak instant); the rest is the measured remainder (temporaries);
- ``naive``: for context, the sum-of-parts estimate memory calculators make (P + G + S + all activations);
- ``steps``: optimizer steps the check ran (goal <= 15).

Goal: peak@B and estimate@2B within 10% for each. Prints the machine's load average (timing does not matter here:
allocation counts are exact bytes and do not depend on load).

    .venv/bin/python benchmarks/bench_memory.py [--device cpu|cuda] [--threads N]
"""

from __future__ import annotations

import argparse
import math
import os

import torch
from torch import nn
from torch.nn import functional as F

import tropt
from tropt.batching import split_batch
from tropt.perf import check_memory

MIB = 2**20


# ------------------------------------------------------------------------------------------------ the setups
def mlp(batch: int) -> tropt.Setup:
    torch.manual_seed(0)
    layers = []
    for _ in range(3):
        layers += [nn.Linear(1024, 1024), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(1024, 10))
    g = torch.Generator().manual_seed(0)
    data = [(torch.randn(batch, 1024, generator=g), torch.randint(0, 10, (batch,), generator=g)) for _ in range(4)]
    return tropt.Setup(model, lambda m, b: F.cross_entropy(m(b[0]), b[1]),
                       lambda m: torch.optim.AdamW(m.parameters(), lr=1e-4), data)


def cnn(batch: int) -> tropt.Setup:
    torch.manual_seed(0)

    def block(i: int, o: int, stride: int) -> nn.Sequential:
        return nn.Sequential(nn.Conv2d(i, o, 3, stride, 1, bias=False), nn.BatchNorm2d(o), nn.ReLU())

    model = nn.Sequential(block(3, 32, 1), block(32, 64, 2), block(64, 128, 2), block(128, 128, 2),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10))
    g = torch.Generator().manual_seed(0)
    data = [(torch.randn(batch, 3, 32, 32, generator=g), torch.randint(0, 10, (batch,), generator=g)) for _ in range(4)]
    return tropt.Setup(model, lambda m, b: F.cross_entropy(m(b[0]), b[1]),
                       lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3), data)


class Block(nn.Module):
    """A GPT-2 block: pre-norm causal self-attention and a 4× GELU MLP, both residual."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int = 1024, d: int = 128, layers: int = 4, heads: int = 4, context: int = 128) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(context, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied, as GPT-2 does

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


def gpt(batch: int, context: int = 128) -> tropt.Setup:
    torch.manual_seed(0)
    model = TinyGPT(context=context)
    g = torch.Generator().manual_seed(0)
    data = [torch.randint(0, 1024, (batch, context + 1), generator=g) for _ in range(4)]

    def loss(m, b):
        logits = m(b[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), b[:, 1:].reshape(-1))

    return tropt.Setup(model, loss, lambda m: torch.optim.AdamW(m.parameters(), lr=3e-4), data)


SETUPS = {"MLP 4×1024 (batch 64)": (mlp, 64), "small CNN 32×32 (batch 64)": (cnn, 64),
          "tiny GPT-2 4×128, context 128 (batch 16)": (gpt, 16)}


# ------------------------------------------------------------------------------------------------ ground truth
def ground_truth_peak(setup: tropt.Setup, steps: int = 3) -> float:
    """Peak bytes of the last of ``steps`` plain steps, counted from before the copy is built."""
    batches = list(setup.batches(steps))
    if setup.device.type == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        ctx = setup.build()
        for i, b in enumerate(batches):
            if i == steps - 1:
                torch.cuda.reset_peak_memory_stats()
            setup.run_step(ctx, split_batch(b, ctx.accumulation_steps))
        torch.cuda.synchronize()
        return float(torch.cuda.max_memory_allocated() - base)
    from torch.profiler import ProfilerActivity, profile, record_function

    from tropt.perf.throughput import _native_stderr_muted  # the profiler's start/stop lines on fd 2

    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with _native_stderr_muted():
        prof.start()
    try:
        ctx = setup.build()
        for i, b in enumerate(batches):
            if i == steps - 1:
                with record_function("bench::last_step"):
                    setup.run_step(ctx, split_batch(b, ctx.accumulation_steps))
            else:
                setup.run_step(ctx, split_batch(b, ctx.accumulation_steps))
        del ctx
    finally:
        with _native_stderr_muted():
            prof.stop()
    events = sorted(((e.start_ns(), e.duration_ns(), e.name(), e.nbytes())
                     for e in prof.profiler.kineto_results.events()
                     if e.name() in ("[memory]", "bench::last_step")), key=lambda x: x[0])
    start, stop = next((t, t + d) for t, d, n, _ in events if n == "bench::last_step")
    live, peak = 0, 0
    for t, _, name, nbytes in events:
        if name == "[memory]":
            live += nbytes
            if start <= t <= stop:
                peak = max(peak, live)
    return float(peak)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    load = os.getloadavg() if hasattr(os, "getloadavg") else (math.nan,) * 3
    print(f"perf.memory accounting on {args.device}, torch {torch.__version__}, {args.threads} thread(s); "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"{'setup':44s} {'check peak@B':>12s} {'truth@B':>9s} {'err':>6s} | {'est@2B':>8s} {'truth@2B':>9s} "
          f"{'err':>6s} | "
          f"{'parts':>6s} {'naive':>7s} | {'steps':>5s}  phase / ground truth")
    worst = 0.0
    for name, (make, batch) in SETUPS.items():
        setup = make(batch).replace(device=args.device)
        r = check_memory(setup, progress=False)
        m = r.metrics
        truth = ground_truth_peak(setup)
        truth2 = ground_truth_peak(make(2 * batch).replace(device=args.device))
        curve = r.tables["batch_curve"].set_index("batch_size")
        est2 = float(curve.loc[2 * batch, "peak_mib"]) * MIB
        peak = m["peak_mib"] * MIB
        parts = (m["params_mib"] + m["grads_at_peak_mib"] + m["optimizer_state_mib"]
                 + m["activations_at_peak_mib"]) * MIB
        naive = (m["params_mib"] + m["grads_mib"] + m["optimizer_state_mib"] + m["activations_mib"]) * MIB
        err, err2 = peak / truth - 1, est2 / truth2 - 1
        worst = max(worst, abs(err), abs(err2))
        print(f"{name:44s} {peak / MIB:10.1f}Mi {truth / MIB:7.1f}Mi {err:+6.2%} | {est2 / MIB:6.1f}Mi "
              f"{truth2 / MIB:7.1f}Mi "
              f"{err2:+6.2%} | {parts / peak:6.1%} {naive / peak:7.1%} | {int(m['optimizer_steps']):5d}  "
              f"{m['peak_phase']} / {m['ground_truth']}")
    print(f"worst error {worst:.2%} (goal <= 10%); parts = share of the peak the named parts explain, "
          "naive = (P + G + S + all activations) / measured peak")


if __name__ == "__main__":
    main()
