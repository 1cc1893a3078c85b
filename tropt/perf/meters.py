"""The allocator meters of ``perf.memory``: what one step allocates, and what is alive at its peak instant.

Ground truth is the allocator: ``torch.cuda.max_memory_allocated`` on CUDA (:class:`CudaMeter`), and
``torch.profiler(profile_memory=True)``'s allocation events on CPU (:class:`ProfilerMeter`, replayed in time order).
Markers dropped into that timeline (step begin, ``optimizer.step``, each gradient accumulated, each tensor saved for
and released by backward, counted by :class:`Tracker`) say what was alive at each phase's peak.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..errors import TroptError

MIB = 2**20
GIB = 2**30


class _Saved:
    """Keeps a saved-for-backward tensor; its deletion (the graph releasing it) updates the live count."""

    __slots__ = ("key", "t", "tracker")

    def __init__(self, t: torch.Tensor, key: int, tracker: Tracker) -> None:
        self.t, self.key, self.tracker = t, key, tracker

    def __del__(self) -> None:
        self.tracker.release(self.key)


class Tracker:
    """What is alive during a step: activations saved for backward (live, by storage) and gradients.

    ``mark`` is called whenever either changes, so the meter can say what was alive at the peak instant.
    """

    def __init__(self, excluded: set[int | None], mark: Callable[[], None]) -> None:
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

    def start(self, model: nn.Module, excluded_batch: set[int | None]) -> None:
        self.active = True
        self.generation += 1  # a graph kept from an earlier step and released now is not this step's activation
        self.batch = excluded_batch
        self.act_live = self.act_peak = 0
        self.per_block, self.block_inputs = {}, {}
        self.grads_seen = {id(p) for p in model.parameters() if p.grad is not None}
        self.grad_live = sum(storage_bytes(p.grad) for p in model.parameters() if p.grad is not None)

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
            self.grad_live += storage_bytes(p.grad)
            self.mark()

    def state(self) -> tuple[int, int]:
        return self.act_live, self.grad_live


def ptr(t: torch.Tensor) -> int | None:
    """The address of a tensor's storage (None for tensors without one)."""
    try:
        return t.untyped_storage().data_ptr()
    except Exception:  # noqa: BLE001 - sparse, meta or subclass tensors
        return None


def storage_bytes(t: torch.Tensor) -> int:
    try:
        return int(t.untyped_storage().nbytes())
    except Exception:  # noqa: BLE001
        return int(t.numel() * t.element_size())


def unique_bytes(tensors: Iterator[torch.Tensor]) -> int:
    """Bytes of distinct storages (tied weights and views counted once)."""
    seen: dict[int, int] = {}
    for t in tensors:
        try:
            s = t.untyped_storage()
            seen[s.data_ptr()] = max(seen.get(s.data_ptr(), 0), s.nbytes())
        except Exception:  # noqa: BLE001
            seen[id(t)] = t.numel() * t.element_size()
    return sum(seen.values())


@dataclass
class StepMemory:
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


class Meter:
    """Markers in the allocation timeline; subclasses read the allocator (CUDA) or the profiler (CPU)."""

    ground_truth = ""

    def __init__(self) -> None:
        self.steps: dict[int, StepMemory] = {}
        self.tracker: Tracker | None = None
        self.step: int | None = None
        self.phase: str | None = None

    def parts(self) -> tuple[int, int]:
        return self.tracker.state() if self.tracker is not None else (0, 0)

    def begin(self, i: int) -> None:
        self.steps[i] = StepMemory()
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

    def __enter__(self) -> Meter:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


class CudaMeter(Meter):
    """``torch.cuda`` allocator statistics: the peak between two markers is read and reset at each marker."""

    ground_truth = "torch.cuda.max_memory_allocated"

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device = device
        self.last_parts = (0, 0)

    def __enter__(self) -> CudaMeter:
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


class ProfilerMeter(Meter):
    """``torch.profiler(profile_memory=True)``: allocation events and zero-length markers, replayed afterwards."""

    ground_truth = "torch.profiler (profile_memory=True)"

    def __init__(self) -> None:
        super().__init__()
        self.markers: list[tuple] = []

    def __enter__(self) -> ProfilerMeter:
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
            events = list(self.prof.profiler.kineto_results.events())  # type: ignore[union-attr]
        except AttributeError as exc:  # a torch whose profiler keeps its events elsewhere
            raise TroptError(f"perf.memory cannot read torch.profiler's memory events in torch {torch.__version__} "
                             f"({exc})",
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
