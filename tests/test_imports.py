"""Import what is used: a particle run loads a small part of wflow; every other solver, result kind
and subpackage loads when first used, and is still listed by name before that."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import wflow
from wflow.solvers.base import KINDS, SOLVERS
from wflow.solvers.contract import Registry

#: what a particle run must not load
NOT_FOR_PARTICLES = (
    "wflow.solvers.jko",
    "wflow.solvers.zonal",
    "wflow.transport",
    "wflow.pretrained",
    "wflow.studies",
)


def fresh(code: str) -> dict:
    """Run ``code`` in a fresh interpreter; it prints one JSON object, returned here."""
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_particle_run_loads_at_most_50_modules_of_wflow():
    got = fresh(
        """
        import json, sys, wflow
        x = wflow.sphere.uniform(20, 3, seed=0)
        tr = wflow.simulate(wflow.SA(2.0), x, 1.0, dt=0.1)
        mods = sorted(m for m in sys.modules if m == "wflow" or m.startswith("wflow."))
        print(json.dumps({"modules": mods, "final": tr.points[-1].tolist()}))
        """
    )
    mods = got["modules"]
    assert len(mods) <= 50, mods
    assert not [m for m in mods if m.startswith(NOT_FOR_PARTICLES)], mods
    assert np.allclose(np.linalg.norm(got["final"], axis=-1), 1.0, atol=1e-12)  # the run ran


def test_a_solver_loads_its_module_when_first_looked_up():
    got = fresh(
        """
        import json, sys
        from wflow.solvers.base import SOLVERS, get_solver
        seen = {}
        for name, module in [("ssprk3", "wflow.solvers.steppers"), ("jko", "wflow.solvers.jko.step")]:
            before = module in sys.modules
            solver = get_solver(name)
            seen[name] = [before, module in sys.modules, solver.name, solver.order]
        seen["stability"] = "wflow.stability" in sys.modules  # JKO's stationary states only
        try:
            get_solver("rk5")
        except ValueError as exc:
            seen["error"] = str(exc)
        print(json.dumps(seen))
        """
    )
    assert got["ssprk3"] == [False, True, "ssprk3", 3]
    assert got["jko"] == [False, True, "jko", 1] and got["stability"] is False
    assert "'jko'" in got["error"] and "(did you mean 'rk4'?)" in got["error"]


def test_every_name_of_the_jko_package_resolves():
    import wflow.solvers.jko as package

    assert all(getattr(package, name) is not None for name in package.__all__)
    assert package.stationary.__module__ == "wflow.solvers.jko.stationary_states"
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        package.nope  # noqa: B018


def _stores(tmp_path):
    """One small store of each kind of result: kind -> (path, result class name, snapshots)."""
    mesh = wflow.CircleMesh(16)
    rho0 = wflow.Density.from_function(mesh, lambda x: 1 + 0.5 * x[:, 0])
    results = {
        "particles": wflow.simulate(wflow.SA(2.0), wflow.sphere.uniform(8, 3, seed=0), 0.2, dt=0.1),
        "density": wflow.solve_density(wflow.USA(1.0), rho0, 0.1, save_at=[0.0, 0.1]),
        "lagrangian": wflow.solve_lagrangian(
            wflow.USA(1.0), lambda x: 1 + 0.1 * x[:, 0], 0.1, nodes=16, save_at=[0.0, 0.1]
        ),
        "jko": wflow.solvers.jko.jko(None, rho0, 0.05, 2, kappa=1.0),
        "zonal": wflow.solve_zonal(
            wflow.SA(2.0), lambda z: 1 + 0.5 * z, 0.1, d=3, n_cells=16, save_at=[0.0, 0.1]
        ),
    }
    assert sorted(results) == sorted(KINDS)
    return {
        kind: [str(wflow.save(res, tmp_path / f"{kind}.zarr")), type(res).__name__, len(res)]
        for kind, res in results.items()
    }


def test_load_finds_each_kind_from_a_fresh_process(tmp_path):
    stores = _stores(tmp_path)
    got = fresh(
        f"""
        import json, sys, wflow
        from wflow.solvers.base import KINDS
        seen = {{}}
        for kind, (path, _, _) in {stores!r}.items():
            before = KINDS.modules[kind] in sys.modules
            res = wflow.load(path)
            seen[kind] = [before, KINDS.modules[kind] in sys.modules, res.kind, type(res).__name__, len(res)]
        print(json.dumps(seen))
        """
    )
    # each kind's module is loaded by the first load of that kind, found by the kind's name alone
    assert got == {kind: [False, True, kind, name, n] for kind, (_, name, n) in stores.items()}


def test_the_registries_name_every_solver_and_kind_of_wflow():
    """Import every solver module: nothing registers a solver or a kind the static tables miss."""
    got = fresh(
        """
        import importlib, json, pkgutil
        import wflow.solvers
        from wflow.solvers.base import KINDS, SOLVERS
        for m in pkgutil.walk_packages(wflow.solvers.__path__, "wflow.solvers."):
            importlib.import_module(m.name)
        print(json.dumps({
            "solvers": {name: [SOLVERS.modules.get(name), SOLVERS[name].__module__] for name in SOLVERS},
            "kinds": {name: [KINDS.modules.get(name), KINDS[name].rebuild.__module__] for name in KINDS},
        }))
        """
    )
    for table in got.values():
        for name, (listed, defined) in table.items():
            assert listed == defined, name
    assert sorted(got["solvers"]) == sorted(SOLVERS.modules)
    assert sorted(got["kinds"]) == sorted(KINDS.modules)


def test_registry_lists_names_without_importing_and_says_which_module_failed():
    reg: Registry[int] = Registry({"a": "json", "b": "json"})  # json registers nothing here
    reg["c"] = 3
    assert list(reg) == ["a", "b", "c"] and len(reg) == 3 and "a" in reg and "z" not in reg
    assert reg["c"] == 3 and reg.get("z") is None
    with pytest.raises(KeyError, match="json does not register 'a'"):
        reg["a"]
    del reg["a"]
    assert list(reg) == ["b", "c"]
    with pytest.raises(KeyError):
        del reg["a"]


def test_resume_rebuilds_a_scheme_model_from_a_fresh_process(tmp_path):
    """The normalization schemes' model types are found without importing wflow.schemes first."""
    from wflow.io import ZarrRecorder
    from wflow.schemes import Normalized

    model, x0 = Normalized(wflow.SA(2.0), "pre-ln"), wflow.sphere.uniform(8, 3, seed=0)
    path = tmp_path / "cut.zarr"

    def stop(t, mu):  # stops the run after the save at t = 0.2
        return t >= 0.2

    cut = wflow.simulate(model, x0, 0.5, dt=0.1, trackers=[ZarrRecorder(path), stop])
    full = wflow.simulate(model, x0, 0.5, dt=0.1)
    got = fresh(
        f"""
        import json, sys, wflow
        before = "wflow.schemes" in sys.modules
        back = wflow.resume({str(path)!r})
        print(json.dumps({{"before": before, "points": back.points.tolist()}}))
        """
    )
    assert (len(cut), got["before"]) == (3, False)
    np.testing.assert_array_equal(got["points"], full.points)  # bit for bit, as if never cut
