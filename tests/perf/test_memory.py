"""perf.memory with known answers: optimizer state per parameter, activations against the batch, leaks, fit verdicts
and the sharding advice; the user's objects are never touched."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pytest
import torch
from torch import nn
from torch.nn import functional as F

import tropt
from tropt.perf import check_memory
from tropt.result import CheckResult, Status
from tropt.testing import untouched

B, D, H, C = 64, 8, 256, 3


def batches(n=4, b=B, d=D):
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(b, d, generator=g), torch.randint(0, C, (b,), generator=g)) for _ in range(n)]


def ce(m, b):
    return F.cross_entropy(m(b[0]), b[1])


def mlp_setup(optimizer=None, data=None, d=D, h=H, **kw):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(d, h), nn.ReLU(), nn.Linear(h, C))
    optimizer = optimizer or (lambda m: torch.optim.Adam(m.parameters(), lr=1e-3))
    return tropt.Setup(model, ce, optimizer, data if data is not None else batches(d=d), **kw)


@pytest.mark.parametrize("make, ratio", [
    (lambda m: torch.optim.Adam(m.parameters(), lr=1e-3), 2.0),  # exp_avg and exp_avg_sq
    (lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9), 1.0),  # momentum_buffer
])
def test_optimizer_state_is_measured_from_its_tensors(make, ratio):
    s = mlp_setup(make)
    with untouched(s):
        r = check_memory(s, progress=False)
    # Adam's per-parameter step counters (4-byte scalars) are the only state beyond the moments
    assert r.metrics["optimizer_state_vs_params"] == pytest.approx(ratio, rel=0.01), r.summary
    assert r.metrics["optimizer_state_bytes_per_param"] == pytest.approx(4 * ratio, rel=0.01)
    params = sum(p.numel() * 4 for p in s.model.parameters())
    assert r.metrics["params_mib"] * 2**20 == params
    assert (r.tables["breakdown"].set_index("part").loc["optimizer state", "mib"]
            == pytest.approx(ratio * params / 2**20, rel=0.01))
    # the profiler's allocation timeline agrees with the tensors: between steps exactly parameters + state are alive
    between = r.tables["steps"].set_index("step").loc[1, "start_mib"]
    assert between == pytest.approx(r.metrics["params_mib"] + r.metrics["optimizer_state_mib"], abs=1e-9)


def test_activations_double_when_the_batch_doubles():
    """ReLU saves its output (B×H floats, which the next Linear saves too: one storage) and log_softmax its output
    (B×C floats); inputs, targets and weights are not activations. Halving the batch halves them."""
    s = mlp_setup()
    with untouched(s):
        r = check_memory(s, progress=False)
    full = r.metrics["activations_mib"] * 2**20
    half = r.metrics["activations_half_batch_mib"] * 2**20
    assert r.metrics["half_batch_size"] == B // 2
    assert abs(full - B * (H + C) * 4) <= 64, full  # a scalar or two (nll_loss's total weight) beside
    assert full / half == pytest.approx(2.0, rel=1e-3)
    assert r.metrics["ground_truth"].startswith("torch.profiler") and r.metrics["optimizer_steps"] <= 15
    assert r.status == Status.PASS and r.metrics["growth_per_step_mib"] == pytest.approx(0.0, abs=1e-9)
    # without a memory_limit on CPU there is no fit verdict, and the result says so
    assert "no fit verdict" in r.summary and r.tables["strategies"]["fits"].isna().all()


def leaky_step(ctx, micro_batches):
    """Keeps every step's loss with its graph on ctx: each step's activations stay allocated for good."""
    loss = tropt.standard_step(ctx, micro_batches)  # the standard update, detached loss
    kept = ctx.loss_fn(ctx.model, micro_batches[0])  # ... plus a forward whose graph is kept
    if not hasattr(ctx, "history"):
        ctx.history = []
    ctx.history.append(kept)
    return loss


def test_a_step_that_keeps_every_graph_warns_with_its_growth():
    data = batches(b=256)
    s = mlp_setup(data=data, step=leaky_step)
    with untouched(s):
        r = check_memory(s, progress=False)
    assert r.status == Status.WARN, r.summary
    per_graph = 256 * (H + C) * 4 / 2**20  # the activations of one kept forward
    assert r.metrics["growth_per_step_mib"] == pytest.approx(per_graph, rel=0.05), r.metrics
    assert "grows by" in r.summary and any("per step" in a and "loss.item()" in a for a in r.advice), r.advice
    ends = r.series["growth_end_mib"]
    assert (ends[1:] > ends[:-1]).all()
    healthy = check_memory(mlp_setup(data=data), progress=False)  # the same loop without the kept graphs
    assert healthy.status == Status.PASS and abs(healthy.metrics["growth_per_step_mib"]) < 1e-6, healthy.summary


def keep_last_step(ctx, micro_batches):
    """Keeps the last step's loss with its graph (no growth: one graph at a time held between steps)."""
    loss = tropt.standard_step(ctx, micro_batches)
    ctx.last = ctx.loss_fn(ctx.model, micro_batches[0])
    return loss


