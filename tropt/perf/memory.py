"""``perf.memory``: where one optimizer step's memory goes, whether it fits, and which strategy makes it fit.

The Setup's own step runs on a copy. Ground truth is the allocator: ``torch.cuda.max_memory_allocated`` on CUDA,
``torch.profiler(profile_memory=True)``'s allocation events on CPU (every allocation made from the moment the copy
is built, so the copy's parameters, gradients and optimizer state are in it and nothing of the user's is). Markers
dropped into that timeline (step begin, ``optimizer.step``, each gradient accumulated, each tensor saved for and
released by backward) say what was alive at the peak instant, so the breakdown is measured, not assumed:

- parameters (and buffers), gradients, optimizer state (its tensors after a step, bytes per parameter),
- activations saved for backward (``torch.autograd.graph.saved_tensors_hooks``; storages deduplicated, parameter
  and input-batch storages left out),
- the remainder: temporaries of forward, backward and the optimizer, and anything held between steps.

Activations and the forward/backward peak are measured at two batch sizes (the Setup's and half of it) and fitted
linearly, which gives the largest batch that fits ``memory_limit`` and the estimated peak of each strategy
(micro-batching, activation checkpointing, bf16 autocast, 8-bit or factored optimizer state, optimizer-state
sharding and full FSDP over N devices). A 10-step run fits the trend of memory left allocated after each step:
growth means something keeps every step's graph alive.

On CUDA the peak counts what the check's copy allocates from the moment it is built (the batches are on the device
before that); memory already in use (your original model, the CUDA context, other processes) is not in it.

Cost: ``growth_steps`` (10) optimizer steps, one at half the batch, and, when the Setup trains in fp32, the same two
batch sizes under bf16 autocast: 13 in all.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np
import pandas as pd
import torch
from torch import nn

from ..errors import TroptError
from ..registry import register
from ..result import CheckResult, Status

CHECK_ID = "perf.memory"
MIB = 2**20
GIB = 2**30
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


# --------------------------------------------------------------------------------------------- measuring
class _Saved:
    """Keeps a saved-for-backward tensor; its deletion (the graph releasing it) updates the live count."""

    __slots__ = ("t", "key", "tracker")

    def __init__(self, t: torch.Tensor, key: int, tracker: "_Tracker") -> None:
        self.t, self.key, self.tracker = t, key, tracker

    def __del__(self) -> None:
        self.tracker.release(self.key)


class _Tracker:
    """What is alive during a step: activations saved for backward (live, by storage) and gradients.

    ``mark`` is called whenever either changes, so the meter can say what was alive at the peak instant.
    """

    def __init__(self, excluded: set[int], mark: Callable[[], None]) -> None:
        self.excluded = excluded  # storages that are not activations: parameters, buffers, the input batch
        self.mark = mark
        self.active = False
        self.counts: dict[int, int] = {}
        self.sizes: dict[int, tuple[int, int]] = {}  # storage -> (bytes, the step that saved it)
        self.generation = 0
        self.act_live = 0
        self.act_peak = 0
        self.grad_live = 0
        self.grads_seen: set[int] = set()
        self.block: list[str] = []  # the checkpointable block running now (innermost last)
        self.per_block: dict[str, int] = {}
        self.block_inputs: dict[str, int] = {}

    def start(self, model: nn.Module, excluded_batch: set[int]) -> None:
        self.active = True
        self.generation += 1  # a graph kept from an earlier step and released now is not this step's activation
        self.batch = excluded_batch
        self.act_live = self.act_peak = 0
        self.per_block, self.block_inputs = {}, {}
        self.grads_seen = {id(p) for p in model.parameters() if p.grad is not None}
        self.grad_live = sum(_storage_bytes(p.grad) for p in model.parameters() if p.grad is not None)

    def stop(self) -> None:
        self.active = False

    def pack(self, t: torch.Tensor) -> Any:
        try:
            storage = t.untyped_storage()
            key, nbytes = storage.data_ptr(), storage.nbytes()
        except Exception:  # noqa: BLE001 - tensors without a storage (some subclasses): not counted
            return t
        if not self.active or key in self.excluded or key in self.batch or nbytes == 0:
            return t
        n = self.counts.get(key, 0)
        self.counts[key] = n + 1
        if n == 0:
            self.sizes[key] = (nbytes, self.generation)
            self.act_live += nbytes
            self.act_peak = max(self.act_peak, self.act_live)
            where = self.block[-1] if self.block else ""
            self.per_block[where] = self.per_block.get(where, 0) + nbytes
            self.mark()
        # detach: the keeper must not hold the tensor's grad_fn (a reference cycle through the graph)
        return _Saved(t.detach(), key, self)

    @staticmethod
    def unpack(saved: Any) -> torch.Tensor:
        return saved.t if isinstance(saved, _Saved) else saved

    def release(self, key: int) -> None:
        n = self.counts.get(key, 0) - 1
        if n > 0:
            self.counts[key] = n
            return
        self.counts.pop(key, None)
        nbytes, generation = self.sizes.pop(key, (0, -1))
        if generation == self.generation:
            self.act_live -= nbytes
            if self.active:
                self.mark()

    def on_grad(self, p: torch.Tensor) -> None:
        if self.active and id(p) not in self.grads_seen and p.grad is not None:
            self.grads_seen.add(id(p))
            self.grad_live += _storage_bytes(p.grad)
            self.mark()

    def state(self) -> tuple[int, int]:
        return self.act_live, self.grad_live


def _ptr(t: torch.Tensor) -> int | None:
    """The address of a tensor's storage (None for tensors without one)."""
    try:
        return t.untyped_storage().data_ptr()
    except Exception:  # noqa: BLE001 - sparse, meta or subclass tensors
        return None


