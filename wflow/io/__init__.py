"""Results on disk: one Zarr store per run, written snapshot by snapshot, committed atomically.

A run's store (``trajectory.zarr``, ``density.zarr``, ...) is a Zarr v3 group created when
the run starts, with every per-snapshot array sized for all the run's save times and
chunked one snapshot per chunk.  A snapshot is written chunk by chunk and then
*committed* by atomically replacing a small record, ``wflow_commit.json``, that holds the
number of committed snapshots (write a temporary file, ``fsync``, ``rename``).  Readers
and :func:`wflow.resume` use the committed length and ignore anything beyond it, so a
process that dies at any instant leaves either the whole snapshot or none of it.
Every chunk carries a CRC32C checksum (Zarr's ``crc32c`` codec), and a chunk missing
inside the committed length is an error naming the store, the variable and the snapshot,
never a fill value.

Layout: the variables the problem saves (``points``, ``density``, diagnostics, ...) with a
leading ``time`` dimension; ``steps``, ``rejected``, ``evaluations`` and ``dt_next`` per
snapshot; the solver's resume variables (``checkpoint_*``); variables written once
(``weights``, mesh arrays) without ``time``; attributes ``wflow_format``, ``kind``,
``solver``, ``wflow_version`` and the configuration as JSON.

This package knows nothing about solvers: it stores what the driver hands to its
recorder (:class:`ZarrRecorder`) and reads it back as plain arrays (:func:`read_store`).

This module re-exports the code of :mod:`~wflow.io.commit` (the commit protocol, digests, the
one-writer lock, removing what wflow wrote), :mod:`~wflow.io.paths` (files never through a link or
special file), :mod:`~wflow.io.recorder` (:class:`ZarrRecorder`, the variables' and the store's
attributes) and :mod:`~wflow.io.read` (:func:`read_store`, :func:`repair`, :func:`write_result`).
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
