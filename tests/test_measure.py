import numpy as np
import pytest

from wflow import Atoms, sphere


def test_weights_normalized_and_uniform_default():
    mu = Atoms([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]], weights=[1, 2, 1])
    np.testing.assert_allclose(mu.weights, [0.25, 0.5, 0.25], rtol=1e-15)
    np.testing.assert_allclose(mu.mean(), [0.0, 0.5], atol=1e-16)
    assert Atoms(np.eye(4)).weights.tolist() == [0.25] * 4


def test_batched_atoms(rng):
    x = sphere.uniform(8, 3, rng, batch=(5,))
    mu = Atoms(x)
    assert mu.batch_shape == (5,) and mu.n == 8 and mu.d == 3
    np.testing.assert_allclose(mu.weights.sum(-1), 1, rtol=1e-15)
    np.testing.assert_allclose(mu[2].points, x[2])
    np.testing.assert_allclose(mu.order_parameter(), np.linalg.norm(x.mean(1), axis=-1), rtol=1e-14)


@pytest.mark.parametrize(
    "points,weights,exc,match",
    [
        ([[1.0, 0.0]], [-1.0], ValueError, "non-negative"),
        ([[1.0, 0.0], [0.0, 1.0]], [0.0, 0.0], ValueError, "positive sum"),
        ([[1.0, 0.0]], [np.inf], ValueError, "non-finite"),
        ([[1.0, 0.0], [0.0, 1.0]], [1.0, 2.0, 3.0], ValueError, "shape"),
        ([[2.0, 0.0]], None, ValueError, "norm 2"),
        ([1.0, 0.0], None, ValueError, "shape"),
        ([[1.0]], None, ValueError, "d >= 2"),
        ([[np.nan, 1.0]], None, ValueError, "non-finite"),
        ("points", None, TypeError, "points"),
        ([[1.0, 0.0]], ["a"], TypeError, "weights"),
    ],
)
def test_bad_input(points, weights, exc, match):
    with pytest.raises(exc, match=match):
        Atoms(points, weights)
