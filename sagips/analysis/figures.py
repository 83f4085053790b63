"""Figures of the ensemble post-analysis, drawn only from the summary dict that `sagips.analyze` writes to
summary.json (so every number in a figure is in that file). matplotlib with the Agg backend; no display needed.

    residuals_vs_time.png   paper Figs. 13/14: r_i(t) and its 1 sigma band, a grid of parameters x groups
    convergence.png         paper Figs. 15/16: mean sigma_i/|p_i| (top) and mean |r_i| (bottom), x 1000, per group
    rmse_vs_spread.png      paper Fig. 9: RMSE vs spread of sub-ensembles of M runs, 95% contours per M
    analysis_rate.png       paper Fig. 12: eq. 9 against the number of ranks, per mode (several world sizes only)
    uncertainty.png         p^ +- sigma per parameter and group, beside sigma's parts (members, ranks, drift)
"""
from __future__ import annotations

import math
import os
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import matplotlib.ticker
from matplotlib.patches import Ellipse

from sagips.analysis.ensemble import truth_known

DPI = 90


def time_unit(seconds_max: float) -> tuple[str, float]:
    """('s' | 'min' | 'h', divisor) so that the time axis reads in sensible numbers."""
    if seconds_max < 180:
        return "s", 1.0
    if seconds_max < 3 * 3600:
        return "min", 60.0
    return "h", 3600.0


def _tmax(summary: dict[str, Any]) -> float:
    return max((max(g["time_s"]) for g in summary["groups"] if g["time_s"]), default=1.0)


def _margins(fig, left: float, right: float, bottom: float, top: float, wspace: float = 0.2,
             hspace: float = 0.2) -> None:
    """Fixed margins in inches (a fixed layout is ~10x cheaper than constrained layout on a grid of axes)."""
    w, h = fig.get_size_inches()
    fig.subplots_adjust(left=left / w, right=1 - right / w, bottom=bottom / h, top=1 - top / h, wspace=wspace,
                        hspace=hspace)


def _save(fig, path: str) -> str:
    from sagips.io.atomic import atomic_path

    with atomic_path(path) as tmp:  # (a kill leaves the figure complete or absent, as every output)
        fig.savefig(tmp, dpi=DPI, format=os.path.splitext(path)[1][1:] or "png")
    plt.close(fig)
    return path


def _group_title(g: dict[str, Any]) -> str:
    return f"{g['name']} (M={g['n_runs']})"


def residuals_vs_time(summary: dict[str, Any], path: str) -> str:
    """A grid: one row per parameter, one column per group; the ensemble residual and its 1 sigma band."""
    groups, names = summary["groups"], summary["parameters"]
    unit, div = time_unit(_tmax(summary))
    nrow, ncol = len(names), len(groups)
    fig, axes = plt.subplots(nrow, ncol, figsize=(0.8 + 2.7 * ncol, 1.1 + 1.3 * nrow), sharex="col", sharey="row",
                             squeeze=False)
    _margins(fig, left=0.7, right=0.15, bottom=0.5, top=0.6, wspace=0.08, hspace=0.12)
    for j, g in enumerate(groups):
        t = [x / div for x in g["time_s"]]
        for i in range(nrow):
            ax = axes[i][j]
            r = [row[i] for row in g["residual"]]
            s = [row[i] for row in g["residual_sigma"]]
            ax.fill_between(t, [a - b for a, b in zip(r, s)], [a + b for a, b in zip(r, s)], color="tab:blue",
                            alpha=0.25, linewidth=0, label=r"$\pm 1\sigma$")
            ax.plot(t, r, color="tab:blue", marker=".", markersize=3, linewidth=1.2, label="ensemble")
            ax.axhline(0.0, color="k", linestyle="--", linewidth=0.7)
            ax.grid(alpha=0.3)
            if j == 0:
                named = names[i] != f"r_{i}"  # an environment's parameter name (ParametricEnvironment), else r_i
                ax.set_ylabel(f"r̂ ({names[i]})" if named else rf"$\hat r_{{{i}}}$")
            if i == 0:
                ax.set_title(_group_title(g), fontsize=9)
            if i == nrow - 1:
                ax.set_xlabel(f"accumulated training time [{unit}]", fontsize=8)
            ax.tick_params(labelsize=7)
    axes[0][0].legend(fontsize=7, loc="best")
    fig.suptitle(r"normalised residual $\hat r_i = (p_i - \hat p_i)/p_i$ of the ensemble mean, with its $1\sigma$ "
                 r"band ($\sigma_i/|p_i|$)", fontsize=9)
    return _save(fig, path)


