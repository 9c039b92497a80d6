"""What a run recorded at its saves (energy, order parameter, clusters, mass, maximum density) against time."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._draw import new_axes, new_figure
from ._views import densities_view, describe, particles_view, result_kind, type_name

#: the time series a summary figure draws, in order, where the run has them (the order parameter only
#: without an energy, the single-linkage count only without N_eff)
SUMMARY_SERIES = ("energy", "free_energy", "order_parameter", "n_eff", "n_clusters", "max_density")


def summary_series(diag: dict[str, np.ndarray]) -> list[str]:
    """The names of :data:`SUMMARY_SERIES` a summary figure draws for these diagnostics."""
    names = [n for n in SUMMARY_SERIES if n in diag and np.any(np.isfinite(diag[n]))]
    if "energy" in names and "order_parameter" in names:
        names.remove("order_parameter")
    if "n_eff" in names and "n_clusters" in names:
        names.remove("n_clusters")
    return names


def progress_series(diag: dict[str, np.ndarray]) -> tuple[str, np.ndarray, bool] | None:
    """The diagnostic whose change says how far a run has gone, ``(name, series, log)``: the mean of z
    (zonal runs), N_eff (log), the order parameter, the energy, the maximum density (log); or None."""
    for name, log in (
        ("mean_z", False),
        ("n_eff", True),
        ("order_parameter", False),
        ("energy", False),
        ("free_energy", False),
        ("max_density", True),
    ):
        v = diag.get(name)
        if v is not None and np.all(np.isfinite(v)) and np.ptp(v) > 0:
            return name, np.asarray(v, dtype=float), log
    return None


LABELS = {
    "energy": "energy E_β (non-decreasing)",
    "log_energy": "log E_β",
    "free_energy": "free energy Φ (non-increasing)",
    "n_eff": "effective clusters N_eff",
    "mean_z": "mean of z = <x, e>",
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
    dv = densities_view(result, system)
    diag = dict(dv.diagnostics)
    diag["max_density"] = dv.values.max(axis=1)
    dv.config.setdefault("d", dv.d)
    n_eff = n_eff_from_energy(diag.get("energy"), dv.config)
    if n_eff is not None:
        diag["n_eff"] = n_eff
    return dv.times, diag, dv.config


def n_eff_from_energy(energy: Any, cfg: dict[str, Any]) -> np.ndarray | None:
    r""":math:`N_{\mathrm{eff}} = e^{\beta - o}/(2\beta E_\beta)` from a recorded energy (:math:`o` = 0, or
    :math:`\beta` in the rescaled kernel) where the run's model is SA or USA with Q = K = V = I (the energy
    is then :math:`E_\beta` itself); None otherwise.  ``cfg["n_eff_beta"]`` is set to the :math:`\beta` used."""
    spec = cfg.get("model")
    if not isinstance(spec, dict) and cfg.get("attention") in ("SA", "USA"):  # a zonal run
        if cfg.get("sign", 1) < 0:
            return None
        spec = {
            "type": cfg["attention"],
            "beta": cfg.get("beta"),
            "kernel": cfg.get("kernel", "plain"),
        }
    if (
        energy is None
        or not isinstance(spec, dict)
        or spec.get("type") not in ("SA", "USA")
        or any(m in spec for m in ("Q", "K", "V", "gamma"))
        or not isinstance(spec.get("beta"), (int, float))
        or not spec["beta"] > 0
    ):
        return None
    beta = float(spec["beta"])
    e = np.asarray(energy, dtype=float)
    if not np.all(e > 0):
        return None
    offset = beta if spec.get("kernel") == "rescaled" else 0.0
    cfg["n_eff_beta"] = beta
    return np.exp(beta - offset - np.log(2 * beta * e))


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
    'energy E_β (non-decreasing)'
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

    Particles: energy :math:`E_\beta` (gradient flows), order parameter :math:`|\sum_i w_i x_i|`,
    the effective number of clusters :math:`N_{\mathrm{eff}}` (:func:`wflow.diagnostics.effective_clusters`),
    the single-linkage cluster count.  Densities: energy, free energy (JKO), mass, maximum density.

    :math:`N_{\mathrm{eff}} = 1/\iint e^{\beta(\langle x,y\rangle-1)}d\mu\,d\mu` reads :math:`k` for
    :math:`k` separated equal clusters.  The single-linkage count first counts percolation
    components of a uniform cloud, not clusters: it can rise before the clusters form.

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
    >>> len(fig.axes), fig.axes[0].get_ylabel()  # energy, order parameter, N_eff, clusters
    (4, 'energy E_β (non-decreasing)')
    """
    times, diag, cfg = diagnostic_series(result, system)
    every = (*SUMMARY_SERIES[:-1], "mass", "max_density")  # the summary's, and the mass
    names = [n for n in every if n in diag and np.any(np.isfinite(diag[n]))]
    fig = new_figure(fig, figsize=(3.6 * max(len(names), 1), 3.2))
    axes = [fig.add_subplot(1, max(len(names), 1), j + 1) for j in range(max(len(names), 1))]
    for ax, name in zip(axes, names):
        diag_panel(ax, times, name, diag[name], cfg)
    fig.suptitle(title if title is not None else describe(result))
    return fig


def diag_panel(
    ax: Any,
    times: np.ndarray,
    name: str,
    values: np.ndarray,
    cfg: dict[str, Any],
    marks: np.ndarray | None = None,
) -> None:
    """One time series on ``ax``; ``marks``: times drawn as faint vertical lines (the snapshots shown above)."""
    if name == "n_clusters":
        ax.step(times, values, where="post")
        if np.nanmax(values) > 10 * max(np.nanmin(values), 1):
            ax.set_yscale("log")
        thr = cfg.get("cluster_threshold", 0.1)
        ax.set_ylabel(f"clusters (single linkage, {float(thr):g} rad)")
    elif name == "n_eff":
        ax.plot(times, values, marker=".", ms=3)
        if np.nanmax(values) > 10 * max(np.nanmin(values), 1e-300):
            ax.set_yscale("log")
        beta = cfg.get("n_eff_beta")
        label = LABELS["n_eff"] + (
            f" (β = {float(beta):g})" if isinstance(beta, (int, float)) else ""
        )
        ax.set_ylabel(label)
        d = cfg.get("d")
        if isinstance(beta, (int, float)) and beta > 0 and isinstance(d, int) and d >= 2:
            from ..diagnostics import uniform_effective_clusters

            ax.axhline(
                uniform_effective_clusters(float(beta), d),
                color="0.6",
                lw=0.8,
                ls="--",
                label="uniform measure",
            )
            ax.legend(fontsize="x-small", loc="best")
    else:
        ax.plot(times, values, marker=".")
        plain_axis(ax)
        lo, hi = np.nanmin(values), np.nanmax(values)
        if name == "max_density" and lo > 0 and hi > 100 * lo:
            ax.set_yscale("log")
        ax.set_ylabel(LABELS.get(name, name))
    if marks is not None:
        for t in marks:
            ax.axvline(float(t), color="0.75", lw=0.7, ls=":", zorder=0)
    ax.set_xlabel("t")
