"""loop.accumulation with known answers: right verdict, right cause. Which run is wrong is decided against loss_fn
over the whole batch, causes are named from the gradients before clipping, and uneven micro-batches, BatchNorm,
token-level losses and half precision are handled."""

from __future__ import annotations

import pytest
import torch
from support import ce_loss, make_classification
from support.loop_cases import (
    TinyLM,
    lm_loss,
    lm_setup,
    mlp_setup,
    run_all,
    statuses,
    step_global_token_mean,
    step_loss_not_divided,
    step_per_micro_batch_token_mean,
    step_scheduler_per_micro_batch,
    token_losses,
)
from torch import nn
from torch.nn import functional as F

import tropt
from tropt.loop import check_accumulation, check_scheduler_cadence
from tropt.result import Status
from tropt.testing import untouched


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


@pytest.mark.parametrize("k, sizes", [(2, "18+6"), (4, "15+3+3+3")])
def test_divide_by_k_is_exact_only_for_equal_micro_batches(k, sizes):
    def step(ctx, mbs):  # the common loop: loss / K
        for mb in mbs:
            (ctx.loss_fn(ctx.model, mb) / len(mbs)).backward()
        ctx.optimizer.step()
        ctx.optimizer.zero_grad()

    # Every batch holds 24 samples, a multiple of K: this data never gives unequal micro-batches (a latent note).
    r = check_accumulation(mlp_setup(step, k=k, scheduler=False).replace(accumulation="split"))
    assert r.status is Status.PASS and r.metrics["latent"] and "unequal sizes" in r.summary, r.summary
    assert r.metrics["uneven_sizes"] == sizes and r.metrics["train_batch_sizes"] == "24"
    # A short last batch (24, 24, 24, 21): unequal micro-batches happen, so the WARN stays.
    setup = mlp_setup(step, k=k, scheduler=False).replace(accumulation="split")
    short = setup.replace(train_data=[*setup.train_data[:3], tuple(t[:21] for t in setup.train_data[3])])
    r = check_accumulation(short)
    assert (r.status is Status.WARN and "unequal sizes" in r.summary
            and r.metrics["train_batch_sizes"] == "21, 24"), r.summary


def test_divide_by_k_on_a_dataloader_with_a_short_last_batch_warns():
    def step(ctx, mbs):
        for mb in mbs:
            (ctx.loss_fn(ctx.model, mb) / len(mbs)).backward()
        ctx.optimizer.step()
        ctx.optimizer.zero_grad()

    # 24+24+24+19: the last batch cannot split in 2 equal parts
    x, y = make_classification(n=91, d=10, classes=4, seed=1)
    ds = torch.utils.data.TensorDataset(x, y)
    setup = mlp_setup(step, k=2, scheduler=False)
    assert (check_accumulation(setup.replace(train_data=torch.utils.data.DataLoader(ds, batch_size=24))).status
            is Status.WARN)
    fixed = check_accumulation(setup.replace(train_data=torch.utils.data.DataLoader(ds, batch_size=24, drop_last=True)))
    assert fixed.status is Status.PASS and fixed.metrics["latent"]


def test_accumulation_defects_are_latent_warnings_for_a_setup_that_does_not_accumulate():
    """The same buggy step FAILs with accumulation_steps=4 and is a WARN (latent, named as such) with 1, where the
    user's updates are not affected yet; a schedule that never moves is the same WARN either way."""
    for step, check in ((step_loss_not_divided, check_accumulation),
                        (step_scheduler_per_micro_batch, check_scheduler_cadence)):
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
    report = tropt.diagnose(mlp_setup(step, k=2, scheduler=False), checks=["loop.zero_grad", "loop.accumulation"],
                            progress=False)
    assert report["loop.zero_grad"].status is Status.FAIL
    assert report["loop.accumulation"].summary.endswith("; loop.zero_grad reports this defect")
    report = tropt.diagnose(mlp_setup(step, k=2, scheduler=False), checks=["loop.accumulation"], progress=False)
    assert "reports this defect" not in report["loop.accumulation"].summary
    bn = bn_cnn_setup().replace(step=step)  # the BatchNorm path too
    assert check_accumulation(bn).status is Status.WARN


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


