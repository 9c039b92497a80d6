"""What a run recorded at its saves (energy, order parameter, clusters, mass, maximum density) against time."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._draw import new_axes, new_figure
from ._views import densities_view, describe, particles_view, result_kind, type_name

__all__ = [
    "LABELS",
    "diagnostic_series",
    "plain_axis",
    "plot_energy",
    "plot_diagnostics",
    "diag_panel",
]


LABELS = {
    "energy": "energy E (ascended)",
    "free_energy": "free energy Φ (descended)",
    "order_parameter": "order parameter |Σ wᵢ xᵢ|",
    "mass": "mass",
    "max_density": "max density",
}


def diagnostic_series(
    result: Any, system: int
) -> tuple[np.ndarray, dict[str, np.ndarray], dict[str, Any]]:
    kind = result_kind(result)
    if kind in ("particles", "lagrangian"):
        v = particles_view(result, system)
        return v.times, dict(v.diagnostics), v.config
    v = densities_view(result, system)
    diag = dict(v.diagnostics)
    diag["max_density"] = v.values.max(axis=1)
    return v.times, diag, v.config


def plain_axis(ax: Any) -> None:
    from matplotlib.ticker import ScalarFormatter

    fmt = ScalarFormatter(useOffset=False)
    ax.yaxis.set_major_formatter(fmt)


def plot_energy(
    result: Any, *, ax: Any = None, system: int = 0, which: str = "energy", title: str | None = None
):
    r"""Energy of a gradient-flow run against time.

    Parameters
    ----------
    result : any wflow result
        Particles, densities, Lagrangian or JKO.
    ax : matplotlib Axes, optional
    system : int
        Which system of a batched run.
    which : {"energy", "free_energy"}
        ``"energy"``: the functional :math:`E` the flow ascends (non-decreasing);
        ``"free_energy"`` (JKO runs): :math:`\Phi = -E + \kappa^{-1}\int\rho\log\rho`,
        non-increasing.
    title : str, optional

    Returns
    -------
    matplotlib.axes.Axes

    Raises
    ------
    ValueError
        When the run has no such energy (the model is not a gradient flow).

    Examples
    --------
    >>> import matplotlib; matplotlib.use("Agg")
    >>> import wflow
    >>> traj = wflow.simulate(wflow.USA(beta=1.0), wflow.sphere.uniform(16, 3, seed=0), 1.0)
    >>> wflow.plot.plot_energy(traj).get_ylabel()
    'energy E (ascended)'
    """
    times, diag, _ = diagnostic_series(result, system)
    if which not in ("energy", "free_energy"):
        raise ValueError(f"which must be 'energy' or 'free_energy', got {which!r}")
    e = diag.get(which)
    if e is None or not np.any(np.isfinite(e)):
        raise ValueError(
            f"this {type_name(result)} has no {which.replace('_', ' ')} (the model is not a gradient flow, "
            f"or the solver does not record it); plot_diagnostics draws what it has"
        )
    ax = new_axes(ax, figsize=(5, 3.5))
    ax.plot(times, e, marker=".")
    plain_axis(ax)
    ax.set(xlabel="t", ylabel=LABELS[which])
    ax.set_title(title if title is not None else "")
    return ax


def plot_diagnostics(result: Any, *, fig: Any = None, system: int = 0, title: str | None = None):
    r"""Everything a run recorded at its save times, one panel each.

    Particles: energy (gradient flows), order parameter :math:`|\sum_i w_i x_i|`, cluster
    count.  Densities: energy, free energy (JKO), mass, maximum density.

    The cluster count is the number of connected components of the graph joining
    particles closer than the threshold (single linkage).  From a uniform start it first
    counts percolation components of a random point set, not clusters: it can rise
    before the clusters form and merge.

    Parameters
    ----------
    result : any wflow result
    fig : matplotlib Figure, optional
    system : int
    title : str, optional

    Returns
    -------
    matplotlib.figure.Figure

    Examples
    --------
    >>> import matplotlib; matplotlib.use("Agg")
    >>> import wflow
    >>> traj = wflow.simulate(wflow.SA(2.0), wflow.sphere.uniform(8, 3, seed=0), 0.5, dt=0.1, backend="numpy")
    >>> fig = wflow.plot.plot_diagnostics(traj)
    >>> len(fig.axes), fig.axes[0].get_ylabel()  # energy, order parameter, clusters
    (3, 'energy E (ascended)')
    """
    times, diag, cfg = diagnostic_series(result, system)
    names = [
        n
        for n in ("energy", "free_energy", "order_parameter", "n_clusters", "mass", "max_density")
        if n in diag and np.any(np.isfinite(diag[n]))
    ]
    fig = new_figure(fig, figsize=(3.6 * max(len(names), 1), 3.2))
    axes = [fig.add_subplot(1, max(len(names), 1), j + 1) for j in range(max(len(names), 1))]
    for ax, name in zip(axes, names):
        diag_panel(ax, times, name, diag[name], cfg)
    fig.suptitle(title if title is not None else describe(result))
    return fig


def diag_panel(
    ax: Any, times: np.ndarray, name: str, values: np.ndarray, cfg: dict[str, Any]
) -> None:
    if name == "n_clusters":
        ax.step(times, values, where="post")
        if np.nanmax(values) > 10 * max(np.nanmin(values), 1):
            ax.set_yscale("log")
        thr = cfg.get("cluster_threshold", 0.1)
        ax.set_ylabel(f"clusters (single linkage, {float(thr):g} rad)")
    else:
        ax.plot(times, values, marker=".")
        plain_axis(ax)
        ax.set_ylabel(LABELS.get(name, name))
    ax.set_xlabel("t")
