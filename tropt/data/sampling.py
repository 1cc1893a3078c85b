"""``data.sampling``: is the training order what the task needs? Read from the Setup's own loader, so the user's
sampler and collate are what is tested.

- *Class-sorted or unshuffled batches*: the class entropy of the first batches against what shuffling the split's
  label distribution would give (simulated with the same batch sizes). FAIL when most batches hold one class while
  shuffled batches of that data would rarely do so.
- *The same order every pass*: two passes over the loader, compared batch by batch. WARN (a ``DistributedSampler``
  whose ``set_epoch`` is never called, an unshuffled loader). A missing ``set_epoch`` is named only when calling it on
  a copy of the sampler changes the order (confirmed); otherwise the sampler that never reshuffles is named.
- *A tiny last batch* (<= 3 samples) with batch-dependent layers (BatchNorm): WARN with ``drop_last`` advice.
- *Sampler weights* that change the class balance: information, with the effective class distribution.

Cost: ``n_batches`` batches of two passes over the training loader (no model step), plus up to ``max_samples``
dataset items read one by one for the split's label distribution (none for a ``TensorDataset`` or a list of batches).
Labels follow the rule in :mod:`tropt.data.pipeline`.
"""

from __future__ import annotations

import copy
import itertools
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pandas as pd
import torch

from ..core.hashes import fingerprint
from ..core.modes import batch_dependent_layers
from ..registry import register
from ..result import CheckResult, Status
from ..snapshot import preserved
from .pipeline import class_labels, iter_pass, loader_state, sample_label, samples_in

if TYPE_CHECKING:
    from ..setup import Setup

CHECK = "data.sampling"


def _counts(values: np.ndarray, classes: np.ndarray) -> np.ndarray:
    """How often each of the sorted ``classes`` occurs in ``values`` (other values ignored)."""
    idx = np.searchsorted(classes, values)
    ok = idx < len(classes)
    ok[ok] = classes[idx[ok]] == values[ok]
    return np.bincount(idx[ok], minlength=len(classes)).astype(float)


def _entropy(counts: np.ndarray) -> float:
    p = counts[counts > 0] / max(counts.sum(), 1)
    return float(-(p * np.log(p)).sum())


def _samplers(loader: Any) -> list[Any]:
    out = []
    for attr in ("sampler", "batch_sampler"):
        obj = getattr(loader, attr, None)
        if obj is not None:
            out += [obj, getattr(obj, "sampler", None)]
    return [o for o in out if o is not None]


def _set_epoch_owner(loader: Any) -> Any:
    """The sampler with a ``set_epoch`` (DistributedSampler and friends), or None."""
    return next((s for s in _samplers(loader) if callable(getattr(s, "set_epoch", None))), None)


def _read(setup: Setup, loader: Any, limit: int) -> list[tuple[str, int, torch.Tensor | None, str]]:
    """Per batch of one pass (streamed, never held): its fingerprint, size, class labels (or None and why)."""
    out = []
    for batch in iter_pass(loader, limit, "train_data"):
        y, why = class_labels(batch)
        out.append((fingerprint(batch), samples_in(setup, batch), y, why))
    return out


def _last_batch(setup: Setup, loader: Any, read: list[tuple]) -> tuple[int | None, int | None, bool]:
    """(last batch size, full batch size, drop_last) of one pass, without loading samples where possible."""
    data = setup.train_data
    if isinstance(data, (list, tuple)):
        sizes = [samples_in(setup, b) for b in data]
        return sizes[-1], max(sizes), False
    if (isinstance(loader, torch.utils.data.DataLoader)
            and not isinstance(loader.dataset, torch.utils.data.IterableDataset)):
        bs, drop = loader.batch_size, bool(loader.drop_last)
        try:
            if bs is not None:
                n = len(cast(Any, loader.sampler))  # an iterable sampler's TypeError is caught below
                return (bs if drop or n % bs == 0 else n % bs), bs, drop
            # indices only: no sample is loaded (batch_sampler None: the TypeError is caught below)
            sizes = [len(ix) for ix in cast(Any, loader.batch_sampler)]
            return (sizes[-1], max(sizes), False) if sizes else (None, None, False)
        except TypeError:  # an iterable-style sampler without len
            pass
    if read and hasattr(loader, "__len__") and len(loader) == len(read):  # the pass read was complete
        sizes = [r[1] for r in read]
        return sizes[-1], max(sizes), False
    return None, None, False


