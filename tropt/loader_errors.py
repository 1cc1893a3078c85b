"""Name the data behind a failure inside a torch DataLoader: which of the Setup's data (``train_data`` or
``val_data``), the sample index (or the batch, when a worker process read it), and what went wrong, instead of a
raw exception that reads as tropt's own bug.

:func:`loading_error` reads the exception's traceback: the :meth:`tropt.Setup.batches` frame says which data was
being read, torch's fetcher frame the sample index, the DataLoader iterator how many batches it had yielded.
"""

from __future__ import annotations

import os
from types import TracebackType
from typing import Any

from .errors import SetupError, TroptError

_TORCH_DATA = os.sep.join(("torch", "utils", "data", ""))


def _frames(tb: TracebackType | None) -> list:
    out = []
    while tb is not None:
        out.append(tb.tb_frame)
        tb = tb.tb_next
    return out


def _chain(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    e: BaseException | None = exc
    while e is not None and e not in out and len(out) < 10:
        out.append(e)
        e = e.__cause__ or e.__context__
    return out


def _which(frames: list, setup: Any) -> str | None:
    """"train_data" or "val_data": from the Setup.batches frame reading it, else by the loader's dataset."""
    for fr in frames:
        if fr.f_code.co_name == "batches" and fr.f_locals.get("which") in ("train", "val") \
                and fr.f_locals.get("self") is setup:
            return f"{fr.f_locals['which']}_data"
    for fr in frames:
        it = fr.f_locals.get("self")
        ds = getattr(it, "_dataset", None)
        if ds is None:
            continue
        for name in ("train_data", "val_data"):
            data = getattr(setup, name, None)
            if data is ds or getattr(data, "dataset", None) is ds:
                return name
    return None


def _where(frames: list) -> tuple[Any, int | None]:
    """(the sample index being read, or None; the 0-based batch of the epoch, or None)."""
    idx, batch = None, None
    for fr in frames:
        if _TORCH_DATA not in fr.f_code.co_filename:
            continue
        loc = fr.f_locals
        if "idx" in loc and isinstance(loc["idx"], int):
            idx = loc["idx"]
        elif idx is None and fr.f_code.co_name == "fetch" and "possibly_batched_index" in loc:
            pbi = loc["possibly_batched_index"]
            idx = pbi if isinstance(pbi, int) else None
        it = loc.get("self")
        if batch is None and isinstance(getattr(it, "_num_yielded", None), int):
            batch = it._num_yielded
    return idx, batch


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else text


def loading_error(exc: BaseException, setup: Any) -> TroptError | None:
    """A :class:`SetupError` naming the data and sample for ``exc`` raised while a DataLoader read a batch of the
    Setup's data; None when ``exc`` did not come from there (or is already a tropt error)."""
    if isinstance(exc, TroptError) or setup is None or not hasattr(setup, "train_data"):
        return None
    for e in _chain(exc):
        frames = _frames(e.__traceback__)
        if not any(_TORCH_DATA in fr.f_code.co_filename for fr in frames):
            continue
        which = _which(frames, setup) or "the Setup's data"
        idx, batch = _where(frames)
        text = str(e)
        at = f" (batch {batch} of the epoch)" if batch is not None else ""
        if "DataLoader worker" in text and "exited unexpectedly" in text:
            return SetupError(f"{which}: a DataLoader worker process died reading a batch{at} ({_last_line(text)}): "
                              "killed by a signal, out of memory, or a crash in native code while reading a sample",
                              f"run {which}'s DataLoader with num_workers=0 once to see the failing sample's error "
                              "in this process; if it reads fine there, give the workers more memory (RAM, /dev/shm)")
        if text.startswith("Caught ") and "in DataLoader worker process" in text:
            return SetupError(f"{which}: a DataLoader worker raised reading a batch{at}: {_last_line(text)}",
                              f"fix the Dataset's __getitem__ (run {which}'s DataLoader with num_workers=0 to get "
                              "the failing sample's index and traceback in this process)")
        if idx is not None or any(fr.f_code.co_name == "__getitem__" for fr in frames):
            sample = f"sample {idx}" if idx is not None else "a sample"
            return SetupError(f"{which}: reading {sample}{at} raised {type(e).__name__}: {e}",
                              f"fix the Dataset's __getitem__ for {sample} (tropt reads {which} through its "
                              "DataLoader, as your training loop does)")
    return None