ACCUM = 4  # a module constant, as many loops have it


def step_constant_divisor(ctx, micro_batches):
    for mb in micro_batches:
        (ctx.loss_fn(ctx.model, mb) / ACCUM).backward()  # right only when len(micro_batches) == ACCUM
    ctx.optimizer.step()
    ctx.optimizer.zero_grad()


def clipped(step_body):
    """The same step with clip_grad_norm_(…, 1.0) between the backward passes and optimizer.step()."""
    def step(ctx, micro_batches):
        step_body(ctx, micro_batches)
        torch.nn.utils.clip_grad_norm_(ctx.model.parameters(), 1.0)
        ctx.optimizer.step()
        ctx.optimizer.zero_grad()
    return step


def backward_not_divided(ctx, micro_batches):
    for mb in micro_batches:
        ctx.loss_fn(ctx.model, mb).backward()


def backward_token_mean_per_micro_batch(ctx, micro_batches):
    for mb in micro_batches:
        total, count = token_losses(ctx.model, mb)
        (total / count / len(micro_batches)).backward()


def backward_zero_grad_inside(ctx, micro_batches):
    for mb in micro_batches:
        ctx.optimizer.zero_grad()  # clears what the earlier micro-batches gave
        (ctx.loss_fn(ctx.model, mb) / len(micro_batches)).backward()


def unclipped(step_body):
    def step(ctx, micro_batches):
        step_body(ctx, micro_batches)
        ctx.optimizer.step()
        ctx.optimizer.zero_grad()
    return step


def test_constant_divisor_is_right_at_its_own_k_and_named_for_what_it_is():
    # Configured K=4 = the constant: the K=4 run is right, the K=1 reference run is 1/4 off. A latent WARN.
    setup = mlp_setup(step_constant_divisor, k=4, scheduler=False)
    with untouched(setup):
        r = check_accumulation(setup)
    assert r.status is Status.WARN and r.metrics["latent"] and r.metrics["cause"] == "constant_divisor", r.summary
    assert "divides the loss by a constant 4 whatever the number of micro-batches: correct at K=4" in r.summary
    assert r.metrics["reference_factor_kx"] == pytest.approx(1.0, rel=1e-4)
    assert r.metrics["reference_factor_1x"] == pytest.approx(0.25, rel=1e-4)
    assert "len(micro_batches)" in r.advice[0] and "normalised by its own item count" not in r.summary
    # At another configured K the same step is wrong where it is used: FAIL, same cause.
    for k in (1, 2):
        r = check_accumulation(mlp_setup(step_constant_divisor, k=k, scheduler=False))
        assert r.status is Status.FAIL and "latent" not in r.metrics, (k, r.summary)
        assert r.metrics["cause"] == "constant_divisor" and "correct at K=4" in r.summary


@pytest.mark.parametrize("body, cause, words", [
    (backward_not_divided, "summed", "summed, not averaged"),
    (backward_zero_grad_inside, "last_only", "only the last micro-batch reaches the step"),
])
def test_the_same_bug_gets_the_same_verdict_and_cause_with_and_without_clipping(body, cause, words):
    results = {}
    for name, step in (("plain", unclipped(body)), ("clip 1.0", clipped(body))):
        r = check_accumulation(mlp_setup(step, k=4, scheduler=False))
        assert r.status is Status.FAIL and r.metrics["cause"] == cause and words in r.summary, (name, r.summary)
        results[name] = r
    # Clipping to norm 1 hides a sum's magnitude at optimizer.step(): the evidence that decides is the pre-clip
    # comparison, which the result keeps. Zeroing inside the loop loses gradients after backward: pre-clip agrees.
    pre, tol = results["clip 1.0"].metrics["pre_clip_max_rel_error"], results["clip 1.0"].metrics["tolerance"]
    assert (pre > tol) == (cause == "summed")


