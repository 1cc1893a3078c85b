"""Acceptance: ports of public training loops (tests/loop/real_loops.py) fit the step contract.

Every healthy port gets no FAIL and no ERROR from any model or loop check; each documented bug planted in a port is
caught by the right check id with the right cause.
"""

from __future__ import annotations

import pytest
import torch
from support import real_loops as rl

import tropt
from tropt.result import Status
from tropt.testing import untouched

MODEL_AND_LOOP = ["model", "loop"]


def diagnose(setup, checks=MODEL_AND_LOOP) -> dict:
    return {r.check: r for r in tropt.diagnose(setup, checks=checks, progress=False).results}


def bad(results: dict) -> dict:
    return {cid: (r.status.value, r.summary) for cid, r in results.items() if r.status in (Status.FAIL, Status.ERROR)}


def accelerate_port():
    pytest.importorskip("accelerate")
    return rl.accelerate_setup()


PORTS = {
    "nanogpt_hand_set_lr": rl.nanogpt_setup,
    "manual_sgd": rl.manual_sgd_setup,
    # the same loop with an optimizer in the Setup that the step never uses
    "manual_sgd_unused_optimizer": lambda: rl.manual_sgd_setup().replace(
        optimizer=lambda m: torch.optim.SGD(m.parameters(), lr=rl.LR_SGD)),
    "word_lm_time_major_batch_dim": rl.word_lm_setup,
    "word_lm_time_major_split_fn": lambda: rl.word_lm_setup(layout="split_fn", k=2),
    "accelerate_accumulate": accelerate_port,
    "native_scaler_wrapper": rl.native_scaler_setup,
    "hf_trainer_num_items": rl.hf_setup,
    "lbfgs_closure": rl.lbfgs_setup,
    "lbfgs_closure_dropout": lambda: rl.lbfgs_setup(dropout=0.2),
    "sam_two_passes": rl.sam_setup,
}


# ------------------------------------------------------------------ healthy ports
@pytest.mark.parametrize("port", list(PORTS))
def test_healthy_port_gets_no_fail_or_error(port):
    setup = PORTS[port]()
    with untouched(setup):
        results = diagnose(setup, checks=None)  # every check, dynamics and perf included
    assert not bad(results), bad(results)
    # What each port is about is actually checked, not skipped.
    expect_run = {
        "nanogpt_hand_set_lr": ["loop.scheduler_cadence"],
        "accelerate_accumulate": ["loop.scheduler_cadence", "loop.accumulation"],
        "native_scaler_wrapper": ["loop.loss_scaling"],
        "hf_trainer_num_items": ["loop.scheduler_cadence", "loop.accumulation", "loop.ddp"],
        "lbfgs_closure": ["loop.zero_grad", "loop.ddp", "loop.resume"],
        "lbfgs_closure_dropout": ["loop.train_mode"],
        "sam_two_passes": ["loop.zero_grad", "loop.resume", "loop.train_mode", "loop.ddp"],
    }.get(port, [])
    for cid in expect_run:
        assert results[cid].status is not Status.SKIP, (cid, results[cid].summary)


@pytest.mark.parametrize("port", ["manual_sgd", "manual_sgd_unused_optimizer", "word_lm_time_major_batch_dim"])
def test_hand_written_updates_are_observed_as_parameter_change(port):
    results = diagnose(PORTS[port](), ["loop.zero_grad", "loop.accumulation", "loop.resume", "model.overfit_batch",
                                       "model.gradient_flow"])
    for cid in ("loop.zero_grad", "loop.resume"):
        assert results[cid].status is Status.PASS, (cid, results[cid].summary)
        assert results[cid].metrics["observed_at"] == "parameter change"
    assert results["model.overfit_batch"].metrics["observed_at"] == "parameter change"
    assert results["model.gradient_flow"].status is Status.PASS, results["model.gradient_flow"].summary
    assert results["model.gradient_flow"].metrics["observed_at"] == "parameter change"
    assert results["model.gradient_flow"].metrics["recorded_steps"] == 20  # every call, not only the first