def _dataset_labels(data: Any, loader: Any, max_samples: int,
                    seed: int) -> tuple[np.ndarray | None, np.ndarray | None, str]:
    """(labels, their dataset indices or None, how they were read) for the whole split, or (None, None, why not)."""
    if isinstance(data, (list, tuple)):
        ys = [class_labels(b)[0] for b in data]
        if any(y is None for y in ys):
            return None, None, ""
        return torch.cat(cast("list[torch.Tensor]", ys)).numpy(), None, "every batch of the list"
    ds = getattr(loader, "dataset", None)
    if ds is None or isinstance(ds, torch.utils.data.IterableDataset) or not hasattr(ds, "__getitem__"):
        return None, None, ""
    try:
        n = len(ds)
    except TypeError:
        return None, None, ""
    tensors: Any = getattr(ds, "tensors", None)
    if isinstance(ds, torch.utils.data.TensorDataset) and len(tensors) >= 2:
        y = tensors[1]
        if not (y.is_floating_point() or y.is_complex()) and y.ndim >= 1 and y[0].numel() == 1:
            return y.reshape(-1).long().cpu().numpy(), np.arange(n), "the TensorDataset's label tensor"
        return None, None, ""
    idx = (np.arange(n) if n <= max_samples
           else np.sort(np.random.default_rng(seed).choice(n, max_samples, replace=False)))
    labels = []
    for i in idx:
        y = sample_label(ds[int(i)])
        if y is None:
            return None, None, ""
        labels.append(y)
    how = "every dataset item" if n <= max_samples else f"{len(idx)} dataset items drawn at random (of {n})"
    return np.asarray(labels, dtype=np.int64), idx, how


def _shuffled_expectation(p: np.ndarray, sizes: list[int], seed: int,
                          draws: int = 200) -> tuple[np.ndarray, np.ndarray, float]:
    """Per batch (by its size): the mean and std of the class entropy of shuffled batches of the data (simulated), and
    the share of one-class batches shuffling gives."""
    rng = np.random.default_rng(seed)
    ent, sd, pure = [], [], []
    for n in sizes:
        counts = rng.multinomial(n, p, size=draws)
        e = np.array([_entropy(c) for c in counts])
        ent.append(e.mean())
        sd.append(e.std())
        pure.append(float(np.mean((counts > 0).sum(1) == 1)))
    return np.asarray(ent), np.asarray(sd), float(np.mean(pure))


class _Found:
    """What the check finds, part by part: metrics, tables, series, findings (status, sentence, advice) and notes."""

    def __init__(self, metrics: dict[str, Any]) -> None:
        self.metrics = metrics
        self.tables: dict[str, pd.DataFrame] = {}
        self.series: dict[str, Any] = {}
        self.findings: list[tuple[Status, str, str | None]] = []
        self.notes: list[str] = []


def _same_order(found: _Found, first: list, second: list, owner: Any, is_list: bool, per_pass: int | None) -> None:
    """The same batches in the same order in two passes: WARN, naming the missing set_epoch or shuffle."""
    if is_list:
        found.notes.append("a list of batches is read in its given order (the order across epochs is your loop's)")
        return
    if per_pass == 1:
        found.notes.append("one batch per pass: the order does not matter")
        return
    a, b = [r[0] for r in first], [r[0] for r in second]
    m = min(len(a), len(b))
    same = a[:m] == b[:m]
    found.metrics["same_order_every_pass"] = bool(same)
    found.tables["order"] = pd.DataFrame({"batch": np.arange(m), "first_pass": [h[:12] for h in a[:m]],
                                          "second_pass": [h[:12] for h in b[:m]],
                                          "same": [x == y for x, y in zip(a[:m], b[:m])]})
    if same:
        if owner is not None:
            why, advice = _set_epoch_cause(found, owner)
        else:
            advice = ("Shuffle every epoch: DataLoader(..., shuffle=True), "
                      "or a sampler that draws a new order each pass.")
            why = "the loader does not reshuffle"
        found.findings.append((Status.WARN, f"the same batches in the same order in two passes ({m} batches compared): "
                               f"{why}", advice))