def test_token_mean_per_micro_batch_is_named_under_clipping_too():
    for step in (unclipped(backward_token_mean_per_micro_batch), clipped(backward_token_mean_per_micro_batch)):
        r = check_accumulation(lm_setup(step))
        assert r.status is Status.FAIL and r.metrics["cause"] == "per_micro_mean", r.summary
        assert "normalised by its own item count" in r.summary
    assert check_accumulation(lm_setup(step_global_token_mean)).status is Status.PASS  # control


def test_a_correct_clipped_step_passes():
    def body(ctx, micro_batches):
        for mb in micro_batches:
            (ctx.loss_fn(ctx.model, mb) * (len(mb[1]) / sum(len(m[1]) for m in micro_batches))).backward()
    r = check_accumulation(mlp_setup(clipped(body), k=4, scheduler=False))
    assert r.status is Status.PASS, r.summary


def test_two_optimizer_steps_per_call_fail_in_accumulation_with_the_count():
    def step(ctx, micro_batches):
        for mb in micro_batches:
            (ctx.loss_fn(ctx.model, mb) / len(micro_batches)).backward()
        ctx.optimizer.step()
        ctx.optimizer.step()  # applied twice
        ctx.optimizer.zero_grad()
    for k in (1, 4):
        r = check_accumulation(mlp_setup(step, k=k, scheduler=False))
        assert r.status is Status.FAIL and "optimizer.step() ran 2 times per call" in r.summary, r.summary
        assert r.metrics["optimizer_steps_per_call"] == 2 and "latent" not in r.metrics


def test_an_inner_loop_of_updates_each_after_a_fresh_backward_is_not_a_repeated_update():
    """BigGAN's num_D_steps, WGAN's n_critic inside one call, PPO's epochs: each update follows its own backward, so
    none is an update applied again (the FAIL above); the one-update-per-call comparison says it cannot judge it."""
    def step(ctx, micro_batches):
        for _ in range(2):
            ctx.optimizer.zero_grad()
            for mb in micro_batches:
                (ctx.loss_fn(ctx.model, mb) / len(micro_batches)).backward()
            ctx.optimizer.step()
    for k in (1, 4):
        r = check_accumulation(mlp_setup(step, k=k, scheduler=False))
        assert r.status is Status.WARN and r.metrics["inner_loop"] and "fresh backward" in r.summary, r.summary
        assert r.metrics["optimizer_steps_per_call"] == 2


def test_a_step_that_cannot_take_smaller_micro_batches_is_latent_without_accumulation():
    def step(ctx, micro_batches):  # a per-batch state sized for the full batch, as a naive recurrent loop keeps
        if not hasattr(ctx, "state"):
            ctx.state = torch.zeros(24, 4)
        for x, y in micro_batches:
            F.cross_entropy(ctx.model(x) + ctx.state, y).backward()
        ctx.optimizer.step()
        ctx.optimizer.zero_grad()

    r = check_accumulation(mlp_setup(step, k=1, scheduler=False))
    assert r.status is Status.WARN and r.metrics["latent"] and "cannot run with 4 micro-batches" in r.summary, r.summary
    report = tropt.diagnose(mlp_setup(step, k=2, scheduler=False), checks=["loop.accumulation"], progress=False)
    # with accumulation on, the step is broken where it is used
    assert report["loop.accumulation"].status is Status.ERROR


def readme_step(ctx, micro_batches):
    """README "Fitting your loop", first pattern: each micro-batch loss / len(micro_batches), clip, step."""
    for mb in micro_batches:
        (ctx.loss_fn(ctx.model, mb) / len(micro_batches)).backward()
    torch.nn.utils.clip_grad_norm_(ctx.model.parameters(), 1.0)
    ctx.optimizer.step()
    ctx.optimizer.zero_grad(set_to_none=True)


def _loader_setup(loader, k):
    return mlp_setup(readme_step, k=k, scheduler=False).replace(train_data=loader, accumulation="split")


def _dataset(n=91):
    x, y = make_classification(n=n, d=10, classes=4, seed=1)
    return torch.utils.data.TensorDataset(x, y)


class Stream(torch.utils.data.IterableDataset):
    """Batches of 24 from an iterable dataset: their sizes cannot be known without reading it."""

    def __iter__(self):
        x, y = make_classification(n=96, d=10, classes=4, seed=1)
        yield from ((x[i:i + 24], y[i:i + 24]) for i in range(0, 96, 24))


