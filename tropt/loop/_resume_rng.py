"""How ``loop.resume`` judges a checkpoint that leaves out the RNG streams (issue 27 §1 and §2).

The check hands both runs the same batches, so a lost RNG state reaches only the draws made while training (the
step's noise, timesteps and masks, dropout). :func:`tropt.loop.resume._rng_probe` resumes once more from the same
checkpoint with the straight run's RNG streams, which tells whether the RNG alone explains the divergence
(``fixes``) and whether it reaches training at all (``matters``). From that:

- the RNG is named first only when restoring it alone reproduces the straight run; otherwise the components whose
  loss explains the divergence come first (a target network the step keeps on ctx), and the RNG after them;
- when it is the only thing lost and the step draws its own randomness, the resumed run differs in expectation only:
  a WARN (not bit-exact), unless the same RNG also drives something else a real resume would change: a DataLoader
  whose sampler shuffles from the global RNG (the data order), or the model's dropout modules (kept a FAIL, as
  ``loop.resume`` has always judged dropout masks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn
from torch.utils.data import DataLoader


@dataclass(frozen=True)
class RngProbe:
    """What resuming with the straight run's RNG streams showed: ``fixes``, the runs then match; ``matters``, the
    result differs from the resume without them; ``param_error``, the parameters' max relative error then."""

    fixes: bool
    matters: bool
    param_error: float


def global_rng_sampler(setup: Any) -> bool:
    """Whether the user's training DataLoader shuffles with the global torch RNG (a sampler with no generator of its
    own): a resume that loses the RNG state then also changes which samples come next."""
    data = getattr(setup, "train_data", None)
    if not isinstance(data, DataLoader):
        return False
    sampler = getattr(data.batch_sampler, "sampler", None) or data.sampler
    return getattr(sampler, "generator", False) is None


def dropout_modules(model: nn.Module) -> list[str]:
    """The model's dropout modules with p > 0, by name."""
    return [name or type(m).__name__ for name, m in model.named_modules()
            if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0]


def order_lost(lost: list[str], probe: RngProbe | None) -> list[str]:
    """``lost`` with the RNG moved after the other components when restoring it alone does not explain the
    divergence."""
    if probe is None or "RNG" not in lost or probe.fixes:
        return lost
    return [c for c in lost if c != "RNG"] + ["RNG"]


def first_divergence(lost: list[str], probe: RngProbe | None) -> tuple[str, list[str]]:
    """The component named as the first divergence, and the others not restored."""
    if not lost:
        return "state outside the checkpoint", []
    if lost[0] == "RNG" and probe is not None and not probe.matters:  # the RNG lost, but it changes nothing here
        return "state outside the checkpoint", lost
    return lost[0], lost[1:]


RNG_ONLY_ADVICE = ("Resume is exact except for the RNG streams: not bit-exact; save torch/numpy/python RNG states for "
                   "bit-exact resume (torch.get_rng_state(), torch.cuda.get_rng_state_all(), np.random.get_state(), "
                   "random.getstate()) and restore them in load_state.")


def rng_only_kind(setup: Any, lost: list[str], probe: RngProbe | None) -> str | None:
    """When the RNG is the only component lost and restoring it alone reproduces the straight run: ``"warn"`` for
    the step's own draws, ``"data order"`` when a shuffling DataLoader draws from it too, ``"dropout"`` when the
    model's dropout modules do; None otherwise."""
    if probe is None or lost != ["RNG"] or not (probe.fixes and probe.matters):
        return None
    if global_rng_sampler(setup):
        return "data order"
    if dropout_modules(setup.model):
        return "dropout"
    return "warn"
