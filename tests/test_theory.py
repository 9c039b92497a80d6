import numpy as np
import pytest
from scipy import integrate, special

from wflow import theory


@pytest.mark.parametrize("d", [2, 3, 5])
@pytest.mark.parametrize("beta", [0.5, 4.0, 30.0])
def test_funk_hecke_against_quadrature(d, beta):
    """c_l = E_{x ~ unif}[e^{beta x_1} P_l^{(d)}(x_1)] with the normalized Gegenbauer polynomial."""
    for ell in range(5):
        lam = d / 2 - 1
        if d == 2:
            P = lambda t: np.cos(ell * np.arccos(np.clip(t, -1, 1)))  # noqa: E731
        else:
            P = lambda t: (
                special.eval_gegenbauer(ell, lam, t) / special.eval_gegenbauer(ell, lam, 1.0)
            )  # noqa: E731
        # t = cos(phi): the surface measure on S^{d-1} projects to sin^{d-2}(phi) dphi
        f = lambda phi: np.exp(beta * (np.cos(phi) - 1)) * P(np.cos(phi)) * np.sin(phi) ** (d - 2)  # noqa: E731
        num = integrate.quad(f, 0, np.pi, limit=200, epsabs=1e-14)[0]
        den = integrate.quad(lambda phi: np.sin(phi) ** (d - 2), 0, np.pi)[0]
        expected = num / den * np.exp(beta)
        assert abs(theory.funk_hecke(ell, beta, d) - expected) < 1e-9 * np.exp(beta)


def test_circle_growth_rates_match_design():
    k = np.arange(1, 5)
    np.testing.assert_allclose(
        theory.growth_rate(k, 5.0, 2, "USA"), k**2 * special.iv(k, 5.0) / 5.0, rtol=1e-13
    )
    np.testing.assert_allclose(
        theory.growth_rate(k, 5.0, 2, "SA"),
        k**2 * special.iv(k, 5.0) / (5.0 * special.iv(0, 5.0)),
        rtol=1e-13,
    )


def test_most_unstable_mode_grows_with_beta():
    modes = [theory.most_unstable_mode(b, 2, "SA") for b in (1, 9, 40)]
    assert modes == sorted(modes) and modes[0] == 1 and modes[-1] > modes[1]


def test_equiangular_configuration():
    x = theory.equiangular_configuration(7, 0.3)
    G = x @ x.T
    np.testing.assert_allclose(np.diag(G), 1, atol=1e-15)
    np.testing.assert_allclose(G[~np.eye(7, dtype=bool)], 0.3, atol=1e-15)
    with pytest.raises(ValueError, match="rho"):
        theory.equiangular_configuration(3, -0.6)


def test_equiangular_rhs_fixed_points():
    for model in ("SA", "USA"):
        assert theory.equiangular_rhs(1.0, 3.0, 5, model) == 0.0
        assert abs(theory.equiangular_rhs(-1 / 4, 3.0, 5, model)) < 1e-15


def test_long_context_limits():
    rho = 0.5
    assert theory.long_context_limit(rho, 1.0) == 1.0
    assert theory.long_context_limit(rho, 2.0) == pytest.approx(4 * rho / (1 + 3 * rho))
    assert theory.long_context_limit(rho, 3.0) == rho


# --------------------------------------------------------------------------------------
# Equiangular reduction for every normalization scheme
# --------------------------------------------------------------------------------------

SCHEME_KW = {
    "post-ln": {},
    "pre-ln": {},
    "peri-ln": {},
    "mix-ln": {"tau": 0.7},
    "ngpt": {"alpha": lambda t: 0.5 + 0.3 * np.sin(t)},
    "sqrt": {},
}


