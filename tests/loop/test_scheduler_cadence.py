"""loop.scheduler_cadence with known answers: a schedule stepped per micro-batch, twice, before the optimizer or
never, with and without a position to read."""

from __future__ import annotations

import pytest
import torch
from support.loop_cases import mlp_setup, plateau_setup, run_all, statuses, step_scheduler_per_micro_batch

import tropt
from tropt.loop import check_scheduler_cadence
from tropt.result import Status
from tropt.testing import untouched


def test_scheduler_per_micro_batch_is_caught_by_cadence_only():
    results = run_all(mlp_setup(step_scheduler_per_micro_batch, k=4))
    r = results["loop.scheduler_cadence"]
    assert r.status is Status.FAIL and "stepped per micro-batch" in r.summary and "4× faster" in r.summary
    sched = r.tables["schedule"]
    assert list(sched["position_k1"]) == [1] and list(sched["position_k4"]) == [4]  # one step decides
    longer = check_scheduler_cadence(mlp_setup(step_scheduler_per_micro_batch, k=4), steps=3)
    assert longer.status is Status.FAIL and list(longer.tables["schedule"]["position_k4"]) == [4, 8, 12]
    assert longer.metrics["max_lr_rel_diff"] > 0.1  # the learning rates themselves differ from step 2 on
    assert [c for c, s in statuses(results).items() if s is Status.FAIL] == ["loop.scheduler_cadence"]


def test_scheduler_never_stepped_warns_as_maybe_per_epoch():
    """A step that never steps the scheduler is right for a per-epoch scheduler stepped by the user's epoch loop
    (torchvision's references), wrong otherwise: tropt cannot see that loop, so WARN, naming both readings."""
    r = check_scheduler_cadence(mlp_setup(
        lambda ctx, mbs: tropt.standard_step(ctx.__class__(**{**ctx.__dict__, "scheduler": None}), mbs)))
    assert r.status is Status.WARN and "did not move during 1 optimizer step " in r.summary and "per epoch" in r.summary
    assert any("per-epoch scheduler" in a for a in r.advice)


class HalvingSchedule:
    """A scheduler without last_epoch: only its learning rates can show its cadence."""

    def __init__(self, optimizer):
        self.optimizer, self.count = optimizer, 0

    def step(self):
        self.count += 1
        for g in self.optimizer.param_groups:
            g["lr"] *= 0.5

    def state_dict(self):
        return {"count": self.count}

    def load_state_dict(self, state):
        self.count = state["count"]


def test_scheduler_without_position_is_judged_by_learning_rates():
    good = mlp_setup(k=4).replace(scheduler=HalvingSchedule)
    r = check_scheduler_cadence(good)
    assert r.status is Status.PASS and r.metrics["steps"] == 2
    bad = good.replace(step=step_scheduler_per_micro_batch)
    r = check_scheduler_cadence(bad)
    # Without positions the cause is confirmed from the learning rates: the K=4 run reads every 4th K=1 value.
    assert r.status is Status.FAIL and "stepped per micro-batch" in r.summary and r.metrics["per_micro_batch_confirmed"]


def step_scheduler_twice(ctx, micro_batches):
    tropt.standard_step(ctx, micro_batches)  # steps the scheduler once...
    ctx.scheduler.step()  # ...and a callback steps it again


def step_scheduler_before_optimizer(ctx, micro_batches):
    for mb in micro_batches:
        (ctx.loss_fn(ctx.model, mb) / len(micro_batches)).backward()
    ctx.scheduler.step()  # too early: the update uses the next step's learning rate
    ctx.optimizer.step()
    ctx.optimizer.zero_grad()


def step_optimizer_per_micro_batch(ctx, micro_batches):
    for mb in micro_batches:
        (ctx.loss_fn(ctx.model, mb) / len(micro_batches)).backward()
        ctx.optimizer.step()
        ctx.optimizer.zero_grad()
    ctx.scheduler.step()


