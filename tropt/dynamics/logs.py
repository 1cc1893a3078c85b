"""Read loss curves a user already has: arrays, Series, DataFrames, CSV files (including TensorBoard's "Download
CSV" export and Lightning's ``CSVLogger`` ``metrics.csv``), TensorBoard event files or log directories, MLflow runs
and W&B offline runs.

TensorBoard event files are read with tensorboard's own ``EventAccumulator`` when tensorboard is installed (it is
wherever such logs are written); without it a small fallback parses the TFRecord framing and the few protobuf
fields scalars use (tested against ``EventAccumulator`` on the same files). MLflow runs are read with
``MlflowClient.get_metric_history``; W&B offline runs (``wandb/offline-run-*/run-*.wandb``) with W&B's own protobuf
``Record`` messages, framed as its transaction log writes them (wandb ships no Python reader for that file).
"""

from __future__ import annotations

import os
import struct
from typing import Any

import numpy as np
import pandas as pd

from ..errors import TroptError

TRAIN_NAMES = ("train_loss_step", "train_loss", "train/loss", "loss/train", "training_loss", "train_loss_epoch", "loss")
VAL_NAMES = ("val_loss", "val/loss", "loss/val", "valid_loss", "validation_loss", "val_loss_epoch", "eval_loss",
             "eval/loss")
# a lone column named so is a loss
LOSS_WORDS = ("loss", "nll", "mse", "mae", "rmse", "xent", "cross_entropy", "crossentropy")
STEP_NAMES = ("step", "Step", "global_step", "iteration", "iter", "epoch")

Curve = tuple[np.ndarray | None, np.ndarray]  # (steps or None, values)


# ---------------------------------------------------------------------------------------------- TensorBoard events
def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, i
        shift += 7


