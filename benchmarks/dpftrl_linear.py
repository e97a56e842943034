"""Experiment 1 of issue 8: does ν-DP-FTRL's advantage over DP-SGD grow as d_eff falls?

Linear regression in d = 1000 dimensions, x ~ N(0, H), H = diag(λ), λ_j ∝ j^(−α) scaled so that
‖H‖ = λ_1 = 1, hence d_eff = Tr H / ‖H‖ = Σ_j j^(−α) (α = 0 → 1000 … α = 1.25 → ≈ 4).
y = ⟨θ*, x⟩ + ξ with θ*ᵀHθ* = 1 and ξ ~ N(0, 0.01). N examples, batch B, E epochs, the same
T = E·⌈N/B⌉ steps and the same (ε, δ) for every mechanism:

* **DP-SGD, no amplification**: fixed-order batches, independent noise
  (``NuDPFTRLNoise(bands=1)``), σ from the Gaussian mechanism with sensitivity √E — isolates the
  effect of the correlation;
* **DP-SGD, Poisson**: Poisson sampling with q = B/N, σ from ``accounting.noise_multiplier``;
* **ν-DP-FTRL**: fixed-order batches (``FixedOrderSampler``), ``NuDPFTRLNoise`` un-banded, σ
  from ``accounting.dpftrl_noise_multiplier``, for a few ν;
* **non-private**: σ = 0 (the floor: finite-sample error and clipping bias).

Per-sample gradients are in closed form, g_i = (⟨θ, x_i⟩ − y_i) x_i with ‖g_i‖ = |r_i|·‖x_i‖,
clipped at C = √(Tr H) (a data-independent choice: ‖x‖ ≈ √(Tr H), residuals ≈ N(0, 0.01) at
θ*). The update is θ ← θ − η (Σ clipped g_i + noise)/B. Metric: excess population risk of the
last iterate, ½ (θ − θ*)ᵀ H (θ − θ*). The learning rate is tuned per (mechanism, α) on a grid
(and ν per α for the best-ν row) by the mean over the same seeds that are reported — oracle
tuning, identical for every mechanism.

    .venv/bin/python benchmarks/dpftrl_linear.py            # writes docs/benchmarks_dpftrl.md
    .venv/bin/python benchmarks/dpftrl_linear.py --quick    # a smoke run, prints only
"""

from __future__ import annotations

import argparse
import math
import platform
import time
from pathlib import Path

import numpy as np
import torch

from dprc_core import accounting
from dprc_core.noise import NuDPFTRLNoise
from dprc_core.training.sampling import FixedOrderSampler, PoissonSampler

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
DELTA = 1e-5
NOISE_SD = 0.1