def test_an_optimizer_with_a_closure_is_read_at_its_first_evaluation():
    """LBFGS computes the loss inside step(closure): the gradient it steps with exists only after the closure ran.
    Read at step() entry, it was the previous step's leftover (a false loop.zero_grad FAIL, a 'no gradient reaches
    optimizer.step()' accumulation WARN) and each evaluation's all-reduce looked like wasted communication."""
    results = diagnose(rl.lbfgs_setup(), ["loop.zero_grad", "loop.accumulation", "loop.ddp"])
    z, a, d = results["loop.zero_grad"], results["loop.accumulation"], results["loop.ddp"]
    assert z.status is Status.PASS and z.metrics["grad_norm_step_t"] > 0, z.summary
    assert d.status is Status.PASS and "wasted" not in d.summary, d.summary
    assert d.metrics["closure_evaluations"] > 1
    # one all-reduce per evaluation
    assert d.metrics["synchronised_backward_passes"] == d.metrics["closure_evaluations"]
    # The step reads micro_batches[0] (it never accumulates): latent, and named for what it is.
    assert (a.status is Status.WARN and a.metrics.get("latent")
            and "only the first micro-batch is used" in a.summary), a.summary


def test_a_closure_that_forgets_zero_grad_is_caught_by_zero_grad():
    r = diagnose(rl.lbfgs_setup(forget_zero_grad=True), ["loop.zero_grad"])["loop.zero_grad"]
    assert r.status is Status.FAIL, r.summary
    assert "plus the gradient left over from step 1" in r.summary


def test_a_wrapper_optimizer_stepping_its_base_is_read_at_the_base_step():
    """SAM never calls its own step(): second_step calls base_optimizer.step(). Hooked on the wrapper only, the
    step looked like it changed no parameter (a false loop.train_mode ERROR), and tropt's own snapshot missed the base
    optimizer's momentum (a false loop.zero_grad FAIL); its two synchronised passes each start from cleared
    gradients, so neither all-reduce is wasted."""
    results = diagnose(rl.sam_setup(), ["loop.zero_grad", "loop.train_mode", "loop.ddp"])
    for cid in ("loop.zero_grad", "loop.train_mode", "loop.ddp"):
        assert results[cid].status is Status.PASS, (cid, results[cid].summary)
    assert results["loop.zero_grad"].metrics["observed_at"] == "optimizer.step"
    d = results["loop.ddp"]
    assert d.metrics["synchronised_backward_passes"] == 2 and "wasted" not in d.summary, d.summary


def test_a_checkpoint_without_the_wrapped_optimizer_state_is_caught_by_resume():
    """SAM's state_dict() leaves out its base optimizer's momentum (davda54/sam#73): resume FAILs, naming it."""
    r = diagnose(rl.sam_setup(checkpoint_base=False), ["loop.resume"])["loop.resume"]
    assert r.status is Status.FAIL and "first divergence: wrapped optimizer state" in r.summary, r.summary
    assert any("base_optimizer" in a for a in r.advice)


def test_native_scaler_wrapper_is_read_through_its_own_gradscaler():
    r = diagnose(rl.native_scaler_setup(), ["loop.loss_scaling"])["loop.loss_scaling"]
    assert r.status is Status.PASS, r.summary
    assert r.metrics["scaler"] == "the step's own GradScaler" and r.metrics["scale_large"] == 2.0 ** 16


# ------------------------------------------------------------------ planted bugs, each caught by its check
def test_lr_counter_advanced_per_micro_batch_is_caught_by_scheduler_cadence():
    results = diagnose(rl.nanogpt_setup(lr_per_micro=True), ["loop"])
    r = results["loop.scheduler_cadence"]
    assert r.status is Status.FAIL, r.summary
    assert "advances per micro-batch" in r.summary and r.metrics["per_micro_batch_confirmed"] is True
    assert [cid for cid, x in results.items() if x.status is Status.FAIL] == ["loop.scheduler_cadence"]


