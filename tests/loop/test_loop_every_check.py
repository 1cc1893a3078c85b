"""Every stage-4 invariance check together: standard_step passes them all, dict batches work, a broken step is a
clear ERROR in each, and every result plots."""

from __future__ import annotations

import pytest
import torch
from support import make_classification
from support.loop_cases import mlp_setup, run_all, step_loss_not_divided
from torch import nn
from torch.nn import functional as F

import tropt
from tropt.result import Status


@pytest.mark.parametrize("k, clip, scaler, scheduler", [
    (1, None, False, True), (4, None, False, True), (4, 0.5, False, False), (1, 0.5, True, True), (4, 0.05, True, True),
])
def test_standard_step_passes_every_check(k, clip, scaler, scheduler):
    results = run_all(mlp_setup(k=k, clip=clip, scaler=scaler, scheduler=scheduler))
    for cid, r in results.items():
        expected = (Status.SKIP if (cid == "loop.loss_scaling" and not scaler)
                    or (cid == "loop.scheduler_cadence" and not scheduler) else Status.PASS)
        assert r.status is expected, (cid, r.summary)


def test_dict_batches_work():
    x, y = make_classification(n=64, d=6, classes=3)
    batches = [{"features": x[i:i + 16], "label": y[i:i + 16], "source": "synthetic"} for i in range(0, 64, 16)]
    setup = tropt.Setup(nn.Linear(6, 3), lambda m, b: F.cross_entropy(m(b["features"]), b["label"]),
                        lambda m: torch.optim.Adam(m.parameters(), lr=1e-2), batches, accumulation_steps=2,
                        scheduler=lambda o: torch.optim.lr_scheduler.StepLR(o, 1, 0.5))
    assert {cid: r.status for cid, r in run_all(setup).items()} == {
        "loop.zero_grad": Status.PASS, "loop.accumulation": Status.PASS, "loop.loss_scaling": Status.SKIP,
        "loop.scheduler_cadence": Status.PASS, "loop.resume": Status.PASS}


def test_step_that_raises_or_never_steps_is_an_error_in_diagnose():
    def raises(ctx, mbs):
        raise RuntimeError("CUDA out of memory (pretend)")

    report = tropt.diagnose(mlp_setup(raises), checks="loop", progress=False)
    for r in report:
        if r.status is not Status.SKIP:
            assert (r.status is Status.ERROR
                    and "raised RuntimeError: CUDA out of memory (pretend)" in r.summary), r.check

    def never_steps(ctx, mbs):
        for mb in mbs:
            ctx.loss_fn(ctx.model, mb).backward()
        return None

    report = tropt.diagnose(mlp_setup(never_steps), checks="loop", progress=False)
    for r in report:
        if r.status is not Status.SKIP:
            assert r.status is Status.ERROR and "never called optimizer.step()" in r.summary, r.check
            assert "once per call" in r.advice[0]


def test_plots_draw():
    results = run_all(mlp_setup(step_loss_not_divided, k=4))
    for r in results.values():
        if r.status is not Status.SKIP:
            ax = r.plot()
            assert ax.get_title(loc="left").startswith(r.check)