def _storage_bytes(t: torch.Tensor) -> int:
    try:
        return int(t.untyped_storage().nbytes())
    except Exception:  # noqa: BLE001
        return int(t.numel() * t.element_size())


def _unique_bytes(tensors: Iterator[torch.Tensor]) -> int:
    """Bytes of distinct storages (tied weights and views counted once)."""
    seen: dict[int, int] = {}
    for t in tensors:
        try:
            s = t.untyped_storage()
            seen[s.data_ptr()] = max(seen.get(s.data_ptr(), 0), s.nbytes())
        except Exception:  # noqa: BLE001
            seen[id(t)] = t.numel() * t.element_size()
    return sum(seen.values())


def _tensor_leaves(obj: Any, out: list[torch.Tensor]) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, dict):
        for v in obj.values():
            _tensor_leaves(v, out)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _tensor_leaves(v, out)
    elif hasattr(obj, "items") and callable(obj.items):  # Mappings such as BatchEncoding
        for _, v in obj.items():
            _tensor_leaves(v, out)
    return out


@dataclass
class _StepMemory:
    """One step's memory (bytes relative to before the copy was built) and what was alive at its peaks."""

    start: float = math.nan
    end: float = math.nan
    fb_peak: float = -math.inf  # forward + backward: from the step's start to its first optimizer.step()
    fb_parts: tuple[int, int] = (0, 0)  # (activations, gradients) alive at that peak
    opt_start: float = math.nan
    opt_peak: float = -math.inf  # optimizer.step() and what follows it in the step
    opt_parts: tuple[int, int] = (0, 0)
    has_opt: bool = False
    activations: int = 0  # most activation bytes alive at once
    grads_start: int = 0
    batch: int = 0
    per_block: dict = field(default_factory=dict)
    block_inputs: dict = field(default_factory=dict)


class _Meter:
    """Markers in the allocation timeline; subclasses read the allocator (CUDA) or the profiler (CPU)."""

    ground_truth = ""

    def __init__(self) -> None:
        self.steps: dict[int, _StepMemory] = {}
        self.tracker: _Tracker | None = None
        self.step: int | None = None
        self.phase: str | None = None

    def parts(self) -> tuple[int, int]:
        return self.tracker.state() if self.tracker is not None else (0, 0)

    def begin(self, i: int) -> None:
        self.steps[i] = _StepMemory()
        self.step, self.phase = i, "fb"
        self._marker(("begin", i))

    def optimizer_step(self) -> None:
        if self.step is not None and self.phase == "fb":
            self.phase = "opt"
            self.steps[self.step].has_opt = True
            self._marker(("opt", self.step))

    def end(self) -> None:
        self._marker(("end", self.step))
        self.step, self.phase = None, None

    def mark(self) -> None:
        self._marker(("parts", self.parts()))

    def _marker(self, what: tuple) -> None:
        raise NotImplementedError

    def __enter__(self) -> "_Meter":
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


class _CudaMeter(_Meter):
    """``torch.cuda`` allocator statistics: the peak between two markers is read and reset at each marker."""

    ground_truth = "torch.cuda.max_memory_allocated"

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device = device
        self.last_parts = (0, 0)

    def __enter__(self) -> "_CudaMeter":
        torch.cuda.synchronize(self.device)
        self.base = torch.cuda.memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        return self

    def _marker(self, what: tuple) -> None:
        now = torch.cuda.memory_allocated(self.device) - self.base
        top = torch.cuda.max_memory_allocated(self.device) - self.base
        torch.cuda.reset_peak_memory_stats(self.device)
        kind, arg = what
        rec = self.steps.get(self.step) if self.step is not None else None
        if rec is not None:
            # the peak since the previous marker happened while the previous marker's parts were alive
            if self.phase == "fb" and kind != "begin" and top > rec.fb_peak:
                rec.fb_peak, rec.fb_parts = top, self.last_parts
            if kind == "opt" and top > rec.fb_peak:
                rec.fb_peak, rec.fb_parts = top, self.last_parts
            if self.phase == "opt" and kind != "opt" and top > rec.opt_peak:
                rec.opt_peak, rec.opt_parts = top, self.last_parts
            if kind == "begin":
                rec.start = rec.fb_peak = now
                rec.fb_parts = self.parts()
            elif kind == "opt":
                rec.opt_start = rec.opt_peak = now
                rec.opt_parts = self.last_parts
            elif kind == "end":
                rec.end = now
        if kind == "parts":
            self.last_parts = arg
        elif kind in ("begin", "opt"):
            self.last_parts = self.parts()


