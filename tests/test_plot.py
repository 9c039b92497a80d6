"""wflow.plot: one figure test per plotting function, on tiny runs of every result kind."""

import matplotlib

matplotlib.use("Agg")  # the test selects the backend; wflow.plot never does

import matplotlib.pyplot as plt
import numpy as np
import pytest

import wflow
from wflow import plot as wp
from wflow.solvers.jko import jko


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


@pytest.fixture(scope="module")
def runs():
    """One small result of each kind (about 1 s in all with the numpy backend)."""
    saves = np.linspace(0.0, 2.0, 5)
    out = {
        "particles_s1": wflow.simulate(
            wflow.SA(beta=4.0),
            wflow.sphere.uniform(24, 2, seed=0),
            2.0,
            save_at=saves,
            backend="numpy",
        ),
        "particles_s2": wflow.simulate(
            wflow.SA(beta=4.0),
            wflow.sphere.uniform(24, 3, seed=0),
            2.0,
            save_at=saves,
            backend="numpy",
        ),
    }
    rho1 = wflow.Density.from_function(wflow.CircleMesh(48), lambda x: 1 + 0.2 * x[:, 0])
    rho2 = wflow.Density.from_function(wflow.SphereMesh(3), lambda x: 1 + 0.3 * x[:, 2])
    out["density_s1"] = wflow.solve_density(
        wflow.USA(beta=2.0), rho1, 1.0, save_at=np.linspace(0, 1, 4), backend="numpy"
    )
    out["density_s2"] = wflow.solve_density(
        wflow.USA(beta=2.0), rho2, 0.5, save_at=np.linspace(0, 0.5, 3), backend="numpy"
    )
    out["jko_s1"] = jko(wflow.USA(beta=2.0), rho1, 0.1, 3, backend="numpy")
    out["jko_s2"] = jko(wflow.USA(beta=2.0), rho2, 0.1, 2, backend="numpy")
    out["lagrangian_s1"] = wflow.solve_lagrangian(
        wflow.SA(beta=2.0),
        lambda x: 1 + 0.3 * x[:, 0],
        1.0,
        d=2,
        nodes=32,
        save_at=np.linspace(0, 1, 3),
        backend="numpy",
    )
    return out


def _rendered(fig) -> np.ndarray:
    fig.canvas.draw()
    img = np.asarray(fig.canvas.buffer_rgba())
    assert img.shape[0] > 50 and img.shape[1] > 50
    assert img[..., :3].std() > 0  # something was drawn
    return img


def _labelled(ax) -> bool:
    return bool(ax.get_xlabel()) and bool(ax.get_ylabel())


def test_import_does_not_touch_the_backend():
    before = matplotlib.get_backend()
    import importlib

    importlib.reload(wp)
    assert matplotlib.get_backend() == before


def test_importing_wflow_plot_does_not_import_matplotlib():
    import subprocess
    import sys

    code = "import sys, wflow, wflow.plot; print('matplotlib' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "False"


@pytest.mark.parametrize("name", ["particles_s1", "particles_s2"])
def test_plot_particles(runs, name):
    r = runs[name]
    ax = wp.plot_particles(r)
    _rendered(ax.figure)
    assert _labelled(ax)
    other = "circle" if name.endswith("s1") else "map"
    ax2 = wp.plot_particles(r, 2, view=other)
    _rendered(ax2.figure)
    assert _labelled(ax2)
    assert ax2.get_title() == f"t = {r.times[2]:.3g}"


def test_plot_particles_on_given_axes(runs):
    fig, (a, b) = plt.subplots(1, 2)
    assert wp.plot_particles(runs["particles_s1"], ax=a) is a
    assert wp.plot_particles(runs["particles_s1"], ax=b, view="circle") is b
    _rendered(fig)


def test_plot_particles_3d_sphere_outline(runs):
    ax = wp.plot_particles(runs["particles_s2"], view="3d")
    assert ax.name == "3d"
    assert len(ax.collections) >= 2  # wireframe outline and the points


