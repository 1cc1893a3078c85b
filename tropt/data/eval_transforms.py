"""``data.eval_transforms``: is the evaluation data prepared like the training data, and deterministically?

- *Different preprocessing*: the per-feature (2-d inputs) or per-channel (dimension 1 of >= 3-d inputs) mean and
  std of the training inputs against the validation inputs. FAIL when they disagree far beyond sampling noise
  (a mean apart by >= 1 pooled std, or a std ratio >= 3, each at z >= 6), e.g. a validation transform that lacks the
  normalisation the training transform has; WARN for a smaller but clear difference (>= 0.5 std, ratio >= 1.5),
  which may also be a genuine shift between the splits. The features or channels are named.
- *Random transforms in evaluation*: two passes over the same validation samples give different tensors: WARN
  (scores are noisy); PASS with a note when ``Setup(eval_augmentation=True)`` declares test-time augmentation.

Inputs are the floating-point tensors of a batch other than its label (rule: :mod:`tropt.data._batches`).
Cost: ``n_batches`` training batches and two passes of ``n_batches`` validation batches (no model step).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import torch

from ..registry import register
from ..result import CheckResult, Status
from ..snapshot import preserved
from ._batches import fingerprint, input_leaves, loader_state, path_name, read_pass

CHECK = "data.eval_transforms"
MAX_ROWS = 200  # feature rows kept in the evidence table (worst first); metrics count all


def _stack(batches: list[Any]) -> dict[tuple, torch.Tensor]:
    """Per input path: the samples of every batch, concatenated (CPU, float64)."""
    parts: dict[tuple, list[torch.Tensor]] = {}
    for b in batches:
        for path, t in input_leaves(b):
            parts.setdefault(path, []).append(t.detach().cpu().double())
    out = {}
    for path, ts in parts.items():
        if len({t.shape[1:] for t in ts}) == 1:
            out[path] = torch.cat(ts)
    return out


def _channels(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(per-channel mean, per-channel std over every element, per-sample per-channel means (N, C))."""
    if x.ndim == 1:
        x = x[:, None]
    flat = x.reshape(x.shape[0], x.shape[1], -1)  # (N, C, rest)
    per_sample = flat.mean(2)
    everything = flat.transpose(0, 1).reshape(x.shape[1], -1)
    return everything.mean(1), everything.std(1, unbiased=False), per_sample


def compare_inputs(train: torch.Tensor, val: torch.Tensor, name: str) -> pd.DataFrame:
    """Per feature/channel: means, stds, the effect (|mean difference| / pooled std), std ratio and their z-scores."""
    mt, st, pt = _channels(train)
    mv, sv, pv = _channels(val)
    nt, nv = train.shape[0], val.shape[0]
    se = (pt.std(0, unbiased=True).nan_to_num(0) ** 2 / nt + pv.std(0, unbiased=True).nan_to_num(0) ** 2 / nv).sqrt()
    diff = (mt - mv).abs()
    pooled = ((st ** 2 + sv ** 2) / 2).sqrt()
    tiny = 1e-12
    effect = torch.where(pooled > tiny, diff / pooled.clamp_min(tiny), torch.where(diff > 1e-9, torch.inf, 0.0))
    z = torch.where(se > tiny, diff / se.clamp_min(tiny), torch.where(diff > 1e-9, torch.inf, 0.0))
    both = (st > tiny) & (sv > tiny)
    log_ratio = torch.where(both, (sv.clamp_min(tiny) / st.clamp_min(tiny)).log(), torch.zeros_like(st))
    z_std = log_ratio.abs() / math.sqrt(1 / (2 * max(nt - 1, 1)) + 1 / (2 * max(nv - 1, 1)))
    kind = "feature" if train.ndim == 2 else "channel"
    return pd.DataFrame({"input": name, "kind": kind, "index": np.arange(len(mt)), "train_mean": mt.numpy(), "val_mean": mv.numpy(),
                         "train_std": st.numpy(), "val_std": sv.numpy(), "effect": effect.numpy(), "z_mean": z.numpy(),
                         "std_ratio": log_ratio.exp().numpy(), "z_std": z_std.numpy()})


def _ordered(loader: Any) -> bool:
    """Whether two passes draw the same sample indices (a sequential sampler), read from the batch sampler only."""
    bs = getattr(loader, "batch_sampler", None)
    if bs is None:
        return True
    try:
        return [list(b) for b in bs] == [list(b) for b in bs]
    except TypeError:
        return True


