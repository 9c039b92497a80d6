"""Results on disk: one Zarr store per run, written snapshot by snapshot, committed atomically.

A run's store (``trajectory.zarr``, ``density.zarr``, ...) holds the variables the problem
saves with a leading ``time`` dimension, the step counters, the solver's resume variables
(``checkpoint_*``) and the variables written once; each snapshot is committed by atomically
replacing ``wflow_commit.json``, and readers use only the committed snapshots, every chunk
verified (docs/reliability.md).  This package knows nothing about solvers: it stores what the
driver hands to its recorder and reads it back as plain arrays.

It re-exports :mod:`~wflow.io.commit` (the commit protocol, digests, the one-writer lock,
removing what wflow wrote), :mod:`~wflow.io.paths` (files never through a link or special
file), :mod:`~wflow.io.recorder` (:class:`ZarrRecorder`, the stores' attributes) and
:mod:`~wflow.io.read` (:func:`read_store`, :func:`repair`, :func:`write_result`).
"""

from .commit import (
    COMMIT,
    DIGESTS,
    FORMAT,
    FolderLock,
    chunk_codecs,
    committed_length,
    read_commit,
    remove_store,
    write_commit,
)
from .read import read_store, repair, result_dataset, store_attrs, write_result

# VARIABLE_ATTRS and COORDINATE_ROLE are public but, as before the split, not in __all__
from .recorder import (  # noqa: F401
    COORDINATE_ROLE,
    VARIABLE_ATTRS,
    ZarrRecorder,
    cell_coordinates,
    model_equation,
    variable_attributes,
)

__all__ = [
    "FORMAT",
    "COMMIT",
    "DIGESTS",
    "ZarrRecorder",
    "FolderLock",
    "result_dataset",
    "read_store",
    "repair",
    "store_attrs",
    "write_result",
    "committed_length",
    "write_commit",
    "read_commit",
    "chunk_codecs",
    "remove_store",
]
