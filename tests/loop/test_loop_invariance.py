"""Stage 4 with known answers: standard_step passes everything; each planted bug is caught by exactly its check."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

import tropt
from tropt.loop import check_accumulation, check_loss_scaling, check_resume, check_scheduler_cadence, check_zero_grad
from tropt.result import Status
from tropt.testing import untouched

from support import ce_loss, make_classification

CHECKS = {
    "loop.zero_grad": check_zero_grad,
    "loop.accumulation": check_accumulation,
    "loop.loss_scaling": check_loss_scaling,
    "loop.scheduler_cadence": check_scheduler_cadence,
    "loop.resume": check_resume,
}


def mlp_setup(step=None, *, k=1, scheduler=True, clip=None, scaler=False, optimizer="adamw", dropout=0.0, **kw):
    x, y = make_classification(n=96, d=10, classes=4, seed=1)
    batches = [(x[i:i + 24], y[i:i + 24]) for i in range(0, 96, 24)]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Dropout(dropout), nn.Linear(32, 4))
    opt = {"adamw": lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2),
           "sgd": lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)}[optimizer]
    return tropt.Setup(model, ce_loss, opt, batches, step=step, accumulation_steps=k,
                       scheduler=(lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda s: 1.0 / (1 + s))) if scheduler else None,
                       grad_clip=clip, use_scaler=scaler, precision="fp16" if scaler else "fp32", num_classes=4, **kw)


def run_all(setup):
    out = {}
    for cid, fn in CHECKS.items():
        with untouched(setup):  # the shared no-mutation helper, on every check
            out[cid] = fn(setup)
    return out


def statuses(results):
    return {cid: r.status for cid, r in results.items()}


# ------------------------------------------------------------------ the reference step passes everything
@pytest.mark.parametrize("k, clip, scaler, scheduler", [
    (1, None, False, True), (4, None, False, True), (4, 0.5, False, False), (1, 0.5, True, True), (4, 0.05, True, True),
])
def test_standard_step_passes_every_check(k, clip, scaler, scheduler):
    results = run_all(mlp_setup(k=k, clip=clip, scaler=scaler, scheduler=scheduler))
    for cid, r in results.items():
        expected = Status.SKIP if (cid == "loop.loss_scaling" and not scaler) or (cid == "loop.scheduler_cadence" and not scheduler) else Status.PASS
        assert r.status is expected, (cid, r.summary)


# ------------------------------------------------------------------ planted bugs
def step_without_zero_grad(ctx, micro_batches):
    for mb in micro_batches:
        (ctx.loss_fn(ctx.model, mb) / len(micro_batches)).backward()
    ctx.optimizer.step()
    if ctx.scheduler is not None:
        ctx.scheduler.step()


def step_loss_not_divided(ctx, micro_batches):
    for mb in micro_batches:
        ctx.loss_fn(ctx.model, mb).backward()
    ctx.optimizer.step()
    ctx.optimizer.zero_grad()
    if ctx.scheduler is not None:
        ctx.scheduler.step()


def step_scheduler_per_micro_batch(ctx, micro_batches):
    for mb in micro_batches:
        (ctx.loss_fn(ctx.model, mb) / len(micro_batches)).backward()
        ctx.scheduler.step()
    ctx.optimizer.step()
    ctx.optimizer.zero_grad()


def step_clip_before_unscale(ctx, micro_batches):
    for mb in micro_batches:
        with ctx.autocast():
            loss = ctx.loss_fn(ctx.model, mb) / len(micro_batches)
        ctx.scaler.scale(loss).backward()
    torch.nn.utils.clip_grad_norm_(ctx.model.parameters(), ctx.grad_clip)  # still scaled!
    ctx.scaler.step(ctx.optimizer)
    ctx.scaler.update()
    ctx.optimizer.zero_grad()
    ctx.scheduler.step()


def test_missing_zero_grad_is_caught_by_zero_grad_only():
    results = run_all(mlp_setup(step_without_zero_grad, k=2))
    r = results["loop.zero_grad"]
    assert r.status is Status.FAIL and "left over from step 1" in r.summary
    assert r.metrics["leak_equals_leftover_gradient"] is True
    assert "zero_grad" in r.advice[0]
    assert {c: s for c, s in statuses(results).items() if s is Status.FAIL} == {"loop.zero_grad": Status.FAIL}


def test_zero_grad_between_backward_and_step_is_caught():
    def step(ctx, mbs):
        ctx.loss_fn(ctx.model, mbs[0]).backward()
        ctx.optimizer.zero_grad()
        ctx.optimizer.step()

    r = check_zero_grad(mlp_setup(step, scheduler=False))
    assert r.status is Status.FAIL and "no gradient reaches optimizer.step()" in r.summary


def test_loss_not_divided_by_k_is_caught_by_accumulation_only():
    results = run_all(mlp_setup(step_loss_not_divided, k=4))
    r = results["loop.accumulation"]
    assert r.status is Status.FAIL and "summed, not averaged" in r.summary
    assert abs(r.metrics["grad_norm_ratio"] - 4) < 0.01 and r.metrics["k"] == 4
    assert "Divide each micro-batch loss by K=4" in r.advice[0]
    assert set(r.tables["parameters"]["tensor"]) == {"0.weight", "0.bias", "3.weight", "3.bias"}
    assert [c for c, s in statuses(results).items() if s is Status.FAIL] == ["loop.accumulation"]


def test_step_per_micro_batch_is_named():
    def step(ctx, mbs):
        for mb in mbs:
            (ctx.loss_fn(ctx.model, mb) / len(mbs)).backward()
            ctx.optimizer.step()
            ctx.optimizer.zero_grad()

    r = check_accumulation(mlp_setup(step, k=4, scheduler=False))
    assert r.status is Status.FAIL and "optimizer.step() ran 4 times" in r.summary


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
    r = check_scheduler_cadence(mlp_setup(lambda ctx, mbs: tropt.standard_step(ctx.__class__(**{**ctx.__dict__, "scheduler": None}), mbs)))
    assert r.status is Status.WARN and "did not move during 1 optimizer step " in r.summary and "per epoch" in r.summary
    assert any("per-epoch scheduler" in a for a in r.advice)


def test_clipping_before_unscale_is_caught_by_loss_scaling_only():
    results = run_all(mlp_setup(step_clip_before_unscale, clip=0.5, scaler=True))
    r = results["loop.loss_scaling"]
    assert r.status is Status.FAIL and "clip_grad_norm_ ran on still-scaled gradients" in r.summary
    assert "unscale_(optimizer) before clip_grad_norm_" in r.advice[0]
    assert [c for c, s in statuses(results).items() if s is Status.FAIL] == ["loop.loss_scaling"]


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
        ctx.model.load_state_dict(s["m"]); ctx.optimizer.load_state_dict(s["o"]); ctx.scheduler.load_state_dict(s["s"])

    r = check_resume(mlp_setup(save_state=save, load_state=load))
    assert r.status is Status.WARN and "RNG is not restored" in r.summary
    r = check_resume(mlp_setup(save_state=save, load_state=load, dropout=0.3))  # now dropout masks diverge
    assert r.status is Status.FAIL and "first divergence: RNG" in r.summary
    assert check_resume(mlp_setup(dropout=0.3)).status is Status.PASS  # tropt's full checkpoint restores RNG


def test_state_holding_live_references_is_caught():
    # Returning the live parameters (no copy) looks fine in memory but the "checkpoint" keeps training along.
    r = check_resume(mlp_setup(optimizer="sgd", scheduler=False,
                               save_state=lambda ctx: {"params": list(ctx.model.parameters()), "opt": ctx.optimizer.state_dict()},
                               load_state=lambda ctx, s: [p.data.copy_(q) for p, q in zip(ctx.model.parameters(), s["params"])]
                               and ctx.optimizer.load_state_dict(s["opt"])))
    assert r.status in (Status.PASS, Status.WARN)  # torch.save cuts the references, so the file is what was saved
    assert r.metrics["final_param_max_rel_error"] <= 1e-5


# ------------------------------------------------------------------ token-level losses (the 2024 transformers bug)
class TinyLM(nn.Module):
    def __init__(self, vocab=20, dim=16):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.out = nn.Linear(dim, vocab)

    def forward(self, ids):
        return self.out(torch.tanh(self.emb(ids)))


def token_batches(n_batches=3, b=8, max_len=12, vocab=20):
    g = torch.Generator().manual_seed(3)
    out = []
    for _ in range(n_batches):
        lengths = torch.randint(2, max_len + 1, (b,), generator=g)
        ids = torch.randint(1, vocab, (b, max_len), generator=g)
        mask = torch.arange(max_len)[None, :] < lengths[:, None]
        out.append({"input_ids": ids * mask, "attention_mask": mask})
    return out


def token_losses(model, batch):
    logits = model(batch["input_ids"][:, :-1])
    target = batch["input_ids"][:, 1:]
    valid = batch["attention_mask"][:, 1:]
    per_token = F.cross_entropy(logits.transpose(1, 2), target, reduction="none")
    return (per_token * valid).sum(), valid.sum()


def lm_loss(model, batch):
    total, count = token_losses(model, batch)
    return total / count


def step_per_micro_batch_token_mean(ctx, micro_batches):  # the bug
    for mb in micro_batches:
        total, count = token_losses(ctx.model, mb)
        (total / count / len(micro_batches)).backward()
    ctx.optimizer.step()
    ctx.optimizer.zero_grad()


def step_global_token_mean(ctx, micro_batches):  # the fix
    n_tokens = sum(int(mb["attention_mask"][:, 1:].sum()) for mb in micro_batches)
    for mb in micro_batches:
        total, _ = token_losses(ctx.model, mb)
        (total / n_tokens).backward()
    ctx.optimizer.step()
    ctx.optimizer.zero_grad()


def lm_setup(step):
    torch.manual_seed(0)
    return tropt.Setup(TinyLM(), lm_loss, lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2), token_batches(), step=step,
                       accumulation_steps=4)


def test_token_mean_bug_is_caught_and_fix_passes():
    buggy = lm_setup(step_per_micro_batch_token_mean)
    with untouched(buggy):
        r = check_accumulation(buggy)
    assert r.status is Status.FAIL and "normalised by its own item count" in r.summary
    assert "total item count of the whole optimizer step" in r.advice[0]
    fixed = lm_setup(step_global_token_mean)
    results = run_all(fixed)
    assert results["loop.accumulation"].status is Status.PASS, results["loop.accumulation"].summary
    assert not [c for c, rr in results.items() if rr.status is Status.FAIL]


# ------------------------------------------------------------------ batch-dependent layers
def bn_cnn_setup():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 1, 8, 8, generator=g)
    y = (x.mean((1, 2, 3)) > 0).long()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(256, 2))
    return tropt.Setup(model, ce_loss, lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9),
                       [(x[i:i + 16], y[i:i + 16]) for i in range(0, 64, 16)], accumulation_steps=4)


def test_batchnorm_cnn_with_correct_loop_warns_never_fails():
    results = run_all(bn_cnn_setup())
    r = results["loop.accumulation"]
    assert r.status is Status.WARN and "BatchNorm" in r.summary
    assert r.metrics["frozen_max_rel_error"] <= r.metrics["tolerance"] < r.metrics["max_rel_error"]
    assert list(r.tables["batch_dependent_layers"]["layer"]) == ["1"]
    assert not [c for c, rr in results.items() if rr.status is Status.FAIL]


def test_batchnorm_cnn_with_wrong_loop_still_fails():
    setup = bn_cnn_setup().replace(step=step_loss_not_divided)
    r = check_accumulation(setup)
    assert r.status is Status.FAIL and "even with BatchNorm statistics frozen" in r.summary


# ------------------------------------------------------------------ uneven micro-batches and dict batches
@pytest.mark.parametrize("k, sizes", [(2, "18+6"), (4, "15+3+3+3")])
def test_divide_by_k_is_exact_only_for_equal_micro_batches(k, sizes):
    def step(ctx, mbs):  # the common loop: loss / K
        for mb in mbs:
            (ctx.loss_fn(ctx.model, mb) / len(mbs)).backward()
        ctx.optimizer.step()
        ctx.optimizer.zero_grad()

    # Every batch holds 24 samples, a multiple of K: this data never gives unequal micro-batches (a latent note).
    r = check_accumulation(mlp_setup(step, k=k, scheduler=False))
    assert r.status is Status.PASS and r.metrics["latent"] and "unequal sizes" in r.summary, r.summary
    assert r.metrics["uneven_sizes"] == sizes and r.metrics["train_batch_sizes"] == "24"
    # A short last batch (24, 24, 24, 21): unequal micro-batches happen, so the WARN stays.
    setup = mlp_setup(step, k=k, scheduler=False)
    short = setup.replace(train_data=list(setup.train_data[:3]) + [tuple(t[:21] for t in setup.train_data[3])])
    r = check_accumulation(short)
    assert r.status is Status.WARN and "unequal sizes" in r.summary and r.metrics["train_batch_sizes"] == "21, 24", r.summary


def test_divide_by_k_on_a_dataloader_with_a_short_last_batch_warns():
    def step(ctx, mbs):
        for mb in mbs:
            (ctx.loss_fn(ctx.model, mb) / len(mbs)).backward()
        ctx.optimizer.step()
        ctx.optimizer.zero_grad()

    x, y = make_classification(n=91, d=10, classes=4, seed=1)  # 24+24+24+19: the last batch cannot split in 2 equal parts
    ds = torch.utils.data.TensorDataset(x, y)
    setup = mlp_setup(step, k=2, scheduler=False)
    assert check_accumulation(setup.replace(train_data=torch.utils.data.DataLoader(ds, batch_size=24))).status is Status.WARN
    fixed = check_accumulation(setup.replace(train_data=torch.utils.data.DataLoader(ds, batch_size=24, drop_last=True)))
    assert fixed.status is Status.PASS and fixed.metrics["latent"]


def test_dict_batches_work():
    x, y = make_classification(n=64, d=6, classes=3)
    batches = [{"features": x[i:i + 16], "label": y[i:i + 16], "source": "synthetic"} for i in range(0, 64, 16)]
    setup = tropt.Setup(nn.Linear(6, 3), lambda m, b: F.cross_entropy(m(b["features"]), b["label"]),
                        lambda m: torch.optim.Adam(m.parameters(), lr=1e-2), batches, accumulation_steps=2,
                        scheduler=lambda o: torch.optim.lr_scheduler.StepLR(o, 1, 0.5))
    assert {cid: r.status for cid, r in run_all(setup).items()} == {
        "loop.zero_grad": Status.PASS, "loop.accumulation": Status.PASS, "loop.loss_scaling": Status.SKIP,
        "loop.scheduler_cadence": Status.PASS, "loop.resume": Status.PASS}


# ------------------------------------------------------------------ broken steps give a clear ERROR
def test_step_that_raises_or_never_steps_is_an_error_in_diagnose():
    def raises(ctx, mbs):
        raise RuntimeError("CUDA out of memory (pretend)")

    report = tropt.diagnose(mlp_setup(raises), checks="loop", progress=False)
    for r in report:
        if r.status is not Status.SKIP:
            assert r.status is Status.ERROR and "raised RuntimeError: CUDA out of memory (pretend)" in r.summary, r.check

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


def test_accumulation_defects_are_latent_warnings_for_a_setup_that_does_not_accumulate():
    """The same buggy step FAILs with accumulation_steps=4 and is a WARN (latent, named as such) with 1, where the
    user's updates are not affected yet; a schedule that never moves is the same WARN either way."""
    for step, check in ((step_loss_not_divided, check_accumulation), (step_scheduler_per_micro_batch, check_scheduler_cadence)):
        used = check(mlp_setup(step, k=4))
        assert used.status is Status.FAIL and "latent" not in used.metrics
        unused = check(mlp_setup(step, k=1))
        assert unused.status is Status.WARN and unused.summary.startswith("latent") and unused.metrics["latent"] is True
        assert unused.summary.split("yet): ", 1)[1] == used.summary  # the same finding, named latent
        assert unused.advice[0].startswith("Fix this before turning on gradient accumulation")

    def never_schedules(ctx, mbs):
        for mb in mbs:
            (ctx.loss_fn(ctx.model, mb) / len(mbs)).backward()
        ctx.optimizer.step()
        ctx.optimizer.zero_grad()

    never = check_scheduler_cadence(mlp_setup(never_schedules, k=1))
    assert never.status is Status.WARN and "latent" not in never.metrics  # maybe per-epoch: the same WARN for any K


