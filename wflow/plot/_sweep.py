"""The default figure of a sweep (the one ``wflow sweep`` writes): the phase diagram's heat map, one panel per d."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from ._draw import new_figure, pooled_heatmap, save_figure

__all__ = ["plot_sweep", "SWEEP_LABELS"]

#: what a sweep's observables are, for colour bars and titles
SWEEP_LABELS = {
    "pair_fraction": "fraction of token pairs with <xᵢ, xⱼ> > 0.999",
    "order_parameter": "order parameter |Σ wᵢ xᵢ|",
    "n_eff": "effective clusters N_eff",
    "n_clusters": "clusters (single linkage)",
    "energy": "energy E_β",
    "log_energy": "log E_β",
    "mean_z": "mean of z = <x, e>",
    "free_energy": "free energy Φ",
    "mass": "mass",
}
_PREFERRED = ("pair_fraction", "order_parameter", "n_eff", "mean_z", "energy", "n_clusters")


def plot_sweep(
    ds: Any,
    path: str | Path | None = None,
    *,
    observable: str | None = None,
    x: str | None = None,
    panels: str | None = None,
    fig: Any = None,
    title: str | None = None,
    cmap: str = "viridis",
    dpi: int = 110,
):
    r"""The phase diagram of a sweep: the mean of an observable over seeds on the (grid key, time) plane,
    one panel per dimension ``d`` (the figure ``wflow sweep`` writes beside its store).

    For the GLPR phase diagram (a grid over ``model.beta``, ``init.d`` and ``init.seed``) each panel is
    :math:`\beta` across, :math:`t` up, coloured by the mean fraction of token pairs with
    :math:`\langle x_i, x_j\rangle > 0.999`, its :math:`\tfrac12` level drawn as a white line.  Failed
    points are left out of the mean; other grid axes are shown at their first value.

    Parameters
    ----------
    ds : xarray.Dataset
        A sweep store (:func:`wflow.sweep.open_sweep`, or what :func:`wflow.sweep.sweep` returns).
    path : str or Path, optional
        Write the figure there; it is then not registered with pyplot.
    observable : str, optional
        Default: the first the sweep recorded of ``pair_fraction``, the order parameter, N_eff, the
        mean of z, the energy, the cluster count.
    x : str, optional
        The dimension across (default: that of ``model.beta``, else the first other grid dimension).
    panels : str, optional
        One panel per value of this dimension (default: that of ``init.d`` when the grid has it).
    fig : matplotlib Figure, optional
    title : str, optional
    cmap : str
    dpi : int

    Returns
    -------
    matplotlib.figure.Figure

    Examples
    --------
    >>> import matplotlib; matplotlib.use("Agg")
    >>> import json, numpy as np, xarray as xr
    >>> t, beta, d = np.linspace(0, 10, 11), [1.0, 4.0], [8, 32]
    >>> pf = np.broadcast_to(np.clip(t / 10, 0, 1), (2, 2, 3, 11))  # (beta, d, seed, time)
    >>> ds = xr.Dataset({"pair_fraction": (("beta", "d", "seed", "time"), pf),
    ...                  "status": (("beta", "d", "seed"), np.zeros((2, 2, 3), np.int8))},
    ...                 coords={"beta": beta, "d": d, "seed": [0, 1, 2], "time": t},
    ...                 attrs={"dims": json.dumps({"model.beta": "beta", "init.d": "d", "init.seed": "seed"}),
    ...                        "base_config": json.dumps({"model.type": "SA", "init.n": 32})})
    >>> fig = plot_sweep(ds)
    >>> [a.get_title() for a in fig.axes if a.get_label() != "<colorbar>"]
    ['d = 8', 'd = 32']
    """
    dims, base = _json_attr(ds, "dims"), _json_attr(ds, "base_config")
    observable, x, panels, grid_dims = _choose_axes(ds, dims, observable, x, panels)
    seed = dims.get("init.seed")
    data = ds[observable]
    if "status" in ds:  # failed points are left out of the mean
        data = data.where(ds["status"] >= 0)
    fixed = {dim: 0 for dim in grid_dims if dim not in (x, panels)}
    if fixed:
        data = data.isel(fixed)
    if seed in data.dims:
        n_seeds = int(data.sizes[seed])
        data = data.mean(seed, skipna=True)
    else:
        n_seeds = 1
    data = data.load()
    values = [None] if panels is None else list(np.asarray(ds[panels].values))
    fig = new_figure(fig, path=path, figsize=(max(4.2 * len(values), 6.0), 4.4))
    axes = [fig.add_subplot(1, len(values), j + 1) for j in range(len(values))]
    from matplotlib.colors import Normalize

    finite = np.asarray(data.values, dtype=float)
    finite = finite[np.isfinite(finite)]
    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    if observable == "pair_fraction":
        lo, hi = 0.0, 1.0
    norm = Normalize(lo, hi if hi > lo else lo + 1.0)
    xs = np.asarray(ds[x].values, dtype=float)
    order = np.argsort(xs)
    times = np.asarray(ds["time"].values, dtype=float)
    art = None
    for ax, value in zip(axes, values):
        panel = data if panels is None else data.sel({panels: value})
        z = np.asarray(panel.transpose("time", x).values, dtype=float)[:, order]
        art = pooled_heatmap(ax, xs[order], times, z, norm=norm, cmap=cmap)
        if observable == "pair_fraction" and np.nanmin(z) < 0.5 < np.nanmax(z) and len(xs) > 1:
            ax.contour(xs[order], times, z, levels=[0.5], colors="white", linewidths=1.2)
        ax.set(xlabel=_axis_label(x, dims), ylabel="t")
        ax.set_title("" if panels is None else f"{_axis_label(panels, dims)} = {_fmt(value)}")
    fig.colorbar(art, ax=axes, label=f"{SWEEP_LABELS.get(observable, observable)} (mean)")
    if title is None:
        title = _title(ds, base, observable, panels, n_seeds, fixed)
    fig.suptitle(title)
    save_figure(fig, path, dpi)
    return fig


def _json_attr(ds: Any, name: str) -> dict[str, Any]:
    """The JSON dictionary a sweep store keeps in attribute ``name`` (empty when absent or unreadable)."""
    try:
        return json.loads(ds.attrs.get(name, "{}"))
    except (TypeError, ValueError):
        return {}


def _choose_axes(
    ds: Any, dims: dict[str, str], observable: str | None, x: str | None, panels: str | None
) -> tuple[str, str, str | None, list[str]]:
    """What :func:`plot_sweep` draws: ``(observable, x, panels, grid dimensions)``, defaults filled in."""
    names = [v for v in ds.data_vars if "time" in ds[v].dims]
    if observable is None:
        observable = next((n for n in _PREFERRED if n in names), names[0] if names else None)
    if observable is None or observable not in names:
        raise ValueError(
            f"observable must be one of the sweep's time series {names}, got {observable!r}"
        )
    seed = dims.get("init.seed")
    grid_dims = [dim for dim in ds[observable].dims if dim not in ("time", seed)]
    if panels is None:
        panels = dims.get("init.d") if dims.get("init.d") in grid_dims else None
    if x is None:
        beta = dims.get("model.beta")
        x = beta if beta in grid_dims and beta != panels else None
        x = x or next((dim for dim in grid_dims if dim != panels), None)
    for name, value in (("x", x), ("panels", panels)):
        if value is not None and value not in grid_dims:
            raise ValueError(
                f"{name} must be one of the sweep's grid dimensions {grid_dims}, got {value!r}"
            )
    if x is None:
        raise ValueError(f"the sweep has no grid dimension to draw across ({grid_dims})")
    return observable, x, panels, grid_dims


def _title(
    ds: Any,
    base: dict[str, Any],
    observable: str,
    panels: str | None,
    n_seeds: int,
    fixed: dict[str, int],
) -> str:
    """The figure's title: the observable, the model, the seeds averaged and the axes held fixed."""
    model = base.get("model.type", "")
    parts = [f"phase diagram: {SWEEP_LABELS.get(observable, observable)}"]
    parts.append(
        ", ".join(p for p in (model, f"n = {base['init.n']}" if "init.n" in base else "") if p)
    )
    if panels is None and "init.d" in base:
        parts[-1] += f", d = {base['init.d']}"
    parts.append(f"mean over {n_seeds} seeds" if n_seeds > 1 else "")
    if fixed:
        parts.append(", ".join(f"{k} = {_fmt(ds[k].values[0])}" for k in fixed))
    return " — ".join(p for p in parts if p)


def _axis_label(dim: str, dims: dict[str, str]) -> str:
    key = next((k for k, v in dims.items() if v == dim), dim)
    return {"model.beta": "β", "init.d": "d", "init.n": "n", "model.gamma": "γ"}.get(key, dim)


def _fmt(value: Any) -> str:
    v = value.item() if isinstance(value, np.generic) else value
    return f"{v:g}" if isinstance(v, float) else str(v)
