"""Dask for a sweep: a LocalCluster or a running scheduler, and the loop that submits tasks and commits results."""

from __future__ import annotations

import logging
import math
import os
import sys
from typing import Any

import numpy as np

from ..errors import short_repr
from .plan import FAILED, Plan
from .store import Store
from .tasks import WORKER_ENV, run_task

__all__ = ["SchedulerError", "cores", "connect", "disconnect", "run_tasks"]

log = logging.getLogger(__name__)


class SchedulerError(ValueError, ConnectionError):
    """No Dask scheduler answers at the given address (bad input: the message names the address).

    Examples
    --------
    >>> from wflow.sweep import SchedulerError
    >>> issubclass(SchedulerError, ValueError), issubclass(SchedulerError, ConnectionError)
    (True, True)
    """


def cores() -> int:
    """The CPU cores this process may run on (its affinity mask where the OS has one).

    Examples
    --------
    >>> from wflow.sweep import cores
    >>> cores() >= 1
    True
    """
    return (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    )


def connect(scheduler: Any, workers: int | None, timeout: float, threads: int = 1):
    """A Dask client for a sweep: ``(client, cluster_to_close, owned)``.

    Parameters
    ----------
    scheduler : None, str, distributed.Client or cluster
        ``None``: a new ``LocalCluster`` of ``workers`` one-thread worker processes, their
        numba, BLAS and OpenMP limited to ``threads`` (:data:`~wflow.sweep.tasks.WORKER_ENV`);
        an address ``"tcp://host:port"`` or a cluster object (dask-jobqueue): a client of that
        scheduler; a ``Client``: itself.
    workers : int, optional
        Worker processes of a new LocalCluster (default: the usable cores over ``threads``).
    timeout : float
        Seconds to wait for a scheduler at an address.
    threads : int
        Threads of one task.

    Returns
    -------
    client : distributed.Client
    cluster_to_close : distributed.LocalCluster or None
        The cluster started here (the caller closes it), else None.
    owned : bool
        Whether the caller closes ``client`` (False for a ``Client`` passed in).

    Raises
    ------
    ValueError
        A bad ``scheduler`` or ``workers``; :class:`SchedulerError` when no scheduler answers.

    Examples
    --------
    >>> from wflow.sweep import connect
    >>> try:
    ...     connect(42, None, 1.0)
    ... except ValueError as exc:
    ...     print(str(exc).split(",")[0])
    scheduler must be None
    """
    from distributed import Client, LocalCluster

    if isinstance(scheduler, Client):
        return scheduler, None, False
    if scheduler is None:
        # by default as many workers as the cores hold tasks of `threads` threads each: no oversubscription
        n = max(1, cores() // threads) if workers is None else workers
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"workers must be an integer >= 1, got {short_repr(workers)}")
        # the dashboard on a free port (two sweeps on one host do not collide); its page needs bokeh
        cluster = LocalCluster(
            n_workers=n,
            threads_per_worker=1,
            processes=True,
            dashboard_address=":0",
            silence_logs=logging.ERROR,
            env={k: str(threads) for k in WORKER_ENV},
        )
        return Client(cluster), cluster, True
    # a Cluster object (dask-jobqueue, ...) has its scheduler's address
    address = getattr(scheduler, "scheduler_address", scheduler)
    if not isinstance(address, str):
        raise ValueError(
            f"scheduler must be None, an address like 'tcp://host:8786', a distributed.Client or a "
            f"Dask cluster, got {short_repr(scheduler)}"
        )
    try:
        return Client(address, timeout=timeout), None, True
    except Exception as exc:  # noqa: BLE001 - any failure to connect is reported with the address
        raise SchedulerError(
            f"no Dask scheduler answers at {address} within {timeout:g} s ({type(exc).__name__}); "
            f"start one (`dask scheduler`, docs: sweeps) or check the address"
        ) from None


