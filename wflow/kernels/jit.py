r"""numba primitives shared by the compiled kernels: the fast-math flags, a vectorizable exponential,
the 512-bit vector hint, work arrays apart from every other array (:func:`scratch`), and notices of
what numba compiles (:func:`compile_notices`).

numba has no SVML here, so ``np.exp`` inside a loop is a scalar libm call.  :func:`exp64` and
:func:`exp32` write the exponential with plain arithmetic -- Cody--Waite range reduction
:math:`e^x = 2^k e^r`, :math:`|r| \le \tfrac12\log 2`, a Chebyshev interpolant of :math:`e^r` of
degree 10 (float64, relative error :math:`2\cdot 10^{-15}`) or 6 (float32, :math:`3\cdot 10^{-9}`),
and :math:`2^k` built from the exponent bits -- so LLVM vectorizes the loops over columns.  Callers
clamp exponents at :func:`~wflow.kernels.exp_floor`, so :math:`k` stays in the normal range.

Importing this module also keys numba's on-disk cache of every wflow kernel on the sources of all
of wflow's compiled modules (:func:`kernel_sources_digest`).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from llvmlite import ir as _ir
from numba import njit
from numba.core import event as _event
from numba.core import types as _types
from numba.extending import intrinsic, overload

from ..errors import notice

__all__ = [
    "LOG_ZERO",
    "FM_EXP",
    "FM_SUM",
    "WIDE_VECTORS",
    "prefer_wide_vectors",
    "exp64",
    "exp32",
    "exp",
    "exp_as",
    "round_as",
    "SCRATCH_PAD",
    "scratch",
    "compile_notices",
    "kernel_sources_digest",
]

# --------------------------------------------------------------------------- numba's cache stamp
#: the wflow package folder: kernels defined in files below it get the stamp of :func:`kernel_sources_digest`
_PACKAGE = Path(__file__).resolve().parents[1]


@functools.cache
def kernel_sources_digest(root: str = str(_PACKAGE)) -> str:
    """SHA-256 of the contents of every module under ``root`` that uses numba, in path order.

    numba keys a cached kernel on its own file only, but a kernel inlines what it calls from other
    files (:func:`exp64`, :mod:`wflow.kernels.dense`, :data:`LOG_ZERO`): a warm cache built on an
    older callee would give other bits than an empty one.  Every wflow kernel's cache entry is
    therefore stamped with this digest too (contents, not modification times).

    Examples
    --------
    >>> d = kernel_sources_digest()
    >>> len(d), d == kernel_sources_digest()
    (64, True)
    """
    h = hashlib.sha256()
    base = Path(root)
    for path in sorted(base.rglob("*.py")):
        text = path.read_bytes()
        if b"numba" in text:
            h.update(path.relative_to(base).as_posix().encode() + b"\0" + text + b"\0")
    return h.hexdigest()


def _stamped(locator: Any) -> Any:
    """``locator`` (a numba cache locator class) for wflow's files only, its source stamp extended by
    :func:`kernel_sources_digest`."""

    class Stamped(locator):
        @classmethod
        def from_function(cls, py_func, py_file):
            if not os.path.abspath(py_file).startswith(str(_PACKAGE) + os.sep):
                return None  # not wflow's: numba's own locators take it
            return super().from_function(py_func, py_file)

        def get_source_stamp(self):
            return (super().get_source_stamp(), kernel_sources_digest())

    Stamped.__name__ = Stamped.__qualname__ = f"Wflow{locator.__name__}"
    return Stamped


def _install_cache_stamp() -> None:
    """Put :func:`_stamped` versions of numba's cache locators ahead of its own (once per process)."""
    try:
        from numba.core.caching import CacheImpl

        classes: list[Any] = CacheImpl._locator_classes
    except (ImportError, AttributeError):  # pragma: no cover - another numba: its own stamps
        return
    if any(c.__name__.startswith("Wflow") for c in classes):
        return
    classes[:0] = [_stamped(c) for c in list(classes)]


_install_cache_stamp()


#: Stands for log(0) so that every number the kernels see is finite (no-inf/no-nan fast-math);
#: e^(-1e300 - c) is clamped to e^floor as the numpy backend clamps e^(-inf).
LOG_ZERO = -1e300

#: Fast-math flags of the exponential.  It must not get "reassoc": that would fold the
#: round-to-integer trick (x*log2e + S) - S into x*log2e and merge the two Cody-Waite steps.
FM_EXP = {"nnan", "ninf", "nsz", "contract"}
#: Fast-math flags of the summing loops: they need "reassoc" to vectorize reductions.
FM_SUM = {"nnan", "ninf", "nsz", "contract", "reassoc"}