def _design_rates(t, rho, r, beta, n, model, scheme, tau=None, alpha=None):
    """(rho', r') straight from the DESIGN.md §1 formulas (a, b, Z, <theta, A>, ||A||)."""
    if model == "SA":
        Z = np.exp(beta) + (n - 1) * np.exp(beta * rho)
        a, b = np.exp(beta) / Z, np.exp(beta * rho) / Z
    else:
        a, b = np.exp(beta) / n, np.exp(beta * rho) / n
    inner = a + (n - 1) * b * rho
    norm = np.sqrt(a * a + 2 * a * b * (n - 1) * rho + b * b * (n - 1) * (1 + (n - 2) * rho))
    if scheme == "mix-ln":
        scheme = "post-ln" if t <= tau else "pre-ln"
    s, dr = {
        "post-ln": (1.0, 0.0),
        "pre-ln": (r, inner),
        "peri-ln": (r * norm, inner / norm),
        "ngpt": (norm / (alpha(t) if alpha else 1.0), 0.0),
        "sqrt": (np.sqrt(t + 1), 0.0),
    }[scheme]
    return 2 / s * b * (1 - rho) * (1 + (n - 1) * rho), dr


@pytest.mark.parametrize("model", ["SA", "USA"])
@pytest.mark.parametrize("scheme", theory.SCHEMES)
def test_scheme_rhs_matches_design_formulas(scheme, model):
    kw = SCHEME_KW[scheme]
    for t, rho, r in [(0.3, 0.2, 1.7), (1.5, -0.2, 0.6), (4.0, 0.999, 3.0)]:
        got = theory.equiangular_scheme_rhs(rho, r, 2.5, 6, model, scheme, t=t, **kw)
        want = _design_rates(t, rho, r, 2.5, 6, model, scheme, kw.get("tau"), kw.get("alpha"))
        np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-16)


def _particle_velocity(t, x, beta, model, scheme, tau=None, alpha=None, convention="plain"):
    """Tokens x_i = r_i theta_i in R^d moved by the scheme's own law (no reduction used)."""
    r = np.linalg.norm(x, axis=1, keepdims=True)
    theta = x / r
    logits = beta * theta @ theta.T - (beta if convention == "rescaled" else 0.0)
    if model == "SA":
        W = special.softmax(logits, axis=1)
    else:
        W = np.exp(logits) / len(x)
    A = W @ theta
    tangent = A - np.sum(A * theta, 1, keepdims=True) * theta  # P_theta A
    normA = np.linalg.norm(A, axis=1, keepdims=True)
    if scheme == "mix-ln":
        scheme = "post-ln" if t <= tau else "pre-ln"
    if scheme == "post-ln":
        return r * tangent
    if scheme == "pre-ln":
        return A  # free space: x' = A(theta)
    if scheme == "peri-ln":
        return A / normA
    if scheme == "ngpt":
        return r * alpha(t) * tangent / normA
    return r * tangent / np.sqrt(t + 1)  # sqrt-scaling


@pytest.mark.parametrize("model", ["SA", "USA"])
@pytest.mark.parametrize("scheme", theory.SCHEMES)
def test_reduction_against_particles(scheme, model):
    """n = 4 equiangular tokens integrated in R^4 keep all cosines and radii equal to the reduced ODE (1e-9)."""
    n, beta, rho0, r0 = 4, 1.3, 0.1, 1.25
    kw = SCHEME_KW[scheme]
    x0 = r0 * theory.equiangular_configuration(n, rho0)
    times = [0.5, 1.0, 2.0]
    edges = [0.0, kw["tau"], 2.0] if scheme == "mix-ln" else [0.0, 2.0]
    y, states = x0.ravel(), {}
    for lo, hi in zip(edges[:-1], edges[1:]):
        mid = 0.5 * (lo + hi)
        # Mix-LN: the phase of a segment is the phase at its midpoint (mix-ln does not use t otherwise)
        f = lambda t, y: _particle_velocity(
            mid if scheme == "mix-ln" else t,
            y.reshape(n, n),
            beta,  # noqa: E731
            model,
            scheme,
            kw.get("tau"),
            kw.get("alpha"),
        ).ravel()
        ev = [s for s in times if lo < s <= hi]
        sol = integrate.solve_ivp(
            f, (lo, hi), y, method="DOP853", rtol=1e-12, atol=1e-14, dense_output=True
        )
        states.update({s: sol.sol(s).reshape(n, n) for s in ev})
        y = sol.y[:, -1]  # the state at hi
    red = theory.equiangular_scheme_solution(times, beta, n, model, scheme, rho0=rho0, r0=r0, **kw)
    for k, s in enumerate(times):
        x = states[s]
        r = np.linalg.norm(x, axis=1)
        G = (x / r[:, None]) @ (x / r[:, None]).T
        np.testing.assert_allclose(G[~np.eye(n, dtype=bool)], red.rho[k], atol=1e-9)
        np.testing.assert_allclose(r, red.r[k], rtol=1e-9)
    assert red.rho[-1] > rho0 + 1e-3  # it moved


