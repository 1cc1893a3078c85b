"""Several optimizers in one training step (issue 28): the Setup builds each, the context exposes them all, the
step recorder observes every optimizer's update (the Setup's and one the step keeps on ctx), and one call that
steps D then G is one training step."""

from __future__ import annotations

import pytest
import torch
from support.two_optimizers import TinyGAN, gan_batches, gan_loss, gan_setup, gan_step, opt_d, opt_g

import tropt
from tropt.core.capture import run_steps, updates_per_call
from tropt.errors import SetupError


def test_setup_builds_every_optimizer_and_ctx_exposes_them_in_order():
    ctx = gan_setup("tuple").build()
    d, g = ctx.optimizers
    assert ctx.optimizer is d and isinstance(g, torch.optim.Adam)
    held_d = {id(p) for grp in d.param_groups for p in grp["params"]}
    assert held_d == {id(p) for p in ctx.model.netD.parameters()}
    assert {id(p) for grp in g.param_groups for p in grp["params"]} == {id(p) for p in ctx.model.netG.parameters()}
    assert [ctx.optimizer_name(i) for i in range(2)] == ["optimizers[0]", "optimizers[1]"]
    named = gan_setup("dict").build()
    assert [named.optimizer_name(i) for i in range(2)] == ["D", "G"]
    assert [n for n, _ in named.all_optimizers()] == ["D", "G"]


def test_a_single_optimizer_is_ctx_optimizers_only_entry():
    ctx = gan_setup("ctx").build()
    assert ctx.optimizers == (ctx.optimizer,) and ctx.optimizer_name(0) == "optimizer"
    assert ctx.schedulers == (None,)


def test_schedulers_one_factory_for_all_or_one_per_optimizer():
    sched = lambda o: torch.optim.lr_scheduler.StepLR(o, 1)  # noqa: E731
    ctx = tropt.Setup(TinyGAN(), gan_loss, (opt_d, opt_g), gan_batches(), scheduler=sched, step=gan_step()).build()
    assert [s.optimizer for s in ctx.schedulers] == list(ctx.optimizers)
    ctx = tropt.Setup(TinyGAN(), gan_loss, {"D": opt_d, "G": opt_g}, gan_batches(),
                      scheduler={"D": None, "G": sched}, step=gan_step()).build()
    assert ctx.schedulers[0] is None and ctx.schedulers[1].optimizer is ctx.optimizers[1]
    with pytest.raises(SetupError, match="scheduler holds 1 entry"):
        tropt.Setup(TinyGAN(), gan_loss, (opt_d, opt_g), gan_batches(), scheduler=(sched,), step=gan_step())


def test_several_optimizers_need_a_step_of_ones_own():
    with pytest.raises(SetupError) as info:
        tropt.Setup(TinyGAN(), gan_loss, (opt_d, opt_g), gan_batches())
    assert "2 optimizers (optimizers[0], optimizers[1]) need your own step" in info.value.message
    assert "ctx.optimizers" in info.value.fix


def test_standard_step_refuses_a_context_with_several_optimizers():
    ctx = gan_setup("tuple").build()
    with pytest.raises(SetupError, match=r"tropt\.standard_step steps one optimizer"):
        tropt.standard_step(ctx, [gan_batches()[0]])


def test_each_optimizer_of_the_setup_is_built_from_the_copy_and_checked():
    with pytest.raises(SetupError, match="the optimizer factory G built an optimizer over"):
        model = TinyGAN()
        tropt.Setup(model, gan_loss, {"D": opt_d, "G": lambda m: torch.optim.SGD(model.parameters(), lr=0.1)},
                    gan_batches(), step=gan_step()).validate()


@pytest.mark.parametrize("form", ["tuple", "dict", "ctx"])
def test_recorder_sees_both_updates_per_call_and_counts_one_training_step(form):
    setup = gan_setup(form)
    ctx = setup.build()
    records, calls = run_steps(setup, ctx, [[b] for b in gan_batches(3)])
    assert calls == [1, 1, 1]  # D then G in one call: one training step, not two
    names = [r.optimizer for r in records]
    want = {"tuple": ["optimizers[0]", "optimizers[1]"], "dict": ["D", "G"], "ctx": ["optimizer", "ctx.opt_g"]}[form]
    assert names == want * 3
    d_rec, g_rec = records[0], records[1]
    assert set(d_rec.grads) == {n for n, _ in ctx.model.named_parameters() if n.startswith("netD")}
    assert set(g_rec.grads) == {n for n, _ in ctx.model.named_parameters() if n.startswith("netG")}
    assert all(v is not None for v in g_rec.pre_clip.values())  # G's backward share, kept past D's step


def test_one_optimizer_stepped_twice_in_a_call_still_counts_two():
    rec = tropt.core.capture.StepRecord
    records = [rec({}, [], None, 0.0, optimizer="D"), rec({}, [], None, 0.0, optimizer="G"),
               rec({}, [], None, 0.0, optimizer="D")]
    assert updates_per_call(records) == 2 and updates_per_call(records[:2]) == 1 and updates_per_call([]) == 0