def _differences(a: list[Any], b: list[Any]) -> pd.DataFrame:
    """Per input path: how far two reads of the same validation samples are apart."""
    rows = []
    for x, y in zip(a, b):
        lx, ly = dict(input_leaves(x)), dict(input_leaves(y))
        for path, t in lx.items():
            u = ly.get(path)
            if u is None or u.shape != t.shape:
                rows.append({"input": path_name(path), "samples": int(t.shape[0]), "differing": int(t.shape[0]), "max_abs_diff": math.inf})
                continue
            d = (t.detach().cpu().double() - u.detach().cpu().double()).abs().reshape(t.shape[0], -1)
            d = d.nan_to_num(0.0)
            rows.append({"input": path_name(path), "samples": int(t.shape[0]), "differing": int((d.amax(1) > 0).sum()),
                         "max_abs_diff": float(d.max()) if d.numel() else 0.0})
    df = pd.DataFrame(rows, columns=["input", "samples", "differing", "max_abs_diff"])
    return df.groupby("input", as_index=False).agg(samples=("samples", "sum"), differing=("differing", "sum"),
                                                   max_abs_diff=("max_abs_diff", "max"))


def _training_inputs(setup: Any, n_batches: int) -> list[Any]:
    """Training batches drawn uniformly from the training dataset through the user's transform and collate: the
    split as it is prepared, not as a weighted sampler re-balances it (data.sampling reports that)."""
    loader = setup.loader("train")
    ds = getattr(loader, "dataset", None)
    if isinstance(loader, torch.utils.data.DataLoader) and not isinstance(ds, torch.utils.data.IterableDataset):
        torch.manual_seed(setup.seed)
        uniform = torch.utils.data.DataLoader(ds, batch_size=loader.batch_size or setup.batch_size, shuffle=True,
                                              collate_fn=loader.collate_fn)
        return read_pass(uniform, n_batches, "train_data")
    return list(setup.batches(n_batches, cycle=False))


def _items(ds: Any, indices: list[int]) -> list[Any]:
    """Dataset items as one-sample batches (so the batch rules apply)."""
    from torch.utils.data import default_collate

    return [default_collate([ds[i]]) for i in indices]


@register(CHECK, title="Evaluation data prepared like training data",
          description="train vs val per-feature/channel mean and std; random transforms in evaluation")