@pytest.mark.parametrize("model", ["SA", "USA"])
def test_post_ln_reproduces_existing_solution(model):
    """The scheme solver (state 1-rho) against DOP853 on the original equiangular_rhs in rho: 1e-12."""
    t = np.linspace(0, 6, 13)
    beta, n, rho0 = (3.0, 10, -0.05) if model == "SA" else (1.5, 10, -0.05)
    ref = integrate.solve_ivp(
        lambda _t, r: theory.equiangular_rhs(r, beta, n, model),
        (0, 6),
        [rho0],
        method="DOP853",
        t_eval=t,
        rtol=1e-13,
        atol=1e-15,
    ).y[0]
    np.testing.assert_allclose(
        theory.equiangular_solution(rho0, t, beta, n, model), ref, atol=1e-12, rtol=0
    )
    sol = theory.equiangular_scheme_solution(t, beta, n, model, "post-ln", rho0=rho0)
    np.testing.assert_allclose(sol.rho, ref, atol=1e-12, rtol=0)
    np.testing.assert_array_equal(sol.r, 1.0)
    rho = np.linspace(-1 / 9, 1, 7)
    np.testing.assert_allclose(
        theory.equiangular_scheme_rhs(rho, 1.0, beta, n, model)[0],
        theory.equiangular_rhs(rho, beta, n, model),
        rtol=1e-14,
        atol=1e-300,
    )


@pytest.mark.parametrize("scheme", ["ngpt", "peri-ln"])
def test_scale_free_schemes_do_not_see_usa_normalization(scheme):
    """nGPT and Peri-LN use A/||A||: SA and USA give the same trajectory (A differs by a scalar)."""
    kw = {"alpha": 0.8} if scheme == "ngpt" else {}
    t = [1.0, 3.0, 9.0]
    sa = theory.equiangular_scheme_solution(t, 2.0, 5, "SA", scheme, rho0=0.3, **kw)
    usa = theory.equiangular_scheme_solution(t, 2.0, 5, "USA", scheme, rho0=0.3, **kw)
    np.testing.assert_allclose(usa.gap, sa.gap, rtol=1e-9)
    np.testing.assert_allclose(usa.r, sa.r, rtol=1e-12)


def test_usa_conventions_are_a_time_change():
    """USA plain at t equals USA rescaled at e^beta t (kernel factor e^beta), SA is unchanged."""
    beta, n = 3.0, 6
    t = np.array([0.01, 0.05, 0.2])
    plain = theory.equiangular_scheme_solution(t, beta, n, "USA", rho0=0.1)
    resc = theory.equiangular_scheme_solution(
        theory.rescaled_time(t, beta), beta, n, "USA", rho0=0.1, convention="rescaled"
    )
    np.testing.assert_allclose(resc.gap, plain.gap, rtol=1e-10)
    np.testing.assert_allclose(
        theory.plain_time(theory.rescaled_time(t, beta), beta), t, rtol=1e-15
    )
    np.testing.assert_array_equal(theory.rescaled_time(t, beta, "SA"), t)
    sa_r = theory.equiangular_scheme_solution(t, beta, n, "SA", rho0=0.1, convention="rescaled")
    sa_p = theory.equiangular_scheme_solution(t, beta, n, "SA", rho0=0.1)
    np.testing.assert_array_equal(sa_r.gap, sa_p.gap)


def test_energy_conversion(rng):
    x = rng.normal(size=(7, 3))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    w = rng.random(7)
    w /= w.sum()
    beta = 40.0
    G = x @ x.T
    plain = w @ np.exp(beta * G) @ w / (2 * beta)
    resc = w @ np.exp(beta * (G - 1)) @ w / (2 * beta)
    assert theory.rescaled_energy(plain, beta) == pytest.approx(resc, rel=1e-14)
    assert theory.plain_energy(resc, beta) == pytest.approx(plain, rel=1e-14)
    with pytest.raises(ValueError, match="beta = 800.0.*rescaled"):
        theory.plain_energy(1.0, 800.0)


