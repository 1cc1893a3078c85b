"""Timing verdicts that survive noise, on injected timings: nothing here depends on how fast this machine is."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tropt.perf import _timing, check_precision, check_throughput
from tropt.perf import precision as prec
from tropt.perf import throughput as thr
from tropt.perf.precision import choose
from tropt.perf.throughput import data_verdict
from tropt.result import Status

QUIET = {"torch_threads": 1, "cpu_count": 2, "load_avg": 0.1}
LOADED = {"torch_threads": 2, "cpu_count": 2, "load_avg": 4.0}


def test_median_interval_by_order_statistics():
    med, lo, hi = _timing.median_interval(np.arange(1, 21))
    assert (med, lo, hi) == (10.5, 5.0, 16.0)  # ranks floor((20 - 1.96 sqrt 20) / 2) = 5 and 21 - 5
    assert _timing.median_interval([3.0, 1.0, 2.0]) == (2.0, 1.0, 3.0)  # too few for ranks: the full range


def test_speedup_pairs_rounds_so_shared_noise_cancels():
    noise = np.array([1, 9, 1, 1, 5, 1, 1, 1, 7, 1, 1, 1], dtype=float)  # bursts hit both sides of a round
    s, lo, hi = _timing.speedup(2.0 * noise, noise)
    assert s == lo == hi == 2.0 and _timing.clear((s, lo, hi))
    assert not _timing.clear(_timing.speedup(noise, noise[::-1]))  # unpaired bursts: the interval includes 1


def _times(ratios, base=1.0):
    """fp32 and candidate times whose per-round ratios (fp32 / candidate) are ``ratios``."""
    cand = np.full(len(ratios), base)
    return cand * np.asarray(ratios), cand


def test_choose_says_too_noisy_when_the_interval_includes_one():
    """The demo's case: bf16 looked 5.38x faster on a loaded machine. A median speed-up above the threshold whose
    interval includes 1 is not a recommendation."""
    fp32, bf16 = _times([0.5, 0.6, 0.8, 0.9, 1.3, 1.5, 2.0, 3.0, 5.0, 6.0])
    d = choose({"fp32": fp32, "bf16": bf16}, {"fp32": True, "bf16": True}, "fp32")
    assert d["verdict"] == "noisy" and d["recommended"] == "fp32" and not d["warn"] and d["candidate"] == "bf16"
    assert d["speedups"]["bf16"][1] < 1 < d["speedups"]["bf16"][2]


def test_choose_keeps_fp32_when_bf16_is_clearly_slower():
    """On one thread the truth was the opposite: fp32 1.07 ms against bf16 9.97 ms."""
    rng = np.random.default_rng(0)
    fp32 = 1.07e-3 * (1 + 0.05 * rng.random(12))
    bf16 = 9.97e-3 * (1 + 0.05 * rng.random(12))
    d = choose({"fp32": fp32, "bf16": bf16}, {"fp32": True, "bf16": True}, "fp32")
    assert d["recommended"] == "fp32" and d["verdict"] == "keep" and not d["warn"]
    assert d["speedups"]["bf16"][2] < 1  # slower beyond noise


@pytest.mark.parametrize("ratios, verdict, warn", [
    ([2.4, 2.5, 2.6, 2.5, 2.45, 2.55, 2.5, 2.5, 2.6, 2.4], "clear", True),       # clearly faster beyond the threshold
    ([1.05, 1.1, 1.3, 1.25, 1.3, 1.4, 1.35, 1.3, 1.5, 1.28], "likely", False),   # faster beyond 1, low end under 1.2
    ([1.05, 1.06, 1.04, 1.05, 1.07, 1.05, 1.06, 1.04, 1.05, 1.06], "marginal", False),  # real but under the threshold
])
def test_choose_recommends_only_beyond_noise_and_warns_only_when_clearly_slower(ratios, verdict, warn):
    fp32, bf16 = _times(ratios)
    d = choose({"fp32": fp32, "bf16": bf16}, {"fp32": True, "bf16": True}, "fp32")
    assert d["verdict"] == verdict and d["warn"] is warn
    assert d["recommended"] == ("fp32" if verdict == "marginal" else "bf16")


def test_choose_an_unstable_setup_precision_gives_way():
    fp32, bf16 = _times([0.5] * 10)  # bf16 is slower, but the Setup's bf16 is unstable
    d = choose({"fp32": fp32, "bf16": bf16}, {"fp32": True, "bf16": False}, "bf16")
    assert d["verdict"] == "unstable" and d["recommended"] == "fp32" and d["warn"]


def test_oversubscription_signals():
    steady = [1.0, 1.02, 0.99, 1.01, 1.0, 1.03, 0.98, 1.0, 1.01, 1.0]
    assert _timing.oversubscription(steady, QUIET) == []
    bursty = [1, 1, 25, 1, 1, 30, 1, 1, 28, 1, 1, 26]
    assert any("vary" in r for r in _timing.oversubscription(bursty, QUIET))
    assert any("load average 4.0" in r for r in _timing.oversubscription(steady, LOADED))
    assert any("one thread runs a step 3.00x faster" in r
               for r in _timing.oversubscription(steady, {**QUIET, "torch_threads": 2}, probe=(3.0, 2.5, 3.5)))
    assert _timing.oversubscription(steady, LOADED, device_type="cuda") == []  # threads and load judge CPU steps only
    assert "torch.set_num_threads(1)" in _timing.oversubscription_advice({**LOADED, "load_avg": 1.2})


def test_thread_probe_with_an_injected_clock_restores_threads():
    """A step that takes 5 time units at torch's threads and 1 at one thread (oversubscribed)."""
    now = [0.0]

    def clock():
        return now[0]

    def step():
        now[0] += 5.0 if torch.get_num_threads() > 1 else 1.0

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        s, lo, hi = _timing.thread_probe(step, rounds=4, clock=clock)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert (s, lo, hi) == (5.0, 5.0, 5.0)
    torch.set_num_threads(1)
    try:
        assert _timing.thread_probe(step, clock=clock) is None  # one thread already: nothing to compare
    finally:
        torch.set_num_threads(before)


