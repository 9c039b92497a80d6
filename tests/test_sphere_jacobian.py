"""The exact Jacobians of the attention field on the sphere (models, schemes, particle problems) and the stiff
steps that use them."""

import numpy as np
import pytest

import wflow
from wflow.kernels.small import span_coordinates
from wflow.schemes import Normalized
from wflow.solvers.particles import ParticleProblem, SpanProblem


def _centred(f, y, h=1e-6):
    """The Jacobian of f at y (any shape) by centred differences, shape (f.size, y.size)."""
    cols = []
    for j in range(y.size):
        e = np.zeros(y.size)
        e[j] = h
        e = e.reshape(y.shape)
        cols.append(((f(y + e) - f(y - e)) / (2 * h)).reshape(-1))
    return np.stack(cols, axis=1)


@pytest.mark.parametrize(
    "model",
    [
        wflow.SA(3.0),
        wflow.USA(2.0),
        wflow.SA(2.0, V=-np.eye(4)),
        wflow.USA(1.5, V=-np.eye(4)),
        wflow.SA(gamma=1.2),
        wflow.USA(4.0, kernel="rescaled"),
    ],
    ids=repr,
)
def test_sphere_jacobian_equals_centred_differences(model, rng):
    """dA and dv of SA/USA with V = +-I (plain and rescaled kernels, long context) against centred differences
    of ``average`` and ``velocity`` (to the differences' own error, about 1e-9)."""
    theta = wflow.sphere.uniform(5, 4, seed=1)
    w = rng.random(5) + 0.2
    w /= w.sum()
    dA, dv = model.sphere_jacobian(theta, w)
    mu = lambda th: wflow.Atoms(th, w)  # noqa: E731  (the measure moves with the tokens)
    for got, f in (
        (dA, lambda th: model.average(th, mu(th), backend="numpy")),
        (dv, lambda th: model.velocity(th, mu(th), backend="numpy")),
    ):
        ref = _centred(f, theta)
        mat = got.transpose(0, 2, 1, 3).reshape(20, 20)
        assert np.abs(mat - ref).max() < 2e-9 * max(1.0, np.abs(ref).max())
        assert np.abs(ref).max() > 0.05  # (a Jacobian worth comparing)


@pytest.mark.parametrize("scheme, kw", [("post-ln", {}), ("sqrt", {}), ("ngpt", {"alpha": 0.7})])
def test_scheme_jacobians_through_the_span_problem(scheme, kw, rng):
    """ParticleProblem.jacobian in span coordinates, off the sphere (the zero-homogeneous extension), at t = 2.5
    (sqrt-scaling's divisor sqrt(t + 1)), against centred differences of the problem's own rhs."""
    x = wflow.sphere.uniform(5, 9, seed=2)
    w = rng.random(5) + 0.2
    w /= w.sum()
    y, basis = span_coordinates(x)
    y = y * (1.0 + 0.2 * rng.random((5, 1)))
    prob = SpanProblem(Normalized(wflow.SA(3.0), scheme, **kw), w, basis, backend="numpy")
    J = prob.jacobian(2.5, y)
    ref = _centred(lambda z: prob.rhs(2.5, z), y)
    assert J.shape == (25, 25)
    assert np.abs(J - ref).max() < 2e-9
    # zero-homogeneity: the radial directions are in the kernel
    radial = np.zeros((5, 5))
    radial[3] = y[3]
    assert np.abs(J @ radial.reshape(-1)).max() < 1e-14


def test_jacobian_is_none_where_it_is_not_covered():
    x = wflow.sphere.uniform(4, 3, seed=0)
    w = np.full(4, 0.25)
    Q = np.diag([1.0, 2.0, 3.0])
    assert ParticleProblem(wflow.SA(1.0, Q=Q), w, 3, backend="numpy").jacobian(0.0, x) is None
    assert (
        ParticleProblem(Normalized(wflow.SA(1.0), "pre-ln"), w, 3, backend="numpy").jacobian(0.0, x)
        is None
    )
    assert (
        ParticleProblem(wflow.SA(1.0), w, 3, backend="numpy").jacobian(0.0, x[None]) is None
    )  # a batch
    with pytest.raises(ValueError, match="Q = K = I"):
        wflow.SA(1.0, Q=Q).sphere_jacobian(x, w)
    with pytest.raises(ValueError, match="sphere schemes"):
        Normalized(wflow.SA(1.0), "peri-ln").sphere_jacobian(x, w)


def test_ros2_with_the_exact_jacobian_equals_the_differenced_one():
    """ROS2 is a W-method (order 2 for any matrix), but with the exact Jacobian its steps equal those with the
    Jacobian by differences to the differences' error, and it then needs no n d extra evaluations."""
    from wflow.solvers.steppers import ROS2

    x = wflow.sphere.uniform(6, 6, seed=3)
    w = np.full(6, 1 / 6)
    prob = ParticleProblem(wflow.SA(4.0), w, 6, backend="numpy")
    exact, _ = ROS2().step(prob, 0.0, x, 0.5, None, rtol=1e-6, atol=1e-12)

    class NoJacobian(ParticleProblem):
        def jacobian(self, t, y):
            return None

    fd, _ = ROS2().step(
        NoJacobian(wflow.SA(4.0), w, 6, backend="numpy"), 0.0, x, 0.5, None, rtol=1e-6, atol=1e-12
    )
    assert np.abs(exact.y - fd.y).max() < 1e-7
    assert exact.evaluations == 2 and fd.evaluations == 2 + x.size


@pytest.mark.parametrize("scheme, kw", [("ngpt", {"alpha": 0.5}), ("sqrt", {})])
def test_sphere_schemes_run_in_span_coordinates(scheme, kw):
    """The sphere schemes of plain attention keep tokens in their initial span: the span run equals the
    full-dimensional one; schemes with radii and perceptrons are refused."""
    x0 = wflow.sphere.uniform(6, 20, seed=4)
    model = Normalized(wflow.SA(3.0), scheme, **kw)
    opts = dict(method="rk4", dt=0.05, save_at=[0.0, 1.0, 2.0], backend="numpy", diagnostics=())
    span = wflow.simulate(model, x0, 2.0, coordinates="span", **opts)
    full = wflow.simulate(model, x0, 2.0, **opts)
    assert np.abs(np.asarray(span.points) - np.asarray(full.points)).max() < 1e-12
    assert np.abs(np.asarray(full.points)[-1] - x0).max() > 1e-2
    for bad in (
        Normalized(wflow.SA(3.0), "pre-ln"),
        Normalized(
            wflow.SA(3.0),
            "post-ln",
            perceptron=wflow.Perceptron(np.ones((20, 2)), np.ones((2, 20))),
        ),
    ):
        with pytest.raises(ValueError, match="coordinates='span'"):
            wflow.simulate(bad, x0, 1.0, coordinates="span", **opts)
