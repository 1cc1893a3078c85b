"""dynamics.loss_curve on curves a user already has: synthetic curves of every class, every input format."""

from __future__ import annotations

import struct

import numpy as np
import pandas as pd
import pytest

import curve_factory as cf
from tropt.dynamics import diagnose_curves, read_tensorboard
from tropt.errors import TroptError
from tropt.result import CheckResult, Status


@pytest.mark.parametrize("name", list(cf.CASES))
@pytest.mark.parametrize("n", [300, 5000])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_each_class_is_classified(name, n, seed):
    r = diagnose_curves(cf.CASES[name](n, seed))
    assert r.check == "dynamics.loss_curve"
    assert r.metrics["class"] == name
    assert r.metrics["classes"] == name  # and nothing else is flagged
    expected = {"healthy": Status.PASS, "flat": Status.FAIL, "diverging": Status.FAIL, "non_finite": Status.FAIL}
    assert r.status == expected.get(name, Status.WARN)
    if name != "healthy":
        assert r.advice and r.tables["findings"]["flagged"].any()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_fall_inside_the_first_tenth_is_not_flat_but_heavy_noise_alone_is(seed):
    """A loss that halves in its first ~40 of 300 steps and then sits at a noisy floor (like a small regression
    problem) fell; the same noise around a constant did not."""
    assert diagnose_curves(cf.fast_fall_then_floor(300, seed)).metrics["class"] == "healthy"
    assert diagnose_curves(cf.flat_noisy(300, seed)).metrics["class"] == "flat"


def test_healthy_curve_is_not_flagged_even_with_validation():
    y = cf.healthy(2000, 3)
    vt = np.linspace(0, 1999, 30)
    r = diagnose_curves(y, val=0.4 + 2.0 * np.exp(-vt / (2000 / 12)), val_steps=vt)
    assert r.status == Status.PASS and r.advice == []


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_overfitting_reports_the_best_step(seed):
    train, vt, val = cf.overfitting(2000, seed)
    r = diagnose_curves(train, val=val, val_steps=vt)
    assert r.status == Status.WARN and r.metrics["class"] == "overfitting"
    best = r.metrics["val_best_step"]
    assert 0.3 * 2000 <= best <= 0.5 * 2000  # the validation minimum was built at 40% of the run
    assert any(f"stop at step {round(best)}" in a for a in r.advice)


def test_non_finite_names_the_first_bad_step_and_diverging_advice_names_a_clip_value():
    y = cf.non_finite(1000)
    norms = np.linspace(1, 10, 1000)
    r = diagnose_curves(y, grad_norms=norms)
    assert r.metrics["first_non_finite_step"] == 700
    assert any("Clip gradients at about" in a and f"{np.percentile(norms, 90):.3g}" in a for a in r.advice)
    assert "non_finite_steps" in r.tables


def test_spikes_are_listed_as_evidence():
    r = diagnose_curves(cf.unstable(2000))
    assert r.metrics["spikes"] == 3
    assert sorted(r.tables["spikes"]["step"].astype(int)) == [600, 1100, 1600]


def test_losses_that_go_negative_still_classify():
    y = cf.healthy(2000) - 1.0  # a negative log-likelihood can be below zero
    assert diagnose_curves(y).metrics["class"] == "healthy"
    assert diagnose_curves(cf.flat(2000) - 3.0).metrics["class"] == "flat"


