"""perf.throughput and perf.precision with known answers; the user's objects are never touched."""

from __future__ import annotations

import time

import matplotlib.pyplot as plt
import pytest
import torch
from torch import nn
from torch.nn import functional as F

import tropt
from tropt.perf import check_precision, check_throughput
from tropt.result import CheckResult, Status
from tropt.testing import untouched


class SlowDataset(torch.utils.data.Dataset):
    """Each sample takes 10 ms to "decode": a batch of 16 waits ~160 ms for a step that computes in ~1 ms
    (a margin wide enough to hold on a loaded machine)."""

    def __init__(self, n=256, d=8, delay=0.01):
        g = torch.Generator().manual_seed(0)
        self.x, self.y, self.delay = torch.randn(n, d, generator=g), torch.randint(0, 3, (n,), generator=g), delay

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        if self.delay:
            time.sleep(self.delay)
        return self.x[i], self.y[i]


@pytest.fixture(autouse=True)
def quiet_machine(monkeypatch):
    """These tests run real steps on a shared machine: the oversubscription note (tested with injected timings in
    test_perf_timing.py) would depend on the machine's load, so it is off here."""
    from tropt.perf import precision as prec
    from tropt.perf import throughput as thr

    monkeypatch.setattr(prec, "oversubscription", lambda *a, **k: [])
    monkeypatch.setattr(thr, "oversubscription", lambda *a, **k: [], raising=False)


def mlp_setup(data, **kw):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))
    return tropt.Setup(model, lambda m, b: F.cross_entropy(m(b[0]), b[1]),
                       lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3), data, **kw)


def test_throughput_flags_a_slow_dataset():
    s = mlp_setup(torch.utils.data.DataLoader(SlowDataset(), batch_size=16))
    with untouched(s):
        r = check_throughput(s, warmup=1, steps=4, profile_steps=1, progress=False)
    assert r.status == Status.WARN and r.metrics["limited_by"] == "data loading"
    assert r.metrics["data_wait_share"] > 0.2 and r.metrics["data_wait_ms"] > 100
    assert any("num_workers" in a for a in r.advice)
    assert len(r.tables["steps"]) == 4 and not r.tables["top_operators"].empty
    assert r.metrics["params_mb"] > 0 and r.metrics["rss_mb"] > 0
    r.plot()
    plt.close("all")


def test_throughput_advice_for_sub_millisecond_waits_does_not_also_ask_for_workers():
    """Waits under a millisecond (tensors in memory): workers may cost more than they save, so no advice may then
    ask for num_workers=1, prefetching or persistent workers."""
    g = torch.Generator().manual_seed(0)
    ds = torch.utils.data.TensorDataset(torch.randn(256, 8, generator=g), torch.randint(0, 3, (256,), generator=g))
    s = mlp_setup(torch.utils.data.DataLoader(ds, batch_size=8))
    r = check_throughput(s, warmup=3, steps=5, profile=False, data_threshold=0.0, progress=False)  # always WARN
    assert r.status == Status.WARN and r.metrics["data_wait_ms"] < 1.0, r.summary
    assert len(r.advice) == 1 and "may cost more than they save" in r.advice[0], r.advice
    assert not any(w in r.advice[0] for w in ("num_workers=", "prefetch_factor", "persistent_workers"))
    # a loader that already has workers is told to try without them (its waits are too timing-dependent to run here)
    from tropt.perf.throughput import _cheap_batches_advice

    assert "try num_workers=0 instead of 2" in _cheap_batches_advice(mlp_setup(torch.utils.data.DataLoader(ds, num_workers=2)))


def test_throughput_in_memory_batches_are_compute_bound():
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(256, 8, generator=g), torch.randint(0, 3, (256,), generator=g)) for _ in range(4)]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 3))
    s = tropt.Setup(model, lambda m, b: F.cross_entropy(m(b[0]), b[1]),
                    lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3), batches)
    with untouched(s):
        r = check_throughput(s, warmup=2, steps=6, profile=False, progress=False)
    # waiting for a list element is a pointer copy; a 512-wide MLP step on 256 samples is milliseconds
    assert r.status == Status.PASS and r.metrics["limited_by"] == "compute", r.summary
    assert r.metrics["samples_per_s"] > 0
    back = CheckResult.from_dict(r.to_dict())
    back.plot()
    plt.close("all")