# --------------------------------------------------------------------------------------
# Late-time laws
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("model", ["SA", "USA"])
@pytest.mark.parametrize(
    "scheme,kw,window,rate",
    [
        ("post-ln", {}, (9.0, 12.0), {"SA": 2.0, "USA": 2 * np.e}),
        ("sqrt", {}, (30.0, 40.0), {"SA": 4.0, "USA": 4 * np.e}),
        ("ngpt", {"alpha": 0.7}, (14.0, 20.0), {"SA": 2.0, "USA": 2.0}),
        (
            "ngpt",
            {"alpha": [0.2, 1.0, 0.5], "alpha_times": [0.0, 3.0, 5.0]},
            (20.0, 30.0),
            {"SA": 2.0, "USA": 2.0},
        ),
    ],
)
def test_exponential_laws(scheme, kw, window, rate, model):
    """Fitted log-slope of 1-rho against the derived rate, and 1-rho / (C e^{-rate clock}) -> 1 (C by quad)."""
    beta, n = 1.0, 8
    law = theory.equiangular_asymptotics(beta, n, model, scheme, rho0=0.0, **kw)
    assert law.rate == pytest.approx(rate[model], rel=1e-15)
    t = np.linspace(*window, 6)
    sol = theory.equiangular_scheme_solution(t, beta, n, model, scheme, rho0=0.0, **kw)
    clock = {"exponential": t, "exponential-sqrt": np.sqrt(t + 1), "exponential-alpha": None}[
        law.law
    ]
    if clock is None:
        ts = kw.get("alpha_times")
        clock = (
            0.7 * t
            if ts is None
            # piecewise-linear alpha, integrated by hand
            else (0.2 + 1.0) / 2 * 3 + (1.0 + 0.5) / 2 * 2 + 0.5 * (t - 5)
        )
        np.testing.assert_allclose(law.clock(t), clock, rtol=1e-14)
    slope = np.polyfit(clock, np.log(sol.gap), 1)[0]
    assert abs(-slope / law.rate - 1) < 1e-6
    np.testing.assert_allclose(sol.gap / law.gap(t), 1.0, rtol=2e-7)


@pytest.mark.parametrize("model", ["SA", "USA"])
@pytest.mark.parametrize("scheme", ["pre-ln", "peri-ln", "mix-ln"])
def test_power_laws(scheme, model):
    """t^2 (1-rho) settles to the constant C of the exact quadrature, with an O(1/t) approach."""
    beta, n, rho0 = 1.0, 8, 0.0
    kw = {"tau": 1.0} if scheme == "mix-ln" else {}
    law = theory.equiangular_asymptotics(beta, n, model, scheme, rho0=rho0, **kw)
    t = np.array([1e3, 1e4, 1e5])
    sol = theory.equiangular_scheme_solution(t, beta, n, model, scheme, rho0=rho0, **kw)
    dev = t**2 * sol.gap / law.constant - 1
    assert abs(dev[-1]) < 1e-4
    np.testing.assert_allclose(dev[:-1] / dev[1:], 10.0, rtol=2e-3)  # O(1/t)
    if scheme != "mix-ln":  # SA Pre-LN, SA and USA Peri-LN share C; USA Pre-LN has r ~ e^beta t
        factor = np.exp(-2 * beta) if (model, scheme) == ("USA", "pre-ln") else 1.0
        assert law.constant == pytest.approx(1.5331497777 * factor, rel=1e-9)


@pytest.mark.parametrize("scheme", ["pre-ln", "peri-ln"])
def test_radial_invariant(scheme):
    """Along Pre-/Peri-LN trajectories log(r/r0) = int_u^{u0} (e^{beta v} + (n-1)(1-v)) / (2v(n-(n-1)v)) dv."""
    beta, n, rho0, r0 = 2.0, 5, -0.1, 0.7
    t = np.array([0.5, 3.0, 40.0])
    sol = theory.equiangular_scheme_solution(t, beta, n, "SA", scheme, rho0=rho0, r0=r0)
    f = lambda v: (np.exp(beta * v) + (n - 1) * (1 - v)) / (2 * v * (n - (n - 1) * v))  # noqa: E731
    for u, r in zip(sol.gap, sol.r):
        want = integrate.quad(f, u, 1 - rho0, epsabs=0, epsrel=1e-13)[0]
        assert np.log(r / r0) == pytest.approx(want, rel=1e-10)


