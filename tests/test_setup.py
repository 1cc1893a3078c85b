"""Every bad Setup input gives a TroptError that says what, why and how to fix it."""

import pytest
import torch
from support import ce_loss, make_classification
from torch import nn
from torch.nn import functional as F

import tropt
from tropt.errors import SetupError, StepError
from tropt.testing import untouched


def _parts():
    x, y = make_classification()
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    return model, ce_loss, (lambda m: torch.optim.SGD(m.parameters(), lr=0.1)), [(x[:32], y[:32]), (x[32:], y[32:])]


def _setup(**kw):
    model, loss, opt, data = _parts()
    args = dict(model=model, loss_fn=loss, optimizer=opt, train_data=data)
    args.update(kw)
    return tropt.Setup(**args)


@pytest.mark.parametrize(
    "changes, what, fix",
    [
        ({"model": "resnet"}, "expected a torch.nn.Module", "nn.Module itself"),
        ({"model": nn.ReLU()}, "no parameters", "holds the weights"),
        ({"loss_fn": 3}, "not callable", "loss_fn(model, batch)"),
        ({"loss_fn": lambda out: out}, "cannot be called as loss_fn(model, batch)", "two positional"),
        ({"optimizer": torch.optim.SGD}, "the class SGD", "lambda m: torch.optim.SGD"),
        ({"optimizer": 0.1}, "expected a factory", "lambda m"),
        ({"train_data": []}, "train_data is empty", "at least one batch"),
        ({"train_data": None}, "train_data is None", "DataLoader"),
        ({"train_data": (b for b in [1])}, "one-shot iterator", "DataLoader"),
        ({"train_data": 5}, "expected a DataLoader", "wrap your data"),
        ({"accumulation_steps": 0}, "accumulation_steps=0", ">= 1"),
        ({"accumulation_steps": 2.0}, "accumulation_steps=2.0", "integer"),
        ({"grad_clip": -1.0}, "grad_clip=-1.0", "positive"),
        ({"precision": "fp8"}, "unknown precision 'fp8'", "fp32, bf16, fp16"),
        ({"optimizer": None}, "optimizer=None needs your own step", "by hand"),
        ({"batch_dim": -1}, "batch_dim=-1", "time-major"),
        ({"split_fn": lambda b, s: [b]}, "split_fn and size_fn must be given together", "size_fn(batch)"),
        ({"step": lambda ctx: None}, "cannot be called as step(ctx, micro_batches)", "def step(ctx, micro_batches)"),
        ({"step": "mine"}, "step is a str", "standard_step"),
        ({"scheduler": 5}, "not callable", "factory"),
        ({"device": "cuda"}, "CUDA is not available", "device='cpu'"),
        ({"device": "gpu0"}, "not a torch device", "'cpu'"),
        ({"num_classes": 1}, "num_classes=1", ">= 2"),
        ({"save_state": lambda ctx: {}}, "must be given together", "both"),
        ({"seed": "x"}, "seed='x'", "seed=0"),
    ],
)
def test_bad_input_at_construction(changes, what, fix):
    if changes.get("device") == "cuda" and torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(SetupError) as info:
        _setup(**changes)
    msg = str(info.value)
    assert what in msg and fix in msg and " — " in msg, msg


def test_scheduler_instance_rejected_with_factory_advice():
    model, loss, _, data = _parts()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(SetupError, match="instance, expected a factory"):
        tropt.Setup(model, loss, opt, data, scheduler=torch.optim.lr_scheduler.StepLR(opt, 1))


def test_optimizer_instance_becomes_factory_with_groups():
    model, loss, _, data = _parts()
    opt = torch.optim.AdamW([{"params": model[0].parameters(), "lr": 1e-2}, {"params": model[2].parameters()}], lr=1e-3)
    setup = tropt.Setup(model, loss, opt, data)
    ctx = setup.build()
    assert isinstance(ctx.optimizer, torch.optim.AdamW)
    assert [g["lr"] for g in ctx.optimizer.param_groups] == [1e-2, 1e-3]
    copy_ids = {id(p) for p in ctx.model.parameters()}
    assert all(id(p) in copy_ids for g in ctx.optimizer.param_groups for p in g["params"])
    other = nn.Linear(2, 2)
    with pytest.raises(SetupError, match="not in the model"):
        tropt.Setup(model, loss, torch.optim.SGD(other.parameters(), lr=1), data)


