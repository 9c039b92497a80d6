"""
The phase diagram of clustering, as a sweep
===========================================

Geshkovski, Letrouit, Polyanskiy and Rigollet draw when self-attention collapses the
tokens: for each inverse temperature :math:`\\beta` and depth :math:`t`, the fraction of
token pairs whose inner product exceeds 0.999, averaged over many random systems of
:math:`n = 32` tokens (SA with :math:`Q = K = V = I`, explicit Euler with step 0.1).
Small :math:`\\beta` collapses fast; large :math:`\\beta` lingers in metastable clusters.

:func:`wflow.studies.glpr.phase_diagram` is that computation as one sweep: a grid over
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

from wflow.studies.glpr import phase_diagram, plot_phase_diagram

out = Path(tempfile.mkdtemp()) / "phase.zarr"
with Client(
    processes=False, n_workers=1, threads_per_worker=2, dashboard_address=None, silence_logs="error"
) as client:
    ds = phase_diagram(
        out,
        d=[8],
        betas="linspace(0.5, 9, 12)",
        systems=48,
        scheduler=client,
        progress=False,
        config={"save.n": 61},
    )
print(f"{ds.attrs['ok']} of {ds.attrs['points']} points reached t = 30")
print(ds.pair_fraction.sel(d=8, beta=0.5).mean("seed").values[[0, 10, 60]])  # t = 0, 5, 30

# %%
# The heat map: the fraction of pairs above 0.999, averaged over the 48 systems, over
# :math:`(t, \beta)`.  The boundary of the collapsed region moves to later times as
# :math:`\beta` grows.  Overlaid: the equiangular curve :math:`t^*(\beta)`, the time at which
# the equiangular ODE from :math:`\rho = 0` reaches :math:`\rho = 0.999`
# (:func:`wflow.theory.equiangular_time`), and the first time the mean fraction reaches 0.5
# (:func:`wflow.studies.phase_diagram.crossing_time`).  In :math:`d = 8` the systems are far from
# equiangular and the 0.5 level lags :math:`t^*`; ``wflow validate phase-diagram`` measures how the
# gap closes as :math:`d` grows.
import numpy as np

from wflow.studies.phase_diagram import crossing_time, initial_points, pair_fraction_curves
from wflow.theory import equiangular_time

fig = plot_phase_diagram(ds)
ax = fig.axes[0]
betas = ds["beta"].values
mean = ds.pair_fraction.sel(d=8).mean("seed").transpose("beta", "time").values
t_save = ds["time"].values
b_fine = np.linspace(betas.min(), betas.max(), 200)
ax.plot(np.minimum(equiangular_time(b_fine, 32), 40.0), b_fine, "w-", lw=1.5, label=r"$t^*(\beta)$")
ax.plot(
    [crossing_time(t_save, m) for m in mean], betas, "o", color="tab:red", ms=3, label="0.5 level"
)
ax.set_xlim(0, 30)
ax.legend(loc="lower right", fontsize=8)

# %%
# The published scheme is :math:`x \leftarrow (x + \eta A x)/|x + \eta A x|` with the softmax
# average :math:`A x` itself (``method="euler-average"``), not its tangent part: it moves a token by
# :math:`1/(1 + \eta\langle x, Ax\rangle)` of wflow's projected Euler step, so at
# :math:`\eta = 0.1` its collapse comes later than the ODE's (here solved by ``dopri5``), while
# projected Euler at the same step stays close to it.  16 systems in :math:`d = 8`, :math:`\beta = 4`.
import matplotlib.pyplot as plt

x0 = initial_points(8, 0, 16)
fig, ax = plt.subplots(figsize=(5.5, 3.6), layout="constrained")
for scheme, style in (("original", "-"), ("projected", "--"), ("dopri5", "k:")):
    t, f = pair_fraction_curves(x0, 4.0, scheme, 12.0)
    ax.plot(
        t,
        f.mean(axis=1),
        style,
        label=f"{scheme}: 0.5 at t = {crossing_time(t, f.mean(axis=1)):.2f}",
    )
ax.axvline(equiangular_time(4.0, 32), color="grey", lw=0.8, label=r"$t^*(4)$")
ax.set_xlabel("t (time = depth)")
ax.set_ylabel("mean fraction of pairs > 0.999")
ax.legend(fontsize=8)
