"""Where runs execute: in this process (the default), any ``concurrent.futures.Executor``, or Dask.

No home-made scheduler: :func:`dask_executor` hands the runs to ``dask.distributed`` (a ``LocalCluster`` of
worker processes by default, or an existing scheduler's address, which is how a comparison outgrows one machine).
Specs travel as cloudpickle bytes so closures and lambdas in a Setup work with every executor.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
from typing import Any

from ..errors import TroptError, require


class DaskExecutor(cf.Executor):
    """A ``concurrent.futures.Executor`` backed by a ``dask.distributed.Client``; :meth:`shutdown` closes the client
    (and the ``LocalCluster`` it started, if any). Use it as a context manager."""

    def __init__(self, client: Any, cluster: Any = None) -> None:
        self.client, self.cluster = client, cluster
        self._executor = client.get_executor(pure=False)  # every run is distinct work, even with equal inputs

    def submit(self, fn, /, *args, **kwargs):
        return self._executor.submit(fn, *args, **kwargs)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._executor.shutdown(wait=wait)
        self.client.close()
        if self.cluster is not None:
            self.cluster.close()

    def __repr__(self) -> str:
        return f"DaskExecutor({self.client.scheduler.address if self.client.scheduler else 'closed'})"


def dask_executor(address: str | None = None, n_workers: int | None = None, *, threads_per_worker: int = 1,
                  **cluster_kwargs: Any) -> DaskExecutor:
    """A ``concurrent.futures.Executor`` on ``dask.distributed``.

    Parameters
    ----------
    address
        A running scheduler's address (``"tcp://host:8786"``); None starts a ``LocalCluster`` of worker processes.
    n_workers
        Worker processes of the local cluster (default: the CPU count).
    threads_per_worker
        Threads per local worker; 1 runs one training run per process at a time (each run is single-threaded
        Python; torch's own intra-op threads are set by the worker's environment).
    cluster_kwargs
        Passed to ``LocalCluster`` (e.g. ``memory_limit``).

    Requires the ``experiments`` extra (``pip install "tropt[experiments]"``).
    """
    distributed = require("dask.distributed", "experiments")
    if address is not None:
        if n_workers is not None or cluster_kwargs:
            raise TroptError("dask_executor: n_workers and cluster options apply to a local cluster, not to an address",
                             "start the workers with the scheduler, or drop address= to start a LocalCluster")
        return DaskExecutor(distributed.Client(address))
    if n_workers is not None and (isinstance(n_workers, bool) or not isinstance(n_workers, int) or n_workers < 1):
        raise TroptError(f"dask_executor: n_workers={n_workers!r}; it must be an integer >= 1", "e.g. n_workers=2")
    cluster_kwargs.setdefault("dashboard_address", None)  # no web server unless asked for
    cluster_kwargs.setdefault("silence_logs", 40)  # errors only
    import dask

    # Dask starts workers with MALLOC_TRIM_THRESHOLD_=65536, which pins glibc's mmap threshold: torch's per-step
    # tensors then come from fresh mmap'd pages every step (page faults; runs measured 1.3-1.5x slower than in a
    # plain process). Workers start without it. Dask's nanny also writes its worker environment into this process's
    # os.environ; it is put back so the caller's environment is unchanged.
    saved = dict(os.environ)
    try:
        os.environ.pop("MALLOC_TRIM_THRESHOLD_", None)
        with dask.config.set({"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None}):
            cluster = distributed.LocalCluster(n_workers=n_workers or os.cpu_count() or 1,
                                               threads_per_worker=threads_per_worker, processes=True, **cluster_kwargs)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    try:
        return DaskExecutor(distributed.Client(cluster), cluster)
    except Exception:
        cluster.close()
        raise


def executor_label(executor: Any) -> str:
    """A short description of where runs executed."""
    if executor is None:
        return "sequential (in process)"
    return type(executor).__name__


def check_executor(executor: Any) -> None:
    if executor is not None and not callable(getattr(executor, "submit", None)):
        raise TroptError(f"compare: executor is a {type(executor).__name__} without submit()",
                         "pass a concurrent.futures.Executor (e.g. ProcessPoolExecutor(2)), "
                         "tropt.experiments.dask_executor(), or None to run sequentially")
    if isinstance(executor, cf.ThreadPoolExecutor):
        raise TroptError("compare: a ThreadPoolExecutor runs every run in this process, where they share torch's "
                         "global random state (seeding, dropout, data order), so results would depend on thread timing",
                         "use processes: concurrent.futures.ProcessPoolExecutor(2) or "
                         "tropt.experiments.dask_executor(), or executor=None to run sequentially")