def test_unequal_sizes_are_judged_on_the_split_the_data_really_produces():
    """24+24+24+19 at K=2: the only unequal micro-batches this data produces are its 19-sample batch as 10+9. The
    WARN is judged on that split, and its error is the one loss / K really gives there (computed here from loss_fn),
    not the artificial 18+6 split's."""
    from tropt.core.compare import max_rel_error

    setup = _loader_setup(torch.utils.data.DataLoader(_dataset(), batch_size=24), k=2)
    with untouched(setup):
        r = check_accumulation(setup)
    assert r.status is Status.WARN and r.metrics["uneven_split"] == "data", r.summary
    assert r.metrics["data_uneven_sizes"] == "10+9" and r.metrics["uneven_sizes"] == "18+6"
    assert "the 19-sample batch as 10+9" in r.summary and "unequal sizes" in r.summary

    def grads(micro, weights):
        ctx = setup.build()
        for mb, w in zip(micro, weights):
            (ce_loss(ctx.model, mb) * w).backward()
        return {n: p.grad.clone() for n, p in ctx.model.named_parameters()}

    short = setup.split(setup.sample_batch(), sizes=[19, 5])[0]
    halves = setup.split(short, sizes=[10, 9])
    expected = max_rel_error(grads([short], [1.0]), grads(halves, [0.5, 0.5]))
    assert r.metrics["data_uneven_max_rel_error"] == pytest.approx(expected, rel=1e-3)
    assert f"{expected:.1%}" in r.summary and r.metrics["data_uneven_max_rel_error"] < r.metrics["uneven_max_rel_error"]


def test_a_batch_sampler_that_drops_the_remainder_gives_no_unequal_size_judgement():
    """91 samples in batches of 24 with BatchSampler(drop_last=True): every batch the loop sees holds 24 samples, so
    the artificial 18+6 split is a latent note, not a WARN (it was a WARN: batch sizes 'unknown')."""
    ds = _dataset()
    sampler = torch.utils.data.BatchSampler(torch.utils.data.RandomSampler(ds), 24, drop_last=True)
    r = check_accumulation(_loader_setup(torch.utils.data.DataLoader(ds, batch_sampler=sampler), k=2))
    assert r.status is Status.PASS and r.metrics["latent"] and r.metrics["train_batch_sizes"] == "24", r.summary
    assert r.metrics["uneven_split"] == "artificial" and "artificial split (18+6)" in r.summary
    # the sampler, not the dataset, says how many samples a pass draws: 72 of the 91, three batches of 24
    sub = torch.utils.data.SubsetRandomSampler(range(72))
    r = check_accumulation(_loader_setup(torch.utils.data.DataLoader(ds, batch_size=24, sampler=sub), k=2))
    assert r.status is Status.PASS and r.metrics["train_batch_sizes"] == "24", r.summary


def test_unknown_batch_sizes_warn_only_when_the_setup_accumulates_and_name_the_artificial_split():
    loader = torch.utils.data.DataLoader(Stream(), batch_size=None)
    r = check_accumulation(_loader_setup(loader, k=2))
    assert r.status is Status.WARN and r.metrics["uneven_split"] == "artificial", r.summary
    assert "an artificial split (18+6)" in r.summary
    assert "the batch sizes this Setup's data gives are not known" in r.summary
    # Without accumulation every step is one micro-batch, whatever the sizes: a latent note, never a WARN.
    r = check_accumulation(_loader_setup(loader, k=1))
    assert r.status is Status.PASS and r.metrics["latent"] and "does not accumulate" in r.summary, r.summary


class TwoTower(nn.Module):
    """Two Linear towers embedding the two views of a pair: a CLIP-style contrastive encoder."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(6, 8), nn.Linear(6, 8)


def info_nce(model, batch):
    """In-batch negatives: every other pair in the batch is a negative, so the loss depends on the batch's makeup."""
    z1, z2 = F.normalize(model.a(batch[0]), dim=1), F.normalize(model.b(batch[1]), dim=1)
    logits = z1 @ z2.T / 0.1
    return F.cross_entropy(logits, torch.arange(len(logits)))