@pytest.mark.parametrize("clip", [None, 1.0])
def test_missing_division_by_k_is_caught_with_and_without_clipping(clip):
    # The full-batch gradient norm is about 0.7: summed over 4 micro-steps it is about 2.9, so 1.0 clips.
    # needs lead's pre-clip capture (clip=1.0): after clipping both runs have norm 1 and only the pre-clip
    # gradients show the 4x sum
    r = diagnose(rl.nanogpt_setup(divide=False, clip=clip), ["loop.accumulation"])["loop.accumulation"]
    assert r.status is Status.FAIL, r.summary
    assert "4× the full-batch one: micro-batch losses are summed" in r.summary, r.summary


@pytest.mark.parametrize("clip", [None, 1.0, 0.1])
def test_per_micro_batch_token_mean_is_caught_with_and_without_clipping(clip):
    # The gradient norm here is about 0.7, so only clip=0.1 actually clips.
    # needs lead's pre-clip capture (clip=0.1) for the same verdict and cause under clipping in every case
    r = diagnose(rl.hf_setup(per_micro_mean=True, clip=clip), ["loop.accumulation"])["loop.accumulation"]
    assert r.status is Status.FAIL, r.summary
    assert "average of per-micro-batch mean losses" in r.summary, r.summary


@pytest.mark.parametrize("clip", [None, 1.0, 0.1])
def test_zero_grad_inside_the_micro_step_loop_is_caught_by_accumulation(clip):
    # needs lead's pre-clip capture (clip=0.1, which binds) for the same cause under clipping
    r = diagnose(rl.nanogpt_setup(zero_inside=True, clip=clip), ["loop.accumulation"])["loop.accumulation"]
    assert r.status is Status.FAIL, r.summary
    assert "only the last micro-batch" in r.summary


@pytest.mark.parametrize("k", [4, 1])
def test_double_optimizer_step_fails_in_exactly_one_check_with_the_count(k):
    # needs lead's wiring of steps_per_call_note in check_accumulation: FAIL on the calls of both runs (the
    # 1-micro-batch run too), never turned into a latent WARN for K=1 Setups
    results = diagnose(rl.nanogpt_setup(double_step=True, k=k), ["loop"])
    failing = {cid: r.summary for cid, r in results.items() if r.status is Status.FAIL}
    assert list(failing) == ["loop.accumulation"], failing
    assert "2 times" in failing["loop.accumulation"]
    for cid in ("loop.zero_grad", "loop.scheduler_cadence", "loop.resume", "loop.ddp"):
        assert (results[cid].status is Status.WARN
                and "loop.accumulation reports this" in results[cid].summary), (cid, results[cid].summary)
        assert results[cid].metrics["optimizer_steps_per_call"] == 2


def test_manual_sgd_without_zero_grad_is_caught_by_zero_grad():
    r = diagnose(rl.manual_sgd_setup(forget_zero_grad=True), ["loop.zero_grad"])["loop.zero_grad"]
    assert r.status is Status.FAIL and r.metrics["observed_at"] == "parameter change", r.summary
    assert "update (parameter change) differs from a fresh one" in r.summary


def test_native_scaler_clipping_before_unscale_is_caught_by_loss_scaling():
    r = diagnose(rl.native_scaler_setup(clip_before_unscale=True), ["loop.loss_scaling"])["loop.loss_scaling"]
    assert r.status is Status.FAIL, r.summary
    assert "clip_grad_norm_ ran on still-scaled gradients" in r.summary


def test_accelerate_needs_to_be_told_the_accumulation_steps_of_each_run(monkeypatch):
    """The script configures gradient_accumulation_steps=4: the K=1 runs would never step without tropt telling it."""
    import contextlib

    setup = accelerate_port()
    assert not bad(diagnose(setup, ["loop.accumulation", "loop.scheduler_cadence"]))
    monkeypatch.setattr("tropt.setup.accelerate_told", lambda ctx, mb: contextlib.nullcontext())
    untold = diagnose(rl.accelerate_setup(), ["loop.accumulation"])["loop.accumulation"]
    assert untold.status is Status.ERROR and "never called optimizer.step()" in untold.summary
