"""Gathering a Dask split's map: each partition's result as soon as it is done, with a progress bar (on a Client
or Dask's local scheduler), and a partition that kills every worker reading it named with its split."""

from __future__ import annotations

from typing import Any

from ..errors import DataError
from ..output import terminal_line


def gather_as_done(client: Any, futures: list, desc: str, progress: bool, name: str = "") -> list:
    """The futures' results in order, each fetched as soon as its task is done (the transfers overlap the map's
    remaining tasks instead of all following the last one), with a tqdm bar over the partitions. A partition whose
    task killed every worker that ran it (``KilledWorker``) is a DataError naming the split and the partition."""
    from distributed import as_completed

    where = {f.key: i for i, f in enumerate(futures)}
    out: list = [None] * len(futures)
    done = as_completed(futures, with_results=True, raise_errors=False)
    if progress:
        from tqdm.auto import tqdm

        done = tqdm(done, total=len(futures), desc=desc, leave=False)
    for f, result in done:
        if f.status == "error":  # result: (type, exception, traceback)
            exc = result[1] if isinstance(result, tuple) else result
            raise partition_error(exc, name, where[f.key], len(futures)) from exc
        out[where[f.key]] = result
    return out


def partition_error(exc: BaseException, name: str, part: int | None = None, parts: int | None = None) -> BaseException:
    """The error of partition ``part`` of split ``name``: a KilledWorker named (the partition from the task's key when
    not given), other errors as they are."""
    if type(exc).__name__ != "KilledWorker":
        return exc
    key = getattr(exc, "task", None)
    if part is None and isinstance(key, tuple) and key and isinstance(key[-1], int):
        part = key[-1]  # a DataFrame task's key: (its layer's name, the partition)
    which = f"partition {part}" + (f" (of {parts})" if parts else "") if part is not None else "a partition"
    read = f"ddf.get_partition({part}).compute()" if part is not None else "each partition (ddf.partitions[i])"
    first = str(exc).splitlines()[0] if str(exc) else "KilledWorker"
    return DataError(f"split {name!r}: every Dask worker that read {which} died (KilledWorker: {terminal_line(first)})",
                     f"read {read} alone to find the cause: usually it needs more memory than a worker has (split "
                     "it: ddf.repartition(partition_size='100MB')) or a library crashes on its values; the worker "
                     "logs say which")


def local_progress(total: int, desc: str, progress: bool) -> Any:
    """A tqdm bar over the partitions on Dask's local scheduler (a scheduler callback counts the map's tasks)."""
    from contextlib import nullcontext

    if not progress:
        return nullcontext()
    from dask.callbacks import Callback
    from tqdm.auto import tqdm

    class _Bar(Callback):
        def _start(self, dsk):
            self.bar = tqdm(total=total, desc=desc, leave=False)

        def _posttask(self, key, result, dsk, state, worker_id):
            if "_summarise" in str(key):
                self.bar.update(1)

        def _finish(self, dsk, state, errored):
            self.bar.close()

    return _Bar()
