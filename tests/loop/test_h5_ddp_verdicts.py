"""loop.ddp, issue 27's open decisions (c): a difference no cause predicts is a WARN "cause not isolated" (as in
loop.zero_grad), while a difference a cause predicts (the loss divided by the world size) still FAILs with it."""

from __future__ import annotations

import torch.distributed as dist
from support.loop_cases import ddp_setup, step_dividing_by_world_size

from tropt.loop import check_ddp
from tropt.result import Status


def _step_scaled_under_ddp_only(ctx, micro_batches):
    """0.6× the loss only when distributed: no cause tropt knows predicts a 0.6 factor."""
    scale = 0.6 if dist.is_initialized() else 1.0
    for mb in micro_batches:
        (ctx.loss_fn(ctx.model, mb) * scale).backward()
    ctx.optimizer.step()
    ctx.optimizer.zero_grad()


def test_a_ddp_difference_no_cause_predicts_is_a_warn_not_isolated_on_every_setup():
    for distributed in (False, True):
        r = check_ddp(ddp_setup(_step_scaled_under_ddp_only).replace(distributed=distributed))
        assert r.status is Status.WARN, r.summary
        assert r.metrics["cause"] == "not_isolated" and "cause not isolated" in r.summary, r.summary
        assert "0.6×" in r.summary and r.metrics["noise_floor"] == 0.0
        assert "parameters" in r.tables  # the evidence: which tensors differ


def test_a_ddp_difference_a_cause_predicts_still_fails_with_it():
    r = check_ddp(ddp_setup(step_dividing_by_world_size))
    assert r.status is Status.FAIL and "averaging is applied twice" in r.summary, r.summary