def two_tower_setup(step=None, k=4):
    g = torch.Generator().manual_seed(0)
    x1 = torch.randn(64, 6, generator=g)
    x2 = x1 + 0.3 * torch.randn(64, 6, generator=g)
    torch.manual_seed(0)
    return tropt.Setup(TwoTower(), info_nce, lambda m: torch.optim.SGD(m.parameters(), lr=0.1),
                       [(x1[i:i + 16], x2[i:i + 16]) for i in range(0, 64, 16)], step=step, accumulation_steps=k)


def test_an_in_batch_negatives_loss_warns_naming_the_loss_never_the_step():
    setup = two_tower_setup()  # tropt.standard_step: the step is right, the loss cannot accumulate exactly
    with untouched(setup):
        r = check_accumulation(setup)
    assert r.status is Status.WARN, r.summary
    assert "the loss is batch-dependent" in r.summary and "per-micro-batch" not in r.summary
    assert r.metrics["cause"] == "batch_dependent_loss" and r.metrics["loss_batch_dependence"] > 0.01
    assert any("GradCache" in a for a in r.advice) and any("larger micro-batch" in a for a in r.advice)
    assert "batch_dependence" in r.tables


def test_a_batch_dependent_loss_does_not_excuse_a_step_that_forgets_to_divide_by_k():
    r = check_accumulation(two_tower_setup(step_loss_not_divided))
    assert r.status is Status.FAIL, r.summary
    assert "summed, not averaged" in r.summary and r.metrics["cause"] == "summed"
    assert "Divide each micro-batch loss by K=4" in r.advice[0]


def test_a_batch_dependent_loss_divided_twice_still_fails():
    def step(ctx, micro_batches):
        for mb in micro_batches:
            (ctx.loss_fn(ctx.model, mb) / len(micro_batches) ** 2).backward()
        ctx.optimizer.step()
        ctx.optimizer.zero_grad()

    r = check_accumulation(two_tower_setup(step))
    assert r.status is Status.FAIL and r.metrics["cause"] == "divided_twice", r.summary


def test_a_per_item_mean_loss_is_not_batch_dependent():
    from tropt.loop._batch_dependence import loss_batch_dependence

    setup = mlp_setup(k=4)
    assert loss_batch_dependence(setup, setup.sample_batch(), freeze=False) < 1e-5
    setup = two_tower_setup()
    assert loss_batch_dependence(setup, setup.sample_batch(), freeze=False) > 0.01


def test_a_batch_dependent_loss_does_not_excuse_dropped_micro_batches():
    def step(ctx, micro_batches):  # forgets the last two micro-batches: not what any right step gives
        for mb in micro_batches[:2]:
            (ctx.loss_fn(ctx.model, mb) / len(micro_batches)).backward()
        ctx.optimizer.step()
        ctx.optimizer.zero_grad()

    r = check_accumulation(two_tower_setup(step))
    assert r.status is Status.WARN and r.metrics["cause"] == "not_isolated", r.summary
    assert "cause not isolated" in r.summary and "batch-dependent" in r.summary


def test_the_batch_dependence_probe_concatenates_every_batch_sized_leaf():
    from tropt.loop._batch_dependence import _doubled

    batch = {"x": torch.arange(6.0).reshape(3, 2), "ids": ["a", "b", "c"], "scale": torch.tensor(2.0), "k": 3}
    twice = _doubled(batch, 3, 0)
    assert torch.equal(twice["x"], torch.cat([batch["x"], batch["x"]])) and twice["ids"] == ["a", "b", "c"] * 2
    assert twice["scale"] is batch["scale"] and twice["k"] == 3 and batch["ids"] == ["a", "b", "c"]


# The noise floor (issue 27 §1): a stochastic step is judged in expectation, a deterministic one exactly.
from support.stochastic_cases import (  # noqa: E402
    diffusion_setup,
    running_mean_setup,
    step_diffusion_not_divided,
    step_ema_per_micro_batch,
    step_with_ema,
)