def test_mix_ln_limits():
    """Mix-LN with tau = 0 is Pre-LN; with tau beyond the horizon it is Post-LN."""
    t = [0.5, 2.0, 6.0]
    pre = theory.equiangular_scheme_solution(t, 1.0, 6, "SA", "pre-ln", rho0=0.2, r0=2.0)
    mix0 = theory.equiangular_scheme_solution(t, 1.0, 6, "SA", "mix-ln", rho0=0.2, r0=2.0, tau=0.0)
    post = theory.equiangular_scheme_solution(t, 1.0, 6, "SA", "post-ln", rho0=0.2, r0=2.0)
    mix_inf = theory.equiangular_scheme_solution(
        t, 1.0, 6, "SA", "mix-ln", rho0=0.2, r0=2.0, tau=10.0
    )
    np.testing.assert_allclose(mix0.gap, pre.gap, rtol=1e-14)
    np.testing.assert_allclose(mix_inf.gap, post.gap, rtol=1e-14)
    np.testing.assert_array_equal(mix_inf.r, 2.0)


# --------------------------------------------------------------------------------------
# Time to a cosine
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("model,beta", [("SA", 0.5), ("SA", 6.0), ("USA", 1.0)])
def test_equiangular_time_against_quadrature(model, beta):
    n, rho0, target = 32, 0.0, 0.999
    ref = integrate.quad(
        lambda r: 1 / theory.equiangular_rhs(r, beta, n, model),
        rho0,
        target,
        epsabs=0,
        epsrel=1e-13,
        limit=200,
    )[0]
    assert theory.equiangular_time(beta, n, target, rho0, model) == pytest.approx(ref, abs=1e-8)
    # sqrt-scaling is Post-LN in the clock T = 2 sqrt(t+1) - 2
    t_sqrt = theory.equiangular_time(beta, n, target, rho0, model, "sqrt")
    assert t_sqrt == pytest.approx((1 + ref / 2) ** 2 - 1, abs=1e-8)


def test_equiangular_time_ngpt_and_pre_ln_against_quadrature():
    beta, n, rho0, target = 2.0, 6, -0.1, 0.99
    u0, u1 = 1 - rho0, 1 - target

    # nGPT, alpha = 0.6: u' = -2 alpha q g / N, q = e^{-beta u}, N = ||A|| / a
    def ngpt_speed(u):
        q, rho = np.exp(-beta * u), 1 - u
        N = np.sqrt(1 + 2 * q * (n - 1) * rho + q * q * (n - 1) * (1 + (n - 2) * rho))
        return 2 * q * u * (n - (n - 1) * u) / N

    ref = integrate.quad(lambda u: 1 / ngpt_speed(u), u1, u0, epsabs=0, epsrel=1e-13)[0] / 0.6
    assert theory.equiangular_time(beta, n, target, rho0, "SA", "ngpt", alpha=0.6) == pytest.approx(
        ref, abs=1e-8
    )
    # Pre-LN, SA: u' = -2 b g / r with r(u) = r0 exp(int_u^{u0} f)
    r0 = 1.5
    f = lambda v: (np.exp(beta * v) + (n - 1) * (1 - v)) / (2 * v * (n - (n - 1) * v))  # noqa: E731

    def dt_du(u):
        r = r0 * np.exp(integrate.quad(f, u, u0, epsabs=0, epsrel=1e-13)[0])
        b = np.exp(-beta * u) / (1 + (n - 1) * np.exp(-beta * u))
        return r / (2 * b * u * (n - (n - 1) * u))

    ref = integrate.quad(dt_du, u1, u0, epsabs=0, epsrel=1e-12)[0]
    got = theory.equiangular_time(beta, n, target, rho0, "SA", "pre-ln", r0=r0)
    assert got == pytest.approx(ref, abs=1e-8)


