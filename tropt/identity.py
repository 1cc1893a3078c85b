"""Run identity: what a report records so a result can be traced to the code, data and configuration behind it."""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import platform
import subprocess
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from .setup import Setup


def _sha(payload: bytes) -> str:
    return hashlib.sha256(payload).hexdigest()[:16]


def _text_bytes(text: Any) -> bytes:
    """``str(text)`` as bytes, exactly, whatever it holds: a lone surrogate (a non-UTF-8 file name as ``os.listdir``
    gives it) is encoded as itself ("surrogatepass"), so distinct names stay distinct and nothing raises."""
    return str(text).encode("utf-8", "surrogatepass")


def _git_commit(path: str = ".") -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=path, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _column_bytes(col: Any) -> bytes:
    """A column's values as bytes for the fingerprint: pandas' hashes, or (for values pandas cannot hash, such as
    strings with lone surrogates) each value's text, exactly."""
    import pandas as pd

    try:
        return pd.util.hash_pandas_object(col, index=False).to_numpy().tobytes()
    except (TypeError, ValueError):  # UnicodeEncodeError is a ValueError
        return b"\x00".join(_text_bytes(repr(v)) for v in col.tolist())


def _split_parts(datas: list, h: hashlib._Hash) -> None:
    """Feed the scanned splits into ``h``: the row fingerprints the data checks computed, plus labels/group/time."""
    for d in datas:
        h.update(_text_bytes(f"|{d.name}:{d.kind}:{d.n}|"))
        if d.fp is not None:
            h.update(np.ascontiguousarray(d.fp).data)
        for role in ("label", "group", "time"):
            col = getattr(d, role)
            if col is not None:
                h.update(role.encode())
                h.update(_column_bytes(col))


def fingerprint(setup: Setup | None = None, splits: Mapping | None = None, *, label=None, group=None, time=None,
                features=None) -> tuple[str | None, str | None]:
    """``(data fingerprint, why it could not be taken)``: a short hash of the data a report was computed on.

    Splits are fingerprinted by the data checks' own scan (row fingerprints of the features, plus labels, group and
    time): inside a data session (``diagnose``, ``check_splits``) the scan the checks made is reused, not repeated.
    A Setup contributes all the data a run reads: one full pass of its training data (every batch) and its
    validation split, each by stage 1's row fingerprints (:func:`loader_fingerprint`; bounded, see
    :data:`FINGERPRINT_MAX_BATCHES`). Never raises: a failure becomes the second element (and the fingerprint covers
    what could be read), so a report is never lost to its identity.
    """
    fp, err, _ = _fingerprint(setup, splits, label=label, group=group, time=time, features=features)
    return fp, err


def _fingerprint(setup: Setup | None, splits: Mapping | None, **options: Any) -> tuple[str | None, str | None,
                                                                                       str | None]:
    """(fingerprint, errors, what a bounded pass covered) of :func:`fingerprint`."""
    h = hashlib.sha256()
    errors: list[str] = []
    cuts: list[str] = []
    used = False
    if setup is not None:
        parts, errs, cuts = setup_data_parts(setup)
        errors += errs
        h.update(_text_bytes("|".join(parts)))
        used = True
    if splits is not None:
        from .data.load import Options, load_splits

        try:
            opts = Options.make(options.get("label"), options.get("group"), options.get("time"),
                                options.get("features"))
            datas = load_splits(splits, opts, needs=frozenset())
            _split_parts(datas, h)
        except Exception as exc:  # noqa: BLE001 - the identity records why; the findings stay
            errors.append(f"splits: {type(exc).__name__}: {exc}")
        else:
            used = True
    return (h.hexdigest()[:16] if used else None), ("; ".join(errors) or None), ("; ".join(cuts) or None)


def data_fingerprint(setup: Setup | None = None, splits: Mapping | None = None, **options: Any) -> str | None:
    """A short hash of the data a report was computed on (see :func:`fingerprint`; None when nothing was read)."""
    return fingerprint(setup, splits, **options)[0]


def _config_hash(config: Mapping) -> str | None:
    if not config:
        return None
    try:
        return _sha(json.dumps(config, sort_keys=True, default=str).encode())
    except (TypeError, ValueError):  # keys that do not sort: hash them in their own order
        return _sha(_text_bytes(repr(sorted(config.items(), key=lambda kv: str(kv[0])))))


