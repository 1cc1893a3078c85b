"""fp16 autocast on a CPU (issue 32): the loop checks compare in fp32 and say so, the precision-specific checks keep
fp16, the report says once why, and a planted accumulation bug is still caught."""

from __future__ import annotations

import torch
from support.loop_cases import mlp_setup

import tropt
from tropt.core.cpu_fp16 import fp16_on_cpu, runs_in_fp32
from tropt.result import Status


def _recording_step(seen: list[str]):
    """The standard step, recording the precision each call ran under (a correct loop)."""
    def step(ctx, micro_batches):
        seen.append(ctx.precision)
        return tropt.standard_step(ctx, micro_batches)
    return step


def test_loop_checks_of_an_fp16_cpu_setup_compare_in_fp32_and_say_so():
    seen: list[str] = []
    setup = mlp_setup(_recording_step(seen), k=2, scaler=True)  # precision fp16, GradScaler, CPU
    assert fp16_on_cpu(setup)
    report = tropt.diagnose(setup, checks=["loop.zero_grad"], progress=False)
    r = report["loop.zero_grad"]
    assert r.status is Status.PASS, r.summary
    assert r.metrics["ran_in_precision"] == "fp32" and r.metrics["setup_precision"] == "fp16"
    assert "compared in fp32" in r.summary and "30x slower" in r.summary
    # The check's own runs were fp32; the calls after them are diagnose's timing of the user's own (fp16) step.
    n = seen.index("fp16")
    assert n > 0 and set(seen[:n]) == {"fp32"} and set(seen[n:]) == {"fp16"}
    note = report.identity["precision_note"]
    assert "fp16 autocast on a CPU cannot be fast" in note and "loop.loss_scaling" in note
    assert setup.precision == "fp16"  # the user's Setup is unchanged


def test_loss_scaling_keeps_the_setups_fp16():
    seen: list[str] = []
    setup = mlp_setup(_recording_step(seen), k=1, scaler=True)
    report = tropt.diagnose(setup, checks=["loop.loss_scaling"], progress=False)
    r = report["loop.loss_scaling"]
    assert "ran_in_precision" not in r.metrics and "compared in fp32" not in r.summary
    assert set(seen) == {"fp16"}
    assert not runs_in_fp32("loop.loss_scaling", setup) and runs_in_fp32("loop.accumulation", setup)


def _amp_step_not_divided(ctx, micro_batches):
    """An AMP loop with the planted bug: each micro-batch loss is not divided by K."""
    for mb in micro_batches:
        with ctx.autocast():
            loss = ctx.loss_fn(ctx.model, mb)
        ctx.scaler.scale(loss).backward()
    ctx.scaler.step(ctx.optimizer)
    ctx.scaler.update()
    ctx.optimizer.zero_grad()
    if ctx.scheduler is not None:
        ctx.scheduler.step()


def test_missing_divide_by_k_still_fails_when_compared_in_fp32():
    setup = mlp_setup(_amp_step_not_divided, k=4, scaler=True)
    report = tropt.diagnose(setup, checks=["loop.accumulation"], progress=False)
    r = report["loop.accumulation"]
    assert r.status is Status.FAIL and "summed, not averaged" in r.summary, r.summary
    assert r.metrics["ran_in_precision"] == "fp32"


def test_fp32_and_gpu_setups_are_left_alone():
    setup = mlp_setup(None, k=2)
    assert not fp16_on_cpu(setup) and not runs_in_fp32("loop.zero_grad", setup)
    report = tropt.diagnose(setup, checks=["loop.zero_grad"], progress=False)
    assert "ran_in_precision" not in report["loop.zero_grad"].metrics
    assert "precision_note" not in report.identity
    if torch.cuda.is_available():  # pragma: no cover - a GPU keeps its fp16
        assert not fp16_on_cpu(setup.replace(precision="fp16", device="cuda"))


def test_precision_says_once_that_fp16_on_a_cpu_cannot_be_fast():
    from tropt.perf import check_precision

    setup = mlp_setup(None, k=1, scaler=True)
    r = check_precision(setup, precisions=("fp32", "fp16"), steps=3, warmup=0, progress=False)
    assert r.summary.startswith("fp16 autocast on a CPU cannot be fast") and "30x slower" in r.summary
    assert r.metrics["precision_note"].startswith("fp16 autocast on a CPU")
    fp32 = check_precision(setup.replace(precision="fp32", use_scaler=False), precisions=("fp32",), steps=3,
                           warmup=0, progress=False)
    assert "precision_note" not in fp32.metrics and "cannot be fast" not in fp32.summary