@pytest.mark.parametrize(
    "changes, exc, what, fix",
    [
        ({"loss_fn": lambda m, b: F.cross_entropy(m(b[0]), b[1], reduction="none")}, StepError,
         "shape (32,), expected a scalar", ".mean() or .sum()"),
        ({"loss_fn": lambda m, b: F.cross_entropy(m(b[0]), b[1]).item()}, StepError, "returned a float",
         "not loss.item()"),
        ({"loss_fn": lambda m, b: F.cross_entropy(m(b[0]), b[1]) * float("nan")}, StepError, "non-finite loss",
         "NaN/inf"),
        ({"loss_fn": lambda m, b: F.cross_entropy(m(b[0]).detach(), b[1])}, StepError,
         "does not depend on any parameter", ".detach()"),
        ({"loss_fn": lambda m, b: m(b)}, StepError, "loss_fn raised TypeError", "loss_fn(model, batch)"),
        ({"optimizer": lambda m: "sgd"}, SetupError, "returned a str, expected a torch.optim.Optimizer",
         "return the optimizer"),
        ({"scheduler": lambda opt: 5}, SetupError, "expected an LR scheduler", "StepLR"),
        ({"accumulation_steps": 64, "accumulation": "split"}, SetupError, "only 32 samples",
         "fewer accumulation steps"),
    ],
)
def test_bad_input_at_first_use(changes, exc, what, fix):
    setup = _setup(**changes)  # construction succeeds: these need a batch to show
    with pytest.raises(exc) as info:
        setup.validate()
    msg = str(info.value)
    assert what in msg and fix in msg, msg


def test_optimizer_factory_closing_over_original_model_is_caught():
    model, loss, _, data = _parts()
    setup = tropt.Setup(model, loss, lambda m: torch.optim.SGD(model.parameters(), lr=0.1), data)
    with pytest.raises(SetupError, match="not those of the model it was given"):
        setup.validate()


@pytest.mark.parametrize("wrap", [tuple, list])
def test_two_optimizers_say_one_per_setup_and_how_to_merge_them_into_param_groups(wrap):
    model, loss, _, data = _parts()
    two = lambda m: wrap([torch.optim.SGD(m[0].parameters(), lr=0.1),  # noqa: E731
                          torch.optim.Adam(m[2].parameters())])
    setup = tropt.Setup(model, loss, two, data)
    with untouched(setup), pytest.raises(SetupError) as info:
        setup.validate()
    err = info.value
    assert "2 optimizers (SGD, Adam)" in err.message and "one optimizer per Setup" in err.message
    assert "one optimizer with one param group per part" in err.fix and "'params'" in err.fix


def test_validate_leaves_everything_untouched(tiny_setup):
    with untouched(tiny_setup):
        tiny_setup.validate()
    assert tiny_setup.describe()["optimizer"] == "SGD"


def test_build_gives_identical_independent_copies(tiny_setup):
    a, b = tiny_setup.build(), tiny_setup.build()
    assert a.model is not tiny_setup.model
    for pa, pb, po in zip(a.model.parameters(), b.model.parameters(), tiny_setup.model.parameters()):
        assert torch.equal(pa, pb) and torch.equal(pa, po) and pa is not po


def test_batches_are_seeded_and_cycle():
    x, y = make_classification(n=40)
    ds = torch.utils.data.TensorDataset(x, y)
    setup = _setup(train_data=torch.utils.data.DataLoader(ds, batch_size=10, shuffle=True))
    first = [b[1].tolist() for b in setup.batches(6)]
    again = [b[1].tolist() for b in setup.batches(6)]
    assert first == again and len(first) == 6
    as_dataset = _setup(train_data=ds, batch_size=16)
    assert [len(b[0]) for b in as_dataset.batches()] == [16, 16, 8]


def test_a_dataset_sorted_by_class_is_drawn_shuffled_for_training_and_in_order_for_validation():
    """Like scikit-learn's iris: 3 classes of 20 rows, sorted. Training batches mix classes (seeded, repeatable,
    the global RNG untouched); validation batches keep the dataset's order."""
    x = torch.randn(60, 4)
    y = torch.arange(3).repeat_interleave(20)
    ds = torch.utils.data.TensorDataset(x, y)
    setup = _setup(train_data=ds, val_data=ds, batch_size=16)
    rng = torch.get_rng_state()
    first = setup.sample_batch()[1]
    assert len(first.unique()) > 1 and torch.equal(first, setup.sample_batch()[1])
    assert torch.equal(rng, torch.get_rng_state())
    assert sorted(torch.cat([b[1] for b in setup.batches()]).tolist()) == y.tolist()  # one pass covers every row once
    assert torch.equal(next(setup.batches(1, which="val"))[1], y[:16])