def test_equiangular_time_vectorized_and_edges():
    betas = np.linspace(0.1, 9, 5)
    many = theory.equiangular_time(betas, 32)
    assert many.shape == (5,) and np.all(np.diff(many) > 0)
    np.testing.assert_array_equal(many, [theory.equiangular_time(float(b), 32) for b in betas])
    # GLPR phase diagram numbers quoted in issue 15 (n = 32, rho0 = 0)
    np.testing.assert_allclose(
        theory.equiangular_time([1.0, 4.0, 6.0, 8.0], 32), [5.27, 6.95, 16.0, 73.4], atol=0.05
    )
    assert theory.equiangular_time(1.0, 8, rho_target=0.5, rho0=0.6) == 0.0
    assert theory.equiangular_time(1.0, 8, rho0=-1 / 7, t_max=1e3) == np.inf
    grid = theory.equiangular_time([[1.0], [2.0]], 8, rho_target=[0.9, 0.99])
    assert grid.shape == (2, 2) and grid[0, 0] < grid[0, 1]


# --------------------------------------------------------------------------------------
# Long context
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["pre-ln", "post-ln"])
def test_long_context_closed_form_against_tokens(scheme):
    """The closed form against softmax attention on 300 explicit equiangular tokens."""
    n, rho, eta = 300, 0.4, 0.7
    x = theory.equiangular_configuration(n, rho)
    for gamma in (0.8, 1 / (1 - rho), 3.0):
        W = special.softmax(gamma * np.log(n) * (x @ x.T), axis=1)
        y = W @ x if scheme == "pre-ln" else x + eta * (W @ x)
        cos = y[0] @ y[1] / (np.linalg.norm(y[0]) * np.linalg.norm(y[1]))
        got = theory.long_context_cosine(rho, gamma, n, scheme=scheme, eta=eta)
        assert got == pytest.approx(cos, abs=1e-12)


@pytest.mark.parametrize(
    "scheme,exponents", [("pre-ln", (-1.2, -1.0, -0.6)), ("post-ln", (-0.6, -1.0, -0.6))]
)
def test_long_context_approaches_limit(scheme, exponents):
    """|cos_n - limit| ~ n^{slope}: slopes fitted over n = 1e8..1e12 against the derived exponents."""
    rho = 0.5
    n = np.logspace(8, 12, 5)
    for gamma, expected in zip(
        (0.8, 2.0, 3.2), exponents
    ):  # gamma_c = 2, c = gamma (1 - rho) = 0.4, 1, 1.6
        limit = theory.long_context_limit(rho, gamma, scheme=scheme)
        if scheme == "pre-ln" and gamma < 2:
            err = theory.long_context_gap(
                rho, gamma, n, scheme=scheme
            )  # limit 1: use the accurate gap
            ratio = err / ((1 - rho) / rho * n ** (-1.2))  # the derived prefactor (1-rho)/rho
            assert np.all(np.diff(np.abs(ratio - 1)) < 0) and abs(ratio[-1] - 1) < 1e-4
        else:
            err = np.abs(theory.long_context_cosine(rho, gamma, n, scheme=scheme) - limit)
        slope = np.polyfit(np.log(n), np.log(err), 1)[0]
        assert slope == pytest.approx(expected, abs=2e-3)


def test_long_context_extremes_are_finite():
    cos = theory.long_context_cosine(0.5, np.array([0.0, 1e-3, 100.0]), 1e12)
    np.testing.assert_allclose(cos, [1.0, 1.0, 0.5], atol=1e-12)
    # rho = 0.999, gamma = 100: c = 0.1, below gamma_c = 1000; theta + A tends to 4 rho / (1 + 3 rho)
    got = theory.long_context_cosine(0.999, 100.0, 1e12, scheme="post-ln")
    assert got == pytest.approx(4 * 0.999 / (1 + 3 * 0.999), abs=1e-10)
    assert theory.long_context_limit(0.5, 1.0, scheme="post-ln") == pytest.approx(0.8)
    assert theory.long_context_limit(0.5, 2.0, scheme="post-ln") == pytest.approx(
        16 * 0.5 / (9 + 3.5)
    )


