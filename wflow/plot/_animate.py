"""Animations of a run, one frame per save: GIF (Pillow) or MP4 (imageio-ffmpeg)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ._draw import circle_angles, color_norm, density_map
from ._particles import plot_particles
from ._views import densities_view, describe, particles_view, result_kind

__all__ = ["animate"]


def animate(
    result: Any,
    path: str | Path,
    *,
    fps: int = 10,
    system: int = 0,
    view: str | None = None,
    norm: str = "log",
    dpi: int = 100,
    title: str | None = None,
) -> Path:
    r"""Write an animation of a run, one frame per save: GIF (Pillow) or MP4.

    Particles on :math:`S^1` (circle) and :math:`S^2` (3-D sphere, or ``view="map"``); densities
    on :math:`S^1` (the profile) and :math:`S^2` (the cell map), on one scale for the whole run.

    Parameters
    ----------
    result : any wflow result
    path : str or Path
        ``.gif`` (Pillow, always available) or ``.mp4`` (needs the ``imageio-ffmpeg``
        package, or an ``ffmpeg`` on the PATH).
    fps : int
        Frames per second.
    system : int
        Which system of a batched run.
    view : str, optional
        ``"circle"``/``"3d"``/``"map"`` for particles, ``"profile"``/``"map"`` for densities.
    norm : {"log", "linear"}
        Colour or profile scale of densities.
    dpi : int
    title : str, optional
        Default :func:`describe`; the frame's time is added.

    Returns
    -------
    pathlib.Path
        ``path``.

    Examples
    --------
    >>> import wflow, tempfile, pathlib
    >>> traj = wflow.simulate(wflow.SA(beta=4.0), wflow.sphere.uniform(16, 2, seed=0), 1.0)
    >>> out = wflow.plot.animate(traj, pathlib.Path(tempfile.mkdtemp()) / "run.gif", fps=5)
    >>> out.suffix
    '.gif'
    """
    from matplotlib import animation
    from matplotlib.figure import Figure

    path = Path(path)
    if not isinstance(fps, (int, np.integer)) or fps < 1:
        raise ValueError(f"fps must be a positive integer, got {fps!r}")
    suffix = path.suffix.lower()
    if suffix == ".gif":
        writer = animation.PillowWriter(fps=int(fps))
    elif suffix == ".mp4":
        writer = _mp4_writer(int(fps))
    else:
        raise ValueError(f"path must end in .gif or .mp4, got {path.name!r}")
    kind = result_kind(result)
    head = title if title is not None else describe(result)
    fig = Figure(figsize=(6, 5), layout="constrained")
    if kind in ("particles", "lagrangian"):
        p = particles_view(result, system)
        view = view or ("circle" if p.d == 2 else "3d")
        if view not in ("circle", "3d", "map"):
            raise ValueError(f"view must be 'circle', '3d' or 'map' for particles, got {view!r}")
        proj = {"3d": "3d", "map": "mollweide"}.get(view)

        def draw(i: int) -> None:
            fig.clear()
            ax = fig.add_subplot(projection=proj)
            plot_particles(p, i, ax=ax, view=view, title=f"t = {p.times[i]:.3g}")
            fig.suptitle(head, fontsize="medium")

        frames = len(p.times)
    else:
        dens = densities_view(result, system, caller="animate")
        view = view or ("profile" if dens.d == 2 else "map")
        if (dens.d == 2) != (view == "profile"):
            raise ValueError(f"view must be 'profile' on S¹ and 'map' on S², got {view!r}")
        scale = color_norm(dens.values, norm, None, None)
        cache: dict = {}
        frames = len(dens.times)

        def draw(i: int) -> None:
            fig.clear()
            if view == "profile":
                ax = fig.add_subplot()
                th = circle_angles(dens.points(i))
                order = np.argsort(th)
                ax.plot(th[order], dens.values[i, order])
                if norm == "log":
                    ax.set_yscale("log")
                ax.set(
                    xlim=(0, 2 * np.pi),
                    ylim=(scale.vmin, scale.vmax),
                    xlabel="θ",
                    ylabel="density ρ",
                )
            else:
                ax = fig.add_subplot(projection="mollweide")
                art = density_map(ax, dens, i, scale, "magma", cache)
                fig.colorbar(art, ax=ax, label="density ρ", orientation="horizontal", shrink=0.6)
            ax.set_title(f"t = {dens.times[i]:.3g}")
            fig.suptitle(head, fontsize="medium")

    with writer.saving(fig, str(path), dpi):
        for i in range(frames):
            draw(i)
            writer.grab_frame()
    return path


def _mp4_writer(fps: int):
    import shutil

    import matplotlib
    from matplotlib import animation

    try:
        import imageio_ffmpeg

        matplotlib.rcParams["animation.ffmpeg_path"] = imageio_ffmpeg.get_ffmpeg_exe()
    except ImportError:
        if shutil.which(matplotlib.rcParams["animation.ffmpeg_path"]) is None:
            raise RuntimeError(
                "writing MP4 needs ffmpeg: pip install imageio-ffmpeg, or write a .gif"
            ) from None
    return animation.FFMpegWriter(fps=fps, codec="h264", extra_args=["-pix_fmt", "yuv420p"])