@intrinsic
def _pow2_of_shifted64(typingctx, t):
    """``2**k`` for ``t = k + 1.5 * 2**52`` exactly (k in the normal exponent range)."""

    def codegen(context, builder, signature, args):
        i = builder.bitcast(args[0], _ir.IntType(64))
        # the shifter's own bits leave through the top; k lands in the exponent field
        i = builder.shl(i, _ir.Constant(_ir.IntType(64), 52))
        i = builder.add(i, _ir.Constant(_ir.IntType(64), 1023 << 52))
        return builder.bitcast(i, _ir.DoubleType())

    return _types.float64(_types.float64), codegen


@intrinsic
def _pow2_of_shifted32(typingctx, t):
    """``2**k`` for ``t = k + 1.5 * 2**23`` exactly (k in the normal exponent range)."""

    def codegen(context, builder, signature, args):
        i = builder.bitcast(args[0], _ir.IntType(32))
        i = builder.shl(i, _ir.Constant(_ir.IntType(32), 23))
        i = builder.add(i, _ir.Constant(_ir.IntType(32), 127 << 23))
        return builder.bitcast(i, _ir.FloatType())

    return _types.float32(_types.float32), codegen


#: the LLVM function attribute that lets the loop vectorizer use 512-bit registers (LLVM's default
#: for AVX-512 cores is 256; no effect on cores without AVX-512)
WIDE_VECTORS = '"prefer-vector-width"="512"'


@intrinsic
def prefer_wide_vectors(typingctx):
    """Called first in a compiled function: its loops may be vectorized 512 bits wide
    (:data:`WIDE_VECTORS`; reductions may split into more partial sums).  A no-op when llvmlite
    refuses the attribute."""

    def codegen(context, builder, signature, args):
        attrs = builder.function.attributes
        try:  # llvmlite checks attributes against a list of keywords: add the string one past it
            set.add(attrs, WIDE_VECTORS)
        except Exception:  # pragma: no cover - a different llvmlite
            pass
        return context.get_dummy_value()

    return _types.void(), codegen


@njit(cache=True, fastmath=FM_EXP)
def exp64(x):
    """e^x for float64 x in [-708, 0.3]: relative error about 2e-15."""
    t = x * 1.4426950408889634 + 6755399441055744.0  # k + 1.5*2^52, k = round(x/log 2)
    k = t - 6755399441055744.0
    r = x - k * 6.93147180369123816490e-01  # Cody-Waite: log 2 = hi + lo, k*hi exact
    r = r - k * 1.90821492927058770002e-10
    # Chebyshev interpolant of e^r on |r| <= log(2)/2 + 1e-3, degree 10
    p = 2.654918910414338e-07
    p = p * r + 2.7634529673057688e-06
    p = p * r + 2.4804475315593808e-05
    p = p * r + 0.00019841184597455588
    p = p * r + 0.001388888610320244
    p = p * r + 0.008333333373576392
    p = p * r + 0.041666666677520954
    p = p * r + 0.1666666666659264
    p = p * r + 0.499999999999845
    p = p * r + 1.0000000000000033
    p = p * r + 1.0000000000000004
    return p * _pow2_of_shifted64(t)


@njit(cache=True, fastmath=FM_EXP)
def exp32(x):
    """e^x for float32 x in [-87, 0.3]: relative error about 1e-7."""
    t = x * np.float32(1.4426950408889634) + np.float32(12582912.0)  # k + 1.5*2^23
    k = t - np.float32(12582912.0)
    r = x - k * np.float32(0.693145751953125)
    r = r - k * np.float32(1.428606765330187045e-06)
    p = np.float32(0.0013941411161795259)
    p = p * r + np.float32(0.00837536808103323)
    p = p * r + np.float32(0.04166634753346443)
    p = p * r + np.float32(0.16666412353515625)
    p = p * r + np.float32(0.5)
    p = p * r + np.float32(1.0)
    p = p * r + np.float32(1.0)
    return p * _pow2_of_shifted32(t)


def exp(x):  # pragma: no cover - replaced by the overload inside numba
    return np.exp(x)


@overload(exp, inline="never")
def _exp_overload(x):
    if x == _types.float32:
        return lambda x: exp32(x)
    return lambda x: exp64(x)


def round_as(x, zero):  # pragma: no cover - replaced by the overload inside numba
    return x


@overload(round_as)
def _round_as_overload(x, zero):
    """float64 x rounded to the dtype of ``zero`` (returned as float64)."""
    if zero == _types.float32:
        return lambda x, zero: np.float64(np.float32(x))
    return lambda x, zero: x


def exp_as(x, zero):  # pragma: no cover - replaced by the overload inside numba
    return np.exp(x)


@overload(exp_as, inline="never")
def _exp_as_overload(x, zero):
    """e^x in the dtype of ``zero`` (x is converted first: float32 runs 8 lanes, not 4)."""
    if zero == _types.float32:
        return lambda x, zero: exp32(np.float32(x))
    return lambda x, zero: exp64(np.float64(x))


#: Bytes left unused before and after the data of a :func:`scratch` array.
SCRATCH_PAD = 512


