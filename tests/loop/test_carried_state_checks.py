"""Checks that restore the training state with a step that carries state outside ctx's own fields (issue 27 §2,
issue 28 "State carried outside ctx"): a recurrent hidden state on the model, on a trainer object or in the step's
closure is restored with the rest, so step t reruns from the same state; an attached state is named."""

from __future__ import annotations

import pytest
import torch
from ports import rnn_lm
from support.loop_cases import mlp_setup

from tropt.loop import check_resume, check_zero_grad
from tropt.result import Status
from tropt.training import standard_step


@pytest.mark.parametrize(("build", "carried"), [
    (rnn_lm.word_lm_on_model_setup, "model.hidden"),
    (rnn_lm.char_rnn_setup, "step.self.init_state_global"),
    (rnn_lm.awd_lstm_setup, "step.hidden"),
], ids=["on_model", "trainer_object", "closure"])
def test_zero_grad_passes_a_hidden_state_carried_outside_ctx_and_names_it(build, carried):
    r = check_zero_grad(build())
    assert r.status is Status.PASS, r.summary
    assert r.metrics["carried_state"] == carried


def test_zero_grad_names_a_hidden_state_that_is_not_detached():
    r = check_zero_grad(rnn_lm.word_lm_on_model_setup(attached=True))
    assert r.status in (Status.FAIL, Status.WARN), r.summary  # flagged; the attached state is named in metrics
    assert "model.hidden" in r.metrics["carried_state_attached"]
    assert "not detached" in r.metrics["carried_state_attached"]


# ------------------------------------------------------------------ loop.resume: objects on ctx and carried state
def ema_step(ctx, micro_batches):
    """The reference step plus an EMA of the weights the step keeps on ctx (timm's ModelEmaV2 pattern)."""
    if not hasattr(ctx, "ema"):
        ctx.ema = torch.optim.swa_utils.AveragedModel(
            ctx.model, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(0.9))
    standard_step(ctx, micro_batches)
    ctx.ema.update_parameters(ctx.model)


def _save(with_ema):
    def save(ctx):
        state = {"m": ctx.model.state_dict(), "o": ctx.optimizer.state_dict(), "s": ctx.scheduler.state_dict(),
                 "rng": torch.get_rng_state()}
        if with_ema:
            state["ema"] = ctx.ema.state_dict()
        return state
    return save


def _load(ctx, state):
    ctx.model.load_state_dict(state["m"])
    ctx.optimizer.load_state_dict(state["o"])
    ctx.scheduler.load_state_dict(state["s"])
    torch.set_rng_state(state["rng"])
    if "ema" in state:
        ctx.ema = torch.optim.swa_utils.AveragedModel(
            ctx.model, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(0.9))
        ctx.ema.load_state_dict(state["ema"])


def test_resume_finds_an_ema_left_out_of_the_checkpoint():
    r = check_resume(mlp_setup(ema_step, save_state=_save(False), load_state=_load), steps=2)
    assert r.status is Status.FAIL, r.summary
    assert "first divergence: ctx.ema" in r.summary
    comp = r.tables["components"].set_index("component")
    assert not comp.loc["ctx.ema", "matches_at_end"] and comp.loc["model weights", "matches_at_end"]
    assert any("ctx.ema.state_dict()" in a for a in r.advice)


def test_resume_passes_a_checkpoint_that_holds_the_ema_and_tropts_own_checkpoint():
    r = check_resume(mlp_setup(ema_step, save_state=_save(True), load_state=_load), steps=2)
    assert r.status is Status.PASS, r.summary
    assert r.tables["components"].set_index("component").loc["ctx.ema", "restored"]
    assert check_resume(mlp_setup(ema_step), steps=2).status is Status.PASS  # tropt's checkpoint holds ctx.ema


@pytest.mark.parametrize("build", [rnn_lm.word_lm_on_model_setup, rnn_lm.char_rnn_setup, rnn_lm.awd_lstm_setup],
                         ids=["on_model", "trainer_object", "closure"])
def test_resume_with_tropts_checkpoint_restores_a_hidden_state_carried_outside_ctx(build):
    r = check_resume(build())
    assert r.status is Status.PASS, r.summary


def test_resume_finds_a_hidden_state_left_out_of_the_checkpoint():
    r = check_resume(rnn_lm.word_lm_on_model_setup(save_hidden=False))
    assert r.status is Status.FAIL and "first divergence: model.hidden" in r.summary, r.summary
    assert check_resume(rnn_lm.word_lm_on_model_setup(save_hidden=True)).status is not Status.FAIL