def convergence(summary: dict[str, Any], path: str) -> str:
    """Top: mean over parameters of sigma_i/|p_i|; bottom: mean of |r_i|; both x 1000, one curve per group."""
    unit, div = time_unit(_tmax(summary))
    fig, (top, bot) = plt.subplots(2, 1, figsize=(6.4, 5.6), sharex=True)
    _margins(fig, left=0.8, right=0.2, bottom=0.55, top=0.35, hspace=0.08)
    for g in summary["groups"]:
        t = [x / div for x in g["time_s"]]
        top.plot(t, g["mean_residual_sigma_1e3"], marker="o", markersize=3, label=_group_title(g))
        bot.plot(t, g["mean_abs_residual_1e3"], marker="o", markersize=3, label=_group_title(g))
    top.set_ylabel(r"mean $\sigma_i/|p_i|$  [$10^{-3}$]")
    bot.set_ylabel(r"mean $|\hat r_i|$  [$10^{-3}$]")
    bot.set_xlabel(f"accumulated training time [{unit}]")
    top.set_title("ensemble spread (top) and residual (bottom), averaged over parameters", fontsize=9)
    for ax in (top, bot):
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
    top.legend(fontsize=8)
    return _save(fig, path)


def rmse_vs_spread(summary: dict[str, Any], path: str) -> str:
    """One panel per group: every resampled sub-ensemble (dots, coloured by M), the 95% contour per M, and the
    means joined by arrows in the direction of growing M."""
    groups = summary["groups"]
    ncol = min(3, len(groups))
    nrow = math.ceil(len(groups) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(0.6 + 4.2 * ncol, 0.7 + 3.5 * nrow), squeeze=False)
    _margins(fig, left=0.7, right=0.05, bottom=0.55, top=0.55, wspace=0.3, hspace=0.4)
    cmap = plt.get_cmap("viridis")
    for k, g in enumerate(groups):
        ax = axes[k // ncol][k % ncol]
        rs = g.get("rmse_vs_spread")
        ax.set_title(_group_title(g), fontsize=9)
        ax.set_xlabel(r"spread: mean $\sigma_i/|p_i|$  [$10^{-3}$]")
        ax.set_ylabel(r"RMSE of $\hat r_i$  [$10^{-3}$]")
        ax.grid(alpha=0.3)
        if not rs or not rs["sizes"]:
            ax.text(0.5, 0.5, "needs at least 2 runs", transform=ax.transAxes, ha="center", va="center")
            continue
        sizes = rs["sizes"]
        lo, hi = min(sizes), max(sizes)
        norm = matplotlib.colors.Normalize(vmin=lo - 0.5, vmax=hi + 0.5)
        for m, xs, ys, ell in zip(sizes, rs["spread_1e3"], rs["rmse_1e3"], rs["ellipse95_1e3"]):
            c = cmap(norm(m))
            ax.scatter(xs, ys, s=8, color=c, alpha=0.35, linewidths=0)
            if ell:
                ax.add_patch(Ellipse((ell["x"], ell["y"]), ell["width"], ell["height"], angle=ell["angle_deg"],
                                     fill=False, edgecolor=c, linewidth=1.2))
        mx, my = rs["spread_mean_1e3"], rs["rmse_mean_1e3"]
        ax.plot(mx, my, color="tab:red", marker="o", markersize=3, linewidth=0.8, label="mean per M")
        for a in range(len(mx) - 1):
            ax.annotate("", xy=(mx[a + 1], my[a + 1]), xytext=(mx[a], my[a]),
                        arrowprops={"arrowstyle": "->", "color": "tab:red", "linewidth": 0.8})
        sm = plt.cm.ScalarMappable(norm=norm, cmap=cmap)
        fig.colorbar(sm, ax=ax, label="ensemble size M", ticks=sizes if len(sizes) <= 10 else None)
        ax.legend(fontsize=7, loc="best", title=f"{rs['resamples']} draws per M, 95% contours",
                  title_fontsize=7)
    for k in range(len(groups), nrow * ncol):
        axes[k // ncol][k % ncol].set_visible(False)
    t = groups[0].get("rmse_vs_spread") or {}
    when = f" (epoch {t['epoch']})" if t.get("epoch") else ""
    fig.suptitle(f"RMSE vs spread of sub-ensembles of M runs at the last checkpoint{when}", fontsize=9)
    return _save(fig, path)


def analysis_rate(summary: dict[str, Any], path: str) -> str:
    """Eq. 9 against N(ranks), one series per mode (mean and std over the runs at each size)."""
    rows = summary["analysis_rate_by_world_size"]
    fig, ax = plt.subplots(figsize=(6.0, 4.2))
    _margins(fig, left=0.85, right=0.2, bottom=0.55, top=0.35)
    for mode in dict.fromkeys(r["mode"] for r in rows):
        pts = sorted((r for r in rows if r["mode"] == mode), key=lambda r: r["world_size"])
        ax.errorbar([r["world_size"] for r in pts], [r["mean"] for r in pts], yerr=[r["std"] for r in pts],
                    marker="o", markersize=4, capsize=3, label=mode)
    single = [r["mean"] for r in rows if r["world_size"] == 1]
    if single:
        ax.axhline(sum(single) / len(single), color="k", linestyle="--", linewidth=0.8, label="one rank")
    ax.set_xscale("log")
    ax.set_yscale("log")
    sizes = sorted({r["world_size"] for r in rows})
    ax.set_xticks(sizes, [str(n) for n in sizes])
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    plain = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}")
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(plain)
    ax.set_xlabel("N(ranks)")
    ax.set_ylabel("analysis rate [events/s]")
    ax.set_title(r"eq. 9: $N(\mathrm{ranks}) \cdot N_\mathrm{disc} \cdot N_\mathrm{epochs}$ / training time",
                 fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return _save(fig, path)


def uncertainty(summary: dict[str, Any], path: str) -> str:
    """One panel per parameter: each group's p^ +- sigma (black) and, beside it, +- each part of sigma (members,
    ranks, drift, the noise batch's Monte-Carlo error, and the non-closure where one is applied), against the truth
    (dashed); a parameter still moving is named in red."""
    groups, names = summary["groups"], summary["parameters"]
    ncol = min(3, len(names))
    nrow = math.ceil(len(names) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(0.6 + 3.3 * ncol, 0.9 + 2.6 * nrow), squeeze=False)
    _margins(fig, left=0.8, right=0.15, bottom=0.9, top=0.55, wspace=0.45, hspace=0.7)
    parts = (("sigma", "σ", "k", 0.0), ("members", "members", "tab:blue", 0.12), ("ranks", "ranks", "tab:green", 0.2),
             ("drift", "drift", "tab:red", 0.28), ("sampling", "noise", "tab:orange", 0.36),
             ("nonclosure", "non-closure", "tab:purple", 0.44))
    labelled: set[str] = set()
    known = truth_known(summary["groups"])
    for i, name in enumerate(names):
        ax = axes[i // ncol][i % ncol]
        moving = False
        for j, g in enumerate(groups):
            u = g["uncertainty"]
            moving |= bool(g["convergence"][i]["moving"])
            for key, label, colour, dx in parts:
                err = (u.get(key) or [None] * len(names))[i]
                if err is None or (key in ("nonclosure", "sampling") and not err):  # (none: not drawn)
                    continue
                ax.errorbar([j + dx], [u["p_hat"][i]], yerr=[err], fmt="o" if key == "sigma" else "none",
                            color=colour, capsize=3, markersize=4, linewidth=1.6 if key == "sigma" else 1.0,
                            label=None if key in labelled else label)
                labelled.add(key)
        if known:
            ax.axhline(groups[0]["truth"][i], color="k", linestyle="--", linewidth=0.7)
        ax.set_xticks(range(len(groups)), [g["name"] for g in groups], fontsize=7, rotation=20)
        ax.set_xlim(-0.5, len(groups) - 0.3)
        ax.set_title(name + (" (still moving)" if moving else ""), fontsize=9, color="tab:red" if moving else "k")
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3, axis="y")
    for k in range(len(names), nrow * ncol):
        axes[k // ncol][k % ncol].set_visible(False)
    fig.legend(fontsize=7, loc="lower center", ncol=6)
    fig.suptitle(r"$\hat p_i \pm \sigma_i$ at the last checkpoint, and the parts of $\sigma_i$ "
                 + ("(truth dashed)" if known else "(the data name no truth)"), fontsize=9)
    return _save(fig, path)


def write_all(summary: dict[str, Any], out_dir: str) -> dict[str, str]:
    """Write every figure that the summary supports; {name: file name}. Data that name no truth (measured data) get
    none of the figures of residuals, which would be against a placeholder."""
    made = {}
    if truth_known(summary["groups"]):
        made = {
            "residuals_vs_time": residuals_vs_time(summary, os.path.join(out_dir, "residuals_vs_time.png")),
            "convergence": convergence(summary, os.path.join(out_dir, "convergence.png")),
            "rmse_vs_spread": rmse_vs_spread(summary, os.path.join(out_dir, "rmse_vs_spread.png")),
        }
    made["uncertainty"] = uncertainty(summary, os.path.join(out_dir, "uncertainty.png"))
    if len({r["world_size"] for r in summary["analysis_rate_by_world_size"]}) > 1:
        made["analysis_rate"] = analysis_rate(summary, os.path.join(out_dir, "analysis_rate.png"))
    return {k: os.path.basename(v) for k, v in made.items()}
