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
        assert (
            "SA, β = 4" in title
            and "n = 24 tokens" in title
            and f"(d = {int(name[-1]) + 1})" in title
        )
    if name.startswith("density"):
        assert "cells" in title and "β = 2" in title and "(d = " in title
    series = [a for a in fig.axes if a.get_xlabel() == "t" and a.get_label() != "<colorbar>"]
    assert series  # a time-series panel on every default figure
    assert not any("ascended" in a.get_ylabel() for a in fig.axes)
    assert fig not in [
        plt.figure(n) for n in plt.get_fignums()
    ]  # written figures are not left in pyplot


def test_describe_reads_like_a_title(runs):
    assert wp.describe(runs["particles_s2"]) == "SA, β = 4 — n = 24 tokens on S² (d = 3), dopri5"
    fv = wp.describe(runs["density_s1"])
    assert fv.startswith("finite volume — ") and fv.endswith(
        "CircleMesh, n = 48 cells on S¹ (d = 2)"
    )
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
    ax = wflow.plot.plot_zonal(r, index=[0, 2])
    assert ax.get_xlabel() and ax.get_ylabel() and ax.get_yscale() == "log" and len(ax.lines) == 2
    z = 0.5 * (r.edges[1:] + r.edges[:-1])
    np.testing.assert_allclose(ax.lines[-1].get_ydata(), r.law_density(2))
    np.testing.assert_allclose(ax.lines[-1].get_xdata(), z)
    with pytest.raises(TypeError, match="plot_zonal draws zonal runs"):
        wflow.plot.plot_zonal(next(iter(runs.values())))


# ------------------------------------------------------------------ figures that show the dynamics
def test_snapshot_times_bracket_the_largest_change():
    """A run whose order parameter jumps near t = 6 of 30: the snapshots are taken around the jump (equally
    spaced times, 0 10 20 30, take none within three widths of it), the largest one-save change lies between
    two of them, a steady series gives equally spaced times, a constant one too."""
    from wflow.plot._draw import progress_indices, snapshot_indices

    t = np.linspace(0, 30, 61)
    s = 1 / (1 + np.exp(-(t - 6.0) / 0.8))
    j = int(np.argmax(np.abs(np.diff(s))))  # the largest change: between saves j and j + 1

    def bracket(idx):  # the two snapshots around the largest change
        return t[idx[idx <= j].max()], t[idx[idx >= j + 1].min()]

    for n in (4, 5, 6):
        idx = progress_indices(t, s, n)
        assert len(idx) == n and idx[0] == 0 and idx[-1] == 60 and np.all(np.diff(idx) > 0)
        before, after = bracket(idx)
        assert after - before < 0.7 * 30 / (n - 1)  # tighter than equally spaced snapshots
        assert after - 6.0 <= 3 * 0.8  # one is taken while the jump happens
        near = np.abs(t[idx] - 6.0) <= 3 * 0.8
        assert near.sum() >= (n - 2) // 2  # about half the interior snapshots follow the change
    before, after = bracket(snapshot_indices(61, 4))
    assert (before, after) == (0.0, 10.0)  # equally spaced: the jump falls between 0 and 10
    assert not np.any(np.abs(t[snapshot_indices(61, 4)] - 6.0) <= 3 * 0.8)
    np.testing.assert_array_equal(progress_indices(t, t, 4), [0, 20, 40, 60])
    np.testing.assert_array_equal(progress_indices(t, np.ones(61), 4), snapshot_indices(61, 4))
    # log progress: N_eff from 18 to 2, 18 to 6 is half the way
    ne = np.exp(np.linspace(np.log(18), np.log(2), 61))
    np.testing.assert_array_equal(progress_indices(t, ne, 3, log=True, weight=1.0), [0, 30, 60])


def test_particle_summary_shows_n_eff_and_chooses_times_from_it(runs, tmp_path):
    from wflow.plot._draw import progress_indices

    r = runs["particles_s2"]
    fig = wp.plot_trajectory(r, tmp_path / "p.png")
    ne = r.diagnostics["n_eff"]
    np.testing.assert_array_equal(fig.wflow_snapshots, progress_indices(r.times, ne, 4, log=True))
    labels = [a.get_ylabel() for a in fig.axes]
    assert "effective clusters N_eff (β = 4)" in labels and "energy E_β (non-decreasing)" in labels
    assert not any(
        lab.startswith("clusters (single linkage") for lab in labels
    )  # N_eff replaces it
    n_eff_ax = next(a for a in fig.axes if a.get_ylabel().startswith("effective clusters"))
    np.testing.assert_allclose(n_eff_ax.lines[0].get_ydata(), ne)
    reference = [ln for ln in n_eff_ax.lines if ln.get_label() == "uniform measure"]
    assert reference and reference[0].get_ydata()[0] == pytest.approx(
        8 / (1 - np.exp(-8)), rel=1e-13
    )


def _spike_view(n_cells=4096, k=40, spike=50.0):
    from wflow.plot._views import CentersMesh, DensitiesView

    th = 2 * np.pi * (np.arange(n_cells) + 0.5) / n_cells
    centers = np.stack([np.cos(th), np.sin(th)], axis=1)
    values = np.full((k, n_cells), 1e-3)
    values[17, 1234] = spike  # one cell at one save
    values[25:, 3001] = 0.5 * spike  # a one-cell cluster that persists
    return DensitiesView(
        "density", np.linspace(0, 10, k), values, centers, mesh=CentersMesh(centers)
    )


