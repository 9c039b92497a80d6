"""``benchmarks/w2_scale.py``: a case past its timeout is a row, not a crash."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def w2_scale():
    spec = importlib.util.spec_from_file_location("w2_scale", ROOT / "benchmarks" / "w2_scale.py")
    if spec is None or spec.loader is None:  # pragma: no cover - the checkout has it
        pytest.skip("benchmarks/w2_scale.py is not in this checkout")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_case_past_its_timeout_prints_a_row(w2_scale):
    r = w2_scale._subprocess(w2_scale.SEMI, "wflow", 1000, 0.01)
    assert r == {"error": "not finished in 0 s"}
    assert w2_scale.row(1000, w2_scale.SEMI, "wflow", r, None) == (
        "| 1000 | semi-discrete | wflow | not finished in 0 s | | | | | |"
    )


def test_a_bracket_is_checked_against_emd2(w2_scale):
    r = {"seconds": 1.0, "peak_mb": 200.0, "lo": 0.5, "hi": 0.5005, "value": 0.50025}
    cells = w2_scale.row(1000, "point cloud", "wflow", r, 0.5004).split(" | ")
    assert cells[5:] == ["0.500250", "[0.500000, 0.500500]", "1.0e-03", "1.5e-04 (in bracket) |"]
    cells = w2_scale.row(1000, "point cloud", "wflow", r, 0.5006).split(" | ")
    assert cells[-1] == "3.5e-04 (OUTSIDE the bracket) |"