def test_dataframe_csv_and_lightning_csvlogger(tmp_path):
    train, vt, val = cf.overfitting(1000, 0, evals=20)
    steps = np.arange(1000)
    # Lightning CSVLogger: sparse rows, one metric per row
    rows = [{"epoch": s // 100, "step": s, "train_loss": v, "val_loss": np.nan} for s, v in zip(steps, train)]
    rows += [{"epoch": int(s) // 100, "step": int(s), "train_loss": np.nan, "val_loss": v} for s, v in zip(vt, val)]
    df = pd.DataFrame(rows)
    path = tmp_path / "metrics.csv"
    df.to_csv(path, index=False)
    for source in (df, str(path)):
        r = diagnose_curves(source)
        assert r.metrics["class"] == "overfitting", source
        assert r.metrics["points"] == 1000 and r.metrics["val_points"] == 20
    # a plain DataFrame with step + loss, and a Series whose index is the step
    plain = pd.DataFrame({"step": steps * 10, "loss": cf.flat(1000)})
    r = diagnose_curves(plain)
    assert r.metrics["class"] == "flat" and r.metrics["last_step"] == 9990
    assert diagnose_curves(pd.Series(cf.healthy(500), index=np.arange(500) * 2)).metrics["last_step"] == 998


def test_hugging_face_log_history_with_its_final_summary_row():
    # pd.DataFrame(trainer.state.log_history): logging rows (loss, learning_rate, epoch, step), eval rows (eval_loss)
    # and one final summary row whose train_loss is a single number, not the curve.
    train, vt, val = cf.overfitting(200, 0, evals=10)
    rows = []
    evals = dict(zip((int(s) for s in vt), val))
    for s, v in enumerate(train):
        rows.append({"loss": v, "grad_norm": 1.0, "learning_rate": 5e-5, "epoch": s / 100, "step": s})
        if s in evals:
            rows.append({"eval_loss": evals[s], "eval_runtime": 3.2, "epoch": s / 100, "step": s})
    rows.append({"train_runtime": 512.3, "train_samples_per_second": 62.4, "total_flos": 1.2e15,
                 "train_loss": 0.61, "epoch": 2.0, "step": 200})
    r = diagnose_curves(pd.DataFrame(rows))
    assert r.metrics["points"] == 200 and r.metrics["val_points"] == len(evals)
    assert r.metrics["class"] == "overfitting"


def test_nan_losses_in_tables_and_series_fail_like_in_an_array(tmp_path):
    """A logger writes NaN once training blows up: every input form must find it (a dropna hid it, leaving a
    curve that "was still improving"); only rows that log another metric (Lightning's sparse rows) are dropped."""
    y = cf.non_finite(1000)  # NaN from step 700 on
    steps = np.arange(1000)
    plain = pd.DataFrame({"step": steps, "loss": y})
    path = tmp_path / "nan_tail.csv"
    plain.to_csv(path, index=False)
    wide = plain.assign(lr=1e-3, train_acc=np.linspace(0.3, 0.9, 1000), val_acc=np.linspace(0.3, 0.8, 1000))
    tb = pd.DataFrame({"Wall time": steps * 1.0, "Step": steps, "Value": y})
    listed = [None if np.isnan(v) else float(v) for v in y]
    for name, source in [("array", y), ("list with None", listed), ("Series", pd.Series(y)), ("DataFrame", plain),
                         ("CSV", str(path)), ("wide DataFrame", wide), ("TensorBoard CSV", tb)]:
        r = diagnose_curves(source)
        assert r.status == Status.FAIL and r.metrics["class"] == "non_finite", (name, r.summary)
        assert r.metrics["first_non_finite_step"] == 700 and r.metrics["non_finite"] == 300, name
        assert r.metrics["points"] == 1000, name
    # Lightning CSVLogger: sparse validation rows leave the training loss empty; they are not NaN losses
    vt = np.arange(99, 1000, 100)
    rows = [{"epoch": s // 100, "step": s, "train_loss": v, "val_loss": np.nan} for s, v in zip(steps, y)]
    rows += [{"epoch": s // 100, "step": s, "train_loss": np.nan, "val_loss": 1.0} for s in vt]
    sparse = pd.DataFrame(rows)
    r = diagnose_curves(sparse)
    assert r.metrics["class"] == "non_finite" and r.metrics["first_non_finite_step"] == 700
    assert r.metrics["points"] == 1000 and r.metrics["non_finite"] == 300 and r.metrics["val_points"] == 10
    healthy_sparse = sparse.assign(train_loss=np.r_[cf.healthy(1000), np.full(vt.size, np.nan)])
    assert diagnose_curves(healthy_sparse).metrics["non_finite"] == 0


def test_tensorboard_csv_export(tmp_path):
    y = cf.diverging(800)
    tb = pd.DataFrame({"Wall time": np.arange(800.0), "Step": np.arange(800) * 5, "Value": y})
    path = tmp_path / "run-train-tag-loss.csv"
    tb.to_csv(path, index=False)
    r = diagnose_curves(str(path))
    assert r.metrics["class"] == "diverging" and r.metrics["last_step"] == 3995


def _varint(v: int) -> bytes:
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def _field(num: int, wt: int, payload: bytes) -> bytes:
    key = _varint(num << 3 | wt)
    return key + (_varint(len(payload)) + payload if wt == 2 else payload)


def _event(step: int, tag: str, value: float, tensor: bool = False) -> bytes:
    if tensor:  # TF2 style: a one-element TensorProto (dtype DT_FLOAT, packed float_val)
        proto = _field(1, 0, _varint(1)) + _field(5, 2, struct.pack("<f", value))
        val = _field(1, 2, tag.encode()) + _field(8, 2, proto)
    else:  # torch.utils.tensorboard style: simple_value
        val = _field(1, 2, tag.encode()) + _field(2, 5, struct.pack("<f", value))
    summary = _field(1, 2, val)
    return _field(1, 1, struct.pack("<d", 1.0)) + _field(2, 0, _varint(step)) + _field(5, 2, summary)


def _crc(data: bytes) -> bytes:
    """The TFRecord masked CRC32C (tensorboard's reader checks it; without tensorboard the fallback ignores it)."""
    try:
        from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
    except ImportError:
        return b"\0" * 4
    return struct.pack("<I", masked_crc32c(data))


def _write_events(path, events):
    header = _field(1, 1, struct.pack("<d", 1.0)) + _field(3, 2, b"brain.Event:2")
    with open(path, "wb") as fh:
        for e in [header, *events]:
            n = struct.pack("<Q", len(e))
            fh.write(n + _crc(n) + e + _crc(e))


def test_tensorboard_event_files(tmp_path):
    train, vt, val = cf.overfitting(600, 1, evals=15)
    events = [_event(i, "train/loss", float(v)) for i, v in enumerate(train)]
    events += [_event(int(s), "val/loss", float(v), tensor=True) for s, v in zip(vt, val)]
    run = tmp_path / "run1"
    run.mkdir()
    _write_events(run / "events.out.tfevents.123.host", events)
    curves = read_tensorboard(run)
    assert set(curves) == {"train/loss", "val/loss"}
    assert np.allclose(curves["train/loss"][1], train, rtol=1e-6)
    r = diagnose_curves(str(run))
    assert r.metrics["class"] == "overfitting" and r.metrics["val_points"] == 15


def test_bad_inputs_say_how_to_fix():
    with pytest.raises(TroptError, match="at least"):
        diagnose_curves([1.0, 0.9, 0.8])
    with pytest.raises(TroptError, match="training loss"):
        diagnose_curves(pd.DataFrame({"a": [1.0] * 20, "b": [2.0] * 20}))
    with pytest.raises(TroptError, match="does not exist"):
        diagnose_curves("/nonexistent/metrics.csv")
    with pytest.raises(TroptError, match="steps has"):
        diagnose_curves(np.ones(20), steps=np.arange(10))


def test_a_lone_column_not_named_like_a_loss_is_not_read_as_one():
    """An accuracy column rises: read as a loss it was judged "diverging". Only a name that says loss is guessed."""
    steps = np.arange(500)
    with pytest.raises(TroptError, match=r"training loss.*'acc'.*diagnose_curves\(df\['my_loss'\]\)"):
        diagnose_curves(pd.DataFrame({"step": steps, "acc": np.linspace(0.2, 0.9, 500)}))
    y = cf.healthy(500)
    for df in (pd.DataFrame({"step": steps, "my_loss": y}), pd.DataFrame({"step": steps, "val_nll": y}),
               pd.DataFrame(y), pd.DataFrame({"step": steps, "loss": y, "acc": np.linspace(0.2, 0.9, 500)})):
        assert diagnose_curves(df).metrics["class"] == "healthy", list(df.columns)


def test_summaries_read_well():
    """No label repeated as its own evidence, and counts agree with their nouns."""
    r = diagnose_curves(cf.still_improving(2000))
    assert r.summary.startswith("still improving at the end: the loss fell a further ") and r.summary.count("still improving") == 1
    assert r.summary.endswith("% over the last tenth of the run"), r.summary
    one_spike = cf.healthy(2000)
    one_spike[1000:1003] *= 4.0
    assert "1 loss spike (" in diagnose_curves(one_spike).summary
    assert "3 loss spikes (" in diagnose_curves(cf.unstable(2000)).summary
    one_nan = cf.healthy(500)
    one_nan[-1] = np.nan
    assert "(1 non-finite value)" in diagnose_curves(one_nan).summary


def test_both_dynamics_checks_are_exported():
    import tropt.dynamics as dynamics

    assert {"check_loss_curve", "check_lr_range"} <= set(dynamics.__all__)
    assert dynamics.check_lr_range.__module__ == "tropt.dynamics.lr_range"


def test_json_round_trip_and_plot():
    import matplotlib.pyplot as plt

    train, vt, val = cf.overfitting(1000, 0)
    for r in (diagnose_curves(train, val=val, val_steps=vt), diagnose_curves(cf.unstable(1000)), diagnose_curves(cf.non_finite(500))):
        back = CheckResult.from_dict(r.to_dict())
        assert back.status == r.status and back.metrics["class"] == r.metrics["class"]
        for res in (r, back):
            ax = res.plot()
            assert ax.get_title(loc="left").startswith("dynamics.loss_curve")
            plt.close(ax.figure)


def test_logged_warm_restarts_are_explained_by_the_logged_learning_rate():
    """An SGDR run's log: the loss jumps right after each restart. Without the learning rates that reads as
    instability; with ``lrs=`` (the logged lr column) the jumps are listed against the restarts and not counted."""
    rng = np.random.default_rng(0)
    t = np.arange(600)
    phase = t % 150
    lr = 0.5 * (1 + np.cos(np.pi * phase / 150)) * 0.1
    # lr[i] is used by the step after loss[i]: the jump shows from the first loss after a restart on
    jump = np.where((t >= 150) & (phase >= 1), np.exp(-(phase - 1) / 3.0), 0.0)
    loss = (0.3 + 1.5 * np.exp(-t / 200)) * (1 + 0.8 * jump) * np.exp(rng.normal(0, 0.03, t.size))
    plain = diagnose_curves(loss)
    assert "unstable" in plain.metrics["classes"], plain.summary
    logged = diagnose_curves(pd.DataFrame({"step": t, "loss": loss}), lrs=lr)
    assert "unstable" not in logged.metrics["classes"] and logged.metrics["spikes_after_lr_increase"] == 3, logged.summary
