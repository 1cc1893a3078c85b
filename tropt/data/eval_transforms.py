"""``data.eval_transforms``: is the evaluation data prepared like the training data, and deterministically?

- *Different preprocessing*: the per-feature (2-d inputs) or per-channel (dimension 1 of >= 3-d inputs) mean and
  std of the training inputs against the validation inputs. FAIL when they disagree far beyond sampling noise
  (a mean apart by >= 1 pooled std, or a std ratio >= 3, each at z >= 6), e.g. a validation transform that lacks the
  normalisation the training transform has; WARN for a smaller but clear difference (>= 0.5 std, ratio >= 1.5),
  which may also be a genuine shift between the splits. The features or channels are named.
- *Random transforms in evaluation*: two passes over the same validation samples give different tensors: WARN
  (scores are noisy); PASS with a note when ``Setup(eval_augmentation=True)`` declares test-time augmentation.

Inputs are the floating-point tensors of a batch other than its label (rule: :mod:`tropt.data.pipeline`).
Cost: ``n_batches`` training batches and two passes of ``n_batches`` validation batches (no model step).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch

from ..core.hashes import row_hashes
from ..registry import register
from ..result import CheckResult, Status
from ..snapshot import preserved
from .pipeline import input_leaves, iter_pass, loader_state, path_name, sample_dim

if TYPE_CHECKING:
    from ..setup import Setup

CHECK = "data.eval_transforms"
MAX_ROWS = 200  # feature rows kept in the evidence table (worst first); metrics count all


class Moments:
    """Streaming per-channel statistics of one input across batches: one batch in memory at a time.

    A tensor (N, C, ...) has channels along dimension 1 (a 2-d (N, F) tensor: features; 1-d: one feature). Sums are
    taken around the first batch's channel means, so a large offset does not cancel the variance.
    """

    def __init__(self) -> None:
        self.shape: tuple | None = None
        self.shift: torch.Tensor | None = None
        self.sum: torch.Tensor | None = None
        self.sumsq: torch.Tensor | None = None
        self.count = 0
        self.per_sample: list[torch.Tensor] = []
        self.mixed = False

    def add(self, t: torch.Tensor) -> None:
        x = t.detach()
        x = x[:, None] if x.ndim == 1 else x
        if self.shape is None:
            self.shape = tuple(x.shape[1:])
        elif tuple(x.shape[1:]) != self.shape:  # sample shapes vary between batches (variable-size inputs)
            self.mixed = True
            return
        flat = x.reshape(x.shape[0], x.shape[1], -1).float()  # float32 elements, float64 sums: bounded memory
        if self.shift is None:
            self.shift = flat.mean(dim=(0, 2), dtype=torch.float64).float()
        d = flat - self.shift[None, :, None].to(flat.device)
        s = d.sum(dim=(0, 2), dtype=torch.float64).cpu()
        ss = d.pow(2).sum(dim=(0, 2), dtype=torch.float64).cpu()
        self.sum = s if self.sum is None else self.sum + s
        self.sumsq = ss if self.sumsq is None else self.sumsq + ss
        self.count += flat.shape[0] * flat.shape[2]
        self.per_sample.append(flat.mean(2, dtype=torch.float64).cpu())

    def stats(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(per-channel mean, per-channel std over every element, per-sample per-channel means (N, C))."""
        assert self.sum is not None and self.sumsq is not None and self.shift is not None  # set by the first add()
        m = self.sum / self.count
        std = (self.sumsq / self.count - m ** 2).clamp_min(0).sqrt()
        return m + self.shift.double().cpu(), std, torch.cat(self.per_sample)


def _kurtosis(x: torch.Tensor) -> torch.Tensor:
    """Per-column (non-excess) kurtosis of (N, C) values; 3 where a column is constant (nothing to say)."""
    d = x - x.mean(0)
    m2 = d.pow(2).mean(0)
    return torch.where(m2 > 0, d.pow(4).mean(0) / m2.clamp_min(1e-300).pow(2), torch.full_like(m2, 3.0))


