"""loop.scheduler_cadence's cheap path (issue 32): without a scheduler, a K=1 run in which the step never assigns a
learning rate decides the SKIP alone; a step that assigns one, even an unchanging one, is still compared with K=4."""

from __future__ import annotations

import torch
from support.loop_cases import mlp_setup

import tropt
from tropt.loop import check_scheduler_cadence
from tropt.result import Status
from tropt.testing import untouched


def _counting_optimizer(steps: list):
    def factory(model):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        opt.register_step_pre_hook(lambda *_: steps.append(1))
        return opt
    return factory


def _setup(step, steps: list):
    return mlp_setup(k=4, scheduler=False).replace(optimizer=_counting_optimizer(steps), step=step)


def test_a_step_that_never_assigns_a_learning_rate_is_decided_by_the_k1_run_alone():
    steps: list = []
    setup = _setup(lambda ctx, mbs: tropt.standard_step(ctx, mbs), steps)
    with untouched(setup):
        r = check_scheduler_cadence(setup)
    assert r.status is Status.SKIP and "never changed" in r.summary and "K=1" in r.summary, r.summary
    assert r.metrics["runs"] == "K=1 only" and r.metrics["lr_written"] is False
    assert len(steps) == 3 == r.metrics["optimizer_steps"], len(steps)  # before: 6 (K=1 and K=4, 3 steps each)


def test_a_constant_learning_rate_assigned_by_hand_is_still_compared_with_k4():
    """Assigning the same value still counts as setting the learning rate: the K=4 run goes on."""
    steps: list = []

    def constant(ctx, mbs):
        for g in ctx.optimizer.param_groups:
            g["lr"] = 1e-2
        return tropt.standard_step(ctx, mbs)

    r = check_scheduler_cadence(_setup(constant, steps))
    assert r.status is Status.SKIP and r.metrics["runs"] == "K=1 and K=4", r.summary
    assert len(steps) == 6 and r.metrics["lr_written"] is True


def test_a_per_micro_batch_counter_flat_over_the_k1_run_is_still_caught():
    """The LR is constant over the K=1 run's 3 steps (counter 0..2) but a per-micro-batch counter reaches 12 with
    K=4: the step assigns the LR every call, so the K=4 run still runs and FAILs."""

    def per_micro_batch(ctx, mbs):
        for _ in mbs:
            ctx.it = getattr(ctx, "it", 0) + 1
        for g in ctx.optimizer.param_groups:
            g["lr"] = 1e-2 if ctx.it <= 4 else 1e-3
        return tropt.standard_step(ctx, mbs)

    r = check_scheduler_cadence(_setup(per_micro_batch, []))
    assert r.status is Status.FAIL and "depends on accumulation" in r.summary, r.summary


def test_a_scheduler_the_step_builds_on_ctx_is_seen():
    """A step that builds its own scheduler on ctx (no Setup scheduler) assigns the LR through it: compared."""

    def own_scheduler(ctx, mbs):
        if getattr(ctx, "my_sched", None) is None:
            ctx.my_sched = torch.optim.lr_scheduler.LambdaLR(ctx.optimizer, lambda s: 1.0)
        out = tropt.standard_step(ctx, mbs)
        ctx.my_sched.step()
        return out

    steps: list = []
    r = check_scheduler_cadence(_setup(own_scheduler, steps))
    assert r.metrics.get("runs") == "K=1 and K=4" and len(steps) == 6, (r.summary, r.metrics)
