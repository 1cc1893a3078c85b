"""loop.train_mode with several optimizers (issue 28): every optimizer's step closes an update, so the forwards of a
GAN's second update (G's) are judged too, and a step that steps only a later optimizer is no "never stepped"."""

from __future__ import annotations

from typing import Any

import torch
from support.two_optimizers import NZ, TinyGAN, gan_batches, gan_loss, opt_d, opt_g
from torch import nn
from torch.nn import functional as F

import tropt
from tropt.loop import check_train_mode
from tropt.result import Status
from tropt.testing import untouched


class DropoutGAN(TinyGAN):
    """TinyGAN with dropout in G: its mode during G's update is what the check must see."""

    def __init__(self) -> None:
        super().__init__()
        self.netG = nn.Sequential(nn.Linear(NZ, 8), nn.ReLU(), nn.Dropout(0.3), nn.Linear(8, self.netD[0].in_features))


def _step(g_in_eval: bool = False, g_every: int = 1) -> Any:
    """D on real and detached fake, D steps; then (every ``g_every``-th call) G through D, G steps. ``g_in_eval``:
    the bug, G's update runs with G in eval mode (left on after sampling for a log)."""
    calls = {"n": 0}

    def step(ctx: tropt.StepContext, micro: list) -> torch.Tensor:
        calls["n"] += 1
        m = ctx.model
        m.train()
        opts = dict(ctx.all_optimizers())
        d_opt, g_opt = opts["D"], opts["G"]
        d_opt.zero_grad()
        total = torch.zeros(())
        for real, z in micro:
            err = (F.binary_cross_entropy_with_logits(m.netD(real), torch.ones(real.shape[0], 1))
                   + F.binary_cross_entropy_with_logits(m.netD(m.netG(z).detach()), torch.zeros(real.shape[0], 1)))
            (err / len(micro)).backward()
            total = total + err.detach()
        d_opt.step()
        if calls["n"] % g_every == 0:
            if g_in_eval:
                m.netG.eval()
            g_opt.zero_grad()
            for _, z in micro:
                (F.binary_cross_entropy_with_logits(m.netD(m.netG(z)), torch.ones(z.shape[0], 1))
                 / len(micro)).backward()
            g_opt.step()
        return total
    return step


def _setup(order: tuple[str, str] = ("D", "G"), **kw: Any) -> tropt.Setup:
    factories = {"D": opt_d, "G": opt_g}
    return tropt.Setup(DropoutGAN(), gan_loss, {k: factories[k] for k in order}, gan_batches(), step=_step(**kw))


def test_a_generator_updated_in_eval_mode_fails_when_only_its_own_optimizer_sees_it():
    """One call: D's update runs G in train mode; G's (closed by G's optimizer, not D's) runs it in eval. Hooking
    only the first optimizer never closed G's update, and the check passed."""
    setup = _setup(g_in_eval=True)
    with untouched(setup):
        r = check_train_mode(setup, steps=1, progress=False)
    assert r.status is Status.FAIL and "netG.2" in r.summary, r.summary
    assert r.metrics["updates_observed"] == 2


def test_every_optimizers_step_is_an_update_of_a_healthy_gan():
    r = check_train_mode(_setup(), steps=2, progress=False)
    assert r.status is Status.PASS, r.summary
    assert r.metrics["updates_observed"] == 4  # D and G in each of 2 calls


def test_a_step_that_steps_the_first_optimizer_only_every_third_call_is_not_never_stepped():
    """optimizer={"G": ..., "D": ...}: G (the Setup's first) steps every 3rd call (WGAN's n_critic, reversed); D's
    updates in the first two calls are updates, not "never called optimizer.step()"."""
    r = check_train_mode(_setup(order=("G", "D"), g_every=3), steps=2, progress=False)
    assert r.status is Status.PASS, r.summary
    assert r.metrics["updates_observed"] == 2
