"""Gantt chart of a schedule: one row per device, one box per task, memory over time below.

Boxes are coloured by block kind and carry the micro-batch number where it fits. A block on
several devices is one box across its (adjacent) rows; when its devices are not adjacent, one box
per run of adjacent rows, linked by a dashed line. The background shades warm-up, steady state
(the repetend repeating every period) and cool-down. Under the chart, each device's memory level
over time (rule 4 of FORMAT.md) with its limit as a red dashed line: up to 8 devices one band
each, all on one scale; beyond, one plot in memory units with a line per device coloured by its
index. Time is in the placement's unit (`meta["time_unit"]` when a schedule names it).

Sizes follow the schedule (about 11 pt per shortest block, rows thinner with more devices) and
are capped at 22 inches wide; numbers are dropped from boxes too thin to hold them.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.cm import ScalarMappable
from matplotlib.collections import LineCollection, PolyCollection
from matplotlib.colors import Normalize, to_rgb
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.transforms import Transform, offset_copy

from ..placement import KINDS
from ..schedule import EPS, Schedule
from .figure import KIND_COLORS, image_format, root_figure, save_figure

HALF = 0.4  # half the height of a device row's boxes, in row units
BANDS_UP_TO = 8  # devices: one memory band each; more share one plot, coloured by device
PHASE_COLORS = {"warm-up": "#E3ECF7", "steady state": "#FBF0CF", "cool-down": "#EDEDED"}
LIMIT_COLOR = "#D62728"
LEVEL_COLOR = "#5A5A5A"


@dataclass(frozen=True)
class Phases:
    """Warm-up is [0, steady_start), the repetend repeats `repeats` times until steady_end."""
    steady_start: float
    steady_end: float
    period: float
    repeats: int


@dataclass(frozen=True)
class Layout:
    """Figure geometry in inches; boxes and labels are sized from it, not from the renderer."""
    width: float
    row: float
    band: float
    devices: int
    left: float = 0.75
    right: float = 0.9
    top: float = 1.45
    gap: float = 0.2
    bottom: float = 0.55

    @property
    def gantt_height(self) -> float:
        return self.row * self.devices

    @property
    def memory_height(self) -> float:
        return self.band * self.devices

    @property
    def height(self) -> float:
        return self.top + self.gantt_height + self.gap + self.memory_height + self.bottom

    @property
    def axes_width(self) -> float:
        return self.width - self.left - self.right


def layout(s: Schedule) -> Layout:
    """About 11 pt per shortest block along time, rows shrinking with the device count; capped."""
    p = s.placement
    cells = float(s.makespan) / min(b.duration for b in p.blocks)
    margins = Layout.left + Layout.right
    width = float(np.clip(margins + cells * 11 / 72, 11, 22))
    row = float(np.clip(9 / p.devices, 0.22, 0.5))
    band = 0.5 if p.devices <= BANDS_UP_TO else 3.2 / p.devices  # beyond: one shared plot
    top = 1.45 if s.repetend is not None else 1.15  # room for the phase names and the period
    return Layout(width, row, band, p.devices, top=top)


def phases(s: Schedule) -> Phases | None:
    """Warm-up / steady state / cool-down from `schedule.repetend`, None when it has none.

    The repetend's [start, end) is one instance of the kernel; the steady state lasts as long as
    the kernel's tasks recur every period with micro-batches advanced by the kernel's count.
    """
    rep = s.repetend
    if rep is None or rep.period <= 0:
        return None
    kernel = s.kernel()
    assert kernel is not None
    repeats = 1
    if kernel.whole:
        shift = kernel.shift
        while all(abs(s.start.get((t.block, t.micro_batch + repeats * shift), -1.0)
                      - (t.start + repeats * rep.period)) < EPS for t in kernel.tasks):
            repeats += 1
    return Phases(float(rep.start), float(rep.end + (repeats - 1) * rep.period), float(rep.period),
                  repeats)


def time_unit(s: Schedule) -> str:
    return str(s.meta.get("time_unit", "placement time units"))


def plot_schedule(schedule: Schedule, path: str | Path, title: str | None = None,
                  dpi: float = 110) -> Path:
    """Write the Gantt chart of `schedule` as PNG or SVG (by the file's suffix); return the path."""
    image_format(path)
    return save_figure(gantt_figure(schedule, title), path, dpi)


def gantt_figure(s: Schedule, title: str | None = None) -> Figure:
    """The chart as a matplotlib Figure (no pyplot): Gantt rows on top, memory below."""
    lay = layout(s)
    fig = Figure(figsize=(lay.width, lay.height))
    gantt = fig.add_axes(_rect(lay, lay.bottom + lay.memory_height + lay.gap, lay.gantt_height))
    memory = fig.add_axes(_rect(lay, lay.bottom, lay.memory_height), sharex=gantt)
    t0 = float(min(t.start for t in s.tasks))
    window = (t0, t0 + max(float(s.makespan), EPS))
    units_to_pt = lay.axes_width * 72 / (window[1] - window[0])
    _device_axis(gantt, s.placement.devices, lay.row)
    gantt.set_xlim(*window)
    gantt.tick_params(labelbottom=False)
    memory.set_xlabel(f"time ({time_unit(s)})")
    ph = phases(s)
    if ph is not None:
        _draw_phases(gantt, memory, ph, window, units_to_pt)
    linked = _draw_tasks(gantt, s, units_to_pt, lay.row * 72)
    has_limit = _draw_memory(memory, s, lay, window)
    _draw_header(fig, s, lay, title, ph is not None, has_limit, linked)
    return fig


def _rect(lay: Layout, bottom: float, height: float) -> tuple[float, float, float, float]:
    return (lay.left / lay.width, bottom / lay.height, lay.axes_width / lay.width, height / lay.height)


def _row(devices: int, d: int) -> int:
    """Device 0 on top."""
    return devices - 1 - d


def _device_axis(ax: Axes, devices: int, row_in: float) -> None:
    ax.set_ylim(-0.5, devices - 0.5)
    step = max(1, int(np.ceil(8 / (row_in * 72))))  # tick labels at least 8 pt apart
    ticks = list(range(0, devices, step))
    ax.set_yticks([_row(devices, d) for d in ticks], [f"d{d}" for d in ticks],
                  fontsize=min(9, max(5.5, row_in * 72 * 0.6)))
    ax.tick_params(axis="y", length=0)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def _runs(devices: tuple[int, ...]) -> list[tuple[int, int]]:
    """Maximal runs of adjacent device ids, as (first, last)."""
    ds = sorted(devices)
    runs = [[ds[0], ds[0]]]
    for d in ds[1:]:
        if d == runs[-1][1] + 1:
            runs[-1][1] = d
        else:
            runs.append([d, d])
    return [(a, b) for a, b in runs]


def _draw_tasks(ax: Axes, s: Schedule, units_to_pt: float, row_pt: float) -> bool:
    """Draw every task; returns whether some block needed links between non-adjacent rows."""
    p, n = s.placement, s.placement.devices
    verts: dict[str, list[np.ndarray]] = {k: [] for k in KINDS}
    links: dict[str, list[list[tuple[float, float]]]] = {k: [] for k in KINDS}
    labels: list[tuple[float, float, str, str]] = []
    fontsize, fits = _label_rule(s, units_to_pt, row_pt)
    # the block's name too, where it fits beside the widest micro-batch number
    wide = len(str(s.micro_batches - 1)) + 1
    named = {b.id: b.duration * units_to_pt >= 0.62 * (len(b.id) + wide) * fontsize + 2 for b in p.blocks}
    min_box_pt = min(b.duration for b in p.blocks) * units_to_pt
    for t in s.tasks:
        b = p.by_id[t.block]
        x0, x1 = float(t.start), float(t.start + b.duration)
        runs = _runs(b.devices)
        for first, last in runs:
            y0, y1 = _row(n, last) - HALF, _row(n, first) + HALF
            verts[b.kind].append(np.array([(x0, y0), (x0, y1), (x1, y1), (x1, y0)]))
            if fits[b.id]:
                text = f"{b.id}:{t.micro_batch}" if named[b.id] else str(t.micro_batch)
                labels.append(((x0 + x1) / 2, (y0 + y1) / 2, text, b.kind))
        xm = (x0 + x1) / 2
        links[b.kind] += [[(xm, _row(n, a_last) - HALF), (xm, _row(n, b_first) + HALF)]
                          for (_, a_last), (b_first, _) in zip(runs, runs[1:])]
    # white seams between boxes, thinner as boxes get thinner, none when they would hide colour
    seam = float(np.clip(min_box_pt / 12, 0, 0.6)) if min_box_pt >= 2.5 else 0.0
    for kind in KINDS:
        if verts[kind]:
            ax.add_collection(PolyCollection(verts[kind], facecolors=KIND_COLORS[kind],
                                             edgecolors="white", linewidths=seam, zorder=2,
                                             gid=f"tasks-{kind}"))
        if links[kind]:
            ax.add_collection(LineCollection(links[kind], colors=KIND_COLORS[kind], linewidths=1.2,
                                             linestyles="--", zorder=2, gid=f"links-{kind}"))
    for x, y, text, kind in labels:
        ax.text(x, y, text, ha="center", va="center", fontsize=fontsize, zorder=3,
                color=_ink(KIND_COLORS[kind]))
    return any(links.values())


def _label_rule(s: Schedule, units_to_pt: float, row_pt: float) -> tuple[float, dict[str, bool]]:
    """One font size for the chart; a block's boxes are numbered when the widest number fits.

    Deciding per block rather than per box keeps a row consistent: no numbers up to 9 and then
    none from 10 on.
    """
    digits = len(str(s.micro_batches - 1))
    width = 0.62 * digits  # of the widest number, per point of font size
    shortest = min(b.duration for b in s.placement.blocks) * units_to_pt
    fontsize = float(np.clip(row_pt * HALF, 5.5, 8))
    # shrink to number every box, but not below legible; else only the wider blocks get numbers
    fontsize = max(min(fontsize, (shortest - 2) / width), min(fontsize, 6.5))
    return fontsize, {b.id: b.duration * units_to_pt >= width * fontsize + 2
                      for b in s.placement.blocks}


def _ink(color: str) -> str:
    r, g, b = to_rgb(color)
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.6 else "white"


def _draw_phases(gantt: Axes, memory: Axes, ph: Phases, window: tuple[float, float],
                 units_to_pt: float) -> None:
    spans = {"warm-up": (window[0], ph.steady_start), "steady state": (ph.steady_start, ph.steady_end),
             "cool-down": (ph.steady_end, window[1])}
    for name, (a, b) in spans.items():
        if b - a <= EPS:
            continue
        for ax in (gantt, memory):
            ax.axvspan(a, b, color=PHASE_COLORS[name], zorder=0, lw=0)
        text = name if name != "steady state" else f"repetend × {ph.repeats}"
        if (b - a) * units_to_pt >= 5.5 * len(text):
            gantt.text((a + b) / 2, 1.0, text, transform=_above(gantt, 11), ha="center",
                       va="bottom", fontsize=8, color="#555555")
    marks = ph.repeats + 1 if ph.repeats <= 64 else 2
    for k in range(marks):
        for ax in (gantt, memory):
            ax.axvline(ph.steady_start + k * ph.period, color="#9C7A00", lw=0.7, ls=":", zorder=1)
    above = _above(gantt, 5)
    gantt.annotate("", xy=(ph.steady_start, 1.0), xytext=(ph.steady_start + ph.period, 1.0),
                   xycoords=above, textcoords=above,
                   arrowprops={"arrowstyle": "<->", "color": "#9C7A00", "lw": 1, "shrinkA": 0,
                               "shrinkB": 0})
    gantt.text(ph.steady_start + ph.period, 1.0, f" period {ph.period:g}", transform=above,
               ha="left", va="center", fontsize=8, color="#7A5F00")


def _above(ax: Axes, points: float) -> Transform:
    """x in data, y in axes fraction, shifted up by `points`: fixed spacing at any axes height."""
    return offset_copy(ax.get_xaxis_transform(), fig=root_figure(ax), y=points, units="points")


def _draw_memory(ax: Axes, s: Schedule, lay: Layout, window: tuple[float, float]) -> bool:
    """Memory level per device over time with its limit; returns whether a limit was drawn."""
    n = s.placement.devices
    limits = [x if x is not None and np.isfinite(x) else None
              for x in (s.memory_limit or (None,) * n)]
    levels = [_levels(s, d, window) for d in range(n)]
    ax.set_ylabel("memory", fontsize=8)
    if n <= BANDS_UP_TO:
        _device_axis(ax, n, lay.band)
        return _memory_bands(ax, s, levels, limits, lay.band * 72)
    return _memory_lines(ax, s, levels, limits, lay)


def _memory_bands(ax: Axes, s: Schedule, levels: list[tuple[np.ndarray, np.ndarray]],
                  limits: list[float | None], band_pt: float) -> bool:
    """One band per device, all on one scale (the largest peak or limit), peak / limit at right."""
    n, peaks = s.placement.devices, s.peak_memory
    scale = max([*peaks, *(x for x in limits if x is not None), EPS])
    fontsize = float(np.clip(band_pt * 0.55, 5, 8))
    for d, (times, level) in enumerate(levels):
        base = _row(n, d) - HALF
        ys = base + 2 * HALF * level / scale
        ax.fill_between(times, base, ys, step="post", color=LEVEL_COLOR, alpha=0.35, lw=0, zorder=2)
        ax.step(times, ys, where="post", color=LEVEL_COLOR, lw=0.8, zorder=3)
        lim = limits[d]
        if lim is not None:
            ax.axhline(base + 2 * HALF * lim / scale, color=LIMIT_COLOR, lw=1, ls="--", zorder=4)
        note = f"{peaks[d]:g}" + (f" / {lim:g}" if lim is not None else "")
        ax.text(1.005, _row(n, d), note, transform=ax.get_yaxis_transform(), ha="left",
                va="center", fontsize=fontsize, color="#333333")
    ax.text(1.005, 1.0, "peak / limit", transform=ax.transAxes, ha="left", va="bottom",
            fontsize=7, color="#333333")
    return any(x is not None for x in limits)


def _memory_lines(ax: Axes, s: Schedule, levels: list[tuple[np.ndarray, np.ndarray]],
                  limits: list[float | None], lay: Layout) -> bool:
    """Many devices: one plot in memory units, a line per device coloured by its index."""
    n = s.placement.devices
    cmap, norm = colormaps["viridis"], Normalize(0, n - 1)
    for d, (times, level) in enumerate(levels):
        ax.step(times, level, where="post", color=cmap(norm(d)), lw=0.9, zorder=3)
    for lim in sorted({x for x in limits if x is not None}):
        ax.axhline(lim, color=LIMIT_COLOR, lw=1.2, ls="--", zorder=4)
    top = max([*s.peak_memory, *(x for x in limits if x is not None), EPS])
    ax.set_ylim(0, top * 1.08)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.tick_params(axis="y", labelsize=7)
    fig = root_figure(ax)
    cax = fig.add_axes(((lay.width - lay.right + 0.12) / lay.width, lay.bottom / lay.height,
                        0.12 / lay.width, lay.memory_height / lay.height))
    bar = fig.colorbar(ScalarMappable(norm, cmap), cax=cax)
    bar.set_label("device", fontsize=7)
    bar.ax.tick_params(labelsize=6)
    return any(x is not None for x in limits)


def _levels(s: Schedule, device: int, window: tuple[float, float]) -> tuple[np.ndarray, np.ndarray]:
    """Step function of the memory level: value after all events at each time (rule-4 order)."""
    times, levels = [window[0]], [0.0]
    for time, delta in s.memory_events(device):
        if abs(time - times[-1]) > EPS:
            times.append(float(time))
            levels.append(levels[-1])
        levels[-1] += delta
    times.append(window[1])
    levels.append(levels[-1])
    return np.array(times), np.array(levels)


def _draw_header(fig: Figure, s: Schedule, lay: Layout, title: str | None, shaded: bool,
                 has_limit: bool, linked: bool) -> None:
    x = lay.left / lay.width
    method = s.meta.get("method", "schedule")
    head = title or f"{s.placement.name}  ·  {method}  ·  N = {s.micro_batches}"
    fig.text(x, 1 - 0.12 / lay.height, head, ha="left", va="top", fontsize=12, weight="bold")
    peak = max(s.peak_memory) if s.peak_memory else 0
    limit = "" if s.memory_limit is None else f" (limit {max(s.memory_limit):g})"
    line = (f"makespan {s.makespan:g}   lower bound {s.lower_bound:g}   ratio {s.ratio:.3f}   "
            f"bubble {s.bubble:.1%}   peak memory {peak:g}{limit}")
    if s.repetend is not None:
        line += f"   period {s.repetend.period:g}"
    fig.text(x, 1 - 0.42 / lay.height, line, ha="left", va="top", fontsize=9, color="#333333")
    kinds = sorted({b.kind for b in s.placement.blocks}, key=KINDS.index)
    handles: list[Patch | Line2D] = [Patch(color=KIND_COLORS[k], label=k) for k in kinds]
    if linked:
        handles.append(Line2D([], [], color="#555555", ls="--", label="one task, non-adjacent devices"))
    if any(len(b.devices) > 1 for b in s.placement.blocks):
        handles.append(Patch(facecolor="white", edgecolor="#555555",
                             label="box over several rows: one block on all of them (sharded/tensor-parallel)"))
    handles.append(Line2D([], [], ls="none", label="label: block:micro-batch (the number alone where narrow)"))
    if shaded:
        handles += [Patch(color=c, label=name) for name, c in PHASE_COLORS.items()]
    if has_limit:
        handles.append(Line2D([], [], color=LIMIT_COLOR, ls="--", label="memory limit"))
    fig.legend(handles=handles, loc="upper left", ncol=len(handles), fontsize=8, frameon=False,
               bbox_to_anchor=(x - 0.01, 1 - 0.68 / lay.height), handlelength=1.2,
               columnspacing=1.2, borderaxespad=0)
