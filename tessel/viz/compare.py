"""Charts that compare methods on one placement: bars at one N, lines over N.

Rows are plain dicts, the rows of `tessel compare`: `method`, `makespan`, `lower_bound`, `ratio`,
`bubble`, `peak_memory` (a number or one per device), `seconds`, and `error` (set, and the
figures absent, when the method does not apply to the placement). `plot_scaling` also reads
`micro_batches`.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from textwrap import shorten
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from ..errors import UsageError
from ..methods import METHODS, SEARCH_MODES
from .figure import image_format, root_figure, save_figure

Row = Mapping[str, Any]
# Colours go to the methods of the registry in its order (search modes first, then baselines),
# so every chart gives a method the same colour and a new baseline gets the next one; blues and
# greens for the search modes, none close to the bound's red.
SEARCH_PALETTE = ("#4C78A8", "#72B7B2", "#54A24B")
BASELINE_PALETTE = ("#9D755D", "#B279A2", "#EECA3B", "#FF9DA6", "#79706E", "#BAB0AC",
                    "#BCBD22", "#8C6D31", "#637939", "#7B4173", "#F58518", "#D67195", "#9467BD",
                    "#17BECF", "#B6992D", "#393B79", "#CE6DBD", "#9C9EDE")
SEARCH_COLORS = dict(zip(SEARCH_MODES, SEARCH_PALETTE))
BASELINE_COLORS = dict(zip([m for m in METHODS if m not in SEARCH_MODES], BASELINE_PALETTE))
OTHER_COLOR = "#A0A0A0"
BOUND_COLOR = "#D62728"


def method_color(method: str) -> str:
    return SEARCH_COLORS.get(method) or BASELINE_COLORS.get(method, OTHER_COLOR)


def _peak(row: Row) -> float | None:
    peak = row.get("peak_memory")
    if isinstance(peak, (list, tuple)):
        return max(peak) if peak else None
    return peak


def _bound(rows: Sequence[Row]) -> float | None:
    return next((r["lower_bound"] for r in rows if r.get("lower_bound") is not None), None)


def plot_comparison(rows: Sequence[Row], path: str | Path, title: str | None = None,
                    dpi: float = 110) -> Path:
    """Makespan bars per method with the lower bound drawn, and search seconds (log) beside."""
    image_format(path)
    if not rows:
        raise UsageError("plot_comparison: no rows to draw: give at least one row")
    height = 1.2 + 0.42 * len(rows)
    fig = Figure(figsize=(11, height))
    grid = fig.add_gridspec(1, 2, width_ratios=(3, 1), left=0.1, right=0.97, wspace=0.08,
                            bottom=0.55 / height, top=1 - 0.65 / height)
    bars, secs = fig.add_subplot(grid[0]), fig.add_subplot(grid[1])
    _makespan_bars(bars, rows)
    _seconds_bars(secs, rows)
    fig.suptitle(title or "makespan by method", x=0.1, ha="left", y=1 - 0.12 / height,
                 fontsize=12, weight="bold")
    return save_figure(fig, path, dpi)


def _makespan_bars(ax: Axes, rows: Sequence[Row]) -> None:
    ys = list(range(len(rows)))[::-1]  # first row on top
    ok = [r for r in rows if not r.get("error")]
    best = min((r["makespan"] for r in ok), default=None)
    top = max([r["makespan"] for r in ok] + [_bound(rows) or 0, 1e-9])
    for y, r in zip(ys, rows):
        if r.get("error"):
            text = "no schedule: " + shorten(str(r["error"]), 85, placeholder=" …")
            ax.text(0.01 * top, y, text, va="center", zorder=4, fontsize=8, color="#555555", style="italic",
                    bbox={"facecolor": "white", "edgecolor": "none", "pad": 1})
            continue
        ax.barh(y, r["makespan"], height=0.62, color=method_color(r["method"]), gid=f"bar-{r['method']}")
        ax.text(r["makespan"] + 0.01 * top, y, _label(r), va="center", fontsize=8,
                weight="bold" if r["makespan"] == best else "normal")
    lb = _bound(rows)
    if lb is not None:
        ax.axvline(lb, color=BOUND_COLOR, ls="--", lw=1.2, zorder=3)
        ax.text(lb, 1.0, f"lower bound {lb:g}", transform=ax.get_xaxis_transform(), ha="center",
                va="bottom", fontsize=8, color=BOUND_COLOR)
    ax.set_yticks(ys, [str(r["method"]) for r in rows], fontsize=9)
    # room right of the longest bar for its label: the label's inches over the panel's inches
    label_in = max((len(_label(r)) for r in ok), default=0) * 8 * 0.55 / 72
    panel_in = ax.get_position().width * root_figure(ax).get_figwidth()
    ax.set_xlim(0, top / max(0.3, 1 - label_in / panel_in - 0.02))
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.set_xlabel("makespan")
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def _label(r: Row) -> str:
    parts = [f"{r['makespan']:g}"]
    if r.get("ratio") is not None:
        parts.append(f"×{r['ratio']:.3f}")
    if r.get("bubble") is not None:
        parts.append(f"bubble {r['bubble']:.1%}")
    peak = _peak(r)
    if peak is not None:
        parts.append(f"peak mem {peak:g}")
    return "   ".join(parts)


def _seconds_bars(ax: Axes, rows: Sequence[Row]) -> None:
    ys = list(range(len(rows)))[::-1]
    floor = 1e-4  # baselines take microseconds; a log axis needs a floor
    for y, r in zip(ys, rows):
        if r.get("error") or r.get("seconds") is None:
            continue
        ax.barh(y, max(r["seconds"], floor), height=0.62, color=method_color(r["method"]))
        ax.text(max(r["seconds"], floor) * 1.15, y, f"{r['seconds']:.2g} s", va="center", fontsize=7)
    ax.set_xscale("log")
    ax.set_xlim(floor, max([floor * 10] + [r.get("seconds") or 0 for r in rows]) * 20)
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.set_yticks([])
    ax.set_xlabel("seconds to build")
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def plot_scaling(rows: Sequence[Row], path: str | Path, title: str | None = None,
                 dpi: float = 110) -> Path:
    """Makespan over N per method with the lower bound, and the ratio to the bound below it."""
    image_format(path)
    series: dict[str, list[tuple[int, float]]] = defaultdict(list)
    bound: dict[int, float] = {}
    for r in rows:
        if r.get("error") or r.get("makespan") is None:
            continue
        series[str(r["method"])].append((int(r["micro_batches"]), float(r["makespan"])))
        bound[int(r["micro_batches"])] = float(r["lower_bound"])
    if not series:
        raise UsageError("plot_scaling: no rows with a makespan to draw: give at least one schedule that was found")
    fig = Figure(figsize=(9, 6.5))
    grid = fig.add_gridspec(2, 1, height_ratios=(2, 1), left=0.1, right=0.8, hspace=0.08,
                            top=0.9, bottom=0.09)
    ms, ratio = fig.add_subplot(grid[0]), fig.add_subplot(grid[1])
    ms.sharex(ratio)
    ns = sorted(bound)
    ms.plot(ns, [bound[n] for n in ns], color=BOUND_COLOR, ls="--", lw=1.2, label="lower bound",
            zorder=5, gid="lower-bound")  # on top: the best methods lie on it
    ratio.axhline(1.0, color=BOUND_COLOR, ls="--", lw=1.5)
    for method, pts in series.items():
        pts.sort()
        style: dict[str, Any] = {"color": method_color(method), "marker": "o", "ms": 4, "label": method}
        if method not in SEARCH_COLORS:
            style.update(ls=":", marker="s")
        ms.plot([n for n, _ in pts], [m for _, m in pts], gid=f"makespan-{method}", **style)
        ratio.plot([n for n, _ in pts], [m / bound[n] for n, m in pts], **style)
    ms.set_xscale("log", base=2)
    ms.set_yscale("log")
    ms.yaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))
    ms.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ms.yaxis.set_minor_formatter(NullFormatter())
    ms.set_ylabel("makespan")
    ms.tick_params(labelbottom=False)
    ratio.set_ylabel("makespan / lower bound")
    ratio.set_xlabel("micro-batches N")
    ratio.set_xticks(ns, [str(n) for n in ns])
    ms.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.suptitle(title or "makespan over N", x=0.1, ha="left", fontsize=12, weight="bold")
    return save_figure(fig, path, dpi)