# ------------------------------------------------------------------ non-finite state (ReduceLROnPlateau's best = inf)
def step_plateau(ctx, micro_batches):
    """A correct step for a metric-based scheduler: scheduler.step(loss) once per optimizer step."""
    total = 0.0
    for mb in micro_batches:
        loss = ctx.loss_fn(ctx.model, mb) / len(micro_batches)
        loss.backward()
        total += loss.item()
    ctx.optimizer.step()
    ctx.optimizer.zero_grad()
    ctx.scheduler.step(total)


def plateau_setup(**kw):
    return mlp_setup(step_plateau, **kw).replace(
        scheduler=lambda o: torch.optim.lr_scheduler.ReduceLROnPlateau(o, patience=0, factor=0.5))


def test_non_finite_entries_are_compared_exactly_not_hidden_by_the_scale():
    from tropt.loop.harness import compare_tensors, max_rel_error

    inf = float("inf")
    a = {"best": torch.tensor(1.0), "mode_worse": torch.tensor(inf), "w": torch.tensor([1.0, inf, 2.0])}
    b = {"best": torch.tensor(inf), "mode_worse": torch.tensor(inf), "w": torch.tensor([1.0, inf, 2.0])}
    assert max_rel_error(a, b) == 1.0  # inf vs 1 is a full mismatch, not 0 relative to an infinite scale
    table = compare_tensors(a, b).set_index("tensor")
    assert table.loc["best", "rel_error"] == 1.0 and table.loc["mode_worse", "rel_error"] == 0.0
    assert table.loc["w", "rel_error"] == 0.0 and np.isfinite(table[["norm_a", "norm_b", "abs_diff"]].to_numpy()).all()
    b["w"] = torch.tensor([1.5, inf, 2.0])  # finite entries still compared relative to the finite norm
    assert 0.1 < compare_tensors(a, b).set_index("tensor").loc["w", "rel_error"] < 0.3
    assert max_rel_error({"x": torch.tensor(float("nan"))}, {"x": torch.tensor(float("nan"))}) == 0.0


