"""Figures (matplotlib, Agg): snapshots on the sphere and diagnostics against time."""
from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["plot_trajectory"]


def _project3(x: np.ndarray) -> np.ndarray:
    """Coordinates for a 3-d picture: as is for d = 3, first three principal axes for d > 3."""
    if x.shape[-1] == 3:
        return x
    c = x - x.mean(axis=0)
    _, _, vt = np.linalg.svd(c, full_matrices=False)
    return x @ vt[:3].T


def plot_trajectory(traj, path: str | Path | None = None, *, n_snapshots: int = 4, system: int = 0):
    """Snapshots at a few times (circle or sphere) above energy and cluster count against time.

    Returns the figure; writes it to ``path`` (PNG) when given.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    times = traj.times
    pts = traj.points
    batch = pts.shape[1:-2]
    if batch:
        pts = pts.reshape((len(times), -1) + pts.shape[-2:])[:, system]
    d = pts.shape[-1]
    idx = np.unique(np.linspace(0, len(times) - 1, min(n_snapshots, len(times))).round().astype(int))
    fig = plt.figure(figsize=(3.2 * len(idx), 6.4), constrained_layout=True)
    gs = fig.add_gridspec(2, len(idx))
    for col, i in enumerate(idx):
        if d == 2:
            ax = fig.add_subplot(gs[0, col])
            th = np.linspace(0, 2 * np.pi, 200)
            ax.plot(np.cos(th), np.sin(th), color="0.8", lw=0.8)
            ax.scatter(pts[i, :, 0], pts[i, :, 1], s=6, alpha=0.6)
            ax.set_aspect("equal")
            ax.axis("off")
        else:
            ax = fig.add_subplot(gs[0, col], projection="3d")
            p = _project3(pts[i])
            ax.scatter(p[:, 0], p[:, 1], p[:, 2], s=2, alpha=0.5)
            ax.set_box_aspect((1, 1, 1))
            ax.set_xticks([]), ax.set_yticks([]), ax.set_zticks([])
        ax.set_title(f"t = {times[i]:.3g}")
    ax_e = fig.add_subplot(gs[1, : max(1, len(idx) // 2)])
    energy = traj.diagnostics["energy"]
    energy = energy.reshape(len(times), -1)[:, system] if batch else energy
    if np.all(np.isnan(energy)):
        op = traj.diagnostics["order_parameter"]
        op = op.reshape(len(times), -1)[:, system] if batch else op
        ax_e.plot(times, op, marker=".")
        ax_e.set_ylabel("order parameter |Σ w x|")
    else:
        ax_e.plot(times, energy, marker=".")
        ax_e.set_ylabel("energy")
    ax_e.set_xlabel("t")
    ax_c = fig.add_subplot(gs[1, max(1, len(idx) // 2):] if len(idx) > 1 else gs[1, 0])
    nc = traj.diagnostics["n_clusters"]
    nc = nc.reshape(len(times), -1)[:, system] if batch else nc
    ax_c.step(times, nc, where="post")
    ax_c.set_yscale("log")
    ax_c.set_xlabel("t")
    ax_c.set_ylabel(f"clusters (threshold {traj.config.get('cluster_threshold', 0.1):g})")
    fig.suptitle(f"{traj.config.get('model', {}).get('type', '')} — n={traj.config.get('n')}, d={d}")
    if path is not None:
        fig.savefig(path, dpi=110)
        plt.close(fig)
    return fig


def plot_density(times: np.ndarray, values: np.ndarray, centers: np.ndarray, path: str | Path | None = None, *,
                 energy: np.ndarray | None = None, n_snapshots: int = 4, title: str = ""):
    """Continuum runs: a theta-t heat map on the circle, Mollweide maps at a few times on S^2.

    ``values`` has shape ``(k, M)`` (cell averages), ``centers`` shape ``(M, d)``.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    d = centers.shape[1]
    if d == 2:
        theta = np.mod(np.arctan2(centers[:, 1], centers[:, 0]), 2 * np.pi)
        order = np.argsort(theta)
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), constrained_layout=True,
                                 gridspec_kw={"width_ratios": [3, 2]})
        im = axes[0].pcolormesh(theta[order], times, values[:, order], shading="nearest", cmap="magma")
        fig.colorbar(im, ax=axes[0], label="density")
        axes[0].set_xlabel("θ")
        axes[0].set_ylabel("t")
        ax = axes[1]
    else:
        idx = np.unique(np.linspace(0, len(times) - 1, min(n_snapshots, len(times))).round().astype(int))
        fig = plt.figure(figsize=(3.6 * len(idx), 5.5), constrained_layout=True)
        gs = fig.add_gridspec(2, len(idx))
        lon = np.arctan2(centers[:, 1], centers[:, 0])
        lat = np.arcsin(np.clip(centers[:, 2], -1, 1))
        for col, i in enumerate(idx):
            a = fig.add_subplot(gs[0, col], projection="mollweide")
            sc = a.scatter(lon, lat, c=values[i], s=4, cmap="magma", linewidths=0)
            a.set_xticklabels([])
            a.set_yticklabels([])
            a.set_title(f"t = {times[i]:.3g}")
            fig.colorbar(sc, ax=a, orientation="horizontal", fraction=0.05)
        ax = fig.add_subplot(gs[1, :])
    if energy is not None and np.any(np.isfinite(energy)):
        ax.plot(times, energy, marker=".")
        ax.set_ylabel("energy")
    else:
        ax.plot(times, values.max(axis=1), marker=".")
        ax.set_ylabel("max density")
    ax.set_xlabel("t")
    fig.suptitle(title)
    if path is not None:
        fig.savefig(path, dpi=110)
        plt.close(fig)
    return fig