def _epoch_orders_differ(owner: Any, limit: int = 100_000) -> bool | None:
    """Call ``set_epoch`` on a copy of the sampler for two consecutive epochs: do its orders (the first ``limit``
    indices) differ? None when the copy cannot be made or iterated. The user's sampler, its generator and the global
    RNG are untouched: a shallow copy with its generators cloned, inside :func:`tropt.snapshot.preserved`."""
    try:
        with preserved():
            twin = copy.copy(owner)
            for name, value in vars(twin).items():
                if isinstance(value, torch.Generator):  # shared by a shallow copy: iterating would advance the user's
                    clone = torch.Generator(device=value.device)
                    clone.set_state(value.get_state())
                    setattr(twin, name, clone)
            epoch = int(getattr(owner, "epoch", 0) or 0)
            orders = []
            for e in (epoch, epoch + 1):
                twin.set_epoch(e)
                orders.append(list(itertools.islice(iter(twin), limit)))
    except Exception:  # noqa: BLE001 - a sampler that cannot be copied or iterated alone: not confirmed
        return None
    return orders[0] != orders[1]


def _set_epoch_cause(found: _Found, owner: Any) -> tuple[str, str]:
    """(why, advice) for the same order every pass with a sampler that has ``set_epoch``: the missing call is named
    only when calling it on a copy of the sampler changes the order (confirmed)."""
    name = type(owner).__name__
    differs = _epoch_orders_differ(owner)
    found.metrics["confirmed"] = bool(differs)
    if differs:
        found.metrics.update(cause="set_epoch_not_called",
                             confirmation=f"confirmed: with {name}.set_epoch(epoch + 1) on a copy of the sampler the "
                                          "order changes between epochs")
        return (f"the {name}'s set_epoch is never called between passes; {found.metrics['confirmation']}",
                f"Call {name}.set_epoch(epoch) at the start of every epoch: it reshuffles only when its epoch changes. "
                "If your loop already does, pass set_epoch=True to check_sampling.")
    if differs is None:
        found.metrics.update(cause="unnamed", confirmation="not confirmed: a copy of the sampler could not be made "
                                                            "to call set_epoch on")
        return (f"the order never changes, cause not isolated: {name}.set_epoch may never be called between passes "
                f"({found.metrics['confirmation']})",
                f"Call {name}.set_epoch(epoch) at the start of every epoch, and make sure the sampler shuffles.")
    shuffle = getattr(owner, "shuffle", None)
    found.metrics.update(cause="no_shuffle", confirmation=f"not confirmed: with {name}.set_epoch(epoch + 1) on a copy "
                                                          "of the sampler the order stays the same")
    return (f"the {name} gives the same order in every epoch"
            + (" (shuffle=False)" if shuffle is False else "") + f"; a missing set_epoch is not the cause "
            f"({found.metrics['confirmation']})",
            f"Shuffle the training order: {name}(..., shuffle=True)" + (", and call set_epoch(epoch) every epoch"
                                                                       if shuffle is False else
                                                                       "; a sampler whose order ignores its epoch "
                                                                       "never reshuffles"))


def _tiny_last_batch(found: _Found, model: Any, last: int | None, full: int | None, drop_last: bool,
                     tiny_last: int) -> None:
    """A last batch of at most ``tiny_last`` samples beside batch-dependent layers (BatchNorm): WARN."""
    layers = batch_dependent_layers(model)
    found.metrics.update(last_batch_size=last if last is not None else "unknown",
                         batch_size=full if full is not None else "unknown",
                         drop_last=drop_last, batch_dependent_layers=len(layers))
    if last is not None and full is not None and layers and not drop_last and last <= tiny_last and last < full:
        effect = ("BatchNorm raises on a batch of 1 in training" if last == 1
                  else "BatchNorm's batch statistics are noise at this size")
        named = ", ".join(repr(n) for n in layers[:3]) + ("..." if len(layers) > 3 else "")
        found.findings.append((Status.WARN, f"the last batch of every epoch holds {last} sample(s) of {full} and the "
                               f"model has batch-dependent layers ({named}): {effect}",
                               "Pass drop_last=True to the training DataLoader "
                               "(or choose a batch size that divides the data)."))


def _batch_classes(ys: list, classes: np.ndarray) -> pd.DataFrame:
    """Per batch read: its size, classes, dominant class and share, and class entropy."""
    rows = []
    for i, (y, _) in enumerate(ys):
        c = _counts(y.numpy(), classes)
        top = int(c.argmax()) if c.sum() else 0
        rows.append({"batch": i, "size": int(y.numel()), "classes": int((c > 0).sum()),
                     "dominant_class": int(classes[top]) if len(classes) else -1,
                     "dominant_share": float(c[top] / max(c.sum(), 1)), "entropy": _entropy(c)})
    return pd.DataFrame(rows)