def test_resume_that_forgets_a_plateau_scheduler_is_not_a_pass():
    def save(ctx):
        return {"m": ctx.model.state_dict(), "o": ctx.optimizer.state_dict()}

    def load(ctx, s):
        ctx.model.load_state_dict(s["m"]); ctx.optimizer.load_state_dict(s["o"])

    r = check_resume(plateau_setup(save_state=save, load_state=load))
    assert r.status is not Status.PASS, r.summary
    assert not r.tables["components"].set_index("component").loc["schedule position", "restored"]
    assert "schedule position" in r.summary
    good = plateau_setup()
    with untouched(good):
        assert check_resume(good).status is Status.PASS  # tropt's full checkpoint restores best = 1.x, not inf


# ------------------------------------------------------------------ scheduler cadence: what K=1 alone shows
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
    assert "latent" not in r.metrics and r.metrics["schedule_steps_per_optimizer_step"] == 2  # shows without accumulation
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
        assert r.metrics["lr_at_optimizer_step"] == pytest.approx(5e-3) and r.metrics["lr_planned"] == pytest.approx(1e-2)
    assert check_scheduler_cadence(mlp_setup(k=2).replace(scheduler=setup.scheduler)).status is Status.PASS  # control


def test_optimizer_step_per_micro_batch_is_named_in_cadence_not_as_a_schedule_difference():
    r = check_scheduler_cadence(mlp_setup(step_optimizer_per_micro_batch, k=4))
    assert r.status is Status.WARN, r.summary
    assert "optimizer.step() ran 4 times with K=4 but 1 with K=1" in r.summary and r.metrics["see_also"] == "loop.accumulation"
    report = tropt.diagnose(mlp_setup(step_optimizer_per_micro_batch, k=4), checks="loop", progress=False)
    assert report["loop.accumulation"].status is Status.FAIL
    assert report["loop.scheduler_cadence"].summary.endswith("loop.accumulation reports this defect")
    assert r.metrics["optimizer_steps_k4"] == 4 and "learning rates differ" not in r.summary


