"""The strategy model of ``perf.memory``: the step's peak as a function of the batch, and each option's estimate.

:class:`PeakModel` is fitted from the measured steps (activations and temporaries linear in the batch, from two
batch sizes); each option (micro-batching, activation checkpointing, bf16 autocast, 8-bit or factored optimizer
state, optimizer-state sharding and full FSDP over N devices) changes some of its terms. :func:`plan` gives the
strategies table, the smallest N each sharding needs, the largest batch that fits and the batch curve.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from .measurement import Measurement
from .meters import MIB, StepMemory

SHARDS = (1, 2, 4, 8, 16, 32, 64)
# Options in order of invasiveness: the first ones change no arithmetic, later ones change numerics, the last ones
# need more devices. The recommendation is the first that fits.
OPTIONS = {
    "as is": "nothing changes",
    "micro-batching": "same update (gradient accumulation; BatchNorm statistics see smaller batches); "
                      "less parallel work per pass",
    "activation checkpointing": "same update; recomputes the checkpointed blocks' forward in backward",
    "bf16 autocast": "bf16 rounding in forward/backward (stability: perf.precision); usually faster",
    "8-bit optimizer state": "quantised moments (e.g. bitsandbytes AdamW8bit); re-check convergence",
    "factored optimizer state": "Adafactor: factored second moment, no first moment; re-tune the learning rate",
    "all single-device options": "checkpointing + bf16 + 8-bit state together",
    "optimizer-state sharding": "ZeRO-1 / FSDP SHARD_GRAD_OP-style: N devices, one all-gather of parameters per step",
    "full FSDP": "parameters, gradients and state sharded over N devices; all-gather per block in forward and backward",
}


@dataclass
class PeakModel:
    """Peak of one step as a function of the batch: max(forward/backward, optimizer phase), in bytes.

    Forward/backward at its peak instant: what is resident when the step starts (parameters, optimizer state,
    gradients kept from the last step, anything else held), the gradients produced by then, the activations alive
    then and the temporaries; the last two are linear in the batch (fitted from two batch sizes). The optimizer
    phase does not depend on the batch.
    """

    params: float
    grads: float
    grads_start: float
    grads_fb: float  # gradients produced by the forward/backward peak instant
    state: float
    held: float
    act: tuple[float, float]  # activations alive at the forward/backward peak: intercept, per sample
    tmp: tuple[float, float]  # temporaries there beyond activations and gradients: intercept, per sample
    opt_tmp: float  # optimizer.step() temporaries beyond what is resident when it starts
    opt_rest: float  # what else is alive when optimizer.step() starts (the loss, the batch)
    has_opt: bool
    bf16: tuple[tuple[float, float], tuple[float, float]] | None = None  # act, tmp lines measured under bf16

    def peak(self, b: float, *, params: float | None = None, grads: float | None = None,
             grads_start: float | None = None, grads_fb: float | None = None, state: float | None = None,
             act_scale: float = 1.0, bf16: bool = False,
             opt_tmp: float | None = None) -> float:
        p = self.params if params is None else params
        g = self.grads if grads is None else grads
        gs = self.grads_start if grads_start is None else grads_start
        gf = self.grads_fb if grads_fb is None else grads_fb
        s = self.state if state is None else state
        act, tmp = self.bf16 if bf16 and self.bf16 is not None else (self.act, self.tmp)
        fb = p + s + gs + gf + self.held + act_scale * max(0.0, act[0] + act[1] * b) + max(0.0, tmp[0] + tmp[1] * b)
        if not self.has_opt:
            return fb
        o = p + s + g + self.held + self.opt_rest + (self.opt_tmp if opt_tmp is None else opt_tmp)
        return max(fb, o)


def fit_line(b1: float, y1: float, b2: float | None, y2: float | None) -> tuple[float, float]:
    """Intercept and slope through two points; proportional through the origin when there is one point."""
    if b2 is None or y2 is None or b1 == b2:
        return 0.0, y1 / b1 if b1 else 0.0
    slope = (y1 - y2) / (b1 - b2)
    return y1 - slope * b1, slope


def largest_batch(peak_at: Callable[[float], float], limit: float, b: int, cap: int = 2**24) -> int:
    """The largest batch whose estimated peak fits ``limit`` (0 when none does); linear in the batch."""
    if peak_at(1) > limit:
        return 0
    lo, hi = 1, max(2, b)
    while peak_at(hi) <= limit and hi < cap:
        lo, hi = hi, hi * 2
    if peak_at(hi) <= limit:
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if peak_at(mid) <= limit else (lo, mid)
    return lo


def strategy_table(m: PeakModel, meas: Measurement, b: int, limit: float | None, ckpt: float, bf16: bool,
                bf16_note: str, state8: float, k: int, shards: dict[str, int | None]) -> pd.DataFrame:
    """Each option's estimated peak at the Setup's batch, whether it fits, and the largest batch that fits."""
    rows: list[dict] = []

    def add(option: str, n: int, est: Callable[[float], float], note: str = "") -> None:
        peak = est(b)
        fits = None if limit is None else bool(peak <= limit)
        rows.append({"option": option, "devices": n, "peak_mib": peak / MIB,
                     "fits": fits, "headroom": (1 - peak / limit) if limit else math.nan,
                     "max_batch": largest_batch(est, limit, b) if limit else math.nan,
                     "cost": OPTIONS[option] + (f"; {note}" if note else "")})

    add("as is", 1, m.peak)
    if b // k >= 2:  # micro-batches can still shrink
        for j in (2, 4, 8, 16, 32, 64):
            if b // (k * j) < 1:
                break
            # gradients persist across micro-batches: resident from the second one on, accumulated in place
            fb_only = lambda x, j=j: m.peak(x / j, grads_start=max(m.grads, m.grads_start), grads_fb=0.0)  # noqa: E731
            if limit is None or fb_only(b) <= limit or j == 64 or b // (k * j * 2) < 1:
                add("micro-batching", 1, fb_only, f"accumulation_steps={k * j} (micro-batch {b // (k * j)})")
                break
    if ckpt < 1:
        add("activation checkpointing", 1, lambda x: m.peak(x, act_scale=ckpt),
            f"keeps {ckpt:.0%} of the activations; recompute ≈ one more forward of the blocks (+25–35% step time)")
    if bf16:
        add("bf16 autocast", 1, lambda x: m.peak(x, bf16=True), bf16_note)
    if meas.state > 0:
        add("8-bit optimizer state", 1, lambda x: m.peak(x, state=state8))
        if meas.state_tensors >= 2 and meas.factored < meas.state:
            add("factored optimizer state", 1, lambda x: m.peak(x, state=meas.factored))
    if ckpt < 1 or bf16 or meas.state > 0:
        add("all single-device options", 1, lambda x: m.peak(x, act_scale=ckpt, bf16=bf16,
                                                             state=state8 if meas.state > 0 else None))
    for option in ("optimizer-state sharding", "full FSDP"):
        if option == "optimizer-state sharding" and meas.state == 0:
            continue
        # every power of two, plus the smallest N that fits and the one below it (the evidence it is the smallest)
        extra = {v for n in [shards.get(option)] if n for v in (n - 1, n) if v >= 1}
        for n in sorted(set(SHARDS) | extra):
            add(option, n, lambda x, n=n, option=option: sharded_peak(m, meas, option, n, x))  # type: ignore[misc]
    return pd.DataFrame(rows, columns=["option", "devices", "peak_mib", "fits", "headroom", "max_batch", "cost"])


def sharded_peak(m: PeakModel, meas: Measurement, option: str, n: int, b: float) -> float:
    """Estimated peak per device of ``option`` over ``n`` devices at batch ``b``.

    Optimizer-state sharding (ZeRO-1) keeps full parameters and gradients and 1/N of the state and of the optimizer's
    temporaries. Full FSDP keeps 1/N of everything resident, plus one block's parameters gathered while it runs, the
    next block's prefetched, and the block's unsharded gradient before its reduce-scatter (3 blocks' worth).
    """
    if option == "optimizer-state sharding":
        return m.peak(b, state=m.state / n, opt_tmp=m.opt_tmp / n)
    block = max((p for _, p in meas.blocks), default=m.params)
    gathered = 0 if n == 1 else 3 * block * (1 - 1 / n)
    return m.peak(b, params=m.params / n + gathered, grads=m.grads / n, grads_start=m.grads_start / n,
                  grads_fb=m.grads_fb / n, state=m.state / n, opt_tmp=m.opt_tmp / n)


def smallest_shards(m: PeakModel, meas: Measurement, b: int, limit: float) -> dict[str, int | None]:
    """The smallest N (1..64) at which each sharding fits ``limit`` (None when none up to 64 does)."""
    out: dict[str, int | None] = {}
    for option in ("optimizer-state sharding", "full FSDP"):
        if option == "optimizer-state sharding" and meas.state == 0:
            out[option] = None
            continue
        out[option] = next((n for n in range(1, max(SHARDS) + 1) if sharded_peak(m, meas, option, n, b) <= limit), None)
    return out


def peak_lines(meas: Measurement, full: StepMemory,
               small: StepMemory | None) -> tuple[tuple[float, float], tuple[float, float]]:
    """Activations, and the other temporaries, alive at the forward/backward peak: lines in the batch size."""
    def split(r: StepMemory) -> tuple[float, float]:
        act = r.fb_parts[0]
        return act, r.fb_peak - r.start - act - (r.fb_parts[1] - r.grads_start)

    fa, ft = split(full)
    sa, st = split(small) if small is not None else (None, None)
    return fit_line(meas.batch, fa, meas.half, sa), fit_line(meas.batch, ft, meas.half, st)


def peak_model(meas: Measurement, steady: StepMemory, half: StepMemory | None) -> PeakModel:
    """The peak against the batch, from the steady step and the half-batch step."""
    act_line, tmp_line = peak_lines(meas, steady, half)
    opt_tmp = steady.opt_peak - steady.opt_start if steady.has_opt else 0.0
    opt_rest = (steady.opt_start - steady.start + steady.grads_start - meas.grads) if steady.has_opt else 0.0
    held = steady.start - meas.params - meas.state - steady.grads_start
    return PeakModel(meas.params, meas.grads, steady.grads_start, steady.fb_parts[1] - steady.grads_start, meas.state,
                     held, act_line, tmp_line, opt_tmp, opt_rest, steady.has_opt)


def checkpoint_share(steady: StepMemory) -> float:
    """Share of the activations kept when every block is checkpointed: what runs outside the blocks, each block's
    inputs, and one block's activations at a time (recomputed in backward)."""
    blocks = {n: v for n, v in steady.per_block.items() if n}
    total = sum(steady.per_block.values())
    if len(blocks) < 2 or total <= 0:
        return 1.0
    kept = steady.per_block.get("", 0) + sum(steady.block_inputs.get(n, 0) for n in blocks) + max(blocks.values())
    return min(1.0, kept / total)


def batch_curve(model: PeakModel, meas: Measurement, peak: float, half: StepMemory | None,
                max_batch: int | None) -> pd.DataFrame:
    """Estimated peak at powers of two up to 8× the batch (or twice the largest that fits), with the measured points."""
    b = meas.batch
    top = max(8 * b, 2 * (max_batch or 0))
    sizes = sorted({2**i for i in range(int(math.log2(top)) + 1)} | {b, meas.half or b, max_batch or b})
    curve = pd.DataFrame({"batch_size": sizes, "peak_mib": [model.peak(x) / MIB for x in sizes]})
    measured = {b: peak, **({meas.half: max(half.fb_peak, half.opt_peak)} if half is not None else {})}
    curve["measured_mib"] = [measured[x] / MIB if x in measured else math.nan for x in sizes]
    return curve


@dataclass
class Plan:
    """The options for one measured step: the fitted model and what each option would need."""

    model: PeakModel
    checkpoint_share: float
    shards: dict[str, int | None]  # the smallest N each sharding fits (empty without a limit)
    strategies: pd.DataFrame
    max_batch: int | None
    curve: pd.DataFrame


def plan(meas: Measurement, peak: float, limit: float | None, k: int, bf16_note: str) -> Plan:
    """Fit the peak model from the steady and half-batch steps (and the bf16 ones), and estimate every option."""
    steady = meas.steps[meas.steady]
    half = meas.steps.get(meas.half_step) if meas.half_step is not None else None
    b = meas.batch
    model = peak_model(meas, steady, half)
    if meas.bf16_step is not None:
        small = meas.steps.get(meas.bf16_half_step) if meas.bf16_half_step is not None else None
        model.bf16 = peak_lines(meas, meas.steps[meas.bf16_step], small)
    ckpt = checkpoint_share(steady)
    state8 = meas.state_elements * 1.016 + meas.state_scalars  # 1 byte per element + blockwise scales (bitsandbytes)
    shards = smallest_shards(model, meas, b, limit) if limit is not None else {}
    table = strategy_table(model, meas, b, limit, ckpt, model.bf16 is not None, bf16_note, state8, k, shards)
    max_batch = largest_batch(model.peak, limit, b) if limit is not None else None
    return Plan(model, ckpt, shards, table, max_batch, batch_curve(model, meas, peak, half, max_batch))
