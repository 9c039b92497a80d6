"""The perceptron study's conventions (wflow.studies.perceptron): the rescaled-kernel conversion,
the stopping callback, the sampling and the registry."""

import numpy as np
import pytest

import wflow
from wflow.studies import perceptron as P
from wflow.studies.report import STUDY_MODULES


@pytest.mark.parametrize("convention", ["code", "poster"])
@pytest.mark.parametrize("sign", [1, -1])
def test_paper_model_is_the_rescaled_field_in_wflow_time(sign, convention):
    # paper: e^{beta(<x,y>-1)} attention + u_omega; wflow: factor * (USA_plain + u_{omega/factor});
    # descent flips the whole field in the code's convention, only the attention in the poster's
    beta, d = 7.0, 2
    A, omega = P.paper_perceptron(d, 1.0, seed=0)
    model, factor = P.paper_model(
        beta, sign, d, A=A, omega=omega, activation="gelu", convention=convention
    )
    assert factor == pytest.approx(np.exp(-beta))
    x = wflow.sphere.uniform(32, d, seed=1)
    mu = wflow.Atoms(x)
    th = x @ x.T
    raw = np.exp(beta * (th - 1)) @ x / 32
    attention = raw - np.sum(raw * x, axis=1, keepdims=True) * x
    mlp = wflow.Perceptron.conservative(A, omega, activation="gelu").velocity(x)
    paper = sign * (attention + mlp) if convention == "code" else sign * attention + mlp
    assert np.allclose(factor * model.velocity(x, mu), paper, rtol=1e-10, atol=1e-12)
    # the default is the code's convention
    default, _ = P.paper_model(beta, sign, d, A=A, omega=omega, activation="gelu")
    code, _ = P.paper_model(beta, sign, d, A=A, omega=omega, activation="gelu", convention="code")
    np.testing.assert_array_equal(default.velocity(x, mu), code.velocity(x, mu))
    sa, f_sa = P.paper_model(beta, sign, d, attention="SA")
    assert f_sa == 1.0 and isinstance(sa, wflow.SA)


def test_threshold_sampling_and_registry():
    assert P.cluster_threshold(1.0, 2) == pytest.approx(0.5)
    assert P.cluster_threshold(100.0, 2) == pytest.approx(0.05)
    assert P.cluster_threshold(0.01, 10) == pytest.approx(np.pi / 20)
    A, omega = P.paper_perceptron(5, 2.0, seed=3)
    assert A.shape == (5, 5) and omega.shape == (5,)
    assert np.allclose(np.linalg.norm(A, axis=1), 1.0)
    assert "wflow.studies.perceptron" in STUDY_MODULES


def test_settle_stop_stops_a_settled_run():
    r = P.run_paper(1.0, 1, d=2, N=32, seeds=2, t_max=200.0)
    assert r["settled"] and r["t_stop"] < 200.0
    assert all(len(c[1]) == 1 for c in r["clusters"])  # attraction at beta = 1: one atom


def test_every_run_is_a_part_and_is_reused(tmp_path):
    """The plan lists each run of the study once (131 in quick mode, 362 in full); a run through the study's
    parts equals run_paper and a second request reads it back without running."""
    from wflow.studies.parts import Parts
    from wflow.studies.perceptron_plan import study_plan

    quick, full = study_plan(True), study_plan(False)
    for plan, count in ((quick, 131), (full, 362)):
        keys = {str(P.Runs.key(*c, **kw)) for c, kw in plan["calls"]}
        assert len(plan["calls"]) == count == len(keys)
    parts = Parts(tmp_path, "perceptron", quick=True)
    runs = P.Runs(parts)
    a = runs(1.0, 1, d=2, N=8, seeds=2, t_max=5.0)
    b = runs(1.0, 1, d=2, N=8, seeds=2, t_max=5.0)
    direct = P.run_paper(1.0, 1, d=2, N=8, seeds=2, t_max=5.0)
    assert parts.computed == 1 and parts.reused == 1
    np.testing.assert_array_equal(a["x"], direct["x"])
    np.testing.assert_array_equal(b["x"], direct["x"])
    assert (a["settled"], a["t_stop"], a["threshold"]) == (
        direct["settled"],
        direct["t_stop"],
        direct["threshold"],
    )
    assert [len(c[1]) for c in a["clusters"]] == [len(c[1]) for c in direct["clusters"]]