# --------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call,exc,match",
    [
        (
            lambda: theory.equiangular_scheme_solution([1.0], 1.0, 4, rho0=1.5),
            ValueError,
            r"rho0 .*1\.5",
        ),
        (lambda: theory.equiangular_scheme_solution([-1.0], 1.0, 4), ValueError, "t must"),
        (
            lambda: theory.equiangular_scheme_solution([1.0], 1.0, 4, scheme="layernorm"),
            ValueError,
            "'layernorm'",
        ),
        (lambda: theory.equiangular_scheme_solution([1.0], 1.0, 4, "MHA"), ValueError, "'MHA'"),
        (lambda: theory.equiangular_scheme_solution([1.0], 1.0, 1), ValueError, "n must"),
        (lambda: theory.equiangular_scheme_solution([1.0], -1.0, 4), ValueError, "beta .*-1.0"),
        (
            lambda: theory.equiangular_scheme_solution([1.0], 1.0, 4, scheme="mix-ln"),
            ValueError,
            "tau",
        ),
        (
            lambda: theory.equiangular_scheme_solution([1.0], 1.0, 4, scheme="mix-ln", tau=-2.0),
            ValueError,
            "tau .*-2.0",
        ),
        (
            lambda: theory.equiangular_scheme_solution([1.0], 1.0, 4, scheme="mix-ln", tau=np.inf),
            ValueError,
            "tau",
        ),
        (lambda: theory.equiangular_scheme_solution([1.0], 1.0, 4, tau=1.0), ValueError, "tau"),
        (
            lambda: theory.equiangular_scheme_solution([1.0], 1.0, 4, scheme="ngpt"),
            ValueError,
            "alpha",
        ),
        (
            lambda: theory.equiangular_scheme_solution([1.0], 1.0, 4, scheme="ngpt", alpha=-0.1),
            ValueError,
            "alpha .*-0.1",
        ),
        (
            lambda: theory.equiangular_scheme_solution(
                [1.0], 1.0, 4, scheme="ngpt", alpha=[1.0, 2.0]
            ),
            ValueError,
            "alpha_times",
        ),
        (
            lambda: theory.equiangular_scheme_solution(
                [1.0], 1.0, 4, scheme="ngpt", alpha=[1.0, -2.0], alpha_times=[0, 1]
            ),
            ValueError,
            "alpha values",
        ),
        (
            lambda: theory.equiangular_scheme_solution(
                [1.0], 1.0, 4, scheme="ngpt", alpha=lambda t: -1.0
            ),
            ValueError,
            r"alpha\(t\)",
        ),
        (
            lambda: theory.equiangular_scheme_solution([1.0], 1.0, 4, scheme="ngpt", alpha="big"),
            TypeError,
            "alpha",
        ),
        (
            lambda: theory.equiangular_scheme_solution([1.0], 800.0, 4, "USA"),
            ValueError,
            "beta = 800.0.*rescaled",
        ),
        (
            lambda: theory.equiangular_scheme_solution([1.0], 1.0, 4, convention="shifted"),
            ValueError,
            "convention",
        ),
        (
            lambda: theory.equiangular_scheme_solution([1.0], 1.0, 4, "SA", "pre-ln", r0=0.0),
            ValueError,
            "r0",
        ),
        (lambda: theory.equiangular_time(1.0, 4, rho_target=1.0), ValueError, "rho_target .*1.0"),
        (lambda: theory.equiangular_asymptotics(1.0, 4, rho0=-1 / 3), ValueError, "fixed point"),
        (lambda: theory.long_context_limit(0.0, 1.0), ValueError, "rho .*0.0"),
        (lambda: theory.long_context_cosine(0.5, -1.0, 100), ValueError, "gamma"),
        (lambda: theory.long_context_cosine(0.5, 1.0, 1), ValueError, "n must"),
        (
            lambda: theory.long_context_cosine(0.5, 1.0, 100, scheme="peri-ln"),
            ValueError,
            "'peri-ln'",
        ),
        (lambda: theory.rescaled_time(1.0, 1.0, "softmax"), ValueError, "'softmax'"),
    ],
)
def test_bad_input(call, exc, match):
    with pytest.raises(exc, match=match):
        call()
