"""Pictures and traces: render real files and inspect them (pixels, SVG elements, trace JSON)."""
from __future__ import annotations

import io
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import matplotlib.image as mpimg
import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgb
from rich.console import Console

from tessel import bounds
from tessel.placement import Block, Placement, make_placement
from tessel.schedule import Repetend, Schedule
from tessel.timing import schedule_from_orders
from tessel.viz.compare import BOUND_COLOR, SEARCH_COLORS, plot_comparison, plot_scaling
from tessel.viz.figure import KIND_COLORS
from tessel.viz.gantt import LIMIT_COLOR, PHASE_COLORS, gantt_figure, layout, phases, plot_schedule
from tessel.viz.progress import ProgressLine, describe
from tessel.viz.trace import trace_document, trace_events, write_trace

SVG = "{http://www.w3.org/2000/svg}"


# ---- placements and schedules ----------------------------------------------------------------
def vshape(devices: int) -> Placement:
    blocks = [Block(f"f{i}", "forward", 1, 1, (i,)) for i in range(devices)]
    blocks += [Block(f"b{i}", "backward", 3, -1, (devices - 1 - i,)) for i in range(devices)]
    ids = [b.id for b in blocks]
    return make_placement(f"vshape-{devices}", devices, blocks, list(zip(ids, ids[1:])))


def four_kinds() -> Placement:
    """Every kind, a block on all devices (adjacent rows) and one on devices 0 and 2 (not)."""
    blocks = [Block("emb", "other", 1, 0, (0, 1, 2, 3)), Block("f0", "forward", 1, 2, (0,)),
              Block("f1", "forward", 1, 2, (1,)), Block("mix", "forward", 2, 1, (0, 2)),
              Block("f3", "forward", 1, 1, (3,)), Block("b3", "backward", 2, -1, (3,)),
              Block("bmix", "backward", 2, -1, (0, 2)), Block("b1", "backward", 2, -1, (1,)),
              Block("w1", "weight", 1, -1, (1,)), Block("b0", "backward", 2, -1, (0,)),
              Block("w0", "weight", 1, -1, (0,))]
    edges = [("emb", "f0"), ("f0", "f1"), ("f1", "mix"), ("mix", "f3"), ("f3", "b3"),
             ("b3", "bmix"), ("bmix", "b1"), ("b1", "w1"), ("b1", "b0"), ("b0", "w0")]
    return make_placement("fourkinds", 4, blocks, edges)


def pipelined(p: Placement, n: int, memory: float | None = None) -> Schedule:
    """Each device runs its tasks by (earliest start + m * busiest load): 1F1B-like, no deadlock
    (one global order consistent with the dependencies), validated by Schedule.build."""
    est, period = bounds.paths(p).earliest, max(p.loads)
    rank = {b: i for i, b in enumerate(p.topo_order)}

    def key(k: tuple[str, int]) -> tuple[float, int, int]:
        return est[k[0]] + k[1] * period, k[1], rank[k[0]]

    orders = [sorted(((b.id, m) for b in p.blocks_on(d) for m in range(n)), key=key)
              for d in range(p.devices)]
    return schedule_from_orders(p, n, orders, memory, meta={"method": "pipelined"})


def modulo_vshape4(n: int) -> Schedule:
    """Block b of micro-batch k at earliest(b) + 4k: a pure repetend (period 4, every device busy
    in steady state). The window [13, 17) holds each block once and recurs n - 4 times."""
    p = vshape(4)
    est = bounds.paths(p).earliest
    starts = {(b, k): est[b] + 4 * k for b in est for k in range(n)}
    return Schedule.build(p, n, starts, 6, Repetend(4, 13, 17), {"method": "modulo"})


# ---- image helpers ---------------------------------------------------------------------------
def rgb_image(path: Path) -> np.ndarray:
    img = mpimg.imread(str(path))
    return img[..., :3]


def pixels_of(img: np.ndarray, color: str, tol: float = 2.5 / 255) -> int:
    return int(np.all(np.abs(img - np.array(to_rgb(color))) <= tol, axis=-1).sum())


def render(fig) -> tuple[FigureCanvasAgg, np.ndarray]:
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return canvas, np.asarray(canvas.buffer_rgba())[..., :3] / 255.0


# ---- Gantt: PNG --------------------------------------------------------------------------------
def test_png_has_the_figure_size_content_and_one_colour_per_kind(tmp_path: Path) -> None:
    s = pipelined(four_kinds(), 8, memory=12)
    out = plot_schedule(s, tmp_path / "g.png", dpi=100)
    img = rgb_image(out)
    lay = layout(s)
    assert img.shape[:2] == (round(lay.height * 100), round(lay.width * 100))
    assert 2 <= lay.width <= 22 and lay.height <= 20
    assert np.mean(np.any(img < 0.95, axis=-1)) > 0.05  # not blank
    counts = {k: pixels_of(img, KIND_COLORS[k]) for k in KIND_COLORS}
    assert all(c > 200 for c in counts.values()), counts
    assert len({to_rgb(c) for c in KIND_COLORS.values()}) == 4
    assert pixels_of(img, LIMIT_COLOR, tol=0.1) > 50  # the memory limit line


def test_png_with_repetend_shades_the_three_phases(tmp_path: Path) -> None:
    img = rgb_image(plot_schedule(modulo_vshape4(16), tmp_path / "r.png"))
    for name, color in PHASE_COLORS.items():
        assert pixels_of(img, color, tol=1.5 / 255) > 500, name


def test_multi_device_box_covers_the_gap_between_its_rows() -> None:
    s = pipelined(four_kinds(), 4)
    fig = gantt_figure(s)
    gantt = fig.axes[0]
    canvas, img = render(fig)
    height = img.shape[0]
    color = np.array(to_rgb(KIND_COLORS["other"]))
    t = s.start[("emb", 2)]
    # device 0 is the top row (y = 3); row centres and the gaps between rows, away from the
    # number written at the box's centre (y = 1.5)
    for y in (3.0, 2.5, 2.0, 1.0, 0.5, 0.0):
        x, yp = gantt.transData.transform((t + 0.5, y))
        assert np.all(np.abs(img[int(height - yp), int(x)] - color) < 0.02), y
    # a single-device box leaves the gap to the next row blank
    t0 = s.start[("f0", 2)]
    x0, y0 = gantt.transData.transform((t0 + 0.5, 2.5))  # between rows 0 and 1
    assert not np.all(np.abs(img[int(height - y0), int(x0)] - np.array(to_rgb(KIND_COLORS["forward"]))) < 0.02)


def test_numbers_inside_boxes_when_they_fit_and_dropped_when_thin() -> None:
    few = gantt_figure(pipelined(vshape(4), 8))
    # a box reads "block:micro-batch", or the micro-batch alone where the block's name does not fit
    numbers = [t.get_text().split(":")[-1] for t in few.axes[0].texts if t.get_text().split(":")[-1].isdigit()]
    assert sorted(set(numbers), key=int) == [str(m) for m in range(8)]
    assert len(numbers) == 8 * 8  # every box of 8 blocks x 8 micro-batches
    many = gantt_figure(pipelined(vshape(4), 128))
    numbers = [t.get_text() for t in many.axes[0].texts if t.get_text().isdigit()]
    assert numbers == []  # 128 micro-batches: boxes too thin for any 3-digit number


@pytest.mark.slow
def test_32_devices_and_128_micro_batches_keep_a_sane_figure(tmp_path: Path) -> None:
    s = pipelined(vshape(32), 128, memory=40)
    out = plot_schedule(s, tmp_path / "big.png", dpi=60)
    lay = layout(s)
    assert lay.width <= 22 and lay.height <= 20
    img = rgb_image(out)
    assert pixels_of(img, KIND_COLORS["forward"]) > 1000
    assert pixels_of(img, KIND_COLORS["backward"]) > 1000
    fig = gantt_figure(s)
    assert len(fig.axes[1].lines) >= 32  # the memory plot: one line per device (and the limit)


# ---- Gantt: SVG --------------------------------------------------------------------------------
def test_svg_is_xml_with_one_rectangle_per_task_and_run_of_rows(tmp_path: Path) -> None:
    p = four_kinds()
    s = pipelined(p, 3)
    root = ET.parse(plot_schedule(s, tmp_path / "g.svg")).getroot()
    assert root.tag == f"{SVG}svg"
    groups = {g.get("id"): g for g in root.iter(f"{SVG}g") if g.get("id")}
    # `mix` and `bmix` run on devices 0 and 2: two boxes each, linked by a dashed line
    runs = {b.id: 2 if b.id in ("mix", "bmix") else 1 for b in p.blocks}
    for kind in KIND_COLORS:
        want = 3 * sum(runs[b.id] for b in p.blocks if b.kind == kind)
        paths = groups[f"tasks-{kind}"].findall(f".//{SVG}path")
        assert len(paths) == want, kind
    links = [path for kind in ("forward", "backward")
             for path in groups[f"links-{kind}"].findall(f".//{SVG}path")]
    assert len(links) == 2 * 3


def test_picture_suffix_must_be_png_or_svg(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"g\.pdf.*\.png or \.svg"):
        plot_schedule(pipelined(vshape(2), 2), tmp_path / "g.pdf")
    assert not (tmp_path / "g.pdf").exists()


# ---- phases --------------------------------------------------------------------------------------
def test_phases_follow_the_repetend_until_it_stops_recurring() -> None:
    ph = phases(modulo_vshape4(16))
    assert (ph.steady_start, ph.steady_end, ph.period, ph.repeats) == (13, 13 + 12 * 4, 4, 12)
    assert phases(pipelined(vshape(4), 8)) is None


# ---- trace ---------------------------------------------------------------------------------------
def test_trace_has_one_complete_event_per_task_and_device(tmp_path: Path) -> None:
    p = four_kinds()
    s = pipelined(p, 5, memory=12)
    doc = json.loads(write_trace(s, tmp_path / "t.json").read_text())
    events = doc["traceEvents"]
    xs = [e for e in events if e["ph"] == "X"]
    assert len(xs) == sum(len(p.by_id[t.block].devices) for t in s.tasks)
    seen = {(e["args"]["block"], e["args"]["micro_batch"], e["pid"]) for e in xs}
    assert seen == {(t.block, t.micro_batch, d) for t in s.tasks for d in p.by_id[t.block].devices}
    for e in xs:
        b = p.by_id[e["args"]["block"]]
        assert e["ts"] == s.start[(b.id, e["args"]["micro_batch"])]
        assert e["dur"] == b.duration
        assert (e["args"]["kind"], e["args"]["memory"], e["cat"]) == (b.kind, b.memory, b.kind)
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names == {d: f"device {d}" for d in range(4)}
    assert doc["otherData"]["us_per_unit"] == 1.0


def test_trace_memory_counters_reach_the_peaks_and_return_to_zero() -> None:
    s = pipelined(vshape(4), 8, memory=6)
    events = trace_events(s)
    for d in range(4):
        levels = [e["args"]["memory"] for e in events
                  if e["ph"] == "C" and e["pid"] == d and e["name"] == "memory"]
        assert max(levels) == s.peak_memory[d]
        assert levels[-1] == 0
        limits = {e["args"]["limit"] for e in events if e["pid"] == d and e["name"] == "memory limit"}
        assert limits == {6}


def test_trace_time_unit_from_meta_maps_to_microseconds() -> None:
    s = pipelined(vshape(2), 2).with_meta(time_unit="ms")
    doc = trace_document(s)
    first = min((e for e in doc["traceEvents"] if e["ph"] == "X"), key=lambda e: e["ts"])
    assert first["dur"] == 1000 and doc["otherData"]["us_per_unit"] == 1000
    with pytest.raises(ValueError, match="time_unit 'fortnight'"):
        trace_events(s.with_meta(time_unit="fortnight"))


# ---- comparison charts -------------------------------------------------------------------------
def comparison_rows() -> list[dict]:
    rows = []
    for n in (4, 8, 16):
        for method, order in (("tessel", 1.0), ("1f1b", 1.0), ("gpipe", 1.25)):
            s = pipelined(vshape(4), n, memory=6)
            rows.append({"method": method, "micro_batches": n, "makespan": s.makespan * order,
                         "lower_bound": s.lower_bound, "ratio": s.ratio * order, "bubble": s.bubble,
                         "peak_memory": list(s.peak_memory), "seconds": 0.2, "error": None})
    rows.append({"method": "chimera", "micro_batches": 16, "error": "needs two opposite pipelines"})
    return rows


def test_comparison_chart_draws_bars_and_the_lower_bound(tmp_path: Path) -> None:
    rows = [r for r in comparison_rows() if r["micro_batches"] == 16]
    img = rgb_image(plot_comparison(rows, tmp_path / "c.png"))
    assert pixels_of(img, SEARCH_COLORS["tessel"]) > 1000
    assert pixels_of(img, BOUND_COLOR, tol=0.1) > 50
    with pytest.raises(ValueError, match="no rows"):
        plot_comparison([], tmp_path / "none.png")


def test_scaling_chart_has_a_line_per_method(tmp_path: Path) -> None:
    img = rgb_image(plot_scaling(comparison_rows(), tmp_path / "s.png"))
    assert pixels_of(img, SEARCH_COLORS["tessel"], tol=0.05) > 100
    assert pixels_of(img, BOUND_COLOR, tol=0.1) > 50
    root = ET.parse(plot_scaling(comparison_rows(), tmp_path / "s.svg")).getroot()
    ids = {g.get("id") for g in root.iter(f"{SVG}g")}
    assert {"lower-bound", "makespan-tessel", "makespan-1f1b", "makespan-gpipe"} <= ids
    assert "makespan-chimera" not in ids  # a method that did not apply draws no line


# ---- progress ------------------------------------------------------------------------------------
def test_progress_line_on_a_terminal_shows_the_latest_figures() -> None:
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=120)
    with ProgressLine("search", console=console) as progress:
        progress({"phase": "repetend", "period": 7})
        progress({"period": 6, "makespan": 80.0})
        assert "period 6" in progress.line() and "makespan 80" in progress.line()
        console.print(progress)  # what the live display renders
    assert "phase repetend  period 6  makespan 80" in buf.getvalue()
    progress({"period": 5})  # after the line closed: remembered, nothing drawn
    assert progress._live is None and progress.state["period"] == 5
    narrow = Console(file=io.StringIO(), force_terminal=True, width=30)
    line = ProgressLine("search", console=narrow, enabled=False)
    line({"phase": "completion", "period": 12, "makespan": 345})
    narrow.print(line)
    assert narrow.file.getvalue().count("\n") == 1  # cut to the width, never wrapped
    assert "…" in narrow.file.getvalue()

def test_progress_line_is_silent_when_not_a_terminal() -> None:
    buf = io.StringIO()
    with ProgressLine("search", console=Console(file=buf, force_terminal=False)) as progress:
        progress({"phase": "completion", "makespan": 90})
    assert buf.getvalue() == ""
    assert describe({"period": 4, "status": "optimal"}, 1.25) == "period 4  status optimal  elapsed 1.2s"


# ---- the command line's --plot and --trace -------------------------------------------------------
@pytest.mark.slow
def test_cli_writes_charts_and_traces(tessel, tmp_path: Path) -> None:
    sched, png, trace = tmp_path / "s.json", tmp_path / "s.png", tmp_path / "s.trace.json"
    rc, out, _ = tessel("baseline", "1f1b", "vshape", "-n", 8, "-o", sched, "--plot", png, "--trace", trace)
    assert rc == 0 and f"wrote {png}" in out
    s = Schedule.load(sched, check=True)
    assert rgb_image(png).shape[1] == round(layout(s).width * 110)
    assert len([e for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X"]) == len(s.tasks)
    svg = tmp_path / "show.svg"
    assert tessel("show", sched, "--plot", svg)[0] == 0
    assert ET.parse(svg).getroot().tag == f"{SVG}svg"
    bars = tmp_path / "compare.png"
    assert tessel("compare", "vshape", "-n", 8, "--methods", "1f1b,gpipe", "--plot", bars)[0] == 0
    assert pixels_of(rgb_image(bars), BOUND_COLOR, tol=0.1) > 50
    rc, _, err = tessel("baseline", "1f1b", "vshape", "-n", 8, "--plot", tmp_path / "s.gif")
    assert rc == 2 and "s.gif: a picture must end in .png or .svg" in err


def test_search_command_writes_chart_and_trace_of_its_schedule(tessel, tmp_path: Path) -> None:
    sched, svg, trace = tmp_path / "k.json", tmp_path / "k.svg", tmp_path / "k.trace.json"
    rc, out, _ = tessel("search", "kshape", "-n", 8, "--memory", 6, "-o", sched, "--plot", svg,
                        "--trace", trace)
    assert rc == 0 and f"wrote {svg}" in out and f"wrote {trace}" in out
    s = Schedule.load(sched, check=True)
    root = ET.parse(svg).getroot()
    boxes = sum(len(g.findall(f".//{SVG}path")) for g in root.iter(f"{SVG}g")
                if (g.get("id") or "").startswith("tasks-"))
    assert boxes == len(s.tasks)  # kshape's shared blocks span adjacent rows: one box per task
    xs = [e for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X"]
    assert sorted((e["ts"], e["pid"]) for e in xs) == sorted(
        (t.start, d) for t in s.tasks for d in s.placement.by_id[t.block].devices)