def make_problem(alpha: float, d: int, n: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    lam = torch.arange(1, d + 1, dtype=torch.float64) ** (-alpha)
    x = torch.randn(n, d, generator=gen, dtype=torch.float64) * lam.sqrt()
    theta = torch.randn(d, generator=gen, dtype=torch.float64)
    theta /= torch.sqrt((lam * theta**2).sum())  # θ*ᵀHθ* = 1
    y = x @ theta + NOISE_SD * torch.randn(n, generator=gen, dtype=torch.float64)
    return lam, x, y, theta


def clipped_sum(theta: torch.Tensor, xb: torch.Tensor, yb: torch.Tensor, clip: float):
    """θ: (L, d) for L learning rates; xb: (b, d). Σ_i min(1, C/‖g_i‖) g_i for each row."""
    r = theta @ xb.T - yb  # (L, b)
    norms = r.abs() * xb.norm(dim=1)  # ‖g_i‖ = |r_i|·‖x_i‖
    factor = torch.clamp(clip / norms.clamp_min(1e-300), max=1.0)
    return (r * factor) @ xb  # (L, d)


def run(
    method: str,
    sigma: float,
    nu: float,
    lrs: torch.Tensor,
    problem,
    n: int,
    batch: int,
    epochs: int,
    seed: int,
) -> np.ndarray:
    """Excess risk of the last iterate for every learning rate (vectorised over lrs)."""
    lam, x, y, theta_star = problem
    d = lam.numel()
    clip = math.sqrt(float(lam.sum()))
    gen = torch.Generator().manual_seed(10_000 + seed)
    theta = torch.zeros(lrs.numel(), d, dtype=torch.float64)
    std = sigma * clip
    if method == "dpsgd-poisson":
        sampler = PoissonSampler(n, batch / n, epochs * math.ceil(n / batch), seed=seed)
        noise = None
    else:
        sampler = FixedOrderSampler(n, batch, epochs=epochs, seed=seed)
        bands = 1 if method == "dpsgd" else None
        noise = NuDPFTRLNoise(std, nu if method == "ftrl" else 0.0, bands)
    for idx in sampler:
        grad = clipped_sum(theta, x[idx], y[idx], clip)
        if noise is not None:
            z = noise.sample(0, grad, gen)
            noise.end_step()
        else:
            z = std * torch.randn(grad.shape, generator=gen, dtype=grad.dtype)
        if z is not None:
            grad = grad + z
        theta -= lrs[:, None] * grad / batch
        if not torch.isfinite(theta).all():
            theta = torch.where(torch.isfinite(theta), theta, torch.full_like(theta, 1e6))
    diff = theta - theta_star
    risk = 0.5 * (diff**2 * lam).sum(dim=1)
    return np.minimum(risk.numpy(), 1e12)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small smoke run; writes nothing")
    ap.add_argument("--epsilon", type=float, nargs="+", default=[2.0, 8.0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.quick:
        d, n, batch, epochs, alphas, seeds = 200, 400, 20, 3, [0.0, 1.0], 2
        nus, lrs_list = [0.05, 0.01], [0.5, 0.125]
    else:
        d, n, batch, epochs, alphas, seeds = 1000, 2000, 20, 5, [0.0, 0.5, 0.75, 1.0, 1.25], None
        seeds = args.seeds
        nus = [0.2, 0.05, 0.01, 0.002]
        lrs_list = [2.0**-i for i in range(0, 11)]  # 1 … 1/1024
    lrs = torch.tensor(lrs_list, dtype=torch.float64)
    spe = math.ceil(n / batch)
    steps = epochs * spe
    t0 = time.perf_counter()
    methods = [("nonprivate", 0.0), ("dpsgd", 0.0), ("dpsgd-poisson", 0.0)]
    methods += [("ftrl", nu) for nu in nus]
    results: dict = {}
    sigmas: dict = {}
    for eps in args.epsilon:
        sig = {
            ("nonprivate", 0.0): 0.0,
            ("dpsgd", 0.0): accounting.dpftrl_noise_multiplier(
                eps, DELTA, 0.0, steps, epochs, spe, bands=1
            ),
            ("dpsgd-poisson", 0.0): accounting.noise_multiplier(eps, DELTA, batch / n, steps),
        }
        for nu in nus:
            sig[("ftrl", nu)] = accounting.dpftrl_noise_multiplier(
                eps, DELTA, nu, steps, epochs, spe
            )
        sigmas[eps] = sig
        for alpha in alphas:
            problems = [make_problem(alpha, d, n, s) for s in range(seeds)]
            for m in methods:
                risks = np.stack(
                    [
                        run(m[0], sig[m], m[1], lrs, p, n, batch, epochs, s)
                        for s, p in enumerate(problems)
                    ]
                )  # (seeds, lrs)
                results[(eps, alpha, m)] = risks
            print(f"eps={eps} alpha={alpha} done at {time.perf_counter() - t0:.1f}s", flush=True)
    wall = time.perf_counter() - t0
    report = render(results, sigmas, alphas, methods, lrs_list, d, n, batch, epochs, steps, seeds,
                    wall, args.epsilon, args.quick)
    print(report)
    if not args.quick and not args.no_write:
        (DOCS / "benchmarks_dpftrl.md").write_text(report)
        plot(results, alphas, methods, args.epsilon, d)
        print(f"wrote docs/benchmarks_dpftrl.md ({wall:.0f}s)")


def d_eff(alpha: float, d: int) -> float:
    return float((np.arange(1, d + 1, dtype=np.float64) ** (-alpha)).sum())


def best(risks: np.ndarray) -> tuple[float, float, int]:
    """(mean, standard error) at the learning rate with the smallest mean, and its index."""
    means = risks.mean(axis=0)
    i = int(np.argmin(means))
    se = float(risks[:, i].std(ddof=1) / math.sqrt(risks.shape[0])) if risks.shape[0] > 1 else 0.0
    return float(means[i]), se, i


NAMES = {
    "nonprivate": "non-private",
    "dpsgd": "DP-SGD (no amp.)",
    "dpsgd-poisson": "DP-SGD (Poisson)",
}


def _name(m) -> str:
    return NAMES.get(m[0], f"ν-DP-FTRL ν={m[1]:g}")


def render(results, sigmas, alphas, methods, lrs, d, n, batch, epochs, steps, seeds, wall, epsilons,
           quick) -> str:
    ftrl = [m for m in methods if m[0] == "ftrl"]
    lines = [
        "## ν-DP-FTRL vs DP-SGD on linear regression (issue 8, experiment 1)",
        "",
        f"`benchmarks/dpftrl_linear.py{' --quick' if quick else ''}` — {platform.machine()}, "
        f"{platform.python_version()}, torch {torch.__version__}, 1 thread; wall time "
        f"{wall:.0f} s.",
        "",
        f"d = {d}, λ_j ∝ j^(−α) with ‖H‖ = 1, N = {n}, batch {batch}, {epochs} epochs = {steps} "
        f"steps for every mechanism, δ = {DELTA:g}, clipping C = √(Tr H), {seeds} seeds, "
        f"learning rate tuned on {{{', '.join(f'{x:g}' for x in lrs)}}} per (mechanism, α) by the "
        "mean over the reported seeds (oracle tuning, identical for all). Cells: mean excess "
        "risk ½‖θ_T − θ*‖²_H of the last iterate ± standard error over seeds. Ratios are "
        "DP-SGD / ν-DP-FTRL (best ν): > 1 means correlated noise wins.",
        "",
    ]
    for eps in epsilons:
        sig = sigmas[eps]
        lines.append(f"### ε = {eps:g}")
        lines.append("")
        lines.append(
            "Noise multipliers: "
            + ", ".join(f"{_name(m)} {sig[m]:.3f}" for m in methods if m[0] != "nonprivate")
            + "."
        )
        lines.append("")
        lines.append(
            "| α | d_eff | non-private | DP-SGD (no amp.) | DP-SGD (Poisson) | ν-DP-FTRL (best ν) "
            "| ratio no-amp / FTRL | ratio Poisson / FTRL |"
        )
        lines.append("|---:|---:|---:|---:|---:|---:|---:|---:|")
        for alpha in alphas:
            cell = {m: best(results[(eps, alpha, m)]) for m in methods}
            bf = min(ftrl, key=lambda m: cell[m][0])
            ref = cell[bf][0]

            def fmt(c):
                return f"{c[0]:.3g} ± {c[1]:.1g}"

            lines.append(
                f"| {alpha:g} | {d_eff(alpha, d):.1f} | {fmt(cell[methods[0]])} | "
                f"{fmt(cell[('dpsgd', 0.0)])} | {fmt(cell[('dpsgd-poisson', 0.0)])} | "
                f"{fmt(cell[bf])} (ν={bf[1]:g}) | {cell[('dpsgd', 0.0)][0] / ref:.2f} | "
                f"{cell[('dpsgd-poisson', 0.0)][0] / ref:.2f} |"
            )
        lines.append("")
        lines.append("Every ν (excess risk at its own best learning rate):")
        lines.append("")
        lines.append("| α | " + " | ".join(f"ν={m[1]:g}" for m in ftrl) + " |")
        lines.append("|---:|" + "---:|" * len(ftrl))
        for alpha in alphas:
            cells = [f"{best(results[(eps, alpha, m)])[0]:.3g}" for m in ftrl]
            lines.append(f"| {alpha:g} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += verdict(results, alphas, methods, epsilons, d)
    if not quick:
        lines += ["", "![excess risk vs d_eff](benchmarks_dpftrl.png)", ""]
    return "\n".join(lines) + "\n"


def verdict(results, alphas, methods, epsilons, d) -> list[str]:
    ftrl = [m for m in methods if m[0] == "ftrl"]
    out = ["### Does the advantage grow as d_eff falls?", ""]
    for eps in epsilons:
        ratios = []
        for alpha in alphas:
            f = min(best(results[(eps, alpha, m)])[0] for m in ftrl)
            ratios.append(
                (
                    d_eff(alpha, d),
                    best(results[(eps, alpha, ("dpsgd", 0.0))])[0] / f,
                    best(results[(eps, alpha, ("dpsgd-poisson", 0.0))])[0] / f,
                )
            )
        ordered = sorted(ratios, key=lambda r: -r[0])  # d_eff from large to small
        mono_noamp = all(b[1] >= a[1] for a, b in zip(ordered, ordered[1:]))
        mono_pois = all(b[2] >= a[2] for a, b in zip(ordered, ordered[1:]))
        seq_noamp = " → ".join(f"{r[1]:.2f}" for r in ordered)
        seq_pois = " → ".join(f"{r[2]:.2f}" for r in ordered)
        out.append(
            f"* ε = {eps:g}, d_eff {ordered[0][0]:.0f} → {ordered[-1][0]:.1f}: DP-SGD (no amp.) / "
            f"ν-DP-FTRL = {seq_noamp} ({'monotone' if mono_noamp else 'not monotone'}); "
            f"DP-SGD (Poisson) / ν-DP-FTRL = {seq_pois} "
            f"({'monotone' if mono_pois else 'not monotone'})."
        )
    return out


def plot(results, alphas, methods, epsilons, d) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - optional ([bench] extra)
        print("matplotlib not installed: no plot")
        return
    fig, axes = plt.subplots(1, len(epsilons), figsize=(5.5 * len(epsilons), 4.2), squeeze=False)
    ftrl = [m for m in methods if m[0] == "ftrl"]
    x = [d_eff(a, d) for a in alphas]
    for ax, eps in zip(axes[0], epsilons):
        for m in [("nonprivate", 0.0), ("dpsgd", 0.0), ("dpsgd-poisson", 0.0)]:
            ax.plot(x, [best(results[(eps, a, m)])[0] for a in alphas], "o-", label=_name(m))
        ax.plot(
            x,
            [min(best(results[(eps, a, m)])[0] for m in ftrl) for a in alphas],
            "s-",
            label="ν-DP-FTRL (best ν)",
        )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("d_eff = Tr H / ‖H‖")
        ax.set_ylabel("excess risk (last iterate)")
        ax.set_title(f"ε = {eps:g}, δ = {DELTA:g}, d = {d}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(DOCS / "benchmarks_dpftrl.png", dpi=110)


if __name__ == "__main__":
    main()
