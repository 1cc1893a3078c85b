"""The live monitor's replica-sync check: are the data-parallel copies of the model still the same on every rank?

Every ``sync_every`` optimizer steps each rank computes a checksum of each trainable parameter (its float64 sum and
sum of squares, one pass over the parameters) and the ranks exchange these small vectors with one ``all_gather``.
A parameter whose checksum differs from rank 0's beyond a relative tolerance means the replicas diverged (a clip or
update applied on one rank only, a collective that lost data): the model each rank trains is no longer the same.

Sharded or model-parallel parameters (DTensor, FSDP, DeepSpeed ZeRO-3) legitimately differ across ranks; such models
are not compared. Neither is anything when ``torch.distributed`` is not initialised or has one process.
"""

from __future__ import annotations

from typing import Any

import torch

RTOL = 1e-5  # relative difference of a checksum, against its scale, that counts as out of sync
_SHARDED_MODULES = ("FullyShardedDataParallel", "FSDPModule")
_SHARDED_ATTRS = ("ds_id", "_is_flat_param", "_fsdp_flattened", "_sharded_param_data")


def distributed_world() -> int:
    """The number of processes in the default group (1 when torch.distributed is not initialised)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return int(dist.get_world_size())


def sharded(model: torch.nn.Module) -> str | None:
    """Why ``model``'s parameters differ across ranks by design (sharded / model-parallel), or None."""
    for m in model.modules():
        if any(c.__name__ in _SHARDED_MODULES for c in type(m).__mro__):
            return f"{type(m).__name__} shards its parameters"
    for name, p in model.named_parameters():
        if type(p).__name__ == "DTensor" or type(p.data).__name__ == "DTensor":
            return f"parameter {name} is a DTensor (sharded or tensor-parallel)"
        if any(hasattr(p, a) for a in _SHARDED_ATTRS):
            return f"parameter {name} is a sharded (FSDP / DeepSpeed) parameter"
    return None


def checksums(params: list[tuple[str, torch.Tensor]]) -> torch.Tensor:
    """(n, 3) float64: each parameter's sum, sum of squares and element count (non-finite sums stay NaN/inf)."""
    rows = []
    for _, p in params:
        d = p.detach()
        rows.append(torch.stack([d.sum(dtype=torch.float64), (d * d).sum(dtype=torch.float64),  # no float64 copy
                                 torch.tensor(float(d.numel()), dtype=torch.float64, device=d.device)]))
    return torch.stack(rows)


def gather(local: torch.Tensor) -> torch.Tensor:
    """Every rank's checksums, (world, n, 3) on the CPU, through one all_gather on the backend's device."""
    import torch.distributed as dist

    on_device = "nccl" in str(dist.get_backend()).lower() and local.device.type == "cuda"
    t = local if on_device else local.cpu()  # NCCL takes CUDA tensors; gloo and the others the CPU
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t)
    return torch.stack(parts).cpu()


def compare(names: list[str], every: Any, rtol: float = RTOL) -> tuple[str | None, str | None]:
    """(out-of-sync message, layout problem) from gathered checksums ``every`` (world, n, 3).

    A layout problem (the ranks' parameters differ in size: a sharded model) means nothing can be compared."""
    every = every.double()
    if bool((every[:, :, 2] != every[0:1, :, 2]).any()):
        return None, "the ranks' parameters differ in size (a sharded or model-parallel model)"
    ref, others = every[0], every[1:]
    finite = torch.isfinite(every[:, :, :2]).all(dim=2)  # (world, n)
    fin_bad = (finite[1:] != finite[0:1])  # finite on some ranks only
    scale_sq = every[:, :, 1].abs().amax(dim=0)  # (n,)
    scale_sum = (scale_sq * every[0, :, 2]).sqrt()  # |sum| <= sqrt(n * sum of squares)
    with torch.no_grad():
        d_sum = (others[:, :, 0] - ref[:, 0]).abs()
        d_sq = (others[:, :, 1] - ref[:, 1]).abs()
        rel = torch.maximum(torch.nan_to_num(d_sum / scale_sum.clamp_min(1e-300), nan=0.0),
                            torch.nan_to_num(d_sq / scale_sq.clamp_min(1e-300), nan=0.0))  # (world-1, n)
    bad = (rel > rtol) & finite[1:] & finite[0:1] | fin_bad
    if not bool(bad.any()):
        return None, None
    cols = [i for i in range(len(names)) if bool(bad[:, i].any())]
    parts = []
    for i in cols[:5]:
        ranks = [r + 1 for r in range(others.shape[0]) if bool(bad[r, i])]
        worst = max(ranks, key=lambda r: float(rel[r - 1, i]))
        who = f"rank {ranks[0]} differs" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))} differ"
        how = "non-finite on some ranks only" if bool(fin_bad[:, i].any()) else \
            f"by a relative {float(rel[worst - 1, i]):.3g}" + (f", most on rank {worst}" if len(ranks) > 1 else "")
        parts.append(f"{names[i]} ({who} from rank 0: {how})")
    more = f", and {len(cols) - 5} more" if len(cols) > 5 else ""
    msg = (f"replicas out of sync: {len(cols)} of {len(names)} parameter(s) differ across the {every.shape[0]} "
           f"processes: {'; '.join(parts)}{more}. Each process now trains a different model: look for a step that "
           "runs on some ranks only (a clip, an update or a parameter change under `if rank == ...`), a rank-local "
           "gradient norm, or parameters changed outside the optimizer")
    return msg, None