class _ProfilerMeter(_Meter):
    """``torch.profiler(profile_memory=True)``: allocation events and zero-length markers, replayed afterwards."""

    ground_truth = "torch.profiler (profile_memory=True)"

    def __init__(self) -> None:
        super().__init__()
        self.markers: list[tuple] = []

    def __enter__(self) -> "_ProfilerMeter":
        from torch.profiler import ProfilerActivity, profile

        from .throughput import _native_stderr_muted

        self.prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        with _native_stderr_muted():
            try:
                self.prof.start()
            except RuntimeError as exc:  # another profiler is running (the user's): no ground truth to read
                raise TroptError(f"perf.memory could not start torch.profiler ({exc})",
                                 "run the check outside your own torch.profiler session") from exc
        return self

    def __exit__(self, *exc: Any) -> None:
        from .throughput import _native_stderr_muted

        with _native_stderr_muted():
            self.prof.stop()
        if exc[0] is None:
            self._replay()

    def _marker(self, what: tuple) -> None:
        self.markers.append(what)
        with torch.profiler.record_function(f"tropt::memory_marker::{len(self.markers) - 1}"):
            pass

    def _replay(self) -> None:
        """Walk allocations and markers in time order; the live total is the sum of the bytes allocated so far."""
        try:
            events = list(self.prof.profiler.kineto_results.events())
        except AttributeError as exc:  # a torch whose profiler keeps its events elsewhere
            raise TroptError(f"perf.memory cannot read torch.profiler's memory events in torch {torch.__version__} ({exc})",
                             "run on CUDA, or report this torch version to tropt") from exc
        prefix = "tropt::memory_marker::"
        timeline = []
        for e in events:
            name = e.name()
            if name == "[memory]":
                timeline.append((e.start_ns(), 1, int(e.nbytes())))
            elif name.startswith(prefix):
                timeline.append((e.start_ns(), 0, int(name[len(prefix):])))
        timeline.sort(key=lambda x: (x[0], x[1]))
        live, step, phase, parts = 0, None, None, (0, 0)
        for _, kind, value in timeline:
            if kind == 1:
                live += value
                rec = self.steps.get(step) if step is not None else None
                if rec is not None:
                    if phase == "fb" and live > rec.fb_peak:
                        rec.fb_peak, rec.fb_parts = live, parts
                    elif phase == "opt" and live > rec.opt_peak:
                        rec.opt_peak, rec.opt_parts = live, parts
                continue
            what, arg = self.markers[value]
            if what == "parts":
                parts = arg
            elif what == "begin":
                step, phase = arg, "fb"
                rec = self.steps[arg]
                parts = (0, rec.grads_start)
                rec.start = rec.fb_peak = live
                rec.fb_parts = parts
            elif what == "opt":
                phase = "opt"
                rec = self.steps[arg]
                rec.opt_start = rec.opt_peak = live
                rec.opt_parts = parts
            elif what == "end":
                self.steps[arg].end = live
                step, phase = None, None


def _find_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The repeated blocks activation checkpointing would wrap: the children of the container (Sequential /
    ModuleList) with the most children that hold parameters; else the model's own children."""
    best: list[tuple[str, nn.Module]] = []
    for name, mod in model.named_modules():
        if isinstance(mod, (nn.Sequential, nn.ModuleList)):
            kids = [(f"{name}.{k}" if name else k, c) for k, c in mod.named_children()
                    if any(True for _ in c.parameters())]
            if len(kids) > len(best):
                best = kids
    if len(best) < 2:
        best = [(k, c) for k, c in model.named_children() if any(True for _ in c.parameters())]
    return best


@contextlib.contextmanager
def _block_hooks(blocks: list[tuple[str, nn.Module]], tracker: _Tracker) -> Iterator[None]:
    """Attribute saved tensors to the block running, and record each block's input bytes (what checkpointing keeps)."""
    handles = []

    def pre(name: str) -> Callable:
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            tracker.block.append(name)
            size = _unique_bytes(t for t in _tensor_leaves([args, kwargs], []) if _ptr(t) not in tracker.excluded)
            tracker.block_inputs[name] = tracker.block_inputs.get(name, 0) + size
        return hook

    def post(name: str) -> Callable:
        def hook(module: nn.Module, args: tuple, out: Any) -> None:
            if tracker.block and tracker.block[-1] == name:
                tracker.block.pop()
        return hook

    try:
        for name, mod in blocks:
            handles.append(mod.register_forward_pre_hook(pre(name), with_kwargs=True))
            handles.append(mod.register_forward_hook(post(name)))
        yield
    finally:
        for h in handles:
            h.remove()
        tracker.block.clear()


def _state_bytes(optimizer: Any) -> tuple[int, int, int, int]:
    """Optimizer state: (bytes, elements of non-scalar tensors, bytes of scalar tensors, tensors per parameter)."""
    if optimizer is None:
        return 0, 0, 0, 0
    tensors, scalars, elements, most = [], 0, 0, 0
    for state in optimizer.state.values():
        n = 0
        for v in state.values():
            if isinstance(v, torch.Tensor):
                tensors.append(v)
                if v.ndim == 0:
                    scalars += v.numel() * v.element_size()
                else:
                    elements += v.numel()
                    n += 1
        most = max(most, n)
    return _unique_bytes(iter(tensors)), elements, scalars, most


