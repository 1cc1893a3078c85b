"""perf.memory's allocator meters: the CUDA meter's marker logic against a scripted allocator."""

from __future__ import annotations

import torch


def test_cuda_meter_reads_each_phase_peak_and_the_parts_alive_then(monkeypatch):
    """The CUDA path (no GPU here): a scripted allocator stands in for torch.cuda's statistics, so the marker logic
    (peak since the last marker, reset, the parts alive before it) is checked against known numbers."""
    from tropt.perf import meters

    alloc = {"now": 1000, "max": 1000}
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a: alloc["now"])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: alloc["max"])
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a: alloc.update(max=alloc["now"]))

    def to(now, peak=None):  # allocate/free to ``now``, passing through ``peak``
        alloc["max"] = max(alloc["max"], peak or now, now)
        alloc["now"] = now

    class State:  # what the tracker would report: (activations, gradients) alive
        parts = (0, 0)

    meter = meters.CudaMeter(torch.device("cuda"))
    meter.tracker = type("T", (), {"state": lambda self: State.parts})()
    with meter:  # base 1000
        to(1500)  # the copy: 500 bytes resident
        meter.begin(1)
        to(1800)
        State.parts = (300, 0)
        meter.mark()  # forward saved 300
        to(1900, peak=2600)  # backward: a 700-byte temporary while the 300 are alive
        State.parts = (0, 400)
        meter.mark()
        meter.optimizer_step()
        to(1900, peak=2200)  # optimizer temporaries
        meter.end()
    rec = meter.steps[1]
    assert (rec.start, rec.fb_peak, rec.fb_parts) == (500, 1600, (300, 0))
    assert (rec.opt_start, rec.opt_peak, rec.opt_parts, rec.end) == (900, 1200, (0, 400), 900) and rec.has_opt
