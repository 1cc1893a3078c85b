"""loop.resume with known answers: a checkpoint that forgets the optimizer, the schedule or the RNG is caught."""

from __future__ import annotations

import pytest
import torch
from support.loop_cases import mlp_setup, plateau_setup, run_all, statuses

from tropt.loop import check_resume
from tropt.result import Status
from tropt.testing import untouched


def test_resume_saving_only_the_model_is_caught_by_resume_only():
    setup = mlp_setup(save_state=lambda ctx: {"model": ctx.model.state_dict()},
                      load_state=lambda ctx, s: ctx.model.load_state_dict(s["model"]))
    results = run_all(setup)
    r = results["loop.resume"]
    assert r.status is Status.FAIL and "first divergence: optimizer moments" in r.summary
    comp = r.tables["components"].set_index("component")
    assert comp.loc["model weights", "restored"] and not comp.loc["optimizer moments", "restored"]
    assert not comp.loc["schedule position", "restored"] and not comp.loc["RNG", "restored"]
    assert any("optimizer.state_dict()" in a for a in r.advice)
    assert [c for c, s in statuses(results).items() if s is Status.FAIL] == ["loop.resume"]


def test_resume_without_rng_but_nothing_random_warns():
    def save(ctx):
        return {"m": ctx.model.state_dict(), "o": ctx.optimizer.state_dict(), "s": ctx.scheduler.state_dict()}

    def load(ctx, s):
        ctx.model.load_state_dict(s["m"])
        ctx.optimizer.load_state_dict(s["o"])
        ctx.scheduler.load_state_dict(s["s"])

    r = check_resume(mlp_setup(save_state=save, load_state=load))
    assert r.status is Status.WARN and "RNG is not restored" in r.summary
    r = check_resume(mlp_setup(save_state=save, load_state=load, dropout=0.3))  # now dropout masks diverge
    assert r.status is Status.FAIL and "first divergence: RNG" in r.summary
    assert check_resume(mlp_setup(dropout=0.3)).status is Status.PASS  # tropt's full checkpoint restores RNG


def test_state_holding_live_references_is_caught():
    # Returning the live parameters (no copy) looks fine in memory but the "checkpoint" keeps training along.
    r = check_resume(mlp_setup(optimizer="sgd", scheduler=False,
                               save_state=lambda ctx: {"params": list(ctx.model.parameters()),
                                                       "opt": ctx.optimizer.state_dict()},
                               load_state=lambda ctx, s: [p.data.copy_(q)
                                                          for p, q in zip(ctx.model.parameters(), s["params"])]
                               and ctx.optimizer.load_state_dict(s["opt"])))
    assert r.status in (Status.PASS, Status.WARN)  # torch.save cuts the references, so the file is what was saved
    assert r.metrics["final_param_max_rel_error"] <= 1e-5


def test_resume_that_forgets_a_plateau_scheduler_is_not_a_pass():
    def save(ctx):
        return {"m": ctx.model.state_dict(), "o": ctx.optimizer.state_dict()}

    def load(ctx, s):
        ctx.model.load_state_dict(s["m"])
        ctx.optimizer.load_state_dict(s["o"])

    r = check_resume(plateau_setup(save_state=save, load_state=load))
    assert r.status is not Status.PASS, r.summary
    assert not r.tables["components"].set_index("component").loc["schedule position", "restored"]
    assert "schedule position" in r.summary
    good = plateau_setup()
    with untouched(good):
        assert check_resume(good).status is Status.PASS  # tropt's full checkpoint restores best = 1.x, not inf


@pytest.mark.parametrize("scheduler", ["warmup", "cosine", "plateau"])
def test_resume_that_forgets_the_scheduler_fails_even_after_one_step(scheduler):
    """Losing the schedule's position makes every later step diverge: FAIL at the default steps=1, where the
    updates themselves still agree (the optimizer's state_dict carries the current learning rate)."""
    def save(ctx):
        return {"m": ctx.model.state_dict(), "o": ctx.optimizer.state_dict()}

    def load(ctx, s):
        ctx.model.load_state_dict(s["m"])
        ctx.optimizer.load_state_dict(s["o"])

    make = {"warmup": lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda s: min(1.0, (s + 1) / 10)),
            "cosine": lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, 50)}
    setup = plateau_setup() if scheduler == "plateau" else mlp_setup().replace(scheduler=make[scheduler])
    r = check_resume(setup.replace(save_state=save, load_state=load))
    assert r.status is Status.FAIL and "first divergence: schedule position" in r.summary, r.summary
    assert r.metrics["schedule_position_straight"] == 2 and r.metrics["schedule_position_resumed"] == 1
    if scheduler != "plateau":  # the next learning rate already differs
        assert ("resuming changes the schedule" in r.summary
                and r.metrics["lr_after_straight"] != r.metrics["lr_after_resumed"])
    assert any("scheduler.state_dict()" in a for a in r.advice)
    assert check_resume(setup).status is Status.PASS  # control: tropt's full checkpoint