def test_a_healthy_diffusion_step_passes_in_expectation_with_its_noise_floor():
    setup = diffusion_setup()
    with untouched(setup):
        r = check_accumulation(setup)
    assert r.status is Status.PASS, r.summary
    assert r.metrics["noise_floor"] > 0.1 and r.metrics["judged"] == "in expectation"
    assert "noise floor" in r.summary and "global RNG" in r.metrics["stochastic_sources"]


def test_a_diffusion_step_missing_the_division_by_k_still_fails_with_its_cause():
    r = check_accumulation(diffusion_setup(step_diffusion_not_divided))
    assert r.status is Status.FAIL and "summed, not averaged" in r.summary
    assert r.metrics["cause"] == "summed" and r.metrics["noise_floor"] > 0.1
    assert abs(r.metrics["reference_factor_kx"] - 4) < 4 * r.metrics["reference_factor_kx_sigma"] + 0.2


def test_a_deterministic_step_has_floor_zero_and_is_compared_exactly():
    r = check_accumulation(mlp_setup(k=4, dropout=None))
    assert r.status is Status.PASS and r.metrics["noise_floor"] == 0.0 and "judged" not in r.metrics
    bug = check_accumulation(mlp_setup(step_loss_not_divided, k=4, dropout=None))
    assert bug.metrics["noise_floor"] == 0.0 and "summed, not averaged" in bug.summary


def test_an_ema_on_ctx_updated_per_micro_batch_is_named():
    for setup in (mlp_setup(step_ema_per_micro_batch, k=4, scheduler=False), diffusion_setup(step_ema_per_micro_batch)):
        r = check_accumulation(setup)
        assert r.status is Status.FAIL and "ctx.ema is updated once per micro-batch" in r.summary, r.summary
        assert r.metrics["cause"] == "object_updated_per_micro_batch"
    assert check_accumulation(diffusion_setup(step_with_ema)).status is Status.PASS


def test_a_buffer_updated_in_forward_is_named_not_the_loss_normalisation():
    r = check_accumulation(running_mean_setup())
    assert r.status is Status.WARN and "0.mean" in r.summary, r.summary
    assert "normalised by its own item count" not in r.summary and r.metrics["forward_updated_buffers"] == "0.mean"
    bug = check_accumulation(running_mean_setup(step_diffusion_not_divided))
    assert bug.status is Status.FAIL and "summed, not averaged" in bug.summary


def test_functional_dropout_is_switched_off_and_named_so_the_comparison_stays_exact():
    class FunctionalDropoutMLP(nn.Module):  # F.dropout, not nn.Dropout: quiet_randomness cannot switch it off
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(10, 32), nn.Linear(32, 4)

        def forward(self, x):
            return self.b(F.dropout(torch.relu(self.a(x)), 0.2, training=True))

    x, y = make_classification(n=96, d=10, classes=4, seed=1)
    torch.manual_seed(0)
    setup = tropt.Setup(FunctionalDropoutMLP(), ce_loss, lambda m: torch.optim.SGD(m.parameters(), lr=0.1),
                        [(x[i:i + 24], y[i:i + 24]) for i in range(0, 96, 24)], accumulation_steps=4)
    r = check_accumulation(setup)  # as nn.Dropout(p) is set to p=0 in tropt's copies, F.dropout is switched off
    assert r.status is Status.PASS and r.metrics["noise_floor"] == 0.0 and "judged" not in r.metrics, r.summary
    assert "F.dropout(p=0.2)" in r.metrics["functional_dropout_off"]
    bug = check_accumulation(setup.replace(step=step_loss_not_divided))
    assert bug.status is Status.FAIL and "summed, not averaged" in bug.summary and bug.metrics["noise_floor"] == 0.0


def test_an_ema_updated_before_the_step_on_every_micro_batch_is_found_over_two_steps():
    from support.stochastic_cases import step_plain_ema_before_the_update

    r = check_accumulation(mlp_setup(step_plain_ema_before_the_update, k=4, scheduler=False, dropout=None))
    assert r.status is Status.FAIL and "ctx.ema is updated once per micro-batch" in r.summary, r.summary
    assert r.metrics["ctx_objects_compared_after_steps"] == 2 and "ctx_objects" in r.tables