def run_identity(setup: Setup | None = None, splits: Mapping | None = None, *, checks: list[str] | None = None,
                 label=None, group=None, time=None, features=None) -> dict[str, Any]:
    """Versions, device, seed, configuration hash, data fingerprint (and why it failed, if it did), git commit and
    time of a diagnosis; never raises (a part that cannot be taken says why instead). ``label``/``group``/``time``/
    ``features`` are the data checks' options, so the scan they made in the same data session is reused."""
    import pandas as pd
    import torch

    from . import __version__

    try:
        config = setup.describe() if setup is not None else {}
    except Exception as exc:  # noqa: BLE001 - an identity never loses a report
        config = {"describe_error": f"{type(exc).__name__}: {exc}"}
    code: dict[str, Any] = {}
    if setup is not None:
        try:
            code = code_identity(setup)
        except Exception as exc:  # noqa: BLE001 - an identity never loses a report
            code = {"code_hash": f"not taken: {type(exc).__name__}: {exc}"}
        config = {**config, "code_hash": code.get("code_hash"), "optimizer_groups": optimizer_groups(setup)}
    fp, fp_error, coverage = _fingerprint(setup, splits, label=label, group=group, time=time, features=features)
    out: dict[str, Any] = {
        "tropt": __version__,
        "torch": torch.__version__,
        "numpy": np.__version__,
        "pandas": pd.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": str(setup.device) if setup is not None else "cpu",
        "seed": setup.seed if setup is not None else None,
        "checks": checks,
        "config_hash": _config_hash(config),
        "data_fingerprint": fp,
        "data_fingerprint_error": fp_error,
        # the repository of the user's code (the file loss_fn is defined in); the current directory's without a Setup
        "git_commit": code.get("git_commit") if setup is not None else _git_commit(),
        "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    if setup is not None:
        out.update(code_hash=code.get("code_hash"), code_file=code.get("code_file"),
                   optimizers=config.get("optimizer_groups"))
    if coverage:
        out["data_fingerprint_coverage"] = coverage
    return out


# ------------------------------------------------------------------------------------------ all the data a run reads
# A run reads every training batch (cycling) and the whole validation split, so the fingerprint covers one full pass
# of each. The cost is bounded for big loaders: at most FINGERPRINT_MAX_BATCHES batches and FINGERPRINT_MAX_BYTES of
# tensors per split; past either, the fingerprint covers what was read and ``data_fingerprint_coverage`` says so.
FINGERPRINT_MAX_BATCHES = 2_000
FINGERPRINT_MAX_BYTES = 1 << 30


def _leaves(x: Any, path: str, out: list[tuple[str, Any]]) -> None:
    """The batch's tensors and other values, each with its position ("0", "1.x"), in a stable order."""
    import torch

    if isinstance(x, (torch.Tensor, np.ndarray)):
        out.append((path, x))
    elif isinstance(x, Mapping):
        for k in sorted(x, key=str):
            _leaves(x[k], f"{path}.{k}", out)
    elif isinstance(x, (list, tuple)):
        for i, v in enumerate(x):
            _leaves(v, f"{path}.{i}", out)
    else:
        out.append((path, _text_bytes(repr(x))))


_MOD = 1 << 64


def _seed64(text: str) -> int:
    return int.from_bytes(hashlib.sha256(_text_bytes(text)).digest()[:8], "little")


def _as_numpy(t: Any) -> np.ndarray:
    import torch

    if isinstance(t, torch.Tensor):
        t = t.detach()
        t = t.float() if t.dtype in (torch.bfloat16, torch.float16) or t.is_complex() else t
        return t.cpu().numpy()
    return np.asarray(t)


def _batch_hash(batch: Any) -> tuple[int, int, int]:
    """(the batch's multiset hash of its rows, rows, bytes): each row (the i-th slice of every tensor whose first
    dimension is the batch's) gets stage 1's row fingerprint (:func:`tropt.data.hashing.hash_array_rows`), and the
    rows' hashes are summed, so the same rows in another order give the same hash."""
    from .data.hashing import hash_array_rows, mix

    leaves: list[tuple[str, Any]] = []
    _leaves(batch, "", leaves)
    arrays = [(p, _as_numpy(v)) for p, v in leaves if not isinstance(v, bytes)]
    n = next((a.shape[0] for _, a in arrays if a.ndim >= 1), 0)
    rows = np.zeros(n, dtype=np.uint64)
    extra = 0
    size = 0
    for path, a in arrays:
        size += a.nbytes
        if a.ndim >= 1 and a.shape[0] == n and a.dtype.kind in "biuf":
            rows += mix(hash_array_rows(a) ^ np.uint64(_seed64(path)))
        else:  # object arrays by their values' text (their bytes are pointers)
            raw = _text_bytes(repr(a.tolist())) if a.dtype.kind == "O" else a.tobytes()
            extra += _seed64(path + ":" + a.dtype.str + str(a.shape) + hashlib.sha256(raw).hexdigest())
    for path, v in leaves:
        if isinstance(v, bytes):
            extra += _seed64(path + ":" + v.decode("utf-8", "surrogatepass"))
    total = int(mix(rows + np.uint64(n)).sum(dtype=np.uint64)) if n else 0
    return (total + extra) % _MOD, n, size


def loader_fingerprint(setup: Setup, which: str) -> tuple[str, str | None]:
    """(a hash of one full pass over ``setup``'s ``which`` data, what it covers when the bound cut it short).

    Order-free (a shuffled pass gives the same hash) and content-exact; the global RNG is left as it was."""
    from .snapshot import preserved

    acc, rows, size, n = 0, 0, 0, 0
    cut = None
    with preserved():
        for batch in setup.batches(which=which, cycle=False):
            h, r, b = _batch_hash(batch)
            acc, rows, size, n = (acc + h) % _MOD, rows + r, size + b, n + 1
            if n >= FINGERPRINT_MAX_BATCHES or size >= FINGERPRINT_MAX_BYTES:
                cut = f"{which}: the first {n} batches ({rows} rows, {size / 2**20:.0f} MiB; the bound)"
                break
    return _sha(_text_bytes(f"{which}:{rows}:{acc}")), cut


def setup_data_parts(setup: Setup) -> tuple[list[str], list[str], list[str]]:
    """(the hashes of the training pass and, when set, the validation split; errors; coverage notes)."""
    parts, errors, cuts = [], [], []
    for which in ("train", "val"):
        if which == "val" and setup.val_data is None:
            continue
        try:
            fp, cut = loader_fingerprint(setup, which)
        except Exception as exc:  # noqa: BLE001 - an unreadable split is reported by the checks themselves
            errors.append(f"{which} data: {type(exc).__name__}: {exc}")
            fp, cut = "unreadable", None
        parts.append(f"{which}={fp}")
        if cut:
            cuts.append(cut)
    return parts, errors, cuts


# ---------------------------------------------------------------------------------------------- the user's code
_VALUE_CHARS = 4_000  # a value a function closes over is hashed by at most this much of its repr (tensors: bytes)
_DEPTH = 3  # functions called through closures, followed this deep


def _value_bytes(v: Any, depth: int) -> bytes:
    """What a closed-over value contributes: a tensor its bytes, a function its own code, a module its name, anything
    else its repr (bounded: the first :data:`_VALUE_CHARS` characters)."""
    import types

    import torch

    if isinstance(v, (torch.Tensor, np.ndarray)):
        return _sha(np.ascontiguousarray(_as_numpy(v)).tobytes()).encode()
    if isinstance(v, types.ModuleType):
        return _text_bytes(f"module {v.__name__}")
    if isinstance(v, torch.nn.Module):
        return _text_bytes(f"{type(v).__qualname__}:{sum(p.numel() for p in v.parameters())}")
    if callable(v) and not isinstance(v, type):
        return _code_bytes(v, depth + 1) if depth < _DEPTH else _text_bytes(getattr(v, "__qualname__", "?"))
    try:
        text = repr(v)
    except Exception as exc:  # noqa: BLE001 - a value whose repr fails is recorded by its type
        text = f"<{type(v).__qualname__}: repr failed {type(exc).__name__}>"
    return _text_bytes(text[:_VALUE_CHARS])


def _code_bytes(fn: Any, depth: int = 0) -> bytes:
    """A function's source (``inspect.getsource``; its code object's bytes and constants when there is no source),
    its defaults and the values it closes over; a ``functools.partial`` its function and arguments; a callable
    object its class's source and attributes."""
    import functools
    import inspect

    if isinstance(fn, functools.partial):
        return b"partial:" + _code_bytes(fn.func, depth) + _value_bytes((fn.args, fn.keywords), depth)
    target = fn if inspect.isfunction(fn) or inspect.ismethod(fn) else type(fn)
    try:
        src = _text_bytes(inspect.getsource(target))
    except (OSError, TypeError):
        code = getattr(target, "__code__", None)
        src = (code.co_code + _text_bytes(repr(code.co_consts)) + _text_bytes(repr(code.co_names))
               if code is not None else _text_bytes(getattr(target, "__qualname__", type(fn).__qualname__)))
    parts = [src]
    func = getattr(fn, "__func__", fn)
    for v in (getattr(func, "__defaults__", None) or ()):
        parts.append(_value_bytes(v, depth))
    for k, v in sorted((getattr(func, "__kwdefaults__", None) or {}).items()):
        parts.append(_text_bytes(k) + _value_bytes(v, depth))
    for name, cell in zip(getattr(getattr(func, "__code__", None), "co_freevars", ()),
                          getattr(func, "__closure__", None) or ()):
        try:
            parts.append(_text_bytes(name) + _value_bytes(cell.cell_contents, depth))
        except ValueError:  # an empty cell
            parts.append(_text_bytes(name))
    if not inspect.isfunction(fn) and not inspect.ismethod(fn) and hasattr(fn, "__dict__"):
        for k, v in sorted(vars(fn).items()):
            parts.append(_text_bytes(k) + _value_bytes(v, depth))
    return b"\x00".join(parts)


def code_hash(*fns: Any) -> str:
    """A short hash of these functions' code and the values they close over (None entries count as absent)."""
    return _sha(b"\x01".join(_code_bytes(f) if f is not None else b"-" for f in fns))


def code_file(fn: Any) -> str | None:
    """The file a function is defined in (the user's code), or None."""
    import functools
    import inspect

    while isinstance(fn, functools.partial):
        fn = fn.func
    try:
        path = inspect.getsourcefile(fn if inspect.isfunction(fn) or inspect.ismethod(fn) else type(fn))
    except TypeError:
        return None
    return path


def code_identity(setup: Setup) -> dict[str, Any]:
    """The hash of the Setup's loss_fn and step (source and closed-over values), the file loss_fn is defined in and
    the git commit of the repository holding that file (not of the current directory)."""
    import os

    step = None if setup.uses_standard_step else setup.step
    where = code_file(setup.loss_fn) or (code_file(step) if step is not None else None)
    return {"code_hash": code_hash(setup.loss_fn, step), "code_file": where,
            "git_commit": _git_commit(os.path.dirname(where)) if where else None}


def optimizer_groups(setup: Setup) -> list[dict[str, Any]] | str:
    """Every optimizer's class and every param group's hyperparameters, read from an optimizer built on a copy
    (Adam with other betas or weight decay differs); a string saying why when it cannot be built."""
    from .result import json_safe
    from .snapshot import preserved

    if setup.optimizer is None:
        return []
    try:
        with preserved():
            ctx = setup.build()
    except Exception as exc:  # noqa: BLE001 - an identity never loses a report
        return f"not built: {type(exc).__name__}: {exc}"
    return [{"class": type(o).__name__,
             "groups": [json_safe({k: v for k, v in g.items() if k != "params"}) for g in o.param_groups]}
            for o in ctx.optimizers]


def _override_hash(v: Any) -> str:
    import torch

    if callable(v) and not isinstance(v, (torch.nn.Module, type)):
        return code_hash(v)
    if isinstance(v, torch.nn.Module):
        return _sha(_text_bytes(repr(v)) + b"".join(_value_bytes(p, 0) for p in v.state_dict().values()))
    return _sha(_value_bytes(v, 0))


def candidate_identity(setup: Setup, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """A compared candidate's own identity: the configuration hash of its Setup (with every optimizer param group)
    and of its overrides (a factory by its code and closed-over values, so two lambdas of one qualname differ), and
    its data fingerprint when it changes the data."""
    try:
        config: dict[str, Any] = dict(setup.describe())
    except Exception as exc:  # noqa: BLE001 - an identity never loses a comparison
        config = {"describe_error": f"{type(exc).__name__}: {exc}"}
    groups = optimizer_groups(setup)
    config.update(code_hash=code_identity(setup)["code_hash"], optimizer_groups=groups,
                  overrides={str(k): _override_hash(v) for k, v in overrides.items()})
    out: dict[str, Any] = {"config_hash": _config_hash(config), "optimizers": groups}
    if {"train_data", "batch_size"} & set(overrides):
        out["data_fingerprint"] = fingerprint(setup)[0]
    return out