def compare_inputs(train: Moments, val: Moments, name: str) -> pd.DataFrame:
    """Per feature/channel: means, stds, the effect (|mean difference| / pooled std), std ratio and their z-scores."""
    mt, st, pt = train.stats()
    mv, sv, pv = val.stats()
    nt, nv = pt.shape[0], pv.shape[0]
    se = (pt.std(0, unbiased=True).nan_to_num(0) ** 2 / nt + pv.std(0, unbiased=True).nan_to_num(0) ** 2 / nv).sqrt()
    diff = (mt - mv).abs()
    pooled = ((st ** 2 + sv ** 2) / 2).sqrt()
    tiny = 1e-12
    effect = torch.where(pooled > tiny, diff / pooled.clamp_min(tiny), torch.where(diff > 1e-9, torch.inf, 0.0))
    z = torch.where(se > tiny, diff / se.clamp_min(tiny), torch.where(diff > 1e-9, torch.inf, 0.0))
    both = (st > tiny) & (sv > tiny)
    log_ratio = torch.where(both, (sv.clamp_min(tiny) / st.clamp_min(tiny)).log(), torch.zeros_like(st))
    # Var(log s) ~ (kurtosis - 1) / (4 n): the normal-theory 1 / (2 n) only when the kurtosis is 3. A feature that is
    # non-zero in a few samples has a kurtosis of ~1/p, and its std ratio between two random splits varies many times
    # more than normal theory says; heavy tails never make a difference look more certain (kurtosis floored at 3).
    var_t = (_kurtosis(pt).clamp_min(3.0) - 1) / (4 * max(nt - 1, 1))
    var_v = (_kurtosis(pv).clamp_min(3.0) - 1) / (4 * max(nv - 1, 1))
    z_std = log_ratio.abs() / (var_t + var_v).sqrt()
    assert train.shape is not None  # compared only after a batch was added (stats() above)
    kind = "channel" if len(train.shape) >= 2 else "feature"
    return pd.DataFrame({"input": name, "kind": kind, "index": np.arange(len(mt)), "train_mean": mt.numpy(),
                         "val_mean": mv.numpy(),
                         "train_std": st.numpy(), "val_std": sv.numpy(), "effect": effect.numpy(), "z_mean": z.numpy(),
                         "std_ratio": log_ratio.exp().numpy(), "z_std": z_std.numpy()})


def _leaves(batch: Any, dim: int | None) -> list[tuple[tuple, torch.Tensor]]:
    """The batch's inputs with samples along dimension 0 (a custom split_fn layout: the whole tensor as one row)."""
    out = []
    for path, t in input_leaves(batch):
        if dim is None:
            t = t[None]
        elif 0 < dim < t.ndim:
            t = t.movedim(dim, 0)
        out.append((path, t))
    return out


def _add_all(moments: dict[tuple, Moments], batch: Any, dim: int | None) -> None:
    if dim is None:  # where samples sit is the user's split_fn's secret: no per-sample statistics
        return
    for path, t in _leaves(batch, dim):
        moments.setdefault(path, Moments()).add(t)


def _ordered(loader: Any) -> bool:
    """Whether two passes draw the same sample indices (a sequential sampler), read from the batch sampler only."""
    bs = getattr(loader, "batch_sampler", None)
    if bs is None or isinstance(getattr(loader, "dataset", None), torch.utils.data.IterableDataset):
        return True  # an iterable dataset's order is its own (its sampler is infinite)
    try:
        return [list(b) for b in bs] == [list(b) for b in bs]
    except TypeError:
        return True


