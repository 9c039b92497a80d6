r"""The kernel-sum contract: the problem, the result, the backend registry and :func:`kernel_sums`.

Every backend imports its types from here and registers itself in :data:`BACKENDS`;
:mod:`wflow.kernels` re-exports these names (see its docstring for the mathematics).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ..errors import WflowError, real_float_dtype, short_repr

# The numba backends' OpenMP workers otherwise spin after each parallel loop (libgomp's
# default), stealing a core from the NumPy work that follows; a user's value wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__all__ = [
    "KernelProblem",
    "KernelSums",
    "Backend",
    "BACKENDS",
    "AUTO_ORDER",
    "kernel_sums",
    "register_backend",
    "available_backends",
    "exp_floor",
]


def exp_floor(dtype: np.dtype) -> float:
    """Lowest exponent kept before ``exp``: clamping there avoids subnormal numbers.

    Examples
    --------
    >>> import numpy as np
    >>> from wflow.kernels import exp_floor
    >>> exp_floor(np.float64), exp_floor(np.float32)
    (-700.0, -80.0)
    """
    return -80.0 if np.dtype(dtype) == np.float32 else -700.0


@dataclass(frozen=True)
class KernelSums:
    r"""Shifted kernel sums; the true sums are ``exp(log_scale) * mass`` and ``exp(log_scale) * vector``.

    Attributes
    ----------
    log_scale : ndarray, shape (..., n)
        The shift :math:`c_i` (a row maximum of :math:`\ell_{ij} + \log w_j`, or a bound on it).
    mass : ndarray, shape (..., n)
        :math:`\sum_j w_j e^{\ell_{ij} - c_i}`.
    vector : ndarray, shape (..., n, q) or None
        :math:`\sum_j w_j e^{\ell_{ij} - c_i} V y_j` (``None`` when values were not asked for).
    backend : str
        Name of the backend that computed them.

    Examples
    --------
    >>> import numpy as np, wflow
    >>> from wflow.kernels import kernel_sums
    >>> x = wflow.sphere.uniform(4, 3, seed=0)
    >>> s = kernel_sums(x, x, np.full(4, 0.25), 2.0, backend="numpy")
    >>> s.backend, s.log_scale.shape, s.mass.shape, s.vector.shape
    ('numpy', (4,), (4,), (4, 3))
    >>> bool(np.allclose(np.exp(s.log_scale) * s.mass, np.exp(2.0 * x @ x.T).mean(axis=1)))  # the true sums
    True
    """

    log_scale: np.ndarray
    mass: np.ndarray
    vector: np.ndarray | None
    backend: str

    def softmax_average(self) -> np.ndarray:
        r"""The attention average :math:`s^1_i / s^0_i` (SA), shape ``(..., n, q)``."""
        if self.vector is None:
            raise ValueError("these kernel sums were computed with values=False")
        return self.vector / self.mass[..., None]

    def total(self) -> np.ndarray:
        r"""The unshifted vector sum :math:`e^{c_i} s^1_i` (USA); raises on overflow."""
        if self.vector is None:
            raise ValueError("these kernel sums were computed with values=False")
        return self.vector * _safe_exp(self.log_scale)[..., None]

    def total_mass(self) -> np.ndarray:
        r"""The unshifted scalar sum :math:`e^{c_i} s^0_i`; raises on overflow."""
        return self.mass * _safe_exp(self.log_scale)


def _safe_exp(c: np.ndarray) -> np.ndarray:
    limit = np.log(np.finfo(c.dtype).max) - 1.0
    if np.any(c > limit):
        raise WflowError(
            f"kernel sum e^{float(np.max(c)):.4g} overflows {c.dtype}: the unnormalized (USA) velocity or energy "
            f"is not representable at this beta; use SA, a smaller beta, or work with the log-scale "
            f"(KernelSums.log_scale) directly"
        )
    return np.exp(c)


@dataclass(frozen=True)
class KernelProblem:
    r"""One kernel-sum request, validated and with leading axes flattened to one batch axis.

    ``x`` is ``(B, n, d)``, ``y`` is ``(B, m, d)``, ``weights`` is ``(B, m)``; ``Q``, ``K``
    are ``(p, d)`` or ``None`` (identity) and ``V`` is ``(q, d)`` or ``None`` (identity).

    Examples
    --------
    >>> import numpy as np, wflow
    >>> from wflow.kernels import BACKENDS, KernelProblem
    >>> x = wflow.sphere.uniform(5, 3, seed=0, batch=(2,))
    >>> problem = KernelProblem(x=x, y=x, weights=np.full((2, 5), 0.2), beta=1.0, Q=None, K=None, V=None,
    ...                         values=False)
    >>> problem.pairs, problem.is_rotation_invariant()  # B n m
    (50, True)
    >>> BACKENDS["numpy"](problem).mass.shape
    (2, 5)
    """

    x: np.ndarray
    y: np.ndarray
    weights: np.ndarray
    beta: float
    Q: np.ndarray | None
    K: np.ndarray | None
    V: np.ndarray | None
    values: bool
    tol: float | None = None

    @property
    def dtype(self) -> np.dtype:
        return self.x.dtype

    @property
    def pairs(self) -> int:
        return int(self.x.shape[0] * self.x.shape[1] * self.y.shape[1])

    def dense_operands(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        r"""``(a, b, logw, c)`` with :math:`a = \beta Q x`, :math:`b = K y`, :math:`\log w`, :math:`c = V y`.

        Then :math:`\ell_{ij} + \log w_j = \langle a_i, b_j\rangle + \log w_j`.
        """
        a = self.x if self.Q is None else self.x @ self.Q.T
        a = a * self.dtype.type(self.beta)
        b = self.y if self.K is None else self.y @ self.K.T
        with np.errstate(divide="ignore"):
            logw = np.log(self.weights)
        c = None
        if self.values:
            c = self.y if self.V is None else self.y @ self.V.T
        return a, b, logw, c

    def is_rotation_invariant(self) -> bool:
        """True when Q = K = I and V is a multiple of I (or absent): the kernel depends on <x, y> only."""

        def is_eye(M: np.ndarray | None) -> bool:
            return M is None or (
                M.shape[0] == M.shape[1] and np.array_equal(M, np.eye(M.shape[0], dtype=M.dtype))
            )

        v_ok = self.V is None or (
            self.V.shape[0] == self.V.shape[1]
            and np.array_equal(self.V, self.V[0, 0] * np.eye(self.V.shape[0], dtype=self.V.dtype))
        )
        return is_eye(self.Q) and is_eye(self.K) and v_ok


class Backend(Protocol):
    """A kernel-sum backend: ``available()``, ``accepts(problem)`` and ``__call__(problem)``.

    It may also define ``accepts_auto(problem)``, asked instead of ``accepts`` by
    ``backend="auto"``, and ``on_device(device)``, the same backend on another device
    (``backend="torch:cuda"``).

    Examples
    --------
    >>> from wflow.kernels import BACKENDS, Backend
    >>> numpy_backend = BACKENDS["numpy"]
    >>> numpy_backend.name, numpy_backend.available()
    ('numpy', True)
    """

    name: str

    def available(self) -> bool: ...

    def accepts(self, problem: KernelProblem) -> bool: ...

    def __call__(self, problem: KernelProblem) -> KernelSums: ...


BACKENDS: dict[str, Backend] = {}
#: Order in which ``backend="auto"`` asks backends whether they take a problem.
AUTO_ORDER: list[str] = []


def register_backend(backend: Backend, *, auto_priority: int | None = None) -> Backend:
    """Add a backend to :data:`BACKENDS` (and to :data:`AUTO_ORDER` at ``auto_priority``).

    Examples
    --------
    >>> import dataclasses
    >>> import numpy as np, wflow
    >>> from wflow.kernels import BACKENDS, kernel_sums, register_backend
    >>> class Plain:  # a toy backend: NumPy's sums under another name
    ...     name = "plain"
    ...     def available(self):
    ...         return True
    ...     def accepts(self, problem):
    ...         return True
    ...     def __call__(self, problem):
    ...         return dataclasses.replace(BACKENDS["numpy"](problem), backend=self.name)
    >>> _ = register_backend(Plain())  # not in AUTO_ORDER: used only when named
    >>> x = wflow.sphere.uniform(4, 3, seed=0)
    >>> kernel_sums(x, x, np.full(4, 0.25), 1.0, backend="plain").backend
    'plain'
    >>> del BACKENDS["plain"]
    """
    BACKENDS[backend.name] = backend
    if auto_priority is not None:
        if backend.name in AUTO_ORDER:
            AUTO_ORDER.remove(backend.name)
        AUTO_ORDER.insert(min(auto_priority, len(AUTO_ORDER)), backend.name)
    return backend


def available_backends() -> list[str]:
    """Names of the backends usable on this machine.

    Examples
    --------
    >>> from wflow.kernels import BACKENDS, available_backends
    >>> "numpy" in BACKENDS, "keops" in BACKENDS  # registered, usable or not
    (True, True)
    >>> "numpy" in available_backends()  # doctest: +SKIP
    True
    """
    return [name for name, b in BACKENDS.items() if b.available()]


def _as_matrix(M, name: str, d: int, dtype: np.dtype, rows: int | None = None) -> np.ndarray | None:
    if M is None:
        return None
    A = np.asarray(M)
    if A.dtype == object or not np.issubdtype(A.dtype, np.number) or np.iscomplexobj(A):
        raise TypeError(f"{name} must be a real matrix, got {short_repr(M)}")
    if A.ndim != 2 or A.shape[1] != d or (rows is not None and A.shape[0] != rows):
        want = f"({rows if rows is not None else 'p'}, {d})"
        raise ValueError(
            f"{name} must have shape {want} for points of dimension d={d}, got shape {A.shape}"
        )
    if not np.all(np.isfinite(A)):
        raise ValueError(f"{name} contains non-finite values: {short_repr(A)}")
    return A.astype(dtype)


def _writable(a: np.ndarray) -> np.ndarray:
    """``a`` as a writable array: a writable view when its memory is writable, else a copy (numba
    compiles every kernel twice, for read-only and writable arrays).  No backend writes into its
    input."""
    if a.flags.writeable:
        return a
    v = a.view()
    try:
        v.flags.writeable = True
    except ValueError:  # the memory itself is read-only (a broadcast, a read-only map)
        return a.copy()
    return v


def _checked_weights(weights, shape: tuple[int, ...], dtype) -> np.ndarray:
    """``weights`` as an array of ``shape``: finite, non-negative, not all zero in any system."""
    w = np.asarray(weights)
    real_float_dtype(w.dtype, "weights", integers=True)  # complex and object alike
    w = w.astype(dtype, copy=False)
    if w.shape != shape:
        raise ValueError(f"weights must have shape {shape}, got {w.shape}")
    # fast path: one reduction each; the exact test sorts out an overflowing sum
    if not (np.isfinite(np.sum(w)) and w.size and np.min(w) >= 0) and (
        not np.isfinite(w).all() or (w < 0).any()
    ):
        bad = w[~(np.isfinite(w) & (w >= 0))].ravel()[0]
        raise ValueError(f"weights must be finite and non-negative, got {float(bad)!r}")
    if w.shape[-1] and not (w.reshape(-1, w.shape[-1]).max(axis=-1) > 0).all():
        raise ValueError(
            "weights: every weight of a system is zero (the sums vanish and the "
            "softmax average is undefined); give each system a positive weight"
        )
    return w


def kernel_sums(
    x: np.ndarray,
    y: np.ndarray,
    weights: np.ndarray,
    beta: float,
    *,
    Q: np.ndarray | None = None,
    K: np.ndarray | None = None,
    V: np.ndarray | None = None,
    values: bool = True,
    backend: str = "auto",
    tol: float | None = None,
) -> KernelSums:
    r"""Shifted sums :math:`\sum_j w_j e^{\beta\langle Qx_i, Ky_j\rangle}[V y_j]` (see module docstring).

    Parameters
    ----------
    x : ndarray, shape (..., n, d)
        Query points (need not be on the sphere: Runge--Kutta stages are not).
    y : ndarray, shape (..., m, d)
        Source points; leading axes must equal those of ``x``.
    weights : ndarray, shape (..., m)
        Non-negative source weights.
    beta : float
        Inverse temperature (any finite real; ``beta = 0`` gives plain averages).
    Q, K : ndarray, shape (p, d), optional
        Query and key matrices (identity if omitted).
    V : ndarray, shape (q, d), optional
        Value matrix (identity if omitted).
    values : bool
        Also compute the vector sum :math:`s^1`.
    backend : str
        A name in :data:`BACKENDS`, ``"<name>:<device>"`` for a backend with devices
        (``"torch:cuda"``, ``"torch:cpu"``), or ``"auto"``.
    tol : float, optional
        Requested relative accuracy for approximate backends (``"spectral"``); the numba
        backend's tiny-systems route allows float32 logits below ``tol / 3``.

    Returns
    -------
    KernelSums
        ``log_scale`` and ``mass`` of shape ``(..., n)``, ``vector`` of shape ``(..., n, q)``.

    Examples
    --------
    >>> import numpy as np, wflow
    >>> from wflow.kernels import kernel_sums
    >>> x = wflow.sphere.uniform(5, 3, seed=0)
    >>> w = np.full(5, 0.2)
    >>> s = kernel_sums(x, x, w, 3.0, backend="numpy")
    >>> G = np.exp(3.0 * x @ x.T)  # the dense kernel e^{beta <x_i, x_j>}
    >>> scale = np.exp(s.log_scale)
    >>> bool(np.allclose(scale * s.mass, G @ w)), bool(np.allclose(scale[:, None] * s.vector, (G * w) @ x))
    (True, True)
    >>> kernel_sums(x, x, w, 0.0, values=False, backend="numpy").vector is None  # beta = 0: plain averages
    True
    """
    x = np.asarray(x)
    y = np.asarray(y)
    for name, arr in (("x", x), ("y", y)):  # complex or object arrays: refused, not cast
        if arr.dtype.kind not in "biuf":
            raise TypeError(f"{name} must be a real array of points, got dtype {arr.dtype}")
    dtype = np.result_type(x.dtype, y.dtype, np.float32)
    if dtype not in (np.float32, np.float64):
        dtype = np.dtype(np.float64)
    if x.ndim < 2 or y.ndim < 2:
        raise ValueError(f"x and y must have shape (..., n, d), got shapes {x.shape} and {y.shape}")
    if x.shape[-2] == 0 or y.shape[-2] == 0:
        raise ValueError(
            f"x (queries) and y (keys) must hold at least one point each, got shapes {x.shape} and "
            f"{y.shape}"
        )
    if isinstance(beta, (bool, str, bytes)) or not isinstance(
        beta, (int, float, np.integer, np.floating)
    ):
        raise TypeError(f"beta must be a real number, got {short_repr(beta)}")
    d = x.shape[-1]
    if y.shape[-1] != d:
        raise ValueError(
            f"x and y must have the same dimension d, got x.shape={x.shape}, y.shape={y.shape}"
        )
    if x.shape[:-2] != y.shape[:-2]:
        raise ValueError(
            f"x and y must have the same batch axes, got x.shape={x.shape}, y.shape={y.shape}"
        )
    if not (_all_finite(x) and _all_finite(y)):
        raise ValueError("x and y must be finite, got NaN or infinite coordinates")
    w = _checked_weights(weights, y.shape[:-1], dtype)
    if not np.isfinite(beta):
        raise ValueError(f"beta must be finite, got {beta!r}")
    Qm = _as_matrix(Q, "Q", d, dtype)
    Km = _as_matrix(K, "K", d, dtype, rows=None if Qm is None else Qm.shape[0])
    if Qm is None and Km is not None and Km.shape[0] != d:
        raise ValueError(f"K must have shape ({d}, {d}) when Q is the identity, got {Km.shape}")
    if Km is None and Qm is not None and Qm.shape[0] != d:
        raise ValueError(f"Q must have shape ({d}, {d}) when K is the identity, got {Qm.shape}")
    Vm = _as_matrix(V, "V", d, dtype)
    batch = x.shape[:-2]
    problem = KernelProblem(
        x=_writable(x.astype(dtype, copy=False).reshape(-1, *x.shape[-2:])),
        y=_writable(y.astype(dtype, copy=False).reshape(-1, *y.shape[-2:])),
        weights=_writable(w.reshape(-1, w.shape[-1])),
        beta=float(beta),
        Q=Qm,
        K=Km,
        V=Vm,
        values=bool(values),
        tol=tol,
    )
    impl = _select(backend, problem)
    out = impl(problem)
    n = x.shape[-2]
    vec = None if out.vector is None else out.vector.reshape(*batch, n, out.vector.shape[-1])
    return KernelSums(
        out.log_scale.reshape(*batch, n), out.mass.reshape(*batch, n), vec, out.backend
    )


def _all_finite(a: np.ndarray) -> bool:
    return bool(np.isfinite(np.sum(a))) or bool(np.isfinite(a).all())


def _select(backend: str, problem: KernelProblem) -> Backend:
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a string, got {short_repr(backend)}")
    if backend == "auto":
        for name in AUTO_ORDER:
            b = BACKENDS[name]
            # whether it would take the problem first: that asks no (slow) import
            if getattr(b, "accepts_auto", b.accepts)(problem) and b.available():
                return b
        return BACKENDS["numpy"]
    name, colon, device = backend.partition(":")
    if name not in BACKENDS:
        raise ValueError(f"backend must be 'auto' or one of {sorted(BACKENDS)}, got {backend!r}")
    b = BACKENDS[name]
    if colon:  # "torch:cuda": the backend on a device
        on_device = getattr(b, "on_device", None)
        if on_device is None:
            raise ValueError(f"backend {name!r} takes no device, got backend={backend!r}")
        b = on_device(device)
    if not b.available():
        why = f"backend {backend!r} is not available on this machine: {getattr(b, 'reason', '')}"
        raise ValueError(why.rstrip(": "))
    if not b.accepts(problem):
        why = getattr(b, "why_not", lambda p: "")(problem)
        raise ValueError(
            f"backend {backend!r} cannot compute this kernel sum{': ' + why if why else ''}"
        )
    return b
