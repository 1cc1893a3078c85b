"""What a seed varies in a run of a comparison, and the check that it varies anything at all.

A seed of :func:`tropt.compare` sets the torch RNG before the model is built and the data is read, so it varies:

* the order of a shuffling DataLoader or a Dataset (tropt wraps one in a shuffling DataLoader);
* the order of a **list of batches**: :func:`vary_order` gives every seed its own permutation, a new one each
  pass, the same for every candidate on that seed (so the runs stay paired);
* the initialisation, with a model factory (a candidate's ``model=``) or ``compare(reinit=True)``;
* anything the step draws from torch's RNG (dropout, augmentation).

When none of these applies (the Setup's model instance, a DataLoader that does not shuffle, a deterministic step),
every seed gives the same run: :func:`check_seeds_vary` finds this with two steps on each of (up to) three seeds,
before the budget is spent, and raises a :class:`tropt.errors.TroptError` saying what to change.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch

from ..errors import TroptError

if TYPE_CHECKING:
    from ..setup import Setup

PROBE_STEPS = 2


class SeededOrder(list):
    """A list of batches read in a seeded order: a fresh permutation every pass, drawn from ``seed``.

    A list (the Setup accepts it as a list of batches) holding the same batch objects, not copies; a module-level
    class so it pickles with any executor. Indexing is the list's own order; iteration is the seed's.
    """

    def __init__(self, batches: Sequence[Any], seed: int) -> None:
        super().__init__(batches)
        self.seed = int(seed)
        self.passes = 0

    def __reduce__(self) -> tuple:
        return (SeededOrder, (list(list.__iter__(self)), self.seed), {"passes": self.passes})

    def __iter__(self) -> Iterator[Any]:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.passes)
        self.passes += 1
        order = torch.randperm(len(self), generator=gen).tolist()
        for i in order:
            yield list.__getitem__(self, i)


def vary_order(setup: Setup, seed: int) -> Setup:
    """``setup`` with a list (or tuple) of training batches read in ``seed``'s order; any other data unchanged
    (a DataLoader or Dataset already shuffles per seed when it shuffles at all)."""
    data = setup.train_data
    if isinstance(data, (list, tuple)) and not isinstance(data, SeededOrder) and len(data) > 1:
        return setup.replace(train_data=SeededOrder(data, seed))
    return setup


def _probe(setup: Setup, seed: int, reinit: bool) -> tuple[list[float], list[torch.Tensor]]:
    """The losses and the weights after :data:`PROBE_STEPS` steps of ``setup`` on ``seed`` (as a run starts it)."""
    from ..core.batch import split_batch
    from .runner import _reinit, _Stepper

    s = vary_order(setup.replace(seed=seed), seed)
    ctx = s.build(seed=seed)
    if reinit:
        _reinit(ctx.model, seed)
    step = _Stepper(s, ctx)
    losses = []
    for batch in s.batches(PROBE_STEPS, seed=seed):
        k = ctx.accumulation_steps
        loss = step([batch] if k == 1 else split_batch(batch, k))
        losses.append(float(loss.detach().float()) if isinstance(loss, torch.Tensor) else float("nan"))
    return losses, [p.detach().cpu().clone() for p in ctx.model.parameters()]


def _same(a: tuple[list[float], list[torch.Tensor]], b: tuple[list[float], list[torch.Tensor]]) -> bool:
    la, lb = a[0], b[0]
    if len(la) != len(lb) or any(x != y and not (x != x and y != y) for x, y in zip(la, lb, strict=True)):
        return False
    return len(a[1]) == len(b[1]) and all(torch.equal(x, y) for x, y in zip(a[1], b[1], strict=True))


def check_seeds_vary(setup: Setup, seeds: list[int], *, reinit: bool,
                     probe: Callable[[Setup, int, bool], Any] = _probe) -> None:
    """Raise before any run when two seeds give the baseline the same first steps (losses and weights).

    One seed is a stated choice (nothing to vary); a step that raises here is left for the runs to report.
    """
    data = setup.train_data
    if len(seeds) < 2 or (isinstance(data, (list, tuple)) and len(data) > 1):
        return  # one seed varies nothing by choice; a list of batches is permuted per seed, every pass anew
    from ..snapshot import preserved

    try:
        with preserved():
            first = probe(setup, seeds[0], reinit)
            for other in seeds[1:3]:  # two seeds can agree by chance on a short order; a third settles it
                if not _same(first, probe(setup, other, reinit)):
                    return
    except Exception:  # noqa: BLE001 - the runs report what is wrong with the step, each as a failed run
        return
    kind = type(data).__name__
    raise TroptError(
        f"compare: the seeds change nothing: seeds {', '.join(map(str, seeds[:3]))} gave the baseline the same first "
        f"{PROBE_STEPS} steps (the same losses and weights). The model is the Setup's own instance (no reinit, no "
        f"model factory), train_data ({kind}) is read in one fixed order, and the step draws no random numbers, so "
        f"all {len(seeds)} seeds would run the same comparison {len(seeds)} times and no difference could be told "
        "from seed noise. Nothing was run.",
        "vary what a seed can vary: pass reinit=True (training from scratch: each seed re-initialises the model), "
        "give the training data as a Dataset or a DataLoader(shuffle=True), or a list of batches (its order is "
        "permuted per seed); or pass seeds=(0,) to run each candidate once (only instability is then judged)")