@pytest.mark.parametrize("k", [1, 2])
def test_scheduler_stepped_twice_per_optimizer_step_fails(k):
    setup = mlp_setup(step_scheduler_twice, k=k)
    with untouched(setup):
        r = check_scheduler_cadence(setup)
    assert r.status is Status.FAIL and "stepped 2 times per optimizer step" in r.summary, r.summary
    # shows without accumulation
    assert "latent" not in r.metrics and r.metrics["schedule_steps_per_optimizer_step"] == 2
    longer = check_scheduler_cadence(setup, steps=3)
    assert longer.status is Status.FAIL and list(longer.tables["schedule"]["position_k1"]) == [2, 4, 6]


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler")
@pytest.mark.parametrize("scheduler", ["lambda", "steplr", "positionless"])
def test_scheduler_stepped_before_the_optimizer_warns(scheduler):
    setup = mlp_setup(step_scheduler_before_optimizer, k=2)
    if scheduler == "steplr":  # the LR does not change at step 1: only the position shows the order
        setup = setup.replace(scheduler=lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=30))
    elif scheduler == "positionless":
        setup = setup.replace(scheduler=HalvingSchedule)
    r = check_scheduler_cadence(setup)
    assert r.status is Status.WARN and "stepped before optimizer.step()" in r.summary, r.summary
    assert "after optimizer.step()" in r.advice[0]
    if scheduler == "lambda":  # LambdaLR 1/(1+s) at lr 1e-2: the first update uses 5e-3 instead of 1e-2
        assert (r.metrics["lr_at_optimizer_step"] == pytest.approx(5e-3)
                and r.metrics["lr_planned"] == pytest.approx(1e-2))
    assert check_scheduler_cadence(mlp_setup(k=2).replace(scheduler=setup.scheduler)).status is Status.PASS  # control


def test_optimizer_step_per_micro_batch_is_named_in_cadence_not_as_a_schedule_difference():
    r = check_scheduler_cadence(mlp_setup(step_optimizer_per_micro_batch, k=4))
    assert r.status is Status.WARN, r.summary
    assert ("optimizer.step() ran 4 times with K=4 but 1 with K=1" in r.summary
            and r.metrics["see_also"] == "loop.accumulation")
    report = tropt.diagnose(mlp_setup(step_optimizer_per_micro_batch, k=4), checks="loop", progress=False)
    assert report["loop.accumulation"].status is Status.FAIL
    assert report["loop.scheduler_cadence"].summary.endswith("loop.accumulation reports this defect")
    assert r.metrics["optimizer_steps_k4"] == 4 and "learning rates differ" not in r.summary


def test_correct_plateau_step_passes_cadence():
    setup = plateau_setup(k=2)
    with untouched(setup):
        r = check_scheduler_cadence(setup)
    assert r.status is Status.PASS, r.summary


def test_standard_step_leaves_a_metric_scheduler_to_the_epoch_loop():
    """ReduceLROnPlateau steps on a metric after validation, in the user's epoch loop: standard_step leaves it alone,
    so every check runs (they all ERRORed before, for a scheduler the user steps correctly), and the cadence check
    says why it has nothing to compare. The LR stays put during the checks' short runs."""
    setup = plateau_setup().replace(step=None)
    report = tropt.diagnose(setup, checks="loop", progress=False)
    assert not [r.check for r in report if r.status is Status.ERROR], [(r.check, r.summary) for r in report]
    cadence = report["loop.scheduler_cadence"]
    assert cadence.status is Status.SKIP and "steps on a metric in your epoch loop" in cadence.summary, cadence.summary
    ctx = setup.build()
    lr = ctx.optimizer.param_groups[0]["lr"]
    tropt.standard_step(ctx, setup.split(next(iter(setup.batches(1))), 1))
    assert ctx.optimizer.param_groups[0]["lr"] == lr and ctx.scheduler.last_epoch == 0  # never stepped
    # its own step works
    assert tropt.diagnose(plateau_setup(), checks="loop", progress=False).status is not Status.ERROR


def step_scheduler_before_optimizer_per_micro_batch(ctx, micro_batches):
    for mb in micro_batches:
        (ctx.loss_fn(ctx.model, mb) / len(micro_batches)).backward()
        ctx.scheduler.step()  # too early, and the optimizer steps once per micro-batch
        ctx.optimizer.step()
        ctx.optimizer.zero_grad()


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler")
def test_scheduler_stepped_before_the_optimizer_is_found_when_k1_and_k4_cannot_be_compared():
    """K=1 alone shows the order: the first update already uses the schedule's second learning rate. The K=4 run
    steps the optimizer 4 times per call, so the two runs cannot be compared; that must not hide the order."""
    r = check_scheduler_cadence(mlp_setup(step_scheduler_before_optimizer_per_micro_batch, k=4))
    assert r.status is Status.WARN, r.summary
    assert r.summary.startswith("the scheduler is stepped before optimizer.step()"), r.summary
    assert "optimizer.step() ran 4 times with K=4 but 1 with K=1" in r.summary  # the comparison's problem, still said
    assert r.metrics["lr_at_optimizer_step"] == pytest.approx(5e-3) and r.metrics["lr_planned"] == pytest.approx(1e-2)
    assert r.metrics["see_also"] == "loop.accumulation"
    assert any("after optimizer.step()" in a for a in r.advice) and any("once per call" in a for a in r.advice)


