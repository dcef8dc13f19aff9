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