class Reads:
    """What one read of the validation samples gave: per input, a hash of every sample, and the first batch itself
    (the max |difference| is measured on it, so only one batch is held)."""

    def __init__(self, dim: int | None = 0) -> None:
        self.dim = dim
        self.hashes: dict[tuple, list[list[bytes]]] = {}
        self.first: dict[tuple, torch.Tensor] = {}

    def add(self, index: int, batch: Any) -> None:
        for path, t in _leaves(batch, self.dim):
            self.hashes.setdefault(path, []).append(row_hashes(t))
            if index == 0:
                self.first[path] = t.detach().cpu()

    def compare(self, batches: Any) -> pd.DataFrame:
        """Per input: samples compared, samples that differ in the second read, max |difference| in the first batch."""
        rows: dict[tuple, dict] = {}
        for i, batch in enumerate(batches):
            for path, t in _leaves(batch, self.dim):
                row = rows.setdefault(path, {"input": path_name(path), "samples": 0, "differing": 0,
                                             "max_abs_diff": 0.0})
                before = self.hashes.get(path, [])
                now = row_hashes(t)
                row["samples"] += len(now)
                if i >= len(before) or len(before[i]) != len(now):
                    row["differing"] += len(now)
                    row["max_abs_diff"] = math.inf
                    continue
                row["differing"] += sum(a != b for a, b in zip(before[i], now))
                if i == 0 and path in self.first and self.first[path].shape == t.shape:
                    d = (self.first[path].double() - t.detach().cpu().double()).abs().nan_to_num(0.0)
                    row["max_abs_diff"] = max(row["max_abs_diff"], float(d.max()) if d.numel() else 0.0)
        return pd.DataFrame(list(rows.values()), columns=["input", "samples", "differing", "max_abs_diff"])


def _items(ds: Any, indices: list[int]) -> Iterator[Any]:
    """Dataset items as one-sample batches (so the batch rules apply)."""
    from torch.utils.data import default_collate

    for i in indices:
        yield default_collate([ds[i]])


def _training_inputs(setup: Setup, n_batches: int) -> Iterator[Any]:
    """Training batches drawn uniformly from the training dataset through the user's transform and collate: the
    split as it is prepared, not as a weighted sampler re-balances it (data.sampling reports that)."""
    loader = setup.loader("train")
    ds = getattr(loader, "dataset", None)
    if isinstance(loader, torch.utils.data.DataLoader) and not isinstance(ds, torch.utils.data.IterableDataset):
        torch.manual_seed(setup.seed)
        uniform = torch.utils.data.DataLoader(loader.dataset, batch_size=loader.batch_size or setup.batch_size,
                                              shuffle=True, collate_fn=loader.collate_fn)
        return iter_pass(uniform, n_batches, "train_data")
    return setup.batches(n_batches, cycle=False)