def check_eval_transforms(setup: Any, *, n_batches: int = 8, fail_effect: float = 1.0, fail_std_ratio: float = 3.0,
                          warn_effect: float = 0.5, warn_std_ratio: float = 1.5, z: float = 6.0,
                          progress: bool = True) -> CheckResult:
    """Compare the inputs of the Setup's training and validation data, and read the validation data twice.

    Parameters
    ----------
    setup
        The :class:`tropt.Setup`; SKIP without ``val_data``.
    n_batches
        Batches read from the training data and from each of two validation passes.
    fail_effect, fail_std_ratio
        FAIL when a feature's means differ by at least ``fail_effect`` pooled stds, or its stds by a factor of at least
        ``fail_std_ratio``, with a z-score of at least ``z`` (far beyond sampling noise).
    warn_effect, warn_std_ratio
        WARN thresholds, same rule.
    z
        The z-score a difference needs (per-sample means for the mean; the normal-theory std of a log std ratio).
    progress
        Unused (the check is quick); accepted for uniformity.
    """
    if setup.val_data is None:
        return CheckResult(CHECK, Status.SKIP, "no val_data: pass Setup(val_data=...) to compare how evaluation data is prepared")
    val_loader = setup.loader("val")
    with preserved():
        train = _training_inputs(setup, n_batches)
    with preserved(), loader_state(val_loader, setup.seed):
        first = read_pass(val_loader, n_batches, "val_data")
        is_list = isinstance(setup.val_data, (list, tuple))
        how, pair = "two passes over the validation loader", first
        if is_list:
            second, how = first, None
        elif _ordered(val_loader):
            second = read_pass(val_loader, n_batches, "val_data")
        elif getattr(val_loader, "dataset", None) is not None and hasattr(val_loader.dataset, "__getitem__"):
            idx = list(range(min(len(val_loader.dataset), 64)))
            pair = _items(val_loader.dataset, idx)
            second, how = _items(val_loader.dataset, idx), "each of the first validation items read twice (the loader shuffles)"
        else:
            second, how = None, None
    metrics: dict[str, Any] = {"train_batches": len(train), "val_batches": len(first), "eval_augmentation": setup.eval_augmentation}
    tables: dict[str, pd.DataFrame] = {}
    findings: list[tuple[Status, str, str]] = []
    notes: list[str] = []

    # ---- random transforms in evaluation
    if how is None:
        notes.append("a list of validation batches is fixed tensors: no transform runs when it is read" if is_list
                     else "the validation loader shuffles and has no dataset to read twice: randomness not checked")
    else:
        diffs = _differences(pair, second)
        tables["randomness"] = diffs
        random = diffs[diffs["differing"] > 0]
        metrics.update(random_inputs=len(random), random_compared=how)
        if len(random):
            worst = random.sort_values("max_abs_diff", ascending=False).iloc[0]
            what = (f"{how} give different tensors ({', '.join(random['input'])}: {int(random['differing'].sum())} of "
                    f"{int(random['samples'].sum())} samples, max |difference| {worst['max_abs_diff']:.3g})")
            if setup.eval_augmentation:
                notes.append(f"{what}: declared test-time augmentation (eval_augmentation=True)")
            else:
                findings.append((Status.WARN, f"random transforms in evaluation: {what}, so validation scores are noisy",
                                 "Use deterministic validation transforms (e.g. Resize + CenterCrop instead of RandomResizedCrop, "
                                 "no random flips); if test-time augmentation is intended, declare it with Setup(eval_augmentation=True)."))
        elif setup.eval_augmentation:
            notes.append("eval_augmentation=True, but two reads of the validation data gave identical tensors")

    # ---- statistics of the inputs
    xt, xv = _stack(train), _stack(first)
    frames, shape_notes = [], []
    for path in xt:
        if path not in xv:
            continue
        a, b = xt[path], xv[path]
        name = path_name(path)
        if a.shape[1:2] != b.shape[1:2] or (a.ndim != b.ndim):
            shape_notes.append(f"{name}: train samples {tuple(a.shape[1:])}, val {tuple(b.shape[1:])}")
            continue
        if a.shape[2:] != b.shape[2:]:
            shape_notes.append(f"{name}: train samples {tuple(a.shape[1:])}, val {tuple(b.shape[1:])}")
        frames.append(compare_inputs(a, b, name))
    if shape_notes:
        findings.append((Status.WARN, "validation inputs are shaped differently from training inputs (" + "; ".join(shape_notes) + ")",
                         "Give the validation transform the same resize/crop size as the training transform."))
    if frames:
        df = pd.concat(frames, ignore_index=True)
        eff_ok, std_ok = df["z_mean"] >= z, df["z_std"] >= z
        lr = np.log(df["std_ratio"].to_numpy(dtype=float))
        fail = (eff_ok & (df["effect"] >= fail_effect)) | (std_ok & (np.abs(lr) >= math.log(fail_std_ratio)))
        warn = ~fail & ((eff_ok & (df["effect"] >= warn_effect)) | (std_ok & (np.abs(lr) >= math.log(warn_std_ratio))))
        df["verdict"] = np.where(fail, "fail", np.where(warn, "warn", "ok"))
        df = df.sort_values(["verdict", "effect"], key=lambda s: s.map({"fail": 0, "warn": 1, "ok": 2}) if s.name == "verdict" else -s,
                            kind="stable").reset_index(drop=True)
        tables["features"] = df.head(MAX_ROWS)
        metrics.update(features_compared=len(df), features_fail=int(fail.sum()), features_warn=int(warn.sum()),
                       max_effect=float(df["effect"].replace(np.inf, np.nan).max() if np.isfinite(df["effect"]).any() else 0.0),
                       max_std_ratio=float(np.exp(np.abs(lr)).max()))
        bad = df[df["verdict"] != "ok"]
        if len(bad):
            status = Status.FAIL if fail.any() else Status.WARN
            names = [f"{r.input} {r.kind} {r.index} (mean {r.train_mean:.3g} vs {r.val_mean:.3g}, std {r.train_std:.3g} vs {r.val_std:.3g})"
                     for r in bad.head(4).itertuples()]
            more = f" and {len(bad) - 4} more" if len(bad) > 4 else ""
            sentence = (f"{len(bad)} input {bad['kind'].iloc[0]}(s) of the validation data are distributed differently from training "
                        f"{'far ' if status is Status.FAIL else ''}beyond sampling noise: {'; '.join(names)}{more}")
            if status is Status.FAIL:
                findings.append((status, sentence, "Apply the training transform's preprocessing (normalisation, scaling, "
                                 "feature encoding) to the validation data too, with the statistics fitted on the training data."))
            else:
                findings.append((status, sentence + " (a transform difference, or a genuine shift between the splits)",
                                 "Check that the validation transform normalises like the training transform; if it does, "
                                 "the splits differ (see data.label_shift / data.temporal_leakage)."))
    else:
        notes.append("no floating-point input tensor in both splits to compare")
    status = max((f[0] for f in findings), key=lambda s: s.rank, default=Status.PASS)
    findings.sort(key=lambda f: -f[0].rank)
    summary = "; ".join(f[1] for f in findings) if findings else (
        "validation inputs are distributed like training inputs" + ("" if how is None else " and read deterministically"
                                                                    if not setup.eval_augmentation else ""))
    if notes:
        summary += " (" + "; ".join(notes) + ")"
    return CheckResult(CHECK, status, summary, metrics, tables, [f[2] for f in findings])