def test_plot_particles_lagrangian_coloured_by_density(runs):
    ax = wp.plot_particles(runs["lagrangian_s1"], view="circle")
    _rendered(ax.figure)
    pts = ax.collections[-1]
    assert pts.get_array() is not None and isinstance(pts.norm, matplotlib.colors.LogNorm)


@pytest.mark.parametrize("name", ["density_s1", "jko_s1", "lagrangian_s1"])
def test_plot_density_circle_heatmap_log(runs, name):
    ax = wp.plot_density(runs[name])
    _rendered(ax.figure)
    assert _labelled(ax)
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("θ", "t")
    assert isinstance(ax.collections[0].norm, matplotlib.colors.LogNorm)
    ax = wp.plot_density(runs[name], view="profile")
    assert _labelled(ax)
    assert ax.get_yscale() == "log"


@pytest.mark.parametrize("name", ["density_s2", "jko_s2"])
def test_plot_density_sphere_maps_share_one_colour_scale(runs, name):
    r = runs[name]
    fig = wp.plot_density(r, norm="linear")
    _rendered(fig)
    maps = [a for a in fig.axes if a.name == "mollweide"]
    assert len(maps) == len(r.times)
    cells = [a.collections[0] for a in maps]
    n_cells = r.mesh.n_cells
    assert all(len(c.get_paths()) >= n_cells for c in cells)  # filled cells, not dots
    lims = {(c.norm.vmin, c.norm.vmax) for c in cells}
    assert len(lims) == 1
    values = np.asarray(r.values)
    assert lims.pop() == pytest.approx((values.min(), values.max()))
    assert sum(1 for a in fig.axes if a.get_label() == "<colorbar>") == 1
    assert all(_labelled(a) for a in maps)


def test_plot_density_single_map_on_given_axes(runs):
    fig = plt.figure()
    ax = fig.add_subplot(projection="mollweide")
    assert wp.plot_density(runs["density_s2"], 1, ax=ax) is ax
    _rendered(fig)
    assert ax.get_title().startswith("t = ")


def test_plot_density_legacy_arrays(runs, tmp_path):
    r = runs["density_s2"]
    fig = wp.plot_density(
        r.times, r.values, r.mesh.centers, tmp_path / "a.png", energy=r.energy, title="run"
    )
    assert (tmp_path / "a.png").stat().st_size > 1000
    assert fig.get_suptitle() == "run"


@pytest.mark.parametrize("name", ["particles_s2", "density_s1", "jko_s1", "lagrangian_s1"])
def test_plot_energy(runs, name):
    ax = wp.plot_energy(runs[name])
    _rendered(ax.figure)
    assert _labelled(ax)
    assert not ax.yaxis.get_major_formatter().get_useOffset()


def test_plot_energy_free_energy_and_missing(runs):
    ax = wp.plot_energy(runs["jko_s1"], which="free_energy")
    assert "free energy" in ax.get_ylabel()
    x = wflow.sphere.uniform(8, 3, seed=1)
    traj = wflow.simulate(wflow.SA(beta=1.0, V=-2 * np.eye(3)), x, 0.2, backend="numpy")
    with pytest.raises(ValueError, match="no energy"):
        wp.plot_energy(traj)
    _rendered(wp.plot_diagnostics(traj))  # the order parameter and clusters are still there


@pytest.mark.parametrize("name", ["particles_s1", "density_s2", "jko_s2", "lagrangian_s1"])
def test_plot_diagnostics(runs, name):
    fig = wp.plot_diagnostics(runs[name])
    _rendered(fig)
    assert fig.axes and all(_labelled(a) for a in fig.axes)


@pytest.mark.parametrize(
    "name",
    [
        "particles_s1",
        "particles_s2",
        "density_s1",
        "density_s2",
        "jko_s1",
        "jko_s2",
        "lagrangian_s1",
    ],
)
def test_plot_trajectory_every_kind(runs, name, tmp_path):
    path = tmp_path / f"{name}.png"
    fig = wp.plot_trajectory(runs[name], path)
    assert path.stat().st_size > 1000
    title = fig.get_suptitle()
    assert "{" not in title and title  # a sentence, not JSON
    if name.startswith("particles"):
        assert "β = 4" in title and "24 tokens" in title
    if name.startswith("density"):
        assert "cells" in title
    assert fig not in [
        plt.figure(n) for n in plt.get_fignums()
    ]  # written figures are not left in pyplot


