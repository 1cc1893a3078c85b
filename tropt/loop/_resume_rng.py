"""How ``loop.resume`` judges a checkpoint that leaves out the RNG streams (issue 27 §1 and §2).

The check hands both runs the same batches, so a lost RNG state reaches only the draws made while training (the
step's noise, timesteps and masks, dropout). :func:`tropt.loop.resume._rng_probe` resumes once more from the same
checkpoint with the straight run's RNG streams, which tells whether the RNG alone explains the divergence
(``fixes``) and whether it reaches training at all (``matters``). From that:

- the RNG is named first only when restoring it alone reproduces the straight run; otherwise the components whose
  loss explains the divergence come first (a target network the step keeps on ctx), and the RNG after them;
- when it is the only thing lost and all it changes is randomness the step draws while training (a diffusion step's
  noise and timesteps, masks, the model's dropout masks alike), the resumed run differs in expectation only: a WARN
  (not bit-exact) naming the RNG and what draws from it, unless the same RNG also drives something a real resume
  would change beyond those draws: a DataLoader whose sampler shuffles from the global RNG (which samples come next),
  a FAIL.

The probe also gives the comparison's noise floor (``metrics["noise_floor"]``): the same resume on another RNG
stream, against the resume without the RNG state.
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
    floor: float = 0.0  # the parameters' max relative error between the two resumes: only the RNG streams differ


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
    """When the RNG is the only component lost and restoring it alone reproduces the straight run: ``"warn"`` when
    all it changes is the draws made while training (the step's noise, dropout masks), ``"data order"`` when a
    shuffling DataLoader draws from it too; None otherwise."""
    if probe is None or lost != ["RNG"] or not (probe.fixes and probe.matters):
        return None
    if global_rng_sampler(setup):
        return "data order"
    return "warn"


def rng_draws(setup: Any) -> str:
    """What draws from the RNG while training, for the WARN's summary: the model's dropout modules when it has any,
    else the step's own random draws (noise, timesteps, masks)."""
    drops = dropout_modules(setup.model)
    if drops:
        names = ", ".join(drops[:4]) + (f" and {len(drops) - 4} more" if len(drops) > 4 else "")
        return f"the dropout masks of {names} differ after the resume"
    return "the step's own random draws differ after the resume"
