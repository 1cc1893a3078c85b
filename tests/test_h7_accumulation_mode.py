"""``Setup(accumulation=...)``: what ``accumulation_steps=K`` means (issue 28, "What accumulation_steps means").

Default ``"batches"``: each optimizer step takes K consecutive loader batches (Hugging Face's
``gradient_accumulation_steps``, Lightning's ``accumulate_grad_batches``, most hand-written loops); ``"split"``:
each loader batch is cut into K micro-batches. Known answers: the micro-batches a step receives, the joined batch,
the steps per epoch, and a planted missing ``/K`` found in both modes.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import tropt
from tropt.core.batch import join_batches, remember_parts, remembered_sizes, split_batch
from tropt.errors import SetupError, TroptError
from tropt.result import Status


def _data(n_batches: int = 8, size: int = 16, seed: int = 0) -> list:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(size, 5, generator=g), torch.randint(0, 3, (size,), generator=g)) for _ in range(n_batches)]


def _loss(model, batch):
    return nn.functional.cross_entropy(model(batch[0]), batch[1])


def _setup(data=None, **kw) -> tropt.Setup:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))
    return tropt.Setup(model, _loss, lambda m: torch.optim.SGD(m.parameters(), lr=0.1),
                       _data() if data is None else data, **kw)


# ------------------------------------------------------------------ what one step receives
def test_by_default_a_step_takes_k_loader_batches_each_one_micro_batch():
    data = _data()
    setup = _setup(data, accumulation_steps=4)
    assert setup.accumulation == "batches" and setup.loader_batches_per_step == 4
    groups = list(setup.batches(2))
    assert [setup.size(g) for g in groups] == [64, 64]  # the effective batch is 4 x the loader's
    for j, group in enumerate(groups):
        micro = setup.split(group, 4)
        assert [setup.size(m) for m in micro] == [16] * 4
        for i, m in enumerate(micro):  # the user's own loader batches, in order
            assert torch.equal(m[0], data[4 * j + i][0]) and torch.equal(m[1], data[4 * j + i][1])
    ctx = setup.build()
    assert [ctx.batch_size(m) for m in ctx.split(groups[0], 4)] == [16] * 4  # the step's own split agrees


def test_split_mode_cuts_each_loader_batch_into_k():
    setup = _setup(accumulation_steps=4, accumulation="split")
    groups = list(setup.batches(2))
    assert [setup.size(g) for g in groups] == [16, 16]
    assert [setup.size(m) for m in setup.split(groups[0], 4)] == [4] * 4


def test_groups_run_on_across_passes_and_one_pass_ends_with_the_short_remainder():
    data = _data(n_batches=6)
    setup = _setup(data, accumulation_steps=4)
    cycled = list(setup.batches(3))  # 12 loader batches: two passes over 6
    assert [setup.size(g) for g in cycled] == [64, 64, 64]
    assert torch.equal(setup.split(cycled[1], 4)[2][0], data[0][0])  # the 7th loader batch is the 1st again
    one_pass = list(setup.batches())
    assert [setup.size(g) for g in one_pass] == [64, 32]  # 6 batches: a group of 4 and the remainder of 2
    assert [setup.size(m) for m in setup.split(one_pass[1], 2)] == [16, 16]


def test_a_short_last_loader_batch_is_a_real_unequal_micro_batch():
    x, y = torch.randn(58, 5), torch.randint(0, 3, (58,))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)  # 16, 16, 16, 10
    setup = _setup(loader, accumulation_steps=4)
    group = next(setup.batches(1))
    assert [setup.size(m) for m in setup.split(group, 4)] == [16, 16, 16, 10]
    dropped = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16, drop_last=True)
    assert [setup.size(g) for g in _setup(dropped, accumulation_steps=3).batches(2)] == [48, 48]


def test_an_infinite_iterable_is_grouped_lazily():
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            i = 0
            while True:
                i += 1
                yield torch.full((4,), float(i)), torch.tensor(i % 3)

    loader = torch.utils.data.DataLoader(Stream(), batch_size=8)
    setup = _setup(loader, accumulation_steps=2)
    group = next(setup.batches(1))
    assert setup.size(group) == 16 and [setup.size(m) for m in setup.split(group, 2)] == [8, 8]
    assert setup.epoch_steps() == (None, "unknown")


# ------------------------------------------------------------------ joining loader batches
def test_join_handles_dicts_tuples_strings_and_metadata():
    parts = [{"x": torch.arange(6.).reshape(3, 2), "ids": ["a", "b", "c"], "task": "lm", "t": torch.tensor(1.)},
             {"x": torch.arange(4.).reshape(2, 2), "ids": ["d", "e"], "task": "lm", "t": torch.tensor(1.)}]
    joined = join_batches(parts)
    assert joined["x"].shape == (5, 2) and joined["ids"] == ["a", "b", "c", "d", "e"] and joined["task"] == "lm"
    remember_parts(joined, [3, 2])
    back = split_batch(joined, 2)
    assert back[1]["ids"] == ["d", "e"] and torch.equal(back[1]["x"], parts[1]["x"])
    assert remembered_sizes(joined) == (3, 2) and remembered_sizes(dict(joined)) is None  # a copy is not the group
    with pytest.raises(TroptError, match="differs between the loader batches"):
        join_batches([{"x": torch.ones(2, 1), "step": 1}, {"x": torch.ones(2, 1), "step": 2}])


def test_join_time_major_batches_along_batch_dim_with_their_flattened_targets():
    seq = 5
    parts = [(torch.randn(seq, b, 3), torch.arange(seq * b)) for b in (4, 2)]
    setup = _setup(accumulation_steps=2, batch_dim=1)
    joined = join_batches(parts, setup.layout)
    assert joined[0].shape == (seq, 6, 3) and joined[1].shape == (seq * 6,)
    remember_parts(joined, [4, 2])
    back = setup.split(joined, 2)
    for got, want in zip(back, parts, strict=True):
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_batches_padded_to_different_lengths_need_a_join_fn_and_say_so():
    data = [{"ids": torch.ones(4, n, dtype=torch.long), "y": torch.zeros(4, dtype=torch.long)} for n in (7, 9)]
    setup = tropt.Setup(nn.Embedding(10, 3), lambda m, b: m(b["ids"]).mean(), lambda m: torch.optim.SGD(
        m.parameters(), lr=0.1), data, accumulation_steps=2)
    with pytest.raises(TroptError) as err:
        setup.validate()
    assert "['ids']" in str(err.value) and "(4, 7)" in str(err.value) and "accumulation='split'" in err.value.fix

    def pad_join(batches):
        n = max(b["ids"].shape[1] for b in batches)
        return {"ids": torch.cat([nn.functional.pad(b["ids"], (0, n - b["ids"].shape[1])) for b in batches]),
                "y": torch.cat([b["y"] for b in batches])}

    joined_setup = setup.replace(join_fn=pad_join)
    group = next(joined_setup.batches(1))
    assert group["ids"].shape == (8, 9)
    micro = joined_setup.split(group, 2)  # the loader's own batches, unpadded
    assert [m["ids"].shape[1] for m in micro] == [7, 9]


def test_a_split_fn_layout_joins_only_with_a_join_fn():
    split_fn = lambda b, sizes: [b[i:i + s] for i, s in zip([0, *torch.tensor(sizes).cumsum(0).tolist()], sizes)]  # noqa: E731
    data = [torch.randn(6, 2) for _ in range(4)]
    kw = dict(split_fn=split_fn, size_fn=len, accumulation_steps=2)
    setup = tropt.Setup(nn.Linear(2, 1), lambda m, b: m(b).mean(), lambda m: torch.optim.SGD(m.parameters(), lr=0.1),
                        data, **kw)
    with pytest.raises(TroptError, match="split_fn/size_fn"):
        next(setup.batches(1))
    good = setup.replace(join_fn=lambda bs: torch.cat(bs))
    group = next(good.batches(1))
    assert good.size(group) == 12 and [good.size(m) for m in good.split(group, 2)] == [6, 6]


def test_bad_accumulation_and_steps_per_epoch_are_refused_with_the_fix():
    with pytest.raises(SetupError, match="'batches' or 'split'"):
        _setup(accumulation="micro")
    with pytest.raises(SetupError, match="steps_per_epoch"):
        _setup(steps_per_epoch=0)


# ------------------------------------------------------------------ steps per epoch
def test_steps_per_epoch_is_read_from_the_dataloader_or_declared():
    ds = torch.utils.data.TensorDataset(torch.randn(100, 5), torch.randint(0, 3, (100,)))
    loader = torch.utils.data.DataLoader(ds, batch_size=10)  # 10 batches
    assert _setup(loader, accumulation_steps=4).epoch_steps() == (2, "len(train_data) // 4")
    assert _setup(loader, accumulation_steps=4, accumulation="split").epoch_steps() == (10, "len(train_data)")
    assert _setup(loader, accumulation_steps=4, steps_per_epoch=3).epoch_steps() == (3, "Setup(steps_per_epoch=)")


def test_a_schedule_sized_in_epochs_is_named_against_the_declared_steps_per_epoch():
    from tropt.loop.scheduler_cadence import check_scheduler_cadence

    def cosine(o):
        return torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=5)

    data = _data(n_batches=4, size=8)  # 4 loader batches: T_max=5 is more than one epoch of them
    control = check_scheduler_cadence(_setup(data, scheduler=cosine))
    assert "counted in epochs" not in control.summary, control.summary
    r = check_scheduler_cadence(_setup(data, scheduler=cosine, steps_per_epoch=40))
    assert r.status is Status.WARN and "counted in epochs" in r.summary and "T_max=5" in r.summary, r.summary
    assert r.metrics["steps_per_epoch"] == 40 and r.metrics["steps_per_epoch_from"] == "Setup(steps_per_epoch=)"


# ------------------------------------------------------------------ the accumulation check in both modes
def _no_divide(ctx, micro_batches):  # BUG: the loss is not divided by K
    for mb in micro_batches:
        ctx.loss_fn(ctx.model, mb).backward()
    ctx.optimizer.step()
    ctx.optimizer.zero_grad()


@pytest.mark.parametrize("mode", ["batches", "split"])
def test_a_missing_division_by_k_fails_in_both_modes(mode):
    from tropt.loop.accumulation import check_accumulation

    setup = _setup(accumulation_steps=4, accumulation=mode)
    assert check_accumulation(setup).status is Status.PASS  # control: standard_step
    r = check_accumulation(setup.replace(step=_no_divide))
    assert r.status is Status.FAIL, r.summary
