"""
Synchronization in d = 3 and the collapse of a hemisphere
=========================================================

From random starts on :math:`S^2`, tokens under softmax (SA) and unnormalized (USA) attention with
:math:`\\beta = 1` all converge to one point (Geshkovski--Letrouit--Polyanskiy--Rigollet, Theorem 4.1:
:math:`d \\ge 3`, small :math:`\\beta`).  The last approach is the linearization at the synchronized
state: deviations from the mean direction decay like :math:`e^{-\\lambda t}` with :math:`\\lambda = 1`
(SA) and :math:`\\lambda = e^{\\beta}` (USA), dotted.  Right: tokens that start in an open hemisphere
collapse exponentially, even at :math:`\\beta = 4`, where a few starts linger near two clusters first.
``wflow validate dichotomy`` measures the same with many seeds (docs: papers/dichotomy).
"""

import matplotlib.pyplot as plt
import numpy as np

import wflow
from wflow.studies.dichotomy import deviation_from_mean, diameter, hemisphere_start, linearized_rate

n, d, seeds = 16, 3, 16
rng = np.random.default_rng(0)
fig, axes = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
starts = {
    "uniform": wflow.sphere.uniform(n, d, rng, batch=(seeds,)),
    "hemisphere": hemisphere_start(n, d, seeds, rng),
}
for ax, (kind, x0) in zip(axes, starts.items()):
    for name, beta in (("SA", 1.0), ("USA", 1.0), ("SA", 4.0)):
        if kind == "uniform" and beta > 1:
            continue
        lam = linearized_rate(name, beta)
        T = 30.0 / max(1.0, lam / 2)
        model = {"SA": wflow.SA, "USA": wflow.USA}[name](beta)
        tr = wflow.simulate(
            model,
            x0,
            T,
            save_at=wflow.SaveAt(np.linspace(0, T, 121), diagnostics=()),
            dt=0.05 / max(1.0, lam / 2),
        )
        series = (
            deviation_from_mean(tr.points)
            if kind == "uniform"
            else np.stack([diameter(x) for x in tr.points])
        )
        t = np.asarray(tr.times)
        med = np.median(series, axis=1)
        (line,) = ax.semilogy(t, med, label=f"{name}, β={beta:g}: median of {seeds} starts")
        ax.semilogy(t, series, color=line.get_color(), alpha=0.08, lw=0.7)
        i = int(np.argmax(med < 1e-3))
        ax.semilogy(t[i:], med[i] * np.exp(-lam * (t[i:] - t[i])), "k:", lw=1)
    ax.set_ylim(1e-14, 5)
    ax.set_xlabel("t (depth)")
    ax.set_ylabel("max_i d(x_i, mean) (rad)" if kind == "uniform" else "diameter (rad)")
    ax.set_title(f"{kind} start, n = {n}, d = {d}; dotted: e^(-λt)", fontsize=10)
    ax.legend(fontsize=8)
plt.show()