def test_describe_reads_like_a_title(runs):
    assert wp.describe(runs["particles_s2"]) == "SA, β = 4 — 24 tokens on S², dopri5"
    fv = wp.describe(runs["density_s1"])
    assert fv.startswith("finite volume — ") and fv.endswith("CircleMesh, 48 cells on S¹")
    if "model" in getattr(runs["density_s1"], "config", {}):
        assert "USA, β = 2" in fv
    assert wp.describe(runs["jko_s1"]).startswith("JKO, τ = 0.1")
    assert "SA, β = 2" in wp.describe(runs["lagrangian_s1"])


@pytest.mark.parametrize(
    "name,suffix",
    [
        ("particles_s1", ".gif"),
        ("particles_s2", ".gif"),
        ("density_s1", ".gif"),
        ("density_s2", ".gif"),
    ],
)
def test_animate_gif(runs, name, suffix, tmp_path):
    from PIL import Image

    path = wp.animate(runs[name], tmp_path / f"a{suffix}", fps=4, dpi=40)
    with Image.open(path) as im:
        assert im.n_frames == len(runs[name].times)


def test_animate_mp4_when_ffmpeg_is_installed(runs, tmp_path):
    pytest.importorskip("imageio_ffmpeg")
    path = wp.animate(runs["particles_s1"], tmp_path / "a.mp4", fps=4, dpi=40)
    assert path.stat().st_size > 0


def test_bad_input_names_the_kind_and_the_right_function(runs, tmp_path):
    with pytest.raises(TypeError, match=r"DensityTrajectory.*plot_density"):
        wp.plot_particles(runs["density_s1"])
    with pytest.raises(TypeError, match=r"Trajectory.*plot_particles"):
        wp.plot_density(runs["particles_s1"])
    with pytest.raises(TypeError, match="cannot draw a dict"):
        wp.plot_trajectory({"times": [0.0]})
    with pytest.raises(ValueError, match="view must be one of"):
        wp.plot_particles(runs["particles_s1"], view="3d")
    with pytest.raises(ValueError, match=r"\.gif or \.mp4"):
        wp.animate(runs["particles_s1"], tmp_path / "a.avi")
    with pytest.raises(IndexError, match="save index 99"):
        wp.plot_particles(runs["particles_s1"], 99, view="circle")


def test_batched_systems(tmp_path):
    x = wflow.sphere.uniform(10, 3, seed=0, batch=(3,))
    traj = wflow.simulate(wflow.SA(beta=2.0), x, 0.5, backend="numpy")
    wp.plot_trajectory(traj, tmp_path / "b.png", system=2)
    with pytest.raises(ValueError, match="system must be in"):
        wp.plot_particles(traj, system=3)


def test_plot_zonal_draws_the_law_and_names_the_right_function_for_other_kinds(runs):
    import wflow

    r = wflow.solve_zonal(
        wflow.SA(beta=2.0), lambda z: np.exp(z), 1.0, d=8, n_cells=32, save_at=[0.0, 0.5, 1.0]
    )
    ax = wflow.plot.plot_zonal(r, n_snapshots=2)
    assert ax.get_xlabel() and ax.get_ylabel() and ax.get_yscale() == "log" and len(ax.lines) == 2
    z = 0.5 * (r.edges[1:] + r.edges[:-1])
    np.testing.assert_allclose(ax.lines[-1].get_ydata(), r.law_density(2))
    np.testing.assert_allclose(ax.lines[-1].get_xdata(), z)
    with pytest.raises(TypeError, match="plot_zonal draws zonal runs"):
        wflow.plot.plot_zonal(next(iter(runs.values())))
