import os
from pathlib import Path

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


def pytest_report_header(config):
    import wflow

    return f"wflow {wflow.__version__} from {Path(wflow.__file__).parent}"


def pytest_sessionstart(session):
    """Under CI (``WFLOW_TEST_INSTALLED=1``) the tests must exercise the installed wheel."""
    if os.environ.get("WFLOW_TEST_INSTALLED"):
        import wflow

        source = Path(__file__).resolve().parents[1] / "wflow"  # the checkout's package folder
        here = Path(wflow.__file__).resolve()
        if here.parent == source:  # (a virtual environment inside the checkout is fine)
            raise pytest.UsageError(
                f"WFLOW_TEST_INSTALLED is set but wflow was imported from the checkout ({here}); "
                "install the wheel (pip install .) and run pytest from the repository root"
            )
