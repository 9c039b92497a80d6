"""
The phase diagram of clustering, as a sweep
===========================================

Geshkovski, Letrouit, Polyanskiy and Rigollet draw when self-attention collapses the
tokens: for each inverse temperature :math:`\\beta` and depth :math:`t`, the fraction of
token pairs whose inner product exceeds 0.999, averaged over many random systems of
:math:`n = 32` tokens (SA with :math:`Q = K = V = I`, explicit Euler with step 0.1).
Small :math:`\\beta` collapses fast; large :math:`\\beta` lingers in metastable clusters.

:func:`wflow.sweep.phase_diagram` is that computation as one sweep: a grid over
``model.beta`` and ``init.seed`` (the seeds run as one batched call), recorded in one Zarr
store with ``beta``, ``seed`` and ``time`` as coordinates.  The published diagram
(:math:`d \\in \\{8, 128, 1024\\}`, 90 values of :math:`\\beta`, 2048 systems) is the same
call with its defaults; this page runs a small version (:math:`d = 8`, 12 values of
:math:`\\beta`, 48 systems) on an in-process Dask client so that it builds in seconds.
In a script, leave ``scheduler`` out: the sweep starts a ``LocalCluster`` of one-thread
worker processes (and, as any script that starts processes, it must then run under
``if __name__ == "__main__":``).
"""

# %%
import tempfile
from pathlib import Path

from distributed import Client

from wflow.sweep import phase_diagram, plot_phase_diagram

out = Path(tempfile.mkdtemp()) / "phase.zarr"
with Client(processes=False, n_workers=1, threads_per_worker=2, dashboard_address=None, silence_logs="error") as client:
    ds = phase_diagram(out, d=[8], betas="linspace(0.5, 9, 12)", systems=48, scheduler=client, progress=False,
                       config={"run.n_saves": 61})
print(f"{ds.attrs['ok']} of {ds.attrs['points']} points reached t = 30")
print(ds.pair_fraction.sel(d=8, beta=0.5).mean("seed").values[[0, 10, 60]])  # t = 0, 5, 30

# %%
# The heat map: the fraction of pairs above 0.999, averaged over the 48 systems, over
# :math:`(t, \beta)`.  The boundary of the collapsed region moves to later times as
# :math:`\beta` grows.
fig = plot_phase_diagram(ds)