def _factored_bytes(model: nn.Module) -> int:
    """Adafactor's state without momentum: row and column statistics for matrices, a full vector otherwise (fp32)."""
    total = 0
    for p in model.parameters():
        if p.requires_grad and p.numel():
            total += 4 * ((p.shape[0] + p.numel() // p.shape[0]) if p.ndim >= 2 else p.numel())
    return total


def _smaller_batch(setup: Any, batch: Any, k: int) -> tuple[Any, int] | None:
    """About half the batch (keeping at least ``k`` samples, one per micro-batch), or None when it cannot shrink.

    Sizes and splits follow the Setup's batch layout (time-major batches, split_fn/size_fn)."""
    n = setup.size(batch)
    half = n // 2
    if half < k or half < 1:
        return None
    return setup.split(batch, sizes=[half, n - half])[0], half


@dataclass
class _Measurement:
    ground_truth: str
    steps: dict[int, _StepMemory]
    params: int
    n_params: int
    state: int
    state_elements: int
    state_scalars: int
    state_tensors: int
    grads: int
    factored: int
    blocks: list[tuple[str, int]]  # (name, parameter bytes)
    batch: int
    half: int | None
    steady: int
    half_step: int | None
    bf16_step: int | None
    bf16_half_step: int | None


def _measure(setup: Any, growth_steps: int, bf16: bool, progress: bool) -> _Measurement:
    """Run the Setup's step on a copy under the meter: ``growth_steps`` steps, one at half the batch, one in bf16."""
    from tqdm.auto import tqdm

    device = setup.device
    meter: _Meter = _CudaMeter(device) if device.type == "cuda" else _ProfilerMeter()
    k = setup.accumulation_steps
    batches = list(setup.batches(growth_steps))
    handles: list[Any] = []
    with meter:
        ctx = setup.build()
        model = ctx.model
        opt = getattr(ctx, "optimizer", None)
        excluded = {_ptr(t) for t in [*model.parameters(), *model.buffers()]}
        tracker = _Tracker(excluded, meter.mark)
        meter.tracker = tracker
        for p in model.parameters():
            if p.requires_grad:
                handles.append(p.register_post_accumulate_grad_hook(tracker.on_grad))
        if opt is not None:
            handles.append(opt.register_step_pre_hook(lambda *_: meter.optimizer_step()))
        blocks = _find_blocks(model)
        grads_per_step: dict[int, int] = {}

        def run(i: int, batch: Any, hooks: bool) -> None:
            micro = setup.split(batch, k)
            leaves = _tensor_leaves(batch, [])
            tracker.start(model, {_ptr(t) for t in leaves})
            meter.begin(i)
            rec = meter.steps[i]
            rec.grads_start = tracker.grad_live
            rec.batch = _unique_bytes(iter(leaves))
            saved = torch.autograd.graph.saved_tensors_hooks(tracker.pack, tracker.unpack) if hooks else contextlib.nullcontext()
            try:
                with saved, (_block_hooks(blocks, tracker) if hooks else contextlib.nullcontext()):
                    out = setup.run_step(ctx, micro)
                del out  # a returned loss may carry its graph: the next step must not see it
            finally:
                meter.end()
                tracker.stop()
            rec.activations = tracker.act_peak
            rec.per_block, rec.block_inputs = dict(tracker.per_block), dict(tracker.block_inputs)
            grads_per_step[i] = tracker.grad_live

        bar = tqdm(total=growth_steps + 2, desc=CHECK_ID, disable=not progress, leave=False)
        try:
            for i, batch in enumerate(batches):
                run(i, batch, hooks=i == 1)
                bar.update(1)
            state, elements, scalars, per_param = _state_bytes(opt)
            smaller = _smaller_batch(setup, batches[1], k)
            half_step = None
            if smaller is not None:
                half_step = growth_steps
                run(half_step, smaller[0], hooks=True)
            bar.update(1)
            bf16_step = bf16_half = None
            if bf16:  # the same two batch sizes under bf16 autocast (the copy's context only)
                bf16_step = growth_steps + 1
                ctx.precision = "bf16"
                try:
                    run(bf16_step, batches[1], hooks=True)
                    if smaller is not None:
                        bf16_half = growth_steps + 2
                        run(bf16_half, smaller[0], hooks=True)
                finally:
                    ctx.precision = setup.precision
            bar.update(1)
        finally:
            bar.close()
            for h in handles:
                h.remove()
        params = _unique_bytes(iter([*model.parameters(), *model.buffers()]))
        n_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
        block_params = [(name, _unique_bytes(iter(list(mod.parameters())))) for name, mod in blocks]
        factored = _factored_bytes(model)
        del ctx, model, opt
    return _Measurement(meter.ground_truth, meter.steps, params, n_params, state, elements, scalars, per_param,
                        grads_per_step.get(1, 0), factored, block_params, setup.size(batches[1]),
                        smaller[1] if smaller is not None else None, 1, half_step, bf16_step, bf16_half)


# --------------------------------------------------------------------------------------------- the plan
@dataclass
class _Model:
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

    def peak(self, b: float, *, params: float | None = None, grads: float | None = None, grads_start: float | None = None,
             grads_fb: float | None = None, state: float | None = None, act_scale: float = 1.0, bf16: bool = False,
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


def _line(b1: float, y1: float, b2: float | None, y2: float | None) -> tuple[float, float]:
    """Intercept and slope through two points; proportional through the origin when there is one point."""
    if b2 is None or y2 is None or b1 == b2:
        return 0.0, y1 / b1 if b1 else 0.0
    slope = (y1 - y2) / (b1 - b2)
    return y1 - slope * b1, slope


def _max_batch(peak_at: Callable[[float], float], limit: float, b: int, cap: int = 2**24) -> int:
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


def _strategies(m: _Model, meas: _Measurement, b: int, limit: float | None, ckpt: float, bf16: bool,
                bf16_note: str, state8: float, k: int, shards: dict[str, int | None]) -> pd.DataFrame:
    """Each option's estimated peak at the Setup's batch, whether it fits, and the largest batch that fits."""
    rows: list[dict] = []

    def add(option: str, n: int, est: Callable[[float], float], note: str = "") -> None:
        peak = est(b)
        fits = None if limit is None else bool(peak <= limit)
        rows.append({"option": option, "devices": n, "peak_mib": peak / MIB,
                     "fits": fits, "headroom": (1 - peak / limit) if limit else math.nan,
                     "max_batch": _max_batch(est, limit, b) if limit else math.nan,
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
            add(option, n, lambda x, n=n, option=option: _sharded_peak(m, meas, option, n, x))
    return pd.DataFrame(rows, columns=["option", "devices", "peak_mib", "fits", "headroom", "max_batch", "cost"])


def _sharded_peak(m: _Model, meas: _Measurement, option: str, n: int, b: float) -> float:
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


def _smallest_shards(m: _Model, meas: _Measurement, b: int, limit: float) -> dict[str, int | None]:
    """The smallest N (1..64) at which each sharding fits ``limit`` (None when none up to 64 does)."""
    out: dict[str, int | None] = {}
    for option in ("optimizer-state sharding", "full FSDP"):
        if option == "optimizer-state sharding" and meas.state == 0:
            out[option] = None
            continue
        out[option] = next((n for n in range(1, max(SHARDS) + 1) if _sharded_peak(m, meas, option, n, b) <= limit), None)
    return out


def _bf16_verdict(precision_result: Any) -> str:
    """perf.precision's stability verdict for bf16, from a result the caller passes."""
    if precision_result is None:
        return "stability not checked here: run perf.precision (or pass precision_result=)"
    table = getattr(precision_result, "tables", {}).get("precisions")
    if table is None or "bf16" not in set(table["precision"]):
        return "perf.precision did not measure bf16"
    row = table.set_index("precision").loc["bf16"]
    if row["status"] != "measured":
        return f"perf.precision: bf16 {row['status']} ({row['reason']})"
    return (f"perf.precision: bf16 stable (loss within {float(row['loss_deviation']):.1%} of fp32)" if bool(row["stable"])
            else f"perf.precision: bf16 UNSTABLE (loss {float(row['loss_deviation']):.1%} from fp32)")


# --------------------------------------------------------------------------------------------- the check
def _limit_bytes(memory_limit: Any, device: torch.device) -> tuple[float | None, str]:
    """The limit in bytes and where it comes from; raises on a non-positive or non-numeric limit."""
    if memory_limit is not None:
        if isinstance(memory_limit, bool) or not isinstance(memory_limit, (int, float)) or not math.isfinite(memory_limit) \
                or memory_limit <= 0:
            raise TroptError(f"perf.memory: memory_limit={memory_limit!r}; it must be a positive number of GiB",
                             "pass the accelerator's memory in GiB, e.g. memory_limit=80 for an 80 GB device, "
                             "or leave it out to use the CUDA device's capacity")
        return float(memory_limit) * GIB, f"memory_limit={_mib(float(memory_limit) * GIB)}"
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        return float(total), f"{torch.cuda.get_device_name(device)} capacity"
    return None, "none"


def _devices(model: nn.Module) -> list[str]:
    return sorted({str(t.device) for t in [*model.parameters(), *model.buffers()]})


def _mib(x: float) -> str:
    """Bytes in the unit that reads best: KiB, MiB or GiB."""
    if abs(x) < MIB:
        return f"{x / 1024:,.1f} KiB"
    return f"{x / MIB:,.1f} MiB" if abs(x) < GIB else f"{x / GIB:,.2f} GiB"


@register(CHECK_ID, title="Memory of one step and the strategy that fits",
          description="Measure one optimizer step's peak (parameters, gradients, optimizer state, activations, "
                      "remainder), its growth over 10 steps, and which precision/checkpointing/sharding fits the limit.")
def check_memory(
    setup: Any,
    *,
    memory_limit: float | None = None,
    headroom: float = 0.1,
    growth_steps: int = 10,
    growth_threshold: float = 1e-4,
    held_threshold: float = 0.5,
    precision_result: Any = None,
    progress: bool = True,
) -> CheckResult:
    """Measure the memory of the Setup's own optimizer step on a copy and plan what fits.

    Parameters
    ----------
    setup
        The :class:`tropt.Setup` (never modified).
    memory_limit
        Device memory to plan for, in GiB (2**30 bytes). Default: the CUDA device's capacity. On CPU there is no
        default: without it the breakdown, growth and strategy estimates are reported with no fit verdict (host RAM
        says little about the accelerator the run is meant for); pass e.g. ``memory_limit=80`` to plan for one.
    headroom
        WARN when the peak leaves less than this share of the limit free (fragmentation, longer sequences, eval).
    growth_steps
        Steps whose end-of-step memory is fitted for growth (>= 4; the first, which creates the optimizer state,
        is left out of the fit).
    growth_threshold
        WARN when memory left allocated after each step grows by more than this share of the peak (and 4 KiB) per
        step, rising in at least two thirds of the steps: 1e-4 is 10% of the peak per 1,000 steps.
    held_threshold
        WARN when memory held between steps that is not parameters, gradients, optimizer state or the batch exceeds
        this share of the step's activations (a loss or output kept with its graph).
    precision_result
        A ``perf.precision`` result whose bf16 stability verdict is attached to the bf16 option.
    progress
        Show a progress bar.
    """
    from ..snapshot import preserved

    device = setup.device
    limit, limit_from = _limit_bytes(memory_limit, device)
    for name, value, low in (("growth_steps", growth_steps, 4),):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise TroptError(f"perf.memory: {name}={value!r}; it must be an integer >= {low}", f"use e.g. {name}=10")
    for name, value, high in (("headroom", headroom, 1), ("growth_threshold", growth_threshold, 1),
                              ("held_threshold", held_threshold, 10)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < high:
            raise TroptError(f"perf.memory: {name}={value!r} is out of range", f"use the default {name}")
    devices = _devices(setup.model)
    if len(devices) > 1:
        return CheckResult(
            CHECK_ID, Status.SKIP,
            f"the model's parameters sit on {len(devices)} devices ({', '.join(devices)}): a model-parallel layout, whose "
            "memory per device this check cannot measure on one device",
            {"devices": ", ".join(devices)}, {},
            [f"Measure each device's part as its own Setup, or pass the model on one device (tropt's copies run on "
             f"Setup.device={device})."])
    setup.validate()
    from .precision import support

    bf16_ok, bf16_why = support("bf16", device)
    with preserved(setup.model):
        meas = _measure(setup, growth_steps, setup.precision == "fp32" and bf16_ok, progress)
    steady = meas.steps[meas.steady]
    half = meas.steps.get(meas.half_step) if meas.half_step is not None else None
    b = meas.batch
    peak, in_opt, breakdown = _breakdown(meas, steady, getattr(setup, "optimizer", None) is None)
    ends, slope, rising = _growth(meas, growth_steps)

    model = _peak_model(meas, steady, half)
    if meas.bf16_step is not None:
        small = meas.steps.get(meas.bf16_half_step) if meas.bf16_half_step is not None else None
        model.bf16 = _lines(meas, meas.steps[meas.bf16_step], small)
        bf16_note = _bf16_verdict(precision_result)
    else:
        bf16_note = f"the Setup already trains in {setup.precision}" if setup.precision != "fp32" else bf16_why
    ckpt = _checkpoint_share(steady)
    state8 = meas.state_elements * 1.016 + meas.state_scalars  # 1 byte per element + blockwise scales (bitsandbytes)
    shards = _smallest_shards(model, meas, b, limit) if limit is not None else {}
    strategies = _strategies(model, meas, b, limit, ckpt, model.bf16 is not None, bf16_note, state8,
                             setup.accumulation_steps, shards)
    max_batch = _max_batch(model.peak, limit, b) if limit is not None else None
    curve = _batch_curve(model, meas, peak, half, max_batch)

    acts, grads_at = steady.opt_parts if in_opt else steady.fb_parts
    held = steady.start - meas.params - meas.state - steady.grads_start
    metrics: dict[str, Any] = {
        "ground_truth": meas.ground_truth, "device": str(device), "memory_limit_from": limit_from,
        "memory_limit_mib": limit / MIB if limit is not None else math.nan,
        "peak_mib": peak / MIB, "peak_phase": "optimizer.step" if in_opt else "forward/backward",
        "params_mib": meas.params / MIB, "grads_mib": meas.grads / MIB, "grads_at_peak_mib": grads_at / MIB,
        "optimizer_state_mib": meas.state / MIB,
        "optimizer_state_bytes_per_param": meas.state / max(meas.n_params, 1),
        "optimizer_state_vs_params": meas.state / max(meas.params, 1),
        "activations_mib": steady.activations / MIB, "activations_at_peak_mib": acts / MIB,
        "remainder_mib": float(breakdown.loc[4, "mib"]), "held_between_steps_mib": max(held, 0) / MIB,
        "batch_size": b, "half_batch_size": meas.half if meas.half else math.nan,
        "activations_half_batch_mib": half.activations / MIB if half else math.nan,
        "activations_per_sample_mib": (model.act[1] if half else steady.activations / b) / MIB,
        "growth_per_step_mib": slope / MIB, "growth_rising_share": rising, "growth_steps": growth_steps,
        "optimizer_steps": len(meas.steps), "checkpointing_keeps": ckpt,
        "activations_bf16_mib": (meas.steps[meas.bf16_step].activations / MIB if meas.bf16_step is not None
                                 else math.nan),
        "max_batch": max_batch if max_batch is not None else math.nan,
        "headroom": (1 - peak / limit) if limit else math.nan, "parameters": meas.n_params,
    }
    if getattr(setup, "optimizer", None) is None:
        metrics["optimizer"] = "none: optimizer state is 0"
    parts = ", ".join(f"{r.part} {_mib(r.mib * MIB)}" for r in breakdown.itertuples())
    summary = (f"peak {_mib(peak)} during {metrics['peak_phase']} ({meas.ground_truth}): {parts}; "
               f"optimizer state {metrics['optimizer_state_bytes_per_param']:.2f} B/param")
    findings = _leak_findings(held - min(held, steady.batch), steady.activations, peak, slope, rising, growth_steps,
                              held_threshold, growth_threshold)
    if limit is None:
        findings.append((Status.PASS, "no memory_limit on CPU: no fit verdict (pass memory_limit= in GiB to plan for a "
                                      "device)", None))
    else:
        verdict, recommended, extra = _fit_verdict(peak, limit, limit_from, headroom, max_batch, strategies, shards, meas)
        findings.append(verdict)
        metrics.update(extra, fits=bool(peak <= limit), recommended=recommended)
    status = max((f[0] for f in findings), key=_rank, default=Status.PASS)
    summary += "".join(f"; {text}" for _, text, _ in findings)
    advice = [a for _, _, a in findings if a]
    tables = {"breakdown": breakdown, "strategies": strategies, "batch_curve": curve, "steps": _steps_table(meas, growth_steps)}
    series = {"growth_end_mib": ends / MIB, "curve_batch": curve["batch_size"].to_numpy(dtype=float),
              "curve_peak_mib": curve["peak_mib"].to_numpy()}
    return CheckResult(CHECK_ID, status, summary, metrics, tables, advice, series)


def _breakdown(meas: _Measurement, steady: _StepMemory, no_optimizer: bool) -> tuple[float, bool, pd.DataFrame]:
    """The steady step's peak, whether it falls in optimizer.step(), and the parts alive at that instant."""
    fb, op = steady.fb_peak, steady.opt_peak if steady.has_opt else -math.inf
    in_opt = op > fb
    peak = max(fb, op)
    acts, grads_at = steady.opt_parts if in_opt else steady.fb_parts
    held = steady.start - meas.params - meas.state - steady.grads_start
    table = pd.DataFrame([
        {"part": "parameters", "mib": meas.params / MIB, "note": "parameters and buffers of the model"},
        {"part": "gradients", "mib": grads_at / MIB, "note": f"alive at the peak (all gradients: {_mib(meas.grads)})"},
        {"part": "optimizer state", "mib": meas.state / MIB,
         "note": "no optimizer (hand-written updates): no state" if no_optimizer else
         f"{meas.state / max(meas.n_params, 1):.2f} bytes per parameter"},
        {"part": "activations", "mib": acts / MIB,
         "note": f"saved for backward, alive at the peak (most at once: {_mib(steady.activations)})"},
        {"part": "remainder", "mib": (peak - meas.params - grads_at - meas.state - acts) / MIB,
         "note": "temporaries of " + ("optimizer.step()" if in_opt else "forward/backward")
                 + f", the allocator; {_mib(max(held, 0))} held from before the step"},
    ])
    table["share"] = table["mib"] / (peak / MIB) if peak > 0 else math.nan
    return peak, in_opt, table


def _growth(meas: _Measurement, growth_steps: int) -> tuple[np.ndarray, float, float]:
    """Memory left allocated after each step (the first, which creates the optimizer state, left out), its fitted
    slope in bytes per step, and the share of steps that ended higher than the one before."""
    idx = np.arange(1, growth_steps, dtype=float)
    ends = np.asarray([meas.steps[i].end for i in range(1, growth_steps)], dtype=float)
    slope = float(np.polyfit(idx, ends, 1)[0]) if ends.size >= 2 else 0.0
    rising = float(np.mean(np.diff(ends) > 0)) if ends.size >= 2 else 0.0
    return ends, slope, rising


def _lines(meas: _Measurement, full: _StepMemory, small: _StepMemory | None) -> tuple[tuple[float, float], tuple[float, float]]:
    """Activations, and the other temporaries, alive at the forward/backward peak: lines in the batch size."""
    def split(r: _StepMemory) -> tuple[float, float]:
        act = r.fb_parts[0]
        return act, r.fb_peak - r.start - act - (r.fb_parts[1] - r.grads_start)

    fa, ft = split(full)
    sa, st = split(small) if small is not None else (None, None)
    return _line(meas.batch, fa, meas.half, sa), _line(meas.batch, ft, meas.half, st)


def _peak_model(meas: _Measurement, steady: _StepMemory, half: _StepMemory | None) -> _Model:
    """The peak against the batch, from the steady step and the half-batch step."""
    act_line, tmp_line = _lines(meas, steady, half)
    opt_tmp = steady.opt_peak - steady.opt_start if steady.has_opt else 0.0
    opt_rest = (steady.opt_start - steady.start + steady.grads_start - meas.grads) if steady.has_opt else 0.0
    held = steady.start - meas.params - meas.state - steady.grads_start
    return _Model(meas.params, meas.grads, steady.grads_start, steady.fb_parts[1] - steady.grads_start, meas.state,
                  held, act_line, tmp_line, opt_tmp, opt_rest, steady.has_opt)


def _checkpoint_share(steady: _StepMemory) -> float:
    """Share of the activations kept when every block is checkpointed: what runs outside the blocks, each block's
    inputs, and one block's activations at a time (recomputed in backward)."""
    blocks = {n: v for n, v in steady.per_block.items() if n}
    total = sum(steady.per_block.values())
    if len(blocks) < 2 or total <= 0:
        return 1.0
    kept = steady.per_block.get("", 0) + sum(steady.block_inputs.get(n, 0) for n in blocks) + max(blocks.values())
    return min(1.0, kept / total)


def _batch_curve(model: _Model, meas: _Measurement, peak: float, half: _StepMemory | None,
                 max_batch: int | None) -> pd.DataFrame:
    """Estimated peak at powers of two up to 8× the batch (or twice the largest that fits), with the measured points."""
    b = meas.batch
    top = max(8 * b, 2 * (max_batch or 0))
    sizes = sorted({2**i for i in range(int(math.log2(top)) + 1)} | {b, meas.half or b, max_batch or b})
    curve = pd.DataFrame({"batch_size": sizes, "peak_mib": [model.peak(x) / MIB for x in sizes]})
    measured = {b: peak, **({meas.half: max(half.fb_peak, half.opt_peak)} if half is not None else {})}
    curve["measured_mib"] = [measured[x] / MIB if x in measured else math.nan for x in sizes]
    return curve


def _steps_table(meas: _Measurement, growth_steps: int) -> pd.DataFrame:
    kinds = {meas.half_step: "half batch", meas.bf16_step: "bf16", meas.bf16_half_step: "bf16, half batch"}
    return pd.DataFrame([{
        "step": i, "batch_size": meas.half if i in (meas.half_step, meas.bf16_half_step) else meas.batch,
        "kind": kinds.get(i, "growth"), "start_mib": r.start / MIB, "fb_peak_mib": r.fb_peak / MIB,
        "opt_peak_mib": r.opt_peak / MIB if r.has_opt else math.nan, "end_mib": r.end / MIB,
        "activations_mib": r.activations / MIB if (i == meas.steady or i >= growth_steps) else math.nan,
    } for i, r in sorted(meas.steps.items())])


Finding = tuple  # (status, text for the summary, advice or None)


def _leak_findings(held: float, activations: float, peak: float, slope: float, rising: float, growth_steps: int,
                   held_threshold: float, growth_threshold: float) -> list[Finding]:
    """WARNs for memory held between steps beyond the accounted parts, and for memory that grows step by step."""
    out: list[Finding] = []
    if held > max(held_threshold * activations, 0.05 * peak, 64 * 1024):
        out.append((Status.WARN, f"{_mib(held)} stay allocated between steps beyond parameters, gradients and "
                                 "optimizer state",
                    f"{_mib(held)} is held from one step into the next that is not parameters, gradients or optimizer "
                    "state: the step (or something it stores) keeps a tensor with its graph alive, e.g. `total += "
                    "loss` or `losses.append(loss)`; keep loss.item() or loss.detach() instead."))
    # allocation counts are exact bytes, so a small slope is real when most steps end higher than the one before
    if slope > max(growth_threshold * peak, 4096) and rising >= 2 / 3:
        out.append((Status.WARN, f"memory grows by {_mib(slope)} per step over {growth_steps} steps",
                    f"Memory grows by {_mib(slope)} per step (fitted over steps 2–{growth_steps}); after 1,000 steps "
                    f"that is {_mib(1000 * slope)} more. Something keeps every step's autograd graph alive (a list of "
                    "losses, a running `total += loss`): store loss.item() / loss.detach()."))
    return out


def _fit_verdict(peak: float, limit: float, limit_from: str, headroom: float, max_batch: int | None,
                 strategies: pd.DataFrame, shards: dict[str, int | None],
                 meas: _Measurement) -> tuple[Finding, str, dict[str, Any]]:
    """PASS with headroom; WARN under it or when only another single-device option fits; FAIL when none does (the
    advice names the sharding over the smallest N that fits). Returns the finding, the recommendation, metrics."""
    fitting = strategies[strategies["fits"].astype(bool)]
    singles = fitting[(fitting["devices"] == 1) & (fitting["option"] != "as is")]
    roomy = singles[singles["headroom"] >= headroom]
    choice = roomy if not roomy.empty else singles
    extra = {f"smallest_n_{o.replace(' ', '_').replace('-', '_')}": (n if n is not None else math.nan)
             for o, n in shards.items()}
    room = 1 - peak / limit
    if room >= headroom:
        return (Status.PASS, f"fits {limit_from} with {room:.0%} headroom (up to batch {max_batch})", None), "as is", extra
    if peak <= limit:
        advice = (f"The step peaks at {_mib(peak)} of {_mib(limit)} ({room:.0%} headroom, under {headroom:.0%}): "
                  + (_option_advice(choice.iloc[0]) if not choice.empty else "leave room for longer inputs and evaluation."))
        return (Status.WARN, f"only {room:.0%} headroom under {limit_from}", advice), \
            (_option_name(choice.iloc[0]) if not choice.empty else "as is"), extra
    if not choice.empty:
        return (Status.WARN, f"does not fit {limit_from} as is, {choice.iloc[0]['option']} does",
                f"The step needs {_mib(peak)} of {_mib(limit)}: " + _option_advice(choice.iloc[0])), \
            _option_name(choice.iloc[0]), extra
    found = {o: n for o, n in shards.items() if n is not None}
    text = f"does not fit {limit_from} and no single-device option does"
    if not found:
        return (Status.FAIL, text, f"Nothing fits {_mib(limit)}, not even full FSDP over {max(SHARDS)} devices: use a "
                                   "smaller model, or combine FSDP with activation checkpointing and bf16."), "none", extra
    best = min(found, key=lambda o: (found[o], o != "optimizer-state sharding"))  # fewest devices, then less invasive
    n = found[best]
    row = strategies[(strategies["option"] == best) & (strategies["devices"] == n)]
    others = "; ".join(f"{o} needs N={v}" for o, v in found.items() if o != best)
    advice = (f"Nothing on one device fits {_mib(limit)} (the step needs {_mib(peak)}; optimizer state alone "
              f"{_mib(meas.state)}): shard with {best} over N={n} devices (the smallest N that fits), estimated "
              f"{float(row['peak_mib'].iloc[0]):,.1f} MiB per device" + (f"; {others}." if others else "."))
    return (Status.FAIL, text, advice), f"{best} over N={n}", extra


def _option_name(row: Any) -> str:
    return str(row["option"]) + (f" over N={int(row['devices'])}" if int(row["devices"]) > 1 else "")


def _rank(s: Status) -> int:
    return [Status.PASS, Status.SKIP, Status.WARN, Status.FAIL, Status.ERROR].index(s)


def _option_advice(row: Any) -> str:
    where = f" over N={int(row['devices'])} devices" if int(row["devices"]) > 1 else ""
    return (f"use {row['option']}{where} (estimated peak {row['peak_mib']:,.1f} MiB, "
            f"{row['headroom']:.0%} headroom; cost: {row['cost']}).")