def disconnect(client: Any, cluster: Any, owned: bool) -> None:
    """Close what :func:`connect` opened: the client when ``owned``, the LocalCluster it started.

    The results are committed by then: the ``distributed`` loggers show only errors meanwhile (a
    nanny warns when a worker is slow to exit).

    Examples
    --------
    >>> disconnect(None, None, False)  # nothing to close
    """
    loggers = [logging.getLogger(n) for n in ("distributed", "distributed.nanny")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        if owned and client is not None:
            client.close()
        if cluster is not None:
            cluster.close()
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def _has_bokeh() -> bool:
    try:
        import bokeh  # noqa: F401 - the dashboard's pages need it

        return True
    except ImportError:
        return False


def run_tasks(
    client, plan: Plan, store: Store, todo: list[int], threads: int, retries: int, progress: bool
) -> None:
    """Submit the tasks ``todo`` of ``plan`` to ``client`` and write each batch of finished ones to ``store``.

    The client is the only writer, committing results as they arrive.  A task the cluster could not
    run is recorded as failed but not committed: running the sweep again retries it.
    """
    from distributed import as_completed
    from tqdm.auto import tqdm

    if not todo:
        log.info("%s: every point is committed", store.path)
        return
    total = sum(plan.points(t) for t in todo)
    if progress and "dashboard" in client.scheduler_info().get("services", {}) and _has_bokeh():
        print(f"wflow sweep: Dask dashboard at {client.dashboard_link}", file=sys.stderr)
    obs = plan.observables
    futures = []
    for t in todo:
        cfg, seeds = plan.task_config(t)
        spec = {
            "task": t,
            "config": cfg,
            "seeds": seeds,
            "observables": obs,
            "n_time": plan.n_time,
            "threads": threads,
        }
        key = f"wflow-sweep-{plan.fingerprint}-{t}"
        futures.append(client.submit(run_task, spec, key=key, pure=False, retries=retries))
    failed = 0
    bar = tqdm(total=total, unit="point", desc="sweep", disable=not progress, dynamic_ncols=True)
    try:
        done_iter = as_completed(futures)
        for batch in done_iter.batches():
            # a future whose worker died after it finished is back to pending (Dask recomputes its lost
            # result): wait for it again instead of recording it as failed
            states = [(f, f.status) for f in batch]  # read once: a status can change while we look
            for f, st in states:
                if st in ("pending", "lost"):
                    done_iter.add(f)
            states = [(f, st) for f, st in states if st not in ("pending", "lost")]
            batch = [f for f, _ in states]
            if not batch:
                continue
            finished = [f for f, st in states if st == "finished"]
            results = client.gather(finished) if finished else []
            commit = [True] * len(results)
            for fut, st in states:
                if st == "finished":
                    continue
                # the cluster could not run it (e.g. KilledWorker after repeated deaths): recorded, not committed
                t = int(str(fut.key).rsplit("-", 1)[1])
                try:
                    exc = fut.exception()
                except BaseException as e:  # noqa: BLE001 - a cancelled future raises
                    exc = e
                results.append(
                    {
                        "task": t,
                        "values": {k: np.full((plan.points(t), plan.n_time), np.nan) for k in obs},
                        "times": np.full(plan.n_time, np.nan),
                        "status": FAILED,
                        "steps": 0,
                        "seconds": math.nan,
                        "cpu_seconds": math.nan,
                        "worker": "",
                        "message": f"{type(exc).__name__}: {exc} (not committed: run the sweep again to "
                        f"retry)",
                    }
                )
                commit.append(False)
            store.write(results, commit)
            for fut in batch:
                fut.release()
            failed += sum(bool(np.any(np.asarray(r["status"]) < 0)) for r in results)
            bar.update(sum(plan.points(r["task"]) for r in results))
            if failed:
                bar.set_postfix_str(f"failed tasks {failed}")
    finally:
        bar.close()
        store.close()
        for f in futures:
            if not f.done():
                f.cancel()