def _fields(buf: bytes):
    """Yield (field_number, wire_type, value) of one protobuf message (value: int, or bytes for len/fixed)."""
    i, n = 0, len(buf)
    val: int | bytes
    while i < n:
        key, i = _varint(buf, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            val, i = _varint(buf, i)
        elif wt == 1:
            val, i = buf[i:i + 8], i + 8
        elif wt == 2:
            ln, i = _varint(buf, i)
            val, i = buf[i:i + ln], i + ln
        elif wt == 5:
            val, i = buf[i:i + 4], i + 4
        else:  # groups (3/4) are not used by event files
            return
        yield num, wt, val


def _tensor_scalar(buf: bytes) -> float | None:
    """The single number in a TensorProto (float_val, double_val or tensor_content of DT_FLOAT/DT_DOUBLE)."""
    dtype, content, vals = 1, None, []
    for num, wt, val in _fields(buf):
        if num == 1 and wt == 0:
            dtype = val
        elif num == 4 and wt == 2:
            content = val
        elif num == 5:  # float_val: packed (wt 2) or not (wt 5)
            vals += list(struct.unpack(f"<{len(val) // 4}f", val))
        elif num == 6:  # double_val
            vals += list(struct.unpack(f"<{len(val) // 8}d", val))
    if vals:
        return float(vals[0]) if len(vals) == 1 else None
    if content is not None:
        fmt = {1: "f", 2: "d"}.get(dtype)
        size = {1: 4, 2: 8}.get(dtype, 0)
        if fmt and len(content) == size:
            return float(struct.unpack(f"<{fmt}", content)[0])
    return None


def _event_files(path: str) -> list[str]:
    if os.path.isdir(path):
        files = []
        for root, _, names in os.walk(path):
            files += sorted(os.path.join(root, f) for f in names if "tfevents" in f)
        if not files:
            raise TroptError(f"no TensorBoard event files (*tfevents*) under {path}",
                             "point at the run's log directory or an events file")
        return files
    return [path]


def read_tensorboard(path: str | os.PathLike, *, engine: str = "auto") -> dict[str, Curve]:
    """Scalars of a TensorBoard event file, or of every event file under a log directory: ``{tag: (steps, values)}``.

    Scalar values are ``simple_value`` summaries (``torch.utils.tensorboard``) and one-element float tensors (TF2's
    ``tf.summary.scalar``); histograms, images and text are not curves. ``engine``: ``"tensorboard"`` (tensorboard's
    ``EventAccumulator``), ``"builtin"`` (the fallback parser) or ``"auto"`` (tensorboard when installed). Every
    event is kept, also steps written again after a restart (sorted by step; ``diagnose_curves`` reads them as a
    resumed run), so both engines give the same curves.
    """
    if engine not in ("auto", "tensorboard", "builtin"):
        raise TroptError(f"read_tensorboard: engine={engine!r}", "use 'auto', 'tensorboard' or 'builtin'")
    path = os.fspath(path)
    files = _event_files(path)
    out: dict[str, list[tuple[int, float]]] = {}
    use_tb = engine == "tensorboard"
    if engine == "auto":
        try:
            import tensorboard.backend.event_processing.event_accumulator  # noqa: F401

            use_tb = True
        except ImportError:
            use_tb = False
    for f in files:
        (_read_events_tensorboard if use_tb else _read_events_builtin)(f, out)
    if not out:
        raise TroptError(f"{path}: no scalar summaries found in the TensorBoard event file(s)",
                         "log the loss with SummaryWriter.add_scalar('train/loss', loss, step)")
    return _sorted_curves(out)


def _sorted_curves(out: dict[str, list[tuple[int, float]]]) -> dict[str, Curve]:
    curves = {}
    for tag, pairs in out.items():
        arr = np.asarray(pairs, dtype=np.float64).reshape(-1, 2)
        order = np.argsort(arr[:, 0], kind="stable")
        curves[tag] = (arr[order, 0], arr[order, 1])
    return curves


def _read_events_tensorboard(f: str, out: dict[str, list[tuple[int, float]]]) -> None:
    """One event file through tensorboard's ``EventAccumulator`` (every event kept: no sampling, no purging)."""
    from tensorboard.backend.event_processing import event_accumulator as ea
    from tensorboard.util import tensor_util

    acc = ea.EventAccumulator(f, size_guidance={ea.SCALARS: 0, ea.TENSORS: 0, ea.HISTOGRAMS: 1, ea.IMAGES: 1,
                                                ea.AUDIO: 1, ea.COMPRESSED_HISTOGRAMS: 1},
                              purge_orphaned_data=False)
    acc.Reload()
    tags = acc.Tags()
    for tag in tags.get(ea.SCALARS, []):
        out.setdefault(tag, []).extend((int(e.step), float(e.value)) for e in acc.Scalars(tag))
    for tag in tags.get(ea.TENSORS, []):
        for e in acc.Tensors(tag):
            if e.tensor_proto.dtype not in (1, 2):  # DT_FLOAT, DT_DOUBLE: text and other plugins are not curves
                continue
            arr = tensor_util.make_ndarray(e.tensor_proto)
            if arr.size == 1:
                out.setdefault(tag, []).append((int(e.step), float(arr.reshape(-1)[0])))


def read_tensorboard_builtin(path: str | os.PathLike) -> dict[str, Curve]:
    """The fallback reader alone (no tensorboard needed): the same ``{tag: (steps, values)}`` as
    :func:`read_tensorboard`."""
    return read_tensorboard(path, engine="builtin")


def _read_events_builtin(f: str, out: dict[str, list[tuple[int, float]]]) -> None:
    """Reads the TFRecord framing (length, crc, payload, crc) without checking CRCs, and the ``Event`` fields
    step/summary; values from ``simple_value`` or a one-element float/double tensor."""
    with open(f, "rb") as fh:
        data = fh.read()
    i = 0
    while i + 12 <= len(data):
        (length,) = struct.unpack_from("<Q", data, i)
        i += 12  # length + its crc
        payload = data[i:i + length]
        i += length + 4  # payload + its crc
        if len(payload) < length:
            break  # truncated last record (a run still writing)
        step = 0
        for num, wt, val in _fields(payload):
            if num == 2 and wt == 0:
                step = val if val < (1 << 63) else val - (1 << 64)
            elif num == 5 and wt == 2:
                for snum, swt, sval in _fields(val):
                    if snum != 1 or swt != 2:
                        continue
                    tag, value = None, None
                    for vnum, vwt, vval in _fields(sval):
                        if vnum == 1 and vwt == 2:
                            tag = vval.decode("utf-8", "replace")
                        elif vnum == 2 and vwt == 5:
                            value = struct.unpack("<f", vval)[0]
                        elif vnum == 8 and vwt == 2 and value is None:
                            value = _tensor_scalar(vval)
                    if tag is not None and value is not None:
                        out.setdefault(tag, []).append((step, float(value)))


# ---------------------------------------------------------------------------------------------- MLflow
def read_mlflow(run: Any = None, *, experiment: str | None = None, tracking_uri: str | None = None) -> dict[str, Curve]:
    """Every metric of an MLflow run as ``{key: (steps, values)}`` (``MlflowClient.get_metric_history``).

    ``run``: a run id, ``"runs:/<id>"``, an ``mlflow.entities.Run`` or ``ActiveRun``; or None with ``experiment``
    (a name): that experiment's latest run (``MlflowClient.search_runs``). ``tracking_uri`` defaults to MLflow's own
    (``MLFLOW_TRACKING_URI`` / ``mlflow.set_tracking_uri``).
    """
    try:
        from mlflow.tracking import MlflowClient
    except ImportError as exc:
        from ..errors import MissingDependencyError

        raise MissingDependencyError("reading MLflow runs needs mlflow", "pip install 'tropt[experiments]'") from exc
    client = MlflowClient(tracking_uri) if tracking_uri else MlflowClient()
    run_id = _mlflow_run_id(run)
    if run_id is None:
        if experiment is None:
            raise TroptError("read_mlflow: no run given", "pass a run id, an MLflow Run, or experiment='name'")
        exp = client.get_experiment_by_name(experiment)
        if exp is None:
            raise TroptError(f"no MLflow experiment named {experiment!r}", "check the experiment name and tracking URI")
        runs = client.search_runs([exp.experiment_id], order_by=["attributes.start_time DESC"], max_results=1)
        if not runs:
            raise TroptError(f"MLflow experiment {experiment!r} has no runs",
                             "check the experiment name and tracking URI")
        run_id = runs[0].info.run_id
    try:
        keys = list(client.get_run(run_id).data.metrics)
    except Exception as exc:  # noqa: BLE001 - MLflow raises its own exception types
        raise TroptError(f"cannot read MLflow run {run_id!r}: {type(exc).__name__}: {exc}",
                         "check the run id and the tracking URI (MLFLOW_TRACKING_URI)") from None
    out = {k: [(int(m.step), float(m.value)) for m in client.get_metric_history(run_id, k)] for k in keys}
    out = {k: v for k, v in out.items() if v}
    if not out:
        raise TroptError(f"MLflow run {run_id} has no metrics",
                         "log the loss with mlflow.log_metric('train_loss', loss, step=step)")
    return _sorted_curves(out)


def _mlflow_run_id(run: Any) -> str | None:
    if run is None:
        return None
    if isinstance(run, str):
        return run[len("runs:/"):].split("/")[0] if run.startswith("runs:/") else run
    info = getattr(run, "info", None)
    if info is not None and getattr(info, "run_id", None):
        return info.run_id
    raise TroptError(f"read_mlflow: cannot find a run id in a {type(run).__name__}", "pass a run id or an MLflow Run")


# ---------------------------------------------------------------------------------------------- W&B offline runs
_WB_BLOCK = 32768  # the transaction log's block size (LevelDB log framing: crc32, length, type per chunk)
_WB_HEADER = b":W&B"


def _wandb_file(path: str) -> str:
    """The ``run-*.wandb`` file of a run directory, a ``wandb/`` directory (its ``latest-run``) or the file itself."""
    if os.path.isfile(path):
        return path
    if os.path.isdir(path):
        for cand in (path, os.path.join(path, "latest-run"), os.path.join(path, "wandb", "latest-run")):
            if os.path.isdir(cand):
                files = sorted(f for f in os.listdir(cand) if f.endswith(".wandb"))
                if files:
                    return os.path.join(cand, files[-1])
    raise TroptError(f"no W&B run file (run-*.wandb) at {path}",
                     "pass the offline run directory (wandb/offline-run-...), its wandb/ directory, or the .wandb file")


def _wandb_records(data: bytes):
    """The payloads of a W&B transaction log (7-byte file header, then 32 KiB blocks of chunks)."""
    if not data.startswith(_WB_HEADER):
        raise TroptError("not a W&B run file (no ':W&B' header)", "pass a run-*.wandb file written by wandb")
    i, buf = 7, b""
    while i + 7 <= len(data):
        left = _WB_BLOCK - i % _WB_BLOCK
        if left < 7:  # a block's tail too short for a chunk header is padding
            i += left
            continue
        length, kind = struct.unpack_from("<HB", data, i + 4)
        chunk = data[i + 7:i + 7 + length]
        i += 7 + length
        if len(chunk) < length:
            break  # a run still writing
        if kind == 1:  # full
            yield chunk
        elif kind == 2:  # first
            buf = chunk
        elif kind == 3:  # middle
            buf += chunk
        elif kind == 4:  # last
            yield buf + chunk
            buf = b""


def read_wandb(path: str | os.PathLike, *, step_key: str = "_step") -> dict[str, Curve]:
    """Numeric history of a W&B run written offline (``WANDB_MODE=offline``): ``{key: (steps, values)}``.

    ``path``: the offline run directory (``wandb/offline-run-...``), a ``wandb/`` directory (its ``latest-run``) or
    the ``run-*.wandb`` file. Records are decoded with wandb's own protobuf ``Record``; ``step_key`` names the history
    key used as the step (W&B's ``_step`` by default; ``trainer/global_step`` for Lightning's ``WandbLogger``).
    """
    try:
        from wandb.proto import wandb_internal_pb2 as pb
    except ImportError as exc:
        from ..errors import MissingDependencyError

        raise MissingDependencyError("reading W&B runs needs wandb", "pip install 'tropt[logging]'") from exc
    import json

    f = _wandb_file(os.fspath(path))
    with open(f, "rb") as fh:
        data = fh.read()
    out: dict[str, list[tuple[int, float]]] = {}
    for payload in _wandb_records(data):
        rec = pb.Record()  # type: ignore[attr-defined]  # generated protobuf module: classes built at import
        try:
            rec.ParseFromString(payload)
        except Exception:  # noqa: BLE001 - a torn record at the end of a crashed run
            continue
        if rec.WhichOneof("record_type") != "history":
            continue
        row = {}
        for item in rec.history.item:
            key = item.key or "/".join(item.nested_key)
            try:
                value = json.loads(item.value_json)
            except ValueError:
                continue
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                row[key] = float(value)
            elif value in ("NaN", "Infinity", "-Infinity"):
                row[key] = float(value.replace("Infinity", "inf"))
        step = row.get(step_key, float(rec.history.step.num))
        for key, value in row.items():
            if not key.startswith("_") and key != step_key:
                out.setdefault(key, []).append((int(step), value))
    if not out:
        raise TroptError(f"{f}: no numeric history in the W&B run", "log the loss with wandb.log({'train/loss': loss})")
    return _sorted_curves(out)


def wandb_finished(path: str | os.PathLike) -> bool:
    """Whether a W&B run file holds its ``exit`` record (the run finished and its log is complete).

    ``wandb.finish()`` in offline mode can return before wandb's service has written the log, so a reader that must
    see the whole run waits for this (the tests do)."""
    from wandb.proto import wandb_internal_pb2 as pb

    try:
        with open(_wandb_file(os.fspath(path)), "rb") as fh:
            data = fh.read()
    except TroptError:
        return False
    for payload in _wandb_records(data):
        rec = pb.Record()  # type: ignore[attr-defined]  # generated protobuf module: classes built at import
        try:
            rec.ParseFromString(payload)
        except Exception:  # noqa: BLE001 - a torn record: not finished
            return False
        if rec.WhichOneof("record_type") == "exit":
            return True
    return False


def _is_wandb_run(path: str) -> bool:
    if path.endswith(".wandb"):
        return True
    if not os.path.isdir(path):
        return False
    for cand in (path, os.path.join(path, "latest-run"), os.path.join(path, "wandb", "latest-run")):
        if os.path.isdir(cand) and any(f.endswith(".wandb") for f in os.listdir(cand)):
            return True
    return False


def _pick(names: list[str], preferred: tuple[str, ...], want_val: bool,
          counts: dict[str, int] | None = None) -> str | None:
    """The loss column/tag among ``names``: a preferred name, else any name with 'loss' in it.

    Among several loss-named candidates the one with the most non-empty values wins (ties: ``preferred`` order), so a
    one-value summary column (Hugging Face's final ``train_loss`` row next to the logged ``loss``) is not a curve.
    """
    lower = {n.lower(): n for n in names}
    found = [lower[p.lower()] for p in preferred if p.lower() in lower]
    if not found:
        for n in names:
            low = n.lower()
            is_val = any(t in low for t in ("val", "valid", "eval", "test"))
            if "loss" in low and is_val == want_val:
                found.append(n)
    if not found:
        return None
    if counts is None:
        return found[0]
    best = max(counts.get(n, 0) for n in found)
    return next(n for n in found if counts.get(n, 0) == best)


def _from_tags(curves: dict[str, Curve], role: str, source: str) -> Curve | None:
    tag = _pick(list(curves), TRAIN_NAMES if role == "train" else VAL_NAMES, want_val=role == "val",
                counts={t: len(v[1]) for t, v in curves.items()})
    if tag is None:
        if role == "val":
            return None
        raise TroptError(f"{source}: none of the tags {sorted(curves)} looks like a training loss",
                         "name the tag 'train/loss' or 'train_loss', or pass the values as an array")
    return curves[tag]


# ---------------------------------------------------------------------------------------------- tables
def _from_frame(df: pd.DataFrame, role: str, source: str) -> Curve | None:
    unnamed = isinstance(df.columns, pd.RangeIndex)  # pd.DataFrame(array): columns 0, 1, ...
    cols = [str(c) for c in df.columns]
    df = df.copy()
    df.columns = cols
    if {"Step", "Value"} <= set(cols):  # TensorBoard "Download CSV": Wall time, Step, Value
        d = df[["Step", "Value"]].dropna(subset=["Step"])  # a NaN value is a NaN loss: keep it
        return d["Step"].to_numpy(np.float64), d["Value"].to_numpy(np.float64)
    step_col = next((c for c in STEP_NAMES if c in cols), None)
    numeric = [c for c in cols if c != step_col and pd.api.types.is_numeric_dtype(df[c]) and c not in STEP_NAMES
               and c.lower() not in ("wall time", "wall_time", "time", "timestamp", "lr")]
    col = _pick(numeric, TRAIN_NAMES if role == "train" else VAL_NAMES, want_val=role == "val",
                counts={c: int(df[c].notna().sum()) for c in numeric})
    # A lone numeric column is the loss only when its name says so: an 'acc' column read as a loss is "diverging".
    if (col is None and role == "train" and len(numeric) == 1
            and (unnamed or any(w in numeric[0].lower() for w in LOSS_WORDS))):
        col = numeric[0]
    if col is None:
        if role == "val":
            return None
        raise TroptError(f"{source}: cannot tell which column is the training loss: no column is named like a loss "
                         f"(columns: {cols}; numeric: {numeric})",
                         "name it 'train_loss' or 'loss', or pass the column itself: diagnose_curves(df['my_loss'])")
    d = df.loc[~_other_metric_rows(df, col), [col] + ([step_col] if step_col else [])]
    values = d[col].to_numpy(np.float64)
    if step_col is None:
        return None, values
    steps = d[step_col].to_numpy(np.float64)
    if role == "train" and step_col == "epoch" and np.unique(steps).size < values.size:
        return None, values  # several logged values per epoch: their order is the best step we have
    return steps, values


def _other_metric_rows(df: pd.DataFrame, col: str) -> pd.Series:
    """Rows that log another metric, not ``col`` (Lightning's ``CSVLogger`` writes one row per logging call, so its
    validation rows leave the training loss empty, and its training rows the validation loss).

    An empty ``col`` belongs to another metric when the row sets a column that is never set where ``col`` is. A row
    that sets neither (only its step: a NaN loss, or a metric that went NaN) is ``col``'s unless a metric disjoint
    from ``col`` is logged more often, which then owns it. Every other empty ``col`` is a NaN loss, kept so that
    non-finite losses are found as in an array.
    """
    missing = df[col].isna()
    logged = ~missing
    if not missing.any() or not logged.any():
        return pd.Series(False, index=df.index)
    others = [c for c in df.columns if c != col and c not in STEP_NAMES]
    disjoint = [c for c in others if not (df[c].notna() & logged).any()]
    if not disjoint:
        return pd.Series(False, index=df.index)
    other_metric = missing & df[disjoint].notna().any(axis=1)
    if int(df[disjoint].notna().sum().max()) > int(logged.sum()):
        other_metric |= missing & df[others].isna().all(axis=1)
    return other_metric


def read_curve(obj: Any, role: str = "train") -> Curve | None:
    """One curve from any supported input: (steps or None, values). None when ``role='val'`` finds none."""
    source = type(obj).__name__
    if isinstance(obj, str) and obj.startswith(("runs:/", "mlflow:")):
        return _from_tags(read_mlflow(obj.split(":", 1)[1] if obj.startswith("mlflow:") else obj), role, obj)
    if type(obj).__module__.startswith("mlflow") and hasattr(obj, "info"):
        return _from_tags(read_mlflow(obj), role, f"MLflow run {obj.info.run_id}")
    if isinstance(obj, (str, os.PathLike)):
        path = os.fspath(obj)
        source = path
        if not os.path.exists(path):
            raise TroptError(f"{path} does not exist",
                             "pass the path of a CSV file, an events file or a TensorBoard log directory")
        if _is_wandb_run(path):
            return _from_tags(read_wandb(path), role, source)
        if os.path.isdir(path) or "tfevents" in os.path.basename(path):
            return _from_tags(read_tensorboard(path), role, source)
        try:
            obj = pd.read_csv(path)
        except Exception as exc:  # noqa: BLE001 - any parse failure gets the same advice
            raise TroptError(f"cannot read {path} as CSV ({type(exc).__name__}: {exc})",
                             "pass a CSV with a loss column, a TensorBoard events file/directory, "
                             "or an array") from None
    if isinstance(obj, pd.DataFrame):
        return _from_frame(obj, role, source)
    if isinstance(obj, pd.Series):
        s = obj  # NaN entries are NaN losses (as in an array), not gaps: keep them so non-finite losses are found
        idx = s.index
        steps = idx.to_numpy(np.float64) if pd.api.types.is_numeric_dtype(idx) else None
        return steps, s.to_numpy(np.float64)
    if isinstance(obj, dict) and obj and all(isinstance(v, tuple) and len(v) == 2 for v in obj.values()):
        return _from_tags(obj, role, source)  # what read_tensorboard returns
    if hasattr(obj, "detach"):
        obj = obj.detach().cpu().numpy()
    try:
        values = np.asarray(obj, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise TroptError(f"cannot read a loss curve from a {source}",
                         "pass an array/list of losses, a pandas Series or DataFrame, a CSV path "
                         "or a TensorBoard log directory") from None
    return None, values
