"""perf.precision with known answers; the user's objects are never touched."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pytest
import torch
from support.perf_setups import mlp_setup, quiet_machine  # noqa: F401 - quiet_machine is an autouse fixture
from torch.nn import functional as F

from tropt.perf import check_precision
from tropt.result import CheckResult, Status
from tropt.testing import untouched


def test_precision_on_cpu_compares_fp32_and_bf16_and_skips_fp16_with_the_reason(sample_module):
    s = sample_module.make_setup()
    with untouched(s):
        r = check_precision(s, steps=6, warmup=1, progress=False)
    t = r.tables["precisions"].set_index("precision")
    assert t.loc["fp32", "status"] == "measured" and t.loc["bf16", "status"] == "measured"
    assert (t.loc["fp16", "status"] == "skipped" and "CUDA" in t.loc["fp16", "reason"]
            and "CPU" in t.loc["fp16", "reason"])
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
    assert torch.allclose(torch.as_tensor(r.series["loss_fp32"][1:]), torch.as_tensor(ref.series["loss_fp32"][1:]),
                          rtol=1e-5)


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
        r = check_precision(tiny_setup, precisions=("fp32", "bf16"), steps=4, warmup=0, max_deviation=0.0,
                            progress=False)
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
