"""ASCII pictures in the style of the paper's figures: one row per device, `f3` / `b3` / `--`."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .placement import Placement

if TYPE_CHECKING:
    from .schedule import Schedule

LETTER = {"forward": "f", "backward": "b", "weight": "w", "other": "o"}
MAX_CELLS = 10_000  # columns of a picture: a finer unit (a start of 1e-300) is coarsened to fit


def _unit(durations: list[float], span: float) -> float:
    """The time one character column stands for: the gcd of integral durations, else the least,
    never so small that `span` takes more than MAX_CELLS columns."""
    if all(float(d).is_integer() for d in durations):
        unit = float(math.gcd(*(int(d) for d in durations)))
    else:
        unit = min(durations)
    return max(unit, span / MAX_CELLS)


def render_ascii(s: Schedule, width: int = 200) -> str:
    """Each cell is one time unit; a task fills its cells with its kind letter and micro-batch."""
    p = s.placement
    unit = _unit([b.duration for b in p.blocks] + [t.start for t in s.tasks if t.start > 0], s.makespan)
    cells = int(round(s.makespan / unit))
    label_w = max(2, len(LETTER["forward"] + str(s.micro_batches - 1)))
    rows = [["-" * label_w] * cells for _ in range(p.devices)]
    for t in s.tasks:
        b = p.by_id[t.block]
        lab = f"{LETTER[b.kind]}{t.micro_batch}".rjust(label_w)
        first = int(round(t.start / unit))
        for c in range(first, first + max(1, int(round(b.duration / unit)))):
            for d in b.devices:
                if c < cells:
                    rows[d][c] = lab
    cols = max(1, width // (label_w + 1) - 1)
    out = []
    for lo in range(0, cells, cols):
        for d, row in enumerate(rows):
            out.append(f"d{d}".ljust(4) + " ".join(row[lo:lo + cols]))
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def render_placement(p: Placement) -> str:
    """One micro-batch, blocks as early as dependencies allow: the shape of the placement."""
    from . import bounds
    pt = bounds.paths(p)
    unit = _unit([b.duration for b in p.blocks] + [v for v in pt.earliest.values() if v > 0], pt.critical_path)
    cells = int(round(pt.critical_path / unit))
    label_w = max(len(b.id) for b in p.blocks)
    rows = [["." * label_w] * cells for _ in range(p.devices)]
    # several blocks of a micro-batch may share a device at the same earliest time: shift them
    for x in p.topo_order:
        b = p.by_id[x]
        first = int(round(pt.earliest[x] / unit))
        span = max(1, int(round(b.duration / unit)))
        while any(c < cells and rows[d][c] != "." * label_w
                  for d in b.devices for c in range(first, first + span)):
            first += 1
        for c in range(first, first + span):
            for d in b.devices:
                while c >= len(rows[d]):
                    for r in rows:
                        r.append("." * label_w)
                rows[d][c] = x.rjust(label_w)
    return "\n".join(f"d{d}".ljust(4) + " ".join(r) for d, r in enumerate(rows)) + "\n"


# ---- legends and summaries: what the pictures above mean, and large placements in a bounded width ----
SHOW_WIDTH = 200  # characters a picture row may take before `show` summarises instead


def placement_legend(p: Placement) -> str:
    """Under `render_placement`: cells hold block ids (not micro-batches), one micro-batch as early as it can run."""
    multi = any(len(b.devices) > 1 for b in p.blocks)
    return ("legend: one micro-batch; each cell shows the block that runs there (its id, as in the placement "
            "file), '.' idle; a column is one time unit of the shortest step" +
            ("; a block on several rows runs on all those devices together (sharded or tensor-parallel)"
             if multi else "") + "\n")


def schedule_legend(s: Schedule) -> str:
    """Under `render_ascii`: cells hold kind letter + micro-batch (not block ids)."""
    kinds = sorted({b.kind for b in s.placement.blocks}, key=list(LETTER).index)
    letters = ", ".join(f"{LETTER[k]}N = {k} of micro-batch N" for k in kinds)
    multi = any(len(b.devices) > 1 for b in s.placement.blocks)
    return (f"legend: {letters}; '-' idle" +
            ("; the same cell on several rows: a block on all those devices together (sharded or tensor-parallel)"
             if multi else "") + "\n")


def placement_width(p: Placement) -> int:
    """Characters of one row of `render_placement(p)` (without computing it)."""
    from . import bounds
    pt = bounds.paths(p)
    unit = _unit([b.duration for b in p.blocks] + [v for v in pt.earliest.values() if v > 0], pt.critical_path)
    cells = int(round(pt.critical_path / unit))
    return 4 + cells * (max(len(b.id) for b in p.blocks) + 1)


def render_placement_summary(p: Placement, width: int = SHOW_WIDTH) -> str:
    """A placement too wide to draw block by block: each device's row scaled to fit `width`
    (a column marks the kind of block busy there, `.` idle), then its blocks, first to last."""
    from . import bounds
    pt = bounds.paths(p)
    cols = max(10, min(width - 4, 120))
    unit = pt.critical_path / cols
    rows = [["."] * cols for _ in range(p.devices)]
    for x in p.topo_order:
        b = p.by_id[x]
        first = min(cols - 1, int(pt.earliest[x] / unit))
        last = min(cols - 1, max(first, int((pt.earliest[x] + b.duration) / unit - 1e-9)))
        for d in b.devices:
            for c in range(first, last + 1):
                if rows[d][c] == ".":
                    rows[d][c] = LETTER[b.kind]
    out = [f"one micro-batch scaled to {cols} columns: one column = {unit:.3g} time units (ms for a profile); "
           "f forward, b backward, w weight, o other, '.' idle"]
    for d, row in enumerate(rows):
        on = p.blocks_on(d)
        ids = f"{on[0].id} .. {on[-1].id}" if len(on) > 2 else ", ".join(b.id for b in on)
        out.append(f"d{d}".ljust(4) + "".join(row) + f"  {len(on)} blocks: {ids}"[:max(20, width - cols - 4)])
    return "\n".join(out) + "\n"