def test_correct_plateau_step_passes_cadence():
    setup = plateau_setup(k=2)
    with untouched(setup):
        r = check_scheduler_cadence(setup)
    assert r.status is Status.PASS, r.summary


@pytest.mark.parametrize("scheduler", ["warmup", "cosine", "plateau"])
def test_resume_that_forgets_the_scheduler_fails_even_after_one_step(scheduler):
    """Losing the schedule's position makes every later step diverge: FAIL at the default steps=1, where the
    updates themselves still agree (the optimizer's state_dict carries the current learning rate)."""
    def save(ctx):
        return {"m": ctx.model.state_dict(), "o": ctx.optimizer.state_dict()}

    def load(ctx, s):
        ctx.model.load_state_dict(s["m"]); ctx.optimizer.load_state_dict(s["o"])

    make = {"warmup": lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda s: min(1.0, (s + 1) / 10)),
            "cosine": lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, 50)}
    setup = plateau_setup() if scheduler == "plateau" else mlp_setup().replace(scheduler=make[scheduler])
    r = check_resume(setup.replace(save_state=save, load_state=load))
    assert r.status is Status.FAIL and "first divergence: schedule position" in r.summary, r.summary
    assert r.metrics["schedule_position_straight"] == 2 and r.metrics["schedule_position_resumed"] == 1
    if scheduler != "plateau":  # the next learning rate already differs
        assert "resuming changes the schedule" in r.summary and r.metrics["lr_after_straight"] != r.metrics["lr_after_resumed"]
    assert any("scheduler.state_dict()" in a for a in r.advice)
    assert check_resume(setup).status is Status.PASS  # control: tropt's full checkpoint