def test_the_conventions_part_on_the_reference_draw():
    """beta = 5, GELU descent, one weight draw: the code's convention ends in three atoms, the poster's in two
    (as the authors' wgf_circle against the poster's model: 0.480 / 0.369 / 0.151 against 0.541 / 0.459 on
    their draw); fails if the perceptron's sign is not flipped with the attention's."""
    from wflow.studies.perceptron_checks import CONVENTION_DRAW

    A, omega = P.paper_perceptron(2, 1.0, seed=CONVENTION_DRAW)
    masses = {}
    for conv in P.CONVENTIONS:
        r = P.run_paper(
            5.0, -1, d=2, N=128, seeds=1, A=A, omega=omega, t_max=300.0, convention=conv
        )
        masses[conv] = r["clusters"][0][1]
    assert [round(float(m), 2) for m in masses["code"]] == pytest.approx(
        [0.44, 0.39, 0.17], abs=0.03
    )
    assert [round(float(m), 2) for m in masses["poster"]] == pytest.approx([0.52, 0.48], abs=0.03)


def test_atom_locations_do_not_depend_on_the_particle_seed():
    # GELU ascent, beta = 5, fixed weights: two atoms at the two local maxima of v_omega, whatever the seed
    A, omega = P.paper_perceptron(2, 1.0, seed=100)
    r = P.run_paper(5.0, 1, d=2, N=64, seeds=3, A=A, omega=omega, t_max=300.0)
    assert r["settled"]
    means = [c[0] for c in r["clusters"]]
    assert all(m.shape == (2, 2) for m in means)
    for other in means[1:]:
        dist = np.arccos(np.clip(means[0] @ other.T, -1, 1)).min(axis=1)
        assert (
            dist.max() < 1e-3
        )  # rad (measured 2.3e-5); without the perceptron the atoms move by radians


@pytest.mark.parametrize("bad", ["paper", "Code", None, 1])
def test_an_unknown_convention_is_a_one_line_error(bad, tmp_path, capsys):
    with pytest.raises(ValueError, match=r"^convention must be 'code' or 'poster', got ") as e:
        P.paper_model(1.0, -1, 2, convention=bad)
    assert "\n" not in str(e.value) and repr(bad) in str(e.value)
    with pytest.raises(ValueError, match="convention"):
        P.run_paper(1.0, -1, d=2, N=4, seeds=1, t_max=1.0, convention=bad)
    with pytest.raises(ValueError, match="convention"):
        P.study_perceptron(tmp_path / "x", True, convention=bad)


def test_the_cli_passes_the_convention_and_refuses_an_unknown_one(tmp_path, capsys):
    from wflow.cli import main
    from wflow.studies.report import check_options

    assert check_options(["perceptron"], {"convention": "poster"}) == {
        "perceptron": {"convention": "poster"}
    }
    assert check_options(["mean-shift", "perceptron"], {"convention": "code"}) == {
        "perceptron": {"convention": "code"}
    }
    out = tmp_path / "rep"
    assert main(["validate", "perceptron", "--option", "convention=papr", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err == "wflow: error: unknown convention 'papr' for study perceptron; known: code, poster"
    )
    assert not out.exists()  # nothing written
    assert main(["validate", "mean-shift", "--option", "convention=code", "--out", str(out)]) == 2
    assert "takes the option 'convention'" in capsys.readouterr().err
    assert main(["validate", "perceptron", "--option", "convention", "--out", str(out)]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err


def test_count_rules_and_the_stopping_slope():
    from wflow.studies import perceptron_checks as C

    assert C.count_matches("relu", 1, np.array([1.0]), np.array([0.3]))
    assert not C.count_matches("relu", 1, np.array([0.6, 0.4]), np.array([0.3, 0.1]))
    assert C.count_matches("relu", -1, np.array([0.5, 0.3, 0.2]))
    assert not C.count_matches("relu", -1, np.array([0.4, 0.3, 0.2, 0.1]))
    assert C.count_matches("gelu", 1, np.array([0.55, 0.44, 0.01]))  # a straggler is not an atom
    assert not C.count_matches("gelu", -1, np.array([0.54, 0.46]))
    # t = (a + b log w) / w has local slope -1 + b / (a + b log w)
    w = np.array([1.0, 2.0, 4.0, 8.0, 16.0])
    slope = C.stopping_slope(w, (30.0 + 5.0 * np.log(w)) / w)
    assert -1.0 < slope < -0.8
    assert C.e4_threshold(25.0) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="beta must be finite and > 0, got -1"):
        C.e4_threshold(-1.0)


@pytest.mark.parametrize("beta", [-1.0, 0.0, float("nan"), float("inf")])
def test_cluster_threshold_refuses_a_beta_it_cannot_use(beta):
    """cluster_threshold(-1, 2) returned NaN; every beta that is not finite and > 0 is named."""
    with pytest.raises(ValueError, match="beta must be a finite number > 0"):
        P.cluster_threshold(beta, 2)
    assert P.cluster_threshold(4.0, 2) == 0.25