def _effective(loader: Any, seen: np.ndarray, classes: np.ndarray, y_data: np.ndarray | None,
               y_index: np.ndarray | None) -> tuple[np.ndarray, str, Any]:
    """(the class distribution the loader samples, where it was read from, the WeightedRandomSampler or None)."""
    sampled = _counts(seen, classes)
    effective, eff_how = sampled / max(sampled.sum(), 1), "the batches read"
    weighted = next((s for s in _samplers(loader) if isinstance(s, torch.utils.data.WeightedRandomSampler)), None)
    if weighted is not None and y_index is not None:
        w = torch.as_tensor(weighted.weights, dtype=torch.double).numpy()
        if len(w) > int(y_index.max()):
            ww = w[y_index]
            effective = np.array([ww[y_data == c].sum() for c in classes]) / max(ww.sum(), 1e-300)
            eff_how = "the sampler's weights"
    return effective, eff_how, weighted


def _class_mix(found: _Found, loader: Any, first: list, y_data: np.ndarray | None, y_index: np.ndarray | None,
               how: str, seed: int, fail_one_class: float, warn_entropy_ratio: float) -> str | None:
    """The class mix of the batches read against shuffled batches of the same data; returns why it could not be
    checked (None when it was)."""
    ys = [(r[2], r[3]) for r in first]
    missing = next((why for y, why in ys if y is None), None)
    if missing is None:
        sizes = [int(y.numel()) for y, _ in ys]
        seen = torch.cat([y for y, _ in ys]).numpy()
        source = y_data if y_data is not None else seen
        classes = np.unique(np.concatenate([source, seen]))
        classes = classes[classes >= 0]  # -100 and friends are "ignore" markers, not classes
        if len(classes) == 0:
            missing = "every label is negative (ignore markers such as -100): there are no classes to mix"
    if missing is not None:
        found.metrics["labels"] = "not found"
        return missing
    data_counts = _counts(source, classes)
    p = data_counts / max(data_counts.sum(), 1)
    batches = _batch_classes(ys, classes)
    expected, spread, expected_pure = _shuffled_expectation(p, sizes, seed)
    batches["shuffled_entropy"] = expected
    found.tables["batches"] = batches
    found.series.update(batch_entropy=batches["entropy"].to_numpy(), shuffled_entropy=expected)
    one_class = float((batches["classes"] == 1).mean())
    ratio = float(batches["entropy"].mean() / expected.mean()) if expected.mean() > 0 else 1.0
    # How far below shuffling the mean entropy is, in standard errors of a mean of that many shuffled batches.
    se = float(np.sqrt((spread ** 2).sum())) / len(spread)
    deficit_z = float((expected.mean() - batches["entropy"].mean()) / se) if se > 0 else 0.0
    found.metrics.update(classes=len(classes), data_entropy=_entropy(data_counts),
                         mean_batch_entropy=float(batches["entropy"].mean()),
                         shuffled_batch_entropy=float(expected.mean()), entropy_ratio=ratio,
                         one_class_batches=one_class,
                         shuffled_one_class_batches=expected_pure, entropy_deficit_z=deficit_z,
                         label_source=how or "the batches read")
    effective, eff_how, weighted = _effective(loader, seen, classes, y_data, y_index)
    found.tables["class_distribution"] = pd.DataFrame({"class": classes, "data_share": p, "sampled_share": effective})
    if len(classes) >= 2 and len(first) >= 2 and one_class >= fail_one_class and expected_pure <= 0.1:
        found.findings.append((Status.FAIL, f"{one_class:.0%} of the first {len(first)} batches hold a single class "
                               f"while the data has {len(classes)} classes (shuffled batches would: "
                               f"{expected_pure:.0%}); the loader is sorted by class or not shuffled",
                               "Shuffle the training data: DataLoader(..., shuffle=True) or a RandomSampler; one-class "
                               "batches push every step towards that class."))
    elif len(classes) >= 2 and len(first) >= 3 and ratio < warn_entropy_ratio and deficit_z >= 4:
        found.findings.append((Status.WARN, f"the batches mix classes far less than shuffling would (mean class "
                               f"entropy {ratio:.0%} of a shuffled batch's): the data is partly ordered by class",
                               "Shuffle the training data: DataLoader(..., shuffle=True)."))
    tv = float(0.5 * np.abs(effective - p).sum())
    found.metrics["sampled_vs_data_tv"] = tv
    if weighted is not None and tv > 0.05:
        def show(q: np.ndarray) -> str:
            return "/".join(f"{x:.0%}" for x in q[:6]) + ("/..." if len(q) > 6 else "")

        found.notes.append(f"the sampler's weights change the class balance: data {show(p)} -> sampled "
                           f"{show(effective)} (classes {', '.join(str(c) for c in classes[:6])}; from {eff_how})")
    return None