def test_top_operators_sum_one_profiler_session_per_step_and_stop_early_on_op_heavy_steps(monkeypatch):
    """Each profiled step is its own profiler session (the events of three op-heavy steps in one session held a
    gigabyte); rows are summed by operator, and a step heavier than the budget is profiled alone."""
    from tropt.perf import throughput

    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(32, 8, generator=g), torch.randint(0, 3, (32,), generator=g)) for _ in range(4)]
    torch.manual_seed(0)
    s = tropt.Setup(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)), lambda m, b: F.cross_entropy(m(b[0]), b[1]),
                    lambda m: torch.optim.SGD(m.parameters(), lr=0.1), batches)
    r = check_throughput(s, warmup=1, steps=3, profile_steps=3, progress=False)
    ops = r.tables["top_operators"].set_index("operator")
    assert r.metrics["profiled_steps"] == 3
    assert ops.loc["aten::addmm", "calls"] == 3 * 2  # two Linear layers a step, three steps summed
    monkeypatch.setattr(throughput, "MAX_PROFILED_OPS", 10)
    r = check_throughput(s, warmup=1, steps=3, profile_steps=3, progress=False)
    assert r.metrics["profiled_steps"] == 1
    assert r.tables["top_operators"].set_index("operator").loc["aten::addmm", "calls"] == 2


def test_precision_on_cpu_compares_fp32_and_bf16_and_skips_fp16_with_the_reason(sample_module):
    s = sample_module.make_setup()
    with untouched(s):
        r = check_precision(s, steps=6, warmup=1, progress=False)
    t = r.tables["precisions"].set_index("precision")
    assert t.loc["fp32", "status"] == "measured" and t.loc["bf16", "status"] == "measured"
    assert t.loc["fp16", "status"] == "skipped" and "CUDA" in t.loc["fp16", "reason"] and "CPU" in t.loc["fp16", "reason"]
    assert t.loc["tf32", "status"] == "skipped" and "Ampere" in t.loc["tf32", "reason"]
    assert t.loc["fp32", "loss_deviation"] == 0 and bool(t.loc["fp32", "stable"])
    assert t.loc["bf16", "loss_deviation"] < 0.05 and bool(t.loc["bf16", "stable"])  # same steps, bf16 rounding only
    assert t.loc["bf16", "activation_mb"] < t.loc["fp32", "activation_mb"]  # bf16 saves half-size activations
    assert r.metrics["recommended"] in ("fp32", "bf16")
    assert torch.backends.cuda.matmul.allow_tf32 is False or torch.cuda.is_available()
    r.plot()
    CheckResult.from_dict(r.to_dict()).plot()
    plt.close("all")


def amp_step(ctx, micro_batches):
    """A correct fp16 + GradScaler step that uses ctx.scaler unconditionally, as AMP training loops do."""
    n = sum(len(mb[1]) for mb in micro_batches)
    for x, y in micro_batches:
        with ctx.autocast():
            loss = F.cross_entropy(ctx.model(x), y)
        ctx.scaler.scale(loss * len(y) / n).backward()
    ctx.scaler.unscale_(ctx.optimizer)
    torch.nn.utils.clip_grad_norm_(ctx.model.parameters(), ctx.grad_clip)
    ctx.scaler.step(ctx.optimizer)
    ctx.scaler.update()
    ctx.optimizer.zero_grad(set_to_none=True)


def test_precision_runs_a_user_amp_step_in_precisions_without_a_scaler():
    """The fp32 reference (and bf16) runs have no loss scaling: the step gets a pass-through scaler, so its fp32
    losses are those of the standard step in fp32."""
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(32, 8, generator=g), torch.randint(0, 3, (32,), generator=g)) for _ in range(6)]
    s = mlp_setup(batches, step=amp_step, precision="fp16", use_scaler=True, grad_clip=1.0, accumulation_steps=2)
    with untouched(s):
        r = check_precision(s, precisions=("fp32", "bf16"), steps=4, warmup=1, progress=False)
    t = r.tables["precisions"].set_index("precision")
    assert t.loc["fp32", "status"] == "measured" and t.loc["bf16", "status"] == "measured", r.summary
    ref = check_precision(mlp_setup(batches, grad_clip=1.0, accumulation_steps=2), precisions=("fp32",), steps=4,
                          warmup=1, progress=False)
    # the step returns no loss and calls no ctx.loss_fn: losses come from an extra forward, from the second step on
    assert torch.allclose(torch.as_tensor(r.series["loss_fp32"][1:]), torch.as_tensor(ref.series["loss_fp32"][1:]), rtol=1e-5)


