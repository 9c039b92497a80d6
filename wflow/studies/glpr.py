"""The GLPR phase diagram as one sweep: its configuration, its grid, the sweep and its heat maps.

Geshkovski, Letrouit, Polyanskiy & Rigollet, *A mathematical perspective on Transformers* (2023/2024),
draw the fraction of token pairs with cosine above 0.999 over :math:`(t, \beta)`, one panel per
dimension.  :func:`phase_diagram` is that computation as one :func:`wflow.sweep.sweep` (resumable
like any sweep), :func:`plot_phase_diagram` draws the heat maps of its store.  The study that
compares the published scheme with the ODE is :mod:`wflow.studies.phase_diagram`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..sweep import parse_values, sweep

__all__ = ["GLPR_CONFIG", "glpr_grid", "phase_diagram", "plot_phase_diagram"]

#: Geshkovski, Letrouit, Polyanskiy and Rigollet's phase diagram: SA with Q = K = V = I, n = 32 tokens,
#: their scheme ``x <- (x + 0.1 A x) / norm(x + 0.1 A x)`` (``euler-average``) until t = 30, 200 checkpoints, in the
#: coordinates of the initial span (exact; ``run.method`` and ``run.coordinates`` may be swept too)
GLPR_CONFIG: dict[str, Any] = {
    "problem": "particles",
    "model.type": "SA",
    "model.value": "identity",
    "init.kind": "uniform",
    "init.n": 32,
    "run.t_end": 30.0,
    "save.n": 200,
    "run.method": "euler-average",
    "run.dt": 0.1,
    "run.backend": "auto",
    "run.coordinates": "span",
    "perceptron.m": 0,
}


def glpr_grid(
    d: Sequence[int] = (8, 128, 1024), betas: Any = "linspace(0.1, 9, 90)", systems: int = 2048
) -> dict[str, list]:
    """The grid of the phase diagram: dimensions ``d``, inverse temperatures, ``systems`` seeds.

    Examples
    --------
    >>> from wflow.studies.glpr import glpr_grid
    >>> glpr_grid(d=(8,), betas="linspace(1, 2, 3)", systems=2)
    {'init.d': [8], 'model.beta': [1.0, 1.5, 2.0], 'init.seed': [0, 1]}
    >>> [len(v) for v in glpr_grid().values()]  # the full diagram: 3 x 90 x 2048 systems
    [3, 90, 2048]
    """
    return {
        "init.d": list(d),
        "model.beta": parse_values(betas, "model.beta"),
        "init.seed": list(range(systems)),
    }


def phase_diagram(
    out: str | os.PathLike,
    *,
    d: Sequence[int] = (8, 128, 1024),
    betas: Any = "linspace(0.1, 9, 90)",
    systems: int = 2048,
    config: Mapping[str, Any] | None = None,
    figure: str | os.PathLike | None = None,
    **kwargs,
):
    """Reproduce the GLPR phase diagram (fraction of pairs with cosine > 0.999 over (t, beta)) as a sweep.

    The full diagram (``d`` in {8, 128, 1024}, 90 betas in [0.1, 9], 2048 systems of 32 tokens,
    300 Euler steps, 200 checkpoints) is one call; ``config`` overrides :data:`GLPR_CONFIG`,
    ``kwargs`` go to :func:`wflow.sweep.sweep` (``scheduler``, ``workers``, ...).  With ``figure`` the heat
    maps (:func:`plot_phase_diagram`) are written there.  Returns the store as a Dataset.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> from wflow.studies.glpr import phase_diagram
    >>> out = pathlib.Path(tempfile.mkdtemp()) / "glpr.zarr"
    >>> ds = phase_diagram(out, d=(3,), betas=[1.0, 4.0], systems=2, workers=1, progress=False,
    ...                    config={"init.n": 8, "run.t_end": 1.0, "save.n": 3})  # doctest: +SKIP
    >>> ds.pair_fraction.dims, ds.pair_fraction.shape  # doctest: +SKIP
    (('d', 'beta', 'seed', 'time'), (1, 2, 2, 3))
    """
    kwargs.setdefault("observables", ("pair_fraction",))
    ds = sweep({**GLPR_CONFIG, **(config or {})}, glpr_grid(d, betas, systems), out=out, **kwargs)
    if figure is not None:
        plot_phase_diagram(ds, path=figure)
    return ds


def plot_phase_diagram(
    ds, *, ax=None, path: str | os.PathLike | None = None, observable: str = "pair_fraction"
):
    """Heat maps of ``observable`` averaged over seeds, over (t, beta), one panel per ``d``; returns the figure.

    Examples
    --------
    >>> import matplotlib; matplotlib.use("Agg")
    >>> import numpy as np, xarray as xr
    >>> from wflow.studies.glpr import plot_phase_diagram
    >>> ds = xr.Dataset(  # the layout of a sweep store, made by hand: 2 betas, 4 seeds, 3 save times
    ...     {"pair_fraction": (("beta", "seed", "time"), np.random.default_rng(0).random((2, 4, 3))),
    ...      "save_time": (("time",), [0.0, 0.5, 1.0])},
    ...     coords={"beta": [1.0, 4.0], "time": [0, 1, 2]})
    >>> fig = plot_phase_diagram(ds)
    >>> len(fig.axes), fig.axes[0].get_xlabel()  # one panel and its colour bar
    (2, 't')
    """
    da = ds[observable]
    if "seed" in da.dims:
        da = da.mean("seed")
    panels = (
        [("", da)]
        if "d" not in da.dims
        else [(f"d = {int(v)}", da.sel(d=v)) for v in da["d"].values]
    )
    if ax is None:
        figsize = (4.2 * len(panels), 3.6)
        if path is None:  # a pyplot figure (shown by notebooks and galleries)
            import matplotlib.pyplot as plt

            fig = plt.figure(figsize=figsize, layout="constrained")
        else:  # written to a file: no pyplot, no backend
            from matplotlib.figure import Figure

            fig = Figure(figsize=figsize, layout="constrained")
        axes = fig.subplots(1, len(panels), squeeze=False)[0]
    else:
        axes, fig = [ax], ax.figure
    for a, (title, p) in zip(axes, panels):
        p = p.transpose("beta", "time")
        t = ds["save_time"].isel({k: 0 for k in ds["save_time"].dims if k != "time"}).values
        t = np.where(np.isfinite(t), t, ds["time"].values)
        im = a.pcolormesh(
            t, p["beta"].values, p.values, shading="nearest", vmin=0, vmax=1, cmap="viridis"
        )
        a.set(xlabel="t", ylabel=r"$\beta$", title=title)
    fig.colorbar(im, ax=list(axes), label=f"{observable} (mean over systems)")
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig
