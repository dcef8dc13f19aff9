"""Figures without pyplot: each chart owns its Figure, no global state, files written atomically."""
from __future__ import annotations

import io
from pathlib import Path

import matplotlib
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.backends.backend_svg import FigureCanvasSVG
from matplotlib.figure import Figure

from ..errors import TesselError
from ..io import atomic_write

CANVAS = {".png": FigureCanvasAgg, ".svg": FigureCanvasSVG}
KIND_COLORS = {"forward": "#4C78A8", "backward": "#F58518", "weight": "#54A24B", "other": "#B279A2"}


def root_figure(ax: Axes) -> Figure:
    """The Figure an axes is drawn on, through a SubFigure when it is on one."""
    fig = ax.figure
    return fig if isinstance(fig, Figure) else fig.figure


def image_format(path: str | Path) -> str:
    """`.png` or `.svg` from the file name; anything else is a usage error naming the file."""
    suffix = Path(path).suffix.lower()
    if suffix not in CANVAS:
        raise TesselError(f"{path}: a picture must end in .png or .svg, not {suffix or '(no suffix)'!r}")
    return suffix


def save_figure(fig: Figure, path: str | Path, dpi: float = 110) -> Path:
    """Render with the canvas of the file's format (Agg for PNG) and write the bytes atomically."""
    suffix = image_format(path)
    CANVAS[suffix](fig)
    buf = io.BytesIO()
    # the same chart gives the same bytes: no date in the file, and SVG ids from a fixed salt
    metadata = {"Date": None} if suffix == ".svg" else {"Software": None}
    with matplotlib.rc_context({"svg.hashsalt": "tessel"}):
        fig.savefig(buf, format=suffix[1:], dpi=dpi, metadata=metadata)
    fig.clear()
    atomic_write(path, buf.getvalue())
    return Path(path)
