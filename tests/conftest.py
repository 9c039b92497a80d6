import numpy as np
import pytest

np.seterr(all="raise", under="ignore")


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture(scope="session")
def keops_ready():
    """Compile the KeOps formulas once, in this process, before tests use them."""
    from wflow.kernels import BACKENDS

    if not BACKENDS["keops"].available():
        pytest.skip(f"pykeops unavailable: {BACKENDS['keops'].reason}")
    x = np.eye(3)
    for dtype in (np.float64,):
        for values in (True, False):
            from wflow.kernels import kernel_sums

            kernel_sums(
                x.astype(dtype),
                x.astype(dtype),
                np.ones(3, dtype) / 3,
                1.0,
                values=values,
                backend="keops",
            )
    return True