def _counting_optimizer(steps: list):
    """An AdamW factory whose every optimizer counts its steps into ``steps`` (a step pre-hook)."""
    def factory(model):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        opt.register_step_pre_hook(lambda *_: steps.append(1))
        return opt
    return factory


def test_no_scheduler_with_standard_step_skips_without_a_single_optimizer_step():
    """The Setup alone decides it: no scheduler and tropt.standard_step (which sets no learning rate), so there is no
    schedule to compare and no step is run (it ran the K=1 and K=4 comparison before, 6 optimizer steps)."""
    steps: list = []
    setup = mlp_setup(k=4, scheduler=False).replace(optimizer=_counting_optimizer(steps))
    with untouched(setup):
        r = check_scheduler_cadence(setup)
    assert len(steps) == 0, f"{len(steps)} optimizer steps to conclude there is no schedule"
    assert r.status is Status.SKIP and "no scheduler" in r.summary and "standard_step" in r.summary, r.summary
    assert r.metrics["optimizer_steps"] == 0
    # control: the same counter counts the steps of a step function of the user's, which may set the LR by hand
    mine = setup.replace(step=lambda ctx, mbs: tropt.standard_step(ctx, mbs))
    r = check_scheduler_cadence(mine)
    assert r.status is Status.SKIP and "never changed" in r.summary and len(steps) > 0, r.summary


# ------------------------------------------------------------------ a schedule's horizon against the epoch
EPOCHS, PER_EPOCH = 3, 16  # 16 loader batches: 16 optimizer steps per epoch


def _horizon_setup(make_scheduler, step=None):
    from support import ce_loss, make_classification

    x, y = make_classification(n=16 * 8, d=6, classes=3, seed=2)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    return tropt.Setup(model, ce_loss, lambda m: torch.optim.SGD(m.parameters(), lr=0.1),
                       [(x[i:i + 8], y[i:i + 8]) for i in range(0, 128, 8)], scheduler=make_scheduler, step=step,
                       num_classes=3)


def test_a_cosine_schedule_sized_in_epochs_but_stepped_per_iteration_is_named():
    r = check_scheduler_cadence(_horizon_setup(lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=EPOCHS)))
    assert r.status is Status.WARN, r.summary
    assert "counted in epochs" in r.summary and "T_max=3" in r.summary and "16 optimizer steps" in r.summary
    assert r.metrics["schedule_horizon"] == EPOCHS and r.metrics["steps_per_epoch"] == PER_EPOCH
    assert r.metrics["steps_per_epoch_from"] == "len(train_data)"
    assert any("(T_max=48)" in a for a in r.advice)


def test_a_schedule_sized_in_iterations_and_stepped_per_iteration_passes():
    for make in (lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=EPOCHS * PER_EPOCH),
                 lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.1, epochs=EPOCHS, steps_per_epoch=PER_EPOCH),
                 lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=2 * PER_EPOCH)):
        r = check_scheduler_cadence(_horizon_setup(make))
        assert r.status is Status.PASS, r.summary


def test_step_lr_with_an_epoch_step_size_stepped_per_iteration_is_named():
    r = check_scheduler_cadence(_horizon_setup(lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=2)))
    assert r.status is Status.WARN and "step_size=2" in r.summary and "decays that often" in r.summary


def test_a_schedule_sized_in_iterations_but_stepped_per_epoch_is_named():
    def step_without_scheduler(ctx, micro_batches):  # the epoch loop steps the scheduler, outside the step
        ctx.optimizer.zero_grad()
        for mb in micro_batches:
            (ctx.loss_fn(ctx.model, mb) / len(micro_batches)).backward()
        ctx.optimizer.step()

    r = check_scheduler_cadence(_horizon_setup(
        lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=EPOCHS * PER_EPOCH), step_without_scheduler))
    assert r.status is Status.WARN and "counted in optimizer steps" in r.summary, r.summary
    assert "48" in r.summary and "16" in r.summary
    per_epoch = check_scheduler_cadence(_horizon_setup(
        lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=EPOCHS), step_without_scheduler))
    assert per_epoch.status is Status.WARN and "counted in" not in per_epoch.summary  # the plain "did not move" WARN