def _verdict(found: _Found, missing: str | None, is_list: bool, per_pass: int | None) -> tuple[Status, str, list[str]]:
    findings, notes, metrics = found.findings, found.notes, found.metrics
    status = max((f[0] for f in findings), key=lambda s: s.rank, default=Status.PASS)
    if status is Status.PASS and missing is not None:
        status = Status.SKIP
    elif missing is not None:
        notes.append(f"class mix not checked: {missing}")
    if findings:
        summary = "; ".join(f[1] for f in sorted(findings, key=lambda f: -f[0].rank))
    elif status is Status.SKIP:
        summary = f"class mix of the batches not checked: {missing}" + (
            "; the order changes between passes" if metrics.get("same_order_every_pass") is False else "")
    else:
        summary = "the batches mix classes as shuffled batches would" + (
            "" if is_list or per_pass == 1 else " and the order changes between passes")
    if notes:
        summary += " (" + "; ".join(notes) + ")"
    advice = [f[2] for f in sorted(findings, key=lambda f: -f[0].rank) if f[2]]
    return status, summary, advice


@register(CHECK, title="Training order and sampling",
          description="class mix of the first batches vs shuffling, a new order every pass, "
                      "tiny last batch with BatchNorm, sampler weights",
          plot="tropt.plots.contract")
def check_sampling(setup: Setup, *, n_batches: int = 20, max_samples: int = 2000, fail_one_class: float = 0.5,
                   warn_entropy_ratio: float = 0.5, tiny_last: int = 3, set_epoch: bool = False,
                   progress: bool = True) -> CheckResult:
    """Check the order and class mix of the batches the Setup's training loader yields.

    Parameters
    ----------
    setup
        The :class:`tropt.Setup`; its ``train_data`` is read as the user's loop reads it (sampler and collate).
    n_batches
        Batches read from each of two passes (the cost: 2 x ``n_batches`` batches, no model step).
    max_samples
        Dataset items read for the split's label distribution when it has no label tensor to read at once.
    fail_one_class
        FAIL when at least this share of the batches read holds a single class while shuffled batches of the same
        data would do so at most a tenth of the time.
    warn_entropy_ratio
        WARN when the batches' mean class entropy is below this fraction of what shuffling would give.
    tiny_last
        WARN when the last batch holds at most this many samples (and fewer than a full batch) while the model has
        batch-dependent layers and ``drop_last`` is off.
    set_epoch
        Your loop calls ``sampler.set_epoch(epoch)`` every epoch: the check calls it between its two passes too.
    progress
        Unused (the check is quick); accepted for uniformity.
    """
    data = setup.train_data
    is_list = isinstance(data, (list, tuple))
    loader = setup.loader("train")
    owner = _set_epoch_owner(loader)
    with preserved(), loader_state(loader, setup.seed):
        first = _read(setup, loader, n_batches)
        if set_epoch and owner is not None:
            owner.set_epoch(getattr(owner, "epoch", 0) + 1)
        second = [] if is_list else _read(setup, loader, n_batches)
        last, full, drop_last = _last_batch(setup, loader, first)
        y_data, y_index, how = _dataset_labels(data, loader, max_samples, setup.seed)
    found = _Found({"batches_read": len(first),
                    "sampler": type(_samplers(loader)[0]).__name__ if _samplers(loader) else type(data).__name__})
    try:
        per_pass = len(loader)
    except TypeError:
        per_pass = None
    _same_order(found, first, second, owner, is_list, per_pass)
    _tiny_last_batch(found, setup.model, last, full, drop_last, tiny_last)
    missing = _class_mix(found, loader, first, y_data, y_index, how, setup.seed, fail_one_class, warn_entropy_ratio)
    status, summary, advice = _verdict(found, missing, is_list, per_pass)
    return CheckResult(CHECK, status, summary, found.metrics, found.tables, advice, found.series)