def test_precision_check_reports_noise_and_oversubscription_from_injected_timings(tiny_setup, monkeypatch):
    """The check end to end with its timings injected: too noisy to recommend bf16 (PASS, kept fp32), and the
    oversubscription the probe found is named in the summary and the advice."""
    real = prec._measure
    fp32, bf16 = _times([0.5, 0.6, 0.8, 0.9, 1.3, 1.5, 2.0, 3.0, 5.0, 6.0], base=1e-3)

    def measured(setup, order, steps, warmup, seed, *a, **k):
        runs, reasons, run = real(setup, order, steps, warmup, seed, *a, **k)
        runs["fp32"]["times"], runs["bf16"]["times"] = fp32, bf16
        return runs, reasons, run

    monkeypatch.setattr(prec, "_measure", measured)
    monkeypatch.setattr(prec, "machine_load", lambda: dict(LOADED))
    monkeypatch.setattr(prec, "thread_probe", lambda step, **k: (3.0, 2.5, 3.5))
    r = check_precision(tiny_setup, precisions=("fp32", "bf16"), steps=10, warmup=0, progress=False)
    assert r.status == Status.PASS and r.metrics["recommended"] == "fp32", r.summary
    assert r.metrics["timing_verdict"] == "noisy" and "timings too noisy to decide" in r.summary
    assert (r.metrics["oversubscribed"] and "oversubscription" in r.summary
            and "one thread runs a step 3.00x" in r.summary)
    assert any("torch.set_num_threads" in a for a in r.advice) and any("Rerun with more steps" in a for a in r.advice)
    t = r.tables["precisions"].set_index("precision")
    assert t.loc["bf16", "speedup_low"] < 1 < t.loc["bf16", "speedup_high"]
    assert t.loc["fp32", "step_ms_min"] <= t.loc["fp32", "step_ms"] <= t.loc["fp32", "step_ms_max"]


def test_precision_runs_interleave_and_keep_their_own_losses(tiny_setup):
    """Interleaving the precisions' steps changes no run's losses: each keeps its own RNG stream and copy."""
    together = check_precision(tiny_setup, precisions=("fp32", "bf16"), steps=4, warmup=1, progress=False)
    alone = check_precision(tiny_setup, precisions=("fp32",), steps=4, warmup=1, progress=False)
    np.testing.assert_allclose(together.series["loss_fp32"], alone.series["loss_fp32"], rtol=1e-6)
    assert len(together.series["step_ms_bf16"]) == 4


def test_data_verdict_needs_the_interval_above_the_threshold():
    step = np.ones(12)
    assert data_verdict(np.full(12, 0.5), step, 0.2)["bound"]
    noisy = data_verdict(np.array([0.05, 0.1, 0.15, 0.25, 0.3, 0.3, 0.3, 0.35, 0.4, 0.5, 0.05, 0.1]), step, 0.2)
    assert noisy["noisy"] and not noisy["bound"]
    assert not data_verdict(np.full(12, 0.01), step, 0.2)["bound"]


def test_throughput_names_oversubscription_from_an_injected_probe(tiny_setup, monkeypatch):
    monkeypatch.setattr(thr, "machine_load", lambda: dict(LOADED))
    monkeypatch.setattr(thr, "thread_probe", lambda step, **k: (4.0, 3.0, 5.0))
    r = check_throughput(tiny_setup, warmup=1, steps=4, profile=False, progress=False)
    assert r.metrics["oversubscribed"] and "oversubscription" in r.summary and "4.00x faster" in r.summary
    assert any("torch.set_num_threads" in a for a in r.advice)
    assert r.metrics["step_ms_min"] <= r.metrics["step_ms"] <= r.metrics["step_ms_max"]