def test_memory_held_between_steps_beyond_the_accounted_parts_warns():
    s = mlp_setup(data=batches(b=256), step=keep_last_step)
    r = check_memory(s, progress=False)
    assert r.status == Status.WARN, r.summary
    held = r.metrics["held_between_steps_mib"] * 2**20
    assert held >= 256 * (H + C) * 4  # the kept graph's activations (plus its output)
    assert "stay allocated between steps" in r.summary and abs(r.metrics["growth_per_step_mib"]) < 1e-6
    assert any("keeps a tensor with its graph alive" in a for a in r.advice), r.advice


def deep_setup(layers=8, width=256, b=8):
    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(width, width), nn.ReLU())],
                          nn.Linear(width, C))
    return tropt.Setup(model, ce, lambda m: torch.optim.Adam(m.parameters(), lr=1e-3), batches(b=b, d=width))


def test_optimizer_state_over_the_limit_fails_and_names_the_smallest_sharding():
    """Adam over 8 Linear(256, 256) layers: 2 MiB of parameters, 4 MiB of state. A 3 MiB limit is below the state
    alone, so no single-device option fits (8-bit state still leaves parameters + gradients + 1 MiB, and sharding
    only the state leaves parameters + gradients = 4 MiB); full FSDP over a few devices does."""
    s = deep_setup()
    with untouched(s):
        r = check_memory(s, memory_limit=3 / 1024, progress=False)
    assert r.status == Status.FAIL, r.summary
    assert r.metrics["optimizer_state_mib"] > 3 and r.metrics["memory_limit_mib"] == pytest.approx(3)
    t = r.tables["strategies"]
    assert not t[t["devices"] == 1]["fits"].any()
    n = int(r.metrics["recommended"].split("N=")[1])
    option = r.metrics["recommended"].split(" over ")[0]
    rows = t[t["option"] == option].set_index("devices")
    assert bool(rows.loc[n, "fits"]) and not bool(rows.loc[n - 1, "fits"])  # the smallest N that fits
    assert all(not bool(rows.loc[m, "fits"]) for m in rows.index if m < n)
    assert f"{option} over N={n} devices (the smallest N that fits)" in r.advice[0], r.advice
    r.plot()
    CheckResult.from_dict(r.to_dict()).plot()
    plt.close("all")


def test_headroom_under_ten_percent_warns_and_a_roomy_limit_passes():
    s = mlp_setup()
    first = check_memory(s, memory_limit=1.0, progress=False)
    assert first.status == Status.PASS and first.metrics["headroom"] > 0.9, first.summary
    assert first.metrics["max_batch"] > B and first.metrics["recommended"] == "as is"
    peak_gib = first.metrics["peak_mib"] / 1024
    tight = check_memory(s, memory_limit=peak_gib / 0.95, progress=False)  # 5% headroom
    assert tight.status == Status.WARN and "headroom" in tight.summary, tight.summary
    assert tight.metrics["peak_mib"] == pytest.approx(first.metrics["peak_mib"])  # exact byte counts, same steps


def test_bad_memory_limit_says_how_to_fix(tiny_setup):
    for bad in (0, -4, float("nan"), "80"):
        with pytest.raises(tropt.TroptError, match="memory_limit"):
            check_memory(tiny_setup, memory_limit=bad, progress=False)
    with pytest.raises(tropt.TroptError, match="growth_steps"):
        check_memory(tiny_setup, growth_steps=2, progress=False)


def test_parameters_on_several_devices_are_explained_then_skipped():
    """Simulated on a CPU-only machine with one parameter on the meta device (a real case would be cuda:0 + cuda:1);
    the check must explain and SKIP before building anything (moving a meta tensor would raise)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(D, 4), nn.Linear(4, C))
    model[1].weight = nn.Parameter(torch.empty(C, 4, device="meta"))
    s = tropt.Setup(model, ce, lambda m: torch.optim.SGD(m.parameters(), lr=0.1), batches())
    r = check_memory(s, progress=False)
    assert r.status == Status.SKIP and "2 devices (cpu, meta)" in r.summary, r.summary
    assert r.advice and "one device" in r.advice[0]


def test_registered_last_in_stage_six():
    ids = list(tropt.list_checks()["id"])
    assert ids.index("perf.memory") == ids.index("perf.precision") + 1 and ids[-1] == "perf.memory"


def test_bf16_option_carries_perf_precisions_stability_verdict():
    """bf16 activations are measured (one step at each batch size under autocast); whether bf16 is stable is
    perf.precision's verdict, attached when its result is passed. A guardrail of 0 makes bf16 unstable there."""
    from tropt.perf import check_precision

    s = mlp_setup()
    bf16 = lambda r: r.tables["strategies"].set_index("option").loc["bf16 autocast", "cost"]  # noqa: E731
    alone = check_memory(s, progress=False)
    assert "stability not checked here" in bf16(alone)
    assert alone.metrics["activations_bf16_mib"] > 0
    unstable = check_precision(s, precisions=("fp32", "bf16"), steps=3, warmup=0, max_deviation=0.0, progress=False)
    with untouched(s):
        r = check_memory(s, precision_result=unstable, progress=False)
    assert "perf.precision: bf16 UNSTABLE" in bf16(r), bf16(r)