def test_standard_step_accumulation_equals_full_batch(tiny_setup):
    batch = tiny_setup.sample_batch()
    grads = []
    for k in (1, 3):
        ctx = tiny_setup.build()
        # the hook runs inside this iteration's standard_step, so it sees this iteration's ctx
        ctx.optimizer.register_step_pre_hook(
            lambda opt, *_: grads.append([p.grad.clone() for p in ctx.model.parameters()])  # noqa: B023
        )
        tropt.standard_step(ctx, tropt.split_batch(batch, k))
    for g1, g3 in zip(*grads):
        torch.testing.assert_close(g1, g3, rtol=1e-5, atol=1e-7)


def test_run_step_wraps_user_errors(tiny_setup):
    def broken(ctx, mbs):
        raise RuntimeError("shape mismatch in my loop")

    setup = tiny_setup.replace(step=broken)
    with pytest.raises(StepError, match=r"your step function .*broken raised RuntimeError: shape mismatch"):
        setup.run_step(setup.build(), [setup.sample_batch()])


def test_replace_validates_and_keeps_original(tiny_setup):
    with pytest.raises(SetupError):
        tiny_setup.replace(accumulation_steps=-1)
    assert tiny_setup.replace(accumulation_steps=4).accumulation_steps == 4 and tiny_setup.accumulation_steps == 1


def test_autocast_context():
    ctx = _setup(precision="bf16").build()
    with ctx.autocast():
        out = ctx.model(torch.randn(2, 8))
    assert out.dtype == torch.bfloat16
    assert isinstance(tropt.TroptError("a", "b"), ValueError)


def test_reading_batches_leaves_the_users_generators_alone():
    x, y = make_classification(n=40)
    g = torch.Generator().manual_seed(123)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=10, shuffle=True, generator=g)
    setup = _setup(train_data=loader)
    before, rng = g.get_state(), torch.get_rng_state()
    first = [b[1].tolist() for b in setup.batches(3)]
    assert torch.equal(g.get_state(), before)  # the loader's own generator is put back
    assert [b[1].tolist() for b in setup.batches(3)] == first  # and the order is seeded, so repeatable
    rng = torch.get_rng_state()
    setup.sample_batch()
    assert torch.equal(torch.get_rng_state(), rng)  # sample_batch leaves the global RNG as it was


def test_metric_is_validated_with_its_direction():
    import math

    from torch import nn

    from tropt.errors import SetupError, StepError

    model = nn.Linear(3, 2)
    data = [(torch.randn(4, 3), torch.tensor([0, 1, 0, 1]))]
    base = dict(loss_fn=lambda m, b: torch.nn.functional.cross_entropy(m(b[0]), b[1]),
                optimizer=lambda m: torch.optim.SGD(m.parameters(), lr=0.1), train_data=data)
    with pytest.raises(SetupError, match="higher_is_better"):
        tropt.Setup(model, metric=lambda m, d: 1.0, **base)
    with pytest.raises(SetupError, match="no val_data"):
        tropt.Setup(model, eval_augmentation=True, **base)
    metric = tropt.Metric(lambda m, d: torch.tensor([0.5]), higher_is_better=True, name="acc")
    assert metric(model, data) == 0.5 and metric.better(0.6, 0.5) and not tropt.Metric(len, False).better(0.6, 0.5)
    for bad, words in ((torch.ones(2), "shape (2,)"), ("high", "a str"), (math.nan, "not a finite number")):
        with pytest.raises(StepError, match=words.replace("(", r"\(").replace(")", r"\)")):
            tropt.Metric(lambda m, d, v=bad: v)(model, data)


def test_a_model_on_the_meta_device_is_refused_naming_its_tensors_and_the_fix():
    """Issue 31: a model built under torch.device("meta") raised a raw NotImplementedError from the copy."""
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    with pytest.raises(SetupError) as info:
        _setup(model=model)
    msg = str(info.value)
    assert "0.weight" in msg and "meta device" in msg and "to_empty" in msg and "load_state_dict" in msg, msg