def test_accumulation_does_not_pass_when_no_gradient_reaches_the_optimizer():
    def step(ctx, mbs):  # zero_grad between backward and step: both runs step with no gradient, so they "match"
        for mb in mbs:
            (ctx.loss_fn(ctx.model, mb) / len(mbs)).backward()
        ctx.optimizer.zero_grad()
        ctx.optimizer.step()

    for k in (2, 4):
        r = check_accumulation(mlp_setup(step, k=k, scheduler=False))
        assert r.status is Status.WARN and "no gradient reaches optimizer.step()" in r.summary, r.summary
        # Run alone, it cannot know what loop.zero_grad found, so it names no other check; diagnose links them.
        assert "loop.zero_grad" not in r.summary and r.metrics["see_also"] == "loop.zero_grad"
        assert "never between backward() and step()" in r.advice[0]
    report = tropt.diagnose(mlp_setup(step, k=2, scheduler=False), checks=["loop.zero_grad", "loop.accumulation"], progress=False)
    assert report["loop.zero_grad"].status is Status.FAIL
    assert report["loop.accumulation"].summary.endswith("; loop.zero_grad reports this defect")
    report = tropt.diagnose(mlp_setup(step, k=2, scheduler=False), checks=["loop.accumulation"], progress=False)
    assert "reports this defect" not in report["loop.accumulation"].summary
    bn = bn_cnn_setup().replace(step=step)  # the BatchNorm path too
    assert check_accumulation(bn).status is Status.WARN


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
    assert tropt.diagnose(plateau_setup(), checks="loop", progress=False).status is not Status.ERROR  # its own step works


