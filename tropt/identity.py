"""Run identity: what a report records so a result can be traced to the code, data and configuration behind it."""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import platform
import subprocess
from collections.abc import Mapping
from typing import Any

import numpy as np


def _sha(payload: bytes) -> str:
    return hashlib.sha256(payload).hexdigest()[:16]


def _git_commit(path: str = ".") -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=path, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _tensor_bytes(x: Any, out: list[bytes]) -> None:
    import torch

    if isinstance(x, torch.Tensor):
        out.append(x.detach().cpu().contiguous().numpy().tobytes() if x.dtype != torch.bfloat16 else x.float().cpu().numpy().tobytes())
    elif isinstance(x, np.ndarray):
        out.append(np.ascontiguousarray(x).tobytes())
    elif isinstance(x, Mapping):
        for k in sorted(x, key=str):
            out.append(str(k).encode())
            _tensor_bytes(x[k], out)
    elif isinstance(x, (list, tuple)):
        for v in x:
            _tensor_bytes(v, out)
    else:
        out.append(repr(x).encode())


def data_fingerprint(setup: Any = None, splits: Mapping | None = None) -> str | None:
    """A short hash of the data a report was computed on (first training batch; split contents or file stats)."""
    parts: list[bytes] = []
    if setup is not None:
        from .snapshot import preserved

        try:
            with preserved():  # sample_batch seeds the global RNG; a report must not move the user's RNG state
                _tensor_bytes(setup.sample_batch(), parts)
        except Exception:  # noqa: BLE001 - an unreadable batch is reported by the checks themselves
            parts.append(b"unreadable")
    if splits is not None:
        import pandas as pd

        for name, split in splits.items():
            parts.append(str(name).encode())
            if isinstance(split, pd.DataFrame):
                parts.append(pd.util.hash_pandas_object(split, index=True).to_numpy().tobytes())
            elif isinstance(split, (str, os.PathLike)) and os.path.exists(split):
                st = os.stat(split)
                parts.append(f"{os.path.basename(split)}:{st.st_size}".encode())
                with open(split, "rb") as fh:
                    parts.append(fh.read(1 << 20))
            elif isinstance(split, np.ndarray) or hasattr(split, "detach"):
                _tensor_bytes(split, parts)
            else:  # a Dataset: its type and length (reading every sample is the data checks' job)
                parts.append(f"{type(split).__name__}:{len(split) if hasattr(split, '__len__') else '?'}".encode())
    return _sha(b"|".join(parts)) if parts else None


def run_identity(setup: Any = None, splits: Mapping | None = None, *, checks: list[str] | None = None) -> dict[str, Any]:
    """Versions, device, seed, configuration hash, data fingerprint, git commit and time of a diagnosis."""
    import pandas as pd
    import torch

    from . import __version__

    config = setup.describe() if setup is not None else {}
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
        "config_hash": _sha(json.dumps(config, sort_keys=True, default=str).encode()) if config else None,
        "data_fingerprint": data_fingerprint(setup, splits),
        "git_commit": _git_commit(),
        "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
