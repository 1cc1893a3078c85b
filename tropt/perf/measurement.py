"""Measuring one optimizer step's memory for ``perf.memory``: the Setup's own step runs on a copy under a meter.

:func:`measure` runs ``growth_steps`` steps, one at about half the batch and, when asked, the same two batch sizes under
bf16 autocast; saved tensors are attributed to the repeated blocks activation checkpointing would wrap
(:func:`find_blocks`), and the optimizer's state is counted from its tensors after a step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from ..core.batch import leaves
from .graphs import held_graphs
from .meters import CudaMeter, Meter, ProfilerMeter, StepMemory, Tracker, ptr, unique_bytes

if TYPE_CHECKING:
    from ..setup import Setup


def find_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
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
def block_hooks(blocks: list[tuple[str, nn.Module]], tracker: Tracker) -> Iterator[None]:
    """Attribute saved tensors to the block running, and record each block's input bytes (what checkpointing keeps)."""
    handles = []

    def pre(name: str) -> Callable:
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            tracker.block.append(name)
            size = unique_bytes(t for _, t in leaves([args, kwargs]) if ptr(t) not in tracker.excluded)
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


def state_bytes(optimizer: Any) -> tuple[int, int, int, int]:
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
    return unique_bytes(iter(tensors)), elements, scalars, most


def factored_bytes(model: nn.Module) -> int:
    """Adafactor's state without momentum: row and column statistics for matrices, a full vector otherwise (fp32)."""
    total = 0
    for p in model.parameters():
        if p.requires_grad and p.numel():
            total += 4 * ((p.shape[0] + p.numel() // p.shape[0]) if p.ndim >= 2 else p.numel())
    return total


def smaller_batch(setup: Setup, batch: Any, k: int) -> tuple[Any, int] | None:
    """About half the batch (keeping at least ``k`` samples, one per micro-batch), or None when it cannot shrink.

    Sizes and splits follow the Setup's batch layout (time-major batches, split_fn/size_fn)."""
    n = setup.size(batch)
    half = n // 2
    if half < k or half < 1:
        return None
    return setup.split(batch, sizes=[half, n - half])[0], half


@dataclass
class Measurement:
    """What :func:`measure` found: each step's memory, the resident parts in bytes, and which step is which."""

    ground_truth: str
    steps: dict[int, StepMemory]
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
    graphs: dict[int, dict[str, tuple[int, int]]]  # after each growth step: where a graph is held -> (nodes, bytes)


def _attach(model: nn.Module, opt: Any, tracker: Tracker, meter: Meter) -> list[Any]:
    """Hooks that tell the tracker of each gradient accumulated and the meter of each ``optimizer.step()``."""
    handles = [p.register_post_accumulate_grad_hook(tracker.on_grad) for p in model.parameters() if p.requires_grad]
    if opt is not None:
        handles.append(opt.register_step_pre_hook(lambda *_: meter.optimizer_step()))
    return handles


def measure(setup: Setup, growth_steps: int, bf16: bool, progress: bool) -> Measurement:
    """Run the Setup's step on a copy under the meter: ``growth_steps`` steps, one at half the batch, one in bf16."""
    from tqdm.auto import tqdm

    device = cast(torch.device, setup.device)  # Setup.__post_init__ makes it a torch.device
    meter: Meter = CudaMeter(device) if device.type == "cuda" else ProfilerMeter()
    k = setup.accumulation_steps
    batches = list(setup.batches(growth_steps))
    with meter:
        ctx = setup.build()
        model = ctx.model
        opt = getattr(ctx, "optimizer", None)
        excluded = {ptr(t) for t in [*model.parameters(), *model.buffers()]}
        tracker = Tracker(excluded, meter.mark)
        meter.tracker = tracker
        handles = _attach(model, opt, tracker, meter)
        blocks = find_blocks(model)
        grads_per_step: dict[int, int] = {}
        graphs: dict[int, dict[str, tuple[int, int]]] = {}

        def run(i: int, batch: Any, hooks: bool) -> None:
            micro = setup.split(batch, k)
            tensors = [t for _, t in leaves(batch)]
            tracker.start(model, {ptr(t) for t in tensors})  # noqa: F821 - deleted below, after the last run
            meter.begin(i)
            rec = meter.steps[i]
            rec.grads_start = tracker.grad_live
            rec.batch = unique_bytes(iter(tensors))
            saved = (torch.autograd.graph.saved_tensors_hooks(tracker.pack, tracker.unpack) if hooks
                     else contextlib.nullcontext())
            try:
                with saved, (block_hooks(blocks, tracker) if hooks else contextlib.nullcontext()):
                    out = setup.run_step(ctx, micro)  # noqa: F821 - deleted below, after the last run
                del out  # a returned loss may carry its graph: the next step must not see it
            finally:
                meter.end()
                tracker.stop()
            rec.activations = tracker.act_peak
            rec.per_block, rec.block_inputs = dict(tracker.per_block), dict(tracker.block_inputs)
            grads_per_step[i] = tracker.grad_live
            if i < growth_steps:  # what the step keeps on ctx, the model or its closure: graphs alive between steps
                graphs[i] = held_graphs(ctx, setup.step_fn)  # noqa: F821 - deleted below, after the last run

        bar = tqdm(total=growth_steps + 2, desc="perf.memory", disable=not progress, leave=False)
        try:
            for i, batch in enumerate(batches):
                run(i, batch, hooks=i == 1)
                bar.update(1)
            state, elements, scalars, per_param = state_bytes(opt)
            smaller = smaller_batch(setup, batches[1], k)
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
        params = unique_bytes(iter([*model.parameters(), *model.buffers()]))
        n_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
        block_params = [(name, unique_bytes(iter(list(mod.parameters())))) for name, mod in blocks]
        factored = factored_bytes(model)
        del ctx, model, opt
    return Measurement(meter.ground_truth, meter.steps, params, n_params, state, elements, scalars, per_param,
                       grads_per_step.get(1, 0), factored, block_params, setup.size(batches[1]),
                       smaller[1] if smaller is not None else None, 1, half_step, bf16_step, bf16_half, graphs)