def test_precision_of_an_fp16_setup_on_cpu_is_reported_as_not_measured(tiny_setup):
    s = tiny_setup.replace(precision="fp16", use_scaler=True)
    r = check_precision(s, precisions=("fp32", "bf16", "fp16"), steps=3, warmup=0, progress=False)
    assert r.status == Status.WARN and r.tables["precisions"].set_index("precision").loc["fp16", "status"] == "skipped"
    assert len(r.advice) == 1 and "could not run" not in r.advice[0], r.advice
    assert "fp16 is not measured on this CPU" in r.advice[0] and r.metrics["recommended"] in r.advice[0]
    r = check_precision(s, precisions=("fp32",), steps=3, warmup=0, progress=False)  # fp16 left out by the caller
    assert "fp16 was not among the precisions compared" in r.advice[0], r.advice


def test_precision_guardrail_rejects_an_unstable_precision(tiny_setup):
    # a guardrail of 0 deviation: bf16's rounding alone puts it outside, fp32 (the reference) stays in
    with untouched(tiny_setup):
        r = check_precision(tiny_setup, precisions=("fp32", "bf16"), steps=4, warmup=0, max_deviation=0.0, progress=False)
    t = r.tables["precisions"].set_index("precision")
    assert not bool(t.loc["bf16", "stable"]) and r.metrics["recommended"] == "fp32"
    assert "unstable" in r.summary


@pytest.mark.parametrize("bf16_ms, expected", [(1.25, "fp32"), (0.5, "bf16")])
def test_precision_keeps_the_setups_precision_unless_another_beats_the_speedup_threshold(tiny_setup, monkeypatch,
                                                                                         bf16_ms, expected):
    import numpy as np

    from tropt.perf import precision as prec

    real = prec._measure

    def timed(setup, order, steps, warmup, seed, *a, **k):  # the real runs, with known step times
        runs, reasons, fp32 = real(setup, order, steps, warmup, seed, *a, **k)
        for p, out in runs.items():
            out["times"] = np.full(len(out["times"]), (1.26 if p == "fp32" else bf16_ms) / 1e3)
        return runs, reasons, fp32

    monkeypatch.setattr(prec, "_measure", timed)
    r = check_precision(tiny_setup, precisions=("fp32", "bf16"), steps=4, warmup=0, progress=False)
    assert r.metrics["fastest_stable"] == "bf16"
    assert r.metrics["recommended"] == expected, r.summary
    assert r.summary.startswith(f"recommend {expected}:")
    if expected == "fp32":  # 1.26 vs 1.25 ms is noise, not a reason to switch
        assert r.status == Status.PASS and not r.advice
        assert "bf16 is only 1.01× faster" in r.summary and "1.2× speedup threshold" in r.summary
    else:
        assert r.status == Status.WARN and "2.52× faster" in r.advice[0]


def test_precision_batch_size_search_keeps_the_curve(tiny_setup):
    with untouched(tiny_setup):
        r = check_precision(tiny_setup, precisions=("fp32",), steps=3, warmup=0, batch_size_search=True,
                            max_doublings=2, progress=False)
    curve = r.tables["batch_size"]
    assert list(curve["batch_size"]) == [16, 32, 64]
    assert (curve["samples_per_s"] > 0).all()


def test_bad_options_say_how_to_fix(tiny_setup):
    with pytest.raises(tropt.TroptError, match="unknown precision"):
        check_precision(tiny_setup, precisions=("fp8",), progress=False)
    with pytest.raises(tropt.TroptError, match="steps"):
        check_throughput(tiny_setup, steps=1, progress=False)


def test_registered_and_run_by_diagnose(sample_module):
    s = sample_module.make_setup()
    with untouched(s):
        rep = tropt.diagnose(s, checks=["perf"], progress=False)
    assert rep.checks == ["perf.throughput", "perf.precision", "perf.memory"]
    assert all(r.status in (Status.PASS, Status.WARN) for r in rep), [r.summary for r in rep]


def test_profiler_start_and_stop_lines_stay_out_of_the_output():
    """torch's profiler library prints start/stop markers to file descriptor 2 (a notebook shows them in the cell)."""
    import subprocess
    import sys

    code = ("import torch, tropt\nfrom torch import nn\nfrom torch.nn import functional as F\n"
            "x, y = torch.randn(16, 4), torch.randint(0, 2, (16,))\n"
            "s = tropt.Setup(nn.Linear(4, 2), lambda m, b: F.cross_entropy(m(b[0]), b[1]), "
            "lambda m: torch.optim.SGD(m.parameters(), lr=0.1), [(x, y)] * 4)\n"
            "from tropt.perf import check_throughput\nr = check_throughput(s, warmup=1, steps=3, profile_steps=1, progress=False)\n"
            "print(r.status.value, len(r.tables['top_operators']))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "profiler_start" not in out.stderr and "profiler_stop" not in out.stderr, out.stderr
    assert int(out.stdout.split()[1]) > 0  # the profile itself still ran