@pytest.mark.parametrize("size", [(2.0, 1.5), (4.0, 3.0), (12.0, 8.0)])
def test_heat_map_keeps_a_one_cell_peak_whatever_the_image_size(size):
    """4096 cells drawn in a few hundred pixels: the drawn array is max-pooled, so its maximum is the data's
    and the peak's colour is in the rendered image."""
    view = _spike_view()
    fig = plt.figure(figsize=size, dpi=100)
    ax = wp.plot_density(view, ax=fig.add_subplot(), colorbar=False)
    mesh = ax.collections[0]
    drawn = np.ma.masked_invalid(mesh.get_array())
    assert drawn.max() == view.values.max() == 50.0
    width_px = size[0] * 100
    assert drawn.shape[-1] <= width_px / 3 + 1  # each drawn cell covers about three pixels or more
    img = _rendered(fig)[..., :3].astype(int)
    for value in (50.0, 25.0):  # the spike and the persistent cluster are both in the picture
        rgb = np.round(np.asarray(mesh.cmap(mesh.norm(value))[:3]) * 255).astype(int)
        assert np.any(np.all(np.abs(img - rgb) <= 2, axis=-1)), (value, size)


def test_max_pool_against_a_loop():
    from wflow.plot._draw import max_pool

    rng = np.random.default_rng(0)
    cells = np.sort(np.concatenate([[0.0, 1.0], rng.uniform(0, 1, 99)]))
    v = rng.uniform(size=(3, 100))
    bins = np.linspace(0, 1, 13)
    out = max_pool(v, cells, bins)
    for j in range(12):
        over = (cells[:-1] < bins[j + 1]) & (cells[1:] > bins[j])
        np.testing.assert_array_equal(out[:, j], v[:, over].max(axis=1))


def test_zonal_summary_shows_the_collapse_while_it_happens_with_a_time_series(tmp_path):
    """SA at beta = 9 in d = 32 from a uniform law drifting to the pole: the collapse is over long before
    t_end; the snapshots are taken while the mean of z moves, and the figure has time series and a title
    with the model, beta, n and d."""
    r = wflow.solve_zonal(
        wflow.SA(beta=9.0),
        lambda z: np.exp(2 * z),
        30.0,
        d=32,
        n_cells=64,
        save_at=np.linspace(0, 30, 31),
    )
    fig = wp.plot_trajectory(r, tmp_path / "z.png")
    m = np.asarray(r.mean_z)
    done = r.times[np.argmax(m >= m[0] + 0.99 * (m[-1] - m[0]))]
    assert done < 15
    shown = r.times[fig.wflow_snapshots]
    assert shown[0] == 0 and shown[-1] == 30 and np.sum((shown > 0) & (shown <= done)) >= 2
    title = fig.get_suptitle()
    assert "SA, β = 9" in title and "n = 64 bands" in title and "(d = 32)" in title
    labels = [a.get_ylabel() for a in fig.axes]
    assert "mean of z = <x, e>" in labels and "energy E_β (non-decreasing)" in labels
    law = next(a for a in fig.axes if a.get_title() == "law of z at the snapshot times")
    assert len(law.lines) == len(shown)


def test_sweep_figure_is_the_mean_phase_diagram_per_d():
    import json

    import xarray as xr

    rng = np.random.default_rng(0)
    t, beta, d = np.linspace(0, 10, 21), [1.0, 3.0, 5.0], [8, 32]
    pf = rng.uniform(size=(3, 2, 4, 21))
    status = np.zeros((3, 2, 4), np.int8)
    status[1, 0, 2] = -1  # a failed point: left out of the mean
    pf[1, 0, 2] = np.nan
    ds = xr.Dataset(
        {
            "pair_fraction": (("beta", "d", "seed", "time"), pf),
            "status": (("beta", "d", "seed"), status),
        },
        coords={"beta": beta, "d": d, "seed": np.arange(4), "time": t},
        attrs={
            "dims": json.dumps({"model.beta": "beta", "init.d": "d", "init.seed": "seed"}),
            "base_config": json.dumps({"model.type": "SA", "init.n": 32}),
        },
    )
    fig = wp.plot_sweep(ds)
    panels = [a for a in fig.axes if a.get_label() != "<colorbar>"]
    assert [a.get_title() for a in panels] == ["d = 8", "d = 32"]
    assert [(a.get_xlabel(), a.get_ylabel()) for a in panels] == [("β", "t")] * 2
    drawn = np.asarray(panels[0].collections[0].get_array()).reshape(21, 3)
    np.testing.assert_allclose(drawn, np.nanmean(pf[:, 0], axis=1).T, rtol=1e-15)
    title = fig.get_suptitle()
    assert "phase diagram" in title and "SA, n = 32" in title and "mean over 4 seeds" in title
    with pytest.raises(ValueError, match="observable must be one of"):
        wp.plot_sweep(ds, observable="nope")