def manual_sgd_step(ctx, micro_batches):
    """Hand-written updates: accumulate over the micro-batches, then p -= lr * grad; optimizer.step() is never
    called."""
    n = sum(len(mb[1]) for mb in micro_batches)
    for mb in micro_batches:
        (ctx.loss_fn(ctx.model, mb) * len(mb[1]) / n).backward()
    with torch.no_grad():
        for p in ctx.model.parameters():
            p -= 0.1 * p.grad
            p.grad = None


def test_hand_written_updates_with_accumulation_count_one_micro_batch_of_activations():
    """Each micro-batch's graph is freed by its backward, so at most one micro-batch's activations (one loader batch
    of B samples: a step takes 2 of them) are alive at once; no optimizer.step() means no optimizer state and a peak
    in forward/backward."""
    s = mlp_setup(lambda m: torch.optim.SGD(m.parameters(), lr=0.1), step=manual_sgd_step, accumulation_steps=2)
    with untouched(s):
        r = check_memory(s, progress=False)
    assert r.metrics["optimizer_state_mib"] == 0 and r.metrics["peak_phase"] == "forward/backward", r.summary
    assert abs(r.metrics["activations_mib"] * 2**20 - B * (H + C) * 4) <= 64
    assert r.status == Status.PASS
    t = r.tables["strategies"]
    assert not (t["option"] == "optimizer-state sharding").any()  # nothing to shard


def summing_step(ctx, micro_batches):
    """The standard update, then `ctx.total_loss = ctx.total_loss + loss` on the undetached loss: backward freed its
    saved tensors, so hardly a byte is kept, but every step's graph nodes stay linked to the next."""
    n = sum(len(mb[1]) for mb in micro_batches)
    ctx.optimizer.zero_grad()
    total = 0.0
    for mb in micro_batches:
        loss = ctx.loss_fn(ctx.model, mb) * len(mb[1]) / n
        loss.backward()
        total = total + loss
    ctx.optimizer.step()
    ctx.total_loss = getattr(ctx, "total_loss", 0.0) + total
    return total.detach()


def detaching_step(ctx, micro_batches):
    """The healthy version: `ctx.total_loss += loss.item()`."""
    loss = tropt.standard_step(ctx, micro_batches)
    ctx.total_loss = getattr(ctx, "total_loss", 0.0) + float(loss)
    return loss


def test_a_running_total_of_undetached_losses_warns_and_names_where_the_graph_is_held():
    s = mlp_setup(step=summing_step)
    with untouched(s):
        r = check_memory(s, progress=False)
    assert r.status == Status.WARN, r.summary
    # the tensor bytes do not grow (saved tensors are freed by backward): only the autograd nodes do
    assert abs(r.metrics["growth_per_step_mib"]) * 2**20 < 4096, r.metrics
    t = r.tables["graphs"]
    held = t[t["held_by"] == "ctx.total_loss"].sort_values("step")
    # one step's graph: MulBackward, DivBackward, NllLoss, LogSoftmax, Addmm x2, Relu, Tbackward x2, 4 AccumulateGrad
    # nodes shared by all steps, and one AddBackward per running sum; each step adds the same number of new nodes
    per_step = held["nodes"].diff().dropna()
    assert len(held) >= 3 and (per_step == per_step.iloc[0]).all() and per_step.iloc[0] > 5, held
    assert r.metrics["graph_held_by"] == "ctx.total_loss"
    assert r.metrics["graph_nodes_per_step"] == pytest.approx(per_step.iloc[0]), r.metrics
    assert "ctx.total_loss holds an autograd graph" in r.summary, r.summary
    assert any("ctx.total_loss" in a and "loss.item()" in a for a in r.advice), r.advice


def test_a_running_total_of_detached_losses_passes():
    r = check_memory(mlp_setup(step=detaching_step), progress=False)
    assert r.status == Status.PASS, r.summary
    assert r.tables["graphs"].empty and "autograd graph" not in r.summary


def test_a_list_of_undetached_losses_on_a_carrier_is_named():
    class Log:
        pass

    def step(ctx, micro_batches):
        loss = ctx.loss_fn(ctx.model, micro_batches[0])
        ctx.optimizer.zero_grad()
        loss.backward()
        ctx.optimizer.step()
        if not hasattr(ctx, "log"):
            ctx.log = Log()
            ctx.log.losses = []
        ctx.log.losses.append(loss)
        return loss.detach()

    r = check_memory(mlp_setup(step=step), progress=False)
    assert r.status == Status.WARN and "ctx.log.losses holds an autograd graph" in r.summary, r.summary