# ------------------------------------------------------------------ a second optimizer the step builds on ctx
def two_optimizer_step(ctx, micro_batches):
    """The Setup's optimizer steps the first layer, an Adam the step builds on ctx (a GAN's opt_g pattern) the
    last; the Setup's scheduler follows the first."""
    model = ctx.model
    if not hasattr(ctx, "opt_last"):
        ctx.opt_last = torch.optim.Adam(model[-1].parameters(), lr=1e-2)
    ctx.optimizer.zero_grad()
    ctx.opt_last.zero_grad()
    for mb in micro_batches:
        (ctx.loss_fn(model, mb) / len(micro_batches)).backward()
    ctx.optimizer.step()
    ctx.opt_last.step()
    ctx.scheduler.step()


def _first_layer_sgd(m):
    return torch.optim.SGD(m[0].parameters(), lr=0.1, momentum=0.9)


def test_resume_rebuilds_and_compares_an_optimizer_the_step_builds_on_ctx():
    r = check_resume(mlp_setup(two_optimizer_step, optimizer="sgd").replace(optimizer=_first_layer_sgd), steps=2)
    assert r.status is Status.PASS, r.summary  # tropt's checkpoint holds ctx.opt_last's moments
    assert r.tables["components"].set_index("component").loc["ctx.opt_last", "restored"]

    def save(ctx):
        return {"m": ctx.model.state_dict(), "o": ctx.optimizer.state_dict(), "s": ctx.scheduler.state_dict()}

    def load(ctx, s):
        ctx.model.load_state_dict(s["m"])
        ctx.optimizer.load_state_dict(s["o"])
        ctx.scheduler.load_state_dict(s["s"])

    forgot = check_resume(mlp_setup(two_optimizer_step).replace(optimizer=_first_layer_sgd, save_state=save,
                                                                 load_state=load), steps=2)
    assert forgot.status is Status.FAIL and "ctx.opt_last" in forgot.summary, forgot.summary


def test_scheduler_cadence_follows_the_first_optimizer_when_the_step_steps_two():
    from tropt.loop import check_scheduler_cadence

    r = check_scheduler_cadence(mlp_setup(two_optimizer_step).replace(optimizer=_first_layer_sgd))
    assert r.status is Status.PASS, r.summary


class _ConfigSGD(torch.optim.Optimizer):
    """A user's optimizer whose constructor takes a config, not its defaults as keywords (so it cannot be built
    again from its class and defaults), with a momentum buffer in its state."""

    def __init__(self, params, cfg):
        super().__init__(params, {"lr": cfg["lr"], "momentum": 0.9})

    @torch.no_grad()
    def step(self, closure=None):
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is not None:
                    buf = self.state[p].setdefault("buf", torch.zeros_like(p))
                    p.add_(buf.mul_(g["momentum"]).add_(p.grad), alpha=-g["lr"])


def config_optimizer_step(ctx, micro_batches):
    """two_optimizer_step with the last layer's optimizer a _ConfigSGD the step builds on its first call."""
    if getattr(ctx, "opt_last", None) is None:
        ctx.opt_last = _ConfigSGD(ctx.model[-1].parameters(), {"lr": 0.05})
    ctx.optimizer.zero_grad()
    ctx.opt_last.zero_grad()
    for mb in micro_batches:
        (ctx.loss_fn(ctx.model, mb) / len(micro_batches)).backward()
    ctx.optimizer.step()
    ctx.opt_last.step()
    ctx.scheduler.step()


def test_resume_with_tropts_checkpoint_restores_a_lazily_built_optimizer_of_any_constructor():
    """ctx.opt_last is rebuilt over the fresh model's parameters even though its class cannot be called with its
    defaults, and its momentum is loaded: tropt's own checkpoint is exact, not "first divergence: ctx.opt_last"."""
    r = check_resume(mlp_setup(config_optimizer_step, dropout=None).replace(optimizer=_first_layer_sgd), steps=2)
    assert r.status is Status.PASS, r.summary
    assert r.tables["components"].set_index("component").loc["ctx.opt_last", "restored"]


def temperature_step(ctx, micro_batches):
    """A learnable temperature the step keeps on ctx, with its own optimizer built on the first call."""
    if getattr(ctx, "opt_temp", None) is None:
        ctx.temperature = torch.nn.Parameter(torch.ones(()))
        ctx.opt_temp = _ConfigSGD([ctx.temperature], {"lr": 0.05})
    ctx.optimizer.zero_grad()
    ctx.opt_temp.zero_grad()
    for mb in micro_batches:
        (ctx.loss_fn(ctx.model, mb) * ctx.temperature / len(micro_batches)).backward()
    ctx.optimizer.step()
    ctx.opt_temp.step()


def test_resume_with_tropts_checkpoint_restores_a_trainable_tensor_on_ctx_and_its_optimizer():
    """tropt's own checkpoint keeps ctx.temperature trainable and rebuilds ctx.opt_temp over the loaded one: no
    "first divergence: state outside the checkpoint" on a healthy step."""
    r = check_resume(mlp_setup(temperature_step, dropout=None), steps=2)
    assert r.status is Status.PASS, r.summary
    assert r.tables["components"].set_index("component").loc["ctx.opt_temp", "restored"]
    assert "not_compared" not in r.metrics