# ------------------------------------------------------------------ half precision: a bug under the tolerance
def long_token_batches(n_batches=2, b=16, max_len=12, vocab=20):
    """Sequences of 9-12 tokens: per-micro-batch token means are off by only ~2% on equal-sized micro-batches."""
    g = torch.Generator().manual_seed(5)
    out = []
    for _ in range(n_batches):
        lengths = torch.randint(9, max_len + 1, (b,), generator=g)
        ids = torch.randint(1, vocab, (b, max_len), generator=g)
        mask = torch.arange(max_len)[None, :] < lengths[:, None]
        out.append({"input_ids": ids * mask, "attention_mask": mask})
    return out


def test_token_mean_bug_hidden_by_the_bf16_tolerance_still_fails_with_its_cause():
    def buggy(ctx, micro_batches):
        for mb in micro_batches:
            with ctx.autocast():
                total, count = token_losses(ctx.model, mb)
            (total.float() / count / len(micro_batches)).backward()
        ctx.optimizer.step()
        ctx.optimizer.zero_grad()

    def fixed(ctx, micro_batches):
        n_tokens = sum(int(mb["attention_mask"][:, 1:].sum()) for mb in micro_batches)
        for mb in micro_batches:
            with ctx.autocast():
                total, _ = token_losses(ctx.model, mb)
            (total.float() / n_tokens).backward()
        ctx.optimizer.step()
        ctx.optimizer.zero_grad()

    torch.manual_seed(0)
    setup = tropt.Setup(TinyLM(), lm_loss, lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2), long_token_batches(),
                        step=buggy, accumulation_steps=2, precision="bf16")
    with untouched(setup):
        r = check_accumulation(setup)
    assert r.metrics["max_rel_error"] <= r.metrics["tolerance"]  # the equal split alone would hide it
    assert r.status is Status.FAIL and "normalised by its own item count" in r.summary, r.summary
    assert "hidden here under the bf16 tolerance" in r.summary and r.metrics["equal_split_error_of_cause_fp32"] > 1e-3
    assert "total item count of the whole optimizer step" in r.advice[0]
    assert check_accumulation(setup.replace(step=fixed)).status is Status.PASS
    # Per-sample means averaged with equal weights (loss / K) stay a WARN: exact for equal sizes, in bf16 too.
    def divide_by_k(ctx, micro_batches):
        for mb in micro_batches:
            with ctx.autocast():
                loss = ctx.loss_fn(ctx.model, mb)
            (loss.float() / len(micro_batches)).backward()
        ctx.optimizer.step()
        ctx.optimizer.zero_grad()

    plain = check_accumulation(mlp_setup(divide_by_k, k=2, scheduler=False).replace(precision="bf16"))
    # (a latent note: every batch of this data splits into equal micro-batches; never the per-micro-mean FAIL)
    assert plain.status is Status.PASS and plain.metrics["latent"] and "unequal sizes" in plain.summary, plain.summary