def _population_shift(df: pd.DataFrame, bad: pd.DataFrame) -> bool:
    """Whether the differing features look like a different population rather than a different preprocessing: at
    least two of them, at most a quarter of all features, shifted in both directions, with the typical feature's
    spread unchanged (median std ratio within 1.25x), and none carrying a transform's signature. A missing or
    different transform (normalisation, scaling, encoding) moves most features, moves the affected ones the same
    way, or scales a feature's mean and spread by one factor."""
    if len(bad) < 2 or len(bad) > 0.25 * len(df):
        return False
    if float(np.median(np.abs(np.log(df["std_ratio"].to_numpy(dtype=float))))) > math.log(1.25):
        return False
    moved = np.where(bad["z_mean"] >= bad["z_std"], np.sign(bad["val_mean"] - bad["train_mean"]),
                     np.sign(np.log(bad["std_ratio"])))
    if not ((moved > 0).any() and (moved < 0).any()):
        return False
    # No feature may carry a transform's signature: a scaling (mean and spread multiplied by one factor: values left
    # at 0-16 beside pixels scaled to 0-1) or a mean moved far outside the training distribution.
    tm, vm = bad["train_mean"].to_numpy(dtype=float), bad["val_mean"].to_numpy(dtype=float)
    ratio = bad["std_ratio"].to_numpy(dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        scaled = (ratio >= 2.0) & (tm * vm > 0) & (np.abs(np.log(np.abs(vm / tm)) - np.log(ratio)) < math.log(1.5))
        far = np.abs(vm - tm) > 5.0 * bad["train_std"].to_numpy(dtype=float)
    return not bool((scaled | far).any())


def _train_moments(setup: Setup, n_batches: int, dim: int | None) -> tuple[dict[tuple, Moments], int]:
    """Per input: the statistics of ``n_batches`` training batches (and how many were read)."""
    xt: dict[tuple, Moments] = {}
    n_train = 0
    with preserved():
        for batch in _training_inputs(setup, n_batches):
            _add_all(xt, batch, dim)
            n_train += 1
    return xt, n_train


def _val_reads(setup: Setup, val_loader: Any, n_batches: int,
               dim: int | None) -> tuple[dict[tuple, Moments], int, str | None, Any]:
    """Per input: the statistics of ``n_batches`` validation batches, how many were read, how the validation data
    was read twice (None: not), and the per-input differences between the two reads."""
    xv: dict[tuple, Moments] = {}
    is_list = isinstance(setup.val_data, (list, tuple))
    ds = getattr(val_loader, "dataset", None)
    with preserved(), loader_state(val_loader, setup.seed):
        if is_list:
            how = None
        elif _ordered(val_loader):
            how = "two passes over the validation loader"
        elif ds is not None and hasattr(ds, "__getitem__") and hasattr(ds, "__len__"):
            how = "each of the first validation items read twice (the loader shuffles)"
        else:
            how = None
        first = Reads(dim)
        n_val = 0
        for i, batch in enumerate(iter_pass(val_loader, n_batches, "val_data")):
            _add_all(xv, batch, dim)
            n_val += 1
            if how == "two passes over the validation loader":
                first.add(i, batch)
        diffs = None
        if how == "two passes over the validation loader":
            diffs = first.compare(iter_pass(val_loader, n_batches, "val_data"))
        elif how is not None:
            assert ds is not None  # how names the items of ds
            idx = list(range(min(len(ds), 64)))
            first = Reads(0)  # one-sample batches collated here: samples along dimension 0
            for i, batch in enumerate(_items(ds, idx)):
                first.add(i, batch)
            diffs = first.compare(_items(ds, idx))
    return xv, n_val, how, diffs


def _randomness(setup: Setup, how: str | None, diffs: Any, metrics: dict, tables: dict, findings: list,
                notes: list) -> None:
    """Two reads of the same validation samples that differ: WARN, unless test-time augmentation is declared."""
    if how is None:
        notes.append("a list of validation batches is fixed tensors: no transform runs when it is read"
                     if isinstance(setup.val_data, (list, tuple))
                     else "the validation loader shuffles and has no dataset to read twice: randomness not checked")
        return
    tables["randomness"] = diffs
    random = diffs[diffs["differing"] > 0]
    metrics.update(random_inputs=len(random), random_compared=how)
    if len(random):
        worst = random.sort_values("max_abs_diff", ascending=False).iloc[0]
        what = (f"{how} give different tensors ({', '.join(random['input'])}: {int(random['differing'].sum())} of "
                f"{int(random['samples'].sum())} samples; max |difference| in the first batch "
                f"{worst['max_abs_diff']:.3g})")
        if setup.eval_augmentation:
            notes.append(f"{what}: declared test-time augmentation (eval_augmentation=True)")
        else:
            findings.append((Status.WARN, f"random transforms in evaluation: {what}, so validation scores are noisy",
                             "Use deterministic validation transforms "
                             "(e.g. Resize + CenterCrop instead of RandomResizedCrop, "
                             "no random flips); if test-time augmentation is intended, "
                             "declare it with Setup(eval_augmentation=True)."))
    elif setup.eval_augmentation:
        notes.append("eval_augmentation=True, but two reads of the validation data gave identical tensors")


def _feature_table(xt: dict[tuple, Moments], xv: dict[tuple, Moments]) -> pd.DataFrame | None:
    """Per feature/channel of every input in both splits, the train and validation statistics compared."""
    frames = []
    for path, a in xt.items():
        b = xv.get(path)
        if b is None or a.shape is None or b.shape is None or a.mixed or b.mixed:
            continue
        name = path_name(path)
        if a.shape != b.shape and a.shape[:1] != b.shape[:1]:
            continue  # a different number of features or channels: nothing to compare one by one
        frames.append(compare_inputs(a, b, name))
    return pd.concat(frames, ignore_index=True) if frames else None


def _judge_features(df: pd.DataFrame, fail_effect: float, fail_std_ratio: float, warn_effect: float,
                    warn_std_ratio: float, z: float, metrics: dict, tables: dict, findings: list) -> None:
    """Features distributed differently beyond sampling noise: FAIL (a transform difference) or WARN (smaller, or a
    few features shifted both ways: another population)."""
    eff_ok, std_ok = df["z_mean"] >= z, df["z_std"] >= z
    lr = np.log(df["std_ratio"].to_numpy(dtype=float))
    fail = (eff_ok & (df["effect"] >= fail_effect)) | (std_ok & (np.abs(lr) >= math.log(fail_std_ratio)))
    warn = ~fail & ((eff_ok & (df["effect"] >= warn_effect)) | (std_ok & (np.abs(lr) >= math.log(warn_std_ratio))))
    df["verdict"] = np.where(fail, "fail", np.where(warn, "warn", "ok"))
    df = df.sort_values(["verdict", "effect"],
                        key=lambda s: s.map({"fail": 0, "warn": 1, "ok": 2}) if s.name == "verdict" else -s,
                        kind="stable").reset_index(drop=True)
    tables["features"] = df.head(MAX_ROWS)
    metrics.update(features_compared=len(df), features_fail=int(fail.sum()), features_warn=int(warn.sum()),
                   max_effect=float(df["effect"].replace(np.inf, np.nan).max()
                                    if np.isfinite(df["effect"]).any() else 0.0),
                   max_std_ratio=float(np.exp(np.abs(lr)).max()))
    bad = df[df["verdict"] != "ok"]
    population = _population_shift(df, bad)
    metrics["pattern"] = "none" if not len(bad) else "population" if population else "transform"
    if not len(bad):
        return
    names = [f"{r.input} {r.kind} {r.index} (mean {r.train_mean:.3g} vs {r.val_mean:.3g}, "
             f"std {r.train_std:.3g} vs {r.val_std:.3g})"
             for r in bad.head(4).itertuples()]
    more = f" and {len(bad) - 4} more" if len(bad) > 4 else ""
    if population:
        # A few features, shifted both ways, the rest alike: rows drawn from elsewhere, not a preprocessing step
        # (a missing normalisation moves most features the same way). Judgement, not a defect of the transforms.
        findings.append((Status.WARN,
                         f"{len(bad)} of {len(df)} input {bad['kind'].iloc[0]}(s) of the validation data "
                         "differ from training "
                         f"beyond sampling noise, in both directions, while the others agree (median std ratio "
                         f"{float(np.exp(np.median(np.abs(lr)))):.2f}): the validation rows look drawn from another "
                         f"population, not prepared differently: {'; '.join(names)}{more}",
                         "Check how the validation split was drawn: a contiguous block of ordered data (by writer, "
                         "source or time) differs from the rest; shuffle before splitting, or split by group on "
                         "purpose (see data.label_shift and data.group_leakage)."))
        return
    status = Status.FAIL if fail.any() else Status.WARN
    sentence = (f"{len(bad)} input {bad['kind'].iloc[0]}(s) of the validation data "
                "are distributed differently from training "
                f"{'far ' if status is Status.FAIL else ''}beyond sampling noise: {'; '.join(names)}{more}")
    if status is Status.FAIL:
        findings.append((status, sentence, "Apply the training transform's preprocessing (normalisation, scaling, "
                         "feature encoding) to the validation data too, "
                         "with the statistics fitted on the training data."))
    else:
        findings.append((status, sentence + " (a transform difference, or a genuine shift between the splits)",
                         "Check that the validation transform normalises like the training transform; if it does, "
                         "the splits differ (see data.label_shift / data.temporal_leakage)."))


@register(CHECK, title="Evaluation data prepared like training data",
          description="train vs val per-feature/channel mean and std; random transforms in evaluation",
          plot="tropt.plots.contract")
def check_eval_transforms(setup: Setup, *, n_batches: int = 8, fail_effect: float = 1.0, fail_std_ratio: float = 3.0,
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
        The z-score a difference needs (per-sample means for the mean; the std of a log std ratio, widened by each
        feature's kurtosis).
    progress
        Unused (the check is quick); accepted for uniformity.
    """
    if setup.val_data is None:
        return CheckResult(CHECK, Status.SKIP,
                           "no val_data: pass Setup(val_data=...) to compare how evaluation data is prepared")
    val_loader = setup.loader("val")
    dim = sample_dim(setup)
    xt, n_train = _train_moments(setup, n_batches, dim)
    xv, n_val, how, diffs = _val_reads(setup, val_loader, n_batches, dim)
    metrics: dict[str, Any] = {"train_batches": n_train, "val_batches": n_val,
                               "eval_augmentation": setup.eval_augmentation}
    tables: dict[str, pd.DataFrame] = {}
    findings: list[tuple[Status, str, str]] = []
    notes: list[str] = []
    _randomness(setup, how, diffs, metrics, tables, findings, notes)
    df = _feature_table(xt, xv)
    read_twice = int(diffs["samples"].sum()) if diffs is not None and len(diffs) else 0
    metrics.update(features_compared=0, random_samples_compared=read_twice)
    if df is not None:
        _judge_features(df, fail_effect, fail_std_ratio, warn_effect, warn_std_ratio, z, metrics, tables, findings)
    elif not read_twice and not findings:
        return _nothing_compared(dim, metrics, tables)
    else:
        notes.append("no floating-point input tensor in both splits to compare" if dim is not None
                     else "a custom split_fn layout: per-feature statistics not compared")
    status = max((f[0] for f in findings), key=lambda s: s.rank, default=Status.PASS)
    findings.sort(key=lambda f: -f[0].rank)
    alike = ["validation inputs are distributed like training inputs"] if df is not None else []
    if read_twice and not setup.eval_augmentation:
        alike.append("validation inputs are read deterministically" if not alike else "read deterministically")
    summary = "; ".join(f[1] for f in findings) if findings else " and ".join(alike) or "no difference found"
    if notes:
        summary += " (" + "; ".join(notes) + ")"
    return CheckResult(CHECK, status, summary, metrics, tables, [f[2] for f in findings])


def _nothing_compared(dim: int | None, metrics: dict, tables: dict) -> CheckResult:
    """SKIP: no floating-point input was compared between the splits nor read twice, so a PASS would say nothing."""
    why = ("a custom split_fn layout hides where samples sit, so per-feature statistics are not compared, and no "
           "floating-point input was read twice" if dim is None else
           "no floating-point input in the batches besides the label (only integer or boolean tensors, such as token "
           "ids or masks): per-feature statistics and repeated reads compare floating-point inputs only")
    return CheckResult(CHECK, Status.SKIP, f"nothing was compared: {why}", metrics, tables,
                       ["Nothing to fix. To have how evaluation data is prepared checked, give val_data whose batches "
                        "carry the floating-point inputs the model reads (features, pixels, embeddings)."])
