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


def _tensor_bytes(x: Any, out: list[bytes]) -> None:
    import torch

    if isinstance(x, torch.Tensor):
        out.append(x.detach().cpu().contiguous().numpy().tobytes() if x.dtype != torch.bfloat16
                   else x.float().cpu().numpy().tobytes())
    elif isinstance(x, np.ndarray):
        out.append(np.ascontiguousarray(x).tobytes())
    elif isinstance(x, Mapping):
        for k in sorted(x, key=str):
            out.append(_text_bytes(k))
            _tensor_bytes(x[k], out)
    elif isinstance(x, (list, tuple)):
        for v in x:
            _tensor_bytes(v, out)
    else:
        out.append(_text_bytes(repr(x)))


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
    A Setup contributes its first training batch. Never raises: a failure becomes the second element (and the
    fingerprint covers what could be read), so a report is never lost to its identity.
    """
    h = hashlib.sha256()
    errors: list[str] = []
    used = False
    if setup is not None:
        from .snapshot import preserved

        parts: list[bytes] = []
        try:
            with preserved():  # sample_batch seeds the global RNG; a report must not move the user's RNG state
                _tensor_bytes(setup.sample_batch(), parts)
        except Exception as exc:  # noqa: BLE001 - an unreadable batch is reported by the checks themselves
            errors.append(f"training batch: {type(exc).__name__}: {exc}")
            parts = [b"unreadable"]
        for part in parts:
            h.update(part)
        used = True
    if splits is not None:
        from .data.load import Options, load_splits

        try:
            datas = load_splits(splits, Options.make(label, group, time, features), needs=frozenset())
            _split_parts(datas, h)
        except Exception as exc:  # noqa: BLE001 - the identity records why; the findings stay
            errors.append(f"splits: {type(exc).__name__}: {exc}")
        else:
            used = True
    return (h.hexdigest()[:16] if used else None), ("; ".join(errors) or None)


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
    fp, fp_error = fingerprint(setup, splits, label=label, group=group, time=time, features=features)
    return {
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
        "git_commit": _git_commit(),
        "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
