"""A store moved or removed while a run writes into it (issue 51, item 1): the run stops with one
line naming the path, nothing is created at the old path, and the moved store resumes bit for bit."""

from __future__ import annotations

import os

import numpy as np
import pytest

import wflow
from wflow import io, sphere
from wflow.errors import WflowError
from wflow.solvers.trackers import Tracker

KW = dict(dt=0.1, method="euler", backend="numpy", save_at=np.linspace(0, 1, 6))


class Mover(Tracker):
    """Renames ``src`` to ``dst`` after save ``at`` (``at=None``: when the run starts)."""

    name = "mover"

    def __init__(self, src, dst, at=None):
        self.src, self.dst, self.at = src, dst, at

    def start(self, run):
        if self.at is None:
            os.rename(self.src, self.dst)

    def save(self, snap):
        if snap.index == self.at:
            os.rename(self.src, self.dst)


@pytest.fixture
def x0():
    return sphere.uniform(12, 3, seed=1)


def test_a_store_moved_during_the_run_stops_it_and_resumes_where_it_went(tmp_path, x0):
    """Zarr recreated the old path and wrote stray chunks there, then failed with 'not a wflow result
    store'; the run now stops at the next save, naming the path, and the moved store continues."""
    old, new = tmp_path / "a.zarr", tmp_path / "b.zarr"
    with pytest.raises(
        WflowError, match="a.zarr: the store was moved or removed during the run; the 3 snapshot"
    ):
        wflow.simulate(
            wflow.SA(2.0), x0, 1.0, trackers=[io.ZarrRecorder(old), Mover(old, new, 2)], **KW
        )
    assert not os.path.lexists(old)
    assert io.committed_length(new) == 3
    full = wflow.simulate(wflow.SA(2.0), x0, 1.0, **KW)
    resumed = wflow.resume(new)
    np.testing.assert_array_equal(resumed.points, full.points)


def test_a_folder_moved_before_the_first_snapshot_is_not_recreated(tmp_path, x0):
    run, moved = tmp_path / "run", tmp_path / "moved"
    run.mkdir()
    with pytest.raises(
        WflowError, match="run: the folder was moved or removed before the run's first"
    ):
        wflow.simulate(
            wflow.SA(2.0),
            x0,
            1.0,
            trackers=[io.ZarrRecorder(run / "t.zarr"), Mover(run, moved)],
            **KW,
        )
    assert not os.path.lexists(run) and not os.path.lexists(moved / "t.zarr")