def scratch(shape: tuple[int, ...], dtype) -> np.ndarray:
    """``np.empty(shape, dtype)`` whose data lies at least :data:`SCRATCH_PAD` bytes from any other
    array's (callable from Python and from compiled code, ``shape`` a tuple).

    A vectorized loop that writes one array while reading another checks at run time that they do
    not overlap within 256 bytes, else runs its scalar version, which sums in another order under
    "reassoc": results would then depend on where malloc put the work arrays, and a resumed run
    would not repeat the uninterrupted one bit for bit.  Arrays this far apart always take the
    vector path."""
    dtype = np.dtype(dtype)
    k = math.prod(shape)
    pad = SCRATCH_PAD // dtype.itemsize
    return np.empty(k + 2 * pad, dtype)[pad : pad + k].reshape(shape)


@overload(scratch)
def _scratch_overload(shape, dtype):
    ty = dtype.dtype if isinstance(dtype, _types.DType) else dtype.instance_type  # or a NumberClass
    pad = SCRATCH_PAD // (ty.bitwidth // 8)

    def impl(shape, dtype):  # pragma: no cover - compiled
        k = 1
        for s in shape:
            k *= s
        return np.empty(k + 2 * pad, dtype)[pad : pad + k].reshape(shape)

    return impl


# --------------------------------------------------------------------------- compile notices
log = logging.getLogger(__name__)

#: the callbacks of the open :func:`compile_notices` blocks, innermost last (only it is told)
_SINKS: list[Callable[[str, bool, float | None], None]] = []
_SINKS_LOCK = threading.Lock()


class _CompileListener(_event.Listener):
    """Tells the innermost sink when numba starts and ends compiling a function that was called (not the
    functions compiled inside it)."""

    def __init__(self) -> None:
        self.depth = 0  # compilations nest (callees, overloads)
        self.outer: tuple[str, bool, float, bool] | None = None

    @staticmethod
    def _tell(name: str, cached: bool, seconds: float | None, ours: bool = True) -> None:
        sink = _SINKS[-1] if _SINKS else (_announce if ours else None)
        if sink is not None:
            try:
                sink(name, cached, seconds)
            except Exception as exc:  # a notice must never stop a compilation
                log.debug("compile notice failed: %r", exc)

    def on_start(self, event) -> None:
        self.depth += 1
        if self.depth == 1:
            disp = (event.data or {}).get("dispatcher")
            func = getattr(disp, "py_func", None)
            name = getattr(func, "__name__", None) or repr(disp)
            # cache=True functions keep a disk cache: compiled once, loaded by later processes
            cache = getattr(disp, "_cache", None)
            cached = cache is not None and type(cache).__name__ != "NullCache"
            ours = str(getattr(func, "__module__", "")).startswith("wflow.")
            self.outer = (name, cached, time.perf_counter(), ours)
            self._tell(name, cached, None, ours)

    def on_end(self, event) -> None:
        self.depth = max(0, self.depth - 1)
        if self.depth == 0 and self.outer is not None:
            name, cached, t0, ours = self.outer
            self.outer = None
            self._tell(name, cached, time.perf_counter() - t0, ours)


def _announce(name: str, cached: bool, seconds: float | None) -> None:
    """Outside any :func:`compile_notices` block: one line on stderr when numba starts compiling one of
    wflow's kernels (``WFLOW_NOTICES=0`` silences it)."""
    if seconds is None:
        once = " (first run only: cached for later runs)" if cached else ""
        notice(f"compiling {name} with numba{once}")


_LISTENER = _CompileListener()
_event.register("numba:compile", _LISTENER)  # (numba fires it only when it compiles)


@contextlib.contextmanager
def compile_notices(callback: Callable[[str, bool, float | None], None]) -> Iterator[None]:
    """Tell ``callback`` what numba compiles inside the block, while it compiles.

    ``callback(name, cached, None)`` is called when numba starts compiling a function that was called
    (``cached``: declared ``cache=True``, so later processes load it from disk), and
    ``callback(name, cached, seconds)`` when that compilation ends.  Nothing is called for a
    signature compiled earlier or loaded from numba's cache.  Blocks nest: only the innermost open
    block's callback is told.  An exception raised by ``callback`` is logged and ignored.

    Examples
    --------
    >>> from numba import njit
    >>> @njit
    ... def twice(x):
    ...     return 2 * x
    >>> heard = []
    >>> with compile_notices(lambda name, cached, seconds: heard.append((name, cached, seconds is None))):
    ...     _ = twice(1.0), twice(2.0)  # compiled once, for float64
    >>> heard  # the start and the end of one compilation
    [('twice', False, True), ('twice', False, False)]
    """
    with _SINKS_LOCK:
        _SINKS.append(callback)
    try:
        yield
    finally:
        with _SINKS_LOCK:
            del _SINKS[len(_SINKS) - 1 - _SINKS[::-1].index(callback)]  # (its own entry: the last)