# ------------------------------------------------------------------ loss scaling: the cause follows the evidence
def scaled_backward(ctx, micro_batches):
    for mb in micro_batches:
        with ctx.autocast():
            loss = ctx.loss_fn(ctx.model, mb) / len(micro_batches)
        ctx.scaler.scale(loss).backward()


def step_unscaled_twice(ctx, micro_batches):
    scaled_backward(ctx, micro_batches)
    for p in ctx.model.parameters():  # a manual unscale...
        if p.grad is not None:
            p.grad /= ctx.scaler.get_scale()
    ctx.scaler.step(ctx.optimizer)  # ...and the scaler's own
    ctx.scaler.update()
    ctx.optimizer.zero_grad()


def step_clip_value_before_unscale(ctx, micro_batches):
    scaled_backward(ctx, micro_batches)
    torch.nn.utils.clip_grad_value_(ctx.model.parameters(), 0.01)  # still scaled
    ctx.scaler.step(ctx.optimizer)
    ctx.scaler.update()
    ctx.optimizer.zero_grad()


def test_loss_scaling_cause_matches_the_evidence_not_the_clip_setting():
    """With grad_clip set, a manual second unscale and clip_grad_value_ before unscale_ are named as what they are."""
    twice = check_loss_scaling(mlp_setup(step_unscaled_twice, clip=1.0, scaler=True, scheduler=False))
    assert twice.status is Status.FAIL and "unscaled twice" in twice.summary and "clip_grad_norm_" not in twice.summary, twice.summary
    assert twice.metrics["grad_norm_ratio"] * twice.metrics["scale_large"] == pytest.approx(1, rel=0.05)
    assert "do not also divide the gradients by the scale" in twice.advice[0]
    value = check_loss_scaling(mlp_setup(step_clip_value_before_unscale, clip=1.0, scaler=True, scheduler=False))
    assert value.status is Status.FAIL and "clip_grad_value_" in value.summary and "clip_grad_norm_" not in value.summary, value.summary
    assert value.metrics["value_clip_share"] > 0.5 and "±0.01 in scaled units" in value.summary
    norm = check_loss_scaling(mlp_setup(step_clip_before_unscale, clip=1.0, scaler=True))  # still named as before
    assert norm.status is Status.FAIL and "clip_grad_norm_ ran on still-scaled gradients" in norm.summary
